/* unit.outputs: what an output path becomes (include/qcal/atomic_file.h, docs/cli.md
 * "Outputs"). Library: a regular file is replaced through a rename and keeps its mode and
 * owner; a symlink (a chain, a dangling one) stays a symlink and its target is written; a
 * character device and a FIFO are written in place (a reader gets the exact bytes); /dev/fd/N
 * and /proc/self/fd/N write through the descriptor; a directory and, for a non-root user, a
 * read-only file are refused with the reason; several outputs are written all or none. CLI:
 * every subcommand with an output (onnx-expose and qdq when built with ONNX) leaves /dev/null
 * a character device, feeds a FIFO reader, writes through a symlink, keeps modes, refuses
 * read-only files as a non-root user, writes `-o -` to stdout (the same bytes as the file)
 * and leaves nothing when one output fails (nor when observe fails for want of a finite
 * value). Blocks reserved ahead of a write leave the file its written size. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <math.h>
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
#include "qcal/onnx.h"

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

/* qcal_atomic_file_reserve: blocks reserved past what is then written leave the file its
 * written size and bytes (FALLOC_FL_KEEP_SIZE); a size no file system holds is refused at
 * once and the output then aborted leaves nothing; in place it does nothing. */
static void test_reserve(void **state)
{
    (void)state;
    qcal_atomic_file f;
    assert_int_equal(qcal_atomic_file_open(&f, T("r.txt")), QCAL_OK);
    assert_int_equal(qcal_atomic_file_reserve(&f, 1 << 20), QCAL_OK);
    fputs("reserved\n", f.fp);
    assert_int_equal(qcal_atomic_file_commit(&f), QCAL_OK);
    struct stat sb;
    assert_int_equal(stat(T("r.txt"), &sb), 0);
    assert_int_equal(sb.st_size, 9);
    expect_text(T("r.txt"), "reserved\n");

    assert_int_equal(qcal_atomic_file_open(&f, T("r.txt")), QCAL_OK);
    assert_int_equal(qcal_atomic_file_reserve(&f, UINT64_MAX), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), strerror(EFBIG)));
    assert_int_equal(qcal_atomic_file_reserve(&f, (uint64_t)1 << 62), QCAL_ERR_IO);   /* 4 EiB */
    qcal_atomic_file_abort(&f);
    expect_text(T("r.txt"), "reserved\n");
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
    unlink(T("r.txt"));

    assert_int_equal(qcal_atomic_file_open(&f, "/dev/null"), QCAL_OK);
    assert_int_equal(qcal_atomic_file_reserve(&f, (uint64_t)1 << 62), QCAL_OK);
    assert_int_equal(qcal_atomic_file_commit(&f), QCAL_OK);
    assert_chr_dev_null();
    assert_int_equal(qcal_atomic_file_reserve(&f, 1), QCAL_ERR_STATE);   /* not open */
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
 * were; the check says the same without touching anything; root's 0666 file in a sticky
 * directory (which rename(2) would refuse at the end) is refused at the open. Exit code =
 * failed step. */
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
    char sticky[160], sticky_file[200];
    snprintf(sticky, sizeof sticky, "%s", T("sticky"));
    assert_int_equal(mkdir(sticky, 0777), 0);
    assert_int_equal(chmod(sticky, 01777), 0);
    snprintf(sticky_file, sizeof sticky_file, "%s/shared.txt", sticky);
    tu_write_bytes(sticky_file, "keep\n", 5);
    assert_int_equal(chmod(sticky_file, 0666), 0);
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
        /* sticky directory, a world-writable file of root's: the rename would fail at the
         * end, so the open refuses before anything is written */
        if (put(sticky_file, "x") != QCAL_ERR_IO || !strstr(qcal_last_error(), "sticky"))
            _exit(15);
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
    expect_text(sticky_file, "keep\n");
    assert_int_equal(tu_count_entries(sticky, ".tmp."), 0);
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

/* ---- The CLI: every subcommand with an output ---------------------------------------- */

/* Runs `$QCAL_BIN ARGS` in tmp with stdout into tmp/.stdout and stderr into tmp/.stderr;
 * returns the exit code (-1 when it did not exit normally). */
