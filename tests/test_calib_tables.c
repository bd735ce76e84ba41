/* Calibration tables: native JSON round trip (bit-exact), each export format against a
 * golden file written by an independent Python implementation (tests/ref/gen_calib.py),
 * TensorRT hex = float32 bits, and the reader's validation of bad tables. */
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

#include "qcal/calib.h"

#include "testutil.h"

static char *data_path(const char *name)
{
    const char *dir = getenv("QCAL_TEST_DATA");
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/calib/%s", dir ? dir : "tests/data", name);
    return buf;
}

static qcal_calib_table *read_table(const char *name)
{
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_table_read_json(data_path(name), &t);
    if (st != QCAL_OK)
        fail_msg("read %s: %s", name, qcal_last_error());
    return t;
}

/* Compares text with a golden file; on mismatch prints the first differing line. */
static void assert_text_golden(const char *got, const char *golden_name)
{
    char *want = tu_read_file(data_path(golden_name), NULL);
    if (strcmp(got, want)) {
        const char *a = got, *b = want;
        int line = 1;
        while (*a && *a == *b) {
            line += *a == '\n';
            a++;
            b++;
        }
        const char *la = a, *lb = b;
        while (la > got && la[-1] != '\n')
            la--;
        while (lb > want && lb[-1] != '\n')
            lb--;
        fail_msg("%s differs at line %d:\n  got:  %.*s\n  want: %.*s", golden_name, line,
                 (int)strcspn(la, "\n"), la, (int)strcspn(lb, "\n"), lb);
    }
    free(want);
}

static void format_golden(const char *table, qcal_calib_format fmt,
                          const qcal_calib_export_options *o, const char *golden)
{
    qcal_calib_table *t = read_table(table);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_calib_table_format(t, fmt, o, &buf, &len), QCAL_OK);
    assert_int_equal(strlen(buf), len);
    assert_text_golden(buf, golden);
    qcal_free(buf);
    qcal_calib_table_destroy(&t);
    assert_null(t);
}

static void test_golden_tensorrt(void **state)
{
    (void)state;
    format_golden("expected_minmax.json", QCAL_CALIB_FORMAT_TENSORRT, NULL, "minmax.tensorrt");
    qcal_calib_export_options o;
    qcal_calib_export_options_default(&o);
    o.trt_version = "8203";
    format_golden("names.json", QCAL_CALIB_FORMAT_TENSORRT, &o, "names.tensorrt");
}

static void test_golden_onnxruntime(void **state)
{
    (void)state;
    format_golden("expected_minmax.json", QCAL_CALIB_FORMAT_ONNXRUNTIME, NULL, "minmax.onnxruntime");
    /* Space-separated format: a name with a space cannot be written. */
    qcal_calib_table *t = read_table("names.json");
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_ONNXRUNTIME, NULL, &buf, &len),
                     QCAL_ERR_UNSUPPORTED);
    assert_null(buf);
    assert_non_null(strstr(qcal_last_error(), "a: b: c"));
    qcal_calib_table_destroy(&t);
}

static void test_golden_ncnn(void **state)
{
    (void)state;
    format_golden("expected_minmax.json", QCAL_CALIB_FORMAT_NCNN, NULL, "minmax.ncnn");
}

