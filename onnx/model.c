/* ONNX models: reading (mmap, protobuf-c unpack, checks, external data), writing (streamed
 * pack through an atomic file, external data past 2 GiB), inspection and the builder. */
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/half_dsp.h"
#include "onnx/onnx_internal.h"
#include "qcal/atomic_file.h"

bool qcal_onnx_available(void)
{
    return true;
}

/* ---- small helpers ---- */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

bool onnx_map_put(onnx_map *m, const char *key, int64_t val)
{
    if ((m->len + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        const char **keys = calloc(cap, sizeof *keys);
        int64_t *vals = calloc(cap, sizeof *vals);
        if (!keys || !vals) {
            free(keys);
            free(vals);
            return false;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i])
                continue;
            size_t j = hash_str(m->keys[i]) & (cap - 1);
            while (keys[j])
                j = (j + 1) & (cap - 1);
            keys[j] = m->keys[i];
            vals[j] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        m->keys = keys;
        m->vals = vals;
        m->cap = cap;
    }
    size_t j = hash_str(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key)) {
            m->vals[j] = val;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = key;
    m->vals[j] = val;
    m->len++;
    return true;
}

int64_t *onnx_map_get(const onnx_map *m, const char *key)
{
    if (!m->cap)
        return NULL;
    size_t j = hash_str(key) & (m->cap - 1);
    while (m->keys[j]) {
        if (!strcmp(m->keys[j], key))
            return &m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

void onnx_map_free(onnx_map *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

size_t onnx_elem_size(int32_t type)
{
    switch (type) {
    case 1: case 6: case 12: return 4;          /* float, int32, uint32 */
    case 2: case 3: case 9: return 1;           /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2; /* uint16, int16, float16, bfloat16 */
    case 7: case 11: case 13: case 14: return 8;/* int64, double, uint64, complex64 */
    case 15: return 16;                         /* complex128 */
    case 17: case 18: case 19: case 20: return 1; /* float8 variants (later ONNX) */
    default: return 0;
    }
}

bool onnx_tensor_numel(const Onnx__TensorProto *t, int64_t *numel)
{
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++)
        if (t->dims[i] < 0 || !qcal_mul_i64(n, t->dims[i], &n))
            return false;
    *numel = n;
    return true;
}

char *onnx_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

bool onnx_push(void ***array, size_t *n, void *item)
{
    void **a = realloc(*array, (*n + 1) * sizeof *a);
    if (!a)
        return false;
    a[*n] = item;
    *array = a;
    (*n)++;
    return true;
}

int64_t onnx_model_opset(const Onnx__ModelProto *mp)
{
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx"))
            return o->has_version ? o->version : -1;
    }
    return -1;
}

const Onnx__AttributeProto *onnx_node_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name))
            return n->attribute[i];
    return NULL;
}

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

/* ---- tensor data ---- */

/* Expected byte size of the tensor's data for its element type, or 0 with *known false. */
static bool tensor_expected_bytes(const Onnx__TensorProto *t, int64_t numel, uint64_t *bytes)
{
    int32_t type = t->data_type;
    size_t es = onnx_elem_size(type);
    if (es) {
        *bytes = (uint64_t)numel * es;   /* numel * 16 cannot overflow after the check below */
        return numel <= INT64_MAX / 16;
    }
    if (type >= 21 && type <= 23) {     /* 4-bit types: two per byte */
        *bytes = ((uint64_t)numel + 1) / 2;
        return true;
    }
    return false;
}

qcal_status onnx_tensor_bytes(const Onnx__TensorProto *t, const uint8_t **data, size_t *len,
                              void **owned)
{
    *owned = NULL;
    int64_t numel;
    if (!onnx_tensor_numel(t, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "tensor '%s' has an invalid shape", str_or_empty(t->name));
    if (t->has_raw_data || t->raw_data.len) {
        *data = t->raw_data.data;
        *len = t->raw_data.len;
        return QCAL_OK;
    }
    size_t es = onnx_elem_size(t->data_type);
    if (!es)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d is not supported",
                          str_or_empty(t->name), (int)t->data_type);
    size_t n = (size_t)numel;
    size_t nbytes = n * es;
    uint8_t *buf = malloc(nbytes ? nbytes : 1);
    if (!buf)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for tensor '%s'", str_or_empty(t->name));
    /* An empty repeated field is a NULL pointer: memcpy(dst, NULL, 0) is undefined, so copy
       only when there is something. */
    switch (t->data_type) {
    case 1:
        if (t->n_float_data != n) goto bad;
        if (n) memcpy(buf, t->float_data, n * 4);
        break;
    case 11:
        if (t->n_double_data != n) goto bad;
        if (n) memcpy(buf, t->double_data, n * 8);
        break;
    case 7:
        if (t->n_int64_data != n) goto bad;
        if (n) memcpy(buf, t->int64_data, n * 8);
        break;
    case 12: case 13:
        if (t->n_uint64_data != n) goto bad;
        for (size_t i = 0; i < n; i++) {
            if (es == 4) { uint32_t v = (uint32_t)t->uint64_data[i]; memcpy(buf + 4 * i, &v, 4); }
            else memcpy(buf + 8 * i, &t->uint64_data[i], 8);
        }
        break;
    case 2: case 3: case 4: case 5: case 6: case 9: case 10: case 16:
    case 17: case 18: case 19: case 20:
        if (t->n_int32_data != n) goto bad;
        for (size_t i = 0; i < n; i++) {
            int32_t v = t->int32_data[i];
            if (es == 1) buf[i] = (uint8_t)v;
            else if (es == 2) { uint16_t u = (uint16_t)v; memcpy(buf + 2 * i, &u, 2); }
            else memcpy(buf + 4 * i, &v, 4);
        }
        break;
    default:
        free(buf);
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d is not supported",
                          str_or_empty(t->name), (int)t->data_type);
    }
    *data = buf;
    *len = n * es;
    *owned = buf;
    return QCAL_OK;
bad:
    free(buf);
    return qcal_error(QCAL_ERR_FORMAT, "tensor '%s': data does not match its shape",
                      str_or_empty(t->name));
}

qcal_status onnx_tensor_to_float(const Onnx__TensorProto *t, float **out, int64_t *numel)
{
    const uint8_t *p;
    size_t len;
    void *owned;
    qcal_status st = onnx_tensor_bytes(t, &p, &len, &owned);
    if (st != QCAL_OK)
        return st;
    int64_t n = 0;
    onnx_tensor_numel(t, &n);
    size_t es = onnx_elem_size(t->data_type);
    if (!es || len != (size_t)n * es) {
        free(owned);
        return qcal_error(QCAL_ERR_FORMAT, "tensor '%s': %zu bytes of data for %lld elements",
                          str_or_empty(t->name), len, (long long)n);
    }
    float *f = malloc((size_t)n * sizeof *f + 1);
    if (!f) {
        free(owned);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for tensor '%s'", str_or_empty(t->name));
    }
    int64_t todo = n;
    if (t->data_type == 1) {   /* float32: one copy */
        if (n) memcpy(f, p, (size_t)n * 4);
        todo = 0;
    } else if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
               t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) {
        /* io's half kernels (exact; a NaN keeps its payload and comes out quiet) */
        const qcal_half_dsp *k = qcal_half_dsp_get();
        (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ? k->f16_to_f32
                                                                  : k->bf16_to_f32)(p, (size_t)n, f);
        todo = 0;
    }
    for (int64_t i = 0; i < todo; i++) {
        const uint8_t *q = p + (size_t)i * es;
        switch (t->data_type) {
        case 1: memcpy(&f[i], q, 4); break;
        case 11: { double d; memcpy(&d, q, 8); f[i] = (float)d; break; }
        case 2: case 9: f[i] = (float)q[0]; break;
        case 3: f[i] = (float)(int8_t)q[0]; break;
        case 4: { uint16_t v; memcpy(&v, q, 2); f[i] = (float)v; break; }
        case 5: { int16_t v; memcpy(&v, q, 2); f[i] = (float)v; break; }
        case 6: { int32_t v; memcpy(&v, q, 4); f[i] = (float)v; break; }
        case 12: { uint32_t v; memcpy(&v, q, 4); f[i] = (float)v; break; }
        case 7: { int64_t v; memcpy(&v, q, 8); f[i] = (float)v; break; }
        case 13: { uint64_t v; memcpy(&v, q, 8); f[i] = (float)v; break; }
        default:
            free(f);
            free(owned);
            return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d cannot be read as float",
                              str_or_empty(t->name), (int)t->data_type);
        }
    }
    free(owned);
    *out = f;
    *numel = n;
    return QCAL_OK;
}

/* ---- load: wire-level depth check, unpack, checks ---- */

#define ONNX_MAX_DEPTH 64
#define ONNX_MAX_FIELD ((UINT64_C(1) << 29) - 1)

static bool read_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*i >= len)
            return false;
        uint8_t b = p[(*i)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* Raw data from this size on is cut out of the shell (below). The fuzz build lowers it
 * (-DONNX_BLOB_MIN=16) so that inputs of a few KiB exercise the cut. */
#ifndef ONNX_BLOB_MIN
#define ONNX_BLOB_MIN ((size_t)1 << 16)
#endif

/* Walks the wire format with protobuf-c's descriptors (no decoding) and refuses nesting
 * deeper than ONNX_MAX_DEPTH, so the recursive unpack below cannot exhaust the stack. */
static qcal_status check_depth(const uint8_t *p, size_t len, const ProtobufCMessageDescriptor *d,
                               int depth)
{
    if (depth > ONNX_MAX_DEPTH)
        return qcal_error(QCAL_ERR_FORMAT, "messages nested deeper than %d levels", ONNX_MAX_DEPTH);
    size_t i = 0;
    while (i < len) {
        uint64_t tag, v;
        size_t at = i;
        if (!read_varint(p, len, &i, &tag))
            goto bad;
        /* Field numbers are 1 .. 2^29 - 1 (protobuf's documented range). protobuf-c keeps
         * a field 0 written as 80 00 as an unknown field, then packs it as 00, which its
         * own reader refuses: what qcal saved would not load. */
        if ((tag >> 3) == 0 || (tag >> 3) > ONNX_MAX_FIELD)
            goto bad;
        switch (tag & 7) {
        case 0:
            if (!read_varint(p, len, &i, &v))
                goto bad;
            break;
        case 1:
            if (len - i < 8)
                goto bad;
            i += 8;
            break;
        case 5:
            if (len - i < 4)
                goto bad;
            i += 4;
            break;
        case 2: {
            if (!read_varint(p, len, &i, &v) || v > len - i)
                goto bad;
            const ProtobufCFieldDescriptor *f =
                (tag >> 3) <= UINT_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                qcal_status st = check_depth(p + i, (size_t)v, f->descriptor, depth + 1);
                if (st != QCAL_OK)
                    return st;
            }
            i += (size_t)v;
            break;
        }
        default:
            (void)at;
            goto bad;
        }
    }
    return QCAL_OK;
bad:
    return qcal_error(QCAL_ERR_FORMAT, "malformed or truncated protobuf");
}

