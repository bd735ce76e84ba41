/* qcal compare-weights: quantize-dequantize every float tensor of a .safetensors file (or
 * .npy files) with an observer's qparams and report SQNR / L2 / cosine per tensor, plus a
 * grouped summary and the layers to keep in float. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <qcal/numeric.h>
#include <qcal/safetensors.h>

#include "cli_common.h"

enum { OPT_OBSERVER = 1, OPT_DTYPE, OPT_QSCHEME, OPT_FORMAT, OPT_MIN_SQNR };

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal compare-weights [options] FILE.safetensors|FILE.npy ...\n"
        "\n"
        "For each float tensor: observer -> qparams -> quantize -> dequantize, then compare with\n"
        "the float tensor. Default: per-channel symmetric qint8 on axis 0 (PyTorch's default\n"
        "weight qconfig). Tensors with fewer than 2 dimensions (biases, norms) are skipped and\n"
        "counted, as 'qcal calibrate --weights' does: they are not quantized to int8 by the\n"
        "engines (a bias is int32 with the input and weight scales).\n"),
    CLI_OPT("observer", 0, OPT_OBSERVER, "KIND",
        "minmax, per_channel_minmax (default), histogram, percentile, ...\n"
        "(a per-tensor KIND quantizes every tensor per tensor)"),
    CLI_OPT("dtype", 0, OPT_DTYPE, "D",
        "qint8 (default), quint8, float8_e4m3fn or float8_e5m2 (FP8:\n"
        "symmetric, scale = amax / 448 or / 57344; docs/fp8.md)"),
    CLI_OPT("qscheme", 0, OPT_QSCHEME, "S",
        "per_channel_symmetric (default), per_channel_affine,\n"
        "per_tensor_symmetric, per_tensor_affine"),
    CLI_OPT("format", 0, OPT_FORMAT, "F", "table (default), csv or json"),
    CLI_OPT("min-sqnr", 0, OPT_MIN_SQNR, "DB",
        "list tensors with SQNR below DB dB as 'keep in float'"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "Columns: sqnr = 20 log10(|x| / |x - q|) in dB (torch.ao.ns.fx.utils.compute_sqnr; inf\n"
        "when lossless), l2 = |x - q| / |x| (normalized L2 error), cosine similarity, max_abs_err,\n"
        "scale_min/scale_max over channels. NaN/Inf are skipped and counted (flags column); a\n"
        "tensor with no finite value is reported, flagged and not compared; the run goes on.\n"
        "JSON: {\"tensors\": [...] (name, shape, compared, dtype, qscheme, sqnr, ...), \"groups\":\n"
        "[...], \"keep_float\": [...],\n"
        "\"not_compared\": [...], \"nonfinite_values\": N, \"skipped_under_2d\": [...]}; sqnr +inf\n"
        "is the string \"inf\". The table's last line and a note on stderr (csv) count the\n"
        "skipped tensors.\n"),
    { 0 },
};
const cli_spec cmd_compare_weights_spec = { opts, 20 };

enum { FMT_TABLE, FMT_CSV, FMT_JSON };

/* One reported tensor. compared false: the tensor had no finite value (flagged, counted,
 * not quantized): only name, shape and stats (count 0, nonfinite N) are meaningful. */
typedef struct row {
    qcal_numeric_weight_result w;
    bool compared;
} row;

typedef struct run {
    qcal_numeric_weights_options wo;
    row *res;
    int64_t n, cap;
    int64_t n_uncompared;        /* tensors without any finite value */
    char **skipped;              /* tensors under 2 dimensions, not compared (names) */
    int64_t n_skipped, cap_skipped;
    int64_t n_with_nonfinite;    /* compared tensors in which NaN/Inf were skipped */
    uint64_t nonfinite_values;   /* NaN/Inf values over all tensors */
    qcal_numeric_summary *sum;
} run;

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* A tensor under 2 dimensions (a bias, a norm): skipped and counted, as calibrate does. */
static int skip_under_2d(run *r, const char *name)
{
    if (r->n_skipped == r->cap_skipped) {
        int64_t nc = r->cap_skipped ? r->cap_skipped * 2 : 16;
        char **nv = realloc(r->skipped, (size_t)nc * sizeof *nv);
        if (!nv)
            return cli_fail("compare-weights", QCAL_EXIT_FAILURE, "out of memory");
        r->skipped = nv;
        r->cap_skipped = nc;
    }
    if (!(r->skipped[r->n_skipped] = strdup(name)))
        return cli_fail("compare-weights", QCAL_EXIT_FAILURE, "out of memory");
    r->n_skipped++;
    return 0;
}

