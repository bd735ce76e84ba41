/* The graph passes: which tensors a profile quantizes (list, expose) and the Q/DQ rewrite.
 * One plan serves all three: find what to change, check it is safe, change it, and say what
 * was skipped and why. Only the main graph is rewritten; If/Loop bodies stay float (their
 * names are read so nothing they use disappears). Placement rules: docs/onnx.md. */
#include <float.h>
#include <fnmatch.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/onnx_internal.h"
#include "core/cpu.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif
#include "qcal/quantize.h"
#include "qcal/weights.h"

/* ---- op classes ---- */

typedef enum op_kind {
    K_CONV,      /* Conv: X, W (axis 0), B */
    K_CONVT,     /* ConvTranspose: X, W (axis 1), B */
    K_GEMM,      /* Gemm: A, B (weight: axis 0 with transB=1, else 1), C */
    K_MATMUL,    /* MatMul: A, B (weight [K, N]: axis 1) */
    K_BINARY,    /* Add, Mul: two activation inputs */
    K_POOL,      /* AveragePool, GlobalAveragePool: one input, own output range */
    K_MOVE,      /* MaxPool and shape ops: the output keeps the input's qparams (ort) */
    K_ACT,       /* Clip: never quantized alone; ort fuses it into the output Q of the quantized
                  * op it follows (fused_clip), as Relu */
} op_kind;

typedef struct op_def {
    const char *op;
    op_kind kind;
    bool ort, tensorrt;   /* quantized by default in the profile */
} op_def;

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
#define N_OP_DEFS (sizeof op_defs / sizeof op_defs[0])

const char *qcal_onnx_profile_name(qcal_onnx_profile profile)
{
    switch (profile) {
    case QCAL_ONNX_PROFILE_ORT: return "ort";
    case QCAL_ONNX_PROFILE_TENSORRT: return "tensorrt";
    }
    return "unknown";
}

qcal_status qcal_onnx_profile_parse(const char *name, qcal_onnx_profile *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_profile_parse: NULL argument");
    if (!strcmp(name, "ort"))
        *out = QCAL_ONNX_PROFILE_ORT;
    else if (!strcmp(name, "tensorrt"))
        *out = QCAL_ONNX_PROFILE_TENSORRT;
    else
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown profile '%s' (expected ort or tensorrt)", name);
    return QCAL_OK;
}

void qcal_onnx_qdq_options_default(qcal_onnx_qdq_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->profile = QCAL_ONNX_PROFILE_ORT;
    opt->weight_observer = QCAL_OBSERVER_PER_CHANNEL_MINMAX;
    opt->weight_qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
}

/* ---- the plan of each tensor ---- */

/* What the plan knows of tensor i of the graph index (p->x.t[i]: producer, readers,
 * initializer or Constant; onnx/graph.h) beyond it. */
typedef struct tinfo {
    const char *name;          /* the index's (p->x.t[i].name) */
    Onnx__TensorProto *init;   /* the index's constant, or an initializer of an enclosing
                                * graph (outer) */
    bool data;                 /* carries data: depends on a graph input through more than
                                * shapes (not an initializer, a Constant, shape arithmetic) */
    bool untyped;              /* read as an activation, element type unknown (noted once) */
    bool outer;                /* an initializer of an enclosing graph (If bodies) */
    /* plan */
    bool assigned;             /* activation qparams decided */
    bool missing;              /* looked up, not in the table */
    bool listed;               /* looked up (listed) */
    qcal_dtype dtype;
    float scale;
    int32_t zp;
    bool rename;               /* ort graph output: the producer writes a new name */
    char *q_out, *dq_out, *pre;/* names of the Q output, DQ output, renamed producer output */
    char *scale_name, *zp_name;
} tinfo;

typedef struct wplan {
    int64_t t;                 /* tinfo of the weight initializer */
    int32_t axis;
    qcal_dtype dtype;          /* qint8, or the FP8 dtype of an FP8 node's activation */
    int64_t channels;
    float *scales;             /* channels */
    int8_t *zps;               /* channels: qint8 zero-points (0 for symmetric schemes and FP8) */
    bool per_tensor;           /* scalar scale and zero-point, no axis */
    uint8_t *codes;            /* ort: quantized weight (numel bytes: int8 or FP8 codes) */
    float *f32;                /* tensorrt: float32 copy when the weight is not float32 */
    int64_t numel;
    char *dq_out;
    int64_t lazy;              /* its lazy_w (qcal_onnx_qdq_save: scales and, ort, codes
                                * computed as the save reaches them), -1: computed here */
} wplan;

typedef struct bplan {
    int64_t t;
    int64_t n;
    float *scales;
    int32_t *codes;
    char *dq_out;
    int64_t lazy;              /* its lazy_b (computed after its weight), -1: computed here */
} bplan;

typedef struct nplan {
    bool quant;
    int nact;
    int act[2];                /* input slots read as activations */
    int wslot, bslot;          /* weight / bias slots (-1) */
    int64_t w;                 /* wplan index or -1 */
    int64_t b;                 /* bplan index or -1 */
    bool via;                  /* an Identity between a planned weight or bias and its reader */
    bool gone;                 /* removed by the rewrite (a hoisted Constant, an Identity
                                * nothing reads any more) */
} nplan;

/* The lazy initializers of qcal_onnx_qdq_save (onnx_lazy): a float32 weight whose zero-points
 * are zero whatever its data is planned by size; its scales (and, ort, codes) and those of
 * the int32 biases that read them are computed by the save's pass, weight by weight in plan
 * order, and handed to the writer as it reaches each initializer (lazy_fill). */
typedef struct lazy_w {
    int64_t w;                 /* its wplan; -1: computed during planning after all */
    Onnx__TensorProto src;     /* the weight's TensorProto as planned (shallow: its data, dims
                                * and name stay alive with the plan, p->dropped; a save with
                                * external data detaches the model's raw_data meanwhile) */
    Onnx__TensorProto *scale_t, *codes_t;   /* the initializers it fills (codes_t: ort) */
    uint8_t *scale_dst, *codes_dst;         /* their bytes (channels floats; numel codes) */
    struct lazy_pass *pass;    /* the save's pass (set before it starts) */
} lazy_w;

typedef struct lazy_b {
    int64_t b;                 /* its bplan; -1: computed during planning after all */
    int64_t lw;                /* the lazy_w whose scales it reads */
    float s_in;                /* the input's scale */
    float *vals;               /* the bias as float32 (n) */
    Onnx__TensorProto *codes_t, *scales_t;
    uint8_t *codes_dst, *scales_dst;
} lazy_b;

#define MAX_SCOPES 16

typedef struct plan {
    struct plan *root;         /* the main graph's plan: fresh names for every graph */
    const struct plan *up;     /* the plan of the enclosing graph (If bodies), else NULL */
    onnx_types ty;             /* element types (planning only: keys borrowed from g) */
    onnx_gindex x;             /* the graph index (its names owned: valid through the rewrite);
                                * the root's makes the fresh names of every graph */
    char **untyped;            /* activation inputs of unknown element type (borrowed) */
    int64_t nuntyped;
    const Onnx__GraphProto *scope[MAX_SCOPES];   /* enclosing graphs, innermost first */
    int nscope;
    const qcal_onnx_model *m;
    const qcal_onnx_qdq_options *opt;
    const qcal_calib_table *table;   /* NULL: listing (every lookup succeeds) */
    Onnx__GraphProto *g;
    tinfo *t;                  /* t[i]: the plan of x.t[i] */
    int64_t nt;                /* x.n */
    nplan *np;
    wplan *w;
    int64_t nw;
    bplan *b;
    int64_t nb;
    bool enabled[N_OP_DEFS];
    char **list;               /* looked-up names in order (borrowed) */
    int64_t nlist;
    char **skipped;
    int64_t nskipped;
    bool fp8;                  /* an FP8 Q/DQ is written (opset >= 19, IR >= 9) */
    char **owned_names;        /* names of hoisted Constant values, kept for the lazy weights */
    bool lazy;                 /* qcal_onnx_qdq_save: weights may be lazy (lazy_w) */
    lazy_w *lw;
    int64_t nlw;
    lazy_b *lb;
    int64_t nlb;
    bool serial;               /* observe on this thread only (the save's pass) */
    Onnx__TensorProto **dropped;   /* lazy weights' float initializers the rewrite took out of
                                    * the graph: freed with the plan, after the pass */
    size_t ndropped;
    uint8_t *scratch;          /* misaligned float32 weights copied for reading, reused */
    size_t scratch_cap;        /* bytes */
    int64_t nowned;
} plan;

