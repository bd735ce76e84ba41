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
 * calib/table_formats.c). Python's str()/repr() of a float (qcal_fmt_pyfloat, io/text.h)
 * and json.dumps' escaping (ensure_ascii: qcal_json_write_str_ascii, io/json.h) come from
 * io/; the flatbuffer is laid out as flatbuffers' Python Builder (2.x) lays it out: back to
 * front, with its alignment and vtable sharing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "io/json.h"
#include "io/text.h"

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
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
            qcal_fmt_pyfloat(lo_s, sizeof lo_s, lo);
            qcal_fmt_pyfloat(hi_s, sizeof hi_s, hi);
            if (i)
                put(b, ", ");
            qcal_json_write_str_ascii(b, e[i]->fqn);
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
            qcal_fmt_pyfloat(v, sizeof v, (double)qcal_calib_export_amax(e[i]));
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
        qcal_fmt_pyfloat(v, sizeof v, (double)qcal_calib_export_amax(e[i]));
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
