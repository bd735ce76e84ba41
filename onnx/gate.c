/* Per-op gates: a QDQ model whose every quantized op can be switched between its quantized
 * and its float inputs at run time (include/qcal/onnx.h, qcal_onnx_gate; docs/accuracy.md).
 *
 * A quantized op is a node that reads at least one input through a DequantizeLinear
 * (directly, or through single-input Sum / Identity nodes: the FP8 layout of profile ort
 * puts a Sum on each side of Q/DQ). Each such op becomes
 *     If(Gather(qcal_gates, k)) then: the op on copies of its Q/DQ chains
 *                               else: the op on the float values
 * so the Q/DQ of an op is computed only when its gate is on. The then-branch holds copies of
 * the very QuantizeLinear / DequantizeLinear (and pass-through) nodes the QDQ model runs
 * there, reading the same outer tensors (the float activation, scales, zero points, stored
 * weights): gate on computes the QDQ model's values bit for bit. The float value of an
 * activation is the tensor the QuantizeLinear read (again through single-input Sum /
 * Identity); of a weight or bias stored quantized (an initializer or Constant before the
 * DequantizeLinear), the float tensor the reference model's node of the same name reads at
 * the same slot, copied in as an initializer of the else-branch (a constant there, which
 * ONNX Runtime prepacks as it does the float model's). A slot whose float value cannot be
 * found stays quantized in both branches (counted in the op's `fixed`); so do the slots of
 * an op with bodies of its own (two copies would define its inner names twice).
 *
 * One model, one engine session, any subset of ops quantized: the sensitivity analysis and
 * the keep-float search (engine/accuracy.c) run every configuration through it. Measured on
 * PP-OCRv4 recognition (docs/performance.md): the earlier form, q * g + f * (1 - g) per slot,
 * computed every Q/DQ and both products on every run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"

static bool is_op(const Onnx__NodeProto *n, const char *op)
{
    return n->op_type && !strcmp(n->op_type, op) && (!n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx"));
}

/* A single-input Sum or Identity: a no-op the FP8 layout wraps around Q/DQ. */
static bool is_passthrough(const Onnx__NodeProto *n)
{
    return (is_op(n, "Sum") || is_op(n, "Identity")) && n->n_input == 1 && n->n_output == 1;
}

/* The node producing name through pass-through nodes, or -1. */
static int64_t producer_skip(const onnx_gindex *x, const Onnx__GraphProto *g, const char *name,
                             const char **through)
{
    for (int hops = 0; hops < 8; hops++) {
        onnx_tref *r = onnx_gindex_get(x, name);
        if (!r || r->producer < 0)
            return -1;
        const Onnx__NodeProto *p = g->node[r->producer];
        if (!is_passthrough(p))
            return r->producer;
        name = p->input[0];
        if (through)
            *through = name;
    }
    return -1;
}

/* The float tensor a QuantizeLinear reads (through pass-through nodes). */
static const char *skip_back(const onnx_gindex *x, const Onnx__GraphProto *g, const char *name)
{
    for (int hops = 0; hops < 8; hops++) {
        onnx_tref *r = onnx_gindex_get(x, name);
        if (!r || r->producer < 0 || !is_passthrough(g->node[r->producer]))
            return name;
        name = g->node[r->producer]->input[0];
    }
    return name;
}

typedef struct ref_index {
    onnx_map nodes;   /* node name -> index */
    onnx_gindex gx;
    const Onnx__GraphProto *g;
} ref_index;

/* The float tensor ref's node `node` reads at slot k (an initializer or Constant value, through
 * Identity), or NULL. */
static Onnx__TensorProto *ref_weight(const ref_index *ri, const char *node, size_t k)
{
    if (!ri || !node || !node[0])
        return NULL;
    int64_t *ni = onnx_map_get(&ri->nodes, node);
    if (!ni)
        return NULL;
    const Onnx__NodeProto *n = ri->g->node[*ni];
    if (k >= n->n_input || !n->input[k] || !n->input[k][0])
        return NULL;
    onnx_tref *r = onnx_gindex_const(&ri->gx, ri->g, n->input[k], NULL);
    return r ? r->init : NULL;
}

/* A deep copy of a node (its attributes and bodies too); NULL when out of memory. */
static Onnx__NodeProto *node_copy(const Onnx__NodeProto *n)
{
    size_t len = onnx__node_proto__get_packed_size(n);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return NULL;
    onnx__node_proto__pack(n, buf);
    Onnx__NodeProto *c = onnx__node_proto__unpack(NULL, len, buf);
    free(buf);
    return c;
}

