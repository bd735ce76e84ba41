/* unit.determinism: results must not depend on the thread count or on thread interleaving.
 *
 *  - every observer kind, the statistics, the comparison metrics, quantize and calibration
 *    tables are computed with 1, 2 and 8 OpenMP threads (observers, statistics, metrics and
 *    quantize also with 1, 2, 8 set by qcal_threads_set_count) on tensors large enough for the
 *    kernels to fork (> 8 x QCAL_OMP_MIN_ELEMENTS / 2 elements), and compared bit for bit
 *    (observer state blobs hold the histograms; tables are compared as formatted bytes);
 *  - the qcal CLI's calibrate runs with OMP_NUM_THREADS=1, 2, 8 on a dump of large tensors
 *    and its tables are compared byte for byte;
 *  - stress: 8 threads feed one calibration session with interleaved names for a bounded
 *    time; counts add up (no lost update) and the table equals a serial run's, byte for byte.
 *    Built with -Db_sanitize=thread this is the ThreadSanitizer check (.ci/run).
 * Without OpenMP the thread-count tests still run (every count is then one thread). */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
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

#include "qcal/calib.h"
#include "qcal/npy.h"
#include "qcal/numeric.h"
#include "qcal/qcal.h"
#include "qcal_config.h"
#include "testutil.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

/* Thread counts are set through OpenMP (omp_set_num_threads), or, when by_option is set,
 * through the library's own option (qcal_threads_set_count) with OpenMP left at 2. */
static bool by_option;

