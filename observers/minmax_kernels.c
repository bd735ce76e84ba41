/* Min/max reduction kernels that skip and count non-finite values (see minmax_kernels.h).
 *
 * Non-finite test: a float is NaN or +-Inf exactly when its exponent bits are all ones,
 * so one AND + integer compare per vector classifies 8/16 lanes. AVX-512 keeps the finite
 * lanes with masked vminps/vmaxps; AVX2 turns non-finite lanes into an all-ones NaN and
 * relies on vminps(a, b) returning its second operand b when either is NaN, with the
 * accumulator as b, so a NaN lane never replaces the accumulator. Four independent
 * accumulators hide the min/max latency; the loop stays bound by memory bandwidth. */
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "observers/minmax_kernels.h"
#include "qcal_config.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCAL_X86 1
#else
#define QCAL_X86 0
#endif

#define EXP_MASK 0x7f800000u
#define MAX_PARTS 64

static inline bool finite_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & EXP_MASK) != EXP_MASK;
}

/* ---- C references ----------------------------------------------------------------- */

void qcal_f32_minmax__c(const float *x, int64_t n, float *mn, float *mx, uint64_t *nonfinite)
{
    float lo = INFINITY, hi = -INFINITY;
    uint64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!finite_bits(v)) {
            bad++;
            continue;
        }
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    *mn = lo;
    *mx = hi;
    *nonfinite = bad;
}

void qcal_f32_minmax_cols__c(const float *x, int64_t rows, int64_t width, float *cmn,
                             float *cmx, uint64_t *nonfinite)
{
    uint64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * width;
        for (int64_t j = 0; j < width; j++) {
            float v = row[j];
            if (!finite_bits(v)) {
                bad++;
                continue;
            }
            cmn[j] = v < cmn[j] ? v : cmn[j];
            cmx[j] = v > cmx[j] ? v : cmx[j];
        }
    }
    *nonfinite += bad;
}

#if QCAL_X86
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/* ---- AVX2 ------------------------------------------------------------------------- */

/* Lane counters are int32: flush them to 64 bits at least every 2^28 vectors. */
#define FLUSH_ELEMS ((int64_t)1 << 30)

AVX2_TARGET static inline void step_avx2(__m256 a, __m256i expm, __m256 *lo, __m256 *hi,
                                         __m256i *cnt)
{
    __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(a), expm), expm);
    __m256 y = _mm256_or_ps(a, _mm256_castsi256_ps(bad));   /* non-finite -> NaN */
    *lo = _mm256_min_ps(y, *lo);                            /* NaN y -> keeps *lo */
    *hi = _mm256_max_ps(y, *hi);
    *cnt = _mm256_sub_epi32(*cnt, bad);
}

AVX2_TARGET static uint64_t hsum_avx2(__m256i c)
{
    uint32_t t[8];
    _mm256_storeu_si256((__m256i *)t, c);
    uint64_t s = 0;
    for (int i = 0; i < 8; i++)
        s += t[i];
    return s;
}