static void plan_free(plan *p)
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

#define OOM() qcal_error(QCAL_ERR_NO_MEMORY, "out of memory")

/* The index of name in p's graph, -1. */
static int64_t tensor_index(const plan *p, const char *name)
{
    return onnx_gindex_find(&p->x, name);
}

/* The Constant node whose value is tensor t's constant, -1 (an initializer, or none). */
static int64_t const_node(const plan *p, int64_t t)
{
    const onnx_tref *r = &p->x.t[t];
    return r->producer >= 0 && r->init && r->init == p->t[t].init ? r->producer : -1;
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
            int64_t o = tensor_index(u, ti->name);
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
                int64_t ti = n->input[k][0] ? tensor_index(p, n->input[k]) : -1;
                d = ti >= 0 && p->t[ti].data;
            }
            for (size_t a = 0; a < n->n_attribute && !d; a++)
                d = n->attribute[a]->g || n->attribute[a]->n_graphs;
        }
        for (size_t k = 0; k < n->n_output; k++) {
            int64_t ti = n->output[k][0] ? tensor_index(p, n->output[k]) : -1;
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

/* The tensor holding the constant behind name: an initializer or a Constant's value,
 * directly or through Identity nodes (torch writes deduplicated parameters so); -1. */
static int64_t const_src(const plan *p, const char *name)
{
    int64_t t = name && name[0] ? tensor_index(p, name) : -1;
    if (t >= 0 && p->t[t].init)
        return t;
    const onnx_tref *r = t >= 0 ? onnx_gindex_const(&p->x, p->g, name, NULL) : NULL;
    return r ? tensor_index(p, r->name) : -1;
}

/* The Identity nodes between name and its constant: the rewrite drops those nothing reads
 * once the quantized weight or bias replaces name in its reader. */
static void mark_identities(plan *p, const char *name)
{
    for (int guard = 0; guard < 8; guard++) {
        int64_t t = tensor_index(p, name);
        if (t < 0 || p->t[t].init || p->x.t[t].producer < 0)
            return;
        const Onnx__NodeProto *n = p->g->node[p->x.t[t].producer];
        if (strcmp(n->op_type, "Identity") || n->n_input != 1)
            return;
        p->np[p->x.t[t].producer].via = true;
        name = n->input[0];
    }
}

static bool excluded(const plan *p, const char *name)
{
    if (!name || !name[0])
        return false;
    for (int64_t i = 0; i < p->opt->n_exclude; i++)
        if (p->opt->exclude[i] && fnmatch(p->opt->exclude[i], name, 0) == 0)
            return true;
    return false;
}

static qcal_status select_ops(plan *p)
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

static const op_def *op_of(const plan *p, const Onnx__NodeProto *n)
{
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
        return NULL;
    for (size_t i = 0; i < N_OP_DEFS; i++)
        if (p->enabled[i] && !strcmp(op_defs[i].op, n->op_type))
            return &op_defs[i];
    return NULL;
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

/* ONNX element type of a Q/DQ zero-point (and quantized tensor) of dtype. */
static int32_t onnx_type_of(qcal_dtype d)
{
    return d == QCAL_QUINT8          ? QCAL_ONNX_UINT8
           : d == QCAL_FLOAT8_E4M3FN ? QCAL_ONNX_FLOAT8E4M3FN
           : d == QCAL_FLOAT8_E5M2   ? QCAL_ONNX_FLOAT8E5M2
                                     : QCAL_ONNX_INT8;
}

/* The qparams of an activation from the table entry, as the profile wants them. */
static qcal_status act_qparams(plan *p, tinfo *ti, const qcal_calib_entry *e)
{
    if (qcal_dtype_is_float8(e->qparams.dtype)) {
        /* FP8 (docs/fp8.md): symmetric, zero-point 0 (a float8 zero-point of that type),
         * scale = amax / largest; per-channel activation entries: the largest amax over the
         * channels (one scale per tensor). TensorRT's FP8 Q/DQ is E4M3 only. */
        qcal_dtype d = e->qparams.dtype;
        if (p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT && d != QCAL_FLOAT8_E4M3FN)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': the table's dtype %s; TensorRT's "
                              "FP8 Q/DQ takes float8_e4m3fn", ti->name, qcal_dtype_name(d));
        float s = e->qparams.scale;
        if (qcal_qscheme_is_per_channel(e->qparams.qscheme)) {
            float amax = 0.0f;
            for (int64_t c = 0; c < e->qparams.channels; c++) {
                float a;
                qcal_calib_entry_amax(e, c, &a);
                amax = fmaxf(amax, a);
            }
            s = fmaxf(amax / qcal_float8_max(d), FLT_EPSILON);
        }
        if (e->no_data)
            s = 1.0f;
        if (!(s > 0.0f && isfinite(s)))
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': FP8 scale %g is not positive and "
                              "finite", ti->name, (double)s);
        ti->dtype = d;
        ti->scale = s;
        ti->zp = 0;
        p->fp8 = true;
        return QCAL_OK;
    }
    if (p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT) {
        /* Symmetric int8, zero-point 0: amax = max |range| over channels, scale = amax / 127. */
        float amax = 0.0f;
        for (int64_t c = 0; c < e->qparams.channels; c++) {
            float a;
            qcal_calib_entry_amax(e, c, &a);
            if (a > amax)
                amax = a;
        }
        float s = e->no_data ? 1.0f : amax / 127.0f;
        if (!(s >= FLT_EPSILON))
            s = FLT_EPSILON;
        if (!isfinite(s))
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': amax %g gives no finite scale", ti->name,
                              (double)amax);
        ti->dtype = QCAL_QINT8;
        ti->scale = s;
        ti->zp = 0;
        return QCAL_OK;
    }
    const qcal_qparams *q = &e->qparams;
    if (q->dtype != QCAL_QUINT8 && q->dtype != QCAL_QINT8)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': the table's dtype %s cannot be a QuantizeLinear type",
                          ti->name, qcal_dtype_name(q->dtype));
    if (!qcal_qscheme_is_per_channel(q->qscheme)) {
        ti->dtype = q->dtype;
        ti->scale = q->scale;
        ti->zp = q->zero_point;
        return QCAL_OK;
    }
    /* Per-channel activation entries: QLinearConv takes one input scale, so the channels'
     * range (min of mins, max of maxes) gives per-tensor quint8 affine qparams. */
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t c = 0; c < q->channels; c++) {
        if (e->min_val[c] <= e->max_val[c]) {
            lo = fminf(lo, e->min_val[c]);
            hi = fmaxf(hi, e->max_val[c]);
        }
    }
    qcal_qconfig cfg;
    qcal_qconfig_default(&cfg);
    qcal_qparams out = { 0 };
    qcal_status st = qcal_qparams_compute(&cfg, 0, 1, &lo, &hi, &out);
    if (st < 0)
        return st;
    ti->dtype = QCAL_QUINT8;
    ti->scale = out.scale;
    ti->zp = out.zero_point;
    qcal_qparams_free(&out);
    return QCAL_OK;
}

/* Looks up a tensor's activation qparams; false (and ti->missing) when the table lacks it. */
static qcal_status lookup(plan *p, int64_t t, bool *found)
{
    tinfo *ti = &p->t[t];
    *found = true;
    if (ti->assigned)
        return QCAL_OK;
    if (!ti->listed) {
        ti->listed = true;
        if (!onnx_push((void ***)&p->list, (size_t *)&p->nlist, (void *)ti->name))
            return OOM();
    }
    if (!p->table)
        return QCAL_OK;
    const qcal_calib_entry *e = NULL;
    if (qcal_calib_table_find(p->table, ti->name, QCAL_CALIB_ROLE_ACTIVATION, &e) != QCAL_OK &&
        qcal_calib_table_find(p->table, ti->name, QCAL_CALIB_ROLE_WEIGHT, &e) != QCAL_OK) {
        qcal_clear_error();
        ti->missing = true;
        *found = false;
        return QCAL_OK;
    }
    return act_qparams(p, ti, e);
}

static void assign(tinfo *ti)
{
    ti->assigned = true;
}

/* Appends *w to the plan's weights (the array doubles at powers of two); *out gets its index.
 * On failure the plan is unchanged and w's buffers are still the caller's. */
