/* mpi.calibrate: `mpirun -np N qcal calibrate` against `qcal calibrate` in one process.
 *  - identity (`test_mpi_calibrate identity LO HI`, np LO..HI): a dump whose tensors use
 *    every observer kind (rules), NaNs included, written in every format: the same bytes
 *    as one process, and the same single summary line on stdout, for a multi-format run
 *    (json, tensorrt, the three onnxruntime files and ncnn into a directory, with --weights
 *    of a safetensors model, read by rank 0) at every np and
 *    each single format (json, tensorrt and ncnn files, the onnxruntime directory) at the
 *    highest np; --save-state writes one process's session state;
 *  - faults on a rank other than 0 (np 2 and 4): a malformed file, an unreadable file, an
 *    observer error (--strict and a NaN): every rank ends with the same exit code (3; 1 for
 *    the NaN, as qcal observe --strict), one line on stderr
 *    naming the rank and the file, no table written, an existing one untouched, no
 *    temporary file left; a missing directory (exit 3) and an unwritable table (exit 4);
 *    a tensor whose every value is NaN, its files on every rank: exit 1 on every rank with
 *    one line naming it, or with --allow-empty exit 0, one warning line, no_data written
 *    (`test_mpi_calibrate faults`). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <qcal/npy.h>
#include <qcal/safetensors.h>

#include "testutil.h"

static char tmpdir[64];
static char dump[128], rules[128], out_txt[128], err_txt[128], model[128];

/* Tensor i of the dump: name, observer rule, batch shape (channels on axis 1). */
static const struct {
    const char *fqn, *rule;
} tensors[] = {
    { "a_minmax", "minmax" },
    { "b_moving", "moving_average_minmax averaging_constant=0.1" },
    { "c_channels", "per_channel_minmax axis=1" },
    { "d_moving_channels", "moving_average_per_channel_minmax axis=1 averaging_constant=0.2" },
    { "e_histogram", "histogram bins=256" },
    { "f_percentile", "percentile bins=256 percentile=99.5" },
    { "g_entropy", "entropy bins=512" },
    { "h_mse", "mse bins=256" },
    { "i_first_batch", "histogram bins=256 grid=first-batch" },   /* whole tensor per rank */
    { "j_torch", "histogram bins=256 grid=torch" },               /* whole tensor per rank */
};
enum { NT = sizeof tensors / sizeof tensors[0], NB = 7, ROWS = 12, COLS = 10 };

static void fill(float *d, int t, int b)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(t * 31 + b + 1);
    for (int i = 0; i < ROWS * COLS; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((s >> 40) & 0xffffff) / 16777216.0f;
        d[i] = (u - 0.3f) * (float)(1 + (b * 3 + t) % 5);
    }
    if (b == 4)
        d[7] = 60.0f + (float)t;     /* a late outlier */
    if (b == 2 && t % 2 == 0)
        d[3] = (float)NAN;           /* counted, skipped */
}

