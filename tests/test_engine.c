/* ort.engine: qcal/engine.h against ONNX Runtime 1.30 (onnxruntime-node's libonnxruntime.so.1
 * from the npm cache, which ./run.sh test installs; one line and exit 77 without it). Models
 * are built with qcal's ONNX builder: Y = Relu(X W + B) with Shape(Y) beside it, an input
 * that is also an output (ONNX Runtime hands the caller's buffer back: qcal copies it), a
 * Cast to bool. Outputs are compared with values computed here (exact: small integers as
 * floats), declared types and shapes with the model's, every refusal with its status and
 * message; a session runs on two threads at once; ONNX Runtime prints nothing to stderr. */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/qcal.h"
#include "qcal/numeric_eval.h"
#include "qcal/model_calib.h"
#include "testutil.h"

#define OK(x) assert_int_equal((x), QCAL_OK)

static char tmpdir[64];
static char npm_version[64];

static void expect_error(qcal_status got, qcal_status want, const char *needle)
{
    if (got != want || !strstr(qcal_last_error(), needle))
        fail_msg("status %d (want %d), message \"%s\" (want \"%s\")", got, want,
                 qcal_last_error(), needle);
}

static qcal_engine *open_engine(void)
{
    qcal_engine *e = NULL;
    OK(qcal_engine_open(NULL, &e));
    return e;
}

/* The serialized model m (freed with qcal_free); m destroyed. */
static void *serialize(qcal_onnx_model **m, size_t *len)
{
    void *buf = NULL;
    OK(qcal_onnx_model_serialize(*m, &buf, len));
    qcal_onnx_model_destroy(m);
    return buf;
}

/* X float [N, 3] -> MatMul W [3, 2] -> Add B [2] -> Relu -> Y float [N, 2]; S = Shape(Y),
 * int64 [2]. An initializer no node reads (ONNX Runtime warns "Removing initializer"). */
static const float W[6] = { 1, -2, 0, 3, 2, 1 };
static const float B[2] = { 0.5f, -1 };

static void *mlp_model(size_t *len)
{
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t xd[2] = { -1, 3 }, yd[2] = { -1, 2 }, wd[2] = { 3, 2 }, bd[1] = { 2 }, sd[1] = { 2 };
    OK(qcal_onnx_model_add_input(m, "X", QCAL_ONNX_FLOAT, 2, xd));
    OK(qcal_onnx_model_add_output(m, "Y", QCAL_ONNX_FLOAT, 2, yd));
    OK(qcal_onnx_model_add_output(m, "S", QCAL_ONNX_INT64, 1, sd));
    OK(qcal_onnx_model_add_initializer_float(m, "W", 2, wd, W));
    OK(qcal_onnx_model_add_initializer_float(m, "B", 1, bd, B));
    float unused[2] = { 7, 7 };
    OK(qcal_onnx_model_add_initializer_float(m, "unused", 1, bd, unused));
    const char *mm_in[2] = { "X", "W" }, *mm_out[1] = { "XW" };
    const char *add_in[2] = { "XW", "B" }, *add_out[1] = { "Z" };
    const char *relu_in[1] = { "Z" }, *relu_out[1] = { "Y" };
    const char *shape_in[1] = { "Y" }, *shape_out[1] = { "S" };
    OK(qcal_onnx_model_add_node(m, "MatMul", "mm", 2, mm_in, 1, mm_out, NULL));
    OK(qcal_onnx_model_add_node(m, "Add", "add", 2, add_in, 1, add_out, NULL));
    OK(qcal_onnx_model_add_node(m, "Relu", "relu", 1, relu_in, 1, relu_out, NULL));
    OK(qcal_onnx_model_add_node(m, "Shape", "shape", 1, shape_in, 1, shape_out, NULL));
    return serialize(&m, len);
}

/* mlp_model as a model handle (destroy it). */
static qcal_onnx_model *mlp_parsed(void)
{
    size_t len;
    void *bytes = mlp_model(&len);
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_parse(bytes, len, &m));
    qcal_free(bytes);
    return m;
}

static void mlp_ref(const float *x, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < 2; j++) {
            float acc = 0;
            for (int k = 0; k < 3; k++)
                acc += x[i * 3 + k] * W[k * 2 + j];
            acc += B[j];
            y[i * 2 + j] = acc > 0 ? acc : 0;
        }
}

static qcal_engine_value value(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                               const void *data, size_t nbytes)
{
    qcal_engine_value v;
    memset(&v, 0, sizeof v);
    v.name = name;
    v.elem_type = type;
    v.ndim = ndim;
    for (int k = 0; k < ndim; k++)
        v.dims[k] = dims[k];
    v.data = data;
    v.nbytes = nbytes;
    return v;
}

static void test_open_version(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    const char *v = qcal_engine_version(e);
    assert_non_null(v);
    assert_true(v[0] >= '1' && v[0] <= '9');
    if (npm_version[0] && strncmp(v, npm_version, strlen(npm_version)) != 0)
        fail_msg("ONNX Runtime says version '%s', the npm package '%s'", v, npm_version);
    const char *lib = qcal_engine_library(e);
    assert_non_null(lib);
    assert_non_null(strstr(lib, "libonnxruntime.so.1"));
    assert_true(lib[0] == '/');   /* the real path the loader used */
    qcal_engine_close(&e);
    assert_null(e);
    qcal_engine_close(&e);        /* NULL handle and NULL pointer are fine */
    qcal_engine_close(NULL);
    qcal_engine_session_destroy(NULL);
    qcal_engine_outputs_free(NULL);
    /* Two engines at once (ONNX Runtime's environment is shared), opened and closed again. */
    qcal_engine *a = open_engine(), *b = open_engine();
    qcal_engine_close(&a);
    qcal_engine_close(&b);
}

