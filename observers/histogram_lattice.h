/* The lattice histogram of the histogram observer family (grid = QCAL_GRID_LATTICE, the
 * default): counts whose state is a function of the multiset of finite values seen, never of
 * batch order, batch sizes or merge splits. Internal, not installed.
 *
 * Cells. Cell j of width W = 2^e holds the values v with floor(v / W) = j (v = x, or |x| for
 * the |x| kinds), anchored at zero. v / W is v * 2^-e, exact in float (a negative v whose
 * product underflows to -0 is put in cell -1, its exact floor). Doubling W maps cell j to
 * cell j >> 1 (floor division), so a lattice at width 2^e' is obtained from one at 2^e <= 2^e'
 * by adding counts, exactly.
 *
 * Width. With [vmin, vmax] the range of v seen (|x| kinds: vmin = 0, vmax = max|x|), e is the
 * smallest integer >= QCAL_LATTICE_EMIN such that jmin = floor(vmin / 2^e) and jmax =
 * floor(vmax / 2^e) satisfy jmax - jmin + 1 <= cells (2 * bins) and -2^24 <= jmin, jmax < 2^24
 * (cell indices exact in float and int32). Every condition only gets easier as e grows and
 * harder as the range grows, so e is a function of [vmin, vmax], grows monotonically with the
 * data and the cells in use are between cells / 2 and cells (fewer only when the 2^24 bound or
 * EMIN bind: data much narrower than its magnitude, or all |v| below ~2^-127 * cells).
 *
 * Canonical state: e, jmin, the counts of cells jmin..jmax, the exact min / max of the finite
 * x seen (signed, -0 stored as +0) and their number. In memory the counts sit in a window of
 * `cells` counters starting at cell `jlo` (where the window starts depends on history; only
 * cells jmin..jmax can be non-zero and only they are saved). */
#ifndef QCAL_OBSERVERS_HISTOGRAM_LATTICE_H
#define QCAL_OBSERVERS_HISTOGRAM_LATTICE_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/histogram_dsp.h"
#include "observers/observer_impl.h"

#define QCAL_LATTICE_EMIN (-127)        /* 2^-e stays a finite float */
#define QCAL_LATTICE_JLIM (1 << 24)     /* |cell index| bound */

typedef struct qcal_lattice {
    int32_t cells;      /* window size: 2 * bins */
    bool absval;        /* cells over |x| (vmin = 0) */
    int32_t e;          /* cell width 2^e (meaningful when total > 0) */
    int64_t jlo;        /* cell index of counts[0] */
    float dmin, dmax;   /* min / max of the finite x seen (+inf / -inf when empty) */
    uint64_t total;     /* values counted */
    uint64_t *counts;   /* [cells] */
} qcal_lattice;

qcal_status qcal_lattice_init(qcal_lattice *L, int32_t bins, bool absval);
void qcal_lattice_free(qcal_lattice *L);
void qcal_lattice_clear(qcal_lattice *L);
/* Lowest / highest value of v seen (|x| kinds: 0 and max|x|). total > 0. */
float qcal_lattice_vmin(const qcal_lattice *L);
float qcal_lattice_vmax(const qcal_lattice *L);
/* Cell indices floor(vmin / 2^e), floor(vmax / 2^e). total > 0. */
int64_t qcal_lattice_jmin(const qcal_lattice *L);
int64_t qcal_lattice_jmax(const qcal_lattice *L);
/* Count of cell j (0 outside the window). */
uint64_t qcal_lattice_count(const qcal_lattice *L, int64_t j);
/* The width exponent for a range of v (see above); vmin <= vmax finite. */
int32_t qcal_lattice_exponent(float vmin, float vmax, int32_t cells);

/* Adds a batch (observer_impl.h update contract: non-finite values counted into
 * *nonfinite, skipped or, under QCAL_NONFINITE_ERROR, QCAL_ERR_NONFINITE with L unchanged;
 * L unchanged on any failure). */
qcal_status qcal_lattice_update(qcal_lattice *L, const float *x, int64_t n,
                                qcal_nonfinite_policy policy, uint64_t *nonfinite);
/* dst += src (same cells and absval): exact. */
qcal_status qcal_lattice_merge(qcal_lattice *dst, const qcal_lattice *src);

/* Canonical payload (little-endian): i32 e, i64 jmin, u32 n (= jmax - jmin + 1, 0 when
 * empty), f32 dmin, f32 dmax, u64 total, u64 counts[n]. Empty: e 0, jmin 0, n 0, dmin +inf,
 * dmax -inf, total 0. The same multiset gives the same bytes. */
void qcal_lattice_save(const qcal_lattice *L, qcal_buf *b);
/* Reads and validates a payload (everything cross-checked: e recomputed from the range,
 * jmin / jmax, the sum of the counts, the end cells). QCAL_ERR_FORMAT on any mismatch. */
qcal_status qcal_lattice_load(qcal_lattice *L, qcal_cursor *c);

/* Re-bins the lattice onto `bins` equal bins over [lo, hi] (lo < hi; the data range, or
 * [0, max|x|]): each cell's mass is spread uniformly over the part of the cell inside
 * [vmin, vmax] and the cumulative mass at every edge rounded to the nearest integer, so
 * the total is exact. out[bins] is overwritten. */
void qcal_lattice_view(const qcal_lattice *L, double lo, double hi, int32_t bins,
                       uint64_t *out);

#endif
