/* The generic observer object: config defaults and validation, dispatch to the kind's
 * ops table, non-finite accounting, merge checks and the save/load framing. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/blob_file.h"
#include "core/sha256.h"
#include "observers/observer_impl.h"

static const char *const kind_names[QCAL_OBSERVER_KIND_COUNT] = {
    "minmax", "moving_average_minmax", "per_channel_minmax",
    "moving_average_per_channel_minmax", "histogram", "percentile", "entropy", "mse",
};

static const qcal_observer_ops *ops_for(qcal_observer_kind kind)
{
    switch (kind) {
    case QCAL_OBSERVER_MINMAX: return &qcal_observer_minmax_ops;
    case QCAL_OBSERVER_MOVING_AVERAGE_MINMAX: return &qcal_observer_moving_average_minmax_ops;
    case QCAL_OBSERVER_PER_CHANNEL_MINMAX: return &qcal_observer_per_channel_minmax_ops;
    case QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX:
        return &qcal_observer_moving_average_per_channel_minmax_ops;
    case QCAL_OBSERVER_HISTOGRAM: return &qcal_observer_histogram_ops;
    case QCAL_OBSERVER_PERCENTILE: return &qcal_observer_percentile_ops;
    case QCAL_OBSERVER_ENTROPY: return &qcal_observer_entropy_ops;
    case QCAL_OBSERVER_MSE: return &qcal_observer_mse_ops;
    case QCAL_OBSERVER_KIND_COUNT: break;
    }
    return NULL;
}

static bool kind_is_per_channel(qcal_observer_kind kind)
{
    return kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

static bool kind_is_histogram(qcal_observer_kind kind)
{
    return kind == QCAL_OBSERVER_HISTOGRAM || kind == QCAL_OBSERVER_PERCENTILE ||
           kind == QCAL_OBSERVER_ENTROPY || kind == QCAL_OBSERVER_MSE;
}

bool qcal_observer_kind_commutes(qcal_observer_kind kind)
{
    return ops_for(kind) != NULL && kind != QCAL_OBSERVER_MOVING_AVERAGE_MINMAX &&
           kind != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

bool qcal_observer_config_commutes(const qcal_observer_config *cfg)
{
    if (!cfg || !qcal_observer_kind_commutes(cfg->kind))
        return false;
    /* The histogram family commutes on the lattice grid only; on the first-batch grid its
     * bins follow the first batch and grow in arrival order. */
    return !kind_is_histogram(cfg->kind) || cfg->grid == QCAL_GRID_LATTICE;
}

bool qcal_histobs_config_asymmetric(const qcal_observer_config *cfg)
{
    qcal_qscheme s = cfg->q.qscheme;
    bool affine = s == QCAL_PER_TENSOR_AFFINE || s == QCAL_PER_CHANNEL_AFFINE ||
                  s == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    return affine && !qcal_dtype_is_float8(cfg->q.dtype);
}

void qcal_range_set_empty(float *mn, float *mx, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        mn[i] = INFINITY;
        mx[i] = -INFINITY;
    }
}

const char *qcal_observer_kind_name(qcal_observer_kind kind)
{
    if ((unsigned)kind >= QCAL_OBSERVER_KIND_COUNT)
        return "unknown";
    return kind_names[kind];
}

qcal_status qcal_observer_kind_parse(const char *name, qcal_observer_kind *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer name or output is NULL");
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        if (!strcmp(name, kind_names[k])) {
            *out = (qcal_observer_kind)k;
            return QCAL_OK;
        }
    }
    return qcal_error(QCAL_ERR_INVALID_ARG,
                      "unknown observer '%s' (expected minmax, moving_average_minmax, "
                      "per_channel_minmax, moving_average_per_channel_minmax, histogram, "
                      "percentile, entropy or mse)", name);
}

const char *qcal_observer_grid_name(qcal_observer_grid grid)
{
    switch (grid) {
    case QCAL_GRID_LATTICE: return "lattice";
    case QCAL_GRID_FIRST_BATCH: return "first-batch";
    case QCAL_GRID_TORCH: return "torch";
    }
    return "unknown";
}

