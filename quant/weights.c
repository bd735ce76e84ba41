/* The weight quantizer (include/qcal/weights.h): observe a float32 weight, compute its
 * qparams, quantize it; in memory or streamed through a reader in blocks, threaded over
 * blocks with per-thread observers merged in thread order (min and max merge exactly, so
 * every output is the one-thread pass's, bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "qcal/quantize.h"
#include "qcal/weights.h"
#include "qcal_config.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

void qcal_weights_options_default(qcal_weights_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->observer = QCAL_OBSERVER_PER_CHANNEL_MINMAX;
    qcal_qconfig_default(&opt->q);
    opt->q.dtype = QCAL_QINT8;
    opt->q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    opt->axis = 0;
    opt->nonfinite = QCAL_NONFINITE_SKIP;
    opt->empty_as_zero = false;
    opt->scales = NULL;
    opt->block_bytes = (size_t)512 << 10;
    opt->serial = false;
    opt->scratch = NULL;
    opt->scratch_bytes = 0;
}

static bool per_channel_kind(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX || k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

qcal_status qcal_weights_channels(const qcal_weights_options *opt, const qcal_tensor *w, int64_t *channels)
{
    if (!opt || !w || !channels)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_weights_channels: NULL argument");
    if (!qcal_qscheme_is_per_channel(opt->q.qscheme)) {
        *channels = 1;
        return QCAL_OK;
    }
    if (opt->axis < 0 || opt->axis >= w->ndim)
        return qcal_error(QCAL_ERR_INVALID_ARG, "weight channel axis %d is outside [0, %d)",
                          (int)opt->axis, (int)w->ndim);
    *channels = w->shape[opt->axis];
    return QCAL_OK;
}

size_t qcal_weights_scratch_bytes(const qcal_weights_options *opt, const qcal_tensor *w)
{
    int64_t n;
    if (!opt || !w || qcal_tensor_numel(w, &n) != QCAL_OK || (uint64_t)n > (SIZE_MAX - QCAL_WEIGHTS_SCRATCH_SLACK) / 4)
        return 0;
    return (size_t)n * 4 + QCAL_WEIGHTS_SCRATCH_SLACK;
}

/* How the weight is walked. */
enum {
    M_WHOLE,   /* one tensor (in memory, or read whole): any observer kind */
    M_CHAN,    /* blocks of whole channels (outer == 1): observed, qparams, quantized per block */
    M_ROWS,    /* blocks of whole (C, inner) rows, axis 1 in the block: observe pass, quantize pass */
    M_FLAT,    /* per-tensor: flat blocks of elements: observe pass, quantize pass */
};

typedef struct wq {
    const qcal_weights_options *opt;
    const qcal_tensor *w;
    const qcal_weights_reader *rd;
    qcal_observer_config cfg;   /* the observer the blocks (or the whole tensor) get */
    int mode;
    int64_t numel, channels;
    int64_t unit, units, rows, blocks;   /* blocks of `rows` units of `unit` elements */
    size_t esz;
    float *scales;
    int32_t *zps;
    uint8_t *codes;
    const qcal_qparams *qp;     /* quantize pass: the whole weight's qparams */
} wq;

typedef struct wthread {
    void *scratch;
    bool lent;                  /* scratch is opt->scratch (the caller's) */
    qcal_observer *obs;
    bool no_data;
} wthread;

typedef qcal_status (*block_fn)(wq *q, wthread *t, int64_t b);

static qcal_status read_elems(const wq *q, int64_t first, int64_t count, void *scratch, const float **out)
{
    if (!q->rd) {
        *out = q->w->data + first;
        return QCAL_OK;
    }
    return q->rd->read(q->rd->ctx, first, count, scratch, out);
}

/* Block b as a tensor over data (its first element: *first). */
static void block_tensor(const wq *q, int64_t b, const float *data, qcal_tensor *x)
{
    const int64_t u0 = b * q->rows, n = q->units - u0 < q->rows ? q->units - u0 : q->rows;
    const int32_t axis = q->opt->axis;
    memset(x, 0, sizeof *x);
    x->data = data;
    x->shape[0] = n;
    if (q->mode == M_CHAN) {          /* (channels of the block, dims after axis...) */
        x->ndim = q->w->ndim - axis;
        for (int32_t k = axis + 1; k < q->w->ndim; k++)
            x->shape[k - axis] = q->w->shape[k];
    } else if (q->mode == M_ROWS) {   /* (rows, C, dims after axis...) */
        x->ndim = q->w->ndim - axis + 1;
        for (int32_t k = axis; k < q->w->ndim; k++)
            x->shape[k - axis + 1] = q->w->shape[k];
    } else {
        x->ndim = 1;
    }
}

