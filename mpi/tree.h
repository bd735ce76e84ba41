/* libqcal_mpi internals: the rank-ordered binomial tree that every reduction of
 * qcal/mpi.h runs, and the status agreement. Not installed. */
#ifndef QCAL_MPI_TREE_H
#define QCAL_MPI_TREE_H

#include <mpi.h>

#include "qcal/common.h"

/* What a tree reduction does with one kind of object (observer, session). ctx is the
 * caller's; "partial" is the reduction's own copy, the local object is only read until a
 * commit. */
typedef struct qcal_mpi_tree_ops {
    qcal_status (*begin)(void *ctx);                                /* partial = copy of local */
    qcal_status (*merge)(void *ctx, const void *buf, size_t len);   /* partial += a child's blob */
    qcal_status (*save)(void *ctx, void **buf, size_t *len);        /* blob of partial (qcal_free) */
    qcal_status (*load)(void *ctx, const void *buf, size_t len);    /* partial = blob (allreduce) */
    qcal_status (*commit)(void *ctx);                               /* local = partial */
    void (*end)(void *ctx);                                         /* frees partial */
} qcal_mpi_tree_ops;

/* malloc that records QCAL_ERR_NO_MEMORY with the size (libqcal's own allocator is not
 * exported). */
void *mpi_alloc(size_t bytes);

/* Reduces every rank's object onto root (all: then onto every rank) through the binomial
 * tree documented in qcal/mpi.h. Collective; same status on every rank. */
qcal_status qcal_mpi_tree_reduce(const qcal_mpi_tree_ops *ops, void *ctx, int root, bool all,
                                 MPI_Comm comm);

#endif
