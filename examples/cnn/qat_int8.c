/* The QAT model converted to an int8 oneDNN net and evaluated (qat.h: cnn_qat_int8_accuracy). */
#include <stdlib.h>

#include <qcal/int8.h>

#include "qat.h"

/* conv1+ReLU+pool, conv2+ReLU+pool, fc1+ReLU, fc2 (f32 logits); each layer's output codes
 * use the next tap's qparams, the input the CONV1_IN tap's (as examples/demo.c). */
static qcal_status build(const cnn_model *m, const cnn_fq_qparams *q, qcal_int8_net **out)
{
    static const int64_t in_shape[3] = {1, 28, 28};
    qcal_int8_net *net = NULL;
    qcal_status st = qcal_int8_net_create(NULL, 3, in_shape, q->act_scale[CNN_TAP_CONV1_IN],
                                          q->act_zero_point[CNN_TAP_CONV1_IN], &net);
    for (int s = 0; s < CNN_NLAYERS && st == QCAL_OK; s++) {
        if (s < 2) {
            qcal_int8_conv2d_params c;
            qcal_int8_conv2d_params_default(&c);
            c.out_channels = s == 0 ? 32 : 64;
            c.kernel_h = c.kernel_w = 3;
            c.pad_h = c.pad_w = 1;
            c.weight = m->param[2 * s];
            c.weight_scale = q->weight_scale[s];
            c.bias = m->param[2 * s + 1];
            c.relu = true;
            c.out_scale = q->act_scale[s + 1];
            c.out_zero_point = q->act_zero_point[s + 1];
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
            l.weight_scale = q->weight_scale[s];
            l.bias = m->param[2 * s + 1];
            l.relu = !f32_out;
            if (f32_out) {
                l.out_type = QCAL_INT8_OUT_F32;
            } else {
                l.out_scale = q->act_scale[s + 1];
                l.out_zero_point = q->act_zero_point[s + 1];
            }
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
