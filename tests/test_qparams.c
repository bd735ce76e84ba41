/* unit.qparams: qconfig ranges and validation, names, qparams_compute edge cases and the
 * golden comparison against PyTorch 1.13 (_calculate_qparams on PyTorch's own min/max). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "minmax_ref_reader.h"
#include "testutil.h"
#include "qcal/qcal.h"
#include "qcal/qparams.h"

static void test_names(void **state)
{
    (void)state;
    for (int d = 0; d <= QCAL_QINT32; d++) {
        qcal_dtype out;
        assert_int_equal(qcal_dtype_parse(qcal_dtype_name((qcal_dtype)d), &out), QCAL_OK);
        assert_int_equal(out, d);
    }
    for (int q = 0; q <= QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS; q++) {
        qcal_qscheme out;
        assert_int_equal(qcal_qscheme_parse(qcal_qscheme_name((qcal_qscheme)q), &out), QCAL_OK);
        assert_int_equal(out, q);
    }
    assert_string_equal(qcal_dtype_name(QCAL_QINT8), "qint8");
    assert_string_equal(qcal_qscheme_name(QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS),
                        "per_channel_affine_float_qparams");
    qcal_dtype d = QCAL_QINT8;
    assert_int_equal(qcal_dtype_parse("int8", &d), QCAL_ERR_INVALID_ARG);
    assert_int_equal(d, QCAL_QINT8);
    assert_non_null(strstr(qcal_last_error(), "int8"));
    qcal_qscheme q;
    assert_int_equal(qcal_qscheme_parse("affine", &q), QCAL_ERR_INVALID_ARG);
    assert_string_equal(qcal_dtype_name((qcal_dtype)7), "unknown");
    assert_true(qcal_qscheme_is_per_channel(QCAL_PER_CHANNEL_SYMMETRIC));
    assert_false(qcal_qscheme_is_per_channel(QCAL_PER_TENSOR_SYMMETRIC));
}

static void expect_range(qcal_dtype dt, bool reduce, bool custom, int64_t a, int64_t b,
                         int64_t ea, int64_t eb)
{
    qcal_qconfig c;
    qcal_qconfig_default(&c);
    c.dtype = dt;
    c.reduce_range = reduce;
    c.custom_range = custom;
    c.quant_min = a;
    c.quant_max = b;
    int64_t lo = 99, hi = 99;
    assert_int_equal(qcal_qconfig_range(&c, &lo, &hi), QCAL_OK);
    assert_int_equal(lo, ea);
    assert_int_equal(hi, eb);
}

static void expect_range_fail(qcal_dtype dt, qcal_qscheme qs, bool reduce, bool custom,
                              int64_t a, int64_t b, float eps, qcal_status want)
{
    qcal_qconfig c;
    qcal_qconfig_default(&c);
    c.dtype = dt;
    c.qscheme = qs;
    c.reduce_range = reduce;
    c.custom_range = custom;
    c.quant_min = a;
    c.quant_max = b;
    c.eps = eps;
    int64_t lo = 99, hi = 99;
    assert_int_equal(qcal_qconfig_range(&c, &lo, &hi), want);
    assert_int_equal(lo, 99);
    assert_int_equal(hi, 99);
    assert_true(strlen(qcal_last_error()) > 0);
}

static void test_ranges(void **state)
{
    (void)state;
    expect_range(QCAL_QUINT8, false, false, 0, 0, 0, 255);
    expect_range(QCAL_QUINT8, true, false, 0, 0, 0, 127);
    expect_range(QCAL_QINT8, false, false, 0, 0, -128, 127);
    expect_range(QCAL_QINT8, true, false, 0, 0, -64, 63);
    expect_range(QCAL_QINT32, false, false, 0, 0, INT32_MIN, INT32_MAX);
    expect_range(QCAL_QINT32, true, false, 0, 0, INT32_MIN, INT32_MAX);
    expect_range(QCAL_QUINT8, false, true, 0, 15, 0, 15);
    expect_range(QCAL_QUINT8, true, true, 0, 15, 0, 7);
    expect_range(QCAL_QINT8, false, true, -8, 7, -8, 7);
    expect_range(QCAL_QINT8, true, true, -8, 7, -4, 3);      /* Python floor division */
    expect_range(QCAL_QINT8, true, true, -7, 7, -4, 3);
    expect_range(QCAL_QINT32, false, true, -(INT64_C(1) << 30), (INT64_C(1) << 30) - 1,
                 -(INT64_C(1) << 30), (INT64_C(1) << 30) - 1);
    const float e = FLT_EPSILON;
    expect_range_fail(QCAL_QINT8, 0, false, true, 7, -8, e, QCAL_ERR_INVALID_ARG);  /* qmin > qmax */
    expect_range_fail(QCAL_QINT8, 0, false, true, 3, 3, e, QCAL_ERR_INVALID_ARG);   /* no 0 */
    expect_range_fail(QCAL_QINT8, 0, false, true, 0, 0, e, QCAL_ERR_INVALID_ARG);   /* qmin == qmax */
    expect_range_fail(QCAL_QINT8, 0, false, true, 1, 15, e, QCAL_ERR_INVALID_ARG);  /* no 0 */
    expect_range_fail(QCAL_QINT8, 0, false, true, -200, 7, e, QCAL_ERR_INVALID_ARG);
    expect_range_fail(QCAL_QUINT8, 0, false, true, 0, 256, e, QCAL_ERR_INVALID_ARG);
    expect_range_fail(QCAL_QINT32, 0, false, true, INT32_MIN, INT32_MAX, e,
                      QCAL_ERR_INVALID_ARG);                   /* > 2^31 levels */
    {
        /* PyTorch's HistogramObserver(quint8, per_tensor_symmetric, reduce_range=True):
         * [0, 127], scale max|x| / 63.5 (torch 1.13: [-1, 3] -> 0.0472) and zero-point 128,
         * outside the range (a PyTorch defect); qcal gives 64, the midpoint, and the
         * qparams validate. MinMaxObserver refuses it (observer.c, test_observer_config). */
        qcal_qconfig c;
        qcal_qconfig_default(&c);
        c.dtype = QCAL_QUINT8;
        c.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        c.reduce_range = true;
        int64_t lo = 99, hi = 99;
        assert_int_equal(qcal_qconfig_range(&c, &lo, &hi), QCAL_OK);
        assert_int_equal(lo, 0);
        assert_int_equal(hi, 127);
        float mn = -1.0f, mx = 3.0f, s = 0.0f;
        int32_t z = -1;
        assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &mn, &mx, &s, &z, NULL), QCAL_OK);
        assert_true(s == 3.0f / 63.5f);
        assert_int_equal(z, 64);
        qcal_qparams qp;
        assert_int_equal(qcal_qparams_per_tensor(&qp, c.dtype, s, z), QCAL_OK);
        qp.qscheme = c.qscheme;
        qp.quant_min = lo;
        qp.quant_max = hi;
        assert_int_equal(qcal_qparams_validate(&qp), QCAL_OK);
        /* Symmetric about the zero-point: +-2 / s = +-42.33 -> 64 +- 42; 0 -> 64. */
        float x3[3] = { 2.0f, 0.0f, -2.0f };
        uint8_t q3[3];
        assert_int_equal(qcal_quantize(tu_vec(x3, 3), &qp, q3), QCAL_OK);
        assert_int_equal(q3[0], 106);
        assert_int_equal(q3[1], 64);
        assert_int_equal(q3[2], 22);
    }
    expect_range_fail(QCAL_QUINT8, QCAL_PER_CHANNEL_SYMMETRIC, true, false, 0, 0, e,
                      QCAL_ERR_UNSUPPORTED);
    expect_range_fail(QCAL_QUINT8, 0, false, false, 0, 0, 0.0f, QCAL_ERR_INVALID_ARG);
    expect_range_fail(QCAL_QUINT8, 0, false, false, 0, 0, NAN, QCAL_ERR_INVALID_ARG);
    expect_range_fail((qcal_dtype)9, 0, false, false, 0, 0, e, QCAL_ERR_INVALID_ARG);
    expect_range_fail(QCAL_QUINT8, (qcal_qscheme)9, false, false, 0, 0, e, QCAL_ERR_INVALID_ARG);
    /* The message carries the numbers. */
    expect_range_fail(QCAL_QINT8, 0, false, true, 7, -8, e, QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "7"));
}

