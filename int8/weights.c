/* Weight quantization of the int8 runtime: observer -> qparams -> quantize (int8/weights.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "int8/weights.h"
#include "qcal/observer.h"
#include "qcal/quantize.h"
#include "qcal/tensor.h"

qcal_status qcal_int8_weights_quantize(const char *fn, int64_t oc, int64_t k, const float *w,
                                       const float *given_scale, int8_t *wq, float *scale)
{
    /* Validation first, with the index in the message (the observer only counts). */
    for (int64_t o = 0; o < oc; o++) {
        if (given_scale) {
            float s = given_scale[o];
            if (!(s > 0.0f && isfinite(s) && isfinite(1.0f / s)))
                return qcal_error(QCAL_ERR_INVALID_ARG, "%s: weight_qparams scale[%lld] = %g must be > 0, "
                                  "finite and have a finite inverse", fn, (long long)o, (double)s);
        }
        const float *row = w + o * k;
        for (int64_t j = 0; j < k; j++)
            if (!isfinite(row[j]))
                return qcal_error(QCAL_ERR_NONFINITE, "%s: weight[%lld][%lld] = %g is not finite",
                                  fn, (long long)o, (long long)j, (double)row[j]);
    }

    qcal_tensor t;
    const int64_t shape[2] = {oc, k};
    qcal_status st = qcal_tensor_init(&t, w, 2, shape);
    if (st != QCAL_OK)
        return st;
    int32_t *zp = qcal_calloc((size_t)oc, sizeof *zp);
    if (!zp)
        return QCAL_ERR_NO_MEMORY;
    qcal_observer *obs = NULL;
    if (given_scale) {
        memcpy(scale, given_scale, (size_t)oc * sizeof *scale);
    } else {
        /* PerChannelMinMaxObserver(qint8, per_channel_symmetric), PyTorch 1.13:
         * scale = max(-min(w, 0), max(w, 0)) / 127.5, at least FLT_EPSILON. */
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
        cfg.q.dtype = QCAL_QINT8;
        cfg.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
        cfg.axis = 0;
        cfg.nonfinite = QCAL_NONFINITE_ERROR;
        qcal_qparams oq = {0};
        if ((st = qcal_observer_create(&cfg, &obs)) != QCAL_OK ||
            (st = qcal_observer_update(obs, &t)) != QCAL_OK ||
            (st = qcal_observer_qparams(obs, &oq)) != QCAL_OK)
            goto done;
        if (oq.channels != oc) {
            st = qcal_error(QCAL_ERR_STATE, "%s: the weight observer gave %lld channels, not %lld",
                            fn, (long long)oq.channels, (long long)oc);
            qcal_qparams_free(&oq);
            goto done;
        }
        memcpy(scale, oq.scales, (size_t)oc * sizeof *scale);   /* zero-points: 0 (symmetric) */
        qcal_qparams_free(&oq);
    }
    /* q = clamp(nearbyintf(w * (1 / scale[o])), -128, 127): the rounding contract of
     * qcal/quantize.h (round half to even, clamp in float). */
    qcal_qparams qp;
    if ((st = qcal_qparams_per_channel(&qp, QCAL_QINT8, 0, oc, scale, zp)) == QCAL_OK)
        st = qcal_quantize(&t, &qp, wq);
done:
    qcal_observer_destroy(&obs);
    free(zp);
    return st;
}
