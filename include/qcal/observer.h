/* qcal observers: one object API for every range-collecting observer.
 *
 *   qcal_observer_config cfg;
 *   qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
 *   qcal_observer *obs = NULL;
 *   qcal_observer_create(&cfg, &obs);
 *   for each batch: qcal_observer_update(obs, &batch);
 *   qcal_qparams qp = {0};
 *   qcal_observer_qparams(obs, &qp);     // qp.scale, qp.zero_point (per-channel: qp.scales...)
 *   qcal_qparams_free(&qp);
 *   qcal_observer_destroy(&obs);
 *
 * Each kind documents its algorithm in its own header (qcal/observers/<kind>.h).
 * Non-finite values (NaN, +-Inf) are never folded into a range: by default they are
 * skipped and counted (qcal_observer_nonfinite); with QCAL_NONFINITE_ERROR an update that
 * contains one fails with QCAL_ERR_NONFINITE and leaves the observer unchanged.
 * An observer is not thread-safe; use one per thread and qcal_observer_merge, or a
 * calibration session (qcal/calib.h), which serialises access. */
#ifndef QCAL_OBSERVER_H
#define QCAL_OBSERVER_H

#include "qcal/common.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_observer_kind {
    QCAL_OBSERVER_MINMAX = 0,                          /* "minmax" */
    QCAL_OBSERVER_MOVING_AVERAGE_MINMAX = 1,           /* "moving_average_minmax" */
    QCAL_OBSERVER_PER_CHANNEL_MINMAX = 2,              /* "per_channel_minmax" */
    QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX = 3, /* "moving_average_per_channel_minmax" */
    QCAL_OBSERVER_HISTOGRAM = 4,                       /* "histogram" (L2 search, PyTorch) */
    QCAL_OBSERVER_PERCENTILE = 5,                      /* "percentile" */
    QCAL_OBSERVER_ENTROPY = 6,                         /* "entropy" (KL, TensorRT) */
    QCAL_OBSERVER_MSE = 7,                             /* "mse" */
    QCAL_OBSERVER_KIND_COUNT = 8
} qcal_observer_kind;

typedef enum qcal_nonfinite_policy {
    QCAL_NONFINITE_SKIP = 0,    /* skip NaN/Inf and count them (default) */
    QCAL_NONFINITE_ERROR = 1,   /* fail the update with QCAL_ERR_NONFINITE */
} qcal_nonfinite_policy;

typedef enum qcal_percentile_mode {
    QCAL_PERCENTILE_ABS = 0,        /* clip symmetric at the percentile of |x| */
    QCAL_PERCENTILE_TWO_TAILS = 1,  /* clip (100-p)/2 percent off each tail of x */
    QCAL_PERCENTILE_AUTO = 2,       /* default: two tails for an asymmetric target (affine
                                     * qscheme, integer dtype), abs for a symmetric one */
} qcal_percentile_mode;

/* Histogram family: where bins lie (docs/observers.md, "The lattice grid"). */
typedef enum qcal_observer_grid {
    QCAL_GRID_LATTICE = 0,      /* "lattice" (default): cells of width 2^e anchored at zero,
                                 * e fixed by the data range; everything reported depends only
                                 * on the multiset of values seen; exact merges */
    QCAL_GRID_FIRST_BATCH = 1,  /* "first-batch": bins over the first batch's [min, max],
                                 * grown by doubling: torch.histc / PyTorch parity on one
                                 * batch, but order-dependent after growth */
    QCAL_GRID_TORCH = 2,        /* "torch" (histogram kind only): PyTorch 1.13's
                                 * HistogramObserver bit for bit (int()-truncated histc
                                 * bounds, upsample/resample on growth, order-dependent;
                                 * merges only with an empty side) */
} qcal_observer_grid;

