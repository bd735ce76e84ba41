/* unit.fake_quantize_object: the FakeQuantize object against PyTorch 1.13's FakeQuantize /
 * _LearnableFakeQuantize over several steps (tests/data/fakequant/object.bin), switches,
 * freeze, the LSQ scale guard and state round-trips. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/fakequant.h"
#include "testutil.h"

static uint32_t bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

static void expect_bits(const char *what, const char *name, int step, const float *got,
                        const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (bits(got[i]) != bits(want[i])) {
            print_error("%s step %d %s: element %lld got %.9g (0x%08x) want %.9g (0x%08x)\n",
                        name, step, what, (long long)i, (double)got[i], bits(got[i]),
                        (double)want[i], bits(want[i]));
            fail();
        }
    }
}

static void expect_close(const char *what, const char *name, int step, const float *got,
                         const float *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double tol = 1e-5 * fmax(fabs((double)want[i]), 1e-2);
        if (fabs((double)got[i] - (double)want[i]) > tol) {
            print_error("%s step %d %s: element %lld got %.9g want %.9g\n", name, step, what,
                        (long long)i, (double)got[i], (double)want[i]);
            fail();
        }
    }
}

/* ---- PyTorch reference over steps ---- */

typedef struct rd {
    const uint8_t *p, *end;
} rd;

static const void *take(rd *r, size_t n)
{
    assert_true((size_t)(r->end - r->p) >= n);
    const void *v = r->p;
    r->p += n;
    return v;
}
static uint32_t u32(rd *r)
{
    uint32_t v;
    memcpy(&v, take(r, 4), 4);
    return v;
}
static float *f32s(rd *r, int64_t n)
{
    float *v = malloc((size_t)n * 4);
    memcpy(v, take(r, (size_t)n * 4), (size_t)n * 4);
    return v;
}

static void test_pytorch_reference(void **state)
{
    (void)state;
    const char *dir = getenv("QCAL_TEST_DATA");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/fakequant/object.bin", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)len);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    rd r = { buf, buf + len };
    assert_memory_equal(take(&r, 4), "QFQO", 4);
    assert_int_equal(u32(&r), 1);
    uint32_t ncases = u32(&r);
    assert_int_equal(ncases, 3);
    int steps_checked = 0;
    for (uint32_t c = 0; c < ncases; c++) {
        char name[64] = { 0 };
        uint32_t nl = u32(&r);
        assert_true(nl < sizeof name);
        memcpy(name, take(&r, nl), nl);
        uint32_t preset = u32(&r), ndim = u32(&r);
        int64_t shape[8];
        memcpy(shape, take(&r, ndim * 8), ndim * 8);
        uint32_t nsteps = u32(&r);
        qcal_fakequant_module_config cfg;
        if (preset == 0) {
            qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION);
        } else if (preset == 1) {
            qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL);
        } else {
            qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE);
            cfg.learnable = true;
            cfg.use_grad_scaling = true;
        }
        qcal_fakequant_module *fq = NULL;
        assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
        int64_t n = 1;
        for (uint32_t d = 0; d < ndim; d++)
            n *= shape[d];
        for (uint32_t s = 0; s < nsteps; s++) {
            const uint8_t *flags = take(&r, 4);
            float *x = f32s(&r, n), *gy = f32s(&r, n), *y = f32s(&r, n), *gx = f32s(&r, n);
            uint32_t nch = u32(&r);
            float *sc = f32s(&r, nch), *zp = f32s(&r, nch), *gs = f32s(&r, nch),
                  *gz = f32s(&r, nch);
            assert_int_equal(qcal_fakequant_module_enable_observer(fq, flags[0]), QCAL_OK);
            assert_int_equal(qcal_fakequant_module_enable_fake_quant(fq, flags[1]), QCAL_OK);
            if (cfg.learnable && flags[2])
                assert_int_equal(qcal_fakequant_module_zero_grad(fq), QCAL_OK);
            qcal_tensor t;
            assert_int_equal(qcal_tensor_init(&t, x, (int32_t)ndim, shape), QCAL_OK);
            float *yo = malloc((size_t)n * 4), *go = malloc((size_t)n * 4);
            assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(yo, tu_numel(&t))), QCAL_OK);
            assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(gy, n), tu_out(go, n)), QCAL_OK);
            expect_bits("y", name, (int)s, yo, y, n);
            expect_bits("grad_x", name, (int)s, go, gx, n);
            float qs[64];
            int32_t qz[64];
            int64_t got;
            assert_int_equal(tu_fakequant_module_qparams(fq, 64, qs, qz, &got), QCAL_OK);
            assert_int_equal(got, nch);
            float qzf[64];
            for (int64_t k = 0; k < got; k++)
                qzf[k] = (float)qz[k];
            expect_bits("scale", name, (int)s, qs, sc, got);
            if (!cfg.learnable)
                expect_bits("zero_point", name, (int)s, qzf, zp, got);
            if (cfg.learnable) {
                float *ps, *pz, *pgs, *pgz;
                int64_t pn;
                assert_int_equal(qcal_fakequant_module_params(fq, &ps, &pz, &pgs, &pgz, &pn),
                                 QCAL_OK);
                expect_bits("zero_point param", name, (int)s, pz, zp, pn);
                if (flags[2]) {
                    expect_close("grad_scale", name, (int)s, pgs, gs, pn);
                    expect_close("grad_zero_point", name, (int)s, pgz, gz, pn);
                    assert_true(pgs[0] != 0.0f);
                }
            }
            steps_checked++;
            free(x); free(gy); free(y); free(gx); free(sc); free(zp); free(gs); free(gz);
            free(yo); free(go);
        }
        qcal_fakequant_module_destroy(&fq);
        assert_null(fq);
    }
    assert_true(r.p == r.end);
    assert_int_equal(steps_checked, 15);
    free(buf);
}

