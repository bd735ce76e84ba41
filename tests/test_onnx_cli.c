/* qcal onnx-expose and qcal qdq on hostile models: truncated and bit-flipped protobuf, a node
 * reading an undefined tensor, initializer data shorter than its shape, external data
 * escaping the model's directory (.., absolute path, symlink), zero-sized weights: one
 * error line, the documented exit code, nothing written, an existing output untouched.
 * Names with spaces, slashes, colons, quotes and non-ASCII work end to end: expose --list,
 * a manifest dump, calibrate, qdq, onnx.checker. External data that stays inside works. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/qcal.h"
#include "testutil.h"

static char tmp[64];
static char out[1 << 16], err[1 << 14];

static int setup(void **state)
{
    (void)state;
    snprintf(tmp, sizeof tmp, "/tmp/qcal_onnxcli_XXXXXX");
    if (!mkdtemp(tmp) || !getenv("QCAL_BIN"))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp);
    return 0;
}

#define OK(x) assert_int_equal((x), QCAL_OK)

static const char *T(const char *name)
{
    return tu_path(tmp, name);
}

static int qcal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = tu_qcal_shv(tmp, out, sizeof out, err, sizeof err, fmt, ap);
    va_end(ap);
    return rc;
}

static bool have_checker(void)
{
    return access("/usr/bin/python3", X_OK) == 0 &&
           system("/usr/bin/python3 -c 'import onnx' 2>/dev/null") == 0;
}

/* Conv -> Relu -> Flatten -> Gemm with the given names (x, conv out, relu out, flat, logits;
 * weights w, b, fw). */
static qcal_onnx_model *make_model(const char *const *nm, int64_t conv_out_channels)
{
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 13, &m));
    int64_t in_dims[4] = { -1, 1, 4, 4 };
    OK(qcal_onnx_model_add_input(m, nm[0], QCAL_ONNX_FLOAT, 4, in_dims));
    OK(qcal_onnx_model_add_output(m, nm[4], QCAL_ONNX_FLOAT, 2, (int64_t[]){ -1, 2 }));
    int64_t c = conv_out_channels;
    float w[2 * 9] = { 0.5f, -0.25f, 0.125f, 1.0f, -1.0f, 0.75f, 0.1f, 0.2f, 0.3f,
                       -0.5f, 0.25f, 0.6f, 0.7f, -0.8f, 0.9f, 0.05f, -0.15f, 0.35f };
    float b[2] = { 0.1f, -0.2f }, fw[2 * 32], fb[2] = { 0.01f, 0.02f };
    for (int i = 0; i < 64; i++)
        fw[i] = (float)((i * 37) % 17 - 8) / 16.0f;
    OK(qcal_onnx_model_add_initializer_float(m, nm[5], 4, (int64_t[]){ c, 1, 3, 3 }, w));
    OK(qcal_onnx_model_add_initializer_float(m, nm[6], 1, (int64_t[]){ c }, b));
    OK(qcal_onnx_model_add_initializer_float(m, nm[7], 2, (int64_t[]){ 2, 16 * c }, fw));
    OK(qcal_onnx_model_add_initializer_float(m, "fc bias", 1, (int64_t[]){ 2 }, fb));
    int64_t k;
    OK(qcal_onnx_model_add_node(m, "Conv", "conv 1", 3, (const char *[]){ nm[0], nm[5], nm[6] }, 1,
                                (const char *[]){ nm[1] }, &k));
    OK(qcal_onnx_node_set_ints(m, k, "pads", 4, (int64_t[]){ 1, 1, 1, 1 }));
    OK(qcal_onnx_model_add_node(m, "Relu", "relu", 1, &nm[1], 1, &nm[2], NULL));
    OK(qcal_onnx_model_add_node(m, "Flatten", "flat", 1, &nm[2], 1, &nm[3], NULL));
    OK(qcal_onnx_model_add_node(m, "Gemm", "fc", 3, (const char *[]){ nm[3], nm[7], "fc bias" }, 1, &nm[4], &k));
    OK(qcal_onnx_node_set_int(m, k, "transB", 1));
    return m;
}

static const char *const plain[] = { "x", "c", "r", "f", "y", "w", "b", "fw" };

static void save(qcal_onnx_model *m, const char *name)
{
    OK(qcal_onnx_model_save_file(m, NULL, T(name)));
}

/* A native table with the activation ranges [-1 - i * k, 2 + i * k] (minmax observer) of
 * names[i], k = scale[i] (NULL: 1). */
static void write_table_scaled(const char *const *names, const float *scale, int n, const char *path)
{
    qcal_calib_rules *rules = NULL;
    OK(qcal_calib_rules_create(&rules));
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    OK(qcal_calib_rules_add(rules, "*", true, QCAL_CALIB_ROLE_ACTIVATION, &cfg));
    qcal_calib_session_options opt;
    qcal_calib_session_options_default(&opt);
    opt.rules = rules;
    qcal_calib_session *s = NULL;
    OK(qcal_calib_session_create(&opt, &s));
    for (int i = 0; i < n; i++) {
        float k = scale ? scale[i] : 1.0f;
        float x[2] = { -1.0f - (float)i * k, 2.0f + (float)i * k };
        qcal_tensor t;
        OK(qcal_tensor_init(&t, x, 1, (int64_t[]){ 2 }));
        OK(qcal_calib_session_observe(s, names[i], QCAL_CALIB_ROLE_ACTIVATION, 0, &t));
    }
    qcal_calib_table *t = NULL;
    OK(qcal_calib_session_table(s, &t));
    OK(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_JSON, NULL, path));
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* A native table with the activation ranges [-1 - i, 2 + i] of names[i] (minmax observer). */
static void write_table(const char *const *names, int n, const char *path)
{
    write_table_scaled(names, NULL, n, path);
}

/* Runs expose and qdq on model `in` with outputs pre-filled by "keep": both must fail with
 * `code`, one error line containing needle, and leave the outputs as they were. */
static void expect_refused(const char *in, int code, const char *needle)
{
    tu_write_bytes(T("out.onnx"), "keep", 4);
    tu_write_bytes(T("names.txt"), "keep", 4);
    int rc = qcal("onnx-expose '%s' -o '%s' --list '%s'", T(in), T("out.onnx"), T("names.txt"));
    if (rc != code)
        fail_msg("onnx-expose %s: exit %d (want %d): %s", in, rc, code, err);
    tu_expect_one_line(err, "qcal: onnx-expose: ", needle);
    rc = qcal("qdq '%s' --table '%s' -o '%s'", T(in), T("table.json"), T("out.onnx"));
    if (rc != code)
        fail_msg("qdq %s: exit %d (want %d): %s", in, rc, code, err);
    tu_expect_one_line(err, "qcal: qdq: ", needle);
    char buf[16];
    tu_slurp(T("out.onnx"), buf, sizeof buf);
    assert_string_equal(buf, "keep");
    tu_slurp(T("names.txt"), buf, sizeof buf);
    assert_string_equal(buf, "keep");
    assert_int_equal(tu_count_entries(tmp, ".tmp."), 0);
}

