/* Int8 execution of conv2d / max-pool / linear nets on oneDNN 2.6 (qcal/int8.h).
 *
 * Per layer, oneDNN 2.6 computes (dev_guide_attributes_quantization, v2.x semantics):
 *   acc[oc]  = sum((src_u8 - src_zp) * wei_s8)                 int32, exact
 *   dst      = post_ops(output_scale[oc] * (acc[oc] + bias[oc]))  f32
 *   dst_u8   = saturate_u8(round_half_even(dst))
 * with the bias added in accumulator units BEFORE the output scale (2.x int8 semantics; 3.x
 * moved the bias after the scales). So:
 *   output_scale[oc] = in_scale * w_scale[oc] / out_scale   (u8 output)
 *                    = in_scale * w_scale[oc]               (f32 output)
 *   bias_acc[oc]     = round_half_even(bias[oc] / (in_scale * w_scale[oc]))   int32
 *                      (or the exact f32 quotient with opt.bias_f32)
 *   post_ops         = [relu] then linear(alpha 1, beta out_zero_point)
 * Both products are formed in double and rounded to float once. The output zero-point is a
 * post-op, after the ReLU, so round(v + zp) = round(v) + zp exactly (zp is an integer and
 * |v| < 2^22 before saturation matters). The source zero-point of a convolution is a oneDNN
 * attribute (its padding then holds the real value 0.0, code zp, as PyTorch's quantized
 * conv); for a linear layer it is folded into the int32 bias exactly:
 *   sum((x - zp) * w) = sum(x * w) - zp * sum(w).
 *
 * Layout: activations are u8 NHWC (4-D) or NC (2-D) between layers; the input is quantized
 * from the caller's NCHW f32 (C == 1: straight into NHWC, which is the same memory; C > 1:
 * into u8 NCHW then a oneDNN reorder). A linear layer after a (C, H, W) activation is a
 * oneDNN inner product on the 4-D NHWC source with 4-D (OC, C, H, W) logical weights, so the
 * flatten order is PyTorch's NCHW one whatever the memory layout. Weights are quantized into
 * plain s8 at add time, then reordered once (first forward) into the layout the primitive
 * chose (dnnl_format_tag_any: VNNI-blocked). Primitives and activation buffers are built per
 * chunk size and cached (opt.cache_entries, LRU). */
#include <float.h>
#include <math.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/int8.h"
#include "qcal_config.h"
#include "int8/weights.h"
#include "observers/minmax_kernels.h"
#include "qcal/quantize.h"
#include "qcal/threads.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

void qcal_int8_net_options_default(qcal_int8_net_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->batch_chunk = 128;
    opt->cache_entries = 4;
    opt->nonfinite_error = false;
    opt->bias_f32 = false;
    opt->chunk_parallel = true;
    opt->weight_split = QCAL_INT8_SPLIT_AUTO;
}


void qcal_int8_conv2d_params_default(qcal_int8_conv2d_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->stride_h = p->stride_w = 1;
    p->out_type = QCAL_INT8_OUT_U8;
}

void qcal_int8_linear_params_default(qcal_int8_linear_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->out_type = QCAL_INT8_OUT_U8;
}

void qcal_int8_pool2d_params_default(qcal_int8_pool2d_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->kernel_h = p->kernel_w = 2;
}

#if QCAL_HAVE_DNNL

#include <oneapi/dnnl/dnnl.h>

/* Whether oneDNN's int8 kernels may use VNNI (vpdpbusd: u8 x s8 products summed exactly in
 * 32 bits). Without it they use vpmaddubsw, which sums two products in a saturating 16-bit
 * lane: 255 * 127 * 2 > 32767. The CPU must have AVX-512 VNNI (with AVX-512 BW/DQ/VL, as
 * oneDNN's avx512_core_vnni) or AVX-VNNI, and DNNL_MAX_CPU_ISA must not cap below them. */
static bool onednn_has_vnni(void)
{
    bool cpu = false;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        const bool avx512_core = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) &&
                                 (b & (1u << 31));
        cpu = avx512_core && (c & (1u << 11));
        unsigned a1, b1, c1, d1;
        if (!cpu && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
            cpu = (a1 & (1u << 4)) != 0;   /* AVX-VNNI */
    }
#endif
    if (!cpu)
        return false;
    /* dnnl_cpu_isa_t is a bit set: avx512_core_vnni carries 0x40, avx2_vnni 0x400;
     * dnnl_cpu_isa_all (0) means no cap. */
    const unsigned eff = (unsigned)dnnl_get_effective_cpu_isa();
    return eff == 0 || (eff & 0x40u) || (eff & 0x400u);
}

/* ---------------------------------------------------------------- structures */

#define QCAL_INT8_MAX_SLOTS 64   /* threads of a chunk-parallel forward */

typedef enum layer_kind { LAYER_CONV = 0, LAYER_POOL = 1, LAYER_LINEAR = 2 } layer_kind;

static const char *layer_kind_name(layer_kind k)
{
    switch (k) {
    case LAYER_CONV: return "conv2d";
    case LAYER_POOL: return "maxpool2d";
    case LAYER_LINEAR: return "linear";
    }
    return "?";
}

/* Per-sample activation shape: ndim 3 = (c, h, w), ndim 1 = (c) with h = w = 1. */
typedef struct act_shape {
    int32_t ndim;
    int64_t c, h, w;
} act_shape;

typedef struct layer {
    layer_kind kind;
    act_shape in, out;
    int64_t kh, kw, sh, sw, ph, pw;
    bool relu;
    qcal_int8_out_type out_type;
    float in_scale, out_scale;
    int32_t in_zp, out_zp;
    int64_t oc;                  /* output channels (conv / linear) */
    int8_t *wq;                  /* plain s8 weights, logical dims below */
    float *w_scale;              /* [oc] */
    float *oscale;               /* [oc] oneDNN output scales */
    void *bias;                  /* [oc] int32 or float, accumulator units; NULL = none */
    bool bias_f32;
    bool split;                  /* wq holds (oc, 2 * K): floor(w/2) then ceil(w/2) against the
                                  * input repeated twice (oneDNN without VNNI) */
    dnnl_memory_desc_t wplain_md;
    dnnl_memory_t wmem;          /* weights in the layout the first plan chose */
    dnnl_memory_t bmem;
} layer;

typedef struct plan {
    int64_t batch;
    int32_t slot;                /* thread slot (chunk-parallel forward), 0 otherwise */
    dnnl_stream_t stream;        /* own stream: slots execute concurrently */
    uint64_t stamp;              /* last use (LRU) */
    int32_t nlayers;
    dnnl_memory_t in_nchw;       /* u8 NCHW input staging (C > 1 only) */
    dnnl_primitive_t in_reorder;
    dnnl_memory_t *act;          /* [nlayers + 1]: act[0] is the quantized input */
    dnnl_primitive_t *prim;      /* [nlayers] */
    dnnl_memory_t *wown;         /* [nlayers] plan-owned weights if the layout differs */
    dnnl_memory_t *alias;        /* [nlayers] 2-D (N, H*W*C) view of a linear layer's NHWC src,
                                  * or a split layer's own source (its input repeated twice) */
    dnnl_memory_t *scratch;      /* [nlayers] user scratchpads (primitives may be shared by the
                                  * primitive cache across slots; their scratchpads are not) */
    char (*impl)[64];            /* [nlayers] implementation names */
    dnnl_memory_t out_plain;     /* NCHW copy of the last activation when its layout differs */
    dnnl_primitive_t out_reorder;
} plan;

struct qcal_int8_net {
    qcal_int8_net_options opt;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    act_shape in;
    float in_scale, in_inv;
    int32_t in_zp;
    act_shape cur;               /* current (last) activation */
    float cur_scale;
    int32_t cur_zp;
    bool closed;                 /* last layer outputs f32: nothing may follow */
    bool split;                  /* conv / linear weights split in halves (weight_split) */
    layer *layers;
    int32_t nlayers, cap;
    plan **plans;
    int32_t nplans, plan_cap;    /* plan_cap = cache_entries * max_slots + 1 */
    int32_t max_slots;           /* threads a chunk-parallel forward may use */
    uint64_t clock;
    uint64_t nonfinite;
    int32_t last_plan;           /* index of the plan used by the last forward, -1 none */
};

/* ---------------------------------------------------------------- errors */

static const char *dnnl_status_name(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success: return "dnnl_success";
    case dnnl_out_of_memory: return "dnnl_out_of_memory";
    case dnnl_invalid_arguments: return "dnnl_invalid_arguments";
    case dnnl_unimplemented: return "dnnl_unimplemented";
    case dnnl_iterator_ends: return "dnnl_iterator_ends";
    case dnnl_runtime_error: return "dnnl_runtime_error";
    case dnnl_not_required: return "dnnl_not_required";
    }
    return "unknown dnnl status";
}

