/* Histogram kernel family: C references (the definition of every count), the helpers the
 * ISA files share, and the function table (observers/histogram_dsp.h). */
#include <math.h>
#include <string.h>

#include "observers/histogram_dsp.h"
#include "qcal_config.h"

/* Bin indices are computed op by op (no fused multiply-add), as torch.histc does. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#define NCOPIES QCAL_HIST_SUB_COPIES
#define FLUSH_ELEMS QCAL_HIST_FLUSH_ELEMS

void qcal_hist_sub_flush(qcal_hist_sub *sub, int32_t stride, int32_t ncount, uint64_t *counts)
{
    for (int32_t b = 0; b < ncount; b++) {
        uint64_t s = 0;
        for (int c = 0; c < NCOPIES; c++) {
            s += sub[(size_t)c * (size_t)stride + (size_t)b];
            sub[(size_t)c * (size_t)stride + (size_t)b] = 0;
        }
        counts[b] += s;
    }
    for (int c = 0; c < NCOPIES; c++)
        for (int32_t b = ncount; b < stride; b++)
            sub[(size_t)c * (size_t)stride + (size_t)b] = 0;
}

/* ---- first-batch grid ------------------------------------------------------------------ */

void qcal_f32_histc__c(const float *x, int64_t n, const qcal_histc_grid *g, uint64_t *counts,
                       qcal_hist_sub *sub)
{
    const float lo = g->lo, hi = g->hi;
    const int32_t bins = g->bins, stride = bins + 2;
    const bool fast = qcal_histc_float_ok(lo, hi), absval = g->absval;
    int64_t since = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t b = qcal_histc_slot(x[i], lo, hi, bins, absval, fast);
        sub[(size_t)(i & (NCOPIES - 1)) * (size_t)stride + (size_t)b]++;
        if (++since == FLUSH_ELEMS) {
            qcal_hist_sub_flush(sub, stride, bins + 1, counts);
            since = 0;
        }
    }
    qcal_hist_sub_flush(sub, stride, bins + 1, counts);
}

bool qcal_f32_histc_inside__c(const float *x, int64_t n, const qcal_histc_grid *g,
                              uint64_t *counts, qcal_hist_sub *sub, float *mn, float *mx,
                              uint64_t *nonfinite)
{
    /* A min/max pass (the comparisons of qcal_f32_minmax__c), then binning. */
    float l = INFINITY, h = -INFINITY;
    uint64_t bad = 0;
    bool inside = true;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!qcal_f32_finite(v)) {
            bad++;
            continue;
        }
        l = v < l ? v : l;
        h = v > h ? v : h;
        float a = g->absval ? fabsf(v) : v;
        inside &= a >= g->lo && a <= g->hi;
    }
    *mn = l;
    *mx = h;
    *nonfinite = bad;
    if (inside)
        qcal_f32_histc__c(x, n, g, counts, sub);
    return inside;
}

/* ---- lattice --------------------------------------------------------------------------- */

void qcal_f32_lattice_bin__c(const float *x, int64_t n, const qcal_lattice_grid *g,
                             uint64_t *counts, qcal_hist_sub *sub)
{
    const int32_t stride = g->accept + 1;
    int64_t since = 0;
    for (int64_t i = 0; i < n; i++) {
        sub[(size_t)(i & (NCOPIES - 1)) * (size_t)stride + qcal_lattice_slot(x[i], g)]++;
        if (++since == FLUSH_ELEMS) {
            qcal_hist_sub_flush(sub, stride, g->accept, counts);
            since = 0;
        }
    }
    qcal_hist_sub_flush(sub, stride, g->accept, counts);
}

int64_t qcal_f32_lattice_bin_until__c(const float *x, int64_t n, const qcal_lattice_grid *g,
                                      uint64_t *counts, qcal_hist_sub *sub, float *mn,
                                      float *mx, uint64_t *nonfinite)
{
    /* Chunk by chunk: the min / max / non-finite of a chunk are kept only if every finite
     * value of it is inside; the binned prefix is then binned by the plain kernel. */
    float l = INFINITY, h = -INFINITY;
    uint64_t bad = 0;
    int64_t at = 0;
    for (; at < n; at += QCAL_HIST_CH) {
        int64_t m = n - at < QCAL_HIST_CH ? n - at : QCAL_HIST_CH;
        float cl = l, ch = h;
        uint64_t cb = 0;
        bool inside = true;
        for (int64_t i = at; i < at + m; i++) {
            float v = x[i];
            if (!qcal_f32_finite(v)) {
                cb++;
                continue;
            }
            cl = v < cl ? v : cl;
            ch = v > ch ? v : ch;
            inside &= qcal_lattice_slot(v, g) < (uint32_t)g->accept;
        }
        if (!inside)
            break;
        l = cl, h = ch, bad += cb;
    }
    if (at > n)
        at = n;
    qcal_f32_lattice_bin__c(x, at, g, counts, sub);
    *mn = l;
    *mx = h;
    *nonfinite = bad;
    return at;
}

/* ---- shared by the ISA files --------------------------------------------------------- */

bool qcal_hist_inside_finish(const float *x, int64_t n, int64_t nch, int64_t done, int ch,
                             bool outside, const qcal_histc_grid *hg, uint64_t *counts,
                             qcal_hist_sub *sub, float *mn, float *mx, uint64_t *nonfinite,
                             qcal_hist_minmax_fn mm)
{
    float l = *mn, h = *mx, tl, th;
    uint64_t bad = *nonfinite, tb;
    bool inside = !outside;
    if (done < nch) {
        mm(x + done * ch, n - done * ch, &tl, &th, &tb);
    } else if (nch * ch < n) {
        const float *t = x + nch * ch;
        int64_t m = n - nch * ch;
        inside &= qcal_f32_histc_inside__c(t, m, hg, counts, sub, &tl, &th, &tb);
    } else {
        tl = INFINITY, th = -INFINITY, tb = 0;
    }
    *mn = tl < l ? tl : l;
    *mx = th > h ? th : h;
    *nonfinite = bad + tb;
    return inside;
}

int64_t qcal_hist_until_tail(const float *x, int64_t n, int64_t at, const qcal_lattice_grid *g,
                             uint64_t *counts, qcal_hist_sub *sub, float *mn, float *mx,
                             uint64_t *nonfinite)
{
    float tl, th;
    uint64_t tb;
    int64_t r = qcal_f32_lattice_bin_until__c(x + at, n - at, g, counts, sub, &tl, &th, &tb);
    *mn = tl < *mn ? tl : *mn;
    *mx = th > *mx ? th : *mx;
    *nonfinite += tb;
    return at + r;
}

/* ---- table ----------------------------------------------------------------------------- */

void qcal_histogram_dsp_init(qcal_histogram_dsp *dsp, qcal_isa isa)
{
    dsp->histc = qcal_f32_histc__c;
    dsp->histc_inside = qcal_f32_histc_inside__c;
    dsp->lattice_bin = qcal_f32_lattice_bin__c;
    dsp->lattice_bin_until = qcal_f32_lattice_bin_until__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_histogram_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_histogram_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(histogram)
