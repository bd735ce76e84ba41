/* unit.cli_messages: the qcal CLI speaks with one voice (docs/cli.md, "Messages"): one line
 * "qcal: SUBCOMMAND: ..." for errors, warnings, notes and success summaries, never a doubled
 * "qcal: CMD: CMD:" prefix; the OS reason on a failed write; a repeated single-valued option
 * is a usage error; TensorRT header options checked; convert counts what it wrote; merge
 * refuses a file given twice; stats labels activations and names the input of a name held
 * twice; compare-weights skips and counts tensors under 2 dimensions. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/npy.h"
#include "qcal/observer.h"
#include "qcal/qcal.h"

#include "testutil.h"

static const char *qcal_bin;
static char tmp_dir[4096];

typedef struct result {
    int code;
    char out[1 << 16];
    char err[1 << 16];
} result;

static result R; /* last run */

#define TMP(name) tu_path(tmp_dir, name)

/* Runs qcal in tmp_dir with the NULL-terminated arguments (at most 30), stdout and stderr
 * into files; fsize >= 0 limits the size of every file the process writes (RLIMIT_FSIZE,
 * SIGXFSZ ignored: a write past it fails with EFBIG, "File too large", as on a full disk).
 * Fills R. */
static int run_v(long fsize, const char *stdout_path, const char *first, va_list ap)
{
    const char *argv[32] = { qcal_bin };
    int n = 1;
    for (const char *a = first; a && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    argv[n] = NULL;
    char outp[4200], errp[4200];
    snprintf(outp, sizeof outp, "%s/.out", tmp_dir);
    snprintf(errp, sizeof errp, "%s/.err", tmp_dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = stdout_path ? open(stdout_path, O_WRONLY)
                            : open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || chdir(tmp_dir) != 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        if (fsize >= 0) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = { (rlim_t)fsize, (rlim_t)fsize };
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
                _exit(126);
        }
        execv(qcal_bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (stdout_path)
        R.out[0] = '\0';
    else
        tu_slurp(outp, R.out, sizeof R.out);
    tu_slurp(errp, R.err, sizeof R.err);
    R.code = WEXITSTATUS(status);
    return R.code;
}

static int run(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    int rc = run_v(-1, NULL, first, ap);
    va_end(ap);
    return rc;
}

static int run_limited(long fsize, const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    int rc = run_v(fsize, NULL, first, ap);
    va_end(ap);
    return rc;
}

/* As run, standard output on the device stdout_path (opened for writing, never created). */
static int run_to(const char *stdout_path, const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    int rc = run_v(-1, stdout_path, first, ap);
    va_end(ap);
    return rc;
}

static void expect_fail(int code, const char *prefix, const char *needle)
{
    if (R.code != code)
        fail_msg("exit code %d, expected %d; stderr: %s", R.code, code, R.err);
    tu_expect_one_line(R.err, prefix, needle);
}

static void expect_ok(void)
{
    if (R.code != 0)
        fail_msg("exit code %d; stderr: %s", R.code, R.err);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void write_f32(const char *path, int32_t ndim, const int64_t *shape, float x0, float dx)
{
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++)
        n *= shape[d];
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++)
        x[i] = x0 + dx * (float)i;
    if (qcal_npy_write(path, QCAL_NPY_F32, ndim, shape, x) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
    free(x);
}

/* model.safetensors: fc.weight F32 (4, 8), fc.bias F32 (4), steps I64 (1). */
static void write_model(const char *path)
{
    const char *hdr = "{\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,128]},"
                      "\"fc.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[128,144]},"
                      "\"steps\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[144,152]}}";
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    static unsigned char buf[1024];
    memset(buf, 0, sizeof buf);
    for (int k = 0; k < 8; k++)
        buf[k] = (unsigned char)((uint64_t)padded >> (8 * k));
    memset(buf + 8, ' ', padded);
    memcpy(buf + 8, hdr, hl);
    float w[36];
    for (int i = 0; i < 36; i++)
        w[i] = (float)(i % 7) * 0.25f - 0.75f;
    memcpy(buf + 8 + padded, w, sizeof w);
    int64_t steps = 1000;
    memcpy(buf + 8 + padded + sizeof w, &steps, sizeof steps);
    tu_write_bytes(path, buf, 8 + padded + sizeof w + sizeof steps);
}

static int group_setup(void **state)
{
    (void)state;
    qcal_bin = getenv("QCAL_BIN");
    if (!qcal_bin || access(qcal_bin, X_OK) != 0) {
        fprintf(stderr, "QCAL_BIN is not set to the qcal binary\n");
        return -1;
    }
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal_test_cli_messages.XXXXXX");
    if (!mkdtemp(tmp_dir))
        return -1;
    int64_t s23[2] = { 2, 3 }, s416[2] = { 4, 16 }, s48[2] = { 4, 8 };
    write_f32(TMP("x.npy"), 2, s23, -1.0f, 0.5f);
    write_f32(TMP("g.npy"), 2, s23, 1.0f, 0.0f);
    /* a dump: two activations and a weight; dumpb holds an activation named as one of dump */
    if (mkdir(TMP("dump"), 0755) || mkdir(TMP("dumpb"), 0755))
        return -1;
    write_f32(TMP("dump/act.npy"), 2, s416, -1.0f, 0.05f);
    write_f32(TMP("dump/relu.npy"), 2, s416, 0.0f, 0.03f);
    write_f32(TMP("dump/fc.weight.npy"), 2, s48, -1.0f, 0.0625f);
    write_f32(TMP("dumpb/act.npy"), 2, s416, -2.0f, 0.05f);
    write_model(TMP("model.safetensors"));
    tu_write_bytes(TMP("empty.npy"), "", 0);
    tu_write_bytes(TMP("all.rules"), "* activation minmax\n", 20);
    tu_write_bytes(TMP("one.rules"), "relu activation minmax\n", 23);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

/* Errors of every subcommand, library messages included: one line "qcal: CMD: ...", never
 * "qcal: CMD: CMD: ..." nor "qcal: CMD: CMD WORD: ...". */
static void test_no_doubled_prefix(void **state)
{
    (void)state;
    static const char *const cases[][12] = {
        { "quantize", "--scale", "0", "x.npy", "-o", "q.npy" },
        { "quantize", "--axis", "0", "--scales", "x.npy", "--zero-points", "x.npy", "x.npy",
          "-o", "q.npy" },
        { "dequantize", "--scale", "0", "x.npy", "-o", "d.npy" },
        { "fakequant", "--scale", "0", "x.npy", "-o", "f.npy" },
        { "fakequant", "--scale", "0", "--learnable", "--grad", "g.npy", "x.npy", "-o", "f.npy" },
        { "observe", "--observer", "histogram", "--bins", "0", "x.npy" },
        { "observe", "empty.npy" },
        { "calibrate", "nonexistent_dir", "-o", "t.json" },
        { "convert", "nonexistent.json", "--format", "json", "-o", "t2.json" },
        { "merge", "nonexistent.state" },
        { "stats", "nonexistent.safetensors" },
        { "compare-weights", "nonexistent.safetensors" },
        { "evaluate", "nonexistent_dir" },
        { "report", "nonexistent_dir", "-o", "r.html" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *const *a = cases[i];
        run(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], NULL);
        if (R.code == 0)
            fail_msg("qcal %s ... succeeded", a[0]);
        char prefix[64], twice[128], twice_word[128];
        snprintf(prefix, sizeof prefix, "qcal: %s: ", a[0]);
        snprintf(twice, sizeof twice, "qcal: %s: %s:", a[0], a[0]);
        snprintf(twice_word, sizeof twice_word, "qcal: %s: %s ", a[0], a[0]);
        tu_expect_one_line(R.err, prefix, "");
        if (strstr(R.err, twice) || strstr(R.err, twice_word))
            fail_msg("doubled prefix: %s", R.err);
    }
    run("quantize", "--scale", "0", "x.npy", "-o", "q.npy", NULL);
    assert_string_equal(R.err, "qcal: quantize: scale 0 must be > 0 and finite\n");
    run("fakequant", "--scale", "0", "--learnable", "--grad", "g.npy", "x.npy", "-o", "f.npy",
        NULL);
    assert_string_equal(R.err, "qcal: fakequant: learnable: scale 0 must be > 0 and finite\n");
}

/* Success summaries have the form of errors: "qcal: CMD: wrote ...". */
static void test_success_form(void **state)
{
    (void)state;
    run("calibrate", "dump", "-o", "t.json", "--save-state", "s.state", NULL);
    expect_ok();
    assert_int_equal(strncmp(R.out, "qcal: calibrate: wrote t.json (json): ", 38), 0);
    run("convert", "t.json", "--format", "tensorrt", "-o", "t.cache", NULL);
    expect_ok();
    assert_int_equal(strncmp(R.out, "qcal: convert: wrote t.cache ", 29), 0);
    run("merge", "s.state", "-o", "m.json", NULL);
    expect_ok();
    assert_int_equal(strncmp(R.out, "qcal: merge: wrote m.json ", 26), 0);
    run("report", "dump", "-o", "r.html", NULL);
    expect_ok();
    assert_int_equal(strncmp(R.out, "qcal: report: wrote r.html ", 27), 0);
    assert_null(strstr(R.out, "qcal calibrate:"));
}

/* A write that fails gives the OS reason, whichever subcommand and writer. */
static void test_write_reason(void **state)
{
    (void)state;
    const long lim = 512;   /* every output below is larger; the error line is shorter */
    run_limited(lim, "report", "dump", "-o", "big.html", NULL);
    expect_fail(4, "qcal: report: ", "'big.html': File too large");
    run_limited(lim, "calibrate", "dump", "-o", "big.json", NULL);
    expect_fail(4, "qcal: calibrate: ", "File too large");
    run_limited(lim, "calibrate", "dump", "-o", "bigdir", "--format", "json,ncnn", NULL);
    expect_fail(4, "qcal: calibrate: ", "File too large");
    run_limited(lim, "evaluate", "dump", "-o", "big.txt", NULL);
    expect_fail(4, "qcal: evaluate: ", "File too large");
    run_limited(lim, "evaluate", "dump", "--format", "json", "-o", "big.txt", NULL);
    expect_fail(4, "qcal: evaluate: ", "File too large");
    run_limited(lim, "calibrate", "dump", "-o", "ok.json", "--save-state", "big.state", NULL);
    expect_fail(4, "qcal: calibrate: ", "File too large");
    int64_t shape[2] = { 32, 32 };
    write_f32(TMP("big_in.npy"), 2, shape, 0.0f, 0.01f);
    run_limited(lim, "fakequant", "--scale", "0.1", "big_in.npy", "-o", "big_out.npy", NULL);
    expect_fail(4, "qcal: fakequant: ", "File too large");
    for (const char *p = "big.html\0big.json\0bigdir\0big.txt\0big.state\0big_out.npy\0"; *p;
         p += strlen(p) + 1)
        if (tu_count_entries(tmp_dir, p) && strcmp(p, "bigdir"))
            fail_msg("a failed write left '%s'", p);

    /* A full device: every output is written in place (never renamed over the device) and
     * fails with ENOSPC, named. */
    struct stat sb;
    if (stat("/dev/full", &sb) != 0 || !S_ISCHR(sb.st_mode)) {
        print_message("no /dev/full character device: the full-device half is skipped\n");
        return;
    }
    static const char *const full[][8] = {
        { "report", "dump", "-o", "/dev/full" },
        { "calibrate", "dump", "-o", "/dev/full" },
        { "calibrate", "dump", "-o", "ok.json", "--save-state", "/dev/full" },
        { "evaluate", "dump", "-o", "/dev/full" },
        { "evaluate", "dump", "--rules-out", "/dev/full" },
        { "stats", "dump", "--csv", "/dev/full" },
        { "convert", "c0.json", "--format", "tensorrt", "-o", "/dev/full" },
        { "quantize", "--scale", "0.1", "x.npy", "-o", "/dev/full" },
        { "fakequant", "--scale", "0.1", "x.npy", "-o", "/dev/full" },
        { "observe", "x.npy", "--save-state", "/dev/full" },
    };
    run("calibrate", "dump", "-o", "c0.json", NULL);
    expect_ok();
    for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) {
        const char *const *a = full[i];
        run(a[0], a[1], a[2], a[3], a[4], a[5], a[6], NULL);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "qcal: %s: ", a[0]);
        if (R.code != 4)
            fail_msg("qcal %s ... > /dev/full: exit %d, stderr: %s", a[0], R.code, R.err);
        tu_expect_one_line(R.err, prefix, "'/dev/full': No space left on device");
        assert_int_equal(stat("/dev/full", &sb), 0);
        assert_true(S_ISCHR(sb.st_mode));
    }
    /* standard output on a full device: the summary, records, JSON or help cannot be
     * written: exit 4 and the reason, never a silent success */
    static const char *const out_full[][6] = {
        { "stats", "dump" }, { "compare-weights", "w2.npy" },
        { "calibrate", "dump", "-o", "sum.json" }, { "observe", "x.npy" },
        { "evaluate", "dump" }, { "convert", "c0.json", "--format", "json", "-o", "cv.json" },
        { "quantize", "--help" },
    };
    int64_t s48[2] = { 4, 8 };
    write_f32(TMP("w2.npy"), 2, s48, -1.0f, 0.0625f);
    for (size_t i = 0; i < sizeof out_full / sizeof out_full[0]; i++) {
        const char *const *a = out_full[i];
        run_to("/dev/full", a[0], a[1], a[2], a[3], a[4], a[5], NULL);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "qcal: %s: ", a[0]);
        if (R.code != 4)
            fail_msg("qcal %s %s > /dev/full: exit %d, stderr: %s", a[0], a[1], R.code, R.err);
        tu_expect_one_line(R.err, prefix, "No space left on device");
    }
    run_to("/dev/full", "--help", NULL);
    assert_int_equal(R.code, 4);
    assert_string_equal(R.err, "qcal: cannot write to standard output: No space left on device\n");
    run_to("/dev/full", "--man", NULL);
    assert_int_equal(R.code, 4);
    assert_string_equal(R.err, "qcal: cannot write to standard output: No space left on device\n");
}

