/* Bias correction (Nagel et al. 2019, section 4.2): a quantized weight shifts each output
 * channel's expected value by E[(W_q - W) x] = (W_q - W) E[x]; subtracting it from the bias
 * removes the shift. E[x] is measured on calibration data (empirical) or, after BatchNorm ->
 * ReLU, computed from the BatchNorm's shift and scale (analytic: the mean of a rectified
 * normal). */
#include <math.h>
#include <string.h>

#include "ptq/ptq_internal.h"
#include "qcal/quantize.h"
#include "qcal/weights.h"

qcal_status qcal_ptq_weight_fake_quant(const qcal_ptq_layer *l, const qcal_qconfig *cfg, float *dst)
{
    static const char fn[] = "qcal_ptq_weight_fake_quant";
    int64_t numel;
    qcal_status st = ptq_layer_check(fn, l, &numel);
    if (st != QCAL_OK)
        return st;
    if (!cfg || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: NULL config or dst", fn);
    bool per_channel = qcal_qscheme_is_per_channel(cfg->qscheme);
    int64_t nch = per_channel ? l->out_channels : 1;
    size_t esz = qcal_dtype_size(cfg->dtype);
    if (!esz)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: unknown dtype %d", fn, (int)cfg->dtype);
    float *scales = malloc((size_t)nch * sizeof *scales);
    int32_t *zps = malloc((size_t)nch * sizeof *zps);
    void *codes = malloc((size_t)numel * esz);
    if (!scales || !zps || !codes) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    /* min/max as PyTorch's MinMaxObserver (per output channel, the range always includes 0),
     * w seen as (out_channels, row) */
    qcal_tensor src;
    memset(&src, 0, sizeof src);
    src.data = l->weight;
    src.ndim = 2;
    src.shape[0] = l->out_channels;
    src.shape[1] = ptq_row(l);
    qcal_weights_options wo;
    qcal_weights_options_default(&wo);
    wo.q = *cfg;
    wo.nonfinite = QCAL_NONFINITE_ERROR;
    if ((st = qcal_weights_quantize(&wo, &src, NULL, scales, zps, codes)) != QCAL_OK) {
        st = qcal_error(st, "%s: %s", fn, qcal_last_error());
        goto out;
    }
    qcal_qparams qp;
    st = per_channel ? qcal_qparams_per_channel(&qp, cfg->dtype, 0, nch, scales, zps)
                     : qcal_qparams_per_tensor(&qp, cfg->dtype, scales[0], zps[0]);
    qcal_tensor_mut d;
    memset(&d, 0, sizeof d);
    d.data = dst;
    d.ndim = 2;
    d.shape[0] = src.shape[0];
    d.shape[1] = src.shape[1];
    if (st == QCAL_OK)
        st = qcal_dequantize(codes, &qp, &d);
out:
    free(scales);
    free(zps);
    free(codes);
    return st;
}

qcal_status qcal_ptq_bias_correct(qcal_ptq_layer *l, const float *wq, const float *mean_in, float *shift)
{
    static const char fn[] = "qcal_ptq_bias_correct";
    qcal_status st = ptq_layer_check(fn, l, NULL);
    if (st != QCAL_OK)
        return st;
    if (!wq || !mean_in || !l->bias)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: NULL quantized weight, input mean or bias", fn);
    for (int64_t c = 0; c < l->in_channels; c++)
        if (!isfinite(mean_in[c]))
            return qcal_error(QCAL_ERR_NONFINITE, "%s: input mean of channel %lld is %g", fn, (long long)c,
                              (double)mean_in[c]);
    float *d = malloc((size_t)l->out_channels * sizeof *d);
    if (!d)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    int64_t cin = l->in_channels / l->groups, cout = l->out_channels / l->groups;
    for (int64_t o = 0; o < l->out_channels; o++) {
        int64_t base = o / cout * cin;
        double acc = 0.0;   // fixed order: input channel, then kernel position
        for (int64_t c = 0; c < cin; c++) {
            int64_t off = (o * cin + c) * l->kernel;
            double e = 0.0;
            for (int64_t k = 0; k < l->kernel; k++)
                e += (double)wq[off + k] - (double)l->weight[off + k];
            acc += e * mean_in[base + c];
        }
        if (!isfinite(acc)) {
            free(d);
            return qcal_error(QCAL_ERR_NONFINITE, "%s: shift of output channel %lld is not finite", fn, (long long)o);
        }
        d[o] = (float)acc;
    }
    for (int64_t o = 0; o < l->out_channels; o++)
        l->bias[o] = (float)((double)l->bias[o] - d[o]);
    if (shift)
        memcpy(shift, d, (size_t)l->out_channels * sizeof *d);
    free(d);
    return QCAL_OK;
}

qcal_status qcal_ptq_relu_normal_mean(int64_t n, const float *mean, const float *std, float *out)
{
    if (n < 0 || (n > 0 && (!mean || !std || !out)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_ptq_relu_normal_mean: NULL array or negative count");
    for (int64_t i = 0; i < n; i++) {
        double m = mean[i], s = fabs((double)std[i]);
        if (!isfinite(m) || !isfinite(s))
            return qcal_error(QCAL_ERR_NONFINITE, "qcal_ptq_relu_normal_mean: channel %lld: mean %g, std %g",
                              (long long)i, m, s);
        if (s == 0.0) {
            out[i] = (float)fmax(m, 0.0);
            continue;
        }
        // E[max(x, 0)] = m Phi(m / s) + s phi(m / s)
        double z = m / s;
        double cdf = 0.5 * erfc(-z / sqrt(2.0));
        double pdf = exp(-0.5 * z * z) / sqrt(2.0 * 3.14159265358979323846);
        out[i] = (float)(m * cdf + s * pdf);
    }
    return QCAL_OK;
}
