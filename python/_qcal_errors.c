/* qcal._qcal's exceptions (qcal.Error and its subclasses, each also a builtin exception a
 * Python user would catch), a status turned into one, and the helper that adds a type to
 * the module: what every file of the binding uses, below all of them. */
#include "_qcal_shared.h"

#include <stdio.h>

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *Error;          /* qcal.Error(Exception) */

/* The subclasses (_qcal_shared.h names each one's bases). */
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

int qcal_py_errors_init(PyObject *m)
{
    Error = PyErr_NewExceptionWithDoc("qcal.Error", "A libqcal call failed.", NULL, NULL);
    if (!Error)
        return -1;
    Py_INCREF(Error);
    if (PyModule_AddObject(m, "Error", Error) < 0)
        return -1;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (!(*errors[i].slot = new_error(m, errors[i].name, *errors[i].base, errors[i].doc)))
            return -1;
    return 0;
}
