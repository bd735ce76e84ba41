/* unit.npy: the .npy reader/writer against files numpy wrote (tests/ref/gen_npy.py), and
 * every malformed-input path through qcal_npy_parse. */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/npy.h"

#include "testutil.h"

static char data_dir[4096];
static char tmp_dir[4096];

static const char *data_path(const char *name)
{
    static char buf[8192];
    snprintf(buf, sizeof buf, "%s/npy/%s", data_dir, name);
    return buf;
}

#define tmp_path(name) tu_path(tmp_dir, name)

static void assert_msg_has(const char *needle)
{
    const char *msg = qcal_last_error();
    if (!strstr(msg, needle))
        fail_msg("error message '%s' lacks '%s'", msg, needle);
}

static int group_setup(void **state)
{
    (void)state;
    const char *d = getenv("QCAL_TEST_DATA");
    snprintf(data_dir, sizeof data_dir, "%s", d ? d : "tests/data");
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal_test_npy.XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

static void check_f32_3x4(const qcal_npy_array *a)
{
    assert_int_equal(a->dtype, QCAL_NPY_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 3);
    assert_int_equal(a->shape[1], 4);
    assert_int_equal(a->numel, 12);
    assert_int_equal(a->nbytes, 48);
    assert_int_equal((uintptr_t)a->data % 64, 0);
    const float *x = a->data;
    for (int i = 0; i < 12; i++)
        assert_true(x[i] == (float)i * 0.25f - 1.5f);
}

static void test_read_f32(void **state)
{
    (void)state;
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(data_path("f32_3x4.npy"), &a), QCAL_OK);
    check_f32_3x4(&a);
    qcal_npy_array_free(&a);
    assert_null(a.data);
    assert_int_equal(a.numel, 0);
    qcal_npy_array_free(&a); /* twice is fine */
    qcal_npy_array_free(NULL);
    /* Version 2.0 and 3.0 headers hold the same array. */
    assert_int_equal(qcal_npy_read(data_path("f32_v2.npy"), &a), QCAL_OK);
    check_f32_3x4(&a);
    qcal_npy_array_free(&a);
    assert_int_equal(qcal_npy_read_f32(data_path("f32_v3.npy"), &a), QCAL_OK);
    check_f32_3x4(&a);
    qcal_npy_array_free(&a);

    assert_int_equal(qcal_npy_read(data_path("f32_1d.npy"), &a), QCAL_OK);
    assert_int_equal(a.ndim, 1);
    assert_int_equal(a.shape[0], 5);
    for (int i = 0; i < 5; i++)
        assert_true(((float *)a.data)[i] == (float)i * 0.25f - 1.5f);
    qcal_tensor t;
    assert_int_equal(qcal_npy_as_tensor(&a, &t), QCAL_OK);
    assert_ptr_equal(t.data, a.data);
    assert_int_equal(t.ndim, 1);
    assert_int_equal(t.shape[0], 5);
    qcal_npy_array_free(&a);
}

