/* qcal over MPI (libqcal_mpi; pkg-config qcal-mpi): observers and calibration sessions
 * held by the ranks of a communicator, merged exactly and in a fixed order.
 *
 *   MPI_Init(&argc, &argv);
 *   ... each rank feeds its share of the batches into its own session s ...
 *   qcal_mpi_session_reduce(s, 0, MPI_COMM_WORLD);   // rank 0 holds the merged session
 *   if (rank == 0) { qcal_calib_session_table(s, &t); qcal_calib_table_write(t, ...); }
 *
 * Every function is collective: all ranks of comm call it (with the same root) and all
 * return the same status. Reductions follow a binomial tree over the ranks numbered from
 * the root (v = (rank - root) mod size): in round k = 0, 1, ..., a rank whose bit k is set
 * sends its partial result to v - 2^k, which merges it after its own (lower ranks first).
 * The tree depends only on the size of comm, never on message arrival, so the result is
 * the same bytes on every run; depth ceil(log2 size) rounds. For order-independent kinds
 * (every kind but the moving averages) the merged state equals one observer or session
 * that saw every rank's batches, bit for bit. Moving-average kinds merge only when at most
 * one rank has data for them (own each such tensor whole on one rank); otherwise
 * QCAL_ERR_STATE on every rank.
 *
 * Faults: a rank that fails (out of memory, a config that differs between ranks, a merge
 * refused) does not abort the others: its status travels through the tree and then to
 * every rank, which returns it with "rank R: message" in qcal_last_error(); the lowest
 * failing rank wins. Objects are unchanged on failure. A process that dies is mpirun's
 * business (it ends the job). Call from one thread at a time (MPI_THREAD_FUNNELED is
 * enough); comm may be any intra-communicator. */
#ifndef QCAL_MPI_H
#define QCAL_MPI_H

#include <mpi.h>

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Agrees on a status: every rank passes its local status (message in qcal_last_error()
 * when negative) and gets the lowest failing rank's, its message prefixed "rank R: " on
 * every rank; QCAL_OK when no rank failed. *failed_rank (may be NULL) gets R or -1. */
QCAL_API qcal_status qcal_mpi_agree(qcal_status local, MPI_Comm comm, int *failed_rank);

/* Root's obs becomes the merge of every rank's obs (rank order); other ranks' obs are
 * unchanged. Kinds and configs must match on every rank (QCAL_ERR_MISMATCH). */
QCAL_API qcal_status qcal_mpi_observer_reduce(qcal_observer *obs, int root, MPI_Comm comm);

/* Every rank's obs becomes the merge of every rank's obs: the same state (save bytes) on
 * every rank. */
QCAL_API qcal_status qcal_mpi_observer_allreduce(qcal_observer *obs, MPI_Comm comm);

/* Data-parallel update (training): the ranks' x together form one batch (x NULL or empty
 * on a rank: it adds nothing). Each rank's obs must hold the same state before the call;
 * after it, every rank's obs holds the state one observer gets from a single update with
 * the whole batch, and so the same qparams: the min/max kinds (moving averages included)
 * all-reduce the batch's per-channel min and max and take one step, bit for bit (batch
 * count +1, non-finite values counted over all ranks); the histogram family merges the
 * slices' histograms (exact once merges are; batch count + ranks with data). No data on any
 * rank: QCAL_ERR_EMPTY, nothing changes. */
QCAL_API qcal_status qcal_mpi_observer_update(qcal_observer *obs, const qcal_tensor *x,
                                              MPI_Comm comm);

/* Root's session becomes the merge of every rank's session (qcal_calib_session_merge in
 * rank order: entries held by one rank are copied, entries held by several are merged);
 * other ranks' sessions are unchanged. Each session is flushed first. For every
 * order-independent kind the root then holds, bit for bit, the session one process gets
 * from all the ranks' batches; a moving-average entry held with data by two ranks is
 * refused (QCAL_ERR_UNSUPPORTED, nothing changes). */
QCAL_API qcal_status qcal_mpi_session_reduce(qcal_calib_session *s, int root, MPI_Comm comm);

/* As qcal_mpi_session_reduce onto every rank: *s is replaced by a new session holding the
 * merge (the same bytes on every rank), created with opt (NULL = defaults: rules for
 * entries created later, as qcal_calib_session_load); the old one is destroyed. On failure
 * *s is unchanged. */
QCAL_API qcal_status qcal_mpi_session_allreduce(qcal_calib_session **s,
                                                const qcal_calib_session_options *opt,
                                                MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif
