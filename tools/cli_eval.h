/* Shared by `qcal evaluate` and `qcal report`: their options (one parser, each command
 * lists the options it takes), the input (a dump directory, run through both passes of an
 * observer evaluation, or an evaluation state file), and --save-state. */
#ifndef QCAL_TOOLS_CLI_EVAL_H
#define QCAL_TOOLS_CLI_EVAL_H

#include <stdbool.h>

#include <qcal/calib_dump.h>
#include <qcal/numeric_eval.h>

#include "cli_common.h"
#include "cli_output.h"
#include "cli_progress.h"

/* Option ids of both commands (each command's cli_opt table uses a subset); the options
 * that only store a string are CLI_STR rows into cli_eval_args. */
enum { CLI_EVAL_OBSERVERS = 1, CLI_EVAL_MIN_SQNR, CLI_EVAL_FORMAT, CLI_EVAL_DTYPE };

/* The --quiet row of both tables (help text at column 27). */
#define CLI_EVAL_QUIET_OPT                                                                   \
    CLI_BOOL("quiet", 'q', cli_eval_args, quiet,                                             \
        "no progress report on stderr (otherwise a bar on a terminal,\n"                      \
        "else one line at most every 10 s: reading, searching,\n"                             \
        "scoring, writing; docs/cli.md)")

typedef struct cli_eval_args {
    const char *input;                 /* DIR or STATE (positional) */
    const char *out;                   /* -o */
    const char *save_state;            /* --save-state */
    const char *rules_out;             /* --rules-out (evaluate) */
    const char *title;                 /* --title (report); NULL: the default */
    qcal_numeric_eval_format format;   /* --format (evaluate); default table */
    uint32_t kinds;                    /* --observers; 0: every kind (or every saved one) */
    bool min_sqnr_set;
    double min_sqnr_db;                /* --min-sqnr */
    bool quiet;                        /* -q, --quiet */
    bool dtype_set;
    qcal_dtype dtype;                  /* --dtype (evaluate): FP8 candidates for every tensor */
    cli_progress progress;             /* started by cli_eval_load; the command adds its
                                        * writing phase and ends it */
} cli_eval_args;

/* Parses argv with the command's table (spec) into *a (cli_parse). Returns -1 to go on, or an exit code to
 * return at once (0 after printing help, 2 after reporting a usage error). */
int cli_eval_parse(const char *cmd, int argc, char **argv, const cli_spec *spec, cli_eval_args *a);

/* Parses "--observers a,b,..." into a kind mask; returns 0 or an exit code (reported). */
int cli_eval_parse_kinds(const char *cmd, const char *list, uint32_t *mask);

/* The evaluation of a->input: a directory is scanned and run through both passes (every file
 * read once per pass; source label = the directory); a file must be an evaluation state
 * ("QCEV", loaded, then --observers restricts and --min-sqnr recommends again). *out owned
 * by the caller. Returns 0 or an exit code (reported): 3 for an unreadable, malformed or
 * other kind of state (a session or observer state holds no data to score). */
int cli_eval_load(const char *cmd, cli_eval_args *a, qcal_numeric_eval **out);

/* Before the work: every output of a->out, a->rules_out, a->save_state writable, at most one
 * of them "-". Returns 0 or an exit code (reported). */
int cli_eval_check_outputs(const char *cmd, const cli_eval_args *a);

/* Stages --save-state (tools/cli_output.h) into *s. Returns 0 or an exit code (reported;
 * everything staged aborted). */
int cli_eval_stage_state(const char *cmd, const cli_eval_args *a, const qcal_numeric_eval *ev,
                         cli_staged *s);

#endif
