/* unit.fakequant_cli: `qcal fakequant` end to end through QCAL_BIN: outputs equal the
 * library's (which unit.fakequant checks against PyTorch), the learnable JSON, and one-line
 * errors with the documented exit codes. */
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

#include "qcal/fakequant.h"
#include "qcal/npy.h"

#include "testutil.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/qcal_fq_cli_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    return 0;
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

/* Runs `qcal fakequant <args>`; stdout into *out (may be NULL), stderr into *err; returns
 * the exit code. */
static int run(const char *args, char *out, size_t out_cap, char *err, size_t err_cap)
{
    const char *bin = getenv("QCAL_BIN");
    assert_non_null(bin);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' fakequant %s >'%s' 2>'%s'", bin, args, p("stdout"),
             p("stderr"));
    int rc = system(cmd);
    assert_true(WIFEXITED(rc));
    if (out)
        tu_slurp(p("stdout"), out, out_cap);
    if (err)
        tu_slurp(p("stderr"), err, err_cap);
    return WEXITSTATUS(rc);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void read_f32(const char *path, float *dst, int64_t n)
{
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(path, &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_F32);
    assert_int_equal(a.numel, n);
    memcpy(dst, a.data, (size_t)n * 4);
    qcal_npy_array_free(&a);
}

#define N 300

static float x[N], gy[N];
static const int64_t shape[2] = { 20, 15 };

static void make_inputs(void)
{
    uint32_t s = 7;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = -3.0f + 6.0f * (float)(s >> 8) / 16777216.0f;
        s = s * 1664525u + 1013904223u;
        gy[i] = -1.0f + 2.0f * (float)(s >> 8) / 16777216.0f;
    }
    x[3] = NAN;
    x[4] = INFINITY;
    x[5] = 0.5f * 0.02f;   /* a tie */
    assert_int_equal(qcal_npy_write(p("x.npy"), QCAL_NPY_F32, 2, shape, x), QCAL_OK);
    assert_int_equal(qcal_npy_write(p("g.npy"), QCAL_NPY_F32, 2, shape, gy), QCAL_OK);
}

