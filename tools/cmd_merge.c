/* qcal merge: combines saved states (docs/state.md). Observer states ('qcal observe
 * --save-state') print the JSON 'qcal observe' prints on all their data; session states
 * ('qcal calibrate --save-state') write the table 'qcal calibrate' writes on all their data
 * and/or the merged session state. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_progress.h"
#include "cli_state.h"
#include "cli_table_out.h"

typedef struct merge_args {
    const char **paths;    /* the STATE arguments, argc slots */
    int n;
    const char *save;      /* --save-state */
    bool quiet;
    bool have_out_opts;    /* a table option besides -o */
    cli_table_out to;
} merge_args;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal merge STATE [STATE ...] [--save-state OUT]\n"
        "       qcal merge SESSION_STATE [SESSION_STATE ...] -o OUT [--format F[,F...]]\n"
        "                  [--save-state OUT]\n"
        "\n"
        "Merges state files saved by 'qcal observe --save-state' (observer states) or 'qcal\n"
        "calibrate --save-state' (session states); all STATEs must be of one of the two.\n"
        "For the order-independent observers (minmax, per_channel_minmax, histogram, percentile,\n"
        "entropy, mse) the result does not depend on how the data was split or in which order\n"
        "the states are given: it equals one run over all the data, bit for bit.\n"
        "\n"
        "  observer states  print the JSON 'qcal observe' prints (its fields in 'qcal observe\n"
        "                   --help'; batches is the sum, digest identifies the merged state)\n"
        "  session states   -o TABLE writes the table 'qcal calibrate' would have written on\n"
        "                   all the data (same bytes for the same --format and --trt-* options)\n"
        "\n"
        "options:\n"),
    CLI_STR("save-state", 0, merge_args, save, "OUT",
        "also save the merged state to OUT (atomically)"),
    CLI_TEXT(
        "session states, the table output of 'qcal calibrate':\n"),
    CLI_TABLE_OUT_OPTS,
    CLI_BOOL("quiet", 'q', merge_args, quiet,
        "no progress report on stderr (a bar on a terminal, else a\n"
        "line at most every 10 s: reading, searching; docs/cli.md)"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "The same file given twice is refused (exit 2); two files with the same digest (a copy:\n"
        "the same data counted twice) are merged with a warning.\n"
        "\n"
        "Exit codes: 3 when a STATE cannot be read, is malformed, truncated or of another\n"
        "version, or when the states do not merge (observer and session states mixed, different\n"
        "observers or options for the same tensor, two moving averages that both saw data: their\n"
        "result depends on batch order); the message names both files. 4 when an output cannot\n"
        "be written; 1 when no finite value was seen (observer states, as 'qcal observe').\n"),
    { 0 },
};
const cli_spec cmd_merge_spec = { opts, 27 };

static const char *state_kind_name(cli_state_kind k)
{
    return k == CLI_STATE_OBSERVER ? "an observer state" : "a session state";
}

/* Reports a failed merge of path into the merge of the states before it (first: the first
 * of them, for the message). */
static int merge_failed(const char *cmd, qcal_status st, const char *path, const char *first)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", qcal_last_error());
    return cli_fail(cmd, cli_exit_code(st, CLI_AT_READ),
                    "'%s' does not merge with '%s': %s", path, first,
                    *msg ? msg : qcal_status_str(st));
}

/* The digest of a state file's content (what 'qcal observe' prints as digest, or the
 * session's qcal_calib_session_digest); "" when it does not load (reported later). */
static void state_digest(cli_state_kind kind, const void *buf, size_t len, char hex[65])
{
    hex[0] = '\0';
    if (kind == CLI_STATE_OBSERVER) {
        qcal_observer *o = NULL;
        if (qcal_observer_load(buf, len, &o) == QCAL_OK && qcal_observer_digest(o, hex) != QCAL_OK)
            hex[0] = '\0';
        qcal_observer_destroy(&o);
    } else {
        qcal_calib_session *s = NULL;
        if (qcal_calib_session_load(buf, len, NULL, &s) == QCAL_OK &&
            qcal_calib_session_digest(s, hex) != QCAL_OK)
            hex[0] = '\0';
        qcal_calib_session_destroy(&s);
    }
}

/* The same file given twice (same device and inode, whatever the spelling) is refused: its
 * data would be counted twice. Two files with the same digest hold the same data (a copy):
 * merged, with a warning. */
