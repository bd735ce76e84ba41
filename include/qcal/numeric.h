/* qcal numeric suite: where does quantization hurt?
 *
 *  - qcal_numeric_stats: one-pass, numerically stable tensor statistics (min, max, absmax, mean,
 *    std, non-finite count), streaming and deterministic for any thread count.
 *  - qcal_numeric_metric_acc: float-vs-quantized comparison metrics as torch.ao.ns.fx.utils
 *    (compute_sqnr, compute_normalized_l2_error, compute_cosine_similarity) plus max
 *    absolute error, streaming over many batches without keeping tensors.
 *  - qcal_numeric_logger: quant_logger-style statistics records to a FILE*, a CSV file, a directory
 *    of .npy dumps and/or a callback.
 *  - qcal_numeric_weights_compare: quantize-dequantize named weights with an observer's qparams and
 *    report per-tensor metrics (PyTorch's numeric suite tutorial table).
 *  - qcal_numeric_act_compare: per-fqn streaming activation comparison (error-propagation and
 *    shadow modes), driven from the user's forward pass.
 *  - qcal_numeric_summary: group records by fqn pattern, flag outliers, list layers to keep in float.
 *
 * Non-finite values: statistics skip NaN/Inf and count them (qcal_numeric_stats.nonfinite);
 * metrics skip an element pair if either side is non-finite and count it. Statistics are
 * over the finite values only. Determinism: inputs are cut into fixed 64 Ki-element blocks
 * (independent of the thread count), each reduced in double, and blocks are combined in
 * index order (Chan et al.'s pairwise update), so results are bit-identical for 1..N threads
 * given the same sequence of update calls. */
#ifndef QCAL_NUMERIC_H
#define QCAL_NUMERIC_H

#include <stdio.h>

#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- statistics -------------------------------------------------------------------- */

typedef struct qcal_numeric_stats {
    int64_t count;        /* finite values seen */
    uint64_t nonfinite;   /* NaN/+-Inf values skipped */
    float min, max;       /* of the finite values; +inf / -inf when count == 0 */
    float absmax;         /* max |x| of the finite values; 0 when count == 0 */
    double mean;          /* of the finite values; 0 when count == 0 */
    double m2;            /* sum of squared deviations from the mean */
} qcal_numeric_stats;

/* Sets *s to the empty state (count 0). */
QCAL_API qcal_status qcal_numeric_stats_init(qcal_numeric_stats *s);

/* Folds x[0..n) into *s (n may be 0). */
QCAL_API qcal_status qcal_numeric_stats_update(qcal_numeric_stats *s, const float *x, int64_t n);

/* Folds src into dst as if dst had seen src's values after its own (Chan's update). */
QCAL_API qcal_status qcal_numeric_stats_merge(qcal_numeric_stats *dst, const qcal_numeric_stats *src);

/* Sample standard deviation sqrt(m2 / (count - 1)), as torch.std (unbiased); 0 for
 * count <= 1 (torch gives NaN for one element: qcal reports 0 so tables stay numeric). */
QCAL_API qcal_status qcal_numeric_stats_std(const qcal_numeric_stats *s, double *std);

/* ---- comparison metrics ---------------------------------------------------------------- */

typedef struct qcal_numeric_metrics {
    /* 20 log10(||x|| / ||x - y||) in dB. x == y (including both zero): +inf; x all zero
     * but y not: -inf (PyTorch gives NaN for 0/0; qcal treats identical as lossless). */
    double sqnr_db;
    /* sqrt(sum (x-y)^2 / sum x^2). Both zero: 0; x zero, y not: +inf. */
    double l2;
    /* x.y / max(||x|| ||y||, 1e-8) as torch.nn.functional.cosine_similarity (eps 1e-8). */
    double cosine;
    double max_abs_err;   /* max |x - y| over finite pairs; 0 when none */
    int64_t count;        /* finite pairs compared */
    uint64_t nonfinite;   /* pairs skipped because x or y was NaN/Inf */
} qcal_numeric_metrics;

/* Streaming accumulator: sums in double over fixed blocks combined in order. */
typedef struct qcal_numeric_metric_acc {
    int64_t count;
    uint64_t nonfinite;
    double sxx, syy, sxy, sdd;   /* sum x^2, y^2, x*y, (x-y)^2 */
    double max_abs_err;
} qcal_numeric_metric_acc;

/* Sets *acc to the empty state. */
QCAL_API qcal_status qcal_numeric_metric_acc_init(qcal_numeric_metric_acc *acc);

