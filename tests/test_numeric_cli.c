/* unit.numeric_cli: runs `qcal stats` and `qcal compare-weights` ($QCAL_BIN) and checks
 * their output number by number against the library's own computations and against the
 * PyTorch 1.13 reference values of tests/ref/gen_numeric_weights.py (cw_ref.txt), the
 * alignment of the tables, the flagged report of a tensor without finite values, and that
 * bad inputs exit non-zero with exactly one stderr line.
 *
 * Tolerances against PyTorch (float32 torch.norm vs qcal's double sums; the quantized
 * values and scales themselves are bit-identical): sqnr 1e-4 dB, l2 1e-5 relative, cosine
 * 1e-6 absolute; max_abs_err and scales exact (as float32). Against the library: JSON and
 * CSV print %.9g, so float32 fields are exact and double fields within 1e-8 relative. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/json.h"
#include "qcal/npy.h"
#include "qcal/numeric.h"
#include "qcal/safetensors.h"

#include "testutil.h"

static const char *qcal_bin;
static char data_dir[4096];
static char tmp_dir[4096];

typedef struct result {
    int code;
    char out[1 << 17];
    char err[1 << 14];
} result;

static result R;

#define TMP(name) tu_path(tmp_dir, name)
#define DATA(name) tu_path(data_dir, name)

/* Runs qcal with the NULL-terminated arguments; fills R. */
static int run(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    R.code = tu_run_va(qcal_bin, first, ap, tmp_dir, R.out, sizeof R.out, R.err, sizeof R.err);
    va_end(ap);
    return R.code;
}

/* Exactly one stderr line "qcal: ..." containing needle. */
static void expect_one_err_line(const char *needle)
{
    tu_expect_one_line(R.err, "qcal: ", needle);
}

static void expect_fail(int code, const char *needle)
{
    if (R.code != code)
        fail_msg("exit code %d, expected %d; stderr: %s", R.code, code, R.err);
    expect_one_err_line(needle);
    if (R.out[0])
        fail_msg("a failed run printed on stdout: [%s]", R.out);
}

static void expect_code0(void)
{
    if (R.code != 0)
        fail_msg("exit code %d; stderr: %s", R.code, R.err);
}

/* ---- library-side expectations ---------------------------------------------------------- */

typedef struct lib_tensor {
    char name[1024];
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    qcal_numeric_stats st;
    bool converted;   /* dtype qcal reads */
} lib_tensor;

/* "path:name", malloc'ed. */
static char *qualified(const char *path, const char *name)
{
    size_t n = strlen(path) + strlen(name) + 2;
    char *r = malloc(n);
    assert_non_null(r);
    snprintf(r, n, "%s:%s", path, name);
    return r;
}

/* Statistics of every tensor of a safetensors file, computed through the library. */
static int lib_stats(const char *path, lib_tensor *out, int cap)
{
    qcal_safetensors *st = NULL;
    if (qcal_safetensors_open(path, &st) != QCAL_OK)
        fail_msg("open %s: %s", path, qcal_last_error());
    int64_t n;
    qcal_safetensors_count(st, &n);
    assert_true(n <= cap);
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        assert_int_equal(qcal_safetensors_info(st, i, &info), QCAL_OK);
        lib_tensor *t = &out[i];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", info.name);
        t->ndim = info.ndim;
        memcpy(t->shape, info.shape, sizeof t->shape);
        qcal_numeric_stats_init(&t->st);
        t->converted = info.dtype != QCAL_SAFETENSORS_OTHER;
        if (!t->converted)
            continue;
        float *buf = malloc((size_t)(info.numel ? info.numel : 1) * sizeof *buf);
        assert_non_null(buf);
        assert_int_equal(qcal_safetensors_read_f32(st, i, 0, info.numel, buf), QCAL_OK);
        assert_int_equal(qcal_numeric_stats_update(&t->st, buf, info.numel), QCAL_OK);
        free(buf);
    }
    qcal_safetensors_close(&st);
    return (int)n;
}

