/* qcal_onnx_equalize: cross-layer equalization on the graph (Nagel et al. 2019), after
 * BatchNormalization folding, with optional bias correction. A plain pass: find the chains
 * Conv/Gemm -> Relu -> Conv/Gemm, check each is safe (single readers, private float32
 * weights, positive-homogeneous activation), change them, and list what was refused and
 * why, naming the node at fault. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "onnx/fold_bn.h"
#include "qcal/calib_dump.h"
#include "qcal/npy.h"

#define OOM() qcal_error(QCAL_ERR_NO_MEMORY, "out of memory")

void qcal_onnx_layer_ranges_free(qcal_onnx_layer_ranges **r, int64_t n)
{
    if (!r || !*r)
        return;
    for (int64_t i = 0; i < n; i++)
        free((*r)[i].node);
    free(*r);
    *r = NULL;
}

void qcal_onnx_equalize_report_free(qcal_onnx_equalize_report *rep)
{
    if (!rep)
        return;
    qcal_onnx_fold_report_free(&rep->fold);
    qcal_onnx_names_free(&rep->pairs, rep->n_pairs);
    qcal_onnx_names_free(&rep->replaced, rep->n_replaced);
    qcal_onnx_names_free(&rep->refused, rep->n_refused);
    qcal_onnx_names_free(&rep->corrected, rep->n_corrected);
    qcal_onnx_layer_ranges_free(&rep->before, rep->n_layers);
    qcal_onnx_layer_ranges_free(&rep->after, rep->n_layers);
    memset(rep, 0, sizeof *rep);
}

static const char *nm(const Onnx__NodeProto *n)
{
    return n->name && n->name[0] ? n->name : (n->n_output ? n->output[0] : "");
}

static bool is_layer_op(const Onnx__NodeProto *n)
{
    return (!n->domain || !n->domain[0] || !strcmp(n->domain, "ai.onnx")) &&
           (!strcmp(n->op_type, "Conv") || !strcmp(n->op_type, "Gemm"));
}

QCAL_PRINTF(3, 4) static bool addf(char ***arr, int64_t *n, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *s = qcal_strdup(buf);
    if (!s || !onnx_push((void ***)arr, (size_t *)n, s)) {
        free(s);
        return false;
    }
    return true;
}

qcal_status qcal_onnx_weight_ranges(const qcal_onnx_model *m, qcal_onnx_layer_ranges **out, int64_t *n)
{
    if (!m || !m->proto || !m->proto->graph || !out || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_weight_ranges: NULL argument");
    const Onnx__GraphProto *g = m->proto->graph;
    onnx_gindex x;
    qcal_status st = onnx_gindex_build(g, NULL, &x);
    if (st != QCAL_OK)
        return st;
    qcal_onnx_layer_ranges *r = NULL;
    int64_t k = 0;
    for (size_t i = 0; i < g->n_node && st == QCAL_OK; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        if (!is_layer_op(nd) || nd->n_input < 2)
            continue;
        onnx_layer ly;
        char why[256];
        qcal_status ls = onnx_layer_load(m, &x, (int64_t)i, true, &ly, why);
        if (ls == QCAL_ERR_UNSUPPORTED)
            continue;
        if (ls != QCAL_OK) {
            st = ls;
            break;
        }
        qcal_onnx_layer_ranges e = { 0 };
        e.op_type = ly.gemm ? "Gemm" : "Conv";
        e.channels = ly.l.out_channels;
        e.groups = ly.l.groups;
        st = qcal_ptq_range_ratio(&ly.l, &e.ratio, &e.min_range, &e.max_range);
        onnx_layer_free(&ly);
        if (st != QCAL_OK)
            break;
        qcal_onnx_layer_ranges *nr = realloc(r, (size_t)(k + 1) * sizeof *nr);
        e.node = qcal_strdup(nm(nd));
        if (!nr || !e.node) {
            if (nr)
                r = nr;
            free(e.node);
            st = OOM();
            break;
        }
        r = nr;
        r[k++] = e;
    }
    onnx_gindex_free(&x);
    if (st != QCAL_OK) {
        qcal_onnx_layer_ranges_free(&r, k);
        return st;
    }
    *out = r;
    *n = k;
    return QCAL_OK;
}

/* A chain a -> act -> b. */
typedef struct pair {
    int64_t a, act, b;    /* node indices */
    int64_t la, lb;       /* layer slots */
    bool clip;            /* act is a Clip to replace */
    float clip_max;
} pair;

