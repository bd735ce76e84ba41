/* STREAM-like read / copy bandwidth probe (see bandwidth.h). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bandwidth.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Portable reference: 8 independent accumulators so the compiler can vectorise. */
static double sum_c(const float *x, int64_t n)
{
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += x[i + k];
    double s = 0;
    for (int k = 0; k < 8; k++)
        s += acc[k];
    for (; i < n; i++)
        s += x[i];
    return s;
}

__attribute__((target("avx2,fma"))) static double sum_avx2(const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    double s = 0;
    for (int k = 0; k < 8; k++)
        s += t[k];
    for (; i < n; i++)
        s += x[i];
    return s;
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) static double
sum_avx512(const float *x, int64_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    double s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++)
        s += x[i];
    return s;
}

__attribute__((target("avx2,fma"))) static void copy_avx2(float *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
        __m256 c = _mm256_loadu_ps(src + i + 16), d = _mm256_loadu_ps(src + i + 24);
        _mm256_storeu_ps(dst + i, a);
        _mm256_storeu_ps(dst + i + 8, b);
        _mm256_storeu_ps(dst + i + 16, c);
        _mm256_storeu_ps(dst + i + 24, d);
    }
    for (; i < n; i++)
        dst[i] = src[i];
}

static void copy_c(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i];
}

typedef struct {
    double (*sum)(const float *, int64_t);
    void (*copy)(float *, const float *, int64_t);
} probe_fns;

static probe_fns pick(void)
{
    probe_fns f = {sum_c, copy_c};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        f.sum = sum_avx2;
        f.copy = copy_avx2;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        f.sum = sum_avx512;
    return f;
}

/* Runs kind 0 (sum), 1 (vector copy) or 2 (memcpy) over n floats with t threads. */
static double run_once(const probe_fns *f, int kind, float *dst, const float *src, int64_t n,
                       int t, double *sink)
{
    double partial[64] = {0};
    if (t > 64)
        t = 64;
    double t0 = now_s();
#if QCAL_HAVE_OPENMP
#pragma omp parallel num_threads(t)
#endif
    {
#if QCAL_HAVE_OPENMP
        int id = omp_get_thread_num(), nt = omp_get_num_threads();
#else
        int id = 0, nt = 1;
#endif
        int64_t lo = n * id / nt, hi = n * (id + 1) / nt;
        lo &= ~(int64_t)15;
        if (id == nt - 1)
            hi = n;
        else
            hi &= ~(int64_t)15;
        if (kind == 0)
            partial[id] = f->sum(src + lo, hi - lo);
        else if (kind == 1)
            f->copy(dst + lo, src + lo, hi - lo);
        else
            memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
    }
    double el = now_s() - t0;
    for (int i = 0; i < t; i++)
        *sink += partial[i];
    return el;
}

int bench_bandwidth_measure(int threads, int64_t bytes, int reps, bench_bandwidth *out)
{
    if (reps < 1)
        reps = 1;
    if (reps > 64)
        reps = 64;
    int64_t n = bytes / (int64_t)sizeof(float);
    float *src = aligned_alloc(4096, (size_t)n * sizeof(float));
    float *dst = aligned_alloc(4096, (size_t)n * sizeof(float));
    if (!src || !dst) {
        free(src);
        free(dst);
        return -1;
    }
    /* Touch every page with the thread layout used later (first touch). */
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t i = 0; i < n; i++) {
        src[i] = (float)(i & 1023) * 0.001f;
        dst[i] = 0.0f;
    }
    probe_fns f = pick();
    double sink = 0, times[64], med[3];
    for (int kind = 0; kind < 3; kind++) {
        run_once(&f, kind, dst, src, n, threads, &sink);
        for (int r = 0; r < reps; r++)
            times[r] = run_once(&f, kind, dst, src, n, threads, &sink);
        qsort(times, (size_t)reps, sizeof(double), cmp_d);
        med[kind] = times[reps / 2];
    }
    double b = (double)n * sizeof(float);
    out->read_gbps = b / med[0] * 1e-9;
    out->copy_store_gbps = 2 * b / med[1] * 1e-9;
    out->copy_memcpy_gbps = 2 * b / med[2] * 1e-9;
    out->copy_gbps = out->copy_store_gbps > out->copy_memcpy_gbps ? out->copy_store_gbps
                                                                  : out->copy_memcpy_gbps;
    out->checksum = sink + (double)dst[n / 3];
    free(src);
    free(dst);
    return 0;
}

/* One thread's increments: `passes` passes over the slots, four counter copies in turn (the
 * histogram kernels' scatter loop, qcal_hist_scatter_chunk). */
static void increments(uint16_t *sub, const uint16_t *slot, int64_t nslot, int passes)
{
    uint16_t *s0 = sub, *s1 = sub + 4096, *s2 = sub + 2 * 4096, *s3 = sub + 3 * 4096;
    for (int p = 0; p < passes; p++)
        for (int64_t j = 0; j < nslot; j += 4) {
            s0[slot[j]]++;
            s1[slot[j + 1]]++;
            s2[slot[j + 2]]++;
            s3[slot[j + 3]]++;
        }
}

