/* qcal/ptq.h: weight ranges and their ratio, cross-layer equalization (dense, depthwise,
 * grouped; the function l2(relu(l1(x))) kept, checked with a small reference evaluator),
 * bias absorption, weight fake-quant, bias correction and the rectified-normal mean, each
 * against numbers worked out by hand or computed independently here. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qcal/qcal.h"

#define OK(x) assert_int_equal((x), QCAL_OK)

static uint32_t rng = 2024;
static float frand(void)   /* uniform in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) / 8388608.0 - 1.0);
}

static int64_t wcount(const qcal_ptq_layer *l)
{
    return l->out_channels * (l->in_channels / l->groups) * l->kernel;
}

/* y[o] = b[o] + sum_{c in group, k} w[o, c, k] x[c, k]: one output position of a conv
 * (no padding) reading the patch x [in_channels, kernel]. */
static void layer_eval(const qcal_ptq_layer *l, const double *x, double *y)
{
    int64_t cin = l->in_channels / l->groups, cout = l->out_channels / l->groups;
    for (int64_t o = 0; o < l->out_channels; o++) {
        double acc = l->bias ? l->bias[o] : 0.0;
        for (int64_t c = 0; c < cin; c++)
            for (int64_t k = 0; k < l->kernel; k++)
                acc += (double)l->weight[(o * cin + c) * l->kernel + k] * x[(o / cout * cin + c) * l->kernel + k];
        y[o] = acc;
    }
}

/* l2(relu(l1(.))) over l2->kernel patches of l1's input (each [in1, k1]); out [out2]. */
static void pair_eval(const qcal_ptq_layer *l1, const qcal_ptq_layer *l2, const double *patches, double *out)
{
    int64_t c1 = l1->out_channels, k2 = l2->kernel, p1 = l1->in_channels * l1->kernel;
    double *h = calloc((size_t)(c1 * k2), sizeof *h), *y = calloc((size_t)c1, sizeof *y);
    for (int64_t k = 0; k < k2; k++) {
        layer_eval(l1, patches + k * p1, y);
        for (int64_t c = 0; c < c1; c++)
            h[c * k2 + k] = y[c] > 0.0 ? y[c] : 0.0;
    }
    layer_eval(l2, h, out);
    free(h);
    free(y);
}

static void fill(float *v, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
}

static void test_ranges_and_ratio(void **state)
{
    (void)state;
    // [3 out, 2 in, kernel 2]
    float w[12] = { 1, -2, 0.5f, 0, /* r 2 */ 0.1f, 0, 0, -0.25f, /* r 0.25 */ 4, 0, 0, 0 /* r 4 */ };
    qcal_ptq_layer l = { w, NULL, 3, 2, 1, 2 };
    float r[3], ri[2];
    OK(qcal_ptq_channel_ranges(&l, r));
    assert_true(r[0] == 2.0f && r[1] == 0.25f && r[2] == 4.0f);
    OK(qcal_ptq_input_ranges(&l, ri));
    assert_true(ri[0] == 4.0f && ri[1] == 0.5f);
    double ratio;
    float lo, hi;
    OK(qcal_ptq_range_ratio(&l, &ratio, &lo, &hi));
    assert_true(ratio == 16.0 && lo == 0.25f && hi == 4.0f);
    w[4] = w[7] = 0.0f;   // an all-zero channel: +inf
    OK(qcal_ptq_range_ratio(&l, &ratio, NULL, NULL));
    assert_true(isinf(ratio));
    qcal_ptq_layer bad = { w, NULL, 3, 2, 2, 2 };   // 3 outputs not a multiple of 2 groups
    assert_int_equal(qcal_ptq_channel_ranges(&bad, r), QCAL_ERR_INVALID_ARG);
    w[0] = NAN;
    assert_int_equal(qcal_ptq_channel_ranges(&l, r), QCAL_ERR_NONFINITE);
}

