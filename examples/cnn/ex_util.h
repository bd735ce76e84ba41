/* Small helpers shared by the examples: allocation that reports its failure through
 * qcal_last_error() like the library's own calls do, so a caller prints one message. */
#ifndef QCAL_EXAMPLES_EX_UTIL_H
#define QCAL_EXAMPLES_EX_UTIL_H

#include <stdlib.h>

#include <qcal/common.h>

/* malloc(bytes) (at least 1 byte); NULL with QCAL_ERR_NO_MEMORY's message on failure. */
static inline void *ex_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        qcal_set_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
    return p;
}

/* calloc(count, size) (at least 1 x 1 byte); NULL with a message on failure. */
static inline void *ex_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        qcal_set_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu x %zu bytes", count, size);
    return p;
}

#endif
