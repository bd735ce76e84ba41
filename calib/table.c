/* The calibration table: entries, lookup, and the native JSON format (writer and the
 * validating reader). Other export formats are in calib/table_formats.c.
 *
 * Native JSON (schema version 1):
 *   {"format": "qcal-calibration-table", "version": 1, "digest": "<64 hex>", "entries": [
 *     {"fqn": "conv1", "role": "activation", "observer": "histogram", "dtype": "quint8",
 *      "qscheme": "per_tensor_affine", "axis": 0, "quant_min": 0, "quant_max": 255,
 *      "channels": 1, "batches": 8, "elements": 8000, "nonfinite": 0, "no_data": false,
 *      "min": [-1.5], "max": [2.25], "scale": [0.0147058824], "zero_point": [102],
 *      "zero_point_float": [0]}, ...]}
 * float32 values are written with the fewest digits ("%.1g".."%.9g") that read back as the
 * same float32, so the table round-trips bit for bit. A range bound that is not finite
 * (+inf/-inf of a channel without data) is written as the string "inf" / "-inf".
 * "digest" (the session's qcal_calib_session_digest) is optional: tables of earlier qcal
 * versions have none, and readers that do not know it ignore it. "profile" (after "digest",
 * also optional: "ort" or "tensorrt", the deployment profile the table was calibrated for,
 * qcal_calib_table_set_profile) is table metadata outside the digest; tables without it stay
 * readable, and an unknown name is refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "core/blob_file.h"
#include "qcal/qparams.h"
#include "io/json.h"
#include "io/text.h"

#define TABLE_FORMAT_NAME "qcal-calibration-table"
#define TABLE_VERSION 1

qcal_status qcal_calib_table_new(qcal_calib_table **out)
{
    qcal_calib_table *t = qcal_calloc(1, sizeof *t);
    if (!t)
        return QCAL_ERR_NO_MEMORY;
    *out = t;
    return QCAL_OK;
}

/* One allocation per entry for the arrays: min, max, scale, float zero-point (floats), then
 * the integer zero-points; offsets follow from min_val and qparams.channels, which never
 * change after the allocation. */
qcal_status qcal_calib_entry_alloc(qcal_calib_entry *e, const char *fqn, int64_t channels)
{
    memset(e, 0, sizeof *e);
    if (channels < 1 || channels > ((int64_t)1 << 40))
        return qcal_error(QCAL_ERR_INVALID_ARG, "entry '%s' has %lld channels", fqn,
                          (long long)channels);
    size_t n = (size_t)channels, bytes;
    if (!qcal_mul_size(n, 4 * sizeof(float) + sizeof(int32_t), &bytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "entry '%s': %lld channels overflow", fqn,
                          (long long)channels);
    size_t len = strlen(fqn);
    char *name = qcal_malloc(len + 1);
    float *f = qcal_calloc(1, bytes);
    if (!name || !f) {
        free(name);
        free(f);
        return QCAL_ERR_NO_MEMORY;
    }
    memcpy(name, fqn, len + 1);
    e->fqn = name;
    e->qparams.channels = channels;
    e->min_val = f;
    e->max_val = f + n;
    return QCAL_OK;
}

void qcal_calib_entry_arrays_get(const qcal_calib_entry *e, qcal_calib_entry_arrays *a)
{
    int64_t n = e->qparams.channels;
    float *f = (float *)(uintptr_t)e->min_val;
    a->min_val = f;
    a->max_val = f + n;
    a->scale = f + 2 * n;
    a->zero_point_float = f + 3 * n;
    a->zero_point = (int32_t *)(void *)(f + 4 * n);
}

void qcal_calib_entry_finish(qcal_calib_entry *e)
{
    qcal_calib_entry_arrays a;
    qcal_calib_entry_arrays_get(e, &a);
    qcal_qparams *q = &e->qparams;
    if (qcal_qscheme_is_per_channel(q->qscheme)) {
        q->scales = a.scale;
        q->zero_points = a.zero_point;
        q->zero_points_float =
            q->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS ? a.zero_point_float : NULL;
        q->scale = 1.0f;
        q->zero_point = 0;
        q->zero_point_float = 0.0f;
    } else {
        q->scales = NULL;
        q->zero_points = NULL;
        q->zero_points_float = NULL;
        q->scale = a.scale[0];
        q->zero_point = a.zero_point[0];
        q->zero_point_float = (float)a.zero_point[0];
    }
    q->owned = NULL;
}

void qcal_calib_entry_free(qcal_calib_entry *e)
{
    free((void *)e->fqn);
    free((void *)e->min_val);
    memset(e, 0, sizeof *e);
}

qcal_status qcal_calib_table_push(qcal_calib_table *t, qcal_calib_entry *e)
{
    if (t->n == t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 16;
        qcal_calib_entry *ne = realloc(t->e, (size_t)cap * sizeof *ne);
        if (!ne) {
            qcal_calib_entry_free(e);
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the table to %lld entries",
                              (long long)cap);
        }
        t->e = ne;
        t->cap = cap;
    }
    t->e[t->n++] = *e;
    memset(e, 0, sizeof *e);
    return QCAL_OK;
}

