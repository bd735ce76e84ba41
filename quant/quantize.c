/* Quantize / dequantize, bit-identical to PyTorch 1.13 on x86 (ATen's quantize_val /
 * dequantize_val; the Debian build has no fbgemm, and its arithmetic is the same):
 *
 *   inv_scale = 1.0f / scale                        (float32)
 *   q = clamp(zero_point + nearbyintf(x * inv_scale), qmin, qmax)
 *   x' = (float)(q - zero_point) * scale            (float32)
 *
 * Rounding contract: round half to even through nearbyintf / cvtps2dq under the default
 * rounding mode. We clamp x * inv_scale to [qmin - zp, qmax - zp] in float *before*
 * rounding: the bounds are integers, so round(clamp(v)) == clamp(round(v)), and nothing
 * ever converts an out-of-range float. PyTorch instead converts zp + round(v) to int64
 * (undefined for NaN, +-Inf and |v| >= 2^63; x86 gives INT64_MIN, i.e. qmin) and adds zp in
 * float (for qint32 a zero-point beyond 2^24 loses bits). qcal saturates +Inf / huge values
 * to qmax, -Inf to qmin, maps NaN to the zero-point and adds the zero-point exactly; on
 * every other input the result is PyTorch's, bit for bit (tests/test_quantize.c). */
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "qcal/quantize.h"
#include "quant/qparams_internal.h"
#include "qcal_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCAL_X86 1
#else
#define QCAL_X86 0
#endif

/* Element kernels (internal; tests reach them through the static library). */
void qcal_f32_quantize_u8__c(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst);
void qcal_f32_quantize_i8__c(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst);
void qcal_f32_quantize_i32__c(const float *x, int64_t n, float inv, int32_t zp, int32_t *dst);
#if QCAL_X86
void qcal_f32_quantize_u8__avx2(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst);
void qcal_f32_quantize_i8__avx2(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst);
void qcal_f32_quantize_u8__avx512(const float *x, int64_t n, float inv, int32_t zp,
                                  uint8_t *dst);
void qcal_f32_quantize_i8__avx512(const float *x, int64_t n, float inv, int32_t zp,
                                  int8_t *dst);
#endif
/* Per-position parameters (short channel rows): 8-bit output for quint8 and qint8 alike
 * (lo/hi carry the dtype's range; the byte of q is the same for both types). */
void qcal_f32_quantize_prow8__c(const float *x, int64_t n, const float *inv, const float *lo,
                                const float *hi, const int32_t *zp, uint8_t *dst);
#if QCAL_X86
void qcal_f32_quantize_prow8__avx2(const float *x, int64_t n, const float *inv,
                                   const float *lo, const float *hi, const int32_t *zp,
                                   uint8_t *dst);
void qcal_f32_quantize_prow8__avx512(const float *x, int64_t n, const float *inv,
                                     const float *lo, const float *hi, const int32_t *zp,
                                     uint8_t *dst);
#endif

size_t qcal_dtype_size(qcal_dtype dtype)
{
    switch (dtype) {
    case QCAL_QUINT8:
    case QCAL_QINT8: return 1;
    case QCAL_QINT32: return 4;
    }
    return 0;
}

/* ---- scalar reference ------------------------------------------------------------ */

static inline int32_t quant_one8(float x, float inv, float lo, float hi, int32_t zp)
{
    float v = x * inv;
    if (v != v)
        return zp;            /* NaN -> zero-point */
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (int32_t)nearbyintf(v) + zp;
}

void qcal_f32_quantize_u8__c(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst)
{
    const float lo = (float)(0 - zp), hi = (float)(255 - zp);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint8_t)quant_one8(x[i], inv, lo, hi, zp);
}

void qcal_f32_quantize_i8__c(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst)
{
    const float lo = (float)(-128 - zp), hi = (float)(127 - zp);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int8_t)quant_one8(x[i], inv, lo, hi, zp);
}

/* qint32: bounds INT32_MIN - zp, INT32_MAX - zp are exact in double; the clamped value is
 * rounded in double (same as nearbyintf on the float) and the zero-point added exactly.
 * qint32 tensors are biases (small), so there is no SIMD version. */
