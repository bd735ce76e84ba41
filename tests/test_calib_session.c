/* Calibration sessions and rules: rule matching and the rules-file parser, step ordering
 * (out of order, gaps, duplicates, the pending-memory bound), and threads feeding one
 * session with interleaved names: the table equals the serial one bit for bit and no
 * update is lost. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "qcal/calib.h"
#include "qcal/threads.h"

/* ---- Rules ---- */

static void test_role_defaults(void **state)
{
    (void)state;
    qcal_observer_config c;
    assert_int_equal(qcal_calib_role_default_config(QCAL_CALIB_ROLE_ACTIVATION, &c), QCAL_OK);
    assert_int_equal(c.kind, QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(c.q.dtype, QCAL_QUINT8);
    assert_int_equal(c.q.qscheme, QCAL_PER_TENSOR_AFFINE);
    assert_int_equal(qcal_calib_role_default_config(QCAL_CALIB_ROLE_WEIGHT, &c), QCAL_OK);
    assert_int_equal(c.kind, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    assert_int_equal(c.q.dtype, QCAL_QINT8);
    assert_int_equal(c.q.qscheme, QCAL_PER_CHANNEL_SYMMETRIC);
    assert_int_equal(c.axis, 0);
    assert_int_equal(qcal_calib_role_default_config((qcal_calib_role)7, &c), QCAL_ERR_INVALID_ARG);
    qcal_calib_role r;
    assert_int_equal(qcal_calib_role_parse("weight", &r), QCAL_OK);
    assert_int_equal(r, QCAL_CALIB_ROLE_WEIGHT);
    assert_int_equal(qcal_calib_role_parse("bias", &r), QCAL_ERR_INVALID_ARG);
    assert_string_equal(qcal_calib_role_name(QCAL_CALIB_ROLE_ACTIVATION), "activation");
}

static void test_rules_file(void **state)
{
    (void)state;
    char path[4096];
    const char *dir = getenv("QCAL_TEST_DATA");
    snprintf(path, sizeof path, "%s/calib/rules_sample.txt", dir ? dir : "tests/data");
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_load_file(path, &r), QCAL_OK);
    int64_t n, idx;
    assert_int_equal(qcal_calib_rules_count(r, &n), QCAL_OK);
    assert_int_equal(n, 4);
    qcal_observer_config c;
    assert_int_equal(qcal_calib_rules_match(r, "fc1", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx), QCAL_OK);
    assert_int_equal(idx, 1);
    assert_int_equal(c.kind, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
    assert_float_equal(c.averaging_constant, 0.01f, 0.0f);
    /* Roles filter: fc1 as a weight skips rule 1 (activation) and matches nothing. */
    assert_int_equal(qcal_calib_rules_match(r, "fc1", QCAL_CALIB_ROLE_WEIGHT, &c, &idx), QCAL_OK);
    assert_int_equal(idx, -1);
    assert_int_equal(c.kind, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    assert_int_equal(qcal_calib_rules_match(r, "layer1.0.conv.weight", QCAL_CALIB_ROLE_WEIGHT, &c,
                                            &idx), QCAL_OK);
    assert_int_equal(idx, 0);   /* '*' crosses dots */
    /* Quoted glob with a space, role any. */
    assert_int_equal(qcal_calib_rules_match(r, "conv 1.out", QCAL_CALIB_ROLE_WEIGHT, &c, &idx),
                     QCAL_OK);
    assert_int_equal(idx, 2);
    assert_int_equal(c.q.dtype, QCAL_QINT8);
    assert_int_equal(c.q.qscheme, QCAL_PER_TENSOR_SYMMETRIC);
    /* First match wins: the catch-all comes last. */
    assert_int_equal(qcal_calib_rules_match(r, "conv 1", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx),
                     QCAL_OK);
    assert_int_equal(idx, 2);
    assert_int_equal(qcal_calib_rules_match(r, "relu", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx), QCAL_OK);
    assert_int_equal(idx, 3);
    assert_int_equal(c.kind, QCAL_OBSERVER_MINMAX);
    /* NULL rules: defaults. */
    assert_int_equal(qcal_calib_rules_match(NULL, "x", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx), QCAL_OK);
    assert_int_equal(idx, -1);
    assert_int_equal(c.kind, QCAL_OBSERVER_HISTOGRAM);
    qcal_calib_rules_destroy(&r);
    assert_null(r);
    qcal_calib_rules_destroy(&r);
    assert_int_equal(qcal_calib_rules_load_file("/nonexistent/rules.txt", &r), QCAL_ERR_NOT_FOUND);
    assert_null(r);
}

static void test_rules_globs(void **state)
{
    (void)state;
    const char *text = "\n  # only comments\n"
                       "blk?.conv[0-2] activation minmax   # comment after\n"
                       "\"a#b\" any percentile percentile=99.9 percentile_mode=two_tails\n"
                       "esc\\* activation minmax quant_min=0 quant_max=15 nonfinite=error\n";
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &r), QCAL_OK);
    qcal_observer_config c;
    int64_t idx;
    qcal_calib_rules_match(r, "blk7.conv2", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx);
    assert_int_equal(idx, 0);
    qcal_calib_rules_match(r, "blk7.conv3", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx);
    assert_int_equal(idx, -1);
    qcal_calib_rules_match(r, "blk10.conv1", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx);
    assert_int_equal(idx, -1);
    qcal_calib_rules_match(r, "a#b", QCAL_CALIB_ROLE_WEIGHT, &c, &idx);
    assert_int_equal(idx, 1);
    assert_int_equal(c.kind, QCAL_OBSERVER_PERCENTILE);
    assert_true(c.percentile == 99.9);
    assert_int_equal(c.percentile_mode, QCAL_PERCENTILE_TWO_TAILS);
    qcal_calib_rules_match(r, "esc*", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx);
    assert_int_equal(idx, 2);
    assert_true(c.q.custom_range);
    assert_int_equal(c.q.quant_max, 15);
    assert_int_equal(c.nonfinite, QCAL_NONFINITE_ERROR);
    qcal_calib_rules_match(r, "escX", QCAL_CALIB_ROLE_ACTIVATION, &c, &idx);
    assert_int_equal(idx, -1);
    qcal_calib_rules_destroy(&r);
    /* Empty input: no rules. */
    assert_int_equal(qcal_calib_rules_parse("", 0, &r), QCAL_OK);
    int64_t n;
    qcal_calib_rules_count(r, &n);
    assert_int_equal(n, 0);
    qcal_calib_rules_destroy(&r);
}

static void expect_parse_error(const char *text, const char *line, const char *what)
{
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &r), QCAL_ERR_FORMAT);
    assert_null(r);
    const char *msg = qcal_last_error();
    if (!strstr(msg, line) || !strstr(msg, what))
        fail_msg("message '%s' lacks '%s' or '%s'", msg, line, what);
}

