/* qcal calibration data for a model: files of named arrays matched against the model's
 * inputs, checked before anything runs, and read run by run.
 *
 *   qcal_dataset *ds = NULL;
 *   qcal_dataset_open("calib/", NULL, model_inputs, n_inputs, NULL, &ds);
 *   for (int64_t f = 0; f < qcal_dataset_file_count(ds); f++) {
 *       qcal_dataset_file_info info;
 *       qcal_dataset_file_get(ds, f, &info);
 *       for (int64_t s = 0; s < info.samples; s += step) {     // step: see below
 *           qcal_dataset_batch *b = NULL;
 *           qcal_dataset_read(ds, f, s, n, &b);
 *           ... qcal_dataset_batch_values(b) ... (one value per model input, model order)
 *           qcal_dataset_batch_free(&b);
 *       }
 *   }
 *   qcal_dataset_close(&ds);
 *
 * What a data spec can be (docs/data.md):
 *   - a .npz or .safetensors file: one batch, arrays keyed by input name (a model with one
 *     input also takes a file holding exactly one array, whatever its key);
 *   - a .npy file: one batch of the model's only input, or of the input named by the file's
 *     stem (x.npy -> input "x");
 *   - a directory: when it holds NAME.npy for every required input, it is one batch of
 *     those; else every .npz / .safetensors / .npy file in it (sorted by name, bytes) and
 *     every subdirectory holding NAME.npy files is one batch, as above;
 *   - `NAME=PATH` entries (the CLI's --input): PATH (a .npy file, or a directory of .npy
 *     files in name order) gives input NAME; a single file is used for every batch, several
 *     files zip with the other inputs' batches by index.
 * Element types: float32, float16, float64, int64, int32, bool, uint8, int8 (.npy dtype
 * '|b1' is bool), as the model declares them: a file whose dtype differs from the model's
 * is refused (no silent casts).
 * Samples: an array of the model input's rank whose first model dimension is dynamic holds
 * dims[0] samples (a run may take any contiguous part of them); an array of rank + 1 holds
 * dims[0] samples of exactly the model's shape, one per run; an array of the model's rank
 * with a static first dimension is one sample. Every required input of one batch file has
 * the same number of samples, or one (broadcast to every run). */
#ifndef QCAL_DATASET_H
#define QCAL_DATASET_H

#include "qcal/common.h"
#include "qcal/engine.h"
#include "qcal/npz.h"   /* the .npz reader, declared here before 0.2.0 */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct qcal_dataset qcal_dataset;
typedef struct qcal_dataset_batch qcal_dataset_batch;

/* A model input the data is matched against (qcal_engine_session_input gives them). */
typedef qcal_engine_io qcal_dataset_input;

typedef struct qcal_dataset_options {
    const char *const *optional;  /* default NULL: names of inputs the files may leave out
                                   * (a recurrent model's carried state: the caller fills
                                   * them); such a value is absent (data NULL) in a batch */
    int64_t n_optional;           /* default 0 */
} qcal_dataset_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_dataset_options_default(qcal_dataset_options *opt);

/* Opens the data: spec (a path as above; may be NULL when entries cover every input) and
 * entries ("NAME=PATH", n_entries of them), matched against the model's inputs[n_inputs]
 * (copied). Reads every file's header (not its data) and checks names, element types,
 * ranks, static dimensions and sample counts first: a mismatch is QCAL_ERR_MISMATCH with one
 * line naming the file, the input, what the model wants and what the file has; a missing
 * input or an array the model does not take: QCAL_ERR_MISMATCH too; unreadable files
 * QCAL_ERR_NOT_FOUND / QCAL_ERR_IO; malformed ones QCAL_ERR_FORMAT; an empty spec
 * (no batch) QCAL_ERR_EMPTY. *out owned by the caller. */
QCAL_API qcal_status qcal_dataset_open(const char *spec, const char *const *entries,
                                       int64_t n_entries, const qcal_dataset_input *inputs,
                                       int64_t n_inputs, const qcal_dataset_options *opt,
                                       qcal_dataset **out);

/* Closes *ds (NULL is fine) and sets *ds to NULL. */
QCAL_API void qcal_dataset_close(qcal_dataset **ds);

/* Number of batch files. */
QCAL_API int64_t qcal_dataset_file_count(const qcal_dataset *ds);

typedef struct qcal_dataset_file_info {
    const char *path;       /* the file (or directory) of the batch, for messages */
    int64_t samples;        /* samples it holds (see above) */
    bool splittable;        /* true: a run may take any n >= 1 consecutive samples (every
                             * batched input has a dynamic first dimension); false: one
                             * sample per run */
    uint64_t sample_bytes;  /* bytes of every input for one sample */
} qcal_dataset_file_info;

/* Batch file i (0-based). */
QCAL_API qcal_status qcal_dataset_file_get(const qcal_dataset *ds, int64_t i,
                                           qcal_dataset_file_info *out);

/* Reads samples [first, first + n) of batch file i into *out (owned by the caller): one
 * value per model input, in the order of the inputs given to qcal_dataset_open, with the
 * shape the model takes (a rank + 1 array's sample without its leading axis; n must be 1
 * unless the file is splittable). Broadcast inputs are the same values in every batch. */
QCAL_API qcal_status qcal_dataset_read(qcal_dataset *ds, int64_t i, int64_t first, int64_t n,
                                       qcal_dataset_batch **out);

/* The values of a batch (n_inputs of them; pointers valid until qcal_dataset_batch_free). */
QCAL_API const qcal_engine_value *qcal_dataset_batch_values(const qcal_dataset_batch *b);

/* Frees a batch (NULL is fine) and sets *b to NULL. */
QCAL_API void qcal_dataset_batch_free(qcal_dataset_batch **b);

#ifdef __cplusplus
}
#endif
#endif
