/* qcal._qcal, sessions: qcal.Session (qcal_calib_session, qcal/calib.h), the C base of the
 * package's Session: named tensors observed batch by batch (thread-safe, the GIL released),
 * safetensors weights, the table snapshot; and the dump directories `qcal calibrate DIR`
 * reads (_dump_scan). */
#include "_qcal_shared.h"

#include <string.h>

#include <qcal/calib_dump.h>

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
        qcal_py_raise_status(st);
        return -1;
    }
    qcal_calib_session_destroy(&self->s);
    self->s = s;
    return 0;
}

static int check_session(SessionObject *self)
{
    if (!self->s) {
        PyErr_SetString(qcal_py_err_state, "session is not initialised");
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
        return qcal_py_raise_status(st);
    long long step = QCAL_STEP_AUTO;
    if (step_o != Py_None) {
        step = PyLong_AsLongLong(step_o);
        if (step == -1 && PyErr_Occurred())
            return NULL;
        if (step < 0) {
            PyErr_SetString(qcal_py_err_invalid, "step must be >= 0 (or None for call order)");
            return NULL;
        }
    }
    qcal_py_f32 in;
    if (qcal_py_f32_get(x, &in) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    st = qcal_calib_session_observe(self->s, name, role, (int64_t)step, &in.t);
    Py_END_ALLOW_THREADS
    qcal_py_f32_release(&in);
    if (st < 0)
        return qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
    }
    int64_t n = 0;
    long long observed = 0, skipped = 0;
    float *buf = NULL;
    PyObject *res = NULL;
    qcal_safetensors_count(sf, &n);
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        if ((st = qcal_safetensors_info(sf, i, &info)) < 0) {
            qcal_py_raise_status(st);
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
            PyErr_Format(qcal_py_err_empty, "'%s': tensor '%s' is empty (0 elements), "
                         "nothing to observe", PyBytes_AS_STRING(path), info.name);
            goto out;
        }
        if ((uint64_t)info.numel > SIZE_MAX / sizeof(float) ||
            !(buf = PyMem_RawMalloc((size_t)info.numel * sizeof(float)))) {
            PyErr_Format(qcal_py_err_memory, "'%s': out of memory for tensor '%s' (%lld "
                         "elements)", PyBytes_AS_STRING(path), info.name, (long long)info.numel);
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
            qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
    if (profile && (st = qcal_calib_table_set_profile(t, profile)) < 0) {
        qcal_calib_table_destroy(&t);
        return qcal_py_raise_status(st);
    }
    if (qcal_py_table_check_no_data(t, allow, true) < 0) {
        qcal_calib_table_destroy(&t);
        return NULL;
    }
    return qcal_py_table_wrap(t, allow);
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
        return qcal_py_raise_status(st);
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

static PyMethodDef session_methods[] = {
    {"_dump_scan", py_dump_scan, METH_O, "internal: the tensors of a dump directory."},
    {NULL, NULL, 0, NULL},
};

int qcal_py_session_init(PyObject *module)
{
    if (qcal_py_add_type(module, "Session", &SessionType) < 0)
        return -1;
    return PyModule_AddFunctions(module, session_methods);
}
