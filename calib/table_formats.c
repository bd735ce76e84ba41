/* Export formats of a calibration table besides native JSON (calib/table.c), and the
 * atomic file writer shared by all formats. Details and examples: docs/calibration.md.
 *
 * Common rules:
 *   - amax of an entry is max(|min|, |max|) of the range its qparams come from, the
 *     maximum over channels where a format wants one number per tensor.
 *   - An entry without data (no finite value seen) has no range to export: it is left out
 *     and the call returns QCAL_NO_DATA (a success) with the count and the first name in
 *     qcal_last_error().
 *   - amax == 0 (every value was exactly zero) is exported as amax = 1: any positive scale
 *     represents zeros exactly, and 1 keeps every derived number finite (ncnn's tools
 *     write 127/0 = inf there, ncnn#6819).
 *   - Names are written as they are; a name with a newline (every format) or, in the
 *     space-separated ncnn and ONNX Runtime formats, a space or tab cannot be represented
 *     and is QCAL_ERR_UNSUPPORTED. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "core/atomic_file.h"

qcal_status qcal_calib_table_json(const qcal_calib_table *t, qcal_buf *b);

static const char *const format_names[] = { "json", "tensorrt", "onnxruntime", "ncnn" };

const char *qcal_calib_format_name(qcal_calib_format format)
{
    if ((unsigned)format > QCAL_CALIB_FORMAT_NCNN)
        return "unknown";
    return format_names[format];
}

qcal_status qcal_calib_format_parse(const char *name, qcal_calib_format *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "format name or output is NULL");
    for (int i = 0; i <= QCAL_CALIB_FORMAT_NCNN; i++) {
        if (!strcmp(name, format_names[i])) {
            *out = (qcal_calib_format)i;
            return QCAL_OK;
        }
    }
    if (!strcmp(name, "trt")) {
        *out = QCAL_CALIB_FORMAT_TENSORRT;
        return QCAL_OK;
    }
    if (!strcmp(name, "ort")) {
        *out = QCAL_CALIB_FORMAT_ONNXRUNTIME;
        return QCAL_OK;
    }
    return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format '%s' (expected json, tensorrt, "
                      "onnxruntime or ncnn)", name);
}

void qcal_calib_export_options_default(qcal_calib_export_options *opt)
{
    if (!opt)
        return;
    opt->trt_version = "8601";
    opt->trt_algorithm = "EntropyCalibration2";
}

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

/* amax over all channels with the zero rule applied (entry has data). */
static float export_amax(const qcal_calib_entry *e)
{
    float m = 0.0f;
    for (int64_t c = 0; c < e->channels; c++) {
        float a = 0.0f;
        qcal_calib_entry_amax(e, c, &a);
        m = fmaxf(m, a);
    }
    return m > 0.0f ? m : 1.0f;
}

static qcal_status check_name(const qcal_calib_entry *e, bool spaces_ok, const char *fmt)
{
    for (const char *p = e->fqn; *p; p++) {
        if (*p == '\n' || *p == '\r' || (!spaces_ok && (*p == ' ' || *p == '\t')))
            return qcal_error(QCAL_ERR_UNSUPPORTED,
                              "%s name '%s' contains %s, which the %s format cannot hold",
                              qcal_calib_role_name(e->role), e->fqn,
                              (*p == '\n' || *p == '\r') ? "a line break" : "white space", fmt);
    }
    return QCAL_OK;
}

typedef struct skipped {
    int64_t n;
    const char *first;
} skipped;

/* Whether a format writes e: it has the wanted role and data; an entry without data is
 * counted as skipped. */
static bool exported(const qcal_calib_entry *e, qcal_calib_role want, skipped *s)
{
    if (e->role != want)
        return false;
    if (e->no_data) {
        if (!s->n++)
            s->first = e->fqn;
        return false;
    }
    return true;
}

/* TensorRT: "TRT-<version>-<algorithm>\n" then "<name>: <hex>\n" per activation, in table
 * order (sorted by name). hex = lower-case, not zero-padded bits of the float32
 * scale = amax / 127 (float32 division). Weights are left out: TensorRT computes weight
 * scales itself. */
static qcal_status fmt_tensorrt(const qcal_calib_table *t, const qcal_calib_export_options *o,
                                qcal_buf *b, skipped *sk)
{
    for (const char *p = o->trt_version; *p; p++)
        if (*p < '0' || *p > '9')
            return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT version '%s' is not all digits",
                              o->trt_version);
    if (!*o->trt_version || !*o->trt_algorithm || strpbrk(o->trt_algorithm, "\n\r -"))
        return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT header needs a version and an "
                          "algorithm without spaces, dashes or line breaks (got '%s', '%s')",
                          o->trt_version, o->trt_algorithm);
    put(b, "TRT-");
    put(b, o->trt_version);
    put(b, "-");
    put(b, o->trt_algorithm);
    put(b, "\n");
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        if (!exported(e, QCAL_CALIB_ROLE_ACTIVATION, sk))
            continue;
        qcal_status st = check_name(e, true, "TensorRT");
        if (st != QCAL_OK)
            return st;
        float scale = export_amax(e) / 127.0f;
        uint32_t bits;
        memcpy(&bits, &scale, sizeof bits);
        char tmp[16];
        snprintf(tmp, sizeof tmp, ": %x\n", (unsigned)bits);
        put(b, e->fqn);
        put(b, tmp);
    }
    return QCAL_OK;
}

/* ONNX Runtime calibration.cache: "<name> <amax>\n" per activation, sorted by name, amax
 * as the shortest decimal that reads back as the same float32. */
