/* qcal onnx-expose and qcal qdq: the ONNX model a user deploys (qcal/onnx.h, docs/onnx.md). */
#include <stdlib.h>
#include <string.h>

#include <qcal/atomic_file.h>
#include <qcal/calib.h>
#include <qcal/onnx.h>

#include "cli_common.h"
#include "cli_output.h"

static const char expose_help[] =
    "usage: qcal onnx-expose MODEL.onnx -o OUT.onnx [--profile ort|tensorrt] [--list FILE]\n"
    "       [--exclude PATTERN]... [--op-types LIST]\n"
    "\n"
    "Makes every tensor the profile will quantize (what 'qcal qdq' looks up in the table) a\n"
    "graph output of OUT.onnx, type and shape kept. Run OUT.onnx in any engine on calibration\n"
    "data and save those outputs as a qcal dump directory (names percent-encoded, or a\n"
    "manifest.json); 'qcal calibrate' then makes a table that matches the model one to one\n"
    "(recipes for ONNX Runtime in docs/onnx.md).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT.onnx    the model with the extra outputs (written atomically)\n"
    "  --profile P              ort (default: ONNX Runtime) or tensorrt (TensorRT 10)\n"
    "  --list FILE              also write the exposed names, one per line\n"
    "  --exclude PATTERN        glob on node and tensor names left float, not exposed\n"
    "                           (repeatable); give 'qcal qdq' the same patterns\n"
    "  --op-types LIST          comma list of op types to quantize (default: the profile's);\n"
    "                           give 'qcal qdq' the same list\n"
    "  -h, --help               this help\n"
    "\n"
    "Exit codes: 2 bad options; 3 a missing, malformed or hostile MODEL; 4 an output that\n"
    "cannot be written (an existing file is left intact); 1 a name --list cannot hold (a\n"
    "line break) or ONNX support not built.\n";

static const char qdq_help[] =
    "usage: qcal qdq MODEL.onnx --table TABLE.json -o OUT.onnx [--profile ort|tensorrt]\n"
    "       [--weight-observer KIND] [--weight-qscheme Q | --float-weights]\n"
    "       [--exclude PATTERN]... [--op-types LIST] [--strict]\n"
    "\n"
    "Writes MODEL with QuantizeLinear/DequantizeLinear nodes: activations from the table\n"
    "(matched by tensor name), weights per-channel symmetric qint8 computed from the model's\n"
    "own initializers. Needs a default-domain opset >= 13.\n"
    "  profile ort: ONNX Runtime node units (DQ -> op -> Q), activations as calibrated\n"
    "  (quint8 asymmetric), int8 weights + DequantizeLinear, int32 biases, a Relu after a\n"
    "  quantized op folded into its output Q.\n"
    "  profile tensorrt: TensorRT 10 explicit quantization, Q/DQ on op inputs only,\n"
    "  activations symmetric int8 (scale = amax / 127), float weights + Q + DQ, float biases.\n"
    "\n"
    "options:\n"
    "  --table TABLE.json       native qcal table ('qcal calibrate --format json')\n"
    "  -o, --output OUT.onnx    the quantized model (written atomically)\n"
    "  --profile P              ort (default) or tensorrt\n"
    "  --weight-observer KIND   per_channel_minmax (default) or moving_average_per_channel_minmax\n"
    "  --weight-qscheme Q       per_channel_symmetric (default), per_channel_affine,\n"
    "                           per_tensor_affine or per_tensor_symmetric (qint8; per-tensor:\n"
    "                           minmax over the whole weight; tensorrt: symmetric only)\n"
    "  --float-weights          weights and biases stay float, no Q/DQ (activations only)\n"
    "  --exclude PATTERN        glob on node and tensor names left float (repeatable)\n"
    "  --op-types LIST          comma list of op types to quantize (default: the profile's)\n"
    "  --strict                 tensors missing from the table are an error (default: they\n"
    "                           stay float, listed in one warning)\n"
    "  -h, --help               this help\n"
    "\n"
    "Exit codes: 2 bad options; 3 a missing or malformed MODEL or TABLE, or a model opset\n"
    "below 13; 4 an output that cannot be written (an existing file is left intact); 1\n"
    "missing tensors under --strict, or ONNX support not built.\n";

enum { OPT_HELP = 1, OPT_OUT, OPT_PROFILE, OPT_LIST, OPT_TABLE, OPT_WOBS, OPT_EXCLUDE, OPT_OPTYPES,
       OPT_STRICT, OPT_WQSCHEME, OPT_FLOATW };

