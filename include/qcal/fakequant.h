/* qcal fake quantization: quantize-dequantize with straight-through gradients for
 * quantization-aware training (QAT) in C training loops, with the arithmetic of PyTorch
 * 1.13's ATen CPU kernels (fake_quantize_per_{tensor,channel}_affine_cachemask,
 * _fake_quantize_learnable_per_{tensor,channel}_affine), and the FakeQuantize object.
 *
 * Rounding contract (forward, bit-identical to PyTorch 1.13 for every finite input whose
 * x / scale is below 2^63 in magnitude):
 *   inv_scale = 1.0f / scale                         (float)
 *   q         = (float)zero_point + nearbyintf(x * inv_scale)   (float add, round half to even)
 *   mask      = quant_min <= q <= quant_max          (false for NaN)
 *   y         = (clamp(q, quant_min, quant_max) - zero_point) * scale   (float)
 * NaN policy (shared with qcal/quantize.h): NaN -> the zero-point, so y = 0.0; +Inf and
 * values above the range -> quant_max; -Inf and values below -> quant_min; the mask is 0
 * for NaN and +-Inf. PyTorch 1.13 differs: it casts q to int64, which turns NaN, +-Inf and
 * |q| >= 2^63 into INT64_MIN, so NaN and +Inf (and huge positive values) come out as
 * (quant_min - zero_point) * scale. qcal maps NaN to the zero-point so that QAT simulates
 * what quantize (and the int8 path) does with a NaN: a zero.
 * Backward (straight-through estimator): grad_x = mask ? grad_y : 0.
 *
 * FP8 dtypes (QCAL_FLOAT8_E4M3FN, QCAL_FLOAT8_E5M2; docs/fp8.md): y = dequantize(quantize(x))
 * with the FP8 arithmetic of qcal/quantize.h (x / scale, round half to even on the format's
 * grid, saturating to +-largest; NaN stays NaN, -0 stays -0), and mask = 1 where the
 * unsaturated rounding of x / scale stays within +-largest, i.e. |x / scale| <= 464 (E4M3FN)
 * or < 61440 (E5M2); 0 for NaN and +-Inf. The backward is the same straight-through
 * estimator. FP8 has no learnable (LSQ) calls (QCAL_ERR_UNSUPPORTED).
 *
 * Buffers: the caller owns every array; the library keeps none of them. Where documented,
 * dst may equal src (in place). Large tensors use OpenMP (results do not depend on the
 * thread count); AVX2 / AVX-512 kernels are chosen at run time (QCAL_ISA caps them). */
#ifndef QCAL_FAKEQUANT_H
#define QCAL_FAKEQUANT_H

#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest |quant_min|, |quant_max| the kernels accept (integers stay exact in float). */
#define QCAL_FAKEQUANT_QRANGE_LIMIT (1 << 24)

/* ---------------------------------------------------------------------------------------
 * Fake-quant with given qparams: one call per operation; per-tensor or per-channel (channel
 * axis qp->axis of src, qp->channels == src->shape[axis]) as qp->qscheme says. Every call
 * takes read-only source views (qcal_tensor), the qparams, and writable destination views
 * (qcal_tensor_mut); a destination holds numel(src) floats (QCAL_ERR_MISMATCH otherwise; its
 * shape is not otherwise used) and may be the source's buffer (in place).
 * Checked on every call: qp validates (qcal_qparams_validate) and |quant_min|, |quant_max|
 * <= QCAL_FAKEQUANT_QRANGE_LIMIT (a qint32 dtype for ranges wider than 8 bits); fixed
 * calls need integer zero-points (per_channel_affine_float_qparams is
 * QCAL_ERR_UNSUPPORTED). An empty source is QCAL_ERR_EMPTY. Failures leave every output
 * untouched. */

/* Forward (fake_quantize_per_{tensor,channel}_affine): dst = fake-quant(src). mask
 * (numel bytes, may be NULL) gets 1 where the unclamped q was inside [quant_min, quant_max]. */
QCAL_API qcal_status qcal_fakequant_forward(const qcal_tensor *src, const qcal_qparams *qp,
                                            qcal_tensor_mut *dst, uint8_t *mask);

