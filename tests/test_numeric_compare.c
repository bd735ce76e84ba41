/* unit.numeric_compare: numeric/compare.c through the public API.
 *  - activation comparison in both modes (error propagation, shadow) against the float64
 *    metrics of tests/ref/gen_numeric_weights.py over all batches (act_ref.txt);
 *  - streamed metrics equal one-shot metrics on the concatenated data: bit-identical when
 *    every batch is exactly one 4096-element block (the same additions in the same order),
 *    within 1e-12 relative otherwise (a batch's blocks are summed before they join the
 *    running sums, and block boundaries move, so the double sums associate differently);
 *  - argument errors leave the comparison unchanged; NaN/Inf policy;
 *  - weight comparison: a channel without finite values, all-NaN and empty tensors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcal/npy.h"
#include "qcal/numeric.h"

static const char *data_dir(void)
{
    const char *d = getenv("QCAL_TEST_DATA");
    return d ? d : "tests/data";
}

static void load(const char *name, qcal_npy_array *a)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/numeric/%s", data_dir(), name);
    if (qcal_npy_read_f32(path, a) != QCAL_OK)
        fail_msg("cannot read %s: %s", path, qcal_last_error());
}

static void fill(float *x, int64_t n, uint64_t seed, double lo, double hi)
{
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)(lo + (hi - lo) * ((double)(r >> 11) / 9007199254740992.0));
    }
}

static void close_rel(const char *what, const char *who, double got, double want, double rel)
{
    if (!(fabs(got - want) <= rel * fabs(want)))
        fail_msg("%s of %s: got %.17g want %.17g (relative error %.3g > %.3g)", what, who, got,
                 want, fabs(got - want) / fabs(want), rel);
}

/* ---- both modes against the reference ---------------------------------------------------- */

static void run_mode(const char *mode_name, qcal_numeric_act_mode mode)
{
    qcal_numeric_act_compare *ac = NULL;
    assert_int_equal(qcal_numeric_act_compare_create(mode, &ac), QCAL_OK);
    qcal_numeric_act_mode got_mode;
    assert_int_equal(qcal_numeric_act_compare_mode(ac, &got_mode), QCAL_OK);
    assert_int_equal(got_mode, mode);
    const char *fqns[2] = {"fc1", "fc2"};
    /* keep the concatenation of each fqn's outputs for the one-shot comparison */
    float cat_f[2][512], cat_q[2][512];
    int64_t cat_n[2] = {0, 0};
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < 2; k++) {
            char nf[128], nq[128];
            snprintf(nf, sizeof nf, "act_%s_%s_%d_f.npy", mode_name, fqns[k], step);
            snprintf(nq, sizeof nq, "act_%s_%s_%d_q.npy", mode_name, fqns[k], step);
            qcal_npy_array f, q;
            load(nf, &f);
            load(nq, &q);
            qcal_tensor tf, tq;
            qcal_npy_as_tensor(&f, &tf);
            qcal_npy_as_tensor(&q, &tq);
            /* the calls a forward pass makes: one add per layer per step */
            assert_int_equal(qcal_numeric_act_compare_add(ac, fqns[k], &tf, &tq), QCAL_OK);
            assert_true(cat_n[k] + f.numel <= 512);
            memcpy(cat_f[k] + cat_n[k], f.data, (size_t)f.numel * sizeof(float));
            memcpy(cat_q[k] + cat_n[k], q.data, (size_t)q.numel * sizeof(float));
            cat_n[k] += f.numel;
            qcal_npy_array_free(&f);
            qcal_npy_array_free(&q);
        }
    }
    int64_t n;
    assert_int_equal(qcal_numeric_act_compare_count(ac, &n), QCAL_OK);
    assert_int_equal(n, 2);
    char path[4096];
    snprintf(path, sizeof path, "%s/numeric/act_ref.txt", data_dir());
    FILE *rf = fopen(path, "r");
    assert_non_null(rf);
    char m[32], fq[32];
    int steps_ref, matched = 0;
    double sq, l2, cs;
    while (fscanf(rf, "%31s %31s %d %lf %lf %lf", m, fq, &steps_ref, &sq, &l2, &cs) == 6) {
        if (strcmp(m, mode_name))
            continue;
        int k = strcmp(fq, "fc1") ? 1 : 0;
        const char *name;
        int64_t steps;
        qcal_numeric_metrics got;
        qcal_numeric_stats fst;
        assert_int_equal(qcal_numeric_act_compare_get(ac, k, &name, &steps, &got, &fst), QCAL_OK);
        assert_string_equal(name, fq);   /* entries in order of first appearance */
        assert_int_equal(steps, steps_ref);
        assert_int_equal(got.count, cat_n[k]);
        assert_int_equal(got.nonfinite, 0);
        /* double sums vs torch float64: agreement to ~1e-12 */
        close_rel("sqnr", fq, got.sqnr_db, sq, 1e-11);
        close_rel("l2", fq, got.l2, l2, 1e-10);
        close_rel("cosine", fq, got.cosine, cs, 1e-12);
        /* streamed == one-shot on the concatenated data (small batches: one block each,
         * so only the association of the per-call sums differs) */
        qcal_numeric_metrics one;
        assert_int_equal(qcal_numeric_compare_f32(cat_f[k], cat_q[k], cat_n[k], &one), QCAL_OK);
        close_rel("streamed vs one-shot sqnr", fq, got.sqnr_db, one.sqnr_db, 1e-12);
        close_rel("streamed vs one-shot l2", fq, got.l2, one.l2, 1e-12);
        close_rel("streamed vs one-shot cosine", fq, got.cosine, one.cosine, 1e-14);
        assert_true(got.max_abs_err == one.max_abs_err);
        assert_int_equal(got.count, one.count);
        /* the float outputs' statistics stream too */
        qcal_numeric_stats all;
        qcal_numeric_stats_init(&all);
        qcal_numeric_stats_update(&all, cat_f[k], cat_n[k]);
        assert_int_equal(fst.count, all.count);
        assert_true(fst.min == all.min && fst.max == all.max && fst.absmax == all.absmax);
        close_rel("mean", fq, fst.mean, all.mean, 1e-13);
        matched++;
    }
    fclose(rf);
    assert_int_equal(matched, 2);
    qcal_numeric_act_compare_destroy(&ac);
    assert_null(ac);
}

