/* qcal compare: a float ONNX model and its QDQ version run in ONNX Runtime on the same data,
 * judged at the model's outputs, and the sensitivity of each quantized op
 * (include/qcal/accuracy.h, docs/accuracy.md). */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_accuracy.h"
#include "cli_common.h"
#include "cli_dispatch.h"
#include "cli_model.h"
#include "cli_output.h"
#include "cli_progress.h"

typedef struct compare_args {
    const char *paths[2], *out, *format;
    int npaths;
    bool quiet;
    cli_model_args ma;
    cli_accuracy_args aa;
} compare_args;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal compare FLOAT.onnx QDQ.onnx --data SPEC [--labels L.npy] [--metric top1|exact]\n"
        "                    [--sensitivity-samples N] [--format table|csv|json] [-o OUT]\n"
        "\n"
        "Runs FLOAT.onnx and QDQ.onnx (graph optimization 'all': ONNX Runtime's int8 kernels) on\n"
        "the same data and compares them at every model output: SQNR in dB over all finite\n"
        "values, cosine, top-1 agreement (argmax over the last axis, per position, and whole\n"
        "samples), and with --labels each model's accuracy. Then, on the first N samples, the\n"
        "sensitivity of each quantized op (a node that reads through DequantizeLinear): the SQNR at\n"
        "the outputs with only that op quantized, and with every op but it quantized, measured on\n"
        "one gated model (float kernels, Q/DQ simulated, one sample a run; one ONNX Runtime\n"
        "session for every choice). Ops are listed most sensitive first. FLOAT.onnx is also read\n"
        "as 'qcal qdq' reads it (opset raised to 13, BatchNormalization folded) to find the float\n"
        "weights of the QDQ model's quantized ones; the float model run is the file as given.\n"
        "\n"
        "options:\n"),
    CLI_OPT("data", 0, CLI_MODEL_DATA, "SPEC",
        "the data: a directory or a .npy, .npz or .safetensors file of\n"
        "arrays named by model input, batch on axis 0 (docs/data.md)"),
    CLI_OPT_REPEATED("input", 0, CLI_MODEL_INPUT, "NAME=PATH",
        "(repeatable) input NAME from PATH (a .npy file, or a directory\n"
        "of them: one batch each)"),
    CLI_OPT("batch", 0, CLI_MODEL_BATCH, "N",
        "samples per run of the two models where the first dimension is\n"
        "dynamic (default 8; the per-op runs take one sample each)"),
    CLI_OPT("ort-lib", 0, CLI_MODEL_ORT_LIB, "PATH",
        "ONNX Runtime's libonnxruntime.so.1 (default: $QCAL_ORT_LIB,\n"
        "the loader's path, then the npm cache ./run.sh fills)"),
    CLI_ACCURACY_OPTS,
    CLI_STR("format", 0, compare_args, format, "F",
        "table (default), csv (kind,name,...: one row per output and\n"
        "per op) or json ({\"outputs\": [...], \"ops\": [...]})"),
    CLI_STR("output", 'o', compare_args, out, "OUT", "write there (default: standard output)"),
    CLI_BOOL("quiet", 'q', compare_args, quiet, "no progress report on stderr"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Exit codes: 2 bad options; 3 a missing or malformed model, data or labels, data that do\n"
        "not match the model, models whose outputs differ; 4 an output that cannot be written;\n"
        "1 a failure during a run; 5 ONNX Runtime could not be loaded.\n"),
    { 0 },
};
const cli_spec cmd_compare_spec = { opts, 27 };

/* A figure for a table cell: fixed decimals, "inf", or "-" when it does not apply. */
static void cell(FILE *f, double v, const char *fmt, int width, double scale)
{
    char b[32];
    if (isnan(v))
        snprintf(b, sizeof b, "-");
    else if (isinf(v))
        snprintf(b, sizeof b, "%s", v > 0 ? "inf" : "-inf");
    else
        snprintf(b, sizeof b, fmt, v * scale);
    fprintf(f, " %*s", width, b);
}