void qcal_f32_quantize_i32__c(const float *x, int64_t n, float inv, int32_t zp, int32_t *dst)
{
    const double lo = (double)INT32_MIN - zp, hi = (double)INT32_MAX - zp;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        if (v != v) {
            dst[i] = zp;
            continue;
        }
        double d = v;
        d = d < lo ? lo : d;
        d = d > hi ? hi : d;
        dst[i] = (int32_t)((int64_t)nearbyint(d) + zp);
    }
}

/* Same arithmetic as quant_one8 with parameters per position (lo[i] = qmin - zp[i],
 * hi[i] = qmax - zp[i] as floats): used for per-channel quantize when a channel's run of
 * contiguous elements (inner) is short, e.g. channels on the last axis. */
void qcal_f32_quantize_prow8__c(const float *x, int64_t n, const float *inv, const float *lo,
                                const float *hi, const int32_t *zp, uint8_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint8_t)quant_one8(x[i], inv[i], lo[i], hi[i], zp[i]);
}

/* ---- AVX2 ---------------------------------------------------------------------- */
#if QCAL_X86
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/* 8 floats -> 8 int32 offsets from zp: clamp(x*inv) with NaN lanes zeroed, rounded
 * half-even by cvtps2dq (MXCSR default). */
AVX2_TARGET static inline __m256i q8_avx2(const float *x, __m256 inv, __m256 lo, __m256 hi)
{
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
    __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
    __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_cvtps_epi32(_mm256_and_ps(c, ord));
}

AVX2_TARGET static inline __m256i q32x8_avx2(const float *x, __m256 inv, __m256 lo, __m256 hi,
                                              __m256i z, bool is_unsigned)
{
    __m256i a = _mm256_add_epi32(q8_avx2(x, inv, lo, hi), z);
    __m256i b = _mm256_add_epi32(q8_avx2(x + 8, inv, lo, hi), z);
    __m256i c = _mm256_add_epi32(q8_avx2(x + 16, inv, lo, hi), z);
    __m256i d = _mm256_add_epi32(q8_avx2(x + 24, inv, lo, hi), z);
    __m256i ab = _mm256_packs_epi32(a, b);   /* in range already: no saturation occurs */
    __m256i cd = _mm256_packs_epi32(c, d);
    __m256i r = is_unsigned ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2_TARGET void qcal_f32_quantize_u8__avx2(const float *x, int64_t n, float inv, int32_t zp,
                                            uint8_t *dst)
{
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(0 - zp)),
                 hi = _mm256_set1_ps((float)(255 - zp));
    const __m256i z = _mm256_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), q32x8_avx2(x + i, vinv, lo, hi, z, true));
    qcal_f32_quantize_u8__c(x + i, n - i, inv, zp, dst + i);
}

AVX2_TARGET void qcal_f32_quantize_i8__avx2(const float *x, int64_t n, float inv, int32_t zp,
                                            int8_t *dst)
{
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(-128 - zp)),
                 hi = _mm256_set1_ps((float)(127 - zp));
    const __m256i z = _mm256_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), q32x8_avx2(x + i, vinv, lo, hi, z, false));
    qcal_f32_quantize_i8__c(x + i, n - i, inv, zp, dst + i);
}

/* Per-position parameters: 8 lanes at a time, the low byte of each int32 kept (values are
 * in [qmin, qmax] of an 8-bit type, so the byte is the u8 or i8 result). */
AVX2_TARGET void qcal_f32_quantize_prow8__avx2(const float *x, int64_t n, const float *inv,
                                               const float *lo, const float *hi,
                                               const int32_t *zp, uint8_t *dst)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(inv + i));
        __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
        __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_loadu_ps(lo + i)),
                                 _mm256_loadu_ps(hi + i));
        __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_and_ps(c, ord)),
                                     _mm256_loadu_si256((const __m256i *)(zp + i)));
        __m256i b = _mm256_shuffle_epi8(q, pick);
        uint32_t w0 = (uint32_t)_mm256_extract_epi32(b, 0),
                 w1 = (uint32_t)_mm256_extract_epi32(b, 4);
        memcpy(dst + i, &w0, 4);
        memcpy(dst + i + 4, &w1, 4);
    }
    qcal_f32_quantize_prow8__c(x + i, n - i, inv + i, lo + i, hi + i, zp + i, dst + i);
}

