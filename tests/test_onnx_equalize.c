/* qcal_onnx_fold_bn and qcal_onnx_equalize on graphs written with the builder: BatchNorm
 * folding numbers, the float function of equalized random MLPs (a small Gemm/Relu evaluator
 * here), Clip replacement, and every refusal with its message naming the node. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <sys/stat.h>
#include <unistd.h>

#include "qcal/qcal.h"
#include "testutil.h"

#define OK(x) assert_int_equal((x), QCAL_OK)

static uint32_t rng = 77;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) / 8388608.0 - 1.0);
}

static void add_rand(qcal_onnx_model *m, const char *name, int32_t ndim, const int64_t *dims, float scale)
{
    int64_t n = 1;
    for (int32_t i = 0; i < ndim; i++)
        n *= dims[i];
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    OK(qcal_onnx_model_add_initializer_float(m, name, ndim, dims, v));
    free(v);
}

static void node(qcal_onnx_model *m, const char *op, const char *name, const char *in0, const char *in1,
                 const char *in2, const char *out, int64_t *idx)
{
    const char *in[3] = { in0, in1, in2 };
    int64_t n = in2 ? 3 : in1 ? 2 : 1;
    OK(qcal_onnx_model_add_node(m, op, name, n, in, 1, &out, idx));
}

/* ---- a random MLP: Gemm -> Relu -> Gemm -> Relu -> Gemm, evaluated here ---- */

typedef struct mlp {
    int64_t width[4];
    bool trans[3];
} mlp;

static qcal_onnx_model *mlp_build(const mlp *p)
{
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t din[2] = { -1, p->width[0] };
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, din));
    const char *in = "x";
    char names[3][4][16];
    for (int l = 0; l < 3; l++) {
        snprintf(names[l][0], 16, "W%d", l);
        snprintf(names[l][1], 16, "B%d", l);
        snprintf(names[l][2], 16, "g%d", l);
        snprintf(names[l][3], 16, "r%d", l);
        int64_t wd[2] = { p->trans[l] ? p->width[l + 1] : p->width[l], p->trans[l] ? p->width[l] : p->width[l + 1] };
        add_rand(m, names[l][0], 2, wd, 1.0f);
        add_rand(m, names[l][1], 1, &p->width[l + 1], 0.5f);
        // diverging output ranges
        float *w = NULL;
        qcal_onnx_tensor_desc d;
        OK(qcal_onnx_initializer_float(m, names[l][0], &w, &d));
        (void)w;
        qcal_free(w);
        int64_t idx;
        char gname[16];
        snprintf(gname, sizeof gname, "gemm%d", l);
        node(m, "Gemm", gname, in, names[l][0], names[l][1], l == 2 ? "y" : names[l][2], &idx);
        if (p->trans[l])
            OK(qcal_onnx_node_set_int(m, idx, "transB", 1));
        if (l < 2) {
            char rname[16];
            snprintf(rname, sizeof rname, "relu%d", l);
            node(m, "Relu", rname, names[l][2], NULL, NULL, names[l][3], NULL);
            in = names[l][3];
        }
    }
    int64_t dout[2] = { -1, p->width[3] };
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, 2, dout));
    return m;
}

static void mlp_eval(const qcal_onnx_model *m, const mlp *p, const double *x, double *y)
{
    double h[64], o[64];
    for (int64_t i = 0; i < p->width[0]; i++)
        h[i] = x[i];
    for (int l = 0; l < 3; l++) {
        char wn[8], bn[8];
        snprintf(wn, sizeof wn, "W%d", l);
        snprintf(bn, sizeof bn, "B%d", l);
        float *w = NULL, *b = NULL;
        qcal_onnx_tensor_desc d;
        OK(qcal_onnx_initializer_float(m, wn, &w, &d));
        OK(qcal_onnx_initializer_float(m, bn, &b, &d));
        int64_t ni = p->width[l], no = p->width[l + 1];
        for (int64_t j = 0; j < no; j++) {
            double acc = b[j];
            for (int64_t i = 0; i < ni; i++)
                acc += h[i] * (p->trans[l] ? w[j * ni + i] : w[i * no + j]);
            o[j] = l < 2 && acc < 0 ? 0 : acc;
        }
        memcpy(h, o, sizeof h);
        qcal_free(w);
        qcal_free(b);
    }
    memcpy(y, h, (size_t)p->width[3] * sizeof *y);
}

