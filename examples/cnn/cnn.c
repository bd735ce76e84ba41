/* The demo CNN: f32 forward/backward with im2col + sgemm (oneDNN's dnnl_sgemm when
 * available, a plain C loop otherwise), OpenMP across the batch for the element-wise
 * parts, Adam, evaluation. See cnn.h for the model and the layouts.
 *
 * Determinism: every loop of ours either writes disjoint outputs or reduces in a fixed
 * chunk order, so for one thread count the results are bit-identical from run to run.
 * Across thread counts they may differ in the last bits: dnnl_sgemm splits its K
 * reductions by the number of threads. */
#define _POSIX_C_SOURCE 200809L   /* POSIX calls (mkdir, fileno, clock_gettime) under -std=c11 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <qcal/safetensors.h>

#include "cnn.h"
#include "ex_util.h"
#include "idx.h"

#if CNN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- Parameters --------------------------------------------------------------------- */

static const char *const param_names[CNN_NPARAMS] = {
    "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
    "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
};
static const int param_ndim[CNN_NPARAMS] = {4, 1, 4, 1, 2, 1, 2, 1};
static const int64_t param_shapes[CNN_NPARAMS][4] = {
    {32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64}, {128, 3136}, {128}, {10, 128}, {10},
};
static const char *const tap_names[CNN_NTAPS] = {"conv1", "conv2", "fc1", "fc2", "logits"};

const char *cnn_param_name(int i) { return i >= 0 && i < CNN_NPARAMS ? param_names[i] : "?"; }
const char *cnn_tap_name(int tap) { return tap >= 0 && tap < CNN_NTAPS ? tap_names[tap] : "?"; }
const char *cnn_layer_name(int layer) { return layer >= 0 && layer < CNN_NLAYERS ? tap_names[layer] : "?"; }

int cnn_param_shape(int i, int64_t shape[4])
{
    for (int d = 0; d < 4; d++)
        shape[d] = d < param_ndim[i] ? param_shapes[i][d] : 1;
    return param_ndim[i];
}

int64_t cnn_param_numel(int i)
{
    int64_t n = 1;
    for (int d = 0; d < param_ndim[i]; d++)
        n *= param_shapes[i][d];
    return n;
}

/* splitmix64: a small, well-mixed generator so initialisation and shuffling are fixed by
 * the seed on every platform. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform01(uint64_t *s) { return (float)(splitmix64(s) >> 40) * (1.0f / 16777216.0f); }

static cnn_model *model_alloc(void)
{
    cnn_model *m = ex_calloc(1, sizeof *m);
    if (!m)
        return NULL;
    for (int i = 0; i < CNN_NPARAMS; i++) {
        m->param[i] = ex_malloc((size_t)cnn_param_numel(i) * sizeof(float));
        if (!m->param[i]) {
            cnn_model_destroy(&m);
            return NULL;
        }
    }
    return m;
}

qcal_status cnn_model_create(uint64_t seed, cnn_model **out)
{
    if (!out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_model_create: NULL out");
    cnn_model *m = model_alloc();
    if (!m)
        return QCAL_ERR_NO_MEMORY;
    uint64_t s = seed;
    for (int l = 0; l < CNN_NLAYERS; l++) {
        /* PyTorch: kaiming_uniform_(w, a=sqrt(5)) gives bound gain*sqrt(3/fan_in) with
         * gain sqrt(2/(1+5)), i.e. 1/sqrt(fan_in); the bias uses 1/sqrt(fan_in) too. */
        int64_t fan_in = cnn_param_numel(2 * l) / param_shapes[2 * l][0];
        float bound = 1.0f / sqrtf((float)fan_in);
        for (int p = 2 * l; p <= 2 * l + 1; p++)
            for (int64_t i = 0; i < cnn_param_numel(p); i++)
                m->param[p][i] = (2.0f * uniform01(&s) - 1.0f) * bound;
    }
    *out = m;
    return QCAL_OK;
}

void cnn_model_destroy(cnn_model **m)
{
    if (!m || !*m)
        return;
    for (int i = 0; i < CNN_NPARAMS; i++)
        free((*m)->param[i]);
    free(*m);
    *m = NULL;
}

void cnn_model_copy(cnn_model *dst, const cnn_model *src)
{
    for (int i = 0; i < CNN_NPARAMS; i++)
        memcpy(dst->param[i], src->param[i], (size_t)cnn_param_numel(i) * sizeof(float));
}

qcal_status cnn_model_save(const cnn_model *m, const char *path)
{
    if (!m || !path)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_model_save: NULL argument");
    qcal_tensor t[CNN_NPARAMS];
    for (int i = 0; i < CNN_NPARAMS; i++) {
        int64_t shape[4];
        int nd = cnn_param_shape(i, shape);
        qcal_status st = qcal_tensor_init(&t[i], m->param[i], nd, shape);
        if (st != QCAL_OK)
            return st;
    }
    const char *meta[2] = {"format", "pt"};
    return qcal_safetensors_write_f32(path, CNN_NPARAMS, param_names, t, 1, meta);
}

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int32_t d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

