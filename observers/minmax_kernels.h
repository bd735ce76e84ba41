/* Threaded min/max over float32 that skips and counts non-finite values (internal; shared
 * by the min/max observers, the histogram family, fake-quant and the numeric suite).
 *
 * The per-thread work is the min/max kernel family (observers/minmax_dsp.h: contract, C
 * reference, AVX2 / AVX-512 versions chosen through qcal_minmax_dsp_get()); these entry
 * points use OpenMP above qcal_threads_for(n), combining per-thread partials in a fixed
 * order, so results do not depend on the ISA or the thread count (the sign of a zero
 * result aside, see minmax_dsp.h). */
#ifndef QCAL_OBSERVERS_MINMAX_KERNELS_H
#define QCAL_OBSERVERS_MINMAX_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/minmax_dsp.h"

/* Min and max of the finite values of x[0..n) into *mn / *mx ((+inf, -inf) if none), the
 * number of non-finite values into *nonfinite. n >= 0; x may be NULL when n == 0. */
void qcal_f32_minmax(const float *x, int64_t n, float *mn, float *mx, uint64_t *nonfinite);

/* Per-channel min/max of x viewed as (outer, channels, inner), C-contiguous: mn[c] / mx[c]
 * over the finite values of channel c ((+inf, -inf) for a channel with none); *nonfinite
 * gets the total number of non-finite values. Covers axis 0 ((1, C, inner): row
 * reductions), a middle axis ((N, C, H*W)) and the last axis ((outer, C, 1): column-wise).
 * Returns false only if scratch memory could not be allocated (outputs then untouched). */
bool qcal_f32_minmax_channels(const float *x, int64_t outer, int64_t channels, int64_t inner,
                              float *mn, float *mx, uint64_t *nonfinite);

/* ---- Shared by the four min/max observer kinds (observers/<kind>.c) ---------------- */
#include "core/internal.h"
#include "qcal/observer.h"

/* One batch of a per-tensor min/max observer: min/max of the finite values of x (numel n),
 * non-finite count into *nonfinite; QCAL_ERR_NONFINITE (message with the count) when the
 * observer's policy is QCAL_NONFINITE_ERROR and the batch has any. */
qcal_status qcal_minmax_batch(const qcal_observer *obs, const qcal_tensor *x, int64_t n,
                              float *mn, float *mx, uint64_t *nonfinite);

/* One batch of a per-channel observer along obs->cfg.axis: allocates *mn / *mx (channels
 * entries, free() them) with each channel's finite min/max ((+inf, -inf) for a channel
 * without finite values). expect_channels > 0 demands that channel count
 * (QCAL_ERR_MISMATCH otherwise). Nothing is allocated on failure. */
qcal_status qcal_minmax_channels_batch(const qcal_observer *obs, const qcal_tensor *x,
                                       int64_t expect_channels, float **mn, float **mx,
                                       int64_t *channels, uint64_t *nonfinite);

/* One moving-average step avg + c * (now - avg) in float32 as PyTorch (finite always). */
float qcal_minmax_ema(float avg, float now, float c);

/* Validates a stored range pair: (+inf, -inf) or finite with min <= max. */
bool qcal_minmax_pair_valid(float mn, float mx);

/* v, with a zero of either sign as +0. -0 and +0 compare equal, so which one a min/max
 * pass returns depends on the order it meets them (element order, threads, batches);
 * every range the min/max kinds keep goes through this, so a range is a function of the
 * multiset of values and states and digests do not depend on that order. */
static inline float qcal_minmax_zero(float v)
{
    return v == 0.0f ? 0.0f : v;
}

/* Per-channel state shared by the two per-channel kinds. */
typedef struct qcal_pc_state {
    int64_t channels;   /* 0 until the first batch */
    float *mn, *mx;     /* channels entries each */
} qcal_pc_state;

qcal_status qcal_pc_state_init(qcal_observer *obs);
void qcal_pc_state_fini(qcal_observer *obs);
void qcal_pc_state_reset(qcal_observer *obs);
qcal_status qcal_pc_state_channels(const qcal_observer *obs, int64_t *n);
qcal_status qcal_pc_state_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                int64_t *n);
qcal_status qcal_pc_state_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                 int64_t *n);
void qcal_pc_state_save(const qcal_observer *obs, qcal_buf *b);
qcal_status qcal_pc_state_load(qcal_observer *obs, qcal_cursor *c);
/* Gives the state its first channel arrays (takes ownership of mn/mx). */
void qcal_pc_state_adopt(qcal_observer *obs, float *mn, float *mx, int64_t channels);
/* Copies src's arrays into an empty dst. */
qcal_status qcal_pc_state_copy(qcal_observer *dst, const qcal_observer *src);

#endif
