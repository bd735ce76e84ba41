/* qcal ONNX models: read a model, list the tensors a deployment profile quantizes, expose
 * them as graph outputs (so any engine can dump them for calibration), insert
 * QuantizeLinear/DequantizeLinear nodes from a calibration table, write the result.
 *
 *   qcal_onnx_model *m = NULL;
 *   qcal_onnx_model_load_file("model.onnx", &m);
 *   qcal_onnx_qdq_options opt;
 *   qcal_onnx_qdq_options_default(&opt);                // profile ort
 *   qcal_onnx_qdq_report rep;
 *   qcal_onnx_qdq(m, table, &opt, &rep);               // table: qcal/calib.h
 *   qcal_onnx_model_save_file(m, NULL, "model.qdq.onnx");
 *   qcal_onnx_qdq_report_free(&rep);
 *   qcal_onnx_model_destroy(&m);
 *
 * The model behind the handle is ONNX's ModelProto (onnx.proto, IR 8), read and written
 * with protobuf-c; nothing of it shows here. Names are UTF-8 byte strings, compared as
 * bytes. Built without ONNX support (meson -Donnx=disabled) every function that needs it
 * returns QCAL_ERR_UNSUPPORTED ("qcal was built without ONNX support");
 * qcal_onnx_available() says which. Semantics of the profiles: docs/onnx.md. */
#ifndef QCAL_ONNX_H
#define QCAL_ONNX_H

#include "qcal/calib.h"
#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ONNX TensorProto.DataType numbers (element types) the API names. */
enum {
    QCAL_ONNX_FLOAT = 1,
    QCAL_ONNX_UINT8 = 2,
    QCAL_ONNX_INT8 = 3,
    QCAL_ONNX_INT32 = 6,
    QCAL_ONNX_INT64 = 7,
    QCAL_ONNX_FLOAT16 = 10,
    QCAL_ONNX_DOUBLE = 11,
    QCAL_ONNX_BFLOAT16 = 16,
    QCAL_ONNX_FLOAT8E4M3FN = 17,   /* IR 9 / opset 19 (newer than the onnx.proto built in) */
    QCAL_ONNX_FLOAT8E5M2 = 19,
};

/* Where the Q/DQ nodes go and which integer types they use (docs/onnx.md). */
typedef enum qcal_onnx_profile {
    QCAL_ONNX_PROFILE_ORT = 0,       /* "ort": ONNX Runtime's node units (DQ -> op -> Q) */
    QCAL_ONNX_PROFILE_TENSORRT = 1,  /* "tensorrt": TensorRT 10 explicit quantization */
} qcal_onnx_profile;

typedef struct qcal_onnx_model qcal_onnx_model;

/* True when this libqcal was built with ONNX support (protobuf-c). */
QCAL_API bool qcal_onnx_available(void);

/* Name of a profile ("ort", "tensorrt") or "unknown"; parse accepts those names. */
QCAL_API const char *qcal_onnx_profile_name(qcal_onnx_profile profile);
QCAL_API qcal_status qcal_onnx_profile_parse(const char *name, qcal_onnx_profile *out);

/* ---- Reading and writing ---- */

/* Reads and checks an ONNX model file (*out owned by the caller). Initializers may be in raw
 * or typed fields; external data files are resolved relative to the model's directory and
 * must stay inside it (no absolute path, no "..", no symbolic link leading out). The model
 * file and its data files stay mapped while *out lives (large data is not copied; they must
 * not change meanwhile). Checks: protobuf well-formed (nesting depth <= 64), every node input
 * defined before use (graph inputs, initializers, earlier outputs, outer scopes for If/Loop
 * bodies), no tensor written by two nodes of one graph, initializer data sizes equal to
 * their shapes. Errors: QCAL_ERR_NOT_FOUND /
 * QCAL_ERR_IO (file), QCAL_ERR_FORMAT (malformed; the message says what and where). */
QCAL_API qcal_status qcal_onnx_model_load_file(const char *path, qcal_onnx_model **out);

