/* Internal to onnx/: the one graph index the passes share (qdq.c's list, expose and Q/DQ
 * rewrite, fold_bn.c, equalize.c, layer.c): every tensor name of a graph with who produces
 * it, who reads it and the constant behind it, and fresh names new in the whole model. */
#ifndef QCAL_ONNX_GRAPH_H
#define QCAL_ONNX_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "onnx.pb-c.h"

#include "core/internal.h"

/* ---- string map: name -> int64 (open addressing, keys borrowed, never removed; graph.c) ---- */
typedef struct onnx_map {
    const char **keys;
    int64_t *vals;
    size_t cap, len;
} onnx_map;

bool onnx_map_put(onnx_map *m, const char *key, int64_t val);   /* false: out of memory */
int64_t *onnx_map_get(const onnx_map *m, const char *key);      /* NULL when absent */
void onnx_map_free(onnx_map *m);

/* One tensor of the indexed graph. */
typedef struct onnx_tref {
    const char *name;            /* owned by the index: a rewrite may free the graph's strings */
    int64_t producer;            /* node index, -1 for inputs, initializers and names the graph
                                  * reads from an enclosing graph */
    int64_t n_cons;              /* consuming input slots of the graph's nodes */
    int64_t cons0;               /* the first consuming node, -1 */
    bool graph_in, graph_out;    /* a graph input; a graph output */
    bool sub_ref;                /* read inside a body of one of the graph's nodes (If, Loop, Scan) */
    Onnx__TensorProto *init;     /* initializer of that name, or the `value` tensor of the
                                  * Constant node that writes it (producer >= 0), or NULL */
} onnx_tref;

/* The tensors of one graph, numbered in the order first seen: graph inputs, initializers,
 * node inputs and outputs in node order, graph outputs. Fresh names need the names of the
 * whole model (the `model` graph given to onnx_gindex_build). */
typedef struct onnx_gindex {
    onnx_map names;              /* tensor name -> index into t */
    onnx_tref *t;
    int64_t n, cap;
    onnx_map used;               /* every name in the model, fresh ones included (model given) */
    bool has_used;
    char **owned;                /* interned names and fresh names */
    int64_t nowned;
} onnx_gindex;

/* The `value` tensor of a default-domain Constant node, else NULL. */
Onnx__TensorProto *onnx_constant_value(const Onnx__NodeProto *n);

/* Indexes graph g. model: the main graph of the model g belongs to, whose names (tensors,
 * nodes, value_info, in every body) fresh names avoid; NULL: no fresh names from x. On
 * failure x is empty (onnx_gindex_free is still fine). */
qcal_status onnx_gindex_build(const Onnx__GraphProto *g, const Onnx__GraphProto *model, onnx_gindex *x);
void onnx_gindex_free(onnx_gindex *x);
/* The index of name, -1 when the graph does not use it. */
int64_t onnx_gindex_find(const onnx_gindex *x, const char *name);
onnx_tref *onnx_gindex_get(const onnx_gindex *x, const char *name);
/* The initializer (or Constant value) behind name, directly or through Identity nodes of g
 * (*hops, may be NULL: how many; >= 100 when an Identity output in between has another
 * reader); NULL if none. */
onnx_tref *onnx_gindex_const(const onnx_gindex *x, const Onnx__GraphProto *g, const char *name, int64_t *hops);
/* A name used nowhere in the model, base + suffix, then "_1", "_2", ...; owned by x (NULL:
 * no memory, or x was built without the model's names). */
const char *onnx_gindex_fresh(onnx_gindex *x, const char *base, const char *suffix);

#endif
