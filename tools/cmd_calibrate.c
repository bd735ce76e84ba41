/* qcal calibrate: calibrates every tensor of an activation-dump directory through a
 * calibration session and writes one table (native JSON, TensorRT, ONNX Runtime or ncnn). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "qcal/calib.h"
#include "tools/cli_common.h"
#include "tools/cli_state.h"

static const char help[] =
    "usage: qcal calibrate DIR -o TABLE [--rules RULES] [--format FORMAT] [--save-state FILE]\n"
    "                      [OBSERVER OPTIONS]\n"
    "\n"
    "Calibrates every tensor dumped under DIR and writes a calibration table to TABLE.\n"
    "DIR holds, for each tensor name (fqn), either a directory DIR/<fqn>/ of .npy files (one\n"
    "batch each, fed in byte order of their names) or a single file DIR/<fqn>.npy. Names are\n"
    "visited in byte order, so the result never depends on the file system. Names ending in\n"
    "'.weight' are weights (default observer: per_channel_minmax, qint8 per_channel_symmetric,\n"
    "axis 0); every other name is an activation (default observer: histogram, quint8\n"
    "per_tensor_affine). Entries starting with '.' and files not ending in .npy are ignored.\n"
    "\n"
    "options:\n"
    "  -o, --output TABLE       output file, written atomically (required)\n"
    "  --format F               json (default: native qcal table, read back by qcal),\n"
    "                           tensorrt (calibration cache), onnxruntime (calibration.cache),\n"
    "                           ncnn (.table); see docs/calibration.md\n"
    "  --rules RULES            rules file: 'GLOB ROLE OBSERVER [key=value ...]' per line,\n"
    "                           first match wins (docs/calibration.md)\n"
    "  --trt-version V          TensorRT cache header version (default 8601)\n"
    "  --trt-algorithm A        TensorRT cache header algorithm (default EntropyCalibration2)\n"
    "  --save-state FILE        also save the calibration session (docs/state.md), atomically;\n"
    "                           'qcal merge' combines sessions calibrated on parts of a dump\n"
    "                           into the table of the whole dump\n"
    "  -h, --help               this help\n"
    "\n"
    "observer options (given: they replace the activation default, after any --rules; the\n"
    "keys of rules files, docs/cli.md):\n";

static const char help_tail[] =
    "\n"
    "A progress bar is drawn on stderr when stderr is a terminal. On success one summary\n"
    "line goes to stdout. Errors are one line on stderr: a missing or empty DIR or a\n"
    "malformed .npy (named) exit 3, an unwritable TABLE exits 4 (before any work is done);\n"
    "NaN/Inf under --strict exits 1, as in 'qcal observe'.\n";

enum { OPT_HELP = 1, OPT_OUT, OPT_RULES, OPT_FORMAT, OPT_TRT_VERSION, OPT_TRT_ALGO,
       OPT_SAVE_STATE };

static const cli_opt opts[] = {
    { "help", 'h', false, OPT_HELP },
    { "output", 'o', true, OPT_OUT },
    { "rules", 0, true, OPT_RULES },
    { "format", 0, true, OPT_FORMAT },
    { "trt-version", 0, true, OPT_TRT_VERSION },
    { "trt-algorithm", 0, true, OPT_TRT_ALGO },
    { "save-state", 0, true, OPT_SAVE_STATE },
    CLI_OBSERVER_OPTS,
    { 0 },
};

typedef struct tensor_src {
    char *fqn;
    char **files;      /* full paths, sorted */
    int nfiles;
} tensor_src;

typedef struct plan {
    tensor_src *t;
    int n, cap;
    long total_files;
} plan;

static void plan_free(plan *p)
{
    for (int i = 0; i < p->n; i++) {
        for (int j = 0; j < p->t[i].nfiles; j++)
            free(p->t[i].files[j]);
        free(p->t[i].files);
        free(p->t[i].fqn);
    }
    free(p->t);
    memset(p, 0, sizeof *p);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, b);
    return s;
}

/* Sorted names in dir (no '.' entries); *n gets the count. NULL + errno on failure. */
static char **list_dir(const char *dir, int *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    int cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn)
                goto oom;
            names = nn;
        }
        if (!(names[cnt] = strdup(de->d_name)))
            goto oom;
        cnt++;
    }
    closedir(d);
    if (cnt > 1)
        qsort(names, (size_t)cnt, sizeof *names, cmp_str);
    *n = cnt;
    if (!names)
        names = calloc(1, sizeof *names);
    return names;
