/* qcal._qcal, ONNX part: models loaded by libqcal (qcal/onnx.h), run in ONNX Runtime through
 * the engine (qcal/engine.h, loaded at run time) with every tensor a profile quantizes
 * streamed into a qcal.Session (qcal/model_calib.h), and Q/DQ models written from a table.
 * The package's qcal.onnx (python/qcal/onnx.py) drives the two types here:
 *
 *   _OnnxModel(path=None, data=None, fold_bn=True, opset=0): a model, BatchNormalizations
 *       folded as the CLI folds them before listing, calibrating and qdq (so names agree),
 *       after raising its opset to `opset` when below (the CLI's loading: 13);
 *   _ModelCalib(model, session, ...): ONNX Runtime opened, a qcal_model_calib on the model;
 *       feed({name: array}) runs once (the GIL released while the model runs and while the
 *       observers of the previous run finish), feed_data(spec, entries) runs a data spec as
 *       `qcal calibrate --data` does, finish() -> report dict;
 *   _OnnxModel.keep_float(table, data, ...): the keep-float search of `qcal qdq
 *       --min-output-sqnr / --max-drop` (qcal/accuracy.h) on the model, which it leaves as is;
 *   _model_compare(float, qdq, ref, data, ...): `qcal compare`, its JSON as a dict.
 *
 * The accuracy calls read their data as a data spec (qcal_accuracy_compare and
 * qcal_accuracy_keep_float open it themselves; qcal.onnx writes runs given as arrays to a
 * temporary directory first); labels are read in place.
 *
 * Arrays are read in place through the buffer protocol: C-contiguous, little-endian, one of
 * the element types the engine exchanges (the package makes contiguous copies of other
 * arrays; dtypes are never converted: the engine refuses one the model does not take, naming
 * the input, what the model wants and what was given). */
#include "_qcal_shared.h"

#include <math.h>
#include <string.h>

#include <qcal/accuracy.h>
#include <qcal/engine.h>
#include <qcal/model_calib.h>

/* ---- helpers ------------------------------------------------------------------------- */

/* Strings of a list / tuple of str (None: none): *out (n + 1 slots, NULL-terminated) points
 * into the str objects, which *keep holds. 0 or -1 with an exception. */
static int str_list(PyObject *o, const char *what, PyObject **keep, const char ***out,
                    int64_t *n)
{
    *keep = NULL;
    *out = NULL;
    *n = 0;
    if (o == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(o, what);
    if (!seq)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    const char **v = PyMem_Calloc((size_t)len + 1, sizeof *v);
    if (!v) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(it)) {
            PyErr_Format(PyExc_TypeError, "%s: expected str items, got %.100s", what,
                         Py_TYPE(it)->tp_name);
            goto fail;
        }
        if (!(v[i] = PyUnicode_AsUTF8(it)))
            goto fail;
    }
    *keep = seq;
    *out = v;
    *n = len;
    return 0;
fail:
    PyMem_Free(v);
    Py_DECREF(seq);
    return -1;
}

static void str_list_free(PyObject **keep, const char ***v)
{
    Py_CLEAR(*keep);
    PyMem_Free((void *)*v);
    *v = NULL;
}

static PyObject *names_list(char **names, int64_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        PyObject *s = PyUnicode_FromString(names[i] ? names[i] : "");
        if (!s) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, s);
    }
    return l;
}

static PyObject *engine_io_tuple(const qcal_engine_io *io)
{
    PyObject *dims;
    if (io->ndim < 0) {
        dims = Py_NewRef(Py_None);
    } else {
        dims = PyTuple_New(io->ndim);
        for (int32_t k = 0; dims && k < io->ndim; k++) {
            PyObject *d = io->dims[k] < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(io->dims[k]);
            if (!d) {
                Py_CLEAR(dims);
                break;
            }
            PyTuple_SET_ITEM(dims, k, d);
        }
    }
    if (!dims)
        return NULL;
    return Py_BuildValue("(ssN)", io->name ? io->name : "", qcal_engine_elem_name(io->elem_type),
                         dims);
}

/* ---- _OnnxModel ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    qcal_onnx_model *m;
    PyObject *folded;     /* list of "CONV <- BN" */
    bool busy;            /* a call is using m with the GIL released */
    bool rewritten;       /* qdq_save changed m: it is the quantized model now */
} OnnxModelObject;

static PyTypeObject OnnxModelType;

static void OnnxModel_dealloc(OnnxModelObject *self)
{
    qcal_onnx_model_destroy(&self->m);
    Py_CLEAR(self->folded);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int OnnxModel_init(OnnxModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "data", "fold_bn", "opset", NULL};
    PyObject *path_o = Py_None, *data_o = Py_None;
    int fold = 1;
    long long opset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$pL:_OnnxModel", kwlist, &path_o, &data_o,
                                     &fold, &opset))
        return -1;
    if ((path_o == Py_None) == (data_o == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "_OnnxModel: give path or data");
        return -1;
    }
    if (self->m) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), "model already loaded");
        return -1;
    }
    if (!qcal_onnx_available()) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_UNSUPPORTED),
                        "this qcal was built without ONNX support (protobuf-c; meson "
                        "-Donnx=enabled)");
        return -1;
    }
    qcal_onnx_model *m = NULL;
    qcal_status st;
    if (path_o != Py_None) {
        PyObject *p = NULL;
        if (!PyUnicode_FSConverter(path_o, &p))
            return -1;
        Py_BEGIN_ALLOW_THREADS
        st = qcal_onnx_model_load_file(PyBytes_AS_STRING(p), &m);
        Py_END_ALLOW_THREADS
        Py_DECREF(p);
    } else {
        Py_buffer b;
        if (PyObject_GetBuffer(data_o, &b, PyBUF_SIMPLE) < 0)
            return -1;
        Py_BEGIN_ALLOW_THREADS
        st = qcal_onnx_model_parse(b.buf, (size_t)b.len, &m);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&b);
    }
    if (st < 0) {
        qcal_py_raise_status(st);
        return -1;
    }
    if (opset > 0) {
        /* the CLI's loading (cli_model_load): a default-domain opset below `opset` raised
         * first; a model without one is left for qdq to name what is wrong */
        qcal_onnx_model_info info;
        Py_BEGIN_ALLOW_THREADS
        st = qcal_onnx_model_get_info(m, &info);
        if (st >= 0 && info.opset >= 0 && info.opset < opset)
            st = qcal_onnx_upgrade(m, opset, NULL);
        Py_END_ALLOW_THREADS
        if (st < 0) {
            qcal_onnx_model_destroy(&m);
            qcal_py_raise_status(st);
            return -1;
        }
    }
    PyObject *folded = NULL;
    if (fold) {
        qcal_onnx_fold_report rep;
        memset(&rep, 0, sizeof rep);
        Py_BEGIN_ALLOW_THREADS
        st = qcal_onnx_fold_bn(m, &rep);
        Py_END_ALLOW_THREADS
        if (st < 0) {
            qcal_onnx_model_destroy(&m);
            qcal_py_raise_status(st);
            return -1;
        }
        folded = names_list(rep.folded, rep.n_folded);
        qcal_onnx_fold_report_free(&rep);
    } else {
        folded = PyList_New(0);
    }
    if (!folded) {
        qcal_onnx_model_destroy(&m);
        return -1;
    }
    self->m = m;
    Py_XSETREF(self->folded, folded);
    return 0;
}

