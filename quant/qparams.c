/* qparams: scale / zero-point from min/max ranges, reproducing PyTorch 1.13's
 * UniformQuantizationObserverBase._calculate_qparams (torch/ao/quantization/observer.py)
 * and calculate_qmin_qmax (torch/ao/quantization/utils.py) in float32 arithmetic.
 *
 * PyTorch evaluates `tensor / python_float` on CPU as a float32 division by the Python
 * float rounded to float32 (checked bit for bit on 10^5 random values per divisor; it is
 * not a multiplication by a reciprocal and not a double division), so the denominators
 * below are (float)(double)(quant_max - quant_min), e.g. 4294967295 -> 4294967296.0f. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/qparams.h"

static const char *const dtype_names[] = { "quint8", "qint8", "qint32" };
static const char *const qscheme_names[] = {
    "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
    "per_channel_symmetric", "per_channel_affine_float_qparams",
};

void qcal_qconfig_default(qcal_qconfig *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->dtype = QCAL_QUINT8;
    cfg->qscheme = QCAL_PER_TENSOR_AFFINE;
    cfg->reduce_range = false;
    cfg->custom_range = false;
    cfg->quant_min = 0;
    cfg->quant_max = 255;
    cfg->eps = FLT_EPSILON;
}

bool qcal_qscheme_is_per_channel(qcal_qscheme qscheme)
{
    return qscheme == QCAL_PER_CHANNEL_AFFINE || qscheme == QCAL_PER_CHANNEL_SYMMETRIC ||
           qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
}

const char *qcal_dtype_name(qcal_dtype dtype)
{
    if ((unsigned)dtype > QCAL_QINT32)
        return "unknown";
    return dtype_names[dtype];
}

const char *qcal_qscheme_name(qcal_qscheme qscheme)
{
    if ((unsigned)qscheme > QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return "unknown";
    return qscheme_names[qscheme];
}

qcal_status qcal_dtype_parse(const char *name, qcal_dtype *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dtype name or output is NULL");
    for (int i = 0; i <= QCAL_QINT32; i++) {
        if (!strcmp(name, dtype_names[i])) {
            *out = (qcal_dtype)i;
            return QCAL_OK;
        }
    }
    return qcal_error(QCAL_ERR_INVALID_ARG,
                      "unknown dtype '%s' (expected quint8, qint8 or qint32)", name);
}

qcal_status qcal_qscheme_parse(const char *name, qcal_qscheme *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qscheme name or output is NULL");
    for (int i = 0; i <= QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS; i++) {
        if (!strcmp(name, qscheme_names[i])) {
            *out = (qcal_qscheme)i;
            return QCAL_OK;
        }
    }
    return qcal_error(QCAL_ERR_INVALID_ARG,
                      "unknown qscheme '%s' (expected per_tensor_affine, per_tensor_symmetric, "
                      "per_channel_affine, per_channel_symmetric or "
                      "per_channel_affine_float_qparams)", name);
}

/* Python's floor division `a // 2`. */
static int64_t floor_half(int64_t a)
{
    return a >= 0 ? a / 2 : -((-a + 1) / 2);
}

static void dtype_limits(qcal_dtype dtype, int64_t *lo, int64_t *hi)
{
    switch (dtype) {
    case QCAL_QUINT8: *lo = 0; *hi = 255; return;
    case QCAL_QINT8: *lo = -128; *hi = 127; return;
    case QCAL_QINT32: *lo = INT32_MIN; *hi = INT32_MAX; return;
    }
    *lo = 0;
    *hi = -1;
}