static void set_threads(int n)
{
    if (by_option) {
        assert_int_equal(qcal_threads_set_count(n), QCAL_OK);
        n = 2;
    } else {
        assert_int_equal(qcal_threads_set_count(0), QCAL_OK);
    }
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static const int thread_counts[] = { 1, 2, 8 };
enum { NTC = 3 };

/* Deterministic generator (splitmix64) so every run sees the same data. */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s)
{
    return (float)((mix(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Fills x with a skewed distribution, a few outliers and a few NaN/Inf (skipped and counted
 * by the default policy), different per batch. */
static void fill(float *x, int64_t n, uint64_t seed, float scale)
{
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        float u = uniform(&s);
        x[i] = scale * u * fabsf(u) + 0.1f * scale;
        uint64_t r = mix(&s) % 100000;
        if (r == 0)
            x[i] = NAN;
        else if (r == 1)
            x[i] = -INFINITY;
        else if (r < 20)
            x[i] *= 40.0f;
    }
}

/* Asserts equal bytes; on failure prints the first differing byte and both values. */
static void assert_same_bytes(const char *what, int threads, const void *a, size_t alen,
                              const void *b, size_t blen)
{
    if (alen != blen) {
        print_error("%s with %d threads: %zu bytes, 1 thread: %zu bytes\n", what, threads, blen,
                    alen);
        fail();
    }
    const uint8_t *pa = a, *pb = b;
    for (size_t i = 0; i < alen; i++) {
        if (pa[i] != pb[i]) {
            print_error("%s with %d threads differs from 1 thread at byte %zu of %zu "
                        "(0x%02x vs 0x%02x)\n", what, threads, i, alen, pb[i], pa[i]);
            fail();
        }
    }
}

enum { NBATCH = 3 };
/* 1.2M elements: qcal_threads_for gives min(threads, n / 2^17) = 8 for the 8-thread case. */
#define BIG_N ((int64_t)1200000)
#define BIG_C 16   /* per-channel view: (16, 75000), axis 0 */

typedef struct det_state {
    float *batch[NBATCH];
} det_state;

static int det_setup(void **state)
{
    det_state *st = calloc(1, sizeof *st);
    if (!st)
        return -1;
    for (int b = 0; b < NBATCH; b++) {
        st->batch[b] = malloc((size_t)BIG_N * sizeof(float));
        if (!st->batch[b])
            return -1;
        fill(st->batch[b], BIG_N, 1234 + (uint64_t)b, 1.0f + (float)b);   /* growing range */
    }
    *state = st;
    return 0;
}

static int det_teardown(void **state)
{
    det_state *st = *state;
    for (int b = 0; b < NBATCH; b++)
        free(st->batch[b]);
    free(st);
    set_threads(2);
    return 0;
}

/* Every observer kind: the saved state (histograms included), the qparams and the range. */
static void test_observers_thread_count(void **state)
{
    det_state *st = *state;
    for (int kind = 0; kind < QCAL_OBSERVER_KIND_COUNT; kind++) {
        void *ref_blob = NULL;
        size_t ref_len = 0;
        float ref_q[2 * BIG_C + 2 * BIG_C];
        int32_t ref_zp[BIG_C];
        for (int t = 0; t < NTC; t++) {
            set_threads(thread_counts[t]);
            qcal_observer_config cfg;
            qcal_observer_config_default(&cfg, (qcal_observer_kind)kind);
            qcal_observer *o = NULL;
            assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
            bool per_channel = kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
                               kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
            for (int b = 0; b < NBATCH; b++) {
                qcal_tensor x;
                /* per-channel kinds: x is (16, 75000), axis 0; others: x is (1200000,) */
                int64_t shape2[2] = { BIG_C, BIG_N / BIG_C }, shape1[1] = { BIG_N };
                if (per_channel)
                    assert_int_equal(qcal_tensor_init(&x, st->batch[b], 2, shape2), QCAL_OK);
                else
                    assert_int_equal(qcal_tensor_init(&x, st->batch[b], 1, shape1), QCAL_OK);
                assert_int_equal(qcal_observer_update(o, &x), QCAL_OK);
            }
            uint64_t nonfinite = 0;
            assert_int_equal(qcal_observer_nonfinite(o, &nonfinite), QCAL_OK);
            assert_true(nonfinite > 0);   /* the data holds NaN/Inf: the count is compared too */
            void *blob = NULL;
            size_t len = 0;
            assert_int_equal(qcal_observer_save(o, &blob, &len), QCAL_OK);
            float q[4 * BIG_C];
            int32_t zp[BIG_C];
            int64_t n = 0;
            memset(q, 0, sizeof q);
            memset(zp, 0, sizeof zp);
            assert_int_equal(qcal_observer_qrange(o, BIG_C, q, q + BIG_C, &n), QCAL_OK);
            assert_int_equal(tu_observer_qparams(o, BIG_C, q + 2 * BIG_C, zp, q + 3 * BIG_C, &n),
                             QCAL_OK);
            assert_int_equal(n, per_channel ? BIG_C : 1);
            char what[96];
            if (t == 0) {
                ref_blob = blob;
                ref_len = len;
                memcpy(ref_q, q, sizeof q);
                memcpy(ref_zp, zp, sizeof zp);
            } else {
                snprintf(what, sizeof what, "%s state blob", qcal_observer_kind_name(kind));
                assert_same_bytes(what, thread_counts[t], ref_blob, ref_len, blob, len);
                snprintf(what, sizeof what, "%s range/scale", qcal_observer_kind_name(kind));
                assert_same_bytes(what, thread_counts[t], ref_q, sizeof ref_q, q, sizeof q);
                snprintf(what, sizeof what, "%s zero-points", qcal_observer_kind_name(kind));
                assert_same_bytes(what, thread_counts[t], ref_zp, sizeof ref_zp, zp, sizeof zp);
                qcal_free(blob);
            }
            qcal_observer_destroy(&o);
        }
        qcal_free(ref_blob);
    }
}

/* The same with the thread count set by qcal_threads_set_count (1, 2, 8 over OpenMP's 2). */
static void test_observers_thread_option(void **state)
{
    by_option = true;
    test_observers_thread_count(state);
    by_option = false;
    set_threads(2);
}

/* Streaming statistics, comparison metrics and quantize/dequantize. */
static void test_numeric_thread_count(void **state)
{
    det_state *st = *state;
    qcal_numeric_stats ref_stats;
    qcal_numeric_metrics ref_m;
    memset(&ref_stats, 0, sizeof ref_stats);
    memset(&ref_m, 0, sizeof ref_m);
    uint8_t *ref_q = malloc((size_t)BIG_N), *q = malloc((size_t)BIG_N);
    float *deq = malloc((size_t)BIG_N * sizeof(float));
    assert_non_null(ref_q);
    assert_non_null(q);
    assert_non_null(deq);
    for (int t = 0; t < NTC; t++) {
        set_threads(thread_counts[t]);
        qcal_numeric_stats s;
        assert_int_equal(qcal_numeric_stats_init(&s), QCAL_OK);
        for (int b = 0; b < NBATCH; b++)
            assert_int_equal(qcal_numeric_stats_update(&s, st->batch[b], BIG_N), QCAL_OK);
        assert_true(s.count > 0 && s.nonfinite > 0);
        /* quantize -> dequantize of batch 0, then metrics of batch 0 against it */
        qcal_tensor x;
        qcal_tensor_mut d;
        int64_t n = BIG_N;
        assert_int_equal(qcal_tensor_init(&x, st->batch[0], 1, &n), QCAL_OK);
        assert_int_equal(qcal_tensor_mut_init(&d, deq, 1, &n), QCAL_OK);
        assert_int_equal(qcal_quantize(&x, tu_qp(QCAL_QUINT8, 0.02f, 100), q), QCAL_OK);
        assert_int_equal(qcal_dequantize(q, tu_qp(QCAL_QUINT8, 0.02f, 100), &d), QCAL_OK);
        qcal_numeric_metrics m;
        memset(&m, 0, sizeof m);
        assert_int_equal(qcal_numeric_compare_f32(st->batch[0], deq, BIG_N, &m), QCAL_OK);
        if (t == 0) {
            ref_stats = s;
            ref_m = m;
            memcpy(ref_q, q, (size_t)BIG_N);
        } else {
            /* Compare field by field (struct padding is not part of the result). */
            assert_int_equal(s.count, ref_stats.count);
            assert_int_equal(s.nonfinite, ref_stats.nonfinite);
            assert_same_bytes("stats.min", thread_counts[t], &ref_stats.min, 4, &s.min, 4);
            assert_same_bytes("stats.max", thread_counts[t], &ref_stats.max, 4, &s.max, 4);
            assert_same_bytes("stats.absmax", thread_counts[t], &ref_stats.absmax, 4, &s.absmax, 4);
            assert_same_bytes("stats.mean", thread_counts[t], &ref_stats.mean, 8, &s.mean, 8);
            assert_same_bytes("stats.m2", thread_counts[t], &ref_stats.m2, 8, &s.m2, 8);
            assert_same_bytes("metrics", thread_counts[t], &ref_m, sizeof m, &m, sizeof m);
            assert_same_bytes("quantized bytes", thread_counts[t], ref_q, (size_t)BIG_N, q,
                              (size_t)BIG_N);
        }
    }
    free(ref_q);
    free(q);
    free(deq);
}

static void test_numeric_thread_option(void **state)
{
    by_option = true;
    test_numeric_thread_count(state);
    by_option = false;
    set_threads(2);
}

/* A calibration session (activation histogram + weight per-channel + a moving average),
 * fed serially, turned into tables in every format. */
static void test_tables_thread_count(void **state)
{
    det_state *st = *state;
    char *ref[4] = { 0 };
    size_t ref_len[4] = { 0 };
    for (int t = 0; t < NTC; t++) {
        set_threads(thread_counts[t]);
        qcal_calib_rules *rules = NULL;
        const char *text = "ma* activation moving_average_minmax\n"
                           "pct activation percentile\n";
        assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &rules), QCAL_OK);
        qcal_calib_session_options opt;
        qcal_calib_session_options_default(&opt);
        opt.rules = rules;
        qcal_calib_session *s = NULL;
        assert_int_equal(qcal_calib_session_create(&opt, &s), QCAL_OK);
        for (int b = 0; b < NBATCH; b++) {
            qcal_tensor x, w;
            int64_t n = BIG_N, wshape[2] = { BIG_C, BIG_N / BIG_C };
            assert_int_equal(qcal_tensor_init(&x, st->batch[b], 1, &n), QCAL_OK);
            assert_int_equal(qcal_tensor_init(&w, st->batch[(b + 1) % NBATCH], 2, wshape), QCAL_OK);
            assert_int_equal(qcal_calib_session_observe(s, "act", QCAL_CALIB_ROLE_ACTIVATION, b, &x), QCAL_OK);
            assert_int_equal(qcal_calib_session_observe(s, "ma.out", QCAL_CALIB_ROLE_ACTIVATION, b, &x), QCAL_OK);
            assert_int_equal(qcal_calib_session_observe(s, "pct", QCAL_CALIB_ROLE_ACTIVATION, b, &x), QCAL_OK);
            assert_int_equal(qcal_calib_session_observe(s, "fc.weight", QCAL_CALIB_ROLE_WEIGHT, b, &w), QCAL_OK);
        }
        qcal_calib_table *table = NULL;
        assert_int_equal(qcal_calib_session_table(s, &table), QCAL_OK);
        int64_t count = 0;
        assert_int_equal(qcal_calib_table_count(table, &count), QCAL_OK);
        assert_int_equal(count, 4);
        for (int f = 0; f < 4; f++) {
            char *buf = NULL;
            size_t len = 0;
            assert_int_equal(qcal_calib_table_format(table, (qcal_calib_format)f, NULL, &buf, &len),
                             QCAL_OK);
            if (t == 0) {
                ref[f] = buf;
                ref_len[f] = len;
            } else {
                char what[64];
                snprintf(what, sizeof what, "%s table", qcal_calib_format_name((qcal_calib_format)f));
                assert_same_bytes(what, thread_counts[t], ref[f], ref_len[f], buf, len);
                qcal_free(buf);
            }
        }
        qcal_calib_table_destroy(&table);
        qcal_calib_session_destroy(&s);
        qcal_calib_rules_destroy(&rules);
    }
    for (int f = 0; f < 4; f++)
        qcal_free(ref[f]);
}

/* ---- the CLI with OMP_NUM_THREADS = 1, 2, 8 ---- */

static int run_cli(const char *threads, char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("OMP_NUM_THREADS", threads, 1);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

static void test_cli_calibrate_thread_count(void **state)
{
    det_state *st = *state;
    const char *bin = getenv("QCAL_BIN");
    if (!bin || !*bin) {
        print_message("QCAL_BIN not set (tools disabled): CLI determinism not checked\n");
        skip();
    }
    char dir[] = "/tmp/qcal-det-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], dump[64];
    snprintf(dump, sizeof dump, "%s/dump", dir);
    assert_int_equal(mkdir(dump, 0700), 0);
    int64_t shape1[1] = { BIG_N }, shape2[2] = { BIG_C, BIG_N / BIG_C };
    snprintf(path, sizeof path, "%s/conv1.npy", dump);
    assert_int_equal(qcal_npy_write(path, QCAL_NPY_F32, 1, shape1, st->batch[0]), QCAL_OK);
    snprintf(path, sizeof path, "%s/fc.weight.npy", dump);
    assert_int_equal(qcal_npy_write(path, QCAL_NPY_F32, 2, shape2, st->batch[1]), QCAL_OK);
    const char *formats[] = { "json", "tensorrt" };
    for (int f = 0; f < 2; f++) {
        char *ref = NULL;
        size_t ref_len = 0;
        for (int t = 0; t < NTC; t++) {
            char threads[8], out[256];
            snprintf(threads, sizeof threads, "%d", thread_counts[t]);
            snprintf(out, sizeof out, "%s/table_%s_%d", dir, formats[f], thread_counts[t]);
            char *argv[] = { (char *)bin, "calibrate", "--format", (char *)formats[f], dump, "-o",
                             out, NULL };
            assert_int_equal(run_cli(threads, argv), 0);
            size_t len = 0;
            char *buf = tu_read_file_or_null(out, &len);
            assert_non_null(buf);
            assert_true(len > 0);
            if (t == 0) {
                ref = buf;
                ref_len = len;
            } else {
                char what[64];
                snprintf(what, sizeof what, "qcal calibrate --format %s", formats[f]);
                assert_same_bytes(what, thread_counts[t], ref, ref_len, buf, len);
                free(buf);
            }
            unlink(out);
        }
        free(ref);
    }
    snprintf(path, sizeof path, "%s/conv1.npy", dump);
    unlink(path);
    snprintf(path, sizeof path, "%s/fc.weight.npy", dump);
    unlink(path);
    rmdir(dump);
    rmdir(dir);
}

/* ---- stress: 8 threads, one session, interleaved names, bounded time ---- */

enum { STRESS_THREADS = 8, STRESS_NAMES = 6, STRESS_ELEMS = 2048, STRESS_MAX_ITEMS = 1 << 16 };
static const char *const stress_fqn[STRESS_NAMES] = {
    "layer1.act", "layer1.weight", "layer2.act", "layer2.weight", "ma.act", "pct.act" };
static const qcal_calib_role stress_role[STRESS_NAMES] = {
    QCAL_CALIB_ROLE_ACTIVATION, QCAL_CALIB_ROLE_WEIGHT, QCAL_CALIB_ROLE_ACTIVATION, QCAL_CALIB_ROLE_WEIGHT,
    QCAL_CALIB_ROLE_ACTIVATION, QCAL_CALIB_ROLE_ACTIVATION };
static const char *const stress_rules =
    "ma.* activation moving_average_minmax averaging_constant=0.1\n"
    "pct.* activation percentile bins=512\n"
    "layer2.act activation minmax\n"
    "layer2.weight weight moving_average_per_channel_minmax\n";

/* Item k is name k % STRESS_NAMES at step k / STRESS_NAMES; its data depends only on k. */
static void stress_item(int64_t k, float *x, qcal_tensor *t)
{
    fill(x, STRESS_ELEMS, 99991 + (uint64_t)k, 1.0f + (float)(k % 7));
    int64_t shape[2] = { 8, STRESS_ELEMS / 8 };
    assert_int_equal(qcal_tensor_init(t, x, 2, shape), QCAL_OK);
}

typedef struct stress_ctx {
    qcal_calib_session *s;
    atomic_llong next;
    struct timespec deadline;
    atomic_int failures;
    atomic_llong done;
} stress_ctx;

static bool past(const struct timespec *d)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > d->tv_sec || (now.tv_sec == d->tv_sec && now.tv_nsec >= d->tv_nsec);
}

static void *stress_worker(void *arg)
{
    stress_ctx *c = arg;
    float *x = malloc(STRESS_ELEMS * sizeof(float));
    if (!x) {
        atomic_fetch_add(&c->failures, 1);
        return NULL;
    }
    while (!past(&c->deadline)) {
        int64_t k = atomic_fetch_add(&c->next, 1);
        if (k >= STRESS_MAX_ITEMS)
            break;
        qcal_tensor t;
        fill(x, STRESS_ELEMS, 99991 + (uint64_t)k, 1.0f + (float)(k % 7));
        int64_t shape[2] = { 8, STRESS_ELEMS / 8 };
        if (qcal_tensor_init(&t, x, 2, shape) != QCAL_OK ||
            qcal_calib_session_observe(c->s, stress_fqn[k % STRESS_NAMES], stress_role[k % STRESS_NAMES],
                                 k / STRESS_NAMES, &t) != QCAL_OK)
            atomic_fetch_add(&c->failures, 1);
        atomic_fetch_add(&c->done, 1);
    }
    free(x);
    return NULL;
}

static qcal_calib_session *stress_session(qcal_calib_rules **rules)
{
    assert_int_equal(qcal_calib_rules_parse(stress_rules, strlen(stress_rules), rules), QCAL_OK);
    qcal_calib_session_options opt;
    qcal_calib_session_options_default(&opt);
    opt.rules = *rules;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&opt, &s), QCAL_OK);
    return s;
}

