/* Tests of numeric/metrics.c: statistics and comparison metrics against PyTorch's
 * torch.ao.ns.fx.utils on committed reference vectors (tests/ref/gen_numeric.py).
 *
 * Tolerances (honest): qcal accumulates in double, PyTorch's float32 torch.norm rounds in
 * float32. Against the float64 evaluation of the same formulas qcal agrees to 1e-9 relative;
 * against PyTorch's float32 results to 1e-5 dB (sqnr), 1e-6 relative (l2) and 5e-7
 * absolute (cosine): the float32 rounding of torch.norm, measured at <= 2e-6 dB here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "qcal/npy.h"
#include "qcal/numeric.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static const char *data_dir(void)
{
    const char *d = getenv("QCAL_TEST_DATA");
    return d ? d : "tests/data";
}

static void load(const char *name, qcal_npy_array *a)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/numeric/%s", data_dir(), name);
    if (qcal_npy_read_f32(path, a) != QCAL_OK) {
        print_error("cannot read %s: %s\n", path, qcal_last_error());
        fail();
    }
}

static void check_close(const char *what, const char *case_name, double got, double want,
                        double rel, double abs_tol)
{
    if (isinf(want) && got == want)
        return;
    double err = fabs(got - want);
    if (!(err <= abs_tol + rel * fabs(want))) {
        print_error("%s [%s]: got %.17g want %.17g (error %.3g, tolerance %.3g + %.3g rel)\n",
                    what, case_name, got, want, err, abs_tol, rel);
        fail();
    }
}

static void run_reference(const char *isa)
{
    setenv("QCAL_ISA", isa, 1);
    qcal_cpu_reset();
    char path[4096];
    snprintf(path, sizeof path, "%s/numeric/metrics_ref.txt", data_dir());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char name[64];
    long long n;
    double v[11];
    int cases = 0;
    while (fscanf(f, "%63s %lld %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", name, &n, &v[0],
                  &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10]) == 13) {
        char fx[128], fy[128];
        snprintf(fx, sizeof fx, "m_%s_x.npy", name);
        snprintf(fy, sizeof fy, "m_%s_y.npy", name);
        qcal_npy_array x, y;
        load(fx, &x);
        load(fy, &y);
        assert_int_equal(x.numel, n);
        qcal_numeric_metrics m;
        assert_int_equal(qcal_numeric_compare_f32(x.data, y.data, n, &m), QCAL_OK);
        /* against the float64 evaluation */
        check_close("sqnr vs f64", name, m.sqnr_db, v[3], 1e-9, 0);
        check_close("l2 vs f64", name, m.l2, v[4], 1e-9, 0);
        check_close("cosine vs f64", name, m.cosine, v[5], 1e-9, 0);
        /* against PyTorch's float32 results */
        check_close("sqnr vs torch", name, m.sqnr_db, v[0], 0, 1e-5);
        check_close("l2 vs torch", name, m.l2, v[1], 1e-6, 0);
        check_close("cosine vs torch", name, m.cosine, v[2], 0, 5e-7);
        check_close("max_abs_err", name, m.max_abs_err, v[6], 0, 0);
        assert_int_equal(m.count, n);
        /* streaming over uneven chunks gives the same metrics */
        qcal_numeric_metric_acc acc;
        qcal_numeric_metric_acc_init(&acc);
        for (int64_t i = 0; i < n; i += 1000) {
            int64_t c = n - i < 1000 ? n - i : 1000;
            assert_int_equal(qcal_numeric_metric_acc_update(&acc, (float *)x.data + i, (float *)y.data + i, c),
                             QCAL_OK);
        }
        qcal_numeric_metrics ms;
        assert_int_equal(qcal_numeric_metric_acc_result(&acc, &ms), QCAL_OK);
        check_close("streamed sqnr", name, ms.sqnr_db, m.sqnr_db, 1e-12, 0);
        check_close("streamed cosine", name, ms.cosine, m.cosine, 1e-12, 0);
        /* statistics: min/max exact, mean/std vs float64 torch */
        qcal_numeric_stats s;
        double sd;
        qcal_numeric_stats_init(&s);
        assert_int_equal(qcal_numeric_stats_update(&s, x.data, n), QCAL_OK);
        assert_int_equal(qcal_numeric_stats_std(&s, &sd), QCAL_OK);
        check_close("min", name, s.min, v[7], 0, 0);
        check_close("max", name, s.max, v[8], 0, 0);
        check_close("absmax", name, s.absmax, fmax(fabs(v[7]), fabs(v[8])), 0, 0);
        check_close("mean", name, s.mean, v[9], 1e-12, 1e-15);
        check_close("std", name, sd, v[10], 1e-12, 0);
        /* chunked statistics (Chan merge) */
        qcal_numeric_stats s2;
        qcal_numeric_stats_init(&s2);
        for (int64_t i = 0; i < n; i += 777) {
            int64_t c = n - i < 777 ? n - i : 777;
            assert_int_equal(qcal_numeric_stats_update(&s2, (float *)x.data + i, c), QCAL_OK);
        }
        double sd2;
        qcal_numeric_stats_std(&s2, &sd2);
        check_close("chunked std", name, sd2, v[10], 1e-12, 0);
        check_close("chunked mean", name, s2.mean, v[9], 1e-12, 1e-15);
        qcal_npy_array_free(&x);
        qcal_npy_array_free(&y);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 5);
    unsetenv("QCAL_ISA");
    qcal_cpu_reset();
}

