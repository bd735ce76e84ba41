/* unit.observers_lattice: the default (lattice) grid of the histogram family and the order
 * independence of every commuting observer kind.
 *  - property test: >= 1000 random partitions, orders and merge splits of the same data per
 *    kind and data set; the saved state (except the batch counter), the data range, and
 *    (every 25th trial) the qrange and qparams are bit-identical to one observer fed
 *    everything as one batch;
 *  - ranges inside the data;
 *  - single-batch fidelity: histogram scale within 1% of PyTorch 1.13's L2 search on a
 *    float-bounds torch.histc of the same data (tests/ref/gen_lattice.py ->
 *    tests/data/histogram/lattice.bin), and bit-identical with grid=first-batch;
 *  - lattice kernels: the C reference against the exact floor (AVX2 / AVX-512 against it:
 *    checkasm);
 *  - big batches (single-pass growth inside a batch, 1..4 threads) against small ones;
 *  - canonical payload: save/load round trip, corrupted payloads refused;
 *  - moving-average merges refused unless one side is empty;
 *  - introspection: the searched histogram's bins and the search's objective curve. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/cpu.h"
#include "observers/histogram_kinds.h"
#include "observers/histogram_lattice.h"
#include "observers/minmax_dsp.h"
#include "qcal/observers/histogram.h"
#include "qcal/qcal.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unif(void)
{
    return ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
}
static float rng_normal(void)
{
    double u1 = rng_unif(), u2 = rng_unif();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static int64_t rng_below(int64_t n)
{
    return (int64_t)(rng_next() % (uint64_t)n);
}

static uint32_t fbits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* ---- data sets ---- */
enum { NSETS = 7 };
static const char *const set_names[NSETS] = { "normal", "relu", "lognormal", "outliers",
                                              "bimodal", "mixed", "offset" };

static void gen_set(int s, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float z = rng_normal();
        switch (s) {
        case 0: x[i] = z; break;
        case 1: x[i] = z > 0.0f ? z * 3.0f : 0.0f; break;
        case 2: x[i] = (float)exp(z); break;
        case 3: x[i] = z * 20.0f; break;
        case 4: x[i] = (i & 1) ? -3.0f + 0.5f * z : 5.0f + z; break;
        case 5: x[i] = z * 1e-3f; break;
        default: x[i] = 1000.0f + z * 1e-3f; break;   /* narrow range far from zero */
        }
    }
    if (s == 3) {   /* outliers, as issue 11's example */
        x[n / 3] = 1200.0f;
        x[n / 2] = -800.0f;
        x[n - 5] = 950.0f;
    }
    if (s == 5) {   /* non-finite values, -0, denormals and tiny negatives */
        x[3] = NAN;
        x[10] = INFINITY;
        x[11] = -INFINITY;
        x[20] = -0.0f;
        x[21] = 0.0f;
        x[30] = -1e-40f;
        x[31] = 1e-42f;
        x[32] = -FLT_MIN;
    }
}

/* ---- helpers ---- */
static void feed_shape(qcal_observer *o, float *x, int32_t ndim, const int64_t *shape)
{
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, ndim, shape), QCAL_OK);
    qcal_status st = qcal_observer_update(o, &t);
    if (st != QCAL_OK)
        fail_msg("update failed: %s", qcal_last_error());
}

static qcal_observer *make(const qcal_observer_config *cfg)
{
    qcal_observer *o = NULL;
    if (qcal_observer_create(cfg, &o) != QCAL_OK)
        fail_msg("create: %s", qcal_last_error());
    return o;
}

/* Offset of the batch counter in a qcal_observer_save blob (docs/state.md: magic, version,
 * 76 bytes of config, nonfinite u64, batches u64). Checked against qcal_observer_batches
 * on every use. */
#define BATCHES_OFFSET 92

typedef struct snapshot {
    unsigned char *blob;
    size_t len;
    float dmn, dmx, qmn, qmx, scale;
    int32_t zp;
    int64_t n;
    qcal_status qst;
} snapshot;

/* Everything the observer reports; per-channel kinds: channel 0 of the qrange and every
 * channel through the blob. */
