/* safetensors reader (mmap, validating) and atomic float32 writer. Format and rules: see
 * include/qcal/safetensors.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/atomic_file.h"
#include "core/internal.h"
#include "io/half_dsp.h"
#include "io/json.h"
#include "qcal/safetensors.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20)

struct qcal_safetensors {
    char *path;
    int fd;
    uint8_t *map;          /* whole file, read only */
    size_t map_len;
    int64_t data_start;    /* 8 + header length */
    qcal_json *header;     /* owns the names and dtype strings */
    int64_t n;
    qcal_safetensors_tensor_info *info;    /* n entries, in data-offset order */
    const qcal_json *metadata;   /* __metadata__ object or NULL */
};

/* ---- reader ------------------------------------------------------------------------ */

typedef struct dtype_desc {
    const char *name;
    int size;
    qcal_safetensors_dtype dt;
} dtype_desc;

static const dtype_desc dtypes[] = {
    {"F32", 4, QCAL_SAFETENSORS_F32},     {"F16", 2, QCAL_SAFETENSORS_F16},     {"BF16", 2, QCAL_SAFETENSORS_BF16},
    {"F64", 8, QCAL_SAFETENSORS_F64},     {"BOOL", 1, QCAL_SAFETENSORS_OTHER},  {"U8", 1, QCAL_SAFETENSORS_OTHER},
    {"I8", 1, QCAL_SAFETENSORS_OTHER},    {"I16", 2, QCAL_SAFETENSORS_OTHER},   {"U16", 2, QCAL_SAFETENSORS_OTHER},
    {"I32", 4, QCAL_SAFETENSORS_OTHER},   {"U32", 4, QCAL_SAFETENSORS_OTHER},   {"I64", 8, QCAL_SAFETENSORS_OTHER},
    {"U64", 8, QCAL_SAFETENSORS_OTHER},   {"F8_E4M3", 1, QCAL_SAFETENSORS_OTHER}, {"F8_E5M2", 1, QCAL_SAFETENSORS_OTHER},
};

void qcal_safetensors_close(qcal_safetensors **stp)
{
    if (!stp || !*stp)
        return;
    qcal_safetensors *st = *stp;
    if (st->map)
        munmap(st->map, st->map_len);
    if (st->fd >= 0)
        close(st->fd);
    qcal_json_free(&st->header);
    free(st->info);
    free(st->path);
    free(st);
    *stp = NULL;
}

