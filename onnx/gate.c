/* Per-op gates: a QDQ model whose every quantized op can be switched between its quantized
 * and its float inputs at run time (include/qcal/onnx.h, qcal_onnx_gate; docs/accuracy.md).
 *
 * A quantized op is a node that reads at least one input through a DequantizeLinear
 * (directly, or through single-input Sum / Identity nodes: the FP8 layout of profile ort
 * puts a Sum on each side of Q/DQ). Each such input slot becomes
 *     q * g_k + f * (1 - g_k),   g_k = Gather(qcal_gates, k) in {0, 1}
 * with q what the op read and f the float value: 1 gives q exactly (q * 1 + f * 0), 0 gives f
 * (only a zero's sign, or a NaN/Inf in the value not taken, could differ). The float value of an activation is the tensor the
 * QuantizeLinear read (again through single-input Sum / Identity); of a weight or bias
 * stored quantized (an initializer or Constant before the DequantizeLinear), the float
 * tensor the reference model's node of the same name reads at the same slot, copied in. A
 * slot whose float value cannot be found stays quantized (counted in the op's `fixed`).
 *
 * One model, one engine session, any subset of ops quantized: the sensitivity analysis and
 * the keep-float search (engine/accuracy.c) run every configuration through it. */
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

/* Emits out = q * g + f * h (g = the op's gate, h = 1 - g, both 0 or 1): q exactly when the
 * gate is on, f when off (the other product is a zero: only a zero's sign or a NaN/Inf in
 * the unused value could differ). Measured on PP-OCRv4 recognition, 536 one-sample runs:
 * 47 s this way at graph optimization 'all', 64 s with Where(gate, q, f) instead. */