/* A tensor of a dtype qcal does not read is skipped with a "warning:" line, as the other
 * warnings are. */
static void test_warning_label(void **state)
{
    (void)state;
    run("stats", "model.safetensors", NULL);
    expect_ok();
    assert_string_equal(R.err, "qcal: stats: warning: skipping 'steps' (dtype I64)\n");
    run("compare-weights", "model.safetensors", NULL);
    expect_ok();
    assert_string_equal(R.err, "qcal: compare-weights: warning: skipping 'steps' (dtype I64)\n");
    run("calibrate", "--weights", "model.safetensors", "-o", "w.json", NULL);
    expect_ok();
    assert_string_equal(R.err, "qcal: calibrate: warning: skipping 'steps' (dtype I64)\n");
}

/* Every option that takes a value, given twice: a usage error naming it (as a repeated
 * observer option is), except the options meant to repeat (calibrate --weights, qdq
 * --exclude). */
static void test_repeated_options(void **state)
{
    (void)state;
    run("--list-options", NULL);
    expect_ok();
    static char list[1 << 16];
    snprintf(list, sizeof list, "%s", R.out);
    int tried = 0;
    char *save = NULL;
    for (char *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char sub[64], opt[64], val[16] = "";
        if (sscanf(line, "%63s %63s %15s", sub, opt, val) < 3 || strcmp(val, "VALUE"))
            continue;
        /* observer options: the library's key table says "KEY given twice" */
        bool observer_key = false;
        for (int64_t k = 0; k < qcal_observer_config_key_count(); k++) {
            char name[64];
            snprintf(name, sizeof name, "--%s", qcal_observer_config_key(k)->name);
            for (char *c = name; *c; c++)
                *c = *c == '_' ? '-' : *c;
            observer_key |= !strcmp(name, opt);
        }
        if (observer_key && strcmp(sub, "compare-weights"))
            continue;
        /* the options documented as repeatable */
        if (!strcmp(opt, "--weights") || !strcmp(opt, "--exclude") || !strcmp(opt, "--input") ||
            !strcmp(opt, "--carry"))
            continue;
        /* a value each option takes (the first is used before the second is seen) */
        const char *v = "1";
        if (!strcmp(opt, "--format"))
            v = !strcmp(sub, "evaluate") || !strcmp(sub, "compare-weights") ? "table" : "json";
        else if (!strcmp(opt, "--observers") || !strcmp(opt, "--observer"))
            v = "minmax";
        else if (!strcmp(opt, "--dtype"))
            v = "qint8";
        else if (!strcmp(opt, "--qscheme"))
            v = "per_tensor_affine";
        else if (!strcmp(opt, "--trt-version"))
            v = "8601";
        else if (!strcmp(opt, "--metric"))
            v = "top1";
        else if (!strcmp(opt, "--trt-algorithm"))
            v = "MinMaxCalibration";
        run(sub, opt, v, opt, v, NULL);
        char needle[96];
        snprintf(needle, sizeof needle, "%s given twice", opt);
        if (R.code != 2 || !strstr(R.err, needle))
            fail_msg("qcal %s %s %s %s %s: exit %d, stderr: %s", sub, opt, v, opt, v, R.code,
                     R.err);
        tried++;
    }
    assert_true(tried >= 40);
    /* the short alias and the long name are one option */
    run("quantize", "--scale", "1", "-o", "a.npy", "x.npy", "--output", "b.npy", NULL);
    expect_fail(2, "qcal: quantize: ", "--output given twice");
    run("quantize", "--scale", "0.1", "--scale", "0.2", "x.npy", "-o", "q.npy", NULL);
    expect_fail(2, "qcal: quantize: ", "--scale given twice");
    /* observer options, through the library's key table */
    run("observe", "--observer", "minmax", "--observer", "histogram", "x.npy", NULL);
    expect_fail(2, "qcal: observe: ", "observer given twice");
    /* --weights and --exclude repeat */
    run("qdq", "--exclude", "a*", "--exclude", "b*", NULL);
    assert_null(strstr(R.err, "given twice"));
    assert_non_null(strstr(R.err, "qcal: qdq: "));
    run("calibrate", "--weights", "model.safetensors", "--weights", "model.safetensors", "-o",
        "w2.json", NULL);
    assert_null(strstr(R.err, "given twice"));
}

