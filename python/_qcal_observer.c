/* qcal._qcal, observers: qcal.Observer (qcal/observer.h) and its config <-> Python.
 *
 * The config comes in as keyword arguments spelled as the CLI and rules files spell them
 * (the library's one config parser reads them) and goes out as a dict built from a field
 * table. Each Observer has its own lock, taken with the GIL released, so two threads may
 * share one; kernels run with the GIL released. */
#include "_qcal_shared.h"

#include <pythread.h>

#include <math.h>
#include <string.h>

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
        qcal_py_raise_status(st);
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
                qcal_py_raise_status(st);
                return -1;
            }
        }
    }
    st = qcal_observer_config_validate(cfg);
    if (st < 0) {
        qcal_py_raise_status(st);
        return -1;
    }
    return 0;
}

/* Observer.config: the rules-file keys of every kind, then those of the kinds that have
 * them (`when`: a bit per kind). */
#define KIND_BIT(k) (1u << (k))
#define PER_CHANNEL (KIND_BIT(QCAL_OBSERVER_PER_CHANNEL_MINMAX) | \
                     KIND_BIT(QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX))
#define MOVING_AVERAGE (KIND_BIT(QCAL_OBSERVER_MOVING_AVERAGE_MINMAX) | \
                        KIND_BIT(QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX))
#define HISTOGRAM_FAMILY (~(KIND_BIT(QCAL_OBSERVER_HISTOGRAM) - 1u))   /* kind >= histogram */

_Static_assert(QCAL_OBSERVER_KIND_COUNT <= 32, "a kind bit per observer kind");
_Static_assert(sizeof(qcal_observer_grid) == sizeof(int) &&
               sizeof(qcal_percentile_mode) == sizeof(int) &&
               sizeof(qcal_nonfinite_policy) == sizeof(int), "QCAL_PY_CHOICE reads an int");

/* The Python spellings (rules files accept them; qcal_observer_grid_name writes first-batch). */
static const char *const grid_names[] = {
    [QCAL_GRID_LATTICE] = "lattice", [QCAL_GRID_FIRST_BATCH] = "first_batch",
    [QCAL_GRID_TORCH] = "torch" };
static const char *const percentile_mode_names[] = {
    [QCAL_PERCENTILE_ABS] = "abs", [QCAL_PERCENTILE_TWO_TAILS] = "two_tails",
    [QCAL_PERCENTILE_AUTO] = "auto" };
static const char *const nonfinite_names[] = {
    [QCAL_NONFINITE_SKIP] = "skip", [QCAL_NONFINITE_ERROR] = "error" };

static const qcal_py_field config_fields[] = {
    QCAL_PY_FIELD("dtype", QCAL_PY_DTYPE, qcal_observer_config, q.dtype),
    QCAL_PY_FIELD("qscheme", QCAL_PY_QSCHEME, qcal_observer_config, q.qscheme),
    QCAL_PY_FIELD("reduce_range", QCAL_PY_BOOL, qcal_observer_config, q.reduce_range),
    QCAL_PY_FIELD("quant_min", QCAL_PY_QMIN, qcal_observer_config, q),
    QCAL_PY_FIELD("quant_max", QCAL_PY_QMAX, qcal_observer_config, q),
    QCAL_PY_FIELD("eps", QCAL_PY_F32, qcal_observer_config, q.eps),
    QCAL_PY_FIELD_WHEN("axis", QCAL_PY_I32, qcal_observer_config, axis, PER_CHANNEL),
    QCAL_PY_FIELD_WHEN("averaging_constant", QCAL_PY_F32, qcal_observer_config,
                       averaging_constant, MOVING_AVERAGE),
    QCAL_PY_FIELD_WHEN("bins", QCAL_PY_I32, qcal_observer_config, bins, HISTOGRAM_FAMILY),
    QCAL_PY_FIELD_CHOICE("grid", qcal_observer_config, grid, grid_names, HISTOGRAM_FAMILY),
    QCAL_PY_FIELD_WHEN("percentile", QCAL_PY_F64, qcal_observer_config, percentile,
                       KIND_BIT(QCAL_OBSERVER_PERCENTILE)),
    QCAL_PY_FIELD_CHOICE("percentile_mode", qcal_observer_config, percentile_mode,
                         percentile_mode_names, KIND_BIT(QCAL_OBSERVER_PERCENTILE)),
    QCAL_PY_FIELD_WHEN("entropy_levels", QCAL_PY_I32, qcal_observer_config, entropy_levels,
                       KIND_BIT(QCAL_OBSERVER_ENTROPY)),
    QCAL_PY_FIELD_CHOICE("nonfinite", qcal_observer_config, nonfinite, nonfinite_names, 0),
};

