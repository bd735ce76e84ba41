/* ort.accuracy: qcal/accuracy.h and qcal_onnx_gate against ONNX Runtime 1.30 (onnxruntime-
 * node's libonnxruntime.so.1 from the npm cache), on the committed MobileNet-style network
 * (examples/mobilenet/mobilenet.onnx, BatchNormalization folded as qdq folds it) and the 64
 * Fashion-MNIST test images of examples/data/fmnist_test_batch.npy, calibrated with minmax:
 *   - the gated model with every gate on computes the QDQ model's outputs bit for bit, with
 *     every gate off the float model's, with one gate on neither (graph optimizations off,
 *     the same kernels either way);
 *   - qcal_accuracy_compare: the SQNR, cosine and agreement of the QDQ model against float equal
 *     the same figures computed here from the two models' outputs; the per-op sums do not
 *     depend on the batch (1, 5, 64: every figure bit-identical); labels count right;
 *   - qcal_accuracy_keep_float: with a target between the all-quantized SQNR and float, the
 *     answer holds on the real model, and keeping one op fewer float does not hold on the
 *     gated model (the fewest); a target already met keeps nothing float; bad targets.
 * One line and exit 77 when ONNX Runtime cannot be found. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qcal/qcal.h"

#define OK(x)                                                                                   \
    do {                                                                                        \
        qcal_status s_ = (x);                                                                   \
        if (s_ != QCAL_OK)                                                                      \
            fail_msg("%s: status %d: %s", #x, s_, qcal_last_error());                            \
    } while (0)

static char model_path[1024], data_path[1024];
static qcal_engine *eng;
static qcal_onnx_model *fm;   /* float, BatchNormalization folded */
static qcal_calib_table *table;

static void *ser(const qcal_onnx_model *m, size_t *len)
{
    void *b = NULL;
    OK(qcal_onnx_model_serialize(m, &b, len));
    return b;
}

static qcal_engine_session *sess(const qcal_onnx_model *m, int level)
{
    size_t len;
    void *b = ser(m, &len);
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.optimization = level;
    so.threads = 1;
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(eng, b, len, &so, &s));
    qcal_free(b);
    return s;
}

static qcal_onnx_model *qdq_of(const qcal_onnx_model *m, const char *const *exclude, int64_t n_ex)
{
    size_t len;
    void *b = ser(m, &len);
    qcal_onnx_model *c = NULL;
    OK(qcal_onnx_model_parse(b, len, &c));
    qcal_free(b);
    qcal_onnx_qdq_options o;
    qcal_onnx_qdq_options_default(&o);
    o.exclude = exclude;
    o.n_exclude = n_ex;
    OK(qcal_onnx_qdq(c, table, &o, NULL));
    return c;
}

/* The table of m calibrated on the images with the rules text (batches of 16). */
static qcal_calib_table *calibrate(const qcal_onnx_model *m, const char *rules_text)
{
    qcal_calib_rules *rules = NULL;
    OK(qcal_calib_rules_parse(rules_text, strlen(rules_text), &rules));
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(&so, &s));
    qcal_model_calib_options mo;
    qcal_model_calib_options_default(&mo);
    mo.batch = 16;
    OK(qcal_model_calib_run(eng, m, data_path, NULL, 0, s, &mo, NULL));
    qcal_calib_table *t = NULL;
    OK(qcal_calib_session_table(s, &t));
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
    return t;
}

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    snprintf(model_path, sizeof model_path, "%s/examples/mobilenet/mobilenet.onnx", root ? root : ".");
    snprintf(data_path, sizeof data_path, "%s/examples/data/fmnist_test_batch.npy", root ? root : ".");
    OK(qcal_onnx_model_load_file(model_path, &fm));
    OK(qcal_onnx_fold_bn(fm, NULL));
    /* the table: minmax over the images, through model calibration */
    table = calibrate(fm, "* activation minmax\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    qcal_calib_table_destroy(&table);
    qcal_onnx_model_destroy(&fm);
    return 0;
}

