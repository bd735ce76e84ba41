/* Helpers shared by every qcal subcommand (see tools/cli_common.h). */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli_common.h"

void cli_parser_init(cli_parser *p, int argc, char **argv)
{
    p->cmd = argc > 0 ? argv[0] : "qcal";
    p->argc = argc;
    p->argv = argv;
    p->i = 1;
    p->positional_only = false;
}

static const cli_opt *find_long(const cli_opt *opts, const char *name, size_t len)
{
    for (const cli_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len))
            return o;
    return NULL;
}

static const cli_opt *find_short(const cli_opt *opts, char c)
{
    for (const cli_opt *o = opts; o->name; o++)
        if (o->short_name && o->short_name == c)
            return o;
    return NULL;
}

int cli_next(cli_parser *p, const cli_opt *opts, const char **value)
{
    *value = NULL;
    if (p->i >= p->argc)
        return CLI_END;
    const char *arg = p->argv[p->i++];
    if (p->positional_only || arg[0] != '-' || arg[1] == '\0') {
        *value = arg;
        return CLI_POSITIONAL;
    }
    if (!strcmp(arg, "--")) {
        p->positional_only = true;
        return cli_next(p, opts, value);
    }
    const cli_opt *o;
    const char *inline_val = NULL;
    if (arg[1] == '-') {
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        o = find_long(opts, name, len);
        if (!o) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '--%.*s' (see 'qcal %s --help')",
                     (int)len, name, p->cmd);
            return CLI_ERROR;
        }
        if (eq)
            inline_val = eq + 1;
    } else {
        /* A lone short option "-o"; "-oFILE" is accepted as "-o FILE". Negative numbers
         * are values, never options, because they only appear after an option. */
        o = find_short(opts, arg[1]);
        if (!o) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '%s' (see 'qcal %s --help')", arg,
                     p->cmd);
            return CLI_ERROR;
        }
        if (arg[2] != '\0') {
            if (!o->has_value) {
                cli_fail(p->cmd, QCAL_EXIT_USAGE, "unknown option '%s'", arg);
                return CLI_ERROR;
            }
            inline_val = arg + 2;
        }
    }
    if (!o->has_value) {
        if (inline_val) {
            cli_fail(p->cmd, QCAL_EXIT_USAGE, "option '--%s' takes no value", o->name);
            return CLI_ERROR;
        }
        *value = "";
        return o->id;
    }
    if (inline_val) {
        *value = inline_val;
        return o->id;
    }
    if (p->i >= p->argc) {
        cli_fail(p->cmd, QCAL_EXIT_USAGE, "option '--%s' needs a value", o->name);
        return CLI_ERROR;
    }
    *value = p->argv[p->i++];
    return o->id;
}

static void vreport(const char *cmd, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' ';
    fprintf(stderr, "qcal: %s: %s\n", cmd, msg);
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
    if (id < CLI_OBS_BASE || id >= CLI_OBS_END)
        return false;
    a->value[id - CLI_OBS_BASE] = val;
    return true;
}

static const char *obs_val(const cli_observer_args *a, int id)
{
    return a->value[id - CLI_OBS_BASE];
}

