/* unit.qat_example: the demo CNN (examples/cnn) and the QAT example's pipeline.
 *  - initialisation bit-identical to tests/ref/gen_cnn.py's re-implementation;
 *  - forward logits, loss and every gradient against PyTorch 1.13 on 8 test images;
 *  - safetensors save/load round trip, and clear errors for missing/misshapen tensors;
 *  - training steps bit-identical from run to run (same thread count);
 *  - the shared QAT path as the demo uses it (full-range activations, float logits): exported
 *    qparams equal to the observers' qparams of the data seen, deterministic fine-tuning;
 *  - the QAT example's run with its default schedule (float training in a fresh cache
 *    directory, post-training fake-quant, QAT): QAT accuracy >= post-training-quantized
 *    accuracy and within 1 point of float, all on the 10,000 test images. */
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

#include "cnn.h"
#include "qat.h"
#include "qcal/safetensors.h"

static cnn_data g_test;
static bool g_have_data;

static int setup(void **state)
{
    (void)state;
    g_have_data = cnn_data_load(cnn_data_dir(), "t10k", &g_test) == QCAL_OK;
    if (!g_have_data)
        fprintf(stderr, "Fashion-MNIST not available: %s\n", qcal_last_error());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cnn_data_free(&g_test);
    return 0;
}

static qcal_safetensors *open_ref(void)
{
    const char *d = getenv("QCAL_TEST_DATA");
    assert_non_null(d);
    char path[4096];
    snprintf(path, sizeof path, "%s/cnn/cnn_ref.safetensors", d);
    qcal_safetensors *st = NULL;
    if (qcal_safetensors_open(path, &st) != QCAL_OK)
        fail_msg("cannot open %s: %s", path, qcal_last_error());
    return st;
}

/* Reads reference tensor name (numel floats) into a new buffer. */
static float *ref_tensor(qcal_safetensors *st, const char *name, int64_t *numel)
{
    int64_t i;
    qcal_safetensors_tensor_info info;
    if (qcal_safetensors_find(st, name, &i) != QCAL_OK)
        fail_msg("reference tensor %s missing", name);
    assert_int_equal(qcal_safetensors_info(st, i, &info), QCAL_OK);
    float *v = malloc((size_t)info.numel * sizeof(float));
    assert_non_null(v);
    assert_int_equal(qcal_safetensors_read_f32(st, i, 0, info.numel, v), QCAL_OK);
    *numel = info.numel;
    return v;
}

/* |got - want| <= atol + rtol * max|want| for every element; prints the worst one. */
static void compare(const char *what, const float *got, int64_t got_stride, const float *want, int64_t n,
                    double rtol, double atol)
{
    double maxref = 0.0, worst = -1.0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++)
        maxref = fmax(maxref, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i * got_stride] - (double)want[i]);
        if (!(e <= worst) || isnan(e)) {
            worst = isnan(e) ? INFINITY : e;
            wi = i;
        }
    }
    double tol = atol + rtol * maxref;
    if (!(worst <= tol))
        fail_msg("%s: worst element %lld: got %.9g, PyTorch %.9g (|diff| %.3g > tol %.3g, max|ref| %.3g)", what,
                 (long long)wi, (double)got[wi * got_stride], (double)want[wi], worst, tol, maxref);
}

static void test_init_matches_reference(void **state)
{
    (void)state;
    qcal_safetensors *st = open_ref();
    cnn_model *m = NULL;
    assert_int_equal(cnn_model_create(5, &m), QCAL_OK);
    for (int p = 0; p < CNN_NPARAMS; p++) {
        char name[96];
        int64_t n;
        snprintf(name, sizeof name, "init.%s.first16", cnn_param_name(p));
        float *want = ref_tensor(st, name, &n);
        assert_int_equal(n, cnn_param_numel(p) < 16 ? cnn_param_numel(p) : 16);
        for (int i = 0; i < n; i++)
            if (memcmp(&m->param[p][i], &want[i], sizeof(float)) != 0)
                fail_msg("%s[%d] = %.9g, reference %.9g (must be bit-identical)", cnn_param_name(p), i,
                         (double)m->param[p][i], (double)want[i]);
        free(want);
        /* every value inside the kaiming-uniform bound */
        int64_t fan_in = cnn_param_numel(p & ~1) / (p < 2 ? 32 : p < 4 ? 64 : p < 6 ? 128 : 10);
        float bound = 1.0f / sqrtf((float)fan_in);
        for (int64_t i = 0; i < cnn_param_numel(p); i++)
            assert_true(fabsf(m->param[p][i]) <= bound);
    }
    /* Same seed, same model; another seed, another model. */
    cnn_model *m2 = NULL, *m3 = NULL;
    assert_int_equal(cnn_model_create(5, &m2), QCAL_OK);
    assert_int_equal(cnn_model_create(6, &m3), QCAL_OK);
    for (int p = 0; p < CNN_NPARAMS; p++) {
        assert_memory_equal(m->param[p], m2->param[p], (size_t)cnn_param_numel(p) * sizeof(float));
        assert_memory_not_equal(m->param[p], m3->param[p], (size_t)cnn_param_numel(p) * sizeof(float));
    }
    cnn_model_destroy(&m);
    cnn_model_destroy(&m2);
    cnn_model_destroy(&m3);
    assert_null(m);
    cnn_model_destroy(NULL);
    qcal_safetensors_close(&st);
}