static void write_batch(const char *dir, int b, const float *d)
{
    char name[32];
    snprintf(name, sizeof name, "b%02d.npy", b);
    int64_t shape[2] = { ROWS, COLS };
    assert_int_equal(qcal_npy_write(tu_path(dir, name), QCAL_NPY_F32, 2, shape, d), QCAL_OK);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_mpi_calib_XXXXXX");
    if (!mkdtemp(tmpdir) || !getenv("QCAL_BIN") || !getenv("QCAL_MPIRUN"))
        return -1;
    snprintf(dump, sizeof dump, "%s/dump", tmpdir);
    snprintf(rules, sizeof rules, "%s/rules.txt", tmpdir);
    snprintf(out_txt, sizeof out_txt, "%s/stdout", tmpdir);
    snprintf(err_txt, sizeof err_txt, "%s/stderr", tmpdir);
    mkdir(dump, 0755);
    FILE *f = fopen(rules, "w");
    if (!f)
        return -1;
    float d[ROWS * COLS];
    for (int t = 0; t < NT; t++) {
        fprintf(f, "%s activation %s\n", tensors[t].fqn, tensors[t].rule);
        char dir[256];
        snprintf(dir, sizeof dir, "%s/%s", dump, tensors[t].fqn);
        mkdir(dir, 0755);
        for (int b = 0; b < NB; b++) {
            fill(d, t, b);
            write_batch(dir, b, d);
        }
    }
    fclose(f);
    /* A weight (default per_channel_minmax observer), one file. */
    fill(d, 99, 0);
    int64_t shape[2] = { ROWS, COLS };
    assert_int_equal(qcal_npy_write(tu_path(dump, "fc.weight.npy"), QCAL_NPY_F32, 2, shape, d),
                     QCAL_OK);
    /* --weights: a safetensors model outside the dump (a 2-D weight and a skipped 1-D bias). */
    snprintf(model, sizeof model, "%s/model.safetensors", tmpdir);
    float w[ROWS * COLS], b[ROWS];
    fill(w, 98, 1);
    fill(b, 97, 3);
    int64_t bshape[1] = { ROWS };
    qcal_tensor ts[2];
    qcal_tensor_init(&ts[0], w, 2, shape);
    qcal_tensor_init(&ts[1], b, 1, bshape);
    const char *names[2] = { "head.weight", "head.bias" };
    assert_int_equal(qcal_safetensors_write_f32(model, 2, names, ts, 0, NULL), QCAL_OK);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmpdir);
    return 0;
}

/* Runs `[mpirun -np N] qcal calibrate ARGS` (np 0: no mpirun), bounded by 120 s so a hang
 * fails instead of blocking; returns the exit code, *secs the wall time. */
