/* The Q/DQ plan (onnx/qdq_shared.h): which ops of a graph the profile quantizes, which of their
 * inputs are activations, weights and biases, and why an op stays float (the skipped list);
 * one plan per graph, If bodies included. Placement rules: docs/onnx.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"

void qdq_plan_free(plan *p)
{
    for (int64_t i = 0; i < p->nt; i++) {
        free(p->t[i].q_out);
        free(p->t[i].dq_out);
        free(p->t[i].pre);
        free(p->t[i].scale_name);
        free(p->t[i].zp_name);
    }
    for (int64_t i = 0; i < p->nw; i++) {
        free(p->w[i].scales);
        free(p->w[i].zps);
        free(p->w[i].codes);
        free(p->w[i].f32);
        free(p->w[i].dq_out);
    }
    for (int64_t i = 0; i < p->nb; i++) {
        free(p->b[i].scales);
        free(p->b[i].codes);
        free(p->b[i].dq_out);
    }
    for (int64_t i = 0; i < p->nlb; i++)
        free(p->lb[i].vals);
    free(p->lw);
    free(p->lb);
    for (size_t i = 0; i < p->ndropped; i++) {
        onnx_tensor_release(p->m, p->dropped[i]);
        protobuf_c_message_free_unpacked(&p->dropped[i]->base, NULL);
    }
    free(p->dropped);
    for (int64_t i = 0; i < p->nskipped; i++)
        free(p->skipped[i]);
    for (int64_t i = 0; i < p->nowned; i++)
        free(p->owned_names[i]);
    free(p->owned_names);
    free(p->scratch);
    free(p->skipped);
    free(p->list);
    free(p->untyped);
    onnx_types_free(&p->ty);
    onnx_gindex_free(&p->x);
    free(p->t);
    free(p->np);
    free(p->w);
    free(p->b);
}

static qcal_status index_graph(plan *p)
{
    Onnx__GraphProto *g = p->g;
    /* Fresh names must be new in the whole model (a body sees its enclosing graphs): the
     * root's index holds every name. */
    qcal_status st = onnx_gindex_build(g, p->root ? NULL : p->m->proto->graph, &p->x);
    if (st != QCAL_OK)
        return st;
    p->nt = p->x.n;
    p->t = calloc((size_t)p->nt + 1, sizeof *p->t);
    if (!p->t)
        return OOM();
    for (int64_t t = 0; t < p->nt; t++) {
        p->t[t].name = p->x.t[t].name;
        p->t[t].init = p->x.t[t].init;
    }
    /* Weights an If body reads from an enclosing graph (innermost definition first). */
    for (int64_t t = 0; t < p->nt; t++) {
        tinfo *ti = &p->t[t];
        if (p->x.t[t].producer >= 0 || ti->init || p->x.t[t].graph_in)
            continue;
        for (int s = 0; s < p->nscope && !ti->init; s++) {
            const Onnx__GraphProto *o = p->scope[s];
            bool defined = false;
            for (size_t i = 0; i < o->n_node && !defined; i++)
                for (size_t k = 0; k < o->node[i]->n_output && !defined; k++)
                    defined = !strcmp(o->node[i]->output[k], ti->name);
            for (size_t i = 0; i < o->n_input && !defined; i++)
                defined = o->input[i]->name && !strcmp(o->input[i]->name, ti->name);
            if (defined)
                break;
            for (size_t i = 0; i < o->n_initializer; i++)
                if (o->initializer[i]->name && !strcmp(o->initializer[i]->name, ti->name)) {
                    ti->init = o->initializer[i];
                    ti->outer = true;
                    break;
                }
        }
    }
    /* Which tensors carry data: graph inputs and names of enclosing graphs, then what a
     * node computes from them, except shapes (Shape, Size, ConstantOfShape) and Constants.
     * A node with a body (If, Loop, Scan) may read anything: its outputs carry data. */
    for (int64_t t = 0; t < p->nt; t++) {
        tinfo *ti = &p->t[t];
        const onnx_tref *r = &p->x.t[t];
        ti->data = r->graph_in || (!ti->init && r->producer < 0);
        for (const plan *u = p->up; ti->data && !r->graph_in && u; u = u->up) {
            int64_t o = qdq_tensor_index(u, ti->name);
            if (o >= 0) {
                ti->data = u->t[o].data;
                break;
            }
        }
    }
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        bool dflt = !n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx");
        bool d = false;
        if (!(dflt && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size") ||
                       !strcmp(n->op_type, "Constant") || !strcmp(n->op_type, "ConstantOfShape")))) {
            for (size_t k = 0; k < n->n_input && !d; k++) {
                int64_t ti = n->input[k][0] ? qdq_tensor_index(p, n->input[k]) : -1;
                d = ti >= 0 && p->t[ti].data;
            }
            for (size_t a = 0; a < n->n_attribute && !d; a++)
                d = n->attribute[a]->g || n->attribute[a]->n_graphs;
        }
        for (size_t k = 0; k < n->n_output; k++) {
            int64_t ti = n->output[k][0] ? qdq_tensor_index(p, n->output[k]) : -1;
            if (ti >= 0 && p->x.t[ti].producer == (int64_t)i)
                p->t[ti].data = d;
        }
    }
    st = onnx_types_build(g, p->up ? &p->up->ty : NULL, &p->ty);
    if (st != QCAL_OK)
        return st;
    p->np = calloc(g->n_node + 1, sizeof *p->np);
    return p->np ? QCAL_OK : OOM();
}