AVX2_TARGET void qcal_f32_minmax__avx2(const float *x, int64_t n, float *mn, float *mx,
                                       uint64_t *nonfinite)
{
    const __m256i expm = _mm256_set1_epi32((int)EXP_MASK);
    __m256 l0 = _mm256_set1_ps(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m256 h0 = _mm256_set1_ps(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    uint64_t bad = 0;
    int64_t i = 0;
    while (i + 32 <= n) {
        int64_t end = n - i > FLUSH_ELEMS ? i + FLUSH_ELEMS : n;
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
        for (; i + 32 <= end; i += 32) {
            step_avx2(_mm256_loadu_ps(x + i), expm, &l0, &h0, &c0);
            step_avx2(_mm256_loadu_ps(x + i + 8), expm, &l1, &h1, &c1);
            step_avx2(_mm256_loadu_ps(x + i + 16), expm, &l2, &h2, &c2);
            step_avx2(_mm256_loadu_ps(x + i + 24), expm, &l3, &h3, &c3);
        }
        bad += hsum_avx2(c0) + hsum_avx2(c1) + hsum_avx2(c2) + hsum_avx2(c3);
    }
    l0 = _mm256_min_ps(_mm256_min_ps(l0, l1), _mm256_min_ps(l2, l3));
    h0 = _mm256_max_ps(_mm256_max_ps(h0, h1), _mm256_max_ps(h2, h3));
    float lt[8], ht[8];
    _mm256_storeu_ps(lt, l0);
    _mm256_storeu_ps(ht, h0);
    float lo, hi;
    uint64_t tb;
    qcal_f32_minmax__c(x + i, n - i, &lo, &hi, &tb);
    for (int k = 0; k < 8; k++) {
        lo = lt[k] < lo ? lt[k] : lo;
        hi = ht[k] > hi ? ht[k] : hi;
    }
    *mn = lo;
    *mx = hi;
    *nonfinite = bad + tb;
}

AVX2_TARGET void qcal_f32_minmax_cols__avx2(const float *x, int64_t rows, int64_t width,
                                            float *cmn, float *cmx, uint64_t *nonfinite)
{
    const __m256i expm = _mm256_set1_epi32((int)EXP_MASK);
    uint64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * width;
        __m256i cnt = _mm256_setzero_si256();
        int64_t j = 0;
        for (; j + 8 <= width; j += 8) {
            __m256 lo = _mm256_loadu_ps(cmn + j), hi = _mm256_loadu_ps(cmx + j);
            step_avx2(_mm256_loadu_ps(row + j), expm, &lo, &hi, &cnt);
            _mm256_storeu_ps(cmn + j, lo);
            _mm256_storeu_ps(cmx + j, hi);
        }
        bad += hsum_avx2(cnt);
        if (j < width)
            qcal_f32_minmax_cols__c(row + j, 1, width - j, cmn + j, cmx + j, &bad);
    }
    *nonfinite += bad;
}

/* ---- AVX-512 ---------------------------------------------------------------------- */

AVX512_TARGET static inline void step_avx512(__m512 a, __m512i expm, __m512 *lo, __m512 *hi,
                                             __m512i *cnt)
{
    __mmask16 ok = _mm512_cmpneq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(a), expm), expm);
    *lo = _mm512_mask_min_ps(*lo, ok, *lo, a);
    *hi = _mm512_mask_max_ps(*hi, ok, *hi, a);
    *cnt = _mm512_mask_add_epi32(*cnt, (__mmask16)~ok, *cnt, _mm512_set1_epi32(1));
}

AVX512_TARGET static uint64_t hsum_avx512(__m512i c)
{
    uint32_t t[16];
    _mm512_storeu_si512((void *)t, c);
    uint64_t s = 0;
    for (int i = 0; i < 16; i++)
        s += t[i];
    return s;
}

AVX512_TARGET void qcal_f32_minmax__avx512(const float *x, int64_t n, float *mn, float *mx,
                                           uint64_t *nonfinite)
{
    const __m512i expm = _mm512_set1_epi32((int)EXP_MASK);
    __m512 l0 = _mm512_set1_ps(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m512 h0 = _mm512_set1_ps(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    uint64_t bad = 0;
    int64_t i = 0;
    while (i + 64 <= n) {
        int64_t end = n - i > FLUSH_ELEMS ? i + FLUSH_ELEMS : n;
        __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
        for (; i + 64 <= end; i += 64) {
            step_avx512(_mm512_loadu_ps(x + i), expm, &l0, &h0, &c0);
            step_avx512(_mm512_loadu_ps(x + i + 16), expm, &l1, &h1, &c1);
            step_avx512(_mm512_loadu_ps(x + i + 32), expm, &l2, &h2, &c2);
            step_avx512(_mm512_loadu_ps(x + i + 48), expm, &l3, &h3, &c3);
        }
        bad += hsum_avx512(_mm512_add_epi32(_mm512_add_epi32(c0, c1),
                                            _mm512_add_epi32(c2, c3)));
    }
    /* Remaining < 64 elements: whole vectors, then a masked load for the last few. */
    __m512i ct = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16)
        step_avx512(_mm512_loadu_ps(x + i), expm, &l0, &h0, &ct);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        /* Masked-off lanes load as 0.0f; replace them by +inf/-inf-neutral values. */
        __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        __mmask16 ok = m & _mm512_cmpneq_epi32_mask(
                               _mm512_and_si512(_mm512_castps_si512(a), expm), expm);
        l0 = _mm512_mask_min_ps(l0, ok, l0, a);
        h0 = _mm512_mask_max_ps(h0, ok, h0, a);
        bad += (uint64_t)__builtin_popcount((unsigned)(m & (__mmask16)~ok));
    }
    bad += hsum_avx512(ct);
    l0 = _mm512_min_ps(_mm512_min_ps(l0, l1), _mm512_min_ps(l2, l3));
    h0 = _mm512_max_ps(_mm512_max_ps(h0, h1), _mm512_max_ps(h2, h3));
    *mn = _mm512_reduce_min_ps(l0);
    *mx = _mm512_reduce_max_ps(h0);
    *nonfinite = bad;
}