static void test_random_mlps(void **state)
{
    (void)state;
    for (int trial = 0; trial < 12; trial++) {
        mlp p;
        for (int i = 0; i < 4; i++)
            p.width[i] = 1 + (int64_t)((frand() + 1.0f) * 20.0f);
        for (int i = 0; i < 3; i++)
            p.trans[i] = frand() > 0;
        qcal_onnx_model *m = mlp_build(&p);
        double x[8][64], y0[8][64], y1[64];
        for (int s = 0; s < 8; s++) {
            for (int64_t i = 0; i < p.width[0]; i++)
                x[s][i] = frand() * 3;
            mlp_eval(m, &p, x[s], y0[s]);
        }
        qcal_onnx_equalize_options opt;
        qcal_onnx_equalize_options_default(&opt);
        qcal_onnx_equalize_report rep;
        OK(qcal_onnx_equalize(m, &opt, &rep));
        assert_int_equal(rep.n_pairs, 2);
        assert_int_equal(rep.n_refused, 0);
        assert_string_equal(rep.pairs[0], "gemm0 -> relu0 -> gemm1");
        assert_true(rep.sweeps >= 1 && rep.sweeps <= 100);
        assert_int_equal(rep.n_layers, 3);
        double worst = 0, scale = 1e-30;
        for (int s = 0; s < 8; s++) {
            mlp_eval(m, &p, x[s], y1);
            for (int64_t j = 0; j < p.width[3]; j++) {
                worst = fmax(worst, fabs(y1[j] - y0[s][j]));
                scale = fmax(scale, fabs(y0[s][j]));
            }
        }
        if (worst > 1e-5 * scale)
            fail_msg("trial %d: equalized MLP differs by %g (scale %g)", trial, worst, scale);
        qcal_onnx_equalize_report_free(&rep);
        qcal_onnx_model_destroy(&m);
    }
}

/* ---- BatchNorm folding numbers ---- */