/* ---- AVX-512 ------------------------------------------------------------------- */
AVX512_TARGET static inline __m512i q16_avx512(const float *x, __m512 inv, __m512 lo,
                                                __m512 hi, __m512i z)
{
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
    __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
    __m512 c = _mm512_maskz_mov_ps(ord, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
    return _mm512_add_epi32(_mm512_cvtps_epi32(c), z);
}

AVX512_TARGET void qcal_f32_quantize_u8__avx512(const float *x, int64_t n, float inv,
                                                int32_t zp, uint8_t *dst)
{
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps((float)(0 - zp)),
                 hi = _mm512_set1_ps((float)(255 - zp));
    const __m512i z = _mm512_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z));
        __m128i b = _mm512_cvtepi32_epi8(q16_avx512(x + i + 16, vinv, lo, hi, z));
        __m128i c = _mm512_cvtepi32_epi8(q16_avx512(x + i + 32, vinv, lo, hi, z));
        __m128i d = _mm512_cvtepi32_epi8(q16_avx512(x + i + 48, vinv, lo, hi, z));
        __m512i r = _mm512_inserti64x2(_mm512_castsi128_si512(a), b, 1);
        r = _mm512_inserti64x2(r, c, 2);
        r = _mm512_inserti64x2(r, d, 3);
        _mm512_storeu_si512((void *)(dst + i), r);
    }
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z)));
    qcal_f32_quantize_u8__c(x + i, n - i, inv, zp, dst + i);
}

AVX512_TARGET void qcal_f32_quantize_i8__avx512(const float *x, int64_t n, float inv,
                                                int32_t zp, int8_t *dst)
{
    /* Same bytes as the unsigned path: vpmovdb truncates, values are in range. */
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps((float)(-128 - zp)),
                 hi = _mm512_set1_ps((float)(127 - zp));
    const __m512i z = _mm512_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z));
        __m128i b = _mm512_cvtepi32_epi8(q16_avx512(x + i + 16, vinv, lo, hi, z));
        __m128i c = _mm512_cvtepi32_epi8(q16_avx512(x + i + 32, vinv, lo, hi, z));
        __m128i d = _mm512_cvtepi32_epi8(q16_avx512(x + i + 48, vinv, lo, hi, z));
        __m512i r = _mm512_inserti64x2(_mm512_castsi128_si512(a), b, 1);
        r = _mm512_inserti64x2(r, c, 2);
        r = _mm512_inserti64x2(r, d, 3);
        _mm512_storeu_si512((void *)(dst + i), r);
    }
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z)));
    qcal_f32_quantize_i8__c(x + i, n - i, inv, zp, dst + i);
}

AVX512_TARGET void qcal_f32_quantize_prow8__avx512(const float *x, int64_t n, const float *inv,
                                                   const float *lo, const float *hi,
                                                   const int32_t *zp, uint8_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(inv + i));
        __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
        __m512 c = _mm512_maskz_mov_ps(
            ord, _mm512_min_ps(_mm512_max_ps(v, _mm512_loadu_ps(lo + i)),
                               _mm512_loadu_ps(hi + i)));
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(c), _mm512_loadu_si512(zp + i));
        _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(q));
    }
    qcal_f32_quantize_prow8__c(x + i, n - i, inv + i, lo + i, hi + i, zp + i, dst + i);
}
#endif

/* ---- dispatch ------------------------------------------------------------------ */

typedef void (*prow_fn)(const float *, int64_t, const float *, const float *, const float *,
                        const int32_t *, uint8_t *);

static prow_fn pick_prow(void)
{
#if QCAL_X86
    qcal_isa isa = qcal_cpu_isa();
    if (isa >= QCAL_ISA_AVX512)
        return qcal_f32_quantize_prow8__avx512;
    if (isa >= QCAL_ISA_AVX2)
        return qcal_f32_quantize_prow8__avx2;
#endif
    return qcal_f32_quantize_prow8__c;
}

typedef void (*quant_fn)(const float *, int64_t, float, int32_t, void *);