/* --trt-algorithm: one of TensorRT's four names; --trt-version: 8.6.1 or the number. */
static void test_trt_options(void **state)
{
    (void)state;
    run("calibrate", "dump", "--format", "tensorrt", "-o", "h.cache", "--trt-algorithm", "Foo",
        NULL);
    expect_fail(2, "qcal: calibrate: ", "--trt-algorithm: unknown algorithm 'Foo' (expected "
                "one of EntropyCalibration2, MinMaxCalibration, EntropyCalibration, "
                "LegacyCalibration)");
    assert_int_equal(access(TMP("h.cache"), F_OK), -1);
    static const char *const algos[] = { "EntropyCalibration2", "MinMaxCalibration",
                                         "EntropyCalibration", "LegacyCalibration" };
    char head[64], want[64];
    for (int i = 0; i < 4; i++) {
        run("calibrate", "dump", "--format", "tensorrt", "-o", "h.cache", "--trt-algorithm",
            algos[i], NULL);
        expect_ok();
        tu_slurp(TMP("h.cache"), head, sizeof head);
        *strchr(head, '\n') = '\0';
        snprintf(want, sizeof want, "TRT-8601-%s", algos[i]);
        assert_string_equal(head, want);
    }
    static const char *const versions[][2] = {
        { "8.6.1", "TRT-8601-" }, { "8.2.3", "TRT-8203-" }, { "10.3.0", "TRT-100300-" },
        { "10.13.2", "TRT-101302-" }, { "8601", "TRT-8601-" }, { "100300", "TRT-100300-" },
    };
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        run("calibrate", "dump", "--format", "tensorrt", "-o", "h.cache", "--trt-version",
            versions[i][0], NULL);
        expect_ok();
        tu_slurp(TMP("h.cache"), head, sizeof head);
        if (strncmp(head, versions[i][1], strlen(versions[i][1])))
            fail_msg("--trt-version %s: header %s", versions[i][0], head);
    }
    /* convert takes the same forms */
    run("calibrate", "dump", "-o", "t.json", NULL);
    expect_ok();
    run("convert", "t.json", "--format", "tensorrt", "-o", "h2.cache", "--trt-version", "8.5.3",
        NULL);
    expect_ok();
    tu_slurp(TMP("h2.cache"), head, sizeof head);
    assert_int_equal(strncmp(head, "TRT-8503-", 9), 0);
    static const char *const bad[] = { "8.6", "8.6.1.2", "8.10.1", "8.6.100", "v8", "8.6.x",
                                       "", "0.1.2x" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run("calibrate", "dump", "--format", "tensorrt", "-o", "h3.cache", "--trt-version",
            bad[i], NULL);
        expect_fail(2, "qcal: calibrate: ", "MAJOR.MINOR.PATCH (8.6.1, 10.3.0)");
    }
}

