/* Temporary-file-then-rename output. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/atomic_file.h"
#include "core/internal.h"

qcal_status qcal_atomic_file_open(qcal_atomic_file *f, const char *path)
{
    if (!f)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_atomic_file_open: NULL file");
    memset(f, 0, sizeof *f);
    if (!path || !*path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output path is empty");
    size_t n = strlen(path);
    f->path = qcal_malloc(n + 1);
    f->tmp_path = qcal_malloc(n + 16);
    if (!f->path || !f->tmp_path) {
        qcal_atomic_file_abort(f);
        return QCAL_ERR_NO_MEMORY;
    }
    memcpy(f->path, path, n + 1);
    snprintf(f->tmp_path, n + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(f->tmp_path);
    if (fd < 0) {
        int e = errno;
        free(f->tmp_path);
        f->tmp_path = NULL;
        qcal_atomic_file_abort(f);
        return qcal_error(QCAL_ERR_IO, "cannot create output '%s': %s", path, strerror(e));
    }
    /* mkstemp creates the file 0600; give the output the mode a plain fopen would
     * (0666 minus the umask), so replacing a file does not silently restrict it. */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) {
        int e = errno;
        close(fd);
        qcal_atomic_file_abort(f);
        return qcal_error(QCAL_ERR_IO, "cannot set the mode of output '%s': %s", path,
                          strerror(e));
    }
    f->fp = fdopen(fd, "wb");
    if (!f->fp) {
        int e = errno;
        close(fd);
        qcal_atomic_file_abort(f);
        return qcal_error(QCAL_ERR_IO, "cannot open output '%s': %s", path, strerror(e));
    }
    return QCAL_OK;
}

qcal_status qcal_atomic_file_commit(qcal_atomic_file *f)
{
    if (!f || !f->fp)
        return qcal_error(QCAL_ERR_STATE, "output file is not open");
    int bad = ferror(f->fp) != 0;
    bad |= fflush(f->fp) != 0;
    int e = errno;
    if (!bad) {
        bad |= fsync(fileno(f->fp)) != 0 && errno != EINVAL;
        e = errno;
    }
    bad |= fclose(f->fp) != 0;
    f->fp = NULL;
    if (bad) {
        qcal_status st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", f->path,
                                    strerror(e ? e : EIO));
        qcal_atomic_file_abort(f);
        return st;
    }
    if (rename(f->tmp_path, f->path) != 0) {
        e = errno;
        qcal_status st = qcal_error(QCAL_ERR_IO, "cannot rename output into '%s': %s",
                                    f->path, strerror(e));
        qcal_atomic_file_abort(f);
        return st;
    }
    free(f->tmp_path);
    free(f->path);
    f->tmp_path = f->path = NULL;
    return QCAL_OK;
}

void qcal_atomic_file_abort(qcal_atomic_file *f)
{
    if (!f)
        return;
    if (f->fp)
        fclose(f->fp);
    if (f->tmp_path)
        unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->path);
    memset(f, 0, sizeof *f);
}
