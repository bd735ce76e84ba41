/* qcal._qcal, conversions: Python values <-> the library's (_qcal_shared.h declares them).
 *
 * Inputs: float32 tensors from buffers (in place when C-contiguous float32, else through the
 * package's qcal._coerce_f32) and from torch tensors read at data_ptr(). Outputs: numpy
 * arrays over bytearrays (numpy.frombuffer: numpy needed at run time, not to build), the
 * qparams arrays, and dicts built from field tables (qcal_py_dict_fields), which is how
 * Observer.config, Table.entries and the ONNX reports are written. */
#include "_qcal_shared.h"

#include <math.h>
#include <string.h>

static PyObject *coerce_f32;          /* qcal._coerce_f32, set by the package */
static PyObject *np_frombuffer;       /* numpy.frombuffer, imported on first use */

/* ---- inputs -------------------------------------------------------------------------- */

static bool is_f32_format(const char *f)
{
    if (!f)
        return false;
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return f[0] == 'f' && f[1] == 0;
}

int qcal_py_f32_view(qcal_py_f32 *in)
{
    if (in->view.ndim > QCAL_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "array has %d dimensions; qcal supports at most %d",
                     in->view.ndim, QCAL_MAX_DIMS);
        return -1;
    }
    int64_t shape[QCAL_MAX_DIMS];
    for (int i = 0; i < in->view.ndim; i++)
        shape[i] = in->view.shape[i];
    qcal_status st = qcal_tensor_init(&in->t, in->view.buf, in->view.ndim, shape);
    if (st < 0) {
        qcal_py_raise_status(st);
        return -1;
    }
    in->numel = (int64_t)(in->view.len / 4);
    return 0;
}

/* ---- torch tensors, read in place ---------------------------------------------------
 * torch.Tensor has no buffer protocol, and Tensor.numpy() / detach() cost ~1-2 us each: a
 * CPU float32 tensor that is strided, contiguous and not a negated view (torch._neg_view
 * sets a bit the raw memory does not show) is read at data_ptr() instead. torch is never
 * imported here: the fast path is live once the program has imported it. */
static PyObject *torch_tensor_type;   /* torch.Tensor */
static PyObject *torch_float32;       /* torch.float32 */
static PyObject *torch_strided;       /* torch.strided */
static PyObject *s_dtype, *s_layout, *s_is_cpu, *s_is_contiguous, *s_is_neg, *s_shape,
                *s_data_ptr, *s_torch;

static bool torch_ready(void)
{
    if (torch_tensor_type)
        return true;
    PyObject *torch = PyImport_GetModule(s_torch);   /* only if already imported */
    if (!torch) {
        PyErr_Clear();
        return false;
    }
    PyObject *t = PyObject_GetAttrString(torch, "Tensor");
    PyObject *f = PyObject_GetAttrString(torch, "float32");
    PyObject *l = PyObject_GetAttrString(torch, "strided");
    Py_DECREF(torch);
    if (!t || !f || !l || !PyType_Check(t)) {
        PyErr_Clear();
        Py_XDECREF(t);
        Py_XDECREF(f);
        Py_XDECREF(l);
        return false;   /* a partly initialised torch (import in progress): slow path */
    }
    torch_float32 = f;
    torch_strided = l;
    torch_tensor_type = t;
    return true;
}

/* 1 when attribute `name` of x is True, 0 when False, -1 with an exception. call: a
 * method to call without arguments. */
static int attr_true(PyObject *x, PyObject *name, bool call)
{
    PyObject *v = call ? PyObject_CallMethodNoArgs(x, name) : PyObject_GetAttr(x, name);
    if (!v)
        return -1;
    int r = v == Py_True;
    Py_DECREF(v);
    return r;
}

/* x as a float32 view when it is a CPU float32 contiguous strided tensor: 1 (in filled, a
 * reference to x held), 0 (not such a tensor: take the general path), -1 (exception). */
