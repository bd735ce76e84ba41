/* Tensor view helpers: shape validation and checked element counts. */
#include "core/internal.h"
#include <string.h>
#include "qcal/tensor.h"

qcal_status qcal_tensor_init(qcal_tensor *t, const float *data, int32_t ndim, const int64_t *shape)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor is NULL");
    if (ndim < 0 || ndim > QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor has %d dimensions; 0..%d supported",
                          (int)ndim, QCAL_MAX_DIMS);
    if (ndim > 0 && !shape)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor shape is NULL");
    qcal_tensor v = { .data = data, .ndim = ndim };
    for (int32_t i = 0; i < ndim; i++)
        v.shape[i] = shape[i];
    int64_t n;
    qcal_status st = qcal_tensor_numel(&v, &n);
    if (st != QCAL_OK)
        return st;
    if (n > 0 && !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor data is NULL for %lld elements",
                          (long long)n);
    *t = v;
    return QCAL_OK;
}

qcal_status qcal_tensor_mut_init(qcal_tensor_mut *t, float *data, int32_t ndim,
                                 const int64_t *shape)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor is NULL");
    qcal_tensor v;
    qcal_status st = qcal_tensor_init(&v, data, ndim, shape);
    if (st != QCAL_OK)
        return st;
    t->data = data;
    t->ndim = v.ndim;
    memcpy(t->shape, v.shape, sizeof t->shape);
    return QCAL_OK;
}

qcal_status qcal_tensor_mut_view(const qcal_tensor_mut *t, qcal_tensor *out)
{
    if (!t || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor or output is NULL");
    qcal_tensor v = { .data = t->data, .ndim = t->ndim };
    memcpy(v.shape, t->shape, sizeof v.shape);
    *out = v;
    return QCAL_OK;
}

qcal_status qcal_tensor_mut_numel(const qcal_tensor_mut *t, int64_t *numel)
{
    if (!t || !numel)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor or output is NULL");
    qcal_tensor v;
    qcal_tensor_mut_view(t, &v);
    return qcal_tensor_numel(&v, numel);
}

qcal_status qcal_tensor_numel(const qcal_tensor *t, int64_t *numel)
{
    if (!t || !numel)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor or output is NULL");
    if (t->ndim < 0 || t->ndim > QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor has %d dimensions; 0..%d supported",
                          (int)t->ndim, QCAL_MAX_DIMS);
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return qcal_error(QCAL_ERR_INVALID_ARG, "dimension %d has negative size %lld",
                              (int)i, (long long)t->shape[i]);
        if (!qcal_mul_i64(n, t->shape[i], &n))
            return qcal_error(QCAL_ERR_OVERFLOW, "tensor element count overflows int64");
    }
    /* Keep byte counts representable too. */
    if ((uint64_t)n > (uint64_t)(SIZE_MAX / sizeof(float)) || n > INT64_MAX / 4)
        return qcal_error(QCAL_ERR_OVERFLOW, "tensor of %lld elements is too large", (long long)n);
    *numel = n;
    return QCAL_OK;
}

qcal_status qcal_tensor_axis(const qcal_tensor *t, int32_t axis, int32_t *out)
{
    if (!t || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor or output is NULL");
    int32_t a = axis < 0 ? axis + t->ndim : axis;
    if (a < 0 || a >= t->ndim)
        return qcal_error(QCAL_ERR_INVALID_ARG, "axis %d is out of range for a %d-D tensor",
                          (int)axis, (int)t->ndim);
    *out = a;
    return QCAL_OK;
}