/* Equalizes l1 -> ReLU -> l2 and checks the function, the balanced ranges and the scales. */
static void check_pair(int64_t in1, int64_t c, int64_t g1, int64_t k1, int64_t out2, int64_t g2, int64_t k2)
{
    qcal_ptq_layer l1 = { NULL, NULL, c, in1, g1, k1 }, l2 = { NULL, NULL, out2, c, g2, k2 };
    l1.weight = malloc((size_t)wcount(&l1) * sizeof(float));
    l2.weight = malloc((size_t)wcount(&l2) * sizeof(float));
    l1.bias = malloc((size_t)c * sizeof(float));
    l2.bias = malloc((size_t)out2 * sizeof(float));
    fill(l1.weight, wcount(&l1), 1.0f);
    fill(l2.weight, wcount(&l2), 1.0f);
    // diverging channel ranges, as BatchNorm folding makes them: 1e-2 .. 1e2
    int64_t row1 = wcount(&l1) / c;
    for (int64_t o = 0; o < c; o++) {
        float f = powf(10.0f, -2.0f + 4.0f * (float)o / (float)(c > 1 ? c - 1 : 1));
        for (int64_t j = 0; j < row1; j++)
            l1.weight[o * row1 + j] *= f;
    }
    fill(l1.bias, c, 0.5f);
    fill(l2.bias, out2, 0.5f);
    float *r1 = malloc((size_t)c * sizeof(float)), *r2 = malloc((size_t)c * sizeof(float)),
          *s = malloc((size_t)c * sizeof(float));
    OK(qcal_ptq_channel_ranges(&l1, r1));
    OK(qcal_ptq_input_ranges(&l2, r2));
    int64_t np = k2 * in1 * k1, trials = 8;
    double *x = malloc((size_t)np * sizeof(double)), *ya = malloc((size_t)(out2 * trials) * sizeof(double)),
           *yb = malloc((size_t)out2 * sizeof(double));
    uint32_t seed = rng;
    for (int64_t t = 0; t < trials; t++) {
        for (int64_t i = 0; i < np; i++)
            x[i] = frand();
        pair_eval(&l1, &l2, x, ya + t * out2);
    }
    OK(qcal_ptq_equalize_pair(&l1, &l2, s));
    float *q1 = malloc((size_t)c * sizeof(float)), *q2 = malloc((size_t)c * sizeof(float));
    OK(qcal_ptq_channel_ranges(&l1, q1));
    OK(qcal_ptq_input_ranges(&l2, q2));
    for (int64_t i = 0; i < c; i++) {
        double want = sqrt((double)r1[i] * r2[i]);
        assert_true(fabs(s[i] - sqrt((double)r1[i] * r2[i]) / r2[i]) <= 1e-6 * s[i]);
        assert_true(fabs(q1[i] - want) <= 1e-5 * want && fabs(q2[i] - want) <= 1e-5 * want);
    }
    rng = seed;
    double worst = 0.0, scale = 0.0;
    for (int64_t t = 0; t < trials; t++) {
        for (int64_t i = 0; i < np; i++)
            x[i] = frand();
        pair_eval(&l1, &l2, x, yb);
        for (int64_t o = 0; o < out2; o++) {
            worst = fmax(worst, fabs(yb[o] - ya[t * out2 + o]));
            scale = fmax(scale, fabs(ya[t * out2 + o]));
        }
    }
    if (worst > 1e-5 * scale)
        fail_msg("equalized pair differs: worst %g of scale %g (in1 %lld c %lld g2 %lld)", worst, scale,
                 (long long)in1, (long long)c, (long long)g2);
    free(l1.weight), free(l2.weight), free(l1.bias), free(l2.bias);
    free(r1), free(r2), free(s), free(q1), free(q2), free(x), free(ya), free(yb);
}

static void test_equalize_preserves_function(void **state)
{
    (void)state;
    check_pair(3, 8, 1, 9, 5, 1, 9);     // conv 3x3 -> conv 3x3
    check_pair(4, 16, 1, 1, 16, 16, 9);  // pointwise -> depthwise 3x3
    check_pair(16, 16, 16, 9, 24, 1, 1); // depthwise -> pointwise
    check_pair(6, 12, 1, 1, 8, 4, 4);    // grouped layer 2
    check_pair(10, 7, 1, 1, 3, 1, 1);    // Gemm -> Gemm
}

