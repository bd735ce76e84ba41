/* qcal_onnx_upgrade (opset 9-12 -> 13, and 9-18 -> 19): the structure of every adapter, the
 * one refusal message naming each op at fault (bodies included) with the model unchanged,
 * opsets below 9 and at the target. ONNX Runtime equality of the rewrites:
 * tests/ort/test_upgrade.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "qcal/qcal.h"

#define OK(x) assert_int_equal((x), QCAL_OK)

static void node(qcal_onnx_model *m, const char *op, const char *name, const char *in, const char *in2,
                 const char *out, const char *out2, int64_t *idx)
{
    const char *ins[2] = { in, in2 }, *outs[2] = { out, out2 };
    OK(qcal_onnx_model_add_node(m, op, name, in2 ? 2 : 1, ins, out2 ? 2 : 1, outs, idx));
}

/* Index of the main-graph node named name (-1: none). */
static int64_t find(const qcal_onnx_model *m, const char *name, qcal_onnx_node_info *ni)
{
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    for (int64_t i = 0; i < info.nodes; i++) {
        OK(qcal_onnx_node_at(m, i, ni));
        if (!strcmp(ni->name, name))
            return i;
    }
    return -1;
}

static void expect_ints(const qcal_onnx_model *m, const char *name, int64_t n, const int64_t *want)
{
    int64_t *v = NULL;
    qcal_onnx_tensor_desc d;
    OK(qcal_onnx_initializer_int64(m, name, &v, &d));
    assert_int_equal(d.elem_type, QCAL_ONNX_INT64);
    assert_int_equal(d.ndim, 1);
    assert_int_equal(d.dims[0], n);
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(v[i], want[i]);
    qcal_free(v);
}

static void expect_scalar(const qcal_onnx_model *m, const char *name, float want)
{
    float *v = NULL;
    qcal_onnx_tensor_desc d;
    OK(qcal_onnx_initializer_float(m, name, &v, &d));
    assert_int_equal(d.elem_type, QCAL_ONNX_FLOAT);
    assert_int_equal(d.ndim, 0);
    assert_true(v[0] == want);
    qcal_free(v);
}