static void test_reference_c(void **state)
{
    (void)state;
    run_reference("c");
}

static void test_reference_simd(void **state)
{
    (void)state;
    run_reference("avx512");
}

static void test_edge_cases(void **state)
{
    (void)state;
    float x[5] = {1, 2, 3, 4, 5}, z[5] = {0}, y[5] = {1, 2, 3, 4, 6};
    qcal_numeric_metrics m;
    assert_int_equal(qcal_numeric_compare_f32(x, x, 5, &m), QCAL_OK);
    assert_true(isinf(m.sqnr_db) && m.sqnr_db > 0);
    assert_true(m.l2 == 0 && m.max_abs_err == 0);
    assert_true(fabs(m.cosine - 1) < 1e-15);
    assert_int_equal(qcal_numeric_compare_f32(z, z, 5, &m), QCAL_OK);
    assert_true(isinf(m.sqnr_db) && m.sqnr_db > 0);
    assert_true(m.l2 == 0 && m.cosine == 0);
    assert_int_equal(qcal_numeric_compare_f32(z, x, 5, &m), QCAL_OK);
    assert_true(isinf(m.sqnr_db) && m.sqnr_db < 0);
    assert_true(isinf(m.l2));
    assert_int_equal(qcal_numeric_compare_f32(x, y, 5, &m), QCAL_OK);
    assert_true(fabs(m.sqnr_db - 20 * log10(sqrt(55.0))) < 1e-12);
    assert_true(m.max_abs_err == 1);
    /* non-finite pairs are skipped and counted */
    float xn[4] = {1, NAN, 3, INFINITY}, yn[4] = {1, 2, -INFINITY, 4};
    assert_int_equal(qcal_numeric_compare_f32(xn, yn, 4, &m), QCAL_OK);
    assert_int_equal(m.count, 1);
    assert_int_equal(m.nonfinite, 3);
    float nn[1] = {NAN};
    qcal_numeric_metrics keep = m;
    assert_int_equal(qcal_numeric_compare_f32(nn, nn, 1, &m), QCAL_ERR_EMPTY);
    assert_memory_equal(&m, &keep, sizeof m);
    assert_int_equal(qcal_numeric_compare_f32(x, x, 0, &m), QCAL_ERR_EMPTY);
    /* statistics with NaN/Inf */
    qcal_numeric_stats s;
    qcal_numeric_stats_init(&s);
    float sv[6] = {NAN, -3, 1, INFINITY, 2, -INFINITY};
    assert_int_equal(qcal_numeric_stats_update(&s, sv, 6), QCAL_OK);
    assert_int_equal(s.count, 3);
    assert_int_equal(s.nonfinite, 3);
    assert_true(s.min == -3 && s.max == 2 && s.absmax == 3);
    assert_true(fabs(s.mean - 0) < 1e-15);
    double sd;
    qcal_numeric_stats_std(&s, &sd);
    assert_true(fabs(sd - sqrt(7.0)) < 1e-12);   /* (9 + 1 + 4) / 2 */
    qcal_numeric_stats_init(&s);
    qcal_numeric_stats_std(&s, &sd);
    assert_true(sd == 0 && s.count == 0 && s.absmax == 0);
    assert_int_equal(qcal_numeric_stats_update(&s, NULL, 3), QCAL_ERR_INVALID_ARG);
}