static void test_elem_types(void **state)
{
    (void)state;
    assert_int_equal(qcal_engine_elem_size(QCAL_ONNX_FLOAT), 4);
    assert_int_equal(qcal_engine_elem_size(QCAL_ONNX_INT64), 8);
    assert_int_equal(qcal_engine_elem_size(9), 1);
    assert_int_equal(qcal_engine_elem_size(QCAL_ONNX_FLOAT16), 2);
    assert_int_equal(qcal_engine_elem_size(QCAL_ONNX_BFLOAT16), 2);
    assert_int_equal(qcal_engine_elem_size(8), 0);    /* string */
    assert_int_equal(qcal_engine_elem_size(0), 0);
    assert_string_equal(qcal_engine_elem_name(QCAL_ONNX_FLOAT), "float32");
    assert_string_equal(qcal_engine_elem_name(9), "bool");
    assert_string_equal(qcal_engine_elem_name(999), "unknown");
}

static void test_library_search(void **state)
{
    (void)state;
    qcal_engine *e = NULL;
    qcal_engine_options opt;
    qcal_engine_options_default(&opt);
    assert_null(opt.library);

    /* A file that is not a shared library: the only place tried, dlopen's reason given. */
    char *notlib = tu_path(tmpdir, "notlib.so");
    tu_write_bytes(notlib, "not an ELF file\n", 16);
    opt.library = notlib;
    expect_error(qcal_engine_open(&opt, &e), QCAL_ERR_NOT_FOUND, notlib);
    assert_non_null(strstr(qcal_last_error(), "./run.sh installs onnxruntime-node@1.30.0"));
    assert_null(strstr(qcal_last_error(), "libonnxruntime.so.1 ("));   /* nothing else tried */
    assert_null(e);

    /* A shared library that is not ONNX Runtime. */
    if (access("/lib/x86_64-linux-gnu/libz.so.1", R_OK) == 0) {
        opt.library = "/lib/x86_64-linux-gnu/libz.so.1";
        expect_error(qcal_engine_open(&opt, &e), QCAL_ERR_UNSUPPORTED, "is not ONNX Runtime");
        assert_non_null(strstr(qcal_last_error(), "libz.so.1"));
        assert_null(e);
    }

    /* $QCAL_ORT_LIB: the only place tried when set. */
    setenv("QCAL_ORT_LIB", "/nonexistent/libonnxruntime.so.1", 1);
    expect_error(qcal_engine_open(NULL, &e), QCAL_ERR_NOT_FOUND, "$QCAL_ORT_LIB: /nonexistent/");
    unsetenv("QCAL_ORT_LIB");
    assert_null(e);

    /* Loader path, then the npm cache ($QCAL_NPM_DIR): both named with their reasons. */
    char *old = getenv("QCAL_NPM_DIR") ? strdup(getenv("QCAL_NPM_DIR")) : NULL;
    setenv("QCAL_NPM_DIR", "/nonexistent-npm", 1);
    qcal_status st = qcal_engine_open(NULL, &e);
    if (st == QCAL_OK) {   /* ONNX Runtime on the loader's path: nothing more to check */
        qcal_engine_close(&e);
    } else {
        expect_error(st, QCAL_ERR_NOT_FOUND, "libonnxruntime.so.1 (");
        assert_non_null(strstr(qcal_last_error(), "/nonexistent-npm/node_modules/onnxruntime-node"
                                                  "/bin/napi-v6/linux/x64/libonnxruntime.so.1 ("));
        assert_non_null(strstr(qcal_last_error(), "QCAL_ORT_LIB"));
    }
    if (old) {
        setenv("QCAL_NPM_DIR", old, 1);
        free(old);
    } else {
        unsetenv("QCAL_NPM_DIR");
    }

    /* The library given by path works too. */
    qcal_engine *d = open_engine();
    opt.library = qcal_engine_library(d);
    OK(qcal_engine_open(&opt, &e));
    assert_string_equal(qcal_engine_library(e), qcal_engine_library(d));
    qcal_engine_close(&e);
    qcal_engine_close(&d);
}

/* A session without the CPU arena gives the same values; an output released early reads
 * back empty while the others stay. */
static void test_release_and_arena(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    size_t len;
    void *model = mlp_model(&len);
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    assert_true(so.cpu_arena);
    so.cpu_arena = false;
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, model, len, &so, &s));
    qcal_free(model);
    float x[12] = { 1, 2, 3, -1, 0, 4, 2, 2, -5, 0, 0, 0 }, want[8];
    mlp_ref(x, 4, want);
    int64_t xd[2] = { 4, 3 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x);
    qcal_engine_outputs *out = NULL;
    OK(qcal_engine_session_run(s, &in, 1, NULL, 0, &out));
    qcal_engine_value y, sh;
    OK(qcal_engine_outputs_at(out, 0, &y));
    assert_memory_equal(y.data, want, sizeof want);
    OK(qcal_engine_outputs_release(out, 0));
    OK(qcal_engine_outputs_release(out, 0));   /* twice: nothing more to free */
    OK(qcal_engine_outputs_at(out, 0, &y));
    assert_null(y.data);
    assert_int_equal(y.nbytes, 0);
    assert_string_equal(y.name, "Y");
    OK(qcal_engine_outputs_at(out, 1, &sh));
    assert_int_equal(((const int64_t *)sh.data)[0], 4);
    assert_int_equal(((const int64_t *)sh.data)[1], 2);
    expect_error(qcal_engine_outputs_release(out, 2), QCAL_ERR_INVALID_ARG, "output 2");
    expect_error(qcal_engine_outputs_release(NULL, 0), QCAL_ERR_INVALID_ARG, "NULL");
    qcal_engine_outputs_free(&out);
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
}