static void test_equalize_errors(void **state)
{
    (void)state;
    float w1[6] = { 1, 2, 3, 4, 5, 6 }, w2[6] = { 1, 2, 3, 4, 5, 6 }, keep[6];
    qcal_ptq_layer a = { w1, NULL, 3, 2, 1, 1 }, b = { w2, NULL, 3, 2, 1, 1 };   // b reads 2, a writes 3
    memcpy(keep, w1, sizeof keep);
    assert_int_equal(qcal_ptq_equalize_pair(&a, &b, NULL), QCAL_ERR_MISMATCH);
    assert_memory_equal(keep, w1, sizeof keep);
    assert_non_null(strstr(qcal_last_error(), "3 output channels, layer 2 reads 2"));
    assert_int_equal(qcal_ptq_equalize_pair(NULL, &b, NULL), QCAL_ERR_INVALID_ARG);
    // a zero channel keeps scale 1
    float z1[4] = { 0, 0, 2, 2 }, z2[4] = { 1, 1, 8, 8 }, s[2];
    qcal_ptq_layer c = { z1, NULL, 2, 2, 1, 1 }, d = { z2, NULL, 2, 2, 1, 1 };
    OK(qcal_ptq_equalize_pair(&c, &d, s));
    assert_true(s[0] == 1.0f);
    assert_true(fabsf(s[1] - 0.5f) < 1e-7f);   // sqrt(2 / 8)
}

static void test_absorb_bias(void **state)
{
    (void)state;
    // l1: 2 channels; pre-activation ~ N(beta, gamma^2); c = max(0, beta - 3|gamma|)
    float w1[2] = { 1, 1 }, b1[2] = { 5, 0.5f }, w2[4] = { 1, 2, -3, 4 }, b2[2] = { 0.25f, -1 };
    float beta[2] = { 5, 0.5f }, gamma[2] = { 1, 1 }, c[2];
    qcal_ptq_layer l1 = { w1, b1, 2, 2, 2, 1 }, l2 = { w2, b2, 2, 2, 1, 1 };
    OK(qcal_ptq_absorb_bias(&l1, &l2, beta, gamma, 3.0f, c));
    assert_true(c[0] == 2.0f && c[1] == 0.0f);
    assert_true(b1[0] == 3.0f && b1[1] == 0.5f);
    assert_true(b2[0] == 0.25f + 1 * 2.0f && b2[1] == -1.0f + -3 * 2.0f);
    // the function is unchanged where the pre-activation stays above c: x >= -3 here
    double x = -1.0, h0 = fmax(x * 1 + 3, 0), h1 = fmax(x + 0.5, 0);
    double y0 = 0.25 + 1 * fmax(x + 5, 0) + 2 * fmax(x + 0.5, 0);
    assert_true(fabs(b2[0] + 1 * h0 + 2 * h1 - y0) < 1e-6);
    assert_int_equal(qcal_ptq_absorb_bias(&l1, &l2, beta, gamma, -1.0f, c), QCAL_ERR_INVALID_ARG);
    qcal_ptq_layer nob = { w2, NULL, 2, 2, 1, 1 };
    assert_int_equal(qcal_ptq_absorb_bias(&l1, &nob, beta, gamma, 3.0f, c), QCAL_ERR_INVALID_ARG);
}

