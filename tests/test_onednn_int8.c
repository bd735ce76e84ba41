/* unit.onednn_int8: the int8 runtime (qcal/int8.h) against a fake-quant float simulation of
 * the same layers, the input quantization (the library's quantize under each ISA cap) and
 * error paths. */
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

#include "core/cpu.h"
#include "qcal/calib.h"
#include "qcal/int8.h"
#include "qcal/observer.h"
#include "qcal/npy.h"
#include "qcal/quantize.h"
#include "qcal/tensor.h"
#include "qcal/threads.h"
#include "qcal_config.h"

/* ------------------------------------------------------------------ helpers */

/* A quint8 per-tensor qparams value set by hand (not validated: the int8 calls check it). */
static qcal_qparams u8q(float scale, int32_t zp)
{
    qcal_qparams q = {.dtype = QCAL_QUINT8, .qscheme = QCAL_PER_TENSOR_AFFINE, .quant_min = 0,
                      .quant_max = 255, .channels = 1, .scale = scale, .zero_point = zp,
                      .zero_point_float = (float)zp};
    return q;
}
/* Its address, valid in the enclosing block (a compound literal). */
#define U8Q(s_, zp_) (&(qcal_qparams){.dtype = QCAL_QUINT8, .qscheme = QCAL_PER_TENSOR_AFFINE, \
    .quant_min = 0, .quant_max = 255, .channels = 1, .scale = (s_), .zero_point = (zp_),      \
    .zero_point_float = (float)(zp_)})

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static uint32_t rng_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rng_u32() & 0xffffff) / (float)0x1000000;
}

static float *rand_array(int64_t n, float lo, float hi)
{
    float *a = malloc((size_t)n * sizeof *a);
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++)
        a[i] = rng_uniform(lo, hi);
    return a;
}

/* The rounding contract of qcal/quantize.h (PyTorch's quantize_per_tensor). */
static int32_t ref_quant(float x, float scale, int32_t zp, int32_t qmin, int32_t qmax)
{
    float v = x * (1.0f / scale);
    if (v != v)
        return zp;
    float q = (float)zp + nearbyintf(v);
    q = q < (float)qmin ? (float)qmin : q;
    q = q > (float)qmax ? (float)qmax : q;
    return (int32_t)q;
}

/* PyTorch MinMaxObserver(quint8, per_tensor_affine) qparams for [mn, mx]. */
static void ref_qparams_u8(float mn, float mx, float *scale, int32_t *zp)
{
    float min_neg = mn < 0.0f ? mn : 0.0f, max_pos = mx > 0.0f ? mx : 0.0f;
    float s = (max_pos - min_neg) / 255.0f;
    s = s > FLT_EPSILON ? s : FLT_EPSILON;
    int32_t z = 0 - (int32_t)nearbyintf(min_neg / s);
    z = z < 0 ? 0 : (z > 255 ? 255 : z);
    *scale = s;
    *zp = z;
}

/* Per-channel symmetric qint8 weight fake-quant: wd gets the dequantized weights. */
static void ref_weights(const float *w, int64_t oc, int64_t k, float *ws, float *wd)
{
    for (int64_t o = 0; o < oc; o++) {
        float mn = 0.0f, mx = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            mn = fminf(mn, w[o * k + j]);
            mx = fmaxf(mx, w[o * k + j]);
        }
        float s = fmaxf(-mn, mx) / 127.5f;
        s = s > FLT_EPSILON ? s : FLT_EPSILON;
        ws[o] = s;
        for (int64_t j = 0; j < k; j++)
            wd[o * k + j] = (float)ref_quant(w[o * k + j], s, 0, -128, 127) * s;
    }
}

/* Fake-quant of an activation tensor in place (quint8). */
static void ref_fq(float *x, int64_t n, float s, int32_t zp)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(ref_quant(x[i], s, zp, 0, 255) - zp) * s;
}

/* Float conv2d, NCHW, double accumulation: y [n, oc, oh, ow]. */
static void ref_conv(const float *x, int64_t n, int64_t c, int64_t h, int64_t w, const float *wd,
                     const float *bias, int64_t oc, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                     int64_t ph, int64_t pw, bool relu, float *y, int64_t *poh, int64_t *pow_)
{
    int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
    for (int64_t b = 0; b < n; b++)
        for (int64_t o = 0; o < oc; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = bias ? bias[o] : 0.0;
                    for (int64_t ci = 0; ci < c; ci++)
                        for (int64_t u = 0; u < kh; u++)
                            for (int64_t v = 0; v < kw; v++) {
                                int64_t yy = i * sh - ph + u, xx = j * sw - pw + v;
                                if (yy < 0 || yy >= h || xx < 0 || xx >= w)
                                    continue;
                                acc += (double)x[((b * c + ci) * h + yy) * w + xx] *
                                       (double)wd[((o * c + ci) * kh + u) * kw + v];
                            }
                    float r = (float)acc;
                    y[((b * oc + o) * oh + i) * ow + j] = relu && r < 0.0f ? 0.0f : r;
                }
    *poh = oh;
    *pow_ = ow;
}

static void ref_linear(const float *x, int64_t n, int64_t k, const float *wd, const float *bias,
                       int64_t oc, bool relu, float *y)
{
    for (int64_t b = 0; b < n; b++)
        for (int64_t o = 0; o < oc; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int64_t j = 0; j < k; j++)
                acc += (double)x[b * k + j] * (double)wd[o * k + j];
            float r = (float)acc;
            y[b * oc + o] = relu && r < 0.0f ? 0.0f : r;
        }
}

static void ref_maxpool(const float *x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                        int64_t s, int64_t p, float *y, int64_t *poh, int64_t *pow_)
{
    int64_t oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
    for (int64_t b = 0; b < n * c; b++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                float m = -INFINITY;
                for (int64_t u = 0; u < k; u++)
                    for (int64_t v = 0; v < k; v++) {
                        int64_t yy = i * s - p + u, xx = j * s - p + v;
                        if (yy >= 0 && yy < h && xx >= 0 && xx < w)
                            m = fmaxf(m, x[(b * h + yy) * w + xx]);
                    }
                y[(b * oh + i) * ow + j] = m;
            }
    *poh = oh;
    *pow_ = ow;
}

static void minmax(const float *x, int64_t n, float *mn, float *mx)
{
    *mn = INFINITY;
    *mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        *mn = fminf(*mn, x[i]);
        *mx = fmaxf(*mx, x[i]);
    }
}

/* Compares u8 codes to the reference quantized with (s, zp): asserts >= 99.9 % within one
 * step and none beyond max_steps; prints the worst element. Returns the fraction exact. */
static double compare_codes(const char *what, const uint8_t *got, const float *ref_real,
                            int64_t n, float s, int32_t zp, int max_steps)
{
    int64_t within1 = 0, exact = 0, worst_i = 0;
    int worst = -1;
    for (int64_t i = 0; i < n; i++) {
        int32_t r = ref_quant(ref_real[i], s, zp, 0, 255);
        int d = abs((int)got[i] - r);
        within1 += d <= 1;
        exact += d == 0;
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
    }
    double frac = (double)within1 / (double)n;
    if (frac < 0.999 || worst > max_steps)
        print_error("%s: %lld / %lld within one step (%.5f); worst element %lld: got %d, "
                    "reference %d (real %.6g)\n", what, (long long)within1, (long long)n, frac,
                    (long long)worst_i, got[worst_i],
                    ref_quant(ref_real[worst_i], s, zp, 0, 255), (double)ref_real[worst_i]);
    assert_true(frac >= 0.999);
    assert_true(worst <= max_steps);
    return (double)exact / (double)n;
}

/* ------------------------------------------------------------------ layer tests */

typedef struct conv_case {
    int64_t n, c, h, w, oc, kh, kw, sh, sw, ph, pw;
    bool relu, bias;
    float in_lo, in_hi;
    uint64_t seed;
} conv_case;

static void expect_err(qcal_status got, qcal_status want, const char *needle);

/* Options of the nets run_conv_case builds (NULL: defaults). */
static const qcal_int8_net_options *g_conv_opt;