qcal_status cnn_model_load(const char *path, cnn_model **out)
{
    if (!path || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_model_load: NULL argument");
    qcal_safetensors *sf = NULL;
    qcal_status st = qcal_safetensors_open(path, &sf);
    if (st != QCAL_OK)
        return st;
    cnn_model *m = model_alloc();
    if (!m) {
        qcal_safetensors_close(&sf);
        return QCAL_ERR_NO_MEMORY;
    }
    for (int i = 0; i < CNN_NPARAMS && st == QCAL_OK; i++) {
        int64_t idx, want[4];
        int nd = cnn_param_shape(i, want);
        qcal_safetensors_tensor_info info;
        if (qcal_safetensors_find(sf, param_names[i], &idx) != QCAL_OK) {
            st = qcal_set_error(QCAL_ERR_MISMATCH, "%s: tensor '%s' is missing (the model needs conv1/conv2/fc1/fc2 "
                                "weight and bias with PyTorch names)", path, param_names[i]);
            break;
        }
        if ((st = qcal_safetensors_info(sf, idx, &info)) != QCAL_OK)
            break;
        bool same = info.ndim == nd;
        for (int d = 0; same && d < nd; d++)
            same = info.shape[d] == want[d];
        if (!same) {
            char have_s[128], want_s[128];
            shape_str(have_s, sizeof have_s, info.ndim, info.shape);
            shape_str(want_s, sizeof want_s, nd, want);
            st = qcal_set_error(QCAL_ERR_MISMATCH, "%s: tensor '%s' has shape %s, expected %s", path,
                                param_names[i], have_s, want_s);
            break;
        }
        st = qcal_safetensors_read_f32(sf, idx, 0, cnn_param_numel(i), m->param[i]);
        for (int64_t k = 0; st == QCAL_OK && k < cnn_param_numel(i); k++)
            if (!isfinite(m->param[i][k]))
                st = qcal_set_error(QCAL_ERR_NONFINITE, "%s: tensor '%s' element %lld is %g", path,
                                    param_names[i], (long long)k, (double)m->param[i][k]);
    }
    qcal_safetensors_close(&sf);
    if (st != QCAL_OK) {
        cnn_model_destroy(&m);
        return st;
    }
    *out = m;
    return QCAL_OK;
}

/* ---- Data --------------------------------------------------------------------------- */

const char *cnn_data_dir(void)
{
    const char *d = getenv("QCAL_FMNIST_DIR");
    return d && *d ? d : "/usr/share/datasets/fashion-mnist";
}

void cnn_data_free(cnn_data *d)
{
    if (!d)
        return;
    free(d->images);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

qcal_status cnn_data_load(const char *dir, const char *split, cnn_data *out)
{
    if (!dir || !split || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_data_load: NULL argument");
    char ipath[4096], lpath[4096];
    snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    idx_file *img = NULL, *lab = NULL;
    cnn_data d = {0};
    qcal_status st = idx_read_file(ipath, &img);
    if (st == QCAL_OK)
        st = idx_read_file(lpath, &lab);
    const int64_t idims[3] = {-1, 28, 28};
    if (st == QCAL_OK && (st = idx_expect(img, 3, idims)) != QCAL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        st = qcal_set_error(st, "%s: %s", ipath, msg);
    }
    const int64_t ldims[1] = {-1};
    if (st == QCAL_OK && (st = idx_expect(lab, 1, ldims)) != QCAL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        st = qcal_set_error(st, "%s: %s", lpath, msg);
    }
    if (st == QCAL_OK) {
        int32_t nd;
        int64_t di[IDX_MAX_DIMS], dl[IDX_MAX_DIMS];
        const uint8_t *pi, *pl;
        int64_t li, ll;
        idx_shape(img, &nd, di);
        idx_shape(lab, &nd, dl);
        idx_data(img, &pi, &li);
        idx_data(lab, &pl, &ll);
        if (di[0] != dl[0]) {
            st = qcal_set_error(QCAL_ERR_MISMATCH, "%s has %lld images but %s has %lld labels", ipath,
                                (long long)di[0], lpath, (long long)dl[0]);
        } else if (di[0] == 0) {
            st = qcal_set_error(QCAL_ERR_EMPTY, "%s holds no images", ipath);
        } else {
            for (int64_t i = 0; i < ll; i++)
                if (pl[i] >= CNN_CLASSES) {
                    st = qcal_set_error(QCAL_ERR_FORMAT, "%s: label %lld is %u, not a class 0..9", lpath,
                                        (long long)i, pl[i]);
                    break;
                }
        }
        if (st == QCAL_OK) {
            d.images = ex_malloc((size_t)li);
            d.labels = ex_malloc((size_t)ll);
            if (!d.images || !d.labels) {
                st = QCAL_ERR_NO_MEMORY;
            } else {
                memcpy(d.images, pi, (size_t)li);
                memcpy(d.labels, pl, (size_t)ll);
                d.n = di[0];
            }
        }
    }
    idx_destroy(&img);
    idx_destroy(&lab);
    if (st != QCAL_OK) {
        cnn_data_free(&d);
        return st;
    }
    *out = d;
    return QCAL_OK;
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/* Row-major C = alpha * op(A) * op(B) + beta * C (BLAS semantics, like dnnl_sgemm). */
static qcal_status sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
#if CNN_HAVE_DNNL
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (s != dnnl_success)
        return qcal_set_error(QCAL_ERR_BACKEND, "dnnl_sgemm(%c, %c, M=%lld, N=%lld, K=%lld) failed with status %d",
                              ta, tb, (long long)M, (long long)N, (long long)K, (int)s);
    return QCAL_OK;
#else
    /* Portable fallback: one output row per iteration, K innermost in a fixed order. */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (M * N * K > (1 << 20))
#endif
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        for (int64_t j = 0; j < N; j++)
            c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int64_t k = 0; k < K; k++) {
            float a = alpha * (ta == 'N' ? A[i * lda + k] : A[k * lda + i]);
            if (tb == 'N') {
                const float *b = B + k * ldb;
                for (int64_t j = 0; j < N; j++)
                    c[j] += a * b[j];
            } else {
                for (int64_t j = 0; j < N; j++)
                    c[j] += a * B[j * ldb + k];
            }
        }
    }
    return QCAL_OK;
#endif
}

/* ---- Workspace ------------------------------------------------------------------------ */

/* Fixed number of row chunks for column sums, independent of the thread count. */
#define COLSUM_CHUNKS 64

struct cnn_ctx {
    int max_batch;
    float lut[256];                       /* pixel -> normalised input */
    /* forward (NHWC inside) */
    float *x0;       /* [B,28,28,1] */
    float *col1;     /* [B*784, 9] */
    float *a1;       /* [B*784, 32] conv1 + bias, ReLU */
    float *p1;       /* [B*196, 32] pool1 */
    uint8_t *i1;     /* argmax in each 2x2 window of pool1 */
    float *col2;     /* [B*196, 288] (kh,kw,c) */
    float *a2;       /* [B*196, 64] */
    float *p2;       /* [B*49, 64] = [B,3136] */
    uint8_t *i2;
    float *h;        /* [B,128] fc1 output after ReLU (and after the tap's hook) */
    float *hrelu;    /* [B,128] fc1 ReLU output before the hook (ReLU's gradient mask) */
    float *z;        /* [B,10] */
    const cnn_hooks *hooks;                /* of the current training step */
    bool act_hooked[CNN_NTAPS];            /* the forward hook ran in training */
    /* weights: hooked copy (PyTorch layout), internal layout */
    float *wq[CNN_NLAYERS];
    bool w_hooked[CNN_NLAYERS];
    float *wi[CNN_NLAYERS];
    /* backward */
    float *dz, *dh, *dp2, *da2, *dcol2, *dp1, *da1;
    float *gwi[CNN_NLAYERS];               /* weight gradients, internal layout */
    float *grad[CNN_NPARAMS];              /* PyTorch layout */
    float *colsum_part;                    /* [COLSUM_CHUNKS, 128] */
    /* Adam */
    float *adam_m[CNN_NPARAMS], *adam_v[CNN_NPARAMS];
    int64_t adam_t;
};

void cnn_ctx_destroy(cnn_ctx **pctx)
{
    if (!pctx || !*pctx)
        return;
    cnn_ctx *c = *pctx;
    free(c->x0); free(c->col1); free(c->a1); free(c->p1); free(c->i1); free(c->col2);
    free(c->a2); free(c->p2); free(c->i2); free(c->h); free(c->hrelu); free(c->z);
    for (int l = 0; l < CNN_NLAYERS; l++) {
        free(c->wq[l]); free(c->wi[l]); free(c->gwi[l]);
    }
    free(c->dz); free(c->dh); free(c->dp2); free(c->da2); free(c->dcol2); free(c->dp1); free(c->da1);
    for (int i = 0; i < CNN_NPARAMS; i++) {
        free(c->grad[i]); free(c->adam_m[i]); free(c->adam_v[i]);
    }
    free(c->colsum_part);
    free(c);
    *pctx = NULL;
}

static void *falloc(int64_t count, size_t elem, bool *ok)
{
    void *p = NULL;
    if (*ok) {
        p = ex_malloc((size_t)count * elem);
        if (!p)
            *ok = false;
    }
    return p;
}

qcal_status cnn_ctx_create(int max_batch, cnn_ctx **out)
{
    if (!out || max_batch < 1 || max_batch > 65536)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_ctx_create: max_batch %d not in 1..65536", max_batch);
    cnn_ctx *c = ex_calloc(1, sizeof *c);
    if (!c)
        return QCAL_ERR_NO_MEMORY;
    int64_t B = max_batch;
    bool ok = true;
    c->max_batch = max_batch;
    for (int p = 0; p < 256; p++)
        c->lut[p] = ((float)p / 255.0f - 0.2860f) / 0.3530f;   /* ToTensor, then Normalize */
    const size_t F = sizeof(float);
    c->x0 = falloc(B * 784, F, &ok);
    c->col1 = falloc(B * 784 * 9, F, &ok);
    c->a1 = falloc(B * 784 * 32, F, &ok);
    c->p1 = falloc(B * 196 * 32, F, &ok);
    c->i1 = falloc(B * 196 * 32, 1, &ok);
    c->col2 = falloc(B * 196 * 288, F, &ok);
    c->a2 = falloc(B * 196 * 64, F, &ok);
    c->p2 = falloc(B * 3136, F, &ok);
    c->i2 = falloc(B * 3136, 1, &ok);
    c->h = falloc(B * 128, F, &ok);
    c->hrelu = falloc(B * 128, F, &ok);
    c->z = falloc(B * 10, F, &ok);
    for (int l = 0; l < CNN_NLAYERS; l++) {
        int64_t n = cnn_param_numel(2 * l);
        c->wq[l] = falloc(n, F, &ok);
        c->wi[l] = falloc(n, F, &ok);
        c->gwi[l] = falloc(n, F, &ok);
    }
    c->dz = falloc(B * 10, F, &ok);
    c->dh = falloc(B * 128, F, &ok);
    c->dp2 = falloc(B * 3136, F, &ok);
    c->da2 = falloc(B * 196 * 64, F, &ok);
    c->dcol2 = falloc(B * 196 * 288, F, &ok);
    c->dp1 = falloc(B * 196 * 32, F, &ok);
    c->da1 = falloc(B * 784 * 32, F, &ok);
    for (int i = 0; i < CNN_NPARAMS; i++) {
        c->grad[i] = falloc(cnn_param_numel(i), F, &ok);
        c->adam_m[i] = falloc(cnn_param_numel(i), F, &ok);
        c->adam_v[i] = falloc(cnn_param_numel(i), F, &ok);
    }
    c->colsum_part = falloc(COLSUM_CHUNKS * 128, F, &ok);
    if (!ok) {
        cnn_ctx_destroy(&c);
        return QCAL_ERR_NO_MEMORY;
    }
    cnn_ctx_reset_optimizer(c);
    *out = c;
    return QCAL_OK;
}

void cnn_ctx_reset_optimizer(cnn_ctx *c)
{
    if (!c)
        return;
    for (int i = 0; i < CNN_NPARAMS; i++) {
        memset(c->adam_m[i], 0, (size_t)cnn_param_numel(i) * sizeof(float));
        memset(c->adam_v[i], 0, (size_t)cnn_param_numel(i) * sizeof(float));
    }
    c->adam_t = 0;
}

/* ---- Layer kernels (NHWC) ------------------------------------------------------------- */

/* [O, C, S] -> [O, S, C] (PyTorch weight layout to channels-last), and back. */
static void perm_ocs_to_osc(const float *src, float *dst, int64_t O, int64_t C, int64_t S)
{
    for (int64_t o = 0; o < O; o++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t s = 0; s < S; s++)
                dst[(o * S + s) * C + ch] = src[(o * C + ch) * S + s];
}

static void perm_osc_to_ocs(const float *src, float *dst, int64_t O, int64_t C, int64_t S)
{
    for (int64_t o = 0; o < O; o++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t s = 0; s < S; s++)
                dst[(o * C + ch) * S + s] = src[(o * S + s) * C + ch];
}

/* im2col for a 3x3, pad 1, stride 1 convolution: src [B,H,W,C] -> col [B*H*W, 9*C], columns
 * ordered (kh, kw, c) to match the [O, kh, kw, C] weight. */
static void im2col3x3(const float *src, float *col, int64_t B, int64_t H, int64_t W, int64_t C)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t b = 0; b < B; b++) {
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                float *dst = col + ((b * H + y) * W + x) * 9 * C;
                for (int64_t kh = 0; kh < 3; kh++) {
                    int64_t iy = y + kh - 1;
                    for (int64_t kw = 0; kw < 3; kw++, dst += C) {
                        int64_t ix = x + kw - 1;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                            memset(dst, 0, (size_t)C * sizeof(float));
                        else
                            memcpy(dst, src + ((b * H + iy) * W + ix) * C, (size_t)C * sizeof(float));
                    }
                }
            }
    }
}

