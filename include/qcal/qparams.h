/* qcal qparams: scale / zero-point from a min/max range, with the arithmetic of
 * torch.ao.quantization.observer.UniformQuantizationObserverBase._calculate_qparams
 * (PyTorch 1.13). */
#ifndef QCAL_QPARAMS_H
#define QCAL_QPARAMS_H

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_dtype {
    QCAL_QUINT8 = 0,   /* [0, 255]            (reduce_range: [0, 127]) */
    QCAL_QINT8 = 1,    /* [-128, 127]         (reduce_range: [-64, 63]) */
    QCAL_QINT32 = 2,   /* [-2^31, 2^31 - 1] */
} qcal_dtype;

typedef enum qcal_qscheme {
    QCAL_PER_TENSOR_AFFINE = 0,
    QCAL_PER_TENSOR_SYMMETRIC = 1,
    QCAL_PER_CHANNEL_AFFINE = 2,
    QCAL_PER_CHANNEL_SYMMETRIC = 3,
    QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS = 4,
} qcal_qscheme;

typedef struct qcal_qconfig {
    qcal_dtype dtype;        /* default QCAL_QUINT8 */
    qcal_qscheme qscheme;    /* default QCAL_PER_TENSOR_AFFINE */
    bool reduce_range;       /* default false: halve the range as PyTorch does (x86 VNNI-less overflow guard) */
    bool custom_range;       /* default false; true: use quant_min/quant_max below (e.g. 4-bit [0,15]) */
    int64_t quant_min;       /* default 0 (used only with custom_range) */
    int64_t quant_max;       /* default 255 (used only with custom_range) */
    float eps;               /* default FLT_EPSILON: lower bound of every scale */
} qcal_qconfig;

/* Fills *cfg with the defaults documented on each field. */
QCAL_API void qcal_qconfig_default(qcal_qconfig *cfg);

/* Validates cfg and writes the effective [quant_min, quant_max] (after reduce_range, as
 * torch.ao.quantization.utils.calculate_qmin_qmax computes it). */
QCAL_API qcal_status qcal_qconfig_range(const qcal_qconfig *cfg, int64_t *quant_min, int64_t *quant_max);

/* True for the three per-channel qschemes. */
QCAL_API bool qcal_qscheme_is_per_channel(qcal_qscheme qscheme);

/* Names: "quint8", "per_tensor_affine", ...; parse returns QCAL_ERR_INVALID_ARG on unknown names. */
QCAL_API const char *qcal_dtype_name(qcal_dtype dtype);
QCAL_API const char *qcal_qscheme_name(qcal_qscheme qscheme);
QCAL_API qcal_status qcal_dtype_parse(const char *name, qcal_dtype *out);
QCAL_API qcal_status qcal_qscheme_parse(const char *name, qcal_qscheme *out);

/* Computes n (scale, zero_point) pairs from n (min, max) pairs. zero_point gets the integer
 * zero-points; for QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS the zero-points are float
 * (-min/scale) and go to zero_point_float instead (zero_point may then be NULL, and
 * zero_point_float may be NULL for every other scheme). A "no data" pair (min = +inf,
 * max = -inf, as an empty observer or channel holds) gets scale 1, zero-point 0, and the call
 * returns QCAL_NO_DATA if ANY pair is one (the others computed normally). min > max
 * (otherwise) or NaN is QCAL_ERR_INVALID_ARG. */
QCAL_API qcal_status qcal_qparams_compute(const qcal_qconfig *cfg, int64_t n,
                                          const float *min_val, const float *max_val,
                                          float *scale, int32_t *zero_point,
                                          float *zero_point_float);

#ifdef __cplusplus
}
#endif
#endif