static void snap(qcal_observer *o, bool full, snapshot *s)
{
    void *buf = NULL;
    assert_int_equal(qcal_observer_save(o, &buf, &s->len), QCAL_OK);
    s->blob = buf;
    uint64_t nb, stored;
    assert_int_equal(qcal_observer_batches(o, &nb), QCAL_OK);
    assert_true(s->len >= BATCHES_OFFSET + 8);
    memcpy(&stored, s->blob + BATCHES_OFFSET, 8);
    if (stored != nb)
        fail_msg("observer blob layout changed: batch counter not at offset %d",
                 BATCHES_OFFSET);
    memset(s->blob + BATCHES_OFFSET, 0, 8);
    float mn[64], mx[64], sc[64];
    int32_t zp[64];
    int64_t n;
    qcal_observer_data_range(o, 64, mn, mx, &n);
    s->dmn = mn[0];
    s->dmx = mx[0];
    s->n = n;
    if (full) {
        s->qst = qcal_observer_qrange(o, 64, mn, mx, &n);
        s->qmn = mn[0];
        s->qmx = mx[0];
        tu_observer_qparams(o, 64, sc, zp, NULL, &n);
        s->scale = sc[0];
        s->zp = zp[0];
    }
}

static void snap_free(snapshot *s)
{
    qcal_free(s->blob);
    s->blob = NULL;
}

static void assert_same(const snapshot *a, const snapshot *b, bool full, const char *what,
                        int trial)
{
    if (a->len != b->len || memcmp(a->blob, b->blob, a->len) != 0)
        fail_msg("%s trial %d: saved state differs (%zu vs %zu bytes)", what, trial, a->len,
                 b->len);
    if (fbits(a->dmn) != fbits(b->dmn) || fbits(a->dmx) != fbits(b->dmx) || a->n != b->n)
        fail_msg("%s trial %d: data range differs", what, trial);
    if (full && (a->qst != b->qst || fbits(a->qmn) != fbits(b->qmn) ||
                 fbits(a->qmx) != fbits(b->qmx) || fbits(a->scale) != fbits(b->scale) ||
                 a->zp != b->zp))
        fail_msg("%s trial %d: qrange [%.9g, %.9g] scale %.9g zp %d vs [%.9g, %.9g] %.9g %d",
                 what, trial, (double)a->qmn, (double)a->qmx, (double)a->scale, (int)a->zp,
                 (double)b->qmn, (double)b->qmx, (double)b->scale, (int)b->zp);
}

/* ---- property test ---- */
typedef struct kind_case {
    qcal_observer_kind kind;
    qcal_percentile_mode mode;
    const char *name;
    bool sym;   /* qint8 per_tensor_symmetric target (|x| searches) instead of the default */
} kind_case;

static const kind_case kinds[] = {
    { QCAL_OBSERVER_MINMAX, 0, "minmax", false },
    { QCAL_OBSERVER_PER_CHANNEL_MINMAX, 0, "per_channel_minmax", false },
    { QCAL_OBSERVER_HISTOGRAM, 0, "histogram", false },
    { QCAL_OBSERVER_PERCENTILE, QCAL_PERCENTILE_ABS, "percentile", false },
    { QCAL_OBSERVER_PERCENTILE, QCAL_PERCENTILE_TWO_TAILS, "percentile two-tails", false },
    { QCAL_OBSERVER_PERCENTILE, QCAL_PERCENTILE_AUTO, "percentile auto", false },
    { QCAL_OBSERVER_ENTROPY, 0, "entropy", false },
    { QCAL_OBSERVER_MSE, 0, "mse", false },
    { QCAL_OBSERVER_ENTROPY, 0, "entropy symmetric", true },
    { QCAL_OBSERVER_MSE, 0, "mse symmetric", true },
};

enum { ROWS = 512, CH = 8, NVAL = ROWS * CH, TRIALS = 1000, FULL_EVERY = 25 };

/* Feeds rows [r0, r1) of x (ROWS x CH) as batches cut at random points. Per-tensor kinds
 * see the rows as a flat vector, per-channel kinds as (rows, CH) with axis -1. */
static void feed_rows(qcal_observer *o, float *x, int64_t r0, int64_t r1, bool pc)
{
    while (r0 < r1) {
        int64_t len = 1 + rng_below(r1 - r0 > 64 && rng_below(3) ? (r1 - r0) / 2 : r1 - r0);
        if (len > r1 - r0)
            len = r1 - r0;
        if (pc) {
            int64_t shape[2] = { len, CH };
            feed_shape(o, x + r0 * CH, 2, shape);
        } else {
            int64_t flat = len * CH;
            feed_shape(o, x + r0 * CH, 1, &flat);
        }
        r0 += len;
    }
}

static void shuffle_columns(float *x)
{
    for (int c = 0; c < CH; c++)
        for (int64_t r = ROWS - 1; r > 0; r--) {
            int64_t k = rng_below(r + 1);
            float t = x[r * CH + c];
            x[r * CH + c] = x[k * CH + c];
            x[k * CH + c] = t;
        }
}