/* Adjoint of im2col3x3: dst [B,H,W,C] = sum of the col entries that read each pixel. */
static void col2im3x3(const float *col, float *dst, int64_t B, int64_t H, int64_t W, int64_t C)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t b = 0; b < B; b++) {
        float *img = dst + b * H * W * C;
        memset(img, 0, (size_t)(H * W * C) * sizeof(float));
        for (int64_t y = 0; y < H; y++)
            for (int64_t x = 0; x < W; x++) {
                const float *src = col + ((b * H + y) * W + x) * 9 * C;
                for (int64_t kh = 0; kh < 3; kh++) {
                    int64_t iy = y + kh - 1;
                    for (int64_t kw = 0; kw < 3; kw++, src += C) {
                        int64_t ix = x + kw - 1;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                            continue;
                        float *d = img + (iy * W + ix) * C;
                        for (int64_t ch = 0; ch < C; ch++)
                            d[ch] += src[ch];
                    }
                }
            }
    }
}

/* y [M, C] += bias, then ReLU, in place. */
static void bias_relu(float *y, const float *bias, int64_t M, int64_t C, bool relu)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (M * C > 65536)
#endif
    for (int64_t i = 0; i < M; i++) {
        float *r = y + i * C;
        for (int64_t ch = 0; ch < C; ch++) {
            float v = r[ch] + bias[ch];
            r[ch] = relu ? (v > 0.0f ? v : 0.0f) : v;
        }
    }
}

