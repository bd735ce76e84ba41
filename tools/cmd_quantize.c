/* qcal quantize / qcal dequantize: float32 .npy <-> uint8/int8/int32 .npy with given
 * qparams, per tensor or per channel (qcal/quantize.h holds the arithmetic); FP8 codes
 * (float8_e4m3fn, float8_e5m2) travel as uint8 .npy (docs/fp8.md). */
#include <stdlib.h>
#include <string.h>

#include <qcal/quantize.h>

#include "cli_common.h"
#include "cli_output.h"

enum { OPT_DTYPE = 1 };

typedef struct qargs {
    const char *in, *out;
    cli_qparam_args qp;   /* --scale, --zero-point, --axis, --scales, --zero-points */
    bool have_dtype;
    qcal_dtype dtype;
} qargs;

static const cli_opt quantize_opts[] = {
    CLI_TEXT(
        "usage: qcal quantize --scale S [--zero-point Z] [--dtype D] IN.npy -o OUT.npy\n"
        "       qcal quantize --axis N --scales S.npy --zero-points Z.npy [--dtype D] IN.npy\n"
        "                     -o OUT.npy\n"
        "\n"
        "Quantizes a float .npy (float32, float64 or float16; converted to float32) exactly as\n"
        "torch.quantize_per_tensor / torch.quantize_per_channel (...).int_repr(): round half to\n"
        "even of x * (1/scale), plus zero-point, clamped to the dtype range. NaN gives the\n"
        "zero-point, +-Inf the range ends. The output holds the integers: uint8 for quint8,\n"
        "int8 for qint8, int32 for qint32.\n"
        "FP8 (--dtype float8_e4m3fn or float8_e5m2; zero-point 0): the 8-bit float codes of\n"
        "x / scale as a uint8 .npy, bit-identical to ONNX Runtime's QuantizeLinear (round to\n"
        "nearest even, saturating to +-448 / +-57344, NaN -> 0x7F|sign; docs/fp8.md).\n"
        "\n"
        "options:\n"),
    CLI_QPARAM_SCALE_OPT,
    CLI_QPARAM_ZERO_POINT_OPT("per-tensor zero-point in the dtype range (default 0)"),
    CLI_OPT("dtype", 0, OPT_DTYPE, "D",
        "quint8 (default), qint8, qint32, float8_e4m3fn, float8_e5m2"),
    CLI_QPARAM_AXIS_OPT,
    CLI_QPARAM_SCALES_OPT,
    CLI_QPARAM_ZERO_POINTS_OPT("per-channel: 1-D integer array (uint8/int8/int32/int64)"),
    CLI_STR("output", 'o', qargs, out, "OUT",
        "output .npy (written atomically: a failed run leaves an\n"
        "existing OUT untouched)"),
    CLI_HELP_OPT,

    { 0 },
};
const cli_spec cmd_quantize_spec = { quantize_opts, 23 };

static const cli_opt dequantize_opts[] = {
    CLI_TEXT(
        "usage: qcal dequantize --scale S [--zero-point Z] [--dtype D] IN.npy -o OUT.npy\n"
        "       qcal dequantize --axis N --scales S.npy --zero-points Z.npy IN.npy -o OUT.npy\n"
        "\n"
        "Dequantizes an integer .npy to float32 as PyTorch's Tensor.dequantize():\n"
        "x = (q - zero_point) * scale in float32. The dtype comes from the file (uint8 ->\n"
        "quint8, int8 -> qint8, int32 -> qint32); --dtype, if given, must agree with it\n"
        "(exit 3 otherwise). A uint8 file with --dtype float8_e4m3fn or float8_e5m2 holds FP8\n"
        "codes: x = value(code) * scale (zero-point 0; docs/fp8.md).\n"
        "\n"
        "options:\n"),
    CLI_QPARAM_SCALE_OPT,
    CLI_QPARAM_ZERO_POINT_OPT("per-tensor zero-point in the dtype range (default 0)"),
    CLI_OPT("dtype", 0, OPT_DTYPE, "D",
        "expected dtype: quint8, qint8, qint32; float8_e4m3fn,\n"
        "float8_e5m2 (uint8 files of FP8 codes)"),
    CLI_QPARAM_AXIS_OPT,
    CLI_QPARAM_SCALES_OPT,
    CLI_QPARAM_ZERO_POINTS_OPT("per-channel: 1-D integer array (uint8/int8/int32/int64)"),
    CLI_STR("output", 'o', qargs, out, "OUT", "output float32 .npy (written atomically)"),
    CLI_HELP_OPT,

    { 0 },
};
const cli_spec cmd_dequantize_spec = { dequantize_opts, 23 };

