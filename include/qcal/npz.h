/* qcal .npz archives (numpy.savez / savez_compressed): the arrays of an archive with their
 * ONNX element types, read whole or headers only. Datasets (qcal/dataset.h) read their
 * .npz batches through it. */
#ifndef QCAL_NPZ_H
#define QCAL_NPZ_H

#include "qcal/common.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One array of a .npz archive (the member "NAME.npy"; name without ".npy"). */
typedef struct qcal_npz_entry {
    char *name;
    int32_t elem_type;      /* ONNX element type of its dtype */
    int32_t ndim;
    int64_t dims[QCAL_MAX_DIMS];
    void *data;             /* numel * element size bytes (owned; NULL when empty or when
                             * only the headers were read) */
    size_t nbytes;
} qcal_npz_entry;

/* Reads a .npz archive: *entries (n, free with qcal_npz_free). with_data false reads only
 * the member headers (names, types, shapes). Members stored or deflated (zlib; without it
 * deflated members are QCAL_ERR_UNSUPPORTED); ZIP64 archives accepted; every member must be
 * a .npy file. Malformed or truncated archives: QCAL_ERR_FORMAT naming the member. */
QCAL_API qcal_status qcal_npz_read(const char *path, bool with_data, qcal_npz_entry **entries,
                                   int64_t *n);

/* qcal_npz_read from a buffer of len bytes. */
QCAL_API qcal_status qcal_npz_parse(const void *buf, size_t len, bool with_data,
                                    qcal_npz_entry **entries, int64_t *n);

/* Frees n entries and sets *entries to NULL (NULL is fine). */
QCAL_API void qcal_npz_free(qcal_npz_entry **entries, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
