/* Min/max kernel family: C references and the function table (observers/minmax_dsp.h). */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "observers/minmax_dsp.h"

static inline bool finite_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (u & QCAL_F32_EXP_MASK) != QCAL_F32_EXP_MASK;
}

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

void qcal_minmax_dsp_init(qcal_minmax_dsp *dsp, qcal_isa isa)
{
    dsp->minmax = qcal_f32_minmax__c;
    dsp->minmax_cols = qcal_f32_minmax_cols__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_minmax_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_minmax_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(minmax)
