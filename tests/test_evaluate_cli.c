/* `qcal evaluate` / `qcal report` on dump directories and evaluation states (docs/evaluate.md,
 * docs/state.md "Evaluation state"): `qcal report STATE` reproduces `qcal report DIR` byte for
 * byte, `qcal evaluate STATE` the results in every format; --observers / --min-sqnr on a state
 * give what they give on the directory; a re-saved state is the same bytes; every truncation
 * and byte flip of a state is refused cleanly or loads into a consistent evaluation; session
 * and observer states, garbage and unwritable outputs end with one line and the documented
 * exit code. */
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

#include "qcal/numeric_eval.h"
#include "qcal/npy.h"

#include "testutil.h"

static char tmp[64];
static char out[1 << 16], err[4096];

static uint64_t rng = 4242;
static uint32_t rnd_u32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float rnd_f(void)
{
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)rnd_u32() / 2147483648.0f - 1.0f;
    return s * 0.87f;
}

static const char *T(const char *name)
{
    return tu_path(tmp, name);
}

/* Runs `qcal ARGS` in tmp (ARGS already quoted); stdout into out, stderr into err. */
static int qcal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tu_qcal_shv(tmp, out, sizeof out, err, sizeof err, fmt, ap);
    va_end(ap);
    return rc;
}

/* Whole file into a malloc'ed buffer (*n bytes). */
static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    unsigned char *x = slurp(T(a), &na), *y = slurp(T(b), &nb);
    if (na != nb || memcmp(x, y, na) != 0) {
        print_error("%s (%zu bytes) and %s (%zu bytes) differ\n", a, na, b, nb);
        fail();
    }
    free(x);
    free(y);
}

