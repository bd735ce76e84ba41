/* qcal's engine (include/qcal/engine.h): ONNX Runtime's C API, loaded at run time with
 * dlopen. The only file of qcal that knows ONNX Runtime's types and function table: no ORT
 * header is needed to build it. docs/engine.md describes the behaviour.
 *
 * The function table: OrtGetApiBase()->GetApi(1) returns `const OrtApi *`, a struct of
 * function pointers whose members are never reordered or removed (ORT's ABI promise); every
 * slot used here is in the version-1 block (0..101). Slot numbers counted from the top of
 * `struct OrtApi` in include/onnxruntime/core/session/onnxruntime_c_api.h (microsoft/
 * onnxruntime), CreateStatus being slot 0. A wrong slot crashes: each one is listed in
 * ort_slots below with its name and copied into a typed member of ort_api. One optional
 * slot lies beyond that block: AddSessionConfigEntry (130, the version-5 block, ONNX
 * Runtime 1.5; ORT's onnxruntime_c_api.cc asserts SetGlobalSpinControl at 149 after it),
 * taken only from a library whose version string says 1.5 or later.
 *
 * Lifetimes: every object holds a reference on its parent. An engine lives while it is open
 * or any session of it lives; a session while it is not destroyed or any run result of it
 * lives (the result's values may point into ORT's buffers, which belong to the session).
 * So qcal_engine_close never dlcloses ONNX Runtime under a live session. */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/engine.h"
#include "qcal/threads.h"

/* ---- ONNX Runtime's C API: the few declarations qcal needs ---- */

typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtSession OrtSession;
typedef struct OrtValue OrtValue;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtAllocator OrtAllocator;

enum { ORT_LOGGING_LEVEL_FATAL = 4 };        /* OrtLoggingLevel: VERBOSE 0 .. FATAL 4 */
enum { ORT_ONNX_TYPE_TENSOR = 1 };           /* ONNXType */
enum { ORT_ARENA_ALLOCATOR = 1 };            /* OrtAllocatorType */
enum { ORT_MEM_TYPE_DEFAULT = 0 };           /* OrtMemType */
enum { ORT_ELEM_STRING = 8 };                /* ONNXTensorElementDataType (ONNX's numbers) */

typedef struct OrtApiBase {
    const void *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

typedef void (*ort_logging_fn)(void *param, int severity, const char *category,
                               const char *logid, const char *code_location,
                               const char *message);

/* The slots of struct OrtApi used here (version-1 block). */
enum {
    SLOT_GetErrorMessage = 2,
    SLOT_CreateEnvWithCustomLogger = 4,
    SLOT_CreateSession = 7,
    SLOT_CreateSessionFromArray = 8,
    SLOT_Run = 9,
    SLOT_CreateSessionOptions = 10,
    SLOT_SetOptimizedModelFilePath = 11,
    SLOT_DisableCpuMemArena = 19,
    SLOT_SetSessionGraphOptimizationLevel = 23,
    SLOT_SetIntraOpNumThreads = 24,
    SLOT_SessionGetInputCount = 30,
    SLOT_SessionGetOutputCount = 31,
    SLOT_SessionGetInputTypeInfo = 33,
    SLOT_SessionGetOutputTypeInfo = 34,
    SLOT_SessionGetInputName = 36,
    SLOT_SessionGetOutputName = 37,
    SLOT_CreateTensorWithDataAsOrtValue = 49,
    SLOT_IsTensor = 50,
    SLOT_GetTensorMutableData = 51,
    SLOT_CastTypeInfoToTensorInfo = 55,
    SLOT_GetOnnxTypeFromTypeInfo = 56,
    SLOT_GetTensorElementType = 60,
    SLOT_GetDimensionsCount = 61,
    SLOT_GetDimensions = 62,
    SLOT_GetSymbolicDimensions = 63,
    SLOT_GetTensorTypeAndShape = 65,
    SLOT_CreateCpuMemoryInfo = 69,
    SLOT_AllocatorFree = 76,
    SLOT_GetAllocatorWithDefaultOptions = 78,
    SLOT_ReleaseEnv = 92,
    SLOT_ReleaseStatus = 93,
    SLOT_ReleaseMemoryInfo = 94,
    SLOT_ReleaseSession = 95,
    SLOT_ReleaseValue = 96,
    SLOT_ReleaseTypeInfo = 98,
    SLOT_ReleaseTensorTypeAndShapeInfo = 99,
    SLOT_ReleaseSessionOptions = 100,
    SLOT_COUNT_V1 = 102,
    SLOT_AddSessionConfigEntry = 130,   /* version 5 (ORT 1.5): optional, see above */
};

typedef struct ort_api {
    const char *(*GetErrorMessage)(const OrtStatus *);
    OrtStatus *(*CreateEnvWithCustomLogger)(ort_logging_fn, void *, int level, const char *logid,
                                            OrtEnv **);
    OrtStatus *(*CreateSession)(const OrtEnv *, const char *path, const OrtSessionOptions *,
                                OrtSession **);
    OrtStatus *(*CreateSessionFromArray)(const OrtEnv *, const void *data, size_t len,
                                         const OrtSessionOptions *, OrtSession **);
    OrtStatus *(*Run)(OrtSession *, const OrtRunOptions *, const char *const *input_names,
                      const OrtValue *const *inputs, size_t n_in,
                      const char *const *output_names, size_t n_out, OrtValue **outputs);
    OrtStatus *(*CreateSessionOptions)(OrtSessionOptions **);
    OrtStatus *(*SetOptimizedModelFilePath)(OrtSessionOptions *, const char *path);
    OrtStatus *(*DisableCpuMemArena)(OrtSessionOptions *);
    OrtStatus *(*SetSessionGraphOptimizationLevel)(OrtSessionOptions *, int level);
    OrtStatus *(*SetIntraOpNumThreads)(OrtSessionOptions *, int n);
    OrtStatus *(*SessionGetInputCount)(const OrtSession *, size_t *);
    OrtStatus *(*SessionGetOutputCount)(const OrtSession *, size_t *);
    OrtStatus *(*SessionGetInputTypeInfo)(const OrtSession *, size_t, OrtTypeInfo **);
    OrtStatus *(*SessionGetOutputTypeInfo)(const OrtSession *, size_t, OrtTypeInfo **);
    OrtStatus *(*SessionGetInputName)(const OrtSession *, size_t, OrtAllocator *, char **);
    OrtStatus *(*SessionGetOutputName)(const OrtSession *, size_t, OrtAllocator *, char **);
    OrtStatus *(*CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo *, void *data, size_t len,
                                                 const int64_t *shape, size_t rank, int type,
                                                 OrtValue **);
    OrtStatus *(*IsTensor)(const OrtValue *, int *);
    OrtStatus *(*GetTensorMutableData)(OrtValue *, void **);
    OrtStatus *(*CastTypeInfoToTensorInfo)(const OrtTypeInfo *,
                                           const OrtTensorTypeAndShapeInfo **);
    OrtStatus *(*GetOnnxTypeFromTypeInfo)(const OrtTypeInfo *, int *);
    OrtStatus *(*GetTensorElementType)(const OrtTensorTypeAndShapeInfo *, int *);
    OrtStatus *(*GetDimensionsCount)(const OrtTensorTypeAndShapeInfo *, size_t *);
    OrtStatus *(*GetDimensions)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t);
    OrtStatus *(*GetSymbolicDimensions)(const OrtTensorTypeAndShapeInfo *, const char **, size_t);
    OrtStatus *(*GetTensorTypeAndShape)(const OrtValue *, OrtTensorTypeAndShapeInfo **);
    OrtStatus *(*CreateCpuMemoryInfo)(int allocator_type, int mem_type, OrtMemoryInfo **);
    OrtStatus *(*AllocatorFree)(OrtAllocator *, void *);
    OrtStatus *(*GetAllocatorWithDefaultOptions)(OrtAllocator **);
    void (*ReleaseEnv)(OrtEnv *);
    void (*ReleaseStatus)(OrtStatus *);
    void (*ReleaseMemoryInfo)(OrtMemoryInfo *);
    void (*ReleaseSession)(OrtSession *);
    void (*ReleaseValue)(OrtValue *);
    void (*ReleaseTypeInfo)(OrtTypeInfo *);
    void (*ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo *);
    void (*ReleaseSessionOptions)(OrtSessionOptions *);
    /* NULL before ONNX Runtime 1.5 */
    OrtStatus *(*AddSessionConfigEntry)(OrtSessionOptions *, const char *key, const char *value);
} ort_api;