static void test_weight_fake_quant(void **state)
{
    (void)state;
    // per-channel symmetric qint8: scale = max|w| / 127.5 (PyTorch: (max - min) / 255 over [-amax, amax])
    float w[4] = { 1.0f, -0.5f, 0.3f, 0.01f }, d[4];
    qcal_ptq_layer l = { w, NULL, 2, 2, 1, 1 };
    qcal_qconfig q;
    qcal_qconfig_default(&q);
    q.dtype = QCAL_QINT8;
    q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    OK(qcal_ptq_weight_fake_quant(&l, &q, d));
    float s0 = 2.0f / 255.0f, s1 = 0.6f / 255.0f;
    assert_true(d[0] == nearbyintf(1.0f / s0) * s0 && d[1] == nearbyintf(-0.5f / s0) * s0);
    assert_true(fabsf(d[2] - 127.0f * s1) <= 1e-7f);   // 0.3 / s1 = 127.5: rounds to 128, clamped to 127
    assert_true(fabsf(d[3] - nearbyintf(0.01f / s1) * s1) <= 1e-7f);
    // per-tensor affine qint8 over [-0.5, 1]: scale 1.5 / 255, zero-point -128 + round(0.5 / scale)
    q.qscheme = QCAL_PER_TENSOR_AFFINE;
    OK(qcal_ptq_weight_fake_quant(&l, &q, d));
    float s = 1.5f / 255.0f;
    int32_t zp = -128 - (int32_t)nearbyintf(-0.5f / s);
    for (int i = 0; i < 4; i++) {
        float want = ((float)(zp + (int32_t)nearbyintf(w[i] * (1.0f / s))) - (float)zp) * s;
        if (fabsf(d[i] - want) > 1e-6f)
            fail_msg("per-tensor fake-quant of w[%d] = %g: %g, want %g", i, (double)w[i], (double)d[i], (double)want);
        assert_true(fabsf(d[i] - w[i]) <= s / 2 + 1e-7f);
    }
}

static void test_bias_correct(void **state)
{
    (void)state;
    // [2 out, 2 in, kernel 2]; shift[o] = sum_c (sum_k wq - w) * mean[c]
    float w[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, wq[8] = { 1.5f, 2, 3, 3.5f, 5, 6.25f, 7, 8.25f };
    float b[2] = { 10, 20 }, mean[2] = { 2, -1 }, shift[2];
    qcal_ptq_layer l = { w, b, 2, 2, 1, 2 };
    OK(qcal_ptq_bias_correct(&l, wq, mean, shift));
    // o0: c0 (0.5 + 0) * 2 + c1 (0 - 0.5) * -1 = 1.5; o1: c0 0.25 * 2 + c1 0.25 * -1 = 0.25
    assert_true(shift[0] == 1.5f && shift[1] == 0.25f);
    assert_true(b[0] == 8.5f && b[1] == 19.75f);
    // depthwise: output o reads input o only
    float dw[2] = { 1, 1 }, dwq[2] = { 1.5f, 0.5f }, db[2] = { 0, 0 };
    qcal_ptq_layer d = { dw, db, 2, 2, 2, 1 };
    OK(qcal_ptq_bias_correct(&d, dwq, mean, NULL));
    assert_true(db[0] == -1.0f && db[1] == -0.5f);
    float nanmean[2] = { NAN, 0 };
    assert_int_equal(qcal_ptq_bias_correct(&d, dwq, nanmean, NULL), QCAL_ERR_NONFINITE);
    qcal_ptq_layer nob = { dw, NULL, 2, 2, 2, 1 };
    assert_int_equal(qcal_ptq_bias_correct(&nob, dwq, mean, NULL), QCAL_ERR_INVALID_ARG);
}

static void test_relu_normal_mean(void **state)
{
    (void)state;
    float mu[5] = { 0, 1, 1, -1, -3 }, sd[5] = { 1, 1, 0, 0, 2 }, out[5];
    OK(qcal_ptq_relu_normal_mean(5, mu, sd, out));
    assert_true(fabs(out[0] - 0.3989422804) < 1e-6);     // 1 / sqrt(2 pi)
    assert_true(fabs(out[1] - 1.0833154705) < 1e-6);     // Phi(1) + phi(1)
    assert_true(out[2] == 1.0f && out[3] == 0.0f);
    // mu -3, sigma 2: -3 Phi(-1.5) + 2 phi(1.5) = -3 * 0.0668072013 + 2 * 0.1295175957
    assert_true(fabs(out[4] - (-3 * 0.0668072013 + 2 * 0.1295175957)) < 1e-6);
    float bad[1] = { INFINITY };
    assert_int_equal(qcal_ptq_relu_normal_mean(1, bad, sd, out), QCAL_ERR_NONFINITE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_and_ratio),
        cmocka_unit_test(test_equalize_preserves_function),
        cmocka_unit_test(test_equalize_errors),
        cmocka_unit_test(test_absorb_bias),
        cmocka_unit_test(test_weight_fake_quant),
        cmocka_unit_test(test_bias_correct),
        cmocka_unit_test(test_relu_normal_mean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
