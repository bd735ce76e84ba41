/* Shared by `qcal evaluate` and `qcal report`: the two passes of an observer evaluation
 * over a dump directory. */
#ifndef QCAL_TOOLS_CLI_EVAL_H
#define QCAL_TOOLS_CLI_EVAL_H

#include <qcal/calib_dump.h>
#include <qcal/evaluate.h>

/* Parses "--observers a,b,..." into a kind mask; returns 0 or an exit code (reported). */
int cli_eval_parse_kinds(const char *cmd, const char *list, uint32_t *mask);

/* Scans dir and runs both passes (every file read once per pass); *out owned by the
 * caller. Returns 0 or an exit code (reported). */
int cli_eval_dump(const char *cmd, const char *dir, const qcal_numeric_eval_options *opt,
                  qcal_numeric_eval **out);

#endif
