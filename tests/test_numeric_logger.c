/* unit.numeric_logger: the statistics logger of numeric/logger.c through the public API:
 * the exact line format of the stream sink (including the empty-record policy), the
 * counter, the CSV file read back and compared number by number with the library's own
 * statistics, the .npy dump directory (read back with qcal's reader, and with numpy when
 * /usr/bin/python3 has it), the callback's record and tensor, failing sinks, and
 * bit-identical records for 1 and 2 threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/npy.h"
#include "qcal/numeric.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

/* ---- helpers ------------------------------------------------------------------------- */

static void make_tmpdir(char *buf, size_t cap)
{
    snprintf(buf, cap, "/tmp/qcal_test_logger_XXXXXX");
    assert_non_null(mkdtemp(buf));
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Deterministic pseudo-random floats in [lo, hi). */
static void fill(float *x, int64_t n, uint64_t seed, double lo, double hi)
{
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)(lo + (hi - lo) * ((double)(r >> 11) / 9007199254740992.0));
    }
}

/* Compares two strings; on failure prints both and the first differing offset. */
static void expect_text(const char *got, const char *want)
{
    if (strcmp(got, want)) {
        size_t k = 0;
        while (got[k] && got[k] == want[k])
            k++;
        print_error("text differs at offset %zu:\n--- got\n%s--- want\n%s", k, got, want);
        fail();
    }
}

/* Splits one CSV line (RFC 4180 quoting, no embedded newlines) into at most cap fields,
 * written into store; returns the field count. */
static int csv_split(const char *line, char fields[][256], int cap)
{
    int n = 0;
    const char *p = line;
    for (;;) {
        assert_true(n < cap);
        size_t k = 0;
        if (*p == '"') {
            p++;
            for (;;) {
                assert_true(*p != '\0');
                if (*p == '"' && p[1] == '"') {
                    fields[n][k++] = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    fields[n][k++] = *p++;
                }
                assert_true(k < 255);
            }
        } else {
            while (*p && *p != ',' && *p != '\n' && *p != '\r') {
                fields[n][k++] = *p++;
                assert_true(k < 255);
            }
        }
        fields[n++][k] = '\0';
        if (*p != ',')
            break;
        p++;
    }
    return n;
}

/* ---- the stream sink: exact line format ------------------------------------------------ */

static void test_line_format(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    assert_non_null(mem);
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    assert_null(o.stream);
    assert_null(o.csv_path);
    assert_null(o.npy_dir);
    assert_null(o.callback);
    o.stream = mem;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);

    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t sh[2] = {2, 3};
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, a, 2, sh), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_PARAM, "fc1.weight", NULL, NULL, &t), QCAL_OK);
    /* the example record: activation of a linear layer, extra MKN=M|K|N */
    assert_int_equal(qcal_numeric_logger_log_linear(lg, "fc1", NULL, 64, 3136, 128, &t), QCAL_OK);
    float b[3] = {NAN, 1.5f, INFINITY};
    int64_t sb = 3;
    assert_int_equal(qcal_tensor_init(&t, b, 1, &sb), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "blocks.0.relu", "relu", NULL, &t), QCAL_OK);
    /* empty tensor and an all-NaN tensor: n=0 and empty statistic fields, never inf */
    int64_t se[2] = {0, 4};
    assert_int_equal(qcal_tensor_init(&t, NULL, 2, se), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_PARAM, "empty", NULL, NULL, &t), QCAL_OK);
    float nn[2] = {NAN, -INFINITY};
    int64_t sn = 2;
    assert_int_equal(qcal_tensor_init(&t, nn, 1, &sn), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "bad", "conv", "custom", &t), QCAL_OK);
    /* a 0-d tensor: extra is "scalar" */
    float sc = -0.25f;
    assert_int_equal(qcal_tensor_init(&t, &sc, 0, NULL), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_PARAM, "s", "", NULL, &t), QCAL_OK);
    /* from precomputed statistics */
    qcal_numeric_stats st;
    qcal_numeric_stats_init(&st);
    float c4[4] = {-2, 0, 2, 8};
    qcal_numeric_stats_update(&st, c4, 4);
    int64_t s4 = 4;
    assert_int_equal(qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_PARAM, "w", "op", NULL, 1, &s4, &st),
                     QCAL_OK);
    assert_int_equal(qcal_numeric_logger_finish(lg), QCAL_OK);
    qcal_numeric_logger_destroy(&lg);
    assert_null(lg);
    fclose(mem);
    /* std of 1..6 (unbiased) = sqrt(3.5) = 1.87083; of {-2,0,2,8} = sqrt(56/3) = 4.32049 */
    expect_text(text,
        "t=param, c=0, fqn='fc1.weight', op='', extra='2x3', min=1, max=6, absmax=6, avg=3.5, std=1.87083\n"
        "t=act, c=1, fqn='fc1', op='linear', extra='MKN=64|3136|128', min=1, max=6, absmax=6, avg=3.5, std=1.87083\n"
        "t=act, c=2, fqn='blocks.0.relu', op='relu', extra='3', min=1.5, max=1.5, absmax=1.5, avg=1.5, std=0, nonfinite=2\n"
        "t=param, c=3, fqn='empty', op='', extra='0x4', n=0, min=, max=, absmax=, avg=, std=\n"
        "t=act, c=4, fqn='bad', op='conv', extra='custom', n=0, min=, max=, absmax=, avg=, std=, nonfinite=2\n"
        "t=param, c=5, fqn='s', op='', extra='scalar', min=-0.25, max=-0.25, absmax=0.25, avg=-0.25, std=0\n"
        "t=param, c=6, fqn='w', op='op', extra='4', min=-2, max=8, absmax=8, avg=2, std=4.32049\n");
    free(text);
}

