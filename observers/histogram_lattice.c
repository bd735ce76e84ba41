/* The lattice histogram (see histogram_lattice.h): cells of width 2^e anchored at zero, e a
 * function of the data range, exact growth and merges, a canonical saved payload, and the
 * re-binned view the range searches run on. Binning kernels: C reference, AVX2, AVX-512. */
#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCAL_LAT_X86 1
#else
#define QCAL_LAT_X86 0
#endif

#include "core/cpu.h"
#include "observers/histogram_lattice.h"
#include "observers/minmax_kernels.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* Sub-histogram copies incremented round robin (a hot cell does not serialise on one
 * counter), with 16-bit counters so that 4 copies of a 2048-bin lattice's 4096 cells fit
 * the 32 KB L1 cache. Each copy takes every NCOPIES-th value, so flushing into the uint64
 * counts every FLUSH_ELEMS values (a multiple of the SIMD chunk) keeps each counter below
 * 2^16. */
#define NCOPIES QCAL_LATTICE_SUB_COPIES
#define FLUSH_ELEMS ((int64_t)(65535 * NCOPIES / 64) * 64)

/* ---- cell index ------------------------------------------------------------------------ */

/* floor(v * s) as int32, INT32_MIN when not representable (NaN, huge); a negative v whose
 * product underflowed to -0 is in cell -1. The SIMD kernels compute exactly this. */
static inline int32_t cell_raw(float v, float s)
{
    float m = v * s;
    float f = floorf(m);
    if (!(f >= -2147483648.0f && f < 2147483648.0f))
        return INT32_MIN;
    int32_t j = (int32_t)f;
    if (v < 0.0f && m == 0.0f)
        j = -1;
    return j;
}

/* The same index in double (exact: no underflow or overflow for float v and |e| <= 149). */
static inline int64_t cell_exact(float v, int32_t e)
{
    return (int64_t)floor(ldexp((double)v, -e));
}

static bool exponent_ok(float vmin, float vmax, int32_t e, int32_t cells)
{
    int64_t a = cell_exact(vmin, e), b = cell_exact(vmax, e);
    return a >= -QCAL_LATTICE_JLIM && b < QCAL_LATTICE_JLIM && b - a + 1 <= cells;
}

int32_t qcal_lattice_exponent(float vmin, float vmax, int32_t cells)
{
    float m = fmaxf(fabsf(vmin), fabsf(vmax));
    int32_t e = QCAL_LATTICE_EMIN;
    if (m > 0.0f) {
        /* Below ilogb(m) - 24 the index bound fails, so start a little under it. */
        int32_t s = ilogbf(m) - 25;
        if (s > e)
            e = s;
    }
    while (e < 149 && !exponent_ok(vmin, vmax, e, cells))
        e++;
    return e;
}

static inline float scale_of(int32_t e)
{
    return ldexpf(1.0f, -e);   /* 2^-e, a normal or subnormal float for e in [-127, 149] */
}

/* ---- state ----------------------------------------------------------------------------- */

qcal_status qcal_lattice_init(qcal_lattice *L, int32_t bins, bool absval)
{
    memset(L, 0, sizeof *L);
    L->cells = bins >= 1 ? 2 * bins : 2;
    L->absval = absval;
    L->counts = qcal_calloc((size_t)L->cells, sizeof *L->counts);
    if (!L->counts)
        return QCAL_ERR_NO_MEMORY;
    qcal_lattice_clear(L);
    return QCAL_OK;
}

void qcal_lattice_free(qcal_lattice *L)
{
    if (!L)
        return;
    free(L->counts);
    L->counts = NULL;
}

void qcal_lattice_clear(qcal_lattice *L)
{
    L->e = 0;
    L->jlo = 0;
    L->dmin = INFINITY;
    L->dmax = -INFINITY;
    L->total = 0;
    if (L->counts)
        memset(L->counts, 0, (size_t)L->cells * sizeof *L->counts);
}

static float vmin_of(bool absval, float dmin, float dmax)
{
    (void)dmax;
    return absval ? 0.0f : dmin;
}

static float vmax_of(bool absval, float dmin, float dmax)
{
    return absval ? fmaxf(-dmin, dmax) + 0.0f : dmax;
}

float qcal_lattice_vmin(const qcal_lattice *L)
{
    return vmin_of(L->absval, L->dmin, L->dmax);
}

float qcal_lattice_vmax(const qcal_lattice *L)
{
    return vmax_of(L->absval, L->dmin, L->dmax);
}

int64_t qcal_lattice_jmin(const qcal_lattice *L)
{
    return cell_exact(qcal_lattice_vmin(L), L->e);
}

int64_t qcal_lattice_jmax(const qcal_lattice *L)
{
    return cell_exact(qcal_lattice_vmax(L), L->e);
}