static void run_conv_case(const conv_case *cc)
{
    rng_seed(cc->seed);
    int64_t in_n = cc->n * cc->c * cc->h * cc->w, k = cc->c * cc->kh * cc->kw;
    float *x = rand_array(in_n, cc->in_lo, cc->in_hi);
    float *w = rand_array(cc->oc * k, -0.5f, 0.5f);
    float *b = rand_array(cc->oc, -0.3f, 0.3f);
    float in_s;
    int32_t in_zp;
    ref_qparams_u8(cc->in_lo, cc->in_hi, &in_s, &in_zp);

    /* fake-quant simulation */
    float *xd = malloc((size_t)in_n * sizeof *xd);
    float *ws = malloc((size_t)cc->oc * sizeof *ws), *wd = malloc((size_t)(cc->oc * k) * sizeof *wd);
    memcpy(xd, x, (size_t)in_n * sizeof *xd);
    ref_fq(xd, in_n, in_s, in_zp);
    ref_weights(w, cc->oc, k, ws, wd);
    int64_t oh = (cc->h + 2 * cc->ph - cc->kh) / cc->sh + 1;
    int64_t ow = (cc->w + 2 * cc->pw - cc->kw) / cc->sw + 1;
    int64_t out_n = cc->n * cc->oc * oh * ow;
    float *y = malloc((size_t)out_n * sizeof *y);
    ref_conv(xd, cc->n, cc->c, cc->h, cc->w, wd, cc->bias ? b : NULL, cc->oc, cc->kh, cc->kw,
             cc->sh, cc->sw, cc->ph, cc->pw, cc->relu, y, &oh, &ow);
    float mn, mx, out_s;
    int32_t out_zp;
    minmax(y, out_n, &mn, &mx);
    ref_qparams_u8(mn, mx, &out_s, &out_zp);

    /* int8 net */
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {cc->c, cc->h, cc->w};
    assert_int_equal(qcal_int8_net_create(g_conv_opt, 3, shape, U8Q(in_s, in_zp), &net), QCAL_OK);
    qcal_int8_conv2d_params p;
    qcal_int8_conv2d_params_default(&p);
    p.out_channels = cc->oc;
    p.kernel_h = cc->kh;
    p.kernel_w = cc->kw;
    p.stride_h = cc->sh;
    p.stride_w = cc->sw;
    p.pad_h = cc->ph;
    p.pad_w = cc->pw;
    p.weight = w;
    p.bias = cc->bias ? b : NULL;
    p.relu = cc->relu;
    p.out_qparams = U8Q(out_s, out_zp);
    assert_int_equal(qcal_int8_net_add_conv2d(net, &p), QCAL_OK);
    int32_t ndim;
    int64_t oshape[3];
    assert_int_equal(qcal_int8_net_output_shape(net, &ndim, oshape), QCAL_OK);
    assert_int_equal(ndim, 3);
    assert_int_equal(oshape[0], cc->oc);
    assert_int_equal(oshape[1], oh);
    assert_int_equal(oshape[2], ow);
    /* weight scales: bit-identical to PyTorch's per-channel symmetric formula */
    float *got_ws = malloc((size_t)cc->oc * sizeof *got_ws);
    int64_t nws = 0;
    assert_int_equal(qcal_int8_net_weight_scales(net, 0, cc->oc, got_ws, &nws), QCAL_OK);
    assert_int_equal(nws, cc->oc);
    assert_memory_equal(got_ws, ws, (size_t)cc->oc * sizeof *ws);

    uint8_t *q = malloc((size_t)out_n);
    assert_int_equal(qcal_int8_net_forward_u8(net, cc->n, x, q), QCAL_OK);
    char what[160];
    snprintf(what, sizeof what, "conv n%lld c%lld %lldx%lld oc%lld k%lldx%lld s%lldx%lld p%lldx%lld "
             "relu%d zp_in %d zp_out %d", (long long)cc->n, (long long)cc->c, (long long)cc->h,
             (long long)cc->w, (long long)cc->oc, (long long)cc->kh, (long long)cc->kw,
             (long long)cc->sh, (long long)cc->sw, (long long)cc->ph, (long long)cc->pw,
             cc->relu, in_zp, out_zp);
    double exact = compare_codes(what, q, y, out_n, out_s, out_zp, 1);
    assert_true(exact > 0.95);   /* differences are rare rounding ties, not systematic */

    /* f32 path of forward: dequantized codes */
    float *yd = malloc((size_t)out_n * sizeof *yd);
    assert_int_equal(qcal_int8_net_forward(net, cc->n, x, yd), QCAL_OK);
    for (int64_t i = 0; i < out_n; i++)
        assert_true(yd[i] == (float)((int32_t)q[i] - out_zp) * out_s);
    const char *impl = NULL;
    assert_int_equal(qcal_int8_net_impl(net, 0, &impl), QCAL_OK);
    assert_non_null(impl);
    qcal_int8_net_destroy(&net);
    assert_null(net);
    free(x); free(w); free(b); free(xd); free(ws); free(wd); free(y); free(q); free(yd);
    free(got_ws);
}

static void test_conv_relu_zp(void **state)
{
    (void)state;
    conv_case cc = {3, 3, 11, 9, 5, 3, 3, 2, 1, 1, 0, true, true, -2.0f, 1.5f, 1};
    run_conv_case(&cc);
}

static void test_conv_no_relu_odd(void **state)
{
    (void)state;
    conv_case cc = {2, 17, 13, 10, 19, 5, 3, 1, 2, 2, 1, false, true, -0.7f, 3.0f, 2};
    run_conv_case(&cc);
    conv_case cc2 = {1, 6, 7, 7, 3, 1, 1, 1, 1, 0, 0, false, false, 0.5f, 4.0f, 3};
    run_conv_case(&cc2);
}

/* One conv (full-range weights, inputs up to code 255: two products reach 2 * 255 * 127,
 * beyond int16) then one linear, built with the given weight_split; returns the u8 codes. */
static uint8_t *split_net_codes(qcal_int8_split split, const char **impl0)
{
    rng_seed(31);
    const int64_t n = 6, c = 8, h = 9, w = 9, oc = 12, k = c * 3 * 3, f = 10;
    float *x = rand_array(n * c * h * w, 0.0f, 1.0f);
    float *wc = rand_array(oc * k, -0.5f, 0.5f), *wl = rand_array(f * oc * h * w, -0.5f, 0.5f);
    qcal_int8_net_options o;
    qcal_int8_net_options_default(&o);
    o.weight_split = split;
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {c, h, w};
    assert_int_equal(qcal_int8_net_create(&o, 3, shape, U8Q(1.0f / 255.0f, 0), &net), QCAL_OK);
    qcal_int8_conv2d_params p;
    qcal_int8_conv2d_params_default(&p);
    p.out_channels = oc;
    p.kernel_h = p.kernel_w = 3;
    p.pad_h = p.pad_w = 1;
    p.weight = wc;
    p.relu = true;
    p.out_qparams = U8Q(0.05f, 0);
    assert_int_equal(qcal_int8_net_add_conv2d(net, &p), QCAL_OK);
    qcal_int8_linear_params lp;
    qcal_int8_linear_params_default(&lp);
    lp.out_features = f;
    lp.weight = wl;
    lp.out_qparams = U8Q(0.2f, 128);
    assert_int_equal(qcal_int8_net_add_linear(net, &lp), QCAL_OK);
    uint8_t *q = malloc((size_t)(n * f));
    assert_int_equal(qcal_int8_net_forward_u8(net, n, x, q), QCAL_OK);
    const char *impl = NULL;
    assert_int_equal(qcal_int8_net_impl(net, 0, &impl), QCAL_OK);
    static char name[64];
    snprintf(name, sizeof name, "%s", impl);
    *impl0 = name;
    qcal_int8_net_destroy(&net);
    free(x); free(wc); free(wl);
    return q;
}

/* weight_split: split layers give the exact codes (the conv cases' reference checks pass),
 * the same codes as the default choice (on a VNNI CPU: the unsplit VNNI path), say so in
 * their impl name; a bad value is refused. */