typedef void (*ort_any_fn)(void);

/* ort_api's members, slot by slot (offsetof keeps name and slot side by side). */
static const struct {
    int slot;
    size_t offset;
    const char *name;
} ort_slots[] = {
#define S(n) { SLOT_##n, offsetof(ort_api, n), #n }
    S(GetErrorMessage), S(CreateEnvWithCustomLogger), S(CreateSession),
    S(CreateSessionFromArray), S(Run), S(CreateSessionOptions), S(SetOptimizedModelFilePath), S(DisableCpuMemArena),
    S(SetSessionGraphOptimizationLevel), S(SetIntraOpNumThreads), S(SessionGetInputCount),
    S(SessionGetOutputCount), S(SessionGetInputTypeInfo), S(SessionGetOutputTypeInfo),
    S(SessionGetInputName), S(SessionGetOutputName), S(CreateTensorWithDataAsOrtValue),
    S(IsTensor), S(GetTensorMutableData), S(CastTypeInfoToTensorInfo),
    S(GetOnnxTypeFromTypeInfo), S(GetTensorElementType), S(GetDimensionsCount),
    S(GetDimensions), S(GetSymbolicDimensions), S(GetTensorTypeAndShape),
    S(CreateCpuMemoryInfo), S(AllocatorFree), S(GetAllocatorWithDefaultOptions),
    S(ReleaseEnv), S(ReleaseStatus), S(ReleaseMemoryInfo), S(ReleaseSession), S(ReleaseValue),
    S(ReleaseTypeInfo), S(ReleaseTensorTypeAndShapeInfo), S(ReleaseSessionOptions),
#undef S
};

/* ---- qcal's objects ---- */

struct qcal_engine {
    atomic_long refs;            /* 1 while open + 1 per live session */
    void *dl;
    ort_api ort;
    OrtEnv *env;
    OrtMemoryInfo *cpu;
    char *path;
    const char *version;
};

typedef struct engine_io {
    qcal_engine_io io;           /* io.name points at name */
    char *name;
    char *sym[QCAL_MAX_DIMS];    /* symbolic names of dynamic dims ("" when unnamed) */
} engine_io;

struct qcal_engine_session {
    atomic_long refs;            /* 1 until destroyed + 1 per live run result */
    qcal_engine *e;
    OrtSession *sess;
    int64_t n_in, n_out;
    engine_io *in, *out;
    const char **out_names;      /* n_out names, for a run of every output */
};

typedef struct engine_out {
    qcal_engine_value v;
    OrtValue *ort;               /* NULL when copied */
    void *copy;
} engine_out;

