/* moving_average_minmax observer: exponential moving average of each batch's finite
 * min/max, as PyTorch 1.13's MovingAverageMinMaxObserver.forward in float32:
 *   first batch:  min_val = min(x)
 *   later:        min_val = min_val + c * (min(x) - min_val)   (three float32 ops, no FMA)
 * with c = averaging_constant (float32). A batch without finite values does not move the
 * averages (PyTorch would fold NaN into them). Merge: exact when either side is empty;
 * otherwise dst keeps its average and src's average is applied as one more batch. */
#include <math.h>

#include "observers/minmax_kernels.h"
#include "observers/observer_impl.h"

typedef struct ma_state {
    float mn, mx;   /* (+inf, -inf) until the first batch with a finite value */
} ma_state;

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

static qcal_status ma_init(qcal_observer *obs)
{
    ma_state *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    s->mn = INFINITY;
    s->mx = -INFINITY;
    obs->impl = s;
    return QCAL_OK;
}

static void ma_fini(qcal_observer *obs)
{
    free(obs->impl);
    obs->impl = NULL;
}

static void ma_apply(ma_state *s, float l, float h, float c)
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
    float l = INFINITY, h = -INFINITY;
    qcal_status st = qcal_minmax_batch(obs, x, numel, &l, &h, nonfinite);
    if (st != QCAL_OK)
        return st;
    ma_apply(obs->impl, l, h, obs->cfg.averaging_constant);
    return QCAL_OK;
}

static qcal_status ma_channels(const qcal_observer *obs, int64_t *n)
{
    (void)obs;
    *n = 1;
    return QCAL_OK;
}

static qcal_status ma_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                            int64_t *n)
{
    (void)cap;
    const ma_state *s = obs->impl;
    mn[0] = s->mn;
    mx[0] = s->mx;
    *n = 1;
    return s->mn == INFINITY ? QCAL_NO_DATA : QCAL_OK;
}

static qcal_status ma_qrange(qcal_observer *obs, int64_t cap, float *mn, float *mx, int64_t *n)
{
    return ma_range(obs, cap, mn, mx, n);
}

static void ma_reset(qcal_observer *obs)
{
    ma_state *s = obs->impl;
    s->mn = INFINITY;
    s->mx = -INFINITY;
}

static qcal_status ma_merge(qcal_observer *dst, const qcal_observer *src)
{
    const ma_state *s = src->impl;
    ma_apply(dst->impl, s->mn, s->mx, dst->cfg.averaging_constant);
    return QCAL_OK;
}

static void ma_save(const qcal_observer *obs, qcal_buf *b)
{
    const ma_state *s = obs->impl;
    qcal_buf_f32(b, s->mn);
    qcal_buf_f32(b, s->mx);
}

static qcal_status ma_load(qcal_observer *obs, qcal_cursor *c)
{
    ma_state *s = obs->impl;
    float mn, mx;
    if (!qcal_cur_f32(c, &mn) || !qcal_cur_f32(c, &mx))
        return qcal_error(QCAL_ERR_FORMAT, "moving_average_minmax state is truncated");
    if (!qcal_minmax_pair_valid(mn, mx))
        return qcal_error(QCAL_ERR_FORMAT,
                          "moving_average_minmax state has an invalid range [%g, %g]",
                          (double)mn, (double)mx);
    s->mn = mn;
    s->mx = mx;
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_moving_average_minmax_ops = {
    .kind = QCAL_OBSERVER_MOVING_AVERAGE_MINMAX,
    .init = ma_init,
    .fini = ma_fini,
    .update = ma_update,
    .channels = ma_channels,
    .data_range = ma_range,
    .qrange = ma_qrange,
    .reset = ma_reset,
    .merge = ma_merge,
    .save = ma_save,
    .load = ma_load,
};
