/* qcal int8: real int8 execution of small CNNs (2-D convolution, max-pool, linear) on
 * oneDNN 2.6, for deploying what qcal calibrated.
 *
 *   qcal_int8_net_options opt;
 *   qcal_int8_net_options_default(&opt);
 *   const int64_t in_shape[3] = {1, 28, 28};           // per-sample C, H, W
 *   qcal_int8_net *net = NULL;
 *   qcal_qparams in_q, q1;                              // quint8 per-tensor values
 *   qcal_qparams_per_tensor(&in_q, QCAL_QUINT8, in_scale, in_zero_point);
 *   qcal_int8_net_create(&opt, 3, in_shape, &in_q, &net);
 *   qcal_int8_conv2d_params c; qcal_int8_conv2d_params_default(&c);
 *   c.out_channels = 32; c.kernel_h = c.kernel_w = 3; c.pad_h = c.pad_w = 1;
 *   c.weight = w1; c.bias = b1; c.relu = true; c.out_qparams = &q1;
 *   qcal_int8_net_add_conv2d(net, &c);
 *   ... qcal_int8_net_add_maxpool2d, qcal_int8_net_add_linear (last one QCAL_INT8_OUT_F32)
 *   qcal_int8_net_forward(net, n, images, logits);
 *   qcal_int8_net_destroy(&net);
 *
 * Quantization model (PyTorch's static quantization, fbgemm/onednn backends):
 * - activations are quint8, per-tensor affine: x = scale * (q - zero_point), q in [0, 255];
 *   the input is quantized as q = clamp(zp + nearbyintf(x * (1.0f / scale)), 0, 255)
 *   (round half to even; the contract of qcal/quantize.h);
 * - weights are qint8, per-output-channel symmetric: w = w_scale[oc] * q, q in [-128, 127],
 *   q = clamp(nearbyintf(w * (1.0f / w_scale[oc]))); by default w_scale is computed as
 *   PyTorch's PerChannelMinMaxObserver(qint8, per_channel_symmetric) does:
 *   max(|min(w, 0)|, max(w, 0)) / 127.5, at least FLT_EPSILON;
 * - conv / linear accumulate sum((q_x - zp_x) * q_w) exactly in int32, add the bias, scale by
 *   output_scale[oc] = (in_scale * w_scale[oc]) / out_scale, apply ReLU, add the output
 *   zero-point, round half to even and saturate to [0, 255] (u8 output); or scale by
 *   in_scale * w_scale[oc] only (f32 output, e.g. logits). The bias is rounded to int32 in
 *   accumulator units, round(bias / (in_scale * w_scale[oc])), as PyTorch's onednn backend
 *   (ideep) does, unless qcal_int8_net_options.bias_f32 keeps it exact in f32.
 * - max-pool works on the codes (scale and zero-point pass through unchanged).
 * Against a fake-quant float simulation of the same layer the u8 outputs differ by at most
 * one quantization step (float rounding of the scale products and the bias rounding).
 *
 * Tensors cross the API in PyTorch's layout: input [N, C, H, W] f32, output [N, C, H, W]
 * or [N, F]; a linear layer after a convolution flattens in NCHW order as torch.flatten.
 * Inside, activations are u8 NHWC and weights are reordered once into oneDNN's blocked
 * (VNNI) layout. A net is not thread-safe (forward keeps cached primitives and buffers).
 * Threads: qcal_threads_count() (qcal_threads_set_count, default OMP_NUM_THREADS; the
 * count at create bounds the chunk slots), over whole chunks or inside oneDNN's primitives
 * (its OpenMP runtime, given that count for the call), see chunk_parallel.
 * Without oneDNN (built with -Donednn=disabled) every function returns
 * QCAL_ERR_UNSUPPORTED. On CPUs without AVX-512 VNNI / AVX-VNNI, oneDNN's u8 x s8 kernels
 * (vpmaddubsw) saturate 16-bit sums of two products for large weights; qcal then splits
 * each weight w into floor(w/2) + ceil(w/2), both in [-64, 64], along a doubled input (see
 * weight_split): the products can no longer saturate and the results equal the VNNI path's
 * (docs/int8.md). */
