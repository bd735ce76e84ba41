/* Helpers shared by every qcal subcommand (see tools/cli_common.h). */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_common.h"
#include "cli_progress.h"

void cli_observer_option_name(const qcal_observer_key *k, char *out, size_t cap)
{
    size_t i = 0;
    for (; k->name[i] && i + 1 < cap; i++)
        out[i] = k->name[i] == '_' ? '-' : k->name[i];
    out[i] = '\0';
}

static cli_error_sink error_sink;
static void *error_sink_user;

void cli_set_error_sink(cli_error_sink fn, void *user)
{
    error_sink = fn;
    error_sink_user = user;
}

/* The message of one line: newlines become spaces, and a leading "<cmd>: " (a library
 * message that names its function, "quantize: scale 0 must be > 0") is dropped, since the
 * line already says "qcal: <cmd>: "; "<cmd> WORD: " ("fakequant learnable: ...") keeps
 * "WORD: ". */
static const char *one_line(const char *cmd, char *msg, size_t cap, const char *fmt,
                            va_list ap)
{
    vsnprintf(msg, cap, fmt, ap);
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    size_t n = strlen(cmd);
    const char *m = msg;
    for (;;) {
        if (!n || strncmp(m, cmd, n))
            return m;
        if (m[n] == ':' && m[n + 1] == ' ') {
            m += n + 2;
        } else if (m[n] == ' ') {
            size_t w = strcspn(m + n + 1, " :");
            if (w == 0 || m[n + 1 + w] != ':' || m[n + 2 + w] != ' ')
                return m;
            m += n + 1;
        } else {
            return m;
        }
    }
}

static void vreport(const char *cmd, const char *fmt, va_list ap)
{
    char buf[2048];
    const char *msg = one_line(cmd, buf, sizeof buf, fmt, ap);
    if (error_sink) {
        error_sink(error_sink_user, cmd, msg);
    } else {
        cli_progress_interrupt();   /* the line starts clean, not after a progress bar */
        fprintf(stderr, "qcal: %s: %s\n", cmd, msg);
    }
}

int cli_flush(const char *cmd, FILE *f)
{
    errno = 0;
    if (fflush(f) == 0 && !ferror(f))
        return 0;
    int e = errno ? errno : EIO;
    return cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write to standard %s: %s",
                    f == stderr ? "error" : "output", strerror(e));
}

void cli_warn(const char *cmd, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    const char *msg = one_line(cmd, buf, sizeof buf, fmt, ap);
    va_end(ap);
    cli_progress_interrupt();
    fprintf(stderr, "qcal: %s: warning: %s\n", cmd, msg);
}

void cli_note(const char *cmd, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    const char *msg = one_line(cmd, buf, sizeof buf, fmt, ap);
    va_end(ap);
    cli_progress_interrupt();
    fprintf(stderr, "qcal: %s: note: %s\n", cmd, msg);
}

int cli_fail(const char *cmd, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    return code;
}

int cli_fail_status(const char *cmd, int code, qcal_status st)
{
    const char *msg = qcal_last_error();
    return cli_fail(cmd, code, "%s", (msg && *msg) ? msg : qcal_status_str(st));
}

int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = (s && *s >= '0' && *s <= '9') ? strtoull(s, &end, 10) : 0;
    if (!s || !end || end == s || errno == ERANGE)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: '%s' is not a size (bytes, or a number "
                        "with K, M, G or T)", opt, s ? s : "");
    int shift = 0;
    switch (*end) {
    case '\0': break;
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: end = NULL; break;
    }
    if (end && shift && (!strcmp(end, "iB") || !strcmp(end, "B")))
        end += strlen(end);
    if (!end || *end || (shift && v > (UINT64_MAX >> shift)))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: '%s' is not a size (bytes, or a number "
                        "with K, M, G or T)", opt, s);
    *out = (uint64_t)v << shift;
    return 0;
}

int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = (s && *s) ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || isspace((unsigned char)*s) || *end != '\0' || end == s)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: '%s' is not an integer", opt, s ? s : "");
    if (errno == ERANGE || v < lo || v > hi)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: %s is outside [%lld, %lld]", opt, s,
                        (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return 0;
}

