/* The int32 biases of the Q/DQ plan (ort, onnx/qdq_shared.h): scale = input scale x weight scale per
 * channel, zero-point 0; a lazy weight's biases are computed after it, by the save's pass. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"
#include "qcal/quantize.h"

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
qcal_status qdq_bias_run(plan *p, lazy_b *l)
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
qcal_status qdq_lazy_job(plan *p, int64_t k)
{
    qcal_status st = qdq_lazy_run(p, &p->lw[k]);
    for (int64_t i = 0; st == QCAL_OK && i < p->nlb; i++)
        if (p->lb[i].b >= 0 && p->lb[i].lw == k)
            st = qdq_bias_run(p, &p->lb[i]);
    return st;
}

/* Lazy weights' biases are quantized by the save's pass when the input scale keeps
 * every s_in * s_w positive and finite whatever the weight: s_w lies in [FLT_EPSILON,
 * FLT_MAX / 127.5] (symmetric qint8: amax / 127.5, at least eps). */
#define BIAS_LAZY_MIN_S_IN 1e-30f
#define BIAS_LAZY_MAX_S_IN 127.0f

/* int32 bias (ort) of the weight p->w[wi]: scale[c] = s_in * s_w[c], zero-point 0. *out -1
 * and *why set to keep it float. With a lazy weight the bias is planned by size and is lazy
 * too (lazy_b: quantized after the weight, qdq_bias_run), or the weight is observed now (an
 * input scale outside the bounds above). */
qcal_status qdq_plan_bias(plan *p, int64_t t, float s_in, int64_t wi, int64_t out_channels,
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
        qcal_status st = qdq_lazy_job(p, w->lazy);
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
    if (st == QCAL_OK && w->lazy >= 0 && !qdq_push_rec((void **)&p->lb, &p->nlb, &l, sizeof l))
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
