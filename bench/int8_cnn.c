/* bench_int8_cnn: the demo CNN (Fashion-MNIST shape) in int8 on oneDNN through qcal/int8.h.
 *
 *   conv1 Conv2d(1, 32, 3, padding=1) -> ReLU -> MaxPool2d(2)     28 -> 14
 *   conv2 Conv2d(32, 64, 3, padding=1) -> ReLU -> MaxPool2d(2)    14 -> 7
 *   flatten NCHW (3136) -> fc1 Linear(3136, 128) -> ReLU -> fc2 Linear(128, 10) (f32 logits)
 *
 * Random weights (fixed seed, PyTorch's default init range), random 28x28 inputs normalised as
 * the demo's ((p/255 - 0.2860) / 0.3530). Verify, then time: the float activations of 64
 * images at the four layer inputs go through a calibration session (minmax observers) into a
 * table, the net is built from it (qcal_int8_net_from_table), its logits on those images are
 * checked against the float forward (argmax agreement, relative error), then:
 * - without --torch: the 10,000-image forward is timed for several chunk sizes, threading
 *   over whole chunks (default) and inside oneDNN's primitives: warm-up, median of 7;
 * - with --torch CMD (CMD runs bench/torch_ref.py, e.g. "/usr/bin/python3 bench/torch_ref.py"):
 *   the row against PyTorch 1.13's FX int8 model (onednn engine) on the same images, measured
 *   interleaved in K pairs (--pairs, default 7); the verdict is on the median of the paired
 *   ratios (target >= 1.3x), printed with its spread. Same-run ratios hold on a busy machine
 *   where absolute times do not.
 * Threads: OMP_NUM_THREADS (oneDNN's OpenMP runtime; PyTorch gets the same count).
 * The row uses qcal's default options; --chunk N and --threads-in-primitives change them.
 * --json FILE writes the paired row as one JSON object (bench/run collects it).
 * Usage: bench_int8_cnn [n_images (10000)] [--torch CMD] [--pairs K] [--chunk N]
 *                       [--threads-in-primitives] [--json FILE] */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

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

static int omp_threads(void)
{
    const char *e = getenv("OMP_NUM_THREADS");
    int t = e ? atoi(e) : 0;
    if (t < 1) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        t = c > 0 ? (int)c : 1;
    }
    return t;
}

static qcal_int8_net *build(const qcal_calib_table *table, const qcal_int8_layer_desc *layers,
                            int64_t chunk, bool par)
{
    qcal_int8_net_options opt;
    qcal_int8_net_options_default(&opt);
    opt.batch_chunk = chunk;
    opt.chunk_parallel = par;
    qcal_int8_net *net = NULL;
    const int64_t shape[3] = {1, 28, 28};
    CHECK(qcal_int8_net_from_table(&opt, table, 3, shape, 9, layers, NULL, &net));
    return net;
}

/* Verify before timing: int8 logits of the calibration images against the float forward. */
static void verify(qcal_int8_net *net, const float *x, const float *ref, float *logits, bool print)
{
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
        exit(1);
    }
    if (print) {
        printf("verify: int8 vs f32 logits on %d images: argmax agree %d/%d, rel. L2 error %.4f\n",
               N_CAL, agree, N_CAL, rel);
        for (int32_t i = 0; i < 6; i++) {
            const char *impl = NULL;
            CHECK(qcal_int8_net_impl(net, i, &impl));
            printf("  layer %d: %s\n", i, impl);
        }
    }
}

/* PyTorch helper (bench/torch_ref.py --serve): started once, asked one row at a time. */
typedef struct torch_server {
    pid_t pid;
    FILE *to, *from;
} torch_server;

