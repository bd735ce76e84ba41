/* Strict UTF-8 and the shortest decimal forms of floats (io/text.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/text.h"

/* ---- UTF-8 ---- */

size_t qcal_utf8_decode(const unsigned char *s, size_t left, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t n;
    uint32_t v;
    if (c < 0x80) {
        if (cp)
            *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
    } else {
        return 0;   /* a continuation byte, an overlong two-byte lead or past U+10FFFF */
    }
    if (left < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)))
        return 0;   /* overlong or beyond Unicode */
    if (v >= 0xD800 && v <= 0xDFFF)
        return 0;   /* encoded surrogate */
    if (cp)
        *cp = v;
    return n;
}

size_t qcal_utf8_encode(char *d, uint32_t cp)
{
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6));
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12));
        d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18));
    d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool qcal_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t n = qcal_utf8_decode(p, SIZE_MAX, NULL);
        if (!n)
            return false;
        p += n;
    }
    return true;
}

/* ---- floats ---- */

void qcal_fmt_f32(char *dst, size_t cap, float v)
{
    /* Readers may parse with strtof or through a double (strtod, as the JSON DOM does):
     * demand both round trips. 17 digits always satisfy both, since a float32 is exactly
     * a double and 17 digits round-trip any double. */
    for (int p = 1; p <= 17; p++) {
        snprintf(dst, cap, "%.*g", p, (double)v);
        if (strtof(dst, NULL) == v && (float)strtod(dst, NULL) == v)
            return;
    }
}

void qcal_fmt_pyfloat(char *dst, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(dst, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(dst, cap, v > 0 ? "inf" : "-inf");
        return;
    }
    if (v == 0.0) {
        snprintf(dst, cap, signbit(v) ? "-0.0" : "0.0");
        return;
    }
    /* Shortest digit string that reads back as v (repr's mode 0): the correctly rounded
     * p-digit decimal for the smallest p that round-trips. */
    char e[40];
    int p = 1;
    for (; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, fabs(v));
        if (strtod(e, NULL) == fabs(v))
            break;
    }
    char digits[24];
    int nd = 0;
    const char *c = e;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9')
            digits[nd++] = *c;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int exp10 = atoi(c + 1);
    int decpt = exp10 + 1;   /* value = 0.DIGITS * 10^decpt */
    char out[64];
    size_t o = 0;
    if (v < 0)
        out[o++] = '-';
    if (decpt <= -4 || decpt > 16) {
        /* d[.ddd]e[+-]XX, at least two exponent digits */
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)nd - 1);
            o += (size_t)nd - 1;
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
                              abs(exp10));
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        memcpy(out + o, digits, (size_t)nd);
        o += (size_t)nd;
    } else if (decpt >= nd) {
        memcpy(out + o, digits, (size_t)nd);
        o += (size_t)nd;
        for (int i = nd; i < decpt; i++)
            out[o++] = '0';
        out[o++] = '.';
        out[o++] = '0';
    } else {
        memcpy(out + o, digits, (size_t)decpt);
        o += (size_t)decpt;
        out[o++] = '.';
        memcpy(out + o, digits + decpt, (size_t)(nd - decpt));
        o += (size_t)(nd - decpt);
    }
    out[o] = '\0';
    snprintf(dst, cap, "%s", out);
}