/* An observer's settings. Rules files (key=value), CLI options (--key VALUE) and Python
 * keywords spell them as flat keys; qcal_observer_config_set(&cfg, key, value) sets one by
 * that name (the key table: qcal_observer_config_key). Where each key lands (q is the
 * qcal_qconfig that qcal_qparams_compute takes, qcal/qparams.h):
 *   observer           -> kind (and every other field reset to that kind's defaults)
 *   dtype              -> q.dtype
 *   qscheme            -> q.qscheme
 *   reduce_range       -> q.reduce_range
 *   quant_min          -> q.quant_min (and q.custom_range = true; give quant_max too)
 *   quant_max          -> q.quant_max (and q.custom_range = true)
 *   eps                -> q.eps
 *   axis               -> axis
 *   averaging_constant -> averaging_constant
 *   bins               -> bins
 *   grid               -> grid
 *   percentile         -> percentile
 *   percentile_mode    -> percentile_mode
 *   entropy_levels     -> entropy_levels
 *   nonfinite          -> nonfinite */
typedef struct qcal_observer_config {
    qcal_observer_kind kind;
    qcal_qconfig q;                 /* dtype/qscheme/range; default as PyTorch's observer of that kind
                                     * (quint8 per_tensor_affine; per-channel kinds per_channel_affine) */
    int32_t axis;                   /* per-channel kinds: channel axis, default 0; negative counts from the end */
    float averaging_constant;       /* moving-average kinds: default 0.01, must be in (0, 1] */
    int32_t bins;                   /* histogram family: default 2048, must be >= 1
                                     * (entropy needs bins > entropy_levels) */
    qcal_observer_grid grid;        /* histogram family: default QCAL_GRID_LATTICE */
    double percentile;              /* percentile: default 99.99, in (0, 100] */
    qcal_percentile_mode percentile_mode; /* percentile: default QCAL_PERCENTILE_AUTO */
    int32_t entropy_levels;         /* entropy: quantized levels the KL search merges into, default 128 */
    qcal_nonfinite_policy nonfinite;/* default QCAL_NONFINITE_SKIP */
} qcal_observer_config;

typedef struct qcal_observer qcal_observer;

/* Name of a kind ("minmax", ...), or "unknown". */
QCAL_API const char *qcal_observer_kind_name(qcal_observer_kind kind);

/* Parses a kind name as printed by qcal_observer_kind_name. */
QCAL_API qcal_status qcal_observer_kind_parse(const char *name, qcal_observer_kind *out);

/* True when the kind's updates commute and its merges are exact, so batches may arrive in
 * any order or be split across threads and processes with bit-identical results: every kind
 * but the two moving-average kinds. The histogram family needs bins that do not depend on
 * the first batch for that; whether a given config has them: qcal_observer_config_commutes. */
QCAL_API bool qcal_observer_kind_commutes(qcal_observer_kind kind);

/* Same question for a whole config: its kind commutes and its options keep it so: minmax,
 * per_channel_minmax and the histogram family on the lattice grid (the default); false on
 * the first-batch grid, whose bins follow the first batch and grow in arrival order. */
QCAL_API bool qcal_observer_config_commutes(const qcal_observer_config *cfg);

/* Name of a grid ("lattice", "first-batch"), or "unknown". */
QCAL_API const char *qcal_observer_grid_name(qcal_observer_grid grid);

/* Parses a grid name as printed by qcal_observer_grid_name. */
QCAL_API qcal_status qcal_observer_grid_parse(const char *name, qcal_observer_grid *out);

/* Fills *cfg with the defaults of the given kind (documented on each field above). */
QCAL_API void qcal_observer_config_default(qcal_observer_config *cfg, qcal_observer_kind kind);

/* One observer setting as rules files (key=value), the CLI (--key VALUE) and the Python
 * bindings (key=value keyword arguments) spell it. In key names and word values '-' and '_'
 * are the same character ("two-tails" is "two_tails", --percentile-mode is percentile_mode). */
typedef struct qcal_observer_key {
    const char *name;        /* canonical name, "percentile_mode" */
    const char *metavar;     /* placeholder of the value in help text, "M" */
    const char *choices;     /* accepted words "abs|two_tails" (word i sets enum value i);
                              * NULL for numbers */
    const char *help;        /* one line: meaning, range, default */
    const char *cli_flag;    /* CLI flag without a value that sets the key ("strict"), or NULL */
    const char *flag_value;  /* the value that flag sets ("error") */
    bool flag_only;          /* the CLI has only the flag (no --name VALUE) */
} qcal_observer_key;

/* Number of keys in the table; qcal_observer_config_key(i) is key i (NULL out of range).
 * The table is static: pointers stay valid for the life of the program. */
