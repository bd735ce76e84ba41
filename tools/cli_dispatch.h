/* The qcal CLI's one dispatch: option tables, the parser, the generated --help and the
 * status -> exit code map.
 *
 * How a subcommand declares its options: one table of cli_opt rows, in the order --help
 * lists them, drives parsing (cli_parse), its --help (cli_help), the man page, the bash
 * completion and `qcal --list-options` (tools/cli_gendoc.c). A row is
 *
 *   CLI_OPT("name", 'n', OPT_NAME, "METAVAR", "help text\ncontinuation line")
 *
 * printed in --help as "  -n, --name METAVAR   help text" with each '\n' starting a line
 * indented to the spec's column. A new option is one row: CLI_STR / CLI_BOOL name a field
 * of the subcommand's argument struct and the parser stores the value itself; CLI_OPT /
 * CLI_FLAG give an id and the subcommand's handler gets (id, value) and parses it. Other rows: CLI_TEXT("...") prints its text verbatim in --help (the usage, sections,
 * prose between options), CLI_HELP_OPT is -h/--help, and the shared groups are rows
 * defined beside their parsers: CLI_OBSERVER_OPTS(kind) (the observer-config key table),
 * CLI_QPARAM_* (per-tensor and per-channel qparams, below), CLI_TABLE_OUT_OPTS
 * (cli_table_out.h), CLI_MODEL_OPTS (cli_model.h), the evaluation rows (cli_eval.h).
 *
 *   static const cli_opt opts[] = {
 *       CLI_TEXT("usage: qcal thing IN -o OUT\n\noptions:\n"),
 *       CLI_STR("output", 'o', args, out, "OUT", "the output"),
 *       CLI_OPT("level", 0, OPT_LEVEL, "N", "a level (default 1)"),
 *       CLI_HELP_OPT,
 *       { 0 } };
 *   const cli_spec cmd_thing_spec = { opts, 25 };
 *   ...
 *   int rc = cli_parse(&cmd_thing_spec, argc, argv, &a, handler);   // handler: ids, positionals
 *   if (rc) return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
 *
 * Exit codes of library failures come from one map, cli_exit_code(status, stage): the stage
 * says what the program was doing (reading an input, writing an output, ...). */
#ifndef QCAL_TOOLS_CLI_DISPATCH_H
#define QCAL_TOOLS_CLI_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <qcal/qcal.h>

/* Where the parser puts a row's value itself (no handler code). */
typedef enum cli_store {
    CLI_STORE_NONE = 0,   /* the handler gets (id, value) */
    CLI_STORE_STR,        /* const char * at off: the value */
    CLI_STORE_FLAG,       /* bool at off: true */
    CLI_STORE_TEXT,       /* not an option: help carries text printed verbatim in --help */
} cli_store;

/* One long option "--name" (also "--name=value"), optional short alias "-c". An option
 * with a value may be given once: a second "--name V" (or its short alias) is a usage
 * error, as a repeated observer option is, unless the row opts in with CLI_REPEATED. */
enum { CLI_REPEATED = 2 };
typedef struct cli_opt {
    const char *name;    /* without the dashes; NULL ends a table ("" for text and groups) */
    char short_name;     /* 0: none */
    int has_value;       /* false: a flag; true: takes one value ("--name V" or "--name=V");
                          * CLI_REPEATED: one value each time, and may be given again */
    int id;              /* > 0, returned by cli_next; ids >= CLI_OBS_BASE are reserved; 0
                          * with a CLI_STORE_* row */
    const char *metavar; /* the value's placeholder in --help ("OUT", "F[,F...]") */
    const char *help;    /* its --help text ('\n' starts a continuation line); NULL: the
                          * option is described elsewhere (a CLI_TEXT row) */
    cli_store store;     /* CLI_STORE_NONE: the handler's */
    size_t off;          /* CLI_STORE_STR/FLAG: offsetof the field; observer row: the
                          * default observer kind its help names */
} cli_opt;

/* The rows of a table (designated initializers: a row names what it sets):
 *   CLI_OPT(name, short, id, metavar, help)       --name VALUE, handled by id
 *   CLI_OPT_REPEATED(name, short, id, metavar, help)   the same, may be given again
 *   CLI_FLAG(name, short, id, help)               --name, handled by id
 *   CLI_STR(name, short, type, field, metavar, help)   --name VALUE stored in type.field
 *   CLI_BOOL(name, short, type, field, help)      --name sets the bool type.field
 * short is a character ('o') or 0. */
#define CLI_OPT(n_, s_, id_, m_, h_)                                                          \
    { .name = n_, .short_name = s_, .has_value = true, .id = id_, .metavar = m_, .help = h_ }
#define CLI_OPT_REPEATED(n_, s_, id_, m_, h_)                                                 \
    { .name = n_, .short_name = s_, .has_value = CLI_REPEATED, .id = id_, .metavar = m_,     \
      .help = h_ }
#define CLI_FLAG(n_, s_, id_, h_) { .name = n_, .short_name = s_, .id = id_, .help = h_ }
#define CLI_STR(n_, s_, type_, field_, m_, h_)                                                \
    { .name = n_, .short_name = s_, .has_value = true, .metavar = m_, .help = h_,             \
      .store = CLI_STORE_STR, .off = offsetof(type_, field_) }
#define CLI_BOOL(n_, s_, type_, field_, h_)                                                   \
    { .name = n_, .short_name = s_, .help = h_, .store = CLI_STORE_FLAG,                      \
      .off = offsetof(type_, field_) }

