/* qcal calibration sessions and tables.
 *
 * A session collects ranges for named tensors while a model runs. Each tapped tensor is
 * identified by its fqn (fully qualified name: "features.0", "fc1.weight", ...) and a role
 * (activation or weight); one observer per (fqn, role) is created on first sight from the
 * session's rules (first matching rule wins; otherwise the role's default config).
 *
 *   qcal_calib_rules *rules = NULL;
 *   qcal_calib_rules_load_file("rules.txt", &rules);           // optional
 *   qcal_calib_session_options opt;
 *   qcal_calib_session_options_default(&opt);
 *   opt.rules = rules;
 *   qcal_calib_session *s = NULL;
 *   qcal_calib_session_create(&opt, &s);
 *   for each batch b, for each tapped tensor t (any thread):
 *       qcal_calib_session_observe(s, t.fqn, QCAL_CALIB_ROLE_ACTIVATION, b, &t.tensor);
 *   qcal_calib_table *table = NULL;
 *   qcal_calib_session_table(s, &table);
 *   qcal_calib_table_write(table, QCAL_CALIB_FORMAT_TENSORRT, NULL, "model.cache");
 *
 * Determinism with threads. Several threads may call qcal_calib_session_observe on one session at
 * once (different or equal fqns). Each call carries a step (the batch index, >= 0). For each
 * (fqn, role) the session applies batches to the observer in ascending step order, so the
 * result equals a serial run that feeds steps 0, 1, 2, ... whatever the thread interleaving:
 *   - observers whose updates commute (qcal_observer_config_commutes: minmax and
 *     per_channel_minmax, whose min/max are exact) are updated at once under the entry's lock;
 *   - the others (moving averages, histogram family) apply a batch at once only when it is
 *     the next step; a batch that arrives early is copied into a pending queue (bounded by
 *     max_pending_bytes) and applied as soon as the steps before it arrived, or, if a step
 *     never comes (a gap), in step order by qcal_calib_session_flush / qcal_calib_session_table.
 * A step may be observed once per (fqn, role): a repeated or already passed step is
 * QCAL_ERR_INVALID_ARG. QCAL_STEP_AUTO (-1) numbers batches in call order per (fqn, role),
 * which is deterministic only when one thread feeds that (fqn, role).
 * Each (fqn, role) has its own lock (different layers proceed in parallel); names are found
 * through a hash map.
 *
 * Tables. qcal_calib_session_table snapshots every entry: the range qparams come from
 * (qcal_observer_qrange), the qparams and the counts. Tables are written as native JSON
 * (read back exactly by qcal_calib_table_read_json), a TensorRT calibration cache, an ONNX
 * Runtime calibration.cache or an ncnn .table (formats in docs/calibration.md). Every
 * output file is written atomically (temporary file, then rename). */
#ifndef QCAL_CALIB_H
#define QCAL_CALIB_H

#include "qcal/common.h"
#include "qcal/observer.h"
#include "qcal/qparams.h"
#include "qcal/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum qcal_calib_role {
    QCAL_CALIB_ROLE_ACTIVATION = 0,   /* "activation" */
    QCAL_CALIB_ROLE_WEIGHT = 1,       /* "weight" */
    QCAL_CALIB_ROLE_COUNT = 2
} qcal_calib_role;

/* Name of a role ("activation", "weight") or "unknown". */
QCAL_API const char *qcal_calib_role_name(qcal_calib_role role);

/* Parses "activation" / "weight" (also "act", "w"); QCAL_ERR_INVALID_ARG otherwise. */
QCAL_API qcal_status qcal_calib_role_parse(const char *name, qcal_calib_role *out);

/* Default observer config of a role: activations histogram, quint8 per_tensor_affine;
 * weights per_channel_minmax, qint8 per_channel_symmetric, axis 0. */
QCAL_API qcal_status qcal_calib_role_default_config(qcal_calib_role role, qcal_observer_config *out);

