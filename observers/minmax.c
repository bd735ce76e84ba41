/* minmax observer: running minimum and maximum of every finite value seen, as PyTorch
 * 1.13's MinMaxObserver (min_val = min(aminmax(x).min, min_val), likewise max). Exact, so
 * merge is exact and the result does not depend on batch order or splitting.
 * This file also holds the per-tensor state helpers shared with moving_average_minmax.c
 * (observers/minmax_state.h). */
#include <math.h>

#include "observers/minmax_state.h"

bool qcal_minmax_pair_valid(float mn, float mx)
{
    if (mn == INFINITY && mx == -INFINITY)
        return true;
    return isfinite(mn) && isfinite(mx) && mn <= mx;
}

qcal_status qcal_minmax_batch(const qcal_observer *obs, const qcal_tensor *x, int64_t n,
                              float *mn, float *mx, uint64_t *nonfinite)
{
    float l = INFINITY, h = -INFINITY;
    uint64_t bad;
    qcal_f32_minmax(x->data, n, &l, &h, &bad);
    *nonfinite = bad;
    if (bad > 0 && obs->cfg.nonfinite == QCAL_NONFINITE_ERROR)
        return qcal_error(QCAL_ERR_NONFINITE,
                          "%s: batch of %lld values has %llu NaN/Inf (non-finite policy: error)",
                          qcal_observer_kind_name(obs->cfg.kind), (long long)n,
                          (unsigned long long)bad);
    *mn = qcal_minmax_zero(l);
    *mx = qcal_minmax_zero(h);
    return QCAL_OK;
}

/* ---- per-tensor state shared with moving_average_minmax.c ---------------------------- */

qcal_status qcal_pt_state_init(qcal_observer *obs)
{
    qcal_pt_state *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    s->mn = INFINITY;
    s->mx = -INFINITY;
    obs->impl = s;
    return QCAL_OK;
}

void qcal_pt_state_fini(qcal_observer *obs)
{
    free(obs->impl);
    obs->impl = NULL;
}

qcal_status qcal_pt_state_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                                 uint64_t *nonfinite, qcal_pt_fold_fn fold)
{
    float l = INFINITY, h = -INFINITY;
    qcal_status st = qcal_minmax_batch(obs, x, numel, &l, &h, nonfinite);
    if (st != QCAL_OK)
        return st;
    fold(obs->impl, l, h, obs->cfg.averaging_constant);
    return QCAL_OK;
}

void qcal_pt_state_merge(qcal_observer *dst, const qcal_observer *src, qcal_pt_fold_fn fold)
{
    const qcal_pt_state *s = src->impl;
    fold(dst->impl, s->mn, s->mx, dst->cfg.averaging_constant);
}

qcal_status qcal_pt_state_channels(const qcal_observer *obs, int64_t *n)
{
    (void)obs;
    *n = 1;
    return QCAL_OK;
}

qcal_status qcal_pt_state_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                int64_t *n)
{
    (void)cap;
    const qcal_pt_state *s = obs->impl;
    mn[0] = s->mn;
    mx[0] = s->mx;
    *n = 1;
    return s->mn == INFINITY ? QCAL_NO_DATA : QCAL_OK;
}

qcal_status qcal_pt_state_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                 int64_t *n)
{
    return qcal_pt_state_range(obs, cap, mn, mx, n);
}

void qcal_pt_state_reset(qcal_observer *obs)
{
    qcal_pt_state *s = obs->impl;
    s->mn = INFINITY;
    s->mx = -INFINITY;
}

void qcal_pt_state_save(const qcal_observer *obs, qcal_buf *b)
{
    const qcal_pt_state *s = obs->impl;
    qcal_buf_f32(b, s->mn);
    qcal_buf_f32(b, s->mx);
}

qcal_status qcal_pt_state_load(qcal_observer *obs, qcal_cursor *c)
{
    qcal_pt_state *s = obs->impl;
    float mn, mx;
    if (!qcal_cur_f32(c, &mn) || !qcal_cur_f32(c, &mx))
        return qcal_error(QCAL_ERR_FORMAT, "%s state is truncated",
                          qcal_observer_kind_name(obs->cfg.kind));
    if (!qcal_minmax_pair_valid(mn, mx))
        return qcal_error(QCAL_ERR_FORMAT, "%s state has an invalid range [%g, %g]",
                          qcal_observer_kind_name(obs->cfg.kind), (double)mn, (double)mx);
    s->mn = qcal_minmax_zero(mn); /* states written before zeros were canonical */
    s->mx = qcal_minmax_zero(mx);
    return QCAL_OK;
}

/* ---- the minmax kind ---------------------------------------------------------------- */

/* Running min/max; an all-non-finite batch gives (+inf, -inf) and moves nothing. */
static void mm_fold(qcal_pt_state *s, float lo, float hi, float c)
{
    (void)c;
    s->mn = lo < s->mn ? lo : s->mn;
    s->mx = hi > s->mx ? hi : s->mx;
}

static qcal_status mm_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                             uint64_t *nonfinite)
{
    return qcal_pt_state_update(obs, x, numel, nonfinite, mm_fold);
}

static qcal_status mm_merge(qcal_observer *dst, const qcal_observer *src)
{
    qcal_pt_state_merge(dst, src, mm_fold);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_minmax_ops = {
    .kind = QCAL_OBSERVER_MINMAX,
    .init = qcal_pt_state_init,
    .fini = qcal_pt_state_fini,
    .update = mm_update,
    .channels = qcal_pt_state_channels,
    .data_range = qcal_pt_state_range,
    .qrange = qcal_pt_state_qrange,
    .reset = qcal_pt_state_reset,
    .merge = mm_merge,
    .save = qcal_pt_state_save,
    .load = qcal_pt_state_load,
};