/* Verbatim --help text (usage lines, section headings, prose) at its place in the table. */
#define CLI_TEXT(text) { .name = "", .help = text, .store = CLI_STORE_TEXT }

/* -h, --help: cli_parse prints the generated help and returns CLI_HELP_SHOWN. */
enum { CLI_HELP = 999 };
#define CLI_HELP_OPT CLI_FLAG("help", 'h', CLI_HELP, "this help")

/* A subcommand's declaration: its table and the column its option help texts start at. */
typedef struct cli_spec {
    const cli_opt *opts;
    int col;
} cli_spec;

/* cli_next results besides option ids. */
/* cli_next results besides option ids: CLI_STORED is a CLI_STORE_* row (parser->row). */
enum { CLI_END = 0, CLI_POSITIONAL = -1, CLI_ERROR = -2, CLI_STORED = -3 };

enum { CLI_SEEN_MAX = 64 };

typedef struct cli_parser {
    const char *cmd;     /* subcommand name, for messages */
    int argc;
    char **argv;
    int i;               /* next argv index */
    bool positional_only;/* seen "--" */
    const void *seen[CLI_SEEN_MAX]; /* rows of the single-valued options given so far */
    int nseen;
    const cli_opt *row;  /* the row of the last option cli_next returned (NULL: observer) */
} cli_parser;

/* Starts parsing argv[1..] of a subcommand (argv[0] is its name). */
void cli_parser_init(cli_parser *p, int argc, char **argv);

/* Next option id (value in *value, NULL for flags), CLI_POSITIONAL (argument in *value),
 * CLI_END, or CLI_ERROR after reporting an unknown option, a missing value, a value given
 * to a flag or a second value for an option that takes one (unless CLI_REPEATED; the
 * observer options are checked by the library's key table, with the same rule). "-" alone
 * is positional; "--" ends options. Text rows are never matched. */
int cli_next(cli_parser *p, const cli_opt *opts, const char **value);

/* The subcommand's part of a parse: an option id of its table (value NULL for flags) or
 * CLI_POSITIONAL; returns 0, or an exit code (reported). */
typedef int (*cli_handler)(void *args, const char *cmd, int id, const char *value);

enum { CLI_HELP_SHOWN = -1 };

/* Parses argv (argv[0] the subcommand) by spec's table: CLI_STORE_* rows into args, every
 * other option and positional argument through fn. Returns 0, an exit code (usage errors
 * reported here, others by fn) or CLI_HELP_SHOWN after printing --help on stdout. */
int cli_parse(const cli_spec *spec, int argc, char **argv, void *args, cli_handler fn);

/* cli_parse with --help printed on help_out; NULL prints nothing (the ranks of a
 * distributed run other than the one that writes). */
int cli_parse_to(const cli_spec *spec, int argc, char **argv, void *args, cli_handler fn,
                 FILE *help_out);

/* Prints the subcommand's --help: its table's rows in order (text verbatim, options with
 * their metavar and help at spec->col, the observer group from the key table). */
void cli_help(FILE *f, const cli_spec *spec);

/* Levenshtein distance of a and b (insert, delete, substitute: 1 each), capped at 9; the
 * "did you mean" of unknown subcommands and options. */
int cli_edit_distance(const char *a, const char *b);

/* ---- The status -> exit code map ----
 * What the program was doing when the library returned a failure status; cli_exit_code
 * turns (status, stage) into the documented exit code (tools/cli.h, docs/cli.md). */
typedef enum cli_at {
    CLI_AT_READ,        /* reading an input file: 3 (out of memory 1) */
    CLI_AT_WRITE,       /* writing an output: 4 (out of memory 1) */
    CLI_AT_SAVE,        /* serializing then writing: 4 for I/O, else 1 */
    CLI_AT_PARAMS,      /* applying given parameters: 2 for an invalid one, else 1 */
    CLI_AT_FAKEQUANT,   /* fake-quantizing with given qparams: 2 (out of memory 1) */
    CLI_AT_OBSERVE,     /* feeding data: 3 (policy: NaN/Inf under --strict, memory 1) */
    CLI_AT_RULES,       /* reading a rules file: 2 when malformed, else 3 */
    CLI_AT_TABLE_OUT,   /* writing a table: 4 for I/O, 2 for an invalid option, else 1 */
    CLI_AT_CHECKPOINT,  /* writing an FP8 checkpoint from inputs: 4 for I/O, 1 for memory
                         * or nothing to write, else 3 (the inputs) */
    CLI_AT_MODEL_SETUP, /* preparing a model's calibration: 2 for options that do not fit
                         * the model, 1 for memory or nothing to calibrate, else 3 */
    CLI_AT_MODEL_CARRY, /* the same with --carry given: a name it cannot find is 2 */
    CLI_AT_MODEL_RUN,   /* running a model on data: 1 for the engine, policy, memory,
                         * else 3 (the data or model) */
    CLI_AT_TRANSFORM,   /* rewriting a model: 3 for what is in the model, else 1 */
    CLI_AT_QDQ,         /* quantizing a model and writing it: 2 for an option, 3 for the
                         * model, 4 for the output (I/O, a model too large to write), else 1 */
    CLI_AT_JUDGE,       /* comparing models on data (qcal_accuracy_compare, keep-float): 2 for
                         * an option, 1 for the engine or memory, else 3 (models, data) */
    CLI_AT_ENGINE,      /* opening ONNX Runtime: 5 (out of memory 1) */
    CLI_AT_COUNT
} cli_at;

/* The exit code of failure status st (< 0) at stage. */
int cli_exit_code(qcal_status st, cli_at stage);

#endif