/* ---- Rules: ordered (glob on fqn, role, observer config) list, first match wins. ---- */

typedef struct qcal_calib_rules qcal_calib_rules;

/* Creates an empty rule list (*out owned by the caller). */
QCAL_API qcal_status qcal_calib_rules_create(qcal_calib_rules **out);

/* Destroys *rules (NULL is fine) and sets *rules to NULL. */
QCAL_API void qcal_calib_rules_destroy(qcal_calib_rules **rules);

/* Appends a rule. glob: fnmatch(3) pattern without flags ('*', '?', '[...]', '\' escapes;
 * '*' also matches '.'), copied. any_role true matches both roles (role is then ignored).
 * cfg is validated and copied. */
QCAL_API qcal_status qcal_calib_rules_add(qcal_calib_rules *rules, const char *glob,
                                          bool any_role, qcal_calib_role role,
                                          const qcal_observer_config *cfg);

/* Number of rules. */
QCAL_API qcal_status qcal_calib_rules_count(const qcal_calib_rules *rules, int64_t *n);

/* Config for (fqn, role): the first matching rule's, else qcal_calib_role_default_config.
 * *rule_index gets the matching rule's index or -1 (rule_index may be NULL). rules may be NULL. */
QCAL_API qcal_status qcal_calib_rules_match(const qcal_calib_rules *rules, const char *fqn,
                                            qcal_calib_role role, qcal_observer_config *cfg,
                                            int64_t *rule_index);

/* Parses a rules text of len bytes (need not be NUL-terminated). Format, one rule a line:
 *   GLOB ROLE OBSERVER [key=value ...]      # comment
 * ROLE: activation | weight | any. OBSERVER: a qcal_observer_kind_name. Keys and values:
 * the observer-config keys (qcal_observer_config_key), applied with
 * qcal_observer_config_apply as the CLI's observer options are. Blank lines and '#' comments are ignored; a
 * GLOB with spaces or '#' may be double-quoted ("a b*"). Errors are QCAL_ERR_FORMAT with
 * "line N: ..." in the message. */
QCAL_API qcal_status qcal_calib_rules_parse(const char *text, size_t len,
                                            qcal_calib_rules **out);

/* Reads and parses a rules file (errors name the file and the line). */
QCAL_API qcal_status qcal_calib_rules_load_file(const char *path, qcal_calib_rules **out);

/* ---- Sessions ---- */

#define QCAL_STEP_AUTO (-1)

typedef struct qcal_calib_session_options {
    const qcal_calib_rules *rules;  /* default NULL (role defaults only); copied at create */
    uint64_t max_pending_bytes;     /* default 1 GiB: memory for early batches waiting for
                                     * their turn (order-dependent observers); past it an
                                     * observe call fails with QCAL_ERR_NO_MEMORY */
    uint64_t max_memory;            /* default 2 GiB (QCAL_CALIB_MAX_MEMORY_DEFAULT), 0 = no
                                     * limit: the observers' estimated memory (the sum of
                                     * every entry's state plus the largest peak on top of it,
                                     * qcal_observer_config_memory); the observe call that
                                     * would create an entry past it fails with
                                     * QCAL_ERR_NO_MEMORY naming the entry, the estimate and
                                     * the limit, before allocating (entries loaded or merged
                                     * in count toward it and are never refused) */
    qcal_progress_fn progress;      /* default NULL: called by qcal_calib_session_table after
                                     * each entry's qparams (done, total, fqn), on the calling
                                     * thread */
    void *progress_user;            /* default NULL: passed to progress */
} qcal_calib_session_options;

#define QCAL_CALIB_MAX_MEMORY_DEFAULT ((uint64_t)2 << 30)

typedef struct qcal_calib_session qcal_calib_session;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_calib_session_options_default(qcal_calib_session_options *opt);

/* Creates a session (opt NULL = defaults); *out owned by the caller. */
QCAL_API qcal_status qcal_calib_session_create(const qcal_calib_session_options *opt, qcal_calib_session **out);

