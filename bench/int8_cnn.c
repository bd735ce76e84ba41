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
 * --deploy DIR --table T --ort CMD (bench/engines.py, "two engines, one table"): the demo CNN
 *   with its trained weights (DIR/model.safetensors, from `cnn_deploy export DIR`) built from
 *   the table T of its ONNX model, against ONNX Runtime running the QDQ model `qcal qdq` made
 *   from the same table (CMD starts bench/ort_serve.cjs) on DIR/test.npy: both verified (top-1
 *   on DIR/labels.npy, predictions against each other), then timed in K interleaved pairs
 *   (target >= 1.0x); without VNNI the same net without the exact weight split is timed
 *   beside it (where the time goes), and --ort-other CMD2 (ONNX Runtime with its other int8
 *   kernels) too.
 * Usage: bench_int8_cnn [n_images (10000)] [--torch CMD] [--pairs K] [--chunk N]
 *                       [--threads-in-primitives] [--json FILE]
 *        bench_int8_cnn --deploy DIR --table T --ort CMD [--ort-other CMD2] [--pairs K]
 *                       [--json FILE] */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qcal/calib.h"
#include "qcal/int8.h"
#include "qcal/npy.h"
#include "qcal/safetensors.h"
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

/* Starts `sh -c full` with pipes to its stdin and stdout; waits for its "ready" line (copied
 * into ready[0..cap) when ready is not NULL). */
static int server_start(torch_server *ts, const char *full, char *ready, size_t cap)
{
    memset(ts, 0, sizeof *ts);
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
    /* a server started later must not inherit this one's pipes: its stdin would never see
     * end-of-file at torch_stop, and waitpid would wait for ever */
    fcntl(in[1], F_SETFD, FD_CLOEXEC);
    fcntl(out[0], F_SETFD, FD_CLOEXEC);
    ts->pid = pid;
    ts->to = fdopen(in[1], "w");
    ts->from = fdopen(out[0], "r");
    char line[512];
    if (!ts->to || !ts->from || !fgets(line, sizeof line, ts->from) || !strstr(line, "\"ready\""))
        return -1;
    if (ready)
        snprintf(ready, cap, "%s", line);
    return 0;
}

static int torch_start(torch_server *ts, const char *cmd, int threads)
{
    char full[4096];
    snprintf(full, sizeof full, "%s --serve --quick --threads %d", cmd, threads);
    return server_start(ts, full, NULL, 0);
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

/* ---- two engines, one table (--deploy DIR --table T --ort CMD; bench/engines.py) ----------- */

/* The demo CNN's ONNX tensor names (examples/cnn/cnn_onnx.c, torch.onnx.export's): each
 * layer's input, then the tensors before it whose qparams it keeps (cnn_deploy int8). */
static const char *const DEPLOY_IN[4][3] = {
    {"input"},
    {"/pool1/MaxPool_output_0", "/relu1/Relu_output_0"},
    {"/flatten/Flatten_output_0", "/pool2/MaxPool_output_0", "/relu2/Relu_output_0"},
    {"/relu3/Relu_output_0"}};
static const char *const DEPLOY_PARAMS[8] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                             "conv2.bias",   "fc1.weight", "fc1.bias",
                                             "fc2.weight",   "fc2.bias"};

static int argmax10(const float *v)
{
    int a = 0;
    for (int o = 1; o < F2; o++)
        a = v[o] > v[a] ? o : a;
    return a;
}

/* One ONNX Runtime command answered with one JSON line into line[0..cap). */
static int server_ask(torch_server *ts, const char *cmd, char *line, size_t cap)
{
    fprintf(ts->to, "%s\n", cmd);
    fflush(ts->to);
    if (!fgets(line, (int)cap, ts->from)) {
        fprintf(stderr, "bench_int8_cnn: ONNX Runtime stopped answering\n");
        return -1;
    }
    return 0;
}

