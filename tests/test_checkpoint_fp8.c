/* Tests of the FP8 serving checkpoints (calib/checkpoint_fp8.c) and the any-dtype
 * safetensors header (io/safetensors.c): every tensor's dtype, shape and bytes, the scales
 * (amax / 448 of the observers' ranges), fused-shard max, per-channel scales, KV scales,
 * sharded models with their index, and the refusals (nothing written on failure). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/calib.h"
#include "qcal/fp8_checkpoint.h"
#include "qcal/quantize.h"
#include "qcal/safetensors.h"
#include "testutil.h"

typedef struct fixture {
    char dir[64];
    char model[128], model2[128], out[128];
    qcal_calib_table *table;
} fixture;

/* Weights (F32): a.q_proj (4x3), a.k_proj (2x3), a.v_proj (2x3), a.o_proj (3x4),
 * head.weight (5x3: no input in the dump), norm.weight (3). */
static float wq[12], wk[6], wv[6], wo[12], wh[15], wn[3];

static void fill(float *w, int n, float s)
{
    for (int i = 0; i < n; i++)
        w[i] = s * (float)((i * 7) % 11 - 5) / (1.0f + (float)i);
}

/* part 0: every tensor; 1: the first three (q, k, v); 2: the last three. */
static void write_model(const char *path, int part)
{
    fill(wq, 12, 0.3f);
    fill(wk, 6, 0.7f);
    fill(wv, 6, 1.1f);
    fill(wo, 12, 0.05f);
    fill(wh, 15, 2.0f);
    fill(wn, 3, 1.0f);
    qcal_tensor t[6];
    int64_t s_q[2] = { 4, 3 }, s_kv[2] = { 2, 3 }, s_o[2] = { 3, 4 }, s_h[2] = { 5, 3 },
            s_n[1] = { 3 };
    qcal_tensor_init(&t[0], wq, 2, s_q);
    qcal_tensor_init(&t[1], wk, 2, s_kv);
    qcal_tensor_init(&t[2], wv, 2, s_kv);
    qcal_tensor_init(&t[3], wo, 2, s_o);
    qcal_tensor_init(&t[4], wh, 2, s_h);
    qcal_tensor_init(&t[5], wn, 1, s_n);
    const char *names[6] = { "a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight",
                             "a.o_proj.weight", "head.weight", "norm.weight" };
    int first = part == 2 ? 3 : 0, n = part == 0 ? 6 : 3;
    assert_int_equal(qcal_safetensors_write_f32(path, n, names + first, t + first, 0, NULL),
                     QCAL_OK);
}

static void observe(qcal_calib_session *s, const char *name, float lo, float hi)
{
    float x[4] = { lo, hi, 0.5f * lo, 0.25f * hi };
    int64_t n = 4;
    qcal_tensor t;
    qcal_tensor_init(&t, x, 1, &n);
    assert_true(qcal_calib_session_observe(s, name, QCAL_CALIB_ROLE_ACTIVATION, 0, &t) >= 0);
}

/* A table with min/max activations: q/k/v inputs of different ranges, o's input, k/v outputs. */
static qcal_calib_table *make_table(bool with_v_output)
{
    qcal_calib_rules *rules = NULL;
    assert_int_equal(qcal_calib_rules_create(&rules), QCAL_OK);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    assert_int_equal(qcal_calib_rules_add(rules, "*", false, QCAL_CALIB_ROLE_ACTIVATION, &cfg),
                     QCAL_OK);
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_calib_session *s = NULL;
    assert_int_equal(qcal_calib_session_create(&so, &s), QCAL_OK);
    observe(s, "a.q_proj.input", -2.0f, 1.0f);     /* amax 2 */
    observe(s, "a.k_proj.input", -1.0f, 4.48f);    /* amax 4.48 */
    observe(s, "a.v_proj.input", -3.0f, 0.5f);     /* amax 3 */
    observe(s, "a.o_proj.input", -0.5f, 8.96f);    /* amax 8.96 */
    observe(s, "a.k_proj.output", -44.8f, 1.0f);   /* amax 44.8 */
    if (with_v_output)
        observe(s, "a.v_proj.output", -1.0f, 0.448f);
    observe(s, "nothing.input", -1.0f, 1.0f);       /* no such weight: counted */
    qcal_calib_table *t = NULL;
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    qcal_calib_session_destroy(&s);
    qcal_calib_rules_destroy(&rules);
    return t;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/qcal_ckpt_XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->model, sizeof f->model, "%s/model.safetensors", f->dir);
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    write_model(f->model, 0);
    f->table = make_table(true);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    qcal_calib_table_destroy(&f->table);
    tu_rm_tree(f->dir);
    free(f);
    return 0;
}