AVX512_TARGET void qcal_f32_minmax_cols__avx512(const float *x, int64_t rows, int64_t width,
                                                float *cmn, float *cmx, uint64_t *nonfinite)
{
    const __m512i expm = _mm512_set1_epi32((int)EXP_MASK);
    uint64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * width;
        __m512i cnt = _mm512_setzero_si512();
        int64_t j = 0;
        for (; j + 16 <= width; j += 16) {
            __m512 lo = _mm512_loadu_ps(cmn + j), hi = _mm512_loadu_ps(cmx + j);
            step_avx512(_mm512_loadu_ps(row + j), expm, &lo, &hi, &cnt);
            _mm512_storeu_ps(cmn + j, lo);
            _mm512_storeu_ps(cmx + j, hi);
        }
        bad += hsum_avx512(cnt);
        if (j < width)
            qcal_f32_minmax_cols__c(row + j, 1, width - j, cmn + j, cmx + j, &bad);
    }
    *nonfinite += bad;
}
#else
void qcal_f32_minmax__avx2(const float *x, int64_t n, float *mn, float *mx, uint64_t *nf)
{
    qcal_f32_minmax__c(x, n, mn, mx, nf);
}
void qcal_f32_minmax__avx512(const float *x, int64_t n, float *mn, float *mx, uint64_t *nf)
{
    qcal_f32_minmax__c(x, n, mn, mx, nf);
}
void qcal_f32_minmax_cols__avx2(const float *x, int64_t rows, int64_t width, float *cmn,
                                float *cmx, uint64_t *nf)
{
    qcal_f32_minmax_cols__c(x, rows, width, cmn, cmx, nf);
}
void qcal_f32_minmax_cols__avx512(const float *x, int64_t rows, int64_t width, float *cmn,
                                  float *cmx, uint64_t *nf)
{
    qcal_f32_minmax_cols__c(x, rows, width, cmn, cmx, nf);
}
#endif

/* ---- dispatch --------------------------------------------------------------------- */

typedef void (*flat_fn)(const float *, int64_t, float *, float *, uint64_t *);
typedef void (*cols_fn)(const float *, int64_t, int64_t, float *, float *, uint64_t *);

static flat_fn pick_flat(void)
{
    switch (qcal_cpu_isa()) {
    case QCAL_ISA_AVX512: return qcal_f32_minmax__avx512;
    case QCAL_ISA_AVX2: return qcal_f32_minmax__avx2;
    case QCAL_ISA_C: break;
    }
    return qcal_f32_minmax__c;
}

static cols_fn pick_cols(void)
{
    switch (qcal_cpu_isa()) {
    case QCAL_ISA_AVX512: return qcal_f32_minmax_cols__avx512;
    case QCAL_ISA_AVX2: return qcal_f32_minmax_cols__avx2;
    case QCAL_ISA_C: break;
    }
    return qcal_f32_minmax_cols__c;
}

static int cap_threads(int nt)
{
    return nt > MAX_PARTS ? MAX_PARTS : nt;
}

