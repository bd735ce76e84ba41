/* State files on the command line (docs/state.md): `qcal observe` on a list of files in any
 * order, on their concatenation as one file, or on any split into --save-state runs merged
 * (`qcal merge`) in any order prints the same JSON except "batches"; a dump split by batch
 * files into two directories, each calibrated with --save-state, merges into a table
 * byte-identical to calibrating the whole dump, in every format; refusals and malformed
 * states end with one clear line and the documented exit code. */
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

#include "qcal/calib.h"
#include "qcal/npy.h"
#include "qcal/observer.h"

#include "testutil.h"

/* The histogram family is order- and split-invariant on the lattice grid (issue 11). The
 * identities cover it whenever this build has that grid (the observer-config key "grid"
 * accepts "lattice"); the min/max kinds always. */
static bool hist_exact(void)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    bool have = qcal_observer_config_set(&cfg, "grid", "lattice") == QCAL_OK;
    qcal_clear_error();
    return have;
}

static char tmp[64];
static char out[1 << 16], err[4096];

static uint64_t rng = 777;
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

/* Runs `qcal ARGS` through the shell (ARGS already quoted), stdout into out, stderr into
 * err; returns the exit code. */
static int qcal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tu_qcal_shv(tmp, out, sizeof out, err, sizeof err, fmt, ap);
    va_end(ap);
    return rc;
}

/* out without its "batches": N field, into dst. */
static void strip_batches(char *dst, size_t cap, const char *json)
{
    const char *b = strstr(json, ", \"batches\": ");
    assert_non_null(b);
    const char *e = strchr(b + 2, ',');
    assert_non_null(e);
    snprintf(dst, cap, "%.*s%s", (int)(b - json), json, e);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/qcal_state_cli_XXXXXX");
    if (!mkdtemp(tmp))
        return -1;
    return getenv("QCAL_BIN") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp);
    return 0;
}

enum { NF = 6, CH = 8 };

/* Six batch files b0..b5.npy of shape [rows_i, 8] (different sizes; batch 3 carries the
 * outliers) and their concatenation all.npy ([sum rows, 8]). */
static void write_batches(void)
{
    static float all[NF * 200 * CH];
    int64_t total = 0;
    for (int b = 0; b < NF; b++) {
        int64_t rows = 20 + 30 * b;
        float *x = all + total * CH;
        for (int64_t i = 0; i < rows * CH; i++)
            x[i] = rnd_f() * 20.0f;
        if (b == 3) {
            x[5] = -800.0f;
            x[17] = 1200.0f;
            x[40] = 950.0f;
        }
        if (b == 1)
            x[3] = NAN;
        char name[32];
        snprintf(name, sizeof name, "b%d.npy", b);
        int64_t shape[2] = { rows, CH };
        assert_int_equal(qcal_npy_write(T(name), QCAL_NPY_F32, 2, shape, x), QCAL_OK);
        total += rows;
    }
    int64_t shape[2] = { total, CH };
    assert_int_equal(qcal_npy_write(T("all.npy"), QCAL_NPY_F32, 2, shape, all), QCAL_OK);
}

static const char *const kinds[] = {
    "minmax", "per_channel_minmax", "histogram", "percentile", "entropy", "mse",
};

static bool exact(const char *kind)
{
    static int lattice = -1;
    if (lattice < 0) {
        lattice = hist_exact();
        if (!lattice)
            print_message("no lattice grid in this build: identities for the min/max kinds "
                          "only\n");
    }
    return lattice || strstr(kind, "minmax") != NULL;
}