static void shuffle_all(float *x)
{
    for (int64_t i = NVAL - 1; i > 0; i--) {
        int64_t k = rng_below(i + 1);
        float t = x[i];
        x[i] = x[k];
        x[k] = t;
    }
}

static void test_order_split_invariance(void **state)
{
    (void)state;
    float *data = malloc(NVAL * sizeof(float)), *x = malloc(NVAL * sizeof(float));
    assert_non_null(data);
    assert_non_null(x);
    for (size_t kc = 0; kc < sizeof kinds / sizeof kinds[0]; kc++) {
        const kind_case *K = &kinds[kc];
        bool pc = K->kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX;
        bool mm = K->kind == QCAL_OBSERVER_MINMAX || pc;
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, K->kind);
        cfg.percentile_mode = K->mode;
        if (K->sym) {
            cfg.q.dtype = QCAL_QINT8;
            cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        }
        if (pc)
            cfg.axis = -1;
        for (int s = 0; s < NSETS; s++) {
            rng_state = 0x1234567ull + (uint64_t)s * 7919u + kc;
            gen_set(s, data, NVAL);
            if (mm)   /* min/max kinds: -0.0 == +0.0 and either sign may be reported */
                for (int i = 0; i < NVAL; i++)
                    data[i] = data[i] + 0.0f;
            qcal_observer *ref = make(&cfg);
            memcpy(x, data, sizeof(float) * NVAL);
            feed_rows(ref, x, 0, ROWS, pc);
            snapshot want;
            snap(ref, true, &want);
            for (int t = 0; t < TRIALS; t++) {
                memcpy(x, data, sizeof(float) * NVAL);
                if (pc)
                    shuffle_columns(x);
                else
                    shuffle_all(x);
                /* Up to 4 observers over consecutive row ranges, merged in a random order
                 * into a random one of them (or into a fresh observer). */
                int nobs = 1 + (int)rng_below(4);
                qcal_observer *o[5] = { 0 };
                int64_t cut[6];
                cut[0] = 0;
                cut[nobs] = ROWS;
                for (int k = 1; k < nobs; k++)
                    cut[k] = rng_below(ROWS + 1);
                for (int k = 1; k < nobs; k++)   /* sort the cuts */
                    for (int m = k; m > 1 && cut[m - 1] > cut[m]; m--) {
                        int64_t tmp = cut[m];
                        cut[m] = cut[m - 1];
                        cut[m - 1] = tmp;
                    }
                for (int k = 0; k < nobs; k++) {
                    o[k] = make(&cfg);
                    feed_rows(o[k], x, cut[k], cut[k + 1], pc);
                }
                int order[4] = { 0, 1, 2, 3 };
                for (int k = nobs - 1; k > 0; k--) {
                    int m = (int)rng_below(k + 1), tmp = order[k];
                    order[k] = order[m];
                    order[m] = tmp;
                }
                qcal_observer *dst = o[order[0]];
                int first = 1;
                if (rng_below(4) == 0) {
                    o[4] = make(&cfg);
                    dst = o[4];
                    first = 0;
                }
                for (int k = first; k < nobs; k++) {
                    qcal_status st = qcal_observer_merge(dst, o[order[k]]);
                    if (st != QCAL_OK)
                        fail_msg("%s/%s merge: %s", K->name, set_names[s], qcal_last_error());
                }
                bool full = t % FULL_EVERY == 0;
                snapshot got;
                snap(dst, full, &got);
                char what[96];
                snprintf(what, sizeof what, "%s/%s", K->name, set_names[s]);
                assert_same(&want, &got, full, what, t);
                snap_free(&got);
                for (int k = 0; k < 5; k++)
                    qcal_observer_destroy(&o[k]);
            }
            snap_free(&want);
            qcal_observer_destroy(&ref);
        }
    }
    free(data);
    free(x);
}

