/* tools/cli_dist.h on Open MPI (libqcal_mpi for the session reduction). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include <qcal/mpi.h>

#include "cli_common.h"
#include "cli_dist.h"

enum { TAG_FAULT = 0x5146 };

typedef struct dist_impl {
    char msg[1024];          /* first error line of this rank since the last agreement */
    bool have_msg;
    MPI_Request *req;        /* cli_dist_notify's sends */
    int nreq;
    char token;              /* cli_dist_notify's payload (one byte) */
} dist_impl;

static dist_impl impl;

static void keep_error(void *user, const char *cmd, const char *msg)
{
    (void)cmd;
    dist_impl *x = user;
    if (x->have_msg)
        return;
    snprintf(x->msg, sizeof x->msg, "%s", msg);
    x->have_msg = true;
}

/* Launched by an MPI launcher: Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx and PMI
 * launchers (srun, hydra) set their rank variables. */
static bool launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

bool cli_dist_terminal(const cli_dist *d)
{
    if (isatty(2))
        return true;
    if (!d->impl)
        return false;
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/fd/2", (long)getppid());
    int fd = open(path, O_WRONLY | O_NOCTTY);
    if (fd < 0)
        return false;
    bool tty = isatty(fd);
    close(fd);
    return tty;
}

int cli_dist_begin(cli_dist *d, const char *cmd)
{
    *d = (cli_dist){ .cmd = cmd, .rank = 0, .size = 1 };
    if (!launched_by_mpirun())
        return 0;
    int provided = 0, inited = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "MPI_Init failed");
    d->mpi = !inited;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    memset(&impl, 0, sizeof impl);
    d->impl = &impl;
    /* Every rank keeps its error lines for cli_dist_agree (one process: printed as usual). */
    if (d->size > 1)
        cli_set_error_sink(keep_error, &impl);
    return 0;
}

void cli_dist_end(cli_dist *d)
{
    if (!d->impl)
        return;
    cli_set_error_sink(NULL, NULL);
    if (impl.nreq)
        MPI_Waitall(impl.nreq, impl.req, MPI_STATUSES_IGNORE);
    free(impl.req);
    impl.req = NULL;
    impl.nreq = 0;
    if (d->mpi)
        MPI_Finalize();
    d->impl = NULL;
    d->mpi = false;
}

void cli_dist_notify(cli_dist *d)
{
    if (!d->impl || d->size <= 1 || d->notified)
        return;
    impl.req = calloc((size_t)d->size, sizeof *impl.req);
    if (!impl.req)
        return;   /* the others learn at the next agreement, a little later */
    for (int r = 0; r < d->size; r++)
        if (r != d->rank)
            MPI_Isend(&impl.token, 1, MPI_CHAR, r, TAG_FAULT, MPI_COMM_WORLD,
                      &impl.req[impl.nreq++]);
    d->notified = true;
}

bool cli_dist_peer_failed(cli_dist *d)
{
    if (!d->impl || d->size <= 1)
        return false;
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_FAULT, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
}

typedef struct verdict {
    int32_t rc;
    char msg[1024];
} verdict;

int cli_dist_agree(cli_dist *d, int rc)
{
    if (!d->impl || d->size <= 1)
        return rc;
    /* Drain the notifications: who sent one is known from the gathered flags. */
    int *notified = malloc((size_t)d->size * sizeof *notified);
    int mine = d->notified && impl.req ? 1 : 0;
    if (notified &&
        MPI_Allgather(&mine, 1, MPI_INT, notified, 1, MPI_INT, MPI_COMM_WORLD) == MPI_SUCCESS) {
        for (int r = 0; r < d->size; r++) {
            if (r != d->rank && notified[r]) {
                char tok;
                MPI_Recv(&tok, 1, MPI_CHAR, r, TAG_FAULT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
        }
    }
    free(notified);
    if (impl.nreq)
        MPI_Waitall(impl.nreq, impl.req, MPI_STATUSES_IGNORE);
    free(impl.req);
    impl.req = NULL;
    impl.nreq = 0;
    d->notified = false;

    int me = rc ? d->rank : INT_MAX, first = INT_MAX;
    MPI_Allreduce(&me, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    verdict v;
    memset(&v, 0, sizeof v);
    if (first != INT_MAX) {
        if (d->rank == first) {
            v.rc = rc;
            snprintf(v.msg, sizeof v.msg, "%s", impl.have_msg ? impl.msg : "failed");
        }
        MPI_Bcast(&v, (int)sizeof v, MPI_BYTE, first, MPI_COMM_WORLD);
        v.msg[sizeof v.msg - 1] = '\0';
        if (d->rank == 0) {
            fprintf(stderr, "qcal: %s: rank %d: %s\n", d->cmd, first, v.msg);
            fflush(stderr);
        }
    }
    impl.have_msg = false;
    return first == INT_MAX ? 0 : v.rc;
}

int cli_dist_reduce_session(cli_dist *d, qcal_calib_session *s)
{
    if (!d->impl || d->size <= 1)
        return 0;
    qcal_status st = qcal_mpi_session_reduce(s, 0, MPI_COMM_WORLD);
    if (st == QCAL_OK)
        return 0;
    /* Every rank has the same status and message; the writer prints it once. */
    if (d->rank == 0)
        fprintf(stderr, "qcal: %s: %s\n", d->cmd, qcal_last_error());
    return cli_exit_code(st, CLI_AT_READ);
}