static void test_compute_edges(void **state)
{
    (void)state;
    qcal_qconfig c;
    qcal_qconfig_default(&c);
    float mn[3] = { INFINITY, INFINITY, INFINITY }, mx[3] = { -INFINITY, -INFINITY, -INFINITY };
    float s[3] = { 7, 7, 7 };
    int32_t z[3] = { 7, 7, 7 };
    /* No data: scale 1, zero-point 0, QCAL_NO_DATA. */
    assert_int_equal(qcal_qparams_compute_arrays(&c, 3, mn, mx, s, z, NULL), QCAL_NO_DATA);
    for (int i = 0; i < 3; i++) {
        assert_true(s[i] == 1.0f);
        assert_int_equal(z[i], 0);
    }
    /* Mixed: channel 1 has data; QCAL_NO_DATA still (ANY pair without data, as documented). */
    mn[1] = -1.0f;
    mx[1] = 1.0f;
    c.qscheme = QCAL_PER_CHANNEL_AFFINE;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 3, mn, mx, s, z, NULL), QCAL_NO_DATA);
    assert_true(s[1] == 2.0f / 255.0f);
    assert_int_equal(z[1], (int32_t)(0 - nearbyintf(-1.0f / (2.0f / 255.0f))));
    assert_true(s[0] == 1.0f && z[0] == 0);
    /* Failures leave outputs untouched. */
    float s2[2] = { 5, 5 };
    int32_t z2[2] = { 5, 5 };
    float a[2] = { 0.0f, 2.0f }, b[2] = { 1.0f, 1.0f };
    assert_int_equal(qcal_qparams_compute_arrays(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "min 2 > max 1"));
    assert_true(s2[0] == 5 && s2[1] == 5 && z2[0] == 5 && z2[1] == 5);
    a[1] = NAN;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    a[1] = -INFINITY;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_true(s2[0] == 5 && z2[0] == 5);
    assert_int_equal(qcal_qparams_compute_arrays(&c, 0, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, a, b, s2, NULL, NULL), QCAL_ERR_INVALID_ARG);
    c.qscheme = QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);

    /* Zero range: scale eps, zero-point qmin - round(0) = 0 (quint8 affine). */
    qcal_qconfig_default(&c);
    float zero = 0.0f;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &zero, &zero, s, z, NULL), QCAL_OK);
    assert_true(s[0] == FLT_EPSILON);
    assert_int_equal(z[0], 0);
    /* Span beyond FLT_MAX: PyTorch gives scale inf; qcal a finite scale. */
    float big_lo = -3e38f, big_hi = 3e38f;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &big_lo, &big_hi, s, z, NULL), QCAL_OK);
    assert_true(isfinite(s[0]));
    assert_true(s[0] == (float)(6e38 / 255.0) || fabs(s[0] / (6e38 / 255.0) - 1) < 1e-6);
    assert_int_equal(z[0], 128);
    /* qint32 all-negative affine: PyTorch's int32 conversion overflows (zero-point 0);
     * qcal gives quant_max. */
    c.dtype = QCAL_QINT32;
    float nlo = -3000.0f, nhi = -1.0f;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &nlo, &nhi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 3000.0f / 4294967296.0f);
    assert_int_equal(z[0], INT32_MAX);
    /* quint8 symmetric: zero-point 128; custom [0,15]: (0+15)//2 = 7. */
    c.dtype = QCAL_QUINT8;
    c.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    float slo = -2.0f, shi = 1.0f;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &slo, &shi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 2.0f / 127.5f);
    assert_int_equal(z[0], 128);
    c.custom_range = true;
    c.quant_min = 0;
    c.quant_max = 15;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &slo, &shi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 2.0f / 7.5f);
    assert_int_equal(z[0], 7);
    /* float_qparams: zero-point -min/scale as float; a range below eps gets scale 1. */
    qcal_qconfig_default(&c);
    c.qscheme = QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    float flo[2] = { 1.0f, 5.0f }, fhi[2] = { 3.0f, 5.0f }, fz[2];
    assert_int_equal(qcal_qparams_compute_arrays(&c, 2, flo, fhi, s, NULL, fz), QCAL_OK);
    assert_true(s[0] == 2.0f / 255.0f);
    assert_true(fz[0] == -1.0f / (2.0f / 255.0f));
    assert_true(s[1] == 1.0f && fz[1] == -5.0f);
}