/* 2x2 stride-2 max pool on [B,H,W,C] (H, W even) -> [B,H/2,W/2,C]; idx gets the window
 * position (0..3, first maximum, like PyTorch) of each output, or 4 when the maximum is
 * not > 0: the input is a ReLU output, so then no gradient flows back at all. */
static void maxpool2(const float *src, float *dst, uint8_t *idx, int64_t B, int64_t H, int64_t W, int64_t C)
{
    int64_t OH = H / 2, OW = W / 2;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t b = 0; b < B; b++)
        for (int64_t y = 0; y < OH; y++)
            for (int64_t x = 0; x < OW; x++) {
                const float *s00 = src + ((b * H + 2 * y) * W + 2 * x) * C;
                const float *s01 = s00 + C, *s10 = s00 + W * C, *s11 = s10 + C;
                float *d = dst + ((b * OH + y) * OW + x) * C;
                uint8_t *id = idx + ((b * OH + y) * OW + x) * C;
                for (int64_t ch = 0; ch < C; ch++) {
                    float m = s00[ch];
                    uint8_t k = 0;
                    if (s01[ch] > m) { m = s01[ch]; k = 1; }
                    if (s10[ch] > m) { m = s10[ch]; k = 2; }
                    if (s11[ch] > m) { m = s11[ch]; k = 3; }
                    d[ch] = m;
                    id[ch] = m > 0.0f ? k : 4;
                }
            }
}

/* Backward of ReLU + maxpool2: writes every element of dsrc [B,H,W,C]: the gradient at
 * the recorded window position, 0 elsewhere (and everywhere when idx is 4). */
static void maxpool2_relu_backward(const float *dout, const uint8_t *idx, float *dsrc,
                                   int64_t B, int64_t H, int64_t W, int64_t C)
{
    int64_t OH = H / 2, OW = W / 2;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t b = 0; b < B; b++)
        for (int64_t y = 0; y < OH; y++)
            for (int64_t x = 0; x < OW; x++) {
                float *d00 = dsrc + ((b * H + 2 * y) * W + 2 * x) * C;
                float *d01 = d00 + C, *d10 = d00 + W * C, *d11 = d10 + C;
                const float *g = dout + ((b * OH + y) * OW + x) * C;
                const uint8_t *id = idx + ((b * OH + y) * OW + x) * C;
                for (int64_t ch = 0; ch < C; ch++) {
                    float v = g[ch];
                    int k = id[ch];
                    d00[ch] = k == 0 ? v : 0.0f;
                    d01[ch] = k == 1 ? v : 0.0f;
                    d10[ch] = k == 2 ? v : 0.0f;
                    d11[ch] = k == 3 ? v : 0.0f;
                }
            }
}

