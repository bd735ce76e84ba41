/* qcal_onnx_upgrade: a model at default-domain opset 9-18 rewritten to mean the same at
 * opset 13..19 (docs/onnx.md "Older opsets"), in two steps: below 13 to 13, then 13 (or the
 * model's opset) to the target.
 *
 * Which schema version of an op a model runs comes from onnx/opset_table.h (generated from
 * onnx.defs by tests/ref/gen_opset_table.py, opsets 18 and 19 hand-written from the ONNX
 * Changelog). An op whose version at the model's opset is the one of the target is
 * unchanged. Otherwise the op is either in `compatible` (step 1) or `compatible19` (step 2)
 * below (every version change in between only added types, attributes whose default is the
 * old behaviour, or relaxed inputs such as negative axes: ONNX Changelog), or adapted by a
 * rewrite of its own (`classify13`, `classify19`), or refused. Every node is classified for
 * both steps (main graph and If/Loop/Scan bodies) before the model changes; a refusal names
 * every op at fault in one message. Nodes of other domains are left alone (the default
 * opset does not bind them). */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"
#include "opset_table.h"

#define OOM() qcal_error(QCAL_ERR_NO_MEMORY, "out of memory")
#define STEP1 13      /* the first step's target (and the oldest target) */
#define NEWEST 19     /* the newest target: opset_table.h knows versions up to 19 */

/* Ops whose every schema version from `from` (the version a model at opset 9-12 can run) to
 * opset 13's has the same meaning; the Changelog's change of each step in the comment. */
static const struct {
    const char *op;
    int from;            /* oldest version the entry covers */
} compatible[] = {
    { "Abs", 6 },                      /* 13: bfloat16 */
    { "Add", 7 },                      /* 13: bfloat16 */
    { "ArgMax", 1 },                   /* 11: negative axis; 12: select_last_index (default 0); 13: bfloat16 */
    { "ArgMin", 1 },                   /* same as ArgMax */
    { "AveragePool", 7 },              /* 10: ceil_mode (default 0); 11: pads/auto_pad text clarified */
    { "Cast", 9 },                     /* 13: bfloat16, string conversions described */
    { "Ceil", 6 },                     /* 13: bfloat16 */
    { "Clip", 11 },                    /* 12: integer types; 13: bfloat16 (Clip-6 is adapted) */
    { "Compress", 9 },                 /* 11: negative axis */
    { "Concat", 4 },                   /* 11: negative axis; 13: bfloat16 */
    { "Constant", 9 },                 /* 11: sparse_value; 12: value_* attributes; 13: bfloat16 */
    { "Conv", 1 },                     /* 11: kernel_shape inferred from W, text */
    { "ConvTranspose", 1 },            /* 11: output_padding / auto_pad text (ONNX Runtime: one kernel for 1-11) */
    { "DepthToSpace", 1 },             /* 11: mode (default DCR, the old layout); 13: bfloat16 */
    { "DequantizeLinear", 10 },        /* 13: axis (per-axis scales; scalar scales as before) */
    { "Div", 7 },                      /* 13: bfloat16 */
    { "Dropout", 12 },                 /* 13: bfloat16 (Dropout-7/10 are adapted) */
    { "Equal", 7 },                    /* 11: more types; 13: bfloat16 */
    { "Erf", 9 },                      /* 13: bfloat16 */
    { "Exp", 6 },                      /* 13: bfloat16 */
    { "Expand", 8 },                   /* 13: bfloat16 */
    { "Flatten", 9 },                  /* 11: negative axis; 13: bfloat16 */
    { "Floor", 6 },                    /* 13: bfloat16 */
    { "Gather", 1 },                   /* 11: negative indices; 13: bfloat16 */
    { "GatherElements", 11 },          /* 13: bfloat16 */
    { "GatherND", 11 },                /* 12: batch_dims (default 0); 13: bfloat16 */
    { "Gemm", 9 },                     /* 11: C optional; 13: bfloat16 */
    { "Greater", 9 },                  /* 13: bfloat16 */
    { "Identity", 1 },                 /* 13: bfloat16 */
    { "If", 1 },                       /* 11: branch output shapes may differ; 13: bfloat16 */
    { "IsNaN", 9 },                    /* 13: bfloat16 */
    { "LRN", 1 },                      /* 13: bfloat16 */
    { "Less", 9 },                     /* 13: bfloat16 */
    { "Log", 6 },                      /* 13: bfloat16 */
    { "Loop", 1 },                     /* 11: scan output shapes relaxed; 13: sequence types */
    { "LpPool", 2 },                   /* 11: auto_pad text */
    { "MatMul", 9 },                   /* 13: bfloat16 */
    { "Max", 8 },                      /* 12: integer types; 13: bfloat16 */
    { "MaxPool", 8 },                  /* 10: ceil_mode, dilations (defaults: the old behaviour); 11: text; 12: int8 */
    { "MaxUnpool", 9 },                /* 11: output_shape text */
    { "Mean", 8 },                     /* 13: bfloat16 */
    { "MeanVarianceNormalization", 9 },/* 13: bfloat16 */
    { "Min", 8 },                      /* 12: integer types; 13: bfloat16 */
    { "Mod", 10 },                     /* 13: bfloat16 */
    { "Mul", 7 },                      /* 13: bfloat16 */
    { "Neg", 6 },                      /* 13: bfloat16 */
    { "NegativeLogLikelihoodLoss", 12 }, /* 13: bfloat16 */
    { "NonMaxSuppression", 10 },       /* 11: text */
    { "NonZero", 9 },                  /* 13: bfloat16 */
    { "Pad", 11 },                     /* 13: bfloat16 (Pad-2 is adapted) */
    { "Pow", 7 },                      /* 12: exponent type of its own; 13: bfloat16 */
    { "QuantizeLinear", 10 },          /* 13: axis (per-axis scales; scalar scales as before) */
    { "ReduceL1", 1 },                 /* 11: negative axes; 13: bfloat16 (axes stay attributes until 18) */
    { "ReduceL2", 1 },
    { "ReduceLogSum", 1 },
    { "ReduceLogSumExp", 1 },
    { "ReduceMax", 1 },                /* 12: int8/uint8 */
    { "ReduceMean", 1 },
    { "ReduceMin", 1 },                /* 12: int8/uint8 */
    { "ReduceProd", 1 },
    { "ReduceSumSquare", 1 },
    { "Relu", 6 },                     /* 13: bfloat16 */
    { "Reshape", 5 },                  /* 13: bfloat16 */
    { "Resize", 11 },                  /* 13: roi optional, bfloat16 (Resize-10 is adapted) */
    { "Scan", 9 },                     /* 11: negative axes */
    { "ScatterElements", 11 },         /* 13: bfloat16 */
    { "ScatterND", 11 },               /* 13: bfloat16 */
    { "Shape", 1 },                    /* 13: bfloat16 */
    { "Sigmoid", 6 },                  /* 13: bfloat16 */
    { "Sign", 9 },                     /* 13: bfloat16 */
    { "Size", 1 },                     /* 13: bfloat16 */
    { "Slice", 10 },                   /* 11: negative axes; 13: bfloat16 (Slice-1 is adapted) */
    { "SoftmaxCrossEntropyLoss", 12 }, /* 13: bfloat16 */
    { "SpaceToDepth", 1 },             /* 13: bfloat16 */
    { "Sqrt", 6 },                     /* 13: bfloat16 */
    { "Sub", 7 },                      /* 13: bfloat16 */
    { "Sum", 8 },                      /* 13: bfloat16 */
    { "Tanh", 6 },                     /* 13: bfloat16 */
    { "Tile", 6 },                     /* 13: bfloat16 */
    { "TopK", 10 },                    /* 11: largest, sorted (default 1: the old behaviour), negative axis (TopK-1 is adapted) */
    { "Transpose", 1 },                /* 13: bfloat16 */
};

