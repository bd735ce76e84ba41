/* unit.weights: the weight quantizer (qcal/weights.h) against the observer -> qparams ->
 * quantize path it replaces (bit for bit), in memory and streamed through a reader in blocks
 * of every kind, FP8, the NaN policy, argument errors, thread-count invariance. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "qcal/qcal.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *random_weight(int64_t n, float amp)
{
    float *w = malloc((size_t)n * sizeof *w);
    assert_non_null(w);
    for (int64_t i = 0; i < n; i++)
        w[i] = rnd() * amp * (1.0f + (float)(i % 7));
    return w;
}

static qcal_tensor view(const float *w, int32_t ndim, const int64_t *shape)
{
    qcal_tensor t;
    memset(&t, 0, sizeof t);
    t.data = w;
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    return t;
}

/* A reader that always copies into scratch, one byte past an aligned address + 4 (as a
 * misaligned ONNX initializer), counting calls. */
typedef struct copy_src {
    const float *w;
    int calls;
} copy_src;

static qcal_status copy_read(void *ctx, int64_t first, int64_t count, void *scratch, const float **out)
{
    copy_src *c = ctx;
    float *dst = (float *)((char *)scratch + 4096);
    memcpy(dst, c->w + first, (size_t)count * sizeof *dst);
    __atomic_fetch_add(&c->calls, 1, __ATOMIC_RELAXED);   /* readers run on several threads */
    *out = dst;
    return QCAL_OK;
}

typedef struct result {
    int64_t channels;
    float *scales;
    int32_t *zps;
    uint8_t *codes;
    qcal_status st;
} result;

static result run(const qcal_weights_options *o, const qcal_tensor *t, bool stream, int *calls)
{
    result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(qcal_weights_channels(o, t, &r.channels), QCAL_OK);
    int64_t n = 1;
    for (int32_t k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    r.scales = malloc((size_t)r.channels * sizeof *r.scales);
    r.zps = malloc((size_t)r.channels * sizeof *r.zps);
    r.codes = malloc((size_t)n * qcal_dtype_size(o->q.dtype));
    copy_src src = { t->data, 0 };
    qcal_weights_reader rd = { copy_read, &src };
    qcal_tensor nodata = *t;
    nodata.data = NULL;   /* a reader-backed weight is never read through data */
    r.st = qcal_weights_quantize(o, stream ? &nodata : t, stream ? &rd : NULL, r.scales, r.zps, r.codes);
    if (calls)
        *calls = src.calls;
    return r;
}

static void result_free(result *r)
{
    free(r->scales), free(r->zps), free(r->codes);
}

/* The path every caller wrote before: observer over the whole tensor, its qparams, quantize. */
static result reference(const qcal_weights_options *o, const qcal_tensor *t)
{
    result r;
    memset(&r, 0, sizeof r);
    const bool pc = qcal_qscheme_is_per_channel(o->q.qscheme);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, pc ? o->observer : QCAL_OBSERVER_MINMAX);
    cfg.q = o->q;
    cfg.axis = o->axis;
    qcal_observer *obs = NULL;
    qcal_qparams qp = { 0 };
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    assert_int_equal(qcal_observer_update(obs, t), QCAL_OK);
    r.st = qcal_observer_qparams(obs, &qp);
    r.channels = qp.channels;
    int64_t n = 1;
    for (int32_t k = 0; k < t->ndim; k++)
        n *= t->shape[k];
    r.scales = malloc((size_t)r.channels * sizeof *r.scales);
    r.zps = malloc((size_t)r.channels * sizeof *r.zps);
    r.codes = malloc((size_t)n * qcal_dtype_size(o->q.dtype));
    for (int64_t c = 0; c < r.channels; c++) {
        r.scales[c] = qcal_qparams_scale_at(&qp, c);
        r.zps[c] = qcal_qparams_zero_point_at(&qp, c);
    }
    assert_int_equal(qcal_quantize(t, &qp, r.codes), QCAL_OK);
    qcal_qparams_free(&qp);
    qcal_observer_destroy(&obs);
    return r;
}

static void assert_same(const result *a, const result *b, int64_t n, size_t esz)
{
    assert_int_equal(a->st, b->st);
    assert_int_equal(a->channels, b->channels);
    assert_memory_equal(a->scales, b->scales, (size_t)a->channels * sizeof *a->scales);
    assert_memory_equal(a->zps, b->zps, (size_t)a->channels * sizeof *a->zps);
    assert_memory_equal(a->codes, b->codes, (size_t)n * esz);
}

/* Per-tensor / per-channel, symmetric / affine, qint8 / quint8, axis 0 and 1, in memory and
 * streamed in blocks of channels, of rows and flat blocks: the reference's bits. */