static void test_io_and_run(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    size_t len;
    void *model = mlp_model(&len);
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, model, len, NULL, &s));
    qcal_free(model);   /* the session keeps nothing of the buffer */

    assert_int_equal(qcal_engine_session_input_count(s), 1);
    assert_int_equal(qcal_engine_session_output_count(s), 2);
    qcal_engine_io io;
    OK(qcal_engine_session_input(s, 0, &io));
    assert_string_equal(io.name, "X");
    assert_int_equal(io.elem_type, QCAL_ONNX_FLOAT);
    assert_int_equal(io.ndim, 2);
    assert_int_equal(io.dims[0], -1);
    assert_int_equal(io.dims[1], 3);
    OK(qcal_engine_session_output(s, 0, &io));
    assert_string_equal(io.name, "Y");
    assert_int_equal(io.elem_type, QCAL_ONNX_FLOAT);
    assert_int_equal(io.ndim, 2);
    assert_int_equal(io.dims[0], -1);
    assert_int_equal(io.dims[1], 2);
    OK(qcal_engine_session_output(s, 1, &io));
    assert_string_equal(io.name, "S");
    assert_int_equal(io.elem_type, QCAL_ONNX_INT64);
    assert_int_equal(io.ndim, 1);
    assert_int_equal(io.dims[0], 2);
    expect_error(qcal_engine_session_output(s, 2, &io), QCAL_ERR_INVALID_ARG, "output 2");
    expect_error(qcal_engine_session_input(s, -1, &io), QCAL_ERR_INVALID_ARG, "input -1");
    assert_int_equal(qcal_engine_session_input_count(NULL), 0);

    float x[12] = { 1, 2, 3, -1, 0, 4, 2, 2, -5, 0, 0, 0 }, want[8];
    mlp_ref(x, 4, want);
    int64_t xd[2] = { 4, 3 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x);
    qcal_engine_outputs *out = NULL;
    OK(qcal_engine_session_run(s, &in, 1, NULL, 0, &out));
    assert_int_equal(qcal_engine_outputs_count(out), 2);
    qcal_engine_value y, sh;
    OK(qcal_engine_outputs_at(out, 0, &y));
    OK(qcal_engine_outputs_at(out, 1, &sh));
    assert_string_equal(y.name, "Y");
    assert_int_equal(y.elem_type, QCAL_ONNX_FLOAT);
    assert_int_equal(y.ndim, 2);
    assert_int_equal(y.dims[0], 4);
    assert_int_equal(y.dims[1], 2);
    assert_int_equal(y.nbytes, sizeof want);
    assert_memory_equal(y.data, want, sizeof want);
    assert_string_equal(sh.name, "S");
    assert_int_equal(sh.elem_type, QCAL_ONNX_INT64);
    assert_int_equal(sh.ndim, 1);
    assert_int_equal(sh.dims[0], 2);
    assert_int_equal(sh.nbytes, 16);
    const int64_t *sv = sh.data;
    assert_int_equal(sv[0], 4);
    assert_int_equal(sv[1], 2);
    expect_error(qcal_engine_outputs_at(out, 2, &y), QCAL_ERR_INVALID_ARG, "output 2");
    qcal_engine_outputs_free(&out);
    assert_null(out);

    /* One output by name; a batch of 0 rows. */
    const char *only_s[1] = { "S" };
    xd[0] = 0;
    in = value("X", QCAL_ONNX_FLOAT, 2, xd, NULL, 0);
    OK(qcal_engine_session_run(s, &in, 1, only_s, 1, &out));
    assert_int_equal(qcal_engine_outputs_count(out), 1);
    OK(qcal_engine_outputs_at(out, 0, &sh));
    assert_string_equal(sh.name, "S");
    sv = sh.data;
    assert_int_equal(sv[0], 0);
    assert_int_equal(sv[1], 2);
    qcal_engine_outputs_free(&out);

    /* Refusals, each before ONNX Runtime runs; *out untouched. */
    int64_t xi[12] = { 0 };
    xd[0] = 4;
    in = value("X", QCAL_ONNX_INT64, 2, xd, xi, sizeof xi);
    expect_error(qcal_engine_session_run(s, &in, 1, NULL, 0, &out), QCAL_ERR_MISMATCH,
                 "input 'X': the model takes float32 [d0, 3] (d0 dynamic), given int64 [4, 3]");
    assert_null(out);
    int64_t xd3[3] = { 1, 4, 3 };
    in = value("X", QCAL_ONNX_FLOAT, 3, xd3, x, sizeof x);
    expect_error(qcal_engine_session_run(s, &in, 1, NULL, 0, &out), QCAL_ERR_MISMATCH,
                 "input 'X': the model takes float32 [d0, 3] (d0 dynamic), given float32 [1, 4, 3]");
    int64_t xd4[2] = { 3, 4 };
    in = value("X", QCAL_ONNX_FLOAT, 2, xd4, x, sizeof x);
    expect_error(qcal_engine_session_run(s, &in, 1, NULL, 0, &out), QCAL_ERR_MISMATCH,
                 "given float32 [3, 4]");
    in = value("X", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x - 4);
    expect_error(qcal_engine_session_run(s, &in, 1, NULL, 0, &out), QCAL_ERR_MISMATCH,
                 "input 'X': float32 [4, 3] is 48 bytes, given 44");
    expect_error(qcal_engine_session_run(s, NULL, 0, NULL, 0, &out), QCAL_ERR_MISMATCH,
                 "input 'X' (float32 [d0, 3] (d0 dynamic)) is not given");
    qcal_engine_value two[2] = { value("X", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x),
                                 value("Q", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x) };
    expect_error(qcal_engine_session_run(s, two, 2, NULL, 0, &out), QCAL_ERR_NOT_FOUND,
                 "input 'Q': the model has no such input (its inputs: 'X')");
    two[1].name = "X";
    expect_error(qcal_engine_session_run(s, two, 2, NULL, 0, &out), QCAL_ERR_INVALID_ARG,
                 "input 'X' is given twice");
    const char *bad_out[2] = { "Y", "nope" };
    expect_error(qcal_engine_session_run(s, two, 1, bad_out, 2, &out), QCAL_ERR_NOT_FOUND,
                 "output 'nope': the model has no such output (its outputs: 'Y', 'S')");
    assert_null(out);

    qcal_engine_session_destroy(&s);
    assert_null(s);
    qcal_engine_close(&e);
}

/* A failure inside ONNX Runtime (MatMul of [1, 4] by [3, 2]: X declared [?, ?]): its message
 * passed through as QCAL_ERR_BACKEND. */
