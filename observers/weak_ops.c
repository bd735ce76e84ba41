/* TEMPORARY (development scaffolding, removed before the core issue closes): weak
 * definitions so the library links while observer kinds are being written. */
#include "observers/observer_impl.h"

static qcal_status missing_init(qcal_observer *obs)
{
    return qcal_error(QCAL_ERR_UNSUPPORTED, "observer %s is not built yet",
                      qcal_observer_kind_name(obs->cfg.kind));
}
#define WEAK_OPS(name) \
    __attribute__((weak)) const qcal_observer_ops name = { .init = missing_init };
WEAK_OPS(qcal_observer_minmax_ops)
WEAK_OPS(qcal_observer_moving_average_minmax_ops)
WEAK_OPS(qcal_observer_per_channel_minmax_ops)
WEAK_OPS(qcal_observer_moving_average_per_channel_minmax_ops)
WEAK_OPS(qcal_observer_histogram_ops)
WEAK_OPS(qcal_observer_percentile_ops)
WEAK_OPS(qcal_observer_entropy_ops)
WEAK_OPS(qcal_observer_mse_ops)
