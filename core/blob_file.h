/* Whole-file binary I/O for the state files (observer and session states): read a file
 * into memory, write a buffer atomically. Not installed. */
#ifndef QCAL_CORE_BLOB_FILE_H
#define QCAL_CORE_BLOB_FILE_H

#include <stddef.h>

#include "qcal/common.h"

/* Reads the whole file into *buf (malloc'ed, free() it) and *len. Messages name the file
 * as "<what> '<path>'": QCAL_ERR_NOT_FOUND (missing), QCAL_ERR_IO, QCAL_ERR_NO_MEMORY. */
qcal_status qcal_blob_read_file(const char *path, const char *what, void **buf, size_t *len);

/* Writes len bytes to path atomically (temporary file, then rename): QCAL_ERR_IO on failure,
 * any existing file untouched. */
qcal_status qcal_blob_write_file(const char *path, const void *buf, size_t len);

#endif