/* *slot = a copy of v (the old string freed); false when out of memory. */
static bool set_str(char **slot, const char *v)
{
    char *d = qcal_strdup(v);
    if (!d)
        return false;
    free(*slot);
    *slot = d;
    return true;
}

static bool has_body(const Onnx__NodeProto *n)
{
    for (size_t a = 0; a < n->n_attribute; a++)
        if (n->attribute[a]->g || n->attribute[a]->n_graphs)
            return true;
    return false;
}

static Onnx__GraphProto *new_graph(const char *name)
{
    Onnx__GraphProto *g = malloc(sizeof *g);
    if (!g)
        return NULL;
    onnx__graph_proto__init(g);
    if (!(g->name = qcal_strdup(name))) {
        free(g);
        return NULL;
    }
    return g;
}

/* Appends output `name` of element type elem (0: unknown, left to ONNX Runtime) to graph g. */
static bool graph_output(Onnx__GraphProto *g, const char *name, int32_t elem)
{
    Onnx__ValueInfoProto *vi = NULL;
    if (elem) {
        qcal_onnx_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.elem_type = elem;
        d.ndim = -1;
        vi = onnx_new_value_info(name, &d);
    } else if ((vi = malloc(sizeof *vi)) != NULL) {
        onnx__value_info_proto__init(vi);
        if (!(vi->name = qcal_strdup(name))) {
            free(vi);
            vi = NULL;
        }
    }
    if (!vi || !onnx_push((void ***)&g->output, &g->n_output, vi)) {
        if (vi)
            onnx__value_info_proto__free_unpacked(vi, NULL);
        return false;
    }
    return true;
}

/* Attribute `name` = graph body (taken: the node owns it); false when out of memory (body
 * still the caller's). */
static bool add_body(Onnx__NodeProto *n, const char *name, Onnx__GraphProto *body)
{
    Onnx__AttributeProto *a = onnx_node_add_attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    if (!a)
        return false;
    a->g = body;
    return true;
}

/* Names copied into one If body: the model's tensor -> its copy's. */
typedef struct name_map {
    const char **from, **to;
    size_t n, cap;
} name_map;

static const char *renamed(const name_map *rn, const char *name)
{
    for (size_t i = 0; i < rn->n; i++)
        if (!strcmp(rn->from[i], name))
            return rn->to[i];
    return NULL;
}

static bool rename_put(name_map *rn, const char *from, const char *to)
{
    if (rn->n == rn->cap) {
        size_t c = rn->cap ? rn->cap * 2 : 16;
        const char **f = realloc(rn->from, c * sizeof *f);
        if (!f)
            return false;
        rn->from = f;
        const char **t = realloc(rn->to, c * sizeof *t);
        if (!t)
            return false;
        rn->to = t;
        rn->cap = c;
    }
    rn->from[rn->n] = from;
    rn->to[rn->n++] = to;
    return true;
}

/* Copies into body the chain the op reads at `name` (pass-through nodes, the DequantizeLinear,
 * and for an activation its QuantizeLinear and the pass-through nodes back to fl), the
 * copies' outputs renamed (rn), so the body computes what the QDQ model computes there from
 * the same outer values (fl, scales, zero points, stored weights); *out: the copy of name. */
