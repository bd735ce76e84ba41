/* Weight quantization of the int8 runtime: the library's weight quantizer (qcal/weights.h)
 * with per_channel_minmax, qint8 per_channel_symmetric, axis 0 (int8/weights.h). */
#include <math.h>

#include "core/internal.h"
#include "int8/weights.h"
#include "qcal/weights.h"

qcal_status qcal_int8_weights_quantize(const char *fn, int64_t oc, int64_t k, const float *w,
                                       const float *given_scale, int8_t *wq, float *scale)
{
    for (int64_t o = 0; given_scale && o < oc; o++) {
        float s = given_scale[o];
        if (!(s > 0.0f && isfinite(s) && isfinite(1.0f / s)))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: weight_qparams scale[%lld] = %g must be > 0, "
                              "finite and have a finite inverse", fn, (long long)o, (double)s);
    }
    qcal_tensor t;
    const int64_t shape[2] = {oc, k};
    qcal_status st = qcal_tensor_init(&t, w, 2, shape);
    if (st != QCAL_OK)
        return st;
    /* PerChannelMinMaxObserver(qint8, per_channel_symmetric), PyTorch 1.13: scale =
     * max(-min(w, 0), max(w, 0)) / 127.5, at least FLT_EPSILON; zero-points 0; then
     * q = clamp(nearbyintf(w * (1 / scale[o])), -128, 127) (qcal/quantize.h). */
    qcal_weights_options opt;
    qcal_weights_options_default(&opt);
    opt.nonfinite = QCAL_NONFINITE_ERROR;   /* the message names the element: weight[o][j] */
    opt.scales = given_scale;
    st = qcal_weights_quantize(&opt, &t, NULL, scale, NULL, wq);
    return st == QCAL_OK ? QCAL_OK : qcal_error(st, "%s: %s", fn, qcal_last_error());
}
