/* The demo CNN for other engines: writes it as an ONNX model with its data as .npy files, and
 * runs qcal's own int8 (oneDNN) for any calibration table of that ONNX model, so that an
 * engine's int8 predictions can be compared with qcal's (tests/ort/test_cnn_qdq.py does it
 * with ONNX Runtime; docs/onnx.md).
 *
 *   cnn_deploy export DIR [--calib-images N] [--test-images N] [--weights FILE] [--data DIR]
 *                         [--train-images N] [--epochs N]
 *       DIR/model.onnx           the float CNN (cnn_onnx.h, torch.onnx.export's names)
 *       DIR/model.safetensors    its weights (the cached C-trained model, or --weights)
 *       DIR/calib.npy            the demo's calibration images, [N,1,28,28] float32 normalised
 *                                (training images 0..N-1, default 1000)
 *       DIR/test.npy, DIR/labels.npy   the test images [M,1,28,28] and labels [M] (uint8)
 *       DIR/float_logits.npy     qcal's f32 forward of the test images, [M,10]
 *   cnn_deploy int8 DIR --table TABLE.json --out LOGITS.npy [--f32-logits]
 *       the int8 net of include/qcal/int8.h built from TABLE (activation entries named after
 *       the ONNX tensors: conv1 reads "input", conv2 the first of "/pool1/MaxPool_output_0",
 *       "/relu1/Relu_output_0" the table holds (max-pool keeps its input's qparams, so a
 *       profile calibrates one of them), fc1 the first of the Flatten, pool2 and relu2
 *       outputs, fc2 "/relu3/Relu_output_0"; fc2
 *       writes u8 codes with the "logits" entry when the table has one, as a QDQ model does,
 *       else (or with --f32-logits) f32) on DIR/test.npy; LOGITS.npy gets the (dequantized)
 *       logits [M,10].
 *
 * The float model is the demo's: loaded from the cache ($XDG_CACHE_HOME/qcal or
 * ~/.cache/qcal), trained there first if missing (3 epochs, as ./run.sh demo does;
 * --train-images / --epochs train and cache a smaller one, for quick runs). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <qcal/calib.h>
#include <qcal/int8.h>
#include <qcal/npy.h>
#include <qcal/onnx.h>

#include "cnn.h"
#include "cnn_onnx.h"
#include "ex_util.h"

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: cnn_deploy export DIR [--calib-images N] [--test-images N] [--weights FILE] "
               "[--data DIR] [--train-images N] [--epochs N]\n"
               "       cnn_deploy int8 DIR --table TABLE.json --out LOGITS.npy [--f32-logits]\n");
    return rc;
}

static int fail(qcal_status st)
{
    fprintf(stderr, "cnn_deploy: error: %s\n", qcal_last_error()[0] ? qcal_last_error() : qcal_status_str(st));
    return 1;
}

/* images [n,784] raw pixels -> dst [n,784] normalised as cnn.c does */
static void normalise(const uint8_t *images, int64_t n, float *dst)
{
    for (int64_t i = 0; i < n * CNN_IMAGE_PIXELS; i++)
        dst[i] = ((float)images[i] / 255.0f - 0.2860f) / 0.3530f;
}

static qcal_status write_images(const char *dir, const char *name, const uint8_t *images, int64_t n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    float *x = ex_malloc((size_t)(n * CNN_IMAGE_PIXELS) * sizeof(float));
    if (!x)
        return QCAL_ERR_NO_MEMORY;
    normalise(images, n, x);
    const int64_t shape[4] = {n, 1, 28, 28};
    qcal_status st = qcal_npy_write(path, QCAL_NPY_F32, 4, shape, x);
    free(x);
    return st;
}