static int entry_cmp(const void *a, const void *b)
{
    const qcal_calib_entry *x = a, *y = b;
    int c = strcmp(x->fqn, y->fqn);
    if (c)
        return c;
    return (int)x->role - (int)y->role;
}

qcal_status qcal_calib_table_sort(qcal_calib_table *t)
{
    if (t->n > 1)
        qsort(t->e, (size_t)t->n, sizeof *t->e, entry_cmp);
    for (int64_t i = 1; i < t->n; i++) {
        if (!entry_cmp(&t->e[i - 1], &t->e[i]))
            return qcal_error(QCAL_ERR_FORMAT, "table has two %s entries named '%s'",
                              qcal_calib_role_name(t->e[i].role), t->e[i].fqn);
    }
    return QCAL_OK;
}

void qcal_calib_table_destroy(qcal_calib_table **t)
{
    if (!t || !*t)
        return;
    for (int64_t i = 0; i < (*t)->n; i++)
        qcal_calib_entry_free(&(*t)->e[i]);
    free((*t)->e);
    free(*t);
    *t = NULL;
}

qcal_status qcal_calib_table_count(const qcal_calib_table *t, int64_t *n)
{
    if (!t || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or output is NULL");
    *n = t->n;
    return QCAL_OK;
}

qcal_status qcal_calib_table_entry(const qcal_calib_table *t, int64_t i,
                                   const qcal_calib_entry **out)
{
    if (!t || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or output is NULL");
    if (i < 0 || i >= t->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "entry index %lld is outside [0, %lld)",
                          (long long)i, (long long)t->n);
    *out = &t->e[i];
    return QCAL_OK;
}

qcal_status qcal_calib_table_find(const qcal_calib_table *t, const char *fqn, qcal_calib_role role,
                                  const qcal_calib_entry **out)
{
    if (!t || !fqn || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table, fqn or output is NULL");
    qcal_calib_entry key = { .fqn = fqn, .role = role };
    const qcal_calib_entry *e =
        t->n ? bsearch(&key, t->e, (size_t)t->n, sizeof *t->e, entry_cmp) : NULL;
    if (!e)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no %s named '%s' in the table",
                          qcal_calib_role_name(role), fqn);
    *out = e;
    return QCAL_OK;
}

qcal_status qcal_calib_entry_amax(const qcal_calib_entry *e, int64_t c, float *amax)
{
    if (!e || !amax)
        return qcal_error(QCAL_ERR_INVALID_ARG, "entry or output is NULL");
    if (c < 0 || c >= e->qparams.channels)
        return qcal_error(QCAL_ERR_INVALID_ARG, "channel %lld is outside [0, %lld) of '%s'",
                          (long long)c, (long long)e->qparams.channels, e->fqn);
    float lo = e->min_val[c], hi = e->max_val[c];
    if (!(lo <= hi)) {  /* no data (+inf, -inf) */
        *amax = 0.0f;
        return QCAL_OK;
    }
    *amax = fmaxf(fabsf(lo), fabsf(hi));
    return QCAL_OK;
}

float qcal_calib_export_amax(const qcal_calib_entry *e)
{
    float m = 0.0f;
    for (int64_t c = 0; c < e->qparams.channels; c++) {
        float a = 0.0f;
        qcal_calib_entry_amax(e, c, &a);
        m = fmaxf(m, a);
    }
    return m > 0.0f ? m : 1.0f;
}

/* ---- JSON writer ---- */

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

static void put_f32(qcal_buf *b, float v)
{
    char tmp[40];
    if (isnan(v))
        put(b, "\"nan\"");
    else if (isinf(v))
        put(b, v > 0 ? "\"inf\"" : "\"-inf\"");
    else {
        qcal_fmt_f32(tmp, sizeof tmp, v);
        put(b, tmp);
    }
}

static void put_u64(qcal_buf *b, uint64_t v)
{
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    put(b, tmp);
}

static void put_i64(qcal_buf *b, int64_t v)
{
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    put(b, tmp);
}

static void put_f32_array(qcal_buf *b, const float *v, int64_t n)
{
    put(b, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i)
            put(b, ", ");
        put_f32(b, v[i]);
    }
    put(b, "]");
}

qcal_status qcal_calib_table_json(const qcal_calib_table *t, qcal_buf *b);

qcal_status qcal_calib_table_json(const qcal_calib_table *t, qcal_buf *b)
{
    put(b, "{\n  \"format\": \"" TABLE_FORMAT_NAME "\",\n  \"version\": ");
    put_i64(b, TABLE_VERSION);
    if (t->digest[0]) {
        put(b, ",\n  \"digest\": \"");
        put(b, t->digest);
        put(b, "\"");
    }
    if (t->profile[0]) {
        put(b, ",\n  \"profile\": \"");
        put(b, t->profile);
        put(b, "\"");
    }
    put(b, ",\n  \"entries\": [");
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        put(b, i ? ",\n    {" : "\n    {");
        put(b, "\"fqn\": ");
        qcal_json_write_str(b, e->fqn);
        put(b, ", \"role\": ");
        qcal_json_write_str(b, qcal_calib_role_name(e->role));
        put(b, ", \"observer\": ");
        qcal_json_write_str(b, qcal_observer_kind_name(e->observer));
        const qcal_qparams *q = &e->qparams;
        qcal_calib_entry_arrays a;
        qcal_calib_entry_arrays_get(e, &a);
        put(b, ", \"dtype\": ");
        qcal_json_write_str(b, qcal_dtype_name(q->dtype));
        put(b, ", \"qscheme\": ");
        qcal_json_write_str(b, qcal_qscheme_name(q->qscheme));
        put(b, ",\n     \"axis\": ");
        put_i64(b, q->axis);
        put(b, ", \"quant_min\": ");
        put_i64(b, q->quant_min);
        put(b, ", \"quant_max\": ");
        put_i64(b, q->quant_max);
        put(b, ", \"channels\": ");
        put_i64(b, q->channels);
        put(b, ", \"batches\": ");
        put_u64(b, e->batches);
        put(b, ", \"elements\": ");
        put_u64(b, e->elements);
        put(b, ", \"nonfinite\": ");
        put_u64(b, e->nonfinite);
        put(b, e->no_data ? ", \"no_data\": true" : ", \"no_data\": false");
        put(b, ",\n     \"min\": ");
        put_f32_array(b, a.min_val, q->channels);
        put(b, ",\n     \"max\": ");
        put_f32_array(b, a.max_val, q->channels);
        put(b, ",\n     \"scale\": ");
        put_f32_array(b, a.scale, q->channels);
        put(b, ",\n     \"zero_point\": [");
        for (int64_t c = 0; c < q->channels; c++) {
            if (c)
                put(b, ", ");
            put_i64(b, a.zero_point[c]);
        }
        put(b, "],\n     \"zero_point_float\": ");
        put_f32_array(b, a.zero_point_float, q->channels);
        put(b, "}");
    }
    put(b, t->n ? "\n  ]\n}\n" : "]\n}\n");
    return b->failed ? qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the JSON table text")
                     : QCAL_OK;
}

