/* qcal-demo: qcal's main job end to end on Fashion-MNIST (Debian package
 * dataset-fashion-mnist).
 *
 *   1. the float CNN of examples/cnn (trained, loaded from the cache, or --weights);
 *   2. calibration on --calib-images training images with each observer kind through a
 *      calibration session (activation taps: the inputs of conv1/conv2/fc1/fc2, quint8
 *      per_tensor_affine; weights per-channel symmetric qint8);
 *   3. conversion to an int8 oneDNN net with the calibrated qparams, evaluated on the test set;
 *   4. one table per observer (top-1, delta, agreement, calibration time, worst layer SQNR in
 *      shadow mode) and the numeric-suite per-layer table of the best observer;
 *   5. QAT fine-tuning from the float model with fake-quant, converted to int8 and evaluated;
 *   6. calibration tables in every format, the stats log CSV and (--json) a JSON summary;
 *   with node and onnxruntime-node (./run.sh demo installs them), each observer's table also
 *   as a QDQ ONNX model (qcal_onnx_qdq, profile ort) run by ONNX Runtime's int8 kernels: a
 *   row beside oneDNN's.
 *
 * Every time printed is measured by this run. Accuracy targets (PyTorch 1.13 FX PTQ, onednn
 * backend) are printed OK or MISSED; timings are printed beside their reference values,
 * without pass/fail (they depend on the machine's load; speed is the bench's job). Errors end the program with one line on stderr and exit
 * status 1 (2 for bad usage). See docs/demo.md. */
#define _POSIX_C_SOURCE 200809L   /* POSIX calls (mkdir, fileno, clock_gettime) under -std=c11 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <qcal/atomic_file.h>
#include <qcal/calib.h>
#include <qcal/numeric_eval.h>
#include <qcal/fakequant.h>
#include <qcal/int8.h>
#include <qcal/numeric.h>
#include <qcal/npy.h>
#include <qcal/observer.h>
#include <qcal/onnx.h>
#include <qcal/threads.h>

#include "cnn.h"
#include "cnn_onnx.h"
#include "demo_eval.h"
#include "qat.h"
#include "ex_util.h"
#include "ort_node.h"

/* PyTorch 1.13 FX PTQ on this model (the project's reference value): int8 eval of 10,000 images. */
#define PYTORCH_INT8_EVAL_S 0.17
#define CALIB_BATCH 100        /* calibration batch: 1000 images = 10 steps */
#define SHADOW_BATCH 250

enum { NSEG = 4 };   /* conv1(+relu+pool), conv2(+relu+pool), fc1(+relu), fc2 */

static const char *const seg_op[NSEG] = {"conv2d", "conv2d", "linear", "linear"};
/* Per-sample element count at each tap: conv1..fc2 inputs, then the logits. */
static const int64_t tap_numel[CNN_NTAPS] = {784, 6272, 3136, 128, 10};

/* ---- Options ------------------------------------------------------------------------- */

typedef struct demo_opts {
    const char *weights;          /* NULL: cache or train */
    const char *data_dir;
    const char *out_dir;          /* "qcal-demo-out" */
    const char *json_path;        /* NULL: no JSON */
    int64_t calib_images;         /* 1000 */
    int64_t calib_offset;         /* 0: calibrate on training images offset.. offset+calib_images-1 */
    qcal_observer_grid grid;      /* histogram family's grid: QCAL_GRID_LATTICE */
    int64_t test_images;          /* 0 = all */
    int64_t sqnr_images;          /* 1000: test images used for the shadow-mode SQNR */
    bool qat;                     /* true */
    bool ort;                     /* true: ONNX Runtime rows when node + onnxruntime-node are there */
    cnn_qat_schedule qat_sched;   /* cnn_qat_schedule_default with 200 steps, frozen after 150 */
    bool input_same;              /* false: the model input (conv1's input) uses minmax */
    int low_bits;                 /* 3: bits of the low-bit setting; 0 = skip it */
    cnn_train_opts train;         /* cnn_train_opts_default */
    int n_kinds;
    qcal_observer_kind kinds[QCAL_OBSERVER_KIND_COUNT];
} demo_opts;

static const qcal_observer_kind default_kinds[] = {
    QCAL_OBSERVER_MINMAX, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX, QCAL_OBSERVER_HISTOGRAM,
    QCAL_OBSERVER_PERCENTILE, QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE,
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qcal-demo [options]\n"
            "  --weights FILE         float model (.safetensors, PyTorch names) instead of the\n"
            "                         cached / freshly trained one\n"
            "  --calib-images N       training images used for calibration (default 1000)\n"
            "  --calib-offset N       calibrate on the training images from N on (default 0)\n"
            "  --grid G               grid of the int8 rows' histogram-family observers: lattice\n"
            "                         (default) or first-batch\n"
            "  --observers a,b,...    observer kinds to compare (default minmax,\n"
            "                         moving_average_minmax,histogram,percentile,entropy,mse)\n"
            "  --input-observer K     observer of the model input (conv1's input): minmax\n"
            "                         (default; the range is fixed by the normalisation) or same\n"
            "                         (the observer under comparison, as PyTorch FX does)\n"
            "  --low-bits N           bits of the low-bit setting (default 3: activations [0, 7],\n"
            "                         weights [-3, 3], per tensor, fake-quant); 0 skips it\n"
            "  --no-qat               skip quantization-aware training\n"
            "  --no-ort               skip the ONNX Runtime int8 (QDQ) rows (run when node and\n"
            "                         onnxruntime-node are installed; ./run.sh demo installs them)\n"
            "  --qat-steps N          QAT steps of 128 images (default 200), --qat-freeze N\n"
            "                         (observers frozen after N steps, default 150), --qat-lr X\n"
            "                         (initial Adam rate, cosine-decayed to 0, default 2e-4)\n"
            "  --json PATH            also write a JSON summary\n"
            "  --out DIR              output directory (default qcal-demo-out)\n"
            "  --data DIR             dataset directory (default $QCAL_FMNIST_DIR or\n"
            "                         /usr/share/datasets/fashion-mnist)\n"
            "  --test-images N        evaluate on the first N test images (default all)\n"
            "  --sqnr-images N        test images for the shadow-mode SQNR (default 1000)\n"
            "  --train-images N       train the float model on the first N images (default all)\n"
            "  --epochs N             float training epochs (default 3)\n");
}

/* One error line on stderr (newlines in the message flattened), exit status code. */
static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int die(int code, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fflush(stdout);
    fprintf(stderr, "qcal-demo: error: %s\n", msg);
    return code;
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return die(2, "%s '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int parse_kinds(const char *s, demo_opts *o)
{
    o->n_kinds = 0;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        qcal_observer_kind k;
        if (qcal_observer_kind_parse(tok, &k) != QCAL_OK)
            return die(2, "--observers: unknown observer '%s' (minmax, moving_average_minmax, histogram, "
                       "percentile, entropy, mse)", tok);
        if (k == QCAL_OBSERVER_PER_CHANNEL_MINMAX || k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)
            return die(2, "--observers: '%s' is a per-channel observer; activations are quantized per "
                       "tensor (weights always use per_channel_minmax)", tok);
        for (int i = 0; i < o->n_kinds; i++)
            if (o->kinds[i] == k)
                return die(2, "--observers: '%s' listed twice", tok);
        if (o->n_kinds >= QCAL_OBSERVER_KIND_COUNT)
            return die(2, "--observers: too many observers");
        o->kinds[o->n_kinds++] = k;
    }
    if (o->n_kinds == 0)
        return die(2, "--observers: empty list");
    return 0;
}

static int parse_args(int argc, char **argv, demo_opts *o)
{
    memset(o, 0, sizeof *o);
    o->data_dir = cnn_data_dir();
    o->out_dir = "qcal-demo-out";
    o->calib_images = 1000;
    o->sqnr_images = 1000;
    o->qat = true;
    o->ort = true;
    o->low_bits = 3;
    /* A shorter QAT than examples/qat_fmnist (one epoch) so that the demo stays within a
     * minute with the cached model; same batch, seed, learning rate and cosine schedule. */
    o->qat_sched = cnn_qat_schedule_default();
    o->qat_sched.steps = 200;
    o->qat_sched.freeze_step = 150;
    o->train = cnn_train_opts_default();
    o->n_kinds = (int)(sizeof default_kinds / sizeof default_kinds[0]);
    memcpy(o->kinds, default_kinds, sizeof default_kinds);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--no-qat")) {
            o->qat = false;
            continue;
        }
        if (!strcmp(a, "--no-ort")) {
            o->ort = false;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return die(2, "unexpected argument '%s' (see --help)", a);
        if (i + 1 >= argc)
            return die(2, "option %s needs a value (see --help)", a);
        const char *v = argv[++i];
        int64_t x = 0;
        int bad = 0;
        if (!strcmp(a, "--weights"))
            o->weights = v;
        else if (!strcmp(a, "--data"))
            o->data_dir = v;
        else if (!strcmp(a, "--out"))
            o->out_dir = v;
        else if (!strcmp(a, "--json"))
            o->json_path = v;
        else if (!strcmp(a, "--input-observer")) {
            if (!strcmp(v, "same"))
                o->input_same = true;
            else if (!strcmp(v, "minmax"))
                o->input_same = false;
            else
                bad = die(2, "--input-observer '%s': expected minmax or same", v);
        } else if (!strcmp(a, "--observers"))
            bad = parse_kinds(v, o);
        else if (!strcmp(a, "--calib-images"))
            bad = parse_i64(a, v, 1, 60000, &o->calib_images);
        else if (!strcmp(a, "--calib-offset"))
            bad = parse_i64(a, v, 0, 59999, &o->calib_offset);
        else if (!strcmp(a, "--grid")) {
            if (qcal_observer_grid_parse(v, &o->grid) != QCAL_OK)
                bad = die(2, "--grid '%s': expected lattice or first-batch", v);
        }
        else if (!strcmp(a, "--test-images"))
            bad = parse_i64(a, v, 1, 10000, &o->test_images);
        else if (!strcmp(a, "--sqnr-images"))
            bad = parse_i64(a, v, 1, 10000, &o->sqnr_images);
        else if (!strcmp(a, "--train-images"))
            bad = parse_i64(a, v, 1, 60000, &o->train.max_images);
        else if (!strcmp(a, "--low-bits")) {
            bad = parse_i64(a, v, 0, 8, &x), o->low_bits = (int)x;
            if (!bad && o->low_bits == 1)
                bad = die(2, "--low-bits 1: a symmetric 1-bit weight range is [0, 0]; use 2..8 (or 0 to skip)");
        } else if (!strcmp(a, "--epochs"))
            bad = parse_i64(a, v, 1, 100, &x), o->train.epochs = (int)x;
        else if (!strcmp(a, "--qat-steps"))
            bad = parse_i64(a, v, 1, 1000000, &x), o->qat_sched.steps = (int)x;
        else if (!strcmp(a, "--qat-freeze"))
            bad = parse_i64(a, v, 0, 1000000, &x), o->qat_sched.freeze_step = (int)x;
        else if (!strcmp(a, "--qat-lr")) {
            char *end;
            double d = strtod(v, &end);
            if (end == v || *end || !(d > 0 && d <= 1))
                bad = die(2, "--qat-lr '%s' is not a number in (0, 1]", v);
            o->qat_sched.lr = (float)d;
        } else
            bad = die(2, "unknown option %s (see --help)", a);
        if (bad)
            return bad;
    }
    return 0;
}