/* Takes the model for a call that releases the GIL; -1 with an exception when it is not
 * loaded, in use, or already rewritten. */
static int model_take(OnnxModelObject *self)
{
    const char *why = !self->m ? "the model is not loaded"
                      : self->busy ? "the model is in use by another thread"
                      : self->rewritten ? "the model was rewritten by qdq_save (load it again)"
                                        : NULL;
    if (why) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), why);
        return -1;
    }
    self->busy = true;
    return 0;
}

static int profile_arg(const char *name, qcal_onnx_profile *out)
{
    if (!name)
        return 0;
    if (qcal_onnx_profile_parse(name, out) < 0) {
        PyErr_Format(qcal_py_error_type(QCAL_ERR_INVALID_ARG),
                     "profile '%s' is not ort or tensorrt", name);
        return -1;
    }
    return 0;
}

/* list(profile="ort", op_types=None, exclude=None) -> [names]: the tensors the profile
 * quantizes (what calibration observes and qdq looks up), in graph order. */
static PyObject *OnnxModel_list(OnnxModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"profile", "op_types", "exclude", NULL};
    const char *profile = NULL, *op_types = NULL;
    PyObject *exclude_o = Py_None, *keep = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzO:list", kwlist, &profile, &op_types,
                                     &exclude_o))
        return NULL;
    qcal_onnx_qdq_options q;
    qcal_onnx_qdq_options_default(&q);
    const char **exclude = NULL;
    int64_t n_exclude = 0;
    if (profile_arg(profile, &q.profile) < 0 ||
        str_list(exclude_o, "exclude", &keep, &exclude, &n_exclude) < 0)
        return NULL;
    q.op_types = op_types;
    q.exclude = exclude;
    q.n_exclude = n_exclude;
    if (model_take(self) < 0) {
        str_list_free(&keep, &exclude);
        return NULL;
    }
    char **names = NULL;
    int64_t n = 0;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_onnx_list(self->m, &q, &names, &n);
    Py_END_ALLOW_THREADS
    self->busy = false;
    str_list_free(&keep, &exclude);
    if (st < 0)
        return qcal_py_raise_status(st);
    PyObject *l = names_list(names, n);
    qcal_onnx_names_free(&names, n);
    return l;
}

/* The report dicts of equalize() and qdq_save() (after its "profile"). */
static const qcal_py_field equalize_fields[] = {
    QCAL_PY_FIELD_NAMES("pairs", qcal_onnx_equalize_report, pairs, n_pairs),
    QCAL_PY_FIELD("sweeps", QCAL_PY_I64, qcal_onnx_equalize_report, sweeps),
    QCAL_PY_FIELD_NAMES("replaced", qcal_onnx_equalize_report, replaced, n_replaced),
    QCAL_PY_FIELD_NAMES("refused", qcal_onnx_equalize_report, refused, n_refused),
};
static const qcal_py_field qdq_fields[] = {
    QCAL_PY_FIELD("ops", QCAL_PY_I64, qcal_onnx_qdq_report, ops),
    QCAL_PY_FIELD("tensors", QCAL_PY_I64, qcal_onnx_qdq_report, tensors),
    QCAL_PY_FIELD("weights", QCAL_PY_I64, qcal_onnx_qdq_report, weights),
    QCAL_PY_FIELD("biases", QCAL_PY_I64, qcal_onnx_qdq_report, biases),
    QCAL_PY_FIELD_NAMES("missing", qcal_onnx_qdq_report, missing, n_missing),
    QCAL_PY_FIELD_NAMES("skipped", qcal_onnx_qdq_report, skipped, n_skipped),
};

/* equalize() -> dict: cross-layer equalization with `qcal equalize`'s defaults. */
static PyObject *OnnxModel_equalize(OnnxModelObject *self, PyObject *noargs)
{
    (void)noargs;
    if (model_take(self) < 0)
        return NULL;
    qcal_onnx_equalize_options eo;
    qcal_onnx_equalize_options_default(&eo);
    qcal_onnx_equalize_report er;
    memset(&er, 0, sizeof er);
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_onnx_equalize(self->m, &eo, &er);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (st < 0) {
        self->rewritten = true;   /* may be half-changed */
        return qcal_py_raise_status(st);
    }
    PyObject *d = PyDict_New();
    if (d && qcal_py_dict_fields(d, &er, equalize_fields, QCAL_PY_NFIELDS(equalize_fields),
                                 0) < 0)
        Py_CLEAR(d);
    qcal_onnx_equalize_report_free(&er);
    return d;
}

/* The Q/DQ options of qdq_save and keep_float, checked as `qcal qdq` checks them; the
 * exclude strings point into *keep (str_list_free). 0 or -1 with an exception. */
static int qdq_options_get(const char *profile, const char *wobs, PyObject *exclude_o,
                           const char *op_types, int strict, const char *wqs, int float_weights,
                           qcal_onnx_qdq_options *opt, PyObject **keep, const char ***exclude)
{
    *keep = NULL;
    *exclude = NULL;
    qcal_onnx_qdq_options_default(opt);
    if (profile_arg(profile, &opt->profile) < 0)
        return -1;
    PyObject *inv = qcal_py_error_type(QCAL_ERR_INVALID_ARG);
    if (wobs && (qcal_observer_kind_parse(wobs, &opt->weight_observer) < 0 ||
                 (opt->weight_observer != QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
                  opt->weight_observer != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX))) {
        PyErr_Format(inv, "weight_observer '%s' is not a per-channel observer "
                     "(per_channel_minmax, moving_average_per_channel_minmax)", wobs);
        return -1;
    }
    if (wqs && (qcal_qscheme_parse(wqs, &opt->weight_qscheme) < 0 ||
                opt->weight_qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)) {
        PyErr_Format(inv, "weight_qscheme '%s' is not per_channel_symmetric, "
                     "per_channel_affine, per_tensor_affine or per_tensor_symmetric", wqs);
        return -1;
    }
    if (wqs && float_weights) {
        PyErr_SetString(inv, "weight_qscheme and float_weights exclude each other");
        return -1;
    }
    if (opt->profile == QCAL_ONNX_PROFILE_TENSORRT &&
        (opt->weight_qscheme == QCAL_PER_TENSOR_AFFINE ||
         opt->weight_qscheme == QCAL_PER_CHANNEL_AFFINE)) {
        PyErr_Format(inv, "weight_qscheme %s: profile tensorrt takes symmetric weights only",
                     wqs);
        return -1;
    }
    opt->strict = strict;
    opt->float_weights = float_weights;
    opt->op_types = op_types;
    int64_t n_exclude = 0;
    if (str_list(exclude_o, "exclude", keep, exclude, &n_exclude) < 0)
        return -1;
    opt->exclude = *exclude;
    opt->n_exclude = n_exclude;
    return 0;
}