static int cmp_offset(const void *a, const void *b)
{
    const qcal_safetensors_tensor_info *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    /* zero-size tensors may share an offset: order them by size then name */
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Validates one header entry into *info (offsets relative to the data section). */
static qcal_status parse_entry(const qcal_safetensors *st, const char *name,
                               const qcal_json *v, qcal_safetensors_tensor_info *info)
{
    if (!*name)
        return qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': empty tensor name", st->path);
    if (v->type != QCAL_JSON_OBJECT)
        return qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': entry '%s' is a JSON %s, not an object",
                          st->path, name, qcal_json_type_name(v->type));
    for (size_t k = 0; k < v->n; k++) {
        if (strcmp(v->keys[k], "dtype") && strcmp(v->keys[k], "shape") &&
            strcmp(v->keys[k], "data_offsets"))
            return qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': tensor '%s' has unknown field '%s'",
                              st->path, name, v->keys[k]);
    }
    const qcal_json *dt = qcal_json_get(v, "dtype");
    const qcal_json *shape = qcal_json_get(v, "shape");
    const qcal_json *offs = qcal_json_get(v, "data_offsets");
    if (!dt || dt->type != QCAL_JSON_STRING)
        return qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': tensor '%s' has no string 'dtype'",
                          st->path, name);
    if (!shape || shape->type != QCAL_JSON_ARRAY)
        return qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': tensor '%s' has no array 'shape'",
                          st->path, name);
    if (!offs || offs->type != QCAL_JSON_ARRAY || offs->n != 2)
        return qcal_error(QCAL_ERR_FORMAT,
                          "safetensors '%s': tensor '%s' needs 'data_offsets' [begin, end]",
                          st->path, name);
    const dtype_desc *d = NULL;
    for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
        if (!strcmp(dtypes[k].name, dt->str))
            d = &dtypes[k];
    if (!d)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "safetensors '%s': tensor '%s' has unknown dtype '%s'",
                          st->path, name, dt->str);
    if (shape->n > QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "safetensors '%s': tensor '%s' has %zu dimensions (qcal supports %d)",
                          st->path, name, shape->n, QCAL_MAX_DIMS);
    memset(info, 0, sizeof *info);
    info->name = name;
    info->dtype = d->dt;
    info->dtype_name = d->name;
    info->ndim = (int32_t)shape->n;
    int64_t numel = 1;
    for (size_t k = 0; k < shape->n; k++) {
        const qcal_json *e = &shape->items[k];
        if (e->type != QCAL_JSON_NUMBER || !e->is_int || e->i64 < 0)
            return qcal_error(QCAL_ERR_FORMAT,
                              "safetensors '%s': tensor '%s' shape[%zu] is not a non-negative integer",
                              st->path, name, k);
        info->shape[k] = e->i64;
        if (!qcal_mul_i64(numel, e->i64, &numel))
            return qcal_error(QCAL_ERR_OVERFLOW,
                              "safetensors '%s': tensor '%s' element count overflows int64",
                              st->path, name);
    }
    info->numel = numel;
    int64_t nbytes;
    if (!qcal_mul_i64(numel, d->size, &nbytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "safetensors '%s': tensor '%s' byte size overflows int64",
                          st->path, name);
    for (int k = 0; k < 2; k++) {
        const qcal_json *e = &offs->items[k];
        if (e->type != QCAL_JSON_NUMBER || !e->is_int || e->i64 < 0)
            return qcal_error(QCAL_ERR_FORMAT,
                              "safetensors '%s': tensor '%s' data_offsets[%d] is not a non-negative integer",
                              st->path, name, k);
    }
    int64_t begin = offs->items[0].i64, end = offs->items[1].i64;
    int64_t data_len = (int64_t)st->map_len - st->data_start;
    if (begin > end || end > data_len)
        return qcal_error(QCAL_ERR_FORMAT,
                          "safetensors '%s': tensor '%s' data_offsets [%lld, %lld] outside the data "
                          "section of %lld bytes",
                          st->path, name, (long long)begin, (long long)end, (long long)data_len);
    if (end - begin != nbytes)
        return qcal_error(QCAL_ERR_FORMAT,
                          "safetensors '%s': tensor '%s' spans %lld bytes but %s x %lld elements "
                          "need %lld",
                          st->path, name, (long long)(end - begin), d->name, (long long)numel,
                          (long long)nbytes);
    info->nbytes = nbytes;
    info->offset = begin;
    return QCAL_OK;
}

