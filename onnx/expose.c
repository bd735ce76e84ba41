/* Which tensors a profile quantizes (qcal_onnx_list: the plan without a table) and
 * qcal_onnx_expose, which makes them graph outputs (shapes of unknown dimensions where the
 * model declares none; names read inside If/Loop bodies exposed through their bodies). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"

/* The listed names (untyped: those of unknown element type instead), main graph first. */
static qcal_status list_names(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, bool untyped,
                              char ***names, int64_t *n)
{
    qcal_onnx_qdq_options def;
    qcal_onnx_qdq_options_default(&def);
    if (!opt)
        opt = &def;
    if (!names || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_list: NULL argument");
    qcal_status st = qdq_check_opts(m, opt);
    if (st != QCAL_OK)
        return st;
    plan p;
    subplans sub = { 0 };
    st = qdq_plan_build(&p, m, NULL, opt, false);
    if (st == QCAL_OK)
        st = qdq_collect_subplans(&p, &p, p.g, NULL, 0, &sub);
    char **out = NULL;
    int64_t nout = 0, total = untyped ? p.nuntyped : p.nlist;
    for (size_t k = 0; k < sub.n; k++)
        total += untyped ? sub.p[k]->nuntyped : sub.p[k]->nlist;
    onnx_map seen = { 0 };
    if (st == QCAL_OK) {
        out = calloc((size_t)total + 1, sizeof *out);
        if (!out)
            st = OOM();
        /* main graph first, then the If bodies in graph order; each name once */
        for (size_t k = 0; st == QCAL_OK && k <= sub.n; k++) {
            const plan *q = k ? sub.p[k - 1] : &p;
            char **l = untyped ? q->untyped : q->list;
            for (int64_t i = 0; st == QCAL_OK && i < (untyped ? q->nuntyped : q->nlist); i++) {
                if (onnx_map_get(&seen, l[i]))
                    continue;
                if (!(out[nout] = qcal_strdup(l[i])) || !onnx_map_put(&seen, out[nout], 0))
                    st = OOM();
                nout += out[nout] != NULL;
            }
        }
        if (st != QCAL_OK) {
            qcal_onnx_names_free(&out, nout);
        } else {
            *names = out;
            *n = nout;
        }
    }
    onnx_map_free(&seen);
    qdq_subplans_free(&sub);
    qdq_plan_free(&p);
    return st;
}

qcal_status qcal_onnx_list(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, char ***names,
                           int64_t *n)
{
    return list_names(m, opt, false, names, n);
}

qcal_status qcal_onnx_list_untyped(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, char ***names,
                                   int64_t *n)
{
    return list_names(m, opt, true, names, n);
}

void qcal_onnx_names_free(char ***names, int64_t n)
{
    if (!names || !*names)
        return;
    for (int64_t i = 0; i < n; i++)
        free((*names)[i]);
    free(*names);
    *names = NULL;
}

/* Ranks of the main graph's tensors where the model declares no shape: from the declared
 * ones through the rank rules of common ops, so an exposed output gets a shape of unknown
 * dimensions (onnx.checker requires a shape on graph outputs). -1: unknown. */
static const char *const same_rank_ops[] = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "LpPool", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu", "Softplus",
    "BatchNormalization", "InstanceNormalization", "LayerNormalization", "LRN", "Dropout",
    "Identity", "Softmax", "LogSoftmax", "Cast", "Neg", "Abs", "Sqrt", "Exp", "Log", "Erf",
    "HardSigmoid", "HardSwish", "Gelu", "Mish", "QuantizeLinear", "DequantizeLinear",
    "Transpose", "Pad", "Resize", "Upsample", "Concat", "Slice", "Floor", "Ceil", "Round",
    "Reciprocal", "Sign", "Not", "DepthToSpace", "SpaceToDepth", NULL,
};
static const char *const broadcast_ops[] = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
    "Greater", "And", "Or", "Xor", "BitShift", "Mod", "LessOrEqual", "GreaterOrEqual", NULL,
};

static bool in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return true;
    return false;
}

static int64_t rank_of(const onnx_map *r, const char *name)
{
    int64_t *v = name && name[0] ? onnx_map_get(r, name) : NULL;
    return v ? *v : -1;
}

