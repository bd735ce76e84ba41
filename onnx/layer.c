/* The weight-layer view the rewrites share (fold_bn.c, equalize.c): Conv/Gemm weights as
 * qcal_ptq_layer over the graph index (onnx/graph.c), initializers written back as float32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"

qcal_status onnx_init_set_float(qcal_onnx_model *m, Onnx__TensorProto *t, const float *data, int64_t numel)
{
    size_t nb = (size_t)numel * sizeof(float);
    uint8_t *buf = malloc(nb ? nb : 1);
    if (!buf)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    // little-endian float32 (the hosts qcal builds on are little-endian)
    if (nb)
        memcpy(buf, data, nb);
    onnx_tensor_release(m, t);
    free(t->raw_data.data);
    t->raw_data.data = buf;
    t->raw_data.len = nb;
    t->has_raw_data = 1;
    free(t->float_data);
    t->float_data = NULL;
    t->n_float_data = 0;
    free(t->double_data);
    t->double_data = NULL;
    t->n_double_data = 0;
    free(t->int32_data);
    t->int32_data = NULL;
    t->n_int32_data = 0;
    t->data_type = QCAL_ONNX_FLOAT;
    t->has_data_type = 1;
    return QCAL_OK;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

static float attr_float(const Onnx__NodeProto *n, const char *name, float dflt)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a && a->has_f ? a->f : dflt;
}

/* A float32 initializer read by node n only (every slot of n counted; an Identity in
 * between is fine when it has no other reader). */
static const char *private_init(const onnx_gindex *x, const Onnx__GraphProto *g, const Onnx__NodeProto *n,
                                const char *name, Onnx__TensorProto **out)
{
    int64_t hops;
    onnx_tref *r = onnx_gindex_const(x, g, name, &hops);
    if (!r)
        return "is not an initializer";
    if (r->init->data_type != QCAL_ONNX_FLOAT)
        return "is not float32";
    int64_t slots = 0;
    for (size_t k = 0; k < n->n_input; k++)
        slots += n->input[k] && !strcmp(n->input[k], name);
    onnx_tref *direct = onnx_gindex_get(x, name);
    *out = r->init;   // also when shared: a read-only caller may use it
    if (hops >= 100 || (hops == 0 && r->n_cons != slots) || (hops > 0 && (direct->n_cons != slots || r->n_cons != 1)) ||
        r->sub_ref || r->graph_out)
        return "is shared with another node";
    *out = r->init;
    return NULL;
}

