/* qcal model calibration: run an ONNX model in the engine (qcal/engine.h) on calibration data
 * and stream every tensor a deployment profile quantizes into a calibration session, run by
 * run, in bounded memory.
 *
 *   qcal_model_calib_options opt;
 *   qcal_model_calib_options_default(&opt);             // profile ort, automatic batch
 *   qcal_model_calib_report rep;
 *   qcal_model_calib_run(engine, model, "calib/", NULL, 0, session, &opt, &rep);
 *   qcal_calib_session_table(session, &table);          // then qcal_onnx_qdq, or a table file
 *
 * The tensors are those qcal_onnx_expose would expose for the options' profile, op types and
 * exclusions; they become outputs of an in-memory copy of the model (the caller's model is
 * not changed), run with graph optimizations disabled. Each run's outputs are observed (role
 * activation, step = the run's index) on a second thread and released before the next run
 * (opt.overlap: while the engine computes the next run, at most two runs' outputs in
 * memory); the table is the same either way. The session's table equals the one
 * `qcal onnx-expose` -> a dump of the same runs -> `qcal calibrate DIR` gives, byte for byte;
 * for observers whose updates commute (qcal_observer_config_commutes) the ranges do not
 * depend on how samples are grouped into runs (only the entries' batch counts do).
 *
 * Observer choice ("auto", opt.observer_auto): qcal_model_calib_run runs the model twice. The
 * first pass feeds every run's outputs to an evaluation (qcal/numeric_eval.h) holding every
 * candidate observer of QCAL_MODEL_CALIB_AUTO_KINDS on every tensor (quint8
 * per_tensor_affine, the session's default activation qconfig, 2048 bins); the second pass
 * fake-quantizes the same outputs with each candidate's final qparams and measures the exact
 * SQNR over the whole data; then each tensor's entry in the session is the observer with the
 * highest SQNR (ties to the simpler, qcal_numeric_eval_simplicity). The session's rules are
 * not consulted for the observed tensors. Every candidate commutes, so the choice and the
 * ranges do not depend on how samples are grouped into runs.
 *
 * Then, at the model's outputs (opt.auto_samples > 0, the default): the per-tensor choice is
 * one whole-model candidate, and each kind on every tensor another (all were observed in the
 * first pass: no further pass over the data). Each candidate's table quantizes the model
 * (qcal_onnx_qdq with opt.auto_qdq), the QDQ model and the float model run in the engine
 * (graph optimization 'all', as `qcal compare`) on the first auto_samples samples, one sample
 * per run, and the candidate wins whose argmax over each float output's last axis agrees
 * with float's at every position on the most samples (`qcal compare`'s exact agreement),
 * then with the highest SQNR over every float output together (ties to the earlier: the
 * per-tensor choice, then the kinds simplest first). Without it
 * (auto_samples 0, or a model with carried state, whose samples do not stand alone) the table
 * equals, byte for byte, the one `qcal evaluate DUMP --observers
 * minmax,percentile,histogram,mse,entropy --rules-out R` and then `qcal calibrate DUMP --rules
 * R` give on a dump of the same runs. */
#ifndef QCAL_MODEL_CALIB_H
#define QCAL_MODEL_CALIB_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/dataset.h"
#include "qcal/engine.h"
#include "qcal/numeric_eval.h"
#include "qcal/onnx.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qcal_model_calib qcal_model_calib;

/* The candidate kinds of observer choice (opt.observer_auto): bit (1u << kind) of every
 * per-tensor kind whose updates commute (qcal_observer_kind_commutes): minmax, histogram,
 * percentile, entropy, mse. The moving averages depend on how samples are grouped into runs
 * and are left out. */
#define QCAL_MODEL_CALIB_AUTO_KINDS                                                          \
    ((1u << QCAL_OBSERVER_MINMAX) | (1u << QCAL_OBSERVER_HISTOGRAM) |                        \
     (1u << QCAL_OBSERVER_PERCENTILE) | (1u << QCAL_OBSERVER_ENTROPY) |                      \
     (1u << QCAL_OBSERVER_MSE))

