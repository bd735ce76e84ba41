/* qcal._qcal: the CPython extension behind the `qcal` package.
 *
 * Thin by design: every number comes from libqcal; these files only convert between Python
 * objects and the library's types. Inputs are read through the buffer protocol (no numpy C
 * headers): a C-contiguous float32 buffer is used in place; anything else goes through
 * qcal._coerce_f32 (Python), which converts float dtypes and non-contiguous arrays with a
 * copy and raises TypeError for everything else. Outputs are numpy arrays created with
 * numpy.frombuffer over a bytearray, so numpy is needed at run time but not to build.
 * Library failures become qcal.Error subclasses carrying qcal_last_error(). The GIL is
 * released inside kernels; each Observer has its own lock, so two threads may share one.
 *
 * This file is the module: the exception classes, the thread count, the version, and the
 * init that lets each type's file add itself (_qcal_internal.h lists the files). */
#include "_qcal_internal.h"

#include <stdio.h>

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *Error;          /* qcal.Error(Exception) */

/* The subclasses (_qcal_internal.h names each one's bases). */
PyObject *qcal_py_err_invalid;
PyObject *qcal_py_err_format;
PyObject *qcal_py_err_unsupported;
PyObject *qcal_py_err_nonfinite;
PyObject *qcal_py_err_mismatch;
PyObject *qcal_py_err_empty;
PyObject *qcal_py_err_file;
PyObject *qcal_py_err_memory;
PyObject *qcal_py_err_overflow;
PyObject *qcal_py_err_state;
PyObject *qcal_py_err_backend;
PyObject *qcal_py_err_not_found;
PyObject *qcal_py_err_no_data;

PyObject *qcal_py_error_type(qcal_status st)
{
    PyObject *type = Error;
    switch (st) {
    case QCAL_ERR_INVALID_ARG: type = qcal_py_err_invalid; break;
    case QCAL_ERR_FORMAT: type = qcal_py_err_format; break;
    case QCAL_ERR_UNSUPPORTED: type = qcal_py_err_unsupported; break;
    case QCAL_ERR_NONFINITE: type = qcal_py_err_nonfinite; break;
    case QCAL_ERR_MISMATCH: type = qcal_py_err_mismatch; break;
    case QCAL_ERR_EMPTY: type = qcal_py_err_empty; break;
    case QCAL_ERR_IO: type = qcal_py_err_file; break;
    case QCAL_ERR_NO_MEMORY: type = qcal_py_err_memory; break;
    case QCAL_ERR_OVERFLOW: type = qcal_py_err_overflow; break;
    case QCAL_ERR_STATE: type = qcal_py_err_state; break;
    case QCAL_ERR_BACKEND: type = qcal_py_err_backend; break;
    case QCAL_ERR_NOT_FOUND: type = qcal_py_err_not_found; break;
    default: break;
    }
    return type;
}

PyObject *qcal_py_raise_status(qcal_status st)
{
    const char *msg = qcal_last_error();
    if (!msg || !*msg)
        msg = qcal_status_str(st);
    PyErr_SetString(qcal_py_error_type(st), msg);
    return NULL;
}

/* ---- module ---------------------------------------------------------------------------- */

static PyObject *py_set_num_threads(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < INT32_MIN || n > INT32_MAX) {
        PyErr_Format(qcal_py_err_invalid, "thread count %ld is out of range", n);
        return NULL;
    }
    qcal_status st = qcal_threads_set_count((int)n);
    if (st < 0)
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyLong_FromLong(qcal_threads_count());
}

static PyObject *py_version(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyUnicode_FromString(qcal_version());
}

static PyMethodDef module_methods[] = {
    {"set_num_threads", py_set_num_threads, METH_O,
     "set_num_threads(n): cap libqcal's kernels at n OpenMP threads (0: the default, "
     "OMP_NUM_THREADS or the core count); results do not depend on it."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS,
     "get_num_threads() -> int: the thread count libqcal's kernels use."},
    {"version", py_version, METH_NOARGS, "version() -> str: libqcal's version."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "qcal._qcal", "libqcal bindings (use the qcal package).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

/* The qcal.Error subclasses: each also derives from the builtin exception a Python user
 * would catch for that failure. */
static const struct {
    PyObject **slot;
    const char *name;
    PyObject **base;
    const char *doc;
} errors[] = {
    {&qcal_py_err_invalid, "InvalidArgumentError", &PyExc_ValueError,
     "An argument or option is impossible."},
    {&qcal_py_err_format, "FormatError", &PyExc_ValueError,
     "A file or buffer is malformed or truncated."},
    {&qcal_py_err_unsupported, "UnsupportedError", &PyExc_ValueError,
     "Well formed but not supported."},
    {&qcal_py_err_nonfinite, "NonFiniteError", &PyExc_ValueError,
     "NaN/Inf seen while the policy says it is an error."},
    {&qcal_py_err_mismatch, "MismatchError", &PyExc_ValueError,
     "Shapes, kinds or configs do not agree."},
    {&qcal_py_err_empty, "EmptyError", &PyExc_ValueError,
     "A tensor has zero elements where data is required."},
    {&qcal_py_err_file, "FileError", &PyExc_OSError,
     "A file could not be opened, read, written or renamed."},
    {&qcal_py_err_memory, "OutOfMemoryError", &PyExc_MemoryError, "An allocation failed."},
    {&qcal_py_err_overflow, "SizeOverflowError", &PyExc_OverflowError,
     "A size computation would overflow."},
    {&qcal_py_err_state, "StateError", &PyExc_RuntimeError,
     "The object is not in a state that allows the call."},
    {&qcal_py_err_backend, "BackendError", &PyExc_RuntimeError,
     "A backend (oneDNN, ONNX Runtime) reported a failure."},
    {&qcal_py_err_not_found, "NotFoundError", &PyExc_LookupError,
     "A named item does not exist."},
    {&qcal_py_err_no_data, "NoDataError", &PyExc_ValueError,
     "A tensor saw no finite value (allow_empty=False)."},
};

static PyObject *new_error(PyObject *m, const char *name, PyObject *base2, const char *doc)
{
    char full[96];
    snprintf(full, sizeof full, "qcal.%s", name);
    PyObject *bases = base2 ? PyTuple_Pack(2, Error, base2) : NULL;
    if (base2 && !bases)
        return NULL;
    PyObject *e = PyErr_NewExceptionWithDoc(full, doc, bases ? bases : Error, NULL);
    Py_XDECREF(bases);
    if (!e)
        return NULL;
    Py_INCREF(e);
    if (PyModule_AddObject(m, name, e) < 0) {
        Py_DECREF(e);
        Py_DECREF(e);
        return NULL;
    }
    return e;
}

int qcal_py_add_type(PyObject *module, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__qcal(void);

PyMODINIT_FUNC PyInit__qcal(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Error = PyErr_NewExceptionWithDoc("qcal.Error", "A libqcal call failed.", NULL, NULL);
    if (!Error)
        goto fail;
    Py_INCREF(Error);
    if (PyModule_AddObject(m, "Error", Error) < 0)
        goto fail;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (!(*errors[i].slot = new_error(m, errors[i].name, *errors[i].base, errors[i].doc)))
            goto fail;
    /* Types in the order the module has always listed them; functions after them. */
    if (qcal_py_convert_init(m) < 0 || qcal_py_observer_init(m) < 0 ||
        qcal_py_table_init(m) < 0 || qcal_py_session_init(m) < 0 ||
        qcal_py_numeric_init(m) < 0 || qcal_py_fakequant_init(m) < 0 ||
        qcal_py_onnx_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
