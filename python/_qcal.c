/* qcal._qcal: the CPython extension behind the `qcal` package.
 *
 * Thin by design: every number comes from libqcal; this file only converts between Python
 * objects and the library's types. Inputs are read through the buffer protocol (no numpy C
 * headers): a C-contiguous float32 buffer is used in place; anything else goes through
 * qcal._coerce_f32 (Python), which converts float dtypes and non-contiguous arrays with a
 * copy and raises TypeError for everything else. Outputs are numpy arrays created with
 * numpy.frombuffer over a bytearray, so numpy is needed at run time but not to build.
 * Library failures become qcal.Error subclasses carrying qcal_last_error(). The GIL is
 * released inside kernels; each Observer has its own lock, so two threads may share one. */
#include "_qcal_internal.h"

#include <pythread.h>

#include <math.h>
#include <string.h>

#include <qcal/calib_dump.h>

/* ---- errors ------------------------------------------------------------------------ */

static PyObject *Error;               /* qcal.Error(Exception) */
static PyObject *ErrInvalid;          /* InvalidArgumentError(Error, ValueError) */
static PyObject *ErrFormat;           /* FormatError(Error, ValueError) */
static PyObject *ErrUnsupported;      /* UnsupportedError(Error, ValueError) */
static PyObject *ErrNonfinite;        /* NonFiniteError(Error, ValueError) */
static PyObject *ErrMismatch;         /* MismatchError(Error, ValueError) */
static PyObject *ErrEmpty;            /* EmptyError(Error, ValueError) */
static PyObject *ErrFile;             /* FileError(Error, OSError) */
static PyObject *ErrMemory;           /* OutOfMemoryError(Error, MemoryError) */
static PyObject *ErrOverflow;         /* SizeOverflowError(Error, OverflowError) */
static PyObject *ErrState;            /* StateError(Error, RuntimeError) */
static PyObject *ErrBackend;          /* BackendError(Error, RuntimeError) */
static PyObject *ErrNotFound;         /* NotFoundError(Error, LookupError) */
static PyObject *ErrNoData;           /* NoDataError(Error, ValueError) */

static PyObject *coerce_f32;          /* qcal._coerce_f32, set by the package */
static PyObject *np_frombuffer;       /* numpy.frombuffer, imported on first use */

PyObject *qcal_py_error_type(qcal_status st)
{
    PyObject *type = Error;
    switch (st) {
    case QCAL_ERR_INVALID_ARG: type = ErrInvalid; break;
    case QCAL_ERR_FORMAT: type = ErrFormat; break;
    case QCAL_ERR_UNSUPPORTED: type = ErrUnsupported; break;
    case QCAL_ERR_NONFINITE: type = ErrNonfinite; break;
    case QCAL_ERR_MISMATCH: type = ErrMismatch; break;
    case QCAL_ERR_EMPTY: type = ErrEmpty; break;
    case QCAL_ERR_IO: type = ErrFile; break;
    case QCAL_ERR_NO_MEMORY: type = ErrMemory; break;
    case QCAL_ERR_OVERFLOW: type = ErrOverflow; break;
    case QCAL_ERR_STATE: type = ErrState; break;
    case QCAL_ERR_BACKEND: type = ErrBackend; break;
    case QCAL_ERR_NOT_FOUND: type = ErrNotFound; break;
    default: break;
    }
    return type;
}

/* Raises the exception of a failing status with the library's message; returns NULL. */
static PyObject *raise_status(qcal_status st)
{
    const char *msg = qcal_last_error();
    if (!msg || !*msg)
        msg = qcal_status_str(st);
    PyErr_SetString(qcal_py_error_type(st), msg);
    return NULL;
}

PyObject *qcal_py_raise_status(qcal_status st)
{
    return raise_status(st);
}

/* ---- inputs -------------------------------------------------------------------------- */

/* A float32 input: the buffer view plus, when it had to be converted, the converted
 * object that owns the data. Release with f32_release. */
typedef struct f32_in {
    Py_buffer view;
    PyObject *owner;
    bool held;
    qcal_tensor t;
    int64_t numel;
} f32_in;

static bool is_f32_format(const char *f)
{
    if (!f)
        return false;
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    return f[0] == 'f' && f[1] == 0;
}

static int view_to_tensor(f32_in *in)
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
        raise_status(st);
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
static int torch_view(PyObject *x, f32_in *in, bool writable)
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
        raise_status(st);
        return -1;
    }
    in->numel = numel;
    Py_INCREF(x);
    in->owner = x;
    return 1;
}

