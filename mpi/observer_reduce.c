/* Observers over MPI: reduce, all-reduce and the data-parallel update (qcal/mpi.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mpi/tree.h"
#include "qcal/mpi.h"

typedef struct obs_ctx {
    qcal_observer *local;
    qcal_observer *partial;
} obs_ctx;

static qcal_status obs_copy(const qcal_observer *src, qcal_observer **out)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_observer_save(src, &buf, &len);
    if (st == QCAL_OK)
        st = qcal_observer_load(buf, len, out);
    qcal_free(buf);
    return st;
}

static qcal_status obs_begin(void *c)
{
    obs_ctx *x = c;
    return obs_copy(x->local, &x->partial);
}

static qcal_status obs_merge(void *c, const void *buf, size_t len)
{
    obs_ctx *x = c;
    qcal_observer *o = NULL;
    qcal_status st = qcal_observer_load(buf, len, &o);
    if (st == QCAL_OK)
        st = qcal_observer_merge(x->partial, o);
    qcal_observer_destroy(&o);
    return st;
}

static qcal_status obs_save(void *c, void **buf, size_t *len)
{
    obs_ctx *x = c;
    return qcal_observer_save(x->partial, buf, len);
}

static qcal_status obs_load(void *c, const void *buf, size_t len)
{
    obs_ctx *x = c;
    qcal_observer_destroy(&x->partial);
    return qcal_observer_load(buf, len, &x->partial);
}

/* local = partial: reset, then merge into the empty observer (exact for every kind,
 * counts included). */
static qcal_status obs_commit(void *c)
{
    obs_ctx *x = c;
    qcal_status st = qcal_observer_reset(x->local);
    return st == QCAL_OK ? qcal_observer_merge(x->local, x->partial) : st;
}

static void obs_end(void *c)
{
    obs_ctx *x = c;
    qcal_observer_destroy(&x->partial);
}

static const qcal_mpi_tree_ops obs_ops = {
    obs_begin, obs_merge, obs_save, obs_load, obs_commit, obs_end,
};

static qcal_status obs_reduce(qcal_observer *obs, int root, bool all, MPI_Comm comm)
{
    /* A NULL observer on one rank must not strand the others: agree first. */
    qcal_status st = obs ? QCAL_OK : qcal_error(QCAL_ERR_INVALID_ARG, "observer is NULL");
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        return st;
    /* Moving averages depend on order: merged only when at most one rank has data. */
    qcal_observer_kind k = qcal_observer_get_config(obs)->kind;
    int mine = 0, with_data = 0;
    if (k == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
        k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX) {
        uint64_t nb = 0;
        qcal_observer_batches(obs, &nb);
        mine = nb > 0;
    }
    int rc = MPI_Allreduce(&mine, &with_data, 1, MPI_INT, MPI_SUM, comm);
    if (rc != MPI_SUCCESS)
        return qcal_error(QCAL_ERR_IO, "MPI allreduce failed (%d)", rc);
    if (with_data > 1)
        return qcal_error(QCAL_ERR_STATE, "%s observers depend on batch order: %d ranks hold "
                          "data, at most one may (give each tensor whole to one rank)",
                          qcal_observer_kind_name(k), with_data);
    obs_ctx x = { obs, NULL };
    return qcal_mpi_tree_reduce(&obs_ops, &x, root, all, comm);
}

qcal_status qcal_mpi_observer_reduce(qcal_observer *obs, int root, MPI_Comm comm)
{
    return obs_reduce(obs, root, false, comm);
}

qcal_status qcal_mpi_observer_allreduce(qcal_observer *obs, MPI_Comm comm)
{
    return obs_reduce(obs, 0, true, comm);
}

/* ---- Data-parallel update ------------------------------------------------------------- */

