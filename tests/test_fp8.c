/* unit.fp8: the FP8 dtypes (float8_e4m3fn, float8_e5m2): names and ranges, qparams from
 * every observer kind (scale = max(|min|, |max|) / largest, zero-point 0), the codes of
 * hand-picked values (ties, saturation, subnormals, -0, +-Inf, NaN), every code's value,
 * a sweep of float32 bit patterns against an independent nearest-grid-value search, the
 * fake-quant forward / fused / backward with the saturation mask, per channel on several
 * axes, any thread count, and the FakeQuantize object. tests/test_fp8_ort.c checks the
 * same functions against ONNX Runtime. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qcal/fakequant.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/quantize.h"
#include "testutil.h"

static uint32_t ub(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float fb(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The magnitude of code c (< 0x7F / 0x7C) computed from the format's definition. */
static double grid(int c, bool e4)
{
    int mb = e4 ? 3 : 2, bias = e4 ? 7 : 15, e = c >> mb, m = c & ((1 << mb) - 1);
    return e == 0 ? ldexp(m, 1 - bias - mb) : ldexp((1 << mb) + m, e - bias - mb);
}

/* Independent reference: nearest grid value by binary search, ties to the even code,
 * saturating at the largest finite value; NaN -> sign | 0x7F. */
static uint8_t ref_code(float v, bool e4)
{
    int maxc = e4 ? 0x7E : 0x7B;
    unsigned sign = signbit(v) ? 0x80u : 0u;
    if (isnan(v))
        return (uint8_t)(sign | 0x7Fu);
    double a = fabs((double)v);
    if (a >= grid(maxc, e4))
        return (uint8_t)(sign | (unsigned)maxc);
    int lo = 0, hi = maxc;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (grid(mid, e4) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dl = a - grid(lo, e4), dh = grid(hi, e4) - a;
    int c = dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo);
    return (uint8_t)(sign | (unsigned)c);
}

static void quant1(qcal_dtype dt, float scale, const float *x, int64_t n, uint8_t *codes)
{
    qcal_qparams qp;
    assert_int_equal(qcal_qparams_per_tensor(&qp, dt, scale, 0), QCAL_OK);
    qcal_tensor t;
    qcal_tensor_init(&t, x, 1, &n);
    assert_int_equal(qcal_quantize(&t, &qp, codes), QCAL_OK);
}

static void test_names_ranges(void **state)
{
    (void)state;
    qcal_dtype d;
    assert_int_equal(qcal_dtype_parse("float8_e4m3fn", &d), QCAL_OK);
    assert_int_equal(d, QCAL_FLOAT8_E4M3FN);
    assert_int_equal(qcal_dtype_parse("float8_e5m2", &d), QCAL_OK);
    assert_int_equal(d, QCAL_FLOAT8_E5M2);
    assert_string_equal(qcal_dtype_name(QCAL_FLOAT8_E4M3FN), "float8_e4m3fn");
    assert_string_equal(qcal_dtype_name(QCAL_FLOAT8_E5M2), "float8_e5m2");
    assert_int_equal(qcal_dtype_parse("float8_e4m3", &d), QCAL_ERR_INVALID_ARG);
    assert_true(qcal_dtype_is_float8(QCAL_FLOAT8_E5M2));
    assert_false(qcal_dtype_is_float8(QCAL_QINT8));
    assert_true(qcal_dtype_float8_max(QCAL_FLOAT8_E4M3FN) == 448.0f);
    assert_true(qcal_dtype_float8_max(QCAL_FLOAT8_E5M2) == 57344.0f);
    assert_int_equal(qcal_dtype_size(QCAL_FLOAT8_E4M3FN), 1);
    assert_int_equal(qcal_dtype_size(QCAL_FLOAT8_E5M2), 1);
    int64_t lo, hi;
    assert_int_equal(qcal_dtype_range(QCAL_FLOAT8_E4M3FN, &lo, &hi), QCAL_OK);
    assert_true(lo == -448 && hi == 448);
    assert_int_equal(qcal_dtype_range(QCAL_FLOAT8_E5M2, &lo, &hi), QCAL_OK);
    assert_true(lo == -57344 && hi == 57344);
}