#ifndef QCAL_INT8_H
#define QCAL_INT8_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/qparams.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qcal_int8_net qcal_int8_net;

typedef enum qcal_int8_out_type {
    QCAL_INT8_OUT_U8 = 0,    /* requantized quint8 with out_qparams */
    QCAL_INT8_OUT_F32 = 1,   /* float32 (dequantized accumulator): must be the last layer */
} qcal_int8_out_type;

/* How conv / linear weights reach oneDNN (qcal_int8_net_options.weight_split). */
typedef enum qcal_int8_split {
    QCAL_INT8_SPLIT_AUTO = 0,    /* split where oneDNN has no VNNI (its u8 x s8 pairs saturate) */
    QCAL_INT8_SPLIT_ALWAYS = 1,  /* split on every CPU (tests the path; 2x the MACs) */
    QCAL_INT8_SPLIT_NEVER = 2,   /* never: full-range weights may saturate without VNNI */
} qcal_int8_split;

typedef struct qcal_int8_net_options {
    int64_t batch_chunk;     /* default 128: forward() runs primitives on at most this many
                              * samples at a time (bounded memory); >= 1 */
    int32_t cache_entries;   /* default 4: primitive sets cached per distinct chunk size
                              * (least recently used evicted); >= 1 */
    bool nonfinite_error;    /* default false: NaN inputs quantize to the zero-point and
                              * +-Inf saturate, counted by qcal_int8_net_nonfinite; true:
                              * forward fails with QCAL_ERR_NONFINITE, dst untouched */
    bool bias_f32;           /* default false: bias rounded to int32 accumulator units
                              * (PyTorch onednn); true: f32 bias / (in_scale * w_scale) */
    bool chunk_parallel;     /* default true: with OpenMP and >= 2 full chunks, forward runs
                              * whole chunks on separate threads (oneDNN single-threaded
                              * inside); false: oneDNN threads each primitive. Same results. */
    qcal_int8_split weight_split; /* default QCAL_INT8_SPLIT_AUTO: each s8 weight w is stored
                              * as the pair floor(w/2), ceil(w/2) against the input repeated
                              * twice along the reduction, when oneDNN cannot use VNNI (CPU
                              * without AVX-512 VNNI / AVX-VNNI, or capped by DNNL_MAX_CPU_ISA);
                              * exact (same codes), at twice the MACs. The layer's impl name
                              * (qcal_int8_net_impl) then ends in " split". */
} qcal_int8_net_options;

typedef struct qcal_int8_conv2d_params {
    int64_t out_channels;        /* required, >= 1 (default 0 = unset) */
    int64_t kernel_h, kernel_w;  /* required, >= 1 (default 0 = unset) */
    int64_t stride_h, stride_w;  /* default 1 */
    int64_t pad_h, pad_w;        /* default 0: symmetric zero padding (real 0.0, code zp) */
    const float *weight;         /* required: [out_channels, C, kernel_h, kernel_w] f32, caller
                                  * owned, read during the call only */
    const qcal_qparams *weight_qparams; /* default NULL: per-channel symmetric qint8 qparams
                                  * from a per_channel_minmax observer over weight (see above);
                                  * else qint8 per-channel, axis 0, out_channels channels, zero
                                  * points 0 (caller owned, read during the call) */
    const float *bias;           /* default NULL (no bias); else [out_channels] f32 */
    bool relu;                   /* default false: fused ReLU after the bias */
    qcal_int8_out_type out_type; /* default QCAL_INT8_OUT_U8 */
    const qcal_qparams *out_qparams; /* u8 output: required (default NULL = unset), quint8
                                  * per-tensor, scale > 0 and finite, zero-point in [0, 255];
                                  * caller owned, read during the call */
} qcal_int8_conv2d_params;