static void test_golden(void **state)
{
    (void)state;
    ref_data d;
    assert_int_equal(ref_load(&d), 0);
    assert_true(d.ncases > 1000);
    int checked = 0, divergent = 0;
    for (int i = 0; i < d.ncases; i++) {
        const ref_case *c = &d.cases[i];
        float s[REF_MAX_CH], zf[REF_MAX_CH];
        int32_t z[REF_MAX_CH];
        qcal_status st = qcal_qparams_compute_arrays(&c->q, c->nch, c->mn, c->mx, s, z, zf);
        if (st != QCAL_OK)
            fail_msg("case %d (%s): %s: %s", i, c->line, qcal_status_str(st), qcal_last_error());
        bool fz = c->q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
        /* The value API gives the same numbers. */
        qcal_qparams qp = {0};
        assert_int_equal(qcal_qparams_compute(&c->q, 0, c->nch, c->mn, c->mx, &qp), QCAL_OK);
        assert_int_equal(qp.channels, c->nch);
        assert_int_equal(qp.qscheme, c->q.qscheme);
        assert_int_equal(qcal_qparams_validate(&qp), QCAL_OK);
        for (int k = 0; k < c->nch; k++) {
            assert_int_equal(ref_bits(qcal_qparams_scale_at(&qp, k)), ref_bits(s[k]));
            if (fz)
                assert_int_equal(ref_bits(qp.zero_points_float[k]), ref_bits(zf[k]));
            else
                assert_int_equal(qcal_qparams_zero_point_at(&qp, k), z[k]);
        }
        qcal_qparams_free(&qp);
        assert_null(qp.scales);
        for (int k = 0; k < c->nch; k++) {
            if (ref_bits(s[k]) != ref_bits(c->scale[k]))
                fail_msg("case %d (%s) channel %d: scale %.9g (0x%08x) != PyTorch %.9g (0x%08x)",
                         i, c->line, k, (double)s[k], ref_bits(s[k]), (double)c->scale[k],
                         ref_bits(c->scale[k]));
            if (fz) {
                if (ref_bits(zf[k]) != ref_bits(c->zpf[k]))
                    fail_msg("case %d (%s) channel %d: float zero-point %.9g != PyTorch %.9g",
                             i, c->line, k, (double)zf[k], (double)c->zpf[k]);
            } else if (ref_qint32_overflow_case(c, k)) {
                int64_t exact = (int64_t)INT32_MIN -
                                (int64_t)nearbyintf(fminf(c->mn[k], 0.0f) / c->scale[k]);
                assert_int_equal(c->zp[k], 0);       /* PyTorch's overflowed value */
                assert_int_equal(z[k], exact > INT32_MAX ? INT32_MAX : exact);
                divergent++;
            } else if (z[k] != c->zp[k]) {
                fail_msg("case %d (%s) channel %d: zero-point %d != PyTorch %d", i, c->line, k,
                         z[k], c->zp[k]);
            }
            checked++;
        }
    }
    print_message("qparams golden: %d cases, %d (scale, zero-point) pairs bit-equal, %d "
                  "documented qint32 divergences\n", d.ncases, checked, divergent);
    assert_true(divergent > 0);
    ref_free(&d);
}

