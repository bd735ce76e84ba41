/* unit.fakequant: fake-quant kernels against PyTorch 1.13 reference vectors
 * (tests/data/fakequant/kernels.bin from tests/ref/gen_fakequant.py), SIMD against the C
 * reference, thread-count independence, in-place use and argument checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/cpu.h"
#include "fakequant/fakequant_impl.h"
#include "qcal/fakequant.h"
#include "qcal_config.h"
#include "testutil.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

/* ---- reference file ---- */

typedef struct ref_case {
    char name[64];
    uint32_t kind;
    int32_t axis;
    int64_t qmin, qmax;
    float grad_factor;
    qcal_tensor t;      /* shape; data = x */
    int64_t numel, nch;
    float *x, *scale, *zp, *y, *gy, *gx, *gs, *gz;
    uint8_t *mask;
} ref_case;

typedef struct ref_file {
    uint8_t *buf;
    size_t len;
    ref_case cases[64];
    int ncases;
} ref_file;

static const uint8_t *take(const uint8_t **p, const uint8_t *end, size_t n)
{
    assert_true((size_t)(end - *p) >= n);
    const uint8_t *r = *p;
    *p += n;
    return r;
}

static uint32_t rd_u32(const uint8_t **p, const uint8_t *end)
{
    uint32_t v;
    memcpy(&v, take(p, end, 4), 4);
    return v;
}

static int64_t rd_i64(const uint8_t **p, const uint8_t *end)
{
    int64_t v;
    memcpy(&v, take(p, end, 8), 8);
    return v;
}

static float *rd_f32s(const uint8_t **p, const uint8_t *end, int64_t n)
{
    /* The buffer is malloc-aligned and every array is a multiple of 4 bytes after the
     * 4-byte-aligned header fields, except after mask bytes: copy to be safe. */
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(v);
    memcpy(v, take(p, end, (size_t)n * 4), (size_t)n * 4);
    return v;
}

static void load_refs(ref_file *rf)
{
    const char *dir = getenv("QCAL_TEST_DATA");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/fakequant/kernels.bin", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    rf->buf = malloc((size_t)len);
    assert_non_null(rf->buf);
    assert_int_equal(fread(rf->buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    rf->len = (size_t)len;
    const uint8_t *p = rf->buf, *end = rf->buf + len;
    assert_memory_equal(take(&p, end, 4), "QFQK", 4);
    assert_int_equal(rd_u32(&p, end), 1);
    rf->ncases = (int)rd_u32(&p, end);
    assert_true(rf->ncases > 0 && rf->ncases <= 64);
    for (int c = 0; c < rf->ncases; c++) {
        ref_case *r = &rf->cases[c];
        uint32_t nl = rd_u32(&p, end);
        assert_true(nl < sizeof r->name);
        memcpy(r->name, take(&p, end, nl), nl);
        r->name[nl] = 0;
        r->kind = rd_u32(&p, end);
        r->axis = (int32_t)rd_u32(&p, end);
        r->qmin = rd_i64(&p, end);
        r->qmax = rd_i64(&p, end);
        memcpy(&r->grad_factor, take(&p, end, 4), 4);
        uint32_t ndim = rd_u32(&p, end);
        assert_true(ndim <= QCAL_MAX_DIMS);
        int64_t shape[QCAL_MAX_DIMS];
        for (uint32_t d = 0; d < ndim; d++)
            shape[d] = rd_i64(&p, end);
        r->nch = rd_u32(&p, end);
        assert_int_equal(qcal_tensor_init(&r->t, (const float *)rf->buf, (int32_t)ndim, shape), QCAL_OK);
        assert_int_equal(qcal_tensor_numel(&r->t, &r->numel), QCAL_OK);
        r->x = rd_f32s(&p, end, r->numel);
        r->t.data = r->x;
        r->scale = rd_f32s(&p, end, r->nch);
        r->zp = rd_f32s(&p, end, r->nch);
        r->y = rd_f32s(&p, end, r->numel);
        r->mask = malloc((size_t)r->numel);
        memcpy(r->mask, take(&p, end, (size_t)r->numel), (size_t)r->numel);
        r->gy = rd_f32s(&p, end, r->numel);
        r->gx = rd_f32s(&p, end, r->numel);
        r->gs = rd_f32s(&p, end, r->nch);
        r->gz = rd_f32s(&p, end, r->nch);
    }
    assert_true(p == end);
}

static void free_refs(ref_file *rf)
{
    for (int c = 0; c < rf->ncases; c++) {
        ref_case *r = &rf->cases[c];
        free(r->x); free(r->scale); free(r->zp); free(r->y); free(r->mask);
        free(r->gy); free(r->gx); free(r->gs); free(r->gz);
    }
    free(rf->buf);
}

static int setup(void **state)
{
    ref_file *rf = calloc(1, sizeof *rf);
    load_refs(rf);
    *state = rf;
    return 0;
}

static int teardown(void **state)
{
    free_refs(*state);
    free(*state);
    return 0;
}

/* ---- helpers ---- */

static void set_isa(const char *isa)
{
    setenv("QCAL_ISA", isa, 1);
    qcal_cpu_reset();
}

static const char *const isas[] = { "c", "avx2", "avx512" };

static uint32_t bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* Bit-exact comparison; prints the first differing element and fails. */
static void expect_bits(const char *what, const char *name, const float *got, const float *want,
                        int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (bits(got[i]) != bits(want[i])) {
            print_error("%s %s: element %lld differs: got %.9g (0x%08x), want %.9g (0x%08x)\n",
                        name, what, (long long)i, (double)got[i], bits(got[i]),
                        (double)want[i], bits(want[i]));
            fail();
        }
    }
}

static void expect_mask(const char *name, const uint8_t *got, const uint8_t *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            print_error("%s mask: element %lld got %u want %u\n", name, (long long)i, got[i],
                        want[i]);
            fail();
        }
    }
}