/* Runs s on the first n images (with gates when g is not NULL); the logits, malloc'ed. */
static float *logits(qcal_engine_session *s, int64_t n, const uint8_t *g, int64_t n_gates)
{
    qcal_npy_array a;
    OK(qcal_npy_read(data_path, &a));
    qcal_engine_value in[2];
    memset(in, 0, sizeof in);
    in[0].name = "input";
    in[0].elem_type = 1;
    in[0].ndim = 4;
    in[0].dims[0] = n;
    in[0].dims[1] = 1;
    in[0].dims[2] = 28;
    in[0].dims[3] = 28;
    in[0].data = a.data;
    in[0].nbytes = (size_t)n * 784 * sizeof(float);
    qcal_engine_io io;
    OK(qcal_engine_session_input(s, 0, &io));
    in[0].name = io.name;
    in[1].name = QCAL_ONNX_GATES_INPUT;
    in[1].elem_type = 9; /* bool, a byte per op */
    in[1].ndim = 1;
    in[1].dims[0] = n_gates;
    in[1].data = g;
    in[1].nbytes = (size_t)n_gates;
    qcal_engine_outputs *o = NULL;
    OK(qcal_engine_session_run(s, in, g ? 2 : 1, NULL, 0, &o));
    qcal_engine_value v;
    OK(qcal_engine_outputs_at(o, 0, &v));
    float *out = malloc(v.nbytes);
    assert_non_null(out);
    memcpy(out, v.data, v.nbytes);
    assert_int_equal(v.nbytes, (size_t)n * 10 * sizeof(float));
    qcal_engine_outputs_free(&o);
    qcal_free(a.data);
    return out;
}

static void test_gate_bits(void **state)
{
    (void)state;
    qcal_onnx_model *q = qdq_of(fm, NULL, 0), *gm = NULL;
    qcal_onnx_gate_op *ops = NULL;
    int64_t n = 0;
    OK(qcal_onnx_gate(q, fm, &gm, &ops, &n));
    /* every Conv, Gemm, Add, pool and flatten the ort profile quantizes: 35 */
    assert_int_equal(n, 35);
    int64_t fixed = 0, convs = 0;
    for (int64_t i = 0; i < n; i++) {
        fixed += ops[i].fixed;
        convs += !strcmp(ops[i].op_type, "Conv");
    }
    assert_int_equal(fixed, 0);
    assert_int_equal(convs, 28);
    /* one If per op and one for the graph output (written through Q/DQ); no Q/DQ left in the
     * main graph: each op's Q/DQ runs inside its If, only when its gate is on */
    qcal_onnx_model_info mi;
    OK(qcal_onnx_model_get_info(gm, &mi));
    int64_t ifs = 0, qdq = 0;
    for (int64_t i = 0; i < mi.nodes; i++) {
        qcal_onnx_node_info ni;
        OK(qcal_onnx_node_at(gm, i, &ni));
        ifs += !strcmp(ni.op_type, "If");
        qdq += !strcmp(ni.op_type, "QuantizeLinear") || !strcmp(ni.op_type, "DequantizeLinear");
    }
    assert_int_equal(ifs, n + 1);
    assert_int_equal(qdq, 0);
    qcal_engine_session *gs = sess(gm, 0), *qs = sess(q, 0), *fs = sess(fm, 0);
    uint8_t *on = malloc((size_t)n), *off = calloc((size_t)n, 1), *one = calloc((size_t)n, 1);
    memset(on, 1, (size_t)n);
    one[3] = 1;
    float *a = logits(gs, 8, on, n), *b = logits(qs, 8, NULL, 0);
    assert_memory_equal(a, b, 8 * 10 * sizeof(float));
    float *c = logits(gs, 8, off, n), *d = logits(fs, 8, NULL, 0);
    /* gates off: the float model bit for bit (each else-branch runs the op on the float
     * weights as constants of its own, prepacked as the float model's are) */
    assert_memory_equal(c, d, 8 * 10 * sizeof(float));
    float *e = logits(gs, 8, one, n);
    assert_true(memcmp(e, a, 8 * 10 * sizeof(float)) != 0);
    assert_true(memcmp(e, c, 8 * 10 * sizeof(float)) != 0);
    free(a), free(b), free(c), free(d), free(e), free(on), free(off), free(one);
    /* a model without Q/DQ, and a model gated twice */
    qcal_onnx_model *g2 = NULL;
    qcal_onnx_gate_op *ops2 = NULL;
    int64_t n2 = 0;
    assert_int_equal(qcal_onnx_gate(fm, NULL, &g2, &ops2, &n2), QCAL_ERR_EMPTY);
    assert_int_equal(qcal_onnx_gate(gm, NULL, &g2, &ops2, &n2), QCAL_ERR_INVALID_ARG);
    assert_null(g2);
    qcal_engine_session_destroy(&gs);
    qcal_engine_session_destroy(&qs);
    qcal_engine_session_destroy(&fs);
    qcal_onnx_gate_ops_free(&ops, n);
    qcal_onnx_model_destroy(&gm);
    qcal_onnx_model_destroy(&q);
}

