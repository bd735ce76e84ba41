/* Histogram kernel family, AVX-512 F/BW/DQ/VL (observers/histogram_dsp.h).
 *
 * Software-pipelined: the slots of chunk c (CH values) are computed with vector ops into a
 * ring of 4 chunk buffers while the scalar loop increments the sub-histogram counters of
 * chunk c - 2, so the scalar loads never wait on a vector store still in flight and the
 * index arithmetic overlaps the increments (the bottleneck). One loop serves both grids: the
 * grid kind is a compile-time constant of each exported kernel. histc_inside also tracks
 * min / max / non-finite and stops binning at the first block of CHECK chunks holding a
 * finite value outside the grid; lattice_bin_until stops at the first chunk holding one,
 * before binning it (a chunk whose lanes are all inside takes the vector min / max; any
 * other chunk, rare, is decided value by value as in the C reference).
 *
 * The bound is the increments: one 16-bit store per value to a random line of the copies,
 * and the cores measured retire one such store per cycle. Every other store competes with
 * them (on Intel cores so do the input's lines coming into L1, and with the increments as
 * adds to memory every other instruction: qcal_hist_split_increments), so the loop keeps
 * stores and instructions few: absval and the underflow fix are compile-time constants of
 * each loop (chunks() below), lattice_bin_until does not clamp slots (a chunk with one
 * outside is not binned from them), 32 slots a 64-byte store (vpackusdw, the lanes
 * interleaved: the order of a chunk's slots does not change its counts), no call inside a
 * segment of QCAL_HIST_FLUSH_ELEMS values (a call clobbers every zmm, and GCC then kept the
 * min / max vectors on the stack), and a vector flush. The input is prefetched NTA (4096
 * cells are 32 KB of counters, all of L1; T0 on Intel cores, qcal_hist_prefetch_l1), plus
 * with NTA one more line per 4 KB page, 64 KB ahead; the slots carry their copy's offset
 * (qcal_hist_ring_offsets), so the scatter addresses one base; slots are read one uint16 at
 * a time (four per 64-bit load was slower). The timings behind each choice:
 * docs/performance.md, "Figures behind the kernels' code". */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_dsp.h"
#include "observers/minmax_dsp.h"

#define CH QCAL_HIST_CH
#define CHECK QCAL_HIST_CHECK
#define PF QCAL_HIST_PF

/* qcal_hist_sub_flush with vector loads and stores (the same sums; zeroes every slot). */
static void flush(qcal_hist_sub *sub, int32_t stride, int32_t ncount, uint64_t *counts)
{
    int32_t b = 0;
    for (; b + 8 <= ncount; b += 8) {
        __m512i acc = _mm512_loadu_si512(counts + b);
        for (int c = 0; c < QCAL_HIST_SUB_COPIES; c++)
            acc = _mm512_add_epi64(acc, _mm512_cvtepu16_epi64(_mm_loadu_si128(
                                            (const __m128i *)(sub + (size_t)c * stride + b))));
        _mm512_storeu_si512(counts + b, acc);
    }
    for (; b < ncount; b++)
        for (int c = 0; c < QCAL_HIST_SUB_COPIES; c++)
            counts[b] += sub[(size_t)c * stride + b];
    memset(sub, 0, (size_t)QCAL_HIST_SUB_COPIES * (size_t)stride * sizeof *sub);
}

/* Chunks [0, nch) of x. Plain mode bins all of them and returns nch. Fused mode also takes
 * min / max / non-finite into *mn, *mx, *bad; first-batch grid: returns the number of chunks
 * whose min / max were taken, < nch only if *outside was set (binning abandoned, counts
 * partial); lattice (until): returns the first chunk holding a finite value outside, having
 * binned and taken the min / max of exactly the chunks before it. */
/* The cells - jlo of 16 lattice values as unsigned (outside the window, NaN's INT32_MIN too,
 * is >= accept), v = raw or |raw| if absval. */
