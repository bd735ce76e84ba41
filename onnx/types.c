/* Element types of a graph's tensors for listing, exposing and quantizing: what the model
 * declares (graph inputs and outputs, value_info), initializers and Constant values, then
 * propagated through the ops in node order (graphs are topologically sorted). A type that
 * neither the model declares nor these rules give stays unknown (never guessed). */
#include <string.h>

#include "onnx/onnx_internal.h"

enum { T_FLOAT = 1, T_UINT8 = 2, T_INT32 = 6, T_INT64 = 7, T_STRING = 8, T_BOOL = 9 };

static const char *const int64_ops[] = {
    "Shape", "Size", "NonZero", "ArgMax", "ArgMin", "NonMaxSuppression", "SequenceLength", NULL,
};
static const char *const bool_ops[] = {
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
    "IsNaN", "IsInf", "RegexFullMatch", "OptionalHasElement", NULL,
};
/* Sequence and optional values: no tensor element type here. */
static const char *const untyped_ops[] = {
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt",
    "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalGetElement", "SequenceMap", NULL,
};

static bool in_set(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return true;
    return false;
}

int32_t onnx_type_get(const onnx_types *ty, const char *name)
{
    for (; ty; ty = ty->up) {
        int64_t *v = name && name[0] ? onnx_map_get(&ty->map, name) : NULL;
        if (v)
            return (int32_t)*v;
        if (ty->defined && onnx_map_get(ty->defined, name))
            return 0;   /* defined in this graph, type unknown: an outer one of that name is hidden */
    }
    return 0;
}

static bool put(onnx_types *ty, const char *name, int64_t type)
{
    if (!name || !name[0] || type <= 0 || onnx_map_get(&ty->map, name))
        return true;   /* the first (declared) type wins */
    return onnx_map_put(&ty->map, name, type);
}

static int64_t attr_i(const Onnx__NodeProto *n, const char *a, int64_t def)
{
    const Onnx__AttributeProto *at = onnx_node_attr(n, a);
    return at && at->has_i ? at->i : def;
}

static int32_t vi_type(const Onnx__ValueInfoProto *v)
{
    if (!v || !v->type || v->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !v->type->tensor_type)
        return 0;
    return v->type->tensor_type->has_elem_type ? v->type->tensor_type->elem_type : 0;
}

static int32_t constant_type(const Onnx__NodeProto *n)
{
    for (size_t a = 0; a < n->n_attribute; a++) {
        const Onnx__AttributeProto *at = n->attribute[a];
        const char *an = at->name ? at->name : "";
        if (!strcmp(an, "value") && at->t)
            return at->t->data_type;
        if (!strcmp(an, "sparse_value") && at->sparse_tensor && at->sparse_tensor->values)
            return at->sparse_tensor->values->data_type;
        if (!strcmp(an, "value_float") || !strcmp(an, "value_floats"))
            return T_FLOAT;
        if (!strcmp(an, "value_int") || !strcmp(an, "value_ints"))
            return T_INT64;
        if (!strcmp(an, "value_string") || !strcmp(an, "value_strings"))
            return T_STRING;
    }
    return 0;
}

static const Onnx__GraphProto *graph_attr(const Onnx__NodeProto *n, const char *name)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a ? a->g : NULL;
}

/* Output k of a control-flow node: the body's output (Loop: after the condition). */
static qcal_status body_out_type(const Onnx__GraphProto *body, size_t k, onnx_types *ty, int32_t *out)
{
    *out = 0;
    if (!body || k >= body->n_output)
        return QCAL_OK;
    *out = vi_type(body->output[k]);
    if (*out || !body->output[k]->name)
        return QCAL_OK;
    onnx_types inner;
    qcal_status st = onnx_types_build(body, ty, &inner);
    if (st == QCAL_OK)
        *out = onnx_type_get(&inner, body->output[k]->name);
    onnx_types_free(&inner);
    return st;
}