struct qcal_engine_outputs {
    qcal_engine_session *s;
    int64_t n;
    engine_out *v;
};

/* ---- helpers ---- */

/* Converts a non-NULL status into QCAL_ERR_BACKEND "what: ORT's message" and releases it. */
static qcal_status ort_fail(const qcal_engine *e, OrtStatus *st, const char *what)
{
    const char *msg = e->ort.GetErrorMessage(st);
    qcal_status r = qcal_error(QCAL_ERR_BACKEND, "%s: %s", what, msg ? msg : "(no message)");
    e->ort.ReleaseStatus(st);
    return r;
}

#define ORT_TRY(e, call, what)                                   \
    do {                                                         \
        OrtStatus *st_ = (call);                                 \
        if (st_) {                                               \
            rc = ort_fail((e), st_, (what));                     \
            goto done;                                           \
        }                                                        \
    } while (0)

size_t qcal_engine_elem_size(int32_t t)
{
    switch (t) {
    case 1: return 4;    /* float32 */
    case 2: return 1;    /* uint8 */
    case 3: return 1;    /* int8 */
    case 4: return 2;    /* uint16 */
    case 5: return 2;    /* int16 */
    case 6: return 4;    /* int32 */
    case 7: return 8;    /* int64 */
    case 9: return 1;    /* bool */
    case 10: return 2;   /* float16 */
    case 11: return 8;   /* float64 */
    case 16: return 2;   /* bfloat16 */
    }
    return 0;
}

const char *qcal_engine_elem_name(int32_t t)
{
    switch (t) {
    case 1: return "float32";
    case 2: return "uint8";
    case 3: return "int8";
    case 4: return "uint16";
    case 5: return "int16";
    case 6: return "int32";
    case 7: return "int64";
    case 8: return "string";
    case 9: return "bool";
    case 10: return "float16";
    case 11: return "float64";
    case 12: return "uint32";
    case 13: return "uint64";
    case 14: return "complex64";
    case 15: return "complex128";
    case 16: return "bfloat16";
    case 17: return "float8_e4m3fn";
    case 18: return "float8_e4m3fnuz";
    case 19: return "float8_e5m2";
    case 20: return "float8_e5m2fnuz";
    }
    return "unknown";
}

/* ---- loading ---- */

void qcal_engine_options_default(qcal_engine_options *opt)
{
    if (opt)
        memset(opt, 0, sizeof *opt);
}

/* ONNX Runtime's log messages go nowhere: a library does not print. (Warnings such as
 * "Removing initializer ..." would reach stderr through ORT's default logger at any level
 * below ERROR, and errors at ERROR; every failure reaches the caller as a status.) */
static void ort_log_discard(void *param, int severity, const char *category, const char *logid,
                            const char *code_location, const char *message)
{
    (void)param, (void)severity, (void)category, (void)logid, (void)code_location,
        (void)message;
}

#define NPM_TAIL "/node_modules/onnxruntime-node/bin/napi-v6/linux/x64/libonnxruntime.so.1"
#define HOW_TO_GET "./run.sh installs onnxruntime-node@1.30.0 from npm, or set QCAL_ORT_LIB / --ort-lib"

static void append(char *dst, size_t cap, const char *fmt, ...) QCAL_PRINTF(3, 4);
static void append(char *dst, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(dst);
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst + n, cap - n, fmt, ap);
    va_end(ap);
}

/* dlopen of one place; on failure appends "LABELPLACE (reason)" to tried. */
static void *try_open(const char *label, const char *place, char *tried, size_t cap)
{
    dlerror();
    void *h = dlopen(place, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        size_t n = strlen(place);
        if (why && !strncmp(why, place, n) && !strncmp(why + n, ": ", 2))
            why += n + 2;   /* "PATH: reason" -> "reason" */
        append(tried, cap, "%s%s%s (%s)", tried[0] ? "; " : "", label, place,
               why ? why : "not loaded");
    }
    return h;
}

/* Whether a "MAJOR.MINOR[.PATCH...]" version string is at least major.minor. */
static bool version_at_least(const char *v, long major, long minor)
{
    char *end;
    long ma = strtol(v, &end, 10);
    if (end == v || *end != '.')
        return false;
    const char *m = end + 1;
    long mi = strtol(m, &end, 10);
    if (end == m)
        return false;
    return ma > major || (ma == major && mi >= minor);
}

/* The path the loader actually used for h (falls back to what was asked for). */
static char *loaded_path(void *h, const char *asked)
{
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        return qcal_strdup(lm->l_name);
    return qcal_strdup(asked);
}

static void engine_release(qcal_engine *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
        return;
    if (e->cpu)
        e->ort.ReleaseMemoryInfo(e->cpu);
    if (e->env)
        e->ort.ReleaseEnv(e->env);
    if (e->dl)
        dlclose(e->dl);
    free(e->path);
    free(e);
}