static int compare_one(run *r, const char *name, const qcal_tensor *t)
{
    if (t->ndim < 2)
        return skip_under_2d(r, name);
    if (r->n == r->cap) {
        int64_t nc = r->cap ? r->cap * 2 : 64;
        row *nr = realloc(r->res, (size_t)nc * sizeof *nr);
        if (!nr)
            return cli_fail("compare-weights", QCAL_EXIT_FAILURE, "out of memory");
        r->res = nr;
        r->cap = nc;
    }
    row *w = &r->res[r->n];
    memset(w, 0, sizeof *w);
    qcal_status s = qcal_numeric_weights_compare(&r->wo, name, t, &w->w);
    if (s == QCAL_ERR_EMPTY) {
        cli_warn("compare-weights", "skipping '%s' (no elements)", name);
        return 0;
    }
    if (s == QCAL_ERR_NONFINITE) {
        /* no finite value at all: report the tensor flagged and go on with the others */
        int64_t numel = 0;
        qcal_tensor_numel(t, &numel);
        qcal_numeric_stats_init(&w->w.stats);
        s = qcal_numeric_stats_update(&w->w.stats, t->data, numel);
        if (s != QCAL_OK)
            return cli_fail_status("compare-weights", QCAL_EXIT_FAILURE, s);
        snprintf(w->w.name, sizeof w->w.name, "%s", name);
        w->w.ndim = t->ndim;
        memcpy(w->w.shape, t->shape, sizeof w->w.shape);
        w->w.std = NAN;
        w->w.scale_min = w->w.scale_max = NAN;
        w->w.m.sqnr_db = w->w.m.l2 = w->w.m.cosine = w->w.m.max_abs_err = NAN;
        w->w.m.nonfinite = (uint64_t)numel;
        w->compared = false;
        r->n_uncompared++;
        cli_warn("compare-weights", "'%s' has no finite value (%llu NaN/Inf): reported, not "
                 "compared", name, (unsigned long long)w->w.stats.nonfinite);
    } else if (s != QCAL_OK) {
        return cli_fail_status("compare-weights", QCAL_EXIT_FAILURE, s);
    } else {
        w->compared = true;
        if (w->w.stats.nonfinite)
            r->n_with_nonfinite++;
    }
    r->nonfinite_values += w->w.stats.nonfinite;
    r->n++;
    qcal_numeric_summary_item it;
    memset(&it, 0, sizeof it);
    it.name = name;
    it.ndim = w->w.ndim;
    memcpy(it.shape, w->w.shape, sizeof it.shape);
    it.max = w->w.stats.max;   /* -inf when no finite value: the summary leaves it out */
    it.absmax = w->w.stats.absmax;
    it.std = w->w.std;
    it.sqnr_db = w->w.m.sqnr_db;
    s = qcal_numeric_summary_add(r->sum, &it);
    return s == QCAL_OK ? 0 : cli_fail_status("compare-weights", QCAL_EXIT_FAILURE, s);
}

