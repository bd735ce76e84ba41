/* unit.observers_minmax: the four min/max observer kinds against PyTorch 1.13 (golden),
 * merge / reset / save-load / non-finite policy / argument errors, and the min/max kernels
 * (threaded entry points on every ISA, per-channel layouts, a > 2^31-element view; each SIMD
 * kernel against its C reference is tests/checkasm.c). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <cmocka.h>

#include "core/cpu.h"
#include "minmax_ref_reader.h"
#include "observers/minmax_kernels.h"
#include "qcal/qcal.h"
#include "testutil.h"

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}
static float rndf(void)   /* roughly N(0, 1)-ish, never exactly 0 */
{
    float s = 0;
    for (int i = 0; i < 4; i++)
        s += (float)(rnd() & 0xffffff) / 16777216.0f - 0.5f;
    return s * 1.7320508f + 1e-7f;
}

static void set_isa(const char *isa)
{
    if (isa)
        setenv("QCAL_ISA", isa, 1);
    else
        unsetenv("QCAL_ISA");
    qcal_cpu_reset();
}

/* ---- golden ------------------------------------------------------------------------ */

static void test_golden(void **state)
{
    (void)state;
    static const char *isas[] = { "c", NULL };
    ref_data d;
    assert_int_equal(ref_load(&d), 0);
    for (int ii = 0; ii < 2; ii++) {
        set_isa(isas[ii]);
        int checked = 0;
        for (int i = 0; i < d.ncases; i++) {
            const ref_case *c = &d.cases[i];
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, c->kind);
            cfg.q = c->q;
            cfg.axis = c->axis;
            cfg.averaging_constant = c->avgc;
            qcal_observer *obs = NULL;
            if (qcal_observer_create(&cfg, &obs) != QCAL_OK)
                fail_msg("case %d (%s): create: %s", i, c->line, qcal_last_error());
            const ref_input *in = &d.in[c->input];
            for (int b = 0; b < in->nb; b++) {
                qcal_tensor t;
                assert_int_equal(qcal_tensor_init(&t, in->b[b].x, in->b[b].ndim, in->b[b].shape),
                                 QCAL_OK);
                assert_int_equal(qcal_observer_update(obs, &t), QCAL_OK);
            }
            float mn[REF_MAX_CH], mx[REF_MAX_CH], s[REF_MAX_CH], zf[REF_MAX_CH];
            int32_t z[REF_MAX_CH];
            int64_t n = 0;
            assert_int_equal(qcal_observer_data_range(obs, REF_MAX_CH, mn, mx, &n), QCAL_OK);
            assert_int_equal(n, c->nch);
            for (int k = 0; k < n; k++)
                if (ref_bits(mn[k]) != ref_bits(c->mn[k]) || ref_bits(mx[k]) != ref_bits(c->mx[k]))
                    fail_msg("case %d (%s) channel %d: range [%.9g, %.9g] != PyTorch [%.9g, %.9g]",
                             i, c->line, k, (double)mn[k], (double)mx[k], (double)c->mn[k],
                             (double)c->mx[k]);
            assert_int_equal(tu_observer_qparams(obs, REF_MAX_CH, s, z, zf, &n), QCAL_OK);
            assert_int_equal(n, c->nch);
            bool fz = c->q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
            for (int k = 0; k < n; k++) {
                if (ref_bits(s[k]) != ref_bits(c->scale[k]))
                    fail_msg("case %d (%s) channel %d: scale %.9g != PyTorch %.9g", i, c->line,
                             k, (double)s[k], (double)c->scale[k]);
                if (fz && ref_bits(zf[k]) != ref_bits(c->zpf[k]))
                    fail_msg("case %d (%s) channel %d: zero-point %.9g != PyTorch %.9g", i,
                             c->line, k, (double)zf[k], (double)c->zpf[k]);
                if (!fz && !ref_qint32_overflow_case(c, k) && z[k] != c->zp[k])
                    fail_msg("case %d (%s) channel %d: zero-point %d != PyTorch %d", i, c->line,
                             k, z[k], c->zp[k]);
                checked++;
            }
            qcal_observer_destroy(&obs);
            assert_null(obs);
        }
        print_message("observers golden (%s): %d cases, %d channels bit-equal\n",
                      isas[ii] ? isas[ii] : "best ISA", d.ncases, checked);
    }
    set_isa(NULL);
    ref_free(&d);
}