/* ---- JSON reader ---- */

typedef struct reader {
    const char *fqn;   /* current entry, for messages */
    int64_t index;
} reader;

static qcal_status bad(const reader *r, const char *field, const char *what)
{
    if (r->fqn)
        return qcal_error(QCAL_ERR_FORMAT, "calibration table entry %lld ('%s'): field '%s' %s",
                          (long long)r->index, r->fqn, field, what);
    return qcal_error(QCAL_ERR_FORMAT, "calibration table entry %lld: field '%s' %s",
                      (long long)r->index, field, what);
}

static qcal_status get_str(const reader *r, const qcal_json *o, const char *key,
                           const char **out)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v)
        return bad(r, key, "is missing");
    if (v->type != QCAL_JSON_STRING)
        return bad(r, key, "must be a string");
    *out = v->str;
    return QCAL_OK;
}

static qcal_status get_int(const reader *r, const qcal_json *o, const char *key, int64_t lo,
                           int64_t hi, int64_t *out)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v)
        return bad(r, key, "is missing");
    if (v->type != QCAL_JSON_NUMBER || !v->is_int)
        return bad(r, key, "must be an integer");
    if (v->i64 < lo || v->i64 > hi) {
        char msg[128];
        snprintf(msg, sizeof msg, "%lld is outside [%lld, %lld]", (long long)v->i64,
                 (long long)lo, (long long)hi);
        return bad(r, key, msg);
    }
    *out = v->i64;
    return QCAL_OK;
}