static void test_qparams(void **state)
{
    (void)state;
    qcal_qconfig cfg;
    qcal_qconfig_default(&cfg);
    cfg.dtype = QCAL_FLOAT8_E4M3FN;   /* qscheme left per_tensor_affine: computed symmetric */
    float mn = -3.0f, mx = 2.0f;
    qcal_qparams qp = { 0 };
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 1, &mn, &mx, &qp), QCAL_OK);
    assert_int_equal(qp.qscheme, QCAL_PER_TENSOR_SYMMETRIC);
    assert_true(ub(qp.scale) == ub(3.0f / 448.0f));
    assert_int_equal(qp.zero_point, 0);
    assert_true(qp.quant_min == -448 && qp.quant_max == 448);
    /* positive-only range: amax = max */
    mn = 0.5f;
    mx = 100.0f;
    cfg.dtype = QCAL_FLOAT8_E5M2;
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 1, &mn, &mx, &qp), QCAL_OK);
    assert_true(ub(qp.scale) == ub(100.0f / 57344.0f));
    /* all zero: eps */
    mn = mx = 0.0f;
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 1, &mn, &mx, &qp), QCAL_OK);
    assert_true(qp.scale == FLT_EPSILON);
    /* per channel, affine asked: symmetric per channel, library-owned arrays */
    cfg.dtype = QCAL_FLOAT8_E4M3FN;
    cfg.qscheme = QCAL_PER_CHANNEL_AFFINE;
    float mins[3] = { -1.0f, -7.0f, 0.0f }, maxs[3] = { 4.0f, 2.0f, 0.25f };
    assert_int_equal(qcal_qparams_compute(&cfg, 1, 3, mins, maxs, &qp), QCAL_OK);
    assert_int_equal(qp.qscheme, QCAL_PER_CHANNEL_SYMMETRIC);
    assert_int_equal(qp.axis, 1);
    assert_true(ub(qp.scales[0]) == ub(4.0f / 448.0f) && ub(qp.scales[1]) == ub(7.0f / 448.0f) &&
                ub(qp.scales[2]) == ub(0.25f / 448.0f));
    assert_true(qp.zero_points[0] == 0 && qp.zero_points[1] == 0 && qp.zero_points[2] == 0);
    assert_int_equal(qcal_qparams_validate(&qp), QCAL_OK);
    qcal_qparams_free(&qp);
    /* refused: reduce_range, custom ranges, float zero-points; non-zero zero-points */
    cfg.qscheme = QCAL_PER_TENSOR_AFFINE;
    cfg.reduce_range = true;
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 1, &mn, &mx, &qp), QCAL_ERR_UNSUPPORTED);
    cfg.reduce_range = false;
    cfg.custom_range = true;
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 1, &mn, &mx, &qp), QCAL_ERR_UNSUPPORTED);
    cfg.custom_range = false;
    cfg.qscheme = QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    assert_int_equal(qcal_qparams_compute(&cfg, 0, 3, mins, maxs, &qp), QCAL_ERR_UNSUPPORTED);
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_FLOAT8_E4M3FN, 0.5f, 1),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_FLOAT8_E4M3FN, 0.5f, 0), QCAL_OK);
    assert_int_equal(qp.qscheme, QCAL_PER_TENSOR_SYMMETRIC);
    float sc[2] = { 1.0f, 2.0f };
    int32_t zp[2] = { 0, 3 };
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_FLOAT8_E5M2, 0, 2, sc, zp),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_FLOAT8_E5M2, 0, 2, sc, NULL), QCAL_OK);
}

/* Every observer kind with an FP8 dtype: scale = max(|lo|, |hi|) / largest of the range
 * the observer chooses (qcal_observer_qrange), zero-point 0. */
