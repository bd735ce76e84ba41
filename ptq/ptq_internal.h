/* Internal to ptq/: the layer checks every function starts with. */
#ifndef QCAL_PTQ_INTERNAL_H
#define QCAL_PTQ_INTERNAL_H

#include "core/internal.h"
#include "qcal/ptq.h"

/* Checks l's shape fields and weight pointer; *numel (may be NULL) gets its weight count.
 * `fn` names the caller in the message. */
qcal_status ptq_layer_check(const char *fn, const qcal_ptq_layer *l, int64_t *numel);

/* ptq_layer_check of both layers of a pair, and l2 reads the l1->out_channels channels l1
 * writes. */
qcal_status ptq_pair_check(const char *fn, const qcal_ptq_layer *l1, const qcal_ptq_layer *l2);

/* Weights per output channel: (in_channels / groups) * kernel. */
static inline int64_t ptq_row(const qcal_ptq_layer *l)
{
    return l->in_channels / l->groups * l->kernel;
}

#endif