static void test_empty_npy(void **state)
{
    (void)state;
    run("observe", "empty.npy", NULL);
    expect_fail(3, "qcal: observe: ", "'empty.npy' is empty (0 bytes)");
    run("quantize", "--scale", "1", "empty.npy", "-o", "q.npy", NULL);
    expect_fail(3, "qcal: quantize: ", "is empty");
    tu_write_bytes(TMP("short.npy"), "\x93NUM", 4);
    run("observe", "short.npy", NULL);
    expect_fail(3, "qcal: observe: ", "truncated .npy magic string (4 bytes)");
}

static void test_did_you_mean(void **state)
{
    (void)state;
    run("calibrat", NULL);
    expect_fail(2, "qcal: ", "unknown subcommand 'calibrat'; did you mean 'calibrate'?");
    run("help", "compare-weight", NULL);
    expect_fail(2, "qcal: ", "did you mean 'compare-weights'?");
    run("stat", NULL);
    expect_fail(2, "qcal: ", "did you mean 'stats'?");
    run("frobnicate", NULL);
    expect_fail(2, "qcal: ", "unknown subcommand 'frobnicate' (see 'qcal --help')");
    assert_null(strstr(R.err, "did you mean"));
}

/* convert needs --format and counts the entries each format holds. */
static void test_convert_counts(void **state)
{
    (void)state;
    run("calibrate", "dump", "-o", "c.json", NULL);
    expect_ok();
    run("convert", "c.json", "-o", "c2.json", NULL);
    expect_fail(2, "qcal: convert: ", "no --format");
    assert_int_equal(access(TMP("c2.json"), F_OK), -1);
    run("convert", "c.json", "--format", "tensorrt", "-o", "c.cache", NULL);
    expect_ok();
    static char body[1 << 14];
    tu_slurp(TMP("c.cache"), body, sizeof body);
    assert_int_equal(count_lines(body), 3);   /* header + 2 activations */
    assert_string_equal(R.out, "qcal: convert: wrote c.cache (tensorrt: 2 entries) from c.json\n");
    run("convert", "c.json", "--format", "json,tensorrt,ncnn", "-o", "cdir", NULL);
    expect_ok();
    assert_string_equal(R.out, "qcal: convert: wrote cdir (json: 3 entries, tensorrt: 2 "
                               "entries, ncnn: 3 entries) from c.json\n");
    tu_slurp(TMP("cdir/ncnn.table"), body, sizeof body);
    assert_int_equal(count_lines(body), 3);
    tu_slurp(TMP("cdir/tensorrt.cache"), body, sizeof body);
    assert_int_equal(count_lines(body), 3);
}