/* Names in scope while checking a graph: name -> number of live definitions. */
typedef struct scope {
    onnx_map defined;
    const char *where;   /* file name for messages */
} scope;

static bool scope_add(scope *s, const char *name)
{
    if (!name || !name[0])
        return true;
    int64_t *c = onnx_map_get(&s->defined, name);
    if (c) {
        (*c)++;
        return true;
    }
    return onnx_map_put(&s->defined, name, 1);
}

static void scope_drop(scope *s, const char *name)
{
    if (!name || !name[0])
        return;
    int64_t *c = onnx_map_get(&s->defined, name);
    if (c && *c > 0)
        (*c)--;
}

static bool scope_has(const scope *s, const char *name)
{
    int64_t *c = onnx_map_get(&s->defined, name);
    return c && *c > 0;
}

typedef struct load_ctx {
    const char *path;      /* model file or NULL (buffer) */
    int fd;                /* the model file, or -1 */
    const uint8_t *map;    /* its mapping (NULL: a buffer; cut-out bytes are copied) */
    size_t map_len;
    bool map_taken;        /* the model kept the mapping (the loader must not unmap it) */
    qcal_onnx_model *m;    /* the model being checked (external data files are mapped into it) */
    char *dir_real;        /* realpath of the model's directory */
    char *dir;             /* the model's directory as given */
} load_ctx;

static const char *ext_value(const Onnx__TensorProto *t, const char *key)
{
    for (size_t i = 0; i < t->n_external_data; i++)
        if (t->external_data[i]->key && !strcmp(t->external_data[i]->key, key))
            return t->external_data[i]->value ? t->external_data[i]->value : "";
    return NULL;
}

static bool parse_i64(const char *s, int64_t *v)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x < 0)
        return false;
    *v = x;
    return true;
}

/* Adds a mapped file to m (which then owns fd and the mapping); false: out of memory. */
static bool add_src(qcal_onnx_model *m, int fd, const uint8_t *map, size_t len, dev_t dev, ino_t ino)
{
    onnx_src *n = realloc(m->src, (m->n_src + 1) * sizeof *n);
    if (!n)
        return false;
    m->src = n;
    m->src[m->n_src++] = (onnx_src){ fd, map, len, dev, ino };
    return true;
}

/* Data files whose descriptor a model keeps open (for copy_file_range on save); the files
 * past these are kept as mappings only (a save writes their bytes from the mapping), so a
 * model with one data file per tensor does not exhaust the process's descriptors. */
#define EXT_FDS_KEPT 32

/* The mapping of an external data file in lc->m (made on first use), or NULL when the file
 * cannot be mapped (the caller reads it instead). Takes fd when it returns a new mapping. */
static const uint8_t *ext_map(load_ctx *lc, int *fd, const struct stat *sb)
{
    qcal_onnx_model *m = lc->m;
    size_t fds = 0;
    for (size_t i = 0; i < m->n_src; i++) {
        if (m->src[i].dev == sb->st_dev && m->src[i].ino == sb->st_ino && m->src[i].len == (size_t)sb->st_size)
            return m->src[i].map;
        fds += m->src[i].fd >= 0;
    }
    void *map = mmap(NULL, (size_t)sb->st_size, PROT_READ, MAP_PRIVATE, *fd, 0);
    if (map == MAP_FAILED)
        return NULL;
    int keep = fds < EXT_FDS_KEPT ? *fd : -1;
    if (!add_src(m, keep, map, (size_t)sb->st_size, sb->st_dev, sb->st_ino)) {
        munmap(map, (size_t)sb->st_size);
        return NULL;
    }
    if (keep < 0)
        close(*fd);
    *fd = -1;   /* kept by the model, or closed */
    return map;
}

/* A tensor's external data (confined to the model's directory) into raw_data: for a
 * main-graph initializer (depth 0) a pointer into the data file's mapping, which the model
 * keeps (nothing read until a pass or a save needs the bytes); else read into memory. */
static qcal_status load_external(load_ctx *lc, Onnx__TensorProto *t, uint64_t expect, int depth)
{
    const char *name = str_or_empty(t->name);
    const char *loc = ext_value(t, "location");
    if (!lc->path)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "initializer '%s' has external data, which needs a model file",
                          name);
    if (!loc || !loc[0])
        return qcal_error(QCAL_ERR_FORMAT, "initializer '%s': external data without a location", name);
    if (loc[0] == '/')
        return qcal_error(QCAL_ERR_FORMAT,
                          "initializer '%s': external data location '%s' is an absolute path (must be relative to the model)",
                          name, loc);
    for (const char *c = loc; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return qcal_error(QCAL_ERR_FORMAT,
                              "initializer '%s': external data location '%s' leaves the model's directory ('..')",
                              name, loc);
        c += n + (e ? 1 : 0);
        if (!e)
            break;
    }
    int64_t offset = 0, length = -1;
    const char *o = ext_value(t, "offset"), *l = ext_value(t, "length");
    if ((o && !parse_i64(o, &offset)) || (l && !parse_i64(l, &length)))
        return qcal_error(QCAL_ERR_FORMAT, "initializer '%s': bad external data offset or length", name);
    size_t plen = strlen(lc->dir) + strlen(loc) + 2;
    char *full = malloc(plen);
    if (!full)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    snprintf(full, plen, "%s/%s", lc->dir, loc);
    char *real = realpath(full, NULL);
    if (!real) {
        int e = errno;
        qcal_status st = qcal_error(e == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                                    "initializer '%s': cannot open external data '%s': %s", name,
                                    full, strerror(e));
        free(full);
        return st;
    }
    size_t dl = strlen(lc->dir_real);
    bool inside = !strncmp(real, lc->dir_real, dl) &&
                  (real[dl] == '/' || (dl == 1 && lc->dir_real[0] == '/'));
    if (!inside) {
        qcal_status st = qcal_error(QCAL_ERR_FORMAT,
                                    "initializer '%s': external data '%s' resolves to '%s', outside the model's directory",
                                    name, loc, real);
        free(full);
        free(real);
        return st;
    }
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    free(real);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        qcal_status st = qcal_error(QCAL_ERR_IO, "initializer '%s': cannot read external data '%s'%s%s",
                                    name, full, fd >= 0 ? ": not a regular file" : ": ",
                                    fd >= 0 ? "" : strerror(e));
        free(full);
        return st;
    }
    if (length < 0)
        length = sb.st_size - offset;
    if (offset > sb.st_size || length > sb.st_size - offset || (uint64_t)length != expect) {
        close(fd);
        qcal_status st = qcal_error(QCAL_ERR_FORMAT,
                                    "initializer '%s': external data '%s' (%lld bytes) does not hold %llu bytes at offset %lld",
                                    name, full, (long long)sb.st_size, (unsigned long long)expect,
                                    (long long)offset);
        free(full);
        return st;
    }
    const uint8_t *map = lc->m && depth == 0 && expect > 0 ? ext_map(lc, &fd, &sb) : NULL;
    uint8_t *buf = map ? (uint8_t *)(uintptr_t)(map + offset) : malloc(expect ? (size_t)expect : 1);
    if (!buf) {
        close(fd);
        free(full);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for initializer '%s'", name);
    }
    size_t got = map ? (size_t)expect : 0;
    while (got < expect) {
        ssize_t r = pread(fd, buf + got, (size_t)expect - got, (off_t)(offset + (int64_t)got));
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            int e = r < 0 ? errno : EIO;
            close(fd);
            free(buf);
            qcal_status st = qcal_error(QCAL_ERR_IO, "initializer '%s': reading '%s': %s", name, full,
                                        strerror(e));
            free(full);
            return st;
        }
        got += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    free(full);
    free(t->raw_data.data);
    t->raw_data.data = buf;
    t->raw_data.len = (size_t)expect;
    t->has_raw_data = 1;
    t->has_data_location = 0;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
    for (size_t i = 0; i < t->n_external_data; i++)
        protobuf_c_message_free_unpacked(&t->external_data[i]->base, NULL);
    free(t->external_data);
    t->external_data = NULL;
    t->n_external_data = 0;
    return QCAL_OK;
}

static qcal_status check_initializer(load_ctx *lc, Onnx__TensorProto *t, int depth)
{
    const char *name = str_or_empty(t->name);
    int64_t numel;
    if (!onnx_tensor_numel(t, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "initializer '%s' has a negative or overflowing shape", name);
    uint64_t bytes;
    bool known = tensor_expected_bytes(t, numel, &bytes);
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        if (!known)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "initializer '%s': external data of element type %d",
                              name, (int)t->data_type);
        return load_external(lc, t, bytes, depth);
    }
    if (!known || t->data_type == 8)
        return QCAL_OK;   /* strings and types newer than this reader: kept as they are */
    if (t->has_raw_data || t->raw_data.len) {
        if (t->raw_data.len != bytes)
            return qcal_error(QCAL_ERR_FORMAT,
                              "initializer '%s' holds %zu bytes of data, its shape needs %llu",
                              name, t->raw_data.len, (unsigned long long)bytes);
        return QCAL_OK;
    }
    size_t have;
    switch (t->data_type) {
    case 1: have = t->n_float_data; break;
    case 11: have = t->n_double_data; break;
    case 7: have = t->n_int64_data; break;
    case 12: case 13: have = t->n_uint64_data; break;
    case 14: have = t->n_float_data / 2; break;
    case 15: have = t->n_double_data / 2; break;
    default: have = t->n_int32_data; break;
    }
    if ((uint64_t)have != (uint64_t)numel)
        return qcal_error(QCAL_ERR_FORMAT, "initializer '%s' holds %zu values, its shape needs %lld",
                          name, have, (long long)numel);
    return QCAL_OK;
}