static qcal_status backend_error(const char *call, dnnl_status_t st, const char *what)
{
    return qcal_error(QCAL_ERR_BACKEND, "int8: %s failed for %s: %s (%d)", call, what,
                      dnnl_status_name(st), (int)st);
}

/* Calls fn args; on failure records the error (naming fn and `what`) and jumps to fail. */
#define DNNL_TRY(fn, args)                                          \
    do {                                                            \
        dnnl_status_t st_ = fn args;                                \
        if (st_ != dnnl_success) {                                  \
            rc = backend_error(#fn, st_, what);                     \
            goto fail;                                              \
        }                                                           \
    } while (0)

static bool scale_ok(float s)
{
    return s > 0.0f && isfinite(s) && isfinite(1.0f / s);
}

/* ---------------------------------------------------------------- helpers */

static int64_t shape_numel(const act_shape *s)
{
    return s->c * s->h * s->w;   /* bounded at construction (checked products) */
}

static void act_md(dnnl_memory_desc_t *md, int64_t batch, const act_shape *s,
                   dnnl_data_type_t dt, dnnl_status_t *st)
{
    if (s->ndim == 3) {
        dnnl_dims_t d = {batch, s->c, s->h, s->w};
        *st = dnnl_memory_desc_init_by_tag(md, 4, d, dt, dnnl_nhwc);
    } else {
        dnnl_dims_t d = {batch, s->c};
        *st = dnnl_memory_desc_init_by_tag(md, 2, d, dt, dnnl_nc);
    }
}

/* True when an NHWC activation is laid out exactly as NCHW. */
static bool layout_is_plain(const act_shape *s)
{
    return s->ndim == 1 || s->c == 1 || s->h * s->w == 1;
}

static void layer_free(layer *l)
{
    if (l->wmem)
        dnnl_memory_destroy(l->wmem);
    if (l->bmem)
        dnnl_memory_destroy(l->bmem);
    free(l->wq);
    free(l->w_scale);
    free(l->oscale);
    free(l->bias);
    memset(l, 0, sizeof *l);
}

static void plan_destroy(plan *p)
{
    if (!p)
        return;
    if (p->in_reorder)
        dnnl_primitive_destroy(p->in_reorder);
    if (p->in_nchw)
        dnnl_memory_destroy(p->in_nchw);
    if (p->out_reorder)
        dnnl_primitive_destroy(p->out_reorder);
    if (p->out_plain)
        dnnl_memory_destroy(p->out_plain);
    for (int32_t i = 0; i < p->nlayers; i++) {
        if (p->prim && p->prim[i])
            dnnl_primitive_destroy(p->prim[i]);
        if (p->wown && p->wown[i])
            dnnl_memory_destroy(p->wown[i]);
        if (p->alias && p->alias[i])
            dnnl_memory_destroy(p->alias[i]);
        if (p->scratch && p->scratch[i])
            dnnl_memory_destroy(p->scratch[i]);
    }
    if (p->act)
        for (int32_t i = 0; i <= p->nlayers; i++)
            if (p->act[i])
                dnnl_memory_destroy(p->act[i]);
    free(p->act);
    free(p->prim);
    free(p->wown);
    free(p->alias);
    free(p->scratch);
    free(p->impl);
    if (p->stream)
        dnnl_stream_destroy(p->stream);
    free(p);
}

static void drop_plans(qcal_int8_net *net)
{
    for (int32_t i = 0; i < net->nplans; i++)
        plan_destroy(net->plans[i]);
    net->nplans = 0;
    net->last_plan = -1;
}

/* Runs a one-off reorder src -> dst on the net's stream and waits. */
static qcal_status run_reorder(qcal_int8_net *net, dnnl_memory_t src, dnnl_memory_t dst,
                               const char *what)
{
    qcal_status rc = QCAL_OK;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    const dnnl_memory_desc_t *smd = NULL, *dmd = NULL;
    DNNL_TRY(dnnl_memory_get_memory_desc, (src, &smd));
    DNNL_TRY(dnnl_memory_get_memory_desc, (dst, &dmd));
    DNNL_TRY(dnnl_reorder_primitive_desc_create, (&pd, smd, net->engine, dmd, net->engine, NULL));
    DNNL_TRY(dnnl_primitive_create, (&prim, pd));
    {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
        DNNL_TRY(dnnl_primitive_execute, (prim, net->stream, 2, args));
        DNNL_TRY(dnnl_stream_wait, (net->stream));
    }
fail:
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return rc;
}

/* ---------------------------------------------------------------- create / destroy */

/* A quint8 per-tensor qparams value as (scale, zero-point); name says which in messages.
 * The values themselves are checked by the caller (its messages name the field). */
static qcal_status u8_qparams(const char *fn, const char *name, const qcal_qparams *q,
                              float *scale, int32_t *zp)
{
    if (!q)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    if (q->dtype != QCAL_QUINT8 || qcal_qscheme_is_per_channel(q->qscheme))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is %s %s; activations are quint8 "
                          "per-tensor", fn, name, qcal_dtype_name(q->dtype),
                          qcal_qscheme_name(q->qscheme));
    *scale = q->scale;
    *zp = q->zero_point;
    return QCAL_OK;
}

qcal_status qcal_int8_net_create(const qcal_int8_net_options *opt, int32_t ndim,
                                 const int64_t *input_shape, const qcal_qparams *input,
                                 qcal_int8_net **out)
{
    const char *what = "the int8 net";
    float in_scale = 0.0f;
    int32_t in_zero_point = 0;
    qcal_int8_net_options o;
    if (opt)
        o = *opt;
    else
        qcal_int8_net_options_default(&o);
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: out is NULL");
    if (!input_shape)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: input_shape is NULL");
    qcal_status qs = u8_qparams("int8_net_create", "input qparams", input, &in_scale, &in_zero_point);
    if (qs != QCAL_OK)
        return qs;
    if (ndim != 1 && ndim != 3)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "int8_net_create: input ndim %d must be 1 (F) or 3 (C, H, W)", ndim);
    for (int32_t i = 0; i < ndim; i++)
        if (input_shape[i] < 1)
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "int8_net_create: input_shape[%d] = %lld must be >= 1", i,
                              (long long)input_shape[i]);
    act_shape in = {ndim, input_shape[0], ndim == 3 ? input_shape[1] : 1,
                    ndim == 3 ? input_shape[2] : 1};
    int64_t numel;
    if (!qcal_mul_i64(in.c, in.h, &numel) || !qcal_mul_i64(numel, in.w, &numel) ||
        numel > ((int64_t)1 << 40))
        return qcal_error(QCAL_ERR_OVERFLOW, "int8_net_create: input shape (%lld, %lld, %lld) "
                          "is too large", (long long)in.c, (long long)in.h, (long long)in.w);
    if (!scale_ok(in_scale))
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: input scale %g must be > 0, "
                          "finite and have a finite inverse", (double)in_scale);
    if (in_zero_point < 0 || in_zero_point > 255)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "int8_net_create: input zero-point %d is outside [0, 255]", in_zero_point);
    if (o.batch_chunk < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: batch_chunk %lld must be >= 1",
                          (long long)o.batch_chunk);
    if (o.cache_entries < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: cache_entries %d must be >= 1",
                          o.cache_entries);
    if (o.weight_split != QCAL_INT8_SPLIT_AUTO && o.weight_split != QCAL_INT8_SPLIT_ALWAYS &&
        o.weight_split != QCAL_INT8_SPLIT_NEVER)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_create: weight_split %d is not auto "
                          "(0), always (1) or never (2)", (int)o.weight_split);

    qcal_status rc = QCAL_OK;
    qcal_int8_net *net = qcal_calloc(1, sizeof *net);
    if (!net)
        return QCAL_ERR_NO_MEMORY;
    net->opt = o;
    net->split = o.weight_split == QCAL_INT8_SPLIT_ALWAYS ||
                 (o.weight_split == QCAL_INT8_SPLIT_AUTO && !onednn_has_vnni());
    net->in = in;
    net->cur = in;
    net->in_scale = in_scale;
    net->in_inv = 1.0f / in_scale;
    net->in_zp = in_zero_point;
    net->cur_scale = in_scale;
    net->cur_zp = in_zero_point;
    net->last_plan = -1;
    net->max_slots = 1;
#if QCAL_HAVE_OPENMP
    net->max_slots = qcal_threads_count();
