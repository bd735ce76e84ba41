/* Histogram kernel family (kernel layer, core/dsp.h): binning float32 values into counts,
 * for the two grids of the histogram observers (histogram, percentile, entropy, mse).
 *
 *   histc / histc_inside             the first-batch grid: `bins` equal bins over [lo, hi]
 *   lattice_bin / lattice_bin_until  the lattice: cells of width 2^e anchored at zero
 *
 * Every kernel counts into per-copy 16-bit sub-histograms (QCAL_HIST_SUB_COPIES copies,
 * incremented round robin so that a hot bin does not serialise on one counter) and flushes
 * them into the caller's uint64 counts; results are exact integers, so every ISA gives the C
 * reference's counts. histc_inside also takes the min / max / non-finite count of x in the
 * same pass (as qcal_f32_minmax) and bins only if every finite value falls in the grid: it
 * returns false, with partial counts, as soon as one does not (callers pass scratch); min /
 * max / non-finite always cover all of x. lattice_bin_until bins, with the same min / max /
 * non-finite, the chunks before the first one that holds a value outside the window and
 * says where it stopped, so that the caller can grow the lattice and go on from there
 * without reading the binned values again. Threaded driver: histogram_bin.h;
 * the lattice's single-pass update drives the kernels itself (histogram_lattice.c). */
#ifndef QCAL_OBSERVERS_HISTOGRAM_DSP_H
#define QCAL_OBSERVERS_HISTOGRAM_DSP_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/dsp.h"
#include "qcal/common.h"

/* Sub-histogram counter; each copy takes every QCAL_HIST_SUB_COPIES-th value, so flushing
 * every QCAL_HIST_FLUSH_ELEMS values (a multiple of the SIMD chunk of 64) keeps it < 2^16.
 * Four copies of a 2048-bin lattice's 4096 cells are 32 KB: the L1 cache. */
typedef uint16_t qcal_hist_sub;
#define QCAL_HIST_SUB_COPIES 4
#define QCAL_HIST_FLUSH_ELEMS ((int64_t)(65535 * QCAL_HIST_SUB_COPIES / 64) * 64)

/* First-batch grid: v (x, or |x| if absval) in [lo, hi] goes to bin
 *   i = (int64)((v - lo) / (hi - lo) * (float)bins)   (float32 ops, truncation),
 * ATen 1.13's histc CPU kernel with float edges; i == bins means "on the top edge". When
 * hi - lo overflows float the same formula runs in double. lo < hi, both finite. */
typedef struct qcal_histc_grid {
    float lo, hi;
    int32_t bins;
    bool absval;
} qcal_histc_grid;

/* True when the float formula applies (hi - lo finite and positive). */
static inline bool qcal_histc_float_ok(float lo, float hi)
{
    float r = hi - lo;
    return isfinite(r) && r > 0.0f;
}

/* Raw index of v in [lo, hi]: 0..bins (bins = top edge). fast = qcal_histc_float_ok. */
static inline int32_t qcal_histc_index(float v, float lo, float hi, int32_t bins, bool fast)
{
    if (fast)
        return (int32_t)(int64_t)((v - lo) / (hi - lo) * (float)bins);
    double t = ((double)v - (double)lo) / ((double)hi - (double)lo) * (double)bins;
    int64_t i = (int64_t)t;
    if (i < 0)
        i = 0;
    return i > bins ? bins : (int32_t)i;
}

/* Slot of one value on a first-batch grid: its bin, bins (top edge) or bins + 1 (outside,
 * NaN). fast = qcal_histc_float_ok(lo, hi). */
static inline int32_t qcal_histc_slot(float x, float lo, float hi, int32_t bins, bool absval,
                                      bool fast)
{
    float v = absval ? fabsf(x) : x;
    /* NaN fails both comparisons, as in ATen's `!(elt >= left && elt <= right)`. */
    if (v >= lo && v <= hi)
        return qcal_histc_index(v, lo, hi, bins, fast);
    return bins + 1;
}

/* Adds the first-batch histogram of x[0..n) into counts[0..bins]: counts[b] for b < bins,
 * counts[bins] the values exactly on the top edge hi (the caller folds them into the last
 * bin). Values outside [lo, hi] and NaN are not counted. sub: scratch of
 * QCAL_HIST_SUB_COPIES * (bins + 2) counters, zero on entry and on return. */
typedef void (*qcal_f32_histc_fn)(const float *x, int64_t n, const qcal_histc_grid *g,
                                  uint64_t *counts, qcal_hist_sub *sub);