static void test_session_stress(void **state)
{
    (void)state;
    set_threads(1);   /* the threads here are the callers' own */
    qcal_calib_rules *rules = NULL;
    stress_ctx c;
    c.s = stress_session(&rules);
    atomic_init(&c.next, 0);
    atomic_init(&c.failures, 0);
    atomic_init(&c.done, 0);
    clock_gettime(CLOCK_MONOTONIC, &c.deadline);
    c.deadline.tv_nsec += 500 * 1000000L;   /* 0.5 s */
    if (c.deadline.tv_nsec >= 1000000000L) {
        c.deadline.tv_sec++;
        c.deadline.tv_nsec -= 1000000000L;
    }
    pthread_t th[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, stress_worker, &c), 0);
    for (int i = 0; i < STRESS_THREADS; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(atomic_load(&c.failures), 0);
    int64_t items = atomic_load(&c.done);
    /* Claimed items are 0..items-1 (each claimed item was fed before its thread stopped). */
    assert_true(items >= STRESS_NAMES);
    print_message("stress: %lld batches from %d threads in 0.5 s\n", (long long)items,
                  STRESS_THREADS);

    /* Counts add up: no lost update. Non-finite counts are recomputed from the data. */
    assert_int_equal(qcal_calib_session_flush(c.s), QCAL_OK);
    int64_t entries = 0;
    assert_int_equal(qcal_calib_session_count(c.s, &entries), QCAL_OK);
    assert_int_equal(entries, STRESS_NAMES);
    float *x = malloc(STRESS_ELEMS * sizeof(float));
    assert_non_null(x);
    uint64_t want_nonfinite[STRESS_NAMES] = { 0 };
    for (int64_t k = 0; k < items; k++) {
        qcal_tensor t;
        stress_item(k, x, &t);
        for (int i = 0; i < STRESS_ELEMS; i++)
            want_nonfinite[k % STRESS_NAMES] += !isfinite(x[i]);
    }
    for (int n = 0; n < STRESS_NAMES; n++) {
        uint64_t batches = 0, elements = 0, nonfinite = 0, pending = 99;
        assert_int_equal(qcal_calib_session_stats(c.s, stress_fqn[n], stress_role[n], &batches,
                                            &elements, &nonfinite, &pending), QCAL_OK);
        uint64_t want = (uint64_t)((items - n + STRESS_NAMES - 1) / STRESS_NAMES);
        if (batches != want || elements != want * STRESS_ELEMS || pending != 0 ||
            nonfinite != want_nonfinite[n]) {
            print_error("%s: batches %llu (want %llu), elements %llu (want %llu), nonfinite %llu "
                        "(want %llu), pending %llu\n", stress_fqn[n], (unsigned long long)batches,
                        (unsigned long long)want, (unsigned long long)elements,
                        (unsigned long long)(want * STRESS_ELEMS), (unsigned long long)nonfinite,
                        (unsigned long long)want_nonfinite[n], (unsigned long long)pending);
            fail();
        }
    }

    /* The same items fed serially in step order give the same table, byte for byte. */
    qcal_calib_rules *rules2 = NULL;
    qcal_calib_session *serial = stress_session(&rules2);
    for (int64_t k = 0; k < items; k++) {
        qcal_tensor t;
        stress_item(k, x, &t);
        assert_int_equal(qcal_calib_session_observe(serial, stress_fqn[k % STRESS_NAMES],
                                              stress_role[k % STRESS_NAMES], k / STRESS_NAMES, &t),
                         QCAL_OK);
    }
    free(x);
    qcal_calib_table *ta = NULL, *tb = NULL;
    assert_int_equal(qcal_calib_session_table(c.s, &ta), QCAL_OK);
    assert_int_equal(qcal_calib_session_table(serial, &tb), QCAL_OK);
    char *ja = NULL, *jb = NULL;
    size_t la = 0, lb = 0;
    assert_int_equal(qcal_calib_table_format(ta, QCAL_CALIB_FORMAT_JSON, NULL, &ja, &la), QCAL_OK);
    assert_int_equal(qcal_calib_table_format(tb, QCAL_CALIB_FORMAT_JSON, NULL, &jb, &lb), QCAL_OK);
    assert_same_bytes("8-thread session table vs serial", STRESS_THREADS, jb, lb, ja, la);
    qcal_free(ja);
    qcal_free(jb);
    qcal_calib_table_destroy(&ta);
    qcal_calib_table_destroy(&tb);
    qcal_calib_session_destroy(&serial);
    qcal_calib_session_destroy(&c.s);
    qcal_calib_rules_destroy(&rules);
    qcal_calib_rules_destroy(&rules2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_observers_thread_count),
        cmocka_unit_test(test_numeric_thread_count),
        cmocka_unit_test(test_observers_thread_option),
        cmocka_unit_test(test_numeric_thread_option),
        cmocka_unit_test(test_tables_thread_count),
        cmocka_unit_test(test_cli_calibrate_thread_count),
        cmocka_unit_test(test_session_stress),
    };
    return cmocka_run_group_tests(tests, det_setup, det_teardown);
}