/* The gated model with every gate on is the QDQ model bit for bit, gates off float to
 * rounding, for the tensorrt profile (float weights before Q/DQ) and FP8 (opset 19, a Sum on
 * each side of Q/DQ) as for ort int8. */
static void gate_case(qcal_onnx_profile profile, bool fp8)
{
    size_t len;
    void *b = ser(fm, &len);
    qcal_onnx_model *f = NULL, *q = NULL, *gm = NULL;
    OK(qcal_onnx_model_parse(b, len, &f));
    qcal_free(b);
    qcal_calib_table *t = table;
    if (fp8) {
        OK(qcal_onnx_upgrade(f, 19, NULL));
        t = calibrate(f, "* activation minmax dtype=float8_e4m3fn\n");
    }
    b = ser(f, &len);
    OK(qcal_onnx_model_parse(b, len, &q));
    qcal_free(b);
    qcal_onnx_qdq_options o;
    qcal_onnx_qdq_options_default(&o);
    o.profile = profile;
    OK(qcal_onnx_qdq(q, t, &o, NULL));
    qcal_onnx_gate_op *ops = NULL;
    int64_t n = 0;
    OK(qcal_onnx_gate(q, f, &gm, &ops, &n));
    int64_t fixed = 0;
    for (int64_t i = 0; i < n; i++)
        fixed += ops[i].fixed;
    assert_int_equal(fixed, 0);
    /* the ops reading a quantized input as each profile places Q/DQ (measured) */
    assert_int_equal(n, profile == QCAL_ONNX_PROFILE_TENSORRT ? 33 : 35);
    qcal_engine_session *gs = sess(gm, 0), *qs = sess(q, 0), *fs = sess(f, 0);
    uint8_t *on = malloc((size_t)n), *off = calloc((size_t)n, 1);
    memset(on, 1, (size_t)n);
    float *a = logits(gs, 8, on, n), *c = logits(qs, 8, NULL, 0);
    assert_memory_equal(a, c, 8 * 10 * sizeof(float));
    float *d = logits(gs, 8, off, n), *e = logits(fs, 8, NULL, 0);
    assert_memory_equal(d, e, 8 * 10 * sizeof(float));
    printf("gate %s%s: %lld ops, gates on the QDQ model's bits, off float's\n", qcal_onnx_profile_name(profile),
           fp8 ? " fp8" : "", (long long)n);
    free(a), free(c), free(d), free(e), free(on), free(off);
    qcal_engine_session_destroy(&gs);
    qcal_engine_session_destroy(&qs);
    qcal_engine_session_destroy(&fs);
    qcal_onnx_gate_ops_free(&ops, n);
    qcal_onnx_model_destroy(&gm);
    qcal_onnx_model_destroy(&q);
    qcal_onnx_model_destroy(&f);
    if (t != table)
        qcal_calib_table_destroy(&t);
}

static void test_gate_profiles(void **state)
{
    (void)state;
    gate_case(QCAL_ONNX_PROFILE_TENSORRT, false);
    gate_case(QCAL_ONNX_PROFILE_ORT, true);
}