static void q_u8_c(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_u8__c(x, n, inv, zp, d);
}
static void q_i8_c(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_i8__c(x, n, inv, zp, d);
}
static void q_i32_c(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_i32__c(x, n, inv, zp, d);
}
#if QCAL_X86
static void q_u8_avx2(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_u8__avx2(x, n, inv, zp, d);
}
static void q_i8_avx2(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_i8__avx2(x, n, inv, zp, d);
}
static void q_u8_avx512(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_u8__avx512(x, n, inv, zp, d);
}
static void q_i8_avx512(const float *x, int64_t n, float inv, int32_t zp, void *d)
{
    qcal_f32_quantize_i8__avx512(x, n, inv, zp, d);
}
#endif

static quant_fn pick_quant(qcal_dtype dtype)
{
    qcal_isa isa = qcal_cpu_isa();
    (void)isa;
    switch (dtype) {
    case QCAL_QUINT8:
#if QCAL_X86
        if (isa >= QCAL_ISA_AVX512)
            return q_u8_avx512;
        if (isa >= QCAL_ISA_AVX2)
            return q_u8_avx2;
#endif
        return q_u8_c;
    case QCAL_QINT8:
#if QCAL_X86
        if (isa >= QCAL_ISA_AVX512)
            return q_i8_avx512;
        if (isa >= QCAL_ISA_AVX2)
            return q_i8_avx2;
#endif
        return q_i8_c;
    case QCAL_QINT32: return q_i32_c;
    }
    return NULL;
}

static void dtype_limits(qcal_dtype dtype, int64_t *lo, int64_t *hi)
{
    switch (dtype) {
    case QCAL_QUINT8: *lo = 0; *hi = 255; return;
    case QCAL_QINT8: *lo = -128; *hi = 127; return;
    case QCAL_QINT32: *lo = INT32_MIN; *hi = INT32_MAX; return;
    }
    *lo = 0;
    *hi = -1;
}

/* Runs f over n elements in blocks, in parallel above the threading threshold
 * (elementwise: the result does not depend on the thread count). */
static void run_quant(quant_fn f, const float *x, int64_t n, float inv, int32_t zp,
                      uint8_t *dst, size_t esz)
{
    int nt = qcal_threads_for(n);
    if (nt <= 1) {
        f(x, n, inv, zp, dst);
        return;
    }
    const int64_t block = 1 << 16;
    int64_t nblocks = (n + block - 1) / block;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t s = b * block, len = n - s < block ? n - s : block;
        f(x + s, len, inv, zp, dst + (size_t)s * esz);
    }
}

static void quantize_per_tensor(const float *x, int64_t n, float scale, int32_t zero_point,
                                qcal_dtype dtype, void *dst)
{
    const float inv = 1.0f / scale;
    run_quant(pick_quant(dtype), x, n, inv, zero_point, dst, qcal_dtype_size(dtype));
}

/* shape split around axis: outer * C * inner. */
static qcal_status split_axis(const qcal_tensor *t, int32_t axis, int64_t channels,
                              int64_t *outer, int64_t *inner)
{
    int64_t n;
    qcal_status st = qcal_tensor_numel(t, &n);
    if (st != QCAL_OK)
        return st;
    int32_t a;
    if ((st = qcal_tensor_axis(t, axis, &a)) != QCAL_OK)
        return st;
    if (t->shape[a] != channels)
        return qcal_error(QCAL_ERR_MISMATCH,
                          "%lld scales/zero-points given but axis %d has %lld channels",
                          (long long)channels, (int)axis, (long long)t->shape[a]);
    int64_t o = 1, in = 1;
    for (int32_t i = 0; i < a; i++)
        o *= t->shape[i];          /* cannot overflow: numel succeeded */
    for (int32_t i = a + 1; i < t->ndim; i++)
        in *= t->shape[i];
    *outer = o;
    *inner = in;
    return QCAL_OK;
}

/* Per-channel quantize when each channel's contiguous run (inner) is short: the
 * parameters are expanded once over one slab of W = channels * inner positions and every
 * slab (outer index) runs a per-position kernel, instead of one kernel call per `inner`
 * elements. Same arithmetic per element (inv = 1.0f / scale[c]). Returns false (nothing
 * written) if the parameter rows cannot be allocated or W is very large. */
