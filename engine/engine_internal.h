/* Internal to engine/: the small helpers model_calib.c, accuracy.c and model_auto.c share,
 * and the choice at the outputs model_calib.c asks of model_auto.c. */
#ifndef QCAL_ENGINE_INTERNAL_H
#define QCAL_ENGINE_INTERNAL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "qcal/engine.h"
#include "qcal/numeric_eval.h"
#include "qcal/model_calib.h"
#include "qcal/onnx.h"

/* Seconds on the monotonic clock (reports' durations). */
static inline double engine_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Index of the largest non-NaN value of v[0..n) (the first of equals), -1 when none: the
 * class `qcal compare`'s agreement and observer_auto's choice compare. */
static inline int64_t engine_argmax_f32(const float *v, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(v[i]) && (best < 0 || v[i] > v[best]))
            best = i;
    return best;
}

/* One run's inputs kept for observer_auto's runs at the outputs (names and data owned). */
typedef struct engine_auto_run {
    qcal_engine_value *v;
    int64_t n;
} engine_auto_run;

/* Copies v[0..n) into *out (freed with engine_auto_run_free). */
qcal_status engine_auto_keep(const qcal_engine_value *v, int64_t n, engine_auto_run *out);

/* Frees what *r holds and zeroes it. */
void engine_auto_run_free(engine_auto_run *r);

/* observer_auto at the outputs (engine/model_auto.c): the serialized float model
 * model[0..len) quantized with qopt and each candidate table of ev (after its pass 2), run on
 * runs[0..n_runs) against float; *choice = -1 (each tensor's per-tensor choice) or the kind
 * used everywhere; per candidate (index 0 the per-tensor choice, 1 + kind a kind) sqnr[] its
 * output SQNR (NaN: not a candidate) and agree[] its runs whose argmax agrees with float's
 * at every position (-1: not a candidate, or no output has positions). */
qcal_status engine_auto_choose(qcal_engine *e, const void *model, size_t len,
                               const qcal_onnx_qdq_options *qopt, int threads,
                               const qcal_numeric_eval *ev, const engine_auto_run *runs,
                               int64_t n_runs, int32_t *choice, double *sqnr, int64_t *agree);

#endif
