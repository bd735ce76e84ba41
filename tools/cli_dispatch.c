/* The qcal CLI's one dispatch (tools/cli_dispatch.h): the option parser, the generated
 * --help and the status -> exit code map. */
#include <string.h>

#include "cli_common.h"

void cli_parser_init(cli_parser *p, int argc, char **argv)
{
    p->cmd = argc > 0 ? argv[0] : "qcal";
    p->argc = argc;
    p->argv = argv;
    p->i = 1;
    p->positional_only = false;
    p->nseen = 0;
    p->row = NULL;
}

/* A second value for a single-valued option: reported, true. Observer options are left to
 * qcal_observer_config_apply ("observer given twice"), which also sees the rules' keys. */
static bool repeated(cli_parser *p, const cli_opt *o)
{
    if (!o->has_value || o->has_value == CLI_REPEATED ||
        (o->id >= CLI_OBS_BASE && o->id < CLI_OBS_BASE + 2 * CLI_OBS_MAX))
        return false;
    for (int k = 0; k < p->nseen; k++)
        if (p->seen[k] == (const void *)o) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "--%s given twice (it takes one value)",
                     o->name);
            return true;
        }
    if (p->nseen < CLI_SEEN_MAX)
        p->seen[p->nseen++] = o;
    return false;
}

/* '-' and '_' are the same character in option names (as in observer keys). */
static bool name_eq(const char *opt, const char *name, size_t len)
{
    size_t i = 0;
    for (; i < len && opt[i]; i++) {
        char a = opt[i] == '-' ? '_' : opt[i], b = name[i] == '-' ? '_' : name[i];
        if (a != b)
            return false;
    }
    return i == len && opt[i] == '\0';
}

/* Edit distance of a and b (insert, delete, substitute, swap two neighbours: 1 each; the
 * optimal string alignment distance, so "--tabel" is one edit from "--table"), capped at 9. */
int cli_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32)
        return 9;
    int d[33][33];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb] < 9 ? d[la][lb] : 9;
}

/* The nearest candidate so far of an unknown option's "did you mean". */
typedef struct nearest {
    const char *want;
    char best[64];
    int d, ties;
} nearest;

static void consider(nearest *n, const char *cand)
{
    int d = cli_edit_distance(n->want, cand);
    if (d < n->d) {
        n->d = d;
        n->ties = 0;
        snprintf(n->best, sizeof n->best, "%s", cand);
    } else if (d == n->d && strcmp(n->best, cand)) {
        n->ties++;
    }
}

/* The option of opts nearest to "--name" (len characters, '_' read as '-') when it is within
 * 2 edits (1 for names of up to 4 letters) and nearer than any other: the "did you mean" of
 * an unknown option; NULL otherwise. The observer options count, under their CLI spelling. */
static const char *nearest_option(const cli_opt *opts, const char *name, size_t len, nearest *n)
{
    char want[40], cand[64];
    if (len >= sizeof want)
        return NULL;
    for (size_t i = 0; i < len; i++)
        want[i] = name[i] == '_' ? '-' : name[i];
    want[len] = '\0';
    *n = (nearest){ .want = want, .d = 99 };
    for (const cli_opt *r = opts; r->name; r++) {
        if (r->store == CLI_STORE_TEXT)
            continue;
        if (r->name[0] != '\0') {
            consider(n, r->name);
            continue;
        }
        int64_t nk = r->id == CLI_OBS_BASE ? qcal_observer_config_key_count() : 0;
        for (int64_t k = 0; k < nk; k++) {
            const qcal_observer_key *key = qcal_observer_config_key(k);
            if (!key->flag_only) {
                cli_observer_option_name(key, cand, sizeof cand);
                consider(n, cand);
            }
            if (key->cli_flag)
                consider(n, key->cli_flag);
        }
    }
    return n->d > 0 && n->d <= (len <= 4 ? 1 : 2) && !n->ties ? n->best : NULL;
}

/* Finds "--name" in opts: its row, or (the CLI_OBSERVER_OPTS row expands to the observer
 * keys) *o filled for the matching key; *flag_value the value an observer flag sets. */
