/* qcal IDX reader: the (optionally gzip-compressed) IDX files of MNIST and Fashion-MNIST
 * (Debian package `dataset-fashion-mnist`, /usr/share/datasets/fashion-mnist/, files *-ubyte.gz).
 * Format: big-endian u32 magic 0x000008NN (type 0x08 = unsigned byte, NN = number of
 * dimensions, 1..4), NN big-endian u32 dimensions, then the bytes in C order.
 * Images are magic 0x00000803 [N, rows, cols]; labels are 0x00000801 [N]. */
#ifndef QCAL_EXAMPLES_IDX_H
#define QCAL_EXAMPLES_IDX_H

#include <qcal/common.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IDX_MAX_DIMS 4

/* Opaque decoded IDX file: its dimensions and its unsigned-byte payload. */
typedef struct idx_file idx_file;

/* Reads an IDX file (gzip-compressed or raw) into a new handle *out. A missing file is
 * QCAL_ERR_NOT_FOUND (the message names the Debian package for Fashion-MNIST paths);
 * a bad magic, dimensions that disagree with the data length, or a truncated or corrupt
 * gzip stream is QCAL_ERR_FORMAT; other element types are QCAL_ERR_UNSUPPORTED. */
QCAL_API qcal_status idx_read_file(const char *path, idx_file **out);

/* Same as idx_read_file on a memory buffer (gzip or raw IDX, detected by the gzip
 * magic 1f 8b). src (len bytes, owned by the caller) is not kept. Fuzzing entry point. */
QCAL_API qcal_status idx_read_memory(const void *src, size_t len, idx_file **out);

/* Frees the handle (NULL is fine) and sets *idx to NULL. */
QCAL_API void idx_destroy(idx_file **idx);

/* Number of dimensions (1..4) into *ndim and the dimensions into dims[0..ndim-1]
 * (dims must hold IDX_MAX_DIMS entries; unused entries are set to 1). */
QCAL_API qcal_status idx_shape(const idx_file *idx, int32_t *ndim, int64_t dims[IDX_MAX_DIMS]);

/* Pointer to the payload (owned by the handle, valid until destroy) and its length in
 * bytes (the product of the dimensions). */
QCAL_API qcal_status idx_data(const idx_file *idx, const uint8_t **data, int64_t *len);

/* Convenience for datasets: checks that idx has the magic 0x00000800 + expected_ndim
 * and, for each i with expected_dims[i] > 0, that dims[i] == expected_dims[i]
 * (QCAL_ERR_MISMATCH with both shapes in the message otherwise). */
QCAL_API qcal_status idx_expect(const idx_file *idx, int32_t expected_ndim,
                                     const int64_t *expected_dims);

#ifdef __cplusplus
}
#endif
#endif
