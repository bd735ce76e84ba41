/* checkasm (unit.checkasm): every ISA version of every kernel in the kernel layer
 * (core/dsp.h) against its C reference, and `--bench`: each kernel's speed in GB/s.
 *
 *   checkasm [--bench] [--seed N] [--only FAMILY[,FAMILY...]] [--elements N]
 *
 * For each family and each ISA this CPU has (capped by QCAL_ISA), the family's check
 * function fills one table with qcal_F_dsp_init(&ref, QCAL_ISA_C) and one with
 * qcal_F_dsp_init(&opt, isa), and for every slot that has an ISA version runs both on
 * seeded random data in canary-guarded buffers (ca_alloc: writes outside the buffer and
 * writes into const inputs are caught), at the sizes of ca_sizes (below, at, above and
 * multiples of 8 and 16 lanes, unaligned starts), with NaN/Inf/denormal/+-0/saturation
 * fills (ca_fill). Outputs must be bit-identical to the C reference.
 * ca_family_done() fails a family whose table has an ISA version that no check covered.
 * ISA versions above what this CPU runs (e.g. AVX-512 on an AVX2 machine) are never called:
 * ca_count_unrun() counts them per family and the run ends with one line saying how many
 * were skipped (they are not counted as checked).
 *
 * Adding a family F (module dir D):
 *   1. write `static void check_F(void)` below: for each isa in ca_isas(), init ref/opt,
 *      then `if (ca_test(&ref.slot, &opt.slot, "dtype_op", isa)) { ... }` per slot,
 *      comparing with ca_fail() on mismatch, ending with ca_family_done(&ref, &opt, ...);
 *   2. under `if (ca.bench)`, time each version with ca_bench();
 *   3. add {"F", check_F} to FAMILIES.
 * The seed is printed; rerun a failure with --seed. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "fakequant/fakequant_dsp.h"
#include "io/half_dsp.h"
#include "numeric/metrics_dsp.h"
#include "observers/histogram_dsp.h"
#include "observers/histogram_lattice.h"
#include "observers/minmax_dsp.h"
#include "quant/float8_dsp.h"
#include "quant/quantize_dsp.h"

/* ---- framework ---------------------------------------------------------------------- */

static struct {
    bool bench;
    uint64_t seed, rng;
    int64_t bench_elements;
    const char *family;     /* current family */
    int failures, checks, kernels;
    int unrun[QCAL_ISA_COUNT];   /* ISA versions this CPU cannot run (not called) */
    unsigned tested;        /* slots tested for the current family and ISA (bit mask) */
    const float *probe;     /* bench mode: the read probe's own buffer */
    int64_t probe_n;
    double probe_sink;
} ca;

static const char *const ISA_NAMES[QCAL_ISA_COUNT] = { "c", "avx2", "avx512" };

static uint32_t ca_rand(void)
{
    ca.rng = ca.rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(ca.rng >> 32);
}

/* Uniform in [-1, 1). */
static float ca_unit(void)
{
    return (float)((double)ca_rand() / 2147483648.0 - 1.0);
}

static void ca_fail(const char *fmt, ...)
{
    ca.failures++;
    if (ca.failures > 20)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "checkasm: FAIL %s: ", ca.family);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (seed %" PRIu64 ")\n", ca.seed);
    va_end(ap);
}

/* ISA versions to check: AVX2 up to the best this CPU has (QCAL_ISA caps it). */
static int ca_isa_count(void)
{
    return (int)qcal_cpu_isa() + 1;
}

/* True (and the slot marked as tested) when table `opt` of type T has an ISA version in
 * `slot`, i.e. differs from the C reference table `ref`.
 * Use: if (ca_test(qcal_F_dsp, &ref, &opt, slot, "f32_op", isa)) { ...compare... } */
#define ca_test(T, ref, opt, slot, name, isa)                                              \
    ca_test_slot(&(ref)->slot, &(opt)->slot, sizeof (opt)->slot,                           \
                 (int)(offsetof(T, slot) / sizeof(void (*)(void))), name, isa)

static bool ca_test_slot(const void *refslot, const void *optslot, size_t size, int slot,
                         const char *name, qcal_isa isa)
{
    static unsigned char seen[256][sizeof(void (*)(void))];   /* versions already checked */
    static int nseen;
    if (!memcmp(refslot, optslot, size))
        return false;
    ca.tested |= 1u << slot;
    for (int k = 0; k < nseen; k++)
        if (!memcmp(seen[k], optslot, size))
            return false;   /* the same version, inherited by a higher ISA */
    if (nseen < 256)
        memcpy(seen[nseen++], optslot, size);
    ca.kernels++;
    if (!ca.bench)
        printf("checkasm: %s: %s__%s\n", ca.family, name, ISA_NAMES[isa]);
    return true;
}

/* Every slot of opt that is not the C reference must have been tested. */
static void ca_family_done(const void *ref, const void *opt, size_t size, qcal_isa isa)
{
    size_t nslots = size / sizeof(void (*)(void));
    for (size_t k = 0; k < nslots; k++) {
        void (*a)(void), (*b)(void);
        memcpy(&a, (const char *)ref + k * sizeof a, sizeof a);
        memcpy(&b, (const char *)opt + k * sizeof b, sizeof b);
        if (a != b && !(ca.tested & (1u << k)))
            ca_fail("slot %zu of the %s table has an %s version that no check covers", k,
                    ca.family, ISA_NAMES[isa]);
    }
    ca.tested = 0;
}

/* Counts the ISA versions of a family that this CPU cannot run (ISAs above ca_isa_count(),
 * a version inherited from a lower ISA's table not counted again): tables t[0..COUNT-1], as
 * qcal_F_dsp_init fills them for each ISA (only function pointers: nothing is called). */
static void ca_unrun_count(const void *t, size_t size)
{
    const size_t fp = sizeof(void (*)(void)), nslots = size / fp;
    for (int isa = ca_isa_count(); isa < QCAL_ISA_COUNT; isa++)
        for (size_t k = 0; k < nslots; k++) {
            const char *hi = (const char *)t + (size_t)isa * size + k * fp;
            bool inherited = false;
            for (int j = 0; j < isa && !inherited; j++)
                inherited = !memcmp(hi, (const char *)t + (size_t)j * size + k * fp, fp);
            if (!inherited)
                ca.unrun[isa]++;
        }
}

#define ca_count_unrun(T, init)                                                            \
    do {                                                                                   \
        T t_[QCAL_ISA_COUNT];                                                              \
        for (int i_ = 0; i_ < QCAL_ISA_COUNT; i_++)                                        \
            init(&t_[i_], (qcal_isa)i_);                                                   \
        ca_unrun_count(t_, sizeof t_[0]);                                                  \
    } while (0)

/* Canary-guarded buffer: `bytes` usable bytes starting `misalign` bytes past a 64-byte
 * boundary, with 64 canary bytes either side. ca_free() checks both canaries. */
#define CA_GUARD 64
#define CA_CANARY 0xA5

typedef struct ca_buf {
    unsigned char *base;
    size_t bytes, misalign;
} ca_buf;

static void *ca_alloc(ca_buf *b, size_t bytes, size_t misalign)
{
    b->bytes = bytes;
    b->misalign = misalign;
    size_t total = 2 * CA_GUARD + misalign + bytes + CA_GUARD;
    total = (total + 63) / 64 * 64;
    b->base = aligned_alloc(64, total);
    if (!b->base) {
        fprintf(stderr, "checkasm: out of memory\n");
        exit(2);
    }
    memset(b->base, CA_CANARY, total);
    return b->base + 2 * CA_GUARD + misalign;
}

static bool ca_canaries_ok(const ca_buf *b)
{
    const unsigned char *p = b->base + 2 * CA_GUARD + b->misalign;
    for (size_t i = 0; i < 2 * CA_GUARD + b->misalign; i++)
        if (b->base[i] != CA_CANARY)
            return false;
    for (size_t i = 0; i < CA_GUARD; i++)
        if (p[b->bytes + i] != CA_CANARY)
            return false;
    return true;
}

static void ca_free(ca_buf *b, const char *what)
{
    if (!ca_canaries_ok(b))
        ca_fail("%s: a kernel wrote outside its buffer (%zu bytes)", what, b->bytes);
    free(b->base);
    b->base = NULL;
}

/* Sizes below, at, above and at multiples of the vector widths (8 and 16 float lanes, and
 * the 32/64-element unrolled loops). */
static const int64_t ca_sizes[] = {
    0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 24, 31, 32, 33, 47, 48, 63, 64, 65,
    96, 127, 128, 129, 191, 255, 256, 257, 1000, 1023, 1024, 1025, 4095, 4096, 4097, 10007,
};
#define CA_NSIZES ((int)(sizeof ca_sizes / sizeof ca_sizes[0]))

enum {
    CA_FILL_NORMAL,      /* finite values, mixed magnitudes */
    CA_FILL_SPECIAL,     /* sprinkled NaN (quiet, signalling, negative), +-Inf */
    CA_FILL_NONFINITE,   /* nothing finite */
    CA_FILL_DENORMAL,    /* denormals and +-0 */
    CA_FILL_EXTREME,     /* +-FLT_MAX, FLT_MIN, huge values (saturation) */
    CA_FILL_COUNT
};
static const char *const FILL_NAMES[CA_FILL_COUNT] = { "normal", "special", "nonfinite",
                                                       "denormal", "extreme" };

static float ca_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ca_special(void)
{
    static const uint32_t sp[] = { 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu,
                                   0x7f800000u, 0xff800000u, 0xffffffffu };
    return ca_bits(sp[ca_rand() % (sizeof sp / sizeof sp[0])]);
}

static void ca_fill_f32(float *x, int64_t n, int mode)
{
    for (int64_t i = 0; i < n; i++) {
        float v = ca_unit() * (float)(1 << (ca_rand() % 12));
        switch (mode) {
        case CA_FILL_SPECIAL:
            if (ca_rand() % 5 == 0)
                v = ca_special();
            break;
        case CA_FILL_NONFINITE:
            v = ca_special();
            break;
        case CA_FILL_DENORMAL: {
            uint32_t r = ca_rand();
            v = r % 4 == 0 ? (r & 8 ? -0.0f : 0.0f)
                           : ca_bits((r & 0x807fffffu) | (r % 3 == 0 ? 0x00800000u : 0));
            break;
        }
        case CA_FILL_EXTREME: {
            uint32_t r = ca_rand() % 6;
            v = r == 0 ? FLT_MAX : r == 1 ? -FLT_MAX : r == 2 ? FLT_MIN
                : r == 3 ? -FLT_MIN : v * 1e37f;
            break;
        }
        default:
            break;
        }
        x[i] = v;
    }
}