static void test_forward_backward_matches_pytorch(void **state)
{
    (void)state;
    if (!g_have_data)
        skip();
    qcal_safetensors *st = open_ref();
    cnn_model *m = NULL;
    cnn_ctx *ctx = NULL;
    assert_int_equal(cnn_model_create(5, &m), QCAL_OK);
    assert_int_equal(cnn_ctx_create(16, &ctx), QCAL_OK);
    int64_t n;
    /* Inference forward. */
    const float *z = NULL;
    assert_int_equal(cnn_forward(ctx, m, g_test.images, 8, NULL, &z), QCAL_OK);
    float *want = ref_tensor(st, "logits", &n);
    assert_int_equal(n, 80);
    compare("logits", z, 1, want, 80, 1e-5, 1e-6);
    free(want);
    /* Loss and gradients. */
    float loss = 0.0f;
    assert_int_equal(cnn_compute_grad(ctx, m, g_test.images, g_test.labels, 8, NULL, &loss), QCAL_OK);
    want = ref_tensor(st, "loss", &n);
    if (fabsf(loss - want[0]) > 1e-5f)
        fail_msg("loss %.9g, PyTorch %.9g", (double)loss, (double)want[0]);
    free(want);
    for (int p = 0; p < CNN_NPARAMS; p++) {
        char name[96];
        const float *g = cnn_ctx_grad(ctx, p);
        assert_non_null(g);
        if (p == CNN_FC1_W) {
            want = ref_tensor(st, "grad.fc1.weight.every61", &n);
            assert_int_equal(n, (cnn_param_numel(p) + 60) / 61);
            compare("grad fc1.weight (every 61st)", g, 61, want, n, 1e-4, 1e-8);
        } else {
            snprintf(name, sizeof name, "grad.%s", cnn_param_name(p));
            want = ref_tensor(st, name, &n);
            assert_int_equal(n, cnn_param_numel(p));
            compare(name, g, 1, want, n, 1e-4, 1e-8);
        }
        free(want);
    }
    assert_null(cnn_ctx_grad(ctx, CNN_NPARAMS));
    /* Argument checks leave nothing half-done. */
    assert_int_equal(cnn_forward(ctx, m, g_test.images, 17, NULL, &z), QCAL_ERR_INVALID_ARG);
    assert_int_equal(cnn_forward(ctx, m, g_test.images, 0, NULL, &z), QCAL_ERR_INVALID_ARG);
    uint8_t badlab[2] = {3, 10};
    assert_int_equal(cnn_train_step(ctx, m, g_test.images, badlab, 2, NULL, 1e-3f, &loss), QCAL_ERR_INVALID_ARG);
    assert_int_equal(cnn_train_step(ctx, m, g_test.images, g_test.labels, 2, NULL, NAN, &loss),
                     QCAL_ERR_INVALID_ARG);
    cnn_ctx_destroy(&ctx);
    assert_null(ctx);
    cnn_model_destroy(&m);
    qcal_safetensors_close(&st);
}

