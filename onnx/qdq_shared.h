/* Internal to onnx/'s Q/DQ pass: the plan shared by its files. qdq_plan.c decides which ops
 * and tensors are quantized and why others stay float (asking qdq_lookup.c for the op table,
 * tensor indexes, constants and exclusions), qdq_act.c the activations' qparams
 * (table, fused Relu / Clip, MaxPool chains), qdq_weight.c and qdq_bias.c the weights and
 * int32 biases (lazy ones computed during the save), qdq_rewrite.c inserts the Q/DQ nodes,
 * expose.c lists and exposes the tensors a profile quantizes, qdq.c holds the entry points
 * and the weight pass that runs beside the save. */
#ifndef QCAL_ONNX_QDQ_SHARED_H
#define QCAL_ONNX_QDQ_SHARED_H

#include "onnx/onnx_internal.h"

#define OOM() qcal_error(QCAL_ERR_NO_MEMORY, "out of memory")

/* ---- op classes (the table: qdq_plan.c) ---- */

typedef enum op_kind {
    K_CONV,      /* Conv: X, W (axis 0), B */
    K_CONVT,     /* ConvTranspose: X, W (axis 1), B */
    K_GEMM,      /* Gemm: A, B (weight: axis 0 with transB=1, else 1), C */
    K_MATMUL,    /* MatMul: A, B (weight [K, N]: axis 1) */
    K_BINARY,    /* Add, Mul: two activation inputs */
    K_POOL,      /* AveragePool, GlobalAveragePool: one input, own output range */
    K_MOVE,      /* MaxPool and shape ops: the output keeps the input's qparams (ort) */
    K_ACT,       /* Clip: never quantized alone; ort fuses it into the output Q of the quantized
                  * op it follows (qdq_fused_clip), as Relu */
} op_kind;

typedef struct op_def {
    const char *op;
    op_kind kind;
    bool ort, tensorrt;   /* quantized by default in the profile */
} op_def;

#define N_OP_DEFS 15   /* op_defs[] */

/* ---- the plan of each tensor ---- */

/* What the plan knows of tensor i of the graph index (p->x.t[i]: producer, readers,
 * initializer or Constant; onnx/graph.h) beyond it. */
typedef struct tinfo {
    const char *name;          /* the index's (p->x.t[i].name) */
    Onnx__TensorProto *init;   /* the index's constant, or an initializer of an enclosing
                                * graph (outer) */
    bool data;                 /* carries data: depends on a graph input through more than
                                * shapes (not an initializer, a Constant, shape arithmetic) */
    bool untyped;              /* read as an activation, element type unknown (noted once) */
    bool outer;                /* an initializer of an enclosing graph (If bodies) */
    /* plan */
    bool assigned;             /* activation qparams decided */
    bool missing;              /* looked up, not in the table */
    bool listed;               /* looked up (listed) */
    qcal_dtype dtype;
    float scale;
    int32_t zp;
    bool rename;               /* ort graph output: the producer writes a new name */
    char *q_out, *dq_out, *pre;/* names of the Q output, DQ output, renamed producer output */
    char *scale_name, *zp_name;
} tinfo;

typedef struct wplan {
    int64_t t;                 /* tinfo of the weight initializer */
    int32_t axis;
    qcal_dtype dtype;          /* qint8, or the FP8 dtype of an FP8 node's activation */
    int64_t channels;
    float *scales;             /* channels */
    int8_t *zps;               /* channels: qint8 zero-points (0 for symmetric schemes and FP8) */
    bool per_tensor;           /* scalar scale and zero-point, no axis */
    uint8_t *codes;            /* ort: quantized weight (numel bytes: int8 or FP8 codes) */
    float *f32;                /* tensorrt: float32 copy when the weight is not float32 */
    int64_t numel;
    char *dq_out;
    int64_t lazy;              /* its lazy_w (qcal_onnx_qdq_save_file: scales and, ort, codes
                                * computed as the save reaches them), -1: computed here */
} wplan;

typedef struct bplan {
    int64_t t;
    int64_t n;
    float *scales;
    int32_t *codes;
    char *dq_out;
    int64_t lazy;              /* its lazy_b (computed after its weight), -1: computed here */
} bplan;

typedef struct nplan {
    bool quant;
    int nact;
    int act[2];                /* input slots read as activations */
    int wslot, bslot;          /* weight / bias slots (-1) */
    int64_t w;                 /* wplan index or -1 */
    int64_t b;                 /* bplan index or -1 */
    bool via;                  /* an Identity between a planned weight or bias and its reader */
    bool gone;                 /* removed by the rewrite (a hoisted Constant, an Identity
                                * nothing reads any more) */
} nplan;

/* The lazy initializers of qcal_onnx_qdq_save_file (onnx_lazy): a float32 weight whose zero-points
 * are zero whatever its data is planned by size; its scales (and, ort, codes) and those of
 * the int32 biases that read them are computed by the save's pass, weight by weight in plan
 * order, and handed to the writer as it reaches each initializer (lazy_fill). */
