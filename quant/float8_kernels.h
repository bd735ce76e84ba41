/* FP8 kernel family: the scalar element functions (the definition of the bits, see
 * quant/float8_dsp.h), used by the C reference and by the ISA versions for heads and
 * tails. Included by quant/float8_{c,avx2,avx512}.c only. */
#ifndef QCAL_QUANT_FLOAT8_KERNELS_H
#define QCAL_QUANT_FLOAT8_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "quant/float8_dsp.h"

/* Per-format constants. E4M3FN: 1.4.3, bias 7; E5M2: 1.5.2, bias 15. */
#define F8_E4_MAX 448.0f
#define F8_E5_MAX 57344.0f
#define F8_E4_MIN_NORMAL 0x1p-6f     /* below: subnormal codes k * 2^-9, k = 0..7 */
#define F8_E5_MIN_NORMAL 0x1p-14f    /* below: subnormal codes k * 2^-16, k = 0..3 */
#define F8_E4_SUB 0x1p9f
#define F8_E5_SUB 0x1p16f
#define F8_E4_SHIFT 20               /* float32 mantissa bits dropped */
#define F8_E5_SHIFT 21
#define F8_E4_ADJ (120u << 3)        /* (127 - 7) << mantissa bits */
#define F8_E5_ADJ (112u << 2)        /* (127 - 15) << mantissa bits */
#define F8_E4_BOUND 464.0f           /* mask: |v| <= bound */
#define F8_E5_BOUND 0x1.dffffep+15f  /* the float below 61440 */

static inline uint32_t f8_bits(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static inline float f8_float(uint32_t b)
{
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* The code of v (= x / scale): sign | RNE(|v|) on the format's grid, saturated. */
static inline uint8_t f8_encode(float v, int fmt)
{
    const bool e4 = fmt == QCAL_F8_E4M3FN;
    uint32_t sign = (f8_bits(v) >> 24) & 0x80u;
    float a = fabsf(v);
    if (a != a)
        return (uint8_t)(sign | 0x7Fu);
    a = a < (e4 ? F8_E4_MAX : F8_E5_MAX) ? a : (e4 ? F8_E4_MAX : F8_E5_MAX);
    uint32_t code;
    if (a < (e4 ? F8_E4_MIN_NORMAL : F8_E5_MIN_NORMAL)) {
        /* subnormal grid: the scaling by a power of two is exact, nearbyintf rounds half
         * to even (default rounding mode); k = 8 (4) is the smallest normal's code */
        code = (uint32_t)(int32_t)nearbyintf(a * (e4 ? F8_E4_SUB : F8_E5_SUB));
    } else {
        /* normal: round the float32 bits half to even at the format's last mantissa bit
         * (a carry moves into the exponent, as it should), then rebias */
        const int sh = e4 ? F8_E4_SHIFT : F8_E5_SHIFT;
        uint32_t ab = f8_bits(a);
        code = ((ab + ((1u << (sh - 1)) - 1u) + ((ab >> sh) & 1u)) >> sh) -
               (e4 ? F8_E4_ADJ : F8_E5_ADJ);
    }
    return (uint8_t)(sign | code);
}

/* The value of a code (NaN codes: the quiet NaN 0x7FC00000 with the code's sign). */
static inline float f8_decode(uint8_t c, int fmt)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, m = c & 0x7Fu, r;
    if (fmt == QCAL_F8_E4M3FN) {
        if (m == 0x7Fu)
            r = 0x7FC00000u;
        else if (m < 8u)
            r = f8_bits((float)m * 0x1p-9f);
        else
            r = (m << F8_E4_SHIFT) + (F8_E4_ADJ << F8_E4_SHIFT);
    } else {
        if (m > 0x7Cu)
            r = 0x7FC00000u;
        else if (m == 0x7Cu)
            r = 0x7F800000u;
        else if (m < 4u)
            r = f8_bits((float)m * 0x1p-16f);
        else
            r = (m << F8_E5_SHIFT) + (F8_E5_ADJ << F8_E5_SHIFT);
    }
    return f8_float(sign | r);
}

/* 1 when the unsaturated rounding of v stays within +-largest (NaN, +-Inf: 0). */
static inline bool f8_inside(float v, int fmt)
{
    return fabsf(v) <= (fmt == QCAL_F8_E4M3FN ? F8_E4_BOUND : F8_E5_BOUND);
}

/* Fake-quant of one element: value(encode(x / scale)) * scale. */
static inline float f8_fq(float x, float scale, int fmt, bool *inside)
{
    float v = x / scale;
    *inside = f8_inside(v, fmt);
    return f8_decode(f8_encode(v, fmt), fmt) * scale;
}

#endif