static void test_hostile(void **state)
{
    (void)state;
    write_table(plain, 5, T("table.json"));
    qcal_onnx_model *m = make_model(plain, 2);
    save(m, "good.onnx");
    void *buf;
    size_t len;
    OK(qcal_onnx_model_serialize(m, &buf, &len));
    qcal_onnx_model_destroy(&m);
    /* the good model works */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("good.onnx"), T("table.json"), T("q.onnx")), 0);
    /* truncated */
    tu_write_bytes(T("trunc.onnx"), buf, len - 7);
    expect_refused("trunc.onnx", 3, "malformed or truncated protobuf");
    tu_write_bytes(T("empty.onnx"), buf, 0);
    expect_refused("empty.onnx", 3, "is empty");
    /* bit-flipped: the first tag byte becomes an invalid wire type */
    uint8_t *flip = malloc(len);
    memcpy(flip, buf, len);
    flip[0] ^= 0xff;
    tu_write_bytes(T("flip.onnx"), flip, len);
    expect_refused("flip.onnx", 3, "not a valid ONNX model");
    /* every single-byte flip: a clean error or a model that loads, never a crash */
    int refused = 0, loaded = 0;
    for (size_t i = 0; i < len; i++) {
        memcpy(flip, buf, len);
        flip[i] ^= (uint8_t)(0x5a + i);
        qcal_onnx_model *r = (qcal_onnx_model *)(uintptr_t)0x1;
        qcal_status st = qcal_onnx_model_parse(flip, len, &r);
        if (st == QCAL_OK) {
            loaded++;
            char **names = NULL;
            int64_t n = 0;
            if (qcal_onnx_list(r, NULL, &names, &n) == QCAL_OK)
                qcal_onnx_names_free(&names, n);
            qcal_onnx_model_destroy(&r);
        } else {
            refused++;
            assert_true(st < 0 && qcal_last_error()[0]);
            assert_ptr_equal(r, (qcal_onnx_model *)(uintptr_t)0x1);
        }
    }
    assert_int_equal(refused + loaded, (int)len);
    assert_true(refused > 0);
    free(flip);
    qcal_free(buf);
    /* a node reading a tensor nothing defines */
    m = make_model(plain, 2);
    OK(qcal_onnx_model_add_node(m, "Relu", "ghost", 1, (const char *[]){ "nowhere" }, 1,
                                (const char *[]){ "g" }, NULL));
    save(m, "missing_input.onnx");
    qcal_onnx_model_destroy(&m);
    expect_refused("missing_input.onnx", 3, "reads 'nowhere', which no graph input");
    /* initializer data shorter than its shape */
    m = make_model(plain, 2);
    float few[3] = { 1, 2, 3 };
    OK(qcal_onnx_model_add_initializer(m, "short", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 2, 2 }, few, sizeof few));
    save(m, "short.onnx");
    qcal_onnx_model_destroy(&m);
    expect_refused("short.onnx", 3, "initializer 'short' holds 12 bytes of data, its shape needs 16");
    /* external data escaping the model's directory */
    char sub[256];
    snprintf(sub, sizeof sub, "%s/m", tmp);
    mkdir(sub, 0755);
    float fw[64] = { 0 };
    tu_write_bytes(T("outside.bin"), fw, sizeof fw);
    const char *locs[] = { "../outside.bin", "/etc/hostname", "link.bin" };
    const char *why[] = { "leaves the model's directory ('..')", "is an absolute path",
                          "outside the model's directory" };
    char link[300];
    snprintf(link, sizeof link, "%s/link.bin", sub);
    assert_int_equal(symlink(T("outside.bin"), link), 0);
    for (int i = 0; i < 3; i++) {
        m = make_model(plain, 2);
        OK(qcal_onnx_initializer_set_external(m, "fw", locs[i], 0, 256));
        char path[300];
        snprintf(path, sizeof path, "m/ext%d.onnx", i);
        save(m, path);
        qcal_onnx_model_destroy(&m);
        expect_refused(path, 3, why[i]);
    }
    /* zero-sized weight: qdq refuses (exit 3); expose has nothing against it */
    m = make_model(plain, 2);
    OK(qcal_onnx_model_add_initializer_float(m, "w0", 4, (int64_t[]){ 0, 1, 3, 3 }, NULL));
    OK(qcal_onnx_model_add_node(m, "Conv", "conv0", 2, (const char *[]){ "x", "w0" }, 1,
                                (const char *[]){ "z0" }, NULL));
    save(m, "zero.onnx");
    qcal_onnx_model_destroy(&m);
    tu_write_bytes(T("out.onnx"), "keep", 4);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("zero.onnx"), T("table.json"), T("out.onnx")), 3);
    tu_expect_one_line(err, "qcal: qdq: ", "has no elements (a zero-sized dimension)");
    char keep[8];
    tu_slurp(T("out.onnx"), keep, sizeof keep);
    assert_string_equal(keep, "keep");
    /* opset 12 refused; a missing tensor with --strict; usage errors */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --op-types Conv,LSTM", T("good.onnx"),
                          T("table.json"), T("out.onnx")), 2);
    tu_expect_one_line(err, "qcal: qdq: ", "op type 'LSTM' cannot be quantized");
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --weight-observer histogram", T("good.onnx"),
                          T("table.json"), T("out.onnx")), 2);
    assert_int_equal(qcal("qdq '%s' -o '%s'", T("good.onnx"), T("out.onnx")), 2);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --profile tensorrt --profile ort", T("good.onnx"),
                          T("table.json"), T("out.onnx")), 2);
    write_table(plain, 3, T("table3.json"));   /* no "y" */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --strict", T("good.onnx"), T("table3.json"),
                          T("out.onnx")), 1);
    tu_expect_one_line(err, "qcal: qdq: ", "1 tensor the profile quantizes is not in the table (--strict): 'y'");
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("good.onnx"), T("table3.json"), T("out.onnx")), 0);
    tu_expect_one_line(err, "qcal: qdq: warning: ", "1 tensor missing from the table stays float (--verbose lists them)");
    tu_slurp(T("out.onnx"), keep, sizeof keep);
    assert_string_not_equal(keep, "keep");
    /* an unwritable output: exit 4, nothing left behind */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("good.onnx"), T("table.json"), T("nodir/out.onnx")), 4);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s'", T("nowhere.onnx"), T("out.onnx")), 3);
    /* opset 12 */
    qcal_onnx_model *o = NULL;
    OK(qcal_onnx_model_load_file(T("good.onnx"), &o));
    qcal_onnx_model_destroy(&o);
}

/* A table that is not the model's: fewer than half of the tensors the profile quantizes in
 * it, or recorded for the other profile, is exit 3 with one line and nothing written, unless
 * --allow-partial (today's warning: the rest stays float). The missing tensors are counted on
 * one line; --verbose lists them, one per line. The profile a table records: calibrate DIR
 * --profile writes it, a table without one (earlier qcal) still reads. */
