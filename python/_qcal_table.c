/* qcal._qcal, tables: qcal.Table (a qcal_calib_table, qcal/calib.h): its formats and the
 * export options of `qcal calibrate` / `qcal convert`, write (one file or a directory, all
 * or nothing), entries as dicts (from field tables), repr, read_json. Session.table() makes
 * them (_qcal_session.c). */
#include "_qcal_shared.h"

#include <stdio.h>
#include <string.h>

typedef qcal_py_table TableObject;

static PyTypeObject TableType;
PyTypeObject *const qcal_py_table_type = &TableType;

static void Table_dealloc(TableObject *self)
{
    qcal_calib_table_destroy(&self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyObject *qcal_py_table_wrap(qcal_calib_table *t, bool allow_empty)
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

/* Entries that saw no finite value (no_data). Not allowed: raises NoDataError naming every
 * one and returns -1. Allowed and warn: one RuntimeWarning per entry (-1 if a warning was
 * turned into an error). Else 0. */
int qcal_py_table_check_no_data(const qcal_calib_table *t, bool allow_empty, bool warn)
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
    PyErr_Format(qcal_py_err_no_data, "%lld tensor%s saw no finite value (every value "
                 "NaN/Inf), nothing to calibrate: %U (pass allow_empty=True to keep them "
                 "marked no_data)",
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
        qcal_py_raise_status(st);
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
                PyErr_Format(qcal_py_err_invalid, "format %s listed twice",
                             qcal_calib_format_name(f));
                goto fail;
            }
        out[count++] = f;   /* at most 4 distinct formats */
    }
    Py_DECREF(items);
    if (count == 0) {
        PyErr_SetString(qcal_py_err_invalid, "no format given");
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
            PyErr_Format(qcal_py_err_invalid, "trt_version '%s' is neither a TensorRT version "
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
            PyErr_Format(qcal_py_err_invalid, "unknown trt_algorithm '%s' (expected one of "
                         "%s, %s, %s, %s)", a, trt_algorithms[0], trt_algorithms[1],
                         trt_algorithms[2], trt_algorithms[3]);
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
    if (qcal_py_table_check_no_data(self->t, allow || self->allow_empty, false) < 0)
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
        return qcal_py_raise_status(st);
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
    if (qcal_py_table_check_no_data(self->t, allow || self->allow_empty, false) < 0 ||
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
        return qcal_py_raise_status(st);
    Py_RETURN_NONE;
}

/* Table.entries' dict: the entry's fields before and after the per-channel arrays (min,
 * max, scale, zero_point), which entry_dict adds between them. */
static const qcal_py_field entry_head[] = {
    /* "fqn" as in the JSON table; "name" the same string (the key of earlier releases). */
    QCAL_PY_FIELD("fqn", QCAL_PY_STR, qcal_calib_entry, fqn),
    QCAL_PY_FIELD("name", QCAL_PY_STR, qcal_calib_entry, fqn),
    QCAL_PY_FIELD("role", QCAL_PY_ROLE, qcal_calib_entry, role),
    QCAL_PY_FIELD("observer", QCAL_PY_KIND, qcal_calib_entry, observer),
    QCAL_PY_FIELD("dtype", QCAL_PY_DTYPE, qcal_calib_entry, qparams.dtype),
    QCAL_PY_FIELD("qscheme", QCAL_PY_QSCHEME, qcal_calib_entry, qparams.qscheme),
    QCAL_PY_FIELD("axis", QCAL_PY_I32, qcal_calib_entry, qparams.axis),
    QCAL_PY_FIELD("quant_min", QCAL_PY_I64, qcal_calib_entry, qparams.quant_min),
    QCAL_PY_FIELD("quant_max", QCAL_PY_I64, qcal_calib_entry, qparams.quant_max),
};
static const qcal_py_field entry_tail[] = {
    QCAL_PY_FIELD("batches", QCAL_PY_U64, qcal_calib_entry, batches),
    QCAL_PY_FIELD("elements", QCAL_PY_U64, qcal_calib_entry, elements),
    QCAL_PY_FIELD("nonfinite", QCAL_PY_U64, qcal_calib_entry, nonfinite),
    QCAL_PY_FIELD("no_data", QCAL_PY_BOOL, qcal_calib_entry, no_data),
};

static PyObject *entry_dict(const qcal_calib_entry *e)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    const qcal_qparams *qp = &e->qparams;
    int64_t ch = qp->channels < 1 ? 1 : qp->channels;
    PyObject *sz = NULL;
    if (qcal_py_dict_fields(d, e, entry_head, QCAL_PY_NFIELDS(entry_head), 0) < 0 ||
        qcal_py_dict_set_steal(d, "min", qcal_py_f32_array(e->min_val, ch)) < 0 ||
        qcal_py_dict_set_steal(d, "max", qcal_py_f32_array(e->max_val, ch)) < 0 ||
        !(sz = qcal_py_qparams_arrays(qp)) ||
        PyDict_SetItemString(d, "scale", PyTuple_GET_ITEM(sz, 0)) < 0 ||
        PyDict_SetItemString(d, "zero_point", PyTuple_GET_ITEM(sz, 1)) < 0 ||
        qcal_py_dict_fields(d, e, entry_tail, QCAL_PY_NFIELDS(entry_tail), 0) < 0)
        Py_CLEAR(d);
    Py_XDECREF(sz);
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
        return qcal_py_raise_status(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e = NULL;
        st = qcal_calib_table_entry(self->t, i, &e);
        PyObject *d = st < 0 ? qcal_py_raise_status(st) : entry_dict(e);
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
        return qcal_py_raise_status(st);
    return qcal_py_table_wrap(t, false);
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

int qcal_py_table_init(PyObject *module)
{
    return qcal_py_add_type(module, "Table", &TableType);
}