static void test_weight_split(void **state)
{
    (void)state;
    qcal_int8_net_options o;
    qcal_int8_net_options_default(&o);
    assert_int_equal(o.weight_split, QCAL_INT8_SPLIT_AUTO);
    o.weight_split = QCAL_INT8_SPLIT_ALWAYS;
    g_conv_opt = &o;
    conv_case a = {3, 3, 11, 9, 5, 3, 3, 2, 1, 1, 0, true, true, -2.0f, 1.5f, 1};
    conv_case b = {2, 17, 13, 10, 19, 5, 3, 1, 2, 2, 1, false, true, -0.7f, 3.0f, 2};
    conv_case c = {8, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, true, -0.81f, 2.02f, 4};
    run_conv_case(&a);
    run_conv_case(&b);
    run_conv_case(&c);
    g_conv_opt = NULL;

    const char *impl = NULL;
    uint8_t *always = split_net_codes(QCAL_INT8_SPLIT_ALWAYS, &impl);
    size_t len = strlen(impl);
    assert_true(len > 6 && strcmp(impl + len - 6, " split") == 0);
    uint8_t *deflt = split_net_codes(QCAL_INT8_SPLIT_AUTO, &impl);
    assert_memory_equal(always, deflt, 60);
    free(always);
    free(deflt);

    o.weight_split = (qcal_int8_split)7;
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {1, 4, 4};
    expect_err(qcal_int8_net_create(&o, 3, shape, U8Q(0.1f, 0), &net), QCAL_ERR_INVALID_ARG,
               "weight_split 7");
    assert_null(net);
}

static void test_conv_first_layer(void **state)
{
    (void)state;
    /* As the demo's conv1: one input channel, normalised input (zp != 0). */
    conv_case cc = {8, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, true, true, -0.81f, 2.02f, 4};
    run_conv_case(&cc);
}

static void test_maxpool_exact(void **state)
{
    (void)state;
    const int64_t n = 3, c = 5, h = 7, w = 9;
    struct { int64_t k, s, p; } cases[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 0}};
    rng_seed(10);
    float *x = rand_array(n * c * h * w, -1.0f, 2.0f);
    float s;
    int32_t zp;
    ref_qparams_u8(-1.0f, 2.0f, &s, &zp);
    float *xd = malloc((size_t)(n * c * h * w) * sizeof *xd);
    memcpy(xd, x, (size_t)(n * c * h * w) * sizeof *xd);
    ref_fq(xd, n * c * h * w, s, zp);
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        qcal_int8_net *net = NULL;
        const int64_t shape[3] = {c, h, w};
        assert_int_equal(qcal_int8_net_create(NULL, 3, shape, U8Q(s, zp), &net), QCAL_OK);
        qcal_int8_pool2d_params p;
        qcal_int8_pool2d_params_default(&p);
        p.kernel_h = p.kernel_w = cases[t].k;
        p.stride_h = p.stride_w = cases[t].s;
        p.pad_h = p.pad_w = cases[t].p;
        assert_int_equal(qcal_int8_net_add_maxpool2d(net, &p), QCAL_OK);
        int64_t oh, ow;
        float *y = malloc((size_t)(n * c * h * w) * sizeof *y);
        ref_maxpool(xd, n, c, h, w, cases[t].k, cases[t].s, cases[t].p, y, &oh, &ow);
        uint8_t *q = malloc((size_t)(n * c * oh * ow));
        assert_int_equal(qcal_int8_net_forward_u8(net, n, x, q), QCAL_OK);
        for (int64_t i = 0; i < n * c * oh * ow; i++) {
            int32_t r = ref_quant(y[i], s, zp, 0, 255);
            if (q[i] != r)
                print_error("maxpool k%lld s%lld p%lld element %lld: got %d, reference %d\n",
                            (long long)cases[t].k, (long long)cases[t].s, (long long)cases[t].p,
                            (long long)i, q[i], r);
            assert_int_equal(q[i], r);
        }
        qcal_int8_net_destroy(&net);
        free(y);
        free(q);
    }
    free(x);
    free(xd);
}

static void test_linear_u8_and_f32(void **state)
{
    (void)state;
    const int64_t n = 40, k = 37, oc = 13;
    rng_seed(20);
    float *x = rand_array(n * k, -1.5f, 2.5f);
    float *w = rand_array(oc * k, -0.4f, 0.4f), *b = rand_array(oc, -1.0f, 1.0f);
    float in_s;
    int32_t in_zp;
    ref_qparams_u8(-1.5f, 2.5f, &in_s, &in_zp);
    float *xd = malloc((size_t)(n * k) * sizeof *xd), *ws = malloc((size_t)oc * sizeof *ws);
    float *wd = malloc((size_t)(oc * k) * sizeof *wd), *y = malloc((size_t)(n * oc) * sizeof *y);
    memcpy(xd, x, (size_t)(n * k) * sizeof *xd);
    ref_fq(xd, n * k, in_s, in_zp);
    ref_weights(w, oc, k, ws, wd);
    for (int relu = 0; relu <= 1; relu++) {
        ref_linear(xd, n, k, wd, b, oc, relu, y);
        float mn, mx, out_s;
        int32_t out_zp;
        minmax(y, n * oc, &mn, &mx);
        ref_qparams_u8(mn, mx, &out_s, &out_zp);
        qcal_int8_net *net = NULL;
        const int64_t shape[1] = {k};
        assert_int_equal(qcal_int8_net_create(NULL, 1, shape, U8Q(in_s, in_zp), &net), QCAL_OK);
        qcal_int8_linear_params p;
        qcal_int8_linear_params_default(&p);
        p.out_features = oc;
        p.weight = w;
        p.bias = b;
        p.relu = relu;
        p.out_qparams = U8Q(out_s, out_zp);
        assert_int_equal(qcal_int8_net_add_linear(net, &p), QCAL_OK);
        uint8_t *q = malloc((size_t)(n * oc));
        assert_int_equal(qcal_int8_net_forward_u8(net, n, x, q), QCAL_OK);
        compare_codes(relu ? "linear relu" : "linear", q, y, n * oc, out_s, out_zp, 1);
        qcal_int8_net_destroy(&net);
        free(q);
    }
    /* f32 output (logits): error bound = bias rounding (half an accumulator unit in_s*w_s)
     * plus float rounding of the scale product and the sum. */
    ref_linear(xd, n, k, wd, b, oc, false, y);
    qcal_int8_net *net = NULL;
    const int64_t shape[1] = {k};
    assert_int_equal(qcal_int8_net_create(NULL, 1, shape, U8Q(in_s, in_zp), &net), QCAL_OK);
    qcal_int8_linear_params p;
    qcal_int8_linear_params_default(&p);
    p.out_features = oc;
    p.weight = w;
    p.bias = b;
    p.out_type = QCAL_INT8_OUT_F32;
    assert_int_equal(qcal_int8_net_add_linear(net, &p), QCAL_OK);
    float *logits = malloc((size_t)(n * oc) * sizeof *logits);
    assert_int_equal(qcal_int8_net_forward(net, n, x, logits), QCAL_OK);
    double worst = 0.0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < n * oc; i++) {
        int64_t o = i % oc;
        double mag = 0.0;
        for (int64_t j = 0; j < k; j++)
            mag += fabs((double)xd[(i / oc) * k + j] * wd[o * k + j]);
        double bound = 0.5 * (double)in_s * ws[o] + 4e-7 * (mag + fabs(b[o]));
        double r = fabs((double)logits[i] - y[i]) / bound;
        if (r > worst) {
            worst = r;
            worst_i = i;
        }
    }
    if (worst > 1.0)
        print_error("linear f32: worst element %lld: got %.9g, reference %.9g (%.3g x bound)\n",
                    (long long)worst_i, (double)logits[worst_i], (double)y[worst_i], worst);
    assert_true(worst <= 1.0);
    uint8_t dummy[4];
    assert_int_equal(qcal_int8_net_forward_u8(net, 1, x, dummy), QCAL_ERR_STATE);
    qcal_int8_net_destroy(&net);
    free(x); free(w); free(b); free(xd); free(ws); free(wd); free(y); free(logits);
}

/* ------------------------------------------------------------------ CNN stack */

typedef struct cnn_ref {
    float *w1, *b1, *w2, *b2, *w3, *b3, *w4, *b4;
    float s[5];      /* input, conv1, conv2, fc1 output scales */
    int32_t zp[5];
} cnn_ref;

enum { C1 = 8, C2 = 12, F1 = 32, F2 = 10, HW = 16 };

/* Fake-quant simulation of conv-relu-pool-conv-relu-pool-fc-relu-fc on x [n,1,HW,HW].
 * calibrate: fill ref->s / zp from the float ranges (each layer's output fake-quantized with
 * the freshly computed qparams, as a calibrated model). out_u8 gets fc1's real outputs,
 * logits the fc2 output. */
