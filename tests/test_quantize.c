/* unit.quantize: quantize/dequantize against PyTorch 1.13 (int_repr and dequantize, exact),
 * SIMD kernels vs the C reference with canaries, NaN/Inf/huge policy, argument errors. */
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
#include "qcal/qcal.h"
#include "testutil.h"

static void set_isa(const char *isa)
{
    if (isa)
        setenv("QCAL_ISA", isa, 1);
    else
        unsetenv("QCAL_ISA");
    qcal_cpu_reset();
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int32_t load_q(const void *buf, qcal_dtype dt, int64_t i)
{
    switch (dt) {
    case QCAL_QUINT8: return ((const uint8_t *)buf)[i];
    case QCAL_QINT8: return ((const int8_t *)buf)[i];
    case QCAL_QINT32: return ((const int32_t *)buf)[i];
    default: break;
    }
    return 0;
}

/* qcal's documented value where PyTorch's arithmetic is undefined or inexact: x*inv
 * non-finite or |x*inv| >= 2^62 (PyTorch: qmin through an overflowing cast), or a
 * zero-point sum not representable in float (qint32 only). */
static int32_t exact_q(float x, float scale, int32_t zp, qcal_dtype dt)
{
    int64_t lo = dt == QCAL_QUINT8 ? 0 : dt == QCAL_QINT8 ? -128 : INT32_MIN;
    int64_t hi = dt == QCAL_QUINT8 ? 255 : dt == QCAL_QINT8 ? 127 : INT32_MAX;
    float v = x * (1.0f / scale);
    if (isnan(v))
        return zp;
    if (v > 4e18f)
        return (int32_t)hi;
    if (v < -4e18f)
        return (int32_t)lo;
    int64_t q = (int64_t)nearbyintf(v) + zp;
    return (int32_t)(q < lo ? lo : q > hi ? hi : q);
}

static void test_golden(void **state)
{
    (void)state;
    const char *dir = getenv("QCAL_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/minmax/quantize.bin", dir ? dir : "tests/data");
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char magic[4];
    uint32_t ncases;
    assert_int_equal(fread(magic, 1, 4, fp), 4);
    assert_memory_equal(magic, "QCQZ", 4);
    assert_int_equal(fread(&ncases, 4, 1, fp), 1);
    assert_true(ncases >= 20);
    const char *isas[3] = { "c", "avx2", NULL };
    int64_t total = 0, divergent = 0;
    for (uint32_t cs = 0; cs < ncases; cs++) {
        uint32_t h[3];
        assert_int_equal(fread(h, 4, 3, fp), 3);
        qcal_dtype dt = (qcal_dtype)h[0];
        int per_channel = (int)h[1];
        int32_t ndim = (int32_t)h[2];
        int64_t shape[QCAL_MAX_DIMS];
        int32_t axis;
        int64_t nch, n;
        assert_int_equal(fread(shape, 8, (size_t)ndim, fp), (size_t)ndim);
        assert_int_equal(fread(&axis, 4, 1, fp), 1);
        assert_int_equal(fread(&nch, 8, 1, fp), 1);
        float *sc = malloc((size_t)nch * 4);
        int32_t *zp = malloc((size_t)nch * 4);
        assert_int_equal(fread(sc, 4, (size_t)nch, fp), (size_t)nch);
        assert_int_equal(fread(zp, 4, (size_t)nch, fp), (size_t)nch);
        assert_int_equal(fread(&n, 8, 1, fp), 1);
        float *x = malloc((size_t)n * 4), *deq = malloc((size_t)n * 4), *mine = malloc((size_t)n * 4);
        int32_t *q = malloc((size_t)n * 4);
        assert_int_equal(fread(x, 4, (size_t)n, fp), (size_t)n);
        assert_int_equal(fread(q, 4, (size_t)n, fp), (size_t)n);
        assert_int_equal(fread(deq, 4, (size_t)n, fp), (size_t)n);
        qcal_tensor t;
        assert_int_equal(qcal_tensor_init(&t, x, ndim, shape), QCAL_OK);
        void *out = malloc((size_t)n * 4 + 64);
        int64_t inner = 1;
        int32_t ax = axis < 0 ? axis + ndim : axis;
        for (int32_t k = ax + 1; k < ndim; k++)
            inner *= shape[k];
        for (int ii = 0; ii < 3; ii++) {
            set_isa(isas[ii]);
            qcal_status st = per_channel
                ? qcal_quantize(&t, tu_qpc(dt, axis, nch, sc, zp), out)
                : qcal_quantize(&t, tu_qp(dt, sc[0], zp[0]), out);
            assert_int_equal(st, QCAL_OK);
            int64_t worst = -1;
            for (int64_t i = 0; i < n; i++) {
                int64_t c = per_channel ? (i / inner) % nch : 0;
                int32_t got = load_q(out, dt, i), want = q[i];
                if (got != want) {
                    /* Only the documented divergences are allowed. */
                    int32_t ex = exact_q(x[i], sc[c], zp[c], dt);
                    bool pt_undefined = !(fabsf(x[i] * (1.0f / sc[c])) < 4e18f);
                    bool pt_float_add = dt == QCAL_QINT32 &&
                        (double)((float)zp[c] + nearbyintf(x[i] * (1.0f / sc[c]))) !=
                        (double)zp[c] + (double)nearbyintf(x[i] * (1.0f / sc[c]));
                    if (got == ex && (pt_undefined || pt_float_add)) {
                        if (ii == 0)
                            divergent++;
                        continue;
                    }
                    worst = i;
                    break;
                }
            }
            if (worst >= 0)
                fail_msg("case %u (%s, %s, isa %s): element %lld x=%.9g scale=%.9g zp=%d: "
                         "got %d, PyTorch %d", cs, qcal_dtype_name(dt),
                         per_channel ? "per-channel" : "per-tensor", isas[ii] ? isas[ii] : "best",
                         (long long)worst, (double)x[worst],
                         (double)sc[per_channel ? (worst / inner) % nch : 0],
                         per_channel ? zp[(worst / inner) % nch] : zp[0], load_q(out, dt, worst),
                         q[worst]);
        }
        /* Dequantize PyTorch's integers: bit-identical floats. */
        void *qin = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            if (dt == QCAL_QUINT8)
                ((uint8_t *)qin)[i] = (uint8_t)q[i];
            else if (dt == QCAL_QINT8)
                ((int8_t *)qin)[i] = (int8_t)q[i];
            else
                ((int32_t *)qin)[i] = q[i];
        }
        qcal_tensor_mut d;
        assert_int_equal(qcal_tensor_mut_init(&d, mine, ndim, shape), QCAL_OK);
        assert_int_equal(per_channel
                             ? qcal_dequantize(qin, tu_qpc(dt, axis, nch, sc, zp), &d)
                             : qcal_dequantize(qin, tu_qp(dt, sc[0], zp[0]), &d),
                         QCAL_OK);
        for (int64_t i = 0; i < n; i++) {
            int64_t c = per_channel ? (i / inner) % nch : 0;
            int64_t diff = (int64_t)q[i] - zp[c];
            if (dt == QCAL_QINT32 && (diff < INT32_MIN || diff > INT32_MAX)) {
                /* PyTorch subtracts in int32 and wraps; qcal is exact. */
                assert_true(bits(mine[i]) == bits((float)diff * sc[c]));
                divergent++;
                continue;
            }
            if (bits(mine[i]) != bits(deq[i]))
                fail_msg("case %u dequantize element %lld (q=%d): %.9g != PyTorch %.9g", cs,
                         (long long)i, q[i], (double)mine[i], (double)deq[i]);
        }
        total += n;
        free(qin);
        free(out);
        free(sc);
        free(zp);
        free(x);
        free(deq);
        free(mine);
        free(q);
    }
    set_isa(NULL);
    fclose(fp);
    print_message("quantize golden: %u cases, %lld elements; %lld documented divergences "
                  "(PyTorch undefined casts of huge/non-finite values, qint32 float zero-point "
                  "sums, qint32 int32-wrapping dequantize)\n", ncases, (long long)total, (long long)divergent);
    assert_true(divergent > 0);
}

