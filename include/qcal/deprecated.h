/* qcal: the names public calls and types had before 0.2.0, kept for one release and
 * removed in the next (docs/architecture.md "Naming"; the list: docs/CHANGES.md). Each old
 * name is a static inline wrapper of the new call (or a typedef of the new type) marked
 * QCAL_DEPRECATED, so using one compiles, behaves the same and warns with the new name.
 * The library exports only the new symbols.
 *
 * No include guard: each public header that renamed something includes this file as its
 * last line after defining QCAL_<HEADER>_DECLARED, and the section for that header is
 * emitted once, when its declarations are complete (a header including another one first
 * cannot see wrappers of calls not yet declared). Define QCAL_NO_DEPRECATED to drop every
 * old name (qcal's own build does, so nothing in the tree uses one). */
#if !defined(QCAL_NO_DEPRECATED)
#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- accuracy.h ---- */
#if defined(QCAL_ACCURACY_DECLARED) && !defined(QCAL_ACCURACY_DEPRECATED)
#define QCAL_ACCURACY_DEPRECATED
typedef qcal_accuracy_keep_float_target qcal_keep_float_target
    QCAL_DEPRECATED("use qcal_accuracy_keep_float_target");
typedef qcal_accuracy_keep_float_result qcal_keep_float_result
    QCAL_DEPRECATED("use qcal_accuracy_keep_float_result");
QCAL_DEPRECATED("use qcal_accuracy_compare")
static inline qcal_status qcal_model_compare(qcal_engine *e, const qcal_onnx_model *float_m,
    const qcal_onnx_model *qdq_m, const qcal_onnx_model *ref, const char *data,
    const char *const *entries, int64_t n_entries, const qcal_accuracy_options *opt,
    qcal_accuracy_report *rep)
{
    return qcal_accuracy_compare(e, float_m, qdq_m, ref, data, entries, n_entries, opt, rep);
}
QCAL_DEPRECATED("use qcal_accuracy_keep_float")
static inline qcal_status qcal_model_keep_float(qcal_engine *e, const qcal_onnx_model *m,
    const qcal_calib_table *table, const qcal_onnx_qdq_options *qopt, const char *data,
    const char *const *entries, int64_t n_entries, const qcal_accuracy_options *opt,
    const qcal_accuracy_keep_float_target *target, qcal_accuracy_keep_float_result *res)
{
    return qcal_accuracy_keep_float(e, m, table, qopt, data, entries, n_entries, opt, target,
                                    res);
}
QCAL_DEPRECATED("use qcal_accuracy_keep_float_exclude")
static inline char *qcal_keep_float_exclude(const char *node_name)
{
    return qcal_accuracy_keep_float_exclude(node_name);
}
QCAL_DEPRECATED("use qcal_accuracy_keep_float_result_free")
static inline void qcal_keep_float_result_free(qcal_accuracy_keep_float_result *res)
{
    qcal_accuracy_keep_float_result_free(res);
}
#endif

/* ---- calib.h ---- */
#if defined(QCAL_CALIB_DECLARED) && !defined(QCAL_CALIB_DEPRECATED)
#define QCAL_CALIB_DEPRECATED
QCAL_DEPRECATED("use qcal_calib_rules_load_file")
static inline qcal_status qcal_calib_rules_load(const char *path, qcal_calib_rules **out)
{
    return qcal_calib_rules_load_file(path, out);
}
QCAL_DEPRECATED("use qcal_calib_table_trt_algorithm")
static inline const char *qcal_calib_trt_algorithm(const qcal_calib_table *t)
{
    return qcal_calib_table_trt_algorithm(t);
}
#endif

/* ---- calib_dump.h ---- */
#if defined(QCAL_CALIB_DUMP_DECLARED) && !defined(QCAL_CALIB_DUMP_DEPRECATED)
#define QCAL_CALIB_DUMP_DEPRECATED
QCAL_DEPRECATED("use qcal_calib_dump_name_decode")
static inline qcal_status qcal_calib_name_decode(const char *src, char *dst, size_t cap)
{
    return qcal_calib_dump_name_decode(src, dst, cap);
}
QCAL_DEPRECATED("use qcal_calib_dump_parse")
static inline qcal_status qcal_calib_manifest_parse(const char *text, size_t len,
    qcal_calib_dump **out)
{
    return qcal_calib_dump_parse(text, len, out);
}
#endif

