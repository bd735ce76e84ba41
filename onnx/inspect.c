/* ONNX models inspected: counts, nodes, inputs and outputs, declared types and shapes,
 * initializer values (qcal/onnx.h), and the lookups the passes share (opset, attributes). */
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"

int64_t onnx_model_opset(const Onnx__ModelProto *mp)
{
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx"))
            return o->has_version ? o->version : -1;
    }
    return -1;
}

const Onnx__AttributeProto *onnx_node_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name))
            return n->attribute[i];
    return NULL;
}


/* ---- inspection ---- */

qcal_status qcal_onnx_model_get_info(const qcal_onnx_model *m, qcal_onnx_model_info *info)
{
    if (!m || !info)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_get_info: NULL argument");
    const Onnx__ModelProto *mp = m->proto;
    info->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    info->opset = onnx_model_opset(mp);
    info->nodes = (int64_t)mp->graph->n_node;
    info->initializers = (int64_t)mp->graph->n_initializer;
    info->inputs = (int64_t)mp->graph->n_input;
    info->outputs = (int64_t)mp->graph->n_output;
    return QCAL_OK;
}

static const char empty_str[] = "";

qcal_status qcal_onnx_node_at(const qcal_onnx_model *m, int64_t i, qcal_onnx_node_info *out)
{
    if (!m || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_node_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_node)
        return qcal_error(QCAL_ERR_INVALID_ARG, "node index %lld out of range [0, %zu)", (long long)i,
                          g->n_node);
    const Onnx__NodeProto *n = g->node[i];
    out->name = n->name ? n->name : empty_str;
    out->op_type = n->op_type;
    out->domain = n->domain ? n->domain : empty_str;
    out->n_inputs = (int64_t)n->n_input;
    out->n_outputs = (int64_t)n->n_output;
    out->inputs = (const char *const *)n->input;
    out->outputs = (const char *const *)n->output;
    return QCAL_OK;
}

qcal_status qcal_onnx_input_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    if (!m || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_input_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_input)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input index %lld out of range", (long long)i);
    *name = onnx_str_or_empty(g->input[i]->name);
    return QCAL_OK;
}

qcal_status qcal_onnx_output_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    if (!m || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_output_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_output)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output index %lld out of range", (long long)i);
    *name = onnx_str_or_empty(g->output[i]->name);
    return QCAL_OK;
}

qcal_status qcal_onnx_node_attr_int(const qcal_onnx_model *m, int64_t i, const char *attr, int64_t *value)
{
    if (!m || !attr || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_node_attr_int: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_node)
        return qcal_error(QCAL_ERR_INVALID_ARG, "node index %lld out of range", (long long)i);
    const Onnx__AttributeProto *a = onnx_node_attr(g->node[i], attr);
    if (!a || !a->has_i)
        return qcal_error(QCAL_ERR_NOT_FOUND, "node %lld has no integer attribute '%s'", (long long)i, attr);
    *value = a->i;
    return QCAL_OK;
}

static void desc_from_type(const Onnx__TypeProto *tp, qcal_onnx_tensor_desc *d)
{
    d->elem_type = 0;
    d->ndim = -1;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return;
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    d->elem_type = tt->has_elem_type ? tt->elem_type : 0;
    if (!tt->shape || tt->shape->n_dim > QCAL_MAX_DIMS)
        return;
    d->ndim = (int32_t)tt->shape->n_dim;
    for (size_t k = 0; k < tt->shape->n_dim; k++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[k];
        d->dims[k] = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                             dm->dim_value >= 0
                         ? dm->dim_value
                         : -1;
    }
}

static const Onnx__ValueInfoProto *find_vi(Onnx__ValueInfoProto **v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (v[i]->name && !strcmp(v[i]->name, name))
            return v[i];
    return NULL;
}