static qcal_status copy_chain(onnx_gindex *x, const Onnx__GraphProto *g, Onnx__GraphProto *body, name_map *rn,
                              const char *name, const char *fl, const char **out)
{
    int64_t chain[32];
    int nc = 0;
    bool dq = false, q = false;
    for (const char *cur = name; nc < 32;) {
        if (q && fl && !strcmp(cur, fl))
            break;
        onnx_tref *r = onnx_gindex_get(x, cur);
        if (!r || r->producer < 0)
            break;
        const Onnx__NodeProto *p = g->node[r->producer];
        if (is_op(p, "DequantizeLinear") && !dq)
            dq = true;
        else if (is_op(p, "QuantizeLinear") && dq && fl && !q)
            q = true;
        else if (!is_passthrough(p))
            break;
        chain[nc++] = r->producer;
        cur = p->input[0];
        if (dq && !fl)
            break; /* a weight stored quantized: the DequantizeLinear reads it from outside */
    }
    for (int c = nc - 1; c >= 0; c--) {
        const Onnx__NodeProto *p = g->node[chain[c]];
        if (renamed(rn, p->output[0]))
            continue; /* another slot of the op reads the same chain */
        Onnx__NodeProto *cp = node_copy(p);
        if (!cp || !onnx_push((void ***)&body->node, &body->n_node, cp)) {
            if (cp)
                onnx__node_proto__free_unpacked(cp, NULL);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        for (size_t k = 0; k < cp->n_input; k++) {
            const char *to = cp->input[k] && cp->input[k][0] ? renamed(rn, cp->input[k]) : NULL;
            if (to && !set_str(&cp->input[k], to))
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        for (size_t k = 0; k < cp->n_output; k++) {
            if (!p->output[k] || !p->output[k][0])
                continue;
            const char *to = onnx_gindex_fresh(x, p->output[k], "_then");
            if (!to || !set_str(&cp->output[k], to) || !rename_put(rn, p->output[k], to))
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
    }
    const char *to = renamed(rn, name);
    *out = to ? to : name;
    return QCAL_OK;
}

/* The gate of op k as If wants it: Gather(qcal_gates, k), a bool scalar. */
static qcal_status gate_cond(onnx_gindex *x, Onnx__GraphProto *gr, Onnx__NodeProto **nodes, size_t *nn, int64_t k,
                             const char **cond)
{
    char idx_name[64];
    snprintf(idx_name, sizeof idx_name, "%lld", (long long)k);
    const char *iname = onnx_gindex_fresh(x, "qcal_gate_index_", idx_name);
    const char *gout = onnx_gindex_fresh(x, "qcal_gate_", idx_name);
    if (!iname || !gout)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    int64_t v = k;
    Onnx__TensorProto *it = onnx_new_tensor(iname, 7 /* INT64 */, 0, NULL, &v, sizeof v);
    if (!it || !onnx_push((void ***)&gr->initializer, &gr->n_initializer, it)) {
        if (it)
            onnx__tensor_proto__free_unpacked(it, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    const char *gin[2] = {QCAL_ONNX_GATES_INPUT, iname};
    Onnx__NodeProto *ga = onnx_new_node("Gather", gout, 2, gin, 1, &gout);
    if (!ga)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    nodes[(*nn)++] = ga;
    *cond = gout;
    return QCAL_OK;
}

/* If(cond, then_branch = t, else_branch = e) writing outs; both bodies taken (freed on
 * failure). */
static qcal_status emit_if(onnx_gindex *x, Onnx__NodeProto **nodes, size_t *nn, const char *base, const char *cond,
                           size_t n_out, const char *const *outs, Onnx__GraphProto *t, Onnx__GraphProto *e)
{
    const char *name = onnx_gindex_fresh(x, base, "_gate");
    Onnx__NodeProto *n = name ? onnx_new_node("If", name, 1, &cond, (int64_t)n_out, outs) : NULL;
    bool ok = n && add_body(n, "then_branch", t);
    if (ok)
        t = NULL;
    ok = ok && add_body(n, "else_branch", e);
    if (ok)
        e = NULL;
    if (t)
        onnx__graph_proto__free_unpacked(t, NULL);
    if (e)
        onnx__graph_proto__free_unpacked(e, NULL);
    if (!ok) {
        if (n)
            onnx__node_proto__free_unpacked(n, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    nodes[(*nn)++] = n;
    return QCAL_OK;
}

/* Every name read inside the bodies of node n (at any depth) into set. */
static bool body_reads(const Onnx__NodeProto *n, onnx_map *set)
{
    for (size_t a = 0; a < n->n_attribute; a++) {
        const Onnx__AttributeProto *at = n->attribute[a];
        for (size_t j = 0; j < at->n_graphs + (at->g ? 1 : 0); j++) {
            const Onnx__GraphProto *b = j < at->n_graphs ? at->graphs[j] : at->g;
            for (size_t i = 0; i < b->n_node; i++) {
                for (size_t k = 0; k < b->node[i]->n_input; k++)
                    if (b->node[i]->input[k] && !onnx_map_put(set, b->node[i]->input[k], 1))
                        return false;
                if (!body_reads(b->node[i], set))
                    return false;
            }
            for (size_t k = 0; k < b->n_output; k++)
                if (b->output[k]->name && !onnx_map_put(set, b->output[k]->name, 1))
                    return false;
        }
    }
    return true;
}

/* Renames every read of from to `to` inside the bodies of node n (at any depth); false when
 * out of memory. */
static bool rename_in_bodies(Onnx__NodeProto *n, const char *from, const char *to)
{
    for (size_t a = 0; a < n->n_attribute; a++) {
        Onnx__AttributeProto *at = n->attribute[a];
        for (size_t j = 0; j < at->n_graphs + (at->g ? 1 : 0); j++) {
            Onnx__GraphProto *b = j < at->n_graphs ? at->graphs[j] : at->g;
            for (size_t i = 0; i < b->n_node; i++) {
                for (size_t k = 0; k < b->node[i]->n_input; k++)
                    if (b->node[i]->input[k] && !strcmp(b->node[i]->input[k], from) &&
                        !set_str(&b->node[i]->input[k], to))
                        return false;
                if (!rename_in_bodies(b->node[i], from, to))
                    return false;
            }
        }
    }
    return true;
}

/* Removes (frees) the Q/DQ and pass-through nodes of nodes[0..nn) whose outputs nothing
 * reads any more: the chains every gated op now computes inside its If. */
static qcal_status prune(const Onnx__GraphProto *g, Onnx__NodeProto **nodes, size_t *nn)
{
    for (bool changed = true; changed;) {
        changed = false;
        onnx_map set;
        memset(&set, 0, sizeof set);
        bool ok = true;
        for (size_t j = 0; ok && j < g->n_output; j++)
            ok = !g->output[j]->name || onnx_map_put(&set, g->output[j]->name, 1);
        for (size_t i = 0; ok && i < *nn; i++) {
            for (size_t k = 0; ok && k < nodes[i]->n_input; k++)
                ok = !nodes[i]->input[k] || onnx_map_put(&set, nodes[i]->input[k], 1);
            ok = ok && body_reads(nodes[i], &set);
        }
        if (!ok) {
            onnx_map_free(&set);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        /* the dropped nodes are freed once the set (whose keys are their strings too) is gone */
        Onnx__NodeProto **drop = malloc((*nn + 1) * sizeof *drop);
        if (!drop) {
            onnx_map_free(&set);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
        size_t w = 0, nd = 0;
        for (size_t i = 0; i < *nn; i++) {
            Onnx__NodeProto *n = nodes[i];
            bool read = false;
            for (size_t k = 0; k < n->n_output && !read; k++)
                read = n->output[k] && n->output[k][0] && onnx_map_get(&set, n->output[k]);
            if (!read && (is_op(n, "QuantizeLinear") || is_op(n, "DequantizeLinear") || is_passthrough(n)))
                drop[nd++] = n;
            else
                nodes[w++] = n;
        }
        *nn = w;
        onnx_map_free(&set);
        for (size_t i = 0; i < nd; i++)
            onnx__node_proto__free_unpacked(drop[i], NULL);
        free(drop);
        changed = nd > 0;
    }
    return QCAL_OK;
}

void qcal_onnx_gate_ops_free(qcal_onnx_gate_op **ops, int64_t n)
{
    if (!ops || !*ops)
        return;
    for (int64_t i = 0; i < n; i++) {
        free((*ops)[i].name);
        free((*ops)[i].op_type);
    }
    free(*ops);
    *ops = NULL;
}

/* A graph output written through Q/DQ. */
typedef struct out_slot {
    size_t out;                     /* index among the graph's outputs */
    int64_t writer;                 /* the node that writes it (DequantizeLinear or a pass-through) */
    const char *fl;                 /* the float tensor before QuantizeLinear */
    int64_t gate;
} out_slot;

/* One gated slot, planned before the graph changes. */
typedef struct slot {
    int64_t node, gate;
    size_t k;
    const char *fl;                 /* float tensor name (activation), or NULL */
    Onnx__TensorProto *w;           /* ref's float weight to copy in, or NULL */
} slot;

qcal_status qcal_onnx_gate(const qcal_onnx_model *q, const qcal_onnx_model *ref,
                           qcal_onnx_model **out, qcal_onnx_gate_op **ops_out, int64_t *n_out)
{
    if (!q || !out || !ops_out || !n_out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "onnx gate: NULL argument");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_onnx_model_serialize(q, &buf, &len);
    if (st != QCAL_OK)
        return st;
    qcal_onnx_model *m = NULL;
    st = qcal_onnx_model_parse(buf, len, &m);
    qcal_free(buf);
    if (st != QCAL_OK)
        return st;
    Onnx__GraphProto *g = m->proto->graph;
    if (onnx_model_opset(m->proto) < 13) {
        qcal_onnx_model_destroy(&m);
        return qcal_error(QCAL_ERR_UNSUPPORTED, "onnx gate: the QDQ model's default-domain opset is %lld; 13 or later needed",
                          (long long)onnx_model_opset(q->proto));
    }
    for (size_t i = 0; i < g->n_input; i++)
        if (g->input[i]->name && !strcmp(g->input[i]->name, QCAL_ONNX_GATES_INPUT)) {
            qcal_onnx_model_destroy(&m);
            return qcal_error(QCAL_ERR_INVALID_ARG, "onnx gate: the model already has an input '%s'",
                              QCAL_ONNX_GATES_INPUT);
        }

    onnx_gindex x;
    ref_index ri, *rip = NULL;
    memset(&ri, 0, sizeof ri);
    slot *slots = NULL;
    size_t n_slots = 0, cap_slots = 0;
    qcal_onnx_gate_op *ops = NULL;
    int64_t n_ops = 0;
    out_slot *outs = NULL;
    size_t n_outs = 0;
    const char **conds = NULL;  /* per op: its gate, a bool scalar */
    onnx_types ty;
    bool has_ty = false;
    int32_t *out_elem = NULL;   /* per gated graph output: its element type (0: unknown) */
    int64_t n_node_ops = 0;
    if ((st = onnx_gindex_build(g, g, &x)) != QCAL_OK) {
        qcal_onnx_model_destroy(&m);
        return st;
    }
    if (ref) {
        ri.g = ref->proto->graph;
        if ((st = onnx_gindex_build(ri.g, NULL, &ri.gx)) != QCAL_OK)
            goto done;
        for (size_t i = 0; i < ri.g->n_node; i++) {
            const char *nm = ri.g->node[i]->name;
            if (nm && nm[0] && !onnx_map_get(&ri.nodes, nm) && !onnx_map_put(&ri.nodes, nm, (int64_t)i)) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto done;
            }
        }
        rip = &ri;
    }

    /* Plan: every slot of every op that reads through a DequantizeLinear. */
    ops = calloc(g->n_node + g->n_output + 1, sizeof *ops);
    outs = calloc(g->n_output + 1, sizeof *outs);
    if (!ops || !outs) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (is_op(n, "QuantizeLinear") || is_op(n, "DequantizeLinear") || is_passthrough(n))
            continue;
        int64_t edges = 0, fixed = 0;
        for (size_t k = 0; k < n->n_input; k++) {
            if (!n->input[k] || !n->input[k][0])
                continue;
            int64_t d = producer_skip(&x, g, n->input[k], NULL);
            if (d < 0 || !is_op(g->node[d], "DequantizeLinear"))
                continue;
            const Onnx__NodeProto *dq = g->node[d];
            slot s = {.node = (int64_t)i, .gate = n_ops, .k = k};
            int64_t qn = producer_skip(&x, g, dq->input[0], NULL);
            if (qn >= 0 && is_op(g->node[qn], "QuantizeLinear")) {
                /* an activation, or a float weight quantized in the graph (profile tensorrt) */
                s.fl = skip_back(&x, g, g->node[qn]->input[0]);
            } else {
                s.w = ref_weight(rip, n->name, k);
            }
            edges++;
            if ((!s.fl && !s.w) || has_body(n)) {
                /* no float value; or an op with bodies, whose two copies would define
                 * the same names twice */
                fixed++;
                continue;
            }
            if (n_slots == cap_slots) {
                size_t c = cap_slots ? cap_slots * 2 : 64;
                slot *p = realloc(slots, c * sizeof *p);
                if (!p) {
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    goto done;
                }
                slots = p;
                cap_slots = c;
            }
            slots[n_slots++] = s;
        }
        if (!edges)
            continue;
        qcal_onnx_gate_op *op = &ops[n_ops];
        op->name = qcal_strdup(n->name ? n->name : "");
        op->op_type = qcal_strdup(n->op_type);
        op->node = (int64_t)i;
        op->inputs = edges;
        op->fixed = fixed;
        if (!op->name || !op->op_type) {
            n_ops++;
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        n_ops++;
    }
    n_node_ops = n_ops;
    /* Graph outputs written through Q/DQ: gated by the op that computes the float value
     * (its own gate when it has one, else a gate of its own). */
    for (size_t j = 0; j < g->n_output; j++) {
        const char *name = g->output[j]->name;
        onnx_tref *r = name ? onnx_gindex_get(&x, name) : NULL;
        if (!r || r->producer < 0)
            continue;
        int64_t d = producer_skip(&x, g, name, NULL);
        if (is_passthrough(g->node[r->producer]) && d < 0)
            continue;
        if (d < 0 && is_op(g->node[r->producer], "DequantizeLinear"))
            d = r->producer;
        if (d < 0 || !is_op(g->node[d], "DequantizeLinear"))
            continue;
        int64_t qn = producer_skip(&x, g, g->node[d]->input[0], NULL);
        if (qn < 0 || !is_op(g->node[qn], "QuantizeLinear"))
            continue;
        const char *src = skip_back(&x, g, g->node[qn]->input[0]);
        onnx_tref *sr = onnx_gindex_get(&x, src);
        int64_t pn = sr ? sr->producer : -1, gate = -1;
        for (int64_t k = 0; k < n_ops && gate < 0; k++)
            if (pn >= 0 && ops[k].node == pn)
                gate = k;
        if (gate < 0) {
            qcal_onnx_gate_op *op = &ops[n_ops];
            const Onnx__NodeProto *pnode = pn >= 0 ? g->node[pn] : NULL;
            op->name = qcal_strdup(pnode && pnode->name ? pnode->name : "");
            op->op_type = qcal_strdup(pnode ? pnode->op_type : "Input");
            op->node = pn;
            gate = n_ops++;
            if (!op->name || !op->op_type) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto done;
            }
        }
        ops[gate].inputs++;
        outs[n_outs++] = (out_slot){j, r->producer, src, gate};
    }
    if (!n_ops) {
        st = qcal_error(QCAL_ERR_EMPTY, "onnx gate: no op reads through DequantizeLinear (not a QDQ model)");
        goto done;
    }

    /* Rewrite: the gates input (bool [n_ops]); per op with a gated slot, a Gather of its gate
     * and an If in its place whose then-branch is the op reading copies of its Q/DQ chains
     * (the QDQ model's computation) and whose else-branch is the op reading the float values
     * (weights as the body's own initializers, constants ONNX Runtime can prepack): Q/DQ is
     * computed only when the gate is on. The Q/DQ nodes left unread then go. */
    {
        qcal_onnx_tensor_desc gd;
        memset(&gd, 0, sizeof gd);
        gd.elem_type = 9; /* BOOL */
        gd.ndim = 1;
        gd.dims[0] = n_ops;
        Onnx__ValueInfoProto *vi = onnx_new_value_info(QCAL_ONNX_GATES_INPUT, &gd);
        if (!vi || !onnx_push((void ***)&g->input, &g->n_input, vi)) {
            if (vi)
                onnx__value_info_proto__free_unpacked(vi, NULL);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        if ((st = onnx_types_build(g, NULL, &ty)) != QCAL_OK)
            goto done;
        has_ty = true;
        /* the graph outputs' types now: ty borrows g's strings, which the outputs' rewrite
         * replaces */
        out_elem = calloc(n_outs + 1, sizeof *out_elem);
        if (!out_elem) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        for (size_t j = 0; j < n_outs; j++)
            out_elem[j] = onnx_type_get(&ty, g->output[outs[j].out]->name);
        size_t cap = g->n_node + (size_t)n_ops * 2 + n_outs * 2 + 1;
        Onnx__NodeProto **nodes = calloc(cap, sizeof *nodes);
        Onnx__NodeProto **retired = calloc(g->n_node + 1, sizeof *retired);
        size_t n_retired = 0;
        conds = calloc((size_t)n_ops, sizeof *conds);
        if (!nodes || !retired || !conds) {
            free(nodes);
            free(retired);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        name_map rn;
        memset(&rn, 0, sizeof rn);
        size_t nn = 0, si = 0;
        int64_t oi = 0;
        for (size_t i = 0; i < g->n_node && st == QCAL_OK; i++) {
            Onnx__NodeProto *n = g->node[i];
            while (oi < n_node_ops && ops[oi].node < (int64_t)i)
                oi++;
            size_t s0 = si;
            while (si < n_slots && slots[si].node == (int64_t)i)
                si++;
            if (oi >= n_node_ops || ops[oi].node != (int64_t)i || si == s0) {
                nodes[nn++] = n;
                continue;
            }
            /* op oi, gated slots [s0, si) */
            char base[64];
            snprintf(base, sizeof base, "qcal_gate_%lld", (long long)oi);
            Onnx__GraphProto *tg = new_graph(base), *eg = NULL;
            Onnx__NodeProto *top = NULL, *eop = NULL;
            const char **outs = calloc(n->n_output + 1, sizeof *outs);
            size_t n_outs_op = 0;
            rn.n = 0;
            if (!tg || !(eg = new_graph(base)) || !(top = node_copy(n)) || !(eop = node_copy(n)) || !outs)
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            for (size_t j = s0; j < si && st == QCAL_OK; j++) {
                slot *s = &slots[j];
                const char *tin = NULL, *fl = s->fl;
                if ((st = copy_chain(&x, g, tg, &rn, n->input[s->k], s->fl, &tin)) != QCAL_OK)
                    break;
                /* the float weight: the body's own initializer (a constant to ONNX Runtime) */
                onnx_tref *fr = fl ? onnx_gindex_get(&x, fl) : NULL;
                Onnx__TensorProto *w = s->w ? s->w : fr && fr->producer < 0 && fr->init ? fr->init : NULL;
                if (w) {
                    const uint8_t *data;
                    size_t nb;
                    void *owned = NULL;
                    if ((st = onnx_tensor_bytes(w, &data, &nb, &owned)) != QCAL_OK)
                        break;
                    const char *wn = onnx_gindex_fresh(&x, w->name ? w->name : "w", "_float");
                    Onnx__TensorProto *wt =
                        wn ? onnx_new_tensor(wn, w->data_type, (int32_t)w->n_dims, w->dims, data, nb) : NULL;
                    free(owned);
                    if (!wt || !onnx_push((void ***)&eg->initializer, &eg->n_initializer, wt)) {
                        if (wt)
                            onnx__tensor_proto__free_unpacked(wt, NULL);
                        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                        break;
                    }
                    fl = wn;
                }
                if (!set_str(&top->input[s->k], tin) || !set_str(&eop->input[s->k], fl))
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            }
            for (size_t k = 0; k < n->n_output && st == QCAL_OK; k++) {
                if (!n->output[k] || !n->output[k][0])
                    continue;
                int32_t elem = onnx_type_get(&ty, n->output[k]);
                const char *tn = onnx_gindex_fresh(&x, n->output[k], "_then");
                if (!tn || !set_str(&top->output[k], tn) || !graph_output(tg, tn, elem)) {
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    break;
                }
                const char *en = onnx_gindex_fresh(&x, n->output[k], "_else");
                if (!en || !set_str(&eop->output[k], en) || !graph_output(eg, en, elem)) {
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    break;
                }
                outs[n_outs_op++] = n->output[k];
            }
            if (st == QCAL_OK && onnx_push((void ***)&tg->node, &tg->n_node, top))
                top = NULL;
            if (st == QCAL_OK && onnx_push((void ***)&eg->node, &eg->n_node, eop))
                eop = NULL;
            if (st == QCAL_OK && (top || eop))
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            if (st == QCAL_OK && (st = gate_cond(&x, g, nodes, &nn, oi, &conds[oi])) == QCAL_OK) {
                st = emit_if(&x, nodes, &nn, n->name && n->name[0] ? n->name : n->op_type, conds[oi], n_outs_op,
                             outs, tg, eg);
                tg = eg = NULL;
            }
            if (top)
                onnx__node_proto__free_unpacked(top, NULL);
            if (eop)
                onnx__node_proto__free_unpacked(eop, NULL);
            if (tg)
                onnx__graph_proto__free_unpacked(tg, NULL);
            if (eg)
                onnx__graph_proto__free_unpacked(eg, NULL);
            free(outs);
            if (st == QCAL_OK)
                retired[n_retired++] = n; /* its output names live on in the If: freed at the end */
            else
                nodes[nn++] = n;
        }
        onnx_types_free(&ty);
        has_ty = false;
        /* Gated graph outputs: the writer's output renamed (its readers follow), then
         * If(gate) under the output's name, at the end. */
        for (size_t j = 0; j < n_outs && st == QCAL_OK; j++) {
            out_slot *o = &outs[j];
            const char *oname = g->output[o->out]->name;
            int32_t elem = out_elem[j];
            if (!conds[o->gate] && (st = gate_cond(&x, g, nodes, &nn, o->gate, &conds[o->gate])) != QCAL_OK)
                break;
            const char *qname = onnx_gindex_fresh(&x, oname, "_quantized");
            const char *en = onnx_gindex_fresh(&x, oname, "_else");
            if (!qname || !en) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            /* then: copies of the output's Q/DQ chain (from the float value, as the QDQ
             * model computes it), else: the float value */
            Onnx__GraphProto *tg = new_graph("qcal_gate_output"), *eg = new_graph("qcal_gate_output");
            const char *tin = NULL;
            rn.n = 0;
            if (tg && eg && (st = copy_chain(&x, g, tg, &rn, oname, o->fl, &tin)) != QCAL_OK) {
                onnx__graph_proto__free_unpacked(tg, NULL);
                onnx__graph_proto__free_unpacked(eg, NULL);
                break;
            }
            Onnx__NodeProto *wr = g->node[o->writer];
            char *old_name = qcal_strdup(wr->output[0]);
            if (!old_name) {
                if (tg)
                    onnx__graph_proto__free_unpacked(tg, NULL);
                if (eg)
                    onnx__graph_proto__free_unpacked(eg, NULL);
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            for (size_t k = 0; k < nn && st == QCAL_OK; k++) {
                for (size_t a = 0; a < nodes[k]->n_input; a++)
                    if (nodes[k]->input[a] && !strcmp(nodes[k]->input[a], old_name) &&
                        !set_str(&nodes[k]->input[a], qname)) {
                        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                        break;
                    }
                if (st == QCAL_OK && !rename_in_bodies(nodes[k], old_name, qname))
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            }
            if (st != QCAL_OK || !set_str(&wr->output[0], qname)) {
                if (tg)
                    onnx__graph_proto__free_unpacked(tg, NULL);
                if (eg)
                    onnx__graph_proto__free_unpacked(eg, NULL);
                free(old_name);
                st = st != QCAL_OK ? st : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            Onnx__NodeProto *ei = eg ? onnx_new_node("Identity", NULL, 1, &o->fl, 1, &en) : NULL;
            bool ok = tg && eg && ei && onnx_push((void ***)&eg->node, &eg->n_node, ei);
            if (ok)
                ei = NULL;
            ok = ok && graph_output(tg, tin, elem) && graph_output(eg, en, elem);
            if (ei)
                onnx__node_proto__free_unpacked(ei, NULL);
            if (!ok) {
                if (tg)
                    onnx__graph_proto__free_unpacked(tg, NULL);
                if (eg)
                    onnx__graph_proto__free_unpacked(eg, NULL);
                free(old_name);
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            const char *on = old_name;
            st = emit_if(&x, nodes, &nn, oname, conds[o->gate], 1, &on, tg, eg);
            free(old_name);
        }
        free(rn.from);
        free(rn.to);
        if (st == QCAL_OK) {
            /* nodes now holds every live node (prune frees the ones it drops): committed
             * whatever prune returns */
            st = prune(g, nodes, &nn);
            for (size_t k = 0; k < n_retired; k++)
                onnx__node_proto__free_unpacked(retired[k], NULL);
            free(retired);
            free(g->node);
            g->node = nodes;
            g->n_node = nn;
            if (st != QCAL_OK)
                goto done;
        } else {
            /* the new nodes are not in g yet: free them; g's own are still g's */
            for (size_t k = 0; k < nn; k++) {
                bool own = false;
                for (size_t j = 0; j < g->n_node && !own; j++)
                    own = nodes[k] == g->node[j];
                if (!own)
                    onnx__node_proto__free_unpacked(nodes[k], NULL);
            }
            free(nodes);
            free(retired);
            goto done;
        }
    }

done:
    onnx_gindex_free(&x);
    if (has_ty)
        onnx_types_free(&ty);
    free(slots);
    free(outs);
    free(conds);
    free(out_elem);
    if (rip) {
        onnx_gindex_free(&ri.gx);
        onnx_map_free(&ri.nodes);
    }
    if (st != QCAL_OK) {
        qcal_onnx_gate_ops_free(&ops, n_ops);
        qcal_onnx_model_destroy(&m);
        return st;
    }
    *out = m;
    *ops_out = ops;
    *n_out = n_ops;
    return QCAL_OK;
}