static void test_fold_bn_numbers(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t din[4] = { 1, 2, 4, 4 }, wd[4] = { 3, 2, 1, 1 }, cd[1] = { 3 };
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
    float w[6] = { 1, -2, 3, 0.5f, -1, 2 };
    float sc[3] = { 2, -1, 0.5f }, sh[3] = { 0.1f, 0.2f, -0.3f }, mean[3] = { 1, -1, 0 }, var[3] = { 3, 0.25f, 1 };
    OK(qcal_onnx_model_add_initializer_float(m, "W", 4, wd, w));
    OK(qcal_onnx_model_add_initializer_float(m, "s", 1, cd, sc));
    OK(qcal_onnx_model_add_initializer_float(m, "b", 1, cd, sh));
    OK(qcal_onnx_model_add_initializer_float(m, "mu", 1, cd, mean));
    OK(qcal_onnx_model_add_initializer_float(m, "var", 1, cd, var));
    node(m, "Conv", "conv", "x", "W", NULL, "c", NULL);
    const char *bin[5] = { "c", "s", "b", "mu", "var" }, *bout = "y";
    int64_t bi;
    OK(qcal_onnx_model_add_node(m, "BatchNormalization", "bn", 5, bin, 1, &bout, &bi));
    OK(qcal_onnx_node_set_float(m, bi, "epsilon", 1e-3f));
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_fold_report rep;
    OK(qcal_onnx_fold_bn(m, &rep));
    assert_int_equal(rep.n_folded, 1);
    assert_string_equal(rep.folded[0], "conv <- bn");
    assert_int_equal(rep.n_kept, 0);
    qcal_onnx_fold_report_free(&rep);
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.nodes, 1);
    assert_int_equal(info.initializers, 2);   // W and the new bias; the BN's four are gone
    qcal_onnx_node_info ni;
    OK(qcal_onnx_node_at(m, 0, &ni));
    assert_string_equal(ni.outputs[0], "y");
    assert_int_equal(ni.n_inputs, 3);
    float *fw = NULL, *fb = NULL;
    qcal_onnx_tensor_desc d;
    OK(qcal_onnx_initializer_float(m, "W", &fw, &d));
    OK(qcal_onnx_initializer_float(m, ni.inputs[2], &fb, &d));
    for (int o = 0; o < 3; o++) {
        double a = sc[o] / sqrt((double)var[o] + (double)1e-3f);
        for (int j = 0; j < 2; j++)
            assert_true(fw[o * 2 + j] == (float)(w[o * 2 + j] * a));
        assert_true(fb[o] == (float)((0.0 - mean[o]) * a + sh[o]));
    }
    qcal_free(fw);
    qcal_free(fb);
    // a second pass finds nothing; a BN after a non-Conv is kept with its reason
    OK(qcal_onnx_fold_bn(m, &rep));
    assert_int_equal(rep.n_folded, 0);
    qcal_onnx_fold_report_free(&rep);
    qcal_onnx_model_destroy(&m);

    OK(qcal_onnx_model_create(8, 13, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
    int64_t c2[1] = { 2 };
    float two[2] = { 1, 1 }, zero[2] = { 0, 0 };
    OK(qcal_onnx_model_add_initializer_float(m, "s", 1, c2, two));
    OK(qcal_onnx_model_add_initializer_float(m, "b", 1, c2, zero));
    OK(qcal_onnx_model_add_initializer_float(m, "mu", 1, c2, zero));
    OK(qcal_onnx_model_add_initializer_float(m, "var", 1, c2, two));
    node(m, "Relu", "relu", "x", NULL, NULL, "r", NULL);
    bin[0] = "r";
    OK(qcal_onnx_model_add_node(m, "BatchNormalization", "bn2", 5, bin, 1, &bout, NULL));
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    OK(qcal_onnx_fold_bn(m, &rep));
    assert_int_equal(rep.n_folded, 0);
    assert_int_equal(rep.n_kept, 1);
    assert_string_equal(rep.kept[0], "bn2 (BatchNormalization): its input is not produced by a Conv");
    qcal_onnx_fold_report_free(&rep);
    qcal_onnx_model_destroy(&m);
}

/* ---- refusals ---- */

/* conv1 (x -> c1) -> act (c1 -> r) -> conv2 (r -> y); `extra` adds what makes it unsafe. */
static qcal_onnx_model *chain(const char *act, const char *extra)
{
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t din[4] = { 1, 4, 5, 5 }, w1[4] = { 6, 4, 1, 1 }, w2[4] = { 3, 6, 1, 1 }, c6[1] = { 6 }, c3[1] = { 3 };
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
    add_rand(m, "W1", 4, w1, 1);
    add_rand(m, "B1", 1, c6, 1);
    add_rand(m, "W2", 4, w2, 1);
    add_rand(m, "B2", 1, c3, 1);
    bool w1_input = !strcmp(extra, "w1_input");
    if (w1_input)
        OK(qcal_onnx_model_add_input(m, "W1x", QCAL_ONNX_FLOAT, 4, w1));
    node(m, "Conv", "conv1", "x", w1_input ? "W1x" : "W1", "B1", "c1", NULL);
    if (!strcmp(act, "ClipNeg") || !strcmp(act, "Clip6")) {
        int64_t sc[1] = { 0 };
        float lo = !strcmp(act, "ClipNeg") ? -1.0f : 0.0f, hi = 6.0f;
        OK(qcal_onnx_model_add_initializer_float(m, "lo", 0, sc, &lo));
        OK(qcal_onnx_model_add_initializer_float(m, "hi", 0, sc, &hi));
        node(m, "Clip", "act", "c1", "lo", "hi", "r", NULL);
    } else {
        node(m, act, "act", "c1", NULL, NULL, "r", NULL);
    }
    node(m, "Conv", "conv2", "r", "W2", "B2", "y", NULL);
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    if (!strcmp(extra, "residual")) {
        node(m, "Add", "add", "r", "r", NULL, "z", NULL);
        OK(qcal_onnx_model_add_output(m, "z", QCAL_ONNX_FLOAT, -1, NULL));
    } else if (!strcmp(extra, "c1_out")) {
        OK(qcal_onnx_model_add_output(m, "c1", QCAL_ONNX_FLOAT, -1, NULL));
    } else if (!strcmp(extra, "shared")) {
        node(m, "Conv", "conv3", "r", "W2", "B2", "y3", NULL);
        OK(qcal_onnx_model_add_output(m, "y3", QCAL_ONNX_FLOAT, -1, NULL));
    }
    return m;
}

static void expect_refusal(const char *act, const char *extra, bool replace_clip, const char *msg)
{
    qcal_onnx_model *m = chain(act, extra);
    qcal_onnx_equalize_options opt;
    qcal_onnx_equalize_options_default(&opt);
    opt.replace_clip = replace_clip;
    qcal_onnx_equalize_report rep;
    void *before = NULL, *after = NULL;
    size_t nb, na;
    OK(qcal_onnx_model_serialize(m, &before, &nb));
    OK(qcal_onnx_equalize(m, &opt, &rep));
    if (rep.n_refused != 1 || strcmp(rep.refused[0], msg))
        fail_msg("%s/%s: %lld refusals, first '%s', want '%s'", act, extra, (long long)rep.n_refused,
                 rep.n_refused ? rep.refused[0] : "", msg);
    assert_int_equal(rep.n_pairs, 0);
    OK(qcal_onnx_model_serialize(m, &after, &na));
    // refused: the weights are written back unchanged (same values)
    assert_int_equal(nb, na);
    assert_memory_equal(before, after, nb);
    qcal_free(before);
    qcal_free(after);
    qcal_onnx_equalize_report_free(&rep);
    qcal_onnx_model_destroy(&m);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refusal("Relu", "residual", true,
                   "act (Relu): its output 'r' has more than one reader (a residual branch), so conv2 cannot be rescaled alone");
    expect_refusal("Relu", "c1_out", true, "conv1 (Conv): its output 'c1' has other readers than act");
    expect_refusal("Relu", "shared", true,
                   "act (Relu): its output 'r' has more than one reader (a residual branch), so conv2 cannot be rescaled alone");
    expect_refusal("Relu", "w1_input", true, "conv1 (Conv): weight 'W1x' is not an initializer");
    expect_refusal("Sigmoid", "", true,
                   "act (Sigmoid): between conv1 and conv2, but only Relu (or Clip from 0) commutes with per-channel scaling");
    expect_refusal("ClipNeg", "", true,
                   "act (Clip): min -1 is not 0, so the activation is not a ReLU (not positive-homogeneous)");
    expect_refusal("Clip6", "", false, "act (Clip): Clip(0, 6) would have to become Relu (replacement disabled)");
}

static void test_clip_replaced_and_shared_weight(void **state)
{
    (void)state;
    qcal_onnx_model *m = chain("Clip6", "");
    qcal_onnx_equalize_options opt;
    qcal_onnx_equalize_options_default(&opt);
    qcal_onnx_equalize_report rep;
    OK(qcal_onnx_equalize(m, &opt, &rep));
    assert_int_equal(rep.n_pairs, 1);
    assert_int_equal(rep.n_replaced, 1);
    assert_string_equal(rep.replaced[0], "act: Clip(0, 6) -> Relu");
    qcal_onnx_node_info ni;
    OK(qcal_onnx_node_at(m, 1, &ni));
    assert_string_equal(ni.op_type, "Relu");
    assert_int_equal(ni.n_inputs, 1);
    qcal_onnx_equalize_report_free(&rep);
    qcal_onnx_model_destroy(&m);

    // W2 read by two Convs (each reading r): one reader too many for 'r' first, so build a
    // variant where conv2's weight is shared with a Conv on another input
    m = chain("Relu", "");
    node(m, "Conv", "conv4", "x2", "W2", NULL, "y4", NULL);
    int64_t d[4] = { 1, 6, 5, 5 };
    OK(qcal_onnx_model_add_input(m, "x2", QCAL_ONNX_FLOAT, 4, d));
    OK(qcal_onnx_model_add_output(m, "y4", QCAL_ONNX_FLOAT, -1, NULL));
    OK(qcal_onnx_equalize(m, &opt, &rep));
    assert_int_equal(rep.n_pairs, 0);
    assert_int_equal(rep.n_refused, 1);
    assert_string_equal(rep.refused[0], "conv2 (Conv): weight 'W2' is shared with another node");
    qcal_onnx_equalize_report_free(&rep);
    // both bias corrections at once: invalid
    opt.analytic_bias_correction = true;
    opt.bias_correction_dump = "/nonexistent";
    assert_int_equal(qcal_onnx_equalize(m, &opt, &rep), QCAL_ERR_INVALID_ARG);
    qcal_onnx_model_destroy(&m);
}

static void test_identity_weights(void **state)
{
    (void)state;
    // torch.onnx without constant folding: W1 -> Identity -> conv1's weight
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t din[4] = { 1, 4, 5, 5 }, w1[4] = { 6, 4, 1, 1 }, w2[4] = { 3, 6, 1, 1 };
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
    add_rand(m, "W1", 4, w1, 1);
    add_rand(m, "W2", 4, w2, 1);
    node(m, "Identity", "id", "W1", NULL, NULL, "W1i", NULL);
    node(m, "Conv", "conv1", "x", "W1i", NULL, "c1", NULL);
    node(m, "Relu", "act", "c1", NULL, NULL, "r", NULL);
    node(m, "Conv", "conv2", "r", "W2", NULL, "y", NULL);
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_layer_ranges *lr = NULL;
    int64_t n = 0;
    OK(qcal_onnx_weight_ranges(m, &lr, &n));
    assert_int_equal(n, 2);
    assert_string_equal(lr[0].node, "conv1");
    assert_int_equal(lr[0].channels, 6);
    assert_true(lr[0].ratio >= 1.0 && lr[0].max_range > 0);
    qcal_onnx_layer_ranges_free(&lr, n);
    qcal_onnx_equalize_options opt;
    qcal_onnx_equalize_options_default(&opt);
    qcal_onnx_equalize_report rep;
    OK(qcal_onnx_equalize(m, &opt, &rep));
    assert_int_equal(rep.n_pairs, 1);
    assert_int_equal(rep.n_refused, 0);
    // balanced: conv1's output ranges equal conv2's input ranges
    float *a = NULL, *b = NULL;
    qcal_onnx_tensor_desc d;
    OK(qcal_onnx_initializer_float(m, "W1", &a, &d));
    OK(qcal_onnx_initializer_float(m, "W2", &b, &d));
    for (int c = 0; c < 6; c++) {
        float ra = 0, rb = 0;
        for (int j = 0; j < 4; j++)
            ra = fmaxf(ra, fabsf(a[c * 4 + j]));
        for (int o = 0; o < 3; o++)
            rb = fmaxf(rb, fabsf(b[o * 6 + c]));
        assert_true(fabsf(ra - rb) <= 1e-5f * ra);
    }
    qcal_free(a);
    qcal_free(b);
    qcal_onnx_equalize_report_free(&rep);
    qcal_onnx_model_destroy(&m);
}

/* paddle2onnx keeps every parameter in a Constant node: a float Constant feeding a Conv's
 * weight or bias or a BatchNormalization's parameters is folded and equalized as an
 * initializer would be (same ranges after), the folded BN's Constants dropped. */
static void add_param(qcal_onnx_model *m, bool constant, const char *name, int32_t ndim, const int64_t *dims,
                      float scale)
{
    if (!constant) {
        add_rand(m, name, ndim, dims, scale);
        return;
    }
    int64_t n = 1;
    for (int32_t i = 0; i < ndim; i++)
        n *= dims[i];
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = frand() * scale;
    int64_t k;
    char cname[64];
    snprintf(cname, sizeof cname, "%s_Constant", name);
    OK(qcal_onnx_model_add_node(m, "Constant", cname, 0, NULL, 1, &name, &k));
    OK(qcal_onnx_node_set_tensor(m, k, "value", QCAL_ONNX_FLOAT, ndim, dims, v, (size_t)n * sizeof *v));
    free(v);
}

static void test_constant_weights(void **state)
{
    (void)state;
    qcal_onnx_layer_ranges *after[2] = { NULL, NULL };
    int64_t nl[2] = { 0, 0 };
    for (int mode = 0; mode < 2; mode++) {
        rng = 99;
        qcal_onnx_model *m = NULL;
        OK(qcal_onnx_model_create(8, 13, &m));
        int64_t din[4] = { 1, 4, 5, 5 }, w1[4] = { 6, 4, 1, 1 }, c6[1] = { 6 }, w2[4] = { 3, 6, 1, 1 };
        OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
        add_param(m, mode, "W1", 4, w1, 1);
        add_param(m, mode, "B1", 1, c6, 0.5f);
        add_param(m, mode, "s", 1, c6, 1);
        add_param(m, mode, "b", 1, c6, 1);
        add_param(m, mode, "mu", 1, c6, 1);
        float var[6] = { 1, 2, 0.5f, 3, 0.25f, 1 };
        if (mode) {
            int64_t k;
            const char *vo = "var";
            OK(qcal_onnx_model_add_node(m, "Constant", "var_Constant", 0, NULL, 1, &vo, &k));
            OK(qcal_onnx_node_set_tensor(m, k, "value", QCAL_ONNX_FLOAT, 1, c6, var, sizeof var));
        } else {
            OK(qcal_onnx_model_add_initializer_float(m, "var", 1, c6, var));
        }
        add_param(m, mode, "W2", 4, w2, 1);
        node(m, "Conv", "conv1", "x", "W1", "B1", "c1", NULL);
        const char *bin[5] = { "c1", "s", "b", "mu", "var" }, *bout = "n1";
        OK(qcal_onnx_model_add_node(m, "BatchNormalization", "bn", 5, bin, 1, &bout, NULL));
        node(m, "Relu", "act", "n1", NULL, NULL, "r", NULL);
        node(m, "Conv", "conv2", "r", "W2", NULL, "y", NULL);
        OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
        qcal_onnx_equalize_options opt;
        qcal_onnx_equalize_options_default(&opt);
        qcal_onnx_equalize_report rep;
        OK(qcal_onnx_equalize(m, &opt, &rep));
        assert_int_equal(rep.fold.n_folded, 1);
        assert_int_equal(rep.n_pairs, 1);
        assert_int_equal(rep.n_refused, 0);
        assert_int_equal(rep.n_layers, 2);
        after[mode] = rep.after;
        nl[mode] = rep.n_layers;
        rep.after = NULL;
        qcal_onnx_equalize_report_free(&rep);
        qcal_onnx_model_info info;
        OK(qcal_onnx_model_get_info(m, &info));
        // the BN and its parameters are gone: Conv, Relu, Conv (+ the Constants of W1, B1, W2)
        assert_int_equal(info.nodes, mode ? 6 : 3);
        qcal_onnx_model_destroy(&m);
    }
    for (int64_t i = 0; i < nl[0]; i++) {
        assert_true(after[0][i].min_range == after[1][i].min_range);
        assert_true(after[0][i].max_range == after[1][i].max_range);
    }
    qcal_onnx_layer_ranges_free(&after[0], nl[0]);
    qcal_onnx_layer_ranges_free(&after[1], nl[1]);
}

/* What equalize and BN folding orphan goes: the Constants of a Clip(0, 6) made a Relu (one
 * behind a Cast, as torch.onnx writes clamp bounds), a folded BN's parameter behind an
 * Identity and its initializer; a Constant and an initializer nothing read before stay. */
static void test_orphans_removed(void **state)
{
    (void)state;
    rng = 5;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t din[4] = { 1, 4, 5, 5 }, w1[4] = { 6, 4, 1, 1 }, c6[1] = { 6 }, w2[4] = { 3, 6, 1, 1 };
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, din));
    add_param(m, true, "W1", 4, w1, 1);
    add_param(m, true, "B1", 1, c6, 0.5f);
    add_param(m, true, "W2", 4, w2, 1);
    add_param(m, false, "s", 1, c6, 1);
    add_param(m, false, "b", 1, c6, 1);
    add_param(m, false, "mu", 1, c6, 1);
    float var[6] = { 1, 2, 0.5f, 3, 0.25f, 1 }, lo = 0.0f, hi = 6.0f, one = 1.0f;
    OK(qcal_onnx_model_add_initializer_float(m, "var0", 1, c6, var));
    OK(qcal_onnx_model_add_initializer_float(m, "spare", 1, c6, var));   // read by nothing from the start
    node(m, "Identity", "var_Identity", "var0", NULL, NULL, "var", NULL);
    int64_t k;
    const char *o = "lo";
    OK(qcal_onnx_model_add_node(m, "Constant", "lo_Constant", 0, NULL, 1, &o, &k));
    OK(qcal_onnx_node_set_tensor(m, k, "value", QCAL_ONNX_FLOAT, 0, NULL, &lo, 4));
    o = "hi0";
    OK(qcal_onnx_model_add_node(m, "Constant", "hi_Constant", 0, NULL, 1, &o, &k));
    OK(qcal_onnx_node_set_tensor(m, k, "value", QCAL_ONNX_FLOAT, 0, NULL, &hi, 4));
    node(m, "Cast", "hi_Cast", "hi0", NULL, NULL, "hi", &k);
    OK(qcal_onnx_node_set_int(m, k, "to", QCAL_ONNX_FLOAT));
    o = "unused";
    OK(qcal_onnx_model_add_node(m, "Constant", "unused_Constant", 0, NULL, 1, &o, &k));
    OK(qcal_onnx_node_set_tensor(m, k, "value", QCAL_ONNX_FLOAT, 0, NULL, &one, 4));
    node(m, "Conv", "conv1", "x", "W1", "B1", "c1", NULL);
    const char *bin[5] = { "c1", "s", "b", "mu", "var" }, *bout = "n1";
    OK(qcal_onnx_model_add_node(m, "BatchNormalization", "bn", 5, bin, 1, &bout, NULL));
    node(m, "Clip", "act", "n1", "lo", "hi", "r", NULL);
    node(m, "Conv", "conv2", "r", "W2", NULL, "y", NULL);
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.nodes, 12);
    assert_int_equal(info.initializers, 5);
    void *buf;
    size_t len;
    OK(qcal_onnx_model_serialize(m, &buf, &len));
    // BN folding alone: the BN, its initializers s, b, mu and, behind the Identity, var0
    qcal_onnx_model *f = NULL;
    OK(qcal_onnx_model_parse(buf, len, &f));
    qcal_onnx_fold_report fr;
    OK(qcal_onnx_fold_bn(f, &fr));
    assert_int_equal(fr.n_folded, 1);
    qcal_onnx_fold_report_free(&fr);
    OK(qcal_onnx_model_get_info(f, &info));
    assert_int_equal(info.nodes, 10);          // - BN, - Identity
    assert_int_equal(info.initializers, 1);    // spare
    qcal_onnx_model_destroy(&f);
    // equalize: also the Clip's bounds (two Constants and the Cast)
    qcal_onnx_equalize_options opt;
    qcal_onnx_equalize_options_default(&opt);
    qcal_onnx_equalize_report rep;
    OK(qcal_onnx_equalize(m, &opt, &rep));
    assert_int_equal(rep.fold.n_folded, 1);
    assert_int_equal(rep.n_pairs, 1);
    assert_int_equal(rep.n_replaced, 1);
    qcal_onnx_equalize_report_free(&rep);
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.nodes, 7);           // Constants W1, B1, W2, unused; conv1, Relu, conv2
    assert_int_equal(info.initializers, 1);
    const char *left[] = { "W1_Constant", "B1_Constant", "W2_Constant", "unused_Constant", "conv1", "act", "conv2" };
    for (int64_t i = 0; i < info.nodes; i++) {
        qcal_onnx_node_info ni;
        OK(qcal_onnx_node_at(m, i, &ni));
        bool known = false;
        for (size_t j = 0; j < sizeof left / sizeof left[0]; j++)
            known |= !strcmp(ni.name, left[j]);
        if (!known)
            fail_msg("node '%s' (%s) left", ni.name, ni.op_type);
    }
    float *v;
    OK(qcal_onnx_initializer_float(m, "spare", &v, NULL));
    qcal_free(v);
    qcal_onnx_model_destroy(&m);
    // nothing to fold or equalize: the model byte for byte
    OK(qcal_onnx_model_parse(buf, len, &m));
    opt.fold_bn = false;
    opt.equalize = false;
    OK(qcal_onnx_equalize(m, &opt, &rep));
    qcal_onnx_equalize_report_free(&rep);
    void *after;
    size_t alen;
    OK(qcal_onnx_model_serialize(m, &after, &alen));
    assert_int_equal(alen, len);
    assert_memory_equal(after, buf, len);
    qcal_free(after);
    qcal_free(buf);
    qcal_onnx_model_destroy(&m);
}

