/* qcal fakequant: quantize-dequantize a float .npy with given qparams (per tensor or per
 * channel), optionally run the straight-through backward on a gradient .npy, and with
 * --learnable print the LSQ gradients of scale and zero-point (qcal/fakequant.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <qcal/fakequant.h>

#include "cli_common.h"
#include "cli_output.h"

enum { OPT_QMIN = 1, OPT_QMAX, OPT_GRAD_FACTOR, OPT_DTYPE };

typedef struct fargs {
    const char *in, *out, *grad, *grad_out;
    cli_qparam_args qp;   /* --scale, --zero-point, --axis, --scales, --zero-points */
    bool learnable, have_range, fp8;
    qcal_dtype dtype;     /* fp8: the FP8 dtype */
    float grad_factor;
    int64_t qmin, qmax;
} fargs;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal fakequant --scale S --zero-point Z [--quant-min A --quant-max B] IN.npy\n"
        "                      -o OUT.npy [--grad G.npy --grad-out GX.npy] [--learnable]\n"
        "       qcal fakequant --axis N --scales S.npy --zero-points Z.npy ... (per channel)\n"
        "\n"
        "Fake-quantizes IN (float32/float64/float16, converted to float32) exactly as PyTorch\n"
        "1.13's fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine:\n"
        "y = (clamp(zp + round_half_even(x * (1/scale)), A, B) - zp) * scale. With --grad, also\n"
        "writes the straight-through gradient (G where the unclamped value was inside [A, B],\n"
        "else 0). With --learnable the zero-points may be fractional (rounded half to even, as\n"
        "_fake_quantize_learnable_*), the backward is LSQ's and a JSON object with grad_scale\n"
        "and grad_zero_point (arrays, one value per channel) is printed on stdout.\n"
        "With --dtype float8_e4m3fn or float8_e5m2 (zero-point 0, no --quant-min/--quant-max,\n"
        "no --learnable): y = value(FP8 code of x / scale) * scale, as ONNX Runtime's\n"
        "QuantizeLinear + DequantizeLinear; the gradient passes where |x / scale| did not\n"
        "saturate (<= 464, < 61440; docs/fp8.md).\n"
        "\n"
        "options:\n"),
    CLI_QPARAM_SCALE_OPT,
    CLI_QPARAM_ZERO_POINT_OPT("per-tensor zero-point in [A, B] (default 0)"),
    CLI_OPT("quant-min", 0, OPT_QMIN, "A", "smallest quantized value (default 0)"),
    CLI_OPT("quant-max", 0, OPT_QMAX, "B", "largest quantized value (default 255)"),
    CLI_OPT("dtype", 0, OPT_DTYPE, "D",
        "float8_e4m3fn or float8_e5m2: FP8 fake-quant (default: the\n"
        "integer range [A, B])"),
    CLI_QPARAM_AXIS_OPT,
    CLI_QPARAM_SCALES_OPT,
    CLI_QPARAM_ZERO_POINTS_OPT("per-channel: 1-D integer (or, --learnable, float) array"),
    CLI_STR("grad", 0, fargs, grad, "G.npy", "upstream gradient, same shape as IN"),
    CLI_STR("grad-out", 0, fargs, grad_out, "GX.npy", "gradient with respect to IN (needs --grad)"),
    CLI_BOOL("learnable", 0, fargs, learnable,
        "LSQ backward; prints grad_scale / grad_zero_point (needs --grad)"),
    CLI_OPT("grad-factor", 0, OPT_GRAD_FACTOR, "F",
        "LSQ gradient factor (default 1; e.g. 1/sqrt(numel * B))"),
    CLI_STR("output", 'o', fargs, out, "OUT", "fake-quantized output .npy (written atomically)"),
    CLI_HELP_OPT,

    { 0 },
};
const cli_spec cmd_fakequant_spec = { opts, 23 };

