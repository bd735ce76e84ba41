/* ort.fp8: qcal's FP8 quantize / dequantize / fake-quant against ONNX Runtime 1.30's
 * QuantizeLinear / DequantizeLinear (opset 19, float8e4m3fn / float8e5m2 zero-points,
 * saturate=1, CPU provider, from npm: ./run.sh test installs onnxruntime-node into
 * $QCAL_NPM_DIR), bit for bit, per tensor and per channel (axes 0, 1, 2).
 *
 * The models are built with qcal's ONNX builder (element types by number: FLOAT8E4M3FN 17,
 * FLOAT8E5M2 19) and run by tests/ort_run.js; data goes both ways as .npy. Each model
 * returns y = DQ(Q(x, s), s) and c = DQ(Q(x, s), 1) (the code's exact value: ORT's node
 * API has no float8 tensors); qcal must give the bits of y with qcal_quantize +
 * qcal_dequantize and with qcal_fakequant_forward, and of c with its codes dequantized at
 * scale 1 (c identifies the code, except that E5M2's three NaN codes of a sign decode
 * alike: both sides write 0x7F / 0xFF for NaN). A third model dequantizes all 256 codes.
 * Per format: 8 scales x 1.5M values (powers of two, where the ties below are exact, and
 * others, where they are within an ulp or two), values: random float32 bit patterns (every
 * exponent, NaN payloads, float32 subnormals), every grid value and its neighbouring ulps,
 * the midpoints of neighbouring grid values (every rounding tie, subnormals included, the
 * one above the largest value), log-uniform magnitudes across the format's range and
 * beyond, and +-0, +-Inf, NaNs, FLT_MAX, the saturation boundaries; per channel 3 x 1M
 * more. Then qcal_onnx_qdq (what `qcal qdq` runs) on a Conv + Relu model of opset 19 with an
 * FP8 table, profiles ort and tensorrt: ONNX Runtime runs the result, every output value is
 * close to the float model's, and with profile ort on the FP8 grid of the output scale (its
 * own fake-quant, bit for bit); a model of opset 13 is refused. Then (qdq_levels) a CNN of
 * Conv+Relu, MaxPool, Add, Flatten, Gemm, MatMul with an FP8 table, profile ort, at every
 * graph optimization level: ORT loads and runs it, its optimized graph keeps every Q/DQ and
 * has no integer QDQ kernel, outputs within one FP8 step of the unoptimized run. Exit 77
 * (skipped) without node or onnxruntime-node. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <qcal/calib.h>
#include <qcal/fakequant.h>
#include <qcal/npy.h>
#include <qcal/onnx.h>
#include <qcal/qparams.h>
#include <qcal/quantize.h>

#define ONNX_F8E4M3FN 17
#define ONNX_F8E5M2 19

static char g_dir[256], g_npm[1024], g_script[1024];
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static long long g_values, g_failures;

static uint32_t rnd(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 32);
}

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Magnitude of the format's code c (0..0x7E / 0x7B): the grid. */
static double grid(int c, bool e4)
{
    int mb = e4 ? 3 : 2, bias = e4 ? 7 : 15, e = c >> mb, m = c & ((1 << mb) - 1);
    return e == 0 ? ldexp(m, 1 - bias - mb) : ldexp((1 << mb) + m, e - bias - mb);
}

static float nudge(float x, int ulps)
{
    for (; ulps > 0; ulps--)
        x = nextafterf(x, INFINITY);
    for (; ulps < 0; ulps++)
        x = nextafterf(x, -INFINITY);
    return x;
}

/* One test value for scale s (see the header). */
static float gen_one(float s, bool e4)
{
    const int maxc = e4 ? 0x7E : 0x7B;
    float sign = (rnd() & 1) ? -1.0f : 1.0f;
    switch (rnd() % 6) {
    case 0:
    case 1:
        return fbits(rnd());
    case 2: /* a grid value and its neighbours */
        return nudge(sign * (float)grid((int)(rnd() % (uint32_t)(maxc + 1)), e4) * s,
                     (int)(rnd() % 5) - 2);
    case 3: { /* a tie: the midpoint of grid values k, k+1 (k = maxc: the one above max) */
        int k = (int)(rnd() % (uint32_t)(maxc + 1));
        double a = grid(k, e4);
        double b = k < maxc ? grid(k + 1, e4) : a + (a - grid(k - 1, e4));
        int d = (int)(rnd() % 6);
        return nudge(sign * (float)((a + b) / 2) * s, d == 4 ? 1 : d == 5 ? -1 : 0);
    }
    case 4: { /* log-uniform across the range and beyond */
        int lo = e4 ? -14 : -22, span = e4 ? 28 : 42;
        return sign * ldexpf(1.0f + (float)(rnd() >> 8) * 0x1p-24f, lo + (int)(rnd() % (uint32_t)span)) * s;
    }
    default: {
        static const float fixed[] = { 0.0f, INFINITY, NAN, FLT_MAX, FLT_MIN, 0x1p-149f,
                                       448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f,
                                       0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1p-14f, 0x1p-16f, 0x1p-17f };
        uint32_t k = rnd() % (sizeof fixed / sizeof fixed[0]);
        float v = fixed[k];
        if (k >= 6)
            v = nudge(v * s, (int)(rnd() % 3) - 1);
        if (k == 2 && (rnd() & 1))
            v = fbits(0x7F800000u | (rnd() & 0x7FFFFFu) | 1u);   /* payloads, signalling */
        return sign * v == sign * v ? sign * v : (sign < 0 ? -v : v);
    }
    }
}