/* Randomised bit-exactness of the float32 formula against an independent statement of
 * PyTorch's arithmetic (the golden file covers PyTorch itself). */
static void test_random_formula(void **state)
{
    (void)state;
    uint64_t seed = 12345;
    qcal_qconfig c;
    qcal_qconfig_default(&c);
    for (int it = 0; it < 200000; it++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int e1 = (int)((seed >> 20) % 60) - 30, e2 = (int)((seed >> 30) % 60) - 30;
        float a = -ldexpf((float)((seed >> 40) & 0xffff) / 65536.0f, e1);
        float b = ldexpf((float)((seed >> 8) & 0xfff) / 4096.0f, e2);
        float s;
        int32_t z;
        assert_int_equal(qcal_qparams_compute_arrays(&c, 1, &a, &b, &s, &z, NULL), QCAL_OK);
        float want = (b - a) / 255.0f;
        want = want > FLT_EPSILON ? want : FLT_EPSILON;
        int32_t wz = (int32_t)(0 - (int64_t)nearbyintf(a / want));
        wz = wz < 0 ? 0 : wz > 255 ? 255 : wz;
        if (ref_bits(s) != ref_bits(want) || z != wz)
            fail_msg("range [%.9g, %.9g]: (%.9g, %d) != (%.9g, %d)", (double)a, (double)b,
                     (double)s, z, (double)want, wz);
    }
}

