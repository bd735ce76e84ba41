/* Bias absorption (Nagel et al. 2019, section 4.1.1): after equalization a channel of l1 may
 * carry a large bias that widens the activation range. For l1 -> ReLU -> l2 with l1's
 * pre-activation channel i ~ N(beta_i, gamma_i^2), c_i = max(0, beta_i - n_sigma |gamma_i|)
 * is (almost surely) below every value, so relu(x - c) = relu(x) - c and
 * l2(relu(x)) = l2(relu(x - c)) + W2 c: c moves from l1's bias into l2's. */
#include <math.h>
#include <string.h>

#include "ptq/ptq_internal.h"

qcal_status qcal_ptq_absorb_bias(qcal_ptq_layer *l1, qcal_ptq_layer *l2, const float *beta, const float *gamma,
                                 float n_sigma, float *absorbed)
{
    static const char fn[] = "qcal_ptq_absorb_bias";
    qcal_status st = ptq_pair_check(fn, l1, l2);
    if (st != QCAL_OK)
        return st;
    int64_t n = l1->out_channels;
    if (!l1->bias || !l2->bias || !beta || !gamma)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: both biases, beta and gamma are needed", fn);
    if (!(n_sigma >= 0.0f) || !isfinite(n_sigma))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: n_sigma %g is not a finite value >= 0", fn, (double)n_sigma);
    float *c = malloc((size_t)n * sizeof *c);
    if (!c)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(beta[i]) || !isfinite(gamma[i])) {
            free(c);
            return qcal_error(QCAL_ERR_NONFINITE, "%s: channel %lld: beta %g, gamma %g", fn, (long long)i,
                              (double)beta[i], (double)gamma[i]);
        }
        c[i] = fmaxf(0.0f, beta[i] - n_sigma * fabsf(gamma[i]));
    }
    int64_t cin = l2->in_channels / l2->groups, cout = l2->out_channels / l2->groups;
    for (int64_t o = 0; o < l2->out_channels; o++) {
        int64_t base = o / cout * cin;
        double acc = 0.0;   // fixed order: c, then k
        for (int64_t ci = 0; ci < cin; ci++) {
            const float *w = l2->weight + (o * cin + ci) * l2->kernel;
            for (int64_t k = 0; k < l2->kernel; k++)
                acc += (double)w[k] * c[base + ci];
        }
        l2->bias[o] = (float)((double)l2->bias[o] + acc);
    }
    for (int64_t i = 0; i < n; i++)
        l1->bias[i] -= c[i];
    if (absorbed)
        memcpy(absorbed, c, (size_t)n * sizeof *c);
    free(c);
    return QCAL_OK;
}