static const cli_opt expose_opts[] = {
    { "help", 'h', false, OPT_HELP },
    { "output", 'o', true, OPT_OUT },
    { "profile", 0, true, OPT_PROFILE },
    { "list", 0, true, OPT_LIST },
    { "exclude", 0, CLI_REPEATED, OPT_EXCLUDE },
    { "op-types", 0, true, OPT_OPTYPES },
    { 0 },
};
const cli_opt *const cmd_onnx_expose_opts = expose_opts;

static const cli_opt qdq_opts[] = {
    { "help", 'h', false, OPT_HELP },
    { "table", 0, true, OPT_TABLE },
    { "output", 'o', true, OPT_OUT },
    { "profile", 0, true, OPT_PROFILE },
    { "weight-observer", 0, true, OPT_WOBS },
    { "exclude", 0, CLI_REPEATED, OPT_EXCLUDE },
    { "op-types", 0, true, OPT_OPTYPES },
    { "strict", 0, false, OPT_STRICT },
    { "weight-qscheme", 0, true, OPT_WQSCHEME },
    { "float-weights", 0, false, OPT_FLOATW },
    { 0 },
};
const cli_opt *const cmd_qdq_opts = qdq_opts;

/* Exit code of a failed model load. */
static int load_exit(qcal_status st)
{
    return st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE : QCAL_EXIT_INPUT;
}

static int once(const char *cmd, const char **slot, const char *opt, const char *val)
{
    if (*slot)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--%s given twice ('%s' and '%s')", opt, *slot, val);
    *slot = val;
    return 0;
}

static int check_available(const char *cmd)
{
    if (qcal_onnx_available())
        return 0;
    return cli_fail(cmd, QCAL_EXIT_FAILURE,
                    "unavailable: this qcal was built without ONNX support (protobuf-c; meson -Donnx=enabled)");
}

/* "'a', 'b', 'c'" of n names into a new string (NULL: out of memory). */
static char *join_names(char **names, int64_t n, const char *sep, bool quote)
{
    size_t len = 1;
    for (int64_t i = 0; i < n; i++)
        len += strlen(names[i]) + strlen(sep) + 2;
    char *s = malloc(len), *w = s;
    if (!s)
        return NULL;
    *w = '\0';
    for (int64_t i = 0; i < n; i++)
        w += sprintf(w, "%s%s%s%s", i ? sep : "", quote ? "'" : "", names[i], quote ? "'" : "");
    return s;
}

/* Folds the model's BatchNormalizations into their Convs (as qcal qdq and qcal equalize do,
 * so exposed names, tables and Q/DQ placement agree) and notes it on stderr. 0 or an exit code. */
static int fold_bn(const char *cmd, qcal_onnx_model *m)
{
    qcal_onnx_fold_report rep = { 0 };
    qcal_status st = qcal_onnx_fold_bn(m, &rep);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (rep.n_folded) {
        char *s = join_names(rep.folded, rep.n_folded, "; ", false);
        fprintf(stderr, "qcal: %s: note: %lld BatchNormalization%s folded into the Conv before: %s\n", cmd,
                (long long)rep.n_folded, rep.n_folded == 1 ? "" : "s", s ? s : "(out of memory)");
        free(s);
    }
    qcal_onnx_fold_report_free(&rep);
    return 0;
}