#endif
    net->max_slots = net->max_slots < 1 ? 1 : net->max_slots;
    net->max_slots = net->max_slots > QCAL_INT8_MAX_SLOTS ? QCAL_INT8_MAX_SLOTS : net->max_slots;
    net->plan_cap = o.cache_entries * net->max_slots + 1;
    net->plans = qcal_calloc((size_t)net->plan_cap, sizeof *net->plans);
    if (!net->plans) {
        rc = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    DNNL_TRY(dnnl_engine_create, (&net->engine, dnnl_cpu, 0));
    DNNL_TRY(dnnl_stream_create, (&net->stream, net->engine, dnnl_stream_default_flags));
    *out = net;
    return QCAL_OK;
fail:
    qcal_int8_net_destroy(&net);
    return rc;
}

void qcal_int8_net_destroy(qcal_int8_net **pnet)
{
    if (!pnet || !*pnet)
        return;
    qcal_int8_net *net = *pnet;
    if (net->plans)
        drop_plans(net);
    free(net->plans);
    for (int32_t i = 0; i < net->nlayers; i++)
        layer_free(&net->layers[i]);
    free(net->layers);
    if (net->stream)
        dnnl_stream_destroy(net->stream);
    if (net->engine)
        dnnl_engine_destroy(net->engine);
    free(net);
    *pnet = NULL;
}

/* ---------------------------------------------------------------- adding layers */

static qcal_status check_open(const qcal_int8_net *net, const char *fn)
{
    if (!net)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: net is NULL", fn);
    if (net->closed)
        return qcal_error(QCAL_ERR_STATE, "%s: layer %d outputs f32, nothing may follow it", fn,
                          net->nlayers - 1);
    if (net->nlayers >= (1 << 16))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: too many layers (%d)", fn, net->nlayers);
    return QCAL_OK;
}

static layer *push_layer(qcal_int8_net *net)
{
    if (net->nlayers == net->cap) {
        int32_t cap = net->cap ? net->cap * 2 : 8;
        layer *nl = realloc(net->layers, (size_t)cap * sizeof *nl);
        if (!nl) {
            qcal_error(QCAL_ERR_NO_MEMORY, "int8: cannot grow the layer list to %d", cap);
            return NULL;
        }
        net->layers = nl;
        net->cap = cap;
    }
    layer *l = &net->layers[net->nlayers];
    memset(l, 0, sizeof *l);
    return l;
}

/* Quantizes weights w (oc rows of k values) into l->wq / l->w_scale and derives l->oscale and
 * l->bias. fn names the caller for messages. */
static qcal_status quantize_weights(qcal_int8_net *net, layer *l, const char *fn, int64_t k,
                                    const float *w, const float *w_scale, const float *bias)
{
    const int64_t oc = l->oc;
    int64_t total;
    if (!qcal_mul_i64(oc, k, &total) || total > ((int64_t)1 << 40))
        return qcal_error(QCAL_ERR_OVERFLOW, "%s: %lld x %lld weights are too many", fn,
                          (long long)oc, (long long)k);
    l->wq = qcal_malloc((size_t)total);
    l->w_scale = qcal_malloc((size_t)oc * sizeof(float));
    l->oscale = qcal_malloc((size_t)oc * sizeof(float));
    if (!l->wq || !l->w_scale || !l->oscale)
        return QCAL_ERR_NO_MEMORY;
    qcal_status rc = qcal_int8_weights_quantize(fn, oc, k, w, w_scale, l->wq, l->w_scale);
    if (rc != QCAL_OK)
        return rc;
    for (int64_t o = 0; o < oc; o++) {
        const float s = l->w_scale[o];
        double acc_unit = (double)l->in_scale * (double)s;   /* one accumulator step, real */
        double os = l->out_type == QCAL_INT8_OUT_U8 ? acc_unit / (double)l->out_scale : acc_unit;
        float osf = (float)os;
        if (!(osf > 0.0f) || !isfinite(osf))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: output scale of channel %lld, in_scale %g "
                              "* w_scale %g / out_scale %g = %g, is not a positive finite float",
                              fn, (long long)o, (double)l->in_scale, (double)s,
                              (double)l->out_scale, os);
        l->oscale[o] = osf;
    }

    /* Bias in accumulator units, plus (linear) the source zero-point compensation. */
    const bool fold_zp = l->kind == LAYER_LINEAR && l->in_zp != 0;
    if (!bias && !fold_zp)
        return QCAL_OK;
    l->bias_f32 = net->opt.bias_f32;
    l->bias = qcal_malloc((size_t)oc * 4);
    if (!l->bias)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t o = 0; o < oc; o++) {
        double b = 0.0;
        if (bias) {
            if (!isfinite(bias[o]))
                return qcal_error(QCAL_ERR_NONFINITE, "%s: bias[%lld] = %g is not finite", fn,
                                  (long long)o, (double)bias[o]);
            b = (double)bias[o] / ((double)l->in_scale * (double)l->w_scale[o]);
            if (!l->bias_f32)
                b = nearbyint(b);   /* round half to even, as ideep's s32 bias reorder */
        }
        if (fold_zp) {
            int64_t sum = 0;
            for (int64_t j = 0; j < k; j++)
                sum += l->wq[o * k + j];
            b -= (double)l->in_zp * (double)sum;
        }
        if (l->bias_f32) {
            float bf = (float)b;
            if (!isfinite(bf))
                return qcal_error(QCAL_ERR_INVALID_ARG, "%s: bias of channel %lld is %g accumulator "
                                  "units, beyond float", fn, (long long)o, b);
            ((float *)l->bias)[o] = bf;
        } else {
            if (b < -2147483648.0 || b > 2147483647.0)
                return qcal_error(QCAL_ERR_INVALID_ARG, "%s: bias of channel %lld is %g accumulator "
                                  "units (bias %g / (in_scale %g * w_scale %g)), beyond int32", fn,
                                  (long long)o, b, bias ? (double)bias[o] : 0.0,
                                  (double)l->in_scale, (double)l->w_scale[o]);
            ((int32_t *)l->bias)[o] = (int32_t)b;
        }
    }
    return QCAL_OK;
}

/* A linear layer after a (C, H, W) activation reads the NHWC buffer as (N, H*W*C); its
 * weights, given in PyTorch's NCHW flatten order (c, h, w), are permuted to (h, w, c) so the
 * product is the same as torch.flatten + Linear. */
static qcal_status permute_chw_to_hwc(layer *l)
{
    const int64_t c = l->in.c, hw = l->in.h * l->in.w, k = c * hw;
    int8_t *row = qcal_malloc((size_t)k);
    if (!row)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t o = 0; o < l->oc; o++) {
        int8_t *w = l->wq + o * k;
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t p = 0; p < hw; p++)
                row[p * c + ci] = w[ci * hw + p];
        memcpy(w, row, (size_t)k);
    }
    free(row);
    return QCAL_OK;
}

/* Creates l->wplain_md and l->bmem after the quantities are known. */
/* Splits l's final s8 weights (oc, K), each row contiguous (oihw or oi), into
 * (oc, 2 * K): row o becomes floor(w/2) over K, then ceil(w/2) over K. Both halves lie in
 * [-64, 64], so two u8 x s8 products sum to at most 2 * 255 * 64 = 32640 < 32767 and
 * vpmaddubsw cannot saturate; against the input repeated twice along the reduction
 * (conv: channels c, c; linear: features f, f) the sum is exactly sum(x * w). */
static qcal_status split_weights(layer *l, int64_t k)
{
    int8_t *w2 = qcal_malloc((size_t)l->oc * (size_t)k * 2);
    if (!w2)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t o = 0; o < l->oc; o++) {
        const int8_t *src = l->wq + o * k;
        int8_t *lo = w2 + o * 2 * k, *hi = lo + k;
        for (int64_t j = 0; j < k; j++) {
            const int w = src[j];
            const int a = w >= 0 ? w / 2 : -((-w + 1) / 2);   /* floor(w / 2) */
            lo[j] = (int8_t)a;
            hi[j] = (int8_t)(w - a);
        }
    }
    free(l->wq);
    l->wq = w2;
    l->split = true;
    return QCAL_OK;
}

static qcal_status layer_memories(qcal_int8_net *net, layer *l, const char *what)
{
    qcal_status rc = QCAL_OK;
    const int64_t rep = net->split ? 2 : 1;
    if (net->split) {
        const int64_t k = l->kind == LAYER_CONV ? l->in.c * l->kh * l->kw : shape_numel(&l->in);
        if ((rc = split_weights(l, k)) != QCAL_OK)
            return rc;
    }
    if (l->kind == LAYER_CONV) {
        dnnl_dims_t d = {l->oc, rep * l->in.c, l->kh, l->kw};
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&l->wplain_md, 4, d, dnnl_s8, dnnl_oihw));
    } else {
        dnnl_dims_t d = {l->oc, rep * shape_numel(&l->in)};
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&l->wplain_md, 2, d, dnnl_s8, dnnl_oi));
    }
    if (l->bias) {
        dnnl_memory_desc_t bmd;
        dnnl_dims_t d = {l->oc};
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&bmd, 1, d, l->bias_f32 ? dnnl_f32 : dnnl_s32, dnnl_a));
        DNNL_TRY(dnnl_memory_create, (&l->bmem, &bmd, net->engine, l->bias));
    }