static void test_read_ints(void **state)
{
    (void)state;
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(data_path("u8_2x3.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_U8);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.nbytes, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(((uint8_t *)a.data)[i], (i * 50) % 256);
    /* Integers are not floats: read_f32 and to_f32 refuse them and change nothing. */
    assert_int_equal(qcal_npy_to_f32(&a), QCAL_ERR_MISMATCH);
    assert_int_equal(a.dtype, QCAL_NPY_U8);
    qcal_tensor t;
    assert_int_equal(qcal_npy_as_tensor(&a, &t), QCAL_ERR_MISMATCH);
    qcal_npy_array_free(&a);
    qcal_npy_array keep = { .ndim = 7 };
    assert_int_equal(qcal_npy_read_f32(data_path("u8_2x3.npy"), &keep), QCAL_ERR_MISMATCH);
    assert_int_equal(keep.ndim, 7); /* untouched on failure */
    assert_msg_has("u8_2x3.npy");
    assert_msg_has("uint8");

    assert_int_equal(qcal_npy_read(data_path("i8_2x3.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_I8);
    for (int i = 0; i < 6; i++)
        assert_int_equal(((int8_t *)a.data)[i], i * 50 - 128);
    qcal_npy_array_free(&a);

    assert_int_equal(qcal_npy_read(data_path("i32_4.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_I32);
    const int32_t want32[4] = { INT32_MIN, -1, 0, INT32_MAX };
    assert_memory_equal(a.data, want32, sizeof want32);
    qcal_npy_array_free(&a);

    assert_int_equal(qcal_npy_read(data_path("i64_3.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_I64);
    const int64_t want64[3] = { -5, 0, 7 };
    assert_memory_equal(a.data, want64, sizeof want64);
    qcal_npy_array_free(&a);

    /* '|b1': numpy's bool, one byte per element. */
    assert_int_equal(qcal_npy_read(data_path("bool.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_BOOL);
    assert_string_equal(qcal_npy_dtype_name(a.dtype), "bool");
    assert_int_equal(qcal_npy_dtype_size(a.dtype), 1);
    const uint8_t wantb[2] = { 1, 0 };
    assert_int_equal(a.nbytes, 2);
    assert_memory_equal(a.data, wantb, sizeof wantb);
    assert_int_equal(qcal_npy_to_f32(&a), QCAL_ERR_MISMATCH);
    qcal_npy_array_free(&a);
}

static void test_read_scalar_and_empty(void **state)
{
    (void)state;
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(data_path("scalar_f32.npy"), &a), QCAL_OK);
    assert_int_equal(a.ndim, 0);
    assert_int_equal(a.numel, 1);
    assert_true(((float *)a.data)[0] == 3.5f);
    qcal_tensor t;
    assert_int_equal(qcal_npy_as_tensor(&a, &t), QCAL_OK);
    assert_int_equal(t.ndim, 0);
    qcal_npy_array_free(&a);

    assert_int_equal(qcal_npy_read_f32(data_path("empty_f32.npy"), &a), QCAL_OK);
    assert_int_equal(a.ndim, 2);
    assert_int_equal(a.shape[0], 0);
    assert_int_equal(a.shape[1], 3);
    assert_int_equal(a.numel, 0);
    assert_int_equal(a.nbytes, 0);
    assert_null(a.data);
    qcal_npy_array_free(&a);
}

/* Compares a converted array to numpy's astype(float32) bit for bit (NaN: any NaN). */
static void check_conversion(const char *src, const char *golden, int64_t n)
{
    qcal_npy_array a, g;
    assert_int_equal(qcal_npy_read_f32(data_path(src), &a), QCAL_OK);
    assert_int_equal(qcal_npy_read(data_path(golden), &g), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_F32);
    assert_int_equal(g.dtype, QCAL_NPY_F32);
    assert_int_equal(a.numel, n);
    assert_int_equal(g.numel, n);
    const float *x = a.data, *y = g.data;
    int64_t bad = 0, worst = -1;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bx, by;
        memcpy(&bx, &x[i], 4);
        memcpy(&by, &y[i], 4);
        bool same = (isnan(x[i]) && isnan(y[i])) || bx == by;
        if (!same) {
            if (worst < 0)
                worst = i;
            bad++;
        }
    }
    if (bad)
        fail_msg("%s: %lld of %lld elements differ from numpy; first at index %lld: got %a, "
                 "numpy %a", src, (long long)bad, (long long)n, (long long)worst,
                 (double)x[worst], (double)y[worst]);
    qcal_npy_array_free(&a);
    qcal_npy_array_free(&g);
}

static void test_convert_f64_f16(void **state)
{
    (void)state;
    check_conversion("f64_5.npy", "f64_5_as_f32.npy", 5);
    check_conversion("f16_all.npy", "f16_all_as_f32.npy", 65536);
    /* Raw read keeps the file's dtype. */
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(data_path("f16_all.npy"), &a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_F16);
    assert_int_equal(a.nbytes, 65536 * 2);
    assert_int_equal(qcal_npy_to_f32(&a), QCAL_OK);
    assert_int_equal(a.dtype, QCAL_NPY_F32);
    assert_int_equal(a.nbytes, 65536 * 4);
    assert_true(((float *)a.data)[1] == 0x1p-24f);       /* smallest subnormal */
    assert_true(((float *)a.data)[0x3c00] == 1.0f);
    assert_true(isinf(((float *)a.data)[0x7c00]));
    qcal_npy_array_free(&a);
}

static void test_unsupported_files(void **state)
{
    (void)state;
    static const struct { const char *file, *needle; } cases[] = {
        { "fortran_2x3.npy", "Fortran" },   { "big_endian.npy", "big-endian" },
        { "complex.npy", "'<c8'" },         { "object.npy", "'|O'" },
        { "structured.npy", "structured" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        qcal_npy_array a = { .ndim = 5 };
        qcal_status st = qcal_npy_read(data_path(cases[i].file), &a);
        if (st != QCAL_ERR_UNSUPPORTED)
            fail_msg("%s: status %d (%s)", cases[i].file, st, qcal_last_error());
        assert_int_equal(a.ndim, 5);
        assert_msg_has(cases[i].file);
        assert_msg_has(cases[i].needle);
    }
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(tmp_path("does_not_exist.npy"), &a), QCAL_ERR_NOT_FOUND);
    assert_msg_has("does_not_exist.npy");
    assert_int_equal(qcal_npy_read(tmp_dir, &a), QCAL_ERR_IO); /* a directory */
}

/* ---- streaming reader ---- */

/* Reads path with qcal_npy_reader in pieces of `cap` values and compares every value, bit
 * for bit, with qcal_npy_read_f32 of the whole file. */
static void check_stream(const char *path, int64_t cap)
{
    qcal_npy_array whole, info;
    assert_int_equal(qcal_npy_read_f32(path, &whole), QCAL_OK);
    qcal_npy_reader *r = NULL;
    assert_int_equal(qcal_npy_reader_open(path, &r), QCAL_OK);
    assert_int_equal(qcal_npy_reader_info(r, &info), QCAL_OK);
    assert_null(info.data);
    assert_int_equal(info.numel, whole.numel);
    assert_int_equal(info.ndim, whole.ndim);
    for (int32_t d = 0; d < whole.ndim; d++)
        assert_int_equal(info.shape[d], whole.shape[d]);
    float *buf = malloc((size_t)cap * sizeof *buf);
    assert_non_null(buf);
    int64_t done = 0, n = 0, calls = 0;
    const uint32_t *want = whole.data;
    do {
        assert_int_equal(qcal_npy_reader_read_f32(r, buf, cap, &n), QCAL_OK);
        assert_true(n <= cap);
        assert_true(done + n <= whole.numel);
        for (int64_t i = 0; i < n; i++) {
            uint32_t got;
            memcpy(&got, &buf[i], 4);
            if (got != want[done + i])
                fail_msg("%s, pieces of %lld: element %lld is %08x, whole read %08x", path,
                         (long long)cap, (long long)(done + i), got, want[done + i]);
        }
        done += n;
        calls++;
    } while (n > 0);
    assert_int_equal(done, whole.numel);
    assert_int_equal(calls, (whole.numel + cap - 1) / cap + 1);   /* then one n == 0 */
    qcal_npy_reader_close(&r);
    assert_null(r);
    qcal_npy_reader_close(&r);   /* NULL is fine */
    free(buf);
    qcal_npy_array_free(&whole);
}

static void test_reader_pieces(void **state)
{
    (void)state;
    static const char *files[] = { "f32_3x4.npy", "f32_1d.npy", "f32_v2.npy", "f32_v3.npy",
                                   "scalar_f32.npy", "f64_5.npy", "f16_all.npy" };
    static const int64_t caps[] = { 1, 3, 5, 4096, 65535, 65536, 1 << 20 };
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++)
        for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
            check_stream(data_path(files[f]), caps[c]);
    /* f16 beyond the reader's conversion scratch (256 KiB = 131072 halves). */
    enum { N = 300001 };
    uint16_t *h = malloc(N * sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < N; i++)
        h[i] = (uint16_t)(i * 7919u);
    int64_t shape = N;
    assert_int_equal(qcal_npy_write(tmp_path("f16_big.npy"), QCAL_NPY_F16, 1, &shape, h), QCAL_OK);
    check_stream(tmp_path("f16_big.npy"), 200000);
    check_stream(tmp_path("f16_big.npy"), N);
    free(h);
}

static void test_reader_errors(void **state)
{
    (void)state;
    qcal_npy_reader *r = (qcal_npy_reader *)&r;   /* untouched on failure */
    qcal_npy_reader *keep = r;
    assert_int_equal(qcal_npy_reader_open(tmp_path("does_not_exist.npy"), &r), QCAL_ERR_NOT_FOUND);
    assert_msg_has("does_not_exist.npy");
    assert_ptr_equal(r, keep);
    assert_int_equal(qcal_npy_reader_open(data_path("big_endian.npy"), &r), QCAL_ERR_UNSUPPORTED);
    assert_msg_has("big-endian");
    assert_ptr_equal(r, keep);
    /* A file cut short is refused on open, with qcal_npy_read's message. */
    size_t len;
    unsigned char *bytes = tu_read_file(data_path("f32_3x4.npy"), &len);
    tu_write_bytes(tmp_path("cut.npy"), bytes, len - 4);
    qcal_npy_array a;
    assert_int_equal(qcal_npy_read(tmp_path("cut.npy"), &a), QCAL_ERR_FORMAT);
    char want[1024];
    snprintf(want, sizeof want, "%s", qcal_last_error());
    assert_int_equal(qcal_npy_reader_open(tmp_path("cut.npy"), &r), QCAL_ERR_FORMAT);
    assert_string_equal(qcal_last_error(), want);
    assert_msg_has("truncated data");
    /* A file that shrinks between two reads is an error, not a short array. */
    tu_write_bytes(tmp_path("shrinks.npy"), bytes, len);
    r = NULL;
    assert_int_equal(qcal_npy_reader_open(tmp_path("shrinks.npy"), &r), QCAL_OK);
    float buf[12];
    int64_t n = 0;
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 5, &n), QCAL_OK);
    assert_int_equal(n, 5);
    assert_int_equal(truncate(tmp_path("shrinks.npy"), (off_t)(len - 8)), 0);
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 5, &n), QCAL_OK);   /* still there */
    assert_int_equal(n, 5);
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 5, &n), QCAL_ERR_IO);
    assert_msg_has("file shrank while reading");
    assert_msg_has("shrinks.npy");
    qcal_npy_reader_close(&r);
    free(bytes);
    /* Integer files: refused on the first read, with qcal_npy_read_f32's message. */
    assert_int_equal(qcal_npy_read_f32(data_path("i32_4.npy"), &a), QCAL_ERR_MISMATCH);
    snprintf(want, sizeof want, "%s", qcal_last_error());
    assert_int_equal(qcal_npy_reader_open(data_path("i32_4.npy"), &r), QCAL_OK);
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 12, &n), QCAL_ERR_MISMATCH);
    assert_string_equal(qcal_last_error(), want);
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 0, &n), QCAL_ERR_INVALID_ARG);
    qcal_npy_reader_close(&r);
    /* An empty array: nothing to read. */
    assert_int_equal(qcal_npy_reader_open(data_path("empty_f32.npy"), &r), QCAL_OK);
    n = 7;
    assert_int_equal(qcal_npy_reader_read_f32(r, buf, 12, &n), QCAL_OK);
    assert_int_equal(n, 0);
    qcal_npy_reader_close(&r);
}

/* ---- writer: byte-identical to numpy ---- */

static void check_write(const char *golden, qcal_npy_dtype dtype, int32_t ndim,
                        const int64_t *shape, const void *data)
{
    const char *out = tmp_path(golden);
    qcal_status st = qcal_npy_write(out, dtype, ndim, shape, data);
    if (st != QCAL_OK)
        fail_msg("write %s: %s", golden, qcal_last_error());
    size_t n1, n2;
    unsigned char *a = tu_read_file(out, &n1), *b = tu_read_file(data_path(golden), &n2);
    if (n1 != n2 || memcmp(a, b, n1) != 0) {
        size_t i = 0;
        while (i < n1 && i < n2 && a[i] == b[i])
            i++;
        fail_msg("%s: qcal wrote %zu bytes, numpy %zu; first difference at byte %zu", golden,
                 n1, n2, i);
    }
    free(a);
    free(b);
}

static void test_write_matches_numpy(void **state)
{
    (void)state;
    float f[12];
    for (int i = 0; i < 12; i++)
        f[i] = (float)i * 0.25f - 1.5f;
    check_write("f32_3x4.npy", QCAL_NPY_F32, 2, (int64_t[]){ 3, 4 }, f);
    check_write("f32_1d.npy", QCAL_NPY_F32, 1, (int64_t[]){ 5 }, f);
    uint8_t u[6];
    int8_t s[6];
    for (int i = 0; i < 6; i++) {
        u[i] = (uint8_t)((i * 50) % 256);
        s[i] = (int8_t)(i * 50 - 128);
    }
    check_write("u8_2x3.npy", QCAL_NPY_U8, 2, (int64_t[]){ 2, 3 }, u);
    check_write("i8_2x3.npy", QCAL_NPY_I8, 2, (int64_t[]){ 2, 3 }, s);
    const int32_t i32[4] = { INT32_MIN, -1, 0, INT32_MAX };
    check_write("i32_4.npy", QCAL_NPY_I32, 1, (int64_t[]){ 4 }, i32);
    const int64_t i64[3] = { -5, 0, 7 };
    check_write("i64_3.npy", QCAL_NPY_I64, 1, (int64_t[]){ 3 }, i64);
    const uint8_t b2[2] = { 1, 0 };
    check_write("bool.npy", QCAL_NPY_BOOL, 1, (int64_t[]){ 2 }, b2);
    const float three_half = 3.5f;
    check_write("scalar_f32.npy", QCAL_NPY_F32, 0, NULL, &three_half);
    check_write("empty_f32.npy", QCAL_NPY_F32, 2, (int64_t[]){ 0, 3 }, NULL);

    /* Round trip through the reader, every dimension count up to 8. */
    int64_t shape[QCAL_MAX_DIMS];
    for (int32_t nd = 0; nd <= QCAL_MAX_DIMS; nd++) {
        for (int32_t i = 0; i < nd; i++)
            shape[i] = 1 + (i % 2);
        int64_t n = 1;
        for (int32_t i = 0; i < nd; i++)
            n *= shape[i];
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)i - 0.5f;
        assert_int_equal(qcal_npy_write(tmp_path("rt.npy"), QCAL_NPY_F32, nd, shape, x), QCAL_OK);
        qcal_npy_array a;
        assert_int_equal(qcal_npy_read(tmp_path("rt.npy"), &a), QCAL_OK);
        assert_int_equal(a.ndim, nd);
        assert_int_equal(a.numel, n);
        assert_memory_equal(a.data, x, (size_t)n * sizeof *x);
        qcal_npy_array_free(&a);
        free(x);
    }
}

