/* Whole-file I/O: read a file into memory (state files, calibration tables, rules files,
 * dump manifests), write a buffer atomically (state files). Not installed. */
#ifndef QCAL_CORE_BLOB_FILE_H
#define QCAL_CORE_BLOB_FILE_H

#include <stddef.h>

#include "qcal/common.h"

/* Reads the whole file (or pipe) into *buf (malloc'ed, not NUL-terminated, free() it) and
 * *len; a file over max bytes is refused (QCAL_ERR_FORMAT; SIZE_MAX: no bound). Messages
 * name the file as "<what> '<path>'": QCAL_ERR_NOT_FOUND (missing), QCAL_ERR_IO (also neither
 * a regular file nor a pipe), QCAL_ERR_NO_MEMORY. */
qcal_status qcal_blob_read_file(const char *path, const char *what, size_t max, void **buf,
                                size_t *len);

/* Writes len bytes to path atomically (temporary file, then rename): QCAL_ERR_IO on failure,
 * any existing file untouched. */
qcal_status qcal_blob_write_file(const char *path, const void *buf, size_t len);

#endif
