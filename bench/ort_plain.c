/* bench/ort_plain: the baseline of the model-calibration rows (bench/model_calib.py). Runs
 * an ONNX model in ONNX Runtime through qcal's engine exactly as `qcal calibrate MODEL.onnx
 * --data` does (opset 9-12 raised to 13, BatchNorm folded, the profile's tensors exposed in memory, graph
 * optimizations off, the same runs of the same samples) and discards the outputs: nothing
 * is observed. Public API only.
 *
 *   ort_plain MODEL.onnx DATA [--batch N] [--profile ort|tensorrt] [--carry OUT=IN]...
 *             [--plain [--level L]] [--stop-spinning]
 *
 * --plain: the model as given (nothing exposed, no upgrade or fold), graph optimization L
 * (default 99, 'all'), the model's own outputs: one float pass over the data, the baseline
 * of the accuracy rows (bench/accuracy.py). --stop-spinning: ONNX Runtime's threads stop
 * spin-waiting when Run returns (qcal_engine_session_options.stop_spinning, as calibrate's
 * session); without it, ONNX Runtime's default.
 *
 * Prints one line: runs, samples, output bytes of the largest run, seconds in Run. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <qcal/dataset.h>
#include <qcal/engine.h>
#include <qcal/onnx.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, qcal_status st)
{
    fprintf(stderr, "ort_plain: %s: %s\n", what, *qcal_last_error() ? qcal_last_error()
                                                                      : qcal_status_str(st));
    return 1;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *carry[16];
    int64_t batch = 0, ncarry = 0;
    int plain = 0, level = 99;
    bool stop_spinning = false;
    qcal_onnx_qdq_options q;
    qcal_onnx_qdq_options_default(&q);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            qcal_onnx_profile_parse(argv[++i], &q.profile);
        else if (!strcmp(argv[i], "--stop-spinning"))
            stop_spinning = true;
        else if (!strcmp(argv[i], "--plain"))
            plain = 1;
        else if (!strcmp(argv[i], "--level") && i + 1 < argc)
            level = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--carry") && i + 1 < argc && ncarry < 16)
            carry[ncarry++] = argv[++i];
        else if (!model)
            model = argv[i];
        else
            data = argv[i];
    }
    if (!model || !data) {
        fprintf(stderr, "usage: ort_plain MODEL.onnx DATA [--batch N] [--profile P] [--carry OUT=IN]\n");
        return 2;
    }
    qcal_onnx_model *m = NULL;
    qcal_status st = qcal_onnx_model_load_file(model, &m);
    if (st < 0)
        return fail(model, st);
    /* Opset 9-12 raised to 13 first, as `qcal calibrate` does (tools/cli_model.c's
     * cli_model_load: upgrade, then the BatchNorm fold), so that both sides run the same
     * upgraded model (PP-OCRv4 recognition is opset 9). */
    qcal_onnx_model_info info;
    if ((st = qcal_onnx_model_get_info(m, &info)) < 0)
        return fail("info", st);
    if (!plain && info.opset >= 0 && info.opset < 13 && (st = qcal_onnx_upgrade(m, 13, NULL)) < 0)
        return fail("upgrade", st);
    char **names = NULL;
    int64_t n_names = 0;
    if (!plain && ((st = qcal_onnx_fold_bn(m, NULL)) < 0 || (st = qcal_onnx_list(m, &q, &names, &n_names)) < 0 ||
                   (st = qcal_onnx_expose(m, &q, NULL)) < 0))
        return fail("expose", st);
    void *buf = NULL;
    size_t len = 0;
    if ((st = qcal_onnx_model_serialize(m, &buf, &len)) < 0)
        return fail("serialize", st);
    qcal_engine *e = NULL;
    qcal_engine_session *s = NULL;
    if ((st = qcal_engine_open(NULL, &e)) < 0)
        return fail("engine", st);
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.cpu_arena = true;   /* as qcal calibrate's session (engine/model_calib.c) */
    so.stop_spinning = stop_spinning;
    if (plain) {            /* as qcal compare's sessions (engine/accuracy.c) */
        so.cpu_arena = true;
        so.optimization = level;
    }
    if ((st = qcal_engine_session_create(e, buf, len, &so, &s)) < 0)
        return fail("session", st);
    qcal_free(buf);
    int64_t n_in = qcal_engine_session_input_count(s);
    qcal_engine_io *in = calloc((size_t)n_in + 1, sizeof *in);
    const char *optional[16];
    for (int64_t i = 0; i < n_in; i++)
        qcal_engine_session_input(s, i, &in[i]);
    for (int64_t k = 0; k < ncarry; k++)
        optional[k] = strchr(carry[k], '=') ? strchr(carry[k], '=') + 1 : carry[k];
    qcal_dataset_options dopt;
    qcal_dataset_options_default(&dopt);
    dopt.optional = optional;
    dopt.n_optional = ncarry;
    qcal_dataset *ds = NULL;
    if ((st = qcal_dataset_open(data, NULL, 0, in, n_in, &dopt, &ds)) < 0)
        return fail(data, st);
    /* The requested outputs: the exposed tensors, then carried outputs (as calibrate asks). */
    const char **req = calloc((size_t)(n_names + ncarry) + 1, sizeof *req);
    int64_t n_req = 0, carry_idx[16];
    for (int64_t i = 0; i < n_names; i++)
        req[n_req++] = names[i];
    char carry_out[16][256];
    for (int64_t k = 0; k < ncarry; k++) {
        snprintf(carry_out[k], sizeof carry_out[k], "%.*s",
                 (int)(strchr(carry[k], '=') - carry[k]), carry[k]);
        carry_idx[k] = -1;
        for (int64_t i = 0; i < n_req; i++)
            if (!strcmp(req[i], carry_out[k]))
                carry_idx[k] = i;
        if (carry_idx[k] < 0) {
            carry_idx[k] = n_req;
            req[n_req++] = carry_out[k];
        }
    }
    void *cbuf[16] = { 0 };
    qcal_engine_value cval[16];
    double t_run = 0;
    int64_t runs = 0, samples = 0, b = batch;
    uint64_t max_bytes = 0;
    for (int64_t f = 0; f < qcal_dataset_file_count(ds); f++) {
        qcal_dataset_file_info fi;
        qcal_dataset_file_get(ds, f, &fi);
        for (int64_t k = 0; k < ncarry; k++) {
            free(cbuf[k]);
            cbuf[k] = NULL;
        }
        for (int64_t s0 = 0; s0 < fi.samples;) {
            int64_t n = fi.splittable ? (b > 0 ? b : 1) : 1;
            if (n > fi.samples - s0)
                n = fi.samples - s0;
            qcal_dataset_batch *bt = NULL;
            if ((st = qcal_dataset_read(ds, f, s0, n, &bt)) < 0)
                return fail("read", st);
            qcal_engine_value *v = malloc((size_t)n_in * sizeof *v);
            memcpy(v, qcal_dataset_batch_values(bt), (size_t)n_in * sizeof *v);
            for (int64_t k = 0; k < ncarry; k++)
                for (int64_t i = 0; i < n_in; i++)
                    if (!strcmp(in[i].name, optional[k])) {
                        if (cbuf[k]) {
                            v[i] = cval[k];
                            v[i].name = in[i].name;
                        } else if (!v[i].data) {
                            size_t bytes = qcal_engine_elem_size(in[i].elem_type);
                            for (int32_t d = 0; d < in[i].ndim; d++)
                                bytes *= (size_t)in[i].dims[d];
                            cbuf[k] = calloc(1, bytes ? bytes : 1);
                            v[i].data = cbuf[k];
                            v[i].nbytes = bytes;
                            v[i].ndim = in[i].ndim;
                            memcpy(v[i].dims, in[i].dims, sizeof v[i].dims);
                        }
                    }
            qcal_engine_outputs *o = NULL;
            double t0 = now_s();
            st = qcal_engine_session_run(s, v, n_in, n_req ? req : NULL, n_req, &o);
            t_run += now_s() - t0;
            free(v);
            if (st < 0)
                return fail("run", st);
            uint64_t bytes = 0;
            for (int64_t i = 0; i < n_names; i++) {
                qcal_engine_value ov;
                qcal_engine_outputs_at(o, i, &ov);
                bytes += ov.nbytes;
            }
            for (int64_t k = 0; k < ncarry; k++) {
                qcal_engine_value ov;
                qcal_engine_outputs_at(o, carry_idx[k], &ov);
                void *nb = malloc(ov.nbytes ? ov.nbytes : 1);
                memcpy(nb, ov.data, ov.nbytes);
                free(cbuf[k]);
                cbuf[k] = nb;
                cval[k] = ov;
                cval[k].data = nb;
            }
            if (bytes > max_bytes)
                max_bytes = bytes;
            /* calibrate's automatic batch: 512 MiB of exposed outputs per run */
            if (fi.splittable && b <= 0) {
                uint64_t per = bytes / (uint64_t)n;
                b = per ? (int64_t)(((uint64_t)512 << 20) / per) : 1 << 30;
                if (b < 1)
                    b = 1;
            }
            qcal_engine_outputs_free(&o);
            qcal_dataset_batch_free(&bt);
            runs++;
            samples += n;
            s0 += n;
        }
    }
    printf("ort_plain: %lld runs, %lld samples, %llu bytes largest run, %.3f s in Run\n",
           (long long)runs, (long long)samples, (unsigned long long)max_bytes, t_run);
    for (int64_t k = 0; k < ncarry; k++)
        free(cbuf[k]);
    free(req);
    free(in);
    qcal_dataset_close(&ds);
    qcal_engine_session_destroy(&s);
    qcal_engine_close(&e);
    qcal_onnx_names_free(&names, n_names);
    qcal_onnx_model_destroy(&m);
    return 0;
}