fail:
    return rc;
}

/* Checks a layer's output type and, for u8, its out_qparams into *s / *zp. */
static qcal_status check_out_q(const char *fn, qcal_int8_out_type t, const qcal_qparams *q,
                               float *s_out, int32_t *zp_out)
{
    if (t != QCAL_INT8_OUT_U8 && t != QCAL_INT8_OUT_F32)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: out_type %d is neither u8 (0) nor f32 (1)",
                          fn, (int)t);
    *s_out = 1.0f;
    *zp_out = 0;
    if (t == QCAL_INT8_OUT_U8) {
        float s = 0.0f;
        int32_t zp = 0;
        qcal_status st = u8_qparams(fn, "out_qparams", q, &s, &zp);
        if (st != QCAL_OK)
            return st;
        *s_out = s;
        *zp_out = zp;
        if (!scale_ok(s))
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: out_scale %g must be > 0, finite and have "
                              "a finite inverse", fn, (double)s);
        if (zp < 0 || zp > 255)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: out_zero_point %d is outside [0, 255]",
                              fn, zp);
    }
    return QCAL_OK;
}

/* Commits l (already at net->layers[net->nlayers]) as the new last layer. */
static void commit_layer(qcal_int8_net *net, layer *l)
{
    net->cur = l->out;
    if (l->kind != LAYER_POOL) {
        net->cur_scale = l->out_scale;
        net->cur_zp = l->out_zp;
        net->closed = l->out_type == QCAL_INT8_OUT_F32;
    }
    net->nlayers++;
    drop_plans(net);
}

/* Quantization of a conv/linear layer: its input is the current activation's; a u8
 * output has out_scale / out_zp, a float output (1, 0). */
static void set_layer_q(const qcal_int8_net *net, layer *l, bool relu,
                        qcal_int8_out_type out_type, float out_scale, int32_t out_zp)
{
    l->relu = relu;
    l->out_type = out_type;
    l->in_scale = net->cur_scale;
    l->in_zp = net->cur_zp;
    l->out_scale = out_type == QCAL_INT8_OUT_U8 ? out_scale : 1.0f;
    l->out_zp = out_type == QCAL_INT8_OUT_U8 ? out_zp : 0;
}

/* Ends adding a conv/linear layer: when rc (the weights' preparation) is QCAL_OK, creates
 * its memories and commits it; on any failure frees it and returns the status. */
static qcal_status finish_weighted_layer(qcal_int8_net *net, layer *l, qcal_status rc,
                                         const char *what)
{
    if (rc == QCAL_OK)
        rc = layer_memories(net, l, what);
    if (rc != QCAL_OK) {
        layer_free(l);
        return rc;
    }
    commit_layer(net, l);
    return QCAL_OK;
}

/* The per-channel scales of a layer's weight_qparams (NULL: *scales NULL, observed later):
 * qint8, per-channel, axis 0, one channel per output channel, zero-points 0. The scales
 * themselves are checked when the weights are quantized (int8/weights.c). */
static qcal_status weight_scales_of(const char *fn, const qcal_qparams *q, int64_t oc,
                                    const float **scales)
{
    *scales = NULL;
    if (!q)
        return QCAL_OK;
    if (q->dtype != QCAL_QINT8 || !qcal_qscheme_is_per_channel(q->qscheme) ||
        q->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS || q->axis != 0 ||
        q->channels != oc || !q->scales)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: weight_qparams are %s %s axis %d with %lld "
                          "channels; the layer takes qint8 per-channel axis 0 with %lld", fn,
                          qcal_dtype_name(q->dtype), qcal_qscheme_name(q->qscheme), (int)q->axis,
                          (long long)q->channels, (long long)oc);
    for (int64_t c = 0; q->zero_points && c < oc; c++)
        if (q->zero_points[c] != 0)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s: weight_qparams zero-point[%lld] = %d; "
                              "int8 weights are symmetric (zero-points 0)", fn, (long long)c,
                              (int)q->zero_points[c]);
    *scales = q->scales;
    return QCAL_OK;
}

/* Output size of a window along one axis (floor mode), or -1 if none. */
static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t p)
{
    int64_t span = in + 2 * p - k;
    return span < 0 ? -1 : span / s + 1;
}

qcal_status qcal_int8_net_add_conv2d(qcal_int8_net *net, const qcal_int8_conv2d_params *p)
{
    static const char fn[] = "int8_net_add_conv2d";
    qcal_status rc = check_open(net, fn);
    if (rc != QCAL_OK)
        return rc;
    if (!p || !p->weight)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn, p ? "weight" : "params");
    if (net->cur.ndim != 3)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: the current activation is flat (%lld features); "
                          "conv2d needs (C, H, W)", fn, (long long)net->cur.c);
    if (p->out_channels < 1 || p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 ||
        p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0 || p->out_channels > (1 << 24) ||
        p->kernel_h > (1 << 16) || p->kernel_w > (1 << 16) || p->pad_h > (1 << 16) ||
        p->pad_w > (1 << 16) || p->stride_h > (1 << 16) || p->stride_w > (1 << 16))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: out_channels %lld, kernel %lldx%lld, stride "
                          "%lldx%lld, padding %lldx%lld: need out_channels, kernel, stride >= 1 "
                          "and padding >= 0 (each at most 2^16, channels 2^24)", fn,
                          (long long)p->out_channels, (long long)p->kernel_h,
                          (long long)p->kernel_w, (long long)p->stride_h, (long long)p->stride_w,
                          (long long)p->pad_h, (long long)p->pad_w);
    int64_t oh = window_out(net->cur.h, p->kernel_h, p->stride_h, p->pad_h);
    int64_t ow = window_out(net->cur.w, p->kernel_w, p->stride_w, p->pad_w);
    if (oh < 1 || ow < 1)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: kernel %lldx%lld with padding %lldx%lld does not "
                          "fit the %lldx%lld input", fn, (long long)p->kernel_h,
                          (long long)p->kernel_w, (long long)p->pad_h, (long long)p->pad_w,
                          (long long)net->cur.h, (long long)net->cur.w);
    float out_scale;
    int32_t out_zp;
    rc = check_out_q(fn, p->out_type, p->out_qparams, &out_scale, &out_zp);
    if (rc != QCAL_OK)
        return rc;
    const float *wscale = NULL;
    if ((rc = weight_scales_of(fn, p->weight_qparams, p->out_channels, &wscale)) != QCAL_OK)
        return rc;
    int64_t k, outn;
    if (!qcal_mul_i64(net->cur.c, p->kernel_h * p->kernel_w, &k) ||
        !qcal_mul_i64(p->out_channels, oh * ow, &outn) || outn > ((int64_t)1 << 40))
        return qcal_error(QCAL_ERR_OVERFLOW, "%s: layer sizes overflow", fn);

    layer *l = push_layer(net);
    if (!l)
        return QCAL_ERR_NO_MEMORY;
    l->kind = LAYER_CONV;
    l->in = net->cur;
    l->out = (act_shape){3, p->out_channels, oh, ow};
    l->kh = p->kernel_h;
    l->kw = p->kernel_w;
    l->sh = p->stride_h;
    l->sw = p->stride_w;
    l->ph = p->pad_h;
    l->pw = p->pad_w;
    set_layer_q(net, l, p->relu, p->out_type, out_scale, out_zp);
    l->oc = p->out_channels;
    rc = quantize_weights(net, l, fn, k, p->weight, wscale, p->bias);
    return finish_weighted_layer(net, l, rc, "conv2d weights/bias");
}

qcal_status qcal_int8_net_add_linear(qcal_int8_net *net, const qcal_int8_linear_params *p)
{
    static const char fn[] = "int8_net_add_linear";
    qcal_status rc = check_open(net, fn);
    if (rc != QCAL_OK)
        return rc;
    if (!p || !p->weight)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn, p ? "weight" : "params");
    if (p->out_features < 1 || p->out_features > (1 << 24))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: out_features %lld must be in [1, 2^24]", fn,
                          (long long)p->out_features);
    float out_scale;
    int32_t out_zp;
    rc = check_out_q(fn, p->out_type, p->out_qparams, &out_scale, &out_zp);
    if (rc != QCAL_OK)
        return rc;
    const float *wscale = NULL;
    if ((rc = weight_scales_of(fn, p->weight_qparams, p->out_features, &wscale)) != QCAL_OK)
        return rc;
    layer *l = push_layer(net);
    if (!l)
        return QCAL_ERR_NO_MEMORY;
    l->kind = LAYER_LINEAR;
    l->in = net->cur;
    l->out = (act_shape){1, p->out_features, 1, 1};
    set_layer_q(net, l, p->relu, p->out_type, out_scale, out_zp);
    l->oc = p->out_features;
    rc = quantize_weights(net, l, fn, shape_numel(&net->cur), p->weight, wscale, p->bias);
    if (rc == QCAL_OK && l->in.ndim == 3 && !layout_is_plain(&l->in))
        rc = permute_chw_to_hwc(l);
    return finish_weighted_layer(net, l, rc, "linear weights/bias");
}