/* Folds the pairs (x[i], y[i]), i < n, into *acc (x = reference/float, y = quantized). */
QCAL_API qcal_status qcal_numeric_metric_acc_update(qcal_numeric_metric_acc *acc, const float *x,
                                            const float *y, int64_t n);

/* Folds src into dst (sums add; max of max). */
QCAL_API qcal_status qcal_numeric_metric_acc_merge(qcal_numeric_metric_acc *dst, const qcal_numeric_metric_acc *src);

/* Final metrics of an accumulator. No finite pair seen: QCAL_ERR_EMPTY, *out untouched. */
QCAL_API qcal_status qcal_numeric_metric_acc_result(const qcal_numeric_metric_acc *acc, qcal_numeric_metrics *out);

/* One-shot: metrics of x against y, n elements each (n >= 1). */
QCAL_API qcal_status qcal_numeric_compare_f32(const float *x, const float *y, int64_t n,
                                      qcal_numeric_metrics *out);

/* ---- statistics logger ------------------------------------------------------------------ */

typedef enum qcal_numeric_log_kind {
    QCAL_NUMERIC_LOG_PARAM = 0,   /* printed "param" */
    QCAL_NUMERIC_LOG_ACT = 1,     /* printed "act" */
} qcal_numeric_log_kind;

typedef struct qcal_numeric_log_record {
    qcal_numeric_log_kind t;
    int64_t c;             /* 0, 1, 2, ... per logger: increments with every record */
    const char *fqn;       /* tensor / layer name (never NULL; "" if none given) */
    const char *op;        /* operation ("" if none given) */
    const char *extra;     /* "MKN=M|K|N" for matmul/linear activations, else the shape "2x3" */
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    qcal_numeric_stats stats;
    double std;            /* qcal_numeric_stats_std of stats */
} qcal_numeric_log_record;

/* Receives every record; x is the logged tensor (NULL for records logged from statistics
 * only). Both are valid during the call only. A non-OK return fails the log call. */
typedef qcal_status (*qcal_numeric_log_callback)(const qcal_numeric_log_record *rec, const qcal_tensor *x,
                                         void *user);

typedef struct qcal_numeric_logger_options {
    FILE *stream;            /* default NULL: no line output; e.g. stdout: one compact line per
                              * record: t=act, c=7, fqn='fc1', op='linear',
                              * extra='MKN=64|3136|128', min=.., max=3.33, absmax=..,
                              * avg=0.0012, std=1.0 (%.6g; ", nonfinite=N" when N > 0).
                              * A record with no finite value (empty tensor, all NaN/Inf)
                              * prints "n=0, min=, max=, absmax=, avg=, std=" instead of
                              * the numbers (never inf/-inf as if they were statistics) */
    const char *csv_path;    /* default NULL: no CSV; else written atomically by
                              * qcal_numeric_logger_finish. Header:
                              * t,c,fqn,op,extra,shape,count,nonfinite,min,max,absmax,mean,std
                              * (floats %.9g, doubles %.17g: exact round trip; with
                              * count 0 the five statistic fields are empty) */
    const char *npy_dir;     /* default NULL: no dumps; else one float32 .npy per tensor record:
                              * <dir>/<c, 6 digits>_<fqn with [^A-Za-z0-9._-] -> '_'>.npy
                              * (the directory must exist) */
    qcal_numeric_log_callback callback;   /* default NULL */
    void *user;              /* default NULL: passed to callback */
} qcal_numeric_logger_options;

typedef struct qcal_numeric_logger qcal_numeric_logger;

/* Fills *opt with the defaults documented above (every sink off). */
QCAL_API void qcal_numeric_logger_options_default(qcal_numeric_logger_options *opt);

/* Creates a logger (strings in opt are copied). *out owned by the caller. */
QCAL_API qcal_status qcal_numeric_logger_create(const qcal_numeric_logger_options *opt, qcal_numeric_logger **out);

/* Frees *lg (NULL fine) and sets it to NULL; an unfinished CSV is discarded (no file). */
QCAL_API void qcal_numeric_logger_destroy(qcal_numeric_logger **lg);

/* Computes the statistics of x and emits one record. fqn/op may be NULL. extra NULL:
 * the shape ("64x3136"; "scalar" for 0-d). Empty tensors are logged with count 0. The
 * counter advances even if a sink fails part-way, so c values are never reused. */
QCAL_API qcal_status qcal_numeric_logger_log(qcal_numeric_logger *lg, qcal_numeric_log_kind t, const char *fqn,
                                     const char *op, const char *extra, const qcal_tensor *x);