/* The Identity nodes between name and its constant: the rewrite drops those nothing reads
 * once the quantized weight or bias replaces name in its reader. */
static void mark_identities(plan *p, const char *name)
{
    for (int guard = 0; guard < 8; guard++) {
        int64_t t = qdq_tensor_index(p, name);
        if (t < 0 || p->t[t].init || p->x.t[t].producer < 0)
            return;
        const Onnx__NodeProto *n = p->g->node[p->x.t[t].producer];
        if (strcmp(n->op_type, "Identity") || n->n_input != 1)
            return;
        p->np[p->x.t[t].producer].via = true;
        name = n->input[0];
    }
}

static qcal_status add_skip(plan *p, const Onnx__NodeProto *n, const char *fmt, const char *arg)
{
    char reason[512];
    snprintf(reason, sizeof reason, fmt, arg);
    size_t len = strlen(n->name ? n->name : "") + strlen(n->op_type) + strlen(reason) + 8;
    char *s = malloc(len);
    if (!s || !onnx_push((void ***)&p->skipped, (size_t *)&p->nskipped, s)) {
        free(s);
        return OOM();
    }
    snprintf(s, len, "%s (%s): %s", n->name && n->name[0] ? n->name : "(unnamed)", n->op_type, reason);
    return QCAL_OK;
}

/* The element type of name (declared or inferred: onnx_types_build), 0 when unknown. */
static int32_t elem_type_of(const plan *p, const char *name)
{
    return onnx_type_get(&p->ty, name);
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t def)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a && a->has_i ? a->i : def;
}

static float attr_float(const Onnx__NodeProto *n, const char *name, float def)
{
    const Onnx__AttributeProto *a = onnx_node_attr(n, name);
    return a && a->has_f ? a->f : def;
}


static void assign(tinfo *ti)
{
    ti->assigned = true;
}


