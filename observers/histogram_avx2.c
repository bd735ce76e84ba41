/* Histogram kernel family, AVX2 (observers/histogram_dsp.h; built with -mavx2 -mfma).
 *
 * Software-pipelined: the slots of chunk c (CH values) are computed with vector ops into a
 * ring of 4 chunk buffers while the scalar loop increments the sub-histogram counters of
 * chunk c - 2, so the scalar loads never wait on a vector store still in flight and the
 * index arithmetic overlaps the increments (the bottleneck). One loop serves both grids: the
 * grid kind is a compile-time constant of each exported kernel. histc_inside also tracks
 * min / max / non-finite and stops binning at the first block of CHECK chunks holding a
 * finite value outside the grid; lattice_bin_until stops at the first chunk holding one,
 * before binning it (a chunk whose lanes are all inside takes the vector min / max; any
 * other chunk, rare, is decided value by value as in the C reference). */
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
    for (; b + 4 <= ncount; b += 4) {
        __m256i acc = _mm256_loadu_si256((const __m256i *)(counts + b));
        for (int c = 0; c < QCAL_HIST_SUB_COPIES; c++)
            acc = _mm256_add_epi64(acc, _mm256_cvtepu16_epi64(_mm_loadl_epi64(
                                            (const __m128i *)(sub + (size_t)c * stride + b))));
        _mm256_storeu_si256((__m256i *)(counts + b), acc);
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
__attribute__((always_inline)) static inline int64_t
chunks(const float *x, int64_t nch, int kind, const qcal_histc_grid *hg,
       const qcal_lattice_grid *lg, bool fused, uint64_t *counts, qcal_hist_sub *sub,
       float *mn, float *mx, uint64_t *bad, bool *outside)
{
    const bool linear = kind == QCAL_HIST_LINEAR;
    const int32_t stride = linear ? hg->bins + 2 : lg->accept + 1;
    const int32_t ncount = linear ? hg->bins + 1 : lg->accept;
    const bool absval = linear ? hg->absval : lg->absval;
    const __m256 vabs = _mm256_castsi256_ps(_mm256_set1_epi32(absval ? 0x7fffffff : -1));
    const __m256 zero = _mm256_setzero_ps();
    const __m256i vexp = _mm256_set1_epi32(0x7f800000);
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    /* linear grid */
    const __m256 vlo = _mm256_set1_ps(linear ? hg->lo : 0.0f);
    const __m256 vhi = _mm256_set1_ps(linear ? hg->hi : 0.0f);
    const __m256 vr = _mm256_set1_ps(linear ? hg->hi - hg->lo : 1.0f);
    const __m256 vb = _mm256_set1_ps(linear ? (float)hg->bins : 0.0f);
    const __m256i vout = _mm256_set1_epi32(linear ? hg->bins + 1 : 0);
    /* lattice */
    const __m256 vs = _mm256_set1_ps(linear ? 0.0f : lg->scale);
    const __m256i vjlo = _mm256_set1_epi32(linear ? 0 : lg->jlo);
    const __m256i vacc = _mm256_set1_epi32(linear ? 0 : lg->accept);
    const __m256i vaccm1 = _mm256_set1_epi32(linear ? 0 : lg->accept - 1);
    /* v * scale underflows to -0 for some negative v only when scale < 1 (otherwise
     * |v * scale| >= |v|, exact): only then does the cell of such a v need fixing to -1. */
    const bool underflow = !linear && lg->scale < 1.0f;
    const bool until = fused && !linear;
    const bool l1 = qcal_hist_prefetch_l1();
    __m256 vmn = pinf, vmx = ninf;
    float smn = INFINITY, smx = -INFINITY;   /* until: chunks taken by the scalar path */
    __m256i out = _mm256_setzero_si256();
    uint64_t nbad = 0;
    /* Slots carry their copy's offset (lane & 3) when the grid allows it. */
    const bool pre = qcal_hist_ring_offsets(stride);
    const bool split = pre && qcal_hist_split_increments();
    const __m256i voff = pre ? _mm256_mullo_epi32(_mm256_set_epi32(3, 2, 1, 0, 3, 2, 1, 0),
                                                  _mm256_set1_epi32(stride))
                             : _mm256_setzero_si256();
    uint16_t k[4 * CH] __attribute__((aligned(32)));
    int64_t since = 0, c = 0, done = nch;
    for (c = 0; c < nch + 2; c++) {
        if (c < nch) {
            const float *p = x + c * CH;
            uint16_t *kb = k + (c & 3) * CH;
            __m256i cin = _mm256_setzero_si256();   /* until: unsigned max of raw slots */
            __m256 cmn = vmn, cmx = vmx;
            /* The input streams through once: fetch it PF values ahead, non-temporally
             * unless l1 (qcal_hist_prefetch_l1), so that it does not evict the
             * sub-histograms from L1 (prefetches never fault; the addresses past the end of
             * x are formed as integers). */
            for (int l = 0; l < CH; l += 16) {
                const char *a = (const char *)((uintptr_t)(p + l) + PF * sizeof(float));
                if (l1)
                    _mm_prefetch(a, _MM_HINT_T0);
                else
                    _mm_prefetch(a, _MM_HINT_NTA);
            }
            /* And, with NTA, one line per 4 KB page QCAL_HIST_PF_PAGE bytes ahead: the
             * hardware prefetchers stop at page boundaries; the page's TLB walk and first
             * miss are then done early (with T0 it did not pay). */
            if (!l1 && (c & (4096 / (CH * 4) - 1)) == 0) {
                const char *a = (const char *)((uintptr_t)p + QCAL_HIST_PF_PAGE);
                if (l1)
                    _mm_prefetch(a, _MM_HINT_T0);
                else
                    _mm_prefetch(a, _MM_HINT_NTA);
            }
            for (int j = 0; j < CH; j += 16) {
                __m256i sl[2], inm[2];
                __m256 raws[2];
                for (int h = 0; h < 2; h++) {
                    __m256 raw = _mm256_loadu_ps(p + j + 8 * h);
                    __m256 v = _mm256_and_ps(raw, vabs);
                    __m256i in, slot;
                    if (linear) {
                        in = _mm256_castps_si256(_mm256_and_ps(
                            _mm256_cmp_ps(v, vlo, _CMP_GE_OQ), _mm256_cmp_ps(v, vhi, _CMP_LE_OQ)));
                        __m256 t = _mm256_mul_ps(_mm256_div_ps(_mm256_sub_ps(v, vlo), vr), vb);
                        slot = _mm256_blendv_epi8(vout, _mm256_cvttps_epi32(t), in);
                    } else {
                        __m256 m = _mm256_mul_ps(v, vs);
                        __m256i ji = _mm256_cvttps_epi32(_mm256_floor_ps(m));
                        if (underflow) {
                            __m256 uf = _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ),
                                                      _mm256_cmp_ps(m, zero, _CMP_EQ_OQ));
                            ji = _mm256_add_epi32(ji, _mm256_castps_si256(uf));   /* -1 */
                        }
                        /* Outside the window (NaN's INT32_MIN too) is >= accept as an
                         * unsigned: the unsigned min makes it the dropped slot; `in` keeps
                         * the raw slot, whose unsigned max over the chunk says whether any
                         * lane was outside. */
                        in = _mm256_sub_epi32(ji, vjlo);
                        slot = _mm256_min_epu32(in, vacc);
                    }
                    sl[h] = _mm256_add_epi32(slot, voff);
                    inm[h] = in;
                    raws[h] = raw;
                }
                if (until) {
                    /* NaN / Inf are never inside: a chunk with every lane inside is all
                     * finite and its plain min / max are the ones wanted; any other chunk
                     * goes to the scalar path below, which decides. */
                    for (int h = 0; h < 2; h++) {
                        cin = _mm256_max_epu32(cin, inm[h]);
                        cmn = _mm256_min_ps(cmn, raws[h]);
                        cmx = _mm256_max_ps(cmx, raws[h]);
                    }
                }
                if (fused && linear) {
                    for (int h = 0; h < 2; h++) {
                        __m256i ex = _mm256_and_si256(_mm256_castps_si256(raws[h]), vexp);
                        __m256i nonfin = _mm256_cmpeq_epi32(ex, vexp);
                        __m256 nf = _mm256_castsi256_ps(nonfin);
                        vmn = _mm256_min_ps(vmn, _mm256_blendv_ps(raws[h], pinf, nf));
                        vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(raws[h], ninf, nf));
                        nbad += (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_ps(nf));
                        out = _mm256_or_si256(
                            out, _mm256_andnot_si256(_mm256_or_si256(inm[h], nonfin), vexp));
                    }
                }
                /* 16 slots (< 2^16, so the unsigned saturation is exact) in one store,
                 * lane-interleaved: the order of a chunk's slots does not change its counts. */
                _mm256_store_si256((__m256i *)(kb + j), _mm256_packus_epi32(sl[0], sl[1]));
            }
            if (until) {
                /* every lane inside: max <= accept - 1 (none with an empty window) */
                if (lg->accept > 0 &&
                    _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(cin, vaccm1),
                                                            vaccm1)) == -1) {
                    vmn = cmn;
                    vmx = cmx;
                } else if (qcal_hist_until_scan(p, CH, lg, &smn, &smx, &nbad)) {
                    /* A value outside: chunk c is left to the next call. */
                    qcal_hist_drain_ring(k, c, sub, stride, pre);
                    done = c;
                    break;
                }
            }
        }
        if (c >= 2)
            qcal_hist_scatter_ring(k, c, sub, stride, pre, split);
        since += CH;
        if (since >= QCAL_HIST_FLUSH_ELEMS) {
            flush(sub, stride, ncount, counts);
            since = 0;
        }
        if (fused && linear && c < nch && (c % CHECK == CHECK - 1 || c == nch - 1) &&
            !_mm256_testz_si256(out, out)) {
            done = c + 1;
            break;
        }
    }
    flush(sub, stride, ncount, counts);
    if (fused) {
        float l[8], h[8];
        _mm256_storeu_ps(l, vmn);
        _mm256_storeu_ps(h, vmx);
        float a = l[0], b = h[0];
        for (int i = 1; i < 8; i++) {
            a = l[i] < a ? l[i] : a;
            b = h[i] > b ? h[i] : b;
        }
        *mn = smn < a ? smn : a;
        *mx = smx > b ? smx : b;
        *bad = nbad;
        *outside = !_mm256_testz_si256(out, out);
    }
    return done;
}

QCAL_HIST_DEFINE_ISA(avx2, qcal_f32_minmax__avx2)
