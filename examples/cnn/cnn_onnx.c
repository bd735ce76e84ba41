/* The demo CNN as an ONNX model through qcal's public ONNX builder (see cnn_onnx.h). */
#include "cnn_onnx.h"

#include <stdio.h>
#include <string.h>

const cnn_onnx_names cnn_onnx_names_torch = {
    .input = "input",
    .conv1 = "/conv1/Conv_output_0", .relu1 = "/relu1/Relu_output_0",
    .pool1 = "/pool1/MaxPool_output_0",
    .conv2 = "/conv2/Conv_output_0", .relu2 = "/relu2/Relu_output_0",
    .pool2 = "/pool2/MaxPool_output_0",
    .flatten = "/flatten/Flatten_output_0",
    .fc1 = "/fc1/Gemm_output_0", .relu3 = "/relu3/Relu_output_0",
    .logits = "logits",
};

const cnn_onnx_names cnn_onnx_names_demo = {
    .input = "conv1",
    .conv1 = "conv1.out", .relu1 = "conv1.relu", .pool1 = "conv2",
    .conv2 = "conv2.out", .relu2 = "conv2.relu", .pool2 = "fc1",
    .flatten = "fc1.flat",
    .fc1 = "fc1.out", .relu3 = "fc2",
    .logits = "logits",
};

const cnn_onnx_names cnn_onnx_names_demo_relu = {
    .input = "conv1",
    .conv1 = "conv1.out", .relu1 = "conv2", .pool1 = "conv2.pooled",
    .conv2 = "conv2.out", .relu2 = "fc1", .pool2 = "fc1.pooled",
    .flatten = "fc1.flat",
    .fc1 = "fc1.out", .relu3 = "fc2",
    .logits = "logits",
};

qcal_status cnn_onnx_demo_names(const cnn_model *m, const qcal_calib_table *table, const cnn_onnx_names **out)
{
    const cnn_onnx_names *sets[2] = {&cnn_onnx_names_demo, &cnn_onnx_names_demo_relu};
    char missing[256] = "";
    for (int k = 0; k < 2; k++) {
        qcal_onnx_model *o = NULL;
        char **names = NULL;
        int64_t n = 0;
        qcal_status st = cnn_onnx_build(m, sets[k], &o);
        if (st == QCAL_OK)
            st = qcal_onnx_list(o, NULL, &names, &n);
        qcal_onnx_model_destroy(&o);
        if (st != QCAL_OK)
            return st;
        bool all = true;
        for (int64_t i = 0; i < n && all; i++) {
            const qcal_calib_entry *e = NULL;
            if (strcmp(names[i], sets[k]->logits) &&
                qcal_calib_table_find(table, names[i], QCAL_CALIB_ROLE_ACTIVATION, &e) != QCAL_OK) {
                all = false;
                snprintf(missing, sizeof missing, "%s", names[i]);
            }
        }
        qcal_clear_error();
        qcal_onnx_names_free(&names, n);
        if (all) {
            *out = sets[k];
            return QCAL_OK;
        }
    }
    return qcal_set_error(QCAL_ERR_NOT_FOUND, "the ONNX model's tensor '%s' has no entry in the demo's table",
                          missing);
}

#define TRY(x)                      \
    do {                            \
        if ((st = (x)) != QCAL_OK)  \
            goto fail;              \
    } while (0)

static qcal_status add_params(qcal_onnx_model *o, const cnn_model *m)
{
    for (int i = 0; i < CNN_NPARAMS; i++) {
        int64_t shape[4];
        int nd = cnn_param_shape(i, shape);
        qcal_status st = qcal_onnx_model_add_initializer_float(o, cnn_param_name(i), nd, shape, m->param[i]);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

/* One node with a single output; *idx gets its index. */
static qcal_status node(qcal_onnx_model *o, const char *op, const char *name, int nin, const char *const *in,
                        const char *out, int64_t *idx)
{
    return qcal_onnx_model_add_node(o, op, name, nin, in, 1, &out, idx);
}

qcal_status cnn_onnx_build(const cnn_model *m, const cnn_onnx_names *n, qcal_onnx_model **out)
{
    qcal_onnx_model *o = NULL;
    qcal_status st;
    int64_t k;
    static const int64_t k3[2] = {3, 3}, pad1[4] = {1, 1, 1, 1}, k2[2] = {2, 2};
    const int64_t in_dims[4] = {-1, 1, 28, 28}, out_dims[2] = {-1, CNN_CLASSES};

    TRY(qcal_onnx_model_create(8, 13, &o));
    TRY(qcal_onnx_model_add_input(o, n->input, QCAL_ONNX_FLOAT, 4, in_dims));
    TRY(add_params(o, m));
    /* conv1 / conv2 blocks: Conv -> Relu -> MaxPool */
    for (int b = 0; b < 2; b++) {
        const char *x = b ? n->pool1 : n->input;
        const char *c = b ? n->conv2 : n->conv1, *r = b ? n->relu2 : n->relu1, *p = b ? n->pool2 : n->pool1;
        const char *conv_in[3] = {x, cnn_param_name(2 * b), cnn_param_name(2 * b + 1)};
        TRY(node(o, "Conv", b ? "/conv2/Conv" : "/conv1/Conv", 3, conv_in, c, &k));
        TRY(qcal_onnx_node_set_ints(o, k, "kernel_shape", 2, k3));
        TRY(qcal_onnx_node_set_ints(o, k, "pads", 4, pad1));
        TRY(node(o, "Relu", b ? "/relu2/Relu" : "/relu1/Relu", 1, &c, r, NULL));
        TRY(node(o, "MaxPool", b ? "/pool2/MaxPool" : "/pool1/MaxPool", 1, &r, p, &k));
        TRY(qcal_onnx_node_set_ints(o, k, "kernel_shape", 2, k2));
        TRY(qcal_onnx_node_set_ints(o, k, "strides", 2, k2));
    }
    /* Flatten in NCHW order (torch.flatten) */
    TRY(node(o, "Flatten", "/flatten/Flatten", 1, &n->pool2, n->flatten, &k));
    TRY(qcal_onnx_node_set_int(o, k, "axis", 1));
    /* fc1 -> Relu -> fc2: Gemm with the [out, in] PyTorch weight, transB = 1 */
    const char *fc1_in[3] = {n->flatten, cnn_param_name(CNN_FC1_W), cnn_param_name(CNN_FC1_B)};
    TRY(node(o, "Gemm", "/fc1/Gemm", 3, fc1_in, n->fc1, &k));
    TRY(qcal_onnx_node_set_int(o, k, "transB", 1));
    TRY(node(o, "Relu", "/relu3/Relu", 1, &n->fc1, n->relu3, NULL));
    const char *fc2_in[3] = {n->relu3, cnn_param_name(CNN_FC2_W), cnn_param_name(CNN_FC2_B)};
    TRY(node(o, "Gemm", "/fc2/Gemm", 3, fc2_in, n->logits, &k));
    TRY(qcal_onnx_node_set_int(o, k, "transB", 1));
    TRY(qcal_onnx_model_add_output(o, n->logits, QCAL_ONNX_FLOAT, 2, out_dims));
    *out = o;
    return QCAL_OK;
fail:
    qcal_onnx_model_destroy(&o);
    return st;
}