static qcal_status plan_node(plan *p, size_t i)
{
    Onnx__NodeProto *n = p->g->node[i];
    nplan *np = &p->np[i];
    np->wslot = np->bslot = -1;
    np->w = np->b = -1;
    const op_def *d = qdq_op_of(p, n);
    if (!d || d->kind == K_ACT)   /* Clip: fused by the op before it, if any */
        return QCAL_OK;
    if (qdq_excluded(p, n->name))
        return add_skip(p, n, "%sexcluded by --exclude", "");
    bool trt = p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT;
    const char *in0 = n->n_input > 0 ? n->input[0] : "";
    const char *in1 = n->n_input > 1 ? n->input[1] : "";
    const char *in2 = n->n_input > 2 ? n->input[2] : "";
    int32_t axis = 0;
    int64_t out_ch = 0;
    switch (d->kind) {
    case K_CONV:
    case K_CONVT:
        np->act[np->nact++] = 0;
        np->wslot = 1;
        np->bslot = in2[0] ? 2 : -1;
        axis = d->kind == K_CONV ? 0 : 1;
        break;
    case K_GEMM:
    case K_MATMUL: {
        np->act[np->nact++] = 0;
        if (qdq_const_src(p, in1) >= 0) {
            np->wslot = 1;
            axis = d->kind == K_GEMM && attr_int(n, "transB", 0) ? 0 : 1;
        } else {
            np->act[np->nact++] = 1;
        }
        if (d->kind == K_GEMM && in2[0])
            np->bslot = 2;
        break;
    }
    case K_BINARY: {
        for (int k = 0; k < 2; k++) {
            const char *in = k ? in1 : in0;
            int64_t tk = qdq_tensor_index(p, in);
            if (!in[0] || tk < 0 || p->t[tk].init)
                return add_skip(p, n, "input '%s' is a constant (only activation pairs are quantized)", in);
            np->act[np->nact++] = k;
        }
        break;
    }
    case K_POOL:
    case K_MOVE:
        np->act[np->nact++] = 0;
        break;
    case K_ACT:
        return QCAL_OK;
    }
    if (n->n_input < (size_t)np->nact || (np->wslot >= 0 && n->n_input <= (size_t)np->wslot))
        return add_skip(p, n, "%stoo few inputs", "");
    /* Structural checks before any qdq_lookup. */
    if (np->wslot >= 0) {
        int64_t tw = qdq_const_src(p, n->input[np->wslot]);
        if (tw < 0)
            return add_skip(p, n, "weight '%s' is not an initializer", n->input[np->wslot]);
        if (qdq_excluded(p, n->input[np->wslot]))
            return add_skip(p, n, "weight '%s' qdq_excluded by --exclude", n->input[np->wslot]);
        int32_t wt = p->t[tw].init->data_type;
        if (wt != QCAL_ONNX_FLOAT && wt != QCAL_ONNX_FLOAT16 && wt != QCAL_ONNX_BFLOAT16 &&
            wt != QCAL_ONNX_DOUBLE)
            return add_skip(p, n, "weight '%s' is not a float tensor", n->input[np->wslot]);
        if ((d->kind == K_GEMM || d->kind == K_MATMUL) && p->t[tw].init->n_dims != 2)
            return add_skip(p, n, "weight '%s' is not 2-D", n->input[np->wslot]);
        if ((d->kind == K_CONV || d->kind == K_CONVT) && p->t[tw].init->n_dims < 3)
            return add_skip(p, n, "weight '%s' has fewer than 3 dimensions", n->input[np->wslot]);
        out_ch = p->t[tw].init->n_dims > (size_t)axis ? p->t[tw].init->dims[axis] : 0;
        if (d->kind == K_CONVT)
            out_ch *= attr_int(n, "group", 1);
        if (d->kind == K_GEMM && attr_int(n, "transB", 0) == 0)
            out_ch = p->t[tw].init->dims[1];
    }
    for (int k = 0; k < np->nact; k++) {
        const char *in = n->input[np->act[k]];
        if (!in[0] || qdq_tensor_index(p, in) < 0)   /* an omitted (empty) input */
            return add_skip(p, n, "input %s has no name", np->act[k] ? "1" : "0");
        if (qdq_excluded(p, in))
            return add_skip(p, n, "input '%s' qdq_excluded by --exclude", in);
        int32_t et = elem_type_of(p, in);
        if (et == 0) {
            tinfo *ti = &p->t[qdq_tensor_index(p, in)];
            if (!ti->untyped) {
                ti->untyped = true;
                if (!onnx_push((void ***)&p->untyped, (size_t *)&p->nuntyped, (void *)ti->name))
                    return OOM();
            }
            return add_skip(p, n, "input '%s' has an element type neither declared nor inferred", in);
        }
        if (et != QCAL_ONNX_FLOAT)
            return add_skip(p, n, "input '%s' is not float32", in);
        if (!p->t[qdq_tensor_index(p, in)].data)
            return add_skip(p, n, "input '%s' is a constant or shape arithmetic, not data", in);
    }
    /* Activation inputs: all must have qparams. */
    bool all = true;
    for (int k = 0; k < np->nact; k++) {
        int64_t t = qdq_tensor_index(p, n->input[np->act[k]]);
        bool found;
        qcal_status st = qdq_lookup(p, t, &found);
        if (st != QCAL_OK)
            return st;
        all &= found;
    }
    if (!all)
        return QCAL_OK;   /* listed as missing; the op stays float */
    /* An FP8 activation input makes the node FP8: weight in its FP8 dtype, bias float. */
    qcal_dtype wdt = QCAL_QINT8;
    if (p->table)
        for (int k = 0; k < np->nact; k++) {
            const tinfo *ta = &p->t[qdq_tensor_index(p, n->input[np->act[k]])];
            if (qcal_dtype_is_float8(ta->dtype))
                wdt = ta->dtype;
        }
    if (np->wslot >= 0 && p->table && !p->opt->float_weights) {
        int64_t tw = qdq_const_src(p, n->input[np->wslot]);
        qcal_status st = qdq_plan_weight(p, n, tw, axis, wdt, &np->w);
        if (st == QCAL_ERR_MISMATCH)
            return add_skip(p, n, "weight '%s' is shared with an op that needs another channel axis "
                            "or dtype", n->input[np->wslot]);
        if (st != QCAL_OK)
            return st;
        mark_identities(p, n->input[np->wslot]);
    }
    np->quant = true;
    for (int k = 0; k < np->nact; k++)
        assign(&p->t[qdq_tensor_index(p, n->input[np->act[k]])]);
    if (!trt && np->bslot >= 0 && np->w >= 0 && p->table && !qcal_dtype_is_float8(wdt)) {
        int64_t tb = qdq_const_src(p, n->input[np->bslot]);
        const char *why = NULL;
        if (d->kind == K_GEMM && (attr_float(n, "alpha", 1.0f) != 1.0f || attr_float(n, "beta", 1.0f) != 1.0f))
            why = "bias '%s' stays float: Gemm alpha or beta is not 1";
        else if (tb < 0 || qdq_excluded(p, n->input[np->bslot]))
            why = "bias '%s' stays float: not an initializer";
        else {
            int64_t tx = qdq_tensor_index(p, n->input[0]);
            qcal_status st = qdq_plan_bias(p, tb, p->t[tx].scale, np->w, out_ch, &np->b, &why);
            if (st != QCAL_OK)
                return st;
            if (np->b >= 0)
                mark_identities(p, n->input[np->bslot]);
        }
        if (np->b < 0 && why) {
            qcal_status st = add_skip(p, n, why, n->input[np->bslot]);
            if (st != QCAL_OK)
                return st;
        }
    }
    if (trt || n->n_output < 1 || !n->output[0][0])
        return QCAL_OK;
    /* ort: the output Q (node unit DQ -> op -> Q). */
    int64_t to = qdq_tensor_index(p, n->output[0]);
    if (d->kind == K_MOVE) {
        tinfo *src = &p->t[qdq_tensor_index(p, n->input[0])];
        tinfo *dst = &p->t[to];
        if (!qdq_excluded(p, dst->name) && !dst->assigned) {
            dst->dtype = src->dtype;
            dst->scale = src->scale;
            dst->zp = src->zp;
            assign(dst);
        }
        return QCAL_OK;
    }
    float clip_lo = 0.0f, clip_hi = 0.0f;
    int64_t act = qdq_fused_relu(p, to);
    bool clip = false;
    if (act < 0 && (act = qdq_fused_clip(p, to, &clip_lo, &clip_hi)) >= 0)
        clip = true;
    if (act >= 0)
        to = qdq_tensor_index(p, p->g->node[act]->output[0]);
    if (qdq_excluded(p, p->t[to].name))
        return QCAL_OK;
    int64_t from = qdq_move_chain_end(p, to);
    bool found;
    qcal_status st = qdq_lookup(p, from, &found);
    if (st != QCAL_OK)
        return st;
    if (found && from != to && !p->t[to].assigned) {
        p->t[to].dtype = p->t[from].dtype;
        p->t[to].scale = p->t[from].scale;
        p->t[to].zp = p->t[from].zp;
    }
    if (found && clip && p->table && !p->t[to].assigned) {
        st = qdq_clip_qparams(&p->t[to], clip_lo, clip_hi);
        if (st != QCAL_OK)
            return st;
    }
    if (found)
        assign(&p->t[to]);
    return QCAL_OK;
}

