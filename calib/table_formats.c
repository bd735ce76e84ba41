/* Export formats of a calibration table besides native JSON (calib/table.c; ONNX Runtime's
 * three files in calib/format_onnxruntime.c), the file names of each format inside an
 * output directory, and the atomic writers. Details and examples: docs/calibration.md.
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
 *   - Names are written as they are. A name a format cannot hold (a line break in any text
 *     format; white space in the space-separated ncnn and ONNX Runtime formats; invalid
 *     UTF-8 for ONNX Runtime's JSON and flatbuffers) is QCAL_ERR_UNSUPPORTED naming every
 *     such entry, unless skip_unrepresentable leaves them out. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "calib/calib_internal.h"
#include "io/text.h"
#include "qcal/atomic_file.h"

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
    opt->trt_algorithm = NULL;
    opt->skip_unrepresentable = false;
}

/* File names inside an output directory, per format (ONNX Runtime's are its own). */
static const char *const json_files[] = { "qcal_table.json" };
static const char *const trt_files[] = { "tensorrt.cache" };
static const char *const ort_files[] = { "calibration.json", "calibration.flatbuffers",
                                         "calibration.cache" };
static const char *const ncnn_files[] = { "ncnn.table" };

int qcal_calib_format_file_count(qcal_calib_format format)
{
    return format == QCAL_CALIB_FORMAT_ONNXRUNTIME ? 3
           : (unsigned)format <= QCAL_CALIB_FORMAT_NCNN ? 1 : 0;
}

const char *qcal_calib_format_file_name(qcal_calib_format format, int file)
{
    if (file < 0 || file >= qcal_calib_format_file_count(format))
        return NULL;
    switch (format) {
    case QCAL_CALIB_FORMAT_JSON: return json_files[file];
    case QCAL_CALIB_FORMAT_TENSORRT: return trt_files[file];
    case QCAL_CALIB_FORMAT_ONNXRUNTIME: return ort_files[file];
    case QCAL_CALIB_FORMAT_NCNN: return ncnn_files[file];
    }
    return NULL;
}

bool qcal_calib_format_holds_name(qcal_calib_format format, const char *name, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = NULL;
    if (!name || (unsigned)format > QCAL_CALIB_FORMAT_NCNN) {
        *why = "no name or no such format";
        return false;
    }
    if (format == QCAL_CALIB_FORMAT_JSON)
        return true;
    bool spaces_ok = format == QCAL_CALIB_FORMAT_TENSORRT;
    for (const char *p = name; *p; p++) {
        if (*p == '\n' || *p == '\r') {
            *why = "a line break";
            return false;
        }
        if (!spaces_ok && (*p == ' ' || *p == '\t' || *p == '\v' || *p == '\f')) {
            *why = "white space";
            return false;
        }
    }
    if (format == QCAL_CALIB_FORMAT_ONNXRUNTIME && !qcal_utf8_valid(name)) {
        *why = "invalid UTF-8";
        return false;
    }
    return true;
}

const char *qcal_calib_table_trt_algorithm(const qcal_calib_table *t)
{
    bool all_minmax = true, any = false;
    for (int64_t i = 0; t && i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        if (e->role != QCAL_CALIB_ROLE_ACTIVATION || e->no_data)
            continue;
        any = true;
        all_minmax &= e->observer == QCAL_OBSERVER_MINMAX ||
                      e->observer == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
                      e->observer == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
                      e->observer == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
    }
    return any && all_minmax ? "MinMaxCalibration" : "EntropyCalibration2";
}

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

typedef struct skipped {
    int64_t n;
    const char *first;
    qcal_calib_format format;
    bool skip_names;          /* leave out names the format cannot hold */
} skipped;

/* Whether a format writes e: it has the wanted role, data and a name the format holds
 * (names were checked up front unless skip_names); an entry without data is counted. */
