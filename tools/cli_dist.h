/* Distributed runs of a subcommand (`mpirun -np N qcal calibrate ...`, docs/distributed.md).
 *
 * The same binary runs alone and under mpirun: cli_dist_begin initialises MPI only when the
 * process was launched by an MPI launcher (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx or PMI
 * variables); otherwise, and in a build without MPI (tools/cli_dist_none.c), the run is rank
 * 0 of 1 and every function below is trivial, so a plain run never touches MPI.
 *
 * Errors. While a distributed run is active, cli_fail's lines are kept instead of printed;
 * cli_dist_agree is the collective where every rank brings its exit code: the lowest failing
 * rank's code becomes every rank's, and the writer (rank 0) prints its one line
 * "qcal: CMD: rank R: MESSAGE". Every rank calls cli_dist_agree at the same points, so no
 * rank waits on one that gave up. While ranks work independently, a rank that fails calls
 * cli_dist_notify and the others see it through cli_dist_peer_failed (a non-blocking probe)
 * and go straight to the next cli_dist_agree. */
#ifndef QCAL_TOOLS_CLI_DIST_H
#define QCAL_TOOLS_CLI_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include <qcal/calib.h>

typedef struct cli_dist {
    const char *cmd;
    int rank, size;       /* 0 and 1 unless launched by mpirun */
    bool mpi;             /* MPI initialised by cli_dist_begin (finalised by cli_dist_end) */
    bool notified;        /* this rank told the others it failed (since the last agree) */
    void *impl;           /* the MPI side's state */
} cli_dist;

/* Starts a run (MPI_Init when launched by mpirun). Returns 0 or an exit code (reported). */
int cli_dist_begin(cli_dist *d, const char *cmd);

/* Ends a run: MPI_Finalize if begin initialised MPI. */
void cli_dist_end(cli_dist *d);

/* True on the rank that prints and writes outputs (rank 0). */
bool cli_dist_writer(const cli_dist *d);

/* True when this process's stderr reaches a terminal, where a progress bar may be drawn.
 * Under mpirun a rank's stderr is a pipe to its launcher: then the launcher's stderr is
 * asked (Linux: /proc/PPID/fd/2), which is mpirun's on the node mpirun runs on. */
bool cli_dist_terminal(const cli_dist *d);

/* Collective: agrees on the exit code (see above); returns it (0: every rank succeeded). */
int cli_dist_agree(cli_dist *d, int rc);

/* Tells the other ranks, without waiting, that this rank failed. */
void cli_dist_notify(cli_dist *d);

/* True when another rank has called cli_dist_notify since the last agreement. */
bool cli_dist_peer_failed(cli_dist *d);

/* Collective: merges every rank's session onto the writer's, in rank order (qcal/mpi.h);
 * other ranks' sessions are unchanged. Returns 0 or an exit code (agreed, reported). */
int cli_dist_reduce_session(cli_dist *d, qcal_calib_session *s);

/* Greedy balance (largest first onto the least loaded rank, ties to the lower rank) of n
 * work units of the given weights: owner[i] gets the rank of unit i. Deterministic: a
 * function of the weights and the number of ranks only. */
void cli_dist_assign(const cli_dist *d, const uint64_t *weight, int64_t n, int *owner);

#endif