/* Logs a linear/matmul activation x of (M, K) against a weight (N, K): extra "MKN=M|K|N". */
QCAL_API qcal_status qcal_numeric_logger_log_linear(qcal_numeric_logger *lg, const char *fqn, const char *op,
                                            int64_t m, int64_t k, int64_t n,
                                            const qcal_tensor *x);

/* Emits a record from precomputed statistics (streamed tensors); no .npy dump, callback
 * gets x == NULL. shape has ndim entries. */
QCAL_API qcal_status qcal_numeric_logger_log_stats(qcal_numeric_logger *lg, qcal_numeric_log_kind t, const char *fqn,
                                           const char *op, const char *extra, int32_t ndim,
                                           const int64_t *shape, const qcal_numeric_stats *stats);

/* Number of records emitted so far (the next record's c). */
QCAL_API qcal_status qcal_numeric_logger_count(const qcal_numeric_logger *lg, int64_t *n);

/* Flushes the stream and commits the CSV atomically. Later log calls fail (QCAL_ERR_STATE). */
QCAL_API qcal_status qcal_numeric_logger_finish(qcal_numeric_logger *lg);

/* ---- grouped summaries ------------------------------------------------------------------ */

typedef struct qcal_numeric_summary_options {
    const char *const *globs;   /* default NULL: fnmatch(3) patterns tried in order; a name
                                 * matching none (or no globs) goes to its default group:
                                 * path components of digits only become '*'
                                 * ("blocks.0.attn.q" -> "blocks.*.attn.q") */
    int32_t n_globs;            /* default 0 */
    double outlier_factor;      /* default 4.0: in a group with >= 3 members that have
                                 * statistics, a member is an outlier when absmax > factor *
                                 * median absmax of those members (median: middle value, or
                                 * mean of the two middle values for an even count) */
    double min_sqnr;            /* default NAN (off): members with sqnr < min_sqnr dB are
                                 * listed by qcal_numeric_summary_keep_float */
} qcal_numeric_summary_options;

typedef struct qcal_numeric_summary_item {
    const char *name;           /* copied */
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    float max;                  /* statistics of the member; a non-finite max (the -inf of
                                 * qcal_numeric_stats with count 0) marks a member without finite
                                 * values: counted in count and n_empty, left out of
                                 * max_of_max, mean_of_std, the median and the outliers */
    float absmax;
    double std;
    double sqnr_db;             /* NAN when the member has no comparison */
} qcal_numeric_summary_item;

typedef struct qcal_numeric_summary_group {
    const char *pattern;        /* group key (glob or collapsed name); owned by the summary */
    int64_t count;              /* members */
    int32_t ndim;               /* typical (most frequent; first seen on ties) shape */
    int64_t shape[QCAL_MAX_DIMS];
    float max_of_max;
    double mean_of_std;
    double worst_sqnr_db;       /* min over members with a sqnr; NAN if none */
    const char *worst_member;   /* member with the worst sqnr (NULL if none) */
    double median_absmax;
    int64_t n_outliers;         /* see qcal_numeric_summary_outlier */
    int64_t n_empty;            /* members without finite values (see qcal_numeric_summary_item.max);
                                 * if all are, max_of_max, mean_of_std, median_absmax: NAN */
} qcal_numeric_summary_group;

typedef struct qcal_numeric_summary qcal_numeric_summary;

/* Fills *opt with the defaults documented above. */
QCAL_API void qcal_numeric_summary_options_default(qcal_numeric_summary_options *opt);

/* Creates an empty summary (globs are copied). */
QCAL_API qcal_status qcal_numeric_summary_create(const qcal_numeric_summary_options *opt, qcal_numeric_summary **out);

/* Frees *s (NULL fine) and sets it to NULL. */
QCAL_API void qcal_numeric_summary_destroy(qcal_numeric_summary **s);

/* Adds one member. */
QCAL_API qcal_status qcal_numeric_summary_add(qcal_numeric_summary *s, const qcal_numeric_summary_item *item);

/* Writes the default group key of name into buf (cap bytes, NUL-terminated). */
QCAL_API qcal_status qcal_numeric_summary_default_pattern(const char *name, char *buf, size_t cap);

/* Number of groups (in order of first appearance). */
QCAL_API qcal_status qcal_numeric_summary_group_count(const qcal_numeric_summary *s, int64_t *n);

/* Describes group g (strings valid until the next add or destroy). */
QCAL_API qcal_status qcal_numeric_summary_get_group(const qcal_numeric_summary *s, int64_t g,
                                                    qcal_numeric_summary_group *out);

/* Name of the k-th outlier of group g (k < n_outliers), in insertion order. */
QCAL_API qcal_status qcal_numeric_summary_outlier(const qcal_numeric_summary *s, int64_t g,
                                                  int64_t k, const char **name);