static void test_per_tensor(void **state)
{
    (void)state;
    make_inputs();
    char args[1024], err[1024];
    snprintf(args, sizeof args, "--scale 0.02 --zero-point 10 --quant-min 0 --quant-max 127 "
             "'%s' -o '%s' --grad '%s' --grad-out '%s'", p("x.npy"), p("y.npy"), p("g.npy"),
             p("gx.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 0);
    float y[N], gx[N], wy[N], wg[N];
    read_f32(p("y.npy"), y, N);
    read_f32(p("gx.npy"), gx, N);
    assert_int_equal(qcal_fakequant_fused(tu_vec(x, N), tu_vec(gy, N), tu_fq(0.02f, 10, 0, 127),
                                          tu_out(wy, N), tu_out(wg, N)),
                     QCAL_OK);
    assert_memory_equal(y, wy, sizeof y);
    assert_memory_equal(gx, wg, sizeof gx);
    assert_true(y[4] == (127.0f - 10.0f) * 0.02f);   /* +Inf -> quant_max */
    assert_true(gx[4] == 0.0f);
}

static void test_per_channel(void **state)
{
    (void)state;
    make_inputs();
    float sc[15];
    int32_t zp[15];
    for (int c = 0; c < 15; c++) {
        sc[c] = 0.01f + 0.003f * (float)c;
        zp[c] = c * 3;
    }
    int64_t cs[1] = { 15 };
    assert_int_equal(qcal_npy_write(p("s.npy"), QCAL_NPY_F32, 1, cs, sc), QCAL_OK);
    assert_int_equal(qcal_npy_write(p("z.npy"), QCAL_NPY_I32, 1, cs, zp), QCAL_OK);
    char args[1024], err[1024];
    snprintf(args, sizeof args, "--axis -1 --scales '%s' --zero-points '%s' '%s' -o '%s'",
             p("s.npy"), p("z.npy"), p("x.npy"), p("yc.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 0);
    float y[N], wy[N];
    read_f32(p("yc.npy"), y, N);
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    assert_int_equal(qcal_fakequant_forward(&t, tu_fqc(&t, -1, sc, zp, 0, 255),
                                            tu_out(wy, tu_numel(&t)), NULL),
                     QCAL_OK);
    assert_memory_equal(y, wy, sizeof y);
}

static void test_learnable(void **state)
{
    (void)state;
    make_inputs();
    char args[1024], out[4096], err[1024];
    snprintf(args, sizeof args, "--scale 0.03 --zero-point 20.4 --learnable --grad-factor 0.5 "
             "'%s' -o '%s' --grad '%s'", p("x.npy"), p("yl.npy"), p("g.npy"));
    assert_int_equal(run(args, out, sizeof out, err, sizeof err), 0);
    float gs, gz, gx[N];
    assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(x, N), tu_vec(gy, N),
                                                       tu_lsq(0.03f, 20.4f, 0, 255), 0.5f,
                                                       tu_out(gx, N), &gs, &gz),
                     QCAL_OK);
    const char *a = strstr(out, "\"grad_scale\": [");
    const char *b = strstr(out, "\"grad_zero_point\": [");
    assert_non_null(a);
    assert_non_null(b);
    float js = strtof(a + strlen("\"grad_scale\": ["), NULL);
    float jz = strtof(b + strlen("\"grad_zero_point\": ["), NULL);
    assert_true(js == gs);   /* %.9g round-trips float32 */
    assert_true(jz == gz);
    assert_true(gz != 0.0f);
}

static void test_errors(void **state)
{
    (void)state;
    make_inputs();
    char args[1024], err[1024];
    FILE *f = fopen(p("bad.npy"), "wb");
    fputs("this is not an npy file", f);
    fclose(f);
    struct { const char *fmt; int code; const char *needle; } cases[] = {
        { "--scale 0 '%s' -o '%s'", 2, "scale" },
        { "--scale -1 '%s' -o '%s'", 2, "scale" },
        { "--scale 0.1 --zero-point 300 '%s' -o '%s'", 2, "300" },
        { "--scale 0.1 --quant-min 10 --quant-max 5 '%s' -o '%s'", 2, "quant-min" },
        { "--scale 0.1 --learnable '%s' -o '%s'", 2, "--grad" },
        { "--scale nan '%s' -o '%s'", 2, "scale" },
        { "--scale 0.1 --bogus '%s' -o '%s'", 2, "bogus" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, cases[i].fmt, p("x.npy"), p("never.npy"));
        int rc = run(args, NULL, 0, err, sizeof err);
        if (rc != cases[i].code || count_lines(err) != 1 || !strstr(err, cases[i].needle)) {
            print_error("case %zu: rc %d, stderr '%s'\n", i, rc, err);
            fail();
        }
        assert_int_equal(access(p("never.npy"), F_OK), -1);
    }
    snprintf(args, sizeof args, "--scale 0.1 '%s' -o '%s'", p("missing.npy"), p("never.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 3);
    assert_int_equal(count_lines(err), 1);
    snprintf(args, sizeof args, "--scale 0.1 '%s' -o '%s'", p("bad.npy"), p("never.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 3);
    assert_int_equal(count_lines(err), 1);
    float g2[10] = { 0 };
    int64_t s2[1] = { 10 };
    assert_int_equal(qcal_npy_write(p("g10.npy"), QCAL_NPY_F32, 1, s2, g2), QCAL_OK);
    snprintf(args, sizeof args, "--scale 0.1 '%s' -o '%s' --grad '%s' --grad-out '%s'",
             p("x.npy"), p("never.npy"), p("g10.npy"), p("never2.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 3);
    assert_non_null(strstr(err, "shape"));
    snprintf(args, sizeof args, "--axis 0 --scales '%s' --zero-points '%s' '%s' -o '%s'",
             p("g10.npy"), p("g10.npy"), p("x.npy"), p("never.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 3);   /* 10 scales for 20 channels */
    assert_int_equal(access(p("never.npy"), F_OK), -1);
    snprintf(args, sizeof args, "--scale 0.1 '%s'", p("x.npy"));
    assert_int_equal(run(args, NULL, 0, err, sizeof err), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_tensor),
        cmocka_unit_test(test_per_channel),
        cmocka_unit_test(test_learnable),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