/* The config as a dict of rules-file keys and Python values. */
static PyObject *config_to_python(const qcal_observer_config *cfg)
{
    PyObject *d = PyDict_New();
    if (d && qcal_py_dict_fields(d, cfg, config_fields, QCAL_PY_NFIELDS(config_fields),
                                 KIND_BIT(cfg->kind)) < 0)
        Py_CLEAR(d);
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
        PyErr_SetString(qcal_py_err_state, "observer is not initialised");
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
        qcal_py_raise_status(st);
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
    qcal_py_f32 in;
    if (qcal_py_f32_get(x, &in) < 0)
        return -1;
    if (skip_empty && in.numel == 0) {
        qcal_py_f32_release(&in);
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
    qcal_py_f32_release(&in);
    if (st < 0) {
        qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
    PyObject *res = qcal_py_qparams_arrays(&qp);
    qcal_qparams_free(&qp);
    return res;
}

/* qcal_observer_qrange or qcal_observer_data_range (both read a const observer). */
typedef qcal_status (*range_fn)(const qcal_observer *, int64_t, float *, float *, int64_t *);

static PyObject *range_common(ObserverObject *self, range_fn fn)
{
    if (check_obs(self) < 0)
        return NULL;
    int64_t n = 0;
    obs_lock(self);
    qcal_status st = qcal_observer_channels(self->obs, &n);
    obs_unlock(self);
    if (st < 0)
        return qcal_py_raise_status(st);
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
        qcal_py_raise_status(st);
    } else {
        if (st == QCAL_NO_DATA && got < 1) {
            got = 1;
            mn[0] = INFINITY;
            mx[0] = -INFINITY;
        }
        PyObject *a = qcal_py_f32_array(mn, got), *b = qcal_py_f32_array(mx, got);
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
    return range_common(self, qcal_observer_data_range);
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
    qcal_py_f32 a, b;
    if (qcal_py_f32_get_out(mo, &a) < 0)
        return NULL;
    if (qcal_py_f32_get_out(xo, &b) < 0) {
        qcal_py_f32_release(&a);
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
        qcal_py_raise_status(st);
    } else if (st == QCAL_NO_DATA) {
        res = Py_NewRef(Py_None);
    } else if (a.numel != got || b.numel != got) {
        res = Py_NewRef(Py_False);
    } else {
        memcpy(qcal_py_f32_out_data(&a), mn, (size_t)got * sizeof(float));
        memcpy(qcal_py_f32_out_data(&b), mx, (size_t)got * sizeof(float));
        res = Py_NewRef(Py_True);
    }
    if (mn != &one_mn)
        PyMem_RawFree(mn);
    if (mx != &one_mx)
        PyMem_RawFree(mx);
    qcal_py_f32_release(&a);
    qcal_py_f32_release(&b);
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
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

/* _torch_histogram() -> (counts float32[bins], min_val, max_val): grid=torch's PyTorch
 * buffers (qcal_observer_histogram_torch_get). */
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
    qcal_status st = qcal_observer_histogram_torch_get(self->obs, bins, c, &mn, &mx, &n);
    obs_unlock(self);
    PyObject *res = NULL;
    if (st < 0) {
        qcal_py_raise_status(st);
    } else {
        PyObject *a = qcal_py_f32_array(c, n);
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
    qcal_py_f32 in;
    if (qcal_py_f32_get(co, &in) < 0)
        return NULL;
    obs_lock(self);
    qcal_status st = qcal_observer_histogram_torch_set(self->obs, in.t.data, in.numel,
                                                       (float)mn, (float)mx);
    self->version = ++version_seq;
    obs_unlock(self);
    qcal_py_f32_release(&in);
    if (st < 0)
        return qcal_py_raise_status(st);
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
        qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
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

/* The counters, read under the observer's lock: one getter each, generated from this list
 * (attribute, accessor, C type, conversion, doc), which also fills Observer_getset. */
#define OBSERVER_COUNTERS(X)                                                                 \
    X(nonfinite, qcal_observer_nonfinite, uint64_t, PyLong_FromUnsignedLongLong,             \
      "NaN/Inf values skipped so far.")                                                      \
    X(batches, qcal_observer_batches, uint64_t, PyLong_FromUnsignedLongLong,                 \
      "Batches seen so far.")                                                                \
    X(channels, qcal_observer_channels, int64_t, PyLong_FromLongLong,                        \
      "Channel count (1 per tensor).")

#define OBSERVER_COUNTER_GETTER(name, accessor, ctype, convert, doc)                         \
    static PyObject *Observer_get_##name(ObserverObject *self, void *closure)                \
    {                                                                                        \
        (void)closure;                                                                       \
        if (check_obs(self) < 0)                                                             \
            return NULL;                                                                     \
        ctype n = 0;                                                                         \
        obs_lock(self);                                                                      \
        qcal_status st = accessor(self->obs, &n);                                            \
        obs_unlock(self);                                                                    \
        if (st < 0)                                                                          \
            return qcal_py_raise_status(st);                                                 \
        return convert(n);                                                                   \
    }
OBSERVER_COUNTERS(OBSERVER_COUNTER_GETTER)

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

#define OBSERVER_COUNTER_GETSET(name, accessor, ctype, convert, doc) \
    {#name, (getter)Observer_get_##name, NULL, doc, NULL},

static PyGetSetDef Observer_getset[] = {
    OBSERVER_COUNTERS(OBSERVER_COUNTER_GETSET)
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

int qcal_py_observer_init(PyObject *module)
{
    return qcal_py_add_type(module, "Observer", &ObserverType);
}
