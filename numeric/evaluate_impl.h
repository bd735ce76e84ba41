/* Internal state of an observer evaluation (numeric/evaluate.c, numeric/report.c). */
#ifndef QCAL_NUMERIC_EVALUATE_IMPL_H
#define QCAL_NUMERIC_EVALUATE_IMPL_H

#include "qcal/evaluate.h"
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
};

/* Writes len bytes to path atomically (temporary file, then rename). */
qcal_status qcal_numeric_eval_write_file(const char *path, const void *data, size_t len);

#endif
