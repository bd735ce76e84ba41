/* qcal min/max observer kinds: algorithms, defaults, update rules and merge semantics.
 * All four are used through the generic API in qcal/observer.h; this header documents
 * them and adds nothing to link against.
 *
 * Common to the four kinds
 *   - Non-finite values (NaN, +-Inf) never enter a range. QCAL_NONFINITE_SKIP (default)
 *     skips and counts them (qcal_observer_nonfinite); QCAL_NONFINITE_ERROR fails the
 *     update with QCAL_ERR_NONFINITE and leaves the observer unchanged.
 *   - An empty tensor is QCAL_ERR_EMPTY. No data: data_range gives (+inf, -inf) and
 *     qparams give scale 1, zero-point 0, both with QCAL_NO_DATA (as PyTorch).
 *   - qparams: qcal_qparams_compute (PyTorch 1.13's _calculate_qparams, float32, bit for bit).
 *   - save/load: the running min/max (per channel) as float32, validated on load.
 *   - A zero bound is +0 whatever the sign of the zeros seen (-0 == +0, and which one a
 *     pass meets first would otherwise make the range and the state digest order-dependent).
 *
 * "minmax" (QCAL_OBSERVER_MINMAX; PyTorch MinMaxObserver)
 *   Default qconfig: quint8, per_tensor_affine. Update: min = min(min, min(x)),
 *   max = max(max, max(x)). Exact: merge is exact, independent of batch order/splitting.
 *
 * "moving_average_minmax" (QCAL_OBSERVER_MOVING_AVERAGE_MINMAX; PyTorch
 *   MovingAverageMinMaxObserver). Default qconfig: quint8, per_tensor_affine;
 *   averaging_constant c = 0.01, in (0, 1]. First batch with a finite value: min = min(x);
 *   later: min = min + c * (min(x) - min) in float32 (PyTorch's arithmetic; if that
 *   overflows float32 it is redone in double so the state stays finite). A batch without
 *   finite values does not move the averages. The result depends on batch order by
 *   definition (not on the multiset of values). Merge: exact (a copy) when either side is
 *   empty; merging two observers that both saw data is refused (QCAL_ERR_UNSUPPORTED).
 *
 * "per_channel_minmax" (QCAL_OBSERVER_PER_CHANNEL_MINMAX; PyTorch PerChannelMinMaxObserver)
 *   Default qconfig: quint8, per_channel_affine; axis 0 (negative counts from the end).
 *   The first batch fixes the channel count (shape[axis]); a batch with another count is
 *   QCAL_ERR_MISMATCH and changes nothing. Per channel as "minmax". A channel all of whose
 *   values in a batch are non-finite does not move; one that never saw a finite value
 *   stays (+inf, -inf) and gets scale 1, zero-point 0 with QCAL_NO_DATA from qparams.
 *   Merge: exact; channel counts must agree (or one side be empty).
 *
 * "moving_average_per_channel_minmax" (QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
 *   PyTorch MovingAveragePerChannelMinMaxObserver). As per_channel_minmax for axis and
 *   channels, with the moving-average update per channel. A channel without data is
 *   initialised by its first finite batch (PyTorch would produce NaN there). Depends on
 *   batch order; merge as moving_average_minmax (refused unless one side is empty).
 *
 * Speed: one pass over the data (AVX2 / AVX-512 with OpenMP above the threading threshold);
 * per-channel reductions for axis 0, a middle axis and the last axis without transposing. */
#ifndef QCAL_OBSERVERS_MINMAX_H
#define QCAL_OBSERVERS_MINMAX_H

#include "qcal/observer.h"

#endif