static void cnn_sim(cnn_ref *r, const float *x, int64_t n, bool calibrate, float *fc1_out,
                    float *logits)
{
    int64_t hw = HW, oh, ow;
    float mn, mx;
    int64_t in_n = n * hw * hw;
    float *a0 = malloc((size_t)in_n * sizeof *a0);
    memcpy(a0, x, (size_t)in_n * sizeof *a0);
    if (calibrate) {
        minmax(a0, in_n, &mn, &mx);
        ref_qparams_u8(mn, mx, &r->s[0], &r->zp[0]);
    }
    ref_fq(a0, in_n, r->s[0], r->zp[0]);
    float *ws = malloc(4096 * sizeof *ws), *wd = malloc((size_t)(F1 * C2 * 16) * sizeof *wd);
    float *a1 = malloc((size_t)(n * C1 * hw * hw) * sizeof *a1);
    ref_weights(r->w1, C1, 9, ws, wd);
    ref_conv(a0, n, 1, hw, hw, wd, r->b1, C1, 3, 3, 1, 1, 1, 1, true, a1, &oh, &ow);
    if (calibrate) {
        minmax(a1, n * C1 * oh * ow, &mn, &mx);
        ref_qparams_u8(mn, mx, &r->s[1], &r->zp[1]);
    }
    ref_fq(a1, n * C1 * oh * ow, r->s[1], r->zp[1]);
    float *p1 = malloc((size_t)(n * C1 * 64) * sizeof *p1);
    ref_maxpool(a1, n, C1, hw, hw, 2, 2, 0, p1, &oh, &ow);
    float *a2 = malloc((size_t)(n * C2 * 64) * sizeof *a2);
    ref_weights(r->w2, C2, C1 * 9, ws, wd);
    ref_conv(p1, n, C1, 8, 8, wd, r->b2, C2, 3, 3, 1, 1, 1, 1, true, a2, &oh, &ow);
    if (calibrate) {
        minmax(a2, n * C2 * 64, &mn, &mx);
        ref_qparams_u8(mn, mx, &r->s[2], &r->zp[2]);
    }
    ref_fq(a2, n * C2 * 64, r->s[2], r->zp[2]);
    float *p2 = malloc((size_t)(n * C2 * 16) * sizeof *p2);
    ref_maxpool(a2, n, C2, 8, 8, 2, 2, 0, p2, &oh, &ow);
    ref_weights(r->w3, F1, C2 * 16, ws, wd);
    ref_linear(p2, n, C2 * 16, wd, r->b3, F1, true, fc1_out);   /* NCHW flatten */
    if (calibrate) {
        minmax(fc1_out, n * F1, &mn, &mx);
        ref_qparams_u8(mn, mx, &r->s[3], &r->zp[3]);
    }
    float *a3 = malloc((size_t)(n * F1) * sizeof *a3);
    memcpy(a3, fc1_out, (size_t)(n * F1) * sizeof *a3);
    ref_fq(a3, n * F1, r->s[3], r->zp[3]);
    ref_weights(r->w4, F2, F1, ws, wd);
    ref_linear(a3, n, F1, wd, r->b4, F2, false, logits);
    free(a0); free(a1); free(a2); free(a3); free(p1); free(p2); free(ws); free(wd);
}

static qcal_int8_net *cnn_build(const cnn_ref *r, bool logits_out, int64_t chunk, bool par)
{
    qcal_int8_net_options opt;
    qcal_int8_net_options_default(&opt);
    opt.batch_chunk = chunk;
    opt.chunk_parallel = par;
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {1, HW, HW};
    assert_int_equal(qcal_int8_net_create(&opt, 3, shape, U8Q(r->s[0], r->zp[0]), &net), QCAL_OK);
    qcal_int8_conv2d_params c;
    qcal_int8_conv2d_params_default(&c);
    c.kernel_h = c.kernel_w = 3;
    c.pad_h = c.pad_w = 1;
    c.relu = true;
    c.out_channels = C1;
    c.weight = r->w1;
    c.bias = r->b1;
    c.out_qparams = U8Q(r->s[1], r->zp[1]);
    assert_int_equal(qcal_int8_net_add_conv2d(net, &c), QCAL_OK);
    qcal_int8_pool2d_params pp;
    qcal_int8_pool2d_params_default(&pp);
    assert_int_equal(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_OK);
    c.out_channels = C2;
    c.weight = r->w2;
    c.bias = r->b2;
    c.out_qparams = U8Q(r->s[2], r->zp[2]);
    assert_int_equal(qcal_int8_net_add_conv2d(net, &c), QCAL_OK);
    assert_int_equal(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_OK);
    qcal_int8_linear_params l;
    qcal_int8_linear_params_default(&l);
    l.out_features = F1;
    l.weight = r->w3;
    l.bias = r->b3;
    l.relu = true;
    l.out_qparams = U8Q(r->s[3], r->zp[3]);
    assert_int_equal(qcal_int8_net_add_linear(net, &l), QCAL_OK);
    if (logits_out) {
        qcal_int8_linear_params_default(&l);
        l.out_features = F2;
        l.weight = r->w4;
        l.bias = r->b4;
        l.out_type = QCAL_INT8_OUT_F32;
        assert_int_equal(qcal_int8_net_add_linear(net, &l), QCAL_OK);
        /* nothing may follow an f32 layer */
        assert_int_equal(qcal_int8_net_add_linear(net, &l), QCAL_ERR_STATE);
    }
    int32_t nl;
    assert_int_equal(qcal_int8_net_layers(net, &nl), QCAL_OK);
    assert_int_equal(nl, logits_out ? 6 : 5);
    return net;
}

static void test_cnn_stack(void **state)
{
    (void)state;
    const int64_t n = 96;
    rng_seed(30);
    cnn_ref r;
    r.w1 = rand_array(C1 * 9, -0.6f, 0.6f);
    r.b1 = rand_array(C1, -0.2f, 0.2f);
    r.w2 = rand_array(C2 * C1 * 9, -0.2f, 0.2f);
    r.b2 = rand_array(C2, -0.2f, 0.2f);
    r.w3 = rand_array(F1 * C2 * 16, -0.1f, 0.1f);
    r.b3 = rand_array(F1, -0.2f, 0.2f);
    r.w4 = rand_array(F2 * F1, -0.3f, 0.3f);
    r.b4 = rand_array(F2, -0.2f, 0.2f);
    float *x = rand_array(n * HW * HW, -0.81f, 2.02f);
    float *fc1 = malloc((size_t)(n * F1) * sizeof *fc1), *lg = malloc((size_t)(n * F2) * sizeof *lg);
    cnn_sim(&r, x, n, true, fc1, lg);

    /* u8 output of fc1 after the whole int8 stack; chunk 7 exercises chunking + tail */
    qcal_int8_net *net = cnn_build(&r, false, 7, true);
    uint8_t *q = malloc((size_t)(n * F1));
    assert_int_equal(qcal_int8_net_forward_u8(net, n, x, q), QCAL_OK);
    compare_codes("cnn stack fc1", q, fc1, n * F1, r.s[3], r.zp[3], 2);
    /* chunking does not change a single bit */
    qcal_int8_net *net2 = cnn_build(&r, false, 1000, true);
    uint8_t *q2 = malloc((size_t)(n * F1));
    assert_int_equal(qcal_int8_net_forward_u8(net2, n, x, q2), QCAL_OK);
    assert_memory_equal(q, q2, (size_t)(n * F1));
    /* nor does threading over chunks vs inside oneDNN's primitives */
    qcal_int8_net_destroy(&net2);
    net2 = cnn_build(&r, false, 7, false);
    memset(q2, 0, (size_t)(n * F1));
    assert_int_equal(qcal_int8_net_forward_u8(net2, n, x, q2), QCAL_OK);
    assert_memory_equal(q, q2, (size_t)(n * F1));
    /* nor does the library's thread count (qcal_threads_set_count), both ways of threading */
    for (int nt = 1; nt <= 3; nt += 2) {
        assert_int_equal(qcal_threads_set_count(nt), QCAL_OK);
        for (int cp = 0; cp < 2; cp++) {
            qcal_int8_net *net3 = cnn_build(&r, false, 7, cp == 1);
            memset(q2, 0, (size_t)(n * F1));
            assert_int_equal(qcal_int8_net_forward_u8(net3, n, x, q2), QCAL_OK);
            assert_memory_equal(q, q2, (size_t)(n * F1));
            qcal_int8_net_destroy(&net3);
        }
    }
    assert_int_equal(qcal_threads_set_count(0), QCAL_OK);
    qcal_int8_net_destroy(&net);
    qcal_int8_net_destroy(&net2);

    /* f32 logits: each differs from the simulation by at most what one fc1 step on every
     * input of fc2 could move it (sum |w_dq| * s_fc1), plus the bias rounding. */
    net = cnn_build(&r, true, 32, true);
    float *got = malloc((size_t)(n * F2) * sizeof *got);
    assert_int_equal(qcal_int8_net_forward(net, n, x, got), QCAL_OK);
    float ws[F2], wd[F2 * F1];
    ref_weights(r.w4, F2, F1, ws, wd);
    int64_t argmax_same = 0, worst_i = 0;
    double worst = 0.0;
    for (int64_t b = 0; b < n; b++) {
        int64_t ag = 0, ar = 0;
        for (int64_t o = 0; o < F2; o++) {
            double l1 = 0.0;
            for (int64_t j = 0; j < F1; j++)
                l1 += fabs(wd[o * F1 + j]);
            double bound = l1 * r.s[3] + 0.5 * (double)r.s[3] * ws[o] + 1e-5;
            double d = fabs((double)got[b * F2 + o] - lg[b * F2 + o]) / bound;
            if (d > worst) {
                worst = d;
                worst_i = b * F2 + o;
            }
            ag = got[b * F2 + o] > got[b * F2 + ag] ? o : ag;
            ar = lg[b * F2 + o] > lg[b * F2 + ar] ? o : ar;
        }
        argmax_same += ag == ar;
    }
    if (worst > 1.0)
        print_error("cnn logits: worst element %lld: got %.7g, reference %.7g (%.3g x bound)\n",
                    (long long)worst_i, (double)got[worst_i], (double)lg[worst_i], worst);
    assert_true(worst <= 1.0);
    assert_true(argmax_same >= n - 2);
    for (int32_t i = 0; i < 6; i++) {
        const char *impl = NULL;
        assert_int_equal(qcal_int8_net_impl(net, i, &impl), QCAL_OK);
        assert_true(strlen(impl) > 0);
    }
    qcal_int8_net_destroy(&net);
    free(r.w1); free(r.b1); free(r.w2); free(r.b2); free(r.w3); free(r.b3); free(r.w4);
    free(r.b4); free(x); free(fc1); free(lg); free(q); free(q2); free(got);
}

