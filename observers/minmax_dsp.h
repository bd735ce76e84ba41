/* Min/max kernel family (kernel layer, core/dsp.h): reductions over float32 that skip and
 * count non-finite values. Shared by the min/max observers, the histogram family and the
 * numeric suite through the threaded drivers of observers/minmax_kernels.h.
 *
 * Contract for every kernel: NaN and +-Inf never enter a result; they are counted. A range
 * with no finite value comes out as (+inf, -inf). Min/max are exact, so every ISA gives the
 * C reference's bits, except that the sign of a zero result may differ when both -0.0 and
 * +0.0 are present (they compare equal). */
#ifndef QCAL_OBSERVERS_MINMAX_DSP_H
#define QCAL_OBSERVERS_MINMAX_DSP_H

#include <stdint.h>

#include "core/dsp.h"

/* A float is NaN or +-Inf exactly when these exponent bits are all ones. */
#define QCAL_F32_EXP_MASK 0x7f800000u

/* Min and max of the finite values of x[0..n) into *mn / *mx ((+inf, -inf) if none), the
 * number of non-finite values into *nonfinite. n >= 0; x may be NULL when n == 0. */
typedef void (*qcal_f32_minmax_fn)(const float *x, int64_t n, float *mn, float *mx,
                                   uint64_t *nonfinite);

/* Columns: for rows r in [0, rows), cmn[j] = min(cmn[j], x[r*width + j]) over finite values
 * (likewise cmx), accumulating into the caller's arrays; *nonfinite += count. */
typedef void (*qcal_f32_minmax_cols_fn)(const float *x, int64_t rows, int64_t width,
                                        float *cmn, float *cmx, uint64_t *nonfinite);

typedef struct qcal_minmax_dsp {
    qcal_f32_minmax_fn minmax;
    qcal_f32_minmax_cols_fn minmax_cols;
} qcal_minmax_dsp;

void qcal_minmax_dsp_init(qcal_minmax_dsp *dsp, qcal_isa isa);
void qcal_minmax_dsp_init_avx2(qcal_minmax_dsp *dsp);
void qcal_minmax_dsp_init_avx512(qcal_minmax_dsp *dsp);
const qcal_minmax_dsp *qcal_minmax_dsp_get(void);

void qcal_f32_minmax__c(const float *x, int64_t n, float *mn, float *mx, uint64_t *nonfinite);
void qcal_f32_minmax__avx2(const float *x, int64_t n, float *mn, float *mx,
                           uint64_t *nonfinite);
void qcal_f32_minmax__avx512(const float *x, int64_t n, float *mn, float *mx,
                             uint64_t *nonfinite);
void qcal_f32_minmax_cols__c(const float *x, int64_t rows, int64_t width, float *cmn,
                             float *cmx, uint64_t *nonfinite);
void qcal_f32_minmax_cols__avx2(const float *x, int64_t rows, int64_t width, float *cmn,
                                float *cmx, uint64_t *nonfinite);
void qcal_f32_minmax_cols__avx512(const float *x, int64_t rows, int64_t width, float *cmn,
                                  float *cmx, uint64_t *nonfinite);

#endif