static qcal_status block_read(const wq *q, wthread *t, int64_t b, qcal_tensor *x)
{
    const int64_t u0 = b * q->rows, n = q->units - u0 < q->rows ? q->units - u0 : q->rows;
    const float *data;
    qcal_status st = read_elems(q, u0 * q->unit, n * q->unit, t->scratch, &data);
    if (st == QCAL_OK)
        block_tensor(q, b, data, x);
    return st;
}

/* The observer's qparams; with empty_as_zero a channel without data is observed as [0, 0]. */
static qcal_status obs_qparams(const wq *q, qcal_observer *obs, qcal_qparams *qp)
{
    if (!q->opt->empty_as_zero)
        return qcal_observer_qparams(obs, qp);
    int64_t n = 0, cap = q->cfg.axis >= 0 && per_channel_kind(q->cfg.kind) ? q->channels : 1;
    float *lo = malloc((size_t)cap * sizeof *lo), *hi = malloc((size_t)cap * sizeof *hi);
    qcal_status st = !lo || !hi ? qcal_error(QCAL_ERR_NO_MEMORY, "out of memory")
                                : qcal_observer_qrange(obs, cap, lo, hi, &n);
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    for (int64_t c = 0; st == QCAL_OK && c < n; c++)
        if (lo[c] == INFINITY && hi[c] == -INFINITY)
            lo[c] = hi[c] = 0.0f;
    if (st == QCAL_OK)
        st = qcal_qparams_compute(&q->cfg.q, q->cfg.axis, n, lo, hi, qp);
    free(lo);
    free(hi);
    return st;
}

/* Channels [c0, c0 + n) of qp into the outputs. */
static void put_qparams(wq *q, const qcal_qparams *qp, int64_t c0)
{
    for (int64_t c = 0; c < qp->channels; c++) {
        q->scales[c0 + c] = qcal_qparams_scale_at(qp, c);
        if (q->zps)
            q->zps[c0 + c] = qcal_qparams_zero_point_at(qp, c);
    }
}

static qcal_status observe_block(wq *q, wthread *t, int64_t b)
{
    qcal_tensor x;
    qcal_status st = block_read(q, t, b, &x);
    return st == QCAL_OK ? qcal_observer_update(t->obs, &x) : st;
}

static qcal_status quantize_block(wq *q, wthread *t, int64_t b)
{
    qcal_tensor x;
    qcal_status st = block_read(q, t, b, &x);
    return st == QCAL_OK ? qcal_quantize(&x, q->qp, q->codes + (size_t)(b * q->rows * q->unit) * q->esz) : st;
}

/* Given scales, a block of whole channels: its slice of the qparams. */
static qcal_status given_chan_block(wq *q, wthread *t, int64_t b)
{
    qcal_tensor x;
    qcal_qparams bqp;
    const int64_t c0 = b * q->rows;
    qcal_status st = block_read(q, t, b, &x);
    if (st == QCAL_OK)
        st = qcal_qparams_per_channel(&bqp, q->qp->dtype, 0, x.shape[0], q->qp->scales + c0,
                                      q->qp->zero_points + c0);
    return st == QCAL_OK ? qcal_quantize(&x, &bqp, q->codes + (size_t)(c0 * q->unit) * q->esz) : st;
}

/* A block of whole channels: observed, its qparams, and its codes while it is in cache. A
 * channel's qparams depend on its own min and max only (quant/qparams.c), so the blocks give
 * the whole tensor's, bit for bit. */
static qcal_status chan_block(wq *q, wthread *t, int64_t b)
{
    qcal_tensor x;
    qcal_qparams qp = { 0 };
    qcal_status st = block_read(q, t, b, &x);
    if (st == QCAL_OK)
        st = qcal_observer_reset(t->obs);
    if (st == QCAL_OK)
        st = qcal_observer_update(t->obs, &x);
    if (st == QCAL_OK)
        st = obs_qparams(q, t->obs, &qp);
    if (st == QCAL_NO_DATA) {
        t->no_data = true;
        st = QCAL_OK;
    }
    if (st == QCAL_OK && qp.channels != x.shape[0])
        st = qcal_error(QCAL_ERR_STATE, "%lld channels observed in a block of %lld",
                        (long long)qp.channels, (long long)x.shape[0]);
    if (st == QCAL_OK)
        put_qparams(q, &qp, b * q->rows);
    if (st == QCAL_OK && q->codes)
        st = qcal_quantize(&x, &qp, q->codes + (size_t)(b * q->rows * q->unit) * q->esz);
    qcal_qparams_free(&qp);
    return st;
}