typedef struct qcal_int8_linear_params {
    int64_t out_features;        /* required, >= 1 (default 0 = unset) */
    const float *weight;         /* required: [out_features, in_features] f32 with in_features
                                  * = C*H*W of the input in NCHW flatten order; caller owned */
    const qcal_qparams *weight_qparams; /* default NULL: observed (as conv2d); else qint8
                                  * per-channel, axis 0, out_features channels, zero points 0 */
    const float *bias;           /* default NULL (no bias); else [out_features] f32 */
    bool relu;                   /* default false */
    qcal_int8_out_type out_type; /* default QCAL_INT8_OUT_U8 */
    const qcal_qparams *out_qparams; /* u8 output: required, as conv2d */
} qcal_int8_linear_params;

typedef struct qcal_int8_pool2d_params {
    int64_t kernel_h, kernel_w;  /* default 2 x 2 */
    int64_t stride_h, stride_w;  /* default 0 = same as the kernel (torch.nn.MaxPool2d) */
    int64_t pad_h, pad_w;        /* default 0; at most half the kernel, as PyTorch */
} qcal_int8_pool2d_params;

/* Fills *opt with the defaults documented on each field of qcal_int8_net_options. */
QCAL_API void qcal_int8_net_options_default(qcal_int8_net_options *opt);
/* Fills *p with the defaults documented on each field (required fields left unset). */
QCAL_API void qcal_int8_conv2d_params_default(qcal_int8_conv2d_params *p);
/* Fills *p with the defaults documented on each field (required fields left unset). */
QCAL_API void qcal_int8_linear_params_default(qcal_int8_linear_params *p);
/* Fills *p with the defaults documented on each field (2x2 window, stride = kernel). */
QCAL_API void qcal_int8_pool2d_params_default(qcal_int8_pool2d_params *p);

/* Creates an empty net (oneDNN engine) whose per-sample input, ndim 1 (F) or 3 (C, H, W), is
 * quantized with input (quint8 per-tensor, read during the call); opt NULL = defaults.
 * *out is owned by the caller: release with qcal_int8_net_destroy. */
QCAL_API qcal_status qcal_int8_net_create(const qcal_int8_net_options *opt, int32_t ndim,
                                          const int64_t *input_shape,
                                          const qcal_qparams *input, qcal_int8_net **out);

/* Destroys *net (NULL or *net == NULL is fine) and sets *net to NULL. */
QCAL_API void qcal_int8_net_destroy(qcal_int8_net **net);

/* Appends a 2-D convolution; the current activation must be (C, H, W). Weights are
 * quantized and copied (the caller's arrays are not kept). */
QCAL_API qcal_status qcal_int8_net_add_conv2d(qcal_int8_net *net, const qcal_int8_conv2d_params *p);

/* Appends a fully connected layer on the current activation flattened in NCHW order. */
QCAL_API qcal_status qcal_int8_net_add_linear(qcal_int8_net *net, const qcal_int8_linear_params *p);

/* Appends a max-pool on u8 codes (floor mode); the current activation must be (C, H, W). */
QCAL_API qcal_status qcal_int8_net_add_maxpool2d(qcal_int8_net *net, const qcal_int8_pool2d_params *p);

/* Appends a ReLU. On quint8 codes it is max(q, zero_point) with the qparams unchanged
 * (torch.nn.quantized.ReLU); qcal fuses it, exactly, into the conv / linear layer that
 * produced the activation (through max-pools, which commute with it), so it adds no layer
 * to qcal_int8_net_layers. QCAL_ERR_UNSUPPORTED right after the input (no producer);
 * QCAL_ERR_STATE after an f32 last layer. */
QCAL_API qcal_status qcal_int8_net_add_relu(qcal_int8_net *net);

/* ---- Building a net from a calibration table ---- */

typedef enum qcal_int8_layer_kind {
    QCAL_INT8_CONV2D = 0,      /* desc.conv */
    QCAL_INT8_LINEAR = 1,      /* desc.linear */
    QCAL_INT8_MAXPOOL2D = 2,   /* desc.pool */
    QCAL_INT8_RELU = 3,        /* no parameters */
} qcal_int8_layer_kind;