/* A model from a buffer of len bytes (copied as needed; the caller keeps buf), with the
 * checks of qcal_onnx_model_load_file. A model that refers to external data is
 * QCAL_ERR_UNSUPPORTED here (no directory). */
QCAL_API qcal_status qcal_onnx_model_parse(const void *buf, size_t len, qcal_onnx_model **out);

/* Destroys *m (NULL is fine) and sets *m to NULL. */
QCAL_API void qcal_onnx_model_destroy(qcal_onnx_model **m);

typedef struct qcal_onnx_save_options {
    uint64_t external_threshold;  /* default 2^31 - 2^20: a model whose serialized size
                                   * exceeds this many bytes is saved with external data
                                   * (protobuf messages are limited to 2 GiB) */
    uint64_t external_min_bytes;  /* default 1024: initializers at least this large move to
                                   * the external data file PATH.data; smaller ones stay */
} qcal_onnx_save_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_onnx_save_options_default(qcal_onnx_save_options *opt);

/* Writes m to path atomically (temporary file, then rename; an existing file is untouched
 * on failure), streaming the serialization without a second copy of the model. opt NULL =
 * defaults. With external data, PATH.data is written (atomically) before PATH. m is not
 * const: its large initializers are detached while the call runs and restored before it
 * returns (no other thread may use m meanwhile). */
QCAL_API qcal_status qcal_onnx_model_save_file(qcal_onnx_model *m,
                                               const qcal_onnx_save_options *opt, const char *path);

/* Serializes m into a new buffer (*buf, *len; free with qcal_free). Models of 2 GiB and
 * more are QCAL_ERR_OVERFLOW here (use qcal_onnx_model_save_file). */
QCAL_API qcal_status qcal_onnx_model_serialize(const qcal_onnx_model *m, void **buf, size_t *len);

/* ---- Inspection ---- */

typedef struct qcal_onnx_model_info {
    int64_t ir_version;
    int64_t opset;          /* default-domain ("" or "ai.onnx") opset version, -1 if none */
    int64_t nodes;          /* nodes of the main graph (subgraphs not counted) */
    int64_t initializers;
    int64_t inputs;
    int64_t outputs;
} qcal_onnx_model_info;

/* Fills *info with the model's counts and versions. */
QCAL_API qcal_status qcal_onnx_model_get_info(const qcal_onnx_model *m, qcal_onnx_model_info *info);

/* One node of the main graph; every pointer points into the model (valid until it changes). */
typedef struct qcal_onnx_node_info {
    const char *name;        /* "" when unnamed */
    const char *op_type;
    const char *domain;      /* "" for the default domain */
    int64_t n_inputs, n_outputs;
    const char *const *inputs;   /* "" for an omitted optional input */
    const char *const *outputs;
} qcal_onnx_node_info;

/* Node i (0..nodes-1) of the main graph, in graph order. */
QCAL_API qcal_status qcal_onnx_node_at(const qcal_onnx_model *m, int64_t i, qcal_onnx_node_info *out);

/* Name of graph input / output i (pointing into the model). */
QCAL_API qcal_status qcal_onnx_input_at(const qcal_onnx_model *m, int64_t i, const char **name);
QCAL_API qcal_status qcal_onnx_output_at(const qcal_onnx_model *m, int64_t i, const char **name);

/* Integer attribute of node i (QCAL_ERR_NOT_FOUND when absent). */
QCAL_API qcal_status qcal_onnx_node_attr_int(const qcal_onnx_model *m, int64_t i, const char *attr,
                                             int64_t *value);

/* Type and shape of a tensor. ndim -1: shape unknown; dims[k] -1: dimension k unknown
 * (symbolic); elem_type 0: type unknown. */
typedef struct qcal_onnx_tensor_desc {
    int32_t elem_type;
    int32_t ndim;
    int64_t dims[QCAL_MAX_DIMS];
} qcal_onnx_tensor_desc;

/* What the main graph declares for name (graph inputs, outputs, value_info, initializers, in
 * that order); QCAL_ERR_NOT_FOUND when nothing is declared. More than QCAL_MAX_DIMS
 * dimensions are reported as an unknown shape. */
