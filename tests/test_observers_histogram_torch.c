/* grid=torch against PyTorch 1.13's HistogramObserver (tests/ref/gen_histogram_torch.py ->
 * tests/data/histogram/torch.bin): after every batch of every case the histogram buffer,
 * min_val / max_val, scale and zero-point are torch's bit for bit; growing and shrinking
 * ranges, the same batches in both orders, int()-truncated edges, constant batches, 255 and
 * 512 bins, > 2^24 cumulative counts. Also: save/load round trip mid-sequence, merge only
 * with an empty side, the torch buffers API, refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qcal/qcal.h"
#include "testutil.h"

/* The generator's batches (gen_histogram_torch.py: batch()), same float32 ops. */
static uint64_t splitmix(uint64_t seed, uint64_t idx)
{
    uint64_t z = seed + idx * UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static float *make_batch(int64_t n, int kind, float scale, float shift, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) {
        float u[4];
        for (int j = 0; j < 4; j++)
            u[j] = (float)(splitmix(seed, (uint64_t)i * 4 + (uint64_t)j) >> 40) *
                   0x1p-24f;
        float s;
        if (kind == 0 || kind == 1) {
            s = u[0] + u[1];
            s = s + u[2];
            s = s + u[3];
            s = s - 2.0f;
            s = s * scale;
            s = s + shift;
            if (kind == 1)
                s = s > 0.0f ? s : 0.0f;
        } else if (kind == 2) {
            s = (u[0] - 0.5f) / (u[1] + 0.001f);
            s = s * scale;
            s = s + shift;
        } else if (kind == 3) {
            s = shift;
        } else {
            s = u[0] * 2.0f;
            s = s - 1.0f;
            s = s * scale;
            s = s + shift;
        }
        x[i] = s;
    }
    return x;
}

static qcal_observer *make_obs(int bins, int qcfg)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(qcal_observer_config_set(&cfg, "grid", "torch"), QCAL_OK);
    cfg.bins = bins;
    if (qcfg == 1) {
        cfg.q.dtype = QCAL_QINT8;
        cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    } else if (qcfg == 2) {
        cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        cfg.q.reduce_range = true;
    }
    qcal_observer *obs = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    return obs;
}

/* Fails unless obs holds torch's state and qparams after batch j of case k (qconfig qcfg). */
static void check_step(const tu_ref_file *r, int k, int j, int qcfg, qcal_observer *obs)
{
    const tu_ref_arr *h = tu_ref_get(r, "case%d/b%d/hist", k, j);
    const float *rg = tu_ref_get(r, "case%d/b%d/range", k, j)->data;
    const int64_t *zp = tu_ref_get(r, "case%d/b%d/zp", k, j)->data;
    int64_t bins = (int64_t)h->count, n = 0;
    float *c = malloc((size_t)bins * sizeof *c);
    assert_non_null(c);
    float mn, mx;
    assert_int_equal(qcal_observer_histogram_torch_get(obs, bins, c, &mn, &mx, &n), QCAL_OK);
    assert_int_equal(n, bins);
    const float *want = h->data;
    int64_t worst = -1;
    for (int64_t i = 0; i < bins; i++)
        if (memcmp(&c[i], &want[i], 4) != 0 && worst < 0)
            worst = i;
    if (worst >= 0 || mn != rg[0] || mx != rg[1]) {
        print_error("case %d batch %d: bin %lld is %.9g, torch %.9g; range [%.9g, %.9g], "
                    "torch [%.9g, %.9g]\n", k, j, (long long)worst,
                    worst >= 0 ? (double)c[worst] : 0.0, worst >= 0 ? (double)want[worst] : 0.0,
                    (double)mn, (double)mx, (double)rg[0], (double)rg[1]);
        fail();
    }
    free(c);
    float s;
    int32_t z;
    int64_t ch;
    assert_int_equal(tu_observer_qparams(obs, 1, &s, &z, NULL, &ch), QCAL_OK);
    /* quint8 + symmetric + reduce_range: torch's zero-point 128 lies outside its range
     * [0, 127]; qcal gives the midpoint 64 (docs/observers.md; qcal.torch returns 128). */
    if (qcfg == 2)
        assert_int_equal(zp[0], 128);
    int64_t want_zp = qcfg == 2 ? 64 : zp[0];
    if (s != rg[2] || z != want_zp) {
        print_error("case %d batch %d: qparams (%.9g, %d), torch (%.9g, %lld)\n", k, j,
                    (double)s, (int)z, (double)rg[2], (long long)zp[0]);
        fail();
    }
}

static void test_torch_reference(void **state)
{
    (void)state;
    tu_ref_file *r = tu_ref_load("histogram", "torch.bin");
    int ncases = (int)((int64_t *)tu_ref_get(r, "ncases")->data)[0];
    assert_true(ncases >= 10);
    int steps = 0;
    for (int k = 0; k < ncases; k++) {
        const tu_ref_arr *sa = tu_ref_get(r, "case%d/spec", k);
        const double *sp = sa->data;
        int bins = (int)sp[0], qcfg = (int)sp[1], nb = (int)sp[2];
        assert_int_equal(sa->count, 3 + 5 * (uint64_t)nb);
        qcal_observer *obs = make_obs(bins, qcfg);
        for (int j = 0; j < nb; j++) {
            const double *b = sp + 3 + 5 * j;
            int64_t n = (int64_t)b[0];
            float *x = make_batch(n, (int)b[1], (float)b[2], (float)b[3], (uint64_t)b[4]);
            assert_int_equal(qcal_observer_update(obs, tu_vec(x, n)), QCAL_OK);
            free(x);
            check_step(r, k, j, qcfg, obs);
            if (j == 0) {
                /* Save / load mid-sequence: the loaded observer continues identically. */
                void *buf = NULL;
                size_t len = 0;
                qcal_observer *o2 = NULL;
                assert_int_equal(qcal_observer_save(obs, &buf, &len), QCAL_OK);
                assert_int_equal(qcal_observer_load(buf, len, &o2), QCAL_OK);
                free(buf);
                qcal_observer_destroy(&obs);
                obs = o2;
            }
            steps++;
        }
        qcal_observer_destroy(&obs);
    }
    assert_true(steps >= 35);
    tu_ref_free(r);
}

