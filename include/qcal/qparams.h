/* qcal qparams: the quantization parameters value (qcal_qparams) that flows observer ->
 * quantize / fake-quant -> calibration table -> int8 network, and its computation from a
 * min/max range with the arithmetic of
 * torch.ao.quantization.observer.UniformQuantizationObserverBase._calculate_qparams
 * (PyTorch 1.13).
 *
 *   qcal_qparams qp = {0};
 *   qcal_observer_qparams(obs, &qp);              // filled by an observer (may allocate)
 *   qcal_quantize(&x, &qp, codes);                // per-tensor and per-channel alike
 *   qcal_qparams_free(&qp);
 *
 *   qcal_qparams w;                               // a view over the caller's arrays
 *   qcal_qparams_per_channel(&w, QCAL_QINT8, 0, channels, scales, zero_points);
 */
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
    /* FP8 (docs/fp8.md): 8-bit float codes, symmetric (zero-point 0), scale = amax / the
     * largest finite value; quant_min/quant_max are -largest / +largest. */
    QCAL_FLOAT8_E4M3FN = 3,  /* 1.4.3, bias 7: largest 448, no infinities, NaN 0x7F / 0xFF */
    QCAL_FLOAT8_E5M2 = 4,    /* 1.5.2, bias 15: largest 57344, infinities 0x7C / 0xFC */
} qcal_dtype;

/* The largest finite value of the FP8 dtypes. */
#define QCAL_FLOAT8_E4M3FN_MAX 448.0f
#define QCAL_FLOAT8_E5M2_MAX 57344.0f

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
/* FP8 dtypes: every qscheme but per_channel_affine_float_qparams is accepted and computed
 * symmetric (the affine ones are stored as their symmetric counterparts): scale =
 * max(max(|min|, |max|) / largest finite, eps), zero-point 0, range [-largest, largest];
 * reduce_range and custom_range are QCAL_ERR_UNSUPPORTED. */

/* Quantization parameters, per-tensor or per-channel, as one value.
 *
 * Per-tensor qschemes: channels == 1 and the values are the scalars `scale`, `zero_point`,
 * `zero_point_float`; the array pointers are NULL. Such a value owns nothing and may be
 * copied freely.
 * Per-channel qschemes: channels >= 1 values in `scales`, `zero_points` (NULL allowed for
 * QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS) and `zero_points_float` (NULL allowed except for
 * that scheme and the learnable fake-quant calls). The arrays are either
 *   - a view over arrays the caller owns (qcal_qparams_per_channel, or fields set by hand):
 *     the caller keeps them alive while the value is used; `owned` is NULL; or
 *   - allocated by the library (qcal_observer_qparams, qcal_qparams_compute,
 *     qcal_qparams_copy): `owned` is non-NULL and qcal_qparams_free releases them. A plain
 *     struct copy of such a value shares the arrays: free exactly one of the copies.
 * The integer zero-points are used by quantize, dequantize and fixed fake-quant; the float
 * zero-points by QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS and the learnable (LSQ) calls.
 * quant_min/quant_max: the effective integer range (qcal_qconfig_range); fake-quant clamps
 * to it, quantize clamps to the dtype's full range (as torch.quantize_per_*).
 * `{0}` is a valid empty value to pass to a function that fills one, and to free. */
typedef struct qcal_qparams {
    qcal_dtype dtype;
    qcal_qscheme qscheme;
    int32_t axis;                    /* per-channel: channel axis (negative counts from the end); else 0 */
    int64_t quant_min, quant_max;    /* effective integer range, within the dtype's */
    int64_t channels;                /* 1 for per-tensor qschemes; per-channel: >= 1 */
    float scale;                     /* per-tensor: > 0 and finite */
    int32_t zero_point;              /* per-tensor: in [quant_min, quant_max] */
    float zero_point_float;          /* per-tensor: learnable (LSQ) zero-point */
    const float *scales;             /* per-channel: `channels` values, > 0 and finite */
    const int32_t *zero_points;      /* per-channel: `channels` values in [quant_min, quant_max] */
    const float *zero_points_float;  /* per-channel: `channels` float zero-points */
    void *owned;                     /* library allocation behind the arrays, or NULL (view) */
} qcal_qparams;

/* Fills *cfg with the defaults documented on each field. */
QCAL_API void qcal_qconfig_default(qcal_qconfig *cfg);

/* Validates cfg and writes the effective [quant_min, quant_max] (after reduce_range, as
 * torch.ao.quantization.utils.calculate_qmin_qmax computes it). */
QCAL_API qcal_status qcal_qconfig_range(const qcal_qconfig *cfg, int64_t *quant_min, int64_t *quant_max);

/* True for QCAL_FLOAT8_E4M3FN and QCAL_FLOAT8_E5M2. */
QCAL_API bool qcal_dtype_is_float8(qcal_dtype dtype);

/* The FP8 dtype's largest finite value (448 or 57344); 0 for the integer dtypes. */
QCAL_API float qcal_dtype_float8_max(qcal_dtype dtype);

/* True for the three per-channel qschemes. */
QCAL_API bool qcal_qscheme_is_per_channel(qcal_qscheme qscheme);

/* Names: "quint8", "float8_e4m3fn", "per_tensor_affine", ...; parse returns QCAL_ERR_INVALID_ARG on unknown names. */
QCAL_API const char *qcal_dtype_name(qcal_dtype dtype);
QCAL_API const char *qcal_qscheme_name(qcal_qscheme qscheme);
QCAL_API qcal_status qcal_dtype_parse(const char *name, qcal_dtype *out);
QCAL_API qcal_status qcal_qscheme_parse(const char *name, qcal_qscheme *out);

