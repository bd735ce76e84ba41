/* qcal report: the visual HTML report of an observer evaluation (numeric/report.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_eval.h"

static const char help[] =
    "usage: qcal report DIR -o REPORT.html [--observers a,b,...] [--min-sqnr DB]\n"
    "\n"
    "Evaluates every candidate observer on every tensor of the dump directory DIR (as 'qcal\n"
    "evaluate' does) and writes one self-contained HTML file: inline SVG and CSS, a few\n"
    "lines of JavaScript to sort the summary table, nothing fetched. It holds a sortable\n"
    "summary (tensors x observers: SQNR, clipped fraction, the recommendation) and, per\n"
    "tensor, the data's histogram on a log scale with every observer's clipping range and\n"
    "the mass each one clips, the objective curves of the searching observers (L2 for\n"
    "histogram, KL for entropy, MSE for mse) against the threshold with the chosen point,\n"
    "and per-channel ranges for weights.\n"
    "\n"
    "options:\n"
    "  -o, --output REPORT      the HTML file, written atomically (required)\n"
    "  --observers LIST         comma-separated candidate kinds (default: every kind)\n"
    "  --min-sqnr DB            recommend the simplest observer with SQNR >= DB\n"
    "  --title TEXT             the report's title (default \"qcal calibration report\")\n"
    "  -h, --help               this help\n"
    "\n"
    "Errors are one line on stderr: a missing DIR or malformed .npy exits 3, an unwritable\n"
    "REPORT exits 4, a bad option exits 2.\n";

enum { OPT_HELP = 1, OPT_OUT, OPT_OBSERVERS, OPT_MIN_SQNR, OPT_TITLE };

static const cli_opt opts[] = {
    { "help", 'h', false, OPT_HELP },
    { "output", 'o', true, OPT_OUT },
    { "observers", 0, true, OPT_OBSERVERS },
    { "min-sqnr", 0, true, OPT_MIN_SQNR },
    { "title", 0, true, OPT_TITLE },
    { 0 },
};
const cli_opt *const cmd_report_opts = opts;

int cmd_report(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "report";
    const char *dir = NULL, *out = NULL, *val;
    qcal_numeric_eval_options opt;
    qcal_numeric_eval_options_default(&opt);
    qcal_numeric_report_options ro;
    qcal_numeric_report_options_default(&ro);
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    int id, rc;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        switch (id) {
        case CLI_ERROR: return QCAL_EXIT_USAGE;
        case OPT_HELP: fputs(help, stdout); return QCAL_EXIT_OK;
        case OPT_OUT: out = val; break;
        case OPT_OBSERVERS:
            if ((rc = cli_eval_parse_kinds(cmd, val, &opt.kinds)))
                return rc;
            break;
        case OPT_MIN_SQNR:
            if ((rc = cli_parse_f64(cmd, "--min-sqnr", val, &opt.min_sqnr_db)))
                return rc;
            break;
        case OPT_TITLE: ro.title = val; break;
        case CLI_POSITIONAL:
            if (dir)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "one dump directory expected, got '%s' "
                                "and '%s'", dir, val);
            dir = val;
            break;
        default: return cli_fail(cmd, QCAL_EXIT_USAGE, "unexpected option");
        }
    }
    if (!dir)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no dump directory (see 'qcal report --help')");
    if (!out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no output: -o REPORT.html is required");
    qcal_numeric_eval *ev = NULL;
    if ((rc = cli_eval_dump(cmd, dir, &opt, &ev)))
        return rc;
    ro.source = dir;
    qcal_status st = qcal_numeric_eval_write_report(ev, &ro, out);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_IO ? QCAL_EXIT_OUTPUT : QCAL_EXIT_FAILURE, st);
    } else {
        int64_t n = 0;
        qcal_numeric_eval_count(ev, &n);
        printf("qcal report: wrote %s (%lld tensors)\n", out, (long long)n);
        if (fflush(stdout) != 0)
            rc = QCAL_EXIT_OUTPUT;
    }
    qcal_numeric_eval_destroy(&ev);
    return rc;
}