static void test_table_of_another_model(void **state)
{
    (void)state;
    qcal_onnx_model *m = make_model(plain, 2);
    save(m, "good.onnx");
    qcal_onnx_model_destroy(&m);
    char keep[8];
    /* 1 of the 3 tensors profile ort quantizes (x, r, f): another model's table */
    write_table(plain, 2, T("table2.json"));
    tu_write_bytes(T("out.onnx"), "keep", 4);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("good.onnx"), T("table2.json"), T("out.onnx")), 3);
    tu_expect_one_line(err, "qcal: qdq: ", "matched 1 of 3 tensors the model needs; is this the table of another model?");
    tu_slurp(T("out.onnx"), keep, sizeof keep);
    assert_string_equal(keep, "keep");
    /* --strict does not make it an exit 1: the table is refused first */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --strict", T("good.onnx"), T("table2.json"), T("out.onnx")), 3);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --strict --allow-partial", T("good.onnx"),
                          T("table2.json"), T("out.onnx")), 2);
    tu_expect_one_line(err, "qcal: qdq: ", "--strict and --allow-partial exclude each other");
    /* --allow-partial: the warning, a count on one line */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --allow-partial", T("good.onnx"), T("table2.json"),
                          T("out.onnx")), 0);
    tu_expect_one_line(err, "qcal: qdq: warning: ", "2 tensors missing from the table stay float (--verbose lists them)");
    /* counts in the singular for 1 (was "1 ops quantized, 1 activations, ...") */
    assert_non_null(strstr(out, ": 1 op quantized, 1 activation, 1 weight, 1 int32 bias\n"));
    /* --verbose: the names, one per line after the count */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --allow-partial --verbose", T("good.onnx"),
                          T("table2.json"), T("out.onnx")), 0);
    assert_string_equal(err, "qcal: qdq: warning: 2 tensors missing from the table stay float\n"
                             "qcal: qdq: note: missing from the table: 'r'\n"
                             "qcal: qdq: note: missing from the table: 'f'\n");
    /* the table's profile: calibrate DIR --profile records it, qdq checks it */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/dump", tmp);
    assert_int_equal(mkdir(dir, 0755), 0);
    for (int i = 0; i < 5; i++) {
        char path[400];
        float x[4] = { -1.0f, 0.5f, 1.5f, 2.0f + (float)i };
        snprintf(path, sizeof path, "%s/%s.npy", dir, plain[i]);
        OK(qcal_npy_write(path, QCAL_NPY_F32, 1, (int64_t[]){ 4 }, x));
    }
    assert_int_equal(qcal("calibrate '%s' -o '%s' --profile tensorrt -q", dir, T("trt.json")), 0);
    static char tj[1 << 14];
    tu_slurp(T("trt.json"), tj, sizeof tj);
    assert_non_null(strstr(tj, "\n  \"profile\": \"tensorrt\",\n"));
    assert_int_equal(qcal("calibrate '%s' -o '%s' -q", dir, T("none.json")), 0);
    tu_slurp(T("none.json"), tj, sizeof tj);
    assert_null(strstr(tj, "profile"));   /* a dump's table records a profile when told */
    assert_int_equal(qcal("calibrate '%s' -o '%s' --profile onnx", dir, T("bad.json")), 2);
    tu_expect_one_line(err, "qcal: calibrate: ", "--profile: 'onnx' is not ort or tensorrt");
    /* every tensor matches, but the table is for tensorrt: refused for ort */
    tu_write_bytes(T("out.onnx"), "keep", 4);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("good.onnx"), T("trt.json"), T("out.onnx")), 3);
    tu_expect_one_line(err, "qcal: qdq: ", "was calibrated for profile tensorrt, not ort");
    tu_slurp(T("out.onnx"), keep, sizeof keep);
    assert_string_equal(keep, "keep");
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --profile tensorrt", T("good.onnx"), T("trt.json"),
                          T("out.onnx")), 0);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --allow-partial", T("good.onnx"), T("trt.json"),
                          T("out.onnx")), 0);
    tu_expect_one_line(err, "qcal: qdq: warning: ", "was calibrated for profile tensorrt, not ort");
    /* the table without a profile (as earlier qcal wrote them) is used for either */
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --profile tensorrt", T("good.onnx"), T("none.json"),
                          T("out.onnx")), 0);
    /* convert keeps it; a malformed one is refused by the reader */
    assert_int_equal(qcal("convert '%s' --format json -o '%s'", T("trt.json"), T("trt2.json")), 0);
    static char tj2[1 << 14];
    tu_slurp(T("trt.json"), tj, sizeof tj);
    tu_slurp(T("trt2.json"), tj2, sizeof tj2);
    assert_string_equal(tj, tj2);
}

/* External data inside the model's directory (also in a subdirectory) loads and quantizes. */
static void test_external_inside(void **state)
{
    (void)state;
    write_table(plain, 5, T("table.json"));
    char sub[256];
    snprintf(sub, sizeof sub, "%s/ext/data", tmp);
    mkdir(T("ext"), 0755);
    mkdir(sub, 0755);
    qcal_onnx_model *m = make_model(plain, 2);
    float *fw;
    OK(qcal_onnx_initializer_float(m, "fw", &fw, NULL));
    uint8_t blob[16 + 256];
    memset(blob, 0xee, 16);
    memcpy(blob + 16, fw, 256);
    tu_write_bytes(T("ext/data/w.bin"), blob, sizeof blob);
    OK(qcal_onnx_initializer_set_external(m, "fw", "data/w.bin", 16, 256));
    save(m, "ext/model.onnx");
    qcal_onnx_model_destroy(&m);
    qcal_onnx_model *r = NULL;
    OK(qcal_onnx_model_load_file(T("ext/model.onnx"), &r));
    float *back;
    OK(qcal_onnx_initializer_float(r, "fw", &back, NULL));
    assert_memory_equal(back, fw, 256);
    qcal_free(back);
    qcal_free(fw);
    qcal_onnx_model_destroy(&r);
    assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s'", T("ext/model.onnx"), T("table.json"), T("q.onnx")), 0);
    /* a short external file is a clear error */
    tu_write_bytes(T("ext/data/w.bin"), blob, 100);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s'", T("ext/model.onnx"), T("e.onnx")), 3);
    tu_expect_one_line(err, "qcal: onnx-expose: ", "does not hold 256 bytes at offset 16");
}

/* Saving past the external-data threshold writes PATH.data and reads back the same. */
static void test_save_external(void **state)
{
    (void)state;
    qcal_onnx_model *m = make_model(plain, 2);
    qcal_onnx_save_options so;
    qcal_onnx_save_options_default(&so);
    so.external_threshold = 100;   /* force it on a small model */
    so.external_min_bytes = 64;
    OK(qcal_onnx_model_save_file(m, &so, T("big.onnx")));
    struct stat sb;
    assert_int_equal(stat(T("big.onnx.data"), &sb), 0);
    assert_true(sb.st_size >= 256);
    qcal_onnx_model *r = NULL;
    OK(qcal_onnx_model_load_file(T("big.onnx"), &r));
    void *a, *b;
    size_t la, lb;
    OK(qcal_onnx_model_serialize(m, &a, &la));
    OK(qcal_onnx_model_serialize(r, &b, &lb));
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);   /* the in-memory model is restored after the save */
    qcal_free(a);
    qcal_free(b);
    qcal_onnx_model_destroy(&r);
    qcal_onnx_model_destroy(&m);
}

/* Initializers of 64 KiB and more are read from the file mapping and copied file to file on
 * save: the bytes must be those of the in-memory path, before and after each pass, and a
 * freed initializer's memory never taken for file data. */
static qcal_onnx_model *make_big(void)
{
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 17, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 256 }));
    OK(qcal_onnx_model_add_output(m, "z", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 128 }));
    float *w = malloc(256 * 256 * sizeof *w);
    for (int i = 0; i < 256 * 256; i++)
        w[i] = (float)((i * 7919) % 1001 - 500) / 1000.0f;
    OK(qcal_onnx_model_add_initializer_float(m, "big w", 2, (int64_t[]){ 256, 256 }, w));
    OK(qcal_onnx_model_add_initializer_float(m, "small", 1, (int64_t[]){ 128 }, w + 5));
    OK(qcal_onnx_model_add_initializer_float(m, "gemm:w", 2, (int64_t[]){ 128, 256 }, w + 1000));
    free(w);
    OK(qcal_onnx_model_add_node(m, "MatMul", "mm", 2, (const char *[]){ "x", "big w" }, 1, (const char *[]){ "y" }, NULL));
    int64_t k;
    OK(qcal_onnx_model_add_node(m, "Gemm", "fc", 3, (const char *[]){ "y", "gemm:w", "small" }, 1,
                                (const char *[]){ "z" }, &k));
    OK(qcal_onnx_node_set_int(m, k, "transB", 1));
    return m;
}

