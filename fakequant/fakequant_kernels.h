/* Fake-quant kernel family: helpers shared by the C, AVX2 and AVX-512 kernel files (the C
 * reference's element functions, which the ISA versions also use for heads and tails, and
 * the streaming-store and lane-rotation helpers). Included by fakequant_c.c /
 * fakequant_avx2.c / fakequant_avx512.c only. */
#ifndef QCAL_FAKEQUANT_FAKEQUANT_KERNELS_H
#define QCAL_FAKEQUANT_FAKEQUANT_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "fakequant/fakequant_dsp.h"

/* v, hidden from the optimiser (so a multiply by a 0.0f / 1.0f factor stays a multiply). */
static inline float qcal_fq_opaque(float v)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(v));
#else
    __asm__("" : "+g"(v));
#endif
    return v;
}

static inline float fq_q(float x, const qcal_fq_run *p)
{
    return p->zp + nearbyintf(x * p->inv_scale);
}

/* (clamp(q) - zp) * scale; NaN (from a NaN input) -> the zero-point, i.e. +0.0. */
static inline float fq_y(float q, const qcal_fq_run *p)
{
    if (q != q)
        return 0.0f * p->scale;
    float c = q >= p->qmin ? q : p->qmin;
    c = c <= p->qmax ? c : p->qmax;
    return (c - p->zp) * p->scale;
}

/* Streaming stores: elements to process before `out` reaches an `align`-byte boundary
 * (capped at n); -1 when `out` is not even float-aligned (no streaming then). */
static inline int64_t fq_peel(const void *out, int64_t n, unsigned align, unsigned elem)
{
    uintptr_t a = (uintptr_t)out;
    if (a % elem)
        return -1;
    int64_t k = (int64_t)(((align - a % align) % align) / elem);
    return k < n ? k : n;
}

/* An output may stream from index i when it is aligned there and is not also an input
 * (in place: the lines are in cache already, and a plain store keeps them there). */
static inline bool fq_aligned(const void *out, unsigned align)
{
    return (uintptr_t)out % align == 0;
}

static inline void lsq_elem(float x, float dy, const qcal_lsq_run *p, float *dx, float *ds,
                            float *dz)
{
    float q = nearbyintf(fmaf(x, p->inv_scale, p->zp));
    if (q != q) {   /* NaN policy: y is the zero-point (0.0), constant: no gradient */
        *dx = dy * qcal_fq_opaque(0.0f);
        *ds = 0.0f;
        *dz = 0.0f;
        return;
    }
    bool below = !(q >= p->qmin);
    bool above = q > p->qmax;
    if (below || above) {
        *dx = dy * qcal_fq_opaque(0.0f);
        *dz = -dy * p->scale * p->grad_factor;
        *ds = dy * (below ? p->qmin - p->zp : p->qmax - p->zp) * p->grad_factor;
    } else {
        *dx = dy * qcal_fq_opaque(1.0f);
        *dz = 0.0f;
        *ds = dy * fmaf(q - p->zp, p->scale, -x) * p->inv_scale * p->grad_factor;
    }
}

/* Elements [j0, j1) of a span; lane j % 16. */
static inline void lsq_range(const float *x, const float *gy, int64_t j0, int64_t j1,
                      const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z)
{
    for (int64_t j = j0; j < j1; j++) {
        float dx, ds, dz;
        lsq_elem(x[j], gy[j], p, &dx, &ds, &dz);
        if (gx)
            gx[j] = dx;
        acc_s[j % QCAL_LSQ_LANES] += (double)ds;
        acc_z[j % QCAL_LSQ_LANES] += (double)dz;
    }
}

/* SIMD span layout: a scalar head [0, k) (k < 16; to gx's vector alignment when
 * streaming, else 0), full vectors of 16 from k, a scalar tail. Register lane v of the
 * vector part holds span element j with j % 16 == (v + k) % 16: the accumulators are
 * rotated by k on load and back on store. */
static inline int64_t lsq_head(const float *gx, int64_t n, bool stream, unsigned align)
{
    if (!stream || !gx || (uintptr_t)gx % 4)
        return 0;
    int64_t k = (int64_t)((align - (uintptr_t)gx % align) % align / 4);
    return k < n ? k : n;
}

/* Hides where a local lane buffer lives, so the compiler keeps the unaligned vector moves
 * written in the kernels: it would otherwise give the array 64-byte alignment and emit
 * vmovapd, and ASan's fake stack (detect_stack_use_after_return, used in CI) only aligns
 * locals to 32 bytes — that combination faulted. */
static inline double *lsq_unaligned(double *p)
{
    __asm__("" : "+r"(p));
    return p;
}

static inline void lsq_rot_load(const double *acc, int64_t k, double *reg)
{
    for (int v = 0; v < QCAL_LSQ_LANES; v++)
        reg[v] = acc[(v + k) % QCAL_LSQ_LANES];
}

static inline void lsq_rot_store(const double *reg, int64_t k, double *acc)
{
    for (int v = 0; v < QCAL_LSQ_LANES; v++)
        acc[(v + k) % QCAL_LSQ_LANES] = reg[v];
}

#endif