/* The qcal_qparams value: builders, validation, copy, free, compute. */
static void test_value(void **state)
{
    (void)state;
    qcal_qparams qp = {0};
    qcal_qparams_free(&qp);   /* {0} frees fine */
    qcal_qparams_free(NULL);
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_QUINT8, 0.5f, 3), QCAL_OK);
    assert_true(qp.scale == 0.5f && qp.zero_point == 3 && qp.zero_point_float == 3.0f);
    assert_true(qp.quant_min == 0 && qp.quant_max == 255 && qp.channels == 1);
    assert_true(qp.qscheme == QCAL_PER_TENSOR_AFFINE && !qp.scales && !qp.owned);
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_QINT8, 0.5f, 200), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "zero-point 200"));
    assert_true(qp.scale == 0.5f && qp.zero_point == 3);   /* untouched */
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_QINT8, NAN, 0), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_QINT8, 0.0f, 0), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_per_tensor(&qp, (qcal_dtype)7, 1.0f, 0), QCAL_ERR_INVALID_ARG);
    int64_t lo, hi;
    assert_int_equal(qcal_dtype_range(QCAL_QINT32, &lo, &hi), QCAL_OK);
    assert_true(lo == INT32_MIN && hi == INT32_MAX);

    float sc[3] = { 0.1f, 0.2f, 0.3f };
    int32_t zp[3] = { -1, 0, 5 };
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_QINT8, -1, 3, sc, zp), QCAL_OK);
    assert_true(qp.scales == sc && qp.zero_points == zp && !qp.owned && qp.axis == -1);
    assert_true(qcal_qparams_scale_at(&qp, 2) == 0.3f && qcal_qparams_zero_point_at(&qp, 0) == -1);
    qcal_qparams cp = {0};
    assert_int_equal(qcal_qparams_copy(&cp, &qp), QCAL_OK);
    assert_non_null(cp.owned);
    assert_true(cp.scales != sc && cp.scales[1] == 0.2f && cp.zero_points[2] == 5);
    assert_null(cp.zero_points_float);
    qcal_qparams_free(&qp);        /* a view: the caller's arrays stay */
    assert_true(sc[0] == 0.1f && qp.scales == NULL);
    qcal_qparams_free(&cp);
    assert_null(cp.owned);
    sc[1] = INFINITY;
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_QINT8, 0, 3, sc, zp), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "channel 1"));
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_QINT8, 0, 0, sc, zp), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_QINT8, 0, 3, NULL, zp), QCAL_ERR_INVALID_ARG);

    /* validate: ranges, schemes, arrays on per-tensor values */
    qcal_qparams v;
    assert_int_equal(qcal_qparams_per_tensor(&v, QCAL_QUINT8, 1.0f, 0), QCAL_OK);
    v.quant_max = 256;
    assert_int_equal(qcal_qparams_validate(&v), QCAL_ERR_INVALID_ARG);
    v.quant_max = 127;
    assert_int_equal(qcal_qparams_validate(&v), QCAL_OK);
    v.zero_point = 128;
    assert_int_equal(qcal_qparams_validate(&v), QCAL_ERR_INVALID_ARG);
    v.zero_point = 0;
    v.scales = sc;
    assert_int_equal(qcal_qparams_validate(&v), QCAL_ERR_INVALID_ARG);
    v.scales = NULL;
    v.channels = 2;
    assert_int_equal(qcal_qparams_validate(&v), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_validate(NULL), QCAL_ERR_INVALID_ARG);

    /* compute: per-tensor gives scalars (no allocation), per-channel owned arrays */
    qcal_qconfig c;
    qcal_qconfig_default(&c);
    float mn[2] = { -1.0f, INFINITY }, mx[2] = { 1.0f, -INFINITY };
    assert_int_equal(qcal_qparams_compute(&c, 0, 1, mn, mx, &qp), QCAL_OK);
    assert_null(qp.owned);
    float rs;
    int32_t rz;
    assert_int_equal(qcal_qparams_compute_arrays(&c, 1, mn, mx, &rs, &rz, NULL), QCAL_OK);
    assert_true(qp.scale == 2.0f / 255.0f && qp.scale == rs && qp.channels == 1);
    assert_true(qp.zero_point == rz && (rz == 127 || rz == 128));
    assert_int_equal(qcal_qparams_compute(&c, 0, 2, mn, mx, &qp), QCAL_ERR_INVALID_ARG);
    c.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    c.dtype = QCAL_QINT8;
    assert_int_equal(qcal_qparams_compute(&c, 1, 2, mn, mx, &qp), QCAL_NO_DATA);
    assert_non_null(qp.owned);
    assert_true(qp.axis == 1 && qp.channels == 2 && qp.quant_min == -128 && qp.quant_max == 127);
    assert_true(qp.scales[0] == 1.0f / 127.5f && qp.zero_points[0] == 0);
    assert_true(qp.scales[1] == 1.0f && qp.zero_points[1] == 0);
    assert_int_equal(qcal_qparams_validate(&qp), QCAL_OK);
    qcal_qparams_free(&qp);
    mn[1] = 2.0f;
    mx[1] = 1.0f;
    qp.scale = 9.0f;
    assert_int_equal(qcal_qparams_compute(&c, 1, 2, mn, mx, &qp), QCAL_ERR_INVALID_ARG);
    assert_true(qp.scale == 9.0f && !qp.owned);   /* untouched */
}

