/* qcal observer evaluation (numeric suite): every candidate observer on every tensor,
 * the exact SQNR of each one's quantization, a per-tensor recommendation, and an HTML
 * report.
 *
 *   qcal_numeric_eval_options opt;
 *   qcal_numeric_eval_options_default(&opt);
 *   qcal_numeric_eval *ev = NULL;
 *   qcal_numeric_eval_create(&opt, &ev);
 *   pass 1, every batch of every tensor:  qcal_numeric_eval_observe(ev, name, role, &x);
 *   qcal_numeric_eval_finish(ev);                        // qparams of every candidate
 *   pass 2, the same batches again:       qcal_numeric_eval_score(ev, name, role, &x);
 *   qcal_numeric_eval_result(ev, i, &res);  qcal_numeric_eval_format(ev, ..., &buf, &len);
 *   qcal_numeric_eval_write_rules(ev, "rules.txt");  qcal_numeric_eval_write_report(ev, NULL, "r.html");
 *   qcal_numeric_eval_destroy(&ev);
 *
 * Pass 1 feeds each batch to every candidate observer of its tensor (each batch is read
 * once). Pass 2 fake-quantizes each batch with every candidate's final qparams and
 * accumulates, over the tensor's finite values, SQNR = 20 log10(||x|| / ||x - fq(x)||) and
 * the fraction of values clipped (outside the candidate's representable range): exact
 * figures over the whole tensor data, not estimates. Pass 2 also bins the data for the
 * report's histogram.
 *
 * Candidates. Activations: every per-tensor kind (minmax, moving_average_minmax,
 * histogram, percentile, entropy, mse) with the activation qconfig (default quint8
 * per_tensor_affine). Weights: those kinds with the weight qconfig made per-tensor
 * symmetric, plus per_channel_minmax and moving_average_per_channel_minmax per output
 * channel (axis 0, default qint8 per_channel_symmetric). opt.kinds restricts the set.
 *
 * Recommendation: the highest SQNR, ties to the simpler observer; with min_sqnr_db set, the
 * simplest candidate that meets it (the highest SQNR if none does). Order of simplicity,
 * simplest first: minmax, per_channel_minmax, moving_average_minmax,
 * moving_average_per_channel_minmax, percentile, histogram, mse, entropy (fewest
 * parameters and least state first). */
#ifndef QCAL_NUMERIC_EVAL_H
#define QCAL_NUMERIC_EVAL_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qcal_numeric_eval_options {
    uint32_t kinds;              /* bit (1u << kind) per candidate kind; default 0 = every kind */
    double min_sqnr_db;          /* default NAN: recommend the highest SQNR; a number: the
                                  * simplest candidate that reaches it */
    qcal_qconfig activation_q;   /* default quint8 per_tensor_affine (histogram's default) */
    qcal_qconfig weight_q;       /* default qint8 per_channel_symmetric; per-tensor kinds use
                                  * per_tensor_symmetric with the same dtype and range */
    int32_t bins;                /* histogram-family bins, default 2048 */
    int32_t report_bins;         /* bins of the report's drawn histogram, default 160 */
    qcal_progress_fn progress;   /* default NULL: called by qcal_numeric_eval_finish after each
                                  * tensor's candidates (done, total, name), calling thread */
    void *progress_user;         /* default NULL: passed to progress */
} qcal_numeric_eval_options;

/* One candidate's result on one tensor. Arrays have `channels` entries, owned by the eval. */
typedef struct qcal_numeric_eval_candidate {
    qcal_observer_kind kind;
    double sqnr_db;              /* over the tensor's finite values; +inf if exact */
    double clipped;              /* fraction of finite values outside the representable range */
    int64_t channels;
    const float *scale;
    const int32_t *zero_point;
    const float *min_val;        /* clipping range the qparams come from */
    const float *max_val;
    int64_t quant_min, quant_max;
    qcal_dtype dtype;
    qcal_qscheme qscheme;
    int32_t axis;
} qcal_numeric_eval_candidate;