static void test_propagate(void **state)
{
    (void)state;
    run_mode("propagate", QCAL_NUMERIC_ACT_PROPAGATE);
}

static void test_shadow(void **state)
{
    (void)state;
    run_mode("shadow", QCAL_NUMERIC_ACT_SHADOW);
}

/* ---- streaming equals one-shot ------------------------------------------------------------- */

static void stream(const float *x, const float *y, const int64_t *batches, int nb,
                   qcal_numeric_metrics *m, qcal_numeric_stats *st)
{
    qcal_numeric_act_compare *ac = NULL;
    assert_int_equal(qcal_numeric_act_compare_create(QCAL_NUMERIC_ACT_SHADOW, &ac), QCAL_OK);
    int64_t off = 0;
    for (int b = 0; b < nb; b++) {
        qcal_tensor tf, tq;
        qcal_tensor_init(&tf, x + off, 1, &batches[b]);
        qcal_tensor_init(&tq, y + off, 1, &batches[b]);
        assert_int_equal(qcal_numeric_act_compare_add(ac, "layer", &tf, &tq), QCAL_OK);
        off += batches[b];
    }
    int64_t steps;
    assert_int_equal(qcal_numeric_act_compare_get(ac, 0, NULL, &steps, m, st), QCAL_OK);
    assert_int_equal(steps, nb);
    qcal_numeric_act_compare_destroy(&ac);
}

