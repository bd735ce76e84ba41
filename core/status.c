/* Status names and the per-thread last-error message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal_config.h"

static _Thread_local char last_error[1024];

const char *qcal_status_str(qcal_status status)
{
    switch (status) {
    case QCAL_OK: return "ok";
    case QCAL_NO_DATA: return "no data observed";
    case QCAL_ERR_INVALID_ARG: return "invalid argument";
    case QCAL_ERR_NO_MEMORY: return "out of memory";
    case QCAL_ERR_IO: return "i/o error";
    case QCAL_ERR_FORMAT: return "malformed input";
    case QCAL_ERR_UNSUPPORTED: return "unsupported";
    case QCAL_ERR_NONFINITE: return "non-finite value";
    case QCAL_ERR_MISMATCH: return "mismatch";
    case QCAL_ERR_OVERFLOW: return "size overflow";
    case QCAL_ERR_BACKEND: return "backend failure";
    case QCAL_ERR_STATE: return "invalid state";
    case QCAL_ERR_NOT_FOUND: return "not found";
    case QCAL_ERR_EMPTY: return "empty tensor";
    }
    return "unknown status";
}

const char *qcal_last_error(void)
{
    return last_error;
}

void qcal_clear_error(void)
{
    last_error[0] = '\0';
}

const char *qcal_version(void)
{
    return QCAL_VERSION;
}

void qcal_free(void *ptr)
{
    free(ptr);
}

/* Formats into a local buffer first: an argument may be qcal_last_error() itself, and
 * vsnprintf must not write into the buffer it reads. */
static qcal_status set_error(qcal_status status, const char *fmt, va_list ap)
{
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, strlen(msg) + 1);
    return status;
}

qcal_status qcal_error(qcal_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(status, fmt, ap);
    va_end(ap);
    return status;
}

qcal_status qcal_error_wrap(qcal_status st, const char *fmt, ...)
{
    char prefix[512], detail[1024];
    snprintf(detail, sizeof detail, "%s", qcal_last_error());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return qcal_error(st, "%s: %s", prefix, detail);
}

qcal_status qcal_set_error(qcal_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(status, fmt, ap);
    va_end(ap);
    return status;
}

void *qcal_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes", bytes);
    return p;
}

void *qcal_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu x %zu bytes", count, size);
    return p;
}

char *qcal_strndup(const char *s, size_t n)
{
    char *d = qcal_malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

char *qcal_strdup(const char *s)
{
    return qcal_strndup(s, strlen(s));
}