static void test_compare(void **state)
{
    (void)state;
    qcal_onnx_model *q = qdq_of(fm, NULL, 0);
    /* labels: the float model's own argmax, one per image; image 0's label changed so that
     * float gets 63 of 64 */
    qcal_engine_session *fs = sess(fm, 99), *qs = sess(q, 99);
    float *f = logits(fs, 64, NULL, 0), *y = logits(qs, 64, NULL, 0);
    int64_t lab[64];
    double ss_f = 0, ss_e = 0, dot = 0, ss_q = 0;
    int agree = 0, right_q = 0;
    for (int i = 0; i < 64; i++) {
        int af = 0, aq = 0;
        for (int k = 0; k < 10; k++) {
            double u = f[i * 10 + k], v = y[i * 10 + k];
            ss_f += u * u, ss_e += (u - v) * (u - v), dot += u * v, ss_q += v * v;
            if (f[i * 10 + k] > f[i * 10 + af])
                af = k;
            if (y[i * 10 + k] > y[i * 10 + aq])
                aq = k;
        }
        lab[i] = i == 0 ? (af + 1) % 10 : af;
        agree += af == aq;
        right_q += aq == lab[i];
    }
    qcal_engine_session_destroy(&fs);
    qcal_engine_session_destroy(&qs);
    qcal_engine_value lv = {.name = "labels", .elem_type = 7, .ndim = 1, .dims = {64}, .data = lab,
                            .nbytes = sizeof lab};
    qcal_accuracy_options o;
    qcal_accuracy_options_default(&o);
    o.threads = 1;
    o.labels = &lv;
    o.max_samples = 64;
    o.sensitivity_samples = 16;
    qcal_accuracy_report r[3];
    int64_t batches[3] = {1, 5, 64};
    for (int b = 0; b < 3; b++) {
        o.batch = batches[b];
        o.threads = b == 1 ? 2 : 1;
        OK(qcal_accuracy_compare(eng, fm, q, NULL, data_path, NULL, 0, &o, &r[b]));
    }
    assert_int_equal(r[0].n_outputs, 1);
    assert_int_equal(r[0].samples, 64);
    assert_int_equal(r[0].sensitivity_samples, 16);
    assert_int_equal(r[0].n_ops, 35);
    assert_float_equal(r[0].outputs[0].sqnr_db, 10 * log10(ss_f / ss_e), 1e-9);
    assert_float_equal(r[0].outputs[0].cosine, dot / sqrt(ss_f * ss_q), 1e-12);
    assert_float_equal(r[0].outputs[0].agree, agree / 64.0, 1e-15);
    assert_float_equal(r[0].outputs[0].acc_float, 63 / 64.0, 1e-15);
    assert_float_equal(r[0].outputs[0].acc_quant, right_q / 64.0, 1e-15);
    assert_int_equal(r[0].outputs[0].positions, 64);
    /* 35 alone, 35 all-but-one, all on, one reference: 72 runs per sample of the 16 (the
     * gated model runs one sample at a time), after the float and QDQ runs of the batches */
    assert_int_equal(r[0].runs, 64 * 2 + 16 * 72);
    assert_int_equal(r[2].runs, 2 + 16 * 72);
    /* most sensitive first; all-but-one never above float (inf) and alone above all-on */
    for (int64_t i = 1; i < r[0].n_ops; i++)
        assert_true(r[0].ops[i - 1].sqnr_only_db <= r[0].ops[i].sqnr_only_db);
    for (int64_t i = 0; i < r[0].n_ops; i++)
        assert_true(r[0].ops[i].sqnr_only_db > r[0].gated_sqnr_db);
    /* bit-identical for every batch and thread count */
    for (int b = 1; b < 3; b++) {
        assert_memory_equal(&r[b].outputs[0].sqnr_db, &r[0].outputs[0].sqnr_db, sizeof(double));
        assert_memory_equal(&r[b].gated_sqnr_db, &r[0].gated_sqnr_db, sizeof(double));
        for (int64_t i = 0; i < r[0].n_ops; i++) {
            assert_string_equal(r[b].ops[i].name, r[0].ops[i].name);
            assert_memory_equal(&r[b].ops[i].sqnr_only_db, &r[0].ops[i].sqnr_only_db, sizeof(double));
            assert_memory_equal(&r[b].ops[i].sqnr_others_db, &r[0].ops[i].sqnr_others_db, sizeof(double));
        }
    }
    printf("compare: SQNR %.2f dB, gated %.2f dB, most sensitive %s (%.2f dB alone)\n", r[0].outputs[0].sqnr_db,
           r[0].gated_sqnr_db, r[0].ops[0].name, r[0].ops[0].sqnr_only_db);
    for (int b = 0; b < 3; b++)
        qcal_accuracy_report_free(&r[b]);
    /* labels that do not fit */
    lv.dims[0] = 10;
    qcal_accuracy_report bad;
    assert_int_equal(qcal_accuracy_compare(eng, fm, q, NULL, data_path, NULL, 0, &o, &bad), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "labels: 10 rows for 64 samples"));
    free(f), free(y);
    qcal_onnx_model_destroy(&q);
}

