/* qcal .npy files: NumPy's array format (versions 1.0, 2.0 and 3.0 of the header).
 *
 *   qcal_npy_array a;
 *   if (qcal_npy_read_f32("x.npy", &a) == QCAL_OK) { ... a.data, a.shape ...; }
 *   qcal_npy_array_free(&a);
 *
 * Read: little-endian (or byte-order-free) float32, float64, float16, uint8, int8, int32,
 * int64 and bool, C order, up to QCAL_MAX_DIMS dimensions; 0-d arrays (shape ()) hold one element,
 * 0-element arrays are returned with data == NULL. The header must be a Python dict literal
 * with exactly the keys 'descr', 'fortran_order' and 'shape' (as numpy.lib.format checks).
 * Errors name the file (or "<memory>") and the problem: bad magic or version, truncated
 * header or data, malformed dict, missing/duplicate/extra keys -> QCAL_ERR_FORMAT; Fortran
 * order, big-endian, complex/object/string/structured dtypes, more than 8 dimensions ->
 * QCAL_ERR_UNSUPPORTED; shape products that overflow -> QCAL_ERR_OVERFLOW.
 * Trailing bytes after the data are rejected (QCAL_ERR_FORMAT): numpy ignores them, but a
 * longer file than its header says is a sign of corruption or a concatenation mistake.
 * Write: version 1.0 header padded to 64 bytes exactly as numpy writes it, through
 * include/qcal/atomic_file.h (a file: a temporary renamed over the destination, a failed
 * write leaves no partial file; a device, FIFO or descriptor: in place). */
#ifndef QCAL_NPY_H
#define QCAL_NPY_H

#include <stdio.h>

#include "qcal/common.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_npy_dtype {
    QCAL_NPY_F32 = 0,   /* '<f4' */
    QCAL_NPY_F64 = 1,   /* '<f8' */
    QCAL_NPY_F16 = 2,   /* '<f2' */
    QCAL_NPY_U8 = 3,    /* '|u1' */
    QCAL_NPY_I8 = 4,    /* '|i1' */
    QCAL_NPY_I32 = 5,   /* '<i4' */
    QCAL_NPY_I64 = 6,   /* '<i8' */
    QCAL_NPY_BOOL = 7,  /* '|b1' (one byte per element, 0 or 1 as numpy writes it) */
    QCAL_NPY_DTYPE_COUNT = 8
} qcal_npy_dtype;

typedef struct qcal_npy_array {
    qcal_npy_dtype dtype;           /* element type as stored in data */
    int32_t ndim;                   /* 0..QCAL_MAX_DIMS */
    int64_t shape[QCAL_MAX_DIMS];   /* entries past ndim are 0 */
    int64_t numel;                  /* product of shape (1 for ndim 0) */
    void *data;                     /* owned, 64-byte aligned; NULL when numel == 0 */
    size_t nbytes;                  /* numel * element size */
} qcal_npy_array;

/* Size in bytes of one element of dtype (0 for an invalid dtype). */
QCAL_API size_t qcal_npy_dtype_size(qcal_npy_dtype dtype);

/* numpy name of dtype ("float32", "uint8", "bool", ...), or "unknown". */
QCAL_API const char *qcal_npy_dtype_name(qcal_npy_dtype dtype);

/* Reads path into *out with the file's dtype (one read into an aligned buffer). *out is
 * owned by the caller: release with qcal_npy_array_free. Untouched on failure. */
QCAL_API qcal_status qcal_npy_read(const char *path, qcal_npy_array *out);

/* As qcal_npy_read, then converts float64/float16 to float32 (float64 rounds to nearest;
 * values beyond float range become +-inf). Integer files are QCAL_ERR_MISMATCH. */
QCAL_API qcal_status qcal_npy_read_f32(const char *path, qcal_npy_array *out);

/* Parses a whole .npy file held in memory (buf, len); copies the data into *out. Same
 * checks and messages as qcal_npy_read, with the name "<memory>". */
QCAL_API qcal_status qcal_npy_parse(const void *buf, size_t len, qcal_npy_array *out);

/* Converts arr in place to float32 (float64/float16 -> float32; float32 unchanged).
 * Integer arrays are QCAL_ERR_MISMATCH; arr is unchanged on failure. */
QCAL_API qcal_status qcal_npy_to_f32(qcal_npy_array *arr);

/* Views a float32 array as a qcal_tensor (no copy; t borrows arr->data). */
QCAL_API qcal_status qcal_npy_as_tensor(const qcal_npy_array *arr, qcal_tensor *t);

/* Writes data (C order, numel elements of dtype; may be NULL if numel is 0) to path
 * atomically. Any dtype above; ndim 0..QCAL_MAX_DIMS. */
QCAL_API qcal_status qcal_npy_write(const char *path, qcal_npy_dtype dtype, int32_t ndim,
                                    const int64_t *shape, const void *data);

/* The same .npy bytes written to an open stream (e.g. a qcal_atomic_file's fp, to stage
 * several outputs); name (NULL: "<stream>") is for messages. fp is not flushed or closed. */
QCAL_API qcal_status qcal_npy_fwrite(FILE *fp, const char *name, qcal_npy_dtype dtype,
                                     int32_t ndim, const int64_t *shape, const void *data);

/* Streaming reads: the header is checked when the file is opened (the checks and messages
 * of qcal_npy_read, data size against file size included), then the data comes in pieces
 * of the caller's size through the caller's buffer, so memory does not grow with the file:
 *
 *   qcal_npy_reader *r = NULL;
 *   qcal_npy_reader_open("x.npy", &r);
 *   while (qcal_npy_reader_read_f32(r, buf, cap, &n) == QCAL_OK && n > 0) { ... }
 *   qcal_npy_reader_close(&r);
 *
 * A file that shrinks while it is read is QCAL_ERR_IO ("file shrank while reading"). */
typedef struct qcal_npy_reader qcal_npy_reader;

/* Opens path and checks its header; *out owned by the caller (qcal_npy_reader_close). */
QCAL_API qcal_status qcal_npy_reader_open(const char *path, qcal_npy_reader **out);

/* The file's dtype, shape, numel and nbytes in *info (info->data is NULL; nothing to free). */
QCAL_API qcal_status qcal_npy_reader_info(const qcal_npy_reader *r, qcal_npy_array *info);

/* Reads the next min(cap, remaining) elements into dst as float32 (float32 files straight
 * into dst, float64/float16 through a 256 KiB scratch, converted as qcal_npy_read_f32 does);
 * *n gets the count, 0 once every element was read. Integer files: QCAL_ERR_MISMATCH. */
QCAL_API qcal_status qcal_npy_reader_read_f32(qcal_npy_reader *r, float *dst, int64_t cap,
                                              int64_t *n);

/* Closes *r (NULL is fine) and sets *r to NULL. */
QCAL_API void qcal_npy_reader_close(qcal_npy_reader **r);

/* Frees arr->data and zeroes *arr (NULL or an already freed array is fine). */
QCAL_API void qcal_npy_array_free(qcal_npy_array *arr);

#ifdef __cplusplus
}
#endif
#endif
