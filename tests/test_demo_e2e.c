/* unit.demo_e2e: the end-to-end demo (build/examples/qcal-demo) run as a program.
 *
 *  - a short run on a subset (float model trained on 8,000 images for one epoch into a private
 *    cache, 300 calibration images, 2,000 test images, a short QAT) asserting accuracy bounds
 *    for every observer and QAT, the output files, and the calibrated minmax qparams against
 *    an independent float forward of the cached model;
 *  - a second run that must load the model from the cache and reproduce the numbers;
 *  - bad inputs: missing dataset (names the Debian package), corrupt gzip, corrupt and
 *    truncated IDX, safetensors with a missing or misshapen tensor, an unwritable output
 *    directory, bad options: each ends with one error line and a non-zero exit status.
 *
 * The program is $QCAL_DEMO_BIN, else ../examples/qcal-demo next to this test's directory. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "cnn.h"
#include "qcal/calib.h"
#include "qcal/safetensors.h"

/* Smallest spread (best - worst top-1 of the single observers) in the 3-bit setting that the
 * short run must show: measured 4.20 points there (minmax 77.80 .. mse 80.75 on 2,000 test
 * images), 4.22 on the full demo. */
#define SPREAD_MIN 2.0

static char g_bin[4200];
static char g_tmp[256];
static const char *const g_kinds[] = {"minmax", "moving_average_minmax", "histogram", "percentile",
                                      "entropy", "mse"};

static bool have_dataset(void)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", cnn_data_dir());
    return access(p, R_OK) == 0;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = 0;
    fclose(f);
    return buf;
}

/* Runs the demo with argv (NULL-terminated, without argv[0]); stdout/stderr to files under
 * g_tmp; env XDG_CACHE_HOME=<g_tmp>/cache. Returns the exit status (or -1). */