/* ---- ranges inside the data ---- */
static void test_ranges_inside_data(void **state)
{
    (void)state;
    enum { N = 20000 };
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    const kind_case *hk = &kinds[2];
    for (int s = 0; s < NSETS; s++) {
        rng_state = 99 + (uint64_t)s;
        gen_set(s, x, N);
        float dmin = INFINITY, dmax = -INFINITY;
        for (int i = 0; i < N; i++)
            if (isfinite(x[i])) {
                dmin = fminf(dmin, x[i]);
                dmax = fmaxf(dmax, x[i]);
            }
        float amax = fmaxf(-dmin, dmax);
        for (size_t kc = 0; kc < 5; kc++) {
            const kind_case *K = &hk[kc];
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, K->kind);
            cfg.percentile_mode = K->mode;
            if (K->sym) {
                cfg.q.dtype = QCAL_QINT8;
                cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
            }
            qcal_observer *o = make(&cfg);
            /* Six batches, the outliers in a late one (issue 11's failing case). */
            for (int b = 0; b < 6; b++) {
                int64_t len = N / 6 + (b == 5 ? N % 6 : 0);
                feed_shape(o, x + b * (N / 6), 1, &len);
            }
            float mn, mx;
            int64_t n;
            assert_int_equal(qcal_observer_qrange(o, 1, &mn, &mx, &n), QCAL_OK);
            bool signed_kind = !qcal_histobs_lattice(o)->absval;
            if (signed_kind) {
                if (!(mn >= dmin && mx <= dmax && mn <= mx))
                    fail_msg("%s/%s: qrange [%.9g, %.9g] outside data [%.9g, %.9g]", K->name,
                             set_names[s], (double)mn, (double)mx, (double)dmin,
                             (double)dmax);
            } else {
                if (!(mx <= amax && mx >= 0.0f && (dmin < 0.0f ? mn == -mx : mn == 0.0f)))
                    fail_msg("%s/%s: qrange [%.9g, %.9g], max|x| %.9g, min %.9g", K->name,
                             set_names[s], (double)mn, (double)mx, (double)amax,
                             (double)dmin);
            }
            float dmn, dmx;
            assert_int_equal(qcal_observer_data_range(o, 1, &dmn, &dmx, &n), QCAL_OK);
            if (signed_kind)
                assert_true(dmn == dmin && dmx == dmax);
            else
                assert_true(dmx == amax && dmn == (dmin < 0.0f ? -amax : 0.0f));
            qcal_observer_destroy(&o);
        }
    }
    free(x);
}

/* ---- fidelity vs PyTorch ---- */
static void test_fidelity_vs_pytorch(void **state)
{
    (void)state;
    tu_ref_file *r = tu_ref_load("histogram", "lattice.bin");
    int n = (int)((int64_t *)tu_ref_get(r, "ncases")->data)[0];
    assert_int_equal(n, 6);
    static const char *names[6] = { "normal", "relu", "lognormal", "outlier", "bimodal",
                                    "skewed" };
    for (int k = 0; k < n; k++) {
        const tu_ref_arr *xa = tu_ref_get(r, "case%d/x", k);
        const float *out = tu_ref_get(r, "case%d/out", k)->data;
        const int64_t *zp = tu_ref_get(r, "case%d/zp", k)->data;
        for (int g = 0; g < 2; g++) {
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
            cfg.grid = g ? QCAL_GRID_FIRST_BATCH : QCAL_GRID_LATTICE;
            qcal_observer *o = make(&cfg);
            int64_t len = (int64_t)xa->count;
            feed_shape(o, xa->data, 1, &len);
            float s;
            int32_t z;
            int64_t m;
            assert_int_equal(tu_observer_qparams(o, 1, &s, &z, NULL, &m), QCAL_OK);
            double dev = (double)s / (double)out[2] - 1.0;
            print_message("%-9s %-11s scale %.7g (PyTorch %.7g, %+.4f%%) zp %d (%d)\n", names[k],
                          g ? "first-batch" : "lattice", (double)s, (double)out[2],
                          100.0 * dev, (int)z, (int)zp[0]);
            if (g) {   /* the first-batch grid is PyTorch's histogram: bit-identical */
                assert_int_equal(fbits(s), fbits(out[2]));
                assert_int_equal(z, zp[0]);
            } else if (!(fabs(dev) < 0.01)) {
                fail_msg("%s: lattice scale %.9g is %.3f%% from PyTorch's %.9g", names[k],
                         (double)s, 100.0 * dev, (double)out[2]);
            }
            qcal_observer_destroy(&o);
        }
    }
    tu_ref_free(r);
}

/* ---- kernels ---- */
/* The C reference of the lattice kernels against the exact floor in double, and its fused
 * version against its halves (min / max / non-finite as qcal_f32_minmax__c; counts as the
 * plain kernel when binned). Every SIMD version is checked bit for bit against this
 * reference by unit.checkasm. */