QCAL_API qcal_status qcal_onnx_tensor_get_desc(const qcal_onnx_model *m, const char *name,
                                               qcal_onnx_tensor_desc *out);

/* Initializer name of the main graph converted to float32 (float32, float16, bfloat16,
 * float64; also the integer types): *data (numel floats, free with qcal_free) and *desc.
 * QCAL_ERR_NOT_FOUND if there is no such initializer. */
QCAL_API qcal_status qcal_onnx_initializer_float(const qcal_onnx_model *m, const char *name,
                                                 float **data, qcal_onnx_tensor_desc *desc);

/* Initializer of an integer type (int8, uint8, int32, int64, ...) as int64 values (*data,
 * free with qcal_free) and *desc. */
QCAL_API qcal_status qcal_onnx_initializer_int64(const qcal_onnx_model *m, const char *name,
                                                 int64_t **data, qcal_onnx_tensor_desc *desc);

/* ---- Builder (tests and examples write models with it) ---- */

/* A new empty model: IR version ir_version (e.g. 8), default-domain opset `opset`, graph
 * "qcal", producer "qcal". *out owned by the caller. */
QCAL_API qcal_status qcal_onnx_model_create(int64_t ir_version, int64_t opset,
                                            qcal_onnx_model **out);

/* Adds a graph input / graph output / value_info entry of element type elem_type. ndim -1:
 * no shape; dims[k] < 0: a symbolic dimension "d<k>" (e.g. the batch). Names are copied. */
QCAL_API qcal_status qcal_onnx_model_add_input(qcal_onnx_model *m, const char *name,
                                               int32_t elem_type, int32_t ndim,
                                               const int64_t *dims);
QCAL_API qcal_status qcal_onnx_model_add_output(qcal_onnx_model *m, const char *name,
                                                int32_t elem_type, int32_t ndim,
                                                const int64_t *dims);
QCAL_API qcal_status qcal_onnx_model_add_value_info(qcal_onnx_model *m, const char *name,
                                                    int32_t elem_type, int32_t ndim,
                                                    const int64_t *dims);

/* Adds an initializer from nbytes of little-endian raw data (copied; NOT checked against the
 * shape, so tests can build malformed models; qcal_onnx_model_load_file checks). */
QCAL_API qcal_status qcal_onnx_model_add_initializer(qcal_onnx_model *m, const char *name,
                                                     int32_t elem_type, int32_t ndim,
                                                     const int64_t *dims, const void *data,
                                                     size_t nbytes);

/* Adds a float32 initializer of the given shape from data (numel floats, copied). */
QCAL_API qcal_status qcal_onnx_model_add_initializer_float(qcal_onnx_model *m, const char *name,
                                                           int32_t ndim, const int64_t *dims,
                                                           const float *data);

/* Adds an int64 initializer (e.g. a Reshape shape) from numel values (copied). */
QCAL_API qcal_status qcal_onnx_model_add_initializer_int64(qcal_onnx_model *m, const char *name,
                                                           int32_t ndim, const int64_t *dims,
                                                           const int64_t *data);

/* Moves initializer name's data to an external file: its raw data is dropped and the
 * tensor points at `location` (relative to the model file), offset, length. The caller
 * writes that file. */
QCAL_API qcal_status qcal_onnx_initializer_set_external(qcal_onnx_model *m, const char *name,
                                                        const char *location, int64_t offset,
                                                        int64_t length);

/* Appends a node to the main graph (default domain; names copied; "" for an omitted
 * optional input); *index (may be NULL) gets its index for the attribute setters. */
QCAL_API qcal_status qcal_onnx_model_add_node(qcal_onnx_model *m, const char *op_type,
                                              const char *name, int64_t n_inputs,
                                              const char *const *inputs,
                                              int64_t n_outputs, const char *const *outputs,
                                              int64_t *index);

/* Sets an attribute of node `node` (int, ints, float, string). */
QCAL_API qcal_status qcal_onnx_node_set_int(qcal_onnx_model *m, int64_t node, const char *attr,
                                            int64_t value);
