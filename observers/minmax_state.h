/* Observer-side skeletons shared by the min/max kinds, so that each kind only states how a
 * batch's (or a merged observer's) range folds into its state: the per-tensor state of
 * minmax and moving_average_minmax (defined in observers/minmax.c) and the update/merge
 * of the two per-channel kinds (defined in observers/per_channel_minmax.c, next to the
 * rest of qcal_pc_state). Not installed. */
#ifndef QCAL_OBSERVERS_MINMAX_STATE_H
#define QCAL_OBSERVERS_MINMAX_STATE_H

#include "observers/minmax_kernels.h"
#include "observers/observer_impl.h"

/* ---- per tensor ---- */

typedef struct qcal_pt_state {
    float mn, mx;   /* (+inf, -inf) until a finite value is seen */
} qcal_pt_state;

/* Folds a range (lo, hi) into s: a batch's finite min/max, or a merged observer's state;
 * (+inf, -inf) means "no finite value". c is the observer's averaging_constant. */
typedef void (*qcal_pt_fold_fn)(qcal_pt_state *s, float lo, float hi, float c);

qcal_status qcal_pt_state_init(qcal_observer *obs);
void qcal_pt_state_fini(qcal_observer *obs);
/* qcal_minmax_batch on x, then fold (state unchanged on failure). */
qcal_status qcal_pt_state_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                                 uint64_t *nonfinite, qcal_pt_fold_fn fold);
/* Folds src's state into dst's. */
void qcal_pt_state_merge(qcal_observer *dst, const qcal_observer *src, qcal_pt_fold_fn fold);
qcal_status qcal_pt_state_channels(const qcal_observer *obs, int64_t *n);
qcal_status qcal_pt_state_range(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                int64_t *n);
qcal_status qcal_pt_state_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                 int64_t *n);
void qcal_pt_state_reset(qcal_observer *obs);
void qcal_pt_state_save(const qcal_observer *obs, qcal_buf *b);
qcal_status qcal_pt_state_load(qcal_observer *obs, qcal_cursor *c);

/* ---- per channel (qcal_pc_state, observers/minmax_kernels.h) ---- */

/* Folds per-channel ranges lo/hi[0..s->channels) into s (same channel count); c is the
 * observer's averaging_constant. */
typedef void (*qcal_pc_fold_fn)(qcal_pc_state *s, const float *lo, const float *hi, float c);

/* qcal_minmax_channels_batch on x; the first batch is adopted as is, later ones folded. */
qcal_status qcal_pc_state_update(qcal_observer *obs, const qcal_tensor *x,
                                 uint64_t *nonfinite, qcal_pc_fold_fn fold);
/* Nothing to do when src has no data; a copy when dst has none; otherwise the channel
 * counts must agree (QCAL_ERR_MISMATCH) and src's state is folded into dst's. */
qcal_status qcal_pc_state_merge(qcal_observer *dst, const qcal_observer *src,
                                qcal_pc_fold_fn fold);

#endif