static void test_observe_identities(void **state)
{
    (void)state;
    write_batches();
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        if (!exact(kinds[k]))
            continue;
        char opts[128];
        snprintf(opts, sizeof opts, "--observer %s%s", kinds[k],
                 strstr(kinds[k], "per_channel") ? " --axis 1" : "");
        char want[8192], got[8192];
        assert_int_equal(qcal("observe %s b0.npy b1.npy b2.npy b3.npy b4.npy b5.npy", opts), 0);
        strip_batches(want, sizeof want, out);
        assert_non_null(strstr(out, "\"batches\": 6, \"digest\": \""));
        assert_non_null(strstr(out, "\"nonfinite\": 1"));
        /* Other orders. */
        assert_int_equal(qcal("observe %s b5.npy b4.npy b3.npy b2.npy b1.npy b0.npy", opts), 0);
        strip_batches(got, sizeof got, out);
        assert_string_equal(got, want);
        assert_int_equal(qcal("observe %s b3.npy b0.npy b5.npy b1.npy b4.npy b2.npy", opts), 0);
        strip_batches(got, sizeof got, out);
        assert_string_equal(got, want);
        /* One file holding everything. */
        assert_int_equal(qcal("observe %s all.npy", opts), 0);
        assert_non_null(strstr(out, "\"batches\": 1, "));
        strip_batches(got, sizeof got, out);
        assert_string_equal(got, want);
        /* Random splits into --save-state runs, merged in a random order. */
        for (int trial = 0; trial < 6; trial++) {
            int parts = 2 + trial % 3, perm[NF];
            char files[4][256];
            for (int p = 0; p < parts; p++)
                files[p][0] = '\0';
            for (int b = 0; b < NF; b++)
                perm[b] = b;
            for (int b = NF - 1; b > 0; b--) {
                int j = (int)(rnd_u32() % (uint32_t)(b + 1)), t = perm[b];
                perm[b] = perm[j];
                perm[j] = t;
            }
            for (int b = 0; b < NF; b++) {
                int p = b < parts ? b : (int)(rnd_u32() % (uint32_t)parts);  /* none empty */
                char f[16];
                snprintf(f, sizeof f, " b%d.npy", perm[b]);
                strcat(files[p], f);
            }
            char states[256] = "";
            for (int p = 0; p < parts; p++) {
                assert_int_equal(qcal("observe %s --save-state p%d.state%s", opts, p, files[p]),
                                 0);
                char s[16];
                snprintf(s, sizeof s, " p%d.state", parts - 1 - p);
                strcat(states, s);
            }
            assert_int_equal(qcal("merge%s", states), 0);
            assert_non_null(strstr(out, "\"batches\": 6, "));
            strip_batches(got, sizeof got, out);
            assert_string_equal(got, want);
            /* Continue a state with more files, then merge the rest. */
            assert_int_equal(qcal("observe --load-state p0.state --save-state p01.state%s",
                                  files[1]), 0);
            char rest[64] = "";
            for (int p = 2; p < parts; p++) {
                char s[16];
                snprintf(s, sizeof s, " p%d.state", p);
                strcat(rest, s);
            }
            assert_int_equal(qcal("merge%s p01.state --save-state m.state", rest), 0);
            strip_batches(got, sizeof got, out);
            assert_string_equal(got, want);
            /* The merged state, shown alone, and with the same options given again. */
            assert_int_equal(qcal("observe --load-state m.state %s", opts), 0);
            strip_batches(got, sizeof got, out);
            assert_string_equal(got, want);
        }
    }
}

