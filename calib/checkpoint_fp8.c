/* FP8 serving checkpoints (compressed-tensors, ModelOpt) from a calibration table and the
 * model's safetensors files. Contract: include/qcal/fp8_checkpoint.h, docs/fp8.md.
 * Steps: plan (which tensor becomes what, every scale) -> fused-shard max (if asked) ->
 * write every file to a temporary -> rename them all. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/json.h"
#include "qcal/atomic_file.h"
#include "qcal/fp8_checkpoint.h"
#include "qcal/quantize.h"
#include "qcal/safetensors.h"
#include "qcal/weights.h"

void qcal_fp8_checkpoint_options_default(qcal_fp8_checkpoint_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->format = QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS;
    o->dtype = QCAL_FLOAT8_E4M3FN;
}

const char *qcal_fp8_checkpoint_format_name(qcal_fp8_checkpoint_format f)
{
    switch (f) {
    case QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS: return "compressed-tensors";
    case QCAL_FP8_CHECKPOINT_MODELOPT: return "modelopt";
    }
    return "unknown";
}

qcal_status qcal_fp8_checkpoint_format_parse(const char *name, qcal_fp8_checkpoint_format *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_fp8_checkpoint_format_parse: NULL argument");
    if (!strcmp(name, "compressed-tensors"))
        *out = QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS;
    else if (!strcmp(name, "modelopt"))
        *out = QCAL_FP8_CHECKPOINT_MODELOPT;
    else
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown checkpoint format '%s' (expected "
                          "compressed-tensors or modelopt)", name);
    return QCAL_OK;
}

/* ---- the plan ---------------------------------------------------------------------- */

enum { T_COPY, T_QUANT, T_SCALE };

typedef struct lin {
    char *module;          /* "model.layers.0.self_attn.q_proj" */
    float input_scale;
    float *wscales;        /* nws weight scales (1 or the output channels) */
    int64_t nws;
} lin;

typedef struct out_tensor {
    qcal_safetensors_desc d;
    char *name;            /* owned (d.name points here) */
    int kind;
    int64_t src;           /* T_COPY, T_QUANT: index in the shard's file */
    const float *values;   /* T_SCALE: numel values (owned by a lin or the plan) */
    const lin *l;          /* T_QUANT: its scales */
} out_tensor;

typedef struct shard {
    const char *path;
    const char *base;      /* base name of path */
    qcal_safetensors *st;
    out_tensor *t;
    int64_t n, cap;
} shard;

typedef struct plan {
    const qcal_fp8_checkpoint_options *o;
    const qcal_calib_table *table;
    shard *shards;
    int64_t nshards;
    lin *lins;
    int64_t nlins, caplins;
    float *kv;             /* 2 per attention module: k, v */
    int64_t nkv;
    char **ignore;
    int64_t nignore, capignore;
} plan;

static char *dupcat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static const char *last_component(const char *module)
{
    const char *dot = strrchr(module, '.');
    return dot ? dot + 1 : module;
}