static const void *tensor(qcal_safetensors *st, const char *name, const char *dtype,
                          int32_t ndim, const int64_t *shape)
{
    int64_t i;
    if (qcal_safetensors_find(st, name, &i) != QCAL_OK)
        fail_msg("no tensor '%s'", name);
    qcal_safetensors_tensor_info info;
    assert_int_equal(qcal_safetensors_info(st, i, &info), QCAL_OK);
    if (strcmp(info.dtype_name, dtype))
        fail_msg("'%s' is %s, want %s", name, info.dtype_name, dtype);
    assert_int_equal(info.ndim, ndim);
    for (int32_t k = 0; k < ndim; k++)
        assert_int_equal(info.shape[k], shape[k]);
    const void *b = NULL;
    assert_int_equal(qcal_safetensors_bytes(st, i, &b), QCAL_OK);
    return b;
}

static float scalar(qcal_safetensors *st, const char *name, int32_t ndim)
{
    static const int64_t one[1] = { 1 };
    float v;
    memcpy(&v, tensor(st, name, "F32", ndim, one), 4);
    return v;
}

/* The weight's codes equal qcal_quantize with the written scale(s). */
static void check_codes(qcal_safetensors *st, const char *name, const float *w, int64_t rows,
                        int64_t cols, const float *scales, int64_t nscales)
{
    int64_t shape[2] = { rows, cols };
    const uint8_t *codes = tensor(st, name, "F8_E4M3", 2, shape);
    qcal_tensor x;
    qcal_tensor_init(&x, w, 2, shape);
    qcal_qparams qp;
    if (nscales == 1)
        assert_int_equal(qcal_qparams_per_tensor(&qp, QCAL_FLOAT8_E4M3FN, scales[0], 0), QCAL_OK);
    else
        assert_int_equal(qcal_qparams_per_channel(&qp, QCAL_FLOAT8_E4M3FN, 0, nscales, scales,
                                                  NULL), QCAL_OK);
    uint8_t want[64];
    assert_int_equal(qcal_quantize(&x, &qp, want), QCAL_OK);
    assert_memory_equal(codes, want, (size_t)(rows * cols));
}

static float amax_of(const float *w, int n)
{
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        m = fabsf(w[i]) > m ? fabsf(w[i]) : m;
    return m;
}