qcal_status qcal_engine_open(const qcal_engine_options *opt, qcal_engine **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_open: out is NULL");
    char tried[3072] = "";
    char npm[2048];
    void *h = NULL;
    const char *asked = NULL;
    const char *given = opt ? opt->library : NULL;
    const char *env_lib = getenv("QCAL_ORT_LIB");
    if (given && given[0]) {
        h = try_open("", asked = given, tried, sizeof tried);
    } else if (env_lib && env_lib[0]) {
        h = try_open("$QCAL_ORT_LIB: ", asked = env_lib, tried, sizeof tried);
    } else {
        h = try_open("the loader's search path: ", asked = "libonnxruntime.so.1", tried,
                     sizeof tried);
        if (!h) {
            const char *dir = getenv("QCAL_NPM_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
                       *home = getenv("HOME");
            if (dir && dir[0])
                snprintf(npm, sizeof npm, "%s" NPM_TAIL, dir);
            else if (xdg && xdg[0])
                snprintf(npm, sizeof npm, "%s/qcal/npm" NPM_TAIL, xdg);
            else
                snprintf(npm, sizeof npm, "%s/.cache/qcal/npm" NPM_TAIL, home ? home : "");
            h = try_open("the npm cache: ", asked = npm, tried, sizeof tried);
        }
    }
    if (!h)
        return qcal_error(QCAL_ERR_NOT_FOUND, "cannot load ONNX Runtime: tried %s. %s", tried,
                          HOW_TO_GET);

    qcal_status rc = QCAL_OK;
    qcal_engine *e = qcal_calloc(1, sizeof *e);
    if (!e) {
        dlclose(h);
        return QCAL_ERR_NO_MEMORY;
    }
    atomic_init(&e->refs, 1);
    e->dl = h;
    e->path = loaded_path(h, asked);
    if (!e->path) {
        rc = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    const OrtApiBase *(*get_base)(void) = NULL;
    *(void **)&get_base = dlsym(h, "OrtGetApiBase");
    if (!get_base) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s' is not ONNX Runtime (it has no OrtGetApiBase). %s",
                        e->path, HOW_TO_GET);
        goto fail;
    }
    const OrtApiBase *base = get_base();
    const ort_any_fn *tbl = base && base->GetApi ? base->GetApi(1) : NULL;
    if (!tbl) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED,
                        "'%s' is not ONNX Runtime (OrtGetApiBase gives no API version 1). %s",
                        e->path, HOW_TO_GET);
        goto fail;
    }
    for (size_t i = 0; i < sizeof ort_slots / sizeof ort_slots[0]; i++) {
        ort_any_fn f = tbl[ort_slots[i].slot];
        if (!f) {
            rc = qcal_error(QCAL_ERR_UNSUPPORTED,
                            "'%s' is not ONNX Runtime (its API version 1 lacks %s)", e->path,
                            ort_slots[i].name);
            goto fail;
        }
        memcpy((char *)&e->ort + ort_slots[i].offset, &f, sizeof f);
    }
    e->version = base->GetVersionString ? base->GetVersionString() : NULL;
    if (!e->version)
        e->version = "unknown";
    if (version_at_least(e->version, 1, 5))
        memcpy(&e->ort.AddSessionConfigEntry, &tbl[SLOT_AddSessionConfigEntry],
               sizeof e->ort.AddSessionConfigEntry);
    ORT_TRY(e, e->ort.CreateEnvWithCustomLogger(ort_log_discard, NULL, ORT_LOGGING_LEVEL_FATAL,
                                                "qcal", &e->env),
            "ONNX Runtime: CreateEnv");
    ORT_TRY(e, e->ort.CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &e->cpu),
            "ONNX Runtime: CreateCpuMemoryInfo");
    *out = e;
    return QCAL_OK;
done:
fail:
    engine_release(e);
    return rc;
}

void qcal_engine_close(qcal_engine **e)
{
    if (!e || !*e)
        return;
    engine_release(*e);
    *e = NULL;
}

const char *qcal_engine_version(const qcal_engine *e)
{
    return e ? e->version : NULL;
}

const char *qcal_engine_library(const qcal_engine *e)
{
    return e ? e->path : NULL;
}

/* ---- sessions ---- */

void qcal_engine_session_options_default(qcal_engine_session_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->cpu_arena = true;
}

static void io_free(engine_io *io, int64_t n)
{
    if (!io)
        return;
    for (int64_t i = 0; i < n; i++) {
        free(io[i].name);
        for (int k = 0; k < QCAL_MAX_DIMS; k++)
            free(io[i].sym[k]);
    }
    free(io);
}

static void session_release(qcal_engine_session *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->sess)
        s->e->ort.ReleaseSession(s->sess);
    io_free(s->in, s->n_in);
    io_free(s->out, s->n_out);
    free(s->out_names);
    engine_release(s->e);
    free(s);
}

/* Name, type and shape of input (is_out false) or output i into *io. */
static qcal_status read_io(qcal_engine_session *s, bool is_out, size_t i, engine_io *io)
{
    qcal_engine *e = s->e;
    qcal_status rc = QCAL_OK;
    OrtAllocator *alloc = NULL;
    char *name = NULL;
    OrtTypeInfo *ti = NULL;
    const char *kind = is_out ? "output" : "input";
    ORT_TRY(e, e->ort.GetAllocatorWithDefaultOptions(&alloc), "ONNX Runtime: allocator");
    ORT_TRY(e, (is_out ? e->ort.SessionGetOutputName : e->ort.SessionGetInputName)(s->sess, i,
                                                                                  alloc, &name),
            "ONNX Runtime: session name");
    io->name = qcal_strdup(name);
    if (!io->name) {
        rc = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    io->io.name = io->name;
    io->io.elem_type = 0;
    io->io.ndim = -1;
    for (int k = 0; k < QCAL_MAX_DIMS; k++)
        io->io.dims[k] = -1;
    ORT_TRY(e, (is_out ? e->ort.SessionGetOutputTypeInfo : e->ort.SessionGetInputTypeInfo)(
                   s->sess, i, &ti),
            "ONNX Runtime: session type info");
    int onnx_type = 0;
    ORT_TRY(e, e->ort.GetOnnxTypeFromTypeInfo(ti, &onnx_type), "ONNX Runtime: type info");
    if (onnx_type != ORT_ONNX_TYPE_TENSOR)
        goto done;   /* not a tensor: elem_type 0, rank unknown */
    const OrtTensorTypeAndShapeInfo *tsi = NULL;
    ORT_TRY(e, e->ort.CastTypeInfoToTensorInfo(ti, &tsi), "ONNX Runtime: tensor info");
    if (!tsi)
        goto done;
    int et = 0;
    size_t nd = 0;
    ORT_TRY(e, e->ort.GetTensorElementType(tsi, &et), "ONNX Runtime: element type");
    ORT_TRY(e, e->ort.GetDimensionsCount(tsi, &nd), "ONNX Runtime: rank");
    io->io.elem_type = et;
    if (nd > QCAL_MAX_DIMS) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED, "%s '%s' has %zu dimensions (qcal takes at most %d)",
                        kind, io->name, nd, QCAL_MAX_DIMS);
        goto done;
    }
    const char *sym[QCAL_MAX_DIMS] = { 0 };
    ORT_TRY(e, e->ort.GetDimensions(tsi, io->io.dims, nd), "ONNX Runtime: dimensions");
    ORT_TRY(e, e->ort.GetSymbolicDimensions(tsi, sym, nd), "ONNX Runtime: dimensions");
    io->io.ndim = (int32_t)nd;
    for (size_t k = 0; k < nd; k++) {
        if (io->io.dims[k] < 0) {
            io->io.dims[k] = -1;
            io->sym[k] = qcal_strdup(sym[k] ? sym[k] : "");
            if (!io->sym[k]) {
                rc = QCAL_ERR_NO_MEMORY;
                goto done;
            }
        }
    }