uint64_t qcal_lattice_count(const qcal_lattice *L, int64_t j)
{
    int64_t i = j - L->jlo;
    return (i >= 0 && i < L->cells) ? L->counts[i] : 0;
}

/* Window start for data in cells [jmin, jmax]: |x| lattices start at 0 (all spare cells
 * above); signed ones centre the data so growth on either side stays inside. */
static int64_t window_start(bool absval, int64_t jmin, int64_t jmax, int32_t cells)
{
    if (absval)
        return 0;
    int64_t spare = (int64_t)cells - (jmax - jmin + 1);
    int64_t jlo = jmin - spare / 2;
    if (jlo < -QCAL_LATTICE_JLIM)
        jlo = -QCAL_LATTICE_JLIM;
    if (jlo + cells > QCAL_LATTICE_JLIM)
        jlo = QCAL_LATTICE_JLIM - cells;
    return jlo;
}

static qcal_lattice_grid grid_of(const qcal_lattice *L)
{
    qcal_lattice_grid g;
    g.scale = scale_of(L->e);
    g.jlo = (int32_t)L->jlo;
    int64_t acc = QCAL_LATTICE_JLIM - L->jlo;
    g.accept = (int32_t)(acc < L->cells ? acc : L->cells);
    g.absval = L->absval;
    return g;
}

/* ---- kernels: C reference ---------------------------------------------------------------- */

static void flush_sub(qcal_lattice_sub *sub, int32_t accept, uint64_t *counts)
{
    size_t stride = (size_t)accept + 1;
    for (int32_t b = 0; b < accept; b++) {
        uint64_t s = 0;
        for (int c = 0; c < NCOPIES; c++) {
            s += sub[c * stride + (size_t)b];
            sub[c * stride + (size_t)b] = 0;
        }
        counts[b] += s;
    }
    for (int c = 0; c < NCOPIES; c++)
        sub[c * stride + (size_t)accept] = 0;
}

static inline uint32_t slot_of(float x, const qcal_lattice_grid *g)
{
    float v = g->absval ? fabsf(x) : x;
    uint32_t c = (uint32_t)cell_raw(v, g->scale) - (uint32_t)g->jlo;
    return c < (uint32_t)g->accept ? c : (uint32_t)g->accept;
}

void qcal_f32_lattice_bin__c(const float *x, int64_t n, const qcal_lattice_grid *g,
                             uint64_t *counts, qcal_lattice_sub *sub)
{
    size_t stride = (size_t)g->accept + 1;
    int64_t since = 0;
    for (int64_t i = 0; i < n; i++) {
        sub[(size_t)(i & (NCOPIES - 1)) * stride + slot_of(x[i], g)]++;
        if (++since == FLUSH_ELEMS) {
            flush_sub(sub, g->accept, counts);
            since = 0;
        }
    }
    flush_sub(sub, g->accept, counts);
}

static inline bool finite_f(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x7f800000u) != 0x7f800000u;
}

bool qcal_f32_lattice_bin_inside__c(const float *x, int64_t n, const qcal_lattice_grid *g,
                                    uint64_t *counts, qcal_lattice_sub *sub, float *mn, float *mx,
                                    uint64_t *nonfinite)
{
    float l = INFINITY, h = -INFINITY;
    uint64_t bad = 0;
    bool inside = true;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!finite_f(v)) {
            bad++;
            continue;
        }
        l = v < l ? v : l;
        h = v > h ? v : h;
        inside &= slot_of(v, g) < (uint32_t)g->accept;
    }
    *mn = l;
    *mx = h;
    *nonfinite = bad;
    if (inside)
        qcal_f32_lattice_bin__c(x, n, g, counts, sub);
    return inside;
}

/* ---- kernels: AVX2 / AVX-512 -------------------------------------------------------------
 * Software-pipelined as the first-batch kernels (histogram_kernels.c): the slots of chunk c
 * (CH values) are computed with vector ops into a ring of 4 buffers while the scalar loop
 * increments the counters of chunk c - 2. Fused kernels also track min / max / non-finite
 * and stop binning at the first block of CHECK chunks holding a finite value outside. */
#if QCAL_LAT_X86
#define CH 64
#define CHECK 64

#define T_AVX2 __attribute__((target("avx2,fma")))
#define T_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

static inline void scatter_chunk(const uint32_t *k, qcal_lattice_sub *s0,
                                 qcal_lattice_sub *s1, qcal_lattice_sub *s2,
                                 qcal_lattice_sub *s3)
{
    for (int j = 0; j < CH; j += 4) {
        s0[k[j]]++;
        s1[k[j + 1]]++;
        s2[k[j + 2]]++;
        s3[k[j + 3]]++;
    }
}