static uint64_t rs = 1;
static uint32_t rnd(void)
{
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rs >> 33);
}

/* Per-channel quantize/dequantize along the last axis and a short middle axis (the
 * per-position path) equal the per-element formula, for every ISA. */
static void test_per_channel_short_rows(void **state)
{
    (void)state;
    const int64_t shapes[3][3] = { { 37, 5, 3 }, { 64, 3, 1 }, { 3, 40, 1 } };
    const char *isas[3] = { "c", "avx2", NULL };
    for (int sh = 0; sh < 3; sh++) {
        for (int axis = 1; axis <= 2; axis++) {
            int64_t shape[3] = { shapes[sh][0], shapes[sh][1], shapes[sh][2] };
            if (axis == 2)
                shape[2] = shapes[sh][1];
            int64_t n = shape[0] * shape[1] * shape[2], nch = shape[axis];
            int64_t inner = axis == 1 ? shape[2] : 1;
            float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
            float *sc = malloc((size_t)nch * 4);
            int32_t *zp = malloc((size_t)nch * 4);
            uint8_t *q = malloc((size_t)n);
            for (int64_t i = 0; i < n; i++)
                x[i] = ((float)(rnd() % 4001) - 2000.0f) / 32.0f;
            x[n / 2] = NAN;
            x[n / 3] = INFINITY;
            for (int64_t c = 0; c < nch; c++) {
                sc[c] = 0.05f + 0.01f * (float)c;
                zp[c] = (int32_t)(rnd() % 256) - 128;
            }
            qcal_tensor t;
            assert_int_equal(qcal_tensor_init(&t, x, 3, shape), QCAL_OK);
            for (int ii = 0; ii < 3; ii++) {
                set_isa(isas[ii]);
                assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QINT8, axis, nch, sc, zp), q),
                                 QCAL_OK);
                for (int64_t i = 0; i < n; i++) {
                    int64_t c = (i / inner) % nch;
                    int32_t want = exact_q(x[i], sc[c], zp[c], QCAL_QINT8);
                    if ((int8_t)q[i] != want)
                        fail_msg("shape %d axis %d isa %s element %lld (x=%g): %d != %d", sh,
                                 axis, isas[ii] ? isas[ii] : "best", (long long)i,
                                 (double)x[i], (int8_t)q[i], want);
                }
                qcal_tensor_mut d;
                assert_int_equal(qcal_tensor_mut_init(&d, y, t.ndim, t.shape), QCAL_OK);
                assert_int_equal(qcal_dequantize(q, tu_qpc(QCAL_QINT8, axis, nch, sc, zp), &d),
                                 QCAL_OK);
                for (int64_t i = 0; i < n; i++) {
                    int64_t c = (i / inner) % nch;
                    float want = (float)((int32_t)(int8_t)q[i] - zp[c]) * sc[c];
                    if (y[i] != want)
                        fail_msg("dequantize shape %d axis %d element %lld: %g != %g", sh, axis,
                                 (long long)i, (double)y[i], (double)want);
                }
            }
            set_isa(NULL);
            free(x);
            free(y);
            free(sc);
            free(zp);
            free(q);
        }
    }
}