/* A rules file that matches every activation first: the observer options change nothing,
 * said once. */
static void test_rules_override_notice(void **state)
{
    (void)state;
    run("calibrate", "dump", "-o", "n.json", "--rules", "all.rules", "--observer", "histogram",
        "--bins", "256", NULL);
    expect_ok();
    assert_string_equal(R.err, "qcal: calibrate: note: the observer options change nothing: a "
                               "rule of 'all.rules' matches each of the 2 activations first "
                               "(first match wins)\n");
    run("calibrate", "dump", "-o", "n.json", "--rules", "one.rules", "--observer", "histogram",
        NULL);
    expect_ok();
    assert_string_equal(R.err, "");
    run("calibrate", "dump", "-o", "n.json", "--rules", "all.rules", NULL);
    expect_ok();
    assert_string_equal(R.err, "");
}

/* merge: the same file twice is refused; a copy (same digest) is merged with a warning. */
static void test_merge_same_file(void **state)
{
    (void)state;
    run("calibrate", "dump", "-o", "a.json", "--save-state", "a.state", NULL);
    expect_ok();
    run("merge", "a.state", "a.state", "-o", "mm.json", NULL);
    expect_fail(2, "qcal: merge: ", "'a.state' and 'a.state' are the same file");
    run("merge", "a.state", "./a.state", "-o", "mm.json", NULL);
    expect_fail(2, "qcal: merge: ", "'a.state' and './a.state' are the same file");
    assert_int_equal(access(TMP("mm.json"), F_OK), -1);
    size_t len = 0;
    void *buf = tu_read_file(TMP("a.state"), &len);
    tu_write_bytes(TMP("copy.state"), buf, len);
    free(buf);
    run("merge", "a.state", "copy.state", "-o", "mm.json", NULL);
    expect_ok();
    tu_expect_one_line(R.err, "qcal: merge: warning: ", "'a.state' and 'copy.state' have the "
                       "same digest");
    assert_non_null(strstr(R.err, "the same data is counted twice"));
    /* observer states alike */
    run("observe", "x.npy", "--save-state", "o.state", NULL);
    expect_ok();
    run("merge", "o.state", "o.state", NULL);
    expect_fail(2, "qcal: merge: ", "are the same file");
    assert_string_equal(R.out, "");
    /* different data: no warning */
    run("calibrate", "dumpb", "-o", "b.json", "--save-state", "b.state", NULL);
    expect_ok();
    run("merge", "a.state", "b.state", "-o", "m2.json", NULL);
    expect_ok();
    assert_string_equal(R.err, "");
}

