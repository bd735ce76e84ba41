/* State files and merges (docs/state.md): the observer state ("QCOB") and session state
 * ("QCSS") formats byte for byte against the documented layout, round trips through
 * buffers and files, the canonical digests (batch count left out), exact merges over
 * random splits and orders, merge refusals (kinds, configs, moving averages, channel
 * counts) that change nothing, and hostile inputs (every truncation, byte flips). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/sha256.h"
#include "qcal/calib.h"
#include "qcal/observer.h"
#include "tests/testutil.h"

/* The histogram family is exact (order- and split-invariant) on the lattice grid, the
 * default: the identity checks cover it too. */
#ifndef QCAL_TEST_HIST_EXACT
#define QCAL_TEST_HIST_EXACT 1
#endif

static uint64_t rng = 12345;
static uint32_t rnd_u32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
static float rnd_f(void)   /* roughly N(0, 1) */
{
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += (float)rnd_u32() / 2147483648.0f - 1.0f;
    return s * 0.87f;
}

static qcal_observer *make(qcal_observer_kind kind)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);
    qcal_observer *o = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    return o;
}

/* Batch b of `rows` rows of 8 channels (per-channel kinds observe axis 0 = rows... so the
 * batches are [8, rows] for them: channel count 8). */
static void feed(qcal_observer *o, const float *x, int64_t rows)
{
    qcal_tensor t;
    int64_t shape[2] = { 8, rows };
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    assert_int_equal(qcal_observer_update(o, &t), QCAL_OK);
}

static void save(const qcal_observer *o, void **buf, size_t *len)
{
    assert_int_equal(qcal_observer_save(o, buf, len), QCAL_OK);
}

/* Everything an observer reports, as bytes: qrange and qparams per channel, counts. */
static void report(qcal_observer *o, uint8_t *out, size_t cap, size_t *len)
{
    float mn[8], mx[8], sc[8], zf[8];
    int32_t zp[8];
    int64_t n = 0, nq = 0;
    uint64_t nf = 0;
    memset(mn, 0, sizeof mn);
    memset(mx, 0, sizeof mx);
    memset(sc, 0, sizeof sc);
    memset(zp, 0, sizeof zp);
    memset(zf, 0, sizeof zf);
    qcal_status st = qcal_observer_qrange(o, 8, mn, mx, &n);
    assert_true(st == QCAL_OK || st == QCAL_NO_DATA);
    st = tu_observer_qparams(o, 8, sc, zp, zf, &nq);
    assert_true(st >= 0);
    qcal_observer_nonfinite(o, &nf);
    size_t k = 0;
    assert_true(cap >= sizeof mn * 4 + sizeof zp + 24);
    memcpy(out + k, mn, sizeof mn), k += sizeof mn;
    memcpy(out + k, mx, sizeof mx), k += sizeof mx;
    memcpy(out + k, sc, sizeof sc), k += sizeof sc;
    memcpy(out + k, zp, sizeof zp), k += sizeof zp;
    memcpy(out + k, zf, sizeof zf), k += sizeof zf;
    memcpy(out + k, &n, 8), k += 8;
    memcpy(out + k, &nq, 8), k += 8;
    memcpy(out + k, &nf, 8), k += 8;
    *len = k;
}

static const qcal_observer_kind all_kinds[] = {
    QCAL_OBSERVER_MINMAX, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, QCAL_OBSERVER_PER_CHANNEL_MINMAX,
    QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX, QCAL_OBSERVER_HISTOGRAM,
    QCAL_OBSERVER_PERCENTILE, QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE,
};
#define NKINDS (sizeof all_kinds / sizeof all_kinds[0])

