/* Real engines' names and files through the CLI (issue 15): percent-encoded dump names and
 * manifest names end up in every format; several formats at once equal single-format runs
 * byte for byte; ONNX Runtime's three files equal write_calibration_table's (checked with
 * Debian's python3-flatbuffers by tests/check_ort_files.py); convert equals calibrating
 * directly; --weights gives per-channel weight entries with the expected numbers; names a
 * format cannot hold fail with one line listing all of them or are skipped with a warning;
 * the TensorRT header follows the observer; stats names tensors from a dump's layout. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/calib.h"
#include "qcal/calib_dump.h"
#include "qcal/qcal.h"

#include "testutil.h"

static char tmpdir[64];
static char out[1 << 16], err[1 << 14];

static const char *const all_formats[] = { "json", "tensorrt", "onnxruntime", "ncnn" };

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_fmtcli_XXXXXX");
    if (!mkdtemp(tmpdir) || !getenv("QCAL_BIN"))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmpdir);
    return 0;
}

static int run(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    int rc = tu_run_va(getenv("QCAL_BIN"), first, ap, tmpdir, out, sizeof out, err,
                       sizeof err);
    va_end(ap);
    return rc;
}

/* tmpdir/name (copied: stays valid). */
static char *T(const char *name)
{
    return strdup(tu_path(tmpdir, name));
}

static void mkdirs(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

static void save(const char *path, const float *v, int32_t ndim, const int64_t *shape)
{
    assert_int_equal(qcal_npy_write(path, QCAL_NPY_F32, ndim, shape, v), QCAL_OK);
}

/* Batch b of a tensor: 8 values scaled by (1 + b) and seed. */
static void save_batch(const char *path, float seed, int b)
{
    float v[8];
    for (int i = 0; i < 8; i++)
        v[i] = (float)(i - 3) * 0.37f * seed * (float)(1 + b);
    int64_t shape[2] = { 2, 4 };
    save(path, v, 2, shape);
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    if (na != nb || memcmp(x, y, na))
        fail_msg("'%s' (%zu bytes) differs from '%s' (%zu bytes)", a, na, b, nb);
    free(x);
    free(y);
}

static void assert_file_has(const char *path, const char *needle)
{
    size_t n;
    char *x = tu_read_file(path, &n);
    if (!memmem(x, n, needle, strlen(needle)))
        fail_msg("'%s' lacks '%s':\n%s", path, needle, x);
    free(x);
}

/* A dump whose names need decoding: "/layer1/conv/Conv_output_0" (batches in a directory),
 * "input:0" (one file), "100%" and "fc.weight". */
static char *make_encoded_dump(void)
{
    char *d = T("encdump");
    mkdirs(tu_path(d, "%2Flayer1%2Fconv%2FConv_output_0"));
    for (int b = 0; b < 3; b++) {
        char name[64];
        snprintf(name, sizeof name, "%%2Flayer1%%2Fconv%%2FConv_output_0/%03d.npy", b);
        save_batch(tu_path(d, name), 1.0f, b);
    }
    save_batch(tu_path(d, "input%3A0.npy"), 2.0f, 0);
    save_batch(tu_path(d, "100%25.npy"), 0.5f, 0);
    save_batch(tu_path(d, "fc.weight.npy"), 0.25f, 0);
    return d;
}

/* The same tensors named by a manifest in a nested layout (plus a weight given a role). */
static char *make_manifest_dump(void)
{
    char *d = T("mandump");
    mkdirs(tu_path(d, "deep/a"));
    mkdirs(tu_path(d, "b"));
    for (int b = 0; b < 3; b++) {
        char name[64];
        snprintf(name, sizeof name, "deep/a/x%d.npy", b);
        save_batch(tu_path(d, name), 1.0f, b);
    }
    save_batch(tu_path(d, "b/in.npy"), 2.0f, 0);
    save_batch(tu_path(d, "b/pct.npy"), 0.5f, 0);
    save_batch(tu_path(d, "w.npy"), 0.25f, 0);
    const char *m =
        "{\"tensors\": [\n"
        "  {\"name\": \"/layer1/conv/Conv_output_0\", \"role\": \"activation\",\n"
        "   \"files\": [\"deep/a/x0.npy\", \"deep/a/x1.npy\", \"deep/a/x2.npy\"]},\n"
        "  {\"name\": \"input:0\", \"files\": [\"b/in.npy\"]},\n"
        "  {\"name\": \"100%\", \"role\": \"activation\", \"files\": [\"b/pct.npy\"]},\n"
        "  {\"name\": \"fc.weight\", \"role\": \"weight\", \"files\": [\"w.npy\"]}\n"
        "]}\n";
    tu_write_bytes(tu_path(d, "manifest.json"), m, strlen(m));
    return d;
}

static void check_ort(const char *dir, const char *const *names, int n)
{
    char cmd[8192];
    const char *root = getenv("QCAL_SOURCE_ROOT");
    int o = snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/check_ort_files.py' '%s'",
                     root ? root : ".", dir);
    for (int i = 0; i < n; i++)
        o += snprintf(cmd + o, sizeof cmd - (size_t)o, " '%s'", names[i]);
    o += snprintf(cmd + o, sizeof cmd - (size_t)o, " >'%s/.py' 2>&1", tmpdir);
    int rc = system(cmd);
    char log[4096];
    tu_slurp(tu_path(tmpdir, ".py"), log, sizeof log);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("check_ort_files.py on %s failed:\n%s", dir, log);
    assert_non_null(strstr(log, ": ok"));
}