/* ------------------------------------------------------------------ from a calibration table */

/* A table with minmax activation entries over the given ranges and, optionally, weight entries
 * (per_channel_minmax, qint8 per_channel_symmetric) for the (name, data, rows, cols) given. */
static qcal_calib_table *make_table(int nact, const char *const *names, const float (*range)[2],
                                    int nw, const char *const *wnames, float *const *wdata,
                                    const int64_t (*wshape)[2])
{
    qcal_observer_config mm, pc;
    qcal_observer_config_default(&mm, QCAL_OBSERVER_MINMAX);
    qcal_observer_config_default(&pc, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    pc.q.dtype = QCAL_QINT8;
    pc.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    qcal_calib_rules *rules = NULL;
    assert_int_equal(qcal_calib_rules_create(&rules), QCAL_OK);
    assert_int_equal(qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &mm), QCAL_OK);
    assert_int_equal(qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_WEIGHT, &pc), QCAL_OK);
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *cs = NULL;
    assert_int_equal(qcal_calib_session_create(&so, &cs), QCAL_OK);
    for (int i = 0; i < nact; i++) {
        float v[2] = {range[i][0], range[i][1]};
        qcal_tensor t;
        const int64_t shape[1] = {2};
        assert_int_equal(qcal_tensor_init(&t, v, 1, shape), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe(cs, names[i], QCAL_CALIB_ROLE_ACTIVATION, 0, &t), QCAL_OK);
    }
    for (int i = 0; i < nw; i++) {
        qcal_tensor t;
        assert_int_equal(qcal_tensor_init(&t, wdata[i], 2, wshape[i]), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe(cs, wnames[i], QCAL_CALIB_ROLE_WEIGHT, 0, &t), QCAL_OK);
    }
    qcal_calib_table *table = NULL;
    assert_int_equal(qcal_calib_session_table(cs, &table), QCAL_OK);
    qcal_calib_session_destroy(&cs);
    qcal_calib_rules_destroy(&rules);
    return table;
}

static void cnn_descs(const cnn_ref *r, qcal_int8_layer_desc d[9])
{
    qcal_int8_layer_desc_default(&d[0], QCAL_INT8_CONV2D);
    d[0].fqn = "conv1";
    d[0].conv.out_channels = C1;
    d[0].conv.kernel_h = d[0].conv.kernel_w = 3;
    d[0].conv.pad_h = d[0].conv.pad_w = 1;
    d[0].conv.weight = r->w1;
    d[0].conv.bias = r->b1;
    qcal_int8_layer_desc_default(&d[1], QCAL_INT8_RELU);
    qcal_int8_layer_desc_default(&d[2], QCAL_INT8_MAXPOOL2D);
    d[3] = d[0];
    d[3].fqn = "conv2";
    d[3].conv.out_channels = C2;
    d[3].conv.weight = r->w2;
    d[3].conv.bias = r->b2;
    /* ReLU after the pool: commutes with max-pool, fused into conv2 as well */
    qcal_int8_layer_desc_default(&d[4], QCAL_INT8_MAXPOOL2D);
    qcal_int8_layer_desc_default(&d[5], QCAL_INT8_RELU);
    qcal_int8_layer_desc_default(&d[6], QCAL_INT8_LINEAR);
    d[6].fqn = "fc1";
    d[6].linear.out_features = F1;
    d[6].linear.weight = r->w3;
    d[6].linear.bias = r->b3;
    qcal_int8_layer_desc_default(&d[7], QCAL_INT8_RELU);
    qcal_int8_layer_desc_default(&d[8], QCAL_INT8_LINEAR);
    d[8].fqn = "fc2";
    d[8].linear.out_features = F2;
    d[8].linear.weight = r->w4;
    d[8].linear.bias = r->b4;
}