/* Every "name: hex" line of a TensorRT cache is the float32 bit pattern of amax/127. */
static void test_tensorrt_hex_bits(void **state)
{
    (void)state;
    qcal_calib_table *t = read_table("names.json");
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_TENSORRT, NULL, &buf, &len), QCAL_OK);
    /* The header's algorithm follows the observers (min/max kinds here). */
    assert_true(!strncmp(buf, "TRT-8601-MinMaxCalibration\n", 27));
    int lines = 0;
    for (char *line = strchr(buf, '\n') + 1; *line; lines++) {
        char *end = strchr(line, '\n');
        assert_non_null(end);
        *end = '\0';
        char *sep = NULL;
        for (char *p = line; (p = strstr(p, ": ")); p++)
            sep = p;   /* readers split on the last ": " */
        assert_non_null(sep);
        *sep = '\0';
        const char *hex = sep + 2;
        assert_int_equal(strlen(hex), 8);   /* zero padded: bytes.fromhex readers need 8 */
        for (const char *h = hex; *h; h++)
            assert_true((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f'));
        uint32_t bits = (uint32_t)strtoul(hex, NULL, 16);
        const qcal_calib_entry *e;
        assert_int_equal(qcal_calib_table_find(t, line, QCAL_CALIB_ROLE_ACTIVATION, &e), QCAL_OK);
        float amax;
        assert_int_equal(qcal_calib_entry_amax(e, 0, &amax), QCAL_OK);
        if (amax == 0.0f)
            amax = 1.0f;   /* documented zero rule */
        float scale = amax / 127.0f, got;
        memcpy(&got, &bits, 4);
        if (got != scale)
            fail_msg("'%s': hex %s = %.9g, want amax %.9g / 127 = %.9g", line, hex,
                     (double)got, (double)amax, (double)scale);
        line = end + 1;
    }
    assert_int_equal(lines, 4);
    qcal_free(buf);
    qcal_calib_table_destroy(&t);
}

static void assert_entries_equal(const qcal_calib_entry *a, const qcal_calib_entry *b)
{
    assert_string_equal(a->fqn, b->fqn);
    assert_int_equal(a->role, b->role);
    assert_int_equal(a->observer, b->observer);
    const qcal_qparams *qa = &a->qparams, *qb = &b->qparams;
    assert_int_equal(qa->dtype, qb->dtype);
    assert_int_equal(qa->qscheme, qb->qscheme);
    assert_int_equal(qa->axis, qb->axis);
    assert_int_equal(qa->quant_min, qb->quant_min);
    assert_int_equal(qa->quant_max, qb->quant_max);
    assert_int_equal(qa->channels, qb->channels);
    assert_int_equal(a->batches, b->batches);
    assert_int_equal(a->elements, b->elements);
    assert_int_equal(a->nonfinite, b->nonfinite);
    assert_int_equal(a->no_data, b->no_data);
    size_t n = (size_t)qa->channels * sizeof(float);
    assert_memory_equal(a->min_val, b->min_val, n);
    assert_memory_equal(a->max_val, b->max_val, n);
    for (int64_t c = 0; c < qa->channels; c++) {
        float sa = qcal_qparams_scale_at(qa, c), sb = qcal_qparams_scale_at(qb, c);
        float fa = qcal_qparams_zero_point_float_at(qa, c), fb = qcal_qparams_zero_point_float_at(qb, c);
        assert_memory_equal(&sa, &sb, 4);
        assert_memory_equal(&fa, &fb, 4);
        assert_int_equal(qcal_qparams_zero_point_at(qa, c), qcal_qparams_zero_point_at(qb, c));
    }
    assert_int_equal(qcal_qparams_validate(qa), QCAL_OK);
}

/* A session table over awkward floats (subnormal-free but of every magnitude) and an
 * all-NaN tensor writes to JSON and reads back bit for bit. */
static void test_json_round_trip(void **state)
{
    (void)state;
    qcal_calib_rules *rules = NULL;
    const char *text = "* activation minmax\n"
                       "sym* activation minmax dtype=qint8 qscheme=per_tensor_symmetric\n";
    assert_int_equal(qcal_calib_rules_parse(text, strlen(text), &rules), QCAL_OK);
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&so, &s), QCAL_OK);
    uint32_t seed = 12345;
    float buf[6 * 40];
    for (int k = 0; k < 40; k++) {
        for (int i = 0; i < 6 * 40; i++) {
            seed = seed * 1664525u + 1013904223u;
            float u = (float)(seed >> 8) / 16777216.0f - 0.37f;
            buf[i] = u * powf(10.0f, (float)((int)(seed % 23) - 11));
        }
        char name[32];
        snprintf(name, sizeof name, "%s%02d \"q\"\\", k % 3 ? "t" : "sym", k);
        int64_t shape[2] = { 6, 40 };
        qcal_tensor x;
        assert_int_equal(qcal_tensor_init(&x, buf, 2, shape), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_ACTIVATION, 0, &x), QCAL_OK);
        assert_int_equal(qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_WEIGHT, 0, &x), QCAL_OK);
    }
    float nan3[3] = { NAN, INFINITY, NAN };
    int64_t three = 3;
    qcal_tensor xn;
    assert_int_equal(qcal_tensor_init(&xn, nan3, 1, &three), QCAL_OK);
    assert_int_equal(qcal_calib_session_observe(s, "all_nan", QCAL_CALIB_ROLE_ACTIVATION, 0, &xn), QCAL_OK);

    qcal_calib_table *t = NULL, *t2 = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    char *j1 = NULL, *j2 = NULL;
    size_t l1, l2;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &j1, &l1), QCAL_OK);
    assert_int_equal(qcal_calib_table_parse_json(j1, l1, &t2), QCAL_OK);
    int64_t n1, n2;
    qcal_calib_table_count(t, &n1);
    qcal_calib_table_count(t2, &n2);
    assert_int_equal(n1, 81);
    assert_int_equal(n1, n2);
    for (int64_t i = 0; i < n1; i++) {
        const qcal_calib_entry *a, *b;
        qcal_calib_table_entry(t, i, &a);
        qcal_calib_table_entry(t2, i, &b);
        assert_entries_equal(a, b);
    }
    assert_int_equal(qcal_calib_table_format(t2, QCAL_CALIB_FORMAT_JSON, NULL, &j2, &l2), QCAL_OK);
    assert_int_equal(l1, l2);
    assert_memory_equal(j1, j2, l1);

    const qcal_calib_entry *e;
    assert_int_equal(qcal_calib_table_find(t2, "all_nan", QCAL_CALIB_ROLE_ACTIVATION, &e), QCAL_OK);
    assert_true(e->no_data);
    assert_int_equal(e->nonfinite, 3);
    assert_float_equal(qcal_qparams_scale_at(&e->qparams, 0), 1.0f, 0.0f);
    assert_true(isinf(e->min_val[0]) && e->min_val[0] > 0);
    /* Exports leave the no-data entry out and say so. */
    char *trt = NULL;
    size_t lt;
    assert_int_equal(qcal_calib_table_format(t2, QCAL_CALIB_FORMAT_TENSORRT, NULL, &trt, &lt),
                     QCAL_NO_DATA);
    assert_null(strstr(trt, "all_nan"));
    assert_non_null(strstr(qcal_last_error(), "all_nan"));
    qcal_free(trt);
    qcal_free(j1);
    qcal_free(j2);
    qcal_calib_table_destroy(&t);
    qcal_calib_table_destroy(&t2);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
}

