/* unit.fp8_cli: the CLI's FP8 dtypes end to end through QCAL_BIN: quantize writes the codes
 * as a uint8 .npy equal to the library's, dequantize reads them back, fakequant's output and
 * gradient, observe / calibrate / compare-weights / evaluate carry the dtype, the table
 * formats that hold int8 scales refuse FP8, and errors are one line with the documented
 * exit codes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/fakequant.h"
#include "qcal/npy.h"
#include "qcal/quantize.h"

#include "testutil.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qcal_fp8_cli_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(dir);
    return 0;
}

static const char *p(const char *name)
{
    return tu_path(dir, name);
}

/* Runs `qcal <args>`; stdout into out, stderr into err; returns the exit code. */
static int run(const char *args, char *out, size_t out_cap, char *err, size_t err_cap)
{
    const char *bin = getenv("QCAL_BIN");
    assert_non_null(bin);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >'%s' 2>'%s'", dir, bin, args, p("stdout"),
             p("stderr"));
    int rc = system(cmd);
    assert_true(WIFEXITED(rc));
    tu_slurp(p("stdout"), out, out_cap);
    tu_slurp(p("stderr"), err, err_cap);
    return WEXITSTATUS(rc);
}

#define N 400
static float x[N], gy[N];

static void make_inputs(void)
{
    uint32_t s = 11;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (-1.0f + 2.0f * (float)(s >> 8) / 16777216.0f) * (float)(1 << (i % 12));
        s = s * 1664525u + 1013904223u;
        gy[i] = -1.0f + 2.0f * (float)(s >> 8) / 16777216.0f;
    }
    x[1] = NAN;
    x[2] = -INFINITY;
    x[3] = -0.0f;
    x[4] = 464.0f * 0.5f;   /* the E4M3FN tie above 448 at scale 0.5 */
    int64_t shape[2] = { 20, 20 };
    assert_int_equal(qcal_npy_write(p("x.npy"), QCAL_NPY_F32, 2, shape, x), QCAL_OK);
    assert_int_equal(qcal_npy_write(p("g.npy"), QCAL_NPY_F32, 2, shape, gy), QCAL_OK);
}

static void *read_npy(const char *name, qcal_npy_dtype want, int64_t n)
{
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(p(name), &a), QCAL_OK);
    assert_int_equal(a.dtype, want);
    assert_int_equal(a.numel, n);
    return a.data;   /* qcal_free */
}

static void test_quantize_dequantize(void **state)
{
    (void)state;
    make_inputs();
    char out[4096], err[4096];
    for (int f = 0; f < 2; f++) {
        const char *name = f ? "float8_e5m2" : "float8_e4m3fn";
        qcal_dtype dt = f ? QCAL_FLOAT8_E5M2 : QCAL_FLOAT8_E4M3FN;
        char args[512];
        snprintf(args, sizeof args, "quantize --scale 0.5 --dtype %s x.npy -o c.npy", name);
        assert_int_equal(run(args, out, sizeof out, err, sizeof err), 0);
        uint8_t *c = read_npy("c.npy", QCAL_NPY_U8, N), want[N];
        assert_int_equal(qcal_quantize(tu_vec(x, N), tu_qp(dt, 0.5f, 0), want), QCAL_OK);
        assert_memory_equal(c, want, N);
        assert_int_equal(c[1], 0x7F);
        assert_int_equal(c[2], f ? 0xFB : 0xFE);
        assert_int_equal(c[3], 0x80);
        snprintf(args, sizeof args, "dequantize --scale 0.5 --dtype %s c.npy -o d.npy", name);
        assert_int_equal(run(args, out, sizeof out, err, sizeof err), 0);
        float *d = read_npy("d.npy", QCAL_NPY_F32, N), wd[N];
        assert_int_equal(qcal_dequantize(c, tu_qp(dt, 0.5f, 0), tu_out(wd, N)), QCAL_OK);
        assert_memory_equal(d, wd, sizeof wd);
        qcal_free(c);
        qcal_free(d);
    }
    /* per channel along axis 1: scales file, zero-points all 0 */
    float sc[20];
    int32_t zp[20] = { 0 };
    for (int i = 0; i < 20; i++)
        sc[i] = 0.01f * (float)(i + 1);
    int64_t c20 = 20;
    assert_int_equal(qcal_npy_write(p("s.npy"), QCAL_NPY_F32, 1, &c20, sc), QCAL_OK);
    assert_int_equal(qcal_npy_write(p("z.npy"), QCAL_NPY_I32, 1, &c20, zp), QCAL_OK);
    assert_int_equal(run("quantize --axis 1 --scales s.npy --zero-points z.npy --dtype "
                         "float8_e4m3fn x.npy -o cc.npy", out, sizeof out, err, sizeof err), 0);
    uint8_t *cc = read_npy("cc.npy", QCAL_NPY_U8, N), wc[N];
    qcal_tensor t;
    int64_t shape[2] = { 20, 20 };
    qcal_tensor_init(&t, x, 2, shape);
    qcal_qparams qp;
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_FLOAT8_E4M3FN, 1, 20, sc, zp), QCAL_OK);
    assert_int_equal(qcal_quantize(&t, &qp, wc), QCAL_OK);
    assert_memory_equal(cc, wc, N);
    qcal_free(cc);
    /* a zero-point: usage error, one line */
    assert_int_equal(run("quantize --scale 0.5 --zero-point 3 --dtype float8_e5m2 x.npy -o e.npy",
                         out, sizeof out, err, sizeof err), 2);
    tu_expect_one_line(err, "qcal: quantize: ", "zero-point 3 must be 0");
    assert_int_equal(run("quantize --scale 0.5 --dtype float8 x.npy -o e.npy", out, sizeof out,
                         err, sizeof err), 2);
    tu_expect_one_line(err, "qcal: quantize: ", "float8_e4m3fn or float8_e5m2");
    /* a uint8 file without an FP8 --dtype is quint8 */
    assert_int_equal(run("dequantize --scale 0.5 c.npy -o q8.npy", out, sizeof out, err,
                         sizeof err), 0);
}