/* ---- behaviour ----------------------------------------------------------------------- */

static qcal_observer *make(qcal_observer_kind kind, int32_t axis)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);
    cfg.axis = axis;
    cfg.averaging_constant = 0.25f;
    qcal_observer *o = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    return o;
}

static void feed(qcal_observer *o, float *x, int32_t ndim, const int64_t *shape)
{
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, ndim, shape), QCAL_OK);
    assert_int_equal(qcal_observer_update(o, &t), QCAL_OK);
}

static void range_of(const qcal_observer *o, float *mn, float *mx, int64_t *n)
{
    qcal_status st = qcal_observer_data_range(o, 64, mn, mx, n);
    assert_true(st == QCAL_OK || st == QCAL_NO_DATA);
}

static void assert_same_state(const qcal_observer *a, const qcal_observer *b)
{
    float am[64], aM[64], bm[64], bM[64];
    int64_t an, bn;
    range_of(a, am, aM, &an);
    range_of(b, bm, bM, &bn);
    assert_int_equal(an, bn);
    for (int64_t k = 0; k < an; k++) {
        assert_int_equal(ref_bits(am[k]), ref_bits(bm[k]));
        assert_int_equal(ref_bits(aM[k]), ref_bits(bM[k]));
    }
}

static void test_merge_exact(void **state)
{
    (void)state;
    rng_state = 7;
    float x[2][6 * 5 * 7];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 6 * 5 * 7; i++)
            x[h][i] = rndf() * (float)(h + 1);
    const int64_t shape[3] = { 6, 5, 7 };
    for (int kind = 0; kind < 4; kind++) {
        for (int32_t axis = -1; axis <= 1; axis++) {
            qcal_observer *all = make((qcal_observer_kind)kind, axis);
            qcal_observer *a = make((qcal_observer_kind)kind, axis);
            qcal_observer *b = make((qcal_observer_kind)kind, axis);
            qcal_observer *empty = make((qcal_observer_kind)kind, axis);
            feed(all, x[0], 3, shape);
            feed(all, x[1], 3, shape);
            feed(a, x[0], 3, shape);
            feed(b, x[1], 3, shape);
            /* Empty sides are exact for every kind. */
            assert_int_equal(qcal_observer_merge(a, empty), QCAL_OK);
            assert_int_equal(qcal_observer_merge(empty, a), QCAL_OK);
            assert_same_state(a, empty);
            bool moving = kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
                          kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
            uint64_t nb;
            if (moving) {
                /* Moving averages depend on batch order: merging two observers that both
                 * saw data is refused and leaves dst as it was. */
                assert_int_equal(qcal_observer_merge(a, b), QCAL_ERR_UNSUPPORTED);
                assert_non_null(strstr(qcal_last_error(), "order"));
                assert_same_state(a, empty);
                assert_int_equal(qcal_observer_batches(a, &nb), QCAL_OK);
                assert_int_equal(nb, 1);
            } else {
                assert_int_equal(qcal_observer_merge(a, b), QCAL_OK);
                /* minmax kinds: merged == fed everything. */
                assert_same_state(a, all);
                assert_int_equal(qcal_observer_batches(a, &nb), QCAL_OK);
                assert_int_equal(nb, 2);
            }
            assert_int_equal(qcal_observer_merge(a, a), QCAL_ERR_INVALID_ARG);
            qcal_observer_destroy(&all);
            qcal_observer_destroy(&a);
            qcal_observer_destroy(&b);
            qcal_observer_destroy(&empty);
        }
    }
    /* Config mismatch and channel-count mismatch. */
    qcal_observer *p = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX, 0);
    qcal_observer *q = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX, 0);
    qcal_observer *r = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX, 1);
    feed(p, x[0], 3, shape);
    const int64_t shape2[3] = { 5, 6, 7 };
    feed(q, x[0], 3, shape2);
    assert_int_equal(qcal_observer_merge(p, q), QCAL_ERR_MISMATCH);
    assert_int_equal(qcal_observer_merge(p, r), QCAL_ERR_MISMATCH);
    qcal_observer *m = make(QCAL_OBSERVER_MINMAX, 0);
    assert_int_equal(qcal_observer_merge(m, p), QCAL_ERR_MISMATCH);
    qcal_observer_destroy(&p);
    qcal_observer_destroy(&q);
    qcal_observer_destroy(&r);
    qcal_observer_destroy(&m);
}

