/* qcal FP8 serving checkpoints: a Hugging Face model's safetensors with every targeted
 * linear's weight quantized to float8_e4m3fn and the static scales vLLM, SGLang and
 * TensorRT-LLM load, from a calibration table (docs/fp8.md "Checkpoints").
 *
 * Names in the table (what the dump of qcal.torch.add_activation_loggers holds):
 *   "<module>.input"  activation: the input of linear <module>; its <module>.weight (2-D, in a
 *                     model file) is quantized and gets <module>.weight_scale and
 *                     <module>.input_scale = amax / 448 (amax = max(|min|, |max|) of the
 *                     range the activation's observer chose);
 *   "<module>.weight" weight: the range of the weight scale (per tensor: the largest amax
 *                     over its channels; per channel: axis 0); absent: the weight's own
 *                     max |w|;
 *   "<attn>.k_proj.output", "<attn>.v_proj.output"  activations: <attn>.k_scale and
 *                     <attn>.v_scale (KV cache), both or neither.
 * Every scale is max(amax / 448, FLT_EPSILON) in float32, as qcal_qparams computes FP8
 * scales; weights are quantized with qcal_quantize (round to nearest even, saturating).
 * Other tensors are copied byte for byte. 2-D ".weight" tensors that are not quantized
 * (lm_head, ...) are listed in "ignore" / "exclude_modules", except embeddings (a module
 * whose last name component contains "embed").
 *
 *   qcal_fp8_checkpoint_options o;
 *   qcal_fp8_checkpoint_options_default(&o);
 *   o.format = QCAL_FP8_CHECKPOINT_MODELOPT;
 *   qcal_fp8_checkpoint_write("out", 1, (const char *[]){"model.safetensors"}, table, &o, &sum);
 */
#ifndef QCAL_FP8_CHECKPOINT_H
#define QCAL_FP8_CHECKPOINT_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/qparams.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_fp8_checkpoint_format {
    /* llm-compressor's layout: config.json with quantization_config; per-tensor scales
     * of shape [1] */
    QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS = 0,
    /* NVIDIA ModelOpt's layout: hf_quant_config.json; per-tensor scales of shape [] */
    QCAL_FP8_CHECKPOINT_MODELOPT = 1,
} qcal_fp8_checkpoint_format;

typedef struct qcal_fp8_checkpoint_options {
    qcal_fp8_checkpoint_format format;  /* default QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS */
    qcal_dtype dtype;                   /* default QCAL_FLOAT8_E4M3FN, the only dtype the
                                         * serving loaders take (others: UNSUPPORTED) */
    bool weight_per_channel;            /* default false: one weight_scale per tensor;
                                         * true: (out, 1) per output channel (compressed-
                                         * tensors only: ModelOpt's quant_algo "FP8" is per
                                         * tensor, so MODELOPT refuses it: UNSUPPORTED) */
    bool fused_input_scale_max;         /* default false: each shard keeps its own
                                         * input_scale; true: q/k/v_proj and gate/up_proj
                                         * of one parent all get the group's max (what vLLM
                                         * computes on load) */
    const char *config_json;            /* default NULL: the model's config.json; with
                                         * compressed-tensors quantization_config is added
                                         * to it (it must not have one); NULL: a config.json
                                         * holding only quantization_config. ModelOpt: copied
                                         * unchanged when given. */
} qcal_fp8_checkpoint_options;

/* What was written. */
typedef struct qcal_fp8_checkpoint_summary {
    int64_t quantized;         /* linear weights quantized to FP8 */
    int64_t kv_scales;         /* attention modules given k_scale and v_scale */
    int64_t copied;            /* tensors copied unchanged */
    int64_t ignored;           /* 2-D weights left in their dtype (listed in ignore) */
    int64_t unmatched_inputs;  /* "<module>.input" entries with no <module>.weight */
    int64_t files;             /* files written into the output directory */
} qcal_fp8_checkpoint_summary;

/* Fills *o with the defaults documented on each field. */
QCAL_API void qcal_fp8_checkpoint_options_default(qcal_fp8_checkpoint_options *o);

/* Writes the checkpoint into the directory outdir (created if missing): each model file
 * under its own base name (the safetensors shards of one model, names unique), then
 * config.json (compressed-tensors) or hf_quant_config.json (ModelOpt), and with several
 * shards model.safetensors.index.json. All files or none: each goes to a temporary that is
 * renamed only after every one was written. A model file inside outdir is refused (it
 * would be replaced while read). summary may be NULL. */
QCAL_API qcal_status qcal_fp8_checkpoint_write(const char *outdir, int64_t nmodels,
                                               const char *const *models,
                                               const qcal_calib_table *table,
                                               const qcal_fp8_checkpoint_options *o,
                                               qcal_fp8_checkpoint_summary *summary);

/* "compressed-tensors" / "modelopt"; parse returns QCAL_ERR_INVALID_ARG on other names. */
QCAL_API const char *qcal_fp8_checkpoint_format_name(qcal_fp8_checkpoint_format f);
QCAL_API qcal_status qcal_fp8_checkpoint_format_parse(const char *name,
                                                      qcal_fp8_checkpoint_format *out);

#ifdef __cplusplus
}
#endif
#endif
