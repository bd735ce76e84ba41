/* libFuzzer target: the state readers (docs/state.md), observer states ("QCOB",
 * qcal_observer_load), session states ("QCSS", qcal_calib_session_load) and evaluation
 * states ("QCEV", qcal_numeric_eval_load: an accepted one saves to bytes that load again
 * and save to the same bytes, and formats its results in every format).
 * A state they accept must save to bytes that load again and save to the same bytes,
 * have a digest, report a range and qparams, merge with a copy of itself (or refuse
 * cleanly: moving averages), and make a table (sessions). Rejections leave the output
 * untouched and carry a message. */
#include "tests/fuzz/fuzz_common.h"

#include "qcal/calib.h"
#include "qcal/numeric_eval.h"
#include "qcal/observer.h"

static void check_observer(const uint8_t *data, size_t size)
{
    qcal_observer *sentinel = (qcal_observer *)(uintptr_t)0x1, *o = sentinel;
    qcal_clear_error();
    qcal_status st = qcal_observer_load(data, size, &o);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(o == sentinel);
        return;
    }
    void *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(qcal_observer_save(o, &b1, &l1) == QCAL_OK);
    qcal_observer *o2 = NULL;
    FUZZ_CHECK(qcal_observer_load(b1, l1, &o2) == QCAL_OK);
    FUZZ_CHECK(qcal_observer_save(o2, &b2, &l2) == QCAL_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    char h1[65], h2[65];
    FUZZ_CHECK(qcal_observer_digest(o, h1) == QCAL_OK && strlen(h1) == 64);
    FUZZ_CHECK(qcal_observer_digest(o2, h2) == QCAL_OK && strcmp(h1, h2) == 0);
    int64_t ch = 0, n = 0;
    FUZZ_CHECK(qcal_observer_channels(o, &ch) == QCAL_OK);
    if (ch < 1)
        ch = 1;
    if (ch <= 4096) {
        float mn[4096], mx[4096];
        st = qcal_observer_qrange(o, ch, mn, mx, &n);
        FUZZ_CHECK(st == QCAL_OK || st == QCAL_NO_DATA || (st < 0 && qcal_last_error()[0]));
        qcal_qparams qp = {0};
        st = qcal_observer_qparams(o, &qp);
        FUZZ_CHECK(st >= 0 || qcal_last_error()[0]);
        if (st >= 0)
            FUZZ_CHECK(qcal_qparams_validate(&qp) == QCAL_OK || qp.qscheme ==
                       QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS);
        qcal_qparams_free(&qp);
    }
    st = qcal_observer_merge(o2, o);
    if (st != QCAL_OK)
        fuzz_check_failure(st);
    qcal_free(b1);
    qcal_free(b2);
    qcal_observer_destroy(&o);
    qcal_observer_destroy(&o2);
    FUZZ_CHECK(o == NULL);
}

static void check_session(const uint8_t *data, size_t size)
{
    qcal_calib_session *sentinel = (qcal_calib_session *)(uintptr_t)0x1, *s = sentinel;
    qcal_clear_error();
    qcal_status st = qcal_calib_session_load(data, size, NULL, &s);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(s == sentinel);
        return;
    }
    void *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(qcal_calib_session_save(s, &b1, &l1) == QCAL_OK);
    qcal_calib_session *s2 = NULL;
    FUZZ_CHECK(qcal_calib_session_load(b1, l1, NULL, &s2) == QCAL_OK);
    FUZZ_CHECK(qcal_calib_session_save(s2, &b2, &l2) == QCAL_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    char h1[65], h2[65];
    FUZZ_CHECK(qcal_calib_session_digest(s, h1) == QCAL_OK);
    FUZZ_CHECK(qcal_calib_session_digest(s2, h2) == QCAL_OK && strcmp(h1, h2) == 0);
    qcal_calib_table *t = NULL;
    st = qcal_calib_session_table(s, &t);
    if (st == QCAL_OK) {
        char *json = NULL;
        size_t len = 0;
        FUZZ_CHECK(qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &json, &len) == QCAL_OK);
        qcal_free(json);
        qcal_calib_table_destroy(&t);
    } else {
        fuzz_check_failure(st);
    }
    st = qcal_calib_session_merge(s2, s);
    if (st != QCAL_OK)
        fuzz_check_failure(st);
    qcal_free(b1);
    qcal_free(b2);
    qcal_calib_session_destroy(&s);
    qcal_calib_session_destroy(&s2);
}

static void check_evaluation(const uint8_t *data, size_t size)
{
    qcal_numeric_eval *sentinel = (qcal_numeric_eval *)(uintptr_t)0x1, *ev = sentinel;
    qcal_clear_error();
    qcal_status st = qcal_numeric_eval_load(data, size, &ev);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(ev == sentinel);
        return;
    }
    void *b1 = NULL, *b2 = NULL;
    size_t l1 = 0, l2 = 0;
    FUZZ_CHECK(qcal_numeric_eval_save(ev, &b1, &l1) == QCAL_OK);
    qcal_numeric_eval *ev2 = NULL;
    FUZZ_CHECK(qcal_numeric_eval_load(b1, l1, &ev2) == QCAL_OK);
    FUZZ_CHECK(qcal_numeric_eval_save(ev2, &b2, &l2) == QCAL_OK);
    FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0);
    for (int f = 0; f < 3; f++) {
        char *text = NULL;
        size_t len = 0;
        FUZZ_CHECK(qcal_numeric_eval_format_results(ev, (qcal_numeric_eval_format)f, &text, &len) ==
                   QCAL_OK);
        qcal_free(text);
    }
    st = qcal_numeric_eval_restrict(ev2, 1u << QCAL_OBSERVER_MINMAX);
    if (st != QCAL_OK)
        fuzz_check_failure(st);
    qcal_free(b1);
    qcal_free(b2);
    qcal_numeric_eval_destroy(&ev);
    qcal_numeric_eval_destroy(&ev2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_observer(data, size);
    check_session(data, size);
    check_evaluation(data, size);
    return 0;
}