typedef struct eq {
    qcal_onnx_model *m;
    Onnx__GraphProto *g;
    onnx_gindex x;
    onnx_layer *layers;   /* loaded layers (by slot) */
    int64_t nlayers;
    int64_t *slot_of;     /* node index -> layer slot or -1; -2: cannot load */
    char **why_of;        /* node index -> reason it cannot load */
    float **scale;        /* per slot: cumulative CLE scale of its output channels, or NULL */
    pair *pairs;
    int64_t npairs;
    qcal_onnx_equalize_report *rep;
} eq;

static void eq_free(eq *e)
{
    for (int64_t i = 0; i < e->nlayers; i++) {
        onnx_layer_free(&e->layers[i]);
        free(e->scale[i]);
    }
    if (e->why_of)
        for (size_t i = 0; i < e->g->n_node; i++)
            free(e->why_of[i]);
    free(e->why_of);
    free(e->layers);
    free(e->scale);
    free(e->slot_of);
    free(e->pairs);
    onnx_gindex_free(&e->x);
}

/* Layer slot of node ni (loaded once); -1 with e->why_of[ni] when it cannot be rewritten. */
static qcal_status get_layer(eq *e, int64_t ni, int64_t *slot)
{
    if (e->slot_of[ni] >= 0 || e->slot_of[ni] == -2) {
        *slot = e->slot_of[ni] >= 0 ? e->slot_of[ni] : -1;
        return QCAL_OK;
    }
    char why[256] = "";
    onnx_layer ly;
    qcal_status st = onnx_layer_load(e->m, &e->x, ni, false, &ly, why);
    if (st == QCAL_ERR_UNSUPPORTED) {
        e->slot_of[ni] = -2;
        e->why_of[ni] = qcal_strdup(why);
        *slot = -1;
        return e->why_of[ni] ? QCAL_OK : OOM();
    }
    if (st != QCAL_OK)
        return st;
    onnx_layer *nl = realloc(e->layers, (size_t)(e->nlayers + 1) * sizeof *nl);
    float **ns = nl ? realloc(e->scale, (size_t)(e->nlayers + 1) * sizeof *ns) : NULL;
    if (nl)
        e->layers = nl;
    if (ns)
        e->scale = ns;
    if (!nl || !ns) {
        onnx_layer_free(&ly);
        return OOM();
    }
    e->layers[e->nlayers] = ly;
    e->scale[e->nlayers] = NULL;
    e->slot_of[ni] = e->nlayers;
    *slot = e->nlayers++;
    return QCAL_OK;
}

/* Clip's min and max (inputs 1, 2 from opset 11; attributes before); false: not constant. */
static bool clip_bounds(const eq *e, const Onnx__NodeProto *n, float *lo, float *hi)
{
    *lo = -INFINITY;
    *hi = INFINITY;
    const Onnx__AttributeProto *a;
    if ((a = onnx_node_attr(n, "min")) && a->has_f)
        *lo = a->f;
    if ((a = onnx_node_attr(n, "max")) && a->has_f)
        *hi = a->f;
    for (size_t k = 1; k < n->n_input && k < 3; k++) {
        if (!n->input[k] || !n->input[k][0])
            continue;
        onnx_tref *r = onnx_gindex_get(&e->x, n->input[k]);
        const Onnx__TensorProto *t = r ? r->init : NULL;
        // through Cast / Identity (what torch.onnx writes for clamp bounds) to a Constant
        for (int hop = 0; r && !t && r->producer >= 0 && hop < 4; hop++) {
            const Onnx__NodeProto *pn = e->g->node[r->producer];
            if ((strcmp(pn->op_type, "Cast") && strcmp(pn->op_type, "Identity")) || pn->n_input < 1)
                break;
            r = onnx_gindex_get(&e->x, pn->input[0]);
            t = r ? r->init : NULL;
        }
        if (r && !t && r->producer >= 0 && !strcmp(e->g->node[r->producer]->op_type, "Constant")) {
            const Onnx__AttributeProto *va = onnx_node_attr(e->g->node[r->producer], "value");
            t = va ? va->t : NULL;
        }
        float *v = NULL;
        int64_t cnt;
        if (!t || onnx_tensor_to_float(t, &v, &cnt) != QCAL_OK || cnt != 1) {
            free(v);
            return false;
        }
        if (k == 1)
            *lo = v[0];
        else
            *hi = v[0];
        free(v);
    }
    return true;
}