/* Destroys *s (NULL is fine) and sets *s to NULL. No call may be running on it. */
QCAL_API void qcal_calib_session_destroy(qcal_calib_session **s);

/* Feeds one batch x (read only, never kept beyond the call unless queued as a copy) of
 * the tensor fqn in the given role at the given step (>= 0, or QCAL_STEP_AUTO).
 * Thread-safe. The first call for (fqn, role) creates its observer from the rules; errors
 * of the observer (empty tensor, channel count change, non-finite policy) are returned
 * by the call that applies the batch and leave that entry unchanged. */
QCAL_API qcal_status qcal_calib_session_observe(qcal_calib_session *s, const char *fqn, qcal_calib_role role,
                                          int64_t step, const qcal_tensor *x);

/* Feeds a part of the batch at step (>= 0) of (fqn, role): parts with last false, then
 * the last one, give the entry what one qcal_calib_session_observe of the whole batch
 * gives, bit for bit (so a large batch can be streamed through a small buffer). Parts of
 * one step may come from several threads. Only for entries whose observer config splits
 * (qcal_observer_config_splits), else QCAL_ERR_UNSUPPORTED; a step already completed is
 * QCAL_ERR_INVALID_ARG. A part that fails (out of memory) leaves the parts before it
 * applied. Thread-safe. */
QCAL_API qcal_status qcal_calib_session_observe_part(qcal_calib_session *s, const char *fqn,
                                                    qcal_calib_role role, int64_t step,
                                                    const qcal_tensor *x, bool last);

/* Applies every queued batch in step order (steps that never came are skipped). The
 * first failure is returned (with the fqn and step in the message). Thread-safe. */
QCAL_API qcal_status qcal_calib_session_flush(qcal_calib_session *s);

/* Number of (fqn, role) entries. A read (it takes the session's lock internally, so it
 * may run while other threads observe). */
QCAL_API qcal_status qcal_calib_session_count(const qcal_calib_session *s, int64_t *n);

/* Counts of one entry: batches applied, elements applied, non-finite values skipped,
 * batches still queued. QCAL_ERR_NOT_FOUND if the session never saw (fqn, role).
 * Any output may be NULL. A read, locked like qcal_calib_session_count. */
QCAL_API qcal_status qcal_calib_session_stats(const qcal_calib_session *s, const char *fqn,
                                              qcal_calib_role role, uint64_t *batches,
                                              uint64_t *elements, uint64_t *nonfinite,
                                              uint64_t *pending);

/* ---- Session states (format: docs/state.md) ----
 * A session state ("QCSS") holds every entry (fqn, role, element count, observer state);
 * the rules are not part of it (each entry's config is). Split a calibration over runs,
 * processes or machines, save each session, merge them: for every order-independent kind
 * the merged session equals the session that saw all the data, bit for bit. */

/* Serialises the session into a new buffer (*buf, *len; free with qcal_free), entries in
 * (fqn bytes, role) order. Batches still queued for an earlier step are not state:
 * QCAL_ERR_STATE (call qcal_calib_session_flush first). */
QCAL_API qcal_status qcal_calib_session_save(const qcal_calib_session *s, void **buf, size_t *len);

/* Creates a session from a qcal_calib_session_save buffer; opt (NULL = defaults) applies to
 * entries created later (rules). Loaded entries keep their configs; their step counters
 * start again at 0. Malformed, truncated or inconsistent buffers are QCAL_ERR_FORMAT (the
 * message names the entry), other versions QCAL_ERR_UNSUPPORTED; *out untouched then. */
QCAL_API qcal_status qcal_calib_session_load(const void *buf, size_t len,
                                             const qcal_calib_session_options *opt,
                                             qcal_calib_session **out);

/* Folds src into dst (dst is flushed first): entries only in src are copied, entries in
 * both merged with qcal_observer_merge and their counts added. Everything is checked
 * before anything changes: a config mismatch (QCAL_ERR_MISMATCH) or two non-empty moving
 * averages (QCAL_ERR_UNSUPPORTED) leave dst as it was; the message names the entry and
 * the differing field with both values. src must have nothing queued (QCAL_ERR_STATE). */
