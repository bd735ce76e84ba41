/* FP8 kernel family (kernel layer, core/dsp.h): float32 <-> float8_e4m3fn / float8_e5m2
 * codes with a scale, and FP8 fake-quant forward / fused forward + straight-through
 * backward. The contract (docs/fp8.md, bit-exact with ONNX Runtime 1.30's QuantizeLinear /
 * DequantizeLinear, opset 19, saturate=1):
 *
 *   v    = x / scale                         float32 division (as ONNX Runtime; not x * 1/scale)
 *   code = sign(v) | RNE(|v|) saturated      round to nearest, ties to even, on the format's
 *                                            grid (subnormals included); |v| above the largest
 *                                            finite value (and +-Inf) -> +-largest (0x7E / 0x7B);
 *                                            NaN -> sign | 0x7F; -0 -> 0x80
 *   y    = value(code) * scale               float32 (NaN codes: 0x7FC00000 | sign)
 *   mask = |v| <= bound                      the unsaturated RNE of v is finite and within
 *                                            +-largest: bound 464 (E4M3FN; 464 ties to 448) and
 *                                            the float below 61440 (E5M2; 61440 ties to Inf);
 *                                            0 for NaN and +-Inf
 *
 * quant/float8_kernels.h holds the scalar element functions (the definition of the bits);
 * every ISA version gives the C reference's bits. `fmt` is a qcal_f8_fmt. */
#ifndef QCAL_QUANT_FLOAT8_DSP_H
#define QCAL_QUANT_FLOAT8_DSP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dsp.h"

typedef enum qcal_f8_fmt {
    QCAL_F8_E4M3FN = 0,
    QCAL_F8_E5M2 = 1,
} qcal_f8_fmt;

/* n floats x into n codes: encode(x[i] / scale). `stream`: non-temporal stores for the
 * codes (ISA versions; values identical either way). */
typedef void (*qcal_f32_quantize_f8_fn)(const float *x, int64_t n, float scale, int fmt,
                                        uint8_t *dst, bool stream);
/* n codes into n floats: value(q[i]) * scale. */
typedef void (*qcal_f8_dequantize_fn)(const uint8_t *q, int64_t n, float scale, int fmt,
                                      float *dst);
/* Fake-quant forward: dst[i] = value(encode(src[i] / scale)) * scale; mask (may be NULL)
 * as above. dst may equal src. `stream`: non-temporal stores for the outputs (ISA versions;
 * values identical either way). */
typedef void (*qcal_f32_fakequant_f8_fn)(const float *src, int64_t n, float scale, int fmt,
                                         float *dst, uint8_t *mask, bool stream);
/* Fused forward + backward: dst as the forward, gx[i] = gy[i] * (mask ? 1.0f : 0.0f) (a
 * real multiply, as the integer fake-quant: a masked-out -g gives -0, NaN stays NaN). */
typedef void (*qcal_f32_fakequant_f8_fused_fn)(const float *src, const float *gy, int64_t n,
                                               float scale, int fmt, float *dst, float *gx,
                                               bool stream);

typedef struct qcal_float8_dsp {
    qcal_f32_quantize_f8_fn quantize;
    qcal_f8_dequantize_fn dequantize;
    qcal_f32_fakequant_f8_fn fakequant;
    qcal_f32_fakequant_f8_fused_fn fakequant_fused;
} qcal_float8_dsp;

void qcal_float8_dsp_init(qcal_float8_dsp *dsp, qcal_isa isa);
void qcal_float8_dsp_init_avx2(qcal_float8_dsp *dsp);
void qcal_float8_dsp_init_avx512(qcal_float8_dsp *dsp);
const qcal_float8_dsp *qcal_float8_dsp_get(void);

void qcal_f32_quantize_f8__c(const float *x, int64_t n, float scale, int fmt, uint8_t *dst,
                             bool stream);
void qcal_f32_quantize_f8__avx2(const float *x, int64_t n, float scale, int fmt, uint8_t *dst,
                                bool stream);
void qcal_f32_quantize_f8__avx512(const float *x, int64_t n, float scale, int fmt,
                                  uint8_t *dst, bool stream);
void qcal_f8_dequantize__c(const uint8_t *q, int64_t n, float scale, int fmt, float *dst);
void qcal_f8_dequantize__avx2(const uint8_t *q, int64_t n, float scale, int fmt, float *dst);
void qcal_f8_dequantize__avx512(const uint8_t *q, int64_t n, float scale, int fmt, float *dst);
void qcal_f32_fakequant_f8__c(const float *src, int64_t n, float scale, int fmt, float *dst,
                              uint8_t *mask, bool stream);
void qcal_f32_fakequant_f8__avx2(const float *src, int64_t n, float scale, int fmt,
                                 float *dst, uint8_t *mask, bool stream);
void qcal_f32_fakequant_f8__avx512(const float *src, int64_t n, float scale, int fmt,
                                   float *dst, uint8_t *mask, bool stream);
void qcal_f32_fakequant_f8_fused__c(const float *src, const float *gy, int64_t n, float scale,
                                    int fmt, float *dst, float *gx, bool stream);
void qcal_f32_fakequant_f8_fused__avx2(const float *src, const float *gy, int64_t n,
                                       float scale, int fmt, float *dst, float *gx,
                                       bool stream);
void qcal_f32_fakequant_f8_fused__avx512(const float *src, const float *gy, int64_t n,
                                         float scale, int fmt, float *dst, float *gx,
                                         bool stream);

#endif