static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    qargs *a = args;
    int rc = cli_qparam_opt(cmd, &a->qp, id, val);
    if (rc >= 0)
        return rc;
    if (id == CLI_POSITIONAL) {
        if (a->in)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "more than one input file ('%s', '%s')",
                            a->in, val);
        a->in = val;
        return 0;
    }
    /* OPT_DTYPE */
    if (qcal_dtype_parse(val, &a->dtype) != QCAL_OK)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype: unknown dtype '%s' (expected "
                        "quint8, qint8, qint32, float8_e4m3fn or float8_e5m2)", val);
    a->have_dtype = true;
    return 0;
}

/* Parses the shared command line; returns 0, or an exit code (reported), or CLI_HELP_SHOWN. */
static int parse_args(int argc, char **argv, const cli_spec *spec, qargs *a)
{
    const char *cmd = argv[0];
    memset(a, 0, sizeof *a);
    a->dtype = QCAL_QUINT8;
    a->qp.integer_zero_point = true;
    int rc = cli_parse(spec, argc, argv, a, take_opt);
    if (rc || (rc = cli_qparam_check(cmd, &a->qp)))
        return rc;
    rc = cli_check_in_out(cmd, a->in, a->out);
    return rc ? rc : cli_output_check(cmd, a->out);   /* before the work */
}

/* Per-channel qparams from their files: ch scales (float) and zero-points (integers). */
typedef struct chan_params {
    int64_t channels;
    float *scales;         /* owned by sa */
    int32_t *zero_points;  /* owned */
    qcal_npy_array sa;
} chan_params;

static void chan_params_free(chan_params *c)
{
    qcal_npy_array_free(&c->sa);
    free(c->zero_points);
    memset(c, 0, sizeof *c);
}

static int load_chan_params(const char *cmd, const qargs *a, int32_t ndim, const int64_t *shape,
                            chan_params *c)
{
    memset(c, 0, sizeof *c);
    if (a->qp.axis >= ndim || a->qp.axis < -ndim)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--axis %d is out of range for '%s' with %d "
                        "dimensions", (int)a->qp.axis, a->in, (int)ndim);
    int32_t axis = a->qp.axis < 0 ? a->qp.axis + ndim : a->qp.axis;
    int64_t ch = shape[axis];
    int rc = cli_read_f32(cmd, a->qp.scales_path, &c->sa);
    if (rc)
        return rc;
    if (c->sa.ndim != 1 || c->sa.numel != ch) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': expected a 1-D array of %lld scales (axis %d "
                      "of '%s'), got %d dimensions and %lld elements", a->qp.scales_path,
                      (long long)ch, (int)axis, a->in, (int)c->sa.ndim, (long long)c->sa.numel);
        goto fail;
    }
    qcal_npy_array za;
    if ((rc = cli_read_zero_points_npy(cmd, a->qp.zps_path, ch, &za)))
        goto fail;
    c->zero_points = malloc((size_t)(ch > 0 ? ch : 1) * sizeof *c->zero_points);
    if (!c->zero_points) {
        qcal_npy_array_free(&za);
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < ch; i++) {
        int64_t z;
        switch (za.dtype) {
        case QCAL_NPY_U8: z = ((const uint8_t *)za.data)[i]; break;
        case QCAL_NPY_I8: z = ((const int8_t *)za.data)[i]; break;
        case QCAL_NPY_I32: z = ((const int32_t *)za.data)[i]; break;
        case QCAL_NPY_I64: z = ((const int64_t *)za.data)[i]; break;
        default:
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' holds %s data, expected integer "
                          "zero-points (uint8, int8, int32 or int64)", a->qp.zps_path,
                          qcal_npy_dtype_name(za.dtype));
            qcal_npy_array_free(&za);
            goto fail;
        }
        if (z < INT32_MIN || z > INT32_MAX) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': zero-point %lld (channel %lld) does not "
                          "fit in int32", a->qp.zps_path, (long long)z, (long long)i);
            qcal_npy_array_free(&za);
            goto fail;
        }
        c->zero_points[i] = (int32_t)z;
    }
    qcal_npy_array_free(&za);
    c->channels = ch;
    c->scales = c->sa.data;
    return 0;
fail:
    chan_params_free(c);
    return rc;
}

static qcal_npy_dtype npy_of(qcal_dtype d)
{
    return d == QCAL_QUINT8 || qcal_dtype_is_float8(d) ? QCAL_NPY_U8
           : d == QCAL_QINT8                          ? QCAL_NPY_I8
                                                      : QCAL_NPY_I32;
}

/* The qparams value of the options: per-tensor (--scale/--zero-point) or a view over the
 * per-channel arrays read from --scales/--zero-points; the dtype's full range. Validated
 * by quantize / dequantize themselves. */