QCAL_API qcal_status qcal_onnx_node_set_ints(qcal_onnx_model *m, int64_t node, const char *attr,
                                             int64_t n, const int64_t *values);
QCAL_API qcal_status qcal_onnx_node_set_float(qcal_onnx_model *m, int64_t node, const char *attr,
                                              float value);
QCAL_API qcal_status qcal_onnx_node_set_string(qcal_onnx_model *m, int64_t node, const char *attr,
                                               const char *value);

/* Sets a tensor attribute of node `node` (e.g. a Constant's "value"): an unnamed tensor of
 * elem_type and shape dims (ndim values) from nbytes of little-endian raw data (copied). */
QCAL_API qcal_status qcal_onnx_node_set_tensor(qcal_onnx_model *m, int64_t node, const char *attr,
                                               int32_t elem_type, int32_t ndim, const int64_t *dims,
                                               const void *data, size_t nbytes);

/* Sets a graph attribute (If's then_branch/else_branch, Loop's body) of node `node` to the
 * main graph of *body, which is consumed (destroyed, *body set to NULL) on success. */
QCAL_API qcal_status qcal_onnx_node_set_graph(qcal_onnx_model *m, int64_t node, const char *attr,
                                              qcal_onnx_model **body);

/* ---- Older opsets (docs/onnx.md "Older opsets") ---- */

/* What qcal_onnx_upgrade did (free with qcal_onnx_upgrade_report_free). */
typedef struct qcal_onnx_upgrade_report {
    int64_t from, to;     /* default-domain opset before and after (equal: nothing to do) */
    int64_t n_adapted;    /* op types rewritten */
    char **adapted;       /* one "OP: what changed (N nodes)" line per op type */
} qcal_onnx_upgrade_report;

/* Rewrites a model of default-domain opset 9 or newer to mean the same at `opset` (13 to
 * 19; below 13 through 13): the ops whose meaning changed are adapted (docs/onnx.md), the
 * opset import raised to `opset` and the IR version to at least what it needs (7; 8 from
 * opset 15; 9 at 19), main graph and If/Loop/Scan bodies alike; other domains are left
 * alone. A model already at `opset` or newer: unchanged (rep->from == rep->to). An op qcal
 * cannot adapt, or an opset below 9: QCAL_ERR_UNSUPPORTED naming every op at fault, checked
 * before m changes (on failure m is unchanged except after QCAL_ERR_NO_MEMORY). rep may be
 * NULL. */
QCAL_API qcal_status qcal_onnx_upgrade(qcal_onnx_model *m, int64_t opset, qcal_onnx_upgrade_report *rep);

/* Frees the report's lines and zeroes it (NULL is fine). */
QCAL_API void qcal_onnx_upgrade_report_free(qcal_onnx_upgrade_report *rep);

/* ---- Quantization passes ---- */

typedef struct qcal_onnx_qdq_options {
    qcal_onnx_profile profile;         /* default QCAL_ONNX_PROFILE_ORT */
    qcal_observer_kind weight_observer;/* default QCAL_OBSERVER_PER_CHANNEL_MINMAX; any
                                        * per-channel kind (qint8, per_channel_symmetric) */
    const char *const *exclude;        /* default NULL: fnmatch(3) globs (no flags) on node
                                        * names and tensor names; a matching node stays float,
                                        * a matching tensor gets no Q/DQ */
    int64_t n_exclude;                 /* default 0 */
    const char *op_types;              /* default NULL: the profile's list (docs/onnx.md);
                                        * else a comma list of op types to quantize ("Clip":
                                        * profile ort fuses a Clip after a quantized op into
                                        * its output Q, as Relu) */
    bool strict;                       /* default false: wanted tensors missing from the table
                                        * stay float (listed in the report); true: error */
    qcal_qscheme weight_qscheme;       /* default QCAL_PER_CHANNEL_SYMMETRIC; also
                                        * QCAL_PER_TENSOR_AFFINE, QCAL_PER_TENSOR_SYMMETRIC
                                        * (minmax over the whole weight) and
                                        * QCAL_PER_CHANNEL_AFFINE; qint8, integer weights only */
    bool float_weights;                /* default false; true: weights and biases stay float
                                        * initializers without Q/DQ ("activations only") */
} qcal_onnx_qdq_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_onnx_qdq_options_default(qcal_onnx_qdq_options *opt);