static int run(int np, double *secs, const char *fmt, ...)
{
    char args[2048], cmd[4096], pre[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    if (np > 0)
        snprintf(pre, sizeof pre, "'%s' -np %d --oversubscribe ", getenv("QCAL_MPIRUN"), np);
    snprintf(cmd, sizeof cmd, "timeout 120 %s'%s' calibrate %s >'%s' 2>'%s'", pre,
             getenv("QCAL_BIN"), args, out_txt, err_txt);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = system(cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs)
        *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    assert_true(WIFEXITED(rc));
    assert_int_not_equal(WEXITSTATUS(rc), 124);   /* timeout: a rank hung */
    return WEXITSTATUS(rc);
}

/* Every file of dir a equals the same file of dir b; returns the number compared. */
static int same_dirs(const char *a, const char *b, int np)
{
    int n = 0;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls '%s' > '%s/.list'", a, tmpdir);
    assert_int_equal(system(cmd), 0);
    char *list = tu_read_file(tu_path(tmpdir, ".list"), NULL);
    for (char *name = strtok(list, "\n"); name; name = strtok(NULL, "\n")) {
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/%s", a, name);
        snprintf(pb, sizeof pb, "%s/%s", b, name);
        size_t la, lb;
        char *x = tu_read_file(pa, &la), *y = tu_read_file_or_null(pb, &lb);
        if (!y || la != lb || memcmp(x, y, la))
            fail_msg("np %d: %s differs from one process's (%zu vs %zu bytes)", np, name,
                     y ? lb : 0, la);
        free(x);
        free(y);
        n++;
    }
    free(list);
    assert_int_equal(tu_count_entries(b, NULL), n);
    return n;
}

static int np_lo = 1, np_hi = 4;

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Under a terminal (util-linux script(1) gives mpirun one): one progress bar, drawn by rank
 * 0 over its own files, and one summary line, not np of each. Skipped without script(1). */
static void one_bar(int np)
{
    if (system("command -v script >/dev/null 2>&1") != 0) {
        printf("mpi.calibrate: no script(1): progress bar under a terminal not checked\n");
        return;
    }
    char cmd[4096], typescript[256], out[256];
    snprintf(typescript, sizeof typescript, "%s/typescript", tmpdir);
    snprintf(out, sizeof out, "%s/bar.json", tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 120 script -qec \"'%s' -np %d --oversubscribe '%s' calibrate "
             "'%s' -o '%s' --rules '%s'\" '%s' >/dev/null 2>&1", getenv("QCAL_MPIRUN"), np,
             getenv("QCAL_BIN"), dump, out, rules, typescript);
    assert_int_equal(system(cmd), 0);
    char *t = tu_read_file(typescript, NULL);
    /* Every bar starts at "] reading 0/" (tools/cli_progress.c) and is cleared by
     * "\r\033[K" at the end. */
    if (count(t, "] reading 0/") != 1 || count(t, "qcal: calibrate: wrote") != 1)
        fail_msg("np %d under a terminal: %d progress bars, %d summary lines:\n%s", np,
                 count(t, "] reading 0/"), count(t, "qcal: calibrate: wrote"), t);
    free(t);
}

/* One single-format run at np ranks against one process: OUT is a file (dir: a directory). */
static void same_single(int np, const char *fmt, bool dir)
{
    char ref[256], got[256];
    snprintf(ref, sizeof ref, "%s/single_ref_%s", tmpdir, fmt);
    snprintf(got, sizeof got, "%s/single_got_%s", tmpdir, fmt);
    tu_rm_tree(ref);
    tu_rm_tree(got);
    unlink(ref);
    unlink(got);
    assert_int_equal(run(0, NULL, "'%s' -o '%s' --rules '%s' --format %s", dump, ref, rules, fmt),
                     0);
    int rc = run(np, NULL, "'%s' -o '%s' --rules '%s' --format %s", dump, got, rules, fmt);
    if (rc != 0)
        fail_msg("np %d, %s: exit %d: %s", np, fmt, rc, (char *)tu_read_file(err_txt, NULL));
    if (dir) {
        assert_true(same_dirs(ref, got, np) >= 1);
        return;
    }
    size_t la, lb;
    char *x = tu_read_file(ref, &la), *y = tu_read_file(got, &lb);
    if (la != lb || memcmp(x, y, la))
        fail_msg("np %d: %s table differs from one process's (%zu vs %zu bytes)", np, fmt, lb, la);
    free(x);
    free(y);
}

static void test_identity(void **state)
{
    (void)state;
    char *ref = strdup(tu_path(tmpdir, "ref")), *got = strdup(tu_path(tmpdir, "got"));
    char *table = strdup(tu_path(tmpdir, "table"));
    const char *fmts = "json,tensorrt,onnxruntime,ncnn";
    assert_int_equal(run(0, NULL, "'%s' -o '%s' --rules '%s' --format %s --weights '%s'", dump, ref,
                         rules, fmts, model), 0);
    char *ref_out = tu_read_file(out_txt, NULL);
    for (int np = np_lo; np <= np_hi; np++) {
        tu_rm_tree(got);
        int rc = run(np, NULL, "'%s' -o '%s' --rules '%s' --format %s --weights '%s'", dump, got,
                     rules, fmts, model);
        if (rc != 0) {
            char *e = tu_read_file(err_txt, NULL);
            fail_msg("np %d: exit %d: %s", np, rc, e);
        }
        assert_true(same_dirs(ref, got, np) >= 6);   /* json, tensorrt, 3 onnxruntime, ncnn */
        /* stderr redirected to a file: no progress bar, no line at all. */
        size_t elen = 0;
        char *e = tu_read_file(err_txt, &elen);
        if (elen != 0)
            fail_msg("np %d: stderr not empty:\n%s", np, e);
        free(e);
        /* One summary line, the same but for the output path. */
        char *o = tu_read_file(out_txt, NULL);
        char *p = strstr(o, got), *q = strstr(ref_out, ref);
        assert_non_null(p);
        assert_non_null(q);
        assert_string_equal(p + strlen(got), q + strlen(ref));
        assert_int_equal(p - o, q - ref_out);
        free(o);
    }
    free(ref_out);
    free(ref);
    free(got);
    one_bar(np_hi);
    /* Each format alone, at the highest np. */
    same_single(np_hi, "json", false);
    same_single(np_hi, "tensorrt", false);
    same_single(np_hi, "ncnn", false);
    same_single(np_hi, "onnxruntime", true);
    /* --save-state: the session state merged from every rank, the bytes of one process's. */
    char *st1 = strdup(tu_path(tmpdir, "one.qcss")), *stn = strdup(tu_path(tmpdir, "n.qcss"));
    assert_int_equal(run(0, NULL, "'%s' -o '%s' --rules '%s' --save-state '%s'", dump, table, rules,
                         st1), 0);
    size_t l1, ln;
    char *b1 = tu_read_file(st1, &l1);
    for (int np = np_lo; np <= np_hi; np += np_hi > np_lo ? np_hi - np_lo : 1) {
        unlink(stn);
        assert_int_equal(run(np, NULL, "'%s' -o '%s' --rules '%s' --save-state '%s'", dump, table,
                             rules, stn), 0);
        char *bn = tu_read_file(stn, &ln);
        if (ln != l1 || memcmp(bn, b1, l1))
            fail_msg("np %d: --save-state differs from one process's (%zu vs %zu bytes)", np, ln,
                     l1);
        free(bn);
    }
    free(b1);
    free(st1);
    free(stn);
    free(table);
}

/* A faulty run: exit code want, one stderr line (apart from mpirun's own notice, which
 * starts with dashes or names mpirun) starting "qcal: calibrate: rank R: " and containing
 * needle; the old table still there, nothing else in its directory. */
static void expect_fault(int np, int want_rc, int want_rank, const char *needle, const char *fmt,
                         ...)
{
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    char outdir[256];
    snprintf(outdir, sizeof outdir, "%s/out", tmpdir);
    tu_rm_tree(outdir);
    mkdir(outdir, 0755);
    char table[300];
    snprintf(table, sizeof table, "%s/table.json", outdir);
    tu_write_bytes(table, "old\n", 4);
    double secs = 0;
    int rc = run(np, &secs, "%s -o '%s'", args, table);
    char *err = tu_read_file(err_txt, NULL);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "qcal: calibrate: rank %d: ", want_rank);
    int ours = 0;
    for (char *line = err; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!strncmp(line, "qcal:", 5)) {
            ours++;
            if (strncmp(line, prefix, strlen(prefix)) || (needle && !strstr(line, needle)))
                fail_msg("np %d: error line '%s', expected '%s...%s'", np, line, prefix,
                         needle ? needle : "");
        }
        line = nl ? nl + 1 : NULL;
    }
    if (ours != 1 || rc != want_rc)
        fail_msg("np %d: exit %d (want %d), %d qcal lines on stderr:\n%s", np, rc, want_rc, ours,
                 err);
    free(err);
    size_t len;
    char *t = tu_read_file(table, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(t, "old\n", 4);
    free(t);
    assert_int_equal(tu_count_entries(outdir, NULL), 1);
    assert_true(secs < 30);   /* every rank ended within seconds (~1.5 s each, loaded) */
}