qcal_status onnx_types_build(const Onnx__GraphProto *g, const onnx_types *up, onnx_types *ty)
{
    memset(ty, 0, sizeof *ty);
    ty->up = up;
    bool ok = true;
    for (size_t i = 0; i < g->n_input + g->n_output + g->n_value_info; i++) {
        const Onnx__ValueInfoProto *v = i < g->n_input ? g->input[i]
                                        : i < g->n_input + g->n_output ? g->output[i - g->n_input]
                                        : g->value_info[i - g->n_input - g->n_output];
        ok &= put(ty, v->name, vi_type(v));
    }
    for (size_t i = 0; i < g->n_initializer; i++)
        ok &= put(ty, g->initializer[i]->name, g->initializer[i]->data_type);
    /* Names this graph defines (hide an outer name's type even when unknown here). */
    onnx_map *def = calloc(1, sizeof *def);
    ok &= def != NULL;
    for (size_t i = 0; ok && i < g->n_input + g->n_initializer; i++) {
        const char *nm = i < g->n_input ? g->input[i]->name : g->initializer[i - g->n_input]->name;
        ok &= !nm || !nm[0] || onnx_map_put(def, nm, 0);
    }
    for (size_t i = 0; ok && i < g->n_node; i++)
        for (size_t k = 0; k < g->node[i]->n_output; k++)
            ok &= !g->node[i]->output[k][0] || onnx_map_put(def, g->node[i]->output[k], 0);
    ty->defined = def;
    qcal_status st = ok ? QCAL_OK : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; st == QCAL_OK && i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
            continue;   /* other domains: unknown */
        const char *op = n->op_type;
        int32_t in[8] = { 0 };
        for (size_t k = 0; k < n->n_input && k < 8; k++)
            in[k] = onnx_type_get(ty, n->input[k]);
        int32_t o0 = in[0], rest = 0;   /* output 0, and the others */
        bool all = false;               /* every output as output 0 */
        if (in_set(int64_ops, op)) {
            o0 = T_INT64;
        } else if (in_set(bool_ops, op)) {
            o0 = T_BOOL;
        } else if (in_set(untyped_ops, op)) {
            o0 = 0;
        } else if (!strcmp(op, "Constant")) {
            o0 = constant_type(n);
        } else if (!strcmp(op, "Cast")) {
            o0 = (int32_t)attr_i(n, "to", 0);
        } else if (!strcmp(op, "CastLike")) {
            o0 = in[1];
        } else if (!strcmp(op, "Where")) {
            o0 = in[1] ? in[1] : in[2];
        } else if (!strcmp(op, "ConstantOfShape")) {
            const Onnx__AttributeProto *a = onnx_node_attr(n, "value");
            o0 = a && a->t ? a->t->data_type : T_FLOAT;
        } else if (!strcmp(op, "EyeLike") || !strcmp(op, "RandomNormalLike") || !strcmp(op, "RandomUniformLike") ||
                   !strcmp(op, "Bernoulli")) {
            o0 = (int32_t)attr_i(n, "dtype", in[0]);
        } else if (!strcmp(op, "RandomNormal") || !strcmp(op, "RandomUniform")) {
            o0 = (int32_t)attr_i(n, "dtype", T_FLOAT);
        } else if (!strcmp(op, "Multinomial")) {
            o0 = (int32_t)attr_i(n, "dtype", T_INT32);
        } else if (!strcmp(op, "HannWindow") || !strcmp(op, "HammingWindow") || !strcmp(op, "BlackmanWindow") ||
                   !strcmp(op, "MelWeightMatrix")) {
            o0 = (int32_t)attr_i(n, "output_datatype", T_FLOAT);
        } else if (!strcmp(op, "QuantizeLinear")) {
            o0 = (int32_t)attr_i(n, "output_dtype", 0);
            if (!o0)
                o0 = n->n_input > 2 && n->input[2][0] ? in[2] : T_UINT8;
        } else if (!strcmp(op, "DequantizeLinear")) {
            o0 = in[1] ? in[1] : T_FLOAT;
        } else if (!strcmp(op, "DynamicQuantizeLinear")) {
            o0 = T_UINT8;
            ok &= n->n_output < 2 || put(ty, n->output[1], T_FLOAT);
            ok &= n->n_output < 3 || put(ty, n->output[2], T_UINT8);
        } else if (!strcmp(op, "MatMulInteger") || !strcmp(op, "ConvInteger")) {
            o0 = T_INT32;
        } else if (!strcmp(op, "QLinearConv") || !strcmp(op, "QLinearMatMul")) {
            o0 = in[7];
        } else if (!strcmp(op, "OneHot")) {
            o0 = in[2];
        } else if (!strcmp(op, "StringNormalizer") || !strcmp(op, "StringConcat")) {
            o0 = T_STRING;
        } else if (!strcmp(op, "ImageDecoder")) {
            o0 = T_UINT8;
        } else if (!strcmp(op, "TfIdfVectorizer")) {
            o0 = T_FLOAT;
        } else if (!strcmp(op, "TopK") || !strcmp(op, "MaxPool") || !strcmp(op, "Unique")) {
            rest = T_INT64;   /* indices, counts */
        } else if (!strcmp(op, "Dropout")) {
            rest = T_BOOL;    /* the mask */
        } else if (!strcmp(op, "Split") || !strcmp(op, "LSTM") || !strcmp(op, "GRU") || !strcmp(op, "RNN")) {
            all = true;
        } else if (!strcmp(op, "BatchNormalization")) {
            rest = in[3];     /* running mean and variance: the type of mean */
        } else if (!strcmp(op, "LayerNormalization")) {
            rest = (int32_t)attr_i(n, "stash_type", T_FLOAT);
        } else if (!strcmp(op, "If") || !strcmp(op, "Loop") || !strcmp(op, "Scan")) {
            const Onnx__GraphProto *body = graph_attr(n, !strcmp(op, "If") ? "then_branch" : "body");
            size_t skip = !strcmp(op, "Loop");
            for (size_t k = 0; st == QCAL_OK && k < n->n_output; k++) {
                int32_t t;
                st = body_out_type(body, k + skip, ty, &t);
                ok &= st != QCAL_OK || put(ty, n->output[k], t);
            }
            continue;
        }
        /* everything else in the default domain (elementwise, shape and data movement,
         * reductions, ...): output 0 has input 0's type */
        if (n->n_output > 0)
            ok &= put(ty, n->output[0], o0);
        for (size_t k = 1; k < n->n_output; k++)
            ok &= put(ty, n->output[k], all ? o0 : rest);
        if (!ok)
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    if (st != QCAL_OK)
        onnx_types_free(ty);
    return st;
}

void onnx_types_free(onnx_types *ty)
{
    onnx_map_free(&ty->map);
    if (ty->defined) {
        onnx_map_free(ty->defined);
        free(ty->defined);
    }
    memset(ty, 0, sizeof *ty);
}
