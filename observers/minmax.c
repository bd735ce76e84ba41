/* minmax observer: running minimum and maximum of every finite value seen, as PyTorch
 * 1.13's MinMaxObserver (min_val = min(aminmax(x).min, min_val), likewise max). Exact, so
 * merge is exact and the result does not depend on batch order or splitting. */
#include <math.h>

#include "observers/minmax_kernels.h"
#include "observers/observer_impl.h"

typedef struct minmax_state {
    float mn, mx;   /* (+inf, -inf) until a finite value is seen */
} minmax_state;

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
    *mn = l;
    *mx = h;
    return QCAL_OK;
}

static qcal_status mm_init(qcal_observer *obs)
{
    minmax_state *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    s->mn = INFINITY;
    s->mx = -INFINITY;
    obs->impl = s;
    return QCAL_OK;
}

static void mm_fini(qcal_observer *obs)
{
    free(obs->impl);
    obs->impl = NULL;
}

static qcal_status mm_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                             uint64_t *nonfinite)
{
    minmax_state *s = obs->impl;
    float l = INFINITY, h = -INFINITY;
    qcal_status st = qcal_minmax_batch(obs, x, numel, &l, &h, nonfinite);
    if (st != QCAL_OK)
        return st;
    /* An all-non-finite batch gives (+inf, -inf) and moves nothing. */
    s->mn = l < s->mn ? l : s->mn;
    s->mx = h > s->mx ? h : s->mx;
    return QCAL_OK;
}

static qcal_status mm_channels(const qcal_observer *obs, int64_t *n)
{
    (void)obs;
    *n = 1;
    return QCAL_OK;
}

static qcal_status mm_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                            int64_t *n)
{
    (void)cap;
    const minmax_state *s = obs->impl;
    mn[0] = s->mn;
    mx[0] = s->mx;
    *n = 1;
    return s->mn == INFINITY ? QCAL_NO_DATA : QCAL_OK;
}

static qcal_status mm_qrange(qcal_observer *obs, int64_t cap, float *mn, float *mx, int64_t *n)
{
    return mm_range(obs, cap, mn, mx, n);
}

static void mm_reset(qcal_observer *obs)
{
    minmax_state *s = obs->impl;
    s->mn = INFINITY;
    s->mx = -INFINITY;
}

static qcal_status mm_merge(qcal_observer *dst, const qcal_observer *src)
{
    minmax_state *d = dst->impl;
    const minmax_state *s = src->impl;
    d->mn = s->mn < d->mn ? s->mn : d->mn;
    d->mx = s->mx > d->mx ? s->mx : d->mx;
    return QCAL_OK;
}

static void mm_save(const qcal_observer *obs, qcal_buf *b)
{
    const minmax_state *s = obs->impl;
    qcal_buf_f32(b, s->mn);
    qcal_buf_f32(b, s->mx);
}

static qcal_status mm_load(qcal_observer *obs, qcal_cursor *c)
{
    minmax_state *s = obs->impl;
    float mn, mx;
    if (!qcal_cur_f32(c, &mn) || !qcal_cur_f32(c, &mx))
        return qcal_error(QCAL_ERR_FORMAT, "%s state is truncated",
                          qcal_observer_kind_name(obs->cfg.kind));
    if (!qcal_minmax_pair_valid(mn, mx))
        return qcal_error(QCAL_ERR_FORMAT, "%s state has an invalid range [%g, %g]",
                          qcal_observer_kind_name(obs->cfg.kind), (double)mn, (double)mx);
    s->mn = mn;
    s->mx = mx;
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_minmax_ops = {
    .kind = QCAL_OBSERVER_MINMAX,
    .init = mm_init,
    .fini = mm_fini,
    .update = mm_update,
    .channels = mm_channels,
    .data_range = mm_range,
    .qrange = mm_qrange,
    .reset = mm_reset,
    .merge = mm_merge,
    .save = mm_save,
    .load = mm_load,
};