static void test_matches_reference(void **state)
{
    (void)state;
    static const qcal_qscheme qs[] = { QCAL_PER_TENSOR_AFFINE, QCAL_PER_TENSOR_SYMMETRIC,
                                       QCAL_PER_CHANNEL_AFFINE, QCAL_PER_CHANNEL_SYMMETRIC };
    static const qcal_dtype dts[] = { QCAL_QINT8, QCAL_QUINT8, QCAL_FLOAT8_E4M3FN, QCAL_FLOAT8_E5M2 };
    const int64_t shape[4] = { 24, 10, 3, 3 };   /* (out, in, kh, kw) */
    const int64_t n = 24 * 10 * 9;
    float *w = random_weight(n, 0.25f);
    w[17] = 0.0f, w[18] = -0.0f;
    qcal_tensor t = view(w, 4, shape);
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (size_t i = 0; i < sizeof qs / sizeof *qs; i++)
            for (int32_t axis = 0; axis < 2; axis++)
                for (size_t blk = 0; blk < 3; blk++) {
                    qcal_weights_options o;
                    qcal_weights_options_default(&o);
                    o.q.dtype = dts[d];
                    o.q.qscheme = qs[i];
                    o.axis = axis;
                    o.block_bytes = blk == 0 ? (size_t)512 << 10 : blk == 1 ? 400 : 4;
                    result ref = reference(&o, &t);
                    result mem = run(&o, &t, false, NULL);
                    int calls = 0;
                    result str = run(&o, &t, true, &calls);
                    assert_same(&ref, &mem, n, qcal_dtype_size(dts[d]));
                    assert_same(&ref, &str, n, qcal_dtype_size(dts[d]));
                    if (blk == 2)   /* small blocks: read many times, never whole */
                        assert_true(calls > 10);
                    result_free(&ref), result_free(&mem), result_free(&str);
                }
    free(w);
}

/* Numbers by hand: per-channel symmetric qint8 scale = amax / 127.5; per-tensor affine quint8
 * as PyTorch's MinMaxObserver; FP8 scale = amax / 448 (e4m3fn) and / 57344 (e5m2). */
static void test_numbers(void **state)
{
    (void)state;
    const float w[6] = { -1.0f, 0.5f, 0.25f, 2.0f, -4.0f, 1.0f };
    const int64_t shape[2] = { 2, 3 };
    qcal_tensor t = view(w, 2, shape);
    qcal_weights_options o;
    qcal_weights_options_default(&o);
    float s[2];
    int32_t z[2];
    int8_t q[6];
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_OK);
    assert_true(s[0] == 1.0f / 127.5f && s[1] == 4.0f / 127.5f);
    assert_int_equal(z[0], 0);
    assert_int_equal(z[1], 0);
    /* 0.5 * 127.5 = 63.75 -> 64, 0.25 * 127.5 = 31.875 -> 32 (the amax elements land on
     * +-127.5, a tie decided by the float inverse: the reference test covers them) */
    assert_int_equal(q[1], 64);
    assert_int_equal(q[2], 32);
    assert_int_equal(q[3], 64);
    assert_int_equal(q[5], 32);

    o.q.dtype = QCAL_QUINT8;
    o.q.qscheme = QCAL_PER_TENSOR_AFFINE;
    uint8_t u[6];
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, u), QCAL_OK);
    assert_true(s[0] == 6.0f / 255.0f);   /* (max - min) / 255 */
    assert_int_equal(z[0], 170);          /* 0 - round(-4 / s) = 170 */

    o.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    for (int f = 0; f < 2; f++) {
        o.q.dtype = f ? QCAL_FLOAT8_E5M2 : QCAL_FLOAT8_E4M3FN;
        const float big = f ? 57344.0f : 448.0f;
        assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, NULL, u), QCAL_OK);
        assert_true(s[0] == 1.0f / big && s[1] == 4.0f / big);
        assert_int_equal(u[4], f ? 0xFB : 0xFE);   /* -4 / s[1] = -largest (saturating) */
        assert_int_equal(u[3], f ? 0x77 : 0x76);   /* 2 / s[1] = largest / 2: 28672, 224 */
    }
}

/* NaN and Inf are not observed (they quantize by qcal/quantize.h's policy); a channel without
 * a finite value is scale 1 and QCAL_NO_DATA, or [0, 0] with empty_as_zero; under
 * QCAL_NONFINITE_ERROR the message names the element. */
static void test_nonfinite(void **state)
{
    (void)state;
    const float w[6] = { 1.0f, NAN, -2.0f, NAN, INFINITY, -NAN };
    const int64_t shape[2] = { 2, 3 };
    qcal_tensor t = view(w, 2, shape);
    qcal_weights_options o;
    qcal_weights_options_default(&o);
    float s[2];
    int32_t z[2];
    int8_t q[6];
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_NO_DATA);
    assert_true(s[0] == 2.0f / 127.5f);
    assert_true(s[1] == 1.0f);
    assert_int_equal(q[1], 0);     /* NaN -> zero-point */
    assert_int_equal(q[4], 127);   /* +Inf -> qmax */
    o.empty_as_zero = true;
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_OK);
    assert_true(s[0] == 2.0f / 127.5f);
    assert_true(s[1] == FLT_EPSILON);
    o.nonfinite = QCAL_NONFINITE_ERROR;
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_ERR_NONFINITE);
    assert_non_null(strstr(qcal_last_error(), "weight[0][1] = nan"));
}