static void expect_same(const qcal_onnx_model *a, const qcal_onnx_model *b)
{
    void *x, *y;
    size_t lx, ly;
    OK(qcal_onnx_model_serialize(a, &x, &lx));
    OK(qcal_onnx_model_serialize(b, &y, &ly));
    assert_int_equal(lx, ly);
    assert_memory_equal(x, y, lx);
    qcal_free(x);
    qcal_free(y);
}

/* External data of large initializers, from memory (written through the save's bounce
 * buffer) and from a file mapping (copied file to file): read back, the same model. */
static void test_save_external_big(void **state)
{
    (void)state;
    qcal_onnx_model *m = make_big();
    qcal_onnx_save_options so;
    qcal_onnx_save_options_default(&so);
    so.external_threshold = 1000;
    so.external_min_bytes = 1024;
    OK(qcal_onnx_model_save_file(m, &so, T("bigx.onnx")));
    struct stat sb;
    assert_int_equal(stat(T("bigx.onnx.data"), &sb), 0);
    assert_true(sb.st_size >= (256 * 256 + 128 * 256) * 4);
    qcal_onnx_model *r = NULL;
    OK(qcal_onnx_model_load_file(T("bigx.onnx"), &r));
    expect_same(m, r);
    OK(qcal_onnx_model_save_file(m, NULL, T("inline.onnx")));
    qcal_onnx_model *f = NULL;
    OK(qcal_onnx_model_load_file(T("inline.onnx"), &f));   /* large initializers in the mapping */
    OK(qcal_onnx_model_save_file(f, &so, T("bigy.onnx")));
    qcal_onnx_model *r2 = NULL;
    OK(qcal_onnx_model_load_file(T("bigy.onnx"), &r2));
    expect_same(m, r2);
    qcal_onnx_model_destroy(&r2);
    qcal_onnx_model_destroy(&f);
    qcal_onnx_model_destroy(&r);
    qcal_onnx_model_destroy(&m);
}

static void expect_file(const char *path, const qcal_onnx_model *m)
{
    void *x;
    size_t lx, lf;
    OK(qcal_onnx_model_serialize(m, &x, &lx));
    void *f = tu_read_file(path, &lf);
    assert_int_equal(lf, lx);
    assert_memory_equal(f, x, lx);
    free(f);
    qcal_free(x);
}

static void test_large_initializers(void **state)
{
    (void)state;
    const char *names[] = { "x", "y", "z" };
    write_table(names, 3, T("big_table.json"));
    qcal_calib_table *table = NULL;
    OK(qcal_calib_table_read_json(T("big_table.json"), &table));
    qcal_onnx_model *m = make_big();
    OK(qcal_onnx_model_save_file(m, NULL, T("big.onnx")));
    size_t len;
    uint8_t *bytes = tu_read_file(T("big.onnx"), &len);
    assert_true(len > 256 * 1024);
    qcal_onnx_model *mapped = NULL, *copied = NULL;
    OK(qcal_onnx_model_load_file(T("big.onnx"), &mapped));
    OK(qcal_onnx_model_parse(bytes, len, &copied));
    expect_file(T("big.onnx"), mapped);
    expect_same(mapped, copied);
    OK(qcal_onnx_model_save_file(mapped, NULL, T("big2.onnx")));   /* copy_file_range path */
    expect_file(T("big2.onnx"), m);
    for (int p = 0; p < 2; p++) {
        qcal_onnx_qdq_options opt;
        qcal_onnx_qdq_options_default(&opt);
        opt.profile = p ? QCAL_ONNX_PROFILE_TENSORRT : QCAL_ONNX_PROFILE_ORT;
        qcal_onnx_model *a = NULL, *b = NULL;
        OK(qcal_onnx_model_load_file(T("big.onnx"), &a));
        OK(qcal_onnx_model_parse(bytes, len, &b));
        OK(qcal_onnx_qdq(a, table, &opt, NULL));
        OK(qcal_onnx_qdq(b, table, &opt, NULL));
        expect_same(a, b);
        /* ort dropped the mapped float weights: new data of the same size must be its own */
        float *fresh = malloc(256 * 256 * sizeof *fresh);
        for (int i = 0; i < 256 * 256; i++)
            fresh[i] = (float)i;
        OK(qcal_onnx_model_add_initializer_float(a, "fresh", 2, (int64_t[]){ 256, 256 }, fresh));
        OK(qcal_onnx_model_save_file(a, NULL, T("big_q.onnx")));
        expect_file(T("big_q.onnx"), a);
        qcal_onnx_model *r = NULL;
        OK(qcal_onnx_model_load_file(T("big_q.onnx"), &r));
        float *back;
        OK(qcal_onnx_initializer_float(r, "fresh", &back, NULL));
        assert_memory_equal(back, fresh, 256 * 256 * sizeof *fresh);
        qcal_free(back);
        if (p) {   /* tensorrt keeps the float weight */
            float *w0, *w1;
            OK(qcal_onnx_initializer_float(m, "big w", &w0, NULL));
            OK(qcal_onnx_initializer_float(r, "big w", &w1, NULL));
            assert_memory_equal(w0, w1, 256 * 256 * sizeof *w0);
            qcal_free(w0), qcal_free(w1);
        }
        free(fresh);
        qcal_onnx_model_destroy(&r);
        qcal_onnx_model_destroy(&a);
        qcal_onnx_model_destroy(&b);
    }
    /* every byte outside the large data flipped: a clean error or a model, never a crash;
     * the mapped and the copied readers agree */
    const uint8_t *data_at = NULL;
    float *w0;
    OK(qcal_onnx_initializer_float(m, "big w", &w0, NULL));
    for (size_t i = 0; i + 64 <= len && !data_at; i++)
        if (!memcmp(bytes + i, w0, 64))
            data_at = bytes + i;
    qcal_free(w0);
    assert_non_null(data_at);
    size_t lo = (size_t)(data_at - bytes), hi = lo + 256 * 256 * 4;
    uint8_t *flip = malloc(len);
    int refused = 0;
    for (size_t i = 0; i < len; i++) {
        /* the headers: the first 1 KiB, 16 bytes around each end of the large data, the
         * last 512 bytes (the graph's nodes, inputs and outputs) */
        bool near = i < 1024 || (i + 16 >= lo && i < lo + 16) || (i + 16 >= hi && i < hi + 16) ||
                    i + 512 >= len;
        if (!near)
            continue;
        memcpy(flip, bytes, len);
        flip[i] ^= 0xa5;
        qcal_onnx_model *r = (qcal_onnx_model *)(uintptr_t)0x1;
        qcal_status st = qcal_onnx_model_parse(flip, len, &r);
        if (st == QCAL_OK && i % 4 == 0) {
            qcal_onnx_qdq_options opt;
            qcal_onnx_qdq_options_default(&opt);
            qcal_onnx_qdq_report rep;
            if (qcal_onnx_qdq(r, table, &opt, &rep) == QCAL_OK)
                qcal_onnx_qdq_report_free(&rep);
        }
        if (st == QCAL_OK) {
            qcal_onnx_model_destroy(&r);
        } else {
            refused++;
            assert_ptr_equal(r, (qcal_onnx_model *)(uintptr_t)0x1);
        }
        if (i % 29 == 0) {   /* the mapped reader on a sample of them */
            tu_write_bytes(T("flip.onnx"), flip, len);
            qcal_onnx_model *f = NULL;
            qcal_status sf = qcal_onnx_model_load_file(T("flip.onnx"), &f);
            assert_int_equal(sf == QCAL_OK, st == QCAL_OK);
            qcal_onnx_model_destroy(&f);
        }
    }
    assert_true(refused > 0);
    free(flip);
    free(bytes);
    qcal_onnx_model_destroy(&mapped);
    qcal_onnx_model_destroy(&copied);
    qcal_onnx_model_destroy(&m);
    qcal_calib_table_destroy(&table);
}

