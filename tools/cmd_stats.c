/* qcal stats: one statistics record per tensor of .safetensors / .npy files (PyTorch's
 * log_parameter_info equivalent), streamed chunk by chunk, optional CSV and summary. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include <qcal/calib_dump.h>
#include <qcal/numeric.h>
#include <qcal/safetensors.h>

#include "cli_common.h"
#include "cli_output.h"

typedef struct stats_args {
    const char **files;   /* the positional arguments, argc slots */
    int nf;
    const char *csv;
    bool summary;
} stats_args;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal stats [--csv PATH] [--summary] FILE.safetensors|FILE.npy|DUMPDIR ...\n"
        "\n"
        "Prints one line per tensor (t=param for tensors of .safetensors and .npy files and\n"
        "weights of a dump, t=act for a dump's activations; c=<counter>, fqn, op, extra=<shape>,\n"
        "min, max, absmax, avg, std; nonfinite=N when NaN/Inf were skipped; a tensor without\n"
        "finite values prints n=0 and empty statistics). When several inputs hold a tensor of\n"
        "the same name, its lines name the input: fqn='INPUT:NAME'. Safetensors files are\n"
        "memory-mapped and streamed in chunks of 1 Mi elements, so files larger than memory\n"
        "work; F32, F16, BF16 and F64 tensors are read, other dtypes are skipped with a note\n"
        "on stderr. A .npy file is one tensor named after the file. A dump directory (as\n"
        "'qcal calibrate' reads it: manifest.json or <name>/*.npy and <name>.npy, names\n"
        "percent-decoded) gives one line per tensor named from its layout, with statistics\n"
        "over all its batches (extra = the shape of the first batch).\n"),
    CLI_STR("csv", 0, stats_args, csv, "PATH",
        "also write the records as CSV (- is stdout: the records and the summary\n"
        "then go to stderr; docs/cli.md \"Outputs\")"),
    CLI_BOOL("summary", 0, stats_args, summary,
        "after the records, one line per group (numeric path components\n"
        "collapse: blocks.0.w, blocks.1.w -> blocks.*.w) with outliers"),
    CLI_HELP_OPT,
    { 0 },
};
const cli_spec cmd_stats_spec = { opts, 15 };

#define STATS_CHUNK (1 << 20)

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int add_summary(qcal_numeric_summary *sum, const char *name, int32_t ndim, const int64_t *shape,
                       const qcal_numeric_stats *s)
{
    if (!sum)
        return 0;
    qcal_numeric_summary_item it;
    memset(&it, 0, sizeof it);
    it.name = name;
    it.ndim = ndim;
    for (int32_t d = 0; d < ndim; d++)
        it.shape[d] = shape[d];
    it.max = s->max;
    it.absmax = s->absmax;
    qcal_numeric_stats_std(s, &it.std);
    it.sqnr_db = NAN;
    qcal_status st = qcal_numeric_summary_add(sum, &it);
    return st == QCAL_OK ? 0 : cli_fail_status("stats", QCAL_EXIT_FAILURE, st);
}

/* Names held by several inputs: sorted (name, input) pairs of every input. */
typedef struct name_ref {
    char *name;
    int file;
} name_ref;

typedef struct name_index {
    name_ref *v;
    int64_t n, cap;
} name_index;