#define REFUSE(node, ...)                                                                          \
    do {                                                                                           \
        if (!addf(&e->rep->refused, &e->rep->n_refused, __VA_ARGS__))                              \
            return OOM();                                                                          \
        (void)(node);                                                                              \
        return QCAL_OK;                                                                            \
    } while (0)

/* Examines act (a node whose input 0 comes from a layer and whose output reaches layer b). */
static qcal_status consider(eq *e, const qcal_onnx_equalize_options *opt, int64_t ai, int64_t xi, int64_t bi)
{
    Onnx__NodeProto *A = e->g->node[ai], *X = e->g->node[xi], *B = e->g->node[bi];
    pair p = { ai, xi, bi, -1, -1, false, 0.0f };
    bool relu = !strcmp(X->op_type, "Relu") && (!X->domain || !X->domain[0]);
    if (!relu && !strcmp(X->op_type, "Clip") && (!X->domain || !X->domain[0])) {
        float lo, hi;
        if (!clip_bounds(e, X, &lo, &hi))
            REFUSE(X, "%s (Clip): its bounds are not constants", nm(X));
        if (lo != 0.0f)
            REFUSE(X, "%s (Clip): min %g is not 0, so the activation is not a ReLU (not positive-homogeneous)",
                   nm(X), (double)lo);
        if (!opt->replace_clip && isfinite(hi))
            REFUSE(X, "%s (Clip): Clip(0, %g) would have to become Relu (replacement disabled)", nm(X), (double)hi);
        p.clip = isfinite(hi);
        p.clip_max = hi;
        relu = true;
    }
    if (!relu)
        REFUSE(X, "%s (%s): between %s and %s, but only Relu (or Clip from 0) commutes with per-channel scaling",
               nm(X), X->op_type, nm(A), nm(B));
    onnx_tref *t1 = onnx_gindex_get(&e->x, A->output[0]), *t2 = onnx_gindex_get(&e->x, X->output[0]);
    if (A->n_output != 1 || !t1 || t1->n_cons != 1 || t1->graph_out || t1->sub_ref)
        REFUSE(A, "%s (%s): its output '%s' has other readers than %s", nm(A), A->op_type, A->output[0], nm(X));
    if (!t2 || t2->n_cons != 1 || t2->graph_out || t2->sub_ref)
        REFUSE(X, "%s (%s): its output '%s' %s (a residual branch), so %s cannot be rescaled alone", nm(X),
               X->op_type, X->output[0], t2 && t2->graph_out ? "is a graph output" : "has more than one reader",
               nm(B));
    if (B->n_input < 1 || strcmp(B->input[0], X->output[0]))
        REFUSE(B, "%s (%s): reads '%s' as a weight, not as its data input", nm(B), B->op_type, X->output[0]);
    qcal_status st;
    if ((st = get_layer(e, ai, &p.la)) != QCAL_OK)
        return st;
    if (p.la < 0)
        REFUSE(A, "%s (%s): %s", nm(A), A->op_type, e->why_of[ai]);
    if ((st = get_layer(e, bi, &p.lb)) != QCAL_OK)
        return st;
    if (p.lb < 0)
        REFUSE(B, "%s (%s): %s", nm(B), B->op_type, e->why_of[bi]);
    const qcal_ptq_layer *la = &e->layers[p.la].l, *lb = &e->layers[p.lb].l;
    if (la->out_channels != lb->in_channels)
        REFUSE(B, "%s (%s): reads %lld channels, %s writes %lld", nm(B), B->op_type, (long long)lb->in_channels,
               nm(A), (long long)la->out_channels);
    pair *np = realloc(e->pairs, (size_t)(e->npairs + 1) * sizeof *np);
    if (!np)
        return OOM();
    e->pairs = np;
    e->pairs[e->npairs++] = p;
    return QCAL_OK;
}

