/* Helpers shared by every qcal subcommand: strict numbers, the observer and qparams option
 * groups, .npy input/output with the documented exit codes, the one-line error report and
 * small JSON printers. Options are declared and parsed through tools/cli_dispatch.h.
 *
 * Errors are reported as exactly one line on stderr: "qcal: <subcommand>: <message>". */
#ifndef QCAL_TOOLS_CLI_COMMON_H
#define QCAL_TOOLS_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <qcal/npy.h>
#include <qcal/qcal.h>
#include <qcal/safetensors.h>

#include "cli.h"
#include "cli_dispatch.h"

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* Each subcommand's option table (tools/cmd_<name>.c), for the command table of
 * tools/qcal.c, the generated man page and completion, and the docs test. */
extern const cli_spec cmd_compare_weights_spec, cmd_observe_spec, cmd_quantize_spec, cmd_dequantize_spec,
    cmd_calibrate_spec, cmd_convert_spec, cmd_merge_spec, cmd_evaluate_spec, cmd_report_spec,
    cmd_stats_spec, cmd_compare_weights_spec, cmd_onnx_expose_spec, cmd_qdq_spec, cmd_compare_spec,
    cmd_equalize_spec, cmd_fakequant_spec;

/* Reports "qcal: <cmd>: <message>" (one line; newlines in the message become spaces) and
 * returns code. A message that already starts with "<cmd>: " (a library message naming the
 * function, e.g. "quantize: scale 0 must be > 0") is printed without that second prefix. */
int cli_fail(const char *cmd, int code, const char *fmt, ...) CLI_PRINTF(3, 4);

/* Where cli_fail's lines go: NULL (the default) prints "qcal: CMD: MESSAGE" on stderr; a
 * distributed run (cli_dist.h) keeps the message for its agreement instead. */
typedef void (*cli_error_sink)(void *user, const char *cmd, const char *msg);
void cli_set_error_sink(cli_error_sink fn, void *user);

/* Reports qcal_last_error() (or the status name if it is empty) and returns code. */
int cli_fail_status(const char *cmd, int code, qcal_status st);

/* Flushes f (standard output or error, where a summary, records or JSON went); when that
 * or an earlier write to it failed, reports "cannot write to standard output: REASON" and
 * returns QCAL_EXIT_OUTPUT, else 0. */
int cli_flush(const char *cmd, FILE *f);

/* Every other line of a subcommand on stderr has the form of its errors:
 * "qcal: <cmd>: warning: <message>" (something was left out or is suspicious; the run goes
 * on) and "qcal: <cmd>: note: <message>" (information). One line each. */
void cli_warn(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);
void cli_note(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);

/* Strict numbers: the whole string must parse; no NaN/Inf; range checked. On failure a
 * usage error naming the option is reported and QCAL_EXIT_USAGE returned; else 0. */
int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out);
int cli_parse_f64(const char *cmd, const char *opt, const char *s, double *out);
/* A size in bytes: an integer, optionally followed by K, M, G or T (binary units: 2G is
 * 2^31; "GiB" and "G" are the same). Returns 0, or a usage error (reported). */
int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out);
/* As cli_parse_f64, and the value must be a finite float32 (no overflow to inf). */
int cli_parse_f32(const char *cmd, const char *opt, const char *s, float *out);

/* ---- Observer options (shared by observe and calibrate) ----
 * Generated from the library's observer-config key table (qcal_observer_config_key): each
 * key K is the option --K VALUE ('_' spelled '-'; both spellings accepted), plus the key's
 * CLI flag if it has one (--strict = nonfinite error, --reduce-range = reduce_range true).
 * Values are parsed by qcal_observer_config_apply, as in rules files. */

enum { CLI_OBS_BASE = 1000, CLI_OBS_MAX = 64 };

/* The row to put in a subcommand's option table: it stands for every observer option
 * (ids CLI_OBS_BASE + 2*key for --key VALUE, + 1 for the key's flag); --help lists them
 * from the key table, naming kind as the default observer. */
#define CLI_OBSERVER_OPTS { .name = "", .id = CLI_OBS_BASE }
#define CLI_OBSERVER_GROUP(kind) { .name = "", .id = CLI_OBS_BASE, .off = (size_t)(kind) }

/* Raw observer options, collected in command-line order; parsed by cli_observer_config
 * once the command line is complete. Zero-initialise. */
typedef struct cli_observer_args {
    const char *key[CLI_OBS_MAX];
    const char *value[CLI_OBS_MAX];
    int n;
    bool overflow;
} cli_observer_args;

/* If id is an observer option, stores (key, val) and returns true. */
bool cli_observer_opt(cli_observer_args *a, int id, const char *val);

/* Builds and validates *cfg from the collected options (kind default_kind when --observer
 * is absent) through qcal_observer_config_apply. Returns 0, or reports a usage error
 * (the library's message) and returns QCAL_EXIT_USAGE. */
int cli_observer_config(const char *cmd, const cli_observer_args *a,
                        qcal_observer_kind default_kind, qcal_observer_config *cfg);

/* The rules of a calibration: the rules file (if any), then the observer options (when
 * have_obs) as a catch-all rule for activations (default kind histogram). 0 or an exit
 * code (reported: a malformed rules file or bad options 2, an unreadable file 3). */
int cli_make_rules(const char *cmd, const char *rules_path, const cli_observer_args *oa,
                   bool have_obs, qcal_calib_rules **rules);

/* The word for a count: one when n is 1, else many ("%lld %s", n, CLI_PLURAL(n, "op", "ops")). */
#define CLI_PLURAL(n, one, many) ((n) == 1 ? (one) : (many))

