/* .npy reader and writer (NumPy format versions 1.0, 2.0, 3.0). See include/qcal/npy.h.
 *
 * Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for 2.0/3.0),
 * header (a Python dict literal, padded with spaces, ending in '\n'), then the raw data. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/atomic_file.h"
#include "core/internal.h"
#include "qcal/npy.h"
#include "io/half_dsp.h"
#include "io/npy_internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "qcal's .npy reader assumes a little-endian host"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* numpy itself refuses headers above 10000 bytes unless told otherwise; we allow more but
 * bound the allocation. */
#define NPY_MAX_HEADER (1u << 20)
#define NPY_ALIGN 64

static const struct {
    const char *name;
    char kind;
    int size;
} dtype_info[QCAL_NPY_DTYPE_COUNT] = {
    [QCAL_NPY_F32] = { "float32", 'f', 4 }, [QCAL_NPY_F64] = { "float64", 'f', 8 },
    [QCAL_NPY_F16] = { "float16", 'f', 2 }, [QCAL_NPY_U8] = { "uint8", 'u', 1 },
    [QCAL_NPY_I8] = { "int8", 'i', 1 },     [QCAL_NPY_I32] = { "int32", 'i', 4 },
    [QCAL_NPY_I64] = { "int64", 'i', 8 },   [QCAL_NPY_BOOL] = { "bool", 'b', 1 },
};

size_t qcal_npy_dtype_size(qcal_npy_dtype dtype)
{
    return (unsigned)dtype < QCAL_NPY_DTYPE_COUNT ? (size_t)dtype_info[dtype].size : 0;
}

const char *qcal_npy_dtype_name(qcal_npy_dtype dtype)
{
    return (unsigned)dtype < QCAL_NPY_DTYPE_COUNT ? dtype_info[dtype].name : "unknown";
}

/* ---- header parsing ---- */

typedef struct npy_header {
    qcal_npy_dtype dtype;
    bool fortran;
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    size_t data_offset;   /* bytes before the data */
} npy_header;

typedef struct hparser {
    const char *p, *end;
    const char *name;     /* file name for messages */
} hparser;