static void test_errors(void **state)
{
    (void)state;
    float w[4] = { 1, 2, 3, 4 }, s[4];
    int32_t z[4];
    int8_t q[4];
    const int64_t shape[2] = { 2, 2 }, empty[2] = { 0, 2 };
    qcal_tensor t = view(w, 2, shape), e = view(w, 2, empty);
    qcal_weights_options o;
    qcal_weights_options_default(&o);
    assert_int_equal(qcal_weights_quantize(&o, &e, NULL, s, z, q), QCAL_ERR_EMPTY);
    o.axis = 2;
    int64_t ch = -1;
    assert_int_equal(qcal_weights_channels(&o, &t, &ch), QCAL_ERR_INVALID_ARG);
    assert_int_equal(ch, -1);
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_ERR_INVALID_ARG);
    o.axis = -1;
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_ERR_INVALID_ARG);
    o.axis = 0;
    o.observer = QCAL_OBSERVER_HISTOGRAM;   /* per-channel scheme, per-tensor kind */
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, s, z, q), QCAL_ERR_INVALID_ARG);
    o.observer = QCAL_OBSERVER_PER_CHANNEL_MINMAX;
    assert_int_equal(qcal_weights_quantize(&o, &t, NULL, NULL, z, q), QCAL_ERR_INVALID_ARG);
    qcal_tensor nodata = t;
    nodata.data = NULL;
    assert_int_equal(qcal_weights_quantize(&o, &nodata, NULL, s, z, q), QCAL_ERR_INVALID_ARG);
}

/* Given scales: zero-points 0, the codes of qcal_quantize with those qparams. */
static void test_given_scales(void **state)
{
    (void)state;
    const int64_t shape[2] = { 40, 300 }, n = 40 * 300;
    float *w = random_weight(n, 1.0f), given[40], s[40];
    for (int c = 0; c < 40; c++)
        given[c] = 0.01f * (float)(c + 1);
    qcal_tensor t = view(w, 2, shape);
    qcal_weights_options o;
    qcal_weights_options_default(&o);
    o.scales = given;
    o.block_bytes = 4096;
    int32_t z[40];
    int8_t *a = malloc((size_t)n), *b = malloc((size_t)n);
    copy_src src = { w, 0 };
    qcal_weights_reader rd = { copy_read, &src };
    assert_int_equal(qcal_weights_quantize(&o, &t, &rd, s, z, a), QCAL_OK);
    assert_memory_equal(s, given, sizeof given);
    for (int c = 0; c < 40; c++)
        assert_int_equal(z[c], 0);
    int32_t zz[40] = { 0 };
    qcal_qparams qp;
    assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_QINT8, 0, 40, given, zz), QCAL_OK);
    assert_int_equal(qcal_quantize(&t, &qp, b), QCAL_OK);
    assert_memory_equal(a, b, (size_t)n);
    free(a), free(b), free(w);
}

/* A weight above the threading threshold, streamed in small blocks: the same bits for 1, 2, 3
 * and 4 threads, and equal to the in-memory pass. */
static void test_threads(void **state)
{
    (void)state;
    const int64_t shape[3] = { 6, 256, 1024 }, n = 6 * 256 * 1024;   /* axis 1: outer 6 */
    float *w = random_weight(n, 0.5f);
    w[12345] = NAN;
    qcal_tensor t = view(w, 3, shape);
    static const qcal_qscheme qs[] = { QCAL_PER_CHANNEL_AFFINE, QCAL_PER_TENSOR_AFFINE };
    for (int k = 0; k < 2; k++)
        for (int32_t axis = 0; axis < 2; axis++) {
            qcal_weights_options o;
            qcal_weights_options_default(&o);
            o.q.qscheme = qs[k];
            o.axis = axis;
            o.block_bytes = 64 << 10;
            assert_int_equal(qcal_threads_set_count(1), QCAL_OK);
            result one = run(&o, &t, true, NULL);
            result mem = run(&o, &t, false, NULL);
            assert_same(&one, &mem, n, 1);
            /* the calling thread reading into the caller's buffer */
            assert_int_equal(qcal_weights_scratch_bytes(&o, &t), (size_t)n * 4 + QCAL_WEIGHTS_SCRATCH_SLACK);
            o.scratch_bytes = qcal_weights_scratch_bytes(&o, &t);
            o.scratch = malloc(o.scratch_bytes);
            result lent = run(&o, &t, true, NULL);
            assert_same(&one, &lent, n, 1);
            result_free(&lent);
            for (int nt = 2; nt <= 4; nt++) {
                assert_int_equal(qcal_threads_set_count(nt), QCAL_OK);
                result r = run(&o, &t, true, NULL);
                assert_same(&one, &r, n, 1);
                result_free(&r);
            }
            result_free(&one), result_free(&mem);
            free(o.scratch);
        }
    assert_int_equal(qcal_threads_set_count(0), QCAL_OK);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_given_scales),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
