/* Data-parallel QAT over MPI; see qat_dp_mpi.h.
 *
 * Gradients: every rank scales its slice's mean gradients by n/total, rank 0 gathers them
 * and adds them in rank order, and broadcasts the sum, so every rank applies the same bytes
 * (MPI_Allreduce does not promise the same float sum on every rank). Activation ranges:
 * qcal_mpi_observer_update on a fresh min/max observer, i.e. the whole batch's min and max.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <qcal/mpi.h>

#include "qat_dp_mpi.h"

static float *gather_buf, *pack_buf;
static int64_t pack_len;

bool qat_dp_launched(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

static qcal_status dp_grads(void *user, float *const *grad, float *loss, int n, int total)
{
    cnn_dp *dp = user;
    int64_t len = 1;
    for (int i = 0; i < CNN_NPARAMS; i++)
        len += cnn_param_numel(i);
    if (len > INT32_MAX / (dp->size > 0 ? dp->size : 1))
        return qcal_set_error(QCAL_ERR_OVERFLOW, "data-parallel QAT: %lld gradient values x %d "
                              "ranks do not fit an MPI count", (long long)len, dp->size);
    if (!pack_buf) {
        pack_len = len;
        pack_buf = malloc((size_t)len * sizeof(float));
        if (dp->rank == 0)
            gather_buf = malloc((size_t)len * (size_t)dp->size * sizeof(float));
        if (!pack_buf || (dp->rank == 0 && !gather_buf))
            return qcal_set_error(QCAL_ERR_NO_MEMORY,
                                  "data-parallel QAT: no memory for the gradient buffers");
    }
    float f = (float)n / (float)total;
    int64_t k = 0;
    for (int i = 0; i < CNN_NPARAMS; i++) {
        int64_t m = cnn_param_numel(i);
        for (int64_t j = 0; j < m; j++)
            pack_buf[k++] = n == total ? grad[i][j] : grad[i][j] * f;
    }
    pack_buf[k++] = n == total ? *loss : *loss * f;
    if (MPI_Gather(pack_buf, (int)len, MPI_FLOAT, gather_buf, (int)len, MPI_FLOAT, 0,
                   MPI_COMM_WORLD) != MPI_SUCCESS)
        return qcal_set_error(QCAL_ERR_IO, "data-parallel QAT: MPI_Gather of the gradients failed");
    if (dp->rank == 0) {
        memcpy(pack_buf, gather_buf, (size_t)len * sizeof(float));
        for (int r = 1; r < dp->size; r++) {
            const float *src = gather_buf + (size_t)r * (size_t)len;
            for (int64_t j = 0; j < len; j++)
                pack_buf[j] += src[j];
        }
    }
    if (MPI_Bcast(pack_buf, (int)len, MPI_FLOAT, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return qcal_set_error(QCAL_ERR_IO, "data-parallel QAT: MPI_Bcast of the gradients failed");
    k = 0;
    for (int i = 0; i < CNN_NPARAMS; i++) {
        int64_t m = cnn_param_numel(i);
        memcpy(grad[i], pack_buf + k, (size_t)m * sizeof(float));
        k += m;
    }
    *loss = pack_buf[k];
    return QCAL_OK;
}

static qcal_status dp_range(void *user, const qcal_tensor *slice, float *lo, float *hi)
{
    (void)user;
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    qcal_observer *o = NULL;
    qcal_status st = qcal_observer_create(&cfg, &o);
    if (st == QCAL_OK)
        st = qcal_mpi_observer_update(o, slice, MPI_COMM_WORLD);
    int64_t n = 0;
    if (st == QCAL_OK)
        st = qcal_observer_data_range(o, 1, lo, hi, &n);
    qcal_observer_destroy(&o);
    return st;
}

qcal_status qat_dp_init(int *argc, char ***argv, cnn_dp *dp)
{
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return qcal_set_error(QCAL_ERR_IO, "data-parallel QAT: MPI_Init failed");
    memset(dp, 0, sizeof *dp);
    MPI_Comm_rank(MPI_COMM_WORLD, &dp->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &dp->size);
    dp->grads = dp_grads;
    dp->range = dp_range;
    dp->user = dp;
    return QCAL_OK;
}

bool qat_dp_same(uint64_t x)
{
    unsigned long long v = x, lo = 0, hi = 0;
    MPI_Allreduce(&v, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

void qat_dp_finalize(void)
{
    free(pack_buf);
    free(gather_buf);
    pack_buf = gather_buf = NULL;
    MPI_Finalize();
}