static void skip_ws(hparser *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

static bool expect(hparser *h, char c)
{
    skip_ws(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

static qcal_status bad_header(const hparser *h, const char *what)
{
    return qcal_error(QCAL_ERR_FORMAT, "'%s': header is not a valid .npy dict literal: %s",
                      h->name, what);
}

/* A quoted string without escapes (all that numpy writes for these keys and values). */
static qcal_status parse_str(hparser *h, char *out, size_t cap)
{
    skip_ws(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return bad_header(h, "expected a quoted string");
    char q = *h->p++;
    size_t n = 0;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\' || *h->p == '\n')
            return bad_header(h, "escape or newline inside a string");
        if (n + 1 >= cap)
            return bad_header(h, "string too long");
        out[n++] = *h->p++;
    }
    if (h->p >= h->end)
        return bad_header(h, "unterminated string");
    h->p++;
    out[n] = '\0';
    return QCAL_OK;
}

static qcal_status parse_descr(hparser *h, qcal_npy_dtype *dtype)
{
    skip_ws(h);
    if (h->p < h->end && *h->p == '[')
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "'%s': structured dtypes are not supported (expected float32, "
                          "float64, float16, uint8, int8, int32, int64 or bool)", h->name);
    char d[64];
    qcal_status st = parse_str(h, d, sizeof d);
    if (st != QCAL_OK)
        return st;
    char order = d[0];
    const char *t = d;
    if (order == '<' || order == '>' || order == '|' || order == '=')
        t++;
    else
        order = '=';
    for (int k = 0; k < QCAL_NPY_DTYPE_COUNT; k++) {
        char want[8];
        snprintf(want, sizeof want, "%c%d", dtype_info[k].kind, dtype_info[k].size);
        if (strcmp(t, want) != 0)
            continue;
        if (order == '>' && dtype_info[k].size > 1)
            return qcal_error(QCAL_ERR_UNSUPPORTED,
                              "'%s': big-endian data ('%s') is not supported; convert with "
                              "numpy's astype('<%s')", h->name, d, t);
        if (order == '|' && dtype_info[k].size > 1)
            return qcal_error(QCAL_ERR_FORMAT, "'%s': descr '%s' has no byte order", h->name, d);
        *dtype = (qcal_npy_dtype)k;
        return QCAL_OK;
    }
    return qcal_error(QCAL_ERR_UNSUPPORTED,
                      "'%s': dtype '%s' is not supported (expected float32, float64, float16, "
                      "uint8, int8, int32, int64 or bool)", h->name, d);
}

static qcal_status parse_bool(hparser *h, bool *out)
{
    skip_ws(h);
    size_t left = (size_t)(h->end - h->p);
    if (left >= 4 && !memcmp(h->p, "True", 4)) {
        h->p += 4;
        *out = true;
    } else if (left >= 5 && !memcmp(h->p, "False", 5)) {
        h->p += 5;
        *out = false;
    } else {
        return bad_header(h, "'fortran_order' is not True or False");
    }
    return QCAL_OK;
}

static qcal_status parse_shape(hparser *h, npy_header *hd)
{
    if (!expect(h, '('))
        return bad_header(h, "'shape' is not a tuple");
    int32_t n = 0;
    bool comma = false;
    for (;;) {
        skip_ws(h);
        if (h->p < h->end && *h->p == ')') {
            h->p++;
            break;
        }
        bool neg = false;
        if (h->p < h->end && *h->p == '-') {
            neg = true;
            h->p++;
        }
        if (h->p >= h->end || *h->p < '0' || *h->p > '9')
            return bad_header(h, "'shape' holds something other than integers");
        int64_t v = 0;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') {
            if (!qcal_mul_i64(v, 10, &v) || !qcal_add_i64(v, *h->p - '0', &v))
                return qcal_error(QCAL_ERR_OVERFLOW, "'%s': a dimension of 'shape' does not "
                                  "fit in 64 bits", h->name);
            h->p++;
        }
        if (h->p < h->end && *h->p == 'L') /* Python 2 long literal */
            h->p++;
        if (neg && v != 0)
            return qcal_error(QCAL_ERR_FORMAT, "'%s': shape has a negative dimension -%" PRId64,
                              h->name, v);
        if (n >= QCAL_MAX_DIMS)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': more than %d dimensions",
                              h->name, QCAL_MAX_DIMS);
        hd->shape[n++] = v;
        comma = expect(h, ',');
        if (!comma) {
            if (!expect(h, ')'))
                return bad_header(h, "'shape' tuple is not closed");
            break;
        }
    }
    if (n == 1 && !comma)
        return bad_header(h, "'shape' is a parenthesised integer, not a tuple");
    hd->ndim = n;
    return QCAL_OK;
}

static qcal_status parse_dict(hparser *h, npy_header *hd)
{
    bool have_descr = false, have_fortran = false, have_shape = false;
    qcal_status st;
    if (!expect(h, '{'))
        return bad_header(h, "does not start with '{'");
    for (;;) {
        skip_ws(h);
        if (h->p < h->end && *h->p == '}') {
            h->p++;
            break;
        }
        char key[32];
        if ((st = parse_str(h, key, sizeof key)) != QCAL_OK)
            return st;
        if (!expect(h, ':'))
            return bad_header(h, "expected ':' after a key");
        bool *seen;
        if (!strcmp(key, "descr")) {
            seen = &have_descr;
            st = parse_descr(h, &hd->dtype);
        } else if (!strcmp(key, "fortran_order")) {
            seen = &have_fortran;
            st = parse_bool(h, &hd->fortran);
        } else if (!strcmp(key, "shape")) {
            seen = &have_shape;
            st = parse_shape(h, hd);
        } else {
            return qcal_error(QCAL_ERR_FORMAT, "'%s': header has an unexpected key '%s'",
                              h->name, key);
        }
        if (*seen)
            return qcal_error(QCAL_ERR_FORMAT, "'%s': header repeats the key '%s'", h->name, key);
        if (st != QCAL_OK)
            return st;
        *seen = true;
        if (!expect(h, ',')) {
            if (!expect(h, '}'))
                return bad_header(h, "expected ',' or '}'");
            break;
        }
    }
    skip_ws(h);
    if (h->p != h->end)
        return bad_header(h, "characters after the closing '}'");
    if (!have_descr || !have_fortran || !have_shape)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': header has no '%s' key", h->name,
                          !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return QCAL_OK;
}