static void write_file(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(T(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void expect_fail(int rc, int want, const char *needle)
{
    if (rc != want || !strstr(err, needle) || strchr(err, '\n') != err + strlen(err) - 1) {
        print_error("exit %d (want %d), stderr '%s' (want one line with '%s')\n", rc, want, err,
                    needle);
        fail();
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/qcal_evaluate_cli_XXXXXX");
    if (!mkdtemp(tmp))
        return -1;
    if (!getenv("QCAL_BIN"))
        return -1;
    /* A dump: three activations (normal with an outlier, ReLU, a hostile name) of 4 batch
     * files each, and a weight [16, 9] with one loud channel. */
    const char *const acts[] = { "conv1", "relu", "a <b>&\"c\" d" };
    assert_int_equal(mkdir(T("dump"), 0755), 0);
    for (int a = 0; a < 3; a++) {
        char dir[512];
        snprintf(dir, sizeof dir, "dump/%s", acts[a]);
        assert_int_equal(mkdir(T(dir), 0755), 0);
        for (int b = 0; b < 4; b++) {
            float x[8 * 64];
            for (int i = 0; i < 512; i++) {
                float v = rnd_f() * (float)(a + 1);
                x[i] = a == 1 ? fmaxf(v, 0.0f) : v + (b == 2 && i == 9 ? 40.0f : 0.0f);
            }
            int64_t shape[2] = { 8, 64 };
            char name[600];
            snprintf(name, sizeof name, "%s/batch%02d.npy", dir, b);
            assert_int_equal(qcal_npy_write(T(name), QCAL_NPY_F32, 2, shape, x), QCAL_OK);
        }
    }
    float w[16 * 9];
    for (int i = 0; i < 144; i++)
        w[i] = rnd_f() * (i / 9 == 5 ? 8.0f : 1.0f);
    int64_t ws[2] = { 16, 9 };
    assert_int_equal(qcal_npy_write(T("dump/fc.weight.npy"), QCAL_NPY_F32, 2, ws, w), QCAL_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp);
    return 0;
}

/* report STATE = report DIR, evaluate STATE = evaluate DIR, a re-saved state = the state. */
static void test_state_reproduces(void **state)
{
    (void)state;
    assert_int_equal(qcal("report dump -o dir.html --save-state ev.qcev"), 0);
    assert_non_null(strstr(out, "(4 tensors)"));
    assert_int_equal(qcal("report ev.qcev -o state.html --save-state ev2.qcev"), 0);
    assert_same_file("dir.html", "state.html");
    assert_same_file("ev.qcev", "ev2.qcev");
    size_t n;
    unsigned char *st = slurp(T("ev.qcev"), &n);
    assert_memory_equal(st, "QCEV", 4);
    free(st);
    static const char *const fmts[] = { "table", "csv", "json" };
    for (int f = 0; f < 3; f++) {
        assert_int_equal(qcal("evaluate dump --format %s -o d.%s --rules-out d.rules --save-state "
                              "ev3.qcev", fmts[f], fmts[f]), 0);
        assert_int_equal(qcal("evaluate ev.qcev --format %s -o s.%s --rules-out s.rules", fmts[f],
                              fmts[f]), 0);
        char a[32], b[32];
        snprintf(a, sizeof a, "d.%s", fmts[f]);
        snprintf(b, sizeof b, "s.%s", fmts[f]);
        assert_same_file(a, b);
        assert_same_file("d.rules", "s.rules");
        assert_same_file("ev.qcev", "ev3.qcev");   /* evaluate and report save the same state */
    }
    /* The state holds the results: the report names the dump it came from. */
    size_t hn;
    char *html = (char *)slurp(T("state.html"), &hn);
    html[hn] = 0;
    assert_non_null(strstr(html, "dump &#183; 4 tensors"));
    assert_non_null(strstr(html, "a &lt;b&gt;&amp;&quot;c&quot; d"));
    free(html);
}

/* --observers and --min-sqnr on a state = the same options on the directory. */
static void test_state_options(void **state)
{
    (void)state;
    assert_int_equal(qcal("evaluate dump --save-state all.qcev -o /dev/null"), 0);
    assert_int_equal(qcal("evaluate dump --observers minmax,mse,per_channel_minmax --format json "
                          "-o d.json"), 0);
    assert_int_equal(qcal("evaluate all.qcev --observers minmax,mse,per_channel_minmax "
                          "--format json -o s.json"), 0);
    assert_same_file("d.json", "s.json");
    assert_int_equal(qcal("report dump --observers minmax,mse -o d.html"), 0);
    assert_int_equal(qcal("report all.qcev --observers minmax,mse -o s.html"), 0);
    assert_same_file("d.html", "s.html");
    assert_int_equal(qcal("evaluate dump --min-sqnr 25 --format csv -o d.csv"), 0);
    assert_int_equal(qcal("evaluate all.qcev --min-sqnr 25 --format csv -o s.csv"), 0);
    assert_same_file("d.csv", "s.csv");
    /* A kind the state does not hold is a usage error. */
    assert_int_equal(qcal("evaluate dump --observers minmax --save-state mm.qcev -o /dev/null"), 0);
    expect_fail(qcal("report mm.qcev --observers mse -o x.html"), 2, "no tensor of the evaluation "
                "has a mse candidate");
}

/* Every truncation and every single-byte change of a state: refused with QCAL_ERR_FORMAT /
 * QCAL_ERR_UNSUPPORTED, or loaded into an evaluation whose report can be written. */
static void test_state_malformed(void **state)
{
    (void)state;
    assert_int_equal(qcal("evaluate dump --observers minmax,histogram,per_channel_minmax "
                          "--save-state small.qcev -o /dev/null"), 0);
    size_t n;
    unsigned char *b = slurp(T("small.qcev"), &n);
    qcal_numeric_eval *ev = NULL;
    assert_int_equal(qcal_numeric_eval_load(b, n, &ev), QCAL_OK);
    qcal_numeric_eval_destroy(&ev);
    for (size_t k = 0; k < n; k += 1 + k / 64) {
        qcal_status st = qcal_numeric_eval_load(b, k, &ev);
        if (st != QCAL_ERR_FORMAT && st != QCAL_ERR_UNSUPPORTED) {
            print_error("prefix of %zu / %zu bytes: status %d\n", k, n, (int)st);
            fail();
        }
        assert_null(ev);
    }
    unsigned char *c = malloc(n);
    assert_non_null(c);
    int loaded = 0;
    for (size_t k = 0; k < n; k += 1 + k / 256) {
        memcpy(c, b, n);
        c[k] ^= (unsigned char)(1u << (k % 8));
        qcal_status st = qcal_numeric_eval_load(c, n, &ev);
        if (st == QCAL_OK) {
            loaded++;
            assert_int_equal(qcal_numeric_eval_write_report(ev, NULL, T("flip.html")), QCAL_OK);
            qcal_numeric_eval_destroy(&ev);
        } else if (st != QCAL_ERR_FORMAT && st != QCAL_ERR_UNSUPPORTED) {
            print_error("byte %zu flipped: status %d (%s)\n", k, (int)st, qcal_last_error());
            fail();
        }
    }
    print_message("%d of the flipped states load (changed values the format cannot tell)\n", loaded);
    /* Through the CLI: one line, exit 3. */
    write_file("trunc.qcev", b, n / 2);
    expect_fail(qcal("report trunc.qcev -o x.html"), 3, "trunc.qcev");
    write_file("junk.bin", "not a state at all", 18);
    expect_fail(qcal("report junk.bin -o x.html"), 3, "neither a dump directory nor an "
                "evaluation state");
    write_file("empty.bin", "", 0);
    expect_fail(qcal("evaluate empty.bin"), 3, "neither a dump directory");
    expect_fail(qcal("report missing.qcev -o x.html"), 3, "missing.qcev");
    memcpy(c, b, n);
    c[4] = 9;   /* version */
    write_file("v9.qcev", c, n);
    expect_fail(qcal("evaluate v9.qcev"), 3, "version 9 is not supported");
    free(c);
    free(b);
    /* A session state holds no data to score. */
    assert_int_equal(qcal("calibrate dump -o t.json --save-state sess.qcss"), 0);
    expect_fail(qcal("report sess.qcss -o x.html"), 3, "is a session state");
    assert_true(access(T("x.html"), F_OK) != 0);
    /* Outputs that cannot be written: exit 4, nothing left behind. */
    expect_fail(qcal("evaluate dump --save-state nodir/s.qcev"), 4, "nodir/s.qcev");
    expect_fail(qcal("report small.qcev -o nodir/r.html"), 4, "nodir/r.html");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_reproduces),
        cmocka_unit_test(test_state_options),
        cmocka_unit_test(test_state_malformed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
