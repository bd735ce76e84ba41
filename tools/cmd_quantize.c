/* qcal quantize / qcal dequantize: float32 .npy <-> uint8/int8/int32 .npy with given
 * qparams, per tensor or per channel (qcal/quantize.h holds the arithmetic); FP8 codes
 * (float8_e4m3fn, float8_e5m2) travel as uint8 .npy (docs/fp8.md). */
#include <stdlib.h>
#include <string.h>

#include <qcal/quantize.h>

#include "cli_common.h"
#include "cli_output.h"

static const char quantize_help[] =
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
    "options:\n"
    "  --scale S            per-tensor scale (finite, > 0)\n"
    "  --zero-point Z       per-tensor zero-point in the dtype range (default 0)\n"
    "  --dtype D            quint8 (default), qint8, qint32, float8_e4m3fn, float8_e5m2\n"
    "  --axis N             per-channel: channel axis (<0 counts from the end)\n"
    "  --scales S.npy       per-channel: 1-D float array, one scale per channel\n"
    "  --zero-points Z.npy  per-channel: 1-D integer array (uint8/int8/int32/int64)\n"
    "  -o, --output OUT     output .npy (written atomically: a failed run leaves an\n"
    "                       existing OUT untouched)\n"
    "  -h, --help           this help\n";

static const char dequantize_help[] =
    "usage: qcal dequantize --scale S [--zero-point Z] [--dtype D] IN.npy -o OUT.npy\n"
    "       qcal dequantize --axis N --scales S.npy --zero-points Z.npy IN.npy -o OUT.npy\n"
    "\n"
    "Dequantizes an integer .npy to float32 as PyTorch's Tensor.dequantize():\n"
    "x = (q - zero_point) * scale in float32. The dtype comes from the file (uint8 ->\n"
    "quint8, int8 -> qint8, int32 -> qint32); --dtype, if given, must agree with it\n"
    "(exit 3 otherwise). A uint8 file with --dtype float8_e4m3fn or float8_e5m2 holds FP8\n"
    "codes: x = value(code) * scale (zero-point 0; docs/fp8.md).\n"
    "\n"
    "options:\n"
    "  --scale S            per-tensor scale (finite, > 0)\n"
    "  --zero-point Z       per-tensor zero-point in the dtype range (default 0)\n"
    "  --dtype D            expected dtype: quint8, qint8, qint32; float8_e4m3fn,\n"
    "                       float8_e5m2 (uint8 files of FP8 codes)\n"
    "  --axis N             per-channel: channel axis (<0 counts from the end)\n"
    "  --scales S.npy       per-channel: 1-D float array, one scale per channel\n"
    "  --zero-points Z.npy  per-channel: 1-D integer array (uint8/int8/int32/int64)\n"
    "  -o, --output OUT     output float32 .npy (written atomically)\n"
    "  -h, --help           this help\n";

enum { OPT_HELP = 1, OPT_SCALE, OPT_ZERO_POINT, OPT_DTYPE, OPT_AXIS, OPT_SCALES,
       OPT_ZERO_POINTS, OPT_OUTPUT };

static const cli_opt opts[] = {
    CLI_FLAG("help", 'h', OPT_HELP, NULL),
    CLI_OPT("scale", 0, OPT_SCALE, NULL, NULL),
    CLI_OPT("zero-point", 0, OPT_ZERO_POINT, NULL, NULL),
    CLI_OPT("dtype", 0, OPT_DTYPE, NULL, NULL),
    CLI_OPT("axis", 0, OPT_AXIS, NULL, NULL),
    CLI_OPT("scales", 0, OPT_SCALES, NULL, NULL),
    CLI_OPT("zero-points", 0, OPT_ZERO_POINTS, NULL, NULL),
    CLI_OPT("output", 'o', OPT_OUTPUT, NULL, NULL),
    { 0 },
};
const cli_opt *const cmd_quantize_opts = opts;
const cli_opt *const cmd_dequantize_opts = opts;

typedef struct qargs {
    const char *in, *out, *scales_path, *zps_path;
    bool have_scale, have_zp, have_dtype, have_axis;
    float scale;
    int32_t zero_point;
    qcal_dtype dtype;
    int32_t axis;
} qargs;

/* Parses the shared command line; returns 0, or an exit code (reported), or -1 for --help
 * (printed). */
