/* Outputs of every subcommand (docs/cli.md "Outputs"): "-" is standard output, every output
 * path is checked before the work starts, and a subcommand with several outputs stages them
 * (each written to its temporary, or into its device/FIFO/descriptor, and flushed) so that
 * either all are renamed into place after the work succeeded or none is left. The library
 * decides what each kind of path becomes (include/qcal/atomic_file.h).
 *
 *   cli_output_check(cmd, "--save-state", a.state) for each output, before the work;
 *   cli_staged s = {0};
 *   cli_stage(cmd, &s, a.state, buf, len);      // bytes already in memory
 *   ...the one path-based writer (a table, a report) ...
 *   cli_stage_commit(cmd, &s) on success, cli_stage_abort(&s) on failure. */
#ifndef QCAL_TOOLS_CLI_OUTPUT_H
#define QCAL_TOOLS_CLI_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include <qcal/atomic_file.h>

/* True for "-" (and "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"): the output is standard
 * output, so summaries go to stderr. */
bool cli_output_is_stdout(const char *path);

/* The path the library writes: "/dev/stdout" (this process's descriptor 1, written through
 * a duplicate of it) for "-", else path. */
const char *cli_output_path(const char *path);

/* Checks that path (what is there, or its directory) can be written; reports
 * "cannot write ..." with the reason and returns QCAL_EXIT_OUTPUT, else 0. For "-", flushes
 * stdout's buffer so that what the library writes through the descriptor comes after it. */
int cli_output_check(const char *cmd, const char *path);

/* cli_output_check for an ONNX model output: standard output (`-`, /dev/stdout, /dev/fd/1,
 * /proc/self/fd/1) is refused with exit 2 (the summary line and notes printed there would
 * follow the model's bytes). */
int cli_model_output_check(const char *cmd, const char *path);

#define CLI_STAGED_MAX 4

typedef struct cli_staged {
    qcal_atomic_file f[CLI_STAGED_MAX];
    int n;
} cli_staged;

/* Opens path, writes the len bytes of buf and flushes them (a temporary, or in place); on
 * failure aborts everything staged, reports and returns QCAL_EXIT_OUTPUT. */
int cli_stage(const char *cmd, cli_staged *s, const char *path, const void *buf, size_t len);

/* Renames every staged temporary into place; reports and returns QCAL_EXIT_OUTPUT if one
 * cannot be (the others are still renamed). */
int cli_stage_commit(const char *cmd, cli_staged *s);

/* Removes every staged temporary (safe on a zeroed or committed set). */
void cli_stage_abort(cli_staged *s);

#endif