/* Relative comparison with the worst element reported: |a-b| <= rtol * max(|b|, floor). */
static void expect_close(const char *what, const char *name, const float *got,
                         const float *want, int64_t n, double rtol, double floor)
{
    double worst = 0.0;
    int64_t wi = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double tol = rtol * fmax(fabs((double)want[i]), floor);
        if (d / tol > worst) {
            worst = d / tol;
            wi = i;
        }
    }
    if (worst > 1.0) {
        print_error("%s %s: worst element %lld got %.9g want %.9g (%.3g x tolerance)\n", name,
                    what, (long long)wi, (double)got[wi], (double)want[wi], worst);
        fail();
    }
}

/* PyTorch 1.13 defect: +Inf and x/scale >= 2^63 come out as quant_min; qcal gives
 * quant_max (documented in qcal/fakequant.h). Patches the expected output. */
static void patch_expected(const ref_case *r, int64_t i, float scale, float zp, float *want)
{
    float t = r->x[i] * (1.0f / scale);
    if (isnan(r->x[i])) {
        /* NaN policy (qcal/fakequant.h): NaN -> the zero-point, y = +0.0; PyTorch 1.13 gives
         * quant_min. */
        float torch_val = ((float)r->qmin - zp) * scale;
        assert_true(bits(r->y[i]) == bits(torch_val));
        *want = 0.0f;
    } else if (t >= 9.2233720368547758e18f) {
        float torch_val = ((float)r->qmin - zp) * scale;
        assert_true(bits(r->y[i]) == bits(torch_val));   /* PyTorch really says quant_min */
        *want = ((float)r->qmax - zp) * scale;
    }
}

static int64_t channel_of(const ref_case *r, int64_t i)
{
    int32_t ax;
    assert_int_equal(qcal_tensor_axis(&r->t, r->axis, &ax), QCAL_OK);
    int64_t inner = 1;
    for (int32_t d = ax + 1; d < r->t.ndim; d++)
        inner *= r->t.shape[d];
    return (i / inner) % r->t.shape[ax];
}

/* ---- golden tests ---- */

