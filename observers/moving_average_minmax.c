/* moving_average_minmax observer: exponential moving average of each batch's finite
 * min/max, as PyTorch 1.13's MovingAverageMinMaxObserver.forward in float32:
 *   first batch:  min_val = min(x)
 *   later:        min_val = min_val + c * (min(x) - min_val)   (three float32 ops, no FMA)
 * with c = averaging_constant (float32). A batch without finite values does not move the
 * averages (PyTorch would fold NaN into them). Merge: exact when either side is empty;
 * two observers that both saw data are refused by qcal_observer_merge (order-dependent). */
#include <math.h>

#include "observers/minmax_state.h"

/* Kept as separate float32 statements; the project builds with -std=c11, where GCC does
 * not contract a*b+c into an FMA (-ffp-contract=off), matching PyTorch's two roundings. */
float qcal_minmax_ema(float avg, float now, float c)
{
    float d = now - avg;
    float step = c * d;
    float r = avg + step;
    /* |now - avg| beyond FLT_MAX (PyTorch: inf, then NaN): redo in double, exact enough
     * and always finite since the result lies between avg and now. */
    if (!isfinite(r))
        r = (float)((double)avg + (double)c * ((double)now - (double)avg));
    return r;
}

static void ma_apply(qcal_pt_state *s, float l, float h, float c)
{
    if (l == INFINITY)
        return;                       /* no finite value in this batch */
    if (s->mn == INFINITY && s->mx == -INFINITY) {
        s->mn = l;
        s->mx = h;
        return;
    }
    s->mn = qcal_minmax_ema(s->mn, l, c);
    s->mx = qcal_minmax_ema(s->mx, h, c);
}

static qcal_status ma_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                             uint64_t *nonfinite)
{
    return qcal_pt_state_update(obs, x, numel, nonfinite, ma_apply);
}

static qcal_status ma_merge(qcal_observer *dst, const qcal_observer *src)
{
    qcal_pt_state_merge(dst, src, ma_apply);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_moving_average_minmax_ops = {
    .kind = QCAL_OBSERVER_MOVING_AVERAGE_MINMAX,
    .init = qcal_pt_state_init,
    .fini = qcal_pt_state_fini,
    .update = ma_update,
    .channels = qcal_pt_state_channels,
    .data_range = qcal_pt_state_range,
    .qrange = qcal_pt_state_qrange,
    .reset = qcal_pt_state_reset,
    .merge = ma_merge,
    .save = qcal_pt_state_save,
    .load = qcal_pt_state_load,
};
