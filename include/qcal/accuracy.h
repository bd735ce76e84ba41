/* qcal accuracy: a float model and its quantized version run side by side in the engine
 * (qcal/engine.h) on the same data, judged at the model's outputs; the sensitivity of each
 * quantized op; and the keep-float search that leaves the most sensitive ops in float until
 * a target holds (docs/accuracy.md).
 *
 *   qcal_accuracy_options opt;
 *   qcal_accuracy_options_default(&opt);
 *   qcal_accuracy_report rep;
 *   qcal_accuracy_compare(engine, float_model, qdq_model, ref_model, "eval/", NULL, 0, &opt, &rep);
 *
 * Per-op runs use one gated model (qcal_onnx_gate): one engine session for every subset of
 * ops quantized, each op's gate chosen per run. Sums are accumulated sample by sample in
 * data order, so results do not depend on how samples are grouped into runs (as far as the
 * engine computes each sample alike at any batch size). */
#ifndef QCAL_ACCURACY_H
#define QCAL_ACCURACY_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/engine.h"
#include "qcal/onnx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_accuracy_metric {
    QCAL_ACCURACY_TOP1 = 0,   /* argmax over the last axis equals the label, per position
                               * (labels: the output's shape without its last axis) */
    QCAL_ACCURACY_EXACT = 1,  /* a sample counts when every one of its positions is right
                               * (sequences: a text line read whole) */
} qcal_accuracy_metric;

/* "top1" / "exact" -> metric; QCAL_ERR_INVALID_ARG naming the choices otherwise. */
QCAL_API qcal_status qcal_accuracy_metric_parse(const char *name, qcal_accuracy_metric *out);

/* Name of a metric ("top1", "exact"). */
QCAL_API const char *qcal_accuracy_metric_name(qcal_accuracy_metric metric);

typedef struct qcal_accuracy_options {
    int64_t batch;               /* default 8: samples per run where the data can be split */
    int threads;                 /* default 0: qcal_threads_count() engine threads */
    int optimization;            /* default 99: ONNX Runtime's graph optimization level for every
                                  * session ('all': a QDQ model runs on the int8 kernels) */
    int64_t max_samples;         /* default 0: every sample of the data; > 0: the first ones */
    int64_t sensitivity_samples; /* default 8: the first samples the per-op runs use; 0: no
                                  * per-op runs */
    bool others;                 /* default true: also the runs with every op but one quantized
                                  * (qcal_accuracy_compare) */
    const qcal_engine_value *labels; /* default NULL: integer labels (int64 or int32), one row
                                  * per sample in data order, for output label_output */
    int64_t label_output;        /* default 0 */
    qcal_accuracy_metric metric; /* default QCAL_ACCURACY_TOP1 */
    qcal_progress_fn progress;   /* default NULL: called after each run (runs done, runs planned
                                  * in this pass, what the pass measures) */
    void *progress_user;         /* default NULL */
} qcal_accuracy_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_accuracy_options_default(qcal_accuracy_options *opt);

/* One model output, quantized against float. NaN where a figure does not apply. */
typedef struct qcal_accuracy_output {
    char *name;
    double sqnr_db;       /* 10 log10(sum f^2 / sum (f - q)^2) over its finite elements;
                           * +inf when equal */
    double cosine;        /* f.q / (|f| |q|) */
    double agree;         /* top-1 agreement: positions (every axis but the last) whose argmax
                           * is the same */
    double exact_agree;   /* samples all of whose positions agree */
    double acc_float;     /* with labels (label_output only): the metric of the float model */
    double acc_quant;     /* ... and of the quantized one */
    int64_t samples, positions, nonfinite;
} qcal_accuracy_output;

/* One quantized op of the gated model. */
typedef struct qcal_accuracy_op {
    char *name, *op_type;
    double sqnr_only_db;    /* at the outputs, this op alone quantized (one-at-a-time) */
    double sqnr_others_db;  /* every other op quantized (NaN without opt->others) */
} qcal_accuracy_op;

typedef struct qcal_accuracy_report {
    int64_t n_outputs;
    qcal_accuracy_output *outputs;  /* the QDQ model against the float model, real kernels */
    double sqnr_db;                 /* over every float output together */
    double gated_sqnr_db;           /* the gated model with every op quantized (simulated on
                                     * float kernels), on the sensitivity samples */
    int64_t n_ops;
    qcal_accuracy_op *ops;          /* most sensitive first (lowest sqnr_only_db), ties in
                                     * graph order */
    int64_t samples, sensitivity_samples, runs;
    double seconds;
} qcal_accuracy_report;

/* Runs float_m and qdq_m on the data (spec and "NAME=PATH" entries as qcal_dataset_open)
 * and fills rep: per output SQNR, cosine, top-1 agreement (and accuracy with labels); then,
 * on the first sensitivity_samples, each op of qcal_onnx_gate(qdq_m, ref) alone and all but
 * it. ref: the float model whose weights the QDQ model quantized (qdq's input after BatchNorm
 * folding; NULL: float_m). */