qcal_status qcal_qconfig_range(const qcal_qconfig *cfg, int64_t *quant_min, int64_t *quant_max)
{
    if (!cfg || !quant_min || !quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qconfig or outputs are NULL");
    if ((unsigned)cfg->dtype > QCAL_QINT32)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown dtype %d", (int)cfg->dtype);
    if ((unsigned)cfg->qscheme > QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown qscheme %d", (int)cfg->qscheme);
    if (!(cfg->eps > 0.0f && isfinite(cfg->eps)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "eps %g must be > 0 and finite",
                          (double)cfg->eps);
    int64_t lo, hi, qmin, qmax;
    dtype_limits(cfg->dtype, &lo, &hi);
    if (cfg->custom_range) {
        qmin = cfg->quant_min;
        qmax = cfg->quant_max;
        /* PyTorch's _validate_qmin_qmax: the range includes 0 and qmin < qmax. */
        if (!(qmin <= 0 && 0 <= qmax))
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "quantization range [%lld, %lld] must include 0",
                              (long long)qmin, (long long)qmax);
        if (!(qmin < qmax))
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "quant_min %lld must be strictly less than quant_max %lld",
                              (long long)qmin, (long long)qmax);
        /* Stricter than PyTorch (which only bounds the width for qint8/qint32): the range
         * must be storable in the dtype, or quantize would produce unrepresentable values. */
        if (qmin < lo || qmax > hi)
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "quantization range [%lld, %lld] exceeds %s's [%lld, %lld]",
                              (long long)qmin, (long long)qmax, dtype_names[cfg->dtype],
                              (long long)lo, (long long)hi);
        /* calculate_qmin_qmax's width asserts (qint32: at most 2^31 levels). */
        int64_t len = qmax - qmin + 1;
        if (cfg->dtype == QCAL_QINT8 && len > 256)
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "quantization range [%lld, %lld] has %lld levels; qint8 allows 256",
                              (long long)qmin, (long long)qmax, (long long)len);
        if (cfg->dtype == QCAL_QINT32 && len > (INT64_C(1) << 31))
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "quantization range [%lld, %lld] has %lld levels; a custom qint32 "
                              "range allows at most 2^31 (as PyTorch)",
                              (long long)qmin, (long long)qmax, (long long)len);
        if (cfg->reduce_range) {
            qmin = floor_half(qmin);
            qmax = floor_half(qmax);
        }
    } else if (cfg->dtype == QCAL_QINT8) {
        qmin = cfg->reduce_range ? -64 : -128;
        qmax = cfg->reduce_range ? 63 : 127;
    } else if (cfg->dtype == QCAL_QUINT8) {
        qmin = 0;
        qmax = cfg->reduce_range ? 127 : 255;
    } else {
        /* PyTorch ignores reduce_range for qint32. */
        qmin = INT32_MIN;
        qmax = INT32_MAX;
    }
    /* PyTorch's MinMaxObserver / PerChannelMinMaxObserver raise NotImplementedError for
     * this combination (the zero-point 128 would lie outside [0, 127]). */
    if (cfg->reduce_range && cfg->dtype == QCAL_QUINT8 &&
        (cfg->qscheme == QCAL_PER_TENSOR_SYMMETRIC || cfg->qscheme == QCAL_PER_CHANNEL_SYMMETRIC))
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "reduce_range is not supported with %s for quint8 (as PyTorch)",
                          qscheme_names[cfg->qscheme]);
    *quant_min = qmin;
    *quant_max = qmax;
    return QCAL_OK;
}

/* (a - b) / den in float32 as PyTorch; when a - b overflows float32 (a span wider than
 * FLT_MAX, where PyTorch returns scale = inf) the span is taken in double and the quotient
 * rounded to float once, so every finite range gives a finite scale. */
static float span_div(float a, float b, float den)
{
    float d = a - b;
    if (isinf(d))
        return (float)(((double)a - (double)b) / (double)den);
    return d / den;
}

