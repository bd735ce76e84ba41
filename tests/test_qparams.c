/* unit.qparams: qconfig ranges and validation, names, qparams_compute edge cases and the
 * golden comparison against PyTorch 1.13 (_calculate_qparams on PyTorch's own min/max). */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "minmax_ref_reader.h"
#include "qcal/qcal.h"

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
    expect_range_fail(QCAL_QUINT8, QCAL_PER_TENSOR_SYMMETRIC, true, false, 0, 0, e,
                      QCAL_ERR_UNSUPPORTED);
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
    assert_int_equal(qcal_qparams_compute(&c, 3, mn, mx, s, z, NULL), QCAL_NO_DATA);
    for (int i = 0; i < 3; i++) {
        assert_true(s[i] == 1.0f);
        assert_int_equal(z[i], 0);
    }
    /* Mixed: channel 1 has data; QCAL_NO_DATA still (ANY pair without data, as documented). */
    mn[1] = -1.0f;
    mx[1] = 1.0f;
    c.qscheme = QCAL_PER_CHANNEL_AFFINE;
    assert_int_equal(qcal_qparams_compute(&c, 3, mn, mx, s, z, NULL), QCAL_NO_DATA);
    assert_true(s[1] == 2.0f / 255.0f);
    assert_int_equal(z[1], (int32_t)(0 - nearbyintf(-1.0f / (2.0f / 255.0f))));
    assert_true(s[0] == 1.0f && z[0] == 0);
    /* Failures leave outputs untouched. */
    float s2[2] = { 5, 5 };
    int32_t z2[2] = { 5, 5 };
    float a[2] = { 0.0f, 2.0f }, b[2] = { 1.0f, 1.0f };
    assert_int_equal(qcal_qparams_compute(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "min 2 > max 1"));
    assert_true(s2[0] == 5 && s2[1] == 5 && z2[0] == 5 && z2[1] == 5);
    a[1] = NAN;
    assert_int_equal(qcal_qparams_compute(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    a[1] = -INFINITY;
    assert_int_equal(qcal_qparams_compute(&c, 2, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_true(s2[0] == 5 && z2[0] == 5);
    assert_int_equal(qcal_qparams_compute(&c, 0, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_qparams_compute(&c, 1, a, b, s2, NULL, NULL), QCAL_ERR_INVALID_ARG);
    c.qscheme = QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    assert_int_equal(qcal_qparams_compute(&c, 1, a, b, s2, z2, NULL), QCAL_ERR_INVALID_ARG);

    /* Zero range: scale eps, zero-point qmin - round(0) = 0 (quint8 affine). */
    qcal_qconfig_default(&c);
    float zero = 0.0f;
    assert_int_equal(qcal_qparams_compute(&c, 1, &zero, &zero, s, z, NULL), QCAL_OK);
    assert_true(s[0] == FLT_EPSILON);
    assert_int_equal(z[0], 0);
    /* Span beyond FLT_MAX: PyTorch gives scale inf; qcal a finite scale. */
    float big_lo = -3e38f, big_hi = 3e38f;
    assert_int_equal(qcal_qparams_compute(&c, 1, &big_lo, &big_hi, s, z, NULL), QCAL_OK);
    assert_true(isfinite(s[0]));
    assert_true(s[0] == (float)(6e38 / 255.0) || fabs(s[0] / (6e38 / 255.0) - 1) < 1e-6);
    assert_int_equal(z[0], 128);
    /* qint32 all-negative affine: PyTorch's int32 conversion overflows (zero-point 0);
     * qcal gives quant_max. */
    c.dtype = QCAL_QINT32;
    float nlo = -3000.0f, nhi = -1.0f;
    assert_int_equal(qcal_qparams_compute(&c, 1, &nlo, &nhi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 3000.0f / 4294967296.0f);
    assert_int_equal(z[0], INT32_MAX);
    /* quint8 symmetric: zero-point 128; custom [0,15]: (0+15)//2 = 7. */
    c.dtype = QCAL_QUINT8;
    c.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    float slo = -2.0f, shi = 1.0f;
    assert_int_equal(qcal_qparams_compute(&c, 1, &slo, &shi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 2.0f / 127.5f);
    assert_int_equal(z[0], 128);
    c.custom_range = true;
    c.quant_min = 0;
    c.quant_max = 15;
    assert_int_equal(qcal_qparams_compute(&c, 1, &slo, &shi, s, z, NULL), QCAL_OK);
    assert_true(s[0] == 2.0f / 7.5f);
    assert_int_equal(z[0], 7);
    /* float_qparams: zero-point -min/scale as float; a range below eps gets scale 1. */
    qcal_qconfig_default(&c);
    c.qscheme = QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    float flo[2] = { 1.0f, 5.0f }, fhi[2] = { 3.0f, 5.0f }, fz[2];
    assert_int_equal(qcal_qparams_compute(&c, 2, flo, fhi, s, NULL, fz), QCAL_OK);
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
        qcal_status st = qcal_qparams_compute(&c->q, c->nch, c->mn, c->mx, s, z, zf);
        if (st != QCAL_OK)
            fail_msg("case %d (%s): %s: %s", i, c->line, qcal_status_str(st), qcal_last_error());
        bool fz = c->q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
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
        assert_int_equal(qcal_qparams_compute(&c, 1, &a, &b, &s, &z, NULL), QCAL_OK);
        float want = (b - a) / 255.0f;
        want = want > FLT_EPSILON ? want : FLT_EPSILON;
        int32_t wz = (int32_t)(0 - (int64_t)nearbyintf(a / want));
        wz = wz < 0 ? 0 : wz > 255 ? 255 : wz;
        if (ref_bits(s) != ref_bits(want) || z != wz)
            fail_msg("range [%.9g, %.9g]: (%.9g, %d) != (%.9g, %d)", (double)a, (double)b,
                     (double)s, z, (double)want, wz);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_compute_edges),
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_random_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
