/* Shared declarations of the qcal CLI: the subcommand entry points and the helpers
 * every subcommand uses to report errors with the documented exit codes. */
#ifndef QCAL_TOOLS_CLI_H
#define QCAL_TOOLS_CLI_H

#include "qcal/qcal.h"

/* Exit codes (documented in `qcal --help`). */
enum {
    QCAL_EXIT_OK = 0,        /* success */
    QCAL_EXIT_FAILURE = 1,   /* the operation failed (bad data, I/O, numerical policy) */
    QCAL_EXIT_USAGE = 2,     /* bad command line: unknown option, impossible value */
    QCAL_EXIT_INPUT = 3,     /* an input file is missing, unreadable or malformed */
    QCAL_EXIT_OUTPUT = 4,    /* an output could not be written */
};

typedef struct qcal_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);   /* argv[0] is the subcommand name */
} qcal_cmd;

int cmd_observe(int argc, char **argv);

#endif
