/* Running a model in the engine from the CLI (tools/cli_model.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_model.h"

int cli_model_args_init(const char *cmd, cli_model_args *a, int argc)
{
    memset(a, 0, sizeof *a);
    a->auto_samples = -1;
    a->inputs = calloc((size_t)argc + 1, sizeof *a->inputs);
    a->carry = calloc((size_t)argc + 1, sizeof *a->carry);
    if (!a->inputs || !a->carry) {
        cli_model_args_free(a);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    }
    return 0;
}

void cli_model_args_free(cli_model_args *a)
{
    free(a->inputs);
    free(a->carry);
    a->inputs = a->carry = NULL;
}

bool cli_model_args_given(const cli_model_args *a)
{
    return a->data || a->ninputs > 0;
}

int cli_model_opt(const char *cmd, cli_model_args *a, int id, const char *val)
{
    switch (id) {
    case CLI_MODEL_DATA: a->data = val; return 0;
    case CLI_MODEL_INPUT:
        if (!strchr(val, '=') || val[0] == '=')
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--input '%s': expected NAME=PATH", val);
        a->inputs[a->ninputs++] = val;
        return 0;
    case CLI_MODEL_CARRY:
        if (!strchr(val, '=') || val[0] == '=' || !strchr(val, '=')[1])
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--carry '%s': expected OUTPUT=INPUT", val);
        a->carry[a->ncarry++] = val;
        return 0;
    case CLI_MODEL_BATCH: return cli_parse_i64(cmd, "--batch", val, 1, INT64_MAX / 2, &a->batch);
    case CLI_MODEL_ORT_LIB: a->ort_lib = val; return 0;
    case CLI_MODEL_AUTO_SAMPLES:
        return cli_parse_i64(cmd, "--auto-samples", val, 0, INT64_MAX / 2, &a->auto_samples);
    case CLI_MODEL_OVERLAP: a->overlap = true; return 0;
    default: return -1;
    }
}

int cli_model_observer_auto(const char *cmd, cli_model_args *a, cli_observer_args *oa,
                            bool *have_obs, const char *rules_path, bool default_auto)
{
    int at = -1;
    for (int i = 0; i < oa->n; i++)
        if (!strcmp(oa->key[i], "observer") && !strcmp(oa->value[i], "auto"))
            at = i;
    if (at < 0) {
        a->observer_auto = default_auto && !*have_obs && !rules_path;
        if (a->auto_samples >= 0 && !a->observer_auto)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--auto-samples goes with --observer auto");
        return 0;
    }
    if (rules_path)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--observer auto and --rules exclude each other: "
                        "auto chooses every tensor's observer");
    if (oa->n > 1)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--observer auto takes no other observer option "
                        "(--%s): its candidates use the default qconfig and bins",
                        oa->key[at == 0 ? 1 : 0]);
    oa->n = 0;
    *have_obs = false;
    a->observer_auto = true;
    return 0;
}

void cli_model_chosen(const qcal_model_calib_report *rep, char *buf, size_t cap)
{
    bool used[QCAL_OBSERVER_KIND_COUNT] = { false };
    size_t len = 0;
    buf[0] = '\0';
    for (;;) {
        int best = -1;
        for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
            if (!used[k] && rep->chosen[k] > 0 && (best < 0 || rep->chosen[k] > rep->chosen[best]))
                best = k;
        if (best < 0)
            break;
        used[best] = true;
        int w = snprintf(buf + len, cap - len, "%s%s %lld", len ? ", " : "",
                         qcal_observer_kind_name((qcal_observer_kind)best),
                         (long long)rep->chosen[best]);
        if (w < 0 || (size_t)w >= cap - len)
            break;
        len += (size_t)w;
    }
}

void cli_model_auto_line(const char *cmd, const qcal_model_calib_report *rep, FILE *f)
{
    if (!rep->auto_samples)
        return;
    /* "per-tensor 27/64 agree 10.67 dB": the samples whose argmax agrees with float's
     * everywhere (when an output has positions), then the output SQNR */
    bool agree = rep->auto_agree[0] >= 0;
    fprintf(f, "qcal: %s: observer auto at the outputs (%lld %s, one per run; %s): ", cmd,
            (long long)rep->auto_samples, CLI_PLURAL(rep->auto_samples, "sample", "samples"),
            agree ? "samples whose argmax agrees with float's everywhere, then output SQNR"
                  : "output SQNR");
    for (int k = 0; k <= QCAL_OBSERVER_KIND_COUNT; k++) {
        if (isnan(rep->auto_sqnr_db[k]))
            continue;
        fprintf(f, "%s%s ", k ? ", " : "", k ? qcal_observer_kind_name((qcal_observer_kind)(k - 1))
                                             : "per-tensor");
        if (agree)
            fprintf(f, "%lld/%lld ", (long long)rep->auto_agree[k], (long long)rep->auto_samples);
        fprintf(f, "%.2f dB", rep->auto_sqnr_db[k]);
    }
    fprintf(f, "; chose %s\n", rep->auto_choice < 0 ? "per-tensor"
                         : qcal_observer_kind_name((qcal_observer_kind)rep->auto_choice));
}

int cli_engine_open(const char *cmd, const char *ort_lib, qcal_engine **e)
{
    qcal_engine_options eo;
    qcal_engine_options_default(&eo);
    eo.library = ort_lib;
    qcal_status st = qcal_engine_open(&eo, e);
    return st < 0 ? cli_fail_status(cmd, cli_exit_code(st, CLI_AT_ENGINE), st) : 0;
}

