/* Weight quantization of the int8 runtime (internal): every conv / linear weight goes through
 * the library's own pipeline, observer -> qparams -> quantize, as a user would call it. */
#ifndef QCAL_INT8_WEIGHTS_H
#define QCAL_INT8_WEIGHTS_H

#include <stdint.h>

#include "qcal/common.h"

/* Quantizes w, (oc, k) f32 row-major (caller owned, read only), into wq (oc * k s8, caller
 * owned) with per-output-channel symmetric qint8 qparams, written to scale[oc]:
 * - given_scale NULL: a per_channel_minmax observer (qint8, per_channel_symmetric, axis 0)
 *   sees w, and its qparams are used (PyTorch's PerChannelMinMaxObserver, bit-identical);
 * - else given_scale[oc] (each > 0, finite, with a finite inverse) is copied.
 * Then qcal_quantize (per-channel qint8, axis 0, zero-points 0). A non-finite weight is
 * QCAL_ERR_NONFINITE naming its index; fn prefixes every message. */
qcal_status qcal_int8_weights_quantize(const char *fn, int64_t oc, int64_t k, const float *w,
                                       const float *given_scale, int8_t *wq, float *scale);

#endif
