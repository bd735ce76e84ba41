/* Cross-layer equalization of two layers through a ReLU (Nagel et al. 2019, section 4.1):
 * relu(x / s) = relu(x) / s for s > 0, so dividing l1's output channel i by s_i and
 * multiplying l2's input channel i by s_i keeps l2(relu(l1(x))); s_i = sqrt(r1_i * r2_i) / r2_i
 * makes both channel ranges sqrt(r1_i * r2_i). */
#include <math.h>
#include <string.h>

#include "ptq/ptq_internal.h"

qcal_status qcal_ptq_equalize_pair(qcal_ptq_layer *l1, qcal_ptq_layer *l2, float *scales)
{
    static const char fn[] = "qcal_ptq_equalize_pair";
    qcal_status st = ptq_pair_check(fn, l1, l2);
    if (st != QCAL_OK)
        return st;
    int64_t n = l1->out_channels;
    float *r1 = malloc((size_t)n * sizeof *r1), *r2 = malloc((size_t)n * sizeof *r2),
          *s = malloc((size_t)n * sizeof *s);
    if (!r1 || !r2 || !s) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto out;
    }
    if ((st = qcal_ptq_channel_ranges(l1, r1)) != QCAL_OK || (st = qcal_ptq_input_ranges(l2, r2)) != QCAL_OK)
        goto out;
    if (l1->bias)
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(l1->bias[i])) {
                st = qcal_error(QCAL_ERR_NONFINITE, "%s: bias of channel %lld is %g", fn, (long long)i,
                                (double)l1->bias[i]);
                goto out;
            }
    for (int64_t i = 0; i < n; i++) {
        // in double: sqrt(r1 * r2) / r2 = sqrt(r1 / r2); 1 when either range is 0
        double v = r1[i] > 0.0f && r2[i] > 0.0f ? sqrt((double)r1[i] / (double)r2[i]) : 1.0;
        s[i] = (float)v;
        if (!(s[i] > 0.0f) || !isfinite(s[i]))
            s[i] = 1.0f;
    }
    int64_t row1 = ptq_row(l1);
    for (int64_t i = 0; i < n; i++) {
        float *w = l1->weight + i * row1;
        for (int64_t j = 0; j < row1; j++)
            w[j] /= s[i];
        if (l1->bias)
            l1->bias[i] /= s[i];
    }
    int64_t cin = l2->in_channels / l2->groups, cout = l2->out_channels / l2->groups;
    for (int64_t o = 0; o < l2->out_channels; o++) {
        int64_t base = o / cout * cin;
        for (int64_t c = 0; c < cin; c++) {
            float *w = l2->weight + (o * cin + c) * l2->kernel;
            for (int64_t k = 0; k < l2->kernel; k++)
                w[k] *= s[base + c];
        }
    }
    if (scales)
        memcpy(scales, s, (size_t)n * sizeof *s);
out:
    free(r1);
    free(r2);
    free(s);
    return st;
}
