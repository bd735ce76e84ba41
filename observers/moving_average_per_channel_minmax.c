/* moving_average_per_channel_minmax observer: per-channel exponential moving average of
 * each batch's finite min/max along cfg.axis, as PyTorch 1.13's
 * MovingAveragePerChannelMinMaxObserver in float32:
 *   first batch:  min_val[c] = min(x[c])
 *   later:        min_val[c] = min_val[c] + c_avg * (min(x[c]) - min_val[c])
 * Channel count fixed by the first batch (QCAL_ERR_MISMATCH otherwise). A channel with no
 * finite value in a batch does not move; a channel that has never seen a finite value is
 * initialised by its first finite batch (PyTorch would compute inf + c*(x - inf) = NaN).
 * Merge: exact when either side has no data; two observers that both saw data are refused
 * by qcal_observer_merge (order-dependent). */
#include <math.h>

#include "observers/minmax_state.h"

static void mapc_apply(qcal_pc_state *s, const float *l, const float *h, float c)
{
    for (int64_t k = 0; k < s->channels; k++) {
        if (l[k] == INFINITY)
            continue;                        /* channel without finite values */
        if (s->mn[k] == INFINITY && s->mx[k] == -INFINITY) {
            s->mn[k] = l[k];
            s->mx[k] = h[k];
            continue;
        }
        s->mn[k] = qcal_minmax_ema(s->mn[k], l[k], c);
        s->mx[k] = qcal_minmax_ema(s->mx[k], h[k], c);
    }
}

static qcal_status mapc_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                               uint64_t *nonfinite)
{
    (void)numel;
    return qcal_pc_state_update(obs, x, nonfinite, mapc_apply);
}

static qcal_status mapc_merge(qcal_observer *dst, const qcal_observer *src)
{
    return qcal_pc_state_merge(dst, src, mapc_apply);
}

const qcal_observer_ops qcal_observer_moving_average_per_channel_minmax_ops = {
    .kind = QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX,
    .init = qcal_pc_state_init,
    .fini = qcal_pc_state_fini,
    .update = mapc_update,
    .channels = qcal_pc_state_channels,
    .data_range = qcal_pc_state_range,
    .qrange = qcal_pc_state_qrange,
    .reset = qcal_pc_state_reset,
    .merge = mapc_merge,
    .save = qcal_pc_state_save,
    .load = qcal_pc_state_load,
};