/* ---- counter, argument checks, state ---------------------------------------------------- */

static int fail_after;
static qcal_status failing_cb(const qcal_numeric_log_record *rec, const qcal_tensor *x, void *user)
{
    (void)x;
    (void)user;
    return rec->c >= fail_after ? QCAL_ERR_IO : QCAL_OK;
}

static void test_counter(void **state)
{
    (void)state;
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);   /* no sink at all: still counts */
    float v[5] = {1, 2, 3, 4, 5};
    int64_t n = 5;
    qcal_tensor t;
    qcal_tensor_init(&t, v, 1, &n);
    int64_t c = -1;
    assert_int_equal(qcal_numeric_logger_count(lg, &c), QCAL_OK);
    assert_int_equal(c, 0);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(qcal_numeric_logger_log(lg, i % 2 ? QCAL_NUMERIC_LOG_ACT : QCAL_NUMERIC_LOG_PARAM, "loop", NULL,
                                         NULL, &t), QCAL_OK);
        assert_int_equal(qcal_numeric_logger_count(lg, &c), QCAL_OK);
        assert_int_equal(c, i + 1);
    }
    /* rejected calls do not count */
    assert_int_equal(qcal_numeric_logger_log(lg, (qcal_numeric_log_kind)7, "x", NULL, NULL, &t),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "x", NULL, NULL, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_log_linear(lg, "x", NULL, -1, 2, 3, &t), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_ACT, "x", NULL, NULL, 1, &n, NULL),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_ACT, "x", NULL, NULL, 99, &n, NULL),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_count(lg, &c), QCAL_OK);
    assert_int_equal(c, 10);
    assert_int_equal(qcal_numeric_logger_count(NULL, &c), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_numeric_logger_finish(lg), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_finish(lg), QCAL_ERR_STATE);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "late", NULL, NULL, &t), QCAL_ERR_STATE);
    qcal_numeric_logger_destroy(&lg);
    qcal_numeric_logger_destroy(&lg);   /* NULL is fine */
    qcal_numeric_logger_destroy(NULL);
    assert_int_equal(qcal_numeric_logger_create(NULL, &lg), QCAL_ERR_INVALID_ARG);

    /* a failing sink fails the call, but the record number is spent (never reused) */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    o.stream = mem;
    o.callback = failing_cb;
    fail_after = 1;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "a", NULL, NULL, &t), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "b", NULL, NULL, &t), QCAL_ERR_IO);
    fail_after = 100;
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "c", NULL, NULL, &t), QCAL_OK);
    assert_int_equal(qcal_numeric_logger_count(lg, &c), QCAL_OK);
    assert_int_equal(c, 3);
    qcal_numeric_logger_destroy(&lg);
    fclose(mem);
    assert_non_null(strstr(text, "c=0, fqn='a'"));
    assert_non_null(strstr(text, "c=1, fqn='b'"));
    assert_non_null(strstr(text, "c=2, fqn='c'"));
    free(text);
}

