/* Quantization-aware training example on Fashion-MNIST (Debian package
 * dataset-fashion-mnist): trains the demo CNN in float (or loads it from the cache or
 * --weights), then prints float accuracy, post-training fake-quant accuracy and QAT accuracy
 * on the 10,000 test images.
 *
 *   qat_fmnist [--weights FILE] [--epochs N] [--batch N] [--lr X] [--seed N]
 *              [--calib-batches N] [--qat-steps N] [--qat-lr X] [--qat-freeze N]
 *              [--act-range reduced|full] [--train-images N] [--data DIR]
 *
 * Under mpirun (mpirun -np N qat_fmnist ...) QAT is data-parallel: every rank trains on a
 * slice of each batch, gradients and activation ranges are reduced every step, so every
 * rank holds the same model and qparams (checked and printed); rank 0 prints the results.
 */
#define _POSIX_C_SOURCE 200809L   /* POSIX calls (mkdir, fileno, clock_gettime) under -std=c11 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qat.h"
#if QAT_WITH_MPI   /* set by examples/meson.build when built with MPI */
#include "qat_dp_mpi.h"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qat_fmnist [options]\n"
            "  --weights FILE       float model (.safetensors, PyTorch names) instead of the cache\n"
            "  --epochs N           float training epochs (default 3)\n"
            "  --batch N            float training batch (default 128)\n"
            "  --lr X               float Adam learning rate (default 0.002, x0.3 per epoch)\n"
            "  --seed N             initialisation and shuffling seed (default 1)\n"
            "  --train-images N     train on the first N images only (default: all)\n"
            "  --calib-batches N    post-training calibration batches (default 32)\n"
            "  --qat-steps N        QAT fine-tuning steps (default 469, one epoch)\n"
            "  --qat-lr X           initial QAT Adam learning rate, cosine to 0 (default 2e-4)\n"
            "  --qat-freeze N       freeze observers after N QAT steps (default 350)\n"
            "  --act-range R        activation fake-quant: reduced (quint8 [0, 127], PyTorch's\n"
            "                       x86/fbgemm default) or full ([0, 255], onednn/qnnpack)\n"
            "  --data DIR           dataset directory (default $QCAL_FMNIST_DIR or\n"
            "                       /usr/share/datasets/fashion-mnist)\n");
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "qat_fmnist: %s '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int run(int argc, char **argv, const cnn_dp *dp);

int main(int argc, char **argv)
{
#if QAT_WITH_MPI
    if (qat_dp_launched()) {
        cnn_dp dp;
        if (qat_dp_init(&argc, &argv, &dp) != QCAL_OK) {
            fprintf(stderr, "qat_fmnist: MPI_Init failed\n");
            return 1;
        }
        int rc = run(argc, argv, &dp);
        qat_dp_finalize();
        return rc;
    }
#endif
    return run(argc, argv, NULL);
}

/* True when every rank of a data-parallel run holds x (always true alone). */
static bool same_on_ranks(const cnn_dp *dp, uint64_t x)
{
#if QAT_WITH_MPI
    if (dp)
        return qat_dp_same(x);
#endif
    (void)dp;
    (void)x;
    return true;
}