/* One tensor's results: candidates in the order of simplicity above. */
typedef struct qcal_numeric_eval_tensor {
    const char *name;
    qcal_calib_role role;
    int32_t ncandidates;
    const qcal_numeric_eval_candidate *candidates;
    int32_t recommended;         /* index into candidates */
    uint64_t count;              /* finite values seen */
    uint64_t nonfinite;
    float data_min, data_max;    /* of the finite values */
} qcal_numeric_eval_tensor;

typedef struct qcal_numeric_eval qcal_numeric_eval;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_numeric_eval_options_default(qcal_numeric_eval_options *opt);

/* Simplicity rank of a kind (0 = simplest), the order used for ties and min_sqnr_db. */
QCAL_API int qcal_numeric_eval_simplicity(qcal_observer_kind kind);

/* Creates an evaluation (opt NULL = defaults); *out owned by the caller. */
QCAL_API qcal_status qcal_numeric_eval_create(const qcal_numeric_eval_options *opt,
                                              qcal_numeric_eval **out);

/* Destroys *ev (NULL fine) and sets it to NULL. */
QCAL_API void qcal_numeric_eval_destroy(qcal_numeric_eval **ev);

/* Pass 1: feeds one batch of tensor (name, role) to each of its candidate observers. */
QCAL_API qcal_status qcal_numeric_eval_observe(qcal_numeric_eval *ev, const char *name,
                                               qcal_calib_role role, const qcal_tensor *x);

/* Ends pass 1: computes every candidate's qparams. */
QCAL_API qcal_status qcal_numeric_eval_finish(qcal_numeric_eval *ev);

/* Pass 2: scores one batch of a tensor seen in pass 1 against every candidate. */
QCAL_API qcal_status qcal_numeric_eval_score(qcal_numeric_eval *ev, const char *name,
                                             qcal_calib_role role, const qcal_tensor *x);

/* Adds a per-layer SQNR measured elsewhere (e.g. the numeric suite's shadow comparison of
 * an int8 model) to a tensor, shown by the report. */
QCAL_API qcal_status qcal_numeric_eval_set_layer_sqnr(qcal_numeric_eval *ev, const char *name,
                                                      qcal_calib_role role, double sqnr_db);

/* _result, _format_results, _write_results, _write_rules, _write_report and _save finish
 * the results on their first call after pass 2: entries sorted by (name, role), each
 * tensor's recommendation picked. That is a cache filled behind the const handle: the
 * first of those calls must not run concurrently with another call on ev; once it
 * returned, the const readers may run concurrently. */

/* Number of tensors, in (name, role) byte order. */
QCAL_API qcal_status qcal_numeric_eval_count(const qcal_numeric_eval *ev, int64_t *n);

/* Tensor i's results (after pass 2); pointers into ev, valid until it is destroyed. */
QCAL_API qcal_status qcal_numeric_eval_result(const qcal_numeric_eval *ev, int64_t i,
                                              qcal_numeric_eval_tensor *out);

/* The observer of a tensor's candidate kind (read only; for histograms and curves). */
QCAL_API qcal_status qcal_numeric_eval_observer(const qcal_numeric_eval *ev, int64_t i,
                                                qcal_observer_kind kind,
                                                const qcal_observer **out);

typedef enum qcal_numeric_eval_format {
    QCAL_NUMERIC_EVAL_TABLE = 0,   /* aligned text: one row per tensor, SQNR per observer */
    QCAL_NUMERIC_EVAL_CSV = 1,     /* one row per (tensor, observer) */
    QCAL_NUMERIC_EVAL_JSON = 2,    /* {"tensors": [{"name", "role", "recommended", "observers": {KIND: {...}}}]} */
} qcal_numeric_eval_format;

/* Formats the results into a new NUL-terminated buffer (*buf, *len; free with qcal_free). */
QCAL_API qcal_status qcal_numeric_eval_format_results(const qcal_numeric_eval *ev,
                                                      qcal_numeric_eval_format format,
                                                      char **buf, size_t *len);