bool onnx_graph_desc(const Onnx__GraphProto *g, const char *name, qcal_onnx_tensor_desc *desc)
{
    const Onnx__ValueInfoProto *vi = find_vi(g->input, g->n_input, name);
    if (!vi)
        vi = find_vi(g->output, g->n_output, name);
    if (!vi)
        vi = find_vi(g->value_info, g->n_value_info, name);
    if (vi && vi->type) {
        desc_from_type(vi->type, desc);
        if (desc->elem_type)
            return true;
    }
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        if (t->name && !strcmp(t->name, name)) {
            desc->elem_type = t->data_type;
            desc->ndim = t->n_dims <= QCAL_MAX_DIMS ? (int32_t)t->n_dims : -1;
            for (size_t k = 0; k < t->n_dims && k < QCAL_MAX_DIMS; k++)
                desc->dims[k] = t->dims[k];
            return true;
        }
    }
    return vi != NULL;
}

qcal_status qcal_onnx_tensor_get_desc(const qcal_onnx_model *m, const char *name, qcal_onnx_tensor_desc *out)
{
    if (!m || !name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_tensor_get_desc: NULL argument");
    qcal_onnx_tensor_desc d = { 0, -1, { 0 } };
    if (!onnx_graph_desc(m->proto->graph, name, &d))
        return qcal_error(QCAL_ERR_NOT_FOUND, "the graph declares nothing for '%s'", name);
    *out = d;
    return QCAL_OK;
}

const Onnx__TensorProto *onnx_graph_init(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name))
            return g->initializer[i];
    return NULL;
}

static void desc_of_tensor(const Onnx__TensorProto *t, qcal_onnx_tensor_desc *d)
{
    d->elem_type = t->data_type;
    d->ndim = t->n_dims <= QCAL_MAX_DIMS ? (int32_t)t->n_dims : -1;
    for (size_t k = 0; k < t->n_dims && k < QCAL_MAX_DIMS; k++)
        d->dims[k] = t->dims[k];
}

qcal_status qcal_onnx_initializer_float(const qcal_onnx_model *m, const char *name, float **data,
                                        qcal_onnx_tensor_desc *desc)
{
    if (!m || !name || !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_float: NULL argument");
    const Onnx__TensorProto *t = onnx_graph_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    int64_t n;
    qcal_status st = onnx_tensor_to_float(t, data, &n);
    if (st == QCAL_OK && desc)
        desc_of_tensor(t, desc);
    return st;
}

qcal_status qcal_onnx_initializer_int64(const qcal_onnx_model *m, const char *name, int64_t **data,
                                        qcal_onnx_tensor_desc *desc)
{
    if (!m || !name || !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_int64: NULL argument");
    const Onnx__TensorProto *t = onnx_graph_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    int type = t->data_type;
    if (!(type == 2 || type == 3 || type == 4 || type == 5 || type == 6 || type == 7 || type == 9 ||
          type == 12 || type == 13))
        return qcal_error(QCAL_ERR_UNSUPPORTED, "initializer '%s' is of element type %d, not an integer type",
                          name, type);
    const uint8_t *p;
    size_t len;
    void *owned;
    qcal_status st = onnx_tensor_bytes(t, &p, &len, &owned);
    if (st != QCAL_OK)
        return st;
    size_t es = onnx_elem_size(type), n = len / es;
    int64_t *v = malloc(n * sizeof *v + 1);
    if (!v) {
        free(owned);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *q = p + i * es;
        switch (type) {
        case 2: case 9: v[i] = q[0]; break;
        case 3: v[i] = (int8_t)q[0]; break;
        case 4: { uint16_t x; memcpy(&x, q, 2); v[i] = x; break; }
        case 5: { int16_t x; memcpy(&x, q, 2); v[i] = x; break; }
        case 6: { int32_t x; memcpy(&x, q, 4); v[i] = x; break; }
        case 12: { uint32_t x; memcpy(&x, q, 4); v[i] = x; break; }
        default: memcpy(&v[i], q, 8); break;
        }
    }
    free(owned);
    *data = v;
    if (desc)
        desc_of_tensor(t, desc);
    return QCAL_OK;
}