/* Step 2 (opset 13..18 to 14..19): ops whose every schema version from `from` (the version
 * opset 13 or the model's opset runs) to opset 19's has the same meaning; the change of each
 * step in the comment (ONNX Changelog: versions 14-17 as onnx 1.12's schemas give them,
 * 18 and 19 from docs/Changelog.md). Types added are compatible: a model typed for the older
 * version stays valid. Ops that a version in between changed otherwise are adapted or
 * refused in classify19. */
static const struct {
    const char *op;
    int from;
} compatible19[] = {
    { "Add", 13 },                     /* 14: int8/int16/uint8/uint16 */
    { "AveragePool", 11 },             /* 19: dilations (default 1: the old behaviour) */
    { "BatchNormalization", 14 },      /* 15: scale/B and mean/var types of their own (9 -> 14: classify19) */
    { "Cast", 13 },                    /* 19: float8 types; saturate acts on float8 targets only */
    { "CastLike", 15 },                /* 19: as Cast */
    { "Constant", 13 },                /* 19: float8 types */
    { "CumSum", 11 },                  /* 14: float16, bfloat16 */
    { "DequantizeLinear", 13 },        /* 19: float8 types, float16/bfloat16 scales */
    { "Div", 13 },                     /* 14: int8/int16/uint8/uint16 */
    { "Equal", 13 },                   /* 19: string */
    { "GRU", 7 },                      /* 14: layout (default 0: the old layout) */
    { "GreaterOrEqual", 12 },          /* 16: bfloat16 */
    { "Identity", 13 },                /* 14: sequences; 16: optionals; 19: float8 */
    { "If", 13 },                      /* 16: optionals; 19: float8 */
    { "LSTM", 7 },                     /* 14: layout (default 0) */
    { "LeakyRelu", 6 },                /* 16: bfloat16 */
    { "LessOrEqual", 12 },             /* 16: bfloat16 */
    { "Loop", 13 },                    /* 16: optionals; 19: float8 */
    { "LpPool", 11 },                  /* 18: ceil_mode (default 0), dilations (default 1) */
    { "Mul", 13 },                     /* 14: int8/int16/uint8/uint16 */
    { "OptionalGetElement", 15 },      /* 18: tensor and sequence inputs as well */
    { "OptionalHasElement", 15 },      /* 18: tensor and sequence inputs, input optional */
    { "PRelu", 9 },                    /* 16: bfloat16 */
    { "Pad", 13 },                     /* 18: axes input (optional: all axes); 19: wrap mode */
    { "Pow", 13 },                     /* 15: bfloat16 exponent */
    { "QuantizeLinear", 13 },          /* 19: float8 types (saturate: float8 only), float16/bfloat16 */
    { "RNN", 7 },                      /* 14: layout (default 0) */
    { "Relu", 13 },                    /* 14: signed integer types */
    { "Reshape", 13 },                 /* 14: allowzero (default 0: the old behaviour); 19: float8 */
    { "Resize", 13 },                  /* 18: antialias (0), axes (all), keep_aspect_ratio_policy (stretch),
                                        * tf_half_pixel_for_nn gone (classify19); 19: half_pixel_symmetric */
    { "Scan", 11 },                    /* 16: bfloat16; 19: float8 */
    { "ScatterElements", 13 },         /* 16: reduction (default none: the old behaviour); 18: max/min */
    { "ScatterND", 13 },               /* as ScatterElements */
    { "Shape", 13 },                   /* 15: start/end (defaults: the whole shape); 19: float8 */
    { "Size", 13 },                    /* 19: float8 */
    { "Sub", 13 },                     /* 14: int8/int16/uint8/uint16 */
    { "Where", 9 },                    /* 16: bfloat16 */
};

