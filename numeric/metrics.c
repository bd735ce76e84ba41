/* Tensor statistics (one-pass stable, Chan's combine) and float-vs-quantized comparison
 * metrics (torch.ao.ns.fx.utils semantics), with C reference and AVX2 block kernels.
 *
 * Reduction structure (the determinism contract of include/qcal/numeric.h): the input of
 * one update call is cut into superblocks of QCAL_NUM_SUPER elements; each superblock is
 * reduced by the block kernel over QCAL_NUM_BLOCK-element blocks combined in order; the
 * superblock partials are combined in index order. Threads only decide who computes which
 * superblock, never the order of arithmetic, so any thread count gives the same bits. */
#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/cpu.h"
#include "core/internal.h"
#include "numeric/numeric_impl.h"
#include "qcal/numeric.h"
#include "qcal_config.h"

#define QCAL_NUM_BLOCK 4096
#define QCAL_NUM_SUPER 65536

static inline void blk_empty(qcal_num_blk *b)
{
    memset(b, 0, sizeof *b);
    b->min = INFINITY;
    b->max = -INFINITY;
}

/* Chan et al.: combine (n, mean, m2) of two disjoint sets; a then b. */
static inline void blk_combine(qcal_num_blk *a, const qcal_num_blk *b)
{
    a->nonfinite += b->nonfinite;
    if (b->n == 0)
        return;
    if (a->n == 0) {
        uint64_t nf = a->nonfinite;
        *a = *b;
        a->nonfinite = nf;
        return;
    }
    double na = (double)a->n, nb = (double)b->n, n = na + nb;
    double delta = b->mean - a->mean;
    a->mean += delta * (nb / n);
    a->m2 += b->m2 + delta * delta * (na * nb / n);
    a->n += b->n;
    if (b->min < a->min)
        a->min = b->min;
    if (b->max > a->max)
        a->max = b->max;
}

/* Scalar path for a block: skips non-finite values. Two passes (block sits in L1). */
void qcal_num_block_stats__c(const float *x, int64_t n, qcal_num_blk *b)
{
    blk_empty(b);
    double sum = 0;
    int64_t cnt = 0;
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (!isfinite(v)) {
            b->nonfinite++;
            continue;
        }
        cnt++;
        sum += v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    if (cnt == 0)
        return;
    double mean = sum / (double)cnt, m2 = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            continue;
        double d = (double)x[i] - mean;
        m2 += d * d;
    }
    b->n = cnt;
    b->mean = mean;
    b->m2 = m2;
    b->min = mn;
    b->max = mx;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
static inline double hsum_pd(__m256d v)
{
    __m128d lo = _mm256_castpd256_pd128(v), hi = _mm256_extractf128_pd(v, 1);
    lo = _mm_add_pd(lo, hi);
    return _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
}

/* AVX2: 8 floats per step; sums in double (4 accumulators); blocks containing a
 * non-finite value fall back to the C reference. */
__attribute__((target("avx2,fma")))
void qcal_num_block_stats__avx2(const float *x, int64_t n, qcal_num_blk *b)
{
    if (n < 16) {
        qcal_num_block_stats__c(x, n, b);
        return;
    }
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 vmn = _mm256_set1_ps(INFINITY), vmx = _mm256_set1_ps(-INFINITY);
    __m256 bad = _mm256_setzero_ps();
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_NLT_UQ));
        vmn = _mm256_min_ps(vmn, v);
        vmx = _mm256_max_ps(vmx, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    if (_mm256_movemask_ps(bad)) {
        qcal_num_block_stats__c(x, n, b);
        return;
    }
    float mn[8], mx[8];
    _mm256_storeu_ps(mn, vmn);
    _mm256_storeu_ps(mx, vmx);
    double sum = hsum_pd(_mm256_add_pd(s0, s1));
    float fmn = mn[0], fmx = mx[0];
    for (int k = 1; k < 8; k++) {
        fmn = mn[k] < fmn ? mn[k] : fmn;
        fmx = mx[k] > fmx ? mx[k] : fmx;
    }
    for (int64_t j = i; j < n; j++) {
        if (!isfinite(x[j])) {
            qcal_num_block_stats__c(x, n, b);
            return;
        }
        sum += x[j];
        fmn = x[j] < fmn ? x[j] : fmn;
        fmx = x[j] > fmx ? x[j] : fmx;
    }
    double mean = sum / (double)n;
    __m256d vm = _mm256_set1_pd(mean);
    __m256d q0 = _mm256_setzero_pd(), q1 = _mm256_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vm);
        __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vm);
        q0 = _mm256_fmadd_pd(d0, d0, q0);
        q1 = _mm256_fmadd_pd(d1, d1, q1);
    }
    double m2 = hsum_pd(_mm256_add_pd(q0, q1));
    for (; i < n; i++) {
        double d = (double)x[i] - mean;
        m2 += d * d;
    }
    b->n = n;
    b->nonfinite = 0;
    b->mean = mean;
    b->m2 = m2;
    b->min = fmn;
    b->max = fmx;
}
#else
void qcal_num_block_stats__avx2(const float *x, int64_t n, qcal_num_blk *b)
{
    qcal_num_block_stats__c(x, n, b);
}
#endif

