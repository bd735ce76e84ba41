/* BatchNormalization folded into the Conv before it (Krishnamoorthi 2018, section 3.2):
 * y = (conv(x) + b - mean) * a + beta with a = scale / sqrt(var + eps) per output channel
 * is the Conv with weights W * a (each output channel) and bias (b - mean) * a + beta. The
 * Conv then writes the BatchNormalization's output and the BatchNormalization goes. The
 * BatchNormalization's shift and scale are kept (onnx_bn_stats) for the analytic bias
 * correction of qcal_onnx_equalize. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "onnx/fold_bn.h"

void qcal_onnx_fold_report_free(qcal_onnx_fold_report *rep)
{
    if (!rep)
        return;
    qcal_onnx_names_free(&rep->folded, rep->n_folded);
    qcal_onnx_names_free(&rep->kept, rep->n_kept);
    memset(rep, 0, sizeof *rep);
}

void onnx_bn_stats_free(onnx_bn_stats *s, int64_t n)
{
    for (int64_t i = 0; s && i < n; i++) {
        free(s[i].tensor);
        free(s[i].beta);
        free(s[i].gamma);
    }
    free(s);
}

static bool add_line(char ***arr, int64_t *n, const char *fmt, const char *a, const char *b, const char *c)
{
    char buf[1024];
    snprintf(buf, sizeof buf, fmt, a, b, c);
    char *s = qcal_strdup(buf);
    if (!s || !onnx_push((void ***)arr, (size_t *)n, s)) {
        free(s);
        return false;
    }
    return true;
}

static const char *nm(const Onnx__NodeProto *n)
{
    return n->name && n->name[0] ? n->name : (n->n_output ? n->output[0] : "");
}

/* Reads BN parameter slot k (float, C values) into a new array; NULL with *why. */
static float *bn_param(const onnx_gindex *x, const Onnx__GraphProto *g, const Onnx__NodeProto *bn, size_t k, int64_t c, const char **why)
{
    if (bn->n_input <= k || !bn->input[k][0]) {
        *why = "a parameter is missing";
        return NULL;
    }
    onnx_tref *r = onnx_gindex_const(x, g, bn->input[k], NULL);
    if (!r) {
        *why = "its parameters are not initializers";
        return NULL;
    }
    float *v = NULL;
    int64_t n;
    if (onnx_tensor_to_float(r->init, &v, &n) != QCAL_OK || n != c) {
        free(v);
        *why = "a parameter does not have one value per channel of the Conv";
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            free(v);
            *why = "a parameter is not finite";
            return NULL;
        }
    return v;
}

