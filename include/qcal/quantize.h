/* qcal quantize / dequantize: float32 tensors to and from uint8 / int8 / int32 with given
 * qparams, bit-identical to PyTorch 1.13 on x86 (torch.quantize_per_tensor(...).int_repr(),
 * torch.quantize_per_channel(...).int_repr(), Tensor.dequantize()).
 *
 * Rounding contract (as fbgemm/ATen): q = clamp(zero_point + nearbyintf(x * (1.0f / scale)),
 * qmin, qmax) for quint8/qint8, computed in float32, round half to even; for qint32
 * (ATen's generic path) q = clamp(zero_point + nearbyintf(x / scale)) in float32 division.
 * The clamp is to the full dtype range ([0,255], [-128,127], [-2^31, 2^31-1]), as PyTorch:
 * custom (e.g. 4-bit) ranges apply to qparams, not to quantize.
 * Non-finite and huge inputs: +Inf and values above the range give qmax, -Inf and values
 * below give qmin, NaN gives the zero-point (dequantizes to 0.0). PyTorch 1.13 on x86
 * converts through an out-of-range float->int64 cast (undefined behaviour) and yields qmin
 * for NaN, +-Inf and every |x/scale| >= 2^63: a defect qcal does not reproduce.
 * Dequantize: x = (float)(q - zero_point) * scale in float32, as PyTorch.
 * Every scale must satisfy scale > 0 && isfinite(scale) and every zero-point must lie in
 * the dtype's range; otherwise QCAL_ERR_INVALID_ARG and dst untouched. */
#ifndef QCAL_QUANTIZE_H
#define QCAL_QUANTIZE_H

#include "qcal/common.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes per quantized element: 1 for quint8/qint8, 4 for qint32, 0 for an unknown dtype. */
QCAL_API size_t qcal_dtype_size(qcal_dtype dtype);

/* Quantizes src (numel elements) into dst (caller-owned, numel * qcal_dtype_size(dtype)
 * bytes: uint8_t for quint8, int8_t for qint8, int32_t for qint32). src->data read only. */
QCAL_API qcal_status qcal_quantize_per_tensor(const qcal_tensor *src, float scale,
                                              int32_t zero_point, qcal_dtype dtype, void *dst);

/* Per-channel quantize along axis (negative counts from the end) with channels ==
 * src->shape[axis] scales / zero-points (caller-owned arrays). dst as above. Same
 * arithmetic as torch.quantize_per_channel. */
QCAL_API qcal_status qcal_quantize_per_channel(const qcal_tensor *src, int32_t axis,
                                               int64_t channels, const float *scales,
                                               const int32_t *zero_points, qcal_dtype dtype,
                                               void *dst);

/* Dequantizes src (numel(dst) elements of dtype, caller-owned) into dst->data
 * (caller-owned; dst->shape gives the count): x = (q - zero_point) * scale. */
QCAL_API qcal_status qcal_dequantize_per_tensor(const void *src, qcal_dtype dtype, float scale,
                                                int32_t zero_point, qcal_tensor *dst);

/* Per-channel dequantize along axis of dst->shape (negative counts from the end);
 * channels must equal dst->shape[axis]. */
QCAL_API qcal_status qcal_dequantize_per_channel(const void *src, qcal_dtype dtype,
                                                 int32_t axis, int64_t channels,
                                                 const float *scales,
                                                 const int32_t *zero_points,
                                                 qcal_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