static void test_compressed_tensors(void **state)
{
    fixture *f = *state;
    qcal_fp8_checkpoint_options o;
    qcal_fp8_checkpoint_options_default(&o);
    qcal_fp8_checkpoint_summary sum;
    const char *models[1] = { f->model };
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, &sum), QCAL_OK);
    assert_int_equal(sum.quantized, 4);
    assert_int_equal(sum.kv_scales, 1);
    assert_int_equal(sum.copied, 2);
    assert_int_equal(sum.ignored, 1);
    assert_int_equal(sum.unmatched_inputs, 1);
    assert_int_equal(sum.files, 2);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", f->out);
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    int64_t n = 0;
    qcal_safetensors_count(st, &n);
    assert_int_equal(n, 6 + 4 * 2 + 2);
    /* input scales: amax / 448, each shard its own */
    assert_true(scalar(st, "a.q_proj.input_scale", 1) == 2.0f / 448.0f);
    assert_true(scalar(st, "a.k_proj.input_scale", 1) == 4.48f / 448.0f);
    assert_true(scalar(st, "a.v_proj.input_scale", 1) == 3.0f / 448.0f);
    assert_true(scalar(st, "a.o_proj.input_scale", 1) == 8.96f / 448.0f);
    assert_true(scalar(st, "a.k_scale", 1) == 44.8f / 448.0f);
    assert_true(scalar(st, "a.v_scale", 1) == 1.0f / 448.0f);
    /* weights: per tensor, the weight's max |w| / 448 (per_channel_minmax default absent:
     * the table has no weight entries, so the weight's own values) */
    float sq = scalar(st, "a.q_proj.weight_scale", 1);
    assert_true(sq == amax_of(wq, 12) / 448.0f);
    check_codes(st, "a.q_proj.weight", wq, 4, 3, &sq, 1);
    float so = scalar(st, "a.o_proj.weight_scale", 1);
    check_codes(st, "a.o_proj.weight", wo, 3, 4, &so, 1);
    /* copied tensors: same bytes */
    int64_t sh[2] = { 5, 3 }, sn[1] = { 3 };
    assert_memory_equal(tensor(st, "head.weight", "F32", 2, sh), wh, sizeof wh);
    assert_memory_equal(tensor(st, "norm.weight", "F32", 1, sn), wn, sizeof wn);
    qcal_safetensors_close(&st);
    /* config.json: only quantization_config (no model config given) */
    snprintf(path, sizeof path, "%s/config.json", f->out);
    char text[4096];
    tu_slurp(path, text, sizeof text);
    assert_non_null(strstr(text, "\"quant_method\": \"compressed-tensors\""));
    assert_non_null(strstr(text, "\"format\": \"float-quantized\""));
    assert_non_null(strstr(text, "\"ignore\": [\"head\"]"));
    assert_non_null(strstr(text, "\"kv_cache_scheme\": {\"dynamic\": false"));
    assert_non_null(strstr(text, "\"strategy\": \"tensor\"}\n      }"));
}

