/* libFuzzer target: the calibration rules-file parser (qcal_calib_rules_parse). Accepted
 * rule lists are matched against a few names in both roles; every config they yield must be
 * one the observer constructor accepts. */
#include "tests/fuzz/fuzz_common.h"

#include "qcal/calib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qcal_calib_rules *r = (qcal_calib_rules *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status st = qcal_calib_rules_parse((const char *)data, size, &r);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(r == (qcal_calib_rules *)(uintptr_t)0x1);
        return 0;
    }
    int64_t n = -1;
    FUZZ_CHECK(qcal_calib_rules_count(r, &n) == QCAL_OK && n >= 0);
    static const char *const names[] = { "", "features.0", "fc1.weight", "a b", "x[0]", "*" };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        for (int role = QCAL_CALIB_ROLE_ACTIVATION; role <= QCAL_CALIB_ROLE_WEIGHT; role++) {
            qcal_observer_config cfg;
            int64_t idx = -2;
            FUZZ_CHECK(qcal_calib_rules_match(r, names[k], (qcal_calib_role)role, &cfg, &idx) == QCAL_OK);
            FUZZ_CHECK(idx >= -1 && idx < n);
            qcal_observer *o = NULL;
            qcal_status os = qcal_observer_create(&cfg, &o);
            FUZZ_CHECK(os == QCAL_OK);   /* the parser validated the config */
            qcal_observer_destroy(&o);
        }
    }
    qcal_calib_rules_destroy(&r);
    FUZZ_CHECK(r == NULL);
    return 0;
}