/* The dtype's full integer range: [0, 255], [-128, 127] or [-2^31, 2^31 - 1]; FP8:
 * [-448, 448] or [-57344, 57344] (the finite values' range). */
QCAL_API qcal_status qcal_dtype_range(qcal_dtype dtype, int64_t *lo, int64_t *hi);

/* Bytes per quantized element: 1 for quint8/qint8 and the FP8 dtypes, 4 for qint32, 0 for
 * an unknown dtype (declared in qcal/quantize.h before 0.2.0). */
QCAL_API size_t qcal_dtype_size(qcal_dtype dtype);

/* Per-tensor affine value: dtype's full range, the given scale / zero-point (float
 * zero-point = zero_point). Validated (qcal_qparams_validate); *qp is not freed first. */
QCAL_API qcal_status qcal_qparams_per_tensor(qcal_qparams *qp, qcal_dtype dtype, float scale,
                                             int32_t zero_point);

/* Per-channel affine view over the caller's arrays (channels values each; zero_points_float
 * left NULL): dtype's full range, channel axis `axis`. Validated; nothing is copied. */
QCAL_API qcal_status qcal_qparams_per_channel(qcal_qparams *qp, qcal_dtype dtype, int32_t axis,
                                              int64_t channels, const float *scales,
                                              const int32_t *zero_points);

/* Checks a value: known dtype and qscheme, quant_min <= quant_max inside the dtype's range,
 * channels (1 per-tensor, >= 1 per-channel) and arrays present, every scale > 0 and
 * finite, every integer zero-point in [quant_min, quant_max] (not for the float-qparams
 * scheme), every float zero-point finite where the scheme uses them. The message names the
 * field (and channel). */
QCAL_API qcal_status qcal_qparams_validate(const qcal_qparams *qp);

/* qcal_qparams_compute's arithmetic into caller arrays for n (min, max) pairs: scale[n];
 * zero_point[n] the integer zero-points (may be NULL for the float-qparams scheme);
 * zero_point_float[n] the float ones (may be NULL for every other scheme). Same statuses
 * as qcal_qparams_compute; outputs untouched on failure. */
QCAL_API qcal_status qcal_qparams_compute_arrays(const qcal_qconfig *cfg, int64_t n,
                                                 const float *min_val, const float *max_val,
                                                 float *scale, int32_t *zero_point,
                                                 float *zero_point_float);

/* Fills *qp for `channels` channels (per-channel schemes: library-owned arrays of scales 1,
 * zero-points 0, float zero-points 0, free with qcal_qparams_free; per-tensor: no
 * allocation) and points *scales, *zero_points, *zero_points_float (each may be NULL) at
 * the values to write. *qp is not freed first. */
QCAL_API qcal_status qcal_qparams_alloc(qcal_qparams *qp, qcal_dtype dtype, qcal_qscheme qscheme,
                                        int32_t axis, int64_t quant_min, int64_t quant_max,
                                        int64_t channels, float **scales, int32_t **zero_points,
                                        float **zero_points_float);

/* qcal_qparams_validate with `what` prefixed to the message ("quantize: ..."); int_zp: the
 * integer zero-points are used (must lie in [quant_min, quant_max]); need_float: the float
 * zero-points are used (learnable fake-quant). */
QCAL_API qcal_status qcal_qparams_check(const qcal_qparams *qp, const char *what, bool int_zp,
                                        bool need_float);

/* Deep copy of src into *dst (library-owned arrays; free with qcal_qparams_free). *dst is
 * not freed first; src and dst must differ. */
QCAL_API qcal_status qcal_qparams_copy(qcal_qparams *dst, const qcal_qparams *src);

/* Releases library-owned arrays (views: nothing is freed) and resets *qp to {0}. NULL is fine. */
QCAL_API void qcal_qparams_free(qcal_qparams *qp);

/* Computes qparams from n (min, max) pairs with cfg's dtype/qscheme/range into *out
 * (per-tensor schemes: n must be 1; per-channel: n channels along `axis`, library-owned
 * arrays, free with qcal_qparams_free). Integer zero-points for every scheme except
 * QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS, whose zero-points are float (-min/scale, integer
 * ones 0); for the other schemes the float zero-points hold the integer ones as float. A
 * pair (+inf, -inf) is "no data": scale 1, zero-point 0, and the call returns QCAL_NO_DATA
 * if ANY pair is one (the others computed normally). min > max (otherwise),
 * NaN or another infinity is QCAL_ERR_INVALID_ARG and *out untouched. */
QCAL_API qcal_status qcal_qparams_compute(const qcal_qconfig *cfg, int32_t axis, int64_t n,
                                          const float *min_val, const float *max_val,
                                          qcal_qparams *out);

/* Channel c's scale / integer zero-point / float zero-point (per-tensor: the scalar, any c). */
static inline float qcal_qparams_scale_at(const qcal_qparams *qp, int64_t c)
{
    return qp->scales ? qp->scales[c] : qp->scale;
}
static inline int32_t qcal_qparams_zero_point_at(const qcal_qparams *qp, int64_t c)
{
    return qp->zero_points ? qp->zero_points[c] : qp->zero_point;
}
static inline float qcal_qparams_zero_point_float_at(const qcal_qparams *qp, int64_t c)
{
    return qp->zero_points_float ? qp->zero_points_float[c] : qp->zero_point_float;
}

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_QPARAMS_DECLARED
#include "qcal/deprecated.h"
#endif
