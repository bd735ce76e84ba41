/* Output files: a regular file (or a new path) through a temporary and a rename, anything
 * else written in place (include/qcal/atomic_file.h says which is which). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/vfs.h>
#endif

#include "qcal/atomic_file.h"
#include "core/internal.h"

/* More symlinks than this in a chain is a loop (Linux's own limit is 40). */
#define MAX_LINKS 40

typedef enum out_kind {
    OUT_NEW,       /* nothing there: created through a temporary */
    OUT_REGULAR,   /* a regular file: replaced through a temporary, mode and owner kept */
    OUT_DEVICE,    /* a device, a FIFO, a link of /proc/PID/fd: opened in place */
    OUT_FD,        /* one of this process's descriptors (/dev/stdout, /dev/fd/N): dup'ed */
} out_kind;

typedef struct resolved {
    out_kind kind;
    int fd;              /* OUT_FD */
    char *target;        /* OUT_NEW, OUT_REGULAR: the final path; OUT_DEVICE: what to open */
    struct stat st;      /* OUT_REGULAR, OUT_DEVICE: what is there */
} resolved;

/* The descriptor a path names by its spelling: /dev/stdin|stdout|stderr, /dev/fd/N,
 * /proc/self/fd/N, /proc/thread-self/fd/N, /proc/<this pid>/fd/N. */
static bool fd_path(const char *p, int *fd)
{
    static const char *const std[] = { "/dev/stdin", "/dev/stdout", "/dev/stderr" };
    for (int i = 0; i < 3; i++)
        if (!strcmp(p, std[i])) {
            *fd = i;
            return true;
        }
    char pid_prefix[64];
    snprintf(pid_prefix, sizeof pid_prefix, "/proc/%ld/fd/", (long)getpid());
    const char *const prefix[] = { "/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/",
                                   pid_prefix };
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(prefix[i]);
        if (strncmp(p, prefix[i], n))
            continue;
        const char *d = p + n;
        size_t nd = strspn(d, "0123456789");
        if (nd == 0 || nd > 9 || d[nd])
            return false;
        *fd = atoi(d);
        return true;
    }
    return false;
}

/* The directory part of path, into a new string ("." when none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    return qcal_strndup(!slash ? "." : path, n);
}

/* True when the symlink at path lives on procfs (/proc/PID/fd/N of another process, ...):
 * its "target" is not a path to replace, so the link is opened in place. */
static bool on_procfs(const char *path)
{
#ifdef __linux__
    char *dir = dir_of(path);
    struct statfs sf;
    bool proc = dir && statfs(dir, &sf) == 0 && sf.f_type == 0x9fa0;   /* PROC_SUPER_MAGIC */
    qcal_free(dir);
    return proc;
#else
    return strncmp(path, "/proc/", 6) == 0;
#endif
}

static qcal_status cannot(const char *path, const char *target, int e)
{
    if (target && strcmp(path, target))
        return qcal_error(QCAL_ERR_IO, "cannot write '%s' (-> '%s'): %s", path, target,
                          strerror(e));
    return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e));
}

/* Follows path to what will be written and checks it can be, as a shell redirection would:
 * fills *r (r->target owned by the caller) or returns the error with its reason. */
