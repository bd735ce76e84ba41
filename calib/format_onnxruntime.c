/* ONNX Runtime's three calibration files, byte for byte as
 * onnxruntime/python/tools/quantization/quant_utils.py write_calibration_table writes them
 * from the dict {name: (lo, hi)} (Python floats):
 *   calibration.json         json.dumps(dict): {"name": [lo, hi], ...}
 *   calibration.flatbuffers  TrtTable { dict: [KeyValue { key, value }] } built with the
 *                            Python flatbuffers Builder (value str(max(abs(lo), abs(hi))))
 *   calibration.cache        "name value\n" per tensor
 * in sorted key order. lo/hi are the entry's range (min over channels of min_val, max over
 * channels of max_val) as Python floats (the float32 values widened to double, as ONNX
 * Runtime's calibrators hold them); the value follows qcal's amax rule (0 -> 1, see
 * calib/table_formats.c). Python's str()/repr() of a float and json.dumps' escaping
 * (ensure_ascii) are reproduced below; the flatbuffer is laid out as flatbuffers' Python
 * Builder (2.x) lays it out: back to front, with its alignment and vtable sharing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"

/* ---- Python float repr ---- */

void qcal_calib_fmt_pyfloat(char *dst, size_t cap, double v)
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

/* ---- UTF-8 ---- */

/* Decodes one UTF-8 sequence at s (strict: no overlongs, surrogates or > U+10FFFF);
 * returns its length, 0 if invalid. */
static int utf8_next(const unsigned char *s, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    int n;
    uint32_t c, min;
    if ((s[0] & 0xE0) == 0xC0) {
        n = 2;
        c = s[0] & 0x1F;
        min = 0x80;
    } else if ((s[0] & 0xF0) == 0xE0) {
        n = 3;
        c = s[0] & 0x0F;
        min = 0x800;
    } else if ((s[0] & 0xF8) == 0xF0) {
        n = 4;
        c = s[0] & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return n;
}

bool qcal_calib_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    uint32_t cp;
    while (*p) {
        int n = utf8_next(p, &cp);
        if (!n)
            return false;
        p += n;
    }
    return true;
}

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

/* json.dumps(s) with ensure_ascii=True (s valid UTF-8). */
static void put_pyjson_str(qcal_buf *b, const char *s)
{
    put(b, "\"");
    const unsigned char *p = (const unsigned char *)s;
    char tmp[16];
    while (*p) {
        uint32_t cp = 0;
        int n = utf8_next(p, &cp);
        if (!n)
            n = 1, cp = 0xFFFD;   /* not reached: names are checked first */
        p += n;
        switch (cp) {
        case '"': put(b, "\\\""); continue;
        case '\\': put(b, "\\\\"); continue;
        case '\n': put(b, "\\n"); continue;
        case '\r': put(b, "\\r"); continue;
        case '\t': put(b, "\\t"); continue;
        case '\b': put(b, "\\b"); continue;
        case '\f': put(b, "\\f"); continue;
        default: break;
        }
        if (cp >= 0x20 && cp <= 0x7E) {
            tmp[0] = (char)cp;
            tmp[1] = '\0';
        } else if (cp < 0x10000) {
            snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
        } else {
            uint32_t v = cp - 0x10000;
            snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", (unsigned)(0xD800 + (v >> 10)),
                     (unsigned)(0xDC00 + (v & 0x3FF)));
        }
        put(b, tmp);
    }
    put(b, "\"");
}

/* ---- flatbuffers' Python Builder, the calls write_calibration_table makes ---- */

typedef struct fb_vt {
    int32_t key[4];   /* field offsets from the object start, trailing zeros trimmed */
    int nkey;
    uint32_t off;     /* where the vtable was written */
} fb_vt;

typedef struct fb {
    uint8_t *bytes;
    size_t cap;       /* len(Bytes) */
    size_t head;
    size_t minalign;
    uint32_t vtable[4];
    int nfields;
    uint32_t object_end;
    fb_vt *vts;
    int nvts, capvts;
    uint32_t vec_elems;
    bool failed;
} fb;

static uint32_t fb_offset(const fb *f)
{
    return (uint32_t)(f->cap - f->head);
}

