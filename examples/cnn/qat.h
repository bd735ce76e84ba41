/* Quantization-aware training of the demo CNN with qcal's FakeQuantize objects: the one QAT
 * code path of the project, used by examples/qat_fmnist.c (float -> post-training fake-quant
 * -> QAT comparison, cnn_qat_run) and by the calibration / int8 demo (examples/demo.c:
 * cnn_qat_finetune with full-range activations, then cnn_fq_export for the int8 net).
 * PyTorch's default QAT qconfig ('fbgemm'/'x86' in 1.13): weights per-channel symmetric
 * qint8 (moving-average per-channel MinMax), activations quint8 with reduce_range
 * (moving-average MinMax, averaging constant 0.01); the 'onednn'/'qnnpack' qconfig uses the
 * full quint8 range for activations (cnn_fq_opts.act_preset). */
#ifndef QCAL_EXAMPLES_QAT_H
#define QCAL_EXAMPLES_QAT_H

#include <qcal/fakequant.h>

#include "cnn.h"

/* Data-parallel QAT (examples/qat_dp_mpi.c fills one over MPI ranks): every rank draws the
 * same batches and trains on its slice (rows [rank*B/size, (rank+1)*B/size)); these two
 * exchanges make each step the whole batch's, the same on every rank. */
typedef struct cnn_dp {
    int rank, size;
    /* Replaces the slice's gradients and loss (means over its n of total rows) by the whole
     * batch's: sum over the ranks of n/total times each, the same bytes on every rank. */
    qcal_status (*grads)(void *user, float *const *grad, float *loss, int n, int total);
    /* The whole batch's min and max of an activation tap, from every rank's slice. */
    qcal_status (*range)(void *user, const qcal_tensor *slice, float *lo, float *hi);
    void *user;
} cnn_dp;

/* What a fake-quant set quantizes and how. */
typedef struct cnn_fq_opts {
    qcal_fakequant_preset act_preset;  /* QCAL_FAKEQUANT_PRESET_ACTIVATION (PyTorch's x86/fbgemm default: quint8
                                   reduce_range [0, 127]); QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE:
                                   quint8 [0, 255] (onednn/qnnpack), what qcal's int8 oneDNN
                                   net runs. Weights are always QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL. */
    bool quantize_logits;       /* true: the logits tap is fake-quantized too (prepare_qat
                                   puts a fake-quant on fc2's output); false: the logits stay
                                   float, as in an int8 net whose fc2 outputs f32 */
} cnn_fq_opts;

/* {QCAL_FAKEQUANT_PRESET_ACTIVATION, quantize_logits true}: PyTorch's default QAT. */
cnn_fq_opts cnn_fq_opts_default(void);

/* One FakeQuantize per activation tap and one per layer weight, and the cnn_hooks that
 * apply them (forward: fake-quantize in place; backward: straight-through mask). */
typedef struct cnn_fq_set {
    qcal_fakequant_module *act[CNN_NTAPS];    /* NULL for a tap left float (the logits when
                                              quantize_logits is false) */
    qcal_fakequant_module *weight[CNN_NLAYERS];
    cnn_hooks hooks;   /* user points at this set */
    const cnn_dp *dp;  /* data-parallel training (cnn_qat_finetune with a dp), else NULL:
                          activation observers step on the whole batch's range */
    int dp_n, dp_total;/* this rank's rows and the batch's */
} cnn_fq_set;

/* Creates the objects (observer and fake-quant on) as opts says; opts NULL = the defaults.
 * *out is owned by the caller (cnn_fq_destroy). */
qcal_status cnn_fq_create(const cnn_fq_opts *opts, cnn_fq_set **out);
/* Destroys *set (NULL or *set == NULL is fine) and sets *set to NULL. */
void cnn_fq_destroy(cnn_fq_set **set);
/* Turns every object's observer / fake-quant on or off. */
qcal_status cnn_fq_enable(cnn_fq_set *set, bool observer, bool fake_quant);
/* Freezes every object's qparams (observers off for good). */
qcal_status cnn_fq_freeze(cnn_fq_set *set);

/* The qparams a set's objects used last (after cnn_fq_freeze: the frozen ones), for
 * conversion to an int8 model. */
