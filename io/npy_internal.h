/* Internal .npy header access for the .npz reader and the dataset (io/npz.c, io/dataset.c):
 * headers parsed without their data, so callers can read byte ranges themselves. Not
 * installed. */
#ifndef QCAL_IO_NPY_INTERNAL_H
#define QCAL_IO_NPY_INTERNAL_H

#include <stdint.h>

#include "qcal/npy.h"

/* Bytes the prefix and header take, from the first bytes buf[0..len) of a .npy (len >= 12,
 * or the whole member when shorter): *need = prefix + header length. Checks of
 * qcal_npy_parse (magic, version, header size limit); name is for messages. */
qcal_status qcal_npy_header_size(const void *buf, size_t len, const char *name, size_t *need);

/* Parses the header in buf[0..len) (at least the bytes qcal_npy_header_size gives) of a
 * .npy of total bytes: *info gets dtype, ndim, shape, numel, nbytes (data NULL), *data_offset
 * the data's offset; total - *data_offset must equal nbytes (qcal_npy_parse's checks). */
qcal_status qcal_npy_header_parse(const void *buf, size_t len, uint64_t total, const char *name,
                                  qcal_npy_array *info, uint64_t *data_offset);

/* The header of the file path, its data size checked against the file's size (the checks
 * and messages of qcal_npy_read, without reading the data). */
qcal_status qcal_npy_file_header(const char *path, qcal_npy_array *info, uint64_t *data_offset);

#endif