static void test_rules_errors(void **state)
{
    (void)state;
    expect_parse_error("x activation minmax\nfc weight\n", "line 2", "2 fields");
    expect_parse_error("x bias minmax\n", "line 1", "bias");
    expect_parse_error("x activation minmax bins=12x\n", "line 1", "bins");
    expect_parse_error("# c\n\nx activation minmax color=red\n", "line 3", "color");
    expect_parse_error("x activation minmax quant_min=0\n", "line 1", "together");
    expect_parse_error("x activation minmax dtype=int4\n", "line 1", "int4");
    expect_parse_error("\"x activation minmax\n", "line 1", "unterminated");
    expect_parse_error("x activation blah\n", "line 1", "blah");
    expect_parse_error("x activation minmax dtype=qint8 dtype=quint8\n", "line 1", "twice");
    expect_parse_error("x activation minmax eps=nan\n", "line 1", "eps");
    expect_parse_error("x activation minmax reduce_range=yes\n", "line 1", "reduce_range");
    expect_parse_error("x activation moving_average_minmax averaging_constant=2\n", "line 1",
                       "averaging");
    expect_parse_error("x activation minmax qscheme=per_channel_affine\n", "line 1",
                       "per-tensor");
    expect_parse_error("x activation minmax noequals\n", "line 1", "key=value");
    char nul[] = "x activation minmax\0\n";
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_parse(nul, sizeof nul - 1, &r), QCAL_ERR_FORMAT);
    char *longline = malloc(10000);
    assert_non_null(longline);
    memset(longline, 'a', 9999);
    longline[9999] = '\0';
    expect_parse_error(longline, "line 1", "longer");
    free(longline);
}

/* ---- Sessions ---- */

/* Deterministic data of (tensor k, step s): shape (4, 8, 5), axis 0 = 4 channels. */
#define NCH 4
#define NEL (4 * 8 * 5)
static void gen(int k, int64_t s, float *dst)
{
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1) + 0xbf58476d1ce4e5b9ull * (uint64_t)(s + 7);
    for (int i = 0; i < NEL; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        float u = (float)(x >> 40) / 16777216.0f;     /* [0, 1) */
        dst[i] = (u - 0.4f) * (1.0f + (float)((s * 5 + k) % 11));
    }
    if (s % 5 == 3)
        dst[(k * 7) % NEL] = NAN;   /* some non-finite values, skipped and counted */
}

static const int64_t shape[3] = { NCH, 8, 5 };

/* Tensor k's name and role: a mix of order-free (minmax kinds) and order-dependent
 * (moving averages) observers. */