qcal_status qcal_safetensors_open(const char *path, qcal_safetensors **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_open: NULL argument");
    qcal_status stt;
    qcal_safetensors *st = qcal_calloc(1, sizeof *st);
    if (!st)
        return QCAL_ERR_NO_MEMORY;
    st->fd = -1;
    st->path = strdup(path);
    if (!st->path) {
        stt = qcal_error(QCAL_ERR_NO_MEMORY, "cannot copy path");
        goto fail;
    }
    st->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (st->fd < 0) {
        stt = qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                         "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(st->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        stt = qcal_error(QCAL_ERR_IO, "'%s' is not a regular file", path);
        goto fail;
    }
    if (sb.st_size < 8) {
        stt = qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': file of %lld bytes is shorter than "
                         "the 8-byte header length", path, (long long)sb.st_size);
        goto fail;
    }
    st->map_len = (size_t)sb.st_size;
    st->map = mmap(NULL, st->map_len, PROT_READ, MAP_SHARED, st->fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        stt = qcal_error(QCAL_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
        goto fail;
    }
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--)
        hlen = (hlen << 8) | st->map[k];
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)sb.st_size - 8) {
        stt = qcal_error(QCAL_ERR_FORMAT,
                         "safetensors '%s': header length %llu is larger than %s (%lld bytes "
                         "after the length field)",
                         path, (unsigned long long)hlen,
                         hlen > ST_MAX_HEADER ? "the 100 MiB limit" : "the file",
                         (long long)sb.st_size - 8);
        goto fail;
    }
    st->data_start = 8 + (int64_t)hlen;
    /* The reference writer pads the header with trailing spaces, which JSON allows. */
    qcal_json_limits lim;
    qcal_json_limits_default(&lim);
    lim.max_depth = 4;
    stt = qcal_json_parse((const char *)st->map + 8, (size_t)hlen, &lim, &st->header);
    if (stt != QCAL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        stt = qcal_error(stt, "safetensors '%s': header is not valid JSON: %s", path, msg);
        goto fail;
    }
    if (st->header->type != QCAL_JSON_OBJECT) {
        stt = qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': header is a JSON %s, not an object",
                         path, qcal_json_type_name(st->header->type));
        goto fail;
    }
    const qcal_json *h = st->header;
    st->info = qcal_calloc(h->n ? h->n : 1, sizeof *st->info);
    if (!st->info) {
        stt = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    for (size_t k = 0; k < h->n; k++) {
        if (!strcmp(h->keys[k], "__metadata__")) {
            const qcal_json *m = &h->items[k];
            if (m->type != QCAL_JSON_OBJECT) {
                stt = qcal_error(QCAL_ERR_FORMAT, "safetensors '%s': __metadata__ is not an object",
                                 path);
                goto fail;
            }
            for (size_t j = 0; j < m->n; j++) {
                if (m->items[j].type != QCAL_JSON_STRING) {
                    stt = qcal_error(QCAL_ERR_FORMAT,
                                     "safetensors '%s': __metadata__ value '%s' is not a string",
                                     path, m->keys[j]);
                    goto fail;
                }
            }
            st->metadata = m;
            continue;
        }
        stt = parse_entry(st, h->keys[k], &h->items[k], &st->info[st->n]);
        if (stt != QCAL_OK)
            goto fail;
        st->n++;
    }
    qsort(st->info, (size_t)st->n, sizeof *st->info, cmp_offset);
    int64_t pos = 0;
    for (int64_t i = 0; i < st->n; i++) {
        qcal_safetensors_tensor_info *t = &st->info[i];
        if (t->offset != pos) {
            stt = qcal_error(QCAL_ERR_FORMAT,
                             "safetensors '%s': tensor '%s' starts at data offset %lld but the "
                             "previous tensor ends at %lld (%s)",
                             path, t->name, (long long)t->offset, (long long)pos,
                             t->offset < pos ? "overlapping ranges" : "hole in the data section");
            goto fail;
        }
        pos = t->offset + t->nbytes;
    }
    if (pos != (int64_t)st->map_len - st->data_start) {
        stt = qcal_error(QCAL_ERR_FORMAT,
                         "safetensors '%s': tensors cover %lld bytes of a %lld-byte data section",
                         path, (long long)pos, (long long)st->map_len - st->data_start);
        goto fail;
    }
    for (int64_t i = 0; i < st->n; i++)
        st->info[i].offset += st->data_start;
    madvise(st->map, st->map_len, MADV_SEQUENTIAL);
    *out = st;
    return QCAL_OK;
fail:
    qcal_safetensors_close(&st);
    return stt;
}