static qcal_status check_graph(load_ctx *lc, scope *s, Onnx__GraphProto *g, int depth);

static qcal_status check_node_graphs(load_ctx *lc, scope *s, Onnx__NodeProto *n, int depth)
{
    for (size_t a = 0; a < n->n_attribute; a++) {
        Onnx__AttributeProto *at = n->attribute[a];
        if (at->g) {
            qcal_status st = check_graph(lc, s, at->g, depth + 1);
            if (st != QCAL_OK)
                return st;
        }
        for (size_t k = 0; k < at->n_graphs; k++) {
            qcal_status st = check_graph(lc, s, at->graphs[k], depth + 1);
            if (st != QCAL_OK)
                return st;
        }
    }
    return QCAL_OK;
}

/* Every name a node reads is defined before it (graph inputs, initializers, earlier node
 * outputs, outer scopes); subgraphs see the names defined so far. */
static qcal_status check_graph(load_ctx *lc, scope *s, Onnx__GraphProto *g, int depth)
{
    qcal_status st = QCAL_OK;
    if (depth > ONNX_MAX_DEPTH)
        return qcal_error(QCAL_ERR_FORMAT, "subgraphs nested deeper than %d levels", ONNX_MAX_DEPTH);
    bool oom = false;
    /* Names this graph defines, with what defines them (an initializer may share a graph
     * input's name: the input's default value). */
    enum { DEF_NODE, DEF_INPUT, DEF_INIT };
    onnx_map local = { 0 };
    for (size_t i = 0; i < g->n_input; i++) {
        const char *in = g->input[i]->name;
        oom |= !scope_add(s, in);
        if (in && in[0] && !onnx_map_get(&local, in))
            oom |= !onnx_map_put(&local, in, DEF_INPUT);
    }
    for (size_t i = 0; i < g->n_initializer; i++) {
        if ((st = check_initializer(lc, g->initializer[i], depth)) != QCAL_OK)
            goto done;
        const char *in = g->initializer[i]->name;
        oom |= !scope_add(s, in);
        if (in && in[0] && !onnx_map_get(&local, in))
            oom |= !onnx_map_put(&local, in, DEF_INIT);
    }
    for (size_t i = 0; i < g->n_sparse_initializer; i++)
        if (g->sparse_initializer[i]->values)
            oom |= !scope_add(s, g->sparse_initializer[i]->values->name);
    if (oom) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < g->n_node; i++) {
        Onnx__NodeProto *n = g->node[i];
        if (!n->op_type || !n->op_type[0]) {
            st = qcal_error(QCAL_ERR_FORMAT, "node %zu ('%s') has no op_type", i, str_or_empty(n->name));
            goto done;
        }
        for (size_t k = 0; k < n->n_input; k++) {
            const char *in = n->input[k];
            if (in && in[0] && !scope_has(s, in)) {
                st = qcal_error(QCAL_ERR_FORMAT,
                                "node '%s' (%s) reads '%s', which no graph input, initializer or earlier node defines",
                                str_or_empty(n->name), n->op_type, in);
                goto done;
            }
        }
        if ((st = check_node_graphs(lc, s, n, depth)) != QCAL_OK)
            goto done;
        for (size_t k = 0; k < n->n_output; k++) {
            /* SSA: a name defined twice in this graph (by two nodes, or by a node and a
             * graph input or initializer) would make the passes rewire the wrong producer,
             * or give a reader of the input a Q/DQ that is never made (both found by
             * fuzz_onnx) */
            const char *o = n->output[k];
            const int64_t *def = o && o[0] ? onnx_map_get(&local, o) : NULL;
            if (def) {
                st = qcal_error(QCAL_ERR_FORMAT, "node '%s' (%s) writes '%s', which %s",
                                str_or_empty(n->name), n->op_type, o,
                                *def == DEF_NODE    ? "an earlier node already writes"
                                : *def == DEF_INPUT ? "is a graph input"
                                                    : "is an initializer");
                goto done;
            }
            if ((o && o[0] && !onnx_map_put(&local, o, DEF_NODE)) || !scope_add(s, n->output[k])) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto done;
            }
        }
    }
    for (size_t i = 0; i < g->n_output; i++) {
        const char *o = g->output[i]->name;
        if (!o || !o[0] || !scope_has(s, o)) {
            st = qcal_error(QCAL_ERR_FORMAT, "graph output '%s' is not defined by any node, input or initializer",
                            str_or_empty(o));
            goto done;
        }
    }
done:
    onnx_map_free(&local);
    /* Leave the scope as the caller had it (names of this graph are local to it). */
    for (size_t i = 0; i < g->n_input; i++)
        scope_drop(s, g->input[i]->name);
    for (size_t i = 0; i < g->n_initializer; i++)
        scope_drop(s, g->initializer[i]->name);
    for (size_t i = 0; i < g->n_sparse_initializer; i++)
        if (g->sparse_initializer[i]->values)
            scope_drop(s, g->sparse_initializer[i]->values->name);
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t k = 0; k < g->node[i]->n_output; k++)
            scope_drop(s, g->node[i]->output[k]);
    return st;
}

/* Copies n bytes with 16-byte vector moves (a loop glibc's memcpy cannot turn into `rep
 * movsb`). Measured on this project's AMD Zen 3 VM, 2 GiB from a file mapping misaligned by 1
 * byte: 0.96-1.19 s of CPU with memcpy into a buffer 15 bytes ahead of the source in its
 * page, 0.27-0.31 s with this loop into a buffer placed as onnx_raw_view places it (which
 * of the two differences matters was not separated). */
static void copy_vec(uint8_t *restrict dst, const uint8_t *restrict src, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_storeu_si128((__m128i *)(dst + i), a);
        _mm_storeu_si128((__m128i *)(dst + i + 16), b);
        _mm_storeu_si128((__m128i *)(dst + i + 32), c);
        _mm_storeu_si128((__m128i *)(dst + i + 48), d);
    }
#endif
    if (n > i)
        memcpy(dst + i, src + i, n - i);
}

qcal_status onnx_raw_view(const Onnx__TensorProto *t, size_t off, size_t len, uint8_t *scratch,
                          const float **view)
{
    if (off > t->raw_data.len || len > t->raw_data.len - off)
        return qcal_error(QCAL_ERR_INVALID_ARG, "bytes [%zu, +%zu) of a %zu-byte tensor", off, len,
                          t->raw_data.len);
    const uint8_t *src = t->raw_data.data + off;
    if ((uintptr_t)src % sizeof(float) == 0) {
        /* In place. Reading a mapped file's pages where they are cost a quarter of the CPU
         * time of pread()ing them into a buffer (2 GiB read: 0.22 s against 0.33-1.3 s). */
        *view = (const float *)(const void *)src;
        return QCAL_OK;
    }
    /* The copy starts 512-575 bytes below the source's offset in its 4 KiB page: a load never
     * meets an earlier store with the same low 12 address bits (4 KiB aliasing stalls the
     * load), and the copy is 64-byte aligned. */
    uintptr_t page = ((uintptr_t)scratch + 4095) & ~(uintptr_t)4095;
    uint8_t *dst = (uint8_t *)(page + ((((uintptr_t)src & 4095) - 512) & 4095 & ~(uintptr_t)63));
    copy_vec(dst, src, len);
    *view = (const float *)(const void *)dst;
    return QCAL_OK;
}

void onnx_raw_drop(const qcal_onnx_model *m, const Onnx__TensorProto *t)
{
    if (!t->raw_data.len || !onnx_in_map(m, t->raw_data.data))
        return;
    uintptr_t lo = ((uintptr_t)t->raw_data.data + 4095) & ~(uintptr_t)4095;
    uintptr_t hi = ((uintptr_t)t->raw_data.data + t->raw_data.len) & ~(uintptr_t)4095;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);   /* read-only private mapping */
}

static void detach_all(qcal_onnx_model *m)
{
    if (!m->n_src || !m->proto->graph)
        return;
    for (size_t i = 0; i < m->proto->graph->n_initializer; i++)
        onnx_tensor_release(m, m->proto->graph->initializer[i]);
}

const onnx_src *onnx_src_of(const qcal_onnx_model *m, const void *ptr)
{
    for (size_t i = 0; m && ptr && i < m->n_src; i++)
        if ((const uint8_t *)ptr >= m->src[i].map && (const uint8_t *)ptr < m->src[i].map + m->src[i].len)
            return &m->src[i];
    return NULL;
}

bool onnx_in_map(const qcal_onnx_model *m, const void *ptr)
{
    return onnx_src_of(m, ptr) != NULL;
}

void onnx_tensor_release(const qcal_onnx_model *m, Onnx__TensorProto *t)
{
    if (t && onnx_in_map(m, t->raw_data.data)) {
        t->raw_data.data = NULL;
        t->raw_data.len = 0;
        t->has_raw_data = 0;
    }
}

/* ---- the shell: the model without its large initializer data ----
 * The wire format was checked by check_depth (every length inside its parent). The shell
 * is the same message with the raw_data field of each main-graph initializer that holds
 * ONNX_BLOB_MIN bytes or more left out (and the two enclosing length prefixes, graph and
 * initializer, re-encoded); protobuf-c unpacks the shell, then those tensors get their
 * bytes back, pointing into the source (file mapping) or copied. Only a model with one
 * graph field and initializers with a single raw_data field each is cut this way; anything
 * else is unpacked whole. */