/* Metrics block kernel, C reference. d = x - y is computed in float32 as torch does. */
void qcal_num_block_metrics__c(const float *x, const float *y, int64_t n, qcal_numeric_metric_acc *a)
{
    memset(a, 0, sizeof *a);
    for (int64_t i = 0; i < n; i++) {
        float xv = x[i], yv = y[i];
        if (!isfinite(xv) || !isfinite(yv)) {
            a->nonfinite++;
            continue;
        }
        float d = xv - yv;
        a->count++;
        a->sxx += (double)xv * xv;
        a->syy += (double)yv * yv;
        a->sxy += (double)xv * yv;
        a->sdd += (double)d * d;
        double ad = fabs((double)d);
        a->max_abs_err = ad > a->max_abs_err ? ad : a->max_abs_err;
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
void qcal_num_block_metrics__avx2(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 bad = _mm256_setzero_ps();
    __m128 vmax = _mm_setzero_ps();
    __m256d xx = _mm256_setzero_pd(), yy = _mm256_setzero_pd(), xy = _mm256_setzero_pd(),
            dd = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 xv = _mm_loadu_ps(x + i), yv = _mm_loadu_ps(y + i);
        __m128 d = _mm_sub_ps(xv, yv);
        __m256 both = _mm256_set_m128(yv, xv);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(both, absmask), inf, _CMP_NLT_UQ));
        vmax = _mm_max_ps(vmax, _mm_and_ps(d, _mm256_castps256_ps128(absmask)));
        __m256d xd = _mm256_cvtps_pd(xv), yd = _mm256_cvtps_pd(yv), ddd = _mm256_cvtps_pd(d);
        xx = _mm256_fmadd_pd(xd, xd, xx);
        yy = _mm256_fmadd_pd(yd, yd, yy);
        xy = _mm256_fmadd_pd(xd, yd, xy);
        dd = _mm256_fmadd_pd(ddd, ddd, dd);
    }
    if (_mm256_movemask_ps(bad)) {
        qcal_num_block_metrics__c(x, y, n, a);
        return;
    }
    qcal_numeric_metric_acc t;
    qcal_num_block_metrics__c(x + i, y + i, n - i, &t);
    if (t.nonfinite) {
        qcal_num_block_metrics__c(x, y, n, a);
        return;
    }
    float m[4];
    _mm_storeu_ps(m, vmax);
    double mx = t.max_abs_err;
    for (int k = 0; k < 4; k++)
        mx = m[k] > mx ? m[k] : mx;
    a->count = n;
    a->nonfinite = 0;
    a->sxx = hsum_pd(xx) + t.sxx;
    a->syy = hsum_pd(yy) + t.syy;
    a->sxy = hsum_pd(xy) + t.sxy;
    a->sdd = hsum_pd(dd) + t.sdd;
    a->max_abs_err = mx;
}
#else
void qcal_num_block_metrics__avx2(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a)
{
    qcal_num_block_metrics__c(x, y, n, a);
}
#endif