int cli_parse_f64(const char *cmd, const char *opt, const char *s, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = (s && *s) ? strtod(s, &end) : 0.0;
    if (!s || !*s || isspace((unsigned char)*s) || *end != '\0' || end == s)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: '%s' is not a number", opt, s ? s : "");
    /* strtod accepts "nan", "inf" and overflows to HUGE_VAL with ERANGE; underflow (tiny
     * values, also ERANGE) is accepted as the nearest double. */
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: '%s' is not a finite number", opt, s);
    *out = v;
    return 0;
}

int cli_parse_f32(const char *cmd, const char *opt, const char *s, float *out)
{
    double d = 0.0;
    int rc = cli_parse_f64(cmd, opt, s, &d);
    if (rc)
        return rc;
    float f = (float)d;
    if (!isfinite(f))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s: %s is outside the float32 range", opt, s);
    *out = f;
    return 0;
}

bool cli_observer_opt(cli_observer_args *a, int id, const char *val)
{
    int64_t k = (id - CLI_OBS_BASE) / 2;
    if (id < CLI_OBS_BASE || k >= qcal_observer_config_key_count())
        return false;
    if (a->n == CLI_OBS_MAX) {
        a->overflow = true;
        return true;
    }
    a->key[a->n] = qcal_observer_config_key(k)->name;
    a->value[a->n++] = val;
    return true;
}

int cli_observer_config(const char *cmd, const cli_observer_args *a,
                        qcal_observer_kind default_kind, qcal_observer_config *cfg)
{
    if (a->overflow)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "more than %d observer options", CLI_OBS_MAX);
    qcal_observer_config c;
    qcal_observer_config_default(&c, default_kind);
    qcal_status st = qcal_observer_config_apply(&c, a->n, a->key, a->value);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
    *cfg = c;
    return 0;
}

/* Word-wraps text at column 79 with continuation lines indented to col. */
static void wrap(FILE *f, const char *text, int col, int start)
{
    int pos = start;
    const char *w = text;
    while (*w) {
        const char *e = strchr(w, ' ');
        int len = e ? (int)(e - w) : (int)strlen(w);
        if (pos > col && pos + 1 + len > 79) {
            fprintf(f, "\n%*s", col, "");
            pos = col;
        } else if (pos > col) {
            fputc(' ', f);
            pos++;
        }
        fwrite(w, 1, (size_t)len, f);
        pos += len;
        w += len;
        while (*w == ' ')
            w++;
    }
    fputc('\n', f);
}

void cli_observer_help(FILE *f, qcal_observer_kind default_kind)
{
    const int col = 27;
    int64_t nk = qcal_observer_config_key_count();
    for (int64_t i = 0; i < nk; i++) {
        const qcal_observer_key *k = qcal_observer_config_key(i);
        char name[64], head[160], text[1024];
        cli_observer_option_name(k, name, sizeof name);
        if (k->flag_only)
            snprintf(head, sizeof head, "  --%s", k->cli_flag);
        else if (k->cli_flag)
            snprintf(head, sizeof head, "  --%s %s, --%s", name, k->metavar, k->cli_flag);
        else
            snprintf(head, sizeof head, "  --%s %s", name, k->metavar);
        int n = (int)strlen(head);
        fputs(head, f);
        if (n >= col - 1) {
            fprintf(f, "\n%*s", col, "");
            n = col;
        } else {
            fprintf(f, "%*s", col - n, "");
            n = col;
        }
        size_t o = 0;
        if (!strcmp(k->name, "observer") && default_kind == QCAL_OBSERVER_KIND_COUNT)
            o += (size_t)snprintf(text + o, sizeof text - o, "observer kind (default auto, "
                                  "above);");
        else if (!strcmp(k->name, "observer"))
            o += (size_t)snprintf(text + o, sizeof text - o, "observer kind (default %s);",
                                  qcal_observer_kind_name(default_kind));
        else
            o += (size_t)snprintf(text + o, sizeof text - o, "%s", k->help);
        if (k->flag_only)
            o += (size_t)snprintf(text + o, sizeof text - o, "; rules: %s=%s", k->name,
                                  k->choices ? k->choices : k->flag_value);
        else if (k->cli_flag)
            o += (size_t)snprintf(text + o, sizeof text - o, "; --%s is %s=%s", k->cli_flag,
                                  k->name, k->flag_value);
        if (k->choices && !k->flag_only) {
            o += (size_t)snprintf(text + o, sizeof text - o, "%s one of: ",
                                  text[o - 1] == ';' ? "" : ";");
            for (const char *c = k->choices; *c && o + 3 < sizeof text; c++) {
                if (*c == '|') {
                    text[o++] = ',';
                    text[o++] = ' ';
                } else {
                    text[o++] = *c;
                }
            }
            text[o] = '\0';
        }
        wrap(f, text, col, n);
    }
}