typedef bool (*qcal_f32_histc_inside_fn)(const float *x, int64_t n, const qcal_histc_grid *g,
                                         uint64_t *counts, qcal_hist_sub *sub, float *mn,
                                         float *mx, uint64_t *nonfinite);

/* Lattice coordinates of one binning call: v -> cell floor(v * scale) - jlo (float32
 * product, exact for a power-of-two scale; a negative v whose product underflows to -0 is in
 * cell -1, its exact floor), counted when in [0, accept), else dropped (NaN, out of window). */
typedef struct qcal_lattice_grid {
    float scale;        /* 2^-e */
    int32_t jlo;
    int32_t accept;
    bool absval;
} qcal_lattice_grid;

/* floor(v * s) as int32, INT32_MIN when not representable (NaN, huge); a negative v whose
 * product underflowed to -0 is in cell -1. The SIMD kernels compute exactly this. */
static inline int32_t qcal_lattice_cell(float v, float s)
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

/* Slot of one value on a lattice window: its cell - jlo, or accept (outside, NaN). */
static inline uint32_t qcal_lattice_slot(float x, const qcal_lattice_grid *g)
{
    float v = g->absval ? fabsf(x) : x;
    uint32_t c = (uint32_t)qcal_lattice_cell(v, g->scale) - (uint32_t)g->jlo;
    return c < (uint32_t)g->accept ? c : (uint32_t)g->accept;
}

/* A float is NaN or +-Inf exactly when its exponent bits are all ones. */
static inline bool qcal_f32_finite(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & 0x7f800000u) != 0x7f800000u;
}

/* Adds the cell counts of x[0..n) into counts[0..accept). sub: scratch of
 * QCAL_HIST_SUB_COPIES * (accept + 1) counters, zero on entry and on return. */
typedef void (*qcal_f32_lattice_bin_fn)(const float *x, int64_t n, const qcal_lattice_grid *g,
                                        uint64_t *counts, qcal_hist_sub *sub);
/* Bins x chunk by chunk (QCAL_HIST_CH values; the last one may be shorter) up to the first
 * chunk that holds a finite value outside the window (cell - jlo not in [0, accept)), and
 * returns the number of values binned: n, or the start of that chunk (a multiple of
 * QCAL_HIST_CH). counts, *mn / *mx (min / max of the finite values; +inf / -inf when none)
 * and *nonfinite describe exactly x[0..returned): the chunk it stopped at is left whole to
 * the next call. sub as for lattice_bin. */
typedef int64_t (*qcal_f32_lattice_bin_until_fn)(const float *x, int64_t n,
                                                 const qcal_lattice_grid *g, uint64_t *counts,
                                                 qcal_hist_sub *sub, float *mn, float *mx,
                                                 uint64_t *nonfinite);

typedef struct qcal_histogram_dsp {
    qcal_f32_histc_fn histc;
    qcal_f32_histc_inside_fn histc_inside;
    qcal_f32_lattice_bin_fn lattice_bin;
    qcal_f32_lattice_bin_until_fn lattice_bin_until;
} qcal_histogram_dsp;

void qcal_histogram_dsp_init(qcal_histogram_dsp *dsp, qcal_isa isa);
void qcal_histogram_dsp_init_avx2(qcal_histogram_dsp *dsp);
void qcal_histogram_dsp_init_avx512(qcal_histogram_dsp *dsp);
const qcal_histogram_dsp *qcal_histogram_dsp_get(void);

#define QCAL_HIST_DECLARE(isa)                                                             \
    void qcal_f32_histc__##isa(const float *x, int64_t n, const qcal_histc_grid *g,        \
                               uint64_t *counts, qcal_hist_sub *sub);                      \
    bool qcal_f32_histc_inside__##isa(const float *x, int64_t n, const qcal_histc_grid *g, \
                                      uint64_t *counts, qcal_hist_sub *sub, float *mn,     \
                                      float *mx, uint64_t *nonfinite);                     \
    void qcal_f32_lattice_bin__##isa(const float *x, int64_t n, const qcal_lattice_grid *g,\
                                     uint64_t *counts, qcal_hist_sub *sub);                \
    int64_t qcal_f32_lattice_bin_until__##isa(const float *x, int64_t n,                   \
                                              const qcal_lattice_grid *g, uint64_t *counts,\
                                              qcal_hist_sub *sub, float *mn, float *mx,    \
                                              uint64_t *nonfinite);
QCAL_HIST_DECLARE(c)
QCAL_HIST_DECLARE(avx2)
QCAL_HIST_DECLARE(avx512)

/* ---- helpers shared by the ISA files (histogram_c.c) -------------------------------- */

