/* The Q/DQ rewrite (onnx/qdq_shared.h): the plan applied to its graph, QuantizeLinear /
 * DequantizeLinear nodes and their initializers inserted before the nodes that read them;
 * only the main graph and If bodies are rewritten, Loop and Scan bodies stay float. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"

/* ONNX element type of a Q/DQ zero-point (and quantized tensor) of dtype. */
static int32_t onnx_type_of(qcal_dtype d)
{
    return d == QCAL_QUINT8          ? QCAL_ONNX_UINT8
           : d == QCAL_FLOAT8_E4M3FN ? QCAL_ONNX_FLOAT8E4M3FN
           : d == QCAL_FLOAT8_E5M2   ? QCAL_ONNX_FLOAT8E5M2
                                     : QCAL_ONNX_INT8;
}

/* A name not yet used anywhere in the model (onnx_gindex_fresh of the root's index), as a
 * copy the caller owns. */
static char *fresh_name(plan *p, const char *base, const char *suffix)
{
    const char *s = onnx_gindex_fresh(&(p->root ? p->root : p)->x, base, suffix);
    return s ? qcal_strdup(s) : NULL;
}

typedef struct builder {
    Onnx__NodeProto **nodes;
    size_t n_nodes;
    Onnx__TensorProto **inits;
    size_t n_inits;
    bool oom;
} builder;

static void b_init(builder *b, Onnx__TensorProto *t)
{
    if (!t || !onnx_push((void ***)&b->inits, &b->n_inits, t)) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        b->oom = true;
    }
}

static void b_node(builder *b, Onnx__NodeProto *n)
{
    if (!n || !onnx_push((void ***)&b->nodes, &b->n_nodes, n)) {
        if (n)
            protobuf_c_message_free_unpacked(&n->base, NULL);
        b->oom = true;
    }
}

/* Q and/or DQ nodes: x -> Q -> q_out -> DQ -> dq_out (q NULL: DQ of x only). */
static void b_qdq(plan *p, builder *b, const char *base, const char *x, const char *q_out,
                  const char *scale, const char *zp, const char *dq_out, int64_t axis)
{
    const char *dq_in = x;
    if (q_out) {
        char *name = fresh_name(p, base, "_QuantizeLinear");
        const char *in[3] = { x, scale, zp };
        Onnx__NodeProto *n = name ? onnx_new_node("QuantizeLinear", name, 3, in, 1, &q_out) : NULL;
        free(name);
        if (n && axis >= 0 && !onnx_node_add_int(n, "axis", axis)) {
            protobuf_c_message_free_unpacked(&n->base, NULL);
            n = NULL;
        }
        b_node(b, n);
        dq_in = q_out;
    }
    char *name = fresh_name(p, base, "_DequantizeLinear");
    const char *in[3] = { dq_in, scale, zp };
    Onnx__NodeProto *n = name ? onnx_new_node("DequantizeLinear", name, 3, in, 1, &dq_out) : NULL;
    free(name);
    if (n && axis >= 0 && !onnx_node_add_int(n, "axis", axis)) {
        protobuf_c_message_free_unpacked(&n->base, NULL);
        n = NULL;
    }
    b_node(b, n);
}

static void b_scalar_qparams(plan *p, builder *b, tinfo *ti)
{
    ti->scale_name = fresh_name(p, ti->name, "_scale");
    ti->zp_name = fresh_name(p, ti->name, "_zero_point");
    if (!ti->scale_name || !ti->zp_name) {
        b->oom = true;
        return;
    }
    b_init(b, onnx_new_tensor(ti->scale_name, QCAL_ONNX_FLOAT, 0, NULL, &ti->scale, 4));
    /* one byte: uint8 / int8 zero-point, or the FP8 zero-point 0 (type 17 / 19) */
    uint8_t z = (uint8_t)ti->zp;
    b_init(b, onnx_new_tensor(ti->zp_name, onnx_type_of(ti->dtype), 0, NULL, &z, 1));
}

/* A one-input Sum (an exact copy: ONNX's Sum of one tensor is that tensor): x -> out. */
static void b_fp8_guard(plan *p, builder *b, const char *base, const char *x, const char *out)
{
    char *name = fresh_name(p, base, "_fp8_guard");
    Onnx__NodeProto *n = name ? onnx_new_node("Sum", name, 1, &x, 1, &out) : NULL;
    free(name);
    b_node(b, n);
}