static qcal_status plan_graph(plan *p);

qcal_status qdq_plan_build(plan *p, const qcal_onnx_model *m, const qcal_calib_table *table,
                           const qcal_onnx_qdq_options *opt, bool lazy)
{
    memset(p, 0, sizeof *p);
    p->lazy = lazy;
    p->m = m;
    p->opt = opt;
    p->table = table;
    p->g = m->proto->graph;
    return plan_graph(p);
}

static qcal_status plan_graph(plan *p)
{
    qcal_status st = qdq_select_ops(p);
    if (st == QCAL_OK)
        st = index_graph(p);
    for (size_t i = 0; st == QCAL_OK && i < p->g->n_node; i++)
        st = plan_node(p, i);
    return st;
}

void qdq_subplans_free(subplans *s)
{
    for (size_t i = 0; i < s->n; i++) {
        qdq_plan_free(s->p[i]);
        free(s->p[i]);
    }
    free(s->p);
    memset(s, 0, sizeof *s);
}

bool qdq_is_if(const Onnx__NodeProto *n)
{
    return !strcmp(n->op_type, "If") && (!n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx"));
}

qcal_status qdq_collect_subplans(plan *root, const plan *encl, const Onnx__GraphProto *g,
                                 const Onnx__GraphProto *const *scope, int nscope, subplans *out)
{
    if (nscope >= MAX_SCOPES)
        return QCAL_OK;   /* bodies nested deeper than MAX_SCOPES levels stay float */
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (!qdq_is_if(n))
            continue;
        for (size_t a = 0; a < n->n_attribute; a++) {
            Onnx__GraphProto *body = n->attribute[a]->g;
            if (!body)
                continue;
            plan *sp = calloc(1, sizeof *sp);
            if (!sp || !onnx_push((void ***)&out->p, &out->n, sp)) {
                free(sp);
                return OOM();
            }
            sp->root = root;
            sp->up = encl;
            sp->m = root->m;
            sp->opt = root->opt;
            sp->table = root->table;
            sp->g = body;
            sp->scope[0] = g;
            for (int k = 0; k < nscope; k++)
                sp->scope[k + 1] = scope[k];
            sp->nscope = nscope + 1;
            qcal_status st = plan_graph(sp);
            if (st == QCAL_OK)
                st = qdq_collect_subplans(root, sp, body, sp->scope, sp->nscope, out);
            if (st != QCAL_OK)
                return st;
        }
    }
    return QCAL_OK;
}

