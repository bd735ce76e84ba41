/* Internal contract of the fake-quant module: the element kernels (C reference and ISA
 * versions, chosen at run time) and the argument checks shared by fakequant.c,
 * learnable.c and fake_quantize.c. Not installed. */
#ifndef QCAL_FAKEQUANT_IMPL_H
#define QCAL_FAKEQUANT_IMPL_H

#include <stdbool.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "fakequant/fakequant_dsp.h"
#include "qcal/fakequant.h"

/* Checks quant_min/quant_max (ordered, within +-QCAL_FAKEQUANT_QRANGE_LIMIT). */
qcal_status qcal_fq_check_range(int64_t quant_min, int64_t quant_max);
/* Checks one scale (> 0, finite) and integer zero-point (in range); `what` names the
 * channel in messages (-1 for per-tensor). */
qcal_status qcal_fq_check_qparams(float scale, int64_t zero_point, int64_t quant_min,
                                  int64_t quant_max, int64_t channel);
/* Fills a run descriptor. */
void qcal_fq_run_init(qcal_fq_run *r, float scale, int64_t zero_point, int64_t quant_min,
                      int64_t quant_max);

/* Splits a tensor around axis: outer * channels * inner == numel. Validates the tensor
 * (data non-NULL, numel > 0) and the axis. */
qcal_status qcal_fq_split(const qcal_tensor *t, int32_t axis, int64_t *outer,
                          int64_t *channels, int64_t *inner);

/* Checks the arguments of a public fake-quant call: src (non-empty, data), qp (validated;
 * learnable: float zero-points, else integer ones in range), the +-2^24 range limit, and
 * per-channel qp->channels == src->shape[qp->axis]. *n gets numel(src). */
qcal_status qcal_fq_check_args(const char *what, const qcal_tensor *src, const qcal_qparams *qp,
                               bool learnable, int64_t *n);
/* Checks an output (or second input) tensor view: non-NULL, n elements, data set. */
qcal_status qcal_fq_check_out(const char *what, const qcal_tensor *t, int64_t n,
                              const char *name);
/* The same for a writable view (an output). */
qcal_status qcal_fq_check_dst(const char *what, const qcal_tensor_mut *t, int64_t n,
                              const char *name);

/* Learnable: rounds a float zero-point as the forward does (nearbyintf, clamp). NaN/Inf
 * zero-points are rejected by the callers first. */
int64_t qcal_fq_round_zero_point(float zero_point, int64_t quant_min, int64_t quant_max);

#endif
