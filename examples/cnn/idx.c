/* IDX reader (MNIST / Fashion-MNIST), gzip through zlib's inflate on an in-memory copy of
 * the file. The header is inflated first, so the payload is allocated once at its exact
 * size, and a header that claims more bytes than the compressed input could possibly
 * hold (deflate expands at most ~1032:1) is rejected before any large allocation. */
#define _POSIX_C_SOURCE 200809L   /* POSIX calls (mkdir, fileno, clock_gettime) under -std=c11 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "ex_util.h"
#include "idx.h"

struct idx_file {
    int32_t ndim;
    int64_t dims[IDX_MAX_DIMS];
    int64_t len;       /* product of dims */
    uint8_t *data;     /* len bytes (at least 1 allocated) */
};

/* deflate's worst-case expansion is 1032:1 (258-byte matches coded in 2 bits); the slack
 * covers the gzip header and trailer of tiny streams. */
#define IDX_MAX_INFLATE_RATIO 1032
#define IDX_INFLATE_SLACK 4096

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Parses the header in hdr (hlen bytes available). On success fills ndim/dims/len and
 * *header_bytes. */
static qcal_status parse_header(const uint8_t *hdr, size_t hlen, idx_file *t, size_t *header_bytes)
{
    if (hlen < 4)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: data is %zu bytes, shorter than the 4-byte magic", hlen);
    uint32_t magic = be32(hdr);
    if ((magic >> 16) != 0)
        return qcal_set_error(QCAL_ERR_FORMAT,
                              "IDX: bad magic 0x%08x (expected 0x00000803 for images or 0x00000801 for labels)",
                              magic);
    uint32_t type = (magic >> 8) & 0xff, ndim = magic & 0xff;
    if (type == 0x09 || type == 0x0b || type == 0x0c || type == 0x0d || type == 0x0e)
        return qcal_set_error(QCAL_ERR_UNSUPPORTED,
                              "IDX: element type 0x%02x (magic 0x%08x) is not supported; only unsigned "
                              "bytes (0x08) are", type, magic);
    if (type != 0x08)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: bad magic 0x%08x: unknown element type 0x%02x", magic, type);
    if (ndim < 1 || ndim > IDX_MAX_DIMS)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: magic 0x%08x declares %u dimensions (supported: 1..%d)",
                              magic, ndim, IDX_MAX_DIMS);
    size_t need = 4 + 4 * (size_t)ndim;
    if (hlen < need)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: truncated header: %zu bytes, %zu needed for %u dimensions",
                              hlen, need, ndim);
    int64_t len = 1;
    for (uint32_t i = 0; i < IDX_MAX_DIMS; i++)
        t->dims[i] = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        uint32_t d = be32(hdr + 4 + 4 * i);
        if (d > INT32_MAX)
            return qcal_set_error(QCAL_ERR_FORMAT, "IDX: dimension %u is %u, larger than %d", i, d, INT32_MAX);
        t->dims[i] = d;
        if (__builtin_mul_overflow(len, (int64_t)d, &len))
            return qcal_set_error(QCAL_ERR_OVERFLOW, "IDX: the product of the dimensions overflows 64 bits");
    }
    if ((uint64_t)len > SIZE_MAX / 2)
        return qcal_set_error(QCAL_ERR_OVERFLOW, "IDX: payload of %lld bytes does not fit in memory",
                              (long long)len);
    t->ndim = (int32_t)ndim;
    t->len = len;
    *header_bytes = need;
    return QCAL_OK;
}

static const char *describe_dims(const idx_file *t, char *buf, size_t cap)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int32_t i = 0; i < t->ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
    return buf;
}

static qcal_status read_raw(const uint8_t *src, size_t len, idx_file *t)
{
    size_t hb;
    qcal_status st = parse_header(src, len, t, &hb);
    if (st != QCAL_OK)
        return st;
    char dims[96];
    if ((uint64_t)(len - hb) != (uint64_t)t->len)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: dimensions %s need %lld data bytes but %zu follow the header",
                              describe_dims(t, dims, sizeof dims), (long long)t->len, len - hb);
    t->data = ex_malloc(t->len ? (size_t)t->len : 1);
    if (!t->data)
        return QCAL_ERR_NO_MEMORY;
    memcpy(t->data, src + hb, (size_t)t->len);
    return QCAL_OK;
}