typedef struct cut {
    size_t k;                 /* initializer ordinal (wire order) */
    size_t tag_start, ts, te; /* initializer field: its tag, its content [ts, te) */
    size_t rs, re;            /* the raw_data field inside it (tag to end) */
    size_t ds, dl;            /* the data bytes */
} cut;

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t put_varint(uint8_t *d, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        d[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    d[n++] = (uint8_t)v;
    return n;
}

/* Skips one field at p[*i] (its tag already read as tag); false on a malformed field. */
static bool skip_field(const uint8_t *p, size_t len, size_t *i, uint64_t tag, uint64_t *dlen)
{
    uint64_t v;
    switch (tag & 7) {
    case 0: return read_varint(p, len, i, &v);
    case 1: if (len - *i < 8) return false; *i += 8; return true;
    case 5: if (len - *i < 4) return false; *i += 4; return true;
    case 2:
        if (!read_varint(p, len, i, &v) || v > len - *i)
            return false;
        *dlen = v;
        *i += (size_t)v;
        return true;
    default: return false;
    }
}

/* Builds the shell of p (len bytes, already depth-checked). *shell NULL: nothing to cut. */
static qcal_status make_shell(const uint8_t *p, size_t len, uint8_t **shell, size_t *shell_len,
                              cut **cuts, size_t *ncuts, size_t *ninit)
{
    *shell = NULL;
    *cuts = NULL;
    *ncuts = *ninit = 0;
    size_t i = 0, gtag_end = 0, gs = 0, ge = 0;
    int graphs = 0;
    while (i < len) {
        uint64_t tag, dl = 0;
        if (!read_varint(p, len, &i, &tag))
            return QCAL_OK;
        size_t after_tag = i;
        if (!skip_field(p, len, &i, tag, &dl))
            return QCAL_OK;
        if ((tag >> 3) == 7) {
            if ((tag & 7) != 2)
                return QCAL_OK;
            graphs++;
            gtag_end = after_tag;
            ge = i;
            gs = ge - (size_t)dl;
        }
    }
    if (graphs != 1)
        return QCAL_OK;
    cut *c = NULL;
    size_t n = 0, cap = 0, k = 0;
    for (i = gs; i < ge;) {
        size_t fs = i;
        uint64_t tag, dl = 0;
        if (!read_varint(p, ge, &i, &tag) || !skip_field(p, ge, &i, tag, &dl))
            break;
        if (tag != ((5 << 3) | 2))
            continue;
        size_t te = i, ts = te - (size_t)dl, raws = 0, rs = 0, re = 0, ds = 0, rl = 0;
        for (size_t j = ts; j < te;) {
            size_t f2 = j;
            uint64_t t2, l2 = 0;
            if (!read_varint(p, te, &j, &t2) || !skip_field(p, te, &j, t2, &l2))
                break;
            if ((t2 >> 3) == 9) {
                raws++;
                rs = f2, re = j, rl = (size_t)l2, ds = j - (size_t)l2;
            }
        }
        if (raws == 1 && rl >= ONNX_BLOB_MIN) {
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                cut *nc = realloc(c, cap * sizeof *c);
                if (!nc) {
                    free(c);
                    return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                }
                c = nc;
            }
            c[n++] = (cut){ k, fs, ts, te, rs, re, ds, rl };
        }
        k++;
    }
    if (!n) {
        free(c);
        return QCAL_OK;
    }
    /* New sizes: each cut tensor loses its raw_data field and is rewritten with a one-byte
     * tag and a minimal length; the input's tags and lengths may be longer than minimal
     * (protobuf allows it), so what is removed counts the bytes as they stand. */
    size_t removed = 0;
    for (size_t q = 0; q < n; q++) {
        size_t new_tl = (c[q].te - c[q].ts) - (c[q].re - c[q].rs);
        removed += (c[q].re - c[q].rs) + (c[q].ts - c[q].tag_start) - 1 - varint_size(new_tl);
    }
    size_t new_gl = (ge - gs) - removed;
    size_t out_len = gtag_end + varint_size(new_gl) + (len - gs) - removed;
    uint8_t *o = malloc(out_len ? out_len : 1), *w = o;
    if (!o) {
        free(c);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(w, p, gtag_end);
    w += gtag_end;
    w += put_varint(w, new_gl);
    size_t at = gs;
    for (size_t q = 0; q < n; q++) {
        memcpy(w, p + at, c[q].tag_start - at);   /* fields before this initializer */
        w += c[q].tag_start - at;
        *w++ = (5 << 3) | 2;                      /* the tag, minimal: one byte (0x2a) */
        w += put_varint(w, (c[q].te - c[q].ts) - (c[q].re - c[q].rs));
        memcpy(w, p + c[q].ts, c[q].rs - c[q].ts);
        w += c[q].rs - c[q].ts;
        memcpy(w, p + c[q].re, c[q].te - c[q].re);
        w += c[q].te - c[q].re;
        at = c[q].te;
    }
    memcpy(w, p + at, len - at);
    w += len - at;
    if ((size_t)(w - o) != out_len) {   /* cannot happen: the sizes above are exact */
        free(o);
        free(c);
        return qcal_error(QCAL_ERR_FORMAT, "internal error cutting the model (%zu != %zu bytes)",
                          (size_t)(w - o), out_len);
    }
    *shell = o;
    *shell_len = out_len;
    *cuts = c;
    *ncuts = n;
    *ninit = k;
    return QCAL_OK;
}

/* The unpacked model owns strings of the outputs it adds to the scope map; the map borrows
 * them, so the map dies before the model does. With lc->map set (a file), the cut-out
 * bytes point into the mapping, which the model then keeps; else they are copied. */
static qcal_status model_from_bytes(load_ctx *lc, const uint8_t *p, size_t len, qcal_onnx_model **out)
{
    const char *what = lc->path ? lc->path : "buffer";
    if (len == 0)
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is empty, not an ONNX model", what);
    qcal_status st = check_depth(p, len, &onnx__model_proto__descriptor, 0);
    if (st != QCAL_OK)
        return qcal_error(st, "'%s' is not a valid ONNX model: %s", what, qcal_last_error());
    uint8_t *shell = NULL;
    size_t shell_len = 0, ncuts = 0, ninit = 0;
    cut *cuts = NULL;
    if ((st = make_shell(p, len, &shell, &shell_len, &cuts, &ncuts, &ninit)) != QCAL_OK)
        return st;
    Onnx__ModelProto *mp = shell ? onnx__model_proto__unpack(NULL, shell_len, shell)
                                 : onnx__model_proto__unpack(NULL, len, p);
    free(shell);
    if (!mp) {
        free(cuts);
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is not a valid ONNX model: malformed or truncated protobuf",
                          what);
    }
    qcal_onnx_model *m = calloc(1, sizeof *m);
    if (!m) {
        free(cuts);
        protobuf_c_message_free_unpacked(&mp->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    m->proto = mp;
    lc->m = m;
    /* Give the cut tensors their bytes back. */
    if (ncuts && (!mp->graph || mp->graph->n_initializer != ninit)) {
        free(cuts);
        qcal_onnx_model_destroy(&m);
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is not a valid ONNX model: initializers do not match their fields",
                          what);
    }
    if (ncuts && lc->map) {
        /* The model keeps the mapping (and a descriptor for copy_file_range; without one a
         * save writes the bytes from the mapping). */
        struct stat sb = { 0 };
        int fd = lc->fd >= 0 ? dup(lc->fd) : -1;
        if (fd >= 0 && fstat(fd, &sb) != 0) {
            close(fd);
            fd = -1;
        }
        if (!add_src(m, fd, lc->map, lc->map_len, sb.st_dev, sb.st_ino)) {
            if (fd >= 0)
                close(fd);
            free(cuts);
            qcal_onnx_model_destroy(&m);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        lc->map_taken = true;
    }
    for (size_t q = 0; q < ncuts; q++) {
        Onnx__TensorProto *t = mp->graph->initializer[cuts[q].k];
        free(t->raw_data.data);   /* nothing: the shell has no raw_data there */
        if (lc->map_taken) {
            t->raw_data.data = (uint8_t *)(uintptr_t)(p + cuts[q].ds);
        } else {
            t->raw_data.data = malloc(cuts[q].dl);
            if (!t->raw_data.data) {
                free(cuts);
                t->raw_data.len = 0;
                qcal_onnx_model_destroy(&m);
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for %zu bytes", cuts[q].dl);
            }
            memcpy(t->raw_data.data, p + cuts[q].ds, cuts[q].dl);
        }
        t->raw_data.len = cuts[q].dl;
        t->has_raw_data = 1;
    }
    free(cuts);
    if (!mp->graph) {
        qcal_onnx_model_destroy(&m);
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is not an ONNX model: it has no graph", what);
    }
    scope sc = { { 0 }, what };
    st = check_graph(lc, &sc, mp->graph, 0);
    onnx_map_free(&sc.defined);
    if (st != QCAL_OK) {
        st = qcal_error(st, "'%s': %s", what, qcal_last_error());
        qcal_onnx_model_destroy(&m);   /* detaches and unmaps what it holds */
        return st;
    }
    *out = m;
    return QCAL_OK;
}

qcal_status qcal_onnx_model_parse(const void *buf, size_t len, qcal_onnx_model **out)
{
    if ((!buf && len) || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_parse: NULL argument");
    load_ctx lc = { NULL, -1, NULL, 0, false, NULL, NULL, NULL };
    return model_from_bytes(&lc, buf, len, out);
}

qcal_status qcal_onnx_model_load(const char *path, qcal_onnx_model **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_load: NULL argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return qcal_error(e == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO, "cannot open '%s': %s", path,
                          strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return qcal_error(QCAL_ERR_IO, "'%s' is not a regular file", path);
    }
    load_ctx lc = { path, fd, NULL, 0, false, NULL, NULL, NULL };
    const char *slash = strrchr(path, '/');
    lc.dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    lc.dir_real = lc.dir ? realpath(lc.dir, NULL) : NULL;
    if (!lc.dir || !lc.dir_real) {
        close(fd);
        free(lc.dir);
        return qcal_error(QCAL_ERR_IO, "cannot resolve the directory of '%s'", path);
    }
    qcal_status st;
    if (sb.st_size == 0) {
        st = model_from_bytes(&lc, NULL, 0, out);
    } else {
        /* Mapped without MAP_POPULATE: the large initializers are never read unless a pass
         * needs them (a save copies them file to file). */
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            st = qcal_error(QCAL_ERR_IO, "cannot map '%s': %s", path, strerror(e));
        } else {
            lc.map = map;
            lc.map_len = (size_t)sb.st_size;
            st = model_from_bytes(&lc, map, (size_t)sb.st_size, out);
            if (!lc.map_taken)
                munmap(map, (size_t)sb.st_size);
        }
    }
    close(fd);
    free(lc.dir);
    free(lc.dir_real);
    return st;
}

void qcal_onnx_model_destroy(qcal_onnx_model **m)
{
    if (!m || !*m)
        return;
    if ((*m)->proto) {
        detach_all(*m);
        protobuf_c_message_free_unpacked(&(*m)->proto->base, NULL);
    }
    for (size_t i = 0; i < (*m)->n_src; i++) {
        if ((*m)->src[i].fd >= 0)
            close((*m)->src[i].fd);
        munmap((void *)(uintptr_t)(*m)->src[i].map, (*m)->src[i].len);
    }
    free((*m)->src);
    free(*m);
    *m = NULL;
}

/* ---- save ---- */

void qcal_onnx_save_options_default(qcal_onnx_save_options *opt)
{
    opt->external_threshold = (UINT64_C(1) << 31) - (UINT64_C(1) << 20);
    opt->external_min_bytes = 1024;
}

/* Starts the writeback of a file's written bytes from a thread of its own, so that the
 * kernel's work of submitting them (ext4_writepages: 12% of `qdq --profile tensorrt`'s CPU
 * when called inline) runs beside the writing instead of between its writes. */
typedef struct writeback {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    uint64_t target;     /* bytes written and flushed so far (guarded by mu) */
    bool stop;           /* guarded by mu */
    bool running;
} writeback;

static void *writeback_main(void *arg)
{
    writeback *w = arg;
    uint64_t done = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->target == done && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->target == done)
            break;   /* stopped, nothing left */
        uint64_t to = w->target;
        pthread_mutex_unlock(&w->mu);
        (void)sync_file_range(w->fd, (off64_t)done, (off64_t)(to - done), SYNC_FILE_RANGE_WRITE);
        done = to;
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Starts the thread for a regular file (else, or when a thread cannot be made, the sink
 * starts the writeback itself). All signals are blocked in the thread. */
static void writeback_start(writeback *w, int fd)
{
    memset(w, 0, sizeof *w);
    w->fd = fd;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        return;
    if (pthread_cond_init(&w->cv, NULL) != 0) {
        pthread_mutex_destroy(&w->mu);
        return;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    w->running = pthread_create(&w->th, NULL, writeback_main, w) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!w->running) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
}

static void writeback_post(writeback *w, uint64_t written)
{
    pthread_mutex_lock(&w->mu);
    w->target = written;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Lets the thread start what was posted last, then joins it. */
static void writeback_stop(writeback *w)
{
    if (!w->running)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->running = false;
}

typedef struct file_sink {
    ProtobufCBuffer base;
    FILE *fp;
    bool failed;
    uint64_t written;
    uint64_t kicked;     /* bytes handed to the kernel's writeback so far */
    const qcal_onnx_model *m;
    bool no_copy_range;  /* copy_file_range refused once: write everything */
    uint8_t *bounce;     /* SINK_BOUNCE + 8 KiB, or NULL (blobs then go through stdio) */
    writeback *wb;       /* the writeback thread, or NULL */
    struct lazy_set *lz; /* the save's lazy initializers */
} file_sink;

/* The lazy initializers of a save, found by the address of their bytes: protobuf-c appends a
 * bytes field's data as it lies, so the append that starts with raw_data.data is the
 * writer reaching that tensor. */
typedef struct lazy_slot {
    const uint8_t *data;       /* the tensor's raw_data when the save started */
    size_t i;                  /* its onnx_lazy */
} lazy_slot;

typedef struct lazy_set {
    const onnx_lazy *lazy;
    lazy_slot *slot;           /* n, sorted by data */
    bool *filled;              /* n, by onnx_lazy */
    size_t n, n_filled;
    qcal_status st;            /* the first failed fill (QCAL_OK: none) */
    char msg[1024];            /* its message */
} lazy_set;

static int cmp_slot(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const lazy_slot *)a)->data, y = (uintptr_t)((const lazy_slot *)b)->data;
    return x < y ? -1 : x > y;
}

static qcal_status lazy_set_init(lazy_set *z, const onnx_lazy *lazy, size_t n)
{
    memset(z, 0, sizeof *z);
    z->lazy = lazy;
    z->n = n;
    if (!n)
        return QCAL_OK;
    z->slot = malloc(n * sizeof *z->slot);
    z->filled = calloc(n, sizeof *z->filled);
    if (!z->slot || !z->filled)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const Onnx__TensorProto *t = lazy[i].t;
        if (!t || !lazy[i].fill || !t->raw_data.data || !t->raw_data.len)
            return qcal_error(QCAL_ERR_INVALID_ARG, "lazy initializer %zu has no bytes to fill", i);
        z->slot[i] = (lazy_slot){ t->raw_data.data, i };
    }
    qsort(z->slot, n, sizeof *z->slot, cmp_slot);
    for (size_t i = 1; i < n; i++)
        if (z->slot[i].data == z->slot[i - 1].data)
            return qcal_error(QCAL_ERR_INVALID_ARG, "two lazy initializers share their bytes");
    return QCAL_OK;
}