/* ---- CSV sink: read back, compare numbers -------------------------------------------- */

static void test_csv_round_trip(void **state)
{
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    char csv[128];
    snprintf(csv, sizeof csv, "%s/log.csv", dir);
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    o.csv_path = csv;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);

    enum { NT = 5 };
    const int64_t sizes[NT] = {1000, 1, 77777, 0, 3};
    const char *names[NT] = {"blocks.0.fc", "odd,name \"q\"", "big", "empty", "nan"};
    qcal_numeric_stats want[NT];
    float *bufs[NT];
    for (int k = 0; k < NT; k++) {
        bufs[k] = malloc((size_t)(sizes[k] ? sizes[k] : 1) * sizeof(float));
        assert_non_null(bufs[k]);
        fill(bufs[k], sizes[k], (uint64_t)k + 1, -3.0 - k, 5.0 + 0.1 * k);
        if (k == 4)
            bufs[k][1] = NAN;
        qcal_numeric_stats_init(&want[k]);
        qcal_numeric_stats_update(&want[k], bufs[k], sizes[k]);
        qcal_tensor t;
        int64_t n = sizes[k];
        qcal_tensor_init(&t, bufs[k], 1, &n);
        if (k == 2) {
            assert_int_equal(qcal_numeric_logger_log_linear(lg, names[k], "matmul", 7, 11111, 5, &t),
                             QCAL_OK);
        } else {
            assert_int_equal(qcal_numeric_logger_log(lg, k % 2 ? QCAL_NUMERIC_LOG_ACT : QCAL_NUMERIC_LOG_PARAM, names[k],
                                             "op", NULL, &t), QCAL_OK);
        }
    }
    /* nothing is visible before finish (atomic commit) */
    assert_int_equal(access(csv, F_OK), -1);
    assert_int_equal(qcal_numeric_logger_finish(lg), QCAL_OK);
    qcal_numeric_logger_destroy(&lg);

    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[2048];
    static char fld[16][256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "t,c,fqn,op,extra,shape,count,nonfinite,min,max,absmax,mean,std\n");
    for (int k = 0; k < NT; k++) {
        assert_non_null(fgets(line, sizeof line, f));
        assert_int_equal(csv_split(line, fld, 16), 13);
        assert_string_equal(fld[0], k % 2 ? "act" : (k == 2 ? "act" : "param"));
        assert_int_equal(strtoll(fld[1], NULL, 10), k);
        assert_string_equal(fld[2], names[k]);
        assert_string_equal(fld[3], k == 2 ? "matmul" : "op");
        char shp[32];
        snprintf(shp, sizeof shp, "%lld", (long long)sizes[k]);
        assert_string_equal(fld[4], k == 2 ? "MKN=7|11111|5" : shp);
        assert_string_equal(fld[5], shp);
        assert_int_equal(strtoll(fld[6], NULL, 10), want[k].count);
        assert_int_equal(strtoull(fld[7], NULL, 10), want[k].nonfinite);
        if (want[k].count == 0) {
            for (int j = 8; j < 13; j++)
                assert_string_equal(fld[j], "");   /* empty policy: no inf/-inf */
            continue;
        }
        /* floats printed %.9g and doubles %.17g read back bit-exact */
        double sd;
        qcal_numeric_stats_std(&want[k], &sd);
        float mn = strtof(fld[8], NULL), mx = strtof(fld[9], NULL), am = strtof(fld[10], NULL);
        double mean = strtod(fld[11], NULL), sdv = strtod(fld[12], NULL);
        if (mn != want[k].min || mx != want[k].max || am != want[k].absmax ||
            mean != want[k].mean || sdv != sd) {
            print_error("record %d: csv min %.9g max %.9g absmax %.9g mean %.17g std %.17g\n"
                        "  library  min %.9g max %.9g absmax %.9g mean %.17g std %.17g\n", k,
                        (double)mn, (double)mx, (double)am, mean, sdv, (double)want[k].min,
                        (double)want[k].max, (double)want[k].absmax, want[k].mean, sd);
            fail();
        }
    }
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
    for (int k = 0; k < NT; k++)
        free(bufs[k]);

    /* a logger destroyed without finish leaves no CSV behind */
    char csv2[128];
    snprintf(csv2, sizeof csv2, "%s/unfinished.csv", dir);
    o.csv_path = csv2;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    qcal_numeric_logger_destroy(&lg);
    assert_int_equal(access(csv2, F_OK), -1);
    /* an unwritable CSV path fails create */
    o.csv_path = "/nonexistent-dir-qcal/x.csv";
    assert_true(qcal_numeric_logger_create(&o, &lg) < 0);
    assert_null(lg);
    rm_tree(dir);
}