static void name_of(int k, char *dst, size_t cap, qcal_calib_role *role)
{
    static const char *const pre[] = { "mm", "ma", "w", "mapc" };
    snprintf(dst, cap, "%s.%d", pre[k % 4], k);
    *role = k % 4 == 2 ? QCAL_CALIB_ROLE_WEIGHT : QCAL_CALIB_ROLE_ACTIVATION;
}

static qcal_calib_rules *test_rules(void)
{
    const char *text = "mm.* activation minmax\n"
                       "ma.* activation moving_average_minmax averaging_constant=0.3\n"
                       "mapc.* any moving_average_per_channel_minmax qscheme=per_channel_symmetric "
                       "dtype=qint8 axis=1\n";
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &r), QCAL_OK);
    return r;
}

static qcal_calib_session *new_session(const qcal_calib_rules *rules, uint64_t max_pending)
{
    qcal_calib_session_options o;
    qcal_calib_session_options_default(&o);
    o.rules = rules;
    if (max_pending)
        o.max_pending_bytes = max_pending;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&o, &s), QCAL_OK);
    return s;
}

static qcal_status feed(qcal_calib_session *s, int k, int64_t step)
{
    float buf[NEL];
    gen(k, step, buf);
    qcal_tensor x;
    assert_int_equal(qcal_tensor_init(&x, buf, 3, shape), QCAL_OK);
    char name[32];
    qcal_calib_role role;
    name_of(k, name, sizeof name, &role);
    return qcal_calib_session_observe(s, name, role, step, &x);
}

__attribute__((noinline)) static char *table_json(qcal_calib_session *s)
{
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_session_table(s, &t);
    if (st != QCAL_OK)
        fail_msg("table: %s", qcal_last_error());
    char *buf = NULL;
    size_t len;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &buf, &len), QCAL_OK);
    qcal_calib_table_destroy(&t);
    return buf;
}

/* On mismatch, prints the first differing line of two table texts. */
static void assert_same_table(const char *a, const char *b)
{
    if (!strcmp(a, b))
        return;
    size_t i = 0;
    int line = 1;
    while (a[i] && a[i] == b[i])
        line += a[i++] == '\n';
    size_t sa = i, sb = i;
    while (sa > 0 && a[sa - 1] != '\n')
        sa--;
    while (sb > 0 && b[sb - 1] != '\n')
        sb--;
    fail_msg("tables differ at line %d:\n  threaded: %.*s\n  serial:   %.*s", line,
             (int)strcspn(a + sa, "\n"), a + sa, (int)strcspn(b + sb, "\n"), b + sb);
}

static char *serial_table(const qcal_calib_rules *rules, int ntensors, int64_t nsteps)
{
    qcal_calib_session *s = new_session(rules, 0);
    for (int64_t step = 0; step < nsteps; step++)
        for (int k = 0; k < ntensors; k++)
            assert_int_equal(feed(s, k, step), QCAL_OK);
    char *j = table_json(s);
    qcal_calib_session_destroy(&s);
    assert_null(s);
    return j;
}