static void golden_fixed(const ref_case *r, const char *isa)
{
    int64_t n = r->numel;
    float *y = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *gx = malloc((size_t)n * 4);
    float *y2 = malloc((size_t)n * 4), *gx2 = malloc((size_t)n * 4);
    uint8_t *m = malloc((size_t)n);
    int32_t *zpi = malloc((size_t)r->nch * sizeof *zpi);
    for (int64_t c = 0; c < r->nch; c++)
        zpi[c] = (int32_t)r->zp[c];
    memcpy(want, r->y, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        int64_t c = r->kind == 0 ? 0 : channel_of(r, i);
        patch_expected(r, i, r->scale[c], r->zp[c], &want[i]);
    }
    char name[96];
    snprintf(name, sizeof name, "%s [%s]", r->name, isa);
    qcal_status st;
    if (r->kind == 0) {
        st = qcal_fakequant_forward(tu_vec(r->x, n), tu_fq(r->scale[0], zpi[0], r->qmin, r->qmax),
                                    tu_out(y, n), m);
        assert_int_equal(st, QCAL_OK);
        st = qcal_fakequant_fused(tu_vec(r->x, n), tu_vec(r->gy, n),
                                  tu_fq(r->scale[0], zpi[0], r->qmin, r->qmax), tu_out(y2, n),
                                  tu_out(gx2, n));
    } else {
        st = qcal_fakequant_forward(&r->t, tu_fqc(&r->t, r->axis, r->scale, zpi, r->qmin, r->qmax),
                                    tu_out(y, tu_numel(&r->t)), m);
        assert_int_equal(st, QCAL_OK);
        st = qcal_fakequant_fused(&r->t, tu_vec(r->gy, tu_numel(&r->t)),
                                  tu_fqc(&r->t, r->axis, r->scale, zpi, r->qmin, r->qmax),
                                  tu_out(y2, tu_numel(&r->t)), tu_out(gx2, tu_numel(&r->t)));
    }
    assert_int_equal(st, QCAL_OK);
    expect_bits("forward", name, y, want, n);
    expect_mask(name, m, r->mask, n);
    assert_int_equal(qcal_fakequant_backward(tu_vec(r->gy, n), m, tu_out(gx, n)), QCAL_OK);
    expect_bits("backward", name, gx, r->gx, n);
    expect_bits("fused forward", name, y2, want, n);
    expect_bits("fused backward", name, gx2, r->gx, n);
    free(y); free(want); free(gx); free(y2); free(gx2); free(m); free(zpi);
}

static void golden_learnable(const ref_case *r, const char *isa)
{
    int64_t n = r->numel;
    float *y = malloc((size_t)n * 4), *gx = malloc((size_t)n * 4);
    float *gs = malloc((size_t)r->nch * 4), *gz = malloc((size_t)r->nch * 4);
    char name[96];
    snprintf(name, sizeof name, "%s [%s]", r->name, isa);
    if (r->kind == 2) {
        assert_int_equal(qcal_fakequant_learnable_forward(tu_vec(r->x, n),
                                                          tu_lsq(r->scale[0], r->zp[0], r->qmin, r->qmax),
                                                          tu_out(y, n), NULL),
                         QCAL_OK);
        assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(r->x, n), tu_vec(r->gy, n),
                                                           tu_lsq(r->scale[0], r->zp[0], r->qmin, r->qmax),
                                                           r->grad_factor, tu_out(gx, n), gs, gz),
                         QCAL_OK);
    } else {
        assert_int_equal(qcal_fakequant_learnable_forward(&r->t,
                                                          tu_lsqc(&r->t, r->axis, r->scale, r->zp, r->qmin, r->qmax),
                                                          tu_out(y, tu_numel(&r->t)), NULL),
                         QCAL_OK);
        assert_int_equal(qcal_fakequant_learnable_backward(&r->t, tu_vec(r->gy, tu_numel(&r->t)),
                                                           tu_lsqc(&r->t, r->axis, r->scale, r->zp, r->qmin, r->qmax),
                                                           r->grad_factor,
                                                           tu_out(gx, tu_numel(&r->t)), gs, gz),
                         QCAL_OK);
        if (r->nch == 1) {
            /* One channel: the per-tensor backward must agree (negative zero-points: the
             * per-channel op is PyTorch's correctly rounded reference). */
            float gs1, gz1;
            assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(r->x, n), tu_vec(r->gy, n), tu_lsq(r->scale[0], r->zp[0], r->qmin, r->qmax), r->grad_factor, tu_out(gx, n), &gs1, &gz1),
                             QCAL_OK);
            expect_close("per-tensor grad_scale", name, &gs1, r->gs, 1, 1e-5, 1e-3);
            expect_close("per-tensor grad_zero_point", name, &gz1, r->gz, 1, 1e-5, 1e-3);
        }
    }
    /* NaN policy (qcal/fakequant.h): a NaN input gives y = +0.0 and no d_scale / d_zp term;
     * PyTorch 1.13 treats it as below quant_min (y = (quant_min - zp) * scale, d_scale =
     * dy * (quant_min - zp) * g, d_zp = -dy * scale * g). Patch those out of the reference. */
    float *want = malloc((size_t)n * 4), *wgs = malloc((size_t)r->nch * 4),
          *wgz = malloc((size_t)r->nch * 4);
    memcpy(want, r->y, (size_t)n * 4);
    double *adj_s = calloc((size_t)r->nch, sizeof *adj_s), *adj_z = calloc((size_t)r->nch, sizeof *adj_z);
    int nans = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isnan(r->x[i]))
            continue;
        int64_t c = r->kind == 2 ? 0 : channel_of(r, i);
        float zr = (float)qcal_fq_round_zero_point(r->zp[c], r->qmin, r->qmax);
        assert_int_equal(bits(r->y[i]), bits(((float)r->qmin - zr) * r->scale[c]));
        want[i] = 0.0f;
        adj_s[c] += (double)(r->gy[i] * ((float)r->qmin - zr) * r->grad_factor);
        adj_z[c] += (double)(-r->gy[i] * r->scale[c] * r->grad_factor);
        nans++;
    }
    for (int64_t c = 0; c < r->nch; c++) {
        wgs[c] = (float)((double)r->gs[c] - adj_s[c]);
        wgz[c] = (float)((double)r->gz[c] - adj_z[c]);
    }
    if (!strcmp(r->name, "lpt_nonfinite"))
        assert_int_equal(nans, 1);   /* the patch above is exercised */
    expect_bits("learnable forward", name, y, want, n);
    expect_bits("learnable grad_x", name, gx, r->gx, n);
    /* Sums: PyTorch sums in float; qcal in double. Relative 1e-5 of the larger of the value
     * and 1e-3 x the sum of |terms| scale (grad sums can cancel to ~0). */
    expect_close("grad_scale", name, gs, wgs, r->nch, 1e-5, 1e-2);
    expect_close("grad_zero_point", name, gz, wgz, r->nch, 1e-5, 1e-2);
    free(want); free(wgs); free(wgz); free(adj_s); free(adj_z);
    free(y); free(gx); free(gs); free(gz);
}