void qcal_f32_minmax(const float *x, int64_t n, float *mn, float *mx, uint64_t *nonfinite)
{
    flat_fn f = pick_flat();
    int nt = cap_threads(qcal_threads_for(n));
    if (nt <= 1) {
        f(x, n, mn, mx, nonfinite);
        return;
    }
    float pl[MAX_PARTS], ph[MAX_PARTS];
    uint64_t pc[MAX_PARTS];
    /* Part p covers [p*n/nt, (p+1)*n/nt); partials are combined in part order. */
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1)
#endif
    for (int p = 0; p < nt; p++) {
        int64_t s = (int64_t)((__int128)n * p / nt), e = (int64_t)((__int128)n * (p + 1) / nt);
        f(x + s, e - s, &pl[p], &ph[p], &pc[p]);
    }
    float lo = INFINITY, hi = -INFINITY;
    uint64_t bad = 0;
    for (int p = 0; p < nt; p++) {
        lo = pl[p] < lo ? pl[p] : lo;
        hi = ph[p] > hi ? ph[p] : hi;
        bad += pc[p];
    }
    *mn = lo;
    *mx = hi;
    *nonfinite = bad;
}

/* Rows of `inner` contiguous elements: channel c owns rows (o, c) for every o. Every
 * channel folds its rows in ascending o with `l < lo ? l : lo` (ties keep the earlier row),
 * whatever the thread split, so results (even the sign of a zero) never depend on the
 * thread count:
 *   - outer >= threads: rows are walked in memory order (o, then c) so the hardware
 *     prefetchers see one stream; threads take contiguous ranges of o with per-thread
 *     partial arrays, combined in thread order (equal to the serial left fold);
 *   - outer < threads (e.g. a weight [C, K] on axis 0): channels are split between
 *     threads (contiguous in memory as well), or with very few channels each row is split. */
static bool channels_rows(const float *x, int64_t outer, int64_t channels, int64_t inner,
                          float *mn, float *mx, uint64_t *nonfinite)
{
    flat_fn f = pick_flat();
    int64_t n = outer * channels * inner;
    int nt = cap_threads(qcal_threads_for(n));
    if (nt > 1 && (outer < nt || channels > ((int64_t)1 << 20))) {
        if (channels < 2 * (int64_t)nt) {
            /* Few channels: parallelise inside each row instead. */
            uint64_t bad = 0;
            for (int64_t c = 0; c < channels; c++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int64_t o = 0; o < outer; o++) {
                    float l, h;
                    uint64_t b;
                    qcal_f32_minmax(x + (o * channels + c) * inner, inner, &l, &h, &b);
                    lo = l < lo ? l : lo;
                    hi = h > hi ? h : hi;
                    bad += b;
                }
                mn[c] = lo;
                mx[c] = hi;
            }
            *nonfinite = bad;
            return true;
        }
        uint64_t bad = 0;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
#endif
        for (int64_t c = 0; c < channels; c++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t o = 0; o < outer; o++) {
                float l, h;
                uint64_t b;
                f(x + (o * channels + c) * inner, inner, &l, &h, &b);
                lo = l < lo ? l : lo;
                hi = h > hi ? h : hi;
                bad += b;
            }
            mn[c] = lo;
            mx[c] = hi;
        }
        *nonfinite = bad;
        return true;
    }
    /* Memory order. One thread folds straight into mn/mx; several fold into per-thread
     * partial arrays (channels <= 2^20 here, so at most 8 MiB per thread). */
    if (nt == 1) {
        for (int64_t c = 0; c < channels; c++) {
            mn[c] = INFINITY;
            mx[c] = -INFINITY;
        }
        uint64_t bad = 0;
        for (int64_t o = 0; o < outer; o++) {
            const float *row = x + o * channels * inner;
            for (int64_t c = 0; c < channels; c++) {
                float l, h;
                uint64_t b;
                f(row + c * inner, inner, &l, &h, &b);
                mn[c] = l < mn[c] ? l : mn[c];
                mx[c] = h > mx[c] ? h : mx[c];
                bad += b;
            }
        }
        *nonfinite = bad;
        return true;
    }
    float *scratch = qcal_malloc((size_t)nt * (size_t)channels * 2 * sizeof(float));
    if (!scratch)
        return false;
    uint64_t pc[MAX_PARTS];
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
#endif
    for (int p = 0; p < nt; p++) {
        float *lo = scratch + (size_t)p * (size_t)channels * 2, *hi = lo + channels;
        for (int64_t c = 0; c < channels; c++) {
            lo[c] = INFINITY;
            hi[c] = -INFINITY;
        }
        uint64_t bad = 0;
        int64_t s = outer * p / nt, e = outer * (p + 1) / nt;
        for (int64_t o = s; o < e; o++) {
            const float *row = x + o * channels * inner;
            for (int64_t c = 0; c < channels; c++) {
                float l, h;
                uint64_t b;
                f(row + c * inner, inner, &l, &h, &b);
                lo[c] = l < lo[c] ? l : lo[c];
                hi[c] = h > hi[c] ? h : hi[c];
                bad += b;
            }
        }
        pc[p] = bad;
    }
    uint64_t bad = 0;
    for (int64_t c = 0; c < channels; c++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int p = 0; p < nt; p++) {
            const float *pl = scratch + (size_t)p * (size_t)channels * 2;
            lo = pl[c] < lo ? pl[c] : lo;
            hi = pl[channels + c] > hi ? pl[channels + c] : hi;
        }
        mn[c] = lo;
        mx[c] = hi;
    }
    for (int p = 0; p < nt; p++)
        bad += pc[p];
    *nonfinite = bad;
    free(scratch);
    return true;
}

