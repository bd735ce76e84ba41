/* Table output shared by calibrate and convert (tools/cli_table_out.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_output.h"
#include "cli_table_out.h"

void cli_table_out_init(cli_table_out *o)
{
    memset(o, 0, sizeof *o);
    qcal_calib_export_options_default(&o->xo);
}

static int parse_formats(const char *cmd, cli_table_out *o, const char *val)
{
    o->nformats = 0;
    const char *p = val;
    for (;;) {
        size_t n = strcspn(p, ",");
        char name[64];
        if (n == 0 || n >= sizeof name)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--format: '%s' is not a comma-separated "
                            "list of json, tensorrt, onnxruntime, ncnn", val);
        memcpy(name, p, n);
        name[n] = '\0';
        qcal_calib_format f;
        if (qcal_calib_format_parse(name, &f) != QCAL_OK)
            return cli_fail_status(cmd, QCAL_EXIT_USAGE, QCAL_ERR_INVALID_ARG);
        for (int i = 0; i < o->nformats; i++)
            if (o->formats[i] == f)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "--format: %s listed twice",
                                qcal_calib_format_name(f));
        if (o->nformats == CLI_TABLE_OUT_MAX)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--format: too many formats");
        o->formats[o->nformats++] = f;
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

int cli_table_out_opt(const char *cmd, cli_table_out *o, int id, const char *val)
{
    switch (id) {
    case CLI_OUT_OUTPUT: o->out = val; return 0;
    case CLI_OUT_FORMAT: return parse_formats(cmd, o, val);
    case CLI_OUT_TRT_VERSION: o->xo.trt_version = val; return 0;
    case CLI_OUT_TRT_ALGO: o->xo.trt_algorithm = val; return 0;
    case CLI_OUT_SKIP_NAMES: o->xo.skip_unrepresentable = true; return 0;
    default: return -1;
    }
}

bool cli_table_out_is_dir(const cli_table_out *o)
{
    return o->nformats > 1 ||
           (o->nformats == 1 && o->formats[0] == QCAL_CALIB_FORMAT_ONNXRUNTIME);
}

void cli_table_out_formats(const cli_table_out *o, char *dst, size_t cap)
{
    size_t n = 0;
    dst[0] = '\0';
    for (int i = 0; i < o->nformats && n < cap; i++)
        n += (size_t)snprintf(dst + n, cap - n, "%s%s", i ? "," : "",
                              qcal_calib_format_name(o->formats[i]));
}

/* The algorithm names of TensorRT's calibration cache headers (nvinfer1::CalibrationAlgoType:
 * kENTROPY_CALIBRATION_2, kMINMAX_CALIBRATION, kENTROPY_CALIBRATION, kLEGACY_CALIBRATION). */
static const char *const trt_algorithms[] = { "EntropyCalibration2", "MinMaxCalibration",
                                              "EntropyCalibration", "LegacyCalibration" };

/* --trt-version: the header's number ("8601", "100300") as given, or the version users write
 * ("8.6.1", "10.3.0") turned into it: major*1000 + minor*100 + patch before TensorRT 10,
 * major*10000 + minor*100 + patch from 10 on (NV_TENSORRT_VERSION). Reports and returns
 * QCAL_EXIT_USAGE for anything else. */
static int trt_version(const char *cmd, cli_table_out *o)
{
    const char *v = o->xo.trt_version;
    size_t n = strlen(v);
    if (n > 0 && n <= 9 && strspn(v, "0123456789") == n && v[0] != '0')
        return 0;
    unsigned major, minor, patch;
    int used = 0;
    if (n > 0 && n < 16 && strspn(v, "0123456789.") == n &&
        sscanf(v, "%u.%u.%u%n", &major, &minor, &patch, &used) == 3 && (size_t)used == n &&
        major >= 1 && major < 100 && minor < (major < 10 ? 10u : 100u) && patch < 100) {
        unsigned long num = major < 10 ? major * 1000ul + minor * 100ul + patch
                                       : major * 10000ul + minor * 100ul + patch;
        snprintf(o->trt_version, sizeof o->trt_version, "%lu", num);
        o->xo.trt_version = o->trt_version;
        return 0;
    }
    return cli_fail(cmd, QCAL_EXIT_USAGE, "--trt-version: '%s' is neither a TensorRT version "
                    "MAJOR.MINOR.PATCH (8.6.1, 10.3.0) nor the header's number (8601, 100300)",
                    v);
}

/* The directory part of path ("." when none). */
static void dir_of(const char *path, char *dst, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dst, cap, ".");
    else if (slash == path)
        snprintf(dst, cap, "/");
    else
        snprintf(dst, cap, "%.*s", (int)(slash - path), path);
}