static bool quant_short_rows(const float *x, int64_t outer, int64_t channels, int64_t inner,
                             const float *scales, const int32_t *zps, qcal_dtype dtype,
                             uint8_t *dst, int nt)
{
    int64_t w = channels * inner;
    if (w > ((int64_t)1 << 22))
        return false;
    /* Short slabs are grouped: the parameter rows repeat `rep` times (>= ~1024 positions)
     * so one kernel call covers rep slabs. */
    int64_t rep = w >= 1024 ? 1 : (1024 + w - 1) / w;
    if (rep > outer)
        rep = outer;
    int64_t pw = rep * w;
    float *p = qcal_malloc((size_t)pw * 3 * sizeof(float));
    int32_t *z = qcal_malloc((size_t)pw * sizeof(int32_t));
    if (!p || !z) {
        free(p);
        free(z);
        return false;
    }
    int64_t qlo, qhi;
    dtype_limits(dtype, &qlo, &qhi);
    float *inv = p, *lo = p + pw, *hi = p + 2 * pw;
    for (int64_t k = 0; k < pw; k++) {
        int64_t c = (k % w) / inner;
        inv[k] = 1.0f / scales[c];
        lo[k] = (float)(qlo - zps[c]);
        hi[k] = (float)(qhi - zps[c]);
        z[k] = zps[c];
    }
    prow_fn f = pick_prow();
    (void)nt;
    /* x is (outer, W); groups of rep slabs are independent. */
    int64_t groups = (outer + rep - 1) / rep;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t g = 0; g < groups; g++) {
        int64_t o = g * rep, cnt = outer - o < rep ? outer - o : rep;
        f(x + o * w, cnt * w, inv, lo, hi, z, dst + o * w);
    }
    free(p);
    free(z);
    return true;
}

static void quantize_per_channel(const float *x, int64_t outer, int64_t channels, int64_t inner,
                                 const float *scales, const int32_t *zero_points,
                                 qcal_dtype dtype, void *dst)
{
    int64_t rows = outer * channels;
    quant_fn f = pick_quant(dtype);
    size_t esz = qcal_dtype_size(dtype);
    uint8_t *d = dst;
    int nt = qcal_threads_for(rows * inner);
    (void)nt;
    if (inner < 16 && dtype != QCAL_QINT32 &&
        quant_short_rows(x, outer, channels, inner, scales, zero_points, dtype, d, nt))
        return;
    /* x is (outer, C, inner); each (o, c) row of inner elements uses channel c. Per
     * channel inv_scale = 1.0f / scale[c], as ATen's quantize_val. */
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = r % channels;
        f(x + r * inner, inner, 1.0f / scales[c], zero_points[c], d + (size_t)(r * inner) * esz);
    }
}

/* Validates the arguments shared by quantize and dequantize: tensor t (src or dst),
 * qparams (integer zero-points), the channel split for per-channel values. */