static void test_adapters(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(4, 9, &m));
    int64_t d4[4] = { 2, 3, 4, 5 }, i;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, d4));
    const float sc[4] = { 1, 1, 2, 2 };
    int64_t four = 4;
    OK(qcal_onnx_model_add_initializer_float(m, "scales", 1, &four, sc));
    node(m, "Softmax", "sm_flat", "x", NULL, "sm_flat_y", NULL, &i);   /* axis 1 of rank 4 */
    node(m, "Softmax", "sm_last", "x", NULL, "sm_last_y", NULL, &i);
    OK(qcal_onnx_node_set_int(m, i, "axis", 3));
    node(m, "Squeeze", "sq", "x", NULL, "sq_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 0 }));
    node(m, "Squeeze", "sq_all", "x", NULL, "sq_all_y", NULL, NULL);
    node(m, "Unsqueeze", "unsq", "x", NULL, "unsq_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 2, (int64_t[]){ 0, 5 }));
    node(m, "ReduceSum", "rs", "x", NULL, "rs_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 2 }));
    node(m, "ReduceMean", "rm", "x", NULL, "rm_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 2 }));
    node(m, "Split", "sp", "x", NULL, "sp_a", "sp_b", &i);
    OK(qcal_onnx_node_set_ints(m, i, "split", 2, (int64_t[]){ 1, 2 }));
    OK(qcal_onnx_node_set_int(m, i, "axis", 1));
    node(m, "Clip", "clip", "x", NULL, "clip_y", NULL, &i);
    OK(qcal_onnx_node_set_float(m, i, "min", 0.0f));
    OK(qcal_onnx_node_set_float(m, i, "max", 6.0f));
    node(m, "Clip", "clip_hi", "x", NULL, "clip_hi_y", NULL, &i);
    OK(qcal_onnx_node_set_float(m, i, "max", 0.5f));
    node(m, "Slice", "sl", "x", NULL, "sl_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "starts", 1, (int64_t[]){ 1 }));
    OK(qcal_onnx_node_set_ints(m, i, "ends", 1, (int64_t[]){ -1 }));
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 3 }));
    node(m, "Pad", "pad", "x", NULL, "pad_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "pads", 8, (int64_t[]){ 0, 0, 1, 1, 0, 0, 1, 1 }));
    OK(qcal_onnx_node_set_float(m, i, "value", 2.5f));
    node(m, "Dropout", "drop", "x", NULL, "drop_y", "drop_mask", &i);
    OK(qcal_onnx_node_set_float(m, i, "ratio", 0.5f));
    node(m, "TopK", "topk", "x", NULL, "topk_v", "topk_i", &i);
    OK(qcal_onnx_node_set_int(m, i, "k", 2));
    node(m, "Upsample", "up", "x", "scales", "up_y", NULL, NULL);
    node(m, "Scatter", "scat", "x", NULL, "scat_y", NULL, NULL);   /* inputs not checked here */
    const char *outs[] = { "sm_flat_y", "sm_last_y", "sq_y", "unsq_y", "rs_y", "clip_y", "up_y" };
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++)
        OK(qcal_onnx_model_add_output(m, outs[k], QCAL_ONNX_FLOAT, -1, NULL));

    qcal_onnx_upgrade_report rep;
    OK(qcal_onnx_upgrade(m, 13, &rep));
    assert_int_equal(rep.from, 9);
    assert_int_equal(rep.to, 13);
    /* one line per op type: Softmax Squeeze Unsqueeze ReduceSum Split Clip Slice Pad Dropout
     * TopK Upsample Scatter */
    assert_int_equal(rep.n_adapted, 12);
    bool seen = false;
    for (int64_t k = 0; k < rep.n_adapted; k++)
        if (!strncmp(rep.adapted[k], "Softmax: ", 9)) {
            seen = true;
            assert_non_null(strstr(rep.adapted[k], "set explicitly (1 node)"));
            assert_non_null(strstr(rep.adapted[k], "Reshape to Shape(input) (1 node)"));
        }
    assert_true(seen);
    qcal_onnx_upgrade_report_free(&rep);
    assert_null(rep.adapted);

    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.opset, 13);
    assert_int_equal(info.ir_version, 7);

    qcal_onnx_node_info ni;
    int64_t v;
    /* Softmax axis 1 of rank 4: Shape(x), Flatten(x, 1) before, Softmax(-1), Reshape after */
    i = find(m, "sm_flat", &ni);
    assert_true(i >= 2);
    OK(qcal_onnx_node_attr_int(m, i, "axis", &v));
    assert_int_equal(v, -1);
    assert_string_equal(ni.inputs[0], "sm_flat_flat");
    assert_string_equal(ni.outputs[0], "sm_flat_2d");
    int64_t fi = find(m, "sm_flat_flatten", &ni);
    assert_int_equal(fi, i - 1);
    assert_string_equal(ni.op_type, "Flatten");
    assert_string_equal(ni.inputs[0], "x");
    OK(qcal_onnx_node_attr_int(m, fi, "axis", &v));
    assert_int_equal(v, 1);
    assert_int_equal(find(m, "sm_flat_shape_node", &ni), i - 2);
    assert_string_equal(ni.op_type, "Shape");
    assert_int_equal(find(m, "sm_flat_reshape", &ni), i + 1);
    assert_string_equal(ni.op_type, "Reshape");
    assert_string_equal(ni.inputs[0], "sm_flat_2d");
    assert_string_equal(ni.inputs[1], "sm_flat_shape");
    assert_string_equal(ni.outputs[0], "sm_flat_y");
    /* Softmax axis 3 of rank 4: the axis stays, nothing added */
    i = find(m, "sm_last", &ni);
    OK(qcal_onnx_node_attr_int(m, i, "axis", &v));
    assert_int_equal(v, 3);
    assert_string_equal(ni.inputs[0], "x");
    /* axes / split / k / starts... -> int64 inputs, attributes gone */
    i = find(m, "sq", &ni);
    assert_int_equal(ni.n_inputs, 2);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 0 });
    assert_int_equal(qcal_onnx_node_attr_int(m, i, "axes", &v), QCAL_ERR_NOT_FOUND);
    find(m, "sq_all", &ni);
    assert_int_equal(ni.n_inputs, 1);
    find(m, "unsq", &ni);
    expect_ints(m, ni.inputs[1], 2, (int64_t[]){ 0, 5 });
    find(m, "rs", &ni);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 2 });
    find(m, "rm", &ni);   /* ReduceMean keeps its attribute until opset 18 */
    assert_int_equal(ni.n_inputs, 1);
    find(m, "sp", &ni);
    assert_int_equal(ni.n_outputs, 2);
    expect_ints(m, ni.inputs[1], 2, (int64_t[]){ 1, 2 });
    find(m, "clip", &ni);
    assert_int_equal(ni.n_inputs, 3);
    expect_scalar(m, ni.inputs[1], 0.0f);
    expect_scalar(m, ni.inputs[2], 6.0f);
    find(m, "clip_hi", &ni);
    assert_int_equal(ni.n_inputs, 3);
    assert_string_equal(ni.inputs[1], "");
    expect_scalar(m, ni.inputs[2], 0.5f);
    find(m, "sl", &ni);
    assert_int_equal(ni.n_inputs, 4);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 1 });
    expect_ints(m, ni.inputs[2], 1, (int64_t[]){ -1 });
    expect_ints(m, ni.inputs[3], 1, (int64_t[]){ 3 });
    find(m, "pad", &ni);
    assert_int_equal(ni.n_inputs, 3);
    expect_ints(m, ni.inputs[1], 8, (int64_t[]){ 0, 0, 1, 1, 0, 0, 1, 1 });
    expect_scalar(m, ni.inputs[2], 2.5f);
    find(m, "drop", &ni);
    assert_string_equal(ni.op_type, "Identity");
    assert_int_equal(ni.n_outputs, 1);
    assert_string_equal(ni.outputs[0], "drop_y");
    find(m, "topk", &ni);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 2 });
    find(m, "scat", &ni);
    assert_string_equal(ni.op_type, "ScatterElements");
    i = find(m, "up", &ni);
    assert_string_equal(ni.op_type, "Resize");
    assert_int_equal(ni.n_inputs, 3);
    assert_string_equal(ni.inputs[1], "");
    assert_string_equal(ni.inputs[2], "scales");
    void *buf;
    size_t len;
    OK(qcal_onnx_model_serialize(m, &buf, &len));   /* the strings set are well-formed */
    qcal_onnx_model *back = NULL;
    OK(qcal_onnx_model_parse(buf, len, &back));
    qcal_free(buf);
    qcal_onnx_model_destroy(&back);
    qcal_onnx_model_destroy(&m);
}

