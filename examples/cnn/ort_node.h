/* ONNX Runtime through Node for the examples: runs tests/ort/ort_run.cjs (onnxruntime-node,
 * installed by ./run.sh into $QCAL_NPM_DIR, default ${XDG_CACHE_HOME:-~/.cache}/qcal/npm) on
 * a .npy batch. Example code: it spawns a process; the library never needs Node. */
#ifndef QCAL_EXAMPLES_ORT_NODE_H
#define QCAL_EXAMPLES_ORT_NODE_H

#include <stdbool.h>
#include <stddef.h>

#include <qcal/common.h>

/* Whether node and onnxruntime-node are there; if not, why[cap] gets a one-line reason. On
 * success, version[vcap] gets onnxruntime-node's version ("1.30.0"). */
bool ort_node_available(char *why, size_t cap, char *version, size_t vcap);

/* node ort_run.cjs MODEL X_NPY --out OUT_NPY --threads N --precision high (ONNX Runtime's
 * U8U8 kernels, see docs/onnx.md), its stdout and stderr to log_path; *secs gets the wall
 * time (node start, session creation and the run). A non-zero exit is QCAL_ERR_IO naming
 * the log. */
qcal_status ort_node_run(const char *model, const char *x_npy, const char *out_npy, const char *log_path,
                         int threads, double *secs);

#endif