static int run_node(const char *model, const char *prefix, const char *feeds)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "node '%s' '%s' '%s' '%s' %s", g_script, g_npm, model, prefix,
             feeds);
    int rc = system(cmd);
    if (rc == -1)
        return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int check(qcal_status st, const char *what)
{
    if (st < 0) {
        fprintf(stderr, "test_fp8_ort: %s: %s\n", what, qcal_last_error());
        exit(1);
    }
    return 0;
}

static float *read_f32(const char *path, int64_t n)
{
    qcal_npy_array a;
    check(qcal_npy_read(path, &a), path);
    if (a.dtype != QCAL_NPY_F32 || a.numel != n) {
        fprintf(stderr, "test_fp8_ort: %s: %lld elements, expected %lld\n", path,
                (long long)a.numel, (long long)n);
        exit(1);
    }
    return a.data;   /* 64-byte aligned qcal allocation: qcal_free */
}

/* Compares n floats bit for bit; prints the first difference and counts the failure. */
static void compare(const char *what, const float *x, const float *got, const float *want,
                    int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (ubits(got[i]) != ubits(want[i])) {
            fprintf(stderr, "FAIL %s: element %lld of %lld: qcal %a (0x%08x), ONNX Runtime %a "
                    "(0x%08x), x = %a (0x%08x)\n", what, (long long)i, (long long)n,
                    (double)got[i], ubits(got[i]), (double)want[i], ubits(want[i]),
                    x ? (double)x[i] : 0.0, x ? ubits(x[i]) : 0u);
            g_failures++;
            return;
        }
}

/* Model: y = DQ(Q(x, s, zp), s, zp), c = DQ(Q(x, s, zp), one, zp); per channel along
 * `axis` of x (ndim 3) when channels > 0, s then an input of `channels` values. */
static void build_qdq(const char *path, int32_t et, int32_t ndim, const int64_t *dims,
                      int64_t channels, int axis)
{
    qcal_onnx_model *m = NULL;
    check(qcal_onnx_model_create(9, 19, &m), "model");
    int64_t cdim[1] = { channels > 0 ? channels : 1 };
    int32_t sdim = channels > 0 ? 1 : 0;
    check(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, ndim, dims), "input");
    check(qcal_onnx_model_add_input(m, "s", QCAL_ONNX_FLOAT, sdim, cdim), "input");
    uint8_t zeros[4096] = { 0 };
    float ones[4096];
    for (int i = 0; i < 4096; i++)
        ones[i] = 1.0f;
    check(qcal_onnx_model_add_initializer(m, "zp", et, sdim, cdim, zeros, (size_t)cdim[0]), "zp");
    check(qcal_onnx_model_add_initializer_float(m, "one", sdim, cdim, ones), "one");
    int64_t k;
    check(qcal_onnx_model_add_node(m, "QuantizeLinear", "q", 3, (const char *[]){ "x", "s", "zp" }, 1,
                                   (const char *[]){ "q" }, &k), "node");
    if (channels > 0)
        check(qcal_onnx_node_set_int(m, k, "axis", axis), "axis");
    check(qcal_onnx_model_add_node(m, "DequantizeLinear", "dq", 3, (const char *[]){ "q", "s", "zp" },
                                   1, (const char *[]){ "y" }, &k), "node");
    if (channels > 0)
        check(qcal_onnx_node_set_int(m, k, "axis", axis), "axis");
    check(qcal_onnx_model_add_node(m, "DequantizeLinear", "dq1", 3,
                                   (const char *[]){ "q", "one", "zp" }, 1, (const char *[]){ "c" }, &k),
          "node");
    if (channels > 0)
        check(qcal_onnx_node_set_int(m, k, "axis", axis), "axis");
    check(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, ndim, dims), "output");
    check(qcal_onnx_model_add_output(m, "c", QCAL_ONNX_FLOAT, ndim, dims), "output");
    check(qcal_onnx_model_save_file(m, NULL, path), path);
    qcal_onnx_model_destroy(&m);
}