static const cli_opt *find_long(const cli_opt *opts, const char *name, size_t len,
                               cli_opt *o, const char **flag_value)
{
    *flag_value = NULL;
    for (const cli_opt *r = opts; r->name; r++) {
        if (r->name[0] == '\0' && r->id == CLI_OBS_BASE) {
            int64_t nk = qcal_observer_config_key_count();
            for (int64_t k = 0; k < nk; k++) {
                const qcal_observer_key *key = qcal_observer_config_key(k);
                if (!key->flag_only && name_eq(key->name, name, len)) {
                    *o = (cli_opt){ .name = key->name, .has_value = true,
                                    .id = CLI_OBS_BASE + 2 * (int)k };
                    return o;
                }
                if (key->cli_flag && name_eq(key->cli_flag, name, len)) {
                    *o = (cli_opt){ .name = key->cli_flag, .id = CLI_OBS_BASE + 2 * (int)k + 1 };
                    *flag_value = key->flag_value;
                    return o;
                }
            }
        } else if (r->store != CLI_STORE_TEXT && name_eq(r->name, name, len)) {
            return r;
        }
    }
    return NULL;
}

static const cli_opt *find_short(const cli_opt *opts, char c)
{
    for (const cli_opt *o = opts; o->name; o++)
        if (o->short_name && o->short_name == c)
            return o;
    return NULL;
}

int cli_next(cli_parser *p, const cli_opt *opts, const char **value)
{
    *value = NULL;
    if (p->i >= p->argc)
        return CLI_END;
    const char *arg = p->argv[p->i++];
    if (p->positional_only || arg[0] != '-' || arg[1] == '\0') {
        *value = arg;
        return CLI_POSITIONAL;
    }
    if (!strcmp(arg, "--")) {
        p->positional_only = true;
        return cli_next(p, opts, value);
    }
    const cli_opt *o;
    cli_opt found;
    const char *inline_val = NULL, *flag_value = NULL;
    if (arg[1] == '-') {
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        o = find_long(opts, name, len, &found, &flag_value);
        if (!o) {
            nearest nb;
            const char *near = nearest_option(opts, name, len, &nb);
            if (near)
                cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '--%.*s' (did you mean "
                         "'--%s'?)", (int)len, name, near);
            else
                cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '--%.*s' (see 'qcal %s --help')",
                         (int)len, name, p->cmd);
            return CLI_ERROR;
        }
        if (eq)
            inline_val = eq + 1;
    } else {
        /* A lone short option "-o"; "-oFILE" is accepted as "-o FILE". Negative numbers
         * are values, never options, because they only appear after an option. */
        o = find_short(opts, arg[1]);
        if (!o) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '%s' (see 'qcal %s --help')", arg,
                     p->cmd);
            return CLI_ERROR;
        }
        if (arg[2] != '\0') {
            if (!o->has_value) {
                cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '%s'", arg);
                return CLI_ERROR;
            }
            inline_val = arg + 2;
        }
    }
    p->row = o == &found ? NULL : o;
    if (!o->has_value) {
        if (inline_val) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "option '--%s' takes no value", o->name);
            return CLI_ERROR;
        }
        *value = flag_value ? flag_value : "";
        return o->id ? o->id : CLI_STORED;
    }
    if (inline_val) {
        *value = inline_val;
    } else if (p->i >= p->argc) {
        cli_fail(p->cmd, QCAL_EXIT_USAGE, "option '--%s' needs a value", o->name);
        return CLI_ERROR;
    } else {
        *value = p->argv[p->i++];
    }
    return repeated(p, o) ? CLI_ERROR : o->id ? o->id : CLI_STORED;
}

int cli_parse(const cli_spec *spec, int argc, char **argv, void *args, cli_handler fn)
{
    return cli_parse_to(spec, argc, argv, args, fn, stdout);
}

int cli_parse_to(const cli_spec *spec, int argc, char **argv, void *args, cli_handler fn,
                 FILE *help_out)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *val;
    int id, rc;
    while ((id = cli_next(&p, spec->opts, &val)) != CLI_END) {
        if (id == CLI_ERROR)
            return QCAL_EXIT_USAGE;
        if (id == CLI_HELP) {
            if (help_out)
                cli_help(help_out, spec);
            return CLI_HELP_SHOWN;
        }
        if (id == CLI_STORED) {
            char *field = (char *)args + p.row->off;
            if (p.row->store == CLI_STORE_STR)
                memcpy(field, &val, sizeof val);
            else
                *(bool *)field = true;
            continue;
        }
        if ((rc = fn(args, p.cmd, id, val)))
            return rc;
    }
    return 0;
}

/* Prints head ("  -o, --output OUT"), then text from column col: on the same line when head
 * leaves two spaces before col, else on the next; each '\n' of text starts a line at col. */