/* What happens to a node. */
enum {
    A_KEEP = 0,
    A_SOFTMAX_AXIS,      /* Softmax/LogSoftmax/Hardmax < 13, axis = last: axis set explicitly */
    A_SOFTMAX_FLATTEN,   /* ... otherwise Flatten -> op(axis -1) -> Reshape(Shape) */
    A_AXES_INPUT,        /* Squeeze/Unsqueeze/ReduceSum < 13: axes attribute -> input 1 */
    A_SPLIT_INPUT,       /* Split < 13: split attribute -> input 1 */
    A_CLIP_INPUTS,       /* Clip-6: min/max attributes -> inputs 1, 2 */
    A_RESIZE,            /* Upsample-9/10, Resize-10 -> Resize-13 (nearest_mode floor if nearest) */
    A_RESIZE_CEIL,       /* Resize-10 nearest downsampling -> Resize-13, nearest_mode ceil */
    A_SLICE_INPUTS,      /* Slice-1: starts/ends/axes attributes -> inputs */
    A_PAD_INPUTS,        /* Pad-2: pads/value attributes -> inputs */
    A_DROPOUT_IDENTITY,  /* Dropout-7/10 with its mask unread -> Identity */
    A_TOPK_INPUT,        /* TopK-1: k attribute -> input */
    A_SCATTER,           /* Scatter -> ScatterElements */
    A_SPLIT_NUM_OUTPUTS, /* Split < 18 without split sizes: num_outputs = its number of outputs */
    A_ROIALIGN_MODE,     /* RoiAlign-10 -> 16: coordinate_transformation_mode output_half_pixel */
    A_N
};

static const char *const action_text[A_N] = {
    [A_SOFTMAX_AXIS] = "2-D coercion at axis -> one axis: axis (the last) set explicitly",
    [A_SOFTMAX_FLATTEN] = "2-D coercion at axis -> Flatten(axis) -> op(axis -1) -> Reshape to Shape(input)",
    [A_AXES_INPUT] = "axes attribute -> int64 input",
    [A_SPLIT_INPUT] = "split attribute -> int64 input",
    [A_CLIP_INPUTS] = "min/max attributes -> scalar inputs",
    [A_RESIZE] = "-> Resize-13 (roi empty; coordinate_transformation_mode asymmetric; nearest: nearest_mode floor)",
    [A_RESIZE_CEIL] = "-> Resize-13 (roi empty; coordinate_transformation_mode asymmetric; nearest downsampling: nearest_mode ceil)",
    [A_SLICE_INPUTS] = "starts/ends/axes attributes -> int64 inputs",
    [A_PAD_INPUTS] = "pads/value attributes -> inputs",
    [A_DROPOUT_IDENTITY] = "-> Identity (inference; mask output unread)",
    [A_TOPK_INPUT] = "k attribute -> int64 input",
    [A_SCATTER] = "-> ScatterElements (same semantics)",
    [A_SPLIT_NUM_OUTPUTS] = "equal split: num_outputs set to the number of outputs",
    [A_ROIALIGN_MODE] = "coordinate_transformation_mode output_half_pixel (RoiAlign-10's) set explicitly",
};

typedef struct tally {
    char *op;            /* owned */
    char *why;           /* refusal reason (static) or NULL */
    int64_t count[A_N];
    int64_t refused;
} tally;

typedef struct up_ctx {
    qcal_onnx_model *m;
    int64_t orig;        /* the model's opset */
    int64_t to;          /* the target opset (13..19) */
    int step;            /* 1: orig -> 13; 2: max(orig, 13) -> to */
    bool step1_done;     /* step 2 classifies the graph step 1 rewrote (else: maps its ops) */
    onnx_map names;      /* every name of the model (tensors, nodes): fresh names avoid them */
    onnx_map read;       /* tensors some node reads or a graph outputs */
    char **owned;        /* strings the maps point at that we made */
    size_t nowned;
    tally *t;
    size_t nt;
    qcal_status st;
} up_ctx;

static int since_at(const struct onnx_op_versions *e, int64_t opset)
{
    int v = -1;
    for (int k = 0; k < 8 && e->since[k]; k++)
        if (e->since[k] <= opset)
            v = e->since[k];
    return v;
}