static int run(const char *fmt, ...)
{
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >.stdout 2>.stderr", tmp, getenv("QCAL_BIN"),
             args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void expect_same(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    if (na != nb || memcmp(x, y, na) != 0) {
        print_error("%s (%zu bytes) and %s (%zu bytes) differ\n", a, na, b, nb);
        fail();
    }
    assert_true(na > 0);
    free(x);
    free(y);
}

/* One output of one subcommand: args with %s where the output path goes. */
typedef struct cli_case {
    const char *name;
    const char *args;
    bool no_dash;   /* not a stream output: `-` not offered */
} cli_case;

static const cli_case cases[] = {
    { "calibrate_json", "calibrate dump -o %s", false },
    { "calibrate_trt", "calibrate dump --format tensorrt -o %s", false },
    { "calibrate_state", "calibrate dump -o c2.json --save-state %s", false },
    { "convert_ncnn", "convert base.json --format ncnn -o %s", false },
    { "merge_json", "merge base.qcss -o %s", false },
    { "merge_state", "merge base.qcss --save-state %s", false },
    { "merge_observer_state", "merge base.qcob --save-state %s", false },
    { "observe_state", "observe x.npy --save-state %s", false },
    { "evaluate_csv", "evaluate dump --format csv -o %s", false },
    { "evaluate_rules", "evaluate dump --rules-out %s -o e3.txt", false },
    { "evaluate_state", "evaluate dump --save-state %s -o e2.txt", false },
    { "report_html", "report dump -o %s", false },
    { "report_state", "report dump -o r2.html --save-state %s", false },
    { "stats_csv", "stats --csv %s dump", false },
    { "quantize_npy", "quantize x.npy --scale 0.05 --zero-point 3 -o %s", false },
    { "fakequant_npy", "fakequant x.npy --scale 0.05 --zero-point 3 -o %s", false },
    { "fakequant_grad", "fakequant x.npy --scale 0.05 --zero-point 3 -o y2.npy --grad x.npy "
                        "--grad-out %s", false },
    /* last: only when qcal is built with ONNX support */
    { "onnx_expose", "onnx-expose model.onnx -o %s", true },
    { "onnx_expose_list", "onnx-expose model.onnx -o m2.onnx --list %s", false },
    { "qdq", "qdq model.onnx --table base.json --allow-partial -o %s", true },
    { "equalize", "equalize model.onnx -o %s", true },
};
static size_t NCASES = sizeof cases / sizeof cases[0];

static int cli_setup(void **state)
{
    (void)state;
    if (setup(NULL))
        return -1;
    assert_int_equal(chmod(tmp, 0755), 0);   /* the unprivileged runs read the inputs */
    assert_int_equal(mkdir(T("dump"), 0755), 0);
    assert_int_equal(mkdir(T("dump/act0"), 0755), 0);
    uint64_t r = 99;
    float x[4 * 32];
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < 4 * 32; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((int64_t)(r >> 40) - (1 << 23)) / (float)(1 << 21);
        }
        char name[64];
        snprintf(name, sizeof name, "dump/act0/%d.npy", b);
        const int64_t shape[2] = { 4, 32 };
        assert_int_equal(qcal_npy_write(T(name), QCAL_NPY_F32, 2, shape, x), QCAL_OK);
    }
    const int64_t ws[2] = { 8, 16 };
    assert_int_equal(qcal_npy_write(T("dump/fc.weight.npy"), QCAL_NPY_F32, 2, ws, x), QCAL_OK);
    assert_int_equal(qcal_npy_write(T("x.npy"), QCAL_NPY_F32, 2, ws, x), QCAL_OK);
    assert_int_equal(run("calibrate dump -o base.json --save-state base.qcss"), 0);
    assert_int_equal(run("observe x.npy --save-state base.qcob"), 0);
    if (!qcal_onnx_available()) {
        NCASES -= 4;
        return 0;
    }
    /* model.onnx: y = Gemm(x, W, B), x (1, 16), W (8, 16) transposed, opset 13. */
    qcal_onnx_model *m = NULL;
    assert_int_equal(qcal_onnx_model_create(8, 13, &m), QCAL_OK);
    assert_int_equal(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 16 }),
                     QCAL_OK);
    assert_int_equal(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 8 }),
                     QCAL_OK);
    assert_int_equal(qcal_onnx_model_add_initializer_float(m, "W", 2, ws, x), QCAL_OK);
    assert_int_equal(qcal_onnx_model_add_initializer_float(m, "B", 1, (int64_t[]){ 8 }, x), QCAL_OK);
    int64_t node = -1;
    assert_int_equal(qcal_onnx_model_add_node(m, "Gemm", "fc", 3, (const char *[]){ "x", "W", "B" },
                                              1, (const char *[]){ "y" }, &node), QCAL_OK);
    assert_int_equal(qcal_onnx_node_set_int(m, node, "transB", 1), QCAL_OK);
    assert_int_equal(qcal_onnx_model_save_file(m, NULL, T("model.onnx")), QCAL_OK);
    qcal_onnx_model_destroy(&m);
    return 0;
}