static void test_backend_errors(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    qcal_engine_session *s = NULL;
    expect_error(qcal_engine_session_create(e, "not a model at all", 18, NULL, &s),
                 QCAL_ERR_BACKEND, "ONNX Runtime refused the model: ");
    assert_null(s);
    expect_error(qcal_engine_session_create_file(e, tu_path(tmpdir, "missing.onnx"), NULL, &s),
                 QCAL_ERR_BACKEND, "missing.onnx");
    assert_null(s);

    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t xd[2] = { -1, -1 }, wd[2] = { 3, 2 };
    OK(qcal_onnx_model_add_input(m, "X", QCAL_ONNX_FLOAT, 2, xd));
    OK(qcal_onnx_model_add_output(m, "Y", QCAL_ONNX_FLOAT, 2, xd));
    OK(qcal_onnx_model_add_initializer_float(m, "W", 2, wd, W));
    const char *mm_in[2] = { "X", "W" }, *mm_out[1] = { "Y" };
    OK(qcal_onnx_model_add_node(m, "MatMul", "mm", 2, mm_in, 1, mm_out, NULL));
    size_t len;
    void *buf = serialize(&m, &len);
    OK(qcal_engine_session_create(e, buf, len, NULL, &s));
    qcal_free(buf);
    float x[4] = { 1, 2, 3, 4 };
    int64_t d[2] = { 1, 4 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, x, sizeof x);
    qcal_engine_outputs *out = NULL;
    expect_error(qcal_engine_session_run(s, &in, 1, NULL, 0, &out), QCAL_ERR_BACKEND,
                 "ONNX Runtime: run: ");
    assert_non_null(strstr(qcal_last_error(), "MatMul"));
    assert_null(out);

    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    assert_int_equal(so.optimization, 0);
    assert_int_equal(so.threads, 0);
    assert_null(so.optimized_model_path);
    so.optimization = 5;
    expect_error(qcal_engine_session_create(e, "x", 1, &so, &s), QCAL_ERR_INVALID_ARG,
                 "optimization level 5");
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
}

/* An output that is also the graph input (ONNX Runtime returns the caller's buffer), a Relu
 * and a Cast to bool. */
static void test_alias_and_bool(void **state)
{
    (void)state;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t d[2] = { 2, 3 };
    OK(qcal_onnx_model_add_input(m, "X", QCAL_ONNX_FLOAT, 2, d));
    OK(qcal_onnx_model_add_output(m, "X", QCAL_ONNX_FLOAT, 2, d));
    OK(qcal_onnx_model_add_output(m, "R", QCAL_ONNX_FLOAT, 2, d));
    OK(qcal_onnx_model_add_output(m, "Bq", 9, 2, d));
    const char *x_in[1] = { "X" }, *r_out[1] = { "R" }, *b_out[1] = { "Bq" };
    int64_t cast;
    OK(qcal_onnx_model_add_node(m, "Relu", "relu", 1, x_in, 1, r_out, NULL));
    OK(qcal_onnx_model_add_node(m, "Cast", "cast", 1, x_in, 1, b_out, &cast));
    OK(qcal_onnx_node_set_int(m, cast, "to", 9));
    size_t len;
    void *buf = serialize(&m, &len);
    qcal_engine *e = open_engine();
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, buf, len, NULL, &s));
    qcal_free(buf);
    assert_int_equal(qcal_engine_session_output_count(s), 3);

    float *x = malloc(sizeof(float) * 6);
    const float x0[6] = { -1, 0, 2.5f, 0, -0.0f, 3 };
    memcpy(x, x0, sizeof x0);
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, x, sizeof x0);
    qcal_engine_outputs *out = NULL;
    OK(qcal_engine_session_run(s, &in, 1, NULL, 0, &out));
    memset(x, 0x7f, sizeof x0);   /* the caller's buffer changes and goes away */
    free(x);
    qcal_engine_value vx, vr, vb;
    OK(qcal_engine_outputs_at(out, 0, &vx));
    OK(qcal_engine_outputs_at(out, 1, &vr));
    OK(qcal_engine_outputs_at(out, 2, &vb));
    assert_string_equal(vx.name, "X");
    assert_int_equal(vx.nbytes, sizeof x0);
    assert_memory_equal(vx.data, x0, sizeof x0);
    assert_int_equal((uintptr_t)vx.data % 64, 0);   /* qcal's own aligned copy */
    const float rw[6] = { 0, 0, 2.5f, 0, 0, 3 };
    const float *rv = vr.data;
    for (int i = 0; i < 6; i++)
        assert_true(rv[i] == rw[i]);
    assert_int_equal(vb.elem_type, 9);
    assert_int_equal(vb.nbytes, 6);
    const uint8_t bw[6] = { 1, 0, 1, 0, 0, 1 };
    assert_memory_equal(vb.data, bw, 6);

    /* The result outlives its session and engine (they are released with it). */
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
    assert_memory_equal(vb.data, bw, 6);
    assert_memory_equal(vx.data, x0, sizeof x0);
    qcal_engine_outputs_free(&out);
}

/* An input declared without a shape (ONNX Runtime says rank 0: any shape goes), a true
 * scalar (ONNX Runtime's own refusal of a matrix), a rank above QCAL_MAX_DIMS (refused when
 * the session is created). */