static void test_out_of_order_equals_serial(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    const int nt = 8;
    const int64_t ns = 12;
    char *want = serial_table(rules, nt, ns);
    /* Reverse step order, tensors interleaved. */
    qcal_calib_session *s = new_session(rules, 0);
    for (int64_t step = ns - 1; step >= 0; step--)
        for (int k = nt - 1; k >= 0; k--)
            assert_int_equal(feed(s, k, step), QCAL_OK);
    uint64_t b, el, nf, pend;
    assert_int_equal(qcal_calib_session_stats(s, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, &b, &el, &nf, &pend),
                     QCAL_OK);
    assert_int_equal(b, ns);       /* step 0 arrived last and drained the queue */
    assert_int_equal(el, ns * NEL);
    assert_int_equal(pend, 0);
    char *got = table_json(s);
    assert_same_table(got, want);
    /* The moving average really depends on order: feeding serially in reverse with fresh
     * step numbers gives a different table (so the equality above is not vacuous). */
    qcal_calib_session *r = new_session(rules, 0);
    for (int64_t step = ns - 1; step >= 0; step--)
        for (int k = 0; k < nt; k++) {
            float buf[NEL];
            gen(k, step, buf);
            qcal_tensor x;
            qcal_tensor_init(&x, buf, 3, shape);
            char name[32];
            qcal_calib_role role;
            name_of(k, name, sizeof name, &role);
            assert_int_equal(qcal_calib_session_observe(r, name, role, QCAL_STEP_AUTO, &x), QCAL_OK);
        }
    char *rev = table_json(r);
    assert_true(strcmp(rev, want) != 0);
    qcal_free(rev);
    qcal_calib_session_destroy(&r);
    qcal_free(got);
    qcal_free(want);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

static void test_steps_gaps_duplicates(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    qcal_calib_session *s = new_session(rules, 0);
    /* ma.1 gets steps 0, 2, 3 (1 never comes); mm.0 gets 5 only. */
    assert_int_equal(feed(s, 1, 3), QCAL_OK);
    assert_int_equal(feed(s, 1, 0), QCAL_OK);
    assert_int_equal(feed(s, 1, 2), QCAL_OK);
    assert_int_equal(feed(s, 0, 5), QCAL_OK);
    uint64_t b, pend;
    qcal_calib_session_stats(s, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, &b, NULL, NULL, &pend);
    assert_int_equal(b, 1);
    assert_int_equal(pend, 2);
    qcal_calib_session_stats(s, "mm.0", QCAL_CALIB_ROLE_ACTIVATION, &b, NULL, NULL, &pend);
    assert_int_equal(b, 1);        /* order-free: applied at once */
    assert_int_equal(pend, 0);
    /* Duplicates, queued or applied, and passed steps are refused. */
    assert_int_equal(feed(s, 1, 2), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "step 2"));
    assert_int_equal(feed(s, 1, 0), QCAL_ERR_INVALID_ARG);
    assert_int_equal(feed(s, 0, 5), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_calib_session_stats(s, "ma.1", QCAL_CALIB_ROLE_WEIGHT, &b, NULL, NULL, NULL),
                     QCAL_ERR_NOT_FOUND);
    assert_int_equal(qcal_calib_session_flush(s), QCAL_OK);
    qcal_calib_session_stats(s, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, &b, NULL, NULL, &pend);
    assert_int_equal(b, 3);
    assert_int_equal(pend, 0);
    assert_int_equal(feed(s, 1, 3), QCAL_ERR_INVALID_ARG);   /* passed by the flush */
    assert_int_equal(feed(s, 1, 4), QCAL_OK);
    char *got = table_json(s);
    /* The same batches in the same order with contiguous steps. */
    qcal_calib_session *r = new_session(rules, 0);
    float buf[NEL];
    qcal_tensor x;
    qcal_tensor_init(&x, buf, 3, shape);
    int64_t order[4] = { 0, 2, 3, 4 };
    for (int i = 0; i < 4; i++) {
        gen(1, order[i], buf);
        assert_int_equal(qcal_calib_session_observe(r, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, i, &x), QCAL_OK);
    }
    gen(0, 5, buf);
    assert_int_equal(qcal_calib_session_observe(r, "mm.0", QCAL_CALIB_ROLE_ACTIVATION, 0, &x), QCAL_OK);
    char *want = table_json(r);
    assert_same_table(got, want);
    qcal_free(got);
    qcal_free(want);
    /* Bad calls leave nothing behind. */
    assert_int_equal(qcal_calib_session_observe(s, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, -5, &x),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_calib_session_observe(s, "", QCAL_CALIB_ROLE_ACTIVATION, 0, &x),
                     QCAL_ERR_INVALID_ARG);
    int64_t zero_shape[1] = { 0 };
    qcal_tensor empty;
    qcal_tensor_init(&empty, buf, 1, zero_shape);
    assert_int_equal(qcal_calib_session_observe(s, "new", QCAL_CALIB_ROLE_ACTIVATION, 0, &empty),
                     QCAL_ERR_EMPTY);
    int64_t n;
    qcal_calib_session_count(s, &n);
    assert_int_equal(n, 2);
    /* An observer error (channel count change) is returned and leaves the entry as it was. */
    int64_t other[2] = { 3, 10 };
    qcal_tensor y;
    qcal_tensor_init(&y, buf, 2, other);
    gen(2, 0, buf);
    assert_int_equal(feed(s, 2, 0), QCAL_OK);
    assert_true(qcal_calib_session_observe(s, "w.2", QCAL_CALIB_ROLE_WEIGHT, 1, &y) < 0);
    assert_non_null(strstr(qcal_last_error(), "w.2"));
    qcal_calib_session_stats(s, "w.2", QCAL_CALIB_ROLE_WEIGHT, &b, NULL, NULL, NULL);
    assert_int_equal(b, 1);
    qcal_calib_session_destroy(&r);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

static void test_pending_bound(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    qcal_calib_session *s = new_session(rules, 2 * NEL * sizeof(float));
    assert_int_equal(feed(s, 1, 1), QCAL_OK);
    assert_int_equal(feed(s, 1, 2), QCAL_OK);
    assert_int_equal(feed(s, 1, 3), QCAL_ERR_NO_MEMORY);
    assert_non_null(strstr(qcal_last_error(), "max_pending_bytes"));
    assert_int_equal(feed(s, 1, 0), QCAL_OK);   /* drains 1 and 2, frees the budget */
    assert_int_equal(feed(s, 1, 4), QCAL_OK);   /* queued (3 is missing) */
    assert_int_equal(feed(s, 1, 3), QCAL_OK);
    uint64_t b;
    qcal_calib_session_stats(s, "ma.1", QCAL_CALIB_ROLE_ACTIVATION, &b, NULL, NULL, NULL);
    assert_int_equal(b, 5);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* Which kinds commute (qcal_observer_kind_commutes): all but the moving averages; the session
 * applies a commuting observer's early batch at once (nothing queued, no pending budget). */
static void test_commuting_kinds(void **state)
{
    (void)state;
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        bool ma = k == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
                  k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
        assert_int_equal(qcal_observer_kind_commutes((qcal_observer_kind)k), !ma);
        qcal_observer_config c;
        qcal_observer_config_default(&c, (qcal_observer_kind)k);
        /* Defaults: every commuting kind, the histogram family on its lattice grid. */
        assert_int_equal(qcal_observer_config_commutes(&c), !ma);
        bool hist = k >= QCAL_OBSERVER_HISTOGRAM && k <= QCAL_OBSERVER_MSE;
        if (hist) {   /* the first-batch grid follows arrival order */
            c.grid = QCAL_GRID_FIRST_BATCH;
            assert_false(qcal_observer_config_commutes(&c));
        }
    }
    assert_false(qcal_observer_kind_commutes(QCAL_OBSERVER_KIND_COUNT));
    assert_false(qcal_observer_kind_commutes((qcal_observer_kind)-1));
    assert_false(qcal_observer_config_commutes(NULL));

    /* A budget of one batch: minmax takes steps 3, 2, 1 ahead of 0 without queueing data,
     * the moving average fails on its second early step. */
    qcal_calib_rules *rules = test_rules();
    qcal_calib_session *s = new_session(rules, NEL * sizeof(float));
    for (int64_t step = 5; step >= 1; step--)
        assert_int_equal(feed(s, 0, step), QCAL_OK);   /* mm.0: minmax */
    uint64_t b;
    qcal_calib_session_stats(s, "mm.0", QCAL_CALIB_ROLE_ACTIVATION, &b, NULL, NULL, NULL);
    assert_int_equal(b, 5);                              /* applied at once */
    assert_int_equal(feed(s, 0, 0), QCAL_OK);
    assert_int_equal(feed(s, 1, 2), QCAL_OK);            /* ma.1: queued */
    assert_int_equal(feed(s, 1, 3), QCAL_ERR_NO_MEMORY);  /* over the budget */
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

static void test_many_names(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    qcal_calib_session *s = new_session(rules, 0);
    float buf[NEL];
    qcal_tensor x;
    qcal_tensor_init(&x, buf, 3, shape);
    gen(0, 0, buf);
    char name[32];
    for (int i = 0; i < 3000; i++) {
        snprintf(name, sizeof name, "mm.layer%d", i);
        assert_int_equal(qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_ACTIVATION, 0, &x), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_WEIGHT, 0, &x), QCAL_OK);
    }
    int64_t n;
    qcal_calib_session_count(s, &n);
    assert_int_equal(n, 6000);
    for (int i = 0; i < 3000; i += 7) {
        snprintf(name, sizeof name, "mm.layer%d", i);
        uint64_t b, el;
        assert_int_equal(qcal_calib_session_stats(s, name, QCAL_CALIB_ROLE_WEIGHT, &b, &el, NULL, NULL),
                         QCAL_OK);
        assert_int_equal(b, 1);
        assert_int_equal(el, NEL);
    }
    qcal_calib_table *t = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    const qcal_calib_entry *e;
    assert_int_equal(qcal_calib_table_find(t, "mm.layer2999", QCAL_CALIB_ROLE_WEIGHT, &e), QCAL_OK);
    assert_int_equal(e->qparams.channels, NCH);   /* per_channel_minmax, axis 0 */
    assert_int_equal(e->qparams.qscheme, QCAL_PER_CHANNEL_SYMMETRIC);
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* ---- Threads ---- */

typedef struct worker {
    qcal_calib_session *s;
    int tid, nthreads, ntensors;
    int64_t nsteps;
    /* stress mode: claim items from a shared counter until the deadline */
    int64_t *next_item;
    struct timespec deadline;
    int64_t fed;
    int failures;
} worker;

static void *run_static(void *arg)
{
    worker *w = arg;
    /* Thread t owns steps t, t + T, ...; visits tensors in a thread-dependent order and
     * steps backwards on odd threads, so arrival order is scrambled. */
    for (int64_t i = 0; i < w->nsteps; i++) {
        int64_t step = w->tid & 1 ? w->nsteps - 1 - i : i;
        if (step % w->nthreads != w->tid)
            continue;
        for (int j = 0; j < w->ntensors; j++) {
            int k = (j * 5 + w->tid * 3) % w->ntensors;
            if (feed(w->s, k, step) != QCAL_OK)
                w->failures++;
            w->fed++;
        }
    }
    return NULL;
}

static bool before(const struct timespec *now, const struct timespec *deadline)
{
    return now->tv_sec < deadline->tv_sec ||
           (now->tv_sec == deadline->tv_sec && now->tv_nsec < deadline->tv_nsec);
}

static void *run_stress(void *arg)
{
    worker *w = arg;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    while (before(&now, &w->deadline)) {
        int64_t item = __atomic_fetch_add(w->next_item, 1, __ATOMIC_RELAXED);
        int k = (int)(item % w->ntensors);
        if (feed(w->s, k, item / w->ntensors) != QCAL_OK)
            w->failures++;
        w->fed++;
        if ((item & 15) == 0)
            clock_gettime(CLOCK_MONOTONIC, &now);
    }
    return NULL;
}

static void test_threads_equal_serial(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    const int nt = 12, nthreads = 8;
    const int64_t ns = 24;
    char *want = serial_table(rules, nt, ns);
    for (int rep = 0; rep < 3; rep++) {
        qcal_calib_session *s = new_session(rules, 0);
        pthread_t th[8];
        worker w[8];
        for (int t = 0; t < nthreads; t++) {
            w[t] = (worker){ .s = s, .tid = t, .nthreads = nthreads, .ntensors = nt,
                             .nsteps = ns };
            assert_int_equal(pthread_create(&th[t], NULL, run_static, &w[t]), 0);
        }
        int64_t fed = 0;
        for (int t = 0; t < nthreads; t++) {
            pthread_join(th[t], NULL);
            assert_int_equal(w[t].failures, 0);
            fed += w[t].fed;
        }
        assert_int_equal(fed, nt * ns);
        char *got = table_json(s);
        assert_same_table(got, want);
        qcal_free(got);
        qcal_calib_session_destroy(&s);
    }
    qcal_free(want);
    qcal_calib_rules_destroy(&rules);
}

/* 8 threads feed one session with interleaved names for a bounded time: the counts add up
 * and the table equals feeding the same items serially. */
static void test_threads_stress(void **state)
{
    (void)state;
    qcal_calib_rules *rules = test_rules();
    const int nt = 7, nthreads = 8;
    qcal_calib_session *s = new_session(rules, 0);
    int64_t next_item = 0;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_nsec += 250 * 1000 * 1000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    pthread_t th[8];
    worker w[8];
    for (int t = 0; t < nthreads; t++) {
        w[t] = (worker){ .s = s, .tid = t, .nthreads = nthreads, .ntensors = nt,
                         .next_item = &next_item, .deadline = dl };
        assert_int_equal(pthread_create(&th[t], NULL, run_stress, &w[t]), 0);
    }
    int64_t fed = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(w[t].failures, 0);
        fed += w[t].fed;
    }
    assert_int_equal(fed, next_item);
    assert_true(fed > nt);
    /* Counts add up (after the flush the table makes; a missing step would show here). */
    char *got = table_json(s);
    uint64_t total = 0;
    for (int k = 0; k < nt; k++) {
        char name[32];
        qcal_calib_role role;
        name_of(k, name, sizeof name, &role);
        uint64_t b, el, pend;
        assert_int_equal(qcal_calib_session_stats(s, name, role, &b, &el, NULL, &pend), QCAL_OK);
        assert_int_equal(pend, 0);
        assert_int_equal(el, b * NEL);
        total += b;
    }
    assert_int_equal(total, (uint64_t)fed);
    /* Serial replay of exactly the fed items. */
    qcal_calib_session *r = new_session(rules, 0);
    for (int64_t item = 0; item < fed; item++)
        assert_int_equal(feed(r, (int)(item % nt), item / nt), QCAL_OK);
    char *want = table_json(r);
    assert_same_table(got, want);
    print_message("stress: %lld batches from %d threads in 0.25 s\n", (long long)fed, nthreads);
    qcal_free(got);
    qcal_free(want);
    qcal_calib_session_destroy(&r);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* The default activation observer (histogram) through a threaded session. */
static void test_threads_histogram(void **state)
{
    (void)state;
    qcal_observer_config c;
    qcal_calib_role_default_config(QCAL_CALIB_ROLE_ACTIVATION, &c);
    qcal_observer *probe = NULL;
    /* The default activation observer must exist: a failure here is a failure, not a skip. */
    if (qcal_observer_create(&c, &probe) != QCAL_OK)
        fail_msg("the default activation observer cannot be created: %s", qcal_last_error());
    qcal_observer_destroy(&probe);
    const int nt = 4, nthreads = 4;
    const int64_t ns = 8;
    /* NULL rules: activations histogram, weights per-channel minmax. */
    char *want = serial_table(NULL, nt, ns);
    qcal_calib_session *s = new_session(NULL, 0);
    pthread_t th[4];
    worker w[4];
    for (int t = 0; t < nthreads; t++) {
        w[t] = (worker){ .s = s, .tid = t, .nthreads = nthreads, .ntensors = nt, .nsteps = ns };
        assert_int_equal(pthread_create(&th[t], NULL, run_static, &w[t]), 0);
    }
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(w[t].failures, 0);
    }
    char *got = table_json(s);
    assert_same_table(got, want);
    qcal_free(got);
    qcal_free(want);
    qcal_calib_session_destroy(&s);
}