static int check_duplicates(const char *cmd, const char **paths, int n, void **bufs,
                            size_t *lens, cli_state_kind kind)
{
    struct stat *sb = calloc((size_t)n, sizeof *sb);
    char (*dig)[65] = calloc((size_t)n, sizeof *dig);
    int rc = 0;
    if (!sb || !dig) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto done;
    }
    for (int i = 0; i < n && !rc; i++) {
        if (stat(paths[i], &sb[i]) != 0)
            continue;   /* it was read: a vanished path is not a duplicate */
        for (int j = 0; j < i && !rc; j++)
            if (sb[j].st_dev == sb[i].st_dev && sb[j].st_ino == sb[i].st_ino)
                rc = cli_fail(cmd, QCAL_EXIT_USAGE, "'%s' and '%s' are the same file: each "
                              "state may be merged once (its data would count twice)",
                              paths[j], paths[i]);
    }
    for (int i = 0; i < n && !rc; i++) {
        state_digest(kind, bufs[i], lens[i], dig[i]);
        for (int j = 0; j < i && dig[i][0]; j++)
            if (!strcmp(dig[i], dig[j])) {
                cli_warn(cmd, "'%s' and '%s' have the same digest %.16s...: the same data "
                         "is counted twice", paths[j], paths[i], dig[i]);
                break;
            }
    }
done:
    free(sb);
    free(dig);
    return rc;
}

static int merge_observers(const char *cmd, const char **paths, int n, void **bufs,
                           size_t *lens, const char *save)
{
    qcal_observer *acc = NULL;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        qcal_observer *o = NULL;
        qcal_status st = qcal_observer_load(bufs[i], lens[i], &o);
        if (st != QCAL_OK) {
            rc = cli_fail(cmd, cli_exit_code(st, CLI_AT_READ),
                          "'%s': %s", paths[i], qcal_last_error());
            break;
        }
        if (!acc) {
            acc = o;
            continue;
        }
        st = qcal_observer_merge(acc, o);
        qcal_observer_destroy(&o);
        if (st != QCAL_OK)
            rc = merge_failed(cmd, st, paths[i], paths[0]);
    }
    /* The state staged, the report printed, then the state renamed. With --save-state -
     * the state is stdout and the report goes to stderr. */
    cli_staged staged = { 0 };
    if (!rc && save)
        rc = cli_observer_state_stage(cmd, acc, save, &staged);
    bool no_data = false;
    if (!rc)
        rc = cli_observer_report(cmd, acc, cli_output_is_stdout(save) ? stderr : stdout,
                                 &no_data);
    if (!rc && no_data) {   /* a failure: no state saved either (as in 'qcal observe') */
        uint64_t nonfinite = 0;
        qcal_observer_nonfinite(acc, &nonfinite);
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "no finite value in %d state(s) (%llu non-finite "
                      "skipped): printed the default qparams scale 1, zero_point 0%s", n,
                      (unsigned long long)nonfinite, save ? "; no state saved" : "");
    }
    if (rc)
        cli_stage_abort(&staged);
    else
        rc = cli_stage_commit(cmd, &staged);
    qcal_observer_destroy(&acc);
    return rc;
}

static int merge_sessions(const char *cmd, const char **paths, int n, void **bufs, size_t *lens,
                          cli_table_out *to, const char *save, cli_progress *prog)
{
    qcal_calib_session *s = NULL;
    qcal_calib_table *table = NULL;
    int rc = 0;
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.progress = cli_progress_cb;
    so.progress_user = prog;
    qcal_status st = qcal_calib_session_load(bufs[0], lens[0], &so, &s);
    if (st != QCAL_OK)
        return cli_fail(cmd, cli_exit_code(st, CLI_AT_READ),
                        "'%s': %s", paths[0], qcal_last_error());
    for (int i = 1; i < n && !rc; i++) {
        st = qcal_calib_session_merge_state(s, bufs[i], lens[i]);
        if (st == QCAL_ERR_FORMAT || st == QCAL_ERR_UNSUPPORTED) {
            /* Malformed file or refused merge: tell which by reading it alone. */
            qcal_calib_session *alone = NULL;
            qcal_status ls = qcal_calib_session_load(bufs[i], lens[i], NULL, &alone);
            qcal_calib_session_destroy(&alone);
            if (ls != QCAL_OK) {
                rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': %s", paths[i], qcal_last_error());
                break;
            }
            st = qcal_calib_session_merge_state(s, bufs[i], lens[i]);
        }
        if (st != QCAL_OK)
            rc = merge_failed(cmd, st, paths[i], paths[0]);
    }
    /* The state staged, the table written, then the state renamed: all or none. */
    cli_staged staged = { 0 };
    if (!rc && save)
        rc = cli_session_state_stage(cmd, s, save, &staged);
    if (!rc && to->out) {
        int64_t nentries = 0;
        qcal_calib_session_count(s, &nentries);
        cli_progress_phase(prog, "searching", "tensors", nentries);
        if ((st = qcal_calib_session_table(s, &table)) != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        } else if (!(rc = cli_table_out_write(cmd, to, table)) &&
                   !(rc = cli_stage_commit(cmd, &staged))) {
            cli_progress_end(prog);   /* before the summary line */
            int64_t cnt = 0, nw = 0;
            uint64_t nonfinite = 0;
            qcal_calib_table_count(table, &cnt);
            for (int64_t i = 0; i < cnt; i++) {
                const qcal_calib_entry *e;
                qcal_calib_table_entry(table, i, &e);
                nw += e->role == QCAL_CALIB_ROLE_WEIGHT;
                nonfinite += e->nonfinite;
            }
            char digest[65];
            qcal_calib_table_digest(table, digest);
            char fmts[128];
            cli_table_out_formats(to, fmts, sizeof fmts);
            /* With an output on stdout (-o -, --save-state -) the summary goes to stderr. */
            FILE *say = cli_output_is_stdout(to->out) || cli_output_is_stdout(save) ? stderr
                                                                                    : stdout;
            fprintf(say, "qcal: merge: wrote %s (%s): %lld %s, %lld %s from %d "
                    "%s; %llu non-finite %s skipped; digest %s\n", to->out, fmts,
                    (long long)(cnt - nw), CLI_PLURAL(cnt - nw, "activation", "activations"),
                    (long long)nw, CLI_PLURAL(nw, "weight", "weights"), n,
                    CLI_PLURAL(n, "state", "states"), (unsigned long long)nonfinite,
                    CLI_PLURAL(nonfinite, "value", "values"), digest);
            rc = cli_flush(cmd, say);
        }
    }
    if (rc)
        cli_stage_abort(&staged);
    else
        rc = cli_stage_commit(cmd, &staged);   /* --save-state alone */
    qcal_calib_table_destroy(&table);
    qcal_calib_session_destroy(&s);
    return rc;
}

