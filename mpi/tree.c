/* The rank-ordered binomial tree behind every libqcal_mpi reduction, and the status
 * agreement (contract in qcal/mpi.h).
 *
 * Messages: a fixed 512-byte header (status, failing rank, payload length, message), then,
 * if the status is QCAL_OK, the payload in chunks of at most 1 GiB (MPI counts are int).
 * A rank that failed still takes part in every exchange of the tree: it receives its
 * children's headers and payloads (and drops them) and sends its failure up, so no peer
 * ever blocks on it. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "mpi/tree.h"
#include "qcal/mpi.h"

enum { TAG_HDR = 0x5143, TAG_DATA = 0x5144 };
#define CHUNK ((size_t)1 << 30)

typedef struct hdr {
    int32_t status;       /* QCAL_OK or the first failure seen */
    int32_t rank;         /* rank (in comm) that failed, -1 if none */
    uint64_t len;         /* payload bytes that follow (status QCAL_OK only) */
    char msg[496];        /* the failing rank's message */
} hdr;

void *mpi_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
    return p;
}

static void hdr_fail(hdr *h, qcal_status st, int rank)
{
    if (h->status != QCAL_OK)
        return;
    h->status = st;
    h->rank = rank;
    h->len = 0;
    snprintf(h->msg, sizeof h->msg, "%s", *qcal_last_error() ? qcal_last_error()
                                                             : qcal_status_str(st));
}

/* Local failure of an MPI call: reported like any other failure. */
static qcal_status mpi_fail(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "error %d", rc);
    return qcal_error(QCAL_ERR_IO, "MPI %s failed: %s", what, s);
}

static qcal_status send_msg(const hdr *h, const void *buf, int dest, MPI_Comm comm)
{
    int rc = MPI_Send(h, (int)sizeof *h, MPI_BYTE, dest, TAG_HDR, comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "send");
    if (h->status != QCAL_OK)
        return QCAL_OK;
    for (uint64_t off = 0; off < h->len; off += CHUNK) {
        size_t n = h->len - off < CHUNK ? (size_t)(h->len - off) : CHUNK;
        if ((rc = MPI_Send((const char *)buf + off, (int)n, MPI_BYTE, dest, TAG_DATA, comm)) !=
            MPI_SUCCESS)
            return mpi_fail(rc, "send");
    }
    return QCAL_OK;
}

/* Receives a header and its payload into *buf (qcal_malloc'ed; NULL when there is none).
 * When the buffer cannot be allocated the payload is still received (into a bounded
 * scratch buffer) so the sender is released, and QCAL_ERR_NO_MEMORY is returned. */
static qcal_status recv_msg(hdr *h, void **buf, int src, MPI_Comm comm)
{
    *buf = NULL;
    int rc = MPI_Recv(h, (int)sizeof *h, MPI_BYTE, src, TAG_HDR, comm, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "receive");
    h->msg[sizeof h->msg - 1] = '\0';
    if (h->status != QCAL_OK || h->len == 0)
        return QCAL_OK;
    qcal_status st = QCAL_OK;
    char *b = h->len <= SIZE_MAX ? mpi_alloc((size_t)h->len) : NULL;
    char scratch[1 << 16];
    for (uint64_t off = 0; off < h->len; off += CHUNK) {
        size_t n = h->len - off < CHUNK ? (size_t)(h->len - off) : CHUNK;
        if (b) {
            rc = MPI_Recv(b + off, (int)n, MPI_BYTE, src, TAG_DATA, comm, MPI_STATUS_IGNORE);
        } else {
            /* Drain in scratch-sized pieces: the sender sent n bytes in one message, so
             * receive it with a probe-sized buffer instead. */
            MPI_Status ms;
            int cnt = 0;
            rc = MPI_Probe(src, TAG_DATA, comm, &ms);
            if (rc == MPI_SUCCESS)
                MPI_Get_count(&ms, MPI_BYTE, &cnt);
            void *tmp = rc == MPI_SUCCESS ? malloc((size_t)cnt ? (size_t)cnt : 1) : NULL;
            if (rc == MPI_SUCCESS)
                rc = MPI_Recv(tmp ? tmp : scratch, tmp ? cnt : 0, MPI_BYTE, src, TAG_DATA, comm,
                              MPI_STATUS_IGNORE);
            free(tmp);
        }
        if (rc != MPI_SUCCESS && st == QCAL_OK)
            st = mpi_fail(rc, "receive");
    }
    if (!b && st == QCAL_OK)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %llu bytes for a peer's state",
                        (unsigned long long)h->len);
    if (st != QCAL_OK) {
        free(b);
        return st;
    }
    *buf = b;
    return QCAL_OK;
}

