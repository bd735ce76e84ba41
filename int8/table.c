/* qcal_int8_net_from_table: a calibration table's activation (and weight) entries turned into
 * the qparams of an int8 net, through the public builder API of qcal/int8.h only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/int8.h"

void qcal_int8_layer_desc_default(qcal_int8_layer_desc *d, qcal_int8_layer_kind kind)
{
    if (!d)
        return;
    memset(d, 0, sizeof *d);
    d->kind = kind;
    qcal_int8_conv2d_params_default(&d->conv);
    qcal_int8_linear_params_default(&d->linear);
    qcal_int8_pool2d_params_default(&d->pool);
}

static bool is_weighted(qcal_int8_layer_kind k)
{
    return k == QCAL_INT8_CONV2D || k == QCAL_INT8_LINEAR;
}

/* The (fqn, activation) entry's qparams (quint8 per-tensor), pointing into the table. */
static qcal_status act_qparams(const qcal_calib_table *t, const char *fqn, const qcal_qparams **out)
{
    static const char fn[] = "int8_net_from_table";
    const qcal_calib_entry *e = NULL;
    qcal_status st = qcal_calib_table_find(t, fqn, QCAL_CALIB_ROLE_ACTIVATION, &e);
    if (st == QCAL_ERR_NOT_FOUND)
        return qcal_error(st, "%s: the table has no activation entry '%s'", fn, fqn);
    if (st != QCAL_OK)
        return st;
    const qcal_qparams *q = &e->qparams;
    if (q->dtype != QCAL_QUINT8 || qcal_qscheme_is_per_channel(q->qscheme) || q->channels != 1)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: activation entry '%s' is %s %s with %lld "
                          "channels; the int8 net takes quint8 per-tensor activations", fn, fqn,
                          qcal_dtype_name(q->dtype), qcal_qscheme_name(q->qscheme),
                          (long long)q->channels);
    if (e->no_data)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: activation entry '%s' saw no finite value", fn,
                          fqn);
    *out = q;
    return QCAL_OK;
}

/* The (fqn.weight, weight) entry's qparams if the table has one (*out NULL otherwise). */
static qcal_status weight_qparams(const qcal_calib_table *t, const char *fqn, int64_t channels,
                                  const qcal_qparams **out)
{
    static const char fn[] = "int8_net_from_table";
    char name[512];
    if (snprintf(name, sizeof name, "%s.weight", fqn) >= (int)sizeof name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer name '%.64s...' is too long", fn, fqn);
    const qcal_calib_entry *e = NULL;
    *out = NULL;
    qcal_status st = qcal_calib_table_find(t, name, QCAL_CALIB_ROLE_WEIGHT, &e);
    if (st == QCAL_ERR_NOT_FOUND)
        return QCAL_OK;
    if (st != QCAL_OK)
        return st;
    const qcal_qparams *q = &e->qparams;
    if (q->dtype != QCAL_QINT8 || q->qscheme != QCAL_PER_CHANNEL_SYMMETRIC || q->axis != 0 ||
        q->channels != channels || e->no_data)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: weight entry '%s' is %s %s axis %d with %lld "
                          "channels%s; the layer needs qint8 per_channel_symmetric axis 0 with "
                          "%lld", fn, name, qcal_dtype_name(q->dtype),
                          qcal_qscheme_name(q->qscheme), (int)q->axis, (long long)q->channels,
                          e->no_data ? " and no data" : "", (long long)channels);
    *out = q;
    return QCAL_OK;
}

qcal_status qcal_int8_net_from_table(const qcal_int8_net_options *opt,
                                     const qcal_calib_table *table, int32_t ndim,
                                     const int64_t *input_shape, int32_t nlayers,
                                     const qcal_int8_layer_desc *layers,
                                     const char *output_fqn, qcal_int8_net **out)
{
    static const char fn[] = "int8_net_from_table";
    if (!table || !layers || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                          !table ? "table" : !layers ? "layers" : "out");
    int32_t first = -1;
    for (int32_t i = 0; i < nlayers; i++) {
        const qcal_int8_layer_desc *d = &layers[i];
        if (d->kind != QCAL_INT8_CONV2D && d->kind != QCAL_INT8_LINEAR &&
            d->kind != QCAL_INT8_MAXPOOL2D && d->kind != QCAL_INT8_RELU)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer %d has unknown kind %d", fn, i,
                              (int)d->kind);
        if (is_weighted(d->kind) && !d->fqn)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer %d (%s) has no fqn", fn, i,
                              d->kind == QCAL_INT8_CONV2D ? "conv2d" : "linear");
        if (is_weighted(d->kind) && first < 0)
            first = i;
    }
    if (nlayers < 1 || first < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %d layers with no conv2d or linear layer "
                          "(its input entry gives the net's input qparams)", fn, nlayers);

    const qcal_qparams *in_q = NULL;
    qcal_status st = act_qparams(table, layers[first].fqn, &in_q);
    if (st != QCAL_OK)
        return st;
    qcal_int8_net *net = NULL;
    if ((st = qcal_int8_net_create(opt, ndim, input_shape, in_q, &net)) != QCAL_OK)
        return st;
    for (int32_t i = 0; i < nlayers && st == QCAL_OK; i++) {
        const qcal_int8_layer_desc *d = &layers[i];
        if (d->kind == QCAL_INT8_MAXPOOL2D) {
            st = qcal_int8_net_add_maxpool2d(net, &d->pool);
            continue;
        }
        if (d->kind == QCAL_INT8_RELU) {
            st = qcal_int8_net_add_relu(net);
            continue;
        }
        /* Output qparams: the next conv / linear layer's input, or output_fqn, or f32. */
        const char *next = output_fqn;
        for (int32_t j = i + 1; j < nlayers; j++)
            if (is_weighted(layers[j].kind)) {
                next = layers[j].fqn;
                break;
            }
        const qcal_qparams *out_q = NULL;
        if (next && (st = act_qparams(table, next, &out_q)) != QCAL_OK)
            break;
        const qcal_int8_out_type ot = next ? QCAL_INT8_OUT_U8 : QCAL_INT8_OUT_F32;
        if (d->kind == QCAL_INT8_CONV2D) {
            qcal_int8_conv2d_params c = d->conv;
            if ((st = weight_qparams(table, d->fqn, c.out_channels, &c.weight_qparams)) != QCAL_OK)
                break;
            c.out_type = ot;
            c.out_qparams = out_q;
            st = qcal_int8_net_add_conv2d(net, &c);
        } else {
            qcal_int8_linear_params l = d->linear;
            if ((st = weight_qparams(table, d->fqn, l.out_features, &l.weight_qparams)) != QCAL_OK)
                break;
            l.out_type = ot;
            l.out_qparams = out_q;
            st = qcal_int8_net_add_linear(net, &l);
        }
        if (st != QCAL_OK) {
            char cause[512];   /* copied: qcal_error must not read the buffer it writes */
            snprintf(cause, sizeof cause, "%s", qcal_last_error());
            st = qcal_error(st, "%s: layer %d (%s): %s", fn, i, d->fqn, cause);
        }
    }
    if (st != QCAL_OK) {
        qcal_int8_net_destroy(&net);
        return st;
    }
    *out = net;
    return QCAL_OK;
}