/* Appends an output tensor to sh; name is taken over (freed on failure). */
static qcal_status push(shard *sh, char *name, const char *dtype, int32_t ndim,
                        const int64_t *shape, int kind, int64_t src, const float *values,
                        const lin *l)
{
    if (!name)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
    if (sh->n == sh->cap) {
        int64_t cap = sh->cap ? 2 * sh->cap : 64;
        out_tensor *t = realloc(sh->t, (size_t)cap * sizeof *t);
        if (!t) {
            free(name);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
        }
        sh->t = t;
        sh->cap = cap;
    }
    out_tensor *t = &sh->t[sh->n++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->d.name = name;
    t->d.dtype = dtype;
    t->d.ndim = ndim;
    for (int32_t k = 0; k < ndim; k++)
        t->d.shape[k] = shape[k];
    t->kind = kind;
    t->src = src;
    t->values = values;
    t->l = l;
    return QCAL_OK;
}

/* max(amax / largest, FLT_EPSILON) in float32: the FP8 scale rule of qcal_qparams. */
static float fp8_scale(float amax, qcal_dtype dtype)
{
    float s = amax / qcal_dtype_float8_max(dtype);
    return s >= FLT_EPSILON ? s : FLT_EPSILON;
}

/* amax over every channel of an entry; refuses entries without data. */
static qcal_status entry_amax(const qcal_calib_entry *e, float *amax)
{
    if (e->no_data)
        return qcal_error(QCAL_ERR_EMPTY, "'%s' saw no finite value: no scale for it", e->fqn);
    float m = 0.0f;
    for (int64_t c = 0; c < e->qparams.channels; c++) {
        float a;
        qcal_status s = qcal_calib_entry_amax(e, c, &a);
        if (s != QCAL_OK)
            return s;
        m = a > m ? a : m;
    }
    *amax = m;
    return QCAL_OK;
}

/* Reads elements [first, first + count) of tensor ctx->i of a shard as float32. */
typedef struct st_src {
    const qcal_safetensors *st;
    int64_t i;
} st_src;

static qcal_status st_read(void *ctx, int64_t first, int64_t count, void *scratch, const float **out)
{
    const st_src *c = ctx;
    qcal_status s = qcal_safetensors_read_f32(c->st, c->i, first, count, scratch);
    *out = scratch;
    return s;
}

/* The weight quantizer (qcal/weights.h) over tensor i of sh, (out, in), read in blocks:
 * codes NULL: l's scales from the weight (symmetric amax / largest, at least FLT_EPSILON);
 * else the codes with l's scales. */
static qcal_status weight_quantize(const plan *p, const shard *sh, int64_t i,
                                   const qcal_safetensors_tensor_info *info, const lin *l,
                                   uint8_t *codes)
{
    if (info->shape[0] == 0 || info->shape[1] == 0) {   /* nothing to observe: amax 0 */
        for (int64_t c = 0; !codes && c < l->nws; c++)
            l->wscales[c] = fp8_scale(0.0f, p->o->dtype);
        return QCAL_OK;
    }
    qcal_weights_options wo;
    qcal_weights_options_default(&wo);
    wo.q.dtype = p->o->dtype;
    wo.q.qscheme = l->nws == 1 ? QCAL_PER_TENSOR_SYMMETRIC : QCAL_PER_CHANNEL_SYMMETRIC;
    wo.empty_as_zero = true;
    wo.scales = codes ? l->wscales : NULL;
    qcal_tensor x;
    memset(&x, 0, sizeof x);
    x.ndim = 2;
    x.shape[0] = info->shape[0];
    x.shape[1] = info->shape[1];
    st_src src = { sh->st, i };
    const qcal_weights_reader rd = { st_read, &src };
    qcal_status s = qcal_weights_quantize(&wo, &x, &rd, l->wscales, NULL, codes);
    return s == QCAL_OK ? QCAL_OK : qcal_error(s, "weight '%s': %s", info->name, qcal_last_error());
}

/* The weight scales of the linear whose weight is tensor i of sh (shape (out, in)). */
static qcal_status weight_scales(plan *p, shard *sh, int64_t i,
                                 const qcal_safetensors_tensor_info *info, lin *l)
{
    const qcal_fp8_checkpoint_options *o = p->o;
    int64_t out = info->shape[0];
    l->nws = o->weight_per_channel ? out : 1;
    l->wscales = malloc((size_t)(l->nws > 0 ? l->nws : 1) * sizeof *l->wscales);
    if (!l->wscales)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for the scales of '%s'", info->name);
    const qcal_calib_entry *e = NULL;
    if (qcal_calib_table_find(p->table, info->name, QCAL_CALIB_ROLE_WEIGHT, &e) == QCAL_OK) {
        if (e->no_data)
            return qcal_error(QCAL_ERR_EMPTY, "weight '%s' saw no finite value", e->fqn);
        if (!o->weight_per_channel) {
            float amax = 0.0f;
            qcal_status s = entry_amax(e, &amax);
            if (s != QCAL_OK)
                return s;
            l->wscales[0] = fp8_scale(amax, o->dtype);
            return QCAL_OK;
        }
        if (!qcal_qscheme_is_per_channel(e->qparams.qscheme) || e->qparams.axis != 0 ||
            e->qparams.channels != out)
            return qcal_error(QCAL_ERR_INVALID_ARG, "weight '%s': per-channel FP8 scales need "
                              "a per-channel weight observer on axis 0 with %lld channels "
                              "(the table has %s, axis %d, %lld channels)", e->fqn,
                              (long long)out, qcal_qscheme_name(e->qparams.qscheme),
                              (int)e->qparams.axis, (long long)e->qparams.channels);
        for (int64_t c = 0; c < out; c++) {
            float amax;
            qcal_status s = qcal_calib_entry_amax(e, c, &amax);
            if (s != QCAL_OK)
                return s;
            l->wscales[c] = fp8_scale(amax, o->dtype);
        }
        return QCAL_OK;
    }
    /* No weight entry: the weight's own max |w| (per row when per channel), NaN and Inf
     * skipped, a row without a finite value taken as 0 (scale eps). */
    return weight_quantize(p, sh, i, info, l, NULL);
}

static qcal_status add_ignore(plan *p, const char *module, size_t len)
{
    if (p->nignore == p->capignore) {
        int64_t cap = p->capignore ? 2 * p->capignore : 16;
        char **v = realloc(p->ignore, (size_t)cap * sizeof *v);
        if (!v)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
        p->ignore = v;
        p->capignore = cap;
    }
    char *m = qcal_strndup(module, len);
    if (!m)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
    p->ignore[p->nignore++] = m;
    return QCAL_OK;
}

/* Shape of a per-tensor scale: [1] (compressed-tensors) or [] (ModelOpt). */
static int32_t scalar_ndim(const plan *p)
{
    return p->o->format == QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS ? 1 : 0;
}

/* Plans one shard's tensors in data-offset order. */
static qcal_status plan_shard(plan *p, shard *sh, qcal_fp8_checkpoint_summary *sum)
{
    int64_t n = 0;
    qcal_status s = qcal_safetensors_count(sh->st, &n);
    static const int64_t one[1] = { 1 };
    for (int64_t i = 0; i < n && s == QCAL_OK; i++) {
        qcal_safetensors_tensor_info info;
        if ((s = qcal_safetensors_info(sh->st, i, &info)) != QCAL_OK)
            break;
        const qcal_calib_entry *act = NULL;
        bool weight2d = info.ndim == 2 && ends_with(info.name, ".weight");
        size_t mlen = weight2d ? strlen(info.name) - 7 : 0;
        if (weight2d) {
            char *in_name = malloc(mlen + 7);
            if (!in_name)
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
            memcpy(in_name, info.name, mlen);
            memcpy(in_name + mlen, ".input", 7);
            if (qcal_calib_table_find(p->table, in_name, QCAL_CALIB_ROLE_ACTIVATION, &act) !=
                QCAL_OK)
                act = NULL;
            free(in_name);
            qcal_clear_error();
        }
        if (!act) {
            if (weight2d) {
                char *module = dupcat("", info.name);
                if (!module)
                    return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                module[mlen] = '\0';
                if (!strstr(last_component(module), "embed")) {
                    s = add_ignore(p, module, mlen);
                    sum->ignored++;
                }
                free(module);
            }
            if (s == QCAL_OK)
                s = push(sh, dupcat("", info.name), info.dtype_name, info.ndim, info.shape,
                         T_COPY, i, NULL, NULL);
            sum->copied++;
            continue;
        }
        if (info.dtype == QCAL_SAFETENSORS_OTHER)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': weight '%s' is %s; FP8 checkpoints "
                              "are made from F32, F16, BF16 or F64 weights", sh->path, info.name,
                              info.dtype_name);
        if (info.numel == 0)
            return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': weight '%s' is empty", sh->path,
                              info.name);
        if (p->nlins == p->caplins) {
            int64_t cap = p->caplins ? 2 * p->caplins : 64;
            lin *v = realloc(p->lins, (size_t)cap * sizeof *v);
            if (!v)
                return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
            p->lins = v;
            p->caplins = cap;
        }
        lin *l = &p->lins[p->nlins++];
        memset(l, 0, sizeof *l);
        if (!(l->module = malloc(mlen + 1)))
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
        memcpy(l->module, info.name, mlen);
        l->module[mlen] = '\0';
        float amax = 0.0f;
        if ((s = entry_amax(act, &amax)) != QCAL_OK)
            return s;
        l->input_scale = fp8_scale(amax, p->o->dtype);
        if ((s = weight_scales(p, sh, i, &info, l)) != QCAL_OK)
            return s;
        sum->quantized++;
        /* The lins array may move: T_QUANT/T_SCALE refer to it by index, fixed up later. */
        int64_t li = p->nlins - 1;
        s = push(sh, dupcat("", info.name), "F8_E4M3", 2, info.shape, T_QUANT, i, NULL,
                 (const lin *)(intptr_t)li);
        int64_t wshape[2] = { info.shape[0], 1 };
        if (s == QCAL_OK)
            s = p->o->weight_per_channel
                    ? push(sh, dupcat(l->module, ".weight_scale"), "F32", 2, wshape, T_SCALE,
                           -1, NULL, (const lin *)(intptr_t)li)
                    : push(sh, dupcat(l->module, ".weight_scale"), "F32", scalar_ndim(p), one,
                           T_SCALE, -1, NULL, (const lin *)(intptr_t)li);
        if (s == QCAL_OK)
            s = push(sh, dupcat(l->module, ".input_scale"), "F32", scalar_ndim(p), one,
                     T_SCALE, -2, NULL, (const lin *)(intptr_t)li);
    }
    return s;
}