/* -0 and +0 compare equal, so a min/max pass returns whichever it meets first: the kinds
 * keep a zero bound as +0, so the range, the saved state and the digest are the same for
 * every order, split and merge of batches holding both zeros (per tensor and per channel;
 * a channel of only -0 gives +0 too). */
static void test_signed_zero(void **state)
{
    (void)state;
    float a[4] = { -0.0f, 1.0f, -0.0f, -1.0f }, b[4] = { 0.0f, 2.0f, 0.0f, -2.0f };
    float ab[8] = { -0.0f, 1.0f, -0.0f, -1.0f, 0.0f, 2.0f, 0.0f, -2.0f };
    const int64_t s2[2] = { 2, 2 }, s4[2] = { 4, 2 };
    for (int kind = 0; kind < 4; kind++) {
        if (!qcal_observer_kind_commutes((qcal_observer_kind)kind))
            continue;
        for (int32_t axis = 0; axis <= 1; axis++) {
            qcal_observer *fwd = make((qcal_observer_kind)kind, axis);
            qcal_observer *rev = make((qcal_observer_kind)kind, axis);
            qcal_observer *m1 = make((qcal_observer_kind)kind, axis);
            qcal_observer *m2 = make((qcal_observer_kind)kind, axis);
            feed(fwd, a, 2, s2);
            feed(fwd, b, 2, s2);
            feed(rev, b, 2, s2);
            feed(rev, a, 2, s2);
            feed(m1, b, 2, s2);
            feed(m2, a, 2, s2);
            assert_int_equal(qcal_observer_merge(m1, m2), QCAL_OK);
            assert_same_state(fwd, rev);
            assert_same_state(fwd, m1);
            char h1[65], h2[65], h3[65];
            assert_int_equal(qcal_observer_digest(fwd, h1), QCAL_OK);
            assert_int_equal(qcal_observer_digest(rev, h2), QCAL_OK);
            assert_int_equal(qcal_observer_digest(m1, h3), QCAL_OK);
            assert_string_equal(h1, h2);
            assert_string_equal(h1, h3);
            float mn[4], mx[4];
            int64_t n;
            range_of(fwd, mn, mx, &n);
            for (int64_t k = 0; k < n; k++) {
                assert_false(mn[k] == 0.0f && signbit(mn[k]));
                assert_false(mx[k] == 0.0f && signbit(mx[k]));
            }
            if (kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX && axis == 1) {
                /* channel 0 holds only zeros: [+0, +0] */
                assert_int_equal(ref_bits(mn[0]), 0);
                assert_int_equal(ref_bits(mx[0]), 0);
            }
            if (kind == QCAL_OBSERVER_MINMAX || axis == 1) { /* same channels as one batch */
                qcal_observer *one = make((qcal_observer_kind)kind, axis);
                feed(one, ab, 2, s4);
                assert_same_state(fwd, one);
                assert_int_equal(qcal_observer_digest(one, h2), QCAL_OK);
                assert_string_equal(h1, h2);
                qcal_observer_destroy(&one);
            }
            qcal_observer_destroy(&fwd);
            qcal_observer_destroy(&rev);
            qcal_observer_destroy(&m1);
            qcal_observer_destroy(&m2);
        }
    }
}

