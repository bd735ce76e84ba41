/* ONNX models built: tensors, nodes, attributes and value infos for the passes
 * (onnx_internal.h), and the public builder of qcal/onnx.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"

bool onnx_push(void ***array, size_t *n, void *item)
{
    void **a = realloc(*array, (*n + 1) * sizeof *a);
    if (!a)
        return false;
    a[*n] = item;
    *array = a;
    (*n)++;
    return true;
}

bool onnx_tensor_add_entry(Onnx__TensorProto *t, const char *key, const char *value)
{
    Onnx__StringStringEntryProto *e = malloc(sizeof *e);
    if (!e)
        return false;
    onnx__string_string_entry_proto__init(e);
    e->key = qcal_strdup(key);
    e->value = qcal_strdup(value);
    if (!e->key || !e->value || !onnx_push((void ***)&t->external_data, &t->n_external_data, e)) {
        protobuf_c_message_free_unpacked(&e->base, NULL);
        return false;
    }
    return true;
}

/* ---- builder ---- */

Onnx__TensorProto *onnx_new_tensor(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                                   const void *data, size_t nbytes)
{
    Onnx__TensorProto *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    onnx__tensor_proto__init(t);
    t->name = qcal_strdup(name);
    t->has_data_type = 1;
    t->data_type = type;
    t->n_dims = (size_t)(ndim > 0 ? ndim : 0);
    t->dims = t->n_dims ? malloc(t->n_dims * sizeof *t->dims) : NULL;
    t->raw_data.data = malloc(nbytes ? nbytes : 1);
    t->raw_data.len = nbytes;
    t->has_raw_data = 1;
    if (!t->name || (t->n_dims && !t->dims) || !t->raw_data.data) {
        protobuf_c_message_free_unpacked(&t->base, NULL);
        return NULL;
    }
    if (t->n_dims)
        memcpy(t->dims, dims, t->n_dims * sizeof *t->dims);
    if (nbytes && data)
        memcpy(t->raw_data.data, data, nbytes);
    return t;
}

Onnx__TensorProto *onnx_new_tensor_take(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                                        void *data, size_t nbytes)
{
    Onnx__TensorProto *t = onnx_new_tensor(name, type, ndim, dims, NULL, 0);
    if (!t)
        return NULL;
    free(t->raw_data.data);
    t->raw_data.data = data;
    t->raw_data.len = nbytes;
    return t;
}

Onnx__NodeProto *onnx_new_node(const char *op_type, const char *name, int64_t n_in,
                               const char *const *in, int64_t n_out, const char *const *out)
{
    Onnx__NodeProto *n = malloc(sizeof *n);
    if (!n)
        return NULL;
    onnx__node_proto__init(n);
    n->op_type = qcal_strdup(op_type);
    n->name = name ? qcal_strdup(name) : NULL;
    n->input = calloc((size_t)n_in + 1, sizeof *n->input);
    n->output = calloc((size_t)n_out + 1, sizeof *n->output);
    bool ok = n->op_type && (!name || n->name) && n->input && n->output;
    for (int64_t i = 0; ok && i < n_in; i++) {
        n->input[i] = qcal_strdup(in[i] ? in[i] : "");
        ok = n->input[i] != NULL;
        n->n_input = (size_t)i + (ok ? 1 : 0);
    }
    for (int64_t i = 0; ok && i < n_out; i++) {
        n->output[i] = qcal_strdup(out[i]);
        ok = n->output[i] != NULL;
        n->n_output = (size_t)i + (ok ? 1 : 0);
    }
    if (!ok) {
        protobuf_c_message_free_unpacked(&n->base, NULL);
        return NULL;
    }
    return n;
}

Onnx__AttributeProto *onnx_node_add_attr(Onnx__NodeProto *n, const char *name,
                                         Onnx__AttributeProto__AttributeType type)
{
    Onnx__AttributeProto *a = malloc(sizeof *a);
    if (!a)
        return NULL;
    onnx__attribute_proto__init(a);
    a->name = qcal_strdup(name);
    a->has_type = 1;
    a->type = type;
    if (!a->name || !onnx_push((void ***)&n->attribute, &n->n_attribute, a)) {
        protobuf_c_message_free_unpacked(&a->base, NULL);
        return NULL;
    }
    return a;
}