/* Checks magic and version in buf[0..len) and reads the header length: *prefix gets the
 * bytes before the header (10 or 12), *hlen the header's length. */
static qcal_status parse_prefix(const uint8_t *buf, size_t len, const char *name, size_t *prefix,
                                size_t *hlen)
{
    if (len == 0)
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is empty (0 bytes): not a .npy file", name);
    if (len < NPY_MAGIC_LEN && memcmp(buf, NPY_MAGIC, len) == 0)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated .npy magic string (%zu bytes)",
                          name, len);
    if (len < NPY_MAGIC_LEN || memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': not a .npy file (bad magic string)", name);
    if (len < 8)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated header (%zu bytes)", name, len);
    unsigned major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': .npy format version %u.%u is not "
                          "supported (expected 1.0, 2.0 or 3.0)", name, major, minor);
    *prefix = major == 1 ? 10 : 12;
    if (len < *prefix)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated header (%zu bytes)", name, len);
    *hlen = major == 1 ? (size_t)buf[8] | (size_t)buf[9] << 8
                       : (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 |
                             (size_t)buf[11] << 24;
    if (*hlen > NPY_MAX_HEADER)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': header of %zu bytes exceeds the %u-byte "
                          "limit", name, *hlen, NPY_MAX_HEADER);
    return QCAL_OK;
}

/* Parses the prefix and header in buf[0..len) (the whole file or at least the header). */
static qcal_status parse_header(const uint8_t *buf, size_t len, const char *name, npy_header *hd)
{
    memset(hd, 0, sizeof *hd);
    size_t prefix = 0, hlen = 0;
    qcal_status st = parse_prefix(buf, len, name, &prefix, &hlen);
    if (st != QCAL_OK)
        return st;
    if (len - prefix < hlen)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated header (%zu of %zu bytes)", name,
                          len - prefix, hlen);
    hparser h = { (const char *)buf + prefix, (const char *)buf + prefix + hlen, name };
    st = parse_dict(&h, hd);
    if (st != QCAL_OK)
        return st;
    /* Fortran order only changes the layout of arrays with two or more dimensions. */
    if (hd->fortran && hd->ndim > 1)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': Fortran-order arrays are not supported; "
                          "save with numpy.ascontiguousarray", name);
    int64_t numel = 1, nbytes;
    for (int32_t i = 0; i < hd->ndim; i++)
        if (!qcal_mul_i64(numel, hd->shape[i], &numel))
            return qcal_error(QCAL_ERR_OVERFLOW, "'%s': the product of the shape overflows", name);
    if (!qcal_mul_i64(numel, dtype_info[hd->dtype].size, &nbytes) || (uint64_t)nbytes > SIZE_MAX)
        return qcal_error(QCAL_ERR_OVERFLOW, "'%s': %" PRId64 " elements of %s overflow the "
                          "addressable size", name, numel, dtype_info[hd->dtype].name);
    hd->numel = numel;
    hd->nbytes = (size_t)nbytes;
    hd->data_offset = prefix + hlen;
    return QCAL_OK;
}

static qcal_status check_data_size(const npy_header *hd, uint64_t have, const char *name)
{
    if (have < hd->nbytes)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated data: %" PRIu64 " bytes, but %"
                          PRId64 " %s elements need %zu", name, have, hd->numel,
                          dtype_info[hd->dtype].name, hd->nbytes);
    if (have > hd->nbytes)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': %" PRIu64 " trailing bytes after the %zu "
                          "data bytes (shape and file size disagree)", name,
                          have - hd->nbytes, hd->nbytes);
    return QCAL_OK;
}

/* 64-byte aligned buffer for nbytes (NULL when nbytes == 0; *ok false on failure).
 * Large buffers are 2 MiB aligned and advised as transparent huge pages (as numpy does):
 * faulting in fresh 4 KiB pages dominated a large read (docs/performance.md). */