static qcal_status resolve(const char *path, resolved *r)
{
    memset(r, 0, sizeof *r);
    char *cur = qcal_strdup(path);
    if (!cur)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st = QCAL_OK;
    for (int hop = 0;; hop++) {
        if (hop > MAX_LINKS) {
            st = cannot(path, NULL, ELOOP);
            break;
        }
        int fd;
        if (fd_path(cur, &fd)) {
            int fl = fcntl(fd, F_GETFL);
            if (fl < 0)
                st = qcal_error(QCAL_ERR_IO, "cannot write '%s': descriptor %d is not open",
                                path, fd);
            else if ((fl & O_ACCMODE) == O_RDONLY)
                st = qcal_error(QCAL_ERR_IO, "cannot write '%s': descriptor %d is open for "
                                "reading only", path, fd);
            r->kind = OUT_FD;
            r->fd = fd;
            break;
        }
        if (lstat(cur, &r->st) != 0) {
            if (errno != ENOENT) {
                st = cannot(path, cur, errno);
                break;
            }
            r->kind = OUT_NEW;
            char *dir = dir_of(cur);
            if (!dir) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            if (access(dir, W_OK | X_OK) != 0)
                st = qcal_error(QCAL_ERR_IO, "cannot create '%s': directory '%s': %s", path,
                                dir, strerror(errno));
            qcal_free(dir);
            break;
        }
        if (S_ISLNK(r->st.st_mode) && on_procfs(cur)) {
            if (stat(cur, &r->st) != 0) {
                st = cannot(path, cur, errno);
                break;
            }
            r->kind = OUT_DEVICE;
        } else if (S_ISLNK(r->st.st_mode)) {
            size_t cap = (size_t)r->st.st_size + 2 > 256 ? (size_t)r->st.st_size + 2 : 256;
            const char *slash = strrchr(cur, '/');
            size_t keep = slash ? (size_t)(slash - cur) + 1 : 0;
            char *next = qcal_malloc(keep + cap);
            ssize_t got = next ? readlink(cur, next + keep, cap) : -1;
            if (!next) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            if (got < 0 || (size_t)got >= cap) {
                st = cannot(path, cur, got < 0 ? errno : ENAMETOOLONG);
                qcal_free(next);
                break;
            }
            next[keep + (size_t)got] = '\0';
            if (next[keep] == '/')
                memmove(next, next + keep, (size_t)got + 1);   /* absolute: replaces cur */
            else
                memcpy(next, cur, keep);                       /* relative to cur's directory */
            qcal_free(cur);
            cur = next;
            continue;
        } else if (S_ISDIR(r->st.st_mode)) {
            st = cannot(path, cur, EISDIR);
            break;
        } else {
            r->kind = S_ISREG(r->st.st_mode) ? OUT_REGULAR : OUT_DEVICE;
        }
        /* An existing file: writable by this user, as a redirection would require. */
        if (access(cur, W_OK) != 0) {
            st = cannot(path, cur, errno);
            break;
        }
        if (r->kind == OUT_REGULAR) {
            /* Its replacement is created and renamed in its directory. */
            char *dir = dir_of(cur);
            if (!dir) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            struct stat ds;
            if (access(dir, W_OK | X_OK) != 0)
                st = qcal_error(QCAL_ERR_IO, "cannot replace '%s' atomically: directory '%s': "
                                "%s", path, dir, strerror(errno));
            else if (stat(dir, &ds) == 0 && (ds.st_mode & S_ISVTX) && geteuid() != 0 &&
                     r->st.st_uid != geteuid() && ds.st_uid != geteuid())
                /* rename(2) would refuse at the end (EPERM): say so before the work. */
                st = qcal_error(QCAL_ERR_IO, "cannot replace '%s' atomically: it belongs to "
                                "another user in the sticky directory '%s'", path, dir);
            qcal_free(dir);
        }
        break;
    }
    if (st != QCAL_OK || r->kind == OUT_FD) {
        qcal_free(cur);
        cur = NULL;
    }
    r->target = cur;
    return st;
}