static void test_observer_kinds(void **state)
{
    (void)state;
    enum { C = 4, N = 4096 };
    float *x = malloc(sizeof(float) * C * N);
    assert_non_null(x);
    uint64_t r = 12345;
    for (int i = 0; i < C * N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((double)(r >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
        x[i] = u * u * u * (float)(1 + (i / N)) * 3.0f + 0.25f;
    }
    int64_t shape[2] = { C, N };
    qcal_tensor t;
    qcal_tensor_init(&t, x, 2, shape);
    for (int dt = 0; dt < 2; dt++) {
        qcal_dtype d = dt ? QCAL_FLOAT8_E5M2 : QCAL_FLOAT8_E4M3FN;
        float big = qcal_dtype_float8_max(d);
        for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, (qcal_observer_kind)k);
            cfg.q.dtype = d;
            qcal_observer *obs = NULL;
            assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
            assert_int_equal(qcal_observer_update(obs, &t), QCAL_OK);
            float lo[C], hi[C];
            int64_t n = 0;
            assert_int_equal(qcal_observer_qrange(obs, C, lo, hi, &n), QCAL_OK);
            qcal_qparams qp = { 0 };
            assert_int_equal(qcal_observer_qparams(obs, &qp), QCAL_OK);
            assert_int_equal(qp.dtype, d);
            assert_int_equal(qp.channels, n);
            assert_true(qp.qscheme == QCAL_PER_TENSOR_SYMMETRIC ||
                        qp.qscheme == QCAL_PER_CHANNEL_SYMMETRIC);
            for (int64_t c = 0; c < n; c++) {
                float amax = fmaxf(-fminf(lo[c], 0.0f), fmaxf(hi[c], 0.0f));
                float want = fmaxf(amax / big, FLT_EPSILON);
                if (ub(qcal_qparams_scale_at(&qp, c)) != ub(want))
                    fail_msg("%s %s channel %lld: scale %a, expected %a (range [%g, %g])",
                             qcal_observer_kind_name((qcal_observer_kind)k), qcal_dtype_name(d),
                             (long long)c, (double)qcal_qparams_scale_at(&qp, c), (double)want,
                             (double)lo[c], (double)hi[c]);
                assert_int_equal(qcal_qparams_zero_point_at(&qp, c), 0);
            }
            qcal_qparams_free(&qp);
            qcal_observer_destroy(&obs);
        }
    }
    free(x);
}

typedef struct code_case {
    float v;
    uint8_t e4, e5;
} code_case;