static void test_golden(void **state)
{
    ref_file *rf = *state;
    int fixed = 0, learnable = 0;
    for (int k = 0; k < 3; k++) {
        set_isa(isas[k]);
        for (int c = 0; c < rf->ncases; c++) {
            const ref_case *r = &rf->cases[c];
            if (r->kind <= 1) {
                golden_fixed(r, isas[k]);
                fixed++;
            } else {
                golden_learnable(r, isas[k]);
                learnable++;
            }
        }
    }
    unsetenv("QCAL_ISA");
    qcal_cpu_reset();
    assert_true(fixed >= 3 * 20);
    assert_true(learnable >= 3 * 10);
}

/* ---- SIMD vs C on random data with canaries ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(float lo, float hi)
{
    return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f;
}

static void fill_hostile(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t k = rnd() % 16;
        if (k == 0)
            x[i] = ((float)(int)(rnd() % 600) - 300.0f + 0.5f) * scale;   /* exact ties */
        else if (k == 1)
            x[i] = (rnd() & 1) ? NAN : ((rnd() & 1) ? INFINITY : -INFINITY);
        else if (k == 2)
            x[i] = (rnd() & 1) ? 1e30f : -0.0f;
        else
            x[i] = rndf(-5.0f, 5.0f);
    }
}

#define CANARY 0x5au

/* The C reference kernels (every ISA version is checked against them bit for bit in
 * tests/checkasm.c): fused == forward + backward, the NaN policy on hostile values, nothing
 * written past n. */
