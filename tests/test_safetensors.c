/* Tests of the safetensors reader/writer (io/safetensors.c) and the JSON parser it uses
 * (io/json.c), against files written by tests/ref/gen_safetensors.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/half_dsp.h"
#include "core/internal.h"
#include "io/json.h"
#include "io/text.h"
#include "qcal/safetensors.h"

static char *data_path(const char *name)
{
    static char buf[4096];
    const char *root = getenv("QCAL_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/numeric/%s", root ? root : "tests/data", name);
    return buf;
}

/* Bitwise float equality, NaN == NaN. Prints the first mismatch. */
static void assert_same_floats(const char *what, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, &a[i], 4);
        memcpy(&y, &b[i], 4);
        bool same = x == y || (isnan(a[i]) && isnan(b[i]));
        if (!same) {
            print_error("%s: element %lld differs: got %.9g (0x%08x), want %.9g (0x%08x)\n", what,
                        (long long)i, a[i], x, b[i], y);
            fail();
        }
    }
}

static void test_mixed_file(void **state)
{
    (void)state;
    qcal_safetensors *st = NULL, *ref = NULL;
    assert_int_equal(qcal_safetensors_open(data_path("st_mixed.safetensors"), &st), QCAL_OK);
    assert_int_equal(qcal_safetensors_open(data_path("st_mixed_f32.safetensors"), &ref), QCAL_OK);
    int64_t n = 0, nref = 0;
    assert_int_equal(qcal_safetensors_count(st, &n), QCAL_OK);
    assert_int_equal(n, 9);
    assert_int_equal(qcal_safetensors_count(ref, &nref), QCAL_OK);
    assert_int_equal(nref, 8);
    /* numbered in data-offset order (the generator wrote data in this order) */
    const char *order[] = {"conv.weight", "conv.bias", "half", "bf", "bf_special", "dbl",
                           "bn.num_batches_tracked", "scalar", "empty"};
    int64_t prev_end = -1;
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        assert_int_equal(qcal_safetensors_info(st, i, &info), QCAL_OK);
        assert_string_equal(info.name, order[i]);
        assert_true(prev_end < 0 || info.offset == prev_end);
        prev_end = info.offset + info.nbytes;
        if (!strcmp(info.name, "bn.num_batches_tracked")) {
            float v;
            assert_string_equal(info.dtype_name, "I64");
            assert_int_equal(info.dtype, QCAL_SAFETENSORS_OTHER);
            assert_int_equal(qcal_safetensors_read_f32(st, i, 0, 1, &v), QCAL_ERR_UNSUPPORTED);
            assert_non_null(strstr(qcal_last_error(), "I64"));
            continue;
        }
        int64_t j;
        assert_int_equal(qcal_safetensors_find(ref, info.name, &j), QCAL_OK);
        qcal_safetensors_tensor_info rinfo;
        assert_int_equal(qcal_safetensors_info(ref, j, &rinfo), QCAL_OK);
        assert_int_equal(info.ndim, rinfo.ndim);
        assert_int_equal(info.numel, rinfo.numel);
        for (int d = 0; d < info.ndim; d++)
            assert_int_equal(info.shape[d], rinfo.shape[d]);
        float *got = calloc((size_t)info.numel + 1, 4), *want = calloc((size_t)info.numel + 1, 4);
        assert_int_equal(qcal_safetensors_read_f32(st, i, 0, info.numel, got), QCAL_OK);
        assert_int_equal(qcal_safetensors_read_f32(ref, j, 0, info.numel, want), QCAL_OK);
        assert_same_floats(info.name, got, want, info.numel);
        /* chunked reads give the same values */
        if (info.numel > 3) {
            float *chunk = calloc((size_t)info.numel, 4);
            for (int64_t s = 0; s < info.numel; s += 3) {
                int64_t c = info.numel - s < 3 ? info.numel - s : 3;
                assert_int_equal(qcal_safetensors_read_f32(st, i, s, c, chunk + s), QCAL_OK);
            }
            assert_same_floats("chunked", chunk, want, info.numel);
            free(chunk);
        }
        free(got);
        free(want);
    }
    /* scalar and empty */
    int64_t k;
    qcal_safetensors_tensor_info info;
    assert_int_equal(qcal_safetensors_find(st, "scalar", &k), QCAL_OK);
    assert_int_equal(qcal_safetensors_info(st, k, &info), QCAL_OK);
    assert_int_equal(info.ndim, 0);
    assert_int_equal(info.numel, 1);
    float v = 0;
    assert_int_equal(qcal_safetensors_read_f32(st, k, 0, 1, &v), QCAL_OK);
    assert_true(v == 3.25f);
    assert_int_equal(qcal_safetensors_read_f32(st, k, 1, 1, &v), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_safetensors_find(st, "empty", &k), QCAL_OK);
    assert_int_equal(qcal_safetensors_info(st, k, &info), QCAL_OK);
    assert_int_equal(info.numel, 0);
    assert_int_equal(qcal_safetensors_find(st, "nope", &k), QCAL_ERR_NOT_FOUND);
    const char *meta = NULL;
    assert_int_equal(qcal_safetensors_metadata(st, "format", &meta), QCAL_OK);
    assert_string_equal(meta, "pt");
    assert_int_equal(qcal_safetensors_metadata(st, "note", &meta), QCAL_OK);
    assert_string_equal(meta, "qcal test \xc3\xa9");
    assert_int_equal(qcal_safetensors_metadata(st, "missing", &meta), QCAL_ERR_NOT_FOUND);
    /* raw access: F32 only */
    const void *raw = NULL;
    assert_int_equal(qcal_safetensors_find(st, "conv.bias", &k), QCAL_OK);
    assert_int_equal(qcal_safetensors_raw(st, k, &raw), QCAL_OK);
    assert_int_equal(qcal_safetensors_release(st, k), QCAL_OK);
    assert_int_equal(qcal_safetensors_find(st, "half", &k), QCAL_OK);
    assert_int_equal(qcal_safetensors_raw(st, k, &raw), QCAL_ERR_UNSUPPORTED);
    qcal_safetensors_close(&st);
    qcal_safetensors_close(&ref);
    assert_null(st);
    qcal_safetensors_close(NULL);
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        qcal_status status;
        const char *needle;
    } cases[] = {
        {"bad_hlen_huge", QCAL_ERR_FORMAT, "100 MiB"},
        {"bad_hlen_past_eof", QCAL_ERR_FORMAT, "larger than the file"},
        {"bad_not_json", QCAL_ERR_FORMAT, "not valid JSON"},
        {"bad_not_object", QCAL_ERR_FORMAT, "not an object"},
        {"bad_dtype", QCAL_ERR_UNSUPPORTED, "unknown dtype 'Q4'"},
        {"bad_size", QCAL_ERR_FORMAT, "need 20"},
        {"bad_offsets_past_end", QCAL_ERR_FORMAT, "outside the data section"},
        {"bad_overlap", QCAL_ERR_FORMAT, "overlapping"},
        {"bad_hole", QCAL_ERR_FORMAT, "hole"},
        {"bad_trailing_data", QCAL_ERR_FORMAT, "cover 12 bytes of a 16-byte"},
        {"bad_duplicate_name", QCAL_ERR_FORMAT, "duplicate object key"},
        {"bad_shape_overflow", QCAL_ERR_OVERFLOW, "overflows"},
        {"bad_negative_shape", QCAL_ERR_FORMAT, "non-negative"},
        {"bad_offsets_reversed", QCAL_ERR_FORMAT, "outside the data section"},
        {"bad_missing_offsets", QCAL_ERR_FORMAT, "data_offsets"},
        {"bad_short_file", QCAL_ERR_FORMAT, "shorter than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.safetensors", cases[i].file);
        qcal_safetensors *st = (qcal_safetensors *)(uintptr_t)0x1;   /* must stay untouched */
        qcal_status s = qcal_safetensors_open(data_path(name), &st);
        if (s != cases[i].status || !strstr(qcal_last_error(), cases[i].needle)) {
            print_error("%s: status %d (want %d), message '%s' (want '%s')\n", cases[i].file, s,
                        cases[i].status, qcal_last_error(), cases[i].needle);
            fail();
        }
        assert_true(st == (qcal_safetensors *)(uintptr_t)0x1);
    }
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(data_path("does_not_exist.safetensors"), &st),
                     QCAL_ERR_NOT_FOUND);
    assert_null(st);
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    char path[] = "/tmp/qcal_test_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    float a[6] = {1, -2, 3.5f, NAN, INFINITY, -0.0f}, b[1] = {42};
    qcal_tensor t[3];
    int64_t sa[2] = {2, 3}, sb[1] = {1}, se[2] = {0, 5};
    assert_int_equal(qcal_tensor_init(&t[0], a, 2, sa), QCAL_OK);
    assert_int_equal(qcal_tensor_init(&t[1], b, 0, sb), QCAL_OK);
    assert_int_equal(qcal_tensor_init(&t[2], NULL, 2, se), QCAL_OK);
    const char *names[3] = {"layer.\"w\"", "s", "empty"};
    const char *meta[2] = {"format", "pt"};
    assert_int_equal(qcal_safetensors_write_f32(path, 3, names, t, 1, meta), QCAL_OK);
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    int64_t n;
    assert_int_equal(qcal_safetensors_count(st, &n), QCAL_OK);
    assert_int_equal(n, 3);
    qcal_safetensors_tensor_info info;
    assert_int_equal(qcal_safetensors_info(st, 0, &info), QCAL_OK);
    assert_string_equal(info.name, "layer.\"w\"");
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[1], 3);
    assert_int_equal((info.offset - 8) % 8, 0);   /* header padded to 8 bytes */
    float back[6];
    assert_int_equal(qcal_safetensors_read_f32(st, 0, 0, 6, back), QCAL_OK);
    assert_same_floats("roundtrip", back, a, 6);
    assert_int_equal(qcal_safetensors_info(st, 1, &info), QCAL_OK);
    assert_int_equal(info.ndim, 0);
    const char *v;
    assert_int_equal(qcal_safetensors_metadata(st, "format", &v), QCAL_OK);
    assert_string_equal(v, "pt");
    qcal_safetensors_close(&st);
    /* duplicate names: error, and the existing file is untouched */
    const char *dup[2] = {"x", "x"};
    assert_int_equal(qcal_safetensors_write_f32(path, 2, dup, t, 0, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    qcal_safetensors_close(&st);
    unlink(path);
    /* unwritable destination */
    assert_int_equal(qcal_safetensors_write_f32("/nonexistent_dir/x.safetensors", 1, names, t, 0,
                                                NULL), QCAL_ERR_IO);
}

static void test_f16_kernels(void **state)
{
    (void)state;
    /* every half bit pattern through the C reference against known values (the ISA
     * versions against the C reference: tests/checkasm.c) */
    uint16_t *h = malloc(65536 * 2 + 2);
    float *c = malloc(65537 * 4);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    qcal_f16_to_f32_n__c(h, 65536, c);
    assert_true(c[0x3C00] == 1.0f);
    assert_true(c[0xC000] == -2.0f);
    assert_true(c[0x7BFF] == 65504.0f);
    assert_true(c[0x0001] == 0x1p-24f);
    assert_true(isinf(c[0x7C00]) && c[0x7C00] > 0);
    assert_true(isnan(c[0x7E00]) && isnan(c[0x7C01]));
    assert_true(qcal_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(isnan(qcal_bf16_to_f32(0x7F81)));
    free(h);
    free(c);
}

static void test_json(void **state)
{
    (void)state;
    static const char *good[] = {"{}", "[]", " 0 ", "-1.5e-3", "\"a\\u00e9\\ud83d\\ude00\"",
                                 "{\"a\":[1,{\"b\":null}],\"c\":true}", "[false, \"\\n\"]"};
    static const char *bad[] = {"", "[1,]", "{\"a\":1,}", "{\"a\":1,\"a\":2}", "01", "1.",
                                "NaN", "'x'", "\"\\u0000\"", "\"\\ud800\"", "\"abc", "[1] 2",
                                "{\"a\" 1}", "\"\x01\"", "\"\xff\"", "\"\xc0\xaf\"", "tru",
                                /* nesting deeper than the parser's depth limit */
                                ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                                 "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]")};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        qcal_json *d = NULL;
        if (qcal_json_parse(good[i], strlen(good[i]), NULL, &d) != QCAL_OK) {
            print_error("valid JSON %s rejected: %s\n", good[i], qcal_last_error());
            fail();
        }
        qcal_json_free(&d);
        assert_null(d);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qcal_json *d = NULL;
        if (qcal_json_parse(bad[i], strlen(bad[i]), NULL, &d) != QCAL_ERR_FORMAT) {
            print_error("invalid JSON '%s' accepted\n", bad[i]);
            fail();
        }
        assert_null(d);
    }
    qcal_json *d = NULL;
    const char *t = "{\"n\": 9007199254740993, \"s\": \"x\\u00e9\", \"f\": 0.5}";
    assert_int_equal(qcal_json_parse(t, strlen(t), NULL, &d), QCAL_OK);
    const qcal_json *n = qcal_json_get(d, "n");
    assert_non_null(n);
    assert_true(n->is_int);
    assert_int_equal(n->i64, 9007199254740993LL);
    assert_string_equal(qcal_json_get(d, "s")->str, "x\xc3\xa9");
    assert_false(qcal_json_get(d, "f")->is_int);
    assert_true(qcal_json_get(d, "f")->number == 0.5);
    assert_null(qcal_json_get(d, "zz"));
    qcal_json_free(&d);
    /* depth limit is configurable */
    qcal_json_limits lim;
    qcal_json_limits_default(&lim);
    lim.max_depth = 2;
    assert_int_equal(qcal_json_parse("[[1]]", 5, &lim, &d), QCAL_OK);
    qcal_json_free(&d);
    assert_int_equal(qcal_json_parse("[[[1]]]", 7, &lim, &d), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), "limit of 2"));
}