qcal_status qcal_safetensors_count(const qcal_safetensors *st, int64_t *n)
{
    if (!st || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_count: NULL argument");
    *n = st->n;
    return QCAL_OK;
}

static qcal_status check_index(const qcal_safetensors *st, int64_t i)
{
    if (!st)
        return qcal_error(QCAL_ERR_INVALID_ARG, "safetensors reader is NULL");
    if (i < 0 || i >= st->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor index %lld out of range [0, %lld)",
                          (long long)i, (long long)st->n);
    return QCAL_OK;
}

qcal_status qcal_safetensors_info(const qcal_safetensors *st, int64_t i, qcal_safetensors_tensor_info *info)
{
    qcal_status s = check_index(st, i);
    if (s != QCAL_OK)
        return s;
    if (!info)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_info: info is NULL");
    *info = st->info[i];
    return QCAL_OK;
}

qcal_status qcal_safetensors_find(const qcal_safetensors *st, const char *name, int64_t *i)
{
    if (!st || !name || !i)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_find: NULL argument");
    for (int64_t k = 0; k < st->n; k++) {
        if (!strcmp(st->info[k].name, name)) {
            *i = k;
            return QCAL_OK;
        }
    }
    return qcal_error(QCAL_ERR_NOT_FOUND, "safetensors '%s' has no tensor '%s'", st->path, name);
}

qcal_status qcal_safetensors_metadata(const qcal_safetensors *st, const char *key,
                                      const char **value)
{
    if (!st || !key || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_metadata: NULL argument");
    const qcal_json *v = qcal_json_get(st->metadata, key);
    if (!v)
        return qcal_error(QCAL_ERR_NOT_FOUND, "safetensors '%s' has no metadata '%s'", st->path, key);
    *value = v->str;
    return QCAL_OK;
}

qcal_status qcal_safetensors_read_f32(const qcal_safetensors *st, int64_t i, int64_t start,
                                      int64_t count, float *dst)
{
    qcal_status s = check_index(st, i);
    if (s != QCAL_OK)
        return s;
    const qcal_safetensors_tensor_info *t = &st->info[i];
    if (start < 0 || count < 0 || start > t->numel || count > t->numel - start)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "read of elements [%lld, %lld + %lld) outside tensor '%s' of %lld elements",
                          (long long)start, (long long)start, (long long)count, t->name,
                          (long long)t->numel);
    if (count > 0 && !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_read_f32: dst is NULL");
    const uint8_t *base = st->map + t->offset;
    size_t n = (size_t)count;
    switch (t->dtype) {
    case QCAL_SAFETENSORS_F32:
        memcpy(dst, base + 4 * (size_t)start, 4 * n);
        return QCAL_OK;
    case QCAL_SAFETENSORS_F16:
        qcal_half_dsp_get()->f16_to_f32(base + 2 * (size_t)start, n, dst);
        return QCAL_OK;
    case QCAL_SAFETENSORS_BF16:
        qcal_half_dsp_get()->bf16_to_f32(base + 2 * (size_t)start, n, dst);
        return QCAL_OK;
    case QCAL_SAFETENSORS_F64:
        for (size_t k = 0; k < n; k++) {
            double d;
            memcpy(&d, base + 8 * ((size_t)start + k), 8);
            dst[k] = (float)d;
        }
        return QCAL_OK;
    case QCAL_SAFETENSORS_OTHER:
        break;
    }
    return qcal_error(QCAL_ERR_UNSUPPORTED,
                      "safetensors '%s': tensor '%s' has dtype %s; qcal reads F32, F16, BF16, F64",
                      st->path, t->name, t->dtype_name);
}

qcal_status qcal_safetensors_raw(const qcal_safetensors *st, int64_t i, const void **bytes)
{
    qcal_status s = check_index(st, i);
    if (s != QCAL_OK)
        return s;
    if (!bytes)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_raw: bytes is NULL");
    if (st->info[i].dtype != QCAL_SAFETENSORS_F32)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s' is %s, raw access needs F32",
                          st->info[i].name, st->info[i].dtype_name);
    *bytes = st->map + st->info[i].offset;
    return QCAL_OK;
}

qcal_status qcal_safetensors_release(const qcal_safetensors *st, int64_t i)
{
    qcal_status s = check_index(st, i);
    if (s != QCAL_OK)
        return s;
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    size_t b = (size_t)st->info[i].offset, e = b + (size_t)st->info[i].nbytes;
    b = (b + page - 1) / page * page;   /* only whole pages inside the tensor */
    e = e / page * page;
    if (e > b)
        madvise(st->map + b, e - b, MADV_DONTNEED);   /* advice only: failure is harmless */
    return QCAL_OK;
}

/* ---- writer ------------------------------------------------------------------------ */

static void buf_str(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

qcal_status qcal_safetensors_write_f32(const char *path, int64_t n, const char *const *names,
                                       const qcal_tensor *tensors, int64_t n_meta,
                                       const char *const *meta)
{
    if (!path || n < 0 || (n > 0 && (!names || !tensors)) || n_meta < 0 || (n_meta > 0 && !meta))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_write_f32: bad arguments "
                          "(n %lld, n_meta %lld)", (long long)n, (long long)n_meta);
    qcal_buf h = {0};
    qcal_status s = QCAL_OK;
    int64_t off = 0;
    buf_str(&h, "{");
    if (n_meta > 0) {
        buf_str(&h, "\"__metadata__\":{");
        for (int64_t k = 0; k < n_meta; k++) {
            if (!meta[2 * k] || !meta[2 * k + 1]) {
                qcal_buf_free(&h);
                return qcal_error(QCAL_ERR_INVALID_ARG, "metadata entry %lld is NULL", (long long)k);
            }
            if (k)
                buf_str(&h, ",");
            qcal_json_write_str(&h, meta[2 * k]);
            buf_str(&h, ":");
            qcal_json_write_str(&h, meta[2 * k + 1]);
        }
        buf_str(&h, "}");
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t numel, nbytes;
        if (!names[i] || !*names[i] || !strcmp(names[i], "__metadata__")) {
            qcal_buf_free(&h);
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor %lld has an empty or reserved name",
                              (long long)i);
        }
        for (int64_t j = 0; j < i; j++) {
            if (!strcmp(names[i], names[j])) {
                qcal_buf_free(&h);
                return qcal_error(QCAL_ERR_INVALID_ARG, "tensor name '%s' appears twice (%lld and %lld)",
                                  names[i], (long long)j, (long long)i);
            }
        }
        s = qcal_tensor_numel(&tensors[i], &numel);
        if (s != QCAL_OK) {
            qcal_buf_free(&h);
            return s;
        }
        if (numel > 0 && !tensors[i].data) {
            qcal_buf_free(&h);
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s' has no data", names[i]);
        }
        if (!qcal_mul_i64(numel, 4, &nbytes) || !qcal_add_i64(off, nbytes, &nbytes)) {
            qcal_buf_free(&h);
            return qcal_error(QCAL_ERR_OVERFLOW, "safetensors data size overflows at tensor '%s'",
                              names[i]);
        }
        char tmp[64];
        if (i || n_meta > 0)
            buf_str(&h, ",");
        qcal_json_write_str(&h, names[i]);
        buf_str(&h, ":{\"dtype\":\"F32\",\"shape\":[");
        for (int32_t d = 0; d < tensors[i].ndim; d++) {
            snprintf(tmp, sizeof tmp, d ? ",%lld" : "%lld", (long long)tensors[i].shape[d]);
            buf_str(&h, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                 (long long)nbytes);
        buf_str(&h, tmp);
        off = nbytes;
    }
    buf_str(&h, "}");
    while (h.len % 8)
        buf_str(&h, " ");
    if (h.failed) {
        qcal_buf_free(&h);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot build the safetensors header");
    }
    qcal_atomic_file f;
    s = qcal_atomic_file_open(&f, path);
    uint64_t total = 8 + h.len;
    for (int64_t i = 0; s == QCAL_OK && i < n; i++) {
        int64_t numel;
        qcal_tensor_numel(&tensors[i], &numel);
        total += (uint64_t)numel * 4;
    }
    if (s == QCAL_OK && (s = qcal_atomic_file_reserve(&f, total)) != QCAL_OK)
        qcal_atomic_file_abort(&f);
    if (s != QCAL_OK) {
        qcal_buf_free(&h);
        return s;
    }
    uint8_t len8[8];
    uint64_t hl = h.len;
    for (int k = 0; k < 8; k++)
        len8[k] = (uint8_t)(hl >> (8 * k));
    bool ok = fwrite(len8, 1, 8, f.fp) == 8 && fwrite(h.data, 1, h.len, f.fp) == h.len;
    qcal_buf_free(&h);
    for (int64_t i = 0; ok && i < n; i++) {
        int64_t numel;
        qcal_tensor_numel(&tensors[i], &numel);
        /* A 0-element tensor may have NULL data; fwrite's buffer must not be NULL. */
        if (numel > 0)
            ok = fwrite(tensors[i].data, 4, (size_t)numel, f.fp) == (size_t)numel;
    }
    if (!ok) {
        int e = errno;
        qcal_atomic_file_abort(&f);
        return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e));
    }
    return qcal_atomic_file_commit(&f);
}

