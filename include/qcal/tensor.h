/* qcal tensor views: float32, C-contiguous, up to 8 dimensions, int64 shape.
 * A view never owns its data: the caller owns the buffer it points at.
 *
 * Two view types with the same layout:
 *   qcal_tensor      read-only (const float *data): every input of the API. A C++ caller
 *                    holding a const std::vector<float> passes v.data() without a cast.
 *   qcal_tensor_mut  writable (float *data): the outputs the library writes through
 *                    (qcal_dequantize, the fake-quant functions and the FakeQuantize object).
 * An in-place call passes the same buffer as both (one qcal_tensor, one qcal_tensor_mut). */
#ifndef QCAL_TENSOR_H
#define QCAL_TENSOR_H

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QCAL_MAX_DIMS 8

/* Read-only view: the library never writes through data. */
typedef struct qcal_tensor {
    const float *data;              /* C-contiguous float32 elements, owned by the caller */
    int32_t ndim;                   /* 0..QCAL_MAX_DIMS (0 = scalar, one element) */
    int64_t shape[QCAL_MAX_DIMS];   /* each >= 0; entries past ndim are ignored */
} qcal_tensor;

/* Writable view (an output): the same fields, data not const. */
typedef struct qcal_tensor_mut {
    float *data;                    /* C-contiguous float32 elements, owned by the caller */
    int32_t ndim;                   /* 0..QCAL_MAX_DIMS (0 = scalar, one element) */
    int64_t shape[QCAL_MAX_DIMS];   /* each >= 0; entries past ndim are ignored */
} qcal_tensor_mut;

/* Fills *t as a read-only view of data with the given shape; checks ndim, negative sizes
 * and overflow (data may be NULL only for an empty tensor). */
QCAL_API qcal_status qcal_tensor_init(qcal_tensor *t, const float *data, int32_t ndim,
                                      const int64_t *shape);

/* Fills *t as a writable view of data with the given shape; the same checks. */
QCAL_API qcal_status qcal_tensor_mut_init(qcal_tensor_mut *t, float *data, int32_t ndim,
                                          const int64_t *shape);

/* Read-only view *out of the buffer and shape of the writable view t. */
QCAL_API qcal_status qcal_tensor_mut_view(const qcal_tensor_mut *t, qcal_tensor *out);

/* Number of elements of t into *numel (1 for a scalar); fails on negative or overflowing shapes. */
QCAL_API qcal_status qcal_tensor_numel(const qcal_tensor *t, int64_t *numel);

/* The same for a writable view. */
QCAL_API qcal_status qcal_tensor_mut_numel(const qcal_tensor_mut *t, int64_t *numel);

/* Resolves a possibly negative axis against t->ndim into *out (0..ndim-1). */
QCAL_API qcal_status qcal_tensor_axis(const qcal_tensor *t, int32_t axis, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