static void test_streamed_equals_one_shot(void **state)
{
    (void)state;
    enum { N = 16 * 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    fill(x, N, 5, -4, 4);
    fill(y, N, 6, -0.01, 0.01);
    for (int i = 0; i < N; i++)
        y[i] += x[i];
    qcal_numeric_metrics one, s;
    qcal_numeric_stats st;
    assert_int_equal(qcal_numeric_compare_f32(x, y, N, &one), QCAL_OK);
    /* whole blocks: the same additions in the same order -> bit-identical */
    int64_t whole[16];
    for (int b = 0; b < 16; b++)
        whole[b] = 4096;
    stream(x, y, whole, 16, &s, &st);
    assert_memory_equal(&s, &one, sizeof s);
    /* several blocks per batch: a batch's blocks are summed first, then added to the
     * running sums, so the association differs: same numbers to 1e-12 */
    int64_t mixed[3] = {4096 * 3, 4096 * 8, 4096 * 5};
    stream(x, y, mixed, 3, &s, &st);
    close_rel("sqnr", "multi-block batches", s.sqnr_db, one.sqnr_db, 1e-12);
    close_rel("cosine", "multi-block batches", s.cosine, one.cosine, 1e-14);
    assert_true(s.max_abs_err == one.max_abs_err);
    /* arbitrary batch sizes: same numbers to 1e-12 */
    int64_t odd[5] = {1, 4095, 10000, 33333, N - 1 - 4095 - 10000 - 33333};
    stream(x, y, odd, 5, &s, &st);
    close_rel("sqnr", "odd batches", s.sqnr_db, one.sqnr_db, 1e-12);
    close_rel("l2", "odd batches", s.l2, one.l2, 1e-12);
    close_rel("cosine", "odd batches", s.cosine, one.cosine, 1e-14);
    assert_true(s.max_abs_err == one.max_abs_err);
    assert_int_equal(s.count, N);
    qcal_numeric_stats all;
    qcal_numeric_stats_init(&all);
    qcal_numeric_stats_update(&all, x, N);
    assert_true(st.min == all.min && st.max == all.max);
    close_rel("mean", "odd batches", st.mean, all.mean, 1e-12);
    close_rel("m2", "odd batches", st.m2, all.m2, 1e-12);
    free(x);
    free(y);
}

/* ---- errors and the NaN/Inf policy --------------------------------------------------------- */

static void test_errors(void **state)
{
    (void)state;
    qcal_numeric_act_compare *ac = NULL;
    assert_int_equal(qcal_numeric_act_compare_create((qcal_numeric_act_mode)5, &ac), QCAL_ERR_INVALID_ARG);
    assert_null(ac);
    assert_int_equal(qcal_numeric_act_compare_create(QCAL_NUMERIC_ACT_PROPAGATE, &ac), QCAL_OK);
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 5, 7};
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6 = 6, s0 = 0;
    qcal_tensor ta, tb, tc, te;
    qcal_tensor_init(&ta, a, 2, s23);
    qcal_tensor_init(&tb, b, 2, s23);
    qcal_tensor_init(&tc, b, 2, s32);
    qcal_tensor_init(&te, NULL, 1, &s0);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "x", &ta, &tb), QCAL_OK);
    qcal_numeric_metrics m0, m1;
    assert_int_equal(qcal_numeric_act_compare_get(ac, 0, NULL, NULL, &m0, NULL), QCAL_OK);
    /* (2, 3) vs (3, 2): same element count, different shape */
    assert_int_equal(qcal_numeric_act_compare_add(ac, "x", &ta, &tc), QCAL_ERR_MISMATCH);
    qcal_tensor_init(&tc, b, 1, &s6);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "x", &ta, &tc), QCAL_ERR_MISMATCH);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "x", &te, &te), QCAL_ERR_EMPTY);
    assert_int_equal(qcal_numeric_act_compare_add(ac, NULL, &ta, &tb), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "y", &te, &te), QCAL_ERR_EMPTY);
    int64_t n, steps;
    assert_int_equal(qcal_numeric_act_compare_count(ac, &n), QCAL_OK);
    assert_int_equal(n, 1);   /* failed adds created no entry */
    assert_int_equal(qcal_numeric_act_compare_get(ac, 0, NULL, &steps, &m1, NULL), QCAL_OK);
    assert_int_equal(steps, 1);
    assert_memory_equal(&m0, &m1, sizeof m0);   /* and changed nothing */
    assert_int_equal(qcal_numeric_act_compare_get(ac, 1, NULL, NULL, &m1, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_act_compare_get(ac, -1, NULL, NULL, &m1, NULL), QCAL_ERR_INVALID_ARG);
    /* x - y = (0,0,0,0,0,-1): sqnr = 20 log10(sqrt(91) / 1), l2 = 1/sqrt(91) */
    close_rel("sqnr", "x", m0.sqnr_db, 20 * log10(sqrt(91.0)), 1e-15);
    close_rel("l2", "x", m0.l2, 1 / sqrt(91.0), 1e-15);
    assert_true(m0.max_abs_err == 1);

    /* NaN/Inf pairs are skipped and counted */
    float fn[4] = {1, NAN, 3, 4}, qn[4] = {1, 2, INFINITY, 4};
    int64_t s4 = 4;
    qcal_tensor tfn, tqn;
    qcal_tensor_init(&tfn, fn, 1, &s4);
    qcal_tensor_init(&tqn, qn, 1, &s4);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "nan", &tfn, &tqn), QCAL_OK);
    qcal_numeric_stats fst;
    assert_int_equal(qcal_numeric_act_compare_get(ac, 1, NULL, NULL, &m1, &fst), QCAL_OK);
    assert_int_equal(m1.count, 2);
    assert_int_equal(m1.nonfinite, 2);
    assert_true(m1.sqnr_db == INFINITY);   /* the finite pairs are identical */
    assert_int_equal(fst.count, 3);
    assert_int_equal(fst.nonfinite, 1);
    /* an fqn that never saw a finite pair has no metrics: QCAL_ERR_EMPTY, outputs untouched */
    float all_nan[2] = {NAN, NAN};
    int64_t s2 = 2;
    qcal_tensor_init(&tfn, all_nan, 1, &s2);
    assert_int_equal(qcal_numeric_act_compare_add(ac, "dead", &tfn, &tfn), QCAL_OK);
    memset(&m1, 0x5a, sizeof m1);
    qcal_numeric_metrics canary = m1;
    assert_int_equal(qcal_numeric_act_compare_get(ac, 2, NULL, NULL, &m1, NULL), QCAL_ERR_EMPTY);
    assert_memory_equal(&m1, &canary, sizeof m1);
    qcal_numeric_act_compare_destroy(&ac);
    qcal_numeric_act_compare_destroy(&ac);
    qcal_numeric_act_compare_destroy(NULL);
}