static void acc_add(qcal_numeric_metric_acc *d, const qcal_numeric_metric_acc *s)
{
    d->count += s->count;
    d->nonfinite += s->nonfinite;
    d->sxx += s->sxx;
    d->syy += s->syy;
    d->sxy += s->sxy;
    d->sdd += s->sdd;
    if (s->max_abs_err > d->max_abs_err)
        d->max_abs_err = s->max_abs_err;
}

/* ---- superblock drivers --------------------------------------------------------------- */

static void super_stats(const float *x, int64_t n, qcal_num_blk *out, qcal_isa isa)
{
    blk_empty(out);
    for (int64_t i = 0; i < n; i += QCAL_NUM_BLOCK) {
        int64_t m = n - i < QCAL_NUM_BLOCK ? n - i : QCAL_NUM_BLOCK;
        qcal_num_blk b;
        if (isa >= QCAL_ISA_AVX2)
            qcal_num_block_stats__avx2(x + i, m, &b);
        else
            qcal_num_block_stats__c(x + i, m, &b);
        blk_combine(out, &b);
    }
}

static void super_metrics(const float *x, const float *y, int64_t n, qcal_numeric_metric_acc *out,
                          qcal_isa isa)
{
    memset(out, 0, sizeof *out);
    for (int64_t i = 0; i < n; i += QCAL_NUM_BLOCK) {
        int64_t m = n - i < QCAL_NUM_BLOCK ? n - i : QCAL_NUM_BLOCK;
        qcal_numeric_metric_acc b;
        if (isa >= QCAL_ISA_AVX2)
            qcal_num_block_metrics__avx2(x + i, y + i, m, &b);
        else
            qcal_num_block_metrics__c(x + i, y + i, m, &b);
        acc_add(out, &b);
    }
}

qcal_status qcal_num_stats_blk(const float *x, int64_t n, qcal_num_blk *out)
{
    qcal_isa isa = qcal_cpu_isa();
    int64_t nsb = (n + QCAL_NUM_SUPER - 1) / QCAL_NUM_SUPER;
    int threads = qcal_threads_for(n);
    blk_empty(out);
    if (threads <= 1 || nsb <= 1) {
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            qcal_num_blk b;
            super_stats(x + off, m, &b, isa);
            blk_combine(out, &b);
        }
        return QCAL_OK;
    }
    qcal_num_blk *part = qcal_malloc((size_t)nsb * sizeof *part);
    if (!part)
        return QCAL_ERR_NO_MEMORY;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t s = 0; s < nsb; s++) {
        int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
        super_stats(x + off, m, &part[s], isa);
    }
    for (int64_t s = 0; s < nsb; s++)
        blk_combine(out, &part[s]);
    free(part);
    return QCAL_OK;
}

/* ---- public: statistics ----------------------------------------------------------------- */

qcal_status qcal_numeric_stats_init(qcal_numeric_stats *s)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_init: NULL");
    memset(s, 0, sizeof *s);
    s->min = INFINITY;
    s->max = -INFINITY;
    return QCAL_OK;
}

static void stats_from_blk(qcal_numeric_stats *s, const qcal_num_blk *b)
{
    s->count = b->n;
    s->nonfinite = b->nonfinite;
    s->min = b->min;
    s->max = b->max;
    s->mean = b->n ? b->mean : 0;
    s->m2 = b->n ? b->m2 : 0;
    s->absmax = b->n ? fmaxf(fabsf(b->min), fabsf(b->max)) : 0.0f;
}

static void blk_from_stats(qcal_num_blk *b, const qcal_numeric_stats *s)
{
    b->n = s->count;
    b->nonfinite = s->nonfinite;
    b->min = s->min;
    b->max = s->max;
    b->mean = s->mean;
    b->m2 = s->m2;
}

qcal_status qcal_numeric_stats_merge(qcal_numeric_stats *dst, const qcal_numeric_stats *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_merge: NULL argument");
    if (dst->count < 0 || src->count < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_merge: negative count");
    qcal_num_blk a, b;
    blk_from_stats(&a, dst);
    blk_from_stats(&b, src);
    blk_combine(&a, &b);
    stats_from_blk(dst, &a);
    return QCAL_OK;
}

qcal_status qcal_numeric_stats_update(qcal_numeric_stats *s, const float *x, int64_t n)
{
    if (!s || n < 0 || (n > 0 && !x))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_update: bad arguments (n %lld)",
                          (long long)n);
    if (n == 0)
        return QCAL_OK;
    qcal_num_blk b;
    qcal_status st = qcal_num_stats_blk(x, n, &b);
    if (st != QCAL_OK)
        return st;
    qcal_numeric_stats t;
    stats_from_blk(&t, &b);
    return qcal_numeric_stats_merge(s, &t);
}