/* Serialized bytes of m (for "unchanged"). */
static void bytes_of(const qcal_onnx_model *m, void **buf, size_t *len)
{
    OK(qcal_onnx_model_serialize(m, buf, len));
}

static void test_refusal(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 9, &m));
    int64_t d2[2] = { 2, 3 }, i;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, d2));
    OK(qcal_onnx_model_add_input(m, "c", 9 /* bool */, 0, NULL));
    node(m, "Softmax", "sm", "x", NULL, "a", NULL, NULL);   /* adaptable, must stay as is */
    node(m, "OneHot", "oh1", "x", NULL, "b", NULL, NULL);
    node(m, "FancyOp", "f", "x", NULL, "e", NULL, NULL);
    node(m, "Dropout", "drop", "x", NULL, "g", "mask", NULL);
    node(m, "Relu", "r", "mask", NULL, "h", NULL, NULL);     /* the mask is read */
    /* an If whose then-branch holds the second OneHot */
    qcal_onnx_model *body = NULL;
    OK(qcal_onnx_model_create(8, 9, &body));
    node(body, "OneHot", "oh2", "x", NULL, "t", NULL, NULL);
    OK(qcal_onnx_model_add_output(body, "t", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_model *other = NULL;
    OK(qcal_onnx_model_create(8, 9, &other));
    node(other, "Identity", "id", "x", NULL, "u", NULL, NULL);
    OK(qcal_onnx_model_add_output(other, "u", QCAL_ONNX_FLOAT, -1, NULL));
    node(m, "If", "if", "c", NULL, "y", NULL, &i);
    OK(qcal_onnx_node_set_graph(m, i, "then_branch", &body));
    OK(qcal_onnx_node_set_graph(m, i, "else_branch", &other));
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    void *before, *after;
    size_t blen, alen;
    bytes_of(m, &before, &blen);
    qcal_onnx_upgrade_report rep = { .from = 77 };
    assert_int_equal(qcal_onnx_upgrade(m, 13, &rep), QCAL_ERR_UNSUPPORTED);
    assert_int_equal(rep.from, 77);   /* untouched on failure */
    const char *msg = qcal_last_error();
    assert_non_null(strstr(msg, "cannot raise opset 9 to 13: "));
    assert_non_null(strstr(msg, "OneHot (2 nodes: negative indices count from the end since OneHot-11)"));
    assert_non_null(strstr(msg, "FancyOp (1 node: not an ONNX op qcal knows)"));
    assert_non_null(strstr(msg, "Dropout (1 node: its mask output is read)"));
    assert_non_null(strstr(msg, "changed meaning and qcal does not adapt them"));
    assert_null(strstr(msg, "Softmax"));
    bytes_of(m, &after, &alen);
    assert_int_equal(alen, blen);
    assert_memory_equal(after, before, blen);
    qcal_free(after);
    /* targets outside 13..19, and no rep */
    assert_int_equal(qcal_onnx_upgrade(m, 20, NULL), QCAL_ERR_UNSUPPORTED);
    assert_non_null(strstr(qcal_last_error(), "opsets 13 to 19"));
    assert_int_equal(qcal_onnx_upgrade(m, 12, NULL), QCAL_ERR_UNSUPPORTED);
    bytes_of(m, &after, &alen);
    assert_memory_equal(after, before, blen);
    qcal_free(after);
    qcal_free(before);
    qcal_onnx_model_destroy(&m);

    /* below 9: named */
    OK(qcal_onnx_model_create(8, 8, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, d2));
    node(m, "Relu", "r", "x", NULL, "y", NULL, NULL);
    assert_int_equal(qcal_onnx_upgrade(m, 13, NULL), QCAL_ERR_UNSUPPORTED);
    assert_non_null(strstr(qcal_last_error(), "cannot raise opset 8 to 13"));
    qcal_onnx_model_destroy(&m);

    /* at 13 and above: nothing to do, from == to */
    OK(qcal_onnx_model_create(8, 17, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, d2));
    node(m, "Softmax", "s", "x", NULL, "y", NULL, NULL);
    bytes_of(m, &before, &blen);
    OK(qcal_onnx_upgrade(m, 13, &rep));
    assert_int_equal(rep.from, 17);
    assert_int_equal(rep.to, 17);
    assert_int_equal(rep.n_adapted, 0);
    qcal_onnx_upgrade_report_free(&rep);
    bytes_of(m, &after, &alen);
    assert_int_equal(alen, blen);
    assert_memory_equal(after, before, blen);
    qcal_free(before);
    qcal_free(after);
    qcal_onnx_model_destroy(&m);
    qcal_onnx_upgrade_report_free(NULL);
}

/* Bodies are raised too; new names never collide with existing ones. */
static void test_bodies_and_names(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 11, &m));
    int64_t d2[2] = { 2, 1 }, i, one = 1, zero = 0;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, d2));
    OK(qcal_onnx_model_add_input(m, "c", 9, 0, NULL));
    OK(qcal_onnx_model_add_initializer_int64(m, "sq_axes", 1, &one, &zero));   /* the name the adapter wants */
    node(m, "Squeeze", "sq", "x", NULL, "s", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    qcal_onnx_model *body = NULL, *other = NULL;
    OK(qcal_onnx_model_create(8, 11, &body));
    node(body, "Unsqueeze", "unsq", "s", NULL, "t", NULL, &i);
    OK(qcal_onnx_node_set_ints(body, i, "axes", 1, (int64_t[]){ 0 }));
    OK(qcal_onnx_model_add_output(body, "t", QCAL_ONNX_FLOAT, -1, NULL));
    OK(qcal_onnx_model_create(8, 11, &other));
    node(other, "Identity", "id", "x", NULL, "u", NULL, NULL);
    OK(qcal_onnx_model_add_output(other, "u", QCAL_ONNX_FLOAT, -1, NULL));
    node(m, "If", "if", "c", NULL, "y", NULL, &i);
    OK(qcal_onnx_node_set_graph(m, i, "then_branch", &body));
    OK(qcal_onnx_node_set_graph(m, i, "else_branch", &other));
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_upgrade_report rep;
    OK(qcal_onnx_upgrade(m, 13, &rep));
    assert_int_equal(rep.n_adapted, 2);   /* Squeeze (main), Unsqueeze (body) */
    assert_non_null(strstr(rep.adapted[0], "Unsqueeze: axes attribute -> int64 input (1 node)"));
    assert_non_null(strstr(rep.adapted[1], "Squeeze: axes attribute -> int64 input (1 node)"));
    qcal_onnx_upgrade_report_free(&rep);
    qcal_onnx_node_info ni;
    find(m, "sq", &ni);
    assert_string_equal(ni.inputs[1], "sq_axes_1");
    expect_ints(m, "sq_axes_1", 1, (int64_t[]){ 1 });
    expect_ints(m, "sq_axes", 1, (int64_t[]){ 0 });   /* untouched */
    /* the body's adapter: a round trip through the checks of the loader */
    void *buf;
    size_t len;
    OK(qcal_onnx_model_serialize(m, &buf, &len));
    qcal_onnx_model *back = NULL;
    OK(qcal_onnx_model_parse(buf, len, &back));
    assert_non_null(memmem(buf, len, "unsq_axes", 9));
    qcal_free(buf);
    qcal_onnx_model_destroy(&back);
    qcal_onnx_model_destroy(&m);
}

