/* Options and steps shared by the subcommands that run a model in the engine (`qcal
 * calibrate MODEL.onnx --data`, `qcal qdq MODEL.onnx --data`): the data options, opening
 * ONNX Runtime, and the calibration run with its exit codes. */
#ifndef QCAL_TOOLS_CLI_MODEL_H
#define QCAL_TOOLS_CLI_MODEL_H

#include <stdbool.h>
#include <stdio.h>

#include <qcal/engine.h>
#include <qcal/model_calib.h>
#include <qcal/onnx.h>

#include "cli_common.h"
#include "cli_progress.h"

enum {
    CLI_MODEL_BASE = 3000,
    CLI_MODEL_DATA = CLI_MODEL_BASE, CLI_MODEL_INPUT, CLI_MODEL_BATCH, CLI_MODEL_CARRY,
    CLI_MODEL_ORT_LIB, CLI_MODEL_AUTO_SAMPLES, CLI_MODEL_OVERLAP,
    CLI_MODEL_END
};

/* Rows to put in a subcommand's option table (help texts at column 27). */
#define CLI_MODEL_OPTS                                                                          \
    CLI_OPT("data", 0, CLI_MODEL_DATA, "SPEC",                                                  \
        "calibration data: a directory or a .npy, .npz or .safetensors\n"                       \
        "file of arrays named by model input, batch on axis 0; several\n"                       \
        "files are several batches (docs/data.md)"),                                            \
    CLI_OPT_REPEATED("input", 0, CLI_MODEL_INPUT, "NAME=PATH",                                  \
        "(repeatable) input NAME from PATH (a .npy file, or a directory\n"                      \
        "of them: one batch each)"),                                                            \
    CLI_OPT("batch", 0, CLI_MODEL_BATCH, "N",                                                   \
        "samples per run where the model's first dimension is dynamic\n"                        \
        "(default: as many as keep one run's observed tensors under\n"                          \
        "512 MiB); the ranges do not depend on N"),                                             \
    CLI_OPT_REPEATED("carry", 0, CLI_MODEL_CARRY, "OUT=IN",                                     \
        "(repeatable) output OUT of a run is input IN of the next run\n"                        \
        "of the same data file (recurrent state; zeros, or the file's\n"                        \
        "value, at the start of each file)"),                                                   \
    CLI_OPT("ort-lib", 0, CLI_MODEL_ORT_LIB, "PATH",                                            \
        "ONNX Runtime's libonnxruntime.so.1 (default: $QCAL_ORT_LIB,\n"                         \
        "the loader's path, then the npm cache ./run.sh fills)"),                               \
    CLI_OPT("auto-samples", 0, CLI_MODEL_AUTO_SAMPLES, "N",                                     \
        "--observer auto: run the whole-model candidates against float\n"                       \
        "on the first N samples of the data, one per run (default 64;\n"                        \
        "0: the per-tensor choice only)"),                                                     \
    CLI_FLAG("overlap", 0, CLI_MODEL_OVERLAP,                                                   \
        "observe each run's tensors while the engine computes the next\n"                       \
        "(default: observed before it; up to two runs' tensors in memory;\n"                    \
        "the same table)")

typedef struct cli_model_args {
    const char *data;          /* --data */
    const char **inputs;       /* --input NAME=PATH, in order (argc + 1 slots) */
    int ninputs;
    const char **carry;        /* --carry OUT=IN */
    int ncarry;
    int64_t batch;             /* --batch, 0: automatic */
    const char *ort_lib;       /* --ort-lib */
    bool observer_auto;        /* --observer auto (cli_model_observer_auto) */
    int64_t auto_samples;      /* --auto-samples, -1: not given (the library's default) */
    bool overlap;              /* --overlap */
} cli_model_args;

/* Allocates the lists for argc arguments; 0 or an exit code (reported). */
int cli_model_args_init(const char *cmd, cli_model_args *a, int argc);
void cli_model_args_free(cli_model_args *a);