static void test_save_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/qcal_test_cnn_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    cnn_model *m = NULL, *l = NULL;
    assert_int_equal(cnn_model_create(3, &m), QCAL_OK);
    assert_int_equal(cnn_model_save(m, path), QCAL_OK);
    assert_int_equal(cnn_model_load(path, &l), QCAL_OK);
    for (int p = 0; p < CNN_NPARAMS; p++)
        assert_memory_equal(m->param[p], l->param[p], (size_t)cnn_param_numel(p) * sizeof(float));
    cnn_model_destroy(&l);

    /* PyTorch names and layouts in the file. */
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    int64_t i;
    qcal_safetensors_tensor_info info;
    assert_int_equal(qcal_safetensors_find(st, "conv2.weight", &i), QCAL_OK);
    assert_int_equal(qcal_safetensors_info(st, i, &info), QCAL_OK);
    assert_int_equal(info.ndim, 4);
    assert_int_equal(info.shape[0], 64);
    assert_int_equal(info.shape[1], 32);
    assert_int_equal(info.shape[3], 3);
    qcal_safetensors_close(&st);

    /* Misshapen tensor: fc2.weight [128, 10] instead of [10, 128]. */
    const char *names[CNN_NPARAMS];
    qcal_tensor t[CNN_NPARAMS];
    for (int p = 0; p < CNN_NPARAMS; p++) {
        int64_t shape[4];
        int nd = cnn_param_shape(p, shape);
        if (p == CNN_FC2_W) {
            shape[0] = 128;
            shape[1] = 10;
        }
        names[p] = cnn_param_name(p);
        assert_int_equal(qcal_tensor_init(&t[p], m->param[p], nd, shape), QCAL_OK);
    }
    assert_int_equal(qcal_safetensors_write_f32(bad, CNN_NPARAMS, names, t, 0, NULL), QCAL_OK);
    l = (cnn_model *)(uintptr_t)1;
    assert_int_equal(cnn_model_load(bad, &l), QCAL_ERR_MISMATCH);
    assert_ptr_equal(l, (cnn_model *)(uintptr_t)1);
    assert_non_null(strstr(qcal_last_error(), "fc2.weight"));
    assert_non_null(strstr(qcal_last_error(), "[128, 10]"));
    /* Missing tensor: no fc2.bias. */
    assert_int_equal(qcal_tensor_init(&t[CNN_FC2_W], m->param[CNN_FC2_W], 2, (const int64_t[]){10, 128}), QCAL_OK);
    assert_int_equal(qcal_safetensors_write_f32(bad, CNN_NPARAMS - 1, names, t, 0, NULL), QCAL_OK);
    assert_int_equal(cnn_model_load(bad, &l), QCAL_ERR_MISMATCH);
    assert_non_null(strstr(qcal_last_error(), "fc2.bias"));
    /* Non-finite weight. */
    m->param[CNN_CONV1_B][3] = NAN;
    assert_int_equal(cnn_model_save(m, bad), QCAL_OK);
    assert_int_equal(cnn_model_load(bad, &l), QCAL_ERR_NONFINITE);
    /* Not a file. */
    assert_true(cnn_model_load(dir, &l) < 0);
    unlink(path);
    unlink(bad);
    rmdir(dir);
    cnn_model_destroy(&m);
}

static void test_training_is_deterministic(void **state)
{
    (void)state;
    if (!g_have_data)
        skip();
    cnn_model *a = NULL, *b = NULL;
    cnn_ctx *ctx = NULL;
    assert_int_equal(cnn_ctx_create(64, &ctx), QCAL_OK);
    float la[3], lb[3];
    for (int r = 0; r < 2; r++) {
        cnn_model **m = r ? &b : &a;
        assert_int_equal(cnn_model_create(11, m), QCAL_OK);
        cnn_ctx_reset_optimizer(ctx);
        for (int s = 0; s < 3; s++)
            assert_int_equal(cnn_train_step(ctx, *m, g_test.images + s * 64 * 784, g_test.labels + s * 64, 64,
                                             NULL, 1e-3f, r ? &lb[s] : &la[s]), QCAL_OK);
    }
    for (int p = 0; p < CNN_NPARAMS; p++)
        assert_memory_equal(a->param[p], b->param[p], (size_t)cnn_param_numel(p) * sizeof(float));
    assert_memory_equal(la, lb, sizeof la);
    /* And training changed the model: the loss on the first batch went down. */
    cnn_model *fresh = NULL;
    assert_int_equal(cnn_model_create(11, &fresh), QCAL_OK);
    float l0, l1;
    assert_int_equal(cnn_compute_grad(ctx, fresh, g_test.images, g_test.labels, 64, NULL, &l0), QCAL_OK);
    assert_int_equal(cnn_compute_grad(ctx, a, g_test.images, g_test.labels, 64, NULL, &l1), QCAL_OK);
    if (!(l1 < l0))
        fail_msg("loss after 3 Adam steps %.6f, before %.6f", (double)l1, (double)l0);
    cnn_model_destroy(&a);
    cnn_model_destroy(&b);
    cnn_model_destroy(&fresh);
    cnn_ctx_destroy(&ctx);
}

