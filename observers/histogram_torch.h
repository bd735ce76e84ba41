/* Internal: the torch grid of the "histogram" observer (grid=torch), PyTorch 1.13
 * HistogramObserver.forward reproduced bit for bit (observers/histogram_torch.c; what it
 * computes: include/qcal/observers/histogram.h, "GRID TORCH"). Not installed. */
#ifndef QCAL_OBSERVERS_HISTOGRAM_TORCH_H
#define QCAL_OBSERVERS_HISTOGRAM_TORCH_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/observer_impl.h"

/* PyTorch's three buffers. No data: min_val = +inf, max_val = -inf, hist all zero. */
typedef struct qcal_torch_hist {
    int32_t bins;
    int32_t upsample_rate;   /* 128, PyTorch's default */
    float min_val, max_val;
    float *hist;             /* [bins] float32 counts, as torch's `histogram` buffer */
} qcal_torch_hist;

qcal_status qcal_torch_hist_init(qcal_torch_hist *h, int32_t bins);
void qcal_torch_hist_free(qcal_torch_hist *h);
void qcal_torch_hist_clear(qcal_torch_hist *h);
bool qcal_torch_hist_empty(const qcal_torch_hist *h);
/* HistogramObserver.forward(x) for x[0..n) (n > 0). Non-finite values (PyTorch raises on
 * them) are skipped and counted into *nonfinite, or QCAL_ERR_NONFINITE under
 * QCAL_NONFINITE_ERROR; every failure leaves h unchanged. */
qcal_status qcal_torch_hist_update(qcal_torch_hist *h, const float *x, int64_t n,
                                   qcal_nonfinite_policy policy, uint64_t *nonfinite);
/* PyTorch has no merge and its histogram depends on batch order: merging is defined only
 * when one side is empty (the result is the other side); otherwise QCAL_ERR_UNSUPPORTED. */
qcal_status qcal_torch_hist_merge(qcal_torch_hist *dst, const qcal_torch_hist *src);
/* Payload: u32 bins, u32 upsample_rate, f32 min_val, f32 max_val, f32 hist[bins]. */
void qcal_torch_hist_save(const qcal_torch_hist *h, qcal_buf *b);
qcal_status qcal_torch_hist_load(qcal_torch_hist *h, qcal_cursor *c);
/* Replaces the state by PyTorch buffers (a torch.ao state_dict): validated as load does. */
qcal_status qcal_torch_hist_set(qcal_torch_hist *h, float min_val, float max_val,
                                const float *hist, int32_t bins);

/* The last of torch.linspace(start, end, steps) in float32 as ATen 1.13's CPU kernel
 * computes it (AVX2 build: 16-element vector chunks, a fused multiply-add; end itself
 * unless steps % 16 == 0). */
float qcal_torch_linspace_last(float start, float end, int64_t steps);

#endif
