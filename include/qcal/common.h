/* qcal: shared definitions for every public header (export macro, status codes). */
#ifndef QCAL_COMMON_H
#define QCAL_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(QCAL_BUILDING_LIBRARY) && defined(__GNUC__)
#define QCAL_API __attribute__((visibility("default")))
#else
#define QCAL_API
#endif

/* Marks a public name kept for one release after a rename (qcal/deprecated.h,
 * docs/architecture.md "Naming"): using it warns with the new name. */
#if defined(__GNUC__) || defined(__clang__)
#define QCAL_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define QCAL_DEPRECATED(msg)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Every public function returns a qcal_status. QCAL_OK is 0; positive values are
 * successes that carry a note the caller may act on; negative values are failures
 * (outputs untouched, a detailed message in qcal_last_error()). */
typedef enum qcal_status {
    QCAL_OK = 0,
    QCAL_NO_DATA = 1,              /* observer (or one of its channels) saw no finite value:
                                    * those qparams are scale 1, zero-point 0 */
    QCAL_ERR_INVALID_ARG = -1,     /* an argument or option is impossible (NULL, out of range, ...) */
    QCAL_ERR_NO_MEMORY = -2,       /* an allocation failed */
    QCAL_ERR_IO = -3,              /* a file could not be opened, read, written or renamed */
    QCAL_ERR_FORMAT = -4,          /* a file or buffer is malformed or truncated */
    QCAL_ERR_UNSUPPORTED = -5,     /* well-formed but not supported (dtype, byte order, ...) */
    QCAL_ERR_NONFINITE = -6,       /* NaN/Inf seen while the policy says it is an error */
    QCAL_ERR_MISMATCH = -7,        /* shapes, kinds or configs do not agree */
    QCAL_ERR_OVERFLOW = -8,        /* a size computation would overflow */
    QCAL_ERR_BACKEND = -9,         /* oneDNN or ONNX Runtime reported a failure */
    QCAL_ERR_STATE = -10,          /* the object is not in a state that allows the call */
    QCAL_ERR_NOT_FOUND = -11,      /* a named item (tensor, layer, file) does not exist */
    QCAL_ERR_EMPTY = -12,          /* a tensor has zero elements where data is required */
} qcal_status;

/* Short fixed name of a status ("ok", "invalid argument", ...); never NULL. */
QCAL_API const char *qcal_status_str(qcal_status status);

/* Detailed message of the last failure on the calling thread ("" if none). Valid until
 * the next failing qcal call on this thread. */
QCAL_API const char *qcal_last_error(void);

/* Clears the calling thread's last error message. */
QCAL_API void qcal_clear_error(void);

/* Records a printf-formatted message as the calling thread's qcal_last_error() and returns
 * status, so code built on qcal can report its own failures through the same channel
 * (`return qcal_set_error(QCAL_ERR_IO, "cannot open '%s'", path);`). The arguments may
 * include qcal_last_error() itself (the message is formatted before it is stored). */
QCAL_API qcal_status qcal_set_error(qcal_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Progress of a long library call, set in an options struct: `done` of `total` items
 * finished, `item` the name of the last one (may be NULL). Called on the calling thread
 * between items; the library never prints. */
typedef void (*qcal_progress_fn)(void *user, int64_t done, int64_t total, const char *item);

/* Version string of the library ("0.1.0"). */
QCAL_API const char *qcal_version(void);

/* Frees memory that a qcal function allocated and handed to the caller (NULL is fine). */
QCAL_API void qcal_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