/* Points every T_QUANT / T_SCALE at its lin (their index until the array stopped moving). */
static void fix_lins(plan *p)
{
    for (int64_t k = 0; k < p->nshards; k++)
        for (int64_t j = 0; j < p->shards[k].n; j++) {
            out_tensor *t = &p->shards[k].t[j];
            if (t->kind == T_QUANT || (t->kind == T_SCALE && t->src < 0 && !t->values)) {
                const lin *l = &p->lins[(intptr_t)t->l];
                t->l = l;
                if (t->kind == T_SCALE)
                    t->values = t->src == -1 ? l->wscales : &l->input_scale;
            }
        }
}

/* "q"/"k"/"v" shards (group 1) and "gate"/"up" (group 2) of one parent; 0 otherwise. */
static int fused_group(const char *module)
{
    const char *c = last_component(module);
    if (!strcmp(c, "q_proj") || !strcmp(c, "k_proj") || !strcmp(c, "v_proj"))
        return 1;
    if (!strcmp(c, "gate_proj") || !strcmp(c, "up_proj"))
        return 2;
    return 0;
}

static void fused_max(plan *p)
{
    for (int64_t i = 0; i < p->nlins; i++) {
        int g = fused_group(p->lins[i].module);
        if (!g)
            continue;
        size_t plen = (size_t)(last_component(p->lins[i].module) - p->lins[i].module);
        float m = 0.0f;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t j = 0; j < p->nlins; j++) {
                lin *o = &p->lins[j];
                if (fused_group(o->module) != g ||
                    (size_t)(last_component(o->module) - o->module) != plen ||
                    strncmp(o->module, p->lins[i].module, plen))
                    continue;
                if (pass == 0)
                    m = o->input_scale > m ? o->input_scale : m;
                else
                    o->input_scale = m;
            }
    }
}