/* Writes the formatted results to path atomically (temporary file, then rename). */
QCAL_API qcal_status qcal_numeric_eval_write_results(const qcal_numeric_eval *ev,
                                                     qcal_numeric_eval_format format,
                                                     const char *path);

/* Writes a rules file giving every tensor its recommended observer (names quoted and
 * escaped so they match only themselves), atomically. */
QCAL_API qcal_status qcal_numeric_eval_write_rules(const qcal_numeric_eval *ev,
                                                   const char *path);

/* After qcal_numeric_eval_finish (or a load): keeps only the candidates whose kind is in
 * the kinds mask (bit 1u << kind; 0 keeps all) and recommends again. A kind no tensor has
 * (QCAL_ERR_NOT_FOUND) or a tensor left without candidates fails and changes nothing. */
QCAL_API qcal_status qcal_numeric_eval_restrict(qcal_numeric_eval *ev, uint32_t kinds);

/* Replaces options.min_sqnr_db (NaN: highest SQNR) and recommends again. */
QCAL_API qcal_status qcal_numeric_eval_set_min_sqnr(qcal_numeric_eval *ev, double min_sqnr_db);

#define QCAL_NUMERIC_EVAL_SOURCE_MAX 4096

/* A label of where the data came from (e.g. the dump directory; copied, at most
 * QCAL_NUMERIC_EVAL_SOURCE_MAX bytes; NULL clears it): saved in the state, shown by the
 * report unless its options name another source. */
QCAL_API qcal_status qcal_numeric_eval_set_source(qcal_numeric_eval *ev, const char *source);

/* The source label, or NULL. */
QCAL_API const char *qcal_numeric_eval_source(const qcal_numeric_eval *ev);

/* ---- Evaluation states ("QCEV", docs/state.md) ----
 * Everything the results and the report need, without the data: the options, the source
 * label, and per tensor its counts, data range, drawn histogram, attached layer SQNR and,
 * per candidate, the observer state ("QCOB"), the exact SQNR and the clipped count that pass
 * 2 measured. A loaded evaluation gives the same results, tables, rules and report (byte
 * for byte) as the one saved; it cannot take more data (observe/score fail). */

/* Serialises a scored evaluation into a new buffer (*buf, *len; free with qcal_free). */
QCAL_API qcal_status qcal_numeric_eval_save(const qcal_numeric_eval *ev, void **buf, size_t *len);

/* Creates an evaluation from a qcal_numeric_eval_save buffer. Malformed, truncated or
 * inconsistent buffers are QCAL_ERR_FORMAT (the message names the tensor), other versions
 * QCAL_ERR_UNSUPPORTED; *out untouched then. */
QCAL_API qcal_status qcal_numeric_eval_load(const void *buf, size_t len, qcal_numeric_eval **out);

/* qcal_numeric_eval_save to a file, written atomically. */
QCAL_API qcal_status qcal_numeric_eval_save_file(const qcal_numeric_eval *ev, const char *path);

/* qcal_numeric_eval_load from a file (messages name the file). */
QCAL_API qcal_status qcal_numeric_eval_load_file(const char *path, qcal_numeric_eval **out);

typedef struct qcal_numeric_eval_report_options {
    const char *title;           /* default "qcal calibration report" */
    const char *source;          /* shown under the title (e.g. the dump directory); default
                                  * NULL: the evaluation's source label */
} qcal_numeric_eval_report_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_numeric_eval_report_options_default(qcal_numeric_eval_report_options *opt);

/* Writes the self-contained HTML report (inline SVG and CSS, a little inline JavaScript to
 * sort the summary table; nothing fetched) atomically. opt NULL = defaults. */
QCAL_API qcal_status qcal_numeric_eval_write_report(const qcal_numeric_eval *ev,
                                                    const qcal_numeric_eval_report_options *opt,
                                                    const char *path);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_NUMERIC_EVAL_DECLARED
#include "qcal/deprecated.h"
#endif
