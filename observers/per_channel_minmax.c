/* per_channel_minmax observer: running min/max of every channel along cfg.axis (negative
 * counts from the end), as PyTorch 1.13's PerChannelMinMaxObserver. The first batch fixes
 * the channel count; a later batch with another count fails with QCAL_ERR_MISMATCH and
 * changes nothing. A channel whose values in a batch are all non-finite does not move in
 * that batch (it stays (+inf, -inf), "no data", until it sees a finite value; qparams then
 * give it scale 1, zero-point 0 and return QCAL_NO_DATA). Exact: merge is exact.
 * This file also holds the per-channel state helpers shared with
 * moving_average_per_channel_minmax.c (observers/minmax_state.h). */
#include <math.h>
#include <string.h>

#include "observers/minmax_state.h"

qcal_status qcal_minmax_channels_batch(const qcal_observer *obs, const qcal_tensor *x,
                                       int64_t expect_channels, float **mn, float **mx,
                                       int64_t *channels, uint64_t *nonfinite)
{
    int32_t axis;
    qcal_status st = qcal_tensor_axis(x, obs->cfg.axis, &axis);
    if (st != QCAL_OK)
        return st;
    int64_t ch = x->shape[axis], outer = 1, inner = 1;
    if (expect_channels > 0 && ch != expect_channels)
        return qcal_error(QCAL_ERR_MISMATCH,
                          "%s: batch has %lld channels along axis %d but the observer has %lld",
                          qcal_observer_kind_name(obs->cfg.kind), (long long)ch,
                          (int)obs->cfg.axis, (long long)expect_channels);
    for (int32_t i = 0; i < axis; i++)
        outer *= x->shape[i];      /* no overflow: numel was checked by the caller */
    for (int32_t i = axis + 1; i < x->ndim; i++)
        inner *= x->shape[i];
    float *l = qcal_malloc((size_t)ch * sizeof *l);
    float *h = qcal_malloc((size_t)ch * sizeof *h);
    uint64_t bad = 0;
    /* x is (outer, ch, inner) around the channel axis. */
    if (!l || !h || !qcal_f32_minmax_channels(x->data, outer, ch, inner, l, h, &bad)) {
        free(l);
        free(h);
        return QCAL_ERR_NO_MEMORY;
    }
    *nonfinite = bad;
    if (bad > 0 && obs->cfg.nonfinite == QCAL_NONFINITE_ERROR) {
        free(l);
        free(h);
        return qcal_error(QCAL_ERR_NONFINITE,
                          "%s: batch has %llu NaN/Inf values (non-finite policy: error)",
                          qcal_observer_kind_name(obs->cfg.kind), (unsigned long long)bad);
    }
    for (int64_t c = 0; c < ch; c++) {
        l[c] = qcal_minmax_zero(l[c]);
        h[c] = qcal_minmax_zero(h[c]);
    }
    *mn = l;
    *mx = h;
    *channels = ch;
    return QCAL_OK;
}

qcal_status qcal_pc_state_init(qcal_observer *obs)
{
    qcal_pc_state *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    obs->impl = s;
    return QCAL_OK;
}

void qcal_pc_state_fini(qcal_observer *obs)
{
    qcal_pc_state *s = obs->impl;
    if (s) {
        free(s->mn);
        free(s->mx);
    }
    free(s);
    obs->impl = NULL;
}

void qcal_pc_state_reset(qcal_observer *obs)
{
    qcal_pc_state *s = obs->impl;
    free(s->mn);
    free(s->mx);
    s->mn = s->mx = NULL;
    s->channels = 0;
}

void qcal_pc_state_adopt(qcal_observer *obs, float *mn, float *mx, int64_t channels)
{
    qcal_pc_state *s = obs->impl;
    free(s->mn);
    free(s->mx);
    s->mn = mn;
    s->mx = mx;
    s->channels = channels;
}

qcal_status qcal_pc_state_copy(qcal_observer *dst, const qcal_observer *src)
{
    const qcal_pc_state *s = src->impl;
    size_t bytes = (size_t)s->channels * sizeof(float);
    float *mn = qcal_malloc(bytes), *mx = qcal_malloc(bytes);
    if (!mn || !mx) {
        free(mn);
        free(mx);
        return QCAL_ERR_NO_MEMORY;
    }
    memcpy(mn, s->mn, bytes);
    memcpy(mx, s->mx, bytes);
    qcal_pc_state_adopt(dst, mn, mx, s->channels);
    return QCAL_OK;
}

qcal_status qcal_pc_state_channels(const qcal_observer *obs, int64_t *n)
{
    const qcal_pc_state *s = obs->impl;
    *n = s->channels;
    return QCAL_OK;
}

qcal_status qcal_pc_state_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                int64_t *n)
{
    const qcal_pc_state *s = obs->impl;
    if (s->channels == 0) {
        qcal_range_set_empty(mn, mx, 1);
        *n = 0;
        return QCAL_NO_DATA;
    }
    if (cap < s->channels)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output capacity %lld < %lld channels",
                          (long long)cap, (long long)s->channels);
    memcpy(mn, s->mn, (size_t)s->channels * sizeof *mn);
    memcpy(mx, s->mx, (size_t)s->channels * sizeof *mx);
    *n = s->channels;
    return QCAL_OK;
}