static void test_merge_and_buffers(void **state)
{
    (void)state;
    qcal_observer *a = make_obs(64, 0), *b = make_obs(64, 0), *e = make_obs(64, 0);
    float *x = make_batch(500, 0, 2.0f, 0.0f, 7);
    assert_int_equal(qcal_observer_update(a, tu_vec(x, 500)), QCAL_OK);
    assert_int_equal(qcal_observer_update(b, tu_vec(x, 250)), QCAL_OK);
    /* Both non-empty: refused, dst unchanged. */
    assert_int_equal(qcal_observer_merge(a, b), QCAL_ERR_UNSUPPORTED);
    assert_non_null(strstr(qcal_last_error(), "batch order"));
    /* An empty side: the result is the other side. */
    assert_int_equal(qcal_observer_merge(a, e), QCAL_OK);
    assert_int_equal(qcal_observer_merge(e, a), QCAL_OK);
    float ca[64], ce[64], mna, mxa, mne, mxe;
    int64_t n;
    assert_int_equal(qcal_observer_histogram_torch_get(a, 64, ca, &mna, &mxa, &n), QCAL_OK);
    assert_int_equal(qcal_observer_histogram_torch_get(e, 64, ce, &mne, &mxe, &n), QCAL_OK);
    assert_memory_equal(ca, ce, sizeof ca);
    assert_true(mna == mne && mxa == mxe);
    /* Buffers in: a copy of a's buffers gives a's qparams. */
    qcal_observer *c = make_obs(64, 0);
    assert_int_equal(qcal_observer_histogram_torch_set(c, ca, 64, mna, mxa), QCAL_OK);
    float s1, s2;
    int32_t z1, z2;
    int64_t ch;
    assert_int_equal(tu_observer_qparams(a, 1, &s1, &z1, NULL, &ch), QCAL_OK);
    assert_int_equal(tu_observer_qparams(c, 1, &s2, &z2, NULL, &ch), QCAL_OK);
    assert_true(s1 == s2 && z1 == z2);
    /* Bad buffers are refused, observer unchanged. */
    ca[3] = -1.0f;
    assert_int_equal(qcal_observer_histogram_torch_set(c, ca, 64, mna, mxa), QCAL_ERR_FORMAT);
    ca[3] = 0.0f;
    assert_int_equal(qcal_observer_histogram_torch_set(c, ca, 63, mna, mxa),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_observer_histogram_torch_set(c, ca, 64, mxa, mna), QCAL_ERR_FORMAT);
    assert_int_equal(qcal_observer_histogram_torch_set(c, ca, 64, NAN, mxa), QCAL_ERR_FORMAT);
    assert_int_equal(tu_observer_qparams(c, 1, &s2, &z2, NULL, &ch), QCAL_OK);
    assert_true(s1 == s2 && z1 == z2);
    /* Lattice observers have no torch buffers. */
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    qcal_observer *l = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &l), QCAL_OK);
    assert_int_equal(qcal_observer_histogram_torch_get(l, 64, ca, &mna, &mxa, &n),
                     QCAL_ERR_INVALID_ARG);
    qcal_observer_destroy(&l);
    free(x);
    qcal_observer_destroy(&a);
    qcal_observer_destroy(&b);
    qcal_observer_destroy(&c);
    qcal_observer_destroy(&e);
}

static void test_refusals(void **state)
{
    (void)state;
    qcal_observer_config cfg;
    qcal_observer *o = NULL;
    /* Only the histogram kind has a torch grid. */
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_PERCENTILE);
    cfg.grid = QCAL_GRID_TORCH;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_INVALID_ARG);
    assert_null(o);
    /* quint8 + per_tensor_symmetric + reduce_range: histogram yes, minmax no (as torch). */
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    cfg.q.reduce_range = true;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_UNSUPPORTED);
    cfg.kind = QCAL_OBSERVER_HISTOGRAM;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    qcal_observer_destroy(&o);
    /* Non-finite values: skipped and counted (PyTorch raises), or refused when strict. */
    o = make_obs(16, 0);
    float x[4] = { 1.0f, NAN, -2.0f, INFINITY };
    assert_int_equal(qcal_observer_update(o, tu_vec(x, 4)), QCAL_OK);
    uint64_t nf = 0;
    assert_int_equal(qcal_observer_nonfinite(o, &nf), QCAL_OK);
    assert_int_equal(nf, 2);
    float mn, mx;
    int64_t n;
    assert_int_equal(qcal_observer_data_range(o, 1, &mn, &mx, &n), QCAL_OK);
    assert_true(mn == -2.0f && mx == 1.0f);
    qcal_observer_destroy(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_reference),
        cmocka_unit_test(test_merge_and_buffers),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
