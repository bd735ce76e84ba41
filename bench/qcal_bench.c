/* qcal_bench: qcal's kernels side by side with PyTorch 1.13 and the memory-bandwidth limit.
 *
 * Usage: qcal_bench [--threads 1,2] [--json bench-results.json] [--torch "CMD"]
 *                   [--no-scaling] [--only NAME[,NAME...]] [--quick]
 *   --torch CMD  command that runs bench/torch_ref.py (e.g. "/usr/bin/python3 bench/torch_ref.py");
 *                started once per thread count with "--serve --threads T", it times each row
 *                right before qcal does (one JSON line per row). Without it the torch
 *                columns are null.
 *   --quick      fewer repetitions and a smaller bandwidth probe (smoke runs, meson benchmark).
 *
 * For each thread count: the STREAM-like probe (bandwidth.c) measures read and copy
 * bandwidth, PyTorch (if asked) times the same operations on the same sizes with the same
 * thread count, then every qcal row is verified, warmed up and timed (median of repeats,
 * min and max kept; CLOCK_MONOTONIC). Each row's outputs are hashed after a canonical run;
 * the hashes of different thread counts must be equal (results bit-identical), which the
 * bench checks and reports. A scaling table (1K..64M elements) follows.
 * Writes the rows as JSON (see bench/run and docs/performance.md) and prints Markdown.
 * Exit status: 0, or 1 if a verification or the bit-identity check failed. */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bandwidth.h"
#include "qcal/qcal.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif
#if BENCH_HAVE_CNN
#include "cnn.h"
#endif

#define M16 (16ll << 20)
#define M1 (1ll << 20)
#define MAXT 4

/* ---- utilities ------------------------------------------------------------------------ */

