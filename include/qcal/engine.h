/* qcal's engine: ONNX Runtime, loaded at run time through its C API (dlopen of
 * libonnxruntime.so.1; nothing of ONNX Runtime is needed to build qcal). Used to run a model
 * on calibration data and stream its tensors into observers (qcal/model_calib.h), and to
 * compare float and quantized models.
 *
 *   qcal_engine *e = NULL;
 *   qcal_engine_open(NULL, &e);                      // QCAL_ORT_LIB, loader path, npm cache
 *   qcal_engine_session *s = NULL;
 *   qcal_engine_session_create(e, model_bytes, len, NULL, &s);
 *   qcal_engine_value in = {"x", QCAL_ONNX_FLOAT, 4, {1, 3, 48, 320}, data, nbytes};
 *   qcal_engine_outputs *out = NULL;
 *   qcal_engine_session_run(s, &in, 1, NULL, 0, &out);       // every model output
 *   ... qcal_engine_outputs_at(out, i, &v) ...
 *   qcal_engine_outputs_free(&out);
 *   qcal_engine_session_destroy(&s);
 *   qcal_engine_close(&e);
 *
 * Element types are ONNX's TensorProto numbers (QCAL_ONNX_FLOAT, ... in qcal/onnx.h; ONNX
 * Runtime uses the same numbers). String tensors are not supported. Every failure of ONNX
 * Runtime itself is QCAL_ERR_BACKEND with its message passed through. */
#ifndef QCAL_ENGINE_H
#define QCAL_ENGINE_H

#include "qcal/common.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qcal_engine qcal_engine;
typedef struct qcal_engine_session qcal_engine_session;
typedef struct qcal_engine_outputs qcal_engine_outputs;

typedef struct qcal_engine_options {
    const char *library;   /* default NULL: $QCAL_ORT_LIB, else "libonnxruntime.so.1" on the
                            * loader's search path, else the npm cache ($QCAL_NPM_DIR, else
                            * ${XDG_CACHE_HOME:-$HOME/.cache}/qcal/npm) where ./run.sh installs
                            * onnxruntime-node: node_modules/onnxruntime-node/bin/napi-v6/
                            * linux/x64/libonnxruntime.so.1. A path given here is the only
                            * place tried. */
} qcal_engine_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_engine_options_default(qcal_engine_options *opt);

/* Loads ONNX Runtime (opt NULL = defaults) and creates its environment; *out owned by the
 * caller. No library found, or a library that is not ONNX Runtime (no OrtGetApiBase, or no
 * API version 1): QCAL_ERR_NOT_FOUND / QCAL_ERR_UNSUPPORTED, the message naming each place
 * tried and how to get the library. */
QCAL_API qcal_status qcal_engine_open(const qcal_engine_options *opt, qcal_engine **out);

/* Closes the engine (NULL is fine; no session of it may be alive) and sets *e to NULL. */
QCAL_API void qcal_engine_close(qcal_engine **e);

/* ONNX Runtime's GetVersionString() ("1.30.0"), valid while e lives. */
QCAL_API const char *qcal_engine_version(const qcal_engine *e);

/* The path of the library that was loaded, valid while e lives. */
QCAL_API const char *qcal_engine_library(const qcal_engine *e);

typedef struct qcal_engine_session_options {
    int optimization;      /* default 0: graph optimizations disabled (what a calibration run
                            * wants: every tensor computed as the model says); 1 basic,
                            * 2 extended, 99 all (ONNX Runtime's levels) */
    int threads;           /* default 0: qcal_threads_count() intra-op threads; > 0: that many */
    const char *optimized_model_path; /* default NULL; a path: ONNX Runtime saves the optimized
                            * graph there (to check which kernels it chose) */
    bool cpu_arena;        /* default true: ONNX Runtime's CPU memory arena (memory freed is
                            * kept for later runs); false: each tensor allocated and freed on
                            * its own, so a result released early returns its memory at once */
    bool stop_spinning;    /* default false: ONNX Runtime's intra-op threads spin-wait for
                            * work for a while after Run returns, as ONNX Runtime does by
                            * default; true: they stop when Run returns and sleep until the
                            * next Run (its "session.force_spinning_stop"), leaving the cores
                            * to the caller's own work between runs. ONNX Runtime before
                            * 1.5 has no such setting: ignored there */
} qcal_engine_session_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_engine_session_options_default(qcal_engine_session_options *opt);

