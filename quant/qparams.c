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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/qparams.h"
#include "qcal/qparams.h"

static const char *const dtype_names[] = { "quint8", "qint8", "qint32", "float8_e4m3fn",
                                            "float8_e5m2" };
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

bool qcal_dtype_is_float8(qcal_dtype dtype)
{
    return dtype == QCAL_FLOAT8_E4M3FN || dtype == QCAL_FLOAT8_E5M2;
}

float qcal_dtype_float8_max(qcal_dtype dtype)
{
    return dtype == QCAL_FLOAT8_E4M3FN ? QCAL_FLOAT8_E4M3FN_MAX
           : dtype == QCAL_FLOAT8_E5M2 ? QCAL_FLOAT8_E5M2_MAX
                                       : 0.0f;
}

const char *qcal_dtype_name(qcal_dtype dtype)
{
    if ((unsigned)dtype > QCAL_FLOAT8_E5M2)
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
    for (int i = 0; i <= QCAL_FLOAT8_E5M2; i++) {
        if (!strcmp(name, dtype_names[i])) {
            *out = (qcal_dtype)i;
            return QCAL_OK;
        }
    }
    return qcal_error(QCAL_ERR_INVALID_ARG,
                      "unknown dtype '%s' (expected quint8, qint8, qint32, float8_e4m3fn or "
                      "float8_e5m2)", name);
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
    case QCAL_FLOAT8_E4M3FN: *lo = -448; *hi = 448; return;
    case QCAL_FLOAT8_E5M2: *lo = -57344; *hi = 57344; return;
    }
    *lo = 0;
    *hi = -1;
}

qcal_status qcal_dtype_range(qcal_dtype dtype, int64_t *lo, int64_t *hi)
{
    if (!lo || !hi)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dtype range outputs are NULL");
    if ((unsigned)dtype > QCAL_FLOAT8_E5M2)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown dtype %d", (int)dtype);
    dtype_limits(dtype, lo, hi);
    return QCAL_OK;
}

