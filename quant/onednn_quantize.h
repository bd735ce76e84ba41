/* Input quantization kernels of the int8 runtime: float32 -> quint8 per-tensor affine, fused
 * with a count of the non-finite inputs (qcal_quantize_per_tensor in quant/quantize.c has the
 * same arithmetic without the count).
 * Not installed. */
#ifndef QCAL_QUANT_ONEDNN_QUANTIZE_H
#define QCAL_QUANT_ONEDNN_QUANTIZE_H

#include <stdint.h>

/* dst[i] = clamp(zp + nearbyintf(src[i] * inv_scale), 0, 255), computed in float32 (round half
 * to even under the default rounding mode, clamp in float before converting); NaN gives zp,
 * +-Inf saturate. Returns the number of non-finite src values. n >= 0. */
typedef int64_t (*qcal_f32_quantize_u8_count_fn)(const float *src, int64_t n, float inv_scale,
                                           int32_t zp, uint8_t *dst);

int64_t qcal_f32_quantize_u8_count__c(const float *src, int64_t n, float inv_scale, int32_t zp,
                                uint8_t *dst);
int64_t qcal_f32_quantize_u8_count__avx2(const float *src, int64_t n, float inv_scale, int32_t zp,
                                   uint8_t *dst);
int64_t qcal_f32_quantize_u8_count__avx512(const float *src, int64_t n, float inv_scale, int32_t zp,
                                     uint8_t *dst);

/* The best version for this CPU (qcal_cpu_isa(), capped by QCAL_ISA). */
qcal_f32_quantize_u8_count_fn qcal_f32_quantize_u8_count_best(void);

/* Runs the best kernel over n elements, threaded above qcal_threads_for(n) (independent
 * chunks; the count is summed in chunk order). Returns the non-finite count. */
int64_t qcal_f32_quantize_u8_count(const float *src, int64_t n, float inv_scale, int32_t zp,
                             uint8_t *dst);

#endif