static int torch_view(PyObject *x, qcal_py_f32 *in, bool writable)
{
    (void)writable;   /* tensors have no read-only flag */
    if (!torch_ready() || !PyObject_TypeCheck(x, (PyTypeObject *)torch_tensor_type))
        return 0;
    PyObject *v = PyObject_GetAttr(x, s_dtype);
    if (!v)
        return -1;
    bool f32 = v == torch_float32;
    Py_DECREF(v);
    if (!f32)
        return 0;
    if (!(v = PyObject_GetAttr(x, s_layout)))
        return -1;
    bool strided = v == torch_strided;
    Py_DECREF(v);
    if (!strided)
        return 0;
    int r;
    if ((r = attr_true(x, s_is_cpu, false)) <= 0 || (r = attr_true(x, s_is_contiguous, true)) <= 0)
        return r;
    if ((r = attr_true(x, s_is_neg, true)) != 0)
        return r < 0 ? -1 : 0;
    PyObject *shape = PyObject_GetAttr(x, s_shape);
    if (!shape)
        return -1;
    if (!PyTuple_Check(shape)) {
        Py_DECREF(shape);
        return 0;
    }
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd > QCAL_MAX_DIMS) {
        Py_DECREF(shape);
        PyErr_Format(PyExc_ValueError, "tensor has %zd dimensions; qcal supports at most %d",
                     nd, QCAL_MAX_DIMS);
        return -1;
    }
    int64_t dims[QCAL_MAX_DIMS];
    int64_t numel = 1;
    for (Py_ssize_t i = 0; i < nd; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        numel *= dims[i];
    }
    Py_DECREF(shape);
    if (PyErr_Occurred())
        return -1;
    PyObject *p = PyObject_CallMethodNoArgs(x, s_data_ptr);
    if (!p)
        return -1;
    void *data = PyLong_AsVoidPtr(p);
    Py_DECREF(p);
    if (!data && PyErr_Occurred())
        return -1;
    static float empty_data;
    qcal_status st = qcal_tensor_init(&in->t, numel ? data : &empty_data, (int32_t)nd, dims);
    if (st < 0) {
        qcal_py_raise_status(st);
        return -1;
    }
    in->numel = numel;
    Py_INCREF(x);
    in->owner = x;
    return 1;
}