static void test_keep_float(void **state)
{
    (void)state;
    qcal_accuracy_options o;
    qcal_accuracy_options_default(&o);
    o.threads = 1;
    o.batch = 16;
    o.sensitivity_samples = 16;
    o.others = false;
    qcal_onnx_model *q = qdq_of(fm, NULL, 0);
    qcal_accuracy_report r;
    OK(qcal_accuracy_compare(eng, fm, q, NULL, data_path, NULL, 0, &o, &r));
    double base = r.outputs[0].sqnr_db;
    qcal_accuracy_report_free(&r);
    qcal_onnx_model_destroy(&q);

    qcal_accuracy_keep_float_target t = {base + 6.0, NAN};
    qcal_accuracy_keep_float_result k;
    OK(qcal_accuracy_keep_float(eng, fm, table, NULL, data_path, NULL, 0, &o, &t, &k));
    assert_true(k.met);
    assert_true(k.n_float >= 1 && k.n_float < k.n_ops);
    assert_int_equal(k.n_ops, 35);
    assert_true(k.sqnr_db >= t.min_output_sqnr_db);
    /* the written model reaches it: the QDQ model with those ops excluded, measured again */
    char **ex = calloc((size_t)k.n_float, sizeof *ex);
    for (int64_t i = 0; i < k.n_float; i++)
        ex[i] = qcal_accuracy_keep_float_exclude(k.float_ops[i]);
    q = qdq_of(fm, (const char *const *)ex, k.n_float);
    o.sensitivity_samples = 0;
    OK(qcal_accuracy_compare(eng, fm, q, NULL, data_path, NULL, 0, &o, &r));
    assert_memory_equal(&r.sqnr_db, &k.sqnr_db, sizeof(double));
    qcal_accuracy_report_free(&r);
    qcal_onnx_model_destroy(&q);
    /* one op fewer float misses the target (the search measured it) */
    q = qdq_of(fm, (const char *const *)ex, k.n_float - 1);
    OK(qcal_accuracy_compare(eng, fm, q, NULL, data_path, NULL, 0, &o, &r));
    assert_true(r.sqnr_db < t.min_output_sqnr_db);
    qcal_accuracy_report_free(&r);
    qcal_onnx_model_destroy(&q);
    for (int64_t i = 0; i < k.n_float; i++)
        qcal_free(ex[i]);
    free(ex);
    printf("keep-float: target %.2f dB (all quantized %.2f): %lld ops float, %.2f dB; %lld runs, %lld checks\n",
           t.min_output_sqnr_db, base, (long long)k.n_float, k.sqnr_db, (long long)k.runs, (long long)k.checks);
    qcal_accuracy_keep_float_result_free(&k);

    /* a target the quantized model meets already: nothing float */
    t.min_output_sqnr_db = base - 3.0;
    o.sensitivity_samples = 16;
    OK(qcal_accuracy_keep_float(eng, fm, table, NULL, data_path, NULL, 0, &o, &t, &k));
    assert_true(k.met);
    assert_int_equal(k.n_float, 0);
    qcal_accuracy_keep_float_result_free(&k);
    /* no target; a drop without labels */
    qcal_accuracy_keep_float_target none = {NAN, NAN}, drop = {NAN, 1.0};
    assert_int_equal(qcal_accuracy_keep_float(eng, fm, table, NULL, data_path, NULL, 0, &o, &none, &k), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_accuracy_keep_float(eng, fm, table, NULL, data_path, NULL, 0, &o, &drop, &k), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "needs labels"));
    char *esc = qcal_accuracy_keep_float_exclude("a[1]*?\\b");
    assert_string_equal(esc, "a\\[1\\]\\*\\?\\\\b");
    qcal_free(esc);
}

int main(void)
{
    if (qcal_engine_open(NULL, &eng) != QCAL_OK) {
        printf("ort.accuracy: skipped: %s\n", qcal_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_bits),
        cmocka_unit_test(test_gate_profiles),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_keep_float),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    qcal_engine_close(&eng);
    return rc;
}