oom:
    closedir(d);
    for (int i = 0; i < cnt; i++)
        free(names[i]);
    free(names);
    errno = ENOMEM;
    return NULL;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int add_tensor(const char *cmd, plan *p, const char *fqn, char **files, int nfiles)
{
    for (int i = 0; i < p->n; i++) {
        if (!strcmp(p->t[i].fqn, fqn)) {
            return cli_fail(cmd, QCAL_EXIT_INPUT, "tensor '%s' is dumped both as '%s/' and as "
                            "'%s.npy'; keep one", fqn, fqn, fqn);
        }
    }
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 32;
        tensor_src *t = realloc(p->t, (size_t)cap * sizeof *t);
        if (!t)
            return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        p->t = t;
        p->cap = cap;
    }
    char *name = strdup(fqn);
    if (!name)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    p->t[p->n++] = (tensor_src){ .fqn = name, .files = files, .nfiles = nfiles };
    p->total_files += nfiles;
    return 0;
}

/* Builds the feeding plan from DIR; returns 0 or an exit code (reported). */
static int scan(const char *cmd, const char *dir, plan *p)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "cannot open dump directory '%s': %s", dir,
                        strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is not a directory", dir);
    int n = 0, rc = 0;
    char **names = list_dir(dir, &n);
    if (!names)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "cannot read directory '%s': %s", dir,
                        strerror(errno));
    for (int i = 0; i < n && !rc; i++) {
        char *path = join(dir, names[i]);
        if (!path) {
            rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
            break;
        }
        if (stat(path, &sb) != 0) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "cannot stat '%s': %s", path, strerror(errno));
        } else if (S_ISDIR(sb.st_mode)) {
            int m = 0;
            char **files = list_dir(path, &m);
            if (!files) {
                rc = cli_fail(cmd, QCAL_EXIT_INPUT, "cannot read directory '%s': %s", path,
                              strerror(errno));
            } else {
                int k = 0;
                for (int j = 0; j < m && !rc; j++) {
                    if (!ends_with(files[j], ".npy")) {
                        free(files[j]);
                        continue;
                    }
                    char *full = join(path, files[j]);
                    free(files[j]);
                    if (!full)
                        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
                    files[k++] = full;
                }
                if (!rc && k == 0)
                    rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' holds no .npy file", path);
                if (!rc)
                    rc = add_tensor(cmd, p, names[i], files, k);
                if (rc)
                    free_names(files, k);
            }
        } else if (ends_with(names[i], ".npy") && strlen(names[i]) > 4) {
            char **files = malloc(sizeof *files);
            if (!files) {
                rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
            } else {
                files[0] = path;
                path = NULL;
                names[i][strlen(names[i]) - 4] = '\0';
                rc = add_tensor(cmd, p, names[i], files, 1);
                if (rc)
                    free_names(files, 1);
            }
        }
        free(path);
    }
    free_names(names, n);
    if (!rc && p->n == 0)
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' holds no dump (expected <fqn>/*.npy or "
                      "<fqn>.npy)", dir);
    return rc;
}

static void progress(long done, long total, const char *name)
{
    const int width = 30;
    int fill = total ? (int)(done * width / total) : width;
    fprintf(stderr, "\r[%.*s%*s] %ld/%ld %.40s\033[K", fill,
            "##############################", width - fill, "", done, total, name);
    fflush(stderr);
}

