/* State files in the CLI (observe --load-state/--save-state, calibrate --save-state, merge):
 * reading and writing observer and session states with the documented exit codes, and the
 * observer report JSON that 'qcal observe' and 'qcal merge' both print. Format of the
 * files: docs/state.md. */
#ifndef QCAL_TOOLS_CLI_STATE_H
#define QCAL_TOOLS_CLI_STATE_H

#include <stdbool.h>
#include <stdio.h>

#include <qcal/calib.h>
#include <qcal/observer.h>

#include "cli_output.h"

typedef enum cli_state_kind {
    CLI_STATE_OBSERVER,   /* "QCOB" */
    CLI_STATE_SESSION,    /* "QCSS" */
} cli_state_kind;

/* Reads path into *buf and *len (free() it) and tells which state it holds from its magic.
 * Reports and returns QCAL_EXIT_INPUT when it cannot be read or is neither; else 0. */
int cli_state_read(const char *cmd, const char *path, void **buf, size_t *len,
                   cli_state_kind *kind);

/* Loads an observer state file; reports and returns QCAL_EXIT_INPUT on failure. */
int cli_observer_state_load(const char *cmd, const char *path, qcal_observer **out);

/* Stage an observer or session state (tools/cli_output.h: written and flushed, renamed by
 * cli_stage_commit); report and return QCAL_EXIT_OUTPUT (or 1: out of memory) on failure,
 * everything staged then aborted. */
int cli_observer_state_stage(const char *cmd, const qcal_observer *obs, const char *path,
                             cli_staged *st);
int cli_session_state_stage(const char *cmd, const qcal_calib_session *s, const char *path,
                            cli_staged *st);

/* Prints the observer's report, one JSON object on f (fields in 'qcal observe --help'):
 * observer, dtype, qscheme, quant_min, quant_max, [axis], min, max, scale, zero_point,
 * nonfinite, batches, digest. *no_data is set when no finite value was seen (default
 * qparams printed). Returns 0 or an exit code (reported). */
int cli_observer_report(const char *cmd, qcal_observer *obs, FILE *f, bool *no_data);

#endif