static qcal_status wplan_push(plan *p, const wplan *w, int64_t *out)
{
    if ((p->nw & (p->nw - 1)) == 0) {
        wplan *nw = realloc(p->w, (size_t)(p->nw ? p->nw * 2 : 8) * sizeof *nw);
        if (!nw)
            return OOM();
        p->w = nw;
    }
    p->w[p->nw] = *w;
    *out = p->nw++;
    return QCAL_OK;
}

/* Elements [first, first + count) of a float32 initializer's raw data (ctx): in place, or
 * a copy in scratch (onnx_raw_view). */
static qcal_status raw_read(void *ctx, int64_t first, int64_t count, void *scratch, const float **out)
{
    _Static_assert(ONNX_VIEW_SLACK <= QCAL_WEIGHTS_SCRATCH_SLACK, "a reader's scratch holds a view");
    return onnx_raw_view(ctx, (size_t)first * 4, (size_t)count * 4, scratch, out);
}

/* The observation of weight w->t (w->axis, w->dtype, w->numel set, shape checked) by the
 * weight quantizer (qcal/weights.h): opt->weight_observer and opt->weight_qscheme (qint8;
 * per-tensor schemes with minmax over the whole weight) or per-channel symmetric in the FP8
 * dtype of an FP8 node (scale = channel amax / largest), into w->channels, scales, zps,
 * per_tensor; the codes (ort) into w->codes (codes_into when given, numel bytes, else a new
 * buffer); tensorrt's float32 copy of a weight that is not float32 into w->f32. A float32
 * raw initializer is read in blocks where it lies (a file mapping's pages), anything else
 * converted whole. init: the weight's TensorProto. On failure w's buffers stay NULL
 * (codes_into is the caller's). */
static qcal_status weight_compute(plan *p, wplan *w, const Onnx__TensorProto *init, uint8_t *codes_into)
{
    const int64_t numel = w->numel;
    const qcal_dtype dtype = w->dtype;
    const bool f32raw = init->data_type == QCAL_ONNX_FLOAT && init->raw_data.len == (size_t)numel * 4;
    qcal_weights_options wo;
    qcal_weights_options_default(&wo);
    wo.observer = p->opt->weight_observer;
    wo.q.dtype = dtype;
    wo.q.qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC : p->opt->weight_qscheme;
    wo.axis = w->axis;
    wo.serial = p->serial;
    const bool per_tensor = !qcal_qscheme_is_per_channel(wo.q.qscheme);
    float *conv = NULL;
    qcal_tensor x;
    memset(&x, 0, sizeof x);
    x.ndim = (int32_t)init->n_dims;
    for (size_t k = 0; k < init->n_dims; k++)
        x.shape[k] = init->dims[k];
    if (f32raw) {
        /* one buffer for every weight's reads (the quantizer touches a block's worth of it,
         * or the whole weight for an observer that needs it whole): its pages fault in once */
        const size_t need = qcal_weights_scratch_bytes(&wo, &x);
        if (p->scratch_cap < need) {
            free(p->scratch);
            p->scratch = malloc(need);
            p->scratch_cap = p->scratch ? need : 0;
            if (!p->scratch)
                return OOM();
        }
        wo.scratch = p->scratch;
        wo.scratch_bytes = p->scratch_cap;
    } else {
        int64_t nn;
        qcal_status st = onnx_tensor_to_float(init, &conv, &nn);
        if (st != QCAL_OK)
            return st;
        x.data = conv;
    }
    const int64_t channels = per_tensor ? 1 : init->dims[w->axis];
    float *scales = malloc((size_t)channels * sizeof *scales);
    int32_t *zp32 = malloc((size_t)channels * sizeof *zp32);
    int8_t *zps = calloc((size_t)channels, sizeof *zps);
    uint8_t *codes = p->opt->profile != QCAL_ONNX_PROFILE_ORT ? NULL
                     : codes_into                                ? codes_into
                                                                 : malloc((size_t)numel);
    const qcal_weights_reader rd = { raw_read, (void *)init };
    qcal_status st = !scales || !zp32 || !zps || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !codes)
                         ? OOM() : qcal_weights_quantize(&wo, &x, f32raw ? &rd : NULL, scales, zp32, codes);
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    for (int64_t c = 0; st == QCAL_OK && c < channels; c++)
        zps[c] = (int8_t)zp32[c];   /* qint8 (FP8: 0) */
    free(zp32);
    /* tensorrt: the float32 weight Q reads when the initializer is not float32 */
    float *f32 = p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT && init->data_type != QCAL_ONNX_FLOAT
                     ? conv : NULL;
    if (st != QCAL_OK) {
        st = qcal_error(st, "weight '%s': %s", p->t[w->t].name, qcal_last_error());
        free(conv);
        if (codes != codes_into)
            free(codes);
        free(scales);
        free(zps);
        return st;
    }
    w->channels = channels;
    w->scales = scales;
    w->zps = zps;
    w->per_tensor = per_tensor;
    w->codes = codes;
    w->f32 = f32;
    if (!f32)
        free(conv);
    return QCAL_OK;
}

/* Appends *x (size bytes) to *arr of *n elements (doubling at powers of two). */
static bool push_rec(void **arr, int64_t *n, const void *x, size_t size)
{
    if ((*n & (*n - 1)) == 0) {
        void *a = realloc(*arr, (size_t)(*n ? *n * 2 : 8) * size);
        if (!a)
            return false;
        *arr = a;
    }
    memcpy((char *)*arr + (size_t)*n * size, x, size);
    ++*n;
    return true;
}

/* The weight of node n at tensor t (wplan *out, shared by the nodes reading t alike): with
 * p->lazy, a float32 weight whose zero-points are zero gets its scale initializer's size
 * (one per channel, or one) and is lazy (lazy_w: its values when the save reaches them);
 * any other is observed now. */
static qcal_status plan_weight_read(plan *p, const Onnx__NodeProto *n, int64_t t, int32_t axis,
                                    qcal_dtype dtype, int64_t *out)
{
    for (int64_t i = 0; i < p->nw; i++)
        if (p->w[i].t == t) {
            if (p->w[i].axis != axis || p->w[i].dtype != dtype)
                return QCAL_ERR_MISMATCH;   /* caller records the skip */
            *out = i;
            return QCAL_OK;
        }
    Onnx__TensorProto *init = p->t[t].init;
    int64_t numel;
    if (!onnx_tensor_numel(init, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "weight '%s' has an invalid shape", p->t[t].name);
    if (numel == 0)
        return qcal_error(QCAL_ERR_FORMAT, "weight '%s' of node '%s' (%s) has no elements (a zero-sized dimension)",
                          p->t[t].name, n->name ? n->name : "", n->op_type);
    if (init->n_dims > QCAL_MAX_DIMS || (int64_t)init->n_dims <= axis)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "weight '%s' has %zu dimensions", p->t[t].name, init->n_dims);
    wplan w = { .t = t, .axis = axis, .dtype = dtype, .numel = numel, .lazy = -1 };
    const qcal_qscheme qs = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC : p->opt->weight_qscheme;
    qcal_status st;
    if (p->lazy && init->data_type == QCAL_ONNX_FLOAT && init->raw_data.len == (size_t)numel * 4 &&
        (qs == QCAL_PER_CHANNEL_SYMMETRIC || qs == QCAL_PER_TENSOR_SYMMETRIC)) {
        /* symmetric qint8 and FP8 zero-points are 0 whatever the data (checked in lazy_run) */
        w.per_tensor = qs == QCAL_PER_TENSOR_SYMMETRIC;
        w.channels = w.per_tensor ? 1 : init->dims[axis];
        w.scales = calloc((size_t)w.channels, sizeof *w.scales);
        w.zps = calloc((size_t)w.channels, sizeof *w.zps);
        /* ort: the codes' buffer, the quantized initializer's data once the rewrite takes it */
        if (p->opt->profile == QCAL_ONNX_PROFILE_ORT)
            w.codes = calloc((size_t)numel, 1);
        /* src is shallow: the data, dims and name stay alive (p->dropped) */
        lazy_w l = { .w = p->nw, .src = *init };
        w.lazy = p->nlw;
        st = !w.scales || !w.zps || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !w.codes) ||
                     !push_rec((void **)&p->lw, &p->nlw, &l, sizeof l)
                 ? OOM() : QCAL_OK;
    } else {
        st = weight_compute(p, &w, init, NULL);
    }
    if (st == QCAL_OK)
        st = wplan_push(p, &w, out);
    if (st != QCAL_OK) {
        if (w.lazy >= 0 && w.lazy < p->nlw)
            p->nlw--;
        free(w.scales), free(w.zps), free(w.codes), free(w.f32);
        return st;
    }
    return QCAL_OK;
}