static void json_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fputs(isinf(v) && v > 0 ? "\"inf\"" : isinf(v) ? "\"-inf\"" : "null", f);
    else
        fprintf(f, "%.17g", v);
}

static void csv_num(FILE *f, double v)
{
    if (isnan(v))
        return;
    if (isinf(v))
        fputs(v > 0 ? "inf" : "-inf", f);
    else
        fprintf(f, "%.17g", v);
}

static void csv_str(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void write_table(FILE *f, const qcal_accuracy_report *r, const char *version, bool labels,
                        qcal_accuracy_metric metric)
{
    fprintf(f, "qcal compare: %lld samples in ONNX Runtime %s; SQNR over every float output %s", (long long)r->samples,
            version, "");
    cell(f, r->sqnr_db, "%.2f", 0, 1.0);
    fprintf(f, " dB\n\n");
    int w = 6;
    for (int64_t i = 0; i < r->n_outputs; i++)
        if ((int)strlen(r->outputs[i].name) > w)
            w = (int)strlen(r->outputs[i].name);
    fprintf(f, "%-*s %9s %9s %10s %10s", w, "output", "SQNR dB", "cosine", "top-1 agr", "exact agr");
    if (labels)
        fprintf(f, " %10s %10s %7s", metric == QCAL_ACCURACY_EXACT ? "float exact" : "float top1",
                metric == QCAL_ACCURACY_EXACT ? "quant exact" : "quant top1", "drop");
    fputc('\n', f);
    for (int64_t i = 0; i < r->n_outputs; i++) {
        const qcal_accuracy_output *o = &r->outputs[i];
        fprintf(f, "%-*s", w, o->name);
        cell(f, o->sqnr_db, "%.2f", 9, 1.0);
        cell(f, o->cosine, "%.6f", 9, 1.0);
        cell(f, o->agree, "%.2f%%", 10, 100.0);
        cell(f, o->exact_agree, "%.2f%%", 10, 100.0);
        if (labels) {
            cell(f, o->acc_float, "%.2f%%", 10, 100.0);
            cell(f, o->acc_quant, "%.2f%%", 10, 100.0);
            cell(f, o->acc_float - o->acc_quant, "%.2f", 7, 100.0);
        }
        fputc('\n', f);
    }
    if (!r->n_ops)
        return;
    fprintf(f, "\nper-op sensitivity on %lld samples (gated model, every op quantized: ", (long long)r->sensitivity_samples);
    cell(f, r->gated_sqnr_db, "%.2f", 0, 1.0);
    fprintf(f, " dB); SQNR at the outputs, most sensitive first:\n");
    int wn = 2, wt = 4;
    for (int64_t i = 0; i < r->n_ops; i++) {
        if ((int)strlen(r->ops[i].name) > wn)
            wn = (int)strlen(r->ops[i].name);
        if ((int)strlen(r->ops[i].op_type) > wt)
            wt = (int)strlen(r->ops[i].op_type);
    }
    fprintf(f, "%5s  %-*s %-*s %12s %12s\n", "rank", wn, "op", wt, "type", "alone dB", "all but dB");
    for (int64_t i = 0; i < r->n_ops; i++) {
        const qcal_accuracy_op *o = &r->ops[i];
        fprintf(f, "%5lld  %-*s %-*s", (long long)(i + 1), wn, o->name[0] ? o->name : "(unnamed)", wt, o->op_type);
        cell(f, o->sqnr_only_db, "%.2f", 12, 1.0);
        cell(f, o->sqnr_others_db, "%.2f", 12, 1.0);
        fputc('\n', f);
    }
}

static void write_csv(FILE *f, const qcal_accuracy_report *r)
{
    fputs("kind,name,op_type,samples,sqnr_db,cosine,agree,exact_agree,acc_float,acc_quant,sqnr_alone_db,"
          "sqnr_all_but_db\n", f);
    for (int64_t i = 0; i < r->n_outputs; i++) {
        const qcal_accuracy_output *o = &r->outputs[i];
        fputs("output,", f);
        csv_str(f, o->name);
        fprintf(f, ",,%lld,", (long long)o->samples);
        csv_num(f, o->sqnr_db), fputc(',', f);
        csv_num(f, o->cosine), fputc(',', f);
        csv_num(f, o->agree), fputc(',', f);
        csv_num(f, o->exact_agree), fputc(',', f);
        csv_num(f, o->acc_float), fputc(',', f);
        csv_num(f, o->acc_quant);
        fputs(",,\n", f);
    }
    for (int64_t i = 0; i < r->n_ops; i++) {
        const qcal_accuracy_op *o = &r->ops[i];
        fputs("op,", f);
        csv_str(f, o->name);
        fputc(',', f);
        csv_str(f, o->op_type);
        fprintf(f, ",%lld,,,,,,,", (long long)r->sensitivity_samples);
        csv_num(f, o->sqnr_only_db), fputc(',', f);
        csv_num(f, o->sqnr_others_db);
        fputc('\n', f);
    }
}

static void write_json(FILE *f, const qcal_accuracy_report *r, const char *fl, const char *qd, const char *version,
                       const qcal_accuracy_options *ao)
{
    fputs("{\"float\": ", f);
    cli_json_str(f, fl);
    fputs(", \"quantized\": ", f);
    cli_json_str(f, qd);
    fputs(", \"engine\": ", f);
    cli_json_str(f, version);
    fprintf(f, ", \"samples\": %lld, \"metric\": ", (long long)r->samples);
    if (ao->labels)
        cli_json_str(f, qcal_accuracy_metric_name(ao->metric));
    else
        fputs("null", f);
    fputs(", \"sqnr_db\": ", f);
    json_num(f, r->sqnr_db);
    fputs(",\n \"outputs\": [", f);
    for (int64_t i = 0; i < r->n_outputs; i++) {
        const qcal_accuracy_output *o = &r->outputs[i];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        cli_json_str(f, o->name);
        fprintf(f, ", \"samples\": %lld, \"positions\": %lld, \"nonfinite\": %lld, \"sqnr_db\": ", (long long)o->samples,
                (long long)o->positions, (long long)o->nonfinite);
        json_num(f, o->sqnr_db);
        fputs(", \"cosine\": ", f);
        json_num(f, o->cosine);
        fputs(", \"top1_agreement\": ", f);
        json_num(f, o->agree);
        fputs(", \"exact_agreement\": ", f);
        json_num(f, o->exact_agree);
        fputs(", \"accuracy_float\": ", f);
        json_num(f, o->acc_float);
        fputs(", \"accuracy_quantized\": ", f);
        json_num(f, o->acc_quant);
        fputc('}', f);
    }
    fprintf(f, "],\n \"sensitivity_samples\": %lld, \"gated_sqnr_db\": ", (long long)r->sensitivity_samples);
    json_num(f, r->gated_sqnr_db);
    fputs(",\n \"ops\": [", f);
    for (int64_t i = 0; i < r->n_ops; i++) {
        const qcal_accuracy_op *o = &r->ops[i];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        cli_json_str(f, o->name);
        fputs(", \"op_type\": ", f);
        cli_json_str(f, o->op_type);
        fputs(", \"sqnr_alone_db\": ", f);
        json_num(f, o->sqnr_only_db);
        fputs(", \"sqnr_all_but_db\": ", f);
        json_num(f, o->sqnr_others_db);
        fputc('}', f);
    }
    fprintf(f, "],\n \"runs\": %lld, \"seconds\": %.3f}\n", (long long)r->runs, r->seconds);
}

/* The two models and the data and accuracy options (cli_handler). */
static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    compare_args *a = args;
    int rc;
    if (id == CLI_POSITIONAL) {
        if (a->npaths == 2)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "two models expected (FLOAT.onnx QDQ.onnx), got a third: '%s'", val);
        a->paths[a->npaths++] = val;
        return 0;
    }
    if ((rc = cli_model_opt(cmd, &a->ma, id, val)) >= 0 || (rc = cli_accuracy_opt(cmd, &a->aa, id, val)) >= 0)
        return rc;
    return 0;
}