/* One run: x (shape dims) with scales (1 per tensor, or dims[axis] per channel). */
static int one_run(const char *model, qcal_dtype dt, const char *tag, int32_t ndim,
                   const int64_t *dims, float *x, const float *scales, int64_t channels,
                   int axis)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= dims[i];
    char xp[512], sp[512], pre[512], yp[600], cp[600], feeds[1200];
    snprintf(xp, sizeof xp, "%s/x.npy", g_dir);
    snprintf(sp, sizeof sp, "%s/s.npy", g_dir);
    snprintf(pre, sizeof pre, "%s/out_", g_dir);
    snprintf(yp, sizeof yp, "%sy.npy", pre);
    snprintf(cp, sizeof cp, "%sc.npy", pre);
    int64_t cd[1] = { channels };
    check(qcal_npy_write(xp, QCAL_NPY_F32, ndim, dims, x), xp);
    check(qcal_npy_write(sp, QCAL_NPY_F32, channels > 0 ? 1 : 0, cd, scales), sp);
    snprintf(feeds, sizeof feeds, "'x=%s' 's=%s'", xp, sp);
    int rc = run_node(model, pre, feeds);
    if (rc != 0)
        return rc;
    float *y = read_f32(yp, n), *c = read_f32(cp, n);
    qcal_qparams qp;
    int32_t zps[4096] = { 0 };
    float ones[4096];
    for (int i = 0; i < 4096; i++)
        ones[i] = 1.0f;
    if (channels > 0)
        check(qcal_qparams_per_channel(&qp, dt, axis, channels, scales, zps), "qparams");
    else
        check(qcal_qparams_per_tensor(&qp, dt, scales[0], 0), "qparams");
    qcal_tensor t;
    qcal_tensor_init(&t, x, ndim, dims);
    uint8_t *codes = malloc((size_t)n);
    float *yq = malloc((size_t)n * 4), *yf = malloc((size_t)n * 4), *cq = malloc((size_t)n * 4);
    if (!codes || !yq || !yf || !cq) {
        fprintf(stderr, "test_fp8_ort: out of memory\n");
        exit(1);
    }
    qcal_tensor_mut ty, tf, tc;
    qcal_tensor_mut_init(&ty, yq, ndim, dims);
    qcal_tensor_mut_init(&tf, yf, ndim, dims);
    qcal_tensor_mut_init(&tc, cq, ndim, dims);
    check(qcal_quantize(&t, &qp, codes), "quantize");
    check(qcal_dequantize(codes, &qp, &ty), "dequantize");
    check(qcal_fakequant_forward(&t, &qp, &tf, NULL), "fakequant");
    qcal_qparams q1 = qp;
    if (channels > 0)
        q1.scales = ones;
    else
        q1.scale = 1.0f;
    check(qcal_dequantize(codes, &q1, &tc), "dequantize at scale 1");
    char what[256];
    snprintf(what, sizeof what, "%s codes (value at scale 1)", tag);
    compare(what, x, cq, c, n);
    snprintf(what, sizeof what, "%s quantize + dequantize", tag);
    compare(what, x, yq, y, n);
    snprintf(what, sizeof what, "%s fakequant forward", tag);
    compare(what, x, yf, y, n);
    g_values += n;
    free(codes);
    free(yq);
    free(yf);
    free(cq);
    qcal_free(y);
    qcal_free(c);
    unlink(xp);
    unlink(sp);
    unlink(yp);
    unlink(cp);
    return 0;
}

/* All 256 codes dequantized at several scales (the codes an initializer). */
static int all_codes(int32_t et, qcal_dtype dt, const char *fmt)
{
    char model[512], sp[512], pre[512], dp[600], feeds[700];
    snprintf(model, sizeof model, "%s/dq_%s.onnx", g_dir, fmt);
    qcal_onnx_model *m = NULL;
    check(qcal_onnx_model_create(9, 19, &m), "model");
    uint8_t codes[256], zero = 0;
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    int64_t d256[1] = { 256 };
    check(qcal_onnx_model_add_input(m, "s", QCAL_ONNX_FLOAT, 0, NULL), "input");
    check(qcal_onnx_model_add_initializer(m, "codes", et, 1, d256, codes, 256), "codes");
    check(qcal_onnx_model_add_initializer(m, "zp", et, 0, NULL, &zero, 1), "zp");
    check(qcal_onnx_model_add_node(m, "DequantizeLinear", "dq", 3,
                                   (const char *[]){ "codes", "s", "zp" }, 1, (const char *[]){ "d" },
                                   NULL), "node");
    check(qcal_onnx_model_add_output(m, "d", QCAL_ONNX_FLOAT, 1, d256), "output");
    check(qcal_onnx_model_save_file(m, NULL, model), model);
    qcal_onnx_model_destroy(&m);
    static const float scales[] = { 1.0f, 0x1p-20f, 0.0123f, 3.0f / 448.0f, 1e30f, 1e-38f };
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        snprintf(sp, sizeof sp, "%s/s.npy", g_dir);
        snprintf(pre, sizeof pre, "%s/out_", g_dir);
        snprintf(dp, sizeof dp, "%sd.npy", pre);
        check(qcal_npy_write(sp, QCAL_NPY_F32, 0, NULL, &scales[k]), sp);
        snprintf(feeds, sizeof feeds, "'s=%s'", sp);
        int rc = run_node(model, pre, feeds);
        if (rc != 0)
            return rc;
        float *d = read_f32(dp, 256), mine[256];
        qcal_qparams qp;
        check(qcal_qparams_per_tensor(&qp, dt, scales[k], 0), "qparams");
        qcal_tensor_mut t;
        qcal_tensor_mut_init(&t, mine, 1, d256);
        check(qcal_dequantize(codes, &qp, &t), "dequantize");
        char what[128];
        snprintf(what, sizeof what, "%s dequantize of all 256 codes, scale %g", fmt,
                 (double)scales[k]);
        compare(what, NULL, mine, d, 256);
        qcal_free(d);
        unlink(dp);
        unlink(sp);
    }
    unlink(model);
    return 0;
}