/* Serialized m holds the bytes of s (a string attribute's value). */
static bool has_bytes(const qcal_onnx_model *m, const char *s)
{
    void *buf;
    size_t len;
    OK(qcal_onnx_model_serialize(m, &buf, &len));
    bool found = memmem(buf, len, s, strlen(s)) != NULL;
    qcal_free(buf);
    return found;
}

/* Opset 13 -> 19: Reduce*-18 axes attribute -> input, Split-18 num_outputs, RoiAlign-16's
 * mode; compatible ops kept as they are. */
static void test_to19_adapters(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(7, 13, &m));
    int64_t d4[4] = { 2, 4, 4, 6 }, i, v;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, d4));
    node(m, "ReduceMean", "rm", "x", NULL, "rm_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 2, (int64_t[]){ 2, -1 }));
    OK(qcal_onnx_node_set_int(m, i, "keepdims", 0));
    node(m, "ReduceMax", "rmax", "x", NULL, "rmax_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    node(m, "ReduceL2", "rl2_all", "x", NULL, "rl2_y", NULL, NULL);   /* no axes: every axis, kept */
    node(m, "Split", "sp_eq", "x", NULL, "sp_a", "sp_b", &i);
    OK(qcal_onnx_node_set_int(m, i, "axis", 1));
    int64_t two = 2, sizes[2] = { 1, 3 };
    OK(qcal_onnx_model_add_initializer_int64(m, "sizes", 1, &two, sizes));
    node(m, "Split", "sp_sz", "x", "sizes", "sp_c", "sp_d", &i);
    OK(qcal_onnx_node_set_int(m, i, "axis", 1));
    node(m, "RoiAlign", "roi", "x", NULL, "roi_y", NULL, NULL);   /* inputs not checked here */
    node(m, "Relu", "r", "x", NULL, "r_y", NULL, NULL);
    node(m, "Reshape", "rs", "x", "sizes", "rs_y", NULL, NULL);
    node(m, "BatchNormalization", "bn", "x", NULL, "bn_y", NULL, NULL);
    node(m, "Pad", "pad", "x", "sizes", "pad_y", NULL, NULL);
    OK(qcal_onnx_model_add_output(m, "rm_y", QCAL_ONNX_FLOAT, -1, NULL));

    qcal_onnx_upgrade_report rep;
    OK(qcal_onnx_upgrade(m, 19, &rep));
    assert_int_equal(rep.from, 13);
    assert_int_equal(rep.to, 19);
    /* ReduceMean, ReduceMax, Split, RoiAlign */
    assert_int_equal(rep.n_adapted, 4);
    assert_string_equal(rep.adapted[0], "ReduceMean: axes attribute -> int64 input (1 node)");
    assert_string_equal(rep.adapted[2], "Split: equal split: num_outputs set to the number of outputs (1 node)");
    assert_non_null(strstr(rep.adapted[3], "RoiAlign: coordinate_transformation_mode output_half_pixel"));
    qcal_onnx_upgrade_report_free(&rep);
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.opset, 19);
    assert_int_equal(info.ir_version, 9);

    qcal_onnx_node_info ni;
    i = find(m, "rm", &ni);
    assert_int_equal(ni.n_inputs, 2);
    expect_ints(m, ni.inputs[1], 2, (int64_t[]){ 2, -1 });
    assert_int_equal(qcal_onnx_node_attr_int(m, i, "axes", &v), QCAL_ERR_NOT_FOUND);
    OK(qcal_onnx_node_attr_int(m, i, "keepdims", &v));
    assert_int_equal(v, 0);
    find(m, "rmax", &ni);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 1 });
    find(m, "rl2_all", &ni);
    assert_int_equal(ni.n_inputs, 1);
    i = find(m, "sp_eq", &ni);
    assert_int_equal(ni.n_inputs, 1);
    OK(qcal_onnx_node_attr_int(m, i, "num_outputs", &v));
    assert_int_equal(v, 2);
    i = find(m, "sp_sz", &ni);
    assert_int_equal(qcal_onnx_node_attr_int(m, i, "num_outputs", &v), QCAL_ERR_NOT_FOUND);
    assert_true(has_bytes(m, "output_half_pixel"));
    find(m, "r", &ni);
    assert_string_equal(ni.op_type, "Relu");
    qcal_onnx_model_destroy(&m);
}