static int torch_start(torch_server *ts, const char *cmd, int threads)
{
    memset(ts, 0, sizeof *ts);
    char full[4096];
    snprintf(full, sizeof full, "%s --serve --quick --threads %d", cmd, threads);
    int in[2], out[2];
    if (pipe(in) != 0)
        return -1;
    if (pipe(out) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    ts->pid = pid;
    ts->to = fdopen(in[1], "w");
    ts->from = fdopen(out[0], "r");
    char line[512];
    if (!ts->to || !ts->from || !fgets(line, sizeof line, ts->from) || !strstr(line, "\"ready\""))
        return -1;
    return 0;
}

/* One PyTorch measurement of the int8 CNN on n images (median of its repeats) into *s. */
static int torch_time(torch_server *ts, int64_t n, double *s)
{
    fprintf(ts->to, "int8_cnn %lld\n", (long long)(n * 784));
    fflush(ts->to);
    char line[4096];
    if (!fgets(line, sizeof line, ts->from)) {
        fprintf(stderr, "bench_int8_cnn: the PyTorch helper stopped answering\n");
        return -1;
    }
    const char *m = strstr(line, "\"median_s\":");
    if (!m) {
        fprintf(stderr, "bench_int8_cnn: PyTorch: %s", line);
        return -1;
    }
    *s = atof(m + strlen("\"median_s\":"));
    return 0;
}

static void torch_stop(torch_server *ts)
{
    if (ts->to)
        fclose(ts->to);
    if (ts->from)
        fclose(ts->from);
    if (ts->pid > 0)
        waitpid(ts->pid, NULL, 0);
}

/* The paired row as bench/run's other rows spell it (written to FILE.tmp, then renamed). */
static int write_row_json(const char *path, long long n, int threads, double q_s, double t_s,
                          double ratio, double lo, double hi, int pairs)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    fprintf(f, "[{\"name\": \"int8_cnn_eval\", \"label\": \"int8 evaluation of the demo CNN, "
               "%lld images\", \"threads\": %d, \"qcal_s\": %.6g, \"torch_s\": %.6g, "
               "\"torch_ratio\": %.6g, \"torch_ratio_min\": %.6g, \"torch_ratio_max\": %.6g, "
               "\"pairs\": %d, \"target\": \">= 1.3x torch\", \"pass\": %s}]\n",
            n, threads, q_s, t_s, ratio, lo, hi, pairs, ratio >= 1.3 ? "true" : "false");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int64_t n = 10000;
    const char *torch_cmd = NULL;
    int pairs = 7;
    const char *json_path = NULL;
    qcal_int8_net_options def;
    qcal_int8_net_options_default(&def);
    int64_t row_chunk = def.batch_chunk;   /* the row's options: qcal's defaults unless given */
    bool row_par = def.chunk_parallel;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--torch") && i + 1 < argc)
            torch_cmd = argv[++i];
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_path = argv[++i];
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc)
            row_chunk = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads-in-primitives"))
            row_par = false;
        else if (argv[i][0] != '-')
            n = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench_int8_cnn [n_images] [--torch CMD] [--pairs K] [--chunk N] "
                    "[--threads-in-primitives] [--json FILE]\n");
            return 2;
        }
    }
    pairs = pairs < 1 ? 1 : pairs;
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

    printf("int8 CNN on %lld random 28x28 images (qcal_int8_net, oneDNN), %d OpenMP threads\n",
           (long long)n, omp_threads());
    static const int64_t chunks[] = {64, 128, 256, 512, 1024};
    const size_t nchunks = sizeof chunks / sizeof chunks[0];
    const size_t nruns = torch_cmd ? 0 : 2 * nchunks;   /* the sweep (no --torch) */
    for (size_t run = 0; run < nruns; run++) {
        const size_t ci = run % nchunks;
        const bool par = run < nchunks;
        qcal_int8_net *net = build(table, layers, chunks[ci], par);
        verify(net, x, ref, logits, run == 0);
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
    if (torch_cmd) {
        /* The row: qcal's default options and PyTorch's FX int8 model (onednn engine) on the
         * same n images, measured interleaved in pairs (qcal median of 3 forwards, then
         * PyTorch's median of 3 calls); the verdict is on the median of the paired ratios. */
        printf("row: batch_chunk %lld, %s\n", (long long)row_chunk,
               row_par ? "threads over chunks" : "threads in primitives");
        qcal_int8_net *net = build(table, layers, row_chunk, row_par);
        verify(net, x, ref, logits, true);
        double tb = now();
        CHECK(qcal_int8_net_forward(net, n, x, logits));   /* warm-up: builds the chunk's plans */
        tb = now() - tb;
        double ts2 = now();
        CHECK(qcal_int8_net_forward(net, n, x, logits));   /* primitives reused */
        ts2 = now() - ts2;
        printf("first forward (builds primitives and reorders weights) %.4f s, second %.4f s\n",
               tb, ts2);
        torch_server ts;
        if (torch_start(&ts, torch_cmd, omp_threads()) != 0) {
            fprintf(stderr, "bench_int8_cnn: cannot start '%s'\n", torch_cmd);
            return 1;
        }
        double tq[64], tt[64], ratio[64];
        int got = 0;
        for (int k = 0; k < pairs && k < 64; k++) {
            double t3[3];
            for (int r = 0; r < 3; r++) {
                double t0 = now();
                CHECK(qcal_int8_net_forward(net, n, x, logits));
                t3[r] = now() - t0;
            }
            qsort(t3, 3, sizeof t3[0], cmp_double);
            double pt;
            if (torch_time(&ts, n, &pt) != 0)
                break;
            tq[got] = t3[1];
            tt[got] = pt;
            ratio[got] = pt / t3[1];
            printf("pair %d: qcal %.4f s  PyTorch %.4f s  ratio %.2fx\n", k, tq[got], tt[got], ratio[got]);
            fflush(stdout);
            got++;
        }
        torch_stop(&ts);
        if (got == 0) {
            fprintf(stderr, "bench_int8_cnn: no PyTorch measurement\n");
            return 1;
        }
        qsort(tq, (size_t)got, sizeof tq[0], cmp_double);
        qsort(tt, (size_t)got, sizeof tt[0], cmp_double);
        qsort(ratio, (size_t)got, sizeof ratio[0], cmp_double);
        const double med = got % 2 ? ratio[got / 2] : 0.5 * (ratio[got / 2 - 1] + ratio[got / 2]);
        printf("int8 CNN %lld images: qcal median %.4f s, PyTorch median %.4f s, speed-up %.2fx "
               "(median of %d paired ratios, spread %.2f-%.2f)  target >= 1.30x  %s\n",
               (long long)n, tq[got / 2], tt[got / 2], med, got, ratio[0], ratio[got - 1],
               med >= 1.3 ? "OK" : "MISSED");
        if (json_path && write_row_json(json_path, n, omp_threads(), tq[got / 2], tt[got / 2],
                                        med, ratio[0], ratio[got - 1], got) != 0) {
            fprintf(stderr, "bench_int8_cnn: cannot write %s\n", json_path);
            return 1;
        }
        qcal_int8_net_destroy(&net);
    }
    free(w1); free(b1); free(w2); free(b2); free(w3); free(b3); free(w4); free(b4);
    qcal_calib_table_destroy(&table);
    free(x); free(logits); free(a1); free(p1); free(a2); free(p2); free(f1); free(ref);
    return 0;
}