bool onnx_node_add_int(Onnx__NodeProto *n, const char *attr, int64_t v)
{
    Onnx__AttributeProto *a = onnx_node_add_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (!a)
        return false;
    a->has_i = 1;
    a->i = v;
    return true;
}

static Onnx__TypeProto *new_tensor_type(const qcal_onnx_tensor_desc *d)
{
    Onnx__TypeProto *tp = malloc(sizeof *tp);
    if (!tp)
        return NULL;
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = malloc(sizeof *tt);
    if (!tt) {
        free(tp);
        return NULL;
    }
    onnx__type_proto__tensor__init(tt);
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = d->elem_type ? d->elem_type : QCAL_ONNX_FLOAT;
    if (d->ndim >= 0) {
        Onnx__TensorShapeProto *sh = malloc(sizeof *sh);
        if (!sh)
            goto fail;
        onnx__tensor_shape_proto__init(sh);
        tt->shape = sh;
        for (int32_t k = 0; k < d->ndim; k++) {
            Onnx__TensorShapeProto__Dimension *dm = malloc(sizeof *dm);
            if (!dm)
                goto fail;
            onnx__tensor_shape_proto__dimension__init(dm);
            if (!onnx_push((void ***)&sh->dim, &sh->n_dim, dm)) {
                free(dm);
                goto fail;
            }
            if (d->dims[k] >= 0) {
                dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                dm->dim_value = d->dims[k];
            } else {
                char p[24];
                snprintf(p, sizeof p, "d%d", (int)k);
                dm->dim_param = qcal_strdup(p);
                if (!dm->dim_param)
                    goto fail;
                dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            }
        }
    }
    return tp;
fail:
    protobuf_c_message_free_unpacked(&tp->base, NULL);
    return NULL;
}

Onnx__ValueInfoProto *onnx_new_value_info(const char *name, const qcal_onnx_tensor_desc *desc)
{
    Onnx__ValueInfoProto *vi = malloc(sizeof *vi);
    if (!vi)
        return NULL;
    onnx__value_info_proto__init(vi);
    vi->name = qcal_strdup(name);
    vi->type = new_tensor_type(desc);
    if (!vi->name || !vi->type) {
        protobuf_c_message_free_unpacked(&vi->base, NULL);
        return NULL;
    }
    return vi;
}