qcal_status qcal_pc_state_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                 int64_t *n)
{
    return qcal_pc_state_range(obs, cap, mn, mx, n);
}

void qcal_pc_state_save(const qcal_observer *obs, qcal_buf *b)
{
    const qcal_pc_state *s = obs->impl;
    qcal_buf_u64(b, (uint64_t)s->channels);
    for (int64_t c = 0; c < s->channels; c++) {
        qcal_buf_f32(b, s->mn[c]);
        qcal_buf_f32(b, s->mx[c]);
    }
}

qcal_status qcal_pc_state_load(qcal_observer *obs, qcal_cursor *c)
{
    const char *name = qcal_observer_kind_name(obs->cfg.kind);
    uint64_t ch;
    if (!qcal_cur_u64(c, &ch))
        return qcal_error(QCAL_ERR_FORMAT, "%s state is truncated", name);
    if (ch > c->left / 8)
        return qcal_error(QCAL_ERR_FORMAT, "%s state claims %llu channels but holds %zu bytes",
                          name, (unsigned long long)ch, c->left);
    if (ch == 0) {
        qcal_pc_state_reset(obs);
        return QCAL_OK;
    }
    float *mn = qcal_malloc((size_t)ch * sizeof *mn), *mx = qcal_malloc((size_t)ch * sizeof *mx);
    if (!mn || !mx) {
        free(mn);
        free(mx);
        return QCAL_ERR_NO_MEMORY;
    }
    for (uint64_t i = 0; i < ch; i++) {
        qcal_cur_f32(c, &mn[i]);
        qcal_cur_f32(c, &mx[i]);
        if (!qcal_minmax_pair_valid(mn[i], mx[i])) {
            qcal_status st = qcal_error(QCAL_ERR_FORMAT,
                                        "%s state: channel %llu has an invalid range [%g, %g]",
                                        name, (unsigned long long)i, (double)mn[i],
                                        (double)mx[i]);
            free(mn);
            free(mx);
            return st;
        }
        mn[i] = qcal_minmax_zero(mn[i]); /* states written before zeros were canonical */
        mx[i] = qcal_minmax_zero(mx[i]);
    }
    qcal_pc_state_adopt(obs, mn, mx, (int64_t)ch);
    return QCAL_OK;
}

qcal_status qcal_pc_state_update(qcal_observer *obs, const qcal_tensor *x,
                                 uint64_t *nonfinite, qcal_pc_fold_fn fold)
{
    qcal_pc_state *s = obs->impl;
    float *l = NULL, *h = NULL;
    int64_t ch = 0;
    qcal_status st = qcal_minmax_channels_batch(obs, x, s->channels, &l, &h, &ch, nonfinite);
    if (st != QCAL_OK)
        return st;
    if (s->channels == 0) {
        qcal_pc_state_adopt(obs, l, h, ch);
        return QCAL_OK;
    }
    fold(s, l, h, obs->cfg.averaging_constant);
    free(l);
    free(h);
    return QCAL_OK;
}

qcal_status qcal_pc_state_merge(qcal_observer *dst, const qcal_observer *src,
                                qcal_pc_fold_fn fold)
{
    qcal_pc_state *d = dst->impl;
    const qcal_pc_state *s = src->impl;
    if (s->channels == 0)
        return QCAL_OK;
    if (d->channels == 0)
        return qcal_pc_state_copy(dst, src);
    if (d->channels != s->channels)
        return qcal_error(QCAL_ERR_MISMATCH, "cannot merge %lld channels into %lld",
                          (long long)s->channels, (long long)d->channels);
    fold(d, s->mn, s->mx, dst->cfg.averaging_constant);
    return QCAL_OK;
}

/* ---- the per_channel_minmax kind ------------------------------------------------- */

static void pc_fold(qcal_pc_state *s, const float *l, const float *h, float c_avg)
{
    (void)c_avg;
    for (int64_t c = 0; c < s->channels; c++) {
        s->mn[c] = l[c] < s->mn[c] ? l[c] : s->mn[c];
        s->mx[c] = h[c] > s->mx[c] ? h[c] : s->mx[c];
    }
}

static qcal_status pc_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                             uint64_t *nonfinite)
{
    (void)numel;
    return qcal_pc_state_update(obs, x, nonfinite, pc_fold);
}

static qcal_status pc_merge(qcal_observer *dst, const qcal_observer *src)
{
    return qcal_pc_state_merge(dst, src, pc_fold);
}

const qcal_observer_ops qcal_observer_per_channel_minmax_ops = {
    .kind = QCAL_OBSERVER_PER_CHANNEL_MINMAX,
    .init = qcal_pc_state_init,
    .fini = qcal_pc_state_fini,
    .update = pc_update,
    .channels = qcal_pc_state_channels,
    .data_range = qcal_pc_state_range,
    .qrange = qcal_pc_state_qrange,
    .reset = qcal_pc_state_reset,
    .merge = pc_merge,
    .save = qcal_pc_state_save,
    .load = qcal_pc_state_load,
};