qcal_status qcal_observer_grid_parse(const char *name, qcal_observer_grid *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "grid name or output is NULL");
    if (!strcmp(name, "lattice")) {
        *out = QCAL_GRID_LATTICE;
        return QCAL_OK;
    }
    if (!strcmp(name, "first-batch")) {
        *out = QCAL_GRID_FIRST_BATCH;
        return QCAL_OK;
    }
    if (!strcmp(name, "torch")) {
        *out = QCAL_GRID_TORCH;
        return QCAL_OK;
    }
    return qcal_error(QCAL_ERR_INVALID_ARG,
                      "unknown grid '%s' (expected lattice, first-batch or torch)", name);
}

void qcal_observer_config_default(qcal_observer_config *cfg, qcal_observer_kind kind)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    qcal_qconfig_default(&cfg->q);
    if (kind_is_per_channel(kind))
        cfg->q.qscheme = QCAL_PER_CHANNEL_AFFINE;
    cfg->axis = 0;
    cfg->averaging_constant = 0.01f;
    cfg->bins = 2048;
    cfg->grid = QCAL_GRID_LATTICE;
    cfg->percentile = 99.99;
    /* auto only where it means something: other kinds' states keep their version 2 bytes */
    cfg->percentile_mode =
        kind == QCAL_OBSERVER_PERCENTILE ? QCAL_PERCENTILE_AUTO : QCAL_PERCENTILE_ABS;
    cfg->entropy_levels = 128;
    cfg->nonfinite = QCAL_NONFINITE_SKIP;
}

qcal_status qcal_observer_config_validate(const qcal_observer_config *cfg)
{
    if (!cfg)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer config is NULL");
    if ((unsigned)cfg->kind >= QCAL_OBSERVER_KIND_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown observer kind %d", (int)cfg->kind);
    int64_t qmin, qmax;
    qcal_status st = qcal_qconfig_range(&cfg->q, &qmin, &qmax);
    if (st != QCAL_OK)
        return st;
    bool pc_scheme = qcal_qscheme_is_per_channel(cfg->q.qscheme);
    if (kind_is_per_channel(cfg->kind) && !pc_scheme)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer %s needs a per-channel qscheme, not %s",
                          kind_names[cfg->kind], qcal_qscheme_name(cfg->q.qscheme));
    if (!kind_is_per_channel(cfg->kind) && pc_scheme)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer %s needs a per-tensor qscheme, not %s",
                          kind_names[cfg->kind], qcal_qscheme_name(cfg->q.qscheme));
    if (cfg->axis < -QCAL_MAX_DIMS || cfg->axis >= QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "axis %d is out of range [-%d, %d]",
                          (int)cfg->axis, QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1);
    if (cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
        cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX) {
        float c = cfg->averaging_constant;
        if (!(c > 0.0f && c <= 1.0f))
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "averaging constant %g is outside (0, 1]", (double)c);
    }
    if ((cfg->kind == QCAL_OBSERVER_MINMAX || cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX) &&
        cfg->q.reduce_range && cfg->q.dtype == QCAL_QUINT8 &&
        cfg->q.qscheme == QCAL_PER_TENSOR_SYMMETRIC)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "reduce_range is not supported with "
                          "per_tensor_symmetric for quint8 in %s (as PyTorch's; its "
                          "HistogramObserver accepts it)", kind_names[cfg->kind]);
    if (kind_is_histogram(cfg->kind)) {
        if (cfg->bins < 1 || cfg->bins > (1 << 24))
            return qcal_error(QCAL_ERR_INVALID_ARG, "bins %d is outside [1, 16777216]",
                              (int)cfg->bins);
        if ((unsigned)cfg->grid > QCAL_GRID_TORCH)
            return qcal_error(QCAL_ERR_INVALID_ARG, "unknown histogram grid %d (expected "
                              "lattice, first-batch or torch)", (int)cfg->grid);
        if (cfg->grid == QCAL_GRID_TORCH && cfg->kind != QCAL_OBSERVER_HISTOGRAM)
            return qcal_error(QCAL_ERR_INVALID_ARG, "grid=torch reproduces PyTorch's "
                              "HistogramObserver: observer histogram only, not %s",
                              kind_names[cfg->kind]);
        if (cfg->kind == QCAL_OBSERVER_PERCENTILE &&
            !(cfg->percentile > 0.0 && cfg->percentile <= 100.0))
            return qcal_error(QCAL_ERR_INVALID_ARG, "percentile %g is outside (0, 100]",
                              cfg->percentile);
        if (cfg->kind == QCAL_OBSERVER_PERCENTILE &&
            (unsigned)cfg->percentile_mode > QCAL_PERCENTILE_AUTO)
            return qcal_error(QCAL_ERR_INVALID_ARG, "unknown percentile mode %d",
                              (int)cfg->percentile_mode);
        if (cfg->kind == QCAL_OBSERVER_ENTROPY &&
            (cfg->entropy_levels < 2 || cfg->entropy_levels >= cfg->bins))
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "entropy levels %d must be in [2, bins=%d)",
                              (int)cfg->entropy_levels, (int)cfg->bins);
    }
    if ((unsigned)cfg->nonfinite > QCAL_NONFINITE_ERROR)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown non-finite policy %d",
                          (int)cfg->nonfinite);
    return QCAL_OK;
}