qcal_status onnx_layer_load(const qcal_onnx_model *m, const onnx_gindex *x, int64_t ni, bool read_only,
                            onnx_layer *out, char *why)
{
    const Onnx__GraphProto *g = m->proto->graph;
    const Onnx__NodeProto *n = g->node[ni];
    memset(out, 0, sizeof *out);
    out->node = ni;
    bool gemm = !strcmp(n->op_type, "Gemm");
    if (!gemm && strcmp(n->op_type, "Conv"))
        return snprintf(why, 256, "%s is not Conv or Gemm", n->op_type), QCAL_ERR_UNSUPPORTED;
    if ((n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx")) || n->n_input < 2 || !n->input[1][0])
        return snprintf(why, 256, "not a default-domain %s with a weight", n->op_type), QCAL_ERR_UNSUPPORTED;
    const char *e;
    if ((e = private_init(x, g, n, n->input[1], &out->wt)) && !(read_only && !strcmp(e, "is shared with another node")))
        return snprintf(why, 256, "weight '%s' %s", n->input[1], e), QCAL_ERR_UNSUPPORTED;
    if (n->n_input > 2 && n->input[2][0] && (e = private_init(x, g, n, n->input[2], &out->bt)) &&
        !(read_only && !strcmp(e, "is shared with another node")))
        return snprintf(why, 256, "bias '%s' %s", n->input[2], e), QCAL_ERR_UNSUPPORTED;
    const Onnx__TensorProto *w = out->wt;
    int64_t o, in, groups = 1, kernel = 1;
    if (gemm) {
        if (attr_int(n, "transA", 0) != 0 || attr_float(n, "alpha", 1.0f) != 1.0f ||
            attr_float(n, "beta", 1.0f) != 1.0f)
            return snprintf(why, 256, "Gemm with transA, alpha or beta other than 0, 1, 1"), QCAL_ERR_UNSUPPORTED;
        if (w->n_dims != 2)
            return snprintf(why, 256, "weight '%s' is not 2-D", n->input[1]), QCAL_ERR_UNSUPPORTED;
        out->trans = attr_int(n, "transB", 0) == 0;
        o = out->trans ? w->dims[1] : w->dims[0];
        in = out->trans ? w->dims[0] : w->dims[1];
    } else {
        if (w->n_dims < 3)
            return snprintf(why, 256, "weight '%s' has %zu dimensions", n->input[1], w->n_dims), QCAL_ERR_UNSUPPORTED;
        groups = attr_int(n, "group", 1);
        o = w->dims[0];
        in = w->dims[1];
        for (size_t k = 2; k < w->n_dims; k++) {
            if (w->dims[k] < 1 || __builtin_mul_overflow(kernel, w->dims[k], &kernel))
                return snprintf(why, 256, "weight '%s' has an impossible shape", n->input[1]), QCAL_ERR_UNSUPPORTED;
        }
        if (groups < 1 || __builtin_mul_overflow(in, groups, &in))
            return snprintf(why, 256, "group %lld is impossible", (long long)groups), QCAL_ERR_UNSUPPORTED;
    }
    if (o < 1 || in < 1 || o % groups)
        return snprintf(why, 256, "weight '%s' has an impossible shape", n->input[1]), QCAL_ERR_UNSUPPORTED;
    out->gemm = gemm;
    qcal_ptq_layer *l = &out->l;
    l->out_channels = o;
    l->in_channels = in;
    l->groups = groups;
    l->kernel = kernel;
    int64_t numel;
    float *wd = NULL, *bd = NULL;
    qcal_status st = onnx_tensor_to_float(w, &wd, &numel);
    if (st != QCAL_OK)
        return st;
    if (numel != o * (in / groups) * kernel) {
        free(wd);
        return snprintf(why, 256, "weight '%s' size does not match its shape", n->input[1]), QCAL_ERR_UNSUPPORTED;
    }
    if (out->trans) {   // [in, out] -> [out, in]
        float *t = malloc((size_t)numel * sizeof *t);
        if (!t) {
            free(wd);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < o; j++)
                t[j * in + i] = wd[i * o + j];
        free(wd);
        wd = t;
    }
    if (out->bt) {
        int64_t nb;
        if ((st = onnx_tensor_to_float(out->bt, &bd, &nb)) != QCAL_OK) {
            free(wd);
            return st;
        }
        if (nb != o || out->bt->n_dims != 1) {
            free(wd);
            free(bd);
            return snprintf(why, 256, "bias '%s' is not 1-D of %lld values", n->input[2], (long long)o),
                   QCAL_ERR_UNSUPPORTED;
        }
    } else if (!(bd = calloc((size_t)o, sizeof *bd))) {
        free(wd);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    l->weight = wd;
    l->bias = bd;
    return QCAL_OK;
}

void onnx_layer_free(onnx_layer *l)
{
    free(l->l.weight);
    free(l->l.bias);
    l->l.weight = l->l.bias = NULL;
}

qcal_status onnx_layer_store(qcal_onnx_model *m, onnx_gindex *x, onnx_layer *ly)
{
    Onnx__GraphProto *g = m->proto->graph;
    Onnx__NodeProto *n = g->node[ly->node];
    qcal_ptq_layer *l = &ly->l;
    int64_t numel = l->out_channels * (l->in_channels / l->groups) * l->kernel;
    qcal_status st;
    if (ly->trans) {
        int64_t o = l->out_channels, in = l->in_channels;
        float *t = malloc((size_t)numel * sizeof *t);
        if (!t)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        for (int64_t i = 0; i < in; i++)
            for (int64_t j = 0; j < o; j++)
                t[i * o + j] = l->weight[j * in + i];
        st = onnx_init_set_float(m, ly->wt, t, numel);
        free(t);
    } else {
        st = onnx_init_set_float(m, ly->wt, l->weight, numel);
    }
    if (st != QCAL_OK)
        return st;
    if (ly->bt)
        return onnx_init_set_float(m, ly->bt, l->bias, l->out_channels);
    bool zero = true;
    for (int64_t i = 0; i < l->out_channels; i++)
        zero = zero && l->bias[i] == 0.0f;
    if (zero)
        return QCAL_OK;
    const char *bname = onnx_gindex_fresh(x, n->name && n->name[0] ? n->name : n->input[1], "_bias");
    if (!bname)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    int64_t dims[1] = { l->out_channels };
    Onnx__TensorProto *t = onnx_new_tensor(bname, QCAL_ONNX_FLOAT, 1, dims, l->bias,
                                           (size_t)l->out_channels * sizeof(float));
    if (!t || !onnx_push((void ***)&g->initializer, &g->n_initializer, t)) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    if (n->n_input < 3) {
        char **in = realloc(n->input, 3 * sizeof *in);
        if (!in)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        n->input = in;
        n->input[2] = NULL;
        n->n_input = 3;
    }
    char *s = qcal_strdup(bname);
    if (!s)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    free(n->input[2]);   // NULL or "" (an omitted bias): never a key of x
    n->input[2] = s;
    ly->bt = t;
    onnx_tref *r = onnx_gindex_get(x, bname);
    if (r) {
        r->init = t;
        r->n_cons = 1;
        r->cons0 = ly->node;
    }
    return QCAL_OK;
}

/* ---- what a rewrite orphans ---- */

/* Adds every name g reads (node inputs, in subgraphs too: outer-scope references) and, for
 * the main graph, its outputs to set; copies of the names go to *own when own is given. */
static bool reads_collect(const Onnx__GraphProto *g, bool top, onnx_map *set, char ***own, size_t *nown)
{
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_input; k++) {
            const char *s = n->input[k];
            if (!s || !s[0] || onnx_map_get(set, s))
                continue;
            if (own) {
                char *c = qcal_strdup(s);
                if (!c || !onnx_push((void ***)own, nown, c)) {
                    free(c);
                    return false;
                }
                s = c;
            }
            if (!onnx_map_put(set, s, 0))
                return false;
        }
        for (size_t a = 0; a < n->n_attribute; a++) {
            const Onnx__AttributeProto *at = n->attribute[a];
            if (at->g && !reads_collect(at->g, false, set, own, nown))
                return false;
            for (size_t k = 0; k < at->n_graphs; k++)
                if (!reads_collect(at->graphs[k], false, set, own, nown))
                    return false;
        }
    }
    for (size_t i = 0; top && i < g->n_output; i++) {
        const char *s = g->output[i]->name;
        if (!s || !s[0] || onnx_map_get(set, s))
            continue;
        if (own) {
            char *c = qcal_strdup(s);
            if (!c || !onnx_push((void ***)own, nown, c)) {
                free(c);
                return false;
            }
            s = c;
        }
        if (!onnx_map_put(set, s, 0))
            return false;
    }
    return true;
}

qcal_status onnx_reads_take(const Onnx__GraphProto *g, onnx_reads *r)
{
    memset(r, 0, sizeof *r);
    if (!reads_collect(g, true, &r->set, &r->names, &r->n)) {
        onnx_reads_free(r);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    return QCAL_OK;
}

void onnx_reads_free(onnx_reads *r)
{
    onnx_map_free(&r->set);
    for (size_t i = 0; i < r->n; i++)
        free(r->names[i]);
    free(r->names);
    memset(r, 0, sizeof *r);
}

/* A Constant, or an Identity / Cast (what exporters put between a constant and its reader). */
static bool prunable_node(const Onnx__NodeProto *n)
{
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
        return false;
    if (!strcmp(n->op_type, "Constant"))
        return n->n_input == 0;
    return (!strcmp(n->op_type, "Identity") || !strcmp(n->op_type, "Cast")) && n->n_input == 1;
}

qcal_status onnx_prune_orphans(qcal_onnx_model *m, const onnx_reads *before, int64_t *nodes, int64_t *inits)
{
    Onnx__GraphProto *g = m->proto->graph;
    int64_t dn = 0, di = 0;
    for (;;) {
        /* cur's keys are copies: the nodes whose inputs they name may be freed below, before
         * the initializers are looked up in it. */
        onnx_reads cur = { 0 };
        if (onnx_reads_take(g, &cur) != QCAL_OK)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        // orphaned: read before the rewrite, read by nothing (and no graph output) now
#define ORPHAN(s) ((s) && (s)[0] && onnx_map_get(&before->set, (s)) && !onnx_map_get(&cur.set, (s)))
        size_t kn = 0, ki = 0, gone = 0;
        for (size_t i = 0; i < g->n_node; i++) {
            Onnx__NodeProto *n = g->node[i];
            bool dead = prunable_node(n) && n->n_output > 0;
            for (size_t k = 0; dead && k < n->n_output; k++)
                dead = !n->output[k][0] || ORPHAN(n->output[k]);
            if (dead) {
                // (a Constant's value is never in a file mapping: only initializers are)
                protobuf_c_message_free_unpacked(&n->base, NULL);
                gone++;
                dn++;
            } else {
                g->node[kn++] = n;
            }
        }
        g->n_node = kn;
        for (size_t i = 0; i < g->n_initializer; i++) {
            Onnx__TensorProto *t = g->initializer[i];
            bool in = false;   // an initializer that is also a graph input: a caller may feed it
            for (size_t j = 0; j < g->n_input && !in && t->name; j++)
                in = g->input[j]->name && !strcmp(g->input[j]->name, t->name);
            if (!in && ORPHAN(t->name)) {
                onnx_tensor_release(m, t);
                protobuf_c_message_free_unpacked(&t->base, NULL);
                gone++;
                di++;
            } else {
                g->initializer[ki++] = t;
            }
        }
#undef ORPHAN
        g->n_initializer = ki;
        onnx_reads_free(&cur);
        if (!gone)
            break;
    }
    if (nodes)
        *nodes = dn;
    if (inits)
        *inits = di;
    return QCAL_OK;
}
