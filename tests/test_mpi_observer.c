/* mpi.observer (run under mpirun -np 1..4): libqcal_mpi on observers.
 *  - all-reduce and reduce give, on every rank, the save bytes of the same rank-ordered
 *    merges done in one process, and (order-independent kinds whose merges are exact) the
 *    bytes of one observer fed every batch;
 *  - moving averages: one rank with data merges exactly, several are refused everywhere;
 *  - the data-parallel update equals one observer updated with the whole batches, bit for
 *    bit (min/max kinds) on every rank;
 *  - sessions: reduce onto every root and all-reduce equal one process's session (state
 *    bytes), a moving average held by several ranks is refused everywhere;
 *  - faults (NULL, a config differing on the last rank, a bad root) give the same status on
 *    every rank, with the failing rank named, and nothing waits.
 * Plain C (not cmocka): a failed check prints the rank and aborts the job, so no rank is left
 * in a collective. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "qcal/mpi.h"
#include "qcal/qcal.h"

static int rank, size, checks;

static void check(int ok, const char *fmt, ...)
{
    checks++;
    if (ok)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mpi.observer: rank %d of %d: FAIL: ", rank, size);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (last error: %s)\n", qcal_last_error());
    va_end(ap);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Batch b of a kind's test data: 4 x 8 x 6 floats, its own seed; batch 3 holds outliers and
 * batch 5 a NaN, so ranges move late and non-finite counts add up. */
enum { NB = 9, B_ROWS = 4, B_COLS = 8, B_DEPTH = 6, B_NUMEL = B_ROWS * B_COLS * B_DEPTH };

static void batch(int b, float *d)
{
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(b + 1);
    for (int i = 0; i < B_NUMEL; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float u = (float)((s >> 40) & 0xffffff) / 16777216.0f;
        d[i] = (u - 0.4f) * (float)(1 + b % 4) * 3.0f;
    }
    if (b == 3) {
        d[5] = 900.0f;
        d[17] = -650.0f;
    }
    if (b == 5)
        d[11] = NAN;
}

static void as_tensor(float *d, int64_t n0, qcal_tensor *t)
{
    int64_t shape[3] = { n0, B_COLS, B_DEPTH };
    check(qcal_tensor_init(t, d, 3, shape) == QCAL_OK, "tensor init");
}

static void *save(const qcal_observer *o, size_t *len)
{
    void *buf = NULL;
    check(qcal_observer_save(o, &buf, len) == QCAL_OK, "save");
    return buf;
}

static void same_bytes(const qcal_observer *a, const qcal_observer *b, const char *what)
{
    size_t la, lb;
    void *ba = save(a, &la), *bb = save(b, &lb);
    check(la == lb && !memcmp(ba, bb, la), "%s: save blobs differ (%zu vs %zu bytes)", what, la, lb);
    qcal_free(ba);
    qcal_free(bb);
}

/* Same clipping range and qparams, bit for bit (per-tensor kinds). */
static void same_qparams(qcal_observer *a, qcal_observer *b, const char *what)
{
    float lo[2], hi[2], sc[2];
    int32_t zp[2];
    int64_t n;
    qcal_observer_qrange(a, 1, &lo[0], &hi[0], &n);
    qcal_observer_qrange(b, 1, &lo[1], &hi[1], &n);
    qcal_qparams qa, qb;
    memset(&qa, 0, sizeof qa);
    memset(&qb, 0, sizeof qb);
    qcal_observer_qparams(a, &qa);
    qcal_observer_qparams(b, &qb);
    sc[0] = qa.scale, zp[0] = qa.zero_point, sc[1] = qb.scale, zp[1] = qb.zero_point;
    qcal_qparams_free(&qa);
    qcal_qparams_free(&qb);
    check(!memcmp(&lo[0], &lo[1], sizeof(float)) && !memcmp(&hi[0], &hi[1], sizeof(float)) &&
              !memcmp(&sc[0], &sc[1], sizeof(float)) && zp[0] == zp[1],
          "%s: data-parallel range [%g, %g] scale %g zp %d, one process [%g, %g] scale %g zp %d",
          what, lo[0], hi[0], sc[0], zp[0], lo[1], hi[1], sc[1], zp[1]);
}

static qcal_observer *make(qcal_observer_kind k)
{
    qcal_observer_config c;
    qcal_observer_config_default(&c, k);
    if (k == QCAL_OBSERVER_HISTOGRAM || k == QCAL_OBSERVER_ENTROPY || k == QCAL_OBSERVER_MSE ||
        k == QCAL_OBSERVER_PERCENTILE)
        c.bins = 512;
    if (k == QCAL_OBSERVER_PER_CHANNEL_MINMAX || k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)
        c.axis = 1;   /* channels across the rows the data-parallel test splits */
    qcal_observer *o = NULL;
    check(qcal_observer_create(&c, &o) == QCAL_OK, "create %s", qcal_observer_kind_name(k));
    return o;
}