/* ---- .npy dump directory -------------------------------------------------------------- */

typedef struct dump_case {
    const char *fqn;
    const char *file;      /* expected file name */
    int32_t ndim;
    int64_t shape[3];
} dump_case;

static const dump_case dumps[] = {
    {"fc1.weight", "000000_fc1.weight.npy", 2, {3, 4, 0}},
    {"blocks/0 attn:q", "000001_blocks_0_attn_q.npy", 3, {2, 1, 3}},
    {"scalar-x", "000002_scalar-x.npy", 0, {0, 0, 0}},
    {"", "000004_.npy", 1, {5, 0, 0}},   /* c=3 is a stats-only record: no file */
};
#define N_DUMPS (sizeof dumps / sizeof dumps[0])

static void dump_data(size_t k, float *x, int64_t n)
{
    fill(x, n, 100 + k, -1.0, 1.0);
    if (k == 3)
        x[2] = NAN;   /* dumps keep the tensor as given, NaN included */
}

static void write_dumps(const char *dir)
{
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    o.npy_dir = dir;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    for (size_t k = 0; k < N_DUMPS; k++) {
        if (k == 3) {
            qcal_numeric_stats st;
            qcal_numeric_stats_init(&st);
            int64_t one = 1;
            assert_int_equal(qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_ACT, "stats_only", NULL, NULL, 1,
                                                   &one, &st), QCAL_OK);
        }
        float x[64];
        qcal_tensor t;
        assert_int_equal(qcal_tensor_init(&t, x, dumps[k].ndim, dumps[k].shape), QCAL_OK);
        int64_t n;
        qcal_tensor_numel(&t, &n);
        dump_data(k, x, n);
        assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, dumps[k].fqn, NULL, NULL, &t), QCAL_OK);
    }
    assert_int_equal(qcal_numeric_logger_finish(lg), QCAL_OK);
    qcal_numeric_logger_destroy(&lg);
}

static void test_npy_dumps(void **state)
{
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    write_dumps(dir);
    /* exactly one file per tensor record */
    DIR *d = opendir(dir);
    assert_non_null(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        files += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, (int)N_DUMPS);
    for (size_t k = 0; k < N_DUMPS; k++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, dumps[k].file);
        qcal_npy_array a;
        if (qcal_npy_read_f32(p, &a) != QCAL_OK) {
            print_error("cannot read dump %s: %s\n", p, qcal_last_error());
            fail();
        }
        assert_int_equal(a.ndim, dumps[k].ndim);
        for (int32_t j = 0; j < a.ndim; j++)
            assert_int_equal(a.shape[j], dumps[k].shape[j]);
        float x[64];
        dump_data(k, x, a.numel);
        assert_memory_equal(a.data, x, (size_t)a.numel * sizeof(float));
        qcal_npy_array_free(&a);
    }
    /* a missing directory fails the log call with an error, not a crash */
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    char missing[128];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    o.npy_dir = missing;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    float v = 1;
    qcal_tensor t;
    qcal_tensor_init(&t, &v, 0, NULL);
    assert_true(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "x", NULL, NULL, &t) < 0);
    assert_true(strlen(qcal_last_error()) > 0);
    qcal_numeric_logger_destroy(&lg);
    rm_tree(dir);
}