/* Results do not depend on the thread count (bit-identical). */
static void test_thread_determinism(void **state)
{
    (void)state;
    int64_t n = (1 << 20) + 12345;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    uint64_t r = 1;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 8 - 3);
        y[i] = x[i] * 1.001f;
    }
    qcal_numeric_stats s1, s2;
    qcal_numeric_metric_acc a1, a2;
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(1);
#endif
    qcal_numeric_stats_init(&s1);
    qcal_numeric_stats_update(&s1, x, n);
    qcal_numeric_metric_acc_init(&a1);
    qcal_numeric_metric_acc_update(&a1, x, y, n);
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(2);
#endif
    qcal_numeric_stats_init(&s2);
    qcal_numeric_stats_update(&s2, x, n);
    qcal_numeric_metric_acc_init(&a2);
    qcal_numeric_metric_acc_update(&a2, x, y, n);
    assert_memory_equal(&s1, &s2, sizeof s1);
    assert_memory_equal(&a1, &a2, sizeof a1);
    assert_int_equal(s1.count, n);
    free(x);
    free(y);
}

/* qcal_numeric_metric_acc_merge: accumulators of two shards (as two threads or processes
 * compare halves of a tensor) merge into exactly what one accumulator fed both shards in
 * the same order holds; the merged metrics match the one-shot comparison. */
static void test_metric_acc_merge(void **state)
{
    (void)state;
    int64_t n = 3 * 65536 + 777, cut = 65536 + 5;   /* several 64K-element superblocks */
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    assert_non_null(x);
    assert_non_null(y);
    uint64_t r = 7;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 6 - 2);
        y[i] = x[i] + (float)((int64_t)(r >> 60) - 8) * 0.01f;
    }
    x[3] = NAN;            /* one pair skipped and counted, in the first shard */
    y[cut + 9] = INFINITY; /* and one in the second */
    y[n - 1] = x[n - 1] + 5.0f;   /* the largest error is in the second shard */
    qcal_numeric_metric_acc a, b, seq, empty;
    assert_int_equal(qcal_numeric_metric_acc_init(&a), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_init(&b), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_init(&seq), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_init(&empty), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_update(&a, x, y, cut), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_update(&b, x + cut, y + cut, n - cut), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_update(&seq, x, y, cut), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_update(&seq, x + cut, y + cut, n - cut), QCAL_OK);
    assert_int_equal(qcal_numeric_metric_acc_merge(&a, &b), QCAL_OK);
    assert_int_equal(a.count, n - 2);
    assert_int_equal(a.nonfinite, 2);
    assert_true(a.sxx == seq.sxx && a.syy == seq.syy && a.sxy == seq.sxy && a.sdd == seq.sdd);
    assert_true(a.max_abs_err == seq.max_abs_err);
    assert_true(a.max_abs_err >= 5.0 && a.max_abs_err < 5.0 + 1e-5);
    /* Merging an empty accumulator changes nothing; merging into one copies. */
    qcal_numeric_metric_acc before = a;
    assert_int_equal(qcal_numeric_metric_acc_merge(&a, &empty), QCAL_OK);
    assert_memory_equal(&a, &before, sizeof a);
    assert_int_equal(qcal_numeric_metric_acc_merge(&empty, &b), QCAL_OK);
    assert_memory_equal(&empty, &b, sizeof b);
    /* The merged metrics agree with the one-shot comparison to rounding. */
    qcal_numeric_metrics m, one;
    assert_int_equal(qcal_numeric_metric_acc_result(&a, &m), QCAL_OK);
    assert_int_equal(qcal_numeric_compare_f32(x, y, n, &one), QCAL_OK);
    assert_int_equal(m.count, one.count);
    assert_int_equal(m.nonfinite, one.nonfinite);
    assert_true(fabs(m.sqnr_db - one.sqnr_db) < 1e-9 * fabs(one.sqnr_db));
    assert_true(fabs(m.l2 - one.l2) < 1e-12);
    assert_true(fabs(m.cosine - one.cosine) < 1e-12);
    assert_true(m.max_abs_err == one.max_abs_err);
    assert_int_equal(qcal_numeric_metric_acc_merge(NULL, &b), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_metric_acc_merge(&a, NULL), QCAL_ERR_INVALID_ARG);
    free(x);
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_c),
        cmocka_unit_test(test_reference_simd),
        cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_thread_determinism),
        cmocka_unit_test(test_metric_acc_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
