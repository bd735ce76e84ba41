/* Internal helpers shared by every qcal module: error reporting, checked size
 * arithmetic, allocation. Not installed. */
#ifndef QCAL_CORE_INTERNAL_H
#define QCAL_CORE_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>

#include "qcal/common.h"

#if defined(__GNUC__)
#define QCAL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define QCAL_PRINTF(a, b)
#endif

/* Records a formatted message for the calling thread and returns status, so callers can
 * write `return qcal_error(QCAL_ERR_IO, "cannot open '%s': %s", path, strerror(errno));`. */
/* Exported (QCAL_API) for libqcal_mpi, the companion library built from this tree; not
 * part of the public API. */
QCAL_API qcal_status qcal_error(qcal_status status, const char *fmt, ...) QCAL_PRINTF(2, 3);

/* qcal_error(st, "<fmt>: <previous last error>"): wraps the cause a callee reported with
 * the caller's context (prefix cut at 511 bytes, cause at 1023). */
qcal_status qcal_error_wrap(qcal_status st, const char *fmt, ...) QCAL_PRINTF(2, 3);

/* Overflow-checked arithmetic on non-negative sizes: true on success. */
static inline bool qcal_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool qcal_add_i64(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline bool qcal_mul_size(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* malloc/calloc wrappers that report QCAL_ERR_NO_MEMORY with the size in the message. */
void *qcal_malloc(size_t bytes);
void *qcal_calloc(size_t count, size_t size);

/* A malloc'ed copy of the string s (free with free()), through qcal_malloc: NULL with
 * QCAL_ERR_NO_MEMORY recorded when out of memory. */
char *qcal_strdup(const char *s);
/* The same for the n bytes at s (not necessarily NUL-terminated), NUL added. */
char *qcal_strndup(const char *s, size_t n);

/* Byte buffer used by the serialisers (observer state, tables). */
typedef struct qcal_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;   /* sticky: an append failed for lack of memory */
} qcal_buf;

void qcal_buf_append(qcal_buf *b, const void *src, size_t n);
void qcal_buf_u32(qcal_buf *b, uint32_t v);
void qcal_buf_u64(qcal_buf *b, uint64_t v);
void qcal_buf_f32(qcal_buf *b, float v);
void qcal_buf_f64(qcal_buf *b, double v);
void qcal_buf_free(qcal_buf *b);

/* Cursor over a read-only buffer; every read fails (returns false) once past the end. */
typedef struct qcal_cursor {
    const uint8_t *p;
    size_t left;
} qcal_cursor;

bool qcal_cur_read(qcal_cursor *c, void *dst, size_t n);
bool qcal_cur_u32(qcal_cursor *c, uint32_t *v);
bool qcal_cur_u64(qcal_cursor *c, uint64_t *v);
bool qcal_cur_f32(qcal_cursor *c, float *v);
bool qcal_cur_f64(qcal_cursor *c, double *v);

#endif
