/* Half-precision to float32 conversion kernels (defined in io/safetensors.c). Internal.
 * Exact conversions: every F16/BF16 value is representable in float32; NaN stays NaN. */
#ifndef QCAL_IO_HALF_H
#define QCAL_IO_HALF_H

#include <stddef.h>
#include <stdint.h>

float qcal_f16_to_f32(uint16_t h);
float qcal_bf16_to_f32(uint16_t b);

/* src may be unaligned (raw file bytes, little-endian); dst[0..n). */
void qcal_f16_to_f32_n__c(const void *src, size_t n, float *dst);
void qcal_f16_to_f32_n__avx512(const void *src, size_t n, float *dst);
void qcal_bf16_to_f32_n__c(const void *src, size_t n, float *dst);
/* Dispatching versions (qcal_cpu_isa()). */
void qcal_f16_to_f32_n(const void *src, size_t n, float *dst);
void qcal_bf16_to_f32_n(const void *src, size_t n, float *dst);

#endif