static bool exact_kind(qcal_observer_kind k)
{
    if (k == QCAL_OBSERVER_MINMAX || k == QCAL_OBSERVER_PER_CHANNEL_MINMAX)
        return true;
    return QCAL_TEST_HIST_EXACT && k != QCAL_OBSERVER_MOVING_AVERAGE_MINMAX &&
           k != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

/* ---- observer state: layout ---- */

static void put32(uint8_t **p, uint32_t v) { memcpy(*p, &v, 4); *p += 4; }
static void put64(uint8_t **p, uint64_t v) { memcpy(*p, &v, 8); *p += 8; }
static void putf(uint8_t **p, float v) { memcpy(*p, &v, 4); *p += 4; }
static void putd(uint8_t **p, double v) { memcpy(*p, &v, 8); *p += 8; }

/* A minmax observer's file built by hand from docs/state.md equals qcal_observer_save's,
 * and its digest is the SHA-256 of the same bytes with batches = 0. */
static void test_observer_layout(void **state)
{
    (void)state;
    qcal_observer *o = make(QCAL_OBSERVER_MINMAX);
    float x[16] = { 1.5f, -2.25f, NAN, 3.0f, 0.0f, 0.5f, 1.0f, 2.0f,
                    -1.0f, 0.25f, 0.125f, 1.75f, 2.5f, -0.5f, 0.75f, 1.25f };
    feed(o, x, 2);
    feed(o, x, 2);
    void *buf;
    size_t len;
    save(o, &buf, &len);
    uint8_t want[256], *p = want;
    memcpy(p, "QCOB", 4), p += 4;
    put32(&p, 2);                            /* version */
    put32(&p, QCAL_OBSERVER_MINMAX);
    put32(&p, QCAL_QUINT8);
    put32(&p, QCAL_PER_TENSOR_AFFINE);
    put32(&p, 0);                            /* reduce_range */
    put32(&p, 0);                            /* custom_range */
    const qcal_observer_config *c = qcal_observer_get_config(o);
    put64(&p, (uint64_t)c->q.quant_min);     /* as stored (only used with custom_range) */
    put64(&p, (uint64_t)c->q.quant_max);
    putf(&p, c->q.eps);
    put32(&p, 0);                            /* axis */
    putf(&p, 0.01f);                         /* averaging_constant */
    put32(&p, 2048);                         /* bins */
    put32(&p, (uint32_t)c->grid);            /* histogram family's grid (slot 60) */
    putd(&p, 99.99);                         /* percentile */
    put32(&p, 0);                            /* percentile_mode */
    put32(&p, 128);                          /* entropy_levels */
    put32(&p, 0);                            /* nonfinite policy */
    assert_int_equal(p - want, 84);
    put64(&p, 2);                            /* nonfinite: the NaN, twice */
    uint8_t *batches_at = p;
    put64(&p, 2);                            /* batches */
    put64(&p, 8);                            /* payload bytes */
    putf(&p, -2.25f);
    putf(&p, 3.0f);
    assert_int_equal(len, (size_t)(p - want));
    assert_memory_equal(buf, want, len);
    char hex[65], want_hex[65];
    memset(batches_at, 0, 8);
    qcal_sha256_hex(want, len, want_hex);
    assert_int_equal(qcal_observer_digest(o, hex), QCAL_OK);
    assert_string_equal(hex, want_hex);
    qcal_free(buf);
    qcal_observer_destroy(&o);
}

/* ---- observer state: round trips, digests, hostile bytes ---- */

static void test_observer_roundtrip(void **state)
{
    (void)state;
    float x[8 * 64];
    for (int i = 0; i < 8 * 64; i++)
        x[i] = rnd_f() * 10.0f;
    x[17] = INFINITY;
    char dir[] = "/tmp/qcal_state_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (size_t k = 0; k < NKINDS; k++) {
        qcal_observer *o = make(all_kinds[k]), *back = NULL;
        /* Empty first, then with data. */
        for (int round = 0; round < 2; round++) {
            if (round)
                feed(o, x, 64);
            void *b1, *b2;
            size_t l1, l2;
            save(o, &b1, &l1);
            assert_int_equal(qcal_observer_load(b1, l1, &back), QCAL_OK);
            save(back, &b2, &l2);
            assert_true(l1 == l2 && !memcmp(b1, b2, l1));
            char h1[65], h2[65];
            assert_int_equal(qcal_observer_digest(o, h1), QCAL_OK);
            assert_int_equal(qcal_observer_digest(back, h2), QCAL_OK);
            assert_string_equal(h1, h2);
            assert_int_equal(strlen(h1), 64);
            qcal_observer_destroy(&back);
            /* Files: atomic save, load, same bytes. */
            const char *path = tu_path(dir, "obs.state");
            assert_int_equal(qcal_observer_save_file(o, path), QCAL_OK);
            size_t fl;
            void *fb = tu_read_file(path, &fl);
            assert_true(fl == l1 && !memcmp(fb, b1, l1));
            free(fb);
            assert_int_equal(qcal_observer_load_file(path, &back), QCAL_OK);
            qcal_observer_destroy(&back);
            assert_int_equal(tu_count_entries(dir, ".tmp"), 0);
            /* Every truncation and one extra byte fail cleanly, output untouched. */
            qcal_observer *sentinel = (qcal_observer *)(uintptr_t)1, *out = sentinel;
            for (size_t cut = 0; cut < l1; cut++) {
                assert_true(qcal_observer_load(b1, cut, &out) < 0);
                assert_true(out == sentinel);
                assert_true(qcal_last_error()[0] != '\0');
            }
            uint8_t *longer = malloc(l1 + 1);
            memcpy(longer, b1, l1);
            longer[l1] = 0;
            assert_int_equal(qcal_observer_load(longer, l1 + 1, &out), QCAL_ERR_FORMAT);
            /* Version and magic. */
            memcpy(longer, b1, l1);
            longer[4] = 1;
            assert_int_equal(qcal_observer_load(longer, l1, &out), QCAL_ERR_UNSUPPORTED);
            assert_non_null(strstr(qcal_last_error(), "version 1"));
            longer[4] = 2;
            longer[0] = 'X';
            assert_int_equal(qcal_observer_load(longer, l1, &out), QCAL_ERR_FORMAT);
            /* Byte flips anywhere: an error or a valid observer, never a crash. */
            for (size_t i = 0; i < l1; i++) {
                memcpy(longer, b1, l1);
                longer[i] ^= (uint8_t)(1u << (i % 8));
                qcal_observer *f = NULL;
                if (qcal_observer_load(longer, l1, &f) == QCAL_OK) {
                    float a[8], b[8];
                    int64_t n;
                    qcal_observer_qrange(f, 8, a, b, &n);
                    qcal_observer_destroy(&f);
                }
            }
            free(longer);
            qcal_free(b1);
            qcal_free(b2);
        }
        qcal_observer_destroy(&o);
    }
    qcal_observer *out = NULL;
    assert_int_equal(qcal_observer_load_file(tu_path(dir, "missing.state"), &out),
                     QCAL_ERR_NOT_FOUND);
    assert_non_null(strstr(qcal_last_error(), "missing.state"));
    tu_rm_tree(dir);
}