static bool exported(const qcal_calib_entry *e, qcal_calib_role want, skipped *s)
{
    if (e->role != want)
        return false;
    if (e->no_data) {
        if (!s->n++)
            s->first = e->fqn;
        return false;
    }
    return qcal_calib_format_holds_name(s->format, e->fqn, NULL);
}

/* Every exported entry's name fits the format, or one error listing them (as many as fit
 * the message). Entries without data are not exported, so their names do not matter. */
static qcal_status check_names(const qcal_calib_table *t, qcal_calib_format format)
{
    char list[700];
    size_t o = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        const char *why;
        bool wanted = format == QCAL_CALIB_FORMAT_JSON || format == QCAL_CALIB_FORMAT_NCNN ||
                      e->role == QCAL_CALIB_ROLE_ACTIVATION;
        if (!wanted || e->no_data || qcal_calib_format_holds_name(format, e->fqn, &why))
            continue;
        if (o < sizeof list - 80) {
            int w = snprintf(list + o, sizeof list - o, "%s'%.200s' (%s)", bad ? ", " : "",
                             e->fqn, why);
            o += w > 0 ? (size_t)w : 0;
            if (o >= sizeof list)
                o = sizeof list - 1;
        } else if (o < sizeof list - 5) {
            o += (size_t)snprintf(list + o, sizeof list - o, ", ...");
        }
        bad++;
    }
    if (!bad)
        return QCAL_OK;
    return qcal_error(QCAL_ERR_UNSUPPORTED, "the %s format cannot hold %lld name%s: %s; leave "
                      "them out with skip_unrepresentable (qcal: --skip-unrepresentable)",
                      qcal_calib_format_name(format), (long long)bad, bad == 1 ? "" : "s",
                      list);
}

/* FP8 entries (float8_e4m3fn, float8_e5m2): only the JSON table carries their dtype and
 * scales. The TensorRT calibration cache, ONNX Runtime's TensorRT-EP files and ncnn's table
 * hold int8 scales (amax / 127) and nothing that says FP8, so they refuse a table with an
 * FP8 entry they would write; FP8 goes to engines as a Q/DQ model (qcal qdq) or a serving
 * checkpoint. */
static qcal_status check_float8(const qcal_calib_table *t, qcal_calib_format format)
{
    if (format == QCAL_CALIB_FORMAT_JSON)
        return QCAL_OK;
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        bool wanted = format == QCAL_CALIB_FORMAT_NCNN || e->role == QCAL_CALIB_ROLE_ACTIVATION;
        if (wanted && !e->no_data && qcal_dtype_is_float8(e->qparams.dtype))
            return qcal_error(QCAL_ERR_UNSUPPORTED,
                              "the %s format cannot carry FP8 ('%.200s' is %s): it holds int8 "
                              "scales; write json, or an FP8 Q/DQ model with qcal qdq",
                              qcal_calib_format_name(format), e->fqn,
                              qcal_dtype_name(e->qparams.dtype));
    }
    return QCAL_OK;
}

/* TensorRT: "TRT-<version>-<algorithm>\n" then "<name>: <hex>\n" per activation, in table
 * order (sorted by name). hex = the 8 lower-case, zero-padded hex digits of the bits of the
 * float32 scale = amax / 127 (float32 division): TensorRT reads any width, but ModelOpt's
 * reader (--calibration_cache_path) takes bytes.fromhex + struct "!f", which needs all 8
 * (a subnormal scale of a tiny amax has fewer significant digits). Weights are left out:
 * TensorRT computes weight scales itself. */