static void test_c_reference(void **state)
{
    (void)state;
    const int64_t sizes[] = { 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099 };
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *x = malloc((size_t)n * 4), *gy = malloc((size_t)n * 4);
        fill_hostile(x, n, 0.037f);
        for (int64_t i = 0; i < n; i++)
            gy[i] = rndf(-2.0f, 2.0f);
        qcal_fq_run p;
        qcal_fq_run_init(&p, 0.037f, 7, -8, 120);
        float *y = malloc((size_t)(n + 16) * 4), *g = malloc((size_t)(n + 16) * 4);
        float *gb = malloc((size_t)(n + 16) * 4), *y2 = malloc((size_t)n * 4);
        uint8_t *m = malloc((size_t)n + 16);
        memset(y, CANARY, (size_t)(n + 16) * 4);
        memset(g, CANARY, (size_t)(n + 16) * 4);
        memset(gb, CANARY, (size_t)(n + 16) * 4);
        memset(m, CANARY, (size_t)n + 16);
        qcal_f32_fakequant__c(x, n, &p, y, m, false);
        qcal_f32_fakequant_backward__c(gy, m, n, gb, false);
        qcal_f32_fakequant_fused__c(x, gy, n, &p, y2, g, false);
        expect_bits("fused vs forward (c)", "c", y2, y, n);
        expect_bits("fused grad vs backward (c)", "c", g, gb, n);
        for (int j = 0; j < 16; j++) {   /* nothing written past n */
            assert_int_equal(m[n + j], CANARY);
            assert_int_equal(bits(y[n + j]), 0x5a5a5a5au);
            assert_int_equal(bits(g[n + j]), 0x5a5a5a5au);
            assert_int_equal(bits(gb[n + j]), 0x5a5a5a5au);
        }
        /* Hostile values (the NaN policy): NaN -> the zero-point (+0.0), -Inf -> quant_min,
         * +Inf and 1e30 -> quant_max, mask 0. */
        for (int64_t i = 0; i < n; i++) {
            if (isnan(x[i]) || isinf(x[i]) || x[i] == 1e30f) {
                float want = isnan(x[i]) ? 0.0f
                                         : ((x[i] > 0.0f) ? 120.0f - 7.0f : -8.0f - 7.0f) * 0.037f;
                assert_int_equal(bits(y[i]), bits(want));
                assert_int_equal(m[i], 0);
            }
        }
        free(y); free(g); free(gb); free(y2); free(m);
        free(x);
        free(gy);
    }
}

/* The LSQ backward C reference (every ISA version is checked against it in
 * tests/checkasm.c) against a direct per-element evaluation; the fixed lane order. */
static void test_lsq_reference(void **state)
{
    (void)state;
    const int64_t sizes[] = { 1, 7, 15, 16, 17, 31, 32, 33, 100, 1000, 4099 };
    qcal_lsq_run p = { .scale = 0.037f, .inv_scale = 1.0f / 0.037f, .zp = 7.0f,
                       .qmin = -8.0f, .qmax = 120.0f, .grad_factor = 0.01f };
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int64_t n = sizes[si];
        float *x = malloc((size_t)n * 4), *gy = malloc((size_t)n * 4);
        float *gref = malloc((size_t)n * 4);
        fill_hostile(x, n, 0.037f);
        for (int64_t i = 0; i < n; i++)
            gy[i] = rndf(-2.0f, 2.0f);
        double init_s[QCAL_LSQ_LANES], init_z[QCAL_LSQ_LANES];
        for (int l = 0; l < QCAL_LSQ_LANES; l++) {
            init_s[l] = rndf(-1.0f, 1.0f) * 1e-3;
            init_z[l] = rndf(-1.0f, 1.0f) * 1e-3;
        }
        double rs[QCAL_LSQ_LANES], rz[QCAL_LSQ_LANES];
        memcpy(rs, init_s, sizeof rs);
        memcpy(rz, init_z, sizeof rz);
        qcal_f32_lsq_backward__c(x, gy, n, &p, gref, rs, rz, false);
        /* Direct evaluation of the documented formulas for lane 0's first element and the
         * element count per lane. */
        {
            float q = nearbyintf(fmaf(x[0], p.inv_scale, p.zp));
            bool in = q >= p.qmin && q <= p.qmax;
            assert_int_equal(bits(gref[0]), bits(gy[0] * (in ? 1.0f : 0.0f)));
            /* NaN policy: a NaN q contributes no d_scale (y is the constant 0.0). */
            float ds = isnan(q) ? 0.0f
                       : in ? gy[0] * fmaf(q - p.zp, p.scale, -x[0]) * p.inv_scale * p.grad_factor
                            : gy[0] * ((q >= p.qmin ? p.qmax : p.qmin) - p.zp) * p.grad_factor;
            if (n <= 16 && !isnan(ds))
                assert_true(rs[0] == init_s[0] + (double)ds);
        }
        free(x); free(gy); free(gref);
    }
    /* Lane combination order is fixed: ((l0 + l8) + (l4 + l12)) + ... */
    double lanes[QCAL_LSQ_LANES] = { 1e16, 1, 1, 1, 1, 1, 1, 1, -1e16, 1, 1, 1, 1, 1, 1, 1 };
    assert_true(qcal_lsq_lanes_sum(lanes) == 14.0);
}