static void lazy_set_free(lazy_set *z)
{
    free(z->slot);
    free(z->filled);
}

/* Before an append of data: when data starts a lazy initializer not filled yet, its fill;
 * false when that failed (the sink has failed, z->st and z->msg say why). */
static bool lazy_reach(file_sink *s, const uint8_t *data)
{
    lazy_set *z = s->lz;
    size_t lo = 0, hi = z->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)z->slot[mid].data < (uintptr_t)data)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == z->n || z->slot[lo].data != data || z->filled[z->slot[lo].i])
        return true;
    const onnx_lazy *l = &z->lazy[z->slot[lo].i];
    qcal_status st = l->fill(l->ctx, l->t);
    if (st != QCAL_OK) {
        if (z->st == QCAL_OK) {
            z->st = st;
            snprintf(z->msg, sizeof z->msg, "%s", qcal_last_error());
        }
        s->failed = true;
        return false;
    }
    z->filled[z->slot[lo].i] = true;
    z->n_filled++;
    return true;
}

/* Size of the buffer large in-memory blobs are written through (see write_bounced). */
#define SINK_BOUNCE ((size_t)1 << 20)

/* Copies a blob from the source file to the output in the kernel (no pass through this
 * process's memory), at the output's current offset; false when the kernel refuses (a pipe,
 * another file system on old kernels): the caller writes the bytes instead. */
static bool copy_blob(file_sink *s, const uint8_t *data, size_t len)
{
    const onnx_src *src = onnx_src_of(s->m, data);
    if (!src || src->fd < 0)
        return false;
    if (fflush(s->fp) != 0) {
        s->failed = true;
        return true;
    }
    int fd = fileno(s->fp);
    loff_t in = (loff_t)(data - src->map);
    size_t done = 0;
    while (done < len) {
        ssize_t r = copy_file_range(src->fd, &in, fd, NULL, len - done, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (done == 0) {
                s->no_copy_range = true;
                return false;
            }
            s->failed = true;   /* part copied, then an error: give up on this output */
            return true;
        }
        done += (size_t)r;
    }
    return true;
}

#define SINK_KICK (UINT64_C(32) << 20)

/* Writes a large blob from this process's memory through the bounce buffer, 1 MiB at a time,
 * each piece placed at the file offset's position in its page: the kernel's copy into the
 * page cache then reads a buffer in cache, page-aligned with its target. On this project's VM
 * (AMD Zen 3), qdq of the 1 GiB bench model (0.25 GiB of int8 weights written) took medians of
 * 0.91-1.31 s of CPU writing straight from the weights' buffers and 0.80-0.88 s through a
 * 1 MiB buffer (three series of 6-12 interleaved runs). */
static void write_bounced(file_sink *s, const uint8_t *data, size_t len)
{
    if (fflush(s->fp) != 0) {
        s->failed = true;
        return;
    }
    int fd = fileno(s->fp);
    uint8_t *page = (uint8_t *)(((uintptr_t)s->bounce + 4095) & ~(uintptr_t)4095);
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < SINK_BOUNCE ? len - done : SINK_BOUNCE;
        uint8_t *b = page + ((s->written + done) & 4095);
        copy_vec(b, data + done, n);
        size_t put = 0;
        while (put < n) {
            ssize_t r = write(fd, b + put, n - put);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                s->failed = true;
                return;
            }
            put += (size_t)r;
        }
        done += n;
    }
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    file_sink *s = (file_sink *)b;
    if (s->failed || !len)
        return;
    if (s->lz->n && !lazy_reach(s, data))
        return;
    bool big = len >= ONNX_BLOB_MIN;
    bool in_map = big && !s->no_copy_range && onnx_in_map(s->m, data);
    if (!in_map || !copy_blob(s, data, len)) {
        if (big && s->bounce)
            write_bounced(s, data, len);
        else if (fwrite(data, 1, len, s->fp) != len)
            s->failed = true;
    }
    s->written += len;
    /* Start the writeback of every 32 MiB written (asynchronously), so the final fsync of
     * the atomic commit waits for the tail only, as a copy's background writeback would. */
    if (s->written - s->kicked >= SINK_KICK && fflush(s->fp) == 0) {
        int fd = fileno(s->fp);
        struct stat st;
        if (s->wb && s->wb->running)
            writeback_post(s->wb, s->written);
        else if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
            sync_file_range(fd, (off64_t)s->kicked, (off64_t)(s->written - s->kicked),
                            SYNC_FILE_RANGE_WRITE);
        s->kicked = s->written;
    }
}

/* One initializer moved to external data during a save, restored afterwards. */
typedef struct moved {
    Onnx__TensorProto *t;
    ProtobufCBinaryData raw;
    protobuf_c_boolean has_raw;
} moved;

static void restore_moved(moved *mv, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Onnx__TensorProto *t = mv[i].t;
        for (size_t k = 0; k < t->n_external_data; k++)
            protobuf_c_message_free_unpacked(&t->external_data[k]->base, NULL);
        free(t->external_data);
        t->external_data = NULL;
        t->n_external_data = 0;
        t->has_data_location = 0;
        t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
        t->raw_data = mv[i].raw;
        t->has_raw_data = mv[i].has_raw;
    }
}