__attribute__((always_inline)) T_AVX512 static inline int64_t
lat_chunks_avx512(const float *x, int64_t nch, const qcal_lattice_grid *g, bool fused,
                  uint64_t *counts, qcal_lattice_sub *sub, float *mn, float *mx, uint64_t *bad,
                  bool *outside)
{
    const __m512 vs = _mm512_set1_ps(g->scale), zero = _mm512_setzero_ps();
    const __m512i vabs = _mm512_set1_epi32(g->absval ? 0x7fffffff : -1);
    const __m512i vjlo = _mm512_set1_epi32(g->jlo), vacc = _mm512_set1_epi32(g->accept);
    const __m512i one = _mm512_set1_epi32(1);
    __m512 vmn = _mm512_set1_ps(INFINITY), vmx = _mm512_set1_ps(-INFINITY);
    __mmask16 out = 0;
    uint64_t nbad = 0;
    size_t stride = (size_t)g->accept + 1;
    qcal_lattice_sub *s0 = sub, *s1 = sub + stride, *s2 = sub + 2 * stride,
                     *s3 = sub + 3 * stride;
    uint32_t k[4 * CH] __attribute__((aligned(64)));
    int64_t since = 0, c = 0, done = nch;
    for (c = 0; c < nch + 2; c++) {
        if (c < nch) {
            const float *p = x + c * CH;
            uint32_t *kb = k + (c & 3) * CH;
            for (int j = 0; j < CH; j += 16) {
                __m512 raw = _mm512_loadu_ps(p + j);
                __m512 v = _mm512_castsi512_ps(
                    _mm512_and_si512(_mm512_castps_si512(raw), vabs));
                __m512 m = _mm512_mul_ps(v, vs);
                __m512 f = _mm512_roundscale_ps(m, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
                __m512i ji = _mm512_cvttps_epi32(f);
                __mmask16 uf = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ),
                                                       m, zero, _CMP_EQ_OQ);
                ji = _mm512_mask_sub_epi32(ji, uf, ji, one);
                __m512i slot = _mm512_sub_epi32(ji, vjlo);
                __mmask16 in = _mm512_cmplt_epu32_mask(slot, vacc);
                slot = _mm512_mask_blend_epi32(in, vacc, slot);
                if (fused) {
                    /* fpclass 0x99: QNaN, +Inf, -Inf, SNaN. */
                    __mmask16 fin = (__mmask16)~_mm512_fpclass_ps_mask(raw, 0x99);
                    vmn = _mm512_mask_min_ps(vmn, fin, vmn, raw);
                    vmx = _mm512_mask_max_ps(vmx, fin, vmx, raw);
                    nbad += (uint64_t)__builtin_popcount(0xffffu & ~(unsigned)fin);
                    out |= (__mmask16)(fin & ~in);
                }
                _mm512_store_si512((void *)(kb + j), slot);
            }
        }
        if (c >= 2)
            scatter_chunk(k + ((c - 2) & 3) * CH, s0, s1, s2, s3);
        since += CH;
        if (since >= FLUSH_ELEMS) {
            flush_sub(sub, g->accept, counts);
            since = 0;
        }
        if (fused && out && c < nch && (c % CHECK == CHECK - 1 || c == nch - 1)) {
            done = c + 1;
            break;
        }
    }
    flush_sub(sub, g->accept, counts);
    if (fused) {
        *mn = _mm512_reduce_min_ps(vmn);
        *mx = _mm512_reduce_max_ps(vmx);
        *bad = nbad;
        *outside = out != 0;
    }
    return done;
}