/* ---- switches, freeze ---- */

static void fill(float *x, int64_t n, float lo, float hi, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
}

static void test_switches_and_freeze(void **state)
{
    (void)state;
    qcal_fakequant_module_config cfg;
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION);
    cfg.freeze_after = 2;
    qcal_fakequant_module *fq = NULL;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
    float x[64], y[64], g[64], gx[64];
    int64_t shape[1] = { 64 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, shape), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 64), tu_out(gx, 64)), QCAL_ERR_STATE);
    fill(x, 64, -1.0f, 3.0f, 1);
    fill(g, 64, -1.0f, 1.0f, 2);
    /* Fake-quant disabled: y == x, gradient passes through, observer still learns. */
    assert_int_equal(qcal_fakequant_module_enable_fake_quant(fq, false), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    assert_memory_equal(y, x, sizeof x);
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 64), tu_out(gx, 64)), QCAL_OK);
    assert_memory_equal(gx, g, sizeof g);
    float s1;
    int32_t z1;
    int64_t n;
    assert_int_equal(tu_fakequant_module_qparams(fq, 1, &s1, &z1, &n), QCAL_OK);
    /* range [-1, 3) over [0, 127]: scale ~ 4/127, zero-point ~ 32 */
    assert_true(fabsf(s1 - 4.0f / 127.0f) < 1e-3f);
    assert_true(z1 >= 30 && z1 <= 34);
    assert_int_equal(qcal_fakequant_module_enable_fake_quant(fq, true), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 63), tu_out(gx, 63)),
                     QCAL_ERR_MISMATCH);
    /* Views as the functions take them: a destination of another size is refused, and a
     * refused forward changes nothing (no step counted). */
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 64), tu_out(gx, 63)),
                     QCAL_ERR_MISMATCH);
    int64_t steps_before;
    assert_int_equal(qcal_fakequant_module_status(fq, NULL, NULL, NULL, &steps_before), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, 65)), QCAL_ERR_MISMATCH);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, NULL), QCAL_ERR_INVALID_ARG);
    int64_t steps_after;
    assert_int_equal(qcal_fakequant_module_status(fq, NULL, NULL, NULL, &steps_after), QCAL_OK);
    assert_int_equal(steps_after, steps_before);
    /* Second step freezes. */
    fill(x, 64, -2.0f, 6.0f, 3);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    bool obs_en, fq_en, frozen;
    int64_t steps;
    assert_int_equal(qcal_fakequant_module_status(fq, &obs_en, &fq_en, &frozen, &steps), QCAL_OK);
    assert_true(frozen && !obs_en && fq_en);
    assert_int_equal(steps, 2);
    float s2;
    int32_t z2;
    assert_int_equal(tu_fakequant_module_qparams(fq, 1, &s2, &z2, &n), QCAL_OK);
    assert_true(s2 > s1);   /* moved toward the wider range */
    assert_int_equal(qcal_fakequant_module_enable_observer(fq, true), QCAL_ERR_STATE);
    /* Frozen: a very different batch does not move the qparams. */
    fill(x, 64, -50.0f, 50.0f, 4);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    float s3;
    int32_t z3;
    assert_int_equal(tu_fakequant_module_qparams(fq, 1, &s3, &z3, &n), QCAL_OK);
    assert_true(bits(s3) == bits(s2) && z3 == z2);
    /* The output is clamped to the frozen range; the mask zeroes gradients outside. */
    float hi = (127.0f - (float)z2) * s2, lo = (0.0f - (float)z2) * s2;
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 64), tu_out(gx, 64)), QCAL_OK);
    int outside = 0;
    for (int i = 0; i < 64; i++) {
        assert_true(y[i] <= hi && y[i] >= lo);
        if (x[i] > hi + s2 || x[i] < lo - s2) {
            assert_true(gx[i] == 0.0f);
            outside++;
        }
    }
    assert_true(outside > 10);
    /* Observer disabled (not frozen) on a fresh object: qparams stay at 1 / 0. */
    qcal_fakequant_module *fq2 = NULL;
    cfg.freeze_after = 0;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq2), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_enable_observer(fq2, false), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_forward(fq2, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    assert_int_equal(tu_fakequant_module_qparams(fq2, 1, &s3, &z3, &n), QCAL_OK);
    assert_true(s3 == 1.0f && z3 == 0);
    assert_int_equal(qcal_fakequant_module_freeze(fq2), QCAL_OK);
    qcal_fakequant_module_destroy(&fq2);
    qcal_fakequant_module_destroy(&fq);
    qcal_fakequant_module_destroy(&fq);   /* NULL is fine */
    qcal_fakequant_module_destroy(NULL);
}