static void test_moving_average_rule(void **state)
{
    (void)state;
    qcal_observer *o = make(QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, 0);
    float b1[3] = { -1.0f, 0.5f, 2.0f }, b2[2] = { -3.0f, 10.0f };
    const int64_t s1 = 3, s2 = 2;
    feed(o, b1, 1, &s1);
    feed(o, b2, 1, &s2);
    float mn, mx;
    int64_t n;
    range_of(o, &mn, &mx, &n);
    assert_true(mn == -1.0f + 0.25f * (-3.0f - -1.0f));
    assert_true(mx == 2.0f + 0.25f * (10.0f - 2.0f));
    /* Merge of two non-empty moving averages is refused (order-dependent); o unchanged.
     * Into an empty one it is a copy. */
    qcal_observer *p = make(QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, 0);
    feed(p, b2, 1, &s2);
    feed(p, b1, 1, &s1);
    float pm, pM;
    range_of(p, &pm, &pM, &n);
    assert_int_equal(qcal_observer_merge(o, p), QCAL_ERR_UNSUPPORTED);
    float om, oM;
    range_of(o, &om, &oM, &n);
    assert_true(om == mn && oM == mx);
    qcal_observer *q = make(QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, 0);
    assert_int_equal(qcal_observer_merge(q, p), QCAL_OK);
    range_of(q, &om, &oM, &n);
    assert_true(om == pm && oM == pM);
    qcal_observer_destroy(&q);
    /* EMA overflow in float (PyTorch: inf/NaN) stays finite. */
    qcal_observer *h = make(QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, 0);
    float hb1[2] = { -3e38f, -3e38f }, hb2[2] = { 3e38f, 3e38f };
    const int64_t s = 2;
    feed(h, hb1, 1, &s);
    feed(h, hb2, 1, &s);
    range_of(h, &mn, &mx, &n);
    assert_true(isfinite(mn) && isfinite(mx));
    assert_true(fabs(mn - (-3e38 + 0.25 * 6e38)) < 1e32);
    qcal_observer_destroy(&o);
    qcal_observer_destroy(&p);
    qcal_observer_destroy(&h);
}

static void test_reset_save_load(void **state)
{
    (void)state;
    rng_state = 99;
    float x[4 * 3 * 5];
    for (int i = 0; i < 60; i++)
        x[i] = rndf();
    const int64_t shape[3] = { 4, 3, 5 };
    for (int kind = 0; kind < 4; kind++) {
        qcal_observer *o = make((qcal_observer_kind)kind, 1);
        /* Save/load of an empty observer. */
        void *buf = NULL;
        size_t len = 0;
        assert_int_equal(qcal_observer_save(o, &buf, &len), QCAL_OK);
        qcal_observer *l = NULL;
        assert_int_equal(qcal_observer_load(buf, len, &l), QCAL_OK);
        assert_same_state(o, l);
        qcal_free(buf);
        qcal_observer_destroy(&l);
        feed(o, x, 3, shape);
        x[7] = NAN;
        feed(o, x, 3, shape);
        x[7] = 0.5f;
        assert_int_equal(qcal_observer_save(o, &buf, &len), QCAL_OK);
        assert_int_equal(qcal_observer_load(buf, len, &l), QCAL_OK);
        assert_same_state(o, l);
        uint64_t nf = 0, nb = 0;
        assert_int_equal(qcal_observer_nonfinite(l, &nf), QCAL_OK);
        assert_int_equal(qcal_observer_batches(l, &nb), QCAL_OK);
        assert_int_equal(nf, 1);
        assert_int_equal(nb, 2);
        /* Truncated and corrupted blobs fail cleanly. */
        qcal_observer *bad = NULL;
        for (size_t cut = 0; cut < len; cut += 3)
            assert_true(qcal_observer_load(buf, cut, &bad) < 0);
        assert_null(bad);
        float nanv = NAN;
        memcpy((uint8_t *)buf + len - 4, &nanv, 4);     /* last stored max -> NaN */
        assert_int_equal(qcal_observer_load(buf, len, &bad), QCAL_ERR_FORMAT);
        qcal_free(buf);
        /* Loaded observers keep working: same next update on both. */
        feed(o, x, 3, shape);
        feed(l, x, 3, shape);
        assert_same_state(o, l);
        /* Reset forgets data and counters. */
        assert_int_equal(qcal_observer_reset(o), QCAL_OK);
        float mn[8], mx[8];
        int64_t n;
        assert_int_equal(qcal_observer_data_range(o, 8, mn, mx, &n), QCAL_NO_DATA);
        assert_true(mn[0] == INFINITY && mx[0] == -INFINITY);
        float s[8];
        int32_t z[8];
        assert_int_equal(tu_observer_qparams(o, 8, s, z, NULL, &n), QCAL_NO_DATA);
        assert_int_equal(n, 1);
        assert_true(s[0] == 1.0f && z[0] == 0);
        assert_int_equal(qcal_observer_nonfinite(o, &nf), QCAL_OK);
        assert_int_equal(nf, 0);
        feed(o, x, 3, shape);        /* per-channel: a new channel count is allowed */
        qcal_observer_destroy(&o);
        qcal_observer_destroy(&l);
    }
}

