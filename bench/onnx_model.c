/* bench/onnx_model: writes the synthetic ONNX model of the ONNX bench rows (bench/onnx_qdq.py)
 * with the builder of qcal/onnx.h, and a native table that covers every tensor both
 * profiles quantize (so `qcal qdq` finds them all).
 *
 *   onnx_model OUT.onnx TABLE.json [MIB [external]]     (MIB default 1024)
 * "external": the weights go to OUT.onnx.data (external data) instead.
 *
 * Model (opset 17): a MatMul chain x [1, 4096] -> (MatMul [4096, 4096] -> Relu) x L, the
 * weights 64 MiB each, and a Conv chain y [1, 512, 8, 8] -> (Conv [512, 512, 3, 3], bias,
 * pads 1 -> Relu) x 7; L fills the model to MIB MiB. Weights: fixed-seed uniform values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qcal/qcal.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = ((float)(rng >> 40) / (float)(1 << 24) - 0.5f) * scale;
    }
}

#define CHECK(x)                                                                   \
    do {                                                                           \
        qcal_status st_ = (x);                                                     \
        if (st_ != QCAL_OK) {                                                      \
            fprintf(stderr, "onnx_model: %s: %s\n", #x, qcal_last_error());       \
            return 1;                                                              \
        }                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: onnx_model OUT.onnx TABLE.json [MIB [external]]\n");
        return 2;
    }
    long mib = argc > 3 ? atol(argv[3]) : 1024;
    const int64_t K = 4096, C = 512, NCONV = 7;
    size_t conv_bytes = (size_t)(C * C * 9 + C) * 4 * NCONV;
    long layers = (long)(((size_t)mib << 20) - conv_bytes) / (long)(K * K * 4);
    if (layers < 1)
        layers = 1;
    qcal_onnx_model *m = NULL;
    CHECK(qcal_onnx_model_create(8, 17, &m));
    CHECK(qcal_onnx_model_add_input(m, "x", QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, K }));
    CHECK(qcal_onnx_model_add_input(m, "y", QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, C, 8, 8 }));
    float *w = malloc((size_t)(K * K) * sizeof *w);
    if (!w)
        return 1;
    char prev[64] = "x", name[64], out[64], wn[64];
    for (long l = 0; l < layers; l++) {
        snprintf(wn, sizeof wn, "mm%ld.weight", l);
        fill(w, (size_t)(K * K), 0.05f);
        CHECK(qcal_onnx_model_add_initializer_float(m, wn, 2, (int64_t[]){ K, K }, w));
        snprintf(name, sizeof name, "/mm%ld/MatMul", l);
        snprintf(out, sizeof out, "/mm%ld/MatMul_output_0", l);
        CHECK(qcal_onnx_model_add_node(m, "MatMul", name, 2, (const char *[]){ prev, wn }, 1,
                                       (const char *[]){ out }, NULL));
        snprintf(name, sizeof name, "/relu%ld/Relu", l);
        snprintf(prev, sizeof prev, "/relu%ld/Relu_output_0", l);
        CHECK(qcal_onnx_model_add_node(m, "Relu", name, 1, (const char *[]){ out }, 1,
                                       (const char *[]){ prev }, NULL));
    }
    CHECK(qcal_onnx_model_add_output(m, prev, QCAL_ONNX_FLOAT, 2, (int64_t[]){ 1, K }));
    snprintf(prev, sizeof prev, "y");
    for (int64_t l = 0; l < NCONV; l++) {
        char bn[64];
        snprintf(wn, sizeof wn, "conv%lld.weight", (long long)l);
        snprintf(bn, sizeof bn, "conv%lld.bias", (long long)l);
        fill(w, (size_t)(C * C * 9), 0.05f);
        CHECK(qcal_onnx_model_add_initializer_float(m, wn, 4, (int64_t[]){ C, C, 3, 3 }, w));
        fill(w, (size_t)C, 0.1f);
        CHECK(qcal_onnx_model_add_initializer_float(m, bn, 1, (int64_t[]){ C }, w));
        snprintf(name, sizeof name, "/conv%lld/Conv", (long long)l);
        snprintf(out, sizeof out, "/conv%lld/Conv_output_0", (long long)l);
        int64_t k;
        CHECK(qcal_onnx_model_add_node(m, "Conv", name, 3, (const char *[]){ prev, wn, bn }, 1,
                                       (const char *[]){ out }, &k));
        CHECK(qcal_onnx_node_set_ints(m, k, "pads", 4, (int64_t[]){ 1, 1, 1, 1 }));
        snprintf(name, sizeof name, "/crelu%lld/Relu", (long long)l);
        snprintf(prev, sizeof prev, "/crelu%lld/Relu_output_0", (long long)l);
        CHECK(qcal_onnx_model_add_node(m, "Relu", name, 1, (const char *[]){ out }, 1,
                                       (const char *[]){ prev }, NULL));
    }
    CHECK(qcal_onnx_model_add_output(m, prev, QCAL_ONNX_FLOAT, 4, (int64_t[]){ 1, C, 8, 8 }));
    free(w);
    /* The table: every name either profile looks up, range [-1, 4]. */
    qcal_calib_session *s = NULL;
    CHECK(qcal_calib_session_create(NULL, &s));
    for (int p = 0; p < 2; p++) {
        qcal_onnx_qdq_options opt;
        qcal_onnx_qdq_options_default(&opt);
        opt.profile = p ? QCAL_ONNX_PROFILE_TENSORRT : QCAL_ONNX_PROFILE_ORT;
        char **names = NULL;
        int64_t n = 0;
        CHECK(qcal_onnx_list(m, &opt, &names, &n));
        for (int64_t i = 0; i < n; i++) {
            float v[2] = { -1.0f, 4.0f };
            qcal_tensor t;
            CHECK(qcal_tensor_init(&t, v, 1, (int64_t[]){ 2 }));
            uint64_t batches = 0;
            if (qcal_calib_session_stats(s, names[i], QCAL_CALIB_ROLE_ACTIVATION, &batches, NULL, NULL,
                                         NULL) != QCAL_OK)
                CHECK(qcal_calib_session_observe(s, names[i], QCAL_CALIB_ROLE_ACTIVATION, 0, &t));
        }
        qcal_onnx_names_free(&names, n);
    }
    qcal_calib_table *t = NULL;
    CHECK(qcal_calib_session_table(s, &t));
    CHECK(qcal_calib_table_write(t, QCAL_CALIB_FORMAT_JSON, NULL, argv[2]));
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&s);
    qcal_onnx_save_options so;
    qcal_onnx_save_options_default(&so);
    if (argc > 4 && !strcmp(argv[4], "external"))
        so.external_threshold = 0;
    CHECK(qcal_onnx_model_save_file(m, &so, argv[1]));
    qcal_onnx_model_destroy(&m);
    printf("onnx_model: wrote %s (%ld MatMul layers, %lld Conv layers) and %s\n", argv[1], layers,
           (long long)NCONV, argv[2]);
    return 0;
}
