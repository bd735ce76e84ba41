/* Internal .npz access for the dataset (io/dataset.c): an archive opened with its member
 * headers checked, whose array data is then read by byte range. Not installed. */
#ifndef QCAL_IO_NPZ_INTERNAL_H
#define QCAL_IO_NPZ_INTERNAL_H

#include <stdint.h>

#include "qcal/npy.h"

typedef struct qcal_npz_member {
    char *name;            /* member name without ".npy" */
    uint16_t method;       /* 0 stored, 8 deflated */
    uint32_t crc;
    uint64_t csize, usize; /* compressed / uncompressed sizes (central directory) */
    uint64_t data_off;     /* offset of the member's (compressed) bytes in the archive */
    uint64_t npy_off;      /* offset of the array data inside the uncompressed member */
    qcal_npy_array info;   /* dtype, ndim, shape, numel, nbytes (data NULL) */
    void *cache;           /* deflated members: the inflated array data once read */
} qcal_npz_member;

typedef struct qcal_npz qcal_npz;

/* Opens path and reads its central directory and every member's .npy header (not the
 * data); *out owned by the caller (qcal_npz_close_internal). Errors of qcal_npz_read. */
qcal_status qcal_npz_open_internal(const char *path, qcal_npz **out);

/* Members of z (*n of them; valid until close). */
const qcal_npz_member *qcal_npz_members(const qcal_npz *z, int64_t *n);

/* Bytes [off, off + n) of member i's array data into dst. Stored members: read from the
 * file at their offset; deflated ones: the member is inflated once (CRC checked) and kept
 * until close, so consecutive parts cost one inflation. */
qcal_status qcal_npz_member_read(qcal_npz *z, int64_t i, uint64_t off, size_t n, void *dst);

/* Closes *z (NULL is fine), frees its caches and sets *z to NULL. */
void qcal_npz_close_internal(qcal_npz **z);

/* ONNX element type of a .npy dtype (0 for none). */
int32_t qcal_npy_dtype_onnx(qcal_npy_dtype dtype);

#endif