/* A saved state whose config is invalid: QCAL_ERR_FORMAT, and the message keeps the cause
 * after its prefix (it used to be formatted into the buffer it was read from). */
static void test_load_invalid_config(void **state)
{
    (void)state;
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
    cfg.averaging_constant = 0.3125f;   /* a value whose bytes occur once in the blob */
    qcal_observer *o = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_observer_save(o, &buf, &len), QCAL_OK);
    qcal_observer_destroy(&o);
    const float good = 0.3125f, bad = 2.0f;
    int found = 0;
    for (size_t i = 0; i + 4 <= len; i++)
        if (!memcmp((uint8_t *)buf + i, &good, 4)) {
            memcpy((uint8_t *)buf + i, &bad, 4);
            found++;
        }
    assert_int_equal(found, 1);
    qcal_observer *l = NULL;
    assert_int_equal(qcal_observer_load(buf, len, &l), QCAL_ERR_FORMAT);
    assert_null(l);
    const char *msg = qcal_last_error();
    const char *prefix = "observer state has an invalid config: ";
    assert_memory_equal(msg, prefix, strlen(prefix));
    assert_non_null(strstr(msg + strlen(prefix), "averaging constant 2 is outside (0, 1]"));
    assert_null(strstr(msg + strlen(prefix), prefix));   /* no doubled prefix */
    qcal_free(buf);
}