QCAL_API qcal_status qcal_calib_session_merge(qcal_calib_session *dst,
                                              const qcal_calib_session *src);

/* Folds a copy of obs's state (obs stays the caller's; e.g. the observer qcal_numeric_eval
 * recommends for a tensor) into entry (fqn, role), adding `elements` to its count: a new
 * entry holding the copy, or merged into the existing one (qcal_observer_merge's checks).
 * The entry then equals one that observed obs's batches itself. Thread-safe. */
QCAL_API qcal_status qcal_calib_session_merge_observer(qcal_calib_session *s, const char *fqn,
                                                       qcal_calib_role role,
                                                       const qcal_observer *obs,
                                                       uint64_t elements);

/* qcal_calib_session_merge with src given as a session state buffer (no session built). */
QCAL_API qcal_status qcal_calib_session_merge_state(qcal_calib_session *dst, const void *buf,
                                                    size_t len);

/* qcal_calib_session_save to a file, written atomically (temporary file, then rename). */
QCAL_API qcal_status qcal_calib_session_save_file(const qcal_calib_session *s, const char *path);

/* qcal_calib_session_load from a file (messages name the file). */
QCAL_API qcal_status qcal_calib_session_load_file(const char *path,
                                                  const qcal_calib_session_options *opt,
                                                  qcal_calib_session **out);

/* SHA-256 (64 lower-case hex digits and a NUL into hex[65]) of the canonical session state:
 * the state with every observer's batches field set to 0. Equal sessions (same entries,
 * configs, observer states, element and non-finite counts) have equal digests however
 * their data was batched, split and merged. Queued batches: QCAL_ERR_STATE. */
QCAL_API qcal_status qcal_calib_session_digest(const qcal_calib_session *s, char hex[65]);

/* ---- Tables ---- */

/* One (fqn, role) row of a table. Everything belongs to the table (valid until it is
 * destroyed). The qparams embed dtype, qscheme, axis (per-channel schemes, else 0), the
 * effective integer range, the channel count and the scale(s) / zero-point(s) as a
 * qcal_qparams value (per-tensor: the scalars; per-channel: arrays owned by the table, so
 * never qcal_qparams_free them; zero_points_float only for the float-qparams scheme), ready
 * for qcal_quantize, qcal_fakequant_forward or the int8 builders. */
typedef struct qcal_calib_entry {
    const char *fqn;
    qcal_calib_role role;
    qcal_observer_kind observer;
    qcal_qparams qparams;         /* no data: scale 1, zero-point 0 */
    const float *min_val;         /* qparams.channels values: the range the qparams come from; no data: +inf */
    const float *max_val;         /* no data: -inf */
    uint64_t batches;             /* batches the observer saw */
    uint64_t elements;            /* elements in those batches */
    uint64_t nonfinite;           /* NaN/Inf values skipped */
    bool no_data;                 /* no finite value seen: scale 1, zero-point 0 */
} qcal_calib_entry;

typedef struct qcal_calib_table qcal_calib_table;

/* Flushes the session and snapshots every entry into a new table sorted by (fqn, role),
 * with the session's digest (qcal_calib_session_digest); the session stays usable. *out
 * owned by the caller. s is not const: the flush applies queued batches to the observers. */
QCAL_API qcal_status qcal_calib_session_table(qcal_calib_session *s, qcal_calib_table **out);

/* Destroys *t (NULL is fine) and sets *t to NULL. */
QCAL_API void qcal_calib_table_destroy(qcal_calib_table **t);

/* Number of entries. */
QCAL_API qcal_status qcal_calib_table_count(const qcal_calib_table *t, int64_t *n);

/* Entry i (0..count-1); *out points into the table. */
QCAL_API qcal_status qcal_calib_table_entry(const qcal_calib_table *t, int64_t i,
                                            const qcal_calib_entry **out);