__attribute__((always_inline)) static inline __m512i
lattice_raw_slots(__m512 raw, bool absval, bool underflow, __m512i vabs, __m512 vs,
                  __m512i vjlo)
{
    __m512 v = absval ? _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(raw), vabs))
                      : raw;
    __m512 m = _mm512_mul_ps(v, vs);
    /* floor and convert in one instruction (NaN and out-of-range give INT32_MIN, as the
     * truncation of the floor did). */
    __m512i ji = _mm512_cvt_roundps_epi32(m, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    if (underflow) {
        const __m512 zero = _mm512_setzero_ps();
        __mmask16 uf = _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), m, zero,
                                               _CMP_EQ_OQ);
        ji = _mm512_mask_sub_epi32(ji, uf, ji, _mm512_set1_epi32(1));
    }
    return _mm512_sub_epi32(ji, vjlo);
}

/* chunks() below, with the grid's absval and (lattice) underflow as constants. */
__attribute__((always_inline)) static inline int64_t
chunks_of(const float *x, int64_t nch, int kind, const qcal_histc_grid *hg,
          const qcal_lattice_grid *lg, bool fused, bool absval, bool underflow,
          uint64_t *counts, qcal_hist_sub *sub, float *mn, float *mx, uint64_t *bad,
          bool *outside)
{
    const bool linear = kind == QCAL_HIST_LINEAR;
    const int32_t stride = linear ? hg->bins + 2 : lg->accept + 1;
    const int32_t ncount = linear ? hg->bins + 1 : lg->accept;
    const __m512i vabs = _mm512_set1_epi32(absval ? 0x7fffffff : -1);
    /* linear grid */
    const __m512 vlo = _mm512_set1_ps(linear ? hg->lo : 0.0f);
    const __m512 vhi = _mm512_set1_ps(linear ? hg->hi : 0.0f);
    const __m512 vr = _mm512_set1_ps(linear ? hg->hi - hg->lo : 1.0f);
    const __m512 vb = _mm512_set1_ps(linear ? (float)hg->bins : 0.0f);
    const __m512i vout = _mm512_set1_epi32(linear ? hg->bins + 1 : 0);
    /* lattice */
    const __m512 vs = _mm512_set1_ps(linear ? 0.0f : lg->scale);
    const __m512i vjlo = _mm512_set1_epi32(linear ? 0 : lg->jlo);
    const __m512i vacc = _mm512_set1_epi32(linear ? 0 : lg->accept);
    const bool until = fused && !linear;
    const __m512i zero_i = _mm512_setzero_si512();
    const bool l1 = qcal_hist_prefetch_l1();
    float fmn = INFINITY, fmx = -INFINITY;   /* vector min / max of the segments before */
    float smn = INFINITY, smx = -INFINITY;   /* until: chunks taken by the scalar path */
    __mmask16 out = 0;
    uint64_t nbad = 0;
    /* Slots carry their copy's offset (lane & 3) when the grid allows it. */
    const bool pre = qcal_hist_ring_offsets(stride);
    const bool split = pre && qcal_hist_split_increments();
    const __m512i voff = pre ? _mm512_mullo_epi32(
                                   _mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9,
                                                                     8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                    _mm512_set1_epi32(3)),
                                   _mm512_set1_epi32(stride))
                             : _mm512_setzero_si512();
    uint16_t k[4 * CH] __attribute__((aligned(64)));
    int64_t c = 0, done = nch;
    bool stop = false;
    /* Segments of QCAL_HIST_FLUSH_ELEMS values between two flushes of the 16-bit copies: no
     * call inside a segment, so the vectors stay in registers (a call clobbers every zmm). */
    while (c < nch + 2 && !stop) {
        int64_t cend = c + QCAL_HIST_FLUSH_ELEMS / CH;
        if (cend > nch + 2)
            cend = nch + 2;
        __m512 vmn = _mm512_set1_ps(fmn), vmx = _mm512_set1_ps(fmx);
        for (; c < cend; c++) {
            if (c < nch) {
                const float *p = x + c * CH;
                uint16_t *kb = k + (c & 3) * CH;
                __m512i cmaxs = zero_i;   /* until: unsigned max of the chunk's raw slots */
                __m512 cmn = vmn, cmx = vmx;
                /* The input streams through once: fetch it PF values ahead, non-temporally
                 * unless l1 (qcal_hist_prefetch_l1), so that it does not evict the
                 * sub-histograms from L1 (prefetches never fault; the addresses past the
                 * end of x are formed as integers). */
                for (int l = 0; l < CH; l += 16) {
                    const char *a = (const char *)((uintptr_t)(p + l) + PF * sizeof(float));
                    if (l1)
                        _mm_prefetch(a, _MM_HINT_T0);
                    else
                        _mm_prefetch(a, _MM_HINT_NTA);
                }
                /* And, with NTA, one line per 4 KB page QCAL_HIST_PF_PAGE bytes ahead: the
                 * hardware prefetchers stop at page boundaries; the page's TLB walk and
                 * first miss are then done early (with T0 it did not pay). */
                if (!l1 && (c & (4096 / (CH * 4) - 1)) == 0) {
                    const char *a = (const char *)((uintptr_t)p + QCAL_HIST_PF_PAGE);
                    if (l1)
                        _mm_prefetch(a, _MM_HINT_T0);
                    else
                        _mm_prefetch(a, _MM_HINT_NTA);
                }
                for (int j = 0; j < CH; j += 32) {
                    __m512i sl[2];
                    for (int h = 0; h < 2; h++) {
                        __m512 raw = _mm512_loadu_ps(p + j + 16 * h);
                        __mmask16 in;
                        __m512i slot;
                        if (linear) {
                            __m512 v = absval ? _mm512_castsi512_ps(_mm512_and_si512(
                                                    _mm512_castps_si512(raw), vabs))
                                              : raw;
                            in = _mm512_cmp_ps_mask(v, vlo, _CMP_GE_OQ) &
                                 _mm512_cmp_ps_mask(v, vhi, _CMP_LE_OQ);
                            /* The three correctly rounded float ops of the C index,
                             * truncated. */
                            __m512 t =
                                _mm512_mul_ps(_mm512_div_ps(_mm512_sub_ps(v, vlo), vr), vb);
                            slot = _mm512_mask_blend_epi32(in, vout, _mm512_cvttps_epi32(t));
                        } else {
                            /* The unsigned min makes a slot outside the window the dropped
                             * one; until takes the chunk's unsigned max instead, which says
                             * whether any lane was outside: a chunk with one is either left
                             * to the next call or (NaN / Inf only) has its slots clamped
                             * below, so its unclamped slots are never binned. */
                            __m512i raw_slot =
                                lattice_raw_slots(raw, absval, underflow, vabs, vs, vjlo);
                            if (until)
                                cmaxs = _mm512_max_epu32(cmaxs, raw_slot);
                            slot = until ? raw_slot : _mm512_min_epu32(raw_slot, vacc);
                            in = 0;
                        }
                        if (fused && linear) {
                            /* fpclass 0x99: QNaN, +Inf, -Inf, SNaN. */
                            __mmask16 fin = (__mmask16)~_mm512_fpclass_ps_mask(raw, 0x99);
                            vmn = _mm512_mask_min_ps(vmn, fin, vmn, raw);
                            vmx = _mm512_mask_max_ps(vmx, fin, vmx, raw);
                            nbad += (uint64_t)__builtin_popcount(0xffffu & ~(unsigned)fin);
                            out |= (__mmask16)(fin & ~in);
                        }
                        if (until) {
                            cmn = _mm512_min_ps(cmn, raw);
                            cmx = _mm512_max_ps(cmx, raw);
                        }
                        sl[h] = _mm512_add_epi32(slot, voff);
                    }
                    /* 32 slots (< 2^16, so the unsigned saturation is exact) in one store,
                     * lane-interleaved: the order of the slots of a chunk does not change
                     * the counts. */
                    _mm512_store_si512((__m512i *)(kb + j), _mm512_packus_epi32(sl[0], sl[1]));
                }
                if (until) {
                    if (_mm512_cmplt_epu32_mask(cmaxs, vacc) == 0xffff) {
                        vmn = cmn;
                        vmx = cmx;
                    } else if (qcal_hist_until_scan(p, CH, lg, &smn, &smx, &nbad)) {
                        /* A value outside: chunk c is left to the next call. */
                        qcal_hist_drain_ring(k, c, sub, stride, pre);
                        done = c;
                        stop = true;
                        break;
                    } else {
                        /* NaN / Inf only: the chunk is binned, its slots clamped. */
                        for (int j = 0; j < CH; j += 32) {
                            __m512i sl[2];
                            for (int h = 0; h < 2; h++)
                                sl[h] = _mm512_add_epi32(
                                    _mm512_min_epu32(
                                        lattice_raw_slots(_mm512_loadu_ps(p + j + 16 * h),
                                                          absval, underflow, vabs, vs, vjlo),
                                        vacc),
                                    voff);
                            _mm512_store_si512((__m512i *)(kb + j),
                                               _mm512_packus_epi32(sl[0], sl[1]));
                        }
                    }
                }
            }
            if (c >= 2)
                qcal_hist_scatter_ring(k, c, sub, stride, pre, split);
            if (fused && linear && out && c < nch && (c % CHECK == CHECK - 1 || c == nch - 1)) {
                done = c + 1;
                stop = true;
                break;
            }
        }
        if (fused) {
            float l = _mm512_reduce_min_ps(vmn), h = _mm512_reduce_max_ps(vmx);
            fmn = l < fmn ? l : fmn;
            fmx = h > fmx ? h : fmx;
        }
        flush(sub, stride, ncount, counts);
    }
    if (fused) {
        *mn = smn < fmn ? smn : fmn;
        *mx = smx > fmx ? smx : fmx;
        *bad = nbad;
        *outside = out != 0;
    }
    return done;
}

