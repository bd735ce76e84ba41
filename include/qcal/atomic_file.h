/* qcal output files. Every file the library writes goes through this; it is public so tools
 * built on qcal write their outputs alike. What happens depends on what is at the path:
 *  - nothing, or a regular file: the bytes go to a temporary in the same directory, renamed
 *    over the path only when everything was written (a failed or abandoned write leaves the
 *    old file untouched and no temporary). A new file gets 0666 minus the umask (applied by
 *    open(2) itself); a replaced file keeps its mode, and its owner and group where the
 *    process may set them;
 *  - a symlink (or a chain of them): followed; the final target is replaced as above, in the
 *    target's directory, and the symlink stays a symlink (a dangling one creates its target);
 *  - any other existing file (character or block device, FIFO):
 *    opened and written in place, no temporary, no rename (/dev/null stays a device; a FIFO
 *    reader gets the bytes; opening a FIFO waits for its reader, as a shell redirection does);
 *  - /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N (also reached through a symlink):
 *    this process's descriptor N is duplicated and written through (a pipe, a terminal, or
 *    the file the shell redirected it to, at its offset, appending if it was opened so);
 *  - a directory, or an existing file access(W_OK) refuses: refused with the reason, as a
 *    shell redirection would be (QCAL_ERR_IO); so is a regular file that cannot be replaced
 *    (its directory not writable, or another user's file in a sticky directory).
 * Nothing process-wide (umask, working directory, signals) is changed: the umask is never
 * set, not even to read it. */
#ifndef QCAL_ATOMIC_FILE_H
#define QCAL_ATOMIC_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An output in progress. Write through fp; the strings are owned by the struct. */
typedef struct qcal_atomic_file {
    FILE *fp;          /* write here (NULL once committed or aborted) */
    char *path;        /* the destination as given (messages) */
    char *tmp_path;    /* temporary next to target (target.tmp.XXXXXX); NULL when written in
                        * place (device, FIFO, descriptor) */
    char *target;      /* what the temporary is renamed over: path with symlinks followed */
    int in_place;      /* 1: fp writes straight into the existing file or descriptor */
} qcal_atomic_file;

/* Checks, without creating or opening anything, that path can be written as described at
 * the top (its directory exists and is writable, an existing file passes access(W_OK), it
 * is not a directory, a descriptor path names an open writable descriptor). QCAL_OK, or
 * QCAL_ERR_IO with the reason in qcal_last_error(). */
QCAL_API qcal_status qcal_atomic_file_check(const char *path);

/* Opens an output at path as described at the top; on failure *f is zeroed and the status
 * (QCAL_ERR_IO, ...) says why. */
QCAL_API qcal_status qcal_atomic_file_open(qcal_atomic_file *f, const char *path);

/* Reserves disk blocks for the bytes about to be written when their total is known
 * (fallocate, FALLOC_FL_KEEP_SIZE: the file's size still grows only as it is written):
 * QCAL_ERR_IO at once when the disk or quota has no room for them; a no-op in place and
 * where the file system cannot reserve. */
QCAL_API qcal_status qcal_atomic_file_reserve(qcal_atomic_file *f, uint64_t bytes);

/* Flushes and fsyncs what was written (an in-place output has then received it) without
 * renaming: a caller writing several outputs learns every write error before renaming any.
 * On failure the output is aborted (as qcal_atomic_file_abort) and QCAL_ERR_IO says why. */
QCAL_API qcal_status qcal_atomic_file_flush(qcal_atomic_file *f);

/* Flushes (as qcal_atomic_file_flush), then renames the temporary over the target (nothing
 * to rename in place), closes and zeroes *f; on any failure removes the temporary (the
 * destination is untouched) and returns QCAL_ERR_IO with the OS reason. */
QCAL_API qcal_status qcal_atomic_file_commit(qcal_atomic_file *f);

/* Abandons the output: closes and removes the temporary, zeroes *f (safe on a zeroed
 * struct and after commit). In place, bytes already flushed cannot be taken back. */
QCAL_API void qcal_atomic_file_abort(qcal_atomic_file *f);

/* Writes n outputs (paths[i] gets len[i] bytes of data[i]) all or none: every path is
 * checked and opened, every byte written and flushed, and only then is any temporary
 * renamed; on a failure no regular file is created or replaced. */
QCAL_API qcal_status qcal_atomic_file_write_all(int64_t n, const char *const *paths,
                                                const void *const *data, const size_t *len);

#ifdef __cplusplus
}
#endif
#endif