/* Column path: x viewed as (outer, W = channels*inner); vertical min/max per column with
 * per-thread partial columns combined in thread order, then reduced over inner. */
static bool channels_cols(const float *x, int64_t outer, int64_t channels, int64_t inner,
                          float *mn, float *mx, uint64_t *nonfinite)
{
    cols_fn f = pick_cols();
    int64_t w = channels * inner, n = outer * w;
    int nt = cap_threads(qcal_threads_for(n));
    if (outer < nt)
        nt = (int)(outer < 1 ? 1 : outer);
    size_t per = (size_t)w * 2;
    float *scratch = qcal_malloc((size_t)nt * per * sizeof(float));
    if (!scratch)
        return false;
    uint64_t pc[MAX_PARTS];
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
#endif
    for (int p = 0; p < nt; p++) {
        float *cl = scratch + (size_t)p * per, *ch = cl + w;
        for (int64_t j = 0; j < w; j++) {
            cl[j] = INFINITY;
            ch[j] = -INFINITY;
        }
        int64_t s = outer * p / nt, e = outer * (p + 1) / nt;
        pc[p] = 0;
        f(x + s * w, e - s, w, cl, ch, &pc[p]);
    }
    uint64_t bad = 0;
    for (int64_t c = 0; c < channels; c++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int p = 0; p < nt; p++) {
            const float *cl = scratch + (size_t)p * per + c * inner, *ch = cl + w;
            for (int64_t i = 0; i < inner; i++) {
                lo = cl[i] < lo ? cl[i] : lo;
                hi = ch[i] > hi ? ch[i] : hi;
            }
        }
        mn[c] = lo;
        mx[c] = hi;
    }
    for (int p = 0; p < nt; p++)
        bad += pc[p];
    *nonfinite = bad;
    free(scratch);
    return true;
}

bool qcal_f32_minmax_channels(const float *x, int64_t outer, int64_t channels, int64_t inner,
                              float *mn, float *mx, uint64_t *nonfinite)
{
    if (channels <= 0 || outer <= 0 || inner <= 0) {
        for (int64_t c = 0; c < channels; c++) {
            mn[c] = INFINITY;
            mx[c] = -INFINITY;
        }
        *nonfinite = 0;
        return true;
    }
    /* Long contiguous rows, or too many columns for per-thread scratch: row path. */
    if (inner >= 64 || channels * inner > ((int64_t)1 << 22))
        return channels_rows(x, outer, channels, inner, mn, mx, nonfinite);
    return channels_cols(x, outer, channels, inner, mn, mx, nonfinite);
}