static void shape_str(char *b, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t k = 0;
    snprintf(b, cap, "scalar");
    for (int32_t d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(b + k, cap - k, d ? "x%lld" : "%lld", (long long)shape[d]);
}

/* The logger line qcal stats must print for t (format of include/qcal/numeric.h). */
static void want_line(char *b, size_t cap, int64_t c, const char *fqn, int32_t ndim,
                      const int64_t *shape, const qcal_numeric_stats *st)
{
    char shp[128];
    shape_str(shp, sizeof shp, ndim, shape);
    int k = snprintf(b, cap, "t=param, c=%lld, fqn='%s', op='', extra='%s', ", (long long)c, fqn,
                     shp);
    double sd;
    qcal_numeric_stats_std(st, &sd);
    if (st->count > 0)
        k += snprintf(b + k, cap - (size_t)k, "min=%.6g, max=%.6g, absmax=%.6g, avg=%.6g, std=%.6g",
                      (double)st->min, (double)st->max, (double)st->absmax, st->mean, sd);
    else
        k += snprintf(b + k, cap - (size_t)k, "n=0, min=, max=, absmax=, avg=, std=");
    if (st->nonfinite)
        k += snprintf(b + k, cap - (size_t)k, ", nonfinite=%llu", (unsigned long long)st->nonfinite);
    snprintf(b + k, cap - (size_t)k, "\n");
}

/* ---- qcal stats ------------------------------------------------------------------------ */

static void test_stats_npy(void **state)
{
    (void)state;
    run("stats", DATA("m_mid_x.npy"), DATA("m_offset_x.npy"), NULL);
    expect_code0();
    assert_string_equal(R.err, "");
    const char *names[2] = {"m_mid_x", "m_offset_x"};
    char want[4096] = "";
    size_t k = 0;
    for (int i = 0; i < 2; i++) {
        char p[64];
        snprintf(p, sizeof p, "%s.npy", names[i]);
        qcal_npy_array a;
        assert_int_equal(qcal_npy_read_f32(DATA(p), &a), QCAL_OK);
        qcal_numeric_stats st;
        qcal_numeric_stats_init(&st);
        qcal_numeric_stats_update(&st, a.data, a.numel);
        want_line(want + k, sizeof want - k, i, names[i], a.ndim, a.shape, &st);
        k = strlen(want);
        qcal_npy_array_free(&a);
    }
    assert_string_equal(R.out, want);
}

/* Splits a CSV line (RFC 4180 quotes) into fields. */
static int csv_split(const char *line, char fields[][256], int cap)
{
    int n = 0;
    const char *p = line;
    for (;;) {
        assert_true(n < cap);
        size_t k = 0;
        if (*p == '"') {
            for (p++; !(*p == '"' && p[1] != '"'); p++) {
                assert_true(*p != '\0' && k < 255);
                if (*p == '"')
                    p++;
                fields[n][k++] = *p;
            }
            p++;
        } else {
            while (*p && *p != ',' && *p != '\n') {
                assert_true(k < 255);
                fields[n][k++] = *p++;
            }
        }
        fields[n++][k] = '\0';
        if (*p != ',')
            return n;
        p++;
    }
}

static void test_stats_safetensors(void **state)
{
    (void)state;
    static lib_tensor lt[64];
    int n1 = lib_stats(DATA("st_mixed.safetensors"), lt, 32);
    int n2 = lib_stats(DATA("cw_model.safetensors"), lt + n1, 32);
    /* a name both files hold (conv.weight) is printed with its file: 'FILE:NAME' */
    int shared = 0;
    for (int i = 0; i < n1; i++)
        for (int j = n1; j < n1 + n2; j++)
            if (!strcmp(lt[i].name, lt[j].name)) {
                char *a = qualified(DATA("st_mixed.safetensors"), lt[i].name);
                char *b = qualified(DATA("cw_model.safetensors"), lt[j].name);
                assert_true(strlen(a) < sizeof lt[i].name && strlen(b) < sizeof lt[j].name);
                memcpy(lt[i].name, a, strlen(a) + 1);
                memcpy(lt[j].name, b, strlen(b) + 1);
                free(a);
                free(b);
                shared++;
            }
    assert_int_equal(shared, 1);
    const char *csv = TMP("stats.csv");
    run("stats", "--csv", csv, "--summary", DATA("st_mixed.safetensors"),
        DATA("cw_model.safetensors"), NULL);
    expect_code0();
    /* the I64 tensor is skipped with one note */
    assert_string_equal(R.err, "qcal: stats: warning: skipping 'bn.num_batches_tracked' "
                               "(dtype I64)\n");
    /* records: one exact line per converted tensor, c counting across files */
    char want[1 << 15] = "";
    size_t k = 0;
    int64_t c = 0;
    for (int i = 0; i < n1 + n2; i++) {
        if (!lt[i].converted)
            continue;
        want_line(want + k, sizeof want - k, c++, lt[i].name, lt[i].ndim, lt[i].shape, &lt[i].st);
        k = strlen(want);
    }
    if (strncmp(R.out, want, k)) {
        print_error("stats output:\n%s\nwant records:\n%s", R.out, want);
        fail();
    }
    /* no statistic printed as inf/-inf (the empty tensor's line says n=0) */
    assert_null(strstr(R.out, "=inf"));
    assert_null(strstr(R.out, "=-inf"));
    assert_non_null(strstr(R.out, "fqn='empty', op='', extra='0x4', n=0, min=, max="));
    /* summary: the four blocks collapse into one group with its outlier */
    const char *sum = R.out + k;
    const char *g = strstr(sum, "\nblocks.*.fc.weight ");
    assert_non_null(g);
    long long cnt = 0;
    char shp[32];
    assert_int_equal(sscanf(g + strlen("\nblocks.*.fc.weight "), "%lld %31s", &cnt, shp), 2);
    assert_int_equal(cnt, 4);
    assert_string_equal(shp, "8x16");
    const char *eol = strchr(g + 1, '\n');
    assert_non_null(eol);
    char gl[512];
    snprintf(gl, sizeof gl, "%.*s", (int)(eol - g - 1), g + 1);
    assert_non_null(strstr(gl, " blocks.3.fc.weight"));
    /* the empty tensor's group has no statistics: "-", not -inf */
    const char *e = strstr(sum, "\nempty ");
    assert_non_null(e);
    eol = strchr(e + 1, '\n');
    snprintf(gl, sizeof gl, "%.*s", (int)(eol - e - 1), e + 1);
    assert_null(strstr(gl, "inf"));
    assert_non_null(strstr(gl, " - "));

    /* CSV: read back, every number bit-equal to the library's statistics */
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[4096];
    static char fld[16][256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "t,c,fqn,op,extra,shape,count,nonfinite,min,max,absmax,mean,std\n");
    c = 0;
    for (int i = 0; i < n1 + n2; i++) {
        if (!lt[i].converted)
            continue;
        assert_non_null(fgets(line, sizeof line, f));
        assert_int_equal(csv_split(line, fld, 16), 13);
        assert_string_equal(fld[0], "param");
        assert_int_equal(strtoll(fld[1], NULL, 10), c++);
        assert_string_equal(fld[2], lt[i].name);
        const qcal_numeric_stats *s = &lt[i].st;
        assert_int_equal(strtoll(fld[6], NULL, 10), s->count);
        assert_int_equal(strtoull(fld[7], NULL, 10), s->nonfinite);
        if (s->count == 0) {
            assert_string_equal(fld[8], "");
            assert_string_equal(fld[12], "");
            continue;
        }
        double sd;
        qcal_numeric_stats_std(s, &sd);
        if (strtof(fld[8], NULL) != s->min || strtof(fld[9], NULL) != s->max ||
            strtof(fld[10], NULL) != s->absmax || strtod(fld[11], NULL) != s->mean ||
            strtod(fld[12], NULL) != sd)
            fail_msg("CSV row of '%s' [%s] differs from the library: min %.9g max %.9g "
                     "absmax %.9g mean %.17g std %.17g", lt[i].name, line, (double)s->min,
                     (double)s->max, (double)s->absmax, s->mean, sd);
    }
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
}

static void test_stats_bad_inputs(void **state)
{
    (void)state;
    run("stats", DATA("does_not_exist.safetensors"), NULL);
    expect_fail(3, "does_not_exist");
    run("stats", DATA("bad_overlap.safetensors"), NULL);
    expect_fail(3, NULL);
    run("stats", DATA("bad_not_json.safetensors"), NULL);
    expect_fail(3, NULL);
    run("stats", NULL);
    expect_fail(2, "no input file");
    run("stats", "--bogus", DATA("m_mid_x.npy"), NULL);
    expect_fail(2, "bogus");
    run("stats", "--csv", "/nonexistent-dir-qcal/x.csv", DATA("m_mid_x.npy"), NULL);
    if (R.code == 0)
        fail_msg("an unwritable --csv path succeeded");
    expect_one_err_line(NULL);
}

/* ---- qcal compare-weights ----------------------------------------------------------------- */

typedef struct ref_row {
    char variant[32], name[64];
    double v[6];   /* sqnr l2 cosine max_abs_err scale_min scale_max */
} ref_row;

static int load_ref(ref_row *rows, int cap)
{
    FILE *f = fopen(DATA("cw_ref.txt"), "r");
    assert_non_null(f);
    int n = 0;
    while (n < cap && fscanf(f, "%31s %63s %lf %lf %lf %lf %lf %lf", rows[n].variant,
                             rows[n].name, &rows[n].v[0], &rows[n].v[1], &rows[n].v[2],
                             &rows[n].v[3], &rows[n].v[4], &rows[n].v[5]) == 8)
        n++;
    fclose(f);
    assert_true(n >= 12);
    return n;
}

static qcal_json *parse_out(void)
{
    qcal_json *doc = NULL;
    if (qcal_json_parse(R.out, strlen(R.out), NULL, &doc) != QCAL_OK)
        fail_msg("output is not JSON (%s): %s", qcal_last_error(), R.out);
    return doc;
}

static const qcal_json *member(const qcal_json *o, const char *key)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v)
        fail_msg("JSON object lacks \"%s\"", key);
    return v;
}