/* ---- any-dtype header (streaming writers) -------------------------------------------- */

int qcal_safetensors_dtype_size(const char *dtype)
{
    for (size_t k = 0; dtype && k < sizeof dtypes / sizeof dtypes[0]; k++)
        if (!strcmp(dtypes[k].name, dtype))
            return dtypes[k].size;
    return 0;
}

qcal_status qcal_safetensors_bytes(const qcal_safetensors *st, int64_t i, const void **bytes)
{
    qcal_status s = check_index(st, i);
    if (s != QCAL_OK)
        return s;
    if (!bytes)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_bytes: bytes is NULL");
    *bytes = st->map + st->info[i].offset;
    return QCAL_OK;
}

qcal_status qcal_safetensors_header(int64_t n, const qcal_safetensors_desc *d, int64_t n_meta,
                                    const char *const *meta, void **out, size_t *len,
                                    int64_t *data_bytes)
{
    if (n < 0 || (n > 0 && !d) || n_meta < 0 || (n_meta > 0 && !meta) || !out || !len ||
        !data_bytes)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_safetensors_header: bad arguments "
                          "(n %lld, n_meta %lld)", (long long)n, (long long)n_meta);
    qcal_buf h = {0};
    qcal_status s = QCAL_OK;
    int64_t off = 0;
    buf_str(&h, "________{");   /* the 8 length bytes, filled in at the end */
    if (n_meta > 0) {
        buf_str(&h, "\"__metadata__\":{");
        for (int64_t k = 0; k < n_meta && s == QCAL_OK; k++) {
            if (!meta[2 * k] || !meta[2 * k + 1]) {
                s = qcal_error(QCAL_ERR_INVALID_ARG, "metadata entry %lld is NULL", (long long)k);
                break;
            }
            if (k)
                buf_str(&h, ",");
            qcal_json_write_str(&h, meta[2 * k]);
            buf_str(&h, ":");
            qcal_json_write_str(&h, meta[2 * k + 1]);
        }
        buf_str(&h, "}");
    }
    for (int64_t i = 0; i < n && s == QCAL_OK; i++) {
        const qcal_safetensors_desc *t = &d[i];
        int size = qcal_safetensors_dtype_size(t->dtype);
        if (!t->name || !*t->name || !strcmp(t->name, "__metadata__")) {
            s = qcal_error(QCAL_ERR_INVALID_ARG, "tensor %lld has an empty or reserved name",
                           (long long)i);
            break;
        }
        if (!size) {
            s = qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': unknown safetensors dtype '%s'",
                           t->name, t->dtype ? t->dtype : "(null)");
            break;
        }
        for (int64_t j = 0; j < i && s == QCAL_OK; j++)
            if (!strcmp(t->name, d[j].name))
                s = qcal_error(QCAL_ERR_INVALID_ARG, "tensor name '%s' appears twice (%lld "
                               "and %lld)", t->name, (long long)j, (long long)i);
        if (s != QCAL_OK)
            break;
        if (t->ndim < 0 || t->ndim > QCAL_MAX_DIMS) {
            s = qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': %d dimensions", t->name,
                           (int)t->ndim);
            break;
        }
        int64_t numel = 1, end;
        for (int32_t k = 0; k < t->ndim && s == QCAL_OK; k++)
            if (t->shape[k] < 0 || !qcal_mul_i64(numel, t->shape[k], &numel))
                s = qcal_error(QCAL_ERR_OVERFLOW, "tensor '%s': bad or overflowing shape",
                               t->name);
        if (s != QCAL_OK)
            break;
        if (!qcal_mul_i64(numel, size, &end) || !qcal_add_i64(off, end, &end)) {
            s = qcal_error(QCAL_ERR_OVERFLOW, "safetensors data size overflows at tensor '%s'",
                           t->name);
            break;
        }
        char tmp[64];
        if (i || n_meta > 0)
            buf_str(&h, ",");
        qcal_json_write_str(&h, t->name);
        buf_str(&h, ":{\"dtype\":");
        qcal_json_write_str(&h, t->dtype);
        buf_str(&h, ",\"shape\":[");
        for (int32_t k = 0; k < t->ndim; k++) {
            snprintf(tmp, sizeof tmp, k ? ",%lld" : "%lld", (long long)t->shape[k]);
            buf_str(&h, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
                 (long long)end);
        buf_str(&h, tmp);
        off = end;
    }
    if (s != QCAL_OK) {
        qcal_buf_free(&h);
        return s;
    }
    buf_str(&h, "}");
    while ((h.len - 8) % 8)
        buf_str(&h, " ");
    if (h.failed) {
        qcal_buf_free(&h);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot build the safetensors header");
    }
    uint64_t hl = h.len - 8;
    for (int k = 0; k < 8; k++)
        ((uint8_t *)h.data)[k] = (uint8_t)(hl >> (8 * k));
    *out = h.data;
    *len = h.len;
    *data_bytes = off;
    return QCAL_OK;
}