__attribute__((always_inline)) T_AVX2 static inline int64_t
lat_chunks_avx2(const float *x, int64_t nch, const qcal_lattice_grid *g, bool fused,
                uint64_t *counts, qcal_lattice_sub *sub, float *mn, float *mx, uint64_t *bad,
                bool *outside)
{
    const __m256 vs = _mm256_set1_ps(g->scale), zero = _mm256_setzero_ps();
    const __m256 vabs = _mm256_castsi256_ps(_mm256_set1_epi32(g->absval ? 0x7fffffff : -1));
    const __m256i vjlo = _mm256_set1_epi32(g->jlo), vacc = _mm256_set1_epi32(g->accept);
    const __m256i vexp = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(INT32_MIN);
    const __m256i vaccb = _mm256_xor_si256(vacc, bias);
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmn = pinf, vmx = ninf;
    __m256i out = _mm256_setzero_si256();
    uint64_t nbad = 0;
    size_t stride = (size_t)g->accept + 1;
    qcal_lattice_sub *s0 = sub, *s1 = sub + stride, *s2 = sub + 2 * stride,
                     *s3 = sub + 3 * stride;
    uint32_t k[4 * CH] __attribute__((aligned(32)));
    int64_t since = 0, c = 0, done = nch;
    for (c = 0; c < nch + 2; c++) {
        if (c < nch) {
            const float *p = x + c * CH;
            uint32_t *kb = k + (c & 3) * CH;
            for (int j = 0; j < CH; j += 8) {
                __m256 raw = _mm256_loadu_ps(p + j);
                __m256 v = _mm256_and_ps(raw, vabs);
                __m256 m = _mm256_mul_ps(v, vs);
                __m256i ji = _mm256_cvttps_epi32(_mm256_floor_ps(m));
                __m256 uf = _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ),
                                          _mm256_cmp_ps(m, zero, _CMP_EQ_OQ));
                ji = _mm256_add_epi32(ji, _mm256_castps_si256(uf));   /* -1 where uf */
                __m256i slot = _mm256_sub_epi32(ji, vjlo);
                /* unsigned slot < accept via signed compare of biased values */
                __m256i in = _mm256_cmpgt_epi32(vaccb, _mm256_xor_si256(slot, bias));
                slot = _mm256_blendv_epi8(vacc, slot, in);
                if (fused) {
                    __m256i ex = _mm256_and_si256(_mm256_castps_si256(raw), vexp);
                    __m256i nonfin = _mm256_cmpeq_epi32(ex, vexp);
                    __m256 nf = _mm256_castsi256_ps(nonfin);
                    vmn = _mm256_min_ps(vmn, _mm256_blendv_ps(raw, pinf, nf));
                    vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(raw, ninf, nf));
                    nbad += (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_ps(nf));
                    out = _mm256_or_si256(out, _mm256_andnot_si256(_mm256_or_si256(in, nonfin),
                                                                   vexp));
                }
                _mm256_store_si256((__m256i *)(kb + j), slot);
            }
        }
        if (c >= 2)
            scatter_chunk(k + ((c - 2) & 3) * CH, s0, s1, s2, s3);
        since += CH;
        if (since >= FLUSH_ELEMS) {
            flush_sub(sub, g->accept, counts);
            since = 0;
        }
        if (fused && c < nch && (c % CHECK == CHECK - 1 || c == nch - 1) &&
            !_mm256_testz_si256(out, out)) {
            done = c + 1;
            break;
        }
    }
    flush_sub(sub, g->accept, counts);
    if (fused) {
        float l[8], h[8];
        _mm256_storeu_ps(l, vmn);
        _mm256_storeu_ps(h, vmx);
        float a = l[0], b = h[0];
        for (int i = 1; i < 8; i++) {
            a = l[i] < a ? l[i] : a;
            b = h[i] > b ? h[i] : b;
        }
        *mn = a;
        *mx = b;
        *bad = nbad;
        *outside = !_mm256_testz_si256(out, out);
    }
    return done;
}

T_AVX2 void qcal_f32_lattice_bin__avx2(const float *x, int64_t n, const qcal_lattice_grid *g,
                                       uint64_t *counts, qcal_lattice_sub *sub)
{
    int64_t nch = n / CH;
    lat_chunks_avx2(x, nch, g, false, counts, sub, NULL, NULL, NULL, NULL);
    if (nch * CH < n)
        qcal_f32_lattice_bin__c(x + nch * CH, n - nch * CH, g, counts, sub);
}

T_AVX512 void qcal_f32_lattice_bin__avx512(const float *x, int64_t n,
                                           const qcal_lattice_grid *g, uint64_t *counts,
                                           qcal_lattice_sub *sub)
{
    int64_t nch = n / CH;
    lat_chunks_avx512(x, nch, g, false, counts, sub, NULL, NULL, NULL, NULL);
    if (nch * CH < n)
        qcal_f32_lattice_bin__c(x + nch * CH, n - nch * CH, g, counts, sub);
}

typedef void (*minmax_fn)(const float *, int64_t, float *, float *, uint64_t *);

static bool inside_finish(const float *x, int64_t n, int64_t nch, int64_t done, bool outside,
                          const qcal_lattice_grid *g, uint64_t *counts, qcal_lattice_sub *sub,
                          float *mn, float *mx, uint64_t *nonfinite, minmax_fn mm)
{
    float l = *mn, h = *mx, tl, th;
    uint64_t bad = *nonfinite, tb;
    bool inside = !outside;
    if (done < nch) {
        mm(x + done * CH, n - done * CH, &tl, &th, &tb);
    } else if (nch * CH < n) {
        inside &= qcal_f32_lattice_bin_inside__c(x + nch * CH, n - nch * CH, g, counts, sub,
                                                 &tl, &th, &tb);
    } else {
        tl = INFINITY, th = -INFINITY, tb = 0;
    }
    *mn = tl < l ? tl : l;
    *mx = th > h ? th : h;
    *nonfinite = bad + tb;
    return inside;
}