/* numpy reads the dumps: shape, dtype and every value (skipped without python3+numpy). */
static void test_npy_dumps_numpy(void **state)
{
    (void)state;
    const char *py = "/usr/bin/python3";
    if (access(py, X_OK) != 0 || system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        print_message("[  SKIP    ] /usr/bin/python3 with numpy not available\n");
        skip();
    }
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    write_dumps(dir);
    char cmd[4096];
    int k = snprintf(cmd, sizeof cmd,
                     "%s -c 'import sys, numpy as np\n"
                     "for p in sys.argv[1:]:\n"
                     "    a = np.load(p)\n"
                     "    print(a.dtype.str, a.shape, \" \".join(repr(float(v)) for v in a.ravel()))\n'",
                     py);
    for (size_t j = 0; j < N_DUMPS; j++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, " %s/%s", dir, dumps[j].file);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[8192];
    for (size_t j = 0; j < N_DUMPS; j++) {
        assert_non_null(fgets(line, sizeof line, p));
        /* "<f4 (3, 4) v0 v1 ..." */
        assert_memory_equal(line, "<f4 (", 5);
        char want_shape[64];
        if (dumps[j].ndim == 0)
            snprintf(want_shape, sizeof want_shape, "()");
        else if (dumps[j].ndim == 1)
            snprintf(want_shape, sizeof want_shape, "(%lld,)", (long long)dumps[j].shape[0]);
        else if (dumps[j].ndim == 2)
            snprintf(want_shape, sizeof want_shape, "(%lld, %lld)", (long long)dumps[j].shape[0],
                     (long long)dumps[j].shape[1]);
        else
            snprintf(want_shape, sizeof want_shape, "(%lld, %lld, %lld)",
                     (long long)dumps[j].shape[0], (long long)dumps[j].shape[1],
                     (long long)dumps[j].shape[2]);
        if (strncmp(line + 4, want_shape, strlen(want_shape))) {
            print_error("dump %s: numpy says [%s], want shape %s\n", dumps[j].file, line, want_shape);
            fail();
        }
        int64_t n = 1;
        for (int32_t d = 0; d < dumps[j].ndim; d++)
            n *= dumps[j].shape[d];
        float x[64];
        dump_data(j, x, n);
        char *q = line + 4 + strlen(want_shape);
        for (int64_t i = 0; i < n; i++) {
            char *end;
            double v = strtod(q, &end);
            assert_true(end != q);
            q = end;
            if (!(v == (double)x[i] || (isnan(v) && isnan(x[i])))) {
                print_error("dump %s element %lld: numpy %.17g, logged %.17g\n", dumps[j].file,
                            (long long)i, v, (double)x[i]);
                fail();
            }
        }
    }
    assert_int_equal(pclose(p), 0);
    rm_tree(dir);
}

/* ---- callback ---------------------------------------------------------------------------- */

typedef struct cb_seen {
    int calls;
    const qcal_tensor *last_x;
    qcal_numeric_log_record rec[4];
    char fqn[4][64], op[4][64], extra[4][64];
} cb_seen;

static qcal_status record_cb(const qcal_numeric_log_record *rec, const qcal_tensor *x, void *user)
{
    cb_seen *s = user;
    if (s->calls < 4) {
        s->rec[s->calls] = *rec;
        /* strings are valid during the call only: copy them */
        snprintf(s->fqn[s->calls], 64, "%s", rec->fqn);
        snprintf(s->op[s->calls], 64, "%s", rec->op);
        snprintf(s->extra[s->calls], 64, "%s", rec->extra);
    }
    s->last_x = x;
    s->calls++;
    return QCAL_OK;
}