static uint32_t ca_u32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* CPU time of the calling thread: time the scheduler gives to other processes on a busy
 * machine is not counted (memory stalls are). */
static double ca_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ca_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Read probe: a float sum with 32 independent accumulators (vectorised by the compiler)
 * over its own buffer of bench_elements floats, so it reads as many bytes from memory as
 * the read-only kernels. */
static double ca_probe(void)
{
    float acc[32] = { 0 };
    const float *x = ca.probe;
    for (int64_t i = 0; i + 32 <= ca.probe_n; i += 32)
        for (int k = 0; k < 32; k++)
            acc[k] += x[i + k];
    double s = 0;
    for (int k = 0; k < 32; k++)
        s += acc[k];
    return s;
}

/* Times run(ctx) interleaved with the read probe (after a warm-up of each): prints the
 * median time and GB/s (bytes / time), and the median of the paired ratios
 * (kernel GB/s) / (probe GB/s) with their range. */
static void ca_bench(const char *kernel, qcal_isa isa, double bytes, void (*run)(void *),
                     void *ctx)
{
    enum { REPS = 15 };
    double t[REPS], ratio[REPS];
    double probe_bytes = (double)ca.probe_n * 4;
    run(ctx);
    ca.probe_sink += ca_probe();
    for (int r = 0; r < REPS; r++) {
        double t0 = ca_now();
        ca.probe_sink += ca_probe();
        double tp = ca_now() - t0;
        t0 = ca_now();
        run(ctx);
        t[r] = ca_now() - t0;
        ratio[r] = (bytes / t[r]) / (probe_bytes / tp);
    }
    qsort(t, REPS, sizeof t[0], ca_cmp_d);
    qsort(ratio, REPS, sizeof ratio[0], ca_cmp_d);
    printf("| %-8s | %-28s | %-6s | %9.3f ms | %6.1f | %5.0f%% (%3.0f-%3.0f%%) |\n", ca.family,
           kernel, ISA_NAMES[isa], t[REPS / 2] * 1e3, bytes / t[REPS / 2] / 1e9,
           100 * ratio[REPS / 2], 100 * ratio[0], 100 * ratio[REPS - 1]);
    fflush(stdout);
}

/* ---- family: minmax (observers/minmax_dsp.h) ----------------------------------------- */

/* Equal bits, or zeros of either sign (the family's documented exception). */
static bool same_extreme(float a, float b)
{
    return ca_u32(a) == ca_u32(b) || (a == 0.0f && b == 0.0f);
}

typedef struct minmax_bench {
    const qcal_minmax_dsp *dsp;
    const float *x;
    int64_t n;
    float sink;
} minmax_bench;

static void run_minmax(void *p)
{
    minmax_bench *b = p;
    float mn, mx;
    uint64_t nf;
    b->dsp->minmax(b->x, b->n, &mn, &mx, &nf);
    b->sink += mn + mx + (float)nf;
}

static void run_minmax_cols(void *p)
{
    minmax_bench *b = p;
    enum { W = 256 };
    float cmn[W], cmx[W];
    for (int j = 0; j < W; j++) {
        cmn[j] = INFINITY;
        cmx[j] = -INFINITY;
    }
    uint64_t nf = 0;
    b->dsp->minmax_cols(b->x, b->n / W, W, cmn, cmx, &nf);
    b->sink += cmn[0] + cmx[W - 1] + (float)nf;
}

static void check_minmax_flat(const qcal_minmax_dsp *ref, const qcal_minmax_dsp *opt,
                              qcal_isa isa)
{
    for (int s = 0; s < CA_NSIZES; s++) {
        int64_t n = ca_sizes[s];
        for (int mode = 0; mode < CA_FILL_COUNT; mode++) {
            static const size_t offsets[] = { 0, 1, 7 };   /* floats past 64 bytes */
            for (size_t oi = 0; oi < 3; oi++) {
                size_t mis = offsets[oi];
                ca_buf xb;
                float *x = ca_alloc(&xb, (size_t)n * 4, mis * 4);
                ca_fill_f32(x, n, mode);
                float *copy = malloc((size_t)n * 4 + 4);
                memcpy(copy, x, (size_t)n * 4);
                float rm, rM, om = 7, oM = 7;
                uint64_t rn, on = 7;
                ref->minmax(x, n, &rm, &rM, &rn);
                opt->minmax(x, n, &om, &oM, &on);
                ca.checks++;
                if (!same_extreme(rm, om) || !same_extreme(rM, oM) || rn != on)
                    ca_fail("f32_minmax__%s n=%lld fill=%s offset=%zu: (%a, %a, %llu) != C "
                            "(%a, %a, %llu)", ISA_NAMES[isa], (long long)n, FILL_NAMES[mode],
                            mis, (double)om, (double)oM, (unsigned long long)on, (double)rm,
                            (double)rM, (unsigned long long)rn);
                if (memcmp(copy, x, (size_t)n * 4))
                    ca_fail("f32_minmax__%s n=%lld wrote into its input", ISA_NAMES[isa],
                            (long long)n);
                free(copy);
                ca_free(&xb, "f32_minmax");
            }
        }
    }
    /* Kernels that read in blocks and redo only a block that holds a non-finite value: one
     * or two such values (or one zero of the other sign) at block edges, among finite
     * values, in inputs of several blocks. */
    static const int64_t big[] = { 1024, 2048 + 77, 3 * 4096 + 129, 10007 };
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++) {
        int64_t n = big[s];
        const int64_t pos[] = { 0, 1, 63, 1023, 1024, 1025, 4095, 4096, n / 2, n - 65,
                                n - 64, n - 1 };
        for (size_t p = 0; p < sizeof pos / sizeof pos[0]; p++) {
            for (int kind = 0; kind < 4; kind++) {
                ca_buf xb;
                float *x = ca_alloc(&xb, (size_t)n * 4, (p % 2) * 4);
                ca_fill_f32(x, n, CA_FILL_NORMAL);
                int64_t at = pos[p] < n ? pos[p] : n - 1;
                x[at] = kind == 0 ? ca_special() : kind == 1 ? INFINITY
                        : kind == 2 ? -INFINITY : -0.0f;
                if (kind != 3 && p % 3 == 0)
                    x[n - 1 - at] = ca_special();   /* a second one elsewhere */
                float rm, rM, om = 7, oM = 7;
                uint64_t rn, on = 7;
                ref->minmax(x, n, &rm, &rM, &rn);
                opt->minmax(x, n, &om, &oM, &on);
                ca.checks++;
                if (!same_extreme(rm, om) || !same_extreme(rM, oM) || rn != on)
                    ca_fail("f32_minmax__%s n=%lld special at %lld (kind %d): (%a, %a, %llu) "
                            "!= C (%a, %a, %llu)", ISA_NAMES[isa], (long long)n,
                            (long long)at, kind, (double)om, (double)oM,
                            (unsigned long long)on, (double)rm, (double)rM,
                            (unsigned long long)rn);
                ca_free(&xb, "f32_minmax (sparse non-finite)");
            }
        }
    }
}

static void check_minmax_cols(const qcal_minmax_dsp *ref, const qcal_minmax_dsp *opt,
                              qcal_isa isa)
{
    static const int64_t rows_list[] = { 0, 1, 2, 3, 4, 5, 8, 9 };
    /* the sizes up to 1025, then wide rows (the kernels block four rows from 4096) */
    static const int64_t wide[] = { 4095, 4096, 4097, 4111, 8200 };
    int nw = 0;
    while (nw < CA_NSIZES && ca_sizes[nw] <= 1025)
        nw++;
    for (int s = 0; s < nw + (int)(sizeof wide / sizeof wide[0]); s++) {
        int64_t w = s < nw ? ca_sizes[s] : wide[s - nw];
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
            int64_t rows = rows_list[ri];
            int mode = (int)(ca_rand() % CA_FILL_COUNT);
            ca_buf xb, b1, b2, b3, b4;
            float *x = ca_alloc(&xb, (size_t)(rows * w) * 4, 4 * (ca_rand() % 16));
            ca_fill_f32(x, rows * w, mode);
            float *rmn = ca_alloc(&b1, (size_t)w * 4, 0), *rmx = ca_alloc(&b2, (size_t)w * 4, 0);
            float *omn = ca_alloc(&b3, (size_t)w * 4, 4), *omx = ca_alloc(&b4, (size_t)w * 4, 4);
            for (int64_t j = 0; j < w; j++) {   /* running columns: empty or finite */
                bool empty = ca_rand() % 3 == 0;
                rmn[j] = omn[j] = empty ? INFINITY : ca_unit();
                rmx[j] = omx[j] = empty ? -INFINITY : ca_unit() + 1.0f;
            }
            uint64_t rn = 5, on = 5;
            ref->minmax_cols(x, rows, w, rmn, rmx, &rn);
            opt->minmax_cols(x, rows, w, omn, omx, &on);
            ca.checks++;
            if (rn != on || memcmp(rmn, omn, (size_t)w * 4) || memcmp(rmx, omx, (size_t)w * 4))
                ca_fail("f32_minmax_cols__%s rows=%lld width=%lld fill=%s differs from C",
                        ISA_NAMES[isa], (long long)rows, (long long)w, FILL_NAMES[mode]);
            ca_free(&xb, "f32_minmax_cols input");
            ca_free(&b1, "f32_minmax_cols__c min");
            ca_free(&b2, "f32_minmax_cols__c max");
            ca_free(&b3, "f32_minmax_cols min");
            ca_free(&b4, "f32_minmax_cols max");
        }
    }
}