/* Per-channel mean over axis 1 of every batch file of a dump tensor into mean[c]. */
static qcal_status dump_mean(const qcal_calib_dump_tensor *t, int64_t c, float *mean)
{
    double *acc = calloc((size_t)c, sizeof *acc);
    if (!acc)
        return OOM();
    int64_t count = 0;
    qcal_status st = QCAL_OK;
    for (int64_t f = 0; f < t->nfiles && st == QCAL_OK; f++) {
        qcal_npy_array a = { 0 };
        if ((st = qcal_npy_read_f32(t->files[f], &a)) != QCAL_OK)
            break;
        if (a.ndim < 2 || a.shape[1] != c) {
            st = qcal_error(QCAL_ERR_MISMATCH, "dump tensor '%s': '%s' has shape with %lld channels on axis 1, the layer reads %lld",
                            t->name, t->files[f], (long long)(a.ndim >= 2 ? a.shape[1] : 0), (long long)c);
        } else {
            int64_t inner = 1;
            for (int32_t d = 2; d < a.ndim; d++)
                inner *= a.shape[d];
            const float *v = a.data;
            // (N, C, inner): sums in a fixed order, double
            for (int64_t nb = 0; nb < a.shape[0] && st == QCAL_OK; nb++)
                for (int64_t ch = 0; ch < c; ch++) {
                    const float *p = v + (nb * c + ch) * inner;
                    double s = 0.0;
                    for (int64_t k = 0; k < inner; k++)
                        s += p[k];
                    if (!isfinite(s))
                        st = qcal_error(QCAL_ERR_NONFINITE, "dump tensor '%s': '%s' holds non-finite values", t->name,
                                        t->files[f]);
                    acc[ch] += s;
                }
            count += a.shape[0] * inner;
        }
        qcal_npy_array_free(&a);
    }
    if (st == QCAL_OK && count == 0)
        st = qcal_error(QCAL_ERR_EMPTY, "dump tensor '%s' holds no values", t->name);
    if (st == QCAL_OK)
        for (int64_t ch = 0; ch < c; ch++)
            mean[ch] = (float)(acc[ch] / (double)count);
    free(acc);
    return st;
}

/* Divides mean[c] by the cumulative CLE scale of the tensor layer ni reads, when that
 * tensor is the Relu output of an equalized pair. Also returns that pair's index (or -1). */
static int64_t pair_into(const eq *e, int64_t ni)
{
    for (int64_t i = 0; i < e->npairs; i++)
        if (e->pairs[i].b == ni)
            return i;
    return -1;
}