/* The reference bytes of every case: the output written to a new file. */
static void reference(const cli_case *c, char *ref, size_t cap)
{
    snprintf(ref, cap, "ref_%s", c->name);
    char args[1024];
    snprintf(args, sizeof args, c->args, ref);
    assert_int_equal(run("%s", args), 0);
}

static void assert_dev_null_is_null(void)
{
    struct stat sb;
    assert_int_equal(lstat("/dev/null", &sb), 0);
    if (!S_ISCHR(sb.st_mode) || sb.st_rdev != makedev(1, 3)) {
        print_error("/dev/null is not the null character device (mode %o)\n",
                    (unsigned)sb.st_mode);
        fail();
    }
}

/* -o /dev/null: it stays the character device (1, 3), for every subcommand and output. */
static void test_cli_dev_null(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCASES; i++) {
        assert_dev_null_is_null();
        char args[1024];
        snprintf(args, sizeof args, cases[i].args, "/dev/null");
        if (run("%s", args) != 0) {
            print_error("%s: qcal %s failed\n", cases[i].name, args);
            fail();
        }
        assert_dev_null_is_null();
    }
}

/* A FIFO with a reader (a forked child copying it into a file) gets the exact bytes of the
 * file output; the FIFO stays a FIFO. */
static void test_cli_fifo(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCASES; i++) {
        char ref[128], fifo[256], got[256], args[1024];
        reference(&cases[i], ref, sizeof ref);
        snprintf(fifo, sizeof fifo, "%s", T("the_fifo"));
        snprintf(got, sizeof got, "%s", T("fifo_got"));
        unlink(fifo);
        assert_int_equal(mkfifo(fifo, 0600), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int in = open(fifo, O_RDONLY), out = open(got, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            char buf[65536];
            ssize_t n;
            while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
                if (write(out, buf, (size_t)n) != n)
                    _exit(2);
            _exit(in >= 0 && out >= 0 ? 0 : 1);
        }
        snprintf(args, sizeof args, cases[i].args, "the_fifo");
        int rc = run("%s", args);
        /* If qcal never opened the FIFO, release the reader (no writer: EOF). */
        int w = open(fifo, O_WRONLY | O_NONBLOCK);
        if (w >= 0)
            close(w);
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (rc != 0) {
            print_error("%s: qcal %s exited %d\n", cases[i].name, args, rc);
            fail();
        }
        expect_same(T(ref), got);
        struct stat sb;
        assert_int_equal(lstat(fifo, &sb), 0);
        assert_true(S_ISFIFO(sb.st_mode));
        unlink(fifo);
        unlink(got);
    }
}

/* A symlink (relative, into another directory) stays a symlink and its target gets the
 * bytes; an existing 0600 output stays 0600; `-o -` gives the same bytes on stdout and
 * nothing else. */
