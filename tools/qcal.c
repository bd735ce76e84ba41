/* qcal: one binary, one subcommand per tools/cmd_<name>.c. Adding a subcommand is one line
 * in the table below (plus its declaration in tools/cli.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli_common.h"

static const qcal_cmd commands[] = {
    { "observe", "feed .npy batches to an observer, print its range and qparams (JSON)", cmd_observe, &cmd_observe_spec },
    { "quantize", "quantize a float .npy with given scale/zero-point (per tensor or channel)", cmd_quantize, &cmd_quantize_spec },
    { "dequantize", "dequantize a uint8/int8/int32 .npy back to float32", cmd_dequantize, &cmd_dequantize_spec },
    { "calibrate", "calibrate a dump directory, or an ONNX model run on data in ONNX Runtime, into tables (JSON, TensorRT, ONNX Runtime, ncnn)", cmd_calibrate, &cmd_calibrate_spec },
    { "convert", "convert a JSON calibration table to TensorRT, ONNX Runtime and ncnn formats", cmd_convert, &cmd_convert_spec },
    { "merge", "merge saved observer or session states (exactly: JSON, table or state)", cmd_merge, &cmd_merge_spec },
    { "evaluate", "every observer on every tensor of a dump: exact SQNR, clipping, a recommendation per tensor", cmd_evaluate, &cmd_evaluate_spec },
    { "report", "the visual HTML report of an evaluation (histograms, clipping ranges, objective curves)", cmd_report, &cmd_report_spec },
    { "stats", "one statistics line per tensor of .safetensors/.npy files or dump directories (CSV, summary)", cmd_stats, &cmd_stats_spec },
    { "compare-weights", "quantize-dequantize weights, report SQNR/L2/cosine per tensor and group", cmd_compare_weights, &cmd_compare_weights_spec },
    { "onnx-expose", "make every tensor a profile quantizes an output of an ONNX model (for calibration dumps)", cmd_onnx_expose, &cmd_onnx_expose_spec },
    { "qdq", "insert QuantizeLinear/DequantizeLinear into an ONNX model from a table or calibration data (ONNX Runtime, TensorRT 10)", cmd_qdq, &cmd_qdq_spec },
    { "compare", "run a float ONNX model and its QDQ version in ONNX Runtime: SQNR, agreement, accuracy at the outputs, per-op sensitivity", cmd_compare, &cmd_compare_spec },
    { "equalize", "fold BatchNorms, equalize Conv/Gemm -> Relu -> Conv/Gemm chains, correct biases (ONNX, before qdq)", cmd_equalize, &cmd_equalize_spec },
    { "fakequant", "fake-quantize a float .npy (forward, straight-through / LSQ backward)", cmd_fakequant, &cmd_fakequant_spec },
};

/* "unknown subcommand 'calibrat'; did you mean 'calibrate'?" when one subcommand is within
 * 2 edits (1 for names of up to 4 letters) and nearer than any other. */