static double jnum(const qcal_json *o, const char *key)
{
    const qcal_json *v = member(o, key);
    if (v->type == QCAL_JSON_NULL)
        return NAN;
    if (v->type == QCAL_JSON_STRING && !strcmp(v->str, "inf"))
        return INFINITY;
    if (v->type != QCAL_JSON_NUMBER)
        fail_msg("\"%s\" is a %s", key, qcal_json_type_name(v->type));
    return v->number;
}

static const qcal_json *find_tensor(const qcal_json *doc, const char *name)
{
    const qcal_json *ts = member(doc, "tensors");
    for (size_t i = 0; i < ts->n; i++)
        if (!strcmp(member(&ts->items[i], "name")->str, name))
            return &ts->items[i];
    fail_msg("no tensor '%s' in the JSON", name);
    return NULL;
}

/* Worst-case tracker: remembers the largest error of one field over all tensors. */
typedef struct worst {
    const char *field;
    double err, got, want, tol;
    char name[64];
} worst;

static void track(worst *w, const char *name, double got, double want, double err, double tol)
{
    if (err > w->err || (isnan(err) && !isnan(w->err))) {
        w->err = err;
        w->got = got;
        w->want = want;
        w->tol = tol;
        snprintf(w->name, sizeof w->name, "%s", name);
    }
}