qcal_status qcal_numeric_stats_std(const qcal_numeric_stats *s, double *std)
{
    if (!s || !std)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_std: NULL argument");
    *std = s->count > 1 ? sqrt(s->m2 / (double)(s->count - 1)) : 0.0;
    return QCAL_OK;
}

/* ---- public: metrics ------------------------------------------------------------------ */

qcal_status qcal_numeric_metric_acc_init(qcal_numeric_metric_acc *acc)
{
    if (!acc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_init: NULL");
    memset(acc, 0, sizeof *acc);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_merge(qcal_numeric_metric_acc *dst, const qcal_numeric_metric_acc *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_merge: NULL argument");
    acc_add(dst, src);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_update(qcal_numeric_metric_acc *acc, const float *x, const float *y,
                                   int64_t n)
{
    if (!acc || n < 0 || (n > 0 && (!x || !y)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_update: bad arguments (n %lld)",
                          (long long)n);
    qcal_isa isa = qcal_cpu_isa();
    int64_t nsb = (n + QCAL_NUM_SUPER - 1) / QCAL_NUM_SUPER;
    int threads = qcal_threads_for(n);
    qcal_numeric_metric_acc tot;
    memset(&tot, 0, sizeof tot);
    if (threads <= 1 || nsb <= 1) {
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            qcal_numeric_metric_acc b;
            super_metrics(x + off, y + off, m, &b, isa);
            acc_add(&tot, &b);
        }
    } else {
        qcal_numeric_metric_acc *part = qcal_malloc((size_t)nsb * sizeof *part);
        if (!part)
            return QCAL_ERR_NO_MEMORY;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            super_metrics(x + off, y + off, m, &part[s], isa);
        }
        for (int64_t s = 0; s < nsb; s++)
            acc_add(&tot, &part[s]);
        free(part);
    }
    acc_add(acc, &tot);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_result(const qcal_numeric_metric_acc *acc, qcal_numeric_metrics *out)
{
    if (!acc || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_result: NULL argument");
    if (acc->count == 0)
        return qcal_error(QCAL_ERR_EMPTY, "no finite element pair to compare (%llu non-finite)",
                          (unsigned long long)acc->nonfinite);
    qcal_numeric_metrics m;
    m.count = acc->count;
    m.nonfinite = acc->nonfinite;
    m.max_abs_err = acc->max_abs_err;
    /* sqnr = 20 log10(sqrt(sxx) / sqrt(sdd)), the ratio of norms as compute_sqnr */
    if (acc->sdd == 0)
        m.sqnr_db = INFINITY;
    else if (acc->sxx == 0)
        m.sqnr_db = -INFINITY;
    else
        m.sqnr_db = 20.0 * log10(sqrt(acc->sxx) / sqrt(acc->sdd));
    if (acc->sdd == 0)
        m.l2 = 0;
    else if (acc->sxx == 0)
        m.l2 = INFINITY;
    else
        m.l2 = sqrt(acc->sdd / acc->sxx);
    double den = sqrt(acc->sxx) * sqrt(acc->syy);
    m.cosine = acc->sxy / (den > 1e-8 ? den : 1e-8);
    *out = m;
    return QCAL_OK;
}

qcal_status qcal_numeric_compare_f32(const float *x, const float *y, int64_t n, qcal_numeric_metrics *out)
{
    if (n < 1)
        return qcal_error(QCAL_ERR_EMPTY, "qcal_numeric_compare_f32: %lld elements", (long long)n);
    qcal_numeric_metric_acc acc;
    qcal_numeric_metric_acc_init(&acc);
    qcal_status s = qcal_numeric_metric_acc_update(&acc, x, y, n);
    if (s != QCAL_OK)
        return s;
    return qcal_numeric_metric_acc_result(&acc, out);
}
