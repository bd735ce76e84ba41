/* qcal report: the visual HTML report of an observer evaluation (numeric/report.c), or of a
 * model comparison, the JSON 'qcal compare --format json' writes (numeric/accuracy_report.c). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <qcal/accuracy.h>

#include "cli_common.h"
#include "cli_eval.h"
#include "cli_output.h"


static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal report (DIR | STATE) -o REPORT.html [--observers a,b,...] [--min-sqnr DB]\n"
        "                   [--title TEXT] [--save-state S]\n"
        "       qcal report COMPARE.json -o REPORT.html [--title TEXT]\n"
        "\n"
        "Evaluates every candidate observer on every tensor of the dump directory DIR (as 'qcal\n"
        "evaluate' does) and writes one self-contained HTML file: inline SVG and CSS, a few\n"
        "lines of JavaScript to sort the summary table, nothing fetched. It holds a sortable\n"
        "summary (tensors x observers: SQNR, clipped fraction, the recommendation) and, per\n"
        "tensor, the data's histogram on a log scale with every observer's clipping range and\n"
        "the mass each one clips, the objective curves of the searching observers (L2 for\n"
        "histogram, KL for entropy, MSE for mse) against the threshold with the chosen point,\n"
        "and per-channel ranges for weights.\n"
        "STATE: an evaluation state saved by 'qcal evaluate DIR --save-state STATE' (or by this\n"
        "command's --save-state): the same report without the data, byte for byte; --observers\n"
        "keeps a subset of its candidates, --min-sqnr recommends again. Session and observer\n"
        "states (QCSS, QCOB) hold no data, so SQNR and clipping cannot be measured from them:\n"
        "they are refused.\n"
        "COMPARE.json: what 'qcal compare --format json' wrote (a file starting with '{'): the\n"
        "models, the per-output table (SQNR, cosine, top-1 and exact agreement, accuracies) and a\n"
        "bar chart of the per-op sensitivity, most sensitive first: the SQNR at the outputs with\n"
        "the op alone quantized and with every other op quantized, the all-quantized SQNR as a\n"
        "dashed line (docs/accuracy.md). Only -o, --title and -q apply.\n"
        "\n"
        "options:\n"),
    CLI_STR("output", 'o', cli_eval_args, out, "REPORT",
        "the HTML file (required; - is stdout, the summary line then\n"
        "goes to stderr; docs/cli.md \"Outputs\")"),
    CLI_OPT("observers", 0, CLI_EVAL_OBSERVERS, "LIST",
        "comma-separated candidate kinds (default: every kind)"),
    CLI_OPT("min-sqnr", 0, CLI_EVAL_MIN_SQNR, "DB",
        "recommend the simplest observer with SQNR >= DB"),
    CLI_STR("title", 0, cli_eval_args, title, "TEXT",
        "the report's title (default \"qcal calibration report\", for\n"
        "a compare report \"qcal accuracy report\")"),
    CLI_STR("save-state", 0, cli_eval_args, save_state, "S", "also save the evaluation state to S"),
    CLI_EVAL_QUIET_OPT,
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Errors are one line on stderr: a missing DIR, a malformed .npy, state or compare report,\n"
        "or a session or observer state exits 3, an unwritable REPORT or state exits 4 (both are\n"
        "checked before the work, and both are written or neither), a bad option exits 2.\n"),
    { 0 },
};
const cli_spec cmd_report_spec = { opts, 27 };

/* A compare report is told by its content: JSON text, whose first non-blank byte is '{'
 * (an evaluation state starts with its magic "QCEV"; a dump is a directory). */
static bool is_json_file(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return false;
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    int c;
    while ((c = fgetc(f)) != EOF && isspace(c))
        ;
    fclose(f);
    return c == '{';
}

static int report_compare(const char *cmd, cli_eval_args *a)
{
    if (a->kinds || a->min_sqnr_set || a->save_state)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "%s applies to a dump directory or evaluation "
                        "state, not to the compare report '%s'", a->kinds ? "--observers"
                        : a->min_sqnr_set ? "--min-sqnr" : "--save-state", a->input);
    int rc;
    if ((rc = cli_eval_check_outputs(cmd, a)))
        return rc;
    qcal_accuracy_report rep;
    qcal_accuracy_source src;
    qcal_status st = qcal_accuracy_report_read_json(a->input, &rep, &src);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    qcal_accuracy_html_options ho;
    qcal_accuracy_html_options_default(&ho);
    if (a->title)
        ho.title = a->title;
    ho.source = &src;
    st = qcal_accuracy_report_write_html(&rep, &ho, cli_output_path(a->out));
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_SAVE), st);
    } else {
        FILE *say = cli_output_is_stdout(a->out) ? stderr : stdout;
        fprintf(say, "qcal: report: wrote %s (%lld %s, %lld %s)\n", a->out,
                (long long)rep.n_outputs, CLI_PLURAL(rep.n_outputs, "output", "outputs"),
                (long long)rep.n_ops, CLI_PLURAL(rep.n_ops, "op", "ops"));
        rc = cli_flush(cmd, say);
    }
    qcal_accuracy_report_free(&rep);
    qcal_accuracy_source_free(&src);
    return rc;
}

int cmd_report(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "report";
    cli_eval_args a;
    int rc = cli_eval_parse(cmd, argc, argv, &cmd_report_spec, &a);
    if (rc >= 0)
        return rc;
    if (!a.out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no output: -o REPORT.html is required");
    if (is_json_file(a.input))
        return report_compare(cmd, &a);
    if ((rc = cli_eval_check_outputs(cmd, &a)))
        return rc;
    qcal_numeric_eval *ev = NULL;
    if ((rc = cli_eval_load(cmd, &a, &ev)))
        return rc;
    qcal_numeric_eval_report_options ro;
    qcal_numeric_eval_report_options_default(&ro);
    if (a.title)
        ro.title = a.title;
    /* The state staged, the report written, then the state renamed: all or none. */
    cli_staged staged = { 0 };
    cli_progress_phase(&a.progress, "writing", "outputs", 1);
    rc = cli_eval_stage_state(cmd, &a, ev, &staged);
    qcal_status st = QCAL_OK;
    if (!rc && (st = qcal_numeric_eval_write_report(ev, &ro, cli_output_path(a.out))) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_SAVE), st);
        cli_stage_abort(&staged);
    }
    if (!rc)
        rc = cli_stage_commit(cmd, &staged);
    cli_progress_set(&a.progress, rc ? 0 : 1, a.out);
    cli_progress_end(&a.progress);
    if (!rc) {
        /* With an output on stdout (-o -, --save-state -) the summary goes to stderr. */
        FILE *say = cli_output_is_stdout(a.out) || cli_output_is_stdout(a.save_state) ? stderr
                                                                                      : stdout;
        int64_t n = 0;
        qcal_numeric_eval_count(ev, &n);
        fprintf(say, "qcal: report: wrote %s (%lld %s)\n", a.out, (long long)n,
                CLI_PLURAL(n, "tensor", "tensors"));
        rc = cli_flush(cmd, say);
    }
    qcal_numeric_eval_destroy(&ev);
    return rc;
}
