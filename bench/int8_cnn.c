/* bench_int8_cnn: the demo CNN (Fashion-MNIST shape) in int8 on oneDNN through qcal/int8.h.
 *
 *   conv1 Conv2d(1, 32, 3, padding=1) -> ReLU -> MaxPool2d(2)     28 -> 14
 *   conv2 Conv2d(32, 64, 3, padding=1) -> ReLU -> MaxPool2d(2)    14 -> 7
 *   flatten NCHW (3136) -> fc1 Linear(3136, 128) -> ReLU -> fc2 Linear(128, 10) (f32 logits)
 *
 * Random weights (fixed seed, PyTorch's default init range), random 28x28 inputs normalised as
 * the demo's ((p/255 - 0.2860) / 0.3530). Verify, then time: the activation qparams are
 * calibrated on 64 images with a plain-C float forward, the int8 logits of those images are
 * checked against it (argmax agreement, relative error), then the 10,000-image forward is
 * timed for several chunk sizes, threading over whole chunks (default) and inside oneDNN's
 * primitives: warm-up, median of 7 (CLOCK_MONOTONIC).
 * Reference: PyTorch 1.13 FX int8 (onednn backend) takes 0.17 s for the 10,000 test images
 * on this 2-core AVX-512 VNNI machine. Threads: OMP_NUM_THREADS (oneDNN's OpenMP runtime).
 * Usage: bench_int8_cnn [n_images (10000)] */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qcal/calib.h"
#include "qcal/int8.h"
#include "qcal/observer.h"
#include "qcal/tensor.h"

enum { N_CAL = 64, C1 = 32, C2 = 64, F1 = 128, F2 = 10 };

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static float urand(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)(rng >> 40) / (float)(1ull << 24);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (all threads): on a shared machine, cpu / threads is a
 * better estimate of the idle-machine time than the wall clock. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void conv3x3_relu(const float *x, int64_t n, int64_t c, int64_t hw, const float *w,
                         const float *b, int64_t oc, float *y)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < oc; o++)
            for (int64_t r = 0; r < hw; r++)
                for (int64_t s = 0; s < hw; s++) {
                    float acc = b[o];
                    for (int64_t ci = 0; ci < c; ci++)
                        for (int64_t u = 0; u < 3; u++)
                            for (int64_t v = 0; v < 3; v++) {
                                int64_t yy = r + u - 1, xx = s + v - 1;
                                if (yy >= 0 && yy < hw && xx >= 0 && xx < hw)
                                    acc += x[((i * c + ci) * hw + yy) * hw + xx] *
                                           w[((o * c + ci) * 3 + u) * 3 + v];
                            }
                    y[((i * oc + o) * hw + r) * hw + s] = acc > 0.0f ? acc : 0.0f;
                }
}

static void pool2(const float *x, int64_t nc, int64_t hw, float *y)
{
    int64_t o = hw / 2;
    for (int64_t i = 0; i < nc; i++)
        for (int64_t r = 0; r < o; r++)
            for (int64_t s = 0; s < o; s++) {
                const float *p = x + (i * hw + 2 * r) * hw + 2 * s;
                y[(i * o + r) * o + s] = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[hw], p[hw + 1]));
            }
}

static void linear(const float *x, int64_t n, int64_t k, const float *w, const float *b,
                   int64_t oc, int relu, float *y)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t o = 0; o < oc; o++) {
            float acc = b[o];
            for (int64_t j = 0; j < k; j++)
                acc += x[i * k + j] * w[o * k + j];
            y[i * oc + o] = relu && acc < 0.0f ? 0.0f : acc;
        }
}

