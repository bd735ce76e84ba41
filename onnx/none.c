/* qcal built without ONNX support (meson -Donnx=disabled, or protobuf-c missing): every
 * call of qcal/onnx.h that needs it fails with QCAL_ERR_UNSUPPORTED and says why; the
 * frees still work, and profile names and option defaults come from options.c, compiled in
 * both builds. */
#include <string.h>

#include "core/internal.h"
#include "qcal/onnx.h"

#define NO_ONNX() qcal_error(QCAL_ERR_UNSUPPORTED, "qcal was built without ONNX support (protobuf-c; meson -Donnx)")

bool qcal_onnx_available(void)
{
    return false;
}

qcal_status qcal_onnx_model_load_file(const char *path, qcal_onnx_model **out)
{
    (void)path, (void)out;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_parse(const void *buf, size_t len, qcal_onnx_model **out)
{
    (void)buf, (void)len, (void)out;
    return NO_ONNX();
}

void qcal_onnx_model_destroy(qcal_onnx_model **m)
{
    if (m)
        *m = NULL;
}

qcal_status qcal_onnx_model_save_file(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path)
{
    (void)m, (void)opt, (void)path;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_serialize(const qcal_onnx_model *m, void **buf, size_t *len)
{
    (void)m, (void)buf, (void)len;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_get_info(const qcal_onnx_model *m, qcal_onnx_model_info *info)
{
    (void)m, (void)info;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_at(const qcal_onnx_model *m, int64_t i, qcal_onnx_node_info *out)
{
    (void)m, (void)i, (void)out;
    return NO_ONNX();
}

qcal_status qcal_onnx_input_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    (void)m, (void)i, (void)name;
    return NO_ONNX();
}

qcal_status qcal_onnx_output_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    (void)m, (void)i, (void)name;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_attr_int(const qcal_onnx_model *m, int64_t i, const char *attr, int64_t *value)
{
    (void)m, (void)i, (void)attr, (void)value;
    return NO_ONNX();
}

qcal_status qcal_onnx_tensor_get_desc(const qcal_onnx_model *m, const char *name, qcal_onnx_tensor_desc *out)
{
    (void)m, (void)name, (void)out;
    return NO_ONNX();
}

qcal_status qcal_onnx_initializer_float(const qcal_onnx_model *m, const char *name, float **data, qcal_onnx_tensor_desc *desc)
{
    (void)m, (void)name, (void)data, (void)desc;
    return NO_ONNX();
}

qcal_status qcal_onnx_initializer_int64(const qcal_onnx_model *m, const char *name, int64_t **data, qcal_onnx_tensor_desc *desc)
{
    (void)m, (void)name, (void)data, (void)desc;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_create(int64_t ir_version, int64_t opset, qcal_onnx_model **out)
{
    (void)ir_version, (void)opset, (void)out;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_input(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    (void)m, (void)name, (void)elem_type, (void)ndim, (void)dims;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_output(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    (void)m, (void)name, (void)elem_type, (void)ndim, (void)dims;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_value_info(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    (void)m, (void)name, (void)elem_type, (void)ndim, (void)dims;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_initializer(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    (void)m, (void)name, (void)elem_type, (void)ndim, (void)dims, (void)data, (void)nbytes;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_initializer_float(qcal_onnx_model *m, const char *name, int32_t ndim, const int64_t *dims, const float *data)
{
    (void)m, (void)name, (void)ndim, (void)dims, (void)data;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_initializer_int64(qcal_onnx_model *m, const char *name, int32_t ndim, const int64_t *dims, const int64_t *data)
{
    (void)m, (void)name, (void)ndim, (void)dims, (void)data;
    return NO_ONNX();
}

qcal_status qcal_onnx_initializer_set_external(qcal_onnx_model *m, const char *name, const char *location, int64_t offset, int64_t length)
{
    (void)m, (void)name, (void)location, (void)offset, (void)length;
    return NO_ONNX();
}

qcal_status qcal_onnx_model_add_node(qcal_onnx_model *m, const char *op_type, const char *name, int64_t n_inputs, const char *const *inputs, int64_t n_outputs, const char *const *outputs, int64_t *index)
{
    (void)m, (void)op_type, (void)name, (void)n_inputs, (void)inputs, (void)n_outputs, (void)outputs, (void)index;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_int(qcal_onnx_model *m, int64_t node, const char *attr, int64_t value)
{
    (void)m, (void)node, (void)attr, (void)value;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_ints(qcal_onnx_model *m, int64_t node, const char *attr, int64_t n, const int64_t *values)
{
    (void)m, (void)node, (void)attr, (void)n, (void)values;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_float(qcal_onnx_model *m, int64_t node, const char *attr, float value)
{
    (void)m, (void)node, (void)attr, (void)value;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_tensor(qcal_onnx_model *m, int64_t node, const char *attr, int32_t elem_type,
                                      int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    (void)m, (void)node, (void)attr, (void)elem_type, (void)ndim, (void)dims, (void)data, (void)nbytes;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_string(qcal_onnx_model *m, int64_t node, const char *attr, const char *value)
{
    (void)m, (void)node, (void)attr, (void)value;
    return NO_ONNX();
}

qcal_status qcal_onnx_node_set_graph(qcal_onnx_model *m, int64_t node, const char *attr, qcal_onnx_model **body)
{
    (void)m, (void)node, (void)attr, (void)body;
    return NO_ONNX();
}

qcal_status qcal_onnx_list(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, char ***names, int64_t *n)
{
    (void)m, (void)opt, (void)names, (void)n;
    return NO_ONNX();
}

qcal_status qcal_onnx_list_untyped(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, char ***names,
                                   int64_t *n)
{
    (void)m, (void)opt, (void)names, (void)n;
    return NO_ONNX();
}

void qcal_onnx_names_free(char ***names, int64_t n)
{
    (void)n;
    if (names)
        *names = NULL;
}

qcal_status qcal_onnx_expose(qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, int64_t *added)
{
    (void)m, (void)opt, (void)added;
    return NO_ONNX();
}

qcal_status qcal_onnx_qdq(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt, qcal_onnx_qdq_report *rep)
{
    (void)m, (void)table, (void)opt, (void)rep;
    return NO_ONNX();
}

qcal_status qcal_onnx_qdq_session(qcal_onnx_model *m, qcal_calib_session *s, const qcal_onnx_qdq_options *opt, qcal_onnx_qdq_report *rep)
{
    (void)m, (void)s, (void)opt, (void)rep;
    return NO_ONNX();
}

qcal_status qcal_onnx_qdq_save_file(qcal_onnx_model *m, const qcal_calib_table *table,
                                    const qcal_onnx_qdq_options *opt,
                                    const qcal_onnx_save_options *save, const char *path,
                                    qcal_onnx_qdq_report *rep)
{
    (void)m, (void)table, (void)opt, (void)save, (void)path, (void)rep;
    return NO_ONNX();
}

void qcal_onnx_qdq_report_free(qcal_onnx_qdq_report *rep)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
}

qcal_status qcal_onnx_fold_bn(qcal_onnx_model *m, qcal_onnx_fold_report *rep)
{
    (void)m, (void)rep;
    return NO_ONNX();
}

void qcal_onnx_fold_report_free(qcal_onnx_fold_report *rep)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
}

qcal_status qcal_onnx_weight_ranges(const qcal_onnx_model *m, qcal_onnx_layer_ranges **out, int64_t *n)
{
    (void)m, (void)out, (void)n;
    return NO_ONNX();
}

void qcal_onnx_layer_ranges_free(qcal_onnx_layer_ranges **r, int64_t n)
{
    (void)n;
    if (r)
        *r = NULL;
}

qcal_status qcal_onnx_equalize(qcal_onnx_model *m, const qcal_onnx_equalize_options *opt,
                               qcal_onnx_equalize_report *rep)
{
    (void)m, (void)opt, (void)rep;
    return NO_ONNX();
}

void qcal_onnx_equalize_report_free(qcal_onnx_equalize_report *rep)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
}

qcal_status qcal_onnx_upgrade(qcal_onnx_model *m, int64_t opset, qcal_onnx_upgrade_report *rep)
{
    (void)m, (void)opset, (void)rep;
    return NO_ONNX();
}

void qcal_onnx_upgrade_report_free(qcal_onnx_upgrade_report *rep)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
}

qcal_status qcal_onnx_gate(const qcal_onnx_model *q, const qcal_onnx_model *ref,
                           qcal_onnx_model **out, qcal_onnx_gate_op **ops, int64_t *n_ops)
{
    (void)q, (void)ref, (void)out, (void)ops, (void)n_ops;
    return NO_ONNX();
}

void qcal_onnx_gate_ops_free(qcal_onnx_gate_op **ops, int64_t n)
{
    (void)n;
    if (ops)
        *ops = NULL;
}