static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    fargs *a = args;
    int rc = cli_qparam_opt(cmd, &a->qp, id, val);
    if (rc >= 0)
        return rc;
    switch (id) {
    case CLI_POSITIONAL:
        if (a->in)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "more than one input file ('%s', '%s')",
                            a->in, val);
        a->in = val;
        return 0;
    case OPT_QMIN:
    case OPT_QMAX:
        a->have_range = true;
        return cli_parse_i64(cmd, id == OPT_QMIN ? "--quant-min" : "--quant-max", val,
                             -QCAL_FAKEQUANT_QRANGE_LIMIT, QCAL_FAKEQUANT_QRANGE_LIMIT,
                             id == OPT_QMIN ? &a->qmin : &a->qmax);
    case OPT_DTYPE:
        if (qcal_dtype_parse(val, &a->dtype) != QCAL_OK || !qcal_dtype_is_float8(a->dtype))
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype: '%s' is not float8_e4m3fn or "
                            "float8_e5m2 (integer fake-quant takes --quant-min/--quant-max)",
                            val);
        a->fp8 = true;
        return 0;
    default:   /* OPT_GRAD_FACTOR */
        return cli_parse_f32(cmd, "--grad-factor", val, &a->grad_factor);
    }
}

static int parse(int argc, char **argv, fargs *a)
{
    const char *cmd = argv[0];
    memset(a, 0, sizeof *a);
    a->qmin = 0;
    a->qmax = 255;
    a->grad_factor = 1.0f;
    int rc = cli_parse(&cmd_fakequant_spec, argc, argv, a, take_opt);
    if (rc || (rc = cli_qparam_check(cmd, &a->qp)))
        return rc;
    bool per_channel = cli_qparam_per_channel(&a->qp);
    if (a->fp8 && (a->have_range || a->learnable))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype %s takes no %s", qcal_dtype_name(a->dtype),
                        a->learnable ? "--learnable (no LSQ for FP8)" : "--quant-min/--quant-max");
    if (a->fp8) {   /* the FP8 range; zero-points must be 0 (checked with the qparams) */
        a->qmin = (int64_t)-qcal_dtype_float8_max(a->dtype);
        a->qmax = (int64_t)qcal_dtype_float8_max(a->dtype);
    }
    if (a->qmin > a->qmax)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--quant-min %lld is greater than --quant-max %lld",
                        (long long)a->qmin, (long long)a->qmax);
    if (!per_channel && !a->learnable &&
        (a->qp.zero_point != floor(a->qp.zero_point) || a->qp.zero_point < (double)a->qmin ||
         a->qp.zero_point > (double)a->qmax))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--zero-point %g must be an integer in [%lld, %lld]",
                        a->qp.zero_point, (long long)a->qmin, (long long)a->qmax);
    if (a->grad_out && !a->grad)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--grad-out needs --grad G.npy");
    if (a->learnable && !a->grad)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--learnable needs --grad G.npy");
    rc = cli_check_in_out(cmd, a->in, a->out);
    if (!rc && cli_output_is_stdout(a->out) && cli_output_is_stdout(a->grad_out))
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "only one output can be '-' (standard output)");
    if (!rc)   /* every output checked before the work */
        rc = cli_output_check(cmd, a->out);
    return rc ? rc : cli_output_check(cmd, a->grad_out);
}