static bool moving(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

/* One process: rank r's observer (batches b with b % size == r), merged along the tree. */
static qcal_observer *rank_obs(qcal_observer_kind k, int r)
{
    qcal_observer *o = make(k);
    float d[B_NUMEL];
    for (int b = r; b < NB; b += size) {
        batch(b, d);
        qcal_tensor t;
        as_tensor(d, B_ROWS, &t);
        check(qcal_observer_update(o, &t) == QCAL_OK, "update");
    }
    return o;
}

/* The tree of qcal/mpi.h rooted at root, replayed in one process. */
static qcal_observer *tree_ref(qcal_observer_kind k, int root)
{
    qcal_observer **p = calloc((size_t)size, sizeof *p);
    for (int v = 0; v < size; v++)
        p[v] = rank_obs(k, (v + root) % size);
    for (int mask = 1; mask < size; mask <<= 1)
        for (int v = 0; v + mask < size; v += 2 * mask)
            check(qcal_observer_merge(p[v], p[v + mask]) == QCAL_OK, "reference merge");
    for (int v = 1; v < size; v++)
        qcal_observer_destroy(&p[v]);
    qcal_observer *r = p[0];
    free(p);
    return r;
}

/* Exact merges: minmax kinds always; the histogram family when merging two halves in one
 * process gives the whole (the lattice histogram), checked here rather than assumed. */
static bool merges_exact(qcal_observer_kind k)
{
    if (moving(k))
        return false;
    qcal_observer *a = make(k), *b = make(k), *w = make(k);
    float d[B_NUMEL];
    for (int i = 0; i < NB; i++) {
        batch(i, d);
        qcal_tensor t;
        as_tensor(d, B_ROWS, &t);
        qcal_observer_update(i % 2 ? a : b, &t);
        qcal_observer_update(w, &t);
    }
    qcal_observer_merge(b, a);
    size_t l1, l2;
    void *x = save(b, &l1), *y = save(w, &l2);
    bool same = l1 == l2 && !memcmp(x, y, l1);
    qcal_free(x);
    qcal_free(y);
    qcal_observer_destroy(&a);
    qcal_observer_destroy(&b);
    qcal_observer_destroy(&w);
    return same;
}

static void test_reduce(qcal_observer_kind k)
{
    const char *name = qcal_observer_kind_name(k);
    if (moving(k)) {
        /* Only the last rank has data: exact; every rank with data: refused everywhere. */
        qcal_observer *o = make(k), *ref = make(k);
        float d[B_NUMEL];
        batch(2, d);
        qcal_tensor t;
        as_tensor(d, B_ROWS, &t);
        qcal_observer_update(ref, &t);
        if (rank == size - 1)
            qcal_observer_update(o, &t);
        check(qcal_mpi_observer_allreduce(o, MPI_COMM_WORLD) == QCAL_OK, "%s: one-sided", name);
        same_bytes(o, ref, name);
        if (size > 1) {
            qcal_observer_update(o, &t);
            qcal_observer *before = make(k);
            qcal_observer_merge(before, o);
            qcal_status st = qcal_mpi_observer_allreduce(o, MPI_COMM_WORLD);
            check(st == QCAL_ERR_STATE, "%s: two-sided merge accepted", name);
            same_bytes(o, before, "unchanged after refusal");
            qcal_observer_destroy(&before);
        }
        qcal_observer_destroy(&o);
        qcal_observer_destroy(&ref);
        return;
    }
    for (int root = 0; root < size; root++) {
        qcal_observer *o = rank_obs(k, rank), *before = rank_obs(k, rank);
        check(qcal_mpi_observer_reduce(o, root, MPI_COMM_WORLD) == QCAL_OK, "%s: reduce", name);
        if (rank == root) {
            qcal_observer *ref = tree_ref(k, root);
            same_bytes(o, ref, "reduce = one-process tree");
            qcal_observer_destroy(&ref);
        } else {
            same_bytes(o, before, "reduce leaves non-root ranks alone");
        }
        qcal_observer_destroy(&o);
        qcal_observer_destroy(&before);
    }
    qcal_observer *o = rank_obs(k, rank), *ref = tree_ref(k, 0);
    check(qcal_mpi_observer_allreduce(o, MPI_COMM_WORLD) == QCAL_OK, "%s: allreduce", name);
    same_bytes(o, ref, "allreduce = one-process tree");
    qcal_observer_destroy(&ref);
    if (merges_exact(k)) {
        qcal_observer *whole = make(k);
        float d[B_NUMEL];
        for (int b = 0; b < NB; b++) {
            batch(b, d);
            qcal_tensor t;
            as_tensor(d, B_ROWS, &t);
            qcal_observer_update(whole, &t);
        }
        same_bytes(o, whole, "allreduce = one observer fed every batch");
        qcal_observer_destroy(&whole);
    } else if (rank == 0) {
        printf("mpi.observer: %s: merges not exact in this build; checked against the "
               "one-process tree only\n", name);
    }
    qcal_observer_destroy(&o);
}

/* Data-parallel: batch b is split by rows over the ranks (rank r takes rows r, r+size, ...
 * packed in order; a rank may get none); the min/max kinds must match one observer fed the
 * whole batches bit for bit, on every rank. */
static void test_update(qcal_observer_kind k)
{
    const char *name = qcal_observer_kind_name(k);
    qcal_observer *o = make(k), *whole = make(k);
    float d[B_NUMEL], mine[B_NUMEL];
    int rows = B_ROWS - 1;   /* 3 rows: with 4 ranks one rank gets nothing */
    for (int b = 0; b < NB; b++) {
        batch(b, d);
        qcal_tensor t;
        as_tensor(d, rows, &t);
        check(qcal_observer_update(whole, &t) == QCAL_OK, "whole update");
        int n = 0;
        for (int r = rank; r < rows; r += size, n++)
            memcpy(mine + n * B_COLS * B_DEPTH, d + r * B_COLS * B_DEPTH,
                   B_COLS * B_DEPTH * sizeof(float));
        qcal_tensor s;
        as_tensor(mine, n, &s);
        check(qcal_mpi_observer_update(o, n ? &s : NULL, MPI_COMM_WORLD) == QCAL_OK,
              "%s: update %d", name, b);
    }
    bool hist = k == QCAL_OBSERVER_HISTOGRAM || k == QCAL_OBSERVER_PERCENTILE ||
                k == QCAL_OBSERVER_ENTROPY || k == QCAL_OBSERVER_MSE;
    if (!hist)
        same_bytes(o, whole, name);
    else if (merges_exact(k))
        same_qparams(o, whole, name);   /* batch counts differ: one per rank with data */
    /* Every rank holds the same bytes whatever the kind. */
    size_t len;
    void *buf = save(o, &len);
    unsigned long long h = 1469598103934665603ull, h0;
    for (size_t i = 0; i < len; i++)
        h = (h ^ ((unsigned char *)buf)[i]) * 1099511628211ull;
    h0 = h;
    MPI_Bcast(&h0, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    check(h == h0, "%s: ranks hold different states after the update", name);
    qcal_free(buf);
    qcal_observer_destroy(&o);
    qcal_observer_destroy(&whole);
}

/* A local QCAL_ERR_FORMAT with its message: loading a blob that is not a state. */
static qcal_status bad_load(void)
{
    qcal_observer *o = NULL;
    qcal_status st = qcal_observer_load("not a state", 11, &o);
    qcal_observer_destroy(&o);
    return st;
}

static void test_faults(void)
{
    /* A NULL observer on the last rank. */
    qcal_observer *o = make(QCAL_OBSERVER_MINMAX);
    int fr = -2;
    qcal_status st = qcal_mpi_observer_allreduce(rank == size - 1 ? NULL : o, MPI_COMM_WORLD);
    check(st == QCAL_ERR_INVALID_ARG, "NULL observer: status %d", st);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", size - 1);
    check(!strncmp(qcal_last_error(), want, strlen(want)), "NULL observer: message '%s'",
          qcal_last_error());
    /* A different config on the last rank: mismatch reported by its parent, everywhere. */
    qcal_observer *other = make(QCAL_OBSERVER_HISTOGRAM);
    st = qcal_mpi_observer_allreduce(rank == size - 1 ? other : o, MPI_COMM_WORLD);
    check(size == 1 ? st == QCAL_OK : st == QCAL_ERR_MISMATCH, "mismatch: status %d", st);
    /* A bad root, everywhere. */
    st = qcal_mpi_observer_reduce(o, size, MPI_COMM_WORLD);
    check(st == QCAL_ERR_INVALID_ARG, "bad root: status %d", st);
    /* qcal_mpi_agree: the lowest failing rank wins. */
    st = qcal_mpi_agree(rank >= size / 2 ? bad_load() : QCAL_OK, MPI_COMM_WORLD, &fr);
    check(st == QCAL_ERR_FORMAT && fr == size / 2, "agree: status %d rank %d", st, fr);
    qcal_observer_destroy(&o);
    qcal_observer_destroy(&other);
}

/* ---- Sessions ---------------------------------------------------------------------- */

static const char session_rules[] =
    "mm* activation minmax\n"
    "pc* activation per_channel_minmax axis=1\n"
    "ma* activation moving_average_minmax\n"
    "hi* activation histogram bins=256\n";

/* Tensor t's batches b: on rank (t + b) % size, or all on rank t % size for the moving
 * averages (ranks < 0: one process, everything). */
static qcal_calib_session *session_of(int r, const qcal_calib_rules *rules, bool hist)
{
    static const char *names[] = { "mm.a", "mm.b", "pc.a", "ma.a", "ma.b", "hi.a", "hi.b" };
    qcal_calib_session_options o;
    qcal_calib_session_options_default(&o);
    o.rules = rules;
    qcal_calib_session *s = NULL;
    check(qcal_calib_session_create(&o, &s) == QCAL_OK, "session create");
    float d[B_NUMEL];
    for (int t = 0; t < 7; t++) {
        if (!hist && names[t][0] == 'h')
            continue;
        int64_t step = 0;
        for (int b = 0; b < NB; b++) {
            int owner = names[t][0] == 'm' && names[t][1] == 'a' ? t % size : (t + b) % size;
            if (r >= 0 && owner != r)
                continue;
            batch(b * 7 + t, d);
            qcal_tensor x;
            as_tensor(d, B_ROWS, &x);
            check(qcal_calib_session_observe(s, names[t], QCAL_CALIB_ROLE_ACTIVATION, step++, &x) ==
                      QCAL_OK, "observe %s", names[t]);
        }
    }
    return s;
}

static void same_session(qcal_calib_session *a, qcal_calib_session *b, const char *what)
{
    void *x = NULL, *y = NULL;
    size_t lx = 0, ly = 0;
    check(qcal_calib_session_save(a, &x, &lx) == QCAL_OK && qcal_calib_session_save(b, &y, &ly) ==
              QCAL_OK, "session save");
    check(lx == ly && !memcmp(x, y, lx), "%s: session states differ (%zu vs %zu bytes)", what, lx, ly);
    qcal_free(x);
    qcal_free(y);
}

static void test_sessions(void)
{
    qcal_calib_rules *rules = NULL;
    check(qcal_calib_rules_parse(session_rules, strlen(session_rules), &rules) == QCAL_OK, "rules");
    bool hist = merges_exact(QCAL_OBSERVER_HISTOGRAM);
    qcal_calib_session *whole = session_of(-1, rules, hist);
    for (int root = 0; root < size; root++) {
        qcal_calib_session *s = session_of(rank, rules, hist), *before = session_of(rank, rules, hist);
        check(qcal_mpi_session_reduce(s, root, MPI_COMM_WORLD) == QCAL_OK, "session reduce");
        same_session(s, rank == root ? whole : before, rank == root ? "reduce = one process"
                                                                  : "reduce leaves non-root alone");
        qcal_calib_session_destroy(&s);
        qcal_calib_session_destroy(&before);
    }
    qcal_calib_session *s = session_of(rank, rules, hist);
    check(qcal_mpi_session_allreduce(&s, NULL, MPI_COMM_WORLD) == QCAL_OK, "session allreduce");
    same_session(s, whole, "allreduce = one process");
    /* A moving average with data on every rank: refused everywhere, nothing changes. */
    if (size > 1) {
        qcal_calib_session *mine = session_of(rank, rules, hist), *before = NULL;
        float d[B_NUMEL];
        batch(1, d);
        qcal_tensor x;
        as_tensor(d, B_ROWS, &x);
        qcal_calib_session_observe(mine, "ma.shared", QCAL_CALIB_ROLE_ACTIVATION, 0, &x);
        before = mine;
        void *b0 = NULL;
        size_t l0 = 0;
        qcal_calib_session_save(mine, &b0, &l0);
        qcal_status st = qcal_mpi_session_reduce(mine, 0, MPI_COMM_WORLD);
        check(st < 0 && strstr(qcal_last_error(), "rank "), "two moving averages: status %d", st);
        void *b1 = NULL;
        size_t l1 = 0;
        qcal_calib_session_save(before, &b1, &l1);
        check(l0 == l1 && !memcmp(b0, b1, l0), "refused reduce changed the session");
        qcal_free(b0);
        qcal_free(b1);
        st = qcal_mpi_session_allreduce(&mine, NULL, MPI_COMM_WORLD);
        check(st < 0 && mine == before, "two moving averages: all-reduce status %d", st);
        qcal_calib_session_destroy(&mine);
    }
    if (rank == 0 && !hist)
        printf("mpi.observer: sessions: histogram entries left out (merges not exact in this build)\n");
    qcal_calib_session_destroy(&s);
    qcal_calib_session_destroy(&whole);
    qcal_calib_rules_destroy(&rules);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        test_reduce((qcal_observer_kind)k);
        test_update((qcal_observer_kind)k);
    }
    test_faults();
    test_sessions();
    int total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi.observer: %d ranks, %d checks passed\n", size, total);
    MPI_Finalize();
    return 0;
}
