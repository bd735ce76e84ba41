/* libFuzzer target: the dump manifest reader (qcal_calib_dump_parse, what
 * qcal_calib_dump_scan does with DIR/manifest.json before resolving paths). An accepted
 * manifest must list tensors sorted by (name, role) without duplicates, each with a
 * non-empty name and only relative, confined paths (no absolute path, no '.' or '..'
 * component, no empty component). */
#include "tests/fuzz/fuzz_common.h"

#include "qcal/calib_dump.h"

static void check_path(const char *p)
{
    FUZZ_CHECK(p[0] != '\0' && p[0] != '/');
    for (const char *c = p; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        FUZZ_CHECK(n > 0);
        FUZZ_CHECK(!(n == 1 && c[0] == '.'));
        FUZZ_CHECK(!(n == 2 && c[0] == '.' && c[1] == '.'));
        c += n + (e != NULL);
        FUZZ_CHECK(!(e && !*c));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qcal_calib_dump *d = (qcal_calib_dump *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status st = qcal_calib_dump_parse((const char *)data, size, &d);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(d == (qcal_calib_dump *)(uintptr_t)0x1);
        return 0;
    }
    int64_t n = -1, total = -1, sum = 0;
    FUZZ_CHECK(qcal_calib_dump_count(d, &n) == QCAL_OK && n >= 1);
    FUZZ_CHECK(qcal_calib_dump_file_count(d, &total) == QCAL_OK);
    const char *prev = NULL;
    qcal_calib_role prev_role = QCAL_CALIB_ROLE_ACTIVATION;
    for (int64_t i = 0; i < n; i++) {
        qcal_calib_dump_tensor t;
        FUZZ_CHECK(qcal_calib_dump_tensor_at(d, i, &t) == QCAL_OK);
        FUZZ_CHECK(t.name && t.name[0] != '\0');
        FUZZ_CHECK((unsigned)t.role < QCAL_CALIB_ROLE_COUNT);
        FUZZ_CHECK(t.nfiles >= 1);
        if (prev) {
            int c = strcmp(prev, t.name);
            FUZZ_CHECK(c < 0 || (c == 0 && prev_role < t.role));
        }
        prev = t.name;
        prev_role = t.role;
        for (int64_t j = 0; j < t.nfiles; j++)
            check_path(t.files[j]);
        sum += t.nfiles;
    }
    FUZZ_CHECK(sum == total);
    qcal_calib_dump_tensor t;
    FUZZ_CHECK(qcal_calib_dump_tensor_at(d, n, &t) == QCAL_ERR_INVALID_ARG);
    qcal_calib_dump_destroy(&d);
    FUZZ_CHECK(d == NULL);
    return 0;
}