/* Tensors larger than half the L3 go through the streaming paths (per call): same bits
 * as the C reference for every ISA and 1 / 2 threads, outputs one float off alignment. */
static void test_large_streaming(void **state)
{
    (void)state;
    int64_t shape[3] = { 8, 64, 6151 };
    const int64_t n = 8 * 64 * 6151;
    if (!qcal_cpu_stream_stores(n * 12))
        print_message("note: this machine's cache is large: %lld elements do not stream\n",
                      (long long)n);
    float *xb = malloc((size_t)(n + 1) * 4), *gyb = malloc((size_t)(n + 1) * 4);
    float *yb = malloc((size_t)(n + 1) * 4), *gb = malloc((size_t)(n + 1) * 4);
    float *yref = malloc((size_t)n * 4), *gref = malloc((size_t)n * 4);
    float *lref = malloc((size_t)n * 4);
    uint8_t *m = malloc((size_t)n + 1), *mref = malloc((size_t)n);
    float *x = xb + 1, *gy = gyb + 1, *y = yb + 1, *g = gb + 1;
    fill_hostile(x, n, 0.02f);
    for (int64_t i = 0; i < n; i++)
        gy[i] = rndf(-1.0f, 1.0f);
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 3, shape), QCAL_OK);
    float pcs[64], pcz[64];
    for (int c = 0; c < 64; c++) {
        pcs[c] = rndf(0.01f, 0.05f);
        pcz[c] = rndf(-20.0f, 20.0f);
    }
    qcal_fq_run p;
    qcal_fq_run_init(&p, 0.02f, 3, -128, 127);
    qcal_f32_fakequant__c(x, n, &p, yref, mref, false);
    qcal_f32_fakequant_fused__c(x, gy, n, &p, y, gref, false);
    float s0 = 0, z0 = 0, ps0[64], pz0[64];
    int runs = 0;
    for (int k = 0; k < 3; k++) {
        set_isa(isas[k]);
        for (int th = 1; th <= 2; th++) {
#if QCAL_HAVE_OPENMP
            omp_set_num_threads(th);
#endif
            char what[48];
            snprintf(what, sizeof what, "large %s %d thread(s)", isas[k], th);
            memset(y, 0, (size_t)n * 4);
            assert_int_equal(qcal_fakequant_fused(tu_vec(x, n), tu_vec(gy, n),
                                                  tu_fq(0.02f, 3, -128, 127), tu_out(y, n),
                                                  tu_out(g, n)),
                             QCAL_OK);
            expect_bits(what, "fused forward", y, yref, n);
            expect_bits(what, "fused grad", g, gref, n);
            assert_int_equal(qcal_fakequant_forward(tu_vec(x, n), tu_fq(0.02f, 3, -128, 127),
                                                    tu_out(y, n), m + 1),
                             QCAL_OK);
            expect_bits(what, "forward", y, yref, n);
            expect_mask(what, m + 1, mref, n);
            memset(g, 0, (size_t)n * 4);
            assert_int_equal(qcal_fakequant_backward(tu_vec(gy, n), mref, tu_out(g, n)), QCAL_OK);
            expect_bits(what, "backward", g, gref, n);
            float s, z, ps[64], pz[64];
            assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(x, n), tu_vec(gy, n), tu_lsq(0.02f, 3.3f, -128, 127), 0.001f, tu_out(g, n), &s, &z),
                             QCAL_OK);
            if (runs == 0)
                memcpy(lref, g, (size_t)n * 4);
            expect_bits(what, "learnable grad_x", g, lref, n);
            assert_int_equal(qcal_fakequant_learnable_backward(&t, tu_vec(gy, tu_numel(&t)), tu_lsqc(&t, 1, pcs, pcz, -128, 127), 0.001f, tu_out(g, tu_numel(&t)), ps, pz),
                             QCAL_OK);
            if (runs == 0) {
                s0 = s;
                z0 = z;
                memcpy(ps0, ps, sizeof ps);
                memcpy(pz0, pz, sizeof pz);
            }
            /* LSQ sums: identical between ISAs and thread counts. */
            expect_bits(what, "learnable grad_scale", &s, &s0, 1);
            expect_bits(what, "learnable grad_zero_point", &z, &z0, 1);
            expect_bits(what, "per-channel grad_scale", ps, ps0, 64);
            expect_bits(what, "per-channel grad_zero_point", pz, pz0, 64);
            runs++;
        }
    }
    unsetenv("QCAL_ISA");
    qcal_cpu_reset();
    assert_int_equal(runs, 6);
    assert_true(isfinite(s0) && s0 != 0.0f);
    free(xb); free(gyb); free(yb); free(gb); free(yref); free(gref); free(lref); free(m);
    free(mref);
}