/* ---- Small helpers ------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median3(double *t)
{
    qsort(t, 3, sizeof *t, cmp_double);
    return t[1];
}

static int argmax10(const float *z)
{
    int best = 0;
    for (int k = 1; k < CNN_CLASSES; k++)
        if (z[k] > z[best])   /* first maximum on ties, as cnn_evaluate */
            best = k;
    return best;
}

/* [B, H, W, C] -> [B, C, H, W] */
static void nhwc_to_nchw(const float *src, float *dst, int64_t B, int64_t H, int64_t W, int64_t C)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++)
                for (int64_t c = 0; c < C; c++)
                    dst[((b * C + c) * H + h) * W + w] = src[((b * H + h) * W + w) * C + c];
}

static int mkdir_one(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return die(1, "cannot create output directory '%s': %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return die(1, "output path '%s' exists and is not a directory", dir);
    return 0;
}

/* Creates dir (and its parents) and checks that a file can be written in it. */
static int prepare_out_dir(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return die(2, "--out path is too long");
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return die(1, "cannot create output directory '%s': %s", tmp, strerror(errno));
            *p = '/';
        }
    if (mkdir_one(tmp))
        return 1;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.qcal-demo-probe", dir);
    FILE *f = fopen(probe, "w");
    if (!f)
        return die(1, "output directory '%s' is not writable: %s", dir, strerror(errno));
    fclose(f);
    unlink(probe);
    return 0;
}

static int check_dataset(const char *dir)
{
    static const char *const files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 4; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (access(p, R_OK) != 0)
            return die(1, "Fashion-MNIST not found: cannot read '%s' (%s); install the Debian package "
                       "dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or point --data / "
                       "QCAL_FMNIST_DIR at a directory holding the four *-ubyte.gz files", p, strerror(errno));
    }
    return 0;
}

#define TRY(call)                                                                              \
    do {                                                                                       \
        qcal_status st_ = (call);                                                              \
        if (st_ < 0) {                                                                         \
            rc = die(1, "%s: %s", qcal_status_str(st_), qcal_last_error());                   \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)

/* ---- int8 nets ----------------------------------------------------------------------- */

/* QAT qparams (examples/cnn/qat.c's export): activation qparams at the four layer inputs and
 * per-channel weight scales. Post-training results come as calibration tables instead. */
typedef struct model_qparams {
    float act_scale[NSEG];
    int32_t act_zp[NSEG];
    float *wscale[NSEG];                  /* [out channels] each */
} model_qparams;

static void qparams_free(model_qparams *q)
{
    for (int l = 0; l < NSEG; l++) {
        free(q->wscale[l]);
        q->wscale[l] = NULL;
    }
}

/* The float CNN as int8 layers, in order: conv1 relu pool | conv2 relu pool | fc1 relu | fc2.
 * Segment s (0 conv1+ReLU+pool, 1 conv2+ReLU+pool, 2 fc1+ReLU, 3 fc2) is layers
 * seg_first[s] .. seg_first[s + 1] - 1. */
enum { NLAYERS = 9 };
static const int seg_first[NSEG + 1] = {0, 3, 6, 8, 9};

static void describe_layers(const cnn_model *m, qcal_int8_layer_desc d[NLAYERS])
{
    for (int s = 0; s < NSEG; s++) {
        qcal_int8_layer_desc *l = &d[seg_first[s]];
        if (s < 2) {
            qcal_int8_layer_desc_default(&l[0], QCAL_INT8_CONV2D);
            l[0].conv.out_channels = s == 0 ? 32 : 64;
            l[0].conv.kernel_h = l[0].conv.kernel_w = 3;
            l[0].conv.pad_h = l[0].conv.pad_w = 1;
            l[0].conv.weight = m->param[2 * s];
            l[0].conv.bias = m->param[2 * s + 1];
            qcal_int8_layer_desc_default(&l[1], QCAL_INT8_RELU);
            qcal_int8_layer_desc_default(&l[2], QCAL_INT8_MAXPOOL2D);   /* 2x2, stride 2 */
        } else {
            qcal_int8_layer_desc_default(&l[0], QCAL_INT8_LINEAR);
            l[0].linear.out_features = s == 2 ? 128 : 10;
            l[0].linear.weight = m->param[2 * s];
            l[0].linear.bias = m->param[2 * s + 1];
            if (s == 2)
                qcal_int8_layer_desc_default(&l[1], QCAL_INT8_RELU);
        }
        l[0].fqn = cnn_layer_name(s);
    }
}

/* Per-sample input shape of segment s in PyTorch's layout: (1,28,28), (32,14,14), (64,7,7)
 * (fc1 flattens NCHW) or (128). */
static const int32_t seg_in_nd[NSEG] = {3, 3, 3, 1};
static const int64_t seg_in_shape[NSEG][3] = {{1, 28, 28}, {32, 14, 14}, {64, 7, 7}, {128, 0, 0}};

/* The int8 net of segments first..last from a calibration table: segment s reads tap s
 * (quantized with the table's qparams of layer s's input) and writes u8 codes with tap
 * s+1's qparams; fc2 writes f32 logits. */
static qcal_status build_net_table(const cnn_model *m, const qcal_calib_table *t, int first, int last,
                                   qcal_int8_net **out)
{
    qcal_int8_layer_desc d[NLAYERS];
    describe_layers(m, d);
    return qcal_int8_net_from_table(NULL, t, seg_in_nd[first], seg_in_shape[first],
                                    seg_first[last + 1] - seg_first[first], d + seg_first[first],
                                    last + 1 < NSEG ? cnn_layer_name(last + 1) : NULL, out);
}

/* The whole int8 net with QAT's qparams, through the layer builders: quint8 per-tensor
 * activations, qint8 per-channel symmetric weights (views over q's arrays). */
static qcal_status build_net_qat(const cnn_model *m, const model_qparams *q, qcal_int8_net **out)
{
    qcal_int8_layer_desc d[NLAYERS];
    describe_layers(m, d);
    qcal_qparams act[NSEG], wq[NSEG];
    int64_t widest = 1, shape[4];
    for (int s = 0; s < NSEG; s++) {
        cnn_param_shape(2 * s, shape);
        widest = shape[0] > widest ? shape[0] : widest;
    }
    int32_t *zeros = calloc((size_t)widest, sizeof *zeros);   /* symmetric: zero-points 0 */
    qcal_status st = zeros ? QCAL_OK : QCAL_ERR_NO_MEMORY;
    for (int s = 0; s < NSEG && st == QCAL_OK; s++) {
        cnn_param_shape(2 * s, shape);
        if ((st = qcal_qparams_per_tensor(&act[s], QCAL_QUINT8, q->act_scale[s], q->act_zp[s])) == QCAL_OK &&
            (st = qcal_qparams_per_channel(&wq[s], QCAL_QINT8, 0, shape[0], q->wscale[s], zeros)) == QCAL_OK)
            wq[s].qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    }
    qcal_int8_net *net = NULL;
    if (st == QCAL_OK)
        st = qcal_int8_net_create(NULL, seg_in_nd[0], seg_in_shape[0], &act[0], &net);
    for (int i = 0; i < NLAYERS && st == QCAL_OK; i++) {
        int s = 0;
        while (seg_first[s + 1] <= i)
            s++;
        switch (d[i].kind) {
        case QCAL_INT8_CONV2D:
            d[i].conv.weight_qparams = &wq[s];
            d[i].conv.out_qparams = &act[s + 1];
            st = qcal_int8_net_add_conv2d(net, &d[i].conv);
            break;
        case QCAL_INT8_LINEAR:
            d[i].linear.weight_qparams = &wq[s];
            if (s + 1 < NSEG)
                d[i].linear.out_qparams = &act[s + 1];
            else
                d[i].linear.out_type = QCAL_INT8_OUT_F32;
            st = qcal_int8_net_add_linear(net, &d[i].linear);
            break;
        case QCAL_INT8_MAXPOOL2D: st = qcal_int8_net_add_maxpool2d(net, &d[i].pool); break;
        case QCAL_INT8_RELU: st = qcal_int8_net_add_relu(net); break;
        }
    }
    free(zeros);
    if (st != QCAL_OK) {
        qcal_int8_net_destroy(&net);
        return st;
    }
    *out = net;
    return QCAL_OK;
}

typedef struct eval_result {
    double top1, agree;      /* percent */
    double eval_s;           /* median of 3 timed passes over the test set */
    int64_t n;
} eval_result;

/* Evaluates the full int8 net on x [n,784] (normalised images): first pass with progress
 * (also builds oneDNN's primitives), then three timed passes. */
static qcal_status eval_int8(qcal_int8_net *net, const float *x, const uint8_t *labels, const uint8_t *fpred,
                             int64_t n, const char *phase, float *logits, eval_result *r)
{
    int64_t right = 0, same = 0;
    const int64_t chunk = 1000;
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
        int64_t bn = n - i0 < chunk ? n - i0 : chunk;
        qcal_status st = qcal_int8_net_forward(net, bn, x + i0 * 784, logits + i0 * CNN_CLASSES);
        if (st != QCAL_OK)
            return st;
        for (int64_t i = i0; i < i0 + bn; i++) {
            int p = argmax10(logits + i * CNN_CLASSES);
            right += p == labels[i];
            same += p == fpred[i];
        }
        cnn_progress_stderr(NULL, phase, i0 + bn, n, 100.0 * (double)right / (double)(i0 + bn));
    }
    double t[3];
    for (int k = 0; k < 3; k++) {
        double t0 = cnn_now();
        qcal_status st = qcal_int8_net_forward(net, n, x, logits);
        t[k] = cnn_now() - t0;
        if (st != QCAL_OK)
            return st;
    }
    /* the timed passes must give the same predictions as the first */
    int64_t right2 = 0;
    for (int64_t i = 0; i < n; i++)
        right2 += argmax10(logits + i * CNN_CLASSES) == labels[i];
    if (right2 != right)
        return qcal_set_error(QCAL_ERR_STATE, "int8 forward is not repeatable: %lld then %lld correct",
                              (long long)right, (long long)right2);
    r->top1 = 100.0 * (double)right / (double)n;
    r->agree = 100.0 * (double)same / (double)n;
    r->eval_s = median3(t);
    r->n = n;
    return QCAL_OK;
}