int cmd_compare(int argc, char **argv)
{
    const char *cmd = argv[0];
    compare_args a = { 0 };
    cli_model_args *ma = &a.ma;
    cli_accuracy_args *aa = &a.aa;
    cli_accuracy_args_init(aa);
    int rc = 0;
    if ((rc = cli_model_args_init(cmd, ma, argc)))
        return rc;
    qcal_onnx_model *fm = NULL, *qm = NULL, *ref = NULL;
    qcal_engine *engine = NULL;
    qcal_accuracy_report rep;
    memset(&rep, 0, sizeof rep);
    char *text = NULL;
    size_t tlen = 0;
    cli_progress prog;
    cli_progress_init(&prog, cmd, false, false);
    if ((rc = cli_parse(&cmd_compare_spec, argc, argv, &a, take_opt))) {
        rc = rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
        goto done;
    }
    const char **paths = a.paths, *out = a.out, *format = a.format;
    int npaths = a.npaths;
    bool quiet = a.quiet;
    if (npaths != 2) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "two models expected: FLOAT.onnx QDQ.onnx (see 'qcal compare --help')");
        goto done;
    }
    if (!cli_model_args_given(ma)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no --data or --input given: the models run on data");
        goto done;
    }
    if (format && strcmp(format, "table") && strcmp(format, "csv") && strcmp(format, "json")) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--format: '%s' is not table, csv or json", format);
        goto done;
    }
    if (out && (rc = cli_output_check(cmd, out)))
        goto done;
    qcal_accuracy_options ao;
    if ((rc = cli_accuracy_options(cmd, aa, ma->batch, &ao)))
        goto done;
    qcal_status st;
    if ((st = qcal_onnx_model_load_file(paths[0], &fm)) != QCAL_OK || (st = qcal_onnx_model_load_file(paths[1], &qm)) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
        goto done;
    }
    if ((rc = cli_model_load(cmd, paths[0], true, &ref)))
        goto done;
    if ((rc = cli_engine_open(cmd, ma->ort_lib, &engine)))
        goto done;
    cli_progress_init(&prog, cmd, !quiet, isatty(2));
    cli_progress_phase(&prog, "running", "runs", 0);
    ao.progress = cli_progress_cb;
    ao.progress_user = &prog;
    st = qcal_accuracy_compare(engine, fm, qm, ref, ma->data, ma->inputs, ma->ninputs, &ao, &rep);
    cli_progress_end(&prog);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_JUDGE), st);
        goto done;
    }
    FILE *f = open_memstream(&text, &tlen);
    if (!f) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto done;
    }
    if (format && !strcmp(format, "csv"))
        write_csv(f, &rep);
    else if (format && !strcmp(format, "json"))
        write_json(f, &rep, paths[0], paths[1], qcal_engine_version(engine), &ao);
    else
        write_table(f, &rep, qcal_engine_version(engine), ao.labels != NULL, ao.metric);
    if (fclose(f)) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto done;
    }
    if (out) {
        cli_staged s = {0};
        if ((rc = cli_stage(cmd, &s, out, text, tlen)) || (rc = cli_stage_commit(cmd, &s))) {
            cli_stage_abort(&s);
            goto done;
        }
        if (!quiet && !cli_output_is_stdout(out))
            cli_note(cmd, "wrote %s: %lld outputs, %lld ops; %lld runs in %.1f s", out, (long long)rep.n_outputs,
                     (long long)rep.n_ops, (long long)rep.runs, rep.seconds);
    } else {
        fwrite(text, 1, tlen, stdout);
        rc = cli_flush(cmd, stdout);
    }
done:
    cli_progress_end(&prog);
    free(text);
    qcal_accuracy_report_free(&rep);
    qcal_engine_close(&engine);
    qcal_onnx_model_destroy(&fm);
    qcal_onnx_model_destroy(&qm);
    qcal_onnx_model_destroy(&ref);
    cli_accuracy_args_free(aa);
    cli_model_args_free(ma);
    return rc;
}