static void test_nonfinite(void **state)
{
    (void)state;
    float x[12] = { 1, NAN, -2, INFINITY, 3, -INFINITY, 0.5f, 0.25f, NAN, 4, -1, 2 };
    const int64_t shape[2] = { 3, 4 };   /* channels along axis 1: column 1 is NaN, Inf, NaN */
    for (int kind = 0; kind < 4; kind++) {
        qcal_observer *o = make((qcal_observer_kind)kind, 1);
        feed(o, x, 2, shape);
        uint64_t nf;
        assert_int_equal(qcal_observer_nonfinite(o, &nf), QCAL_OK);
        assert_int_equal(nf, 4);
        float mn[4], mx[4];
        int64_t n;
        assert_int_equal(qcal_observer_data_range(o, 4, mn, mx, &n), QCAL_OK);
        if (kind <= QCAL_OBSERVER_MOVING_AVERAGE_MINMAX) {
            assert_true(mn[0] == -2.0f && mx[0] == 4.0f);
        } else {
            /* Column 1 (NaN, 0.25, 4)... rows: [1 NaN -2 Inf] [3 -Inf .5 .25] [NaN 4 -1 2]. */
            assert_int_equal(n, 4);
            assert_true(mn[0] == 1.0f && mx[0] == 3.0f);
            assert_true(mn[1] == 4.0f && mx[1] == 4.0f);
            assert_true(mn[2] == -2.0f && mx[2] == 0.5f);
            assert_true(mn[3] == 0.25f && mx[3] == 2.0f);
        }
        qcal_observer_destroy(&o);
    }
    /* A channel that is entirely non-finite stays "no data": qparams (1, 0), QCAL_NO_DATA. */
    float y[6] = { NAN, 1, INFINITY, 2, NAN, 3 };
    const int64_t ys[2] = { 3, 2 };
    for (int kind = 2; kind < 4; kind++) {
        qcal_observer *o = make((qcal_observer_kind)kind, -1);
        feed(o, y, 2, ys);
        float mn[2], mx[2], s[2];
        int32_t z[2];
        int64_t n;
        assert_int_equal(qcal_observer_data_range(o, 2, mn, mx, &n), QCAL_OK);
        assert_true(mn[0] == INFINITY && mx[0] == -INFINITY);
        assert_int_equal(tu_observer_qparams(o, 2, s, z, NULL, &n), QCAL_NO_DATA);
        assert_int_equal(n, 2);
        assert_true(s[0] == 1.0f && z[0] == 0);
        assert_true(s[1] == 3.0f / 255.0f);
        /* Its first finite batch initialises it (moving average too). */
        float y2[6] = { -5, 1, -4, 2, -3, 3 };
        feed(o, y2, 2, ys);
        assert_int_equal(qcal_observer_data_range(o, 2, mn, mx, &n), QCAL_OK);
        assert_true(mn[0] == -5.0f && mx[0] == -3.0f);
        qcal_observer_destroy(&o);
    }
    /* Strict policy: the update fails, the state and counters are unchanged. */
    for (int kind = 0; kind < 4; kind++) {
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, (qcal_observer_kind)kind);
        cfg.nonfinite = QCAL_NONFINITE_ERROR;
        qcal_observer *o = NULL;
        assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
        float ok[12];
        for (int i = 0; i < 12; i++)
            ok[i] = (float)i;
        feed(o, ok, 2, shape);
        qcal_tensor t;
        assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
        assert_int_equal(qcal_observer_update(o, &t), QCAL_ERR_NONFINITE);
        assert_non_null(strstr(qcal_last_error(), "4"));
        float mn[4], mx[4];
        int64_t n;
        assert_int_equal(qcal_observer_data_range(o, 4, mn, mx, &n), QCAL_OK);
        assert_true(mn[0] == 0.0f);
        uint64_t nf, nb;
        qcal_observer_nonfinite(o, &nf);
        qcal_observer_batches(o, &nb);
        assert_int_equal(nf, 0);
        assert_int_equal(nb, 1);
        qcal_observer_destroy(&o);
    }
}

