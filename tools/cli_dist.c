/* The parts of tools/cli_dist.h shared by the MPI and the single-process builds. */
#include <stdlib.h>

#include "cli_dist.h"

bool cli_dist_writer(const cli_dist *d)
{
    return d->rank == 0;
}

typedef struct unit_ref {
    uint64_t w;
    int64_t i;
} unit_ref;

static int by_weight_desc(const void *a, const void *b)
{
    const unit_ref *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i;
}

void cli_dist_assign(const cli_dist *d, const uint64_t *weight, int64_t n, int *owner)
{
    if (d->size <= 1 || n <= 0) {
        for (int64_t i = 0; i < n; i++)
            owner[i] = 0;
        return;
    }
    unit_ref *u = malloc((size_t)n * sizeof *u);
    uint64_t *load = calloc((size_t)d->size, sizeof *load);
    if (!u || !load) {
        /* Out of memory: round robin, still a function of n and size only. */
        for (int64_t i = 0; i < n; i++)
            owner[i] = (int)(i % d->size);
        free(u);
        free(load);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        u[i] = (unit_ref){ weight[i], i };
    qsort(u, (size_t)n, sizeof *u, by_weight_desc);
    for (int64_t k = 0; k < n; k++) {
        int best = 0;
        for (int r = 1; r < d->size; r++)
            if (load[r] < load[best])
                best = r;
        owner[u[k].i] = best;
        load[best] += u[k].w ? u[k].w : 1;
    }
    free(u);
    free(load);
}