/* Entry of (fqn, role); QCAL_ERR_NOT_FOUND if absent. */
QCAL_API qcal_status qcal_calib_table_find(const qcal_calib_table *t, const char *fqn,
                                           qcal_calib_role role, const qcal_calib_entry **out);

/* The digest of the session the table was made from (64 hex digits and a NUL into hex);
 * QCAL_NO_DATA (hex = "") for a table read from a JSON file without one. */
QCAL_API qcal_status qcal_calib_table_digest(const qcal_calib_table *t, char hex[65]);

/* The deployment profile the table was calibrated for: "ort" (ONNX Runtime) or "tensorrt"
 * (TensorRT 10), the names of qcal_onnx_profile_name; NULL or "" clears it (a table from a
 * session has none until set). Written to the native JSON table as "profile" and read back;
 * a consumer (qcal_onnx_qdq's caller, `qcal qdq`) can then refuse a table made for another
 * profile. Metadata of the table, not of the session: the digest does not cover it. Any
 * other name: QCAL_ERR_INVALID_ARG, the table unchanged. */
QCAL_API qcal_status qcal_calib_table_set_profile(qcal_calib_table *t, const char *profile);

/* The recorded profile ("ort", "tensorrt"), or NULL when none was recorded (t NULL too). */
QCAL_API const char *qcal_calib_table_profile(const qcal_calib_table *t);

/* amax of an entry's channel c: max(|min_val[c]|, |max_val[c]|), 0 when there is no data. */
QCAL_API qcal_status qcal_calib_entry_amax(const qcal_calib_entry *e, int64_t c, float *amax);

typedef enum qcal_calib_format {
    QCAL_CALIB_FORMAT_JSON = 0,          /* "json": native, every field, read back exactly */
    QCAL_CALIB_FORMAT_TENSORRT = 1,      /* "tensorrt": calibration cache, activations */
    QCAL_CALIB_FORMAT_ONNXRUNTIME = 2,   /* "onnxruntime": ONNX Runtime's calibration.json,
                                          * .flatbuffers and .cache, activations */
    QCAL_CALIB_FORMAT_NCNN = 3,          /* "ncnn": .table, weights then activations */
} qcal_calib_format;

/* Name of a format ("json", ...) or "unknown"; parse accepts those names. */
QCAL_API const char *qcal_calib_format_name(qcal_calib_format format);
QCAL_API qcal_status qcal_calib_format_parse(const char *name, qcal_calib_format *out);

/* Files a format writes into an output directory (qcal_calib_table_write_dir): 3 for
 * ONNX Runtime, 1 for the others; 0 for an unknown format. */
QCAL_API int qcal_calib_format_file_count(qcal_calib_format format);

/* Name of file i of a format in an output directory: json "qcal_table.json", tensorrt
 * "tensorrt.cache", onnxruntime "calibration.json", "calibration.flatbuffers",
 * "calibration.cache" (ONNX Runtime's names), ncnn "ncnn.table"; NULL out of range. */
QCAL_API const char *qcal_calib_format_file_name(qcal_calib_format format, int i);

/* Whether a format can hold a tensor name; if not, *why (if why is non-NULL) says what is
 * in the way ("a line break", "white space", "invalid UTF-8"). json holds any name;
 * tensorrt any name without a line break (readers split on the last ": "); onnxruntime and
 * ncnn no white space or line break either (space-separated), onnxruntime valid UTF-8. */
QCAL_API bool qcal_calib_format_holds_name(qcal_calib_format format, const char *name,
                                           const char **why);

/* TensorRT header algorithm that follows the table's activation observers:
 * "MinMaxCalibration" when every exported activation comes from a min/max kind (minmax,
 * moving_average_minmax and their per-channel forms), else "EntropyCalibration2" (entropy,
 * and histogram/percentile/mse, which TensorRT has no name for: the calibrator users load
 * caches with). Never NULL. */
