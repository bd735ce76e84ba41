/* qcal atomic output files: write to a temporary file in the destination's directory, then
 * rename it over the destination only when everything was written. A failed or abandoned
 * write leaves any existing file untouched and no temporary behind. Every file the library
 * writes goes through this; it is public so tools built on qcal write their outputs alike. */
#ifndef QCAL_ATOMIC_FILE_H
#define QCAL_ATOMIC_FILE_H

#include <stdio.h>

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An output in progress. Write through fp; the strings are owned by the struct. */
typedef struct qcal_atomic_file {
    FILE *fp;          /* write here (NULL once committed or aborted) */
    char *path;        /* final destination */
    char *tmp_path;    /* temporary in the same directory (path.tmp.XXXXXX) */
} qcal_atomic_file;

/* Creates a temporary next to path (mode 0666 minus the umask) and opens it for writing;
 * on failure *f is zeroed and the status (QCAL_ERR_IO, ...) says why. */
QCAL_API qcal_status qcal_atomic_file_open(qcal_atomic_file *f, const char *path);

/* Flushes, fsyncs and renames the temporary over path, then zeroes *f; on any failure
 * removes the temporary (the destination is untouched) and returns QCAL_ERR_IO. */
QCAL_API qcal_status qcal_atomic_file_commit(qcal_atomic_file *f);

/* Abandons the output: closes and removes the temporary, zeroes *f (safe on a zeroed
 * struct and after commit). */
QCAL_API void qcal_atomic_file_abort(qcal_atomic_file *f);

#ifdef __cplusplus
}
#endif
#endif