/* Random splits of the same batches over several observers, saved, loaded and merged in
 * random orders: the same report and the same digest as one observer fed everything (the
 * digest ignores the batch count, which differs). */
static void test_observer_split_merge(void **state)
{
    (void)state;
    enum { NB = 12, ROWS = 40, TRIALS = 200 };
    static float x[NB][8 * ROWS];
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 8 * ROWS; i++)
            x[b][i] = rnd_f() * (float)(1 + b) + (b == 7 && i == 3 ? 900.0f : 0.0f);
    for (size_t k = 0; k < NKINDS; k++) {
        if (!exact_kind(all_kinds[k]))
            continue;
        qcal_observer *whole = make(all_kinds[k]);
        for (int b = 0; b < NB; b++)
            feed(whole, x[b], ROWS);
        uint8_t want[512], got[512];
        size_t wl, gl;
        report(whole, want, sizeof want, &wl);
        char wh[65], gh[65];
        assert_int_equal(qcal_observer_digest(whole, wh), QCAL_OK);
        for (int t = 0; t < TRIALS; t++) {
            int parts = 1 + (int)(rnd_u32() % 5), perm[NB];
            for (int b = 0; b < NB; b++)
                perm[b] = b;
            for (int b = NB - 1; b > 0; b--) {
                int j = (int)(rnd_u32() % (uint32_t)(b + 1)), tmp = perm[b];
                perm[b] = perm[j];
                perm[j] = tmp;
            }
            qcal_observer *part[5];
            for (int p = 0; p < parts; p++)
                part[p] = make(all_kinds[k]);
            for (int b = 0; b < NB; b++)
                feed(part[rnd_u32() % (uint32_t)parts], x[perm[b]], ROWS);
            /* Through the state format, merged in a random order. */
            int first = (int)(rnd_u32() % (uint32_t)parts);
            qcal_observer *acc = NULL;
            void *buf;
            size_t len;
            save(part[first], &buf, &len);
            assert_int_equal(qcal_observer_load(buf, len, &acc), QCAL_OK);
            qcal_free(buf);
            for (int p = 0; p < parts; p++) {
                if (p == first)
                    continue;
                qcal_observer *l = NULL;
                save(part[p], &buf, &len);
                assert_int_equal(qcal_observer_load(buf, len, &l), QCAL_OK);
                qcal_free(buf);
                assert_int_equal(qcal_observer_merge(acc, l), QCAL_OK);
                qcal_observer_destroy(&l);
            }
            report(acc, got, sizeof got, &gl);
            assert_true(gl == wl);
            if (memcmp(got, want, wl))
                fail_msg("%s: trial %d (%d parts) reports differ from one observer",
                         qcal_observer_kind_name(all_kinds[k]), t, parts);
            assert_int_equal(qcal_observer_digest(acc, gh), QCAL_OK);
            assert_string_equal(gh, wh);
            uint64_t nb = 0;
            qcal_observer_batches(acc, &nb);
            assert_int_equal(nb, NB);
            qcal_observer_destroy(&acc);
            for (int p = 0; p < parts; p++)
                qcal_observer_destroy(&part[p]);
        }
        /* Different data, different digest. */
        feed(whole, x[0], 1);
        assert_int_equal(qcal_observer_digest(whole, gh), QCAL_OK);
        if (all_kinds[k] != QCAL_OBSERVER_MINMAX && all_kinds[k] != QCAL_OBSERVER_PER_CHANNEL_MINMAX)
            assert_string_not_equal(gh, wh);
        qcal_observer_destroy(&whole);
    }
}