qcal_status qcal_qconfig_range(const qcal_qconfig *cfg, int64_t *quant_min, int64_t *quant_max)
{
    if (!cfg || !quant_min || !quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qconfig or outputs are NULL");
    if ((unsigned)cfg->dtype > QCAL_FLOAT8_E5M2)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown dtype %d", (int)cfg->dtype);
    if ((unsigned)cfg->qscheme > QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown qscheme %d", (int)cfg->qscheme);
    if (!(cfg->eps > 0.0f && isfinite(cfg->eps)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "eps %g must be > 0 and finite",
                          (double)cfg->eps);
    int64_t lo, hi, qmin, qmax;
    dtype_limits(cfg->dtype, &lo, &hi);
    if (qcal_dtype_is_float8(cfg->dtype)) {
        /* FP8: symmetric, zero-point 0, the finite range; nothing to reduce or customise. */
        if (cfg->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
            return qcal_error(QCAL_ERR_UNSUPPORTED,
                              "%s takes no float zero-points "
                              "(per_channel_affine_float_qparams)", dtype_names[cfg->dtype]);
        if (cfg->reduce_range || cfg->custom_range)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "%s has no %s",
                              dtype_names[cfg->dtype],
                              cfg->reduce_range ? "reduce_range" : "custom quant_min/quant_max");
        *quant_min = lo;
        *quant_max = hi;
        return QCAL_OK;
    }
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
     * reduce_range with a symmetric quint8 scheme (observer.c refuses those kinds), but its
     * HistogramObserver accepts per_tensor_symmetric: [0, 127], where PyTorch's zero-point
     * is 128, outside the range (a defect: its own fake_quantize refuses such qparams);
     * qcal gives 64, the midpoint as 128 is of [0, 255] (one_pair below).
     * Per-channel symmetric has no such observer. */
    if (cfg->reduce_range && cfg->dtype == QCAL_QUINT8 &&
        cfg->qscheme == QCAL_PER_CHANNEL_SYMMETRIC)
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
    if (qcal_dtype_is_float8(cfg->dtype)) {
        /* FP8 (every qscheme): scale = amax / largest finite value in float32 (the
         * TensorRT / ModelOpt / vLLM convention), at least eps; zero-point 0. */
        float amax = fmaxf(-fminf(mn, 0.0f), fmaxf(mx, 0.0f));
        s = fmaxf(amax / qcal_dtype_float8_max(cfg->dtype), eps);
        *scale = s;
        *zp = 0;
        *zpf = 0.0f;
        return QCAL_OK;
    }
    switch (cfg->qscheme) {
    case QCAL_PER_TENSOR_SYMMETRIC:
    case QCAL_PER_CHANNEL_SYMMETRIC: {
        float min_neg = fminf(mn, 0.0f), max_pos = fmaxf(mx, 0.0f);
        float m = fmaxf(-min_neg, max_pos);
        s = m / (float)((double)(qmax - qmin) / 2.0);
        s = fmaxf(s, eps);
        if (cfg->dtype == QCAL_QUINT8)
            /* PyTorch: 128, or the rounded-down midpoint of a custom range. Under
             * reduce_range ([0, 127]) PyTorch still says 128, outside the range; qcal gives
             * 64 = (qmin + qmax + 1) / 2, the place 128 has in [0, 255] (qcal.torch's
             * grid="torch" HistogramObserver returns PyTorch's 128). */
            z = cfg->custom_range ? floor_half(qmin + qmax) : (qmin + qmax + 1) / 2;
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

qcal_status qcal_qparams_compute_arrays(const qcal_qconfig *cfg, int64_t n,
                                        const float *min_val, const float *max_val,
                                        float *scale, int32_t *zero_point,
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

/* ----------------------------------------------------------------------------------- */
/* The qcal_qparams value */

/* One allocation holds the three arrays: scales, then float zero-points, then integer
 * zero-points (all 4-byte elements). */
qcal_status qcal_qparams_alloc(qcal_qparams *qp, qcal_dtype dtype, qcal_qscheme qscheme,
                               int32_t axis, int64_t quant_min, int64_t quant_max,
                               int64_t channels, float **scales, int32_t **zero_points,
                               float **zero_points_float)
{
    if (!qp)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: output is NULL");
    bool pc = qcal_qscheme_is_per_channel(qscheme);
    if (pc ? channels < 1 : channels != 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: %lld channels for %s",
                          (long long)channels, qcal_qscheme_name(qscheme));
    qcal_qparams v;
    memset(&v, 0, sizeof v);
    v.dtype = dtype;
    v.qscheme = qscheme;
    v.axis = pc ? axis : 0;
    v.quant_min = quant_min;
    v.quant_max = quant_max;
    v.channels = channels;
    v.scale = 1.0f;
    float *s = &qp->scale, *zf = &qp->zero_point_float;
    int32_t *z = &qp->zero_point;
    if (pc) {
        size_t bytes;
        if ((uint64_t)channels > SIZE_MAX || !qcal_mul_size((size_t)channels, 3 * sizeof(float), &bytes))
            return qcal_error(QCAL_ERR_OVERFLOW, "qparams: %lld channels overflow",
                              (long long)channels);
        float *mem = qcal_malloc(bytes);
        if (!mem)
            return QCAL_ERR_NO_MEMORY;
        s = mem;
        zf = mem + channels;
        z = (int32_t *)(void *)(mem + 2 * channels);
        for (int64_t c = 0; c < channels; c++) {
            s[c] = 1.0f;
            zf[c] = 0.0f;
            z[c] = 0;
        }
        v.owned = mem;
        v.scales = s;
        v.zero_points_float = zf;
        v.zero_points = z;
    }
    *qp = v;
    if (scales)
        *scales = s;
    if (zero_points)
        *zero_points = z;
    if (zero_points_float)
        *zero_points_float = zf;
    return QCAL_OK;
}

void qcal_qparams_free(qcal_qparams *qp)
{
    if (!qp)
        return;
    free(qp->owned);
    memset(qp, 0, sizeof *qp);
}

/* " (channel c)" into where for a per-channel failure message; always true (used in a
 * condition after the failing test, so nothing is formatted on success). */
static bool name_channel(char *where, size_t cap, bool pc, int64_t c)
{
    if (pc)
        snprintf(where, cap, " (channel %lld)", (long long)c);
    return true;
}

qcal_status qcal_qparams_check(const qcal_qparams *qp, const char *what, bool int_zp,
                               bool need_float)
{
    const char *sep = what && *what ? ": " : "";
    if (!what)
        what = "";
    if (!qp)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sqparams are NULL", what, sep);
    if ((unsigned)qp->dtype > QCAL_FLOAT8_E5M2)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sunknown dtype %d", what, sep,
                          (int)qp->dtype);
    if ((unsigned)qp->qscheme > QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sunknown qscheme %d", what, sep,
                          (int)qp->qscheme);
    int64_t lo, hi;
    dtype_limits(qp->dtype, &lo, &hi);
    if (qp->quant_min > qp->quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s%squant_min %lld is greater than quant_max %lld",
                          what, sep, (long long)qp->quant_min, (long long)qp->quant_max);
    if (qp->quant_min < lo || qp->quant_max > hi)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "%s%squantization range [%lld, %lld] exceeds %s's [%lld, %lld]", what,
                          sep, (long long)qp->quant_min, (long long)qp->quant_max,
                          dtype_names[qp->dtype], (long long)lo, (long long)hi);
    bool pc = qcal_qscheme_is_per_channel(qp->qscheme);
    bool fq = qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    bool f8 = qcal_dtype_is_float8(qp->dtype);
    if (f8 && fq)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "%s%s%s takes no float zero-points (per_channel_affine_float_qparams)",
                          what, sep, dtype_names[qp->dtype]);
    if (fq)
        need_float = true;
    if (!pc) {
        if (qp->channels != 1)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%s%s has %lld channels (must be 1)",
                              what, sep, qscheme_names[qp->qscheme], (long long)qp->channels);
        if (qp->scales || qp->zero_points || qp->zero_points_float)
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "%s%s%s takes the scalar scale/zero-point; the per-channel "
                              "arrays must be NULL", what, sep, qscheme_names[qp->qscheme]);
    } else {
        if (qp->channels < 1)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%s%s has %lld channels (must be >= 1)",
                              what, sep, qscheme_names[qp->qscheme], (long long)qp->channels);
        if (!qp->scales)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sper-channel scales are NULL", what,
                              sep);
        if (int_zp && !fq && !f8 && !qp->zero_points)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sper-channel zero-points are NULL",
                              what, sep);
        if (need_float && !qp->zero_points_float)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sper-channel float zero-points are NULL",
                              what, sep);
    }
    char where[48] = "";   /* the channel, named only when a check fails */