/* qdq_save(table, out, profile=None, weight_observer=None, exclude=None, op_types=None,
 *          strict=False, weight_qscheme=None, float_weights=False) -> dict */
static PyObject *OnnxModel_qdq_save(OnnxModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"table", "out", "profile", "weight_observer", "exclude",
                             "op_types", "strict", "weight_qscheme", "float_weights", NULL};
    PyObject *table_o = NULL, *out_o = NULL, *exclude_o = Py_None, *keep = NULL, *path = NULL;
    const char *profile = NULL, *wobs = NULL, *op_types = NULL, *wqs = NULL;
    int strict = 0, float_weights = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|zzOz$pzp:qdq_save", kwlist,
                                     qcal_py_table_type, &table_o, &out_o, &profile, &wobs,
                                     &exclude_o, &op_types, &strict, &wqs, &float_weights))
        return NULL;
    qcal_onnx_qdq_options opt;
    const char **exclude = NULL;
    if (qdq_options_get(profile, wobs, exclude_o, op_types, strict, wqs, float_weights, &opt,
                        &keep, &exclude) < 0)
        return NULL;
    if (!PyUnicode_FSConverter(out_o, &path)) {
        str_list_free(&keep, &exclude);
        return NULL;
    }
    if (model_take(self) < 0) {
        str_list_free(&keep, &exclude);
        Py_DECREF(path);
        return NULL;
    }
    Py_INCREF(table_o);   /* its table is read with the GIL released */
    const qcal_calib_table *t = ((qcal_py_table *)table_o)->t;
    qcal_onnx_qdq_report rep;
    memset(&rep, 0, sizeof rep);
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_onnx_qdq_save_file(self->m, t, &opt, NULL, PyBytes_AS_STRING(path), &rep);
    Py_END_ALLOW_THREADS
    self->busy = false;
    /* Any call that got past the checks changed m (docs: destroy it); a failed check left
     * it unchanged, but one rewrite per model keeps this simple. */
    self->rewritten = true;
    Py_DECREF(table_o);
    Py_DECREF(path);
    str_list_free(&keep, &exclude);
    if (st < 0)
        return qcal_py_raise_status(st);
    PyObject *d = PyDict_New();
    if (d && (qcal_py_dict_set_steal(d, "profile", PyUnicode_FromString(
                  qcal_onnx_profile_name(opt.profile))) < 0 ||
              qcal_py_dict_fields(d, &rep, qdq_fields, QCAL_PY_NFIELDS(qdq_fields), 0) < 0))
        Py_CLEAR(d);
    qcal_onnx_qdq_report_free(&rep);
    return d;
}

/* ---- accuracy at the outputs (qcal/accuracy.h) ------------------------------------------ */

static int32_t elem_of_format(const char *f, Py_ssize_t itemsize);

/* The accuracy options of _model_compare and keep_float, with the labels' buffer they point
 * into (read in place: a C-contiguous int64 / int32 array, one row per sample). */
typedef struct acc_args {
    qcal_accuracy_options o;
    Py_buffer lab;
    bool have_lab;
    qcal_engine_value labv;
} acc_args;

static void acc_args_release(acc_args *a)
{
    if (a->have_lab)
        PyBuffer_Release(&a->lab);
    a->have_lab = false;
}

/* Fills a from the keywords as `qcal compare` fills its options from the command line
 * (sensitivity_samples < 0 and batch 0: the defaults; metric goes with labels). 0 or -1
 * with an exception. */
static int acc_args_get(acc_args *a, PyObject *labels_o, long long label_output,
                        const char *metric, long long sens, long long batch, int threads,
                        long long max_samples, int others)
{
    memset(a, 0, sizeof *a);
    qcal_accuracy_options_default(&a->o);
    PyObject *inv = qcal_py_error_type(QCAL_ERR_INVALID_ARG);
    if (batch < 0 || max_samples < 0 || label_output < 0) {
        PyErr_SetString(inv, "batch, max_samples and label_output must be >= 0");
        return -1;
    }
    if (batch > 0)
        a->o.batch = batch;
    if (sens >= 0)
        a->o.sensitivity_samples = sens;
    a->o.threads = threads;
    a->o.max_samples = max_samples;
    a->o.others = others != 0;
    a->o.label_output = label_output;
    if (metric && qcal_accuracy_metric_parse(metric, &a->o.metric) < 0) {
        qcal_py_raise_status(QCAL_ERR_INVALID_ARG);   /* the library's message names both */
        return -1;
    }
    if (metric && labels_o == Py_None) {
        PyErr_SetString(inv, "metric goes with labels (the metric's right answers)");
        return -1;
    }
    if (labels_o == Py_None)
        return 0;
    if (PyObject_GetBuffer(labels_o, &a->lab, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    a->have_lab = true;
    int32_t et = elem_of_format(a->lab.format, a->lab.itemsize);
    if (et != QCAL_ONNX_INT64 && et != QCAL_ONNX_INT32) {
        PyErr_Format(inv, "labels must be int64 or int32, not '%s' (itemsize %zd)",
                     a->lab.format ? a->lab.format : "B", a->lab.itemsize);
        goto fail;
    }
    if (a->lab.ndim < 1 || a->lab.ndim > QCAL_MAX_DIMS) {
        PyErr_Format(inv, "labels need one row per sample (a %d-d array)", a->lab.ndim);
        goto fail;
    }
    a->labv.name = "labels";
    a->labv.elem_type = et;
    a->labv.ndim = a->lab.ndim;
    for (int d = 0; d < a->lab.ndim; d++)
        a->labv.dims[d] = (int64_t)a->lab.shape[d];
    a->labv.data = a->lab.buf;
    a->labv.nbytes = (size_t)a->lab.len;
    a->o.labels = &a->labv;
    return 0;
fail:
    acc_args_release(a);
    return -1;
}

/* The figures of the report, keyed as `qcal compare --format json` keys them. */
static const qcal_py_field compare_output_fields[] = {
    QCAL_PY_FIELD("name", QCAL_PY_STR, qcal_accuracy_output, name),
    QCAL_PY_FIELD("samples", QCAL_PY_I64, qcal_accuracy_output, samples),
    QCAL_PY_FIELD("positions", QCAL_PY_I64, qcal_accuracy_output, positions),
    QCAL_PY_FIELD("nonfinite", QCAL_PY_I64, qcal_accuracy_output, nonfinite),
    QCAL_PY_FIELD("sqnr_db", QCAL_PY_FIGURE, qcal_accuracy_output, sqnr_db),
    QCAL_PY_FIELD("cosine", QCAL_PY_FIGURE, qcal_accuracy_output, cosine),
    QCAL_PY_FIELD("top1_agreement", QCAL_PY_FIGURE, qcal_accuracy_output, agree),
    QCAL_PY_FIELD("exact_agreement", QCAL_PY_FIGURE, qcal_accuracy_output, exact_agree),
    QCAL_PY_FIELD("accuracy_float", QCAL_PY_FIGURE, qcal_accuracy_output, acc_float),
    QCAL_PY_FIELD("accuracy_quantized", QCAL_PY_FIGURE, qcal_accuracy_output, acc_quant),
};
static const qcal_py_field compare_op_fields[] = {
    QCAL_PY_FIELD("name", QCAL_PY_STR, qcal_accuracy_op, name),
    QCAL_PY_FIELD("op_type", QCAL_PY_STR, qcal_accuracy_op, op_type),
    QCAL_PY_FIELD("sqnr_alone_db", QCAL_PY_FIGURE, qcal_accuracy_op, sqnr_only_db),
    QCAL_PY_FIELD("sqnr_all_but_db", QCAL_PY_FIGURE, qcal_accuracy_op, sqnr_others_db),
};
static const qcal_py_field keep_float_fields[] = {
    QCAL_PY_FIELD_NAMES("float_ops", qcal_accuracy_keep_float_result, float_ops, n_float),
    QCAL_PY_FIELD("ops", QCAL_PY_I64, qcal_accuracy_keep_float_result, n_ops),
    QCAL_PY_FIELD("met", QCAL_PY_BOOL, qcal_accuracy_keep_float_result, met),
    QCAL_PY_FIELD("sqnr_db", QCAL_PY_FIGURE, qcal_accuracy_keep_float_result, sqnr_db),
    QCAL_PY_FIELD("accuracy_float", QCAL_PY_FIGURE, qcal_accuracy_keep_float_result, acc_float),
    QCAL_PY_FIELD("accuracy_quantized", QCAL_PY_FIGURE, qcal_accuracy_keep_float_result, acc_quant),
    QCAL_PY_FIELD("runs", QCAL_PY_I64, qcal_accuracy_keep_float_result, runs),
    QCAL_PY_FIELD("checks", QCAL_PY_I64, qcal_accuracy_keep_float_result, checks),
    QCAL_PY_FIELD("seconds", QCAL_PY_F64, qcal_accuracy_keep_float_result, seconds),
};

/* A list of dicts, one per element of a C array, from a field table. */
static PyObject *dict_list(const void *base, size_t size, int64_t n, const qcal_py_field *f,
                           size_t nf)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        PyObject *d = PyDict_New();
        if (!d || qcal_py_dict_fields(d, (const char *)base + (size_t)i * size, f, nf, 0) < 0) {
            Py_XDECREF(d);
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, d);
    }
    return l;
}