/* Lazy weight l observed now (weight_compute): its scales into its wplan's and, once the
 * rewrite made it, its scale initializer; (ort) its codes into its buffer (the wplan's
 * before the rewrite takes it, then the quantized initializer's data). The weight's pages
 * of the file mapping are let go after. */
static qcal_status lazy_run(plan *p, lazy_w *l)
{
    wplan *w = &p->w[l->w];
    wplan c = { .t = w->t, .axis = w->axis, .dtype = w->dtype, .numel = w->numel, .lazy = -1 };
    uint8_t *into = l->codes_dst ? l->codes_dst : w->codes;
    qcal_status st = weight_compute(p, &c, &l->src, into);
    if (c.codes == into)
        c.codes = NULL;   /* written in place */
    if (st == QCAL_OK && (c.channels != w->channels || c.per_tensor != w->per_tensor))
        st = qcal_error(QCAL_ERR_STATE, "weight '%s': %lld scales observed, %lld planned",
                        p->t[w->t].name, (long long)c.channels, (long long)w->channels);
    for (int64_t k = 0; st == QCAL_OK && k < c.channels; k++)
        if (c.zps[k] != 0)
            st = qcal_error(QCAL_ERR_STATE, "weight '%s': zero-point %d of a symmetric scheme",
                            p->t[w->t].name, c.zps[k]);
    if (st == QCAL_OK) {
        memcpy(w->scales, c.scales, (size_t)c.channels * sizeof *c.scales);
        if (l->scale_dst)
            memcpy(l->scale_dst, c.scales, (size_t)c.channels * sizeof *c.scales);
    }
    free(c.scales), free(c.zps), free(c.codes), free(c.f32);
    onnx_raw_drop(p->m, &l->src);
    return st;
}

/* plan_weight_read, then the weight's pages of the file mapping are let go (onnx_raw_drop). */
static qcal_status plan_weight(plan *p, const Onnx__NodeProto *n, int64_t t, int32_t axis,
                               qcal_dtype dtype, int64_t *out)
{
    qcal_status st = plan_weight_read(p, n, t, axis, dtype, out);
    onnx_raw_drop(p->m, p->t[t].init);
    return st;
}

/* The int32 bias of n values b (ort): scales[c] = s_in * s_w[c], zero-point 0, the codes;
 * *ok false (nothing quantized) when a scale is not a positive finite float32. */
static qcal_status bias_compute(float s_in, const wplan *w, const float *b, int64_t n, float *scales,
                                int32_t *codes, bool *ok)
{
    *ok = true;
    for (int64_t c = 0; c < n; c++) {
        scales[c] = s_in * w->scales[c % w->channels];
        *ok &= scales[c] > 0.0f && isfinite(scales[c]);
    }
    if (!*ok)
        return QCAL_OK;
    int32_t *zps = calloc((size_t)n, sizeof *zps);
    if (!zps)
        return OOM();
    qcal_qparams qp;
    qcal_tensor x;
    memset(&x, 0, sizeof x);
    x.data = (float *)b;   /* read only */
    x.ndim = 1;
    x.shape[0] = n;
    qcal_status st = qcal_qparams_per_channel(&qp, QCAL_QINT32, 0, n, scales, zps);
    if (st == QCAL_OK)
        st = qcal_quantize(&x, &qp, codes);
    free(zps);
    return st;
}

/* Lazy bias l quantized now that its weight's scales are known (bias_compute), into its
 * bplan's buffers and, once the rewrite made them, its initializers. */
static qcal_status bias_run(plan *p, lazy_b *l)
{
    bplan *bp = &p->b[l->b];
    bool ok;
    qcal_status st = bias_compute(l->s_in, &p->w[p->lw[l->lw].w], l->vals, bp->n, bp->scales, bp->codes, &ok);
    if (st == QCAL_OK && !ok)   /* the bounds on s_in rule it out */
        st = qcal_error(QCAL_ERR_STATE, "bias '%s': input scale x weight scale is not a positive finite float32",
                        p->t[bp->t].name);
    if (st == QCAL_OK && l->codes_dst) {
        memcpy(l->codes_dst, bp->codes, (size_t)bp->n * sizeof *bp->codes);
        memcpy(l->scales_dst, bp->scales, (size_t)bp->n * sizeof *bp->scales);
    }
    return st;
}

/* Lazy weight k and the lazy biases that read its scales. */
static qcal_status lazy_job(plan *p, int64_t k)
{
    qcal_status st = lazy_run(p, &p->lw[k]);
    for (int64_t i = 0; st == QCAL_OK && i < p->nlb; i++)
        if (p->lb[i].b >= 0 && p->lb[i].lw == k)
            st = bias_run(p, &p->lb[i]);
    return st;
}

/* Lazy weights' biases are quantized by the save's pass when the input scale keeps
 * every s_in * s_w positive and finite whatever the weight: s_w lies in [FLT_EPSILON,
 * FLT_MAX / 127.5] (symmetric qint8: amax / 127.5, at least eps). */
#define BIAS_LAZY_MIN_S_IN 1e-30f
#define BIAS_LAZY_MAX_S_IN 127.0f

/* int32 bias (ort) of the weight p->w[wi]: scale[c] = s_in * s_w[c], zero-point 0. *out -1
 * and *why set to keep it float. With a lazy weight the bias is planned by size and is lazy
 * too (lazy_b: quantized after the weight, bias_run), or the weight is observed now (an
 * input scale outside the bounds above). */
static qcal_status plan_bias(plan *p, int64_t t, float s_in, int64_t wi, int64_t out_channels,
                             int64_t *out, const char **why)
{
    *out = -1;
    Onnx__TensorProto *init = p->t[t].init;
    int64_t numel;
    if (!init || init->n_dims != 1 || !onnx_tensor_numel(init, &numel) || numel != out_channels ||
        numel == 0) {
        *why = "bias '%s' is not a 1-D initializer of one value per output channel";
        return QCAL_OK;
    }
    wplan *w = &p->w[wi];
    if (w->lazy >= 0 && !(s_in >= BIAS_LAZY_MIN_S_IN && s_in <= BIAS_LAZY_MAX_S_IN)) {
        /* the weight's scales now (this bias depends on them), and the lazy biases of
         * other readers of the weight so far */
        qcal_status st = lazy_job(p, w->lazy);
        for (int64_t i = 0; st == QCAL_OK && i < p->nlb; i++)
            if (p->lb[i].b >= 0 && p->lb[i].lw == w->lazy) {
                p->b[p->lb[i].b].lazy = -1;
                p->lb[i].b = -1;
            }
        if (st != QCAL_OK)
            return st;
        p->lw[w->lazy].w = -1;
        w->lazy = -1;
    }
    float *b;
    int64_t nn;
    qcal_status st = onnx_tensor_to_float(init, &b, &nn);
    if (st != QCAL_OK)
        return st;
    float *scales = calloc((size_t)numel, sizeof *scales);
    int32_t *codes = calloc((size_t)numel, sizeof *codes);
    bool ok = true;
    st = !scales || !codes ? OOM() : w->lazy >= 0 ? QCAL_OK : bias_compute(s_in, w, b, numel, scales, codes, &ok);
    if (st == QCAL_OK && !ok) {
        free(b), free(scales), free(codes);
        *why = "bias '%s': input scale x weight scale is not a positive finite float32";
        return QCAL_OK;
    }
    if (st == QCAL_OK && (p->nb & (p->nb - 1)) == 0) {
        bplan *nb = realloc(p->b, (size_t)(p->nb ? p->nb * 2 : 8) * sizeof *nb);
        if (!nb)
            st = OOM();
        else
            p->b = nb;
    }
    lazy_b l = { .b = p->nb, .lw = w->lazy, .s_in = s_in, .vals = b };
    if (st == QCAL_OK && w->lazy >= 0 && !push_rec((void **)&p->lb, &p->nlb, &l, sizeof l))
        st = OOM();
    if (st != QCAL_OK) {
        free(b), free(scales), free(codes);
        return st;
    }
    bplan *bp = &p->b[p->nb];
    memset(bp, 0, sizeof *bp);
    bp->t = t;
    bp->n = numel;
    bp->scales = scales;
    bp->codes = codes;
    bp->lazy = w->lazy >= 0 ? p->nlb - 1 : -1;
    if (w->lazy < 0)
        free(b);   /* else the lazy bias holds it */
    *out = p->nb++;
    return QCAL_OK;
}


