/* unit.cli: runs the qcal binary ($QCAL_BIN) and checks exit codes, the one-line error
 * report, the observe JSON against the library, quantize/dequantize against the library
 * and that a failed run leaves an existing output intact. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/npy.h"
#include "qcal/qcal.h"
#include "qcal/quantize.h"

#include "testutil.h"

static const char *qcal_bin;
static char data_dir[4096];
static char tmp_dir[4096];

typedef struct result {
    int code;
    char out[1 << 16];
    char err[1 << 16];
} result;

static result R; /* last run */

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

/* The run failed with `code`, printed nothing on stdout (unless allowed) and exactly one
 * line "qcal: ..." on stderr containing `needle`. */
static void expect_fail(int code, const char *needle)
{
    if (R.code != code)
        fail_msg("exit code %d, expected %d; stderr: %s", R.code, code, R.err);
    tu_expect_one_line(R.err, "qcal: ", needle);
}

static void expect_ok(void)
{
    if (R.code != 0)
        fail_msg("exit code %d; stderr: %s", R.code, R.err);
    assert_string_equal(R.err, "");
}

/* Reads the JSON array after "key": into out (null -> NaN); returns the count. */
static int json_floats(const char *json, const char *key, double *out, int cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": [", key);
    const char *p = strstr(json, pat);
    if (!p)
        fail_msg("no %s array in %s", key, json);
    p += strlen(pat);
    int n = 0;
    while (*p && *p != ']') {
        if (!strncmp(p, "null", 4)) {
            out[n++] = NAN;
            p += 4;
        } else {
            char *end;
            double v = strtod(p, &end);
            if (end == p)
                fail_msg("bad number in %s: %s", key, p);
            out[n++] = v;
            p = end;
        }
        if (n > cap)
            fail_msg("too many values for %s", key);
        if (*p == ',')
            p++;
        while (*p == ' ')
            p++;
    }
    return n;
}

static long long json_int(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p)
        fail_msg("no %s in %s", key, json);
    return strtoll(p + strlen(pat), NULL, 10);
}