/* Both dumps: every format at once holds the decoded names, and the two dumps give the
 * same tables (the manifest names the same tensors). */
static void test_names_in_every_format(void **state)
{
    (void)state;
    char *enc = make_encoded_dump(), *man = make_manifest_dump();
    char *o1 = T("out_enc"), *o2 = T("out_man");
    const char *acts[] = { "/layer1/conv/Conv_output_0", "input:0", "100%" };
    assert_int_equal(run("calibrate", enc, "--format", "json,tensorrt,onnxruntime,ncnn", "-o",
                         o1, "--observer", "minmax", NULL), 0);
    assert_int_equal(run("calibrate", man, "--format", "json,tensorrt,onnxruntime,ncnn", "-o",
                         o2, "--observer", "minmax", NULL), 0);
    const char *files[] = { "qcal_table.json", "tensorrt.cache", "calibration.json",
                            "calibration.flatbuffers", "calibration.cache", "ncnn.table" };
    for (size_t f = 0; f < 6; f++) {
        char *a = strdup(tu_path(o1, files[f]));
        char *b = strdup(tu_path(o2, files[f]));
        assert_same_file(a, b);
        free(a);
        free(b);
    }
    for (int i = 0; i < 3; i++) {
        char line[256];
        snprintf(line, sizeof line, "\"%s\"", acts[i]);
        assert_file_has(tu_path(o1, "qcal_table.json"), line);
        assert_file_has(tu_path(o1, "calibration.json"), line);
        snprintf(line, sizeof line, "\n%s: ", acts[i]);
        assert_file_has(tu_path(o1, "tensorrt.cache"), line);
        snprintf(line, sizeof line, "%s ", acts[i]);
        assert_file_has(tu_path(o1, "calibration.cache"), line);
        assert_file_has(tu_path(o1, "calibration.flatbuffers"), acts[i]);
        assert_file_has(tu_path(o1, "ncnn.table"), line);
    }
    assert_file_has(tu_path(o1, "ncnn.table"), "fc_param_0 ");
    check_ort(o1, acts, 3);
    /* The weight of the manifest (role given) and of the layout (".weight") agree. */
    assert_file_has(tu_path(o2, "qcal_table.json"), "\"fc.weight\", \"role\": \"weight\"");
    /* Rules globs match decoded names. */
    char *rules = T("glob.rules");
    const char *r = "/layer1/* activation percentile percentile=90\n";
    tu_write_bytes(rules, r, strlen(r));
    char *t = T("glob.json");
    assert_int_equal(run("calibrate", enc, "-o", t, "--rules", rules, NULL), 0);
    assert_file_has(t, "\"fqn\": \"/layer1/conv/Conv_output_0\", \"role\": \"activation\", "
                       "\"observer\": \"percentile\"");
    assert_file_has(t, "\"fqn\": \"input:0\", \"role\": \"activation\", \"observer\": "
                       "\"histogram\"");
    free(rules);
    free(t);
    free(enc);
    free(man);
    free(o1);
    free(o2);
}