/* chunks_of with absval and underflow as constants (the grid's): a loop for each, without
 * their tests in it (the AND of |x| and the underflow test compiled to 3 instructions a
 * vector with the flags as variables). */
__attribute__((always_inline)) static inline int64_t
chunks(const float *x, int64_t nch, int kind, const qcal_histc_grid *hg,
       const qcal_lattice_grid *lg, bool fused, uint64_t *counts, qcal_hist_sub *sub,
       float *mn, float *mx, uint64_t *bad, bool *outside)
{
    const bool linear = kind == QCAL_HIST_LINEAR;
    const bool absval = linear ? hg->absval : lg->absval;
    /* v * scale underflows to -0 for some negative v only when scale < 1 (otherwise
     * |v * scale| >= |v|, exact): only then does the cell of such a v need fixing to -1. */
    const bool underflow = !linear && lg->scale < 1.0f;
    if (underflow)
        return absval ? chunks_of(x, nch, kind, hg, lg, fused, true, true, counts, sub, mn, mx,
                                  bad, outside)
                      : chunks_of(x, nch, kind, hg, lg, fused, false, true, counts, sub, mn,
                                  mx, bad, outside);
    return absval ? chunks_of(x, nch, kind, hg, lg, fused, true, false, counts, sub, mn, mx,
                              bad, outside)
                  : chunks_of(x, nch, kind, hg, lg, fused, false, false, counts, sub, mn, mx,
                              bad, outside);
}

QCAL_HIST_DEFINE_ISA(avx512, qcal_f32_minmax__avx512)
