/* Run-time CPU feature detection for kernel dispatch, and the threading threshold.
 * Kernels keep a portable C reference (`..._c`) next to ISA versions (`..._avx2`,
 * `..._avx512`, compiled with __attribute__((target(...)))) and pick one through
 * qcal_cpu_isa(). The environment variable QCAL_ISA=c|avx2|avx512 caps the choice
 * (used by tests to run the C references on any machine). */
#ifndef QCAL_CORE_CPU_H
#define QCAL_CORE_CPU_H

#include <stdint.h>

typedef enum qcal_isa {
    QCAL_ISA_C = 0,
    QCAL_ISA_AVX2 = 1,      /* AVX2 + FMA */
    QCAL_ISA_AVX512 = 2,    /* AVX-512 F + BW + DQ + VL */
} qcal_isa;

/* Best ISA this CPU supports, capped by QCAL_ISA; computed once, thread-safe. */
qcal_isa qcal_cpu_isa(void);

/* Re-reads QCAL_ISA (tests switch ISAs inside one process). */
void qcal_cpu_reset(void);

/* Below this many elements a kernel runs on the calling thread only: an OpenMP fork costs
 * a few microseconds, the same as reading ~256 KiB. */
#define QCAL_OMP_MIN_ELEMENTS (1 << 18)

/* Number of threads a kernel should use for n elements (1 below the threshold). */
int qcal_threads_for(int64_t n);

#endif
