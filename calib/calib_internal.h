/* Internal contract between the calibration session (calib/session.c), the table object
 * (calib/table.c) and its text formats (calib/table_formats.c). Not installed. */
#ifndef QCAL_CALIB_CALIB_INTERNAL_H
#define QCAL_CALIB_CALIB_INTERNAL_H

#include "core/internal.h"
#include "qcal/calib.h"

struct qcal_calib_table {
    int64_t n, cap;
    char digest[65];       /* session digest (64 hex digits), "" when unknown */
    char profile[16];      /* deployment profile calibrated for ("ort", "tensorrt"), "" when
                            * not recorded; not covered by the digest */
    qcal_calib_entry *e;   /* each entry owns its fqn and arrays (calib_entry_free) */
};

/* Creates an empty table. */
qcal_status qcal_calib_table_new(qcal_calib_table **out);

/* Allocates the fqn copy and the arrays of e for `channels` channels (zeroed); on failure
 * e is left freeable. */
qcal_status qcal_calib_entry_alloc(qcal_calib_entry *e, const char *fqn, int64_t channels);

/* Writable views of an entry's storage (qcal_calib_entry_alloc; `channels` values each):
 * the range, and the scales / integer / float zero-points the JSON table stores for every
 * channel (per-tensor entries too). */
typedef struct qcal_calib_entry_arrays {
    float *min_val, *max_val, *scale, *zero_point_float;
    int32_t *zero_point;
} qcal_calib_entry_arrays;
void qcal_calib_entry_arrays_get(const qcal_calib_entry *e, qcal_calib_entry_arrays *a);

/* Once qparams.dtype/qscheme/axis/quant_min/quant_max and the stored values are set: a
 * per-channel qparams points at the storage (zero_points_float only for the float-qparams
 * scheme), a per-tensor one gets channel 0 as its scalars. */
void qcal_calib_entry_finish(qcal_calib_entry *e);

/* Frees what qcal_calib_entry_alloc allocated. */
void qcal_calib_entry_free(qcal_calib_entry *e);

/* Moves *e (allocated by qcal_calib_entry_alloc) into t; on failure e is freed. */
qcal_status qcal_calib_table_push(qcal_calib_table *t, qcal_calib_entry *e);

/* Sorts by (fqn bytes, role) and rejects duplicates (QCAL_ERR_FORMAT). */
qcal_status qcal_calib_table_sort(qcal_calib_table *t);

/* amax of an exported entry: max over channels of max(|min|, |max|), 0 -> 1 (the rule of
 * every export format, calib/table_formats.c and calib/format_onnxruntime.c). */
float qcal_calib_export_amax(const qcal_calib_entry *e);

/* File `part` (0 calibration.json, 1 calibration.flatbuffers, 2 calibration.cache) of ONNX
 * Runtime's write_calibration_table over the n entries e (sorted, with data), into b. */
qcal_status qcal_calib_format_onnxruntime(const qcal_calib_entry *const *e, int64_t n,
                                          int part, qcal_buf *b);

/* Deep copy of a rule list (sessions keep their own). */
qcal_status qcal_calib_rules_clone(const qcal_calib_rules *src, qcal_calib_rules **dst);

/* ---- Session internals that calib/session_state.c uses (it depends on session.c, never back) */

/* Called for each entry with its mutex held: the observer, its element count and the number
 * of batches still queued (waiting for earlier steps). Non-QCAL_OK stops the walk. */
typedef qcal_status (*qcal_calib_entry_fn)(void *ctx, const char *fqn, qcal_calib_role role,
                                           const qcal_observer *obs, uint64_t elements,
                                           uint64_t queued);

/* The session's table without its digest (qcal_calib_session_table adds it): every entry
 * flushed and snapshotted (range, qparams, counts), sorted; progress reported per entry. */
qcal_status qcal_calib_session_snapshot(qcal_calib_session *s, qcal_calib_table **out);

/* Visits every entry in (fqn bytes, role) order; returns fn's first failure. */
qcal_status qcal_calib_session_each(const qcal_calib_session *s, qcal_calib_entry_fn fn,
                                    void *ctx);

/* Adds (fqn, role) with obs (owned from now on, destroyed on failure) and its element count;
 * QCAL_ERR_INVALID_ARG if the session already has it. */
qcal_status qcal_calib_session_adopt(qcal_calib_session *s, const char *fqn, qcal_calib_role role,
                                     qcal_observer *obs, uint64_t elements);

/* Merges src into the entry (fqn, role), or adds a copy of src when there is none.
 * dry_run: only checks that the merge would succeed (configs, moving averages, channel
 * counts) and changes nothing. */
qcal_status qcal_calib_session_merge_entry(qcal_calib_session *s, const char *fqn,
                                           qcal_calib_role role, const qcal_observer *src,
                                           uint64_t elements, bool dry_run);

#endif