static int cmd_export(const char *dir, int64_t n_calib, int64_t n_test, const char *weights, const char *data,
                      const cnn_train_opts *topt)
{
    cnn_data train = {0}, test = {0};
    cnn_ctx *ctx = NULL;
    cnn_model *m = NULL;
    qcal_onnx_model *om = NULL;
    float *logits = NULL;
    char path[4200];
    qcal_status st;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cnn_deploy: error: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    if ((st = cnn_data_load(data, "train", &train)) != QCAL_OK || (st = cnn_data_load(data, "t10k", &test)) != QCAL_OK ||
        (st = cnn_ctx_create(250, &ctx)) != QCAL_OK)
        goto done;
    if (weights) {
        st = cnn_model_load(weights, &m);
    } else {
        st = cnn_load_or_train(ctx, &train, topt, cnn_progress_stderr, NULL, &m, NULL);
    }
    if (st != QCAL_OK)
        goto done;
    n_calib = n_calib < train.n ? n_calib : train.n;
    test.n = n_test > 0 && n_test < test.n ? n_test : test.n;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((st = cnn_model_save(m, path)) != QCAL_OK || (st = cnn_onnx_build(m, &cnn_onnx_names_torch, &om)) != QCAL_OK)
        goto done;
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    if ((st = qcal_onnx_model_save_file(om, NULL, path)) != QCAL_OK ||
        (st = write_images(dir, "calib.npy", train.images, n_calib)) != QCAL_OK ||
        (st = write_images(dir, "test.npy", test.images, test.n)) != QCAL_OK)
        goto done;
    snprintf(path, sizeof path, "%s/labels.npy", dir);
    if ((st = qcal_npy_write(path, QCAL_NPY_U8, 1, &test.n, test.labels)) != QCAL_OK)
        goto done;
    /* qcal's f32 forward: the float reference the int8 results are compared with */
    if (!(logits = ex_malloc((size_t)(test.n * CNN_CLASSES) * sizeof(float)))) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    for (int64_t i0 = 0; i0 < test.n; i0 += 250) {
        int bn = (int)(test.n - i0 < 250 ? test.n - i0 : 250);
        const float *z;
        if ((st = cnn_forward(ctx, m, test.images + i0 * CNN_IMAGE_PIXELS, bn, NULL, &z)) != QCAL_OK)
            goto done;
        memcpy(logits + i0 * CNN_CLASSES, z, (size_t)bn * CNN_CLASSES * sizeof(float));
    }
    snprintf(path, sizeof path, "%s/float_logits.npy", dir);
    const int64_t lshape[2] = {test.n, CNN_CLASSES};
    st = qcal_npy_write(path, QCAL_NPY_F32, 2, lshape, logits);
    if (st == QCAL_OK)
        printf("cnn_deploy: wrote %s/{model.onnx, model.safetensors, calib.npy (%lld images), test.npy, labels.npy, "
               "float_logits.npy (%lld images)}\n", dir, (long long)n_calib, (long long)test.n);
done:
    free(logits);
    qcal_onnx_model_destroy(&om);
    cnn_model_destroy(&m);
    cnn_ctx_destroy(&ctx);
    cnn_data_free(&train);
    cnn_data_free(&test);
    return st == QCAL_OK ? 0 : fail(st);
}