/* counts[b] += the QCAL_HIST_SUB_COPIES copies of slot b, b < ncount; every slot of the
 * copies (stride slots each) is zeroed. */
void qcal_hist_sub_flush(qcal_hist_sub *sub, int32_t stride, int32_t ncount, uint64_t *counts);

/* End of a SIMD histc_inside that covered whole chunks [0, nch) of CH values: `done` chunks
 * had their min / max taken (done < nch only after a value outside, binning abandoned).
 * Takes min / max of the rest with mm (abandoned) or runs the C kernel on the tail, and
 * combines with *mn / *mx / *nonfinite. Returns whether everything was binned. */
typedef void (*qcal_hist_minmax_fn)(const float *, int64_t, float *, float *, uint64_t *);
bool qcal_hist_inside_finish(const float *x, int64_t n, int64_t nch, int64_t done, int ch,
                             bool outside, const qcal_histc_grid *hg, uint64_t *counts,
                             qcal_hist_sub *sub, float *mn, float *mx, uint64_t *nonfinite,
                             qcal_hist_minmax_fn mm);

/* End of a SIMD lattice_bin_until that binned every whole chunk of x[0..at): the C
 * reference on the short last chunk x[at..n), combined into *mn / *mx / *nonfinite.
 * Returns what the kernel returns (at, or n). */
int64_t qcal_hist_until_tail(const float *x, int64_t n, int64_t at, const qcal_lattice_grid *g,
                             uint64_t *counts, qcal_hist_sub *sub, float *mn, float *mx,
                             uint64_t *nonfinite);

/* The exported kernels and the init function of an ISA file (histogram_<isa>.c), around its
 * `static int64_t chunks(x, nch, kind, hg, lg, fused, counts, sub, mn, mx, bad, outside)`
 * over whole chunks of QCAL_HIST_CH values (kind QCAL_HIST_LINEAR / QCAL_HIST_LATTICE):
 * tails and grids the SIMD loop does not take (a first-batch range overflowing float, more
 * than 2^16 slots) go to the C references; histc_inside ends with qcal_hist_inside_finish,
 * which takes the min / max of an abandoned rest with the ISA's minmax kernel `mm`. With
 * kind QCAL_HIST_LATTICE, `fused` is lattice_bin_until: chunks() returns the first chunk
 * holding a finite value outside (nch if none), having binned exactly the chunks before it,
 * and *mn / *mx / *bad cover those chunks. */
#define QCAL_HIST_CH 64
#define QCAL_HIST_CHECK 64   /* histc_inside looks for values outside every 64 chunks */
#define QCAL_HIST_PF 1024    /* input prefetch distance, in values */
#define QCAL_HIST_PF_PAGE (64 * 1024)   /* page-ahead prefetch distance, in bytes */

/* Whether the SIMD kernels prefetch their input into L1 (T0) rather than non-temporally
 * (NTA). NTA keeps the stream from evicting the sub-histograms (32 KB for a 2048-bin
 * lattice) and was the faster one on AMD EPYC; on Intel Xeon cores a line prefetched NTA
 * goes to L1 alone, and one evicted before its use is read again from memory, so T0 was
 * the faster one there (docs/performance.md, "Figures behind the kernels' code").
 * Prefetches do not change any count. */
static inline bool qcal_hist_prefetch_l1(void)
{
    return __builtin_cpu_is("intel");
}

/* lattice_bin_until's decision for a chunk of n values that the vector test did not pass
 * (NaN / Inf, or a value outside): the C reference's test, value by value. Returns whether
 * the chunk holds a finite value outside the window (the chunk is then left to the next
 * call and nothing is changed); otherwise takes its finite values into *mn / *mx and adds
 * its non-finite count to *bad. */
static inline bool qcal_hist_until_scan(const float *p, int n, const qcal_lattice_grid *lg,
                                        float *mn, float *mx, uint64_t *bad)
{
    float l = *mn, h = *mx;
    uint64_t b = 0;
    for (int i = 0; i < n; i++) {
        float w = p[i];
        if (!qcal_f32_finite(w)) {
            b++;
            continue;
        }
        l = w < l ? w : l;
        h = w > h ? w : h;
        if (qcal_lattice_slot(w, lg) >= (uint32_t)lg->accept)
            return true;
    }
    *mn = l, *mx = h, *bad += b;
    return false;
}