/* Makes room for n more bytes in front of head (the data lives at the end). */
static bool fb_room(fb *f, size_t n)
{
    if (f->failed)
        return false;
    while (f->head < n) {
        size_t ncap = f->cap * 2, used = f->cap - f->head;
        if (ncap < f->cap) {
            f->failed = true;
            return false;
        }
        uint8_t *nb = qcal_calloc(ncap, 1);
        if (!nb) {
            f->failed = true;
            return false;
        }
        memcpy(nb + ncap - used, f->bytes + f->head, used);
        free(f->bytes);
        f->bytes = nb;
        f->head = ncap - used;
        f->cap = ncap;
    }
    return true;
}

static void fb_pad(fb *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f->bytes[--f->head] = 0;
}

static void fb_prep(fb *f, size_t size, size_t additional)
{
    if (size > f->minalign)
        f->minalign = size;
    size_t align = (~(f->cap - f->head + additional) + 1) & (size - 1);
    if (!fb_room(f, align + size + additional))
        return;
    fb_pad(f, align);
}

static void fb_place(fb *f, uint32_t v, int width)
{
    if (f->failed || f->head < (size_t)width)
        return;
    f->head -= (size_t)width;
    for (int i = 0; i < width; i++)
        f->bytes[f->head + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void fb_prepend_u16(fb *f, uint16_t v)
{
    fb_prep(f, 2, 0);
    fb_place(f, v, 2);
}

static void fb_prepend_uoffset(fb *f, uint32_t off)
{
    fb_prep(f, 4, 0);
    fb_place(f, fb_offset(f) - off + 4, 4);
}

static uint32_t fb_end_vector(fb *f)
{
    fb_place(f, f->vec_elems, 4);
    return fb_offset(f);
}

static uint32_t fb_create_string(fb *f, const char *s)
{
    size_t n = strlen(s);
    fb_prep(f, 4, n + 1);
    if (!fb_room(f, n + 1))
        return 0;
    fb_place(f, 0, 1);
    f->head -= n;
    memcpy(f->bytes + f->head, s, n);
    f->vec_elems = (uint32_t)n;
    return fb_end_vector(f);
}

static void fb_start_object(fb *f, int nfields)
{
    memset(f->vtable, 0, sizeof f->vtable);
    f->nfields = nfields;
    f->object_end = fb_offset(f);
}

static void fb_slot_uoffset(fb *f, int slot, uint32_t off)
{
    if (off != 0) {
        fb_prepend_uoffset(f, off);
        f->vtable[slot] = fb_offset(f);
    }
}

static void fb_write_soffset_at(fb *f, uint32_t object_offset, int32_t v)
{
    if (f->failed)
        return;
    size_t at = f->cap - object_offset;
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++)
        f->bytes[at + (size_t)i] = (uint8_t)(u >> (8 * i));
}

static uint32_t fb_end_object(fb *f)
{
    /* PrependSOffsetTRelative(0) */
    fb_prep(f, 4, 0);
    fb_place(f, fb_offset(f) + 4, 4);
    uint32_t object_offset = fb_offset(f);
    fb_vt key = { { 0 }, 0, 0 };
    bool trim = true;
    for (int i = f->nfields - 1; i >= 0; i--) {
        int32_t elem = (int32_t)f->vtable[i];
        if (elem == 0) {
            if (trim)
                continue;
        } else {
            elem = (int32_t)object_offset - elem;
            trim = false;
        }
        key.key[key.nkey++] = elem;
    }
    for (int v = 0; v < f->nvts; v++) {
        if (f->vts[v].nkey == key.nkey &&
            !memcmp(f->vts[v].key, key.key, sizeof(int32_t) * (size_t)key.nkey)) {
            /* Shared vtable: the object's soffset points to it. */
            fb_write_soffset_at(f, object_offset,
                                (int32_t)f->vts[v].off - (int32_t)object_offset);
            return object_offset;
        }
    }
    int trailing = 0;
    trim = true;
    for (int i = f->nfields - 1; i >= 0; i--) {
        uint32_t elem = f->vtable[i], off = 0;
        if (elem == 0) {
            if (trim) {
                trailing++;
                continue;
            }
        } else {
            off = object_offset - elem;
            trim = false;
        }
        fb_prepend_u16(f, (uint16_t)off);
    }
    fb_prepend_u16(f, (uint16_t)(object_offset - f->object_end));
    fb_prepend_u16(f, (uint16_t)((f->nfields - trailing + 2) * 2));
    fb_write_soffset_at(f, object_offset, (int32_t)(fb_offset(f) - object_offset));
    if (f->nvts == f->capvts) {
        int cap = f->capvts ? f->capvts * 2 : 4;
        fb_vt *nv = realloc(f->vts, (size_t)cap * sizeof *nv);
        if (!nv) {
            f->failed = true;
            return object_offset;
        }
        f->vts = nv;
        f->capvts = cap;
    }
    key.off = fb_offset(f);
    f->vts[f->nvts++] = key;
    return object_offset;
}

/* ---- The three files ---- */

/* lo = min over channels of min_val, hi = max of max_val (as write_calibration_table's
 * (lo, hi) pair); value = the export amax (0 -> 1). */
static void entry_range(const qcal_calib_entry *e, double *lo, double *hi)
{
    float mn = e->min_val[0], mx = e->max_val[0];
    for (int64_t c = 1; c < e->qparams.channels; c++) {
        mn = fminf(mn, e->min_val[c]);
        mx = fmaxf(mx, e->max_val[c]);
    }
    *lo = (double)mn;
    *hi = (double)mx;
}

qcal_status qcal_calib_format_onnxruntime(const qcal_calib_entry *const *e, int64_t n,
                                          int part, qcal_buf *b)
{
    char v[64], lo_s[64], hi_s[64];
    if (part == 0) {
        put(b, "{");
        for (int64_t i = 0; i < n; i++) {
            double lo, hi;
            entry_range(e[i], &lo, &hi);
            qcal_calib_fmt_pyfloat(lo_s, sizeof lo_s, lo);
            qcal_calib_fmt_pyfloat(hi_s, sizeof hi_s, hi);
            if (i)
                put(b, ", ");
            put_pyjson_str(b, e[i]->fqn);
            put(b, ": [");
            put(b, lo_s);
            put(b, ", ");
            put(b, hi_s);
            put(b, "]");
        }
        put(b, "}");
        return QCAL_OK;
    }
    if (part == 2) {
        for (int64_t i = 0; i < n; i++) {
            qcal_calib_fmt_pyfloat(v, sizeof v, (double)qcal_calib_export_amax(e[i]));
            put(b, e[i]->fqn);
            put(b, " ");
            put(b, v);
            put(b, "\n");
        }
        return QCAL_OK;
    }
    fb f = { 0 };
    f.cap = 1024;
    f.head = 1024;
    f.minalign = 1;
    f.bytes = qcal_calloc(f.cap, 1);
    uint32_t *kv = qcal_calloc((size_t)(n > 0 ? n : 1), sizeof *kv);
    if (!f.bytes || !kv) {
        free(f.bytes);
        free(kv);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the flatbuffer");
    }
    for (int64_t i = 0; i < n; i++) {
        qcal_calib_fmt_pyfloat(v, sizeof v, (double)qcal_calib_export_amax(e[i]));
        uint32_t k = fb_create_string(&f, e[i]->fqn);
        uint32_t s = fb_create_string(&f, v);
        fb_start_object(&f, 2);
        fb_slot_uoffset(&f, 0, k);
        fb_slot_uoffset(&f, 1, s);
        kv[i] = fb_end_object(&f);
    }
    /* TrtTableStartDictVector: StartVector(4, n, 4); the offsets are prepended in list
     * order, so the stored vector holds the entries in reverse sorted order. */
    fb_prep(&f, 4, 4 * (size_t)n);
    fb_prep(&f, 4, 4 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        fb_prepend_uoffset(&f, kv[i]);
    f.vec_elems = (uint32_t)n;
    uint32_t dict = fb_end_vector(&f);
    fb_start_object(&f, 1);
    fb_slot_uoffset(&f, 0, dict);
    uint32_t root = fb_end_object(&f);
    fb_prep(&f, f.minalign, 4);
    fb_prepend_uoffset(&f, root);
    qcal_status st = QCAL_OK;
    if (f.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the flatbuffer");
    else
        qcal_buf_append(b, f.bytes + f.head, f.cap - f.head);
    free(f.bytes);
    free(f.vts);
    free(kv);
    return st;
}