static qcal_status blend(onnx_gindex *x, Onnx__NodeProto **nodes, size_t *nn, const char *g, const char *h,
                         const char *q, const char *f, const char *out)
{
    const char *a = onnx_gindex_fresh(x, out, "_q");
    const char *b = onnx_gindex_fresh(x, out, "_f");
    if (!a || !b)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    const char *in1[2] = {q, g}, *in2[2] = {f, h}, *in3[2] = {a, b};
    Onnx__NodeProto *m1 = onnx_new_node("Mul", NULL, 2, in1, 1, &a);
    Onnx__NodeProto *m2 = onnx_new_node("Mul", NULL, 2, in2, 1, &b);
    Onnx__NodeProto *ad = onnx_new_node("Add", NULL, 2, in3, 1, &out);
    if (!m1 || !m2 || !ad) {
        if (m1)
            onnx__node_proto__free_unpacked(m1, NULL);
        if (m2)
            onnx__node_proto__free_unpacked(m2, NULL);
        if (ad)
            onnx__node_proto__free_unpacked(ad, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    nodes[(*nn)++] = m1;
    nodes[(*nn)++] = m2;
    nodes[(*nn)++] = ad;
    return QCAL_OK;
}

/* The gate of op k: Gather(qcal_gates, k) -> g, Sub(1, g) -> h. */
static qcal_status gate_nodes(onnx_gindex *x, Onnx__GraphProto *gr, Onnx__NodeProto **nodes, size_t *nn,
                              int64_t k, const char *one, const char **g_out, const char **h_out)
{
    char idx_name[64];
    snprintf(idx_name, sizeof idx_name, "%lld", (long long)k);
    const char *iname = onnx_gindex_fresh(x, "qcal_gate_index_", idx_name);
    const char *gout = onnx_gindex_fresh(x, "qcal_gate_", idx_name);
    const char *hout = onnx_gindex_fresh(x, "qcal_gate_off_", idx_name);
    if (!iname || !gout || !hout)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    int64_t v = k;
    Onnx__TensorProto *it = onnx_new_tensor(iname, 7 /* INT64 */, 0, NULL, &v, sizeof v);
    if (!it || !onnx_push((void ***)&gr->initializer, &gr->n_initializer, it)) {
        if (it)
            onnx__tensor_proto__free_unpacked(it, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    const char *gin[2] = {QCAL_ONNX_GATES_INPUT, iname}, *hin[2] = {one, gout};
    Onnx__NodeProto *ga = onnx_new_node("Gather", gout, 2, gin, 1, &gout);
    Onnx__NodeProto *su = onnx_new_node("Sub", hout, 2, hin, 1, &hout);
    if (!ga || !su) {
        if (ga)
            onnx__node_proto__free_unpacked(ga, NULL);
        if (su)
            onnx__node_proto__free_unpacked(su, NULL);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    nodes[(*nn)++] = ga;
    nodes[(*nn)++] = su;
    *g_out = gout;
    *h_out = hout;
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
    const char **gnames = NULL, **hnames = NULL;
    int64_t n_node_ops = 0;
    /* Strings the rewrite replaces, freed when it is done. */
    char **dead = NULL;
    size_t n_dead = 0;
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
            if (!s.fl && !s.w) {
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
        op->name = onnx_strdup(n->name ? n->name : "");
        op->op_type = onnx_strdup(n->op_type);
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
            op->name = onnx_strdup(pnode && pnode->name ? pnode->name : "");
            op->op_type = onnx_strdup(pnode ? pnode->op_type : "Input");
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

    /* Rewrite: the gates input, a Gather and a Sub per op, a blend per slot, each new node placed
     * right before the op it feeds (the node array rebuilt in order). */
    {
        int64_t gdim = n_ops;
        qcal_onnx_tensor_desc gd;
        memset(&gd, 0, sizeof gd);
        gd.elem_type = 1; /* FLOAT: 0 or 1 */
        gd.ndim = 1;
        gd.dims[0] = gdim;
        Onnx__ValueInfoProto *vi = onnx_new_value_info(QCAL_ONNX_GATES_INPUT, &gd);
        if (!vi || !onnx_push((void ***)&g->input, &g->n_input, vi)) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        size_t cap = g->n_node + (size_t)n_ops * 2 + n_slots * 3 + n_outs * 5 + 1;
        Onnx__NodeProto **nodes = calloc(cap, sizeof *nodes);
        gnames = calloc((size_t)n_ops, sizeof *gnames);
        hnames = calloc((size_t)n_ops, sizeof *hnames);
        const char *one = onnx_gindex_fresh(&x, "qcal_one", "");
        float onef = 1.0f;
        Onnx__TensorProto *onet = one ? onnx_new_tensor(one, 1 /* FLOAT */, 0, NULL, &onef, sizeof onef) : NULL;
        if (onet && !onnx_push((void ***)&g->initializer, &g->n_initializer, onet)) {
            onnx__tensor_proto__free_unpacked(onet, NULL);
            onet = NULL;
        }
        if (!nodes || !gnames || !hnames || !onet) {
            free(nodes);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        size_t nn = 0, si = 0;
        int64_t oi = 0;
        for (size_t i = 0; i < g->n_node && st == QCAL_OK; i++) {
            while (oi < n_ops && ops[oi].node == (int64_t)i && ops[oi].node >= 0 && oi < n_node_ops &&
                   st == QCAL_OK) {
                if ((st = gate_nodes(&x, g, nodes, &nn, oi, one, &gnames[oi], &hnames[oi])) != QCAL_OK)
                    break;
                for (; si < n_slots && slots[si].node == (int64_t)i; si++) {
                    slot *s = &slots[si];
                    Onnx__NodeProto *n = g->node[i];
                    const char *fl = s->fl;
                    if (!fl) {
                        const uint8_t *data;
                        size_t nb;
                        void *owned = NULL;
                        if ((st = onnx_tensor_bytes(s->w, &data, &nb, &owned)) != QCAL_OK)
                            break;
                        const char *wn = onnx_gindex_fresh(&x, s->w->name ? s->w->name : "w", "_float");
                        Onnx__TensorProto *wt = wn ? onnx_new_tensor(wn, s->w->data_type, (int32_t)s->w->n_dims,
                                                                     s->w->dims, data, nb)
                                                   : NULL;
                        free(owned);
                        if (!wt || !onnx_push((void ***)&g->initializer, &g->n_initializer, wt)) {
                            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                            break;
                        }
                        fl = wn;
                    }
                    const char *wout = onnx_gindex_fresh(&x, n->input[s->k], "_gated");
                    char *dup = wout ? onnx_strdup(wout) : NULL;
                    if (!dup) {
                        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                        break;
                    }
                    if ((st = blend(&x, nodes, &nn, gnames[oi], hnames[oi], n->input[s->k], fl, wout)) != QCAL_OK) {
                        free(dup);
                        break;
                    }
                    if (!onnx_push((void ***)&dead, &n_dead, n->input[s->k])) {
                        free(dup);
                        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                        break;
                    }
                    n->input[s->k] = dup;
                }
                oi++;
            }
            nodes[nn++] = g->node[i];
        }
        /* Gated graph outputs: the writer's output renamed (its readers follow), then
         * the blend of renamed and float under the output's name, at the end. */
        for (size_t j = 0; j < n_outs && st == QCAL_OK; j++) {
            out_slot *o = &outs[j];
            const char *oname = g->output[o->out]->name;
            if (!gnames[o->gate] &&
                (st = gate_nodes(&x, g, nodes, &nn, o->gate, one, &gnames[o->gate], &hnames[o->gate])) != QCAL_OK)
                break;
            const char *qname = onnx_gindex_fresh(&x, oname, "_quantized");
            char *q1 = qname ? onnx_strdup(qname) : NULL;
            if (!q1) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            Onnx__NodeProto *wr = g->node[o->writer];
            char *old_name = wr->output[0];
            for (size_t k = 0; k < nn; k++)
                for (size_t a = 0; a < nodes[k]->n_input; a++)
                    if (nodes[k]->input[a] && !strcmp(nodes[k]->input[a], old_name)) {
                        char *d2 = onnx_strdup(qname);
                        if (!d2) {
                            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                            break;
                        }
                        if (!onnx_push((void ***)&dead, &n_dead, nodes[k]->input[a])) {
                            free(d2);
                            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                            break;
                        }
                        nodes[k]->input[a] = d2;
                    }
            if (st != QCAL_OK || !onnx_push((void ***)&dead, &n_dead, old_name)) {
                free(q1);
                st = st != QCAL_OK ? st : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            wr->output[0] = q1;
            if ((st = blend(&x, nodes, &nn, gnames[o->gate], hnames[o->gate], qname, o->fl, old_name)) != QCAL_OK)
                break;
        }
        if (st != QCAL_OK) {
            /* the new nodes are not in g yet: free them; g's own are still g's */
            for (size_t k = 0; k < nn; k++) {
                bool own = false;
                for (size_t j = 0; j < g->n_node && !own; j++)
                    own = nodes[k] == g->node[j];
                if (!own)
                    onnx__node_proto__free_unpacked(nodes[k], NULL);
            }
            free(nodes);
            goto done;
        }
        free(g->node);
        g->node = nodes;
        g->n_node = nn;
    }

done:
    onnx_gindex_free(&x);
    for (size_t i = 0; i < n_dead; i++)
        free(dead[i]);
    free(dead);
    free(slots);
    free(outs);
    free(gnames);
    free(hnames);
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
