/* What the files of the qcal._qcal extension share (python/_qcal.c: the module, errors,
 * Observer, Session, Table, kernels; python/_qcal_onnx.c: ONNX models run in the engine).
 * Not installed; one extension module, so these symbols never leave it. */
#ifndef QCAL_PY_INTERNAL_H
#define QCAL_PY_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>

#include <qcal/qcal.h>

/* qcal.Table: one calibration table, owned. */
typedef struct {
    PyObject_HEAD
    qcal_calib_table *t;
    bool allow_empty;     /* entries without data were allowed (Session.table(allow_empty=True)) */
} qcal_py_table;

/* qcal.Session (the C base of the package's Session): one calibration session, owned. */
typedef struct {
    PyObject_HEAD
    qcal_calib_session *s;
} qcal_py_session;

/* The types (ready once the module is initialised). */
extern PyTypeObject *const qcal_py_table_type;
extern PyTypeObject *const qcal_py_session_type;

/* The qcal.Error subclass of a failing status (qcal.Error for a status without one). */
PyObject *qcal_py_error_type(qcal_status st);

/* Raises the exception of a failing status with qcal_last_error(); returns NULL. */
PyObject *qcal_py_raise_status(qcal_status st);

/* A new qcal.Table owning t (destroyed on failure). */
PyObject *qcal_py_table_wrap(qcal_calib_table *t, bool allow_empty);

/* Adds the ONNX functions (python/_qcal_onnx.c) to the module; 0, or -1 with an exception. */
int qcal_py_onnx_init(PyObject *module);

#endif
