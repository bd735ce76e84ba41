/* unit.deprecated_names: the names public calls had before 0.2.0 (include/qcal/deprecated.h,
 * docs/CHANGES.md) still compile through the old headers and give exactly what the new calls
 * give, on a sample of every kind of rename: a plain forward (threads, dtype), strings
 * (keep-float exclude, dump names), a path loader (rules), const readers (histogram search
 * curve, torch buffers, TensorRT algorithm), a deprecated typedef and the ONNX builder (model
 * bytes compared). Built with -Wno-deprecated-declarations; the rest of the tree is built with
 * QCAL_NO_DEPRECATED, so this is the one file that sees the old names. */
#undef QCAL_NO_DEPRECATED
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "testutil.h"
/* The two headers renamed in 0.2.0, by their old paths. */
#include "qcal/checkpoint_fp8.h"
#include "qcal/evaluate.h"
#include "qcal/qcal.h"

static void test_threads_and_dtype(void **state)
{
    (void)state;
    int before = qcal_threads_count();
    assert_int_equal(qcal_get_num_threads(), before);
    assert_int_equal(qcal_set_num_threads(3), QCAL_OK);
    int got = qcal_threads_count();
    assert_int_equal(qcal_get_num_threads(), got);
    assert_int_equal(qcal_threads_set_count(1), QCAL_OK);
    assert_int_equal(qcal_get_num_threads(), 1);
    assert_int_equal(qcal_set_num_threads(0), QCAL_OK);   /* back to the default */
    assert_int_equal(qcal_set_num_threads(-1), QCAL_ERR_INVALID_ARG);
    assert_true(qcal_float8_max(QCAL_FLOAT8_E4M3FN) == 448.0f);
    assert_true(qcal_float8_max(QCAL_FLOAT8_E5M2) == 57344.0f);
    assert_true(qcal_float8_max(QCAL_QINT8) == qcal_dtype_float8_max(QCAL_QINT8));
}

static void test_strings(void **state)
{
    (void)state;
    char a[32], b[32];
    assert_int_equal(qcal_calib_name_decode("conv%2F1.out%25", a, sizeof a), QCAL_OK);
    assert_int_equal(qcal_calib_dump_name_decode("conv%2F1.out%25", b, sizeof b), QCAL_OK);
    assert_string_equal(a, "conv/1.out%");
    assert_string_equal(a, b);
    assert_int_equal(qcal_calib_name_decode("bad%4", a, sizeof a), QCAL_ERR_FORMAT);
    char *x = qcal_keep_float_exclude("/layer[0]/Conv*");
    char *y = qcal_accuracy_keep_float_exclude("/layer[0]/Conv*");
    assert_non_null(x);
    assert_non_null(y);
    assert_string_equal(x, y);
    assert_string_equal(x, "/layer\\[0\\]/Conv\\*");
    qcal_free(x);
    qcal_free(y);
    /* A deprecated typedef names the same type. */
    qcal_numeric_report_options o1;
    qcal_numeric_eval_report_options o2;
    memset(&o1, 0xA5, sizeof o1);
    memset(&o2, 0xA5, sizeof o2);
    qcal_numeric_report_options_default(&o1);
    qcal_numeric_eval_report_options_default(&o2);
    assert_memory_equal(&o1, &o2, sizeof o1);
}