/* Warns once, "K tensors have ranges so small their scale was clamped to eps (E): 'a', 'b',
 * 'c', ...", when activation entries of t have a scale raised to the observer's eps (the
 * range divided by the quantized range is below it: an untrained export whose activations
 * are ~1e-9 quantizes them all to zero). The count and the first three names. */
void cli_warn_clamped_scales(const char *cmd, const qcal_calib_table *t);

/* Seconds on the monotonic clock (for the summaries' timings). */
double cli_now(void);

/* Prints the help lines of the observer options (two-space indent), from the key table;
 * default_kind is the subcommand's default observer (QCAL_OBSERVER_KIND_COUNT: "default auto,
 * above", qdq --data's). */
void cli_observer_help(FILE *f, qcal_observer_kind default_kind);

/* The CLI spelling of key k: its name with '-' for '_' ("percentile-mode"). */
void cli_observer_option_name(const qcal_observer_key *k, char *out, size_t cap);

/* ---- qparams options (quantize, dequantize, fakequant) ----
 * Per tensor (--scale, --zero-point) or per channel (--axis, --scales, --zero-points); the
 * rows go where the subcommand's --help lists them (the zero-point rows with its text). */

enum {
    CLI_QP_BASE = 4000,
    CLI_QP_SCALE = CLI_QP_BASE, CLI_QP_ZERO_POINT, CLI_QP_AXIS, CLI_QP_SCALES,
    CLI_QP_ZERO_POINTS,
    CLI_QP_END
};

#define CLI_QPARAM_SCALE_OPT CLI_OPT("scale", 0, CLI_QP_SCALE, "S", "per-tensor scale (finite, > 0)")
#define CLI_QPARAM_ZERO_POINT_OPT(help) CLI_OPT("zero-point", 0, CLI_QP_ZERO_POINT, "Z", help)
#define CLI_QPARAM_AXIS_OPT                                                                   \
    CLI_OPT("axis", 0, CLI_QP_AXIS, "N", "per-channel: channel axis (<0 counts from the end)")
#define CLI_QPARAM_SCALES_OPT                                                                 \
    CLI_OPT("scales", 0, CLI_QP_SCALES, "S.npy", "per-channel: 1-D float array, one scale per channel")
#define CLI_QPARAM_ZERO_POINTS_OPT(help) CLI_OPT("zero-points", 0, CLI_QP_ZERO_POINTS, "Z.npy", help)

typedef struct cli_qparam_args {
    bool integer_zero_point;   /* set before parsing: --zero-point is an int32 (quantize,
                                * dequantize), else any finite number (fakequant) */
    bool have_scale, have_zp, have_axis;
    float scale;
    double zero_point;
    int32_t axis;
    const char *scales_path, *zps_path;
} cli_qparam_args;

/* Handles id when it is one of the CLI_QP_* rows: returns 0 (taken) or an exit code
 * (reported); -1 when id is not one of them. */
int cli_qparam_opt(const char *cmd, cli_qparam_args *q, int id, const char *val);

/* True when the options ask for per-channel qparams. */
bool cli_qparam_per_channel(const cli_qparam_args *q);

/* Per tensor or per channel: reports and returns QCAL_EXIT_USAGE when they are mixed, per
 * channel is incomplete or no --scale is given; else 0. */
int cli_qparam_check(const char *cmd, const cli_qparam_args *q);

/* Reports and returns QCAL_EXIT_USAGE when the input or the -o output is missing; else 0. */
int cli_check_in_out(const char *cmd, const char *in, const char *out);

/* ---- .npy input/output ---- */

/* Reads path as float32 (float64/float16 converted). Reports and returns QCAL_EXIT_INPUT
 * on failure, else 0. */
int cli_read_f32(const char *cmd, const char *path, qcal_npy_array *arr);

/* Reads path with its own dtype. Reports and returns QCAL_EXIT_INPUT on failure. */
int cli_read_npy(const char *cmd, const char *path, qcal_npy_array *arr);

/* Reads path (own dtype) and checks it is a 1-D array of ch zero-points; on a mismatch
 * reports, frees *arr and returns QCAL_EXIT_INPUT. */
int cli_read_zero_points_npy(const char *cmd, const char *path, int64_t ch,
                             qcal_npy_array *arr);

/* Writes an .npy atomically. Reports and returns QCAL_EXIT_OUTPUT on failure. */
int cli_write_npy(const char *cmd, const char *path, qcal_npy_dtype dtype, int32_t ndim,
                  const int64_t *shape, const void *data);

/* ---- .safetensors input ---- */

/* Called for tensor i of an open safetensors file; returns 0 to go on, else an exit code
 * (already reported). */
typedef int (*cli_tensor_fn)(void *ctx, qcal_safetensors *st, int64_t i,
                             const qcal_safetensors_tensor_info *info);

/* Opens path and calls fn for each tensor in file order, passing over (with a "warning:
 * skipping" line on stderr) tensors of a dtype qcal does not read, until fn returns non-zero.
 * Returns fn's code, QCAL_EXIT_INPUT (reported) when the file cannot be opened, or 0. */
int cli_safetensors_each(const char *cmd, const char *path, cli_tensor_fn fn, void *ctx);

/* ---- JSON printing ---- */

/* A JSON string literal with the needed escapes. */
void cli_json_str(FILE *f, const char *s);
/* A float with "%.9g" (round-trips float32); NaN/Inf print as null. */
void cli_json_f32(FILE *f, float v);
/* Arrays "[a, b, ...]". */
void cli_json_f32_array(FILE *f, const float *v, int64_t n);
void cli_json_i32_array(FILE *f, const int32_t *v, int64_t n);

#endif