qcal_status qcal_int8_net_add_maxpool2d(qcal_int8_net *net, const qcal_int8_pool2d_params *p)
{
    static const char fn[] = "int8_net_add_maxpool2d";
    qcal_status rc = check_open(net, fn);
    if (rc != QCAL_OK)
        return rc;
    if (!p)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: params is NULL", fn);
    if (net->cur.ndim != 3)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: the current activation is flat (%lld features); "
                          "max-pool needs (C, H, W)", fn, (long long)net->cur.c);
    int64_t sh = p->stride_h ? p->stride_h : p->kernel_h;
    int64_t sw = p->stride_w ? p->stride_w : p->kernel_w;
    if (p->kernel_h < 1 || p->kernel_w < 1 || sh < 1 || sw < 1 || p->pad_h < 0 || p->pad_w < 0 ||
        p->kernel_h > (1 << 16) || p->kernel_w > (1 << 16) || sh > (1 << 16) || sw > (1 << 16) ||
        2 * p->pad_h > p->kernel_h || 2 * p->pad_w > p->kernel_w)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: kernel %lldx%lld, stride %lldx%lld, padding "
                          "%lldx%lld: need kernel, stride >= 1 and 0 <= padding <= kernel / 2",
                          fn, (long long)p->kernel_h, (long long)p->kernel_w, (long long)sh,
                          (long long)sw, (long long)p->pad_h, (long long)p->pad_w);
    int64_t oh = window_out(net->cur.h, p->kernel_h, sh, p->pad_h);
    int64_t ow = window_out(net->cur.w, p->kernel_w, sw, p->pad_w);
    if (oh < 1 || ow < 1)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: kernel %lldx%lld does not fit the %lldx%lld "
                          "input", fn, (long long)p->kernel_h, (long long)p->kernel_w,
                          (long long)net->cur.h, (long long)net->cur.w);
    layer *l = push_layer(net);
    if (!l)
        return QCAL_ERR_NO_MEMORY;
    l->kind = LAYER_POOL;
    l->in = net->cur;
    l->out = (act_shape){3, net->cur.c, oh, ow};
    l->kh = p->kernel_h;
    l->kw = p->kernel_w;
    l->sh = sh;
    l->sw = sw;
    l->ph = p->pad_h;
    l->pw = p->pad_w;
    l->out_type = QCAL_INT8_OUT_U8;
    l->in_scale = l->out_scale = net->cur_scale;
    l->in_zp = l->out_zp = net->cur_zp;
    commit_layer(net, l);
    return QCAL_OK;
}

qcal_status qcal_int8_net_add_relu(qcal_int8_net *net)
{
    static const char fn[] = "int8_net_add_relu";
    qcal_status rc = check_open(net, fn);
    if (rc != QCAL_OK)
        return rc;
    /* relu(maxpool(q)) = maxpool(relu(q)) (both monotone, same codes), and on the producer's
     * output max(round(v) + zp, zp) = round(max(v, 0)) + zp, saturation included: fusing the
     * ReLU into the conv / linear that produced the activation is exact. */
    int32_t i = net->nlayers - 1;
    while (i >= 0 && net->layers[i].kind == LAYER_POOL)
        i--;
    if (i < 0)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "%s: a ReLU needs a conv2d or linear layer before "
                          "it to fuse into (the net input is quantized as given)", fn);
    if (!net->layers[i].relu) {
        net->layers[i].relu = true;
        drop_plans(net);
    }
    return QCAL_OK;
}

/* ---------------------------------------------------------------- queries */

qcal_status qcal_int8_net_layers(const qcal_int8_net *net, int32_t *n)
{
    if (!net || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_layers: %s is NULL", net ? "n" : "net");
    *n = net->nlayers;
    return QCAL_OK;
}

qcal_status qcal_int8_net_output_shape(const qcal_int8_net *net, int32_t *ndim, int64_t *shape)
{
    if (!net || !ndim || !shape)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_output_shape: %s is NULL",
                          !net ? "net" : !ndim ? "ndim" : "shape");
    *ndim = net->cur.ndim;
    shape[0] = net->cur.c;
    if (net->cur.ndim == 3) {
        shape[1] = net->cur.h;
        shape[2] = net->cur.w;
    }
    return QCAL_OK;
}

qcal_status qcal_int8_net_weight_scales(const qcal_int8_net *net, int32_t layer_index,
                                        int64_t cap, float *scales, int64_t *n)
{
    static const char fn[] = "int8_net_weight_scales";
    if (!net || !scales || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                          !net ? "net" : !scales ? "scales" : "n");
    if (layer_index < 0 || layer_index >= net->nlayers)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer %d is outside [0, %d)", fn, layer_index,
                          net->nlayers);
    const layer *l = &net->layers[layer_index];
    if (l->kind == LAYER_POOL)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer %d is a max-pool (no weights)", fn,
                          layer_index);
    if (cap < l->oc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: capacity %lld < %lld channels of layer %d",
                          fn, (long long)cap, (long long)l->oc, layer_index);
    memcpy(scales, l->w_scale, (size_t)l->oc * sizeof(float));
    *n = l->oc;
    return QCAL_OK;
}

qcal_status qcal_int8_net_nonfinite(const qcal_int8_net *net, uint64_t *count)
{
    if (!net || !count)
        return qcal_error(QCAL_ERR_INVALID_ARG, "int8_net_nonfinite: %s is NULL",
                          net ? "count" : "net");
    *count = net->nonfinite;
    return QCAL_OK;
}

qcal_status qcal_int8_net_impl(const qcal_int8_net *net, int32_t layer_index, const char **name)
{
    static const char fn[] = "int8_net_impl";
    if (!net || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn, net ? "name" : "net");
    if (layer_index < 0 || layer_index >= net->nlayers)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: layer %d is outside [0, %d)", fn, layer_index,
                          net->nlayers);
    if (net->last_plan < 0)
        return qcal_error(QCAL_ERR_STATE, "%s: no forward call yet, primitives are not built", fn);
    *name = net->plans[net->last_plan]->impl[layer_index];
    return QCAL_OK;
}

/* ---------------------------------------------------------------- plans */

/* Builds the attributes of a conv / linear layer: output scales, source zero-point (conv),
 * ReLU and output zero-point post-ops. */