int cli_table_out_check(const char *cmd, cli_table_out *o)
{
    if (!o->out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no output: give -o TABLE (or -o DIR)");
    if (o->nformats == 0) {
        o->formats[0] = QCAL_CALIB_FORMAT_JSON;
        o->nformats = 1;
    }
    /* The TensorRT header options are checked here, before any work. */
    if (trt_version(cmd, o))
        return QCAL_EXIT_USAGE;
    if (o->xo.trt_algorithm) {
        bool known = false;
        for (size_t i = 0; i < sizeof trt_algorithms / sizeof trt_algorithms[0]; i++)
            known |= !strcmp(o->xo.trt_algorithm, trt_algorithms[i]);
        if (!known)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--trt-algorithm: unknown algorithm '%s' "
                            "(expected one of %s, %s, %s, %s)", o->xo.trt_algorithm,
                            trt_algorithms[0], trt_algorithms[1], trt_algorithms[2],
                            trt_algorithms[3]);
    }
    if (cli_output_is_stdout(o->out) && cli_table_out_is_dir(o))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "-o - writes one stream: give one single-file "
                        "format (json, tensorrt or ncnn), not a directory's files");
    if (o->not_writer)
        return 0;
    if (cli_output_is_stdout(o->out))
        return cli_output_check(cmd, o->out);
    struct stat sb;
    char dir[4096];
    bool exists = stat(o->out, &sb) == 0;
    if (cli_table_out_is_dir(o)) {
        if (exists && !S_ISDIR(sb.st_mode))
            return cli_fail(cmd, QCAL_EXIT_OUTPUT, "'%s' is not a directory (several formats "
                            "and onnxruntime write into -o DIR)", o->out);
        if (exists) {
            snprintf(dir, sizeof dir, "%s", o->out);
        } else {
            dir_of(o->out, dir, sizeof dir);
        }
    } else {
        if (exists && S_ISDIR(sb.st_mode))
            return cli_fail(cmd, QCAL_EXIT_OUTPUT, "'%s' is a directory (one %s table is one "
                            "file)", o->out, qcal_calib_format_name(o->formats[0]));
        /* A file, a symlink, a device, a FIFO or a new path (include/qcal/atomic_file.h). */
        return cli_output_check(cmd, o->out);
    }
    if (access(dir, W_OK | X_OK) != 0)
        return cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write '%s' (directory '%s': %s)",
                        o->out, dir, strerror(errno));
    return 0;
}

/* Names of t's exported entries that format f cannot hold: returns the count and, when
 * report is set, prints them in one error or warning line. */
static int64_t bad_names(const char *cmd, const qcal_calib_table *t, qcal_calib_format f,
                         int report)
{
    int64_t n = 0, bad = 0;
    qcal_calib_table_count(t, &n);
    size_t cap = 4096, len = 0;
    char *list = report ? malloc(cap) : NULL;
    if (list)
        list[0] = '\0';
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        const char *why = NULL;
        qcal_calib_table_entry(t, i, &e);
        bool wanted = f == QCAL_CALIB_FORMAT_JSON || f == QCAL_CALIB_FORMAT_NCNN ||
                      e->role == QCAL_CALIB_ROLE_ACTIVATION;
        if (!wanted || e->no_data || qcal_calib_format_holds_name(f, e->fqn, &why))
            continue;
        bad++;
        if (!list)
            continue;
        size_t need = len + strlen(e->fqn) + strlen(why) + 16;
        if (need > cap) {
            char *nl = realloc(list, need * 2);
            if (!nl)
                continue;
            list = nl;
            cap = need * 2;
        }
        len += (size_t)snprintf(list + len, cap - len, "%s'%s' (%s)", bad > 1 ? ", " : "",
                                e->fqn, why);
    }
    if (bad && report == 1)
        cli_fail(cmd, QCAL_EXIT_FAILURE, "the %s format cannot hold %lld name%s: %s (leave "
                 "them out with --skip-unrepresentable)", qcal_calib_format_name(f),
                 (long long)bad, bad == 1 ? "" : "s", list ? list : "");
    else if (bad && report == 2)
        fprintf(stderr, "qcal: %s: warning: left %lld name%s out of the %s output: %s\n", cmd,
                (long long)bad, bad == 1 ? "" : "s", qcal_calib_format_name(f),
                list ? list : "");
    free(list);
    return bad;
}

int cli_table_out_write(const char *cmd, cli_table_out *o, const qcal_calib_table *t)
{
    /* Names first: one error naming every entry of every format, before any file. */
    int64_t total_bad = 0;
    for (int i = 0; i < o->nformats; i++)
        total_bad += bad_names(cmd, t, o->formats[i], 0);
    if (total_bad && !o->xo.skip_unrepresentable) {
        for (int i = 0; i < o->nformats; i++)
            if (bad_names(cmd, t, o->formats[i], 0))
                return (void)bad_names(cmd, t, o->formats[i], 1), QCAL_EXIT_FAILURE;
    }
    if (total_bad)
        for (int i = 0; i < o->nformats; i++)
            bad_names(cmd, t, o->formats[i], 2);
    qcal_status st;
    /* The library writes what the CLI writes: one format (a file, or ONNX Runtime's three
     * files in the directory -o) is qcal_calib_table_write, several formats a directory. */
    if (o->nformats > 1)
        st = qcal_calib_table_write_dir(t, o->nformats, o->formats, &o->xo, o->out);
    else if (cli_table_out_is_dir(o))
        st = qcal_calib_table_write(t, o->formats[0], &o->xo, o->out);
    else
        st = qcal_calib_table_write(t, o->formats[0], &o->xo, cli_output_path(o->out));
    if (st < 0)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_TABLE_OUT), st);
    if (st == QCAL_NO_DATA && !o->no_data_warned)
        cli_warn(cmd, "%s", qcal_last_error());
    return 0;
}