/* The activation tensors the profile quantizes, i.e. those whose ranges qcal_onnx_qdq looks
 * up in the table, in graph order: *names (n strings; free with qcal_onnx_names_free). Only
 * float32 tensors that carry data (not constants, not shape arithmetic; docs/onnx.md). */
QCAL_API qcal_status qcal_onnx_list(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt,
                                    char ***names, int64_t *n);

/* The tensors the profile's ops read as activations whose element type the model neither
 * declares nor lets qcal infer: left out of qcal_onnx_list (and of expose and qdq). */
QCAL_API qcal_status qcal_onnx_list_untyped(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt,
                                            char ***names, int64_t *n);

/* Frees a name list of n strings from qcal_onnx_list and sets *names to NULL. */
QCAL_API void qcal_onnx_names_free(char ***names, int64_t n);

/* Makes every tensor of qcal_onnx_list a graph output (type and shape as declared, else
 * float32, as inferred, with the inferred rank); *added (may be NULL) gets how many were
 * not outputs already. */
QCAL_API qcal_status qcal_onnx_expose(qcal_onnx_model *m, const qcal_onnx_qdq_options *opt,
                                      int64_t *added);

/* What qcal_onnx_qdq did (free with qcal_onnx_qdq_report_free). */
typedef struct qcal_onnx_qdq_report {
    int64_t ops;          /* ops quantized */
    int64_t tensors;      /* activation tensors given Q/DQ */
    int64_t weights;      /* weight initializers quantized per channel */
    int64_t biases;       /* biases stored as int32 (profile ort) */
    int64_t n_missing;    /* wanted tensors absent from the table (they stay float) */
    char **missing;       /* their names */
    int64_t n_skipped;    /* ops of a quantized type left float */
    char **skipped;       /* one "NODE (OP): reason" line each */
    int64_t n_quantized;  /* the main graph's quantized ops that have a name */
    char **quantized;     /* their node names, in graph order */
} qcal_onnx_qdq_report;

/* Inserts Q/DQ into m from table (activation entries matched by tensor name; weights from
 * the model's initializers) as opt->profile says (docs/onnx.md). Needs a default-domain
 * opset >= 13 (else QCAL_ERR_UNSUPPORTED; qcal_onnx_upgrade raises opsets 9-12), >= 19 when
 * the table's entries it uses are FP8 (qcal_onnx_upgrade(m, 19, ...) first; `qcal qdq` does
 * that itself). Missing
 * tensors with opt->strict: QCAL_ERR_NOT_FOUND listing them. Every check runs before the model changes: on failure m
 * is unchanged except after QCAL_ERR_NO_MEMORY. rep (may be NULL) is filled on success. */
QCAL_API qcal_status qcal_onnx_qdq(qcal_onnx_model *m, const qcal_calib_table *table,
                                   const qcal_onnx_qdq_options *opt, qcal_onnx_qdq_report *rep);

/* qcal_onnx_qdq with the table of a session (qcal_calib_session_table). */
QCAL_API qcal_status qcal_onnx_qdq_session(qcal_onnx_model *m, qcal_calib_session *s,
                                           const qcal_onnx_qdq_options *opt,
                                           qcal_onnx_qdq_report *rep);

/* qcal_onnx_qdq, then qcal_onnx_model_save_file(m, save, path): the same file, byte for byte.
 * Float32 weights with symmetric schemes (and, profile ort, their int32 biases) are observed
 * and quantized on a second thread while the save writes the model, each before the writer
 * reaches it. On failure nothing is written and the status says what failed: QCAL_ERR_IO
 * or QCAL_ERR_OVERFLOW, the output (m is the quantized model, whole: it may be saved
 * elsewhere); any other, the rewrite: m is unchanged when a check refused (as
 * qcal_onnx_qdq), or, when a weight failed during the save (named in the message), m is
 * quantized without that weight's values: destroy it, do not save it. */