/* KV-cache scales: "<attn>.k_proj.output" and "<attn>.v_proj.output" give <attn>.k_scale and
 * <attn>.v_scale, placed in the shard holding <attn>.k_proj.weight. */
static qcal_status plan_kv(plan *p, qcal_fp8_checkpoint_summary *sum)
{
    int64_t n = 0;
    qcal_calib_table_count(p->table, &n);
    p->kv = malloc((size_t)(2 * n + 2) * sizeof *p->kv);
    if (!p->kv)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
    static const int64_t one[1] = { 1 };
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e, *other = NULL;
        qcal_calib_table_entry(p->table, i, &e);
        if (e->role != QCAL_CALIB_ROLE_ACTIVATION)
            continue;
        bool k = ends_with(e->fqn, ".k_proj.output"), v = ends_with(e->fqn, ".v_proj.output");
        if (!k && !v)
            continue;
        size_t alen = strlen(e->fqn) - strlen(".k_proj.output");
        char *attn = malloc(alen + 32);
        if (!attn)
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory planning the checkpoint");
        memcpy(attn, e->fqn, alen);
        strcpy(attn + alen, k ? ".v_proj.output" : ".k_proj.output");
        bool paired = qcal_calib_table_find(p->table, attn, QCAL_CALIB_ROLE_ACTIVATION,
                                            &other) == QCAL_OK;
        qcal_clear_error();
        if (!paired) {
            qcal_status s = qcal_error(QCAL_ERR_INVALID_ARG, "'%s' has no '%s': KV-cache scales "
                                       "need both the key and the value projection's output",
                                       e->fqn, attn);
            free(attn);
            return s;
        }
        if (v) {   /* the pair is planned once, from its k entry */
            free(attn);
            continue;
        }
        strcpy(attn + alen, ".k_proj.weight");
        shard *home = NULL;
        for (int64_t j = 0; j < p->nshards && !home; j++) {
            int64_t idx;
            if (qcal_safetensors_find(p->shards[j].st, attn, &idx) == QCAL_OK)
                home = &p->shards[j];
        }
        qcal_clear_error();
        if (!home) {
            qcal_status s = qcal_error(QCAL_ERR_NOT_FOUND, "'%s' is in the dump but no model "
                                       "file has '%s'", e->fqn, attn);
            free(attn);
            return s;
        }
        float ka = 0.0f, va = 0.0f;
        qcal_status s = entry_amax(e, &ka);
        if (s == QCAL_OK)
            s = entry_amax(other, &va);
        if (s != QCAL_OK) {
            free(attn);
            return s;
        }
        float *kv = &p->kv[2 * p->nkv++];
        kv[0] = fp8_scale(ka, p->o->dtype);
        kv[1] = fp8_scale(va, p->o->dtype);
        attn[alen] = '\0';
        s = push(home, dupcat(attn, ".k_scale"), "F32", scalar_ndim(p), one, T_SCALE, 0, kv,
                 NULL);
        if (s == QCAL_OK)
            s = push(home, dupcat(attn, ".v_scale"), "F32", scalar_ndim(p), one, T_SCALE, 0,
                     kv + 1, NULL);
        free(attn);
        if (s != QCAL_OK)
            return s;
        sum->kv_scales++;
    }
    return QCAL_OK;
}

