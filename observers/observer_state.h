/* The observer state format (docs/state.md) as building blocks for containers that embed
 * observer states (the session state, calib/session_state.c). Not installed. */
#ifndef QCAL_OBSERVERS_OBSERVER_STATE_H
#define QCAL_OBSERVERS_OBSERVER_STATE_H

#include "core/internal.h"
#include "qcal/observer.h"

/* Appends obs's state ("QCOB" version 2) to b; canonical: the batches field written as 0
 * (the bytes qcal_observer_digest hashes). QCAL_ERR_NO_MEMORY when b failed. */
qcal_status qcal_observer_state_append(const qcal_observer *obs, qcal_buf *b, bool canonical);

/* Reads one observer state at the cursor (advanced past it; bytes after it are the
 * caller's business) into a new observer. Errors: QCAL_ERR_FORMAT, QCAL_ERR_UNSUPPORTED
 * (version), QCAL_ERR_NO_MEMORY; *out untouched on failure. */
qcal_status qcal_observer_state_parse(qcal_cursor *cur, qcal_observer **out);

#endif