static int run_format(int32_t et, qcal_dtype dt, const char *fmt)
{
    const bool e4 = dt == QCAL_FLOAT8_E4M3FN;
    int rc = all_codes(et, dt, fmt);
    if (rc)
        return rc;
    /* per tensor */
    char model[512], tag[128];
    snprintf(model, sizeof model, "%s/qdq_%s.onnx", g_dir, fmt);
    const int64_t n = 1500000;
    int64_t d1[1] = { n };
    build_qdq(model, et, 1, d1, 0, 0);
    float *x = malloc((size_t)n * 4);
    static const float scales[] = { 1.0f, 0x1p-9f, 0x1p7f, 0.0123f, 3.0f / 448.0f,
                                    3.14159265e-3f, 1e-25f, 7.5e25f };
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        for (int64_t i = 0; i < n; i++)
            x[i] = gen_one(scales[k], e4);
        snprintf(tag, sizeof tag, "%s per tensor, scale %a", fmt, (double)scales[k]);
        if ((rc = one_run(model, dt, tag, 1, d1, x, &scales[k], 0, 0)) != 0)
            break;
    }
    free(x);
    unlink(model);
    if (rc)
        return rc;
    /* per channel, axes 0, 1, 2 of a 3-D tensor with 48 channels */
    for (int axis = 0; axis < 3 && !rc; axis++) {
        int64_t dims[3] = { 64, 160, 100 };
        dims[axis] = 48;
        int64_t nn = dims[0] * dims[1] * dims[2], inner = 1;
        for (int a = axis + 1; a < 3; a++)
            inner *= dims[a];
        float sc[48];
        for (int c = 0; c < 48; c++)
            sc[c] = c % 3 == 0 ? ldexpf(1.0f, (int)(rnd() % 20) - 10)
                               : (float)(rnd() % 100000 + 1) * 1e-6f;
        snprintf(model, sizeof model, "%s/qdq_%s_axis%d.onnx", g_dir, fmt, axis);
        build_qdq(model, et, 3, dims, 48, axis);
        x = malloc((size_t)nn * 4);
        for (int64_t i = 0; i < nn; i++)
            x[i] = gen_one(sc[(i / inner) % 48], e4);
        snprintf(tag, sizeof tag, "%s per channel, axis %d", fmt, axis);
        rc = one_run(model, dt, tag, 3, dims, x, sc, 48, axis);
        free(x);
        unlink(model);
    }
    return rc;
}

/* Conv (4 filters 3x3, bias) + Relu on x [2, 3, 8, 8], opset `opset`. */
static qcal_onnx_model *conv_model(int64_t opset)
{
    qcal_onnx_model *m = NULL;
    check(qcal_onnx_model_create(opset >= 19 ? 9 : 8, opset, &m), "model");
    int64_t xd[4] = { 2, 3, 8, 8 }, wd[4] = { 4, 3, 3, 3 }, bd[1] = { 4 }, yd[4] = { 2, 4, 6, 6 };
    float w[108], b[4];
    for (int i = 0; i < 108; i++)
        w[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f * (1.0f + (float)(i / 27));
    for (int i = 0; i < 4; i++)
        b[i] = (float)i * 0.1f - 0.15f;
    check(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, xd), "input");
    check(qcal_onnx_model_add_initializer_float(m, "w", 4, wd, w), "w");
    check(qcal_onnx_model_add_initializer_float(m, "b", 1, bd, b), "b");
    check(qcal_onnx_model_add_node(m, "Conv", "conv", 3, (const char *[]){ "x", "w", "b" }, 1,
                                   (const char *[]){ "c" }, NULL), "conv");
    check(qcal_onnx_model_add_node(m, "Relu", "relu", 1, (const char *[]){ "c" }, 1,
                                   (const char *[]){ "r" }, NULL), "relu");
    check(qcal_onnx_model_add_output(m, "r", QCAL_ONNX_FLOAT, 4, yd), "output");
    return m;
}

