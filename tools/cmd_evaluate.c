/* qcal evaluate: every candidate observer on every tensor of a dump directory, the exact
 * SQNR of each one's quantization, and a per-tensor recommendation (include/qcal/numeric_eval.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_eval.h"
#include "cli_output.h"


static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal evaluate (DIR | STATE) [--observers a,b,...] [--min-sqnr DB] [--dtype D]\n"
        "                     [--format table|csv|json] [--rules-out RULES] [--save-state S] [-o OUT]\n"
        "\n"
        "Evaluates every candidate observer on every tensor of the dump directory DIR (read as\n"
        "'qcal calibrate DIR' reads it). Pass 1 reads each file once and feeds it to every\n"
        "candidate of its tensor; pass 2 reads the files again and fake-quantizes them with each\n"
        "candidate's final qparams. For each tensor and observer it reports the qparams, the\n"
        "clipping range, the fraction of values clipped and the SQNR in dB,\n"
        "20 log10(||x|| / ||x - fq(x)||) over all of the tensor's finite values (exact).\n"
        "Candidates: activations get every per-tensor kind (quint8 per_tensor_affine); weights\n"
        "also get the per-channel kinds (qint8, symmetric, axis 0). With --dtype float8_e4m3fn\n"
        "or float8_e5m2 every candidate is FP8 instead (symmetric, scale = amax / 448 or / 57344,\n"
        "scored with FP8 fake-quant; clipped = saturated; docs/fp8.md).\n"
        "recommended: the highest SQNR, ties to the simpler observer; with --min-sqnr, the\n"
        "simplest observer that reaches DB. Simplest first: minmax, per_channel_minmax,\n"
        "moving_average_minmax, moving_average_per_channel_minmax, percentile, histogram, mse,\n"
        "entropy.\n"
        "Instead of DIR, an evaluation state saved by --save-state (QCEV, docs/state.md) gives the\n"
        "same results without the data; --observers then keeps a subset of its candidates and\n"
        "--min-sqnr recommends again.\n"
        "\n"
        "options:\n"),
    CLI_OPT("observers", 0, CLI_EVAL_OBSERVERS, "LIST",
        "comma-separated candidate kinds (default: every kind)"),
    CLI_OPT("dtype", 0, CLI_EVAL_DTYPE, "D",
        "float8_e4m3fn or float8_e5m2: FP8 candidates (DIR only)"),
    CLI_OPT("min-sqnr", 0, CLI_EVAL_MIN_SQNR, "DB",
        "recommend the simplest observer with SQNR >= DB"),
    CLI_OPT("format", 0, CLI_EVAL_FORMAT, "F",
        "table (default), csv (a row per tensor and observer) or json\n"
        "({\"tensors\": [{\"name\", \"role\", \"recommended\",\n"
        "\"observers\": {KIND: {\"sqnr_db\", \"scale\", \"zero_point\",\n"
        "\"min\", \"max\", \"quant_min\", \"quant_max\", \"clipped\"}}}]};\n"
        "sqnr_db is null when the quantization is exact)"),
    CLI_STR("rules-out", 0, cli_eval_args, rules_out, "RULES",
        "also write a rules file giving every tensor its recommended\n"
        "observer ('qcal calibrate DIR --rules RULES' uses it)"),
    CLI_STR("save-state", 0, cli_eval_args, save_state, "S",
        "also save the evaluation state (every candidate's observer\n"
        "state, exact SQNR and clipped count per tensor) to S, for\n"
        "'qcal report S' and 'qcal evaluate S'"),
    CLI_STR("output", 'o', cli_eval_args, out, "OUT",
        "write the results to OUT instead of stdout (- is stdout;\n"
        "docs/cli.md \"Outputs\")"),
    CLI_EVAL_QUIET_OPT,
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Errors are one line on stderr: a missing DIR, a malformed .npy or state, or a session or\n"
        "observer state (no data to score) exits 3, an unwritable output exits 4 (every output is\n"
        "checked before the work, and all are written or none), a bad option exits 2.\n"),
    { 0 },
};
const cli_spec cmd_evaluate_spec = { opts, 27 };

int cmd_evaluate(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "evaluate";
    cli_eval_args a;
    int rc = cli_eval_parse(cmd, argc, argv, &cmd_evaluate_spec, &a);
    if (rc >= 0)
        return rc;
    /* Every output checked before the work; written after it, all or none. */
    if ((rc = cli_eval_check_outputs(cmd, &a)))
        return rc;
    qcal_numeric_eval *ev = NULL;
    if ((rc = cli_eval_load(cmd, &a, &ev)))
        return rc;
    char *buf = NULL;
    size_t len = 0;
    cli_staged staged = { 0 };
    cli_progress_phase(&a.progress, "writing", "outputs", 1);
    qcal_status st = qcal_numeric_eval_format_results(ev, a.format, &buf, &len);
    if (st != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (!rc)
        rc = cli_eval_stage_state(cmd, &a, ev, &staged);
    if (!rc && a.out)
        rc = cli_stage(cmd, &staged, a.out, buf, len);
    if (!rc && a.rules_out &&
        (st = qcal_numeric_eval_write_rules(ev, cli_output_path(a.rules_out))) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_SAVE), st);
        cli_stage_abort(&staged);
    }
    if (!rc)
        rc = cli_stage_commit(cmd, &staged);
    cli_progress_set(&a.progress, rc ? 0 : 1, NULL);
    cli_progress_end(&a.progress);
    if (!rc && !a.out && (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0))
        rc = cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write to standard output: %s", strerror(errno));
    qcal_free(buf);
    qcal_numeric_eval_destroy(&ev);
    return rc;
}
