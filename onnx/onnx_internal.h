/* Internal to onnx/: the handle around protobuf-c's ModelProto and the helpers the passes
 * share (tensor data: tensor.c; lookups: inspect.c; builders: build.c; the graph index:
 * onnx/graph.h). The reader's own declarations are in onnx/load.h, the writer's lazy
 * initializers in onnx/save.h. The generated onnx.pb-c.h is seen by onnx/ only. */
#ifndef QCAL_ONNX_INTERNAL_H
#define QCAL_ONNX_INTERNAL_H

#include <sys/types.h>

#include "onnx.pb-c.h"

#include "core/internal.h"
#include "onnx/graph.h"
#include "qcal/onnx.h"

/* A model read from a file keeps the file mapped: the large raw_data of its main-graph
 * initializers point into the mapping instead of being copied (protobuf-c is given the
 * message without them), and a save copies those bytes file to file (copy_file_range).
 * Main-graph initializers in external data point into a mapping of their data file the
 * same way (one mapping per file). Such raw_data is never freed by protobuf-c:
 * onnx_tensor_release detaches it first. */
typedef struct onnx_src {
    int fd;                    /* the file (read only), or -1 (then saves write from the map) */
    const uint8_t *map;        /* its mapping */
    size_t len;
    dev_t dev;                 /* identity of the file (an external data file mapped once) */
    ino_t ino;
} onnx_src;

struct qcal_onnx_model {
    Onnx__ModelProto *proto;   /* every field malloc'ed (protobuf-c's default allocator) */
    onnx_src *src;             /* mapped files raw_data may point into (model, external data) */
    size_t n_src;
};

/* Raw data from this size on is cut out of the shell the reader unpacks (load.c) and
 * copied file to file by the writer (save.c). The fuzz build lowers it
 * (-DONNX_BLOB_MIN=16) so that inputs of a few KiB exercise the cut. */
#ifndef ONNX_BLOB_MIN
#define ONNX_BLOB_MIN ((size_t)1 << 16)
#endif

/* The mapped file ptr lies in, or NULL. */
const onnx_src *onnx_src_of(const qcal_onnx_model *m, const void *ptr);

/* True when ptr lies in one of the model's file mappings (not to be freed or written). */
bool onnx_in_map(const qcal_onnx_model *m, const void *ptr);

/* Detaches t's raw_data when it lies in the mapping (before t is freed or its data
 * replaced); owned data is left for the caller to free. */
void onnx_tensor_release(const qcal_onnx_model *m, Onnx__TensorProto *t);

/* Scratch bytes onnx_raw_view needs beyond the length viewed. */
#define ONNX_VIEW_SLACK ((size_t)8192)

/* Points *view at bytes [off, off + len) of t's raw_data, to be read as float32: the bytes in
 * place (a file mapping's pages read where they are) when 4-byte aligned, else a copy into
 * scratch (len + ONNX_VIEW_SLACK bytes). */
qcal_status onnx_raw_view(const Onnx__TensorProto *t, size_t off, size_t len, uint8_t *scratch,
                          const float **view);

/* Done reading t's raw_data for now: when it lies in a file mapping, the mapping's pages over
 * it are dropped (they stay in the page cache and are mapped again if read), so a pass that
 * reads every weight once does not keep the whole file resident. */
void onnx_raw_drop(const qcal_onnx_model *m, const Onnx__TensorProto *t);

/* s, or "" for NULL (names in messages). */
static inline const char *onnx_str_or_empty(const char *s)
{
    return s ? s : "";
}

/* Bytes per element of an ONNX element type; 0 when unknown or sub-byte. */
size_t onnx_elem_size(int32_t type);

/* Expected byte size of the tensor's data (numel elements of its type, 4-bit types two per
 * byte); false when the type's size is unknown here (strings, newer types) or too large. */
bool onnx_tensor_expected_bytes(const Onnx__TensorProto *t, int64_t numel, uint64_t *bytes);

/* memcpy with 16-byte vector moves, for bytes read from a file mapping (tensor.c). */
void onnx_copy_vec(uint8_t *restrict dst, const uint8_t *restrict src, size_t n);

/* numel of a TensorProto's dims; false on a negative dim or overflow. */
bool onnx_tensor_numel(const Onnx__TensorProto *t, int64_t *numel);

/* The tensor's data as contiguous little-endian bytes of its element type: raw_data as is,
 * typed fields converted into a new buffer (*owned, free it). */
qcal_status onnx_tensor_bytes(const Onnx__TensorProto *t, const uint8_t **data, size_t *len,
                              void **owned);

/* The tensor converted to float32 (new buffer, numel values). */
qcal_status onnx_tensor_to_float(const Onnx__TensorProto *t, float **out, int64_t *numel);

/* Default-domain opset version or -1. */
int64_t onnx_model_opset(const Onnx__ModelProto *mp);

/* Builders (malloc'ed, owned by the model they are put into). */
Onnx__TensorProto *onnx_new_tensor(const char *name, int32_t type, int32_t ndim,
                                   const int64_t *dims, const void *data, size_t nbytes);
/* The same taking data (malloc'ed, nbytes) as the tensor's raw_data; NULL (data still the
 * caller's) when out of memory. */
Onnx__TensorProto *onnx_new_tensor_take(const char *name, int32_t type, int32_t ndim, const int64_t *dims,
                                        void *data, size_t nbytes);
