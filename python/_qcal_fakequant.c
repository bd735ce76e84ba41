/* qcal._qcal, fake-quant: quantize / dequantize (qcal/quantize.h) and fake-quant forward and
 * backward, straight-through and learnable (LSQ) (qcal/fakequant.h), as the internal
 * functions behind qcal.quantize, qcal.fake_quant and qcal.torch's fake-quant modules.
 * Scales and zero points come as buffers (one value per tensor, or per channel along an
 * axis); outputs are written into the caller's buffers with the GIL released. */
#include "_qcal_shared.h"

#include <string.h>

/* Fills *qp from scale (float32 buffer) and zero points (int32 buffer): per tensor when
 * axis is None (one value each), else per channel along axis. The views stay valid while
 * the buffers are held. */
static int make_qparams(qcal_dtype dtype, PyObject *axis_o, Py_buffer *sc, Py_buffer *zp,
                        qcal_qparams *qp)
{
    int64_t n = sc->len / 4;
    if (zp->len / 4 != n || n < 1) {
        PyErr_Format(qcal_py_err_mismatch, "%lld scales and %lld zero points",
                     (long long)n, (long long)(zp->len / 4));
        return -1;
    }
    qcal_status st;
    if (axis_o == Py_None) {
        if (n != 1) {
            PyErr_Format(qcal_py_err_invalid, "%lld scales given without an axis (per tensor "
                         "takes one)", (long long)n);
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
        qcal_py_raise_status(st);
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
        return qcal_py_raise_status(st);
    qcal_py_f32 x;
    if (qcal_py_f32_get(xo, &x) < 0)
        return NULL;
    Py_buffer sc, zp, out;
    if (get_buf(so, &sc, PyBUF_SIMPLE) < 0) {
        qcal_py_f32_release(&x);
        return NULL;
    }
    if (get_buf(zo, &zp, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&sc);
        qcal_py_f32_release(&x);
        return NULL;
    }
    PyObject *res = NULL;
    qcal_qparams qp = {0};
    if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
        if (make_qparams(dt, axis_o, &sc, &zp, &qp) == 0) {
            Py_BEGIN_ALLOW_THREADS
            st = qcal_quantize(&x.t, &qp, out.buf);
            Py_END_ALLOW_THREADS
            res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
        }
        PyBuffer_Release(&out);
    }
    PyBuffer_Release(&sc);
    PyBuffer_Release(&zp);
    qcal_py_f32_release(&x);
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
        return qcal_py_raise_status(st);
    Py_buffer q, sc, zp, out;
    if (PyObject_GetBuffer(qo, &q, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *res = NULL;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            qcal_py_f32 o;
            if (PyObject_GetBuffer(outo, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
                memset(&o, 0, sizeof o);
                o.view = out;
                qcal_qparams qp = {0};
                if (qcal_py_f32_view(&o) == 0 && make_qparams(dt, axis_o, &sc, &zp, &qp) == 0) {
                    Py_BEGIN_ALLOW_THREADS
                    qcal_tensor_mut ot = qcal_py_mut_like(&o.t, out.buf);
                    st = qcal_dequantize(q.buf, &qp, &ot);
                    Py_END_ALLOW_THREADS
                    res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
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
            return qcal_py_raise_status(ds);
        int64_t lo, hi;
        qcal_dtype_range(dt, &lo, &hi);
        qmin = lo;
        qmax = hi;
    }
    qcal_py_f32 x;
    if (qcal_py_f32_get(xo, &x) < 0)
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
                        qcal_tensor_mut y = qcal_py_mut_like(&x.t, out.buf);
                        qcal_status st;
                        Py_BEGIN_ALLOW_THREADS
                        st = qcal_fakequant_forward(&x.t, &qp, &y, mask.buf);
                        Py_END_ALLOW_THREADS
                        res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
                    }
                    PyBuffer_Release(&mask);
                }
                PyBuffer_Release(&out);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    qcal_py_f32_release(&x);
    return res;
}

/* _fake_quant_backward(grad_y, mask, out): straight-through. */
static PyObject *py_fake_quant_backward(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *go, *mo, *outo;
    if (!PyArg_ParseTuple(args, "OOO", &go, &mo, &outo))
        return NULL;
    qcal_py_f32 g;
    if (qcal_py_f32_get(go, &g) < 0)
        return NULL;
    Py_buffer m, out;
    PyObject *res = NULL;
    if (get_buf(mo, &m, PyBUF_SIMPLE) == 0) {
        if (m.len != g.numel) {
            PyErr_Format(qcal_py_err_mismatch, "mask has %zd elements, grad %lld", m.len,
                         (long long)g.numel);
        } else if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
            qcal_tensor_mut y = qcal_py_mut_like(&g.t, out.buf);
            qcal_status st = qcal_fakequant_backward(&g.t, m.buf, &y);
            res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
            PyBuffer_Release(&out);
        }
        PyBuffer_Release(&m);
    }
    qcal_py_f32_release(&g);
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
        PyErr_Format(qcal_py_err_mismatch, "%lld scales and %lld zero points",
                     (long long)n, (long long)(zp->len / 4));
        return -1;
    }
    memset(qp, 0, sizeof *qp);
    qp->dtype = dtype_for_range(qmin, qmax);
    qp->quant_min = qmin;
    qp->quant_max = qmax;
    if (axis_o == Py_None) {
        if (n != 1) {
            PyErr_Format(qcal_py_err_invalid, "%lld scales given without an axis (per tensor "
                         "takes one)", (long long)n);
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
        PyErr_Format(qcal_py_err_invalid, "axis %ld is out of range", axis);
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
    qcal_py_f32 x;
    if (qcal_py_f32_get(xo, &x) < 0)
        return NULL;
    Py_buffer sc, zp, out, mask;
    PyObject *res = NULL;
    if (get_buf(so, &sc, PyBUF_SIMPLE) == 0) {
        if (get_buf(zo, &zp, PyBUF_SIMPLE) == 0) {
            if (get_buf(outo, &out, PyBUF_WRITABLE) == 0) {
                if (get_buf(masko, &mask, PyBUF_WRITABLE) == 0) {
                    qcal_qparams qp;
                    if (make_lsq_qparams(qmin, qmax, axis_o, &sc, &zp, &qp) == 0) {
                        qcal_tensor_mut y = qcal_py_mut_like(&x.t, out.buf);
                        qcal_status st;
                        Py_BEGIN_ALLOW_THREADS
                        st = qcal_fakequant_learnable_forward(&x.t, &qp, &y, mask.buf);
                        Py_END_ALLOW_THREADS
                        res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
                    }
                    PyBuffer_Release(&mask);
                }
                PyBuffer_Release(&out);
            }
            PyBuffer_Release(&zp);
        }
        PyBuffer_Release(&sc);
    }
    qcal_py_f32_release(&x);
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
    qcal_py_f32 x, g;
    if (qcal_py_f32_get(xo, &x) < 0)
        return NULL;
    if (qcal_py_f32_get(go, &g) < 0) {
        qcal_py_f32_release(&x);
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
                                PyErr_SetString(qcal_py_err_mismatch, "internal: output sizes");
                            } else {
                                qcal_tensor_mut gxt = qcal_py_mut_like(&x.t, gx.buf);
                                qcal_status st;
                                Py_BEGIN_ALLOW_THREADS
                                st = qcal_fakequant_learnable_backward(&x.t, &g.t, &qp, gf, &gxt,
                                                                       gs.buf, gz.buf);
                                Py_END_ALLOW_THREADS
                                res = st < 0 ? qcal_py_raise_status(st) : Py_NewRef(Py_None);
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
    qcal_py_f32_release(&g);
    qcal_py_f32_release(&x);
    return res;
}

static PyMethodDef fakequant_methods[] = {
    {"_quantize", py_quantize, METH_VARARGS, "internal: see qcal.quantize."},
    {"_dequantize", py_dequantize, METH_VARARGS, "internal: see qcal.dequantize."},
    {"_fake_quant", py_fake_quant, METH_VARARGS, "internal: see qcal.fake_quant."},
    {"_fake_quant_backward", py_fake_quant_backward, METH_VARARGS,
     "internal: see qcal.fake_quant_backward."},
    {"_fake_quant_learnable", py_fake_quant_learnable, METH_VARARGS,
     "internal: see qcal.fake_quant_learnable."},
    {"_fake_quant_learnable_backward", py_fake_quant_learnable_backward, METH_VARARGS,
     "internal: see qcal.fake_quant_learnable_backward."},
    {NULL, NULL, 0, NULL},
};

int qcal_py_fakequant_init(PyObject *module)
{
    return PyModule_AddFunctions(module, fakequant_methods);
}