static qcal_status correct_biases(eq *e, const qcal_onnx_equalize_options *opt, onnx_bn_stats *stats,
                                  int64_t nstats)
{
    qcal_calib_dump *d = NULL;
    qcal_status st = QCAL_OK;
    if (opt->bias_correction_dump && (st = qcal_calib_dump_scan(opt->bias_correction_dump, &d)) != QCAL_OK)
        return st;
    int64_t nd = 0;
    if (d)
        qcal_calib_dump_count(d, &nd);
    for (size_t ni = 0; ni < e->g->n_node && st == QCAL_OK; ni++) {
        Onnx__NodeProto *n = e->g->node[ni];
        if (!is_layer_op(n) || n->n_input < 2)
            continue;
        int64_t slot;
        if ((st = get_layer(e, (int64_t)ni, &slot)) != QCAL_OK)
            break;
        if (slot < 0)
            continue;
        qcal_ptq_layer *l = &e->layers[slot].l;
        float *mean = malloc((size_t)l->in_channels * sizeof *mean);
        if (!mean) {
            st = OOM();
            break;
        }
        bool have = false;
        int64_t pi = pair_into(e, (int64_t)ni);
        if (d) {
            for (int64_t k = 0; k < nd; k++) {
                qcal_calib_dump_tensor t;
                qcal_calib_dump_tensor_at(d, k, &t);
                if (t.role == QCAL_CALIB_ROLE_ACTIVATION && !strcmp(t.name, n->input[0])) {
                    st = dump_mean(&t, l->in_channels, mean);
                    have = st == QCAL_OK;
                    break;
                }
            }
            // the dump is of the model before equalization: x_new = x / s per channel
            if (have && pi >= 0 && e->scale[e->pairs[pi].la])
                for (int64_t c = 0; c < l->in_channels; c++)
                    mean[c] /= e->scale[e->pairs[pi].la][c];
        } else if (opt->analytic_bias_correction) {
            // input = Relu(folded Conv output): the BN's shift and scale, over the CLE scale
            onnx_tref *xr = onnx_gindex_get(&e->x, n->input[0]);
            Onnx__NodeProto *act = xr && xr->producer >= 0 ? e->g->node[xr->producer] : NULL;
            if (act && !strcmp(act->op_type, "Relu") && act->n_input >= 1)
                for (int64_t s = 0; s < nstats; s++)
                    if (!strcmp(stats[s].tensor, act->input[0]) && stats[s].channels == l->in_channels) {
                        float *mu = malloc((size_t)l->in_channels * sizeof *mu),
                              *sd = malloc((size_t)l->in_channels * sizeof *sd);
                        if (!mu || !sd) {
                            free(mu);
                            free(sd);
                            st = OOM();
                            break;
                        }
                        const float *sc = pi >= 0 ? e->scale[e->pairs[pi].la] : NULL;
                        for (int64_t c = 0; c < l->in_channels; c++) {
                            mu[c] = stats[s].beta[c] / (sc ? sc[c] : 1.0f);
                            sd[c] = fabsf(stats[s].gamma[c]) / (sc ? sc[c] : 1.0f);
                        }
                        st = qcal_ptq_relu_normal_mean(l->in_channels, mu, sd, mean);
                        have = st == QCAL_OK;
                        free(mu);
                        free(sd);
                        break;
                    }
        }
        if (have) {
            int64_t numel = l->out_channels * (l->in_channels / l->groups) * l->kernel;
            float *wq = malloc((size_t)numel * sizeof *wq), *shift = malloc((size_t)l->out_channels * sizeof *shift);
            if (!wq || !shift)
                st = OOM();
            if (st == QCAL_OK)
                st = qcal_ptq_weight_fake_quant(l, &opt->weight_qconfig, wq);
            if (st == QCAL_OK)
                st = qcal_ptq_bias_correct(l, wq, mean, shift);
            if (st == QCAL_OK) {
                float mx = 0.0f;
                for (int64_t o = 0; o < l->out_channels; o++)
                    mx = fmaxf(mx, fabsf(shift[o]));
                if (!addf(&e->rep->corrected, &e->rep->n_corrected, "%s: max |shift| %.6g", nm(n), (double)mx))
                    st = OOM();
            } else {
                st = qcal_error(st, "bias correction of %s (%s): %s", nm(n), n->op_type, qcal_last_error());
            }
            free(wq);
            free(shift);
        }
        free(mean);
    }
    qcal_calib_dump_destroy(&d);
    return st;
}