/* ---- LSQ: negative-going scale is clamped to eps ---- */

static void test_learnable_scale_guard(void **state)
{
    (void)state;
    qcal_fakequant_module_config cfg;
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE);
    cfg.learnable = true;
    cfg.init_scale = 0.05f;
    cfg.init_zero_point = 10.0f;
    qcal_fakequant_module *fq = NULL;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_enable_observer(fq, false), QCAL_OK);
    float x[32], y[32], g[32], gx[32];
    fill(x, 32, -1.0f, 1.0f, 9);
    fill(g, 32, -1.0f, 1.0f, 10);
    int64_t shape[1] = { 32 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, shape), QCAL_OK);
    float *ps, *pz, *pgs, *pgz;
    int64_t n;
    for (int step = 0; step < 4; step++) {
        assert_int_equal(qcal_fakequant_module_zero_grad(fq), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 32), tu_out(gx, 32)), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_params(fq, &ps, &pz, &pgs, &pgz, &n), QCAL_OK);
        assert_int_equal(n, 1);
        assert_true(ps[0] > 0.0f);
        /* A large optimiser step drives the scale negative. */
        ps[0] -= 1.0f;
        pz[0] -= 0.5f * pgz[0];
    }
    assert_true(ps[0] < 0.0f);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    float s;
    int32_t z;
    assert_int_equal(tu_fakequant_module_qparams(fq, 1, &s, &z, &n), QCAL_OK);
    assert_true(s == cfg.observer.q.eps);
    for (int i = 0; i < 32; i++)
        assert_true(isfinite(y[i]));
    ps[0] = NAN;   /* NaN is reset to eps too */
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_OK);
    assert_true(ps[0] == cfg.observer.q.eps);
    pz[0] = INFINITY;
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, tu_numel(&t))), QCAL_ERR_NONFINITE);
    qcal_fakequant_module_destroy(&fq);
    /* Not learnable: params are refused. */
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION);
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_params(fq, &ps, &pz, &pgs, &pgz, &n), QCAL_ERR_STATE);
    qcal_fakequant_module_destroy(&fq);
    cfg.learnable = true;
    cfg.init_scale = -1.0f;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_ERR_INVALID_ARG);
    assert_null(fq);
}

/* ---- state round trip ---- */

