/* Internal to the histogram observer family (histogram, percentile, entropy, mse): the
 * state each kind keeps (first-batch histogram, lattice or torch grid), the observer ops they
 * share (observers/histogram_kinds.c) and the range choosers the kinds, the report and their
 * tests call directly (each in its kind's file). Binning: histogram_bin.h over the kernel
 * family observers/histogram_dsp.h. Not installed. */
#ifndef QCAL_OBSERVERS_HISTOGRAM_KINDS_H
#define QCAL_OBSERVERS_HISTOGRAM_KINDS_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/histogram_bin.h"
#include "observers/histogram_first_batch.h"
#include "observers/histogram_lattice.h"
#include "observers/histogram_torch.h"
#include "observers/observer_impl.h"

/* ---- range choosers (each in its kind's file) ----------------------------------------- */

/* PyTorch 1.13 HistogramObserver._non_linear_param_search on a float32 histogram over
 * [min_val, max_val] (min_val < max_val), reproducing its float32/float64 arithmetic and
 * torch.sum's summation order (AVX2 build); dst_nbins = 2^bits of the dtype. */
qcal_status qcal_hist_l2_search(const float *hist, int32_t bins, float min_val,
                                float max_val, double dst_nbins, float *new_min,
                                float *new_max);
/* The candidates the L2 search evaluates, in visit order: bins [start, end] with norm; the
 * first cap are stored, n counts all; chosen = index of the last accepted one (-1: none). */
typedef struct qcal_l2_trace {
    int64_t cap, n, chosen;
    int32_t *start, *end;
    double *norm;
} qcal_l2_trace;
/* qcal_hist_l2_search recording its candidates into *trace (NULL: none). */
qcal_status qcal_hist_l2_search_trace(const float *hist, int32_t bins, float min_val,
                                      float max_val, double dst_nbins, float *new_min,
                                      float *new_max, qcal_l2_trace *trace);
/* torch.sum of a contiguous float32 vector as ATen 1.13's cascade_sum computes it with
 * 8-lane vectors (CPU capability AVX2). */
float qcal_torch_sum_f32(const float *x, int64_t n);

/* Value below which a fraction q in (0, 1] of the mass lies, on a grid [lo, hi]; linear
 * interpolation inside the bin that crosses q (uniform density). total > 0. */
double qcal_hist_quantile(const uint64_t *counts, int32_t bins, double lo, double hi,
                          double q);
/* KL search (entropy.c): best candidate bin count i in [levels, bins]; threshold = i * w.
 * Runs on the counts with counts[0] = min(counts[0], counts[1]) (bins >= 2; entropy.c);
 * returns bins (KL 0) if no bin past the first holds data. */
int32_t qcal_hist_entropy_search(const uint64_t *counts, int32_t bins, int32_t levels,
                                 double *best_kl);
/* The same search also writing KL_i of every candidate i into kl[i - levels]
 * (bins - levels + 1 entries; +inf where undefined). */
int32_t qcal_hist_entropy_search_curve(const uint64_t *counts, int32_t bins, int32_t levels,
                                       double *best_kl, double *kl);
/* Two-ended KL search (entropy.c) on a signed histogram, for asymmetric targets: the window
 * [*lo, *hi) of bins (*hi - *lo >= levels) of smallest KL by coordinate descent (best hi
 * end for the current lo end, then best lo end for it, until a round no longer lowers the
 * KL), each end only as far in as the squared error on a grid of `steps` steps (quant_max
 * - quant_min) keeps falling from the data's extreme; z = the bin holding zero (windows
 * must contain it) or -1 when the data do not reach zero; the zero bin is clamped to its
 * fuller neighbour first. curve (NULL: none): KL of every hi end i in [levels, bins] with
 * the chosen lo end (+inf where not a candidate). false only when scratch cannot be
 * allocated. */
bool qcal_hist_entropy_window(const uint64_t *counts, int32_t bins, int32_t levels,
                              int64_t steps, int32_t z, int32_t *lo, int32_t *hi,
                              double *best_kl, double *curve);
/* MSE search (mse.c): best candidate bin i in [min(128, bins-1), bins); amax = centre of bin
 * i = (i + 0.5) * w, nlev = positive quantized levels (127 signed, 255 unsigned 8-bit). */
int32_t qcal_hist_mse_search(const uint64_t *counts, int32_t bins, double hi, int64_t nlev,
                             double *best_mse);
/* The same search also writing the mean error of every candidate i into
 * mse[i - min(128, bins-1)]. */
