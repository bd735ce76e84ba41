/* qcal weight quantizer: one call from a float32 weight to its qparams and codes
 * (observer -> qparams -> quantize, qcal/observer.h, qcal/qparams.h, qcal/quantize.h), used
 * by the ONNX Q/DQ pass, the int8 network builder, the weight comparison, the PTQ passes and
 * the FP8 checkpoint writer (docs/qparams.md "Weight quantizer").
 *
 * The weight is a C-order float32 tensor (shape, ndim <= QCAL_MAX_DIMS), in memory or read
 * in blocks through a reader, so a weight in a file mapping or a safetensors file is never
 * copied whole. Seen as (outer, C, inner) around the channel axis, a reader-backed weight is
 * read in blocks of whole channels (outer == 1) or of whole (C, inner) rows, about
 * opt->block_bytes each; min and max over blocks are exact, a channel's qparams depend on its
 * own range only and quantizing is elementwise, so the scales, zero-points and codes are those
 * of the whole tensor, bit for bit, for any block size and any thread count. */
#ifndef QCAL_WEIGHTS_H
#define QCAL_WEIGHTS_H

#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes past count floats in a reader's scratch (room for a copy the reader aligns). */
#define QCAL_WEIGHTS_SCRATCH_SLACK ((size_t)8192)

/* Reads elements [first, first + count) of the weight (C order): *out points at them where
 * they lie, or at a copy in scratch (count * 4 + QCAL_WEIGHTS_SCRATCH_SLACK bytes, owned by
 * the quantizer, one per thread). Called from several threads at once with distinct scratch. */
typedef qcal_status (*qcal_weights_read_fn)(void *ctx, int64_t first, int64_t count, void *scratch,
                                            const float **out);

typedef struct qcal_weights_reader {
    qcal_weights_read_fn read;
    void *ctx;                      /* the reader's, passed back as is */
} qcal_weights_reader;

typedef struct qcal_weights_options {
    qcal_observer_kind observer;    /* default QCAL_OBSERVER_PER_CHANNEL_MINMAX; with a per-tensor
                                     * qscheme a per-channel kind observes as QCAL_OBSERVER_MINMAX */
    qcal_qconfig q;                 /* default qint8, per_channel_symmetric, otherwise
                                     * qcal_qconfig_default's; FP8 dtypes: symmetric */
    int32_t axis;                   /* per-channel qschemes: channel axis, default 0 (>= 0) */
    qcal_nonfinite_policy nonfinite;/* default QCAL_NONFINITE_SKIP (NaN/Inf not observed, as
                                     * the observers); QCAL_NONFINITE_ERROR fails the call */
    bool empty_as_zero;             /* default false: a channel with no finite value gets scale 1,
                                     * zero-point 0 and the call returns QCAL_NO_DATA (observer
                                     * rule); true: its range is [0, 0] (scale eps), QCAL_OK */
    const float *scales;            /* default NULL: observe; else the given scales (channels
                                     * values, > 0 and finite, zero-points 0): quantize only */
    size_t block_bytes;             /* default 512 KiB: a reader's block, about one core's L2 */
    bool serial;                    /* default false: a streamed weight's observer pass is shared
                                     * among threads; true: on the calling thread */
    void *scratch;                  /* default NULL; else the calling thread's reads go here when
                                     * scratch_bytes covers them (qcal_weights_scratch_bytes), so
                                     * a caller of many weights reuses one buffer (caller-owned) */
    size_t scratch_bytes;           /* default 0 */
} qcal_weights_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_weights_options_default(qcal_weights_options *opt);

/* Number of scales the weight w gets under opt: w->shape[opt->axis] for a per-channel qscheme,
 * 1 otherwise; QCAL_ERR_INVALID_ARG for an axis outside [0, w->ndim). */
QCAL_API qcal_status qcal_weights_channels(const qcal_weights_options *opt, const qcal_tensor *w,
                                           int64_t *channels);

/* Bytes of scratch that cover every read of the calling thread for weight w under opt (its
 * numel * 4 + QCAL_WEIGHTS_SCRATCH_SLACK: an observer kind that needs the whole weight reads it
 * whole), or 0 for an invalid shape. Only the pages a read touches are used. */
QCAL_API size_t qcal_weights_scratch_bytes(const qcal_weights_options *opt, const qcal_tensor *w);

/* Observes weight w (w->data, or read through reader when reader is non-NULL: then w->data is
 * not read) and writes its qparams into scales[channels] and zero_points[channels] (NULL:
 * not wanted) and, when codes is non-NULL, its codes (numel * qcal_dtype_size(opt->q.dtype)
 * bytes, caller-owned, as qcal_quantize writes them). Returns QCAL_NO_DATA as described on
 * empty_as_zero; QCAL_ERR_EMPTY for a weight without elements, QCAL_ERR_INVALID_ARG for an
 * axis out of range or a per-tensor observer kind with a per-channel qscheme,
 * QCAL_ERR_NONFINITE under QCAL_NONFINITE_ERROR (the message names the element). Outputs
 * are unspecified on failure. */
QCAL_API qcal_status qcal_weights_quantize(const qcal_weights_options *opt, const qcal_tensor *w,
                                           const qcal_weights_reader *reader, float *scales,
                                           int32_t *zero_points, void *codes);

#ifdef __cplusplus
}
#endif
#endif