/* Straight-through backward: grad_x[i] = mask[i] ? grad_y[i] : 0 (grad_x == grad_y
 * allowed); mask from any forward (fixed or learnable). */
QCAL_API qcal_status qcal_fakequant_backward(const qcal_tensor *grad_y, const uint8_t *mask,
                                             qcal_tensor_mut *grad_x);

/* Fused forward + backward in one pass (no mask array): dst = fake-quant(src), grad_x =
 * straight-through(grad_y). grad_y and grad_x hold numel(src) floats. */
QCAL_API qcal_status qcal_fakequant_fused(const qcal_tensor *src, const qcal_tensor *grad_y,
                                          const qcal_qparams *qp, qcal_tensor_mut *dst,
                                          qcal_tensor_mut *grad_x);

/* ---------------------------------------------------------------------------------------
 * Learnable qparams (LSQ; torch._fake_quantize_learnable_per_{tensor,channel}_affine):
 * the zero-points are the FLOAT ones (qp->zero_point_float / qp->zero_points_float; the
 * integer ones are ignored). The forward rounds each half to even and clamps it to
 * [quant_min, quant_max] (as PyTorch). PyTorch 1.13's per-tensor *backward* instead uses
 * trunc(clamp(zero_point + 0.5)) (a defect: different from the forward for .5 ties and
 * negative zero-points); qcal uses the forward's rounding in both directions.
 * Gradients (per element, float, as ATen; q = nearbyintf(zp + x * inv_scale)):
 *   q < quant_min: d_scale = grad_y * (quant_min - zp) * g, d_zp = -grad_y * scale * g
 *   q > quant_max: d_scale = grad_y * (quant_max - zp) * g, d_zp = -grad_y * scale * g
 *   otherwise:     d_scale = grad_y * (y - x) * inv_scale * g, d_zp = 0
 *   x NaN:         d_scale = d_zp = 0, grad_x = 0 (the NaN policy: y is 0.0, constant)
 * with g = grad_factor; grad_x = grad_y inside, 0 outside. grad_scale/grad_zero_point are
 * the sums over elements (per channel: over all but the channel axis), accumulated in
 * double over fixed blocks combined in a fixed order: identical for any thread count.
 * Scales must be > 0 and finite (QCAL_ERR_INVALID_ARG otherwise); the FakeQuantize object
 * clamps learned scales to >= eps before use, as PyTorch's _LearnableFakeQuantize. */

/* LSQ grad_factor as _LearnableFakeQuantize(use_grad_scaling=True):
 * 1 / sqrt(numel * quant_max), computed in double. numel >= 1 and quant_max >= 1. */
QCAL_API qcal_status qcal_fakequant_grad_factor(int64_t numel, int64_t quant_max,
                                                double *out);

/* Learnable forward: the fixed forward with the rounded, clamped float zero-points. */
QCAL_API qcal_status qcal_fakequant_learnable_forward(const qcal_tensor *src,
                                                      const qcal_qparams *qp,
                                                      qcal_tensor_mut *dst, uint8_t *mask);

/* Learnable backward: grad_x (may be NULL; grad_x == grad_y allowed); grad_scale and
 * grad_zero_point get qp->channels sums each (overwritten, not accumulated). */
QCAL_API qcal_status qcal_fakequant_learnable_backward(const qcal_tensor *src,
                                                       const qcal_tensor *grad_y,
                                                       const qcal_qparams *qp,
                                                       float grad_factor,
                                                       qcal_tensor_mut *grad_x,
                                                       float *grad_scale,
                                                       float *grad_zero_point);

