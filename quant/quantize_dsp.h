/* Quantize kernel family (kernel layer, core/dsp.h): float32 -> integer codes and back, with
 * the arithmetic of PyTorch 1.13 (quant/quantize.c documents the rounding contract).
 *
 * Contract for the quantize kernels: q = clamp(nearbyintf(x * inv), lo, hi) + zp with
 * lo = qmin - zp, hi = qmax - zp (the dtype's range) clamped in float before rounding, NaN
 * -> zp (the NaN policy of qcal/quantize.h), round half to even. Every ISA gives the C
 * reference's bits. Dequantize: x = (float)(q - zp) * scale (C only: the compiler
 * vectorises it). */
#ifndef QCAL_QUANT_QUANTIZE_DSP_H
#define QCAL_QUANT_QUANTIZE_DSP_H

#include <stdint.h>

#include "core/dsp.h"

/* n floats x into n codes with one inv = 1.0f / scale and zero-point zp (n >= 0). */
typedef void (*qcal_f32_quantize_u8_fn)(const float *x, int64_t n, float inv, int32_t zp,
                                        uint8_t *dst);
typedef void (*qcal_f32_quantize_i8_fn)(const float *x, int64_t n, float inv, int32_t zp,
                                        int8_t *dst);
typedef void (*qcal_f32_quantize_i32_fn)(const float *x, int64_t n, float inv, int32_t zp,
                                         int32_t *dst);
/* Per-position parameters (per-channel quantize with short channel runs): element i uses
 * inv[i], lo[i] = qmin - zp[i], hi[i] = qmax - zp[i] (floats) and zp[i]; 8-bit output for
 * quint8 and qint8 alike (the byte of q is the same for both types). */
typedef void (*qcal_f32_quantize_prow8_fn)(const float *x, int64_t n, const float *inv,
                                           const float *lo, const float *hi,
                                           const int32_t *zp, uint8_t *dst);
/* n codes q[off..off+n) into dst[0..n): (float)(q - zp) * scale (qint32: the difference in
 * int64). */
typedef void (*qcal_dequantize_fn)(const void *q, int64_t off, int64_t n, float scale,
                                   int32_t zp, float *dst);

typedef struct qcal_quantize_dsp {
    qcal_f32_quantize_u8_fn quantize_u8;
    qcal_f32_quantize_i8_fn quantize_i8;
    qcal_f32_quantize_i32_fn quantize_i32;       /* C only (biases: small tensors) */
    qcal_f32_quantize_prow8_fn quantize_prow8;
    qcal_dequantize_fn dequantize_u8;            /* C only */
    qcal_dequantize_fn dequantize_i8;            /* C only */
    qcal_dequantize_fn dequantize_i32;           /* C only */
} qcal_quantize_dsp;

void qcal_quantize_dsp_init(qcal_quantize_dsp *dsp, qcal_isa isa);
void qcal_quantize_dsp_init_avx2(qcal_quantize_dsp *dsp);
void qcal_quantize_dsp_init_avx512(qcal_quantize_dsp *dsp);
const qcal_quantize_dsp *qcal_quantize_dsp_get(void);

void qcal_f32_quantize_u8__c(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst);
void qcal_f32_quantize_u8__avx2(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst);
void qcal_f32_quantize_u8__avx512(const float *x, int64_t n, float inv, int32_t zp,
                                  uint8_t *dst);
void qcal_f32_quantize_i8__c(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst);
void qcal_f32_quantize_i8__avx2(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst);
void qcal_f32_quantize_i8__avx512(const float *x, int64_t n, float inv, int32_t zp,
                                  int8_t *dst);
void qcal_f32_quantize_i32__c(const float *x, int64_t n, float inv, int32_t zp, int32_t *dst);
void qcal_f32_quantize_prow8__c(const float *x, int64_t n, const float *inv, const float *lo,
                                const float *hi, const int32_t *zp, uint8_t *dst);
void qcal_f32_quantize_prow8__avx2(const float *x, int64_t n, const float *inv,
                                   const float *lo, const float *hi, const int32_t *zp,
                                   uint8_t *dst);
void qcal_f32_quantize_prow8__avx512(const float *x, int64_t n, const float *inv,
                                     const float *lo, const float *hi, const int32_t *zp,
                                     uint8_t *dst);
void qcal_u8_dequantize__c(const void *q, int64_t off, int64_t n, float scale, int32_t zp,
                           float *dst);
void qcal_i8_dequantize__c(const void *q, int64_t off, int64_t n, float scale, int32_t zp,
                           float *dst);
void qcal_i32_dequantize__c(const void *q, int64_t off, int64_t n, float scale, int32_t zp,
                            float *dst);

#endif