/* Opset 9 -> 19 in one call: step 1's adapters (Upsample -> Resize, Squeeze axes) then step
 * 2's (ReduceMean axes), one report line per op type. */
static void test_to19_from9(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(4, 9, &m));
    int64_t d4[4] = { 1, 2, 1, 3 }, four = 4, i;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, d4));
    OK(qcal_onnx_model_add_initializer_float(m, "scales", 1, &four, (const float[]){ 1, 1, 2, 2 }));
    node(m, "Upsample", "up", "x", "scales", "up_y", NULL, NULL);
    node(m, "ReduceMean", "rm", "up_y", NULL, "rm_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    node(m, "Squeeze", "sq", "rm_y", NULL, "sq_y", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    node(m, "Dropout", "drop", "sq_y", NULL, "y", NULL, NULL);
    OK(qcal_onnx_model_add_output(m, "y", QCAL_ONNX_FLOAT, -1, NULL));
    qcal_onnx_upgrade_report rep;
    OK(qcal_onnx_upgrade(m, 19, &rep));
    assert_int_equal(rep.from, 9);
    assert_int_equal(rep.to, 19);
    assert_int_equal(rep.n_adapted, 4);   /* Upsample, ReduceMean, Squeeze, Dropout */
    assert_string_equal(rep.adapted[3], "ReduceMean: axes attribute -> int64 input (1 node)");   /* step 2 last */
    qcal_onnx_upgrade_report_free(&rep);
    qcal_onnx_node_info ni;
    find(m, "up", &ni);
    assert_string_equal(ni.op_type, "Resize");
    find(m, "rm", &ni);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 1 });
    find(m, "sq", &ni);
    expect_ints(m, ni.inputs[1], 1, (int64_t[]){ 1 });
    find(m, "drop", &ni);
    assert_string_equal(ni.op_type, "Identity");
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.opset, 19);
    assert_int_equal(info.ir_version, 9);
    qcal_onnx_model_destroy(&m);
}