/* ---------------------------------------------------------------------------------------
 * The FakeQuantize object (torch.ao.quantization.FakeQuantize, and _LearnableFakeQuantize
 * in learnable mode): forward(x) updates the observer (when enabled), recomputes the
 * qparams from it, fake-quantizes (when enabled) and records the mask; backward(grad)
 * applies the mask (and in learnable mode accumulates grad_scale / grad_zero_point).
 * The same convention as the functions above: read-only source views (qcal_tensor),
 * writable destination views (qcal_tensor_mut, qcal/tensor.h) of numel(source) floats.
 *
 *   qcal_fakequant_module_config cfg;
 *   qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL);
 *   qcal_fakequant_module *fq = NULL;
 *   qcal_fakequant_module_create(&cfg, &fq);
 *   per step: qcal_fakequant_module_forward(fq, &w, &w_fq);       // w: qcal_tensor, w_fq: qcal_tensor_mut
 *             ... qcal_fakequant_module_backward(fq, &g_fq, &g_w);  // g_fq: qcal_tensor, g_w: qcal_tensor_mut
 *   qcal_fakequant_module_destroy(&fq);
 *
 * Not thread-safe: one object per quantized tensor, used by one thread at a time. */

typedef enum qcal_fakequant_preset {
    /* PyTorch's default QAT activation fake-quant (get_default_qat_qconfig('x86'/'fbgemm')):
     * moving-average MinMax, quint8, per_tensor_affine, reduce_range (effective [0, 127]),
     * averaging constant 0.01. */
    QCAL_FAKEQUANT_PRESET_ACTIVATION = 0,
    /* default_per_channel_weight_fake_quant: moving-average per-channel MinMax, qint8
     * [-128, 127], per_channel_symmetric, axis 0, averaging constant 0.01. */
    QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL = 1,
    /* default_weight_fake_quant: moving-average MinMax, qint8 [-128, 127],
     * per_tensor_symmetric, averaging constant 0.01. */
    QCAL_FAKEQUANT_PRESET_WEIGHT_PER_TENSOR = 2,
    /* Activation preset without reduce_range (qnnpack / onednn): quint8 [0, 255]. */
    QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE = 3,
} qcal_fakequant_preset;

typedef struct qcal_fakequant_module_config {
    qcal_observer_config observer;  /* default: the preset's observer (see qcal_fakequant_preset);
                                     * any per-tensor or per-channel kind works */
    bool learnable;                 /* default false; true: LSQ (_LearnableFakeQuantize).
                                     * Learned only while the observer is off: with it on
                                     * (from create until freeze_after steps, freeze or
                                     * enable_observer(fq, false)) every forward OVERWRITES
                                     * the learned scale/zero-point with the observer's
                                     * qparams and backward accumulates no gradient for
                                     * them, as PyTorch's _LearnableFakeQuantize does. */
    bool use_grad_scaling;          /* learnable: default false; true: grad_factor =
                                     * 1/sqrt(numel * quant_max) */
    float init_scale;               /* learnable: initial scale, default 1.0 */
    float init_zero_point;          /* learnable: initial zero-point, default 0.0 */
    int64_t channels;               /* learnable per-channel: parameter count; default 0 =
                                     * taken from the first forward's shape[axis] */
    int64_t freeze_after;           /* default 0 = never; N > 0: after N forward steps the
                                     * observer is disabled and the qparams stay fixed */
} qcal_fakequant_module_config;

typedef struct qcal_fakequant_module qcal_fakequant_module;

/* Fills *cfg with the preset's defaults (documented on each field above). */
QCAL_API void qcal_fakequant_module_config_default(qcal_fakequant_module_config *cfg,
                                                qcal_fakequant_preset preset);

/* Creates a FakeQuantize object (observer and fake-quant enabled, step 0); *out owned by
 * the caller, release with qcal_fakequant_module_destroy. */
QCAL_API qcal_status qcal_fakequant_module_create(const qcal_fakequant_module_config *cfg,
                                               qcal_fakequant_module **out);

/* Destroys *fq (NULL or *fq == NULL is fine) and sets *fq to NULL. */
QCAL_API void qcal_fakequant_module_destroy(qcal_fakequant_module **fq);

/* One training step's forward: observe x (if the observer is enabled and not frozen), take
 * the qparams, fake-quantize into y (a writable view of numel(x) floats, QCAL_ERR_MISMATCH
 * otherwise; y->data == x->data allowed) if fake-quant is enabled, else copy. Records the
 * mask (and, learnable, a copy of x) for backward. Counts the step; freezes when
 * freeze_after is reached. On failure nothing changes. */
