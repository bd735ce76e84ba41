/* unit.dataset: qcal/dataset.h. The .npz reader on numpy's own files (tests/data/npz,
 * tests/data/npz/make_npz.py: savez, savez_compressed, ZIP64 fields, data descriptors) and on
 * archives written here (stored members, then broken in every way we could think of); the
 * dataset on files generated at test time in a temporary directory: sample rules, parts,
 * broadcast, optional inputs, entries, ordering, and every error path with its status and
 * message. */
#include <inttypes.h>
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

#include "qcal_config.h"
#include "qcal/dataset.h"
#include "qcal/npy.h"
#include "qcal/safetensors.h"

#include "testutil.h"

enum { T_F32 = 1, T_U8 = 2, T_I64 = 7, T_BOOL = 9, T_F16 = 10, T_F64 = 11 };

static char data_dir[4096];
static char tmp_dir[4096];

static const char *npz_path(const char *name)
{
    static char buf[8192];
    snprintf(buf, sizeof buf, "%s/npz/%s", data_dir, name);
    return buf;
}

/* tmp_dir/name, copied into one of 16 rotating buffers. */
static const char *tmp(const char *fmt, ...)
{
    static char bufs[16][8192];
    static int k;
    char *b = bufs[k++ % 16];
    int n = snprintf(b, 8192, "%s/", tmp_dir);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 8192 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

static void assert_msg_has(const char *needle)
{
    const char *msg = qcal_last_error();
    if (!strstr(msg, needle))
        fail_msg("error message '%s' lacks '%s'", msg, needle);
}

static void mkdir_p(const char *path)
{
    assert_true(mkdir(path, 0755) == 0);
}

/* ---- .npy bytes and stored ZIP archives made here ---- */

typedef struct blob {
    char *data;
    size_t len;
} blob;

static blob npy_bytes(qcal_npy_dtype dt, int32_t ndim, const int64_t *shape, const void *data)
{
    blob b = { 0 };
    FILE *fp = open_memstream(&b.data, &b.len);
    assert_non_null(fp);
    assert_int_equal(qcal_npy_fwrite(fp, "mem", dt, ndim, shape, data), QCAL_OK);
    fclose(fp);
    return b;
}

static uint32_t crc32_ref(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

static void put16(blob *z, size_t *cap, uint32_t v);
static void put(blob *z, size_t *cap, const void *src, size_t n)
{
    if (z->len + n > *cap) {
        *cap = (z->len + n) * 2;
        z->data = realloc(z->data, *cap);
        assert_non_null(z->data);
    }
    memcpy(z->data + z->len, src, n);
    z->len += n;
}
static void put16(blob *z, size_t *cap, uint32_t v)
{
    uint8_t b[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
    put(z, cap, b, 2);
}
static void put32(blob *z, size_t *cap, uint32_t v)
{
    put16(z, cap, v & 0xffff);
    put16(z, cap, v >> 16);
}

/* A stored ZIP archive of n members names[k] with contents m[k] (as numpy.savez writes). */
static blob zip_stored(int n, const char *const *names, const blob *m)
{
    blob z = { 0 };
    size_t cap = 0;
    uint32_t offs[16];
    for (int k = 0; k < n; k++) {
        offs[k] = (uint32_t)z.len;
        uint32_t crc = crc32_ref((const uint8_t *)m[k].data, m[k].len);
        put32(&z, &cap, 0x04034b50);
        put16(&z, &cap, 20);
        put16(&z, &cap, 0);
        put16(&z, &cap, 0);
        put32(&z, &cap, 0);
        put32(&z, &cap, crc);
        put32(&z, &cap, (uint32_t)m[k].len);
        put32(&z, &cap, (uint32_t)m[k].len);
        put16(&z, &cap, (uint32_t)strlen(names[k]));
        put16(&z, &cap, 0);
        put(&z, &cap, names[k], strlen(names[k]));
        put(&z, &cap, m[k].data, m[k].len);
    }
    uint32_t cd = (uint32_t)z.len;
    for (int k = 0; k < n; k++) {
        uint32_t crc = crc32_ref((const uint8_t *)m[k].data, m[k].len);
        put32(&z, &cap, 0x02014b50);
        put16(&z, &cap, 20);
        put16(&z, &cap, 20);
        put16(&z, &cap, 0);
        put16(&z, &cap, 0);
        put32(&z, &cap, 0);
        put32(&z, &cap, crc);
        put32(&z, &cap, (uint32_t)m[k].len);
        put32(&z, &cap, (uint32_t)m[k].len);
        put16(&z, &cap, (uint32_t)strlen(names[k]));
        put16(&z, &cap, 0);
        put16(&z, &cap, 0);
        put16(&z, &cap, 0);
        put16(&z, &cap, 0);
        put32(&z, &cap, 0);
        put32(&z, &cap, offs[k]);
        put(&z, &cap, names[k], strlen(names[k]));
    }
    uint32_t cd_size = (uint32_t)z.len - cd;
    put32(&z, &cap, 0x06054b50);
    put16(&z, &cap, 0);
    put16(&z, &cap, 0);
    put16(&z, &cap, (uint32_t)n);
    put16(&z, &cap, (uint32_t)n);
    put32(&z, &cap, cd_size);
    put32(&z, &cap, cd);
    put16(&z, &cap, 0);
    return z;
}

/* Writes a stored .npz of two arrays x (float32 [rows, 3]) and y (int64 [rows]) to path;
 * x[r][c] = r * 10 + c, y[r] = 100 + r. */
static void write_xy_npz(const char *path, int64_t rows, int32_t x_dtype_f64)
{
    float xf[64 * 3];
    double xd[64 * 3];
    int64_t y[64];
    for (int64_t r = 0; r < rows; r++) {
        for (int c = 0; c < 3; c++) {
            xf[r * 3 + c] = (float)(r * 10 + c);
            xd[r * 3 + c] = (double)(r * 10 + c);
        }
        y[r] = 100 + r;
    }
    blob m[2] = { x_dtype_f64 ? npy_bytes(QCAL_NPY_F64, 2, (int64_t[]){ rows, 3 }, xd)
                              : npy_bytes(QCAL_NPY_F32, 2, (int64_t[]){ rows, 3 }, xf),
                  npy_bytes(QCAL_NPY_I64, 1, (int64_t[]){ rows }, y) };
    const char *names[2] = { "x.npy", "y.npy" };
    blob z = zip_stored(2, names, m);
    tu_write_bytes(path, z.data, z.len);
    free(z.data);
    free(m[0].data);
    free(m[1].data);
}

static void write_f32(const char *path, int32_t ndim, const int64_t *shape, float base)
{
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = base + (float)i;
    assert_int_equal(qcal_npy_write(path, QCAL_NPY_F32, ndim, shape, v), QCAL_OK);
    free(v);
}

static qcal_dataset_input in_f32(const char *name, int32_t ndim, const int64_t *dims)
{
    qcal_dataset_input in = { name, T_F32, ndim, { 0 } };
    for (int32_t d = 0; d < ndim; d++)
        in.dims[d] = dims[d];
    return in;
}

static int group_setup(void **state)
{
    (void)state;
    const char *d = getenv("QCAL_TEST_DATA");
    snprintf(data_dir, sizeof data_dir, "%s", d ? d : "tests/data");
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal_test_dataset.XXXXXX");
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

/* ---- .npz ---- */

/* The arrays of make_npz.py. */
static void check_fixture(const qcal_npz_entry *e, int64_t n, bool with_data)
{
    assert_int_equal(n, 5);
    static const char *names[5] = { "x", "mask", "ids", "h", "s" };
    static const int32_t types[5] = { T_F32, T_BOOL, T_I64, T_F16, T_F32 };
    static const int32_t ndims[5] = { 2, 1, 1, 2, 0 };
    for (int k = 0; k < 5; k++) {
        assert_string_equal(e[k].name, names[k]);
        assert_int_equal(e[k].elem_type, types[k]);
        assert_int_equal(e[k].ndim, ndims[k]);
        if (!with_data) {
            assert_null(e[k].data);
            assert_int_equal(e[k].nbytes, 0);
        }
    }
    assert_int_equal(e[0].dims[0], 4);
    assert_int_equal(e[0].dims[1], 3);
    assert_int_equal(e[3].dims[0], 2);
    assert_int_equal(e[3].dims[1], 2);
    if (!with_data)
        return;
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i / 4;
    assert_int_equal(e[0].nbytes, sizeof x);
    assert_memory_equal(e[0].data, x, sizeof x);
    assert_true(((uintptr_t)e[0].data & 63) == 0);
    const uint8_t mask[4] = { 1, 0, 1, 1 };
    assert_int_equal(e[1].nbytes, 4);
    assert_memory_equal(e[1].data, mask, 4);
    const int64_t ids[4] = { -5, 0, 7, (int64_t)1 << 40 };
    assert_int_equal(e[2].nbytes, sizeof ids);
    assert_memory_equal(e[2].data, ids, sizeof ids);
    const uint16_t h[4] = { 0x3c00, 0xc000, 0x3800, 0x7bff };
    assert_int_equal(e[3].nbytes, sizeof h);
    assert_memory_equal(e[3].data, h, sizeof h);
    const float s = 3.5f;
    assert_int_equal(e[4].nbytes, 4);
    assert_memory_equal(e[4].data, &s, 4);
}

static void test_npz_numpy_files(void **state)
{
    (void)state;
    static const char *files[] = { "plain.npz", "compressed.npz", "zip64_cd.npz", "stream.npz" };
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        bool deflated = !strcmp(files[f], "compressed.npz");
        if (deflated && !QCAL_HAVE_ZLIB) {
            qcal_npz_entry *e = NULL;
            int64_t n = 0;
            assert_int_equal(qcal_npz_read(npz_path(files[f]), false, &e, &n),
                             QCAL_ERR_UNSUPPORTED);
            assert_msg_has("without zlib");
            continue;
        }
        for (int wd = 0; wd < 2; wd++) {
            qcal_npz_entry *e = NULL;
            int64_t n = 0;
            if (qcal_npz_read(npz_path(files[f]), wd, &e, &n) != QCAL_OK)
                fail_msg("%s: %s", files[f], qcal_last_error());
            check_fixture(e, n, wd);
            qcal_npz_free(&e, n);
            assert_null(e);
            /* The same from memory. */
            size_t len = 0;
            void *buf = tu_read_file(npz_path(files[f]), &len);
            assert_int_equal(qcal_npz_parse(buf, len, wd, &e, &n), QCAL_OK);
            check_fixture(e, n, wd);
            qcal_npz_free(&e, n);
            free(buf);
        }
    }
    qcal_npz_free(NULL, 0);
}

static void expect_npz_error(const void *buf, size_t len, qcal_status want, const char *needle)
{
    for (int wd = 0; wd < 2; wd++) {
        qcal_npz_entry *e = (qcal_npz_entry *)(uintptr_t)0x1;
        int64_t n = -7;
        qcal_status st = qcal_npz_parse(buf, len, wd, &e, &n);
        if (st != want)
            fail_msg("status %d, want %d (%s)", st, want, qcal_last_error());
        assert_true(e == (qcal_npz_entry *)(uintptr_t)0x1 && n == -7);   /* untouched */
        if (needle)
            assert_msg_has(needle);
    }
}

static void test_npz_malformed(void **state)
{
    (void)state;
    size_t len = 0;
    uint8_t *plain = tu_read_file(npz_path("plain.npz"), &len);
    /* Every truncation fails cleanly (FORMAT), never reads past the buffer. */
    for (size_t cut = 0; cut < len; cut++) {
        qcal_npz_entry *e = NULL;
        int64_t n = 0;
        qcal_status st = qcal_npz_parse(plain, cut, true, &e, &n);
        if (st != QCAL_ERR_FORMAT)
            fail_msg("cut at %zu: status %d (%s)", cut, st, qcal_last_error());
    }
    expect_npz_error(plain, 0, QCAL_ERR_FORMAT, "empty");
    expect_npz_error(plain, len - 30, QCAL_ERR_FORMAT, "end-of-central-directory");
    /* A flipped data byte: the CRC catches it (full reads). */
    uint8_t *bad = malloc(len);
    memcpy(bad, plain, len);
    bad[30 + 5 + 20 + 128 + 4] ^= 0x40;   /* inside x.npy's data */
    qcal_npz_entry *e = NULL;
    int64_t n = 0;
    assert_int_equal(qcal_npz_parse(bad, len, true, &e, &n), QCAL_ERR_FORMAT);
    assert_msg_has("CRC-32");
    assert_msg_has("x.npy");
    assert_int_equal(qcal_npz_parse(bad, len, false, &e, &n), QCAL_OK);   /* headers fine */
    qcal_npz_free(&e, n);
    /* A broken local header signature. */
    memcpy(bad, plain, len);
    bad[0] = 'Q';
    expect_npz_error(bad, len, QCAL_ERR_FORMAT, "local header");
    free(bad);

    /* A member that is not .npy, a .npy member that is not a .npy file. */
    blob good = npy_bytes(QCAL_NPY_F32, 1, (int64_t[]){ 2 }, (float[]){ 1, 2 });
    blob text = { (char *)"hello", 5 };
    {
        const char *names[2] = { "x.npy", "notes.txt" };
        blob m[2] = { good, text };
        blob z = zip_stored(2, names, m);
        expect_npz_error(z.data, z.len, QCAL_ERR_FORMAT, "member 'notes.txt' is not a .npy file");
        free(z.data);
    }
    {
        const char *names[1] = { "x.npy" };
        blob z = zip_stored(1, names, &text);
        expect_npz_error(z.data, z.len, QCAL_ERR_FORMAT, "x.npy");
        free(z.data);
    }
    {
        const char *names[2] = { "x.npy", "x.npy" };
        blob m[2] = { good, good };
        blob z = zip_stored(2, names, m);
        expect_npz_error(z.data, z.len, QCAL_ERR_FORMAT, "appears twice");
        free(z.data);
    }
    {   /* An empty archive is valid: no entries. */
        blob z = zip_stored(0, NULL, NULL);
        assert_int_equal(qcal_npz_parse(z.data, z.len, true, &e, &n), QCAL_OK);
        assert_int_equal(n, 0);
        qcal_npz_free(&e, n);
        free(z.data);
    }
    free(good.data);
    free(plain);

#if QCAL_HAVE_ZLIB
    /* A corrupt deflate stream: the first block of x.npy gets the reserved type 3. */
    uint8_t *c = tu_read_file(npz_path("compressed.npz"), &len);
    size_t data0 = 30 + (size_t)(c[26] | c[27] << 8) + (size_t)(c[28] | c[29] << 8);
    c[data0] = 0xff;
    expect_npz_error(c, len, QCAL_ERR_FORMAT, "corrupt deflate stream");
    free(c);
    /* A truncated deflated member (the archive cut inside its data). */
    c = tu_read_file(npz_path("compressed.npz"), &len);
    for (size_t cut = 0; cut < len; cut += 7)
        expect_npz_error(c, cut, QCAL_ERR_FORMAT, NULL);
    free(c);
#endif
    qcal_npz_entry *e2 = NULL;
    assert_int_equal(qcal_npz_read(tmp("nope.npz"), false, &e2, &n), QCAL_ERR_NOT_FOUND);
    assert_msg_has("nope.npz");
}

/* ---- dataset ---- */

static void read_check(qcal_dataset *ds, int64_t i, int64_t first, int64_t n,
                       qcal_dataset_batch **b)
{
    if (qcal_dataset_read(ds, i, first, n, b) != QCAL_OK)
        fail_msg("read %" PRId64 " [%" PRId64 ", +%" PRId64 "): %s", i, first, n,
                 qcal_last_error());
}

static void test_npz_splittable_parts(void **state)
{
    (void)state;
    const char *p = tmp("xy.npz");
    write_xy_npz(p, 5, 0);
    qcal_dataset_input in[2] = { in_f32("x", 2, (int64_t[]){ -1, 3 }),
                                 { "y", T_I64, 1, { -1 } } };
    qcal_dataset *ds = NULL;
    assert_int_equal(qcal_dataset_open(p, NULL, 0, in, 2, NULL, &ds), QCAL_OK);
    assert_int_equal(qcal_dataset_file_count(ds), 1);
    qcal_dataset_file_info fi;
    assert_int_equal(qcal_dataset_file_get(ds, 0, &fi), QCAL_OK);
    assert_string_equal(fi.path, p);
    assert_int_equal(fi.samples, 5);
    assert_true(fi.splittable);
    assert_int_equal(fi.sample_bytes, 12 + 8);
    for (int64_t first = 0; first < 5; first++)
        for (int64_t n = 1; first + n <= 5; n++) {
            qcal_dataset_batch *b = NULL;
            read_check(ds, 0, first, n, &b);
            const qcal_engine_value *v = qcal_dataset_batch_values(b);
            assert_string_equal(v[0].name, "x");
            assert_string_equal(v[1].name, "y");
            assert_int_equal(v[0].elem_type, T_F32);
            assert_int_equal(v[0].ndim, 2);
            assert_int_equal(v[0].dims[0], n);
            assert_int_equal(v[0].dims[1], 3);
            assert_int_equal(v[1].ndim, 1);
            assert_int_equal(v[1].dims[0], n);
            assert_int_equal(v[0].nbytes, (size_t)n * 12);
            assert_int_equal(v[1].nbytes, (size_t)n * 8);
            assert_true(((uintptr_t)v[0].data & 63) == 0);
            for (int64_t r = 0; r < n; r++) {
                for (int c = 0; c < 3; c++)
                    assert_true(((const float *)v[0].data)[r * 3 + c] ==
                                (float)((first + r) * 10 + c));
                assert_int_equal(((const int64_t *)v[1].data)[r], 100 + first + r);
            }
            qcal_dataset_batch_free(&b);
            assert_null(b);
        }
    /* Out of range reads. */
    qcal_dataset_batch *b = (qcal_dataset_batch *)(uintptr_t)0x1;
    assert_int_equal(qcal_dataset_read(ds, 0, 4, 2, &b), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_dataset_read(ds, 0, 0, 0, &b), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_dataset_read(ds, 1, 0, 1, &b), QCAL_ERR_INVALID_ARG);
    assert_true(b == (qcal_dataset_batch *)(uintptr_t)0x1);
    qcal_dataset_close(&ds);
    assert_null(ds);
    qcal_dataset_close(&ds);
    qcal_dataset_close(NULL);
    qcal_dataset_batch_free(NULL);
}

/* compressed.npz (deflated) as a batch: x, mask, ids split; h (static first dim) and the 0-d
 * s broadcast; parts inflate each member once. */
static void test_numpy_npz_batch(void **state)
{
    (void)state;
    if (!QCAL_HAVE_ZLIB)
        skip();
    qcal_dataset_input in[5] = { in_f32("x", 2, (int64_t[]){ -1, 3 }),
                                 { "mask", T_BOOL, 1, { -1 } },
                                 { "ids", T_I64, 1, { -1 } },
                                 { "h", T_F16, 2, { 2, -1 } },
                                 in_f32("s", 0, NULL) };
    static const char *files[] = { "compressed.npz", "plain.npz", "stream.npz", "zip64_cd.npz" };
    for (size_t f = 0; f < 4; f++) {
        qcal_dataset *ds = NULL;
        if (qcal_dataset_open(npz_path(files[f]), NULL, 0, in, 5, NULL, &ds) != QCAL_OK)
            fail_msg("%s: %s", files[f], qcal_last_error());
        qcal_dataset_file_info fi;
        assert_int_equal(qcal_dataset_file_get(ds, 0, &fi), QCAL_OK);
        assert_int_equal(fi.samples, 4);
        assert_true(fi.splittable);
        assert_int_equal(fi.sample_bytes, 12 + 1 + 8 + 8 + 4);
        for (int64_t first = 0; first < 4; first += 2) {
            qcal_dataset_batch *b = NULL;
            read_check(ds, 0, first, 2, &b);
            const qcal_engine_value *v = qcal_dataset_batch_values(b);
            assert_int_equal(v[0].dims[0], 2);
            for (int k = 0; k < 6; k++)
                assert_true(((const float *)v[0].data)[k] == (float)(first * 3 + k) / 4);
            const uint8_t mask[4] = { 1, 0, 1, 1 };
            assert_memory_equal(v[1].data, mask + first, 2);
            const int64_t ids[4] = { -5, 0, 7, (int64_t)1 << 40 };
            assert_memory_equal(v[2].data, ids + first, 16);
            const uint16_t h[4] = { 0x3c00, 0xc000, 0x3800, 0x7bff };
            assert_int_equal(v[3].ndim, 2);
            assert_int_equal(v[3].dims[0], 2);
            assert_int_equal(v[3].dims[1], 2);
            assert_memory_equal(v[3].data, h, 8);
            assert_int_equal(v[4].ndim, 0);
            assert_int_equal(v[4].nbytes, 4);
            assert_true(*(const float *)v[4].data == 3.5f);
            qcal_dataset_batch_free(&b);
        }
        qcal_dataset_close(&ds);
    }
}

/* Rank + 1 arrays (one sample per run), one-sample arrays, optional inputs. */
static void test_sample_kinds_and_optional(void **state)
{
    (void)state;
    const char *dir = tmp("kinds");
    mkdir_p(dir);
    write_f32(tmp("kinds/a.npy"), 3, (int64_t[]){ 3, 1, 2 }, 0);   /* 3 samples of [1, 2] */
    write_f32(tmp("kinds/c.npy"), 2, (int64_t[]){ 2, 2 }, 50);     /* one sample */
    qcal_dataset_input in[3] = { in_f32("a", 2, (int64_t[]){ 1, 2 }),
                                 in_f32("c", 2, (int64_t[]){ 2, -1 }),
                                 in_f32("state", 3, (int64_t[]){ 1, -1, 4 }) };
    const char *opt_names[1] = { "state" };
    qcal_dataset_options opt;
    qcal_dataset_options_default(&opt);
    assert_null(opt.optional);
    assert_int_equal(opt.n_optional, 0);
    opt.optional = opt_names;
    opt.n_optional = 1;
    qcal_dataset *ds = NULL;
    if (qcal_dataset_open(dir, NULL, 0, in, 3, &opt, &ds) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
    assert_int_equal(qcal_dataset_file_count(ds), 1);   /* the directory is one batch */
    qcal_dataset_file_info fi;
    assert_int_equal(qcal_dataset_file_get(ds, 0, &fi), QCAL_OK);
    assert_int_equal(fi.samples, 3);
    assert_false(fi.splittable);
    assert_int_equal(fi.sample_bytes, 8 + 16);
    qcal_dataset_batch *b = NULL;
    assert_int_equal(qcal_dataset_read(ds, 0, 0, 2, &b), QCAL_ERR_INVALID_ARG);
    assert_msg_has("one per run");
    read_check(ds, 0, 2, 1, &b);
    const qcal_engine_value *v = qcal_dataset_batch_values(b);
    assert_int_equal(v[0].ndim, 2);
    assert_int_equal(v[0].dims[0], 1);
    assert_int_equal(v[0].dims[1], 2);
    assert_true(((const float *)v[0].data)[0] == 4 && ((const float *)v[0].data)[1] == 5);
    assert_int_equal(v[1].ndim, 2);
    assert_true(((const float *)v[1].data)[3] == 53);
    assert_string_equal(v[2].name, "state");
    assert_null(v[2].data);
    assert_int_equal(v[2].nbytes, 0);
    assert_int_equal(v[2].elem_type, T_F32);
    assert_int_equal(v[2].ndim, 3);
    assert_int_equal(v[2].dims[1], -1);
    assert_int_equal(v[2].dims[2], 4);
    qcal_dataset_batch_free(&b);
    qcal_dataset_close(&ds);

    /* Without the option the missing input is an error. */
    assert_int_equal(qcal_dataset_open(dir, NULL, 0, in, 3, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_null(ds);
    /* Unknown rank: any array is one sample. */
    qcal_dataset_input any[2] = { in_f32("a", -1, NULL), in_f32("c", -1, NULL) };
    assert_int_equal(qcal_dataset_open(dir, NULL, 0, any, 2, NULL, &ds), QCAL_OK);
    assert_int_equal(qcal_dataset_file_get(ds, 0, &fi), QCAL_OK);
    assert_int_equal(fi.samples, 1);
    read_check(ds, 0, 0, 1, &b);
    assert_int_equal(qcal_dataset_batch_values(b)[0].ndim, 3);
    assert_int_equal(qcal_dataset_batch_values(b)[0].nbytes, 24);
    qcal_dataset_batch_free(&b);
    qcal_dataset_close(&ds);
}

/* A directory of batches: files sorted by name (bytes), subdirectories of NAME.npy. */
static void test_directory_of_batches(void **state)
{
    (void)state;
    const char *dir = tmp("batches");
    mkdir_p(dir);
    write_f32(tmp("batches/b10.npy"), 2, (int64_t[]){ 2, 3 }, 10);
    write_f32(tmp("batches/B2.npy"), 2, (int64_t[]){ 1, 3 }, 2);
    write_xy_npz(tmp("batches/a.npz"), 3, 0);   /* x and y: one input model takes x only? */
    tu_write_bytes(tmp("batches/README"), "notes", 5);
    mkdir_p(tmp("batches/c_dir"));
    write_f32(tmp("batches/c_dir/whatever.npy"), 2, (int64_t[]){ 4, 3 }, 7);
    /* One input: a file holding exactly one array of any name; a.npz holds two. */
    qcal_dataset_input in = in_f32("x", 2, (int64_t[]){ -1, 3 });
    qcal_dataset *ds = NULL;
    assert_int_equal(qcal_dataset_open(dir, NULL, 0, &in, 1, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("a.npz: array 'y' is not an input of the model (inputs: x)");
    unlink(tmp("batches/a.npz"));
    assert_int_equal(qcal_dataset_open(dir, NULL, 0, &in, 1, NULL, &ds), QCAL_OK);
    assert_int_equal(qcal_dataset_file_count(ds), 3);
    static const char *order[3] = { "B2.npy", "b10.npy", "c_dir" };
    static const int64_t samples[3] = { 1, 2, 4 };
    static const float base[3] = { 2, 10, 7 };
    for (int64_t i = 0; i < 3; i++) {
        qcal_dataset_file_info fi;
        assert_int_equal(qcal_dataset_file_get(ds, i, &fi), QCAL_OK);
        assert_string_equal(fi.path, tmp("batches/%s", order[i]));
        assert_int_equal(fi.samples, samples[i]);
        qcal_dataset_batch *b = NULL;
        read_check(ds, i, 0, 1, &b);
        assert_true(*(const float *)qcal_dataset_batch_values(b)[0].data == base[i]);
        qcal_dataset_batch_free(&b);
    }
    /* Files of other batches interleaved: handles reopen. */
    qcal_dataset_batch *b = NULL;
    read_check(ds, 2, 3, 1, &b);
    assert_true(((const float *)qcal_dataset_batch_values(b)[0].data)[0] == 7 + 9);
    qcal_dataset_batch_free(&b);
    qcal_dataset_file_info fi;
    assert_int_equal(qcal_dataset_file_get(ds, 3, &fi), QCAL_ERR_INVALID_ARG);
    qcal_dataset_close(&ds);
}

/* NAME=PATH entries: zipped by index with the spec's batches, single files broadcast. */
static void test_entries(void **state)
{
    (void)state;
    mkdir_p(tmp("ent"));
    mkdir_p(tmp("ent/xs"));
    mkdir_p(tmp("ent/ys"));
    for (int k = 0; k < 3; k++) {
        write_f32(tmp("ent/xs/%d.npy", k), 2, (int64_t[]){ 2, 3 }, (float)(100 * k));
        write_f32(tmp("ent/ys/%d.npy", k), 1, (int64_t[]){ 2 }, (float)(1000 * k));
    }
    write_f32(tmp("ent/z.npy"), 1, (int64_t[]){ 5 }, -1);
    qcal_dataset_input in[3] = { in_f32("x", 2, (int64_t[]){ -1, 3 }),
                                 in_f32("y", 1, (int64_t[]){ -1 }),
                                 in_f32("z", 1, (int64_t[]){ 5 }) };
    char e_x[4096], e_y[4096], e_z[4096];
    snprintf(e_x, sizeof e_x, "x=%s", tmp("ent/xs"));
    snprintf(e_y, sizeof e_y, "y=%s", tmp("ent/ys"));
    snprintf(e_z, sizeof e_z, "z=%s", tmp("ent/z.npy"));
    const char *ents[3] = { e_x, e_y, e_z };
    qcal_dataset *ds = NULL;
    if (qcal_dataset_open(NULL, ents, 3, in, 3, NULL, &ds) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
    assert_int_equal(qcal_dataset_file_count(ds), 3);
    for (int64_t i = 0; i < 3; i++) {
        qcal_dataset_file_info fi;
        assert_int_equal(qcal_dataset_file_get(ds, i, &fi), QCAL_OK);
        assert_int_equal(fi.samples, 2);
        assert_true(fi.splittable);   /* z (one sample of [5]) broadcasts */
        qcal_dataset_batch *b = NULL;
        read_check(ds, i, 1, 1, &b);
        const qcal_engine_value *v = qcal_dataset_batch_values(b);
        assert_true(((const float *)v[0].data)[0] == (float)(100 * i + 3));
        assert_true(((const float *)v[1].data)[0] == (float)(1000 * i + 1));
        assert_true(((const float *)v[2].data)[4] == 3);
        qcal_dataset_batch_free(&b);
    }
    qcal_dataset_close(&ds);

    /* The spec gives x (a directory of batches), entries give y and z. */
    const char *ents2[2] = { e_y, e_z };
    assert_int_equal(qcal_dataset_open(tmp("ent/xs"), ents2, 2, in, 3, NULL, &ds), QCAL_OK);
    assert_int_equal(qcal_dataset_file_count(ds), 3);
    qcal_dataset_close(&ds);

    /* Counts that differ: both named. */
    mkdir_p(tmp("ent/y2"));
    write_f32(tmp("ent/y2/0.npy"), 1, (int64_t[]){ 2 }, 0);
    write_f32(tmp("ent/y2/1.npy"), 1, (int64_t[]){ 2 }, 0);
    char e_y2[4096];
    snprintf(e_y2, sizeof e_y2, "y=%s", tmp("ent/y2"));
    const char *ents3[3] = { e_x, e_y2, e_z };
    assert_int_equal(qcal_dataset_open(NULL, ents3, 3, in, 3, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("gives 3 batches");
    assert_msg_has("gives 2");
    /* An entry for an input the model does not have; a malformed entry; a missing input. */
    const char *bad[1] = { "w=/nonexistent" };
    assert_int_equal(qcal_dataset_open(NULL, bad, 1, in, 3, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("'w' is not an input of the model (inputs: x, y, z)");
    const char *bad2[1] = { "x" };
    assert_int_equal(qcal_dataset_open(NULL, bad2, 1, in, 3, NULL, &ds), QCAL_ERR_INVALID_ARG);
    const char *ents4[2] = { e_x, e_y };
    assert_int_equal(qcal_dataset_open(NULL, ents4, 2, in, 3, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("no data for input 'z'");
    char e_missing[4096];
    snprintf(e_missing, sizeof e_missing, "z=%s", tmp("ent/none.npy"));
    const char *ents5[3] = { e_x, e_y, e_missing };
    assert_int_equal(qcal_dataset_open(NULL, ents5, 3, in, 3, NULL, &ds), QCAL_ERR_NOT_FOUND);
    assert_msg_has("none.npy");
    assert_null(ds);
}

/* A .safetensors batch (int64 and uint8 tensors, written with qcal_safetensors_header). */
static void test_safetensors_batch(void **state)
{
    (void)state;
    qcal_safetensors_desc d[2] = { { "tok", "I64", 2, { 3, 2 } }, { "img", "U8", 2, { 3, 4 } } };
    void *hdr = NULL;
    size_t hlen = 0;
    int64_t data_bytes = 0;
    assert_int_equal(qcal_safetensors_header(2, d, 0, NULL, &hdr, &hlen, &data_bytes), QCAL_OK);
    assert_int_equal(data_bytes, 48 + 12);
    uint8_t *file = malloc(hlen + 60);
    memcpy(file, hdr, hlen);
    int64_t tok[6] = { 1, 2, 3, 4, 5, 6 };
    memcpy(file + hlen, tok, 48);
    for (int k = 0; k < 12; k++)
        file[hlen + 48 + k] = (uint8_t)(200 + k);
    tu_write_bytes(tmp("b.safetensors"), file, hlen + 60);
    free(file);
    free(hdr);
    qcal_dataset_input in[2] = { { "img", T_U8, 2, { -1, 4 } }, { "tok", T_I64, 2, { -1, 2 } } };
    qcal_dataset *ds = NULL;
    if (qcal_dataset_open(tmp("b.safetensors"), NULL, 0, in, 2, NULL, &ds) != QCAL_OK)
        fail_msg("%s", qcal_last_error());
    qcal_dataset_batch *b = NULL;
    read_check(ds, 0, 1, 2, &b);
    const qcal_engine_value *v = qcal_dataset_batch_values(b);
    assert_int_equal(((const uint8_t *)v[0].data)[0], 204);
    assert_int_equal(v[0].nbytes, 8);
    assert_memory_equal(v[1].data, tok + 2, 32);
    qcal_dataset_batch_free(&b);
    qcal_dataset_close(&ds);
    in[1].elem_type = T_F32;
    assert_int_equal(qcal_dataset_open(tmp("b.safetensors"), NULL, 0, in, 2, NULL, &ds),
                     QCAL_ERR_MISMATCH);
    assert_msg_has("input 'tok': the model takes float32 [?, 2], the file has int64 [3, 2]");
}

/* Every refusal of open: status and one line naming the file and the input. */
static void test_open_errors(void **state)
{
    (void)state;
    qcal_dataset *ds = NULL;
    qcal_dataset_input in[2] = { in_f32("x", 2, (int64_t[]){ -1, 3 }),
                                 { "y", T_I64, 1, { -1 } } };
    /* Wrong element type. */
    const char *p64 = tmp("x64.npz");
    write_xy_npz(p64, 4, 1);
    assert_int_equal(qcal_dataset_open(p64, NULL, 0, in, 2, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("x64.npz: input 'x': the model takes float32 [?, 3], the file has float64 "
                   "[4, 3]");
    /* Wrong static dimension. */
    const char *p = tmp("xy4.npz");
    write_xy_npz(p, 4, 0);
    qcal_dataset_input in4[2] = { in_f32("x", 2, (int64_t[]){ -1, 4 }), in[1] };
    assert_int_equal(qcal_dataset_open(p, NULL, 0, in4, 2, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("input 'x': the model takes float32 [?, 4], the file has float32 [4, 3]");
    /* Missing input, extra array. */
    qcal_dataset_input in3[3] = { in[0], in[1], in_f32("z", 1, (int64_t[]){ -1 }) };
    assert_int_equal(qcal_dataset_open(p, NULL, 0, in3, 3, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("xy4.npz: no array for input 'z' (arrays: x, y)");
    assert_int_equal(qcal_dataset_open(p, NULL, 0, in, 1, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("xy4.npz: array 'y' is not an input of the model (inputs: x)");
    /* Sample counts that differ. */
    mkdir_p(tmp("mism"));
    write_f32(tmp("mism/x.npy"), 2, (int64_t[]){ 4, 3 }, 0);
    int64_t y3[3] = { 0 };
    assert_int_equal(qcal_npy_write(tmp("mism/y.npy"), QCAL_NPY_I64, 1, (int64_t[]){ 3 }, y3),
                     QCAL_OK);
    assert_int_equal(qcal_dataset_open(tmp("mism"), NULL, 0, in, 2, NULL, &ds), QCAL_ERR_MISMATCH);
    assert_msg_has("input 'x' has 4 samples, input 'y' has 3");
    /* Empty arrays. */
    write_f32(tmp("mism/x.npy"), 2, (int64_t[]){ 0, 3 }, 0);
    assert_int_equal(qcal_dataset_open(tmp("mism"), NULL, 0, in, 2, NULL, &ds), QCAL_ERR_EMPTY);
    assert_msg_has("mism/x.npy: input 'x': the array is empty");
    /* Empty spec directory, nonexistent path, unknown file type. */
    mkdir_p(tmp("empty"));
    assert_int_equal(qcal_dataset_open(tmp("empty"), NULL, 0, in, 2, NULL, &ds), QCAL_ERR_EMPTY);
    assert_msg_has("empty");
    assert_int_equal(qcal_dataset_open(tmp("nothing"), NULL, 0, in, 2, NULL, &ds),
                     QCAL_ERR_NOT_FOUND);
    assert_msg_has("nothing");
    tu_write_bytes(tmp("data.csv"), "1,2", 3);
    assert_int_equal(qcal_dataset_open(tmp("data.csv"), NULL, 0, in, 2, NULL, &ds),
                     QCAL_ERR_UNSUPPORTED);
    /* A truncated archive; a member that is not .npy. */
    size_t len = 0;
    void *buf = tu_read_file(p, &len);
    tu_write_bytes(tmp("cut.npz"), buf, len - 10);
    free(buf);
    assert_int_equal(qcal_dataset_open(tmp("cut.npz"), NULL, 0, in, 2, NULL, &ds), QCAL_ERR_FORMAT);
    assert_msg_has("cut.npz");
    blob t = { (char *)"text", 4 };
    const char *names[1] = { "x.txt" };
    blob z = zip_stored(1, names, &t);
    tu_write_bytes(tmp("txt.npz"), z.data, z.len);
    free(z.data);
    assert_int_equal(qcal_dataset_open(tmp("txt.npz"), NULL, 0, in, 2, NULL, &ds), QCAL_ERR_FORMAT);
    assert_msg_has("member 'x.txt' is not a .npy file");
#if QCAL_HAVE_ZLIB
    /* A corrupt deflate stream in a member's header: refused at open. */
    uint8_t *c = tu_read_file(npz_path("compressed.npz"), &len);
    size_t data0 = 30 + (size_t)(c[26] | c[27] << 8) + (size_t)(c[28] | c[29] << 8);
    c[data0] = 0xff;
    tu_write_bytes(tmp("corrupt.npz"), c, len);
    free(c);
    qcal_dataset_input one = in_f32("x", 2, (int64_t[]){ -1, 3 });
    assert_int_equal(qcal_dataset_open(tmp("corrupt.npz"), NULL, 0, &one, 1, NULL, &ds),
                     QCAL_ERR_FORMAT);
    assert_msg_has("corrupt deflate stream");
#endif
    /* Invalid arguments. */
    assert_int_equal(qcal_dataset_open(NULL, NULL, 0, in, 2, NULL, &ds), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_dataset_open(p, NULL, 0, NULL, 0, NULL, &ds), QCAL_ERR_INVALID_ARG);
    assert_null(ds);
}

/* A file rewritten after open is noticed at the read. */
static void test_changed_file(void **state)
{
    (void)state;
    const char *p = tmp("chg.npy");
    write_f32(p, 2, (int64_t[]){ 4, 3 }, 0);
    qcal_dataset_input in = in_f32("x", 2, (int64_t[]){ -1, 3 });
    qcal_dataset *ds = NULL;
    assert_int_equal(qcal_dataset_open(p, NULL, 0, &in, 1, NULL, &ds), QCAL_OK);
    write_f32(p, 2, (int64_t[]){ 2, 3 }, 0);
    qcal_dataset_batch *b = NULL;
    assert_int_equal(qcal_dataset_read(ds, 0, 0, 1, &b), QCAL_ERR_IO);
    assert_msg_has("changed since the dataset was opened");
    assert_null(b);
    qcal_dataset_close(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npz_numpy_files),
        cmocka_unit_test(test_npz_malformed),
        cmocka_unit_test(test_npz_splittable_parts),
        cmocka_unit_test(test_numpy_npz_batch),
        cmocka_unit_test(test_sample_kinds_and_optional),
        cmocka_unit_test(test_directory_of_batches),
        cmocka_unit_test(test_entries),
        cmocka_unit_test(test_safetensors_batch),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_changed_file),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