static const struct onnx_op_versions *op_entry(const char *op)
{
    size_t lo = 0, hi = sizeof onnx_op_versions / sizeof onnx_op_versions[0];
    while (lo < hi) {   /* sorted by name (the generator sorts) */
        size_t mid = (lo + hi) / 2;
        int c = strcmp(op, onnx_op_versions[mid].op);
        if (!c)
            return &onnx_op_versions[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

static bool default_domain(const Onnx__NodeProto *n)
{
    return !n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx");
}

static tally *tally_of(up_ctx *c, const char *op)
{
    for (size_t i = 0; i < c->nt; i++)
        if (!strcmp(c->t[i].op, op))
            return &c->t[i];
    tally *t = realloc(c->t, (c->nt + 1) * sizeof *t);
    if (!t)
        return NULL;
    c->t = t;
    t = &c->t[c->nt];
    memset(t, 0, sizeof *t);
    if (!(t->op = qcal_strdup(op)))
        return NULL;
    c->nt++;
    return t;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

static bool attr_is(const Onnx__NodeProto *n, const char *name, const char *value, bool dflt)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    if (!a || !a->has_s)
        return dflt;
    return a->s.len == strlen(value) && !memcmp(a->s.data, value, a->s.len);
}

static bool is_output(const Onnx__NodeProto *n, size_t k)
{
    return k < n->n_output && n->output[k] && n->output[k][0];
}

/* Element type declared for name in g (0 when not declared). */
static int32_t elem_type(const Onnx__GraphProto *g, const char *name)
{
    qcal_onnx_tensor_desc d;
    return onnx_graph_desc(g, name, &d) ? d.elem_type : 0;
}

/* Values of a float32 constant of g (initializer or Constant node output): *n values into
 * v[0..cap); false when not a constant of that kind. */
static bool const_floats(const Onnx__GraphProto *g, const char *name, float *v, int64_t cap, int64_t *n)
{
    const Onnx__TensorProto *t = NULL;
    for (size_t i = 0; i < g->n_initializer && !t; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name))
            t = g->initializer[i];
    for (size_t i = 0; i < g->n_node && !t; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        if (nd->op_type && !strcmp(nd->op_type, "Constant") && nd->n_output == 1 && !strcmp(nd->output[0], name)) {
            const Onnx__AttributeProto *a = onnx_node_attr(nd, "value");
            if (!a || !a->t)
                return false;
            t = a->t;
        }
    }
    if (!t || !t->has_data_type || t->data_type != QCAL_ONNX_FLOAT)
        return false;
    float *f = NULL;
    int64_t k = 0;
    if (onnx_tensor_to_float(t, &f, &k) != QCAL_OK || k > cap) {
        free(f);
        return false;
    }
    memcpy(v, f, (size_t)k * sizeof *v);
    free(f);
    *n = k;
    return true;
}

/* Resize-10 / Upsample: the nearest_mode of ONNX Runtime's opset-10 kernel (x_original =
 * x_resized / scale; truncated when upsampling, rounded up when downsampling, per axis): "floor"
 * or "ceil" when every axis agrees (scale 1 axes take either), NULL when they do not or the
 * scales are unknown. (Upsample requires scales >= 1: floor.) */
static const char *resize_nearest_mode(const Onnx__GraphProto *g, const Onnx__NodeProto *n)
{
    float s[QCAL_MAX_DIMS * 2];
    int64_t k = 0;
    if (n->n_input < 2 || !const_floats(g, n->input[1], s, QCAL_MAX_DIMS * 2, &k))
        return NULL;
    bool up = false, down = false;
    for (int64_t i = 0; i < k; i++) {
        up |= s[i] > 1.0f;
        down |= s[i] < 1.0f;
    }
    return up && down ? NULL : down ? "ceil" : "floor";
}

/* Step 1: the action for node n of graph g (model's opset below 13 -> 13); *why a static
 * reason when refused (return -1). */
static int classify13(up_ctx *c, const Onnx__GraphProto *g, const Onnx__NodeProto *n, const char **why)
{
    const char *op = n->op_type ? n->op_type : "";
    const struct onnx_op_versions *e = op_entry(op);
    *why = NULL;
    if (!e) {
        *why = "not an ONNX op qcal knows";
        return -1;
    }
    int vf = since_at(e, c->orig), vt = since_at(e, STEP1);
    if (vf < 0) {
        *why = "not an op of the model's opset";
        return -1;
    }
    if (!strcmp(op, "Upsample")) {
        if (!attr_is(n, "mode", "nearest", true) && !attr_is(n, "mode", "linear", false)) {
            *why = "mode neither nearest nor linear";
            return -1;
        }
        return A_RESIZE;
    }
    if (!strcmp(op, "Scatter"))
        return A_SCATTER;
    if (vf == vt && !e->deprecated)
        return A_KEEP;
    for (size_t i = 0; i < sizeof compatible / sizeof compatible[0]; i++)
        if (!strcmp(op, compatible[i].op) && vf >= compatible[i].from)
            return A_KEEP;
    if (!strcmp(op, "Softmax") || !strcmp(op, "LogSoftmax") || !strcmp(op, "Hardmax")) {
        qcal_onnx_tensor_desc d;
        int64_t axis = attr_int(n, "axis", 1);
        if (n->n_input >= 1 && onnx_graph_desc(g, n->input[0], &d) && d.ndim > 0) {
            if (axis < 0)
                axis += d.ndim;
            if (axis == d.ndim - 1)
                return A_SOFTMAX_AXIS;
        }
        return A_SOFTMAX_FLATTEN;
    }
    if (!strcmp(op, "Squeeze") || !strcmp(op, "Unsqueeze") || !strcmp(op, "ReduceSum"))
        return onnx_node_attr(n, "axes") ? A_AXES_INPUT : A_KEEP;
    if (!strcmp(op, "Split"))
        return onnx_node_attr(n, "split") ? A_SPLIT_INPUT : A_KEEP;
    if (!strcmp(op, "Clip") && vf == 6) {
        int32_t t = n->n_input ? elem_type(g, n->input[0]) : 0;
        if (t && t != QCAL_ONNX_FLOAT && t != QCAL_ONNX_DOUBLE) {
            *why = "input neither float32 nor float64";
            return -1;
        }
        return A_CLIP_INPUTS;
    }
    if (!strcmp(op, "Resize") && vf == 10) {
        if (!attr_is(n, "mode", "nearest", true) && !attr_is(n, "mode", "linear", false)) {
            *why = "mode neither nearest nor linear";
            return -1;
        }
        if (!attr_is(n, "mode", "nearest", true))
            return A_RESIZE;
        const char *nm = resize_nearest_mode(g, n);
        if (!nm) {
            *why = "nearest mode with scales that are not a float32 constant all >= 1 or all <= 1";
            return -1;
        }
        return nm[0] == 'c' ? A_RESIZE_CEIL : A_RESIZE;
    }
    if (!strcmp(op, "Slice") && vf == 1)
        return A_SLICE_INPUTS;
    if (!strcmp(op, "Pad") && vf == 2) {
        int32_t t = n->n_input ? elem_type(g, n->input[0]) : 0;
        if (t && t != QCAL_ONNX_FLOAT && t != QCAL_ONNX_DOUBLE) {
            *why = "input neither float32 nor float64";
            return -1;
        }
        return A_PAD_INPUTS;
    }
    if (!strcmp(op, "Dropout") && (vf == 7 || vf == 10)) {
        for (size_t k = 1; k < n->n_output; k++)
            if (is_output(n, k) && onnx_map_get(&c->read, n->output[k])) {
                *why = "its mask output is read";
                return -1;
            }
        return A_DROPOUT_IDENTITY;
    }
    if (!strcmp(op, "TopK") && vf == 1)
        return A_TOPK_INPUT;
    if (!strcmp(op, "OneHot"))
        *why = "negative indices count from the end since OneHot-11";
    return -1;
}

static bool is_reduce18(const char *op)
{
    static const char *const ops[] = { "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
                                       "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSumSquare" };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(op, ops[i]))
            return true;
    return false;
}

/* Step 2: the action for node n (op type op: n's, or what step 1 makes of it) going from
 * opset max(model's, 13) to c->to. */
static int classify19(up_ctx *c, const Onnx__NodeProto *n, const char *op, const char **why)
{
    const struct onnx_op_versions *e = op_entry(op);
    *why = NULL;
    if (!e) {
        *why = "not an ONNX op qcal knows";
        return -1;
    }
    int64_t from = c->orig > STEP1 ? c->orig : STEP1;
    int vf = since_at(e, from), vt = since_at(e, c->to);
    if (vf < 0) {
        *why = "not an op of the model's opset";
        return -1;
    }
    if (vf == vt && !e->deprecated)
        return A_KEEP;
    if (e->deprecated && e->deprecated <= c->to) {
        *why = "deprecated: no meaning at the target opset";
        return -1;
    }
    /* Reduce*-18: the axes attribute became input 1 (absent: every axis, as before) */
    if (is_reduce18(op) && vf < 18 && vt >= 18)
        return onnx_node_attr(n, "axes") ? A_AXES_INPUT : A_KEEP;
    /* Split-18: no split sizes means num_outputs (which 18 expects when split is absent) */
    if (!strcmp(op, "Split") && vf < 18 && vt >= 18) {
        bool sizes = onnx_node_attr(n, "split") || (n->n_input > 1 && n->input[1] && n->input[1][0]);
        return sizes ? A_KEEP : A_SPLIT_NUM_OUTPUTS;
    }
    /* RoiAlign-16: coordinate_transformation_mode, default half_pixel; RoiAlign-10 computed
     * output_half_pixel (no half-pixel offset) */
    if (!strcmp(op, "RoiAlign") && vf < 16 && vt >= 16)
        return onnx_node_attr(n, "coordinate_transformation_mode") ? A_KEEP : A_ROIALIGN_MODE;
    /* BatchNormalization-14: training_mode (default 0); the optional outputs of 9 (mean, var,
     * saved_mean, saved_var: training) became running_mean/running_var of training mode */
    if (!strcmp(op, "BatchNormalization") && vf < 14 && vt >= 14) {
        for (size_t k = 1; k < n->n_output; k++)
            if (is_output(n, k)) {
                *why = "its training outputs (mean, var, saved_mean, saved_var) changed meaning in BatchNormalization-14";
                return -1;
            }
        return A_KEEP;
    }
    /* Resize-18 dropped coordinate_transformation_mode tf_half_pixel_for_nn */
    if (!strcmp(op, "Resize") && vt >= 18 && attr_is(n, "coordinate_transformation_mode", "tf_half_pixel_for_nn", false)) {
        *why = "coordinate_transformation_mode tf_half_pixel_for_nn is not in Resize-18";
        return -1;
    }
    for (size_t i = 0; i < sizeof compatible19 / sizeof compatible19[0]; i++)
        if (!strcmp(op, compatible19[i].op) && vf >= compatible19[i].from)
            return A_KEEP;
    *why = "a newer version whose meaning qcal has not verified";
    return -1;
}

/* The action of the current step for node n of graph g; *why a static reason when refused
 * (return -1). Step 2 before step 1 ran classifies n as step 1 will leave it (an op step 1
 * refuses is counted there only). */
static int classify(up_ctx *c, const Onnx__GraphProto *g, const Onnx__NodeProto *n, const char **why)
{
    if (c->step == 1)
        return classify13(c, g, n, why);
    const char *op = n->op_type ? n->op_type : "";
    if (c->orig < STEP1 && !c->step1_done) {
        const char *w1;
        int a1 = classify13(c, g, n, &w1);
        if (a1 < 0) {
            *why = NULL;
            return A_KEEP;
        }
        if (a1 == A_RESIZE || a1 == A_RESIZE_CEIL)
            op = "Resize";
        else if (a1 == A_SCATTER)
            op = "ScatterElements";
        else if (a1 == A_DROPOUT_IDENTITY)
            op = "Identity";
    }
    return classify19(c, n, op, why);
}

/* ---- names ---- */

static bool keep_str(up_ctx *c, char *s)
{
    if (!s || !onnx_push((void ***)&c->owned, &c->nowned, s)) {
        free(s);
        return false;
    }
    return true;
}

static void collect_graph(up_ctx *c, const Onnx__GraphProto *g)
{
#define PUT(map, s)                                                \
    do {                                                           \
        if ((s) && (s)[0] && !onnx_map_get(&(map), (s)) && !onnx_map_put(&(map), (s), 0)) \
            c->st = QCAL_ERR_NO_MEMORY;                            \
    } while (0)
    for (size_t i = 0; i < g->n_input; i++)
        PUT(c->names, g->input[i]->name);
    for (size_t i = 0; i < g->n_output; i++) {
        PUT(c->names, g->output[i]->name);
        PUT(c->read, g->output[i]->name);
    }
    for (size_t i = 0; i < g->n_value_info; i++)
        PUT(c->names, g->value_info[i]->name);
    for (size_t i = 0; i < g->n_initializer; i++)
        PUT(c->names, g->initializer[i]->name);
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        PUT(c->names, n->name);
        for (size_t k = 0; k < n->n_input; k++) {
            PUT(c->names, n->input[k]);
            PUT(c->read, n->input[k]);
        }
        for (size_t k = 0; k < n->n_output; k++)
            PUT(c->names, n->output[k]);
        for (size_t k = 0; k < n->n_attribute; k++) {
            const Onnx__AttributeProto *a = n->attribute[k];
            if (a->g)
                collect_graph(c, a->g);
            for (size_t j = 0; j < a->n_graphs; j++)
                collect_graph(c, a->graphs[j]);
        }
    }
#undef PUT
}