static void report(const worst *w, int n)
{
    bool bad = false;
    for (int i = 0; i < n; i++) {
        if (!(w[i].err <= w[i].tol)) {
            print_error("%s: worst error %.3g (tolerance %.3g) at tensor '%s': got %.17g want %.17g\n",
                        w[i].field, w[i].err, w[i].tol, w[i].name, w[i].got, w[i].want);
            bad = true;
        }
    }
    if (bad)
        fail();
}

/* JSON of one run against the library (same options) and PyTorch (variant rows). */
static void check_against(const qcal_json *doc, const qcal_numeric_weights_options *wo,
                          const char *variant)
{
    static ref_row ref[64];
    int nref = load_ref(ref, 64);
    worst wl[4] = {{"lib.sqnr (rel)", 0, 0, 0, 1e-8, ""}, {"lib.l2 (rel)", 0, 0, 0, 1e-8, ""},
                   {"lib.cosine", 0, 0, 0, 1e-8, ""}, {"lib.float32 fields", 0, 0, 0, 0, ""}};
    worst wt[6] = {{"torch.sqnr", 0, 0, 0, 1e-4, ""}, {"torch.l2 (rel)", 0, 0, 0, 1e-5, ""},
                   {"torch.cosine", 0, 0, 0, 1e-6, ""}, {"torch.max_abs_err", 0, 0, 0, 0, ""},
                   {"torch.scale_min", 0, 0, 0, 0, ""}, {"torch.scale_max", 0, 0, 0, 0, ""}};
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(DATA("cw_model.safetensors"), &st), QCAL_OK);
    int64_t n;
    qcal_safetensors_count(st, &n);
    int compared_by_torch = 0;
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        qcal_safetensors_info(st, i, &info);
        if (info.ndim < 2)
            continue;   /* skipped and counted (test_compare_json_default) */
        float buf[256];
        assert_true(info.numel <= 256);
        assert_int_equal(qcal_safetensors_read_f32(st, i, 0, info.numel, buf), QCAL_OK);
        qcal_tensor t;
        qcal_tensor_init(&t, buf, info.ndim, info.shape);
        qcal_numeric_weight_result lib;
        qcal_status s = qcal_numeric_weights_compare(wo, info.name, &t, &lib);
        const qcal_json *j = find_tensor(doc, info.name);
        if (s == QCAL_ERR_NONFINITE) {
            /* reported, flagged, not compared */
            assert_int_equal(member(j, "compared")->type, QCAL_JSON_FALSE);
            assert_true(isnan(jnum(j, "sqnr")) && isnan(jnum(j, "scale_min")));
            assert_int_equal((int64_t)jnum(j, "nonfinite"), info.numel);
            assert_int_equal((int64_t)jnum(j, "count"), 0);
            continue;
        }
        assert_int_equal(s, QCAL_OK);
        assert_int_equal(member(j, "compared")->type, QCAL_JSON_TRUE);
        assert_string_equal(member(j, "qscheme")->str, qcal_qscheme_name(lib.qscheme));
        const qcal_json *shp = member(j, "shape");
        assert_int_equal((int)shp->n, info.ndim);
        for (int32_t d = 0; d < info.ndim; d++)
            assert_int_equal(shp->items[d].i64, info.shape[d]);
        assert_int_equal((int64_t)jnum(j, "nonfinite"), (int64_t)lib.stats.nonfinite);
        /* against the library: %.9g round trip */
        double q = jnum(j, "sqnr");
        if (isinf(lib.m.sqnr_db))
            assert_true(q == lib.m.sqnr_db);
        else
            track(&wl[0], info.name, q, lib.m.sqnr_db, fabs(q - lib.m.sqnr_db) / fabs(lib.m.sqnr_db), 1e-8);
        double l2 = jnum(j, "l2");
        track(&wl[1], info.name, l2, lib.m.l2, fabs(l2 - lib.m.l2) / fmax(lib.m.l2, 1e-300), 1e-8);
        double cs = jnum(j, "cosine");
        track(&wl[2], info.name, cs, lib.m.cosine, fabs(cs - lib.m.cosine), 1e-8);
        float ff[5] = {(float)jnum(j, "scale_min"), (float)jnum(j, "scale_max"),
                       (float)jnum(j, "min"), (float)jnum(j, "max"),
                       (float)jnum(j, "max_abs_err")};
        float lf[5] = {lib.scale_min, lib.scale_max, lib.stats.min, lib.stats.max,
                       (float)lib.m.max_abs_err};
        for (int k = 0; k < 5; k++)
            track(&wl[3], info.name, ff[k], lf[k], ff[k] == lf[k] ? 0 : 1, 0);
        /* against PyTorch */
        for (int r = 0; r < nref; r++) {
            if (strcmp(ref[r].variant, variant) || strcmp(ref[r].name, info.name))
                continue;
            compared_by_torch++;
            const double *v = ref[r].v;
            track(&wt[0], info.name, lib.m.sqnr_db, v[0], fabs(lib.m.sqnr_db - v[0]), 1e-4);
            track(&wt[1], info.name, lib.m.l2, v[1], fabs(lib.m.l2 - v[1]) / v[1], 1e-5);
            track(&wt[2], info.name, lib.m.cosine, v[2], fabs(lib.m.cosine - v[2]), 1e-6);
            track(&wt[3], info.name, ff[4], v[3], ff[4] == (float)v[3] ? 0 : 1, 0);
            track(&wt[4], info.name, ff[0], v[4], ff[0] == (float)v[4] ? 0 : 1, 0);
            track(&wt[5], info.name, ff[1], v[5], ff[1] == (float)v[5] ? 0 : 1, 0);
        }
    }
    qcal_safetensors_close(&st);
    assert_int_equal(compared_by_torch, 5);   /* the 2-D+ tensors of cw_ref.txt */
    report(wl, 4);
    report(wt, 6);
}