/* Q/DQ of activation ti, after its producer (or in front for graph inputs).
 *
 * FP8 with profile ort: x -> Sum -> Q -> DQ -> Sum -> readers (docs/fp8.md "ONNX Runtime's
 * optimizer"). ONNX Runtime 1.30's QDQ selectors only check the Q/DQ types against 16- and
 * 4-bit integers, so at level extended/all they fuse a float8 node unit (DQ -> Conv -> Q,
 * DQ -> Gemm, DQ -> Add -> Q, ...) into QLinearConv / QGemm / QLinearAdd, which have no
 * float8 kernels (the session then refuses the model), and its QDQ propagation and drop
 * rules move an FP8 Q/DQ pair around MaxPool / Reshape and run those on float8 codes; its
 * basic-level WeightBiasQuantization also rewrites a float bias into an int32 DQ there. The
 * one-input Sum on each side is a copy no ORT transformer removes or matches: no op reads a
 * DQ directly and no Q follows an op directly, so none of those rules applies, and every
 * level runs the unoptimized graph's float ops on the same FP8 values. */
static void b_act(plan *p, builder *b, tinfo *ti)
{
    b_scalar_qparams(p, b, ti);
    if (p->opt->profile == QCAL_ONNX_PROFILE_ORT && qcal_dtype_is_float8(ti->dtype)) {
        ti->q_out = fresh_name(p, ti->name, "_QuantizeLinear_Output");
        ti->dq_out = ti->rename ? qcal_strdup(ti->name) : fresh_name(p, ti->name, "_DequantizeLinear_Output_fp8");
        char *gin = fresh_name(p, ti->name, "_QuantizeLinear_Input_fp8");
        char *raw = fresh_name(p, ti->name, "_DequantizeLinear_Output");
        if (!ti->q_out || !ti->dq_out || !gin || !raw || (ti->rename && !ti->pre) || b->oom) {
            free(gin);
            free(raw);
            b->oom = true;
            return;
        }
        b_fp8_guard(p, b, ti->name, ti->rename ? ti->pre : ti->name, gin);
        b_qdq(p, b, ti->name, gin, ti->q_out, ti->scale_name, ti->zp_name, raw, -1);
        b_fp8_guard(p, b, raw, raw, ti->dq_out);
        free(gin);
        free(raw);
        return;
    }
    ti->q_out = fresh_name(p, ti->name, "_QuantizeLinear_Output");
    if (ti->rename) {
        ti->dq_out = qcal_strdup(ti->name);
        if (!ti->pre)
            b->oom = true;
    } else {
        ti->dq_out = fresh_name(p, ti->name, "_DequantizeLinear_Output");
    }
    if (!ti->q_out || !ti->dq_out || b->oom) {
        b->oom = true;
        return;
    }
    b_qdq(p, b, ti->name, ti->rename ? ti->pre : ti->name, ti->q_out, ti->scale_name, ti->zp_name,
          ti->dq_out, -1);
}