/* ---- numeric_eval.h (qcal/evaluate.h before 0.2.0) ---- */
#if defined(QCAL_NUMERIC_EVAL_DECLARED) && !defined(QCAL_NUMERIC_EVAL_DEPRECATED)
#define QCAL_NUMERIC_EVAL_DEPRECATED
typedef qcal_numeric_eval_report_options qcal_numeric_report_options
    QCAL_DEPRECATED("use qcal_numeric_eval_report_options");
QCAL_DEPRECATED("use qcal_numeric_eval_report_options_default")
static inline void qcal_numeric_report_options_default(qcal_numeric_eval_report_options *opt)
{
    qcal_numeric_eval_report_options_default(opt);
}
#endif

/* ---- engine.h ---- */
#if defined(QCAL_ENGINE_DECLARED) && !defined(QCAL_ENGINE_DEPRECATED)
#define QCAL_ENGINE_DEPRECATED
QCAL_DEPRECATED("use qcal_engine_session_run")
static inline qcal_status qcal_engine_run(qcal_engine_session *s,
    const qcal_engine_value *inputs, int64_t n_inputs, const char *const *outputs,
    int64_t n_outputs, qcal_engine_outputs **out)
{
    return qcal_engine_session_run(s, inputs, n_inputs, outputs, n_outputs, out);
}
#endif

/* ---- model_calib.h ---- */
#if defined(QCAL_MODEL_CALIB_DECLARED) && !defined(QCAL_MODEL_CALIB_DEPRECATED)
#define QCAL_MODEL_CALIB_DEPRECATED
QCAL_DEPRECATED("use qcal_model_calib_run")
static inline qcal_status qcal_model_calibrate(qcal_engine *e, const qcal_onnx_model *m,
    const char *data, const char *const *entries, int64_t n_entries, qcal_calib_session *s,
    const qcal_model_calib_options *opt, qcal_model_calib_report *rep)
{
    return qcal_model_calib_run(e, m, data, entries, n_entries, s, opt, rep);
}
#endif

/* ---- observers/histogram.h ---- */
#if defined(QCAL_OBSERVERS_HISTOGRAM_DECLARED) && !defined(QCAL_OBSERVERS_HISTOGRAM_DEPRECATED)
#define QCAL_OBSERVERS_HISTOGRAM_DEPRECATED
QCAL_DEPRECATED("use qcal_observer_histogram_search_curve")
static inline qcal_status qcal_observer_search_curve(const qcal_observer *obs, int64_t cap,
    float *lo, float *hi, double *err, int64_t *n, int64_t *chosen)
{
    return qcal_observer_histogram_search_curve(obs, cap, lo, hi, err, n, chosen);
}
QCAL_DEPRECATED("use qcal_observer_histogram_torch_get")
static inline qcal_status qcal_observer_torch_histogram(const qcal_observer *obs, int64_t cap,
    float *counts, float *min_val, float *max_val, int64_t *n)
{
    return qcal_observer_histogram_torch_get(obs, cap, counts, min_val, max_val, n);
}
QCAL_DEPRECATED("use qcal_observer_histogram_torch_set")
static inline qcal_status qcal_observer_torch_histogram_set(qcal_observer *obs,
    const float *counts, int64_t n, float min_val, float max_val)
{
    return qcal_observer_histogram_torch_set(obs, counts, n, min_val, max_val);
}
#endif