/* ---- the CLI: output line, refusal lines, errors with their exit codes ---- */

static char out_buf[1 << 16], err_buf[1 << 14];

static int qcal(const char *dir, ...)
{
    va_list ap;
    va_start(ap, dir);
    const char *first = va_arg(ap, const char *);
    int rc = tu_run_va(getenv("QCAL_BIN"), first, ap, dir, out_buf, sizeof out_buf, err_buf, sizeof err_buf);
    va_end(ap);
    return rc;
}

static void test_cli(void **state)
{
    (void)state;
    if (!getenv("QCAL_BIN")) {
        print_message("QCAL_BIN not set: CLI part skipped\n");
        return;
    }
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/qcal_equalize_XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *model = strdup(tu_path(dir, "m.onnx")), *res = strdup(tu_path(dir, "residual.onnx")), *out = strdup(tu_path(dir, "out.onnx"));
    qcal_onnx_model *m = chain("Clip6", "");
    OK(qcal_onnx_model_save_file(m, NULL, model));
    qcal_onnx_model_destroy(&m);
    m = chain("Relu", "residual");
    OK(qcal_onnx_model_save_file(m, NULL, res));
    qcal_onnx_model_destroy(&m);
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, NULL), 0);
    assert_non_null(strstr(out_buf, ": 0 BatchNormalizations folded, 1 chain equalized ("));
    assert_non_null(strstr(out_buf, "1 Clip replaced by Relu, 0 biases corrected, 0 chains refused\n"));
    tu_expect_one_line(err_buf, "qcal: equalize: note: Clip replaced by Relu: ", "act: Clip(0, 6) -> Relu");
    assert_int_equal(qcal(dir, "equalize", res, "-o", out, "--report", NULL), 0);
    tu_expect_one_line(err_buf, "qcal: equalize: refused: ",
                       "act (Relu): its output 'r' has more than one reader (a residual branch)");
    assert_non_null(strstr(out_buf, "ratio_folded"));
    assert_non_null(strstr(out_buf, "conv1 "));
    // errors: one line each, documented exit codes, the output left alone
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, "--bias-correction", dir, "--analytic-bias-correction",
                          NULL), 2);
    tu_expect_one_line(err_buf, "qcal: equalize: ", "exclude each other");
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, "--weight-qscheme", "per_row", NULL), 2);
    tu_expect_one_line(err_buf, "qcal: equalize: ", "--weight-qscheme: 'per_row'");
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, "--max-sweeps", "0", NULL), 2);
    char *missing = strdup(tu_path(dir, "missing"));
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, "--bias-correction", missing, NULL), 3);
    tu_expect_one_line(err_buf, "qcal: equalize: ", "missing");
    assert_int_equal(qcal(dir, "equalize", missing, "-o", out, NULL), 3);
    // a dump whose tensor has the wrong channel count: exit 3 naming it
    char *dump = strdup(tu_path(dir, "dump")), *xd = strdup(tu_path(dir, "dump/x"));
    assert_int_equal(mkdir(dump, 0755), 0);
    assert_int_equal(mkdir(xd, 0755), 0);
    char *b0 = strdup(tu_path(dir, "dump/x/b0.npy"));
    float v[10] = { 0 };
    int64_t shape[2] = { 2, 5 };
    OK(qcal_npy_write(b0, QCAL_NPY_F32, 2, shape, v));
    assert_int_equal(qcal(dir, "equalize", model, "-o", out, "--bias-correction", dump, NULL), 3);
    tu_expect_one_line(err_buf, "qcal: equalize: ", "dump tensor 'x'");
    free(model), free(res), free(out), free(missing), free(dump), free(xd), free(b0);
    tu_rm_tree(dir);
}