QCAL_API qcal_status qcal_accuracy_compare(qcal_engine *e, const qcal_onnx_model *float_m,
                                           const qcal_onnx_model *qdq_m, const qcal_onnx_model *ref,
                                           const char *data, const char *const *entries,
                                           int64_t n_entries, const qcal_accuracy_options *opt,
                                           qcal_accuracy_report *rep);

/* Frees the report's arrays and zeroes it (NULL is fine). */
QCAL_API void qcal_accuracy_report_free(qcal_accuracy_report *rep);

/* What the JSON of `qcal compare --format json` records besides the figures. */
typedef struct qcal_accuracy_source {
    char *float_model;      /* the float model's path as given ("" when not recorded) */
    char *quantized_model;  /* the QDQ model's path */
    char *engine;           /* the engine's version */
    char *metric;           /* "top1" / "exact" when labels were given, else NULL */
} qcal_accuracy_source;

/* Parses the JSON `qcal compare --format json` writes (docs/accuracy.md) from text[0..len)
 * into *rep and, if src is not NULL, *src (free with qcal_accuracy_report_free and
 * qcal_accuracy_source_free). Figures are numbers, "inf" / "-inf", or null (NaN); ops stay
 * in the file's order. QCAL_ERR_FORMAT naming the field when the text is not such a
 * report; on failure *rep and *src are untouched. */
QCAL_API qcal_status qcal_accuracy_report_parse_json(const char *text, size_t len,
                                                     qcal_accuracy_report *rep,
                                                     qcal_accuracy_source *src);

/* qcal_accuracy_report_parse_json on a file (messages name the file). */
QCAL_API qcal_status qcal_accuracy_report_read_json(const char *path, qcal_accuracy_report *rep,
                                                    qcal_accuracy_source *src);

/* Frees the source's strings and zeroes it (NULL is fine). */
QCAL_API void qcal_accuracy_source_free(qcal_accuracy_source *src);

typedef struct qcal_accuracy_html_options {
    const char *title;                   /* default "qcal accuracy report" */
    const qcal_accuracy_source *source;  /* default NULL: the header names no models */
} qcal_accuracy_html_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_accuracy_html_options_default(qcal_accuracy_html_options *opt);

/* Writes the report as one self-contained HTML page (inline SVG and CSS, a little inline
 * JavaScript to sort the tables; nothing fetched) atomically: the per-output table and a
 * bar chart of the per-op SQNRs in the report's order. opt NULL = defaults. */
QCAL_API qcal_status qcal_accuracy_report_write_html(const qcal_accuracy_report *rep,
                                                     const qcal_accuracy_html_options *opt,
                                                     const char *path);

typedef struct qcal_accuracy_keep_float_target {
    double min_output_sqnr_db;   /* NaN: unused; else the SQNR over every float output must
                                  * reach it */
    double max_drop;             /* NaN: unused; else (needs labels) float's metric minus the
                                  * quantized model's, in points, at most this */
} qcal_accuracy_keep_float_target;

typedef struct qcal_accuracy_keep_float_result {
    int64_t n_float;
    char **float_ops;            /* node names kept float, most sensitive first */
    int64_t n_ops;               /* quantized ops the QDQ model had before */
    bool met;                    /* the target holds for the real QDQ model with them float */
    double sqnr_db;              /* what that model reached: SQNR over the float outputs */
    double acc_float, acc_quant; /* with labels, the metric of float and of that model */
    int64_t runs;                /* engine runs in all (per-op ranking, search, checks) */
    int64_t checks;              /* real QDQ models built and measured */
    double seconds;
} qcal_accuracy_keep_float_result;

/* The keep-float search: quantizes m (not changed) with table and qopt, ranks its ops by
 * sensitivity (one at a time, on the first sensitivity_samples of the data), then finds the
 * fewest most-sensitive ops whose staying float makes target hold on the data (gated runs),
 * and checks it on the real QDQ model (more ops kept float while it does not hold, until it
 * does or every op is float: met false). res->float_ops are node names for
 * qcal_onnx_qdq_options.exclude (qcal_accuracy_keep_float_exclude escapes them). Ops without a name
 * are never kept float. */
QCAL_API qcal_status qcal_accuracy_keep_float(qcal_engine *e, const qcal_onnx_model *m,
                                              const qcal_calib_table *table,
                                              const qcal_onnx_qdq_options *qopt,
                                              const char *data, const char *const *entries,
                                              int64_t n_entries, const qcal_accuracy_options *opt,
                                              const qcal_accuracy_keep_float_target *target,
                                              qcal_accuracy_keep_float_result *res);

/* A node name as an fnmatch(3) pattern matching that name only (new string; qcal_free). */
QCAL_API char *qcal_accuracy_keep_float_exclude(const char *node_name);

/* Frees the result's names and zeroes it (NULL is fine). */
QCAL_API void qcal_accuracy_keep_float_result_free(qcal_accuracy_keep_float_result *res);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_ACCURACY_DECLARED
#include "qcal/deprecated.h"
#endif