static void write_f32(const char *path, int32_t ndim, const int64_t *shape, const float *x)
{
    if (qcal_npy_write(path, QCAL_NPY_F32, ndim, shape, x) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
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
    snprintf(data_dir, sizeof data_dir, "%s/npy", d ? d : "tests/data");
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal_test_cli.XXXXXX");
    if (!mkdtemp(tmp_dir))
        return -1;
    /* Malformed files, each a variation of a valid 2x3 float32 file. */
    static unsigned char buf[256];
    const char *hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    size_t hl = strlen(hdr);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    size_t hlen = 128 - 10;
    buf[8] = (unsigned char)hlen;
    buf[9] = 0;
    memset(buf + 10, ' ', hlen);
    memcpy(buf + 10, hdr, hl);
    buf[127] = '\n';
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    memcpy(buf + 128, x, sizeof x);
    tu_write_bytes(TMP("good.npy"), buf, 128 + sizeof x);
    tu_write_bytes(TMP("truncated_data.npy"), buf, 128 + 10);
    tu_write_bytes(TMP("truncated_header.npy"), buf, 40);
    static unsigned char big[256];
    memcpy(big, buf, 128 + sizeof x);
    memset(big + 128 + sizeof x, 0xee, 8);
    tu_write_bytes(TMP("trailing.npy"), big, 128 + sizeof x + 8);
    memcpy(big, buf, 128);
    big[0] = 'P';
    tu_write_bytes(TMP("bad_magic.npy"), big, 128 + sizeof x);
    memcpy(big, buf, 128);
    memcpy(strstr((char *)big + 10, "(2, 3)"), "(9, 3)", 6); /* lying: 27 elements, 6 present */
    tu_write_bytes(TMP("lying_shape.npy"), big, 128 + sizeof x);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

static void test_help_version(void **state)
{
    (void)state;
    run("--help", NULL);
    expect_ok();
    for (const char *w = "observe\0quantize\0dequantize\0exit codes\0  4  \0"; *w; w += strlen(w) + 1)
        if (!strstr(R.out, w))
            fail_msg("qcal --help lacks '%s'", w);
    run("--version", NULL);
    expect_ok();
    char want[64];
    snprintf(want, sizeof want, "qcal %s\n", qcal_version());
    assert_string_equal(R.out, want);
    static const char *subs[] = { "observe", "quantize", "dequantize" };
    for (int i = 0; i < 3; i++) {
        run(subs[i], "--help", NULL);
        expect_ok();
        char usage[64];
        snprintf(usage, sizeof usage, "usage: qcal %s", subs[i]);
        assert_non_null(strstr(R.out, usage));
        run("help", subs[i], NULL);
        expect_ok();
        assert_non_null(strstr(R.out, usage));
    }
    run(NULL);
    expect_fail(2, "no subcommand");
    run("frobnicate", NULL);
    expect_fail(2, "unknown subcommand 'frobnicate'");
    run("--frobnicate", NULL);
    expect_fail(2, "unknown option");
}

static void test_malformed_inputs(void **state)
{
    (void)state;
    static const struct { const char *file; int tmp; const char *needle; } cases[] = {
        { "bad_magic.npy", 1, "bad magic" },
        { "truncated_header.npy", 1, "truncated header" },
        { "truncated_data.npy", 1, "truncated data" },
        { "lying_shape.npy", 1, "truncated data" },
        { "trailing.npy", 1, "trailing bytes" },
        { "fortran_2x3.npy", 0, "Fortran" },
        { "big_endian.npy", 0, "big-endian" },
        { "complex.npy", 0, "'<c8' is not supported" },
        { "structured.npy", 0, "structured" },
        { "missing.npy", 1, "No such file" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = cases[i].tmp ? TMP(cases[i].file) : DATA(cases[i].file);
        run("observe", p, NULL);
        expect_fail(3, cases[i].needle);
        assert_non_null(strstr(R.err, cases[i].file));
        assert_string_equal(R.out, "");
        run("quantize", "--scale", "0.5", p, "-o", TMP("q_out.npy"), NULL);
        expect_fail(3, cases[i].needle);
        run("dequantize", "--scale", "0.5", p, "-o", TMP("q_out.npy"), NULL);
        expect_fail(3, cases[i].needle);
    }
    assert_int_equal(access(TMP("q_out.npy"), F_OK), -1);
    /* A valid file observes fine (the malformed ones differ from it in one place). */
    run("observe", TMP("good.npy"), NULL);
    expect_ok();
    /* Integers are not observable data; an empty array has nothing to observe. */
    run("observe", DATA("u8_2x3.npy"), NULL);
    expect_fail(3, "uint8");
    run("observe", DATA("empty_f32.npy"), NULL);
    expect_fail(3, "empty");
}

static void test_impossible_options(void **state)
{
    (void)state;
    char f[8192]; /* TMP()'s buffers rotate */
    snprintf(f, sizeof f, "%s", TMP("good.npy"));
    static const struct { const char *a[6]; const char *needle; } cases[] = {
        { { "--quant-min", "10", "--quant-max", "5" }, "greater than" },
        { { "--quant-min", "0" }, "go together" },
        { { "--observer", "histogram", "--bins", "0" }, "bins 0" },
        { { "--observer", "per_channel_minmax", "--axis", "9" }, "axis: 9" },
        { { "--observer", "per_channel_minmax", "--axis", "2" }, "out of range for" },
        { { "--observer", "per_channel_minmax", "--axis", "-3" }, "out of range for" },
        { { "--observer", "moving_average_minmax", "--averaging-constant", "0" }, "(0, 1]" },
        { { "--observer", "moving_average_minmax", "--averaging-constant", "1.5" }, "(0, 1]" },
        { { "--observer", "nope" }, "unknown observer 'nope'" },
        { { "--observer", "minmax", "--qscheme", "per_channel_affine" }, "per-tensor" },
        { { "--qscheme", "per_tensor_wobbly" }, "unknown qscheme" },
        { { "--dtype", "quint9" }, "unknown dtype" },
        { { "--eps", "nan" }, "not a finite number" },
        { { "--eps", "1e999" }, "not a finite number" },
        { { "--eps", "1e300" }, "float32 range" },
        { { "--eps", "0" }, "positive" },
        { { "--bins", "12abc" }, "not an integer" },
        { { "--bins", "" }, "not an integer" },
        { { "--bins", " 12" }, "not an integer" },
        { { "--bins", "99999999999999999999" }, "outside" },
        { { "--observer", "percentile", "--percentile", "101" }, "percentile" },
        { { "--percentile-mode", "both" }, "two_tails" },
        { { "--frobnicate" }, "unknown option '--frobnicate'" },
        { { "--strict=yes" }, "takes no value" },
        { { "--bins" }, "needs a value" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i].a;
        /* The file goes first so that a trailing option lacks its value. */
        run("observe", f, a[0], a[1], a[2], a[3], a[4], NULL);
        if (R.code != 2 || !strstr(R.err, cases[i].needle))
            fail_msg("case %zu (%s %s %s %s): exit %d, stderr %s", i, a[0], a[1] ? a[1] : "",
                     a[2] ? a[2] : "", a[3] ? a[3] : "", R.code, R.err);
        expect_fail(2, cases[i].needle);
        assert_string_equal(R.out, "");
    }
    /* --name=value works like --name value. */
    run("observe", "--observer=histogram", "--bins=64", f, NULL);
    expect_ok();
    run("observe", NULL);
    expect_fail(2, "no input file");
    /* quantize / dequantize option errors. */
    run("quantize", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "missing --scale");
    run("quantize", "--scale", "0.1", f, NULL);
    expect_fail(2, "no output");
    run("quantize", "--scale", "0", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "scale");
    run("quantize", "--scale", "-1", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "scale");
    run("quantize", "--scale", "inf", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "not a finite number");
    run("quantize", "--scale", "0.1", "--zero-point", "300", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "300");
    run("quantize", "--scale", "0.1", "--zero-point", "1.5", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "not an integer");
    run("quantize", "--scale", "0.1", "--axis", "0", f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "exclude");
    run("quantize", "--axis", "0", "--scales", f, f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "--zero-points");
    run("quantize", "--scale", "0.1", f, f, "-o", TMP("x.npy"), NULL);
    expect_fail(2, "more than one input");
    assert_int_equal(access(TMP("x.npy"), F_OK), -1);
}

/* Runs the library on the same data and compares the JSON numbers exactly. */
static void check_observe_json(const qcal_observer_config *cfg, const char *const *files,
                               int nfiles)
{
    qcal_observer *obs = NULL;
    assert_int_equal(qcal_observer_create(cfg, &obs), QCAL_OK);
    for (int i = 0; i < nfiles; i++) {
        qcal_npy_array a;
        assert_int_equal(qcal_npy_read_f32(files[i], &a), QCAL_OK);
        qcal_tensor t;
        assert_int_equal(qcal_npy_as_tensor(&a, &t), QCAL_OK);
        assert_int_equal(qcal_observer_update(obs, &t), QCAL_OK);
        qcal_npy_array_free(&a);
    }
    float mn[16], mx[16], sc[16];
    int32_t zp[16];
    int64_t n, nq;
    assert_true(qcal_observer_qrange(obs, 16, mn, mx, &n) >= 0);
    assert_true(tu_observer_qparams(obs, 16, sc, zp, NULL, &nq) >= 0);
    double jmn[16], jmx[16], jsc[16], jzp[16];
    assert_int_equal(json_floats(R.out, "min", jmn, 16), n);
    assert_int_equal(json_floats(R.out, "max", jmx, 16), n);
    assert_int_equal(json_floats(R.out, "scale", jsc, 16), nq);
    assert_int_equal(json_floats(R.out, "zero_point", jzp, 16), nq);
    for (int64_t i = 0; i < n; i++)
        if ((float)jmn[i] != mn[i] || (float)jmx[i] != mx[i])
            fail_msg("channel %lld: JSON range [%.9g, %.9g], library [%.9g, %.9g]",
                     (long long)i, jmn[i], jmx[i], (double)mn[i], (double)mx[i]);
    for (int64_t i = 0; i < nq; i++)
        if ((float)jsc[i] != sc[i] || jzp[i] != zp[i])
            fail_msg("channel %lld: JSON qparams (%.9g, %g), library (%.9g, %d)", (long long)i,
                     jsc[i], jzp[i], (double)sc[i], (int)zp[i]);
    assert_int_equal(json_int(R.out, "batches"), nfiles);
    qcal_observer_destroy(&obs);
}

static void test_observe_matches_library(void **state)
{
    (void)state;
    char f1[8192], f2[8192]; /* DATA()'s buffers rotate */
    snprintf(f1, sizeof f1, "%s", DATA("f32_3x4.npy"));
    snprintf(f2, sizeof f2, "%s", DATA("f32_1d.npy"));
    qcal_observer_config cfg;

    run("observe", f1, f2, NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "\"observer\": \"minmax\", \"dtype\": \"quint8\", "
                                  "\"qscheme\": \"per_tensor_affine\", \"quant_min\": 0, "
                                  "\"quant_max\": 255, \"min\""));
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    check_observe_json(&cfg, (const char *[]){ f1, f2 }, 2);
    double v[4];
    assert_int_equal(json_floats(R.out, "min", v, 4), 1);
    assert_true(v[0] == -1.5);

    run("observe", "--observer", "minmax", "--dtype", "qint8", "--qscheme",
        "per_tensor_symmetric", "--reduce-range", f1, NULL);
    expect_ok();
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.dtype = QCAL_QINT8;
    cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    cfg.q.reduce_range = true;
    check_observe_json(&cfg, (const char *[]){ f1 }, 1);
    assert_int_equal(json_int(R.out, "quant_min"), -64);
    assert_int_equal(json_int(R.out, "quant_max"), 63);

    run("observe", "--observer", "per_channel_minmax", "--axis=-1", f1, f1, NULL);
    expect_ok();
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    cfg.axis = -1;
    check_observe_json(&cfg, (const char *[]){ f1, f1 }, 2);
    assert_int_equal(json_int(R.out, "axis"), -1);

    run("observe", "--observer", "minmax", "--quant-min", "0", "--quant-max", "15", f1, NULL);
    expect_ok();
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.custom_range = true;
    cfg.q.quant_min = 0;
    cfg.q.quant_max = 15;
    check_observe_json(&cfg, (const char *[]){ f1 }, 1);
    assert_int_equal(json_int(R.out, "quant_max"), 15);

    /* The demo's real tensor through the histogram observer. */
    char demo[8192];
    const char *root = getenv("QCAL_SOURCE_ROOT");
    snprintf(demo, sizeof demo, "%s/examples/data/fmnist_test_batch.npy", root ? root : ".");
    run("observe", "--observer", "histogram", demo, NULL);
    expect_ok();
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    check_observe_json(&cfg, (const char *[]){ demo }, 1);
}

static void test_observe_nonfinite(void **state)
{
    (void)state;
    const float x[5] = { 1.0f, NAN, -2.0f, INFINITY, 0.5f };
    write_f32(TMP("nan.npy"), 1, (int64_t[]){ 5 }, x);
    run("observe", TMP("nan.npy"), NULL);
    expect_ok();
    assert_int_equal(json_int(R.out, "nonfinite"), 2);
    double v[2];
    json_floats(R.out, "min", v, 2);
    assert_true(v[0] == -2.0);
    json_floats(R.out, "max", v, 2);
    assert_true(v[0] == 1.0);

    run("observe", "--strict", TMP("nan.npy"), NULL);
    expect_fail(1, "nan.npy");

    /* No finite value at all: JSON with the default qparams, exit 1, one line. */
    const float y[3] = { NAN, NAN, -INFINITY };
    write_f32(TMP("allnan.npy"), 1, (int64_t[]){ 3 }, y);
    run("observe", TMP("allnan.npy"), NULL);
    expect_fail(1, "no finite value");
    assert_non_null(strstr(R.out, "\"min\": [null], \"max\": [null], \"scale\": [1], "
                                  "\"zero_point\": [0], \"nonfinite\": 3, \"batches\": 1, "
                                  "\"digest\": \""));
}

static void check_npy_equal(const char *path, qcal_npy_dtype dtype, const void *want,
                            int64_t n)
{
    qcal_npy_array a;
    if (qcal_npy_read(path, &a) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
    assert_int_equal(a.dtype, dtype);
    assert_int_equal(a.numel, n);
    size_t es = qcal_npy_dtype_size(dtype);
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)a.data + i * es, (const char *)want + i * es, es) != 0)
            fail_msg("%s: element %lld differs from the library's result", path, (long long)i);
    qcal_npy_array_free(&a);
}