qcal_status onnx_fold_bn(qcal_onnx_model *m, qcal_onnx_fold_report *rep, onnx_bn_stats **stats_out,
                         int64_t *nstats_out)
{
    if (!m || !m->proto || !m->proto->graph)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_fold_bn: NULL model");
    Onnx__GraphProto *g = m->proto->graph;
    qcal_onnx_fold_report r = { 0 };
    onnx_bn_stats *stats = NULL;
    int64_t nstats = 0;
    onnx_reads before;
    qcal_status st = onnx_reads_take(g, &before);
    if (st != QCAL_OK)
        return st;
    onnx_gindex x;
    st = onnx_gindex_build(g, g, &x);
    if (st != QCAL_OK) {
        onnx_reads_free(&before);
        return st;
    }
    bool *drop = calloc(g->n_node ? g->n_node : 1, sizeof *drop);
    if (!drop) {
        onnx_gindex_free(&x);
        onnx_reads_free(&before);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    char why_buf[256];
    for (size_t i = 0; i < g->n_node; i++) {
        Onnx__NodeProto *bn = g->node[i];
        if (strcmp(bn->op_type, "BatchNormalization") || (bn->domain && bn->domain[0] && strcmp(bn->domain, "ai.onnx")))
            continue;
        const char *why = NULL;
        onnx_tref *in = bn->n_input ? onnx_gindex_get(&x, bn->input[0]) : NULL;
        Onnx__NodeProto *conv = in && in->producer >= 0 ? g->node[in->producer] : NULL;
        onnx_layer ly = { 0 };
        float *sc = NULL, *b = NULL, *mean = NULL, *var = NULL;
        const Onnx__AttributeProto *tm = onnx_node_attr(bn, "training_mode");
        size_t outs = 0;
        for (size_t k = 0; k < bn->n_output; k++)
            outs += bn->output[k] && bn->output[k][0];
        if (!conv || strcmp(conv->op_type, "Conv"))
            why = "its input is not produced by a Conv";
        else if (outs != 1 || (tm && tm->has_i && tm->i))
            why = "it is in training mode (more than one output)";
        else if (in->n_cons != 1 || in->graph_out || in->sub_ref)
            why = "the Conv's output has other readers";
        else if (onnx_layer_load(m, &x, in->producer, false, &ly, why_buf) != QCAL_OK)
            why = why_buf[0] ? why_buf : qcal_last_error();
        int64_t c = ly.l.out_channels;
        if (!why && (sc = bn_param(&x, g, bn, 1, c, &why)) && (b = bn_param(&x, g, bn, 2, c, &why)) &&
            (mean = bn_param(&x, g, bn, 3, c, &why)))
            var = bn_param(&x, g, bn, 4, c, &why);
        if (why) {
            why_buf[0] = '\0';
            if (!add_line(&r.kept, &r.n_kept, "%s (%s): %s", nm(bn), bn->op_type, why)) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            }
        } else {
            const Onnx__AttributeProto *ea = onnx_node_attr(bn, "epsilon");
            double eps = ea && ea->has_f ? ea->f : 1e-5;
            int64_t row = ly.l.in_channels / ly.l.groups * ly.l.kernel;
            for (int64_t o = 0; o < c && !why; o++)
                if (!(var[o] + eps > 0.0))
                    why = "a variance plus epsilon is not positive";
            if (why) {
                if (!add_line(&r.kept, &r.n_kept, "%s (%s): %s", nm(bn), bn->op_type, why))
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            } else {
                for (int64_t o = 0; o < c; o++) {
                    double a = (double)sc[o] / sqrt((double)var[o] + eps);
                    for (int64_t j = 0; j < row; j++)
                        ly.l.weight[o * row + j] = (float)(ly.l.weight[o * row + j] * a);
                    ly.l.bias[o] = (float)(((double)ly.l.bias[o] - mean[o]) * a + b[o]);
                }
                // the Conv now writes the BN's output; BN output names stay graph-unique
                char *newout = qcal_strdup(bn->output[0]);
                onnx_bn_stats s = { newout, c, b, sc };
                onnx_bn_stats *ns = newout ? realloc(stats, (size_t)(nstats + 1) * sizeof *ns) : NULL;
                if (ns)
                    stats = ns;
                char *convout = qcal_strdup(bn->output[0]);
                if (!ns || !convout) {
                    free(newout);
                    free(convout);
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                } else if ((st = onnx_layer_store(m, &x, &ly)) != QCAL_OK) {
                    free(newout);
                    free(convout);
                } else {
                    stats[nstats++] = s;
                    b = sc = NULL;   // owned by the stats now
                    free(conv->output[0]);   // x keeps its own copy of the name
                    conv->output[0] = convout;
                    drop[i] = true;
                    if (!add_line(&r.folded, &r.n_folded, "%s <- %s%s", nm(conv), nm(bn), ""))
                        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                }
            }
        }
        onnx_layer_free(&ly);
        free(sc);
        free(b);
        free(mean);
        free(var);
        if (st != QCAL_OK)
            break;
    }
    // The folded BNs' parameter initializers (and Constant nodes) that nothing else reads go with them.
    onnx_map params = { 0 };
    Onnx__TensorProto **dead = NULL;
    size_t ndead = 0;
    for (size_t i = 0; i < g->n_node && st == QCAL_OK; i++)
        for (size_t j = 1; drop[i] && j < g->node[i]->n_input; j++) {
            onnx_tref *pr = onnx_gindex_get(&x, g->node[i]->input[j]);
            if (!pr || !pr->init || pr->n_cons != 1 || pr->graph_out || pr->sub_ref)
                continue;
            if (pr->producer >= 0)
                drop[pr->producer] = true;   // a Constant node holding the parameter
            else if (!onnx_map_put(&params, pr->name, 0))
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
    size_t k = 0;
    if (st == QCAL_OK) {
        // initializers that are also graph inputs stay (a caller may feed them)
        for (size_t i = 0; i < g->n_initializer; i++) {
            Onnx__TensorProto *t = g->initializer[i];
            bool in = false;
            for (size_t j = 0; j < g->n_input && !in; j++)
                in = g->input[j]->name && t->name && !strcmp(g->input[j]->name, t->name);
            if (t->name && !in && onnx_map_get(&params, t->name)) {
                // freed below, once params (whose keys are these names) is gone
                if (!onnx_push((void ***)&dead, &ndead, t)) {
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    g->initializer[k++] = t;
                }
            } else {
                g->initializer[k++] = t;
            }
        }
        g->n_initializer = k;
    }
    onnx_map_free(&params);
    for (size_t i = 0; i < ndead; i++) {
        onnx_tensor_release(m, dead[i]);
        protobuf_c_message_free_unpacked(&dead[i]->base, NULL);
    }
    free(dead);
    k = 0;
    for (size_t i = 0; i < g->n_node; i++) {
        if (drop[i])
            protobuf_c_message_free_unpacked(&g->node[i]->base, NULL);
        else
            g->node[k++] = g->node[i];
    }
    g->n_node = k;
    free(drop);
    onnx_gindex_free(&x);
    // what else only the folded BNs read (a parameter behind an Identity or a Cast)
    if (st == QCAL_OK && r.n_folded)
        st = onnx_prune_orphans(m, &before, NULL, NULL);
    onnx_reads_free(&before);
    if (st != QCAL_OK) {
        qcal_onnx_fold_report_free(&r);
        onnx_bn_stats_free(stats, nstats);
        return st;
    }
    if (rep)
        *rep = r;
    else
        qcal_onnx_fold_report_free(&r);
    if (stats_out) {
        *stats_out = stats;
        *nstats_out = nstats;
    } else {
        onnx_bn_stats_free(stats, nstats);
    }
    return QCAL_OK;
}

qcal_status qcal_onnx_fold_bn(qcal_onnx_model *m, qcal_onnx_fold_report *rep)
{
    return onnx_fold_bn(m, rep, NULL, NULL);
}