static void test_kernel_c_reference(void **state)
{
    (void)state;
    enum { N = 3001 };
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    const int32_t accepts[3] = { 1, 64, 4096 };
    for (int trial = 0; trial < 60; trial++) {
        rng_state = 4242 + (uint64_t)trial;
        int s = trial % NSETS;
        gen_set(s, x, N);
        /* A few edge values: exact cell edges, denormals, huge, -0. */
        x[100] = -0.0f;
        x[101] = -1e-45f;
        x[102] = 3e38f;
        x[103] = -3e38f;
        x[104] = 0.5f;
        x[105] = -0.5f;
        qcal_lattice_grid g;
        g.absval = trial & 1;
        int32_t e = (int32_t)rng_below(40) - 20;
        if (trial % 7 == 0)
            e = 140;   /* 2^-e subnormal: products underflow */
        g.scale = ldexpf(1.0f, -e);
        g.accept = accepts[trial % 3];
        g.jlo = g.absval ? 0 : -(int32_t)rng_below(g.accept + 1);
        int64_t n = 1 + rng_below(N);
        uint64_t want[4096], got[4096], wi[4096];
        qcal_hist_sub *sub = calloc(QCAL_HIST_SUB_COPIES * (4096 + 1), sizeof *sub);
        assert_non_null(sub);
        memset(want, 0, sizeof want);
        qcal_f32_lattice_bin__c(x, n, &g, want, sub);
        for (size_t i = 0; i < QCAL_HIST_SUB_COPIES * (4096 + 1); i++)
            assert_int_equal(sub[i], 0);
        memset(got, 0, sizeof got);
        bool all_in = true;
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(x[i]))
                continue;
            double v = g.absval ? fabs((double)x[i]) : (double)x[i];
            double j = floor(ldexp(v, -e)) - g.jlo;
            if (j >= 0 && j < g.accept)
                got[(int64_t)j]++;
            else
                all_in = false;
        }
        if (memcmp(want, got, sizeof(uint64_t) * (size_t)g.accept))
            fail_msg("C lattice kernel differs from the exact floor (trial %d, e %d)", trial,
                     (int)e);
        /* lattice_bin_until: bins whole chunks up to the first one holding a finite value
         * outside; its counts and min / max / non-finite are those of that prefix. */
        int64_t first_out = n;
        for (int64_t i = 0; i < n && first_out == n; i++) {
            if (!isfinite(x[i]))
                continue;
            double v = g.absval ? fabs((double)x[i]) : (double)x[i];
            double j = floor(ldexp(v, -e)) - g.jlo;
            if (!(j >= 0 && j < g.accept))
                first_out = i;
        }
        int64_t upto = first_out == n ? n : first_out / QCAL_HIST_CH * QCAL_HIST_CH;
        assert_int_equal(all_in, first_out == n);
        float wl, wh, rl, rh;
        uint64_t wb, rb, pre[4096];
        memset(wi, 0, sizeof wi);
        int64_t got_upto = qcal_f32_lattice_bin_until__c(x, n, &g, wi, sub, &wl, &wh, &wb);
        assert_int_equal(got_upto, upto);
        qcal_f32_minmax__c(x, upto, &rl, &rh, &rb);
        assert_true(fbits(wl) == fbits(rl) && fbits(wh) == fbits(rh));
        assert_int_equal(wb, rb);
        memset(pre, 0, sizeof pre);
        qcal_f32_lattice_bin__c(x, upto, &g, pre, sub);
        if (memcmp(wi, pre, sizeof(uint64_t) * (size_t)g.accept))
            fail_msg("C lattice_bin_until differs from binning its prefix (trial %d)", trial);
        if (all_in && memcmp(wi, want, sizeof(uint64_t) * (size_t)g.accept))
            fail_msg("C lattice_bin_until differs from the plain kernel (trial %d)", trial);
        for (size_t i = 0; i < QCAL_HIST_SUB_COPIES * (4096 + 1); i++)
            assert_int_equal(sub[i], 0);
        free(sub);
    }
    free(x);
}

/* ---- big batches: single-pass growth, threads ---- */

/* Batches of 128K values or more are binned in one pass that grows the lattice where a
 * chunk goes outside it, one window per thread; smaller ones take the two-pass path (at most
 * 1024 values without scratch). Every path must give the state of any other split: the same
 * data as one batch on 1..4 threads, as two batches, and as 1000- and 100,000-value batches
 * all save the same bytes. */
static void gen_growing(int s, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float z = rng_normal();
        double f = (double)i / (double)n;
        switch (s) {
        case 0: x[i] = z * (float)(1.0 + 8.0 * f); break;            /* growing range */
        case 1: x[i] = (float)(-5.0 + 1e3 * f * f); break;           /* sorted: grows always */
        case 2: x[i] = (float)(3.0 - 1e5 * f); break;                /* sorted descending */
        case 3: x[i] = z > 0.0f ? z * (float)(1.0 + 50.0 * f) : 0.0f; break;   /* ReLU */
        default:   /* magnitudes 2^-100..2^100, either sign */
            x[i] = ldexpf(z < 0.0f ? -1.0f : 1.0f, (int)rng_below(201) - 100);
            break;
        }
        if (rng_below(5000) == 0)
            x[i] = rng_below(3) == 0 ? NAN : (rng_below(2) ? INFINITY : -INFINITY);
    }
    x[n - 1] = s == 2 ? -2e6f : 1e6f;   /* an outlier in the last chunk */
}