static void test_shapes(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t none[1] = { 0 };
    OK(qcal_onnx_model_add_input(m, "X", QCAL_ONNX_FLOAT, -1, NULL));
    OK(qcal_onnx_model_add_input(m, "k", QCAL_ONNX_FLOAT, 0, none));
    OK(qcal_onnx_model_add_output(m, "Y", QCAL_ONNX_FLOAT, -1, NULL));
    const char *mul_in[2] = { "X", "k" }, *mul_out[1] = { "Y" };
    OK(qcal_onnx_model_add_node(m, "Mul", "mul", 2, mul_in, 1, mul_out, NULL));
    size_t len;
    void *buf = serialize(&m, &len);
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, buf, len, NULL, &s));
    qcal_free(buf);
    qcal_engine_io io;
    OK(qcal_engine_session_input(s, 1, &io));
    assert_string_equal(io.name, "k");
    assert_int_equal(io.ndim, 0);
    float x[6] = { 1, -2, 3, 4, 5, 6 }, k = 2;
    int64_t d[3] = { 1, 2, 3 };
    qcal_engine_value in[2] = { value("X", QCAL_ONNX_FLOAT, 3, d, x, sizeof x),
                                value("k", QCAL_ONNX_FLOAT, 0, d, &k, sizeof k) };
    qcal_engine_outputs *out = NULL;
    OK(qcal_engine_session_run(s, in, 2, NULL, 0, &out));
    qcal_engine_value y;
    OK(qcal_engine_outputs_at(out, 0, &y));
    assert_int_equal(y.ndim, 3);
    assert_int_equal(y.dims[2], 3);
    const float *yv = y.data;
    for (int i = 0; i < 6; i++)
        assert_true(yv[i] == 2 * x[i]);
    qcal_engine_outputs_free(&out);
    float kk[2] = { 2, 2 };
    in[1] = value("k", QCAL_ONNX_FLOAT, 1, d + 2 - 1, kk, sizeof kk);   /* [2] */
    expect_error(qcal_engine_session_run(s, in, 2, NULL, 0, &out), QCAL_ERR_BACKEND, "ONNX Runtime: run: ");
    assert_null(out);
    qcal_engine_session_destroy(&s);

    /* Reshape to 9 dimensions: refused when ONNX Runtime's inferred output shape shows them
     * (session creation), else when the run returns them. */
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t d18[1] = { 18 }, d1[1] = { 9 }, d9[9] = { 1, 1, 1, 1, 1, 1, 1, 9, 2 };
    OK(qcal_onnx_model_add_input(m, "X", QCAL_ONNX_FLOAT, 1, d18));
    OK(qcal_onnx_model_add_output(m, "Y", QCAL_ONNX_FLOAT, -1, NULL));
    OK(qcal_onnx_model_add_initializer_int64(m, "shape", 1, d1, d9));
    const char *r_in[2] = { "X", "shape" }, *r_out[1] = { "Y" };
    OK(qcal_onnx_model_add_node(m, "Reshape", "reshape", 2, r_in, 1, r_out, NULL));
    buf = serialize(&m, &len);
    qcal_status st = qcal_engine_session_create(e, buf, len, NULL, &s);
    if (st == QCAL_OK) {
        float x18[18] = { 0 };
        in[0] = value("X", QCAL_ONNX_FLOAT, 1, d18, x18, sizeof x18);
        st = qcal_engine_session_run(s, in, 1, NULL, 0, &out);
        assert_null(out);
        qcal_engine_session_destroy(&s);
    }
    expect_error(st, QCAL_ERR_UNSUPPORTED, "output 'Y' has 9 dimensions (qcal takes at most 8)");
    assert_null(s);
    qcal_free(buf);
    qcal_engine_close(&e);
}

/* From a file, with the optimized graph written beside it, on 1 thread. */
static void test_file_and_options(void **state)
{
    (void)state;
    size_t len;
    void *buf = mlp_model(&len);
    char *path = tu_path(tmpdir, "mlp.onnx");
    tu_write_bytes(path, buf, len);
    qcal_free(buf);
    char opt_path[512];
    snprintf(opt_path, sizeof opt_path, "%s", tu_path(tmpdir, "mlp.opt.onnx"));
    qcal_engine *e = open_engine();
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.optimization = 99;
    so.threads = 1;
    so.optimized_model_path = opt_path;
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create_file(e, path, &so, &s));
    struct stat st;
    assert_int_equal(stat(opt_path, &st), 0);
    assert_true(st.st_size > 0);
    float x[6] = { 1, 1, 1, 2, -3, 1 }, want[4];
    mlp_ref(x, 2, want);
    int64_t d[2] = { 2, 3 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, x, sizeof x);
    qcal_engine_outputs *out = NULL;
    const char *y_only[1] = { "Y" };
    OK(qcal_engine_session_run(s, &in, 1, y_only, 1, &out));
    qcal_engine_value y;
    OK(qcal_engine_outputs_at(out, 0, &y));
    assert_memory_equal(y.data, want, sizeof want);
    qcal_engine_outputs_free(&out);
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
}

/* One session run by two threads at once: identical, correct results. */
typedef struct run_job {
    qcal_engine_session *s;
    const float *x;
    int64_t rows;
    const float *want;
    int bad;
} run_job;

static void *run_thread(void *arg)
{
    run_job *j = arg;
    int64_t d[2] = { j->rows, 3 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, j->x, (size_t)j->rows * 12);
    for (int it = 0; it < 200; it++) {
        qcal_engine_outputs *out = NULL;
        if (qcal_engine_session_run(j->s, &in, 1, NULL, 0, &out) != QCAL_OK) {
            j->bad++;
            continue;
        }
        qcal_engine_value y;
        if (qcal_engine_outputs_at(out, 0, &y) != QCAL_OK || y.nbytes != (size_t)j->rows * 8 ||
            memcmp(y.data, j->want, y.nbytes) != 0)
            j->bad++;
        qcal_engine_outputs_free(&out);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    size_t len;
    void *buf = mlp_model(&len);
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, buf, len, NULL, &s));
    qcal_free(buf);
    enum { ROWS = 64 };
    float x[ROWS * 3], want[ROWS * 2];
    for (int i = 0; i < ROWS * 3; i++)
        x[i] = (float)((i * 7) % 11) - 5;
    mlp_ref(x, ROWS, want);
    run_job jobs[2] = { { s, x, ROWS, want, 0 }, { s, x, ROWS, want, 0 } };
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, run_thread, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(jobs[0].bad, 0);
    assert_int_equal(jobs[1].bad, 0);
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
}

/* CPU time of this process (all threads), seconds. */
static double process_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

/* CPU time the process spends during a 200 ms sleep right after a Run of a session with two
 * intra-op threads. */