/* A name used nowhere in the model: base + suffix (+ "_k"); NULL when out of memory. */
static const char *fresh(up_ctx *c, const char *base, const char *suffix)
{
    size_t len = strlen(base) + strlen(suffix) + 24;
    for (int64_t k = 0;; k++) {
        char *s = malloc(len);
        if (!s)
            return NULL;
        if (k)
            snprintf(s, len, "%s%s_%lld", base, suffix, (long long)k);
        else
            snprintf(s, len, "%s%s", base, suffix);
        if (onnx_map_get(&c->names, s)) {
            free(s);
            continue;
        }
        if (!keep_str(c, s) || !onnx_map_put(&c->names, s, 0))
            return NULL;
        return s;
    }
}

/* ---- rewrites ---- */

/* Removes attribute name from n and returns it (the caller frees it), NULL when absent. */
static Onnx__AttributeProto *attr_take(Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) {
            Onnx__AttributeProto *a = n->attribute[i];
            memmove(&n->attribute[i], &n->attribute[i + 1], (n->n_attribute - i - 1) * sizeof *n->attribute);
            n->n_attribute--;
            return a;
        }
    return NULL;
}

static void attr_free(Onnx__AttributeProto *a)
{
    if (a)
        protobuf_c_message_free_unpacked(&a->base, NULL);
}