static void test_merge_refusals(void **state)
{
    (void)state;
    write_batches();
    assert_int_equal(qcal("observe --observer minmax --save-state mm.state b0.npy"), 0);
    assert_int_equal(qcal("observe --observer histogram --save-state h.state b1.npy"), 0);
    assert_int_equal(qcal("observe --observer histogram --bins 1024 --save-state h1k.state "
                          "b1.npy"), 0);
    /* Different kinds / configs: both files and both values named. */
    assert_int_equal(qcal("merge mm.state h.state"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "'h.state' does not merge with 'mm.state'");
    assert_non_null(strstr(err, "observer minmax vs histogram"));
    assert_int_equal(qcal("merge h.state h1k.state"), 3);
    assert_non_null(strstr(err, "bins 2048 vs 1024"));
    /* Moving averages that both saw data depend on order: refused. */
    assert_int_equal(qcal("observe --observer moving_average_minmax --save-state ma0.state "
                          "b0.npy"), 0);
    assert_int_equal(qcal("observe --observer moving_average_minmax --save-state ma1.state "
                          "b1.npy"), 0);
    assert_int_equal(qcal("merge ma0.state ma1.state"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "order");
    /* --load-state with options that disagree: usage error naming the field. */
    assert_int_equal(qcal("observe --load-state h.state --bins 1024 b2.npy"), 2);
    tu_expect_one_line(err, "qcal: observe: ", "bins 1024 vs 2048");
    assert_int_equal(qcal("observe --load-state h.state --observer minmax"), 2);
    assert_int_equal(qcal("observe --load-state h.state --observer histogram --bins 2048"), 0);
    /* Malformed, truncated, missing, not a state, mixed kinds. */
    size_t len;
    char *blob = tu_read_file(T("mm.state"), &len);
    for (size_t cut = 0; cut < len; cut += 7) {
        tu_write_bytes(T("cut.state"), blob, cut);
        assert_int_equal(qcal("merge cut.state"), 3);
        tu_expect_one_line(err, "qcal: merge: ", "cut.state");
        assert_int_equal(qcal("observe --load-state cut.state"), 3);
        tu_expect_one_line(err, "qcal: observe: ", "cut.state");
    }
    blob[4] = 9;   /* version */
    tu_write_bytes(T("v9.state"), blob, len);
    assert_int_equal(qcal("merge v9.state"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "version 9");
    free(blob);
    assert_int_equal(qcal("merge missing.state"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "missing.state");
    assert_int_equal(qcal("merge b0.npy"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "not a qcal state");
    assert_int_equal(qcal("merge"), 2);
    assert_int_equal(qcal("merge mm.state -o t.json"), 2);
    /* Unwritable --save-state: exit 4, nothing printed on stdout. */
    assert_int_equal(qcal("observe --save-state /nonexistent/dir/x.state b0.npy"), 4);
    tu_expect_one_line(err, "qcal: observe: ", "x.state");
}

/* ---- calibrate: a dump split by batch files ---- */

static void write_dump(const char *root, const char *half_a, const char *half_b)
{
    const char *const acts[] = { "conv1", "conv2", "fc" };
    char dir[512];
    for (const char *const *r = (const char *const[]){ root, half_a, half_b, NULL }; *r; r++)
        assert_int_equal(mkdir(T(*r), 0755), 0);
    for (int a = 0; a < 3; a++) {
        snprintf(dir, sizeof dir, "%s/%s", root, acts[a]);
        assert_int_equal(mkdir(T(dir), 0755), 0);
        for (int b = 0; b < 5; b++) {
            float x[4 * 6 * 3];
            for (int i = 0; i < 72; i++)
                x[i] = rnd_f() * (float)(a + 1) + (b == 2 && i == 7 ? 300.0f : 0.0f);
            int64_t shape[3] = { 4, 6, 3 };
            char name[512];
            snprintf(name, sizeof name, "%s/%s/batch%02d.npy", root, acts[a], b);
            assert_int_equal(qcal_npy_write(T(name), QCAL_NPY_F32, 3, shape, x), QCAL_OK);
            /* The same file in one half: batches 0, 2, 4 / 1, 3 ("fc": all in half b). */
            const char *half = (b % 2 == 0 && a != 2) ? half_a : half_b;
            snprintf(dir, sizeof dir, "%s/%s", half, acts[a]);
            mkdir(T(dir), 0755);   /* once per half */
            snprintf(name, sizeof name, "%s/%s/batch%02d.npy", half, acts[a], b);
            assert_int_equal(qcal_npy_write(T(name), QCAL_NPY_F32, 3, shape, x), QCAL_OK);
        }
    }
    /* A weight dumped as one file: in the whole dump and in half a only. */
    float w[16 * 9];
    for (int i = 0; i < 144; i++)
        w[i] = rnd_f();
    int64_t ws[2] = { 16, 9 };
    for (const char *const *r = (const char *const[]){ root, half_a, NULL }; *r; r++) {
        snprintf(dir, sizeof dir, "%s/fc.weight.npy", *r);
        assert_int_equal(qcal_npy_write(T(dir), QCAL_NPY_F32, 2, ws, w), QCAL_OK);
    }
}

static void test_calibrate_split(void **state)
{
    (void)state;
    write_dump("dump", "half_a", "half_b");
    const char *const fmts[] = { "json", "tensorrt", "onnxruntime", "ncnn" };
    const char *const observers[] = { "minmax", "histogram", "percentile", "entropy", "mse" };
    for (size_t o = 0; o < sizeof observers / sizeof observers[0]; o++) {
        if (!exact(observers[o]))
            continue;
        assert_int_equal(qcal("calibrate dump -o whole.json --observer %s --save-state "
                              "whole.state", observers[o]), 0);
        assert_int_equal(qcal("calibrate half_a -o a.json --observer %s --save-state a.state",
                              observers[o]), 0);
        assert_int_equal(qcal("calibrate half_b -o b.json --observer %s --save-state b.state",
                              observers[o]), 0);
        for (size_t f = 0; f < 4; f++) {
            assert_int_equal(qcal("calibrate dump -o whole.%s --format %s --observer %s",
                                  fmts[f], fmts[f], observers[o]), 0);
            for (int order = 0; order < 2; order++) {
                assert_int_equal(qcal("merge %s -o merged.%s --format %s",
                                      order ? "b.state a.state" : "a.state b.state", fmts[f],
                                      fmts[f]), 0);
                assert_non_null(strstr(out, "qcal: merge: wrote merged."));
                /* onnxruntime writes ONNX Runtime's three files into a directory */
                static const char *const ort[] = { "/calibration.json",
                                                   "/calibration.flatbuffers",
                                                   "/calibration.cache" };
                for (int k = 0; k < (f == 2 ? 3 : 1); k++) {
                    size_t lw, lm;
                    char wn[64], mn[64];
                    snprintf(wn, sizeof wn, "whole.%s%s", fmts[f], f == 2 ? ort[k] : "");
                    snprintf(mn, sizeof mn, "merged.%s%s", fmts[f], f == 2 ? ort[k] : "");
                    char *w = tu_read_file(T(wn), &lw), *m = tu_read_file(T(mn), &lm);
                    if (lw != lm || memcmp(w, m, lw))
                        fail_msg("%s, %s: merged table differs from the whole dump's:\n%s\n"
                                 "vs\n%s", observers[o], wn, m, w);
                    free(w);
                    free(m);
                }
            }
        }
        /* The merged session state equals the whole dump's, byte for byte but the batch
         * counts: same digest, which is in the JSON table. */
        assert_int_equal(qcal("merge b.state a.state --save-state ab.state"), 0);
        qcal_calib_session *s1 = NULL, *s2 = NULL;
        assert_int_equal(qcal_calib_session_load_file(T("ab.state"), NULL, &s1), QCAL_OK);
        assert_int_equal(qcal_calib_session_load_file(T("whole.state"), NULL, &s2), QCAL_OK);
        char h1[65], h2[65];
        assert_int_equal(qcal_calib_session_digest(s1, h1), QCAL_OK);
        assert_int_equal(qcal_calib_session_digest(s2, h2), QCAL_OK);
        assert_string_equal(h1, h2);
        char *tab = tu_read_file(T("whole.json"), NULL);
        char field[96];
        snprintf(field, sizeof field, "\"digest\": \"%s\"", h1);
        assert_non_null(strstr(tab, field));
        free(tab);
        size_t l1, l2;
        void *b1, *b2;
        assert_int_equal(qcal_calib_session_save(s1, &b1, &l1), QCAL_OK);
        assert_int_equal(qcal_calib_session_save(s2, &b2, &l2), QCAL_OK);
        assert_true(l1 == l2 && !memcmp(b1, b2, l1));   /* batches add up to the same too */
        qcal_free(b1);
        qcal_free(b2);
        qcal_calib_session_destroy(&s1);
        qcal_calib_session_destroy(&s2);
    }
    /* Moving averages over a split tensor: refused, naming the tensor and both files. */
    assert_int_equal(qcal("calibrate half_a -o a.json --observer moving_average_minmax "
                          "--save-state ma_a.state"), 0);
    assert_int_equal(qcal("calibrate half_b -o b.json --observer moving_average_minmax "
                          "--save-state ma_b.state"), 0);
    assert_int_equal(qcal("merge ma_a.state ma_b.state -o never.json"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "'ma_b.state' does not merge with 'ma_a.state'");
    assert_non_null(strstr(err, "conv1"));
    assert_non_null(strstr(err, "order"));
    assert_int_equal(access(T("never.json"), F_OK), -1);
    /* Observer and session states do not mix; session states need an output. */
    assert_int_equal(qcal("observe --save-state o.state half_a/conv1/batch00.npy"), 0);
    assert_int_equal(qcal("merge a.state o.state -o never.json"), 3);
    tu_expect_one_line(err, "qcal: merge: ", "'o.state' is an observer state but 'a.state' is "
                       "a session state");
    assert_int_equal(qcal("merge a.state"), 2);
    assert_int_equal(qcal("calibrate half_a -o x.json --save-state /nonexistent/s.state"), 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_observe_identities),
        cmocka_unit_test(test_merge_refusals),
        cmocka_unit_test(test_calibrate_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