/* Column sums of a [M, C] matrix (C <= 128) into out[C], in COLSUM_CHUNKS fixed row chunks
 * combined in order, so the result does not depend on the thread count. */
static void colsum(cnn_ctx *c, const float *a, int64_t M, int64_t C, float *out)
{
    float *part = c->colsum_part;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (M * C > 65536)
#endif
    for (int k = 0; k < COLSUM_CHUNKS; k++) {
        int64_t r0 = M * k / COLSUM_CHUNKS, r1 = M * (k + 1) / COLSUM_CHUNKS;
        float *p = part + k * C;
        for (int64_t ch = 0; ch < C; ch++)
            p[ch] = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t ch = 0; ch < C; ch++)
                p[ch] += a[r * C + ch];
    }
    for (int64_t ch = 0; ch < C; ch++) {
        float s = 0.0f;
        for (int k = 0; k < COLSUM_CHUNKS; k++)
            s += part[k * C + ch];
        out[ch] = s;
    }
}

/* ---- Forward ------------------------------------------------------------------------- */

/* Geometry of a layer's weight for the layout permutation: [O, C, S]. */
static const int64_t wperm[CNN_NLAYERS][3] = {{32, 1, 9}, {64, 32, 9}, {128, 64, 49}, {10, 128, 1}};

static qcal_status run_tap(cnn_ctx *c, const cnn_hooks *hooks, cnn_tap tap, float *data, int64_t B,
                           bool training)
{
    c->act_hooked[tap] = false;
    if (!hooks || !hooks->act)
        return QCAL_OK;
    static const int32_t nd[CNN_NTAPS] = {4, 4, 2, 2, 2};
    const int64_t shp[CNN_NTAPS][4] = {
        {B, 28, 28, 1}, {B, 14, 14, 32}, {B, 3136, 1, 1}, {B, 128, 1, 1}, {B, 10, 1, 1}};
    cnn_act a = {.tap = tap, .data = data, .ndim = nd[tap], .channel_axis = nd[tap] - 1,
                 .training = training};
    a.numel = 1;
    for (int d = 0; d < 4; d++) {
        a.shape[d] = shp[tap][d];
        a.numel *= shp[tap][d];
    }
    qcal_status st = hooks->act(hooks->user, &a);
    if (st < 0)
        return st;
    c->act_hooked[tap] = training;
    return QCAL_OK;
}

/* Gradient at a tap through the activation backward hook. */
static qcal_status tap_backward(cnn_ctx *c, cnn_tap tap, float *grad, int64_t numel)
{
    if (!c->act_hooked[tap] || !c->hooks->act_backward)
        return QCAL_OK;
    qcal_status st = c->hooks->act_backward(c->hooks->user, tap, grad, numel);
    return st < 0 ? st : QCAL_OK;
}

static qcal_status prepare_weights(cnn_ctx *c, const cnn_model *m, const cnn_hooks *hooks, bool training)
{
    for (int l = 0; l < CNN_NLAYERS; l++) {
        const float *w = m->param[2 * l];
        c->w_hooked[l] = false;
        if (hooks && hooks->weight) {
            cnn_weight wv = {.layer = (cnn_layer)l, .src = w, .dst = c->wq[l],
                             .numel = cnn_param_numel(2 * l), .training = training};
            wv.ndim = cnn_param_shape(2 * l, wv.shape);
            qcal_status st = hooks->weight(hooks->user, &wv);
            if (st < 0)
                return st;
            if (wv.used) {
                w = c->wq[l];
                c->w_hooked[l] = training;
            }
        }
        perm_ocs_to_osc(w, c->wi[l], wperm[l][0], wperm[l][1], wperm[l][2]);
    }
    return QCAL_OK;
}

static qcal_status forward(cnn_ctx *c, const cnn_model *m, const uint8_t *images, int n, const cnn_hooks *hooks,
                           bool training)
{
    const int64_t B = n;
    qcal_status st = prepare_weights(c, m, hooks, training);
    if (st != QCAL_OK)
        return st;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (B >= 64)
#endif
    for (int64_t i = 0; i < B * 784; i++)
        c->x0[i] = c->lut[images[i]];
    if ((st = run_tap(c, hooks, CNN_TAP_CONV1_IN, c->x0, B, training)) != QCAL_OK)
        return st;
    /* conv1: [B*784, 9] x [32, 9]^T -> [B*784, 32] */
    im2col3x3(c->x0, c->col1, B, 28, 28, 1);
    if ((st = sgemm('N', 'T', B * 784, 32, 9, 1.0f, c->col1, 9, c->wi[0], 9, 0.0f, c->a1, 32)) != QCAL_OK)
        return st;
    bias_relu(c->a1, m->param[CNN_CONV1_B], B * 784, 32, true);
    maxpool2(c->a1, c->p1, c->i1, B, 28, 28, 32);
    if ((st = run_tap(c, hooks, CNN_TAP_CONV2_IN, c->p1, B, training)) != QCAL_OK)
        return st;
    /* conv2: [B*196, 288] x [64, 288]^T -> [B*196, 64] */
    im2col3x3(c->p1, c->col2, B, 14, 14, 32);
    if ((st = sgemm('N', 'T', B * 196, 64, 288, 1.0f, c->col2, 288, c->wi[1], 288, 0.0f, c->a2, 64)) != QCAL_OK)
        return st;
    bias_relu(c->a2, m->param[CNN_CONV2_B], B * 196, 64, true);
    maxpool2(c->a2, c->p2, c->i2, B, 14, 14, 64);
    if ((st = run_tap(c, hooks, CNN_TAP_FC1_IN, c->p2, B, training)) != QCAL_OK)
        return st;
    /* fc1: [B, 3136] x [128, 3136]^T -> [B, 128] */
    if ((st = sgemm('N', 'T', B, 128, 3136, 1.0f, c->p2, 3136, c->wi[2], 3136, 0.0f, c->h, 128)) != QCAL_OK)
        return st;
    bias_relu(c->h, m->param[CNN_FC1_B], B, 128, true);
    if (training)
        memcpy(c->hrelu, c->h, (size_t)(B * 128) * sizeof(float));
    if ((st = run_tap(c, hooks, CNN_TAP_FC2_IN, c->h, B, training)) != QCAL_OK)
        return st;
    /* fc2: [B, 128] x [10, 128]^T -> [B, 10] */
    if ((st = sgemm('N', 'T', B, 10, 128, 1.0f, c->h, 128, c->wi[3], 128, 0.0f, c->z, 10)) != QCAL_OK)
        return st;
    bias_relu(c->z, m->param[CNN_FC2_B], B, 10, false);
    return run_tap(c, hooks, CNN_TAP_LOGITS, c->z, B, training);
}