/* ---- Float taps kept for the shadow-mode comparison ------------------------------------ */

/* Float activations of the first s images of the test set at each tap, in PyTorch's layout
 * (NCHW; fc1's input in NCHW flatten order) so the int8 segments can read them. */
typedef struct float_taps {
    int64_t n;                  /* images kept */
    float *tap[CNN_NTAPS];      /* [n, tap_numel] */
    float *x;                   /* all evaluated test images, [n_test, 784] */
    int64_t n_x;
    int64_t i0;                 /* first image of the current batch */
    float *scratch;             /* [batch, 6272] for the layout change */
} float_taps;

static qcal_status capture_hook(void *user, cnn_act *a)
{
    float_taps *ft = user;
    int64_t B = a->shape[0];
    if (a->tap == CNN_TAP_CONV1_IN)
        memcpy(ft->x + ft->i0 * 784, a->data, (size_t)(B * 784) * sizeof(float));
    if (ft->i0 >= ft->n)
        return QCAL_OK;
    int64_t keep = ft->n - ft->i0 < B ? ft->n - ft->i0 : B;
    float *dst = ft->tap[a->tap] + ft->i0 * tap_numel[a->tap];
    switch (a->tap) {
    case CNN_TAP_CONV2_IN:   /* [B,14,14,32] */
        nhwc_to_nchw(a->data, dst, keep, 14, 14, 32);
        break;
    case CNN_TAP_FC1_IN:     /* [B,3136] in (h,w,c) order */
        nhwc_to_nchw(a->data, dst, keep, 7, 7, 64);
        break;
    default:
        memcpy(dst, a->data, (size_t)(keep * tap_numel[a->tap]) * sizeof(float));
        break;
    }
    return QCAL_OK;
}

/* Shadow mode: each int8 segment is fed the float input of its layer; its (dequantized)
 * output is compared with the float layer's output (the next tap). */
static qcal_status shadow_compare(const cnn_model *m, const qcal_calib_table *t, const float_taps *ft,
                                  qcal_numeric_act_compare **out)
{
    qcal_numeric_act_compare *ac = NULL;
    qcal_int8_net *net = NULL;
    float *y = ex_malloc((size_t)(SHADOW_BATCH * 6272) * sizeof(float));
    qcal_status st = y ? qcal_numeric_act_compare_create(QCAL_NUMERIC_ACT_SHADOW, &ac) : QCAL_ERR_NO_MEMORY;
    for (int s = 0; s < NSEG && st == QCAL_OK; s++) {
        if ((st = build_net_table(m, t, s, s, &net)) != QCAL_OK)
            break;
        int64_t nin = tap_numel[s], nout = tap_numel[s + 1];
        for (int64_t i0 = 0; i0 < ft->n && st == QCAL_OK; i0 += SHADOW_BATCH) {
            int64_t bn = ft->n - i0 < SHADOW_BATCH ? ft->n - i0 : SHADOW_BATCH;
            if ((st = qcal_int8_net_forward(net, bn, ft->tap[s] + i0 * nin, y)) != QCAL_OK)
                break;
            qcal_tensor tf, tq;
            const int64_t shape[2] = {bn, nout};
            qcal_tensor_init(&tf, ft->tap[s + 1] + i0 * nout, 2, shape);
            qcal_tensor_init(&tq, y, 2, shape);
            st = qcal_numeric_act_compare_add(ac, cnn_layer_name(s), &tf, &tq);
        }
        qcal_int8_net_destroy(&net);
    }
    free(y);
    if (st != QCAL_OK) {
        qcal_numeric_act_compare_destroy(&ac);
        return st;
    }
    *out = ac;
    return QCAL_OK;
}

static qcal_status worst_sqnr(const qcal_numeric_act_compare *ac, double *worst, int *worst_layer)
{
    *worst = INFINITY;
    *worst_layer = -1;
    for (int64_t i = 0; i < NSEG; i++) {
        const char *fqn;
        int64_t steps;
        qcal_numeric_metrics mt;
        qcal_numeric_stats fs;
        qcal_status st = qcal_numeric_act_compare_get(ac, i, &fqn, &steps, &mt, &fs);
        if (st != QCAL_OK)
            return st;
        if (*worst_layer < 0 || mt.sqnr_db < *worst) {
            *worst = mt.sqnr_db;
            *worst_layer = (int)i;
        }
    }
    return QCAL_OK;
}

/* ---- Calibration ----------------------------------------------------------------------- */

typedef struct calib_ctx {
    qcal_calib_session *s;
    int64_t step;
    double hook_s;      /* time spent in the observers */
} calib_ctx;

static qcal_status calib_hook(void *user, cnn_act *a)
{
    calib_ctx *c = user;
    if (a->tap == CNN_TAP_LOGITS)
        return QCAL_OK;
    double t0 = cnn_now();
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    if (st == QCAL_OK)
        st = qcal_calib_session_observe(c->s, cnn_tap_name(a->tap), QCAL_CALIB_ROLE_ACTIVATION, c->step, &t);
    c->hook_s += cnn_now() - t0;
    return st;
}

typedef struct observer_result {
    qcal_observer_kind kind;
    eval_result ev;
    double calib_s;          /* forward passes + observers + qparams (table) */
    double hook_s;           /* observers alone */
    double fwd_s;            /* the forward passes of the calibration loop, observers excluded */
    double worst_sqnr_db;
    int worst_layer;
    qcal_calib_table *table;
    qcal_numeric_act_compare *shadow;
    uint8_t *pred;           /* oneDNN int8 top-1 per test image */
    /* ONNX Runtime int8 (QDQ) of the same table; ort_ran false when it did not run */
    bool ort_ran;
    double ort_top1, ort_agree, ort_same, ort_s;   /* same = % predictions equal to oneDNN's */
} observer_result;

/* Calibrates the float model on the first n images of train with activation observer kind
 * (histogram family on grid). */