static void test_quantize_roundtrip(void **state)
{
    (void)state;
    /* Input: 3x4 values -1.5 .. 1.25 step 0.25, and 1.3 / NaN edge cases in a second file. */
    char in[8192];
    snprintf(in, sizeof in, "%s", DATA("f32_3x4.npy")); /* DATA()'s buffers rotate */
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read_f32(in, &a), QCAL_OK);
    qcal_tensor t;
    assert_int_equal(qcal_npy_as_tensor(&a, &t), QCAL_OK);
    static const struct { const char *dt; qcal_dtype d; qcal_npy_dtype nd; const char *zp; int32_t z; } dts[] = {
        { "quint8", QCAL_QUINT8, QCAL_NPY_U8, "6", 6 },
        { "qint8", QCAL_QINT8, QCAL_NPY_I8, "-3", -3 },
        { "qint32", QCAL_QINT32, QCAL_NPY_I32, "100000", 100000 },
    };
    for (int k = 0; k < 3; k++) {
        char want[12 * 4];
        assert_int_equal(qcal_quantize(&t, tu_qp(dts[k].d, 0.25f, dts[k].z), want), QCAL_OK);
        run("quantize", "--scale", "0.25", "--zero-point", dts[k].zp, "--dtype", dts[k].dt, in,
            "--output", TMP("q.npy"), NULL);
        expect_ok();
        check_npy_equal(TMP("q.npy"), dts[k].nd, want, 12);
        /* The grid values come back exactly. */
        run("dequantize", "--scale=0.25", "--zero-point", dts[k].zp, TMP("q.npy"), "-o",
            TMP("d.npy"), NULL);
        expect_ok();
        check_npy_equal(TMP("d.npy"), QCAL_NPY_F32, a.data, 12);
        run("dequantize", "--scale=0.25", "--dtype", dts[(k + 1) % 3].dt, TMP("q.npy"), "-o",
            TMP("d2.npy"), NULL);
        expect_fail(3, "not --dtype");
    }
    run("dequantize", "--scale", "1", in, "-o", TMP("d3.npy"), NULL);
    expect_fail(3, "float32");

    /* Per channel along axis 1 (4 channels): int64 zero-points as PyTorch stores them. */
    const float scales[4] = { 0.25f, 0.5f, 0.125f, 1.0f };
    const int64_t zps64[4] = { 6, 3, 12, 2 };
    const int32_t zps[4] = { 6, 3, 12, 2 };
    write_f32(TMP("scales.npy"), 1, (int64_t[]){ 4 }, scales);
    assert_int_equal(qcal_npy_write(TMP("zps.npy"), QCAL_NPY_I64, 1, (int64_t[]){ 4 }, zps64),
                     QCAL_OK);
    uint8_t want[12];
    assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QUINT8, 1, 4, scales, zps), want), QCAL_OK);
    run("quantize", "--axis", "1", "--scales", TMP("scales.npy"), "--zero-points",
        TMP("zps.npy"), in, "-o", TMP("qc.npy"), NULL);
    expect_ok();
    check_npy_equal(TMP("qc.npy"), QCAL_NPY_U8, want, 12);
    float back[12];
    qcal_tensor_mut bt;
    assert_int_equal(qcal_tensor_mut_init(&bt, back, 2, (int64_t[]){ 3, 4 }), QCAL_OK);
    assert_int_equal(qcal_dequantize(want, tu_qpc(QCAL_QUINT8, 1, 4, scales, zps), &bt),
                     QCAL_OK);
    run("dequantize", "--axis", "-1", "--scales", TMP("scales.npy"), "--zero-points",
        TMP("zps.npy"), TMP("qc.npy"), "-o", TMP("dc.npy"), NULL);
    expect_ok();
    check_npy_equal(TMP("dc.npy"), QCAL_NPY_F32, back, 12);
    /* Wrong channel count and axis. */
    run("quantize", "--axis", "0", "--scales", TMP("scales.npy"), "--zero-points",
        TMP("zps.npy"), in, "-o", TMP("qc2.npy"), NULL);
    expect_fail(3, "3 scales");
    run("quantize", "--axis", "2", "--scales", TMP("scales.npy"), "--zero-points",
        TMP("zps.npy"), in, "-o", TMP("qc2.npy"), NULL);
    expect_fail(2, "out of range");
    run("quantize", "--axis", "1", "--scales", TMP("scales.npy"), "--zero-points",
        TMP("scales.npy"), in, "-o", TMP("qc2.npy"), NULL);
    expect_fail(3, "integer zero-points");
    assert_int_equal(access(TMP("qc2.npy"), F_OK), -1);
    qcal_npy_array_free(&a);
}

