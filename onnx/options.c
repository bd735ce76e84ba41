/* The parts of qcal/onnx.h that need no ONNX support: profile names and the options'
 * defaults. Compiled in every build (with -Donnx=disabled too, beside none.c), so both
 * builds answer them from this one place. */
#include <string.h>

#include "core/internal.h"
#include "qcal/onnx.h"

const char *qcal_onnx_profile_name(qcal_onnx_profile profile)
{
    switch (profile) {
    case QCAL_ONNX_PROFILE_ORT: return "ort";
    case QCAL_ONNX_PROFILE_TENSORRT: return "tensorrt";
    }
    return "unknown";
}

qcal_status qcal_onnx_profile_parse(const char *name, qcal_onnx_profile *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_profile_parse: NULL argument");
    if (!strcmp(name, "ort"))
        *out = QCAL_ONNX_PROFILE_ORT;
    else if (!strcmp(name, "tensorrt"))
        *out = QCAL_ONNX_PROFILE_TENSORRT;
    else
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown profile '%s' (expected ort or tensorrt)", name);
    return QCAL_OK;
}

void qcal_onnx_qdq_options_default(qcal_onnx_qdq_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->profile = QCAL_ONNX_PROFILE_ORT;
    opt->weight_observer = QCAL_OBSERVER_PER_CHANNEL_MINMAX;
    opt->weight_qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
}

void qcal_onnx_save_options_default(qcal_onnx_save_options *opt)
{
    opt->external_threshold = (UINT64_C(1) << 31) - (UINT64_C(1) << 20);
    opt->external_min_bytes = 1024;
}

void qcal_onnx_equalize_options_default(qcal_onnx_equalize_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->fold_bn = true;
    opt->replace_clip = true;
    opt->max_sweeps = 100;
    opt->equalize = true;
    qcal_qconfig_default(&opt->weight_qconfig);
    opt->weight_qconfig.dtype = QCAL_QINT8;
    opt->weight_qconfig.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
}