#define WHERE(c) name_channel(where, sizeof where, pc, (c))
    for (int64_t c = 0; c < qp->channels; c++) {
        float s = qcal_qparams_scale_at(qp, c);
        if (!(s > 0.0f && isfinite(s)) && WHERE(c))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sscale %g%s must be > 0 and finite",
                              what, sep, (double)s, where);
        if (f8 && (pc ? qp->zero_points != NULL : true) && qcal_qparams_zero_point_at(qp, c) != 0 &&
            WHERE(c))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%s%s zero-point %d%s must be 0", what,
                              sep, dtype_names[qp->dtype],
                              (int)qcal_qparams_zero_point_at(qp, c), where);
        if (int_zp && !fq) {
            int32_t z = qcal_qparams_zero_point_at(qp, c);
            if ((z < qp->quant_min || z > qp->quant_max) && WHERE(c))
                return qcal_error(QCAL_ERR_INVALID_ARG,
                                  "%s%szero-point %d%s is outside [quant_min %lld, quant_max %lld]",
                                  what, sep, (int)z, where, (long long)qp->quant_min,
                                  (long long)qp->quant_max);
        }
        if (need_float && !isfinite(qcal_qparams_zero_point_float_at(qp, c)) && WHERE(c))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s%sfloat zero-point %g%s is not finite",
                              what, sep, (double)qcal_qparams_zero_point_float_at(qp, c),
                              where);
    }
#undef WHERE
    return QCAL_OK;
}

qcal_status qcal_qparams_validate(const qcal_qparams *qp)
{
    return qcal_qparams_check(qp, "qparams", true, false);
}

qcal_status qcal_qparams_per_tensor(qcal_qparams *qp, qcal_dtype dtype, float scale,
                                    int32_t zero_point)
{
    if (!qp)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: output is NULL");
    qcal_qparams v;
    memset(&v, 0, sizeof v);
    v.dtype = dtype;
    v.qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_TENSOR_SYMMETRIC : QCAL_PER_TENSOR_AFFINE;
    dtype_limits(dtype, &v.quant_min, &v.quant_max);
    v.channels = 1;
    v.scale = scale;
    v.zero_point = zero_point;
    v.zero_point_float = (float)zero_point;
    qcal_status st = qcal_qparams_validate(&v);
    if (st != QCAL_OK)
        return st;
    *qp = v;
    return QCAL_OK;
}

