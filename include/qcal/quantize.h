/* qcal quantize / dequantize: float32 tensors to and from uint8 / int8 / int32 with given
 * qparams, bit-identical to PyTorch 1.13 on x86 (torch.quantize_per_tensor(...).int_repr(),
 * torch.quantize_per_channel(...).int_repr(), Tensor.dequantize()).
 *
 * Rounding contract (as fbgemm/ATen): q = clamp(zero_point + nearbyintf(x * (1.0f / scale)),
 * qmin, qmax) for quint8/qint8, computed in float32, round half to even; for qint32
 * (ATen's generic path) q = clamp(zero_point + nearbyintf(x / scale)) in float32 division.
 * The clamp is to the full dtype range ([0,255], [-128,127], [-2^31, 2^31-1]), as PyTorch:
 * custom (e.g. 4-bit) ranges apply to qparams, not to quantize.
 * Non-finite and huge inputs (the NaN policy shared with fake-quant, qcal/fakequant.h):
 * +Inf and values above the range give qmax, -Inf and values below give qmin, NaN gives
 * the zero-point (dequantizes to 0.0). PyTorch 1.13 on x86
 * converts through an out-of-range float->int64 cast (undefined behaviour) and yields qmin
 * for NaN, +-Inf and every |x/scale| >= 2^63: a defect qcal does not reproduce.
 * Dequantize: x = (float)(q - zero_point) * scale in float32, as PyTorch.
 * Every scale must satisfy scale > 0 && isfinite(scale) and every zero-point must lie in
 * [quant_min, quant_max] (within the dtype's range); otherwise QCAL_ERR_INVALID_ARG and dst
 * untouched. Large tensors use OpenMP; results do not depend on the thread count.
 *
 * FP8 dtypes (QCAL_FLOAT8_E4M3FN, QCAL_FLOAT8_E5M2; docs/fp8.md): codes are the 8-bit float
 * encodings (one uint8_t each), bit-identical to ONNX Runtime 1.30's QuantizeLinear /
 * DequantizeLinear with float8 zero-points (saturate=1): code = RNE(x / scale) in float32
 * division, ties to even on the format's grid (subnormals included), |x / scale| beyond the
 * largest finite value and +-Inf saturate to +-448 / +-57344, NaN -> 0x7F / 0xFF (its sign),
 * -0 -> 0x80; dequantize: value(code) * scale (NaN codes give the quiet NaN with their sign,
 * E5M2's 0x7C / 0xFC give +-Inf). Zero-points must be 0 (per channel: may be NULL). */
#ifndef QCAL_QUANTIZE_H
#define QCAL_QUANTIZE_H

#include "qcal/common.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantizes src into dst (caller-owned, numel * qcal_dtype_size(qp->dtype) bytes, see
 * qcal/qparams.h: uint8_t for quint8 and the FP8 codes, int8_t for qint8, int32_t for
 * qint32) with qp, per-tensor or per-channel
 * (channel axis qp->axis of src, qp->channels == src->shape[axis]) as qp->qscheme says:
 * torch.quantize_per_tensor / torch.quantize_per_channel(...).int_repr(). The clamp is to
 * the dtype's full range (qp->quant_min/quant_max only bound the zero-points). qp must
 * validate (qcal_qparams_validate); float-qparams is QCAL_ERR_UNSUPPORTED. src->data read only. */
QCAL_API qcal_status qcal_quantize(const qcal_tensor *src, const qcal_qparams *qp, void *dst);

/* Dequantizes src (numel(dst) elements of qp->dtype, caller-owned) into dst->data
 * (caller-owned; dst->shape gives the count and, per-channel, the channel axis):
 * x = (q - zero_point) * scale. Same qparams rules as qcal_quantize. */
QCAL_API qcal_status qcal_dequantize(const void *src, const qcal_qparams *qp, qcal_tensor_mut *dst);

#ifdef __cplusplus
}
#endif
#endif