/* A session for the serialized model model[0..len) (the buffer may be freed after the
 * call), opt NULL = defaults. A model ONNX Runtime refuses: QCAL_ERR_BACKEND with its
 * message. */
QCAL_API qcal_status qcal_engine_session_create(qcal_engine *e, const void *model, size_t len,
                                                const qcal_engine_session_options *opt,
                                                qcal_engine_session **out);

/* The same from a model file (external data next to it is found by ONNX Runtime). */
QCAL_API qcal_status qcal_engine_session_create_file(qcal_engine *e, const char *path,
                                                     const qcal_engine_session_options *opt,
                                                     qcal_engine_session **out);

/* Destroys *s (NULL is fine) and sets *s to NULL. */
QCAL_API void qcal_engine_session_destroy(qcal_engine_session **s);

/* A model input or output as the session declares it. */
typedef struct qcal_engine_io {
    const char *name;       /* owned by the session */
    int32_t elem_type;      /* ONNX element type; 0 when not a tensor */
    int32_t ndim;           /* -1: rank unknown */
    int64_t dims[QCAL_MAX_DIMS]; /* -1: dynamic (symbolic) dimension */
} qcal_engine_io;

/* Number of inputs / outputs of the session's model. */
QCAL_API int64_t qcal_engine_session_input_count(const qcal_engine_session *s);
QCAL_API int64_t qcal_engine_session_output_count(const qcal_engine_session *s);

/* Input / output i (0-based). */
QCAL_API qcal_status qcal_engine_session_input(const qcal_engine_session *s, int64_t i,
                                               qcal_engine_io *out);
QCAL_API qcal_status qcal_engine_session_output(const qcal_engine_session *s, int64_t i,
                                                qcal_engine_io *out);

/* A tensor handed to or returned by a run: C order, little-endian, data of nbytes bytes. */
typedef struct qcal_engine_value {
    const char *name;
    int32_t elem_type;
    int32_t ndim;
    int64_t dims[QCAL_MAX_DIMS];
    const void *data;
    size_t nbytes;
} qcal_engine_value;

/* Runs the model once. inputs: every model input by name (read only; not copied, so they
 * must stay valid during the call); their types and shapes are checked against the model
 * first (QCAL_ERR_MISMATCH naming the input, what the model wants and what was given).
 * outputs: names of the outputs wanted (NULL, 0: every output of the model, in model
 * order). *out (owned by the caller) holds them in that order; an output that ONNX Runtime
 * returns aliasing an input is copied. Thread-safe for distinct sessions; one session may
 * run on several threads at once (ONNX Runtime allows it). */
QCAL_API qcal_status qcal_engine_session_run(qcal_engine_session *s,
                                             const qcal_engine_value *inputs, int64_t n_inputs,
                                             const char *const *outputs, int64_t n_outputs,
                                             qcal_engine_outputs **out);

/* Number of values in a run's result. */
QCAL_API int64_t qcal_engine_outputs_count(const qcal_engine_outputs *o);

/* Value i of a run's result (pointers valid until qcal_engine_outputs_free). */
QCAL_API qcal_status qcal_engine_outputs_at(const qcal_engine_outputs *o, int64_t i,
                                            qcal_engine_value *out);

/* Frees value i of a run's result before the rest (its data is then NULL, nbytes 0): a
 * caller done with one tensor gives its memory back while it works on the others. */
QCAL_API qcal_status qcal_engine_outputs_release(qcal_engine_outputs *o, int64_t i);

/* Frees a run's result (NULL is fine) and sets *o to NULL. */
QCAL_API void qcal_engine_outputs_free(qcal_engine_outputs **o);

/* Bytes per element of an ONNX element type qcal exchanges with the engine (float32,
 * float16, bfloat16, float64, int8, uint8, int16, uint16, int32, int64, bool); 0 otherwise. */
QCAL_API size_t qcal_engine_elem_size(int32_t elem_type);

/* Name of an ONNX element type ("float32", "int64", "bool", ...) or "unknown". */
QCAL_API const char *qcal_engine_elem_name(int32_t elem_type);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_ENGINE_DECLARED
#include "qcal/deprecated.h"
#endif