static int compare_tensor(void *ctx, qcal_safetensors *st, int64_t i, const qcal_safetensors_tensor_info *info)
{
    run *r = ctx;
    int rc;
    if (info->ndim < 2)
        return skip_under_2d(r, info->name);
    /* one tensor at a time: F32 aligned tensors are used in place (mapped pages), others
     * converted into a buffer of that tensor only */
    const void *raw = NULL;
    float *buf = NULL;
    float *data;
    if (info->dtype == QCAL_SAFETENSORS_F32 && qcal_safetensors_raw(st, i, &raw) == QCAL_OK &&
        (uintptr_t)raw % sizeof(float) == 0) {
        data = (float *)(uintptr_t)raw;
    } else {
        buf = malloc((size_t)(info->numel ? info->numel : 1) * sizeof(float));
        if (!buf)
            return cli_fail("compare-weights", QCAL_EXIT_FAILURE, "out of memory for '%s'",
                            info->name);
        qcal_status s = qcal_safetensors_read_f32(st, i, 0, info->numel, buf);
        if (s != QCAL_OK) {
            free(buf);
            return cli_fail_status("compare-weights", QCAL_EXIT_INPUT, s);
        }
        data = buf;
    }
    qcal_tensor t;
    qcal_status s = qcal_tensor_init(&t, data, info->ndim, info->shape);
    if (s == QCAL_OK)
        rc = compare_one(r, info->name, &t);
    else
        rc = cli_fail_status("compare-weights", QCAL_EXIT_INPUT, s);
    free(buf);
    qcal_safetensors_release(st, i);
    return rc;
}

static int do_safetensors(run *r, const char *path)
{
    return cli_safetensors_each("compare-weights", path, compare_tensor, r);
}

static int do_npy(run *r, const char *path)
{
    qcal_npy_array a;
    int rc = cli_read_f32("compare-weights", path, &a);
    if (rc)
        return rc;
    const char *base = strrchr(path, '/');
    char name[1024];
    snprintf(name, sizeof name, "%s", base ? base + 1 : path);
    if (ends_with(name, ".npy"))
        name[strlen(name) - 4] = '\0';
    qcal_tensor t;
    qcal_status s = qcal_npy_as_tensor(&a, &t);
    rc = s == QCAL_OK ? compare_one(r, name, &t) : cli_fail_status("compare-weights", QCAL_EXIT_INPUT, s);
    qcal_npy_array_free(&a);
    return rc;
}

static void shape_str(char *b, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t k = 0;
    snprintf(b, cap, "scalar");
    for (int32_t d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(b + k, cap - k, d ? "x%lld" : "%lld", (long long)shape[d]);
}

/* JSON number: non-finite values as null. */
static void jnum(double v)
{
    if (isfinite(v))
        printf("%.9g", v);
    else
        printf("null");
}

/* CSV field: quoted when it holds a comma, quote or newline (RFC 4180). */
static void csv_str(const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"')
            putchar('"');
        putchar(*s);
    }
    putchar('"');
}

/* CSV number: empty field when not available (NaN), "inf"/"-inf" for infinities. */
static void cnum(double v)
{
    if (!isnan(v))
        printf("%.9g", v);
}

/* Table number in a field of width w: "-" when not available. */
static void tnum(int w, const char *fmt, double v)
{
    if (isnan(v))
        printf(" %*s", w, "-");
    else
        printf(fmt, w, v);
}