static void test_fakequant(void **state)
{
    (void)state;
    make_inputs();
    char out[4096], err[4096];
    assert_int_equal(run("fakequant --scale 0.5 --dtype float8_e4m3fn x.npy -o y.npy --grad g.npy "
                         "--grad-out gx.npy", out, sizeof out, err, sizeof err), 0);
    float *y = read_npy("y.npy", QCAL_NPY_F32, N), *gx = read_npy("gx.npy", QCAL_NPY_F32, N);
    float wy[N], wg[N];
    assert_int_equal(qcal_fakequant_fused(tu_vec(x, N), tu_vec(gy, N),
                                          tu_qp(QCAL_FLOAT8_E4M3FN, 0.5f, 0), tu_out(wy, N),
                                          tu_out(wg, N)),
                     QCAL_OK);
    assert_memory_equal(y, wy, sizeof wy);
    assert_memory_equal(gx, wg, sizeof wg);
    assert_true(y[4] == 224.0f && gx[4] == gy[4]);   /* 464 ties to 448: not saturated */
    assert_true(gx[2] == 0.0f || gx[2] == -0.0f);     /* -Inf saturated: no gradient */
    assert_true(isnan(y[1]));
    qcal_free(y);
    qcal_free(gx);
    assert_int_equal(run("fakequant --scale 0.5 --dtype float8_e4m3fn --quant-min 0 --quant-max 9 "
                         "x.npy -o y.npy", out, sizeof out, err, sizeof err), 2);
    tu_expect_one_line(err, "qcal: fakequant: ", "takes no --quant-min/--quant-max");
    assert_int_equal(run("fakequant --scale 0.5 --dtype qint8 x.npy -o y.npy", out, sizeof out,
                         err, sizeof err), 2);
    tu_expect_one_line(err, "qcal: fakequant: ", "is not float8_e4m3fn or float8_e5m2");
}

