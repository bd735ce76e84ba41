/* CPU feature detection (cpuid through the compiler builtins) with a QCAL_ISA cap. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "qcal/threads.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static atomic_int cached_isa = -1;

static qcal_isa detect(void)
{
    qcal_isa best = QCAL_ISA_C;
#if QCAL_HAVE_X86_SIMD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        best = QCAL_ISA_AVX2;
    if (best == QCAL_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        best = QCAL_ISA_AVX512;
#endif
    const char *env = getenv("QCAL_ISA");
    if (env) {
        qcal_isa cap = best;
        if (!strcmp(env, "c"))
            cap = QCAL_ISA_C;
        else if (!strcmp(env, "avx2"))
            cap = QCAL_ISA_AVX2;
        else if (!strcmp(env, "avx512"))
            cap = QCAL_ISA_AVX512;
        if (cap < best)
            best = cap;
    }
    return best;
}

qcal_isa qcal_cpu_isa(void)
{
    int v = atomic_load_explicit(&cached_isa, memory_order_acquire);
    if (v < 0) {
        v = (int)detect();
        atomic_store_explicit(&cached_isa, v, memory_order_release);
    }
    return (qcal_isa)v;
}

void qcal_cpu_reset(void)
{
    atomic_store(&cached_isa, -1);
}

static _Thread_local int local_cap;   /* 0: none */

int qcal_threads_local_cap(int n)
{
    int old = local_cap;
    local_cap = n > 0 ? n : 0;
    return old;
}

int qcal_threads_for(int64_t n)
{
#if QCAL_HAVE_OPENMP
    /* Inside a parallel region (the caller already split the work between threads, e.g.
     * the ONNX weight pass) a nested team would get one thread anyway, after the cost of
     * forming it and of per-thread partials for threads that never come. */
    if (n < QCAL_OMP_MIN_ELEMENTS || omp_in_parallel())
        return 1;
    int t = qcal_threads_count();   /* qcal_threads_set_count, else OpenMP's default */
    int64_t cap = n / (QCAL_OMP_MIN_ELEMENTS / 2);
    if (cap < t)
        t = (int)cap;
    if (local_cap > 0 && t > local_cap)
        t = local_cap;
    return t < 1 ? 1 : t;
#else
    (void)n;
    return 1;
#endif
}

/* Last-level cache of one core's cluster in bytes: Linux's sysfs entry for cpu0's L3
 * (e.g. "32768K"), 32 MiB when unknown. Not sysconf(_SC_LEVEL3_CACHE_SIZE): glibc reports
 * the whole socket there on AMD EPYC (320 MiB on this project's machine, where one core
 * sees 32 MiB). Read once; a racing first call just reads it twice. */
static int64_t l3_bytes(void)
{
    static _Atomic int64_t cached = 0;
    int64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v > 0)
        return v;
    v = 32ll << 20;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        long long k = 0;
        char unit = 0;
        if (fscanf(f, "%lld%c", &k, &unit) >= 1 && k > 0 && k < (1ll << 40)) {
            if (unit == 'K')
                v = k << 10;
            else if (unit == 'M')
                v = k << 20;
            else
                v = k;
        }
        fclose(f);
    }
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}

bool qcal_cpu_stream_stores(int64_t bytes)
{
    return bytes > l3_bytes() / 2;
}