qcal_status cnn_forward(cnn_ctx *c, const cnn_model *m, const uint8_t *images, int n, const cnn_hooks *hooks,
                        const float **logits)
{
    if (!c || !m || !images || !logits)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_forward: NULL argument");
    if (n < 1 || n > c->max_batch)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_forward: batch %d not in 1..%d", n, c->max_batch);
    qcal_status st = forward(c, m, images, n, hooks, false);
    if (st != QCAL_OK)
        return st;
    *logits = c->z;
    return QCAL_OK;
}

/* ---- Backward and Adam -------------------------------------------------------------- */

static qcal_status backward(cnn_ctx *c, const uint8_t *labels, int64_t B, float *loss)
{
    qcal_status st;
    /* Cross-entropy, mean over the batch: dz = (softmax(z) - onehot) / B. */
    double total = 0.0;
    for (int64_t i = 0; i < B; i++) {
        const float *z = c->z + i * 10;
        float *dz = c->dz + i * 10;
        float mx = z[0];
        for (int k = 1; k < 10; k++)
            mx = z[k] > mx ? z[k] : mx;
        float s = 0.0f;
        for (int k = 0; k < 10; k++) {
            dz[k] = expf(z[k] - mx);
            s += dz[k];
        }
        total += (double)(logf(s) + mx - z[labels[i]]);
        for (int k = 0; k < 10; k++)
            dz[k] = (dz[k] / s - (k == labels[i] ? 1.0f : 0.0f)) / (float)B;
    }
    *loss = (float)(total / (double)B);
    if ((st = tap_backward(c, CNN_TAP_LOGITS, c->dz, B * 10)) != QCAL_OK)
        return st;

    /* fc2 */
    if ((st = sgemm('T', 'N', 10, 128, B, 1.0f, c->dz, 10, c->h, 128, 0.0f, c->gwi[3], 128)) != QCAL_OK)
        return st;
    colsum(c, c->dz, B, 10, c->grad[CNN_FC2_B]);
    if ((st = sgemm('N', 'N', B, 128, 10, 1.0f, c->dz, 10, c->wi[3], 128, 0.0f, c->dh, 128)) != QCAL_OK)
        return st;
    if ((st = tap_backward(c, CNN_TAP_FC2_IN, c->dh, B * 128)) != QCAL_OK)
        return st;
    for (int64_t i = 0; i < B * 128; i++)
        if (!(c->hrelu[i] > 0.0f))
            c->dh[i] = 0.0f;
    /* fc1 */
    if ((st = sgemm('T', 'N', 128, 3136, B, 1.0f, c->dh, 128, c->p2, 3136, 0.0f, c->gwi[2], 3136)) != QCAL_OK)
        return st;
    colsum(c, c->dh, B, 128, c->grad[CNN_FC1_B]);
    if ((st = sgemm('N', 'N', B, 3136, 128, 1.0f, c->dh, 128, c->wi[2], 3136, 0.0f, c->dp2, 3136)) != QCAL_OK)
        return st;
    if ((st = tap_backward(c, CNN_TAP_FC1_IN, c->dp2, B * 3136)) != QCAL_OK)
        return st;
    /* pool2 + ReLU, conv2 */
    maxpool2_relu_backward(c->dp2, c->i2, c->da2, B, 14, 14, 64);
    if ((st = sgemm('T', 'N', 64, 288, B * 196, 1.0f, c->da2, 64, c->col2, 288, 0.0f, c->gwi[1], 288)) != QCAL_OK)
        return st;
    colsum(c, c->da2, B * 196, 64, c->grad[CNN_CONV2_B]);
    if ((st = sgemm('N', 'N', B * 196, 288, 64, 1.0f, c->da2, 64, c->wi[1], 288, 0.0f, c->dcol2, 288)) != QCAL_OK)
        return st;
    col2im3x3(c->dcol2, c->dp1, B, 14, 14, 32);
    if ((st = tap_backward(c, CNN_TAP_CONV2_IN, c->dp1, B * 196 * 32)) != QCAL_OK)
        return st;
    /* pool1 + ReLU, conv1 (no gradient for the input) */
    maxpool2_relu_backward(c->dp1, c->i1, c->da1, B, 28, 28, 32);
    if ((st = sgemm('T', 'N', 32, 9, B * 784, 1.0f, c->da1, 32, c->col1, 9, 0.0f, c->gwi[0], 9)) != QCAL_OK)
        return st;
    colsum(c, c->da1, B * 784, 32, c->grad[CNN_CONV1_B]);

    /* Weight gradients back to PyTorch layout, through the weight backward hooks. */
    for (int l = 0; l < CNN_NLAYERS; l++) {
        perm_osc_to_ocs(c->gwi[l], c->grad[2 * l], wperm[l][0], wperm[l][1], wperm[l][2]);
        if (c->w_hooked[l] && c->hooks->weight_backward) {
            st = c->hooks->weight_backward(c->hooks->user, (cnn_layer)l, c->grad[2 * l], cnn_param_numel(2 * l));
            if (st < 0)
                return st;
        }
    }
    return QCAL_OK;
}