/* True when some data was asked for (--data or --input). */
bool cli_model_args_given(const cli_model_args *a);

/* Handles id when it is one of CLI_MODEL_OPTS: returns 0 (taken) or an exit code
 * (reported); -1 when id is not one of them. */
int cli_model_opt(const char *cmd, cli_model_args *a, int id, const char *val);

/* Takes `--observer auto` out of the observer options oa (have_obs cleared with it) and sets
 * a->observer_auto: given, or by default (default_auto) when neither an observer option nor
 * a rules file was. auto with --rules or with another observer option is a usage error
 * (reported; its candidates take the default qconfig and bins). 0 or an exit code. */
int cli_model_observer_auto(const char *cmd, cli_model_args *a, cli_observer_args *oa,
                            bool *have_obs, const char *rules_path, bool default_auto);

/* "histogram 40, mse 12, minmax 3" (the kinds rep->chosen counts, most first, ties in kind
 * order) into buf. */
void cli_model_chosen(const qcal_model_calib_report *rep, char *buf, size_t cap);

/* The line naming observer auto's whole-model candidates, their output SQNR and the one
 * chosen ("qcal: CMD: observer auto at the outputs ..."), on f; nothing when none ran. */
void cli_model_auto_line(const char *cmd, const qcal_model_calib_report *rep, FILE *f);

/* Help line of --observer auto for the subcommands that run a model. */
#define CLI_MODEL_AUTO_HELP                                                                     \
    "  --observer auto          choose each tensor's observer: every commuting kind (minmax,\n"   \
    "                           percentile, histogram, mse, entropy) on every tensor, the\n"      \
    "                           model run twice (observe, then the exact SQNR of each\n"          \
    "                           candidate's fake-quant), the highest SQNR wins; then that\n"      \
    "                           choice and each kind on every tensor quantize the model and run\n" \
    "                           against float (--auto-samples): the most samples whose argmax\n"  \
    "                           agrees with float's, then the highest output SQNR (docs/accuracy.md)\n"

/* Folds the model's BatchNormalizations into their Convs (as qdq, onnx-expose and equalize
 * do, so exposed names, tables and Q/DQ placement agree) and notes it on stderr unless
 * quiet. 0 or an exit code (reported). */
int cli_fold_bn(const char *cmd, qcal_onnx_model *m, bool quiet);

/* Raises m to default-domain opset `opset` (13..19; qcal_onnx_upgrade) when it is below, a
 * note per adapted op type unless quiet; a model without a default-domain opset is left
 * alone. 0 or an exit code (3: an opset or op qcal cannot raise; reported). */
int cli_model_raise(const char *cmd, qcal_onnx_model *m, int64_t opset, bool quiet);

/* Loads the model at path, raises an opset 9-12 model to 13 (qcal_onnx_upgrade, a note per
 * adapted op type unless quiet) and folds its BatchNormalizations (cli_fold_bn): what every
 * subcommand that reads a model for quantization starts with. 0 or an exit code. */
int cli_model_load(const char *cmd, const char *path, bool quiet, qcal_onnx_model **out);

/* Opens ONNX Runtime; on failure one line with every place tried, exit QCAL_EXIT_ENGINE. */
int cli_engine_open(const char *cmd, const char *ort_lib, qcal_engine **e);

/* Calibrates m's tensors (selected by sel: profile, op types, exclusions) into s by running
 * it on the data; rank / ranks share the data files. Exit codes: data that does not match
 * the model, malformed files or a model the engine refuses 3; a failure during a run
 * (the engine's, NaN/Inf under --strict, memory) 1; bad --carry 2. */
int cli_model_calibrate(const char *cmd, qcal_engine *e, const qcal_onnx_model *m,
                        const cli_model_args *a, const qcal_onnx_qdq_options *sel,
                        qcal_calib_session *s, int rank, int ranks, cli_progress *prog,
                        qcal_model_calib_report *rep);

#endif