static void run_steps(qcal_fakequant_module *fq, int first, int count, float *y_out)
{
    float w[6 * 4 * 3] = { 0 }, g[6 * 4 * 3], gx[6 * 4 * 3];
    int64_t shape[3] = { 6, 4, 3 };
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, w, 3, shape), QCAL_OK);
    for (int s = first; s < first + count; s++) {
        fill(w, 72, -1.0f - 0.1f * (float)s, 1.0f + 0.2f * (float)s, 100u + (uint32_t)s);
        fill(g, 72, -1.0f, 1.0f, 200u + (uint32_t)s);
        assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y_out, tu_numel(&t))), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 72), tu_out(gx, 72)), QCAL_OK);
    }
}

static void test_state_round_trip(void **state)
{
    (void)state;
    for (int learnable = 0; learnable <= 1; learnable++) {
        qcal_fakequant_module_config cfg;
        qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL);
        cfg.learnable = learnable;
        cfg.freeze_after = 5;
        qcal_fakequant_module *a = NULL, *b = NULL, *c = NULL;
        assert_int_equal(qcal_fakequant_module_create(&cfg, &a), QCAL_OK);
        float ya[72], yb[72], yc[72];
        run_steps(a, 0, 3, ya);
        if (learnable)
            assert_int_equal(qcal_fakequant_module_enable_observer(a, false), QCAL_OK);
        void *blob = NULL;
        size_t len = 0;
        assert_int_equal(qcal_fakequant_module_save(a, &blob, &len), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_load(blob, len, &b), QCAL_OK);
        char path[] = "/tmp/qcal_fq_stateXXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(qcal_fakequant_module_save_file(a, path), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_load_file(path, &c), QCAL_OK);
        unlink(path);
        /* Backward needs a forward after a load. */
        float g[72] = { 0 }, gx[72];
        assert_int_equal(qcal_fakequant_module_backward(b, tu_vec(g, 72), tu_out(gx, 72)),
                         QCAL_ERR_STATE);
        run_steps(a, 3, 4, ya);
        run_steps(b, 3, 4, yb);
        run_steps(c, 3, 4, yc);
        assert_memory_equal(ya, yb, sizeof ya);
        assert_memory_equal(ya, yc, sizeof ya);
        void *ba = NULL, *bb = NULL;
        size_t la, lb;
        assert_int_equal(qcal_fakequant_module_save(a, &ba, &la), QCAL_OK);
        assert_int_equal(qcal_fakequant_module_save(b, &bb, &lb), QCAL_OK);
        assert_int_equal(la, lb);
        assert_memory_equal(ba, bb, la);
        bool frozen;
        int64_t steps;
        assert_int_equal(qcal_fakequant_module_status(b, NULL, NULL, &frozen, &steps), QCAL_OK);
        assert_true(frozen);
        assert_int_equal(steps, 7);
        /* Malformed: every truncation, a bad magic, a bad version, garbage counts. */
        qcal_fakequant_module *bad = NULL;
        for (size_t cut = 0; cut < len; cut++)
            assert_int_equal(qcal_fakequant_module_load(blob, cut, &bad), QCAL_ERR_FORMAT);
        uint8_t *mod = malloc(len + 1);
        memcpy(mod, blob, len);
        mod[len] = 0;
        assert_int_equal(qcal_fakequant_module_load(mod, len + 1, &bad), QCAL_ERR_FORMAT);
        mod[0] ^= 1;
        assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
        memcpy(mod, blob, len);
        mod[4] = 9;
        assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
        memcpy(mod, blob, len);
        mod[8] = 0xff;   /* flags */
        assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
        /* A bad observer blob inside, and a bad config: the message keeps the cause once
         * (it used to be formatted into the buffer it was read from). */
        memcpy(mod, blob, len);
        uint64_t nq;
        memcpy(&nq, mod + 44, 8);   /* header: 3 u32, 2 f32, 4 u64 (channel count last) */
        assert_true(nq >= 1 && 60 + 16 * nq < len);
        mod[52 + 16 * nq + 8] ^= 0xff;   /* the observer blob's first byte (its magic) */
        assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
        const char *e = qcal_last_error();
        const char *cause = strstr(e, "bad observer: ");
        if (!cause || strlen(cause) <= strlen("bad observer: ") ||
            strstr(cause + 1, "fake-quantize state") || strstr(cause + 1, "bad observer"))
            fail_msg("bad observer message: '%s'", e);
        memcpy(mod, blob, len);
        float bad_scale = learnable ? -1.0f : 1.0f;
        memcpy(mod + 12, &bad_scale, 4);   /* init_scale */
        if (learnable) {
            assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
            e = qcal_last_error();
            cause = strstr(e, "invalid config: ");
            if (!cause || strlen(cause) <= strlen("invalid config: ") ||
                strstr(cause + 1, "invalid config"))
                fail_msg("bad config message: '%s'", e);
        }
        memcpy(mod, blob, len);
        memset(mod + 40, 0xff, 8);   /* qparam count */
        assert_int_equal(qcal_fakequant_module_load(mod, len, &bad), QCAL_ERR_FORMAT);
        memcpy(mod, blob, len);
        float neg = -1.0f;
        memcpy(mod + 48, &neg, 4);   /* scale[0] */
        qcal_status st = qcal_fakequant_module_load(mod, len, &bad);
        if (!learnable)
            assert_int_equal(st, QCAL_ERR_FORMAT);
        else
            qcal_fakequant_module_destroy(&bad);   /* learnable: clamped at the next forward */
        assert_null(bad);
        free(mod);
        qcal_free(blob);
        qcal_free(ba);
        qcal_free(bb);
        assert_int_equal(qcal_fakequant_module_load_file("/nonexistent/x", &bad), QCAL_ERR_IO);
        qcal_fakequant_module_destroy(&a);
        qcal_fakequant_module_destroy(&b);
        qcal_fakequant_module_destroy(&c);
    }
}

