/* Deprecated: this header is qcal/fp8_checkpoint.h since 0.2.0 (the header takes its
 * functions' prefix, docs/architecture.md "Naming"); kept for one release. */
#include "qcal/fp8_checkpoint.h"