static void test_from_table(void **state)
{
    (void)state;
    const int64_t n = 40;
    rng_seed(50);
    cnn_ref r;
    r.w1 = rand_array(C1 * 9, -0.6f, 0.6f);
    r.b1 = rand_array(C1, -0.2f, 0.2f);
    r.w2 = rand_array(C2 * C1 * 9, -0.2f, 0.2f);
    r.b2 = rand_array(C2, -0.2f, 0.2f);
    r.w3 = rand_array(F1 * C2 * 16, -0.1f, 0.1f);
    r.b3 = rand_array(F1, -0.2f, 0.2f);
    r.w4 = rand_array(F2 * F1, -0.3f, 0.3f);
    r.b4 = rand_array(F2, -0.2f, 0.2f);
    float *x = rand_array(n * HW * HW, -0.81f, 2.02f);
    static const char *const names[5] = {"conv1", "conv2", "fc1", "fc2", "out"};
    static const float ranges[5][2] = {{-0.81f, 2.02f}, {0.0f, 1.7f}, {0.0f, 1.3f}, {0.0f, 2.5f},
                                       {-1.0f, 3.0f}};
    const char *wnames[1] = {"conv1.weight"};
    float *wdata[1] = {r.w1};
    const int64_t wshape[1][2] = {{C1, 9}};
    qcal_calib_table *t = make_table(5, names, ranges, 1, wnames, wdata, wshape);
    for (int i = 0; i < 4; i++) {
        const qcal_calib_entry *e = NULL;
        assert_int_equal(qcal_calib_table_find(t, names[i], QCAL_CALIB_ROLE_ACTIVATION, &e), QCAL_OK);
        r.s[i] = e->qparams.scale;
        r.zp[i] = e->qparams.zero_point;
    }
    assert_int_not_equal(r.zp[0], 0);   /* the input zero-point path is exercised */

    /* the table-built net equals the hand-built one bit for bit (f32 logits) */
    qcal_int8_layer_desc d[9];
    cnn_descs(&r, d);
    const int64_t shape[3] = {1, HW, HW};
    qcal_int8_net *tn = NULL;
    assert_int_equal(qcal_int8_net_from_table(NULL, t, 3, shape, 9, d, NULL, &tn), QCAL_OK);
    int32_t nl = 0;
    assert_int_equal(qcal_int8_net_layers(tn, &nl), QCAL_OK);
    assert_int_equal(nl, 6);   /* the three ReLUs are fused */
    qcal_int8_net *hn = cnn_build(&r, true, 128, true);
    float *a = malloc((size_t)(n * F2) * sizeof *a), *b = malloc((size_t)(n * F2) * sizeof *b);
    assert_int_equal(qcal_int8_net_forward(tn, n, x, a), QCAL_OK);
    assert_int_equal(qcal_int8_net_forward(hn, n, x, b), QCAL_OK);
    assert_memory_equal(a, b, (size_t)(n * F2) * sizeof *a);
    /* conv1's weight scales are the table entry's (equal to the observer's here) */
    const qcal_calib_entry *we = NULL;
    assert_int_equal(qcal_calib_table_find(t, "conv1.weight", QCAL_CALIB_ROLE_WEIGHT, &we), QCAL_OK);
    float sc[C2], sc2[C2];
    int64_t cnt = 0, cnt2 = 0;
    assert_int_equal(qcal_int8_net_weight_scales(tn, 0, C2, sc, &cnt), QCAL_OK);
    assert_int_equal(qcal_int8_net_weight_scales(hn, 0, C2, sc2, &cnt2), QCAL_OK);
    assert_int_equal(cnt, C1);
    assert_memory_equal(sc, we->qparams.scales, C1 * sizeof(float));
    assert_memory_equal(sc, sc2, C1 * sizeof(float));
    qcal_int8_net_destroy(&tn);
    qcal_int8_net_destroy(&hn);

    /* a segment: fc1 + ReLU with u8 output quantized by the entry "fc2"; the input is fc1's
     * flattened (C2, 4, 4) activation */
    const int64_t fshape[3] = {C2, 4, 4};
    assert_int_equal(qcal_int8_net_from_table(NULL, t, 3, fshape, 2, d + 6, "fc2", &tn), QCAL_OK);
    qcal_int8_net *sn = NULL;
    assert_int_equal(qcal_int8_net_create(NULL, 3, fshape, U8Q(r.s[2], r.zp[2]), &sn), QCAL_OK);
    qcal_int8_linear_params lp = d[6].linear;
    lp.relu = true;
    lp.out_qparams = U8Q(r.s[3], r.zp[3]);
    assert_int_equal(qcal_int8_net_add_linear(sn, &lp), QCAL_OK);
    float *fx = rand_array(n * C2 * 16, -0.5f, 1.5f);
    uint8_t *qa = malloc((size_t)(n * F1)), *qb = malloc((size_t)(n * F1));
    assert_int_equal(qcal_int8_net_forward_u8(tn, n, fx, qa), QCAL_OK);
    assert_int_equal(qcal_int8_net_forward_u8(sn, n, fx, qb), QCAL_OK);
    assert_memory_equal(qa, qb, (size_t)(n * F1));
    qcal_int8_net_destroy(&tn);
    qcal_int8_net_destroy(&sn);

    /* errors: a missing entry, a weight entry of the wrong shape, a ReLU with no producer */
    assert_int_equal(qcal_int8_net_from_table(NULL, t, 3, fshape, 2, d + 6, "nope", &tn),
                     QCAL_ERR_NOT_FOUND);
    assert_non_null(strstr(qcal_last_error(), "nope"));
    assert_null(tn);
    const char *bnames[1] = {"conv2.weight"};
    float *bdata[1] = {r.w1};   /* C1 channels where conv2 has C2 */
    qcal_calib_table *bt = make_table(5, names, ranges, 1, bnames, bdata, wshape);
    assert_int_equal(qcal_int8_net_from_table(NULL, bt, 3, shape, 9, d, NULL, &tn), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "conv2.weight"));
    assert_null(tn);
    qcal_calib_table_destroy(&bt);
    qcal_int8_layer_desc bad[2];
    qcal_int8_layer_desc_default(&bad[0], QCAL_INT8_RELU);
    bad[1] = d[0];
    assert_int_equal(qcal_int8_net_from_table(NULL, t, 3, shape, 2, bad, NULL, &tn), QCAL_ERR_UNSUPPORTED);
    assert_null(tn);
    assert_int_equal(qcal_int8_net_from_table(NULL, t, 3, shape, 1, bad, NULL, &tn), QCAL_ERR_INVALID_ARG);
    qcal_calib_table_destroy(&t);
    free(r.w1); free(r.b1); free(r.w2); free(r.b2); free(r.w3); free(r.b3); free(r.w4);
    free(r.b4); free(x); free(a); free(b); free(fx); free(qa); free(qb);
}

/* ------------------------------------------------------------------ input quantization */

static void test_quantize_kernels(void **state)
{
    (void)state;
    /* The net quantizes its input through qcal_quantize (quant/) and counts the
     * non-finite values with the shared min/max kernel: a net without layers returns those
     * codes, checked under every ISA cap against the scalar reference. */
    static const int64_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 200, 1031};
    static const char *const isas[3] = {"c", "avx2", "avx512"};
    const char *env = getenv("QCAL_ISA");
    char *saved = env ? strdup(env) : NULL;
    rng_seed(40);
    float *x = malloc(1100 * sizeof *x);
    uint8_t *ref = malloc(1100 + 16), *got = malloc(1100 + 16);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        int64_t nf_ref = 0;
        for (int64_t i = 0; i < n; i++) {
            x[i] = rng_uniform(-3.0f, 3.0f);
            switch (rng_u32() % 16) {
            case 0: x[i] = NAN; break;
            case 1: x[i] = INFINITY; break;
            case 2: x[i] = -INFINITY; break;
            case 3: x[i] = 1e30f; break;
            case 4: x[i] = (float)((int)(rng_u32() % 40) - 20) * 0.5f * 0.02f; break; /* ties */
            default: break;
            }
            nf_ref += !isfinite(x[i]);
            ref[i] = (uint8_t)ref_quant(x[i], 0.02f, 117, 0, 255);
        }
        for (int f = 0; f < 3; f++) {
            setenv("QCAL_ISA", isas[f], 1);
            qcal_cpu_reset();
            qcal_int8_net *qn = NULL;
            const int64_t qshape[1] = {n};
            assert_int_equal(qcal_int8_net_create(NULL, 1, qshape, U8Q(0.02f, 117), &qn), QCAL_OK);
            memset(got, 0xA5, (size_t)n + 16);
            assert_int_equal(qcal_int8_net_forward_u8(qn, 1, x, got), QCAL_OK);
            uint64_t nf = 0;
            assert_int_equal(qcal_int8_net_nonfinite(qn, &nf), QCAL_OK);
            assert_int_equal(nf, nf_ref);
            for (int64_t i = 0; i < n; i++) {
                if (got[i] != ref[i])
                    print_error("ISA %s size %lld element %lld (x = %g): got %d, reference %d\n",
                                isas[f], (long long)n, (long long)i, (double)x[i], got[i], ref[i]);
                assert_int_equal(got[i], ref[i]);
            }
            for (int64_t i = n; i < n + 16; i++)
                assert_int_equal(got[i], 0xA5);   /* canary */
            qcal_int8_net_destroy(&qn);
        }
    }
    if (saved)
        setenv("QCAL_ISA", saved, 1);
    else
        unsetenv("QCAL_ISA");
    free(saved);
    qcal_cpu_reset();
    /* NaN -> zero-point, counted by the net; +-Inf saturate */
    qcal_int8_net *net = NULL;
    const int64_t shape[1] = {4};
    assert_int_equal(qcal_int8_net_create(NULL, 1, shape, U8Q(0.5f, 10), &net), QCAL_OK);
    const float in[4] = {NAN, INFINITY, -INFINITY, 1.0f};
    uint8_t q[4];
    assert_int_equal(qcal_int8_net_forward_u8(net, 1, in, q), QCAL_OK);
    assert_int_equal(q[0], 10);
    assert_int_equal(q[1], 255);
    assert_int_equal(q[2], 0);
    assert_int_equal(q[3], 12);
    uint64_t nf = 0;
    assert_int_equal(qcal_int8_net_nonfinite(net, &nf), QCAL_OK);
    assert_int_equal(nf, 3);
    qcal_int8_net_destroy(&net);
    free(x);
    free(ref);
    free(got);
}