/* ---- weight comparison edge cases ------------------------------------------------------ */

static void test_weights_nonfinite(void **state)
{
    (void)state;
    qcal_numeric_weights_options wo;
    qcal_numeric_weights_options_default(&wo);
    assert_int_equal(wo.observer, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    assert_int_equal(wo.dtype, QCAL_QINT8);
    assert_int_equal(wo.qscheme, QCAL_PER_CHANNEL_SYMMETRIC);
    /* (3, 4): channel 1 is all NaN/Inf; channels 0 and 2 quantize normally */
    float w[12] = {0.5f, -0.25f, 1.0f, 0.125f, NAN, INFINITY, NAN, -INFINITY,
                   2.0f, -1.5f, 0.75f, 0.3f};
    int64_t sh[2] = {3, 4};
    qcal_tensor t;
    qcal_tensor_init(&t, w, 2, sh);
    qcal_numeric_weight_result r;
    assert_int_equal(qcal_numeric_weights_compare(&wo, "w", &t, &r), QCAL_OK);
    assert_int_equal(r.channels, 3);
    assert_int_equal(r.stats.count, 8);
    assert_int_equal(r.stats.nonfinite, 4);
    assert_int_equal(r.m.count, 8);
    assert_int_equal(r.m.nonfinite, 4);
    /* symmetric qint8 scales: absmax / 127.5 (PyTorch: max / ((qmax - qmin) / 2));
     * the empty channel's placeholder scale 1 is not part of the range */
    assert_true(r.scale_min == 1.0f / 127.5f);
    assert_true(r.scale_max == 2.0f / 127.5f);
    /* same as comparing the two finite channels alone */
    float w2[8] = {0.5f, -0.25f, 1.0f, 0.125f, 2.0f, -1.5f, 0.75f, 0.3f};
    int64_t sh2[2] = {2, 4};
    qcal_tensor t2;
    qcal_tensor_init(&t2, w2, 2, sh2);
    qcal_numeric_weight_result r2;
    assert_int_equal(qcal_numeric_weights_compare(&wo, "w2", &t2, &r2), QCAL_OK);
    assert_true(r.m.sqnr_db == r2.m.sqnr_db);
    assert_true(r.m.max_abs_err == r2.m.max_abs_err);

    /* no finite value at all: QCAL_ERR_NONFINITE, *out untouched */
    float bad[4] = {NAN, INFINITY, -INFINITY, NAN};
    int64_t s4 = 4;
    qcal_tensor_init(&t, bad, 1, &s4);
    memset(&r, 0x77, sizeof r);
    qcal_numeric_weight_result canary = r;
    assert_int_equal(qcal_numeric_weights_compare(&wo, "bad", &t, &r), QCAL_ERR_NONFINITE);
    assert_memory_equal(&r, &canary, sizeof r);
    assert_non_null(strstr(qcal_last_error(), "'bad' has no finite value (4 NaN/Inf)"));
    int64_t s22[2] = {2, 2};
    qcal_tensor_init(&t, bad, 2, s22);   /* per-channel path too */
    assert_int_equal(qcal_numeric_weights_compare(&wo, "bad2", &t, &r), QCAL_ERR_NONFINITE);
    /* empty */
    int64_t s0[2] = {0, 3};
    qcal_tensor_init(&t, NULL, 2, s0);
    assert_int_equal(qcal_numeric_weights_compare(&wo, "e", &t, &r), QCAL_ERR_EMPTY);
    assert_memory_equal(&r, &canary, sizeof r);
    /* qint32 is not a weight dtype here */
    wo.dtype = QCAL_QINT32;
    qcal_tensor_init(&t, w2, 2, sh2);
    assert_int_equal(qcal_numeric_weights_compare(&wo, "w", &t, &r), QCAL_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_propagate),
        cmocka_unit_test(test_shadow),
        cmocka_unit_test(test_streamed_equals_one_shot),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_weights_nonfinite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