/* keep_float(table, data=None, entries=None, *, profile=None, weight_observer=None,
 *            exclude=None, op_types=None, strict=False, weight_qscheme=None,
 *            float_weights=False, min_output_sqnr=nan, max_drop=nan, labels=None,
 *            label_output=0, metric=None, sensitivity_samples=-1, batch=0, threads=0,
 *            ort_lib=None) -> dict: qcal_accuracy_keep_float on this model (not changed) with
 * the Q/DQ options qdq_save takes, ONNX Runtime opened for the call, the GIL released while
 * it runs. The dict: float_ops, ops, met, sqnr_db, accuracy_float, accuracy_quantized (None
 * without labels), runs, checks, seconds. */
static PyObject *OnnxModel_keep_float(OnnxModelObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"table", "data", "entries", "profile", "weight_observer",
                             "exclude", "op_types", "strict", "weight_qscheme",
                             "float_weights", "min_output_sqnr", "max_drop", "labels",
                             "label_output", "metric", "sensitivity_samples", "batch",
                             "threads", "ort_lib", NULL};
    PyObject *table_o = NULL, *data_o = Py_None, *entries_o = Py_None, *exclude_o = Py_None;
    PyObject *labels_o = Py_None, *lib_o = Py_None;
    const char *profile = NULL, *wobs = NULL, *op_types = NULL, *wqs = NULL, *metric = NULL;
    int strict = 0, float_weights = 0, threads = 0;
    double min_sqnr = NAN, max_drop = NAN;
    long long label_output = 0, sens = -1, batch = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|OO$zzOzpzpddOLzLLiO:keep_float", kwlist,
                                     qcal_py_table_type, &table_o, &data_o, &entries_o,
                                     &profile, &wobs, &exclude_o, &op_types, &strict, &wqs,
                                     &float_weights, &min_sqnr, &max_drop, &labels_o,
                                     &label_output, &metric, &sens, &batch, &threads, &lib_o))
        return NULL;
    qcal_onnx_qdq_options opt;
    const char **exclude = NULL, **entries = NULL;
    PyObject *keep_ex = NULL, *keep_en = NULL, *data = NULL, *lib = NULL, *res = NULL;
    int64_t n_entries = 0;
    acc_args aa;
    if (acc_args_get(&aa, labels_o, label_output, metric, sens, batch, threads, 0, 1) < 0)
        return NULL;
    if (qdq_options_get(profile, wobs, exclude_o, op_types, strict, wqs, float_weights, &opt,
                        &keep_ex, &exclude) < 0 ||
        str_list(entries_o, "entries", &keep_en, &entries, &n_entries) < 0 ||
        (data_o != Py_None && !PyUnicode_FSConverter(data_o, &data)) ||
        (lib_o != Py_None && !PyUnicode_FSConverter(lib_o, &lib)) || model_take(self) < 0)
        goto out;
    Py_INCREF(table_o);   /* read with the GIL released */
    const qcal_calib_table *t = ((qcal_py_table *)table_o)->t;
    qcal_accuracy_keep_float_target tg = {min_sqnr, max_drop};
    qcal_accuracy_keep_float_result kf;
    memset(&kf, 0, sizeof kf);
    qcal_engine_options eo;
    qcal_engine_options_default(&eo);
    eo.library = lib ? PyBytes_AS_STRING(lib) : NULL;
    const char *data_s = data ? PyBytes_AS_STRING(data) : NULL;
    qcal_engine *e = NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_engine_open(&eo, &e);
    if (st >= 0)
        st = qcal_accuracy_keep_float(e, self->m, t, &opt, data_s, entries, n_entries, &aa.o, &tg,
                                      &kf);
    qcal_engine_close(&e);
    Py_END_ALLOW_THREADS
    self->busy = false;
    Py_DECREF(table_o);
    if (st < 0) {
        qcal_py_raise_status(st);
        goto out;
    }
    res = PyDict_New();
    if (res && qcal_py_dict_fields(res, &kf, keep_float_fields,
                                   QCAL_PY_NFIELDS(keep_float_fields), 0) < 0)
        Py_CLEAR(res);
    qcal_accuracy_keep_float_result_free(&kf);
out:
    acc_args_release(&aa);
    str_list_free(&keep_ex, &exclude);
    str_list_free(&keep_en, &entries);
    Py_XDECREF(data);
    Py_XDECREF(lib);
    return res;
}

static PyObject *OnnxModel_get_folded(OnnxModelObject *self, void *closure)
{
    (void)closure;
    return PyList_GetSlice(self->folded ? self->folded : Py_None, 0, PY_SSIZE_T_MAX);
}

