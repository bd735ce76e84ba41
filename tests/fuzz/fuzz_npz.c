/* libFuzzer target: the .npz reader on a memory buffer (qcal_npz_parse), headers only and
 * with the data, then the entries' sizes checked against each other and freed. */
#include "tests/fuzz/fuzz_common.h"

#include "qcal/dataset.h"

static size_t onnx_size(int32_t t)
{
    switch (t) {
    case 2: case 3: case 9: return 1;
    case 10: return 2;
    case 1: case 6: return 4;
    case 7: case 11: return 8;
    default: return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int wd = 0; wd < 2; wd++) {
        qcal_npz_entry *e = (qcal_npz_entry *)(uintptr_t)0x5a5a;
        int64_t n = -3;
        qcal_clear_error();
        qcal_status st = qcal_npz_parse(data, size, wd != 0, &e, &n);
        if (st != QCAL_OK) {
            fuzz_check_failure(st);
            FUZZ_CHECK(e == (qcal_npz_entry *)(uintptr_t)0x5a5a && n == -3);   /* untouched */
            continue;
        }
        FUZZ_CHECK(n >= 0 && (n == 0) == (e == NULL));
        for (int64_t i = 0; i < n; i++) {
            FUZZ_CHECK(e[i].name != NULL);
            FUZZ_CHECK(e[i].ndim >= 0 && e[i].ndim <= QCAL_MAX_DIMS);
            FUZZ_CHECK(onnx_size(e[i].elem_type) > 0);
            int64_t numel = 1;
            for (int32_t d = 0; d < e[i].ndim; d++) {
                FUZZ_CHECK(e[i].dims[d] >= 0);
                numel *= e[i].dims[d];   /* checked by the reader */
            }
            if (wd) {
                FUZZ_CHECK(e[i].nbytes == (size_t)numel * onnx_size(e[i].elem_type));
                FUZZ_CHECK((e[i].nbytes == 0) == (e[i].data == NULL));
                fuzz_touch(e[i].data, e[i].nbytes);
            } else {
                FUZZ_CHECK(e[i].data == NULL && e[i].nbytes == 0);
            }
        }
        qcal_npz_free(&e, n);
        FUZZ_CHECK(e == NULL);
    }
    return 0;
}
