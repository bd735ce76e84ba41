/* STREAM-like memory bandwidth probe for the benchmarks (not part of libqcal).
 *
 * read:  a vectorised sum over a buffer of at least 256 MiB, each thread summing its own
 *        contiguous part; bytes = bytes read.
 * copy:  dst = src over 256 MiB each, each thread its part, with plain (cached) vector
 *        stores and with glibc memcpy (non-temporal stores for large blocks); the faster
 *        of the two counts. bytes = bytes read + bytes written (2 x the buffer).
 * Both report the median of `reps` timed runs after one warm-up, in GB/s (1e9 bytes/s).
 * increments: the bound of histogram binning, which stores one counter per value: each
 *        thread adds 1 to 16-bit counters at pseudo-random slots (4 copies of 4096 cells,
 *        32 KB, as the histogram kernels' sub-histograms; slots read from an 8 KB array),
 *        4M increments a thread; reports 1e9 increments per second over all threads;
 *        and the same increments beside an input stream read from memory. */
#ifndef QCAL_BENCH_BANDWIDTH_H
#define QCAL_BENCH_BANDWIDTH_H

#include <stdint.h>

typedef struct bench_bandwidth {
    double read_gbps;        /* median read bandwidth */
    double copy_gbps;        /* median copy bandwidth (read + write bytes), best method */
    double copy_store_gbps;  /* copy with cached vector stores */
    double copy_memcpy_gbps; /* copy with memcpy */
    double checksum;         /* sum of the read pass (kept so it is not optimised away) */
} bench_bandwidth;

/* Measures read and copy bandwidth with `threads` threads (OpenMP; 1 without it) over
 * buffers of `bytes` bytes (>= 256 MiB recommended). Returns 0, or -1 if out of memory. */
int bench_bandwidth_measure(int threads, int64_t bytes, int reps, bench_bandwidth *out);

/* Measures the increment rate with `threads` threads: median of `reps` runs after one
 * warm-up, in 1e9 increments per second. Returns 0, or -1 if out of memory. */
int bench_increment_measure(int threads, int reps, double *gincr);

/* The same increments with an input of n 4-byte values read beside them from memory (each
 * thread its part, 4 cache lines per 64 increments, prefetched into L1 as the histogram
 * kernels do on Intel cores): the bound of a kernel that reads its input and stores one
 * counter per value. Median of `reps` runs after a warm-up, 1e9 increments per second.
 * Returns 0, or -1 if out of memory or n < 64 x threads. */
int bench_increment_stream_measure(int threads, int reps, int64_t n, double *gincr);

#endif