done:
    if (ti)
        e->ort.ReleaseTypeInfo(ti);
    if (name)
        e->ort.AllocatorFree(alloc, name);   /* a failure here is ORT's own; nothing to do */
    return rc;
}

static qcal_status session_make(qcal_engine *e, const void *model, size_t len, const char *path,
                                const qcal_engine_session_options *opt,
                                qcal_engine_session **out)
{
    if (!e || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_create: engine or out is NULL");
    qcal_engine_session_options o;
    qcal_engine_session_options_default(&o);
    if (opt)
        o = *opt;
    if (o.optimization != 0 && o.optimization != 1 && o.optimization != 2 && o.optimization != 99)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "optimization level %d is not one of 0, 1, 2, 99", o.optimization);
    if (o.threads < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "thread count %d is negative", o.threads);
    int threads = o.threads > 0 ? o.threads : qcal_threads_count();
    if (threads < 1)
        threads = 1;

    qcal_status rc = QCAL_OK;
    OrtSessionOptions *so = NULL;
    qcal_engine_session *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    atomic_init(&s->refs, 1);
    atomic_fetch_add(&e->refs, 1);
    s->e = e;
    ORT_TRY(e, e->ort.CreateSessionOptions(&so), "ONNX Runtime: session options");
    ORT_TRY(e, e->ort.SetSessionGraphOptimizationLevel(so, o.optimization),
            "ONNX Runtime: optimization level");
    ORT_TRY(e, e->ort.SetIntraOpNumThreads(so, threads), "ONNX Runtime: thread count");
    if (!o.cpu_arena)
        ORT_TRY(e, e->ort.DisableCpuMemArena(so), "ONNX Runtime: memory arena");
    if (o.stop_spinning && e->ort.AddSessionConfigEntry)
        ORT_TRY(e, e->ort.AddSessionConfigEntry(so, "session.force_spinning_stop", "1"),
                "ONNX Runtime: session.force_spinning_stop");
    if (o.optimized_model_path && o.optimized_model_path[0])
        ORT_TRY(e, e->ort.SetOptimizedModelFilePath(so, o.optimized_model_path),
                "ONNX Runtime: optimized model path");
    if (path)
        ORT_TRY(e, e->ort.CreateSession(e->env, path, so, &s->sess), "ONNX Runtime refused the model");
    else
        ORT_TRY(e, e->ort.CreateSessionFromArray(e->env, model, len, so, &s->sess),
                "ONNX Runtime refused the model");
    size_t n_in = 0, n_out = 0;
    ORT_TRY(e, e->ort.SessionGetInputCount(s->sess, &n_in), "ONNX Runtime: input count");
    ORT_TRY(e, e->ort.SessionGetOutputCount(s->sess, &n_out), "ONNX Runtime: output count");
    s->in = qcal_calloc(n_in, sizeof *s->in);
    s->out = qcal_calloc(n_out, sizeof *s->out);
    s->out_names = qcal_calloc(n_out, sizeof *s->out_names);
    if (!s->in || !s->out || !s->out_names) {
        rc = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    for (size_t i = 0; i < n_in; i++) {
        s->n_in = (int64_t)i + 1;
        if ((rc = read_io(s, false, i, &s->in[i])) != QCAL_OK)
            goto done;
    }
    for (size_t i = 0; i < n_out; i++) {
        s->n_out = (int64_t)i + 1;
        if ((rc = read_io(s, true, i, &s->out[i])) != QCAL_OK)
            goto done;
        s->out_names[i] = s->out[i].name;
    }
done:
    if (so)
        e->ort.ReleaseSessionOptions(so);
    if (rc != QCAL_OK) {
        session_release(s);
        return rc;
    }
    *out = s;
    return QCAL_OK;
}

qcal_status qcal_engine_session_create(qcal_engine *e, const void *model, size_t len,
                                       const qcal_engine_session_options *opt,
                                       qcal_engine_session **out)
{
    if (!model || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_create: empty model buffer");
    return session_make(e, model, len, NULL, opt, out);
}

qcal_status qcal_engine_session_create_file(qcal_engine *e, const char *path,
                                            const qcal_engine_session_options *opt,
                                            qcal_engine_session **out)
{
    if (!path || !path[0])
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_create_file: no path");
    return session_make(e, NULL, 0, path, opt, out);
}

void qcal_engine_session_destroy(qcal_engine_session **s)
{
    if (!s || !*s)
        return;
    session_release(*s);
    *s = NULL;
}

int64_t qcal_engine_session_input_count(const qcal_engine_session *s)
{
    return s ? s->n_in : 0;
}

int64_t qcal_engine_session_output_count(const qcal_engine_session *s)
{
    return s ? s->n_out : 0;
}

static qcal_status get_io(const qcal_engine_session *s, int64_t i, bool is_out,
                          qcal_engine_io *out)
{
    if (!s || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_%s: session or out is NULL",
                          is_out ? "output" : "input");
    int64_t n = is_out ? s->n_out : s->n_in;
    if (i < 0 || i >= n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s %lld is outside [0, %lld)",
                          is_out ? "output" : "input", (long long)i, (long long)n);
    *out = (is_out ? s->out : s->in)[i].io;
    return QCAL_OK;
}

qcal_status qcal_engine_session_input(const qcal_engine_session *s, int64_t i, qcal_engine_io *out)
{
    return get_io(s, i, false, out);
}

qcal_status qcal_engine_session_output(const qcal_engine_session *s, int64_t i,
                                       qcal_engine_io *out)
{
    return get_io(s, i, true, out);
}

/* ---- runs ---- */

/* "float32 [N, 3, 48, W]" for a declared io (dynamic dims by symbolic name, "?" unnamed). */
static void fmt_declared(char *dst, size_t cap, const engine_io *io)
{
    dst[0] = '\0';
    append(dst, cap, "%s", qcal_engine_elem_name(io->io.elem_type));
    if (io->io.ndim < 0) {
        append(dst, cap, " (any shape)");
        return;
    }
    append(dst, cap, " [");
    int dyn = 0;
    for (int k = 0; k < io->io.ndim; k++) {
        if (io->io.dims[k] >= 0) {
            append(dst, cap, "%s%lld", k ? ", " : "", (long long)io->io.dims[k]);
        } else {
            append(dst, cap, "%s%s", k ? ", " : "", io->sym[k] && io->sym[k][0] ? io->sym[k] : "?");
            dyn++;
        }
    }
    append(dst, cap, "]");
    if (dyn) {
        append(dst, cap, " (");
        int j = 0;
        for (int k = 0; k < io->io.ndim; k++)
            if (io->io.dims[k] < 0)
                append(dst, cap, "%s%s", j++ ? ", " : "",
                       io->sym[k] && io->sym[k][0] ? io->sym[k] : "?");
        append(dst, cap, " dynamic)");
    }
}

static void fmt_given(char *dst, size_t cap, const qcal_engine_value *v)
{
    dst[0] = '\0';
    append(dst, cap, "%s [", qcal_engine_elem_name(v->elem_type));
    for (int k = 0; k < v->ndim && k < QCAL_MAX_DIMS; k++)
        append(dst, cap, "%s%lld", k ? ", " : "", (long long)v->dims[k]);
    append(dst, cap, "]");
}

static void fmt_names(char *dst, size_t cap, const engine_io *io, int64_t n)
{
    dst[0] = '\0';
    for (int64_t i = 0; i < n; i++)
        append(dst, cap, "%s'%s'", i ? ", " : "", io[i].name);
    if (!n)
        append(dst, cap, "none");
}

/* Checks given input v against the declared io (type, rank, static dims, byte size). */
static qcal_status check_input(const engine_io *io, const qcal_engine_value *v)
{
    char want[512], got[512];
    if (v->ndim < 0 || v->ndim > QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input '%s': rank %d is outside [0, %d]",
                          io->name, v->ndim, QCAL_MAX_DIMS);
    for (int k = 0; k < v->ndim; k++)
        if (v->dims[k] < 0)
            return qcal_error(QCAL_ERR_INVALID_ARG, "input '%s': dimension %d is %lld",
                              io->name, k, (long long)v->dims[k]);
    size_t es = qcal_engine_elem_size(io->io.elem_type);
    bool ok = v->elem_type == io->io.elem_type;
    /* ONNX Runtime reports an input declared without a shape as rank 0, like a scalar: rank
     * 0 is left to ONNX Runtime's own check (it refuses a scalar input given otherwise). */
    if (ok && io->io.ndim > 0) {
        ok = v->ndim == io->io.ndim;
        for (int k = 0; ok && k < v->ndim; k++)
            ok = io->io.dims[k] < 0 || io->io.dims[k] == v->dims[k];
    }
    if (!ok) {
        fmt_declared(want, sizeof want, io);
        fmt_given(got, sizeof got, v);
        return qcal_error(QCAL_ERR_MISMATCH, "input '%s': the model takes %s, given %s", io->name,
                          want, got);
    }
    if (!es)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "input '%s': the model takes %s tensors, which qcal does not exchange "
                          "with ONNX Runtime", io->name, qcal_engine_elem_name(io->io.elem_type));
    int64_t numel = 1;
    for (int k = 0; k < v->ndim; k++)
        if (!qcal_mul_i64(numel, v->dims[k], &numel))
            return qcal_error(QCAL_ERR_OVERFLOW, "input '%s': the element count overflows",
                              io->name);
    size_t bytes;
    if ((uint64_t)numel > SIZE_MAX || !qcal_mul_size((size_t)numel, es, &bytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "input '%s': the byte size overflows", io->name);
    if (bytes != v->nbytes) {
        fmt_given(got, sizeof got, v);
        return qcal_error(QCAL_ERR_MISMATCH, "input '%s': %s is %zu bytes, given %zu", io->name,
                          got, bytes, v->nbytes);
    }
    if (bytes && !v->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input '%s': data is NULL", io->name);
    return QCAL_OK;
}

static void outputs_release(qcal_engine_outputs *o)
{
    if (!o)
        return;
    qcal_engine *e = o->s->e;
    for (int64_t i = 0; i < o->n; i++) {
        if (o->v[i].ort)
            e->ort.ReleaseValue(o->v[i].ort);
        free(o->v[i].copy);
    }
    free(o->v);
    session_release(o->s);
    free(o);
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    if (!an || !bn || !a || !b)
        return false;
    return pa < pb + bn && pb < pa + an;
}

/* Fills o->v[i] from ORT's value (index i into o->v; the value's name already set). */
static qcal_status take_output(qcal_engine_outputs *o, int64_t i, const qcal_engine_value *inputs,
                               int64_t n_inputs)
{
    qcal_engine *e = o->s->e;
    engine_out *r = &o->v[i];
    qcal_status rc = QCAL_OK;
    OrtTensorTypeAndShapeInfo *tsi = NULL;
    int is_tensor = 0;
    ORT_TRY(e, e->ort.IsTensor(r->ort, &is_tensor), "ONNX Runtime: output");
    if (!is_tensor) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED, "output '%s' is not a tensor (a sequence, map or "
                        "optional): qcal takes tensors only", r->v.name);
        goto done;
    }
    ORT_TRY(e, e->ort.GetTensorTypeAndShape(r->ort, &tsi), "ONNX Runtime: output shape");
    int et = 0;
    size_t nd = 0;
    ORT_TRY(e, e->ort.GetTensorElementType(tsi, &et), "ONNX Runtime: output type");
    size_t es = qcal_engine_elem_size(et);
    if (!es) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED, "output '%s' is a %s tensor, which qcal does not "
                        "exchange with ONNX Runtime", r->v.name, qcal_engine_elem_name(et));
        goto done;
    }
    ORT_TRY(e, e->ort.GetDimensionsCount(tsi, &nd), "ONNX Runtime: output rank");
    if (nd > QCAL_MAX_DIMS) {
        rc = qcal_error(QCAL_ERR_UNSUPPORTED, "output '%s' has %zu dimensions (qcal takes at most %d)",
                        r->v.name, nd, QCAL_MAX_DIMS);
        goto done;
    }
    ORT_TRY(e, e->ort.GetDimensions(tsi, r->v.dims, nd), "ONNX Runtime: output dimensions");
    r->v.elem_type = et;
    r->v.ndim = (int32_t)nd;
    size_t numel = 1, bytes;
    for (size_t k = 0; k < nd; k++) {
        if (r->v.dims[k] < 0 || (uint64_t)r->v.dims[k] > SIZE_MAX ||
            !qcal_mul_size(numel, (size_t)r->v.dims[k], &numel)) {
            rc = qcal_error(QCAL_ERR_OVERFLOW, "output '%s': bad or overflowing shape", r->v.name);
            goto done;
        }
    }
    if (!qcal_mul_size(numel, es, &bytes)) {
        rc = qcal_error(QCAL_ERR_OVERFLOW, "output '%s': the byte size overflows", r->v.name);
        goto done;
    }
    void *data = NULL;
    ORT_TRY(e, e->ort.GetTensorMutableData(r->ort, &data), "ONNX Runtime: output data");
    r->v.data = data;
    r->v.nbytes = bytes;
    bool alias = false;
    for (int64_t k = 0; k < n_inputs && !alias; k++)
        alias = overlaps(data, bytes, inputs[k].data, inputs[k].nbytes);
    if (alias) {
        /* ORT hands back the caller's own input buffer for an output that is also a graph
         * input (onnxruntime#21922): copy it, the caller may free its input after the run. */
        size_t cap = (bytes + 63) / 64 * 64;
        r->copy = aligned_alloc(64, cap ? cap : 64);
        if (!r->copy) {
            rc = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes for output '%s'",
                            bytes, r->v.name);
            goto done;
        }
        memcpy(r->copy, data, bytes);
        r->v.data = r->copy;
        e->ort.ReleaseValue(r->ort);
        r->ort = NULL;
    }