static double idle_cpu_after_run(qcal_engine *e, bool stop_spinning, const float *x,
                                 int64_t rows, const float *want)
{
    size_t len;
    void *buf = mlp_model(&len);
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.threads = 2;
    so.stop_spinning = stop_spinning;
    qcal_engine_session *s = NULL;
    OK(qcal_engine_session_create(e, buf, len, &so, &s));
    qcal_free(buf);
    int64_t d[2] = { rows, 3 };
    qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, x, (size_t)rows * 12);
    double idle = 0;
    for (int it = 0; it < 3; it++) {
        qcal_engine_outputs *out = NULL;
        OK(qcal_engine_session_run(s, &in, 1, NULL, 0, &out));
        qcal_engine_value y;
        OK(qcal_engine_outputs_at(out, 0, &y));
        assert_int_equal(y.nbytes, (size_t)rows * 8);
        assert_memory_equal(y.data, want, y.nbytes);
        qcal_engine_outputs_free(&out);
        double c0 = process_cpu_s();
        struct timespec ts = { 0, 200 * 1000 * 1000 };
        while (nanosleep(&ts, &ts) != 0)
            ;
        idle += process_cpu_s() - c0;
    }
    qcal_engine_session_destroy(&s);
    return idle / 3;
}

/* stop_spinning: the same outputs, and ONNX Runtime's threads sleep once Run returns (the
 * process uses next to no CPU in the 200 ms after it). */
static void test_stop_spinning(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    enum { ROWS = 1 << 20 };
    float *x = malloc(sizeof(float) * ROWS * 3), *want = malloc(sizeof(float) * ROWS * 2);
    assert_non_null(x);
    assert_non_null(want);
    for (int64_t i = 0; i < (int64_t)ROWS * 3; i++)
        x[i] = (float)((i * 7) % 11) - 5;
    mlp_ref(x, ROWS, want);
    double spin = idle_cpu_after_run(e, false, x, ROWS, want);
    double stop = idle_cpu_after_run(e, true, x, ROWS, want);
    print_message("CPU in the 200 ms after Run: %.3f s spinning (ONNX Runtime's default), "
                  "%.3f s with stop_spinning\n", spin, stop);
    assert_true(stop < 0.02);
    free(x);
    free(want);
    qcal_engine_close(&e);
}

/* ONNX Runtime writes nothing to stderr: an unused initializer at every optimization level
 * (its "Removing initializer" warning), a refused model, a failing run. */
static void test_silent(void **state)
{
    (void)state;
    char *log = tu_path(tmpdir, "stderr.txt");
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);

    qcal_engine *e = NULL;
    qcal_status st = qcal_engine_open(NULL, &e);
    size_t len;
    void *buf = mlp_model(&len);
    int levels[4] = { 0, 1, 2, 99 }, fails = 0;
    for (int i = 0; st == QCAL_OK && i < 4; i++) {
        qcal_engine_session_options so;
        qcal_engine_session_options_default(&so);
        so.optimization = levels[i];
        qcal_engine_session *s = NULL;
        fails += qcal_engine_session_create(e, buf, len, &so, &s) != QCAL_OK;
        float x[3] = { 1, 2, 3 };
        int64_t d[2] = { 1, 3 };
        qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, d, x, sizeof x);
        qcal_engine_outputs *out = NULL;
        fails += qcal_engine_session_run(s, &in, 1, NULL, 0, &out) != QCAL_OK;
        qcal_engine_outputs_free(&out);
        qcal_engine_session_destroy(&s);
    }
    qcal_free(buf);
    qcal_engine_session *s = NULL;
    qcal_status refused = st == QCAL_OK ? qcal_engine_session_create(e, "garbage", 7, NULL, &s)
                                        : QCAL_OK;
    qcal_engine_close(&e);

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    OK(st);
    assert_int_equal(fails, 0);
    assert_int_equal(refused, QCAL_ERR_BACKEND);
    char text[4096];
    tu_slurp(log, text, sizeof text);
    if (text[0])
        fail_msg("ONNX Runtime wrote to stderr: %s", text);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_engine_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmpdir);
    return 0;
}

/* The MLP's profile tensors calibrated with a histogram observer over 12 runs of 2048 rows
 * (calibration threads and overlap as given): the table's digest; the report. */
static void shared_run(qcal_engine *e, const qcal_onnx_model *m, int threads, bool overlap,
                       char digest[65], qcal_model_calib_report *rep)
{
    enum { RUNS = 12, ROWS = 2048 };
    static float x[ROWS * 3];
    const char *rt = "* any histogram\n";
    qcal_calib_rules *rules = NULL;
    OK(qcal_calib_rules_parse(rt, strlen(rt), &rules));
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(&so, &s));
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    o.threads = threads;
    o.overlap = overlap;
    qcal_model_calib *mc = NULL;
    OK(qcal_model_calib_create(e, m, s, &o, &mc));
    uint32_t r = 7;
    for (int k = 0; k < RUNS; k++) {
        /* each run wider than the last: the histograms' ranges grow run after run */
        for (int i = 0; i < ROWS * 3; i++) {
            r = r * 1664525u + 1013904223u;
            x[i] = ((float)(r >> 8) * 0x1p-24f - 0.5f) * (float)(k + 1);
        }
        int64_t xd[2] = { ROWS, 3 };
        qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x, sizeof x);
        OK(qcal_model_calib_feed(mc, &in, 1));
    }
    OK(qcal_model_calib_finish(mc, rep));
    qcal_calib_table *t = NULL;
    OK(qcal_calib_session_table(s, &t));
    OK(qcal_calib_table_digest(t, digest));
    qcal_calib_table_destroy(&t);
    qcal_model_calib_destroy(&mc);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* Two threads observing each run (the caller and the observer thread, with two threads or
 * more), one (a single thread), or the observer thread while the next run computes
 * (overlap): the same table. */
static void test_shared_observers(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    qcal_onnx_model *m = mlp_parsed();
    char d1[65], d2[65], d3[65], dov[65];
    qcal_model_calib_report r1, r2, r3, rov;
    shared_run(e, m, 1, false, d1, &r1);
    shared_run(e, m, 2, false, d2, &r2);
    shared_run(e, m, 3, false, d3, &r3);
    shared_run(e, m, 2, true, dov, &rov);
    assert_string_equal(d1, d2);
    assert_string_equal(d1, d3);
    assert_string_equal(d1, dov);
    assert_int_equal(r1.runs, 12);
    assert_int_equal(r2.runs, 12);
    assert_int_equal(r1.tensors, r2.tensors);
    assert_true(r1.tensors >= 2);
    qcal_onnx_model_destroy(&m);
    qcal_engine_close(&e);
}