static qcal_status fmt_onnxruntime(const qcal_calib_table *t, qcal_buf *b, skipped *sk)
{
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        if (!exported(e, QCAL_CALIB_ROLE_ACTIVATION, sk))
            continue;
        qcal_status st = check_name(e, false, "ONNX Runtime");
        if (st != QCAL_OK)
            return st;
        char tmp[48];
        qcal_calib_fmt_f32(tmp, sizeof tmp, export_amax(e));
        put(b, e->fqn);
        put(b, " ");
        put(b, tmp);
        put(b, "\n");
    }
    return QCAL_OK;
}

/* ncnn layer name of a weight fqn: "<layer>.weight" -> "<layer>", else the fqn. */
static void ncnn_layer(const char *fqn, char *dst, size_t cap)
{
    size_t n = strlen(fqn);
    if (n > 7 && !strcmp(fqn + n - 7, ".weight"))
        n -= 7;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, fqn, n);
    dst[n] = '\0';
}

/* ncnn .table: first "<layer>_param_0 m0 m1 ... \n" per weight (one multiplier 127/amax
 * per output channel), then "<layer> m \n" per activation (the input of that layer), every
 * value "%f " as ncnn2table prints it. Multipliers are float32 127 / amax. */
static qcal_status fmt_ncnn(const qcal_calib_table *t, qcal_buf *b, skipped *sk)
{
    char tmp[64];
    for (int pass = 0; pass < 2; pass++) {
        qcal_calib_role want = pass == 0 ? QCAL_CALIB_ROLE_WEIGHT : QCAL_CALIB_ROLE_ACTIVATION;
        for (int64_t i = 0; i < t->n; i++) {
            const qcal_calib_entry *e = &t->e[i];
            if (!exported(e, want, sk))
                continue;
            qcal_status st = check_name(e, false, "ncnn");
            if (st != QCAL_OK)
                return st;
            if (want == QCAL_CALIB_ROLE_WEIGHT) {
                size_t n = strlen(e->fqn) + 1;
                char *layer = qcal_malloc(n);
                if (!layer)
                    return QCAL_ERR_NO_MEMORY;
                ncnn_layer(e->fqn, layer, n);
                put(b, layer);
                free(layer);
                put(b, "_param_0 ");
                for (int64_t c = 0; c < e->channels; c++) {
                    float a = 0.0f;
                    qcal_calib_entry_amax(e, c, &a);
                    if (!(a > 0.0f))
                        a = 1.0f;   /* an all-zero (or empty) channel: see the file comment */
                    snprintf(tmp, sizeof tmp, "%f ", (double)(127.0f / a));
                    put(b, tmp);
                }
            } else {
                put(b, e->fqn);
                snprintf(tmp, sizeof tmp, " %f ", (double)(127.0f / export_amax(e)));
                put(b, tmp);
            }
            put(b, "\n");
        }
    }
    return QCAL_OK;
}

qcal_status qcal_calib_table_format(const qcal_calib_table *t, qcal_calib_format format,
                                    const qcal_calib_export_options *opt, char **buf,
                                    size_t *len)
{
    if (!t || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or outputs are NULL");
    qcal_calib_export_options o;
    qcal_calib_export_options_default(&o);
    if (opt)
        o = *opt;
    if (!o.trt_version || !o.trt_algorithm)
        return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT version or algorithm is NULL");
    qcal_buf b = { 0 };
    skipped sk = { 0 };
    qcal_status st;
    switch (format) {
    case QCAL_CALIB_FORMAT_JSON: st = qcal_calib_table_json(t, &b); break;
    case QCAL_CALIB_FORMAT_TENSORRT: st = fmt_tensorrt(t, &o, &b, &sk); break;
    case QCAL_CALIB_FORMAT_ONNXRUNTIME: st = fmt_onnxruntime(t, &b, &sk); break;
    case QCAL_CALIB_FORMAT_NCNN: st = fmt_ncnn(t, &b, &sk); break;
    default:
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format %d", (int)format);
    }
    qcal_buf_append(&b, "", 1);   /* NUL terminator */
    if (st == QCAL_OK && b.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the %s table text",
                        qcal_calib_format_name(format));
    if (st != QCAL_OK) {
        qcal_buf_free(&b);
        return st;
    }
    *buf = (char *)b.data;
    *len = b.len - 1;
    if (sk.n)
        return qcal_error(QCAL_NO_DATA, "%lld entr%s without data left out of the %s table "
                          "(first: '%s')", (long long)sk.n, sk.n == 1 ? "y" : "ies",
                          qcal_calib_format_name(format), sk.first);
    return QCAL_OK;
}

qcal_status qcal_calib_table_write(const qcal_calib_table *t, qcal_calib_format format,
                                   const qcal_calib_export_options *opt, const char *path)
{
    if (!path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output path is NULL");
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_calib_table_format(t, format, opt, &buf, &len);
    if (st < 0)
        return st;
    char note[1024] = "";
    if (st == QCAL_NO_DATA)
        snprintf(note, sizeof note, "%s", qcal_last_error());
    qcal_atomic_file f;
    qcal_status ws = qcal_atomic_open(&f, path);
    if (ws == QCAL_OK) {
        if (len && fwrite(buf, 1, len, f.fp) != len) {
            qcal_atomic_abort(&f);
            ws = qcal_error(QCAL_ERR_IO, "cannot write %zu bytes to '%s'", len, path);
        } else {
            ws = qcal_atomic_commit(&f);
        }
    }
    free(buf);
    if (ws != QCAL_OK)
        return ws;
    if (st == QCAL_NO_DATA)
        return qcal_error(QCAL_NO_DATA, "%s", note);
    return QCAL_OK;
}