static qcal_status layer_attr(const layer *l, dnnl_primitive_attr_t *out, const char *what)
{
    qcal_status rc = QCAL_OK;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    DNNL_TRY(dnnl_primitive_attr_create, (&attr));
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode, (attr, dnnl_scratchpad_mode_user));
    /* mask bit 1: one scale per index of dimension 1 (channels) of dst (n, c[, h, w]). */
    DNNL_TRY(dnnl_primitive_attr_set_output_scales, (attr, l->oc, 1 << 1, l->oscale));
    if (l->kind == LAYER_CONV && l->in_zp != 0)
        DNNL_TRY(dnnl_primitive_attr_set_zero_points, (attr, DNNL_ARG_SRC, 1, 0, &l->in_zp));
    if (l->relu || l->out_zp != 0) {
        DNNL_TRY(dnnl_post_ops_create, (&po));
        if (l->relu)
            DNNL_TRY(dnnl_post_ops_append_eltwise, (po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
        if (l->out_zp != 0)
            DNNL_TRY(dnnl_post_ops_append_eltwise, (po, 1.0f, dnnl_eltwise_linear, 1.0f,
                                                    (float)l->out_zp));
        DNNL_TRY(dnnl_primitive_attr_set_post_ops, (attr, po));
    }
    if (po)
        dnnl_post_ops_destroy(po);
    *out = attr;
    return QCAL_OK;
fail:
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

static qcal_status build_layer(qcal_int8_net *net, plan *pl, int32_t i, int64_t batch)
{
    layer *l = &net->layers[i];
    char what[96];
    snprintf(what, sizeof what, "layer %d (%s), batch %lld", i, layer_kind_name(l->kind),
             (long long)batch);
    qcal_status rc = QCAL_OK;
    dnnl_status_t st;
    dnnl_memory_desc_t src_md, dst_md, wany_md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_t wplain = NULL;

    const int64_t rep = l->split ? 2 : 1;
    if (l->kind == LAYER_LINEAR) {
        act_shape flat = {1, rep * shape_numel(&l->in), 1, 1};
        act_md(&src_md, batch, &flat, dnnl_u8, &st);
    } else {
        act_shape in = l->in;
        in.c *= rep;
        act_md(&src_md, batch, &in, dnnl_u8, &st);
    }
    if (st == dnnl_success)
        act_md(&dst_md, batch, &l->out, l->out_type == QCAL_INT8_OUT_F32 ? dnnl_f32 : dnnl_u8, &st);
    if (st != dnnl_success)
        return backend_error("dnnl_memory_desc_init_by_tag", st, what);

    if (l->kind == LAYER_POOL) {
        dnnl_pooling_v2_desc_t d;
        dnnl_dims_t strides = {l->sh, l->sw}, kernel = {l->kh, l->kw}, dil = {0, 0};
        dnnl_dims_t pad = {l->ph, l->pw};
        DNNL_TRY(dnnl_pooling_v2_forward_desc_init, (&d, dnnl_forward_inference, dnnl_pooling_max,
                                                     &src_md, &dst_md, strides, kernel, dil,
                                                     pad, pad));
        DNNL_TRY(dnnl_primitive_attr_create, (&attr));
        DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode, (attr, dnnl_scratchpad_mode_user));
        DNNL_TRY(dnnl_primitive_desc_create, (&pd, &d, attr, net->engine, NULL));
    } else {
        rc = layer_attr(l, &attr, what);
        if (rc != QCAL_OK)
            goto fail;
        dnnl_memory_desc_t bmd;
        const dnnl_memory_desc_t *bmd_ptr = NULL;
        if (l->bmem) {
            const dnnl_memory_desc_t *q = NULL;
            DNNL_TRY(dnnl_memory_get_memory_desc, (l->bmem, &q));
            bmd = *q;
            bmd_ptr = &bmd;
        }
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&wany_md, l->wplain_md.ndims, l->wplain_md.dims,
                                                dnnl_s8, dnnl_format_tag_any));
        if (l->kind == LAYER_CONV) {
            dnnl_convolution_desc_t d;
            dnnl_dims_t strides = {l->sh, l->sw}, pad = {l->ph, l->pw};
            DNNL_TRY(dnnl_convolution_forward_desc_init, (&d, dnnl_forward_inference,
                                                          dnnl_convolution_direct, &src_md,
                                                          &wany_md, bmd_ptr, &dst_md, strides,
                                                          pad, pad));
            DNNL_TRY(dnnl_primitive_desc_create, (&pd, &d, attr, net->engine, NULL));
        } else {
            dnnl_inner_product_desc_t d;
            DNNL_TRY(dnnl_inner_product_forward_desc_init, (&d, dnnl_forward_inference, &src_md,
                                                            &wany_md, bmd_ptr, &dst_md));
            DNNL_TRY(dnnl_primitive_desc_create, (&pd, &d, attr, net->engine, NULL));
        }
        /* Weights: reorder the plain s8 copy into the chosen layout, once per layout. */
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        if (!wmd) {
            rc = qcal_error(QCAL_ERR_BACKEND, "int8: no weights descriptor for %s", what);
            goto fail;
        }
        const dnnl_memory_desc_t *have = NULL;
        if (l->wmem)
            DNNL_TRY(dnnl_memory_get_memory_desc, (l->wmem, &have));
        if (!l->wmem || !dnnl_memory_desc_equal(have, wmd)) {
            dnnl_memory_t *slot = l->wmem ? &pl->wown[i] : &l->wmem;
            DNNL_TRY(dnnl_memory_create, (&wplain, &l->wplain_md, net->engine, l->wq));
            DNNL_TRY(dnnl_memory_create, (slot, wmd, net->engine, DNNL_MEMORY_ALLOCATE));
            rc = run_reorder(net, wplain, *slot, what);
            if (rc != QCAL_OK)
                goto fail;
        }
    }
    const char *impl = NULL;
    DNNL_TRY(dnnl_primitive_desc_query, (pd, dnnl_query_impl_info_str, 0, &impl));
    snprintf(pl->impl[i], sizeof pl->impl[i], "%s%s", impl ? impl : "?", l->split ? " split" : "");
    DNNL_TRY(dnnl_primitive_create, (&pl->prim[i], pd));
    DNNL_TRY(dnnl_memory_create, (&pl->act[i + 1], &dst_md, net->engine, DNNL_MEMORY_ALLOCATE));
    {
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        if (smd && dnnl_memory_desc_get_size(smd) > 0)
            DNNL_TRY(dnnl_memory_create, (&pl->scratch[i], smd, net->engine, DNNL_MEMORY_ALLOCATE));
    }
    if (l->split) {
        /* The layer's own source: its input repeated twice, filled by run_chunk. */
        DNNL_TRY(dnnl_memory_create, (&pl->alias[i], &src_md, net->engine, DNNL_MEMORY_ALLOCATE));
    } else if (l->kind == LAYER_LINEAR && l->in.ndim == 3) {
        /* The NHWC activation read as (N, H*W*C): same bytes, 2-D view. */
        void *h = NULL;
        DNNL_TRY(dnnl_memory_get_data_handle, (pl->act[i], &h));
        DNNL_TRY(dnnl_memory_create, (&pl->alias[i], &src_md, net->engine, h));
    }
fail:
    if (wplain)
        dnnl_memory_destroy(wplain);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return rc;
}

