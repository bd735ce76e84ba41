/* The contract between the generic observer object (observers/observer.c) and each
 * observer kind (observers/<kind>.c). Not installed. */
#ifndef QCAL_OBSERVERS_OBSERVER_IMPL_H
#define QCAL_OBSERVERS_OBSERVER_IMPL_H

#include "core/internal.h"
#include "observers/observer_state.h"
#include "qcal/observer.h"

typedef struct qcal_observer_ops {
    qcal_observer_kind kind;
    /* Allocates obs->impl for obs->cfg (already validated); "no data" state. */
    qcal_status (*init)(qcal_observer *obs);
    /* Frees obs->impl; must cope with a half-built impl or NULL. */
    void (*fini)(qcal_observer *obs);
    /* Feeds x (numel > 0 elements, validated). Counts non-finite values into *nonfinite.
     * If *nonfinite > 0 and obs->cfg.nonfinite == QCAL_NONFINITE_ERROR it must return
     * QCAL_ERR_NONFINITE and leave the state unchanged; on any failure the state is
     * unchanged. */
    qcal_status (*update)(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                          uint64_t *nonfinite);
    qcal_status (*channels)(const qcal_observer *obs, int64_t *n);
    /* See qcal_observer_data_range / qcal_observer_qrange; cap already checked >= 1
     * but the kind checks cap against its channel count. */
    qcal_status (*data_range)(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                              int64_t *n);
    qcal_status (*qrange)(const qcal_observer *obs, int64_t cap, float *mn, float *mx, int64_t *n);
    /* Back to the "no data" state. */
    void (*reset)(qcal_observer *obs);
    /* dst and src have the same kind and an equal config (checked by the caller). */
    qcal_status (*merge)(qcal_observer *dst, const qcal_observer *src);
    /* Appends / reads the kind's state (little-endian); load validates everything.
     * Canonical payloads (for state digests, helper `state`): for every kind except the
     * moving averages and the first-batch histogram grid, save writes a function of the
     * multiset of finite values seen, so equal data give equal bytes whatever the batch
     * order, sizes or merge split. Histogram kinds on the lattice grid
     * (observers/histogram_lattice.h, qcal_lattice_save): i32 e, i64 jmin, u32 ncells,
     * f32 dmin, f32 dmax (-0 stored as +0), u64 total, u64 counts[ncells] of the cells
     * jmin..jmax (empty: 0, 0, 0, +inf, -inf, 0). The batch counter lives outside the
     * payload (observer.c); the non-finite count, also outside, is order-independent. */
    void (*save)(const qcal_observer *obs, qcal_buf *b);
    qcal_status (*load)(qcal_observer *obs, qcal_cursor *c);
} qcal_observer_ops;

struct qcal_observer {
    qcal_observer_config cfg;
    const qcal_observer_ops *ops;
    uint64_t nonfinite;   /* values skipped since create/reset */
    uint64_t batches;     /* successful updates since create/reset */
    void *impl;           /* kind state */
};

/* One ops table per kind, defined in observers/<kind>.c. */
extern const qcal_observer_ops qcal_observer_minmax_ops;
extern const qcal_observer_ops qcal_observer_moving_average_minmax_ops;
extern const qcal_observer_ops qcal_observer_per_channel_minmax_ops;
extern const qcal_observer_ops qcal_observer_moving_average_per_channel_minmax_ops;
extern const qcal_observer_ops qcal_observer_histogram_ops;
extern const qcal_observer_ops qcal_observer_percentile_ops;
extern const qcal_observer_ops qcal_observer_entropy_ops;
extern const qcal_observer_ops qcal_observer_mse_ops;

/* True when the config's target is asymmetric (an affine qscheme with an integer dtype):
 * entropy, mse and percentile (mode auto) then keep a histogram of x and search both ends
 * (observers/histogram_kinds.c); otherwise |x| and the symmetric searches. */
bool qcal_histobs_config_asymmetric(const qcal_observer_config *cfg);

/* Fills mn/mx[0..n) with the "no data" range (+inf, -inf). */
void qcal_range_set_empty(float *mn, float *mx, int64_t n);

#endif