static void test_rules_and_table(void **state)
{
    (void)state;
    const char *dir = getenv("QCAL_TEST_DATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/calib/rules_sample.txt", dir ? dir : "tests/data");
    qcal_calib_rules *r1 = NULL, *r2 = NULL;
    assert_int_equal(qcal_calib_rules_load(path, &r1), QCAL_OK);
    assert_int_equal(qcal_calib_rules_load_file(path, &r2), QCAL_OK);
    int64_t n1 = 0, n2 = 0, i1 = -2, i2 = -3;
    assert_int_equal(qcal_calib_rules_count(r1, &n1), QCAL_OK);
    assert_int_equal(qcal_calib_rules_count(r2, &n2), QCAL_OK);
    assert_int_equal(n1, 4);
    assert_int_equal(n2, 4);
    qcal_observer_config c1, c2;
    assert_int_equal(qcal_calib_rules_match(r1, "fc1", QCAL_CALIB_ROLE_ACTIVATION, &c1, &i1),
                     QCAL_OK);
    assert_int_equal(qcal_calib_rules_match(r2, "fc1", QCAL_CALIB_ROLE_ACTIVATION, &c2, &i2),
                     QCAL_OK);
    assert_int_equal(i1, 1);
    assert_int_equal(i2, 1);
    assert_int_equal(c1.kind, c2.kind);
    assert_int_equal(qcal_calib_rules_load("/nonexistent/rules.txt", &r1), QCAL_ERR_NOT_FOUND);
    qcal_calib_rules_destroy(&r1);

    qcal_calib_session_options opt;
    qcal_calib_session_options_default(&opt);
    opt.rules = r2;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&opt, &s), QCAL_OK);
    const float data[6] = { -1.5f, 0.25f, 2.0f, 3.5f, -0.75f, 1.0f };
    const int64_t shape[1] = { 6 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, data, 1, shape), QCAL_OK);
    assert_int_equal(qcal_calib_session_observe(s, "x", QCAL_CALIB_ROLE_ACTIVATION, 0, &t),
                     QCAL_OK);
    qcal_calib_table *tab = NULL;
    assert_int_equal(qcal_calib_session_table(s, &tab), QCAL_OK);
    /* "x" matches rule 3 (minmax): a min/max cache. */
    assert_string_equal(qcal_calib_trt_algorithm(tab), "MinMaxCalibration");
    assert_string_equal(qcal_calib_trt_algorithm(tab), qcal_calib_table_trt_algorithm(tab));
    const qcal_calib_session *cs = s;   /* the readers take a const session */
    int64_t n = 0;
    uint64_t elements = 0;
    assert_int_equal(qcal_calib_session_count(cs, &n), QCAL_OK);
    assert_int_equal(n, 1);
    assert_int_equal(qcal_calib_session_stats(cs, "x", QCAL_CALIB_ROLE_ACTIVATION, NULL,
                                              &elements, NULL, NULL), QCAL_OK);
    assert_int_equal(elements, 6);
    qcal_calib_table_destroy(&tab);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&r2);
}

static qcal_observer *histogram(const char *grid)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(qcal_observer_config_set(&cfg, "grid", grid), QCAL_OK);
    cfg.bins = 64;
    qcal_observer *obs = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    float x[257];
    for (int i = 0; i < 257; i++)
        x[i] = (float)(i % 17) * 0.375f - 2.0f + (float)(i / 64);
    const int64_t shape[1] = { 257 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, shape), QCAL_OK);
    assert_int_equal(qcal_observer_update(obs, &t), QCAL_OK);
    return obs;
}

static void test_histogram(void **state)
{
    (void)state;
    qcal_observer *obs = histogram("lattice");
    const qcal_observer *cobs = obs;
    float lo1[65], hi1[65], lo2[65], hi2[65];
    double e1[65], e2[65];
    int64_t n1 = 0, n2 = 0, k1 = -2, k2 = -3;
    assert_int_equal(qcal_observer_search_curve(cobs, 65, lo1, hi1, e1, &n1, &k1), QCAL_OK);
    assert_int_equal(qcal_observer_histogram_search_curve(cobs, 65, lo2, hi2, e2, &n2, &k2),
                     QCAL_OK);
    assert_true(n1 > 1);
    assert_int_equal(n1, n2);
    assert_int_equal(k1, k2);
    assert_memory_equal(lo1, lo2, (size_t)n1 * sizeof lo1[0]);
    assert_memory_equal(hi1, hi2, (size_t)n1 * sizeof hi1[0]);
    assert_memory_equal(e1, e2, (size_t)n1 * sizeof e1[0]);
    qcal_observer_destroy(&obs);

    obs = histogram("torch");
    float c1[64], c2[64], mn1, mx1, mn2, mx2;
    assert_int_equal(qcal_observer_torch_histogram(obs, 64, c1, &mn1, &mx1, &n1), QCAL_OK);
    assert_int_equal(qcal_observer_histogram_torch_get(obs, 64, c2, &mn2, &mx2, &n2), QCAL_OK);
    assert_int_equal(n1, 64);
    assert_memory_equal(c1, c2, sizeof c1);
    assert_true(mn1 == mn2 && mx1 == mx2);
    assert_true(mn1 == -2.0f && mx1 == 7.0f);
    /* Old setter on a fresh observer, new getter: the same buffers. */
    qcal_observer *o2 = histogram("torch");
    assert_int_equal(qcal_observer_reset(o2), QCAL_OK);
    assert_int_equal(qcal_observer_torch_histogram_set(o2, c1, 64, mn1, mx1), QCAL_OK);
    assert_int_equal(qcal_observer_histogram_torch_get(o2, 64, c2, &mn2, &mx2, &n2), QCAL_OK);
    assert_memory_equal(c1, c2, sizeof c1);
    qcal_qparams q1 = { 0 }, q2 = { 0 };
    assert_int_equal(qcal_observer_qparams(obs, &q1), QCAL_OK);
    assert_int_equal(qcal_observer_qparams(o2, &q2), QCAL_OK);
    assert_true(q1.scale == q2.scale && q1.zero_point == q2.zero_point);
    qcal_observer_destroy(&o2);
    qcal_observer_destroy(&obs);
}