/* PyTorch's Adam (torch/optim/adam.py, single-tensor path, no weight decay, no amsgrad). */
static void adam_step(cnn_ctx *c, cnn_model *m, float lr)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    c->adam_t++;
    float bc1 = 1.0f - powf(b1, (float)c->adam_t);
    float bc2 = 1.0f - powf(b2, (float)c->adam_t);
    float step = lr / bc1, bc2_sqrt = sqrtf(bc2);
    for (int i = 0; i < CNN_NPARAMS; i++) {
        float *p = m->param[i], *g = c->grad[i], *mm = c->adam_m[i], *vv = c->adam_v[i];
        int64_t n = cnn_param_numel(i);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
        for (int64_t k = 0; k < n; k++) {
            mm[k] = b1 * mm[k] + (1.0f - b1) * g[k];
            vv[k] = b2 * vv[k] + (1.0f - b2) * g[k] * g[k];
            float denom = sqrtf(vv[k]) / bc2_sqrt + eps;
            p[k] -= step * mm[k] / denom;
        }
    }
}

qcal_status cnn_compute_grad(cnn_ctx *c, const cnn_model *m, const uint8_t *images, const uint8_t *labels,
                             int n, const cnn_hooks *hooks, float *loss)
{
    if (!c || !m || !images || !labels || !loss)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_compute_grad: NULL argument");
    if (n < 1 || n > c->max_batch)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_compute_grad: batch %d not in 1..%d", n, c->max_batch);
    for (int i = 0; i < n; i++)
        if (labels[i] >= CNN_CLASSES)
            return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_compute_grad: label %d of the batch is %u", i, labels[i]);
    c->hooks = hooks;
    qcal_status st = forward(c, m, images, n, hooks, true);
    if (st != QCAL_OK)
        return st;
    float l = 0.0f;
    if ((st = backward(c, labels, n, &l)) != QCAL_OK)
        return st;
    *loss = l;
    return QCAL_OK;
}

const float *cnn_ctx_grad(const cnn_ctx *c, int i)
{
    return c && i >= 0 && i < CNN_NPARAMS ? c->grad[i] : NULL;
}

qcal_status cnn_train_step(cnn_ctx *c, cnn_model *m, const uint8_t *images, const uint8_t *labels, int n,
                           const cnn_hooks *hooks, float lr, float *loss)
{
    if (!(lr >= 0.0f) || !isfinite(lr))
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_train_step: learning rate %g", (double)lr);
    float l = 0.0f;
    qcal_status st = cnn_compute_grad(c, m, images, labels, n, hooks, &l);
    if (st != QCAL_OK)
        return st;
    if (hooks && hooks->grads && (st = hooks->grads(hooks->user, c->grad, &l)) != QCAL_OK)
        return st;
    if (!isfinite(l))
        return qcal_set_error(QCAL_ERR_NONFINITE, "cnn_train_step: loss is %g (diverged); parameters not updated",
                              (double)l);
    adam_step(c, m, lr);
    *loss = l;
    return QCAL_OK;
}

/* ---- Training loop, evaluation ------------------------------------------------------ */

double cnn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

cnn_train_opts cnn_train_opts_default(void)
{
    cnn_train_opts o = {.epochs = 3, .batch = 128, .lr = 2e-3f, .lr_decay = 0.3f, .seed = 1, .max_images = 0};
    return o;
}

void cnn_progress_stderr(void *user, const char *phase, int64_t done, int64_t total, double metric)
{
    (void)user;
    static int last_decile = -1;
    static const char *last_phase = NULL;
    if (total <= 0)
        return;
    if (isatty(STDERR_FILENO)) {
        int width = 40, fill = (int)(width * done / total);
        char bar[41];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r%-6s [%s] %3d%%  %lld/%lld  %.4f", phase, bar, (int)(100 * done / total),
                (long long)done, (long long)total, metric);
        if (done >= total)
            fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    int decile = (int)(10 * done / total);
    if (phase != last_phase || done == 0)
        last_decile = -1;
    last_phase = phase;
    if (decile != last_decile && (decile > 0 || done == 0)) {
        fprintf(stderr, "%s: %lld/%lld (%d%%) %.4f\n", phase, (long long)done, (long long)total,
                (int)(100 * done / total), metric);
        last_decile = decile;
    }
}

