/* Whole-file reads (state files, tables, rules, manifests) and atomic writes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qcal/atomic_file.h"
#include "core/blob_file.h"
#include "core/internal.h"

qcal_status qcal_blob_read_file(const char *path, const char *what, size_t max, void **out,
                                size_t *out_len)
{
    if (!path || !out || !out_len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or outputs are NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot open %s '%s': %s", what, path, strerror(errno));
    /* A pipe (a rules file from a process substitution) is read like a file; a directory
     * or a device (/dev/zero would never end) is refused. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISFIFO(sb.st_mode))) {
        fclose(f);
        return qcal_error(QCAL_ERR_IO, "%s '%s' is not a regular file", what, path);
    }
    /* The size from fstat is a hint (0 for a pipe); read until EOF whatever it says, one
     * byte past max at the most so that a larger file is refused without holding it. */
    size_t cap = sb.st_size > 0 && (uint64_t)sb.st_size < SIZE_MAX / 2 ? (size_t)sb.st_size + 1
                                                                       : 4096;
    size_t limit = max < SIZE_MAX ? max + 1 : SIZE_MAX;
    if (cap > limit)
        cap = limit;
    size_t len = 0;
    uint8_t *buf = malloc(cap);
    qcal_status st = QCAL_OK;
    if (!buf)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot hold %s '%s' (%zu bytes)", what, path, cap);
    while (st == QCAL_OK) {
        if (len > max) {
            st = qcal_error(QCAL_ERR_FORMAT, "%s '%s' is larger than %zu bytes", what, path,
                            max);
            break;
        }
        if (len == cap) {
            size_t ncap = cap > limit / 2 ? limit : cap * 2;
            uint8_t *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot hold %s '%s'", what, path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                st = qcal_error(QCAL_ERR_IO, "cannot read %s '%s'", what, path);
            break;
        }
    }
    fclose(f);
    if (st != QCAL_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_len = len;
    return QCAL_OK;
}

qcal_status qcal_blob_write_file(const char *path, const void *buf, size_t len)
{
    if (!path || (!buf && len))
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or buffer is NULL");
    qcal_atomic_file f;
    qcal_status st = qcal_atomic_file_open(&f, path);
    if (st != QCAL_OK)
        return st;
    if (len && fwrite(buf, 1, len, f.fp) != len) {
        int e = errno;
        qcal_atomic_file_abort(&f);
        return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e ? e : EIO));
    }
    return qcal_atomic_file_commit(&f);
}