/* Replaces the first occurrence of from by to in the golden JSON and parses it. */
static qcal_status parse_edited(const char *from, const char *to)
{
    char *src = tu_read_file(data_path("expected_minmax.json"), NULL);
    char *at = strstr(src, from);
    assert_non_null(at);
    size_t n = strlen(src) - strlen(from) + strlen(to);
    char *dst = malloc(n + 1);
    assert_non_null(dst);
    size_t pre = (size_t)(at - src);
    memcpy(dst, src, pre);
    strcpy(dst + pre, to);
    strcat(dst, at + strlen(from));
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_table_parse_json(dst, n, &t);
    if (st == QCAL_OK)
        qcal_calib_table_destroy(&t);
    else
        assert_null(t);
    free(src);
    free(dst);
    return st;
}

static void test_json_reader_rejects(void **state)
{
    (void)state;
    assert_int_equal(parse_edited("\"version\": 1", "\"version\": 2"), QCAL_ERR_UNSUPPORTED);
    assert_int_equal(parse_edited("qcal-calibration-table", "other"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"scale\": [0.06170181]", "\"scale\": [0.06170182]"),
                     QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "rebuilt"));
    assert_non_null(strstr(qcal_last_error(), "conv1"));
    assert_int_equal(parse_edited("\"zero_point\": [118]", "\"zero_point\": [117]"),
                     QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"scale\": [0.06170181]", "\"scale\": [-1]"),
                     QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"min\": [-7.25883]", "\"min\": [9]"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"min\": [-7.25883]", "\"min\": [\"nan\"]"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"min\": [-7.25883]", "\"min\": [-7.25883, 1]"),
                     QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "min"));
    assert_int_equal(parse_edited("\"role\": \"activation\"", "\"role\": \"bias\""),
                     QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"batches\": 3", "\"batches\": -3"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"no_data\": false", "\"no_data\": true"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"channels\": 4", "\"channels\": 3"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"fqn\": \"fc\"", "\"fqn\": \"conv1\""), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "two"));
    assert_int_equal(parse_edited("\"quant_max\": 255", "\"quant_max\": 255.5"), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("\"entries\": [", "\"entries\": [[], "), QCAL_ERR_FORMAT);
    assert_int_equal(parse_edited("{", "{,"), QCAL_ERR_FORMAT);
    /* Every prefix of a valid table is rejected cleanly. */
    size_t len;
    char *src = tu_read_file(data_path("expected_minmax.json"), &len);
    for (size_t n = 0; n < len - 1; n += 7) {
        qcal_calib_table *t = NULL;
        assert_true(qcal_calib_table_parse_json(src, n, &t) < 0);
        assert_null(t);
    }
    free(src);
}

