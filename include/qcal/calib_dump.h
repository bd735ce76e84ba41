/* qcal calibration dumps: the list of (tensor name, role, .npy batch files) that a dump
 * directory holds, as `qcal calibrate` and `qcal stats` read it (docs/calibration.md).
 *
 * A dump directory DIR is read in one of two ways:
 *   - DIR/manifest.json, if present, lists every tensor:
 *       {"tensors": [{"name": "/layer1/conv/Conv_output_0", "role": "activation",
 *                     "files": ["b0.npy", "sub/b1.npy"]}, ...]}
 *     "role" is "activation" or "weight" (optional: a name ending in ".weight" is a weight,
 *     any other an activation); files are fed in the listed order; paths are relative to
 *     DIR and must stay inside it (no absolute path, no "..", no symbolic link leading out).
 *     Other files in DIR are not read.
 *   - otherwise each entry of DIR is a tensor: a directory DIR/<name>/ of .npy batches (fed
 *     in byte order of their file names) or a single file DIR/<name>.npy. Entries starting
 *     with '.' and other files are ignored.
 * Directory and file names of the second layout are percent-decoded: "%XX" (two hex
 * digits) is the byte 0xXX, so "%2Flayer1%2Fconv" is "/layer1/conv", "input%3A0" is
 * "input:0" and "%25" is "%"; a '%' not followed by two hex digits, or "%00", is an error.
 * Manifest names are taken as written (JSON strings can spell any name). Tensors are listed in byte order of
 * their decoded names (then activation before weight), so the result never depends on the
 * file system; a (name, role) given twice is an error. */
#ifndef QCAL_CALIB_DUMP_H
#define QCAL_CALIB_DUMP_H

#include "qcal/calib.h"
#include "qcal/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a dump. Everything points into the dump object. */
typedef struct qcal_calib_dump_tensor {
    const char *name;            /* decoded tensor name (fqn) */
    qcal_calib_role role;
    int64_t nfiles;              /* >= 1 */
    const char *const *files;    /* paths (DIR/relative path), in feeding order */
} qcal_calib_dump_tensor;

typedef struct qcal_calib_dump qcal_calib_dump;

/* Decodes percent escapes of src into dst (cap bytes, NUL-terminated; the result is never
 * longer than src). QCAL_ERR_FORMAT for a bad or NUL escape, QCAL_ERR_INVALID_ARG when dst
 * is too small. */
QCAL_API qcal_status qcal_calib_dump_name_decode(const char *src, char *dst, size_t cap);

/* Reads the dump directory dir (see above); *out owned by the caller. Missing or unreadable
 * directories and files are QCAL_ERR_NOT_FOUND / QCAL_ERR_IO; a malformed manifest, bad
 * escape, duplicate or empty dump is QCAL_ERR_FORMAT; messages name the path. */
QCAL_API qcal_status qcal_calib_dump_scan(const char *dir, qcal_calib_dump **out);

/* Parses manifest text (len bytes) without touching the file system: file paths stay
 * relative and are checked lexically only (no absolute path, no ".." component, no empty
 * component). What qcal_calib_dump_scan does with DIR/manifest.json before resolving the
 * paths; exposed for tests and fuzzing. */
QCAL_API qcal_status qcal_calib_dump_parse(const char *text, size_t len,
                                           qcal_calib_dump **out);

/* Number of tensors. */
QCAL_API qcal_status qcal_calib_dump_count(const qcal_calib_dump *d, int64_t *n);

/* Tensor i (0..count-1), pointing into d. */
QCAL_API qcal_status qcal_calib_dump_tensor_at(const qcal_calib_dump *d, int64_t i,
                                               qcal_calib_dump_tensor *out);

/* Total number of files over all tensors. */
QCAL_API qcal_status qcal_calib_dump_file_count(const qcal_calib_dump *d, int64_t *n);

/* Destroys *d (NULL is fine) and sets *d to NULL. */
QCAL_API void qcal_calib_dump_destroy(qcal_calib_dump **d);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_CALIB_DUMP_DECLARED
#include "qcal/deprecated.h"
#endif