static void b_weight(plan *p, builder *b, wplan *w)
{
    tinfo *ti = &p->t[w->t];
    Onnx__TensorProto *init = ti->init;
    char *sname = fresh_name(p, ti->name, "_scale"), *zname = fresh_name(p, ti->name, "_zero_point");
    w->dq_out = fresh_name(p, ti->name, "_DequantizeLinear_Output");
    int64_t ch = w->channels;
    /* per-tensor: scalar scale and zero-point, DQ without an axis */
    int32_t qdims = w->per_tensor ? 0 : 1, qaxis = w->per_tensor ? -1 : w->axis;
    if (!sname || !zname || !w->dq_out) {
        b->oom = true;
        goto out;
    }
    Onnx__TensorProto *scale_t = onnx_new_tensor(sname, QCAL_ONNX_FLOAT, qdims, &ch, w->scales, (size_t)ch * 4);
    if (scale_t && w->lazy >= 0) {   /* filled by qdq_lazy_run */
        p->lw[w->lazy].scale_t = scale_t;
        p->lw[w->lazy].scale_dst = scale_t->raw_data.data;
    }
    b_init(b, scale_t);
    b_init(b, onnx_new_tensor(zname, onnx_type_of(w->dtype), qdims, &ch, w->zps, (size_t)ch));
    if (p->opt->profile == QCAL_ONNX_PROFILE_ORT) {
        char *qname = fresh_name(p, ti->name, "_quantized");
        if (!qname) {
            b->oom = true;
            goto out;
        }
        /* the codes become the initializer's data (no copy) */
        Onnx__TensorProto *qt = onnx_new_tensor_take(qname, onnx_type_of(w->dtype), (int32_t)init->n_dims,
                                                     init->dims, w->codes, (size_t)w->numel);
        if (qt) {
            if (w->lazy >= 0) {   /* filled by qdq_lazy_run */
                p->lw[w->lazy].codes_t = qt;
                p->lw[w->lazy].codes_dst = w->codes;
            }
            w->codes = NULL;
        }
        b_init(b, qt);
        b_qdq(p, b, ti->name, qname, NULL, sname, zname, w->dq_out, qaxis);
        free(qname);
    } else {
        const char *src = ti->name;
        char *f32 = NULL;
        if (w->f32) {
            f32 = fresh_name(p, ti->name, "_float32");
            if (!f32) {
                b->oom = true;
                goto out;
            }
            b_init(b, onnx_new_tensor(f32, QCAL_ONNX_FLOAT, (int32_t)init->n_dims, init->dims, w->f32,
                                      (size_t)w->numel * 4));
            free(w->f32);
            w->f32 = NULL;
            src = f32;
        }
        char *qout = fresh_name(p, ti->name, "_QuantizeLinear_Output");
        if (qout)
            b_qdq(p, b, ti->name, src, qout, sname, zname, w->dq_out, qaxis);
        else
            b->oom = true;
        free(qout);
        free(f32);
    }
out:
    free(sname);
    free(zname);
}

static void b_bias(plan *p, builder *b, bplan *bp)
{
    tinfo *ti = &p->t[bp->t];
    char *qname = fresh_name(p, ti->name, "_quantized");
    char *sname = fresh_name(p, ti->name, "_scale"), *zname = fresh_name(p, ti->name, "_zero_point");
    bp->dq_out = fresh_name(p, ti->name, "_DequantizeLinear_Output");
    int32_t *zeros = calloc((size_t)bp->n, sizeof *zeros);
    if (qname && sname && zname && bp->dq_out && zeros) {
        int64_t n = bp->n;
        Onnx__TensorProto *ct = onnx_new_tensor(qname, QCAL_ONNX_INT32, 1, &n, bp->codes, (size_t)n * 4);
        Onnx__TensorProto *sc = onnx_new_tensor(sname, QCAL_ONNX_FLOAT, 1, &n, bp->scales, (size_t)n * 4);
        if (bp->lazy >= 0) {   /* filled by qdq_bias_run */
            lazy_b *l = &p->lb[bp->lazy];
            l->codes_t = ct;
            l->scales_t = sc;
            l->codes_dst = ct ? ct->raw_data.data : NULL;
            l->scales_dst = sc ? sc->raw_data.data : NULL;
        }
        b_init(b, ct);
        b_init(b, sc);
        b_init(b, onnx_new_tensor(zname, QCAL_ONNX_INT32, 1, &n, zeros, (size_t)n * 4));
        b_qdq(p, b, ti->name, qname, NULL, sname, zname, bp->dq_out, 0);
    } else {
        b->oom = true;
    }
    free(qname), free(sname), free(zname), free(zeros);
}

bool qdq_replace_str(char **slot, const char *with)
{
    char *s = qcal_strdup(with);
    if (!s)
        return false;
    free(*slot);
    *slot = s;
    return true;
}