static bool add_entry(Onnx__TensorProto *t, const char *key, const char *value)
{
    Onnx__StringStringEntryProto *e = malloc(sizeof *e);
    if (!e)
        return false;
    onnx__string_string_entry_proto__init(e);
    e->key = onnx_strdup(key);
    e->value = onnx_strdup(value);
    if (!e->key || !e->value || !onnx_push((void ***)&t->external_data, &t->n_external_data, e)) {
        protobuf_c_message_free_unpacked(&e->base, NULL);
        return false;
    }
    return true;
}

qcal_status qcal_onnx_model_save(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path)
{
    return onnx_model_save_lazy(m, opt, path, NULL, 0);
}

qcal_status onnx_model_save_lazy(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path,
                                 const onnx_lazy *lazy, size_t n_lazy)
{
    if (!m || !path || (n_lazy && !lazy))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_save: NULL argument");
    qcal_onnx_save_options o;
    qcal_onnx_save_options_default(&o);
    if (opt)
        o = *opt;
    Onnx__GraphProto *g = m->proto->graph;
    size_t size = protobuf_c_message_get_packed_size(&m->proto->base);
    moved *mv = NULL;
    size_t nmv = 0;
    qcal_status st = QCAL_OK;
    qcal_atomic_file data_file = { 0 };
    char *data_path = NULL;
    file_sink dsink;
    uint8_t *bounce = malloc(SINK_BOUNCE + 8192);   /* NULL: blobs go through stdio */
    lazy_set lz;
    if ((st = lazy_set_init(&lz, lazy, n_lazy)) != QCAL_OK)
        goto out;
    if (size > o.external_threshold) {
        /* External data: large raw initializers go to PATH.data (offsets 64-byte aligned). */
        size_t pl = strlen(path);
        data_path = malloc(pl + 6);
        mv = calloc(g->n_initializer ? g->n_initializer : 1, sizeof *mv);
        if (!data_path || !mv) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        snprintf(data_path, pl + 6, "%s.data", path);
        const char *base = strrchr(data_path, '/');
        base = base ? base + 1 : data_path;
        if ((st = qcal_atomic_file_open(&data_file, data_path)) != QCAL_OK)
            goto out;
        uint64_t total = 0;   /* what the loop below writes */
        for (size_t i = 0; i < g->n_initializer; i++) {
            const Onnx__TensorProto *t = g->initializer[i];
            if (t->raw_data.len && t->raw_data.len >= o.external_min_bytes)
                total += (64 - total % 64) % 64 + t->raw_data.len;
        }
        if ((st = qcal_atomic_file_reserve(&data_file, total)) != QCAL_OK)
            goto out;
        uint64_t off = 0;
        static const uint8_t zeros[64];
        dsink = (file_sink){ { sink_append }, data_file.fp, false, 0, 0, m, false, bounce, NULL, &lz };
        for (size_t i = 0; i < g->n_initializer; i++) {
            Onnx__TensorProto *t = g->initializer[i];
            if (!t->raw_data.len || t->raw_data.len < o.external_min_bytes)
                continue;
            size_t pad = (size_t)((64 - off % 64) % 64);
            sink_append(&dsink.base, pad, zeros);
            off += pad;
            sink_append(&dsink.base, t->raw_data.len, t->raw_data.data);
            if (dsink.failed)
                break;
            char ob[32], lb[32];
            snprintf(ob, sizeof ob, "%llu", (unsigned long long)off);
            snprintf(lb, sizeof lb, "%zu", t->raw_data.len);
            mv[nmv].t = t;
            mv[nmv].raw = t->raw_data;
            mv[nmv].has_raw = t->has_raw_data;
            nmv++;
            off += t->raw_data.len;
            t->raw_data.data = NULL;
            t->raw_data.len = 0;
            t->has_raw_data = 0;
            t->has_data_location = 1;
            t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
            if (!add_entry(t, "location", base) || !add_entry(t, "offset", ob) ||
                !add_entry(t, "length", lb)) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto out;
            }
        }
        if (lz.st != QCAL_OK) {
            st = qcal_error(lz.st, "%s", lz.msg);
            goto out;
        }
        if (dsink.failed || ferror(data_file.fp)) {
            st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", data_path, strerror(errno));
            goto out;
        }
        size = protobuf_c_message_get_packed_size(&m->proto->base);
        if (size > (UINT64_C(1) << 31) - 1) {
            st = qcal_error(QCAL_ERR_OVERFLOW,
                            "'%s': the model is %zu bytes even with its large initializers external (protobuf's limit is 2 GiB)",
                            path, size);
            goto out;
        }
    }
    qcal_atomic_file f;
    if ((st = qcal_atomic_file_open(&f, path)) != QCAL_OK)
        goto out;
    if ((st = qcal_atomic_file_reserve(&f, size)) != QCAL_OK) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    setvbuf(f.fp, NULL, _IOFBF, 1 << 20);
    writeback wb;
    writeback_start(&wb, fileno(f.fp));
    file_sink sink = { { sink_append }, f.fp, false, 0, 0, m, false, bounce, &wb, &lz };
    protobuf_c_message_pack_to_buffer(&m->proto->base, &sink.base);
    writeback_stop(&wb);
    /* Each lazy initializer must have reached a sink as itself (filled there): bytes copied
     * elsewhere first would have been written before they were final. */
    if (lz.st != QCAL_OK || (!sink.failed && lz.n_filled != lz.n)) {
        qcal_atomic_file_abort(&f);
        st = lz.st != QCAL_OK ? qcal_error(lz.st, "%s", lz.msg)
                              : qcal_error(QCAL_ERR_STATE, "'%s': %zu of %zu lazy initializers were written unfilled",
                                           path, lz.n - lz.n_filled, lz.n);
        goto out;
    }
    if (sink.failed || sink.written != size) {
        int e = errno;
        qcal_atomic_file_abort(&f);
        st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e));
        goto out;
    }
    /* Both files written and synced before either is renamed into place. */
    if ((st = qcal_atomic_file_flush(&f)) != QCAL_OK ||
        (data_path && (st = qcal_atomic_file_flush(&data_file)) != QCAL_OK)) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    if (data_path && (st = qcal_atomic_file_commit(&data_file)) != QCAL_OK) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    st = qcal_atomic_file_commit(&f);
out:
    qcal_atomic_file_abort(&data_file);
    restore_moved(mv, nmv);
    free(mv);
    free(data_path);
    free(bounce);
    lazy_set_free(&lz);
    return st;
}

qcal_status qcal_onnx_model_serialize(const qcal_onnx_model *m, void **buf, size_t *len)
{
    if (!m || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_serialize: NULL argument");
    size_t size = protobuf_c_message_get_packed_size(&m->proto->base);
    if (size > (UINT64_C(1) << 31) - 1)
        return qcal_error(QCAL_ERR_OVERFLOW, "the model is %zu bytes, over protobuf's 2 GiB", size);
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for %zu bytes", size);
    protobuf_c_message_pack(&m->proto->base, b);
    *buf = b;
    *len = size;
    return QCAL_OK;
}

/* ---- inspection ---- */

qcal_status qcal_onnx_model_get_info(const qcal_onnx_model *m, qcal_onnx_model_info *info)
{
    if (!m || !info)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_get_info: NULL argument");
    const Onnx__ModelProto *mp = m->proto;
    info->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    info->opset = onnx_model_opset(mp);
    info->nodes = (int64_t)mp->graph->n_node;
    info->initializers = (int64_t)mp->graph->n_initializer;
    info->inputs = (int64_t)mp->graph->n_input;
    info->outputs = (int64_t)mp->graph->n_output;
    return QCAL_OK;
}

static const char empty_str[] = "";

qcal_status qcal_onnx_node_at(const qcal_onnx_model *m, int64_t i, qcal_onnx_node_info *out)
{
    if (!m || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_node_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_node)
        return qcal_error(QCAL_ERR_INVALID_ARG, "node index %lld out of range [0, %zu)", (long long)i,
                          g->n_node);
    const Onnx__NodeProto *n = g->node[i];
    out->name = n->name ? n->name : empty_str;
    out->op_type = n->op_type;
    out->domain = n->domain ? n->domain : empty_str;
    out->n_inputs = (int64_t)n->n_input;
    out->n_outputs = (int64_t)n->n_output;
    out->inputs = (const char *const *)n->input;
    out->outputs = (const char *const *)n->output;
    return QCAL_OK;
}

qcal_status qcal_onnx_input_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    if (!m || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_input_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_input)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input index %lld out of range", (long long)i);
    *name = str_or_empty(g->input[i]->name);
    return QCAL_OK;
}

qcal_status qcal_onnx_output_at(const qcal_onnx_model *m, int64_t i, const char **name)
{
    if (!m || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_output_at: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_output)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output index %lld out of range", (long long)i);
    *name = str_or_empty(g->output[i]->name);
    return QCAL_OK;
}

qcal_status qcal_onnx_node_attr_int(const qcal_onnx_model *m, int64_t i, const char *attr, int64_t *value)
{
    if (!m || !attr || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_node_attr_int: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    if (i < 0 || (size_t)i >= g->n_node)
        return qcal_error(QCAL_ERR_INVALID_ARG, "node index %lld out of range", (long long)i);
    const Onnx__AttributeProto *a = onnx_node_attr(g->node[i], attr);
    if (!a || !a->has_i)
        return qcal_error(QCAL_ERR_NOT_FOUND, "node %lld has no integer attribute '%s'", (long long)i, attr);
    *value = a->i;
    return QCAL_OK;
}

static void desc_from_type(const Onnx__TypeProto *tp, qcal_onnx_tensor_desc *d)
{
    d->elem_type = 0;
    d->ndim = -1;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return;
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    d->elem_type = tt->has_elem_type ? tt->elem_type : 0;
    if (!tt->shape || tt->shape->n_dim > QCAL_MAX_DIMS)
        return;
    d->ndim = (int32_t)tt->shape->n_dim;
    for (size_t k = 0; k < tt->shape->n_dim; k++) {
        const Onnx__TensorShapeProto__Dimension *dm = tt->shape->dim[k];
        d->dims[k] = dm->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
                             dm->dim_value >= 0
                         ? dm->dim_value
                         : -1;
    }
}

static const Onnx__ValueInfoProto *find_vi(Onnx__ValueInfoProto **v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (v[i]->name && !strcmp(v[i]->name, name))
            return v[i];
    return NULL;
}

bool onnx_graph_desc(const Onnx__GraphProto *g, const char *name, qcal_onnx_tensor_desc *desc)
{
    const Onnx__ValueInfoProto *vi = find_vi(g->input, g->n_input, name);
    if (!vi)
        vi = find_vi(g->output, g->n_output, name);
    if (!vi)
        vi = find_vi(g->value_info, g->n_value_info, name);
    if (vi && vi->type) {
        desc_from_type(vi->type, desc);
        if (desc->elem_type)
            return true;
    }
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        if (t->name && !strcmp(t->name, name)) {
            desc->elem_type = t->data_type;
            desc->ndim = t->n_dims <= QCAL_MAX_DIMS ? (int32_t)t->n_dims : -1;
            for (size_t k = 0; k < t->n_dims && k < QCAL_MAX_DIMS; k++)
                desc->dims[k] = t->dims[k];
            return true;
        }
    }
    return vi != NULL;
}