/* The single Relu that consumes t (ort fuses it), or -1. */
static int64_t fused_relu(plan *p, int64_t t)
{
    const onnx_tref *ti = &p->x.t[t];
    if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
        return -1;
    const Onnx__NodeProto *n = p->g->node[ti->cons0];
    if (strcmp(n->op_type, "Relu") || (n->domain && n->domain[0]) || n->n_output < 1 || !n->output[0][0] ||
        excluded(p, n->name) || excluded(p, n->output[0]))
        return -1;
    return ti->cons0;
}

/* Clip's bounds: constant inputs 1 and 2 (opset >= 11; an omitted one is unbounded; an
 * initializer, a Constant, or either behind Identity / Cast nodes as torch.onnx writes them)
 * or the min / max attributes (before 11); false when one is not a constant scalar. */
static bool clip_bounds(plan *p, const Onnx__NodeProto *n, float *lo, float *hi)
{
    *lo = -INFINITY;
    *hi = INFINITY;
    const Onnx__AttributeProto *a;
    if ((a = onnx_node_attr(n, "min")) && a->has_f)
        *lo = a->f;
    if ((a = onnx_node_attr(n, "max")) && a->has_f)
        *hi = a->f;
    for (size_t k = 1; k < n->n_input && k < 3; k++) {
        const char *name = n->input[k];
        if (!name[0])
            continue;
        int64_t t = const_src(p, name);
        for (int hop = 0; t < 0 && hop < 4; hop++) {
            int64_t ti = tensor_index(p, name);
            const Onnx__NodeProto *pn = ti >= 0 && p->x.t[ti].producer >= 0 ? p->g->node[p->x.t[ti].producer] : NULL;
            if (!pn || (strcmp(pn->op_type, "Cast") && strcmp(pn->op_type, "Identity")) || pn->n_input < 1)
                break;
            name = pn->input[0];
            t = const_src(p, name);
        }
        float *v = NULL;
        int64_t cnt = 0;
        if (t < 0 || onnx_tensor_to_float(p->t[t].init, &v, &cnt) != QCAL_OK || cnt != 1 || isnan(v[0])) {
            free(v);
            qcal_clear_error();
            return false;
        }
        if (k == 1)
            *lo = v[0];
        else
            *hi = v[0];
        free(v);
    }
    return *lo <= *hi;
}

/* ort: the single Clip that consumes t, when Clip is an enabled op type and its bounds are
 * constants around 0 (a uint8 / int8 Q range always holds 0, so only then can it lie inside
 * [min, max] and ONNX Runtime's ClipQuantFusion remove the Clip); its bounds in *lo, *hi.
 * Else -1. */
static int64_t fused_clip(plan *p, int64_t t, float *lo, float *hi)
{
    const onnx_tref *ti = &p->x.t[t];
    if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
        return -1;
    const Onnx__NodeProto *n = p->g->node[ti->cons0];
    const op_def *d = op_of(p, n);
    if (!d || d->kind != K_ACT || n->n_input < 1 || strcmp(n->input[0], ti->name) || n->n_output < 1 ||
        !n->output[0][0] || excluded(p, n->name) || excluded(p, n->output[0]))
        return -1;
    if (!clip_bounds(p, n, lo, hi) || !(*lo <= 0.0f && *hi >= 0.0f))
        return -1;
    return ti->cons0;
}

/* The Q range of (scale, zero-point) as ONNX Runtime's ClipQuantFusion computes it, scale x
 * (q - zero-point) in float for the type's lowest and highest q, lies inside [lo, hi]. */
static bool q_range_inside(qcal_dtype d, float s, int32_t zp, float lo, float hi)
{
    int32_t qmin = d == QCAL_QUINT8 ? 0 : -128, qmax = d == QCAL_QUINT8 ? 255 : 127;
    float a = s * (float)(qmin - zp), b = s * (float)(qmax - zp);
    return a >= lo && b <= hi;
}

/* ort, a fused Clip(lo, hi): the Q after the Clip takes the Clip output's qparams when their
 * Q range lies inside [lo, hi] (ONNX Runtime then removes the Clip); otherwise that range
 * clamped to [lo, hi] gives new affine qparams of the same type (zero-point at the type's
 * lowest value when lo = 0, as the Relu output's), the scale lowered just enough for the
 * range's ends to stay inside the bounds in float arithmetic. FP8 entries are left alone (ONNX
 * Runtime has no integer kernel to fuse them into). */
static qcal_status clip_qparams(tinfo *ti, float lo, float hi)
{
    if (ti->dtype != QCAL_QUINT8 && ti->dtype != QCAL_QINT8)
        return QCAL_OK;
    if (q_range_inside(ti->dtype, ti->scale, ti->zp, lo, hi))
        return QCAL_OK;
    int32_t qmin = ti->dtype == QCAL_QUINT8 ? 0 : -128, qmax = ti->dtype == QCAL_QUINT8 ? 255 : 127;
    float rlo = fmaxf(ti->scale * (float)(qmin - ti->zp), lo), rhi = fminf(ti->scale * (float)(qmax - ti->zp), hi);
    qcal_qconfig cfg;
    qcal_qconfig_default(&cfg);
    cfg.dtype = ti->dtype;
    qcal_qparams out = { 0 };
    qcal_status st = qcal_qparams_compute(&cfg, 0, 1, &rlo, &rhi, &out);
    if (st < 0)
        return st;
    float s = out.scale;
    int32_t zp = out.zero_point;
    qcal_qparams_free(&out);
    if (zp > qmin && isfinite(lo))
        s = fminf(s, lo / (float)(qmin - zp));
    if (zp < qmax && isfinite(hi))
        s = fminf(s, hi / (float)(qmax - zp));
    for (int i = 0; i < 8 && s > 0.0f && !q_range_inside(ti->dtype, s, zp, lo, hi); i++)
        s = nextafterf(s, 0.0f);
    if (!(s >= FLT_EPSILON && isfinite(s)) || !q_range_inside(ti->dtype, s, zp, lo, hi))
        return QCAL_OK;   /* a degenerate range: the table's qparams, the Clip stays */
    ti->scale = s;
    ti->zp = zp;
    return QCAL_OK;
}

/* ort: the output of the MaxPool chain that starts at t (each MaxPool the single consumer of
 * the tensor before it), else t. The output Q of the op that writes t takes that tensor's
 * table entry: max-pool commutes with per-tensor quantization, so the error the next op sees
 * is the error on the pool's output, and the pool's output (the maxima, fewer values near 0)
 * is the distribution to calibrate; the ReLU output before the pool would make KL (entropy)
 * clip the maxima (measured on the demo CNN: 1.05 instead of 2.01). Shape ops (Flatten,
 * Reshape, ...) move values without changing their distribution and are not followed. */
static int64_t move_chain_end(plan *p, int64_t t)
{
    for (int guard = 0; guard < 64; guard++) {
        const onnx_tref *ti = &p->x.t[t];
        if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
            return t;
        const Onnx__NodeProto *c = NULL;
        for (size_t i = 0; i < p->g->n_node && !c; i++)
            for (size_t k = 0; k < p->g->node[i]->n_input; k++)
                if (!strcmp(p->g->node[i]->input[k], ti->name)) {
                    c = p->g->node[i];
                    break;
                }
        const op_def *d = c ? op_of(p, c) : NULL;
        if (!d || strcmp(d->op, "MaxPool") || strcmp(c->input[0], ti->name) || excluded(p, c->name) || c->n_output < 1 ||
            !c->output[0][0] || excluded(p, c->output[0]))
            return t;
        int64_t o = tensor_index(p, c->output[0]);
        if (o < 0)
            return t;
        t = o;
    }
    return t;
}

