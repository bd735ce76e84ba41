/* What the Q/DQ plan asks of the op table, the graph and the options (onnx/qdq_shared.h): the op
 * classes each profile quantizes by default (op_defs), the ops a run enables and an op's
 * class, tensor indexes, the constant behind a name, the exclusion globs. Below the plan,
 * the activation, weight and bias passes and the rewrite, which all call it. */
#include <fnmatch.h>
#include <string.h>

#include "onnx/qdq_shared.h"

/* ---- op classes ---- */

static const op_def op_defs[] = {
    { "Conv", K_CONV, true, true },
    { "ConvTranspose", K_CONVT, true, true },
    { "Gemm", K_GEMM, true, true },
    { "MatMul", K_MATMUL, true, true },
    { "Add", K_BINARY, true, true },
    { "Mul", K_BINARY, false, false }, /* two activations: float unless asked (docs/onnx.md) */
    { "AveragePool", K_POOL, true, true },
    { "GlobalAveragePool", K_POOL, true, true },
    { "MaxPool", K_MOVE, true, true },
    { "Flatten", K_MOVE, true, false },
    { "Reshape", K_MOVE, true, false },
    { "Transpose", K_MOVE, true, false },
    { "Squeeze", K_MOVE, true, false },
    { "Unsqueeze", K_MOVE, true, false },
    { "Clip", K_ACT, true, false },
};
_Static_assert(sizeof op_defs / sizeof op_defs[0] == N_OP_DEFS, "N_OP_DEFS counts op_defs");

qcal_status qdq_select_ops(plan *p)
{
    const char *list = p->opt->op_types;
    bool trt = p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT;
    if (!list) {
        for (size_t i = 0; i < N_OP_DEFS; i++)
            p->enabled[i] = trt ? op_defs[i].tensorrt : op_defs[i].ort;
        return QCAL_OK;
    }
    for (const char *c = list; *c;) {
        const char *e = strchr(c, ',');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        while (n && *c == ' ')
            c++, n--;
        while (n && c[n - 1] == ' ')
            n--;
        if (n) {
            size_t i = 0;
            for (; i < N_OP_DEFS; i++)
                if (strlen(op_defs[i].op) == n && !strncmp(op_defs[i].op, c, n))
                    break;
            if (i == N_OP_DEFS) {
                char known[512] = "";
                for (size_t k = 0; k < N_OP_DEFS; k++) {
                    if (k)
                        strcat(known, ",");
                    strcat(known, op_defs[k].op);
                }
                return qcal_error(QCAL_ERR_INVALID_ARG, "op type '%.*s' cannot be quantized (known: %s)",
                                  (int)n, c, known);
            }
            p->enabled[i] = true;
        }
        if (!e)
            break;
        c = e + 1;
    }
    return QCAL_OK;
}


const op_def *qdq_op_of(const plan *p, const Onnx__NodeProto *n)
{
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
        return NULL;
    for (size_t i = 0; i < N_OP_DEFS; i++)
        if (p->enabled[i] && !strcmp(op_defs[i].op, n->op_type))
            return &op_defs[i];
    return NULL;
}


/* The index of name in p's graph, -1. */
int64_t qdq_tensor_index(const plan *p, const char *name)
{
    return onnx_gindex_find(&p->x, name);
}


/* The Constant node whose value is tensor t's constant, -1 (an initializer, or none). */
int64_t qdq_const_node(const plan *p, int64_t t)
{
    const onnx_tref *r = &p->x.t[t];
    return r->producer >= 0 && r->init && r->init == p->t[t].init ? r->producer : -1;
}


/* The tensor holding the constant behind name: an initializer or a Constant's value,
 * directly or through Identity nodes (torch writes deduplicated parameters so); -1. */
int64_t qdq_const_src(const plan *p, const char *name)
{
    int64_t t = name && name[0] ? qdq_tensor_index(p, name) : -1;
    if (t >= 0 && p->t[t].init)
        return t;
    const onnx_tref *r = t >= 0 ? onnx_gindex_const(&p->x, p->g, name, NULL) : NULL;
    return r ? qdq_tensor_index(p, r->name) : -1;
}


bool qdq_excluded(const plan *p, const char *name)
{
    if (!name || !name[0])
        return false;
    for (int64_t i = 0; i < p->opt->n_exclude; i++)
        if (p->opt->exclude[i] && fnmatch(p->opt->exclude[i], name, 0) == 0)
            return true;
    return false;
}