T_AVX2 bool qcal_f32_lattice_bin_inside__avx2(const float *x, int64_t n,
                                              const qcal_lattice_grid *g, uint64_t *counts,
                                              qcal_lattice_sub *sub, float *mn, float *mx,
                                              uint64_t *nonfinite)
{
    int64_t nch = n / CH;
    bool outside = false;
    *mn = INFINITY, *mx = -INFINITY, *nonfinite = 0;
    int64_t done = nch ? lat_chunks_avx2(x, nch, g, true, counts, sub, mn, mx, nonfinite,
                                         &outside)
                       : 0;
    return inside_finish(x, n, nch, done, outside, g, counts, sub, mn, mx, nonfinite,
                         qcal_f32_minmax__avx2);
}

T_AVX512 bool qcal_f32_lattice_bin_inside__avx512(const float *x, int64_t n,
                                                  const qcal_lattice_grid *g,
                                                  uint64_t *counts, qcal_lattice_sub *sub, float *mn,
                                                  float *mx, uint64_t *nonfinite)
{
    int64_t nch = n / CH;
    bool outside = false;
    *mn = INFINITY, *mx = -INFINITY, *nonfinite = 0;
    int64_t done = nch ? lat_chunks_avx512(x, nch, g, true, counts, sub, mn, mx, nonfinite,
                                           &outside)
                       : 0;
    return inside_finish(x, n, nch, done, outside, g, counts, sub, mn, mx, nonfinite,
                         qcal_f32_minmax__avx512);
}
#else
void qcal_f32_lattice_bin__avx2(const float *x, int64_t n, const qcal_lattice_grid *g,
                                uint64_t *counts, qcal_lattice_sub *sub)
{
    qcal_f32_lattice_bin__c(x, n, g, counts, sub);
}
void qcal_f32_lattice_bin__avx512(const float *x, int64_t n, const qcal_lattice_grid *g,
                                  uint64_t *counts, qcal_lattice_sub *sub)
{
    qcal_f32_lattice_bin__c(x, n, g, counts, sub);
}
bool qcal_f32_lattice_bin_inside__avx2(const float *x, int64_t n, const qcal_lattice_grid *g,
                                       uint64_t *counts, qcal_lattice_sub *sub, float *mn, float *mx,
                                       uint64_t *nonfinite)
{
    return qcal_f32_lattice_bin_inside__c(x, n, g, counts, sub, mn, mx, nonfinite);
}
bool qcal_f32_lattice_bin_inside__avx512(const float *x, int64_t n,
                                         const qcal_lattice_grid *g, uint64_t *counts,
                                         qcal_lattice_sub *sub, float *mn, float *mx,
                                         uint64_t *nonfinite)
{
    return qcal_f32_lattice_bin_inside__c(x, n, g, counts, sub, mn, mx, nonfinite);
}
#endif

typedef void (*bin_fn)(const float *, int64_t, const qcal_lattice_grid *, uint64_t *,
                       qcal_lattice_sub *);
typedef bool (*inside_fn)(const float *, int64_t, const qcal_lattice_grid *, uint64_t *,
                          qcal_lattice_sub *, float *, float *, uint64_t *);

static bin_fn bin_kernel(void)
{
    switch (qcal_cpu_isa()) {
    case QCAL_ISA_AVX512: return qcal_f32_lattice_bin__avx512;
    case QCAL_ISA_AVX2: return qcal_f32_lattice_bin__avx2;
    case QCAL_ISA_C: break;
    }
    return qcal_f32_lattice_bin__c;
}

static inside_fn inside_kernel(void)
{
    switch (qcal_cpu_isa()) {
    case QCAL_ISA_AVX512: return qcal_f32_lattice_bin_inside__avx512;
    case QCAL_ISA_AVX2: return qcal_f32_lattice_bin_inside__avx2;
    case QCAL_ISA_C: break;
    }
    return qcal_f32_lattice_bin_inside__c;
}

/* Per-thread scratch, in uint64 words: partial counts (accept), then NCOPIES sub-histogram
 * copies of accept + 1 counters. */
static size_t scratch_words(int32_t accept)
{
    size_t sub = (size_t)NCOPIES * ((size_t)accept + 1) * sizeof(qcal_lattice_sub);
    return (size_t)accept + (sub + 7) / 8;
}

static inline int64_t part_start(int64_t n, int t, int threads)
{
    return (int64_t)((__int128)n * t / threads);
}

/* Batches of at most SMALL_BATCH values go straight into the counts (one thread, no
 * scratch): for a 64-value call the scratch's calloc and the sum over the window cost ~20x
 * the binning. Same cells, min / max and non-finite count as the kernels (slot_of, the
 * reference loop). */
#define SMALL_BATCH 1024