static void test_big_batches(void **state)
{
    (void)state;
    enum { N = 700001 };
    static const kind_case big_kinds[] = {
        { QCAL_OBSERVER_HISTOGRAM, 0, "histogram", false },
        { QCAL_OBSERVER_ENTROPY, 0, "entropy", false },
    };
    float *x = malloc(N * sizeof *x);
    assert_non_null(x);
    int saved_threads = qcal_threads_count();
    for (size_t kc = 0; kc < sizeof big_kinds / sizeof big_kinds[0]; kc++) {
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, big_kinds[kc].kind);
        for (int s = 0; s < 5; s++) {
            rng_state = 0xB16B00B5ull + (uint64_t)s * 131u + kc;
            gen_growing(s, x, N);
            char what[64];
            snprintf(what, sizeof what, "%s/growing set %d", big_kinds[kc].name, s);
            /* Reference: a first big batch (the empty-lattice start), then 1000-value
             * batches (each at most 1024: the two-pass path). */
            qcal_observer *ref = make(&cfg);
            int64_t first = 3000;
            feed_shape(ref, x, 1, &first);
            for (int64_t at = first; at < N; at += 1000) {
                int64_t len = N - at < 1000 ? N - at : 1000;
                feed_shape(ref, x + at, 1, &len);
            }
            snapshot want;
            snap(ref, true, &want);
            for (int threads = 1; threads <= 4; threads++) {
                assert_int_equal(qcal_threads_set_count(threads), QCAL_OK);
                /* one batch; two single-pass batches; a two-pass batch (50,017 values)
                 * then a single-pass one; two-pass batches of 100,000 */
                for (int split = 0; split < 4; split++) {
                    qcal_observer *o = make(&cfg);
                    int64_t cut = split == 0 ? N : split == 1 ? N / 3 + 17 : 50017;
                    if (split == 3)
                        cut = 0;
                    if (cut > 0)
                        feed_shape(o, x, 1, &cut);
                    if (split == 3) {
                        for (int64_t at = 0; at < N; at += 100000) {
                            int64_t len = N - at < 100000 ? N - at : 100000;
                            feed_shape(o, x + at, 1, &len);
                        }
                    } else if (cut < N) {
                        int64_t rest = N - cut;
                        feed_shape(o, x + cut, 1, &rest);
                    }
                    snapshot got;
                    snap(o, true, &got);
                    assert_same(&want, &got, true, what, threads * 10 + split);
                    snap_free(&got);
                    qcal_observer_destroy(&o);
                }
            }
            /* Non-finite policy error: refused, state unchanged. */
            qcal_observer_config ec = cfg;
            ec.nonfinite = QCAL_NONFINITE_ERROR;
            qcal_observer *e = make(&ec);
            int64_t half = N / 2, all = N;
            float keep = x[N / 2 + 5];
            x[N / 2 + 5] = NAN;
            qcal_tensor t;
            bool any_nonfinite = false;
            for (int64_t i = 0; i < half && !any_nonfinite; i++)
                any_nonfinite = !isfinite(x[i]);
            if (!any_nonfinite) {
                feed_shape(e, x, 1, &half);
                snapshot before, after;
                snap(e, true, &before);
                assert_int_equal(qcal_tensor_init(&t, x, 1, &all), QCAL_OK);
                assert_int_equal(qcal_observer_update(e, &t), QCAL_ERR_NONFINITE);
                snap(e, true, &after);
                assert_same(&before, &after, true, what, -1);
                snap_free(&before);
                snap_free(&after);
            }
            x[N / 2 + 5] = keep;
            qcal_observer_destroy(&e);
            snap_free(&want);
            qcal_observer_destroy(&ref);
        }
    }
    assert_int_equal(qcal_threads_set_count(saved_threads), QCAL_OK);
    free(x);
}