/* qcal_onnx_qdq with an FP8 table: ORT runs the model; outputs on the FP8 grid. */
static int qdq_model(qcal_dtype dt, qcal_onnx_profile prof)
{
    const char *fmt = qcal_dtype_name(dt), *pname = qcal_onnx_profile_name(prof);
    char fm[512], qm[512], xp[512], pre[512], rp[600], feeds[700], tag[128];
    snprintf(fm, sizeof fm, "%s/conv.onnx", g_dir);
    snprintf(qm, sizeof qm, "%s/conv_qdq.onnx", g_dir);
    snprintf(xp, sizeof xp, "%s/x.npy", g_dir);
    snprintf(pre, sizeof pre, "%s/out_", g_dir);
    snprintf(rp, sizeof rp, "%sr.npy", pre);
    qcal_onnx_model *m = conv_model(19);
    check(qcal_onnx_model_save_file(m, NULL, fm), fm);
    int64_t xd[4] = { 2, 3, 8, 8 }, n = 384, yn = 288;
    float x[384];
    for (int i = 0; i < 384; i++)
        x[i] = (float)((int)(rnd() % 20001) - 10000) * 3e-4f;
    check(qcal_npy_write(xp, QCAL_NPY_F32, 4, xd, x), xp);
    snprintf(feeds, sizeof feeds, "'x=%s'", xp);
    int rc = run_node(fm, pre, feeds);
    if (rc)
        return rc;
    float *rf = read_f32(rp, yn);
    /* the table: x and r observed (minmax, FP8) */
    qcal_calib_rules *rules = NULL;
    check(qcal_calib_rules_create(&rules), "rules");
    qcal_observer_config oc;
    qcal_observer_config_default(&oc, QCAL_OBSERVER_MINMAX);
    oc.q.dtype = dt;
    check(qcal_calib_rules_add(rules, "*", true, QCAL_CALIB_ROLE_ACTIVATION, &oc), "rule");
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *ss = NULL;
    check(qcal_calib_session_create(&so, &ss), "session");
    qcal_tensor tx, tr;
    int64_t yd[4] = { 2, 4, 6, 6 };
    qcal_tensor_init(&tx, x, 4, xd);
    qcal_tensor_init(&tr, rf, 4, yd);
    check(qcal_calib_session_observe(ss, "x", QCAL_CALIB_ROLE_ACTIVATION, 0, &tx), "observe");
    check(qcal_calib_session_observe(ss, "r", QCAL_CALIB_ROLE_ACTIVATION, 0, &tr), "observe");
    qcal_calib_table *t = NULL;
    check(qcal_calib_session_table(ss, &t), "table");
    const qcal_calib_entry *er = NULL;
    check(qcal_calib_table_find(t, "r", QCAL_CALIB_ROLE_ACTIVATION, &er), "find");
    float s_r = er->qparams.scale;
    qcal_onnx_qdq_options qo;
    qcal_onnx_qdq_options_default(&qo);
    qo.profile = prof;
    check(qcal_onnx_qdq(m, t, &qo, NULL), "qdq");
    check(qcal_onnx_model_save_file(m, NULL, qm), qm);
    qcal_onnx_model_destroy(&m);
    /* the same table on an opset-13 model: refused */
    qcal_onnx_model *m13 = conv_model(13);
    qcal_status st13 = qcal_onnx_qdq(m13, t, &qo, NULL);
    if (st13 != QCAL_ERR_UNSUPPORTED || !strstr(qcal_last_error(), "opset >= 19")) {
        fprintf(stderr, "FAIL %s %s: an opset-13 model gave %d (%s)\n", fmt, pname, (int)st13,
                qcal_last_error());
        g_failures++;
    }
    qcal_onnx_model_destroy(&m13);
    /* the written model holds FP8 Q/DQ and reads back */
    qcal_onnx_model *back = NULL;
    check(qcal_onnx_model_load_file(qm, &back), "load the Q/DQ model");
    qcal_onnx_model_info info;
    check(qcal_onnx_model_get_info(back, &info), "info");
    int64_t nq = 0, ndq = 0;
    for (int64_t i = 0; i < info.nodes; i++) {
        qcal_onnx_node_info ni;
        check(qcal_onnx_node_at(back, i, &ni), "node");
        nq += !strcmp(ni.op_type, "QuantizeLinear");
        ndq += !strcmp(ni.op_type, "DequantizeLinear");
    }
    qcal_onnx_tensor_desc zd;
    bool fp8_zp = qcal_onnx_tensor_get_desc(back, "x_zero_point", &zd) == QCAL_OK &&
                  zd.elem_type == (dt == QCAL_FLOAT8_E4M3FN ? ONNX_F8E4M3FN : ONNX_F8E5M2);
    /* ort: Q/DQ of x and of the output, DQ of the FP8 weight (bias stays float);
     * tensorrt: Q/DQ of x and of the float weight (the output is the next op's input) */
    bool trt = prof == QCAL_ONNX_PROFILE_TENSORRT;
    if (nq != 2 || ndq != (trt ? 2 : 3) || !fp8_zp || info.ir_version < 9) {
        fprintf(stderr, "FAIL %s %s: %lld Q and %lld DQ nodes, x_zero_point FP8 %d, IR %lld\n",
                fmt, pname, (long long)nq, (long long)ndq, (int)fp8_zp, (long long)info.ir_version);
        g_failures++;
    }
    qcal_onnx_model_destroy(&back);
    unlink(rp);
    rc = run_node(qm, pre, feeds);
    if (rc)
        return rc;
    float *rq = read_f32(rp, yn), *g = malloc((size_t)yn * 4);
    qcal_qparams qp;
    check(qcal_qparams_per_tensor(&qp, dt, s_r, 0), "qparams");
    qcal_tensor tq;
    qcal_tensor_mut tg;
    qcal_tensor_init(&tq, rq, 4, yd);
    qcal_tensor_mut_init(&tg, g, 4, yd);
    check(qcal_fakequant_forward(&tq, &qp, &tg, NULL), "fakequant");
    snprintf(tag, sizeof tag, "qdq %s profile %s: output on the FP8 grid", fmt, pname);
    if (!trt)
        compare(tag, NULL, g, rq, yn);
    double num = 0, den = 0;
    for (int64_t i = 0; i < yn; i++) {
        num += (double)rf[i] * rf[i];
        den += ((double)rf[i] - rq[i]) * ((double)rf[i] - rq[i]);
    }
    double sqnr = 10 * log10(num / (den > 0 ? den : 1e-300));
    printf("qdq %s profile %s: ONNX Runtime ran it; %lld Q, %lld DQ; output SQNR vs float "
           "%.2f dB\n", fmt, pname, (long long)nq, (long long)ndq, sqnr);
    if (!(sqnr > (dt == QCAL_FLOAT8_E4M3FN ? 20.0 : 14.0))) {
        fprintf(stderr, "FAIL qdq %s %s: SQNR %.2f dB vs the float model\n", fmt, pname, sqnr);
        g_failures++;
    }
    (void)n;
    free(g);
    qcal_free(rq);
    qcal_free(rf);
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&ss);
    qcal_calib_rules_destroy(&rules);
    unlink(fm);
    unlink(qm);
    unlink(xp);
    unlink(rp);
    return 0;
}

