/* Shared declarations of the qcal CLI: exit codes and the subcommand entry points.
 *
 * Adding a subcommand: write tools/cmd_<name>.c with `int cmd_<name>(int argc, char **argv)`
 * (argv[0] is the subcommand name), declare it below (one line), declare its options in one
 * table and export it as `const cli_spec cmd_<name>_spec` (tools/cli_dispatch.h: the table
 * drives parsing, --help, the man page and the completion; declared in cli_common.h), and
 * add one line to the command table in tools/qcal.c. Use the helpers of tools/cli_common.h
 * for numbers, .npy input/output and the one-line error report. */
#ifndef QCAL_TOOLS_CLI_H
#define QCAL_TOOLS_CLI_H

#include <stdio.h>

#include <qcal/qcal.h>

/* Exit codes (documented in `qcal --help`). */
enum {
    QCAL_EXIT_OK = 0,        /* success */
    QCAL_EXIT_FAILURE = 1,   /* the operation failed (bad data, I/O, numerical policy) */
    QCAL_EXIT_USAGE = 2,     /* bad command line: unknown option, impossible value */
    QCAL_EXIT_INPUT = 3,     /* an input file is missing, unreadable or malformed */
    QCAL_EXIT_OUTPUT = 4,    /* an output could not be written */
    QCAL_EXIT_ENGINE = 5,    /* ONNX Runtime (the engine) could not be loaded */
};

struct cli_spec;

typedef struct qcal_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
    const struct cli_spec *spec;         /* its option table (cmd_<name>_spec) */
} qcal_cmd;

/* Generated documentation (tools/cli_gendoc.c), from the command table, each command's
 * option table and --help text, and the observer-config key table:
 *   qcal --man              the qcal(1) man page (troff), installed by meson install
 *   qcal --bash-completion  the bash completion script, installed by meson install
 *   qcal --list-options     "SUBCOMMAND --option [VALUE]" per option, for tests */
int cli_gen_man(FILE *f, const qcal_cmd *cmds, int n);
int cli_gen_bash_completion(FILE *f, const qcal_cmd *cmds, int n);
int cli_gen_option_list(FILE *f, const qcal_cmd *cmds, int n);

/* Subcommand entry points: one line per subcommand (tools/cmd_<name>.c). */
int cmd_observe(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_evaluate(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_compare_weights(int argc, char **argv);
int cmd_fakequant(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_onnx_expose(int argc, char **argv);
int cmd_qdq(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_equalize(int argc, char **argv);

#endif