static PyMethodDef OnnxModel_methods[] = {
    {"list", (PyCFunction)(void (*)(void))OnnxModel_list, METH_VARARGS | METH_KEYWORDS,
     "list(profile='ort', op_types=None, exclude=None) -> [str]: the tensors the profile "
     "quantizes, in graph order."},
    {"keep_float", (PyCFunction)(void (*)(void))OnnxModel_keep_float,
     METH_VARARGS | METH_KEYWORDS,
     "keep_float(table, data, entries, ...) -> dict: the ops to keep float until the target "
     "holds (qcal_accuracy_keep_float; the model is not changed)."},
    {"equalize", (PyCFunction)OnnxModel_equalize, METH_NOARGS,
     "equalize() -> dict: cross-layer equalization (qcal equalize's defaults)."},
    {"qdq_save", (PyCFunction)(void (*)(void))OnnxModel_qdq_save, METH_VARARGS | METH_KEYWORDS,
     "qdq_save(table, out, ...) -> dict: Q/DQ inserted from table and the model written to "
     "out (the model object is the quantized model afterwards)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef OnnxModel_getset[] = {
    {"folded", (getter)OnnxModel_get_folded, NULL,
     "BatchNormalizations folded at load ('CONV <- BN' each).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject OnnxModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal._qcal._OnnxModel",
    .tp_basicsize = sizeof(OnnxModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "_OnnxModel(path=None, data=None, *, fold_bn=True, opset=0): an ONNX model loaded by "
              "libqcal (internal: see qcal.onnx).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)OnnxModel_init,
    .tp_dealloc = (destructor)OnnxModel_dealloc,
    .tp_methods = OnnxModel_methods,
    .tp_getset = OnnxModel_getset,
};

/* ---- _ModelCalib ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    qcal_engine *e;
    qcal_model_calib *mc;
    PyObject *session;    /* the qcal.Session observed into (mc points at its session) */
    bool busy;            /* a call runs with the GIL released */
    bool finished;
} ModelCalibObject;

static PyTypeObject ModelCalibType;

static void ModelCalib_dealloc(ModelCalibObject *self)
{
    if (self->mc) {
        Py_BEGIN_ALLOW_THREADS   /* waits for the observer thread */
        qcal_model_calib_destroy(&self->mc);
        Py_END_ALLOW_THREADS
    }
    qcal_engine_close(&self->e);
    Py_CLEAR(self->session);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* _ModelCalib(model, session, *, profile=None, op_types=None, exclude=None, batch=0,
 *             carry=None, ort_lib=None, threads=0, observer_auto=False, overlap=False) */
static int ModelCalib_init(ModelCalibObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "session", "profile", "op_types", "exclude", "batch",
                             "carry", "ort_lib", "threads", "observer_auto", "overlap", NULL};
    PyObject *model_o = NULL, *session_o = NULL, *exclude_o = Py_None, *carry_o = Py_None;
    PyObject *keep_ex = NULL, *keep_carry = NULL, *lib = NULL;
    const char *profile = NULL, *op_types = NULL;
    long long batch = 0;
    int threads = 0, observer_auto = 0, overlap = 0;
    PyObject *lib_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!|$zzOLOOipp:_ModelCalib", kwlist,
                                     &OnnxModelType, &model_o, qcal_py_session_type,
                                     &session_o, &profile, &op_types, &exclude_o, &batch,
                                     &carry_o, &lib_o, &threads, &observer_auto, &overlap))
        return -1;
    if (self->mc) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), "already initialised");
        return -1;
    }
    qcal_py_session *so = (qcal_py_session *)session_o;
    if (!so->s) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), "session is not initialised");
        return -1;
    }
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    if (profile_arg(profile, &o.profile) < 0)
        return -1;
    if (batch < 0) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_INVALID_ARG),
                        "batch must be >= 1 (or None: automatic)");
        return -1;
    }
    o.batch = batch;
    o.op_types = op_types;
    o.threads = threads;
    o.observer_auto = observer_auto != 0;
    o.overlap = overlap != 0;
    const char **exclude = NULL, **carry = NULL;
    int64_t n_carry = 0;
    if (str_list(exclude_o, "exclude", &keep_ex, &exclude, &o.n_exclude) < 0)
        return -1;
    o.exclude = exclude;
    if (str_list(carry_o, "carry", &keep_carry, &carry, &n_carry) < 0) {
        str_list_free(&keep_ex, &exclude);
        return -1;
    }
    o.carry = carry;
    o.n_carry = n_carry;
    int rc = -1;
    OnnxModelObject *mo = (OnnxModelObject *)model_o;
    if (lib_o != Py_None && !PyUnicode_FSConverter(lib_o, &lib))
        goto out;
    if (model_take(mo) < 0)
        goto out;
    qcal_engine_options eo;
    qcal_engine_options_default(&eo);
    eo.library = lib ? PyBytes_AS_STRING(lib) : NULL;
    qcal_engine *e = NULL;
    qcal_model_calib *mc = NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_engine_open(&eo, &e);
    if (st >= 0)
        st = qcal_model_calib_create(e, mo->m, so->s, &o, &mc);
    Py_END_ALLOW_THREADS
    mo->busy = false;
    if (st < 0) {
        qcal_py_raise_status(st);
        qcal_engine_close(&e);
        goto out;
    }
    self->e = e;
    self->mc = mc;
    Py_INCREF(session_o);
    Py_XSETREF(self->session, session_o);
    rc = 0;
out:
    Py_XDECREF(lib);
    str_list_free(&keep_ex, &exclude);
    str_list_free(&keep_carry, &carry);
    return rc;
}

static int calib_take(ModelCalibObject *self)
{
    const char *why = !self->mc ? "the calibration is not initialised"
                      : self->busy ? "the calibration is in use by another thread"
                      : self->finished ? "the calibration is finished"
                                       : NULL;
    if (why) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), why);
        return -1;
    }
    self->busy = true;
    return 0;
}

/* ONNX element type of a buffer's struct format (native or little-endian; 0 if none). */
static int32_t elem_of_format(const char *f, Py_ssize_t itemsize)
{
    if (!f)
        return QCAL_ONNX_UINT8;   /* plain bytes */
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (!f[0] || f[1])
        return 0;
    switch (f[0]) {
    case 'f': return itemsize == 4 ? QCAL_ONNX_FLOAT : 0;
    case 'd': return itemsize == 8 ? QCAL_ONNX_DOUBLE : 0;
    case 'e': return itemsize == 2 ? QCAL_ONNX_FLOAT16 : 0;
    case '?': return itemsize == 1 ? 9 /* BOOL */ : 0;
    case 'b': case 'h': case 'i': case 'l': case 'q':
        return itemsize == 1 ? QCAL_ONNX_INT8 : itemsize == 2 ? 5 /* INT16 */
               : itemsize == 4 ? QCAL_ONNX_INT32 : itemsize == 8 ? QCAL_ONNX_INT64 : 0;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        return itemsize == 1 ? QCAL_ONNX_UINT8 : itemsize == 2 ? 4 /* UINT16 */
               : itemsize == 4 ? 12 /* UINT32 */ : itemsize == 8 ? 13 /* UINT64 */ : 0;
    default: return 0;
    }
}

/* The values of one run: {name: buffer} -> v[n], views held in b[n], the names' str
 * objects in keys[n] (the dict may change while the GIL is released). */