/* ---- onnx.h ---- */
#if defined(QCAL_ONNX_DECLARED) && !defined(QCAL_ONNX_DEPRECATED)
#define QCAL_ONNX_DEPRECATED
QCAL_DEPRECATED("use qcal_onnx_model_create")
static inline qcal_status qcal_onnx_model_new(int64_t ir_version, int64_t opset,
    qcal_onnx_model **out)
{
    return qcal_onnx_model_create(ir_version, opset, out);
}
QCAL_DEPRECATED("use qcal_onnx_model_load_file")
static inline qcal_status qcal_onnx_model_load(const char *path, qcal_onnx_model **out)
{
    return qcal_onnx_model_load_file(path, out);
}
QCAL_DEPRECATED("use qcal_onnx_model_save_file")
static inline qcal_status qcal_onnx_model_save(qcal_onnx_model *m,
    const qcal_onnx_save_options *opt, const char *path)
{
    return qcal_onnx_model_save_file(m, opt, path);
}
QCAL_DEPRECATED("use qcal_onnx_qdq_save_file")
static inline qcal_status qcal_onnx_qdq_save(qcal_onnx_model *m, const qcal_calib_table *table,
    const qcal_onnx_qdq_options *opt, const qcal_onnx_save_options *save, const char *path,
    qcal_onnx_qdq_report *rep)
{
    return qcal_onnx_qdq_save_file(m, table, opt, save, path, rep);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_input")
static inline qcal_status qcal_onnx_add_input(qcal_onnx_model *m, const char *name,
    int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    return qcal_onnx_model_add_input(m, name, elem_type, ndim, dims);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_output")
static inline qcal_status qcal_onnx_add_output(qcal_onnx_model *m, const char *name,
    int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    return qcal_onnx_model_add_output(m, name, elem_type, ndim, dims);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_value_info")
static inline qcal_status qcal_onnx_add_value_info(qcal_onnx_model *m, const char *name,
    int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    return qcal_onnx_model_add_value_info(m, name, elem_type, ndim, dims);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_initializer")
static inline qcal_status qcal_onnx_add_initializer(qcal_onnx_model *m, const char *name,
    int32_t elem_type, int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    return qcal_onnx_model_add_initializer(m, name, elem_type, ndim, dims, data, nbytes);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_initializer_float")
static inline qcal_status qcal_onnx_add_initializer_float(qcal_onnx_model *m, const char *name,
    int32_t ndim, const int64_t *dims, const float *data)
{
    return qcal_onnx_model_add_initializer_float(m, name, ndim, dims, data);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_initializer_int64")
static inline qcal_status qcal_onnx_add_initializer_int64(qcal_onnx_model *m, const char *name,
    int32_t ndim, const int64_t *dims, const int64_t *data)
{
    return qcal_onnx_model_add_initializer_int64(m, name, ndim, dims, data);
}
QCAL_DEPRECATED("use qcal_onnx_model_add_node")
static inline qcal_status qcal_onnx_add_node(qcal_onnx_model *m, const char *op_type,
    const char *name, int64_t n_inputs, const char *const *inputs, int64_t n_outputs,
    const char *const *outputs, int64_t *index)
{
    return qcal_onnx_model_add_node(m, op_type, name, n_inputs, inputs, n_outputs, outputs,
                                    index);
}
#endif

/* ---- qparams.h ---- */
#if defined(QCAL_QPARAMS_DECLARED) && !defined(QCAL_QPARAMS_DEPRECATED)
#define QCAL_QPARAMS_DEPRECATED
QCAL_DEPRECATED("use qcal_dtype_float8_max")
static inline float qcal_float8_max(qcal_dtype dtype)
{
    return qcal_dtype_float8_max(dtype);
}
#endif

/* ---- threads.h ---- */
#if defined(QCAL_THREADS_DECLARED) && !defined(QCAL_THREADS_DEPRECATED)
#define QCAL_THREADS_DEPRECATED
QCAL_DEPRECATED("use qcal_threads_set_count")
static inline qcal_status qcal_set_num_threads(int n)
{
    return qcal_threads_set_count(n);
}
QCAL_DEPRECATED("use qcal_threads_count")
static inline int qcal_get_num_threads(void)
{
    return qcal_threads_count();
}
#endif

#ifdef __cplusplus
}
#endif
#endif /* QCAL_NO_DEPRECATED */
