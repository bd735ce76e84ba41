/* qcal equalize: BatchNormalization folding, cross-layer equalization and bias correction of
 * an ONNX model before quantization (qcal/onnx.h qcal_onnx_equalize, qcal/ptq.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <qcal/onnx.h>

#include "cli_common.h"
#include "cli_output.h"

typedef struct equalize_args {
    const char *in, *out, *qscheme, *sweeps, *bias_correction;
    bool analytic_bias_correction, keep_clip, no_equalize, report, quiet;
} equalize_args;

static const cli_opt equalize_opts[] = {
    CLI_TEXT(
        "usage: qcal equalize MODEL.onnx -o OUT.onnx [--bias-correction DUMP]\n"
        "       [--analytic-bias-correction] [--weight-qscheme S] [--keep-clip] [--no-equalize]\n"
        "       [--max-sweeps N] [--report] [-q]\n"
        "\n"
        "Folds every BatchNormalization into the Conv before it, then equalizes each chain\n"
        "Conv/Gemm -> Relu -> Conv/Gemm (Nagel et al. 2019: output channel i of the first layer\n"
        "divided by s_i = sqrt(r1_i * r2_i) / r2_i, input channel i of the second multiplied by\n"
        "it, depthwise and grouped convs included) so per-tensor weight quantization loses less.\n"
        "The float function is unchanged. A Clip(0, M) (ReLU6) inside a chain becomes Relu\n"
        "(reported: that changes values above M). Chains it cannot transform safely (a second\n"
        "reader of the middle tensors, e.g. a residual branch; shared or non-float32 weights;\n"
        "another activation) are left alone, one line each naming the node.\n"
        "\n"
        "options:\n"),
    CLI_STR("output", 'o', equalize_args, out, "OUT.onnx", "the equalized model (written atomically)"),
    CLI_STR("bias-correction", 0, equalize_args, bias_correction, "DUMP",
        "empirical bias correction: DUMP is a dump directory of\n"
        "MODEL's tensors ('qcal onnx-expose' + an engine run);\n"
        "each Conv/Gemm whose input is in it gets\n"
        "bias -= (W_q - W) E[x] (E[x] per channel, axis 1)"),
    CLI_BOOL("analytic-bias-correction", 0, equalize_args, analytic_bias_correction,
        "bias correction with E[x] from the folded BatchNorms\n"
        "(layers after BN -> Relu only)"),
    CLI_STR("weight-qscheme", 0, equalize_args, qscheme, "S",
        "the weight quantizer bias correction compensates (qint8):\n"
        "per_channel_symmetric (default), per_channel_affine,\n"
        "per_tensor_symmetric, per_tensor_affine"),
    CLI_BOOL("keep-clip", 0, equalize_args, keep_clip,
        "refuse chains through Clip(0, M) instead of replacing it"),
    CLI_BOOL("no-equalize", 0, equalize_args, no_equalize, "only fold BatchNorms (and correct biases)"),
    CLI_STR("max-sweeps", 0, equalize_args, sweeps, "N",
        "passes over the chains (default 100; stops when settled)"),
    CLI_BOOL("report", 0, equalize_args, report,
        "print each layer's largest / smallest per-channel weight\n"
        "range, after folding and at the end"),
    CLI_BOOL("quiet", 'q', equalize_args, quiet,
        "no line per chain left alone on stderr (the summary\n"
        "counts them)"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Exit codes: 2 bad options; 3 a missing or malformed MODEL or DUMP; 4 an output that\n"
        "cannot be written (an existing file is left intact); 1 a failure while transforming\n"
        "(e.g. non-finite weights), or ONNX support not built.\n"),
    { 0 },
};
const cli_spec cmd_equalize_spec = { equalize_opts, 31 };

static void print_lines(const char *cmd, const char *what, char **lines, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        fprintf(stderr, "qcal: %s: %s: %s\n", cmd, what, lines[i]);
}

/* The model, the one positional argument (cli_handler; every option is a stored row). */
static int take_model(void *args, const char *cmd, int id, const char *val)
{
    equalize_args *a = args;
    (void)id;
    if (a->in)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "one model expected, got '%s' and '%s'", a->in, val);
    a->in = val;
    return 0;
}