typedef struct run_inputs {
    qcal_engine_value *v;
    Py_buffer *b;
    PyObject **keys;
    Py_ssize_t n;
} run_inputs;

static void run_inputs_free(run_inputs *r)
{
    for (Py_ssize_t i = 0; i < r->n; i++) {
        PyBuffer_Release(&r->b[i]);
        Py_XDECREF(r->keys[i]);
    }
    PyMem_Free(r->v);
    PyMem_Free(r->b);
    PyMem_Free(r->keys);
    memset(r, 0, sizeof *r);
}

static int run_inputs_get(PyObject *d, run_inputs *r)
{
    memset(r, 0, sizeof *r);
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "expected a dict {input name: array} per run, got "
                     "%.100s", Py_TYPE(d)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyDict_Size(d), pos = 0, i = 0;
    r->v = PyMem_Calloc((size_t)n + 1, sizeof *r->v);
    r->b = PyMem_Calloc((size_t)n + 1, sizeof *r->b);
    r->keys = PyMem_Calloc((size_t)n + 1, sizeof *r->keys);
    if (!r->v || !r->b || !r->keys) {
        PyErr_NoMemory();
        goto fail;
    }
    PyObject *key, *val;
    while (PyDict_Next(d, &pos, &key, &val)) {
        if (!PyUnicode_Check(key)) {
            PyErr_Format(PyExc_TypeError, "input names must be str, got %.100s",
                         Py_TYPE(key)->tp_name);
            goto fail;
        }
        const char *name = PyUnicode_AsUTF8(key);
        if (!name)
            goto fail;
        if (PyObject_GetBuffer(val, &r->b[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "input '%s': expected a C-contiguous array "
                         "(buffer protocol), got %.100s", name, Py_TYPE(val)->tp_name);
            goto fail;
        }
        r->keys[i] = Py_NewRef(key);
        r->n = ++i;
        Py_buffer *b = &r->b[i - 1];
        qcal_engine_value *v = &r->v[i - 1];
        int32_t et = elem_of_format(b->format, b->itemsize);
        if (!et) {
            PyErr_Format(PyExc_TypeError, "input '%s': element format '%s' is not one the "
                         "engine takes (little-endian float32, float16, float64, int8..int64, "
                         "uint8, uint16, bool)", name, b->format ? b->format : "B");
            goto fail;
        }
        if (b->ndim > QCAL_MAX_DIMS) {
            PyErr_Format(qcal_py_error_type(QCAL_ERR_UNSUPPORTED),
                         "input '%s': %d dimensions (at most %d)", name, b->ndim,
                         QCAL_MAX_DIMS);
            goto fail;
        }
        v->name = name;
        v->elem_type = et;
        v->ndim = b->ndim;
        for (int k = 0; k < b->ndim; k++)   /* PyBUF_C_CONTIGUOUS asks for the shape */
            v->dims[k] = b->shape ? (int64_t)b->shape[k]
                                  : (int64_t)(b->len / (b->itemsize ? b->itemsize : 1));
        v->data = b->buf;
        v->nbytes = (size_t)b->len;
    }
    return 0;
fail:
    run_inputs_free(r);
    return -1;
}

/* feed(inputs: dict) -> None: one run of the model. */
static PyObject *ModelCalib_feed(ModelCalibObject *self, PyObject *d)
{
    run_inputs r;
    if (run_inputs_get(d, &r) < 0)
        return NULL;
    if (calib_take(self) < 0) {
        run_inputs_free(&r);
        return NULL;
    }
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_model_calib_feed(self->mc, r.v, (int64_t)r.n);
    Py_END_ALLOW_THREADS
    self->busy = false;
    run_inputs_free(&r);
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

/* reset() -> None: a new sequence (carried inputs zeros again). */
static PyObject *ModelCalib_reset(ModelCalibObject *self, PyObject *noargs)
{
    (void)noargs;
    if (calib_take(self) < 0)
        return NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_model_calib_reset(self->mc);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

/* feed_data(spec=None, entries=None, optional=None) -> None: every batch of a data spec
 * (qcal/dataset.h), as `qcal calibrate MODEL --data SPEC --input NAME=PATH`; optional: the
 * carried inputs the files may leave out. */
static PyObject *ModelCalib_feed_data(ModelCalibObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"spec", "entries", "optional", NULL};
    PyObject *spec_o = Py_None, *entries_o = Py_None, *optional_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOO:feed_data", kwlist, &spec_o, &entries_o,
                                     &optional_o))
        return NULL;
    PyObject *spec = NULL, *keep_e = NULL, *keep_o = NULL, *res = NULL;
    const char **entries = NULL, **optional = NULL;
    int64_t n_entries = 0, n_optional = 0;
    qcal_engine_io *in = NULL;
    if (spec_o != Py_None && !PyUnicode_FSConverter(spec_o, &spec))
        return NULL;
    if (str_list(entries_o, "entries", &keep_e, &entries, &n_entries) < 0 ||
        str_list(optional_o, "optional", &keep_o, &optional, &n_optional) < 0)
        goto out;
    if (calib_take(self) < 0)
        goto out;
    int64_t n_in = qcal_model_calib_input_count(self->mc);
    if (!(in = PyMem_Calloc((size_t)n_in + 1, sizeof *in))) {
        self->busy = false;
        PyErr_NoMemory();
        goto out;
    }
    qcal_status st = QCAL_OK;
    for (int64_t i = 0; i < n_in && st >= 0; i++)
        st = qcal_model_calib_input(self->mc, i, &in[i]);
    qcal_dataset_options dopt;
    qcal_dataset_options_default(&dopt);
    dopt.optional = optional;
    dopt.n_optional = n_optional;
    const char *spec_s = spec ? PyBytes_AS_STRING(spec) : NULL;
    Py_BEGIN_ALLOW_THREADS
    qcal_dataset *ds = NULL;
    if (st >= 0)
        st = qcal_dataset_open(spec_s, entries, n_entries, in, n_in, &dopt, &ds);
    if (st >= 0)
        st = qcal_model_calib_feed_dataset(self->mc, ds);
    qcal_dataset_close(&ds);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (st < 0)
        qcal_py_raise_status(st);
    else
        res = Py_NewRef(Py_None);
out:
    PyMem_Free(in);
    Py_XDECREF(spec);
    str_list_free(&keep_e, &entries);
    str_list_free(&keep_o, &optional);
    return res;
}