static void check_minmax(void)
{
    qcal_minmax_dsp ref, opt;
    qcal_minmax_dsp_init(&ref, QCAL_ISA_C);
    float *big = NULL;
    int64_t n = ca.bench_elements;
    if (ca.bench) {
        big = aligned_alloc(64, (size_t)n * 4);
        ca_fill_f32(big, n, CA_FILL_NORMAL);
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_minmax_dsp_init(&opt, isa);
        if (ca.bench) {
            minmax_bench b = { .dsp = &opt, .x = big, .n = n };
            ca_bench("f32_minmax", isa, (double)n * 4, run_minmax, &b);
            ca_bench("f32_minmax_cols (w=256)", isa, (double)n * 4, run_minmax_cols, &b);
            continue;
        }
        if (ca_test(qcal_minmax_dsp, &ref, &opt, minmax, "f32_minmax", isa))
            check_minmax_flat(&ref, &opt, isa);
        if (ca_test(qcal_minmax_dsp, &ref, &opt, minmax_cols, "f32_minmax_cols", isa))
            check_minmax_cols(&ref, &opt, isa);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    free(big);
    if (!ca.bench)
        ca_count_unrun(qcal_minmax_dsp, qcal_minmax_dsp_init);
}

/* ---- family: half (io/half_dsp.h) ----------------------------------------------------- */

typedef struct half_bench {
    qcal_half_to_f32_fn fn;
    const uint16_t *src;
    float *dst;
    int64_t n;
} half_bench;

static void run_half(void *p)
{
    half_bench *b = p;
    b->fn(b->src, (size_t)b->n, b->dst);
}

/* Every 16-bit pattern once (exhaustive), then the sizes of ca_sizes at unaligned source
 * bytes and destinations, with random patterns. */
static void check_half_fn(qcal_half_to_f32_fn ref, qcal_half_to_f32_fn opt, const char *name,
                          qcal_isa isa)
{
    for (int s = -1; s < CA_NSIZES; s++) {
        int64_t n = s < 0 ? 65536 : ca_sizes[s];
        for (size_t off = 0; off < 4; off++) {
            ca_buf sb, rb, ob;
            uint8_t *src = ca_alloc(&sb, (size_t)n * 2, off);
            for (int64_t i = 0; i < n; i++) {
                uint16_t h = s < 0 ? (uint16_t)i : (uint16_t)ca_rand();
                memcpy(src + 2 * i, &h, 2);
            }
            float *r = ca_alloc(&rb, (size_t)n * 4, 0);
            float *o = ca_alloc(&ob, (size_t)n * 4, 4 * off);
            ref(src, (size_t)n, r);
            opt(src, (size_t)n, o);
            ca.checks++;
            for (int64_t i = 0; i < n; i++)
                if (ca_u32(r[i]) != ca_u32(o[i])) {
                    uint16_t h;
                    memcpy(&h, src + 2 * i, 2);
                    ca_fail("%s__%s n=%lld offset=%zu: 0x%04x -> 0x%08x, C gives 0x%08x", name,
                            ISA_NAMES[isa], (long long)n, off, h, ca_u32(o[i]), ca_u32(r[i]));
                    break;
                }
            ca_free(&sb, name);
            ca_free(&rb, name);
            ca_free(&ob, name);
        }
    }
}

static void check_half(void)
{
    qcal_half_dsp ref, opt;
    qcal_half_dsp_init(&ref, QCAL_ISA_C);
    half_bench b = { .n = ca.bench_elements };
    uint16_t *src = NULL;
    if (ca.bench) {
        src = aligned_alloc(64, (size_t)b.n * 2);
        b.dst = aligned_alloc(64, (size_t)b.n * 4);
        for (int64_t i = 0; i < b.n; i++)
            src[i] = (uint16_t)(0x3c00 + (ca_rand() & 0x3ff));
        b.src = src;
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_half_dsp_init(&opt, isa);
        if (ca.bench) {   /* bytes: 2 read + 4 written per element */
            b.fn = opt.f16_to_f32;
            ca_bench("f16_to_f32_n", isa, (double)b.n * 6, run_half, &b);
            b.fn = opt.bf16_to_f32;
            ca_bench("bf16_to_f32_n", isa, (double)b.n * 6, run_half, &b);
            continue;
        }
        if (ca_test(qcal_half_dsp, &ref, &opt, f16_to_f32, "f16_to_f32_n", isa))
            check_half_fn(ref.f16_to_f32, opt.f16_to_f32, "f16_to_f32_n", isa);
        if (ca_test(qcal_half_dsp, &ref, &opt, bf16_to_f32, "bf16_to_f32_n", isa))
            check_half_fn(ref.bf16_to_f32, opt.bf16_to_f32, "bf16_to_f32_n", isa);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    free(src);
    free(b.dst);
    if (!ca.bench)
        ca_count_unrun(qcal_half_dsp, qcal_half_dsp_init);
}

/* ---- family: metrics (numeric/metrics_dsp.h) ------------------------------------------ */

static uint64_t ca_u64(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

typedef struct metrics_bench {
    const qcal_metrics_dsp *dsp;
    const float *x, *y;
    int64_t n;
    double sink;
} metrics_bench;

/* As numeric/metrics.c calls them: 4 blocks of 4096 elements a call. */
static void run_moments(void *p)
{
    metrics_bench *b = p;
    for (int64_t i = 0; i < b->n; i += 4 * 4096) {
        double mean[4], m2[4];
        b->dsp->moments(b->x + i, 4096, 4, mean, m2);
        b->sink += mean[3] + m2[3];
    }
}

static void run_pair_metrics(void *p)
{
    metrics_bench *b = p;
    for (int64_t i = 0; i < b->n; i += 4096) {
        qcal_numeric_metric_acc a;
        b->dsp->pair_metrics(b->x + i, b->y + i, 4096, &a);
        b->sink += a.sdd;
    }
}

/* Every block count 1..6 (the SIMD versions group 2 or 4 blocks) at each size. */
static void check_moments(const qcal_metrics_dsp *ref, const qcal_metrics_dsp *opt,
                          qcal_isa isa)
{
    static const int finite_fills[] = { CA_FILL_NORMAL, CA_FILL_DENORMAL, CA_FILL_EXTREME };
    for (int s = 0; s < CA_NSIZES; s++) {
        int64_t len = ca_sizes[s];
        if (len == 0)
            continue;   /* precondition len >= 1 */
        for (int64_t blocks = 1; blocks <= 6; blocks++) {
            int f = (int)((s + blocks) % 3);
            ca_buf xb, b1, b2, b3, b4;
            int64_t n = len * blocks;
            float *x = ca_alloc(&xb, (size_t)n * 4, 4 * (ca_rand() % 16));
            ca_fill_f32(x, n, finite_fills[f]);
            if (f == 0 && blocks % 2)   /* a large offset: cancellation in m2 */
                for (int64_t i = 0; i < n; i++)
                    x[i] += 1e4f;
            double *rm = ca_alloc(&b1, (size_t)blocks * 8, 0);
            double *r2 = ca_alloc(&b2, (size_t)blocks * 8, 0);
            double *om = ca_alloc(&b3, (size_t)blocks * 8, 8);
            double *o2 = ca_alloc(&b4, (size_t)blocks * 8, 8);
            ref->moments(x, len, blocks, rm, r2);
            opt->moments(x, len, blocks, om, o2);
            ca.checks++;
            for (int64_t k = 0; k < blocks; k++) {
                double sm, s2;
                qcal_f32_moments__c(x + k * len, len, &sm, &s2);
                if (ca_u64(rm[k]) != ca_u64(sm) || ca_u64(r2[k]) != ca_u64(s2))
                    ca_fail("f32_moments_blocks__c block %lld of %lld differs from one block",
                            (long long)k, (long long)blocks);
                if (ca_u64(rm[k]) != ca_u64(om[k]) || ca_u64(r2[k]) != ca_u64(o2[k])) {
                    ca_fail("f32_moments_blocks__%s len=%lld blocks=%lld block %lld fill=%s: "
                            "(%a, %a) != C (%a, %a)", ISA_NAMES[isa], (long long)len,
                            (long long)blocks, (long long)k, FILL_NAMES[finite_fills[f]],
                            om[k], o2[k], rm[k], r2[k]);
                    break;
                }
            }
            ca_free(&xb, "f32_moments_blocks x");
            ca_free(&b1, "f32_moments_blocks__c mean");
            ca_free(&b2, "f32_moments_blocks__c m2");
            ca_free(&b3, "f32_moments_blocks mean");
            ca_free(&b4, "f32_moments_blocks m2");
        }
    }
}

static void check_pair_metrics(const qcal_metrics_dsp *ref, const qcal_metrics_dsp *opt,
                               qcal_isa isa)
{
    for (int s = 0; s < CA_NSIZES; s++) {
        int64_t n = ca_sizes[s];
        for (int mode = 0; mode < CA_FILL_COUNT; mode++) {
            ca_buf xb, yb;
            float *x = ca_alloc(&xb, (size_t)n * 4, 4 * (ca_rand() % 16));
            float *y = ca_alloc(&yb, (size_t)n * 4, 4 * (ca_rand() % 16));
            ca_fill_f32(x, n, mode == CA_FILL_SPECIAL ? CA_FILL_NORMAL : mode);
            for (int64_t i = 0; i < n; i++)   /* y: x plus quantization-like noise */
                y[i] = x[i] + ca_unit() * 0.01f;
            if (mode == CA_FILL_SPECIAL && n > 0)   /* one non-finite pair, either side */
                (ca_rand() % 2 ? x : y)[ca_rand() % (uint32_t)n] = ca_special();
            if (mode == CA_FILL_EXTREME)   /* x - y overflows to +-inf in places */
                for (int64_t i = 0; i < n; i += 3)
                    y[i] = -x[i];
            qcal_numeric_metric_acc r, o;
            memset(&r, 0x11, sizeof r);
            memset(&o, 0x22, sizeof o);
            ref->pair_metrics(x, y, n, &r);
            opt->pair_metrics(x, y, n, &o);
            ca.checks++;
            if (r.count != o.count || r.nonfinite != o.nonfinite ||
                ca_u64(r.sxx) != ca_u64(o.sxx) || ca_u64(r.syy) != ca_u64(o.syy) ||
                ca_u64(r.sxy) != ca_u64(o.sxy) || ca_u64(r.sdd) != ca_u64(o.sdd) ||
                ca_u64(r.max_abs_err) != ca_u64(o.max_abs_err))
                ca_fail("f32_pair_metrics__%s n=%lld fill=%s: count %lld/%lld nonfinite "
                        "%llu/%llu sxx %a/%a syy %a/%a sxy %a/%a sdd %a/%a max %a/%a (isa/C)",
                        ISA_NAMES[isa], (long long)n, FILL_NAMES[mode], (long long)o.count,
                        (long long)r.count, (unsigned long long)o.nonfinite,
                        (unsigned long long)r.nonfinite, o.sxx, r.sxx, o.syy, r.syy, o.sxy,
                        r.sxy, o.sdd, r.sdd, o.max_abs_err, r.max_abs_err);
            ca_free(&xb, "f32_pair_metrics x");
            ca_free(&yb, "f32_pair_metrics y");
        }
    }
}

static void check_metrics(void)
{
    qcal_metrics_dsp ref, opt;
    qcal_metrics_dsp_init(&ref, QCAL_ISA_C);
    metrics_bench b = { .n = ca.bench_elements & ~(int64_t)16383 };
    float *x = NULL, *y = NULL;
    if (ca.bench) {
        x = aligned_alloc(64, (size_t)b.n * 4);
        y = aligned_alloc(64, (size_t)b.n * 4);
        ca_fill_f32(x, b.n, CA_FILL_NORMAL);
        for (int64_t i = 0; i < b.n; i++)
            y[i] = x[i] + 0.01f;
        b.x = x;
        b.y = y;
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_metrics_dsp_init(&opt, isa);
        if (ca.bench) {
            b.dsp = &opt;
            ca_bench("f32_moments_blocks (4x4096)", isa, (double)b.n * 4, run_moments, &b);
            ca_bench("f32_pair_metrics (4096)", isa, (double)b.n * 8, run_pair_metrics, &b);
            continue;
        }
        if (ca_test(qcal_metrics_dsp, &ref, &opt, moments, "f32_moments_blocks", isa))
            check_moments(&ref, &opt, isa);
        if (ca_test(qcal_metrics_dsp, &ref, &opt, pair_metrics, "f32_pair_metrics", isa))
            check_pair_metrics(&ref, &opt, isa);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    free(x);
    free(y);
    if (!ca.bench)
        ca_count_unrun(qcal_metrics_dsp, qcal_metrics_dsp_init);
}

/* ---- family: quantize (quant/quantize_dsp.h) ------------------------------------------- */

/* Quantize inputs: the ca_fill modes scaled to the code range of scale `s`, plus exact
 * half-way ties (k + 0.5) * s; NaN/Inf/huge values saturate or map to the zero-point. */
static void ca_fill_quant(float *x, int64_t n, int mode, float s)
{
    if (mode == CA_FILL_COUNT) {
        for (int64_t i = 0; i < n; i++)
            x[i] = ((float)(int)(ca_rand() % 601) - 300.0f + 0.5f) * s;
        return;
    }
    ca_fill_f32(x, n, mode);
    if (mode == CA_FILL_NORMAL || mode == CA_FILL_SPECIAL)
        for (int64_t i = 0; i < n; i++)
            x[i] *= s * 16.0f;
}

typedef struct quant_bench {
    const qcal_quantize_dsp *dsp;
    const float *x;
    void *q;
    int64_t n;
} quant_bench;

static void run_quantize_u8(void *p)
{
    quant_bench *b = p;
    b->dsp->quantize_u8(b->x, b->n, 1.0f / 0.037f, 100, b->q);
}

static void run_quantize_i8(void *p)
{
    quant_bench *b = p;
    b->dsp->quantize_i8(b->x, b->n, 1.0f / 0.037f, -3, b->q);
}

static void run_quantize_prow8(void *p)
{
    quant_bench *b = p;
    enum { W = 1024 };
    static float inv[W], lo[W], hi[W];
    static int32_t zp[W];
    for (int i = 0; i < W; i++) {
        zp[i] = i % 256;
        inv[i] = 1.0f / (0.01f + (float)(i % 7) * 0.01f);
        lo[i] = (float)(0 - zp[i]);
        hi[i] = (float)(255 - zp[i]);
    }
    for (int64_t o = 0; o + W <= b->n; o += W)
        b->dsp->quantize_prow8(b->x + o, W, inv, lo, hi, zp, (uint8_t *)b->q + o);
}

/* u8 (is_i8 false) or i8 codes of every size, fill, scale and zero-point, unaligned
 * outputs in canary buffers. */
static void check_quantize_flat(const qcal_quantize_dsp *ref, const qcal_quantize_dsp *opt,
                                qcal_isa isa, bool is_i8)
{
    static const float scales[] = { 0.037f, 0.5f, 1.0f / 3.0f, 1e-3f };
    static const int32_t zu8[] = { 0, 3, 128, 255 }, zi8[] = { -128, -5, 0, 127 };
    const char *name = is_i8 ? "f32_quantize_i8" : "f32_quantize_u8";
    for (int si = 0; si < CA_NSIZES; si++) {
        int64_t n = ca_sizes[si];
        for (int mode = 0; mode <= CA_FILL_COUNT; mode++) {
            for (int k = 0; k < 4; k++) {
                ca_buf xb, ab, bb;
                size_t mis = (size_t)(si + mode + k) % 16;
                float *x = ca_alloc(&xb, (size_t)n * 4, 4 * (mis % 4));
                ca_fill_quant(x, n, mode, scales[k]);
                uint8_t *a = ca_alloc(&ab, (size_t)n, mis), *b = ca_alloc(&bb, (size_t)n, mis);
                int32_t zp = is_i8 ? zi8[(k + si) % 4] : zu8[(k + si) % 4];
                float inv = 1.0f / scales[k];
                if (is_i8) {
                    ref->quantize_i8(x, n, inv, zp, (int8_t *)a);
                    opt->quantize_i8(x, n, inv, zp, (int8_t *)b);
                } else {
                    ref->quantize_u8(x, n, inv, zp, a);
                    opt->quantize_u8(x, n, inv, zp, b);
                }
                ca.checks++;
                for (int64_t i = 0; i < n; i++)
                    if (a[i] != b[i]) {
                        ca_fail("%s__%s n %lld fill %s scale %g zp %d: code %lld is %d, C %d "
                                "(x = %.9g)", name, ISA_NAMES[isa], (long long)n,
                                mode < CA_FILL_COUNT ? FILL_NAMES[mode] : "ties",
                                (double)scales[k], (int)zp, (long long)i, (int)b[i], (int)a[i],
                                (double)x[i]);
                        break;
                    }
                ca_free(&xb, "quantize input");
                ca_free(&ab, "quantize C output");
                ca_free(&bb, name);
            }
        }
    }
}

static void check_quantize_prow8(const qcal_quantize_dsp *ref, const qcal_quantize_dsp *opt,
                                 qcal_isa isa)
{
    for (int si = 0; si < CA_NSIZES; si++) {
        int64_t n = ca_sizes[si];
        for (int mode = 0; mode <= CA_FILL_COUNT; mode++) {
            for (int dt = 0; dt < 2; dt++) {
                int32_t qmin = dt ? -128 : 0, qmax = dt ? 127 : 255;
                ca_buf xb, ib, lb, hb, zb, ab, bb;
                float *x = ca_alloc(&xb, (size_t)n * 4, 0);
                float *inv = ca_alloc(&ib, (size_t)n * 4, 4), *lo = ca_alloc(&lb, (size_t)n * 4, 8);
                float *hi = ca_alloc(&hb, (size_t)n * 4, 12);
                int32_t *zp = ca_alloc(&zb, (size_t)n * 4, 0);
                ca_fill_quant(x, n, mode, 0.25f);
                for (int64_t i = 0; i < n; i++) {
                    float sc = (ca_rand() & 1) ? 0.25f : 1.0f / (float)(1 + ca_rand() % 7);
                    zp[i] = qmin + (int32_t)(ca_rand() % (uint32_t)(qmax - qmin + 1));
                    inv[i] = 1.0f / sc;
                    lo[i] = (float)(qmin - zp[i]);
                    hi[i] = (float)(qmax - zp[i]);
                }
                size_t mis = (size_t)(si + mode) % 16;
                uint8_t *a = ca_alloc(&ab, (size_t)n, mis), *b = ca_alloc(&bb, (size_t)n, mis);
                ref->quantize_prow8(x, n, inv, lo, hi, zp, a);
                opt->quantize_prow8(x, n, inv, lo, hi, zp, b);
                ca.checks++;
                for (int64_t i = 0; i < n; i++)
                    if (a[i] != b[i]) {
                        ca_fail("f32_quantize_prow8__%s %s n %lld fill %s: code %lld is %d, C %d "
                                "(x = %.9g)", ISA_NAMES[isa], dt ? "qint8" : "quint8",
                                (long long)n, mode < CA_FILL_COUNT ? FILL_NAMES[mode] : "ties",
                                (long long)i, (int)b[i], (int)a[i], (double)x[i]);
                        break;
                    }
                ca_free(&xb, "prow8 input");
                ca_free(&ib, "prow8 inv");
                ca_free(&lb, "prow8 lo");
                ca_free(&hb, "prow8 hi");
                ca_free(&zb, "prow8 zp");
                ca_free(&ab, "prow8 C output");
                ca_free(&bb, "f32_quantize_prow8");
            }
        }
    }
}

static void check_quantize(void)
{
    qcal_quantize_dsp ref, opt;
    qcal_quantize_dsp_init(&ref, QCAL_ISA_C);
    float *big = NULL;
    uint8_t *q = NULL;
    int64_t n = ca.bench_elements;
    if (ca.bench) {
        big = aligned_alloc(64, (size_t)n * 4);
        q = aligned_alloc(64, (size_t)n);
        ca_fill_quant(big, n, CA_FILL_NORMAL, 0.037f);
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_quantize_dsp_init(&opt, isa);
        if (ca.bench) {
            quant_bench b = { .dsp = &opt, .x = big, .q = q, .n = n };
            ca_bench("f32_quantize_u8", isa, (double)n * 5, run_quantize_u8, &b);
            ca_bench("f32_quantize_i8", isa, (double)n * 5, run_quantize_i8, &b);
            ca_bench("f32_quantize_prow8 (w=1024)", isa, (double)n * 5, run_quantize_prow8, &b);
            continue;
        }
        if (ca_test(qcal_quantize_dsp, &ref, &opt, quantize_u8, "f32_quantize_u8", isa))
            check_quantize_flat(&ref, &opt, isa, false);
        if (ca_test(qcal_quantize_dsp, &ref, &opt, quantize_i8, "f32_quantize_i8", isa))
            check_quantize_flat(&ref, &opt, isa, true);
        if (ca_test(qcal_quantize_dsp, &ref, &opt, quantize_prow8, "f32_quantize_prow8", isa))
            check_quantize_prow8(&ref, &opt, isa);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    free(big);
    free(q);
    if (!ca.bench)
        ca_count_unrun(qcal_quantize_dsp, qcal_quantize_dsp_init);
}

/* ---- family: fakequant (fakequant/fakequant_dsp.h) ------------------------------------- */

static void fq_run_of(qcal_fq_run *r, float scale, int32_t zp, int32_t qmin, int32_t qmax)
{
    r->scale = scale;
    r->inv_scale = 1.0f / scale;
    r->zp = (float)zp;
    r->qmin = (float)qmin;
    r->qmax = (float)qmax;
}

static bool ca_same_f32(const float *a, const float *b, int64_t n, int64_t *at)
{
    for (int64_t i = 0; i < n; i++)
        if (ca_u32(a[i]) != ca_u32(b[i])) {
            *at = i;
            return false;
        }
    return true;
}

typedef struct fq_bench {
    const qcal_fakequant_dsp *dsp;
    const float *x, *gy;
    float *y, *gx;
    uint8_t *m;
    int64_t n;
    double sink;
} fq_bench;

static void run_fq_fwd(void *p)
{
    fq_bench *b = p;
    qcal_fq_run r;
    fq_run_of(&r, 0.037f, 100, 0, 255);
    b->dsp->fakequant(b->x, b->n, &r, b->y, NULL, true);
}

static void run_fq_fused(void *p)
{
    fq_bench *b = p;
    qcal_fq_run r;
    fq_run_of(&r, 0.037f, 100, 0, 255);
    b->dsp->fakequant_fused(b->x, b->gy, b->n, &r, b->y, b->gx, true);
}

static void run_fq_bwd(void *p)
{
    fq_bench *b = p;
    b->dsp->fakequant_backward(b->gy, b->m, b->n, b->gx, true);
}

static void run_lsq_bwd(void *p)
{
    fq_bench *b = p;
    qcal_lsq_run r = { .scale = 0.037f, .inv_scale = 1.0f / 0.037f, .zp = 100.0f, .qmin = 0.0f,
                       .qmax = 255.0f, .grad_factor = 1.0f };
    double as[QCAL_LSQ_LANES] = { 0 }, az[QCAL_LSQ_LANES] = { 0 };
    b->dsp->lsq_backward(b->x, b->gy, b->n, &r, b->gx, as, az, true);
    b->sink += as[0] + az[0];
}

/* Forward, fused and backward of every size and fill, plain and streaming stores, every
 * output alignment (0..16 floats past a 64-byte boundary), in place, canary-guarded. */
static void check_fq_passes(const qcal_fakequant_dsp *ref, const qcal_fakequant_dsp *opt,
                            qcal_isa isa, int which)
{
    static const char *const names[3] = { "f32_fakequant", "f32_fakequant_fused",
                                          "f32_fakequant_backward" };
    qcal_fq_run r;
    for (int si = 0; si < CA_NSIZES; si++) {
        int64_t n = ca_sizes[si];
        for (int mode = 0; mode <= CA_FILL_COUNT; mode++) {
            int cfg = (si + mode) % 3;
            if (cfg == 0)
                fq_run_of(&r, 0.037f, 7, -8, 120);
            else if (cfg == 1)
                fq_run_of(&r, 0.02f, 10, 0, 127);
            else
                fq_run_of(&r, 1e-3f, -128, -128, 127);
            ca_buf xb, gb, mb;
            float *x = ca_alloc(&xb, (size_t)n * 4, 0), *gy = ca_alloc(&gb, (size_t)n * 4, 4);
            uint8_t *m = ca_alloc(&mb, (size_t)n, 1);
            ca_fill_quant(x, n, mode, r.scale);
            ca_fill_f32(gy, n, mode == CA_FILL_SPECIAL ? CA_FILL_SPECIAL : CA_FILL_NORMAL);
            for (int64_t i = 0; i < n; i++)
                m[i] = (uint8_t)(ca_rand() & 1);
            float *yr = malloc((size_t)n * 4 + 4), *gr = malloc((size_t)n * 4 + 4);
            uint8_t *mr = malloc((size_t)n + 1);
            if (which == 0)
                ref->fakequant(x, n, &r, yr, mr, false);
            else if (which == 1)
                ref->fakequant_fused(x, gy, n, &r, yr, gr, false);
            else
                ref->fakequant_backward(gy, m, n, gr, false);
            for (int st = 0; st < 2; st++) {
                for (int off = 0; off < 17; off += (n > 64 ? 4 : 1)) {
                    ca_buf yb, ob, kb;
                    float *y = ca_alloc(&yb, (size_t)n * 4, 4 * (size_t)off);
                    float *o = ca_alloc(&ob, (size_t)n * 4, 4 * (size_t)((off * 5) % 17));
                    uint8_t *k = ca_alloc(&kb, (size_t)n, (size_t)off);
                    int64_t at = -1;
                    bool ok = true;
                    if (which == 0) {
                        opt->fakequant(x, n, &r, y, k, st);
                        ok = ca_same_f32(y, yr, n, &at) && !memcmp(k, mr, (size_t)n);
                    } else if (which == 1) {
                        opt->fakequant_fused(x, gy, n, &r, y, o, st);
                        ok = ca_same_f32(y, yr, n, &at) && ca_same_f32(o, gr, n, &at);
                        /* in place */
                        memcpy(y, x, (size_t)n * 4);
                        memcpy(o, gy, (size_t)n * 4);
                        opt->fakequant_fused(y, o, n, &r, y, o, st);
                        ok = ok && ca_same_f32(y, yr, n, &at) && ca_same_f32(o, gr, n, &at);
                    } else {
                        opt->fakequant_backward(gy, m, n, o, st);
                        ok = ca_same_f32(o, gr, n, &at);
                        memcpy(o, gy, (size_t)n * 4);
                        opt->fakequant_backward(o, m, n, o, st);   /* in place */
                        ok = ok && ca_same_f32(o, gr, n, &at);
                    }
                    ca.checks++;
                    if (!ok)
                        ca_fail("%s__%s n %lld fill %s stream %d offset %d: differs from C "
                                "(element %lld, x = %.9g)", names[which], ISA_NAMES[isa],
                                (long long)n, mode < CA_FILL_COUNT ? FILL_NAMES[mode] : "ties",
                                st, off, (long long)at, at >= 0 ? (double)x[at] : 0.0);
                    ca_free(&yb, names[which]);
                    ca_free(&ob, names[which]);
                    ca_free(&kb, names[which]);
                }
            }
            free(yr);
            free(gr);
            free(mr);
            ca_free(&xb, "fakequant input");
            ca_free(&gb, "fakequant gradient");
            ca_free(&mb, "fakequant mask");
        }
    }
}

/* Lane accumulators: the same bits, or both NaN (which NaN payload survives a sum of two
 * NaNs depends on the operand order the compiler picks for a commutative add). */
static bool lanes_same(const double *a, const double *b)
{
    for (int l = 0; l < QCAL_LSQ_LANES; l++) {
        uint64_t x, y;
        memcpy(&x, &a[l], 8);
        memcpy(&y, &b[l], 8);
        if (x != y && !(isnan(a[l]) && isnan(b[l])))
            return false;
    }
    return true;
}

/* LSQ backward: grad_x bits and the 16 lane accumulators (starting from random values)
 * bit-identical to C, every size/fill/alignment, plain and streaming. */
static void check_lsq(const qcal_fakequant_dsp *ref, const qcal_fakequant_dsp *opt, qcal_isa isa)
{
    for (int si = 0; si < CA_NSIZES; si++) {
        int64_t n = ca_sizes[si];
        for (int mode = 0; mode <= CA_FILL_COUNT; mode++) {
            float zp = (float)(int)(ca_rand() % 200);
            qcal_lsq_run r = { .scale = 0.037f, .inv_scale = 1.0f / 0.037f, .zp = zp,
                               .qmin = 0.0f, .qmax = 255.0f,
                               .grad_factor = 1.0f / (float)(1 + ca_rand() % 100) };
            ca_buf xb, gb;
            float *x = ca_alloc(&xb, (size_t)n * 4, 0), *gy = ca_alloc(&gb, (size_t)n * 4, 8);
            ca_fill_quant(x, n, mode, r.scale);
            ca_fill_f32(gy, n, mode == CA_FILL_SPECIAL ? CA_FILL_SPECIAL : CA_FILL_NORMAL);
            double init_s[QCAL_LSQ_LANES], init_z[QCAL_LSQ_LANES];
            for (int l = 0; l < QCAL_LSQ_LANES; l++) {
                init_s[l] = ca_unit() * 1e-3;
                init_z[l] = ca_unit() * 1e-3;
            }
            double rs[QCAL_LSQ_LANES], rz[QCAL_LSQ_LANES];
            memcpy(rs, init_s, sizeof rs);
            memcpy(rz, init_z, sizeof rz);
            float *gref = malloc((size_t)n * 4 + 4);
            ref->lsq_backward(x, gy, n, &r, gref, rs, rz, false);
            for (int st = 0; st < 2; st++) {
                for (int off = 0; off < 17; off += (n > 64 ? 4 : 1)) {
                    ca_buf ob;
                    float *o = ca_alloc(&ob, (size_t)n * 4, 4 * (size_t)off);
                    double as[QCAL_LSQ_LANES], az[QCAL_LSQ_LANES];
                    memcpy(as, init_s, sizeof as);
                    memcpy(az, init_z, sizeof az);
                    opt->lsq_backward(x, gy, n, &r, o, as, az, st);
                    int64_t at = -1;
                    bool ok = ca_same_f32(o, gref, n, &at);
                    ok = ok && lanes_same(as, rs) && lanes_same(az, rz);
                    /* without grad_x */
                    memcpy(as, init_s, sizeof as);
                    memcpy(az, init_z, sizeof az);
                    opt->lsq_backward(x, gy, n, &r, NULL, as, az, st);
                    ok = ok && lanes_same(as, rs) && lanes_same(az, rz);
                    ca.checks++;
                    if (!ok)
                        ca_fail("f32_lsq_backward__%s n %lld fill %s stream %d offset %d: "
                                "differs from C (grad_x element %lld)", ISA_NAMES[isa],
                                (long long)n, mode < CA_FILL_COUNT ? FILL_NAMES[mode] : "ties",
                                st, off, (long long)at);
                    ca_free(&ob, "f32_lsq_backward grad_x");
                }
            }
            free(gref);
            ca_free(&xb, "lsq input");
            ca_free(&gb, "lsq gradient");
        }
    }
}

static void check_fakequant(void)
{
    qcal_fakequant_dsp ref, opt;
    qcal_fakequant_dsp_init(&ref, QCAL_ISA_C);
    fq_bench b = { 0 };
    int64_t n = ca.bench_elements;
    if (ca.bench) {
        float *x = aligned_alloc(64, (size_t)n * 4), *gy = aligned_alloc(64, (size_t)n * 4);
        b.y = aligned_alloc(64, (size_t)n * 4);
        b.gx = aligned_alloc(64, (size_t)n * 4);
        b.m = aligned_alloc(64, (size_t)n);
        ca_fill_quant(x, n, CA_FILL_NORMAL, 0.037f);
        ca_fill_f32(gy, n, CA_FILL_NORMAL);
        for (int64_t i = 0; i < n; i++)
            b.m[i] = (uint8_t)(i & 1);
        b.x = x;
        b.gy = gy;
        b.n = n;
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_fakequant_dsp_init(&opt, isa);
        if (ca.bench) {
            b.dsp = &opt;
            ca_bench("f32_fakequant", isa, (double)n * 8, run_fq_fwd, &b);
            ca_bench("f32_fakequant_fused", isa, (double)n * 16, run_fq_fused, &b);
            ca_bench("f32_fakequant_backward", isa, (double)n * 9, run_fq_bwd, &b);
            ca_bench("f32_lsq_backward", isa, (double)n * 12, run_lsq_bwd, &b);
            continue;
        }
        if (ca_test(qcal_fakequant_dsp, &ref, &opt, fakequant, "f32_fakequant", isa))
            check_fq_passes(&ref, &opt, isa, 0);
        if (ca_test(qcal_fakequant_dsp, &ref, &opt, fakequant_fused, "f32_fakequant_fused", isa))
            check_fq_passes(&ref, &opt, isa, 1);
        if (ca_test(qcal_fakequant_dsp, &ref, &opt, fakequant_backward, "f32_fakequant_backward",
                    isa))
            check_fq_passes(&ref, &opt, isa, 2);
        if (ca_test(qcal_fakequant_dsp, &ref, &opt, lsq_backward, "f32_lsq_backward", isa))
            check_lsq(&ref, &opt, isa);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    if (ca.bench) {
        free((void *)b.x);
        free((void *)b.gy);
        free(b.y);
        free(b.gx);
        free(b.m);
    }
    if (!ca.bench)
        ca_count_unrun(qcal_fakequant_dsp, qcal_fakequant_dsp_init);
}

/* ---- family: float8 (quant/float8_dsp.h) ---------------------------------------------- */

/* FP8 test values: the common fills scaled around s * 2^k (k spanning the format's
 * exponents), plus mode CA_FILL_COUNT: exact ties (midpoints of neighbouring grid values,
 * s a power of two), and CA_FILL_COUNT + 1: arbitrary float32 bit patterns. */
static void ca_fill_f8(float *x, int64_t n, int mode, float s, int fmt)
{
    const float mx = fmt == QCAL_F8_E4M3FN ? 448.0f : 57344.0f;
    const int lo = fmt == QCAL_F8_E4M3FN ? -12 : -19, span = fmt == QCAL_F8_E4M3FN ? 24 : 37;
    if (mode == CA_FILL_COUNT) {
        for (int64_t i = 0; i < n; i++) {
            /* a random magnitude on the grid and the next one up: their midpoint */
            float a = ldexpf(1.0f + (float)(ca_rand() % 8) / 8.0f, lo + (int)(ca_rand() % (uint32_t)span));
            a = a > mx ? mx : a;
            int e;
            frexpf(a, &e);
            int mb = fmt == QCAL_F8_E4M3FN ? 3 : 2, emin = fmt == QCAL_F8_E4M3FN ? -6 : -14;
            int q = (e - 1 < emin ? emin : e - 1) - mb;   /* grid step exponent */
            float v = a + ldexpf(0.5f, q);
            x[i] = (ca_rand() & 1 ? -v : v) * s;
        }
        return;
    }
    if (mode == CA_FILL_COUNT + 1) {
        for (int64_t i = 0; i < n; i++)
            x[i] = ca_bits(ca_rand());
        return;
    }
    ca_fill_f32(x, n, mode);
    if (mode == CA_FILL_NORMAL || mode == CA_FILL_SPECIAL)
        for (int64_t i = 0; i < n; i++)
            x[i] *= s * ldexpf(1.0f, lo + (int)(ca_rand() % (uint32_t)span));
}

typedef struct f8_bench {
    const qcal_float8_dsp *dsp;
    const float *x, *gy;
    float *y, *gx;
    uint8_t *q;
    int64_t n;
} f8_bench;

static void run_f8_quantize(void *p)
{
    f8_bench *b = p;
    b->dsp->quantize(b->x, b->n, 0.01f, QCAL_F8_E4M3FN, b->q, true);
}

static void run_f8_dequantize(void *p)
{
    f8_bench *b = p;
    b->dsp->dequantize(b->q, b->n, 0.01f, QCAL_F8_E4M3FN, b->y);
}

static void run_f8_fq_fwd(void *p)
{
    f8_bench *b = p;
    b->dsp->fakequant(b->x, b->n, 0.01f, QCAL_F8_E4M3FN, b->y, NULL, true);
}

static void run_f8_fq_fused(void *p)
{
    f8_bench *b = p;
    b->dsp->fakequant_fused(b->x, b->gy, b->n, 0.01f, QCAL_F8_E4M3FN, b->y, b->gx, true);
}

/* Every slot (0 quantize, 1 dequantize, 2 fakequant, 3 fused) of every size, fill, format
 * and scale (powers of two and not), unaligned and streaming outputs, in canary buffers. */
static void check_f8_slot(const qcal_float8_dsp *ref, const qcal_float8_dsp *opt, qcal_isa isa,
                          int which)
{
    static const char *const names[4] = { "f32_quantize_f8", "f8_dequantize",
                                          "f32_fakequant_f8", "f32_fakequant_f8_fused" };
    static const float scales[] = { 1.0f, 0.0078125f, 0.037f, 3.0f / 448.0f, 1e-30f, 1e30f };
    for (int si = 0; si < CA_NSIZES; si++) {
        int64_t n = ca_sizes[si];
        for (int mode = 0; mode <= CA_FILL_COUNT + 1; mode++) {
            for (int fmt = 0; fmt < 2; fmt++) {
                float sc = scales[(si + mode + fmt) % 6];
                if (mode == CA_FILL_COUNT && !(sc == 1.0f || sc == 0.0078125f))
                    sc = 0.0078125f;
                ca_buf xb, gb, qb;
                size_t mis = (size_t)(si + mode) % 16;
                float *x = ca_alloc(&xb, (size_t)n * 4, 4 * (mis % 4));
                float *gy = ca_alloc(&gb, (size_t)n * 4, 4);
                uint8_t *q = ca_alloc(&qb, (size_t)n, mis);
                ca_fill_f8(x, n, mode, sc, fmt);
                ca_fill_f32(gy, n, mode == CA_FILL_SPECIAL ? CA_FILL_SPECIAL : CA_FILL_NORMAL);
                for (int64_t i = 0; i < n; i++)
                    q[i] = (uint8_t)(i < 256 && mode == 0 ? i : ca_rand());
                float *yr = malloc((size_t)n * 4 + 4), *gr = malloc((size_t)n * 4 + 4);
                uint8_t *mr = malloc((size_t)n + 1);
                if (which == 0)
                    ref->quantize(x, n, sc, fmt, mr, false);
                else if (which == 1)
                    ref->dequantize(q, n, sc, fmt, yr);
                else if (which == 2)
                    ref->fakequant(x, n, sc, fmt, yr, mr, false);
                else
                    ref->fakequant_fused(x, gy, n, sc, fmt, yr, gr, false);
                for (int st = 0; st < (which != 1 ? 2 : 1); st++) {
                    for (int off = 0; off < 17; off += (n > 64 ? 4 : 1)) {
                        ca_buf yb, ob, kb;
                        float *y = ca_alloc(&yb, (size_t)n * 4, 4 * (size_t)off);
                        float *o = ca_alloc(&ob, (size_t)n * 4, 4 * (size_t)((off * 5) % 17));
                        uint8_t *k = ca_alloc(&kb, (size_t)n, (size_t)off);
                        int64_t at = -1;
                        bool ok = true;
                        if (which == 0) {
                            opt->quantize(x, n, sc, fmt, k, st);
                            for (int64_t i = 0; i < n && ok; i++)
                                if (k[i] != mr[i]) {
                                    ok = false;
                                    at = i;
                                }
                        } else if (which == 1) {
                            opt->dequantize(q, n, sc, fmt, y);
                            ok = ca_same_f32(y, yr, n, &at);
                        } else if (which == 2) {
                            opt->fakequant(x, n, sc, fmt, y, k, st);
                            ok = ca_same_f32(y, yr, n, &at);
                            for (int64_t i = 0; i < n && ok; i++)
                                if (k[i] != mr[i]) {
                                    ok = false;
                                    at = i;
                                }
                        } else {
                            opt->fakequant_fused(x, gy, n, sc, fmt, y, o, st);
                            ok = ca_same_f32(y, yr, n, &at) && ca_same_f32(o, gr, n, &at);
                        }
                        ca.checks++;
                        if (!ok)
                            ca_fail("%s__%s %s n %lld fill %d scale %g stream %d offset %d: "
                                    "element %lld differs (x = %a, code %d)", names[which],
                                    ISA_NAMES[isa], fmt ? "e5m2" : "e4m3fn", (long long)n, mode,
                                    (double)sc, st, off, (long long)at,
                                    (double)(at >= 0 ? x[at] : 0.0f), at >= 0 ? q[at] : -1);
                        ca_free(&yb, names[which]);
                        ca_free(&ob, names[which]);
                        ca_free(&kb, names[which]);
                    }
                }
                /* in place (fake-quant: dst == src; fused: gx == gy as well) */
                if (which >= 2 && n > 0) {
                    float *y = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
                    memcpy(y, x, (size_t)n * 4);
                    memcpy(g, gy, (size_t)n * 4);
                    int64_t at = -1;
                    if (which == 2)
                        opt->fakequant(y, n, sc, fmt, y, NULL, true);
                    else
                        opt->fakequant_fused(y, g, n, sc, fmt, y, g, true);
                    ca.checks++;
                    if (!ca_same_f32(y, yr, n, &at) || (which == 3 && !ca_same_f32(g, gr, n, &at)))
                        ca_fail("%s__%s in place n %lld: element %lld differs", names[which],
                                ISA_NAMES[isa], (long long)n, (long long)at);
                    free(y);
                    free(g);
                }
                free(yr);
                free(gr);
                free(mr);
                ca_free(&xb, "float8 input");
                ca_free(&gb, "float8 gradient");
                ca_free(&qb, "float8 codes");
            }
        }
    }
}

static void check_float8(void)
{
    qcal_float8_dsp ref, opt;
    qcal_float8_dsp_init(&ref, QCAL_ISA_C);
    f8_bench b = { 0 };
    int64_t n = ca.bench_elements;
    if (ca.bench) {
        float *x = aligned_alloc(64, (size_t)n * 4), *gy = aligned_alloc(64, (size_t)n * 4);
        b.y = aligned_alloc(64, (size_t)n * 4);
        b.gx = aligned_alloc(64, (size_t)n * 4);
        b.q = aligned_alloc(64, (size_t)n);
        ca_fill_f8(x, n, CA_FILL_NORMAL, 0.01f, QCAL_F8_E4M3FN);
        ca_fill_f32(gy, n, CA_FILL_NORMAL);
        for (int64_t i = 0; i < n; i++)
            b.q[i] = (uint8_t)ca_rand();
        b.x = x;
        b.gy = gy;
        b.n = n;
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_float8_dsp_init(&opt, isa);
        if (ca.bench) {
            b.dsp = &opt;
            ca_bench("f32_quantize_f8 (e4m3fn)", isa, (double)n * 5, run_f8_quantize, &b);
            ca_bench("f8_dequantize (e4m3fn)", isa, (double)n * 5, run_f8_dequantize, &b);
            ca_bench("f32_fakequant_f8", isa, (double)n * 8, run_f8_fq_fwd, &b);
            ca_bench("f32_fakequant_f8_fused", isa, (double)n * 16, run_f8_fq_fused, &b);
            continue;
        }
        if (ca_test(qcal_float8_dsp, &ref, &opt, quantize, "f32_quantize_f8", isa))
            check_f8_slot(&ref, &opt, isa, 0);
        if (ca_test(qcal_float8_dsp, &ref, &opt, dequantize, "f8_dequantize", isa))
            check_f8_slot(&ref, &opt, isa, 1);
        if (ca_test(qcal_float8_dsp, &ref, &opt, fakequant, "f32_fakequant_f8", isa))
            check_f8_slot(&ref, &opt, isa, 2);
        if (ca_test(qcal_float8_dsp, &ref, &opt, fakequant_fused, "f32_fakequant_f8_fused", isa))
            check_f8_slot(&ref, &opt, isa, 3);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    if (ca.bench) {
        free((void *)b.x);
        free((void *)b.gy);
        free(b.y);
        free(b.gx);
        free(b.q);
    }
    if (!ca.bench) {
        ca_count_unrun(qcal_float8_dsp, qcal_float8_dsp_init);
        /* what the library calls: the table of the best ISA this CPU runs, never above */
        qcal_float8_dsp best;
        qcal_float8_dsp_init(&best, qcal_cpu_isa());
        ca.checks++;
        if (memcmp(&best, qcal_float8_dsp_get(), sizeof best))
            ca_fail("qcal_float8_dsp_get() is not the %s table", ISA_NAMES[qcal_cpu_isa()]);
#if defined(__x86_64__) || defined(__i386__)
        ca.checks++;
        if (qcal_cpu_isa() >= QCAL_ISA_AVX512 &&
            !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")))
            ca_fail("AVX-512 selected on a CPU without AVX-512 F/BW/DQ/VL");
#endif
    }
}

/* ---- family: histogram (observers/histogram_dsp.h) ------------------------------------ */

/* One grid of either kind; ncount / stride: counted slots and sub-histogram slots. */
typedef struct hist_case {
    bool lattice;
    qcal_histc_grid hg;
    qcal_lattice_grid lg;
} hist_case;

static int32_t hist_ncount(const hist_case *c)
{
    return c->lattice ? c->lg.accept : c->hg.bins + 1;
}

static int32_t hist_stride(const hist_case *c)
{
    return c->lattice ? c->lg.accept + 1 : c->hg.bins + 2;
}

/* Runs slot `which` (0 histc, 1 histc_inside, 2 lattice_bin, 3 lattice_bin_until) of dsp on
 * x with canary-guarded counts (starting from `init`) and sub-histogram scratch. */
typedef struct hist_out {
    uint64_t *counts;
    bool binned;
    int64_t upto;       /* lattice_bin_until's return */
    float mn, mx;
    uint64_t nonfinite;
} hist_out;

static void hist_run(const qcal_histogram_dsp *dsp, int which, const hist_case *c,
                     const float *x, int64_t n, const uint64_t *init, hist_out *o,
                     const char *name)
{
    int32_t nc = hist_ncount(c), st = hist_stride(c);
    ca_buf cb, sb;
    uint64_t *counts = ca_alloc(&cb, (size_t)nc * 8, 8 * (ca_rand() % 3));
    memcpy(counts, init, (size_t)nc * 8);
    size_t subn = (size_t)QCAL_HIST_SUB_COPIES * (size_t)st;
    qcal_hist_sub *sub = ca_alloc(&sb, subn * sizeof *sub, 2 * (ca_rand() % 3));
    memset(sub, 0, subn * sizeof *sub);
    o->binned = true;
    o->upto = -1;
    o->mn = o->mx = 7.0f;
    o->nonfinite = 7;
    switch (which) {
    case 0: dsp->histc(x, n, &c->hg, counts, sub); break;
    case 1:
        o->binned = dsp->histc_inside(x, n, &c->hg, counts, sub, &o->mn, &o->mx, &o->nonfinite);
        break;
    case 2: dsp->lattice_bin(x, n, &c->lg, counts, sub); break;
    default:
        o->upto = dsp->lattice_bin_until(x, n, &c->lg, counts, sub, &o->mn, &o->mx,
                                         &o->nonfinite);
        break;
    }
    for (size_t i = 0; i < subn; i++)
        if (sub[i]) {
            ca_fail("%s n %lld: sub-histogram slot %zu left at %u", name, (long long)n, i,
                    (unsigned)sub[i]);
            break;
        }
    o->counts = malloc((size_t)nc * 8 + 8);
    memcpy(o->counts, counts, (size_t)nc * 8);
    ca_free(&cb, name);
    ca_free(&sb, name);
}

/* Grids: first-batch (signed, |x|, 1 and 7 bins, 2048 bins, a range overflowing float that
 * takes the double formula, a denormal range, 16382 and 16383 bins) and lattice (cell widths
 * 2^-20..2^20 and 2^140 where products underflow, windows of 1, 64, 4096, 16383 and 16384
 * cells, signed and |x|). */
static void hist_case_make(hist_case *c, bool lattice, int k)
{
    memset(c, 0, sizeof *c);
    c->lattice = lattice;
    if (!lattice) {
        static const struct { float lo, hi; int32_t bins; bool absval; } G[] = {
            { -2048.0f, 2048.0f, 2048, false }, { 0.0f, 1500.0f, 2048, true },
            { -3.0f, 2.5f, 7, false },          { 0.0f, 2.5f, 1, true },
            { -1.0f, 900.0f, 256, false },      { -FLT_MAX, FLT_MAX, 256, false },
            { 0.0f, 1e-38f, 100, true },        { -1e-38f, 2e-39f, 33, false },
            /* the largest grid whose ring slots carry their copy's offset (stride 16384:
             * offset slots up to 65535), and the smallest that keeps plain slots */
            { -1.0f, 1.0f, 16382, false },      { 0.0f, 3.0f, 16383, true },
        };
        int g = k % (int)(sizeof G / sizeof G[0]);
        c->hg.lo = G[g].lo;
        c->hg.hi = G[g].hi;
        c->hg.bins = G[g].bins;
        c->hg.absval = G[g].absval;
    } else {
        static const int32_t accepts[5] = { 1, 64, 4096, 16383, 16384 };
        int32_t e = k % 7 == 0 ? 140 : (int32_t)(ca_rand() % 41) - 20;
        c->lg.scale = ldexpf(1.0f, -e);
        c->lg.absval = (k & 1) != 0;
        c->lg.accept = accepts[k % 5];
        c->lg.jlo = c->lg.absval ? 0 : -(int32_t)(ca_rand() % (uint32_t)(c->lg.accept + 1));
    }
}

/* Values inside the grid (so that fused kernels bin), then maybe one outside at a random
 * place. */
static void hist_fill_inside(float *x, int64_t n, const hist_case *c, bool one_outside)
{
    float lo, hi;
    if (!c->lattice) {
        lo = c->hg.absval ? -c->hg.hi : c->hg.lo;
        hi = c->hg.hi;
        if (!isfinite(hi - lo)) {
            lo *= 0.5f;
            hi *= 0.5f;
        }
    } else {
        double w = ldexp(1.0, 0) / (double)c->lg.scale;
        double a = (double)c->lg.jlo * w, b = ((double)c->lg.jlo + c->lg.accept) * w;
        lo = (float)a;
        hi = (float)b;
        if (c->lg.absval)
            lo = -hi;
        lo = fmaxf(lo, -FLT_MAX);   /* windows past float's range (cells of 2^140) */
        hi = fminf(hi, FLT_MAX);
    }
    for (int64_t i = 0; i < n; i++) {
        double u = ((double)ca_rand() / 4294967296.0);
        float v = (float)((double)lo + u * ((double)hi - (double)lo));
        if (v < lo)
            v = lo;
        if (v >= hi && c->lattice)
            v = nextafterf(hi, lo);
        if (v > hi)
            v = hi;
        if (ca_rand() % 16 == 0)   /* exact edges */
            v = ca_rand() & 1 ? lo : (c->lattice ? v : hi);
        x[i] = v;
    }
    if (n > 0 && ca_rand() % 8 == 0)
        x[ca_rand() % n] = NAN;
    if (one_outside && n > 0) {
        float big = c->lattice ? (float)(((double)c->lg.jlo + c->lg.accept + 1) /
                                         (double)c->lg.scale)
                               : hi + fabsf(hi) + 1.0f;
        if (!isfinite(big))
            big = FLT_MAX;
        x[ca_rand() % n] = big;
    }
}

static void check_hist_slot(const qcal_histogram_dsp *ref, const qcal_histogram_dsp *opt,
                            qcal_isa isa, int which)
{
    static const char *const names[4] = { "f32_histc", "f32_histc_inside", "f32_lattice_bin",
                                          "f32_lattice_bin_until" };
    const bool lattice = which >= 2, fused = which & 1;
    /* extra sizes: across two fused check blocks (64 chunks of 64) and past a flush */
    static const int64_t extra[] = { 8191, 8193, 12345, 262080 + 4096 + 3 };
    char name[64];
    snprintf(name, sizeof name, "%s__%s", names[which], ISA_NAMES[isa]);
    for (int si = 0; si < CA_NSIZES + 4; si++) {
        int64_t n = si < CA_NSIZES ? ca_sizes[si] : extra[si - CA_NSIZES];
        int modes = n > 20000 ? 2 : CA_FILL_COUNT + 2;
        for (int mode = 0; mode < modes; mode++) {
            hist_case c;
            hist_case_make(&c, lattice, (int)(ca_rand() % 64));
            ca_buf xb;
            size_t mis = ca_rand() % 16;
            float *x = ca_alloc(&xb, (size_t)n * 4, mis * 4);
            if (n > 20000) {
                /* one hot value (the sub-histogram flush), inside or on the top edge */
                float v = mode ? (lattice ? 0.0f : c.hg.hi) : (lattice ? -0.0f : c.hg.lo);
                if (lattice && !c.lg.absval && c.lg.jlo > 0)
                    v = (float)((double)c.lg.jlo / (double)c.lg.scale);
                for (int64_t i = 0; i < n; i++)
                    x[i] = v;
            } else if (mode < CA_FILL_COUNT) {
                ca_fill_f32(x, n, mode);
            } else {
                hist_fill_inside(x, n, &c, mode == CA_FILL_COUNT + 1);
            }
            float *copy = malloc((size_t)n * 4 + 4);
            memcpy(copy, x, (size_t)n * 4);
            int32_t nc = hist_ncount(&c);
            uint64_t *init = malloc((size_t)nc * 8);
            for (int32_t b = 0; b < nc; b++)
                init[b] = ca_rand() % 3 == 0 ? ca_rand() : 0;
            hist_out r, o;
            hist_run(ref, which, &c, x, n, init, &r, names[which]);
            hist_run(opt, which, &c, x, n, init, &o, name);
            ca.checks++;
            bool same = r.binned == o.binned && r.upto == o.upto;
            if (fused)
                same = same && same_extreme(r.mn, o.mn) && same_extreme(r.mx, o.mx) &&
                       r.nonfinite == o.nonfinite;
            int32_t at = -1;
            if (same && r.binned)
                for (int32_t b = 0; b < nc && at < 0; b++)
                    if (r.counts[b] != o.counts[b])
                        at = b;
            if (!same || at >= 0)
                ca_fail("%s n %lld fill %d grid %s: differs from C (binned %d/%d, binned up to "
                        "%lld/%lld, min %a/%a, max %a/%a, non-finite %llu/%llu, first differing "
                        "slot %d)", name, (long long)n, mode, lattice ? "lattice" : "first-batch",
                        o.binned, r.binned, (long long)o.upto, (long long)r.upto,
                        (double)o.mn, (double)r.mn, (double)o.mx, (double)r.mx,
                        (unsigned long long)o.nonfinite, (unsigned long long)r.nonfinite, at);
            if (memcmp(copy, x, (size_t)n * 4))
                ca_fail("%s n %lld wrote into its input", name, (long long)n);
            free(r.counts);
            free(o.counts);
            free(init);
            free(copy);
            ca_free(&xb, name);
        }
    }
}

typedef struct hist_bench {
    const qcal_histogram_dsp *dsp;
    const float *x;
    int64_t n;
    qcal_histc_grid hg;
    qcal_lattice_grid lg;
    uint64_t *counts;
    qcal_hist_sub *sub;
    double sink;
} hist_bench;

static void run_histc(void *p)
{
    hist_bench *b = p;
    b->dsp->histc(b->x, b->n, &b->hg, b->counts, b->sub);
}

static void run_histc_inside(void *p)
{
    hist_bench *b = p;
    float mn, mx;
    uint64_t nf;
    b->sink += b->dsp->histc_inside(b->x, b->n, &b->hg, b->counts, b->sub, &mn, &mx, &nf);
}

static void run_lattice_bin(void *p)
{
    hist_bench *b = p;
    b->dsp->lattice_bin(b->x, b->n, &b->lg, b->counts, b->sub);
}

static void run_lattice_bin_until(void *p)
{
    hist_bench *b = p;
    float mn, mx;
    uint64_t nf;
    b->sink += (double)b->dsp->lattice_bin_until(b->x, b->n, &b->lg, b->counts, b->sub, &mn,
                                                 &mx, &nf);
}

static void check_histogram(void)
{
    qcal_histogram_dsp ref, opt;
    qcal_histogram_dsp_init(&ref, QCAL_ISA_C);
    hist_bench b = { 0 };
    if (ca.bench) {
        /* N(0, 1) values (sum of 4 uniforms, scaled), 2048 bins over their range, and the
         * lattice the observer keeps for them (2 * 2048 cells). */
        int64_t n = ca.bench_elements;
        float *x = aligned_alloc(64, (size_t)n * 4);
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            float s = ca_unit() + ca_unit() + ca_unit() + ca_unit();
            x[i] = s * 0.8660254f;
            lo = fminf(lo, x[i]);
            hi = fmaxf(hi, x[i]);
        }
        b.x = x;
        b.n = n;
        b.hg = (qcal_histc_grid){ .lo = lo, .hi = hi, .bins = 2048, .absval = false };
        int32_t e = qcal_lattice_exponent(lo, hi, 4096);
        b.lg.scale = ldexpf(1.0f, -e);
        b.lg.jlo = (int32_t)floor(ldexp((double)lo, -e));
        b.lg.accept = 4096;
        b.lg.absval = false;
        b.counts = calloc(4097, 8);
        b.sub = calloc((size_t)QCAL_HIST_SUB_COPIES * 4097, sizeof *b.sub);
    }
    for (int i = 0; i < ca_isa_count(); i++) {
        qcal_isa isa = (qcal_isa)i;
        qcal_histogram_dsp_init(&opt, isa);
        if (ca.bench) {
            b.dsp = &opt;
            double bytes = (double)b.n * 4;
            ca_bench("f32_histc (2048 bins)", isa, bytes, run_histc, &b);
            ca_bench("f32_histc_inside", isa, bytes, run_histc_inside, &b);
            ca_bench("f32_lattice_bin (4096 cells)", isa, bytes, run_lattice_bin, &b);
            ca_bench("f32_lattice_bin_until", isa, bytes, run_lattice_bin_until, &b);
            continue;
        }
        if (ca_test(qcal_histogram_dsp, &ref, &opt, histc, "f32_histc", isa))
            check_hist_slot(&ref, &opt, isa, 0);
        if (ca_test(qcal_histogram_dsp, &ref, &opt, histc_inside, "f32_histc_inside", isa))
            check_hist_slot(&ref, &opt, isa, 1);
        if (ca_test(qcal_histogram_dsp, &ref, &opt, lattice_bin, "f32_lattice_bin", isa))
            check_hist_slot(&ref, &opt, isa, 2);
        if (ca_test(qcal_histogram_dsp, &ref, &opt, lattice_bin_until, "f32_lattice_bin_until",
                    isa))
            check_hist_slot(&ref, &opt, isa, 3);
        ca_family_done(&ref, &opt, sizeof opt, isa);
    }
    if (ca.bench) {
        free((void *)b.x);
        free(b.counts);
        free(b.sub);
        if (b.sink == 12345.0)
            printf("\n");
    }
    if (!ca.bench)
        ca_count_unrun(qcal_histogram_dsp, qcal_histogram_dsp_init);
}

/* ---- registry ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    void (*check)(void);
} FAMILIES[] = {
    { "minmax", check_minmax },
    { "half", check_half },
    { "metrics", check_metrics },
    { "quantize", check_quantize },
    { "fakequant", check_fakequant },
    { "float8", check_float8 },
    { "histogram", check_histogram },
};

static bool selected(const char *only, const char *name)
{
    if (!only)
        return true;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return true;
        p += len + (e != NULL);
    }
    return false;
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    ca.seed = 20261123;
    ca.bench_elements = 16 << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench"))
            ca.bench = true;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            ca.seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--elements") && i + 1 < argc)
            ca.bench_elements = strtoll(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: checkasm [--bench] [--seed N] [--only FAMILY,...] "
                            "[--elements N]\n");
            return 2;
        }
    }
    if (ca.bench_elements < 1024)
        ca.bench_elements = 1024;
    ca.bench_elements &= ~(int64_t)1023;
    printf("checkasm: seed %" PRIu64 ", best ISA %s\n", ca.seed, ISA_NAMES[qcal_cpu_isa()]);
    float *probe = NULL;
    if (ca.bench) {
        ca.probe_n = ca.bench_elements;
        probe = aligned_alloc(64, (size_t)ca.probe_n * 4);
        for (int64_t i = 0; i < ca.probe_n; i++)
            probe[i] = (float)(i & 1023);
        ca.probe = probe;
        printf("one thread, %lld elements; times are CPU time of the thread (median of 15); "
               "vs probe = paired ratios of GB/s to a read probe over %lld MiB run just "
               "before each timing: median (range)\n\n", (long long)ca.bench_elements,
               (long long)(ca.probe_n * 4 >> 20));
        printf("| family   | kernel                       | isa    |      median |  GB/s | "
               "vs read probe    |\n|---|---|---|---|---|---|\n");
    }
    for (size_t f = 0; f < sizeof FAMILIES / sizeof FAMILIES[0]; f++) {
        if (!selected(only, FAMILIES[f].name))
            continue;
        ca.family = FAMILIES[f].name;
        ca.rng = ca.seed ^ (0x9E3779B97F4A7C15ULL * (f + 1));
        FAMILIES[f].check();
    }
    if (ca.bench) {
        free(probe);
        return ca.probe_sink == 12345.0;   /* keeps the probe's sums alive */
    }
    if (ca.failures) {
        fprintf(stderr, "checkasm: %d failure(s)\n", ca.failures);
        return 1;
    }
    printf("checkasm: %d ISA kernel versions, %d comparisons, all bit-identical to C\n",
           ca.kernels, ca.checks);
    for (int isa = 0; isa < QCAL_ISA_COUNT; isa++)
        if (ca.unrun[isa])
            printf("checkasm: SKIPPED %d %s kernel versions: not run, so not checked (this CPU, "
                   "or QCAL_ISA, runs up to %s)\n", ca.unrun[isa], ISA_NAMES[isa],
                   ISA_NAMES[qcal_cpu_isa()]);
    return 0;
}
