/* The qcal demo CNN for Fashion-MNIST: model, f32 forward/backward, Adam, evaluation,
 * dataset loading and a cached trained model. Shared by examples/qat_fmnist.c and the
 * calibration / int8 demo. Example code (not part of libqcal): it may print (progress).
 *
 *   input: pixel/255, normalised (x - 0.2860) / 0.3530, [N,1,28,28]
 *   conv1: Conv2d(1, 32, 3, padding=1) -> ReLU -> MaxPool2d(2)     # 28 -> 14
 *   conv2: Conv2d(32, 64, 3, padding=1) -> ReLU -> MaxPool2d(2)    # 14 -> 7
 *   flatten in NCHW order (64*7*7 = 3136)
 *   fc1: Linear(3136, 128) -> ReLU
 *   fc2: Linear(128, 10)
 *
 * Parameters use PyTorch's names and layouts (conv1.weight [32,1,3,3], ..., fc2.weight
 * [10,128]) so a model trained in PyTorch loads as is. Inside, activations are kept
 * channels-last (NHWC) so that a convolution is one im2col + one sgemm per batch; the
 * convolution and fc1 weights are permuted to match on every forward. */
#ifndef QCAL_EXAMPLES_CNN_H
#define QCAL_EXAMPLES_CNN_H

#include <stdbool.h>
#include <stdint.h>

#include <qcal/common.h>

#define CNN_IMAGE_PIXELS 784
#define CNN_CLASSES 10

typedef enum cnn_param_id {
    CNN_CONV1_W, CNN_CONV1_B, CNN_CONV2_W, CNN_CONV2_B,
    CNN_FC1_W, CNN_FC1_B, CNN_FC2_W, CNN_FC2_B,
    CNN_NPARAMS
} cnn_param_id;

/* Layers with weights, in forward order; layer l's weight is param 2*l, its bias 2*l+1. */
typedef enum cnn_layer { CNN_CONV1, CNN_CONV2, CNN_FC1, CNN_FC2, CNN_NLAYERS } cnn_layer;

/* Activation taps: the input of each layer with weights, plus the logits. */
typedef enum cnn_tap {
    CNN_TAP_CONV1_IN,   /* normalised image, [N,28,28,1] (= NCHW since C is 1) */
    CNN_TAP_CONV2_IN,   /* pool1 output, channels-last [N,14,14,32] */
    CNN_TAP_FC1_IN,     /* pool2 output, [N,3136] in channels-last order (h,w,c): the same values
                           as PyTorch's NCHW flatten, in another order */
    CNN_TAP_FC2_IN,     /* fc1 ReLU output, [N,128] */
    CNN_TAP_LOGITS,     /* fc2 output, [N,10] */
    CNN_NTAPS
} cnn_tap;

/* The model: eight f32 tensors in PyTorch layout, owned by the model. */
typedef struct cnn_model {
    float *param[CNN_NPARAMS];
} cnn_model;

/* PyTorch name of parameter i ("conv1.weight", ...), shape and element count. */
const char *cnn_param_name(int i);
int cnn_param_shape(int i, int64_t shape[4]);   /* returns ndim (1, 2 or 4) */
int64_t cnn_param_numel(int i);
const char *cnn_tap_name(int tap);               /* "conv1", "conv2", "fc1", "fc2", "logits" */
const char *cnn_layer_name(int layer);           /* "conv1", "conv2", "fc1", "fc2" */

/* New model initialised like PyTorch's default (kaiming_uniform a=sqrt(5), i.e. weights and
 * biases uniform in +-1/sqrt(fan_in)) from a fixed-seed generator: same seed, same model. */
qcal_status cnn_model_create(uint64_t seed, cnn_model **out);
void cnn_model_destroy(cnn_model **m);
/* Copies every parameter of src into dst. */
void cnn_model_copy(cnn_model *dst, const cnn_model *src);