/* The table's profile: unset from a session, set to "ort"/"tensorrt" (others refused,
 * the table unchanged), written after "digest" and read back; the digest is the same with
 * and without it; a table without it (the golden file, as earlier qcal wrote) reads with none,
 * a malformed one is refused. */
static void test_json_profile(void **state)
{
    (void)state;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(NULL, &s), QCAL_OK);
    float x[4] = { -1.0f, 0.25f, 2.0f, 3.5f };
    qcal_tensor xt;
    assert_int_equal(qcal_tensor_init(&xt, x, 1, (int64_t[]){ 4 }), QCAL_OK);
    assert_int_equal(qcal_calib_session_observe(s, "a", QCAL_CALIB_ROLE_ACTIVATION, 0, &xt), QCAL_OK);
    qcal_calib_table *t = NULL, *t2 = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    qcal_calib_session_destroy(&s);
    assert_null(qcal_calib_table_profile(t));
    char *j0 = NULL, *j1 = NULL;
    size_t l0, l1;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &j0, &l0), QCAL_OK);
    assert_null(strstr(j0, "profile"));
    assert_int_equal(qcal_calib_table_set_profile(t, "tpu"), QCAL_ERR_INVALID_ARG);
    assert_null(qcal_calib_table_profile(t));
    assert_int_equal(qcal_calib_table_set_profile(t, "tensorrt"), QCAL_OK);
    assert_string_equal(qcal_calib_table_profile(t), "tensorrt");
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &j1, &l1), QCAL_OK);
    assert_non_null(strstr(j1, "\"version\": 1,\n  \"digest\": \""));
    assert_non_null(strstr(j1, "\",\n  \"profile\": \"tensorrt\",\n  \"entries\""));
    assert_int_equal(qcal_calib_table_parse_json(j1, l1, &t2), QCAL_OK);
    assert_string_equal(qcal_calib_table_profile(t2), "tensorrt");
    char d1[65], d2[65];
    assert_int_equal(qcal_calib_table_digest(t, d1), QCAL_OK);
    assert_int_equal(qcal_calib_table_digest(t2, d2), QCAL_OK);
    assert_string_equal(d1, d2);
    /* only the profile line differs from the table without it */
    assert_int_equal(l1, l0 + strlen(",\n  \"profile\": \"tensorrt\""));
    assert_int_equal(qcal_calib_table_set_profile(t, NULL), QCAL_OK);
    assert_null(qcal_calib_table_profile(t));
    assert_int_equal(parse_edited("\"entries\": [", "\"profile\": \"ort\", \"entries\": ["), QCAL_OK);
    assert_int_equal(parse_edited("\"entries\": [", "\"profile\": \"tpu\", \"entries\": ["),
                     QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "profile"));
    assert_int_equal(parse_edited("\"entries\": [", "\"profile\": 1, \"entries\": ["),
                     QCAL_ERR_FORMAT);
    qcal_free(j0);
    qcal_free(j1);
    qcal_calib_table_destroy(&t);
    qcal_calib_table_destroy(&t2);
}