/* Sets input k of n to name (inputs in between become "", omitted). */
static bool set_input(Onnx__NodeProto *n, size_t k, const char *name)
{
    if (k >= n->n_input) {
        char **in = realloc(n->input, (k + 1) * sizeof *in);
        if (!in)
            return false;
        n->input = in;
        while (n->n_input <= k) {
            if (!(in[n->n_input] = qcal_strdup("")))
                return false;
            n->n_input++;
        }
    }
    char *s = qcal_strdup(name);
    if (!s)
        return false;
    free(n->input[k]);
    n->input[k] = s;
    return true;
}

static const char *node_base(const Onnx__NodeProto *n)
{
    return n->name && n->name[0] ? n->name : n->n_output ? n->output[0] : "node";
}

/* A new initializer of g (fresh name from base + suffix); its name or NULL (out of memory). */
static const char *add_init(up_ctx *c, Onnx__GraphProto *g, const Onnx__NodeProto *n, const char *suffix,
                            int32_t type, int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    const char *name = fresh(c, node_base(n), suffix);
    if (!name)
        return NULL;
    Onnx__TensorProto *t = onnx_new_tensor(name, type, ndim, dims, data, nbytes);
    if (!t || !onnx_push((void ***)&g->initializer, &g->n_initializer, t)) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        return NULL;
    }
    return name;
}

/* Attribute a (ints) -> input k of n as a 1-D int64 initializer. */
static bool ints_to_input(up_ctx *c, Onnx__GraphProto *g, Onnx__NodeProto *n, Onnx__AttributeProto *a, size_t k,
                          const char *suffix)
{
    int64_t dim = (int64_t)a->n_ints;
    const char *name = add_init(c, g, n, suffix, QCAL_ONNX_INT64, 1, &dim, a->ints, a->n_ints * sizeof *a->ints);
    return name && set_input(n, k, name);
}

/* A scalar of type (float32 or float64; 0 = float32) holding v, as input k of n. */
static bool scalar_to_input(up_ctx *c, Onnx__GraphProto *g, Onnx__NodeProto *n, int32_t type, float v, size_t k,
                            const char *suffix)
{
    const char *name;
    if (type == QCAL_ONNX_DOUBLE) {
        double d = v;
        name = add_init(c, g, n, suffix, QCAL_ONNX_DOUBLE, 0, NULL, &d, sizeof d);
    } else {
        name = add_init(c, g, n, suffix, QCAL_ONNX_FLOAT, 0, NULL, &v, sizeof v);
    }
    return name && set_input(n, k, name);
}

static bool set_string_attr(Onnx__NodeProto *n, const char *name, const char *value)
{
    attr_free(attr_take(n, name));
    char *v = qcal_strdup(value);
    Onnx__AttributeProto *a =
        v ? onnx_node_add_attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING) : NULL;
    if (!a) {
        free(v);
        return false;
    }
    a->s.data = (uint8_t *)v;
    a->s.len = strlen(value);
    a->has_s = 1;
    return true;
}

static bool set_int_attr(Onnx__NodeProto *n, const char *name, int64_t v)
{
    attr_free(attr_take(n, name));
    return onnx_node_add_int(n, name, v);
}

/* Pushes a node onto the array being built (taking it; freed on failure). */
static bool emit(Onnx__NodeProto ***arr, size_t *n, Onnx__NodeProto *node)
{
    if (!node)
        return false;
    if (!onnx_push((void ***)arr, n, node)) {
        protobuf_c_message_free_unpacked(&node->base, NULL);
        return false;
    }
    return true;
}

