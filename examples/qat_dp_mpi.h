/* Data-parallel QAT over MPI (libqcal_mpi): a cnn_dp (examples/cnn/qat.h) on
 * MPI_COMM_WORLD, used by qat_fmnist when it runs under mpirun (docs/distributed.md). */
#ifndef QCAL_EXAMPLES_QAT_DP_MPI_H
#define QCAL_EXAMPLES_QAT_DP_MPI_H

#include <stdint.h>

#include "qat.h"

/* True when launched by mpirun (Open MPI, PMIx or PMI variables): then call qat_dp_init. */
bool qat_dp_launched(void);

/* MPI_Init and *dp filled for MPI_COMM_WORLD (rank, size, the two exchanges). */
qcal_status qat_dp_init(int *argc, char ***argv, cnn_dp *dp);

/* True when x holds the same value on every rank (collective). */
bool qat_dp_same(uint64_t x);

/* MPI_Finalize. */
void qat_dp_finalize(void);

#endif