static int run(int argc, char **argv, const cnn_dp *dp)
{
    cnn_qat_opts o = cnn_qat_opts_default();
    const char *dir = cnn_data_dir();
    int rank = dp ? dp->rank : 0, size = dp ? dp->size : 1;
    o.qat.dp = dp;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "qat_fmnist: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        double x = 0;
        int bad = 0;
        if (!strcmp(a, "--weights"))
            o.weights = v;
        else if (!strcmp(a, "--data"))
            dir = v;
        else if (!strcmp(a, "--epochs"))
            bad = parse_num(a, v, 1, 1000, &x), o.float_opts.epochs = (int)x;
        else if (!strcmp(a, "--batch"))
            bad = parse_num(a, v, 1, 4096, &x), o.float_opts.batch = (int)x;
        else if (!strcmp(a, "--lr"))
            bad = parse_num(a, v, 1e-8, 1, &x), o.float_opts.lr = (float)x;
        else if (!strcmp(a, "--seed"))
            bad = parse_num(a, v, 0, 1e15, &x), o.float_opts.seed = (uint64_t)x;
        else if (!strcmp(a, "--train-images"))
            bad = parse_num(a, v, 0, 1e9, &x), o.float_opts.max_images = (int64_t)x;
        else if (!strcmp(a, "--calib-batches"))
            bad = parse_num(a, v, 1, 1e6, &x), o.calib_batches = (int)x;
        else if (!strcmp(a, "--qat-steps"))
            bad = parse_num(a, v, 0, 1e7, &x), o.qat.steps = (int)x;
        else if (!strcmp(a, "--qat-lr"))
            bad = parse_num(a, v, 0, 1, &x), o.qat.lr = (float)x;
        else if (!strcmp(a, "--act-range")) {
            if (!strcmp(v, "reduced"))
                o.fq.act_preset = QCAL_FAKEQUANT_PRESET_ACTIVATION;
            else if (!strcmp(v, "full"))
                o.fq.act_preset = QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE;
            else {
                fprintf(stderr, "qat_fmnist: --act-range '%s': expected reduced or full\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--qat-freeze"))
            bad = parse_num(a, v, 0, 1e7, &x), o.qat.freeze_step = (int)x;
        else {
            fprintf(stderr, "qat_fmnist: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad)
            return 2;
    }

    cnn_data train = {0}, test = {0};
    cnn_ctx *ctx = NULL;
    cnn_qat_result r;
    int maxb = o.float_opts.batch > o.qat.batch ? o.float_opts.batch : o.qat.batch;
    qcal_status st = cnn_data_load(dir, "train", &train);
    if (st == QCAL_OK)
        st = cnn_data_load(dir, "t10k", &test);
    if (st == QCAL_OK)
        st = cnn_ctx_create(maxb < 500 ? 500 : maxb, &ctx);
    if (st == QCAL_OK)
        st = cnn_qat_run(ctx, &train, &test, &o, rank == 0 ? cnn_progress_stderr : NULL, NULL, &r);
    if (st != QCAL_OK) {
        if (size > 1)
            fprintf(stderr, "qat_fmnist: rank %d: %s: %s\n", rank, qcal_status_str(st), qcal_last_error());
        else
            fprintf(stderr, "qat_fmnist: %s: %s\n", qcal_status_str(st), qcal_last_error());
        cnn_ctx_destroy(&ctx);
        cnn_data_free(&train);
        cnn_data_free(&test);
        return 1;
    }
    bool same = same_on_ranks(dp, r.qat_digest);
    if (rank != 0)
        goto out;
    if (r.float_trained)
        printf("float training: %.1f s (%d epochs, batch %d)\n", r.float_train_s, o.float_opts.epochs,
               o.float_opts.batch);
    else
        printf("float model: %s\n", o.weights ? o.weights : "loaded from cache");
    printf("float accuracy:          %6.2f%%  (%lld test images, f32 eval %.2f s)\n", r.float_acc,
           (long long)r.test_images, r.eval_float_s);
    printf("post-training fake-quant: %6.2f%%  (agreement with float %.2f%%, calibration %d batches)\n",
           r.ptq_acc, r.ptq_agree, o.calib_batches);
    printf("QAT accuracy:            %6.2f%%  (agreement with float %.2f%%, %d steps in %.1f s)\n", r.qat_acc,
           r.qat_agree, o.qat.steps, r.qat_train_s);
    if (r.qat_int8_acc >= 0)
        printf("QAT int8 accuracy:       %6.2f%%  (converted to an int8 oneDNN net)\n", r.qat_int8_acc);
    if (dp)
        printf("data-parallel QAT: %d ranks, model and qparams %s on every rank (digest %016llx)\n", size,
               same ? "identical" : "DIFFERENT", (unsigned long long)r.qat_digest);
out:
    cnn_ctx_destroy(&ctx);
    cnn_data_free(&train);
    cnn_data_free(&test);
    return same ? 0 : 1;
}