/* Channel i of the computation; returns false if the pair is "no data". */
static qcal_status one_pair(const qcal_qconfig *cfg, int64_t qmin, int64_t qmax, int64_t i,
                            float mn, float mx, float *scale, int64_t *zp, float *zpf,
                            bool *no_data)
{
    *no_data = false;
    if (mn == INFINITY && mx == -INFINITY) {
        *no_data = true;
        *scale = 1.0f;
        *zp = 0;
        *zpf = 0.0f;
        return QCAL_OK;
    }
    if (isnan(mn) || isnan(mx) || isinf(mn) || isinf(mx))
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "range %lld is [%g, %g]: min/max must be finite (or +inf/-inf for "
                          "no data)", (long long)i, (double)mn, (double)mx);
    if (!(mn <= mx))
        return qcal_error(QCAL_ERR_INVALID_ARG, "range %lld has min %.9g > max %.9g",
                          (long long)i, (double)mn, (double)mx);
    const float eps = cfg->eps;
    const float width = (float)(double)(qmax - qmin);
    float s = 1.0f;
    int64_t z = 0;
    float zf = 0.0f;
    switch (cfg->qscheme) {
    case QCAL_PER_TENSOR_SYMMETRIC:
    case QCAL_PER_CHANNEL_SYMMETRIC: {
        float min_neg = fminf(mn, 0.0f), max_pos = fmaxf(mx, 0.0f);
        float m = fmaxf(-min_neg, max_pos);
        s = m / (float)((double)(qmax - qmin) / 2.0);
        s = fmaxf(s, eps);
        if (cfg->dtype == QCAL_QUINT8)
            /* PyTorch: 128, or the rounded-down midpoint of a custom range. */
            z = cfg->custom_range ? floor_half(qmin + qmax) : 128;
        break;
    }
    case QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS:
        /* No clamping of the range to include 0 here (as PyTorch). */
        s = span_div(mx, mn, width);
        s = s > eps ? s : 1.0f;
        zf = (-mn) / s;
        break;
    default: {
        float min_neg = fminf(mn, 0.0f), max_pos = fmaxf(mx, 0.0f);
        s = span_div(max_pos, min_neg, width);
        s = fmaxf(s, eps);
        /* torch.round is round-half-even; PyTorch then converts to int32, which
         * overflows for qint32 whenever min_neg / scale < -2^31 (|min| well above max
         * with scale > eps, e.g. [-3e30, 1e30]): x86 yields INT32_MIN and the zero-point
         * wraps to 0. qcal keeps the exact int64 value and clamps (tests/test_qparams.c
         * checks both numbers on PyTorch's own cases). */
        double r = (double)nearbyintf(min_neg / s);
        z = qmin - (int64_t)r;
        if (z < qmin)
            z = qmin;
        if (z > qmax)
            z = qmax;
        break;
    }
    }
    *scale = s;
    *zp = z;
    *zpf = zf;
    return QCAL_OK;
}

qcal_status qcal_qparams_compute(const qcal_qconfig *cfg, int64_t n, const float *min_val,
                                 const float *max_val, float *scale, int32_t *zero_point,
                                 float *zero_point_float)
{
    if (!cfg || !min_val || !max_val || !scale)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: config, ranges or scale output NULL");
    if (n < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: count %lld must be >= 1",
                          (long long)n);
    bool float_zp = cfg->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    if (float_zp ? !zero_point_float : !zero_point)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: zero-point output for %s is NULL",
                          qcal_qscheme_name(cfg->qscheme));
    int64_t qmin, qmax;
    qcal_status st = qcal_qconfig_range(cfg, &qmin, &qmax);
    if (st != QCAL_OK)
        return st;
    /* Validate everything first so that outputs stay untouched on failure. */
    int64_t empty = 0;
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f, zf = 0.0f;
        int64_t z = 0;
        bool nd = false;
        st = one_pair(cfg, qmin, qmax, i, min_val[i], max_val[i], &s, &z, &zf, &nd);
        if (st != QCAL_OK)
            return st;
        empty += nd;
    }
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f, zf = 0.0f;
        int64_t z = 0;
        bool nd = false;
        one_pair(cfg, qmin, qmax, i, min_val[i], max_val[i], &s, &z, &zf, &nd);
        scale[i] = s;
        if (zero_point)
            zero_point[i] = (int32_t)z;
        if (zero_point_float)
            zero_point_float[i] = zf;
    }
    /* Channels without data (a channel every value of which was non-finite) get scale 1,
     * zero-point 0 like an empty observer, and the call says so with QCAL_NO_DATA. */
    return empty > 0 ? QCAL_NO_DATA : QCAL_OK;
}