/* --format A,B,C -o DIR equals one run per format, byte for byte; convert equals direct. */
static void test_multi_equals_single_and_convert(void **state)
{
    (void)state;
    char *enc = make_encoded_dump(), *all = T("multi");
    assert_int_equal(run("calibrate", enc, "--format", "json,tensorrt,onnxruntime,ncnn", "-o",
                         all, NULL), 0);
    assert_non_null(strstr(out, "(json,tensorrt,onnxruntime,ncnn)"));
    char *json = strdup(tu_path(all, "qcal_table.json"));
    for (int f = 0; f < 4; f++) {
        char name[64];
        snprintf(name, sizeof name, "single_%s", all_formats[f]);
        char *single = T(name);
        assert_int_equal(run("calibrate", enc, "--format", all_formats[f], "-o", single, NULL),
                         0);
        snprintf(name, sizeof name, "conv_%s", all_formats[f]);
        char *conv = T(name);
        assert_int_equal(run("convert", json, "--format", all_formats[f], "-o", conv, NULL), 0);
        if (f == 2) {   /* onnxruntime: a directory of its three files */
            const char *ort[] = { "calibration.json", "calibration.flatbuffers",
                                  "calibration.cache" };
            for (int k = 0; k < 3; k++) {
                char *a = strdup(tu_path(all, ort[k])), *b = strdup(tu_path(single, ort[k]));
                char *c = strdup(tu_path(conv, ort[k]));
                assert_same_file(a, b);
                assert_same_file(a, c);
                free(a);
                free(b);
                free(c);
            }
        } else {
            const char *fn = f == 0 ? "qcal_table.json" : f == 1 ? "tensorrt.cache"
                                                               : "ncnn.table";
            char *a = strdup(tu_path(all, fn));
            assert_same_file(a, single);
            assert_same_file(a, conv);
            free(a);
        }
        free(single);
        free(conv);
    }
    /* convert to several formats at once = the multi-format calibration */
    char *conv_all = T("conv_all");
    assert_int_equal(run("convert", json, "--format", "tensorrt,onnxruntime,ncnn", "-o",
                         conv_all, NULL), 0);
    const char *files[] = { "tensorrt.cache", "calibration.json", "calibration.flatbuffers",
                            "calibration.cache", "ncnn.table" };
    for (int k = 0; k < 5; k++) {
        char *a = strdup(tu_path(all, files[k])), *b = strdup(tu_path(conv_all, files[k]));
        assert_same_file(a, b);
        free(a);
        free(b);
    }
    assert_int_equal(tu_count_entries(conv_all, NULL), 5);
    /* Usage: several formats into an existing file, a format twice, a bad table. */
    assert_int_equal(run("calibrate", enc, "--format", "json,ncnn", "-o", json, NULL), 4);
    tu_expect_one_line(err, "qcal: calibrate: ", "not a directory");
    assert_int_equal(run("calibrate", enc, "--format", "json,json", "-o", all, NULL), 2);
    tu_expect_one_line(err, "qcal: calibrate: ", "listed twice");
    char *nowhere = T("conv_bad.table");
    assert_int_equal(run("convert", enc, "--format", "ncnn", "-o", nowhere, NULL), 3);
    assert_int_equal(access(nowhere, F_OK), -1);
    free(nowhere);
    tu_expect_one_line(err, "qcal: convert: ", NULL);
    free(conv_all);
    free(json);
    free(enc);
    free(all);
}

/* ONNX Runtime's files for many values and awkward names: write_calibration_table's bytes
 * (its str() of every float, its JSON escaping, its flatbuffer layout). */
