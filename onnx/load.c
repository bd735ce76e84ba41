/* ONNX models read: the file mapped, the wire format walked (varints, nesting depth), the
 * shell (the message without its large raw_data, which stays in the mapping) unpacked by
 * protobuf-c, then checked (check.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/load.h"

bool qcal_onnx_available(void)
{
    return true;
}

/* ---- the wire format: varints, nesting depth ---- */

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

static void detach_all(qcal_onnx_model *m)
{
    if (!m->n_src || !m->proto->graph)
        return;
    for (size_t i = 0; i < m->proto->graph->n_initializer; i++)
        onnx_tensor_release(m, m->proto->graph->initializer[i]);
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
        if (!onnx_model_add_src(m, fd, lc->map, lc->map_len, sb.st_dev, sb.st_ino)) {
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
    st = onnx_check_model(lc, mp->graph);
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

qcal_status qcal_onnx_model_load_file(const char *path, qcal_onnx_model **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_load_file: NULL argument");
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
