/* Internal contract between the calibration session (calib/session.c), the table object
 * (calib/table.c) and its text formats (calib/table_formats.c). Not installed. */
#ifndef QCAL_CALIB_CALIB_INTERNAL_H
#define QCAL_CALIB_CALIB_INTERNAL_H

#include "core/internal.h"
#include "qcal/calib.h"

struct qcal_calib_table {
    int64_t n, cap;
    qcal_calib_entry *e;   /* each entry owns its fqn and arrays (calib_entry_free) */
};

/* Creates an empty table. */
qcal_status qcal_calib_table_new(qcal_calib_table **out);

/* Allocates the fqn copy and the arrays of e for `channels` channels (zeroed); on failure
 * e is left freeable. */
qcal_status qcal_calib_entry_alloc(qcal_calib_entry *e, const char *fqn, int64_t channels);

/* Frees what qcal_calib_entry_alloc allocated. */
void qcal_calib_entry_free(qcal_calib_entry *e);

/* Moves *e (allocated by qcal_calib_entry_alloc) into t; on failure e is freed. */
qcal_status qcal_calib_table_push(qcal_calib_table *t, qcal_calib_entry *e);

/* Sorts by (fqn bytes, role) and rejects duplicates (QCAL_ERR_FORMAT). */
qcal_status qcal_calib_table_sort(qcal_calib_table *t);

/* Shortest "%.*g" that reads back as exactly v (finite float32) through strtof and through
 * strtod followed by a float conversion. */
void qcal_calib_fmt_f32(char *dst, size_t cap, float v);

/* qcal_error(st, "<fmt>: <previous last error>"), safe although the previous message lives
 * in the buffer being rewritten. */
qcal_status qcal_calib_wrap_error(qcal_status st, const char *fmt, ...) QCAL_PRINTF(2, 3);

/* Reads the whole file at path into *buf (malloc'ed, free() it; not NUL-terminated) and
 * *len, growing from first_cap bytes; refuses files over max bytes (QCAL_ERR_FORMAT).
 * Messages name the file as "<what> '<path>'" (what: "rules file", ...). */
qcal_status qcal_calib_read_file(const char *path, const char *what, size_t max,
                                 size_t first_cap, char **buf, size_t *len);

/* Deep copy of a rule list (sessions keep their own). */
qcal_status qcal_calib_rules_clone(const qcal_calib_rules *src, qcal_calib_rules **dst);

#endif