typedef struct qcal_model_calib_options {
    qcal_onnx_profile profile;      /* default QCAL_ONNX_PROFILE_ORT: the tensors that profile
                                     * quantizes */
    const char *op_types;           /* default NULL: the profile's op types (as qcal_onnx_qdq) */
    const char *const *exclude;     /* default NULL: fnmatch(3) globs as qcal_onnx_qdq's */
    int64_t n_exclude;              /* default 0 */
    int64_t batch;                  /* default 0: automatic (samples per run where the data
                                     * can be split: as many as keep one run's observed
                                     * outputs under max_run_bytes, at least 1, measured on
                                     * the first run of one sample); > 0: that many */
    uint64_t max_run_bytes;         /* default 512 MiB: the automatic batch's budget */
    const char *const *carry;       /* default NULL: "OUT=IN" pairs: output OUT of one run is
                                     * input IN of the next run of the same data file (a
                                     * recurrent model's state); IN comes from the file, or
                                     * zeros, at the start of each file */
    int64_t n_carry;                /* default 0 */
    int threads;                    /* default 0: the engine's intra-op threads are
                                     * qcal_threads_count(); > 0: that many */
    int64_t rank, ranks;            /* default 0, 1: this process runs the data files f with
                                     * f % ranks == rank (several processes each calibrate a
                                     * share; merge their sessions) */
    qcal_progress_fn progress;      /* default NULL: called after each run (samples done,
                                     * samples in this process's share, data file path;
                                     * with observer_auto both passes: done counts to twice
                                     * the share) */
    void *progress_user;            /* default NULL */
    bool observer_auto;             /* default false: each tensor's observer from the
                                     * session's rules. true: each tensor's observer chosen
                                     * from two passes over the same runs (above; the runs
                                     * go to an evaluation, not the session, until
                                     * qcal_model_calib_finish); one process only: ranks > 1
                                     * is QCAL_ERR_UNSUPPORTED */
    int64_t auto_samples;           /* default 64: observer_auto judges whole-model candidates
                                     * at the outputs (above) on this many samples, one per
                                     * run: the first of this process's share of the data in
                                     * data order (qcal_model_calib_feed_dataset), or of the
                                     * first pass's runs (qcal_model_calib_feed; each input
                                     * with a dynamic first dimension sliced on it); 0: the
                                     * per-tensor choice only */
    const qcal_onnx_qdq_options *auto_qdq; /* default NULL: the candidates' QDQ models made
                                     * with qcal_onnx_qdq_options_default and this profile,
                                     * op_types and exclude; else these (copied at create) */
    bool overlap;                   /* default false: each run's outputs observed and
                                     * released before the next run starts (peak memory:
                                     * one run's). true: observed while the engine computes
                                     * the next run (faster where the engine leaves a core
                                     * idle; up to two runs' outputs in memory) */
} qcal_model_calib_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_model_calib_options_default(qcal_model_calib_options *opt);

/* What a calibration run did. */
typedef struct qcal_model_calib_report {
    int64_t tensors;            /* tensors observed in every run */
    int64_t files;              /* data files run (this process's share) */
    int64_t samples;            /* samples run */
    int64_t runs;               /* engine runs */
    int64_t batch;              /* samples per run chosen for splittable data (0: none) */
    uint64_t max_run_bytes;     /* largest run's observed output bytes */
    int64_t empty;              /* outputs with 0 elements (not observed; counted) */
    double engine_seconds;      /* wall time in the engine's Run */
    double wait_seconds;        /* wall time the engine waited for the observers */
    int64_t passes;             /* passes over the data: 1, or 2 with observer_auto (runs,
                                 * engine and wait seconds count both; samples one) */
    int64_t chosen[QCAL_OBSERVER_KIND_COUNT];   /* observer_auto: tensors whose entry each
                                                 * kind won; else zeros */
    int64_t auto_samples;       /* observer_auto: samples the whole-model candidates ran on
                                 * (0: not run; the per-tensor choice stands) */
    int32_t auto_choice;        /* the candidate chosen: -1 each tensor's per-tensor choice,
                                 * else the observer kind every tensor got */
    double auto_sqnr_db[QCAL_OBSERVER_KIND_COUNT + 1]; /* output SQNR of each candidate:
                                 * [0] the per-tensor choice, [1 + kind] that kind on every
                                 * tensor; NaN where none was run */
    int64_t auto_agree[QCAL_OBSERVER_KIND_COUNT + 1]; /* the same candidates' samples whose
                                 * argmax over the last axis agrees with float's at every
                                 * position; -1 where none was run or no output has a last
                                 * axis longer than 1 */
} qcal_model_calib_report;

