/* qcal tensor views: float32, C-contiguous, up to 8 dimensions, int64 shape.
 * A view never owns its data: the caller owns the buffer it points at. */
#ifndef QCAL_TENSOR_H
#define QCAL_TENSOR_H

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QCAL_MAX_DIMS 8

typedef struct qcal_tensor {
    float *data;                    /* C-contiguous float32 elements, owned by the caller */
    int32_t ndim;                   /* 0..QCAL_MAX_DIMS (0 = scalar, one element) */
    int64_t shape[QCAL_MAX_DIMS];   /* each >= 0; entries past ndim are ignored */
} qcal_tensor;

/* Fills *t as a view of data with the given shape; checks ndim, negative sizes and overflow. */
QCAL_API qcal_status qcal_tensor_init(qcal_tensor *t, float *data, int32_t ndim, const int64_t *shape);

/* Number of elements of t into *numel (1 for a scalar); fails on negative or overflowing shapes. */
QCAL_API qcal_status qcal_tensor_numel(const qcal_tensor *t, int64_t *numel);

/* Resolves a possibly negative axis against t->ndim into *out (0..ndim-1). */
QCAL_API qcal_status qcal_tensor_axis(const qcal_tensor *t, int32_t axis, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
