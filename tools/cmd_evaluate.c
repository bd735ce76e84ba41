/* qcal evaluate: every candidate observer on every tensor of a dump directory, the exact
 * SQNR of each one's quantization, and a per-tensor recommendation (include/qcal/evaluate.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_eval.h"

static const char help[] =
    "usage: qcal evaluate DIR [--observers a,b,...] [--min-sqnr DB] [--format table|csv|json]\n"
    "                     [--rules-out RULES] [-o OUT]\n"
    "\n"
    "Evaluates every candidate observer on every tensor of the dump directory DIR (read as\n"
    "'qcal calibrate DIR' reads it). Pass 1 reads each file once and feeds it to every\n"
    "candidate of its tensor; pass 2 reads the files again and fake-quantizes them with each\n"
    "candidate's final qparams. For each tensor and observer it reports the qparams, the\n"
    "clipping range, the fraction of values clipped and the SQNR in dB,\n"
    "20 log10(||x|| / ||x - fq(x)||) over all of the tensor's finite values (exact).\n"
    "Candidates: activations get every per-tensor kind (quint8 per_tensor_affine); weights\n"
    "also get the per-channel kinds (qint8, symmetric, axis 0).\n"
    "recommended: the highest SQNR, ties to the simpler observer; with --min-sqnr, the\n"
    "simplest observer that reaches DB. Simplest first: minmax, per_channel_minmax,\n"
    "moving_average_minmax, moving_average_per_channel_minmax, percentile, histogram, mse,\n"
    "entropy.\n"
    "\n"
    "options:\n"
    "  --observers LIST         comma-separated candidate kinds (default: every kind)\n"
    "  --min-sqnr DB            recommend the simplest observer with SQNR >= DB\n"
    "  --format F               table (default), csv (a row per tensor and observer) or json\n"
    "                           ({\"tensors\": [{\"name\", \"role\", \"recommended\",\n"
    "                           \"observers\": {KIND: {\"sqnr_db\", \"scale\", \"zero_point\",\n"
    "                           \"min\", \"max\", \"quant_min\", \"quant_max\", \"clipped\"}}}]};\n"
    "                           sqnr_db is null when the quantization is exact)\n"
    "  --rules-out RULES        also write a rules file giving every tensor its recommended\n"
    "                           observer ('qcal calibrate DIR --rules RULES' uses it)\n"
    "  -o, --output OUT         write the results to OUT instead of stdout (atomically)\n"
    "  -h, --help               this help\n"
    "\n"
    "Errors are one line on stderr: a missing DIR or malformed .npy exits 3, an unwritable\n"
    "output exits 4, a bad option exits 2.\n";

enum { OPT_HELP = 1, OPT_OBSERVERS, OPT_MIN_SQNR, OPT_FORMAT, OPT_RULES_OUT, OPT_OUT };

static const cli_opt opts[] = {
    { "help", 'h', false, OPT_HELP },
    { "observers", 0, true, OPT_OBSERVERS },
    { "min-sqnr", 0, true, OPT_MIN_SQNR },
    { "format", 0, true, OPT_FORMAT },
    { "rules-out", 0, true, OPT_RULES_OUT },
    { "output", 'o', true, OPT_OUT },
    { 0 },
};
const cli_opt *const cmd_evaluate_opts = opts;

int cmd_evaluate(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "evaluate";
    const char *dir = NULL, *rules_out = NULL, *out = NULL, *val;
    qcal_numeric_eval_options opt;
    qcal_numeric_eval_options_default(&opt);
    qcal_numeric_eval_format fmt = QCAL_NUMERIC_EVAL_TABLE;
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    int id, rc;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        switch (id) {
        case CLI_ERROR: return QCAL_EXIT_USAGE;
        case OPT_HELP: fputs(help, stdout); return QCAL_EXIT_OK;
        case OPT_OBSERVERS:
            if ((rc = cli_eval_parse_kinds(cmd, val, &opt.kinds)))
                return rc;
            break;
        case OPT_MIN_SQNR:
            if ((rc = cli_parse_f64(cmd, "--min-sqnr", val, &opt.min_sqnr_db)))
                return rc;
            break;
        case OPT_FORMAT:
            if (!strcmp(val, "table"))
                fmt = QCAL_NUMERIC_EVAL_TABLE;
            else if (!strcmp(val, "csv"))
                fmt = QCAL_NUMERIC_EVAL_CSV;
            else if (!strcmp(val, "json"))
                fmt = QCAL_NUMERIC_EVAL_JSON;
            else
                return cli_fail(cmd, QCAL_EXIT_USAGE, "--format: unknown format '%s' (expected "
                                "table, csv or json)", val);
            break;
        case OPT_RULES_OUT: rules_out = val; break;
        case OPT_OUT: out = val; break;
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
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no dump directory (see 'qcal evaluate --help')");
    qcal_numeric_eval *ev = NULL;
    if ((rc = cli_eval_dump(cmd, dir, &opt, &ev)))
        return rc;
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_numeric_eval_format_results(ev, fmt, &buf, &len);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    } else if (rules_out && (st = qcal_numeric_eval_write_rules(ev, rules_out)) != QCAL_OK) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_IO ? QCAL_EXIT_OUTPUT : QCAL_EXIT_FAILURE, st);
    } else if (out) {
        if ((st = qcal_numeric_eval_write_results(ev, fmt, out)) != QCAL_OK)
            rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
    } else if (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0) {
        rc = QCAL_EXIT_OUTPUT;
    }
    qcal_free(buf);
    qcal_numeric_eval_destroy(&ev);
    return rc;
}