static void test_observe_calibrate(void **state)
{
    (void)state;
    make_inputs();
    char out[8192], err[4096];
    assert_int_equal(run("observe --dtype float8_e4m3fn x.npy", out, sizeof out, err, sizeof err),
                     0);
    assert_non_null(strstr(out, "\"dtype\": \"float8_e4m3fn\", \"qscheme\": "
                                "\"per_tensor_symmetric\", \"quant_min\": -448, \"quant_max\": 448"));
    float amax = 0.0f;
    for (int i = 0; i < N; i++)
        if (isfinite(x[i]))
            amax = fmaxf(amax, fabsf(x[i]));
    char want[64];
    snprintf(want, sizeof want, "\"scale\": [%.9g]", (double)(amax / 448.0f));
    assert_non_null(strstr(out, want));
    /* a dump directory of two activations */
    assert_int_equal(mkdir(p("dump"), 0755), 0);
    int64_t shape[2] = { 20, 20 };
    assert_int_equal(qcal_npy_write(p("dump/a.npy"), QCAL_NPY_F32, 2, shape, gy), QCAL_OK);
    assert_int_equal(qcal_npy_write(p("dump/b.npy"), QCAL_NPY_F32, 2, shape, gy), QCAL_OK);
    assert_int_equal(run("calibrate dump --observer minmax --dtype float8_e5m2 -q -o t.json", out,
                         sizeof out, err, sizeof err), 0);
    size_t len;
    char *tj = tu_read_file(p("t.json"), &len);
    assert_non_null(strstr(tj, "\"dtype\": \"float8_e5m2\", \"qscheme\": \"per_tensor_symmetric\""));
    free(tj);
    assert_int_equal(run("convert t.json --format json -o t2.json", out, sizeof out, err,
                         sizeof err), 0);
    static const char *const formats[3] = { "ncnn", "tensorrt", "onnxruntime" };
    for (int k = 0; k < 3; k++) {
        char args[256];
        snprintf(args, sizeof args, "calibrate dump --dtype float8_e4m3fn -q --format %s -o out_%s",
                 formats[k], formats[k]);
        assert_int_equal(run(args, out, sizeof out, err, sizeof err), 1);
        char needle[128];
        snprintf(needle, sizeof needle, "the %s format cannot carry FP8", formats[k]);
        tu_expect_one_line(err, "qcal: calibrate: ", needle);
        char outp[64];
        snprintf(outp, sizeof outp, "out_%s", formats[k]);
        /* nothing written (onnxruntime's output directory may exist, empty) */
        if (access(p(outp), F_OK) == 0)
            assert_int_equal(tu_count_entries(p(outp), NULL), 0);
    }
}

static void test_compare_evaluate(void **state)
{
    (void)state;
    make_inputs();
    char out[16384], err[4096];
    assert_int_equal(run("compare-weights --dtype float8_e4m3fn --format json x.npy", out,
                         sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, "\"dtype\": \"float8_e4m3fn\", \"qscheme\": \"per_channel_symmetric\""));
    assert_int_equal(mkdir(p("dump2"), 0755), 0);
    int64_t shape[2] = { 20, 20 };
    assert_int_equal(qcal_npy_write(p("dump2/a.npy"), QCAL_NPY_F32, 2, shape, gy), QCAL_OK);
    assert_int_equal(run("evaluate dump2 --dtype float8_e4m3fn --observers minmax --format json -q",
                         out, sizeof out, err, sizeof err), 0);
    assert_non_null(strstr(out, "\"quant_min\": -448, \"quant_max\": 448"));
    assert_non_null(strstr(out, "\"dtype\": \"float8_e4m3fn\""));
    /* SQNR of the minmax candidate = the SQNR of the FP8 fake-quant with amax / 448 */
    float amax = 0.0f, y[N];
    for (int i = 0; i < N; i++)
        amax = fmaxf(amax, fabsf(gy[i]));
    assert_int_equal(qcal_fakequant_forward(tu_vec(gy, N),
                                            tu_qp(QCAL_FLOAT8_E4M3FN, amax / 448.0f, 0),
                                            tu_out(y, N), NULL),
                     QCAL_OK);
    double num = 0, den = 0;
    for (int i = 0; i < N; i++) {
        num += (double)gy[i] * gy[i];
        den += ((double)gy[i] - y[i]) * ((double)gy[i] - y[i]);
    }
    char want[64];
    snprintf(want, sizeof want, "\"sqnr_db\": %.4f", 10 * log10(num / den));
    assert_non_null(strstr(out, want));
    assert_int_equal(run("evaluate dump2 --dtype qint8 -q", out, sizeof out, err, sizeof err), 2);
    tu_expect_one_line(err, "qcal: evaluate: ", "is not float8_e4m3fn or float8_e5m2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_quantize_dequantize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fakequant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_observe_calibrate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compare_evaluate, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
