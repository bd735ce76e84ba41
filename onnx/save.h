/* Internal to onnx/: lazy initializers, the seam between a rewrite (qdq.c) and the writer
 * (save.c). */
#ifndef QCAL_ONNX_SAVE_H
#define QCAL_ONNX_SAVE_H

#include "onnx/onnx_internal.h"

/* A main-graph initializer whose bytes are not final when the save starts: t's raw_data has
 * its final (non-zero) size, and fill(ctx, t) makes its bytes final. The writer calls fill
 * when it reaches those bytes, before it writes them, once per save; so a rewrite can
 * compute them (on a thread of its own) while the writer writes what comes before. fill
 * returns QCAL_OK, or a status with its message set on the calling thread; it changes no
 * field of t, only the bytes t->raw_data.data points at, and those only before it returns. */
typedef struct onnx_lazy {
    const Onnx__TensorProto *t;
    qcal_status (*fill)(void *ctx, const Onnx__TensorProto *t);
    void *ctx;
} onnx_lazy;

/* qcal_onnx_model_save_file with n lazy initializers. Nothing is committed unless every one was
 * filled and then written as itself; a fill that fails fails the save with its status and
 * message (nothing written). The lazy list is read during the call only. */
qcal_status onnx_model_save_lazy(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path,
                                 const onnx_lazy *lazy, size_t n);

#endif