/* next_pass() -> None: observer_auto: the first pass ends; feed the same runs again. */
static PyObject *ModelCalib_next_pass(ModelCalibObject *self, PyObject *noargs)
{
    (void)noargs;
    if (calib_take(self) < 0)
        return NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_model_calib_next_pass(self->mc);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

/* finish() -> dict: waits for the observers; the session then holds everything. */
static PyObject *ModelCalib_finish(ModelCalibObject *self, PyObject *noargs)
{
    (void)noargs;
    if (calib_take(self) < 0)
        return NULL;
    qcal_model_calib_report rep;
    memset(&rep, 0, sizeof rep);
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_model_calib_finish(self->mc, &rep);
    Py_END_ALLOW_THREADS
    self->busy = false;
    if (st < 0)
        return qcal_py_raise_status(st);
    self->finished = true;
    PyObject *chosen = PyDict_New();
    for (int k = 0; chosen && k < QCAL_OBSERVER_KIND_COUNT; k++) {
        if (!rep.chosen[k])
            continue;
        PyObject *n = PyLong_FromLongLong(rep.chosen[k]);
        if (!n || PyDict_SetItemString(chosen, qcal_observer_kind_name((qcal_observer_kind)k),
                                       n) < 0)
            Py_CLEAR(chosen);
        Py_XDECREF(n);
    }
    if (!chosen)
        return NULL;
    /* observer auto at the outputs: each candidate's output SQNR ("per-tensor", kinds) */
    PyObject *cand = PyDict_New(), *agree = PyDict_New();
    for (int k = 0; cand && agree && k <= QCAL_OBSERVER_KIND_COUNT; k++) {
        if (isnan(rep.auto_sqnr_db[k]))
            continue;
        const char *key = k ? qcal_observer_kind_name((qcal_observer_kind)(k - 1)) : "per-tensor";
        PyObject *v = PyFloat_FromDouble(rep.auto_sqnr_db[k]);
        if (!v || PyDict_SetItemString(cand, key, v) < 0)
            Py_CLEAR(cand);
        Py_XDECREF(v);
        PyObject *a = rep.auto_agree[k] >= 0 ? PyLong_FromLongLong(rep.auto_agree[k]) : NULL;
        if (rep.auto_agree[k] >= 0 && (!a || PyDict_SetItemString(agree, key, a) < 0))
            Py_CLEAR(agree);
        Py_XDECREF(a);
    }
    if (!cand || !agree) {
        Py_XDECREF(cand);
        Py_XDECREF(agree);
        Py_DECREF(chosen);
        return NULL;
    }
    const char *choice = !rep.auto_samples ? NULL
                         : rep.auto_choice < 0 ? "per-tensor"
                                               : qcal_observer_kind_name((qcal_observer_kind)rep.auto_choice);
    return Py_BuildValue("{sLsLsLsLsLsKsLsdsdsssssLsNsLszsNsN}", "tensors", (long long)rep.tensors,
                         "files", (long long)rep.files, "samples", (long long)rep.samples,
                         "runs", (long long)rep.runs, "batch", (long long)rep.batch,
                         "max_run_bytes", (unsigned long long)rep.max_run_bytes,
                         "empty", (long long)rep.empty, "engine_seconds", rep.engine_seconds,
                         "wait_seconds", rep.wait_seconds,
                         "engine_version", qcal_engine_version(self->e),
                         "engine_library", qcal_engine_library(self->e),
                         "passes", (long long)rep.passes, "chosen", chosen,
                         "auto_samples", (long long)rep.auto_samples, "auto_choice", choice,
                         "auto_sqnr_db", cand, "auto_agree", agree);
}

/* inputs() -> [(name, dtype name, dims)]: the model's inputs as the engine declares them
 * (dims: a tuple, None for a dynamic dimension; None for an unknown rank). */
static PyObject *ModelCalib_inputs(ModelCalibObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->mc) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), "the calibration is not initialised");
        return NULL;
    }
    int64_t n = qcal_model_calib_input_count(self->mc);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        qcal_engine_io io;
        qcal_status st = qcal_model_calib_input(self->mc, i, &io);
        PyObject *t = st < 0 ? qcal_py_raise_status(st) : engine_io_tuple(&io);
        if (!t) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

/* tensors() -> [str]: the tensors observed in every run. */
static PyObject *ModelCalib_tensors(ModelCalibObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->mc) {
        PyErr_SetString(qcal_py_error_type(QCAL_ERR_STATE), "the calibration is not initialised");
        return NULL;
    }
    int64_t n = qcal_model_calib_tensor_count(self->mc);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; l && i < n; i++) {
        const char *s = qcal_model_calib_tensor(self->mc, i);
        PyObject *u = PyUnicode_FromString(s ? s : "");
        if (!u) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, u);
    }
    return l;
}