static void count_unmatched(const plan *p, qcal_fp8_checkpoint_summary *sum)
{
    int64_t n = 0;
    qcal_calib_table_count(p->table, &n);
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        qcal_calib_table_entry(p->table, i, &e);
        if (e->role != QCAL_CALIB_ROLE_ACTIVATION || !ends_with(e->fqn, ".input"))
            continue;
        size_t mlen = strlen(e->fqn) - 6;
        bool found = false;
        for (int64_t j = 0; j < p->nlins && !found; j++)
            found = strlen(p->lins[j].module) == mlen && !strncmp(p->lins[j].module, e->fqn, mlen);
        sum->unmatched_inputs += !found;
    }
}

static void plan_free(plan *p)
{
    for (int64_t k = 0; k < p->nshards; k++) {
        for (int64_t j = 0; j < p->shards[k].n; j++)
            free(p->shards[k].t[j].name);
        free(p->shards[k].t);
        qcal_safetensors_close(&p->shards[k].st);
    }
    free(p->shards);
    for (int64_t i = 0; i < p->nlins; i++) {
        free(p->lins[i].module);
        free(p->lins[i].wscales);
    }
    free(p->lins);
    for (int64_t i = 0; i < p->nignore; i++)
        free(p->ignore[i]);
    free(p->ignore);
    free(p->kv);
}

/* ---- writing ----------------------------------------------------------------------- */