/* A float32 from a number (must be exactly representable after rounding: any finite
 * number within float range) or one of the strings "inf", "-inf", "nan". */
static bool json_f32(const qcal_json *v, float *out)
{
    if (v->type == QCAL_JSON_NUMBER) {
        if (!isfinite(v->number) || fabs(v->number) > 3.4028234663852886e38)
            return false;
        *out = v->is_int ? (float)v->i64 : (float)v->number;
        /* The writer (qcal_fmt_f32) checked that its decimal survives this
         * strtod-then-float path exactly. */
        return true;
    }
    if (v->type == QCAL_JSON_STRING) {
        if (!strcmp(v->str, "inf"))
            *out = INFINITY;
        else if (!strcmp(v->str, "-inf"))
            *out = -INFINITY;
        else if (!strcmp(v->str, "nan"))
            *out = NAN;
        else
            return false;
        return true;
    }
    return false;
}

static qcal_status get_f32_array(const reader *r, const qcal_json *o, const char *key,
                                 int64_t n, float *dst)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v)
        return bad(r, key, "is missing");
    if (v->type != QCAL_JSON_ARRAY)
        return bad(r, key, "must be an array");
    if ((int64_t)v->n != n) {
        char msg[96];
        snprintf(msg, sizeof msg, "has %zu values for %lld channels", v->n, (long long)n);
        return bad(r, key, msg);
    }
    for (size_t i = 0; i < v->n; i++) {
        if (!json_f32(&v->items[i], &dst[i])) {
            char msg[96];
            snprintf(msg, sizeof msg, "value %zu is not a float32 number or \"inf\"/\"-inf\"", i);
            return bad(r, key, msg);
        }
    }
    return QCAL_OK;
}