/* io's writers: both JSON string dialects, the UTF-8 decoder, the float formats. */
static void expect_str(void (*w)(qcal_buf *, const char *), const char *in, const char *want)
{
    qcal_buf b = { 0 };
    w(&b, in);
    assert_false(b.failed);
    if (b.len != strlen(want) || memcmp(b.data, want, b.len)) {
        fprintf(stderr, "wrote %.*s, want %s\n", (int)b.len, (const char *)b.data, want);
        fail();
    }
    qcal_buf_free(&b);
}

static void test_text(void **state)
{
    (void)state;
    const char *in = "a\"b\\c\n\t\x01\x7f\xc3\xa9\xf0\x9f\x98\x80";
    expect_str(qcal_json_write_str, in,
               "\"a\\\"b\\\\c\\u000a\\u0009\\u0001\x7f\xc3\xa9\xf0\x9f\x98\x80\"");
    /* json.dumps(s): '"a\\"b\\\\c\\n\\t\\u0001\\u007f\\u00e9\\ud83d\\ude00"' */
    expect_str(qcal_json_write_str_ascii, in,
               "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f\\u00e9\\ud83d\\ude00\"");
    expect_str(qcal_json_write_str_ascii, "\xff", "\"\\ufffd\"");

    uint32_t cp = 0;
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xc3\xa9", 2, &cp), 2);
    assert_int_equal(cp, 0xE9);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xf0\x9f\x98\x80", 3, &cp), 0);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xc0\x80", 2, NULL), 0);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xe0\x9f\xbf", 3, NULL), 0);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, NULL), 0);
    assert_int_equal(qcal_utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, NULL), 0);
    assert_true(qcal_utf8_valid("x\xc3\xa9\xe2\x82\xac"));
    assert_false(qcal_utf8_valid("x\xc3"));
    char e[8];
    assert_int_equal(qcal_utf8_encode(e, 0x20AC), 3);
    assert_memory_equal(e, "\xe2\x82\xac", 3);

    char f[64];
    const struct { double v; const char *want; } py[] = {
        { 1e-5, "1e-05" }, { 1e-4, "0.0001" }, { 127.0, "127.0" }, { 1e16, "1e+16" },
        { 123456789012345.0, "123456789012345.0" }, { -0.0, "-0.0" }, { NAN, "nan" },
        { -INFINITY, "-inf" }, { (double)0.1f, "0.10000000149011612" }, { 2.5e-300, "2.5e-300" },
    };
    for (size_t i = 0; i < sizeof py / sizeof py[0]; i++) {
        qcal_fmt_pyfloat(f, sizeof f, py[i].v);
        assert_string_equal(f, py[i].want);
    }
    qcal_fmt_f32(f, sizeof f, 0.1f);
    assert_string_equal(f, "0.1");
    qcal_fmt_f32(f, sizeof f, 16777217.0f);   /* rounds to 16777216 */
    assert_string_equal(f, "16777216");
    qcal_fmt_f32(f, sizeof f, 1.17549435e-38f);
    assert_string_equal(f, "1.1754944e-38");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_file),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_f16_kernels),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