static void lattice_bin_small(const float *x, int64_t n, const qcal_lattice_grid *g,
                              bool fused, bool reject_nonfinite, uint64_t *counts, float *mn,
                              float *mx, uint64_t *nonfinite, bool *binned)
{
    if (fused) {
        float l = INFINITY, h = -INFINITY;
        uint64_t bad = 0;
        bool inside = true;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (!finite_f(v)) {
                bad++;
                continue;
            }
            l = v < l ? v : l;
            h = v > h ? v : h;
            inside &= slot_of(v, g) < (uint32_t)g->accept;
        }
        *mn = l;
        *mx = h;
        *nonfinite = bad;
        if (reject_nonfinite && bad > 0)
            inside = false;
        *binned = inside;
        if (!inside)
            return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t s = slot_of(x[i], g);
        if (s < (uint32_t)g->accept)
            counts[s]++;
    }
}

/* Bins x into counts[0..accept) (all threads; integer partials added in order). With
 * fused, only if every finite value is inside (*binned), min / max / non-finite always. */
static qcal_status lattice_bin(const float *x, int64_t n, const qcal_lattice_grid *g,
                               bool fused, bool reject_nonfinite, uint64_t *counts,
                               float *mn, float *mx, uint64_t *nonfinite, bool *binned)
{
    enum { MAXT = 64 };
    int threads = qcal_threads_for(n);
    if (threads > MAXT)
        threads = MAXT;
    if (threads == 1 && n <= SMALL_BATCH) {
        lattice_bin_small(x, n, g, fused, reject_nonfinite, counts, mn, mx, nonfinite, binned);
        return QCAL_OK;
    }
    size_t per = scratch_words(g->accept), total;
    if (!qcal_mul_size(per, (size_t)threads, &total))
        return qcal_error(QCAL_ERR_OVERFLOW, "lattice scratch overflows");
    uint64_t *scratch = qcal_calloc(total, sizeof(uint64_t));
    if (!scratch)
        return QCAL_ERR_NO_MEMORY;
    bin_fn bf = bin_kernel();
    inside_fn inf = inside_kernel();
    float pl[MAXT], ph[MAXT];
    uint64_t pb[MAXT];
    bool pin[MAXT];
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        int64_t s = part_start(n, t, threads), e = part_start(n, t + 1, threads);
        uint64_t *part = scratch + (size_t)t * per;
        qcal_lattice_sub *sub = (qcal_lattice_sub *)(part + g->accept);
        if (fused) {
            pin[t] = inf(x + s, e - s, g, part, sub, &pl[t], &ph[t], &pb[t]);
        } else {
            bf(x + s, e - s, g, part, sub);
            pin[t] = true;
        }
    }
    bool inside = true;
    if (fused) {
        float l = INFINITY, h = -INFINITY;
        uint64_t bad = 0;
        for (int t = 0; t < threads; t++) {
            l = pl[t] < l ? pl[t] : l;
            h = ph[t] > h ? ph[t] : h;
            bad += pb[t];
            inside &= pin[t];
        }
        if (reject_nonfinite && bad > 0)
            inside = false;
        *mn = l;
        *mx = h;
        *nonfinite = bad;
        *binned = inside;
    }
    if (inside) {
        for (int t = 0; t < threads; t++) {
            const uint64_t *part = scratch + (size_t)t * per;
            for (int32_t b = 0; b < g->accept; b++)
                counts[b] += part[b];
        }
    }
    free(scratch);
    return QCAL_OK;
}

/* ---- growth, update, merge ------------------------------------------------------------- */

/* A new window of counts for exponent e and data cells [jmin, jmax], holding L's counts
 * (shifted down by e - L->e doublings) and, if src, src's likewise. */
static qcal_status regrid(const qcal_lattice *L, const qcal_lattice *src, int32_t e,
                          int64_t jmin, int64_t jmax, uint64_t **out, int64_t *jlo_out)
{
    uint64_t *nc = qcal_calloc((size_t)L->cells, sizeof *nc);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    int64_t jlo = window_start(L->absval, jmin, jmax, L->cells);
    const qcal_lattice *parts[2] = { L, src };
    for (int p = 0; p < 2; p++) {
        const qcal_lattice *s = parts[p];
        if (!s || s->total == 0)
            continue;
        int k = e - s->e;
        for (int32_t i = 0; i < s->cells; i++) {
            if (!s->counts[i])
                continue;
            int64_t j = (s->jlo + i) >> k;   /* floor division by 2^k */
            nc[j - jlo] += s->counts[i];
        }
    }
    *out = nc;
    *jlo_out = jlo;
    return QCAL_OK;
}