/* The states and the table options (cli_handler). */
static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    merge_args *a = args;
    if (id == CLI_POSITIONAL) {
        a->paths[a->n++] = val;
        return 0;
    }
    int r = cli_table_out_opt(cmd, &a->to, id, val);
    if (r > 0)
        return r;
    a->have_out_opts |= r == 0 && id != CLI_OUT_OUTPUT;
    return 0;
}

int cmd_merge(int argc, char **argv)
{
    const char *cmd = argv[0];
    merge_args a = { .paths = calloc((size_t)argc + 1, sizeof *a.paths) };
    cli_table_out_init(&a.to);
    void **bufs = calloc((size_t)argc + 1, sizeof *bufs);
    size_t *lens = calloc((size_t)argc + 1, sizeof *lens);
    const char **paths = a.paths, *save = NULL;
    cli_table_out *to = &a.to;
    int n = 0, rc = 0;
    cli_progress prog;
    cli_progress_init(&prog, cmd, false, false);
    if (!paths || !bufs || !lens) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto done;
    }
    if ((rc = cli_parse(&cmd_merge_spec, argc, argv, &a, take_opt))) {
        rc = rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
        goto done;
    }
    n = a.n;
    save = a.save;
    if (n <= 0) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no state file (see 'qcal merge --help')");
        goto done;
    }
    /* Every output checked before the work (the table's below, once the kind is known). */
    if (cli_output_is_stdout(save) && cli_output_is_stdout(to->out)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "only one output can be '-' (standard output)");
        goto done;
    }
    if ((rc = cli_output_check(cmd, save)))
        goto done;
    cli_state_kind kind = CLI_STATE_OBSERVER, k0 = CLI_STATE_OBSERVER;
    cli_progress_init(&prog, cmd, !a.quiet, isatty(2));
    cli_progress_phase(&prog, "reading", "states", n);
    for (int i = 0; i < n; i++) {
        cli_progress_set(&prog, i, paths[i]);
        if ((rc = cli_state_read(cmd, paths[i], &bufs[i], &lens[i], &kind)))
            goto done;
        if (i == 0) {
            k0 = kind;
        } else if (kind != k0) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is %s but '%s' is %s: merge states of one "
                          "kind", paths[i], state_kind_name(kind), paths[0], state_kind_name(k0));
            goto done;
        }
    }
    cli_progress_set(&prog, n, NULL);
    if ((rc = check_duplicates(cmd, paths, n, bufs, lens, k0)))
        goto done;
    if (k0 == CLI_STATE_OBSERVER) {
        cli_progress_end(&prog);   /* the JSON follows on stdout */
        if (to->out || a.have_out_opts) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE, "-o, --format and --trt-* are for session states; "
                          "observer states print their JSON on stdout");
            goto done;
        }
        rc = merge_observers(cmd, paths, n, bufs, lens, save);
    } else {
        if (!to->out && !save) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE, "session states need -o TABLE and/or "
                          "--save-state OUT");
            goto done;
        }
        if (!to->out && a.have_out_opts) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--format and --trt-* need -o TABLE");
            goto done;
        }
        if (to->out && (rc = cli_table_out_check(cmd, to)))
            goto done;
        rc = merge_sessions(cmd, paths, n, bufs, lens, to, save, &prog);
    }
done:
    cli_progress_end(&prog);
    if (bufs)
        for (int i = 0; i < n; i++)
            free(bufs[i]);
    free(bufs);
    free(lens);
    free(paths);
    return rc;
}