/* stats: a dump's activations are t=act, its weights t=param; a name held by two inputs
 * names its input. */
static void test_stats_labels(void **state)
{
    (void)state;
    run("stats", "dump", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "t=act, c=0, fqn='act', "));
    assert_non_null(strstr(R.out, "t=param, c=1, fqn='fc.weight', "));
    assert_non_null(strstr(R.out, "t=act, c=2, fqn='relu', "));
    assert_null(strstr(R.out, "t=param, c=0"));
    run("stats", "dump", "dumpb", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "t=act, c=0, fqn='dump:act', "));
    assert_non_null(strstr(R.out, "fqn='fc.weight', "));
    assert_non_null(strstr(R.out, "fqn='relu', "));
    assert_non_null(strstr(R.out, "t=act, c=3, fqn='dumpb:act', "));
    assert_int_equal(count_lines(R.out), 4);
    /* one input: names as they are */
    run("stats", "dumpb", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "fqn='act', "));
}

/* compare-weights skips tensors under 2 dimensions and counts them, as calibrate --weights
 * does. */
static void test_compare_weights_skips_1d(void **state)
{
    (void)state;
    run("compare-weights", "--format", "json", "model.safetensors", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "\"name\": \"fc.weight\""));
    assert_null(strstr(R.out, "\"name\": \"fc.bias\""));
    assert_non_null(strstr(R.out, "\"skipped_under_2d\": [\"fc.bias\"]}"));
    run("compare-weights", "model.safetensors", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "1 tensor: 1 compared, 0 with no finite value (not "
                                  "compared), 0 with NaN/Inf skipped; 0 NaN/Inf values in all; 1 "
                                  "tensor under 2 dimensions skipped\n"));
    run("calibrate", "--weights", "model.safetensors", "-o", "cw.json", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "1 safetensors weight (1 tensor under 2 dimensions skipped)"));
}

