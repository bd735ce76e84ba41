/* TEMPORARY: replaced by the qparams implementation. */
#include <float.h>
#include "core/internal.h"
#include "qcal/qparams.h"
void qcal_qconfig_default(qcal_qconfig *cfg) { cfg->dtype = QCAL_QUINT8; cfg->qscheme = QCAL_PER_TENSOR_AFFINE; cfg->reduce_range = false; cfg->custom_range = false; cfg->quant_min = 0; cfg->quant_max = 255; cfg->eps = FLT_EPSILON; }
qcal_status qcal_qconfig_range(const qcal_qconfig *cfg, int64_t *a, int64_t *b) { (void)cfg; *a = 0; *b = 255; return QCAL_OK; }
bool qcal_qscheme_is_per_channel(qcal_qscheme q) { return q >= QCAL_PER_CHANNEL_AFFINE; }
const char *qcal_qscheme_name(qcal_qscheme q) { (void)q; return "?"; }
qcal_status qcal_qparams_compute(const qcal_qconfig *cfg, int64_t n, const float *a, const float *b, float *s, int32_t *z, float *zf) { (void)cfg;(void)n;(void)a;(void)b;(void)s;(void)z;(void)zf; return QCAL_ERR_UNSUPPORTED; }