static void test_compare_json_default(void **state)
{
    (void)state;
    run("compare-weights", "--format", "json", DATA("cw_model.safetensors"), NULL);
    expect_code0();
    /* the tensor without finite values is reported on one stderr line, the run goes on */
    expect_one_err_line("'all_nan' has no finite value");
    qcal_json *doc = parse_out();
    qcal_numeric_weights_options wo;
    qcal_numeric_weights_options_default(&wo);
    check_against(doc, &wo, "default");
    /* fc.bias (1-D) is skipped and counted, as calibrate --weights does */
    assert_int_equal(member(doc, "tensors")->n, 8);
    const qcal_json *sk = member(doc, "skipped_under_2d");
    assert_int_equal(sk->n, 1);
    assert_string_equal(sk->items[0].str, "fc.bias");
    /* zero signal: identical after quantize-dequantize -> "inf" (PyTorch: NaN, 0/0) */
    const qcal_json *z = find_tensor(doc, "zeros");
    assert_true(jnum(z, "sqnr") == INFINITY);
    assert_true(jnum(z, "l2") == 0);
    const qcal_json *pn = find_tensor(doc, "partial_nan");
    assert_int_equal((int)jnum(pn, "nonfinite"), 1);
    assert_int_equal((int)jnum(pn, "count"), 19);
    assert_string_equal(member(find_tensor(doc, "conv.weight"), "qscheme")->str,
                        "per_channel_symmetric");
    /* groups */
    const qcal_json *gs = member(doc, "groups");
    assert_int_equal(gs->n, 5);
    const qcal_json *g0 = &gs->items[0];
    assert_string_equal(member(g0, "pattern")->str, "blocks.*.fc.weight");
    assert_int_equal((int)jnum(g0, "count"), 4);
    assert_true(jnum(g0, "max_of_max") == 3.0);
    const qcal_json *out = member(g0, "outliers");
    assert_int_equal(out->n, 1);
    assert_string_equal(out->items[0].str, "blocks.3.fc.weight");
    double worst = INFINITY;
    for (int i = 0; i < 4; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "blocks.%d.fc.weight", i);
        worst = fmin(worst, jnum(find_tensor(doc, nm), "sqnr"));
    }
    assert_true(jnum(g0, "worst_sqnr") == worst);
    const qcal_json *gn = &gs->items[4];
    assert_string_equal(member(gn, "pattern")->str, "all_nan");
    assert_int_equal((int)jnum(gn, "no_finite"), 1);
    assert_true(isnan(jnum(gn, "max_of_max")));
    /* lists */
    assert_int_equal(member(doc, "keep_float")->n, 0);
    const qcal_json *nc = member(doc, "not_compared");
    assert_int_equal(nc->n, 1);
    assert_string_equal(nc->items[0].str, "all_nan");
    assert_int_equal((int)jnum(doc, "nonfinite_values"), 7);
    qcal_json_free(&doc);
}