/* The table's qparams are searched on several threads when several entries search (the
 * default activation observer is a histogram): 1, 2 and 3 threads give the same text, and
 * the same as each entry's table made alone. */
static void test_table_threads(void **state)
{
    (void)state;
    const int nt = 6;
    const int64_t ns = 3;
    char *want[4] = { 0 };
    for (int threads = 1; threads <= 3; threads++) {
        qcal_threads_set_count(threads);
        want[threads] = serial_table(NULL, nt, ns);
        if (threads > 1)
            assert_same_table(want[threads], want[1]);
    }
    qcal_threads_set_count(0);
    /* Entry k alone (session of one tensor) gives entry k's lines. */
    for (int k = 0; k < nt; k++) {
        qcal_calib_session *s = new_session(NULL, 0);
        for (int64_t step = 0; step < ns; step++)
            assert_int_equal(feed(s, k, step), QCAL_OK);
        char *one = table_json(s);
        char name[64];
        qcal_calib_role role;
        name_of(k, name, sizeof name, &role);
        char *a = strstr(one, name), *b = strstr(want[1], name);
        if (!a || !b)
            fail_msg("entry '%s' missing from a table", name);
        size_t la = strcspn(a, "}"), lb = strcspn(b, "}");
        if (la != lb || memcmp(a, b, la))
            fail_msg("entry '%s' alone differs: %.*s | %.*s", name, (int)la, a, (int)lb, b);
        qcal_free(one);
        qcal_calib_session_destroy(&s);
    }
    for (int i = 1; i <= 3; i++)
        qcal_free(want[i]);
}