typedef struct lazy_w {
    int64_t w;                 /* its wplan; -1: computed during planning after all */
    Onnx__TensorProto src;     /* the weight's TensorProto as planned (shallow: its data, dims
                                * and name stay alive with the plan, p->dropped; a save with
                                * external data detaches the model's raw_data meanwhile) */
    Onnx__TensorProto *scale_t, *codes_t;   /* the initializers it fills (codes_t: ort) */
    uint8_t *scale_dst, *codes_dst;         /* their bytes (channels floats; numel codes) */
    struct lazy_pass *pass;    /* the save's pass (set before it starts) */
} lazy_w;

typedef struct lazy_b {
    int64_t b;                 /* its bplan; -1: computed during planning after all */
    int64_t lw;                /* the lazy_w whose scales it reads */
    float s_in;                /* the input's scale */
    float *vals;               /* the bias as float32 (n) */
    Onnx__TensorProto *codes_t, *scales_t;
    uint8_t *codes_dst, *scales_dst;
} lazy_b;

#define MAX_SCOPES 16

typedef struct plan {
    struct plan *root;         /* the main graph's plan: fresh names for every graph */
    const struct plan *up;     /* the plan of the enclosing graph (If bodies), else NULL */
    onnx_types ty;             /* element types (planning only: keys borrowed from g) */
    onnx_gindex x;             /* the graph index (its names owned: valid through the rewrite);
                                * the root's makes the fresh names of every graph */
    char **untyped;            /* activation inputs of unknown element type (borrowed) */
    int64_t nuntyped;
    const Onnx__GraphProto *scope[MAX_SCOPES];   /* enclosing graphs, innermost first */
    int nscope;
    const qcal_onnx_model *m;
    const qcal_onnx_qdq_options *opt;
    const qcal_calib_table *table;   /* NULL: listing (every qdq_lookup succeeds) */
    Onnx__GraphProto *g;
    tinfo *t;                  /* t[i]: the plan of x.t[i] */
    int64_t nt;                /* x.n */
    nplan *np;
    wplan *w;
    int64_t nw;
    bplan *b;
    int64_t nb;
    bool enabled[N_OP_DEFS];
    char **list;               /* looked-up names in order (borrowed) */
    int64_t nlist;
    char **skipped;
    int64_t nskipped;
    bool fp8;                  /* an FP8 Q/DQ is written (opset >= 19, IR >= 9) */
    char **owned_names;        /* names of hoisted Constant values, kept for the lazy weights */
    bool lazy;                 /* qcal_onnx_qdq_save_file: weights may be lazy (lazy_w) */
    lazy_w *lw;
    int64_t nlw;
    lazy_b *lb;
    int64_t nlb;
    bool serial;               /* observe on this thread only (the save's pass) */
    Onnx__TensorProto **dropped;   /* lazy weights' float initializers the rewrite took out of
                                    * the graph: freed with the plan, after the pass */
    size_t ndropped;
    uint8_t *scratch;          /* misaligned float32 weights copied for reading, reused */
    size_t scratch_cap;        /* bytes */
    int64_t nowned;
} plan;

/* If bodies (then_branch / else_branch, up to MAX_SCOPES levels deep): one plan each, built
 * like the main graph's. Their ops are quantized in their own graph; weights they read from an enclosing
 * graph are quantized into the body's initializers. Loop and Scan bodies stay float. */
typedef struct subplans {
    plan **p;
    size_t n;
} subplans;

/* ---- qdq_plan.c ---- */

/* The plan of the main graph of m: ops selected (opt->op_types or the profile's), the graph
 * indexed, every node planned (table NULL: listing, every lookup succeeds); lazy: weights may
 * be lazy (qcal_onnx_qdq_save_file). On failure p is still to be freed (qdq_plan_free). */
qcal_status qdq_plan_build(plan *p, const qcal_onnx_model *m, const qcal_calib_table *table,
                           const qcal_onnx_qdq_options *opt, bool lazy);
void qdq_plan_free(plan *p);

/* The plans of the If bodies of g (nested ones too, up to MAX_SCOPES levels) appended to
 * *out, each built like the main graph's; encl: g's plan, scope: g's enclosing graphs. */
qcal_status qdq_collect_subplans(plan *root, const plan *encl, const Onnx__GraphProto *g,
                                 const Onnx__GraphProto *const *scope, int nscope, subplans *out);
void qdq_subplans_free(subplans *s);

/* The options checked (profile, exclude list, weight observer and qscheme). */
qcal_status qdq_check_opts(const qcal_onnx_model *m, const qcal_onnx_qdq_options *opt);

/* ---- qdq_lookup.c: the op table, the graph and the options as the plan reads them ---- */

/* p->enabled from the options' op types (or the profile's defaults); an unknown type is an
 * error naming the known ones. */
qcal_status qdq_select_ops(plan *p);

/* The index of name in p's graph, -1. */
int64_t qdq_tensor_index(const plan *p, const char *name);

/* The Constant node whose value is tensor t's constant, -1 (an initializer, or none). */
int64_t qdq_const_node(const plan *p, int64_t t);

/* The tensor holding the constant behind name: an initializer or a Constant's value,
 * directly or through Identity nodes (torch writes deduplicated parameters so); -1. */