static qcal_status calibrate(cnn_ctx *ctx, const cnn_model *m, const cnn_data *train, int64_t n,
                             qcal_observer_kind kind, bool input_same, qcal_observer_grid grid,
                             observer_result *r)
{
    qcal_calib_rules *rules = NULL;
    qcal_calib_session *s = NULL;
    qcal_observer_config acfg, icfg, wcfg;
    qcal_observer_config_default(&acfg, kind);   /* quint8 per_tensor_affine */
    acfg.grid = grid;
    qcal_observer_config_default(&icfg, QCAL_OBSERVER_MINMAX);
    qcal_status st = qcal_calib_role_default_config(QCAL_CALIB_ROLE_WEIGHT, &wcfg);
    wcfg.q.dtype = QCAL_QINT8;
    wcfg.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    wcfg.axis = 0;
    if (st == QCAL_OK)
        st = qcal_calib_rules_create(&rules);
    /* The model input is the normalised image, (p/255 - 0.2860)/0.3530 for 256 pixel values:
     * its minmax qparams give every pixel value its own code. Clipping observers gain nothing
     * there and the |x|-histogram ones clip it symmetrically; entropy (KL) even picks the
     * background value 0.81 as threshold and clips every brighter pixel (conv1 SQNR ~9 dB,
     * -1.6 points). So by default the input uses minmax; --input-observer same shows it. */
    if (st == QCAL_OK && !input_same)
        st = qcal_calib_rules_add(rules, "conv1", false, QCAL_CALIB_ROLE_ACTIVATION, &icfg);
    if (st == QCAL_OK)
        st = qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &acfg);
    if (st == QCAL_OK)
        st = qcal_calib_rules_add(rules, "*.weight", false, QCAL_CALIB_ROLE_WEIGHT, &wcfg);
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    if (st == QCAL_OK)
        st = qcal_calib_session_create(&so, &s);
    double t0 = cnn_now();
    for (int l = 0; l < NSEG && st == QCAL_OK; l++) {
        qcal_tensor w;
        int64_t shape[4];
        int nd = cnn_param_shape(2 * l, shape);
        char name[64];
        snprintf(name, sizeof name, "%s.weight", cnn_layer_name(l));
        if ((st = qcal_tensor_init(&w, m->param[2 * l], nd, shape)) == QCAL_OK)
            st = qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_WEIGHT, 0, &w);
    }
    calib_ctx cc = {.s = s};
    cnn_hooks hooks = {.act = calib_hook, .user = &cc};
    double tl = cnn_now();
    for (int64_t i0 = 0; i0 < n && st == QCAL_OK; i0 += CALIB_BATCH, cc.step++) {
        int bn = (int)(n - i0 < CALIB_BATCH ? n - i0 : CALIB_BATCH);
        const float *z;
        st = cnn_forward(ctx, m, train->images + i0 * 784, bn, &hooks, &z);
    }
    r->fwd_s = cnn_now() - tl - cc.hook_s;
    if (st == QCAL_OK)
        st = qcal_calib_session_table(s, &r->table);
    r->calib_s = cnn_now() - t0;
    r->hook_s = cc.hook_s;
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
    return st;
}

/* Median time of three plain float forward passes over the first n training images. */
static qcal_status time_float_forward(cnn_ctx *ctx, const cnn_model *m, const cnn_data *train, int64_t n,
                                      double *out)
{
    double t[3];
    for (int k = 0; k < 3; k++) {
        double t0 = cnn_now();
        for (int64_t i0 = 0; i0 < n; i0 += CALIB_BATCH) {
            int bn = (int)(n - i0 < CALIB_BATCH ? n - i0 : CALIB_BATCH);
            const float *z;
            qcal_status st = cnn_forward(ctx, m, train->images + i0 * 784, bn, NULL, &z);
            if (st != QCAL_OK)
                return st;
        }
        t[k] = cnn_now() - t0;
    }
    *out = median3(t);
    return QCAL_OK;
}

/* ---- Stats log ------------------------------------------------------------------------- */

typedef struct log_ctx {
    qcal_numeric_logger *lg;
} log_ctx;

static qcal_status log_hook(void *user, cnn_act *a)
{
    log_ctx *c = user;
    if (a->tap == CNN_TAP_LOGITS)
        return QCAL_OK;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    if (st != QCAL_OK)
        return st;
    if (a->tap >= CNN_TAP_FC1_IN)
        return qcal_numeric_logger_log_linear(c->lg, cnn_tap_name(a->tap), "linear", a->shape[0], a->shape[1],
                                      a->tap == CNN_TAP_FC1_IN ? 128 : 10, &t);
    return qcal_numeric_logger_log(c->lg, QCAL_NUMERIC_LOG_ACT, cnn_tap_name(a->tap), "conv2d", NULL, &t);
}

/* quant_logger-style records: every weight, then every layer input per calibration batch. */
static qcal_status write_stats_log(cnn_ctx *ctx, const cnn_model *m, const cnn_data *train, int64_t n,
                                   const char *path)
{
    qcal_numeric_logger_options lo;
    qcal_numeric_logger_options_default(&lo);
    lo.csv_path = path;
    log_ctx lc = {0};
    qcal_status st = qcal_numeric_logger_create(&lo, &lc.lg);
    for (int p = 0; p < CNN_NPARAMS && st == QCAL_OK; p++) {
        qcal_tensor t;
        int64_t shape[4];
        int nd = cnn_param_shape(p, shape);
        if ((st = qcal_tensor_init(&t, m->param[p], nd, shape)) == QCAL_OK)
            st = qcal_numeric_logger_log(lc.lg, QCAL_NUMERIC_LOG_PARAM, cnn_param_name(p), seg_op[p / 2], NULL, &t);
    }
    cnn_hooks hooks = {.act = log_hook, .user = &lc};
    for (int64_t i0 = 0; i0 < n && st == QCAL_OK; i0 += CALIB_BATCH) {
        int bn = (int)(n - i0 < CALIB_BATCH ? n - i0 : CALIB_BATCH);
        const float *z;
        st = cnn_forward(ctx, m, train->images + i0 * 784, bn, &hooks, &z);
    }
    if (st == QCAL_OK)
        st = qcal_numeric_logger_finish(lc.lg);
    qcal_numeric_logger_destroy(&lc.lg);
    return st;
}

/* ---- QAT ------------------------------------------------------------------------------- */

/* QAT through examples/cnn/qat.c (the project's one QAT path): fake-quant at the four layer
 * inputs, quint8 full range [0, 255] (the onednn backend's activation qconfig, so the result
 * converts to the same int8 net), per-channel symmetric qint8 weights, float logits (the int8
 * net's fc2 outputs f32); cnn_qat_finetune's schedule with the demo's step counts. The frozen
 * qparams and fine-tuned weights go to the int8 net. *qm and q are owned by the caller. */
static qcal_status run_qat(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, const demo_opts *o,
                           cnn_model **qm_out, model_qparams *q)
{
    cnn_fq_opts fo = cnn_fq_opts_default();
    fo.act_preset = QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE;
    fo.quantize_logits = false;
    cnn_model *qm = NULL;
    cnn_fq_set *set = NULL;
    cnn_fq_qparams e;
    memset(&e, 0, sizeof e);
    qcal_status st = cnn_qat_finetune(ctx, fm, train, &fo, &o->qat_sched, cnn_progress_stderr, NULL, &qm, &set);
    if (st == QCAL_OK)
        st = cnn_fq_export(set, &e);
    for (int l = 0; l < NSEG && st == QCAL_OK; l++)
        for (int64_t c = 0; c < e.weight_channels[l]; c++)
            if (e.weight_zero_point[l][c] != 0) {
                st = qcal_set_error(QCAL_ERR_MISMATCH, "QAT weight fake-quant of %s has zero-point %d in channel %lld; "
                                    "the int8 net takes symmetric weights", cnn_layer_name(l),
                                    (int)e.weight_zero_point[l][c], (long long)c);
                break;
            }
    if (st == QCAL_OK) {
        /* the int8 net's segment s reads tap s (the layer's input) */
        for (int l = 0; l < NSEG; l++) {
            q->act_scale[l] = e.act_scale[l];
            q->act_zp[l] = e.act_zero_point[l];
            q->wscale[l] = e.weight_scale[l];   /* moved: now owned by q */
            e.weight_scale[l] = NULL;
        }
        *qm_out = qm;
        qm = NULL;
    }
    cnn_fq_qparams_free(&e);
    cnn_fq_destroy(&set);
    cnn_model_destroy(&qm);
    return st;
}

/* ---- Outputs --------------------------------------------------------------------------- */