/* A name defined twice in one graph (not SSA) is refused by the reader, saying what defined
 * it first: by two nodes (the passes would rewire the wrong producer), or by a node and a
 * graph input or initializer (a node before it reads the input, whose Q/DQ qcal_onnx_qdq then
 * never made). fuzz_onnx found qcal_onnx_qdq crashing on both. */
static void test_duplicate_producer_rejected(void **state)
{
    (void)state;
    static const char *const what[3][3] = { { "r", "c1", "an earlier node already writes" },
                                            { "y", "x", "is a graph input" },
                                            { "y", "W2", "is an initializer" } };
    for (int c = 0; c < 3; c++) {
        qcal_onnx_model *m = chain("Relu", "");
        node(m, "Relu", "again", what[c][0], NULL, NULL, what[c][1], NULL);
        void *buf = NULL;
        size_t len = 0;
        OK(qcal_onnx_model_serialize(m, &buf, &len));
        qcal_onnx_model *r = NULL;
        assert_int_equal(qcal_onnx_model_parse(buf, len, &r), QCAL_ERR_FORMAT);
        assert_null(r);
        char want[128];
        snprintf(want, sizeof want, "'buffer': node 'again' (Relu) writes '%s', which %s", what[c][1], what[c][2]);
        assert_string_equal(qcal_last_error(), want);
        qcal_free(buf);
        qcal_onnx_model_destroy(&m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_mlps),
        cmocka_unit_test(test_fold_bn_numbers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_clip_replaced_and_shared_weight),
        cmocka_unit_test(test_identity_weights),
        cmocka_unit_test(test_constant_weights),
        cmocka_unit_test(test_orphans_removed),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_duplicate_producer_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