/* Reads a 1-D zero-point array of ch values (any integer or float dtype) as float. */
static int read_zero_points(const char *cmd, const fargs *a, int64_t ch, float *zp)
{
    qcal_npy_array za;
    int rc = cli_read_zero_points_npy(cmd, a->qp.zps_path, ch, &za);
    if (rc)
        return rc;
    for (int64_t i = 0; i < ch && !rc; i++) {
        double z;
        switch (za.dtype) {
        case QCAL_NPY_U8: z = ((const uint8_t *)za.data)[i]; break;
        case QCAL_NPY_I8: z = ((const int8_t *)za.data)[i]; break;
        case QCAL_NPY_I32: z = ((const int32_t *)za.data)[i]; break;
        case QCAL_NPY_I64: z = (double)((const int64_t *)za.data)[i]; break;
        case QCAL_NPY_F64: z = ((const double *)za.data)[i]; break;
        case QCAL_NPY_F32: z = ((const float *)za.data)[i]; break;
        default:
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': zero-points of dtype %s are not "
                          "supported", a->qp.zps_path, qcal_npy_dtype_name(za.dtype));
            z = 0.0;
            break;
        }
        if (rc)
            break;
        if (!isfinite(z) || (!a->learnable && (z != floor(z) || z < (double)a->qmin ||
                                               z > (double)a->qmax)))
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': zero-point %g of channel %lld must be "
                          "%s in [%lld, %lld]", a->qp.zps_path, z, (long long)i,
                          a->learnable ? "finite" : "an integer", (long long)a->qmin,
                          (long long)a->qmax);
        zp[i] = (float)z;
    }
    qcal_npy_array_free(&za);
    return rc;
}

/* Stages one float32 .npy output (tools/cli_output.h). */
static int stage_npy(const char *cmd, cli_staged *s, const char *path, int32_t ndim,
                     const int64_t *shape, const float *data)
{
    if (s->n == CLI_STAGED_MAX) {
        cli_stage_abort(s);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "too many outputs");
    }
    if (cli_output_is_stdout(path))
        fflush(stdout);
    qcal_atomic_file *f = &s->f[s->n];
    qcal_status st = qcal_atomic_file_open(f, cli_output_path(path));
    if (st == QCAL_OK) {
        s->n++;
        st = qcal_npy_fwrite(f->fp, path, QCAL_NPY_F32, ndim, shape, data);
        if (st == QCAL_OK)
            st = qcal_atomic_file_flush(f);
    }
    if (st != QCAL_OK) {
        int rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        cli_stage_abort(s);
        return rc;
    }
    return 0;
}