/* Whether a SIMD kernel's ring holds each slot with its copy's offset added: the slot of
 * lane l of a vector goes to copy l & 3 and is stored as slot + (l & 3) * stride, which must
 * stay below 2^16 (stride <= 16384). The scatter then increments sub[k] from one base: one
 * address computation fewer per value than four copy bases (faster: docs/performance.md,
 * "Figures behind the kernels' code"). Each copy
 * still takes a quarter of every chunk, so the flush interval stays the same. Larger grids
 * keep plain slots and the four bases. */
static inline bool qcal_hist_ring_offsets(int32_t stride)
{
    return stride <= 65536 / QCAL_HIST_SUB_COPIES;
}

/* The scalar half of the pipelined SIMD loop: one chunk of uint16 slots (< 2^16: bins + 2 or
 * accept + 1 slots; the SIMD versions take the C path beyond) into the four copies of
 * `stride` counters at sub; pre: the slots carry their copy's offset
 * (qcal_hist_ring_offsets). */
static inline void qcal_hist_scatter_chunk(const uint16_t *k, qcal_hist_sub *sub,
                                           int32_t stride, bool pre)
{
    if (pre) {
        for (int j = 0; j < QCAL_HIST_CH; j += 4) {
            sub[k[j]]++;
            sub[k[j + 1]]++;
            sub[k[j + 2]]++;
            sub[k[j + 3]]++;
        }
        return;
    }
    qcal_hist_sub *s0 = sub, *s1 = sub + stride, *s2 = sub + 2 * (size_t)stride,
                  *s3 = sub + 3 * (size_t)stride;
    for (int j = 0; j < QCAL_HIST_CH; j += 4) {
        s0[k[j]]++;
        s1[k[j + 1]]++;
        s2[k[j + 2]]++;
        s3[k[j + 3]]++;
    }
}
/* Whether the SIMD kernels' scatter increments with a load, an add and a store of its own
 * (qcal_hist_scatter_chunk_split) rather than one add to memory: on Intel Xeon cores a loop
 * of adds to memory leaves no room for other instructions beside it (each one added costs
 * its issue slot), the split loop some, and the vector work of the next chunks runs there
 * (docs/performance.md, "Figures behind the kernels' code"). AMD cores keep the add to
 * memory, with which the kernels were tuned there. Counts are the same. */
static inline bool qcal_hist_split_increments(void)
{
    return __builtin_cpu_is("intel");
}

#if defined(__GNUC__) && defined(__x86_64__)
/* qcal_hist_scatter_chunk for slots carrying their copy's offset, each increment written
 * as three instructions (movzwl, inc, movw with the same indexed address): compilers fuse
 * a C increment into one add to memory, or split it around an lea, which was slower. */
static inline void qcal_hist_scatter_chunk_split(const uint16_t *k, qcal_hist_sub *sub)
{
#pragma GCC unroll 64
    for (int j = 0; j < QCAL_HIST_CH; j++) {
        uint32_t t;
        __asm__ volatile("movzwl (%1,%q2,2), %0\n\t"
                         "incl %0\n\t"
                         "movw %w0, (%1,%q2,2)"
                         : "=&r"(t)
                         : "r"(sub), "r"((uint64_t)k[j])
                         : "memory");
    }
}

/* The SIMD kernels' ring step at chunk c: the slots of chunk c - 2 (a ring of 4 chunks of
 * k) into sub, split (qcal_hist_split_increments) or as one add to memory each. */
static inline void qcal_hist_scatter_ring(const uint16_t *k, int64_t c, qcal_hist_sub *sub,
                                          int32_t stride, bool pre, bool split)
{
    const uint16_t *kc = k + ((c - 2) & 3) * QCAL_HIST_CH;
    if (split)
        qcal_hist_scatter_chunk_split(kc, sub);
    else
        qcal_hist_scatter_chunk(kc, sub, stride, pre);
}
#endif

/* The end of lattice_bin_until at chunk c: bins the chunks c - 2 and c - 1 still in the
 * ring of 4 chunks of slots k (those that exist). */
