/* Internal state of an observer evaluation (numeric/evaluate.c, numeric/report.c). */
#ifndef QCAL_NUMERIC_EVALUATE_IMPL_H
#define QCAL_NUMERIC_EVALUATE_IMPL_H

#include "qcal/numeric_eval.h"
#include "qcal/numeric.h"

typedef struct eval_cand {
    qcal_observer_kind kind;
    qcal_observer *obs;
    int64_t channels;
    float *scale, *mn, *mx;          /* channels entries, after finish */
    int32_t *zp;
    int64_t qmin, qmax;
    qcal_qparams qp;                 /* the observer's final qparams (after finish) */
    qcal_numeric_metric_acc acc;     /* x against fake-quant(x), pass 2 */
    uint64_t clipped;                /* finite values outside the representable range */
    double sqnr;
    bool sqnr_done;                  /* sqnr holds the result (computed, or loaded from a state) */
} eval_cand;

typedef struct eval_entry {
    char *name;
    qcal_calib_role role;
    int nc;
    eval_cand c[QCAL_OBSERVER_KIND_COUNT];            /* in the order of simplicity */
    qcal_numeric_eval_candidate pub[QCAL_OBSERVER_KIND_COUNT];
    int recommended;
    float dmin, dmax;                /* finite data range (pass 1) */
    uint64_t count, nonfinite;
    uint64_t *hist;                  /* report_bins counts over [dmin, dmax] (pass 2) */
    bool scored;
    bool has_layer_sqnr;
    double layer_sqnr;
} eval_entry;

struct qcal_numeric_eval {
    qcal_numeric_eval_options opt;
    eval_entry *e;
    int64_t n, cap;
    bool finished;
    bool results_ready;              /* sorted by (name, role), recommendations computed */
    char *source;                    /* label shown by the report (qcal_numeric_eval_set_source) */
    bool loaded;                     /* from a state: results only, no more data */
};

/* Candidate config of kind k for role, or false when the kind does not apply to it. */
bool qcal_numeric_eval_cand_config(const qcal_numeric_eval *ev, qcal_calib_role role,
                                   qcal_observer_kind k, qcal_observer_config *cfg);

/* After the candidate's observer is final: its channels, qparams, range and integer range,
 * and an empty SQNR accumulator. */
qcal_status qcal_numeric_eval_cand_prepare(const qcal_numeric_eval *ev, eval_cand *c);

/* Frees a candidate / an entry and zeroes it. */
void qcal_numeric_eval_cand_free(eval_cand *c);
void qcal_numeric_eval_entry_free(eval_entry *e);

/* A fraction in [0, 1] as the report prints it, a percentage with fixed decimals and never
 * an exponent: "100%", "12%", "3.4%", "0.012%" (two significant digits below 10%), more
 * decimals where a fraction below 1 would round to "100%", "<0.000001%" below that; "0%"
 * only for 0. */
void qcal_numeric_report_percent(char *buf, size_t cap, double frac);

/* Writes len bytes to path atomically (temporary file, then rename). */
qcal_status qcal_numeric_eval_write_file(const char *path, const void *data, size_t len);

#endif