/* ---- threads, in place ---- */

static void test_threads_and_in_place(void **state)
{
    (void)state;
    const int64_t n = (1 << 20) + 13;
    float *x = malloc((size_t)n * 4), *gy = malloc((size_t)n * 4);
    float *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4);
    float *g1 = malloc((size_t)n * 4), *g2 = malloc((size_t)n * 4);
    uint8_t *m1 = malloc((size_t)n), *m2 = malloc((size_t)n);
    fill_hostile(x, n, 0.02f);
    for (int64_t i = 0; i < n; i++)
        gy[i] = rndf(-1.0f, 1.0f);
    float s1, z1, s2, z2;
    int64_t shape[2] = { 1024, n / 1024 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    float pcs[1024], pcz[1024], pgs1[1024], pgz1[1024], pgs2[1024], pgz2[1024];
    for (int c = 0; c < 1024; c++) {
        pcs[c] = rndf(0.01f, 0.05f);
        pcz[c] = rndf(-20.0f, 20.0f);
    }
    for (int th = 1; th <= 2; th++) {
#if QCAL_HAVE_OPENMP
        omp_set_num_threads(th);
#endif
        float *y = th == 1 ? y1 : y2, *g = th == 1 ? g1 : g2;
        uint8_t *m = th == 1 ? m1 : m2;
        assert_int_equal(qcal_fakequant_forward(tu_vec(x, n), tu_fq(0.02f, 3, -128, 127),
                                                tu_out(y, n), m),
                         QCAL_OK);
        assert_int_equal(qcal_fakequant_backward(tu_vec(gy, n), m, tu_out(g, n)), QCAL_OK);
        assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(x, n), tu_vec(gy, n),
                                                           tu_lsq(0.02f, 3.0f, -128, 127), 0.001f,
                                                           NULL, th == 1 ? &s1 : &s2,
                                                           th == 1 ? &z1 : &z2),
                         QCAL_OK);
        assert_int_equal(qcal_fakequant_learnable_backward(&t, tu_vec(gy, tu_numel(&t)),
                                                           tu_lsqc(&t, 0, pcs, pcz, -128, 127),
                                                           1.0f, NULL, th == 1 ? pgs1 : pgs2,
                                                           th == 1 ? pgz1 : pgz2),
                         QCAL_OK);
    }
    expect_bits("2 threads forward", "threads", y2, y1, n);
    expect_mask("threads", m2, m1, n);
    expect_bits("2 threads backward", "threads", g2, g1, n);
    assert_int_equal(bits(s1), bits(s2));
    assert_int_equal(bits(z1), bits(z2));
    expect_bits("2 threads pc grad_scale", "threads", pgs2, pgs1, 1024);
    expect_bits("2 threads pc grad_zp", "threads", pgz2, pgz1, 1024);
    /* In place: dst == src, grad_x == grad_y. */
    float *xi = malloc((size_t)n * 4), *gi = malloc((size_t)n * 4);
    memcpy(xi, x, (size_t)n * 4);
    memcpy(gi, gy, (size_t)n * 4);
    assert_int_equal(qcal_fakequant_fused(tu_vec(xi, n), tu_vec(gi, n), tu_fq(0.02f, 3, -128, 127),
                                          tu_out(xi, n), tu_out(gi, n)),
                     QCAL_OK);
    expect_bits("in-place fused forward", "in place", xi, y1, n);
    expect_bits("in-place fused backward", "in place", gi, g1, n);
    memcpy(gi, gy, (size_t)n * 4);
    assert_int_equal(qcal_fakequant_backward(tu_vec(gi, n), m1, tu_out(gi, n)), QCAL_OK);
    expect_bits("in-place backward", "in place", gi, g1, n);
    free(xi); free(gi); free(x); free(gy); free(y1); free(y2); free(g1); free(g2);
    free(m1); free(m2);
}