QCAL_API qcal_status qcal_onnx_qdq_save_file(qcal_onnx_model *m, const qcal_calib_table *table,
                                             const qcal_onnx_qdq_options *opt,
                                             const qcal_onnx_save_options *save, const char *path,
                                             qcal_onnx_qdq_report *rep);

/* Frees the report's lists and zeroes it (NULL is fine). */
QCAL_API void qcal_onnx_qdq_report_free(qcal_onnx_qdq_report *rep);

/* ---- Per-op gates (accuracy analysis: docs/accuracy.md) ---- */

/* The bool input [n_ops] of a gated model: gate k true makes op k read its quantized inputs,
 * false its float ones. */
#define QCAL_ONNX_GATES_INPUT "qcal_gates"

/* A quantized op of a gated model. */
typedef struct qcal_onnx_gate_op {
    char *name;        /* the node's name ("" when it has none) */
    char *op_type;
    int64_t node;      /* its index among the QDQ model's nodes */
    int64_t inputs;    /* inputs it reads through DequantizeLinear */
    int64_t fixed;     /* of those, inputs whose float value was not found: always quantized */
} qcal_onnx_gate_op;

/* From the QDQ model q, a new model (*out) in which every op that reads through
 * DequantizeLinear (its `ops`, in node order, then ops whose graph output is written through
 * Q/DQ) switches at run time between the quantized values it reads (gate on: an If whose
 * then-branch is the op after copies of its Q/DQ nodes, bit for bit) and the float ones (off:
 * the op on the tensor before QuantizeLinear, or for weights and biases stored quantized the
 * float tensor that ref's node of the same name reads at that slot; ref may be NULL;
 * docs/accuracy.md). Needs opset >= 13; a model with no such op is QCAL_ERR_EMPTY. */
QCAL_API qcal_status qcal_onnx_gate(const qcal_onnx_model *q, const qcal_onnx_model *ref,
                                    qcal_onnx_model **out, qcal_onnx_gate_op **ops,
                                    int64_t *n_ops);

/* Frees the n ops of qcal_onnx_gate and sets *ops to NULL (NULL is fine). */
QCAL_API void qcal_onnx_gate_ops_free(qcal_onnx_gate_op **ops, int64_t n);


/* ---- Cures before quantization (qcal/ptq.h on the model's weights; docs/onnx.md) ---- */

/* What qcal_onnx_fold_bn did (free with qcal_onnx_fold_report_free). */
typedef struct qcal_onnx_fold_report {
    int64_t n_folded;     /* BatchNormalizations folded into the Conv before them */
    char **folded;        /* one "CONV <- BN" line each (node names, else output names) */
    int64_t n_kept;       /* BatchNormalizations left in place */
    char **kept;          /* one "BN (BatchNormalization): reason" line each */
} qcal_onnx_fold_report;

/* Folds every inference-mode BatchNormalization whose input is a Conv's only reader into
 * that Conv (weights scaled per output channel by scale / sqrt(var + eps), bias (b - mean) *
 * that + shift; a bias initializer is added when the Conv had none); the Conv then writes
 * the BN's output. A model without such a pair is unchanged. rep (may be NULL) is filled. */
QCAL_API qcal_status qcal_onnx_fold_bn(qcal_onnx_model *m, qcal_onnx_fold_report *rep);

/* Frees the report's lists and zeroes it (NULL is fine). */
QCAL_API void qcal_onnx_fold_report_free(qcal_onnx_fold_report *rep);

/* Per-channel weight ranges of one Conv / Gemm (ranges as qcal_ptq_channel_ranges: max |w|). */
typedef struct qcal_onnx_layer_ranges {
    char *node;           /* node name (its first output's name when unnamed) */
    const char *op_type;  /* "Conv" or "Gemm" (static) */
    int64_t channels;     /* output channels */
    int64_t groups;       /* Conv group (depthwise: == channels) */
    float min_range, max_range;
    double ratio;         /* max_range / min_range (+inf when a channel is all zeros) */
} qcal_onnx_layer_ranges;

