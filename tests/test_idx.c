/* unit.idx: the examples' gzip IDX reader (examples/cnn/idx.c). Crafted raw and gzip buffers for every
 * validation path (truncation at every length, bit flips, bad magic, size mismatches,
 * zip-bomb claims), and the real Fashion-MNIST files against values Python's gzip module
 * read (tests/ref/gen_idx.py -> tests/data/idx/fmnist_summary.txt). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "idx.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Raw IDX bytes: magic 0x0800|ndim, dims, then payload bytes i*7+3. */
static size_t make_raw(uint8_t *buf, size_t cap, uint32_t magic, int ndim, const uint32_t *dims, size_t payload)
{
    size_t at = 0;
    uint32_t words[1 + 8];
    words[0] = magic;
    for (int i = 0; i < ndim; i++)
        words[1 + i] = dims[i];
    for (int i = 0; i < 1 + ndim; i++) {
        buf[at++] = (uint8_t)(words[i] >> 24);
        buf[at++] = (uint8_t)(words[i] >> 16);
        buf[at++] = (uint8_t)(words[i] >> 8);
        buf[at++] = (uint8_t)words[i];
    }
    assert_true(at + payload <= cap);
    for (size_t i = 0; i < payload; i++)
        buf[at++] = (uint8_t)(i * 7 + 3);
    return at;
}

/* gzip-compresses src into a new buffer. */
static uint8_t *gzip_buf(const uint8_t *src, size_t len, size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&zs, (uLong)len) + 64;
    uint8_t *dst = malloc(cap);
    assert_non_null(dst);
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)len;
    zs.next_out = dst;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *out_len = cap - zs.avail_out;
    deflateEnd(&zs);
    return dst;
}

static void check_payload(const idx_file *t, int32_t want_ndim, const int64_t *want_dims, int64_t want_len)
{
    int32_t nd = 0;
    int64_t dims[IDX_MAX_DIMS];
    assert_int_equal(idx_shape(t, &nd, dims), QCAL_OK);
    assert_int_equal(nd, want_ndim);
    for (int i = 0; i < nd; i++)
        assert_int_equal(dims[i], want_dims[i]);
    for (int i = nd; i < IDX_MAX_DIMS; i++)
        assert_int_equal(dims[i], 1);
    const uint8_t *p;
    int64_t len;
    assert_int_equal(idx_data(t, &p, &len), QCAL_OK);
    assert_int_equal(len, want_len);
    for (int64_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(i * 7 + 3))
            fail_msg("payload byte %lld is %u, expected %u", (long long)i, p[i], (uint8_t)(i * 7 + 3));
}

static void test_raw_and_gzip_roundtrip(void **state)
{
    (void)state;
    uint8_t raw[4096];
    const uint32_t dims[3] = {3, 5, 7};
    size_t n = make_raw(raw, sizeof raw, 0x803, 3, dims, 105);
    const int64_t want[3] = {3, 5, 7};
    idx_file *t = NULL;
    assert_int_equal(idx_read_memory(raw, n, &t), QCAL_OK);
    check_payload(t, 3, want, 105);
    idx_destroy(&t);
    assert_null(t);
    idx_destroy(&t);   /* NULL handle is fine */
    idx_destroy(NULL);

    size_t gl;
    uint8_t *gz = gzip_buf(raw, n, &gl);
    assert_int_equal(idx_read_memory(gz, gl, &t), QCAL_OK);
    check_payload(t, 3, want, 105);
    assert_int_equal(idx_expect(t, 3, (const int64_t[]){-1, 5, 7}), QCAL_OK);
    assert_int_equal(idx_expect(t, 3, (const int64_t[]){3, 5, 8}), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "[3, 5, 7]"));
    assert_int_equal(idx_expect(t, 1, (const int64_t[]){3}), QCAL_ERR_MISMATCH);
    idx_destroy(&t);
    free(gz);

    /* Labels (1-d) and a zero-length tensor. */
    const uint32_t ld[1] = {11};
    n = make_raw(raw, sizeof raw, 0x801, 1, ld, 11);
    assert_int_equal(idx_read_memory(raw, n, &t), QCAL_OK);
    check_payload(t, 1, (const int64_t[]){11}, 11);
    idx_destroy(&t);
    const uint32_t zd[2] = {0, 28};
    n = make_raw(raw, sizeof raw, 0x802, 2, zd, 0);
    gz = gzip_buf(raw, n, &gl);
    assert_int_equal(idx_read_memory(gz, gl, &t), QCAL_OK);
    check_payload(t, 2, (const int64_t[]){0, 28}, 0);
    idx_destroy(&t);
    free(gz);
}

static void expect_fail(const uint8_t *buf, size_t len, qcal_status want, const char *needle)
{
    idx_file *t = (idx_file *)(uintptr_t)0x1;   /* must stay untouched on failure */
    qcal_status st = idx_read_memory(buf, len, &t);
    if (st != want)
        fail_msg("status %d (%s), expected %d; message: %s", st, qcal_status_str(st), want, qcal_last_error());
    assert_ptr_equal(t, (idx_file *)(uintptr_t)0x1);
    if (needle && !strstr(qcal_last_error(), needle))
        fail_msg("message '%s' lacks '%s'", qcal_last_error(), needle);
}