static int parse_args(int argc, char **argv, const char *help, qargs *a)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *cmd = p.cmd, *val;
    int id, rc;
    int64_t v;
    memset(a, 0, sizeof *a);
    a->dtype = QCAL_QUINT8;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        switch (id) {
        case CLI_ERROR:
            return QCAL_EXIT_USAGE;
        case OPT_HELP:
            fputs(help, stdout);
            return -1;
        case CLI_POSITIONAL:
            if (a->in)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "more than one input file ('%s', '%s')",
                                a->in, val);
            a->in = val;
            break;
        case OPT_SCALE:
            if ((rc = cli_parse_f32(cmd, "--scale", val, &a->scale)))
                return rc;
            a->have_scale = true;
            break;
        case OPT_ZERO_POINT:
            if ((rc = cli_parse_i64(cmd, "--zero-point", val, INT32_MIN, INT32_MAX, &v)))
                return rc;
            a->zero_point = (int32_t)v;
            a->have_zp = true;
            break;
        case OPT_DTYPE:
            if (qcal_dtype_parse(val, &a->dtype) != QCAL_OK)
                return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype: unknown dtype '%s' (expected "
                                "quint8, qint8, qint32, float8_e4m3fn or float8_e5m2)", val);
            a->have_dtype = true;
            break;
        case OPT_AXIS:
            if ((rc = cli_parse_i64(cmd, "--axis", val, -QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1, &v)))
                return rc;
            a->axis = (int32_t)v;
            a->have_axis = true;
            break;
        case OPT_SCALES: a->scales_path = val; break;
        case OPT_ZERO_POINTS: a->zps_path = val; break;
        case OPT_OUTPUT: a->out = val; break;
        default: break;
        }
    }
    if ((rc = cli_check_qparam_mode(cmd, a->have_scale, a->have_zp, a->have_axis,
                                    a->scales_path, a->zps_path)))
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
    if (a->axis >= ndim || a->axis < -ndim)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--axis %d is out of range for '%s' with %d "
                        "dimensions", (int)a->axis, a->in, (int)ndim);
    int32_t axis = a->axis < 0 ? a->axis + ndim : a->axis;
    int64_t ch = shape[axis];
    int rc = cli_read_f32(cmd, a->scales_path, &c->sa);
    if (rc)
        return rc;
    if (c->sa.ndim != 1 || c->sa.numel != ch) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': expected a 1-D array of %lld scales (axis %d "
                      "of '%s'), got %d dimensions and %lld elements", a->scales_path,
                      (long long)ch, (int)axis, a->in, (int)c->sa.ndim, (long long)c->sa.numel);
        goto fail;
    }
    qcal_npy_array za;
    if ((rc = cli_read_zero_points_npy(cmd, a->zps_path, ch, &za)))
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
                          "zero-points (uint8, int8, int32 or int64)", a->zps_path,
                          qcal_npy_dtype_name(za.dtype));
            qcal_npy_array_free(&za);
            goto fail;
        }
        if (z < INT32_MIN || z > INT32_MAX) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': zero-point %lld (channel %lld) does not "
                          "fit in int32", a->zps_path, (long long)z, (long long)i);
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
        qp->axis = a->axis;
        qp->channels = cp->channels;
        qp->scales = cp->scales;
        qp->zero_points = cp->zero_points;
    } else {
        qp->qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_TENSOR_SYMMETRIC
                                                  : QCAL_PER_TENSOR_AFFINE;
        qp->channels = 1;
        qp->scale = a->scale;
        qp->zero_point = a->zero_point;
    }
    return qp;
}

int cmd_quantize(int argc, char **argv)
{
    const char *cmd = argv[0];
    qargs a;
    int rc = parse_args(argc, argv, quantize_help, &a);
    if (rc)
        return rc < 0 ? QCAL_EXIT_OK : rc;
    qcal_npy_array in = { 0 };
    chan_params cp = { 0 };
    void *dst = NULL;
    if ((rc = cli_read_f32(cmd, a.in, &in)))
        return rc;
    if (a.scales_path && (rc = load_chan_params(cmd, &a, in.ndim, in.shape, &cp)))
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
    int rc = parse_args(argc, argv, dequantize_help, &a);
    if (rc)
        return rc < 0 ? QCAL_EXIT_OK : rc;
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
    if (a.scales_path && (rc = load_chan_params(cmd, &a, in.ndim, in.shape, &cp)))
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