qcal_status qcal_onnx_tensor_get_desc(const qcal_onnx_model *m, const char *name, qcal_onnx_tensor_desc *out)
{
    if (!m || !name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_tensor_get_desc: NULL argument");
    qcal_onnx_tensor_desc d = { 0, -1, { 0 } };
    if (!onnx_graph_desc(m->proto->graph, name, &d))
        return qcal_error(QCAL_ERR_NOT_FOUND, "the graph declares nothing for '%s'", name);
    *out = d;
    return QCAL_OK;
}

static const Onnx__TensorProto *find_init(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name))
            return g->initializer[i];
    return NULL;
}

static void desc_of_tensor(const Onnx__TensorProto *t, qcal_onnx_tensor_desc *d)
{
    d->elem_type = t->data_type;
    d->ndim = t->n_dims <= QCAL_MAX_DIMS ? (int32_t)t->n_dims : -1;
    for (size_t k = 0; k < t->n_dims && k < QCAL_MAX_DIMS; k++)
        d->dims[k] = t->dims[k];
}

qcal_status qcal_onnx_initializer_float(const qcal_onnx_model *m, const char *name, float **data,
                                        qcal_onnx_tensor_desc *desc)
{
    if (!m || !name || !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_float: NULL argument");
    const Onnx__TensorProto *t = find_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    int64_t n;
    qcal_status st = onnx_tensor_to_float(t, data, &n);
    if (st == QCAL_OK && desc)
        desc_of_tensor(t, desc);
    return st;
}

qcal_status qcal_onnx_initializer_int64(const qcal_onnx_model *m, const char *name, int64_t **data,
                                        qcal_onnx_tensor_desc *desc)
{
    if (!m || !name || !data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_int64: NULL argument");
    const Onnx__TensorProto *t = find_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    int type = t->data_type;
    if (!(type == 2 || type == 3 || type == 4 || type == 5 || type == 6 || type == 7 || type == 9 ||
          type == 12 || type == 13))
        return qcal_error(QCAL_ERR_UNSUPPORTED, "initializer '%s' is of element type %d, not an integer type",
                          name, type);
    const uint8_t *p;
    size_t len;
    void *owned;
    qcal_status st = onnx_tensor_bytes(t, &p, &len, &owned);
    if (st != QCAL_OK)
        return st;
    size_t es = onnx_elem_size(type), n = len / es;
    int64_t *v = malloc(n * sizeof *v + 1);
    if (!v) {
        free(owned);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *q = p + i * es;
        switch (type) {
        case 2: case 9: v[i] = q[0]; break;
        case 3: v[i] = (int8_t)q[0]; break;
        case 4: { uint16_t x; memcpy(&x, q, 2); v[i] = x; break; }
        case 5: { int16_t x; memcpy(&x, q, 2); v[i] = x; break; }
        case 6: { int32_t x; memcpy(&x, q, 4); v[i] = x; break; }
        case 12: { uint32_t x; memcpy(&x, q, 4); v[i] = x; break; }
        default: memcpy(&v[i], q, 8); break;
        }
    }
    free(owned);
    *data = v;
    if (desc)
        desc_of_tensor(t, desc);
    return QCAL_OK;
}

/* ---- builder ---- */

Onnx__TensorProto *onnx_new_tensor(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                                   const void *data, size_t nbytes)
{
    Onnx__TensorProto *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    onnx__tensor_proto__init(t);
    t->name = onnx_strdup(name);
    t->has_data_type = 1;
    t->data_type = type;
    t->n_dims = (size_t)(ndim > 0 ? ndim : 0);
    t->dims = t->n_dims ? malloc(t->n_dims * sizeof *t->dims) : NULL;
    t->raw_data.data = malloc(nbytes ? nbytes : 1);
    t->raw_data.len = nbytes;
    t->has_raw_data = 1;
    if (!t->name || (t->n_dims && !t->dims) || !t->raw_data.data) {
        protobuf_c_message_free_unpacked(&t->base, NULL);
        return NULL;
    }
    if (t->n_dims)
        memcpy(t->dims, dims, t->n_dims * sizeof *t->dims);
    if (nbytes && data)
        memcpy(t->raw_data.data, data, nbytes);
    return t;
}

Onnx__TensorProto *onnx_new_tensor_take(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                                        void *data, size_t nbytes)
{
    Onnx__TensorProto *t = onnx_new_tensor(name, type, ndim, dims, NULL, 0);
    if (!t)
        return NULL;
    free(t->raw_data.data);
    t->raw_data.data = data;
    t->raw_data.len = nbytes;
    return t;
}

Onnx__NodeProto *onnx_new_node(const char *op_type, const char *name, int64_t n_in,
                               const char *const *in, int64_t n_out, const char *const *out)
{
    Onnx__NodeProto *n = malloc(sizeof *n);
    if (!n)
        return NULL;
    onnx__node_proto__init(n);
    n->op_type = onnx_strdup(op_type);
    n->name = name ? onnx_strdup(name) : NULL;
    n->input = calloc((size_t)n_in + 1, sizeof *n->input);
    n->output = calloc((size_t)n_out + 1, sizeof *n->output);
    bool ok = n->op_type && (!name || n->name) && n->input && n->output;
    for (int64_t i = 0; ok && i < n_in; i++) {
        n->input[i] = onnx_strdup(in[i] ? in[i] : "");
        ok = n->input[i] != NULL;
        n->n_input = (size_t)i + (ok ? 1 : 0);
    }
    for (int64_t i = 0; ok && i < n_out; i++) {
        n->output[i] = onnx_strdup(out[i]);
        ok = n->output[i] != NULL;
        n->n_output = (size_t)i + (ok ? 1 : 0);
    }
    if (!ok) {
        protobuf_c_message_free_unpacked(&n->base, NULL);
        return NULL;
    }
    return n;
}

static Onnx__AttributeProto *new_attr(Onnx__NodeProto *n, const char *name,
                                      Onnx__AttributeProto__AttributeType type)
{
    Onnx__AttributeProto *a = malloc(sizeof *a);
    if (!a)
        return NULL;
    onnx__attribute_proto__init(a);
    a->name = onnx_strdup(name);
    a->has_type = 1;
    a->type = type;
    if (!a->name || !onnx_push((void ***)&n->attribute, &n->n_attribute, a)) {
        protobuf_c_message_free_unpacked(&a->base, NULL);
        return NULL;
    }
    return a;
}

bool onnx_node_add_int(Onnx__NodeProto *n, const char *attr, int64_t v)
{
    Onnx__AttributeProto *a = new_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (!a)
        return false;
    a->has_i = 1;
    a->i = v;
    return true;
}

static Onnx__TypeProto *new_tensor_type(const qcal_onnx_tensor_desc *d)
{
    Onnx__TypeProto *tp = malloc(sizeof *tp);
    if (!tp)
        return NULL;
    onnx__type_proto__init(tp);
    Onnx__TypeProto__Tensor *tt = malloc(sizeof *tt);
    if (!tt) {
        free(tp);
        return NULL;
    }
    onnx__type_proto__tensor__init(tt);
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = d->elem_type ? d->elem_type : QCAL_ONNX_FLOAT;
    if (d->ndim >= 0) {
        Onnx__TensorShapeProto *sh = malloc(sizeof *sh);
        if (!sh)
            goto fail;
        onnx__tensor_shape_proto__init(sh);
        tt->shape = sh;
        for (int32_t k = 0; k < d->ndim; k++) {
            Onnx__TensorShapeProto__Dimension *dm = malloc(sizeof *dm);
            if (!dm)
                goto fail;
            onnx__tensor_shape_proto__dimension__init(dm);
            if (!onnx_push((void ***)&sh->dim, &sh->n_dim, dm)) {
                free(dm);
                goto fail;
            }
            if (d->dims[k] >= 0) {
                dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                dm->dim_value = d->dims[k];
            } else {
                char p[24];
                snprintf(p, sizeof p, "d%d", (int)k);
                dm->dim_param = onnx_strdup(p);
                if (!dm->dim_param)
                    goto fail;
                dm->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            }
        }
    }
    return tp;
fail:
    protobuf_c_message_free_unpacked(&tp->base, NULL);
    return NULL;
}

Onnx__ValueInfoProto *onnx_new_value_info(const char *name, const qcal_onnx_tensor_desc *desc)
{
    Onnx__ValueInfoProto *vi = malloc(sizeof *vi);
    if (!vi)
        return NULL;
    onnx__value_info_proto__init(vi);
    vi->name = onnx_strdup(name);
    vi->type = new_tensor_type(desc);
    if (!vi->name || !vi->type) {
        protobuf_c_message_free_unpacked(&vi->base, NULL);
        return NULL;
    }
    return vi;
}

qcal_status qcal_onnx_model_new(int64_t ir_version, int64_t opset, qcal_onnx_model **out)
{
    if (!out || ir_version < 1 || opset < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_new: bad argument (ir_version %lld, opset %lld)",
                          (long long)ir_version, (long long)opset);
    qcal_onnx_model *m = calloc(1, sizeof *m);   /* no file, no mapping */
    Onnx__ModelProto *mp = malloc(sizeof *mp);
    Onnx__GraphProto *g = malloc(sizeof *g);
    Onnx__OperatorSetIdProto *os = malloc(sizeof *os);
    if (!m || !mp || !g || !os) {
        free(m);
        free(mp);
        free(g);
        free(os);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    onnx__model_proto__init(mp);
    onnx__graph_proto__init(g);
    onnx__operator_set_id_proto__init(os);
    mp->graph = g;
    m->proto = mp;
    mp->has_ir_version = 1;
    mp->ir_version = ir_version;
    os->domain = onnx_strdup("");
    os->has_version = 1;
    os->version = opset;
    mp->producer_name = onnx_strdup("qcal");
    mp->producer_version = onnx_strdup(qcal_version());
    g->name = onnx_strdup("qcal");
    if (!os->domain || !mp->producer_name || !mp->producer_version || !g->name ||
        !onnx_push((void ***)&mp->opset_import, &mp->n_opset_import, os)) {
        if (mp->n_opset_import == 0)
            protobuf_c_message_free_unpacked(&os->base, NULL);
        qcal_onnx_model_destroy(&m);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    *out = m;
    return QCAL_OK;
}

static qcal_status add_vi(qcal_onnx_model *m, Onnx__ValueInfoProto ***arr, size_t *n, const char *name,
                          int32_t elem_type, int32_t ndim, const int64_t *dims)
{
    if (!m || !name || ndim > QCAL_MAX_DIMS || (ndim > 0 && !dims))
        return qcal_error(QCAL_ERR_INVALID_ARG, "bad value info for '%s'", name ? name : "(null)");
    qcal_onnx_tensor_desc d = { elem_type, ndim < 0 ? -1 : ndim, { 0 } };
    for (int32_t k = 0; k < ndim; k++)
        d.dims[k] = dims[k];
    Onnx__ValueInfoProto *vi = onnx_new_value_info(name, &d);
    if (!vi || !onnx_push((void ***)arr, n, vi)) {
        if (vi)
            protobuf_c_message_free_unpacked(&vi->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    return QCAL_OK;
}

qcal_status qcal_onnx_add_input(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim,
                                const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->input, &m->proto->graph->n_input, name, elem_type, ndim, dims);
}

qcal_status qcal_onnx_add_output(qcal_onnx_model *m, const char *name, int32_t elem_type, int32_t ndim,
                                 const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->output, &m->proto->graph->n_output, name, elem_type, ndim, dims);
}

qcal_status qcal_onnx_add_value_info(qcal_onnx_model *m, const char *name, int32_t elem_type,
                                     int32_t ndim, const int64_t *dims)
{
    if (!m)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model");
    return add_vi(m, &m->proto->graph->value_info, &m->proto->graph->n_value_info, name, elem_type,
                  ndim, dims);
}

qcal_status qcal_onnx_add_initializer(qcal_onnx_model *m, const char *name, int32_t elem_type,
                                      int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    if (!m || !name || ndim < 0 || (ndim > 0 && !dims) || (nbytes && !data))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_add_initializer: bad argument");
    Onnx__TensorProto *t = onnx_new_tensor(name, elem_type, ndim, dims, data, nbytes);
    Onnx__GraphProto *g = m->proto->graph;
    if (!t || !onnx_push((void ***)&g->initializer, &g->n_initializer, t)) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for initializer '%s'", name);
    }
    return QCAL_OK;
}

static qcal_status numel_of(int32_t ndim, const int64_t *dims, int64_t *n)
{
    int64_t v = 1;
    for (int32_t k = 0; k < ndim; k++)
        if (dims[k] < 0 || !qcal_mul_i64(v, dims[k], &v) || v > INT64_MAX / 8)
            return qcal_error(QCAL_ERR_INVALID_ARG, "bad shape");
    *n = v;
    return QCAL_OK;
}

qcal_status qcal_onnx_add_initializer_float(qcal_onnx_model *m, const char *name, int32_t ndim,
                                            const int64_t *dims, const float *data)
{
    int64_t n = 0;
    if (ndim < 0 || (ndim > 0 && !dims) || numel_of(ndim, dims, &n) != QCAL_OK)
        return qcal_error(QCAL_ERR_INVALID_ARG, "initializer '%s': bad shape", name ? name : "");
    return qcal_onnx_add_initializer(m, name, QCAL_ONNX_FLOAT, ndim, dims, data, (size_t)n * 4);
}

qcal_status qcal_onnx_add_initializer_int64(qcal_onnx_model *m, const char *name, int32_t ndim,
                                            const int64_t *dims, const int64_t *data)
{
    int64_t n = 0;
    if (ndim < 0 || (ndim > 0 && !dims) || numel_of(ndim, dims, &n) != QCAL_OK)
        return qcal_error(QCAL_ERR_INVALID_ARG, "initializer '%s': bad shape", name ? name : "");
    return qcal_onnx_add_initializer(m, name, QCAL_ONNX_INT64, ndim, dims, data, (size_t)n * 8);
}

qcal_status qcal_onnx_initializer_set_external(qcal_onnx_model *m, const char *name, const char *location,
                                               int64_t offset, int64_t length)
{
    if (!m || !name || !location || offset < 0 || length < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_initializer_set_external: bad argument");
    Onnx__TensorProto *t = (Onnx__TensorProto *)find_init(m->proto->graph, name);
    if (!t)
        return qcal_error(QCAL_ERR_NOT_FOUND, "no initializer '%s'", name);
    char ob[32], lb[32];
    snprintf(ob, sizeof ob, "%lld", (long long)offset);
    snprintf(lb, sizeof lb, "%lld", (long long)length);
    if (!add_entry(t, "location", location) || !add_entry(t, "offset", ob) || !add_entry(t, "length", lb))
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    if (onnx_in_map(m, t->raw_data.data))
        onnx_tensor_release(m, t);
    else
        free(t->raw_data.data);
    t->raw_data.data = NULL;
    t->raw_data.len = 0;
    t->has_raw_data = 0;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    return QCAL_OK;
}

qcal_status qcal_onnx_add_node(qcal_onnx_model *m, const char *op_type, const char *name, int64_t n_inputs,
                               const char *const *inputs, int64_t n_outputs, const char *const *outputs,
                               int64_t *index)
{
    if (!m || !op_type || n_inputs < 0 || n_outputs < 0 || (n_inputs && !inputs) || (n_outputs && !outputs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_add_node: bad argument");
    for (int64_t i = 0; i < n_outputs; i++)
        if (!outputs[i])
            return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_add_node: NULL output name");
    Onnx__NodeProto *n = onnx_new_node(op_type, name, n_inputs, inputs, n_outputs, outputs);
    Onnx__GraphProto *g = m->proto->graph;
    if (!n || !onnx_push((void ***)&g->node, &g->n_node, n)) {
        if (n)
            protobuf_c_message_free_unpacked(&n->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    if (index)
        *index = (int64_t)g->n_node - 1;
    return QCAL_OK;
}

static Onnx__NodeProto *node_of(qcal_onnx_model *m, int64_t i)
{
    if (!m || i < 0 || (size_t)i >= m->proto->graph->n_node)
        return NULL;
    return m->proto->graph->node[i];
}

qcal_status qcal_onnx_node_set_int(qcal_onnx_model *m, int64_t node, const char *attr, int64_t value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    return onnx_node_add_int(n, attr, value) ? QCAL_OK : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
}

qcal_status qcal_onnx_node_set_ints(qcal_onnx_model *m, int64_t node, const char *attr, int64_t n,
                                    const int64_t *values)
{
    Onnx__NodeProto *nd = node_of(m, node);
    if (!nd || !attr || n < 0 || (n && !values))
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = new_attr(nd, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->ints = malloc((size_t)n * sizeof *a->ints + 1);
    if (!a->ints)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    if (n)
        memcpy(a->ints, values, (size_t)n * sizeof *a->ints);
    a->n_ints = (size_t)n;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_float(qcal_onnx_model *m, int64_t node, const char *attr, float value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = new_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->has_f = 1;
    a->f = value;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_string(qcal_onnx_model *m, int64_t node, const char *attr, const char *value)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld", (long long)node);
    Onnx__AttributeProto *a = new_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    size_t len = strlen(value);
    a->s.data = malloc(len + 1);
    if (!a->s.data)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    memcpy(a->s.data, value, len);
    a->s.len = len;
    a->has_s = 1;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_tensor(qcal_onnx_model *m, int64_t node, const char *attr, int32_t elem_type,
                                      int32_t ndim, const int64_t *dims, const void *data, size_t nbytes)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || ndim < 0 || ndim > QCAL_MAX_DIMS || (ndim && !dims) || (nbytes && !data))
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld or a bad tensor", (long long)node);
    Onnx__TensorProto *t = onnx_new_tensor("", elem_type, ndim, dims, data, nbytes);
    if (!t)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    Onnx__AttributeProto *a = new_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    if (!a) {
        protobuf_c_message_free_unpacked(&t->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    a->t = t;
    return QCAL_OK;
}

qcal_status qcal_onnx_node_set_graph(qcal_onnx_model *m, int64_t node, const char *attr, qcal_onnx_model **body)
{
    Onnx__NodeProto *n = node_of(m, node);
    if (!n || !attr || !body || !*body)
        return qcal_error(QCAL_ERR_INVALID_ARG, "no node %lld or no body", (long long)node);
    /* Data the body reads from its file mapping is copied: the mapping dies with *body. */
    Onnx__GraphProto *bg = (*body)->proto->graph;
    for (size_t i = 0; bg && (*body)->n_src && i < bg->n_initializer; i++) {
        Onnx__TensorProto *t = bg->initializer[i];
        if (!onnx_in_map(*body, t->raw_data.data))
            continue;
        uint8_t *copy = malloc(t->raw_data.len);
        if (!copy)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for %zu bytes", t->raw_data.len);
        memcpy(copy, t->raw_data.data, t->raw_data.len);
        t->raw_data.data = copy;
    }
    Onnx__AttributeProto *a = new_attr(n, attr, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    if (!a)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    a->g = (*body)->proto->graph;
    (*body)->proto->graph = NULL;
    qcal_onnx_model_destroy(body);
    return QCAL_OK;
}