/* A count of 1 takes the singular everywhere a summary prints one ("1 ops quantized", "1
 * linears", "1 tensors" before); 0 and 2 the plural. */
static void test_plural_forms(void **state)
{
    (void)state;
    int64_t s1[1] = { 4 };
    assert_int_equal(mkdir(TMP("one"), 0755), 0);
    write_f32(TMP("one/a.npy"), 1, s1, -1.0f, 0.5f);
    run("calibrate", "one", "-o", "one.json", NULL);
    expect_ok();
    assert_string_equal(R.out, "qcal: calibrate: wrote one.json (json): 1 activation, 0 weights "
                               "from 1 file; 0 non-finite values skipped\n");
    run("calibrate", "one", "-o", "one.json", "--save-state", "one.state", NULL);
    expect_ok();
    run("merge", "one.state", "-o", "m1.json", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, ": 1 activation, 0 weights from 1 state; 0 non-finite values"));
    run("report", "one", "-o", "one.html", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, "(1 tensor)\n"));
    run("calibrate", "dump", "-o", "two.json", NULL);
    expect_ok();
    assert_non_null(strstr(R.out, ": 2 activations, 1 weight from 3 files;"));
}

/* An activation whose range divided by the quantized range is below eps gets scale eps: one
 * warning counting them, with the first names (an untrained export, activations ~1e-9). */
static void test_eps_clamp_warning(void **state)
{
    (void)state;
    int64_t s4[1] = { 4 };
    assert_int_equal(mkdir(TMP("tiny"), 0755), 0);
    write_f32(TMP("tiny/t1.npy"), 1, s4, -1e-9f, 1e-9f);
    write_f32(TMP("tiny/t2.npy"), 1, s4, 0.0f, 2e-9f);
    write_f32(TMP("tiny/zbig.npy"), 1, s4, -1.0f, 0.5f);
    run("calibrate", "tiny", "-o", "tiny.json", "--observer", "minmax", NULL);
    expect_ok();
    assert_string_equal(R.err, "qcal: calibrate: warning: 2 tensors have ranges so small their "
                               "scale was clamped to eps (1.1920929e-07): 't1', 't2'\n");
    run("calibrate", "tiny", "-o", "tiny.json", "--observer", "minmax", "--eps", "1e-12", NULL);
    expect_ok();
    assert_string_equal(R.err, "");
    run("calibrate", "dump", "-o", "d.json", NULL);
    expect_ok();
    assert_null(strstr(R.err, "clamped"));
}

/* An unknown option close to one of the subcommand's gets a suggestion, as an unknown
 * subcommand does; -q is --quiet wherever --quiet exists. */
static void test_option_did_you_mean(void **state)
{
    (void)state;
    run("calibrate", "dump", "--outptu", "x.json", NULL);
    expect_fail(2, "qcal: calibrate: ", "unknown option '--outptu' (did you mean '--output'?)");
    run("observe", "--percentil", "50", "x.npy", NULL);
    expect_fail(2, "qcal: observe: ", "unknown option '--percentil' (did you mean '--percentile'?)");
    run("qdq", "m.onnx", "--tabel", "t.json", NULL);
    expect_fail(2, "qcal: qdq: ", "unknown option '--tabel' (did you mean '--table'?)");
    run("stats", "--frobnicate", NULL);
    expect_fail(2, "qcal: stats: ", "unknown option '--frobnicate' (see 'qcal stats --help')");
    run("--list-options", NULL);
    expect_ok();
    /* every subcommand with --quiet also takes -q */
    for (const char *l = R.out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        const char *q = strstr(l, " --quiet");
        const char *e = strchr(l, '\n');
        if (q && (!e || q < e) && !(strstr(l, " -q") && strstr(l, " -q") < (e ? e : l + strlen(l))))
            fail_msg("--quiet without -q: %.*s", (int)(e ? e - l : (ptrdiff_t)strlen(l)), l);
    }
    assert_non_null(strstr(R.out, "equalize --quiet -q\n"));
}

/* docs/cli.md, calibrate's exit 3: per-tensor observers take batches of any shape; a
 * per-channel observer refuses another channel count, not another shape. */
