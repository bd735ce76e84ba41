/* The demo CNN as an ONNX model, written with qcal's ONNX builder (include/qcal/onnx.h):
 *
 *   input [N,1,28,28] -> Conv(conv1, pads 1) -> Relu -> MaxPool(2, 2)
 *                     -> Conv(conv2, pads 1) -> Relu -> MaxPool(2, 2) -> Flatten(axis 1)
 *                     -> Gemm(fc1, transB 1) -> Relu -> Gemm(fc2, transB 1) -> logits [N,10]
 *
 * default-domain opset 13, IR version 8; the initializers are the float32 parameters under
 * their PyTorch names (conv1.weight [32,1,3,3], ...), so the ONNX model computes exactly the
 * float CNN of cnn.h (the same as torch.onnx.export of the PyTorch twin). Tensor names are
 * the caller's choice (cnn_onnx_names). */
#ifndef QCAL_EXAMPLES_CNN_ONNX_H
#define QCAL_EXAMPLES_CNN_ONNX_H

#include <qcal/onnx.h>

#include "cnn.h"

/* Names of the model's tensors (graph input, every node output; the last is the graph
 * output). */
typedef struct cnn_onnx_names {
    const char *input;
    const char *conv1, *relu1, *pool1;
    const char *conv2, *relu2, *pool2;
    const char *flatten;
    const char *fc1, *relu3;
    const char *logits;
} cnn_onnx_names;

/* The names torch.onnx.export (PyTorch >= 1.13) gives a module with children conv1, relu1,
 * pool1, ...: "input", "/conv1/Conv_output_0", "/relu1/Relu_output_0", ..., "logits". */
extern const cnn_onnx_names cnn_onnx_names_torch;

/* Names that match the demo's calibration tables, whose activation entries are named after
 * the layer they feed (conv1, conv2, fc1, fc2): the model input is "conv1", the max-pool
 * output that conv2 reads is "conv2", the max-pool output that fc1 reads through the Flatten
 * is "fc1", fc1's ReLU output is "fc2". Profile ort looks up the model input, each layer's
 * output after its ReLU and max-pool (a ReLU output takes the qparams of the max-pool after
 * it; Flatten keeps them) and the logits, so a
 * demo table drives qcal_onnx_qdq as it drives qcal_int8_net_from_table: the same qparams at
 * the same points. cnn_onnx_names_demo_relu names the ReLU outputs instead ("conv2" is the
 * ReLU before pool1), for a qcal_onnx_qdq that looks up the ReLU output itself;
 * cnn_onnx_demo_names picks the one whose lookups the table answers. */
extern const cnn_onnx_names cnn_onnx_names_demo;
extern const cnn_onnx_names cnn_onnx_names_demo_relu;

/* The demo naming (of the two above) under which every activation tensor profile ort looks
 * up in m's ONNX model, but the logits, is an activation entry of table; QCAL_ERR_NOT_FOUND
 * naming a missing tensor if neither. */
qcal_status cnn_onnx_demo_names(const cnn_model *m, const qcal_calib_table *table, const cnn_onnx_names **out);

/* The ONNX model of m with the given names (*out owned by the caller). */
qcal_status cnn_onnx_build(const cnn_model *m, const cnn_onnx_names *names, qcal_onnx_model **out);

#endif