qcal_status qcal_observer_create(const qcal_observer_config *cfg, qcal_observer **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer output is NULL");
    qcal_status st = qcal_observer_config_validate(cfg);
    if (st != QCAL_OK)
        return st;
    const qcal_observer_ops *ops = ops_for(cfg->kind);
    qcal_observer *obs = qcal_calloc(1, sizeof *obs);
    if (!obs)
        return QCAL_ERR_NO_MEMORY;
    obs->cfg = *cfg;
    obs->ops = ops;
    st = ops->init(obs);
    if (st != QCAL_OK)
        goto fail;
    *out = obs;
    return QCAL_OK;
fail:
    qcal_observer_destroy(&obs);
    return st;
}

void qcal_observer_destroy(qcal_observer **obs)
{
    if (!obs || !*obs)
        return;
    if ((*obs)->ops && (*obs)->ops->fini)
        (*obs)->ops->fini(*obs);
    free(*obs);
    *obs = NULL;
}

const qcal_observer_config *qcal_observer_get_config(const qcal_observer *obs)
{
    return obs ? &obs->cfg : NULL;
}

qcal_status qcal_observer_update(qcal_observer *obs, const qcal_tensor *x)
{
    if (!obs || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or tensor is NULL");
    int64_t n;
    qcal_status st = qcal_tensor_numel(x, &n);
    if (st != QCAL_OK)
        return st;
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot observe an empty tensor");
    if (!x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor data is NULL");
    uint64_t nonfinite = 0;
    st = obs->ops->update(obs, x, n, &nonfinite);
    if (st < 0)
        return st;
    obs->nonfinite += nonfinite;
    obs->batches++;
    return QCAL_OK;
}

qcal_status qcal_observer_config_memory(const qcal_observer_config *cfg, int64_t channels,
                                        uint64_t *state_bytes, uint64_t *peak_bytes)
{
    if (!cfg || !ops_for(cfg->kind))
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer config is NULL or of an unknown kind");
    uint64_t ch = channels < 1 ? 1 : (uint64_t)channels, state, peak;
    if (kind_is_histogram(cfg->kind)) {
        /* Bytes a bin (bins >= 1). State: the lattice's 2 * bins uint64 cells (the
         * first-batch grid holds half). Peak: a growth, merge or load holds the old and the
         * new cells (32); the search adds the view (bins uint64) and its own scratch:
         * histogram float copy + float cumsum and norms (8 + 12), percentile none (8),
         * entropy clamped copy, prefix counts, double-double prefixes, runs, logs and the
         * candidates' KL (8 + 8 + 16 + 32 + 16 + 16 + 8) for |x|, and for the two-ended
         * search the same without the KL but with the squared error's 128-bit prefixes
         * (8 + 8 + 16 + 32 + 16 + 16 + 32, the larger), mse 128-bit prefixes and errors
         * (8 + 48 + 16). */
        uint64_t bins = cfg->bins < 1 ? 1 : (uint64_t)cfg->bins, search;
        switch (cfg->kind) {
        case QCAL_OBSERVER_HISTOGRAM: search = 20; break;
        case QCAL_OBSERVER_PERCENTILE: search = 8; break;
        case QCAL_OBSERVER_ENTROPY: search = 128; break;
        default: search = 72; break;   /* mse */
        }
        state = 16 * bins;
        peak = state + (search > 16 ? search : 16) * bins;
    } else {
        /* min and max (float each) per channel; the moving averages and the per-channel
         * update keep one more pair of the batch. */
        state = 8 * ch;
        peak = 16 * ch;
    }
    state += sizeof(qcal_observer);
    peak += sizeof(qcal_observer);
    if (state_bytes)
        *state_bytes = state;
    if (peak_bytes)
        *peak_bytes = peak;
    return QCAL_OK;
}

bool qcal_observer_config_splits(const qcal_observer_config *cfg)
{
    /* The histogram family's lattice counts are exact, so its state does not depend on how
     * the values were cut into updates (tests/test_observers_lattice.c: random partitions);
     * nor does a per-tensor min / max, whose zero bounds are kept as +0 whichever zero a pass
     * meets first. Left out: moving averages (one average per update), per-channel kinds (a
     * part is a flat run of values, not whole channels), the first-batch grid (set by the
     * first update) and the error policy (a part could fail after earlier parts of its
     * batch were applied). */
    if (!cfg || !ops_for(cfg->kind) || cfg->nonfinite == QCAL_NONFINITE_ERROR)
        return false;
    if (cfg->kind == QCAL_OBSERVER_MINMAX)
        return true;
    return kind_is_histogram(cfg->kind) && cfg->grid == QCAL_GRID_LATTICE;
}

qcal_status qcal_observer_update_part(qcal_observer *obs, const qcal_tensor *x, bool last)
{
    if (!obs || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or tensor is NULL");
    if (!qcal_observer_config_splits(&obs->cfg))
        return qcal_error(QCAL_ERR_UNSUPPORTED, "%s observer%s: a batch cannot be fed in parts "
                          "(only minmax and the histogram family on the lattice grid, without "
                          "the error non-finite policy)", qcal_observer_kind_name(obs->cfg.kind),
                          kind_is_histogram(obs->cfg.kind) &&
                                  obs->cfg.grid != QCAL_GRID_LATTICE ? " on the first-batch grid"
                                                                     : "");
    int64_t n;
    qcal_status st = qcal_tensor_numel(x, &n);
    if (st != QCAL_OK)
        return st;
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot observe an empty tensor");
    if (!x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor data is NULL");
    uint64_t nonfinite = 0;
    st = obs->ops->update(obs, x, n, &nonfinite);
    if (st < 0)
        return st;
    obs->nonfinite += nonfinite;
    obs->batches += last;
    return QCAL_OK;
}

qcal_status qcal_observer_channels(const qcal_observer *obs, int64_t *n)
{
    if (!obs || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or output is NULL");
    return obs->ops->channels(obs, n);
}

qcal_status qcal_observer_data_range(const qcal_observer *obs, int64_t cap, float *min_val,
                                     float *max_val, int64_t *n)
{
    if (!obs || !min_val || !max_val || !n || cap < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer, outputs or capacity invalid");
    return obs->ops->data_range(obs, cap, min_val, max_val, n);
}

qcal_status qcal_observer_qrange(const qcal_observer *obs, int64_t cap, float *min_val,
                                 float *max_val, int64_t *n)
{
    if (!obs || !min_val || !max_val || !n || cap < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer, outputs or capacity invalid");
    return obs->ops->qrange(obs, cap, min_val, max_val, n);
}

qcal_status qcal_observer_qparams(const qcal_observer *obs, qcal_qparams *out)
{
    if (!obs || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or qparams output is NULL");
    int64_t ch;
    qcal_status st = obs->ops->channels(obs, &ch);
    if (st != QCAL_OK)
        return st;
    if (ch < 1)
        ch = 1;
    float *mn = qcal_malloc((size_t)ch * sizeof *mn);
    float *mx = qcal_malloc((size_t)ch * sizeof *mx);
    if (!mn || !mx) {
        free(mn);
        free(mx);
        return QCAL_ERR_NO_MEMORY;
    }
    int64_t got = 0;
    st = obs->ops->qrange(obs, ch, mn, mx, &got);
    if (st == QCAL_NO_DATA) {
        /* As PyTorch: an observer without data yields one (1.0, 0) pair. */
        mn[0] = INFINITY;
        mx[0] = -INFINITY;
        got = 1;
    }
    if (st >= 0) {
        qcal_status cs = qcal_qparams_compute(&obs->cfg.q, obs->cfg.axis, got, mn, mx, out);
        st = cs < 0 ? cs : (st == QCAL_NO_DATA ? QCAL_NO_DATA : cs);
    }
    free(mn);
    free(mx);
    return st;
}

qcal_status qcal_observer_reset(qcal_observer *obs)
{
    if (!obs)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer is NULL");
    obs->ops->reset(obs);
    obs->nonfinite = 0;
    obs->batches = 0;
    return QCAL_OK;
}

/* Describes the first config field where a and b differ ("bins 2048 vs 1024") into out;
 * returns false when they are equal. Fields a kind does not use are compared too: the
 * state file stores them, so equal configs give equal files. */
static bool config_diff(const qcal_observer_config *a, const qcal_observer_config *b, char *out,
                        size_t cap)
{
#define DIFF_S(name, x, y)                                                                  \
    do {                                                                                    \
        if (strcmp((x), (y))) {                                                             \
            snprintf(out, cap, "%s %s vs %s", name, (x), (y));                              \
            return true;                                                                    \
        }                                                                                   \
    } while (0)
#define DIFF_I(name, x, y)                                                                  \
    do {                                                                                    \
        if ((x) != (y)) {                                                                   \
            snprintf(out, cap, "%s %lld vs %lld", name, (long long)(x), (long long)(y));    \
            return true;                                                                    \
        }                                                                                   \
    } while (0)
#define DIFF_F(name, x, y)                                                                  \
    do {                                                                                    \
        if (memcmp(&(x), &(y), sizeof(x))) {                                                \
            snprintf(out, cap, "%s %.9g vs %.9g", name, (double)(x), (double)(y));          \
            return true;                                                                    \
        }                                                                                   \
    } while (0)
    DIFF_S("observer", qcal_observer_kind_name(a->kind), qcal_observer_kind_name(b->kind));
    DIFF_S("dtype", qcal_dtype_name(a->q.dtype), qcal_dtype_name(b->q.dtype));
    DIFF_S("qscheme", qcal_qscheme_name(a->q.qscheme), qcal_qscheme_name(b->q.qscheme));
    DIFF_I("reduce_range", a->q.reduce_range, b->q.reduce_range);
    DIFF_I("custom range", a->q.custom_range, b->q.custom_range);
    DIFF_I("quant_min", a->q.quant_min, b->q.quant_min);
    DIFF_I("quant_max", a->q.quant_max, b->q.quant_max);
    DIFF_F("eps", a->q.eps, b->q.eps);
    DIFF_I("axis", a->axis, b->axis);
    DIFF_F("averaging_constant", a->averaging_constant, b->averaging_constant);
    DIFF_I("bins", a->bins, b->bins);
    if (kind_is_histogram(a->kind))
        DIFF_S("grid", qcal_observer_grid_name(a->grid), qcal_observer_grid_name(b->grid));
    DIFF_F("percentile", a->percentile, b->percentile);
    DIFF_I("percentile_mode", a->percentile_mode, b->percentile_mode);
    DIFF_I("entropy_levels", a->entropy_levels, b->entropy_levels);
    DIFF_I("nonfinite policy", a->nonfinite, b->nonfinite);
#undef DIFF_S
#undef DIFF_I
#undef DIFF_F
    return false;
}

qcal_status qcal_observer_config_compare(const qcal_observer_config *a,
                                         const qcal_observer_config *b, char *diff,
                                         size_t cap)
{
    char tmp[160];
    if (!a || !b)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer config is NULL");
    if (!diff || cap == 0) {
        diff = tmp;
        cap = sizeof tmp;
    }
    if (!config_diff(a, b, diff, cap)) {
        diff[0] = '\0';
        return QCAL_OK;
    }
    return QCAL_ERR_MISMATCH;
}

/* True when the observer has seen no finite value (its kind state is the empty one). */
static bool observer_empty(const qcal_observer *obs)
{
    int64_t ch = 0;
    if (obs->ops->channels(obs, &ch) != QCAL_OK)
        return false;
    if (ch < 1)
        return true;
    float *mn = qcal_malloc((size_t)ch * sizeof *mn), *mx = qcal_malloc((size_t)ch * sizeof *mx);
    bool empty = false;
    int64_t n = 0;
    if (mn && mx)
        empty = obs->ops->data_range(obs, ch, mn, mx, &n) == QCAL_NO_DATA;
    free(mn);
    free(mx);
    return empty;
}

static bool kind_is_moving_average(qcal_observer_kind kind)
{
    return kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
           kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

qcal_status qcal_observer_merge_check(const qcal_observer *dst, const qcal_observer *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer is NULL");
    if (dst == src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "cannot merge an observer into itself");
    char diff[160];
    if (config_diff(&dst->cfg, &src->cfg, diff, sizeof diff))
        return qcal_error(QCAL_ERR_MISMATCH,
                          "cannot merge an observer of kind %s into one of kind %s: configs "
                          "differ (%s)",
                          kind_names[src->cfg.kind], kind_names[dst->cfg.kind], diff);
    if (kind_is_moving_average(dst->cfg.kind) && !observer_empty(dst) && !observer_empty(src))
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "cannot merge two %s observers that both saw data: a moving average "
                          "depends on the order of its batches (merge is exact only when one "
                          "side is empty)", kind_names[dst->cfg.kind]);
    if (kind_is_per_channel(dst->cfg.kind)) {
        int64_t a = 0, b = 0;
        dst->ops->channels(dst, &a);
        src->ops->channels(src, &b);
        if (a > 0 && b > 0 && a != b)
            return qcal_error(QCAL_ERR_MISMATCH,
                              "cannot merge an observer of kind %s with %lld channels into one "
                              "with %lld",
                              kind_names[dst->cfg.kind], (long long)b, (long long)a);
    }
    return QCAL_OK;
}

qcal_status qcal_observer_merge(qcal_observer *dst, const qcal_observer *src)
{
    qcal_status st = qcal_observer_merge_check(dst, src);
    if (st != QCAL_OK)
        return st;
    st = dst->ops->merge(dst, src);
    if (st < 0)
        return st;
    dst->nonfinite += src->nonfinite;
    dst->batches += src->batches;
    return QCAL_OK;
}

qcal_status qcal_observer_nonfinite(const qcal_observer *obs, uint64_t *count)
{
    if (!obs || !count)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or output is NULL");
    *count = obs->nonfinite;
    return QCAL_OK;
}

qcal_status qcal_observer_batches(const qcal_observer *obs, uint64_t *count)
{
    if (!obs || !count)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or output is NULL");
    *count = obs->batches;
    return QCAL_OK;
}

/* ---- State files (format: docs/state.md) -------------------------------------------- */

#define OBS_MAGIC 0x424f4351u /* "QCOB" little-endian */
#define OBS_VERSION 3u

/* Version 3 changed what two kinds keep: entropy and mse with an asymmetric target (affine
 * qscheme, integer dtype) hold a histogram of x, no longer of |x|, and percentile gained the
 * mode auto. Every other state is byte for byte what version 2 wrote, so it is still written
 * as version 2 (digests and files of unchanged states stay the same) and version 2 is read;
 * a version 2 state of a changed config holds |x| and is refused (collect it again). */
static bool state_is_v3(const qcal_observer_config *c)
{
    if (c->kind == QCAL_OBSERVER_ENTROPY || c->kind == QCAL_OBSERVER_MSE)
        return qcal_histobs_config_asymmetric(c);
    return c->kind == QCAL_OBSERVER_PERCENTILE && c->percentile_mode == QCAL_PERCENTILE_AUTO;
}
#define OBS_HEADER_BYTES 108u

/* Config fields in file order. A new config field goes at the end of this list, with a
 * version bump and a line in docs/state.md. */
static void save_config(qcal_buf *b, const qcal_observer_config *c)
{
    qcal_buf_u32(b, (uint32_t)c->kind);
    qcal_buf_u32(b, (uint32_t)c->q.dtype);
    qcal_buf_u32(b, (uint32_t)c->q.qscheme);
    qcal_buf_u32(b, c->q.reduce_range);
    qcal_buf_u32(b, c->q.custom_range);
    qcal_buf_u64(b, (uint64_t)c->q.quant_min);
    qcal_buf_u64(b, (uint64_t)c->q.quant_max);
    qcal_buf_f32(b, c->q.eps);
    qcal_buf_u32(b, (uint32_t)c->axis);
    qcal_buf_f32(b, c->averaging_constant);
    qcal_buf_u32(b, (uint32_t)c->bins);
    qcal_buf_u32(b, (uint32_t)c->grid);   /* version 1: upsample_rate (unused) */
    qcal_buf_f64(b, c->percentile);
    qcal_buf_u32(b, (uint32_t)c->percentile_mode);
    qcal_buf_u32(b, (uint32_t)c->entropy_levels);
    qcal_buf_u32(b, (uint32_t)c->nonfinite);
}

static bool load_config(qcal_cursor *cur, qcal_observer_config *c)
{
    uint32_t u[8];
    uint64_t qmin, qmax;
    bool ok = qcal_cur_u32(cur, &u[0]) && qcal_cur_u32(cur, &u[1]) && qcal_cur_u32(cur, &u[2]) &&
              qcal_cur_u32(cur, &u[3]) && qcal_cur_u32(cur, &u[4]) && qcal_cur_u64(cur, &qmin) &&
              qcal_cur_u64(cur, &qmax) && qcal_cur_f32(cur, &c->q.eps);
    if (!ok)
        return false;
    if (u[3] > 1 || u[4] > 1)
        return false;   /* booleans are 0 or 1: one spelling per state */
    c->kind = (qcal_observer_kind)u[0];
    c->q.dtype = (qcal_dtype)u[1];
    c->q.qscheme = (qcal_qscheme)u[2];
    c->q.reduce_range = u[3] != 0;
    c->q.custom_range = u[4] != 0;
    c->q.quant_min = (int64_t)qmin;
    c->q.quant_max = (int64_t)qmax;
    ok = qcal_cur_u32(cur, &u[0]) && qcal_cur_f32(cur, &c->averaging_constant) &&
         qcal_cur_u32(cur, &u[1]) && qcal_cur_u32(cur, &u[2]) &&
         qcal_cur_f64(cur, &c->percentile) && qcal_cur_u32(cur, &u[3]) &&
         qcal_cur_u32(cur, &u[4]) && qcal_cur_u32(cur, &u[5]);
    if (!ok)
        return false;
    c->axis = (int32_t)u[0];
    c->bins = (int32_t)u[1];
    c->grid = (qcal_observer_grid)u[2];
    c->percentile_mode = (qcal_percentile_mode)u[3];
    c->entropy_levels = (int32_t)u[4];
    c->nonfinite = (qcal_nonfinite_policy)u[5];
    return true;
}

qcal_status qcal_observer_state_append(const qcal_observer *obs, qcal_buf *b, bool canonical)
{
    size_t start = b->len;
    qcal_buf_u32(b, OBS_MAGIC);
    qcal_buf_u32(b, state_is_v3(&obs->cfg) ? OBS_VERSION : 2u);
    save_config(b, &obs->cfg);
    qcal_buf_u64(b, obs->nonfinite);
    qcal_buf_u64(b, canonical ? 0 : obs->batches);
    size_t len_at = b->len;
    qcal_buf_u64(b, 0);   /* payload length, patched below */
    size_t payload_at = b->len;
    obs->ops->save(obs, b);
    if (b->failed)
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the observer state buffer");
    if (len_at - start != OBS_HEADER_BYTES - 8)
        return qcal_error(QCAL_ERR_STATE, "observer state header is %zu bytes, expected %u",
                          len_at - start + 8, OBS_HEADER_BYTES);
    uint64_t payload = (uint64_t)(b->len - payload_at);
    memcpy(b->data + len_at, &payload, 8);
    return QCAL_OK;
}

qcal_status qcal_observer_state_parse(qcal_cursor *cur, qcal_observer **out)
{
    uint32_t magic, version;
    if (!qcal_cur_u32(cur, &magic) || magic != OBS_MAGIC)
        return qcal_error(QCAL_ERR_FORMAT, "not a qcal observer state (bad magic)");
    if (!qcal_cur_u32(cur, &version))
        return qcal_error(QCAL_ERR_FORMAT, "observer state is truncated in its header");
    if (version != OBS_VERSION && version != 2u)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "observer state version %u is not supported (this qcal reads "
                          "version %u)", (unsigned)version, OBS_VERSION);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    if (!load_config(cur, &cfg))
        return qcal_error(QCAL_ERR_FORMAT, "observer state is truncated in its config or has a "
                          "flag other than 0 or 1");
    if (version == 2u && state_is_v3(&cfg))
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "observer state version 2 of a %s observer with an affine target "
                          "holds a histogram of |x|; since version 3 it searches both ends "
                          "on a histogram of x: collect the data again",
                          kind_names[cfg.kind]);
    uint64_t nonfinite, batches, payload;
    if (!qcal_cur_u64(cur, &nonfinite) || !qcal_cur_u64(cur, &batches) ||
        !qcal_cur_u64(cur, &payload))
        return qcal_error(QCAL_ERR_FORMAT, "observer state is truncated in its header");
    if (payload > cur->left)
        return qcal_error(QCAL_ERR_FORMAT,
                          "observer state payload of %llu bytes, only %zu bytes left",
                          (unsigned long long)payload, cur->left);
    qcal_observer *obs = NULL;
    qcal_status st = qcal_observer_create(&cfg, &obs);
    if (st != QCAL_OK)
        return st == QCAL_ERR_NO_MEMORY ? st
                                        : qcal_error(QCAL_ERR_FORMAT,
                                                     "observer state has an invalid config: %s",
                                                     qcal_last_error());
    obs->nonfinite = nonfinite;
    obs->batches = batches;
    qcal_cursor pc = { .p = cur->p, .left = (size_t)payload };
    st = obs->ops->load(obs, &pc);
    if (st != QCAL_OK)
        goto fail;
    if (pc.left != 0) {
        st = qcal_error(QCAL_ERR_FORMAT, "%s state has %zu trailing bytes in its payload",
                        kind_names[cfg.kind], pc.left);
        goto fail;
    }
    cur->p += payload;
    cur->left -= (size_t)payload;
    *out = obs;
    return QCAL_OK;
fail:
    qcal_observer_destroy(&obs);
    return st;
}

qcal_status qcal_observer_save(const qcal_observer *obs, void **buf, size_t *len)
{
    if (!obs || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or outputs are NULL");
    qcal_buf b = { 0 };
    qcal_status st = qcal_observer_state_append(obs, &b, false);
    if (st != QCAL_OK) {
        qcal_buf_free(&b);
        return st;
    }
    *buf = b.data;
    *len = b.len;
    return QCAL_OK;
}

qcal_status qcal_observer_load(const void *buf, size_t len, qcal_observer **out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "buffer or output is NULL");
    qcal_cursor cur = { .p = buf, .left = len };
    qcal_observer *obs = NULL;
    qcal_status st = qcal_observer_state_parse(&cur, &obs);
    if (st != QCAL_OK)
        return st;
    if (cur.left != 0) {
        qcal_observer_destroy(&obs);
        return qcal_error(QCAL_ERR_FORMAT, "observer state has %zu trailing bytes", cur.left);
    }
    *out = obs;
    return QCAL_OK;
}

qcal_status qcal_observer_save_file(const qcal_observer *obs, const char *path)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_observer_save(obs, &buf, &len);
    if (st != QCAL_OK)
        return st;
    st = qcal_blob_write_file(path, buf, len);
    free(buf);
    return st;
}

qcal_status qcal_observer_load_file(const char *path, qcal_observer **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "observer state", SIZE_MAX, &buf, &len);
    if (st != QCAL_OK)
        return st;
    st = qcal_observer_load(buf, len, out);
    free(buf);
    if (st < 0 && st != QCAL_ERR_NO_MEMORY) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        return qcal_error(st, "'%s': %s", path, msg);
    }
    return st;
}

qcal_status qcal_observer_digest(const qcal_observer *obs, char hex[65])
{
    if (!obs || !hex)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or output is NULL");
    qcal_buf b = { 0 };
    qcal_status st = qcal_observer_state_append(obs, &b, true);
    if (st == QCAL_OK)
        qcal_sha256_hex(b.data, b.len, hex);
    qcal_buf_free(&b);
    return st;
}