static int64_t init_numel(const Onnx__GraphProto *g, const char *name)
{
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name && !strcmp(g->initializer[i]->name, name)) {
            int64_t n;
            return onnx_tensor_numel(g->initializer[i], &n) ? n : -1;
        }
    return -1;
}

static bool infer_ranks(const Onnx__GraphProto *g, onnx_map *r)
{
    bool ok = true;
    for (size_t i = 0; i < g->n_initializer; i++)
        if (g->initializer[i]->name)
            ok &= onnx_map_put(r, g->initializer[i]->name, (int64_t)g->initializer[i]->n_dims);
    for (size_t i = 0; i < g->n_input + g->n_value_info + g->n_output; i++) {
        const Onnx__ValueInfoProto *v = i < g->n_input ? g->input[i]
                                        : i < g->n_input + g->n_value_info ? g->value_info[i - g->n_input]
                                        : g->output[i - g->n_input - g->n_value_info];
        if (v->name && v->type && v->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE &&
            v->type->tensor_type && v->type->tensor_type->shape && !onnx_map_get(r, v->name))
            ok &= onnx_map_put(r, v->name, (int64_t)v->type->tensor_type->shape->n_dim);
    }
    for (size_t i = 0; i < g->n_node && ok; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (n->n_output < 1 || !n->output[0][0] || onnx_map_get(r, n->output[0]) ||
            (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx")))
            continue;
        const char *op = n->op_type;
        int64_t r0 = n->n_input > 0 ? rank_of(r, n->input[0]) : -1, out = -1;
        int64_t r1 = n->n_input > 1 ? rank_of(r, n->input[1]) : -1;
        if (in_list(same_rank_ops, op)) {
            out = r0;
        } else if (in_list(broadcast_ops, op)) {
            out = r0;
            for (size_t k = 1; k < n->n_input && out >= 0; k++) {
                int64_t rk = rank_of(r, n->input[k]);
                out = rk < 0 ? -1 : (rk > out ? rk : out);
            }
        } else if (!strcmp(op, "Flatten") || !strcmp(op, "Gemm")) {
            out = 2;
        } else if (!strcmp(op, "MatMul") && r0 >= 1 && r1 >= 1) {
            out = r0 == 1 && r1 == 1 ? 0 : r0 == 1 ? r1 - 1 : r1 == 1 ? r0 - 1 : (r0 > r1 ? r0 : r1);
        } else if (!strcmp(op, "Reshape") && n->n_input > 1) {
            out = init_numel(g, n->input[1]);
        } else if ((!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) && r0 >= 0) {
            const Onnx__AttributeProto *a = onnx_node_attr(n, "axes");
            int64_t na = a ? (int64_t)a->n_ints : n->n_input > 1 ? init_numel(g, n->input[1]) : -1;
            if (na >= 0)
                out = !strcmp(op, "Unsqueeze") ? r0 + na : r0 - na;
        }
        if (out >= 0)
            ok &= onnx_map_put(r, n->output[0], out);
    }
    return ok;
}

/* Renames `from` to `to` in body g (node inputs and outputs, graph outputs, value_info)
 * and in the bodies nested in it. */
static bool rename_in(Onnx__GraphProto *g, const char *from, const char *to)
{
    bool ok = true;
    for (size_t i = 0; i < g->n_output; i++)
        if (g->output[i]->name && !strcmp(g->output[i]->name, from))
            ok &= qdq_replace_str(&g->output[i]->name, to);
    for (size_t i = 0; i < g->n_value_info; i++)
        if (g->value_info[i]->name && !strcmp(g->value_info[i]->name, from))
            ok &= qdq_replace_str(&g->value_info[i]->name, to);
    for (size_t i = 0; i < g->n_node; i++) {
        Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_input; k++)
            if (!strcmp(n->input[k], from))
                ok &= qdq_replace_str(&n->input[k], to);
        for (size_t k = 0; k < n->n_output; k++)
            if (!strcmp(n->output[k], from))
                ok &= qdq_replace_str(&n->output[k], to);
        for (size_t a = 0; a < n->n_attribute; a++) {
            if (n->attribute[a]->g)
                ok &= rename_in(n->attribute[a]->g, from, to);
            for (size_t k = 0; k < n->attribute[a]->n_graphs; k++)
                ok &= rename_in(n->attribute[a]->graphs[k], from, to);
        }
    }
    return ok;
}

static bool push_output(Onnx__GraphProto *g, const char *name, const qcal_onnx_tensor_desc *d)
{
    Onnx__ValueInfoProto *vi = onnx_new_value_info(name, d);
    if (!vi || !onnx_push((void ***)&g->output, &g->n_output, vi)) {
        if (vi)
            protobuf_c_message_free_unpacked(&vi->base, NULL);
        return false;
    }
    return true;
}

/* A Constant node writing an empty float32 tensor of rank `rank` (every dimension 0). */
static bool push_empty_constant(Onnx__GraphProto *g, const char *name, const char *out, int32_t rank)
{
    int64_t dims[QCAL_MAX_DIMS] = { 0 };
    Onnx__NodeProto *n = onnx_new_node("Constant", name, 0, NULL, 1, &out);
    Onnx__TensorProto *t = onnx_new_tensor("", QCAL_ONNX_FLOAT, rank, dims, NULL, 0);
    Onnx__AttributeProto *a =
        n && t ? onnx_node_add_attr(n, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR)
               : NULL;
    if (!a) {
        if (t)
            protobuf_c_message_free_unpacked(&t->base, NULL);
        if (n)
            protobuf_c_message_free_unpacked(&n->base, NULL);
        return false;
    }
    a->t = t;
    if (!onnx_push((void ***)&g->node, &g->n_node, n)) {
        protobuf_c_message_free_unpacked(&n->base, NULL);
        return false;
    }
    return true;
}

/* Exposes tensors written inside the bodies of the main graph's If nodes (one level): for
 * tensor T of a branch, T is renamed inside that branch and becomes a new branch output; the
 * If node gets an output named T (a graph output); the other branch writes an empty float
 * tensor (every dimension 0, same rank) there, so a run that takes the other branch gives
 * T with no elements (a dump writer skips it). Names in deeper bodies are not exposed. */
static qcal_status expose_bodies(qcal_onnx_model *m, const char *const *names, int64_t n, int64_t *added)
{
    Onnx__GraphProto *g = m->proto->graph;
    onnx_gindex x;   /* for fresh names */
    qcal_status st = onnx_gindex_build(g, g, &x);
    onnx_map want = { 0 };
    for (int64_t i = 0; st == QCAL_OK && i < n; i++)
        if (!onnx_map_put(&want, names[i], 0))
            st = OOM();
    for (size_t i = 0; st == QCAL_OK && i < g->n_node; i++) {
        Onnx__NodeProto *node = g->node[i];
        if (!qdq_is_if(node))
            continue;
        Onnx__GraphProto *br[2] = { NULL, NULL };
        for (size_t a = 0; a < node->n_attribute; a++) {
            const char *an = node->attribute[a]->name;
            if (an && !strcmp(an, "then_branch"))
                br[0] = node->attribute[a]->g;
            else if (an && !strcmp(an, "else_branch"))
                br[1] = node->attribute[a]->g;
        }
        if (!br[0] || !br[1])
            continue;
        for (int b = 0; b < 2 && st == QCAL_OK; b++) {
            Onnx__GraphProto *body = br[b], *other = br[1 - b];
            size_t n_body_nodes = body->n_node;
            for (size_t j = 0; j < n_body_nodes && st == QCAL_OK; j++) {
                for (size_t k = 0; k < body->node[j]->n_output && st == QCAL_OK; k++) {
                    char *name = qcal_strdup(body->node[j]->output[k]);
                    if (!name) {
                        st = OOM();
                        break;
                    }
                    if (!name[0] || !onnx_map_get(&want, name)) {
                        free(name);
                        continue;
                    }
                    qcal_onnx_tensor_desc d = { 0, -1, { 0 } };
                    onnx_graph_desc(body, name, &d);
                    const char *inner = onnx_gindex_fresh(&x, name, "_qcal_body");
                    const char *empty = onnx_gindex_fresh(&x, name, "_qcal_other_branch");
                    const char *cname = onnx_gindex_fresh(&x, name, "_qcal_other_branch_Constant");
                    int32_t rank = d.ndim >= 0 && d.ndim <= QCAL_MAX_DIMS ? d.ndim : 1;
                    qcal_onnx_tensor_desc de = { QCAL_ONNX_FLOAT, rank, { 0 } };
                    qcal_onnx_tensor_desc dout = { d.elem_type, d.ndim >= 0 ? rank : -1, { 0 } };
                    for (int r = 0; r < dout.ndim; r++)
                        dout.dims[r] = -1;
                    bool was_out = false;
                    for (size_t o = 0; o < body->n_output; o++)
                        was_out |= body->output[o]->name && !strcmp(body->output[o]->name, name);
                    bool ok = inner && empty && cname && rename_in(body, name, inner);
                    const char *bout = ok && was_out ? onnx_gindex_fresh(&x, name, "_qcal_body_output") : NULL;
                    if (ok && was_out) {
                        /* already a branch output: a second one through an Identity */
                        const char *iname = bout ? onnx_gindex_fresh(&x, name, "_qcal_body_Identity") : NULL;
                        Onnx__NodeProto *idn = iname ? onnx_new_node("Identity", iname, 1, (const char *const *)&inner,
                                                                     1, (const char *const *)&bout)
                                                     : NULL;
                        ok = idn && onnx_push((void ***)&body->node, &body->n_node, idn);
                        if (!ok && idn)
                            protobuf_c_message_free_unpacked(&idn->base, NULL);
                    }
                    if (ok) {
                        d.ndim = -1;   /* the branch output: element type only */
                        ok = push_output(body, was_out ? bout : inner, &d) &&
                             push_empty_constant(other, cname, empty, rank) && push_output(other, empty, &de);
                    }
                    if (ok) {
                        char *o = qcal_strdup(name);
                        ok = o && onnx_push((void ***)&node->output, &node->n_output, o);
                        if (!ok)
                            free(o);
                    }
                    if (ok) {
                        Onnx__ValueInfoProto *vi = onnx_new_value_info(name, &dout);
                        if (vi && dout.ndim > 0) {
                            Onnx__TensorShapeProto *sh = vi->type->tensor_type->shape;
                            for (size_t r = 0; r < sh->n_dim; r++) {
                                free(sh->dim[r]->dim_param);
                                sh->dim[r]->dim_param = NULL;
                                sh->dim[r]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE__NOT_SET;
                            }
                        }
                        ok = vi && onnx_push((void ***)&g->output, &g->n_output, vi);
                        if (!ok && vi)
                            protobuf_c_message_free_unpacked(&vi->base, NULL);
                    }
                    if (ok)
                        ++*added;
                    else
                        st = OOM();
                    free(name);
                }
            }
        }
    }
    onnx_map_free(&want);
    onnx_gindex_free(&x);
    return st;
}

qcal_status qcal_onnx_expose(qcal_onnx_model *m, const qcal_onnx_qdq_options *opt, int64_t *added)
{
    char **names = NULL;
    int64_t n = 0;
    qcal_status st = qcal_onnx_list(m, opt, &names, &n);
    if (st != QCAL_OK)
        return st;
    Onnx__GraphProto *g = m->proto->graph;
    onnx_map outs = { 0 };
    for (size_t i = 0; i < g->n_output; i++)
        if (g->output[i]->name && !onnx_map_put(&outs, g->output[i]->name, 0))
            st = OOM();
    /* Declared types: graph inputs, then value_info (first declaration wins). */
    onnx_map decl = { 0 };
    Onnx__ValueInfoProto **decl_vi = calloc(g->n_input + g->n_value_info + 1, sizeof *decl_vi);
    int64_t nd = 0;
    if (!decl_vi)
        st = OOM();
    for (size_t i = 0; st == QCAL_OK && i < g->n_input + g->n_value_info; i++) {
        Onnx__ValueInfoProto *v = i < g->n_input ? g->input[i] : g->value_info[i - g->n_input];
        if (!v->name || !v->type || v->type->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
            onnx_map_get(&decl, v->name))
            continue;
        decl_vi[nd] = v;
        if (!onnx_map_put(&decl, v->name, nd++))
            st = OOM();
    }
    onnx_map ranks = { 0 };
    if (st == QCAL_OK && !infer_ranks(g, &ranks))
        st = OOM();
    /* Build every new output first, then append them all (nothing changes on failure). */
    Onnx__ValueInfoProto **vis = calloc((size_t)n + 1, sizeof *vis);
    int64_t nv = 0;
    if (!vis)
        st = OOM();
    onnx_map main_def = { 0 };
    for (size_t i = 0; st == QCAL_OK && i < g->n_input + g->n_initializer; i++) {
        const char *nm = i < g->n_input ? g->input[i]->name : g->initializer[i - g->n_input]->name;
        if (nm && !onnx_map_put(&main_def, nm, 0))
            st = OOM();
    }
    for (size_t i = 0; st == QCAL_OK && i < g->n_node; i++)
        for (size_t k = 0; k < g->node[i]->n_output; k++)
            if (!onnx_map_put(&main_def, g->node[i]->output[k], 0))
                st = OOM();
    char **body_names = calloc((size_t)n + 1, sizeof *body_names);
    int64_t n_body = 0;
    if (!body_names)
        st = OOM();
    for (int64_t i = 0; st == QCAL_OK && i < n; i++) {
        if (onnx_map_get(&outs, names[i]))
            continue;
        if (!onnx_map_get(&main_def, names[i])) {
            body_names[n_body++] = names[i];   /* written in an If body: expose_bodies */
            continue;
        }
        /* The declared type as it is (symbolic dimension names kept), else the
         * initializer's, else float32 without a shape. */
        int64_t *vk = onnx_map_get(&decl, names[i]);
        if (vk) {
            Onnx__ValueInfoProto *src = decl_vi[*vk];
            size_t len = onnx__value_info_proto__get_packed_size(src);
            uint8_t *buf = malloc(len ? len : 1);
            if (buf) {
                onnx__value_info_proto__pack(src, buf);
                vis[nv] = onnx__value_info_proto__unpack(NULL, len, buf);
                free(buf);
            }
            if (vis[nv]) {
                free(vis[nv]->doc_string);
                vis[nv]->doc_string = NULL;
            }
        } else {
            qcal_onnx_tensor_desc d = { 0, -1, { 0 } };
            onnx_graph_desc(g, names[i], &d);
            if (d.elem_type == 0)
                d.elem_type = QCAL_ONNX_FLOAT;   /* listed: float32, declared or inferred */
            int64_t rk = rank_of(&ranks, names[i]);
            bool unknown_dims = d.ndim < 0 && rk >= 0 && rk <= QCAL_MAX_DIMS;
            if (unknown_dims) {
                d.ndim = (int32_t)rk;
                for (int64_t k = 0; k < rk; k++)
                    d.dims[k] = -1;
            }
            vis[nv] = onnx_new_value_info(names[i], &d);
            if (vis[nv] && unknown_dims) {
                /* Dimensions without value or name: unknown, not claimed equal anywhere. */
                Onnx__TensorShapeProto *sh = vis[nv]->type->tensor_type->shape;
                for (size_t k = 0; k < sh->n_dim; k++) {
                    free(sh->dim[k]->dim_param);
                    sh->dim[k]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE__NOT_SET;
                }
            }
        }
        if (!vis[nv])
            st = OOM();
        else
            nv++;
    }
    if (st == QCAL_OK) {
        Onnx__ValueInfoProto **o = realloc(g->output, (g->n_output + (size_t)nv + 1) * sizeof *o);
        if (!o) {
            st = OOM();
        } else {
            g->output = o;
            memcpy(g->output + g->n_output, vis, (size_t)nv * sizeof *vis);
            g->n_output += (size_t)nv;
            if (added)
                *added = nv;
            nv = 0;
        }
    }
    if (st == QCAL_OK && n_body) {
        int64_t nb = 0;
        st = expose_bodies(m, (const char *const *)body_names, n_body, &nb);
        if (st == QCAL_OK && added)
            *added += nb;
    }
    free(body_names);
    onnx_map_free(&main_def);
    for (int64_t i = 0; i < nv; i++)
        protobuf_c_message_free_unpacked(&vis[i]->base, NULL);
    free(vis);
    free(decl_vi);
    onnx_map_free(&decl);
    onnx_map_free(&ranks);
    onnx_map_free(&outs);
    qcal_onnx_names_free(&names, n);
    return st;
}