/* ---- merge refusals ---- */

static void test_merge_refusals(void **state)
{
    (void)state;
    float x[8 * 4];
    for (int i = 0; i < 32; i++)
        x[i] = (float)i - 10.0f;
    qcal_observer *mm = make(QCAL_OBSERVER_MINMAX), *h = make(QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(qcal_observer_merge(mm, h), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "histogram"));
    assert_non_null(strstr(qcal_last_error(), "minmax"));
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    cfg.bins = 1024;
    qcal_observer *h2 = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &h2), QCAL_OK);
    assert_int_equal(qcal_observer_merge(h, h2), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "bins 2048 vs 1024"));
    char diff[64];
    assert_int_equal(qcal_observer_config_compare(qcal_observer_get_config(h), &cfg, diff,
                                                  sizeof diff), QCAL_ERR_MISMATCH);
    assert_string_equal(diff, "bins 2048 vs 1024");
    assert_int_equal(qcal_observer_config_compare(&cfg, &cfg, diff, sizeof diff), QCAL_OK);
    assert_string_equal(diff, "");
    /* Moving averages: refused when both saw data, a copy when one side is empty. */
    for (int pc = 0; pc < 2; pc++) {
        qcal_observer_kind k = pc ? QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX
                                  : QCAL_OBSERVER_MOVING_AVERAGE_MINMAX;
        qcal_observer *a = make(k), *b = make(k), *e = make(k);
        feed(a, x, 4);
        feed(b, x, 4);
        assert_int_equal(qcal_observer_merge_check(a, b), QCAL_ERR_UNSUPPORTED);
        assert_int_equal(qcal_observer_merge(a, b), QCAL_ERR_UNSUPPORTED);
        assert_non_null(strstr(qcal_last_error(), "order"));
        assert_int_equal(qcal_observer_merge(a, e), QCAL_OK);
        assert_int_equal(qcal_observer_merge(e, b), QCAL_OK);
        char ha[65], hb[65];
        qcal_observer_digest(b, hb);
        qcal_observer_digest(e, ha);
        assert_string_equal(ha, hb);
        qcal_observer_destroy(&a);
        qcal_observer_destroy(&b);
        qcal_observer_destroy(&e);
    }
    /* Per-channel counts. */
    qcal_observer *p = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX), *q = make(QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    feed(p, x, 4);
    qcal_tensor t;
    int64_t shape[2] = { 4, 8 };
    qcal_tensor_init(&t, x, 2, shape);
    assert_int_equal(qcal_observer_update(q, &t), QCAL_OK);
    assert_int_equal(qcal_observer_merge_check(p, q), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "channels"));
    qcal_observer_destroy(&p);
    qcal_observer_destroy(&q);
    qcal_observer_destroy(&mm);
    qcal_observer_destroy(&h);
    qcal_observer_destroy(&h2);
}

