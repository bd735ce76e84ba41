/* Options of the accuracy subcommands (tools/cli_accuracy.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_accuracy.h"

void cli_accuracy_args_init(cli_accuracy_args *a)
{
    memset(a, 0, sizeof *a);
    a->sensitivity_samples = -1;
    a->min_sqnr = NAN;
    a->max_drop = NAN;
}

void cli_accuracy_args_free(cli_accuracy_args *a)
{
    qcal_free(a->lab.data);
    a->lab.data = NULL;
}

static int parse_double(const char *cmd, const char *opt, const char *val, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !isfinite(v) || v < lo)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--%s: '%s' is not a number >= %g", opt, val, lo);
    *out = v;
    return 0;
}

int cli_accuracy_opt(const char *cmd, cli_accuracy_args *a, int id, const char *val)
{
    switch (id) {
    case CLI_ACC_LABELS: a->labels = val; return 0;
    case CLI_ACC_METRIC: {
        qcal_accuracy_metric m;
        if (qcal_accuracy_metric_parse(val, &m) != QCAL_OK)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--metric: '%s' is not top1 or exact", val);
        a->metric = val;
        return 0;
    }
    case CLI_ACC_SENS: {
        double v = 0;
        int rc = parse_double(cmd, "sensitivity-samples", val, 0, &v);
        if (rc)
            return rc;
        if (v != floor(v) || v > 1e12)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--sensitivity-samples: '%s' is not a whole number", val);
        a->sensitivity_samples = (int64_t)v;
        return 0;
    }
    case CLI_ACC_MIN_SQNR: return parse_double(cmd, "min-output-sqnr", val, -1e9, &a->min_sqnr);
    case CLI_ACC_MAX_DROP: return parse_double(cmd, "max-drop", val, 0, &a->max_drop);
    case CLI_ACC_EVAL_DATA: a->eval_data = val; return 0;
    default: return -1;
    }
}

bool cli_keep_float_given(const cli_accuracy_args *a)
{
    return !isnan(a->min_sqnr) || !isnan(a->max_drop);
}

int cli_accuracy_options(const char *cmd, cli_accuracy_args *a, int64_t batch, qcal_accuracy_options *o)
{
    qcal_accuracy_options_default(o);
    if (batch > 0)
        o->batch = batch;
    if (a->sensitivity_samples >= 0)
        o->sensitivity_samples = a->sensitivity_samples;
    if (a->metric)
        qcal_accuracy_metric_parse(a->metric, &o->metric);
    if (!isnan(a->max_drop) && !a->labels)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--max-drop needs --labels (the metric's right answers)");
    if (a->metric && !a->labels)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--metric goes with --labels");
    if (!a->labels)
        return 0;
    int rc = cli_read_npy(cmd, a->labels, &a->lab);
    if (rc)
        return rc;
    if (a->lab.dtype != QCAL_NPY_I64 && a->lab.dtype != QCAL_NPY_I32)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "%s: labels must be int64 or int32, not %s", a->labels,
                        qcal_npy_dtype_name(a->lab.dtype));
    if (a->lab.ndim < 1)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "%s: labels need one row per sample (a 0-d array)", a->labels);
    memset(&a->labv, 0, sizeof a->labv);
    a->labv.name = "labels";
    a->labv.elem_type = a->lab.dtype == QCAL_NPY_I64 ? 7 : 6;
    a->labv.ndim = a->lab.ndim;
    for (int32_t d = 0; d < a->lab.ndim; d++)
        a->labv.dims[d] = a->lab.shape[d];
    a->labv.data = a->lab.data;
    a->labv.nbytes = a->lab.nbytes;
    o->labels = &a->labv;
    return 0;
}