qcal_status qcal_qparams_per_channel(qcal_qparams *qp, qcal_dtype dtype, int32_t axis,
                                     int64_t channels, const float *scales,
                                     const int32_t *zero_points)
{
    if (!qp)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: output is NULL");
    qcal_qparams v;
    memset(&v, 0, sizeof v);
    v.dtype = dtype;
    v.qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC : QCAL_PER_CHANNEL_AFFINE;
    v.axis = axis;
    dtype_limits(dtype, &v.quant_min, &v.quant_max);
    v.channels = channels;
    v.scales = scales;
    v.zero_points = zero_points;
    qcal_status st = qcal_qparams_validate(&v);
    if (st != QCAL_OK)
        return st;
    *qp = v;
    return QCAL_OK;
}

qcal_status qcal_qparams_copy(qcal_qparams *dst, const qcal_qparams *src)
{
    if (!dst || !src || dst == src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams copy: NULL or identical arguments");
    bool pc = qcal_qscheme_is_per_channel(src->qscheme);
    if (!pc) {
        *dst = *src;
        dst->owned = NULL;
        return QCAL_OK;
    }
    if (src->channels < 1 || !src->scales)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams copy: %lld channels, scales %s",
                          (long long)src->channels, src->scales ? "set" : "NULL");
    qcal_qparams v;
    float *s, *zf;
    int32_t *z;
    qcal_status st = qcal_qparams_alloc(&v, src->dtype, src->qscheme, src->axis, src->quant_min,
                                        src->quant_max, src->channels, &s, &z, &zf);
    if (st != QCAL_OK)
        return st;
    v.scale = src->scale;
    v.zero_point = src->zero_point;
    v.zero_point_float = src->zero_point_float;
    size_t bytes = (size_t)src->channels * sizeof(float);
    memcpy(s, src->scales, bytes);
    if (src->zero_points)
        memcpy(z, src->zero_points, bytes);
    else
        v.zero_points = NULL;
    if (src->zero_points_float)
        memcpy(zf, src->zero_points_float, bytes);
    else
        v.zero_points_float = NULL;
    *dst = v;
    return QCAL_OK;
}

qcal_status qcal_qparams_compute(const qcal_qconfig *cfg, int32_t axis, int64_t n,
                                 const float *min_val, const float *max_val, qcal_qparams *out)
{
    if (!cfg || !min_val || !max_val || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: config, ranges or output NULL");
    bool pc = qcal_qscheme_is_per_channel(cfg->qscheme);
    if (pc ? n < 1 : n != 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qparams: count %lld must be %s",
                          (long long)n, pc ? ">= 1" : "1 for a per-tensor qscheme");
    int64_t qmin, qmax;
    qcal_status st = qcal_qconfig_range(cfg, &qmin, &qmax);
    if (st != QCAL_OK)
        return st;
    qcal_qparams v;
    float *s, *zf;
    int32_t *z;
    qcal_qscheme qs = cfg->qscheme;
    if (qcal_dtype_is_float8(cfg->dtype))   /* FP8 is symmetric whatever was asked */
        qs = pc ? QCAL_PER_CHANNEL_SYMMETRIC : QCAL_PER_TENSOR_SYMMETRIC;
    st = qcal_qparams_alloc(&v, cfg->dtype, qs, axis, qmin, qmax, n, &s, &z, &zf);
    if (st != QCAL_OK)
        return st;
    /* per-tensor: s/z/zf point into v (the local), copied out below */
    if (!pc) {
        s = &v.scale;
        z = &v.zero_point;
        zf = &v.zero_point_float;
    }
    st = qcal_qparams_compute_arrays(cfg, n, min_val, max_val, s, z, zf);
    if (st < 0) {
        qcal_qparams_free(&v);
        return st;
    }
    if (cfg->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS) {
        for (int64_t c = 0; c < n; c++)
            z[c] = 0;
    } else if (!pc) {
        v.zero_point_float = (float)v.zero_point;
    } else {
        for (int64_t c = 0; c < n; c++)
            zf[c] = (float)z[c];
    }
    *out = v;
    return st;
}
