/* The library-wide thread count (include/qcal/threads.h); kernels read it through
 * qcal_threads_for (core/cpu.c). */
#include <stdatomic.h>

#include "core/internal.h"
#include "qcal/threads.h"
#include "qcal_config.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static atomic_int num_threads;   /* 0: OpenMP's default */

qcal_status qcal_threads_set_count(int n)
{
    if (n < 0 || n > QCAL_MAX_THREADS)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "thread count %d is outside [0, %d] (0 = OpenMP's default)", n,
                          QCAL_MAX_THREADS);
    atomic_store_explicit(&num_threads, n, memory_order_relaxed);
    return QCAL_OK;
}

int qcal_threads_count(void)
{
#if QCAL_HAVE_OPENMP
    int n = atomic_load_explicit(&num_threads, memory_order_relaxed);
    if (n > 0)
        return n;
    n = omp_get_max_threads();
    return n < 1 ? 1 : n;
#else
    return 1;
#endif
}