/* Every Conv / Gemm of the main graph with a float32 weight initializer, in graph order:
 * *out (n entries; free with qcal_onnx_layer_ranges_free). */
QCAL_API qcal_status qcal_onnx_weight_ranges(const qcal_onnx_model *m, qcal_onnx_layer_ranges **out,
                                             int64_t *n);

/* Frees n entries of qcal_onnx_weight_ranges and sets *r to NULL. */
QCAL_API void qcal_onnx_layer_ranges_free(qcal_onnx_layer_ranges **r, int64_t n);

typedef struct qcal_onnx_equalize_options {
    bool fold_bn;                 /* default true: qcal_onnx_fold_bn first */
    bool replace_clip;            /* default true: a Clip(0, M) (ReLU6) between two equalized
                                   * layers becomes Relu (reported; this changes the function
                                   * where a value exceeded M); false: such chains are refused */
    int64_t max_sweeps;           /* default 100: passes over all chains (Nagel et al. iterate
                                   * to convergence); stops when every scale is within 1e-6 of 1 */
    bool equalize;                /* default true; false: only fold and correct biases */
    const char *bias_correction_dump; /* default NULL; a dump directory of MODEL's tensors
                                   * (qcal/calib_dump.h): empirical bias correction of every
                                   * Conv / Gemm whose input is in it (E[x] per channel, axis 1) */
    bool analytic_bias_correction;/* default false: bias correction from the folded BNs'
                                   * statistics for layers after BN -> Relu (exclusive with
                                   * bias_correction_dump) */
    qcal_qconfig weight_qconfig;  /* default qint8 per_channel_symmetric: the weight quantizer
                                   * whose error bias correction removes */
} qcal_onnx_equalize_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_onnx_equalize_options_default(qcal_onnx_equalize_options *opt);

/* What qcal_onnx_equalize did (free with qcal_onnx_equalize_report_free). */
typedef struct qcal_onnx_equalize_report {
    qcal_onnx_fold_report fold;   /* the BN folding */
    int64_t n_pairs;              /* chains equalized */
    char **pairs;                 /* "A -> RELU -> B" each */
    int64_t sweeps;               /* passes made */
    int64_t n_replaced;           /* Clip nodes replaced by Relu */
    char **replaced;              /* "NODE: Clip(0, 6) -> Relu" each */
    int64_t n_refused;            /* chains left alone */
    char **refused;               /* "NODE (OP): reason" each, naming the node at fault */
    int64_t n_corrected;          /* layers whose bias was corrected */
    char **corrected;             /* "NODE: max |shift| X" each */
    int64_t n_layers;             /* weight ranges of every layer: after folding, before CLE */
    qcal_onnx_layer_ranges *before;
    qcal_onnx_layer_ranges *after;/* the same layers at the end (n_layers entries) */
} qcal_onnx_equalize_report;

/* Cross-layer equalization (and optional bias correction) of m in place: finds every chain
 * Conv/Gemm -> Relu (or Clip(0, M)) -> Conv/Gemm whose middle tensors have a single reader
 * and private float32 weights, equalizes each pair (qcal_ptq_equalize_pair, depthwise and
 * grouped convs included), and lists every chain it refuses with the node at fault. The
 * float function is unchanged (Clip replacement aside). On failure m may be half-changed
 * (do not save it). rep (may be NULL) is filled on success. */
QCAL_API qcal_status qcal_onnx_equalize(qcal_onnx_model *m, const qcal_onnx_equalize_options *opt,
                                        qcal_onnx_equalize_report *rep);

/* Frees the report's lists and zeroes it (NULL is fine). */
QCAL_API void qcal_onnx_equalize_report_free(qcal_onnx_equalize_report *rep);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_ONNX_DECLARED
#include "qcal/deprecated.h"
#endif