/* One inflate call that fills as much of dst as the input allows; returns zlib's code. */
static int inflate_into(z_stream *zs, uint8_t *dst, size_t cap, size_t *got)
{
    *got = 0;
    int ret = Z_OK;
    while (*got < cap) {
        size_t chunk = cap - *got;
        if (chunk > UINT32_MAX)
            chunk = UINT32_MAX;
        zs->next_out = dst + *got;
        zs->avail_out = (uInt)chunk;
        ret = inflate(zs, Z_NO_FLUSH);
        *got += chunk - zs->avail_out;
        if (ret != Z_OK)
            break;
    }
    return ret;
}

static qcal_status gz_fail(int ret, const z_stream *zs, const char *when)
{
    if (ret == Z_MEM_ERROR)
        return qcal_set_error(QCAL_ERR_NO_MEMORY, "IDX: zlib ran out of memory %s", when);
    if (ret == Z_BUF_ERROR || ret == Z_OK)
        return qcal_set_error(QCAL_ERR_FORMAT, "IDX: gzip stream is truncated (ended %s)", when);
    return qcal_set_error(QCAL_ERR_FORMAT, "IDX: corrupt gzip stream %s: %s", when,
                          zs->msg ? zs->msg : "zlib error");
}

static qcal_status read_gzip(const uint8_t *src, size_t len, idx_file *t)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (len > UINT32_MAX)
        return qcal_set_error(QCAL_ERR_UNSUPPORTED, "IDX: gzip input of %zu bytes is larger than 4 GiB", len);
    if (inflateInit2(&zs, 15 + 16) != Z_OK)
        return qcal_set_error(QCAL_ERR_NO_MEMORY, "IDX: zlib inflateInit2 failed");
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)len;

    qcal_status st = QCAL_OK;
    uint8_t hdr[4 + 4 * IDX_MAX_DIMS];
    size_t got = 0, more = 0, hb = 0;
    /* The magic first (it says how long the header is), then the dimensions. */
    int ret = inflate_into(&zs, hdr, 4, &got);
    if (got == 4 && ret == Z_OK) {
        uint32_t nd = be32(hdr) & 0xff;
        size_t want = nd <= IDX_MAX_DIMS ? 4 * (size_t)nd : 0;
        ret = inflate_into(&zs, hdr + 4, want, &more);
        got += more;
    }
    if (ret != Z_OK && ret != Z_STREAM_END) {
        st = gz_fail(ret, &zs, "inside the IDX header");
        goto done;
    }
    st = parse_header(hdr, got, t, &hb);
    if (st != QCAL_OK)
        goto done;
    uint64_t bound = (uint64_t)len * IDX_MAX_INFLATE_RATIO + IDX_INFLATE_SLACK;
    if ((uint64_t)t->len > bound) {
        char dims[96];
        st = qcal_set_error(QCAL_ERR_FORMAT,
                            "IDX: dimensions %s claim %lld bytes, more than a %zu-byte gzip stream can hold",
                            describe_dims(t, dims, sizeof dims), (long long)t->len, len);
        goto done;
    }
    t->data = ex_malloc(t->len ? (size_t)t->len : 1);
    if (!t->data) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    size_t body = 0;
    if (ret == Z_OK && t->len > 0)
        ret = inflate_into(&zs, t->data, (size_t)t->len, &body);
    if (ret != Z_OK && ret != Z_STREAM_END) {
        st = gz_fail(ret, &zs, "inside the IDX data");
        goto done;
    }
    if ((int64_t)body != t->len) {
        char dims[96];
        st = qcal_set_error(QCAL_ERR_FORMAT, "IDX: dimensions %s need %lld data bytes but the gzip stream "
                            "holds only %zu", describe_dims(t, dims, sizeof dims), (long long)t->len, body);
        goto done;
    }
    if (ret == Z_OK) {
        /* The payload is complete; the stream must end here. */
        uint8_t extra;
        size_t n = 0;
        ret = inflate_into(&zs, &extra, 1, &n);
        if (n > 0) {
            char dims[96];
            st = qcal_set_error(QCAL_ERR_FORMAT, "IDX: the gzip stream holds more than the %lld data bytes "
                                "that dimensions %s need", (long long)t->len, describe_dims(t, dims, sizeof dims));
            goto done;
        }
        if (ret != Z_STREAM_END) {
            st = gz_fail(ret, &zs, "before the gzip trailer");
            goto done;
        }
    }
    if (zs.avail_in != 0)
        st = qcal_set_error(QCAL_ERR_FORMAT, "IDX: %u trailing bytes after the end of the gzip stream",
                            zs.avail_in);