/* Parses and validates one entry object into e. */
static qcal_status read_entry(reader *r, const qcal_json *o, qcal_calib_entry *e)
{
    if (o->type != QCAL_JSON_OBJECT)
        return qcal_error(QCAL_ERR_FORMAT, "calibration table entry %lld is not an object",
                          (long long)r->index);
    const char *fqn = NULL, *s = NULL;
    int64_t v, ch;
    qcal_status st = get_str(r, o, "fqn", &fqn);
    if (st != QCAL_OK)
        return st;
    if (!*fqn)
        return bad(r, "fqn", "is empty");
    r->fqn = fqn;
    if ((st = get_int(r, o, "channels", 1, (int64_t)1 << 32, &ch)) != QCAL_OK)
        return st;
    qcal_calib_entry x;
    if ((st = qcal_calib_entry_alloc(&x, fqn, ch)) != QCAL_OK)
        return st;
    qcal_calib_entry_arrays xa;
    qcal_calib_entry_arrays_get(&x, &xa);
    float *mn = xa.min_val, *mx = xa.max_val, *sc = xa.scale, *zpf = xa.zero_point_float;
    int32_t *zp = xa.zero_point;
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
#define TRY(expr) do { if ((st = (expr)) != QCAL_OK) goto fail; } while (0)
    TRY(get_str(r, o, "role", &s));
    if (qcal_calib_role_parse(s, &x.role) != QCAL_OK) {
        st = bad(r, "role", "must be \"activation\" or \"weight\"");
        goto fail;
    }
    TRY(get_str(r, o, "observer", &s));
    if (qcal_observer_kind_parse(s, &x.observer) != QCAL_OK) {
        st = bad(r, "observer", "is not an observer kind");
        goto fail;
    }
    TRY(get_str(r, o, "dtype", &s));
    if (qcal_dtype_parse(s, &x.qparams.dtype) != QCAL_OK) {
        st = bad(r, "dtype", "is not quint8, qint8, qint32, float8_e4m3fn or float8_e5m2");
        goto fail;
    }
    TRY(get_str(r, o, "qscheme", &s));
    if (qcal_qscheme_parse(s, &x.qparams.qscheme) != QCAL_OK) {
        st = bad(r, "qscheme", "is not a qscheme name");
        goto fail;
    }
    TRY(get_int(r, o, "axis", -QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1, &v));
    x.qparams.axis = (int32_t)v;
    TRY(get_int(r, o, "quant_min", INT32_MIN, INT32_MAX, &x.qparams.quant_min));
    TRY(get_int(r, o, "quant_max", INT32_MIN, INT32_MAX, &x.qparams.quant_max));
    if (x.qparams.quant_min > x.qparams.quant_max) {
        st = bad(r, "quant_min", "is greater than quant_max");
        goto fail;
    }
    TRY(get_int(r, o, "batches", 0, INT64_MAX, &v));
    x.batches = (uint64_t)v;
    TRY(get_int(r, o, "elements", 0, INT64_MAX, &v));
    x.elements = (uint64_t)v;
    TRY(get_int(r, o, "nonfinite", 0, INT64_MAX, &v));
    x.nonfinite = (uint64_t)v;
    const qcal_json *nd = qcal_json_get(o, "no_data");
    if (!nd || (nd->type != QCAL_JSON_TRUE && nd->type != QCAL_JSON_FALSE)) {
        st = bad(r, "no_data", nd ? "must be true or false" : "is missing");
        goto fail;
    }
    x.no_data = nd->type == QCAL_JSON_TRUE;
    if (!qcal_qscheme_is_per_channel(x.qparams.qscheme) && ch != 1) {
        st = bad(r, "channels", "must be 1 for a per-tensor qscheme");
        goto fail;
    }
    TRY(get_f32_array(r, o, "min", ch, mn));
    TRY(get_f32_array(r, o, "max", ch, mx));
    TRY(get_f32_array(r, o, "scale", ch, sc));
    TRY(get_f32_array(r, o, "zero_point_float", ch, zpf));
    const qcal_json *za = qcal_json_get(o, "zero_point");
    if (!za || za->type != QCAL_JSON_ARRAY || (int64_t)za->n != ch) {
        st = bad(r, "zero_point", "must be an array with one integer per channel");
        goto fail;
    }
    for (int64_t c = 0; c < ch; c++) {
        const qcal_json *z = &za->items[c];
        if (z->type != QCAL_JSON_NUMBER || !z->is_int || z->i64 < INT32_MIN ||
            z->i64 > INT32_MAX) {
            st = bad(r, "zero_point", "holds a value that is not a 32-bit integer");
            goto fail;
        }
        zp[c] = (int32_t)z->i64;
    }
    /* Rebuild the qparams from the range with the entry's config and demand the stored
     * ones: a table either says one consistent thing or is rejected. */
    cfg.kind = x.observer;
    cfg.q.dtype = x.qparams.dtype;
    cfg.q.qscheme = x.qparams.qscheme;
    int64_t qmin, qmax;
    if (qcal_qconfig_range(&cfg.q, &qmin, &qmax) != QCAL_OK || qmin != x.qparams.quant_min ||
        qmax != x.qparams.quant_max) {
        /* Not the dtype's default range: a custom or reduced range. */
        cfg.q.custom_range = true;
        cfg.q.quant_min = x.qparams.quant_min;
        cfg.q.quant_max = x.qparams.quant_max;
    }
    bool any = false;
    for (int64_t c = 0; c < ch; c++) {
        char msg[256];
        if (isnan(mn[c]) || isnan(mx[c]) || (mn[c] > mx[c] && !(mn[c] == INFINITY &&
                                                               mx[c] == -INFINITY))) {
            snprintf(msg, sizeof msg, "channel %lld: range [%g, %g] is not a range",
                     (long long)c, (double)mn[c], (double)mx[c]);
            st = bad(r, "min", msg);
            goto fail;
        }
        if (!(sc[c] > 0.0f && isfinite(sc[c]))) {
            snprintf(msg, sizeof msg, "channel %lld: scale %g is not positive and finite",
                     (long long)c, (double)sc[c]);
            st = bad(r, "scale", msg);
            goto fail;
        }
        float rs = 0.0f, rzf = 0.0f;
        int32_t rz = 0;
        qcal_status qs = qcal_qparams_compute_arrays(&cfg.q, 1, &mn[c], &mx[c], &rs, &rz, &rzf);
        if (qs < 0) {
            snprintf(msg, sizeof msg, "channel %lld: %s", (long long)c, qcal_last_error());
            st = bad(r, "min", msg);
            goto fail;
        }
        any |= qs == QCAL_OK;
        bool fz = x.qparams.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
        if (rs != sc[c] || (!fz && rz != zp[c]) || (fz && rzf != zpf[c])) {
            snprintf(msg, sizeof msg,
                     "channel %lld: scale %.9g / zero-point %d do not match %.9g / %d rebuilt "
                     "from [%.9g, %.9g]", (long long)c, (double)sc[c],
                     fz ? (int)zpf[c] : (int)zp[c], (double)rs, fz ? (int)rzf : (int)rz,
                     (double)mn[c], (double)mx[c]);
            st = bad(r, "scale", msg);
            goto fail;
        }
    }
    if (x.no_data == any) {
        st = bad(r, "no_data", x.no_data ? "is true but the range holds data"
                                         : "is false but no channel has a range");
        goto fail;
    }
#undef TRY
    qcal_calib_entry_finish(&x);
    *e = x;
    return QCAL_OK;
fail:
    qcal_calib_entry_free(&x);
    return st;
}