/* What 13 -> 19 cannot adapt, named in one message with step 1's refusals, before any
 * change; 18 -> 19 and 13 -> 17 (no Reduce change before 18). */
static void test_to19_refusal(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(6, 11, &m));
    int64_t d4[4] = { 1, 2, 3, 4 }, i;
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, d4));
    node(m, "ReduceMean", "rm", "x", NULL, "a", NULL, &i);   /* adaptable, must stay as is */
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    node(m, "Dropout", "drop", "x", NULL, "b", "mask", NULL); /* step 1: the mask is read */
    node(m, "Relu", "r", "mask", NULL, "b2", NULL, NULL);
    node(m, "Resize", "rz", "x", NULL, "c", NULL, &i);         /* step 2: gone in Resize-18 */
    OK(qcal_onnx_node_set_string(m, i, "coordinate_transformation_mode", "tf_half_pixel_for_nn"));
    node(m, "BatchNormalization", "bn", "x", NULL, "d", "bn_mean", NULL);   /* training output */
    node(m, "FancyOp", "f", "x", NULL, "e", NULL, NULL);      /* both steps: counted once */
    OK(qcal_onnx_model_add_output(m, "a", QCAL_ONNX_FLOAT, -1, NULL));
    void *before, *after;
    size_t blen, alen;
    bytes_of(m, &before, &blen);
    qcal_onnx_upgrade_report rep = { .from = 77 };
    assert_int_equal(qcal_onnx_upgrade(m, 19, &rep), QCAL_ERR_UNSUPPORTED);
    assert_int_equal(rep.from, 77);
    const char *msg = qcal_last_error();
    assert_non_null(strstr(msg, "cannot raise opset 11 to 19: "));
    assert_non_null(strstr(msg, "Dropout (1 node: its mask output is read)"));
    assert_non_null(strstr(msg, "Resize (1 node: coordinate_transformation_mode tf_half_pixel_for_nn is not in Resize-18)"));
    assert_non_null(strstr(msg, "BatchNormalization (1 node: its training outputs"));
    assert_non_null(strstr(msg, "FancyOp (1 node: not an ONNX op qcal knows)"));
    assert_null(strstr(msg, "ReduceMean"));
    bytes_of(m, &after, &alen);
    assert_int_equal(alen, blen);
    assert_memory_equal(after, before, blen);
    qcal_free(after);
    qcal_free(before);
    /* to 13 the same model fails on Dropout and FancyOp only */
    assert_int_equal(qcal_onnx_upgrade(m, 13, NULL), QCAL_ERR_UNSUPPORTED);
    assert_null(strstr(qcal_last_error(), "Resize"));
    qcal_onnx_model_destroy(&m);

    /* 13 -> 17: ReduceMean keeps its attribute (axes became an input at 18) */
    OK(qcal_onnx_model_create(7, 13, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 4, d4));
    node(m, "ReduceMean", "rm", "x", NULL, "a", NULL, &i);
    OK(qcal_onnx_node_set_ints(m, i, "axes", 1, (int64_t[]){ 1 }));
    OK(qcal_onnx_upgrade(m, 17, &rep));
    assert_int_equal(rep.to, 17);
    assert_int_equal(rep.n_adapted, 0);
    qcal_onnx_upgrade_report_free(&rep);
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(m, &info));
    assert_int_equal(info.opset, 17);
    assert_int_equal(info.ir_version, 8);
    qcal_onnx_node_info ni;
    find(m, "rm", &ni);
    assert_int_equal(ni.n_inputs, 1);
    qcal_onnx_model_destroy(&m);
}

int main(void)
{
    if (!qcal_onnx_available()) {
        printf("skipping: qcal was built without ONNX support (meson -Donnx)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapters),
        cmocka_unit_test(test_refusal),
        cmocka_unit_test(test_bodies_and_names),
        cmocka_unit_test(test_to19_adapters),
        cmocka_unit_test(test_to19_from9),
        cmocka_unit_test(test_to19_refusal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