/* onnxruntime-node's version from its package.json in the npm cache ("" when absent). */
static void read_npm_version(void)
{
    const char *dir = getenv("QCAL_NPM_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    char path[1024];
    if (dir && *dir)
        snprintf(path, sizeof path, "%s", dir);
    else if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/qcal/npm", xdg);
    else
        snprintf(path, sizeof path, "%s/.cache/qcal/npm", getenv("HOME") ? getenv("HOME") : "");
    strncat(path, "/node_modules/onnxruntime-node/package.json", sizeof path - strlen(path) - 1);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "\"version\"");
        if (p && (p = strchr(p + 9, '"')) != NULL) {
            char *q = strchr(p + 1, '"');
            if (q && q - p - 1 < (long)sizeof npm_version) {
                memcpy(npm_version, p + 1, (size_t)(q - p - 1));
                npm_version[q - p - 1] = '\0';
            }
            break;
        }
    }
    fclose(f);
}

/* observer_auto (qcal/model_calib.h): two passes into an evaluation, each tensor's
 * recommended candidate in the session; the model input's entry is what an evaluation of the
 * same batches recommends; the pass protocol's errors. */
/* observer_auto at the outputs: 8 samples fed as runs of runs[0], runs[1], ... samples (the
 * X of test_observer_auto's data); the report. */
static void auto_outputs_run(qcal_engine *e, const qcal_onnx_model *m, const int *runs, int n_runs,
                             int64_t auto_samples, qcal_model_calib_report *rep,
                             qcal_calib_table **tab)
{
    static float x[8][3];
    for (int i = 0; i < 24; i++)
        x[i / 3][i % 3] = (float)((i * 7) % 11) * 0.25f - 0.5f + (i == 16 ? 40.0f : 0.0f);
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(NULL, &s));
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    o.observer_auto = true;
    o.auto_samples = auto_samples;
    qcal_model_calib *mc = NULL;
    OK(qcal_model_calib_create(e, m, s, &o, &mc));
    for (int p = 0; p < 2; p++) {
        for (int r = 0, s0 = 0; r < n_runs; s0 += runs[r++]) {
            int64_t xd[2] = { runs[r], 3 };
            qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x[s0],
                                         (size_t)runs[r] * sizeof x[0]);
            OK(qcal_model_calib_feed(mc, &in, 1));
        }
        if (!p)
            OK(qcal_model_calib_next_pass(mc));
    }
    OK(qcal_model_calib_finish(mc, rep));
    OK(qcal_calib_session_table(s, tab));
    qcal_model_calib_destroy(&mc);
    qcal_calib_session_destroy(&s);
}

/* observer_auto at the outputs (qcal/model_calib.h): every candidate scored, the highest
 * chosen and written into the session; the kept samples one per run whatever the runs fed. */
static void test_observer_auto_outputs(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    qcal_onnx_model *m = mlp_parsed();
    qcal_model_calib_report r4, r1, r3;
    qcal_calib_table *t4 = NULL, *t1 = NULL, *t3 = NULL;
    auto_outputs_run(e, m, (const int[]){ 4, 4 }, 2, 64, &r4, &t4);   /* all 8 kept */
    assert_int_equal(r4.auto_samples, 8);
    /* the per-tensor choice and the five kinds, each a finite SQNR and an agreement count
     * (Y's argmax over its 2 columns) of 0..8; the rest NaN and -1. The winner: the most
     * agreements, then the highest SQNR, then the earlier (per-tensor, then simpler). */
    double best = r4.auto_sqnr_db[0];
    int64_t best_agree = r4.auto_agree[0];
    int32_t want = -1;
    assert_true(isfinite(best) && best_agree >= 0 && best_agree <= 8);
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        double v = r4.auto_sqnr_db[k + 1];
        int64_t a = r4.auto_agree[k + 1];
        bool cand = QCAL_MODEL_CALIB_AUTO_KINDS >> k & 1u;
        assert_true(cand ? isfinite(v) && a >= 0 && a <= 8 : isnan(v) && a == -1);
        if (cand && (a > best_agree || (a == best_agree && v > best) ||
                     (a == best_agree && v == best && want >= 0 &&
                      qcal_numeric_eval_simplicity((qcal_observer_kind)k) <
                          qcal_numeric_eval_simplicity((qcal_observer_kind)want)))) {
            best = v;
            best_agree = a;
            want = k;
        }
    }
    assert_int_equal(r4.auto_choice, want);
    /* a kind everywhere: every entry names it */
    int64_t ne = 0;
    OK(qcal_calib_table_count(t4, &ne));
    assert_true(ne > 0);
    for (int64_t i = 0; want >= 0 && i < ne; i++) {
        const qcal_calib_entry *ent = NULL;
        OK(qcal_calib_table_entry(t4, i, &ent));
        assert_int_equal(ent->observer, want);
    }
    /* runs of 1 and of 8: the same samples one per run, the same figures to the bit */
    auto_outputs_run(e, m, (const int[]){ 1, 1, 1, 1, 1, 1, 1, 1 }, 8, 64, &r1, &t1);
    assert_int_equal(r1.auto_samples, 8);
    assert_memory_equal(r1.auto_sqnr_db, r4.auto_sqnr_db, sizeof r4.auto_sqnr_db);
    assert_memory_equal(r1.auto_agree, r4.auto_agree, sizeof r4.auto_agree);
    assert_int_equal(r1.auto_choice, r4.auto_choice);
    /* fewer samples than the data: the first 3 */
    auto_outputs_run(e, m, (const int[]){ 8 }, 1, 3, &r3, &t3);
    assert_int_equal(r3.auto_samples, 3);
    assert_true(isfinite(r3.auto_sqnr_db[0]));
    qcal_calib_table_destroy(&t4);
    qcal_calib_table_destroy(&t1);
    qcal_calib_table_destroy(&t3);
    /* a negative count is refused */
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(NULL, &s));
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    o.observer_auto = true;
    o.auto_samples = -1;
    qcal_model_calib *mc = NULL;
    expect_error(qcal_model_calib_create(e, m, s, &o, &mc), QCAL_ERR_INVALID_ARG, "auto_samples -1");
    qcal_calib_session_destroy(&s);
    qcal_onnx_model_destroy(&m);
    qcal_engine_close(&e);
}