/* cmd_onnx_expose with room for the --exclude patterns (argc entries). */
static int expose_main(int argc, char **argv, const char **exclude)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *cmd = p.cmd, *val, *in = NULL, *out = NULL, *profile = NULL, *list = NULL,
               *op_types = NULL;
    int64_t n_exclude = 0;
    int id, rc;
    while ((id = cli_next(&p, expose_opts, &val)) != CLI_END) {
        if (id == CLI_ERROR)
            return QCAL_EXIT_USAGE;
        if (id == OPT_HELP) {
            fputs(expose_help, stdout);
            return 0;
        }
        if (id == OPT_EXCLUDE) {
            exclude[n_exclude++] = val;
            continue;
        }
        if (id == CLI_POSITIONAL) {
            if (in)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "one model expected, got '%s' and '%s'", in, val);
            in = val;
            continue;
        }
        rc = id == OPT_OUT ? once(cmd, &out, "output", val)
             : id == OPT_PROFILE ? once(cmd, &profile, "profile", val)
             : id == OPT_OPTYPES ? once(cmd, &op_types, "op-types", val)
                                 : once(cmd, &list, "list", val);
        if (rc)
            return rc;
    }
    if ((rc = cli_check_in_out(cmd, in, out)))
        return rc;
    /* Every output checked before the work (docs/cli.md "Outputs"). */
    if ((rc = cli_model_output_check(cmd, out)) || (rc = cli_output_check(cmd, list)))
        return rc;
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.op_types = op_types;
    opt.exclude = exclude;
    opt.n_exclude = n_exclude;
    if (profile && qcal_onnx_profile_parse(profile, &opt.profile) != QCAL_OK)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--profile: '%s' is not ort or tensorrt", profile);
    if ((rc = check_available(cmd)))
        return rc;
    qcal_onnx_model *m = NULL;
    qcal_status st = qcal_onnx_model_load(in, &m);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, load_exit(st), st);
    if ((rc = fold_bn(cmd, m))) {
        qcal_onnx_model_destroy(&m);
        return rc;
    }
    char **names = NULL, **untyped = NULL;
    int64_t n = 0, added = 0, n_untyped = 0;
    qcal_atomic_file lf = { 0 };
    st = qcal_onnx_list(m, &opt, &names, &n);
    if (st == QCAL_OK)
        st = qcal_onnx_list_untyped(m, &opt, &untyped, &n_untyped);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto out;
    }
    if (n_untyped) {
        char *u = join_names(untyped, n_untyped, ", ", true);
        fprintf(stderr, "qcal: %s: note: %lld tensor%s of unknown element type (neither declared nor inferred) "
                "not exposed: %s\n", cmd, (long long)n_untyped, n_untyped == 1 ? "" : "s", u ? u : "(out of memory)");
        free(u);
    }
    if (list) {
        for (int64_t i = 0; i < n; i++)
            if (strchr(names[i], '\n') || strchr(names[i], '\r')) {
                rc = cli_fail(cmd, QCAL_EXIT_FAILURE,
                              "--list: tensor name '%s' holds a line break; a line-per-name list cannot hold it",
                              names[i]);
                goto out;
            }
        if ((st = qcal_atomic_file_open(&lf, cli_output_path(list))) != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
            goto out;
        }
        for (int64_t i = 0; i < n; i++)
            fprintf(lf.fp, "%s\n", names[i]);
    }
    if ((st = qcal_onnx_expose(m, &opt, &added)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto out;
    }
    if (list && (st = qcal_atomic_file_flush(&lf)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        goto out;
    }
    if ((st = qcal_onnx_model_save(m, NULL, out)) != QCAL_OK) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE : QCAL_EXIT_OUTPUT, st);
        goto out;
    }
    if (list && (st = qcal_atomic_file_commit(&lf)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        goto out;
    }
    FILE *say = cli_output_is_stdout(list) ? stderr : stdout;   /* --list -: the names alone there */
    fprintf(say, "qcal: onnx-expose: wrote %s (profile %s): %lld tensors exposed, %lld new outputs%s%s\n", out,
            qcal_onnx_profile_name(opt.profile), (long long)n, (long long)added, list ? "; names in " : "",
            list ? list : "");
    rc = cli_flush(cmd, say);
out:
    qcal_atomic_file_abort(&lf);
    qcal_onnx_names_free(&untyped, n_untyped);
    qcal_onnx_names_free(&names, n);
    qcal_onnx_model_destroy(&m);
    return rc;
}

int cmd_onnx_expose(int argc, char **argv)
{
    const char **exclude = calloc((size_t)argc + 1, sizeof *exclude);
    if (!exclude)
        return cli_fail(argc > 0 ? argv[0] : "onnx-expose", QCAL_EXIT_FAILURE, "out of memory");
    int rc = expose_main(argc, argv, exclude);
    free(exclude);
    return rc;
}

