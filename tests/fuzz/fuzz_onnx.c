/* libFuzzer target: the ONNX model reader (qcal_onnx_model_parse) and the passes that run on
 * what it accepts: list and expose in both profiles, Q/DQ insertion in both profiles with a
 * table that holds every listed tensor, BatchNorm folding + equalization + analytic bias
 * correction (qcal_onnx_equalize), and a serialize -> parse round trip of each result.
 * Contracts: a failure leaves *out untouched and carries a message; whatever the reader
 * accepts, the passes either succeed or fail cleanly, and what they write reads back. */
#include "tests/fuzz/fuzz_common.h"

#include <stdlib.h>

#include "qcal/onnx.h"

static void round_trip(const qcal_onnx_model *m)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_onnx_model_serialize(m, &buf, &len);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        return;
    }
    qcal_onnx_model *r = (qcal_onnx_model *)(uintptr_t)0x1;
    st = qcal_onnx_model_parse(buf, len, &r);
    /* What qcal wrote must read back (an empty model serializes to 0 bytes: refused). */
    FUZZ_CHECK(st == QCAL_OK || len == 0);
    if (st == QCAL_OK)
        qcal_onnx_model_destroy(&r);
    qcal_free(buf);
}

static void passes(const uint8_t *data, size_t size, qcal_onnx_profile profile)
{
    qcal_onnx_model *m = NULL;
    if (qcal_onnx_model_parse(data, size, &m) != QCAL_OK)
        return;
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.profile = profile;
    char **names = NULL;
    int64_t n = 0;
    qcal_status st = qcal_onnx_list(m, &opt, &names, &n);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        qcal_onnx_model_destroy(&m);
        return;
    }
    /* A minmax session: the default histogram observer's qparams search took ~70% of each
     * execution (20-50 ms for an 800-byte model) and is fuzzed elsewhere; what matters here
     * is that every listed tensor has an entry. */
    qcal_calib_rules *rules = NULL;
    qcal_calib_session *s = NULL;
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    if (qcal_calib_rules_create(&rules) == QCAL_OK &&
        qcal_calib_rules_add(rules, "*", true, QCAL_CALIB_ROLE_ACTIVATION, &cfg) == QCAL_OK) {
        qcal_calib_session_options so;
        qcal_calib_session_options_default(&so);
        so.rules = rules;
        if (qcal_calib_session_create(&so, &s) != QCAL_OK)
            s = NULL;
    }
    qcal_calib_rules_destroy(&rules);
    if (s) {
        for (int64_t i = 0; i < n; i++) {
            float x[3] = { -1.0f, 0.5f, 2.0f + (float)i };
            int64_t shape[1] = { 3 };
            qcal_tensor t;
            if (qcal_tensor_init(&t, x, 1, shape) == QCAL_OK)
                qcal_calib_session_observe(s, names[i], QCAL_CALIB_ROLE_ACTIVATION, 0, &t);
        }
    }
    qcal_onnx_names_free(&names, n);
    /* expose on a copy */
    qcal_onnx_model *e = NULL;
    void *buf = NULL;
    size_t len = 0;
    if (qcal_onnx_model_serialize(m, &buf, &len) == QCAL_OK && qcal_onnx_model_parse(buf, len, &e) == QCAL_OK) {
        int64_t added = -1;
        st = qcal_onnx_expose(e, &opt, &added);
        if (st == QCAL_OK) {
            FUZZ_CHECK(added >= 0 && added <= n);
            round_trip(e);
        } else {
            fuzz_check_failure(st);
        }
        qcal_onnx_model_destroy(&e);
    }
    qcal_free(buf);
    /* BatchNorm folding, equalization and analytic bias correction on another copy (profile
     * ort only: the pass has no profile) */
    buf = NULL;
    if (profile == QCAL_ONNX_PROFILE_ORT && qcal_onnx_model_serialize(m, &buf, &len) == QCAL_OK &&
        qcal_onnx_model_parse(buf, len, &e) == QCAL_OK) {
        qcal_onnx_equalize_options eo;
        qcal_onnx_equalize_options_default(&eo);
        eo.analytic_bias_correction = true;
        eo.max_sweeps = 4;
        qcal_onnx_equalize_report er;
        st = qcal_onnx_equalize(e, &eo, &er);
        if (st == QCAL_OK) {
            FUZZ_CHECK(er.n_pairs >= 0 && er.n_refused >= 0 && er.sweeps <= 4);
            qcal_onnx_equalize_report_free(&er);
            round_trip(e);
        } else {
            fuzz_check_failure(st);
        }
        qcal_onnx_model_destroy(&e);
    }
    qcal_free(buf);
    /* qdq and save in one call (the weights observed beside the save) on a copy, written
     * to /dev/null */
    buf = NULL;
    qcal_calib_table *table = NULL;
    if (s && qcal_calib_session_table(s, &table) == QCAL_OK && qcal_onnx_model_serialize(m, &buf, &len) == QCAL_OK &&
        qcal_onnx_model_parse(buf, len, &e) == QCAL_OK) {
        qcal_onnx_qdq_report rep;
        st = qcal_onnx_qdq_save_file(e, table, &opt, NULL, "/dev/null", &rep);
        if (st == QCAL_OK)
            qcal_onnx_qdq_report_free(&rep);
        else
            fuzz_check_failure(st);
        qcal_onnx_model_destroy(&e);
    }
    qcal_calib_table_destroy(&table);
    qcal_free(buf);
    if (s) {
        qcal_onnx_qdq_report rep;
        st = qcal_onnx_qdq_session(m, s, &opt, &rep);
        if (st == QCAL_OK) {
            FUZZ_CHECK(rep.n_missing == 0);
            qcal_onnx_qdq_report_free(&rep);
            round_trip(m);
        } else {
            fuzz_check_failure(st);
        }
        qcal_calib_session_destroy(&s);
    }
    qcal_onnx_model_destroy(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qcal_onnx_model *m = (qcal_onnx_model *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status st = qcal_onnx_model_parse(data, size, &m);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(m == (qcal_onnx_model *)(uintptr_t)0x1);
        return 0;
    }
    qcal_onnx_model_info info;
    FUZZ_CHECK(qcal_onnx_model_get_info(m, &info) == QCAL_OK);
    for (int64_t i = 0; i < info.nodes; i++) {
        qcal_onnx_node_info ni;
        FUZZ_CHECK(qcal_onnx_node_at(m, i, &ni) == QCAL_OK);
        for (int64_t k = 0; k < ni.n_inputs; k++)
            fuzz_touch(ni.inputs[k], strlen(ni.inputs[k]));
    }
    round_trip(m);
    qcal_onnx_model_destroy(&m);
    passes(data, size, QCAL_ONNX_PROFILE_ORT);
    passes(data, size, QCAL_ONNX_PROFILE_TENSORRT);
    return 0;
}