static qcal_status fmt_tensorrt(const qcal_calib_table *t, const qcal_calib_export_options *o,
                                qcal_buf *b, skipped *sk)
{
    const char *algo = o->trt_algorithm ? o->trt_algorithm : qcal_calib_table_trt_algorithm(t);
    for (const char *p = o->trt_version; *p; p++)
        if (*p < '0' || *p > '9')
            return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT version '%s' is not all digits",
                              o->trt_version);
    if (!*o->trt_version || !*algo || strpbrk(algo, "\n\r -"))
        return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT header needs a version and an "
                          "algorithm without spaces, dashes or line breaks (got '%s', '%s')",
                          o->trt_version, algo);
    put(b, "TRT-");
    put(b, o->trt_version);
    put(b, "-");
    put(b, algo);
    put(b, "\n");
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        if (!exported(e, QCAL_CALIB_ROLE_ACTIVATION, sk))
            continue;
        float scale = qcal_calib_export_amax(e) / 127.0f;
        uint32_t bits;
        memcpy(&bits, &scale, sizeof bits);
        char tmp[16];
        snprintf(tmp, sizeof tmp, ": %08x\n", (unsigned)bits);
        put(b, e->fqn);
        put(b, tmp);
    }
    return QCAL_OK;
}

/* ONNX Runtime: file `part` of its three (calib/format_onnxruntime.c) over the exported
 * activations, in table order (sorted by name, as write_calibration_table sorts). */
static qcal_status fmt_onnxruntime(const qcal_calib_table *t, int part, qcal_buf *b,
                                   skipped *sk)
{
    const qcal_calib_entry **v = qcal_calloc((size_t)(t->n > 0 ? t->n : 1), sizeof *v);
    if (!v)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    int64_t n = 0;
    for (int64_t i = 0; i < t->n; i++)
        if (exported(&t->e[i], QCAL_CALIB_ROLE_ACTIVATION, sk))
            v[n++] = &t->e[i];
    qcal_status st = qcal_calib_format_onnxruntime(v, n, part, b);
    free(v);
    return st;
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
            if (want == QCAL_CALIB_ROLE_WEIGHT) {
                size_t n = strlen(e->fqn) + 1;
                char *layer = qcal_malloc(n);
                if (!layer)
                    return QCAL_ERR_NO_MEMORY;
                ncnn_layer(e->fqn, layer, n);
                put(b, layer);
                free(layer);
                put(b, "_param_0 ");
                for (int64_t c = 0; c < e->qparams.channels; c++) {
                    float a = 0.0f;
                    qcal_calib_entry_amax(e, c, &a);
                    if (!(a > 0.0f))
                        a = 1.0f;   /* an all-zero (or empty) channel: see the file comment */
                    snprintf(tmp, sizeof tmp, "%f ", (double)(127.0f / a));
                    put(b, tmp);
                }
            } else {
                put(b, e->fqn);
                snprintf(tmp, sizeof tmp, " %f ", (double)(127.0f / qcal_calib_export_amax(e)));
                put(b, tmp);
            }
            put(b, "\n");
        }
    }
    return QCAL_OK;
}

qcal_status qcal_calib_table_export_count(const qcal_calib_table *t, qcal_calib_format format,
                                          const qcal_calib_export_options *opt, int64_t *n)
{
    if (!t || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or output is NULL");
    if ((unsigned)format > QCAL_CALIB_FORMAT_NCNN)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format %d", (int)format);
    if (format == QCAL_CALIB_FORMAT_JSON) {
        *n = t->n;
        return QCAL_OK;
    }
    bool skip_names = opt && opt->skip_unrepresentable;
    int64_t c = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const qcal_calib_entry *e = &t->e[i];
        if (e->no_data ||
            (format != QCAL_CALIB_FORMAT_NCNN && e->role != QCAL_CALIB_ROLE_ACTIVATION))
            continue;
        c += !skip_names || qcal_calib_format_holds_name(format, e->fqn, NULL);
    }
    *n = c;
    return QCAL_OK;
}