/* Every observer configuration the library accepts gives qparams that validate (float
 * qparams, whose zero-points are floats, exempt): every kind x dtype x qscheme x reduce_range
 * x custom range x grid, on data straddling zero, positive only, negative only and all
 * zeros. The fuzzer's state contract found one that did not (quint8 + per_tensor_symmetric
 * + reduce_range: PyTorch's zero-point 128 on [0, 127]); this test finds any such case
 * deterministically. */
static void test_every_observer_config_validates(void **state)
{
    (void)state;
    static const float data[4][6] = {
        { -1.0f, 0.5f, 3.0f, -0.25f, 2.0f, -4.0f },
        { 0.5f, 1.0f, 3.0f, 0.25f, 2.0f, 4.0f },
        { -0.5f, -1.0f, -3.0f, -0.25f, -2.0f, -4.0f },
        { 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f },
    };
    static const int64_t custom[3][2] = { { 0, 0 }, { 0, 15 }, { -8, 7 } };
    int accepted = 0, checked = 0;
    for (int kind = 0; kind < QCAL_OBSERVER_KIND_COUNT; kind++)
        for (int dt = QCAL_QUINT8; dt <= QCAL_FLOAT8_E5M2; dt++)
            for (int qs = QCAL_PER_TENSOR_AFFINE; qs <= QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS; qs++)
                for (int rr = 0; rr < 2; rr++)
                    for (int cr = 0; cr < 3; cr++)
                        for (int grid = QCAL_GRID_LATTICE; grid <= QCAL_GRID_TORCH; grid++) {
                            qcal_observer_config cfg;
                            qcal_observer_config_default(&cfg, (qcal_observer_kind)kind);
                            cfg.q.dtype = (qcal_dtype)dt;
                            cfg.q.qscheme = (qcal_qscheme)qs;
                            cfg.q.reduce_range = rr;
                            cfg.q.custom_range = cr > 0;
                            if (cr > 0) {
                                cfg.q.quant_min = custom[cr][0];
                                cfg.q.quant_max = custom[cr][1];
                            }
                            cfg.grid = (qcal_observer_grid)grid;
                            cfg.bins = 256;
                            qcal_observer *o = NULL;
                            if (qcal_observer_create(&cfg, &o) != QCAL_OK) {
                                assert_null(o);
                                continue;
                            }
                            accepted++;
                            for (int d = 0; d < 4; d++) {
                                qcal_tensor t;
                                int64_t shape[2] = { 2, 3 };
                                assert_int_equal(qcal_tensor_init(&t, data[d], 2, shape), QCAL_OK);
                                assert_int_equal(qcal_observer_reset(o), QCAL_OK);
                                assert_int_equal(qcal_observer_update(o, &t), QCAL_OK);
                                qcal_qparams qp = { 0 };
                                qcal_status st = qcal_observer_qparams(o, &qp);
                                if (st == QCAL_OK &&
                                    qp.qscheme != QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
                                    st = qcal_qparams_validate(&qp);
                                if (st != QCAL_OK)
                                    print_error("kind %d dtype %d qscheme %d reduce_range %d "
                                                "custom %d grid %d data %d: %s\n", kind, dt, qs,
                                                rr, cr, grid, d, qcal_last_error());
                                assert_int_equal(st, QCAL_OK);
                                qcal_qparams_free(&qp);
                                checked++;
                            }
                            qcal_observer_destroy(&o);
                        }
    print_message("observer configurations: %d accepted, %d qparams validated\n", accepted,
                  checked);
    assert_true(accepted >= 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_observer_config_validates),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_compute_edges),
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_random_formula),
        cmocka_unit_test(test_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