/* A writable view of data with t's shape (an output as large as t). */
static qcal_tensor_mut mut_of(const qcal_tensor *t, float *data)
{
    qcal_tensor_mut m = { .data = data, .ndim = t->ndim };
    memcpy(m.shape, t->shape, sizeof m.shape);
    return m;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Standard normal (Box-Muller on 24-bit uniforms), fixed seed. */
static void fill_randn(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = ((double)(rng_next() >> 40) + 0.5) / 16777216.0;
        double u2 = (double)(rng_next() >> 40) / 16777216.0;
        double r = sqrt(-2.0 * log(u1));
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    if (!p) {
        fprintf(stderr, "qcal_bench: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    memset(p, 0, bytes);
    return p;
}

static int g_quick;
static int g_failed;

#define CHECK(call)                                                                      \
    do {                                                                                 \
        qcal_status st_ = (call);                                                        \
        if (st_ < 0) {                                                                   \
            fprintf(stderr, "qcal_bench: %s failed: %s (%s)\n", #call,                   \
                    qcal_status_str(st_), qcal_last_error());                            \
            exit(2);                                                                     \
        }                                                                                \
    } while (0)

static void set_threads(int t)
{
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/* ---- timing ------------------------------------------------------------------------------ */

/* Lets the other side's idle OpenMP workers stop spinning before a measurement (PyTorch's
 * pool keeps both cores busy for a while after its last parallel region, which slowed the
 * next qcal row 2-4x with 2 threads). */
static void settle(void)
{
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

typedef struct timing {
    double med, min, max; /* seconds per call */
    int reps;
} timing;

typedef void (*op_fn)(void *ctx);

/* Warm-up, then repeated samples; each sample runs `inner` calls so that it lasts at least
 * ~2 ms (small tensors); samples until ~budget seconds or max_reps. Median/min/max per call. */
static int g_paired_sample; /* 1: a sample of a pair (fewer repeats; the pairs give the spread) */

static timing measure(op_fn fn, void *ctx, double budget)
{
    double t0 = now_s();
    fn(ctx);
    double first = now_s() - t0;
    int inner = 1;
    if (first < 2e-3) {
        t0 = now_s();
        fn(ctx);
        double t1 = now_s() - t0;
        inner = (int)(2e-3 / (t1 > 1e-8 ? t1 : 1e-8)) + 1;
        if (inner > 100000)
            inner = 100000;
    } else if (first < 0.3) {
        fn(ctx); /* second warm-up for anything that is not very slow */
    }
    double per = first > 1e-9 ? first : 1e-9;
    int reps = (int)(budget / (per * inner));
    int min_reps = g_quick || g_paired_sample ? 3 : 7, max_reps = g_quick ? 9 : 41;
    if (reps < min_reps)
        reps = min_reps;
    if (reps > max_reps)
        reps = max_reps;
    double s[64];
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        for (int k = 0; k < inner; k++)
            fn(ctx);
        s[r] = (now_s() - t0) / inner;
    }
    qsort(s, (size_t)reps, sizeof(double), cmp_d);
    timing t = {s[reps / 2], s[0], s[reps - 1], reps};
    return t;
}

/* ---- benchmark state ------------------------------------------------------------------- */

typedef struct bench {
    float *x;        /* 64M randn floats (16M rows use the first 16M) */
    float *y;        /* 64M output floats */
    float *g, *gx;   /* 16M gradient in/out */
    uint8_t *q;      /* 16M quantized bytes */
    float *hb;       /* 8 x 1M histogram batches, batch b scaled by (1 + b) */
    qcal_tensor t16, tw, tact, thb[8];
    /* qparams from the data (per tensor quint8 affine; per channel qint8 symmetric axis 0) */
    float scale;
    int32_t zp;
    float *scw;
    int32_t *zpw;
    qcal_qparams qpt, qpw, qpw1; /* the same as values: per tensor, per channel axis 0 / 1 */
    qcal_qparams qp8;            /* per tensor float8_e4m3fn (MinMax: amax / 448) */
    qcal_observer *obs[8];       /* one of every kind, used by the rows (axis 0) */
    qcal_observer *obs_ax1[4];   /* per-channel kinds with axis 1 (activation rows) */
    qcal_observer *hist_full[4]; /* histogram family filled with the 8 batches */
    qcal_observer *merge_src;    /* histogram of batches 0-3 (the merge row's source) */
    qcal_observer *merge_dst;    /* histogram of batches 4-7, then every merge into it */
    qcal_numeric_logger *logger;
    qcal_numeric_stats last_stats;
    /* per-op current selection */
    int kind;            /* observer kind for observer rows */
    const qcal_tensor *in;
    float res[8192 * 2];
    int64_t res_n;       /* floats of res used by the digest */
    const void *out;     /* output buffer digested */
    size_t out_bytes;
    int canonical;       /* 1: the run whose outputs are hashed */
    int64_t scaling_n;
#if BENCH_HAVE_CNN
    cnn_model *model;
    cnn_ctx *cctx;
    uint8_t *images;
    int cnn_batches, cnn_batch;
    qcal_calib_rules *rules;
    qcal_calib_session *session;
    int cnn_step;
    uint64_t cnn_hash;
#endif
} bench;

static void range_res(bench *b, qcal_observer *o)
{
    int64_t n = 0;
    qcal_observer_data_range(o, 4096, b->res, b->res + 4096, &n);
    b->res_n = 8192;
    b->out = NULL;
    b->out_bytes = 0;
}

/* minmax / moving-average / per-channel rows: one update of b->in. Moving averages are not
 * reset (steady state, as a training loop); the canonical run resets and updates twice. */
static void op_observe(void *p)
{
    bench *b = p;
    qcal_observer *o = b->in == &b->tact && b->obs_ax1[b->kind] ? b->obs_ax1[b->kind]
                                                                : b->obs[b->kind];
    bool ma = b->kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
              b->kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
    if (!ma || b->canonical)
        CHECK(qcal_observer_reset(o));
    CHECK(qcal_observer_update(o, b->in));
    if (ma && b->canonical)
        CHECK(qcal_observer_update(o, b->in));
    if (b->canonical)
        range_res(b, o);
}

static void op_hist_update(void *p)
{
    bench *b = p;
    qcal_observer *o = b->obs[QCAL_OBSERVER_HISTOGRAM];
    CHECK(qcal_observer_reset(o));
    for (int i = 0; i < 8; i++)
        CHECK(qcal_observer_update(o, &b->thb[i]));
    if (b->canonical) {
        void *blob = NULL;
        size_t len = 0;
        CHECK(qcal_observer_save(o, &blob, &len));
        b->res[0] = (float)(fnv(0xcbf29ce484222325ull, blob, len) >> 40);
        b->res_n = 1;
        qcal_free(blob);
        b->out = NULL;
        b->out_bytes = 0;
    }
}

/* One exact merge of two 2048-bin lattice states (issue: merges under 10 us). Timed: the
 * state of batches 0-3 merged into the accumulating state of batches 4-7 (after the first
 * call the destination covers the whole range, so the source's finer cells are folded into
 * the destination's window at its coarser width). Verified first: batches 4-7 merged with
 * 0-3 give the digest of one observer fed all 8 batches in order. */
static void op_hist_merge(void *p)
{
    bench *b = p;
    if (b->canonical) {
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
        qcal_observer *d = NULL;
        CHECK(qcal_observer_create(&cfg, &d));
        for (int i = 4; i < 8; i++)
            CHECK(qcal_observer_update(d, &b->thb[i]));
        CHECK(qcal_observer_merge(d, b->merge_src));
        char got[65], want[65];
        CHECK(qcal_observer_digest(d, got));
        CHECK(qcal_observer_digest(b->hist_full[0], want));
        if (strcmp(got, want) != 0) {
            fprintf(stderr, "qcal_bench: verification failed: histogram merge digest %s, "
                    "one observer over the same batches %s\n", got, want);
            exit(1);
        }
        qcal_observer_destroy(&d);
        b->res[0] = (float)(fnv(0xcbf29ce484222325ull, got, 64) >> 40);
        b->res_n = 1;
    } else {
        CHECK(qcal_observer_merge(b->merge_dst, b->merge_src));
        b->res_n = 0;
    }
    b->out = NULL;
    b->out_bytes = 0;
}

static void op_hist_qparams(void *p)
{
    bench *b = p;
    float s = 0, mn = 0, mx = 0;
    int32_t zp = 0;
    int64_t n = 0;
    qcal_observer *o = b->hist_full[b->kind - QCAL_OBSERVER_HISTOGRAM];
    CHECK(qcal_observer_qrange(o, 1, &mn, &mx, &n));
    qcal_qparams qp = {0};
    CHECK(qcal_observer_qparams(o, &qp));
    s = qp.scale;
    zp = qp.zero_point;
    b->res[0] = mn;
    b->res[1] = mx;
    b->res[2] = s;
    b->res[3] = (float)zp;
    b->res_n = 4;
    b->out = NULL;
    b->out_bytes = 0;
}

static void op_quantize_pt(void *p)
{
    bench *b = p;
    CHECK(qcal_quantize(&b->t16, &b->qpt, b->q));
    b->out = b->q;
    b->out_bytes = (size_t)M16;
    b->res_n = 0;
}

static void op_dequantize_pt(void *p)
{
    bench *b = p;
    qcal_tensor_mut t = mut_of(&b->t16, b->y);
    CHECK(qcal_dequantize(b->q, &b->qpt, &t));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_quantize_pc(void *p)
{
    bench *b = p;
    CHECK(qcal_quantize(&b->tw, &b->qpw, b->q));
    b->out = b->q;
    b->out_bytes = (size_t)M16;
    b->res_n = 0;
}

static void op_quantize_pc_last(void *p)
{
    bench *b = p;
    CHECK(qcal_quantize(&b->tw, &b->qpw1, b->q));
    b->out = b->q;
    b->out_bytes = (size_t)M16;
    b->res_n = 0;
}

static void op_dequantize_pc(void *p)
{
    bench *b = p;
    qcal_tensor_mut t = mut_of(&b->tw, b->y);
    CHECK(qcal_dequantize(b->q, &b->qpw, &t));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_fq_fwd(void *p)
{
    bench *b = p;
    qcal_tensor x = b->t16;
    x.data = b->x;
    qcal_tensor_mut y = mut_of(&b->t16, b->y);
    CHECK(qcal_fakequant_forward(&x, &b->qpt, &y, NULL));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_fq_pc_fwd(void *p)
{
    bench *b = p;
    qcal_tensor_mut y = mut_of(&b->tw, b->y);
    CHECK(qcal_fakequant_forward(&b->tw, &b->qpw, &y, NULL));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_fq_fused(void *p)
{
    bench *b = p;
    qcal_tensor x = b->t16, g = b->t16;
    x.data = b->x;
    g.data = b->g;
    qcal_tensor_mut y = mut_of(&b->t16, b->y), gx = mut_of(&b->t16, b->gx);
    CHECK(qcal_fakequant_fused(&x, &g, &b->qpt, &y, &gx));
    b->out = b->gx;
    b->out_bytes = (size_t)M16 * 4;
    b->res[0] = b->y[12345];
    b->res_n = 1;
}

/* FP8 (float8_e4m3fn, per tensor): quantize to the codes, dequantize, fake-quant forward and
 * forward + straight-through backward; PyTorch 1.13 has no float8 (torch 0). */
static void op_f8_quantize(void *p)
{
    bench *b = p;
    CHECK(qcal_quantize(&b->t16, &b->qp8, b->q));
    b->out = b->q;
    b->out_bytes = (size_t)M16;
    b->res_n = 0;
}

static void op_f8_dequantize(void *p)
{
    bench *b = p;
    qcal_tensor_mut t = mut_of(&b->t16, b->y);
    CHECK(qcal_dequantize(b->q, &b->qp8, &t));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_f8_fq_fwd(void *p)
{
    bench *b = p;
    qcal_tensor x = b->t16;
    x.data = b->x;
    qcal_tensor_mut y = mut_of(&b->t16, b->y);
    CHECK(qcal_fakequant_forward(&x, &b->qp8, &y, NULL));
    b->out = b->y;
    b->out_bytes = (size_t)M16 * 4;
    b->res_n = 0;
}

static void op_f8_fq_fused(void *p)
{
    bench *b = p;
    qcal_tensor x = b->t16, g = b->t16;
    x.data = b->x;
    g.data = b->g;
    qcal_tensor_mut y = mut_of(&b->t16, b->y), gx = mut_of(&b->t16, b->gx);
    CHECK(qcal_fakequant_fused(&x, &g, &b->qp8, &y, &gx));
    b->out = b->gx;
    b->out_bytes = (size_t)M16 * 4;
    b->res[0] = b->y[12345];
    b->res_n = 1;
}

static void op_fq_learnable_bwd(void *p)
{
    bench *b = p;
    float gs = 0, gz = 0;
    qcal_tensor x = b->t16, g = b->t16;
    x.data = b->x;
    g.data = b->g;
    qcal_tensor_mut gx = mut_of(&b->t16, b->gx);
    qcal_qparams qp = b->qpt;
    qp.zero_point_float = (float)b->zp + 0.3f;
    CHECK(qcal_fakequant_learnable_backward(&x, &g, &qp, 1.0f, &gx, &gs, &gz));
    b->out = b->gx;
    b->out_bytes = (size_t)M16 * 4;
    b->res[0] = gs;
    b->res[1] = gz;
    b->res_n = 2;
}

static qcal_status log_cb(const qcal_numeric_log_record *rec, const qcal_tensor *x, void *user)
{
    (void)x;
    ((bench *)user)->last_stats = rec->stats;
    return QCAL_OK;
}

static void op_stats_logger(void *p)
{
    bench *b = p;
    CHECK(qcal_numeric_logger_log(b->logger, QCAL_NUMERIC_LOG_ACT, "features.act", "relu", NULL, &b->t16));
    memcpy(b->res, &b->last_stats, sizeof b->last_stats);
    b->res_n = (int64_t)(sizeof b->last_stats / sizeof(float));
    b->out = NULL;
    b->out_bytes = 0;
}

#if BENCH_HAVE_CNN
static qcal_status cnn_act_hook(void *user, cnn_act *act)
{
    bench *b = user;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, act->data, act->ndim, act->shape);
    if (st < 0)
        return st;
    return qcal_calib_session_observe(b->session, cnn_tap_name(act->tap), QCAL_CALIB_ROLE_ACTIVATION,
                                b->cnn_step, &t);
}

static qcal_status cnn_weight_hook(void *user, cnn_weight *w)
{
    bench *b = user;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, w->src, w->ndim, w->shape);
    if (st < 0)
        return st;
    w->used = false;
    return qcal_calib_session_observe(b->session, cnn_layer_name(w->layer), QCAL_CALIB_ROLE_WEIGHT,
                                b->cnn_step, &t);
}

/* N batches of the float forward, without observers. */
static void op_cnn_plain(void *p)
{
    bench *b = p;
    const float *logits = NULL;
    for (int i = 0; i < b->cnn_batches; i++)
        CHECK(cnn_forward(b->cctx, b->model, b->images + (int64_t)i * b->cnn_batch * 784,
                          b->cnn_batch, NULL, &logits));
    b->res[0] = logits[0];
    b->res_n = 1;
    b->out = NULL;
    b->out_bytes = 0;
}

/* The same forward with a calibration session of min/max observers on every activation
 * tap (per-tensor minmax) and weight (per-channel minmax), then the table. */
static void op_cnn_calib(void *p)
{
    bench *b = p;
    qcal_calib_session_options opt;
    qcal_calib_session_options_default(&opt);
    opt.rules = b->rules;
    CHECK(qcal_calib_session_create(&opt, &b->session));
    cnn_hooks hooks = {cnn_act_hook, NULL, cnn_weight_hook, NULL, b, NULL};
    const float *logits = NULL;
    for (int i = 0; i < b->cnn_batches; i++) {
        b->cnn_step = i;
        CHECK(cnn_forward(b->cctx, b->model, b->images + (int64_t)i * b->cnn_batch * 784,
                          b->cnn_batch, &hooks, &logits));
    }
    qcal_calib_table *table = NULL;
    CHECK(qcal_calib_session_table(b->session, &table));
    if (b->canonical) {
        int64_t n = 0;
        uint64_t h = 0xcbf29ce484222325ull;
        CHECK(qcal_calib_table_count(table, &n));
        for (int64_t i = 0; i < n; i++) {
            const qcal_calib_entry *e = NULL;
            CHECK(qcal_calib_table_entry(table, i, &e));
            /* value by value: the same bytes as hashing each array in one go */
            for (int64_t c = 0; c < e->qparams.channels; c++) {
                float s = qcal_qparams_scale_at(&e->qparams, c);
                h = fnv(h, &s, sizeof s);
            }
            for (int64_t c = 0; c < e->qparams.channels; c++) {
                int32_t z = qcal_qparams_zero_point_at(&e->qparams, c);
                h = fnv(h, &z, sizeof z);
            }
        }
        b->cnn_hash = h;
    }
    qcal_calib_table_destroy(&table);
    qcal_calib_session_destroy(&b->session);
    b->res_n = 0;
    b->out = NULL;
    b->out_bytes = 0;
}
#endif

/* ---- rows ------------------------------------------------------------------------------ */

/* The bound of a row: read or copy bandwidth, or (histogram binning, one counter store per
 * value) the increment rate, shown as the input GB/s of one increment per value. */
enum { LIM_NONE, LIM_READ, LIM_COPY, LIM_INCR };

typedef struct row_def {
    const char *name;      /* JSON name, also the torch_ref.py op name */
    const char *label;     /* table label */
    int64_t elements;
    double bytes_per_el;   /* traffic per element (0: not bandwidth-bound, no GB/s) */
    int limit;             /* LIM_* */
    double min_fraction;   /* target fraction of the limit (0: none) */
    double min_ratio;      /* target speed-up over PyTorch (0: only "not slower") */
    int torch;             /* PyTorch has this operation */
    op_fn fn;
    int kind;              /* observer kind for op_observe / op_hist_qparams */
    int input;             /* 0: x[16M], 1: [4096,4096], 2: [32,256,32,32] */
    double max_s;          /* target time per call (0: none) */
} row_def;

/* Targets set by the bound (issue 27): at `threads` threads the row must reach `need` of its
 * paired bound (LIM_INCR: of the increment probe's ceiling ratio to PyTorch, pair by pair the
 * same as its share of the probe's rate; LIM_COPY: of the copy probe) in place of its
 * min_ratio; its other thread counts keep min_ratio. */
static const struct bound_target {
    const char *name;
    int threads;
    double need;
} BOUND_TARGETS[] = {
    {"histogram_update", 1, 0.95},
    {"fakequant_forward_backward", 2, 1.20},
};

/* The share of its bound a row needs at `threads` threads (0: no such target). */
static double bound_need_of(const char *name, int threads)
{
    for (size_t i = 0; i < sizeof BOUND_TARGETS / sizeof BOUND_TARGETS[0]; i++)
        if (!strcmp(BOUND_TARGETS[i].name, name) && BOUND_TARGETS[i].threads == threads)
            return BOUND_TARGETS[i].need;
    return 0;
}

static const row_def ROWS[] = {
    {"minmax", "MinMax observer 16M", M16, 4, LIM_READ, 0.85, 0, 1, op_observe,
     QCAL_OBSERVER_MINMAX, 0, 0},
    {"moving_average_minmax", "MovingAverageMinMax 16M", M16, 4, LIM_READ, 0.85, 0, 1,
     op_observe, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, 0, 0},
    {"per_channel_minmax_4096x4096_axis0", "PerChannelMinMax [4096,4096] axis 0", M16, 4,
     LIM_READ, 0, 10, 1, op_observe, QCAL_OBSERVER_PER_CHANNEL_MINMAX, 1, 0},
    {"per_channel_minmax_32x256x32x32_axis1", "PerChannelMinMax [32,256,32,32] axis 1",
     8 * M1, 4, LIM_READ, 0, 10, 1, op_observe, QCAL_OBSERVER_PER_CHANNEL_MINMAX, 2, 0},
    {"ma_per_channel_minmax_4096x4096_axis0", "MovingAvgPerChannelMinMax [4096,4096] axis 0",
     M16, 4, LIM_READ, 0, 10, 1, op_observe, QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX,
     1, 0},
    {"ma_per_channel_minmax_32x256x32x32_axis1",
     "MovingAvgPerChannelMinMax [32,256,32,32] axis 1", 8 * M1, 4, LIM_READ, 0, 10, 1,
     op_observe, QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX, 2, 0},
    {"histogram_update", "Histogram update 8 x 1M, growing range", 8 * M1, 4, LIM_INCR, 0, 20,
     1, op_hist_update, QCAL_OBSERVER_HISTOGRAM, 0, 0},
    {"histogram_merge", "Histogram merge of two states (2048 bins)", 2048, 0, LIM_NONE, 0, 0,
     0, op_hist_merge, QCAL_OBSERVER_HISTOGRAM, 0, 10e-6},
    {"histogram_qparams", "Histogram qparams (L2 search, 2048 bins)", 2048, 0, LIM_NONE, 0, 1,
     1, op_hist_qparams, QCAL_OBSERVER_HISTOGRAM, 0, 0},
    {"percentile_qparams", "Percentile qparams (2048 bins)", 2048, 0, LIM_NONE, 0, 0, 0,
     op_hist_qparams, QCAL_OBSERVER_PERCENTILE, 0, 0},
    {"entropy_qparams", "Entropy (KL) qparams (2048 bins)", 2048, 0, LIM_NONE, 0, 0, 0,
     op_hist_qparams, QCAL_OBSERVER_ENTROPY, 0, 0},
    {"mse_qparams", "MSE qparams (2048 bins)", 2048, 0, LIM_NONE, 0, 0, 0, op_hist_qparams,
     QCAL_OBSERVER_MSE, 0, 0},
    {"quantize_per_tensor", "quantize per tensor quint8 16M", M16, 5, LIM_COPY, 0.5, 0, 1,
     op_quantize_pt, 0, 0, 0},
    {"dequantize_per_tensor", "dequantize per tensor quint8 16M", M16, 5, LIM_COPY, 0, 0, 1,
     op_dequantize_pt, 0, 0, 0},
    {"quantize_per_channel", "quantize per channel qint8 [4096,4096] axis 0", M16, 5, LIM_COPY,
     0.5, 0, 1, op_quantize_pc, 0, 1, 0},
    {"quantize_per_channel_last_axis", "quantize per channel qint8 [4096,4096] axis 1", M16, 5,
     LIM_COPY, 0, 0, 1, op_quantize_pc_last, 0, 1, 0},
    {"dequantize_per_channel", "dequantize per channel qint8 [4096,4096] axis 0", M16, 5,
     LIM_COPY, 0, 0, 1, op_dequantize_pc, 0, 1, 0},
    {"fakequant_forward", "fake-quant forward per tensor 16M", M16, 8, LIM_COPY, 0.5, 0, 1,
     op_fq_fwd, 0, 0, 0},
    {"fakequant_per_channel_forward", "fake-quant forward per channel [4096,4096] axis 0", M16,
     8, LIM_COPY, 0.5, 0, 1, op_fq_pc_fwd, 0, 1, 0},
    {"fakequant_forward_backward", "fake-quant forward+backward 16M", M16, 16, LIM_COPY, 0, 20,
     1, op_fq_fused, 0, 0, 0},
    {"learnable_backward", "learnable fake-quant backward 16M", M16, 12, LIM_COPY, 0, 0, 1,
     op_fq_learnable_bwd, 0, 0, 0},
    {"fp8_quantize_per_tensor", "quantize per tensor float8_e4m3fn 16M", M16, 5, LIM_COPY, 0.8,
     0, 0, op_f8_quantize, 0, 0, 0},
    {"fp8_dequantize_per_tensor", "dequantize per tensor float8_e4m3fn 16M", M16, 5, LIM_COPY,
     0, 0, 0, op_f8_dequantize, 0, 0, 0},
    {"fp8_fakequant_forward", "FP8 fake-quant forward float8_e4m3fn 16M", M16, 8, LIM_COPY, 0,
     0, 0, op_f8_fq_fwd, 0, 0, 0},
    {"fp8_fakequant_forward_backward", "FP8 fake-quant forward+backward float8_e4m3fn 16M", M16,
     16, LIM_COPY, 0.8, 0, 0, op_f8_fq_fused, 0, 0, 0},
    {"stats_logger", "statistics logger pass 16M", M16, 4, LIM_READ, 0, 0, 1, op_stats_logger,
     0, 0, 0},
#if BENCH_HAVE_CNN
    {"calibration_demo_cnn", "calibration of the demo CNN (minmax session)", 0, 0, LIM_NONE, 0,
     0, 0, op_cnn_calib, 0, 0, 0},
#endif
};
#define NROWS ((int)(sizeof ROWS / sizeof ROWS[0]))

typedef struct row_result {
    int threads;
    int64_t elements;
    timing q;
    double gbps, limit, fraction;
    int have_torch;
    timing t;
    double ratio;     /* median over the pairs of torch_s / qcal_s */
    double ratio_lo, ratio_hi;   /* spread of the paired ratios */
    double frac_lo, frac_hi;     /* spread of the paired fractions of the limit */
    int pairs;
    bench_bandwidth bw;          /* the probe paired with this row (medians), or the run's */
    char target[96];
    int pass;         /* 1, 0, -1 = not evaluable */
    uint64_t hash;
    int identical;    /* 1, 0, -1 = not checked */
    char note[224];
    double ceiling;   /* LIM_INCR: median over the pairs of PyTorch's time / the probe's time */
    double bound_share, bound_need; /* a target set by the bound: share reached, share needed */
    char bound_desc[96];            /* that bound, as the summary prints it beside the verdict */
} row_result;

/* ---- PyTorch ---------------------------------------------------------------------------- */

static double json_num(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    if (!p)
        return NAN;
    p += strlen(k);
    while (*p == ' ')
        p++;
    if (!strncmp(p, "null", 4))
        return NAN;
    return strtod(p, NULL);
}

/* A PyTorch server (torch_ref.py --serve) for one thread count: rows are sent one at a
 * time ("OP ELEMENTS\n") and answered with one JSON line, so PyTorch and qcal measure each
 * row back to back (fair under changing machine load). */
typedef struct torch_server {
    pid_t pid;
    FILE *to, *from;
} torch_server;

static int torch_start(torch_server *ts, const char *cmd, int threads)
{
    memset(ts, 0, sizeof *ts);
    size_t cap = strlen(cmd) + 64;
    char *full = malloc(cap);
    if (!full)
        return -1;
    snprintf(full, cap, "%s --serve --threads %d%s", cmd, threads, g_quick ? " --quick" : "");
    int in[2], out[2];
    if (pipe(in) != 0) {
        free(full);
        return -1;
    }
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        free(full);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        free(full);
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    free(full);
    close(in[0]);
    close(out[1]);
    ts->pid = pid;
    ts->to = fdopen(in[1], "w");
    ts->from = fdopen(out[0], "r");
    if (!ts->to || !ts->from)
        return -1;
    /* Wait until torch is imported, so that its start-up (seconds of CPU) does not overlap
     * the bandwidth probe or a qcal measurement. */
    char line[512];
    if (!fgets(line, sizeof line, ts->from) || !strstr(line, "\"ready\"")) {
        fprintf(stderr, "qcal_bench: the PyTorch helper did not start\n");
        return -1;
    }
    return 0;
}

/* Times one row in PyTorch; returns 1 with *t filled, 0 if PyTorch could not. */
static int torch_row(torch_server *ts, const row_def *d, double budget, timing *t)
{
    if (!ts->to || !ts->from)
        return 0;
    fprintf(ts->to, "%s %lld %g\n", d->name, (long long)d->elements, budget);
    fflush(ts->to);
    char line[4096];
    if (!fgets(line, sizeof line, ts->from)) {
        fprintf(stderr, "qcal_bench: the PyTorch helper stopped answering\n");
        fclose(ts->to);
        fclose(ts->from);
        ts->to = ts->from = NULL;
        return 0;
    }
    double med = json_num(line, "median_s");
    if (!(isfinite(med) && med > 0)) {
        fprintf(stderr, "qcal_bench: torch %s: %s", d->name, line);
        return 0;
    }
    t->med = med;
    t->min = json_num(line, "min_s");
    t->max = json_num(line, "max_s");
    t->reps = (int)json_num(line, "reps");
    return 1;
}

static void torch_stop(torch_server *ts)
{
    if (ts->to)
        fclose(ts->to);
    if (ts->from)
        fclose(ts->from);
    ts->to = ts->from = NULL;
    if (ts->pid > 0) {
        int status = 0;
        waitpid(ts->pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fprintf(stderr, "qcal_bench: the PyTorch helper exited with status %d\n", status);
    }
    ts->pid = 0;
}

/* ---- setup and verification ----------------------------------------------------------- */

static void setup(bench *b)
{
    b->x = xalloc((size_t)(64ll << 20) * 4);
    b->y = xalloc((size_t)(64ll << 20) * 4);
    b->g = xalloc((size_t)M16 * 4);
    b->gx = xalloc((size_t)M16 * 4);
    b->q = xalloc((size_t)M16);
    b->hb = xalloc((size_t)8 * M1 * 4);
    fill_randn(b->x, 64ll << 20);
    fill_randn(b->g, M16);
    for (int i = 0; i < 8; i++) /* growing range: batch i is N(0, 1) * (1 + i) */
        for (int64_t j = 0; j < M1; j++)
            b->hb[i * M1 + j] = b->x[(int64_t)i * M1 + j] * (float)(1 + i);
    int64_t s16[1] = {M16}, sw[2] = {4096, 4096}, sa[4] = {32, 256, 32, 32}, s1[1] = {M1};
    CHECK(qcal_tensor_init(&b->t16, b->x, 1, s16));
    CHECK(qcal_tensor_init(&b->tw, b->x, 2, sw));
    CHECK(qcal_tensor_init(&b->tact, b->x, 4, sa));
    for (int i = 0; i < 8; i++)
        CHECK(qcal_tensor_init(&b->thb[i], b->hb + i * M1, 1, s1));
    for (int k = 0; k < 8; k++) {
        qcal_observer_config cfg;
        qcal_observer_config_default(&cfg, (qcal_observer_kind)k);
        if (k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
            k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX) {
            cfg.q.dtype = QCAL_QINT8;
            cfg.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
        }
        CHECK(qcal_observer_create(&cfg, &b->obs[k]));
        if (k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
            k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX) {
            cfg.axis = 1;
            CHECK(qcal_observer_create(&cfg, &b->obs_ax1[k]));
        }
        if (k >= QCAL_OBSERVER_HISTOGRAM) {
            CHECK(qcal_observer_create(&cfg, &b->hist_full[k - QCAL_OBSERVER_HISTOGRAM]));
            for (int i = 0; i < 8; i++)
                CHECK(qcal_observer_update(b->hist_full[k - QCAL_OBSERVER_HISTOGRAM],
                                           &b->thb[i]));
        }
        if (k == QCAL_OBSERVER_HISTOGRAM) {
            CHECK(qcal_observer_create(&cfg, &b->merge_src));
            CHECK(qcal_observer_create(&cfg, &b->merge_dst));
            for (int i = 0; i < 4; i++) {
                CHECK(qcal_observer_update(b->merge_src, &b->thb[i]));
                CHECK(qcal_observer_update(b->merge_dst, &b->thb[4 + i]));
            }
        }
    }
    /* qparams for the quantize rows: per tensor from MinMax (quint8 affine), per channel from
     * PerChannelMinMax (qint8 symmetric, axis 0) - the observer -> qparams -> quantize path. */
    CHECK(qcal_observer_update(b->obs[QCAL_OBSERVER_MINMAX], &b->t16));
    qcal_qparams qp = {0};
    CHECK(qcal_observer_qparams(b->obs[QCAL_OBSERVER_MINMAX], &qp));
    b->scale = qp.scale;
    b->zp = qp.zero_point;
    b->qpt = qp;
    {
        qcal_observer_config c8;
        qcal_observer_config_default(&c8, QCAL_OBSERVER_MINMAX);
        c8.q.dtype = QCAL_FLOAT8_E4M3FN;
        qcal_observer *o8 = NULL;
        CHECK(qcal_observer_create(&c8, &o8));
        CHECK(qcal_observer_update(o8, &b->t16));
        CHECK(qcal_observer_qparams(o8, &b->qp8));
        qcal_observer_destroy(&o8);
    }
    b->scw = xalloc(4096 * sizeof(float));
    b->zpw = xalloc(4096 * sizeof(int32_t));
    CHECK(qcal_observer_update(b->obs[QCAL_OBSERVER_PER_CHANNEL_MINMAX], &b->tw));
    CHECK(qcal_observer_qparams(b->obs[QCAL_OBSERVER_PER_CHANNEL_MINMAX], &qp));
    if (qp.channels != 4096) {
        fprintf(stderr, "qcal_bench: per-channel observer gave %lld channels\n",
                (long long)qp.channels);
        exit(2);
    }
    memcpy(b->scw, qp.scales, 4096 * sizeof(float));
    memcpy(b->zpw, qp.zero_points, 4096 * sizeof(int32_t));
    b->qpw = qp;                 /* owns the arrays; freed at the end */
    b->qpw1 = qp;
    b->qpw1.axis = 1;
    b->qpw1.owned = NULL;        /* a view of the same arrays */
    qcal_numeric_logger_options lo;
    qcal_numeric_logger_options_default(&lo);
    lo.callback = log_cb;
    lo.user = b;
    CHECK(qcal_numeric_logger_create(&lo, &b->logger));
#if BENCH_HAVE_CNN
    b->cnn_batch = 256;
    b->cnn_batches = g_quick ? 4 : 8;
    CHECK(cnn_model_create(1, &b->model));
    CHECK(cnn_ctx_create(b->cnn_batch, &b->cctx));
    int64_t nimg = (int64_t)b->cnn_batch * b->cnn_batches * 784;
    b->images = xalloc((size_t)nimg);
    for (int64_t i = 0; i < nimg; i++)
        b->images[i] = (uint8_t)(rng_next() >> 56);
    qcal_observer_config ac, wc;
    qcal_observer_config_default(&ac, QCAL_OBSERVER_MINMAX);
    qcal_observer_config_default(&wc, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
    wc.q.dtype = QCAL_QINT8;
    wc.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    CHECK(qcal_calib_rules_create(&b->rules));
    CHECK(qcal_calib_rules_add(b->rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &ac));
    CHECK(qcal_calib_rules_add(b->rules, "*", false, QCAL_CALIB_ROLE_WEIGHT, &wc));
#endif
}

static void teardown(bench *b)
{
    for (int k = 0; k < 8; k++)
        qcal_observer_destroy(&b->obs[k]);
    for (int k = 0; k < 4; k++) {
        qcal_observer_destroy(&b->hist_full[k]);
        qcal_observer_destroy(&b->obs_ax1[k]);
    }
    qcal_observer_destroy(&b->merge_src);
    qcal_observer_destroy(&b->merge_dst);
    qcal_numeric_logger_destroy(&b->logger);
#if BENCH_HAVE_CNN
    cnn_model_destroy(&b->model);
    cnn_ctx_destroy(&b->cctx);
    qcal_calib_rules_destroy(&b->rules);
    free(b->images);
#endif
    free(b->x);
    free(b->y);
    free(b->g);
    free(b->gx);
    free(b->q);
    free(b->hb);
    free(b->scw);
    free(b->zpw);
    qcal_qparams_free(&b->qpw);
}

static void verify_fail(const char *what, int64_t i, double got, double want)
{
    fprintf(stderr, "qcal_bench: VERIFY FAILED %s: element %lld is %.9g, expected %.9g\n", what,
            (long long)i, got, want);
    g_failed = 1;
}

/* Verify, then time: each row's canonical output is checked against a plain scalar loop
 * (min/max, quantize/dequantize, fake-quant arithmetic of the public contracts). */
static void verify_row(bench *b, int r)
{
    const row_def *d = &ROWS[r];
    const float *x = b->x;
    if (d->fn == op_observe && d->kind == QCAL_OBSERVER_MINMAX) {
        float mn = INFINITY, mx = -INFINITY;
        for (int64_t i = 0; i < M16; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        if (b->res[0] != mn)
            verify_fail("minmax min", 0, b->res[0], mn);
        if (b->res[4096] != mx)
            verify_fail("minmax max", 0, b->res[4096], mx);
    } else if (d->fn == op_observe && d->kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
               d->input == 1) {
        for (int64_t c = 0; c < 4096; c += 511) {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t j = 0; j < 4096; j++) {
                mn = fminf(mn, x[c * 4096 + j]);
                mx = fmaxf(mx, x[c * 4096 + j]);
            }
            if (b->res[c] != mn || b->res[4096 + c] != mx)
                verify_fail("per-channel minmax", c, b->res[c], mn);
        }
    } else if (d->fn == op_observe && d->kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX) {
        for (int64_t c = 0; c < 256; c += 37) {
            float mn = INFINITY, mx = -INFINITY;
            for (int64_t o = 0; o < 32; o++)
                for (int64_t j = 0; j < 1024; j++) {
                    float v = x[(o * 256 + c) * 1024 + j];
                    mn = fminf(mn, v);
                    mx = fmaxf(mx, v);
                }
            if (b->res[c] != mn || b->res[4096 + c] != mx)
                verify_fail("per-channel minmax axis 1", c, b->res[c], mn);
        }
    } else if (d->fn == op_quantize_pt || d->fn == op_fq_fwd) {
        float inv = 1.0f / b->scale;
        for (int64_t i = 0; i < M16; i++) {
            float q = nearbyintf(x[i] * inv) + (float)b->zp;
            q = fminf(fmaxf(q, 0.0f), 255.0f);
            if (d->fn == op_quantize_pt && b->q[i] != (uint8_t)q) {
                verify_fail("quantize_per_tensor", i, b->q[i], q);
                break;
            }
            float y = (q - (float)b->zp) * b->scale;
            if (d->fn == op_fq_fwd && b->y[i] != y) {
                verify_fail("fakequant_forward", i, b->y[i], y);
                break;
            }
        }
    } else if (d->fn == op_dequantize_pt) {
        for (int64_t i = 0; i < M16; i += 7) {
            float y = (float)((int32_t)b->q[i] - b->zp) * b->scale;
            if (b->y[i] != y) {
                verify_fail("dequantize_per_tensor", i, b->y[i], y);
                break;
            }
        }
    } else if (d->fn == op_quantize_pc) {
        for (int64_t i = 0; i < M16; i += 3) {
            int64_t c = i / 4096;
            float q = nearbyintf(x[i] * (1.0f / b->scw[c])) + (float)b->zpw[c];
            q = fminf(fmaxf(q, -128.0f), 127.0f);
            if ((int8_t)b->q[i] != (int8_t)q) {
                verify_fail("quantize_per_channel", i, (int8_t)b->q[i], q);
                break;
            }
        }
    } else if (d->fn == op_quantize_pc_last) {
        for (int64_t i = 0; i < M16; i += 3) {
            int64_t c = i % 4096;
            float q = nearbyintf(x[i] * (1.0f / b->scw[c])) + (float)b->zpw[c];
            q = fminf(fmaxf(q, -128.0f), 127.0f);
            if ((int8_t)b->q[i] != (int8_t)q) {
                verify_fail("quantize_per_channel_last_axis", i, (int8_t)b->q[i], q);
                break;
            }
        }
    } else if (d->fn == op_fq_fused) {
        float inv = 1.0f / b->scale;
        for (int64_t i = 0; i < M16; i += 5) {
            float q = (float)b->zp + nearbyintf(x[i] * inv);
            float gx = (q >= 0.0f && q <= 255.0f) ? b->g[i] : 0.0f;
            if (b->gx[i] != gx) {
                verify_fail("fakequant fused grad", i, b->gx[i], gx);
                break;
            }
        }
    } else if (d->fn == op_stats_logger) {
        if (b->last_stats.count != M16)
            verify_fail("stats count", 0, (double)b->last_stats.count, (double)M16);
    }
}

/* ---- main table ------------------------------------------------------------------------ */

static void fmt_time(char *buf, size_t cap, double s)
{
    if (!(s >= 0))
        snprintf(buf, cap, "-");
    else if (s < 1e-3)
        snprintf(buf, cap, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, cap, "%.2f ms", s * 1e3);
    else
        snprintf(buf, cap, "%.3f s", s);
}

/* The verdict of a row from its paired medians (rr->fraction, rr->ratio, set by the
 * caller: medians over the pairs of the per-pair values). */
static void evaluate(const row_def *d, row_result *rr)
{
    char *t = rr->target;
    t[0] = 0;
    int pass = -1;
    rr->bound_share = rr->bound_need = NAN;
    rr->bound_desc[0] = 0;
    double bneed = bound_need_of(d->name, rr->threads);
    if (bneed > 0) {
        /* the target set by the bound: the share of the paired bound (median over the pairs;
         * for the increment probe, ratio to PyTorch / the probe's ceiling ratio, pair by pair,
         * which is the share of the probe's rate) */
        if (d->limit == LIM_INCR) {
            snprintf(t, 96, ">= %.0f%% of the increment-probe ceiling ratio", bneed * 100);
            if (isfinite(rr->ceiling) && rr->ceiling > 0)
                snprintf(rr->bound_desc, sizeof rr->bound_desc,
                         "increment-probe ceiling %.1fx PyTorch (%.2f G/s)", rr->ceiling,
                         rr->limit / d->bytes_per_el);
            else
                snprintf(rr->bound_desc, sizeof rr->bound_desc, "increment probe %.2f G/s",
                         rr->limit / d->bytes_per_el);
        } else {
            snprintf(t, 96, ">= %.0f%% of the paired %s probe", bneed * 100,
                     d->limit == LIM_READ ? "read" : "copy");
            snprintf(rr->bound_desc, sizeof rr->bound_desc, "%s probe %.1f GB/s",
                     d->limit == LIM_READ ? "read" : "copy", rr->limit);
        }
        rr->bound_share = rr->fraction;
        rr->bound_need = bneed;
        pass = isfinite(rr->fraction) ? rr->fraction >= bneed : -1;
        if (d->torch) {
            snprintf(t + strlen(t), 96 - strlen(t), "; >= 1x torch");
            if (rr->have_torch && pass >= 0)
                pass = pass && rr->ratio >= 1;
        }
        rr->pass = pass;
        return;
    }
    if (d->min_fraction > 0) {
        snprintf(t + strlen(t), 96 - strlen(t), ">= %.0f%% %s bw", d->min_fraction * 100,
                 d->limit == LIM_READ ? "read" : "copy");
        pass = rr->fraction >= d->min_fraction;
    }
    if (d->max_s > 0) {
        char lim[32];
        fmt_time(lim, sizeof lim, d->max_s);
        snprintf(t + strlen(t), 96 - strlen(t), "%s<= %s", t[0] ? "; " : "", lim);
        int ok = rr->q.med <= d->max_s;
        pass = pass == -1 ? ok : (pass && ok);
    }
    if (d->torch) {
        double need = d->min_ratio > 1 ? d->min_ratio : 1;
        if (d->fn == op_hist_qparams)
            snprintf(t + strlen(t), 96 - strlen(t), "%s<= torch time", t[0] ? "; " : "");
        else
            snprintf(t + strlen(t), 96 - strlen(t), "%s>= %gx torch", t[0] ? "; " : "", need);
        if (rr->have_torch) {
            int ok = rr->ratio >= need;
            pass = pass == -1 ? ok : (pass && ok);
        }
    }
    rr->pass = pass;
}

static void print_table(const int *selected, row_result (*res)[MAXT], int nt)
{
    printf("\nEach row: qcal, PyTorch and the bandwidth probe measured interleaved in pairs; "
           "'of limit' and 'vs PyTorch' are the medians of the paired values (spread over the "
           "pairs in parentheses); the verdict uses the medians.\n");
    printf("\n| operation | threads | elements | qcal median (min - max) | qcal GB/s | limit GB/s "
           "| of limit (spread) | PyTorch median | vs PyTorch (spread) | target | pass | 1t = 2t bits |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < NROWS; r++) {
        if (!selected[r])
            continue;
        const row_def *d = &ROWS[r];
        for (int ti = 0; ti < nt; ti++) {
            row_result *rr = &res[r][ti];
            char a[32], b1[32], c[32], tt[32];
            fmt_time(a, sizeof a, rr->q.med);
            fmt_time(b1, sizeof b1, rr->q.min);
            fmt_time(c, sizeof c, rr->q.max);
            fmt_time(tt, sizeof tt, rr->have_torch ? rr->t.med : -1);
            char gb[24] = "-", lim[24] = "-", fr[48] = "-", ratio[48] = "-";
            if (isfinite(rr->gbps))
                snprintf(gb, sizeof gb, "%.1f", rr->gbps);
            if (isfinite(rr->limit))
                snprintf(lim, sizeof lim, "%.1f", rr->limit);
            char fr_[48] = "-", ratio_[48] = "-";
            if (isfinite(rr->fraction))
                snprintf(fr_, sizeof fr_, "%.0f%% (%.0f-%.0f)", rr->fraction * 100,
                         rr->frac_lo * 100, rr->frac_hi * 100);
            if (rr->have_torch)
                snprintf(ratio_, sizeof ratio_, "%.2fx (%.2f-%.2f)", rr->ratio, rr->ratio_lo,
                         rr->ratio_hi);
            snprintf(fr, sizeof fr, "%s", fr_);
            snprintf(ratio, sizeof ratio, "%s", ratio_);
            printf("| %s%s%s | %d | %lld | %s (%s - %s) | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                   d->label, rr->note[0] ? ": " : "", rr->note, rr->threads,
                   (long long)rr->elements, a, b1, c, gb, lim, fr, tt, ratio,
                   rr->target[0] ? rr->target : "-",
                   rr->pass < 0 ? "-" : rr->pass ? "pass" : "**FAIL**",
                   rr->identical < 0 ? "-" : rr->identical ? "yes" : "**NO**");
        }
    }
}

static void json_num_out(FILE *f, const char *key, double v, int last)
{
    if (isfinite(v))
        fprintf(f, "\"%s\": %.6g%s", key, v, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
}

static int write_json(const char *path, const int *selected, row_result (*res)[MAXT], int nt,
                      const bench_bandwidth *bw, const int *threads)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        return -1;
    }
    fprintf(f, "[\n");
    int first = 1;
    for (int r = 0; r < NROWS; r++) {
        if (!selected[r])
            continue;
        for (int ti = 0; ti < nt; ti++) {
            row_result *rr = &res[r][ti];
            fprintf(f, "%s  {\"name\": \"%s\", \"threads\": %d, \"elements\": %lld, ",
                    first ? "" : ",\n", ROWS[r].name, rr->threads,
                    (long long)rr->elements);
            first = 0;
            json_num_out(f, "qcal_s", rr->q.med, 0);
            json_num_out(f, "qcal_min_s", rr->q.min, 0);
            json_num_out(f, "qcal_max_s", rr->q.max, 0);
            json_num_out(f, "qcal_gbps", rr->gbps, 0);
            json_num_out(f, "limit_gbps", rr->limit, 0);
            json_num_out(f, "limit_fraction", rr->fraction, 0);
            json_num_out(f, "torch_s", rr->have_torch ? rr->t.med : NAN, 0);
            json_num_out(f, "torch_ratio", rr->have_torch ? rr->ratio : NAN, 0);
            json_num_out(f, "torch_ratio_min", rr->have_torch ? rr->ratio_lo : NAN, 0);
            json_num_out(f, "torch_ratio_max", rr->have_torch ? rr->ratio_hi : NAN, 0);
            json_num_out(f, "limit_fraction_min", rr->frac_lo, 0);
            json_num_out(f, "limit_fraction_max", rr->frac_hi, 0);
            fprintf(f, "\"pairs\": %d, ", rr->pairs);
            fprintf(f, "\"target\": %s%s%s, ", rr->target[0] ? "\"" : "",
                    rr->target[0] ? rr->target : "null", rr->target[0] ? "\"" : "");
            fprintf(f, "\"pass\": %s, ", rr->pass < 0 ? "null" : rr->pass ? "true" : "false");
            if (isfinite(rr->bound_need)) {
                json_num_out(f, "bound_share", rr->bound_share, 0);
                json_num_out(f, "bound_need", rr->bound_need, 0);
                fprintf(f, "\"bound_desc\": \"%s\", ", rr->bound_desc);
            }
            json_num_out(f, "ceiling_ratio", rr->ceiling, 0);
            fprintf(f, "\"bit_identical\": %s, ",
                    rr->identical < 0 ? "null" : rr->identical ? "true" : "false");
            const bench_bandwidth *b = &rr->bw;
            (void)bw;
            fprintf(f, "\"read_gbps\": %.6g, \"copy_gbps\": %.6g, \"note\": \"%s\", ",
                    b->read_gbps, b->copy_gbps, rr->note);
            fprintf(f, "\"label\": \"%s\", \"bound\": \"%s\"}", ROWS[r].label,
                    ROWS[r].limit == LIM_READ   ? "read bandwidth"
                    : ROWS[r].limit == LIM_COPY ? "copy bandwidth"
                    : ROWS[r].limit == LIM_INCR ? "increment rate (x 4 B)"
                                                : "compute");
        }
    }
    fprintf(f, "\n]\n");
    (void)threads;
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        return -1;
    }
    return 0;
}

/* ---- scaling table --------------------------------------------------------------------- */

typedef struct scale_ctx {
    bench *b;
    qcal_tensor t;
    int op; /* 0 minmax, 1 histogram update (range fixed), 2 fake-quant forward */
} scale_ctx;

static void op_scale(void *p)
{
    scale_ctx *s = p;
    bench *b = s->b;
    if (s->op == 0) {
        CHECK(qcal_observer_reset(b->obs[QCAL_OBSERVER_MINMAX]));
        CHECK(qcal_observer_update(b->obs[QCAL_OBSERVER_MINMAX], &s->t));
    } else if (s->op == 1) {
        CHECK(qcal_observer_update(b->obs[QCAL_OBSERVER_HISTOGRAM], &s->t));
    } else {
        qcal_tensor_mut y = mut_of(&s->t, b->y);
        CHECK(qcal_fakequant_forward(&s->t, &b->qpt, &y, NULL));
    }
}

static void scaling(bench *b, const int *threads, int nt)
{
    static const char *names[3] = {"minmax", "histogram update", "fake-quant forward"};
    static const double bpe[3] = {4, 4, 8};
    printf("\n### Scaling: time per call vs tensor size (median)\n\n");
    printf("| op | elements |");
    for (int ti = 0; ti < nt; ti++)
        printf(" %d thread%s | GB/s |", threads[ti], threads[ti] > 1 ? "s" : "");
    if (nt >= 2)
        printf(" speed-up %dt/%dt |", threads[nt - 1], threads[0]);
    printf("\n|---|---|");
    for (int ti = 0; ti < nt; ti++)
        printf("---|---|");
    printf(nt >= 2 ? "---|\n" : "\n");
    for (int op = 0; op < 3; op++) {
        for (int64_t n = 1024; n <= (64ll << 20); n *= 4) {
            if (g_quick && n > (16ll << 20))
                break;
            scale_ctx s = {b, {0}, op};
            CHECK(qcal_tensor_init(&s.t, b->x, 1, &n));
            double med[MAXT];
            printf("| %s | %lld |", names[op], (long long)n);
            for (int ti = 0; ti < nt; ti++) {
                set_threads(threads[ti]);
                if (op == 1) {
                    CHECK(qcal_observer_reset(b->obs[QCAL_OBSERVER_HISTOGRAM]));
                    CHECK(qcal_observer_update(b->obs[QCAL_OBSERVER_HISTOGRAM], &s.t));
                }
                timing t = measure(op_scale, &s, g_quick ? 0.05 : 0.15);
                med[ti] = t.med;
                char a[32];
                fmt_time(a, sizeof a, t.med);
                printf(" %s | %.1f |", a, (double)n * bpe[op] / t.med * 1e-9);
            }
            if (nt >= 2)
                printf(" %.2fx |", med[0] / med[nt - 1]);
            printf("\n");
            fflush(stdout);
        }
    }
}

/* ---- main ------------------------------------------------------------------------------ */

static double median_of(double *v, int n, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    if (lo)
        *lo = v[0];
    if (hi)
        *hi = v[n - 1];
    return v[n / 2];
}

/* One row measured in pairs: each pair times qcal, then PyTorch (if it has the op), then
 * the bandwidth probe (if the row is bandwidth-bound), back to back, so that a busy
 * machine slows every member of a pair alike. The row keeps the medians over the pairs of
 * qcal's time, PyTorch's time, the ratio torch/qcal and the fraction of the limit, with the
 * spread (min - max) of the ratios and fractions. */
static void paired_row(bench *b, const row_def *d, row_result *rr, torch_server *ts,
                       int use_torch, int threads, bench_bandwidth *bw_row)
{
    enum { MAXP = 15 };
    int pairs = g_quick ? 3 : 7;
    double budget = g_quick ? 0.05 : 0.15;
    double q[MAXP], qmin[MAXP], qmax[MAXP], tt[MAXP], ratio[MAXP], frac[MAXP], rd[MAXP],
        cp[MAXP], inc[MAXP], ceil_[MAXP], sfrac[MAXP];
    int nt = 0, nf = 0, nc = 0, ns = 0;
    d->fn(b); /* warm-up */
    g_paired_sample = 1;
    for (int k = 0; k < pairs; k++) {
        timing s = measure(d->fn, b, budget);
        q[k] = s.med;
        qmin[k] = s.min;
        qmax[k] = s.max;
        timing ts_ = {0};
        if (d->torch && use_torch) {
            settle();
            if (torch_row(ts, d, budget, &ts_)) {
                tt[nt] = ts_.med;
                ratio[nt] = ts_.med / s.med;
                nt++;
            }
        }
        if (d->limit == LIM_INCR) {
            double g = 0;
            /* The probe is short (about 1 ms): it waits, as PyTorch's turn does, for the
             * other side's idle workers to stop spinning (without the pause, one 2-thread
             * pair of a first version read 14 times low). */
            settle();
            if (bench_increment_measure(threads, 5, &g) == 0 && g > 0) {
                double gbps = (double)rr->elements * d->bytes_per_el / s.med * 1e-9;
                inc[nf] = g;
                frac[nf++] = gbps / (g * d->bytes_per_el);
                /* What PyTorch's time allows at best: one increment per value at the
                 * probe's rate and nothing else. */
                if (d->torch && use_torch && nt > 0 && ts_.med > 0)
                    ceil_[nc++] = ts_.med / ((double)rr->elements / (g * 1e9));
                /* Reported beside it, no verdict: the same increments reading the row's
                 * number of values from memory, the bound of a kernel that reads its input
                 * (on the Intel Xeon VM the stream took a quarter of the probe's rate). */
                double gs = 0;
                settle();
                if (bench_increment_stream_measure(threads, 3, rr->elements, &gs) == 0 && gs > 0)
                    sfrac[ns++] = gbps / (gs * d->bytes_per_el);
            }
        } else if (d->limit != LIM_NONE) {
            bench_bandwidth bw;
            if (bench_bandwidth_measure(threads, g_quick ? (64ll << 20) : (256ll << 20), 1,
                                        &bw) == 0) {
                double lim = d->limit == LIM_READ ? bw.read_gbps : bw.copy_gbps;
                double gbps = (double)rr->elements * d->bytes_per_el / s.med * 1e-9;
                rd[nf] = bw.read_gbps;
                cp[nf] = bw.copy_gbps;
                frac[nf++] = gbps / lim;
            }
        }
        settle();
    }
    g_paired_sample = 0;
    double lo, hi;
    rr->pairs = pairs;
    rr->q.med = median_of(q, pairs, NULL, NULL);
    rr->q.min = median_of(qmin, pairs, &lo, NULL);
    rr->q.min = lo;
    rr->q.max = median_of(qmax, pairs, NULL, &hi);
    rr->q.max = hi;
    rr->q.reps = pairs;
    rr->gbps = d->bytes_per_el > 0 ? (double)rr->elements * d->bytes_per_el / rr->q.med * 1e-9
                                   : NAN;
    rr->limit = rr->fraction = rr->frac_lo = rr->frac_hi = NAN;
    if (nf && d->limit == LIM_INCR) {
        rr->fraction = median_of(frac, nf, &rr->frac_lo, &rr->frac_hi);
        double g = median_of(inc, nf, NULL, NULL);
        rr->limit = g * d->bytes_per_el;
        if (nc) {
            double lo, hi, m = median_of(ceil_, nc, &lo, &hi);
            rr->ceiling = m;
            int o = snprintf(rr->note, sizeof rr->note,
                             "increment probe %.2f G/s; at that rate alone %.1fx PyTorch "
                             "(%.1f-%.1f)", g, m, lo, hi);
            if (ns && o > 0 && (size_t)o < sizeof rr->note)
                snprintf(rr->note + o, sizeof rr->note - (size_t)o,
                         "; %.0f%% of the probe reading the input too",
                         100 * median_of(sfrac, ns, NULL, NULL));
        } else
            snprintf(rr->note, sizeof rr->note, "increment probe %.2f G/s", g);
    } else if (nf) {
        rr->fraction = median_of(frac, nf, &rr->frac_lo, &rr->frac_hi);
        double r = median_of(rd, nf, NULL, NULL), c = median_of(cp, nf, NULL, NULL);
        rr->limit = d->limit == LIM_READ ? r : c;
        bw_row->read_gbps = r;
        bw_row->copy_gbps = c;
    }
    rr->have_torch = nt > 0;
    rr->ratio = rr->ratio_lo = rr->ratio_hi = NAN;
    if (nt) {
        rr->t.med = median_of(tt, nt, &rr->t.min, &rr->t.max);
        rr->t.reps = nt;
        rr->ratio = median_of(ratio, nt, &rr->ratio_lo, &rr->ratio_hi);
    }
}

int main(int argc, char **argv)
{
    const char *json = "bench-results.json", *torch_cmd = NULL, *only = NULL;
    int threads[MAXT] = {1, 2}, nt = 2, do_scaling = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            torch_cmd = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--no-scaling"))
            do_scaling = 0;
        else if (!strcmp(argv[i], "--quick"))
            g_quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            nt = 0;
            for (char *p = argv[++i]; *p && nt < MAXT;) {
                int t = (int)strtol(p, &p, 10);
                if (t < 1 || t > 64) {
                    fprintf(stderr, "qcal_bench: bad thread count in --threads\n");
                    return 2;
                }
                threads[nt++] = t;
                while (*p == ',')
                    p++;
            }
            if (nt == 0)
                return 2;
        } else {
            fprintf(stderr,
                    "usage: qcal_bench [--threads 1,2] [--json FILE] [--torch CMD] "
                    "[--only NAME,...] [--no-scaling] [--quick]\n");
            return 2;
        }
    }
    int selected[NROWS];
    for (int r = 0; r < NROWS; r++) {
        selected[r] = 1;
        if (only) {
            selected[r] = 0;
            size_t n = strlen(ROWS[r].name);
            for (const char *p = only; *p;) {
                size_t len = strcspn(p, ",");
                if (len == n && !strncmp(p, ROWS[r].name, n))
                    selected[r] = 1;
                p += len;
                while (*p == ',')
                    p++;
            }
        }
    }
#if !QCAL_HAVE_OPENMP
    fprintf(stderr, "qcal_bench: built without OpenMP: every thread count runs 1 thread\n");
#endif
    bench *b = calloc(1, sizeof *b);
    if (!b)
        return 2;
    fprintf(stderr, "qcal_bench: preparing data...\n");
    setup(b);
    static row_result res[sizeof ROWS / sizeof ROWS[0]][MAXT];
    bench_bandwidth bw[MAXT];
    const char *isa_env = getenv("QCAL_ISA");
    printf("## qcal benchmark (ISA cap %s, OpenMP %s)\n\n", isa_env ? isa_env : "none",
           QCAL_HAVE_OPENMP ? "on" : "off");
    for (int ti = 0; ti < nt; ti++) {
        int t = threads[ti];
        set_threads(t);
        torch_server ts = {0};
        if (torch_cmd) {
            fprintf(stderr, "qcal_bench: starting the PyTorch helper, %d thread(s)\n", t);
            if (torch_start(&ts, torch_cmd, t) != 0)
                fprintf(stderr, "qcal_bench: cannot start the PyTorch helper\n");
        }
        if (bench_bandwidth_measure(t, g_quick ? (64ll << 20) : (256ll << 20), g_quick ? 3 : 7,
                                    &bw[ti]) != 0) {
            fprintf(stderr, "qcal_bench: out of memory for the bandwidth probe\n");
            return 2;
        }
        printf("Bandwidth probe, %d thread(s): read %.1f GB/s, copy %.1f GB/s (cached stores "
               "%.1f, memcpy %.1f; read + write bytes)\n",
               t, bw[ti].read_gbps, bw[ti].copy_gbps, bw[ti].copy_store_gbps,
               bw[ti].copy_memcpy_gbps);
        fflush(stdout);
        set_threads(t);
        for (int r = 0; r < NROWS; r++) {
            if (!selected[r])
                continue;
            const row_def *d = &ROWS[r];
            row_result *rr = &res[r][ti];
            rr->threads = t;
            rr->elements = d->elements;
            rr->ceiling = NAN;
            rr->bw = bw[ti];
            b->kind = d->kind;
            b->in = d->input == 0 ? &b->t16 : d->input == 1 ? &b->tw : &b->tact;
            fprintf(stderr, "qcal_bench: %s, %d thread(s)\n", d->name, t);
            /* verify (canonical run), then time */
            b->canonical = 1;
            memset(b->res, 0, sizeof b->res);
            b->res_n = 0;
            b->out = NULL;
            d->fn(b);
            verify_row(b, r);
            uint64_t h = fnv(0xcbf29ce484222325ull, b->res, (size_t)b->res_n * sizeof(float));
            if (b->out)
                h = fnv(h, b->out, b->out_bytes);
            rr->hash = h;
            b->canonical = 0;
            settle();
#if BENCH_HAVE_CNN
            if (d->fn == op_cnn_calib) {
                rr->hash = b->cnn_hash;
                rr->elements = (int64_t)b->cnn_batches * b->cnn_batch;
                /* Plain and observed forwards alternate (after one warm-up each) so that
                 * both see the same machine state; overhead = median ratio - 1. */
                enum { PAIRS = 7 };
                double tp[PAIRS], tc[PAIRS], ratio[PAIRS];
                int pairs = g_quick ? 3 : PAIRS;
                op_cnn_plain(b);
                op_cnn_calib(b);
                for (int k = 0; k < pairs; k++) {
                    double t0 = now_s();
                    op_cnn_plain(b);
                    tp[k] = now_s() - t0;
                    t0 = now_s();
                    op_cnn_calib(b);
                    tc[k] = now_s() - t0;
                    ratio[k] = tc[k] / tp[k];
                }
                qsort(tp, (size_t)pairs, sizeof(double), cmp_d);
                qsort(tc, (size_t)pairs, sizeof(double), cmp_d);
                qsort(ratio, (size_t)pairs, sizeof(double), cmp_d);
                timing q = {tc[pairs / 2], tc[0], tc[pairs - 1], pairs};
                rr->q = q;
                rr->gbps = rr->limit = rr->fraction = rr->frac_lo = rr->frac_hi = NAN;
                rr->ratio = rr->ratio_lo = rr->ratio_hi = NAN;
                rr->have_torch = 0;
                rr->pairs = pairs;
                snprintf(rr->note, sizeof rr->note,
                         "%d x %d images, float forward %.1f ms (min %.1f), observer "
                         "overhead %.1f%% (median of %d paired runs)",
                         b->cnn_batches, b->cnn_batch, tp[pairs / 2] * 1e3, tp[0] * 1e3,
                         (ratio[pairs / 2] - 1) * 100, pairs);
            } else
#endif
            {
                paired_row(b, d, rr, &ts, torch_cmd != NULL, t, &rr->bw);
            }
            evaluate(d, rr);
            rr->identical = -1;
            if (ti > 0) {
                rr->identical = rr->hash == res[r][0].hash;
                res[r][0].identical = rr->identical & (res[r][0].identical != 0);
#if BENCH_HAVE_CNN
                /* the CNN's own sgemm may round differently with other thread counts
                 * (cnn.c), so the calibration table is not compared across threads */
                if (d->fn == op_cnn_calib)
                    rr->identical = res[r][0].identical = -1;
#endif
                if (rr->identical == 0) {
                    fprintf(stderr, "qcal_bench: %s: results differ between %d and %d threads\n",
                            d->name, threads[0], t);
                    g_failed = 1;
                }
            }
        }
        torch_stop(&ts);
    }
#if !BENCH_HAVE_CNN
    printf("\n(calibration of the demo CNN: not built - examples/cnn is not available)\n");
#endif
    print_table(selected, res, nt);
    fflush(stdout);
    if (write_json(json, selected, res, nt, bw, threads) == 0)
        fprintf(stderr, "qcal_bench: wrote %s\n", json);
    else
        g_failed = 1;
    if (do_scaling)
        scaling(b, threads, nt);
    teardown(b);
    free(b);
    if (g_failed)
        fprintf(stderr, "qcal_bench: FAILED (verification or bit-identity, see above)\n");
    return g_failed ? 1 : 0;
}
