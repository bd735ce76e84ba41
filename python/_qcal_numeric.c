/* qcal._qcal, numeric: the error metrics sqnr / l2 / cosine (qcal_numeric_compare_f32) and
 * qcal.NumericLogger, the statistics records of `qcal stats` that qcal.torch's activation
 * loggers write (qcal/numeric.h). */
#include "_qcal_shared.h"

#include <string.h>

/* ---- metrics --------------------------------------------------------------------------- */

static PyObject *metrics_common(PyObject *args, int which)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO", &xo, &yo))
        return NULL;
    qcal_py_f32 x, y;
    if (qcal_py_f32_get(xo, &x) < 0)
        return NULL;
    if (qcal_py_f32_get(yo, &y) < 0) {
        qcal_py_f32_release(&x);
        return NULL;
    }
    qcal_status st;
    qcal_numeric_metrics m;
    if (x.numel != y.numel) {
        qcal_py_f32_release(&x);
        qcal_py_f32_release(&y);
        PyErr_Format(qcal_py_err_mismatch, "x has %lld elements and y has %lld",
                     (long long)x.numel, (long long)y.numel);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = qcal_numeric_compare_f32(x.t.data, y.t.data, x.numel, &m);
    Py_END_ALLOW_THREADS
    qcal_py_f32_release(&x);
    qcal_py_f32_release(&y);
    if (st < 0)
        return qcal_py_raise_status(st);
    switch (which) {
    case 0: return PyFloat_FromDouble(m.sqnr_db);
    case 1: return PyFloat_FromDouble(m.l2);
    default: return PyFloat_FromDouble(m.cosine);
    }
}

static PyObject *py_sqnr(PyObject *mod, PyObject *args)
{
    (void)mod;
    return metrics_common(args, 0);
}

static PyObject *py_l2(PyObject *mod, PyObject *args)
{
    (void)mod;
    return metrics_common(args, 1);
}

static PyObject *py_cosine(PyObject *mod, PyObject *args)
{
    (void)mod;
    return metrics_common(args, 2);
}

/* ---- numeric logger (qcal.torch's activation loggers) ---------------------------------- */

typedef struct {
    PyObject_HEAD
    qcal_numeric_logger *lg;
} NumericLoggerObject;

static void NumericLogger_dealloc(NumericLoggerObject *self)
{
    qcal_numeric_logger_destroy(&self->lg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* NumericLogger(csv=None): the statistics records of `qcal stats`; csv: the CSV written
 * atomically by finish(). */
static int NumericLogger_init(NumericLoggerObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"csv", NULL};
    const char *csv = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z:NumericLogger", kwlist, &csv))
        return -1;
    qcal_numeric_logger_options o;
    qcal_numeric_logger_options_default(&o);
    o.csv_path = csv;
    qcal_numeric_logger *lg = NULL;
    qcal_status st = qcal_numeric_logger_create(&o, &lg);
    if (st < 0) {
        qcal_py_raise_status(st);
        return -1;
    }
    qcal_numeric_logger_destroy(&self->lg);
    self->lg = lg;
    return 0;
}

/* log(kind, fqn, op, x, mkn=None): kind "act" or "param"; mkn=(M, K, N) for a linear. */
static PyObject *NumericLogger_log(NumericLoggerObject *self, PyObject *args)
{
    const char *kind, *fqn, *op;
    PyObject *x, *mkn = Py_None;
    if (!PyArg_ParseTuple(args, "sssO|O:log", &kind, &fqn, &op, &x, &mkn))
        return NULL;
    if (!self->lg) {
        PyErr_SetString(qcal_py_err_state, "logger is not initialised");
        return NULL;
    }
    qcal_numeric_log_kind t;
    if (!strcmp(kind, "act"))
        t = QCAL_NUMERIC_LOG_ACT;
    else if (!strcmp(kind, "param"))
        t = QCAL_NUMERIC_LOG_PARAM;
    else {
        PyErr_Format(qcal_py_err_invalid, "kind '%s': expected 'act' or 'param'", kind);
        return NULL;
    }
    long long m = 0, k = 0, n = 0;
    if (mkn != Py_None && !PyArg_ParseTuple(mkn, "LLL", &m, &k, &n))
        return NULL;
    qcal_py_f32 in;
    if (qcal_py_f32_get(x, &in) < 0)
        return NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mkn != Py_None ? qcal_numeric_logger_log_linear(self->lg, fqn, op, m, k, n, &in.t)
                        : qcal_numeric_logger_log(self->lg, t, fqn, op, NULL, &in.t);
    Py_END_ALLOW_THREADS
    qcal_py_f32_release(&in);
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *NumericLogger_finish(NumericLoggerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->lg) {
        PyErr_SetString(qcal_py_err_state, "logger is not initialised");
        return NULL;
    }
    qcal_status st = qcal_numeric_logger_finish(self->lg);
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *NumericLogger_count(NumericLoggerObject *self, PyObject *noargs)
{
    (void)noargs;
    int64_t n = 0;
    if (self->lg)
        qcal_numeric_logger_count(self->lg, &n);
    return PyLong_FromLongLong((long long)n);
}

static PyMethodDef NumericLogger_methods[] = {
    {"log", (PyCFunction)NumericLogger_log, METH_VARARGS,
     "log(kind, fqn, op, x, mkn=None): one record ('act' or 'param'; mkn=(M, K, N) for a "
     "linear's input)."},
    {"finish", (PyCFunction)NumericLogger_finish, METH_NOARGS,
     "finish(): commit the CSV atomically; later log calls fail."},
    {"count", (PyCFunction)NumericLogger_count, METH_NOARGS, "count() -> records so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NumericLoggerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal.NumericLogger",
    .tp_basicsize = sizeof(NumericLoggerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NumericLogger(csv=None): qcal's numeric logger (the columns of `qcal stats`).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)NumericLogger_init,
    .tp_dealloc = (destructor)NumericLogger_dealloc,
    .tp_methods = NumericLogger_methods,
};

static PyMethodDef numeric_methods[] = {
    {"sqnr", py_sqnr, METH_VARARGS,
     "sqnr(x, y) -> float: 20 log10(||x|| / ||x - y||) in dB (x reference, y quantized)."},
    {"l2", py_l2, METH_VARARGS, "l2(x, y) -> float: ||x - y|| / ||x||."},
    {"cosine", py_cosine, METH_VARARGS, "cosine(x, y) -> float: cosine similarity."},
    {NULL, NULL, 0, NULL},
};

int qcal_py_numeric_init(PyObject *module)
{
    if (qcal_py_add_type(module, "NumericLogger", &NumericLoggerType) < 0)
        return -1;
    return PyModule_AddFunctions(module, numeric_methods);
}