static int name_ref_cmp(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

static void index_add(name_index *ix, const char *name, int file)
{
    if (ix->n == ix->cap) {
        int64_t nc = ix->cap ? ix->cap * 2 : 64;
        name_ref *nv = realloc(ix->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return;   /* out of memory: names stay unqualified */
        ix->v = nv;
        ix->cap = nc;
    }
    char *d = strdup(name);
    if (d)
        ix->v[ix->n++] = (name_ref){ d, file };
}

static void index_free(name_index *ix)
{
    for (int64_t i = 0; i < ix->n; i++)
        free(ix->v[i].name);
    free(ix->v);
    memset(ix, 0, sizeof *ix);
}

/* True when another input than `file` holds a tensor named name. */
static bool held_elsewhere(const name_index *ix, const char *name, int file)
{
    if (!ix || !ix->n)
        return false;
    name_ref key = { (char *)(uintptr_t)name, -1 };
    /* first pair with this name (file -1 sorts before every input) */
    int64_t lo = 0, hi = ix->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (name_ref_cmp(&ix->v[mid], &key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int64_t i = lo; i < ix->n && !strcmp(ix->v[i].name, name); i++)
        if (ix->v[i].file != file)
            return true;
    return false;
}

/* The record name of tensor name of input `file`: the name, or "INPUT:NAME" when another
 * input holds the same name. */
static const char *record_name(const name_index *ix, const char *path, int file,
                               const char *name, char *buf, size_t cap)
{
    if (!held_elsewhere(ix, name, file))
        return name;
    snprintf(buf, cap, "%s:%s", path, name);
    return buf;
}

typedef struct st_ctx {
    qcal_numeric_logger *lg;
    qcal_numeric_summary *sum;
    float *buf;
    const name_index *ix;
    const char *path;
    int file;
} st_ctx;

static int stats_tensor(void *ctx, qcal_safetensors *st, int64_t i, const qcal_safetensors_tensor_info *info)
{
    const st_ctx *c = ctx;
    float *buf = c->buf;
    qcal_status s = QCAL_OK;
    qcal_numeric_stats stats;
    qcal_numeric_stats_init(&stats);
    const void *raw = NULL;
    bool direct = info->dtype == QCAL_SAFETENSORS_F32 && qcal_safetensors_raw(st, i, &raw) == QCAL_OK &&
                  ((uintptr_t)raw % sizeof(float)) == 0;
    for (int64_t off = 0; off < info->numel; off += STATS_CHUNK) {
        int64_t m = info->numel - off < STATS_CHUNK ? info->numel - off : STATS_CHUNK;
        const float *src = direct ? (const float *)raw + off : buf;
        if (!direct) {
            s = qcal_safetensors_read_f32(st, i, off, m, buf);
            if (s != QCAL_OK)
                break;
        }
        s = qcal_numeric_stats_update(&stats, src, m);
        if (s != QCAL_OK)
            break;
    }
    qcal_safetensors_release(st, i);
    char nb[2048];
    const char *name = record_name(c->ix, c->path, c->file, info->name, nb, sizeof nb);
    if (s == QCAL_OK)
        s = qcal_numeric_logger_log_stats(c->lg, QCAL_NUMERIC_LOG_PARAM, name, "", NULL,
                                          info->ndim, info->shape, &stats);
    if (s != QCAL_OK)
        return cli_fail_status("stats", QCAL_EXIT_FAILURE, s);
    return add_summary(c->sum, name, info->ndim, info->shape, &stats);
}

static int do_safetensors(const char *path, int file, const name_index *ix,
                          qcal_numeric_logger *lg, qcal_numeric_summary *sum, float *buf)
{
    st_ctx c = { lg, sum, buf, ix, path, file };
    return cli_safetensors_each("stats", path, stats_tensor, &c);
}

/* The tensor name of a .npy file: its base name without ".npy". */
static void npy_name(const char *path, char *name, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(name, cap, "%s", base);
    if (ends_with(name, ".npy"))
        name[strlen(name) - 4] = '\0';
}

static int do_npy(const char *path, int file, const name_index *ix, qcal_numeric_logger *lg,
                  qcal_numeric_summary *sum)
{
    qcal_npy_array a;
    int rc = cli_read_f32("stats", path, &a);
    if (rc)
        return rc;
    char base[1024], nb[2048];
    npy_name(path, base, sizeof base);
    const char *name = record_name(ix, path, file, base, nb, sizeof nb);
    qcal_numeric_stats stats;
    qcal_numeric_stats_init(&stats);
    qcal_status s = qcal_numeric_stats_update(&stats, a.data, a.numel);
    if (s == QCAL_OK)
        s = qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_PARAM, name, "", NULL, a.ndim, a.shape, &stats);
    if (s != QCAL_OK)
        rc = cli_fail_status("stats", QCAL_EXIT_FAILURE, s);
    else
        rc = add_summary(sum, name, a.ndim, a.shape, &stats);
    qcal_npy_array_free(&a);
    return rc;
}

/* Every tensor of a dump directory: one record over all its batches (t=act for its
 * activations). */
static int do_dump(const char *dir, int file, const name_index *ix, qcal_numeric_logger *lg,
                   qcal_numeric_summary *sum)
{
    qcal_calib_dump *d = NULL;
    qcal_status s = qcal_calib_dump_scan(dir, &d);
    if (s != QCAL_OK)
        return cli_fail_status("stats", cli_exit_code(s, CLI_AT_READ), s);
    int64_t n = 0;
    int rc = 0;
    qcal_calib_dump_count(d, &n);
    for (int64_t i = 0; i < n && !rc; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(d, i, &t);
        qcal_numeric_stats stats;
        qcal_numeric_stats_init(&stats);
        int32_t ndim = 0;
        int64_t shape[QCAL_MAX_DIMS] = { 0 };
        for (int64_t j = 0; j < t.nfiles && !rc; j++) {
            qcal_npy_array a;
            if ((rc = cli_read_f32("stats", t.files[j], &a)))
                break;
            if (j == 0) {
                ndim = a.ndim;
                memcpy(shape, a.shape, sizeof(int64_t) * (size_t)a.ndim);
            }
            s = qcal_numeric_stats_update(&stats, a.data, a.numel);
            qcal_npy_array_free(&a);
            if (s != QCAL_OK)
                rc = cli_fail_status("stats", QCAL_EXIT_FAILURE, s);
        }
        if (rc)
            break;
        char nb[2048];
        const char *name = record_name(ix, dir, file, t.name, nb, sizeof nb);
        s = qcal_numeric_logger_log_stats(lg, t.role == QCAL_CALIB_ROLE_ACTIVATION
                                                  ? QCAL_NUMERIC_LOG_ACT : QCAL_NUMERIC_LOG_PARAM,
                                          name, "", NULL, ndim, shape, &stats);
        if (s != QCAL_OK)
            rc = cli_fail_status("stats", QCAL_EXIT_FAILURE, s);
        else
            rc = add_summary(sum, name, ndim, shape, &stats);
    }
    qcal_calib_dump_destroy(&d);
    return rc;
}

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Every input's tensor names, for record_name. Inputs that cannot be read are left out
 * (the pass over them reports why). */
static void index_inputs(const char **files, int nf, name_index *ix)
{
    for (int f = 0; f < nf; f++) {
        if (is_dir(files[f])) {
            qcal_calib_dump *d = NULL;
            int64_t n = 0;
            if (qcal_calib_dump_scan(files[f], &d) == QCAL_OK &&
                qcal_calib_dump_count(d, &n) == QCAL_OK)
                for (int64_t i = 0; i < n; i++) {
                    qcal_calib_dump_tensor t;
                    if (qcal_calib_dump_tensor_at(d, i, &t) == QCAL_OK)
                        index_add(ix, t.name, f);
                }
            qcal_calib_dump_destroy(&d);
        } else if (ends_with(files[f], ".npy")) {
            char name[1024];
            npy_name(files[f], name, sizeof name);
            index_add(ix, name, f);
        } else {
            qcal_safetensors *st = NULL;
            int64_t n = 0;
            if (qcal_safetensors_open(files[f], &st) == QCAL_OK &&
                qcal_safetensors_count(st, &n) == QCAL_OK)
                for (int64_t i = 0; i < n; i++) {
                    qcal_safetensors_tensor_info info;
                    if (qcal_safetensors_info(st, i, &info) == QCAL_OK)
                        index_add(ix, info.name, f);
                }
            qcal_safetensors_close(&st);
        }
    }
    if (ix->n)
        qsort(ix->v, (size_t)ix->n, sizeof *ix->v, name_ref_cmp);
}

static void print_summary(qcal_numeric_summary *sum, FILE *f)
{
    int64_t ng = 0;
    qcal_numeric_summary_group_count(sum, &ng);
    fprintf(f, "\n%-40s %6s %-20s %12s %12s %s\n", "group", "count", "typical shape", "max(max)",
            "mean(std)", "outliers (absmax > 4 x group median)");
    for (int64_t g = 0; g < ng; g++) {
        qcal_numeric_summary_group gr;
        if (qcal_numeric_summary_get_group(sum, g, &gr) != QCAL_OK)
            continue;
        char shp[128] = "scalar";
        size_t k = 0;
        for (int32_t d = 0; d < gr.ndim && k < sizeof shp; d++)
            k += (size_t)snprintf(shp + k, sizeof shp - k, d ? "x%lld" : "%lld", (long long)gr.shape[d]);
        /* a group whose members have no finite value has no statistics: "-" */
        fprintf(f, "%-40s %6lld %-20s", gr.pattern, (long long)gr.count, shp);
        if (isnan(gr.max_of_max))
            fprintf(f, " %12s %12s", "-", "-");
        else
            fprintf(f, " %12.6g %12.6g", (double)gr.max_of_max, gr.mean_of_std);
        if (gr.n_empty)
            fprintf(f, " (%lld without finite values)", (long long)gr.n_empty);
        for (int64_t o = 0; o < gr.n_outliers; o++) {
            const char *nm;
            if (qcal_numeric_summary_outlier(sum, g, o, &nm) == QCAL_OK)
                fprintf(f, "%s%s", o ? ", " : " ", nm);
        }
        fprintf(f, "\n");
    }
}

/* An input file, the positional arguments (cli_handler; the options are stored rows). */
static int take_file(void *args, const char *cmd, int id, const char *val)
{
    stats_args *a = args;
    (void)cmd, (void)id;
    a->files[a->nf++] = val;
    return 0;
}

int cmd_stats(int argc, char **argv)
{
    stats_args a = { .files = calloc((size_t)argc + 1, sizeof *a.files) };
    if (!a.files)
        return cli_fail("stats", QCAL_EXIT_FAILURE, "out of memory");
    int rc = cli_parse(&cmd_stats_spec, argc, argv, &a, take_file);
    if (rc) {
        free(a.files);
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    }
    const char **files = a.files, *csv = a.csv;
    bool summary = a.summary;
    int nf = a.nf;
    if (nf == 0) {
        free(files);
        return cli_fail("stats", QCAL_EXIT_USAGE, "no input file (see qcal stats --help)");
    }
    /* --csv PATH checked before the work; with --csv - the CSV is stdout and the records
     * and the summary go to stderr. */
    int crc = cli_output_check("stats", csv);
    if (crc) {
        free(files);
        return crc;
    }
    qcal_numeric_logger_options lo;
    qcal_numeric_logger_options_default(&lo);
    lo.stream = cli_output_is_stdout(csv) ? stderr : stdout;
    lo.csv_path = csv ? cli_output_path(csv) : NULL;
    qcal_numeric_logger *lg = NULL;
    qcal_numeric_summary *sum = NULL;
    float *buf = malloc(STATS_CHUNK * sizeof(float));
    qcal_status s = qcal_numeric_logger_create(&lo, &lg);
    if (s != QCAL_OK)
        rc = cli_fail_status("stats", QCAL_EXIT_OUTPUT, s);
    if (!rc && summary) {
        qcal_numeric_summary_options so;
        qcal_numeric_summary_options_default(&so);
        s = qcal_numeric_summary_create(&so, &sum);
        if (s != QCAL_OK)
            rc = cli_fail_status("stats", QCAL_EXIT_FAILURE, s);
    }
    if (!rc && !buf)
        rc = cli_fail("stats", QCAL_EXIT_FAILURE, "out of memory");
    name_index ix = { 0 };
    if (!rc && nf > 1)
        index_inputs(files, nf, &ix);
    for (int i = 0; i < nf && !rc; i++)
        rc = is_dir(files[i])               ? do_dump(files[i], i, &ix, lg, sum)
             : ends_with(files[i], ".npy") ? do_npy(files[i], i, &ix, lg, sum)
                                           : do_safetensors(files[i], i, &ix, lg, sum, buf);
    index_free(&ix);
    if (!rc) {
        s = qcal_numeric_logger_finish(lg);
        if (s != QCAL_OK)
            rc = cli_fail_status("stats", QCAL_EXIT_OUTPUT, s);
    }
    if (!rc && sum)
        print_summary(sum, lo.stream);
    qcal_numeric_logger_destroy(&lg);
    qcal_numeric_summary_destroy(&sum);
    free(buf);
    free(files);
    return rc;
}