static void print_json(run *r)
{
    printf("{\"tensors\": [");
    for (int64_t i = 0; i < r->n; i++) {
        const row *rw = &r->res[i];
        const qcal_numeric_weight_result *w = &rw->w;
        printf("%s\n  {\"name\": ", i ? "," : "");
        cli_json_str(stdout, w->name);
        printf(", \"shape\": [");
        for (int32_t d = 0; d < w->ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)w->shape[d]);
        printf("], \"compared\": %s, \"dtype\": \"%s\", \"qscheme\": ",
               rw->compared ? "true" : "false", qcal_dtype_name(r->wo.dtype));
        if (rw->compared)
            printf("\"%s\"", qcal_qscheme_name(w->qscheme));
        else
            printf("null");
        /* sqnr: +inf (lossless) is the string "inf"; JSON has no infinity */
        printf(", \"sqnr\": ");
        if (isinf(w->m.sqnr_db))
            printf(w->m.sqnr_db > 0 ? "\"inf\"" : "\"-inf\"");
        else
            jnum(w->m.sqnr_db);
        printf(", \"l2\": ");
        jnum(w->m.l2);
        printf(", \"cosine\": ");
        jnum(w->m.cosine);
        printf(", \"max_abs_err\": ");
        jnum(w->m.max_abs_err);
        printf(", \"scale_min\": ");
        jnum(w->scale_min);
        printf(", \"scale_max\": ");
        jnum(w->scale_max);
        bool st = w->stats.count > 0;
        printf(", \"count\": %lld, \"nonfinite\": %llu, \"min\": ", (long long)w->stats.count,
               (unsigned long long)w->stats.nonfinite);
        jnum(st ? w->stats.min : NAN);
        printf(", \"max\": ");
        jnum(st ? w->stats.max : NAN);
        printf(", \"std\": ");
        jnum(st ? w->std : NAN);
        printf("}");
    }
    printf("\n], \"groups\": [");
    int64_t ng = 0;
    qcal_numeric_summary_group_count(r->sum, &ng);
    for (int64_t g = 0; g < ng; g++) {
        qcal_numeric_summary_group gr;
        if (qcal_numeric_summary_get_group(r->sum, g, &gr) != QCAL_OK)
            continue;
        printf("%s\n  {\"pattern\": ", g ? "," : "");
        cli_json_str(stdout, gr.pattern);
        printf(", \"count\": %lld, \"no_finite\": %lld, \"shape\": [", (long long)gr.count,
               (long long)gr.n_empty);
        for (int32_t d = 0; d < gr.ndim; d++)
            printf("%s%lld", d ? ", " : "", (long long)gr.shape[d]);
        printf("], \"max_of_max\": ");
        jnum(gr.max_of_max);
        printf(", \"mean_of_std\": ");
        jnum(gr.mean_of_std);
        printf(", \"worst_sqnr\": ");
        if (isinf(gr.worst_sqnr_db))
            printf(gr.worst_sqnr_db > 0 ? "\"inf\"" : "\"-inf\"");
        else
            jnum(gr.worst_sqnr_db);
        printf(", \"outliers\": [");
        for (int64_t o = 0; o < gr.n_outliers; o++) {
            const char *nm;
            if (qcal_numeric_summary_outlier(r->sum, g, o, &nm) == QCAL_OK) {
                printf("%s", o ? ", " : "");
                cli_json_str(stdout, nm);
            }
        }
        printf("]}");
    }
    printf("\n], \"keep_float\": [");
    int64_t nk = 0;
    qcal_numeric_summary_keep_float(r->sum, 0, NULL, &nk);
    const char **names = calloc((size_t)(nk ? nk : 1), sizeof *names);
    if (names) {
        qcal_numeric_summary_keep_float(r->sum, nk, names, &nk);
        for (int64_t k = 0; k < nk; k++) {
            printf("%s", k ? ", " : "");
            cli_json_str(stdout, names[k]);
        }
        free(names);
    }
    printf("], \"not_compared\": [");
    for (int64_t i = 0, k = 0; i < r->n; i++) {
        if (r->res[i].compared)
            continue;
        printf("%s", k++ ? ", " : "");
        cli_json_str(stdout, r->res[i].w.name);
    }
    printf("], \"nonfinite_values\": %llu, \"skipped_under_2d\": [",
           (unsigned long long)r->nonfinite_values);
    for (int64_t i = 0; i < r->n_skipped; i++) {
        printf("%s", i ? ", " : "");
        cli_json_str(stdout, r->skipped[i]);
    }
    printf("]}\n");
}