/* This thread's number in the enclosing OpenMP team (0 without OpenMP). */
static int thread_id(void)
{
#if QCAL_HAVE_OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* reps into [1, 64], threads into [1, 64]: the bounds of the probes' arrays. */
static void clamp_runs(int *reps, int *threads)
{
    *reps = *reps < 1 ? 1 : *reps > 64 ? 64 : *reps;
    *threads = *threads < 1 ? 1 : *threads > 64 ? 64 : *threads;
}

/* n pseudo-random counter slots in [0, 4096) (a fixed LCG: every run the same). */
static void fill_slots(uint16_t *slot, int n)
{
    uint32_t r = 12345;
    for (int i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        slot[i] = (uint16_t)(r >> 20);   /* 0 .. 4095 */
    }
}

/* increments() with an input stream read beside them: for every 64 increments, 64 floats
 * (4 cache lines) of x are read and folded into an OR (prefetched 1 KiB ahead into L1, as
 * the histogram kernels on Intel cores do). The counters and slots stay in L1. */
static uint32_t increments_stream(uint16_t *sub, const uint16_t *slot, const uint32_t *x,
                                  int64_t n)
{
    enum { NSLOT = 4096 };
    uint16_t *s0 = sub, *s1 = sub + 4096, *s2 = sub + 2 * 4096, *s3 = sub + 3 * 4096;
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i + 64 <= n; i += 64) {
        __builtin_prefetch(x + i + 256, 0, 3);
        __builtin_prefetch(x + i + 256 + 16, 0, 3);
        __builtin_prefetch(x + i + 256 + 32, 0, 3);
        __builtin_prefetch(x + i + 256 + 48, 0, 3);
        const __m128i *v = (const __m128i *)(x + i);   /* 16-byte aligned: x is, i % 64 == 0 */
        for (int j = 0; j < 16; j += 4) {
            a0 = _mm_or_si128(a0, _mm_load_si128(v + j));
            a1 = _mm_or_si128(a1, _mm_load_si128(v + j + 1));
            a2 = _mm_or_si128(a2, _mm_load_si128(v + j + 2));
            a3 = _mm_or_si128(a3, _mm_load_si128(v + j + 3));
        }
        const uint16_t *k = slot + (i & (NSLOT - 1));
        for (int j = 0; j < 64; j += 4) {
            s0[k[j]]++;
            s1[k[j + 1]]++;
            s2[k[j + 2]]++;
            s3[k[j + 3]]++;
        }
    }
    a0 = _mm_or_si128(_mm_or_si128(a0, a1), _mm_or_si128(a2, a3));
    a0 = _mm_or_si128(a0, _mm_srli_si128(a0, 8));
    a0 = _mm_or_si128(a0, _mm_srli_si128(a0, 4));
    return (uint32_t)_mm_cvtsi128_si32(a0);
}

/* Median over `reps` timed runs (after one warm-up) of every thread of a team of `threads`
 * incrementing its own 4 x 4096 counters of sub: `passes` passes over the slots (x NULL),
 * or its share of the n values of x read beside the increments. */
static double probe_time(int threads, int reps, uint16_t *sub, const uint16_t *slot,
                         int nslot, int passes, const uint32_t *x, int64_t n)
{
    double times[64];
    volatile uint32_t sink = 0;
    for (int k = -1; k < reps; k++) {
        double t0 = now_s();
#if QCAL_HAVE_OPENMP
#pragma omp parallel num_threads(threads)
#endif
        {
            int id = thread_id();
            uint16_t *own = sub + (size_t)id * 4 * 4096;
            if (!x) {
                increments(own, slot, nslot, passes);
            } else {
                int64_t per = n / threads / 64 * 64, a = (int64_t)id * per;
                int64_t b = id == threads - 1 ? n : a + per;
                uint32_t v = increments_stream(own, slot, x + a, b - a);
#if QCAL_HAVE_OPENMP
#pragma omp atomic
#endif
                sink |= v;
            }
        }
        double el = now_s() - t0;
        if (k >= 0)
            times[k] = el;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_d);
    /* The counters wrap (16 bits); reading them keeps the stores. */
    volatile uint16_t keep = sub[slot[0]];
    (void)keep;
    (void)sink;
    return times[reps / 2];
}

int bench_increment_measure(int threads, int reps, double *gincr)
{
    /* 4096 slots (8 KB) read 1024 times: with the 32 KB of counters they stay in L1, as
     * the kernels' ring of slots does (a 128 KB slot array gave 3.2-4.1 G/s from run to
     * run, one L1-resident 4.0-4.1). */
    enum { NSLOT = 4096, PASSES = 1024 };
    clamp_runs(&reps, &threads);
    uint16_t *slot = malloc(NSLOT * sizeof *slot);
    uint16_t *sub = aligned_alloc(64, (size_t)threads * 4 * 4096 * sizeof *sub);
    if (!slot || !sub) {
        free(slot);
        free(sub);
        return -1;
    }
    fill_slots(slot, NSLOT);
    memset(sub, 0, (size_t)threads * 4 * 4096 * sizeof *sub);
    double t = probe_time(threads, reps, sub, slot, NSLOT, PASSES, NULL, 0);
    *gincr = (double)threads * NSLOT * PASSES / t * 1e-9;
    free(slot);
    free(sub);
    return 0;
}

int bench_increment_stream_measure(int threads, int reps, int64_t n, double *gincr)
{
    enum { NSLOT = 4096 };
    clamp_runs(&reps, &threads);
    n = n / 64 * 64;
    if (n < 64 * threads)
        return -1;
    uint16_t *slot = malloc(NSLOT * sizeof *slot);
    uint16_t *sub = aligned_alloc(64, (size_t)threads * 4 * 4096 * sizeof *sub);
    uint32_t *x = aligned_alloc(64, (size_t)n * sizeof *x + 1024);
    if (!slot || !sub || !x) {
        free(slot);
        free(sub);
        free(x);
        return -1;
    }
    fill_slots(slot, NSLOT);
    for (int64_t i = 0; i < n; i++)
        x[i] = (uint32_t)i * 2654435761u;
    memset(sub, 0, (size_t)threads * 4 * 4096 * sizeof *sub);
    *gincr = (double)n / probe_time(threads, reps, sub, slot, NSLOT, 0, x, n) * 1e-9;
    free(slot);
    free(sub);
    free(x);
    return 0;
}