/* A thread's scratch and observer; the calling thread's (lend) reads into opt->scratch when it
 * is large enough: a caller quantizing many weights faults its pages in once. */
static qcal_status thread_init(const wq *q, wthread *t, bool obs, bool lend)
{
    memset(t, 0, sizeof *t);
    const size_t need = (size_t)(q->rows * q->unit) * 4 + QCAL_WEIGHTS_SCRATCH_SLACK;
    if (q->rd && lend && q->opt->scratch && q->opt->scratch_bytes >= need) {
        t->scratch = q->opt->scratch;
        t->lent = true;
    } else if (q->rd && !(t->scratch = malloc(need))) {
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for a weight block");
    }
    return obs ? qcal_observer_create(&q->cfg, &t->obs) : QCAL_OK;
}

static void thread_free(wthread *t)
{
    if (!t->lent)
        free(t->scratch);
    qcal_observer_destroy(&t->obs);
}

/* fn over every block: thread k takes blocks k, k + T, ...; with observers, each thread's
 * are merged into thread 0's in thread order (merge into *t0, which the caller frees). The
 * first failing thread's status and message are returned. */
static qcal_status run_blocks(wq *q, block_fn fn, bool obs, wthread *t0)
{
    /* Only the observer pass over rows or flat blocks is shared among threads. A block is
     * under the threading threshold (512 KiB < QCAL_OMP_MIN_ELEMENTS floats) and quantizing
     * it (or a channel block's whole pass) on the calling thread costs less CPU than a
     * team's start and spin for each weight (docs/performance.md). */
    int nt = q->opt->serial || fn != observe_block ? 1 : qcal_threads_for(q->numel);
    nt = nt > q->blocks ? (int)q->blocks : nt;
    qcal_status st = thread_init(q, t0, obs, true);
#if QCAL_HAVE_OPENMP
    enum { MAX_T = 16 };
    if (st == QCAL_OK && nt > 1) {
        nt = nt > MAX_T ? MAX_T : nt;
        wthread ts[MAX_T];
        qcal_status tst[MAX_T];
        char *errs = calloc((size_t)MAX_T, 512);
        if (!errs)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        int used = 1;
#pragma omp parallel num_threads(nt)
        {
            const int k = omp_get_thread_num(), T = omp_get_num_threads();
#pragma omp single
            used = T;
            wthread *t = k == 0 ? t0 : &ts[k];
            qcal_status s = k == 0 ? QCAL_OK : thread_init(q, t, obs, false);
            for (int64_t b = k; s == QCAL_OK && b < q->blocks; b += T)
                s = fn(q, t, b);
            tst[k] = s;
            if (s != QCAL_OK)   /* the message is the thread's own */
                snprintf(errs + (size_t)k * 512, 512, "%s", qcal_last_error());
        }
        for (int k = 0; k < used && st == QCAL_OK; k++)
            if (tst[k] != QCAL_OK)
                st = qcal_error(tst[k], "%s", errs + (size_t)k * 512);
        for (int k = 1; k < used; k++) {
            if (st == QCAL_OK && obs && q->mode != M_CHAN)
                st = qcal_observer_merge(t0->obs, ts[k].obs);
            t0->no_data |= ts[k].no_data;
            thread_free(&ts[k]);
        }
        free(errs);
        return st;
    }
#endif
    (void)nt;
    for (int64_t b = 0; st == QCAL_OK && b < q->blocks; b++)
        st = fn(q, t0, b);
    return st;
}