/* Hand-picked values at scale 1 and their codes in both formats. */
static void test_codes(void **state)
{
    (void)state;
    static const code_case cases[] = {
        { 0.0f, 0x00, 0x00 },
        { -0.0f, 0x80, 0x80 },
        { 1.0f, 0x38, 0x3C },
        { -2.0f, 0xC0, 0xC0 },
        { 448.0f, 0x7E, 0x5F },            /* E5M2: 448 = 1.75 * 2^8 */
        { 464.0f, 0x7E, 0x5F },            /* E4M3FN: the tie above 448 rounds to 448 (even) */
        { 480.0f, 0x7E, 0x60 },            /* E4M3FN: saturates (unsaturated: NaN) */
        { 1e6f, 0x7E, 0x7B },
        { INFINITY, 0x7E, 0x7B },          /* saturate=1: +-Inf -> +-largest */
        { -INFINITY, 0xFE, 0xFB },
        { 57344.0f, 0x7E, 0x7B },
        { 61440.0f, 0x7E, 0x7B },          /* E5M2: the tie above 57344 saturates */
        { FLT_MAX, 0x7E, 0x7B },
        { 17.0f, 0x58, 0x4C },             /* E4M3FN tie 16 | 18 -> 16; E5M2 tie 16 | 20 -> 16 */
        { 19.0f, 0x5A, 0x4D },             /* E4M3FN tie 18 | 20 -> 20; E5M2 19 -> 20 */
        { 0x1p-6f, 0x08, 0x24 },           /* E4M3FN smallest normal */
        { 0x1p-9f, 0x01, 0x18 },           /* E4M3FN smallest subnormal */
        { 0x1p-10f, 0x00, 0x14 },          /* E4M3FN tie 0 | 2^-9 -> 0 */
        { 0x1.8p-9f, 0x02, 0x1A },         /* E4M3FN tie 2^-9 | 2^-8 -> 2^-8 (even) */
        { 0x1.2p-10f, 0x01, 0x14 },        /* just above the tie */
        { 0x1.c2p-7f, 0x07, 0x23 },        /* rounds to 7 * 2^-9 (E4M3FN) */
        { 0x1.f8p-7f, 0x08, 0x24 },        /* E4M3FN: 7.875 * 2^-9 -> 2^-6, normal */
        { 0x1p-14f, 0x00, 0x04 },          /* E5M2 smallest normal; E4M3FN: 0 */
        { 0x1p-16f, 0x00, 0x01 },          /* E5M2 smallest subnormal */
        { 0x1p-17f, 0x00, 0x00 },          /* E5M2 tie 0 | 2^-16 -> 0 */
        { 0x1.8p-16f, 0x00, 0x02 },        /* E5M2 tie 1 | 2 -> 2 */
        { -0x1p-149f, 0x80, 0x80 },        /* float32 subnormal -> -0 */
        { 0x1p-130f, 0x00, 0x00 },
    };
    size_t n = sizeof cases / sizeof cases[0];
    float x[64];
    uint8_t c4[64], c5[64];
    for (size_t i = 0; i < n; i++)
        x[i] = cases[i].v;
    x[n] = NAN;
    x[n + 1] = -NAN;
    x[n + 2] = fb(0x7F800001u);   /* signalling NaN */
    x[n + 3] = fb(0xFFBFFFFFu);
    int64_t m = (int64_t)n + 4;
    quant1(QCAL_FLOAT8_E4M3FN, 1.0f, x, m, c4);
    quant1(QCAL_FLOAT8_E5M2, 1.0f, x, m, c5);
    for (size_t i = 0; i < n; i++) {
        if (c4[i] != cases[i].e4 || c5[i] != cases[i].e5)
            fail_msg("%a: codes 0x%02x 0x%02x, expected 0x%02x 0x%02x", (double)cases[i].v,
                     c4[i], c5[i], cases[i].e4, cases[i].e5);
        assert_int_equal(ref_code(cases[i].v, true), cases[i].e4);
        assert_int_equal(ref_code(cases[i].v, false), cases[i].e5);
    }
    static const uint8_t nan4[4] = { 0x7F, 0xFF, 0x7F, 0xFF };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(c4[n + (size_t)i], nan4[i]);
        assert_int_equal(c5[n + (size_t)i], nan4[i]);
    }
}

/* Every code's value (scale 1 and another), NaN codes the quiet NaN with their sign,
 * E5M2's infinities. */
static void test_all_codes(void **state)
{
    (void)state;
    uint8_t codes[256];
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    int64_t n = 256;
    for (int dt = 0; dt < 2; dt++) {
        bool e4 = dt == 0;
        qcal_dtype d = e4 ? QCAL_FLOAT8_E4M3FN : QCAL_FLOAT8_E5M2;
        for (int si = 0; si < 2; si++) {
            float scale = si ? 0.0123f : 1.0f, y[256];
            qcal_qparams qp;
            assert_int_equal(qcal_qparams_per_tensor(&qp, d, scale, 0), QCAL_OK);
            qcal_tensor_mut t;
            qcal_tensor_mut_init(&t, y, 1, &n);
            assert_int_equal(qcal_dequantize(codes, &qp, &t), QCAL_OK);
            for (int c = 0; c < 256; c++) {
                int m = c & 0x7F;
                uint32_t sign = (uint32_t)(c & 0x80) << 24;
                uint32_t want;
                if (e4 ? m == 0x7F : m > 0x7C)
                    want = sign | 0x7FC00000u;
                else if (!e4 && m == 0x7C)
                    want = sign | 0x7F800000u;
                else
                    want = sign | ub((float)grid(m, e4) * scale);
                if (ub(y[c]) != want)
                    fail_msg("%s code 0x%02x scale %g: %a, expected %a", qcal_dtype_name(d), c,
                             (double)scale, (double)y[c], (double)fb(want));
            }
            /* round trip: quantize(dequantize(c)) == c for every non-NaN code, at scale 1 */
            if (si == 0) {
                uint8_t back[256];
                quant1(d, 1.0f, y, 256, back);
                for (int c = 0; c < 256; c++) {
                    int m = c & 0x7F;
                    if (e4 ? m == 0x7F : m >= 0x7C)
                        continue;
                    assert_int_equal(back[c], c);
                }
            }
        }
    }
}

