/* libFuzzer target: the IDX reader on memory (idx_read_memory), raw and gzip. Inputs
 * are fed as they are (the reader detects gzip by its magic); the corpus holds both kinds.
 * Accepted files must describe exactly the payload they return. */
#include "tests/fuzz/fuzz_common.h"

#include "idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    idx_file *idx = (idx_file *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status st = idx_read_memory(data, size, &idx);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(idx == (idx_file *)(uintptr_t)0x1);
        return 0;
    }
    int32_t ndim = 0;
    int64_t dims[IDX_MAX_DIMS];
    FUZZ_CHECK(idx_shape(idx, &ndim, dims) == QCAL_OK);
    FUZZ_CHECK(ndim >= 1 && ndim <= IDX_MAX_DIMS);
    int64_t prod = 1;
    for (int32_t d = 0; d < ndim; d++) {
        FUZZ_CHECK(dims[d] >= 0);
        FUZZ_CHECK(!__builtin_mul_overflow(prod, dims[d], &prod));
    }
    const uint8_t *p = NULL;
    int64_t len = -1;
    FUZZ_CHECK(idx_data(idx, &p, &len) == QCAL_OK);
    FUZZ_CHECK(len == prod);
    fuzz_touch(p, (size_t)len);
    /* Expectations that cannot hold must fail with a message, not crash. */
    int64_t want[IDX_MAX_DIMS] = { dims[0] + 1, 0, 0, 0 };
    qcal_status es = idx_expect(idx, ndim, want);
    FUZZ_CHECK(es < 0);
    const int64_t any[IDX_MAX_DIMS] = { 0, 0, 0, 0 };
    es = idx_expect(idx, ndim == 4 ? 1 : ndim + 1, any);
    FUZZ_CHECK(es < 0);
    idx_destroy(&idx);
    FUZZ_CHECK(idx == NULL);
    return 0;
}