qcal_status qcal_onnx_model_create(int64_t ir_version, int64_t opset, qcal_onnx_model **out)
{
    if (!out || ir_version < 1 || opset < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_create: bad argument (ir_version %lld, opset %lld)",
                          (long long)ir_version, (long long)opset);
    qcal_onnx_model *m = calloc(1, sizeof *m);   /* no file, no mapping */
    Onnx__ModelProto *mp = malloc(sizeof *mp);
    Onnx__GraphProto *g = malloc(sizeof *g);
    Onnx__OperatorSetIdProto *os = malloc(sizeof *os);
    if (!m || !mp || !g || !os) {
        free(m);
        free(mp);
        free(g);
        free(os);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    onnx__model_proto__init(mp);
    onnx__graph_proto__init(g);
    onnx__operator_set_id_proto__init(os);
    mp->graph = g;
    m->proto = mp;
    mp->has_ir_version = 1;
    mp->ir_version = ir_version;
    os->domain = qcal_strdup("");
    os->has_version = 1;
    os->version = opset;
    mp->producer_name = qcal_strdup("qcal");
    mp->producer_version = qcal_strdup(qcal_version());
    g->name = qcal_strdup("qcal");
    if (!os->domain || !mp->producer_name || !mp->producer_version || !g->name ||
        !onnx_push((void ***)&mp->opset_import, &mp->n_opset_import, os)) {
        if (mp->n_opset_import == 0)
            protobuf_c_message_free_unpacked(&os->base, NULL);
        qcal_onnx_model_destroy(&m);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    *out = m;
    return QCAL_OK;
}

static qcal_status add_vi(qcal_onnx_model *m, Onnx__ValueInfoProto ***arr, size_t *n, const char *name,
                          int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    if (!m || !name || ndim > QCAL_MAX_DIMS || (ndim > 0 && !dims))
        return qcal_error(QCAL_ERR_INVALID_ARG, "bad value info for '%s'", name ? name : "(null)");
    qcal_onnx_tensor_desc d = { elem_type, ndim < 0 ? -1 : ndim, { 0 } };
    for (int32_t k = 0; k < ndim; k++)
        d.dims[k] = dims[k];
    Onnx__ValueInfoProto *vi = onnx_new_value_info(name, &d);
    if (!vi || !onnx_push((void ***)arr, n, vi)) {
        if (vi)
            protobuf_c_message_free_unpacked(&vi->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    return QCAL_OK;
}

qcal_status qcal_onnx_model_add_input(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim,
                                      const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->input, &m->proto->graph->n_input, name, elem_type, ndim, dims);
}

qcal_status qcal_onnx_model_add_output(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim,
                                       const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->output, &m->proto->graph->n_output, name, elem_type, ndim, dims);
}

qcal_status qcal_onnx_model_add_value_info(qcal_onnx_model *m, const char *name, int32_t elem_type,
                                           int32_t ndim, const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->value_info, &m->proto->graph->n_value_info, name, elem_type,
                  ndim, dims);
}

qcal_status qcal_onnx_model_add_initializer(qcal_onnx_model *m, const char *name, int32_t elem_type,
                                            int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    if (!m || !name || ndim < 0 || (ndim > 0 && !dims) || (nbytes && !data))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_add_initializer: bad argument");
    Onnx__TensorProto *t = onnx_new_tensor(name, elem_type, ndim, dims, data, nbytes);
    Onnx__GraphProto *g = m->proto->graph;
    if (!t || !onnx_push((void ***)&g->initializer, &g->n_initializer, t)) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for initializer '%s'", name);
    }
    return QCAL_OK;
}

static qcal_status numel_of(int32_t ndim, const int64_t *dims, int64_t *n)
{
    int64_t v = 1;
    for (int32_t k = 0; k < ndim; k++)
        if (dims[k] < 0 || !qcal_mul_i64(v, dims[k], &v) || v > INT64_MAX / 8)
            return qcal_error(QCAL_ERR_INVALID_ARG, "bad shape");
    *n = v;
    return QCAL_OK;
}

qcal_status qcal_onnx_model_add_initializer_float(qcal_onnx_model *m, const char *name, int32_t ndim,
                                                  const int64_t *dims, const float *data)
{
    int64_t n = 0;
    if (ndim < 0 || (ndim > 0 && !dims) || numel_of(ndim, dims, &n) != QCAL_OK)
        return qcal_error(QCAL_ERR_INVALID_ARG, "initializer '%s': bad shape", name ? name : "");
    return qcal_onnx_model_add_initializer(m, name, QCAL_ONNX_FLOAT, ndim, dims, data, (size_t)n * 4);
}

qcal_status qcal_onnx_model_add_initializer_int64(qcal_onnx_model *m, const char *name, int32_t ndim,
                                                  const int64_t *dims, const int64_t *data)
{
    int64_t n = 0;
    if (ndim < 0 || (ndim > 0 && !dims) || numel_of(ndim, dims, &n) != QCAL_OK)
        return qcal_error(QCAL_ERR_INVALID_ARG, "initializer '%s': bad shape", name ? name : "");
    return qcal_onnx_model_add_initializer(m, name, QCAL_ONNX_INT64, ndim, dims, data, (size_t)n * 8);
}

