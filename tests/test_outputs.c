/* unit.outputs: what an output path becomes (include/qcal/atomic_file.h, docs/cli.md
 * "Outputs"). Library: a regular file is replaced through a rename and keeps its mode and
 * owner; a symlink (a chain, a dangling one) stays a symlink and its target is written; a
 * character device and a FIFO are written in place (a reader gets the exact bytes); /dev/fd/N
 * and /proc/self/fd/N write through the descriptor; a directory and, for a non-root user, a
 * read-only file are refused with the reason; several outputs are written all or none. CLI:
 * every subcommand with an output leaves /dev/null a character device, feeds a FIFO reader,
 * writes through a symlink, keeps modes, refuses read-only files as a non-root user, writes
 * `-o -` to stdout (the same bytes as the file) and leaves nothing when one output fails. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/atomic_file.h"
#include "qcal/npy.h"

#include "testutil.h"

static char tmp[64];

static const char *T(const char *name)
{
    return tu_path(tmp, name);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/qcal_outputs_XXXXXX");
    return mkdtemp(tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp);
    return 0;
}

/* Writes text to path through the library; returns the status. */
static qcal_status put(const char *path, const char *text)
{
    qcal_atomic_file f;
    qcal_status st = qcal_atomic_file_open(&f, path);
    if (st != QCAL_OK)
        return st;
    fputs(text, f.fp);
    return qcal_atomic_file_commit(&f);
}

static void expect_text(const char *path, const char *text)
{
    char buf[256];
    tu_slurp(path, buf, sizeof buf);
    assert_string_equal(buf, text);
}

static void assert_chr_dev_null(void)
{
    struct stat sb;
    assert_int_equal(lstat("/dev/null", &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
}

/* A regular file: replaced through a rename (new inode), its mode and owner kept; a new
 * file gets 0666 minus the umask (set here, in the test, not by the library). */
static void test_regular(void **state)
{
    (void)state;
    const char *p = T("a.txt");
    mode_t old = umask(027);
    assert_int_equal(put(p, "one\n"), QCAL_OK);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0640);
    umask(old);
    assert_int_equal(chmod(p, 0600), 0);
    ino_t ino = sb.st_ino;
    assert_int_equal(put(p, "two\n"), QCAL_OK);
    expect_text(p, "two\n");
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);   /* kept, not 0644 */
    assert_int_not_equal(sb.st_ino, ino);          /* replaced by a rename */
    assert_int_equal(chmod(p, 0444), 0);
    if (geteuid() == 0) {
        /* root may write a 0444 file, as a shell redirection may; the mode stays; an owner
         * root is allowed to keep is kept. */
        assert_int_equal(chown(p, 65534, 65534), 0);
        assert_int_equal(put(p, "three\n"), QCAL_OK);
        expect_text(p, "three\n");
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(sb.st_mode & 07777, 0444);
        assert_int_equal(sb.st_uid, 65534);
        assert_int_equal(sb.st_gid, 65534);
    }
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
    unlink(p);
}

/* A symlink stays a symlink and its final target (through a chain of relative and absolute
 * links, in another directory) is replaced in the target's directory; a dangling link
 * creates its target. */