/* Gets x as a C-contiguous float32 tensor (read only). */
int qcal_py_f32_get(PyObject *x, qcal_py_f32 *in)
{
    memset(in, 0, sizeof *in);
    int tv = torch_view(x, in, false);
    if (tv != 0)
        return tv > 0 ? 0 : -1;
    if (PyObject_CheckBuffer(x) && !PyBytes_Check(x) && !PyByteArray_Check(x)) {
        if (PyObject_GetBuffer(x, &in->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
            if (in->view.itemsize == 4 && is_f32_format(in->view.format)) {
                in->held = true;
                if (qcal_py_f32_view(in) < 0) {
                    PyBuffer_Release(&in->view);
                    in->held = false;
                    return -1;
                }
                return 0;
            }
            PyBuffer_Release(&in->view);
        } else {
            PyErr_Clear();
        }
    }
    if (!coerce_f32) {
        PyErr_SetString(PyExc_TypeError, "expected a C-contiguous float32 array");
        return -1;
    }
    PyObject *conv = PyObject_CallOneArg(coerce_f32, x);
    if (!conv)
        return -1;
    if (PyObject_GetBuffer(conv, &in->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(conv);
        return -1;
    }
    if (in->view.itemsize != 4 || !is_f32_format(in->view.format)) {
        PyBuffer_Release(&in->view);
        Py_DECREF(conv);
        PyErr_SetString(PyExc_TypeError, "internal: conversion did not give float32");
        return -1;
    }
    in->held = true;
    in->owner = conv;
    if (qcal_py_f32_view(in) < 0) {
        PyBuffer_Release(&in->view);
        Py_CLEAR(in->owner);
        in->held = false;
        return -1;
    }
    return 0;
}

/* Gets x as a writable C-contiguous float32 destination (a CPU float32 contiguous tensor
 * or a writable float32 buffer); no conversion: TypeError otherwise. */
int qcal_py_f32_get_out(PyObject *x, qcal_py_f32 *in)
{
    memset(in, 0, sizeof *in);
    int tv = torch_view(x, in, true);
    if (tv != 0)
        return tv > 0 ? 0 : -1;
    if (PyObject_GetBuffer(x, &in->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    in->held = true;
    if (in->view.itemsize != 4 || !is_f32_format(in->view.format)) {
        PyBuffer_Release(&in->view);
        in->held = false;
        PyErr_SetString(PyExc_TypeError, "expected a writable C-contiguous float32 array");
        return -1;
    }
    if (qcal_py_f32_view(in) < 0) {
        PyBuffer_Release(&in->view);
        in->held = false;
        return -1;
    }
    return 0;
}

/* A writable view with t's shape over buf (an output as large as the input t). */
qcal_tensor_mut qcal_py_mut_like(const qcal_tensor *t, void *buf)
{
    qcal_tensor_mut m = { .data = buf, .ndim = t->ndim };
    memcpy(m.shape, t->shape, sizeof m.shape);
    return m;
}

/* The data of a destination taken with qcal_py_f32_get_out (checked writable there). */
float *qcal_py_f32_out_data(qcal_py_f32 *in)
{
    return (float *)in->t.data;
}

void qcal_py_f32_release(qcal_py_f32 *in)
{
    if (in->held)
        PyBuffer_Release(&in->view);
    in->held = false;
    Py_CLEAR(in->owner);
}

/* ---- outputs ------------------------------------------------------------------------- */

/* A new writable 1-D numpy array of n elements of dtype ("float32", "int32", ...) over a
 * bytearray; *data gets its memory. */
PyObject *qcal_py_new_array(const char *dtype, Py_ssize_t n, Py_ssize_t itemsize, void **data)
{
    if (!np_frombuffer) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np)
            return NULL;
        np_frombuffer = PyObject_GetAttrString(np, "frombuffer");
        Py_DECREF(np);
        if (!np_frombuffer)
            return NULL;
    }
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, n * itemsize);
    if (!ba)
        return NULL;
    if (n)
        memset(PyByteArray_AS_STRING(ba), 0, (size_t)(n * itemsize));
    *data = PyByteArray_AS_STRING(ba);
    PyObject *arr = PyObject_CallFunction(np_frombuffer, "Os", ba, dtype);
    Py_DECREF(ba);
    return arr;
}

PyObject *qcal_py_f32_array(const float *src, int64_t n)
{
    void *d;
    PyObject *a = qcal_py_new_array("float32", (Py_ssize_t)n, 4, &d);
    if (a && n)
        memcpy(d, src, (size_t)n * 4);
    return a;
}

/* (scale float32[n], zero_point int32[n]) of a qparams value; float32 zero points for
 * per_channel_affine_float_qparams. */
PyObject *qcal_py_qparams_arrays(const qcal_qparams *qp)
{
    int64_t n = qp->channels < 1 ? 1 : qp->channels;
    bool fzp = qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    void *sd, *zd;
    PyObject *s = qcal_py_new_array("float32", (Py_ssize_t)n, 4, &sd);
    PyObject *z = s ? qcal_py_new_array(fzp ? "float32" : "int32", (Py_ssize_t)n, 4, &zd) : NULL;
    PyObject *res = NULL;
    if (s && z) {
        for (int64_t c = 0; c < n; c++) {
            ((float *)sd)[c] = qcal_qparams_scale_at(qp, c);
            if (fzp)
                ((float *)zd)[c] = qcal_qparams_zero_point_float_at(qp, c);
            else
                ((int32_t *)zd)[c] = qcal_qparams_zero_point_at(qp, c);
        }
        res = PyTuple_Pack(2, s, z);
    }
    Py_XDECREF(s);
    Py_XDECREF(z);
    return res;
}

int qcal_py_dict_set_steal(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

/* ---- dicts from field tables ---------------------------------------------------------- */

/* The value of one field as a new Python object (NULL with an exception). */
static PyObject *field_value(const char *base, const qcal_py_field *f)
{
    const char *at = base + f->offset;
    switch (f->type) {
/* A field held in one C value v of type ctype (memcpy: the offset needs no alignment). */
#define ONE_VALUE(tag, ctype, expr) \
    case tag: {                     \
        ctype v;                    \
        memcpy(&v, at, sizeof v);   \
        return expr;                \
    }
    ONE_VALUE(QCAL_PY_BOOL, bool, PyBool_FromLong(v))
    ONE_VALUE(QCAL_PY_I32, int32_t, PyLong_FromLong(v))
    ONE_VALUE(QCAL_PY_I64, int64_t, PyLong_FromLongLong(v))
    ONE_VALUE(QCAL_PY_U64, uint64_t, PyLong_FromUnsignedLongLong(v))
    ONE_VALUE(QCAL_PY_F32, float, PyFloat_FromDouble(v))
    ONE_VALUE(QCAL_PY_F64, double, PyFloat_FromDouble(v))
    ONE_VALUE(QCAL_PY_STR, const char *,
              PyUnicode_DecodeUTF8(v, (Py_ssize_t)strlen(v), "surrogateescape"))
    ONE_VALUE(QCAL_PY_DTYPE, qcal_dtype, PyUnicode_FromString(qcal_dtype_name(v)))
    ONE_VALUE(QCAL_PY_QSCHEME, qcal_qscheme, PyUnicode_FromString(qcal_qscheme_name(v)))
    ONE_VALUE(QCAL_PY_ROLE, qcal_calib_role, PyUnicode_FromString(qcal_calib_role_name(v)))
    ONE_VALUE(QCAL_PY_KIND, qcal_observer_kind,
              PyUnicode_FromString(qcal_observer_kind_name(v)))
    /* the enums of choice fields are int-sized (the files that use them check it) */
    ONE_VALUE(QCAL_PY_CHOICE, int,
              PyUnicode_FromString(f->names[v >= 0 && (size_t)v < f->aux ? v : 0]))
#undef ONE_VALUE
    case QCAL_PY_FIGURE: {
        double v;
        memcpy(&v, at, sizeof v);
        if (isnan(v))
            Py_RETURN_NONE;
        return PyFloat_FromDouble(v);
    }
    case QCAL_PY_QMIN:
    case QCAL_PY_QMAX: {
        qcal_qconfig q;
        int64_t qmin = 0, qmax = 0;
        memcpy(&q, at, sizeof q);
        qcal_qconfig_range(&q, &qmin, &qmax);
        return PyLong_FromLongLong(f->type == QCAL_PY_QMIN ? qmin : qmax);
    }
    case QCAL_PY_NAMES: {
        char **v;
        int64_t n;
        memcpy(&v, at, sizeof v);
        memcpy(&n, base + f->aux, sizeof n);
        PyObject *l = PyList_New((Py_ssize_t)n);
        for (int64_t i = 0; l && i < n; i++) {
            PyObject *s = PyUnicode_FromString(v[i] ? v[i] : "");
            if (!s) {
                Py_CLEAR(l);
                break;
            }
            PyList_SET_ITEM(l, (Py_ssize_t)i, s);
        }
        return l;
    }
    }
    PyErr_Format(PyExc_SystemError, "internal: field '%s' has type %d", f->key, (int)f->type);
    return NULL;
}

int qcal_py_dict_fields(PyObject *d, const void *base, const qcal_py_field *fields,
                        size_t n, uint32_t select)
{
    for (size_t i = 0; i < n; i++) {
        const qcal_py_field *f = &fields[i];
        if (f->when && !(f->when & select))
            continue;
        if (qcal_py_dict_set_steal(d, f->key, field_value(base, f)) < 0)
            return -1;
    }
    return 0;
}

/* ---- the package's converter, torch's names ---------------------------------------------- */

static PyObject *py_set_coercer(PyObject *mod, PyObject *fn)
{
    (void)mod;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "coercer must be callable");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(coerce_f32, fn);
    Py_RETURN_NONE;
}

static PyMethodDef convert_methods[] = {
    {"_set_coercer", py_set_coercer, METH_O, "internal: the float32 input converter."},
    {NULL, NULL, 0, NULL},
};

int qcal_py_convert_init(PyObject *module)
{
    if (!(s_dtype = PyUnicode_InternFromString("dtype")) ||
        !(s_layout = PyUnicode_InternFromString("layout")) ||
        !(s_is_cpu = PyUnicode_InternFromString("is_cpu")) ||
        !(s_is_contiguous = PyUnicode_InternFromString("is_contiguous")) ||
        !(s_is_neg = PyUnicode_InternFromString("is_neg")) ||
        !(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_data_ptr = PyUnicode_InternFromString("data_ptr")) ||
        !(s_torch = PyUnicode_InternFromString("torch")))
        return -1;
    return PyModule_AddFunctions(module, convert_methods);
}