int cmd_fakequant(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "fakequant";
    fargs a;
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    qcal_npy_array x = { 0 }, g = { 0 }, sa = { 0 };
    float *y = NULL, *gx = NULL, *zp = NULL, *gs = NULL, *gz = NULL;
    int32_t *zpi = NULL;
    cli_staged staged = { 0 };
    if ((rc = cli_read_f32(cmd, a.in, &x)))
        goto done;
    if (x.numel == 0) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is empty", a.in);
        goto done;
    }
    qcal_tensor t;
    if (qcal_npy_as_tensor(&x, &t) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_INPUT, QCAL_ERR_FORMAT);
        goto done;
    }
    if (a.grad) {
        if ((rc = cli_read_f32(cmd, a.grad, &g)))
            goto done;
        bool same = g.ndim == x.ndim;
        for (int32_t d = 0; same && d < x.ndim; d++)
            same = g.shape[d] == x.shape[d];
        if (!same) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' has %lld elements in %d dimensions; the "
                          "gradient must have the shape of '%s'", a.grad, (long long)g.numel,
                          (int)g.ndim, a.in);
            goto done;
        }
    }
    bool per_channel = a.qp.have_axis;
    int64_t ch = 1;
    if (per_channel) {
        if (a.qp.axis >= x.ndim || a.qp.axis < -x.ndim) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--axis %d is out of range for '%s' with %d "
                          "dimensions", (int)a.qp.axis, a.in, (int)x.ndim);
            goto done;
        }
        ch = x.shape[a.qp.axis < 0 ? a.qp.axis + x.ndim : a.qp.axis];
        if ((rc = cli_read_f32(cmd, a.qp.scales_path, &sa)))
            goto done;
        if (sa.ndim != 1 || sa.numel != ch) {
            rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': expected a 1-D array of %lld scales, got "
                          "%d dimensions and %lld elements", a.qp.scales_path, (long long)ch,
                          (int)sa.ndim, (long long)sa.numel);
            goto done;
        }
    }
    size_t fsz = (size_t)x.numel * sizeof(float);
    y = malloc(fsz);
    gx = malloc(fsz);
    zp = malloc((size_t)ch * sizeof *zp);
    zpi = malloc((size_t)ch * sizeof *zpi);
    gs = malloc((size_t)ch * sizeof *gs);
    gz = malloc((size_t)ch * sizeof *gz);
    if (!y || !gx || !zp || !zpi || !gs || !gz) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory for %lld elements",
                      (long long)x.numel);
        goto done;
    }
    const float *scales = per_channel ? (const float *)sa.data : &a.qp.scale;
    if (per_channel) {
        if ((rc = read_zero_points(cmd, &a, ch, zp)))
            goto done;
    } else {
        zp[0] = (float)a.qp.zero_point;
    }
    for (int64_t c = 0; c < ch; c++)
        zpi[c] = (int32_t)zp[c];
    /* The qparams value: dtype = the narrowest type holding [quant-min, quant-max]. */
    qcal_qparams qp;
    memset(&qp, 0, sizeof qp);
    qp.dtype = a.fp8                              ? a.dtype
               : a.qmin >= 0 && a.qmax <= 255     ? QCAL_QUINT8
               : a.qmin >= -128 && a.qmax <= 127 ? QCAL_QINT8
                                                 : QCAL_QINT32;
    qp.quant_min = a.qmin;
    qp.quant_max = a.qmax;
    if (per_channel) {
        qp.qscheme = QCAL_PER_CHANNEL_AFFINE;
        qp.axis = a.qp.axis;
        qp.channels = ch;
        qp.scales = scales;
        qp.zero_points = zpi;
        qp.zero_points_float = zp;
    } else {
        qp.qscheme = QCAL_PER_TENSOR_AFFINE;
        qp.channels = 1;
        qp.scale = a.qp.scale;
        qp.zero_point = zpi[0];
        qp.zero_point_float = zp[0];
    }
    qcal_tensor gyt = t;
    gyt.data = g.data;
    qcal_tensor_mut yt, gxt;
    qcal_tensor_mut_init(&yt, y, t.ndim, t.shape);    /* t's shape was checked: cannot fail */
    qcal_tensor_mut_init(&gxt, gx, t.ndim, t.shape);
    const qcal_tensor *gyv = g.data ? &gyt : NULL;
    qcal_status st;
    if (a.learnable) {
        st = qcal_fakequant_learnable_forward(&t, &qp, &yt, NULL);
        if (st == QCAL_OK)
            st = qcal_fakequant_learnable_backward(&t, gyv, &qp, a.grad_factor, &gxt, gs, gz);
    } else if (a.grad) {
        st = qcal_fakequant_fused(&t, gyv, &qp, &yt, &gxt);
    } else {
        st = qcal_fakequant_forward(&t, &qp, &yt, NULL);
    }
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_FAKEQUANT),
                             st);
        goto done;
    }
    /* Both outputs staged (written and flushed), then renamed: all or none. */
    if ((rc = stage_npy(cmd, &staged, a.out, x.ndim, x.shape, y)))
        goto done;
    if (a.grad_out && (rc = stage_npy(cmd, &staged, a.grad_out, x.ndim, x.shape, gx)))
        goto done;
    if ((rc = cli_stage_commit(cmd, &staged)))
        goto done;
    if (a.learnable) {
        /* With an output on stdout (-o -), the gradients' JSON goes to stderr. */
        FILE *say = cli_output_is_stdout(a.out) || cli_output_is_stdout(a.grad_out) ? stderr
                                                                                   : stdout;
        fputs("{\"grad_scale\": ", say);
        cli_json_f32_array(say, gs, ch);
        fputs(", \"grad_zero_point\": ", say);
        cli_json_f32_array(say, gz, ch);
        fputs("}\n", say);
    }
    rc = QCAL_EXIT_OK;
done:
    cli_stage_abort(&staged);
    qcal_npy_array_free(&x);
    qcal_npy_array_free(&g);
    qcal_npy_array_free(&sa);
    free(y); free(gx); free(zp); free(zpi); free(gs); free(gz);
    return rc;
}