QCAL_API int64_t qcal_observer_config_key_count(void);
QCAL_API const qcal_observer_key *qcal_observer_config_key(int64_t i);

/* Sets one key of *cfg from its text value (strict numbers: no spaces, nan or inf).
 * "observer" resets *cfg to that kind's defaults. Unknown keys and bad values are
 * QCAL_ERR_INVALID_ARG with a message naming the key; *cfg is unchanged on failure. Does not
 * validate the whole config (see qcal_observer_config_apply). */
QCAL_API qcal_status qcal_observer_config_set(qcal_observer_config *cfg, const char *key,
                                              const char *value);

/* Sets n keys (key[i] = value[i]) on a copy of *cfg: "observer" first, the others in order; a
 * key given twice or quant_min without quant_max is an error; then validates the result and
 * copies it to *cfg (unchanged on failure). What CLI options and rules files both call. */
QCAL_API qcal_status qcal_observer_config_apply(qcal_observer_config *cfg, int64_t n,
                                                const char *const *key,
                                                const char *const *value);

/* Checks a config without creating anything; the message names the bad field and value. */
QCAL_API qcal_status qcal_observer_config_validate(const qcal_observer_config *cfg);

/* Creates an observer; *out owned by the caller, release with qcal_observer_destroy. */
QCAL_API qcal_status qcal_observer_create(const qcal_observer_config *cfg, qcal_observer **out);

/* Destroys *obs (NULL or *obs == NULL is fine) and sets *obs to NULL. */
QCAL_API void qcal_observer_destroy(qcal_observer **obs);

/* The config the observer was created with (never NULL for a valid observer). */
QCAL_API const qcal_observer_config *qcal_observer_get_config(const qcal_observer *obs);

/* Memory an observer of cfg takes, in bytes, both upper bounds of what it allocates (RSS
 * is often lower: pages never written are not resident): *state_bytes for as long as it
 * holds data, *peak_bytes at its largest moment (the state plus a grid growth or merge, or
 * plus the range search that computes its qparams). channels: of the tensor for per-channel
 * kinds (< 1 counts as 1). Histogram family, per bin: state 16; peak histogram 36,
 * percentile 32, entropy 120, mse 88 (docs/observers.md, "Memory"). Either output may be NULL. */
QCAL_API qcal_status qcal_observer_config_memory(const qcal_observer_config *cfg,
                                                 int64_t channels, uint64_t *state_bytes,
                                                 uint64_t *peak_bytes);

/* Feeds one batch. x is read only, never kept. An empty tensor is QCAL_ERR_EMPTY and changes
 * nothing. Per-channel kinds need ndim > axis and the same channel count on every batch. */
QCAL_API qcal_status qcal_observer_update(qcal_observer *obs, const qcal_tensor *x);

/* Whether cfg's batches may be fed in parts (qcal_observer_update_part) with the result of
 * whole batches bit for bit: minmax and the histogram family on the lattice grid (exact bin
 * counts), unless the non-finite policy is QCAL_NONFINITE_ERROR (a part could fail after
 * earlier parts of its batch were applied). */
QCAL_API bool qcal_observer_config_splits(const qcal_observer_config *cfg);

/* Feeds a part of a batch (any run of its elements, as a flat tensor): parts with last
 * false, then the final one with last true, leave the observer as one qcal_observer_update
 * of the whole batch would, bit for bit (the batch is counted once, on its last part).
 * QCAL_ERR_UNSUPPORTED unless qcal_observer_config_splits; an empty part is QCAL_ERR_EMPTY. */
QCAL_API qcal_status qcal_observer_update_part(qcal_observer *obs, const qcal_tensor *x,
                                               bool last);

/* Number of channels (1 for per-tensor kinds; 0 for a per-channel observer that saw nothing). */
QCAL_API qcal_status qcal_observer_channels(const qcal_observer *obs, int64_t *n);

/* Running min/max as the observer keeps them (moving averages for the moving-average kinds;
 * the histogram's covered range for histogram kinds). cap = capacity of min_val/max_val;
 * *n gets the channel count. No data: +inf/-inf and QCAL_NO_DATA. */
QCAL_API qcal_status qcal_observer_data_range(const qcal_observer *obs, int64_t cap,
                                              float *min_val, float *max_val, int64_t *n);