static qcal_status check_args(const char *what, const qcal_tensor *t, const qcal_qparams *qp,
                              int64_t *outer, int64_t *inner)
{
    qcal_status st = qcal_qparams_check(qp, what, true, false);
    if (st != QCAL_OK)
        return st;
    if (qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "%s: per_channel_affine_float_qparams is not supported (integer "
                          "zero-points only)", what);
    int64_t n;
    if ((st = qcal_tensor_numel(t, &n)) != QCAL_OK)
        return st;
    if (qcal_qscheme_is_per_channel(qp->qscheme)) {
        if ((st = split_axis(t, qp->axis, qp->channels, outer, inner)) != QCAL_OK)
            return st;
    } else {
        *outer = 1;
        *inner = n;
    }
    if (n > 0 && !t->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: tensor data is NULL", what);
    return QCAL_OK;
}

qcal_status qcal_quantize(const qcal_tensor *src, const qcal_qparams *qp, void *dst)
{
    if (!src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "quantize: source or destination is NULL");
    int64_t outer = 0, inner = 0;
    qcal_status st = check_args("quantize", src, qp, &outer, &inner);
    if (st != QCAL_OK)
        return st;
    if (qcal_qscheme_is_per_channel(qp->qscheme))
        quantize_per_channel(src->data, outer, qp->channels, inner, qp->scales,
                             qp->zero_points, qp->dtype, dst);
    else
        quantize_per_tensor(src->data, inner, qp->scale, qp->zero_point, qp->dtype, dst);
    return QCAL_OK;
}

/* ---- dequantize (elementwise, C; the compiler vectorises these loops) ------------- */

static void deq_block(const void *src, qcal_dtype dtype, int64_t off, int64_t n, float scale,
                      int32_t zp, float *dst)
{
    switch (dtype) {
    case QCAL_QUINT8: {
        const uint8_t *q = (const uint8_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((int32_t)q[i] - zp) * scale;
        break;
    }
    case QCAL_QINT8: {
        const int8_t *q = (const int8_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((int32_t)q[i] - zp) * scale;
        break;
    }
    case QCAL_QINT32: {
        /* The difference in int64: PyTorch subtracts in int32, which wraps for q near
         * INT32_MIN/MAX (e.g. q = INT32_MIN, zp = 3 dequantizes to +2^31 * scale there). */
        const int32_t *q = (const int32_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((int64_t)q[i] - zp) * scale;
        break;
    }
    }
}

static void dequantize_per_tensor(const void *src, qcal_dtype dtype, float scale,
                                  int32_t zero_point, int64_t n, float *dst)
{
    int nt = qcal_threads_for(n);
    (void)nt;
    const int64_t block = 1 << 16;
    int64_t nblocks = (n + block - 1) / block;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t s = b * block, len = n - s < block ? n - s : block;
        deq_block(src, dtype, s, len, scale, zero_point, dst + s);
    }
}

/* Dequantize of one slab with per-position scale/zero-point rows (short channel runs);
 * same arithmetic as deq_block. */
static void deq_prow(const void *src, qcal_dtype dtype, int64_t off, int64_t w,
                     const float *sc, const int32_t *zp, float *dst)
{
    switch (dtype) {
    case QCAL_QUINT8: {
        const uint8_t *q = (const uint8_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int32_t)q[i] - zp[i]) * sc[i];
        break;
    }
    case QCAL_QINT8: {
        const int8_t *q = (const int8_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int32_t)q[i] - zp[i]) * sc[i];
        break;
    }
    case QCAL_QINT32: {
        const int32_t *q = (const int32_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int64_t)q[i] - zp[i]) * sc[i];
        break;
    }
    }
}

/* Per-channel dequantize with short channel runs (see quant_short_rows). */
static bool deq_short_rows(const void *src, qcal_dtype dtype, int64_t outer, int64_t channels,
                           int64_t inner, const float *scales, const int32_t *zps, float *dst,
                           int nt)
{
    int64_t w = channels * inner;
    if (w > ((int64_t)1 << 22))
        return false;
    float *sc = qcal_malloc((size_t)w * sizeof(float));
    int32_t *z = qcal_malloc((size_t)w * sizeof(int32_t));
    if (!sc || !z) {
        free(sc);
        free(z);
        return false;
    }
    for (int64_t c = 0; c < channels; c++)
        for (int64_t i = 0; i < inner; i++) {
            sc[c * inner + i] = scales[c];
            z[c * inner + i] = zps[c];
        }
    (void)nt;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t o = 0; o < outer; o++)
        deq_prow(src, dtype, o * w, w, sc, z, dst + o * w);
    free(sc);
    free(z);
    return true;
}

static void dequantize_per_channel(const void *src, qcal_dtype dtype, int64_t outer,
                                   int64_t channels, int64_t inner, const float *scales,
                                   const int32_t *zero_points, float *dst)
{
    int64_t rows = outer * channels;
    int nt = qcal_threads_for(rows * inner);
    (void)nt;
    if (inner < 16 && deq_short_rows(src, dtype, outer, channels, inner, scales, zero_points,
                                     dst, nt))
        return;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = r % channels;
        deq_block(src, dtype, r * inner, inner, scales[c], zero_points[c], dst + r * inner);
    }
}

qcal_status qcal_dequantize(const void *src, const qcal_qparams *qp, qcal_tensor *dst)
{
    if (!src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dequantize: source or destination is NULL");
    int64_t outer = 0, inner = 0;
    qcal_status st = check_args("dequantize", dst, qp, &outer, &inner);
    if (st != QCAL_OK)
        return st;
    if (qcal_qscheme_is_per_channel(qp->qscheme))
        dequantize_per_channel(src, qp->dtype, outer, qp->channels, inner, qp->scales,
                               qp->zero_points, dst->data);
    else
        dequantize_per_tensor(src, qp->dtype, qp->scale, qp->zero_point, inner, dst->data);
    return QCAL_OK;
}