/* ------------------------------------------------------------------ PyTorch golden */

static qcal_npy_array load_npy(const char *name)
{
    const char *dir = getenv("QCAL_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/onednn_int8/%s.npy", dir ? dir : "tests/data", name);
    qcal_npy_array a;
    qcal_status st = qcal_npy_read(path, &a);
    if (st != QCAL_OK)
        print_error("%s: %s\n", path, qcal_last_error());
    assert_int_equal(st, QCAL_OK);
    return a;
}

/* Compares u8 codes with PyTorch's: returns the fraction within one step, prints the worst. */
static double compare_golden(const char *what, const uint8_t *got, const uint8_t *want, int64_t n,
                             double *exact_frac)
{
    int64_t within1 = 0, exact = 0, worst_i = 0;
    int worst = -1;
    for (int64_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - (int)want[i]);
        within1 += d <= 1;
        exact += d == 0;
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
    }
    double frac = (double)within1 / (double)n;
    *exact_frac = (double)exact / (double)n;
    print_message("# %s vs PyTorch (onednn engine): %.4f exact, %.4f within one step, worst %d "
                  "(element %lld: got %d, PyTorch %d)\n", what, *exact_frac, frac, worst,
                  (long long)worst_i, got[worst_i], want[worst_i]);
    return frac;
}

static void test_pytorch_golden(void **state)
{
    (void)state;
    qcal_npy_array x = load_npy("x"), qp = load_npy("qparams");
    qcal_npy_array w[4], b[4], ws[4];
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i + 1);
        w[i] = load_npy(name);
        snprintf(name, sizeof name, "b%d", i + 1);
        b[i] = load_npy(name);
        snprintf(name, sizeof name, "wscale%d", i + 1);
        ws[i] = load_npy(name);
    }
    qcal_npy_array g1 = load_npy("q_conv1"), g3 = load_npy("q_fc1"), g4 = load_npy("q_fc2");
    const float *q = qp.data;
    const int64_t n = x.shape[0];
    assert_int_equal(x.dtype, QCAL_NPY_F32);
    assert_int_equal(g1.dtype, QCAL_NPY_U8);

    for (int depth = 1; depth <= 3; depth++) {
        qcal_int8_net *net = NULL;
        const int64_t shape[3] = {1, 28, 28};
        assert_int_equal(qcal_int8_net_create(NULL, 3, shape, U8Q(q[0], (int32_t)q[1]), &net), QCAL_OK);
        qcal_int8_conv2d_params c;
        qcal_int8_conv2d_params_default(&c);
        c.kernel_h = c.kernel_w = 3;
        c.pad_h = c.pad_w = 1;
        c.relu = true;
        c.out_channels = w[0].shape[0];
        c.weight = w[0].data;
        c.bias = b[0].data;
        c.out_qparams = U8Q(q[2], (int32_t)q[3]);
        assert_int_equal(qcal_int8_net_add_conv2d(net, &c), QCAL_OK);
        const qcal_npy_array *g = &g1;
        if (depth >= 2) {
            qcal_int8_pool2d_params pp;
            qcal_int8_pool2d_params_default(&pp);
            assert_int_equal(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_OK);
            c.out_channels = w[1].shape[0];
            c.weight = w[1].data;
            c.bias = b[1].data;
            c.out_qparams = U8Q(q[4], (int32_t)q[5]);
            assert_int_equal(qcal_int8_net_add_conv2d(net, &c), QCAL_OK);
            assert_int_equal(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_OK);
            qcal_int8_linear_params l;
            qcal_int8_linear_params_default(&l);
            l.out_features = w[2].shape[0];
            l.weight = w[2].data;
            l.bias = b[2].data;
            l.relu = true;
            l.out_qparams = U8Q(q[6], (int32_t)q[7]);
            assert_int_equal(qcal_int8_net_add_linear(net, &l), QCAL_OK);
            g = &g3;
            if (depth == 3) {
                qcal_int8_linear_params_default(&l);
                l.out_features = w[3].shape[0];
                l.weight = w[3].data;
                l.bias = b[3].data;
                l.out_qparams = U8Q(q[8], (int32_t)q[9]);
                assert_int_equal(qcal_int8_net_add_linear(net, &l), QCAL_OK);
                g = &g4;
            }
        }
        /* weight scales bit-identical to PyTorch's PerChannelMinMaxObserver */
        int32_t nl;
        assert_int_equal(qcal_int8_net_layers(net, &nl), QCAL_OK);
        for (int32_t li = 0, wi = 0; li < nl; li++) {
            float sc[128];
            int64_t cnt;
            if (qcal_int8_net_weight_scales(net, li, 128, sc, &cnt) != QCAL_OK)
                continue;   /* max-pool */
            assert_int_equal(cnt, ws[wi].numel);
            assert_memory_equal(sc, ws[wi].data, (size_t)cnt * sizeof(float));
            wi++;
        }
        uint8_t *got = malloc((size_t)g->numel);
        assert_int_equal(qcal_int8_net_forward_u8(net, n, x.data, got), QCAL_OK);
        double exact;
        const char *names[] = {"", "conv1", "conv1..fc1", "conv1..fc2"};
        double frac = compare_golden(names[depth], got, g->data, g->numel, &exact);
        /* one layer: the same arithmetic as PyTorch's onednn engine, off by one only on
         * rounding ties of the scale products; deeper: those flips propagate a little. */
        assert_true(frac >= 0.999);
        assert_true(exact >= (depth == 1 ? 0.995 : 0.97));
        free(got);
        qcal_int8_net_destroy(&net);
    }
    qcal_npy_array_free(&x);
    qcal_npy_array_free(&qp);
    qcal_npy_array_free(&g1);
    qcal_npy_array_free(&g3);
    qcal_npy_array_free(&g4);
    for (int i = 0; i < 4; i++) {
        qcal_npy_array_free(&w[i]);
        qcal_npy_array_free(&b[i]);
        qcal_npy_array_free(&ws[i]);
    }
}

/* ------------------------------------------------------------------ error paths */

static void expect_err(qcal_status got, qcal_status want, const char *needle)
{
    if (got != want)
        print_error("expected status %d, got %d (%s)\n", want, got, qcal_last_error());
    assert_int_equal(got, want);
    const char *msg = qcal_last_error();
    if (!strstr(msg, needle))
        print_error("message '%s' does not contain '%s'\n", msg, needle);
    assert_non_null(strstr(msg, needle));
}