static void test_write_atomic(void **state)
{
    (void)state;
    qcal_calib_table *t = read_table("expected_minmax.json");
    char dir[] = "/tmp/qcal_calib_tables_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/out.cache", dir);
    assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_TENSORRT, NULL, path), QCAL_OK);
    char *got = tu_read_file(path, NULL);
    assert_text_golden(got, "minmax.tensorrt");
    free(got);
    /* The parent is a regular file: a clear I/O error, the existing output untouched. */
    snprintf(bad, sizeof bad, "%s/out.cache/x.json", dir);
    assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_JSON, NULL, bad), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "x.json"));
    snprintf(bad, sizeof bad, "%s/missing/x.json", dir);
    assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_JSON, NULL, bad), QCAL_ERR_IO);
    got = tu_read_file(path, NULL);
    assert_text_golden(got, "minmax.tensorrt");
    free(got);
    /* Overwrite with JSON, read back equal. */
    assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_JSON, NULL, path), QCAL_OK);
    qcal_calib_table *t2 = NULL;
    assert_int_equal(qcal_calib_table_read_json(path, &t2), QCAL_OK);
    const qcal_calib_entry *a, *b;
    assert_int_equal(qcal_calib_table_find(t2, "fc.weight", QCAL_CALIB_ROLE_WEIGHT, &b), QCAL_OK);
    assert_int_equal(qcal_calib_table_find(t, "fc.weight", QCAL_CALIB_ROLE_WEIGHT, &a), QCAL_OK);
    assert_entries_equal(a, b);
    assert_int_equal(qcal_calib_table_find(t2, "fc.weight", QCAL_CALIB_ROLE_ACTIVATION, &b),
                     QCAL_ERR_NOT_FOUND);
    qcal_calib_table_destroy(&t2);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);   /* no temporary left behind */
    qcal_calib_export_options o;
    qcal_calib_export_options_default(&o);
    o.trt_algorithm = "bad name";
    char *buf = NULL;
    size_t len;
    assert_int_equal(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_TENSORRT, &o, &buf, &len),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_calib_table_format(t, (qcal_calib_format)9, NULL, &buf, &len),
                     QCAL_ERR_INVALID_ARG);
    qcal_calib_format f;
    assert_int_equal(qcal_calib_format_parse("onnxruntime", &f), QCAL_OK);
    assert_int_equal(f, QCAL_CALIB_FORMAT_ONNXRUNTIME);
    assert_int_equal(qcal_calib_format_parse("csv", &f), QCAL_ERR_INVALID_ARG);
    qcal_calib_table_destroy(&t);
    qcal_calib_table_destroy(&t);   /* NULL is fine */
}

/* qcal_calib_table_write with ONNX Runtime's format writes what `qcal calibrate --format
 * onnxruntime -o DIR` writes: the three files into the directory (created when missing),
 * each with the bytes of qcal_calib_table_format_file; a regular file there is refused. */
static void test_write_onnxruntime_dir(void **state)
{
    (void)state;
    qcal_calib_table *t = read_table("expected_minmax.json");
    char dir[] = "/tmp/qcal_calib_tables_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[256], path[512];
    snprintf(out, sizeof out, "%s/ort", dir);
    for (int round = 0; round < 2; round++) {   /* new directory, then the existing one */
        assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_ONNXRUNTIME, NULL, out),
                         QCAL_OK);
        struct stat sb;
        assert_int_equal(stat(out, &sb), 0);
        assert_true(S_ISDIR(sb.st_mode));
        assert_int_equal(qcal_calib_format_file_count(QCAL_CALIB_FORMAT_ONNXRUNTIME), 3);
        for (int k = 0; k < 3; k++) {
            const char *name = qcal_calib_format_file_name(QCAL_CALIB_FORMAT_ONNXRUNTIME, k);
            snprintf(path, sizeof path, "%s/%s", out, name);
            char *want = NULL;
            size_t wlen = 0, glen = 0;
            assert_int_equal(qcal_calib_table_format_file(t, QCAL_CALIB_FORMAT_ONNXRUNTIME, k,
                                                          NULL, &want, &wlen), QCAL_OK);
            char *got = tu_read_file(path, &glen);
            assert_int_equal(glen, wlen);
            assert_memory_equal(got, want, wlen);
            free(got);
            qcal_free(want);
        }
    }
    /* A regular file at the path: refused, left as it was. */
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keep", f);
    fclose(f);
    assert_int_equal(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_ONNXRUNTIME, NULL, path),
                     QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "not a directory"));
    char *kept = tu_read_file(path, NULL);
    assert_string_equal(kept, "keep");
    free(kept);
    /* Several formats into a directory that does not exist yet: created too. */
    snprintf(path, sizeof path, "%s/all", dir);
    const qcal_calib_format two[2] = { QCAL_CALIB_FORMAT_JSON, QCAL_CALIB_FORMAT_ONNXRUNTIME };
    assert_int_equal(qcal_calib_table_write_dir(t, 2, two, NULL, path), QCAL_OK);
    snprintf(path, sizeof path, "%s/all/calibration.flatbuffers", dir);
    assert_int_equal(access(path, F_OK), 0);
    tu_rm_tree(dir);
    qcal_calib_table_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tensorrt),
        cmocka_unit_test(test_golden_onnxruntime),
        cmocka_unit_test(test_golden_ncnn),
        cmocka_unit_test(test_tensorrt_hex_bits),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_json_reader_rejects),
        cmocka_unit_test(test_json_profile),
        cmocka_unit_test(test_write_atomic),
        cmocka_unit_test(test_write_onnxruntime_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