static void test_symlink(void **state)
{
    (void)state;
    char sub[128];
    snprintf(sub, sizeof sub, "%s", T("sub"));
    assert_int_equal(mkdir(sub, 0755), 0);
    char target[160];
    snprintf(target, sizeof target, "%s/target.txt", sub);
    tu_write_bytes(target, "old\n", 4);
    assert_int_equal(chmod(target, 0640), 0);
    assert_int_equal(symlink("sub/target.txt", T("l1")), 0);   /* relative */
    char l1[160];
    snprintf(l1, sizeof l1, "%s", T("l1"));
    assert_int_equal(symlink(l1, T("l2")), 0);                 /* absolute, to a link */
    assert_int_equal(put(T("l2"), "new\n"), QCAL_OK);
    struct stat sb;
    assert_int_equal(lstat(T("l2"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(lstat(T("l1"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(lstat(target, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    assert_int_equal(sb.st_mode & 07777, 0640);
    expect_text(target, "new\n");
    assert_int_equal(tu_count_entries(sub, ".tmp."), 0);
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
    /* dangling: the target is created, the link kept */
    assert_int_equal(symlink("sub/created.txt", T("dangling")), 0);
    assert_int_equal(put(T("dangling"), "made\n"), QCAL_OK);
    assert_int_equal(lstat(T("dangling"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    expect_text(tu_path(sub, "created.txt"), "made\n");
    /* a loop is refused with the reason */
    assert_int_equal(symlink("loop_b", T("loop_a")), 0);
    assert_int_equal(symlink("loop_a", T("loop_b")), 0);
    assert_int_equal(put(T("loop_a"), "x"), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), strerror(ELOOP)));
}

/* A character device is written in place: root's mknod'ed copy of /dev/null (1, 3) in the
 * temporary directory when mknod is allowed, and /dev/null itself (it stays a device). */
static void test_device(void **state)
{
    (void)state;
    assert_chr_dev_null();   /* (a run of an older build may have replaced it) */
    assert_int_equal(put("/dev/null", "nothing\n"), QCAL_OK);
    assert_chr_dev_null();
    assert_int_equal(qcal_atomic_file_check("/dev/null"), QCAL_OK);
    if (mknod(T("null"), S_IFCHR | 0666, makedev(1, 3)) == 0) {
        assert_int_equal(put(T("null"), "nothing\n"), QCAL_OK);
        struct stat sb;
        assert_int_equal(lstat(T("null"), &sb), 0);
        assert_true(S_ISCHR(sb.st_mode));
        assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
        unlink(T("null"));
    }
    /* /dev/full: the write error with the OS reason, and it stays a device */
    struct stat sb;
    if (stat("/dev/full", &sb) == 0 && S_ISCHR(sb.st_mode)) {
        assert_int_equal(put("/dev/full", "x"), QCAL_ERR_IO);
        assert_non_null(strstr(qcal_last_error(), strerror(ENOSPC)));
        assert_int_equal(lstat("/dev/full", &sb), 0);
        assert_true(S_ISCHR(sb.st_mode));
    }
    /* a directory is refused */
    assert_int_equal(put(tmp, "x"), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), strerror(EISDIR)));
    assert_int_equal(qcal_atomic_file_check(tmp), QCAL_ERR_IO);
}

/* A FIFO with a reader: the reader gets the exact bytes, the FIFO stays a FIFO. */
static void test_fifo(void **state)
{
    (void)state;
    const char *p = T("fifo");
    assert_int_equal(mkfifo(p, 0600), 0);
    int rfd = open(p, O_RDONLY | O_NONBLOCK);   /* the waiting reader */
    assert_true(rfd >= 0);
    assert_int_equal(put(p, "through the fifo\n"), QCAL_OK);
    char buf[64] = { 0 };
    assert_int_equal(read(rfd, buf, sizeof buf - 1), 17);
    assert_string_equal(buf, "through the fifo\n");
    close(rfd);
    struct stat sb;
    assert_int_equal(lstat(p, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
    unlink(p);
}

/* /dev/fd/N, /proc/self/fd/N (a pipe) and a symlink to /dev/fd/N write through the
 * descriptor; a descriptor not open, or open for reading only, is refused. */
static void test_fd_paths(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char p[64], q[64];
    snprintf(p, sizeof p, "/dev/fd/%d", fds[1]);
    snprintf(q, sizeof q, "/proc/self/fd/%d", fds[1]);
    assert_int_equal(put(p, "one "), QCAL_OK);
    assert_int_equal(put(q, "two "), QCAL_OK);
    assert_int_equal(symlink(p, T("to_fd")), 0);
    assert_int_equal(put(T("to_fd"), "three"), QCAL_OK);
    char buf[64] = { 0 };
    assert_int_equal(read(fds[0], buf, sizeof buf - 1), 13);
    assert_string_equal(buf, "one two three");
    struct stat sb;
    assert_int_equal(lstat(T("to_fd"), &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    snprintf(p, sizeof p, "/dev/fd/%d", fds[0]);
    assert_int_equal(put(p, "x"), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "reading only"));
    close(fds[0]);
    close(fds[1]);
    assert_int_equal(put("/dev/fd/999", "x"), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "not open"));
    /* a regular file behind a descriptor is written at the descriptor's offset, appending
     * when it was opened so (as `>> log` would), never replaced by a rename */
    int afd = open(T("log"), O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(afd >= 0);
    assert_int_equal(write(afd, "head\n", 5), 5);
    snprintf(p, sizeof p, "/dev/fd/%d", afd);
    ino_t ino = (fstat(afd, &sb), sb.st_ino);
    assert_int_equal(put(p, "tail\n"), QCAL_OK);
    close(afd);
    expect_text(T("log"), "head\ntail\n");
    assert_int_equal(stat(T("log"), &sb), 0);
    assert_int_equal(sb.st_ino, ino);
}

/* As a non-root user (a forked child drops to 65534): a 0444 file owned by root in a
 * world-writable directory, and a 0644 one, are refused with the reason and left as they
 * were; the check says the same without touching anything. Exit code = failed step. */
static void test_read_only_non_root(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        /* Already unprivileged: the same checks without the fork's setuid. */
        tu_write_bytes(T("ro.txt"), "keep\n", 5);
        assert_int_equal(chmod(T("ro.txt"), 0444), 0);
        assert_int_equal(put(T("ro.txt"), "x"), QCAL_ERR_IO);
        assert_non_null(strstr(qcal_last_error(), strerror(EACCES)));
        expect_text(T("ro.txt"), "keep\n");
        return;
    }
    char dir[128];
    snprintf(dir, sizeof dir, "%s", T("world"));
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(chmod(tmp, 0755), 0);   /* the child must reach dir */
    char ro[160], rw[160];
    snprintf(ro, sizeof ro, "%s/ro.txt", dir);
    snprintf(rw, sizeof rw, "%s/root644.txt", dir);
    tu_write_bytes(ro, "keep\n", 5);
    tu_write_bytes(rw, "keep\n", 5);
    assert_int_equal(chmod(ro, 0444), 0);
    assert_int_equal(chmod(rw, 0644), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(10);
        if (put(ro, "x") != QCAL_ERR_IO || !strstr(qcal_last_error(), strerror(EACCES)))
            _exit(11);
        if (qcal_atomic_file_check(ro) != QCAL_ERR_IO)
            _exit(12);
        if (put(rw, "x") != QCAL_ERR_IO)
            _exit(13);
        /* a new file in the same directory is fine */
        char nw[200];
        snprintf(nw, sizeof nw, "%s/new.txt", dir);
        if (put(nw, "mine\n") != QCAL_OK)
            _exit(14);
        _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    expect_text(ro, "keep\n");
    expect_text(rw, "keep\n");
    struct stat sb;
    assert_int_equal(stat(ro, &sb), 0);
    assert_int_equal(sb.st_uid, 0);
    assert_int_equal(sb.st_mode & 07777, 0444);
    assert_int_equal(tu_count_entries(dir, ".tmp."), 0);
}

/* Several outputs all or none: one unwritable path and nothing is created or replaced. */
static void test_write_all(void **state)
{
    (void)state;
    tu_write_bytes(T("keep.txt"), "old\n", 4);
    const char *paths[3] = { T("w_new.txt"), T("keep.txt"), T("no/such/dir/x") };
    char p0[160], p1[160], p2[160];
    snprintf(p0, sizeof p0, "%s", paths[0]);
    snprintf(p1, sizeof p1, "%s", paths[1]);
    snprintf(p2, sizeof p2, "%s", paths[2]);
    const char *const ps[3] = { p0, p1, p2 };
    const void *const data[3] = { "a\n", "b\n", "c\n" };
    const size_t len[3] = { 2, 2, 2 };
    assert_int_equal(qcal_atomic_file_write_all(3, ps, data, len), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "no/such/dir"));
    assert_int_equal(access(p0, F_OK), -1);
    expect_text(p1, "old\n");
    assert_int_equal(qcal_atomic_file_write_all(2, ps, data, len), QCAL_OK);
    expect_text(p0, "a\n");
    expect_text(p1, "b\n");
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular),
        cmocka_unit_test(test_symlink),
        cmocka_unit_test(test_device),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_fd_paths),
        cmocka_unit_test(test_read_only_non_root),
        cmocka_unit_test(test_write_all),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