qcal_status qcal_atomic_file_check(const char *path)
{
    if (!path || !*path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output path is empty");
    resolved r;
    qcal_status st = resolve(path, &r);
    qcal_free(r.target);
    return st;
}

/* A fresh name for a temporary: target.tmp. and six characters (retried on EEXIST). */
static void tmp_name(char *dst, size_t cap, const char *target, unsigned attempt)
{
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 ((uint64_t)getpid() << 40) ^ __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED) ^
                 ((uint64_t)attempt << 20);
    /* splitmix64 finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    char tail[7];
    for (int i = 0; i < 6; i++, x /= 62)
        tail[i] = abc[x % 62];
    tail[6] = '\0';
    snprintf(dst, cap, "%s.tmp.%s", target, tail);
}

/* Creates the temporary for r (O_EXCL). A new file gets 0666 minus the umask from open(2)
 * itself; a replaced one its predecessor's mode, owner and group (those the process may
 * set: set-user/group-ID bits are dropped when the owner/group could not be kept). */
static int open_tmp(qcal_atomic_file *f, const resolved *r)
{
    size_t cap = strlen(r->target) + 16;
    f->tmp_path = qcal_malloc(cap);
    if (!f->tmp_path)
        return -1;
    int fd = -1;
    for (unsigned attempt = 0; attempt < 100 && fd < 0; attempt++) {
        tmp_name(f->tmp_path, cap, r->target, attempt);
        fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  r->kind == OUT_REGULAR ? 0600 : 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0 || r->kind != OUT_REGULAR)
        return fd;
    mode_t mode = r->st.st_mode & 07777;
    bool uid_kept = r->st.st_uid == geteuid(), gid_kept = r->st.st_gid == getegid();
    if ((!uid_kept || !gid_kept) && fchown(fd, r->st.st_uid, r->st.st_gid) == 0)
        uid_kept = gid_kept = true;
    if (!gid_kept && fchown(fd, (uid_t)-1, r->st.st_gid) == 0)
        gid_kept = true;
    if (!uid_kept)
        mode &= ~(mode_t)S_ISUID;
    if (!gid_kept)
        mode &= ~(mode_t)S_ISGID;
    if (fchmod(fd, mode) != 0) {
        int e = errno;
        close(fd);
        unlink(f->tmp_path);
        errno = e;
        return -1;
    }
    return fd;
}

qcal_status qcal_atomic_file_open(qcal_atomic_file *f, const char *path)
{
    if (!f)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_atomic_file_open: NULL file");
    memset(f, 0, sizeof *f);
    if (!path || !*path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output path is empty");
    resolved r;
    qcal_status st = resolve(path, &r);
    if (st != QCAL_OK) {
        qcal_free(r.target);
        return st;
    }
    f->path = qcal_strdup(path);
    f->target = r.target;
    if (!f->path || (r.kind != OUT_FD && !f->target)) {
        qcal_atomic_file_abort(f);
        return QCAL_ERR_NO_MEMORY;
    }
    int fd;
    if (r.kind == OUT_FD) {
        fd = fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
        f->in_place = 1;
    } else if (r.kind == OUT_DEVICE) {
        /* O_TRUNC only for a regular file reached through /proc/PID/fd (a redirection's
         * truncation); a FIFO's open waits for its reader. */
        fd = open(r.target, O_WRONLY | O_NOCTTY | O_CLOEXEC |
                  (S_ISREG(r.st.st_mode) ? O_TRUNC : 0));
        f->in_place = 1;
    } else {
        fd = open_tmp(f, &r);
        if (fd < 0 && !f->tmp_path) {
            qcal_atomic_file_abort(f);
            return QCAL_ERR_NO_MEMORY;
        }
    }
    if (fd < 0) {
        int e = errno;
        qcal_free(f->tmp_path);
        f->tmp_path = NULL;   /* not created: nothing to remove */
        st = f->in_place ? cannot(path, f->target, e)
                         : qcal_error(QCAL_ERR_IO, "cannot create output '%s': %s", path,
                                      strerror(e));
        qcal_atomic_file_abort(f);
        return st;
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

/* On ext4, blocks reserved at once save the per-page work of delayed allocation (docs/onnx.md
 * has the measurement: `qcal qdq --profile tensorrt` writing 1 GiB). Only a lack of room is
 * an error; any other failure (EOPNOTSUPP, ESPIPE, ENODEV, ...) leaves the writes to
 * allocate as usual. */
qcal_status qcal_atomic_file_reserve(qcal_atomic_file *f, uint64_t bytes)
{
    if (!f || !f->fp)
        return qcal_error(QCAL_ERR_STATE, "output file is not open");
    if (f->in_place || bytes == 0)
        return QCAL_OK;
    if (bytes > (uint64_t)INT64_MAX)
        return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", f->path, strerror(EFBIG));
    if (fallocate(fileno(f->fp), FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) != 0 &&
        (errno == ENOSPC || errno == EDQUOT || errno == EFBIG))
        return qcal_error(QCAL_ERR_IO, "cannot write %llu bytes to '%s': %s",
                          (unsigned long long)bytes, f->path, strerror(errno));
    return QCAL_OK;
}

qcal_status qcal_atomic_file_flush(qcal_atomic_file *f)
{
    if (!f || !f->fp)
        return qcal_error(QCAL_ERR_STATE, "output file is not open");
    int e = 0;
    if (ferror(f->fp))
        e = EIO;
    errno = 0;
    if (fflush(f->fp) != 0 && !e)
        e = errno ? errno : EIO;
    struct stat sb;
    /* fsync where it means something: a file (pipes and terminals refuse it). */
    if (!e && fstat(fileno(f->fp), &sb) == 0 && S_ISREG(sb.st_mode) &&
        fsync(fileno(f->fp)) != 0 && errno != EINVAL)
        e = errno;
    if (e) {
        qcal_status st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", f->path, strerror(e));
        qcal_atomic_file_abort(f);
        return st;
    }
    return QCAL_OK;
}

qcal_status qcal_atomic_file_commit(qcal_atomic_file *f)
{
    qcal_status st = qcal_atomic_file_flush(f);
    if (st != QCAL_OK)
        return st;
    int bad = fclose(f->fp) != 0;
    int e = errno;
    f->fp = NULL;
    if (bad) {
        st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", f->path, strerror(e));
        qcal_atomic_file_abort(f);
        return st;
    }
    if (f->tmp_path && rename(f->tmp_path, f->target) != 0) {
        e = errno;
        st = qcal_error(QCAL_ERR_IO, "cannot rename output into '%s': %s", f->target,
                        strerror(e));
        qcal_atomic_file_abort(f);
        return st;
    }
    qcal_free(f->tmp_path);
    f->tmp_path = NULL;
    qcal_atomic_file_abort(f);   /* frees the strings; nothing left to remove */
    return QCAL_OK;
}

void qcal_atomic_file_abort(qcal_atomic_file *f)
{
    if (!f)
        return;
    if (f->fp) {
        if (f->in_place)
            __fpurge(f->fp);   /* what was not delivered yet is dropped, not sent */
        fclose(f->fp);
    }
    if (f->tmp_path)
        unlink(f->tmp_path);
    qcal_free(f->tmp_path);
    qcal_free(f->target);
    qcal_free(f->path);
    memset(f, 0, sizeof *f);
}

qcal_status qcal_atomic_file_write_all(int64_t n, const char *const *paths,
                                       const void *const *data, const size_t *len)
{
    if (n < 0 || (n > 0 && (!paths || !data || !len)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_atomic_file_write_all: NULL arrays");
    for (int64_t i = 0; i < n; i++)
        if (!data[i] && len[i])
            return qcal_error(QCAL_ERR_INVALID_ARG, "output %lld: data is NULL", (long long)i);
    /* Every path checked before anything is opened (a FIFO's open waits for its reader). */
    qcal_status st = QCAL_OK;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++)
        st = qcal_atomic_file_check(paths[i]);
    if (st != QCAL_OK)
        return st;
    qcal_atomic_file *f = qcal_calloc(n ? (size_t)n : 1, sizeof *f);
    if (!f)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++)
        st = qcal_atomic_file_open(&f[i], paths[i]);
    for (int64_t i = 0; i < n && st == QCAL_OK; i++) {
        if (len[i] && fwrite(data[i], 1, len[i], f[i].fp) != len[i])
            st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", paths[i], strerror(errno));
        else
            st = qcal_atomic_file_flush(&f[i]);
    }
    qcal_status renamed = QCAL_OK;
    for (int64_t i = 0; i < n; i++) {
        if (st != QCAL_OK) {
            qcal_atomic_file_abort(&f[i]);
        } else {
            /* Only renames are left: one failing after the checks does not stop the rest. */
            qcal_status cs = qcal_atomic_file_commit(&f[i]);
            if (cs != QCAL_OK && renamed == QCAL_OK)
                renamed = cs;
        }
    }
    qcal_free(f);
    return st != QCAL_OK ? st : renamed;
}
