/* Calibration sessions over MPI: reduce and all-reduce (qcal/mpi.h), on the session states
 * of qcal/calib.h. A node of the tree folds its children's states, in rank order, into a
 * copy of its own session (made when the first child arrives; a leaf just sends its own
 * state), so the local session changes only at the commit. The root of a reduce folds its
 * children into an aggregate that starts empty instead, and commits with one
 * qcal_calib_session_merge (checked before it changes anything); an all-reduce replaces the
 * session pointer on every rank. */
#include <stdlib.h>

#include "core/internal.h"
#include "mpi/tree.h"
#include "qcal/mpi.h"

typedef struct sess_ctx {
    qcal_calib_session *local;
    bool root_of_reduce;                    /* children go into agg, committed by a merge */
    qcal_calib_session **replace;           /* all-reduce: where the result goes */
    const qcal_calib_session_options *opt;  /* all-reduce: options of the result */
    qcal_calib_session *partial;            /* copy of local + children (agg on the root) */
    qcal_calib_session *result;             /* all-reduce: the loaded result */
} sess_ctx;

static qcal_status sess_copy(const qcal_calib_session *s, qcal_calib_session **out)
{
    void *buf = NULL;
    size_t n = 0;
    qcal_status st = qcal_calib_session_save(s, &buf, &n);
    if (st == QCAL_OK)
        st = qcal_calib_session_load(buf, n, NULL, out);
    qcal_free(buf);
    return st;
}

static qcal_status sess_begin(void *c)
{
    sess_ctx *x = c;
    return qcal_calib_session_flush(x->local);
}

static qcal_status sess_merge(void *c, const void *buf, size_t len)
{
    sess_ctx *x = c;
    qcal_status st = QCAL_OK;
    if (!x->partial)
        st = x->root_of_reduce ? qcal_calib_session_create(NULL, &x->partial)
                               : sess_copy(x->local, &x->partial);
    return st == QCAL_OK ? qcal_calib_session_merge_state(x->partial, buf, len) : st;
}

static qcal_status sess_save(void *c, void **buf, size_t *len)
{
    sess_ctx *x = c;
    return qcal_calib_session_save(x->partial ? x->partial : x->local, buf, len);
}

static qcal_status sess_load(void *c, const void *buf, size_t len)
{
    sess_ctx *x = c;
    qcal_calib_session_destroy(&x->result);
    return qcal_calib_session_load(buf, len, x->opt, &x->result);
}

static qcal_status sess_commit(void *c)
{
    sess_ctx *x = c;
    if (x->replace) {
        qcal_calib_session_destroy(x->replace);
        *x->replace = x->result;
        x->result = NULL;
        return QCAL_OK;
    }
    return x->partial ? qcal_calib_session_merge(x->local, x->partial) : QCAL_OK;
}

static void sess_end(void *c)
{
    sess_ctx *x = c;
    qcal_calib_session_destroy(&x->partial);
    qcal_calib_session_destroy(&x->result);
}

static const qcal_mpi_tree_ops sess_ops = {
    sess_begin, sess_merge, sess_save, sess_load, sess_commit, sess_end,
};

qcal_status qcal_mpi_session_reduce(qcal_calib_session *s, int root, MPI_Comm comm)
{
    qcal_status st = s ? QCAL_OK : qcal_error(QCAL_ERR_INVALID_ARG, "session is NULL");
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        return st;
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    sess_ctx x = { .local = s, .root_of_reduce = rank == root };
    return qcal_mpi_tree_reduce(&sess_ops, &x, root, false, comm);
}

qcal_status qcal_mpi_session_allreduce(qcal_calib_session **s,
                                       const qcal_calib_session_options *opt, MPI_Comm comm)
{
    qcal_status st = s && *s ? QCAL_OK : qcal_error(QCAL_ERR_INVALID_ARG, "session is NULL");
    if ((st = qcal_mpi_agree(st, comm, NULL)) != QCAL_OK)
        return st;
    sess_ctx x = { .local = *s, .replace = s, .opt = opt };
    return qcal_mpi_tree_reduce(&sess_ops, &x, 0, true, comm);
}
