/* Deprecated: this header is qcal/numeric_eval.h since 0.2.0 (the header takes its
 * functions' prefix, docs/architecture.md "Naming"); kept for one release. */
#include "qcal/numeric_eval.h"
