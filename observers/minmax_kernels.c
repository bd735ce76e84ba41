/* Threaded min/max drivers over the min/max kernel family (see minmax_kernels.h; the
 * kernels themselves are observers/minmax_c.c, minmax_avx2.c, minmax_avx512.c). */
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "observers/minmax_kernels.h"
#include "qcal_config.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

#define MAX_PARTS 64

/* ---- drivers ---------------------------------------------------------------------- */

static int cap_threads(int nt)
{
    return nt > MAX_PARTS ? MAX_PARTS : nt;
}

void qcal_f32_minmax(const float *x, int64_t n, float *mn, float *mx, uint64_t *nonfinite)
{
    qcal_f32_minmax_fn f = qcal_minmax_dsp_get()->minmax;
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
    qcal_f32_minmax_fn f = qcal_minmax_dsp_get()->minmax;
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
    qcal_f32_minmax_cols_fn f = qcal_minmax_dsp_get()->minmax_cols;
    int64_t w = channels * inner, n = outer * w;
    int nt = cap_threads(qcal_threads_for(n));
    if (outer < nt)
        nt = (int)(outer < 1 ? 1 : outer);
    if (nt == 1 && inner == 1) {
        /* One thread, one value per channel per row: the columns are the channels, so the
         * kernel folds straight into mn / mx (the same folds, in the same order). */
        for (int64_t c = 0; c < channels; c++) {
            mn[c] = INFINITY;
            mx[c] = -INFINITY;
        }
        *nonfinite = 0;
        f(x, outer, w, mn, mx, nonfinite);
        return true;
    }
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
