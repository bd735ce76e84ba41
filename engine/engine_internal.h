/* Internal to engine/: the small helpers model_calib.c and accuracy.c share. */
#ifndef QCAL_ENGINE_INTERNAL_H
#define QCAL_ENGINE_INTERNAL_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

/* Seconds on the monotonic clock (reports' durations). */
static inline double engine_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The engine's former name of qcal_strdup (core/internal.h), still called by accuracy.c. */
static inline char *engine_strdup(const char *s)
{
    return qcal_strdup(s);
}

#endif