qcal_status qcal_lattice_update(qcal_lattice *L, const float *x, int64_t n,
                                qcal_nonfinite_policy policy, uint64_t *nonfinite)
{
    float mn, mx;
    uint64_t nf = 0;
    qcal_status st;
    if (L->total > 0) {
        bool binned = false;
        qcal_lattice_grid g = grid_of(L);
        st = lattice_bin(x, n, &g, true, policy == QCAL_NONFINITE_ERROR, L->counts, &mn, &mx,
                         &nf, &binned);
        if (st != QCAL_OK)
            return st;
        if (binned) {
            *nonfinite = nf;
            if (nf < (uint64_t)n) {
                L->dmin = fminf(L->dmin, mn) + 0.0f;
                L->dmax = fmaxf(L->dmax, mx) + 0.0f;
                L->total += (uint64_t)n - nf;
            }
            return QCAL_OK;
        }
    } else {
        qcal_f32_minmax(x, n, &mn, &mx, &nf);
    }
    *nonfinite = nf;
    if (nf > 0 && policy == QCAL_NONFINITE_ERROR)
        return qcal_error(QCAL_ERR_NONFINITE,
                          "batch of %lld values holds %llu NaN/Inf (non-finite policy: error)",
                          (long long)n, (unsigned long long)nf);
    uint64_t finite = (uint64_t)n - nf;
    if (finite == 0)
        return QCAL_OK;
    float dmin = fminf(L->dmin, mn) + 0.0f, dmax = fmaxf(L->dmax, mx) + 0.0f;
    float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
    int32_t e = qcal_lattice_exponent(vmin, vmax, L->cells);
    int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
    uint64_t *nc = NULL;
    int64_t jlo = L->jlo;
    if (L->total == 0 || e != L->e || jmin < L->jlo || jmax >= L->jlo + L->cells) {
        st = regrid(L, NULL, e, jmin, jmax, &nc, &jlo);
        if (st != QCAL_OK)
            return st;
    }
    qcal_lattice_grid g = grid_of(L);
    g.scale = scale_of(e);
    g.jlo = (int32_t)jlo;
    int64_t acc = QCAL_LATTICE_JLIM - jlo;
    g.accept = (int32_t)(acc < L->cells ? acc : L->cells);
    st = lattice_bin(x, n, &g, false, false, nc ? nc : L->counts, NULL, NULL, NULL, NULL);
    if (st != QCAL_OK) {
        free(nc);
        return st;
    }
    if (nc) {
        free(L->counts);
        L->counts = nc;
    }
    L->e = e;
    L->jlo = jlo;
    L->dmin = dmin;
    L->dmax = dmax;
    L->total += finite;
    return QCAL_OK;
}

qcal_status qcal_lattice_merge(qcal_lattice *dst, const qcal_lattice *src)
{
    if (src->total == 0)
        return QCAL_OK;
    float dmin = fminf(dst->dmin, src->dmin) + 0.0f, dmax = fmaxf(dst->dmax, src->dmax) + 0.0f;
    float vmin = vmin_of(dst->absval, dmin, dmax), vmax = vmax_of(dst->absval, dmin, dmax);
    int32_t e = qcal_lattice_exponent(vmin, vmax, dst->cells);
    int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
    uint64_t *nc = NULL;
    int64_t jlo;
    qcal_status st = regrid(dst, src, e, jmin, jmax, &nc, &jlo);
    if (st != QCAL_OK)
        return st;
    free(dst->counts);
    dst->counts = nc;
    dst->e = e;
    dst->jlo = jlo;
    dst->dmin = dmin;
    dst->dmax = dmax;
    dst->total += src->total;
    return QCAL_OK;
}

/* ---- canonical payload -------------------------------------------------------------------- */

void qcal_lattice_save(const qcal_lattice *L, qcal_buf *b)
{
    if (L->total == 0) {
        qcal_buf_u32(b, 0u);
        qcal_buf_u64(b, 0u);
        qcal_buf_u32(b, 0u);
        qcal_buf_f32(b, INFINITY);
        qcal_buf_f32(b, -INFINITY);
        qcal_buf_u64(b, 0u);
        return;
    }
    int64_t jmin = qcal_lattice_jmin(L), jmax = qcal_lattice_jmax(L);
    qcal_buf_u32(b, (uint32_t)L->e);
    qcal_buf_u64(b, (uint64_t)jmin);
    qcal_buf_u32(b, (uint32_t)(jmax - jmin + 1));
    qcal_buf_f32(b, L->dmin);
    qcal_buf_f32(b, L->dmax);
    qcal_buf_u64(b, L->total);
    for (int64_t j = jmin; j <= jmax; j++)
        qcal_buf_u64(b, L->counts[j - L->jlo]);
}