/* Main-graph initializers in external data point into a mapping of the data file (one per
 * file, shared by the tensors in it): the loaded model, its save (copied file to file) and
 * qdq in both profiles give the bytes of the same model with its data inline. */
static void test_large_external(void **state)
{
    (void)state;
    const char *names[] = { "x", "y", "z" };
    write_table(names, 3, T("xbig_table.json"));
    qcal_calib_table *table = NULL;
    OK(qcal_calib_table_read_json(T("xbig_table.json"), &table));
    qcal_onnx_model *inl = make_big(), *m = make_big();
    float *w, *g;
    OK(qcal_onnx_initializer_float(m, "big w", &w, NULL));
    OK(qcal_onnx_initializer_float(m, "gemm:w", &g, NULL));
    /* one data file: 100 bytes of padding, "big w" at 100, "gemm:w" right after it */
    const size_t lw = 256 * 256 * 4, lg = 128 * 256 * 4;
    uint8_t *blob = malloc(100 + lw + lg);
    memset(blob, 0x5a, 100);
    memcpy(blob + 100, w, lw);
    memcpy(blob + 100 + lw, g, lg);
    mkdir(T("xext"), 0755);
    tu_write_bytes(T("xext/w.data"), blob, 100 + lw + lg);
    free(blob);
    qcal_free(w);
    qcal_free(g);
    OK(qcal_onnx_initializer_set_external(m, "big w", "w.data", 100, (int64_t)lw));
    OK(qcal_onnx_initializer_set_external(m, "gemm:w", "w.data", (int64_t)(100 + lw), (int64_t)lg));
    save(m, "xext/model.onnx");
    qcal_onnx_model_destroy(&m);
    OK(qcal_onnx_model_load_file(T("xext/model.onnx"), &m));
    expect_same(m, inl);
    OK(qcal_onnx_model_save_file(m, NULL, T("xext_saved.onnx")));
    expect_file(T("xext_saved.onnx"), inl);
    qcal_onnx_model_destroy(&m);
    for (int p = 0; p < 2; p++) {
        qcal_onnx_qdq_options opt;
        qcal_onnx_qdq_options_default(&opt);
        opt.profile = p ? QCAL_ONNX_PROFILE_TENSORRT : QCAL_ONNX_PROFILE_ORT;
        qcal_onnx_model *a = NULL, *b = make_big();
        OK(qcal_onnx_model_load_file(T("xext/model.onnx"), &a));
        OK(qcal_onnx_qdq(a, table, &opt, NULL));
        OK(qcal_onnx_qdq(b, table, &opt, NULL));
        expect_same(a, b);
        OK(qcal_onnx_model_save_file(a, NULL, T("xext_q.onnx")));
        expect_file(T("xext_q.onnx"), b);
        qcal_onnx_model_destroy(&a);
        qcal_onnx_model_destroy(&b);
    }
    qcal_onnx_model_destroy(&inl);
    /* one data file per tensor, 40 of them (more than the 32 descriptors a model keeps): the
     * files past those are saved from their mappings, with the same bytes */
    qcal_onnx_model *many = NULL, *many_inl = NULL;
    OK(qcal_onnx_model_create(8, 17, &many));
    OK(qcal_onnx_model_create(8, 17, &many_inl));
    float *v = malloc(lw);
    for (int i = 0; i < 40; i++) {
        char name[32], loc[32], path[64];
        for (size_t k = 0; k < lw / 4; k++)
            v[k] = (float)(i * 1000 + (int)(k % 997));
        snprintf(name, sizeof name, "t%d", i);
        snprintf(loc, sizeof loc, "t%d.bin", i);
        snprintf(path, sizeof path, "xext/%s", loc);
        tu_write_bytes(T(path), v, lw);
        OK(qcal_onnx_model_add_initializer_float(many, name, 2, (int64_t[]){ 256, 256 }, v));
        OK(qcal_onnx_model_add_initializer_float(many_inl, name, 2, (int64_t[]){ 256, 256 }, v));
        OK(qcal_onnx_initializer_set_external(many, name, loc, 0, (int64_t)lw));
    }
    free(v);
    OK(qcal_onnx_model_add_input(many, "x", QCAL_ONNX_FLOAT, 1, (int64_t[]){ 1 }));
    OK(qcal_onnx_model_add_input(many_inl, "x", QCAL_ONNX_FLOAT, 1, (int64_t[]){ 1 }));
    OK(qcal_onnx_model_add_output(many, "x", QCAL_ONNX_FLOAT, 1, (int64_t[]){ 1 }));
    OK(qcal_onnx_model_add_output(many_inl, "x", QCAL_ONNX_FLOAT, 1, (int64_t[]){ 1 }));
    save(many, "xext/many.onnx");
    qcal_onnx_model_destroy(&many);
    OK(qcal_onnx_model_load_file(T("xext/many.onnx"), &many));
    expect_same(many, many_inl);
    OK(qcal_onnx_model_save_file(many, NULL, T("xext_many_saved.onnx")));
    expect_file(T("xext_many_saved.onnx"), many_inl);
    qcal_onnx_model_destroy(&many);
    qcal_onnx_model_destroy(&many_inl);
    qcal_calib_table_destroy(&table);
}

/* A float32 weight larger than one streaming chunk (512 KiB) is read and quantized chunk by
 * chunk with per_channel_minmax: the same bytes as the whole-tensor path, which
 * moving_average_per_channel_minmax takes (one update: the same ranges), for a MatMul weight
 * of 2053 rows of 160 (chunks of 819, 819 and 415 rows) and a Gemm weight of 1000 channels
 * of 160 (blocks of 819 and 181 channels), from the file mapping and from a buffer, in both
 * profiles. */