/* The shared QAT path (examples/cnn/qat.h) as the demo uses it: full-range activations,
 * float logits, the exported qparams equal to the observers' qparams of the data seen,
 * and a short deterministic cnn_qat_finetune. */
static void test_fq_opts_export_finetune(void **state)
{
    (void)state;
    if (!g_have_data)
        skip();
    cnn_fq_set *set = (cnn_fq_set *)(uintptr_t)1;
    cnn_fq_opts fo = cnn_fq_opts_default();
    assert_int_equal(fo.act_preset, QCAL_FAKEQUANT_PRESET_ACTIVATION);
    assert_true(fo.quantize_logits);
    fo.act_preset = QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL;   /* not an activation preset */
    assert_int_equal(cnn_fq_create(&fo, &set), QCAL_ERR_INVALID_ARG);
    assert_ptr_equal(set, (cnn_fq_set *)(uintptr_t)1);
    set = NULL;
    assert_int_equal(cnn_fq_create(NULL, &set), QCAL_OK);   /* defaults: every tap quantized */
    for (int t = 0; t < CNN_NTAPS; t++)
        assert_non_null(set->act[t]);
    cnn_fq_destroy(&set);
    assert_null(set);

    fo.act_preset = QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE;
    fo.quantize_logits = false;
    assert_int_equal(cnn_fq_create(&fo, &set), QCAL_OK);
    assert_null(set->act[CNN_TAP_LOGITS]);
    cnn_fq_qparams e;
    memset(&e, 0x5a, sizeof e);
    assert_int_equal(cnn_fq_export(set, &e), QCAL_ERR_STATE);   /* no forward yet */
    assert_true(e.act_scale[0] != 0.0f && e.weight_scale[0] != NULL);   /* untouched */

    cnn_model *m = NULL;
    cnn_ctx *ctx = NULL;
    assert_int_equal(cnn_model_create(5, &m), QCAL_OK);
    assert_int_equal(cnn_ctx_create(32, &ctx), QCAL_OK);
    const float *z;
    float plain[32 * CNN_CLASSES];
    assert_int_equal(cnn_forward(ctx, m, g_test.images, 32, NULL, &z), QCAL_OK);
    memcpy(plain, z, sizeof plain);
    /* Observe only: every tap sees the float values; the logits hook is the identity. */
    assert_int_equal(cnn_fq_enable(set, true, false), QCAL_OK);
    assert_int_equal(cnn_forward(ctx, m, g_test.images, 32, &set->hooks, &z), QCAL_OK);
    assert_memory_equal(z, plain, sizeof plain);
    assert_int_equal(cnn_fq_freeze(set), QCAL_OK);
    assert_int_equal(cnn_fq_export(set, &e), QCAL_OK);

    qcal_fakequant_module_config acfg, wcfg;
    qcal_fakequant_module_config_default(&acfg, QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE);
    qcal_fakequant_module_config_default(&wcfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL);
    for (int t = 0; t < CNN_NTAPS; t++) {
        assert_int_equal(e.act_quantized[t], t != CNN_TAP_LOGITS);
        if (t == CNN_TAP_LOGITS) {
            assert_true(e.act_scale[t] == 0.0f && e.act_zero_point[t] == 0);
            continue;
        }
        /* the range the tap's observer saw, through the full-range qconfig */
        const qcal_observer *obs = NULL;
        float lo, hi, sc;
        int32_t zp;
        int64_t n = 0;
        assert_int_equal(qcal_fakequant_module_observer(set->act[t], &obs), QCAL_OK);
        assert_int_equal(qcal_observer_data_range(obs, 1, &lo, &hi, &n), QCAL_OK);
        qcal_qparams qp = {0};
        assert_int_equal(qcal_qparams_compute(&acfg.observer.q, 0, 1, &lo, &hi, &qp), QCAL_OK);
        sc = qcal_qparams_scale_at(&qp, 0);
        zp = qcal_qparams_zero_point_at(&qp, 0);
        qcal_qparams_free(&qp);
        if (memcmp(&sc, &e.act_scale[t], sizeof sc) != 0 || zp != e.act_zero_point[t])
            fail_msg("tap %s: exported %.9g / %d, range [%.9g, %.9g] gives %.9g / %d", cnn_tap_name(t),
                     (double)e.act_scale[t], e.act_zero_point[t], (double)lo, (double)hi, (double)sc, zp);
    }
    /* The input: the 32 images' darkest and brightest pixels, normalised, over 255 codes. */
    int pmin = 255, pmax = 0;
    for (int i = 0; i < 32 * CNN_IMAGE_PIXELS; i++) {
        pmin = g_test.images[i] < pmin ? g_test.images[i] : pmin;
        pmax = g_test.images[i] > pmax ? g_test.images[i] : pmax;
    }
    double want = (double)(pmax - pmin) / 255.0 / 0.3530 / 255.0;
    if (!(fabs(e.act_scale[CNN_TAP_CONV1_IN] - want) <= 1e-6 * want))
        fail_msg("input scale %.9g, pixels [%d, %d] give %.9g", (double)e.act_scale[CNN_TAP_CONV1_IN], pmin, pmax,
                 want);
    assert_int_equal(e.act_zero_point[CNN_TAP_CONV1_IN],
                     (int)lrint(-((double)pmin / 255.0 - 0.2860) / 0.3530 / want));
    for (int l = 0; l < CNN_NLAYERS; l++) {
        int64_t shape[4];
        cnn_param_shape(2 * l, shape);
        assert_int_equal(e.weight_channels[l], shape[0]);
        int64_t per = cnn_param_numel(2 * l) / shape[0];
        for (int64_t c = 0; c < shape[0]; c++) {
            float lo = INFINITY, hi = -INFINITY, sc;
            int32_t zp;
            for (int64_t i = 0; i < per; i++) {
                lo = fminf(lo, m->param[2 * l][c * per + i]);
                hi = fmaxf(hi, m->param[2 * l][c * per + i]);
            }
            qcal_qparams qp = {0};
            assert_int_equal(qcal_qparams_compute(&wcfg.observer.q, 0, 1, &lo, &hi, &qp), QCAL_OK);
            sc = qcal_qparams_scale_at(&qp, 0);
            zp = qcal_qparams_zero_point_at(&qp, 0);
            qcal_qparams_free(&qp);
            if (memcmp(&sc, &e.weight_scale[l][c], sizeof sc) != 0 || zp != e.weight_zero_point[l][c])
                fail_msg("%s.weight channel %lld: exported %.9g / %d, expected %.9g / %d", cnn_layer_name(l),
                         (long long)c, (double)e.weight_scale[l][c], e.weight_zero_point[l][c], (double)sc, zp);
            assert_int_equal(zp, 0);   /* symmetric */
        }
    }
    cnn_fq_qparams_free(&e);
    assert_null(e.weight_scale[0]);
    cnn_fq_qparams_free(NULL);
    cnn_fq_destroy(&set);

    /* Fine-tuning: 4 steps of 16 on the first 256 test images, frozen after 2; twice the same. */
    cnn_data small = {g_test.images, g_test.labels, 256};
    cnn_qat_schedule s = cnn_qat_schedule_default();
    assert_int_equal(s.steps, 469);
    assert_int_equal(s.freeze_step, 350);
    s.steps = 4;
    s.batch = 16;
    s.freeze_step = 2;
    cnn_model *q[2] = {NULL, NULL};
    cnn_fq_set *qs[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        qcal_status st = cnn_qat_finetune(ctx, m, &small, &fo, &s, NULL, NULL, &q[k], &qs[k]);
        if (st != QCAL_OK)
            fail_msg("cnn_qat_finetune: %s", qcal_last_error());
        assert_null(qs[k]->act[CNN_TAP_LOGITS]);
        for (int l = 0; l < CNN_NLAYERS; l++) {
            bool frozen = false;
            int64_t steps = 0;
            assert_int_equal(qcal_fakequant_module_status(qs[k]->weight[l], NULL, NULL, &frozen, &steps), QCAL_OK);
            assert_true(frozen);
            assert_int_equal(steps, 4);
        }
    }
    bool changed = false;
    for (int p = 0; p < CNN_NPARAMS; p++) {
        size_t bytes = (size_t)cnn_param_numel(p) * sizeof(float);
        assert_memory_equal(q[0]->param[p], q[1]->param[p], bytes);
        changed = changed || memcmp(q[0]->param[p], m->param[p], bytes) != 0;
    }
    assert_true(changed);
    cnn_fq_qparams e0, e1;
    assert_int_equal(cnn_fq_export(qs[0], &e0), QCAL_OK);
    assert_int_equal(cnn_fq_export(qs[1], &e1), QCAL_OK);
    assert_memory_equal(e0.act_scale, e1.act_scale, sizeof e0.act_scale);
    assert_memory_equal(e0.weight_scale[CNN_FC1], e1.weight_scale[CNN_FC1], 128 * sizeof(float));
    cnn_fq_qparams_free(&e0);
    cnn_fq_qparams_free(&e1);
    /* A bad schedule is refused before anything is created. */
    cnn_model *qm = (cnn_model *)(uintptr_t)1;
    s.batch = 0;
    assert_int_equal(cnn_qat_finetune(ctx, m, &small, &fo, &s, NULL, NULL, &qm, &set), QCAL_ERR_INVALID_ARG);
    assert_ptr_equal(qm, (cnn_model *)(uintptr_t)1);
    assert_null(set);
    for (int k = 0; k < 2; k++) {
        cnn_model_destroy(&q[k]);
        cnn_fq_destroy(&qs[k]);
    }
    cnn_model_destroy(&m);
    cnn_ctx_destroy(&ctx);
}