done:
    if (tsi)
        e->ort.ReleaseTensorTypeAndShapeInfo(tsi);
    return rc;
}

qcal_status qcal_engine_session_run(qcal_engine_session *s, const qcal_engine_value *inputs,
                                    int64_t n_inputs, const char *const *outputs, int64_t n_outputs,
                                    qcal_engine_outputs **out)
{
    if (!s || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_run: session or out is NULL");
    if (n_inputs < 0 || (n_inputs > 0 && !inputs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_run: bad inputs (%lld)",
                          (long long)n_inputs);
    if (n_outputs < 0 || (n_outputs > 0 && !outputs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_session_run: bad output names (%lld)",
                          (long long)n_outputs);
    qcal_engine *e = s->e;
    char list[1024];

    /* Inputs: each given one names a model input, each model input given once. */
    for (int64_t i = 0; i < n_inputs; i++)
        if (!inputs[i].name)
            return qcal_error(QCAL_ERR_INVALID_ARG, "input %lld has no name", (long long)i);
    for (int64_t m = 0; m < s->n_in; m++) {
        int64_t found = -1;
        for (int64_t i = 0; i < n_inputs; i++) {
            if (strcmp(inputs[i].name, s->in[m].name))
                continue;
            if (found >= 0)
                return qcal_error(QCAL_ERR_INVALID_ARG, "input '%s' is given twice",
                                  s->in[m].name);
            found = i;
        }
        if (found < 0) {
            char want[512];
            fmt_declared(want, sizeof want, &s->in[m]);
            return qcal_error(QCAL_ERR_MISMATCH, "input '%s' (%s) is not given", s->in[m].name,
                              want);
        }
    }
    for (int64_t i = 0; i < n_inputs; i++) {
        int64_t m = 0;
        while (m < s->n_in && strcmp(inputs[i].name, s->in[m].name))
            m++;
        if (m == s->n_in) {
            fmt_names(list, sizeof list, s->in, s->n_in);
            return qcal_error(QCAL_ERR_NOT_FOUND, "input '%s': the model has no such input (its "
                              "inputs: %s)", inputs[i].name, list);
        }
        qcal_status rc = check_input(&s->in[m], &inputs[i]);
        if (rc != QCAL_OK)
            return rc;
    }

    /* Outputs wanted. */
    const char *const *names = outputs;
    int64_t n_out = n_outputs;
    if (!outputs && !n_outputs) {
        names = s->out_names;
        n_out = s->n_out;
    }
    for (int64_t i = 0; i < n_out; i++) {
        int64_t m = 0;
        while (m < s->n_out && (!names[i] || strcmp(names[i], s->out[m].name)))
            m++;
        if (m == s->n_out) {
            fmt_names(list, sizeof list, s->out, s->n_out);
            return qcal_error(QCAL_ERR_NOT_FOUND, "output '%s': the model has no such output "
                              "(its outputs: %s)", names[i] ? names[i] : "(null)", list);
        }
    }

    qcal_status rc = QCAL_OK;
    OrtValue **in_vals = qcal_calloc((size_t)n_inputs, sizeof *in_vals);
    const char **in_names = qcal_calloc((size_t)n_inputs, sizeof *in_names);
    OrtValue **out_vals = qcal_calloc((size_t)n_out, sizeof *out_vals);
    qcal_engine_outputs *o = qcal_calloc(1, sizeof *o);
    engine_out *ov = qcal_calloc((size_t)n_out, sizeof *ov);
    if (!in_vals || !in_names || !out_vals || !o || !ov) {
        free(o);
        free(ov);
        o = NULL;
        ov = NULL;
        rc = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    for (int64_t i = 0; i < n_inputs; i++) {
        static uint64_t empty;   /* ORT wants a non-NULL pointer even for 0 bytes */
        const qcal_engine_value *v = &inputs[i];
        void *p = v->nbytes ? (void *)(uintptr_t)v->data : (void *)&empty;
        in_names[i] = v->name;
        ORT_TRY(e, e->ort.CreateTensorWithDataAsOrtValue(e->cpu, p, v->nbytes, v->dims,
                                                         (size_t)v->ndim, v->elem_type,
                                                         &in_vals[i]),
                "ONNX Runtime: input tensor");
    }
    ORT_TRY(e, e->ort.Run(s->sess, NULL, in_names, (const OrtValue *const *)in_vals,
                          (size_t)n_inputs, names, (size_t)n_out, out_vals),
            "ONNX Runtime: run");
    atomic_fetch_add(&s->refs, 1);
    o->s = s;
    o->v = ov;
    o->n = n_out;
    for (int64_t i = 0; i < n_out; i++) {
        int64_t m = 0;
        while (strcmp(names[i], s->out[m].name))
            m++;
        ov[i].v.name = s->out[m].name;
        ov[i].ort = out_vals[i];
        out_vals[i] = NULL;
    }
    for (int64_t i = 0; i < n_out && rc == QCAL_OK; i++)
        rc = take_output(o, i, inputs, n_inputs);
    if (rc != QCAL_OK) {
        outputs_release(o);
        o = NULL;
        goto done;
    }
    *out = o;
    o = NULL;
done:
    if (o) {   /* failed before the result took its session reference */
        free(o->v ? o->v : ov);
        free(o);
    }
    for (int64_t i = 0; out_vals && i < n_out; i++)
        if (out_vals[i])
            e->ort.ReleaseValue(out_vals[i]);
    for (int64_t i = 0; in_vals && i < n_inputs; i++)
        if (in_vals[i])
            e->ort.ReleaseValue(in_vals[i]);
    free(in_vals);
    free(in_names);
    free(out_vals);
    return rc;
}

int64_t qcal_engine_outputs_count(const qcal_engine_outputs *o)
{
    return o ? o->n : 0;
}

qcal_status qcal_engine_outputs_at(const qcal_engine_outputs *o, int64_t i, qcal_engine_value *out)
{
    if (!o || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_outputs_at: result or out is NULL");
    if (i < 0 || i >= o->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output %lld is outside [0, %lld)", (long long)i,
                          (long long)o->n);
    *out = o->v[i].v;
    return QCAL_OK;
}

qcal_status qcal_engine_outputs_release(qcal_engine_outputs *o, int64_t i)
{
    if (!o)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_engine_outputs_release: result is NULL");
    if (i < 0 || i >= o->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output %lld is outside [0, %lld)", (long long)i,
                          (long long)o->n);
    engine_out *v = &o->v[i];
    if (v->ort)
        o->s->e->ort.ReleaseValue(v->ort);
    free(v->copy);
    v->ort = NULL;
    v->copy = NULL;
    v->v.data = NULL;
    v->v.nbytes = 0;
    return QCAL_OK;
}

void qcal_engine_outputs_free(qcal_engine_outputs **o)
{
    if (!o || !*o)
        return;
    outputs_release(*o);
    *o = NULL;
}