static void test_errors(void **state)
{
    (void)state;
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {2, 5, 5};
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(0.0f, 0), &net), QCAL_ERR_INVALID_ARG, "scale 0");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(-1.0f, 0), &net), QCAL_ERR_INVALID_ARG, "scale -1");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(NAN, 0), &net), QCAL_ERR_INVALID_ARG, "nan");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(INFINITY, 0), &net), QCAL_ERR_INVALID_ARG, "inf");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(1e-45f, 0), &net), QCAL_ERR_INVALID_ARG, "inverse");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(0.1f, 256), &net), QCAL_ERR_INVALID_ARG, "256");
    expect_err(qcal_int8_net_create(NULL, 2, shape, U8Q(0.1f, 0), &net), QCAL_ERR_INVALID_ARG, "ndim 2");
    expect_err(qcal_int8_net_create(NULL, 3, NULL, U8Q(0.1f, 0), &net), QCAL_ERR_INVALID_ARG, "NULL");
    expect_err(qcal_int8_net_create(NULL, 3, shape, U8Q(0.1f, 0), NULL), QCAL_ERR_INVALID_ARG, "NULL");
    const int64_t bad_shape[3] = {2, 0, 5};
    expect_err(qcal_int8_net_create(NULL, 3, bad_shape, U8Q(0.1f, 0), &net), QCAL_ERR_INVALID_ARG, "= 0");
    qcal_int8_net_options opt;
    qcal_int8_net_options_default(&opt);
    opt.batch_chunk = 0;
    expect_err(qcal_int8_net_create(&opt, 3, shape, U8Q(0.1f, 0), &net), QCAL_ERR_INVALID_ARG, "batch_chunk 0");
    expect_err(qcal_int8_net_create(NULL, 3, shape, NULL, &net), QCAL_ERR_INVALID_ARG,
               "input qparams is NULL");
    qcal_qparams bad_in = u8q(0.1f, 0);
    bad_in.dtype = QCAL_QINT8;   /* activations are quint8 */
    expect_err(qcal_int8_net_create(NULL, 3, shape, &bad_in, &net), QCAL_ERR_INVALID_ARG, "qint8");
    bad_in.dtype = QCAL_QUINT8;
    bad_in.qscheme = QCAL_PER_CHANNEL_AFFINE;   /* and per-tensor */
    expect_err(qcal_int8_net_create(NULL, 3, shape, &bad_in, &net), QCAL_ERR_INVALID_ARG,
               "per-tensor");
    assert_null(net);
    qcal_int8_net_destroy(&net);   /* NULL is fine */
    qcal_int8_net_destroy(NULL);

    assert_int_equal(qcal_int8_net_create(NULL, 3, shape, U8Q(0.1f, 3), &net), QCAL_OK);
    float w[4 * 2 * 3 * 3];
    for (int i = 0; i < 72; i++)
        w[i] = (float)(i % 7) * 0.1f - 0.3f;
    qcal_int8_conv2d_params c;
    qcal_int8_conv2d_params_default(&c);
    c.out_channels = 4;
    c.kernel_h = c.kernel_w = 3;
    c.weight = w;
    qcal_qparams coq = u8q(0.05f, 0);
    c.out_qparams = &coq;
    expect_err(qcal_int8_net_add_conv2d(NULL, &c), QCAL_ERR_INVALID_ARG, "net is NULL");
    expect_err(qcal_int8_net_add_conv2d(net, NULL), QCAL_ERR_INVALID_ARG, "NULL");
    c.weight = NULL;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "weight is NULL");
    c.weight = w;
    coq.scale = NAN;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "out_scale nan");
    coq.scale = -0.5f;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "out_scale -0.5");
    coq.scale = 0.05f;
    coq.zero_point = -1;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "-1");
    coq.zero_point = 0;
    float wsc[4] = {0.01f, 0.0f, 0.01f, 0.01f};
    int32_t wzp[4] = {0, 0, 0, 0};
    qcal_qparams wqp = {.dtype = QCAL_QINT8, .qscheme = QCAL_PER_CHANNEL_SYMMETRIC, .axis = 0,
                        .quant_min = -128, .quant_max = 127, .channels = 4, .scales = wsc,
                        .zero_points = wzp};
    c.weight_qparams = &wqp;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "scale[1] = 0");
    wsc[1] = INFINITY;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "scale[1] = inf");
    wsc[1] = 0.01f;
    wqp.channels = 3;   /* one scale per output channel */
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "with 3 channels");
    wqp.channels = 4;
    wqp.dtype = QCAL_QUINT8;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "qint8 per-channel");
    wqp.dtype = QCAL_QINT8;
    wzp[2] = 1;   /* int8 weights are symmetric */
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "zero-point[2] = 1");
    wzp[2] = 0;
    c.weight_qparams = NULL;
    c.out_qparams = NULL;   /* required for a u8 output */
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "out_qparams is NULL");
    c.out_qparams = &coq;
    c.kernel_h = 9;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_MISMATCH, "9x3");
    c.kernel_h = 3;
    c.stride_w = 0;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "stride 1x0");
    c.stride_w = 1;
    w[5] = NAN;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_NONFINITE, "weight[0][5]");
    w[5] = 0.1f;
    float bias[4] = {0.0f, 1e30f, 0.0f, 0.0f};
    c.bias = bias;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_INVALID_ARG, "beyond int32");
    bias[1] = NAN;
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_NONFINITE, "bias[1]");
    c.bias = NULL;
    int32_t nl = -1;
    assert_int_equal(qcal_int8_net_layers(net, &nl), QCAL_OK);
    assert_int_equal(nl, 0);   /* failed adds leave the net unchanged */
    assert_int_equal(qcal_int8_net_add_conv2d(net, &c), QCAL_OK);

    /* pool params */
    qcal_int8_pool2d_params pp;
    qcal_int8_pool2d_params_default(&pp);
    pp.pad_h = 2;
    expect_err(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_ERR_INVALID_ARG, "padding 2x0");
    pp.pad_h = 0;
    pp.kernel_h = pp.kernel_w = 4;
    expect_err(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_ERR_MISMATCH, "3x3");

    /* forward errors */
    float src[2 * 25 * 2];
    for (int i = 0; i < 100; i++)
        src[i] = (float)i * 0.01f;
    float dst[4 * 3 * 3 * 2];
    const char *impl;
    expect_err(qcal_int8_net_impl(net, 0, &impl), QCAL_ERR_STATE, "no forward");
    expect_err(qcal_int8_net_forward(net, 0, src, dst), QCAL_ERR_EMPTY, "n = 0");
    expect_err(qcal_int8_net_forward(net, -3, src, dst), QCAL_ERR_INVALID_ARG, "n = -3");
    expect_err(qcal_int8_net_forward(net, 1, NULL, dst), QCAL_ERR_INVALID_ARG, "src is NULL");
    expect_err(qcal_int8_net_forward(net, 1, src, NULL), QCAL_ERR_INVALID_ARG, "dst is NULL");
    assert_int_equal(qcal_int8_net_forward(net, 2, src, dst), QCAL_OK);
    expect_err(qcal_int8_net_impl(net, 1, &impl), QCAL_ERR_INVALID_ARG, "layer 1");
    float scales[4];
    int64_t nsc;
    expect_err(qcal_int8_net_weight_scales(net, 0, 3, scales, &nsc), QCAL_ERR_INVALID_ARG, "capacity 3");

    /* linear after conv: wrong weight count is the caller's contract; conv after linear */
    qcal_int8_linear_params lp;
    qcal_int8_linear_params_default(&lp);
    float lw[5 * 36];
    for (int i = 0; i < 180; i++)
        lw[i] = (float)(i % 11) * 0.01f - 0.05f;
    lp.out_features = 5;
    lp.weight = lw;
    lp.out_type = QCAL_INT8_OUT_U8;
    qcal_qparams loq = u8q(INFINITY, 0);
    lp.out_qparams = &loq;
    expect_err(qcal_int8_net_add_linear(net, &lp), QCAL_ERR_INVALID_ARG, "out_scale inf");
    loq.scale = 0.1f;
    lp.out_type = (qcal_int8_out_type)7;
    expect_err(qcal_int8_net_add_linear(net, &lp), QCAL_ERR_INVALID_ARG, "out_type 7");
    lp.out_type = QCAL_INT8_OUT_U8;
    assert_int_equal(qcal_int8_net_add_linear(net, &lp), QCAL_OK);
    expect_err(qcal_int8_net_add_conv2d(net, &c), QCAL_ERR_MISMATCH, "flat");
    expect_err(qcal_int8_net_add_maxpool2d(net, &pp), QCAL_ERR_MISMATCH, "flat");
    qcal_int8_net_destroy(&net);

    /* nonfinite_error: fails and leaves dst untouched */
    qcal_int8_net_options_default(&opt);
    opt.nonfinite_error = true;
    const int64_t fshape[1] = {4};
    assert_int_equal(qcal_int8_net_create(&opt, 1, fshape, U8Q(0.1f, 0), &net), QCAL_OK);
    const float bad[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, INFINITY, 0.7f, 0.8f};
    uint8_t out[8];
    memset(out, 0x5A, sizeof out);
    expect_err(qcal_int8_net_forward_u8(net, 2, bad, out), QCAL_ERR_NONFINITE, "element 5");
    for (int i = 0; i < 8; i++)
        assert_int_equal(out[i], 0x5A);
    qcal_int8_net_destroy(&net);
}

int main(void)
{
#if !QCAL_HAVE_DNNL
    printf("# qcal built without oneDNN: int8 runtime not available\n");
    return 77;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_kernels),
        cmocka_unit_test(test_conv_relu_zp),
        cmocka_unit_test(test_conv_no_relu_odd),
        cmocka_unit_test(test_conv_first_layer),
        cmocka_unit_test(test_maxpool_exact),
        cmocka_unit_test(test_linear_u8_and_f32),
        cmocka_unit_test(test_weight_split),
        cmocka_unit_test(test_cnn_stack),
        cmocka_unit_test(test_from_table),
        cmocka_unit_test(test_pytorch_golden),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("onednn_int8", tests, NULL, NULL);
}
