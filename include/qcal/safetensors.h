/* qcal safetensors: a validating, memory-mapped reader (F32, F16, BF16, F64 converted to
 * float32 per tensor or per chunk, so files larger than memory stream) and an atomic
 * writer for float32 tensors.
 *
 * Format (huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON
 * header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"k": "v"}}, then the data section; offsets are relative to it.
 * Open validates everything before any data is read: N < 100 MiB and within the file; the
 * header is strict JSON (io/json.c) whose members are exactly dtype/shape/data_offsets;
 * names unique and non-empty; shape products do not overflow; end - begin equals
 * numel * dtype size; tensors tile the data section without overlap or hole, and the
 * section ends at the last tensor (the rules of the reference implementation).
 * A dtype the format knows but qcal cannot convert (I64, U8, BOOL, ...) is listed with
 * its name, and reading it is QCAL_ERR_UNSUPPORTED; an unknown dtype string fails open.
 * Writers: qcal_safetensors_write_f32 (float32 tensors in memory) and
 * qcal_safetensors_header for files of any dtypes (FP8 checkpoints: F8_E4M3, F8_E5M2)
 * streamed by the caller. */
#ifndef QCAL_SAFETENSORS_H
#define QCAL_SAFETENSORS_H

#include "qcal/common.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_safetensors_dtype {
    QCAL_SAFETENSORS_F32 = 0,
    QCAL_SAFETENSORS_F16 = 1,
    QCAL_SAFETENSORS_BF16 = 2,
    QCAL_SAFETENSORS_F64 = 3,
    QCAL_SAFETENSORS_OTHER = 4,   /* a valid safetensors dtype qcal does not convert (see dtype_name) */
} qcal_safetensors_dtype;

typedef struct qcal_safetensors_tensor_info {
    const char *name;          /* tensor name, owned by the reader (valid until close) */
    qcal_safetensors_dtype dtype;
    const char *dtype_name;    /* as in the file: "F32", "I64", ... (owned by the reader) */
    int32_t ndim;              /* 0..QCAL_MAX_DIMS */
    int64_t shape[QCAL_MAX_DIMS];
    int64_t numel;             /* product of shape (1 for a scalar) */
    int64_t nbytes;            /* bytes in the file */
    int64_t offset;            /* absolute file offset of the first byte */
} qcal_safetensors_tensor_info;

typedef struct qcal_safetensors qcal_safetensors;

/* Opens and validates path (memory-mapped read only). *out owned by the caller; release
 * with qcal_safetensors_close. Malformed files are QCAL_ERR_FORMAT with the reason. */
QCAL_API qcal_status qcal_safetensors_open(const char *path, qcal_safetensors **out);

/* Unmaps and frees *st (NULL or *st NULL is fine) and sets *st to NULL. */
QCAL_API void qcal_safetensors_close(qcal_safetensors **st);

/* Number of tensors (excluding __metadata__). */
QCAL_API qcal_status qcal_safetensors_count(const qcal_safetensors *st, int64_t *n);

/* Describes tensor i (0 <= i < count); tensors are numbered in data-offset order. */
QCAL_API qcal_status qcal_safetensors_info(const qcal_safetensors *st, int64_t i,
                                           qcal_safetensors_tensor_info *info);

/* Index of the tensor called name, or QCAL_ERR_NOT_FOUND. */
QCAL_API qcal_status qcal_safetensors_find(const qcal_safetensors *st, const char *name,
                                           int64_t *i);

/* Value of a __metadata__ entry (owned by the reader) or QCAL_ERR_NOT_FOUND. */
QCAL_API qcal_status qcal_safetensors_metadata(const qcal_safetensors *st, const char *key,
                                               const char **value);

/* Converts elements [start, start + count) of tensor i (flattened, C order) to float32
 * into dst[0..count). F16/BF16 convert exactly (NaN payloads kept quiet); F64 rounds to
 * nearest. Reading a chunk touches only its pages: stream a big tensor chunk by chunk. */
QCAL_API qcal_status qcal_safetensors_read_f32(const qcal_safetensors *st, int64_t i,
                                               int64_t start, int64_t count, float *dst);

/* Zero-copy access to a F32 tensor's bytes in the mapping (valid until close; possibly
 * unaligned for float: read with memcpy or unaligned loads). Other dtypes:
 * QCAL_ERR_UNSUPPORTED. */
QCAL_API qcal_status qcal_safetensors_raw(const qcal_safetensors *st, int64_t i,
                                          const void **bytes);

/* The bytes of tensor i in the mapping, any dtype (info.nbytes of them, little-endian as
 * stored; valid until close): what a writer copies unchanged. */
QCAL_API qcal_status qcal_safetensors_bytes(const qcal_safetensors *st, int64_t i,
                                            const void **bytes);

/* Tells the kernel that tensor i's pages will not be needed again (streaming readers call
 * it after each tensor so page cache can be reclaimed). Always succeeds on a valid index. */
QCAL_API qcal_status qcal_safetensors_release(const qcal_safetensors *st, int64_t i);

/* Writes n float32 tensors to path atomically (temporary file, then rename), in the given
 * order, names unique and non-empty. Header keys appear in that order, padded with spaces
 * to a multiple of 8 bytes. metadata: NULL, or n_meta key/value string pairs
 * (meta[2k] = key, meta[2k+1] = value) stored under "__metadata__". */
QCAL_API qcal_status qcal_safetensors_write_f32(const char *path, int64_t n,
                                                const char *const *names,
                                                const qcal_tensor *tensors,
                                                int64_t n_meta, const char *const *meta);

/* One tensor of a file being written: its name, dtype as safetensors spells it ("F32",
 * "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2", "I8", "U8", ..., "BOOL") and shape. */
typedef struct qcal_safetensors_desc {
    const char *name;
    const char *dtype;
    int32_t ndim;                      /* 0..QCAL_MAX_DIMS (0: a scalar, one element) */
    int64_t shape[QCAL_MAX_DIMS];
} qcal_safetensors_desc;

/* The first bytes of a file holding the n tensors of d, stored in this order with
 * consecutive data offsets: the 8-byte length and the JSON header (keys in the given order,
 * "__metadata__" first when n_meta > 0, padded with spaces to a multiple of 8). *out
 * (malloc'd, the caller frees it) gets *len bytes; *data_bytes the size of the data section
 * that must follow (each tensor's numel * dtype size bytes, in order). Streaming writers
 * (checkpoints larger than memory) write this, then each tensor's bytes. Unknown dtype,
 * empty, reserved or repeated names, bad shapes: QCAL_ERR_INVALID_ARG. */
QCAL_API qcal_status qcal_safetensors_header(int64_t n, const qcal_safetensors_desc *d,
                                             int64_t n_meta, const char *const *meta,
                                             void **out, size_t *len, int64_t *data_bytes);

/* Bytes per element of a safetensors dtype name (1 for F8_E4M3), 0 for an unknown name. */
QCAL_API int qcal_safetensors_dtype_size(const char *dtype);

#ifdef __cplusplus
}
#endif
#endif