int cli_fold_bn(const char *cmd, qcal_onnx_model *m, bool quiet)
{
    qcal_onnx_fold_report rep = { 0 };
    qcal_status st = qcal_onnx_fold_bn(m, &rep);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    /* A count, not the list: the pairs are in the model ('qcal equalize --report' lists
     * layers); a note of every name ran to kilobytes on real models. */
    if (rep.n_folded && !quiet)
        cli_note(cmd, "%lld BatchNormalization%s folded into the Conv before %s", (long long)rep.n_folded,
                 rep.n_folded == 1 ? "" : "s", rep.n_folded == 1 ? "it" : "them");
    qcal_onnx_fold_report_free(&rep);
    return 0;
}

/* Raises m to default-domain opset `opset` (qcal_onnx_upgrade) when it is below, with one
 * note per adapted op type. 0 or an exit code (3: an opset or op qcal cannot raise). */
int cli_model_raise(const char *cmd, qcal_onnx_model *m, int64_t opset, bool quiet)
{
    qcal_onnx_model_info info;
    qcal_status st = qcal_onnx_model_get_info(m, &info);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (info.opset < 0 || info.opset >= opset)
        return 0;   /* qcal qdq says what is wrong with a model without a default-domain opset */
    qcal_onnx_upgrade_report rep = { 0 };
    if ((st = qcal_onnx_upgrade(m, opset, &rep)) != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    if (!quiet) {
        cli_note(cmd, "opset %lld raised to %lld (%lld op type%s adapted)", (long long)rep.from,
                 (long long)rep.to, (long long)rep.n_adapted, rep.n_adapted == 1 ? "" : "s");
        for (int64_t i = 0; i < rep.n_adapted; i++)
            cli_note(cmd, "%s", rep.adapted[i]);
    }
    qcal_onnx_upgrade_report_free(&rep);
    return 0;
}

int cli_model_load(const char *cmd, const char *path, bool quiet, qcal_onnx_model **out)
{
    if (!qcal_onnx_available())
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "unavailable: this qcal was built without ONNX "
                        "support (protobuf-c; meson -Donnx=enabled)");
    qcal_onnx_model *m = NULL;
    qcal_status st = qcal_onnx_model_load_file(path, &m);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    /* 9-12 -> 13: what qcal qdq needs, so onnx-expose and calibrate refuse what qdq would
     * before any work */
    int rc = cli_model_raise(cmd, m, 13, quiet);
    if (!rc)
        rc = cli_fold_bn(cmd, m, quiet);
    if (rc) {
        qcal_onnx_model_destroy(&m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Exit code of a data error: memory 1, else the input's (3). */
static int data_exit(qcal_status st)
{
    return cli_exit_code(st, CLI_AT_READ);
}

int cli_model_calibrate(const char *cmd, qcal_engine *e, const qcal_onnx_model *m,
                        const cli_model_args *a, const qcal_onnx_qdq_options *sel,
                        qcal_calib_session *s, int rank, int ranks, cli_progress *prog,
                        qcal_model_calib_report *rep)
{
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    o.profile = sel->profile;
    o.op_types = sel->op_types;
    o.exclude = sel->exclude;
    o.n_exclude = sel->n_exclude;
    o.batch = a->batch;
    o.carry = a->carry;
    o.n_carry = a->ncarry;
    o.rank = rank;
    o.ranks = ranks;
    o.observer_auto = a->observer_auto;
    o.overlap = a->overlap;
    if (a->auto_samples >= 0)
        o.auto_samples = a->auto_samples;
    o.auto_qdq = sel;   /* the candidates at the outputs: the QDQ model this command makes */
    o.progress = prog ? cli_progress_cb : NULL;
    o.progress_user = prog;
    qcal_model_calib *mc = NULL;
    qcal_dataset *ds = NULL;
    const char **optional = NULL;
    int rc = 0;
    qcal_status st = qcal_model_calib_create(e, m, s, &o, &mc);
    if (st < 0) {
        return cli_fail_status(cmd, cli_exit_code(st, a->ncarry ? CLI_AT_MODEL_CARRY
                                                                 : CLI_AT_MODEL_SETUP), st);
    }
    optional = calloc((size_t)a->ncarry + 1, sizeof *optional);
    if (!optional) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto out;
    }
    for (int k = 0; k < a->ncarry; k++) {
        optional[k] = strchr(a->carry[k], '=') + 1;
    }
    int64_t n_in = qcal_model_calib_input_count(mc);
    qcal_engine_io *in = calloc((size_t)n_in + 1, sizeof *in);
    if (!in) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < n_in; i++)
        qcal_model_calib_input(mc, i, &in[i]);
    qcal_dataset_options dopt;
    qcal_dataset_options_default(&dopt);
    dopt.optional = optional;
    dopt.n_optional = a->ncarry;
    st = qcal_dataset_open(a->data, a->inputs, a->ninputs, in, n_in, &dopt, &ds);
    free(in);
    if (st < 0) {
        rc = cli_fail_status(cmd, data_exit(st), st);
        goto out;
    }
    int64_t mine = 0, all = 0, files = qcal_dataset_file_count(ds);
    for (int64_t f = 0; f < files; f++) {
        qcal_dataset_file_info fi;
        if (qcal_dataset_file_get(ds, f, &fi) == QCAL_OK) {
            all += fi.samples;
            mine += f % ranks == rank ? fi.samples : 0;
        }
    }
    if (prog)
        cli_progress_phase(prog, "running", "samples", mine);
    st = qcal_model_calib_feed_dataset(mc, ds);
    if (st >= 0)
        st = qcal_model_calib_finish(mc, rep);
    if (st >= 0 && rep && ranks > 1) {
        /* The summary speaks for the whole run: every rank's files and samples. */
        rep->files = files;
        rep->samples = all;
    }
    if (st < 0) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_MODEL_RUN), st);
    }
out:
    free(optional);
    qcal_dataset_close(&ds);
    qcal_model_calib_destroy(&mc);
    return rc;
}