/* QCAL_NONFINITE_ERROR: the first non-finite element, named by its index. */
static qcal_status check_finite(const wq *q)
{
    const int64_t blk = (int64_t)(q->opt->block_bytes / 4) > 0 ? (int64_t)(q->opt->block_bytes / 4) : 1;
    void *scratch = q->rd ? malloc((size_t)blk * 4 + QCAL_WEIGHTS_SCRATCH_SLACK) : NULL;
    if (q->rd && !scratch)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    qcal_status st = QCAL_OK;
    for (int64_t i0 = 0; st == QCAL_OK && i0 < q->numel; i0 += blk) {
        const int64_t n = q->numel - i0 < blk ? q->numel - i0 : blk;
        const float *v;
        if ((st = read_elems(q, i0, n, scratch, &v)) != QCAL_OK)
            break;
        for (int64_t j = 0; j < n; j++) {
            if (isfinite(v[j]))
                continue;
            int64_t at[QCAL_MAX_DIMS], rem = i0 + j;
            for (int32_t k = q->w->ndim - 1; k >= 0; k--) {
                at[k] = rem % q->w->shape[k];
                rem /= q->w->shape[k];
            }
            char idx[QCAL_MAX_DIMS * 24 + 1] = "";
            size_t len = 0;
            for (int32_t k = 0; k < q->w->ndim; k++)
                len += (size_t)snprintf(idx + len, sizeof idx - len, "[%lld]", (long long)at[k]);
            st = qcal_error(QCAL_ERR_NONFINITE, "weight%s = %g is not finite", idx, (double)v[j]);
            break;
        }
    }
    free(scratch);
    return st;
}

/* Given scales: zero-points 0, quantize only. */
static qcal_status quantize_given(wq *q, const qcal_qparams *qp)
{
    put_qparams(q, qp, 0);
    if (!q->codes)
        return QCAL_OK;
    wthread t0;
    q->qp = qp;
    qcal_status st = run_blocks(q, q->mode == M_CHAN ? given_chan_block : quantize_block, false, &t0);
    thread_free(&t0);
    return st;
}

/* M_WHOLE: one observer over the whole tensor (read whole through a reader). */
static qcal_status whole(wq *q)
{
    wthread t;
    qcal_tensor x = *q->w;
    qcal_qparams qp = { 0 };
    q->rows = 1, q->unit = q->numel;
    qcal_status st = thread_init(q, &t, true, true);
    if (st == QCAL_OK && q->rd)
        st = read_elems(q, 0, q->numel, t.scratch, &x.data);
    if (st == QCAL_OK)
        st = qcal_observer_update(t.obs, &x);
    if (st == QCAL_OK)
        st = obs_qparams(q, t.obs, &qp);
    qcal_status nd = st;
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    if (st == QCAL_OK && qp.channels != q->channels)
        st = qcal_error(QCAL_ERR_STATE, "the weight observer gave %lld channels, not %lld",
                        (long long)qp.channels, (long long)q->channels);
    if (st == QCAL_OK)
        put_qparams(q, &qp, 0);
    if (st == QCAL_OK && q->codes)
        st = qcal_quantize(&x, &qp, q->codes);
    qcal_qparams_free(&qp);
    thread_free(&t);
    return st == QCAL_OK ? nd : st;
}