/* A small CNN of every kind of node unit ONNX Runtime's QDQ optimizer rewrites: Conv + Relu
 * twice, MaxPool, Add, Flatten, Gemm, MatMul; x [4, 3, 10, 10] -> y [4, 6]. With expose, the
 * activations between them are graph outputs too (to calibrate them). */
static const char *const lv_acts[] = { "x", "r1", "r2", "p", "a", "f", "g", "y" };

static qcal_onnx_model *levels_model(bool expose)
{
    uint64_t keep = g_rng;
    g_rng = 0x5EED5EED12345ull;
    qcal_onnx_model *m = NULL;
    check(qcal_onnx_model_create(9, 19, &m), "model");
    int64_t xd[4] = { 4, 3, 10, 10 }, w1d[4] = { 8, 3, 3, 3 }, w2d[4] = { 8, 8, 3, 3 }, bd[1] = { 8 },
            wgd[2] = { 200, 10 }, bgd[1] = { 10 }, wmd[2] = { 10, 6 }, yd[2] = { 4, 6 };
    static float w1[216], w2[576], b1[8], b2[8], wg[2000], bg[10], wm[60];
    struct { float *v; int n; float a; } fill[] = { { w1, 216, 0.3f }, { w2, 576, 0.15f }, { b1, 8, 0.1f },
        { b2, 8, 0.1f }, { wg, 2000, 0.08f }, { bg, 10, 0.1f }, { wm, 60, 0.3f } };
    for (size_t k = 0; k < sizeof fill / sizeof fill[0]; k++)
        for (int i = 0; i < fill[k].n; i++)
            fill[k].v[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f * fill[k].a;
    g_rng = keep;
    check(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, xd), "input");
    check(qcal_onnx_model_add_initializer_float(m, "w1", 4, w1d, w1), "w1");
    check(qcal_onnx_model_add_initializer_float(m, "b1", 1, bd, b1), "b1");
    check(qcal_onnx_model_add_initializer_float(m, "w2", 4, w2d, w2), "w2");
    check(qcal_onnx_model_add_initializer_float(m, "b2", 1, bd, b2), "b2");
    check(qcal_onnx_model_add_initializer_float(m, "wg", 2, wgd, wg), "wg");
    check(qcal_onnx_model_add_initializer_float(m, "bg", 1, bgd, bg), "bg");
    check(qcal_onnx_model_add_initializer_float(m, "wm", 2, wmd, wm), "wm");
    int64_t i1, i2, ip;
    const int64_t pads[4] = { 1, 1, 1, 1 }, k2[2] = { 2, 2 };
    check(qcal_onnx_model_add_node(m, "Conv", "conv1", 3, (const char *[]){ "x", "w1", "b1" }, 1,
                                   (const char *[]){ "c1" }, &i1), "conv1");
    check(qcal_onnx_node_set_ints(m, i1, "pads", 4, pads), "pads");
    check(qcal_onnx_model_add_node(m, "Relu", "relu1", 1, (const char *[]){ "c1" }, 1,
                                   (const char *[]){ "r1" }, NULL), "relu1");
    check(qcal_onnx_model_add_node(m, "Conv", "conv2", 3, (const char *[]){ "r1", "w2", "b2" }, 1,
                                   (const char *[]){ "c2" }, &i2), "conv2");
    check(qcal_onnx_node_set_ints(m, i2, "pads", 4, pads), "pads");
    check(qcal_onnx_model_add_node(m, "Relu", "relu2", 1, (const char *[]){ "c2" }, 1,
                                   (const char *[]){ "r2" }, NULL), "relu2");
    check(qcal_onnx_model_add_node(m, "MaxPool", "pool", 1, (const char *[]){ "r2" }, 1,
                                   (const char *[]){ "p" }, &ip), "pool");
    check(qcal_onnx_node_set_ints(m, ip, "kernel_shape", 2, k2), "kernel");
    check(qcal_onnx_node_set_ints(m, ip, "strides", 2, k2), "strides");
    check(qcal_onnx_model_add_node(m, "Add", "add", 2, (const char *[]){ "p", "p" }, 1,
                                   (const char *[]){ "a" }, NULL), "add");
    check(qcal_onnx_model_add_node(m, "Flatten", "flatten", 1, (const char *[]){ "a" }, 1,
                                   (const char *[]){ "f" }, NULL), "flatten");
    check(qcal_onnx_model_add_node(m, "Gemm", "fc", 3, (const char *[]){ "f", "wg", "bg" }, 1,
                                   (const char *[]){ "g" }, NULL), "gemm");
    check(qcal_onnx_model_add_node(m, "MatMul", "fc2", 2, (const char *[]){ "g", "wm" }, 1,
                                   (const char *[]){ "y" }, NULL), "matmul");
    check(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, 2, yd), "output");
    if (expose) {
        const int64_t dims[6][4] = { { 4, 8, 10, 10 }, { 4, 8, 10, 10 }, { 4, 8, 5, 5 },
                                     { 4, 8, 5, 5 }, { 4, 200 }, { 4, 10 } };
        const int nd[6] = { 4, 4, 4, 4, 2, 2 };
        for (int k = 0; k < 6; k++)
            check(qcal_onnx_model_add_output(m, lv_acts[k + 1], QCAL_ONNX_FLOAT, nd[k], dims[k]), "output");
    }
    return m;
}