static void test_compare_options(void **state)
{
    (void)state;
    run("compare-weights", "--observer", "minmax", "--dtype", "quint8", "--qscheme",
        "per_tensor_affine", "--format", "json", DATA("cw_model.safetensors"), NULL);
    expect_code0();
    qcal_json *doc = parse_out();
    qcal_numeric_weights_options wo;
    qcal_numeric_weights_options_default(&wo);
    wo.observer = QCAL_OBSERVER_MINMAX;
    wo.dtype = QCAL_QUINT8;
    wo.qscheme = QCAL_PER_TENSOR_AFFINE;
    check_against(doc, &wo, "minmax_quint8_affine");
    const qcal_json *t = find_tensor(doc, "conv.weight");
    assert_string_equal(member(t, "qscheme")->str, "per_tensor_affine");
    assert_true(jnum(t, "scale_min") == jnum(t, "scale_max"));
    qcal_json_free(&doc);

    /* --min-sqnr: exactly the tensors below the threshold, in file order */
    run("compare-weights", "--min-sqnr", "46.45", "--format", "json",
        DATA("cw_model.safetensors"), NULL);
    expect_code0();
    doc = parse_out();
    const qcal_json *ts = member(doc, "tensors"), *kf = member(doc, "keep_float");
    size_t k = 0;
    for (size_t i = 0; i < ts->n; i++) {
        double q = jnum(&ts->items[i], "sqnr");
        if (!isnan(q) && q < 46.45) {
            assert_true(k < kf->n);
            assert_string_equal(kf->items[k].str, member(&ts->items[i], "name")->str);
            k++;
        }
    }
    assert_int_equal(k, kf->n);
    assert_int_equal(k, 3);   /* blocks.2 (46.40), blocks.3 (40.25), conv (45.38) */
    qcal_json_free(&doc);
}