static int cmd_int8(const char *dir, const char *table_path, const char *out, bool f32_logits)
{
    const cnn_onnx_names *nm = &cnn_onnx_names_torch;
    /* each layer's input, then the tensors before it whose qparams it keeps */
    const char *cand[4][3] = {{nm->input}, {nm->pool1, nm->relu1}, {nm->flatten, nm->pool2, nm->relu2}, {nm->relu3}};
    const char *in_name[4];
    cnn_model *m = NULL;
    qcal_calib_table *t = NULL;
    qcal_int8_net *net = NULL;
    qcal_npy_array x = {0};
    float *logits = NULL;
    char path[4200];
    qcal_status st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((st = cnn_model_load(path, &m)) != QCAL_OK || (st = qcal_calib_table_read_json(table_path, &t)) != QCAL_OK)
        goto done;
    snprintf(path, sizeof path, "%s/test.npy", dir);
    if ((st = qcal_npy_read_f32(path, &x)) != QCAL_OK)
        goto done;
    if (x.ndim != 4 || x.shape[1] != 1 || x.shape[2] != 28 || x.shape[3] != 28) {
        st = qcal_set_error(QCAL_ERR_MISMATCH, "%s: want [N,1,28,28] images", path);
        goto done;
    }
    for (int s = 0; s < 4; s++) {
        const qcal_calib_entry *e = NULL;
        in_name[s] = cand[s][0];
        for (int c = 0; c < 3 && cand[s][c]; c++)
            if (qcal_calib_table_find(t, cand[s][c], QCAL_CALIB_ROLE_ACTIVATION, &e) == QCAL_OK) {
                in_name[s] = cand[s][c];
                break;
            }
        qcal_clear_error();
    }
    /* conv1 relu pool | conv2 relu pool | flatten fc1 relu | fc2, as the ONNX graph */
    qcal_int8_layer_desc d[9];
    int nl = 0;
    for (int s = 0; s < 4; s++) {
        qcal_int8_layer_desc *l = &d[nl];
        if (s < 2) {
            qcal_int8_layer_desc_default(&l[0], QCAL_INT8_CONV2D);
            l[0].conv.out_channels = s == 0 ? 32 : 64;
            l[0].conv.kernel_h = l[0].conv.kernel_w = 3;
            l[0].conv.pad_h = l[0].conv.pad_w = 1;
            l[0].conv.weight = m->param[2 * s];
            l[0].conv.bias = m->param[2 * s + 1];
            qcal_int8_layer_desc_default(&l[1], QCAL_INT8_RELU);
            qcal_int8_layer_desc_default(&l[2], QCAL_INT8_MAXPOOL2D);
            nl += 3;
        } else {
            qcal_int8_layer_desc_default(&l[0], QCAL_INT8_LINEAR);
            l[0].linear.out_features = s == 2 ? 128 : CNN_CLASSES;
            l[0].linear.weight = m->param[2 * s];
            l[0].linear.bias = m->param[2 * s + 1];
            nl++;
            if (s == 2)
                qcal_int8_layer_desc_default(&d[nl++], QCAL_INT8_RELU);
        }
        l[0].fqn = in_name[s];
    }
    const qcal_calib_entry *e = NULL;
    const char *out_fqn = !f32_logits && qcal_calib_table_find(t, nm->logits, QCAL_CALIB_ROLE_ACTIVATION, &e) == QCAL_OK
                              ? nm->logits : NULL;
    const int64_t in_shape[3] = {1, 28, 28};
    if ((st = qcal_int8_net_from_table(NULL, t, 3, in_shape, nl, d, out_fqn, &net)) != QCAL_OK)
        goto done;
    if (!(logits = ex_malloc((size_t)(x.shape[0] * CNN_CLASSES) * sizeof(float)))) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    if ((st = qcal_int8_net_forward(net, x.shape[0], x.data, logits)) != QCAL_OK)
        goto done;
    const int64_t lshape[2] = {x.shape[0], CNN_CLASSES};
    if ((st = qcal_npy_write(out, QCAL_NPY_F32, 2, lshape, logits)) == QCAL_OK)
        printf("cnn_deploy: int8 (oneDNN) logits of %lld images -> %s (logits %s)\n", (long long)x.shape[0], out,
               out_fqn ? "u8 with the table's 'logits' qparams, dequantized" : "f32");
done:
    free(logits);
    qcal_npy_array_free(&x);
    qcal_int8_net_destroy(&net);
    qcal_calib_table_destroy(&t);
    cnn_model_destroy(&m);
    return st == QCAL_OK ? 0 : fail(st);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return usage(stderr, 2);
    const char *cmd = argv[1], *dir = argv[2];
    const char *weights = NULL, *data = cnn_data_dir(), *table = NULL, *out = NULL;
    int64_t n_calib = 1000, n_test = 0;
    cnn_train_opts topt = cnn_train_opts_default();
    bool f32_logits = false;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--f32-logits")) {
            f32_logits = true;
            continue;
        }
        if (!v)
            return usage(stderr, 2);
        if (!strcmp(a, "--calib-images"))
            n_calib = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--test-images"))
            n_test = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--train-images"))
            topt.max_images = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--epochs"))
            topt.epochs = atoi(v);
        else if (!strcmp(a, "--weights"))
            weights = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--table"))
            table = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else
            return usage(stderr, 2);
        i++;
    }
    if (!strcmp(cmd, "export") && n_calib > 0)
        return cmd_export(dir, n_calib, n_test, weights, data, &topt);
    if (!strcmp(cmd, "int8") && table && out)
        return cmd_int8(dir, table, out, f32_logits);
    return usage(stderr, 2);
}