static void test_onnxruntime_many(void **state)
{
    (void)state;
    char *d = T("many");
    mkdirs(d);
    char m[16384];
    int o = snprintf(m, sizeof m, "{\"tensors\": [");
    static const char *const names[] = { "a", "input:0", "\\u00e9t\\u00e9", "q\\\"uote",
                                         "\\ud83d\\ude00", "x/y/z", "tab\\u0001" };
    for (int i = 0; i < 40; i++) {
        char file[32];
        snprintf(file, sizeof file, "t%02d.npy", i);
        float v[3];
        double mag = pow(10.0, (double)(i % 24) - 9.0);
        v[0] = (float)(-mag * (1.0 + i * 0.123456789));
        v[1] = (float)(mag * 0.5);
        v[2] = (float)(mag * (0.7 + i * 0.01));
        if (i == 5)
            v[0] = v[1] = v[2] = 0.0f;   /* all zeros: value 1.0 (qcal's amax rule) */
        int64_t shape[1] = { 3 };
        save(tu_path(d, file), v, 1, shape);
        if (i < 7)
            o += snprintf(m + o, sizeof m - (size_t)o, "%s{\"name\": \"%s\", \"files\": [\"%s\"]}",
                          i ? ", " : "", names[i], file);
        else
            o += snprintf(m + o, sizeof m - (size_t)o, ", {\"name\": \"n%02d\", \"files\": "
                          "[\"%s\"]}", i, file);
    }
    snprintf(m + o, sizeof m - (size_t)o, "]}");
    tu_write_bytes(tu_path(d, "manifest.json"), m, strlen(m));
    char *od = T("many_out");
    /* tab\x01 holds a control byte: fine for every format but ncnn/ort? it is not white
     * space, so all formats hold it. */
    assert_int_equal(run("calibrate", d, "--format", "onnxruntime", "-o", od, "--observer",
                         "minmax", NULL), 0);
    const char *want[] = { "input:0", "x/y/z", "n39" };
    check_ort(od, want, 3);
    assert_file_has(tu_path(od, "calibration.json"), "\"\\u00e9t\\u00e9\"");
    assert_file_has(tu_path(od, "calibration.json"), "\"\\ud83d\\ude00\"");
    free(d);
    free(od);
}

/* --weights: every tensor of 2+ dimensions per output channel (qint8 symmetric), 1-D
 * skipped; the numbers are amax / 127.5 per row. */
static void test_weights(void **state)
{
    (void)state;
    char *st = T("model.safetensors");
    float w1[4 * 3], w2[2 * 2 * 1 * 1], b[4];
    for (int i = 0; i < 12; i++)
        w1[i] = (float)((i * 7) % 11 - 5) * 0.1f;
    w2[0] = 1.0f, w2[1] = -3.0f, w2[2] = 0.5f, w2[3] = 0.25f;
    for (int i = 0; i < 4; i++)
        b[i] = 100.0f;
    qcal_tensor t[3];
    int64_t s1[2] = { 4, 3 }, s2[4] = { 2, 2, 1, 1 }, s3[1] = { 4 };
    assert_int_equal(qcal_tensor_init(&t[0], w1, 2, s1), QCAL_OK);
    assert_int_equal(qcal_tensor_init(&t[1], w2, 4, s2), QCAL_OK);
    assert_int_equal(qcal_tensor_init(&t[2], b, 1, s3), QCAL_OK);
    const char *names[] = { "fc.weight", "conv.weight", "fc.bias" };
    assert_int_equal(qcal_safetensors_write_f32(st, 3, names, t, 0, NULL), QCAL_OK);
    char *enc = make_encoded_dump(), *tab = T("weights.json");
    /* The dump's own fc.weight and the file's would be the same tensor twice: use a dump
     * without it (a manifest of two activations). */
    char *d = T("wdump");
    mkdirs(d);
    save_batch(tu_path(d, "a.npy"), 1.0f, 0);
    assert_int_equal(run("calibrate", d, "--weights", st, "-o", tab, NULL), 0);
    assert_non_null(strstr(out, "2 weights"));
    assert_non_null(strstr(out, "1 tensor under 2 dimensions skipped"));
    qcal_calib_table *tb = NULL;
    assert_int_equal(qcal_calib_table_read_json(tab, &tb), QCAL_OK);
    const qcal_calib_entry *e;
    assert_int_equal(qcal_calib_table_find(tb, "fc.bias", QCAL_CALIB_ROLE_WEIGHT, &e),
                     QCAL_ERR_NOT_FOUND);
    assert_int_equal(qcal_calib_table_find(tb, "fc.weight", QCAL_CALIB_ROLE_WEIGHT, &e),
                     QCAL_OK);
    assert_int_equal(e->qparams.channels, 4);
    assert_int_equal(e->qparams.qscheme, QCAL_PER_CHANNEL_SYMMETRIC);
    for (int r = 0; r < 4; r++) {
        float amax = 0.0f;
        for (int c = 0; c < 3; c++)
            amax = fmaxf(amax, fabsf(w1[r * 3 + c]));
        float want = amax / ((float)(127 - -128) / 2.0f);
        if (e->qparams.scales[r] != want)
            fail_msg("fc.weight channel %d: scale %.9g, want %.9g", r,
                     (double)e->qparams.scales[r], (double)want);
        assert_int_equal(e->qparams.zero_points[r], 0);
    }
    assert_int_equal(qcal_calib_table_find(tb, "conv.weight", QCAL_CALIB_ROLE_WEIGHT, &e),
                     QCAL_OK);
    assert_int_equal(e->qparams.channels, 2);
    assert_true(e->qparams.scales[0] == 3.0f / 127.5f);
    assert_true(e->qparams.scales[1] == 0.5f / 127.5f);
    qcal_calib_table_destroy(&tb);
    /* A .safetensors file inside the dump is pointed out unless --weights reads it. */
    char *inside = strdup(tu_path(d, "model.safetensors"));
    assert_int_equal(qcal_safetensors_write_f32(inside, 3, names, t, 0, NULL), QCAL_OK);
    assert_int_equal(run("calibrate", d, "-o", tab, NULL), 0);
    assert_non_null(strstr(err, "note: "));
    assert_non_null(strstr(err, "model.safetensors' is not read as a dump; pass --weights"));
    assert_int_equal(run("calibrate", d, "-o", tab, "--weights", inside, NULL), 0);
    assert_string_equal(err, "");
    unlink(inside);
    free(inside);
    /* Repeatable; the same weight twice is an error naming it. */
    assert_int_equal(run("calibrate", d, "--weights", st, "--weights", st, "-o", tab, NULL), 3);
    tu_expect_one_line(err, "qcal: calibrate: ", "fc.weight");
    /* A missing file: exit 3. */
    assert_int_equal(run("calibrate", d, "--weights", "/nonexistent.safetensors", "-o", tab,
                         NULL), 3);
    free(st);
    free(enc);
    free(tab);
    free(d);
}