static void test_write_errors_keep_existing(void **state)
{
    (void)state;
    const float one = 1.0f;
    char out[8192];
    snprintf(out, sizeof out, "%s", tmp_path("keep.npy")); /* tmp_path's buffer is reused */
    assert_int_equal(qcal_npy_write(out, QCAL_NPY_F32, 0, NULL, &one), QCAL_OK);
    size_t n0, n1;
    void *before = tu_read_file(out, &n0);
    int64_t neg[1] = { -1 }, big[2] = { INT64_MAX / 2, 4 };
    int64_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    assert_int_equal(qcal_npy_write(out, QCAL_NPY_F32, 1, neg, &one), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_npy_write(out, QCAL_NPY_F32, 2, big, &one), QCAL_ERR_OVERFLOW);
    assert_int_equal(qcal_npy_write(out, QCAL_NPY_F32, 9, nine, &one), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_npy_write(out, (qcal_npy_dtype)99, 0, NULL, &one), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_npy_write(out, QCAL_NPY_F32, 1, (int64_t[]){ 2 }, NULL),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_npy_write(tmp_path("no/such/dir.npy"), QCAL_NPY_F32, 0, NULL, &one),
                     QCAL_ERR_IO);
    assert_msg_has("no/such/dir.npy");
    void *after = tu_read_file(out, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    assert_int_equal(tu_count_entries(tmp_dir, ".tmp."), 0);
    free(before);
    free(after);
}

/* ---- malformed buffers through qcal_npy_parse ---- */

/* Builds a version-`major` .npy in buf from a header text (padded like numpy) and data. */
static size_t make_npy(unsigned char *buf, int major, const char *header, const void *data,
                       size_t dlen)
{
    size_t pre = major == 1 ? 10 : 12;
    size_t hl = strlen(header);
    size_t total = pre + hl + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = hl + pad + 1;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    if (major > 1)
        buf[10] = buf[11] = 0;
    memcpy(buf + pre, header, hl);
    memset(buf + pre + hl, ' ', pad);
    buf[pre + hlen - 1] = '\n';
    if (dlen)
        memcpy(buf + pre + hlen, data, dlen);
    return pre + hlen + dlen;
}

static void expect_parse(const void *buf, size_t len, qcal_status want, const char *needle)
{
    qcal_npy_array a = { .ndim = 3 };
    qcal_status st = qcal_npy_parse(buf, len, &a);
    if (st != want)
        fail_msg("status %d, expected %d (message: %s)", st, want, qcal_last_error());
    if (st == QCAL_OK) {
        qcal_npy_array_free(&a);
        return;
    }
    assert_int_equal(a.ndim, 3);
    assert_msg_has("<memory>");
    assert_msg_has(needle);
}

static void test_parse_malformed(void **state)
{
    (void)state;
    static unsigned char buf[4096];
    const float d[6] = { 1, 2, 3, 4, 5, 6 };
    size_t n;
#define HDR(descr, fo, shape) "{'descr': '" descr "', 'fortran_order': " fo ", 'shape': " shape ", }"
    n = make_npy(buf, 1, HDR("<f4", "False", "(2, 3)"), d, sizeof d);
    expect_parse(buf, n, QCAL_OK, "");
    /* Every truncation of the header is a clean format error. */
    for (size_t cut = 0; cut < 64; cut++) {
        qcal_npy_array a;
        qcal_status st = qcal_npy_parse(buf, cut, &a);
        if (st != QCAL_ERR_FORMAT)
            fail_msg("truncated to %zu bytes: status %d (%s)", cut, st, qcal_last_error());
    }
    expect_parse(buf, 30, QCAL_ERR_FORMAT, "truncated header");
    expect_parse(buf, n - 1, QCAL_ERR_FORMAT, "truncated data");
    expect_parse(buf, n - sizeof d + 4, QCAL_ERR_FORMAT, "truncated data");
    buf[n] = 0;
    expect_parse(buf, n + 1, QCAL_ERR_FORMAT, "trailing bytes");
    /* Bad magic and versions. */
    buf[1] = 'X';
    expect_parse(buf, n, QCAL_ERR_FORMAT, "bad magic");
    buf[1] = 'N';
    buf[6] = 4;
    expect_parse(buf, n, QCAL_ERR_UNSUPPORTED, "version 4.0");
    buf[6] = 0;
    expect_parse(buf, n, QCAL_ERR_UNSUPPORTED, "version 0.0");
    buf[6] = 1;
    buf[7] = 1;
    expect_parse(buf, n, QCAL_ERR_UNSUPPORTED, "version 1.1");
    /* Version 2 prefix with a header length that claims 16 MiB. */
    n = make_npy(buf, 2, HDR("<f4", "False", "(2, 3)"), d, sizeof d);
    expect_parse(buf, n, QCAL_OK, "");
    buf[11] = 1;
    expect_parse(buf, n, QCAL_ERR_UNSUPPORTED, "exceeds");
    /* A lying shape: header says 100 elements, 6 present. */
    n = make_npy(buf, 1, HDR("<f4", "False", "(10, 10)"), d, sizeof d);
    expect_parse(buf, n, QCAL_ERR_FORMAT, "truncated data");
    n = make_npy(buf, 1, HDR("<f4", "False", "(1, 2)"), d, sizeof d);
    expect_parse(buf, n, QCAL_ERR_FORMAT, "trailing");

    static const struct { const char *hdr; qcal_status st; const char *needle; } cases[] = {
        { HDR("<f4", "False", "(-2, -3)"), QCAL_ERR_FORMAT, "negative dimension" },
        { HDR("<f4", "False", "(4294967296, 4294967296)"), QCAL_ERR_OVERFLOW, "overflow" },
        { HDR("<f4", "False", "(99999999999999999999,)"), QCAL_ERR_OVERFLOW, "64 bits" },
        { HDR("<f4", "False", "(2305843009213693952,)"), QCAL_ERR_OVERFLOW, "overflow" },
        { HDR("<f4", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 6)"), QCAL_ERR_UNSUPPORTED, "dimensions" },
        { HDR("<f4", "False", "(6)"), QCAL_ERR_FORMAT, "not a tuple" },
        { HDR("<f4", "False", "[2, 3]"), QCAL_ERR_FORMAT, "not a tuple" },
        { HDR("<f4", "False", "(2, x)"), QCAL_ERR_FORMAT, "integers" },
        { HDR("<f4", "false", "(2, 3)"), QCAL_ERR_FORMAT, "True or False" },
        { HDR("<f4", "True", "(2, 3)"), QCAL_ERR_UNSUPPORTED, "Fortran" },
        { HDR(">f4", "False", "(2, 3)"), QCAL_ERR_UNSUPPORTED, "big-endian" },
        { HDR("<c8", "False", "(2, 3)"), QCAL_ERR_UNSUPPORTED, "not supported" },
        { HDR("|O", "False", "(2, 3)"), QCAL_ERR_UNSUPPORTED, "not supported" },
        { HDR("|f4", "False", "(2, 3)"), QCAL_ERR_FORMAT, "byte order" },
        { "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }",
          QCAL_ERR_UNSUPPORTED, "structured" },
        { "{'descr': '<f4', 'shape': (2, 3), }", QCAL_ERR_FORMAT, "no 'fortran_order' key" },
        { "{'fortran_order': False, 'shape': (2, 3)}", QCAL_ERR_FORMAT, "no 'descr' key" },
        { "{'descr': '<f4', 'fortran_order': False}", QCAL_ERR_FORMAT, "no 'shape' key" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", QCAL_ERR_FORMAT,
          "unexpected key 'x'" },
        { "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
          QCAL_ERR_FORMAT, "repeats" },
        { "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", QCAL_ERR_FORMAT,
          "expected ',' or '}'" },
        { "{'descr: '<f4', 'fortran_order': False, 'shape': (2, 3)}", QCAL_ERR_FORMAT,
          "dict literal" },
        { "'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", QCAL_ERR_FORMAT, "'{'" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", QCAL_ERR_FORMAT,
          "after the closing" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", QCAL_ERR_FORMAT,
          "dict literal" },
        { "", QCAL_ERR_FORMAT, "'{'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        n = make_npy(buf, 1, cases[i].hdr, d, sizeof d);
        qcal_npy_array a = { .ndim = 3 };
        qcal_status st = qcal_npy_parse(buf, n, &a);
        if (st != cases[i].st || !strstr(qcal_last_error(), cases[i].needle))
            fail_msg("header %s: status %d (%s), expected %d with '%s'", cases[i].hdr, st,
                     qcal_last_error(), cases[i].st, cases[i].needle);
        assert_int_equal(a.ndim, 3);
    }
    /* Accepted variants: double quotes, no trailing comma, Python 2 longs, '=' order,
     * Fortran order on a 1-D array (same layout), shape (). */
    static const char *ok[] = {
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
        "{'shape': (2L, 3L), 'fortran_order': False, 'descr': '=f4'}",
        "{'descr': '<f4', 'fortran_order': True, 'shape': (6,)}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        n = make_npy(buf, 1, ok[i], d, sizeof d);
        qcal_npy_array a;
        if (qcal_npy_parse(buf, n, &a) != QCAL_OK)
            fail_msg("header %s rejected: %s", ok[i], qcal_last_error());
        assert_int_equal(a.numel, 6);
        assert_memory_equal(a.data, d, sizeof d);
        qcal_npy_array_free(&a);
    }
    n = make_npy(buf, 3, HDR("<f4", "False", "()"), d, 4);
    qcal_npy_array a;
    assert_int_equal(qcal_npy_parse(buf, n, &a), QCAL_OK);
    assert_int_equal(a.ndim, 0);
    assert_true(((float *)a.data)[0] == 1.0f);
    qcal_npy_array_free(&a);
    /* 0-element array with a huge other dimension: no overflow, no allocation. */
    n = make_npy(buf, 1, HDR("<f4", "False", "(0, 9223372036854775807)"), NULL, 0);
    assert_int_equal(qcal_npy_parse(buf, n, &a), QCAL_OK);
    assert_int_equal(a.numel, 0);
    assert_null(a.data);
    qcal_npy_array_free(&a);
    assert_int_equal(qcal_npy_parse(NULL, 10, &a), QCAL_ERR_INVALID_ARG);
#undef HDR
}

/* Random byte flips of a valid file: never a crash, and an accepted buffer is consistent. */
static void test_parse_mutations(void **state)
{
    (void)state;
    size_t len;
    unsigned char *orig = tu_read_file(data_path("f32_3x4.npy"), &len);
    unsigned char *buf = malloc(len);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, orig, len);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            size_t pos = (size_t)(seed % 128); /* mostly the header */
            buf[pos] = (unsigned char)(seed >> 32);
        }
        size_t cut = iter % 7 == 0 ? (size_t)(seed >> 40) % (len + 1) : len;
        qcal_npy_array a;
        qcal_status st = qcal_npy_parse(buf, cut, &a);
        if (st == QCAL_OK) {
            accepted++;
            assert_true(a.nbytes == (size_t)a.numel * qcal_npy_dtype_size(a.dtype));
            assert_true(a.nbytes <= cut);
            qcal_npy_array_free(&a);
        } else {
            assert_true(st < 0);
            assert_true(qcal_last_error()[0] != '\0');
        }
    }
    assert_true(accepted > 0); /* flips inside padding spaces keep the file valid */
    free(buf);
    free(orig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_f32),
        cmocka_unit_test(test_read_ints),
        cmocka_unit_test(test_read_scalar_and_empty),
        cmocka_unit_test(test_convert_f64_f16),
        cmocka_unit_test(test_unsupported_files),
        cmocka_unit_test(test_reader_pieces),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_write_matches_numpy),
        cmocka_unit_test(test_write_errors_keep_existing),
        cmocka_unit_test(test_parse_malformed),
        cmocka_unit_test(test_parse_mutations),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