/* Prepares a calibration of m (not changed; copied, exposed and serialized for the engine:
 * models of 2 GiB and more are QCAL_ERR_OVERFLOW) into session s (not owned; must outlive
 * *out). Nothing to observe (no tensor listed): QCAL_ERR_EMPTY. *out owned by the caller. */
QCAL_API qcal_status qcal_model_calib_create(qcal_engine *e, const qcal_onnx_model *m,
                                             qcal_calib_session *s,
                                             const qcal_model_calib_options *opt,
                                             qcal_model_calib **out);

/* Number of model inputs, and input i as the engine declares it (for qcal_dataset_open). */
QCAL_API int64_t qcal_model_calib_input_count(const qcal_model_calib *mc);
QCAL_API qcal_status qcal_model_calib_input(const qcal_model_calib *mc, int64_t i,
                                            qcal_engine_io *out);

/* Number of tensors observed per run, and the name of tensor i. */
QCAL_API int64_t qcal_model_calib_tensor_count(const qcal_model_calib *mc);
QCAL_API const char *qcal_model_calib_tensor(const qcal_model_calib *mc, int64_t i);

/* Runs the model once on inputs (every model input by name; a carried input may be left out
 * or given with data NULL: the previous run's output, or zeros after qcal_model_calib_reset)
 * and hands the outputs to the observers. Returns when the engine is done; the observers
 * work on until the next call or qcal_model_calib_finish, and a failure of theirs is
 * returned by that call. */
QCAL_API qcal_status qcal_model_calib_feed(qcal_model_calib *mc, const qcal_engine_value *inputs,
                                           int64_t n_inputs);

/* observer_auto: ends the first pass (every candidate's qparams computed); the caller then
 * feeds the same runs again, in any grouping, for the scores, and qcal_model_calib_finish
 * chooses. qcal_model_calib_feed_dataset calls it itself between its two passes. Without
 * observer_auto, or a second time: QCAL_ERR_STATE. */
QCAL_API qcal_status qcal_model_calib_next_pass(qcal_model_calib *mc);

/* Starts a new sequence: carried inputs are zeros (or the file's) again. */
QCAL_API qcal_status qcal_model_calib_reset(qcal_model_calib *mc);

/* Runs every batch of ds (opened on this calibration's inputs; this process's share of its
 * files as opt->rank / ranks say), split into runs as opt->batch says, reset at each file;
 * with opt->observer_auto in the first pass: both passes (qcal_model_calib_next_pass
 * between them). */
QCAL_API qcal_status qcal_model_calib_feed_dataset(qcal_model_calib *mc, qcal_dataset *ds);

/* Waits for the observers and fills *rep (may be NULL). The session then holds everything
 * (observer_auto: each tensor's chosen observer, written here after the second pass). */
QCAL_API qcal_status qcal_model_calib_finish(qcal_model_calib *mc, qcal_model_calib_report *rep);

/* Destroys *mc (NULL is fine; waits for its observers) and sets *mc to NULL. */
QCAL_API void qcal_model_calib_destroy(qcal_model_calib **mc);

/* All of it in one call: create, qcal_dataset_open(data, entries), feed_dataset, finish. */
QCAL_API qcal_status qcal_model_calib_run(qcal_engine *e, const qcal_onnx_model *m,
                                          const char *data, const char *const *entries,
                                          int64_t n_entries, qcal_calib_session *s,
                                          const qcal_model_calib_options *opt,
                                          qcal_model_calib_report *rep);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_MODEL_CALIB_DECLARED
#include "qcal/deprecated.h"
#endif
