/* Shared helpers of the libFuzzer targets in tests/fuzz/ (not part of libqcal).
 *
 * Every target checks the library's contracts, not only that it does not crash:
 *   - a failing call leaves its output untouched (FUZZ_CHECK on a sentinel),
 *   - a failing call returns a negative status with a non-empty qcal_last_error(),
 *   - a successful parse yields self-consistent sizes.
 * A broken contract calls __builtin_trap(), which libFuzzer reports as a crash. */
#ifndef QCAL_FUZZ_COMMON_H
#define QCAL_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "qcal/qcal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz contract broken at %s:%d: %s (last error: %s)\n", \
                    __FILE__, __LINE__, #cond, qcal_last_error());                \
            __builtin_trap();                                                     \
        }                                                                         \
    } while (0)

/* A failure must carry a negative status and a message. */
static inline void fuzz_check_failure(qcal_status st)
{
    FUZZ_CHECK(st < 0);
    FUZZ_CHECK(qcal_last_error()[0] != '\0');
}

/* Reads every byte of a buffer so ASan sees out-of-bounds sizes; the sum is kept alive. */
static inline void fuzz_touch(const void *p, size_t n)
{
    const volatile uint8_t *b = (const volatile uint8_t *)p;
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc ^= b[i];
    __asm__ volatile("" : : "r"(acc));
}

#endif