qcal_status qcal_weights_quantize(const qcal_weights_options *opt, const qcal_tensor *w,
                                  const qcal_weights_reader *reader, float *scales,
                                  int32_t *zero_points, void *codes)
{
    if (!opt || !w || !scales)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_weights_quantize: NULL argument");
    if (reader && !reader->read)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_weights_quantize: reader without a read function");
    wq q;
    memset(&q, 0, sizeof q);
    q.opt = opt, q.w = w, q.rd = reader, q.scales = scales, q.zps = zero_points, q.codes = codes;
    qcal_status st = qcal_tensor_numel(w, &q.numel);
    if (st != QCAL_OK)
        return st;
    if (q.numel == 0)
        return qcal_error(QCAL_ERR_EMPTY, "the weight has no elements");
    if (!reader && !w->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "the weight has no data and no reader");
    if ((st = qcal_weights_channels(opt, w, &q.channels)) != QCAL_OK)
        return st;
    if (!(q.esz = qcal_dtype_size(opt->q.dtype)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown weight dtype %d", (int)opt->q.dtype);
    const bool per_channel = qcal_qscheme_is_per_channel(opt->q.qscheme);
    if (per_channel && !per_channel_kind(opt->observer))
        return qcal_error(QCAL_ERR_INVALID_ARG, "per-channel qscheme %s needs a per-channel observer, not %s",
                          qcal_qscheme_name(opt->q.qscheme), qcal_observer_kind_name(opt->observer));
    if (opt->nonfinite == QCAL_NONFINITE_ERROR && (st = check_finite(&q)) != QCAL_OK)
        return st;

    /* The weight as (outer, C, inner) around the axis (per-tensor: flat). */
    int64_t outer = 1;
    for (int32_t k = 0; per_channel && k < opt->axis; k++)
        outer *= w->shape[k];   /* cannot overflow: numel did not */
    const int64_t block_elems = (int64_t)(opt->block_bytes / 4) > 0 ? (int64_t)(opt->block_bytes / 4) : 1;
    if (opt->scales) {
        /* blocks of channels (outer == 1) or of (C, inner) rows, axis 1 (per-channel), or flat
         * blocks (per-tensor) */
        int32_t *zz = calloc((size_t)q.channels, sizeof *zz);
        qcal_qparams qp;
        if (!zz)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        st = per_channel ? qcal_qparams_per_channel(&qp, opt->q.dtype, 1, q.channels,
                                                    opt->scales, zz)
                         : qcal_qparams_per_tensor(&qp, opt->q.dtype, opt->scales[0], 0);
        if (st == QCAL_OK) {
            q.mode = per_channel ? M_ROWS : M_FLAT;
            q.unit = per_channel ? q.numel / outer : 1;
            q.units = per_channel ? outer : q.numel;
            if (per_channel && outer == 1) {   /* (C, inner...): blocks of whole channels */
                q.mode = M_CHAN;
                q.unit = q.numel / q.channels;
                q.units = q.channels;
            }
            q.rows = q.unit >= block_elems ? 1 : block_elems / q.unit;
            q.rows = q.rows > q.units ? q.units : q.rows;
            q.blocks = (q.units + q.rows - 1) / q.rows;
            st = quantize_given(&q, &qp);
        }
        free(zz);
        return st;
    }

    qcal_observer_config_default(&q.cfg, !per_channel && per_channel_kind(opt->observer) ? QCAL_OBSERVER_MINMAX
                                                                                 : opt->observer);
    q.cfg.q = opt->q;
    q.cfg.nonfinite = opt->nonfinite;
    const bool minmax = per_channel ? opt->observer == QCAL_OBSERVER_PER_CHANNEL_MINMAX
                                    : per_channel_kind(opt->observer) || opt->observer == QCAL_OBSERVER_MINMAX;
    if (per_channel && minmax && reader && outer == 1 && (size_t)q.numel * 4 > opt->block_bytes) {
        q.mode = M_CHAN;
        q.unit = q.numel / q.channels;
        q.units = q.channels;
        q.cfg.axis = 0;
    } else if (per_channel && minmax && reader && outer > 1) {
        q.mode = M_ROWS;
        q.unit = q.numel / outer;
        q.units = outer;
        q.cfg.axis = 1;
    } else if (!per_channel && minmax && reader && (size_t)q.numel * 4 > opt->block_bytes) {
        q.mode = M_FLAT;
        q.unit = 1;
        q.units = q.numel;
    } else {
        if (per_channel)
            q.cfg.axis = opt->axis;
        q.mode = M_WHOLE;
        return whole(&q);
    }
    q.rows = q.unit >= block_elems ? 1 : block_elems / q.unit;
    q.rows = q.rows > q.units ? q.units : q.rows;
    q.blocks = (q.units + q.rows - 1) / q.rows;

    wthread t0;
    if (q.mode == M_CHAN) {
        st = run_blocks(&q, chan_block, true, &t0);
        if (st == QCAL_OK && t0.no_data)
            st = QCAL_NO_DATA;
        thread_free(&t0);
        return st;
    }
    /* rows / flat: observe every block, the qparams, then quantize every block */
    qcal_qparams qp = { 0 };
    st = run_blocks(&q, observe_block, true, &t0);
    if (st == QCAL_OK)
        st = obs_qparams(&q, t0.obs, &qp);
    thread_free(&t0);
    qcal_status nd = st;
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    if (st == QCAL_OK && qp.channels != q.channels)
        st = qcal_error(QCAL_ERR_STATE, "the weight observer gave %lld channels, not %lld",
                        (long long)qp.channels, (long long)q.channels);
    if (st == QCAL_OK)
        put_qparams(&q, &qp, 0);
    if (st == QCAL_OK && q.codes) {
        q.qp = &qp;
        st = run_blocks(&q, quantize_block, false, &t0);
        thread_free(&t0);
    }
    qcal_qparams_free(&qp);
    return st == QCAL_OK ? nd : st;
}