Onnx__NodeProto *onnx_new_node(const char *op_type, const char *name, int64_t n_in,
                               const char *const *in, int64_t n_out, const char *const *out);
/* Appends attribute `name` of that type, no value set yet, to n; NULL (nothing appended)
 * when out of memory. */
Onnx__AttributeProto *onnx_node_add_attr(Onnx__NodeProto *n, const char *name,
                                         Onnx__AttributeProto__AttributeType type);
bool onnx_node_add_int(Onnx__NodeProto *n, const char *attr, int64_t v);
bool onnx_push(void ***array, size_t *n, void *item);   /* appends; false: out of memory */

/* Appends the external_data entry key = value to t; false: out of memory. */
bool onnx_tensor_add_entry(Onnx__TensorProto *t, const char *key, const char *value);

/* The initializer of that name in g (not its subgraphs), or NULL. */
const Onnx__TensorProto *onnx_graph_init(const Onnx__GraphProto *g, const char *name);

/* Attribute `name` of a node or NULL. */
const Onnx__AttributeProto *onnx_node_attr(const Onnx__NodeProto *n, const char *name);

/* Declared type/shape of a name in graph g (inputs, outputs, value_info, initializers);
 * returns the ValueInfo's TypeProto tensor type (or NULL) and fills desc. */
bool onnx_graph_desc(const Onnx__GraphProto *g, const char *name, qcal_onnx_tensor_desc *desc);

/* Type proto for a graph output of desc (elem_type 0 -> float32). */
Onnx__ValueInfoProto *onnx_new_value_info(const char *name, const qcal_onnx_tensor_desc *desc);

/* ---- element types (onnx/types.c) ---- */

/* The element type of every tensor of a graph whose type can be known: declared (graph
 * inputs, outputs, value_info), initializers, Constant values, then propagated through the
 * default-domain ops in node order (Shape/Size/NonZero int64, comparisons bool, Cast its
 * `to`, If/Loop/Scan their bodies' outputs, other ops output 0 as input 0, ...). Names a
 * graph does not define are looked up in `up` (the enclosing graph's; may be NULL). Keys
 * are borrowed from g: valid while g's strings are. */
typedef struct onnx_types {
    onnx_map map;                /* name -> ONNX element type (known ones only) */
    onnx_map *defined;           /* names defined in this graph */
    const struct onnx_types *up;
} onnx_types;

qcal_status onnx_types_build(const Onnx__GraphProto *g, const struct onnx_types *up, onnx_types *ty);
void onnx_types_free(onnx_types *ty);
/* The element type of name, 0 when unknown. */
int32_t onnx_type_get(const onnx_types *ty, const char *name);

/* ---- weight layers for the rewrites (onnx/layer.c; used by fold_bn.c and equalize.c) ---- */
#include "qcal/ptq.h"

/* A Conv or Gemm seen as a qcal_ptq_layer: float32 weight (and bias) initializers copied
 * out (Gemm's weight transposed to [out, in] when transB = 0), written back by
 * onnx_layer_store. */
typedef struct onnx_layer {
    int64_t node;
    bool gemm, trans;            /* Gemm; its weight is stored [in, out] */
    Onnx__TensorProto *wt, *bt;  /* weight and bias initializers (bt NULL: none yet) */
    qcal_ptq_layer l;            /* l.weight, l.bias: malloc'ed; l.bias always present */
} onnx_layer;

/* Reads node n as a layer. QCAL_ERR_UNSUPPORTED with *why (static text or into why_buf of
 * 256 bytes) when it cannot be rewritten safely: weights not float32 initializers, shared
 * with another node (allowed with read_only: the layer is not to be stored), Gemm with
 * alpha/beta != 1 or transA, unknown shapes. */
qcal_status onnx_layer_load(const qcal_onnx_model *m, const onnx_gindex *x, int64_t n, bool read_only,
                            onnx_layer *out, char *why_buf);
/* Writes l's weight and bias back (a new bias initializer and node input when there was
 * none; new names from x). */
qcal_status onnx_layer_store(qcal_onnx_model *m, onnx_gindex *x, onnx_layer *l);
void onnx_layer_free(onnx_layer *l);

/* Names a graph reads (node inputs, also inside subgraphs, and graph outputs), copied: taken
 * before a rewrite, so onnx_prune_orphans removes only what the rewrite left unread. */
typedef struct onnx_reads {
    char **names;
    size_t n;
    onnx_map set;              /* keys: names */
} onnx_reads;
qcal_status onnx_reads_take(const Onnx__GraphProto *g, onnx_reads *r);
void onnx_reads_free(onnx_reads *r);
/* Removes the main graph's Constant, Identity and Cast nodes and initializers (not graph
 * inputs) whose outputs were read before (in `before`) and are read by nothing now, until
 * none is left (a Constant behind a Cast goes with it); counts in *nodes, *inits (or NULL).
 * A graph the rewrite orphaned nothing in is left as it was. */
qcal_status onnx_prune_orphans(qcal_onnx_model *m, const onnx_reads *before, int64_t *nodes, int64_t *inits);

/* Replaces initializer t's data with numel float32 values (raw, copied). */
qcal_status onnx_init_set_float(qcal_onnx_model *m, Onnx__TensorProto *t, const float *data, int64_t numel);

#endif