/* A sweep of float32 bit patterns (every exponent; stride 997) at scale 1 and at 2^-5,
 * against the independent nearest-grid search. */
static void test_sweep(void **state)
{
    (void)state;
    enum { CHUNK = 1 << 16 };
    float *x = malloc(CHUNK * sizeof(float));
    uint8_t *c = malloc(CHUNK);
    assert_non_null(x);
    assert_non_null(c);
    long long checked = 0;
    for (int dt = 0; dt < 2; dt++) {
        bool e4 = dt == 0;
        qcal_dtype d = e4 ? QCAL_FLOAT8_E4M3FN : QCAL_FLOAT8_E5M2;
        for (int si = 0; si < 2; si++) {
            float scale = si ? 0x1p-5f : 1.0f;
            uint64_t u = 0;
            while (u < (1ull << 32)) {
                int64_t k = 0;
                for (; k < CHUNK && u < (1ull << 32); k++, u += 997)
                    x[k] = fb((uint32_t)u);
                quant1(d, scale, x, k, c);
                for (int64_t i = 0; i < k; i++) {
                    uint8_t want = ref_code(x[i] / scale, e4);
                    if (c[i] != want)
                        fail_msg("%s x %a scale %a: code 0x%02x, expected 0x%02x",
                                 qcal_dtype_name(d), (double)x[i], (double)scale, c[i], want);
                }
                checked += k;
            }
        }
    }
    assert_true(checked > 17000000);
    free(x);
    free(c);
}

/* Fake-quant: forward = dequantize(quantize(x)), the mask (inside the unsaturated range),
 * fused and backward gradients, per tensor and per channel (axes 0, 1, -1). */
