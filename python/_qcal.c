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
 * This file is the module: the thread count, the version, and the init that lets the
 * errors (_qcal_errors.c) and each type's file add themselves (_qcal_shared.h lists the
 * files). */
#include "_qcal_shared.h"

#include <stdio.h>

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

PyMODINIT_FUNC PyInit__qcal(void);

PyMODINIT_FUNC PyInit__qcal(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (qcal_py_errors_init(m) < 0)
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