static qcal_status build_plan(qcal_int8_net *net, int64_t batch, plan **out)
{
    char what[64];
    snprintf(what, sizeof what, "the input, batch %lld", (long long)batch);
    qcal_status rc = QCAL_OK;
    dnnl_status_t st;
    dnnl_primitive_desc_t pd = NULL;
    const int32_t nl = net->nlayers;
    plan *pl = qcal_calloc(1, sizeof *pl);
    if (!pl)
        return QCAL_ERR_NO_MEMORY;
    pl->batch = batch;
    pl->nlayers = nl;
    pl->act = qcal_calloc((size_t)nl + 1, sizeof *pl->act);
    pl->prim = qcal_calloc((size_t)nl + 1, sizeof *pl->prim);
    pl->wown = qcal_calloc((size_t)nl + 1, sizeof *pl->wown);
    pl->impl = qcal_calloc((size_t)nl + 1, sizeof *pl->impl);
    pl->alias = qcal_calloc((size_t)nl + 1, sizeof *pl->alias);
    pl->scratch = qcal_calloc((size_t)nl + 1, sizeof *pl->scratch);
    if (!pl->act || !pl->prim || !pl->wown || !pl->impl || !pl->alias || !pl->scratch) {
        rc = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    DNNL_TRY(dnnl_stream_create, (&pl->stream, net->engine, dnnl_stream_default_flags));
    dnnl_memory_desc_t in_md;
    act_md(&in_md, batch, &net->in, dnnl_u8, &st);
    if (st != dnnl_success) {
        rc = backend_error("dnnl_memory_desc_init_by_tag", st, what);
        goto fail;
    }
    DNNL_TRY(dnnl_memory_create, (&pl->act[0], &in_md, net->engine, DNNL_MEMORY_ALLOCATE));
    if (!layout_is_plain(&net->in)) {
        dnnl_memory_desc_t nchw;
        dnnl_dims_t d = {batch, net->in.c, net->in.h, net->in.w};
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&nchw, 4, d, dnnl_u8, dnnl_nchw));
        DNNL_TRY(dnnl_memory_create, (&pl->in_nchw, &nchw, net->engine, DNNL_MEMORY_ALLOCATE));
        DNNL_TRY(dnnl_reorder_primitive_desc_create, (&pd, &nchw, net->engine, &in_md, net->engine, NULL));
        DNNL_TRY(dnnl_primitive_create, (&pl->in_reorder, pd));
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    for (int32_t i = 0; i < nl; i++) {
        rc = build_layer(net, pl, i, batch);
        if (rc != QCAL_OK)
            goto fail;
    }
    if (!layout_is_plain(&net->cur)) {
        snprintf(what, sizeof what, "the output, batch %lld", (long long)batch);
        const dnnl_memory_desc_t *last = NULL;
        DNNL_TRY(dnnl_memory_get_memory_desc, (pl->act[nl], &last));
        dnnl_memory_desc_t nchw;
        dnnl_dims_t d = {batch, net->cur.c, net->cur.h, net->cur.w};
        DNNL_TRY(dnnl_memory_desc_init_by_tag, (&nchw, 4, d, last->data_type, dnnl_nchw));
        DNNL_TRY(dnnl_memory_create, (&pl->out_plain, &nchw, net->engine, DNNL_MEMORY_ALLOCATE));
        DNNL_TRY(dnnl_reorder_primitive_desc_create, (&pd, last, net->engine, &nchw, net->engine, NULL));
        DNNL_TRY(dnnl_primitive_create, (&pl->out_reorder, pd));
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    *out = pl;
    return QCAL_OK;
fail:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    plan_destroy(pl);
    return rc;
}

/* Index of the cached plan for (batch, slot), or -1. */
static int32_t find_plan(const qcal_int8_net *net, int64_t batch, int32_t slot)
{
    for (int32_t i = 0; i < net->nplans; i++)
        if (net->plans[i]->batch == batch && net->plans[i]->slot == slot)
            return i;
    return -1;
}

/* Returns the cached plan index for (batch, slot), building it (and evicting the least
 * recently used one when the cache is full) if needed. */
static qcal_status get_plan(qcal_int8_net *net, int64_t batch, int32_t slot, int32_t *index)
{
    int32_t i = find_plan(net, batch, slot);
    if (i >= 0) {
        net->plans[i]->stamp = ++net->clock;
        *index = i;
        return QCAL_OK;
    }
    plan *pl = NULL;
    qcal_status rc = build_plan(net, batch, &pl);
    if (rc != QCAL_OK)
        return rc;
    pl->slot = slot;
    int32_t at = net->nplans;
    if (net->nplans == net->plan_cap) {
        at = 0;
        for (int32_t j = 1; j < net->nplans; j++)
            if (net->plans[j]->stamp < net->plans[at]->stamp)
                at = j;
        plan_destroy(net->plans[at]);
        if (net->last_plan == at)
            net->last_plan = -1;
    } else {
        net->nplans++;
    }
    net->plans[at] = pl;
    pl->stamp = ++net->clock;
    *index = at;
    return QCAL_OK;
}

/* ---------------------------------------------------------------- forward */

static qcal_status exec(const plan *pl, dnnl_primitive_t prim, int nargs,
                        const dnnl_exec_arg_t *args, const char *what)
{
    dnnl_status_t st = dnnl_primitive_execute(prim, pl->stream, nargs, args);
    if (st != dnnl_success)
        return backend_error("dnnl_primitive_execute", st, what);
    return QCAL_OK;
}

static qcal_status get_ptr(dnnl_memory_t m, void **ptr, const char *what)
{
    dnnl_status_t st = dnnl_memory_get_data_handle(m, ptr);
    if (st != dnnl_success)
        return backend_error("dnnl_memory_get_data_handle", st, what);
    return QCAL_OK;
}

static bool last_is_f32(const qcal_int8_net *net)
{
    return net->nlayers > 0 && net->layers[net->nlayers - 1].out_type == QCAL_INT8_OUT_F32;
}

/* Fills split layer i's source (pl->alias[i]) from its input act[i] (u8 NHWC or (N, F)):
 * conv: each pixel's C channels twice; linear: each sample's features twice. */
static qcal_status repeat_source(const plan *pl, int32_t i, const layer *l, int64_t b)
{
    void *from = NULL, *to = NULL;
    qcal_status rc;
    if ((rc = get_ptr(pl->act[i], &from, "a split layer's input")) != QCAL_OK ||
        (rc = get_ptr(pl->alias[i], &to, "a split layer's source")) != QCAL_OK)
        return rc;
    const int64_t run = l->kind == LAYER_CONV ? l->in.c : shape_numel(&l->in);
    const int64_t runs = l->kind == LAYER_CONV ? b * l->in.h * l->in.w : b;
    const uint8_t *s = from;
    uint8_t *d = to;
    for (int64_t r = 0; r < runs; r++, s += run, d += 2 * run) {
        memcpy(d, s, (size_t)run);
        memcpy(d + run, s, (size_t)run);
    }
    return QCAL_OK;
}

/* Runs b samples (src, caller's NCHW f32) through plan pl and writes the output rows to dst
 * (u8 codes, f32 output, or dequantized codes). Touches only pl's buffers and stream, so
 * different plans run concurrently. *nonfinite gets the count of non-finite inputs. */
static qcal_status run_chunk(const qcal_int8_net *net, const plan *pl, const float *src,
                             int64_t b, void *dst, bool u8, uint64_t *nonfinite)
{
    qcal_status rc;
    const int64_t in_numel = shape_numel(&net->in) * b;
    void *qbuf = NULL;
    rc = get_ptr(pl->in_nchw ? pl->in_nchw : pl->act[0], &qbuf, "the input buffer");
    if (rc != QCAL_OK)
        return rc;
    /* The shared min/max kernel counts the chunk's non-finite inputs (and brings it into
     * cache), then the library's quantize (qcal/quantize.h: round half to even, NaN -> zp,
     * +-Inf saturate) reads it from there. */
    float mn, mx;
    *nonfinite = 0;
    if (!net->opt.nonfinite_error)   /* else forward() rejected any before this */
        qcal_f32_minmax(src, in_numel, &mn, &mx, nonfinite);
    qcal_tensor t;
    qcal_qparams qp;
    const int64_t dims[1] = {in_numel};
    if ((rc = qcal_tensor_init(&t, src, 1, dims)) != QCAL_OK ||
        (rc = qcal_qparams_per_tensor(&qp, QCAL_QUINT8, net->in_scale, net->in_zp)) != QCAL_OK ||
        (rc = qcal_quantize(&t, &qp, qbuf)) != QCAL_OK)
        return rc;
    if (pl->in_reorder) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, pl->in_nchw}, {DNNL_ARG_TO, pl->act[0]}};
        if ((rc = exec(pl, pl->in_reorder, 2, args, "the input reorder")) != QCAL_OK)
            return rc;
    }
    for (int32_t i = 0; i < pl->nlayers; i++) {
        const layer *l = &net->layers[i];
        dnnl_exec_arg_t args[5];
        int n = 0;
        if (l->split && (rc = repeat_source(pl, i, l, b)) != QCAL_OK)
            return rc;
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, pl->alias[i] ? pl->alias[i] : pl->act[i]};
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, pl->act[i + 1]};
        if (l->kind != LAYER_POOL) {
            args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, pl->wown[i] ? pl->wown[i] : l->wmem};
            if (l->bmem)
                args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, l->bmem};
        }
        if (pl->scratch[i])
            args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, pl->scratch[i]};
        if ((rc = exec(pl, pl->prim[i], n, args, pl->impl[i])) != QCAL_OK)
            return rc;
    }
    dnnl_memory_t last = pl->act[pl->nlayers];
    if (pl->out_reorder) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, last}, {DNNL_ARG_TO, pl->out_plain}};
        if ((rc = exec(pl, pl->out_reorder, 2, args, "the output reorder")) != QCAL_OK)
            return rc;
        last = pl->out_plain;
    }
    dnnl_status_t st = dnnl_stream_wait(pl->stream);
    if (st != dnnl_success)
        return backend_error("dnnl_stream_wait", st, "the forward pass");
    void *out = NULL;
    if ((rc = get_ptr(last, &out, "the output buffer")) != QCAL_OK)
        return rc;
    const int64_t cnt = b * shape_numel(&net->cur);
    if (u8) {
        memcpy(dst, out, (size_t)cnt);
    } else if (last_is_f32(net)) {
        memcpy(dst, out, (size_t)cnt * sizeof(float));
    } else {
        /* Dequantize as PyTorch: (float)(q - zp) * scale. */
        const uint8_t *q = out;
        float *d = dst;
        const float s = net->cur_scale;
        const int32_t zp = net->cur_zp;
        for (int64_t j = 0; j < cnt; j++)
            d[j] = (float)((int32_t)q[j] - zp) * s;
    }
    return QCAL_OK;
}