int cli_read_f32(const char *cmd, const char *path, qcal_npy_array *arr)
{
    qcal_status st = qcal_npy_read_f32(path, arr);
    return st == QCAL_OK ? 0 : cli_fail_status(cmd, QCAL_EXIT_INPUT, st);
}

int cli_read_npy(const char *cmd, const char *path, qcal_npy_array *arr)
{
    qcal_status st = qcal_npy_read(path, arr);
    return st == QCAL_OK ? 0 : cli_fail_status(cmd, QCAL_EXIT_INPUT, st);
}

int cli_read_zero_points_npy(const char *cmd, const char *path, int64_t ch,
                             qcal_npy_array *arr)
{
    int rc = cli_read_npy(cmd, path, arr);
    if (rc)
        return rc;
    if (arr->ndim != 1 || arr->numel != ch) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': expected a 1-D array of %lld zero-points, got "
                      "%d dimensions and %lld elements", path, (long long)ch,
                      (int)arr->ndim, (long long)arr->numel);
        qcal_npy_array_free(arr);
    }
    return rc;
}

int cli_qparam_opt(const char *cmd, cli_qparam_args *q, int id, const char *val)
{
    int rc;
    int64_t v;
    switch (id) {
    case CLI_QP_SCALE:
        if ((rc = cli_parse_f32(cmd, "--scale", val, &q->scale)))
            return rc;
        q->have_scale = true;
        return 0;
    case CLI_QP_ZERO_POINT:
        if (q->integer_zero_point) {
            if ((rc = cli_parse_i64(cmd, "--zero-point", val, INT32_MIN, INT32_MAX, &v)))
                return rc;
            q->zero_point = (double)v;
        } else if ((rc = cli_parse_f64(cmd, "--zero-point", val, &q->zero_point))) {
            return rc;
        }
        q->have_zp = true;
        return 0;
    case CLI_QP_AXIS:
        if ((rc = cli_parse_i64(cmd, "--axis", val, -QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1, &v)))
            return rc;
        q->axis = (int32_t)v;
        q->have_axis = true;
        return 0;
    case CLI_QP_SCALES: q->scales_path = val; return 0;
    case CLI_QP_ZERO_POINTS: q->zps_path = val; return 0;
    default: return -1;
    }
}

bool cli_qparam_per_channel(const cli_qparam_args *q)
{
    return q->have_axis || q->scales_path || q->zps_path;
}

int cli_qparam_check(const char *cmd, const cli_qparam_args *q)
{
    bool per_channel = cli_qparam_per_channel(q);
    bool have_scale = q->have_scale, have_zp = q->have_zp, have_axis = q->have_axis;
    const char *scales_path = q->scales_path, *zps_path = q->zps_path;
    if (per_channel && (have_scale || have_zp))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--scale/--zero-point (per tensor) and "
                        "--axis/--scales/--zero-points (per channel) exclude each other");
    if (per_channel && !(have_axis && scales_path && zps_path))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "per-channel mode needs --axis, --scales and "
                        "--zero-points");
    if (!per_channel && !have_scale)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "missing --scale (or --axis/--scales/--zero-points)");
    return 0;
}

int cli_check_in_out(const char *cmd, const char *in, const char *out)
{
    if (!in)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no input file (see 'qcal %s --help')", cmd);
    if (!out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no output file (-o OUT.npy)");
    return 0;
}

int cli_write_npy(const char *cmd, const char *path, qcal_npy_dtype dtype, int32_t ndim,
                  const int64_t *shape, const void *data)
{
    qcal_status st = qcal_npy_write(path, dtype, ndim, shape, data);
    return st == QCAL_OK ? 0 : cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
}

void cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

void cli_json_f32(FILE *f, float v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", (double)v);
    else
        fputs("null", f);
}

void cli_json_f32_array(FILE *f, const float *v, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", f);
        cli_json_f32(f, v[i]);
    }
    fputc(']', f);
}