/* FP8 Q/DQ models of profile ort load and run in ONNX Runtime at every optimization level:
 * at "all" (ORT's default) the graph ORT optimized holds no integer QDQ kernel, keeps every
 * Q and DQ, and the outputs of every level equal the unoptimized run's within one FP8 step
 * (a float op ORT optimized, e.g. Conv + Relu fused, may sum in another order and move a
 * value across a rounding boundary of the output's Q: the neighbouring FP8 code, nothing
 * more). Measured: equal bit for bit. */
static int qdq_levels(qcal_dtype dt)
{
    const char *fmt = qcal_dtype_name(dt);
    char fm[512], qm[512], om[512], xp[512], pre[512], path[700], feeds[700];
    snprintf(fm, sizeof fm, "%s/lv.onnx", g_dir);
    snprintf(qm, sizeof qm, "%s/lv_qdq.onnx", g_dir);
    snprintf(om, sizeof om, "%s/lv_opt.onnx", g_dir);
    snprintf(xp, sizeof xp, "%s/lvx.npy", g_dir);
    snprintf(pre, sizeof pre, "%s/lv_", g_dir);
    int64_t xd[4] = { 4, 3, 10, 10 }, yn = 24;
    static float x[1200];
    for (int i = 0; i < 1200; i++)
        x[i] = (float)((int)(rnd() % 20001) - 10000) * 2e-4f;
    check(qcal_npy_write(xp, QCAL_NPY_F32, 4, xd, x), xp);
    snprintf(feeds, sizeof feeds, "'x=%s'", xp);
    qcal_onnx_model *m = levels_model(true);
    check(qcal_onnx_model_save_file(m, NULL, fm), fm);
    qcal_onnx_model_destroy(&m);
    int rc = run_node(fm, pre, feeds);
    if (rc)
        return rc;
    qcal_calib_rules *rules = NULL;
    check(qcal_calib_rules_create(&rules), "rules");
    qcal_observer_config oc;
    qcal_observer_config_default(&oc, QCAL_OBSERVER_MINMAX);
    oc.q.dtype = dt;
    check(qcal_calib_rules_add(rules, "*", true, QCAL_CALIB_ROLE_ACTIVATION, &oc), "rule");
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *ss = NULL;
    check(qcal_calib_session_create(&so, &ss), "session");
    for (size_t k = 0; k < sizeof lv_acts / sizeof lv_acts[0]; k++) {
        qcal_npy_array a;
        if (k)
            snprintf(path, sizeof path, "%s%s.npy", pre, lv_acts[k]);
        else
            snprintf(path, sizeof path, "%s", xp);
        check(qcal_npy_read(path, &a), path);
        qcal_tensor t;
        qcal_tensor_init(&t, a.data, a.ndim, a.shape);
        check(qcal_calib_session_observe(ss, lv_acts[k], QCAL_CALIB_ROLE_ACTIVATION, 0, &t), "observe");
        qcal_free(a.data);
        if (k)
            unlink(path);
    }
    qcal_calib_table *t = NULL;
    check(qcal_calib_session_table(ss, &t), "table");
    const qcal_calib_entry *ey = NULL;
    check(qcal_calib_table_find(t, "y", QCAL_CALIB_ROLE_ACTIVATION, &ey), "find");
    qcal_qparams qy;
    check(qcal_qparams_per_tensor(&qy, dt, ey->qparams.scale, 0), "qparams");
    m = levels_model(false);
    qcal_onnx_qdq_options qo;
    qcal_onnx_qdq_options_default(&qo);
    check(qcal_onnx_qdq(m, t, &qo, NULL), "qdq");
    check(qcal_onnx_model_save_file(m, NULL, qm), qm);
    qcal_onnx_model_destroy(&m);
    snprintf(path, sizeof path, "%sy.npy", pre);
    static const char *const levels[] = { "disabled", "basic", "extended", "all" };
    float *ref = NULL;
    uint8_t cref[24], cq[24];
    for (int l = 0; l < 4; l++) {
        char f2[1400];
        snprintf(f2, sizeof f2, "--level=%s --optimized='%s' %s", levels[l], om, feeds);
        unlink(path);
        rc = run_node(qm, pre, f2);
        if (rc) {
            fprintf(stderr, "FAIL qdq %s levels: ONNX Runtime refused or failed the FP8 Q/DQ model "
                    "at level %s (exit %d)\n", fmt, levels[l], rc);
            g_failures++;
            continue;
        }
        float *y = read_f32(path, yn);
        qcal_tensor ty;
        qcal_tensor_init(&ty, y, 2, (int64_t[]){ 4, 6 });
        check(qcal_quantize(&ty, &qy, l ? cq : cref), "quantize");
        int64_t diff = 0, far = 0;
        for (int64_t i = 0; l && i < yn; i++) {
            int a = cref[i] & 0x80 ? -(cref[i] & 0x7F) : cref[i];
            int b = cq[i] & 0x80 ? -(cq[i] & 0x7F) : cq[i];
            diff += ubits(y[i]) != ubits(ref[i]);
            far += abs(a - b) > 1;
        }
        if (far) {
            fprintf(stderr, "FAIL qdq %s level %s: %lld of %lld outputs more than one FP8 step from "
                    "the unoptimized run\n", fmt, levels[l], (long long)far, (long long)yn);
            g_failures++;
        }
        if (l)
            printf("qdq %s level %s: ran; %lld of %lld outputs differ from level disabled (bits), "
                   "none by more than one FP8 step\n", fmt, levels[l], (long long)diff, (long long)yn);
        if (!l)
            ref = y;
        else
            qcal_free(y);
        /* the graph ORT optimized: no integer kernel, every Q and DQ kept */
        qcal_onnx_model *o = NULL;
        check(qcal_onnx_model_load_file(om, &o), "load the optimized model");
        qcal_onnx_model_info info;
        check(qcal_onnx_model_get_info(o, &info), "info");
        int64_t nq = 0, ndq = 0, bad = 0;
        static const char *const integer_ops[] = { "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd",
            "QLinearMul", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
            "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearWhere", "QLinearReduceMean",
            "MatMulIntegerToFloat", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "MatMulNBits" };
        char ops[600] = "";
        for (int64_t i = 0; i < info.nodes; i++) {
            qcal_onnx_node_info ni;
            check(qcal_onnx_node_at(o, i, &ni), "node");
            nq += !strcmp(ni.op_type, "QuantizeLinear");
            ndq += !strcmp(ni.op_type, "DequantizeLinear");
            for (size_t k = 0; k < sizeof integer_ops / sizeof integer_ops[0]; k++)
                bad += !strcmp(ni.op_type, integer_ops[k]);
            if (!strstr(ops, ni.op_type) && strlen(ops) + strlen(ni.op_type) + 2 < sizeof ops) {
                strcat(ops, " ");
                strcat(ops, ni.op_type);
            }
        }
        /* 8 activations (Q + DQ each), 4 weights (DQ of the FP8 codes) */
        if (bad || nq != 8 || ndq != 12) {
            fprintf(stderr, "FAIL qdq %s level %s: the optimized graph has %lld integer QDQ kernels, "
                    "%lld Q and %lld DQ (want 0, 8, 12):%s\n", fmt, levels[l], (long long)bad,
                    (long long)nq, (long long)ndq, ops);
            g_failures++;
        } else if (l == 3) {
            printf("qdq %s level all: optimized op types:%s\n", fmt, ops);
        }
        qcal_onnx_model_destroy(&o);
        unlink(om);
    }
    qcal_free(ref);
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&ss);
    qcal_calib_rules_destroy(&rules);
    unlink(fm);
    unlink(qm);
    unlink(xp);
    unlink(path);
    return 0;
}