static void test_cli_symlink_mode_stdout(void **state)
{
    (void)state;
    mkdir(T("sub"), 0755);
    for (size_t i = 0; i < NCASES; i++) {
        char ref[128], args[1024];
        reference(&cases[i], ref, sizeof ref);
        unlink(T("link"));
        tu_write_bytes(T("sub/target"), "old", 3);
        assert_int_equal(symlink("sub/target", T("link")), 0);
        snprintf(args, sizeof args, cases[i].args, "link");
        assert_int_equal(run("%s", args), 0);
        struct stat sb;
        assert_int_equal(lstat(T("link"), &sb), 0);
        assert_true(S_ISLNK(sb.st_mode));
        expect_same(T(ref), T("sub/target"));

        tu_write_bytes(T("private"), "old", 3);
        assert_int_equal(chmod(T("private"), 0600), 0);
        snprintf(args, sizeof args, cases[i].args, "private");
        assert_int_equal(run("%s", args), 0);
        assert_int_equal(stat(T("private"), &sb), 0);
        assert_int_equal(sb.st_mode & 07777, 0600);
        expect_same(T(ref), T("private"));

        for (int k = 0; k < 2 && !cases[i].no_dash; k++) {
            /* `-` and /dev/stdout: the same bytes on stdout, and nothing else there */
            snprintf(args, sizeof args, cases[i].args, k ? "/dev/stdout" : "-");
            assert_int_equal(run("%s", args), 0);
            expect_same(T(ref), T(".stdout"));
        }
        assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
        assert_int_equal(tu_count_entries(T("sub"), ".tmp."), 0);
    }
    /* `-o >(wc -c)`: a pipe as /dev/fd/N (bash process substitution) */
    if (system("command -v bash >/dev/null 2>&1") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "cd '%s' && bash -c \"'%s' evaluate dump --format csv -o "
                 ">(wc -c > wc.txt); wait\" >/dev/null 2>&1", tmp, getenv("QCAL_BIN"));
        assert_int_equal(system(cmd), 0);
        size_t n = 0;
        free(tu_read_file(T("ref_evaluate_csv"), &n));   /* written by the loop above */
        char buf[64] = { 0 };
        for (int k = 0; k < 50 && atol(buf) == 0; k++) {
            tu_slurp(T("wc.txt"), buf, sizeof buf);
            usleep(20000);
        }
        assert_int_equal(atol(buf), (long)n);
    }
}

/* An ONNX model is not written to standard output: `-o -` (and the other names of stdout)
 * is refused with exit 2 before any work, and no file named `-` appears (one was written
 * before). */
static void test_cli_model_not_stdout(void **state)
{
    (void)state;
    if (!qcal_onnx_available())
        skip();
    static const char *const cmds[] = { "onnx-expose model.onnx -o %s", "qdq model.onnx --table base.json --allow-partial -o %s",
                                        "equalize model.onnx -o %s" };
    static const char *const outs[] = { "-", "/dev/stdout", "/dev/fd/1" };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
            char args[256];
            snprintf(args, sizeof args, cmds[i], outs[k]);
            assert_int_equal(run("%s", args), 2);
            char err[512];
            tu_slurp(T(".stderr"), err, sizeof err);
            assert_non_null(strstr(err, "a model is written to a file, not to standard output"));
            struct stat sb;
            assert_int_equal(stat(T(".stdout"), &sb), 0);
            assert_int_equal(sb.st_size, 0);
            assert_int_equal(lstat(T("-"), &sb), -1);
        }
}

/* As a non-root user (a forked child drops to 65534 and runs the CLI): a root-owned 0444
 * file in a world-writable directory is refused (exit 4, the reason on stderr) and left
 * as it was, for every subcommand. */
