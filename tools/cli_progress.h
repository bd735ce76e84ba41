/* One progress style for every long subcommand (calibrate, evaluate, report, merge,
 * observe): a bar on a terminal, otherwise plain lines; --quiet turns it off.
 *
 *   cli_progress p; cli_progress_init(&p, cmd, !quiet);
 *   cli_progress_phase(&p, "reading", "files", nfiles);
 *   for each file: cli_progress_set(&p, done, name);
 *   cli_progress_phase(&p, "searching", "tensors", n);  (library callback: cli_progress_cb)
 *   cli_progress_end(&p);
 *
 * On a terminal: one line redrawn in place, at most 10 times a second,
 * "[########            ] reading 12/40 files 0:03 conv1", kept through every phase (the
 * final search included) and erased at the end or before an error or warning line.
 * Otherwise (a file, a pipe, a CI log): one plain line at most every QCAL_PROGRESS_INTERVAL
 * seconds (default 10; the environment variable takes a number of seconds, 0 = every
 * update, for tests), "qcal: calibrate: progress: reading 12/40 files, 10.0 s elapsed",
 * and at the end, if any line was printed, "qcal: calibrate: progress: done: searching
 * 12/12 tensors, 31.2 s elapsed": a run shorter than the interval prints nothing. */
#ifndef QCAL_TOOLS_CLI_PROGRESS_H
#define QCAL_TOOLS_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cli_progress {
    const char *cmd;
    bool on;              /* reporting at all (not --quiet, and the writing rank) */
    bool tty;             /* stderr is a terminal: the bar */
    bool drawn;           /* the bar is on the screen */
    bool printed;         /* a plain line was printed */
    double t0, last_line, last_draw, interval;
    const char *phase, *unit;
    int64_t done, total;
    const char *line_phase;   /* phase and done of the last plain line (no repeats) */
    int64_t line_done;
    char item[64];
} cli_progress;

/* Starts the clock. on: report at all; tty: draw a bar (isatty(2), or the distributed
 * run's answer). */
void cli_progress_init(cli_progress *p, const char *cmd, bool on, bool tty);

/* A new phase ("reading", "searching", "scoring", "writing") of total units ("files",
 * "tensors"); done starts at 0. */
void cli_progress_phase(cli_progress *p, const char *phase, const char *unit, int64_t total);

/* done units of the phase finished; item (may be NULL) is what is being worked on. */
void cli_progress_set(cli_progress *p, int64_t done, const char *item);

/* A qcal_progress_fn (qcal/common.h) for library options: user is the cli_progress. */
void cli_progress_cb(void *user, int64_t done, int64_t total, const char *item);

/* Ends the report: erases the bar, or prints the closing plain line (when any was printed). */
void cli_progress_end(cli_progress *p);

/* Erases the bar of the active report, if drawn, so that a message line starts clean (the
 * error and warning printers call it); the bar comes back at the next update. */
void cli_progress_interrupt(void);

#endif