/* The range qparams are computed from: data_range for min/max kinds, the searched clipping
 * range for histogram/percentile/entropy/mse. Same conventions as data_range. A read: the
 * search runs on a copy, nothing is cached in obs (concurrent readers are safe). */
QCAL_API qcal_status qcal_observer_qrange(const qcal_observer *obs, int64_t cap,
                                          float *min_val, float *max_val, int64_t *n);

/* qcal_observer_qrange followed by qcal_qparams_compute with the observer's qconfig and
 * axis: *out gets the value (per-channel kinds: library-owned arrays, release with
 * qcal_qparams_free; *out is not freed first). No data: one channel of scale 1,
 * zero-point 0 (as PyTorch) and QCAL_NO_DATA; a per-channel observer with some empty
 * channels: those get scale 1, zero-point 0 and the call returns QCAL_NO_DATA too. */
QCAL_API qcal_status qcal_observer_qparams(const qcal_observer *obs, qcal_qparams *out);

/* Forgets all data (and the non-finite count); the config stays. */
QCAL_API qcal_status qcal_observer_reset(qcal_observer *obs);

/* Folds src into dst as if dst had also seen src's batches. Same kind and config required
 * (QCAL_ERR_MISMATCH, the message names the first differing field and both values).
 * Exact for minmax, per_channel_minmax and the histogram kinds on the lattice grid (the
 * result depends only on the data, not on the split). Moving-average kinds depend on batch
 * order: merging two that both saw data is refused (QCAL_ERR_UNSUPPORTED, dst unchanged);
 * with one side empty the merge is an exact copy. First-batch grid: see
 * qcal/observers/histogram.h. */
QCAL_API qcal_status qcal_observer_merge(qcal_observer *dst, const qcal_observer *src);

/* The checks of qcal_observer_merge (configs, moving averages, channel counts) without
 * merging: QCAL_OK when the merge would succeed (memory permitting); nothing changes. */
QCAL_API qcal_status qcal_observer_merge_check(const qcal_observer *dst,
                                               const qcal_observer *src);

/* QCAL_OK when a and b are equal configs (as merge requires), else QCAL_ERR_MISMATCH with
 * the first differing field and both values ("bins 2048 vs 1024") in diff (cap bytes;
 * diff may be NULL). Does not touch qcal_last_error(). */
QCAL_API qcal_status qcal_observer_config_compare(const qcal_observer_config *a,
                                                  const qcal_observer_config *b, char *diff,
                                                  size_t cap);

/* Number of non-finite values skipped so far (since create or reset). */
QCAL_API qcal_status qcal_observer_nonfinite(const qcal_observer *obs, uint64_t *count);

/* Number of update calls that changed the observer (batches seen) since create or reset. */
QCAL_API qcal_status qcal_observer_batches(const qcal_observer *obs, uint64_t *count);

/* Serialises config, counters and state into a new buffer (*buf, *len; free with
 * qcal_free): the versioned little-endian observer state format of docs/state.md
 * ("QCOB", version 2), so training and calibration can resume or be merged elsewhere. */
QCAL_API qcal_status qcal_observer_save(const qcal_observer *obs, void **buf, size_t *len);

/* Creates an observer from a qcal_observer_save blob. Malformed, truncated or inconsistent
 * blobs are QCAL_ERR_FORMAT, other versions QCAL_ERR_UNSUPPORTED; *out untouched then. */
QCAL_API qcal_status qcal_observer_load(const void *buf, size_t len, qcal_observer **out);

/* qcal_observer_save to a file, written atomically (temporary file, then rename). */
QCAL_API qcal_status qcal_observer_save_file(const qcal_observer *obs, const char *path);

/* qcal_observer_load from a file (QCAL_ERR_NOT_FOUND / QCAL_ERR_IO when it cannot be read;
 * messages name the file). */
QCAL_API qcal_status qcal_observer_load_file(const char *path, qcal_observer **out);

/* SHA-256 (64 lower-case hex digits and a NUL into hex[65]) of the canonical state: the
 * state file with its batches field set to 0 (docs/state.md). Equal for observers that
 * would report the same thing (same config, same state, same non-finite count), whatever
 * the batch count. */
QCAL_API qcal_status qcal_observer_digest(const qcal_observer *obs, char hex[65]);

#ifdef __cplusplus
}
#endif
#endif