/* ---- session state ---- */

static qcal_calib_session *new_session(bool minmax_acts)
{
    qcal_calib_rules *r = NULL;
    assert_int_equal(qcal_calib_rules_create(&r), QCAL_OK);
    if (minmax_acts) {
        qcal_observer_config c;
        qcal_observer_config_default(&c, QCAL_OBSERVER_MINMAX);
        assert_int_equal(qcal_calib_rules_add(r, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &c), QCAL_OK);
    }
    qcal_calib_session_options o;
    qcal_calib_session_options_default(&o);
    o.rules = r;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&o, &s), QCAL_OK);
    qcal_calib_rules_destroy(&r);
    return s;
}

static const char *const names[] = { "conv1", "conv2", "fc", "fc.weight", "conv1.weight" };

static void observe(qcal_calib_session *s, int name, int64_t step, const float *x)
{
    qcal_tensor t;
    int64_t shape[2] = { 8, 16 };
    qcal_tensor_init(&t, x, 2, shape);
    qcal_calib_role role = strstr(names[name], ".weight") ? QCAL_CALIB_ROLE_WEIGHT
                                                          : QCAL_CALIB_ROLE_ACTIVATION;
    assert_int_equal(qcal_calib_session_observe(s, names[name], role, step, &t), QCAL_OK);
}

static char *table_json(qcal_calib_session *s)
{
    qcal_calib_table *t = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    char *json = NULL;
    size_t len = 0;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &json, &len), QCAL_OK);
    char hex[65], sh[65];
    assert_int_equal(qcal_calib_table_digest(t, hex), QCAL_OK);
    assert_int_equal(qcal_calib_session_digest(s, sh), QCAL_OK);
    assert_string_equal(hex, sh);
    char field[96];
    snprintf(field, sizeof field, "\"digest\": \"%s\"", hex);
    assert_non_null(strstr(json, field));
    /* Read back: the digest survives. */
    qcal_calib_table *back = NULL;
    assert_int_equal(qcal_calib_table_parse_json(json, len, &back), QCAL_OK);
    assert_int_equal(qcal_calib_table_digest(back, sh), QCAL_OK);
    assert_string_equal(hex, sh);
    qcal_calib_table_destroy(&back);
    qcal_calib_table_destroy(&t);
    return json;
}

