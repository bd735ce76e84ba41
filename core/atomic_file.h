/* Atomic output files: write to a temporary file in the destination's directory, then
 * rename over the destination only when everything was written. A failed run leaves any
 * existing file untouched and no temporary behind. */
#ifndef QCAL_CORE_ATOMIC_FILE_H
#define QCAL_CORE_ATOMIC_FILE_H

#include <stdio.h>

#include "qcal/common.h"

typedef struct qcal_atomic_file {
    FILE *fp;          /* write here */
    char *path;        /* final destination */
    char *tmp_path;    /* temporary in the same directory */
} qcal_atomic_file;

/* Opens a temporary next to path; on failure *f is zeroed and the status says why. */
qcal_status qcal_atomic_open(qcal_atomic_file *f, const char *path);

/* Flushes, fsyncs and renames the temporary over path; on failure removes the temporary. */
qcal_status qcal_atomic_commit(qcal_atomic_file *f);

/* Abandons the output: closes and removes the temporary (safe on a zeroed struct). */
void qcal_atomic_abort(qcal_atomic_file *f);

#endif