static void test_malformed_headers(void **state)
{
    (void)state;
    uint8_t raw[256];
    const uint32_t dims[4] = {2, 3, 4, 5};
    /* bad magic: high bytes set, unknown type, ndim 0 and 5, other element types */
    size_t n = make_raw(raw, sizeof raw, 0x01000803, 3, dims, 24);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "0x01000803");
    n = make_raw(raw, sizeof raw, 0x0703, 3, dims, 24);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "0x00000703");
    n = make_raw(raw, sizeof raw, 0x0800, 0, dims, 0);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "0 dimensions");
    n = make_raw(raw, sizeof raw, 0x0805, 4, dims, 0);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "5 dimensions");
    n = make_raw(raw, sizeof raw, 0x0d01, 1, dims, 8);
    expect_fail(raw, n, QCAL_ERR_UNSUPPORTED, "0x0d");
    /* size mismatch: one byte short, one byte extra */
    n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 23);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "need 24 data bytes but 23");
    n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 25);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "need 24 data bytes but 25");
    /* truncated headers */
    n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 24);
    for (size_t cut = 0; cut < 16; cut++)
        expect_fail(raw, cut, QCAL_ERR_FORMAT, NULL);
    /* a dimension above INT32_MAX; a product overflowing 64 bits */
    const uint32_t huge[4] = {0x80000000u, 1, 1, 1};
    n = make_raw(raw, sizeof raw, 0x0801, 1, huge, 0);
    expect_fail(raw, n, QCAL_ERR_FORMAT, "2147483648");
    const uint32_t big[4] = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    n = make_raw(raw, sizeof raw, 0x0804, 4, big, 0);
    expect_fail(raw, n, QCAL_ERR_OVERFLOW, NULL);
    /* arguments */
    idx_file *t = NULL;
    assert_int_equal(idx_read_memory(NULL, 4, &t), QCAL_ERR_INVALID_ARG);
    assert_int_equal(idx_read_memory(raw, n, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(idx_read_memory(NULL, 0, &t), QCAL_ERR_FORMAT);
    assert_null(t);
    assert_int_equal(idx_shape(NULL, NULL, NULL), QCAL_ERR_INVALID_ARG);
    assert_int_equal(idx_data(NULL, NULL, NULL), QCAL_ERR_INVALID_ARG);
}

static void test_gzip_damage(void **state)
{
    (void)state;
    uint8_t raw[4096];
    const uint32_t dims[3] = {4, 16, 16};
    size_t n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 1024);
    size_t gl;
    uint8_t *gz = gzip_buf(raw, n, &gl);
    /* Every truncation of the gzip stream fails cleanly (never OK, never a crash). */
    for (size_t cut = 2; cut < gl; cut++) {
        idx_file *t = NULL;
        qcal_status st = idx_read_memory(gz, cut, &t);
        if (st != QCAL_ERR_FORMAT)
            fail_msg("gzip cut at %zu of %zu: status %d (%s): %s", cut, gl, st, qcal_status_str(st),
                     qcal_last_error());
        assert_null(t);
    }
    expect_fail(gz, gl - 4, QCAL_ERR_FORMAT, "truncated");
    /* Single-bit flips after the 10-byte gzip header: the deflate decoder, the CRC-32 /
     * length trailer or the IDX checks catch them; the only flips that may pass are those
     * that do not change the decoded bytes (padding bits of the last deflate byte). */
    uint8_t *bad = malloc(gl + 8);
    assert_non_null(bad);
    int caught = 0, harmless = 0;
    for (size_t pos = 10; pos < gl; pos++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(bad, gz, gl);
            bad[pos] ^= (uint8_t)(1u << bit);
            idx_file *t = NULL;
            qcal_status st = idx_read_memory(bad, gl, &t);
            if (st == QCAL_OK) {
                check_payload(t, 3, (const int64_t[]){4, 16, 16}, 1024);
                idx_destroy(&t);
                harmless++;
            } else {
                assert_null(t);
                caught++;
            }
        }
    }
    assert_true(harmless <= 7);
    assert_int_equal(caught + harmless, (int)(gl - 10) * 8);
    /* Trailing garbage after the stream. */
    memcpy(bad, gz, gl);
    memcpy(bad + gl, "garbage!", 8);
    expect_fail(bad, gl + 8, QCAL_ERR_FORMAT, "trailing");
    free(bad);
    free(gz);

    /* The stream holds fewer / more bytes than the dimensions say. */
    n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 1000);
    gz = gzip_buf(raw, n, &gl);
    expect_fail(gz, gl, QCAL_ERR_FORMAT, "holds only 1000");
    free(gz);
    n = make_raw(raw, sizeof raw, 0x0803, 3, dims, 1030);
    gz = gzip_buf(raw, n, &gl);
    expect_fail(gz, gl, QCAL_ERR_FORMAT, "more than the 1024");
    free(gz);

    /* A zip-bomb header (2^40 bytes claimed by a tiny stream) is refused before allocating. */
    const uint32_t bomb[3] = {1u << 20, 1u << 10, 1u << 10};
    n = make_raw(raw, sizeof raw, 0x0803, 3, bomb, 0);
    gz = gzip_buf(raw, n, &gl);
    expect_fail(gz, gl, QCAL_ERR_FORMAT, "can hold");
    free(gz);
}

