/* The graph index (onnx/graph.h): one pass over a graph records every tensor's producer,
 * readers and constant; a second over the nodes' bodies marks the names they read; fresh
 * names are checked against every name of the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"

/* ---- string map ---- */

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

/* ---- the index ---- */

static char *own(onnx_gindex *x, const char *s)
{
    char *c = qcal_strdup(s);
    if (!c || !onnx_push((void ***)&x->owned, (size_t *)&x->nowned, c)) {
        free(c);
        return NULL;
    }
    return c;
}

/* The entry of name, made when absent (NULL: out of memory). */
static onnx_tref *tref_add(onnx_gindex *x, const char *name)
{
    int64_t *v = onnx_map_get(&x->names, name);
    if (v)
        return &x->t[*v];
    if (x->n == x->cap) {
        int64_t cap = x->cap ? x->cap * 2 : 64;
        onnx_tref *t = realloc(x->t, (size_t)cap * sizeof *t);
        if (!t)
            return NULL;
        x->t = t;
        x->cap = cap;
    }
    char *key = own(x, name);
    if (!key || !onnx_map_put(&x->names, key, x->n))
        return NULL;
    onnx_tref *r = &x->t[x->n++];
    memset(r, 0, sizeof *r);
    r->name = key;
    r->producer = -1;
    r->cons0 = -1;
    return r;
}

/* Marks the graph's names a body reads (outer-scope references; conservatively every input
 * of a body's nodes, bodies nested in it included). */
static void mark_sub(onnx_gindex *x, const Onnx__GraphProto *body)
{
    for (size_t i = 0; i < body->n_node; i++) {
        const Onnx__NodeProto *n = body->node[i];
        for (size_t k = 0; k < n->n_input; k++) {
            onnx_tref *r = n->input[k] && n->input[k][0] ? onnx_gindex_get(x, n->input[k]) : NULL;
            if (r)
                r->sub_ref = true;
        }
        for (size_t a = 0; a < n->n_attribute; a++) {
            const Onnx__AttributeProto *at = n->attribute[a];
            if (at->g)
                mark_sub(x, at->g);
            for (size_t k = 0; k < at->n_graphs; k++)
                mark_sub(x, at->graphs[k]);
        }
    }
}

static bool use(onnx_gindex *x, const char *name)
{
    if (!name || !name[0] || onnx_map_get(&x->used, name))
        return true;
    const char *key = onnx_map_get(&x->names, name) ? x->t[*onnx_map_get(&x->names, name)].name : own(x, name);
    return key && onnx_map_put(&x->used, key, 0);
}

/* Every name of g and of the bodies in it into x->used. */
static bool use_all(onnx_gindex *x, const Onnx__GraphProto *g)
{
    bool ok = true;
    for (size_t i = 0; i < g->n_input; i++)
        ok &= use(x, g->input[i]->name);
    for (size_t i = 0; i < g->n_output; i++)
        ok &= use(x, g->output[i]->name);
    for (size_t i = 0; i < g->n_initializer; i++)
        ok &= use(x, g->initializer[i]->name);
    for (size_t i = 0; i < g->n_value_info; i++)
        ok &= use(x, g->value_info[i]->name);
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        ok &= use(x, n->name);
        for (size_t k = 0; k < n->n_input; k++)
            ok &= use(x, n->input[k]);
        for (size_t k = 0; k < n->n_output; k++)
            ok &= use(x, n->output[k]);
        for (size_t a = 0; a < n->n_attribute; a++) {
            const Onnx__AttributeProto *at = n->attribute[a];
            if (at->g)
                ok &= use_all(x, at->g);
            for (size_t k = 0; k < at->n_graphs; k++)
                ok &= use_all(x, at->graphs[k]);
        }
    }
    return ok;
}

