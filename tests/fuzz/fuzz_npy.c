/* libFuzzer target: the .npy reader on a memory buffer (qcal_npy_parse), then the float32
 * conversion and the tensor view of whatever it accepts. */
#include "tests/fuzz/fuzz_common.h"

#include "qcal/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qcal_npy_array a;
    memset(&a, 0xA5, sizeof a);
    qcal_npy_array sentinel;
    memcpy(&sentinel, &a, sizeof a);
    qcal_clear_error();
    qcal_status st = qcal_npy_parse(data, size, &a);
    if (st != QCAL_OK) {
        fuzz_check_failure(st);
        FUZZ_CHECK(memcmp(&a, &sentinel, sizeof a) == 0);   /* untouched on failure */
        return 0;
    }
    /* Accepted: the sizes must agree with each other and with the input length. */
    FUZZ_CHECK(a.ndim >= 0 && a.ndim <= QCAL_MAX_DIMS);
    int64_t numel = 1;
    for (int32_t d = 0; d < a.ndim; d++) {
        FUZZ_CHECK(a.shape[d] >= 0);
        numel *= a.shape[d];   /* cannot overflow: the reader checked, and nbytes <= size */
    }
    FUZZ_CHECK(numel == a.numel);
    FUZZ_CHECK(a.nbytes == (size_t)a.numel * qcal_npy_dtype_size(a.dtype));
    FUZZ_CHECK(a.nbytes < size);
    FUZZ_CHECK((a.numel == 0) == (a.data == NULL));
    fuzz_touch(a.data, a.nbytes);

    qcal_status cs = qcal_npy_to_f32(&a);
    if (cs == QCAL_OK) {
        FUZZ_CHECK(a.dtype == QCAL_NPY_F32);
        FUZZ_CHECK(a.nbytes == (size_t)a.numel * 4);
        fuzz_touch(a.data, a.nbytes);
        qcal_tensor t;
        if (qcal_npy_as_tensor(&a, &t) == QCAL_OK)
            FUZZ_CHECK(t.data == a.data);
    } else {
        fuzz_check_failure(cs);
        FUZZ_CHECK(a.dtype != QCAL_NPY_F32 && a.dtype != QCAL_NPY_F64 && a.dtype != QCAL_NPY_F16);
    }
    qcal_npy_array_free(&a);
    FUZZ_CHECK(a.data == NULL);
    return 0;
}