QCAL_API const char *qcal_calib_table_trt_algorithm(const qcal_calib_table *t);

typedef struct qcal_calib_export_options {
    const char *trt_version;      /* default "8601" (TensorRT 8.6.1): header TRT-<version>-<algorithm>;
                                   * TensorRT 8.x: major*1000 + minor*100 + patch ("8601"),
                                   * 10.x: major*10000 + minor*100 + patch ("100300" for 10.3.0) */
    const char *trt_algorithm;    /* default NULL: qcal_calib_table_trt_algorithm(table) */
    bool skip_unrepresentable;    /* default false: a name the format cannot hold
                                   * (qcal_calib_format_holds_name) fails the export with one
                                   * QCAL_ERR_UNSUPPORTED listing them; true: left out */
} qcal_calib_export_options;

/* Fills *opt with the defaults documented on each field. */
QCAL_API void qcal_calib_export_options_default(qcal_calib_export_options *opt);

/* Formats file i of a format (see qcal_calib_format_file_name) into a new buffer (*buf,
 * *len; NUL-terminated after len bytes; the flatbuffer is binary: use *len); free with
 * qcal_free. opt NULL = defaults. */
QCAL_API qcal_status qcal_calib_table_format_file(const qcal_calib_table *t,
                                                  qcal_calib_format format, int i,
                                                  const qcal_calib_export_options *opt,
                                                  char **buf, size_t *len);

/* Formats the table's single text file (ONNX Runtime: calibration.cache only; all three:
 * qcal_calib_table_format_file) into a new NUL-terminated buffer (*buf, *len without the
 * NUL; free with qcal_free). */
QCAL_API qcal_status qcal_calib_table_format(const qcal_calib_table *t, qcal_calib_format format,
                                             const qcal_calib_export_options *opt, char **buf,
                                             size_t *len);

/* Writes the table in a format as `qcal calibrate --format F -o path` does: one-file formats
 * (json, tensorrt, ncnn) to the file path atomically (temporary file, then rename);
 * onnxruntime, whose format is three files, into the directory path (created if missing;
 * its parent must exist) as qcal_calib_table_write_dir(t, 1, &format, opt, path). */
QCAL_API qcal_status qcal_calib_table_write(const qcal_calib_table *t, qcal_calib_format format,
                                            const qcal_calib_export_options *opt,
                                            const char *path);

/* Entries a format writes of t into *n: json every entry; tensorrt and onnxruntime the
 * activations with data; ncnn the weights and activations with data; under
 * opt->skip_unrepresentable without the names the format cannot hold. opt NULL = defaults. */
QCAL_API qcal_status qcal_calib_table_export_count(const qcal_calib_table *t,
                                                   qcal_calib_format format,
                                                   const qcal_calib_export_options *opt,
                                                   int64_t *n);

/* Writes every file of each of the n formats into the directory dir (created if missing;
 * its parent must exist) under the names of qcal_calib_format_file_name, all or none:
 * everything is formatted first (any error, such as an unrepresentable name, writes
 * nothing, not even the directory), then written and synced to temporaries, and renamed
 * over the destinations only when all were written. Bytes equal those of
 * qcal_calib_table_format_file. */
QCAL_API qcal_status qcal_calib_table_write_dir(const qcal_calib_table *t, int64_t n,
                                                const qcal_calib_format *formats,
                                                const qcal_calib_export_options *opt,
                                                const char *dir);

/* Parses a native JSON table of len bytes and validates it (ranges, qparams, counts);
 * QCAL_ERR_FORMAT with the entry and field on failure. *out owned by the caller. */
QCAL_API qcal_status qcal_calib_table_parse_json(const char *text, size_t len,
                                                 qcal_calib_table **out);

/* Reads a native JSON table file (see qcal_calib_table_parse_json). */
QCAL_API qcal_status qcal_calib_table_read_json(const char *path, qcal_calib_table **out);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_CALIB_DECLARED
#include "qcal/deprecated.h"
#endif