qcal_status qdq_check_opts(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt)
{
    if (!m || !opt)
        return qcal_error(QCAL_ERR_INVALID_ARG, "NULL model or options");
    if (opt->profile != QCAL_ONNX_PROFILE_ORT && opt->profile != QCAL_ONNX_PROFILE_TENSORRT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown profile %d", (int)opt->profile);
    if (opt->n_exclude < 0 || (opt->n_exclude && !opt->exclude))
        return qcal_error(QCAL_ERR_INVALID_ARG, "bad exclude list");
    if (opt->weight_observer != QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
        opt->weight_observer != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "weight observer '%s' is not a per-channel kind (per_channel_minmax, moving_average_per_channel_minmax)",
                          qcal_observer_kind_name(opt->weight_observer));
    if (opt->weight_qscheme != QCAL_PER_TENSOR_AFFINE && opt->weight_qscheme != QCAL_PER_TENSOR_SYMMETRIC &&
        opt->weight_qscheme != QCAL_PER_CHANNEL_AFFINE && opt->weight_qscheme != QCAL_PER_CHANNEL_SYMMETRIC)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "weight qscheme %d is not per_tensor_affine, per_tensor_symmetric, per_channel_affine or per_channel_symmetric",
                          (int)opt->weight_qscheme);
    if (opt->profile == QCAL_ONNX_PROFILE_TENSORRT && (opt->weight_qscheme == QCAL_PER_TENSOR_AFFINE ||
                                                       opt->weight_qscheme == QCAL_PER_CHANNEL_AFFINE))
        return qcal_error(QCAL_ERR_INVALID_ARG, "profile tensorrt takes symmetric weights only (zero-points 0), not %s",
                          qcal_qscheme_name(opt->weight_qscheme));
    return QCAL_OK;
}
