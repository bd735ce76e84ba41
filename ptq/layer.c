/* The layer view of qcal/ptq.h: shape checks and per-channel weight ranges. */
#include <math.h>

#include "ptq/ptq_internal.h"

qcal_status ptq_layer_check(const char *fn, const qcal_ptq_layer *l, int64_t *numel)
{
    if (!l || !l->weight)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: NULL layer or weight", fn);
    if (l->out_channels < 1 || l->in_channels < 1 || l->groups < 1 || l->kernel < 1 ||
        l->out_channels % l->groups || l->in_channels % l->groups)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "%s: layer shape out %lld, in %lld, groups %lld, kernel %lld is impossible "
                          "(channels must be positive multiples of groups)",
                          fn, (long long)l->out_channels, (long long)l->in_channels, (long long)l->groups,
                          (long long)l->kernel);
    int64_t row = ptq_row(l), n;
    if (__builtin_mul_overflow(row, l->out_channels, &n) || n > INT64_MAX / 8)
        return qcal_error(QCAL_ERR_OVERFLOW, "%s: layer weight count overflows", fn);
    if (numel)
        *numel = n;
    return QCAL_OK;
}

qcal_status ptq_pair_check(const char *fn, const qcal_ptq_layer *l1, const qcal_ptq_layer *l2)
{
    qcal_status st;
    if ((st = ptq_layer_check(fn, l1, NULL)) != QCAL_OK || (st = ptq_layer_check(fn, l2, NULL)) != QCAL_OK)
        return st;
    if (l2->in_channels != l1->out_channels)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: layer 1 has %lld output channels, layer 2 reads %lld", fn,
                          (long long)l1->out_channels, (long long)l2->in_channels);
    return QCAL_OK;
}

qcal_status qcal_ptq_channel_ranges(const qcal_ptq_layer *l, float *ranges)
{
    qcal_status st = ptq_layer_check("qcal_ptq_channel_ranges", l, NULL);
    if (st != QCAL_OK)
        return st;
    if (!ranges)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_ptq_channel_ranges: NULL ranges");
    int64_t row = ptq_row(l);
    for (int64_t o = 0; o < l->out_channels; o++) {
        const float *w = l->weight + o * row;
        float r = 0.0f;
        for (int64_t j = 0; j < row; j++) {
            if (!isfinite(w[j]))
                return qcal_error(QCAL_ERR_NONFINITE, "qcal_ptq_channel_ranges: weight of output channel %lld is %g",
                                  (long long)o, (double)w[j]);
            r = fmaxf(r, fabsf(w[j]));
        }
        ranges[o] = r;
    }
    return QCAL_OK;
}

qcal_status qcal_ptq_input_ranges(const qcal_ptq_layer *l, float *ranges)
{
    qcal_status st = ptq_layer_check("qcal_ptq_input_ranges", l, NULL);
    if (st != QCAL_OK)
        return st;
    if (!ranges)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_ptq_input_ranges: NULL ranges");
    int64_t cin = l->in_channels / l->groups, cout = l->out_channels / l->groups;
    // weight is (out, cin, kernel); output o reads input channels (o / cout) * cin + [0, cin)
    for (int64_t c = 0; c < l->in_channels; c++)
        ranges[c] = 0.0f;
    for (int64_t o = 0; o < l->out_channels; o++) {
        int64_t base = o / cout * cin;
        for (int64_t c = 0; c < cin; c++) {
            const float *w = l->weight + (o * cin + c) * l->kernel;
            float r = ranges[base + c];
            for (int64_t k = 0; k < l->kernel; k++) {
                if (!isfinite(w[k]))
                    return qcal_error(QCAL_ERR_NONFINITE, "qcal_ptq_input_ranges: weight reading input channel %lld is %g",
                                      (long long)(base + c), (double)w[k]);
                r = fmaxf(r, fabsf(w[k]));
            }
            ranges[base + c] = r;
        }
    }
    return QCAL_OK;
}

qcal_status qcal_ptq_range_ratio(const qcal_ptq_layer *l, double *ratio, float *min_range, float *max_range)
{
    qcal_status st = ptq_layer_check("qcal_ptq_range_ratio", l, NULL);
    if (st != QCAL_OK)
        return st;
    if (!ratio)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_ptq_range_ratio: NULL ratio");
    float *r = malloc((size_t)l->out_channels * sizeof *r);
    if (!r)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    st = qcal_ptq_channel_ranges(l, r);
    if (st == QCAL_OK) {
        float lo = INFINITY, hi = 0.0f;
        for (int64_t o = 0; o < l->out_channels; o++) {
            lo = fminf(lo, r[o]);
            hi = fmaxf(hi, r[o]);
        }
        *ratio = lo > 0.0f ? (double)hi / (double)lo : (hi > 0.0f ? INFINITY : 1.0);
        if (min_range)
            *min_range = lo;
        if (max_range)
            *max_range = hi;
    }
    free(r);
    return st;
}