static qcal_status run(eq *e, const qcal_onnx_equalize_options *opt, onnx_bn_stats *stats, int64_t nstats)
{
    qcal_status st;
    size_t nn = e->g->n_node;
    e->slot_of = malloc((nn ? nn : 1) * sizeof *e->slot_of);
    e->why_of = calloc(nn ? nn : 1, sizeof *e->why_of);
    if (!e->slot_of || !e->why_of)
        return OOM();
    for (size_t i = 0; i < nn; i++)
        e->slot_of[i] = -1;
    if ((st = onnx_gindex_build(e->g, e->g, &e->x)) != QCAL_OK)
        return st;
    // Find: every node X whose data input a layer writes and whose output a layer reads.
    for (size_t xi = 0; xi < nn && opt->equalize; xi++) {
        Onnx__NodeProto *X = e->g->node[xi];
        if (is_layer_op(X) || X->n_input < 1 || X->n_output < 1 || !X->output[0][0])
            continue;
        onnx_tref *in = onnx_gindex_get(&e->x, X->input[0]);
        if (!in || in->producer < 0 || !is_layer_op(e->g->node[in->producer]))
            continue;
        // a join (Add, Mul, Concat, ...) reads another tensor: no chain, nothing to refuse
        bool join = false;
        for (size_t k = 1; k < X->n_input && strcmp(X->op_type, "Clip"); k++) {
            onnx_tref *o = X->input[k][0] ? onnx_gindex_get(&e->x, X->input[k]) : NULL;
            join |= o && !onnx_gindex_const(&e->x, e->g, X->input[k], NULL) &&
                    !(o->producer >= 0 && !strcmp(e->g->node[o->producer]->op_type, "Constant"));
        }
        if (join)
            continue;
        int64_t bi = -1;
        for (size_t j = xi + 1; j < nn && bi < 0; j++) {
            const Onnx__NodeProto *B = e->g->node[j];
            if (!is_layer_op(B))
                continue;
            for (size_t k = 0; k < B->n_input; k++)
                if (!strcmp(B->input[k], X->output[0]))
                    bi = (int64_t)j;
        }
        if (bi < 0)
            continue;
        if ((st = consider(e, opt, in->producer, (int64_t)xi, bi)) != QCAL_OK)
            return st;
    }
    // Change: sweeps over the pairs in graph order until the scales settle.
    for (int64_t i = 0; i < e->npairs; i++) {
        int64_t la = e->pairs[i].la, c = e->layers[la].l.out_channels;
        if (!(e->scale[la] = malloc((size_t)c * sizeof(float))))
            return OOM();
        for (int64_t k = 0; k < c; k++)
            e->scale[la][k] = 1.0f;
    }
    float *s = NULL;
    for (int64_t sweep = 0; sweep < opt->max_sweeps && e->npairs; sweep++) {
        double worst = 0.0;
        for (int64_t i = 0; i < e->npairs; i++) {
            pair *p = &e->pairs[i];
            int64_t c = e->layers[p->la].l.out_channels;
            float *ns = realloc(s, (size_t)c * sizeof *ns);
            if (!ns) {
                free(s);
                return OOM();
            }
            s = ns;
            if ((st = qcal_ptq_equalize_pair(&e->layers[p->la].l, &e->layers[p->lb].l, s)) != QCAL_OK) {
                free(s);
                return qcal_error(st, "equalizing %s -> %s: %s", nm(e->g->node[p->a]), nm(e->g->node[p->b]),
                                  qcal_last_error());
            }
            for (int64_t k = 0; k < c; k++) {
                e->scale[p->la][k] *= s[k];
                worst = fmax(worst, fabs((double)s[k] - 1.0));
            }
        }
        e->rep->sweeps = sweep + 1;
        if (worst < 1e-6)
            break;
    }
    free(s);
    for (int64_t i = 0; i < e->npairs; i++) {
        pair *p = &e->pairs[i];
        Onnx__NodeProto *X = e->g->node[p->act];
        if (!addf(&e->rep->pairs, &e->rep->n_pairs, "%s -> %s -> %s", nm(e->g->node[p->a]), nm(X),
                  nm(e->g->node[p->b])))
            return OOM();
        if (p->clip) {
            // Clip(0, M) -> Relu: the scaled channels would need per-channel bounds M / s
            if (!addf(&e->rep->replaced, &e->rep->n_replaced, "%s: Clip(0, %g) -> Relu", nm(X), (double)p->clip_max))
                return OOM();
            char *op = qcal_strdup("Relu");
            if (!op)
                return OOM();
            free(X->op_type);
            X->op_type = op;
            for (size_t k = 1; k < X->n_input; k++) {
                free(X->input[k]);   /* x keeps its own copy of the name */
                X->input[k] = NULL;
            }
            X->n_input = 1;
            for (size_t k = 0; k < X->n_attribute; k++)
                protobuf_c_message_free_unpacked(&X->attribute[k]->base, NULL);
            free(X->attribute);
            X->attribute = NULL;
            X->n_attribute = 0;
        } else if (!strcmp(X->op_type, "Clip")) {
            // Clip(0, inf) is a Relu already
        }
    }
    if ((opt->bias_correction_dump || opt->analytic_bias_correction) &&
        (st = correct_biases(e, opt, stats, nstats)) != QCAL_OK)
        return st;
    for (int64_t i = 0; i < e->nlayers; i++)
        if ((st = onnx_layer_store(e->m, &e->x, &e->layers[i])) != QCAL_OK)
            return st;
    return QCAL_OK;
}