/* Members with sqnr_db < min_sqnr (insertion order): *n gets the count; names[0..cap) the
 * first cap names (may be NULL with cap 0). min_sqnr off: *n = 0. */
QCAL_API qcal_status qcal_numeric_summary_keep_float(const qcal_numeric_summary *s, int64_t cap,
                                                     const char **names, int64_t *n);

/* ---- weight comparison ------------------------------------------------------------------ */

typedef struct qcal_numeric_weights_options {
    /* default QCAL_OBSERVER_PER_CHANNEL_MINMAX. A per-channel kind is used on axis 0 of
     * tensors with >= 2 dimensions; 1-D and 0-d tensors then use the per-tensor minmax
     * observer with the per-tensor version of qscheme. A per-tensor kind is used for all. */
    qcal_observer_kind observer;
    qcal_dtype dtype;           /* default QCAL_QINT8 */
    qcal_qscheme qscheme;       /* default QCAL_PER_CHANNEL_SYMMETRIC (per-tensor kinds:
                                 * per-channel schemes map to their per-tensor versions) */
    bool reduce_range;          /* default false */
} qcal_numeric_weights_options;

typedef struct qcal_numeric_weight_result {
    char name[256];             /* truncated if longer (full name in the file) */
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    qcal_numeric_stats stats;
    double std;
    float scale_min, scale_max; /* over channels (equal for per-tensor) */
    int64_t channels;           /* 1 for per-tensor */
    qcal_qscheme qscheme;       /* scheme actually used */
    qcal_numeric_metrics m;
} qcal_numeric_weight_result;

/* Fills *opt with the defaults documented above. */
QCAL_API void qcal_numeric_weights_options_default(qcal_numeric_weights_options *opt);

/* Quantize-dequantizes one float tensor w with opt and fills *out (name copied). The
 * tensor is read in passes (statistics, observer, quantize-dequantize in chunks); nothing
 * is kept. NaN/Inf are skipped and counted (stats.nonfinite, m.nonfinite); a channel with
 * no finite value is left out of the scale range. Empty tensors: QCAL_ERR_EMPTY; no finite
 * value at all: QCAL_ERR_NONFINITE (qcal compare-weights reports such a tensor, flagged). */
QCAL_API qcal_status qcal_numeric_weights_compare(const qcal_numeric_weights_options *opt,
                                                 const char *name, const qcal_tensor *w,
                                                 qcal_numeric_weight_result *out);

/* ---- activation comparison ------------------------------------------------------------- */

typedef enum qcal_numeric_act_mode {
    QCAL_NUMERIC_ACT_PROPAGATE = 0,   /* float model and quantized model each run on the same input;
                               * outputs compared at matching fqns (errors accumulate) */
    QCAL_NUMERIC_ACT_SHADOW = 1,      /* each quantized layer is fed the float layer's input, so
                               * only that layer's error is measured */
} qcal_numeric_act_mode;

typedef struct qcal_numeric_act_compare qcal_numeric_act_compare;

/* Creates an empty comparison for mode. */
QCAL_API qcal_status qcal_numeric_act_compare_create(qcal_numeric_act_mode mode, qcal_numeric_act_compare **out);

/* Frees *ac (NULL fine) and sets it to NULL. */
QCAL_API void qcal_numeric_act_compare_destroy(qcal_numeric_act_compare **ac);

/* Mode the comparison was created with. */
QCAL_API qcal_status qcal_numeric_act_compare_mode(const qcal_numeric_act_compare *ac, qcal_numeric_act_mode *mode);

/* Records one step at fqn: float_out from the float layer, quant_out from the quantized
 * layer (in shadow mode, run on the float layer's input). Shapes must match
 * (QCAL_ERR_MISMATCH). Per fqn, the metrics stream over steps; float_out's statistics too. */
QCAL_API qcal_status qcal_numeric_act_compare_add(qcal_numeric_act_compare *ac, const char *fqn,
                                          const qcal_tensor *float_out,
                                          const qcal_tensor *quant_out);

/* Number of fqns seen (in order of first appearance). */
QCAL_API qcal_status qcal_numeric_act_compare_count(const qcal_numeric_act_compare *ac, int64_t *n);

/* Results of entry i: fqn (owned by ac), steps recorded, metrics and float statistics. */
QCAL_API qcal_status qcal_numeric_act_compare_get(const qcal_numeric_act_compare *ac, int64_t i,
                                          const char **fqn, int64_t *steps,
                                          qcal_numeric_metrics *m, qcal_numeric_stats *float_stats);

#ifdef __cplusplus
}
#endif
#endif
