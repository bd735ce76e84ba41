/* Kernel layer: one function table per kernel family (internal).
 *
 * A family F of module directory D (e.g. observers/minmax) consists of
 *   D/F_dsp.h       the table `qcal_F_dsp` (a struct of function pointers, one per kernel,
 *                   each named by dtype, op and ISA: qcal_f32_minmax__c / __avx2 / __avx512),
 *                   and the prototypes of every kernel version;
 *   D/F_c.c         the portable C references (the definition of each kernel's bits),
 *                   qcal_F_dsp_init() and qcal_F_dsp_get();
 *   D/F_avx2.c      AVX2 versions + qcal_F_dsp_init_avx2() (built with -mavx2 -mfma);
 *   D/F_avx512.c    AVX-512 versions + qcal_F_dsp_init_avx512() (built with the AVX-512
 *                   F/BW/DQ/VL flags); D/meson.build appends these two to
 *                   qcal_avx2_sources / qcal_avx512_sources (x86-64 only).
 * qcal_F_dsp_init(dsp, isa) fills the C references, then lets each ISA up to `isa`
 * override the slots it implements. qcal_F_dsp_get() returns the table for
 * qcal_cpu_isa() (CPU detection capped by QCAL_ISA), filled once per ISA, thread-safe;
 * tests that switch QCAL_ISA call qcal_cpu_reset() and get the other table.
 * Every ISA version must give results bit-identical to its C reference: tests/checkasm.c
 * walks every slot of every table (add a check function there for a new family). */
#ifndef QCAL_CORE_DSP_H
#define QCAL_CORE_DSP_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/cpu.h"
#include "qcal_config.h"

/* Defines `const qcal_F_dsp *qcal_F_dsp_get(void)` for family F (in D/F_c.c). */
#define QCAL_DSP_DEFINE_GET(F)                                                             \
    const qcal_##F##_dsp *qcal_##F##_dsp_get(void)                                         \
    {                                                                                      \
        static qcal_##F##_dsp tables[QCAL_ISA_COUNT];                                      \
        static atomic_int ready[QCAL_ISA_COUNT];                                           \
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;                           \
        qcal_isa isa = qcal_cpu_isa();                                                     \
        if (!atomic_load_explicit(&ready[isa], memory_order_acquire)) {                    \
            pthread_mutex_lock(&lock);                                                     \
            if (!atomic_load_explicit(&ready[isa], memory_order_relaxed)) {                \
                qcal_##F##_dsp_init(&tables[isa], isa);                                    \
                atomic_store_explicit(&ready[isa], 1, memory_order_release);               \
            }                                                                              \
            pthread_mutex_unlock(&lock);                                                   \
        }                                                                                  \
        return &tables[isa];                                                               \
    }

#endif