static void buf_str(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

static void buf_ignore(qcal_buf *b, const plan *p)
{
    buf_str(b, "[");
    for (int64_t i = 0; i < p->nignore; i++) {
        if (i)
            buf_str(b, ", ");
        qcal_json_write_str(b, p->ignore[i]);
    }
    buf_str(b, "]");
}

/* The quantization_config object (compressed-tensors), indented for a top-level member. */
static void buf_ct_config(qcal_buf *b, const plan *p)
{
    const char *args = "\"dynamic\": false, \"num_bits\": 8, \"symmetric\": true, "
                       "\"type\": \"float\"";
    buf_str(b, "{\n    \"config_groups\": {\n      \"group_0\": {\n"
               "        \"input_activations\": {");
    buf_str(b, args);
    buf_str(b, ", \"strategy\": \"tensor\"},\n        \"output_activations\": null,\n"
               "        \"targets\": [\"Linear\"],\n        \"weights\": {");
    buf_str(b, args);
    buf_str(b, p->o->weight_per_channel ? ", \"strategy\": \"channel\"}\n"
                                        : ", \"strategy\": \"tensor\"}\n");
    buf_str(b, "      }\n    },\n    \"format\": \"float-quantized\",\n    \"ignore\": ");
    buf_ignore(b, p);
    buf_str(b, ",\n    \"kv_cache_scheme\": ");
    if (p->nkv) {
        buf_str(b, "{");
        buf_str(b, args);
        buf_str(b, ", \"strategy\": \"tensor\"}");
    } else {
        buf_str(b, "null");
    }
    buf_str(b, ",\n    \"quant_method\": \"compressed-tensors\",\n"
               "    \"quantization_status\": \"compressed\"\n  }");
}

static qcal_status read_text(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot open '%s': %s", path, strerror(errno));
    qcal_buf b = {0};
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
        qcal_buf_append(&b, chunk, got);
    bool err = ferror(f);
    fclose(f);
    if (err || b.failed) {
        qcal_buf_free(&b);
        return qcal_error(err ? QCAL_ERR_IO : QCAL_ERR_NO_MEMORY, "cannot read '%s'", path);
    }
    *text = (char *)b.data;
    *len = b.len;
    return QCAL_OK;
}

/* config.json (compressed-tensors) or hf_quant_config.json (ModelOpt) into *b. */
static qcal_status build_config(const plan *p, qcal_buf *b)
{
    if (p->o->format == QCAL_FP8_CHECKPOINT_MODELOPT) {
        /* vLLM takes hf_quant_config.json for ModelOpt FP8 only when producer.name is
         * "modelopt" (vllm/config/model.py ModelConfig._parse_quant_hf_config; the file is
         * read in vllm/transformers_utils/config.py get_config, and
         * model_executor/model_loader/weight_utils.py get_quant_config refuses the file for
         * quantization "modelopt" otherwise). The version is that of the ModelOpt releases
         * that wrote this separate-file layout (0.29 and before; docs/fp8.md); nothing reads
         * it. What wrote the file is said in "quantized_by", which no loader reads, and in the
         * safetensors __metadata__. */
        buf_str(b, "{\n  \"producer\": {\"name\": \"modelopt\", \"version\": \"0.29.0\"},\n"
                   "  \"quantized_by\": {\"name\": \"qcal\", \"version\": \"");
        buf_str(b, qcal_version());
        buf_str(b, "\"},\n  \"quantization\": {\n"
                   "    \"quant_algo\": \"FP8\",\n    \"kv_cache_quant_algo\": ");
        buf_str(b, p->nkv ? "\"FP8\"" : "null");
        buf_str(b, ",\n    \"exclude_modules\": ");
        buf_ignore(b, p);
        buf_str(b, "\n  }\n}\n");
        return QCAL_OK;
    }
    if (!p->o->config_json) {
        buf_str(b, "{\n  \"quantization_config\": ");
        buf_ct_config(b, p);
        buf_str(b, "\n}\n");
        return QCAL_OK;
    }
    char *text = NULL;
    size_t len = 0;
    qcal_status s = read_text(p->o->config_json, &text, &len);
    if (s != QCAL_OK)
        return s;
    qcal_json *doc = NULL;
    if ((s = qcal_json_parse(text, len, NULL, &doc)) != QCAL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        free(text);
        return qcal_error(QCAL_ERR_FORMAT, "'%s': %s", p->o->config_json, msg);
    }
    if (doc->type != QCAL_JSON_OBJECT || qcal_json_get(doc, "quantization_config")) {
        bool obj = doc->type == QCAL_JSON_OBJECT;
        qcal_json_free(&doc);
        free(text);
        return qcal_error(QCAL_ERR_FORMAT, obj ? "'%s' already has a quantization_config (the "
                          "model is quantized already)" : "'%s' is not a JSON object",
                          p->o->config_json);
    }
    size_t members = doc->n;
    qcal_json_free(&doc);
    size_t close = len;   /* the object's closing brace: the last '}' of the text */
    while (close > 0 && text[close - 1] != '}')
        close--;
    close--;
    size_t body = close;  /* drop the whitespace before it */
    while (body > 0 && strchr(" \t\r\n", text[body - 1]))
        body--;
    qcal_buf_append(b, text, body);
    buf_str(b, members ? ",\n  \"quantization_config\": " : "\n  \"quantization_config\": ");
    buf_ct_config(b, p);
    buf_str(b, "\n");
    qcal_buf_append(b, text + close, len - close);
    if (len == close + 1 || text[len - 1] != '\n')
        buf_str(b, "\n");
    free(text);
    return QCAL_OK;
}

/* model.safetensors.index.json for several shards. */
static void build_index(const plan *p, qcal_buf *b)
{
    int64_t total = 0;
    for (int64_t k = 0; k < p->nshards; k++)
        for (int64_t j = 0; j < p->shards[k].n; j++) {
            const qcal_safetensors_desc *d = &p->shards[k].t[j].d;
            int64_t numel = 1;
            for (int32_t i = 0; i < d->ndim; i++)
                numel *= d->shape[i];
            total += numel * qcal_safetensors_dtype_size(d->dtype);
        }
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%lld", (long long)total);
    buf_str(b, "{\n  \"metadata\": {\"total_size\": ");
    buf_str(b, tmp);
    buf_str(b, "},\n  \"weight_map\": {");
    bool first = true;
    for (int64_t k = 0; k < p->nshards; k++)
        for (int64_t j = 0; j < p->shards[k].n; j++) {
            buf_str(b, first ? "\n    " : ",\n    ");
            first = false;
            qcal_json_write_str(b, p->shards[k].t[j].name);
            buf_str(b, ": ");
            qcal_json_write_str(b, p->shards[k].base);
        }
    buf_str(b, "\n  }\n}\n");
}

static qcal_status write_failed(const char *path)
{
    return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
}

/* Writes one shard through f (opened by the caller). */
static qcal_status write_shard(const plan *p, const shard *sh, qcal_atomic_file *f)
{
    qcal_safetensors_desc *d = malloc((size_t)(sh->n ? sh->n : 1) * sizeof *d);
    if (!d)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory writing '%s'", f->path);
    for (int64_t j = 0; j < sh->n; j++)
        d[j] = sh->t[j].d;
    const char *meta[] = { "format", "pt", "quantized_by", "qcal" };
    void *header = NULL;
    size_t hlen = 0;
    int64_t data = 0;
    qcal_status s = qcal_safetensors_header(sh->n, d, 2, meta, &header, &hlen, &data);
    free(d);
    if (s != QCAL_OK)
        return s;
    if (fwrite(header, 1, hlen, f->fp) != hlen)
        s = write_failed(f->path);
    free(header);
    uint8_t *codes = NULL;
    for (int64_t j = 0; j < sh->n && s == QCAL_OK; j++) {
        const out_tensor *t = &sh->t[j];
        if (t->kind == T_COPY) {
            qcal_safetensors_tensor_info info;
            const void *bytes;
            if ((s = qcal_safetensors_info(sh->st, t->src, &info)) == QCAL_OK &&
                (s = qcal_safetensors_bytes(sh->st, t->src, &bytes)) == QCAL_OK &&
                info.nbytes > 0 && fwrite(bytes, 1, (size_t)info.nbytes, f->fp) !=
                (size_t)info.nbytes)
                s = write_failed(f->path);
            qcal_safetensors_release(sh->st, t->src);
        } else if (t->kind == T_SCALE) {
            int64_t numel = t->d.ndim == 2 ? t->d.shape[0] : 1;
            if (fwrite(t->values, sizeof(float), (size_t)numel, f->fp) != (size_t)numel)
                s = write_failed(f->path);
        } else {
            int64_t numel = t->d.shape[0] * t->d.shape[1];
            free(codes);
            codes = malloc((size_t)(numel > 0 ? numel : 1));
            if (!codes) {
                s = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory quantizing '%s'", t->name);
                break;
            }
            qcal_safetensors_tensor_info info;
            if ((s = qcal_safetensors_info(sh->st, t->src, &info)) == QCAL_OK)
                s = weight_quantize(p, sh, t->src, &info, t->l, codes);
            qcal_safetensors_release(sh->st, t->src);
            if (s != QCAL_OK)
                break;
            if (s == QCAL_OK && fwrite(codes, 1, (size_t)numel, f->fp) != (size_t)numel)
                s = write_failed(f->path);
        }
    }
    free(codes);
    return s;
}

/* Output path outdir/name (malloc'd). */
static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (s)
        snprintf(s, a + b + 2, "%s/%s", dir, name);
    return s;
}