static void test_fakequant(void **state)
{
    (void)state;
    for (int dt = 0; dt < 2; dt++) {
        bool e4 = dt == 0;
        qcal_dtype d = e4 ? QCAL_FLOAT8_E4M3FN : QCAL_FLOAT8_E5M2;
        float s = 0.5f;
        float bound = e4 ? 464.0f : 61440.0f;
        /* x / s at and around the mask's bound, specials, ordinary values */
        float v[] = { bound * s, nextafterf(bound, 0.0f) * s, nextafterf(bound, INFINITY) * s,
                      -bound * s, 1.0f, -0.0f, 0.0f, INFINITY, -INFINITY, NAN, 3.3f, -1e-5f,
                      1e30f, -7.0f, 0.123f, 100.0f, 200.0f };
        int64_t n = (int64_t)(sizeof v / sizeof v[0]);
        uint8_t want_mask[sizeof v / sizeof v[0]];
        for (int64_t i = 0; i < n; i++) {
            float a = fabsf(v[i] / s);
            want_mask[i] = (uint8_t)(e4 ? a <= 464.0f : a < 61440.0f);
        }
        float y[32], yq[32], gy[32], gx[32], y2[32];
        uint8_t codes[32], mask[32];
        for (int64_t i = 0; i < n; i++)
            gy[i] = (float)(i + 1) * (i % 2 ? -1.0f : 1.0f);
        qcal_qparams qp;
        assert_int_equal(qcal_qparams_per_tensor(&qp, d, s, 0), QCAL_OK);
        qcal_tensor tx, tg;
        qcal_tensor_mut ty, tq, tgx, ty2;
        qcal_tensor_init(&tx, v, 1, &n);
        qcal_tensor_mut_init(&ty, y, 1, &n);
        qcal_tensor_mut_init(&tq, yq, 1, &n);
        qcal_tensor_init(&tg, gy, 1, &n);
        qcal_tensor_mut_init(&tgx, gx, 1, &n);
        qcal_tensor_mut_init(&ty2, y2, 1, &n);
        assert_int_equal(qcal_fakequant_forward(&tx, &qp, &ty, mask), QCAL_OK);
        assert_int_equal(qcal_quantize(&tx, &qp, codes), QCAL_OK);
        assert_int_equal(qcal_dequantize(codes, &qp, &tq), QCAL_OK);
        for (int64_t i = 0; i < n; i++) {
            if (ub(y[i]) != ub(yq[i]))
                fail_msg("%s x %a: fake-quant %a, dequantize(quantize) %a", qcal_dtype_name(d),
                         (double)v[i], (double)y[i], (double)yq[i]);
            if (mask[i] != want_mask[i])
                fail_msg("%s x %a: mask %d, expected %d", qcal_dtype_name(d), (double)v[i],
                         mask[i], want_mask[i]);
        }
        assert_true(ub(y[5]) == 0x80000000u);                  /* -0 kept */
        assert_true(isnan(y[9]));                              /* NaN kept NaN */
        assert_true(y[7] == qcal_dtype_float8_max(d) * s && y[8] == -qcal_dtype_float8_max(d) * s);
        assert_int_equal(qcal_fakequant_fused(&tx, &tg, &qp, &ty2, &tgx), QCAL_OK);
        for (int64_t i = 0; i < n; i++) {
            assert_true(ub(y2[i]) == ub(y[i]));
            assert_true(ub(gx[i]) == ub(gy[i] * (want_mask[i] ? 1.0f : 0.0f)));
        }
        float gb[32];
        qcal_tensor_mut tgb;
        qcal_tensor_mut_init(&tgb, gb, 1, &n);
        assert_int_equal(qcal_fakequant_backward(&tg, mask, &tgb), QCAL_OK);
        assert_memory_equal(gb, gx, (size_t)n * 4);
        /* learnable calls refuse FP8 */
        assert_int_equal(qcal_fakequant_learnable_forward(&tx, &qp, &ty, NULL),
                         QCAL_ERR_UNSUPPORTED);
    }
    /* per channel: each channel's slice equals the per-tensor result with its scale */
    enum { A = 3, B = 5, K = 37 };
    static float x[A * B * K], y[A * B * K], yr[A * B * K];
    static uint8_t q[A * B * K], qr[A * B * K];
    for (int i = 0; i < A * B * K; i++)
        x[i] = (float)((i * 7919) % 2001 - 1000) * 0.37f + (i % 11 == 0 ? 5000.0f : 0.0f);
    int64_t shape[3] = { A, B, K };
    const int axes[3] = { 0, 1, -1 };
    for (int dt = 0; dt < 2; dt++) {
        qcal_dtype d = dt ? QCAL_FLOAT8_E5M2 : QCAL_FLOAT8_E4M3FN;
        for (int ai = 0; ai < 3; ai++) {
            int ax = axes[ai] < 0 ? 3 + axes[ai] : axes[ai];
            int64_t ch = shape[ax];
            float sc[64];
            for (int64_t c = 0; c < ch; c++)
                sc[c] = (float)(c + 1) * (dt ? 1e-3f : 0.7f);
            qcal_qparams qp;
            assert_int_equal(qcal_qparams_per_channel(&qp, d, axes[ai], ch, sc, NULL), QCAL_OK);
            qcal_tensor tx;
            qcal_tensor_mut ty;
            qcal_tensor_init(&tx, x, 3, shape);
            qcal_tensor_mut_init(&ty, y, 3, shape);
            assert_int_equal(qcal_fakequant_forward(&tx, &qp, &ty, NULL), QCAL_OK);
            assert_int_equal(qcal_quantize(&tx, &qp, q), QCAL_OK);
            for (int i = 0; i < A * B * K; i++) {
                int idx[3] = { i / (B * K), (i / K) % B, i % K };
                float s1 = sc[idx[ax]];
                int64_t one = 1;
                quant1(d, s1, &x[i], 1, &qr[i]);
                qcal_qparams q1;
                assert_int_equal(qcal_qparams_per_tensor(&q1, d, s1, 0), QCAL_OK);
                qcal_tensor t1;
                qcal_tensor_mut t2;
                qcal_tensor_init(&t1, &x[i], 1, &one);
                qcal_tensor_mut_init(&t2, &yr[i], 1, &one);
                assert_int_equal(qcal_fakequant_forward(&t1, &q1, &t2, NULL), QCAL_OK);
            }
            assert_memory_equal(q, qr, sizeof q);
            assert_memory_equal(y, yr, sizeof y);
        }
    }
}