qcal_status qdq_apply(plan *p, qcal_onnx_qdq_report *rep)
{
    Onnx__GraphProto *g = p->g;
    bool ort = p->opt->profile == QCAL_ONNX_PROFILE_ORT;
    builder b = { 0 };
    int64_t n_act = 0, n_ops = 0;
    /* Which activations get Q/DQ: assigned ones with a quantized consumer (tensorrt) or,
     * for ort, also the outputs placed by their producer. */
    bool *qdq = calloc((size_t)p->nt + 1, sizeof *qdq);
    if (!qdq)
        return OOM();
    for (size_t i = 0; i < g->n_node; i++) {
        const nplan *np = &p->np[i];
        if (!np->quant)
            continue;
        n_ops++;
        for (int k = 0; k < np->nact; k++)
            qdq[qdq_tensor_index(p, g->node[i]->input[np->act[k]])] = true;
    }
    if (ort)
        for (int64_t t = 0; t < p->nt; t++)
            if (p->t[t].assigned && p->x.t[t].producer >= 0)
                qdq[t] = true;
    for (int64_t t = 0; t < p->nt; t++) {
        if (!qdq[t])
            continue;
        n_act++;
        tinfo *ti = &p->t[t];
        if (ort && p->x.t[t].graph_out && !p->x.t[t].graph_in && p->x.t[t].producer >= 0) {
            ti->rename = true;
            ti->pre = fresh_name(p, ti->name, "_QuantizeLinear_Input");
        }
    }
    /* The types borrow strings the rewrite replaces: done with them (the index owns its
     * names: it serves the rewrite). */
    onnx_types_free(&p->ty);
    /* Constant nodes whose value is a weight or bias quantized here become initializers of
     * the same name (the node goes): the rewrite then treats them as any initializer. */
    for (int64_t i = 0; i < p->nw + p->nb && !b.oom; i++) {
        const int64_t t = i < p->nw ? p->w[i].t : p->b[i - p->nw].t, cnode = qdq_const_node(p, t);
        const tinfo *ti = &p->t[t];
        if (cnode < 0 || ti->outer || p->np[cnode].gone)
            continue;
        Onnx__NodeProto *cn = g->node[cnode];
        Onnx__AttributeProto *va = (Onnx__AttributeProto *)onnx_node_attr(cn, "value");
        Onnx__TensorProto **ni = realloc(g->initializer, (g->n_initializer + 1) * sizeof *ni);
        char *name = qcal_strdup(ti->name);
        /* the old name stays alive with the plan (a lazy weight's src holds it) */
        if (!ni || !name || (va->t->name && !onnx_push((void ***)&p->owned_names, (size_t *)&p->nowned, va->t->name))) {
            if (ni)
                g->initializer = ni;
            free(name);
            b.oom = true;
            break;
        }
        g->initializer = ni;
        va->t->name = name;
        g->initializer[g->n_initializer++] = va->t;
        va->t = NULL;
        p->np[cnode].gone = true;
    }
    /* Identity nodes between a quantized weight or bias and its reader that nothing reads
     * once the reader takes the quantized tensor (last first: chains of them). */
    onnx_map reads = { 0 };
    for (size_t i = 0; i < g->n_node && !b.oom; i++) {
        const nplan *np = &p->np[i];
        for (size_t k = 0; k < g->node[i]->n_input && !np->gone; k++) {
            const char *in = g->node[i]->input[k];
            if (!in[0] || (np->quant && (((int)k == np->wslot && np->w >= 0) || ((int)k == np->bslot && np->b >= 0))))
                continue;
            int64_t *c = onnx_map_get(&reads, in);
            if (c)
                ++*c;
            else
                b.oom |= !onnx_map_put(&reads, in, 1);
        }
    }
    for (size_t i = g->n_node; i-- > 0 && !b.oom;) {
        if (!p->np[i].via || p->np[i].gone)
            continue;
        const Onnx__NodeProto *n = g->node[i];
        int64_t t = qdq_tensor_index(p, n->output[0]);
        int64_t *c = onnx_map_get(&reads, n->output[0]);
        if (t < 0 || (c && *c) || p->x.t[t].graph_out || p->x.t[t].sub_ref)
            continue;
        p->np[i].gone = true;
        if ((c = onnx_map_get(&reads, n->input[0])))
            --*c;
    }
    onnx_map_free(&reads);
    /* Front: weights, biases, Q/DQ of graph inputs. */
    for (int64_t i = 0; i < p->nw; i++)
        b_weight(p, &b, &p->w[i]);
    for (int64_t i = 0; i < p->nb; i++)
        b_bias(p, &b, &p->b[i]);
    for (int64_t t = 0; t < p->nt; t++)
        if (qdq[t] && p->x.t[t].producer < 0)
            b_act(p, &b, &p->t[t]);
    /* Nodes in order, each followed by the Q/DQ of what it produces. The originals' inputs
     * are rewired in place (only new strings allocated; the node objects move over). */
    for (size_t i = 0; i < g->n_node && !b.oom; i++) {
        Onnx__NodeProto *n = g->node[i];
        const nplan *np = &p->np[i];
        if (np->gone)
            continue;
        for (size_t k = 0; k < n->n_input && !b.oom; k++) {
            if (!n->input[k][0])
                continue;
            if (np->quant && (int)k == np->wslot && np->w >= 0) {
                b.oom |= !qdq_replace_str(&n->input[k], p->w[np->w].dq_out);
                continue;
            }
            if (np->quant && (int)k == np->bslot && np->b >= 0) {
                b.oom |= !qdq_replace_str(&n->input[k], p->b[np->b].dq_out);
                continue;
            }
            int64_t t = qdq_tensor_index(p, n->input[k]);
            if (t < 0 || !qdq[t] || p->t[t].rename)
                continue;
            bool act_slot = false;
            for (int a = 0; a < np->nact; a++)
                act_slot |= np->act[a] == (int)k;
            if (ort || (np->quant && act_slot))
                b.oom |= !qdq_replace_str(&n->input[k], p->t[t].dq_out);
        }
        int64_t out_t[8];
        size_t n_out_t = n->n_output < 8 ? n->n_output : 8;
        for (size_t k = 0; k < n_out_t; k++)
            out_t[k] = n->output[k][0] ? qdq_tensor_index(p, n->output[k]) : -1;
        for (size_t k = 0; k < n_out_t && !b.oom; k++) {
            int64_t t = out_t[k];
            if (t >= 0 && qdq[t] && p->t[t].rename)
                b.oom |= !qdq_replace_str(&n->output[k], p->t[t].pre);
        }
        if (!b.oom && !onnx_push((void ***)&b.nodes, &b.n_nodes, n))
            b.oom = true;
        for (size_t k = 0; k < n_out_t && !b.oom; k++)
            if (out_t[k] >= 0 && qdq[out_t[k]] && p->x.t[out_t[k]].producer == (int64_t)i)
                b_act(p, &b, &p->t[out_t[k]]);
    }
    if (b.oom) {
        /* Out of memory half-way: free the new nodes (the originals stay in g->node, some
         * inputs already rewired: the model is not usable any more, as documented). */
        for (size_t i = 0; i < b.n_nodes; i++) {
            bool is_orig = false;
            for (size_t k = 0; k < g->n_node && !is_orig; k++)
                is_orig = g->node[k] == b.nodes[i];
            if (!is_orig)
                protobuf_c_message_free_unpacked(&b.nodes[i]->base, NULL);
        }
        for (size_t i = 0; i < b.n_inits; i++)
            protobuf_c_message_free_unpacked(&b.inits[i]->base, NULL);
        free(b.nodes);
        free(b.inits);
        free(qdq);
        return OOM();
    }
    for (size_t i = 0; i < g->n_node; i++)
        if (p->np[i].gone)
            protobuf_c_message_free_unpacked(&g->node[i]->base, NULL);
    free(g->node);
    g->node = b.nodes;
    g->n_node = b.n_nodes;
    /* Initializers: drop the float weights/biases nothing reads any more (a float op or
     * a subgraph may still), append the new ones. */
    onnx_map read = { 0 };
    for (size_t nn = 0; nn < g->n_node && !b.oom; nn++)
        for (size_t k = 0; k < g->node[nn]->n_input; k++)
            b.oom |= !onnx_map_put(&read, g->node[nn]->input[k], 0);
    size_t keep = 0;
    bool dropped_oom = false;
    for (size_t i = 0; i < g->n_initializer; i++) {
        Onnx__TensorProto *t = g->initializer[i];
        int64_t ti = t->name ? qdq_tensor_index(p, t->name) : -1;
        bool drop = false;
        if (!b.oom && ti >= 0 && !p->x.t[ti].graph_in && !p->x.t[ti].graph_out && !p->x.t[ti].sub_ref &&
            !onnx_map_get(&read, t->name)) {
            for (int64_t w = 0; w < p->nw && !drop; w++)
                drop = p->w[w].t == ti;
            for (int64_t w = 0; w < p->nb && !drop; w++)
                drop = p->b[w].t == ti;
        }
        bool lazy = false;   /* the save's pass still reads it: freed with the plan */
        for (int64_t w = 0; w < p->nw && drop && !lazy; w++)
            lazy = p->w[w].t == ti && p->w[w].lazy >= 0;
        if (lazy) {
            if (!onnx_push((void ***)&p->dropped, &p->ndropped, t)) {
                dropped_oom = true;
                g->initializer[keep++] = t;   /* kept in the graph: the model stays whole */
            }
        } else if (drop) {
            onnx_tensor_release(p->m, t);
            protobuf_c_message_free_unpacked(&t->base, NULL);
        } else {
            g->initializer[keep++] = t;
        }
    }
    onnx_map_free(&read);
    g->n_initializer = keep;
    Onnx__TensorProto **inits = dropped_oom ? NULL : realloc(g->initializer, (keep + b.n_inits + 1) * sizeof *inits);
    if (!inits) {
        for (size_t i = 0; i < b.n_inits; i++)
            protobuf_c_message_free_unpacked(&b.inits[i]->base, NULL);
        free(b.inits);
        free(qdq);
        return OOM();
    }
    if (b.n_inits)
        memcpy(inits + keep, b.inits, b.n_inits * sizeof *inits);
    g->initializer = inits;
    g->n_initializer = keep + b.n_inits;
    free(b.inits);
    free(qdq);
    if (rep) {
        rep->ops = n_ops;
        rep->tensors = n_act;
        rep->weights = p->nw;
        rep->biases = p->nb;
    }
    return QCAL_OK;
}