/* Rewrites node n of g (action act), appending what replaces it to arr. */
static bool apply(up_ctx *c, Onnx__GraphProto *g, Onnx__NodeProto *n, int act, Onnx__NodeProto ***arr, size_t *na)
{
    Onnx__AttributeProto *a;
    bool ok = true;
    switch (act) {
    case A_SOFTMAX_AXIS: {
        qcal_onnx_tensor_desc d;
        onnx_graph_desc(g, n->input[0], &d);
        int64_t axis = attr_int(n, "axis", 1);
        ok = set_int_attr(n, "axis", axis < 0 ? axis + d.ndim : axis);
        break;
    }
    case A_SOFTMAX_FLATTEN: {
        const char *base = node_base(n);
        const char *shape = fresh(c, base, "_shape"), *flat = fresh(c, base, "_flat"),
                   *soft = fresh(c, base, "_2d"), *nshape = fresh(c, base, "_shape_node"),
                   *nflat = fresh(c, base, "_flatten"), *nresh = fresh(c, base, "_reshape");
        if (!shape || !flat || !soft || !nshape || !nflat || !nresh)
            return false;
        int64_t axis = attr_int(n, "axis", 1);
        const char *x = n->input[0], *y = n->output[0];
        Onnx__NodeProto *sh = onnx_new_node("Shape", nshape, 1, &x, 1, &shape);
        if (!emit(arr, na, sh))
            return false;
        Onnx__NodeProto *fl = onnx_new_node("Flatten", nflat, 1, &x, 1, &flat);
        if (!fl || !onnx_node_add_int(fl, "axis", axis)) {
            if (fl)
                protobuf_c_message_free_unpacked(&fl->base, NULL);
            return false;
        }
        if (!emit(arr, na, fl))
            return false;
        const char *rin[2] = { soft, shape };
        Onnx__NodeProto *rs = onnx_new_node("Reshape", nresh, 2, rin, 1, &y);
        if (!rs)
            return false;
        ok = set_input(n, 0, flat) && set_int_attr(n, "axis", -1);
        char *o = qcal_strdup(soft);
        if (ok && o) {
            free(n->output[0]);
            n->output[0] = o;
        } else {
            free(o);
            ok = false;
        }
        if (!ok || !emit(arr, na, n)) {
            protobuf_c_message_free_unpacked(&rs->base, NULL);
            return false;
        }
        return emit(arr, na, rs);
    }
    case A_AXES_INPUT:
        a = attr_take(n, "axes");
        ok = ints_to_input(c, g, n, a, 1, "_axes");
        attr_free(a);
        break;
    case A_SPLIT_INPUT:
        a = attr_take(n, "split");
        ok = ints_to_input(c, g, n, a, 1, "_split");
        attr_free(a);
        break;
    case A_CLIP_INPUTS: {
        int32_t t = elem_type(g, n->input[0]);
        Onnx__AttributeProto *lo = attr_take(n, "min"), *hi = attr_take(n, "max");
        if (lo)
            ok = scalar_to_input(c, g, n, t, lo->f, 1, "_min");
        if (ok && hi)
            ok = scalar_to_input(c, g, n, t, hi->f, 2, "_max");
        attr_free(lo);
        attr_free(hi);
        break;
    }
    case A_RESIZE:
    case A_RESIZE_CEIL: {
        bool nearest = attr_is(n, "mode", "nearest", true);
        const char *nm = !nearest ? NULL : act == A_RESIZE_CEIL ? "ceil" : "floor";
        char *op = qcal_strdup("Resize");
        if (!op)
            return false;
        free(n->op_type);
        n->op_type = op;
        const char *scales = n->input[1];
        char *keep = qcal_strdup(scales);
        ok = keep && set_input(n, 2, keep) && set_input(n, 1, "") &&
             set_string_attr(n, "coordinate_transformation_mode", "asymmetric") &&
             (!nm || set_string_attr(n, "nearest_mode", nm));
        free(keep);
        break;
    }
    case A_SLICE_INPUTS: {
        Onnx__AttributeProto *st = attr_take(n, "starts"), *en = attr_take(n, "ends"), *ax = attr_take(n, "axes");
        ok = st && en && ints_to_input(c, g, n, st, 1, "_starts") && ints_to_input(c, g, n, en, 2, "_ends") &&
             (!ax || ints_to_input(c, g, n, ax, 3, "_axes"));
        attr_free(st);
        attr_free(en);
        attr_free(ax);
        break;
    }
    case A_PAD_INPUTS: {
        int32_t t = elem_type(g, n->input[0]);
        Onnx__AttributeProto *pads = attr_take(n, "pads"), *value = attr_take(n, "value");
        ok = pads && ints_to_input(c, g, n, pads, 1, "_pads");
        if (ok && value && value->f != 0.0f && attr_is(n, "mode", "constant", true))
            ok = scalar_to_input(c, g, n, t, value->f, 2, "_value");
        attr_free(pads);
        attr_free(value);
        break;
    }
    case A_DROPOUT_IDENTITY: {
        char *op = qcal_strdup("Identity");
        if (!op)
            return false;
        free(n->op_type);
        n->op_type = op;
        while (n->n_attribute)
            attr_free(n->attribute[--n->n_attribute]);
        while (n->n_input > 1)
            free(n->input[--n->n_input]);
        while (n->n_output > 1)
            free(n->output[--n->n_output]);
        break;
    }
    case A_TOPK_INPUT: {
        a = attr_take(n, "k");
        int64_t k = a && a->has_i ? a->i : 0, one = 1;
        const char *name = a ? add_init(c, g, n, "_k", QCAL_ONNX_INT64, 1, &one, &k, sizeof k) : NULL;
        ok = name && set_input(n, 1, name);
        attr_free(a);
        break;
    }
    case A_SCATTER: {
        char *op = qcal_strdup("ScatterElements");
        if (!op)
            return false;
        free(n->op_type);
        n->op_type = op;
        break;
    }
    case A_SPLIT_NUM_OUTPUTS:
        ok = set_int_attr(n, "num_outputs", (int64_t)n->n_output);
        break;
    case A_ROIALIGN_MODE:
        ok = set_string_attr(n, "coordinate_transformation_mode", "output_half_pixel");
        break;
    default:
        break;
    }
    return ok && emit(arr, na, n);
}

/* Classifies (rewrite false) or rewrites (rewrite true) every default-domain node of g, its
 * bodies first. Actions are decided before the first node of g changes (classify reads the
 * graph's constants). */
static void walk(up_ctx *c, Onnx__GraphProto *g, bool rewrite)
{
    for (size_t i = 0; i < g->n_node && c->st == QCAL_OK; i++) {
        Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_attribute; k++) {
            Onnx__AttributeProto *a = n->attribute[k];
            if (a->g)
                walk(c, a->g, rewrite);
            for (size_t j = 0; j < a->n_graphs; j++)
                walk(c, a->graphs[j], rewrite);
        }
    }
    if (c->st != QCAL_OK || !g->n_node)
        return;
    int *act = malloc(g->n_node * sizeof *act);
    const char **why = malloc(g->n_node * sizeof *why);
    if (!act || !why) {
        free(act);
        free(why);
        c->st = QCAL_ERR_NO_MEMORY;
        return;
    }
    for (size_t i = 0; i < g->n_node; i++) {
        why[i] = NULL;
        act[i] = default_domain(g->node[i]) ? classify(c, g, g->node[i], &why[i]) : A_KEEP;
    }
    if (!rewrite) {
        for (size_t i = 0; i < g->n_node; i++) {
            if (act[i] == A_KEEP)
                continue;
            tally *t = tally_of(c, g->node[i]->op_type ? g->node[i]->op_type : "");
            if (!t) {
                c->st = QCAL_ERR_NO_MEMORY;
                break;
            }
            if (act[i] < 0) {
                t->refused++;
                if (why[i])
                    t->why = (char *)why[i];
            } else {
                t->count[act[i]]++;
            }
        }
        free(act);
        free(why);
        return;
    }
    Onnx__NodeProto **arr = NULL;
    size_t na = 0, i = 0;
    for (; i < g->n_node; i++) {
        Onnx__NodeProto *n = g->node[i];
        g->node[i] = NULL;   /* now owned by arr (or freed) */
        if (!(act[i] == A_KEEP ? emit(&arr, &na, n) : apply(c, g, n, act[i], &arr, &na))) {
            c->st = QCAL_ERR_NO_MEMORY;
            i++;
            break;
        }
    }
    free(act);
    free(why);
    if (c->st != QCAL_OK) {   /* out of memory: the nodes rewritten so far, then the rest */
        for (size_t j = i; j < g->n_node; j++)
            if (g->node[j] && !emit(&arr, &na, g->node[j]))
                break;
    }
    free(g->node);
    g->node = arr;
    g->n_node = na;
}