static void help_row(FILE *f, const char *head, const char *text, int col)
{
    int n = (int)strlen(head);
    fputs(head, f);
    if (n >= col - 1)
        fprintf(f, "\n%*s", col, "");
    else
        fprintf(f, "%*s", col - n, "");
    for (const char *t = text; *t; t++) {
        fputc(*t, f);
        if (*t == '\n' && t[1])
            fprintf(f, "%*s", col, "");
    }
    fputc('\n', f);
}

void cli_help(FILE *f, const cli_spec *spec)
{
    for (const cli_opt *o = spec->opts; o->name; o++) {
        if (o->store == CLI_STORE_TEXT) {
            fputs(o->help, f);
        } else if (o->name[0] == '\0' && o->id == CLI_OBS_BASE) {
            cli_observer_help(f, (qcal_observer_kind)o->off);
        } else if (o->help) {
            char head[160];
            snprintf(head, sizeof head, "  %s%c%s--%s%s%s", o->short_name ? "-" : "",
                     o->short_name ? o->short_name : ' ', o->short_name ? ", " : "", o->name,
                     o->metavar ? " " : "", o->metavar ? o->metavar : "");
            if (!o->short_name)   /* no "-c, ": drop the placeholder character */
                memmove(head + 2, head + 3, strlen(head + 3) + 1);
            help_row(f, head, o->help, spec->col);
        }
    }
}

/* The exit code of each failure status (columns: QCAL_ERR_INVALID_ARG = -1 first, down to
 * QCAL_ERR_EMPTY = -12) at each stage: the one place a library status becomes an exit code
 * (0 success, 1 failure, 2 usage, 3 input, 4 output, 5 engine; tools/cli.h). */
enum { NSTATUS = 12 };
static const signed char exit_map[CLI_AT_COUNT][NSTATUS] = {
    /*                     INVAL NOMEM IO FORMAT UNSUP NONFIN MISM OVERFL BACKEND STATE NOTFOUND EMPTY */
    [CLI_AT_READ]        = { 3,   1,   3,   3,    3,    3,    3,    3,     3,      3,     3,      3 },
    [CLI_AT_WRITE]       = { 4,   1,   4,   4,    4,    4,    4,    4,     4,      4,     4,      4 },
    [CLI_AT_SAVE]        = { 1,   1,   4,   1,    1,    1,    1,    1,     1,      1,     1,      1 },
    [CLI_AT_PARAMS]      = { 2,   1,   1,   1,    1,    1,    1,    1,     1,      1,     1,      1 },
    [CLI_AT_FAKEQUANT]   = { 2,   1,   2,   2,    2,    2,    2,    2,     2,      2,     2,      2 },
    [CLI_AT_OBSERVE]     = { 3,   1,   3,   3,    3,    1,    3,    1,     3,      3,     3,      3 },
    [CLI_AT_RULES]       = { 3,   3,   3,   2,    3,    3,    3,    3,     3,      3,     3,      3 },
    [CLI_AT_TABLE_OUT]   = { 2,   1,   4,   1,    1,    1,    1,    1,     1,      1,     1,      1 },
    [CLI_AT_CHECKPOINT]  = { 3,   1,   4,   3,    3,    3,    3,    3,     3,      3,     3,      1 },
    [CLI_AT_MODEL_SETUP] = { 2,   1,   3,   3,    3,    3,    2,    3,     3,      3,     3,      1 },
    [CLI_AT_MODEL_CARRY] = { 2,   1,   3,   3,    3,    3,    2,    3,     3,      3,     2,      1 },
    [CLI_AT_MODEL_RUN]   = { 3,   1,   3,   3,    3,    1,    3,    1,     1,      3,     3,      3 },
    [CLI_AT_TRANSFORM]   = { 1,   1,   3,   3,    3,    1,    3,    1,     1,      1,     3,      3 },
    [CLI_AT_QDQ]         = { 2,   1,   4,   3,    3,    1,    1,    4,     1,      1,     1,      1 },
    [CLI_AT_JUDGE]       = { 2,   1,   3,   3,    3,    3,    3,    3,     1,      3,     3,      3 },
    [CLI_AT_ENGINE]      = { 5,   1,   5,   5,    5,    5,    5,    5,     5,      5,     5,      5 },
};

int cli_exit_code(qcal_status st, cli_at stage)
{
    int k = -(int)st - 1;
    if (stage < 0 || stage >= CLI_AT_COUNT || k < 0 || k >= NSTATUS)
        return QCAL_EXIT_FAILURE;
    return exit_map[stage][k];
}