static double json_field(const char *line, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    return p ? atof(p + strlen(k)) : NAN;
}

/* qcal's int8 net of the demo CNN (DIR/model.safetensors, the table of its ONNX model) against
 * ONNX Runtime running the QDQ model from the same table (CMD: bench/ort_serve.cjs), on
 * DIR/test.npy: both verified (top-1 against DIR/labels.npy, predictions against each other),
 * then timed in interleaved pairs (qcal: median of 3 forwards of every image; ONNX Runtime:
 * median of 3 passes). Threads: OMP_NUM_THREADS for qcal, the same count given in CMD. */
static int deploy_row(const char *dir, const char *table_path, const char *ort_cmd,
                      const char *other_cmd, int pairs, const char *json_path)
{
    char path[4200];
    qcal_safetensors *sf = NULL;
    float *param[8] = {0};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(qcal_safetensors_open(path, &sf));
    for (int i = 0; i < 8; i++) {
        int64_t idx;
        qcal_safetensors_tensor_info info;
        CHECK(qcal_safetensors_find(sf, DEPLOY_PARAMS[i], &idx));
        CHECK(qcal_safetensors_info(sf, idx, &info));
        param[i] = malloc((size_t)info.numel * sizeof(float));
        if (!param[i]) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        CHECK(qcal_safetensors_read_f32(sf, idx, 0, info.numel, param[i]));
    }
    qcal_safetensors_close(&sf);
    qcal_calib_table *table = NULL;
    CHECK(qcal_calib_table_read_json(table_path, &table));
    qcal_npy_array x = {0}, lab = {0};
    snprintf(path, sizeof path, "%s/test.npy", dir);
    CHECK(qcal_npy_read_f32(path, &x));
    snprintf(path, sizeof path, "%s/labels.npy", dir);
    CHECK(qcal_npy_read(path, &lab));
    const int64_t n = x.shape[0];
    if (x.ndim != 4 || x.shape[1] != 1 || x.shape[2] != 28 || x.shape[3] != 28 ||
        lab.dtype != QCAL_NPY_U8 || lab.numel != n) {
        fprintf(stderr, "bench_int8_cnn: %s: want [N,1,28,28] images and N uint8 labels\n", dir);
        return 1;
    }
    const char *in_name[4];
    for (int l = 0; l < 4; l++) {
        const qcal_calib_entry *e = NULL;
        in_name[l] = DEPLOY_IN[l][0];
        for (int c = 0; c < 3 && DEPLOY_IN[l][c]; c++)
            if (qcal_calib_table_find(table, DEPLOY_IN[l][c], QCAL_CALIB_ROLE_ACTIVATION, &e) ==
                QCAL_OK) {
                in_name[l] = DEPLOY_IN[l][c];
                break;
            }
        qcal_clear_error();
    }
    qcal_int8_layer_desc d[9];
    int nl = 0;
    for (int l = 0; l < 4; l++) {
        qcal_int8_layer_desc *y = &d[nl];
        if (l < 2) {
            qcal_int8_layer_desc_default(&y[0], QCAL_INT8_CONV2D);
            y[0].conv.out_channels = l == 0 ? C1 : C2;
            y[0].conv.kernel_h = y[0].conv.kernel_w = 3;
            y[0].conv.pad_h = y[0].conv.pad_w = 1;
            y[0].conv.weight = param[2 * l];
            y[0].conv.bias = param[2 * l + 1];
            qcal_int8_layer_desc_default(&y[1], QCAL_INT8_RELU);
            qcal_int8_layer_desc_default(&y[2], QCAL_INT8_MAXPOOL2D);
            nl += 3;
        } else {
            qcal_int8_layer_desc_default(&y[0], QCAL_INT8_LINEAR);
            y[0].linear.out_features = l == 2 ? F1 : F2;
            y[0].linear.weight = param[2 * l];
            y[0].linear.bias = param[2 * l + 1];
            nl++;
            if (l == 2)
                qcal_int8_layer_desc_default(&d[nl++], QCAL_INT8_RELU);
        }
        y[0].fqn = in_name[l];
    }
    /* the logits in u8 with the table's "logits" qparams when it has them, as the QDQ model */
    const qcal_calib_entry *le = NULL;
    const char *out_fqn =
        qcal_calib_table_find(table, "logits", QCAL_CALIB_ROLE_ACTIVATION, &le) == QCAL_OK
            ? "logits" : NULL;
    qcal_clear_error();
    qcal_int8_net *net = NULL, *net_ns = NULL;
    const int64_t in_shape[3] = {1, 28, 28};
    CHECK(qcal_int8_net_from_table(NULL, table, 3, in_shape, nl, d, out_fqn, &net));
    /* the same net without the exact weight split (where the time goes when oneDNN has no
     * VNNI: the split doubles the MACs; without it u8 x s8 pairs may saturate, as in ONNX
     * Runtime's default kernels): timed beside the row, not its verdict */
    qcal_int8_net_options nso;
    qcal_int8_net_options_default(&nso);
    nso.weight_split = QCAL_INT8_SPLIT_NEVER;
    CHECK(qcal_int8_net_from_table(&nso, table, 3, in_shape, nl, d, out_fqn, &net_ns));
    float *logits = malloc((size_t)n * F2 * sizeof(float));
    if (!logits) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    const float *xd = x.data;
    const uint8_t *yl = lab.data;
    const int threads = omp_threads();
    char ready[512], ready2[512] = "", line[4096];
    torch_server ort, ort2 = {0};
    if (server_start(&ort, ort_cmd, ready, sizeof ready) != 0) {
        fprintf(stderr, "bench_int8_cnn: cannot start ONNX Runtime: '%s'\n", ort_cmd);
        return 1;
    }
    if (other_cmd && server_start(&ort2, other_cmd, ready2, sizeof ready2) != 0) {
        fprintf(stderr, "bench_int8_cnn: cannot start ONNX Runtime: '%s'\n", other_cmd);
        return 1;
    }
    const bool exact = strstr(ready, "\"precision\":\"high\"") != NULL;
    printf("two engines on the demo CNN, %lld test images, %d thread(s); ONNX Runtime: %s",
           (long long)n, threads, ready);
    if (other_cmd)
        printf("timed beside it: ONNX Runtime %s", ready2);
    /* verify: both engines' predictions on every image, before any timing */
    double tb = now();
    CHECK(qcal_int8_net_forward(net, n, xd, logits));   /* also builds the primitives */
    tb = now() - tb;
    char ort_out[4300], cmd[4400];
    snprintf(ort_out, sizeof ort_out, "%s/ort_logits_%dt.npy", dir, threads);
    snprintf(cmd, sizeof cmd, "logits %s", ort_out);
    if (server_ask(&ort, cmd, line, sizeof line) != 0 || !strstr(line, "\"ok\"")) {
        fprintf(stderr, "bench_int8_cnn: ONNX Runtime: %s", line);
        return 1;
    }
    qcal_npy_array z = {0};
    CHECK(qcal_npy_read_f32(ort_out, &z));
    if (z.numel != n * F2) {
        fprintf(stderr, "bench_int8_cnn: ONNX Runtime's logits have %lld values, want %lld\n",
                (long long)z.numel, (long long)(n * F2));
        return 1;
    }
    int64_t top_q = 0, top_o = 0, same = 0;
    const float *zd = z.data;
    for (int64_t i = 0; i < n; i++) {
        int aq = argmax10(logits + i * F2), ao = argmax10(zd + i * F2);
        top_q += aq == yl[i];
        top_o += ao == yl[i];
        same += aq == ao;
    }
    double pq = 100.0 * (double)top_q / (double)n, po = 100.0 * (double)top_o / (double)n,
           ps = 100.0 * (double)same / (double)n;
    printf("verify: top-1 qcal int8 %.2f%%, ONNX Runtime int8 %.2f%%, same prediction on "
           "%.2f%% of the images\n", pq, po, ps);
    qcal_npy_array_free(&z);
    /* With session.x64quantprecision=1 (U8U8) ONNX Runtime computes what qcal does: >= 99.8% of
     * the predictions equal (ort.cnn_qdq's bound). Its default x86 kernels (U8S8) let pair sums
     * saturate on CPUs without VNNI (docs/onnx.md): 1-1.5% of the predictions differ here. */
    const double need_same = exact ? 99.8 : 98.0;
    if (ps < need_same || fabs(pq - po) > 0.5 || pq < 80.0) {
        fprintf(stderr, "bench_int8_cnn: verification failed: the engines disagree (top-1 %.2f vs "
                "%.2f%%, same prediction %.2f%%)\n", pq, po, ps);
        return 1;
    }
    double ts2 = now();
    CHECK(qcal_int8_net_forward(net, n, xd, logits));
    ts2 = now() - ts2;
    printf("qcal: first forward (builds primitives, reorders weights) %.4f s, second %.4f s\n", tb,
           ts2);
    char impls[512] = "";
    for (int32_t i = 0; i < 6; i++) {
        const char *impl = NULL;
        if (qcal_int8_net_impl(net, i, &impl) == QCAL_OK && impl)
            snprintf(impls + strlen(impls), sizeof impls - strlen(impls), "%s%s", i ? ", " : "",
                     impl);
    }
    qcal_clear_error();
    printf("qcal: oneDNN implementations by layer: %s\n", impls);
    const bool split = strstr(impls, " split") != NULL;
    if (split)
        CHECK(qcal_int8_net_forward(net_ns, n, xd, logits));   /* builds its primitives */
    enum { MAXP = 64 };
    double tq[MAXP], to[MAXP], ratio[MAXP], cq[MAXP], tn[MAXP], rn[MAXP], t2[MAXP], r2[MAXP];
    int got = 0;
    for (int k = 0; k < pairs && k < MAXP; k++) {
        double t3[3], c3[3], n3[3] = {0, 0, 0};
        for (int r = 0; r < 3; r++) {
            double t0 = now(), c0 = cpu_now();
            CHECK(qcal_int8_net_forward(net, n, xd, logits));
            t3[r] = now() - t0;
            c3[r] = cpu_now() - c0;
        }
        if (split)
            for (int r = 0; r < 3; r++) {
                double t0 = now();
                CHECK(qcal_int8_net_forward(net_ns, n, xd, logits));
                n3[r] = now() - t0;
            }
        qsort(t3, 3, sizeof t3[0], cmp_double);
        qsort(c3, 3, sizeof c3[0], cmp_double);
        qsort(n3, 3, sizeof n3[0], cmp_double);
        /* ONNX Runtime's spinning workers stop before the next qcal sample */
        struct timespec pause = {0, 300 * 1000 * 1000};
        nanosleep(&pause, NULL);
        if (server_ask(&ort, "time 3", line, sizeof line) != 0)
            break;
        double ot = json_field(line, "median_s");
        if (!(ot > 0)) {
            fprintf(stderr, "bench_int8_cnn: ONNX Runtime: %s", line);
            break;
        }
        nanosleep(&pause, NULL);
        double ot2 = NAN;
        if (other_cmd) {
            if (server_ask(&ort2, "time 3", line, sizeof line) != 0)
                break;
            ot2 = json_field(line, "median_s");
            nanosleep(&pause, NULL);
        }
        t2[got] = ot2;
        /* the pair without exact arithmetic: ONNX Runtime's other kernels against qcal without
         * the split when it splits, else against qcal */
        r2[got] = ot2 / (split ? n3[1] : t3[1]);
        tq[got] = t3[1];
        cq[got] = c3[1];
        to[got] = ot;
        ratio[got] = ot / t3[1];
        tn[got] = n3[1];
        rn[got] = split ? ot / n3[1] : NAN;
        printf("pair %d: qcal %.4f s (CPU %.4f s)  ONNX Runtime %.4f s  ratio %.2fx", k, tq[got],
               cq[got], to[got], ratio[got]);
        if (split)
            printf("  (qcal without the weight split %.4f s, %.2fx)", tn[got], rn[got]);
        if (other_cmd)
            printf("  [ONNX Runtime's other kernels %.4f s, %.2fx of qcal%s]", t2[got], r2[got],
                   split ? " without the split" : "");
        printf("\n");
        fflush(stdout);
        got++;
    }
    torch_stop(&ort);
    if (other_cmd)
        torch_stop(&ort2);
    if (got == 0) {
        fprintf(stderr, "bench_int8_cnn: no ONNX Runtime measurement\n");
        return 1;
    }
    qsort(tq, (size_t)got, sizeof tq[0], cmp_double);
    qsort(to, (size_t)got, sizeof to[0], cmp_double);
    qsort(cq, (size_t)got, sizeof cq[0], cmp_double);
    qsort(ratio, (size_t)got, sizeof ratio[0], cmp_double);
    qsort(tn, (size_t)got, sizeof tn[0], cmp_double);
    qsort(rn, (size_t)got, sizeof rn[0], cmp_double);
    qsort(t2, (size_t)got, sizeof t2[0], cmp_double);
    qsort(r2, (size_t)got, sizeof r2[0], cmp_double);
    const double med = got % 2 ? ratio[got / 2] : 0.5 * (ratio[got / 2 - 1] + ratio[got / 2]);
    const bool ok = med >= 1.0;
    char detail[2048], ver[32] = "?";
    const char *vp = strstr(ready, "\"version\":\"");
    if (vp)
        sscanf(vp + strlen("\"version\":\""), "%31[^\"]", ver);
    int dl = snprintf(detail, sizeof detail,
                      "same %lld test images and table (histogram, input minmax); top-1 qcal "
                      "%.2f%%, ONNX Runtime %.2f%%, same prediction %.2f%%; qcal CPU %.3f s "
                      "(%.2f threads busy); ONNX Runtime %s, graph level all, %s, batch %.0f",
                      (long long)n, pq, po, ps, cq[got / 2], cq[got / 2] / tq[got / 2], ver,
                      exact ? "exact int8 kernels (session.x64quantprecision=1, as the ort "
                              "tests run it on CPUs without VNNI)"
                            : "default int8 kernels",
                      json_field(ready, "batch"));
    if (split && dl > 0 && (size_t)dl < sizeof detail)
        dl += snprintf(detail + dl, sizeof detail - (size_t)dl,
                       "; %sthis CPU has no VNNI, so qcal stores each int8 weight as two halves "
                       "(exact: no u8 x s8 pair sum saturates; twice the MACs; oneDNN %s): "
                       "without the split qcal takes %.3f s",
                       ok ? "" : "where the time goes: ", impls, tn[got / 2]);
    if (other_cmd && dl > 0 && (size_t)dl < sizeof detail)
        dl += snprintf(detail + dl, sizeof detail - (size_t)dl,
                       "; ONNX Runtime's %s kernels %.3f s: %.2fx (%.2f-%.2f) of qcal%s",
                       exact ? "default (saturating)" : "exact", t2[got / 2], r2[got / 2], r2[0],
                       r2[got - 1], split ? " without the split" : "");
    else if (!ok && dl > 0 && (size_t)dl < sizeof detail)
        snprintf(detail + dl, sizeof detail - (size_t)dl,
                 "; where the time goes: the oneDNN primitives (%s; first forward %.3f s builds "
                 "them, then %.3f s)", impls, tb, ts2);
    printf("two engines, %lld images, %d thread(s): qcal median %.4f s, ONNX Runtime median "
           "%.4f s, speed-up %.2fx (median of %d paired ratios, spread %.2f-%.2f)  target >= "
           "1.00x  %s\n", (long long)n, threads, tq[got / 2], to[got / 2], med, got, ratio[0],
           ratio[got - 1], ok ? "OK" : "MISSED");
    if (json_path) {
        char tmp[4300];
        snprintf(tmp, sizeof tmp, "%s.tmp", json_path);
        FILE *f = fopen(tmp, "w");
        if (!f) {
            fprintf(stderr, "bench_int8_cnn: cannot write %s\n", tmp);
            return 1;
        }
        fprintf(f, "[{\"name\": \"engines_int8_cnn_%dt\", \"label\": \"demo CNN int8, %lld images: "
                   "qcal oneDNN int8 net vs ONNX Runtime QDQ model\", \"threads\": %d, "
                   "\"qcal_s\": %.6g, \"ref_s\": %.6g, \"reference\": \"ONNX Runtime\", "
                   "\"ratio\": %.6g, \"ratio_min\": %.6g, \"ratio_max\": %.6g, \"pairs\": %d, "
                   "\"qcal_top1\": %.4f, \"ort_top1\": %.4f, \"same_prediction\": %.4f, "
                   "\"qcal_cpu_s\": %.6g, \"qcal_nosplit_s\": %.6g, \"ort_other_s\": %.6g, "
                   "\"ort_exact_kernels\": %s, \"detail\": \"%s\", "
                   "\"target\": \">= 1.0x ONNX Runtime\", \"pass\": %s}]\n",
                threads, (long long)n, threads, tq[got / 2], to[got / 2], med, ratio[0],
                ratio[got - 1], got, pq, po, ps, cq[got / 2], split ? tn[got / 2] : -1.0,
                other_cmd ? t2[got / 2] : -1.0, exact ? "true" : "false", detail,
                ok ? "true" : "false");
        if (fclose(f) != 0 || rename(tmp, json_path) != 0) {
            fprintf(stderr, "bench_int8_cnn: cannot write %s\n", json_path);
            return 1;
        }
    }
    qcal_int8_net_destroy(&net);
    qcal_int8_net_destroy(&net_ns);
    qcal_calib_table_destroy(&table);
    qcal_npy_array_free(&x);
    qcal_npy_array_free(&lab);
    free(logits);
    for (int i = 0; i < 8; i++)
        free(param[i]);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t n = 10000;
    const char *torch_cmd = NULL;
    int pairs = 7;
    const char *json_path = NULL;
    const char *deploy_dir = NULL, *deploy_table = NULL, *ort_cmd = NULL, *ort_other = NULL;
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
        else if (!strcmp(argv[i], "--deploy") && i + 1 < argc)
            deploy_dir = argv[++i];
        else if (!strcmp(argv[i], "--table") && i + 1 < argc)
            deploy_table = argv[++i];
        else if (!strcmp(argv[i], "--ort") && i + 1 < argc)
            ort_cmd = argv[++i];
        else if (!strcmp(argv[i], "--ort-other") && i + 1 < argc)
            ort_other = argv[++i];
        else if (argv[i][0] != '-')
            n = atoll(argv[i]);
        else {
            fprintf(stderr, "usage: bench_int8_cnn [n_images] [--torch CMD] [--pairs K] [--chunk N] "
                    "[--threads-in-primitives] [--json FILE]\n"
                    "       bench_int8_cnn --deploy DIR --table TABLE --ort CMD [--ort-other CMD2] "
                    "[--pairs K] [--json FILE]\n");
            return 2;
        }
    }
    if (deploy_dir || deploy_table || ort_cmd) {
        if (!deploy_dir || !deploy_table || !ort_cmd) {
            fprintf(stderr, "bench_int8_cnn: --deploy, --table and --ort go together\n");
            return 2;
        }
        return deploy_row(deploy_dir, deploy_table, ort_cmd, ort_other, pairs < 1 ? 1 : pairs,
                          json_path);
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