/* Gets x as a C-contiguous float32 tensor (read only). */
static int f32_get(PyObject *x, f32_in *in)
{
    memset(in, 0, sizeof *in);
    int tv = torch_view(x, in, false);
    if (tv != 0)
        return tv > 0 ? 0 : -1;
    if (PyObject_CheckBuffer(x) && !PyBytes_Check(x) && !PyByteArray_Check(x)) {
        if (PyObject_GetBuffer(x, &in->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
            if (in->view.itemsize == 4 && is_f32_format(in->view.format)) {
                in->held = true;
                if (view_to_tensor(in) < 0) {
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
    if (view_to_tensor(in) < 0) {
        PyBuffer_Release(&in->view);
        Py_CLEAR(in->owner);
        in->held = false;
        return -1;
    }
    return 0;
}

/* Gets x as a writable C-contiguous float32 destination (a CPU float32 contiguous tensor
 * or a writable float32 buffer); no conversion: TypeError otherwise. */
static int f32_get_out(PyObject *x, f32_in *in)
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
    if (view_to_tensor(in) < 0) {
        PyBuffer_Release(&in->view);
        in->held = false;
        return -1;
    }
    return 0;
}

/* A writable view with t's shape over buf (an output as large as the input t). */
static qcal_tensor_mut mut_like(const qcal_tensor *t, void *buf)
{
    qcal_tensor_mut m = { .data = buf, .ndim = t->ndim };
    memcpy(m.shape, t->shape, sizeof m.shape);
    return m;
}

/* The data of a destination taken with f32_get_out (checked writable there). */
static float *f32_out_data(f32_in *in)
{
    return (float *)in->t.data;
}

static void f32_release(f32_in *in)
{
    if (in->held)
        PyBuffer_Release(&in->view);
    in->held = false;
    Py_CLEAR(in->owner);
}

/* ---- outputs ------------------------------------------------------------------------- */

/* A new writable 1-D numpy array of n elements of dtype ("float32", "int32", ...) over a
 * bytearray; *data gets its memory. */
static PyObject *new_array(const char *dtype, Py_ssize_t n, Py_ssize_t itemsize, void **data)
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

static PyObject *f32_array(const float *src, int64_t n)
{
    void *d;
    PyObject *a = new_array("float32", (Py_ssize_t)n, 4, &d);
    if (a && n)
        memcpy(d, src, (size_t)n * 4);
    return a;
}

/* (scale float32[n], zero_point int32[n]) of a qparams value; float32 zero points for
 * per_channel_affine_float_qparams. */
static PyObject *qparams_arrays(const qcal_qparams *qp)
{
    int64_t n = qp->channels < 1 ? 1 : qp->channels;
    bool fzp = qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    void *sd, *zd;
    PyObject *s = new_array("float32", (Py_ssize_t)n, 4, &sd);
    PyObject *z = s ? new_array(fzp ? "float32" : "int32", (Py_ssize_t)n, 4, &zd) : NULL;
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

/* ---- observer config <-> Python ------------------------------------------------------- */

/* Formats a Python value as the rules file spells it: bools true/false, numbers with
 * repr (exact for floats), strings as they are. Returns a new str or NULL. */
static PyObject *config_value_str(PyObject *v)
{
    if (PyBool_Check(v))
        return PyUnicode_FromString(v == Py_True ? "true" : "false");
    if (PyLong_Check(v) || PyFloat_Check(v))
        return PyObject_Repr(v);
    if (PyUnicode_Check(v)) {
        Py_INCREF(v);
        return v;
    }
    /* torch dtypes and qschemes print as "torch.qint8": the package maps them first. */
    PyErr_Format(PyExc_TypeError, "config value %R must be a str, bool, int or float", v);
    return NULL;
}

/* Fills *cfg from kind + keyword config through the library's one config parser
 * (qcal_observer_config_set: the keys and spellings of the CLI and rules files). */
static int config_from_python(const char *kind, PyObject *kwargs, qcal_observer_config *cfg)
{
    qcal_observer_kind k;
    qcal_status st = qcal_observer_kind_parse(kind, &k);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    qcal_observer_config_default(cfg, k);
    if (kwargs) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwargs, &pos, &key, &value)) {
            if (value == Py_None)
                continue;
            const char *ks = PyUnicode_AsUTF8(key);
            if (!ks)
                return -1;
            PyObject *vs = config_value_str(value);
            if (!vs)
                return -1;
            const char *vc = PyUnicode_AsUTF8(vs);
            st = vc ? qcal_observer_config_set(cfg, ks, vc) : QCAL_OK;
            Py_DECREF(vs);
            if (!vc)
                return -1;
            if (st < 0) {
                raise_status(st);
                return -1;
            }
        }
    }
    st = qcal_observer_config_validate(cfg);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static int dict_set_steal(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    int r = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return r;
}

/* The config as a dict of rules-file keys and Python values. */
static PyObject *config_to_python(const qcal_observer_config *cfg)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int64_t qmin = 0, qmax = 0;
    qcal_qconfig_range(&cfg->q, &qmin, &qmax);
    int bad = 0;
    bad |= dict_set_steal(d, "dtype", PyUnicode_FromString(qcal_dtype_name(cfg->q.dtype)));
    bad |= dict_set_steal(d, "qscheme", PyUnicode_FromString(qcal_qscheme_name(cfg->q.qscheme)));
    bad |= dict_set_steal(d, "reduce_range", PyBool_FromLong(cfg->q.reduce_range));
    bad |= dict_set_steal(d, "quant_min", PyLong_FromLongLong(qmin));
    bad |= dict_set_steal(d, "quant_max", PyLong_FromLongLong(qmax));
    bad |= dict_set_steal(d, "eps", PyFloat_FromDouble(cfg->q.eps));
    bool pc = cfg->kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
              cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
    bool ma = cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX ||
              cfg->kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
    bool hist = cfg->kind >= QCAL_OBSERVER_HISTOGRAM;
    if (pc)
        bad |= dict_set_steal(d, "axis", PyLong_FromLong(cfg->axis));
    if (ma)
        bad |= dict_set_steal(d, "averaging_constant", PyFloat_FromDouble(cfg->averaging_constant));
    if (hist) {
        bad |= dict_set_steal(d, "bins", PyLong_FromLong(cfg->bins));
        bad |= dict_set_steal(d, "grid", PyUnicode_FromString(
            cfg->grid == QCAL_GRID_FIRST_BATCH ? "first_batch"
            : cfg->grid == QCAL_GRID_TORCH ? "torch" : "lattice"));
    }
    if (cfg->kind == QCAL_OBSERVER_PERCENTILE) {
        bad |= dict_set_steal(d, "percentile", PyFloat_FromDouble(cfg->percentile));
        bad |= dict_set_steal(d, "percentile_mode", PyUnicode_FromString(
            cfg->percentile_mode == QCAL_PERCENTILE_TWO_TAILS ? "two_tails"
            : cfg->percentile_mode == QCAL_PERCENTILE_AUTO    ? "auto"
                                                              : "abs"));
    }
    if (cfg->kind == QCAL_OBSERVER_ENTROPY)
        bad |= dict_set_steal(d, "entropy_levels", PyLong_FromLong(cfg->entropy_levels));
    bad |= dict_set_steal(d, "nonfinite", PyUnicode_FromString(
        cfg->nonfinite == QCAL_NONFINITE_ERROR ? "error" : "skip"));
    if (bad) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* ---- Observer ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    qcal_observer *obs;
    PyThread_type_lock lock;
    unsigned long long version;   /* new value from version_seq at creation and on every
                                   * change of the state (update, merge, reset, init):
                                   * qcal.torch syncs its buffers lazily. Process-wide
                                   * unique, so a copy never shows a version its original
                                   * had. Written with the GIL held. */
} ObserverObject;

static unsigned long long version_seq;

static PyTypeObject ObserverType;

/* Takes the observer's lock with the GIL released (another thread may hold it inside a
 * kernel). */
static void obs_lock(ObserverObject *self)
{
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void obs_unlock(ObserverObject *self)
{
    PyThread_release_lock(self->lock);
}

static int check_obs(ObserverObject *self)
{
    if (!self->obs || !self->lock) {
        PyErr_SetString(ErrState, "observer is not initialised");
        return -1;
    }
    return 0;
}

static PyObject *Observer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    ObserverObject *self = (ObserverObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->version = ++version_seq;
    return (PyObject *)self;
}

static int Observer_init(ObserverObject *self, PyObject *args, PyObject *kwargs)
{
    const char *kind = NULL;
    if (!PyArg_ParseTuple(args, "s:Observer", &kind))
        return -1;
    qcal_observer_config cfg;
    if (config_from_python(kind, kwargs, &cfg) < 0)
        return -1;
    qcal_observer *obs = NULL;
    qcal_status st = qcal_observer_create(&cfg, &obs);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    obs_lock(self);
    qcal_observer_destroy(&self->obs);
    self->obs = obs;
    self->version = ++version_seq;
    obs_unlock(self);
    return 0;
}

static void Observer_dealloc(ObserverObject *self)
{
    qcal_observer_destroy(&self->obs);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Feeds x; skip_empty: an empty input is ignored (torch observers' forward) instead of
 * QCAL_ERR_EMPTY. Returns 0 or -1 with an exception. */
static int observer_feed(ObserverObject *self, PyObject *x, bool skip_empty)
{
    if (check_obs(self) < 0)
        return -1;
    f32_in in;
    if (f32_get(x, &in) < 0)
        return -1;
    if (skip_empty && in.numel == 0) {
        f32_release(&in);
        return 0;
    }
    qcal_status st;
    obs_lock(self);
    if (in.numel >= 4096) {
        Py_BEGIN_ALLOW_THREADS
        st = qcal_observer_update(self->obs, &in.t);
        Py_END_ALLOW_THREADS
    } else {
        st = qcal_observer_update(self->obs, &in.t);
    }
    if (st >= 0)
        self->version = ++version_seq;
    obs_unlock(self);
    f32_release(&in);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static PyObject *Observer_update(ObserverObject *self, PyObject *x)
{
    if (observer_feed(self, x, false) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* _torch_forward(x) -> x: qcal.torch's forward (update, empty inputs skipped as PyTorch's
 * observers do, x returned unchanged). */
static PyObject *Observer_torch_forward(ObserverObject *self, PyObject *x)
{
    if (observer_feed(self, x, true) < 0)
        return NULL;
    return Py_NewRef(x);
}

/* qparams() -> (scale float32[n], zero_point int32[n]); per_channel_affine_float_qparams
 * gives float32 zero points. */
static PyObject *Observer_qparams(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    if (check_obs(self) < 0)
        return NULL;
    int64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_channels(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    if (n < 1)
        n = 1;
    (void)n;
    qcal_qparams qp = {0};
    obs_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = qcal_observer_qparams(self->obs, &qp);
    Py_END_ALLOW_THREADS
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    PyObject *res = qparams_arrays(&qp);
    qcal_qparams_free(&qp);
    return res;
}

typedef qcal_status (*range_fn)(qcal_observer *, int64_t, float *, float *, int64_t *);

static qcal_status data_range_adapter(qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                      int64_t *n)
{
    return qcal_observer_data_range(obs, cap, mn, mx, n);
}

static PyObject *range_common(ObserverObject *self, range_fn fn)
{
    if (check_obs(self) < 0)
        return NULL;
    int64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_channels(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    if (n < 1)
        n = 1;
    float *mn = PyMem_Calloc((size_t)n, sizeof(float));
    float *mx = PyMem_Calloc((size_t)n, sizeof(float));
    if (!mn || !mx) {
        PyMem_Free(mn);
        PyMem_Free(mx);
        return PyErr_NoMemory();
    }
    int64_t got = 0;
    obs_lock(self);
    Py_BEGIN_ALLOW_THREADS
    st = fn(self->obs, n, mn, mx, &got);
    Py_END_ALLOW_THREADS
    obs_unlock(self);
    PyObject *res = NULL;
    if (st < 0) {
        raise_status(st);
    } else {
        if (st == QCAL_NO_DATA && got < 1) {
            got = 1;
            mn[0] = INFINITY;
            mx[0] = -INFINITY;
        }
        PyObject *a = f32_array(mn, got), *b = f32_array(mx, got);
        if (a && b)
            res = PyTuple_Pack(2, a, b);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    PyMem_Free(mn);
    PyMem_Free(mx);
    return res;
}

/* range() -> (min, max): the clipping range the qparams come from (as `qcal observe`). */
static PyObject *Observer_range(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    return range_common(self, qcal_observer_qrange);
}

/* data_range() -> (min, max) as the observer keeps them (running min/max). */
static PyObject *Observer_data_range(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    return range_common(self, data_range_adapter);
}

/* _data_range_into(min_out, max_out) -> True when the running range was written into the
 * two float32 destinations (tensors or arrays of `channels` elements each), False when
 * their size differs (the caller resizes), None when the observer has no data. */
static PyObject *Observer_data_range_into(ObserverObject *self, PyObject *args)
{
    PyObject *mo, *xo;
    if (!PyArg_ParseTuple(args, "OO:_data_range_into", &mo, &xo))
        return NULL;
    if (check_obs(self) < 0)
        return NULL;
    f32_in a, b;
    if (f32_get_out(mo, &a) < 0)
        return NULL;
    if (f32_get_out(xo, &b) < 0) {
        f32_release(&a);
        return NULL;
    }
    float one_mn, one_mx;
    float *mn = &one_mn, *mx = &one_mx;
    int64_t n = 0, got = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_channels(self->obs, &n);
    if (n < 1)
        n = 1;
    if (st >= 0 && n > 1) {
        mn = PyMem_RawMalloc((size_t)n * sizeof(float));
        mx = PyMem_RawMalloc((size_t)n * sizeof(float));
        if (!mn || !mx)
            st = QCAL_ERR_NO_MEMORY;
    }
    if (st >= 0 && mn && mx)
        st = qcal_observer_data_range(self->obs, n, mn, mx, &got);
    obs_unlock(self);
    PyObject *res = NULL;
    if (st == QCAL_ERR_NO_MEMORY && (!mn || !mx)) {
        PyErr_NoMemory();
    } else if (st < 0) {
        raise_status(st);
    } else if (st == QCAL_NO_DATA) {
        res = Py_NewRef(Py_None);
    } else if (a.numel != got || b.numel != got) {
        res = Py_NewRef(Py_False);
    } else {
        memcpy(f32_out_data(&a), mn, (size_t)got * sizeof(float));
        memcpy(f32_out_data(&b), mx, (size_t)got * sizeof(float));
        res = Py_NewRef(Py_True);
    }
    if (mn != &one_mn)
        PyMem_RawFree(mn);
    if (mx != &one_mx)
        PyMem_RawFree(mx);
    f32_release(&a);
    f32_release(&b);
    return res;
}

static PyObject *Observer_reset(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    if (check_obs(self) < 0)
        return NULL;
    obs_lock(self);
    qcal_status st = qcal_observer_reset(self->obs);
    self->version = ++version_seq;
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

/* _torch_histogram() -> (counts float32[bins], min_val, max_val): grid=torch's PyTorch
 * buffers (qcal_observer_torch_histogram). */
static PyObject *Observer_torch_histogram(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    if (check_obs(self) < 0)
        return NULL;
    int64_t n = 0;
    obs_lock(self);
    const qcal_observer_config cfg = *qcal_observer_get_config(self->obs);
    obs_unlock(self);
    int64_t bins = cfg.bins > 0 ? cfg.bins : 1;
    float *c = PyMem_Calloc((size_t)bins, sizeof(float));
    if (!c)
        return PyErr_NoMemory();
    float mn = 0.0f, mx = 0.0f;
    obs_lock(self);
    qcal_status st = qcal_observer_torch_histogram(self->obs, bins, c, &mn, &mx, &n);
    obs_unlock(self);
    PyObject *res = NULL;
    if (st < 0) {
        raise_status(st);
    } else {
        PyObject *a = f32_array(c, n);
        if (a)
            res = Py_BuildValue("(Odd)", a, (double)mn, (double)mx);
        Py_XDECREF(a);
    }
    PyMem_Free(c);
    return res;
}

/* _torch_histogram_set(counts, min_val, max_val): grid=torch's state from PyTorch buffers. */
static PyObject *Observer_torch_histogram_set(ObserverObject *self, PyObject *args)
{
    PyObject *co;
    double mn, mx;
    if (!PyArg_ParseTuple(args, "Odd:_torch_histogram_set", &co, &mn, &mx))
        return NULL;
    if (check_obs(self) < 0)
        return NULL;
    f32_in in;
    if (f32_get(co, &in) < 0)
        return NULL;
    obs_lock(self);
    qcal_status st = qcal_observer_torch_histogram_set(self->obs, in.t.data, in.numel,
                                                       (float)mn, (float)mx);
    self->version = ++version_seq;
    obs_unlock(self);
    f32_release(&in);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

/* _histogram_bins() -> (edges float64 list, counts list): qcal_observer_histogram_bins. */
static PyObject *Observer_histogram_bins(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    if (check_obs(self) < 0)
        return NULL;
    obs_lock(self);
    const qcal_observer_config cfg = *qcal_observer_get_config(self->obs);
    obs_unlock(self);
    int64_t cap = cfg.bins > 0 ? cfg.bins : 1, n = 0;
    qcal_status st;
    double *e = PyMem_Calloc((size_t)cap + 1, sizeof(double));
    uint64_t *c = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
    PyObject *res = NULL, *el = NULL, *cl = NULL;
    if (!e || !c) {
        PyErr_NoMemory();
        goto out;
    }
    obs_lock(self);
    st = qcal_observer_histogram_bins(self->obs, cap, e, c, &n);
    obs_unlock(self);
    if (st < 0) {
        raise_status(st);
        goto out;
    }
    el = PyList_New(n ? n + 1 : 0);
    cl = PyList_New(n);
    if (!el || !cl)
        goto out;
    for (int64_t i = 0; i < n; i++) {
        PyList_SET_ITEM(cl, i, PyLong_FromUnsignedLongLong(c[i]));
        PyList_SET_ITEM(el, i, PyFloat_FromDouble(e[i]));
    }
    if (n)
        PyList_SET_ITEM(el, n, PyFloat_FromDouble(e[n]));
    res = PyTuple_Pack(2, el, cl);
out:
    Py_XDECREF(el);
    Py_XDECREF(cl);
    PyMem_Free(e);
    PyMem_Free(c);
    return res;
}

static PyObject *Observer_merge(ObserverObject *self, PyObject *other)
{
    if (check_obs(self) < 0)
        return NULL;
    if (!PyObject_TypeCheck(other, &ObserverType)) {
        PyErr_Format(PyExc_TypeError, "merge() expects a qcal.Observer, not %.100s",
                     Py_TYPE(other)->tp_name);
        return NULL;
    }
    ObserverObject *o = (ObserverObject *)other;
    if (check_obs(o) < 0)
        return NULL;
    qcal_status st;
    if (o == self) {
        /* Merging an observer with itself: merge a copy (the lock is not re-entrant). */
        void *buf = NULL;
        size_t len = 0;
        qcal_observer *copy = NULL;
        obs_lock(self);
        st = qcal_observer_save(self->obs, &buf, &len);
        if (st >= 0)
            st = qcal_observer_load(buf, len, &copy);
        if (st >= 0)
            st = qcal_observer_merge(self->obs, copy);
        if (st >= 0)
            self->version = ++version_seq;
        obs_unlock(self);
        qcal_free(buf);
        qcal_observer_destroy(&copy);
    } else {
        /* Lock in address order so two threads merging a<-b and b<-a cannot deadlock. */
        ObserverObject *first = self < o ? self : o, *second = self < o ? o : self;
        obs_lock(first);
        obs_lock(second);
        st = qcal_observer_merge(self->obs, o->obs);
        if (st >= 0)
            self->version = ++version_seq;
        obs_unlock(second);
        obs_unlock(first);
    }
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *Observer_save(ObserverObject *self, PyObject *noargs)
{
    (void)noargs;
    if (check_obs(self) < 0)
        return NULL;
    void *buf = NULL;
    size_t len = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_save(self->obs, &buf, &len);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    PyObject *b = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
    qcal_free(buf);
    return b;
}

/* Observer.load(data) -> Observer (classmethod: a subclass gets an instance of itself). */
static PyObject *Observer_load(PyObject *cls, PyObject *data)
{
    Py_buffer view;
    if (PyUnicode_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "Observer.load() expects bytes, not str");
        return NULL;
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    qcal_observer *obs = NULL;
    qcal_status st = qcal_observer_load(view.buf, (size_t)view.len, &obs);
    PyBuffer_Release(&view);
    if (st < 0)
        return raise_status(st);
    ObserverObject *self = (ObserverObject *)Observer_new((PyTypeObject *)cls, NULL, NULL);
    if (!self) {
        qcal_observer_destroy(&obs);
        return NULL;
    }
    self->obs = obs;
    return (PyObject *)self;
}

/* Pickling (copy.deepcopy, torch.save of a module): the state bytes. */
static PyObject *Observer_reduce(ObserverObject *self, PyObject *noargs)
{
    PyObject *data = Observer_save(self, noargs);
    if (!data)
        return NULL;
    PyObject *load = PyObject_GetAttrString((PyObject *)Py_TYPE(self), "load");
    if (!load) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *res = Py_BuildValue("(N(N))", load, data);
    return res;
}

static PyObject *Observer_get_nonfinite(ObserverObject *self, void *closure)
{
    (void)closure;
    if (check_obs(self) < 0)
        return NULL;
    uint64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_nonfinite(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *Observer_get_batches(ObserverObject *self, void *closure)
{
    (void)closure;
    if (check_obs(self) < 0)
        return NULL;
    uint64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_batches(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *Observer_get_channels(ObserverObject *self, void *closure)
{
    (void)closure;
    if (check_obs(self) < 0)
        return NULL;
    int64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_channels(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return raise_status(st);
    return PyLong_FromLongLong(n);
}

static PyObject *Observer_get_version(ObserverObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->version);
}

static PyObject *Observer_get_kind(ObserverObject *self, void *closure)
{
    (void)closure;
    if (check_obs(self) < 0)
        return NULL;
    return PyUnicode_FromString(
        qcal_observer_kind_name(qcal_observer_get_config(self->obs)->kind));
}

static PyObject *Observer_get_config(ObserverObject *self, void *closure)
{
    (void)closure;
    if (check_obs(self) < 0)
        return NULL;
    return config_to_python(qcal_observer_get_config(self->obs));
}

static PyObject *Observer_repr(ObserverObject *self)
{
    if (!self->obs)
        return PyUnicode_FromString("<qcal.Observer (uninitialised)>");
    const qcal_observer_config *c = qcal_observer_get_config(self->obs);
    uint64_t b = 0;
    qcal_observer_batches(self->obs, &b);
    return PyUnicode_FromFormat("<qcal.Observer %s %s %s, %llu batches>",
                                qcal_observer_kind_name(c->kind), qcal_dtype_name(c->q.dtype),
                                qcal_qscheme_name(c->q.qscheme), (unsigned long long)b);
}

static PyMethodDef Observer_methods[] = {
    {"update", (PyCFunction)Observer_update, METH_O,
     "update(x): feed one batch (float32 array or CPU tensor; NaN/Inf skipped and counted)."},
    {"_torch_forward", (PyCFunction)Observer_torch_forward, METH_O,
     "internal: qcal.torch's forward: update(x) (empty inputs skipped), returns x."},
    {"_data_range_into", (PyCFunction)Observer_data_range_into, METH_VARARGS,
     "internal: data_range() written into two float32 tensors/arrays; False on a size "
     "mismatch, None without data."},
    {"qparams", (PyCFunction)Observer_qparams, METH_NOARGS,
     "qparams() -> (scale float32[n], zero_point int32[n]); n = 1 or the channel count."},
    {"range", (PyCFunction)Observer_range, METH_NOARGS,
     "range() -> (min, max) float32 arrays: the clipping range the qparams come from."},
    {"data_range", (PyCFunction)Observer_data_range, METH_NOARGS,
     "data_range() -> (min, max) float32 arrays: the running range the observer keeps."},
    {"reset", (PyCFunction)Observer_reset, METH_NOARGS, "reset(): forget all data."},
    {"_torch_histogram", (PyCFunction)Observer_torch_histogram, METH_NOARGS,
     "internal: grid=torch's (counts, min_val, max_val), PyTorch's buffers."},
    {"_torch_histogram_set", (PyCFunction)Observer_torch_histogram_set, METH_VARARGS,
     "internal: grid=torch's state from PyTorch's (counts, min_val, max_val)."},
    {"_histogram_bins", (PyCFunction)Observer_histogram_bins, METH_NOARGS,
     "internal: (edges, counts) of the histogram the range search runs on."},
    {"merge", (PyCFunction)Observer_merge, METH_O,
     "merge(other): fold other's data into this observer (same kind and config)."},
    {"save", (PyCFunction)Observer_save, METH_NOARGS, "save() -> bytes: the observer state."},
    {"load", (PyCFunction)Observer_load, METH_O | METH_CLASS,
     "Observer.load(data) -> Observer from save() bytes."},
    {"__reduce__", (PyCFunction)Observer_reduce, METH_NOARGS, "Pickles as its state bytes."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Observer_getset[] = {
    {"nonfinite", (getter)Observer_get_nonfinite, NULL, "NaN/Inf values skipped so far.", NULL},
    {"batches", (getter)Observer_get_batches, NULL, "Batches seen so far.", NULL},
    {"channels", (getter)Observer_get_channels, NULL, "Channel count (1 per tensor).", NULL},
    {"kind", (getter)Observer_get_kind, NULL, "Observer kind, as the CLI spells it.", NULL},
    {"_version", (getter)Observer_get_version, NULL,
     "internal: a counter bumped by every change of the state (update, merge, reset).", NULL},
    {"config", (getter)Observer_get_config, NULL, "Config as a dict of rules-file keys.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ObserverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal.Observer",
    .tp_basicsize = sizeof(ObserverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Observer(kind, **config): a qcal range observer (kind and keys as the CLI and "
              "rules file spell them).",
    .tp_new = Observer_new,
    .tp_init = (initproc)Observer_init,
    .tp_dealloc = (destructor)Observer_dealloc,
    .tp_repr = (reprfunc)Observer_repr,
    .tp_methods = Observer_methods,
    .tp_getset = Observer_getset,
};

/* ---- calibration sessions and tables ---------------------------------------------------- */

typedef qcal_py_table TableObject;

static PyTypeObject TableType;
PyTypeObject *const qcal_py_table_type = &TableType;

static void Table_dealloc(TableObject *self)
{
    qcal_calib_table_destroy(&self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *table_wrap(qcal_calib_table *t, bool allow_empty)
{
    TableObject *o = PyObject_New(TableObject, &TableType);
    if (!o) {
        qcal_calib_table_destroy(&t);
        return NULL;
    }
    o->t = t;
    o->allow_empty = allow_empty;
    return (PyObject *)o;
}

PyObject *qcal_py_table_wrap(qcal_calib_table *t, bool allow_empty)
{
    return table_wrap(t, allow_empty);
}

/* Entries that saw no finite value (no_data). Not allowed: raises NoDataError naming every
 * one and returns -1. Allowed and warn: one RuntimeWarning per entry (-1 if a warning was
 * turned into an error). Else 0. */
static int check_no_data(const qcal_calib_table *t, bool allow_empty, bool warn)
{
    int64_t n = 0, bad = 0;
    qcal_calib_table_count(t, &n);
    PyObject *names = PyList_New(0);
    if (!names)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e = NULL;
        if (qcal_calib_table_entry(t, i, &e) < 0 || !e->no_data)
            continue;
        bad++;
        if (allow_empty && warn &&
            PyErr_WarnFormat(PyExc_RuntimeWarning, 2, "%s '%s' saw no finite value (%llu "
                             "NaN/Inf skipped): kept with no_data=True, scale 1, zero-point 0 "
                             "(left out of tensorrt, onnxruntime and ncnn output)",
                             qcal_calib_role_name(e->role), e->fqn,
                             (unsigned long long)e->nonfinite) < 0) {
            Py_DECREF(names);
            return -1;
        }
        PyObject *u = PyUnicode_FromFormat("'%s'", e->fqn);
        if (!u || PyList_Append(names, u) < 0) {
            Py_XDECREF(u);
            Py_DECREF(names);
            return -1;
        }
        Py_DECREF(u);
    }
    if (!bad || allow_empty) {
        Py_DECREF(names);
        return 0;
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *list = sep ? PyUnicode_Join(sep, names) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(names);
    if (!list)
        return -1;
    PyErr_Format(ErrNoData, "%lld tensor%s saw no finite value (every value NaN/Inf), nothing "
                 "to calibrate: %U (pass allow_empty=True to keep them marked no_data)",
                 (long long)bad, bad == 1 ? "" : "s", list);
    Py_DECREF(list);
    return -1;
}

static int parse_format(PyObject *fmt, qcal_calib_format *out)
{
    const char *name = PyUnicode_AsUTF8(fmt);
    if (!name)
        return -1;
    qcal_status st = qcal_calib_format_parse(name, out);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    return 0;
}

/* The formats of Table.write: None (json), "F" or "F,F,...", or a list/tuple of names, each
 * listed once, as `qcal calibrate --format F[,F...]`. Returns the count or -1. */
enum { TABLE_MAX_FORMATS = 4 };
static int parse_formats(PyObject *fmt, qcal_calib_format out[TABLE_MAX_FORMATS])
{
    if (!fmt || fmt == Py_None) {
        out[0] = QCAL_CALIB_FORMAT_JSON;
        return 1;
    }
    PyObject *items;
    if (PyUnicode_Check(fmt)) {
        PyObject *comma = PyUnicode_FromString(",");
        items = comma ? PyUnicode_Split(fmt, comma, -1) : NULL;
        Py_XDECREF(comma);
    } else if (PyList_Check(fmt) || PyTuple_Check(fmt)) {
        items = PySequence_List(fmt);
    } else {
        PyErr_Format(PyExc_TypeError, "format must be a name (json, tensorrt, onnxruntime, "
                     "ncnn), a comma-separated list of names or a list of them, not %.100s",
                     Py_TYPE(fmt)->tp_name);
        return -1;
    }
    if (!items)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(items);
    int count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GET_ITEM(items, i);
        qcal_calib_format f;
        if (!PyUnicode_Check(it)) {
            PyErr_Format(PyExc_TypeError, "format names are str, not %.100s",
                         Py_TYPE(it)->tp_name);
            goto fail;
        }
        if (parse_format(it, &f) < 0)
            goto fail;
        for (int j = 0; j < count; j++)
            if (out[j] == f) {
                PyErr_Format(ErrInvalid, "format %s listed twice", qcal_calib_format_name(f));
                goto fail;
            }
        out[count++] = f;   /* at most 4 distinct formats */
    }
    Py_DECREF(items);
    if (count == 0) {
        PyErr_SetString(ErrInvalid, "no format given");
        return -1;
    }
    return count;
fail:
    Py_DECREF(items);
    return -1;
}

/* The table-writing options of `qcal calibrate` / `qcal convert` (tools/cli_table_out.c):
 * trt_version as users write it ("8.6.1", "10.3.0") or as the header's number ("8601",
 * "100300", or that int), trt_algorithm one of TensorRT's calibrator names (None: follows
 * the observers), skip_unrepresentable. Invalid values raise InvalidArgumentError. */
typedef struct {
    qcal_calib_export_options xo;
    char version[24];
    PyObject *algo;     /* UTF-8 bytes of trt_algorithm, owned; NULL when None */
} export_opts;

static const char *const trt_algorithms[] = { "EntropyCalibration2", "MinMaxCalibration",
                                              "EntropyCalibration", "LegacyCalibration" };

static int export_opts_parse(export_opts *o, PyObject *version, PyObject *algo, int skip)
{
    qcal_calib_export_options_default(&o->xo);
    o->algo = NULL;
    o->xo.skip_unrepresentable = skip != 0;
    if (version && version != Py_None) {
        PyObject *str = PyLong_Check(version) ? PyObject_Str(version)
                        : PyUnicode_Check(version) ? Py_NewRef(version) : NULL;
        if (!str) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "trt_version must be str or int, not %.100s",
                             Py_TYPE(version)->tp_name);
            return -1;
        }
        const char *v = PyUnicode_AsUTF8(str);
        if (!v) {
            Py_DECREF(str);
            return -1;
        }
        size_t n = strlen(v);
        unsigned major, minor, patch;
        int used = 0;
        if (n > 0 && n <= 9 && strspn(v, "0123456789") == n && v[0] != '0') {
            snprintf(o->version, sizeof o->version, "%s", v);
        } else if (n > 0 && n < 16 && strspn(v, "0123456789.") == n &&
                   sscanf(v, "%u.%u.%u%n", &major, &minor, &patch, &used) == 3 &&
                   (size_t)used == n && major >= 1 && major < 100 &&
                   minor < (major < 10 ? 10u : 100u) && patch < 100) {
            /* NV_TENSORRT_VERSION: major*1000 + minor*100 + patch before TensorRT 10,
             * major*10000 + minor*100 + patch from 10 on. */
            unsigned long num = major < 10 ? major * 1000ul + minor * 100ul + patch
                                           : major * 10000ul + minor * 100ul + patch;
            snprintf(o->version, sizeof o->version, "%lu", num);
        } else {
            PyErr_Format(ErrInvalid, "trt_version '%s' is neither a TensorRT version "
                         "MAJOR.MINOR.PATCH (8.6.1, 10.3.0) nor the header's number (8601, "
                         "100300)", v);
            Py_DECREF(str);
            return -1;
        }
        Py_DECREF(str);
        o->xo.trt_version = o->version;
    }
    if (algo && algo != Py_None) {
        if (!PyUnicode_Check(algo)) {
            PyErr_Format(PyExc_TypeError, "trt_algorithm must be str or None, not %.100s",
                         Py_TYPE(algo)->tp_name);
            return -1;
        }
        const char *a = PyUnicode_AsUTF8(algo);
        if (!a)
            return -1;
        bool known = false;
        for (size_t i = 0; i < sizeof trt_algorithms / sizeof trt_algorithms[0]; i++)
            known |= !strcmp(a, trt_algorithms[i]);
        if (!known) {
            PyErr_Format(ErrInvalid, "unknown trt_algorithm '%s' (expected one of %s, %s, %s, "
                         "%s)", a, trt_algorithms[0], trt_algorithms[1], trt_algorithms[2],
                         trt_algorithms[3]);
            return -1;
        }
        o->algo = PyUnicode_AsUTF8String(algo);
        if (!o->algo)
            return -1;
        o->xo.trt_algorithm = PyBytes_AS_STRING(o->algo);
    }
    return 0;
}

static void export_opts_release(export_opts *o)
{
    Py_CLEAR(o->algo);
}

/* skip_unrepresentable: one RuntimeWarning per format naming the entries it leaves out, as
 * the CLI's warning line. -1 if a warning was turned into an error. */
static int warn_skipped(const qcal_calib_table *t, const qcal_calib_format *formats, int nf)
{
    int64_t n = 0;
    qcal_calib_table_count(t, &n);
    for (int k = 0; k < nf; k++) {
        qcal_calib_format f = formats[k];
        PyObject *names = PyList_New(0);
        if (!names)
            return -1;
        for (int64_t i = 0; i < n; i++) {
            const qcal_calib_entry *e = NULL;
            const char *why = NULL;
            if (qcal_calib_table_entry(t, i, &e) < 0)
                continue;
            bool wanted = f == QCAL_CALIB_FORMAT_JSON || f == QCAL_CALIB_FORMAT_NCNN ||
                          e->role == QCAL_CALIB_ROLE_ACTIVATION;
            if (!wanted || e->no_data || qcal_calib_format_holds_name(f, e->fqn, &why))
                continue;
            PyObject *fqn = PyUnicode_DecodeUTF8(e->fqn, (Py_ssize_t)strlen(e->fqn),
                                                 "backslashreplace");
            PyObject *u = fqn ? PyUnicode_FromFormat("%R (%s)", fqn, why) : NULL;
            Py_XDECREF(fqn);
            if (!u || PyList_Append(names, u) < 0) {
                Py_XDECREF(u);
                Py_DECREF(names);
                return -1;
            }
            Py_DECREF(u);
        }
        Py_ssize_t bad = PyList_GET_SIZE(names);
        int rc = 0;
        if (bad) {
            PyObject *sep = PyUnicode_FromString(", ");
            PyObject *list = sep ? PyUnicode_Join(sep, names) : NULL;
            Py_XDECREF(sep);
            rc = !list ? -1
                 : PyErr_WarnFormat(PyExc_RuntimeWarning, 2, "left %zd name%s out of the %s "
                                    "output: %U", bad, bad == 1 ? "" : "s",
                                    qcal_calib_format_name(f), list);
            Py_XDECREF(list);
        }
        Py_DECREF(names);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* Table.format(format="json", *, allow_empty=False, skip_unrepresentable=False,
 * trt_version="8601", trt_algorithm=None) -> str: the table as that format's text (ONNX
 * Runtime: calibration.cache); entries without data raise NoDataError unless allowed (here
 * or when the table was made). */
static PyObject *Table_format(TableObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"format", "allow_empty", "skip_unrepresentable", "trt_version",
                             "trt_algorithm", NULL};
    PyObject *fmt = NULL, *version = NULL, *algo = NULL;
    int allow = 0, skip = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|U$ppOO:format", kwlist, &fmt, &allow, &skip,
                                     &version, &algo))
        return NULL;
    if (check_no_data(self->t, allow || self->allow_empty, false) < 0)
        return NULL;
    qcal_calib_format f = QCAL_CALIB_FORMAT_JSON;
    if (fmt && parse_format(fmt, &f) < 0)
        return NULL;
    export_opts o;
    if (export_opts_parse(&o, version, algo, skip) < 0) {
        export_opts_release(&o);
        return NULL;
    }
    if (skip && warn_skipped(self->t, &f, 1) < 0) {
        export_opts_release(&o);
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_calib_table_format(self->t, f, &o.xo, &buf, &len);
    export_opts_release(&o);
    if (st < 0)
        return raise_status(st);
    PyObject *r = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)len, "surrogateescape");
    qcal_free(buf);
    return r;
}

/* Table.write(path, format="json", *, allow_empty=False, skip_unrepresentable=False,
 * trt_version="8601", trt_algorithm=None): writes the table as `qcal calibrate -o path
 * --format F[,F...]` does: one single-file format to the file path atomically; onnxruntime
 * (its three files) or several formats into the directory path, all files or none. Entries
 * without data raise NoDataError unless allowed (here or when the table was made). */
static PyObject *Table_write(TableObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "format", "allow_empty", "skip_unrepresentable",
                             "trt_version", "trt_algorithm", NULL};
    PyObject *path = NULL, *fmt = NULL, *version = NULL, *algo = NULL;
    int allow = 0, skip = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|O$ppOO:write", kwlist,
                                     PyUnicode_FSConverter, &path, &fmt, &allow, &skip,
                                     &version, &algo))
        return NULL;
    qcal_calib_format f[TABLE_MAX_FORMATS];
    int nf = -1;
    export_opts o = { .algo = NULL };
    if (check_no_data(self->t, allow || self->allow_empty, false) < 0 ||
        (nf = parse_formats(fmt, f)) < 0 || export_opts_parse(&o, version, algo, skip) < 0) {
        export_opts_release(&o);
        Py_DECREF(path);
        return NULL;
    }
    /* The warnings come first, as the CLI's: a warning turned into an error writes nothing. */
    if (skip && warn_skipped(self->t, f, nf) < 0) {
        export_opts_release(&o);
        Py_DECREF(path);
        return NULL;
    }
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = nf > 1 ? qcal_calib_table_write_dir(self->t, nf, f, &o.xo, PyBytes_AS_STRING(path))
                : qcal_calib_table_write(self->t, f[0], &o.xo, PyBytes_AS_STRING(path));
    Py_END_ALLOW_THREADS
    export_opts_release(&o);
    Py_DECREF(path);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *entry_dict(const qcal_calib_entry *e)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    const qcal_qparams *qp = &e->qparams;
    int64_t ch = qp->channels < 1 ? 1 : qp->channels;
    int bad = 0;
    /* "fqn" as in the JSON table; "name" the same string (the key of earlier releases). */
    PyObject *fqn = PyUnicode_DecodeUTF8(e->fqn, (Py_ssize_t)strlen(e->fqn), "surrogateescape");
    bad |= dict_set_steal(d, "fqn", Py_XNewRef(fqn));
    bad |= dict_set_steal(d, "name", fqn);
    bad |= dict_set_steal(d, "role", PyUnicode_FromString(qcal_calib_role_name(e->role)));
    bad |= dict_set_steal(d, "observer", PyUnicode_FromString(qcal_observer_kind_name(e->observer)));
    bad |= dict_set_steal(d, "dtype", PyUnicode_FromString(qcal_dtype_name(qp->dtype)));
    bad |= dict_set_steal(d, "qscheme", PyUnicode_FromString(qcal_qscheme_name(qp->qscheme)));
    bad |= dict_set_steal(d, "axis", PyLong_FromLong(qp->axis));
    bad |= dict_set_steal(d, "quant_min", PyLong_FromLongLong(qp->quant_min));
    bad |= dict_set_steal(d, "quant_max", PyLong_FromLongLong(qp->quant_max));
    bad |= dict_set_steal(d, "min", f32_array(e->min_val, ch));
    bad |= dict_set_steal(d, "max", f32_array(e->max_val, ch));
    PyObject *sz = qparams_arrays(qp);
    if (sz) {
        bad |= dict_set_steal(d, "scale", Py_NewRef(PyTuple_GET_ITEM(sz, 0)));
        bad |= dict_set_steal(d, "zero_point", Py_NewRef(PyTuple_GET_ITEM(sz, 1)));
        Py_DECREF(sz);
    } else {
        bad = 1;
    }
    bad |= dict_set_steal(d, "batches", PyLong_FromUnsignedLongLong(e->batches));
    bad |= dict_set_steal(d, "elements", PyLong_FromUnsignedLongLong(e->elements));
    bad |= dict_set_steal(d, "nonfinite", PyLong_FromUnsignedLongLong(e->nonfinite));
    bad |= dict_set_steal(d, "no_data", PyBool_FromLong(e->no_data));
    if (bad) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Table.entries -> list of dicts (fqn (alias name), role, observer, dtype, qscheme, axis, quant_min,
 * quant_max, min, max, scale, zero_point, batches, elements, nonfinite, no_data). */
static PyObject *Table_get_entries(TableObject *self, void *closure)
{
    (void)closure;
    int64_t n = 0;
    qcal_status st = qcal_calib_table_count(self->t, &n);
    if (st < 0)
        return raise_status(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e = NULL;
        st = qcal_calib_table_entry(self->t, i, &e);
        PyObject *d = st < 0 ? raise_status(st) : entry_dict(e);
        if (!d) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    return list;
}

static Py_ssize_t Table_len(TableObject *self)
{
    int64_t n = 0;
    if (qcal_calib_table_count(self->t, &n) < 0)
        return 0;
    return (Py_ssize_t)n;
}

/* Table.read_json(path) -> Table (classmethod). */
static PyObject *Table_read_json(PyObject *cls, PyObject *arg)
{
    (void)cls;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_table_read_json(PyBytes_AS_STRING(path), &t);
    Py_DECREF(path);
    if (st < 0)
        return raise_status(st);
    return table_wrap(t, false);
}

/* repr(Table): a summary line and the first entries, one line each:
 *   <qcal.Table: 3 entries (2 activations, 1 weight)
 *     'conv1.output' activation histogram quint8 per_tensor_affine scale 0.0117647 zero_point 0
 *     ...> */
enum { TABLE_REPR_LINES = 8 };
static PyObject *Table_repr(TableObject *self)
{
    int64_t n = 0, acts = 0, nodata = 0;
    if (!self->t || qcal_calib_table_count(self->t, &n) < 0)
        return PyUnicode_FromString("<qcal.Table: not initialised>");
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e = NULL;
        if (qcal_calib_table_entry(self->t, i, &e) < 0)
            continue;
        acts += e->role == QCAL_CALIB_ROLE_ACTIVATION;
        nodata += e->no_data;
    }
    int64_t weights = n - acts;
    PyObject *parts = PyList_New(0);
    if (!parts)
        return NULL;
    PyObject *u = PyUnicode_FromFormat("<qcal.Table: %lld entr%s (%lld activation%s, %lld "
                                       "weight%s)", (long long)n, n == 1 ? "y" : "ies",
                                       (long long)acts, acts == 1 ? "" : "s",
                                       (long long)weights, weights == 1 ? "" : "s");
    if (!u || PyList_Append(parts, u) < 0)
        goto fail;
    Py_CLEAR(u);
    if (nodata) {
        u = PyUnicode_FromFormat(", %lld without data", (long long)nodata);
        if (!u || PyList_Append(parts, u) < 0)
            goto fail;
        Py_CLEAR(u);
    }
    for (int64_t i = 0; i < n && i < TABLE_REPR_LINES; i++) {
        const qcal_calib_entry *e = NULL;
        if (qcal_calib_table_entry(self->t, i, &e) < 0)
            continue;
        const qcal_qparams *qp = &e->qparams;
        PyObject *fqn = PyUnicode_DecodeUTF8(e->fqn, (Py_ssize_t)strlen(e->fqn),
                                             "backslashreplace");
        if (!fqn)
            goto fail;
        bool fzp = qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
        char *sc = PyOS_double_to_string((double)qcal_qparams_scale_at(qp, 0), 'g', 6, 0, NULL);
        char *zp = fzp ? PyOS_double_to_string((double)qcal_qparams_zero_point_float_at(qp, 0),
                                               'g', 6, 0, NULL)
                       : PyOS_double_to_string((double)qcal_qparams_zero_point_at(qp, 0), 'f',
                                               0, 0, NULL);
        if (!sc || !zp) {
            PyMem_Free(sc);
            PyMem_Free(zp);
            Py_DECREF(fqn);
            goto fail;
        }
        const char *role = qcal_calib_role_name(e->role);
        const char *kind = qcal_observer_kind_name(e->observer);
        const char *dt = qcal_dtype_name(qp->dtype), *qs = qcal_qscheme_name(qp->qscheme);
        if (e->no_data)
            u = PyUnicode_FromFormat("\n  %R %s %s %s no data", fqn, role, kind, dt);
        else if (!strncmp(qs, "per_channel", 11))
            u = PyUnicode_FromFormat("\n  %R %s %s %s %s axis %d, %lld channels (scale[0] %s "
                                     "zero_point[0] %s)", fqn, role, kind, dt, qs,
                                     (int)qp->axis, (long long)qp->channels, sc, zp);
        else
            u = PyUnicode_FromFormat("\n  %R %s %s %s %s scale %s zero_point %s", fqn, role,
                                     kind, dt, qs, sc, zp);
        PyMem_Free(zp);
        PyMem_Free(sc);
        Py_DECREF(fqn);
        if (!u || PyList_Append(parts, u) < 0)
            goto fail;
        Py_CLEAR(u);
    }
    u = n > TABLE_REPR_LINES ? PyUnicode_FromFormat("\n  ... %lld more>",
                                                    (long long)(n - TABLE_REPR_LINES))
                             : PyUnicode_FromString(">");
    if (!u || PyList_Append(parts, u) < 0)
        goto fail;
    Py_CLEAR(u);
    PyObject *empty = PyUnicode_FromString("");
    PyObject *r = empty ? PyUnicode_Join(empty, parts) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(parts);
    return r;
fail:
    Py_XDECREF(u);
    Py_DECREF(parts);
    return NULL;
}

static PyMethodDef Table_methods[] = {
    {"format", (PyCFunction)(void (*)(void))Table_format, METH_VARARGS | METH_KEYWORDS,
     "format(format='json', *, allow_empty=False, skip_unrepresentable=False, "
     "trt_version=None, trt_algorithm=None) -> str: the table in one format (json, tensorrt, "
     "onnxruntime: its calibration.cache, ncnn), with the options of write()."},
    {"write", (PyCFunction)(void (*)(void))Table_write, METH_VARARGS | METH_KEYWORDS,
     "write(path, format='json', *, allow_empty=False, skip_unrepresentable=False, "
     "trt_version=None, trt_algorithm=None): write the table as `qcal calibrate -o path "
     "--format F[,F...]`: one single-file format to the file path atomically; onnxruntime "
     "(calibration.json, .flatbuffers, .cache) or several formats ('json,tensorrt' or a list) "
     "into the directory path, all files or none. trt_version: '8.6.1', '10.3.0' or the "
     "header's number (default 8601); trt_algorithm: EntropyCalibration2, MinMaxCalibration, "
     "EntropyCalibration or LegacyCalibration (default: follows the observers); "
     "skip_unrepresentable: leave names a format cannot hold out, one RuntimeWarning per "
     "format. Entries that saw no finite value raise NoDataError unless allowed here or by "
     "Session.table(allow_empty=True)."},
    {"read_json", (PyCFunction)Table_read_json, METH_O | METH_CLASS,
     "Table.read_json(path) -> Table: read a native JSON table."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Table_getset[] = {
    {"entries", (getter)Table_get_entries, NULL, "The entries as a list of dicts.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Table_seq = {.sq_length = (lenfunc)Table_len};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal.Table",
    .tp_basicsize = sizeof(TableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A calibration table (from Session.table() or Table.read_json()).",
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_repr = (reprfunc)Table_repr,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
    .tp_as_sequence = &Table_seq,
};

typedef qcal_py_session SessionObject;

static PyTypeObject SessionType;
PyTypeObject *const qcal_py_session_type = &SessionType;

static void Session_dealloc(SessionObject *self)
{
    qcal_calib_session_destroy(&self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Session(rules=None): rules is the text of a rules file ("GLOB ROLE OBSERVER key=value"
 * per line; the package also accepts a path). */
static int Session_init(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"rules", "max_memory", NULL};
    const char *text = NULL;
    Py_ssize_t len = 0;
    unsigned long long max_memory = QCAL_CALIB_MAX_MEMORY_DEFAULT;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z#K:Session", kwlist, &text, &len,
                                     &max_memory))
        return -1;
    qcal_calib_rules *rules = NULL;
    qcal_status st = QCAL_OK;
    if (text)
        st = qcal_calib_rules_parse(text, (size_t)len, &rules);
    qcal_calib_session_options opt;
    qcal_calib_session_options_default(&opt);
    opt.rules = rules;
    opt.max_memory = max_memory;
    qcal_calib_session *s = NULL;
    if (st >= 0)
        st = qcal_calib_session_create(&opt, &s);
    qcal_calib_rules_destroy(&rules);
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    qcal_calib_session_destroy(&self->s);
    self->s = s;
    return 0;
}

static int check_session(SessionObject *self)
{
    if (!self->s) {
        PyErr_SetString(ErrState, "session is not initialised");
        return -1;
    }
    return 0;
}

/* observe(name, x, role="activation", step=None): one batch of a named tensor. */
static PyObject *Session_observe(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "x", "role", "step", NULL};
    const char *name = NULL, *role_name = "activation";
    PyObject *x = NULL, *step_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|sO:observe", kwlist, &name, &x, &role_name,
                                     &step_o))
        return NULL;
    if (check_session(self) < 0)
        return NULL;
    qcal_calib_role role;
    qcal_status st = qcal_calib_role_parse(role_name, &role);
    if (st < 0)
        return raise_status(st);
    long long step = QCAL_STEP_AUTO;
    if (step_o != Py_None) {
        step = PyLong_AsLongLong(step_o);
        if (step == -1 && PyErr_Occurred())
            return NULL;
        if (step < 0) {
            PyErr_SetString(ErrInvalid, "step must be >= 0 (or None for call order)");
            return NULL;
        }
    }
    f32_in in;
    if (f32_get(x, &in) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_calib_session_observe(self->s, name, role, (int64_t)step, &in.t);
    Py_END_ALLOW_THREADS
    f32_release(&in);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

/* observe_safetensors(path) -> (observed, skipped): every tensor of 2+ dimensions of a
 * .safetensors file observed as a weight (batch 0), as `qcal calibrate --weights FILE`;
 * 1-D tensors (biases, norms) are skipped and counted; a dtype qcal does not convert
 * (integers, bool, FP8) gets one RuntimeWarning and is skipped, as the CLI's warning. */
static PyObject *Session_observe_safetensors(SessionObject *self, PyObject *arg)
{
    PyObject *path = NULL;
    if (check_session(self) < 0 || !PyUnicode_FSConverter(arg, &path))
        return NULL;
    qcal_safetensors *sf = NULL;
    qcal_status st = qcal_safetensors_open(PyBytes_AS_STRING(path), &sf);
    if (st < 0) {
        Py_DECREF(path);
        return raise_status(st);
    }
    int64_t n = 0;
    long long observed = 0, skipped = 0;
    float *buf = NULL;
    PyObject *res = NULL;
    qcal_safetensors_count(sf, &n);
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        if ((st = qcal_safetensors_info(sf, i, &info)) < 0) {
            raise_status(st);
            goto out;
        }
        if (info.dtype == QCAL_SAFETENSORS_OTHER) {
            if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "'%s': skipping '%s' (dtype %s)",
                                 PyBytes_AS_STRING(path), info.name, info.dtype_name) < 0)
                goto out;
            continue;
        }
        if (info.ndim < 2) {
            skipped++;
            continue;
        }
        if (info.numel == 0) {
            PyErr_Format(ErrEmpty, "'%s': tensor '%s' is empty (0 elements), nothing to "
                         "observe", PyBytes_AS_STRING(path), info.name);
            goto out;
        }
        if ((uint64_t)info.numel > SIZE_MAX / sizeof(float) ||
            !(buf = PyMem_RawMalloc((size_t)info.numel * sizeof(float)))) {
            PyErr_Format(ErrMemory, "'%s': out of memory for tensor '%s' (%lld elements)",
                         PyBytes_AS_STRING(path), info.name, (long long)info.numel);
            goto out;
        }
        Py_BEGIN_ALLOW_THREADS
        st = qcal_safetensors_read_f32(sf, i, 0, info.numel, buf);
        if (st >= 0) {
            qcal_tensor x;
            st = qcal_tensor_init(&x, buf, info.ndim, info.shape);
            if (st >= 0)
                st = qcal_calib_session_observe(self->s, info.name, QCAL_CALIB_ROLE_WEIGHT, 0,
                                                &x);
        }
        qcal_safetensors_release(sf, i);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(buf);
        buf = NULL;
        if (st < 0) {
            raise_status(st);
            goto out;
        }
        observed++;
    }
    res = Py_BuildValue("(LL)", observed, skipped);
out:
    qcal_safetensors_close(&sf);
    Py_DECREF(path);
    return res;
}

/* Session.table(allow_empty=False, profile=None) -> Table: NoDataError naming every tensor
 * that saw no finite value, unless allow_empty (then one RuntimeWarning per such tensor);
 * profile ("ort", "tensorrt") recorded in the table, as `qcal calibrate --profile`. */
static PyObject *Session_table(SessionObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"allow_empty", "profile", NULL};
    int allow = 0;
    const char *profile = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$pz:table", kwlist, &allow, &profile))
        return NULL;
    if (check_session(self) < 0)
        return NULL;
    qcal_calib_table *t = NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_calib_session_table(self->s, &t);
    Py_END_ALLOW_THREADS
    if (st < 0)
        return raise_status(st);
    if (profile && (st = qcal_calib_table_set_profile(t, profile)) < 0) {
        qcal_calib_table_destroy(&t);
        return raise_status(st);
    }
    if (check_no_data(t, allow, true) < 0) {
        qcal_calib_table_destroy(&t);
        return NULL;
    }
    return table_wrap(t, allow);
}

static Py_ssize_t Session_len(SessionObject *self)
{
    int64_t n = 0;
    if (!self->s || qcal_calib_session_count(self->s, &n) < 0)
        return 0;
    return (Py_ssize_t)n;
}

static PyMethodDef Session_methods[] = {
    {"observe", (PyCFunction)(void (*)(void))Session_observe, METH_VARARGS | METH_KEYWORDS,
     "observe(name, x, role='activation', step=None): feed one batch of a named tensor "
     "(thread-safe; steps order the batches of order-dependent observers)."},
    {"observe_safetensors", (PyCFunction)Session_observe_safetensors, METH_O,
     "observe_safetensors(path) -> (observed, skipped): observe every tensor of 2+ dimensions "
     "of a .safetensors file as a weight, as `qcal calibrate --weights`; 1-D tensors are "
     "skipped and counted, other dtypes skipped with a RuntimeWarning."},
    {"table", (PyCFunction)(void (*)(void))Session_table, METH_VARARGS | METH_KEYWORDS,
     "table(*, allow_empty=False) -> Table: snapshot every entry; a tensor that saw no finite "
     "value raises NoDataError naming every such tensor, unless allow_empty=True (then one "
     "RuntimeWarning each and the entry is kept with no_data=True)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Session_seq = {.sq_length = (lenfunc)Session_len};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "qcal.Session",
    .tp_basicsize = sizeof(SessionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Session(rules=None): a calibration session keyed by tensor name.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
    .tp_as_sequence = &Session_seq,
};

/* ---- quantize / dequantize / fake-quant ------------------------------------------------- */

/* Fills *qp from scale (float32 buffer) and zero points (int32 buffer): per tensor when
 * axis is None (one value each), else per channel along axis. The views stay valid while
 * the buffers are held. */
static int make_qparams(qcal_dtype dtype, PyObject *axis_o, Py_buffer *sc, Py_buffer *zp,
                        qcal_qparams *qp)
{
    int64_t n = sc->len / 4;
    if (zp->len / 4 != n || n < 1) {
        PyErr_Format(ErrMismatch, "%lld scales and %lld zero points", (long long)n,
                     (long long)(zp->len / 4));
        return -1;
    }
    qcal_status st;
    if (axis_o == Py_None) {
        if (n != 1) {
            PyErr_Format(ErrInvalid, "%lld scales given without an axis (per tensor takes one)",
                         (long long)n);
            return -1;
        }
        st = qcal_qparams_per_tensor(qp, dtype, ((float *)sc->buf)[0], ((int32_t *)zp->buf)[0]);
    } else {
        long axis = PyLong_AsLong(axis_o);
        if (axis == -1 && PyErr_Occurred())
            return -1;
        st = qcal_qparams_per_channel(qp, dtype, (int32_t)axis, n, sc->buf, zp->buf);
    }
    if (st < 0) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static int get_buf(PyObject *o, Py_buffer *b, int flags)
{
    if (PyObject_GetBuffer(o, b, flags | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    return 0;
}

/* _quantize(x, scale, zp, dtype, axis, out): out (writable, numel(x) items of dtype). */
static PyObject *py_quantize(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *xo, *so, *zo, *axis_o, *outo;
    const char *dname;
    if (!PyArg_ParseTuple(args, "OOOsOO", &xo, &so, &zo, &dname, &axis_o, &outo))
        return NULL;
    qcal_dtype dt;
    qcal_status st = qcal_dtype_parse(dname, &dt);
    if (st < 0)
        return raise_status(st);
    f32_in x;
    if (f32_get(xo, &x) < 0)
        return NULL;
    Py_buffer sc, zp, out;
    if (get_buf(so, &sc, PyBUF_SIMPLE) < 0) {
        f32_release(&x);
        return NULL;
    }
    if (get_buf(zo, &zp, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&sc);
        f32_release(&x);
        return NULL;
    }
    PyObject *res = NULL;
    qcal_qparams qp = {0};
    if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
        if (make_qparams(dt, axis_o, &sc, &zp, &qp) == 0) {
            Py_BEGIN_ALLOW_THREADS
            st = qcal_quantize(&x.t, &qp, out.buf);
            Py_END_ALLOW_THREADS
            res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
        }
        PyBuffer_Release(&out);
    }
    PyBuffer_Release(&sc);
    PyBuffer_Release(&zp);
    f32_release(&x);
    return res;
}

/* _dequantize(q, dtype, scale, zp, axis, out): out is a float32 array of q's shape. */
static PyObject *py_dequantize(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *qo, *so, *zo, *axis_o, *outo;
    const char *dname;
    if (!PyArg_ParseTuple(args, "OsOOOO", &qo, &dname, &so, &zo, &axis_o, &outo))
        return NULL;
    qcal_dtype dt;
    qcal_status st = qcal_dtype_parse(dname, &dt);
    if (st < 0)
        return raise_status(st);
    Py_buffer q, sc, zp, out;
    if (PyObject_GetBuffer(qo, &q, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *res = NULL;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            f32_in o;
            if (PyObject_GetBuffer(outo, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
                memset(&o, 0, sizeof o);
                o.view = out;
                qcal_qparams qp = {0};
                if (view_to_tensor(&o) == 0 && make_qparams(dt, axis_o, &sc, &zp, &qp) == 0) {
                    Py_BEGIN_ALLOW_THREADS
                    qcal_tensor_mut ot = mut_like(&o.t, out.buf);
                    st = qcal_dequantize(q.buf, &qp, &ot);
                    Py_END_ALLOW_THREADS
                    res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
                }
                PyBuffer_Release(&out);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    PyBuffer_Release(&q);
    return res;
}

/* The narrowest dtype whose range holds [quant_min, quant_max]. */
static qcal_dtype dtype_for_range(long long qmin, long long qmax)
{
    return qmin >= 0 && qmax <= 255 ? QCAL_QUINT8
           : qmin >= -128 && qmax <= 127 ? QCAL_QINT8 : QCAL_QINT32;
}

/* _fake_quant(x, scale, zp, quant_min, quant_max, axis, out, mask[, dtype]): dtype (an FP8
 * name) or None: the narrowest integer dtype of [quant_min, quant_max]. FP8: the dtype's
 * range, quant_min / quant_max ignored. */
static PyObject *py_fake_quant(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *xo, *so, *zo, *axis_o, *outo, *masko;
    long long qmin, qmax;
    const char *dname = NULL;
    if (!PyArg_ParseTuple(args, "OOOLLOOO|z", &xo, &so, &zo, &qmin, &qmax, &axis_o, &outo, &masko,
                          &dname))
        return NULL;
    qcal_dtype dt = dtype_for_range(qmin, qmax);
    if (dname) {
        qcal_status ds = qcal_dtype_parse(dname, &dt);
        if (ds < 0)
            return raise_status(ds);
        int64_t lo, hi;
        qcal_dtype_range(dt, &lo, &hi);
        qmin = lo;
        qmax = hi;
    }
    f32_in x;
    if (f32_get(xo, &x) < 0)
        return NULL;
    Py_buffer sc, zp, out, mask;
    PyObject *res = NULL;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
                if (get_buf(masko, &mask, PyBUF_WRITABLE) == 0) {
                    qcal_qparams qp = {0};
                    if (make_qparams(dt, axis_o, &sc, &zp, &qp) == 0) {
                        qp.quant_min = qmin;
                        qp.quant_max = qmax;
                        qcal_tensor_mut y = mut_like(&x.t, out.buf);
                        qcal_status st;
                        Py_BEGIN_ALLOW_THREADS
                        st = qcal_fakequant_forward(&x.t, &qp, &y, mask.buf);
                        Py_END_ALLOW_THREADS
                        res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
                    }
                    PyBuffer_Release(&mask);
                }
                PyBuffer_Release(&out);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    f32_release(&x);
    return res;
}

/* _fake_quant_backward(grad_y, mask, out): straight-through. */
static PyObject *py_fake_quant_backward(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *go, *mo, *outo;
    if (!PyArg_ParseTuple(args, "OOO", &go, &mo, &outo))
        return NULL;
    f32_in g;
    if (f32_get(go, &g) < 0)
        return NULL;
    Py_buffer m, out;
    PyObject *res = NULL;
    if (get_buf(mo, &m, PyBUF_SIMPLE) == 0) {
        if (m.len != g.numel) {
            PyErr_Format(ErrMismatch, "mask has %zd elements, grad %lld", m.len, (long long)g.numel);
        } else if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
            qcal_tensor_mut y = mut_like(&g.t, out.buf);
            qcal_status st = qcal_fakequant_backward(&g.t, m.buf, &y);
            res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
            PyBuffer_Release(&out);
        }
        PyBuffer_Release(&m);
    }
    f32_release(&g);
    return res;
}

/* ---- learnable (LSQ) fake-quant ---------------------------------------------------------- */

/* Learnable qparams over float32 scale / float zero-point buffers (per tensor when axis is
 * None: one value each; else per channel along axis). The library checks the values. */
static int make_lsq_qparams(long long qmin, long long qmax, PyObject *axis_o, Py_buffer *sc,
                            Py_buffer *zp, qcal_qparams *qp)
{
    int64_t n = sc->len / 4;
    if (zp->len / 4 != n || n < 1) {
        PyErr_Format(ErrMismatch, "%lld scales and %lld zero points", (long long)n,
                     (long long)(zp->len / 4));
        return -1;
    }
    memset(qp, 0, sizeof *qp);
    qp->dtype = dtype_for_range(qmin, qmax);
    qp->quant_min = qmin;
    qp->quant_max = qmax;
    if (axis_o == Py_None) {
        if (n != 1) {
            PyErr_Format(ErrInvalid, "%lld scales given without an axis (per tensor takes one)",
                         (long long)n);
            return -1;
        }
        qp->qscheme = QCAL_PER_TENSOR_AFFINE;
        qp->channels = 1;
        qp->scale = ((const float *)sc->buf)[0];
        qp->zero_point_float = ((const float *)zp->buf)[0];
        return 0;
    }
    long axis = PyLong_AsLong(axis_o);
    if (axis == -1 && PyErr_Occurred())
        return -1;
    if (axis < INT32_MIN || axis > INT32_MAX) {
        PyErr_Format(ErrInvalid, "axis %ld is out of range", axis);
        return -1;
    }
    qp->qscheme = QCAL_PER_CHANNEL_AFFINE;
    qp->axis = (int32_t)axis;
    qp->channels = n;
    qp->scales = sc->buf;
    qp->zero_points_float = zp->buf;
    return 0;
}

/* _fake_quant_learnable(x, scale, zp, quant_min, quant_max, axis, out, mask): scale and zp
 * float32 buffers (float zero-points). */
static PyObject *py_fake_quant_learnable(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *xo, *so, *zo, *axis_o, *outo, *masko;
    long long qmin, qmax;
    if (!PyArg_ParseTuple(args, "OOOLLOOO", &xo, &so, &zo, &qmin, &qmax, &axis_o, &outo, &masko))
        return NULL;
    f32_in x;
    if (f32_get(xo, &x) < 0)
        return NULL;
    Py_buffer sc, zp, out, mask;
    PyObject *res = NULL;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
                if (get_buf(masko, &mask, PyBUF_WRITABLE) == 0) {
                    qcal_qparams qp;
                    if (make_lsq_qparams(qmin, qmax, axis_o, &sc, &zp, &qp) == 0) {
                        qcal_tensor_mut y = mut_like(&x.t, out.buf);
                        qcal_status st;
                        Py_BEGIN_ALLOW_THREADS
                        st = qcal_fakequant_learnable_forward(&x.t, &qp, &y, mask.buf);
                        Py_END_ALLOW_THREADS
                        res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
                    }
                    PyBuffer_Release(&mask);
                }
                PyBuffer_Release(&out);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    f32_release(&x);
    return res;
}

/* _fake_quant_learnable_backward(x, grad_y, scale, zp, quant_min, quant_max, axis,
 * grad_factor, grad_x, grad_scale, grad_zp): grad_scale / grad_zp float32[channels]. */
static PyObject *py_fake_quant_learnable_backward(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *xo, *go, *so, *zo, *axis_o, *gxo, *gso, *gzo;
    long long qmin, qmax;
    float gf;
    if (!PyArg_ParseTuple(args, "OOOOLLOfOOO", &xo, &go, &so, &zo, &qmin, &qmax, &axis_o, &gf,
                          &gxo, &gso, &gzo))
        return NULL;
    f32_in x, g;
    if (f32_get(xo, &x) < 0)
        return NULL;
    if (f32_get(go, &g) < 0) {
        f32_release(&x);
        return NULL;
    }
    PyObject *res = NULL;
    Py_buffer sc, zp, gx, gs, gz;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            if (get_buf(gxo, &gx, PyBUF_WRITABLE) == 0) {
                if (get_buf(gso, &gs, PyBUF_WRITABLE) == 0) {
                    if (get_buf(gzo, &gz, PyBUF_WRITABLE) == 0) {
                        qcal_qparams qp;
                        if (make_lsq_qparams(qmin, qmax, axis_o, &sc, &zp, &qp) == 0) {
                            if (gs.len / 4 != qp.channels || gz.len / 4 != qp.channels ||
                                gx.len / 4 != x.numel) {
                                PyErr_SetString(ErrMismatch, "internal: output sizes");
                            } else {
                                qcal_tensor_mut gxt = mut_like(&x.t, gx.buf);
                                qcal_status st;
                                Py_BEGIN_ALLOW_THREADS
                                st = qcal_fakequant_learnable_backward(&x.t, &g.t, &qp, gf, &gxt,
                                                                       gs.buf, gz.buf);
                                Py_END_ALLOW_THREADS
                                res = st < 0 ? raise_status(st) : Py_NewRef(Py_None);
                            }
                        }
                        PyBuffer_Release(&gz);
                    }
                    PyBuffer_Release(&gs);
                }
                PyBuffer_Release(&gx);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    f32_release(&g);
    f32_release(&x);
    return res;
}

/* ---- dumps ---------------------------------------------------------------------------- */

/* _dump_scan(dir) -> [(name, role, [files])] as `qcal calibrate DIR` reads a dump
 * (qcal_calib_dump_scan: percent-decoded names, DIR/manifest.json). */
static PyObject *py_dump_scan(PyObject *mod, PyObject *arg)
{
    (void)mod;
    PyObject *path = NULL;
    if (!PyUnicode_FSConverter(arg, &path))
        return NULL;
    qcal_calib_dump *d = NULL;
    qcal_status st = qcal_calib_dump_scan(PyBytes_AS_STRING(path), &d);
    Py_DECREF(path);
    if (st < 0)
        return raise_status(st);
    int64_t n = 0;
    qcal_calib_dump_count(d, &n);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; list && i < n; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(d, i, &t);
        PyObject *files = PyList_New((Py_ssize_t)t.nfiles);
        for (int64_t j = 0; files && j < t.nfiles; j++) {
            PyObject *f = PyUnicode_DecodeFSDefault(t.files[j]);
            if (!f) {
                Py_CLEAR(files);
                break;
            }
            PyList_SET_ITEM(files, (Py_ssize_t)j, f);
        }
        PyObject *item = files ? Py_BuildValue("(NsN)", PyUnicode_DecodeUTF8(t.name,
                                               (Py_ssize_t)strlen(t.name), "surrogateescape"),
                                               qcal_calib_role_name(t.role), files)
                               : NULL;
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    qcal_calib_dump_destroy(&d);
    return list;
}

/* ---- metrics --------------------------------------------------------------------------- */

static PyObject *metrics_common(PyObject *args, int which)
{
    PyObject *xo, *yo;
    if (!PyArg_ParseTuple(args, "OO", &xo, &yo))
        return NULL;
    f32_in x, y;
    if (f32_get(xo, &x) < 0)
        return NULL;
    if (f32_get(yo, &y) < 0) {
        f32_release(&x);
        return NULL;
    }
    qcal_status st;
    qcal_numeric_metrics m;
    if (x.numel != y.numel) {
        f32_release(&x);
        f32_release(&y);
        PyErr_Format(ErrMismatch, "x has %lld elements and y has %lld", (long long)x.numel,
                     (long long)y.numel);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    st = qcal_numeric_compare_f32(x.t.data, y.t.data, x.numel, &m);
    Py_END_ALLOW_THREADS
    f32_release(&x);
    f32_release(&y);
    if (st < 0)
        return raise_status(st);
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

/* ---- module ---------------------------------------------------------------------------- */

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

static PyObject *py_set_num_threads(PyObject *mod, PyObject *arg)
{
    (void)mod;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < INT32_MIN || n > INT32_MAX) {
        PyErr_Format(ErrInvalid, "thread count %ld is out of range", n);
        return NULL;
    }
    qcal_status st = qcal_set_num_threads((int)n);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyLong_FromLong(qcal_get_num_threads());
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
        raise_status(st);
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
        PyErr_SetString(ErrState, "logger is not initialised");
        return NULL;
    }
    qcal_numeric_log_kind t;
    if (!strcmp(kind, "act"))
        t = QCAL_NUMERIC_LOG_ACT;
    else if (!strcmp(kind, "param"))
        t = QCAL_NUMERIC_LOG_PARAM;
    else {
        PyErr_Format(ErrInvalid, "kind '%s': expected 'act' or 'param'", kind);
        return NULL;
    }
    long long m = 0, k = 0, n = 0;
    if (mkn != Py_None && !PyArg_ParseTuple(mkn, "LLL", &m, &k, &n))
        return NULL;
    f32_in in;
    if (f32_get(x, &in) < 0)
        return NULL;
    qcal_status st;
    Py_BEGIN_ALLOW_THREADS
    st = mkn != Py_None ? qcal_numeric_logger_log_linear(self->lg, fqn, op, m, k, n, &in.t)
                        : qcal_numeric_logger_log(self->lg, t, fqn, op, NULL, &in.t);
    Py_END_ALLOW_THREADS
    f32_release(&in);
    if (st < 0)
        return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *NumericLogger_finish(NumericLoggerObject *self, PyObject *noargs)
{
    (void)noargs;
    if (!self->lg) {
        PyErr_SetString(ErrState, "logger is not initialised");
        return NULL;
    }
    qcal_status st = qcal_numeric_logger_finish(self->lg);
    if (st < 0)
        return raise_status(st);
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

static PyObject *py_version(PyObject *mod, PyObject *noargs)
{
    (void)mod;
    (void)noargs;
    return PyUnicode_FromString(qcal_version());
}

static PyMethodDef module_methods[] = {
    {"sqnr", py_sqnr, METH_VARARGS,
     "sqnr(x, y) -> float: 20 log10(||x|| / ||x - y||) in dB (x reference, y quantized)."},
    {"l2", py_l2, METH_VARARGS, "l2(x, y) -> float: ||x - y|| / ||x||."},
    {"cosine", py_cosine, METH_VARARGS, "cosine(x, y) -> float: cosine similarity."},
    {"_quantize", py_quantize, METH_VARARGS, "internal: see qcal.quantize."},
    {"_dequantize", py_dequantize, METH_VARARGS, "internal: see qcal.dequantize."},
    {"_fake_quant", py_fake_quant, METH_VARARGS, "internal: see qcal.fake_quant."},
    {"_fake_quant_backward", py_fake_quant_backward, METH_VARARGS,
     "internal: see qcal.fake_quant_backward."},
    {"_fake_quant_learnable", py_fake_quant_learnable, METH_VARARGS,
     "internal: see qcal.fake_quant_learnable."},
    {"_fake_quant_learnable_backward", py_fake_quant_learnable_backward, METH_VARARGS,
     "internal: see qcal.fake_quant_learnable_backward."},
    {"_dump_scan", py_dump_scan, METH_O, "internal: the tensors of a dump directory."},
    {"_set_coercer", py_set_coercer, METH_O, "internal: the float32 input converter."},
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

PyMODINIT_FUNC PyInit__qcal(void);

PyMODINIT_FUNC PyInit__qcal(void)
{
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (!(s_dtype = PyUnicode_InternFromString("dtype")) ||
        !(s_layout = PyUnicode_InternFromString("layout")) ||
        !(s_is_cpu = PyUnicode_InternFromString("is_cpu")) ||
        !(s_is_contiguous = PyUnicode_InternFromString("is_contiguous")) ||
        !(s_is_neg = PyUnicode_InternFromString("is_neg")) ||
        !(s_shape = PyUnicode_InternFromString("shape")) ||
        !(s_data_ptr = PyUnicode_InternFromString("data_ptr")) ||
        !(s_torch = PyUnicode_InternFromString("torch")))
        goto fail;
    Error = PyErr_NewExceptionWithDoc("qcal.Error", "A libqcal call failed.", NULL, NULL);
    if (!Error)
        goto fail;
    Py_INCREF(Error);
    if (PyModule_AddObject(m, "Error", Error) < 0)
        goto fail;
    if (!(ErrInvalid = new_error(m, "InvalidArgumentError", PyExc_ValueError,
                                 "An argument or option is impossible.")) ||
        !(ErrFormat = new_error(m, "FormatError", PyExc_ValueError,
                                "A file or buffer is malformed or truncated.")) ||
        !(ErrUnsupported = new_error(m, "UnsupportedError", PyExc_ValueError,
                                     "Well formed but not supported.")) ||
        !(ErrNonfinite = new_error(m, "NonFiniteError", PyExc_ValueError,
                                   "NaN/Inf seen while the policy says it is an error.")) ||
        !(ErrMismatch = new_error(m, "MismatchError", PyExc_ValueError,
                                  "Shapes, kinds or configs do not agree.")) ||
        !(ErrEmpty = new_error(m, "EmptyError", PyExc_ValueError,
                               "A tensor has zero elements where data is required.")) ||
        !(ErrFile = new_error(m, "FileError", PyExc_OSError,
                              "A file could not be opened, read, written or renamed.")) ||
        !(ErrMemory = new_error(m, "OutOfMemoryError", PyExc_MemoryError,
                                "An allocation failed.")) ||
        !(ErrOverflow = new_error(m, "SizeOverflowError", PyExc_OverflowError,
                                  "A size computation would overflow.")) ||
        !(ErrState = new_error(m, "StateError", PyExc_RuntimeError,
                               "The object is not in a state that allows the call.")) ||
        !(ErrBackend = new_error(m, "BackendError", PyExc_RuntimeError,
                                 "A backend (oneDNN, ONNX Runtime) reported a failure.")) ||
        !(ErrNotFound = new_error(m, "NotFoundError", PyExc_LookupError,
                                  "A named item does not exist.")) ||
        !(ErrNoData = new_error(m, "NoDataError", PyExc_ValueError,
                                "A tensor saw no finite value (allow_empty=False).")))
        goto fail;
    if (PyType_Ready(&ObserverType) < 0)
        goto fail;
    Py_INCREF(&ObserverType);
    if (PyModule_AddObject(m, "Observer", (PyObject *)&ObserverType) < 0) {
        Py_DECREF(&ObserverType);
        goto fail;
    }
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&SessionType) < 0)
        goto fail;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        goto fail;
    }
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        goto fail;
    }
    if (PyType_Ready(&NumericLoggerType) < 0)
        goto fail;
    Py_INCREF(&NumericLoggerType);
    if (PyModule_AddObject(m, "NumericLogger", (PyObject *)&NumericLoggerType) < 0) {
        Py_DECREF(&NumericLoggerType);
        goto fail;
    }
    if (qcal_py_onnx_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