/* Opens files[i] = outdir/name, writes and flushes; on failure the caller aborts all. */
static qcal_status stage_buf(qcal_atomic_file *f, const char *outdir, const char *name,
                             const qcal_buf *b)
{
    if (b->failed)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory building '%s'", name);
    char *path = join(outdir, name);
    if (!path)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    qcal_status s = qcal_atomic_file_open(f, path);
    free(path);
    if (s != QCAL_OK)
        return s;
    if (fwrite(b->data, 1, b->len, f->fp) != b->len)
        return write_failed(f->path);
    return qcal_atomic_file_flush(f);
}

qcal_status qcal_fp8_checkpoint_write(const char *outdir, int64_t nmodels,
                                      const char *const *models, const qcal_calib_table *table,
                                      const qcal_fp8_checkpoint_options *o,
                                      qcal_fp8_checkpoint_summary *summary)
{
    if (!outdir || !*outdir || nmodels < 1 || !models || !table || !o)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_fp8_checkpoint_write: bad arguments");
    if (o->dtype != QCAL_FLOAT8_E4M3FN)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "%s checkpoints hold float8_e4m3fn weights "
                          "(got %s)", qcal_fp8_checkpoint_format_name(o->format),
                          qcal_dtype_name(o->dtype));
    if (o->format != QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS &&
        o->format != QCAL_FP8_CHECKPOINT_MODELOPT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown checkpoint format %d", (int)o->format);
    if (o->format == QCAL_FP8_CHECKPOINT_MODELOPT && o->weight_per_channel)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "modelopt checkpoints (quant_algo FP8) hold one "
                          "weight scale per tensor; per-channel weight scales are written in "
                          "the compressed-tensors format");
    qcal_fp8_checkpoint_summary sum;
    memset(&sum, 0, sizeof sum);
    plan p;
    memset(&p, 0, sizeof p);
    p.o = o;
    p.table = table;
    qcal_status s = QCAL_OK;
    qcal_atomic_file *files = NULL;
    int64_t nfiles = 0;
    bool made_dir = false;
    char *real_out = NULL;

    /* The output directory: created if missing; no model file may live in it. */
    struct stat sb;
    if (stat(outdir, &sb) != 0) {
        if (errno != ENOENT || mkdir(outdir, 0777) != 0)
            return qcal_error(QCAL_ERR_IO, "cannot create the directory '%s': %s", outdir,
                              strerror(errno));
        made_dir = true;
    } else if (!S_ISDIR(sb.st_mode)) {
        return qcal_error(QCAL_ERR_IO, "'%s' is not a directory (checkpoints are written into "
                          "a directory)", outdir);
    }
    real_out = realpath(outdir, NULL);
    if (!(p.shards = calloc((size_t)nmodels, sizeof *p.shards)) || !real_out) {
        s = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    p.nshards = nmodels;
    for (int64_t k = 0; k < nmodels && s == QCAL_OK; k++) {
        shard *sh = &p.shards[k];
        sh->path = models[k];
        const char *slash = strrchr(models[k], '/');
        sh->base = slash ? slash + 1 : models[k];
        for (int64_t j = 0; j < k; j++)
            if (!strcmp(sh->base, p.shards[j].base))
                s = qcal_error(QCAL_ERR_INVALID_ARG, "'%s' and '%s' have the same file name: "
                               "one output directory cannot hold both", models[j], models[k]);
        if (s != QCAL_OK)
            break;
        char *rp = realpath(models[k], NULL);
        if (rp) {
            char *end = strrchr(rp, '/');
            if (end)
                *end = '\0';
            bool inside = !strcmp(rp, real_out) || (end == rp && !strcmp(real_out, "/"));
            free(rp);
            if (inside) {
                s = qcal_error(QCAL_ERR_INVALID_ARG, "'%s' is in the output directory '%s': "
                               "write the checkpoint into another directory", models[k], outdir);
                break;
            }
        }
        s = qcal_safetensors_open(models[k], &sh->st);
        if (s == QCAL_OK)
            s = plan_shard(&p, sh, &sum);
    }
    if (s == QCAL_OK)
        s = plan_kv(&p, &sum);
    if (s != QCAL_OK)
        goto fail;
    fix_lins(&p);
    if (o->fused_input_scale_max)
        fused_max(&p);
    count_unmatched(&p, &sum);
    if (sum.quantized == 0) {
        s = qcal_error(QCAL_ERR_EMPTY, "no linear to quantize: no '<module>.input' activation "
                       "of the table has a 2-D '<module>.weight' in the model files "
                       "(docs/fp8.md names the dump's tensors)");
        goto fail;
    }

    /* Every file to its temporary, then all renamed. */
    if (!(files = calloc((size_t)nmodels + 3, sizeof *files))) {
        s = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int64_t k = 0; k < nmodels && s == QCAL_OK; k++) {
        char *path = join(outdir, p.shards[k].base);
        if (!path) {
            s = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            break;
        }
        s = qcal_atomic_file_open(&files[nfiles], path);
        free(path);
        if (s != QCAL_OK)
            break;
        nfiles++;
        s = write_shard(&p, &p.shards[k], &files[nfiles - 1]);
        if (s == QCAL_OK)
            s = qcal_atomic_file_flush(&files[nfiles - 1]);
    }
    qcal_buf b = {0};
    if (s == QCAL_OK && (s = build_config(&p, &b)) == QCAL_OK)
        s = stage_buf(&files[nfiles++], outdir, o->format == QCAL_FP8_CHECKPOINT_MODELOPT
                                                    ? "hf_quant_config.json" : "config.json", &b);
    qcal_buf_free(&b);
    if (s == QCAL_OK && o->format == QCAL_FP8_CHECKPOINT_MODELOPT && o->config_json) {
        char *text = NULL;
        size_t len = 0;
        if ((s = read_text(o->config_json, &text, &len)) == QCAL_OK) {
            qcal_buf c = {0};
            qcal_buf_append(&c, text, len);
            free(text);
            s = stage_buf(&files[nfiles++], outdir, "config.json", &c);
            qcal_buf_free(&c);
        }
    }
    if (s == QCAL_OK && nmodels > 1) {
        qcal_buf ib = {0};
        build_index(&p, &ib);
        s = stage_buf(&files[nfiles++], outdir, "model.safetensors.index.json", &ib);
        qcal_buf_free(&ib);
    }
    for (int64_t k = 0; k < nfiles && s == QCAL_OK; k++)
        s = qcal_atomic_file_commit(&files[k]);
    if (s != QCAL_OK)
        goto fail;
    sum.files = nfiles;
    if (summary)
        *summary = sum;
    free(files);
    free(real_out);
    plan_free(&p);
    return QCAL_OK;

fail:
    for (int64_t k = 0; files && k < nfiles + 1 && k < nmodels + 3; k++)
        qcal_atomic_file_abort(&files[k]);
    free(files);
    free(real_out);
    plan_free(&p);
    if (made_dir)
        rmdir(outdir);   /* only if still empty: nothing of the user's is touched */
    return s;
}