static void test_cli_read_only(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();   /* the library test covers an unprivileged run */
    char world[160];
    snprintf(world, sizeof world, "%s", T("world"));
    mkdir(world, 0777);
    assert_int_equal(chmod(world, 0777), 0);
    for (size_t i = 0; i < NCASES; i++) {
        char ro[200], args[1024];
        snprintf(ro, sizeof ro, "%s/ro", world);
        tu_write_bytes(ro, "keep", 4);
        assert_int_equal(chmod(ro, 0444), 0);
        snprintf(args, sizeof args, cases[i].args, "world/ro");
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0)
                _exit(100);
            char cmd[8192];
            snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >/dev/null 2>world/err", tmp,
                     getenv("QCAL_BIN"), args);
            int rc = system(cmd);
            _exit(WIFEXITED(rc) ? WEXITSTATUS(rc) : 101);
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_true(WIFEXITED(ws));
        if (WEXITSTATUS(ws) != 4) {
            char err[512];
            tu_slurp(tu_path(world, "err"), err, sizeof err);
            print_error("%s as uid 65534: exit %d, expected 4: %s\n", cases[i].name,
                        WEXITSTATUS(ws), err);
            fail();
        }
        char err[512];
        tu_slurp(tu_path(world, "err"), err, sizeof err);
        assert_non_null(strstr(err, "Permission denied"));
        expect_text(ro, "keep");
        struct stat sb;
        assert_int_equal(stat(ro, &sb), 0);
        assert_int_equal(sb.st_uid, 0);
        unlink(ro);
        assert_int_equal(tu_count_entries(world, ".tmp."), 0);
    }
}

/* All or none: an output that fails when written (/dev/full: no space) or cannot be
 * created leaves none of the others, for every subcommand with several outputs. */
static void test_cli_all_or_nothing(void **state)
{
    (void)state;
    static const char *const runs[] = {
        "evaluate dump -o %s --rules-out R --save-state S",
        "evaluate dump -o E --rules-out %s --save-state S",
        "evaluate dump -o E --rules-out R --save-state %s",
        "report dump -o %s --save-state S",
        "report dump -o E --save-state %s",
        "calibrate dump -o %s --save-state S",
        "calibrate dump -o E --save-state %s",
        "merge base.qcss -o %s --save-state S",
        "fakequant x.npy --scale 0.05 --zero-point 3 -o %s --grad x.npy --grad-out S",
        "fakequant x.npy --scale 0.05 --zero-point 3 -o E --grad x.npy --grad-out %s",
    };
    const char *bad[] = { "/dev/full", "no/such/dir/out" };
    for (size_t b = 0; b < 2; b++) {
        for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
            char args[1024];
            snprintf(args, sizeof args, runs[i], bad[b]);
            if (!strcmp(bad[b], "/dev/full") && access("/dev/full", W_OK) != 0)
                continue;
            int rc = run("%s", args);
            if (rc != 4 || !access(T("R"), F_OK) || !access(T("S"), F_OK) ||
                !access(T("E"), F_OK)) {
                print_error("qcal %s: exit %d (expected 4) or an output left\n", args, rc);
                fail();
            }
            assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
            char err[1024];
            tu_slurp(T(".stderr"), err, sizeof err);
            assert_non_null(strstr(err, b == 0 ? "No space left on device"
                                               : "No such file or directory"));
        }
    }
    /* observe: no finite value is a failure (exit 1): no state saved either */
    float nan[4] = { NAN, NAN, NAN, NAN };
    assert_int_equal(qcal_npy_write(T("nan.npy"), QCAL_NPY_F32, 1, (int64_t[]){ 4 }, nan),
                     QCAL_OK);
    assert_int_equal(run("observe nan.npy --save-state S"), 1);
    assert_int_equal(access(T("S"), F_OK), -1);
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
    assert_dev_null_is_null();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular),
        cmocka_unit_test(test_symlink),
        cmocka_unit_test(test_device),
        cmocka_unit_test(test_reserve),
        cmocka_unit_test(test_fifo),
        cmocka_unit_test(test_fd_paths),
        cmocka_unit_test(test_read_only_non_root),
        cmocka_unit_test(test_write_all),
    };
    const struct CMUnitTest cli_tests[] = {
        cmocka_unit_test(test_cli_dev_null),
        cmocka_unit_test(test_cli_fifo),
        cmocka_unit_test(test_cli_symlink_mode_stdout),
        cmocka_unit_test(test_cli_model_not_stdout),
        cmocka_unit_test(test_cli_read_only),
        cmocka_unit_test(test_cli_all_or_nothing),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    if (!getenv("QCAL_BIN"))
        return failed;   /* built without the CLI */
    return failed | cmocka_run_group_tests(cli_tests, cli_setup, teardown);
}