#define CHECK(call)                                                                       \
    do {                                                                                  \
        qcal_status st_ = (call);                                                         \
        if (st_ != QCAL_OK) {                                                             \
            fprintf(stderr, "%s failed: %s: %s\n", #call, qcal_status_str(st_),           \
                    qcal_last_error());                                                   \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 10000;
    if (n < N_CAL)
        n = N_CAL;
    /* weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as torch.nn's default init */
    float *w1 = malloc(C1 * 9 * sizeof(float)), *b1 = malloc(C1 * sizeof(float));
    float *w2 = malloc(C2 * C1 * 9 * sizeof(float)), *b2 = malloc(C2 * sizeof(float));
    float *w3 = malloc((size_t)F1 * 3136 * sizeof(float)), *b3 = malloc(F1 * sizeof(float));
    float *w4 = malloc(F2 * F1 * sizeof(float)), *b4 = malloc(F2 * sizeof(float));
    float *x = malloc((size_t)n * 784 * sizeof(float));
    float *logits = malloc((size_t)n * F2 * sizeof(float));
    if (!w1 || !b1 || !w2 || !b2 || !w3 || !b3 || !w4 || !b4 || !x || !logits) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    const float k1 = 1.0f / 3.0f, k2 = 1.0f / sqrtf(288.0f), k3 = 1.0f / 56.0f,
                k4 = 1.0f / sqrtf(128.0f);
    for (int i = 0; i < C1 * 9; i++) w1[i] = urand(-k1, k1);
    for (int i = 0; i < C1; i++) b1[i] = urand(-k1, k1);
    for (int i = 0; i < C2 * C1 * 9; i++) w2[i] = urand(-k2, k2);
    for (int i = 0; i < C2; i++) b2[i] = urand(-k2, k2);
    for (int i = 0; i < F1 * 3136; i++) w3[i] = urand(-k3, k3);
    for (int i = 0; i < F1; i++) b3[i] = urand(-k3, k3);
    for (int i = 0; i < F2 * F1; i++) w4[i] = urand(-k4, k4);
    for (int i = 0; i < F2; i++) b4[i] = urand(-k4, k4);
    for (int64_t i = 0; i < n * 784; i++)
        x[i] = ((float)(int)urand(0.0f, 256.0f) / 255.0f - 0.2860f) / 0.3530f;

    /* calibrate on N_CAL images with a float forward */
    float *a1 = malloc((size_t)N_CAL * C1 * 784 * sizeof(float));
    float *p1 = malloc((size_t)N_CAL * C1 * 196 * sizeof(float));
    float *a2 = malloc((size_t)N_CAL * C2 * 196 * sizeof(float));
    float *p2 = malloc((size_t)N_CAL * 3136 * sizeof(float));
    float *f1 = malloc((size_t)N_CAL * F1 * sizeof(float)), *ref = malloc(N_CAL * F2 * sizeof(float));
    /* float activations at the four layer inputs -> a calibration session (minmax, quint8
     * per_tensor_affine) -> a table the int8 net is built from (weights: per-channel observer) */
    conv3x3_relu(x, N_CAL, 1, 28, w1, b1, C1, a1);
    pool2(a1, N_CAL * C1, 28, p1);
    conv3x3_relu(p1, N_CAL, C1, 14, w2, b2, C2, a2);
    pool2(a2, N_CAL * C2, 14, p2);
    linear(p2, N_CAL, 3136, w3, b3, F1, 1, f1);
    linear(f1, N_CAL, F1, w4, b4, F2, 0, ref);
    qcal_calib_table *table = NULL;
    {
        qcal_observer_config mm;
        qcal_observer_config_default(&mm, QCAL_OBSERVER_MINMAX);
        qcal_calib_rules *rules = NULL;
        CHECK(qcal_calib_rules_create(&rules));
        CHECK(qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &mm));
        qcal_calib_session_options so;
        qcal_calib_session_options_default(&so);
        so.rules = rules;
        qcal_calib_session *cs = NULL;
        CHECK(qcal_calib_session_create(&so, &cs));
        static const char *const names[4] = {"conv1", "conv2", "fc1", "fc2"};
        float *taps[4] = {x, p1, p2, f1};
        const int64_t numel[4] = {784, C1 * 196, 3136, F1};
        for (int i = 0; i < 4; i++) {
            qcal_tensor t;
            const int64_t shape[2] = {N_CAL, numel[i]};
            CHECK(qcal_tensor_init(&t, taps[i], 2, shape));
            CHECK(qcal_calib_session_observe(cs, names[i], QCAL_CALIB_ROLE_ACTIVATION, 0, &t));
        }
        CHECK(qcal_calib_session_table(cs, &table));
        qcal_calib_session_destroy(&cs);
        qcal_calib_rules_destroy(&rules);
    }
    qcal_int8_layer_desc layers[9];
    qcal_int8_layer_desc_default(&layers[0], QCAL_INT8_CONV2D);
    layers[0].fqn = "conv1";
    layers[0].conv.out_channels = C1;
    layers[0].conv.kernel_h = layers[0].conv.kernel_w = 3;
    layers[0].conv.pad_h = layers[0].conv.pad_w = 1;
    layers[0].conv.weight = w1;
    layers[0].conv.bias = b1;
    qcal_int8_layer_desc_default(&layers[1], QCAL_INT8_RELU);
    qcal_int8_layer_desc_default(&layers[2], QCAL_INT8_MAXPOOL2D);
    layers[3] = layers[0];
    layers[3].fqn = "conv2";
    layers[3].conv.out_channels = C2;
    layers[3].conv.weight = w2;
    layers[3].conv.bias = b2;
    layers[4] = layers[1];
    layers[5] = layers[2];
    qcal_int8_layer_desc_default(&layers[6], QCAL_INT8_LINEAR);
    layers[6].fqn = "fc1";
    layers[6].linear.out_features = F1;
    layers[6].linear.weight = w3;
    layers[6].linear.bias = b3;
    layers[7] = layers[1];
    qcal_int8_layer_desc_default(&layers[8], QCAL_INT8_LINEAR);
    layers[8].fqn = "fc2";
    layers[8].linear.out_features = F2;
    layers[8].linear.weight = w4;
    layers[8].linear.bias = b4;

    static const int64_t chunks[] = {64, 128, 256, 512, 1024};
    printf("int8 CNN on %lld random 28x28 images (qcal_int8_net, oneDNN)\n", (long long)n);
    for (size_t run = 0; run < 2 * sizeof chunks / sizeof chunks[0]; run++) {
        const size_t ci = run % (sizeof chunks / sizeof chunks[0]);
        const bool par = run < sizeof chunks / sizeof chunks[0];
        qcal_int8_net_options opt;
        qcal_int8_net_options_default(&opt);
        opt.batch_chunk = chunks[ci];
        opt.chunk_parallel = par;
        qcal_int8_net *net = NULL;
        const int64_t shape[3] = {1, 28, 28};
        CHECK(qcal_int8_net_from_table(&opt, table, 3, shape, 9, layers, NULL, &net));

        /* verify on the calibration images */
        CHECK(qcal_int8_net_forward(net, N_CAL, x, logits));
        int agree = 0;
        double num = 0.0, den = 0.0;
        for (int i = 0; i < N_CAL; i++) {
            int ag = 0, ar = 0;
            for (int o = 0; o < F2; o++) {
                ag = logits[i * F2 + o] > logits[i * F2 + ag] ? o : ag;
                ar = ref[i * F2 + o] > ref[i * F2 + ar] ? o : ar;
                num += (logits[i * F2 + o] - ref[i * F2 + o]) * (logits[i * F2 + o] - ref[i * F2 + o]);
                den += ref[i * F2 + o] * ref[i * F2 + o];
            }
            agree += ag == ar;
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        if (agree < N_CAL * 9 / 10 || rel > 0.1) {
            fprintf(stderr, "verification failed: argmax agreement %d/%d, relative error %.3g\n",
                    agree, N_CAL, rel);
            return 1;
        }
        if (run == 0) {
            printf("verify: int8 vs f32 logits on %d images: argmax agree %d/%d, rel. L2 error %.4f\n",
                   N_CAL, agree, N_CAL, rel);
            for (int32_t i = 0; i < 6; i++) {
                const char *impl = NULL;
                CHECK(qcal_int8_net_impl(net, i, &impl));
                printf("  layer %d: %s\n", i, impl);
            }
        }

        enum { REPS = 7 };
        double t[REPS], tc[REPS];
        CHECK(qcal_int8_net_forward(net, n, x, logits));   /* warm-up: builds every primitive */
        for (int r = 0; r < REPS; r++) {
            double t0 = now(), c0 = cpu_now();
            CHECK(qcal_int8_net_forward(net, n, x, logits));
            t[r] = now() - t0;
            tc[r] = cpu_now() - c0;
        }
        qsort(t, REPS, sizeof t[0], cmp_double);
        qsort(tc, REPS, sizeof tc[0], cmp_double);
        double sum = 0.0;
        for (int64_t i = 0; i < n * F2; i++)
            sum += logits[i];
        printf("%s chunk %5lld: median %.4f s (min %.4f, cpu %.4f s)  %.0f images/s  "
               "%.2f GB/s of f32 input  [checksum %.6g]\n", par ? "threads over chunks   " : "threads in primitives ",
               (long long)chunks[ci], t[REPS / 2], t[0], tc[REPS / 2],
               (double)n / t[REPS / 2], (double)n * 784 * 4 / t[REPS / 2] / 1e9, sum);
        qcal_int8_net_destroy(&net);
    }
    free(w1); free(b1); free(w2); free(b2); free(w3); free(b3); free(w4); free(b4);
    qcal_calib_table_destroy(&table);
    free(x); free(logits); free(a1); free(p1); free(a2); free(p2); free(f1); free(ref);
    return 0;
}