static const qcal_qparams *qparams_of(const qargs *a, const chan_params *cp, qcal_dtype dtype,
                                      qcal_qparams *qp)
{
    memset(qp, 0, sizeof *qp);
    qp->dtype = dtype;
    qcal_dtype_range(dtype, &qp->quant_min, &qp->quant_max);
    if (cp->scales) {
        qp->qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC
                                                  : QCAL_PER_CHANNEL_AFFINE;
        qp->axis = a->qp.axis;
        qp->channels = cp->channels;
        qp->scales = cp->scales;
        qp->zero_points = cp->zero_points;
    } else {
        qp->qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_TENSOR_SYMMETRIC
                                                  : QCAL_PER_TENSOR_AFFINE;
        qp->channels = 1;
        qp->scale = a->qp.scale;
        qp->zero_point = (int32_t)a->qp.zero_point;
    }
    return qp;
}

int cmd_quantize(int argc, char **argv)
{
    const char *cmd = argv[0];
    qargs a;
    int rc = parse_args(argc, argv, &cmd_quantize_spec, &a);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    qcal_npy_array in = { 0 };
    chan_params cp = { 0 };
    void *dst = NULL;
    if ((rc = cli_read_f32(cmd, a.in, &in)))
        return rc;
    if (a.qp.scales_path && (rc = load_chan_params(cmd, &a, in.ndim, in.shape, &cp)))
        goto out;
    size_t esize = qcal_dtype_size(a.dtype), nbytes;
    if (!esize || __builtin_mul_overflow((size_t)in.numel, esize, &nbytes)) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "output size overflows");
        goto out;
    }
    dst = malloc(nbytes ? nbytes : 1);
    if (!dst) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory for %zu bytes", nbytes);
        goto out;
    }
    /* A 0-element input still validates the qparams (the kernel reads nothing). */
    float dummy = 0.0f;
    qcal_qparams qp;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, in.data ? in.data : &dummy, in.ndim, in.shape);
    if (st == QCAL_OK)
        st = qcal_quantize(&t, qparams_of(&a, &cp, a.dtype, &qp), dst);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_PARAMS), st);
        goto out;
    }
    rc = cli_write_npy(cmd, cli_output_path(a.out), npy_of(a.dtype), in.ndim, in.shape, dst);
out:
    free(dst);
    chan_params_free(&cp);
    qcal_npy_array_free(&in);
    return rc;
}

int cmd_dequantize(int argc, char **argv)
{
    const char *cmd = argv[0];
    qargs a;
    int rc = parse_args(argc, argv, &cmd_dequantize_spec, &a);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    qcal_npy_array in = { 0 };
    chan_params cp = { 0 };
    float *dst = NULL;
    if ((rc = cli_read_npy(cmd, a.in, &in)))
        return rc;
    qcal_dtype file_dtype;
    switch (in.dtype) {
    case QCAL_NPY_U8:   /* quint8, or FP8 codes when --dtype says so */
        file_dtype = a.have_dtype && qcal_dtype_is_float8(a.dtype) ? a.dtype : QCAL_QUINT8;
        break;
    case QCAL_NPY_I8: file_dtype = QCAL_QINT8; break;
    case QCAL_NPY_I32: file_dtype = QCAL_QINT32; break;
    default:
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' holds %s data; dequantize reads uint8 "
                      "(quint8 or FP8 codes), int8 (qint8) or int32 (qint32)", a.in,
                      qcal_npy_dtype_name(in.dtype));
        goto out;
    }
    if (a.have_dtype && a.dtype != file_dtype) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' holds %s data (%s), not --dtype %s", a.in,
                      qcal_npy_dtype_name(in.dtype), qcal_dtype_name(file_dtype),
                      qcal_dtype_name(a.dtype));
        goto out;
    }
    if (a.qp.scales_path && (rc = load_chan_params(cmd, &a, in.ndim, in.shape, &cp)))
        goto out;
    size_t nbytes;
    if (__builtin_mul_overflow((size_t)in.numel, sizeof *dst, &nbytes)) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "output size overflows");
        goto out;
    }
    dst = malloc(nbytes ? nbytes : 1);
    if (!dst) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory for %zu bytes", nbytes);
        goto out;
    }
    int32_t dummy = 0;
    qcal_qparams qp;
    qcal_tensor_mut t;
    qcal_status st = qcal_tensor_mut_init(&t, dst, in.ndim, in.shape);
    const void *src = in.data ? in.data : (const void *)&dummy;
    if (st == QCAL_OK)
        st = qcal_dequantize(src, qparams_of(&a, &cp, file_dtype, &qp), &t);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_PARAMS), st);
        goto out;
    }
    rc = cli_write_npy(cmd, cli_output_path(a.out), QCAL_NPY_F32, in.ndim, in.shape, dst);
out:
    free(dst);
    chan_params_free(&cp);
    qcal_npy_array_free(&in);
    return rc;
}