qcal_status cnn_train(cnn_ctx *c, cnn_model *m, const cnn_data *data, const cnn_train_opts *opts,
                      const cnn_hooks *hooks, cnn_progress_fn progress, void *progress_user)
{
    if (!c || !m || !data || !opts)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_train: NULL argument");
    if (opts->epochs < 1 || opts->batch < 1 || opts->batch > c->max_batch || !(opts->lr > 0.0f) ||
        !(opts->lr_decay > 0.0f) || opts->max_images < 0)
        return qcal_set_error(QCAL_ERR_INVALID_ARG,
                              "cnn_train: epochs %d, batch %d (ctx max %d), lr %g, lr_decay %g, max_images %lld",
                              opts->epochs, opts->batch, c->max_batch, (double)opts->lr, (double)opts->lr_decay,
                              (long long)opts->max_images);
    int64_t n = opts->max_images > 0 && opts->max_images < data->n ? opts->max_images : data->n;
    if (n < 1)
        return qcal_set_error(QCAL_ERR_EMPTY, "cnn_train: no training images");
    int64_t *order = ex_malloc((size_t)n * sizeof *order);
    uint8_t *bx = ex_malloc((size_t)opts->batch * 784);
    uint8_t *by = ex_malloc((size_t)opts->batch);
    qcal_status st = (order && bx && by) ? QCAL_OK : QCAL_ERR_NO_MEMORY;
    int64_t steps_per_epoch = (n + opts->batch - 1) / opts->batch;
    float lr = opts->lr;
    for (int e = 0; e < opts->epochs && st == QCAL_OK; e++) {
        /* Fisher-Yates with a generator seeded by (seed, epoch). */
        uint64_t s = opts->seed * 0x100000001b3ull + (uint64_t)e + 1;
        for (int64_t i = 0; i < n; i++)
            order[i] = i;
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(splitmix64(&s) % (uint64_t)(i + 1));
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double run_loss = 0.0;
        char phase[32];
        snprintf(phase, sizeof phase, "epoch %d", e + 1);
        for (int64_t step = 0; step < steps_per_epoch && st == QCAL_OK; step++) {
            int64_t i0 = step * opts->batch, bn = n - i0 < opts->batch ? n - i0 : opts->batch;
            for (int64_t i = 0; i < bn; i++) {
                memcpy(bx + i * 784, data->images + order[i0 + i] * 784, 784);
                by[i] = data->labels[order[i0 + i]];
            }
            float loss = 0.0f;
            st = cnn_train_step(c, m, bx, by, (int)bn, hooks, lr, &loss);
            run_loss = step == 0 ? loss : 0.98 * run_loss + 0.02 * loss;
            if (progress && st == QCAL_OK)
                progress(progress_user, phase, step + 1, steps_per_epoch, run_loss);
        }
        lr *= opts->lr_decay;
    }
    free(order);
    free(bx);
    free(by);
    return st;
}

qcal_status cnn_evaluate(cnn_ctx *c, const cnn_model *m, const cnn_data *data, const cnn_hooks *hooks,
                         int64_t *correct, uint8_t *preds, cnn_progress_fn progress, void *progress_user)
{
    if (!c || !m || !data || !correct)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_evaluate: NULL argument");
    if (data->n < 1)
        return qcal_set_error(QCAL_ERR_EMPTY, "cnn_evaluate: no images");
    int64_t right = 0;
    for (int64_t i0 = 0; i0 < data->n; i0 += c->max_batch) {
        int bn = (int)(data->n - i0 < c->max_batch ? data->n - i0 : c->max_batch);
        const float *z = NULL;
        qcal_status st = cnn_forward(c, m, data->images + i0 * 784, bn, hooks, &z);
        if (st != QCAL_OK)
            return st;
        for (int i = 0; i < bn; i++) {
            int best = 0;
            for (int k = 1; k < 10; k++)
                if (z[i * 10 + k] > z[i * 10 + best])
                    best = k;
            right += best == data->labels[i0 + i];
            if (preds)
                preds[i0 + i] = (uint8_t)best;
        }
        if (progress)
            progress(progress_user, "eval", i0 + bn, data->n, (double)right / (double)(i0 + bn));
    }
    *correct = right;
    return QCAL_OK;
}

/* ---- Cache ------------------------------------------------------------------------- */

/* Bump when the training code changes what a given configuration produces. */
#define CNN_CACHE_VERSION 1

static qcal_status mkdir_p(const char *dir)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return qcal_set_error(QCAL_ERR_IO, "cannot create directory '%s': %s", tmp, strerror(errno));
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return qcal_set_error(QCAL_ERR_IO, "cannot create directory '%s': %s", tmp, strerror(errno));
    return QCAL_OK;
}

qcal_status cnn_cache_path(const cnn_train_opts *o, char *buf, size_t cap)
{
    if (!o || !buf || cap == 0)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_cache_path: NULL argument");
    char dir[4096];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/qcal", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/qcal", home);
    else
        return qcal_set_error(QCAL_ERR_NOT_FOUND, "neither XDG_CACHE_HOME nor HOME is set: no cache directory");
    qcal_status st = mkdir_p(dir);
    if (st != QCAL_OK)
        return st;
    int len = snprintf(buf, cap, "%s/fmnist_cnn_v%d_e%d_b%d_lr%g_d%g_s%llu_n%lld.safetensors", dir,
                       CNN_CACHE_VERSION, o->epochs, o->batch, (double)o->lr, (double)o->lr_decay,
                       (unsigned long long)o->seed, (long long)o->max_images);
    if (len < 0 || (size_t)len >= cap)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_cache_path: buffer of %zu bytes is too small", cap);
    return QCAL_OK;
}

qcal_status cnn_load_or_train(cnn_ctx *c, const cnn_data *train, const cnn_train_opts *opts,
                              cnn_progress_fn progress, void *progress_user, cnn_model **out, bool *trained)
{
    if (!c || !train || !opts || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_load_or_train: NULL argument");
    char path[4096];
    qcal_status st = cnn_cache_path(opts, path, sizeof path);
    if (st != QCAL_OK)
        return st;
    cnn_model *m = NULL;
    if (access(path, R_OK) == 0 && cnn_model_load(path, &m) == QCAL_OK) {
        if (trained)
            *trained = false;
        *out = m;
        return QCAL_OK;
    }
    /* A missing or unreadable cache entry is rebuilt. */
    qcal_clear_error();
    if ((st = cnn_model_create(opts->seed, &m)) != QCAL_OK)
        return st;
    cnn_ctx_reset_optimizer(c);
    st = cnn_train(c, m, train, opts, NULL, progress, progress_user);
    if (st == QCAL_OK)
        st = cnn_model_save(m, path);
    if (st != QCAL_OK) {
        cnn_model_destroy(&m);
        return st;
    }
    if (trained)
        *trained = true;
    *out = m;
    return QCAL_OK;
}