static qcal_status write_tables(const qcal_calib_table *t, qcal_observer_kind kind, const char *out_dir)
{
    char dir[4200], path[4400];
    snprintf(dir, sizeof dir, "%s/%s", out_dir, qcal_observer_kind_name(kind));
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return qcal_set_error(QCAL_ERR_IO, "cannot create directory '%s': %s", dir, strerror(errno));
    qcal_calib_export_options eo;
    qcal_calib_export_options_default(&eo);
    /* TensorRT checks that the header's algorithm matches the calibrator that reads the cache:
     * entropy is EntropyCalibration2, every other kind is written as MinMaxCalibration. */
    eo.trt_algorithm = kind == QCAL_OBSERVER_ENTROPY ? "EntropyCalibration2" : "MinMaxCalibration";
    static const struct { qcal_calib_format f; const char *name; } files[] = {
        {QCAL_CALIB_FORMAT_JSON, "calib.json"},
        {QCAL_CALIB_FORMAT_TENSORRT, "calibration_trt.cache"},
        {QCAL_CALIB_FORMAT_ONNXRUNTIME, "calibration.cache"},
        {QCAL_CALIB_FORMAT_NCNN, "model.table"},
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        qcal_status st = qcal_calib_table_write(t, files[i].f, &eo, path);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

/* Per-layer numeric-suite rows of one observer: weight SQNR (per-channel symmetric qint8)
 * and activation SQNR in shadow mode. */
typedef struct layer_row {
    qcal_numeric_weight_result w;
    qcal_numeric_metrics act;
    qcal_numeric_stats act_float;
} layer_row;

static qcal_status layer_rows(const cnn_model *m, const qcal_numeric_act_compare *ac, layer_row rows[NSEG])
{
    qcal_numeric_weights_options wo;
    qcal_numeric_weights_options_default(&wo);   /* per_channel_minmax, qint8, per_channel_symmetric */
    for (int l = 0; l < NSEG; l++) {
        qcal_tensor t;
        int64_t shape[4];
        int nd = cnn_param_shape(2 * l, shape);
        char name[64];
        snprintf(name, sizeof name, "%s.weight", cnn_layer_name(l));
        qcal_status st = qcal_tensor_init(&t, m->param[2 * l], nd, shape);
        if (st == QCAL_OK)
            st = qcal_numeric_weights_compare(&wo, name, &t, &rows[l].w);
        const char *fqn;
        int64_t steps;
        if (st == QCAL_OK)
            st = qcal_numeric_act_compare_get(ac, l, &fqn, &steps, &rows[l].act, &rows[l].act_float);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

static qcal_status write_numeric_csv(const char *path, const layer_row rows[NSEG])
{
    qcal_atomic_file f;
    qcal_status st = qcal_atomic_file_open(&f, path);
    if (st != QCAL_OK)
        return st;
    fprintf(f.fp, "layer,weight_sqnr_db,weight_cosine,weight_max_abs_err,act_sqnr_db,act_cosine,"
                  "act_max_abs_err,act_float_absmax,act_pairs\n");
    for (int l = 0; l < NSEG; l++)
        fprintf(f.fp, "%s,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%lld\n", cnn_layer_name(l), rows[l].w.m.sqnr_db,
                rows[l].w.m.cosine, rows[l].w.m.max_abs_err, rows[l].act.sqnr_db, rows[l].act.cosine,
                rows[l].act.max_abs_err, (double)rows[l].act_float.absmax, (long long)rows[l].act.count);
    return qcal_atomic_file_commit(&f);
}

/* A JSON string (quotes, backslashes and control characters escaped). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* JSON numbers: finite values only (inf/nan become null). */
static void json_num(FILE *f, double v, int digits)
{
    if (isfinite(v))
        fprintf(f, "%.*f", digits, v);
    else
        fputs("null", f);
}

/* ---- The 4-bit setting and the report ------------------------------------------------- */

static void print_lowbit(const lowbit_result *lb, double float_top1, int64_t n_test, const char *out_dir)
{
    int a_max = (1 << lb->bits) - 1, w_max = (1 << (lb->bits - 1)) - 1;
    printf("%d-bit setting, where the observer matters: activations quint8 restricted to [0, %d] (per-tensor "
           "affine), weights [-%d, %d] (per-tensor symmetric), fake-quantized in the float model at every layer "
           "input and weight (logits float); each row's observer on all 8 tensors; %lld test images\n",
           lb->bits, a_max, w_max, w_max, (long long)n_test);
    printf("%-31s | %10s | %8s | %9s\n", "observer", "top-1", "delta", "agreement");
    printf("%-31s-+-%10s-+-%8s-+-%9s\n", "-------------------------------", "----------", "--------", "---------");
    for (int k = 0; k < lb->n_kinds; k++)
        printf("%-31s | %9.2f%% | %+8.2f | %8.2f%%\n", qcal_observer_kind_name(lb->kinds[k]), lb->single[k].top1,
               lb->single[k].top1 - float_top1, lb->single[k].agree);
    printf("%-31s | %9.2f%% | %+8.2f | %8.2f%%\n", "per-layer best (qcal evaluate)", lb->per_layer.top1,
           lb->per_layer.top1 - float_top1, lb->per_layer.agree);
    if (lb->autorow.top1 >= 0)
        printf("%-31s | %9.2f%% | %+8.2f | %8.2f%%\n", "auto (qdq --data's default)", lb->autorow.top1,
               lb->autorow.top1 - float_top1, lb->autorow.agree);
    const lowbit_row *b = &lb->single[lb->best], *w = &lb->single[lb->worst];
    printf("spread between observers (best - worst top-1): %.2f points (%s %.2f%%, %s %.2f%%); per-layer best vs "
           "the best single observer: %+.2f points\n", b->top1 - w->top1, qcal_observer_kind_name(lb->kinds[lb->best]),
           b->top1, qcal_observer_kind_name(lb->kinds[lb->worst]), w->top1, lb->per_layer.top1 - b->top1);
    printf("per-layer choice (highest SQNR of each tensor's own fake-quant on the calibration data):");
    for (int i = 0; i < LOWBIT_NTENSORS; i++)
        printf("%s %s %s %.2f dB", i ? "," : "", lb->tensor[i], qcal_observer_kind_name(lb->choice[i]),
               lb->choice_sqnr_db[i]);
    if (lb->autorow.top1 >= 0) {
        printf("\nauto (its candidates: every kind but the moving averages; then at the logits on the first %lld "
               "calibration images, top-1 agreement with float, then SQNR: per-tensor %lld %.2f dB",
               (long long)lb->auto_n, (long long)lb->auto_agree[0], lb->auto_sqnr_db[0]);
        for (int k = 0; k < lb->n_kinds; k++)
            if (!isnan(lb->auto_sqnr_db[k + 1]))
                printf(", %s %lld %.2f dB", qcal_observer_kind_name(lb->kinds[k]), (long long)lb->auto_agree[k + 1],
                       lb->auto_sqnr_db[k + 1]);
        printf("; chose %s) chose the per-layer best's observer on %d of %d tensors; auto vs per-layer best: "
               "%+.2f points", lb->auto_at_outputs < 0 ? "per-tensor" : qcal_observer_kind_name(lb->kinds[lb->auto_at_outputs]),
               lb->auto_same, LOWBIT_NTENSORS, lb->autorow.top1 - lb->per_layer.top1);
    }
    printf("\n(every observer on every tensor in one qcal_numeric_eval pass, then the rules file %s/rules_%dbit.txt "
           "calibrated as 'qcal calibrate --rules' does: %.2f s; %d fake-quant evaluations %.2f s)\n\n", out_dir,
           lb->bits, lb->calib_s, lb->n_kinds + 1 + (lb->autorow.top1 >= 0), lb->eval_s);
}

/* report.html: every candidate observer on every tensor with the int8 qconfigs of the demo
 * (qcal_numeric_eval defaults), and each layer input's int8 layer SQNR in shadow mode from
 * the numeric suite (the best observer's tables). */
static qcal_status write_report(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n_calib,
                                const observer_result *best, int64_t sqnr_images, const char *path, double *secs)
{
    double t0 = cnn_now();
    qcal_numeric_eval *ev = NULL;
    qcal_status st = qcal_numeric_eval_create(NULL, &ev);
    if (st >= 0)
        st = demo_eval_feed(ctx, fm, train, n_calib, CALIB_BATCH, ev, 0);
    if (st >= 0)
        st = qcal_numeric_eval_finish(ev);
    if (st >= 0)
        st = demo_eval_feed(ctx, fm, train, n_calib, CALIB_BATCH, ev, 1);
    for (int64_t l = 0; l < NSEG && st >= 0; l++) {
        const char *fqn;
        int64_t steps;
        qcal_numeric_metrics mt;
        qcal_numeric_stats fs;
        if ((st = qcal_numeric_act_compare_get(best->shadow, l, &fqn, &steps, &mt, &fs)) >= 0)
            st = qcal_numeric_eval_set_layer_sqnr(ev, fqn, QCAL_CALIB_ROLE_ACTIVATION, mt.sqnr_db);
    }
    char source[256];
    snprintf(source, sizeof source, "qcal-demo: Fashion-MNIST CNN, %lld calibration images; int8 layer = "
             "numeric-suite SQNR of the int8 layer reading the tensor (%s tables, shadow mode, %lld test images)",
             (long long)n_calib, qcal_observer_kind_name(best->kind), (long long)sqnr_images);
    qcal_numeric_eval_report_options ro;
    qcal_numeric_eval_report_options_default(&ro);
    ro.title = "qcal-demo calibration report";
    ro.source = source;
    if (st >= 0)
        st = qcal_numeric_eval_write_report(ev, &ro, path);
    qcal_numeric_eval_destroy(&ev);
    *secs = cnn_now() - t0;
    return st;
}

/* ---- ONNX Runtime int8 (QDQ) ------------------------------------------------------------ */

/* Each observer's table deployed on a second engine: the float CNN as ONNX (qcal's builder;
 * tensors named after the table's entries, cnn_onnx_demo_names), Q/DQ inserted from the table
 * (qcal_onnx_qdq, profile ort: input quantized with conv1's qparams, each ReLU output with the
 * next layer's input qparams, max-pool and Flatten keeping theirs, int8 weights, int32 biases,
 * f32 logits as oneDNN's fc2), run by ONNX Runtime on the test images x [n,784]. Fills
 * res[k].ort_*; ONNX Runtime not there leaves them unset with the reason in why. */
static qcal_status run_ort(const cnn_model *fm, observer_result *res, int n_kinds, const float *x,
                           const uint8_t *labels, const uint8_t *fpred, int64_t n, const char *out_dir,
                           char *why, size_t cap, char *version, size_t vcap)
{
    if (!qcal_onnx_available()) {
        snprintf(why, cap, "qcal was built without ONNX support (-Donnx)");
        return QCAL_OK;
    }
    if (!ort_node_available(why, cap, version, vcap))
        return QCAL_OK;
    char xpath[4400], path[4400], opath[4400], lpath[4400];
    qcal_onnx_model *om = NULL;
    qcal_onnx_qdq_report rep;
    memset(&rep, 0, sizeof rep);
    qcal_npy_array a = {0};
    snprintf(xpath, sizeof xpath, "%s/test_images.npy", out_dir);
    const int64_t shape[4] = {n, 1, 28, 28};
    const cnn_onnx_names *names = NULL;
    qcal_status st = cnn_onnx_demo_names(fm, res[0].table, &names);
    if (st == QCAL_OK)
        st = qcal_npy_write(xpath, QCAL_NPY_F32, 4, shape, x);
    if (st == QCAL_OK && (st = cnn_onnx_build(fm, names, &om)) == QCAL_OK) {
        snprintf(path, sizeof path, "%s/model.onnx", out_dir);
        st = qcal_onnx_model_save_file(om, NULL, path);
        qcal_onnx_model_destroy(&om);
    }
    for (int k = 0; k < n_kinds && st == QCAL_OK; k++) {
        observer_result *r = &res[k];
        const char *kind = qcal_observer_kind_name(r->kind);
        qcal_onnx_qdq_options qo;
        qcal_onnx_qdq_options_default(&qo);
        if ((st = cnn_onnx_build(fm, names, &om)) != QCAL_OK ||
            (st = qcal_onnx_qdq(om, r->table, &qo, &rep)) != QCAL_OK)
            break;
        /* every conv / linear layer quantized; only the logits (f32, as oneDNN's) have no entry */
        if (rep.n_skipped || rep.n_missing != 1 || strcmp(rep.missing[0], names->logits)) {
            st = qcal_set_error(QCAL_ERR_STATE, "qdq of the %s table: %lld ops skipped, %lld tensors missing "
                                "(want only '%s')", kind, (long long)rep.n_skipped, (long long)rep.n_missing,
                                names->logits);
            break;
        }
        qcal_onnx_qdq_report_free(&rep);
        snprintf(path, sizeof path, "%s/%s/model_qdq.onnx", out_dir, kind);
        snprintf(opath, sizeof opath, "%s/%s/ort_logits.npy", out_dir, kind);
        snprintf(lpath, sizeof lpath, "%s/%s/ort.log", out_dir, kind);
        if ((st = qcal_onnx_model_save_file(om, NULL, path)) != QCAL_OK)
            break;
        qcal_onnx_model_destroy(&om);
        if ((st = ort_node_run(path, xpath, opath, lpath, qcal_threads_count(), &r->ort_s)) != QCAL_OK ||
            (st = qcal_npy_read_f32(opath, &a)) != QCAL_OK)
            break;
        if (a.ndim != 2 || a.shape[0] != n || a.shape[1] != CNN_CLASSES) {
            st = qcal_set_error(QCAL_ERR_MISMATCH, "%s: want [%lld, %d] logits", opath, (long long)n, CNN_CLASSES);
            break;
        }
        int64_t right = 0, agree = 0, same = 0;
        for (int64_t i = 0; i < n; i++) {
            int p = argmax10((const float *)a.data + i * CNN_CLASSES);
            right += p == labels[i];
            agree += p == fpred[i];
            same += p == r->pred[i];
        }
        qcal_npy_array_free(&a);
        r->ort_top1 = 100.0 * (double)right / (double)n;
        r->ort_agree = 100.0 * (double)agree / (double)n;
        r->ort_same = 100.0 * (double)same / (double)n;
        r->ort_ran = true;
        cnn_progress_stderr(NULL, "ONNX Runtime int8", k + 1, n_kinds, r->ort_top1);
    }
    qcal_onnx_qdq_report_free(&rep);
    qcal_onnx_model_destroy(&om);
    qcal_npy_array_free(&a);
    remove(xpath);   /* 31 MB of test images, the input of the runs above */
    return st;
}

/* ---- main ------------------------------------------------------------------------------ */

static const char *mark(bool ok) { return ok ? "OK" : "MISSED"; }

static bool is_minmax_kind(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_MINMAX || k == QCAL_OBSERVER_MOVING_AVERAGE_MINMAX;
}

int main(int argc, char **argv)
{
    demo_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (check_dataset(o.data_dir) || prepare_out_dir(o.out_dir))
        return 1;

    double t_start = cnn_now();
    cnn_data train = {0}, test = {0};
    cnn_ctx *ctx = NULL;
    cnn_model *fm = NULL, *qm = NULL;
    float_taps ft = {0};
    uint8_t *fpred = NULL;
    float *logits = NULL;
    observer_result res[QCAL_OBSERVER_KIND_COUNT];
    memset(res, 0, sizeof res);
    model_qparams qat_q;
    memset(&qat_q, 0, sizeof qat_q);
    eval_result qat_ev = {0};
    qcal_int8_net *net = NULL;
    bool trained = false;
    double train_s = 0, float_eval_s = 0, fwd_calib_s = 0, qat_s = 0;
    int64_t right = 0;
    lowbit_result lb;
    memset(&lb, 0, sizeof lb);
    double report_s = 0;
    char path[4400];

    TRY(cnn_data_load(o.data_dir, "train", &train));
    TRY(cnn_data_load(o.data_dir, "t10k", &test));
    if (o.test_images > 0 && o.test_images < test.n)
        test.n = o.test_images;
    if (o.calib_offset >= train.n) {
        rc = die(2, "--calib-offset %lld: the training set has %lld images", (long long)o.calib_offset,
                 (long long)train.n);
        goto done;
    }
    /* The calibration images: training images calib_offset.. (training and QAT use them all). */
    cnn_data calib = train;
    calib.images += o.calib_offset * 784;
    calib.labels += o.calib_offset;
    calib.n -= o.calib_offset;
    int64_t n_calib = o.calib_images < calib.n ? o.calib_images : calib.n;
    TRY(cnn_ctx_create(256, &ctx));

    /* 1. Float model. */
    double t0 = cnn_now();
    if (o.weights) {
        TRY(cnn_model_load(o.weights, &fm));
    } else {
        TRY(cnn_load_or_train(ctx, &train, &o.train, cnn_progress_stderr, NULL, &fm, &trained));
    }
    train_s = cnn_now() - t0;
    if (o.weights)
        printf("float model: %s (loaded in %.2f s)\n", o.weights, train_s);
    else if (trained)
        printf("float model: trained in %.1f s (%d epochs on %lld images), cached\n", train_s, o.train.epochs,
               (long long)(o.train.max_images > 0 ? o.train.max_images : train.n));
    else
        printf("float model: loaded from the cache in %.2f s\n", train_s);

    /* Float evaluation; keeps the normalised test images and, for the first sqnr_images,
     * every tap (the shadow-mode references). */
    ft.n = o.sqnr_images < test.n ? o.sqnr_images : test.n;
    ft.n_x = test.n;
    ft.x = ex_malloc((size_t)(test.n * 784) * sizeof(float));
    for (int t = 0; t < CNN_NTAPS; t++)
        ft.tap[t] = ex_malloc((size_t)(ft.n * tap_numel[t]) * sizeof(float));
    fpred = ex_malloc((size_t)test.n);
    logits = ex_malloc((size_t)(test.n * CNN_CLASSES) * sizeof(float));
    if (!ft.x || !ft.tap[CNN_NTAPS - 1] || !ft.tap[0] || !ft.tap[1] || !ft.tap[2] || !ft.tap[3] || !fpred ||
        !logits)
        TRY(QCAL_ERR_NO_MEMORY);
    {
        cnn_hooks cap = {.act = capture_hook, .user = &ft};
        for (int64_t i0 = 0; i0 < test.n; i0 += 250) {
            int bn = (int)(test.n - i0 < 250 ? test.n - i0 : 250);
            const float *z;
            ft.i0 = i0;
            TRY(cnn_forward(ctx, fm, test.images + i0 * 784, bn, &cap, &z));
            for (int i = 0; i < bn; i++) {
                fpred[i0 + i] = (uint8_t)argmax10(z + i * CNN_CLASSES);
                right += fpred[i0 + i] == test.labels[i0 + i];
            }
            cnn_progress_stderr(NULL, "f32 eval", i0 + bn, test.n, 100.0 * (double)right / (double)(i0 + bn));
        }
        /* timed: plain f32 evaluation of the test set (median of 3) */
        double t[3];
        for (int k = 0; k < 3; k++) {
            double ts = cnn_now();
            int64_t r2 = 0;
            TRY(cnn_evaluate(ctx, fm, &test, NULL, &r2, NULL, NULL, NULL));
            t[k] = cnn_now() - ts;
            if (r2 != right)
                TRY(qcal_set_error(QCAL_ERR_STATE, "f32 evaluation not repeatable: %lld then %lld correct",
                                   (long long)right, (long long)r2));
        }
        float_eval_s = median3(t);
    }
    double float_top1 = 100.0 * (double)right / (double)test.n;
    printf("float top-1: %.2f%% on %lld test images (f32 evaluation %.3f s)\n\n", float_top1, (long long)test.n,
           float_eval_s);
    TRY(time_float_forward(ctx, fm, &calib, n_calib, &fwd_calib_s));

    /* 2-3. Calibrate with each observer, convert, evaluate in int8, shadow-mode SQNR. */
    for (int k = 0; k < o.n_kinds; k++) {
        observer_result *r = &res[k];
        r->kind = o.kinds[k];
        char phase[64];
        snprintf(phase, sizeof phase, "int8 %s", qcal_observer_kind_name(r->kind));
        TRY(calibrate(ctx, fm, &calib, n_calib, r->kind, o.input_same, o.grid, r));
        TRY(build_net_table(fm, r->table, 0, NSEG - 1, &net));
        TRY(eval_int8(net, ft.x, test.labels, fpred, test.n, phase, logits, &r->ev));
        qcal_int8_net_destroy(&net);
        if (!(r->pred = ex_malloc((size_t)test.n)))
            TRY(QCAL_ERR_NO_MEMORY);
        for (int64_t i = 0; i < test.n; i++)
            r->pred[i] = (uint8_t)argmax10(logits + i * CNN_CLASSES);
        TRY(shadow_compare(fm, r->table, &ft, &r->shadow));
        TRY(worst_sqnr(r->shadow, &r->worst_sqnr_db, &r->worst_layer));
        TRY(write_tables(r->table, r->kind, o.out_dir));
    }

    /* 3a. The same tables on ONNX Runtime's int8 kernels (QDQ models). */
    char ort_why[4400] = "skipped (--no-ort)", ort_version[64] = "";
    if (o.ort)
        TRY(run_ort(fm, res, o.n_kinds, ft.x, test.labels, fpred, test.n, o.out_dir, ort_why, sizeof ort_why,
                    ort_version, sizeof ort_version));

    /* 4. The table. */
    printf("Post-training static quantization: int8 on oneDNN, %lld calibration images (batches of %d), "
           "weights per-channel symmetric qint8, activations quint8 per-tensor affine; model input: %s\n",
           (long long)n_calib, CALIB_BATCH, o.input_same ? "the observer of the row" : "minmax (every row)");
    if (o.calib_offset > 0 || o.grid != QCAL_GRID_LATTICE)
        printf("(calibration images: training images %lld..%lld; histogram-family grid: %s)\n",
               (long long)o.calib_offset, (long long)(o.calib_offset + n_calib - 1),
               qcal_observer_grid_name(o.grid));
    printf("%-23s | %10s | %8s | %9s | %9s | %13s | %s\n", "observer", "int8 top-1", "delta", "agreement",
           "calib (s)", "worst SQNR dB", "int8 eval (s)");
    printf("%-23s-+-%10s-+-%8s-+-%9s-+-%9s-+-%13s-+-%s\n", "-----------------------", "----------", "--------",
           "---------", "---------", "-------------", "-------------");
    int best = 0;
    for (int k = 0; k < o.n_kinds; k++) {
        observer_result *r = &res[k];
        char ws[32];
        snprintf(ws, sizeof ws, "%.2f (%s)", r->worst_sqnr_db, cnn_layer_name(r->worst_layer));
        printf("%-23s | %9.2f%% | %+8.2f | %8.2f%% | %9.3f | %13s | %.3f\n", qcal_observer_kind_name(r->kind),
               r->ev.top1, r->ev.top1 - float_top1, r->ev.agree, r->calib_s, ws, r->ev.eval_s);
        if (r->ort_ran) {
            char same[32];
            snprintf(same, sizeof same, "%.2f%% same", r->ort_same);
            printf("%-23s | %9.2f%% | %+8.2f | %8.2f%% | %9s | %13s | %.3f\n", "ONNX Runtime int8 (QDQ)",
                   r->ort_top1, r->ort_top1 - float_top1, r->ort_agree, "", same, r->ort_s);
        }
        if (r->ev.top1 > res[best].ev.top1 || (r->ev.top1 == res[best].ev.top1 && r->ev.agree > res[best].ev.agree))
            best = k;
    }
    printf("(float top-1 %.2f%%; agreement = test images where the int8 top-1 equals the float top-1; "
           "worst SQNR over conv1/conv2/fc1/fc2 in shadow mode on %lld test images)\n", float_top1,
           (long long)ft.n);
    if (res[0].ort_ran)
        printf("(ONNX Runtime int8 (QDQ): the row's table as a QDQ model, %s/<observer>/model_qdq.onnx (qcal_onnx_qdq, "
               "profile ort), run by ONNX Runtime %s (onnxruntime-node, CPU, U8U8 kernels: docs/onnx.md); \"same\" = "
               "test images whose top-1 equals oneDNN's; its time includes starting node and the session)\n\n",
               o.out_dir, ort_version);
    else
        printf("ONNX Runtime int8 (QDQ): not run: %s\n\n", ort_why);

    layer_row rows[NSEG];
    TRY(layer_rows(fm, res[best].shadow, rows));
    printf("Numeric suite, best observer %s (weights: per-channel symmetric qint8; activations: shadow mode, "
           "each int8 layer fed the float input)\n", qcal_observer_kind_name(res[best].kind));
    printf("%-6s | %9s | %9s | %11s | %9s | %9s | %11s | %s\n", "layer", "w SQNR dB", "w cosine", "w max err",
           "a SQNR dB", "a cosine", "a max err", "act scale / zp (range)");
    for (int l = 0; l < NSEG; l++) {
        const qcal_calib_entry *e = NULL;
        TRY(qcal_calib_table_find(res[best].table, cnn_layer_name(l), QCAL_CALIB_ROLE_ACTIVATION, &e));
        printf("%-6s | %9.2f | %9.6f | %11.3g | %9.2f | %9.6f | %11.3g | %.6g / %d ([%.4g, %.4g])\n",
               cnn_layer_name(l), rows[l].w.m.sqnr_db, rows[l].w.m.cosine, rows[l].w.m.max_abs_err,
               rows[l].act.sqnr_db, rows[l].act.cosine, rows[l].act.max_abs_err,
               (double)qcal_qparams_scale_at(&e->qparams, 0), qcal_qparams_zero_point_at(&e->qparams, 0),
               (double)e->min_val[0], (double)e->max_val[0]);
    }
    printf("(activation row = the layer with its ReLU and pool, output requantized with the next layer's "
           "input qparams; fc2 outputs f32 logits)\n\n");

    /* 4a. The low-bit setting: where the observer matters. */
    if (o.low_bits) {
        TRY(lowbit_run(ctx, fm, &calib, n_calib, CALIB_BATCH, &test, fpred, o.n_kinds, o.kinds, o.low_bits,
                       o.out_dir, &lb));
        print_lowbit(&lb, float_top1, test.n, o.out_dir);
    }

    /* 4b. The HTML report: every observer on every tensor (int8 qconfigs), with the numeric
     * suite's shadow-mode SQNR of the best observer's int8 layers. */
    snprintf(path, sizeof path, "%s/report.html", o.out_dir);
    TRY(write_report(ctx, fm, &calib, n_calib, &res[best], ft.n, path, &report_s));
    printf("Report: %s (every observer on every tensor with the int8 qconfigs, SQNR and clipping, histograms, "
           "objective curves, per-channel weight ranges, the int8 layer SQNR of the %s tables; %.2f s)\n\n", path,
           qcal_observer_kind_name(res[best].kind), report_s);

    /* 5. QAT. */
    if (o.qat) {
        t0 = cnn_now();
        TRY(run_qat(ctx, fm, &train, &o, &qm, &qat_q));
        qat_s = cnn_now() - t0;
        TRY(build_net_qat(qm, &qat_q, &net));
        TRY(eval_int8(net, ft.x, test.labels, fpred, test.n, "int8 qat", logits, &qat_ev));
        qcal_int8_net_destroy(&net);
        printf("QAT (%d steps of %d images, lr %g cosine, observers frozen after %d steps, %.1f s): int8 top-1 "
               "%.2f%% (%+.2f vs float, %+.2f vs best post-training %s), agreement %.2f%%\n\n", o.qat_sched.steps,
               o.qat_sched.batch, (double)o.qat_sched.lr, o.qat_sched.freeze_step, qat_s, qat_ev.top1, qat_ev.top1 - float_top1,
               qat_ev.top1 - res[best].ev.top1, qcal_observer_kind_name(res[best].kind), qat_ev.agree);
    }

    /* 6. Outputs. */
    snprintf(path, sizeof path, "%s/stats.csv", o.out_dir);
    TRY(write_stats_log(ctx, fm, &calib, n_calib, path));
    snprintf(path, sizeof path, "%s/numeric_%s.csv", o.out_dir, qcal_observer_kind_name(res[best].kind));
    TRY(write_numeric_csv(path, rows));
    double total_s = cnn_now() - t_start;

    /* Targets. */
    double max_int8_s = 0, max_overhead = 0;
    bool acc_ok = true;
    printf("Targets (PyTorch 1.13 FX PTQ, onednn backend, same model: -0.02..-0.06 points, 99.3-99.5%% "
           "agreement, %.2f s int8 evaluation):\n", PYTORCH_INT8_EVAL_S);
    printf("  float top-1 >= 90%%: %.2f%%  %s\n", float_top1, mark(float_top1 >= 90.0));
    for (int k = 0; k < o.n_kinds; k++) {
        observer_result *r = &res[k];
        bool ok = r->ev.top1 >= float_top1 - 0.1 && r->ev.agree >= 99.3;
        acc_ok = acc_ok && ok;
        printf("  %-22s within 0.1 points of float and >= 99.3%% agreement: %+.2f, %.2f%%  %s\n",
               qcal_observer_kind_name(r->kind), r->ev.top1 - float_top1, r->ev.agree, mark(ok));
        if (r->ev.eval_s > max_int8_s)
            max_int8_s = r->ev.eval_s;
        if (is_minmax_kind(r->kind) && 100.0 * r->hook_s / r->fwd_s > max_overhead)
            max_overhead = 100.0 * r->hook_s / r->fwd_s;
    }
    for (int k = 0; k < o.n_kinds; k++) {
        observer_result *r = &res[k];
        if (r->ort_ran)
            printf("  %-22s ONNX Runtime int8 within 0.1 points of oneDNN, >= 99.8%% same predictions: %+.2f, "
                   "%.2f%%  %s\n", qcal_observer_kind_name(r->kind), r->ort_top1 - r->ev.top1, r->ort_same,
                   mark(fabs(r->ort_top1 - r->ev.top1) <= 0.1 + 1e-9 && r->ort_same >= 99.8));
    }
    if (o.qat)
        printf("  QAT >= best post-training: %.2f%% vs %.2f%%  %s\n", qat_ev.top1, res[best].ev.top1,
               mark(qat_ev.top1 >= res[best].ev.top1));
    /* Timings depend on the machine's load: printed beside their reference values, without
     * pass/fail (speed is the bench's job, docs/performance.md). */
    printf("Timings (this run; reference values in brackets, not pass/fail):\n");
    printf("  int8 evaluation: slowest %.3f s on %lld images [PyTorch %.2f s for 10000 images; "
           "qcal f32 %.3f s]\n", max_int8_s, (long long)test.n, PYTORCH_INT8_EVAL_S, float_eval_s);
    bool any_mm = false;
    for (int k = 0; k < o.n_kinds; k++)
        any_mm = any_mm || is_minmax_kind(res[k].kind);
    if (any_mm)
        printf("  min/max observers: %.1f%% of the float forward in the same calibration loop (plain "
               "forward %.3f s for %lld images) [10%%]\n", max_overhead, fwd_calib_s,
               (long long)n_calib);
    printf("  whole demo: %.1f s (%s) [%.0f s]\n", total_s,
           trained ? "cold start, model trained" : "model loaded", trained ? 180.0 : 60.0);

    if (o.json_path) {
        qcal_atomic_file f;
        TRY(qcal_atomic_file_open(&f, o.json_path));
        fprintf(f.fp, "{\n  \"float_top1\": ");
        json_num(f.fp, float_top1, 2);
        fprintf(f.fp, ",\n  \"test_images\": %lld,\n  \"calib_images\": %lld,\n  \"best_observer\": \"%s\",\n"
                      "  \"observers\": {\n", (long long)test.n, (long long)n_calib,
                qcal_observer_kind_name(res[best].kind));
        for (int k = 0; k < o.n_kinds; k++) {
            observer_result *r = &res[k];
            fprintf(f.fp, "    \"%s\": {\"top1\": ", qcal_observer_kind_name(r->kind));
            json_num(f.fp, r->ev.top1, 2);
            fprintf(f.fp, ", \"agree\": ");
            json_num(f.fp, r->ev.agree, 2);
            fprintf(f.fp, ", \"calib_s\": ");
            json_num(f.fp, r->calib_s, 4);
            fprintf(f.fp, ", \"worst_sqnr_db\": ");
            json_num(f.fp, r->worst_sqnr_db, 3);
            fprintf(f.fp, ", \"worst_layer\": \"%s\", \"int8_eval_s\": ", cnn_layer_name(r->worst_layer));
            json_num(f.fp, r->ev.eval_s, 4);
            fprintf(f.fp, ", \"observer_overhead_pct\": ");
            json_num(f.fp, 100.0 * r->hook_s / r->fwd_s, 2);
            fprintf(f.fp, ", \"ort_top1\": ");
            json_num(f.fp, r->ort_ran ? r->ort_top1 : NAN, 2);
            fprintf(f.fp, ", \"ort_agree\": ");
            json_num(f.fp, r->ort_ran ? r->ort_agree : NAN, 2);
            fprintf(f.fp, ", \"ort_same_as_onednn\": ");
            json_num(f.fp, r->ort_ran ? r->ort_same : NAN, 2);
            fprintf(f.fp, ", \"ort_eval_s\": ");
            json_num(f.fp, r->ort_ran ? r->ort_s : NAN, 3);
            fprintf(f.fp, "}%s\n", k + 1 < o.n_kinds ? "," : "");
        }
        fprintf(f.fp, "  },\n  \"low_bits\": ");
        if (!o.low_bits) {
            fprintf(f.fp, "null");
        } else {
            fprintf(f.fp, "{\"bits\": %d, \"observers\": {", lb.bits);
            for (int k = 0; k < lb.n_kinds; k++) {
                fprintf(f.fp, "%s\n    \"%s\": {\"top1\": ", k ? "," : "", qcal_observer_kind_name(lb.kinds[k]));
                json_num(f.fp, lb.single[k].top1, 2);
                fprintf(f.fp, ", \"agree\": ");
                json_num(f.fp, lb.single[k].agree, 2);
                fprintf(f.fp, "}");
            }
            fprintf(f.fp, "},\n    \"per_layer_best\": {\"top1\": ");
            json_num(f.fp, lb.per_layer.top1, 2);
            fprintf(f.fp, ", \"agree\": ");
            json_num(f.fp, lb.per_layer.agree, 2);
            fprintf(f.fp, ", \"choice\": {");
            for (int i = 0; i < LOWBIT_NTENSORS; i++)
                fprintf(f.fp, "%s\"%s\": \"%s\"", i ? ", " : "", lb.tensor[i], qcal_observer_kind_name(lb.choice[i]));
            fprintf(f.fp, "}},\n    \"auto\": {\"top1\": ");
            json_num(f.fp, lb.autorow.top1 >= 0 ? lb.autorow.top1 : NAN, 2);
            fprintf(f.fp, ", \"agree\": ");
            json_num(f.fp, lb.autorow.top1 >= 0 ? lb.autorow.agree : NAN, 2);
            fprintf(f.fp, ", \"same_choice\": %d", lb.autorow.top1 >= 0 ? lb.auto_same : -1);
            fprintf(f.fp, ", \"chose\": \"%s\"", lb.autorow.top1 < 0 ? ""
                    : lb.auto_at_outputs < 0 ? "per-tensor" : qcal_observer_kind_name(lb.kinds[lb.auto_at_outputs]));
            fprintf(f.fp, "}, \"best_observer\": \"%s\", \"worst_observer\": \"%s\", \"spread\": ",
                    qcal_observer_kind_name(lb.kinds[lb.best]), qcal_observer_kind_name(lb.kinds[lb.worst]));
            json_num(f.fp, lb.single[lb.best].top1 - lb.single[lb.worst].top1, 2);
            fprintf(f.fp, ", \"per_layer_vs_best\": ");
            json_num(f.fp, lb.per_layer.top1 - lb.single[lb.best].top1, 2);
            fprintf(f.fp, "}");
        }
        fprintf(f.fp, ",\n  \"qat_top1\": ");
        json_num(f.fp, o.qat ? qat_ev.top1 : NAN, 2);
        fprintf(f.fp, ",\n  \"qat_agree\": ");
        json_num(f.fp, o.qat ? qat_ev.agree : NAN, 2);
        fprintf(f.fp, ",\n  \"timings\": {\"float_model_s\": ");
        json_num(f.fp, train_s, 3);
        fprintf(f.fp, ", \"float_trained\": %s, \"float_eval_s\": ", trained ? "true" : "false");
        json_num(f.fp, float_eval_s, 4);
        fprintf(f.fp, ", \"float_forward_calib_s\": ");
        json_num(f.fp, fwd_calib_s, 4);
        fprintf(f.fp, ", \"low_bits_s\": ");
        json_num(f.fp, o.low_bits ? lb.calib_s + lb.eval_s : NAN, 3);
        fprintf(f.fp, ", \"report_s\": ");
        json_num(f.fp, report_s, 3);
        fprintf(f.fp, ", \"qat_s\": ");
        json_num(f.fp, o.qat ? qat_s : NAN, 3);
        fprintf(f.fp, ", \"total_s\": ");
        json_num(f.fp, total_s, 3);
        fprintf(f.fp, "},\n  \"output_dir\": ");
        json_str(f.fp, o.out_dir);
        fprintf(f.fp, "\n}\n");
        TRY(qcal_atomic_file_commit(&f));
    }
    char lowbit_files[128] = "";
    if (o.low_bits)
        snprintf(lowbit_files, sizeof lowbit_files, ", {evaluate_%dbit.txt, report_%dbit.html, rules_%dbit.txt}",
                 o.low_bits, o.low_bits, o.low_bits);
    printf("\nOutputs in %s/: <observer>/{calib.json, calibration_trt.cache, calibration.cache, model.table%s}, "
           "stats.csv, numeric_%s.csv, report.html%s%s%s%s\n", o.out_dir,
           res[0].ort_ran ? ", model_qdq.onnx, ort_logits.npy" : "", qcal_observer_kind_name(res[best].kind),
           lowbit_files, res[0].ort_ran ? ", model.onnx (float)" : "", o.json_path ? "; JSON summary: " : "",
           o.json_path ? o.json_path : "");
    (void)acc_ok;

done:
    qcal_int8_net_destroy(&net);
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
        qcal_calib_table_destroy(&res[k].table);
        qcal_numeric_act_compare_destroy(&res[k].shadow);
        free(res[k].pred);
    }
    qparams_free(&qat_q);
    for (int t = 0; t < CNN_NTAPS; t++)
        free(ft.tap[t]);
    free(ft.x);
    free(fpred);
    free(logits);
    cnn_model_destroy(&fm);
    cnn_model_destroy(&qm);
    cnn_ctx_destroy(&ctx);
    cnn_data_free(&train);
    cnn_data_free(&test);
    return rc;
}