/* ---- canonical payload ---- */
static void test_payload(void **state)
{
    (void)state;
    enum { N = 5000 };
    float x[N];
    rng_state = 77;
    gen_set(0, x, N);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    qcal_observer *o = make(&cfg);
    int64_t n = N;
    feed_shape(o, x, 1, &n);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_observer_save(o, &buf, &len), QCAL_OK);
    qcal_observer *p = NULL;
    assert_int_equal(qcal_observer_load(buf, len, &p), QCAL_OK);
    void *buf2 = NULL;
    size_t len2 = 0;
    assert_int_equal(qcal_observer_save(p, &buf2, &len2), QCAL_OK);
    assert_int_equal(len, len2);
    assert_memory_equal(buf, buf2, len);
    /* Size: 108-byte header + 36-byte lattice header + 8 bytes per cell (<= 2 * bins). */
    assert_true(len <= 108 + 36 + 8 * 4096);
    print_message("histogram state of %d normal values: %zu bytes\n", N, len);
    /* Every single-byte corruption of the lattice payload is refused or loads into a state
     * that saves back to the same bytes (never a crash, never a silent other state). */
    unsigned char *c = malloc(len);
    assert_non_null(c);
    for (size_t off = 100; off < 108 + 36 + 16; off++) {
        memcpy(c, buf, len);
        c[off] ^= 0x5a;
        qcal_observer *q = NULL;
        qcal_status st = qcal_observer_load(c, len, &q);
        if (st == QCAL_OK) {
            void *b3 = NULL;
            size_t l3 = 0;
            assert_int_equal(qcal_observer_save(q, &b3, &l3), QCAL_OK);
            assert_int_equal(l3, len);
            assert_memory_equal(b3, c, len);
            qcal_free(b3);
            qcal_observer_destroy(&q);
        } else {
            assert_int_equal(st, QCAL_ERR_FORMAT);
        }
    }
    /* Truncations. */
    for (size_t cut = 100; cut < len; cut += 997) {   /* 100: payload length, 108: payload */
        qcal_observer *q = NULL;
        assert_int_equal(qcal_observer_load(buf, cut, &q), QCAL_ERR_FORMAT);
    }
    free(c);
    qcal_free(buf);
    qcal_free(buf2);
    qcal_observer_destroy(&o);
    qcal_observer_destroy(&p);
    /* Merging grids of different kinds of grid is a config mismatch naming both. */
    qcal_observer_config c2 = cfg;
    c2.grid = QCAL_GRID_FIRST_BATCH;
    qcal_observer *a = make(&cfg), *b = make(&c2);
    assert_int_equal(qcal_observer_merge(a, b), QCAL_ERR_MISMATCH);
    qcal_observer_destroy(&a);
    qcal_observer_destroy(&b);
}