static int run_demo(const char *const *args, char **out, char **err)
{
    char outp[512], errp[512], cache[512];
    snprintf(outp, sizeof outp, "%s/stdout.txt", g_tmp);
    snprintf(errp, sizeof errp, "%s/stderr.txt", g_tmp);
    snprintf(cache, sizeof cache, "%s/cache", g_tmp);
    const char *argv[64];
    int n = 0;
    argv[n++] = g_bin;
    while (args[n - 1] && n < 63) {
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        setenv("XDG_CACHE_HOME", cache, 1);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    if (out)
        *out = read_all(outp);
    if (err)
        *err = read_all(errp);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Number of lines in s. */
static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Asserts one error line containing `want` and exit status `code`. */
static void expect_error(const char *const *args, int code, const char *want)
{
    char *out = NULL, *err = NULL;
    int rc = run_demo(args, &out, &err);
    assert_non_null(err);
    if (rc != code || count_lines(err) != 1 || strncmp(err, "qcal-demo: error: ", 18) != 0 || !strstr(err, want)) {
        print_error("exit %d (want %d), stderr:\n%s(want one line with '%s')\n", rc, code, err, want);
        fail();
    }
    free(out);
    free(err);
}

/* Number after "key": in json (searched from `from`); NAN if absent or null. */
static double json_get(const char *json, const char *from_key, const char *key)
{
    const char *p = json;
    if (from_key) {
        char k[128];
        snprintf(k, sizeof k, "\"%s\":", from_key);
        p = strstr(json, k);
        if (!p)
            return NAN;
    }
    char k[128];
    snprintf(k, sizeof k, "\"%s\": ", key);
    p = strstr(p, k);
    if (!p)
        return NAN;
    p += strlen(k);
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

/* Number after "k1": ... "k2": ... "key": (each searched after the previous); NAN if absent. */
static double json_get3(const char *json, const char *k1, const char *k2, const char *key)
{
    char k[128];
    snprintf(k, sizeof k, "\"%s\":", k1);
    const char *p = strstr(json, k);
    return p ? json_get(p, k2, key) : NAN;
}

/* The report is one self-contained file: charts inline, nothing fetched. */
static void check_report(const char *path, const char *must_hold)
{
    char *html = read_all(path);
    if (!html) {
        print_error("missing report %s\n", path);
        fail();
    }
    assert_int_equal(strncmp(html, "<!DOCTYPE html>", 15), 0);
    assert_non_null(strstr(html, "<svg"));
    assert_non_null(strstr(html, "</html>"));
    assert_non_null(strstr(html, must_hold));
    /* no external resource: the only URL is the SVG namespace */
    for (const char *p = html; (p = strstr(p, "http")) != NULL; p++)
        if (strncmp(p, "http://www.w3.org/2000/svg", 26) != 0) {
            print_error("%s refers to %.60s\n", path, p);
            fail();
        }
    assert_null(strstr(html, "<link"));
    assert_null(strstr(html, " src="));
    assert_null(strstr(html, "@import"));
    free(html);
}

static int setup(void **state)
{
    (void)state;
    const char *bin = getenv("QCAL_DEMO_BIN");
    if (bin && *bin) {
        snprintf(g_bin, sizeof g_bin, "%s", bin);
    } else {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return -1;
        self[n] = 0;
        char *slash = strrchr(self, '/');
        *slash = 0;
        snprintf(g_bin, sizeof g_bin, "%s/../examples/qcal-demo", self);
    }
    if (access(g_bin, X_OK) != 0) {
        fprintf(stderr, "qcal-demo not found at %s\n", g_bin);
        return -1;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/qcal_demo_e2e_XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* Min/max of every tap over the forward passes (the minmax observer, independently). */
typedef struct range_acc {
    float mn[CNN_NTAPS], mx[CNN_NTAPS];
} range_acc;

static qcal_status range_hook(void *user, cnn_act *a)
{
    range_acc *r = user;
    for (int64_t i = 0; i < a->numel; i++) {
        r->mn[a->tap] = fminf(r->mn[a->tap], a->data[i]);
        r->mx[a->tap] = fmaxf(r->mx[a->tap], a->data[i]);
    }
    return QCAL_OK;
}

/* ---- the short end-to-end run -------------------------------------------------------- */

static const char *const short_args[] = {
    "--train-images", "8000", "--epochs", "1", "--test-images", "2000", "--calib-images", "300",
    "--sqnr-images", "200", "--qat-steps", "60", "--qat-freeze", "45", NULL};

static void test_short_run(void **state)
{
    (void)state;
    if (!have_dataset())
        skip();
    char out_dir[512], json[512];
    snprintf(out_dir, sizeof out_dir, "%s/out", g_tmp);
    snprintf(json, sizeof json, "%s/summary.json", g_tmp);
    const char *args[40];
    int n = 0;
    for (; short_args[n]; n++)
        args[n] = short_args[n];
    args[n++] = "--out";
    args[n++] = out_dir;
    args[n++] = "--json";
    args[n++] = json;
    args[n] = NULL;
    char *out = NULL, *err = NULL;
    int rc = run_demo(args, &out, &err);
    if (rc != 0) {
        print_error("qcal-demo exit %d\nstdout:\n%s\nstderr:\n%s\n", rc, out ? out : "", err ? err : "");
        fail();
    }
    assert_non_null(strstr(out, "float model: trained"));
    assert_non_null(strstr(out, out_dir));   /* names the output directory */
    char *js = read_all(json);
    assert_non_null(js);
    double f = json_get(js, NULL, "float_top1");
    print_message("float top-1 %.2f%%\n", f);
    /* one epoch on 8,000 images: ~80-84% here (90% needs the full 3-epoch schedule) */
    assert_true(f >= 75.0 && f <= 100.0);
    for (size_t k = 0; k < sizeof g_kinds / sizeof g_kinds[0]; k++) {
        double top1 = json_get(js, g_kinds[k], "top1"), agree = json_get(js, g_kinds[k], "agree");
        double sq = json_get(js, g_kinds[k], "worst_sqnr_db"), cs = json_get(js, g_kinds[k], "calib_s");
        print_message("%-22s top1 %.2f agree %.2f worst SQNR %.2f dB calib %.3f s\n", g_kinds[k], top1, agree, sq, cs);
        /* Same bounds for every kind: entropy clamps the zero spike of the ReLU/max-pool
         * outputs in its |x| histogram (observers/entropy.c) and is as close as the others. */
        double max_delta = 1.0, min_agree = 97.0, min_sq = 25.0;
        if (!(fabs(top1 - f) <= max_delta && agree >= min_agree && sq >= min_sq && cs > 0.0)) {
            print_error("%s: top1 %.2f vs float %.2f, agreement %.2f, worst SQNR %.2f dB, calib %.3f s\n",
                        g_kinds[k], top1, f, agree, sq, cs);
            fail();
        }
        /* ONNX Runtime int8 (QDQ) of the same table, when node and onnxruntime-node are there
         * (./run.sh test installs them): the same predictions as oneDNN's on almost every
         * image (measured 99.95-100% on the short model's 10,000 test images) */
        double ot = json_get(js, g_kinds[k], "ort_top1"), same = json_get(js, g_kinds[k], "ort_same_as_onednn");
        if (!isnan(ot)) {
            print_message("%-22s ONNX Runtime int8 (QDQ) top1 %.2f, same as oneDNN %.2f%%\n", g_kinds[k], ot, same);
            if (!(fabs(ot - top1) <= 0.25 && same >= 99.5)) {
                print_error("%s: ONNX Runtime top1 %.2f vs oneDNN %.2f, same predictions %.2f%%\n", g_kinds[k], ot,
                            top1, same);
                fail();
            }
        } else if (k == 0) {
            print_message("ONNX Runtime rows not run: %s\n", strstr(out, "ONNX Runtime int8 (QDQ): not run")
                          ? "see the demo's line" : "?");
        }
        char p[700];
        static const char *const files[] = {"calib.json", "calibration_trt.cache", "calibration.cache", "model.table"};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "%s/%s/%s", out_dir, g_kinds[k], files[i]);
            if (access(p, R_OK) != 0) {
                print_error("missing output %s\n", p);
                fail();
            }
        }
    }
    /* The 3-bit setting. Measured on this short run: single observers 76.55% (percentile) ..
     * 80.75% (mse), per-layer best 81.00%; on the full demo 82.75% (minmax) .. 86.97% (mse),
     * per-layer best 89.12%. Since mse, percentile and entropy search both ends of x for
     * the affine target (issue 36): 77.25% (moving_average_minmax) .. 81.40% (mse), per-layer
     * best 80.95% on this short run: the per-layer choice (by SQNR) is no longer above every
     * single observer here, so it is held within a point of the best one. */
    double lb_best = -1, lb_worst = 101;
    for (size_t k = 0; k < sizeof g_kinds / sizeof g_kinds[0]; k++) {
        double t = json_get3(js, "low_bits", g_kinds[k], "top1");
        print_message("3-bit %-22s top1 %.2f\n", g_kinds[k], t);
        assert_true(t > 0 && t <= 100);
        lb_best = fmax(lb_best, t);
        lb_worst = fmin(lb_worst, t);
    }
    double lb_layer = json_get3(js, "low_bits", "per_layer_best", "top1");
    const char *lbs = strstr(js, "\"low_bits\":");
    assert_non_null(lbs);
    double spread = json_get(lbs, NULL, "spread");
    print_message("3-bit per-layer best %.2f, best single %.2f, spread %.2f\n", lb_layer, lb_best, spread);
    assert_true(fabs(spread - (lb_best - lb_worst)) < 0.011);
    assert_true(spread >= SPREAD_MIN);
    /* the two-ended mse (observers/mse.c) can beat the per-layer SQNR choice on this short
     * run: the per-layer best within a point of the best single observer */
    assert_true(lb_layer >= lb_best - 1.0);
    /* --observer auto: its per-tensor candidates (no moving average) choose what the per-layer
     * best chose on every tensor; then at the logits (top-1 agreement with float on the first
     * 64 calibration images, then SQNR) that choice keeps its place (measured: 61 of 64, mse
     * everywhere 60, the others 54-56; the logits' SQNR alone would pick histogram, 78.40%):
     * its row is at least the per-layer best's. */
    double lb_auto = json_get3(js, "low_bits", "auto", "top1");
    double same = json_get3(js, "low_bits", "auto", "same_choice");
    print_message("3-bit auto %.2f, the per-layer best's choice on %.0f of 8 tensors\n", lb_auto, same);
    assert_true(same >= 0 && same <= 8);
    assert_true(lb_auto >= lb_layer);
    assert_non_null(strstr(out, "per-layer best (qcal evaluate)"));
    assert_non_null(strstr(out, "auto (qdq --data's default)"));
    assert_non_null(strstr(out, "spread between observers (best - worst top-1)"));
    char rp[700];
    snprintf(rp, sizeof rp, "%s/report.html", out_dir);
    check_report(rp, "int8 layer SQNR");
    snprintf(rp, sizeof rp, "%s/report_3bit.html", out_dir);
    check_report(rp, "quant");
    snprintf(rp, sizeof rp, "%s/rules_3bit.txt", out_dir);
    char *rules = read_all(rp);
    assert_non_null(rules);
    assert_non_null(strstr(rules, "quant_min=0 quant_max=7"));
    assert_non_null(strstr(rules, "quant_min=-3 quant_max=3"));
    free(rules);

    double qat = json_get(js, NULL, "qat_top1");
    print_message("QAT top-1 %.2f%%\n", qat);
    assert_true(qat >= f - 1.0 && qat <= 100.0);
    char p[700];
    snprintf(p, sizeof p, "%s/stats.csv", out_dir);
    char *csv = read_all(p);
    assert_non_null(csv);
    assert_int_equal(strncmp(csv, "t,c,fqn,op,extra,shape,count", 28), 0);
    /* 8 parameters + 4 taps x 3 calibration batches of 100 */
    assert_int_equal(count_lines(csv), 1 + 8 + 4 * 3);
    free(csv);

    /* The minmax table against an independent float forward of the cached model. */
    cnn_train_opts to = cnn_train_opts_default();
    to.epochs = 1;
    to.max_images = 8000;
    char cache[512], model_path[4096];
    snprintf(cache, sizeof cache, "%s/cache", g_tmp);
    setenv("XDG_CACHE_HOME", cache, 1);
    assert_int_equal(cnn_cache_path(&to, model_path, sizeof model_path), QCAL_OK);
    cnn_model *m = NULL;
    assert_int_equal(cnn_model_load(model_path, &m), QCAL_OK);
    cnn_data train = {0};
    assert_int_equal(cnn_data_load(cnn_data_dir(), "train", &train), QCAL_OK);
    cnn_ctx *ctx = NULL;
    assert_int_equal(cnn_ctx_create(100, &ctx), QCAL_OK);
    range_acc ra;
    for (int t = 0; t < CNN_NTAPS; t++) {
        ra.mx[t] = -INFINITY;
        ra.mn[t] = INFINITY;
    }
    cnn_hooks hooks = {.act = range_hook, .user = &ra};
    for (int64_t i0 = 0; i0 < 300; i0 += 100) {
        const float *z;
        assert_int_equal(cnn_forward(ctx, m, train.images + i0 * 784, 100, &hooks, &z), QCAL_OK);
    }
    snprintf(p, sizeof p, "%s/minmax/calib.json", out_dir);
    qcal_calib_table *tbl = NULL;
    assert_int_equal(qcal_calib_table_read_json(p, &tbl), QCAL_OK);
    int64_t ne = 0;
    assert_int_equal(qcal_calib_table_count(tbl, &ne), QCAL_OK);
    assert_int_equal(ne, 8);   /* 4 layer inputs + 4 weights */
    for (int t = 0; t < 4; t++) {
        const qcal_calib_entry *e = NULL;
        assert_int_equal(qcal_calib_table_find(tbl, cnn_tap_name(t), QCAL_CALIB_ROLE_ACTIVATION, &e), QCAL_OK);
        /* quint8 affine, PyTorch: scale = (max(max,0) - min(min,0)) / 255 */
        float want = (fmaxf(ra.mx[t], 0.0f) - fminf(ra.mn[t], 0.0f)) / 255.0f;
        if (e->min_val[0] != ra.mn[t] || e->max_val[0] != ra.mx[t] || qcal_qparams_scale_at(&e->qparams, 0) != want) {
            print_error("%s: table range [%.9g, %.9g] scale %.9g; independent forward [%.9g, %.9g] scale %.9g\n",
                        cnn_tap_name(t), (double)e->min_val[0], (double)e->max_val[0], (double)qcal_qparams_scale_at(&e->qparams, 0),
                        (double)ra.mn[t], (double)ra.mx[t], (double)want);
            fail();
        }
        char wn[64];
        snprintf(wn, sizeof wn, "%s.weight", cnn_layer_name(t));
        assert_int_equal(qcal_calib_table_find(tbl, wn, QCAL_CALIB_ROLE_WEIGHT, &e), QCAL_OK);
        int64_t shape[4];
        cnn_param_shape(2 * t, shape);
        assert_int_equal(e->qparams.channels, shape[0]);
        int64_t per = cnn_param_numel(2 * t) / shape[0];
        for (int64_t c = 0; c < shape[0]; c++) {
            float a = 0.0f;
            for (int64_t i = 0; i < per; i++)
                a = fmaxf(a, fabsf(m->param[2 * t][c * per + i]));
            /* per_channel_symmetric qint8: amax / 127.5 (PyTorch) */
            float ws = fmaxf(a / 127.5f, 1.1920929e-07f);
            if (qcal_qparams_scale_at(&e->qparams, c) != ws) {
                print_error("%s channel %lld: scale %.9g, want %.9g\n", wn, (long long)c, (double)qcal_qparams_scale_at(&e->qparams, c),
                            (double)ws);
                fail();
            }
        }
    }
    qcal_calib_table_destroy(&tbl);
    cnn_data_free(&train);
    cnn_ctx_destroy(&ctx);
    cnn_model_destroy(&m);
    free(js);
    free(out);
    free(err);

    /* Second run: the model comes from the cache and the numbers repeat. */
    const char *args2[40];
    n = 0;
    for (; short_args[n]; n++)
        args2[n] = short_args[n];
    args2[n++] = "--observers";
    args2[n++] = "minmax,histogram";
    args2[n++] = "--no-qat";
    args2[n++] = "--low-bits";
    args2[n++] = "0";
    args2[n++] = "--out";
    args2[n++] = out_dir;
    args2[n++] = "--json";
    args2[n++] = json;
    args2[n] = NULL;
    rc = run_demo(args2, &out, &err);
    if (rc != 0) {
        print_error("second run: exit %d\nstderr:\n%s\n", rc, err ? err : "");
        fail();
    }
    assert_non_null(strstr(out, "float model: loaded from the cache"));
    char *js2 = read_all(json);
    assert_non_null(js2);
    assert_true(json_get(js2, NULL, "float_top1") == f);
    assert_true(isnan(json_get(js2, NULL, "qat_top1")));
    assert_null(strstr(js2, "\"entropy\""));
    assert_non_null(strstr(js2, "\"low_bits\": null"));
    free(js2);
    free(out);
    free(err);
}

/* ---- bad inputs ------------------------------------------------------------------------ */

static void write_gz(const char *path, const void *data, size_t n)
{
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    if (n)
        assert_int_equal(gzwrite(g, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(g), Z_OK);
}

static void write_raw(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A dataset directory whose train images file is `bad` (gzip-compressed if gz) and whose
 * other three files are tiny valid IDX files. */
static void make_bad_dataset(const char *dir, const void *bad, size_t n, bool gz)
{
    mkdir(dir, 0755);
    char p[600];
    uint8_t img[16 + 784] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
    uint8_t lab[9] = {0, 0, 8, 1, 0, 0, 0, 1, 3};
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte.gz", dir);
    write_gz(p, img, sizeof img);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte.gz", dir);
    write_gz(p, lab, sizeof lab);
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte.gz", dir);
    write_gz(p, lab, sizeof lab);
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
    if (gz)
        write_gz(p, bad, n);
    else
        write_raw(p, bad, n);
}

static void test_missing_dataset(void **state)
{
    (void)state;
    const char *args[] = {"--data", "/nonexistent/fashion-mnist", "--out", "/tmp", NULL};
    expect_error(args, 1, "dataset-fashion-mnist");
}

static void test_corrupt_gzip(void **state)
{
    (void)state;
    char dir[512], out[512];
    snprintf(dir, sizeof dir, "%s/badgz", g_tmp);
    snprintf(out, sizeof out, "%s/o1", g_tmp);
    /* gzip magic, then garbage */
    const uint8_t junk[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6};
    make_bad_dataset(dir, junk, sizeof junk, false);
    const char *args[] = {"--data", dir, "--out", out, NULL};
    expect_error(args, 1, "train-images-idx3-ubyte.gz");
}

static void test_corrupt_idx(void **state)
{
    (void)state;
    char dir[512], out[512];
    snprintf(dir, sizeof dir, "%s/badidx", g_tmp);
    snprintf(out, sizeof out, "%s/o2", g_tmp);
    const uint8_t wrong_magic[16] = {0x12, 0x34, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28};
    make_bad_dataset(dir, wrong_magic, sizeof wrong_magic, true);
    const char *args[] = {"--data", dir, "--out", out, NULL};
    expect_error(args, 1, "train-images-idx3-ubyte.gz");
}

static void test_truncated_idx(void **state)
{
    (void)state;
    char dir[512], out[512];
    snprintf(dir, sizeof dir, "%s/truncidx", g_tmp);
    snprintf(out, sizeof out, "%s/o3", g_tmp);
    uint8_t t[16 + 100] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};   /* 10 images, 100 bytes */
    make_bad_dataset(dir, t, sizeof t, true);
    const char *args[] = {"--data", dir, "--out", out, NULL};
    expect_error(args, 1, "train-images-idx3-ubyte.gz");
}

/* A .safetensors model without `drop` (NULL: none) and with `reshape` given a wrong shape. */
static void write_model(const char *path, const char *drop, const char *reshape)
{
    cnn_model *m = NULL;
    assert_int_equal(cnn_model_create(3, &m), QCAL_OK);
    const char *names[CNN_NPARAMS];
    qcal_tensor t[CNN_NPARAMS];
    int n = 0;
    for (int i = 0; i < CNN_NPARAMS; i++) {
        if (drop && !strcmp(cnn_param_name(i), drop))
            continue;
        int64_t shape[4];
        int nd = cnn_param_shape(i, shape);
        if (reshape && !strcmp(cnn_param_name(i), reshape)) {   /* same numel, other shape */
            shape[1] = shape[0] * shape[1] / 2;
            shape[0] = 2;
        }
        names[n] = cnn_param_name(i);
        assert_int_equal(qcal_tensor_init(&t[n], m->param[i], nd, shape), QCAL_OK);
        n++;
    }
    assert_int_equal(qcal_safetensors_write_f32(path, n, names, t, 0, NULL), QCAL_OK);
    cnn_model_destroy(&m);
}

static void test_bad_safetensors(void **state)
{
    (void)state;
    if (!have_dataset())
        skip();
    char model[512], out[512];
    snprintf(out, sizeof out, "%s/o4", g_tmp);
    snprintf(model, sizeof model, "%s/missing.safetensors", g_tmp);
    write_model(model, "fc2.bias", NULL);
    const char *args[] = {"--weights", model, "--out", out, NULL};
    expect_error(args, 1, "'fc2.bias' is missing");
    snprintf(model, sizeof model, "%s/misshapen.safetensors", g_tmp);
    write_model(model, NULL, "fc1.weight");
    const char *args2[] = {"--weights", model, "--out", out, NULL};
    expect_error(args2, 1, "'fc1.weight' has shape [2, 200704], expected [128, 3136]");
    snprintf(model, sizeof model, "%s/notthere.safetensors", g_tmp);
    const char *args3[] = {"--weights", model, "--out", out, NULL};
    expect_error(args3, 1, "notthere.safetensors");
    snprintf(model, sizeof model, "%s/garbage.safetensors", g_tmp);
    write_raw(model, "\x10\0\0\0\0\0\0\0{not json}      ", 24);
    const char *args4[] = {"--weights", model, "--out", out, NULL};
    expect_error(args4, 1, "garbage.safetensors");
}

static void test_unwritable_out(void **state)
{
    (void)state;
    char file[512], out[600];
    snprintf(file, sizeof file, "%s/plainfile", g_tmp);
    write_raw(file, "x", 1);
    snprintf(out, sizeof out, "%s/sub", file);   /* a directory below a regular file */
    const char *args[] = {"--out", out, "--data", "/usr/share/datasets/fashion-mnist", NULL};
    if (!have_dataset())
        args[2] = NULL;
    expect_error(args, 1, "output directory");
    const char *args2[] = {"--out", file, NULL};
    if (have_dataset())
        expect_error(args2, 1, "not a directory");
}

static void test_bad_options(void **state)
{
    (void)state;
    const char *a1[] = {"--calib-images", "0", NULL};
    expect_error(a1, 2, "--calib-images '0'");
    const char *a2[] = {"--observers", "minmax,bogus", NULL};
    expect_error(a2, 2, "unknown observer 'bogus'");
    const char *a3[] = {"--frobnicate", "1", NULL};
    expect_error(a3, 2, "unknown option --frobnicate");
    const char *a4[] = {"--json", NULL};
    expect_error(a4, 2, "needs a value");
    const char *a5[] = {"--observers", "per_channel_minmax", NULL};
    expect_error(a5, 2, "per-channel");
    const char *a6[] = {"--low-bits", "1", NULL};
    expect_error(a6, 2, "--low-bits 1");
    const char *a7[] = {"--low-bits", "9", NULL};
    expect_error(a7, 2, "--low-bits '9'");
    const char *a8[] = {"--grid", "bogus", NULL};
    expect_error(a8, 2, "--grid 'bogus': expected lattice or first-batch");
    const char *a9[] = {"--calib-offset", "60000", NULL};
    expect_error(a9, 2, "--calib-offset '60000'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_missing_dataset),
        cmocka_unit_test(test_corrupt_gzip),
        cmocka_unit_test(test_corrupt_idx),
        cmocka_unit_test(test_truncated_idx),
        cmocka_unit_test(test_unwritable_out),
        cmocka_unit_test(test_bad_safetensors),
        cmocka_unit_test(test_short_run),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