/* Names a format cannot hold: one line listing every one (exit 1), nothing written; with
 * --skip-unrepresentable a warning and the others written. */
static void test_unrepresentable_names(void **state)
{
    (void)state;
    char *d = T("spaces");
    mkdirs(d);
    save_batch(tu_path(d, "block%201.npy"), 1.0f, 0);
    save_batch(tu_path(d, "layer%092.npy"), 1.0f, 0);
    save_batch(tu_path(d, "ok.npy"), 1.0f, 0);
    char *o = T("spaces_out");
    assert_int_equal(run("calibrate", d, "--format", "json,ncnn", "-o", o, NULL), 1);
    tu_expect_one_line(err, "qcal: calibrate: ", "the ncnn format cannot hold 2 names: "
                       "'block 1' (white space), 'layer\t2' (white space)");
    assert_int_equal(access(o, F_OK), -1);
    assert_int_equal(run("convert", "/nonexistent.json", "--format", "ncnn", "-o", o, NULL), 3);
    assert_int_equal(run("calibrate", d, "--format", "json,ncnn,tensorrt", "-o", o,
                         "--skip-unrepresentable", NULL), 0);
    assert_non_null(strstr(err, "warning: left 2 names out of the ncnn output"));
    size_t n;
    char *x = tu_read_file(tu_path(o, "ncnn.table"), &n);
    assert_null(strstr(x, "block"));
    assert_non_null(strstr(x, "ok "));
    free(x);
    assert_file_has(tu_path(o, "tensorrt.cache"), "\nblock 1: ");
    assert_file_has(tu_path(o, "qcal_table.json"), "\"layer\\u00092\"");
    /* convert reports the same way */
    char *json = strdup(tu_path(o, "qcal_table.json")), *o2 = T("spaces_conv");
    assert_int_equal(run("convert", json, "--format", "onnxruntime", "-o", o2, NULL), 1);
    tu_expect_one_line(err, "qcal: convert: ", "the onnxruntime format cannot hold 2 names");
    free(json);
    free(o2);
    free(d);
    free(o);
}

/* Bad dumps: a bad escape, a manifest path leading out (lexically or by a symbolic link),
 * unknown members: exit 3 with one line naming the problem. */
