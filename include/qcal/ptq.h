/* qcal post-training cures on float weights (Nagel et al. 2019, "Data-Free Quantization"):
 * per-channel weight ranges, cross-layer equalization of two layers through a ReLU, bias
 * absorption, and bias correction (empirical from measured input means, analytic from the
 * BatchNorm statistics before a ReLU). The ONNX passes built on them: qcal/onnx.h
 * (qcal_onnx_fold_bn, qcal_onnx_equalize); the arithmetic: docs/ptq.md.
 *
 *   qcal_ptq_layer conv1 = { w1, b1, 32, 16, 1, 9 };    // Conv [32, 16, 3, 3]
 *   qcal_ptq_layer dw    = { w2, b2, 32, 32, 32, 9 };   // depthwise Conv [32, 1, 3, 3]
 *   qcal_ptq_equalize_pair(&conv1, &dw, NULL);          // conv1 -> ReLU -> dw, same function
 *
 * Every array is caller-owned float32, C order; the functions change only what they name. */
#ifndef QCAL_PTQ_H
#define QCAL_PTQ_H

#include "qcal/common.h"
#include "qcal/qparams.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A layer's weight seen as [out_channels, in_channels / groups, kernel] (Conv OIHW: kernel =
 * H * W; Gemm/Linear [out, in]: kernel 1; depthwise: groups == in_channels), plus its bias. */
typedef struct qcal_ptq_layer {
    float *weight;          /* out_channels * (in_channels / groups) * kernel values */
    float *bias;            /* out_channels values, or NULL when the layer has none */
    int64_t out_channels;   /* >= 1, a multiple of groups */
    int64_t in_channels;    /* >= 1, a multiple of groups */
    int64_t groups;         /* >= 1 */
    int64_t kernel;         /* >= 1 */
} qcal_ptq_layer;

/* Range of each output channel, max |w| over its weights, into ranges[out_channels]. */
QCAL_API qcal_status qcal_ptq_channel_ranges(const qcal_ptq_layer *l, float *ranges);

/* Range of each input channel, max |w| over the weights that read it, into ranges[in_channels]. */
QCAL_API qcal_status qcal_ptq_input_ranges(const qcal_ptq_layer *l, float *ranges);

/* Largest over smallest output-channel range (*ratio, +inf when a channel is all zeros),
 * the quantity per-tensor weight quantization suffers from; min_range, max_range may be NULL. */
QCAL_API qcal_status qcal_ptq_range_ratio(const qcal_ptq_layer *l, double *ratio, float *min_range,
                                          float *max_range);

/* Cross-layer equalization of l1 -> ReLU -> l2 (l2->in_channels == l1->out_channels): with
 * r1_i the range of l1's output channel i and r2_i that of l2's input channel i,
 * s_i = sqrt(r1_i * r2_i) / r2_i; l1's channel i (weights and bias) is divided by s_i and
 * l2's input channel i multiplied by it, so both ranges become sqrt(r1_i * r2_i) and
 * l2(relu(l1(x))) is unchanged. s_i = 1 when r1_i or r2_i is 0. scales (may be NULL) gets
 * the s_i (l1->out_channels). The layers are unchanged on failure. */
QCAL_API qcal_status qcal_ptq_equalize_pair(qcal_ptq_layer *l1, qcal_ptq_layer *l2, float *scales);

/* Bias absorption for l1 -> ReLU -> l2 when l1's pre-activation output channel i is
 * ~N(beta_i, gamma_i^2) (its BatchNorm's shift and scale): c_i = max(0, beta_i - n_sigma *
 * |gamma_i|) moves from l1's bias to l2's (l2 bias += sum over l2's weights reading channel
 * i times c_i). Exact for inputs where l1's output stays >= c (Nagel et al. use n_sigma 3);
 * zero padding in l2 makes it approximate at borders. Needs both biases (a zero array for a
 * layer without one). absorbed (may be NULL) gets c (l1->out_channels). */
QCAL_API qcal_status qcal_ptq_absorb_bias(qcal_ptq_layer *l1, qcal_ptq_layer *l2, const float *beta,
                                          const float *gamma, float n_sigma, float *absorbed);

/* The layer's weight quantized and dequantized into dst (numel values) with cfg's dtype and
 * qscheme from the weight's own min/max (per-channel qschemes: output channel, axis 0), as
 * qcal's per-channel min/max observer and the ONNX Q/DQ pass quantize weights. */
QCAL_API qcal_status qcal_ptq_weight_fake_quant(const qcal_ptq_layer *l, const qcal_qconfig *cfg,
                                                float *dst);

/* Bias correction: removes the expected output shift the quantized weight wq (dequantized,
 * same layout as l->weight) causes for inputs of per-channel mean mean_in[in_channels]:
 * bias[o] -= sum over (c, k) of (wq - w)[o, c, k] * mean_in[c]  (E[W_q x] - E[W x] =
 * (W_q - W) E[x]; zero padding at borders is ignored). Needs l->bias. shift (may be NULL)
 * gets the removed shift per output channel. */
QCAL_API qcal_status qcal_ptq_bias_correct(qcal_ptq_layer *l, const float *wq, const float *mean_in,
                                           float *shift);

/* E[relu(x)] for x ~ N(mean[i], std[i]^2), per channel (n values, into out): mean * Phi(mean /
 * std) + std * phi(mean / std); std 0 gives max(mean, 0). The analytic input mean of a layer
 * after BatchNorm -> ReLU (mean = BN shift, std = |BN scale|). */
QCAL_API qcal_status qcal_ptq_relu_normal_mean(int64_t n, const float *mean, const float *std,
                                               float *out);

#ifdef __cplusplus
}
#endif
#endif