static int unknown_subcommand(const char *name)
{
    const char *best = NULL;
    int bd = 99, ties = 0;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        int d = cli_edit_distance(name, commands[i].name);
        if (d < bd) {
            bd = d;
            best = commands[i].name;
            ties = 0;
        } else if (d == bd) {
            ties++;
        }
    }
    int limit = strlen(name) <= 4 ? 1 : 2;
    if (best && bd <= limit && !ties)
        fprintf(stderr, "qcal: unknown subcommand '%s'; did you mean '%s'? (see 'qcal --help')\n",
                name, best);
    else
        fprintf(stderr, "qcal: unknown subcommand '%s' (see 'qcal --help')\n", name);
    return QCAL_EXIT_USAGE;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qcal [--help | --version] SUBCOMMAND [OPTIONS] [ARGS]\n"
            "\n"
            "Static-quantization calibration toolkit (PyTorch 1.13 torch.ao.quantization\n"
            "arithmetic). 'qcal SUBCOMMAND --help' documents each subcommand.\n"
            "\n"
            "subcommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-18s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n"
            "options: long options take '--name VALUE' or '--name=VALUE'; numbers are strict\n"
            "(no trailing characters, no nan/inf, range-checked); an option with a value is\n"
            "given once unless its help says (repeatable).\n"
            "\n"
            "exit codes:\n"
            "  0  success\n"
            "  1  the operation failed (bad data, numerical policy such as --strict, no data)\n"
            "  2  usage error: unknown option, missing value, impossible value\n"
            "  3  an input file is missing, unreadable or malformed\n"
            "  4  an output file could not be written (an existing file is left intact)\n"
            "  5  ONNX Runtime could not be loaded (calibrate MODEL.onnx --data, qdq --data, compare)\n"
            "Errors are reported as one line on stderr: 'qcal: SUBCOMMAND: MESSAGE'; warnings\n"
            "('qcal: SUBCOMMAND: warning: ...'), notes and the summary line of a run that\n"
            "writes files have the same form.\n"
            "\n"
            "'qcal --man' prints the qcal(1) man page and 'qcal --bash-completion' the bash\n"
            "completion script (both installed by meson install).\n");
}

/* The commands read tensor files one after another into buffers of a few MiB. glibc serves
 * blocks above 128 KiB (its default threshold) with a fresh mmap and returns them with munmap,
 * so every file would cost page faults and zeroing of its whole buffer (half the system time
 * of `qcal calibrate` on a 1 GiB dump of 8 MiB files); these thresholds keep such buffers on
 * the heap, reused from file to file. Peak memory is unchanged (one buffer per thread). */
static void tune_allocator(void)
{
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}

/* A run whose standard output could not be written (a full disk, a closed pipe's EPIPE with
 * SIGPIPE ignored) does not succeed: one line with the reason, exit 4 (cmd NULL: qcal's own
 * --help/--version/--man output). Runs that already failed keep their code and message. */
static int finish(const char *cmd, int rc)
{
    if (rc != QCAL_EXIT_OK)
        return rc;
    if (cmd)
        return cli_flush(cmd, stdout);
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return QCAL_EXIT_OK;
    fprintf(stderr, "qcal: cannot write to standard output: %s\n", strerror(errno ? errno : EIO));
    return QCAL_EXIT_OUTPUT;
}

int main(int argc, char **argv)
{
    tune_allocator();
    if (argc < 2) {
        fprintf(stderr, "qcal: no subcommand given (see 'qcal --help')\n");
        return QCAL_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        if (argc > 2 && !strcmp(name, "help")) {
            /* "qcal help SUBCOMMAND" is "qcal SUBCOMMAND --help". */
            char help_flag[] = "--help";
            char *sub[] = { argv[2], help_flag, NULL };
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (!strcmp(argv[2], commands[i].name))
                    return finish(argv[2], commands[i].run(2, sub));
            return unknown_subcommand(argv[2]);
        }
        usage(stdout);
        return finish(NULL, QCAL_EXIT_OK);
    }
    int ncmd = (int)(sizeof commands / sizeof commands[0]);
    if (!strcmp(name, "--man"))
        return finish(NULL, cli_gen_man(stdout, commands, ncmd));
    if (!strcmp(name, "--bash-completion"))
        return finish(NULL, cli_gen_bash_completion(stdout, commands, ncmd));
    if (!strcmp(name, "--list-options"))
        return finish(NULL, cli_gen_option_list(stdout, commands, ncmd));
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
        printf("qcal %s\n", qcal_version());
        return finish(NULL, QCAL_EXIT_OK);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(name, commands[i].name))
            return finish(name, commands[i].run(argc - 1, argv + 1));
    if (name[0] == '-')
        fprintf(stderr, "qcal: unknown option '%s' (see 'qcal --help')\n", name);
    else
        return unknown_subcommand(name);
    return QCAL_EXIT_USAGE;
}
