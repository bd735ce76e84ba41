/* libFuzzer target: the native calibration-table JSON reader (qcal_calib_table_parse_json).
 * A table it accepts must format back to JSON that parses again to the same bytes (the
 * format is documented to round-trip exactly), and must export to every other format. */
#include "tests/fuzz/fuzz_common.h"

#include <math.h>

#include "qcal/calib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qcal_calib_table *t = (qcal_calib_table *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status st = qcal_calib_table_parse_json((const char *)data, size, &t);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(t == (qcal_calib_table *)(uintptr_t)0x1);
        return 0;
    }
    int64_t n = -1;
    FUZZ_CHECK(qcal_calib_table_count(t, &n) == QCAL_OK && n >= 0);
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e = NULL;
        FUZZ_CHECK(qcal_calib_table_entry(t, i, &e) == QCAL_OK && e);
        FUZZ_CHECK(e->qparams.channels >= 1 &&
                   e->qparams.quant_min <= e->qparams.quant_max);
        FUZZ_CHECK(qcal_qparams_validate(&e->qparams) == QCAL_OK);
        for (int64_t c = 0; c < e->qparams.channels; c++) {
            /* A validated table never carries an unusable scale. */
            float s = qcal_qparams_scale_at(&e->qparams, c);
            FUZZ_CHECK(s > 0.0f && isfinite(s));
            float amax = -1.0f;
            FUZZ_CHECK(qcal_calib_entry_amax(e, c, &amax) == QCAL_OK && amax >= 0.0f);
        }
        const qcal_calib_entry *f = NULL;
        FUZZ_CHECK(qcal_calib_table_find(t, e->fqn, e->role, &f) == QCAL_OK && f == e);
    }
    char *json = NULL;
    size_t len = 0;
    FUZZ_CHECK(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &json, &len) == QCAL_OK);
    qcal_calib_table *t2 = NULL;
    FUZZ_CHECK(qcal_calib_table_parse_json(json, len, &t2) == QCAL_OK);
    char *json2 = NULL;
    size_t len2 = 0;
    FUZZ_CHECK(qcal_calib_table_format(t2, QCAL_CALIB_FORMAT_JSON, NULL, &json2, &len2) == QCAL_OK);
    FUZZ_CHECK(len == len2 && memcmp(json, json2, len) == 0);
    qcal_free(json);
    qcal_free(json2);
    qcal_calib_table_destroy(&t2);
    for (int f = QCAL_CALIB_FORMAT_TENSORRT; f <= QCAL_CALIB_FORMAT_NCNN; f++) {
        char *out = NULL;
        size_t olen = 0;
        qcal_status fs = qcal_calib_table_format(t, (qcal_calib_format)f, NULL, &out, &olen);
        if (fs == QCAL_OK) {
            FUZZ_CHECK(out && strlen(out) == olen);
            qcal_free(out);
        } else {
            fuzz_check_failure(fs);
        }
    }
    qcal_calib_table_destroy(&t);
    FUZZ_CHECK(t == NULL);
    return 0;
}
