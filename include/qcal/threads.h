/* qcal threads: how many OpenMP threads the library's parallel kernels may use. The setting
 * is process-wide; results are bit-identical for any count (docs/architecture.md, "Threads").
 * A kernel forks only for large tensors (about 256K elements and up) and then uses at most
 * this many threads; called from inside an OpenMP parallel region it runs on the calling
 * thread. Without OpenMP the library always runs on the calling thread. */
#ifndef QCAL_THREADS_H
#define QCAL_THREADS_H

#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QCAL_MAX_THREADS 1024

/* Caps the library's kernels at n threads (1..QCAL_MAX_THREADS); 0 restores the default,
 * OpenMP's (omp_get_max_threads() of the calling thread: OMP_NUM_THREADS or the core count).
 * Thread-safe; applies to calls that start after it returns. Other n: QCAL_ERR_INVALID_ARG. */
QCAL_API qcal_status qcal_threads_set_count(int n);

/* The thread count the library's kernels use now: the value set, else OpenMP's default
 * (1 when built without OpenMP). */
QCAL_API int qcal_threads_count(void);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_THREADS_DECLARED
#include "qcal/deprecated.h"
#endif
