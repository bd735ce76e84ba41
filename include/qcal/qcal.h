/* qcal: static-quantization calibration toolkit. Umbrella header: includes every public
 * header. See each header for its functions. */
#ifndef QCAL_QCAL_H
#define QCAL_QCAL_H

#include "qcal/common.h"
#include "qcal/atomic_file.h"
#include "qcal/threads.h"
#include "qcal/tensor.h"
#include "qcal/qparams.h"
#include "qcal/observer.h"
#include "qcal/observers/histogram.h"
#include "qcal/quantize.h"
#include "qcal/weights.h"
#include "qcal/fakequant.h"
#include "qcal/npy.h"
#include "qcal/onnx.h"
#include "qcal/safetensors.h"
#include "qcal/numeric.h"
#include "qcal/ptq.h"
#include "qcal/calib.h"
#include "qcal/calib_dump.h"
#include "qcal/fp8_checkpoint.h"
#include "qcal/numeric_eval.h"
#include "qcal/int8.h"
#include "qcal/engine.h"
#include "qcal/npz.h"
#include "qcal/dataset.h"
#include "qcal/model_calib.h"
#include "qcal/accuracy.h"
#include "qcal/deprecated.h"   /* the pre-0.2.0 names, for one release */

#endif