void cli_json_i32_array(FILE *f, const int32_t *v, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? ", " : "", (int)v[i]);
    fputc(']', f);
}

int cli_safetensors_each(const char *cmd, const char *path, cli_tensor_fn fn, void *ctx)
{
    qcal_safetensors *st = NULL;
    qcal_status s = qcal_safetensors_open(path, &st);
    if (s != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_INPUT, s);
    int64_t n = 0;
    qcal_safetensors_count(st, &n);
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        qcal_safetensors_tensor_info info;
        qcal_safetensors_info(st, i, &info);
        if (info.dtype == QCAL_SAFETENSORS_OTHER) {
            cli_warn(cmd, "skipping '%s' (dtype %s)", info.name,
                     info.dtype_name);
            continue;
        }
        rc = fn(ctx, st, i, &info);
    }
    qcal_safetensors_close(&st);
    return rc;
}

int cli_make_rules(const char *cmd, const char *rules_path, const cli_observer_args *oa,
                   bool have_obs, qcal_calib_rules **rules)
{
    qcal_observer_config act_cfg;
    int rc;
    if (have_obs && (rc = cli_observer_config(cmd, oa, QCAL_OBSERVER_HISTOGRAM, &act_cfg)))
        return rc;
    qcal_status st;
    if (rules_path) {
        st = qcal_calib_rules_load_file(rules_path, rules);
        if (st != QCAL_OK)
            return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_RULES), st);
    } else if ((st = qcal_calib_rules_create(rules)) != QCAL_OK) {
        return cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    }
    if (have_obs &&
        (st = qcal_calib_rules_add(*rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION,
                                   &act_cfg)) != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
    return 0;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* True when channel c of e has a scale the observer raised to its eps: the scale computed
 * from the range (quant/qparams.c, in the same float arithmetic) is below the stored one. */
static bool clamped_to_eps(const qcal_calib_entry *e, int64_t c)
{
    const qcal_qparams *q = &e->qparams;
    float scale = q->scales ? q->scales[c] : q->scale;
    float mn = e->min_val[c], mx = e->max_val[c];
    if (!isfinite(mn) || !isfinite(mx))
        return false;
    float min_neg = fminf(mn, 0.0f), max_pos = fmaxf(mx, 0.0f), raw;
    if (qcal_dtype_is_float8(q->dtype)) {
        raw = fmaxf(-min_neg, max_pos) / qcal_dtype_float8_max(q->dtype);
    } else if (q->qscheme == QCAL_PER_TENSOR_SYMMETRIC || q->qscheme == QCAL_PER_CHANNEL_SYMMETRIC) {
        raw = fmaxf(-min_neg, max_pos) / (float)((double)(q->quant_max - q->quant_min) / 2.0);
    } else if (q->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS) {
        return false;   /* a range below eps gets scale 1 there, not eps */
    } else {
        float d = max_pos - min_neg;
        if (!isfinite(d))
            return false;
        raw = d / (float)(double)(q->quant_max - q->quant_min);
    }
    return raw < scale;
}

void cli_warn_clamped_scales(const char *cmd, const qcal_calib_table *t)
{
    int64_t n = 0, k = 0;
    qcal_calib_table_count(t, &n);
    const char *first[3] = { 0 };
    float eps = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        if (qcal_calib_table_entry(t, i, &e) != QCAL_OK || e->role != QCAL_CALIB_ROLE_ACTIVATION ||
            e->no_data)
            continue;
        bool any = false;
        for (int64_t c = 0; c < e->qparams.channels && !any; c++)
            if ((any = clamped_to_eps(e, c)) && !k)
                eps = e->qparams.scales ? e->qparams.scales[c] : e->qparams.scale;
        if (!any)
            continue;
        if (k < 3)
            first[k] = e->fqn;
        k++;
    }
    if (!k)
        return;
    char names[1024];
    size_t o = 0;
    names[0] = '\0';
    for (int64_t i = 0; i < k && i < 3 && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s'%s'", i ? ", " : "", first[i]);
    cli_warn(cmd, "%lld %s so small %s scale was clamped to eps (%.9g): %s%s",
             (long long)k, CLI_PLURAL(k, "tensor has a range", "tensors have ranges"),
             CLI_PLURAL(k, "its", "their"), (double)eps, names,
             k > 3 ? ", ..." : "");
}
