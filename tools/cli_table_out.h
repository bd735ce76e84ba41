/* Table output shared by `qcal calibrate` and `qcal convert`: --format F[,F...], -o, the
 * TensorRT header options and --skip-unrepresentable, with the same checks, messages and
 * exit codes in both, so that converting a JSON table writes the bytes calibrating
 * straight to the format writes.
 *
 *   cli_table_out o; cli_table_out_init(&o);
 *   while (option loop) { ... if ((rc = cli_table_out_opt(cmd, &o, id, val)) < 0) continue; ... }
 *   cli_table_out_check(cmd, &o) before the work (usage and writability);
 *   cli_table_out_write(cmd, &o, table) at the end. */
#ifndef QCAL_TOOLS_CLI_TABLE_OUT_H
#define QCAL_TOOLS_CLI_TABLE_OUT_H

#include <stdbool.h>
#include <stdio.h>

#include <qcal/calib.h>

#include "cli_common.h"

enum {
    CLI_OUT_BASE = 2000,
    CLI_OUT_OUTPUT = CLI_OUT_BASE, CLI_OUT_FORMAT, CLI_OUT_TRT_VERSION, CLI_OUT_TRT_ALGO,
    CLI_OUT_SKIP_NAMES,
    CLI_OUT_END
};

/* Rows to put in a subcommand's option table (help texts at column 27). */
#define CLI_TABLE_OUT_OPTS                                                                    \
    CLI_OPT("output", 'o', CLI_OUT_OUTPUT, "OUT",                                             \
        "output: a file for one single-file format (- is stdout), else\n"                     \
        "a directory (created if missing) holding each format's files\n"                      \
        "(required; docs/cli.md \"Outputs\")"),                                                \
    CLI_OPT("format", 0, CLI_OUT_FORMAT, "F[,F...]",                                          \
        "json (default; native qcal table), tensorrt, onnxruntime,\n"                         \
        "ncnn; several formats need -o DIR. File names in DIR:\n"                             \
        "qcal_table.json, tensorrt.cache, calibration.json +\n"                               \
        "calibration.flatbuffers + calibration.cache (ONNX Runtime's\n"                       \
        "three files; onnxruntime always writes to a directory),\n"                           \
        "ncnn.table. All files are written or none."),                                         \
    CLI_OPT("trt-version", 0, CLI_OUT_TRT_VERSION, "V",                                       \
        "the TensorRT that reads the cache: 8.6.1, 10.3.0, ... or\n"                          \
        "the header's number (8601, 100300); default 8601 (8.6.1)"),                          \
    CLI_OPT("trt-algorithm", 0, CLI_OUT_TRT_ALGO, "A",                                        \
        "TensorRT header algorithm: EntropyCalibration2,\n"                                   \
        "MinMaxCalibration, EntropyCalibration or LegacyCalibration\n"                        \
        "(default: MinMaxCalibration when every activation has a\n"                           \
        "min/max observer, else EntropyCalibration2)"),                                       \
    CLI_FLAG("skip-unrepresentable", 0, CLI_OUT_SKIP_NAMES,                                   \
        "leave out (with a warning) names a format cannot hold\n"                             \
        "instead of failing with exit 1 (docs/calibration.md)")

#define CLI_TABLE_OUT_MAX 8

typedef struct cli_table_out {
    const char *out;
    qcal_calib_format formats[CLI_TABLE_OUT_MAX];
    int nformats;                 /* 0 until --format: json */
    qcal_calib_export_options xo;
    char trt_version[16];         /* --trt-version 8.6.1 turned into the header's 8601 */
    bool not_writer;              /* another process writes OUT: check usage only */
    bool no_data_warned;          /* entries without data were already named (calibrate
                                   * --allow-empty): no summary warning per format */
} cli_table_out;

void cli_table_out_init(cli_table_out *o);

/* Handles the option if it is one of CLI_TABLE_OUT_OPTS: returns 0 (handled), an exit code
 * (reported) for a bad value, or -1 when id is not one of them. */
int cli_table_out_opt(const char *cmd, cli_table_out *o, int id, const char *val);

/* Before any work: -o given, several formats only into a directory, the destination
 * writable (unless not_writer). Returns 0 or an exit code (reported). */
int cli_table_out_check(const char *cmd, cli_table_out *o);

/* True when the output is a directory (several formats, or onnxruntime). */
bool cli_table_out_is_dir(const cli_table_out *o);

/* Writes the table. Names a format cannot hold: one error listing all (exit 1), or with
 * --skip-unrepresentable one warning line per format. Entries without data: a warning.
 * Returns 0 or an exit code (reported). */
int cli_table_out_write(const char *cmd, cli_table_out *o, const qcal_calib_table *t);

/* "json,tensorrt" for messages. */
void cli_table_out_formats(const cli_table_out *o, char *dst, size_t cap);

#endif