done:
    inflateEnd(&zs);
    return st;
}

qcal_status idx_read_memory(const void *src, size_t len, idx_file **out)
{
    if (!out || (!src && len > 0))
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "idx_read_memory: NULL %s", out ? "src" : "out");
    const uint8_t *p = src;
    idx_file *t = ex_calloc(1, sizeof *t);
    if (!t)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st = (len >= 2 && p[0] == 0x1f && p[1] == 0x8b) ? read_gzip(p, len, t) : read_raw(p, len, t);
    if (st != QCAL_OK) {
        idx_destroy(&t);
        return st;
    }
    *out = t;
    return QCAL_OK;
}

qcal_status idx_read_file(const char *path, idx_file **out)
{
    if (!path || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "idx_read_file: NULL %s", path ? "out" : "path");
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        if (e == ENOENT)
            return qcal_set_error(QCAL_ERR_NOT_FOUND,
                                  "IDX file '%s' not found; Fashion-MNIST is in the Debian package "
                                  "dataset-fashion-mnist (apt-get install dataset-fashion-mnist), which puts "
                                  "it under /usr/share/datasets/fashion-mnist/", path);
        return qcal_set_error(QCAL_ERR_IO, "cannot open IDX file '%s': %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return qcal_set_error(QCAL_ERR_IO, "IDX file '%s' is not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    uint8_t *buf = ex_malloc(size ? size : 1);
    if (!buf) {
        fclose(fp);
        return QCAL_ERR_NO_MEMORY;
    }
    size_t n = fread(buf, 1, size, fp);
    int rerr = ferror(fp);
    fclose(fp);
    if (n != size || rerr) {
        free(buf);
        return qcal_set_error(QCAL_ERR_IO, "cannot read IDX file '%s': read %zu of %zu bytes", path, n, size);
    }
    idx_file *t = NULL;
    qcal_status st = idx_read_memory(buf, size, &t);
    free(buf);
    if (st != QCAL_OK) {
        /* Prefix the file name to the message the parser recorded. */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        return qcal_set_error(st, "%s: %s", path, msg);
    }
    *out = t;
    return QCAL_OK;
}

void idx_destroy(idx_file **idx)
{
    if (!idx || !*idx)
        return;
    free((*idx)->data);
    free(*idx);
    *idx = NULL;
}

qcal_status idx_shape(const idx_file *idx, int32_t *ndim, int64_t dims[IDX_MAX_DIMS])
{
    if (!idx || !ndim || !dims)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "idx_shape: NULL argument");
    *ndim = idx->ndim;
    for (int i = 0; i < IDX_MAX_DIMS; i++)
        dims[i] = idx->dims[i];
    return QCAL_OK;
}

qcal_status idx_data(const idx_file *idx, const uint8_t **data, int64_t *len)
{
    if (!idx || !data || !len)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "idx_data: NULL argument");
    *data = idx->data;
    *len = idx->len;
    return QCAL_OK;
}

qcal_status idx_expect(const idx_file *idx, int32_t expected_ndim, const int64_t *expected_dims)
{
    if (!idx || expected_ndim < 1 || expected_ndim > IDX_MAX_DIMS || !expected_dims)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "idx_expect: NULL handle or expected_ndim %d not in 1..%d",
                              expected_ndim, IDX_MAX_DIMS);
    bool ok = idx->ndim == expected_ndim;
    for (int32_t i = 0; ok && i < expected_ndim; i++)
        if (expected_dims[i] > 0 && expected_dims[i] != idx->dims[i])
            ok = false;
    if (ok)
        return QCAL_OK;
    char have[96], want[96];
    idx_file w = {.ndim = expected_ndim};
    for (int32_t i = 0; i < expected_ndim; i++)
        w.dims[i] = expected_dims[i] > 0 ? expected_dims[i] : -1;
    return qcal_set_error(QCAL_ERR_MISMATCH, "IDX: magic 0x%08x with dimensions %s, expected magic 0x%08x with %s "
                          "(-1 = any)", 0x800u + (unsigned)idx->ndim, describe_dims(idx, have, sizeof have),
                          0x800u + (unsigned)expected_ndim, describe_dims(&w, want, sizeof want));
}