int64_t qdq_const_src(const plan *p, const char *name);

/* name matches one of the --exclude patterns (fnmatch). */
bool qdq_excluded(const plan *p, const char *name);

/* The enabled op class of node n (default domain), or NULL. */
const op_def *qdq_op_of(const plan *p, const Onnx__NodeProto *n);

/* A default-domain If node. */
bool qdq_is_if(const Onnx__NodeProto *n);

/* ---- qdq_act.c ---- */

/* Looks up a tensor's activation qparams; false (and ti->missing) when the table lacks it. */
qcal_status qdq_lookup(plan *p, int64_t t, bool *found);

/* The single Relu that consumes t (ort fuses it), or -1. */
int64_t qdq_fused_relu(plan *p, int64_t t);

/* ort: the single Clip that consumes t, when Clip is an enabled op type and its bounds are
 * constants around 0 (a uint8 / int8 Q range always holds 0, so only then can it lie inside
 * [min, max] and ONNX Runtime's ClipQuantFusion remove the Clip); its bounds in *lo, *hi.
 * Else -1. */
int64_t qdq_fused_clip(plan *p, int64_t t, float *lo, float *hi);

/* ort, a fused Clip(lo, hi): the Q after the Clip takes the Clip output's qparams when their
 * Q range lies inside [lo, hi] (ONNX Runtime then removes the Clip); otherwise that range
 * clamped to [lo, hi] gives new affine qparams of the same type (zero-point at the type's
 * lowest value when lo = 0, as the Relu output's), the scale lowered just enough for the
 * range's ends to stay inside the bounds in float arithmetic. FP8 entries are left alone (ONNX
 * Runtime has no integer kernel to fuse them into). */
qcal_status qdq_clip_qparams(tinfo *ti, float lo, float hi);

/* ort: the output of the MaxPool chain that starts at t (each MaxPool the single consumer of
 * the tensor before it), else t. The output Q of the op that writes t takes that tensor's
 * table entry: max-pool commutes with per-tensor quantization, so the error the next op sees
 * is the error on the pool's output, and the pool's output (the maxima, fewer values near 0)
 * is the distribution to calibrate; the ReLU output before the pool would make KL (entropy)
 * clip the maxima (measured on the demo CNN: 1.05 instead of 2.01). Shape ops (Flatten,
 * Reshape, ...) move values without changing their distribution and are not followed. */
int64_t qdq_move_chain_end(plan *p, int64_t t);

/* ---- qdq_weight.c ---- */

/* Appends *x (size bytes) to *arr of *n elements (doubling at powers of two). */
bool qdq_push_rec(void **arr, int64_t *n, const void *x, size_t size);

/* Lazy weight l observed now (weight_compute): its scales into its wplan's and, once the
 * rewrite made it, its scale initializer; (ort) its codes into its buffer (the wplan's
 * before the rewrite takes it, then the quantized initializer's data). The weight's pages
 * of the file mapping are let go after. */
qcal_status qdq_lazy_run(plan *p, lazy_w *l);

/* The weight of node n at tensor t (wplan *out, shared by the nodes reading t alike; lazy
 * with p->lazy when its zero-points are 0 whatever its data, else observed now), then the
 * weight's pages of the file mapping are let go (onnx_raw_drop). QCAL_ERR_MISMATCH (no
 * message): t is already planned with another axis or dtype. */
qcal_status qdq_plan_weight(plan *p, const Onnx__NodeProto *n, int64_t t, int32_t axis,
                            qcal_dtype dtype, int64_t *out);

/* ---- qdq_bias.c ---- */

/* Lazy bias l quantized now that its weight's scales are known (bias_compute), into its
 * bplan's buffers and, once the rewrite made them, its initializers. */
qcal_status qdq_bias_run(plan *p, lazy_b *l);

/* Lazy weight k and the lazy biases that read its scales. */
qcal_status qdq_lazy_job(plan *p, int64_t k);

/* int32 bias (ort) of the weight p->w[wi]: scale[c] = s_in * s_w[c], zero-point 0. *out -1
 * and *why set to keep it float. With a lazy weight the bias is planned by size and is lazy
 * too (lazy_b: quantized after the weight, qdq_bias_run), or the weight is observed now (an
 * input scale outside BIAS_LAZY_MIN_S_IN .. BIAS_LAZY_MAX_S_IN). */
qcal_status qdq_plan_bias(plan *p, int64_t t, float s_in, int64_t wi, int64_t out_channels,
                          int64_t *out, const char **why);

/* ---- qdq_rewrite.c ---- */

/* *slot replaced by a copy of with (the old string freed); false: out of memory, *slot kept. */
bool qdq_replace_str(char **slot, const char *with);

/* The plan applied to its graph: Q/DQ nodes and their initializers inserted, counts into rep. */
qcal_status qdq_apply(plan *p, qcal_onnx_qdq_report *rep);

/* The float weights and biases of enclosing graphs that If bodies now read quantized: dropped
 * from the graph that holds them when nothing in the model reads them any more. */
qcal_status qdq_drop_outer_weights(subplans *sub);

#endif