static void test_streamed_weights(void **state)
{
    (void)state;
    const int64_t K = 2053, N = 160;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 17, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, K }));
    OK(qcal_onnx_model_add_output(m, "z", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 1000 }));
    float *w = malloc((size_t)(K * N) * sizeof *w);
    for (int64_t i = 0; i < K * N; i++)
        w[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f * (float)(1 + i % N);
    w[5] = -0.0f;
    w[K * N - 1] = 3000.0f;   /* the last chunk holds a channel's maximum */
    OK(qcal_onnx_model_add_initializer_float(m, "w", 2, (int64_t[]){ K, N }, w));
    free(w);
    OK(qcal_onnx_model_add_node(m, "MatMul", "mm", 2, (const char *[]){ "x", "w" }, 1, (const char *[]){ "y" }, NULL));
    /* Gemm transB=1, weight (1000, 160): channel axis 0, blocks of 819 and 181 channels */
    float *g = malloc(1000 * 160 * sizeof *g);
    for (int i = 0; i < 1000 * 160; i++)
        g[i] = (float)((i * 4099) % 3001 - 1500) / 700.0f * (float)(1 + i / 160 % 7);
    g[999 * 160 + 3] = -900.0f;   /* the last block holds a channel's minimum */
    OK(qcal_onnx_model_add_initializer_float(m, "g", 2, (int64_t[]){ 1000, 160 }, g));
    free(g);
    int64_t gk;
    OK(qcal_onnx_model_add_node(m, "Gemm", "fc", 2, (const char *[]){ "y", "g" }, 1, (const char *[]){ "z" }, &gk));
    OK(qcal_onnx_node_set_int(m, gk, "transB", 1));
    save(m, "stream.onnx");
    qcal_onnx_model_destroy(&m);
    const char *names[] = { "x", "y", "z" };
    write_table(names, 3, T("stream_table.json"));
    qcal_calib_table *table = NULL;
    OK(qcal_calib_table_read_json(T("stream_table.json"), &table));
    size_t len;
    uint8_t *bytes = tu_read_file(T("stream.onnx"), &len);
    for (int p = 0; p < 2; p++) {
        qcal_onnx_qdq_options opt;
        qcal_onnx_qdq_options_default(&opt);
        opt.profile = p ? QCAL_ONNX_PROFILE_TENSORRT : QCAL_ONNX_PROFILE_ORT;
        qcal_onnx_model *a = NULL, *b = NULL, *c = NULL;
        OK(qcal_onnx_model_load_file(T("stream.onnx"), &a));
        OK(qcal_onnx_model_parse(bytes, len, &b));
        OK(qcal_onnx_model_parse(bytes, len, &c));
        OK(qcal_onnx_qdq(a, table, &opt, NULL));
        OK(qcal_onnx_qdq(b, table, &opt, NULL));
        opt.weight_observer = QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
        OK(qcal_onnx_qdq(c, table, &opt, NULL));
        expect_same(a, c);
        expect_same(b, c);
        float *s;
        qcal_onnx_tensor_desc d;
        OK(qcal_onnx_initializer_float(a, "w_scale", &s, &d));
        assert_int_equal(d.ndim, 1);
        assert_int_equal(d.dims[0], N);
        assert_float_equal(s[N - 1], 3000.0f / 127.5f, 1e-3);
        qcal_free(s);
        OK(qcal_onnx_initializer_float(a, "g_scale", &s, &d));
        assert_int_equal(d.dims[0], 1000);
        assert_float_equal(s[999], 900.0f / 127.5f, 1e-3);
        qcal_free(s);
        qcal_onnx_model_destroy(&a);
        qcal_onnx_model_destroy(&b);
        qcal_onnx_model_destroy(&c);
    }
    free(bytes);
    qcal_calib_table_destroy(&table);
}

/* The bytes of file a equal those of file b. */
static void expect_same_file(const char *a, const char *b)
{
    size_t la, lb;
    void *fa = tu_read_file(a, &la), *fb = tu_read_file(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(fa, fb, la);
    free(fa);
    free(fb);
}

/* MatMul (x [1, 2053] by w [2053, 160]) -> Gemm (transB, g [1000, 160], bias gb); Conv of
 * img [1, 2, 4, 4] by cw [3, 2, 3, 3] with bias cb, and of img2 by the same cw with bias
 * cb2. */
static qcal_onnx_model *make_qs(const float *w, const float *g)
{
    const int64_t K = 2053, N = 160;
    qcal_onnx_model *m = NULL;
    OK(qcal_onnx_model_create(8, 17, &m));
    OK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, K }));
    OK(qcal_onnx_model_add_output(m, "z", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, 1000 }));
    OK(qcal_onnx_model_add_output(m, "c", QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, 3, 4, 4 }));
    OK(qcal_onnx_model_add_initializer_float(m, "w", 2, (int64_t[]){ K, N }, w));
    OK(qcal_onnx_model_add_node(m, "MatMul", "mm", 2, (const char *[]){ "x", "w" }, 1, (const char *[]){ "y" }, NULL));
    OK(qcal_onnx_model_add_initializer_float(m, "g", 2, (int64_t[]){ 1000, 160 }, g));
    float gb[1000];
    for (int i = 0; i < 1000; i++)
        gb[i] = (float)(i % 13 - 6) * 0.37f;
    OK(qcal_onnx_model_add_initializer_float(m, "gb", 1, (int64_t[]){ 1000 }, gb));
    int64_t gk;
    OK(qcal_onnx_model_add_node(m, "Gemm", "fc", 3, (const char *[]){ "y", "g", "gb" }, 1, (const char *[]){ "z" }, &gk));
    OK(qcal_onnx_node_set_int(m, gk, "transB", 1));
    float cw[3 * 2 * 9];
    for (int i = 0; i < 54; i++)
        cw[i] = (float)(i % 11 - 5) * 0.125f;
    OK(qcal_onnx_model_add_input(m, "img", QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, 2, 4, 4 }));
    OK(qcal_onnx_model_add_initializer_float(m, "cw", 4, (int64_t[]){ 3, 2, 3, 3 }, cw));
    OK(qcal_onnx_model_add_initializer_float(m, "cb", 1, (int64_t[]){ 3 }, (float[]){ 0.5f, -0.25f, 3.0f }));
    OK(qcal_onnx_model_add_initializer_float(m, "cb2", 1, (int64_t[]){ 3 }, (float[]){ -7.0f, 0.125f, 1e4f }));
    int64_t ck;
    OK(qcal_onnx_model_add_node(m, "Conv", "conv", 3, (const char *[]){ "img", "cw", "cb" }, 1, (const char *[]){ "c" }, &ck));
    OK(qcal_onnx_node_set_ints(m, ck, "pads", 4, (int64_t[]){ 1, 1, 1, 1 }));
    OK(qcal_onnx_model_add_input(m, "img2", QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, 2, 4, 4 }));
    OK(qcal_onnx_model_add_output(m, "c2", QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, 3, 4, 4 }));
    OK(qcal_onnx_model_add_node(m, "Conv", "conv2", 3, (const char *[]){ "img2", "cw", "cb2" }, 1, (const char *[]){ "c2" }, &ck));
    OK(qcal_onnx_node_set_ints(m, ck, "pads", 4, (int64_t[]){ 1, 1, 1, 1 }));
    return m;
}

/* qcal_onnx_qdq_save_file (weights observed, and with profile ort quantized with their biases,
 * on a second thread while the save writes the model) writes the bytes of qcal_onnx_qdq then
 * qcal_onnx_model_save_file: the streamed MatMul weight, the Gemm weight read by channel blocks
 * and a Conv weight shared by two Convs, loaded from the file (mapped) and from a buffer,
 * per-channel and per-tensor symmetric, both profiles, inline and with external data (whose
 * save detaches the weights' data while they are read), a wide input scale that makes the
 * plan observe the shared weight itself, weights holding NaN, NULL options. An output in a
 * missing directory: the save's error (QCAL_ERR_IO), the model left whole. */