static qcal_status plan_node(plan *p, size_t i)
{
    Onnx__NodeProto *n = p->g->node[i];
    nplan *np = &p->np[i];
    np->wslot = np->bslot = -1;
    np->w = np->b = -1;
    const op_def *d = op_of(p, n);
    if (!d || d->kind == K_ACT)   /* Clip: fused by the op before it, if any */
        return QCAL_OK;
    if (excluded(p, n->name))
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
        if (const_src(p, in1) >= 0) {
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
            int64_t tk = tensor_index(p, in);
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
    /* Structural checks before any lookup. */
    if (np->wslot >= 0) {
        int64_t tw = const_src(p, n->input[np->wslot]);
        if (tw < 0)
            return add_skip(p, n, "weight '%s' is not an initializer", n->input[np->wslot]);
        if (excluded(p, n->input[np->wslot]))
            return add_skip(p, n, "weight '%s' excluded by --exclude", n->input[np->wslot]);
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
        if (!in[0] || tensor_index(p, in) < 0)   /* an omitted (empty) input */
            return add_skip(p, n, "input %s has no name", np->act[k] ? "1" : "0");
        if (excluded(p, in))
            return add_skip(p, n, "input '%s' excluded by --exclude", in);
        int32_t et = elem_type_of(p, in);
        if (et == 0) {
            tinfo *ti = &p->t[tensor_index(p, in)];
            if (!ti->untyped) {
                ti->untyped = true;
                if (!onnx_push((void ***)&p->untyped, (size_t *)&p->nuntyped, (void *)ti->name))
                    return OOM();
            }
            return add_skip(p, n, "input '%s' has an element type neither declared nor inferred", in);
        }
        if (et != QCAL_ONNX_FLOAT)
            return add_skip(p, n, "input '%s' is not float32", in);
        if (!p->t[tensor_index(p, in)].data)
            return add_skip(p, n, "input '%s' is a constant or shape arithmetic, not data", in);
    }
    /* Activation inputs: all must have qparams. */
    bool all = true;
    for (int k = 0; k < np->nact; k++) {
        int64_t t = tensor_index(p, n->input[np->act[k]]);
        bool found;
        qcal_status st = lookup(p, t, &found);
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
            const tinfo *ta = &p->t[tensor_index(p, n->input[np->act[k]])];
            if (qcal_dtype_is_float8(ta->dtype))
                wdt = ta->dtype;
        }
    if (np->wslot >= 0 && p->table && !p->opt->float_weights) {
        int64_t tw = const_src(p, n->input[np->wslot]);
        qcal_status st = plan_weight(p, n, tw, axis, wdt, &np->w);
        if (st == QCAL_ERR_MISMATCH)
            return add_skip(p, n, "weight '%s' is shared with an op that needs another channel axis "
                            "or dtype", n->input[np->wslot]);
        if (st != QCAL_OK)
            return st;
        mark_identities(p, n->input[np->wslot]);
    }
    np->quant = true;
    for (int k = 0; k < np->nact; k++)
        assign(&p->t[tensor_index(p, n->input[np->act[k]])]);
    if (!trt && np->bslot >= 0 && np->w >= 0 && p->table && !qcal_dtype_is_float8(wdt)) {
        int64_t tb = const_src(p, n->input[np->bslot]);
        const char *why = NULL;
        if (d->kind == K_GEMM && (attr_float(n, "alpha", 1.0f) != 1.0f || attr_float(n, "beta", 1.0f) != 1.0f))
            why = "bias '%s' stays float: Gemm alpha or beta is not 1";
        else if (tb < 0 || excluded(p, n->input[np->bslot]))
            why = "bias '%s' stays float: not an initializer";
        else {
            int64_t tx = tensor_index(p, n->input[0]);
            qcal_status st = plan_bias(p, tb, p->t[tx].scale, np->w, out_ch, &np->b, &why);
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
    int64_t to = tensor_index(p, n->output[0]);
    if (d->kind == K_MOVE) {
        tinfo *src = &p->t[tensor_index(p, n->input[0])];
        tinfo *dst = &p->t[to];
        if (!excluded(p, dst->name) && !dst->assigned) {
            dst->dtype = src->dtype;
            dst->scale = src->scale;
            dst->zp = src->zp;
            assign(dst);
        }
        return QCAL_OK;
    }
    float clip_lo = 0.0f, clip_hi = 0.0f;
    int64_t act = fused_relu(p, to);
    bool clip = false;
    if (act < 0 && (act = fused_clip(p, to, &clip_lo, &clip_hi)) >= 0)
        clip = true;
    if (act >= 0)
        to = tensor_index(p, p->g->node[act]->output[0]);
    if (excluded(p, p->t[to].name))
        return QCAL_OK;
    int64_t from = move_chain_end(p, to);
    bool found;
    qcal_status st = lookup(p, from, &found);
    if (st != QCAL_OK)
        return st;
    if (found && from != to && !p->t[to].assigned) {
        p->t[to].dtype = p->t[from].dtype;
        p->t[to].scale = p->t[from].scale;
        p->t[to].zp = p->t[from].zp;
    }
    if (found && clip && p->table && !p->t[to].assigned) {
        st = clip_qparams(&p->t[to], clip_lo, clip_hi);
        if (st != QCAL_OK)
            return st;
    }
    if (found)
        assign(&p->t[to]);
    return QCAL_OK;
}

static qcal_status plan_graph(plan *p);

static qcal_status plan_build(plan *p, const qcal_onnx_model *m, const qcal_calib_table *table,
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
    qcal_status st = select_ops(p);
    if (st == QCAL_OK)
        st = index_graph(p);
    for (size_t i = 0; st == QCAL_OK && i < p->g->n_node; i++)
        st = plan_node(p, i);
    return st;
}

/* If bodies (then_branch / else_branch, up to MAX_SCOPES levels deep): one plan each, built like the main
 * graph's. Their ops are quantized in their own graph; weights they read from an enclosing
 * graph are quantized into the body's initializers. Loop and Scan bodies stay float. */
typedef struct subplans {
    plan **p;
    size_t n;
} subplans;

static void subplans_free(subplans *s)
{
    for (size_t i = 0; i < s->n; i++) {
        plan_free(s->p[i]);
        free(s->p[i]);
    }
    free(s->p);
    memset(s, 0, sizeof *s);
}

static bool is_if(const Onnx__NodeProto *n)
{
    return !strcmp(n->op_type, "If") && (!n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx"));
}

static qcal_status collect_subplans(plan *root, const plan *encl, const Onnx__GraphProto *g,
                                    const Onnx__GraphProto *const *scope, int nscope, subplans *out)
{
    if (nscope >= MAX_SCOPES)
        return QCAL_OK;   /* bodies nested deeper than MAX_SCOPES levels stay float */
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *n = g->node[i];
        if (!is_if(n))
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
                st = collect_subplans(root, sp, body, sp->scope, sp->nscope, out);
            if (st != QCAL_OK)
                return st;
        }
    }
    return QCAL_OK;
}

static qcal_status check_opts(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt)
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

/* ---- list / expose ---- */

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
    qcal_status st = check_opts(m, opt);
    if (st != QCAL_OK)
        return st;
    plan p;
    subplans sub = { 0 };
    st = plan_build(&p, m, NULL, opt, false);
    if (st == QCAL_OK)
        st = collect_subplans(&p, &p, p.g, NULL, 0, &sub);
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
                if (!(out[nout] = onnx_strdup(l[i])) || !onnx_map_put(&seen, out[nout], 0))
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
    subplans_free(&sub);
    plan_free(&p);
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

static bool replace_str(char **slot, const char *with);

/* Renames `from` to `to` in body g (node inputs and outputs, graph outputs, value_info)
 * and in the bodies nested in it. */
static bool rename_in(Onnx__GraphProto *g, const char *from, const char *to)
{
    bool ok = true;
    for (size_t i = 0; i < g->n_output; i++)
        if (g->output[i]->name && !strcmp(g->output[i]->name, from))
            ok &= replace_str(&g->output[i]->name, to);
    for (size_t i = 0; i < g->n_value_info; i++)
        if (g->value_info[i]->name && !strcmp(g->value_info[i]->name, from))
            ok &= replace_str(&g->value_info[i]->name, to);
    for (size_t i = 0; i < g->n_node; i++) {
        Onnx__NodeProto *n = g->node[i];
        for (size_t k = 0; k < n->n_input; k++)
            if (!strcmp(n->input[k], from))
                ok &= replace_str(&n->input[k], to);
        for (size_t k = 0; k < n->n_output; k++)
            if (!strcmp(n->output[k], from))
                ok &= replace_str(&n->output[k], to);
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
    Onnx__AttributeProto *a = malloc(sizeof *a);
    if (a) {
        onnx__attribute_proto__init(a);
        a->name = onnx_strdup("value");
        a->has_type = 1;
        a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    }
    if (!n || !t || !a || !a->name || !onnx_push((void ***)&n->attribute, &n->n_attribute, a)) {
        if (a)
            protobuf_c_message_free_unpacked(&a->base, NULL);
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
        if (!is_if(node))
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
                    char *name = onnx_strdup(body->node[j]->output[k]);
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
                        char *o = onnx_strdup(name);
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

/* ---- the rewrite ---- */

/* A name not yet used anywhere in the model (onnx_gindex_fresh of the root's index), as a
 * copy the caller owns. */
static char *fresh_name(plan *p, const char *base, const char *suffix)
{
    const char *s = onnx_gindex_fresh(&(p->root ? p->root : p)->x, base, suffix);
    return s ? onnx_strdup(s) : NULL;
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
        ti->dq_out = ti->rename ? onnx_strdup(ti->name) : fresh_name(p, ti->name, "_DequantizeLinear_Output_fp8");
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
        ti->dq_out = onnx_strdup(ti->name);
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
    if (scale_t && w->lazy >= 0) {   /* filled by lazy_run */
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
            if (w->lazy >= 0) {   /* filled by lazy_run */
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
        if (bp->lazy >= 0) {   /* filled by bias_run */
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

static bool replace_str(char **slot, const char *with)
{
    char *s = onnx_strdup(with);
    if (!s)
        return false;
    free(*slot);
    *slot = s;
    return true;
}

static qcal_status apply(plan *p, qcal_onnx_qdq_report *rep)
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
            qdq[tensor_index(p, g->node[i]->input[np->act[k]])] = true;
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
        const int64_t t = i < p->nw ? p->w[i].t : p->b[i - p->nw].t, cnode = const_node(p, t);
        const tinfo *ti = &p->t[t];
        if (cnode < 0 || ti->outer || p->np[cnode].gone)
            continue;
        Onnx__NodeProto *cn = g->node[cnode];
        Onnx__AttributeProto *va = (Onnx__AttributeProto *)onnx_node_attr(cn, "value");
        Onnx__TensorProto **ni = realloc(g->initializer, (g->n_initializer + 1) * sizeof *ni);
        char *name = onnx_strdup(ti->name);
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
        int64_t t = tensor_index(p, n->output[0]);
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
                b.oom |= !replace_str(&n->input[k], p->w[np->w].dq_out);
                continue;
            }
            if (np->quant && (int)k == np->bslot && np->b >= 0) {
                b.oom |= !replace_str(&n->input[k], p->b[np->b].dq_out);
                continue;
            }
            int64_t t = tensor_index(p, n->input[k]);
            if (t < 0 || !qdq[t] || p->t[t].rename)
                continue;
            bool act_slot = false;
            for (int a = 0; a < np->nact; a++)
                act_slot |= np->act[a] == (int)k;
            if (ort || (np->quant && act_slot))
                b.oom |= !replace_str(&n->input[k], p->t[t].dq_out);
        }
        int64_t out_t[8];
        size_t n_out_t = n->n_output < 8 ? n->n_output : 8;
        for (size_t k = 0; k < n_out_t; k++)
            out_t[k] = n->output[k][0] ? tensor_index(p, n->output[k]) : -1;
        for (size_t k = 0; k < n_out_t && !b.oom; k++) {
            int64_t t = out_t[k];
            if (t >= 0 && qdq[t] && p->t[t].rename)
                b.oom |= !replace_str(&n->output[k], p->t[t].pre);
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
        int64_t ti = t->name ? tensor_index(p, t->name) : -1;
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
static qcal_status drop_outer_weights(subplans *sub)
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

/* Hands r to *rep on success (rep not NULL), else frees it; returns st. */
static qcal_status report_out(qcal_status st, qcal_onnx_qdq_report *r, qcal_onnx_qdq_report *rep)
{
    if (st != QCAL_OK || !rep)
        qcal_onnx_qdq_report_free(r);
    else
        *rep = *r;
    return st;
}

/* qcal_onnx_qdq; with keep (qcal_onnx_qdq_save), the main graph's plan is given to *keep on
 * success (its lazy weights still to compute: lazy_job) instead of freed. */
static qcal_status qdq_run(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                           qcal_onnx_qdq_report *rep, plan **keep)
{
    qcal_onnx_qdq_options def;
    qcal_onnx_qdq_options_default(&def);
    if (!opt)
        opt = &def;
    if (!table)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq: NULL table");
    qcal_status st = check_opts(m, opt);
    if (st != QCAL_OK)
        return st;
    int64_t opset = onnx_model_opset(m->proto);
    if (opset < 13)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "the model's default-domain opset is %lld; Q/DQ insertion needs opset >= 13 (per-channel QuantizeLinear/DequantizeLinear; qcal_onnx_upgrade raises opsets 9-12)",
                          (long long)opset);
    plan *pm = malloc(sizeof *pm);
    if (!pm)
        return OOM();
    plan *const p = pm;
    subplans sub = { 0 };
    st = plan_build(p, m, table, opt, keep && !opt->float_weights);
    if (st == QCAL_OK)
        st = collect_subplans(p, p, p->g, NULL, 0, &sub);
    qcal_onnx_qdq_report r;
    memset(&r, 0, sizeof r);
    onnx_map seen = { 0 };
    for (size_t k = 0; st == QCAL_OK && k <= sub.n; k++) {
        plan *q = k ? sub.p[k - 1] : p;
        p->fp8 |= q->fp8;
        for (int64_t i = 0; i < q->nlist; i++) {
            int64_t t = tensor_index(q, q->list[i]);
            if (!q->t[t].missing || onnx_map_get(&seen, q->t[t].name))
                continue;
            char *s = onnx_strdup(q->t[t].name);
            if (!s || !onnx_push((void ***)&r.missing, (size_t *)&r.n_missing, s) ||
                !onnx_map_put(&seen, s, 0)) {
                if (s && (r.n_missing == 0 || r.missing[r.n_missing - 1] != s))
                    free(s);
                st = OOM();
                break;
            }
        }
    }
    onnx_map_free(&seen);
    if (st == QCAL_OK && p->fp8) {
        /* FP8 QuantizeLinear / DequantizeLinear: opset 19, float8 types: IR version 9. */
        if (opset < 19)
            st = qcal_error(QCAL_ERR_UNSUPPORTED,
                            "the table has FP8 entries: FP8 QuantizeLinear/DequantizeLinear need "
                            "opset >= 19, the model's default-domain opset is %lld (raise it first: "
                            "qcal_onnx_upgrade(m, 19, ...); 'qcal qdq' does it itself)",
                            (long long)opset);
    }
    if (st == QCAL_OK && opt->strict && r.n_missing) {
        size_t len = 64;
        for (int64_t i = 0; i < r.n_missing; i++)
            len += strlen(r.missing[i]) + 4;
        char *msg = malloc(len);
        if (msg) {
            msg[0] = '\0';
            for (int64_t i = 0; i < r.n_missing; i++) {
                strcat(msg, i ? ", '" : "'");
                strcat(msg, r.missing[i]);
                strcat(msg, "'");
            }
        }
        st = qcal_error(QCAL_ERR_NOT_FOUND, "%lld tensor%s the profile quantizes %s not in the table (--strict): %s",
                        (long long)r.n_missing, r.n_missing == 1 ? "" : "s",
                        r.n_missing == 1 ? "is" : "are", msg ? msg : "(out of memory)");
        free(msg);
    }
    /* the names of the main graph's ops about to be quantized (before the rewrite moves
     * nodes); nameless ops are not listed */
    for (size_t i = 0; st == QCAL_OK && i < p->g->n_node; i++) {
        const char *nm = p->g->node[i]->name;
        if (!p->np[i].quant || !nm || !nm[0])
            continue;
        char *d = onnx_strdup(nm);
        if (!d || !onnx_push((void ***)&r.quantized, (size_t *)&r.n_quantized, d)) {
            free(d);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
    }
    if (st == QCAL_OK)
        st = apply(p, &r);
    for (size_t k = 0; st == QCAL_OK && k < sub.n; k++) {
        qcal_onnx_qdq_report rs;
        memset(&rs, 0, sizeof rs);
        st = apply(sub.p[k], &rs);
        r.ops += rs.ops;
        r.tensors += rs.tensors;
        r.weights += rs.weights;
        r.biases += rs.biases;
    }
    if (st == QCAL_OK)
        st = drop_outer_weights(&sub);
    if (st == QCAL_OK && p->fp8 && (!m->proto->has_ir_version || m->proto->ir_version < 9)) {
        m->proto->has_ir_version = 1;
        m->proto->ir_version = 9;
    }
    for (size_t k = 0; st == QCAL_OK && k <= sub.n; k++) {
        plan *q = k ? sub.p[k - 1] : p;
        for (int64_t i = 0; st == QCAL_OK && i < q->nskipped; i++) {
            if (!onnx_push((void ***)&r.skipped, (size_t *)&r.n_skipped, q->skipped[i]))
                st = OOM();
            else
                q->skipped[i] = NULL;
        }
    }
    subplans_free(&sub);
    if (st == QCAL_OK && keep) {
        *keep = p;
    } else {
        plan_free(p);
        free(p);
    }
    return report_out(st, &r, rep);
}

qcal_status qcal_onnx_qdq(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                          qcal_onnx_qdq_report *rep)
{
    return qdq_run(m, table, opt, rep, NULL);
}

/* The pass of qcal_onnx_qdq_save: the lazy weights computed in plan order (the order of
 * their first readers, which is the order the rewrite appends their initializers), each
 * with its lazy biases, on a thread beside the save; the writer's fill of a lazy
 * initializer waits for its weight. */
typedef struct lazy_pass {
    plan *p;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started;
    int64_t done;         /* lazy weights finished, in order (under mu) */
    bool ended;           /* no more will finish (under mu) */
    qcal_status st;       /* the pass's status, final once ended */
    char msg[1024];       /* its message */
} lazy_pass;

/* Runs lazy weights (and their biases) k = 0, 1, ... until one fails. */
static void lazy_pass_run(lazy_pass *d, bool locked)
{
    plan *p = d->p;
    for (int64_t k = 0; k < p->nlw; k++) {
        qcal_status st = p->lw[k].w >= 0 ? lazy_job(p, k) : QCAL_OK;
        if (st != QCAL_OK)
            snprintf(d->msg, sizeof d->msg, "%s", qcal_last_error());
        if (locked)
            pthread_mutex_lock(&d->mu);
        d->st = st;
        if (st == QCAL_OK)
            d->done = k + 1;
        if (locked) {
            pthread_cond_broadcast(&d->cv);
            pthread_mutex_unlock(&d->mu);
        }
        if (st != QCAL_OK)
            break;
    }
    if (locked)
        pthread_mutex_lock(&d->mu);
    d->ended = true;
    if (locked) {
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
}

static void *lazy_main(void *arg)
{
    lazy_pass_run(arg, true);
    return NULL;
}

/* onnx_lazy's fill for every initializer of lazy weight ctx (its scales, codes and biases):
 * waits until the pass has computed it. */
static qcal_status lazy_fill(void *ctx, const Onnx__TensorProto *t)
{
    (void)t;
    const lazy_w *l = ctx;
    lazy_pass *d = l->pass;
    const int64_t k = l - d->p->lw;
    bool ok;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        while (d->done <= k && !d->ended)
            pthread_cond_wait(&d->cv, &d->mu);
        ok = d->done > k;
        pthread_mutex_unlock(&d->mu);
    } else {
        ok = d->done > k;   /* the pass ran on this thread before the save */
    }
    return ok ? QCAL_OK : qcal_error(d->st, "%s", d->msg);
}

/* The lazy initializers of plan p for the writer (*out, *n), each filled by lazy_fill. */
static qcal_status lazy_list(plan *p, lazy_pass *d, onnx_lazy **out, size_t *n)
{
    onnx_lazy *z = malloc((size_t)(2 * p->nlw + 2 * p->nlb + 1) * sizeof *z);
    if (!z)
        return OOM();
    size_t k = 0;
    for (int64_t i = 0; i < p->nlw; i++) {
        lazy_w *l = &p->lw[i];
        l->pass = d;
        if (l->w < 0)
            continue;
        if (!l->scale_t || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !l->codes_t)) {
            free(z);
            return qcal_error(QCAL_ERR_STATE, "lazy weight '%s' has no initializer", p->t[p->w[l->w].t].name);
        }
        z[k++] = (onnx_lazy){ l->scale_t, lazy_fill, l };
        if (l->codes_t)
            z[k++] = (onnx_lazy){ l->codes_t, lazy_fill, l };
    }
    for (int64_t i = 0; i < p->nlb; i++) {
        lazy_b *l = &p->lb[i];
        if (l->b < 0)
            continue;
        if (!l->codes_t || !l->scales_t) {
            free(z);
            return qcal_error(QCAL_ERR_STATE, "lazy bias '%s' has no initializer", p->t[p->b[l->b].t].name);
        }
        z[k++] = (onnx_lazy){ l->codes_t, lazy_fill, &p->lw[l->lw] };
        z[k++] = (onnx_lazy){ l->scales_t, lazy_fill, &p->lw[l->lw] };
    }
    *out = z;
    *n = k;
    return QCAL_OK;
}

qcal_status qcal_onnx_qdq_save(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                               const qcal_onnx_save_options *save, const char *path, qcal_onnx_qdq_report *rep)
{
    if (!m || !path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq_save: NULL argument");
    qcal_onnx_qdq_options def;   /* here: the kept plan points at the options until the end */
    qcal_onnx_qdq_options_default(&def);
    if (!opt)
        opt = &def;
    qcal_onnx_qdq_report r;
    plan *p = NULL;
    qcal_status st = qdq_run(m, table, opt, &r, &p);
    if (st != QCAL_OK)
        return st;
    lazy_pass d;
    memset(&d, 0, sizeof d);
    d.p = p;
    onnx_lazy *lazy = NULL;
    size_t n_lazy = 0;
    st = lazy_list(p, &d, &lazy, &n_lazy);
    if (st == QCAL_OK && n_lazy) {
        /* The pass runs beside the save with every signal blocked (they stay the caller's
         * threads' business); where no thread can be made it runs here first. */
        p->serial = true;   /* one thread: the save runs beside it */
        if (pthread_mutex_init(&d.mu, NULL) == 0) {
            if (pthread_cond_init(&d.cv, NULL) == 0) {
                sigset_t all, old;
                sigfillset(&all);
                pthread_sigmask(SIG_SETMASK, &all, &old);
                d.started = pthread_create(&d.th, NULL, lazy_main, &d) == 0;
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                if (!d.started)
                    pthread_cond_destroy(&d.cv);
            }
            if (!d.started)
                pthread_mutex_destroy(&d.mu);
        }
        if (!d.started) {
            p->serial = false;
            lazy_pass_run(&d, false);
            if (d.st != QCAL_OK)
                st = qcal_error(d.st, "%s", d.msg);
        }
    }
    if (st == QCAL_OK)
        st = onnx_model_save_lazy(m, save, path, lazy, n_lazy);
    if (d.started) {
        pthread_join(d.th, NULL);   /* on every path: the pass ends whatever the save did */
        pthread_cond_destroy(&d.cv);
        pthread_mutex_destroy(&d.mu);
    }
    /* A weight that failed is the failure, whatever the save said (an output error means a
     * whole model: every weight computed). */
    if (d.st != QCAL_OK)
        st = qcal_error(d.st, "%s", d.msg);
    free(lazy);
    plan_free(p);
    free(p);
    return report_out(st, &r, rep);
}

qcal_status qcal_onnx_qdq_session(qcal_onnx_model *m, qcal_calib_session *s, const qcal_onnx_qdq_options *opt,
                                  qcal_onnx_qdq_report *rep)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq_session: NULL session");
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_session_table(s, &t);
    if (st == QCAL_OK)
        st = qcal_onnx_qdq(m, t, opt, rep);
    qcal_calib_table_destroy(&t);
    return st;
}

void qcal_onnx_qdq_report_free(qcal_onnx_qdq_report *rep)
{
    if (!rep)
        return;
    for (int64_t i = 0; i < rep->n_missing; i++)
        free(rep->missing[i]);
    for (int64_t i = 0; i < rep->n_skipped; i++)
        free(rep->skipped[i]);
    for (int64_t i = 0; i < rep->n_quantized; i++)
        free(rep->quantized[i]);
    free(rep->missing);
    free(rep->skipped);
    free(rep->quantized);
    memset(rep, 0, sizeof *rep);
}
