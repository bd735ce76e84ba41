/* The QAT model converted to an int8 oneDNN net and evaluated (qat.h: cnn_qat_int8_accuracy). */
#include <stdlib.h>

#include <qcal/int8.h>

#include "qat.h"

/* conv1+ReLU+pool, conv2+ReLU+pool, fc1+ReLU, fc2 (f32 logits); each layer's output codes
 * use the next tap's qparams, the input the CONV1_IN tap's (as examples/demo.c). Activations
 * as quint8 per-tensor qcal_qparams, weights as qint8 per-channel views over q's arrays (the
 * builders refuse non-zero weight zero-points). */
static qcal_status build(const cnn_model *m, const cnn_fq_qparams *q, qcal_int8_net **out)
{
    static const int64_t in_shape[3] = {1, 28, 28};
    qcal_qparams act[CNN_NLAYERS], wq[CNN_NLAYERS];
    qcal_status st = QCAL_OK;
    for (int s = 0; s < CNN_NLAYERS && st == QCAL_OK; s++) {
        int tap = CNN_TAP_CONV1_IN + s;   /* layer s's input tap */
        if ((st = qcal_qparams_per_tensor(&act[s], QCAL_QUINT8, q->act_scale[tap],
                                          q->act_zero_point[tap])) == QCAL_OK)
            st = qcal_qparams_per_channel(&wq[s], QCAL_QINT8, 0, q->weight_channels[s],
                                          q->weight_scale[s], q->weight_zero_point[s]);
    }
    qcal_int8_net *net = NULL;
    if (st == QCAL_OK)
        st = qcal_int8_net_create(NULL, 3, in_shape, &act[0], &net);
    for (int s = 0; s < CNN_NLAYERS && st == QCAL_OK; s++) {
        if (s < 2) {
            qcal_int8_conv2d_params c;
            qcal_int8_conv2d_params_default(&c);
            c.out_channels = s == 0 ? 32 : 64;
            c.kernel_h = c.kernel_w = 3;
            c.pad_h = c.pad_w = 1;
            c.weight = m->param[2 * s];
            c.weight_qparams = &wq[s];
            c.bias = m->param[2 * s + 1];
            c.relu = true;
            c.out_qparams = &act[s + 1];
            st = qcal_int8_net_add_conv2d(net, &c);
            qcal_int8_pool2d_params p;
            qcal_int8_pool2d_params_default(&p);
            if (st == QCAL_OK)
                st = qcal_int8_net_add_maxpool2d(net, &p);
        } else {
            bool f32_out = s == CNN_NLAYERS - 1;
            qcal_int8_linear_params l;
            qcal_int8_linear_params_default(&l);
            l.out_features = s == 2 ? 128 : CNN_CLASSES;
            l.weight = m->param[2 * s];
            l.weight_qparams = &wq[s];
            l.bias = m->param[2 * s + 1];
            l.relu = !f32_out;
            if (f32_out)
                l.out_type = QCAL_INT8_OUT_F32;
            else
                l.out_qparams = &act[s + 1];
            st = qcal_int8_net_add_linear(net, &l);
        }
    }
    if (st != QCAL_OK) {
        qcal_int8_net_destroy(&net);
        return st;
    }
    *out = net;
    return QCAL_OK;
}

qcal_status cnn_qat_int8_accuracy(const cnn_model *m, const cnn_fq_set *set, const cnn_data *test, double *acc)
{
    if (!m || !set || !test || !acc || test->n < 1)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_qat_int8_accuracy: NULL argument or empty test set");
    for (int t = CNN_TAP_CONV1_IN; t < CNN_TAP_LOGITS; t++) {
        if (!set->act[t])
            return qcal_set_error(QCAL_ERR_STATE, "cnn_qat_int8_accuracy: tap %s is not fake-quantized", cnn_tap_name(t));
    }
    cnn_fq_qparams q;
    qcal_status st = cnn_fq_export(set, &q);
    if (st != QCAL_OK)
        return st;
    qcal_int8_net *net = NULL;
    const int64_t chunk = 1000;
    float *x = malloc((size_t)chunk * CNN_IMAGE_PIXELS * sizeof(float));
    float *logits = malloc((size_t)chunk * CNN_CLASSES * sizeof(float));
    st = x && logits ? build(m, &q, &net) : QCAL_ERR_NO_MEMORY;
    int64_t right = 0;
    for (int64_t i0 = 0; st == QCAL_OK && i0 < test->n; i0 += chunk) {
        int64_t bn = test->n - i0 < chunk ? test->n - i0 : chunk;
        for (int64_t k = 0; k < bn * CNN_IMAGE_PIXELS; k++)
            x[k] = ((float)test->images[i0 * CNN_IMAGE_PIXELS + k] / 255.0f - 0.2860f) / 0.3530f;
        if ((st = qcal_int8_net_forward(net, bn, x, logits)) != QCAL_OK)
            break;
        for (int64_t i = 0; i < bn; i++) {
            const float *z = logits + i * CNN_CLASSES;
            int best = 0;
            for (int c = 1; c < CNN_CLASSES; c++)
                if (z[c] > z[best])
                    best = c;
            right += best == test->labels[i0 + i];
        }
    }
    if (st == QCAL_OK)
        *acc = 100.0 * (double)right / (double)test->n;
    qcal_int8_net_destroy(&net);
    cnn_fq_qparams_free(&q);
    free(x);
    free(logits);
    return st;
}