int cmd_equalize(int argc, char **argv)
{
    const char *cmd = argv[0];
    equalize_args a = { 0 };
    int rc = cli_parse(&cmd_equalize_spec, argc, argv, &a, take_model);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    const char *in = a.in, *out = a.out, *qscheme = a.qscheme, *sweeps = a.sweeps;
    bool report = a.report, quiet = a.quiet;
    qcal_onnx_equalize_options opt;
    qcal_onnx_equalize_options_default(&opt);
    opt.bias_correction_dump = a.bias_correction;
    opt.analytic_bias_correction = a.analytic_bias_correction;
    opt.replace_clip = opt.replace_clip && !a.keep_clip;
    opt.equalize = opt.equalize && !a.no_equalize;
    if ((rc = cli_check_in_out(cmd, in, out)) || (rc = cli_model_output_check(cmd, out)))
        return rc;
    if (qscheme) {
        qcal_qscheme q;
        if (qcal_qscheme_parse(qscheme, &q) != QCAL_OK || q == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
            return cli_fail(cmd, QCAL_EXIT_USAGE,
                            "--weight-qscheme: '%s' is not per_channel_symmetric, per_channel_affine, per_tensor_symmetric or per_tensor_affine",
                            qscheme);
        opt.weight_qconfig.qscheme = q;
    }
    if (sweeps && (rc = cli_parse_i64(cmd, "--max-sweeps", sweeps, 1, 1000000, &opt.max_sweeps)))
        return rc;
    if (opt.bias_correction_dump && opt.analytic_bias_correction)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--bias-correction and --analytic-bias-correction exclude each other");
    if (!qcal_onnx_available())
        return cli_fail(cmd, QCAL_EXIT_FAILURE,
                        "unavailable: this qcal was built without ONNX support (protobuf-c; meson -Donnx=enabled)");
    qcal_onnx_model *m = NULL;
    qcal_onnx_equalize_report rep = { 0 };
    qcal_status st = qcal_onnx_model_load_file(in, &m);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    st = qcal_onnx_equalize(m, &opt, &rep);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_TRANSFORM), st);
        goto out;
    }
    if ((st = qcal_onnx_model_save_file(m, NULL, out)) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_WRITE), st);
        goto out;
    }
    print_lines(cmd, "note: Clip replaced by Relu", rep.replaced, rep.n_replaced);
    if (!quiet)
        print_lines(cmd, "refused", rep.refused, rep.n_refused);
    if (report) {
        printf("%-40s %-5s %8s %6s %14s %14s\n", "layer", "op", "channels", "groups", "ratio_folded", "ratio_final");
        for (int64_t i = 0; i < rep.n_layers; i++)
            printf("%-40s %-5s %8lld %6lld %14.6g %14.6g\n", rep.before[i].node, rep.before[i].op_type,
                   (long long)rep.before[i].channels, (long long)rep.before[i].groups, rep.before[i].ratio,
                   rep.after[i].ratio);
        for (int64_t i = 0; i < rep.fold.n_folded; i++)
            printf("folded: %s\n", rep.fold.folded[i]);
        for (int64_t i = 0; i < rep.n_pairs; i++)
            printf("equalized: %s\n", rep.pairs[i]);
        for (int64_t i = 0; i < rep.n_corrected; i++)
            printf("bias corrected: %s\n", rep.corrected[i]);
    }
    printf("qcal: equalize: wrote %s: %lld BatchNormalization%s folded, %lld chain%s equalized (%lld sweep%s), "
           "%lld Clip%s replaced by Relu, %lld bias%s corrected, %lld chain%s refused\n",
           out, (long long)rep.fold.n_folded, rep.fold.n_folded == 1 ? "" : "s", (long long)rep.n_pairs,
           rep.n_pairs == 1 ? "" : "s", (long long)rep.sweeps, rep.sweeps == 1 ? "" : "s",
           (long long)rep.n_replaced, rep.n_replaced == 1 ? "" : "s", (long long)rep.n_corrected, rep.n_corrected == 1 ? "" : "es",
           (long long)rep.n_refused, rep.n_refused == 1 ? "" : "s");
    rc = cli_flush(cmd, stdout);
out:
    qcal_onnx_equalize_report_free(&rep);
    qcal_onnx_model_destroy(&m);
    return rc;
}