Onnx__TensorProto *onnx_constant_value(const Onnx__NodeProto *n)
{
    if (strcmp(n->op_type, "Constant") || (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx")) ||
        n->n_output != 1)
        return NULL;
    const Onnx__AttributeProto *a = onnx_node_attr(n, "value");
    return a && a->t && n->n_attribute == 1 ? a->t : NULL;
}

qcal_status onnx_gindex_build(const Onnx__GraphProto *g, const Onnx__GraphProto *model, onnx_gindex *x)
{
    memset(x, 0, sizeof *x);
    for (size_t i = 0; i < g->n_input; i++) {
        onnx_tref *r = g->input[i]->name ? tref_add(x, g->input[i]->name) : NULL;
        if (g->input[i]->name && !r)
            goto oom;
        if (r)
            r->graph_in = true;
    }
    for (size_t i = 0; i < g->n_initializer; i++) {
        onnx_tref *r = g->initializer[i]->name ? tref_add(x, g->initializer[i]->name) : NULL;
        if (g->initializer[i]->name && !r)
            goto oom;
        if (r)
            r->init = g->initializer[i];
    }
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_input; k++) {
            if (!n->input[k] || !n->input[k][0])
                continue;
            onnx_tref *r = tref_add(x, n->input[k]);
            if (!r)
                goto oom;
            if (r->n_cons++ == 0)
                r->cons0 = (int64_t)i;
        }
        for (size_t k = 0; k < n->n_output; k++) {
            if (!n->output[k] || !n->output[k][0])
                continue;
            onnx_tref *r = tref_add(x, n->output[k]);
            if (!r)
                goto oom;
            r->producer = (int64_t)i;
            /* a Constant's value is a weight like an initializer (paddle2onnx writes them so) */
            if (!r->init)
                r->init = onnx_constant_value(n);
        }
    }
    for (size_t i = 0; i < g->n_output; i++) {
        onnx_tref *r = g->output[i]->name ? tref_add(x, g->output[i]->name) : NULL;
        if (g->output[i]->name && !r)
            goto oom;
        if (r)
            r->graph_out = true;
    }
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t a = 0; a < g->node[i]->n_attribute; a++) {
            const Onnx__AttributeProto *at = g->node[i]->attribute[a];
            if (at->g)
                mark_sub(x, at->g);
            for (size_t k = 0; k < at->n_graphs; k++)
                mark_sub(x, at->graphs[k]);
        }
    if (model && !(x->has_used = use_all(x, model)))
        goto oom;
    return QCAL_OK;
oom:
    onnx_gindex_free(x);
    return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
}

void onnx_gindex_free(onnx_gindex *x)
{
    onnx_map_free(&x->names);
    onnx_map_free(&x->used);
    free(x->t);
    for (int64_t i = 0; i < x->nowned; i++)
        free(x->owned[i]);
    free(x->owned);
    memset(x, 0, sizeof *x);
}

int64_t onnx_gindex_find(const onnx_gindex *x, const char *name)
{
    int64_t *v = name ? onnx_map_get(&x->names, name) : NULL;
    return v ? *v : -1;
}

onnx_tref *onnx_gindex_get(const onnx_gindex *x, const char *name)
{
    int64_t i = onnx_gindex_find(x, name);
    return i >= 0 ? &x->t[i] : NULL;
}

onnx_tref *onnx_gindex_const(const onnx_gindex *x, const Onnx__GraphProto *g, const char *name, int64_t *hops)
{
    onnx_tref *r = onnx_gindex_get(x, name);
    int64_t h = 0;
    /* through Identity nodes (torch.onnx writes parameters so when do_constant_folding is off) */
    while (r && !r->init && r->producer >= 0 && h < 8) {
        const Onnx__NodeProto *p = g->node[r->producer];
        if (strcmp(p->op_type, "Identity") || (p->domain && p->domain[0]) || p->n_input != 1)
            break;
        if (r->n_cons != 1 || r->graph_out || r->sub_ref)
            h = 100;   /* an Identity output read twice is not private */
        r = onnx_gindex_get(x, p->input[0]);
        h++;
    }
    if (hops)
        *hops = h;
    return r && r->init ? r : NULL;
}

const char *onnx_gindex_fresh(onnx_gindex *x, const char *base, const char *suffix)
{
    if (!x->has_used)
        return NULL;
    size_t len = strlen(base) + strlen(suffix) + 24;
    char *s = malloc(len);
    if (!s)
        return NULL;
    snprintf(s, len, "%s%s", base, suffix);
    for (int k = 1; onnx_map_get(&x->used, s); k++)
        snprintf(s, len, "%s%s_%d", base, suffix, k);
    if (!onnx_push((void ***)&x->owned, (size_t *)&x->nowned, s)) {
        free(s);
        return NULL;
    }
    return onnx_map_put(&x->used, s, 0) ? s : NULL;
}