/* The QAT example's default run, float model trained here in a fresh cache directory. */
static void test_qat_example_accuracies(void **state)
{
    (void)state;
    if (!g_have_data)
        skip();
    cnn_data train = {0};
    assert_int_equal(cnn_data_load(cnn_data_dir(), "train", &train), QCAL_OK);
    assert_int_equal(train.n, 60000);
    assert_int_equal(g_test.n, 10000);
    char dir[] = "/tmp/qcal_test_cache_XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    cnn_qat_opts o = cnn_qat_opts_default();
    cnn_ctx *ctx = NULL;
    assert_int_equal(cnn_ctx_create(500, &ctx), QCAL_OK);
    cnn_qat_result r;
    qcal_status st = cnn_qat_run(ctx, &train, &g_test, &o, NULL, NULL, &r);
    if (st != QCAL_OK)
        fail_msg("cnn_qat_run: %s", qcal_last_error());
    fprintf(stderr,
            "float %.2f%% (trained in %.1f s), post-training fake-quant %.2f%% (agree %.2f%%), QAT %.2f%% "
            "(agree %.2f%%, %.1f s)\n",
            r.float_acc, r.float_train_s, r.ptq_acc, r.ptq_agree, r.qat_acc, r.qat_agree, r.qat_train_s);
    assert_true(r.float_trained);
    assert_int_equal(r.test_images, 10000);
    /* The float model learned (>= 90% is the demo's target with this schedule). */
    if (!(r.float_acc >= 90.0))
        fail_msg("float accuracy %.2f%% < 90%%", r.float_acc);
    if (!(r.qat_acc >= r.ptq_acc))
        fail_msg("QAT accuracy %.2f%% below post-training fake-quant %.2f%%", r.qat_acc, r.ptq_acc);
    if (!(fabs(r.qat_acc - r.float_acc) <= 1.0))
        fail_msg("QAT accuracy %.2f%% not within 1 point of float %.2f%%", r.qat_acc, r.float_acc);
    /* Fake-quant changed some predictions but not many. */
    assert_true(r.ptq_agree > 95.0 && r.ptq_agree < 100.0);

    /* A second run loads the cached float model at once and gets the same float accuracy. */
    cnn_model *m = NULL;
    bool trained = true;
    double t0 = cnn_now();
    assert_int_equal(cnn_load_or_train(ctx, &train, &o.float_opts, NULL, NULL, &m, &trained), QCAL_OK);
    assert_false(trained);
    assert_true(cnn_now() - t0 < 5.0);
    int64_t right = 0;
    assert_int_equal(cnn_evaluate(ctx, m, &g_test, NULL, &right, NULL, NULL, NULL), QCAL_OK);
    assert_true(fabs(100.0 * (double)right / 10000.0 - r.float_acc) < 1e-9);
    cnn_model_destroy(&m);
    char path[4096];
    assert_int_equal(cnn_cache_path(&o.float_opts, path, sizeof path), QCAL_OK);
    assert_int_equal(strncmp(path, dir, strlen(dir)), 0);
    unlink(path);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/qcal", dir);
    rmdir(sub);
    rmdir(dir);
    cnn_ctx_destroy(&ctx);
    cnn_data_free(&train);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_matches_reference),
        cmocka_unit_test(test_forward_backward_matches_pytorch),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_training_is_deterministic),
        cmocka_unit_test(test_fq_opts_export_finetune),
        cmocka_unit_test(test_qat_example_accuracies),
    };
    /* QCAL_TEST_FILTER="test_save*" runs a subset (cmocka glob), e.g. to skip the long run. */
    const char *filter = getenv("QCAL_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