static void test_session_split_merge(void **state)
{
    (void)state;
    enum { STEPS = 10 };
    static float x[5][STEPS][128];
    for (int n = 0; n < 5; n++)
        for (int b = 0; b < STEPS; b++)
            for (int i = 0; i < 128; i++)
                x[n][b][i] = rnd_f() * (float)(n + 1) * (b == 3 ? 20.0f : 1.0f);
    bool minmax_acts = !QCAL_TEST_HIST_EXACT;
    qcal_calib_session *whole = new_session(minmax_acts);
    for (int n = 0; n < 5; n++)
        for (int b = 0; b < STEPS; b++)
            observe(whole, n, b, x[n][b]);
    char *want = table_json(whole);
    for (int trial = 0; trial < 20; trial++) {
        /* Steps dealt to three sessions; "fc" only ever in the last one. */
        qcal_calib_session *part[3];
        int64_t next[3][5];
        memset(next, 0, sizeof next);
        for (int p = 0; p < 3; p++)
            part[p] = new_session(minmax_acts);
        for (int n = 0; n < 5; n++)
            for (int b = 0; b < STEPS; b++) {
                int p = n == 2 ? 2 : (int)(rnd_u32() % 3);
                observe(part[p], n, next[p][n]++, x[n][b]);
            }
        /* Save all, merge the states into a loaded first one, in a random order. */
        void *buf[3];
        size_t len[3];
        for (int p = 0; p < 3; p++)
            assert_int_equal(qcal_calib_session_save(part[p], &buf[p], &len[p]), QCAL_OK);
        int order[3] = { 0, 1, 2 };
        for (int i = 2; i > 0; i--) {
            int j = (int)(rnd_u32() % (uint32_t)(i + 1)), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        qcal_calib_session *m = NULL;
        assert_int_equal(qcal_calib_session_load(buf[order[0]], len[order[0]], NULL, &m), QCAL_OK);
        assert_int_equal(qcal_calib_session_merge_state(m, buf[order[1]], len[order[1]]), QCAL_OK);
        assert_int_equal(qcal_calib_session_merge(m, part[order[2]]), QCAL_OK);
        char *got = table_json(m);
        assert_string_equal(got, want);
        free(got);
        /* The merged session's state round-trips to the same bytes. */
        void *mb, *mb2;
        size_t ml, ml2;
        assert_int_equal(qcal_calib_session_save(m, &mb, &ml), QCAL_OK);
        qcal_calib_session *m2 = NULL;
        assert_int_equal(qcal_calib_session_load(mb, ml, NULL, &m2), QCAL_OK);
        assert_int_equal(qcal_calib_session_save(m2, &mb2, &ml2), QCAL_OK);
        assert_true(ml == ml2 && !memcmp(mb, mb2, ml));
        qcal_free(mb);
        qcal_free(mb2);
        qcal_calib_session_destroy(&m2);
        qcal_calib_session_destroy(&m);
        for (int p = 0; p < 3; p++) {
            qcal_free(buf[p]);
            qcal_calib_session_destroy(&part[p]);
        }
    }
    free(want);
    qcal_calib_session_destroy(&whole);
}

static void test_session_refusals(void **state)
{
    (void)state;
    float x[128];
    for (int i = 0; i < 128; i++)
        x[i] = rnd_f();
    /* conv1 as minmax in one, histogram in the other: refused, dst unchanged. */
    qcal_calib_session *a = new_session(true), *b = new_session(false);
    observe(a, 0, 0, x);
    observe(a, 3, 0, x);
    observe(b, 0, 0, x);
    observe(b, 1, 0, x);
    char before[65], after[65];
    assert_int_equal(qcal_calib_session_digest(a, before), QCAL_OK);
    assert_int_equal(qcal_calib_session_merge(a, b), QCAL_ERR_MISMATCH);
    const char *msg = qcal_last_error();
    assert_non_null(strstr(msg, "conv1"));
    assert_non_null(strstr(msg, "observer minmax vs histogram"));
    assert_int_equal(qcal_calib_session_digest(a, after), QCAL_OK);
    assert_string_equal(before, after);
    int64_t n = 0;
    qcal_calib_session_count(a, &n);
    assert_int_equal(n, 2);   /* conv2 was not copied either */
    assert_int_equal(qcal_calib_session_merge(a, a), QCAL_ERR_INVALID_ARG);
    /* Queued batches are not state. (A batch ahead of its step is queued only for an
     * observer whose updates do not commute: the first-batch histogram grid here; the
     * default lattice grid takes it at once.) */
    qcal_calib_rules *qr = NULL;
    assert_int_equal(qcal_calib_rules_create(&qr), QCAL_OK);
    qcal_observer_config fb;
    qcal_observer_config_default(&fb, QCAL_OBSERVER_HISTOGRAM);
    fb.grid = QCAL_GRID_FIRST_BATCH;
    assert_int_equal(qcal_calib_rules_add(qr, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &fb),
                     QCAL_OK);
    qcal_calib_session_options qo;
    qcal_calib_session_options_default(&qo);
    qo.rules = qr;
    qcal_calib_session *q = NULL;
    assert_int_equal(qcal_calib_session_create(&qo, &q), QCAL_OK);
    qcal_calib_rules_destroy(&qr);
    observe(q, 0, 3, x);
    void *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_calib_session_save(q, &buf, &len), QCAL_ERR_STATE);
    assert_non_null(strstr(qcal_last_error(), "flush"));
    assert_int_equal(qcal_calib_session_flush(q), QCAL_OK);
    assert_int_equal(qcal_calib_session_save(q, &buf, &len), QCAL_OK);
    qcal_free(buf);
    qcal_calib_session_destroy(&q);
    qcal_calib_session_destroy(&a);
    qcal_calib_session_destroy(&b);
}