/* Batches fed in parts (qcal_calib_session_observe_part) give the table, digest and
 * counts of whole batches, bit for bit, for every kind whose config splits; the parts of a
 * step arrive cut at random points and interleaved with other steps' parts. */
static void test_observe_parts(void **state)
{
    (void)state;
    enum { N = 5000, STEPS = 5 };
    static const char *const kinds[] = { "histogram", "entropy", "percentile", "mse",
                                         "minmax" };
    float *x = malloc(STEPS * N * sizeof *x);
    assert_non_null(x);
    uint64_t r = 0x243F6A8885A308D3ull;
    for (int i = 0; i < STEPS * N; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        x[i] = ((float)(r >> 40) / 16777216.0f - 0.3f) * (float)(1 + i / N);
        if (i % 997 == 5)
            x[i] = i % 2 ? NAN : -INFINITY;   /* skipped and counted */
    }
    for (size_t kc = 0; kc < sizeof kinds / sizeof kinds[0]; kc++) {
        char text[128];
        snprintf(text, sizeof text, "* any %s\n", kinds[kc]);
        qcal_calib_rules *rules = NULL;
        assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &rules), QCAL_OK);
        qcal_calib_session *whole = new_session(rules, 0), *parts = new_session(rules, 0);
        for (int st = 0; st < STEPS; st++) {
            int64_t shape2[2] = { 50, N / 50 };
            qcal_tensor t;
            assert_int_equal(qcal_tensor_init(&t, x + st * N, 2, shape2), QCAL_OK);
            assert_int_equal(qcal_calib_session_observe(whole, "t", QCAL_CALIB_ROLE_ACTIVATION,
                                                        st, &t), QCAL_OK);
        }
        /* Parts: every step cut into 1..6 random runs; steps visited 4, 1, 3, 0, 2, with
         * the parts of two steps alternating. */
        static const int order[STEPS] = { 4, 1, 3, 0, 2 };
        for (int o = 0; o < STEPS; o += 2) {
            int sa = order[o], sb = o + 1 < STEPS ? order[o + 1] : -1;
            int64_t pos[2] = { 0, 0 };
            while (pos[0] < N || (sb >= 0 && pos[1] < N)) {
                for (int w = 0; w < 2; w++) {
                    int step = w ? sb : sa;
                    if (step < 0 || pos[w] >= N)
                        continue;
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    int64_t len = 1 + (int64_t)(r % (N / 3));
                    if (len > N - pos[w])
                        len = N - pos[w];
                    qcal_tensor t;
                    assert_int_equal(qcal_tensor_init(&t, x + step * N + pos[w], 1, &len), QCAL_OK);
                    pos[w] += len;
                    qcal_status st = qcal_calib_session_observe_part(
                        parts, "t", QCAL_CALIB_ROLE_ACTIVATION, step, &t, pos[w] == N);
                    if (st != QCAL_OK)
                        fail_msg("%s: part of step %d: %s", kinds[kc], step, qcal_last_error());
                }
            }
        }
        char *a = table_json(whole), *b = table_json(parts);
        assert_same_table(b, a);
        char da[65], db[65];
        assert_int_equal(qcal_calib_session_digest(whole, da), QCAL_OK);
        assert_int_equal(qcal_calib_session_digest(parts, db), QCAL_OK);
        assert_string_equal(db, da);
        uint64_t b1, e1, n1, p1, b2, e2, n2, p2;
        assert_int_equal(qcal_calib_session_stats(whole, "t", QCAL_CALIB_ROLE_ACTIVATION, &b1,
                                                  &e1, &n1, &p1), QCAL_OK);
        assert_int_equal(qcal_calib_session_stats(parts, "t", QCAL_CALIB_ROLE_ACTIVATION, &b2,
                                                  &e2, &n2, &p2), QCAL_OK);
        assert_int_equal(b2, STEPS);
        assert_int_equal(b2, b1);
        assert_int_equal(e2, (uint64_t)STEPS * N);
        assert_int_equal(e2, e1);
        assert_true(n1 > 0);
        assert_int_equal(n2, n1);
        assert_int_equal(p2, 0);
        /* A completed step cannot be fed again, not even in part. */
        int64_t one = 1;
        qcal_tensor t1;
        assert_int_equal(qcal_tensor_init(&t1, x, 1, &one), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe_part(parts, "t", QCAL_CALIB_ROLE_ACTIVATION,
                                                         2, &t1, false), QCAL_ERR_INVALID_ARG);
        assert_int_equal(qcal_calib_session_observe_part(parts, "t", QCAL_CALIB_ROLE_ACTIVATION,
                                                         QCAL_STEP_AUTO, &t1, true),
                         QCAL_ERR_INVALID_ARG);
        qcal_free(a);
        qcal_free(b);
        qcal_calib_session_destroy(&whole);
        qcal_calib_session_destroy(&parts);
        qcal_calib_rules_destroy(&rules);
    }
    /* Observers whose results depend on the split take whole batches only. */
    const char *text = "mm any minmax nonfinite=error\n"
                       "fb any histogram grid=first_batch\n"
                       "strict any entropy nonfinite=error\n"
                       "pc any per_channel_minmax qscheme=per_channel_symmetric dtype=qint8\n"
                       "ma any moving_average_minmax\n";
    qcal_calib_rules *rules = NULL;
    assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &rules), QCAL_OK);
    qcal_calib_session *s = new_session(rules, 0);
    static const char *const names[] = { "mm", "fb", "strict", "pc", "ma" };
    int64_t shape2[2] = { 4, 10 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape2), QCAL_OK);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_int_equal(qcal_calib_session_observe_part(s, names[i], QCAL_CALIB_ROLE_ACTIVATION,
                                                         0, &t, true), QCAL_ERR_UNSUPPORTED);
        assert_non_null(strstr(qcal_last_error(), names[i]));
        uint64_t nb = 9;
        assert_int_equal(qcal_calib_session_stats(s, names[i], QCAL_CALIB_ROLE_ACTIVATION, &nb,
                                                  NULL, NULL, NULL), QCAL_OK);
        assert_int_equal(nb, 0);
    }
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_defaults),
        cmocka_unit_test(test_rules_file),
        cmocka_unit_test(test_rules_globs),
        cmocka_unit_test(test_rules_errors),
        cmocka_unit_test(test_out_of_order_equals_serial),
        cmocka_unit_test(test_steps_gaps_duplicates),
        cmocka_unit_test(test_pending_bound),
        cmocka_unit_test(test_commuting_kinds),
        cmocka_unit_test(test_many_names),
        cmocka_unit_test(test_threads_equal_serial),
        cmocka_unit_test(test_threads_stress),
        cmocka_unit_test(test_threads_histogram),
        cmocka_unit_test(test_table_threads),
        cmocka_unit_test(test_observe_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
