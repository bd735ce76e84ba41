/* qcal convert: a native JSON calibration table to other formats, with the bytes that
 * calibrating straight to those formats writes (same table, same writers). */
#include <string.h>

#include <qcal/calib.h>

#include "cli_common.h"
#include "cli_output.h"
#include "cli_table_out.h"

typedef struct convert_args {
    const char *in;
    cli_table_out out;
} convert_args;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal convert TABLE.json --format F[,F...] -o OUT\n"
        "\n"
        "Reads a native qcal table (written by 'qcal calibrate --format json') and writes it in\n"
        "the listed formats, byte for byte what 'qcal calibrate' writes when asked for those\n"
        "formats directly, so one calibration serves every engine. --format is required. The\n"
        "summary line counts the entries each format holds (TensorRT and ONNX Runtime: the\n"
        "activations with data; ncnn: weights and activations with data; json: all).\n"
        "\n"
        "options:\n"),
    CLI_TABLE_OUT_OPTS,
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Exit codes as everywhere: a missing or malformed TABLE exits 3, an unwritable OUT 4,\n"
        "a name a format cannot hold 1 (unless --skip-unrepresentable).\n"),
    { 0 },
};
const cli_spec cmd_convert_spec = { opts, 27 };

static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    convert_args *a = args;
    if (id != CLI_POSITIONAL)
        return cli_table_out_opt(cmd, &a->out, id, val);
    if (a->in)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "one table expected, got '%s' and '%s'", a->in,
                        val);
    a->in = val;
    return 0;
}

int cmd_convert(int argc, char **argv)
{
    const char *cmd = argv[0];
    convert_args a = { 0 };
    cli_table_out_init(&a.out);
    int rc = cli_parse(&cmd_convert_spec, argc, argv, &a, take_opt);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    const char *in = a.in;
    cli_table_out out = a.out;
    if (!in)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no input table (see 'qcal convert --help')");
    if (out.nformats == 0)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no --format: say which formats to write "
                        "(json, tensorrt, onnxruntime, ncnn)");
    if ((rc = cli_table_out_check(cmd, &out)))
        return rc;
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_table_read_json(in, &t);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    rc = cli_table_out_write(cmd, &out, t);
    if (!rc) {
        /* what each format holds: "tensorrt: 3 entries, ncnn: 5 entries" */
        char counts[512];
        size_t k = 0;
        counts[0] = '\0';
        for (int i = 0; i < out.nformats && k < sizeof counts; i++) {
            int64_t n = 0;
            qcal_calib_table_export_count(t, out.formats[i], &out.xo, &n);
            k += (size_t)snprintf(counts + k, sizeof counts - k, "%s%s: %lld entr%s",
                                  i ? ", " : "", qcal_calib_format_name(out.formats[i]),
                                  (long long)n, n == 1 ? "y" : "ies");
        }
        /* With -o - the table is stdout: the summary goes to stderr. */
        FILE *say = cli_output_is_stdout(out.out) ? stderr : stdout;
        fprintf(say, "qcal: convert: wrote %s (%s) from %s\n", out.out, counts, in);
        rc = cli_flush(cmd, say);
    }
    qcal_calib_table_destroy(&t);
    return rc;
}