static void test_compare_csv_table(void **state)
{
    (void)state;
    run("compare-weights", "--format", "json", DATA("cw_model.safetensors"), NULL);
    expect_code0();
    qcal_json *doc = parse_out();
    run("compare-weights", "--format", "csv", DATA("cw_model.safetensors"), NULL);
    expect_code0();
    static char fld[16][256];
    char *save = NULL;
    char *line = strtok_r(R.out, "\n", &save);
    assert_string_equal(line, "name,shape,min,max,std,scale_min,scale_max,sqnr,l2,cosine,"
                              "max_abs_err,nonfinite,compared");
    const char *keys[] = {"min", "max", "std", "scale_min", "scale_max", "sqnr", "l2", "cosine",
                          "max_abs_err"};
    int rows = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        assert_int_equal(csv_split(line, fld, 16), 13);
        const qcal_json *j = find_tensor(doc, fld[0]);
        for (int k = 0; k < 9; k++) {
            double want = jnum(j, keys[k]);
            if (isnan(want)) {
                assert_string_equal(fld[2 + k], "");
                continue;
            }
            double got = strtod(fld[2 + k], NULL);
            if (!(got == want))
                fail_msg("CSV %s of '%s': %s, JSON %.17g", keys[k], fld[0], fld[2 + k], want);
        }
        assert_int_equal(strtoll(fld[11], NULL, 10), (long long)jnum(j, "nonfinite"));
        assert_int_equal(atoi(fld[12]), member(j, "compared")->type == QCAL_JSON_TRUE);
        rows++;
    }
    assert_int_equal(rows, 8);
    assert_non_null(strstr(R.err, "note: 1 tensor under 2 dimensions skipped (biases, norms), "
                                  "first 'fc.bias'"));
    qcal_json_free(&doc);

    /* table: every column ends where its header ends */
    run("compare-weights", "--min-sqnr", "41", DATA("cw_model.safetensors"), NULL);
    expect_code0();
    char *hdr = strtok_r(R.out, "\n", &save);
    assert_non_null(hdr);
    const char *cos = strstr(hdr, "cosine");
    assert_non_null(cos);
    size_t end = (size_t)(cos - hdr) + strlen("cosine");
    size_t sq_end = (size_t)(strstr(hdr, "sqnr_dB") - hdr) + strlen("sqnr_dB");
    int seen = 0;
    for (int i = 0; i < 8; i++) {
        char *l = strtok_r(NULL, "\n", &save);
        assert_non_null(l);
        size_t len = strlen(l);
        bool flagged = strstr(l, "nonfinite=") || strstr(l, "NO FINITE VALUE");
        if (!(flagged ? len > end + 2 && l[end] == ' ' && l[end + 1] == ' ' : len == end))
            fail_msg("table row %d is not aligned with the header (length %zu, cosine ends at "
                     "%zu): [%s]", i, len, end, l);
        /* the sqnr column: a number or "-" right-aligned under sqnr_dB */
        assert_true(l[sq_end - 1] != ' ' && l[sq_end] == ' ');
        seen += strstr(l, "NO FINITE VALUE (6 NaN/Inf), not compared") != NULL;
    }
    assert_int_equal(seen, 1);
    char *rest = save;
    assert_non_null(strstr(rest, "\nblocks.*.fc.weight "));
    assert_non_null(strstr(rest, "8 tensors: 7 compared, 1 with no finite value"));
    assert_non_null(strstr(rest, "7 NaN/Inf values in all; 1 tensor under 2 dimensions "
                                 "skipped\n"));
    assert_non_null(strstr(rest, "keep in float (sqnr below threshold): blocks.3.fc.weight\n"));
}