static bool read_anywhere(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_output; i++)
        if (g->output[i]->name && !strcmp(g->output[i]->name, name))
            return true;
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_input; k++)
            if (!strcmp(n->input[k], name))
                return true;
        for (size_t a = 0; a < n->n_attribute; a++) {
            const Onnx__AttributeProto *at = n->attribute[a];
            if (at->g && read_anywhere(at->g, name))
                return true;
            for (size_t k = 0; k < at->n_graphs; k++)
                if (read_anywhere(at->graphs[k], name))
                    return true;
        }
    }
    return false;
}

/* The float weights and biases of enclosing graphs that If bodies now read quantized: dropped
 * from the graph that holds them when nothing in the model reads them any more. */
qcal_status qdq_drop_outer_weights(subplans *sub)
{
    if (!sub->n)
        return QCAL_OK;
    const Onnx__GraphProto *main_g = sub->p[0]->root->g;
    for (size_t k = 0; k < sub->n; k++) {
        plan *q = sub->p[k];
        for (int64_t i = 0; i < q->nw + q->nb; i++) {
            const tinfo *ti = &q->t[i < q->nw ? q->w[i].t : q->b[i - q->nw].t];
            if (!ti->outer || read_anywhere(main_g, ti->name))
                continue;
            for (int s = 0; s < q->nscope; s++) {
                Onnx__GraphProto *o = (Onnx__GraphProto *)q->scope[s];
                size_t j = 0;
                while (j < o->n_initializer && o->initializer[j] != ti->init)
                    j++;
                if (j == o->n_initializer)
                    continue;
                bool is_input = false;
                for (size_t x = 0; x < o->n_input && !is_input; x++)
                    is_input = o->input[x]->name && !strcmp(o->input[x]->name, ti->name);
                if (!is_input) {
                    onnx_tensor_release(q->m, o->initializer[j]);
                    protobuf_c_message_free_unpacked(&o->initializer[j]->base, NULL);
                    memmove(o->initializer + j, o->initializer + j + 1,
                            (o->n_initializer - j - 1) * sizeof *o->initializer);
                    o->n_initializer--;
                }
                break;
            }
        }
    }
    return QCAL_OK;
}