static void test_qdq_save(void **state)
{
    (void)state;
    const int64_t K = 2053, N = 160;
    float *w = malloc((size_t)(K * N) * sizeof *w);
    for (int64_t i = 0; i < K * N; i++)
        w[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f * (float)(1 + i % N);
    w[K * N - 1] = 3000.0f;
    float *g = malloc(1000 * 160 * sizeof *g);
    for (int i = 0; i < 1000 * 160; i++)
        g[i] = (float)((i * 4099) % 3001 - 1500) / 700.0f * (float)(1 + i / 160 % 7);
    qcal_onnx_model *m = make_qs(w, g);
    save(m, "qs.onnx");
    /* img2's range: about 9 (scale 0.035) or 60,000 (ort input scale 235 > 127: its bias
     * cannot wait for the shared weight cw, which is then observed in the plan, with the
     * bias of conv already deferred) */
    const char *names[] = { "x", "y", "img", "img2" };
    write_table(names, 4, T("qs_table.json"));
    write_table_scaled(names, (const float[]){ 1, 1, 1, 1e4f }, 4, T("qs_wide.json"));
    qcal_calib_table *table = NULL, *wide = NULL;
    OK(qcal_calib_table_read_json(T("qs_table.json"), &table));
    OK(qcal_calib_table_read_json(T("qs_wide.json"), &wide));
    size_t len;
    uint8_t *bytes = tu_read_file(T("qs.onnx"), &len);
    mkdir(T("qsr"), 0755);
    mkdir(T("qsn"), 0755);
    for (int c = 0; c < 16; c++) {
        const qcal_calib_table *tab = c & 8 ? wide : table;
        qcal_onnx_qdq_options opt;
        qcal_onnx_qdq_options_default(&opt);
        opt.profile = c & 1 ? QCAL_ONNX_PROFILE_ORT : QCAL_ONNX_PROFILE_TENSORRT;
        opt.weight_qscheme = c & 2 ? QCAL_PER_TENSOR_SYMMETRIC : QCAL_PER_CHANNEL_SYMMETRIC;
        qcal_onnx_save_options so;
        qcal_onnx_save_options_default(&so);
        if (c & 4)
            so.external_threshold = 1 << 16;   /* PATH.data */
        for (int from_file = 0; from_file < 2; from_file++) {
            qcal_onnx_model *a = NULL, *b = NULL;
            if (from_file) {
                OK(qcal_onnx_model_load_file(T("qs.onnx"), &a));
                OK(qcal_onnx_model_load_file(T("qs.onnx"), &b));
            } else {
                OK(qcal_onnx_model_parse(bytes, len, &a));
                OK(qcal_onnx_model_parse(bytes, len, &b));
            }
            qcal_onnx_qdq_report ra, rb;
            OK(qcal_onnx_qdq(a, tab, &opt, &ra));
            OK(qcal_onnx_model_save_file(a, &so, T("qsr/q.onnx")));
            qcal_status qs_st = qcal_onnx_qdq_save_file(b, tab, &opt, &so, T("qsn/q.onnx"), &rb);
            if (qs_st != QCAL_OK)
                fail_msg("config %d from_file %d: %s", c, from_file, qcal_last_error());
            assert_int_equal(ra.ops, 4);
            assert_int_equal(rb.ops, ra.ops);
            assert_int_equal(rb.weights, 3);
            assert_int_equal(rb.tensors, ra.tensors);
            assert_int_equal(ra.biases, c & 1 ? 3 : 0);   /* ort: gb, cb, cb2 */
            assert_int_equal(rb.biases, ra.biases);
            expect_same_file(T("qsr/q.onnx"), T("qsn/q.onnx"));
            if (c & 4)   /* same names: the model refers to its data file by name */
                expect_same_file(T("qsr/q.onnx.data"), T("qsn/q.onnx.data"));
            expect_same(a, b);   /* the model in memory holds the scales too */
            float *s;
            qcal_onnx_tensor_desc d;
            OK(qcal_onnx_initializer_float(b, "w_scale", &s, &d));
            if (c & 2)
                assert_int_equal(d.ndim, 0);
            else
                assert_float_equal(s[N - 1], 3000.0f / 127.5f, 1e-3);
            qcal_free(s);
            qcal_onnx_qdq_report_free(&ra);
            qcal_onnx_qdq_report_free(&rb);
            qcal_onnx_model_destroy(&a);
            qcal_onnx_model_destroy(&b);
        }
    }
    /* NaN in the weights (skipped and counted by the observers): the same bytes */
    for (int64_t i = 0; i < K; i += 3)
        w[i * N + 7] = NAN;   /* channel 7: a third NaN */
    for (int64_t i = 0; i < K; i++)
        w[i * N + 9] = NAN;   /* channel 9: all NaN (scale 1) */
    qcal_onnx_model_destroy(&m);
    m = make_qs(w, g);
    save(m, "qs_nan.onnx");
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.profile = QCAL_ONNX_PROFILE_TENSORRT;
    qcal_onnx_model *a = NULL, *b = NULL;
    OK(qcal_onnx_model_load_file(T("qs_nan.onnx"), &a));
    OK(qcal_onnx_model_load_file(T("qs_nan.onnx"), &b));
    OK(qcal_onnx_qdq(a, table, &opt, NULL));
    OK(qcal_onnx_model_save_file(a, NULL, T("qsr/nan.onnx")));
    OK(qcal_onnx_qdq_save_file(b, table, &opt, NULL, T("qsn/nan.onnx"), NULL));
    expect_same_file(T("qsr/nan.onnx"), T("qsn/nan.onnx"));
    float *s;
    OK(qcal_onnx_initializer_float(b, "w_scale", &s, NULL));
    assert_float_equal(s[9], 1.0f, 0);
    qcal_free(s);
    qcal_onnx_model_destroy(&a);
    qcal_onnx_model_destroy(&b);
    /* default options (NULL: profile ort) */
    OK(qcal_onnx_model_load_file(T("qs.onnx"), &a));
    OK(qcal_onnx_model_load_file(T("qs.onnx"), &b));
    OK(qcal_onnx_qdq(a, table, NULL, NULL));
    OK(qcal_onnx_model_save_file(a, NULL, T("qsr/def.onnx")));
    OK(qcal_onnx_qdq_save_file(b, table, NULL, NULL, T("qsn/def.onnx"), NULL));
    expect_same_file(T("qsr/def.onnx"), T("qsn/def.onnx"));
    qcal_onnx_model_destroy(&a);
    qcal_onnx_model_destroy(&b);
    /* an output the save cannot write: QCAL_ERR_IO, and the model is the quantized one, whole
     * (every weight computed: saved elsewhere it is qcal_onnx_qdq's, byte for byte) */
    OK(qcal_onnx_model_load_file(T("qs.onnx"), &a));
    OK(qcal_onnx_model_load_file(T("qs.onnx"), &b));
    OK(qcal_onnx_qdq(a, table, &opt, NULL));
    OK(qcal_onnx_model_save_file(a, NULL, T("qsr/io.onnx")));
    assert_int_equal(qcal_onnx_qdq_save_file(b, table, &opt, NULL, T("no such dir/qs.onnx"), NULL), QCAL_ERR_IO);
    OK(qcal_onnx_model_save_file(b, NULL, T("qsn/io.onnx")));
    expect_same_file(T("qsr/io.onnx"), T("qsn/io.onnx"));
    qcal_onnx_model_destroy(&a);
    qcal_onnx_model_destroy(&b);
    free(w);
    free(g);
    free(bytes);
    qcal_onnx_model_destroy(&m);
    qcal_calib_table_destroy(&table);
    qcal_calib_table_destroy(&wide);
}

/* JSON string literal of s into dst (quotes and backslashes escaped). */
static void json_str(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    dst[o++] = '"';
    for (; *s && o + 3 < cap; s++) {
        if (*s == '"' || *s == '\\')
            dst[o++] = '\\';
        dst[o++] = *s;
    }
    dst[o++] = '"';
    dst[o] = '\0';
}

/* Names with spaces, slashes, colons, quotes and non-ASCII work through the whole chain. */
static void test_names(void **state)
{
    (void)state;
    static const char *const odd[] = {
        "input 0:0", "/conv 1/Conv_output_0", "/re lu/\"q\"'s:0", "fl\xc3\xa4tten/\xe2\x9c\x93", "log:its",
        "w/eight 1", "b:ias", "fc \"w\"",
    };
    qcal_onnx_model *m = make_model(odd, 2);
    save(m, "odd.onnx");
    qcal_onnx_model_destroy(&m);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s'", T("odd.onnx"), T("exp.onnx"), T("names.txt")), 0);
    char list[1024];
    tu_slurp(T("names.txt"), list, sizeof list);
    char want[1024];
    snprintf(want, sizeof want, "%s\n%s\n%s\n", odd[0], odd[2], odd[4]);
    assert_string_equal(list, want);
    /* a dump through manifest.json, calibrate, qdq */
    mkdir(T("dump"), 0755);
    char manifest[4096] = "{\"tensors\": [";
    const int idx[3] = { 0, 2, 4 };
    for (int i = 0; i < 3; i++) {
        float x[4] = { -1.0f, 0.5f * (float)(i + 1), 2.0f, 0.0f };
        char rel[32], path[64];
        snprintf(rel, sizeof rel, "t%d.npy", i);
        snprintf(path, sizeof path, "dump/%s", rel);
        OK(qcal_npy_write(T(path), QCAL_NPY_F32, 1, (int64_t[]){ 4 }, x));
        char js[256];
        json_str(js, sizeof js, odd[idx[i]]);
        char e[512];
        snprintf(e, sizeof e, "%s{\"name\": %s, \"role\": \"activation\", \"files\": [\"%s\"]}", i ? ", " : "", js, rel);
        strcat(manifest, e);
    }
    strcat(manifest, "]}");
    tu_write_bytes(T("dump/manifest.json"), manifest, strlen(manifest));
    assert_int_equal(qcal("calibrate '%s' -o '%s' --format json --observer minmax", T("dump"), T("t.json")), 0);
    for (int p = 0; p < 2; p++) {
        const char *prof = p ? "tensorrt" : "ort";
        assert_int_equal(qcal("qdq '%s' --table '%s' -o '%s' --profile %s --strict", T("odd.onnx"), T("t.json"),
                              T("q.onnx"), prof), p ? 1 : 0);   /* tensorrt also wants the Flatten output */
        if (p)
            tu_expect_one_line(err, "qcal: qdq: ", "'fl\xc3\xa4tten/\xe2\x9c\x93'");
    }
    qcal_onnx_model *q = NULL;
    OK(qcal_onnx_model_load_file(T("q.onnx"), &q));
    char sc[256];
    snprintf(sc, sizeof sc, "%s_scale", odd[2]);
    float *s;
    OK(qcal_onnx_initializer_float(q, sc, &s, NULL));
    qcal_free(s);
    const char *o;
    OK(qcal_onnx_output_at(q, 0, &o));
    assert_string_equal(o, odd[4]);
    qcal_onnx_model_destroy(&q);
    if (have_checker()) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c 'import onnx,sys; [onnx.checker.check_model(onnx.load(p), full_check=True) for p in sys.argv[1:]]' '%s' '%s'",
                 T("q.onnx"), T("exp.onnx"));
        assert_int_equal(system(cmd), 0);
    } else {
        printf("skipping onnx.checker: /usr/bin/python3 with onnx (python3-onnx) is not installed\n");
    }
    /* a line break in a name: --list cannot hold it (exit 1); expose alone works */
    static const char *const nl[] = { "in\nput", "c", "r", "f", "y", "w", "b", "fw" };
    m = make_model(nl, 2);
    save(m, "nl.onnx");
    qcal_onnx_model_destroy(&m);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s'", T("nl.onnx"), T("e.onnx"), T("n.txt")), 1);
    tu_expect_one_line(err, "qcal: onnx-expose: ", "holds a line break");
    assert_int_equal(access(T("n.txt"), F_OK), -1);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s'", T("nl.onnx"), T("e.onnx")), 0);
}