#define NPY_HUGE_MIN (4u << 20)
#define NPY_HUGE_ALIGN (2u << 20)
static void *alloc_data(size_t nbytes, bool *ok)
{
    *ok = true;
    if (nbytes == 0)
        return NULL;
    size_t align = nbytes >= NPY_HUGE_MIN ? NPY_HUGE_ALIGN : NPY_ALIGN;
    size_t rounded = (nbytes + align - 1) / align * align;
    if (rounded < nbytes) {
        *ok = false;
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes", nbytes);
        return NULL;
    }
    void *p = aligned_alloc(align, rounded);
    if (!p) {
        *ok = false;
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes for the array data", nbytes);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (align == NPY_HUGE_ALIGN)
        (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint; failure is harmless */
#endif
    return p;
}

static void fill_array(qcal_npy_array *out, const npy_header *hd, void *data)
{
    memset(out, 0, sizeof *out);
    out->dtype = hd->dtype;
    out->ndim = hd->ndim;
    for (int32_t i = 0; i < hd->ndim; i++)
        out->shape[i] = hd->shape[i];
    out->numel = hd->numel;
    out->data = data;
    out->nbytes = hd->nbytes;
}

qcal_status qcal_npy_parse(const void *buf, size_t len, qcal_npy_array *out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy buffer or output is NULL");
    const char *name = "<memory>";
    npy_header hd;
    qcal_status st = parse_header(buf, len, name, &hd);
    if (st != QCAL_OK)
        return st;
    if ((st = check_data_size(&hd, len - hd.data_offset, name)) != QCAL_OK)
        return st;
    bool ok;
    void *data = alloc_data(hd.nbytes, &ok);
    if (!ok)
        return QCAL_ERR_NO_MEMORY;
    if (hd.nbytes)
        memcpy(data, (const uint8_t *)buf + hd.data_offset, hd.nbytes);
    fill_array(out, &hd, data);
    return QCAL_OK;
}

/* Reads n bytes at offset off of fd (pread, retried on EINTR and short reads); false on
 * an error (errno set) or at the end of the file (errno 0). */
static bool pread_full(int fd, void *dst, size_t n, uint64_t off)
{
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0;
            return false;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return true;
}

/* Opens path and checks its prefix, header and data size against the file's size (the
 * checks and messages of every reader). *fd_out gets the open descriptor. */
static qcal_status open_npy(const char *path, int *fd_out, npy_header *hd)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot open '%s': %s", path, strerror(errno));
    qcal_status st;
    uint8_t *head = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = qcal_error(QCAL_ERR_IO, "'%s' is not a regular file", path);
        goto fail;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    /* Prefix first (to learn the header length), then the whole header. */
    uint8_t prefix[12];
    size_t plen = fsize < sizeof prefix ? (size_t)fsize : sizeof prefix;
    size_t pre = 0, hlen = 0;
    if (!pread_full(fd, prefix, plen, 0)) {
        st = qcal_error(QCAL_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        goto fail;
    }
    if ((st = parse_prefix(prefix, plen, path, &pre, &hlen)) != QCAL_OK)
        goto fail;
    size_t avail = fsize < pre + hlen ? (size_t)fsize : pre + hlen;
    head = qcal_malloc(avail);
    if (!head) {
        st = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    if (!pread_full(fd, head, avail, 0)) {
        st = qcal_error(QCAL_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        goto fail;
    }
    if ((st = parse_header(head, avail, path, hd)) != QCAL_OK)
        goto fail;
    if ((st = check_data_size(hd, fsize - hd->data_offset, path)) != QCAL_OK)
        goto fail;
    free(head);
#ifdef POSIX_FADV_SEQUENTIAL
    (void)posix_fadvise(fd, (off_t)hd->data_offset, 0, POSIX_FADV_SEQUENTIAL);   /* a hint */
#endif
    *fd_out = fd;
    return QCAL_OK;
fail:
    free(head);
    close(fd);
    return st;
}

qcal_status qcal_npy_header_size(const void *buf, size_t len, const char *name, size_t *need)
{
    size_t prefix = 0, hlen = 0;
    qcal_status st = parse_prefix(buf, len, name, &prefix, &hlen);
    if (st == QCAL_OK)
        *need = prefix + hlen;
    return st;
}

qcal_status qcal_npy_header_parse(const void *buf, size_t len, uint64_t total, const char *name,
                                  qcal_npy_array *info, uint64_t *data_offset)
{
    npy_header hd;
    qcal_status st = parse_header(buf, len, name, &hd);
    if (st != QCAL_OK)
        return st;
    if (total < hd.data_offset)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated header (%" PRIu64 " bytes)", name,
                          total);
    if ((st = check_data_size(&hd, total - hd.data_offset, name)) != QCAL_OK)
        return st;
    fill_array(info, &hd, NULL);
    *data_offset = hd.data_offset;
    return QCAL_OK;
}

qcal_status qcal_npy_file_header(const char *path, qcal_npy_array *info, uint64_t *data_offset)
{
    int fd;
    npy_header hd;
    qcal_status st = open_npy(path, &fd, &hd);
    if (st != QCAL_OK)
        return st;
    close(fd);
    fill_array(info, &hd, NULL);
    *data_offset = hd.data_offset;
    return QCAL_OK;
}

/* The message of a data read that failed (errno set) or met the end of the file early. */
static qcal_status data_read_error(const char *path)
{
    int err = errno;
    return qcal_error(QCAL_ERR_IO, "cannot read the data of '%s'%s%s", path,
                      err ? ": " : " (file shrank while reading)", err ? strerror(err) : "");
}

qcal_status qcal_npy_read(const char *path, qcal_npy_array *out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy path or output is NULL");
    int fd;
    npy_header hd;
    qcal_status st = open_npy(path, &fd, &hd);
    if (st != QCAL_OK)
        return st;
    /* The data in one read into an aligned buffer. */
    bool ok;
    void *data = alloc_data(hd.nbytes, &ok);
    if (!ok) {
        close(fd);
        return QCAL_ERR_NO_MEMORY;
    }
    if (hd.nbytes && !pread_full(fd, data, hd.nbytes, hd.data_offset)) {
        st = data_read_error(path);
        free(data);
        close(fd);
        return st;
    }
    close(fd);
    fill_array(out, &hd, data);
    return QCAL_OK;
}

qcal_status qcal_npy_to_f32(qcal_npy_array *arr)
{
    if (!arr)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy array is NULL");
    if (arr->dtype == QCAL_NPY_F32)
        return QCAL_OK;
    if (arr->dtype != QCAL_NPY_F64 && arr->dtype != QCAL_NPY_F16)
        return qcal_error(QCAL_ERR_MISMATCH, "array holds %s data, expected a floating-point "
                          "array (float32, float64 or float16)", qcal_npy_dtype_name(arr->dtype));
    size_t nbytes;
    if (!qcal_mul_size((size_t)arr->numel, sizeof(float), &nbytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "array of %" PRId64 " elements is too large",
                          arr->numel);
    bool ok;
    float *dst = alloc_data(nbytes, &ok);
    if (!ok)
        return QCAL_ERR_NO_MEMORY;
    if (arr->dtype == QCAL_NPY_F64) {
        const double *src = arr->data;
        /* Round to nearest even (the C conversion under the default rounding mode). */
        for (int64_t i = 0; i < arr->numel; i++)
            dst[i] = (float)src[i];
    } else {
        qcal_half_dsp_get()->f16_to_f32(arr->data, (size_t)arr->numel, dst);
    }
    free(arr->data);
    arr->data = dst;
    arr->dtype = QCAL_NPY_F32;
    arr->nbytes = nbytes;
    return QCAL_OK;
}

qcal_status qcal_npy_read_f32(const char *path, qcal_npy_array *out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy path or output is NULL");
    qcal_npy_array a;
    qcal_status st = qcal_npy_read(path, &a);
    if (st != QCAL_OK)
        return st;
    if (a.dtype != QCAL_NPY_F32 && (st = qcal_npy_to_f32(&a)) != QCAL_OK) {
        if (st == QCAL_ERR_MISMATCH)
            st = qcal_error(QCAL_ERR_MISMATCH, "'%s' holds %s data, expected float32, float64 "
                            "or float16", path, qcal_npy_dtype_name(a.dtype));
        qcal_npy_array_free(&a);
        return st;
    }
    *out = a;
    return QCAL_OK;
}

/* ---- streaming reader ---- */

struct qcal_npy_reader {
    int fd;
    char *path;
    npy_header hd;
    int64_t done;       /* elements read so far */
    void *scratch;      /* raw float64/float16 elements before conversion */
    size_t scratch_bytes;
};

#define NPY_SCRATCH_BYTES ((size_t)256 << 10)

qcal_status qcal_npy_reader_open(const char *path, qcal_npy_reader **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy path or reader output is NULL");
    qcal_npy_reader *r = qcal_calloc(1, sizeof *r);
    if (!r)
        return QCAL_ERR_NO_MEMORY;
    r->fd = -1;
    r->path = qcal_strdup(path);
    if (!r->path) {
        qcal_npy_reader_close(&r);
        return QCAL_ERR_NO_MEMORY;
    }
    qcal_status st = open_npy(path, &r->fd, &r->hd);
    if (st != QCAL_OK) {
        qcal_npy_reader_close(&r);
        return st;
    }
    *out = r;
    return QCAL_OK;
}

qcal_status qcal_npy_reader_info(const qcal_npy_reader *r, qcal_npy_array *info)
{
    if (!r || !info)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy reader or output is NULL");
    fill_array(info, &r->hd, NULL);
    return QCAL_OK;
}

qcal_status qcal_npy_reader_read_f32(qcal_npy_reader *r, float *dst, int64_t cap, int64_t *n)
{
    if (!r || !n || cap < 1 || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy reader, destination or count invalid");
    qcal_npy_dtype dt = r->hd.dtype;
    if (dt != QCAL_NPY_F32 && dt != QCAL_NPY_F64 && dt != QCAL_NPY_F16)
        return qcal_error(QCAL_ERR_MISMATCH, "'%s' holds %s data, expected float32, float64 "
                          "or float16", r->path, qcal_npy_dtype_name(dt));
    int64_t left = r->hd.numel - r->done;
    int64_t want = cap < left ? cap : left;
    size_t es = (size_t)dtype_info[dt].size;
    if (dt == QCAL_NPY_F32) {
        /* float32 little-endian: straight into dst, no conversion. */
        if (want > 0 && !pread_full(r->fd, dst, (size_t)want * es,
                                    r->hd.data_offset + (uint64_t)r->done * es))
            return data_read_error(r->path);
    } else {
        if (!r->scratch && want > 0) {
            r->scratch_bytes = NPY_SCRATCH_BYTES;
            if (!(r->scratch = qcal_malloc(r->scratch_bytes)))
                return QCAL_ERR_NO_MEMORY;
        }
        int64_t per = (int64_t)(r->scratch_bytes / es);
        for (int64_t k = 0; k < want; k += per) {
            int64_t m = want - k < per ? want - k : per;
            if (!pread_full(r->fd, r->scratch, (size_t)m * es,
                            r->hd.data_offset + (uint64_t)(r->done + k) * es))
                return data_read_error(r->path);
            /* The conversions of qcal_npy_to_f32. */
            if (dt == QCAL_NPY_F64) {
                const double *src = r->scratch;
                for (int64_t i = 0; i < m; i++)
                    dst[k + i] = (float)src[i];
            } else {
                qcal_half_dsp_get()->f16_to_f32(r->scratch, (size_t)m, dst + k);
            }
        }
    }
    r->done += want;
    *n = want;
    return QCAL_OK;
}

void qcal_npy_reader_close(qcal_npy_reader **r)
{
    if (!r || !*r)
        return;
    if ((*r)->fd >= 0)
        close((*r)->fd);
    free((*r)->scratch);
    free((*r)->path);
    free(*r);
    *r = NULL;
}

qcal_status qcal_npy_as_tensor(const qcal_npy_array *arr, qcal_tensor *t)
{
    if (!arr || !t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy array or tensor is NULL");
    if (arr->dtype != QCAL_NPY_F32)
        return qcal_error(QCAL_ERR_MISMATCH, "array holds %s data, a tensor needs float32",
                          qcal_npy_dtype_name(arr->dtype));
    return qcal_tensor_init(t, arr->data, arr->ndim, arr->shape);
}

void qcal_npy_array_free(qcal_npy_array *arr)
{
    if (!arr)
        return;
    free(arr->data);
    memset(arr, 0, sizeof *arr);
}

/* ---- writer ---- */

/* The header numpy 1.24 writes for a C-order array: same bytes, same padding. */
static size_t format_header(char *buf, size_t cap, qcal_npy_dtype dtype, int32_t ndim,
                            const int64_t *shape)
{
    char descr[8];
    snprintf(descr, sizeof descr, "%c%c%d", dtype_info[dtype].size == 1 ? '|' : '<',
             dtype_info[dtype].kind, dtype_info[dtype].size);
    char sh[QCAL_MAX_DIMS * 24 + 8];
    size_t n = 0;
    sh[n++] = '(';
    for (int32_t i = 0; i < ndim; i++)
        n += (size_t)snprintf(sh + n, sizeof sh - n, i ? ", %" PRId64 : "%" PRId64, shape[i]);
    if (ndim == 1)
        sh[n++] = ',';
    sh[n++] = ')';
    sh[n] = '\0';
    /* Header dict, then numpy's spare room for growing axis 0 (21 digits minus its own). */
    int hl = snprintf(buf + 10, cap - 10, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      descr, sh);
    size_t len = (size_t)hl;
    if (ndim > 0) {
        char first[24];
        int digits = snprintf(first, sizeof first, "%" PRId64, shape[0]);
        for (int i = digits; i < 21; i++)
            buf[10 + len++] = ' ';
    }
    size_t hlen = len + 1;
    size_t padlen = NPY_ALIGN - ((NPY_MAGIC_LEN + 2 + 2 + hlen) % NPY_ALIGN);
    memset(buf + 10 + len, ' ', padlen);
    len += padlen;
    buf[10 + len++] = '\n';
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(len & 0xff);
    buf[9] = (char)(len >> 8);
    return 10 + len;
}

/* Checks the arguments of a write and gives the header (*hsize bytes) and data size. */
static qcal_status npy_prepare(const char *path, qcal_npy_dtype dtype, int32_t ndim,
                               const int64_t *shape, const void *data, char header[512],
                               size_t *hsize, int64_t *nbytes_out)
{
    if ((unsigned)dtype >= QCAL_NPY_DTYPE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': invalid dtype %d", path, (int)dtype);
    if (ndim < 0 || ndim > QCAL_MAX_DIMS || (ndim > 0 && !shape))
        return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': ndim %d is outside [0, %d]", path,
                          (int)ndim, QCAL_MAX_DIMS);
    int64_t numel = 1, nbytes;
    for (int32_t i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': dimension %d is negative (%" PRId64
                              ")", path, (int)i, shape[i]);
        if (!qcal_mul_i64(numel, shape[i], &numel))
            return qcal_error(QCAL_ERR_OVERFLOW, "'%s': the product of the shape overflows", path);
    }
    if (!qcal_mul_i64(numel, dtype_info[dtype].size, &nbytes) || (uint64_t)nbytes > SIZE_MAX)
        return qcal_error(QCAL_ERR_OVERFLOW, "'%s': %" PRId64 " elements overflow", path, numel);
    if (nbytes > 0 && !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': data is NULL for %" PRId64 " elements",
                          path, numel);
    *hsize = format_header(header, 512, dtype, ndim, shape);
    *nbytes_out = nbytes;
    return QCAL_OK;
}

qcal_status qcal_npy_fwrite(FILE *fp, const char *name, qcal_npy_dtype dtype, int32_t ndim,
                            const int64_t *shape, const void *data)
{
    if (!fp)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy output stream is NULL");
    if (!name)
        name = "<stream>";
    char header[512];
    size_t hsize = 0;
    int64_t nbytes = 0;
    qcal_status st = npy_prepare(name, dtype, ndim, shape, data, header, &hsize, &nbytes);
    if (st != QCAL_OK)
        return st;
    if (fwrite(header, 1, hsize, fp) != hsize ||
        (nbytes > 0 && fwrite(data, 1, (size_t)nbytes, fp) != (size_t)nbytes))
        return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", name, strerror(errno));
    return QCAL_OK;
}

qcal_status qcal_npy_write(const char *path, qcal_npy_dtype dtype, int32_t ndim,
                           const int64_t *shape, const void *data)
{
    if (!path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npy output path is NULL");
    char header[512];
    size_t hsize = 0;
    int64_t nbytes = 0;
    qcal_status st = npy_prepare(path, dtype, ndim, shape, data, header, &hsize, &nbytes);
    if (st != QCAL_OK)
        return st;
    qcal_atomic_file f;
    st = qcal_atomic_file_open(&f, path);
    if (st != QCAL_OK)
        return st;
    if ((st = qcal_npy_fwrite(f.fp, path, dtype, ndim, shape, data)) != QCAL_OK) {
        qcal_atomic_file_abort(&f);
        return st;
    }
    return qcal_atomic_file_commit(&f);
}