/* The fault dump: one tensor "x" of 8 equal-size batch files, calibrated with --observer
 * minmax (split by file): the greedy balance gives file b to rank b % np. Variant: file bad
 * replaced by garbage of the same size ("garbage"), a dangling symlink ("dangling": weight 0,
 * so the least loaded rank, np - 1 for np 2 and 4) or a NaN ("nan"). */
static char *fault_dump(const char *variant, int bad)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/fault_%s", tmpdir, variant);
    tu_rm_tree(dir);
    mkdir(dir, 0755);
    char x[300];
    snprintf(x, sizeof x, "%s/x", dir);
    mkdir(x, 0755);
    float d[ROWS * COLS];
    for (int b = 0; b < 8; b++) {
        fill(d, 0, b == 2 ? 3 : b);   /* no NaN unless asked */
        if (b == bad && !strcmp(variant, "nan"))
            d[5] = (float)NAN;
        write_batch(x, b, d);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/b%02d.npy", x, bad);
    if (!strcmp(variant, "garbage")) {
        size_t len;
        char *buf = tu_read_file(path, &len);
        memset(buf, 'x', len);
        tu_write_bytes(path, buf, len);
        free(buf);
    } else if (!strcmp(variant, "dangling")) {
        unlink(path);
        assert_int_equal(symlink("/nonexistent/qcal/batch.npy", path), 0);
    } else if (!strcmp(variant, "allnan")) {
        /* A second tensor "y" of 8 batches, every value NaN, spread over the ranks. */
        snprintf(x, sizeof x, "%s/y", dir);
        mkdir(x, 0755);
        for (int i = 0; i < ROWS * COLS; i++)
            d[i] = (float)NAN;
        for (int b = 0; b < 8; b++)
            write_batch(x, b, d);
    }
    return dir;
}

