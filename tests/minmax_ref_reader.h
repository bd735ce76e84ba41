/* Reader for tests/data/minmax/observers.txt (written by tests/ref/gen_minmax.py), shared
 * by test_qparams.c and test_observers_minmax.c. Test-only; aborts through cmocka asserts. */
#ifndef QCAL_TESTS_MINMAX_REF_READER_H
#define QCAL_TESTS_MINMAX_REF_READER_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcal/qcal.h"

#define REF_MAX_INPUTS 32
#define REF_MAX_BATCHES 4
#define REF_MAX_CH 8

typedef struct ref_batch {
    int32_t ndim;
    int64_t shape[QCAL_MAX_DIMS];
    int64_t n;
    float *x;
} ref_batch;

typedef struct ref_input {
    char name[32];
    int nb;
    ref_batch b[REF_MAX_BATCHES];
} ref_input;

typedef struct ref_case {
    qcal_observer_kind kind;
    qcal_qconfig q;
    int32_t axis;
    float avgc;
    int input;
    int64_t nch;
    float mn[REF_MAX_CH], mx[REF_MAX_CH], scale[REF_MAX_CH], zpf[REF_MAX_CH];
    int32_t zp[REF_MAX_CH];
    char line[256];   /* short description for failure messages */
} ref_case;

typedef struct ref_data {
    int ninputs;
    ref_input in[REF_MAX_INPUTS];
    int ncases;
    ref_case *cases;
} ref_data;

static inline float ref_hexf(const char *s)
{
    uint32_t u = (uint32_t)strtoul(s, NULL, 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t ref_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Returns 0 on success, -1 if the file cannot be read or is malformed. */
static inline int ref_load(ref_data *d)
{
    const char *dir = getenv("QCAL_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/minmax/observers.txt", dir ? dir : "tests/data");
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    memset(d, 0, sizeof *d);
    int cap = 4096;
    d->cases = calloc((size_t)cap, sizeof *d->cases);
    char tok[64];
    while (fscanf(fp, "%63s", tok) == 1) {
        if (!strcmp(tok, "end"))
            break;
        if (!strcmp(tok, "input")) {
            int id, nb;
            char name[32];
            if (fscanf(fp, "%d %31s %d", &id, name, &nb) != 3 || id != d->ninputs ||
                id >= REF_MAX_INPUTS || nb > REF_MAX_BATCHES)
                goto bad;
            ref_input *in = &d->in[d->ninputs++];
            snprintf(in->name, sizeof in->name, "%s", name);
            in->nb = nb;
            for (int b = 0; b < nb; b++) {
                ref_batch *rb = &in->b[b];
                if (fscanf(fp, "%d", &rb->ndim) != 1)
                    goto bad;
                rb->n = 1;
                for (int k = 0; k < rb->ndim; k++) {
                    long long s;
                    if (fscanf(fp, "%lld", &s) != 1)
                        goto bad;
                    rb->shape[k] = s;
                    rb->n *= s;
                }
                rb->x = malloc((size_t)rb->n * sizeof(float));
                for (int64_t i = 0; i < rb->n; i++) {
                    if (fscanf(fp, "%63s", tok) != 1)
                        goto bad;
                    rb->x[i] = ref_hexf(tok);
                }
            }
        } else if (!strcmp(tok, "case")) {
            if (d->ncases == cap)
                d->cases = realloc(d->cases, (size_t)(cap *= 2) * sizeof *d->cases);
            ref_case *c = &d->cases[d->ncases];
            memset(c, 0, sizeof *c);
            char kind[64], dtype[16], qs[64], avg[16];
            int reduce, custom, axis, input;
            long long qmin, qmax, nch;
            if (fscanf(fp, "%63s %15s %63s %d %d %lld %lld %d %15s %d %lld", kind, dtype, qs,
                       &reduce, &custom, &qmin, &qmax, &axis, avg, &input, &nch) != 11)
                goto bad;
            if (qcal_observer_kind_parse(kind, &c->kind) != QCAL_OK)
                goto bad;
            qcal_qconfig_default(&c->q);
            if (qcal_dtype_parse(dtype, &c->q.dtype) != QCAL_OK ||
                qcal_qscheme_parse(qs, &c->q.qscheme) != QCAL_OK || nch > REF_MAX_CH)
                goto bad;
            c->q.reduce_range = reduce;
            c->q.custom_range = custom;
            if (custom) {
                c->q.quant_min = qmin;
                c->q.quant_max = qmax;
            }
            c->axis = axis;
            c->avgc = ref_hexf(avg);
            c->input = input;
            c->nch = nch;
            snprintf(c->line, sizeof c->line, "%s %s %s reduce=%d custom=[%lld,%lld]/%d axis=%d "
                     "c=%g input=%s", kind, dtype, qs, reduce, qmin, qmax, custom, axis,
                     (double)c->avgc, d->in[input].name);
            bool fz = c->q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
            for (int k = 0; k < nch; k++) {
                char a[16], b[16], s[16], z[16];
                if (fscanf(fp, "%15s %15s %15s %15s", a, b, s, z) != 4)
                    goto bad;
                c->mn[k] = ref_hexf(a);
                c->mx[k] = ref_hexf(b);
                c->scale[k] = ref_hexf(s);
                if (fz)
                    c->zpf[k] = ref_hexf(z);
                else
                    c->zp[k] = (int32_t)strtol(z, NULL, 10);
            }
            d->ncases++;
        } else {
            goto bad;
        }
    }
    fclose(fp);
    return 0;
bad:
    fclose(fp);
    return -1;
}

static inline void ref_free(ref_data *d)
{
    for (int i = 0; i < d->ninputs; i++)
        for (int b = 0; b < d->in[i].nb; b++)
            free(d->in[i].b[b].x);
    free(d->cases);
    memset(d, 0, sizeof *d);
}

/* PyTorch converts round(min_neg / scale) to int32, which overflows for qint32 affine
 * whenever that quotient is below -2^31 (|min| well above max, scale above eps; x86 gives
 * INT32_MIN and zero-point 0); qcal keeps the exact value (see quant/qparams.c). */
static inline bool ref_qint32_overflow_case(const ref_case *c, int k)
{
    return c->q.dtype == QCAL_QINT32 &&
           (c->q.qscheme == QCAL_PER_TENSOR_AFFINE || c->q.qscheme == QCAL_PER_CHANNEL_AFFINE) &&
           nearbyintf(fminf(c->mn[k], 0.0f) / c->scale[k]) < -2147483648.0f;
}

#endif
