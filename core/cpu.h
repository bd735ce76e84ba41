/* Run-time CPU feature detection for kernel dispatch, and the threading threshold.
 * Kernel families keep a portable C reference next to AVX2 / AVX-512 versions in their own
 * files and pick one through a function table (core/dsp.h) filled for qcal_cpu_isa(). The
 * environment variable QCAL_ISA=c|avx2|avx512 caps the choice (used by tests to run the
 * C references on any machine). */
#ifndef QCAL_CORE_CPU_H
#define QCAL_CORE_CPU_H

#include <stdbool.h>
#include <stdint.h>

typedef enum qcal_isa {
    QCAL_ISA_C = 0,
    QCAL_ISA_AVX2 = 1,      /* AVX2 + FMA */
    QCAL_ISA_AVX512 = 2,    /* AVX-512 F + BW + DQ + VL */
} qcal_isa;
#define QCAL_ISA_COUNT 3

/* Best ISA this CPU supports, capped by QCAL_ISA; computed once, thread-safe. */
qcal_isa qcal_cpu_isa(void);

/* Re-reads QCAL_ISA (tests switch ISAs inside one process). */
void qcal_cpu_reset(void);

/* Below this many elements a kernel runs on the calling thread only: an OpenMP fork costs
 * a few microseconds, the same as reading ~256 KiB. */
#define QCAL_OMP_MIN_ELEMENTS (1 << 18)

/* Number of threads a kernel should use for n elements: 1 below the threshold, else
 * qcal_threads_count() capped by n / (QCAL_OMP_MIN_ELEMENTS / 2). Every kernel's OpenMP
 * region takes its num_threads from here, so qcal_threads_set_count bounds them all. */
int qcal_threads_for(int64_t n);

/* Caps qcal_threads_for on the calling thread at n (0: no cap) and returns the previous
 * cap: a library thread that shares work with others of its own (engine/model_calib.c)
 * keeps each of them on one core without touching the user's OpenMP settings. */
int qcal_threads_local_cap(int n);

/* True when a pass touching `bytes` bytes in total (inputs + outputs) should write with
 * non-temporal stores: more than half the L3 of one core's cluster (Linux sysfs, read once;
 * 32 MiB if unknown), so its outputs would not stay cached anyway and plain stores would
 * only add the read-for-ownership traffic. The fake-quant and FP8 kernels take it. */
bool qcal_cpu_stream_stores(int64_t bytes);

#endif