static void print_table(run *r, bool csv)
{
    if (csv)
        printf("name,shape,min,max,std,scale_min,scale_max,sqnr,l2,cosine,max_abs_err,"
               "nonfinite,compared\n");
    else
        printf("%-40s %-16s %11s %11s %11s %11s %11s %9s %11s %11s  %s\n", "tensor", "shape",
               "min", "max", "std", "scale_min", "scale_max", "sqnr_dB", "l2", "cosine", "flags");
    for (int64_t i = 0; i < r->n; i++) {
        const row *rw = &r->res[i];
        const qcal_numeric_weight_result *w = &rw->w;
        char shp[128];
        shape_str(shp, sizeof shp, w->ndim, w->shape);
        bool st = w->stats.count > 0;
        double mn = st ? w->stats.min : NAN, mx = st ? w->stats.max : NAN;
        double sd = st ? w->std : NAN;
        if (csv) {
            csv_str(w->name);
            printf(",%s,", shp);
            double v[] = {mn, mx, sd, w->scale_min, w->scale_max, w->m.sqnr_db, w->m.l2,
                          w->m.cosine, w->m.max_abs_err};
            for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
                cnum(v[k]);
                putchar(',');
            }
            printf("%llu,%d\n", (unsigned long long)w->stats.nonfinite, rw->compared ? 1 : 0);
            continue;
        }
        printf("%-40s %-16s", w->name, shp);
        tnum(11, " %*.4g", mn);
        tnum(11, " %*.4g", mx);
        tnum(11, " %*.4g", sd);
        tnum(11, " %*.4g", w->scale_min);
        tnum(11, " %*.4g", w->scale_max);
        tnum(9, " %*.3f", w->m.sqnr_db);
        tnum(11, " %*.4g", w->m.l2);
        tnum(11, " %*.8f", w->m.cosine);
        if (!rw->compared)
            printf("  NO FINITE VALUE (%llu NaN/Inf), not compared",
                   (unsigned long long)w->stats.nonfinite);
        else if (w->stats.nonfinite)
            printf("  nonfinite=%llu", (unsigned long long)w->stats.nonfinite);
        printf("\n");
    }
    if (csv)
        return;
    int64_t ng = 0;
    qcal_numeric_summary_group_count(r->sum, &ng);
    printf("\n%-40s %6s %-16s %11s %11s %9s  %s\n", "group", "count", "typical shape", "max(max)",
           "mean(std)", "worst_dB", "outliers (absmax > 4 x group median)");
    for (int64_t g = 0; g < ng; g++) {
        qcal_numeric_summary_group gr;
        if (qcal_numeric_summary_get_group(r->sum, g, &gr) != QCAL_OK)
            continue;
        char shp[128];
        shape_str(shp, sizeof shp, gr.ndim, gr.shape);
        printf("%-40s %6lld %-16s", gr.pattern, (long long)gr.count, shp);
        tnum(11, " %*.4g", gr.max_of_max);
        tnum(11, " %*.4g", gr.mean_of_std);
        tnum(9, " %*.3f", gr.worst_sqnr_db);
        printf(" ");
        for (int64_t o = 0; o < gr.n_outliers; o++) {
            const char *nm;
            if (qcal_numeric_summary_outlier(r->sum, g, o, &nm) == QCAL_OK)
                printf("%s%s", o ? ", " : " ", nm);
        }
        printf("\n");
    }
    printf("\n%lld %s: %lld compared, %lld with no finite value (not compared), "
           "%lld with NaN/Inf skipped; %llu NaN/Inf %s in all; %lld %s under 2 "
           "dimensions skipped\n",
           (long long)r->n, CLI_PLURAL(r->n, "tensor", "tensors"),
           (long long)(r->n - r->n_uncompared), (long long)r->n_uncompared,
           (long long)r->n_with_nonfinite, (unsigned long long)r->nonfinite_values,
           CLI_PLURAL(r->nonfinite_values, "value", "values"), (long long)r->n_skipped,
           CLI_PLURAL(r->n_skipped, "tensor", "tensors"));
    int64_t nk = 0;
    qcal_numeric_summary_keep_float(r->sum, 0, NULL, &nk);
    if (nk) {
        const char **names = calloc((size_t)nk, sizeof *names);
        if (names) {
            qcal_numeric_summary_keep_float(r->sum, nk, names, &nk);
            printf("\nkeep in float (sqnr below threshold):");
            for (int64_t k = 0; k < nk; k++)
                printf(" %s", names[k]);
            printf("\n");
            free(names);
        }
    }
}