static qcal_status forward(qcal_int8_net *net, int64_t n, const float *src, void *dst, bool u8,
                           const char *fn)
{
    if (!net || !src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", fn,
                          !net ? "net" : !src ? "src" : "dst");
    if (n < 1)
        return qcal_error(n == 0 ? QCAL_ERR_EMPTY : QCAL_ERR_INVALID_ARG,
                          "%s: batch n = %lld must be >= 1", fn, (long long)n);
    if (u8 && last_is_f32(net))
        return qcal_error(QCAL_ERR_STATE, "%s: the last layer outputs f32; use "
                          "qcal_int8_net_forward", fn);
    const int64_t in_per = shape_numel(&net->in), out_per = shape_numel(&net->cur);
    int64_t tot;
    if (!qcal_mul_i64(n, in_per, &tot) || !qcal_mul_i64(n, out_per, &tot) ||
        !qcal_mul_i64(tot, 4, &tot))
        return qcal_error(QCAL_ERR_OVERFLOW, "%s: %lld samples overflow the buffer sizes", fn,
                          (long long)n);
    const size_t out_elem = u8 ? 1 : sizeof(float);
    const int64_t chunk = net->opt.batch_chunk;
    if (net->opt.nonfinite_error) {
        /* Scan first so dst stays untouched on failure. */
        for (int64_t i = 0; i < n * in_per; i++)
            if (!isfinite(src[i]))
                return qcal_error(QCAL_ERR_NONFINITE, "%s: input element %lld (sample %lld) is "
                                  "%g", fn, (long long)i, (long long)(i / in_per), (double)src[i]);
    }
    const int64_t nfull = n / chunk, tail = n % chunk;
    int32_t slots = 1;
#if QCAL_HAVE_OPENMP
    if (net->opt.chunk_parallel && nfull >= 2) {
        slots = qcal_threads_count();
        slots = slots > net->max_slots ? net->max_slots : slots;
        slots = (int64_t)slots > nfull ? (int32_t)nfull : slots;
        slots = slots < 1 ? 1 : slots;
    }
#endif
    /* Build every plan needed before writing anything (the cache holds them all). */
    qcal_status rc;
    int32_t idx;
    for (int32_t t = 0; t < slots && nfull > 0; t++)
        if ((rc = get_plan(net, chunk, t, &idx)) != QCAL_OK)
            return rc;
    if (tail > 0 && (rc = get_plan(net, tail, 0, &idx)) != QCAL_OK)
        return rc;
    if (nfull > 0) {
        const plan *pls[QCAL_INT8_MAX_SLOTS];
        for (int32_t t = 0; t < slots; t++) {
            int32_t i = find_plan(net, chunk, t);
            if (i < 0)
                return qcal_error(QCAL_ERR_STATE, "%s: plan cache too small", fn);
            pls[t] = net->plans[i];
            net->last_plan = t == 0 ? i : net->last_plan;
        }
        qcal_status *st = qcal_calloc((size_t)nfull, sizeof *st);
        uint64_t *nf = qcal_calloc((size_t)nfull, sizeof *nf);
        if (!st || !nf) {
            free(st);
            free(nf);
            return QCAL_ERR_NO_MEMORY;
        }
        if (slots > 1) {
            /* Whole chunks on separate threads; oneDNN runs single-threaded inside an OpenMP
             * parallel region. Each chunk's result does not depend on which thread ran it
             * (int32 accumulation is exact, the rest is elementwise). */
#if QCAL_HAVE_OPENMP
#pragma omp parallel num_threads(slots)
            {
                const plan *pl = pls[omp_get_thread_num()];
#pragma omp for schedule(static)
                for (int64_t c = 0; c < nfull; c++)
                    st[c] = run_chunk(net, pl, src + c * chunk * in_per, chunk,
                                      (char *)dst + (size_t)(c * chunk * out_per) * out_elem, u8,
                                      &nf[c]);
            }
#endif
        } else {
            for (int64_t c = 0; c < nfull; c++) {
                st[c] = run_chunk(net, pls[0], src + c * chunk * in_per, chunk,
                                  (char *)dst + (size_t)(c * chunk * out_per) * out_elem, u8,
                                  &nf[c]);
                if (st[c] != QCAL_OK) {
                    qcal_status bad = st[c];
                    free(st);
                    free(nf);
                    return bad;   /* message recorded on this thread */
                }
            }
        }
        rc = QCAL_OK;
        for (int64_t c = 0; c < nfull; c++) {
            net->nonfinite += nf[c];
            if (st[c] != QCAL_OK && rc == QCAL_OK)
                rc = qcal_error(st[c], "%s: chunk %lld (samples %lld..%lld) failed on a worker "
                                "thread: %s", fn, (long long)c, (long long)(c * chunk),
                                (long long)((c + 1) * chunk - 1), qcal_status_str(st[c]));
        }
        free(st);
        free(nf);
        if (rc != QCAL_OK)
            return rc;
    }
    if (tail > 0) {
        int32_t i = find_plan(net, tail, 0);
        if (i < 0)
            return qcal_error(QCAL_ERR_STATE, "%s: plan cache too small", fn);
        net->last_plan = i;
        uint64_t nf = 0;
        rc = run_chunk(net, net->plans[i], src + nfull * chunk * in_per, tail,
                       (char *)dst + (size_t)(nfull * chunk * out_per) * out_elem, u8, &nf);
        net->nonfinite += nf;
        if (rc != QCAL_OK)
            return rc;
    }
    return QCAL_OK;
}

/* forward() with the calling thread's OpenMP thread count set to qcal_threads_count()
 * for the call, so oneDNN's own parallel regions (its OpenMP runtime reads that count)
 * honour qcal_threads_set_count like the library's kernels do. */
static qcal_status forward_bounded(qcal_int8_net *net, int64_t n, const float *src, void *dst,
                                   bool u8, const char *fn)
{
#if QCAL_HAVE_OPENMP
    int saved = omp_get_max_threads(), want = qcal_threads_count();
    if (want != saved)
        omp_set_num_threads(want);
    qcal_status st = forward(net, n, src, dst, u8, fn);
    if (want != saved)
        omp_set_num_threads(saved);
    return st;
#else
    return forward(net, n, src, dst, u8, fn);
#endif
}

qcal_status qcal_int8_net_forward(qcal_int8_net *net, int64_t n, const float *src, float *dst)
{
    return forward_bounded(net, n, src, dst, false, "int8_net_forward");
}

qcal_status qcal_int8_net_forward_u8(qcal_int8_net *net, int64_t n, const float *src,
                                     uint8_t *dst)
{
    return forward_bounded(net, n, src, dst, true, "int8_net_forward_u8");
}

#else /* !QCAL_HAVE_DNNL */

static qcal_status no_dnnl(const char *fn)
{
    return qcal_error(QCAL_ERR_UNSUPPORTED, "%s: qcal was built without oneDNN (libdnnl-dev)", fn);
}

qcal_status qcal_int8_net_create(const qcal_int8_net_options *opt, int32_t ndim,
                                 const int64_t *input_shape, const qcal_qparams *input,
                                 qcal_int8_net **out)
{
    (void)opt; (void)ndim; (void)input_shape; (void)input; (void)out;
    return no_dnnl("int8_net_create");
}

void qcal_int8_net_destroy(qcal_int8_net **net)
{
    if (net)
        *net = NULL;
}

qcal_status qcal_int8_net_add_conv2d(qcal_int8_net *net, const qcal_int8_conv2d_params *p)
{
    (void)net; (void)p;
    return no_dnnl("int8_net_add_conv2d");
}

qcal_status qcal_int8_net_add_linear(qcal_int8_net *net, const qcal_int8_linear_params *p)
{
    (void)net; (void)p;
    return no_dnnl("int8_net_add_linear");
}

qcal_status qcal_int8_net_add_maxpool2d(qcal_int8_net *net, const qcal_int8_pool2d_params *p)
{
    (void)net; (void)p;
    return no_dnnl("int8_net_add_maxpool2d");
}

qcal_status qcal_int8_net_add_relu(qcal_int8_net *net)
{
    (void)net;
    return no_dnnl("int8_net_add_relu");
}

qcal_status qcal_int8_net_layers(const qcal_int8_net *net, int32_t *n)
{
    (void)net; (void)n;
    return no_dnnl("int8_net_layers");
}

qcal_status qcal_int8_net_output_shape(const qcal_int8_net *net, int32_t *ndim, int64_t *shape)
{
    (void)net; (void)ndim; (void)shape;
    return no_dnnl("int8_net_output_shape");
}

qcal_status qcal_int8_net_weight_scales(const qcal_int8_net *net, int32_t layer, int64_t cap,
                                        float *scales, int64_t *n)
{
    (void)net; (void)layer; (void)cap; (void)scales; (void)n;
    return no_dnnl("int8_net_weight_scales");
}

qcal_status qcal_int8_net_forward(qcal_int8_net *net, int64_t n, const float *src, float *dst)
{
    (void)net; (void)n; (void)src; (void)dst;
    return no_dnnl("int8_net_forward");
}

qcal_status qcal_int8_net_forward_u8(qcal_int8_net *net, int64_t n, const float *src,
                                     uint8_t *dst)
{
    (void)net; (void)n; (void)src; (void)dst;
    return no_dnnl("int8_net_forward_u8");
}

qcal_status qcal_int8_net_nonfinite(const qcal_int8_net *net, uint64_t *count)
{
    (void)net; (void)count;
    return no_dnnl("int8_net_nonfinite");
}

qcal_status qcal_int8_net_impl(const qcal_int8_net *net, int32_t layer, const char **name)
{
    (void)net; (void)layer; (void)name;
    return no_dnnl("int8_net_impl");
}

#endif
