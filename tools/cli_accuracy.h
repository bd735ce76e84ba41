/* Options shared by the subcommands that judge a quantized model at its outputs (`qcal
 * compare`, `qcal qdq --min-output-sqnr / --max-drop`): labels, the metric, the per-op
 * sample count, the keep-float targets (qcal/accuracy.h, docs/accuracy.md). */
#ifndef QCAL_TOOLS_CLI_ACCURACY_H
#define QCAL_TOOLS_CLI_ACCURACY_H

#include <stdbool.h>

#include <qcal/accuracy.h>
#include <qcal/npy.h>

#include "cli_common.h"
#include "cli_dispatch.h"

enum {
    CLI_ACC_BASE = 3100,
    CLI_ACC_LABELS = CLI_ACC_BASE, CLI_ACC_METRIC, CLI_ACC_SENS, CLI_ACC_MIN_SQNR, CLI_ACC_MAX_DROP,
    CLI_ACC_EVAL_DATA, CLI_ACC_END
};

/* Rows for a subcommand's option table: what `qcal compare` and `qcal qdq` share. */
#define CLI_ACCURACY_OPTS                                                                       \
    CLI_OPT("labels", 0, CLI_ACC_LABELS, "L.npy",                                               \
        "integer labels (int64/int32), one row per sample in data order,\n"                     \
        "for the first output: accuracy of float and quantized"),                               \
    CLI_OPT("metric", 0, CLI_ACC_METRIC, "M",                                                   \
        "top1 (default: argmax over the last axis, per position) or\n"                          \
        "exact (a sample counts when all its positions are right)"),                            \
    CLI_OPT("sensitivity-samples", 0, CLI_ACC_SENS, "N",                                        \
        "samples of the per-op runs (default 8; the first ones)")

/* Rows of the keep-float search (`qcal qdq`). */
#define CLI_KEEP_FLOAT_OPTS                                                                     \
    CLI_OPT("min-output-sqnr", 0, CLI_ACC_MIN_SQNR, "DB",                                       \
        "keep the most sensitive ops float, fewest first, until the\n"                          \
        "SQNR over the model's float outputs reaches DB"),                                      \
    CLI_OPT("max-drop", 0, CLI_ACC_MAX_DROP, "POINTS",                                          \
        "... until float's metric (--labels, --metric) minus the\n"                             \
        "quantized model's is at most POINTS"),                                                 \
    CLI_OPT("eval-data", 0, CLI_ACC_EVAL_DATA, "SPEC",                                          \
        "data the target is judged on (default: --data)")

typedef struct cli_accuracy_args {
    const char *labels, *metric, *eval_data;
    int64_t sensitivity_samples;   /* -1: not given */
    double min_sqnr, max_drop;     /* NaN: not given */
    qcal_npy_array lab;            /* loaded by cli_accuracy_options */
    qcal_engine_value labv;
} cli_accuracy_args;

void cli_accuracy_args_init(cli_accuracy_args *a);
void cli_accuracy_args_free(cli_accuracy_args *a);

/* Handles id when it is one of the rows above: 0 (taken) or an exit code (reported); -1
 * when id is not one of them. */
int cli_accuracy_opt(const char *cmd, cli_accuracy_args *a, int id, const char *val);

/* True when a keep-float target was given. */
bool cli_keep_float_given(const cli_accuracy_args *a);

/* Fills o from a (defaults first), loading the labels: 0 or an exit code (reported). */
int cli_accuracy_options(const char *cmd, cli_accuracy_args *a, int64_t batch, qcal_accuracy_options *o);

#endif
