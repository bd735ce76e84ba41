/* What the files of the qcal._qcal extension share. One extension module, one file per
 * type (docs/python.md, "How the extension is laid out"):
 *
 *   _qcal.c            the module: errors, threads, version; calls the files' init below
 *   _qcal_convert.c    Python <-> library values: float32 inputs (buffers, torch tensors
 *                      read in place), numpy outputs, qparams arrays, dicts from field tables
 *   _qcal_observer.c   qcal.Observer and its config <-> dict
 *   _qcal_session.c    qcal.Session, dump directories
 *   _qcal_table.c      qcal.Table (formats, export options, entries, repr)
 *   _qcal_fakequant.c  quantize, dequantize, fake-quant (straight-through and LSQ)
 *   _qcal_numeric.c    sqnr / l2 / cosine, qcal.NumericLogger
 *   _qcal_onnx.c       ONNX models run in the engine (qcal.onnx)
 *
 * Not installed; the symbols never leave the extension. */
#ifndef QCAL_PY_INTERNAL_H
#define QCAL_PY_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <qcal/qcal.h>

/* ---- errors (_qcal.c) ------------------------------------------------------------------- */

/* The qcal.Error subclasses (set once the module is initialised). */
extern PyObject *qcal_py_err_invalid;     /* InvalidArgumentError(Error, ValueError) */
extern PyObject *qcal_py_err_format;      /* FormatError(Error, ValueError) */
extern PyObject *qcal_py_err_unsupported; /* UnsupportedError(Error, ValueError) */
extern PyObject *qcal_py_err_nonfinite;   /* NonFiniteError(Error, ValueError) */
extern PyObject *qcal_py_err_mismatch;    /* MismatchError(Error, ValueError) */
extern PyObject *qcal_py_err_empty;       /* EmptyError(Error, ValueError) */
extern PyObject *qcal_py_err_file;        /* FileError(Error, OSError) */
extern PyObject *qcal_py_err_memory;      /* OutOfMemoryError(Error, MemoryError) */
extern PyObject *qcal_py_err_overflow;    /* SizeOverflowError(Error, OverflowError) */
extern PyObject *qcal_py_err_state;       /* StateError(Error, RuntimeError) */
extern PyObject *qcal_py_err_backend;     /* BackendError(Error, RuntimeError) */
extern PyObject *qcal_py_err_not_found;   /* NotFoundError(Error, LookupError) */
extern PyObject *qcal_py_err_no_data;     /* NoDataError(Error, ValueError) */

/* The qcal.Error subclass of a failing status (qcal.Error for a status without one). */
PyObject *qcal_py_error_type(qcal_status st);

/* Raises the exception of a failing status with qcal_last_error(); returns NULL. */
PyObject *qcal_py_raise_status(qcal_status st);

/* ---- inputs and outputs (_qcal_convert.c) ------------------------------------------------ */

/* A float32 input: the buffer view plus, when it had to be converted, the converted
 * object that owns the data. Release with qcal_py_f32_release. */
typedef struct qcal_py_f32 {
    Py_buffer view;
    PyObject *owner;
    bool held;
    qcal_tensor t;
    int64_t numel;
} qcal_py_f32;

/* Gets x as a C-contiguous float32 tensor (read only): in place when it is one (a buffer
 * or a CPU float32 contiguous torch tensor), else through qcal._coerce_f32. 0 or -1. */
int qcal_py_f32_get(PyObject *x, qcal_py_f32 *in);

/* Gets x as a writable C-contiguous float32 destination (a CPU float32 contiguous tensor
 * or a writable float32 buffer); no conversion: TypeError otherwise. 0 or -1. */
int qcal_py_f32_get_out(PyObject *x, qcal_py_f32 *in);

/* Fills in->t and in->numel from in->view (a float32 view); 0 or -1 with an exception. */
int qcal_py_f32_view(qcal_py_f32 *in);

/* The data of a destination taken with qcal_py_f32_get_out. */
float *qcal_py_f32_out_data(qcal_py_f32 *in);

/* Releases what qcal_py_f32_get / _get_out hold (safe to call twice). */
void qcal_py_f32_release(qcal_py_f32 *in);

/* A writable view with t's shape over buf (an output as large as the input t). */
qcal_tensor_mut qcal_py_mut_like(const qcal_tensor *t, void *buf);

/* A new writable 1-D numpy array of n elements of dtype ("float32", "int32", ...) over a
 * zeroed bytearray; *data gets its memory. */
PyObject *qcal_py_new_array(const char *dtype, Py_ssize_t n, Py_ssize_t itemsize, void **data);

/* A new float32 numpy array holding a copy of src[0..n). */
PyObject *qcal_py_f32_array(const float *src, int64_t n);

/* (scale float32[n], zero_point int32[n]) of a qparams value; float32 zero points for
 * per_channel_affine_float_qparams. */
PyObject *qcal_py_qparams_arrays(const qcal_qparams *qp);

