/* Half-precision to float32 conversion kernel family (kernel layer, core/dsp.h; used by
 * the safetensors reader). Exact conversions: every F16/BF16 value is representable in
 * float32; a NaN stays NaN with its payload and comes out quiet. */
#ifndef QCAL_IO_HALF_DSP_H
#define QCAL_IO_HALF_DSP_H

#include <stddef.h>
#include <stdint.h>

#include "core/dsp.h"

/* One value. */
float qcal_f16_to_f32(uint16_t h);
float qcal_bf16_to_f32(uint16_t b);

/* dst[0..n) = src[0..n) converted; src may be unaligned (raw little-endian file bytes). */
typedef void (*qcal_half_to_f32_fn)(const void *src, size_t n, float *dst);

typedef struct qcal_half_dsp {
    qcal_half_to_f32_fn f16_to_f32;
    qcal_half_to_f32_fn bf16_to_f32;
} qcal_half_dsp;

void qcal_half_dsp_init(qcal_half_dsp *dsp, qcal_isa isa);
void qcal_half_dsp_init_avx512(qcal_half_dsp *dsp);
const qcal_half_dsp *qcal_half_dsp_get(void);

void qcal_f16_to_f32_n__c(const void *src, size_t n, float *dst);
void qcal_f16_to_f32_n__avx512(const void *src, size_t n, float *dst);
/* BF16 has only the C reference: a shift and a NaN check that the compiler vectorises;
 * AVX2 / AVX-512 versions were no faster (memory bound; docs/performance.md). */
void qcal_bf16_to_f32_n__c(const void *src, size_t n, float *dst);

#endif