static PyMethodDef ModelCalib_methods[] = {
    {"feed", (PyCFunction)ModelCalib_feed, METH_O,
     "feed({name: array}) -> None: one run (the GIL released while the model runs)."},
    {"reset", (PyCFunction)ModelCalib_reset, METH_NOARGS,
     "reset() -> None: a new sequence (carried inputs start from zeros)."},
    {"feed_data", (PyCFunction)(void (*)(void))ModelCalib_feed_data,
     METH_VARARGS | METH_KEYWORDS,
     "feed_data(spec=None, entries=None, optional=None) -> None: every batch of a data spec."},
    {"next_pass", (PyCFunction)ModelCalib_next_pass, METH_NOARGS,
     "next_pass() -> None: observer_auto: the first pass ends; feed the same runs again."},
    {"finish", (PyCFunction)ModelCalib_finish, METH_NOARGS,
     "finish() -> dict: waits for the observers; the report."},
    {"inputs", (PyCFunction)ModelCalib_inputs, METH_NOARGS,
     "inputs() -> [(name, dtype, dims)]: the model inputs as ONNX Runtime declares them."},
    {"tensors", (PyCFunction)ModelCalib_tensors, METH_NOARGS,
     "tensors() -> [str]: the tensors observed in every run."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ModelCalibType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal._qcal._ModelCalib",
    .tp_basicsize = sizeof(ModelCalibObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "_ModelCalib(model, session, ...): a model run in ONNX Runtime into a session "
              "(internal: see qcal.onnx).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ModelCalib_init,
    .tp_dealloc = (destructor)ModelCalib_dealloc,
    .tp_methods = ModelCalib_methods,
};

static PyObject *py_onnx_available(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyBool_FromLong(qcal_onnx_available());
}

/* _engine_info(ort_lib=None) -> (version, library): opens ONNX Runtime once (raises as the
 * calibration would when it cannot be loaded). */
static PyObject *py_engine_info(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *lib_o = Py_None, *lib = NULL;
    if (!PyArg_ParseTuple(args, "|O:_engine_info", &lib_o))
        return NULL;
    if (lib_o != Py_None && !PyUnicode_FSConverter(lib_o, &lib))
        return NULL;
    qcal_engine_options eo;
    qcal_engine_options_default(&eo);
    eo.library = lib ? PyBytes_AS_STRING(lib) : NULL;
    qcal_engine *e = NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_engine_open(&eo, &e);
    Py_END_ALLOW_THREADS
    Py_XDECREF(lib);
    if (st < 0)
        return qcal_py_raise_status(st);
    PyObject *r = Py_BuildValue("(ss)", qcal_engine_version(e), qcal_engine_library(e));
    qcal_engine_close(&e);
    return r;
}

/* _model_compare(float_model, qdq_model, ref, data=None, entries=None, *, labels=None,
 *                label_output=0, metric=None, sensitivity_samples=-1, batch=0, threads=0,
 *                max_samples=0, others=True, ort_lib=None, float_name="",
 *                quantized_name="") -> dict: qcal_accuracy_compare (ref: the float model as qdq
 * read it, whose weights the QDQ model quantized), the GIL released while it runs. The dict
 * holds what `qcal compare --format json` writes, under the same keys and in its order
 * (figures that do not apply None, +inf float('inf')); float_name / quantized_name are
 * recorded as "float" / "quantized". */
static PyObject *py_model_compare(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"float_model", "qdq_model", "ref", "data", "entries", "labels",
                             "label_output", "metric", "sensitivity_samples", "batch",
                             "threads", "max_samples", "others", "ort_lib", "float_name",
                             "quantized_name", NULL};
    PyObject *fm_o, *qm_o, *ref_o, *data_o = Py_None, *entries_o = Py_None;
    PyObject *labels_o = Py_None, *lib_o = Py_None;
    const char *metric = NULL, *fname = "", *qname = "";
    long long label_output = 0, sens = -1, batch = 0, max_samples = 0;
    int threads = 0, others = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!O!|OO$OLzLLiLpOss:_model_compare", kwlist,
                                     &OnnxModelType, &fm_o, &OnnxModelType, &qm_o,
                                     &OnnxModelType, &ref_o, &data_o, &entries_o, &labels_o,
                                     &label_output, &metric, &sens, &batch, &threads,
                                     &max_samples, &others, &lib_o, &fname, &qname))
        return NULL;
    OnnxModelObject *mo[3] = {(OnnxModelObject *)fm_o, (OnnxModelObject *)qm_o,
                              (OnnxModelObject *)ref_o};
    if (fm_o == qm_o || fm_o == ref_o || qm_o == ref_o) {
        PyErr_SetString(PyExc_TypeError, "_model_compare: three distinct model objects");
        return NULL;
    }
    const char **entries = NULL;
    PyObject *keep_en = NULL, *data = NULL, *lib = NULL, *res = NULL;
    int64_t n_entries = 0;
    int taken = 0;
    acc_args aa;
    if (acc_args_get(&aa, labels_o, label_output, metric, sens, batch, threads, max_samples,
                     others) < 0)
        return NULL;
    if (str_list(entries_o, "entries", &keep_en, &entries, &n_entries) < 0 ||
        (data_o != Py_None && !PyUnicode_FSConverter(data_o, &data)) ||
        (lib_o != Py_None && !PyUnicode_FSConverter(lib_o, &lib)))
        goto out;
    for (; taken < 3; taken++)
        if (model_take(mo[taken]) < 0)
            goto out;
    qcal_accuracy_report rep;
    memset(&rep, 0, sizeof rep);
    qcal_engine_options eo;
    qcal_engine_options_default(&eo);
    eo.library = lib ? PyBytes_AS_STRING(lib) : NULL;
    const char *data_s = data ? PyBytes_AS_STRING(data) : NULL;
    char version[64] = "";
    qcal_engine *e = NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_engine_open(&eo, &e);
    if (st >= 0) {
        snprintf(version, sizeof version, "%s", qcal_engine_version(e));
        st = qcal_accuracy_compare(e, mo[0]->m, mo[1]->m, mo[2]->m, data_s, entries, n_entries,
                                   &aa.o, &rep);
    }
    qcal_engine_close(&e);
    Py_END_ALLOW_THREADS
    if (st < 0) {
        qcal_py_raise_status(st);
        goto out;
    }
    PyObject *outputs = dict_list(rep.outputs, sizeof *rep.outputs, rep.n_outputs,
                                  compare_output_fields, QCAL_PY_NFIELDS(compare_output_fields));
    PyObject *ops = outputs ? dict_list(rep.ops, sizeof *rep.ops, rep.n_ops, compare_op_fields,
                                        QCAL_PY_NFIELDS(compare_op_fields))
                            : NULL;
    if (ops) {
        PyObject *m = aa.o.labels ? PyUnicode_FromString(qcal_accuracy_metric_name(aa.o.metric))
                                  : Py_NewRef(Py_None);
        /* NaN -> None and inf as it is: the JSON's null and "inf" */
        PyObject *sq = isnan(rep.sqnr_db) ? Py_NewRef(Py_None) : PyFloat_FromDouble(rep.sqnr_db);
        PyObject *gs = isnan(rep.gated_sqnr_db) ? Py_NewRef(Py_None)
                                                : PyFloat_FromDouble(rep.gated_sqnr_db);
        if (m && sq && gs)
            res = Py_BuildValue("{sssssssLsOsOsOsLsOsOsLsd}", "float", fname, "quantized", qname,
                                "engine", version, "samples", (long long)rep.samples,
                                "metric", m, "sqnr_db", sq, "outputs", outputs,
                                "sensitivity_samples", (long long)rep.sensitivity_samples,
                                "gated_sqnr_db", gs, "ops", ops, "runs", (long long)rep.runs,
                                "seconds", rep.seconds);
        Py_XDECREF(m);
        Py_XDECREF(sq);
        Py_XDECREF(gs);
    }
    Py_XDECREF(outputs);
    Py_XDECREF(ops);
    qcal_accuracy_report_free(&rep);
out:
    while (taken > 0)
        mo[--taken]->busy = false;
    acc_args_release(&aa);
    str_list_free(&keep_en, &entries);
    Py_XDECREF(data);
    Py_XDECREF(lib);
    return res;
}

/* _keep_float_exclude(name) -> str: the node name as an exclude pattern matching it alone. */
static PyObject *py_keep_float_exclude(PyObject *mod, PyObject *arg)
{
    (void)mod;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    char *p = qcal_accuracy_keep_float_exclude(name);
    if (!p)
        return PyErr_NoMemory();
    PyObject *r = PyUnicode_FromString(p);
    qcal_free(p);
    return r;
}

static PyMethodDef onnx_methods[] = {
    {"_onnx_available", py_onnx_available, METH_NOARGS,
     "internal: True when libqcal was built with ONNX support."},
    {"_engine_info", py_engine_info, METH_VARARGS,
     "internal: (version, library path) of the ONNX Runtime qcal loads."},
    {"_model_compare", (PyCFunction)(void (*)(void))py_model_compare,
     METH_VARARGS | METH_KEYWORDS,
     "internal: qcal_accuracy_compare -> the dict of `qcal compare --format json`."},
    {"_keep_float_exclude", py_keep_float_exclude, METH_O,
     "internal: a node name as an exclude pattern matching that name only."},
    {NULL, NULL, 0, NULL},
};

int qcal_py_onnx_init(PyObject *module)
{
    if (PyType_Ready(&OnnxModelType) < 0 || PyType_Ready(&ModelCalibType) < 0)
        return -1;
    Py_INCREF(&OnnxModelType);
    if (PyModule_AddObject(module, "_OnnxModel", (PyObject *)&OnnxModelType) < 0) {
        Py_DECREF(&OnnxModelType);
        return -1;
    }
    Py_INCREF(&ModelCalibType);
    if (PyModule_AddObject(module, "_ModelCalib", (PyObject *)&ModelCalibType) < 0) {
        Py_DECREF(&ModelCalibType);
        return -1;
    }
    return PyModule_AddFunctions(module, onnx_methods);
}