static void test_modelopt_channel_fused(void **state)
{
    fixture *f = *state;
    qcal_fp8_checkpoint_options o;
    qcal_fp8_checkpoint_options_default(&o);
    o.format = QCAL_FP8_CHECKPOINT_MODELOPT;
    o.weight_per_channel = true;
    const char *models[1] = { f->model };
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, NULL),
                     QCAL_ERR_UNSUPPORTED);
    o.weight_per_channel = false;
    o.fused_input_scale_max = true;
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", f->dir);
    tu_write_bytes(cfg, "{\"model_type\": \"llama\"}\n", 24);
    o.config_json = cfg;
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, NULL), QCAL_OK);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", f->out);
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    /* q/k/v share the max (4.48 / 448); o keeps its own; scalars are 0-d */
    assert_true(scalar(st, "a.q_proj.input_scale", 0) == 4.48f / 448.0f);
    assert_true(scalar(st, "a.k_proj.input_scale", 0) == 4.48f / 448.0f);
    assert_true(scalar(st, "a.v_proj.input_scale", 0) == 4.48f / 448.0f);
    assert_true(scalar(st, "a.o_proj.input_scale", 0) == 8.96f / 448.0f);
    assert_true(scalar(st, "a.k_scale", 0) == 44.8f / 448.0f);
    qcal_safetensors_close(&st);
    snprintf(path, sizeof path, "%s/hf_quant_config.json", f->out);
    char text[2048];
    tu_slurp(path, text, sizeof text);
    assert_non_null(strstr(text, "\"quant_algo\": \"FP8\""));
    /* vLLM reads the file as ModelOpt's only with producer.name "modelopt" */
    assert_non_null(strstr(text, "\"producer\": {\"name\": \"modelopt\", \"version\": \""));
    assert_non_null(strstr(text, "\"quantized_by\": {\"name\": \"qcal\""));
    assert_non_null(strstr(text, "\"kv_cache_quant_algo\": \"FP8\""));
    assert_non_null(strstr(text, "\"exclude_modules\": [\"head\"]"));
    snprintf(path, sizeof path, "%s/config.json", f->out);
    tu_slurp(path, text, sizeof text);
    assert_string_equal(text, "{\"model_type\": \"llama\"}\n");
    /* compressed-tensors extends the model config, per-channel scales (out, 1) */
    o.format = QCAL_FP8_CHECKPOINT_COMPRESSED_TENSORS;
    o.weight_per_channel = true;
    o.fused_input_scale_max = false;
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, NULL), QCAL_OK);
    tu_slurp(path, text, sizeof text);
    assert_non_null(strstr(text, "{\"model_type\": \"llama\",\n  \"quantization_config\": {"));
    assert_non_null(strstr(text, "\"strategy\": \"channel\"}"));
    snprintf(path, sizeof path, "%s/model.safetensors", f->out);
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    int64_t shape[2] = { 4, 1 };
    float sc[4];
    memcpy(sc, tensor(st, "a.q_proj.weight_scale", "F32", 2, shape), sizeof sc);
    for (int r = 0; r < 4; r++)
        assert_true(sc[r] == fmaxf(amax_of(wq + 3 * r, 3) / 448.0f, FLT_EPSILON));
    check_codes(st, "a.q_proj.weight", wq, 4, 3, sc, 4);
    qcal_safetensors_close(&st);
    /* a config that is quantized already: refused, the checkpoint as it was */
    size_t before_len = 0, after_len = 0;
    char *before = tu_read_file(path, &before_len);
    tu_write_bytes(cfg, "{\"quantization_config\": {}}", 27);
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, NULL),
                     QCAL_ERR_FORMAT);
    char *after = tu_read_file(path, &after_len);
    assert_int_equal(before_len, after_len);
    assert_memory_equal(before, after, before_len);
    free(before);
    free(after);
    assert_int_equal(tu_count_entries(f->out, ".tmp"), 0);
}

static void test_shards_and_index(void **state)
{
    fixture *f = *state;
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/model-00001-of-00002.safetensors", f->dir);
    snprintf(b, sizeof b, "%s/model-00002-of-00002.safetensors", f->dir);
    write_model(a, 1);
    write_model(b, 2);
    qcal_fp8_checkpoint_options o;
    qcal_fp8_checkpoint_options_default(&o);
    const char *models[2] = { a, b };
    qcal_fp8_checkpoint_summary sum;
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 2, models, f->table, &o, &sum), QCAL_OK);
    assert_int_equal(sum.files, 4);
    char path[256], text[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", f->out);
    tu_slurp(path, text, sizeof text);
    assert_non_null(strstr(text, "\"a.k_scale\": \"model-00001-of-00002.safetensors\""));
    assert_non_null(strstr(text, "\"a.o_proj.input_scale\": \"model-00002-of-00002.safetensors\""));
    /* total_size: FP8 weights 36 bytes, 8 scales and 2 KV scales of 4, head 60, norm 12 */
    assert_non_null(strstr(text, "\"total_size\": 148}"));
    /* the same base name twice is refused */
    const char *twice[2] = { a, a };
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 2, twice, f->table, &o, NULL),
                     QCAL_ERR_INVALID_ARG);
}

