/* ONNX models checked as they are read (load.c): every name defined before it is read,
 * single assignment, initializers the size their shape needs, and external data confined to
 * the model's directory and mapped (one mapping per data file). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/load.h"

/* Names in scope while checking a graph: name -> number of live definitions. */
typedef struct scope {
    onnx_map defined;
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
bool onnx_model_add_src(qcal_onnx_model *m, int fd, const uint8_t *map, size_t len, dev_t dev, ino_t ino)
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
    if (!onnx_model_add_src(m, keep, map, (size_t)sb->st_size, sb->st_dev, sb->st_ino)) {
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
    const char *name = onnx_str_or_empty(t->name);
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
    const char *name = onnx_str_or_empty(t->name);
    int64_t numel;
    if (!onnx_tensor_numel(t, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "initializer '%s' has a negative or overflowing shape", name);
    uint64_t bytes;
    bool known = onnx_tensor_expected_bytes(t, numel, &bytes);
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
            st = qcal_error(QCAL_ERR_FORMAT, "node %zu ('%s') has no op_type", i, onnx_str_or_empty(n->name));
            goto done;
        }
        for (size_t k = 0; k < n->n_input; k++) {
            const char *in = n->input[k];
            if (in && in[0] && !scope_has(s, in)) {
                st = qcal_error(QCAL_ERR_FORMAT,
                                "node '%s' (%s) reads '%s', which no graph input, initializer or earlier node defines",
                                onnx_str_or_empty(n->name), n->op_type, in);
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
                                onnx_str_or_empty(n->name), n->op_type, o,
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
                            onnx_str_or_empty(o));
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

qcal_status onnx_check_model(load_ctx *lc, Onnx__GraphProto *g)
{
    scope sc = { { 0 } };
    qcal_status st = check_graph(lc, &sc, g, 0);
    onnx_map_free(&sc.defined);
    return st;
}