static void test_bad_dumps(void **state)
{
    (void)state;
    char *d = T("badesc"), *o = T("bad.json");
    mkdirs(d);
    save_batch(tu_path(d, "a%zz.npy"), 1.0f, 0);
    assert_int_equal(run("calibrate", d, "-o", o, NULL), 3);
    tu_expect_one_line(err, "qcal: calibrate: ", "two hex digits");
    free(d);
    static const char *const bad[][2] = {
        { "{\"tensors\": [{\"name\": \"a\", \"files\": [\"../x.npy\"]}]}", "'..'" },
        { "{\"tensors\": [{\"name\": \"a\", \"files\": [\"/etc/passwd\"]}]}", "absolute" },
        { "{\"tensors\": [{\"name\": \"a\", \"files\": [\"link/x.npy\"]}]}", "leads outside" },
        { "{\"tensors\": [{\"name\": \"a\", \"files\": []}]}", "non-empty array" },
        { "{\"tensors\": [{\"name\": \"a\", \"file\": [\"x.npy\"]}]}", "unknown member 'file'" },
        { "{\"tensors\": [{\"name\": \"a\", \"role\": \"bias\", \"files\": [\"x.npy\"]}]}",
          "role" },
        { "{\"tensors\": [{\"name\": \"a\", \"files\": [\"x.npy\"]}, {\"name\": \"a\", "
          "\"files\": [\"x.npy\"]}]}", "listed twice" },
        { "{\"tensors\": [{\"name\": \"a\", \"files\": [\"missing.npy\"]}]}", "missing.npy" },
        { "[1, 2]", "not an object" },
        { "{\"tensors\": [", "JSON" },
    };
    char *outside = T("outside");
    mkdirs(outside);
    save_batch(tu_path(outside, "x.npy"), 1.0f, 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "badman%zu", i);
        char *m = T(name);
        mkdirs(m);
        save_batch(tu_path(m, "x.npy"), 1.0f, 0);
        assert_int_equal(symlink(outside, tu_path(m, "link")), 0);
        tu_write_bytes(tu_path(m, "manifest.json"), bad[i][0], strlen(bad[i][0]));
        int rc = run("calibrate", m, "-o", o, NULL);
        if (rc != 3 || !strstr(err, bad[i][1]))
            fail_msg("manifest %zu: exit %d, stderr %s", i, rc, err);
        tu_expect_one_line(err, "qcal: calibrate: ", bad[i][1]);
        free(m);
    }
    assert_int_equal(access(o, F_OK), -1);
    free(outside);
    free(o);
}

/* The TensorRT header follows the observer unless --trt-algorithm says otherwise. */
static void test_trt_header(void **state)
{
    (void)state;
    char *enc = make_encoded_dump(), *o = T("h.cache");
    static const char *const cases[][2] = {
        { "minmax", "TRT-8601-MinMaxCalibration\n" },
        { "moving_average_minmax", "TRT-8601-MinMaxCalibration\n" },
        { "entropy", "TRT-8601-EntropyCalibration2\n" },
        { "histogram", "TRT-8601-EntropyCalibration2\n" },
        { "percentile", "TRT-8601-EntropyCalibration2\n" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(run("calibrate", enc, "--format", "tensorrt", "-o", o, "--observer",
                             cases[i][0], NULL), 0);
        char head[64];
        tu_slurp(o, head, strlen(cases[i][1]) + 1);
        assert_string_equal(head, cases[i][1]);
    }
    assert_int_equal(run("calibrate", enc, "--format", "tensorrt", "-o", o, "--observer",
                         "minmax", "--trt-version", "100300", "--trt-algorithm",
                         "EntropyCalibration2", NULL), 0);
    char head[64];
    tu_slurp(o, head, 32);
    assert_string_equal(head, "TRT-100300-EntropyCalibration2\n");
    assert_int_equal(run("calibrate", enc, "--format", "tensorrt", "-o", o, "--trt-version",
                         "10.3", NULL), 2);
    free(enc);
    free(o);
}

/* stats on a dump directory: one line per tensor, named from the layout. */
static void test_stats_dump(void **state)
{
    (void)state;
    char *enc = make_encoded_dump(), *man = make_manifest_dump();
    assert_int_equal(run("stats", enc, NULL), 0);
    assert_non_null(strstr(out, "fqn='/layer1/conv/Conv_output_0'"));
    assert_non_null(strstr(out, "fqn='input:0'"));
    assert_non_null(strstr(out, "fqn='100%'"));
    assert_null(strstr(out, "batch_000"));
    char first[sizeof out];
    snprintf(first, sizeof first, "%s", out);
    assert_int_equal(run("stats", man, NULL), 0);
    assert_string_equal(out, first);   /* same tensors, same numbers */
    free(enc);
    free(man);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_in_every_format),
        cmocka_unit_test(test_multi_equals_single_and_convert),
        cmocka_unit_test(test_onnxruntime_many),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_unrepresentable_names),
        cmocka_unit_test(test_bad_dumps),
        cmocka_unit_test(test_trt_header),
        cmocka_unit_test(test_stats_dump),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