/* compare-weights' command line (cli_handler): the input files and the options. */
typedef struct cw_args {
    run *r;
    qcal_numeric_summary_options *so;
    const char **files;   /* argc slots */
    int nf, fmt;
    bool qscheme_given;
} cw_args;

static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    cw_args *a = args;
    if (id == CLI_POSITIONAL) {
        a->files[a->nf++] = val;
    } else if (id == OPT_OBSERVER || id == OPT_DTYPE || id == OPT_QSCHEME) {
        /* The words and messages of the observer options of observe and calibrate
         * (qcal_observer_config_set), then what this command supports. */
        qcal_observer_config c;
        qcal_observer_config_default(&c, QCAL_OBSERVER_MINMAX);
        const char *key = id == OPT_OBSERVER ? "observer" : id == OPT_DTYPE ? "dtype" : "qscheme";
        if (qcal_observer_config_set(&c, key, val) != QCAL_OK)
            return cli_fail_status(cmd, QCAL_EXIT_USAGE, QCAL_ERR_INVALID_ARG);
        if (id == OPT_OBSERVER)
            a->r->wo.observer = c.kind;
        else if (id == OPT_DTYPE && (a->r->wo.dtype = c.q.dtype) == QCAL_QINT32)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype '%s' must be qint8, quint8, "
                            "float8_e4m3fn or float8_e5m2", val);
        else if (id == OPT_QSCHEME) {
            a->qscheme_given = true;
            if ((a->r->wo.qscheme = c.q.qscheme) == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "unsupported --qscheme '%s'", val);
        }
    } else if (id == OPT_FORMAT) {
        if (!strcmp(val, "table"))
            a->fmt = FMT_TABLE;
        else if (!strcmp(val, "csv"))
            a->fmt = FMT_CSV;
        else if (!strcmp(val, "json"))
            a->fmt = FMT_JSON;
        else
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--format '%s' must be table, csv or json", val);
    } else if (id == OPT_MIN_SQNR) {
        return cli_parse_f64(cmd, "--min-sqnr", val, &a->so->min_sqnr);
    }
    return 0;
}

int cmd_compare_weights(int argc, char **argv)
{
    const char *cmd = "compare-weights";
    run r;
    memset(&r, 0, sizeof r);
    qcal_numeric_weights_options_default(&r.wo);
    qcal_numeric_summary_options so;
    qcal_numeric_summary_options_default(&so);
    cw_args a = { .r = &r, .so = &so, .fmt = FMT_TABLE,
                  .files = calloc((size_t)argc + 1, sizeof *a.files) };
    if (!a.files)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    int rc = cli_parse(&cmd_compare_weights_spec, argc, argv, &a, take_opt);
    if (rc) {
        free(a.files);
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    }
    const char **files = a.files;
    int fmt = a.fmt, nf = a.nf;
    bool qscheme_given = a.qscheme_given;
    if (nf == 0) {
        free(files);
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no input file (see qcal compare-weights --help)");
    }
    /* a per-tensor observer kind with the default (per-channel) scheme: per-tensor symmetric */
    if (!qscheme_given && r.wo.observer != QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
        r.wo.observer != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)
        r.wo.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    qcal_status s = qcal_numeric_summary_create(&so, &r.sum);
    if (s != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, s);
    for (int i = 0; i < nf && !rc; i++)
        rc = ends_with(files[i], ".npy") ? do_npy(&r, files[i]) : do_safetensors(&r, files[i]);
    if (!rc) {
        if (fmt == FMT_CSV && r.n_skipped)
            cli_note(cmd, "%lld tensor%s under 2 dimensions skipped (biases, norms), first "
                     "'%s'", (long long)r.n_skipped, r.n_skipped == 1 ? "" : "s",
                     r.skipped[0]);
        if (fmt == FMT_JSON)
            print_json(&r);
        else
            print_table(&r, fmt == FMT_CSV);
    }
    for (int64_t i = 0; i < r.n_skipped; i++)
        free(r.skipped[i]);
    free(r.skipped);
    qcal_numeric_summary_destroy(&r.sum);
    free(r.res);
    free(files);
    return rc;
}