QCAL_API qcal_status qcal_fakequant_module_forward(qcal_fakequant_module *fq, const qcal_tensor *x,
                                                   qcal_tensor_mut *y);

/* Backward of the last forward (QCAL_ERR_STATE without one): grad_y and grad_x hold the
 * forward's numel floats each (QCAL_ERR_MISMATCH otherwise; their shapes are not otherwise
 * used). grad_x = mask ? grad_y : 0 (grad_y if fake-quant was disabled); grad_x->data ==
 * grad_y->data allowed. Learnable: also adds to grad_scale/grad_zero_point. */
QCAL_API qcal_status qcal_fakequant_module_backward(qcal_fakequant_module *fq,
                                                    const qcal_tensor *grad_y,
                                                    qcal_tensor_mut *grad_x);

/* Switches (PyTorch's enable_observer / enable_fake_quant). */
QCAL_API qcal_status qcal_fakequant_module_enable_observer(qcal_fakequant_module *fq, bool enabled);
QCAL_API qcal_status qcal_fakequant_module_enable_fake_quant(qcal_fakequant_module *fq, bool enabled);

/* Freezes now: observer disabled for good, qparams fixed at their current values. */
QCAL_API qcal_status qcal_fakequant_module_freeze(qcal_fakequant_module *fq);

/* Current switches, frozen flag and forward step count (any output may be NULL). */
QCAL_API qcal_status qcal_fakequant_module_status(const qcal_fakequant_module *fq,
                                               bool *observer_enabled,
                                               bool *fake_quant_enabled, bool *frozen,
                                               int64_t *steps);

/* The qparams the last forward used (scale 1, zero-point 0 before any forward) into *out
 * (per-channel: library-owned arrays, release with qcal_qparams_free; *out is not freed
 * first). Learnable mode: integer zero-points rounded and clamped as the forward does,
 * float zero-points the learned ones. dtype, range and axis from the observer config;
 * qscheme per_tensor_affine or per_channel_affine. */
QCAL_API qcal_status qcal_fakequant_module_qparams(const qcal_fakequant_module *fq,
                                                   qcal_qparams *out);

/* Learnable mode: pointers to the object's parameters and their gradients (n values each,
 * owned by the object, valid until the next forward/load/destroy). The optimiser updates
 * *scale / *zero_point in place; the next forward clamps scales to >= eps. Gradients
 * accumulate over backward calls until qcal_fakequant_module_zero_grad. QCAL_ERR_STATE if
 * not learnable or not yet sized (per-channel before the first forward). */
QCAL_API qcal_status qcal_fakequant_module_params(qcal_fakequant_module *fq, float **scale,
                                               float **zero_point, float **grad_scale,
                                               float **grad_zero_point, int64_t *n);

/* Learnable mode: sets grad_scale / grad_zero_point to 0. */
QCAL_API qcal_status qcal_fakequant_module_zero_grad(qcal_fakequant_module *fq);

/* The observer inside (owned by the object; read-only use). */
QCAL_API qcal_status qcal_fakequant_module_observer(const qcal_fakequant_module *fq,
                                                 const qcal_observer **obs);

/* Serialises config, switches, step, qparams, learnable parameters and the observer state
 * (qcal_observer_save) into a new versioned little-endian buffer (free with qcal_free). */
QCAL_API qcal_status qcal_fakequant_module_save(const qcal_fakequant_module *fq, void **buf,
                                             size_t *len);

/* Creates an object from a qcal_fakequant_module_save blob; malformed is QCAL_ERR_FORMAT. */
QCAL_API qcal_status qcal_fakequant_module_load(const void *buf, size_t len,
                                             qcal_fakequant_module **out);

/* The same as files (written atomically: temporary then rename). */
QCAL_API qcal_status qcal_fakequant_module_save_file(const qcal_fakequant_module *fq,
                                                  const char *path);
QCAL_API qcal_status qcal_fakequant_module_load_file(const char *path, qcal_fakequant_module **out);

#ifdef __cplusplus
}
#endif
#endif