int cmd_calibrate(int argc, char **argv)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *cmd = p.cmd;
    cli_observer_args oa = { 0 };
    const char *dir = NULL, *out = NULL, *rules_path = NULL, *save_state = NULL;
    qcal_calib_format format = QCAL_CALIB_FORMAT_JSON;
    qcal_calib_export_options xo;
    qcal_calib_export_options_default(&xo);
    bool have_obs_opts = false;
    int rc = 0, id;
    const char *val;
    plan pl = { 0 };
    qcal_calib_rules *rules = NULL;
    qcal_calib_session *session = NULL;
    qcal_calib_table *table = NULL;
    qcal_status st;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        switch (id) {
        case CLI_ERROR: rc = QCAL_EXIT_USAGE; goto done;
        case OPT_HELP:
            fputs(help, stdout);
            cli_observer_help(stdout, QCAL_OBSERVER_HISTOGRAM);
            fputs(help_tail, stdout);
            goto done;
        case OPT_OUT: out = val; break;
        case OPT_RULES: rules_path = val; break;
        case OPT_TRT_VERSION: xo.trt_version = val; break;
        case OPT_TRT_ALGO: xo.trt_algorithm = val; break;
        case OPT_SAVE_STATE: save_state = val; break;
        case OPT_FORMAT:
            if (qcal_calib_format_parse(val, &format) != QCAL_OK) {
                rc = cli_fail_status(cmd, QCAL_EXIT_USAGE, QCAL_ERR_INVALID_ARG);
                goto done;
            }
            break;
        case CLI_POSITIONAL:
            if (dir) {
                rc = cli_fail(cmd, QCAL_EXIT_USAGE, "one dump directory expected, got '%s' and "
                              "'%s'", dir, val);
                goto done;
            }
            dir = val;
            break;
        default:
            have_obs_opts |= cli_observer_opt(&oa, id, val);
            break;
        }
    }
    if (!dir) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no dump directory (see 'qcal calibrate --help')");
        goto done;
    }
    if (!out) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no output table: give -o TABLE");
        goto done;
    }
    qcal_observer_config act_cfg;
    if (have_obs_opts &&
        (rc = cli_observer_config(cmd, &oa, QCAL_OBSERVER_HISTOGRAM, &act_cfg)))
        goto done;
    if (rules_path) {
        st = qcal_calib_rules_load(rules_path, &rules);
        if (st != QCAL_OK) {
            rc = cli_fail_status(cmd, st == QCAL_ERR_FORMAT ? QCAL_EXIT_USAGE : QCAL_EXIT_INPUT,
                                 st);
            goto done;
        }
    } else if ((st = qcal_calib_rules_create(&rules)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    if (have_obs_opts &&
        (st = qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &act_cfg)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
        goto done;
    }
    /* Fail before the work if the table cannot be written where asked. */
    qcal_atomic_file probe;
    if ((st = qcal_atomic_open(&probe, out)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        goto done;
    }
    qcal_atomic_abort(&probe);
    if ((rc = scan(cmd, dir, &pl)))
        goto done;

    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    if ((st = qcal_calib_session_create(&so, &session)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    bool bar = isatty(2);
    long done_files = 0;
    for (int i = 0; i < pl.n; i++) {
        tensor_src *t = &pl.t[i];
        qcal_calib_role role = ends_with(t->fqn, ".weight") ? QCAL_CALIB_ROLE_WEIGHT : QCAL_CALIB_ROLE_ACTIVATION;
        for (int j = 0; j < t->nfiles; j++) {
            if (bar)
                progress(done_files, pl.total_files, t->fqn);
            qcal_npy_array a;
            st = qcal_npy_read_f32(t->files[j], &a);
            if (st != QCAL_OK) {
                if (bar)
                    fputs("\r\033[K", stderr);
                rc = cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE
                                                                   : QCAL_EXIT_INPUT, st);
                goto done;
            }
            if (a.numel == 0) {
                if (bar)
                    fputs("\r\033[K", stderr);
                qcal_npy_array_free(&a);
                rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': empty array (0 elements), nothing "
                              "to observe", t->files[j]);
                goto done;
            }
            qcal_tensor x;
            st = qcal_npy_as_tensor(&a, &x);
            if (st == QCAL_OK)
                st = qcal_calib_session_observe(session, t->fqn, role, j, &x);
            qcal_npy_array_free(&a);
            if (st < 0) {
                if (bar)
                    fputs("\r\033[K", stderr);
                char msg[1200];
                snprintf(msg, sizeof msg, "%s", qcal_last_error());
                rc = cli_fail(cmd, cli_observe_exit_code(st), "'%s': %s", t->files[j], *msg ? msg : qcal_status_str(st));
                goto done;
            }
            done_files++;
        }
    }
    if (bar) {
        progress(done_files, pl.total_files, "");
        fputs("\r\033[K", stderr);
    }
    if (save_state && (rc = cli_session_state_save(cmd, session, save_state)))
        goto done;
    if ((st = qcal_calib_session_table(session, &table)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    st = qcal_calib_table_write(table, format, &xo, out);
    if (st < 0) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_IO ? QCAL_EXIT_OUTPUT
                                  : st == QCAL_ERR_INVALID_ARG ? QCAL_EXIT_USAGE
                                                               : QCAL_EXIT_FAILURE, st);
        goto done;
    }
    if (st == QCAL_NO_DATA)
        fprintf(stderr, "qcal: %s: warning: %s\n", cmd, qcal_last_error());
    int64_t n = 0, nw = 0;
    uint64_t nonfinite = 0;
    qcal_calib_table_count(table, &n);
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        qcal_calib_table_entry(table, i, &e);
        nw += e->role == QCAL_CALIB_ROLE_WEIGHT;
        nonfinite += e->nonfinite;
    }
    printf("qcal calibrate: wrote %s (%s): %lld activations, %lld weights from %ld files; "
           "%llu non-finite values skipped\n", out, qcal_calib_format_name(format),
           (long long)(n - nw), (long long)nw, done_files, (unsigned long long)nonfinite);
    if (fflush(stdout) != 0)
        rc = QCAL_EXIT_OUTPUT;
done:
    qcal_calib_table_destroy(&table);
    qcal_calib_session_destroy(&session);
    qcal_calib_rules_destroy(&rules);
    plan_free(&pl);
    return rc;
}