qcal_status qcal_lattice_load(qcal_lattice *L, qcal_cursor *c)
{
    uint32_t eu, nu;
    uint64_t jmin_u, total;
    float dmin, dmax;
    if (!qcal_cur_u32(c, &eu) || !qcal_cur_u64(c, &jmin_u) || !qcal_cur_u32(c, &nu) ||
        !qcal_cur_f32(c, &dmin) || !qcal_cur_f32(c, &dmax) || !qcal_cur_u64(c, &total))
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state is truncated");
    int32_t e = (int32_t)eu;
    int64_t jmin = (int64_t)jmin_u;
    if (total == 0) {
        if (e != 0 || jmin != 0 || nu != 0 || dmin != INFINITY || dmax != -INFINITY)
            return qcal_error(QCAL_ERR_FORMAT, "empty lattice histogram state is not canonical");
        qcal_lattice_clear(L);
        return QCAL_OK;
    }
    if (!(isfinite(dmin) && isfinite(dmax) && dmin <= dmax) || (signbit(dmin) && dmin == 0.0f) ||
        (signbit(dmax) && dmax == 0.0f))
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state has data range [%g, %g]",
                          (double)dmin, (double)dmax);
    float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
    int32_t want_e = qcal_lattice_exponent(vmin, vmax, L->cells);
    int64_t wmin = cell_exact(vmin, want_e), wmax = cell_exact(vmax, want_e);
    if (e != want_e || jmin != wmin || (int64_t)nu != wmax - wmin + 1)
        return qcal_error(QCAL_ERR_FORMAT,
                          "lattice histogram state has cell width 2^%d, cells %lld + %u; its "
                          "data range [%g, %g] gives 2^%d, cells %lld + %lld",
                          (int)e, (long long)jmin, (unsigned)nu, (double)dmin, (double)dmax,
                          (int)want_e, (long long)wmin, (long long)(wmax - wmin + 1));
    if (c->left / 8 < nu)
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state is truncated in its %u counts",
                          (unsigned)nu);
    uint64_t *nc = qcal_calloc((size_t)L->cells, sizeof *nc);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    int64_t jlo = window_start(L->absval, wmin, wmax, L->cells);
    uint64_t sum = 0;
    bool overflow = false;
    for (uint32_t i = 0; i < nu; i++) {
        uint64_t v;
        qcal_cur_u64(c, &v);
        nc[wmin + i - jlo] = v;
        overflow |= __builtin_add_overflow(sum, v, &sum);
    }
    qcal_status st = QCAL_OK;
    if (overflow || sum != total)
        st = qcal_error(QCAL_ERR_FORMAT, "lattice histogram counts sum to %llu, state says %llu",
                        (unsigned long long)sum, (unsigned long long)total);
    else if (nc[wmax - jlo] == 0 || (!L->absval && nc[wmin - jlo] == 0))
        st = qcal_error(QCAL_ERR_FORMAT,
                        "lattice histogram state has no count in the cell of its min or max");
    if (st != QCAL_OK) {
        free(nc);
        return st;
    }
    free(L->counts);
    L->counts = nc;
    L->e = e;
    L->jlo = jlo;
    L->dmin = dmin;
    L->dmax = dmax;
    L->total = total;
    return QCAL_OK;
}

/* ---- view ---------------------------------------------------------------------------------- */

void qcal_lattice_view(const qcal_lattice *L, double lo, double hi, int32_t bins,
                       uint64_t *out)
{
    memset(out, 0, (size_t)bins * sizeof *out);
    if (L->total == 0)
        return;
    const double vmin = qcal_lattice_vmin(L), vmax = qcal_lattice_vmax(L);
    const double W = ldexp(1.0, L->e), w = (hi - lo) / bins;
    const int64_t jmin = qcal_lattice_jmin(L), jmax = qcal_lattice_jmax(L);
    int64_t j = jmin;
    uint64_t below = 0, prev = 0;
    for (int32_t k = 1; k <= bins; k++) {
        uint64_t cum;
        double edge = lo + w * k;
        if (k == bins) {
            cum = L->total;
        } else {
            /* Skip the cells whose clipped part lies at or below the edge. */
            while (j <= jmax && fmin((double)(j + 1) * W, vmax) <= edge) {
                below += qcal_lattice_count(L, j);
                j++;
            }
            if (j > jmax) {
                cum = L->total;
            } else {
                double clo = fmax((double)j * W, vmin), chi = fmin((double)(j + 1) * W, vmax);
                uint64_t cnt = qcal_lattice_count(L, j);
                double f = (double)below;
                if (edge > clo && chi > clo)
                    f += (double)cnt * ((edge - clo) / (chi - clo));
                cum = (uint64_t)floor(f + 0.5);
                if (cum < below)
                    cum = below;
                if (cum > below + cnt)
                    cum = below + cnt;
            }
        }
        if (cum < prev)
            cum = prev;
        out[k - 1] = cum - prev;
        prev = cum;
    }
}