static qcal_status bcast_msg(hdr *h, void **buf, int root, int rank, MPI_Comm comm)
{
    int rc = MPI_Bcast(h, (int)sizeof *h, MPI_BYTE, root, comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "broadcast");
    h->msg[sizeof h->msg - 1] = '\0';
    if (h->status != QCAL_OK || h->len == 0)
        return QCAL_OK;
    char *b = rank == root ? *buf : NULL;
    qcal_status st = QCAL_OK;
    if (rank != root) {
        *buf = NULL;
        b = h->len <= SIZE_MAX ? mpi_alloc((size_t)h->len) : NULL;
        if (!b)
            st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %llu bytes for the merged state",
                            (unsigned long long)h->len);
    }
    /* A rank without a buffer still joins every broadcast (into a chunk-sized scratch). */
    char *scratch = NULL;
    for (uint64_t off = 0; off < h->len; off += CHUNK) {
        size_t n = h->len - off < CHUNK ? (size_t)(h->len - off) : CHUNK;
        char *dst = b ? b + off : NULL;
        if (!dst) {
            if (!scratch)
                scratch = malloc(n);
            dst = scratch;
        }
        rc = MPI_Bcast(dst, (int)n, MPI_BYTE, root, comm);
        if (rc != MPI_SUCCESS && st == QCAL_OK)
            st = mpi_fail(rc, "broadcast");
    }
    free(scratch);
    if (rank != root) {
        if (st != QCAL_OK)
            free(b);
        else
            *buf = b;
    }
    return st;
}

qcal_status qcal_mpi_agree(qcal_status local, MPI_Comm comm, int *failed_rank)
{
    int rank = 0, size = 1, rc;
    if (failed_rank)
        *failed_rank = -1;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return mpi_fail(rc, "communicator query");
    int mine = local < 0 ? rank : INT_MAX, first = INT_MAX;
    if ((rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm)) != MPI_SUCCESS)
        return mpi_fail(rc, "allreduce");
    if (first == INT_MAX)
        return QCAL_OK;
    hdr h;
    memset(&h, 0, sizeof h);
    h.rank = -1;
    if (rank == first)
        hdr_fail(&h, local, rank);
    void *none = NULL;
    qcal_status st = bcast_msg(&h, &none, first, rank, comm);
    if (st != QCAL_OK)
        return st;
    if (failed_rank)
        *failed_rank = first;
    return qcal_error((qcal_status)h.status, "rank %d: %s", first, h.msg);
}

qcal_status qcal_mpi_tree_reduce(const qcal_mpi_tree_ops *ops, void *ctx, int root, bool all,
                                 MPI_Comm comm)
{
    int rank = 0, size = 1, rc;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return mpi_fail(rc, "communicator query");
    /* Every rank checks root the same way, so a bad root fails everywhere at once. */
    if (root < 0 || root >= size)
        return qcal_error(QCAL_ERR_INVALID_ARG, "root %d is not a rank of a communicator of %d",
                          root, size);
    hdr h;
    memset(&h, 0, sizeof h);
    h.rank = -1;
    qcal_status st = ops->begin(ctx);
    if (st != QCAL_OK)
        hdr_fail(&h, st, rank);
    int v = (rank - root + size) % size;
    for (int mask = 1; mask < size; mask <<= 1) {
        if (v & mask) {
            /* Send the partial result of ranks [v, v + mask) to the parent, then stop. */
            void *buf = NULL;
            size_t len = 0;
            if (h.status == QCAL_OK && (st = ops->save(ctx, &buf, &len)) != QCAL_OK)
                hdr_fail(&h, st, rank);
            if (h.status == QCAL_OK)
                h.len = len;
            int parent = (v - mask + root) % size;
            st = send_msg(&h, buf, parent, comm);
            qcal_free(buf);
            if (st != QCAL_OK)
                hdr_fail(&h, st, rank);
            break;
        }
        if (v + mask < size) {
            int child = (v + mask + root) % size;
            hdr ch;
            void *buf = NULL;
            st = recv_msg(&ch, &buf, child, comm);
            if (st != QCAL_OK)
                hdr_fail(&h, st, rank);
            else if (ch.status != QCAL_OK && h.status == QCAL_OK)
                h = ch, h.len = 0;
            else if (h.status == QCAL_OK && ch.len > 0 &&
                     (st = ops->merge(ctx, buf, (size_t)ch.len)) != QCAL_OK)
                hdr_fail(&h, st, rank);
            qcal_free(buf);
        }
    }
    /* The root knows the outcome; it commits (reduce) or sends the result to every rank. */
    void *buf = NULL;
    size_t len = 0;
    if (rank == root && h.status == QCAL_OK) {
        if (all) {
            if ((st = ops->save(ctx, &buf, &len)) != QCAL_OK)
                hdr_fail(&h, st, rank);
            else
                h.len = len;
        } else if ((st = ops->commit(ctx)) != QCAL_OK) {
            hdr_fail(&h, st, rank);
        }
    }
    if (rank == root && h.status != QCAL_OK)
        h.len = 0;
    st = bcast_msg(&h, &buf, root, rank, comm);
    qcal_status local = QCAL_OK;
    if (st != QCAL_OK)
        local = st;
    else if (h.status == QCAL_OK && all)
        local = ops->load(ctx, buf, (size_t)h.len);
    qcal_free(buf);
    if (h.status != QCAL_OK) {
        ops->end(ctx);
        return qcal_error((qcal_status)h.status, "rank %d: %s", h.rank, h.msg);
    }
    if (!all) {
        ops->end(ctx);
        return QCAL_OK;
    }
    /* Every rank holds the result as partial: agree that all could, then commit. */
    st = qcal_mpi_agree(local, comm, NULL);
    if (st == QCAL_OK)
        st = qcal_mpi_agree(ops->commit(ctx), comm, NULL);
    ops->end(ctx);
    return st;
}