/* Saves as .safetensors (F32, PyTorch names), written atomically. */
qcal_status cnn_model_save(const cnn_model *m, const char *path);
/* Loads a .safetensors file; a missing, misshapen or non-F32 tensor is QCAL_ERR_MISMATCH
 * or QCAL_ERR_FORMAT with the name and shapes in qcal_last_error(); non-finite values are
 * QCAL_ERR_NONFINITE. */
qcal_status cnn_model_load(const char *path, cnn_model **out);

/* ---- Data ---------------------------------------------------------------------------- */

typedef struct cnn_data {
    uint8_t *images;   /* [n, 28, 28] raw pixels */
    uint8_t *labels;   /* [n], 0..9 */
    int64_t n;
} cnn_data;

/* Directory of the dataset: $QCAL_FMNIST_DIR if set, else /usr/share/datasets/fashion-mnist. */
const char *cnn_data_dir(void);
/* Loads "<dir>/<split>-images-idx3-ubyte.gz" and "<dir>/<split>-labels-idx1-ubyte.gz"
 * (split "train" or "t10k") through idx_file; checks shapes, counts and labels < 10. */
qcal_status cnn_data_load(const char *dir, const char *split, cnn_data *out);
void cnn_data_free(cnn_data *d);

/* ---- Hooks ------------------------------------------------------------------------- */

/* An activation at a tap. The forward hook may observe data or transform it in place
 * (e.g. fake-quantize it); in training the backward hook then gets the gradient with
 * respect to the hook's output and turns it, in place, into the gradient with respect to
 * its input (e.g. the straight-through estimator: zero where fake-quant clamped). */
typedef struct cnn_act {
    cnn_tap tap;
    float *data;          /* numel floats, modifiable in place */
    int64_t numel;
    int32_t ndim;
    int64_t shape[4];     /* as documented on cnn_tap */
    int32_t channel_axis; /* axis of the channels in shape (ndim-1) */
    bool training;        /* a backward pass will follow */
} cnn_act;

/* A layer's weight before use, in PyTorch layout (output channels on axis 0). A hook that
 * transforms it writes the transformed weight into dst and sets used; if used stays false
 * the raw weight is used. In training the weight's gradient (PyTorch layout) goes through
 * the weight backward hook before the optimiser step. */
typedef struct cnn_weight {
    cnn_layer layer;
    const float *src;
    float *dst;           /* numel floats owned by the ctx */
    int64_t numel;
    int32_t ndim;
    int64_t shape[4];
    bool training;
    bool used;            /* out */
} cnn_weight;

typedef struct cnn_hooks {
    qcal_status (*act)(void *user, cnn_act *act);          /* NULL = no activation hook */
    /* Gradient at a tap (numel floats, in place); not called for CNN_TAP_CONV1_IN, whose
     * gradient is not computed. NULL = identity. */
    qcal_status (*act_backward)(void *user, cnn_tap tap, float *grad, int64_t numel);
    qcal_status (*weight)(void *user, cnn_weight *w);      /* NULL = raw weights */
    /* Gradient of a layer's weight (PyTorch layout, in place), for layers whose weight hook
     * set used. NULL = identity. */
    qcal_status (*weight_backward)(void *user, cnn_layer layer, float *grad, int64_t numel);
    void *user;
    /* cnn_train_step only: every parameter's gradient (grad[i]: cnn_param_numel(i) floats,
     * in place) and the batch loss, after backward and before the optimiser step; e.g.
     * data-parallel training replaces them by the whole batch's. NULL = unchanged. */
    qcal_status (*grads)(void *user, float *const *grad, float *loss);
} cnn_hooks;

/* ---- Forward, backward, training ---------------------------------------------------- */

/* Workspace for up to max_batch images and the Adam state. Not thread-safe; one per thread. */
typedef struct cnn_ctx cnn_ctx;

qcal_status cnn_ctx_create(int max_batch, cnn_ctx **out);
void cnn_ctx_destroy(cnn_ctx **ctx);
/* Zeroes Adam's moments and step count (e.g. before fine-tuning). */
void cnn_ctx_reset_optimizer(cnn_ctx *ctx);