static void test_session_hostile(void **state)
{
    (void)state;
    float x[128];
    for (int i = 0; i < 128; i++)
        x[i] = rnd_f();
    qcal_calib_session *s = new_session(false);
    observe(s, 0, 0, x);
    observe(s, 3, 0, x);
    observe(s, 1, 0, x);
    void *buf;
    size_t len;
    assert_int_equal(qcal_calib_session_save(s, &buf, &len), QCAL_OK);
    /* Layout: header, then the first entry is conv1 (sorted). */
    const uint8_t *p = buf;
    assert_memory_equal(p, "QCSS", 4);
    uint32_t v;
    uint64_t cnt;
    memcpy(&v, p + 4, 4);
    memcpy(&cnt, p + 8, 8);
    assert_int_equal(v, 1);
    assert_int_equal(cnt, 3);
    memcpy(&v, p + 16, 4);
    assert_int_equal(v, 5);
    assert_memory_equal(p + 20, "conv1", 5);
    qcal_calib_session *sentinel = (qcal_calib_session *)(uintptr_t)1, *out = sentinel;
    for (size_t cut = 0; cut < len; cut++) {
        assert_true(qcal_calib_session_load(buf, cut, NULL, &out) < 0);
        assert_true(out == sentinel);
    }
    uint8_t *bad = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, buf, len);
        bad[i] ^= (uint8_t)(0x80u >> (i % 8));
        qcal_calib_session *l = NULL;
        if (qcal_calib_session_load(bad, len, NULL, &l) == QCAL_OK) {
            qcal_calib_table *t = NULL;
            if (qcal_calib_session_table(l, &t) == QCAL_OK)
                qcal_calib_table_destroy(&t);
            qcal_calib_session_destroy(&l);
        }
    }
    /* Entries out of order: swap the first name's bytes to sort after the others. */
    memcpy(bad, buf, len);
    bad[20] = 'z';
    assert_int_equal(qcal_calib_session_load(bad, len, NULL, &out), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "order"));
    /* A claimed entry count the bytes cannot hold. */
    memcpy(bad, buf, len);
    cnt = UINT64_MAX / 2;
    memcpy(bad + 8, &cnt, 8);
    assert_int_equal(qcal_calib_session_load(bad, len, NULL, &out), QCAL_ERR_FORMAT);
    memcpy(bad, buf, len);
    bad[len] = 0;
    assert_int_equal(qcal_calib_session_load(bad, len + 1, NULL, &out), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "trailing"));
    /* An observer state of the wrong magic is reported with its entry. */
    memcpy(bad, buf, len);
    bad[16 + 4 + 5 + 4 + 8 + 8] = 'X';
    assert_int_equal(qcal_calib_session_load(bad, len, NULL, &out), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "conv1"));
    assert_true(out == sentinel);
    free(bad);
    /* Files. */
    char dir[] = "/tmp/qcal_sstate_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *path = tu_path(dir, "s.state");
    assert_int_equal(qcal_calib_session_save_file(s, path), QCAL_OK);
    qcal_calib_session *l = NULL;
    assert_int_equal(qcal_calib_session_load_file(path, NULL, &l), QCAL_OK);
    char h1[65], h2[65];
    qcal_calib_session_digest(s, h1);
    qcal_calib_session_digest(l, h2);
    assert_string_equal(h1, h2);
    qcal_calib_session_destroy(&l);
    tu_write_bytes(path, buf, 10);
    assert_int_equal(qcal_calib_session_load_file(path, NULL, &l), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "s.state"));
    tu_rm_tree(dir);
    qcal_free(buf);
    qcal_calib_session_destroy(&s);
}