/* Learnable mode with the observer on: every forward overwrites the learned scale and
 * zero-point with the observer's qparams (PyTorch's _LearnableFakeQuantize does the same)
 * and no gradient accumulates; the header says so next to `learnable`. */
static void test_learnable_observer_overwrites(void **state)
{
    (void)state;
    qcal_fakequant_module_config cfg;
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION);
    cfg.learnable = true;
    qcal_fakequant_module *fq = NULL;
    assert_int_equal(qcal_fakequant_module_create(&cfg, &fq), QCAL_OK);
    float x[16], y[16], g[16], gx[16];
    fill(x, 16, -1.0f, 3.0f, 21);
    fill(g, 16, -1.0f, 1.0f, 22);
    int64_t shape[1] = { 16 }, n;
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, shape), QCAL_OK);
    float *ps, *pz, *pgs, *pgz;
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, 16)), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_params(fq, &ps, &pz, &pgs, &pgz, &n), QCAL_OK);
    float observed = ps[0];
    ps[0] = 0.123f;   /* an optimiser step */
    pz[0] = 7.0f;
    assert_int_equal(qcal_fakequant_module_zero_grad(fq), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, 16)), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 16), tu_out(gx, 16)), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_params(fq, &ps, &pz, &pgs, &pgz, &n), QCAL_OK);
    assert_true(bits(ps[0]) == bits(observed));   /* same batch: the observer's scale again */
    assert_true(pz[0] != 7.0f);
    assert_true(pgs[0] == 0.0f && pgz[0] == 0.0f);
    /* Observer off: the learned value stays and gradients accumulate. */
    assert_int_equal(qcal_fakequant_module_enable_observer(fq, false), QCAL_OK);
    ps[0] = 0.123f;
    assert_int_equal(qcal_fakequant_module_forward(fq, &t, tu_out(y, 16)), QCAL_OK);
    assert_int_equal(qcal_fakequant_module_backward(fq, tu_vec(g, 16), tu_out(gx, 16)), QCAL_OK);
    assert_true(ps[0] == 0.123f);
    assert_true(pgs[0] != 0.0f);
    qcal_fakequant_module_destroy(&fq);
    /* The header documents it next to the field. */
    const char *root = getenv("QCAL_SOURCE_ROOT");
    assert_non_null(root);
    char *hdr = tu_read_file(tu_path(root, "include/qcal/fakequant.h"), NULL);
    const char *field = strstr(hdr, "    bool learnable;");
    assert_non_null(field);
    const char *next = strstr(field, "    bool use_grad_scaling;");
    const char *note = strstr(field, "OVERWRITES");
    assert_true(next && note && note < next);
    free(hdr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pytorch_reference),
        cmocka_unit_test(test_switches_and_freeze),
        cmocka_unit_test(test_learnable_scale_guard),
        cmocka_unit_test(test_learnable_observer_overwrites),
        cmocka_unit_test(test_state_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