static void test_refusals(void **state)
{
    fixture *f = *state;
    qcal_fp8_checkpoint_options o;
    qcal_fp8_checkpoint_options_default(&o);
    const char *models[1] = { f->model };
    /* k_proj output without v_proj output */
    qcal_calib_table *t = make_table(false);
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, t, &o, NULL),
                     QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "a.v_proj.output"));
    qcal_calib_table_destroy(&t);
    struct stat sb;
    assert_int_not_equal(stat(f->out, &sb), 0);   /* the directory it made is gone */
    /* E5M2 */
    o.dtype = QCAL_FLOAT8_E5M2;
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, f->table, &o, NULL),
                     QCAL_ERR_UNSUPPORTED);
    o.dtype = QCAL_FLOAT8_E4M3FN;
    /* the model inside the output directory */
    assert_int_equal(qcal_fp8_checkpoint_write(f->dir, 1, models, f->table, &o, NULL),
                     QCAL_ERR_INVALID_ARG);
    /* a table whose inputs match no weight */
    qcal_calib_session *s = NULL;
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    assert_int_equal(qcal_calib_session_create(&so, &s), QCAL_OK);
    observe(s, "other.input", -1.0f, 1.0f);
    assert_int_equal(qcal_calib_session_table(s, &t), QCAL_OK);
    assert_int_equal(qcal_fp8_checkpoint_write(f->out, 1, models, t, &o, NULL), QCAL_ERR_EMPTY);
    qcal_calib_table_destroy(&t);
    qcal_calib_session_destroy(&s);
    /* output path that is a file */
    char file[256];
    snprintf(file, sizeof file, "%s/afile", f->dir);
    tu_write_bytes(file, "x", 1);
    assert_int_equal(qcal_fp8_checkpoint_write(file, 1, models, f->table, &o, NULL), QCAL_ERR_IO);
}

static void test_header_any_dtype(void **state)
{
    fixture *f = *state;
    qcal_safetensors_desc d[3] = {
        { "w", "F8_E4M3", 2, { 2, 3 } }, { "s", "F32", 0, { 0 } }, { "e", "F8_E5M2", 1, { 4 } },
    };
    void *h = NULL;
    size_t len = 0;
    int64_t data = 0;
    const char *meta[2] = { "format", "pt" };
    assert_int_equal(qcal_safetensors_header(3, d, 1, meta, &h, &len, &data), QCAL_OK);
    assert_int_equal(data, 6 + 4 + 4);
    assert_int_equal((len - 8) % 8, 0);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F8_E4M3\","
                       "\"shape\":[2,3],\"data_offsets\":[0,6]},\"s\":{\"dtype\":\"F32\","
                       "\"shape\":[],\"data_offsets\":[6,10]},\"e\":{\"dtype\":\"F8_E5M2\","
                       "\"shape\":[4],\"data_offsets\":[10,14]}}";
    assert_memory_equal((char *)h + 8, want, strlen(want));
    /* the reader accepts it */
    char path[256];
    snprintf(path, sizeof path, "%s/h.safetensors", f->dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint8_t bytes[14] = { 0x38, 0xB8, 0x7E, 0, 0x80, 1, 0, 0, 0x80, 0x3F, 0x3C, 0x7C, 0xFC, 0x7F };
    assert_int_equal(fwrite(h, 1, len, fp), len);
    assert_int_equal(fwrite(bytes, 1, 14, fp), 14);
    fclose(fp);
    free(h);
    qcal_safetensors *st = NULL;
    assert_int_equal(qcal_safetensors_open(path, &st), QCAL_OK);
    int64_t s23[2] = { 2, 3 };
    assert_memory_equal(tensor(st, "w", "F8_E4M3", 2, s23), bytes, 6);
    qcal_safetensors_close(&st);
    /* refusals */
    d[1].dtype = "F7";
    assert_int_equal(qcal_safetensors_header(3, d, 0, NULL, &h, &len, &data), QCAL_ERR_INVALID_ARG);
    d[1].dtype = "F32";
    d[2].name = "w";
    assert_int_equal(qcal_safetensors_header(3, d, 0, NULL, &h, &len, &data), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_safetensors_dtype_size("F8_E4M3"), 1);
    assert_int_equal(qcal_safetensors_dtype_size("BF16"), 2);
    assert_int_equal(qcal_safetensors_dtype_size("nope"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_any_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compressed_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_modelopt_channel_fused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shards_and_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