typedef struct cnn_fq_qparams {
    bool act_quantized[CNN_NTAPS];        /* false: tap left float (scale 0, zero-point 0) */
    float act_scale[CNN_NTAPS];
    int32_t act_zero_point[CNN_NTAPS];
    int64_t weight_channels[CNN_NLAYERS]; /* output channels of layer l */
    float *weight_scale[CNN_NLAYERS];     /* [weight_channels[l]] each, owned by the struct */
    int32_t *weight_zero_point[CNN_NLAYERS];
} cnn_fq_qparams;

/* Fills *out (allocating the weight arrays; release with cnn_fq_qparams_free). QCAL_ERR_STATE
 * if an object has not run a forward yet; on failure *out is untouched. */
qcal_status cnn_fq_export(const cnn_fq_set *set, cnn_fq_qparams *out);
/* Frees the weight arrays (NULL is fine) and sets them to NULL. */
void cnn_fq_qparams_free(cnn_fq_qparams *q);

/* QAT fine-tuning schedule: random batches drawn with replacement, Adam from zero state,
 * learning rate cosine-decayed from lr to 0, observers frozen after freeze_step steps. */
typedef struct cnn_qat_schedule {
    int steps;              /* 469 (one epoch of batch 128) */
    int batch;              /* 128 */
    float lr;               /* 2e-4: initial Adam learning rate, cosine-decayed to 0 */
    int freeze_step;        /* 350: observers frozen after this many steps (never during
                               the run if >= steps; frozen at the end in any case) */
    uint64_t seed;          /* 7: batch order */
    const cnn_dp *dp;       /* NULL: one process; else data-parallel over dp->size ranks
                               (batch >= size) */
} cnn_qat_schedule;

cnn_qat_schedule cnn_qat_schedule_default(void);

/* Fine-tunes a copy of float_model with a new fake-quant set (opts NULL = defaults) on train
 * with schedule s (the ctx's max_batch must hold s->batch); the set ends frozen. *model_out
 * and *set_out are owned by the caller; untouched on failure. Progress phase "qat" (metric:
 * running loss). */
qcal_status cnn_qat_finetune(cnn_ctx *ctx, const cnn_model *float_model, const cnn_data *train,
                             const cnn_fq_opts *opts, const cnn_qat_schedule *s, cnn_progress_fn progress,
                             void *progress_user, cnn_model **model_out, cnn_fq_set **set_out);

typedef struct cnn_qat_opts {
    cnn_train_opts float_opts;  /* float training (cached): cnn_train_opts_default() */
    const char *weights;        /* NULL: load the cached float model or train it; else this
                                   .safetensors file */
    int calib_batches;          /* 32: training batches (of float_opts.batch images) that
                                   calibrate the post-training observers */
    cnn_fq_opts fq;             /* cnn_fq_opts_default(): fake-quant of both post-training
                                   and QAT */
    cnn_qat_schedule qat;       /* cnn_qat_schedule_default(): QAT from the float weights */
} cnn_qat_opts;

cnn_qat_opts cnn_qat_opts_default(void);

typedef struct cnn_qat_result {
    int64_t test_images;
    double float_acc, ptq_acc, qat_acc;   /* top-1 in percent on the test set */
    double ptq_agree, qat_agree;          /* percent of predictions equal to float's */
    bool float_trained;                   /* false: loaded from file or cache */
    double qat_int8_acc;                  /* the QAT model converted to an int8 oneDNN net
                                             (cnn_qat_int8_accuracy) with full-range
                                             activations; -1 otherwise or without oneDNN */
    uint64_t qat_digest;                  /* FNV-1a of the QAT model's parameters and frozen
                                             qparams (data-parallel ranks compare it) */
    double float_train_s, calib_s, qat_train_s, eval_float_s;
} cnn_qat_result;

/* The whole comparison: float model (file, cache or trained), float accuracy; post-training
 * fake-quant accuracy (calibrate with fake-quant off, then freeze and evaluate with it on);
 * QAT fine-tuning from the float weights (cnn_qat_finetune), frozen evaluation. */
qcal_status cnn_qat_run(cnn_ctx *ctx, const cnn_data *train, const cnn_data *test, const cnn_qat_opts *opts,
                        cnn_progress_fn progress, void *progress_user, cnn_qat_result *out);

/* Top-1 (percent) on test of the int8 oneDNN net built from m and set's frozen qparams
 * (each layer's output codes on the next tap's qparams; logits in f32), as examples/demo.c
 * converts its QAT model. Every tap but the logits must be fake-quantized. */
qcal_status cnn_qat_int8_accuracy(const cnn_model *m, const cnn_fq_set *set, const cnn_data *test, double *acc);

#endif