int cmd_qdq(int argc, char **argv)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *cmd = p.cmd, *val, *in = NULL, *out = NULL, *profile = NULL, *table_path = NULL,
               *wobs = NULL, *op_types = NULL, *wqs = NULL;
    const char **exclude = calloc((size_t)argc + 1, sizeof *exclude);
    int64_t n_exclude = 0;
    bool strict = false, float_weights = false;
    int id, rc = 0;
    if (!exclude)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    while ((id = cli_next(&p, qdq_opts, &val)) != CLI_END) {
        if (id == CLI_ERROR) {
            rc = QCAL_EXIT_USAGE;
            goto done;
        }
        if (id == OPT_HELP) {
            fputs(qdq_help, stdout);
            goto done;
        }
        switch (id) {
        case CLI_POSITIONAL:
            if (in)
                rc = cli_fail(cmd, QCAL_EXIT_USAGE, "one model expected, got '%s' and '%s'", in, val);
            in = val;
            break;
        case OPT_OUT: rc = once(cmd, &out, "output", val); break;
        case OPT_PROFILE: rc = once(cmd, &profile, "profile", val); break;
        case OPT_TABLE: rc = once(cmd, &table_path, "table", val); break;
        case OPT_WOBS: rc = once(cmd, &wobs, "weight-observer", val); break;
        case OPT_OPTYPES: rc = once(cmd, &op_types, "op-types", val); break;
        case OPT_EXCLUDE: exclude[n_exclude++] = val; break;
        case OPT_STRICT: strict = true; break;
        case OPT_WQSCHEME: rc = once(cmd, &wqs, "weight-qscheme", val); break;
        case OPT_FLOATW: float_weights = true; break;
        }
        if (rc)
            goto done;
    }
    if ((rc = cli_check_in_out(cmd, in, out)) || (rc = cli_model_output_check(cmd, out)))
        goto done;
    if (!table_path) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no --table given (see 'qcal qdq --help')");
        goto done;
    }
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.exclude = exclude;
    opt.n_exclude = n_exclude;
    opt.op_types = op_types;
    opt.strict = strict;
    if (profile && qcal_onnx_profile_parse(profile, &opt.profile) != QCAL_OK) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--profile: '%s' is not ort or tensorrt", profile);
        goto done;
    }
    if (wobs) {
        if (qcal_observer_kind_parse(wobs, &opt.weight_observer) != QCAL_OK ||
            (opt.weight_observer != QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
             opt.weight_observer != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE,
                          "--weight-observer: '%s' is not a per-channel observer (per_channel_minmax, moving_average_per_channel_minmax)",
                          wobs);
            goto done;
        }
    }
    if (wqs && (qcal_qscheme_parse(wqs, &opt.weight_qscheme) != QCAL_OK ||
                opt.weight_qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE,
                      "--weight-qscheme: '%s' is not per_channel_symmetric, per_channel_affine, per_tensor_affine or per_tensor_symmetric",
                      wqs);
        goto done;
    }
    if (wqs && float_weights) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-qscheme and --float-weights exclude each other");
        goto done;
    }
    if (opt.profile == QCAL_ONNX_PROFILE_TENSORRT &&
        (opt.weight_qscheme == QCAL_PER_TENSOR_AFFINE || opt.weight_qscheme == QCAL_PER_CHANNEL_AFFINE)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-qscheme %s: profile tensorrt takes symmetric weights only", wqs);
        goto done;
    }
    opt.float_weights = float_weights;
    if ((rc = check_available(cmd)))
        goto done;
    qcal_calib_table *t = NULL;
    qcal_onnx_model *m = NULL;
    qcal_onnx_qdq_report rep = { 0 };
    qcal_status st = qcal_calib_table_read_json(table_path, &t);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE : QCAL_EXIT_INPUT, st);
        goto done;
    }
    st = qcal_onnx_model_load(in, &m);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, load_exit(st), st);
        goto free;
    }
    if ((rc = fold_bn(cmd, m)))
        goto free;
    bool save_failed = false;
    st = qcal_onnx_qdq_save(m, t, &opt, NULL, out, &rep, &save_failed);
    if (st != QCAL_OK && save_failed) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE : QCAL_EXIT_OUTPUT, st);
        goto free;
    }
    if (st != QCAL_OK) {
        int code = st == QCAL_ERR_INVALID_ARG ? QCAL_EXIT_USAGE
                   : (st == QCAL_ERR_UNSUPPORTED || st == QCAL_ERR_FORMAT) ? QCAL_EXIT_INPUT
                                                                           : QCAL_EXIT_FAILURE;
        rc = cli_fail_status(cmd, code, st);
        goto free;
    }
    if (rep.n_missing) {
        char *s = join_names(rep.missing, rep.n_missing, ", ", true);
        fprintf(stderr, "qcal: %s: warning: %lld tensor%s missing from the table stay%s float: %s\n", cmd,
                (long long)rep.n_missing, rep.n_missing == 1 ? "" : "s", rep.n_missing == 1 ? "s" : "",
                s ? s : "(out of memory)");
        free(s);
    }
    if (rep.n_skipped) {
        char *s = join_names(rep.skipped, rep.n_skipped, "; ", false);
        fprintf(stderr, "qcal: %s: note: %lld op%s left float or partly float: %s\n", cmd,
                (long long)rep.n_skipped, rep.n_skipped == 1 ? "" : "s", s ? s : "(out of memory)");
        free(s);
    }
    printf("qcal: qdq: wrote %s (profile %s): %lld ops quantized, %lld activations, %lld weights, %lld int32 biases\n",
           out, qcal_onnx_profile_name(opt.profile), (long long)rep.ops, (long long)rep.tensors,
           (long long)rep.weights, (long long)rep.biases);
    rc = cli_flush(cmd, stdout);
free:
    qcal_onnx_qdq_report_free(&rep);
    qcal_onnx_model_destroy(&m);
    qcal_calib_table_destroy(&t);
done:
    free(exclude);
    return rc;
}