qcal_status qcal_onnx_equalize(qcal_onnx_model *m, const qcal_onnx_equalize_options *opt,
                               qcal_onnx_equalize_report *rep)
{
    if (!m || !m->proto || !m->proto->graph || !opt)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_equalize: NULL argument");
    if (opt->bias_correction_dump && opt->analytic_bias_correction)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "empirical (a dump) and analytic bias correction exclude each other: choose one");
    if (opt->max_sweeps < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "max_sweeps %lld is not >= 1", (long long)opt->max_sweeps);
    int64_t qmin, qmax;
    if ((opt->bias_correction_dump || opt->analytic_bias_correction) &&
        qcal_qconfig_range(&opt->weight_qconfig, &qmin, &qmax) != QCAL_OK)
        return qcal_error(QCAL_ERR_INVALID_ARG, "weight quantizer: %s", qcal_last_error());
    qcal_onnx_equalize_report r = { 0 };
    onnx_bn_stats *stats = NULL;
    int64_t nstats = 0;
    // what the graph reads now: the Constants (and initializers) nothing reads after the
    // rewrite go (each Clip(0, 6) made a Relu leaves its bounds unread)
    onnx_reads before;
    qcal_status st = onnx_reads_take(m->proto->graph, &before);
    if (st != QCAL_OK)
        return st;
    if (opt->fold_bn)
        st = onnx_fold_bn(m, &r.fold, &stats, &nstats);
    int64_t nb = 0, na = 0;
    if (st == QCAL_OK)
        st = qcal_onnx_weight_ranges(m, &r.before, &nb);
    eq e;
    memset(&e, 0, sizeof e);
    e.m = m;
    e.g = m->proto->graph;
    e.rep = &r;
    if (st == QCAL_OK)
        st = run(&e, opt, stats, nstats);
    eq_free(&e);
    onnx_bn_stats_free(stats, nstats);
    if (st == QCAL_OK)
        st = onnx_prune_orphans(m, &before, NULL, NULL);
    onnx_reads_free(&before);
    r.n_layers = nb;
    if (st == QCAL_OK)
        st = qcal_onnx_weight_ranges(m, &r.after, &na);
    if (st == QCAL_OK && na != nb)
        st = qcal_error(QCAL_ERR_STATE, "qcal_onnx_equalize: %lld layers before, %lld after", (long long)nb,
                        (long long)na);
    if (st != QCAL_OK) {
        qcal_onnx_layer_ranges_free(&r.after, na);
        r.after = NULL;
        qcal_onnx_equalize_report_free(&r);
        return st;
    }
    if (rep)
        *rep = r;
    else
        qcal_onnx_equalize_report_free(&r);
    return QCAL_OK;
}
