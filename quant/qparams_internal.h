/* Internal qparams helpers shared by observers, calibration and fake-quant. Not installed. */
#ifndef QCAL_QUANT_QPARAMS_INTERNAL_H
#define QCAL_QUANT_QPARAMS_INTERNAL_H

#include "qcal/qparams.h"

/* The arithmetic behind qcal_qparams_compute into caller arrays (n pairs): zero_point gets
 * the integer zero-points (may be NULL for the float-qparams scheme), zero_point_float the
 * float ones (may be NULL for every other scheme). Same statuses as qcal_qparams_compute;
 * outputs untouched on failure. */
qcal_status qcal_qparams_compute_arrays(const qcal_qconfig *cfg, int64_t n,
                                        const float *min_val, const float *max_val,
                                        float *scale, int32_t *zero_point,
                                        float *zero_point_float);

/* Allocates library-owned arrays for a per-channel value of `channels` (scales 1, zero-points
 * 0, float zero-points 0) and returns writable pointers to them (any may be NULL if unwanted,
 * all three arrays are allocated). Per-tensor qschemes: no allocation, pointers set to the
 * scalars of *qp. Other fields set from the arguments. *qp is not freed first. */
qcal_status qcal_qparams_alloc(qcal_qparams *qp, qcal_dtype dtype, qcal_qscheme qscheme,
                               int32_t axis, int64_t quant_min, int64_t quant_max,
                               int64_t channels, float **scales, int32_t **zero_points,
                               float **zero_points_float);

/* qcal_qparams_validate with `what` prefixed to the message ("quantize: ...") and
 * need_float: the float zero-points are used (learnable); int_zp: the integer zero-points
 * are used and must lie in [quant_min, quant_max]. */
qcal_status qcal_qparams_check(const qcal_qparams *qp, const char *what, bool int_zp,
                               bool need_float);

#endif