static bool is_minmax_family(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_MINMAX || k == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
           k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

static bool is_per_channel(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

static bool has_data(const qcal_tensor *x)
{
    int64_t n = 0;
    return x && qcal_tensor_numel(x, &n) == QCAL_OK && n > 0;
}

/* The batch's per-channel min and max over every rank (the min/max kinds): a plain
 * (per-channel) minmax observer of the local slice, MIN/MAX all-reduced; non-finite values
 * summed. *channels is the same on every rank (a rank without data takes the others'). */
typedef struct batch_range {
    int64_t channels;
    float *lo, *hi;
    uint64_t nonfinite;
} batch_range;

static qcal_status local_range(const qcal_observer_config *cfg, const qcal_tensor *x,
                               batch_range *r)
{
    qcal_observer_config c;
    qcal_observer_config_default(&c, is_per_channel(cfg->kind) ? QCAL_OBSERVER_PER_CHANNEL_MINMAX
                                                                : QCAL_OBSERVER_MINMAX);
    c.axis = cfg->axis;
    c.nonfinite = cfg->nonfinite;
    qcal_observer *o = NULL;
    qcal_status st = qcal_observer_create(&c, &o);
    if (st == QCAL_OK && has_data(x))
        st = qcal_observer_update(o, x);
    if (st == QCAL_OK)
        st = qcal_observer_channels(o, &r->channels);
    if (st == QCAL_OK && r->channels > 0) {
        r->lo = mpi_alloc((size_t)r->channels * sizeof(float));
        r->hi = mpi_alloc((size_t)r->channels * sizeof(float));
        int64_t n = 0;
        st = r->lo && r->hi ? qcal_observer_data_range(o, r->channels, r->lo, r->hi, &n)
                            : QCAL_ERR_NO_MEMORY;
        if (st == QCAL_NO_DATA)
            st = QCAL_OK;
    }
    if (st == QCAL_OK)
        st = qcal_observer_nonfinite(o, &r->nonfinite);
    qcal_observer_destroy(&o);
    return st;
}

static qcal_status mpi_err(int rc)
{
    return rc == MPI_SUCCESS ? QCAL_OK : qcal_error(QCAL_ERR_IO, "MPI collective failed (%d)", rc);
}

/* One step with the batch's range: a synthetic tensor whose channel c holds lo[c] and hi[c]
 * (per-tensor: [lo, hi]) and, in channel 0, the batch's non-finite values as NaN, so the
 * observer takes exactly the step the whole batch gives. */
static qcal_status range_step(qcal_observer *obs, const qcal_observer_config *cfg,
                              const batch_range *r)
{
    int64_t extra = (int64_t)r->nonfinite, row = 2 + extra, C = r->channels;
    int64_t numel;
    if (!qcal_mul_i64(C, row, &numel))
        return qcal_error(QCAL_ERR_OVERFLOW, "batch of %lld channels x %lld values", (long long)C,
                          (long long)row);
    float *d = mpi_alloc((size_t)numel * sizeof(float));
    if (!d)
        return QCAL_ERR_NO_MEMORY;
    qcal_tensor t;
    memset(&t, 0, sizeof t);
    t.data = d;
    if (!is_per_channel(cfg->kind)) {
        t.ndim = 1;
        t.shape[0] = row;
        d[0] = r->lo[0];
        d[1] = r->hi[0];
        for (int64_t i = 2; i < row; i++)
            d[i] = NAN;
    } else {
        /* axis a >= 0: shape [1]*a + [C, row]; a < 0: [row, C, 1, ...] with C at ndim + a. */
        int32_t a = cfg->axis;
        int32_t ndim = a >= 0 ? a + 2 : 1 - a;
        if (ndim > QCAL_MAX_DIMS) {
            free(d);
            return qcal_error(QCAL_ERR_UNSUPPORTED, "channel axis %d needs %d dimensions", a, ndim);
        }
        t.ndim = ndim;
        int32_t cax = a >= 0 ? a : ndim + a;
        for (int32_t i = 0; i < ndim; i++)
            t.shape[i] = 1;
        t.shape[cax] = C;
        int32_t rax = a >= 0 ? a + 1 : 0;
        t.shape[rax] = row;
        /* Channel-major when the row axis follows the channel axis, else row-major. */
        for (int64_t c = 0; c < C; c++) {
            for (int64_t k = 0; k < row; k++) {
                float v = k == 0 ? r->lo[c] : k == 1 ? r->hi[c] : c == 0 ? NAN : r->lo[c];
                int64_t idx = rax > cax ? c * row + k : k * C + c;
                d[idx] = v;
            }
        }
    }
    qcal_status st = qcal_observer_update(obs, &t);
    free(d);
    return st;
}

qcal_status qcal_mpi_observer_update(qcal_observer *obs, const qcal_tensor *x, MPI_Comm comm)
{
    qcal_status st = obs ? QCAL_OK : qcal_error(QCAL_ERR_INVALID_ARG, "observer is NULL");
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        return st;
    const qcal_observer_config *cfg = qcal_observer_get_config(obs);
    int any = has_data(x), total = 0;
    if ((st = mpi_err(MPI_Allreduce(&any, &total, 1, MPI_INT, MPI_SUM, comm))) != QCAL_OK)
        return st;
    if (total == 0)
        return qcal_error(QCAL_ERR_EMPTY, "no rank has data for the update");

    if (!is_minmax_family(cfg->kind)) {
        /* Histogram family: the slices' observers merged in rank order, then folded in. */
        qcal_observer *slice = NULL;
        st = qcal_observer_create(cfg, &slice);
        if (st == QCAL_OK && any)
            st = qcal_observer_update(slice, x);
        if ((st = qcal_mpi_agree(st, comm, NULL)) == QCAL_OK)
            st = qcal_mpi_observer_allreduce(slice, comm);
        if (st == QCAL_OK)
            st = qcal_mpi_agree(qcal_observer_merge(obs, slice), comm, NULL);
        qcal_observer_destroy(&slice);
        return st;
    }

    batch_range r = { 0 };
    st = local_range(cfg, x, &r);
    /* Channel counts: every rank with data must agree; ranks without data take theirs. */
    int64_t cmax = st == QCAL_OK ? r.channels : 0, cmin = st == QCAL_OK && any ? r.channels
                                                                                 : INT64_MAX;
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        goto done;
    int64_t gmax = 0, gmin = 0;
    if ((st = mpi_err(MPI_Allreduce(&cmax, &gmax, 1, MPI_INT64_T, MPI_MAX, comm))) != QCAL_OK ||
        (st = mpi_err(MPI_Allreduce(&cmin, &gmin, 1, MPI_INT64_T, MPI_MIN, comm))) != QCAL_OK)
        goto done;
    if (gmin != gmax) {
        st = qcal_error(QCAL_ERR_MISMATCH, "the ranks' slices have %lld and %lld channels",
                        (long long)gmin, (long long)gmax);
        goto done;
    }
    if (!any) {
        r.channels = gmax;
        free(r.lo);
        free(r.hi);
        r.lo = mpi_alloc((size_t)gmax * sizeof(float));
        r.hi = mpi_alloc((size_t)gmax * sizeof(float));
        st = r.lo && r.hi ? QCAL_OK : QCAL_ERR_NO_MEMORY;
        for (int64_t c = 0; st == QCAL_OK && c < gmax; c++)
            r.lo[c] = INFINITY, r.hi[c] = -INFINITY;
    }
    /* Every rank joins this agreement (a collective inside the branch would not match). */
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        goto done;
    if (gmax > INT32_MAX) {
        st = qcal_error(QCAL_ERR_OVERFLOW, "%lld channels", (long long)gmax);
        goto done;
    }
    uint64_t nf = 0;
    if ((st = mpi_err(MPI_Allreduce(MPI_IN_PLACE, r.lo, (int)gmax, MPI_FLOAT, MPI_MIN, comm))) !=
            QCAL_OK ||
        (st = mpi_err(MPI_Allreduce(MPI_IN_PLACE, r.hi, (int)gmax, MPI_FLOAT, MPI_MAX, comm))) !=
            QCAL_OK ||
        (st = mpi_err(MPI_Allreduce(&r.nonfinite, &nf, 1, MPI_UINT64_T, MPI_SUM, comm))) != QCAL_OK)
        goto done;
    r.nonfinite = nf;
    /* Every channel saw no finite value: the whole batch was non-finite. */
    bool finite = false;
    for (int64_t c = 0; c < gmax; c++)
        finite |= r.lo[c] <= r.hi[c];
    if (!finite) {
        st = qcal_error(QCAL_ERR_EMPTY, "the batch holds no finite value on any rank");
        goto done;
    }
    st = qcal_mpi_agree(range_step(obs, cfg, &r), comm, NULL);
done:
    free(r.lo);
    free(r.hi);
    return st;
}