/* The profile names a table records (those of qcal_onnx_profile_name; calib/ does not
 * depend on onnx/). */
static bool known_profile(const char *s)
{
    return s && (!strcmp(s, "ort") || !strcmp(s, "tensorrt"));
}

qcal_status qcal_calib_table_parse_json(const char *text, size_t len, qcal_calib_table **out)
{
    if ((!text && len) || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table text or output is NULL");
    qcal_json *doc = NULL;
    qcal_status st = qcal_json_parse(text ? text : "", len, NULL, &doc);
    if (st != QCAL_OK)
        return st;
    qcal_calib_table *t = NULL;
    reader r = { 0 };
    const qcal_json *f = qcal_json_get(doc, "format");
    const qcal_json *ver = qcal_json_get(doc, "version");
    const qcal_json *ents = qcal_json_get(doc, "entries");
    if (doc->type != QCAL_JSON_OBJECT || !f || f->type != QCAL_JSON_STRING ||
        strcmp(f->str, TABLE_FORMAT_NAME)) {
        st = qcal_error(QCAL_ERR_FORMAT, "not a qcal calibration table (no \"format\": \""
                        TABLE_FORMAT_NAME "\")");
        goto done;
    }
    if (!ver || ver->type != QCAL_JSON_NUMBER || !ver->is_int) {
        st = qcal_error(QCAL_ERR_FORMAT, "calibration table has no integer \"version\"");
        goto done;
    }
    if (ver->i64 != TABLE_VERSION) {
        st = qcal_error(QCAL_ERR_UNSUPPORTED, "calibration table version %lld is not supported "
                        "(this qcal reads version %d)", (long long)ver->i64, TABLE_VERSION);
        goto done;
    }
    if (!ents || ents->type != QCAL_JSON_ARRAY) {
        st = qcal_error(QCAL_ERR_FORMAT, "calibration table has no \"entries\" array");
        goto done;
    }
    const qcal_json *dg = qcal_json_get(doc, "digest");
    if (dg) {
        bool ok = dg->type == QCAL_JSON_STRING && strlen(dg->str) == 64;
        for (size_t i = 0; ok && i < 64; i++)
            ok = (dg->str[i] >= '0' && dg->str[i] <= '9') || (dg->str[i] >= 'a' && dg->str[i] <= 'f');
        if (!ok) {
            st = qcal_error(QCAL_ERR_FORMAT, "calibration table \"digest\" is not 64 lower-case "
                            "hex digits");
            goto done;
        }
    }
    const qcal_json *pf = qcal_json_get(doc, "profile");
    if (pf && (pf->type != QCAL_JSON_STRING || !known_profile(pf->str))) {
        st = qcal_error(QCAL_ERR_FORMAT, "calibration table \"profile\" is not \"ort\" or "
                        "\"tensorrt\"");
        goto done;
    }
    if ((st = qcal_calib_table_new(&t)) != QCAL_OK)
        goto done;
    if (dg)
        memcpy(t->digest, dg->str, 65);
    if (pf)
        snprintf(t->profile, sizeof t->profile, "%s", pf->str);
    for (size_t i = 0; i < ents->n; i++) {
        qcal_calib_entry e;
        r.index = (int64_t)i;
        r.fqn = NULL;
        if ((st = read_entry(&r, &ents->items[i], &e)) != QCAL_OK)
            goto done;
        if ((st = qcal_calib_table_push(t, &e)) != QCAL_OK)
            goto done;
    }
    st = qcal_calib_table_sort(t);
done:
    qcal_json_free(&doc);
    if (st != QCAL_OK) {
        qcal_calib_table_destroy(&t);
        return st;
    }
    *out = t;
    return QCAL_OK;
}

/* Tables are text of a few MB at most; refuse anything past the JSON parser's bound. */
#define MAX_TABLE_FILE ((size_t)100 << 20)

qcal_status qcal_calib_table_read_json(const char *path, qcal_calib_table **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "calibration table", MAX_TABLE_FILE, &buf, &len);
    if (st == QCAL_OK) {
        st = qcal_calib_table_parse_json(buf, len, out);
        if (st < 0)
            st = qcal_error_wrap(st, "%s", path);
    }
    free(buf);
    return st;
}

qcal_status qcal_calib_table_digest(const qcal_calib_table *t, char hex[65])
{
    if (!t || !hex)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or output is NULL");
    memcpy(hex, t->digest, 65);
    return t->digest[0] ? QCAL_OK : QCAL_NO_DATA;
}

qcal_status qcal_calib_table_set_profile(qcal_calib_table *t, const char *profile)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_calib_table_set_profile: NULL table");
    if (!profile || !*profile) {
        t->profile[0] = '\0';
        return QCAL_OK;
    }
    if (!known_profile(profile))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_calib_table_set_profile: '%s' is not "
                          "ort or tensorrt", profile);
    snprintf(t->profile, sizeof t->profile, "%s", profile);
    return QCAL_OK;
}

const char *qcal_calib_table_profile(const qcal_calib_table *t)
{
    return t && t->profile[0] ? t->profile : NULL;
}