static void test_callback(void **state)
{
    (void)state;
    cb_seen seen;
    memset(&seen, 0, sizeof seen);
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    o.callback = record_cb;
    o.user = &seen;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    float x[24];
    fill(x, 24, 9, -2, 3);
    x[5] = INFINITY;
    int64_t sh[3] = {2, 3, 4};
    qcal_tensor t;
    qcal_tensor_init(&t, x, 3, sh);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "conv1", "conv2d", NULL, &t), QCAL_OK);
    assert_ptr_equal(seen.last_x, &t);
    assert_int_equal(seen.calls, 1);
    const qcal_numeric_log_record *r = &seen.rec[0];
    assert_int_equal(r->t, QCAL_NUMERIC_LOG_ACT);
    assert_int_equal(r->c, 0);
    assert_string_equal(seen.fqn[0], "conv1");
    assert_string_equal(seen.op[0], "conv2d");
    assert_string_equal(seen.extra[0], "2x3x4");
    assert_int_equal(r->ndim, 3);
    assert_int_equal(r->shape[0], 2);
    assert_int_equal(r->shape[2], 4);
    qcal_numeric_stats want;
    qcal_numeric_stats_init(&want);
    qcal_numeric_stats_update(&want, x, 24);
    assert_memory_equal(&r->stats, &want, sizeof want);
    assert_int_equal(r->stats.count, 23);
    assert_int_equal(r->stats.nonfinite, 1);
    double sd;
    qcal_numeric_stats_std(&want, &sd);
    assert_true(r->std == sd);
    /* log_linear: extra MKN, op defaults to "linear" */
    assert_int_equal(qcal_numeric_logger_log_linear(lg, "fc", NULL, 4, 6, 10, &t), QCAL_OK);
    assert_string_equal(seen.extra[1], "MKN=4|6|10");
    assert_string_equal(seen.op[1], "linear");
    assert_int_equal(seen.rec[1].c, 1);
    /* stats-only records give the callback x == NULL */
    assert_int_equal(qcal_numeric_logger_log_stats(lg, QCAL_NUMERIC_LOG_PARAM, NULL, NULL, "e", 3, sh, &want),
                     QCAL_OK);
    assert_null(seen.last_x);
    assert_string_equal(seen.fqn[2], "");
    assert_string_equal(seen.extra[2], "e");
    assert_int_equal(seen.rec[2].t, QCAL_NUMERIC_LOG_PARAM);
    assert_memory_equal(&seen.rec[2].stats, &want, sizeof want);
    assert_int_equal(seen.calls, 3);
    qcal_numeric_logger_destroy(&lg);
}

/* ---- determinism: 1 vs 2 threads ---------------------------------------------------------- */

static void log_big(const float *x, int64_t n, char **text, qcal_numeric_stats *st)
{
    size_t len = 0;
    FILE *mem = open_memstream(text, &len);
    cb_seen seen;
    memset(&seen, 0, sizeof seen);
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    o.stream = mem;
    o.callback = record_cb;
    o.user = &seen;
    qcal_numeric_logger *lg = NULL;
    assert_int_equal(qcal_numeric_logger_create(&o, &lg), QCAL_OK);
    qcal_tensor t;
    qcal_tensor_init(&t, x, 1, &n);
    assert_int_equal(qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, "big", NULL, NULL, &t), QCAL_OK);
    qcal_numeric_logger_destroy(&lg);
    fclose(mem);
    *st = seen.rec[0].stats;
}

static void test_thread_determinism(void **state)
{
    (void)state;
    int64_t n = (3 << 20) + 4097;   /* many superblocks: OpenMP splits it with 2 threads */
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    fill(x, n, 42, 1000.0, 1000.5);   /* large mean, small spread: stability matters */
    x[12345] = NAN;
    char *t1 = NULL, *t2 = NULL;
    qcal_numeric_stats s1, s2;
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(1);
#endif
    log_big(x, n, &t1, &s1);
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(2);
#endif
    log_big(x, n, &t2, &s2);
    assert_memory_equal(&s1, &s2, sizeof s1);
    expect_text(t2, t1);
    assert_int_equal(s1.count, n - 1);
    assert_int_equal(s1.nonfinite, 1);
    /* the one-pass statistics agree with a two-pass double evaluation */
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]))
            sum += x[i];
    double mean = sum / (double)(n - 1), m2 = 0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]))
            m2 += ((double)x[i] - mean) * ((double)x[i] - mean);
    double sd, want_sd = sqrt(m2 / (double)(n - 2));
    qcal_numeric_stats_std(&s1, &sd);
    if (fabs(s1.mean - mean) > 1e-12 * mean || fabs(sd - want_sd) > 1e-9 * want_sd) {
        print_error("mean %.17g vs %.17g, std %.17g vs %.17g\n", s1.mean, mean, sd, want_sd);
        fail();
    }
    free(t1);
    free(t2);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_format),
        cmocka_unit_test(test_counter),
        cmocka_unit_test(test_csv_round_trip),
        cmocka_unit_test(test_npy_dumps),
        cmocka_unit_test(test_npy_dumps_numpy),
        cmocka_unit_test(test_callback),
        cmocka_unit_test(test_thread_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