/* The fuzz seeds are written by tests/fuzz/make_seeds.py from docs/state.md alone (Python,
 * an independent writer of the format): every one loads, and saves back to the same bytes
 * except the two stored but unused quant_min/quant_max words of each config. */
static void test_documented_seeds(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/fuzz_state", root ? root : ".");
    static const char *const obs[] = { "minmax.state", "minmax_empty.state",
                                       "moving_average.state", "per_channel.state",
                                       "histogram_lattice.state", "entropy_lattice.state",
                                       "entropy_signed_lattice.state",
                                       "percentile_auto_lattice.state" };
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++) {
        size_t len;
        void *buf = tu_read_file(tu_path(dir, obs[i]), &len);
        qcal_observer *o = NULL;
        if (qcal_observer_load(buf, len, &o) != QCAL_OK)
            fail_msg("%s: %s", obs[i], qcal_last_error());
        void *back;
        size_t bl;
        save(o, &back, &bl);
        assert_int_equal(bl, len);
        assert_memory_equal((uint8_t *)back + 44, (uint8_t *)buf + 44, len - 44);
        assert_memory_equal(back, buf, 28);
        qcal_free(back);
        qcal_observer_destroy(&o);
        if (strcmp(obs[i], "entropy_signed_lattice.state") == 0) {
            /* The same bytes as version 2 held |x| for an affine entropy observer: refused. */
            ((uint8_t *)buf)[4] = 2;
            assert_int_equal(qcal_observer_load(buf, len, &o), QCAL_ERR_UNSUPPORTED);
            assert_non_null(strstr(qcal_last_error(), "version 2 of a entropy observer"));
        }
        free(buf);
    }
    size_t len;
    void *buf = tu_read_file(tu_path(dir, "session.state"), &len);
    qcal_calib_session *s = NULL;
    if (qcal_calib_session_load(buf, len, NULL, &s) != QCAL_OK)
        fail_msg("session.state: %s", qcal_last_error());
    int64_t n = 0;
    qcal_calib_session_count(s, &n);
    assert_int_equal(n, 4);
    uint64_t el = 0;
    assert_int_equal(qcal_calib_session_stats(s, "fc", QCAL_CALIB_ROLE_ACTIVATION, NULL, &el,
                                              NULL, NULL), QCAL_OK);
    assert_int_equal(el, 12);
    qcal_calib_table *t = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    const qcal_calib_entry *e = NULL;
    assert_int_equal(qcal_calib_table_find(t, "conv1", QCAL_CALIB_ROLE_ACTIVATION, &e), QCAL_OK);
    assert_true(e->min_val[0] == -2.25f && e->max_val[0] == 3.0f && e->nonfinite == 2);
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&s);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_observer_layout),
        cmocka_unit_test(test_observer_roundtrip),
        cmocka_unit_test(test_observer_split_merge),
        cmocka_unit_test(test_merge_refusals),
        cmocka_unit_test(test_session_split_merge),
        cmocka_unit_test(test_session_refusals),
        cmocka_unit_test(test_session_hostile),
        cmocka_unit_test(test_documented_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