/* d[key] = v, v's reference stolen (NULL v: -1, the exception already set). 0 or -1. */
int qcal_py_dict_set_steal(PyObject *d, const char *key, PyObject *v);

/* ---- dicts from C structs, one table per struct (_qcal_convert.c) -------------------------
 * The dicts the binding returns (Observer.config, Table.entries, the ONNX reports) are
 * described by tables of qcal_py_field rather than written out item by item: the key, where
 * the value lies in the struct and how it converts. */
typedef enum qcal_py_field_type {
    QCAL_PY_BOOL,         /* bool -> True/False */
    QCAL_PY_I32,          /* int32_t -> int */
    QCAL_PY_I64,          /* int64_t -> int */
    QCAL_PY_U64,          /* uint64_t -> int */
    QCAL_PY_F32,          /* float -> float */
    QCAL_PY_F64,          /* double -> float */
    QCAL_PY_FIGURE,       /* double -> float, NaN -> None (a figure that does not apply: the
                           * null of the CLI's JSON) */
    QCAL_PY_STR,          /* const char * (UTF-8, undecodable bytes kept as surrogates) */
    QCAL_PY_DTYPE,        /* qcal_dtype -> its name */
    QCAL_PY_QSCHEME,      /* qcal_qscheme -> its name */
    QCAL_PY_ROLE,         /* qcal_calib_role -> its name */
    QCAL_PY_KIND,         /* qcal_observer_kind -> its name */
    QCAL_PY_CHOICE,       /* an int-sized enum -> names[value] (names[0] out of range) */
    QCAL_PY_QMIN,         /* qcal_qconfig -> quant_min of qcal_qconfig_range */
    QCAL_PY_QMAX,         /* qcal_qconfig -> quant_max of qcal_qconfig_range */
    QCAL_PY_NAMES,        /* char ** with an int64_t count at aux -> list of str ("" for NULL) */
} qcal_py_field_type;

typedef struct qcal_py_field {
    const char *key;
    qcal_py_field_type type;
    size_t offset;             /* of the value in the struct */
    size_t aux;                /* QCAL_PY_NAMES: offset of the count; _CHOICE: names' count */
    const char *const *names;  /* QCAL_PY_CHOICE: the name of each value */
    uint32_t when;             /* 0: always; else only when when & select (qcal_py_dict_fields) */
} qcal_py_field;

/* Table rows: T the struct, member a member designator (q.dtype is fine). */
#define QCAL_PY_FIELD(key, type, T, member) { key, type, offsetof(T, member), 0, NULL, 0 }
#define QCAL_PY_FIELD_WHEN(key, type, T, member, when) \
    { key, type, offsetof(T, member), 0, NULL, when }
#define QCAL_PY_FIELD_CHOICE(key, T, member, names, when) \
    { key, QCAL_PY_CHOICE, offsetof(T, member), sizeof(names) / sizeof((names)[0]), names, \
      when }
#define QCAL_PY_FIELD_NAMES(key, T, member, count) \
    { key, QCAL_PY_NAMES, offsetof(T, member), offsetof(T, count), NULL, 0 }
#define QCAL_PY_NFIELDS(table) (sizeof(table) / sizeof((table)[0]))

/* Adds the n fields of the struct at base to the dict d in table order, those with a
 * `when` that shares no bit with select left out. 0 or -1 with an exception. */
int qcal_py_dict_fields(PyObject *d, const void *base, const qcal_py_field *fields,
                        size_t n, uint32_t select);

/* ---- the types shared between files ---------------------------------------------------- */

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

/* A new qcal.Table owning t (destroyed on failure). */
PyObject *qcal_py_table_wrap(qcal_calib_table *t, bool allow_empty);

/* Entries that saw no finite value (no_data). Not allowed: raises NoDataError naming every
 * one and returns -1. Allowed and warn: one RuntimeWarning per entry (-1 if a warning was
 * turned into an error). Else 0. */
int qcal_py_table_check_no_data(const qcal_calib_table *t, bool allow_empty, bool warn);

/* ---- what each file adds to the module: 0, or -1 with an exception ---------------------- */

int qcal_py_errors_init(PyObject *module);     /* Error and its subclasses (_qcal_errors.c) */
int qcal_py_convert_init(PyObject *module);    /* _set_coercer; torch's attribute names */
int qcal_py_observer_init(PyObject *module);   /* Observer */
int qcal_py_session_init(PyObject *module);    /* Session, _dump_scan */
int qcal_py_table_init(PyObject *module);      /* Table */
int qcal_py_fakequant_init(PyObject *module);  /* _quantize, _dequantize, _fake_quant* */
int qcal_py_numeric_init(PyObject *module);    /* sqnr, l2, cosine, NumericLogger */
int qcal_py_onnx_init(PyObject *module);       /* _OnnxModel, _ModelCalib, _onnx_available,
                                                * _engine_info, _model_compare,
                                                * _keep_float_exclude */

/* Adds a ready type to the module under name; 0 or -1 with an exception. */
int qcal_py_add_type(PyObject *module, const char *name, PyTypeObject *type);

#endif