/* The FakeQuantize object with an FP8 observer: qparams from the observer, forward equal to
 * the fake-quant call, backward zero where the input saturated after freezing. */
static void test_module(void **state)
{
    (void)state;
    qcal_fakequant_module_config cfg;
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_TENSOR);
    cfg.observer.q.dtype = QCAL_FLOAT8_E4M3FN;
    qcal_fakequant_module *fq = NULL;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
    float x[64], y[64], y2[64], g[64], gx[64];
    for (int i = 0; i < 64; i++) {
        x[i] = (float)(i - 40) * 0.173f;
        g[i] = 1.0f;
    }
    int64_t n = 64;
    qcal_tensor t, tgy;
    qcal_tensor_mut ty, tgx;
    qcal_tensor_init(&t, x, 1, &n);
    qcal_tensor_mut_init(&ty, y, 1, &n);
    qcal_tensor_init(&tgy, g, 1, &n);
    qcal_tensor_mut_init(&tgx, gx, 1, &n);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, &ty), QCAL_OK);
    qcal_qparams qp = { 0 };
    assert_int_equal(qcal_fakequant_module_qparams(fq, &qp), QCAL_OK);
    assert_int_equal(qp.dtype, QCAL_FLOAT8_E4M3FN);
    assert_true(ub(qp.scale) == ub(fmaxf(40.0f * 0.173f, 23.0f * 0.173f) / 448.0f));
    qcal_tensor_mut t2;
    qcal_tensor_mut_init(&t2, y2, 1, &n);
    assert_int_equal(qcal_fakequant_forward(&t, &qp, &t2, NULL), QCAL_OK);
    assert_memory_equal(y, y2, sizeof y);
    assert_int_equal(qcal_fakequant_module_freeze(fq), QCAL_OK);
    for (int i = 0; i < 64; i++)
        x[i] *= 2.0f;   /* half of the values now beyond the frozen range */
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, &ty), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_backward(fq, &tgy, &tgx), QCAL_OK);
    int zeros = 0;
    for (int i = 0; i < 64; i++) {
        float a = fabsf(x[i] / qp.scale);
        assert_true(gx[i] == (a <= 464.0f ? 1.0f : 0.0f));
        zeros += gx[i] == 0.0f;
        if (a > 448.0f)
            assert_true(fabsf(y[i]) == 448.0f * qp.scale);
    }
    assert_true(zeros > 0);
    qcal_fakequant_module_destroy(&fq);
    cfg.learnable = true;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_ERR_UNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_ranges), cmocka_unit_test(test_qparams),
        cmocka_unit_test(test_observer_kinds), cmocka_unit_test(test_codes),
        cmocka_unit_test(test_all_codes), cmocka_unit_test(test_sweep),
        cmocka_unit_test(test_fakequant), cmocka_unit_test(test_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