int32_t qcal_hist_mse_search_curve(const uint64_t *counts, int32_t bins, double hi,
                                   int64_t nlev, double *best_mse, double *mse);

/* Two-ended MSE search (mse.c) on a signed histogram, for asymmetric targets: candidate
 * = the edges of the bins window [*lo, *hi) (*hi - *lo >= min(128, bins - 1)) quantized to
 * nlev steps (quant_max - quant_min), chosen by coordinate descent as the entropy window
 * search, errors compared exactly; z as there. best_err: mean error in units of
 * (w / 2 nlev)^2; curve (NULL: none): that error for every hi end i in [min(128, bins-1),
 * bins] with the chosen lo end (+inf where not a candidate). false only without memory. */
bool qcal_hist_mse_window(const uint64_t *counts, int32_t bins, int64_t nlev, int32_t z,
                          int32_t *lo, int32_t *hi, double *best_err, double *curve);

/* Shared observer ops of the four kinds (only qrange differs). */
qcal_status qcal_histobs_init(qcal_observer *obs);
void qcal_histobs_fini(qcal_observer *obs);
qcal_status qcal_histobs_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                                uint64_t *nonfinite);
qcal_status qcal_histobs_channels(const qcal_observer *obs, int64_t *n);
qcal_status qcal_histobs_data_range(const qcal_observer *obs, int64_t cap, float *mn,
                                    float *mx, int64_t *n);
void qcal_histobs_reset(qcal_observer *obs);
qcal_status qcal_histobs_merge(qcal_observer *dst, const qcal_observer *src);
void qcal_histobs_save(const qcal_observer *obs, qcal_buf *b);
qcal_status qcal_histobs_load(qcal_observer *obs, qcal_cursor *c);
/* Kind state of the four kinds: the first-batch grid's histogram, the lattice or the torch
 * grid (histogram kind only; obs->cfg.grid says which one is in use). */
typedef struct qcal_histobs {
    qcal_hist hist;
    qcal_lattice lat;
    qcal_torch_hist th;
} qcal_histobs;

/* The torch grid's state of a "histogram" observer with grid=torch (NULL otherwise). */
qcal_torch_hist *qcal_histobs_torch(const qcal_observer *obs);

/* The first-batch grid's histogram of an observer of one of the four kinds. */
qcal_hist *qcal_histobs_hist(const qcal_observer *obs);
/* The lattice of an observer of one of the four kinds (tests read its absval). */
qcal_lattice *qcal_histobs_lattice(const qcal_observer *obs);
bool qcal_histobs_is_lattice(const qcal_observer *obs);
/* The common start of the four kinds' qrange: sets *n = 1 and returns the histogram the
 * range choice runs on, or NULL with *st = QCAL_NO_DATA after writing the empty range when
 * nothing was seen (*st = QCAL_ERR_NO_MEMORY on allocation failure). First-batch grid: the
 * observer's own histogram. Lattice: `bins` equal bins over the data range (|x| kinds:
 * [0, max|x|]) re-binned from the lattice (qcal_lattice_view) into *view. Always pair with
 * qcal_histobs_qrange_end(view). */
const qcal_hist *qcal_histobs_qrange_begin(const qcal_observer *obs, float *mn, float *mx,
                                           int64_t *n, qcal_hist *view, qcal_status *st);
void qcal_histobs_qrange_end(qcal_hist *view);

/* Positive quantized levels the mse search uses for h (see mse.c). */
qcal_status qcal_histobs_mse_levels(const qcal_observer *obs, const qcal_hist *h,
                                    int64_t *nlev);

/* Bin of a signed histogram holding zero (the last bin if zero is its top edge), or -1
 * when zero lies outside [lo, hi]. */
int32_t qcal_hist_zero_bin(const qcal_hist *h);
/* Clip range [lo + (a + f) w, lo + (b + f) w] of a signed histogram h (f = 0: bin edges,
 * exact lo / hi at a = 0 / b = bins; f = 0.5: bin centres), kept inside the data on the
 * lattice grid. */
void qcal_histobs_window_range(const qcal_observer *obs, const qcal_hist *h, int32_t a,
                               int32_t b, double f, float *mn, float *mx);

/* Clip range from a threshold t >= 0 on |x|: [0, t] if no negative value was seen, else
 * [-t, t] (t capped at FLT_MAX; lattice grid: at max|x|). qcal_qparams_compute then applies
 * the qscheme. */
void qcal_histobs_clip_range(const qcal_observer *obs, double t, float *mn, float *mx);

#endif
