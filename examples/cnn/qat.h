/* Quantization-aware training of the demo CNN with qcal's FakeQuantize objects, and the
 * float -> post-training fake-quant -> QAT comparison run by examples/qat_fmnist.c and its
 * test. PyTorch's default QAT qconfig ('fbgemm'/'x86' in 1.13): weights per-channel
 * symmetric qint8 (moving-average per-channel MinMax), activations quint8 with
 * reduce_range (moving-average MinMax, averaging constant 0.01). */
#ifndef QCAL_EXAMPLES_QAT_H
#define QCAL_EXAMPLES_QAT_H

#include "cnn.h"
#include "qcal/fakequant.h"

/* One FakeQuantize per activation tap and one per layer weight, and the cnn_hooks that
 * apply them (forward: fake-quantize in place; backward: straight-through mask). */
typedef struct cnn_fq_set {
    qcal_fake_quantize *act[CNN_NTAPS];
    qcal_fake_quantize *weight[CNN_NLAYERS];
    cnn_hooks hooks;   /* user points at this set */
} cnn_fq_set;

/* Creates the objects with PyTorch's default QAT presets (observer and fake-quant on). */
qcal_status cnn_fq_create(cnn_fq_set **out);
void cnn_fq_destroy(cnn_fq_set **set);
/* Turns every object's observer / fake-quant on or off. */
qcal_status cnn_fq_enable(cnn_fq_set *set, bool observer, bool fake_quant);
/* Freezes every object's qparams (observers off for good). */
qcal_status cnn_fq_freeze(cnn_fq_set *set);

typedef struct cnn_qat_opts {
    cnn_train_opts float_opts;  /* float training (cached): cnn_train_opts_default() */
    const char *weights;        /* NULL: load the cached float model or train it; else this
                                   .safetensors file */
    int calib_batches;          /* 32: training batches (of float_opts.batch images) that
                                   calibrate the post-training observers */
    int qat_steps;              /* 469 (one epoch of batch 128): QAT fine-tuning steps from
                                   the float weights */
    int qat_batch;              /* 128 */
    float qat_lr;               /* 2e-4: initial Adam learning rate of QAT, cosine-decayed to 0 */
    int qat_freeze_step;        /* 350: observers frozen after this many QAT steps */
    uint64_t qat_seed;          /* 7: QAT batch order */
} cnn_qat_opts;

cnn_qat_opts cnn_qat_opts_default(void);

typedef struct cnn_qat_result {
    int64_t test_images;
    double float_acc, ptq_acc, qat_acc;   /* top-1 in percent on the test set */
    double ptq_agree, qat_agree;          /* percent of predictions equal to float's */
    bool float_trained;                   /* false: loaded from file or cache */
    double float_train_s, calib_s, qat_train_s, eval_float_s;
} cnn_qat_result;

/* The whole comparison: float model (file, cache or trained), float accuracy; post-training
 * fake-quant accuracy (calibrate with fake-quant off, then freeze and evaluate with it on);
 * QAT fine-tuning from the float weights, frozen evaluation. */
qcal_status cnn_qat_run(cnn_ctx *ctx, const cnn_data *train, const cnn_data *test, const cnn_qat_opts *opts,
                        cnn_progress_fn progress, void *progress_user, cnn_qat_result *out);

#endif