static void test_shape_change_policy(void **state)
{
    (void)state;
    if (mkdir(TMP("sd"), 0755) || mkdir(TMP("sd/a"), 0755) || mkdir(TMP("sd/b.weight"), 0755))
        fail_msg("mkdir");
    int64_t s1[2] = { 16, 32 }, s2[2] = { 16, 33 }, s3[2] = { 17, 32 };
    write_f32(TMP("sd/a/0.npy"), 2, s1, -1.0f, 0.001f);
    write_f32(TMP("sd/a/1.npy"), 2, s2, -1.0f, 0.001f);
    write_f32(TMP("sd/b.weight/0.npy"), 2, s1, -1.0f, 0.001f);
    write_f32(TMP("sd/b.weight/1.npy"), 2, s2, -1.0f, 0.001f);
    run("calibrate", "sd", "-o", "sd.json", NULL);
    expect_ok();
    write_f32(TMP("sd/b.weight/1.npy"), 2, s3, -1.0f, 0.001f);
    run("calibrate", "sd", "-o", "sd.json", NULL);
    expect_fail(3, "qcal: calibrate: ", "batch has 17 channels along axis 0 but the observer "
                "has 16");
    static char doc[1 << 16];
    tu_slurp(tu_path(getenv("QCAL_SOURCE_ROOT"), "docs/cli.md"), doc, sizeof doc);
    assert_null(strstr(doc, "a shape change"));
    assert_non_null(strstr(doc, "(16, 33) after (16, 32)"));
}

/* qcal report on the JSON 'qcal compare --format json' writes (told by content): the page
 * with the ops in order; a malformed one exits 3 naming the file; the dump-only options are
 * usage errors; an unwritable page exits 4. */
static void test_report_compare(void **state)
{
    (void)state;
    const char *js = "{\"float\": \"f.onnx\", \"quantized\": \"q.onnx\", \"engine\": \"1.30.0\", "
                     "\"samples\": 4, \"metric\": null, \"sqnr_db\": \"inf\", \"outputs\": [{\"name\": "
                     "\"y\", \"sqnr_db\": \"inf\", \"cosine\": 1, \"top1_agreement\": 1, "
                     "\"exact_agreement\": 1, \"accuracy_float\": null, \"accuracy_quantized\": null}], "
                     "\"sensitivity_samples\": 4, \"gated_sqnr_db\": 20.5, \"ops\": [{\"name\": \"B\", "
                     "\"op_type\": \"Mul\", \"sqnr_alone_db\": 9.5, \"sqnr_all_but_db\": 40}, {\"name\": "
                     "\"A\", \"op_type\": \"Conv\", \"sqnr_alone_db\": 31, \"sqnr_all_but_db\": null}], "
                     "\"runs\": 9, \"seconds\": 0.5}\n";
    tu_write_bytes(TMP("cmp.json"), js, strlen(js));
    run("report", "cmp.json", "-o", "cmp.html", "--title", "T", NULL);
    expect_ok();
    assert_string_equal(R.out, "qcal: report: wrote cmp.html (1 output, 2 ops)\n");
    assert_string_equal(R.err, "");
    char *h = tu_read_file(TMP("cmp.html"), NULL);
    const char *b = strstr(h, "<title>B (Mul)"), *a = strstr(h, "<title>A (Conv)");
    assert_true(b && a && b < a);
    assert_non_null(strstr(h, "<title>T</title>"));
    free(h);
    tu_write_bytes(TMP("cmp_bad.json"), js, 120);
    run("report", "cmp_bad.json", "-o", "x.html", NULL);
    expect_fail(3, "qcal: report: ", "cmp_bad.json: compare report: JSON");
    tu_write_bytes(TMP("cmp_other.json"), "{\"entries\": []}", 15);
    run("report", "cmp_other.json", "-o", "x.html", NULL);
    expect_fail(3, "qcal: report: ", "cmp_other.json: not a qcal compare report");
    assert_int_equal(tu_count_entries(tmp_dir, "x.html"), 0);
    run("report", "cmp.json", "-o", "x.html", "--observers", "minmax", NULL);
    expect_fail(2, "qcal: report: ", "--observers applies to a dump directory");
    run("report", "cmp.json", "-o", "x.html", "--save-state", "s.qcev", NULL);
    expect_fail(2, "qcal: report: ", "--save-state applies to a dump directory");
    run("report", "cmp.json", "-o", "nodir/x.html", NULL);
    expect_fail(4, "qcal: report: ", "nodir/x.html");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_doubled_prefix),
        cmocka_unit_test(test_success_form),
        cmocka_unit_test(test_write_reason),
        cmocka_unit_test(test_warning_label),
        cmocka_unit_test(test_repeated_options),
        cmocka_unit_test(test_trt_options),
        cmocka_unit_test(test_empty_npy),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_convert_counts),
        cmocka_unit_test(test_rules_override_notice),
        cmocka_unit_test(test_merge_same_file),
        cmocka_unit_test(test_stats_labels),
        cmocka_unit_test(test_compare_weights_skips_1d),
        cmocka_unit_test(test_shape_change_policy),
        cmocka_unit_test(test_plural_forms),
        cmocka_unit_test(test_eps_clamp_warning),
        cmocka_unit_test(test_option_did_you_mean),
        cmocka_unit_test(test_report_compare),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