qcal_status qcal_onnx_initializer_set_external(qcal_onnx_model *m, const char *name, const char *location,
                                               int64_t offset, int64_t length)
{
    if (!m || !name || !location || offset < 0 || length < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_set_external: bad argument");
    Onnx__TensorProto *t = (Onnx__TensorProto *)onnx_graph_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    char ob[32], lb[32];
    snprintf(ob, sizeof ob, "%lld", (long long)offset);
    snprintf(lb, sizeof lb, "%lld", (long long)length);
    if (!onnx_tensor_add_entry(t, "location", location) || !onnx_tensor_add_entry(t, "offset", ob) || !onnx_tensor_add_entry(t, "length", lb))
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    if (onnx_in_map(m, t->raw_data.data))
        onnx_tensor_release(m, t);
    else
        free(t->raw_data.data);
    t->raw_data.data = NULL;
    t->raw_data.len = 0;
    t->has_raw_data = 0;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    return QCAL_OK;
}

qcal_status qcal_onnx_model_add_node(qcal_onnx_model *m, const char *op_type, const char *name, int64_t n_inputs,
                                     const char *const *inputs, int64_t n_outputs, const char *const *outputs,
                                     int64_t *index)
{
    if (!m || !op_type || n_inputs < 0 || n_outputs < 0 || (n_inputs && !inputs) || (n_outputs && !outputs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_add_node: bad argument");
    for (int64_t i = 0; i < n_outputs; i++)
        if (!outputs[i])
            return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_add_node: NULL output name");
    Onnx__NodeProto *n = onnx_new_node(op_type, name, n_inputs, inputs, n_outputs, outputs);
    Onnx__GraphProto *g = m->proto->graph;
    if (!n || !onnx_push((void ***)&g->node, &g->n_node, n)) {
        if (n)
            protobuf_c_message_free_unpacked(&n->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    if (index)
        *index = (int64_t)g->n_node - 1;
    return QCAL_OK;
}

static Onnx__NodeProto *node_of(qcal_onnx_model *m, int64_t i)
{
    if (!m || i < 0 || (size_t)i >= m->proto->graph->n_node)
        return NULL;
    return m->proto->graph->node[i];
}

qcal_status qcal_onnx_node_set_int(qcal_onnx_model *m, int64_t node, const char *attr, int64_t value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    return onnx_node_add_int(n, attr, value) ? QCAL_OK : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
}

qcal_status qcal_onnx_node_set_ints(qcal_onnx_model *m, int64_t node, const char *attr, int64_t n,
                                    const int64_t *values)
{
    Onnx__NodeProto *nd = node_of(m, node);
    if (!nd || !attr || n < 0 || (n && !values))
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = onnx_node_add_attr(nd, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->ints = malloc((size_t)n * sizeof *a->ints + 1);
    if (!a->ints)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    if (n)
        memcpy(a->ints, values, (size_t)n * sizeof *a->ints);
    a->n_ints = (size_t)n;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_float(qcal_onnx_model *m, int64_t node, const char *attr, float value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = onnx_node_add_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->has_f = 1;
    a->f = value;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_string(qcal_onnx_model *m, int64_t node, const char *attr, const char *value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = onnx_node_add_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->s.data = (uint8_t *)qcal_strdup(value);
    if (!a->s.data)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->s.len = strlen(value);
    a->has_s = 1;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_tensor(qcal_onnx_model *m, int64_t node, const char *attr, int32_t elem_type,
                                      int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || ndim < 0 || ndim > QCAL_MAX_DIMS || (ndim && !dims) || (nbytes && !data))
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld or a bad tensor", (long long)node);
    Onnx__TensorProto *t = onnx_new_tensor("", elem_type, ndim, dims, data, nbytes);
    if (!t)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    Onnx__AttributeProto *a = onnx_node_add_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    if (!a) {
        protobuf_c_message_free_unpacked(&t->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    a->t = t;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_graph(qcal_onnx_model *m, int64_t node, const char *attr, qcal_onnx_model **body)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || !body || !*body)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld or no body", (long long)node);
    /* Data the body reads from its file mapping is copied: the mapping dies with *body. */
    Onnx__GraphProto *bg = (*body)->proto->graph;
    for (size_t i = 0; bg && (*body)->n_src && i < bg->n_initializer; i++) {
        Onnx__TensorProto *t = bg->initializer[i];
        if (!onnx_in_map(*body, t->raw_data.data))
            continue;
        uint8_t *copy = malloc(t->raw_data.len);
        if (!copy)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for %zu bytes", t->raw_data.len);
        memcpy(copy, t->raw_data.data, t->raw_data.len);
        t->raw_data.data = copy;
    }
    Onnx__AttributeProto *a = onnx_node_add_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->g = (*body)->proto->graph;
    (*body)->proto->graph = NULL;
    qcal_onnx_model_destroy(body);
    return QCAL_OK;
}