static void test_files(void **state)
{
    (void)state;
    idx_file *t = NULL;
    qcal_status st = idx_read_file("/nonexistent-qcal/train-images-idx3-ubyte.gz", &t);
    assert_int_equal(st, QCAL_ERR_NOT_FOUND);
    assert_non_null(strstr(qcal_last_error(), "dataset-fashion-mnist"));
    assert_null(t);
    assert_int_equal(idx_read_file("/", &t), QCAL_ERR_IO);
    assert_int_equal(idx_read_file(NULL, &t), QCAL_ERR_INVALID_ARG);

    /* A corrupt file: the message names the file. */
    char path[] = "/tmp/qcal_test_idx_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "\x1f\x8b\x08\x00garbage", 11), 11);
    close(fd);
    assert_int_equal(idx_read_file(path, &t), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), path));
    unlink(path);
}

/* Real Fashion-MNIST against tests/data/idx/fmnist_summary.txt. */
static void test_fashion_mnist(void **state)
{
    (void)state;
    if (access(FMNIST_DIR "/t10k-labels-idx1-ubyte.gz", R_OK) != 0) {
        fprintf(stderr, "skipping: " FMNIST_DIR " not installed (apt-get install dataset-fashion-mnist)\n");
        skip();
    }
    const char *data = getenv("QCAL_TEST_DATA");
    assert_non_null(data);
    char sp[4096];
    snprintf(sp, sizeof sp, "%s/idx/fmnist_summary.txt", data);
    FILE *f = fopen(sp, "r");
    assert_non_null(f);
    const char *splits[2] = {"train", "t10k"};
    for (int s = 0; s < 2; s++) {
        char name[64];
        long long n, r, c, first[20], sums[5], total, hist[10];
        assert_int_equal(fscanf(f, "%63s %lld %lld %lld", name, &n, &r, &c), 4);
        assert_string_equal(name, splits[s]);
        assert_int_equal(fscanf(f, "%63s", name), 1);
        for (int i = 0; i < 20; i++)
            assert_int_equal(fscanf(f, "%lld", &first[i]), 1);
        assert_int_equal(fscanf(f, "%63s", name), 1);
        for (int i = 0; i < 5; i++)
            assert_int_equal(fscanf(f, "%lld", &sums[i]), 1);
        assert_int_equal(fscanf(f, "%63s %lld", name, &total), 2);
        assert_int_equal(fscanf(f, "%63s", name), 1);
        for (int i = 0; i < 10; i++)
            assert_int_equal(fscanf(f, "%lld", &hist[i]), 1);

        char path[4096];
        idx_file *img = NULL, *lab = NULL;
        snprintf(path, sizeof path, FMNIST_DIR "/%s-images-idx3-ubyte.gz", splits[s]);
        assert_int_equal(idx_read_file(path, &img), QCAL_OK);
        snprintf(path, sizeof path, FMNIST_DIR "/%s-labels-idx1-ubyte.gz", splits[s]);
        assert_int_equal(idx_read_file(path, &lab), QCAL_OK);
        assert_int_equal(idx_expect(img, 3, (const int64_t[]){n, r, c}), QCAL_OK);
        assert_int_equal(idx_expect(lab, 1, (const int64_t[]){n}), QCAL_OK);
        const uint8_t *pi, *pl;
        int64_t li, ll;
        assert_int_equal(idx_data(img, &pi, &li), QCAL_OK);
        assert_int_equal(idx_data(lab, &pl, &ll), QCAL_OK);
        assert_int_equal(li, n * r * c);
        assert_int_equal(ll, n);
        for (int i = 0; i < 20; i++)
            if (pl[i] != first[i])
                fail_msg("%s label %d is %u, Python read %lld", splits[s], i, pl[i], first[i]);
        long long tot = 0, h[10] = {0};
        for (int64_t i = 0; i < li; i++)
            tot += pi[i];
        for (int i = 0; i < 5; i++) {
            long long sum = 0;
            for (int64_t k = 0; k < r * c; k++)
                sum += pi[i * r * c + k];
            if (sum != sums[i])
                fail_msg("%s image %d pixel sum %lld, Python %lld", splits[s], i, sum, sums[i]);
        }
        assert_int_equal(tot, total);
        for (int64_t i = 0; i < ll; i++)
            h[pl[i] < 10 ? pl[i] : 0]++;
        for (int k = 0; k < 10; k++)
            assert_int_equal(h[k], hist[k]);
        idx_destroy(&img);
        idx_destroy(&lab);
    }
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raw_and_gzip_roundtrip),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_gzip_damage),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_fashion_mnist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