/* The same two-node model through the old builder names (old != 0) or the new ones. */
static qcal_onnx_model *build(int old)
{
    const int64_t dims[2] = { 1, 4 };
    const float w[4] = { 0.5f, -1.0f, 2.0f, 0.125f };
    const char *in[2] = { "x", "w" }, *mid[1] = { "y" }, *out[1] = { "z" };
    qcal_onnx_model *m = NULL;
    int64_t idx = -1;
    if (old) {
        assert_int_equal(qcal_onnx_model_new(8, 13, &m), QCAL_OK);
        assert_int_equal(qcal_onnx_add_input(m, "x", QCAL_ONNX_FLOAT, 2, dims), QCAL_OK);
        assert_int_equal(qcal_onnx_add_initializer_float(m, "w", 2, dims, w), QCAL_OK);
        assert_int_equal(qcal_onnx_add_node(m, "Mul", "mul", 2, in, 1, mid, &idx), QCAL_OK);
        assert_int_equal(qcal_onnx_add_node(m, "Relu", "relu", 1, mid, 1, out, &idx), QCAL_OK);
        assert_int_equal(qcal_onnx_add_output(m, "z", QCAL_ONNX_FLOAT, 2, dims), QCAL_OK);
    } else {
        assert_int_equal(qcal_onnx_model_create(8, 13, &m), QCAL_OK);
        assert_int_equal(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, dims), QCAL_OK);
        assert_int_equal(qcal_onnx_model_add_initializer_float(m, "w", 2, dims, w), QCAL_OK);
        assert_int_equal(qcal_onnx_model_add_node(m, "Mul", "mul", 2, in, 1, mid, &idx),
                         QCAL_OK);
        assert_int_equal(qcal_onnx_model_add_node(m, "Relu", "relu", 1, mid, 1, out, &idx),
                         QCAL_OK);
        assert_int_equal(qcal_onnx_model_add_output(m, "z", QCAL_ONNX_FLOAT, 2, dims), QCAL_OK);
    }
    assert_int_equal(idx, 1);
    return m;
}

static void test_onnx_builder(void **state)
{
    (void)state;
    if (!qcal_onnx_available()) {
        qcal_onnx_model *m = NULL;
        assert_int_equal(qcal_onnx_model_new(8, 13, &m), QCAL_ERR_UNSUPPORTED);
        skip();
    }
    qcal_onnx_model *a = build(1), *b = build(0);
    void *ba = NULL, *bb = NULL;
    size_t la = 0, lb = 0;
    assert_int_equal(qcal_onnx_model_serialize(a, &ba, &la), QCAL_OK);
    assert_int_equal(qcal_onnx_model_serialize(b, &bb, &lb), QCAL_OK);
    assert_true(la > 0);
    assert_int_equal(la, lb);
    assert_memory_equal(ba, bb, la);
    /* Old save, new load and the reverse: the same bytes back. */
    char dir[] = "/tmp/qcal_deprecated_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p1[64], p2[64];
    snprintf(p1, sizeof p1, "%s/old.onnx", dir);
    snprintf(p2, sizeof p2, "%s/new.onnx", dir);
    assert_int_equal(qcal_onnx_model_save(a, NULL, p1), QCAL_OK);
    assert_int_equal(qcal_onnx_model_save_file(b, NULL, p2), QCAL_OK);
    qcal_onnx_model *ra = NULL, *rb = NULL;
    assert_int_equal(qcal_onnx_model_load_file(p1, &ra), QCAL_OK);
    assert_int_equal(qcal_onnx_model_load(p2, &rb), QCAL_OK);
    qcal_onnx_model_info ia, ib;
    assert_int_equal(qcal_onnx_model_get_info(ra, &ia), QCAL_OK);
    assert_int_equal(qcal_onnx_model_get_info(rb, &ib), QCAL_OK);
    assert_int_equal(ia.nodes, 2);
    assert_int_equal(ib.nodes, 2);
    assert_int_equal(ia.opset, 13);
    void *bra = NULL;
    size_t lra = 0;
    assert_int_equal(qcal_onnx_model_serialize(rb, &bra, &lra), QCAL_OK);
    assert_int_equal(lra, la);
    assert_memory_equal(bra, ba, la);
    qcal_free(bra);
    qcal_free(ba);
    qcal_free(bb);
    qcal_onnx_model_destroy(&ra);
    qcal_onnx_model_destroy(&rb);
    qcal_onnx_model_destroy(&a);
    qcal_onnx_model_destroy(&b);
    tu_rm_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_and_dtype),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_rules_and_table),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_onnx_builder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