/* ---- argument checks: clear errors, outputs untouched ---- */

static void test_bad_args(void **state)
{
    (void)state;
    float x[4] = { 0.1f, 0.2f, 0.3f, 0.4f }, y[4] = { 9, 9, 9, 9 };
    uint8_t m[4] = { 7, 7, 7, 7 };
    const float bad_scales[] = { 0.0f, -1.0f, NAN, INFINITY };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(qcal_fakequant_forward(tu_vec(x, 4), tu_fq(bad_scales[i], 0, 0, 255),
                                                tu_out(y, 4), m),
                         QCAL_ERR_INVALID_ARG);
        assert_non_null(strstr(qcal_last_error(), "scale"));
    }
    assert_int_equal(qcal_fakequant_forward(tu_vec(x, 4), tu_fq(0.1f, 300, 0, 255), tu_out(y, 4),
                                            m),
                     QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "300"));
    assert_int_equal(qcal_fakequant_forward(tu_vec(x, 4), tu_fq(0.1f, 0, 10, 5), tu_out(y, 4), m),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_fakequant_forward(tu_vec(x, 4), tu_fq(0.1f, 0, 0, (1 << 24) + 1),
                                            tu_out(y, 4), m),
                     QCAL_ERR_UNSUPPORTED);
    assert_int_equal(qcal_fakequant_forward(tu_vec(x, 0), tu_fq(0.1f, 0, 0, 255), tu_out(y, 0), m),
                     QCAL_ERR_EMPTY);
    assert_int_equal(qcal_fakequant_forward(tu_vec(NULL, 4), tu_fq(0.1f, 0, 0, 255), tu_out(y, 4),
                                            m),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_fakequant_backward(tu_vec(x, 4), NULL, tu_out(y, 4)),
                     QCAL_ERR_INVALID_ARG);
    int64_t shape[2] = { 2, 2 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 2, shape), QCAL_OK);
    float sc[2] = { 0.1f, -0.1f };
    int32_t zp[2] = { 0, 0 };
    assert_int_equal(qcal_fakequant_forward(&t, tu_fqc(&t, 1, sc, zp, 0, 255),
                                            tu_out(y, tu_numel(&t)), m),
                     QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "channel 1"));
    sc[1] = 0.1f;
    assert_int_equal(qcal_fakequant_forward(&t, tu_fqc(&t, 2, sc, zp, 0, 255),
                                            tu_out(y, tu_numel(&t)), m),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_fakequant_forward(&t, tu_fqc(&t, -3, sc, zp, 0, 255),
                                            tu_out(y, tu_numel(&t)), m),
                     QCAL_ERR_INVALID_ARG);
    /* Learnable: a scale that went negative (or 0) is rejected by the kernels. */
    float gs = 5.0f, gz = 5.0f;
    assert_int_equal(qcal_fakequant_learnable_backward(tu_vec(x, 4), tu_vec(x, 4),
                                                       tu_lsq(-0.01f, 0.0f, 0, 255), 1.0f,
                                                       tu_out(y, 4), &gs, &gz),
                     QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_fakequant_learnable_forward(tu_vec(x, 4), tu_lsq(0.1f, NAN, 0, 255),
                                                      tu_out(y, 4), m),
                     QCAL_ERR_INVALID_ARG);
    for (int i = 0; i < 4; i++) {
        assert_true(y[i] == 9.0f);
        assert_int_equal(m[i], 7);
    }
    assert_true(gs == 5.0f && gz == 5.0f);
    double g;
    assert_int_equal(qcal_fakequant_grad_factor(100, 255, &g), QCAL_OK);
    assert_true(g == 1.0 / sqrt(25500.0));
    assert_int_equal(qcal_fakequant_grad_factor(0, 255, &g), QCAL_ERR_INVALID_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_c_reference),
        cmocka_unit_test(test_lsq_reference),
        cmocka_unit_test(test_large_streaming),
        cmocka_unit_test(test_threads_and_in_place),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