/* One layer of a model given to qcal_int8_net_from_table, in execution order. */
typedef struct qcal_int8_layer_desc {
    qcal_int8_layer_kind kind;
    const char *fqn;                /* conv2d / linear: the layer's name. Its input activation
                                     * qparams are the table entry (fqn, activation); if the
                                     * table holds (fqn + ".weight", weight), its per-channel
                                     * scales quantize the weights, else a per-channel observer
                                     * computes them as weight_qparams = NULL does) */
    qcal_int8_conv2d_params conv;   /* conv2d: geometry, weight, bias; relu may be set; the
                                     * weight_qparams and out_* fields are set by the builder */
    qcal_int8_linear_params linear; /* linear: out_features, weight, bias, relu (as conv) */
    qcal_int8_pool2d_params pool;   /* maxpool2d */
} qcal_int8_layer_desc;

/* Fills *d for kind with the defaults of its params struct (fqn NULL). */
QCAL_API void qcal_int8_layer_desc_default(qcal_int8_layer_desc *d, qcal_int8_layer_kind kind);

/* Builds the int8 net of nlayers layers (caller-owned descs, read during the call) from a
 * calibration table: the net's input is quantized with the first conv / linear layer's input
 * entry; each conv / linear layer outputs u8 codes with the next conv / linear layer's input
 * qparams, the last one with the entry (output_fqn, activation), or f32 when output_fqn is
 * NULL. Activation entries must be quint8 per-tensor with data; weight entries qint8
 * per-channel symmetric, axis 0, one channel per output channel (QCAL_ERR_MISMATCH naming the
 * entry otherwise; a missing activation entry is QCAL_ERR_NOT_FOUND). input_shape as
 * qcal_int8_net_create; opt may be NULL. *out owned by the caller. */
QCAL_API qcal_status qcal_int8_net_from_table(const qcal_int8_net_options *opt,
                                              const qcal_calib_table *table, int32_t ndim,
                                              const int64_t *input_shape, int32_t nlayers,
                                              const qcal_int8_layer_desc *layers,
                                              const char *output_fqn, qcal_int8_net **out);

/* Number of layers added so far into *n. */
QCAL_API qcal_status qcal_int8_net_layers(const qcal_int8_net *net, int32_t *n);

/* Per-sample output shape: *ndim (1 or 3) and shape[0..ndim-1] (shape has room for 3). */
QCAL_API qcal_status qcal_int8_net_output_shape(const qcal_int8_net *net, int32_t *ndim,
                                                int64_t *shape);

/* Weight scales a layer uses (computed or given): cap = capacity of scales, *n gets the
 * channel count. Max-pool layers have none (QCAL_ERR_INVALID_ARG). */
QCAL_API qcal_status qcal_int8_net_weight_scales(const qcal_int8_net *net, int32_t layer,
                                                 int64_t cap, float *scales, int64_t *n);

/* Runs n >= 1 samples: src [n, input_shape...] f32 (caller owned, read only); dst [n,
 * output shape...] f32 (caller owned): the f32 output of a QCAL_INT8_OUT_F32 last layer, or
 * the dequantized u8 codes, scale * (q - zp), of a u8 last layer. */
QCAL_API qcal_status qcal_int8_net_forward(qcal_int8_net *net, int64_t n, const float *src,
                                           float *dst);

/* As qcal_int8_net_forward but writes the raw u8 codes of a u8 last layer
 * (QCAL_ERR_STATE if the last layer outputs f32). */
QCAL_API qcal_status qcal_int8_net_forward_u8(qcal_int8_net *net, int64_t n, const float *src,
                                              uint8_t *dst);

/* Number of non-finite input values quantized so far under the default policy. */
QCAL_API qcal_status qcal_int8_net_nonfinite(const qcal_int8_net *net, uint64_t *count);

/* oneDNN implementation name of a layer's primitive ("brg:avx512_core_vnni", ...) as built
 * for the last forward call; *name points into the net, valid until the next call on it.
 * QCAL_ERR_STATE before the first forward. */
QCAL_API qcal_status qcal_int8_net_impl(const qcal_int8_net *net, int32_t layer,
                                        const char **name);

#ifdef __cplusplus
}
#endif
#endif