static void ctx_free(up_ctx *c)
{
    onnx_map_free(&c->names);
    onnx_map_free(&c->read);
    for (size_t i = 0; i < c->nowned; i++)
        free(c->owned[i]);
    free(c->owned);
    for (size_t i = 0; i < c->nt; i++)
        free(c->t[i].op);
    free(c->t);
}

/* "N node" / "N nodes". */
static const char *nodes_word(int64_t n)
{
    return n == 1 ? "node" : "nodes";
}

static qcal_status refusal(up_ctx *c)
{
    char buf[900];
    size_t len = 0;
    for (size_t i = 0; i < c->nt; i++) {
        const tally *t = &c->t[i];
        if (!t->refused)
            continue;
        int w = snprintf(buf + len, sizeof buf - len, "%s%s (%lld %s%s%s)", len ? ", " : "", t->op,
                         (long long)t->refused, nodes_word(t->refused), t->why ? ": " : "", t->why ? t->why : "");
        if (w < 0 || (size_t)w >= sizeof buf - len) {
            len = sizeof buf - 1;
            break;
        }
        len += (size_t)w;
    }
    buf[len] = '\0';
    return qcal_error(QCAL_ERR_UNSUPPORTED,
                      "cannot raise opset %lld to %lld: %s changed meaning and qcal does not adapt them",
                      (long long)c->orig, (long long)c->to, buf);
}

static qcal_status fill_report(up_ctx *c, qcal_onnx_upgrade_report *rep)
{
    int64_t n = 0;
    for (size_t i = 0; i < c->nt; i++)
        n++;
    char **lines = calloc((size_t)n + 1, sizeof *lines);
    if (!lines)
        return OOM();
    int64_t k = 0;
    for (size_t i = 0; i < c->nt; i++) {
        const tally *t = &c->t[i];
        char buf[1024];
        size_t len = (size_t)snprintf(buf, sizeof buf, "%s:", t->op);
        bool first = true;
        for (int a = 1; a < A_N && len < sizeof buf; a++)
            if (t->count[a]) {
                len += (size_t)snprintf(buf + len, sizeof buf - len, "%s %s (%lld %s)", first ? "" : ";",
                                        action_text[a], (long long)t->count[a], nodes_word(t->count[a]));
                first = false;
            }
        if (!(lines[k++] = qcal_strdup(buf))) {
            for (int64_t j = 0; j < k; j++)
                free(lines[j]);
            free(lines);
            return OOM();
        }
    }
    rep->adapted = lines;
    rep->n_adapted = k;
    return QCAL_OK;
}

/* The IR version an opset needs (onnx/helper.py VERSION_TABLE: opset 13-14 IR 7, 15-18 IR 8,
 * 19 IR 9). */
static int64_t ir_for(int64_t opset)
{
    return opset >= 19 ? 9 : opset >= 15 ? 8 : 7;
}

qcal_status qcal_onnx_upgrade(qcal_onnx_model *m, int64_t opset, qcal_onnx_upgrade_report *rep)
{
    if (!m || !m->proto || !m->proto->graph)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_upgrade: NULL model");
    if (opset < STEP1 || opset > NEWEST)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "qcal_onnx_upgrade: opset %lld requested; qcal raises models to opsets 13 to 19 only",
                          (long long)opset);
    Onnx__ModelProto *mp = m->proto;
    int64_t from = onnx_model_opset(mp);
    if (from < 0)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "cannot raise the opset to %lld: the model imports no default-domain opset",
                          (long long)opset);
    if (from >= opset) {
        if (rep) {
            memset(rep, 0, sizeof *rep);
            rep->from = rep->to = from;
        }
        return QCAL_OK;
    }
    if (from < 9)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "cannot raise opset %lld to %lld: qcal adapts models of opset 9 or newer only (convert the model to opset 9 or newer first)",
                          (long long)from, (long long)opset);
    up_ctx c = { .m = m, .orig = from, .to = opset, .st = QCAL_OK };
    bool step1 = from < STEP1, step2 = opset > STEP1;
    /* Both steps are classified on the model as it is, before anything changes. */
    collect_graph(&c, mp->graph);
    if (c.st == QCAL_OK && step1) {
        c.step = 1;
        walk(&c, mp->graph, false);
    }
    if (c.st == QCAL_OK && step2) {
        c.step = 2;
        walk(&c, mp->graph, false);
    }
    if (c.st != QCAL_OK) {
        ctx_free(&c);
        return OOM();
    }
    for (size_t i = 0; i < c.nt; i++)
        if (c.t[i].refused) {
            qcal_status st = refusal(&c);
            ctx_free(&c);
            return st;
        }
    qcal_onnx_upgrade_report r = { .from = from, .to = opset };
    /* The report first: after the rewrite nothing may fail but memory. */
    qcal_status st = rep ? fill_report(&c, &r) : QCAL_OK;
    if (st == QCAL_OK && step1) {
        c.step = 1;
        walk(&c, mp->graph, true);
        st = c.st;
    }
    if (st == QCAL_OK && step2) {
        c.step = 2;
        c.step1_done = true;
        walk(&c, mp->graph, true);
        st = c.st;
    }
    if (st == QCAL_OK) {
        for (size_t i = 0; i < mp->n_opset_import; i++) {
            Onnx__OperatorSetIdProto *o = mp->opset_import[i];
            if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx")) {
                o->version = opset;
                o->has_version = 1;
                break;
            }
        }
        if (!mp->has_ir_version || mp->ir_version < ir_for(opset)) {
            mp->ir_version = ir_for(opset);
            mp->has_ir_version = 1;
        }
    }
    ctx_free(&c);
    if (st != QCAL_OK) {
        qcal_onnx_upgrade_report_free(&r);
        return st == QCAL_ERR_NO_MEMORY ? OOM() : st;
    }
    if (rep)
        *rep = r;
    return QCAL_OK;
}

void qcal_onnx_upgrade_report_free(qcal_onnx_upgrade_report *rep)
{
    if (!rep)
        return;
    for (int64_t i = 0; i < rep->n_adapted; i++)
        free(rep->adapted[i]);
    free(rep->adapted);
    memset(rep, 0, sizeof *rep);
}