int main(void)
{
    const char *npm = getenv("QCAL_NPM_DIR"), *src = getenv("QCAL_SOURCE_ROOT");
    if (npm && *npm)
        snprintf(g_npm, sizeof g_npm, "%s", npm);
    else if (getenv("XDG_CACHE_HOME") && *getenv("XDG_CACHE_HOME"))
        snprintf(g_npm, sizeof g_npm, "%s/qcal/npm", getenv("XDG_CACHE_HOME"));
    else
        snprintf(g_npm, sizeof g_npm, "%s/.cache/qcal/npm", getenv("HOME") ? getenv("HOME") : "/root");
    char pkg[1200];
    snprintf(pkg, sizeof pkg, "%s/node_modules/onnxruntime-node/package.json", g_npm);
    if (!qcal_onnx_available()) {
        printf("skip: qcal built without ONNX support\n");
        return 77;
    }
    if (access(pkg, R_OK) != 0 || system("command -v node >/dev/null 2>&1") != 0) {
        printf("skip: node or onnxruntime-node (%s) missing (./run.sh test installs them)\n", g_npm);
        return 77;
    }
    snprintf(g_script, sizeof g_script, "%s/tests/ort_run.js", src ? src : ".");
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/qcal-fp8-ort-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        fprintf(stderr, "test_fp8_ort: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    int rc = run_format(ONNX_F8E4M3FN, QCAL_FLOAT8_E4M3FN, "float8_e4m3fn");
    if (!rc)
        rc = run_format(ONNX_F8E5M2, QCAL_FLOAT8_E5M2, "float8_e5m2");
    if (!rc)
        rc = qdq_model(QCAL_FLOAT8_E4M3FN, QCAL_ONNX_PROFILE_ORT);
    if (!rc)
        rc = qdq_model(QCAL_FLOAT8_E5M2, QCAL_ONNX_PROFILE_ORT);
    if (!rc)
        rc = qdq_model(QCAL_FLOAT8_E4M3FN, QCAL_ONNX_PROFILE_TENSORRT);
    if (!rc)
        rc = qdq_levels(QCAL_FLOAT8_E4M3FN);
    if (!rc)
        rc = qdq_levels(QCAL_FLOAT8_E5M2);
    rmdir(g_dir);
    if (rc == 77) {
        printf("skip: onnxruntime-node could not be loaded\n");
        return 77;
    }
    if (rc) {
        fprintf(stderr, "test_fp8_ort: ONNX Runtime run failed (exit %d)\n", rc);
        return 1;
    }
    printf("%lld values compared with ONNX Runtime, %lld failure(s)\n", g_values, g_failures);
    return g_failures ? 1 : 0;
}