static void test_policy(void **state)
{
    (void)state;
    float x[8] = { NAN, INFINITY, -INFINITY, 3e38f, -3e38f, 2.5f, 3.5f, -2.5f };
    const int64_t n = 8;
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, &n), QCAL_OK);
    const char *isas[3] = { "c", "avx2", NULL };
    for (int ii = 0; ii < 3; ii++) {
        set_isa(isas[ii]);
        uint8_t u[8];
        assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QUINT8, 1.0f, 10), u), QCAL_OK);
        const uint8_t eu[8] = { 10, 255, 0, 255, 0, 12, 14, 8 };   /* ties to even */
        assert_memory_equal(u, eu, 8);
        int8_t s[8];
        assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QINT8, 1.0f, -3), s), QCAL_OK);
        const int8_t es[8] = { -3, 127, -128, 127, -128, -1, 1, -5 };
        assert_memory_equal(s, es, 8);
        int32_t w[8];
        assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QINT32, 1.0f, -7), w), QCAL_OK);
        const int32_t ew[8] = { -7, INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, -5, -3, -9 };
        assert_memory_equal(w, ew, sizeof ew);
        /* qint32 zero-point added exactly (PyTorch adds it in float). */
        float big = 16777216.0f;
        const int64_t one = 1;
        qcal_tensor tb;
        assert_int_equal(qcal_tensor_init(&tb, &big, 1, &one), QCAL_OK);
        assert_int_equal(qcal_quantize(&tb, tu_qp(QCAL_QINT32, 1.0f, 1), w), QCAL_OK);
        assert_int_equal(w[0], 16777217);
    }
    set_isa(NULL);
    /* Large, threaded: same bytes as the C reference. */
    int64_t big_n = (1 << 21) + 5;
    float *y = malloc((size_t)big_n * 4);
    for (int64_t i = 0; i < big_n; i++)
        y[i] = ((float)(rnd() % 100001) - 50000.0f) / 128.0f;
    qcal_tensor ty;
    assert_int_equal(qcal_tensor_init(&ty, y, 1, &big_n), QCAL_OK);
    uint8_t *q1 = malloc((size_t)big_n), *q2 = malloc((size_t)big_n);
    set_isa("c");
    assert_int_equal(qcal_quantize(&ty, tu_qp(QCAL_QUINT8, 0.37f, 77), q1), QCAL_OK);
    set_isa(NULL);
    assert_int_equal(qcal_quantize(&ty, tu_qp(QCAL_QUINT8, 0.37f, 77), q2), QCAL_OK);
    assert_memory_equal(q1, q2, (size_t)big_n);
    float *d = malloc((size_t)big_n * 4);
    qcal_tensor_mut td;
    assert_int_equal(qcal_tensor_mut_init(&td, d, 1, &big_n), QCAL_OK);
    assert_int_equal(qcal_dequantize(q2, tu_qp(QCAL_QUINT8, 0.37f, 77), &td), QCAL_OK);
    for (int64_t i = 0; i < big_n; i += 9973)
        assert_true(d[i] == (float)((int)q2[i] - 77) * 0.37f);
    free(y);
    free(q1);
    free(q2);
    free(d);
}