static void test_failed_run_keeps_output(void **state)
{
    (void)state;
    char out[8192], in[8192]; /* TMP()/DATA() buffers rotate */
    snprintf(out, sizeof out, "%s", TMP("keep.npy"));
    snprintf(in, sizeof in, "%s", DATA("f32_3x4.npy"));
    const char sentinel[] = "previous contents, not an npy";
    tu_write_bytes(out, sentinel, sizeof sentinel);
    run("quantize", "--scale", "0", in, "-o", out, NULL);
    expect_fail(2, NULL);
    run("quantize", "--scale", "0.1", TMP("truncated_data.npy"), "-o", out, NULL);
    expect_fail(3, NULL);
    run("quantize", "--scale", "0.1", "--zero-point", "-1", in, "-o", out, NULL);
    expect_fail(2, NULL);
    run("dequantize", "--scale", "0.1", in, "-o", out, NULL);
    expect_fail(3, NULL);
    size_t n;
    char *now = tu_read_file(out, &n);
    assert_int_equal(n, sizeof sentinel);
    assert_memory_equal(now, sentinel, n);
    free(now);
    /* An unwritable destination is an output error (exit 4) and leaves nothing behind. */
    run("quantize", "--scale", "0.1", in, "-o", TMP("no_such_dir/out.npy"), NULL);
    expect_fail(4, "no_such_dir/out.npy");
    assert_int_equal(tu_count_entries(tmp_dir, ".tmp."), 0);
    /* A successful run replaces the file. */
    run("quantize", "--scale", "0.1", in, "-o", out, NULL);
    expect_ok();
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(out, &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_U8);
    qcal_npy_array_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_malformed_inputs),
        cmocka_unit_test(test_impossible_options),
        cmocka_unit_test(test_observe_matches_library),
        cmocka_unit_test(test_observe_nonfinite),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_failed_run_keeps_output),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