static void test_compare_npy(void **state)
{
    (void)state;
    /* .npy input: one tensor named after the file. m_mid_x is 1-D: skipped and counted, as
     * calibrate --weights skips biases; the same values as a (4, n/4) weight are compared
     * per channel (axis 0) exactly as the library does. */
    run("compare-weights", "--format", "json", DATA("m_mid_x.npy"), NULL);
    expect_code0();
    assert_string_equal(R.err, "");
    qcal_json *doc = parse_out();
    assert_int_equal(member(doc, "tensors")->n, 0);
    const qcal_json *sk = member(doc, "skipped_under_2d");
    assert_int_equal(sk->n, 1);
    assert_string_equal(sk->items[0].str, "m_mid_x");
    qcal_json_free(&doc);

    qcal_npy_array a;
    assert_int_equal(qcal_npy_read_f32(DATA("m_mid_x.npy"), &a), QCAL_OK);
    assert_true(a.ndim == 1 && a.numel % 4 == 0);
    int64_t shape[2] = { 4, a.numel / 4 };
    assert_int_equal(qcal_npy_write(TMP("w2d.npy"), QCAL_NPY_F32, 2, shape, a.data), QCAL_OK);
    run("compare-weights", "--format", "json", TMP("w2d.npy"), NULL);
    expect_code0();
    doc = parse_out();
    assert_int_equal(member(doc, "skipped_under_2d")->n, 0);
    const qcal_json *t = find_tensor(doc, "w2d");
    qcal_tensor x;
    assert_int_equal(qcal_tensor_init(&x, a.data, 2, shape), QCAL_OK);
    qcal_numeric_weights_options wo;
    qcal_numeric_weights_options_default(&wo);
    qcal_numeric_weight_result lib;
    assert_int_equal(qcal_numeric_weights_compare(&wo, "w2d", &x, &lib), QCAL_OK);
    assert_true(fabs(jnum(t, "sqnr") - lib.m.sqnr_db) <= 1e-8 * lib.m.sqnr_db);
    assert_true((float)jnum(t, "scale_max") == lib.scale_max);
    assert_string_equal(member(t, "qscheme")->str, "per_channel_symmetric");
    qcal_npy_array_free(&a);
    qcal_json_free(&doc);
}

static void test_compare_bad_inputs(void **state)
{
    (void)state;
    const char *f = DATA("cw_model.safetensors");
    run("compare-weights", DATA("missing.safetensors"), NULL);
    expect_fail(3, "missing.safetensors");
    run("compare-weights", DATA("bad_overlap.safetensors"), NULL);
    expect_fail(3, NULL);
    run("compare-weights", DATA("bad_size.safetensors"), NULL);
    expect_fail(3, NULL);
    run("compare-weights", DATA("bad_hlen_huge.safetensors"), NULL);
    expect_fail(3, NULL);
    run("compare-weights", "--observer", "bogus", f, NULL);
    expect_fail(2, "bogus");
    run("compare-weights", "--format", "xml", f, NULL);
    expect_fail(2, "xml");
    run("compare-weights", "--dtype", "qint32", f, NULL);
    expect_fail(2, "qint32");
    run("compare-weights", "--qscheme", "per_channel_affine_float_qparams", f, NULL);
    expect_fail(2, NULL);
    run("compare-weights", "--min-sqnr", "abc", f, NULL);
    expect_fail(2, NULL);
    run("compare-weights", NULL);
    expect_fail(2, "no input file");
}

static int group_setup(void **state)
{
    (void)state;
    qcal_bin = getenv("QCAL_BIN");
    if (!qcal_bin || access(qcal_bin, X_OK) != 0) {
        fprintf(stderr, "QCAL_BIN is not set to the qcal binary\n");
        return -1;
    }
    const char *d = getenv("QCAL_TEST_DATA");
    snprintf(data_dir, sizeof data_dir, "%s/numeric", d ? d : "tests/data");
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal_test_numeric_cli.XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_npy),
        cmocka_unit_test(test_stats_safetensors),
        cmocka_unit_test(test_stats_bad_inputs),
        cmocka_unit_test(test_compare_json_default),
        cmocka_unit_test(test_compare_options),
        cmocka_unit_test(test_compare_csv_table),
        cmocka_unit_test(test_compare_npy),
        cmocka_unit_test(test_compare_bad_inputs),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