int cli_observer_config(const char *cmd, const cli_observer_args *a,
                        qcal_observer_kind default_kind, qcal_observer_config *cfg)
{
    qcal_observer_kind kind = default_kind;
    const char *s = obs_val(a, CLI_OBS_OBSERVER);
    if (s && qcal_observer_kind_parse(s, &kind) != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_USAGE, QCAL_ERR_INVALID_ARG);
    qcal_observer_config c;
    qcal_observer_config_default(&c, kind);
    int64_t v;
    int rc;
    if ((s = obs_val(a, CLI_OBS_DTYPE)) && qcal_dtype_parse(s, &c.q.dtype) != QCAL_OK)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype: unknown dtype '%s' (expected quint8, "
                        "qint8 or qint32)", s);
    if ((s = obs_val(a, CLI_OBS_QSCHEME)) && qcal_qscheme_parse(s, &c.q.qscheme) != QCAL_OK)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--qscheme: unknown qscheme '%s' (expected "
                        "per_tensor_affine, per_tensor_symmetric, per_channel_affine, "
                        "per_channel_symmetric or per_channel_affine_float_qparams)", s);
    if ((s = obs_val(a, CLI_OBS_AXIS))) {
        if ((rc = cli_parse_i64(cmd, "--axis", s, -QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1, &v)))
            return rc;
        c.axis = (int32_t)v;
    }
    if (obs_val(a, CLI_OBS_REDUCE_RANGE))
        c.q.reduce_range = true;
    const char *qmin = obs_val(a, CLI_OBS_QUANT_MIN), *qmax = obs_val(a, CLI_OBS_QUANT_MAX);
    if ((qmin != NULL) != (qmax != NULL))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--quant-min and --quant-max go together");
    if (qmin) {
        int64_t lo, hi;
        if ((rc = cli_parse_i64(cmd, "--quant-min", qmin, INT32_MIN, INT32_MAX, &lo)) ||
            (rc = cli_parse_i64(cmd, "--quant-max", qmax, INT32_MIN, INT32_MAX, &hi)))
            return rc;
        if (lo > hi)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--quant-min %lld is greater than "
                            "--quant-max %lld", (long long)lo, (long long)hi);
        c.q.custom_range = true;
        c.q.quant_min = lo;
        c.q.quant_max = hi;
    }
    if ((s = obs_val(a, CLI_OBS_EPS))) {
        if ((rc = cli_parse_f32(cmd, "--eps", s, &c.q.eps)))
            return rc;
        if (!(c.q.eps > 0.0f))
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--eps: %s must be positive", s);
    }
    if ((s = obs_val(a, CLI_OBS_AVERAGING_CONSTANT)) &&
        (rc = cli_parse_f32(cmd, "--averaging-constant", s, &c.averaging_constant)))
        return rc;
    if ((s = obs_val(a, CLI_OBS_BINS))) {
        if ((rc = cli_parse_i64(cmd, "--bins", s, INT32_MIN, INT32_MAX, &v)))
            return rc;
        c.bins = (int32_t)v;
    }
    if ((s = obs_val(a, CLI_OBS_UPSAMPLE_RATE))) {
        if ((rc = cli_parse_i64(cmd, "--upsample-rate", s, INT32_MIN, INT32_MAX, &v)))
            return rc;
        c.upsample_rate = (int32_t)v;
    }
    if ((s = obs_val(a, CLI_OBS_PERCENTILE)) &&
        (rc = cli_parse_f64(cmd, "--percentile", s, &c.percentile)))
        return rc;
    if ((s = obs_val(a, CLI_OBS_PERCENTILE_MODE))) {
        if (!strcmp(s, "abs"))
            c.percentile_mode = QCAL_PERCENTILE_ABS;
        else if (!strcmp(s, "two-tails"))
            c.percentile_mode = QCAL_PERCENTILE_TWO_TAILS;
        else
            return cli_fail(cmd, QCAL_EXIT_USAGE,
                            "--percentile-mode: '%s' is not abs or two-tails", s);
    }
    if ((s = obs_val(a, CLI_OBS_ENTROPY_LEVELS))) {
        if ((rc = cli_parse_i64(cmd, "--entropy-levels", s, INT32_MIN, INT32_MAX, &v)))
            return rc;
        c.entropy_levels = (int32_t)v;
    }
    if (obs_val(a, CLI_OBS_STRICT))
        c.nonfinite = QCAL_NONFINITE_ERROR;
    /* Options that the chosen kind ignores are accepted silently only if they could matter:
     * the library validates every field that the kind uses. */
    if (qcal_observer_config_validate(&c) != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_USAGE, QCAL_ERR_INVALID_ARG);
    *cfg = c;
    return 0;
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

int cli_check_qparam_mode(const char *cmd, bool have_scale, bool have_zp, bool have_axis,
                          const char *scales_path, const char *zps_path)
{
    bool per_channel = have_axis || scales_path || zps_path;
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
            fprintf(stderr, "qcal: %s: skipping '%s' (dtype %s)\n", cmd, info.name,
                    info.dtype_name);
            continue;
        }
        rc = fn(ctx, st, i, &info);
    }
    qcal_safetensors_close(&st);
    return rc;
}