static void test_errors(void **state)
{
    (void)state;
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t shape[2] = { 2, 3 }, empty_shape[2] = { 0, 3 }, other[2] = { 3, 2 };
    for (int kind = 0; kind < 4; kind++) {
        qcal_observer *o = make((qcal_observer_kind)kind, 1);
        qcal_tensor t;
        assert_int_equal(qcal_tensor_init(&t, x, 2, empty_shape), QCAL_OK);
        assert_int_equal(qcal_observer_update(o, &t), QCAL_ERR_EMPTY);
        assert_int_equal(qcal_observer_update(o, NULL), QCAL_ERR_INVALID_ARG);
        feed(o, x, 2, shape);
        assert_int_equal(qcal_tensor_init(&t, x, 2, other), QCAL_OK);
        qcal_status st = qcal_observer_update(o, &t);
        if (kind >= 2) {
            assert_int_equal(st, QCAL_ERR_MISMATCH);   /* 2 channels vs 3 */
            assert_non_null(strstr(qcal_last_error(), "2 channels"));
            float mn[3], mx[3];
            int64_t n;
            assert_int_equal(qcal_observer_data_range(o, 2, mn, mx, &n), QCAL_ERR_INVALID_ARG);
        } else {
            assert_int_equal(st, QCAL_OK);
        }
        qcal_observer_destroy(&o);
    }
    /* Axis out of range for the tensor; at config time beyond QCAL_MAX_DIMS. */
    qcal_observer *o = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX, 2);
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    assert_int_equal(qcal_observer_update(o, &t), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "axis 2"));
    qcal_observer_destroy(&o);
    o = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX, -3);
    assert_int_equal(qcal_observer_update(o, &t), QCAL_ERR_INVALID_ARG);
    qcal_observer_destroy(&o);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    cfg.axis = 9;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_INVALID_ARG);
    assert_null(o);
    /* Averaging constant outside (0, 1]. */
    const float bad_c[] = { 0.0f, -0.5f, 1.5f, NAN };
    for (int i = 0; i < 4; i++) {
        qcal_observer_config_default(&cfg, QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX);
        cfg.averaging_constant = bad_c[i];
        assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_INVALID_ARG);
    }
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
    cfg.averaging_constant = 1.0f;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    qcal_observer_destroy(&o);
    /* quant_min > quant_max, per-tensor kind with a per-channel scheme. */
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.custom_range = true;
    cfg.q.quant_min = 15;
    cfg.q.quant_max = 0;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_INVALID_ARG);
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.qscheme = QCAL_PER_CHANNEL_AFFINE;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_ERR_INVALID_ARG);
    qcal_observer_destroy(NULL);
}

/* ---- kernels --------------------------------------------------------------------- */


static void fill(float *x, int64_t n, int sprinkle)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = rndf() * 100.0f;
        if (sprinkle && rnd() % 7 == 0) {
            uint32_t r = rnd() % 3;
            x[i] = r == 0 ? NAN : r == 1 ? INFINITY : -INFINITY;
        }
    }
}

/* The threaded entry point on a large input, every ISA: identical results. (Each ISA
 * kernel against its C reference: tests/checkasm.c.) */
static void test_kernels_flat(void **state)
{
    (void)state;
    rng_state = 2024;
    int64_t n = (1 << 22) + 13;
    float *x = malloc((size_t)n * sizeof(float));
    fill(x, n, 0);
    x[123457] = NAN;
    x[n - 1] = -INFINITY;
    x[3000001] = -1000.0f;
    x[17] = 2000.0f;
    const char *isas[3] = { "c", "avx2", NULL };
    for (int i = 0; i < 3; i++) {
        set_isa(isas[i]);
        float mn, mx;
        uint64_t nf;
        qcal_f32_minmax(x, n, &mn, &mx, &nf);
        assert_true(mn == -1000.0f && mx == 2000.0f);
        assert_int_equal(nf, 2);
    }
    set_isa(NULL);
    free(x);
}

/* Naive per-channel reference over (outer, C, inner). */
static void naive_channels(const float *x, int64_t outer, int64_t ch, int64_t inner, float *mn,
                           float *mx, uint64_t *nf)
{
    *nf = 0;
    for (int64_t c = 0; c < ch; c++) {
        mn[c] = INFINITY;
        mx[c] = -INFINITY;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < ch; c++)
            for (int64_t i = 0; i < inner; i++) {
                float v = x[(o * ch + c) * inner + i];
                if (!isfinite(v)) {
                    (*nf)++;
                    continue;
                }
                mn[c] = fminf(mn[c], v);
                mx[c] = fmaxf(mx[c], v);
            }
}