static void test_observer_auto(void **state)
{
    (void)state;
    qcal_engine *e = open_engine();
    qcal_onnx_model *m = mlp_parsed();
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(NULL, &s));
    qcal_model_calib_options o;
    qcal_model_calib_options_default(&o);
    assert_int_equal(o.auto_samples, 64);
    o.observer_auto = true;
    o.auto_samples = 0;   /* the per-tensor choice alone (test_observer_auto_outputs: the rest) */
    o.ranks = 2;
    qcal_model_calib *mc = NULL;
    expect_error(qcal_model_calib_create(e, m, s, &o, &mc), QCAL_ERR_UNSUPPORTED, "2 ranks");
    o.ranks = 1;
    OK(qcal_model_calib_create(e, m, s, &o, &mc));
    /* Two runs of X [4, 3]: a long positive tail and one outlier, where the kinds differ. */
    float x[2][12];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 12; i++)
            x[r][i] = (float)((i * 7 + r * 5) % 11) * 0.25f - 0.5f + (r == 1 && i == 4 ? 40.0f : 0.0f);
    int64_t xd[2] = { 4, 3 };
    for (int r = 0; r < 2; r++) {
        qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x[r], sizeof x[r]);
        OK(qcal_model_calib_feed(mc, &in, 1));
    }
    qcal_model_calib_report rep;
    expect_error(qcal_model_calib_finish(mc, &rep), QCAL_ERR_STATE, "second pass");
    OK(qcal_model_calib_next_pass(mc));
    expect_error(qcal_model_calib_next_pass(mc), QCAL_ERR_STATE, "already");
    for (int r = 1; r >= 0; r--) {   /* the second pass in another order: the same scores */
        qcal_engine_value in = value("X", QCAL_ONNX_FLOAT, 2, xd, x[r], sizeof x[r]);
        OK(qcal_model_calib_feed(mc, &in, 1));
    }
    OK(qcal_model_calib_finish(mc, &rep));
    assert_int_equal(rep.passes, 2);
    assert_int_equal(rep.samples, 8);
    assert_int_equal(rep.runs, 4);
    assert_int_equal(rep.auto_samples, 0);
    assert_int_equal(rep.auto_choice, -1);
    assert_true(isnan(rep.auto_sqnr_db[0]));
    int64_t nt = qcal_model_calib_tensor_count(mc), chosen = 0, n = 0;
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
        chosen += rep.chosen[k];
    assert_int_equal(chosen, nt);
    OK(qcal_calib_session_count(s, &n));
    assert_int_equal(n, nt);
    /* The model input's entry against an evaluation of the same batches. */
    qcal_numeric_eval_options eo;
    qcal_numeric_eval_options_default(&eo);
    eo.kinds = QCAL_MODEL_CALIB_AUTO_KINDS;
    qcal_numeric_eval *ev = NULL;
    OK(qcal_numeric_eval_create(&eo, &ev));
    qcal_tensor t;
    for (int p = 0; p < 2; p++) {
        for (int r = 0; r < 2; r++) {
            OK(qcal_tensor_init(&t, x[r], 2, xd));
            OK(p ? qcal_numeric_eval_score(ev, "X", QCAL_CALIB_ROLE_ACTIVATION, &t)
                 : qcal_numeric_eval_observe(ev, "X", QCAL_CALIB_ROLE_ACTIVATION, &t));
        }
        if (!p)
            OK(qcal_numeric_eval_finish(ev));
    }
    qcal_numeric_eval_tensor res;
    OK(qcal_numeric_eval_result(ev, 0, &res));
    const qcal_numeric_eval_candidate *want = &res.candidates[res.recommended];
    qcal_calib_table *tab = NULL;
    OK(qcal_calib_session_table(s, &tab));
    const qcal_calib_entry *ent = NULL;
    OK(qcal_calib_table_find(tab, "X", QCAL_CALIB_ROLE_ACTIVATION, &ent));
    assert_int_equal(ent->observer, want->kind);
    assert_true(ent->min_val[0] == want->min_val[0] && ent->max_val[0] == want->max_val[0]);
    assert_true(ent->qparams.scale == want->scale[0]);
    assert_int_equal(ent->elements, 24);
    assert_int_equal(ent->batches, 2);
    qcal_calib_table_destroy(&tab);
    qcal_numeric_eval_destroy(&ev);
    qcal_model_calib_destroy(&mc);
    /* Without observer_auto there is no second pass. */
    o.observer_auto = false;
    OK(qcal_model_calib_create(e, m, s, &o, &mc));
    expect_error(qcal_model_calib_next_pass(mc), QCAL_ERR_STATE, "needs observer_auto");
    qcal_model_calib_destroy(&mc);
    qcal_calib_session_destroy(&s);
    qcal_onnx_model_destroy(&m);
    qcal_engine_close(&e);
}

int main(void)
{
    if (!qcal_onnx_available()) {
        printf("skip: qcal built without ONNX support (the tests build their models with it)\n");
        return 77;
    }
    qcal_engine *e = NULL;
    if (qcal_engine_open(NULL, &e) != QCAL_OK) {
        printf("skip: ONNX Runtime not found: %s\n", qcal_last_error());
        return 77;
    }
    qcal_engine_close(&e);
    read_npm_version();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_version),
        cmocka_unit_test(test_elem_types),
        cmocka_unit_test(test_library_search),
        cmocka_unit_test(test_io_and_run),
        cmocka_unit_test(test_release_and_arena),
        cmocka_unit_test(test_backend_errors),
        cmocka_unit_test(test_alias_and_bool),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_file_and_options),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_stop_spinning),
        cmocka_unit_test(test_shared_observers),
        cmocka_unit_test(test_silent),
        cmocka_unit_test(test_observer_auto),
        cmocka_unit_test(test_observer_auto_outputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