static void test_errors(void **state)
{
    (void)state;
    float x[6] = { 1, 2, 3, 4, 5, 6 };
    const int64_t shape[2] = { 2, 3 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    uint8_t out[6] = { 9, 9, 9, 9, 9, 9 };
    const uint8_t untouched[6] = { 9, 9, 9, 9, 9, 9 };
    const float bad_scales[] = { 0.0f, -1.0f, NAN, INFINITY };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QUINT8, bad_scales[i], 0), out),
                         QCAL_ERR_INVALID_ARG);
        assert_non_null(strstr(qcal_last_error(), "scale"));
    }
    assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QUINT8, 1.0f, 256), out),
                     QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "256"));
    assert_int_equal(qcal_quantize(&t, tu_qp(QCAL_QINT8, 1.0f, -129), out),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_quantize(&t, tu_qp((qcal_dtype)5, 1.0f, 0), out),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_quantize(NULL, tu_qp(QCAL_QUINT8, 1.0f, 0), out),
                     QCAL_ERR_INVALID_ARG);
    float sc[3] = { 1, 1, 0 };
    int32_t zp[3] = { 0, 0, 0 };
    assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QUINT8, 1, 3, sc, zp), out),
                     QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "channel 2"));
    sc[2] = 1;
    assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QUINT8, 0, 3, sc, zp), out),
                     QCAL_ERR_MISMATCH);
    assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QUINT8, 2, 3, sc, zp), out),
                     QCAL_ERR_INVALID_ARG);
    assert_memory_equal(out, untouched, 6);
    assert_int_equal(qcal_quantize(&t, tu_qpc(QCAL_QUINT8, -1, 3, sc, zp), out), QCAL_OK);
    const uint8_t want[6] = { 1, 2, 3, 4, 5, 6 };
    assert_memory_equal(out, want, 6);
    float back[6];
    qcal_tensor_mut tb;
    assert_int_equal(qcal_tensor_mut_init(&tb, back, 2, shape), QCAL_OK);
    assert_int_equal(qcal_dequantize(out, tu_qp(QCAL_QUINT8, -1.0f, 0), &tb),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_dequantize(out, tu_qpc(QCAL_QUINT8, 0, 3, sc, zp), &tb),
                     QCAL_ERR_MISMATCH);
    assert_int_equal(qcal_dtype_size(QCAL_QUINT8), 1);
    assert_int_equal(qcal_dtype_size(QCAL_QINT8), 1);
    assert_int_equal(qcal_dtype_size(QCAL_QINT32), 4);
    assert_int_equal(qcal_dtype_size((qcal_dtype)9), 0);
    /* Empty tensors quantize to nothing. */
    const int64_t zero = 0;
    qcal_tensor te;
    assert_int_equal(qcal_tensor_init(&te, NULL, 1, &zero), QCAL_OK);
    assert_int_equal(qcal_quantize(&te, tu_qp(QCAL_QUINT8, 1.0f, 0), out), QCAL_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_per_channel_short_rows),
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