static void test_kernels_channels(void **state)
{
    (void)state;
    static const int64_t shapes[][3] = {
        { 1, 5, 1000 }, { 1, 300, 3 }, { 7, 3, 70 }, { 8, 33, 1 }, { 1000, 3, 1 },
        { 5, 1, 17 }, { 64, 100, 1 }, { 4, 17, 5 }, { 2, 256, 1024 }, { 2049, 131, 1 },
        { 1, 2, 600000 }, { 300000, 2, 1 }, { 3, 70000, 1 },
    };
    const char *isas[3] = { "c", "avx2", NULL };
    rng_state = 5;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t o = shapes[s][0], c = shapes[s][1], in = shapes[s][2], n = o * c * in;
        float *x = malloc((size_t)n * sizeof(float));
        fill(x, n, 1);
        float *rm = malloc((size_t)c * 4), *rM = malloc((size_t)c * 4);
        float *km = malloc((size_t)(c + 1) * 4), *kM = malloc((size_t)(c + 1) * 4);
        uint64_t rn, kn;
        naive_channels(x, o, c, in, rm, rM, &rn);
        for (int i = 0; i < 3; i++) {
            set_isa(isas[i]);
            km[c] = kM[c] = 12345.0f;    /* canary */
            assert_true(qcal_f32_minmax_channels(x, o, c, in, km, kM, &kn));
            assert_true(km[c] == 12345.0f && kM[c] == 12345.0f);
            assert_int_equal(kn, rn);
            for (int64_t k = 0; k < c; k++)
                if (km[k] != rm[k] || kM[k] != rM[k])
                    fail_msg("shape (%lld,%lld,%lld) isa %s channel %lld: [%g, %g] != [%g, %g]",
                             (long long)o, (long long)c, (long long)in,
                             isas[i] ? isas[i] : "best", (long long)k, (double)km[k],
                             (double)kM[k], (double)rm[k], (double)rM[k]);
        }
        set_isa(NULL);
        free(x);
        free(rm);
        free(rM);
        free(km);
        free(kM);
    }
}

/* A > 2^31-element tensor: an anonymous MAP_NORESERVE mapping reads as zeros without
 * committing memory; a few written pages place the extremes beyond index 2^31. */
static void test_huge_view(void **state)
{
    (void)state;
    /* The index arithmetic first: numel and byte counts of 2^31+ elements are fine. */
    int64_t shape[2] = { 3, (INT64_C(1) << 30) + 1 };
    qcal_tensor t = { .data = NULL, .ndim = 2 };
    t.shape[0] = shape[0];
    t.shape[1] = shape[1];
    int64_t n;
    assert_int_equal(qcal_tensor_numel(&t, &n), QCAL_OK);
    assert_true(n > INT32_MAX);
    const int64_t total = (INT64_C(1) << 31) + 4096;
    size_t bytes = (size_t)total * sizeof(float);
    float *x = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (x == MAP_FAILED) {
        print_message("skipping the 2^31-element mapping: mmap failed\n");
        skip();
    }
    x[5] = 3.0f;
    x[(INT64_C(1) << 31) + 5] = -2.0f;
    x[(INT64_C(1) << 31) + 6] = NAN;
    float mn, mx;
    uint64_t nf;
    qcal_f32_minmax(x, total, &mn, &mx, &nf);
    assert_true(mn == -2.0f && mx == 3.0f);
    assert_int_equal(nf, 1);
    /* Per-channel along the last axis of (2, 2^30 + 2048): row path per channel. */
    float cm[2], cM[2];
    assert_true(qcal_f32_minmax_channels(x, 1, 2, total / 2, cm, cM, &nf));
    assert_true(cm[0] == 0.0f && cM[0] == 3.0f && cm[1] == -2.0f && cM[1] == 0.0f);
    munmap(x, bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_merge_exact),
        cmocka_unit_test(test_signed_zero),
        cmocka_unit_test(test_moving_average_rule),
        cmocka_unit_test(test_reset_save_load),
        cmocka_unit_test(test_load_invalid_config),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_kernels_flat),
        cmocka_unit_test(test_kernels_channels),
        cmocka_unit_test(test_huge_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