/* Inference on n <= max_batch images [n,784]; *logits ([n,10], owned by ctx) stays valid
 * until the next call on ctx. hooks may be NULL. */
qcal_status cnn_forward(cnn_ctx *ctx, const cnn_model *m, const uint8_t *images, int n,
                        const cnn_hooks *hooks, const float **logits);

/* One training step on n images: forward, cross-entropy (mean over the batch), backward
 * (through the backward hooks), Adam (PyTorch's defaults: betas
 * 0.9/0.999, eps 1e-8, no weight decay) with learning rate lr. *loss gets the batch loss. */
qcal_status cnn_train_step(cnn_ctx *ctx, cnn_model *m, const uint8_t *images, const uint8_t *labels,
                           int n, const cnn_hooks *hooks, float lr, float *loss);

/* Forward + cross-entropy + backward without an optimiser step: the gradients (PyTorch
 * layout) are then readable through cnn_ctx_grad (used by gradient checks). */
qcal_status cnn_compute_grad(cnn_ctx *ctx, const cnn_model *m, const uint8_t *images, const uint8_t *labels,
                             int n, const cnn_hooks *hooks, float *loss);
/* Gradient of parameter i from the last cnn_compute_grad / cnn_train_step (owned by ctx). */
const float *cnn_ctx_grad(const cnn_ctx *ctx, int i);

/* Progress callback: phase ("train", "eval", ...), done/total items, a running metric. */
typedef void (*cnn_progress_fn)(void *user, const char *phase, int64_t done, int64_t total, double metric);

/* Progress to stderr: a one-line bar on a terminal, a plain line every 10% otherwise.
 * user is ignored. */
void cnn_progress_stderr(void *user, const char *phase, int64_t done, int64_t total, double metric);

typedef struct cnn_train_opts {
    int epochs;          /* 3: full passes over the training set */
    int batch;           /* 128 */
    float lr;            /* 2e-3: Adam learning rate of the first epoch */
    float lr_decay;      /* 0.3: multiplies lr after every epoch */
    uint64_t seed;       /* 1: initialisation and shuffling */
    int64_t max_images;  /* 0: use the whole training set; > 0 trains on the first max_images
                            (for short CI runs) */
} cnn_train_opts;

cnn_train_opts cnn_train_opts_default(void);

/* Trains m in place on data with the schedule in opts (hooks may be NULL). */
qcal_status cnn_train(cnn_ctx *ctx, cnn_model *m, const cnn_data *data, const cnn_train_opts *opts,
                      const cnn_hooks *hooks, cnn_progress_fn progress, void *progress_user);

/* Top-1 evaluation over all of data in batches of the ctx's max_batch; *correct gets the
 * number of right predictions; preds (NULL or data->n bytes) gets the predicted classes. */
qcal_status cnn_evaluate(cnn_ctx *ctx, const cnn_model *m, const cnn_data *data, const cnn_hooks *hooks,
                         int64_t *correct, uint8_t *preds, cnn_progress_fn progress, void *progress_user);

/* ---- Cache ------------------------------------------------------------------------- */

/* Cache file for a float model trained with opts:
 * $XDG_CACHE_HOME/qcal (or ~/.cache/qcal) / fmnist_cnn_<key>.safetensors, key from every
 * field of opts and a format version. Creates the directory. */
qcal_status cnn_cache_path(const cnn_train_opts *opts, char *buf, size_t cap);

/* Loads the cached model for opts, or trains one (new model from opts->seed) and saves it
 * to the cache. *trained tells which happened (may be NULL). */
qcal_status cnn_load_or_train(cnn_ctx *ctx, const cnn_data *train, const cnn_train_opts *opts,
                              cnn_progress_fn progress, void *progress_user, cnn_model **out,
                              bool *trained);

/* Monotonic seconds, for timing. */
double cnn_now(void);

#endif