static inline void qcal_hist_drain_ring(const uint16_t *k, int64_t c, qcal_hist_sub *sub,
                                        int32_t stride, bool pre)
{
    if (c >= 2)
        qcal_hist_scatter_chunk(k + ((c - 2) & 3) * QCAL_HIST_CH, sub, stride, pre);
    if (c >= 1)
        qcal_hist_scatter_chunk(k + ((c - 1) & 3) * QCAL_HIST_CH, sub, stride, pre);
}
enum { QCAL_HIST_LINEAR, QCAL_HIST_LATTICE };
#define QCAL_HIST_DEFINE_ISA(isa, mm)                                                      \
    void qcal_f32_histc__##isa(const float *x, int64_t n, const qcal_histc_grid *g,        \
                               uint64_t *counts, qcal_hist_sub *sub)                       \
    {                                                                                      \
        if (!qcal_histc_float_ok(g->lo, g->hi) || g->bins + 2 > 65536) {                   \
            qcal_f32_histc__c(x, n, g, counts, sub);                                       \
            return;                                                                        \
        }                                                                                  \
        int64_t nch = n / QCAL_HIST_CH;                                                    \
        chunks(x, nch, QCAL_HIST_LINEAR, g, NULL, false, counts, sub, NULL, NULL, NULL,    \
               NULL);                                                                      \
        if (nch * QCAL_HIST_CH < n)                                                        \
            qcal_f32_histc__c(x + nch * QCAL_HIST_CH, n - nch * QCAL_HIST_CH, g, counts,   \
                              sub);                                                        \
    }                                                                                      \
    bool qcal_f32_histc_inside__##isa(const float *x, int64_t n, const qcal_histc_grid *g, \
                                      uint64_t *counts, qcal_hist_sub *sub, float *mn,     \
                                      float *mx, uint64_t *nonfinite)                      \
    {                                                                                      \
        if (!qcal_histc_float_ok(g->lo, g->hi) || g->bins + 2 > 65536)                    \
            return qcal_f32_histc_inside__c(x, n, g, counts, sub, mn, mx, nonfinite);      \
        int64_t nch = n / QCAL_HIST_CH;                                                    \
        bool outside = false;                                                              \
        *mn = INFINITY, *mx = -INFINITY, *nonfinite = 0;                                   \
        int64_t done = nch ? chunks(x, nch, QCAL_HIST_LINEAR, g, NULL, true, counts, sub,  \
                                    mn, mx, nonfinite, &outside)                           \
                           : 0;                                                            \
        return qcal_hist_inside_finish(x, n, nch, done, QCAL_HIST_CH, outside, g, counts,  \
                                       sub, mn, mx, nonfinite, mm);                        \
    }                                                                                      \
    void qcal_f32_lattice_bin__##isa(const float *x, int64_t n, const qcal_lattice_grid *g,\
                                     uint64_t *counts, qcal_hist_sub *sub)                 \
    {                                                                                      \
        if (g->accept + 1 > 65536) {                                                       \
            qcal_f32_lattice_bin__c(x, n, g, counts, sub);                                 \
            return;                                                                        \
        }                                                                                  \
        int64_t nch = n / QCAL_HIST_CH;                                                    \
        chunks(x, nch, QCAL_HIST_LATTICE, NULL, g, false, counts, sub, NULL, NULL, NULL,   \
               NULL);                                                                      \
        if (nch * QCAL_HIST_CH < n)                                                        \
            qcal_f32_lattice_bin__c(x + nch * QCAL_HIST_CH, n - nch * QCAL_HIST_CH, g,     \
                                    counts, sub);                                          \
    }                                                                                      \
    int64_t qcal_f32_lattice_bin_until__##isa(const float *x, int64_t n,                   \
                                              const qcal_lattice_grid *g, uint64_t *counts,\
                                              qcal_hist_sub *sub, float *mn, float *mx,    \
                                              uint64_t *nonfinite)                         \
    {                                                                                      \
        if (g->accept + 1 > 65536)                                                         \
            return qcal_f32_lattice_bin_until__c(x, n, g, counts, sub, mn, mx, nonfinite); \
        int64_t nch = n / QCAL_HIST_CH;                                                    \
        bool outside = false;                                                              \
        *mn = INFINITY, *mx = -INFINITY, *nonfinite = 0;                                   \
        int64_t done = nch ? chunks(x, nch, QCAL_HIST_LATTICE, NULL, g, true, counts, sub, \
                                    mn, mx, nonfinite, &outside)                           \
                           : 0;                                                            \
        if (done < nch || nch * QCAL_HIST_CH == n)                                         \
            return done * QCAL_HIST_CH;                                                    \
        return qcal_hist_until_tail(x, n, nch * QCAL_HIST_CH, g, counts, sub, mn, mx,      \
                                    nonfinite);                                            \
    }                                                                                      \
    void qcal_histogram_dsp_init_##isa(qcal_histogram_dsp *dsp)                            \
    {                                                                                      \
        dsp->histc = qcal_f32_histc__##isa;                                                \
        dsp->histc_inside = qcal_f32_histc_inside__##isa;                                  \
        dsp->lattice_bin = qcal_f32_lattice_bin__##isa;                                    \
        dsp->lattice_bin_until = qcal_f32_lattice_bin_until__##isa;                        \
    }

#endif