/* onnx-expose --exclude: the same globs as qdq's (node and tensor names); an excluded tensor
 * is neither listed nor exposed, and the op reading it stays float. */
static void test_expose_exclude(void **state)
{
    (void)state;
    qcal_onnx_model *m = make_model(plain, 2);
    save(m, "ex.onnx");
    qcal_onnx_model_destroy(&m);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s'", T("ex.onnx"), T("ex_all.onnx"), T("all.txt")), 0);
    char list[1024];
    tu_slurp(T("all.txt"), list, sizeof list);
    assert_string_equal(list, "x\nr\ny\n");
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s' --exclude 'r' --exclude 'nomatch*'", T("ex.onnx"),
                          T("ex_r.onnx"), T("r.txt")),
                     0);
    tu_slurp(T("r.txt"), list, sizeof list);
    /* r excluded: the Conv output Q goes on c (no Relu to fold), the Gemm looks up its input f */
    assert_string_equal(list, "x\nc\nf\ny\n");
    qcal_onnx_model *e = NULL;
    OK(qcal_onnx_model_load_file(T("ex_r.onnx"), &e));
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(e, &info));
    for (int64_t i = 0; i < info.outputs; i++) {
        const char *o;
        OK(qcal_onnx_output_at(e, i, &o));
        assert_string_not_equal(o, "r");
    }
    qcal_onnx_model_destroy(&e);
}

/* --profile ort,tensorrt: one model holding both profiles' tensors (the union of the two
 * lists, in profile then graph order); the list of each alone is a part of it. */
static void test_expose_both_profiles(void **state)
{
    (void)state;
    qcal_onnx_model *m = make_model(plain, 2);
    save(m, "bp.onnx");
    qcal_onnx_model_destroy(&m);
    char ort[1024], trt[1024], both[2048];
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s' -q", T("bp.onnx"), T("bp_o.onnx"), T("o.txt")), 0);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s' --profile tensorrt -q", T("bp.onnx"),
                          T("bp_t.onnx"), T("t.txt")),
                     0);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --list '%s' --profile ort,tensorrt", T("bp.onnx"),
                          T("bp_b.onnx"), T("b.txt")),
                     0);
    tu_slurp(T("o.txt"), ort, sizeof ort);
    tu_slurp(T("t.txt"), trt, sizeof trt);
    tu_slurp(T("b.txt"), both, sizeof both);
    /* ort: x r y (the Relu folded into the Conv's output Q); tensorrt: the op inputs x f */
    assert_string_equal(ort, "x\nr\ny\n");
    assert_string_equal(trt, "x\nf\n");
    assert_string_equal(both, "x\nr\ny\nf\n");
    assert_non_null(strstr(out, "(profile ort,tensorrt): 4 tensors exposed"));
    /* every name of the list is an output of the model written */
    qcal_onnx_model *e = NULL;
    OK(qcal_onnx_model_load_file(T("bp_b.onnx"), &e));
    qcal_onnx_model_info info;
    OK(qcal_onnx_model_get_info(e, &info));
    const char *want[] = { "x", "r", "y", "f" };
    for (int k = 0; k < 4; k++) {
        bool found = false;
        for (int64_t i = 0; i < info.outputs && !found; i++) {
            const char *o;
            OK(qcal_onnx_output_at(e, i, &o));
            found = !strcmp(o, want[k]);
        }
        assert_true(found);
    }
    qcal_onnx_model_destroy(&e);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --profile ort,ort", T("bp.onnx"), T("bp_x.onnx")), 2);
    assert_int_equal(qcal("onnx-expose '%s' -o '%s' --profile ort,tensorrt,ort", T("bp.onnx"), T("bp_x.onnx")), 2);
}

int main(void)
{
    if (!qcal_onnx_available()) {
        printf("skipping: qcal was built without ONNX support (meson -Donnx)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_table_of_another_model),
        cmocka_unit_test(test_external_inside),
        cmocka_unit_test(test_save_external),
        cmocka_unit_test(test_save_external_big),
        cmocka_unit_test(test_large_initializers),
        cmocka_unit_test(test_large_external),
        cmocka_unit_test(test_streamed_weights),
        cmocka_unit_test(test_qdq_save),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_expose_exclude),
        cmocka_unit_test(test_expose_both_profiles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