/* ---- introspection for reports ---- */
static void test_introspection(void **state)
{
    (void)state;
    enum { N = 30000 };
    float *x = malloc(N * sizeof(float));
    assert_non_null(x);
    rng_state = 5150;
    gen_set(3, x, N);   /* outliers */
    const kind_case *hk = &kinds[2];
    double *edges = malloc(2049 * sizeof(double)), *err = malloc(2049 * sizeof(double));
    uint64_t *counts = malloc(2048 * sizeof(uint64_t));
    float *lo = malloc(2049 * sizeof(float)), *hi = malloc(2049 * sizeof(float));
    for (int g = 0; g < 2; g++)
        for (size_t kc = 0; kc < 5; kc++) {
            const kind_case *K = &hk[kc];
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, K->kind);
            cfg.percentile_mode = K->mode;
            if (K->sym) {
                cfg.q.dtype = QCAL_QINT8;
                cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
            }
            cfg.grid = g ? QCAL_GRID_FIRST_BATCH : QCAL_GRID_LATTICE;
            qcal_observer *o = make(&cfg);
            int64_t n, chosen;
            assert_int_equal(qcal_observer_histogram_bins(o, 2048, edges, counts, &n),
                             QCAL_NO_DATA);
            for (int b = 0; b < 3; b++) {
                int64_t len = N / 3;
                feed_shape(o, x + b * len, 1, &len);
            }
            assert_int_equal(qcal_observer_histogram_bins(o, 2047, edges, counts, &n),
                             QCAL_ERR_INVALID_ARG);
            assert_int_equal(qcal_observer_histogram_bins(o, 2048, edges, counts, &n), QCAL_OK);
            assert_int_equal(n, 2048);
            uint64_t total = 0;
            for (int i = 0; i < 2048; i++) {
                total += counts[i];
                assert_true(edges[i] < edges[i + 1]);
            }
            assert_int_equal(total, N);
            float qmn, qmx, dmn, dmx;
            int64_t one;
            assert_int_equal(qcal_observer_qrange(o, 1, &qmn, &qmx, &one), QCAL_OK);
            assert_int_equal(qcal_observer_data_range(o, 1, &dmn, &dmx, &one), QCAL_OK);
            if (!g) {   /* lattice: the bins cover exactly the data range */
                bool abs_kind = qcal_histobs_lattice(o)->absval;
                bool zero_kind = !abs_kind && (K->kind == QCAL_OBSERVER_ENTROPY ||
                                                K->kind == QCAL_OBSERVER_MSE);
                assert_true(edges[0] == (abs_kind    ? 0.0
                                         : zero_kind ? fmin(0.0, (double)dmn)
                                                     : (double)dmn));
                assert_true(edges[2048] == (zero_kind ? fmax(0.0, (double)dmx) : (double)dmx));
            }
            qcal_status st = qcal_observer_histogram_search_curve(o, 2049, lo, hi, err, &n, &chosen);
            if (K->kind == QCAL_OBSERVER_PERCENTILE) {
                assert_int_equal(st, QCAL_ERR_UNSUPPORTED);
                qcal_observer_destroy(&o);
                continue;
            }
            assert_int_equal(st, QCAL_OK);
            assert_true(n >= 1 && n <= 2049 && chosen >= 0 && chosen < n);
            /* The chosen candidate is what qrange reports, and it is a minimum of the
             * curve (entropy, mse: the global one; L2: the last accepted step). */
            if (fbits(lo[chosen]) != fbits(qmn) || fbits(hi[chosen]) != fbits(qmx))
                fail_msg("%s grid %d: chosen [%.9g, %.9g], qrange [%.9g, %.9g]", K->name, g,
                         (double)lo[chosen], (double)hi[chosen], (double)qmn, (double)qmx);
            for (int64_t k = 0; k < n; k++) {
                if (K->kind == QCAL_OBSERVER_HISTOGRAM)
                    assert_true(k > chosen || err[k] <= (k ? err[k - 1] : INFINITY));
                else
                    assert_true(err[k] >= err[chosen]);
            }
            print_message("%s/%s: %lld candidates, chosen %lld [%.6g, %.6g] err %.6g\n",
                          K->name, g ? "first-batch" : "lattice", (long long)n,
                          (long long)chosen, (double)lo[chosen], (double)hi[chosen],
                          err[chosen]);
            qcal_observer_destroy(&o);
        }
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    qcal_observer *m = make(&cfg);
    int64_t n, chosen;
    assert_int_equal(qcal_observer_histogram_bins(m, 2048, edges, counts, &n),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_observer_histogram_search_curve(m, 2049, lo, hi, err, &n, &chosen),
                     QCAL_ERR_INVALID_ARG);
    qcal_observer_destroy(&m);
    free(x);
    free(edges);
    free(err);
    free(counts);
    free(lo);
    free(hi);
}

/* ---- moving averages ---- */
static void test_moving_average_merge_refused(void **state)
{
    (void)state;
    const qcal_observer_kind ks[2] = { QCAL_OBSERVER_MOVING_AVERAGE_MINMAX,
                                       QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX };
    float x[8] = { 1, -2, 3, 4, -5, 6, 7, 8 };
    int64_t shape[2] = { 2, 4 };
    for (int k = 0; k < 2; k++) {
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, ks[k]);
        qcal_observer *a = make(&cfg), *b = make(&cfg), *e = make(&cfg);
        feed_shape(a, x, 2, shape);
        feed_shape(b, x + 4, 1, shape + 1);
        feed_shape(b, x, 1, shape + 1);
        assert_int_equal(qcal_observer_merge(a, e), QCAL_OK);
        assert_int_equal(qcal_observer_merge(a, b), QCAL_ERR_UNSUPPORTED);
        assert_non_null(strstr(qcal_last_error(), "a moving average depends on the order"));
        assert_int_equal(qcal_observer_merge(e, b), QCAL_OK);   /* into an empty one */
        float m1, M1, m2, M2;
        int64_t n;
        qcal_observer_data_range(e, 1, &m1, &M1, &n);
        qcal_observer_data_range(b, 1, &m2, &M2, &n);
        assert_true(m1 == m2 && M1 == M2);
        qcal_observer_destroy(&a);
        qcal_observer_destroy(&b);
        qcal_observer_destroy(&e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_c_reference),
        cmocka_unit_test(test_fidelity_vs_pytorch),
        cmocka_unit_test(test_ranges_inside_data),
        cmocka_unit_test(test_payload),
        cmocka_unit_test(test_moving_average_merge_refused),
        cmocka_unit_test(test_introspection),
        cmocka_unit_test(test_order_split_invariance),
        cmocka_unit_test(test_big_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