qcal_status qcal_calib_table_format_file(const qcal_calib_table *t, qcal_calib_format format,
                                         int file, const qcal_calib_export_options *opt,
                                         char **buf, size_t *len)
{
    if (!t || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table or outputs are NULL");
    if (file < 0 || file >= qcal_calib_format_file_count(format))
        return qcal_error(QCAL_ERR_INVALID_ARG, "format %d has no file %d", (int)format, file);
    qcal_calib_export_options o;
    qcal_calib_export_options_default(&o);
    if (opt)
        o = *opt;
    if (!o.trt_version)
        return qcal_error(QCAL_ERR_INVALID_ARG, "TensorRT version is NULL");
    qcal_status st;
    if (!o.skip_unrepresentable && (st = check_names(t, format)) != QCAL_OK)
        return st;
    if ((st = check_float8(t, format)) != QCAL_OK)
        return st;
    qcal_buf b = { 0 };
    skipped sk = { 0, NULL, format, o.skip_unrepresentable };
    switch (format) {
    case QCAL_CALIB_FORMAT_JSON: st = qcal_calib_table_json(t, &b); break;
    case QCAL_CALIB_FORMAT_TENSORRT: st = fmt_tensorrt(t, &o, &b, &sk); break;
    case QCAL_CALIB_FORMAT_ONNXRUNTIME: st = fmt_onnxruntime(t, file, &b, &sk); break;
    case QCAL_CALIB_FORMAT_NCNN: st = fmt_ncnn(t, &b, &sk); break;
    default:
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format %d", (int)format);
    }
    qcal_buf_append(&b, "", 1);   /* NUL terminator (the flatbuffer is binary: use len) */
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

qcal_status qcal_calib_table_format(const qcal_calib_table *t, qcal_calib_format format,
                                    const qcal_calib_export_options *opt, char **buf,
                                    size_t *len)
{
    /* One-file view: ONNX Runtime's calibration.cache (its text file). */
    int file = format == QCAL_CALIB_FORMAT_ONNXRUNTIME ? 2 : 0;
    if ((unsigned)format > QCAL_CALIB_FORMAT_NCNN)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format %d", (int)format);
    return qcal_calib_table_format_file(t, format, file, opt, buf, len);
}

/* Makes dir (one level, mode 0777 less the umask) unless it is already a directory. */
static qcal_status ensure_dir(const char *dir, const char *why)
{
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return QCAL_OK;
        return qcal_error(QCAL_ERR_IO, "'%s' is not a directory (%s)", dir, why);
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return qcal_error(QCAL_ERR_IO, "cannot create directory '%s': %s", dir,
                          strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return qcal_error(QCAL_ERR_IO, "'%s' is not a directory (%s)", dir, why);
    return QCAL_OK;
}

qcal_status qcal_calib_table_write(const qcal_calib_table *t, qcal_calib_format format,
                                   const qcal_calib_export_options *opt, const char *path)
{
    if (!path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output path is NULL");
    /* A format of several files (ONNX Runtime's three) goes into the directory path, as
     * `qcal calibrate --format onnxruntime -o DIR` writes it. */
    if ((unsigned)format <= QCAL_CALIB_FORMAT_NCNN && qcal_calib_format_file_count(format) > 1)
        return qcal_calib_table_write_dir(t, 1, &format, opt, path);
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_calib_table_format(t, format, opt, &buf, &len);
    if (st < 0)
        return st;
    char note[1024] = "";
    if (st == QCAL_NO_DATA)
        snprintf(note, sizeof note, "%s", qcal_last_error());
    qcal_atomic_file f;
    qcal_status ws = qcal_atomic_file_open(&f, path);
    if (ws == QCAL_OK) {
        if (len && fwrite(buf, 1, len, f.fp) != len) {
            int e = errno ? errno : EIO;
            qcal_atomic_file_abort(&f);
            ws = qcal_error(QCAL_ERR_IO, "cannot write %zu bytes to '%s': %s", len, path,
                            strerror(e));
        } else {
            ws = qcal_atomic_file_commit(&f);
        }
    }
    free(buf);
    if (ws != QCAL_OK)
        return ws;
    if (st == QCAL_NO_DATA)
        return qcal_error(QCAL_NO_DATA, "%s", note);
    return QCAL_OK;
}

qcal_status qcal_calib_table_write_dir(const qcal_calib_table *t, int64_t nformats,
                                       const qcal_calib_format *formats,
                                       const qcal_calib_export_options *opt, const char *dir)
{
    if (!t || !dir || nformats < 1 || !formats)
        return qcal_error(QCAL_ERR_INVALID_ARG, "table, formats or directory is NULL/empty");
    for (int64_t i = 0; i < nformats; i++) {
        if ((unsigned)formats[i] > QCAL_CALIB_FORMAT_NCNN)
            return qcal_error(QCAL_ERR_INVALID_ARG, "unknown table format %d",
                              (int)formats[i]);
        for (int64_t j = 0; j < i; j++)
            if (formats[j] == formats[i])
                return qcal_error(QCAL_ERR_INVALID_ARG, "format %s listed twice",
                                  qcal_calib_format_name(formats[i]));
    }
    /* 1. Format every file in memory: any failure (a name a format cannot hold, ...)
     *    happens before the file system is touched (but for creating dir, below). */
    enum { MAXF = 16 };
    char *buf[MAXF] = { 0 };
    size_t len[MAXF] = { 0 };
    char *path[MAXF] = { 0 };
    qcal_atomic_file af[MAXF];
    memset(af, 0, sizeof af);
    int nfiles = 0;
    qcal_status st = QCAL_OK;
    char note[1024] = "";
    for (int64_t i = 0; i < nformats && st >= 0; i++) {
        for (int k = 0; k < qcal_calib_format_file_count(formats[i]) && st >= 0; k++) {
            if (nfiles == MAXF) {
                st = qcal_error(QCAL_ERR_INVALID_ARG, "too many output files");
                break;
            }
            qcal_status fs = qcal_calib_table_format_file(t, formats[i], k, opt, &buf[nfiles],
                                                          &len[nfiles]);
            if (fs < 0) {
                st = fs;
                break;
            }
            if (fs == QCAL_NO_DATA && !note[0])
                snprintf(note, sizeof note, "%s", qcal_last_error());
            const char *name = qcal_calib_format_file_name(formats[i], k);
            size_t pl = strlen(dir) + strlen(name) + 2;
            path[nfiles] = qcal_malloc(pl);
            if (!path[nfiles]) {
                qcal_free(buf[nfiles]);
                buf[nfiles] = NULL;
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            snprintf(path[nfiles], pl, "%s/%s", dir, name);
            nfiles++;
        }
    }
    if (st >= 0) {
        char why[160];
        snprintf(why, sizeof why, "%s write%s into a directory",
                 nformats > 1 ? "several formats" : qcal_calib_format_name(formats[0]),
                 nformats > 1 ? "" : "s");
        st = ensure_dir(dir, why);
    }
    /* 2. Every file to its temporary; 3. only when all were written, rename them all. */
    int opened = 0;
    for (int i = 0; i < nfiles && st >= 0; i++, opened++) {
        qcal_status ws = qcal_atomic_file_open(&af[i], path[i]);
        if (ws == QCAL_OK && len[i] && fwrite(buf[i], 1, len[i], af[i].fp) != len[i])
            ws = qcal_error(QCAL_ERR_IO, "cannot write %zu bytes to '%s': %s", len[i],
                            path[i], strerror(errno ? errno : EIO));
        if (ws == QCAL_OK && (fflush(af[i].fp) != 0 ||
                              (fsync(fileno(af[i].fp)) != 0 && errno != EINVAL)))
            ws = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path[i], strerror(errno));
        if (ws != QCAL_OK) {
            st = ws;
            opened++;
            break;
        }
    }
    if (st >= 0) {
        for (int i = 0; i < nfiles; i++) {
            qcal_status cs = qcal_atomic_file_commit(&af[i]);
            if (cs != QCAL_OK && st >= 0)
                st = cs;
        }
    } else {
        for (int i = 0; i < opened; i++)
            qcal_atomic_file_abort(&af[i]);
    }
    for (int i = 0; i < nfiles; i++) {
        qcal_free(buf[i]);
        free(path[i]);
    }
    if (st >= 0 && note[0])
        return qcal_error(QCAL_NO_DATA, "%s", note);
    return st < 0 ? st : QCAL_OK;
}
