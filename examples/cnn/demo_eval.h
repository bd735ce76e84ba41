/* Observer evaluation on the demo CNN (include/qcal/numeric_eval.h): feeding its calibration data
 * to a qcal_numeric_eval, and the demo's low-bit setting, where the choice of observer
 * matters (docs/demo.md, "The low-bit setting").
 *
 * Low-bit setting, N bits (default 3): activations quint8 restricted to [0, 2^N - 1]
 * (per-tensor affine), weights [-(2^(N-1) - 1), 2^(N-1) - 1] (per-tensor symmetric),
 * fake-quantized in the float CNN at the four layer inputs and on the four weights (logits
 * stay float). One qcal_numeric_eval sees the calibration data once with every observer kind
 * of the demo on each of those eight tensors and scores each one's qparams (exact SQNR of
 * the tensor's own fake-quant). Each single-observer row fake-quantizes every tensor with
 * that kind's qparams; the row "per-layer best (qcal evaluate)" gives every tensor its
 * recommended observer (highest SQNR) through the path a user takes: the rules file of
 * qcal_numeric_eval_write_rules, then a calibration session with those rules (as `qcal
 * calibrate --rules`), whose table must hold the recommended qparams (checked). Every row
 * is evaluated on the test set: top-1 and agreement with the float model. Example code. */
#ifndef QCAL_EXAMPLES_DEMO_EVAL_H
#define QCAL_EXAMPLES_DEMO_EVAL_H

#include <qcal/numeric_eval.h>
#include <qcal/observer.h>

#include "cnn.h"

#define LOWBIT_NTENSORS 8   /* conv1..fc2 inputs, conv1..fc2 weights */

typedef struct lowbit_row {
    double top1, agree;     /* percent on the test images */
} lowbit_row;

typedef struct lowbit_result {
    int bits;
    int n_kinds;
    qcal_observer_kind kinds[QCAL_OBSERVER_KIND_COUNT];
    lowbit_row single[QCAL_OBSERVER_KIND_COUNT];      /* one per kind, in kinds[] order */
    lowbit_row per_layer;                             /* per-layer best (qcal evaluate) */
    /* The recommendation per tensor, "conv1" .. "fc2" (the layer inputs) then "conv1.weight"
     * .. "fc2.weight": its kind and SQNR. */
    const char *tensor[LOWBIT_NTENSORS];
    qcal_observer_kind choice[LOWBIT_NTENSORS];
    double choice_sqnr_db[LOWBIT_NTENSORS];
    /* `qcal qdq --data`'s --observer auto on this setting: the same evaluation restricted to
     * its candidates (QCAL_MODEL_CALIB_AUTO_KINDS: no moving average), then that per-tensor
     * choice and each of its kinds on every tensor judged against float on the first
     * AUTO_SAMPLES calibration images (top-1 agreement, then the logits' SQNR); every
     * tensor's final choice, and the row
     * of that choice (auto.top1 < 0: none of its kinds among kinds[]). */
    lowbit_row autorow;
    qcal_observer_kind auto_choice[LOWBIT_NTENSORS];
    int auto_same;                                    /* tensors where it equals choice[] */
    int auto_at_outputs;                              /* -1: the per-tensor choice won; else the
                                                       * index into kinds[] used everywhere */
    double auto_sqnr_db[QCAL_OBSERVER_KIND_COUNT + 1];/* [0] per-tensor, [1 + k] kinds[k]
                                                       * (NaN: not a candidate) */
    int64_t auto_agree[QCAL_OBSERVER_KIND_COUNT + 1]; /* the same, images whose top-1 is
                                                       * float's (-1: not a candidate) */
    int64_t auto_n;                                   /* images they were judged on */
    int best, worst;                                  /* indices into single[] by top-1 (first on ties) */
    double calib_s, eval_s;                           /* evaluation + rules calibration; the fake-quant rows */
} lowbit_result;

/* Activation qconfig of the setting: quint8 restricted to [0, 2^bits - 1], per-tensor affine. */
void lowbit_act_qconfig(qcal_qconfig *q, int bits);
/* Weight qconfig: qint8 restricted to [-(2^(bits-1) - 1), 2^(bits-1) - 1], per-tensor symmetric. */
void lowbit_weight_qconfig(qcal_qconfig *q, int bits);

/* Runs the setting with bits in [2, 8]: evaluation of kinds[0..n_kinds) (per-tensor kinds)
 * on the first n_calib training images in batches of batch; writes evaluate_<bits>bit.txt
 * (the evaluation table), report_<bits>bit.html and rules_<bits>bit.txt into out_dir; every
 * row evaluated on test (fpred: the float model's predictions, for the agreement). */
qcal_status lowbit_run(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n_calib, int batch,
                       const cnn_data *test, const uint8_t *fpred, int n_kinds,
                       const qcal_observer_kind *kinds, int bits, const char *out_dir, lowbit_result *out);

/* Feeds the float model's calibration data to ev: the four weights once (PyTorch layout),
 * then the four layer inputs of every batch of the first n training images (pass 0:
 * qcal_numeric_eval_observe, pass 1: qcal_numeric_eval_score). */
qcal_status demo_eval_feed(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n, int batch,
                           qcal_numeric_eval *ev, int pass);

#endif