static void test_faults(void **state)
{
    (void)state;
    for (int np = 2; np <= 4; np += 2) {
        int bad = np - 1;   /* on rank np - 1 */
        char file[32];
        snprintf(file, sizeof file, "x/b%02d.npy", bad);
        expect_fault(np, 3, bad, file, "'%s' --observer minmax", fault_dump("garbage", bad));
        expect_fault(np, 3, bad, file, "'%s' --observer minmax", fault_dump("dangling", bad));
        /* NaN under --strict: exit 1, as 'qcal observe --strict'. */
        expect_fault(np, 1, bad, file, "'%s' --observer minmax --strict", fault_dump("nan", bad));
        /* A tensor with no finite value on any rank: the ranks agree, exit 1, one line
         * (from the writer, which holds the merged session) naming it; --allow-empty: exit
         * 0 with one warning line and the table written. */
        expect_fault(np, 1, 0, "1 tensor saw no finite value", "'%s' --observer minmax",
                     fault_dump("allnan", -1));
        char table[300];
        snprintf(table, sizeof table, "%s/allnan.json", tmpdir);
        assert_int_equal(run(np, NULL, "'%s' --observer minmax --allow-empty -o '%s'",
                             fault_dump("allnan", -1), table), 0);
        char *err = tu_read_file(err_txt, NULL);
        assert_int_equal(count(err, "qcal: calibrate: "), 1);
        assert_non_null(strstr(err, "warning: activation 'y' saw no finite value (960 NaN/Inf "
                                    "skipped)"));
        free(err);
        char *t = tu_read_file(table, NULL);
        assert_non_null(strstr(t, "\"no_data\": true"));
        free(t);
        /* Every rank fails the same way: the lowest, rank 0, speaks. */
        expect_fault(np, 3, 0, "/nonexistent/dump", "/nonexistent/dump --observer minmax");
    }
}

/* An unwritable table: the writer (rank 0) finds out before any work, every rank exits 4. */
static void test_unwritable(void **state)
{
    (void)state;
    for (int np = 2; np <= 4; np += 2) {
        int rc = run(np, NULL, "'%s' --observer minmax -o /nonexistent/dir/table.json",
                     fault_dump("ok", -1));
        assert_int_equal(rc, 4);
        char *err = tu_read_file(err_txt, NULL);
        assert_non_null(strstr(err, "qcal: calibrate: rank 0: "));
        assert_non_null(strstr(err, "/nonexistent/dir/table.json"));
        assert_null(strstr(strstr(err, "qcal: calibrate: ") + 1, "qcal: calibrate: "));
        free(err);
    }
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "identity")) {
        np_lo = atoi(argv[2]);
        np_hi = atoi(argv[3]);
        const struct CMUnitTest tests[] = { cmocka_unit_test(test_identity) };
        return cmocka_run_group_tests(tests, setup, teardown);
    }
    if (argc == 2 && !strcmp(argv[1], "faults")) {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_faults),
            cmocka_unit_test(test_unwritable),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
    }
    fprintf(stderr, "usage: test_mpi_calibrate identity NP_LO NP_HI | faults\n");
    return 2;
}
