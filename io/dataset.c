/* Calibration data for a model: a data spec and NAME=PATH entries resolved into batch files,
 * checked against the model's inputs from their headers, then read run by run. See
 * include/qcal/dataset.h and docs/data.md.
 *
 * Open: every batch file's headers are read (.npy header, .npz central directory and each
 * member's .npy header, .safetensors JSON header) and kept as one ds_array per (batch,
 * input). Read: the byte range of the samples wanted, straight from the file (pread of a
 * .npy or of a stored .npz member, the safetensors mapping); a deflated .npz member is
 * inflated once and kept with the open archive until a read of another batch file closes it
 * (so the consecutive parts of a run cost one inflation). Files are opened again on the first
 * read of their batch, and their headers must still say what they said at open. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "io/npy_internal.h"
#include "io/npz_internal.h"
#include "qcal/dataset.h"
#include "qcal/safetensors.h"

enum { SRC_NPY = 1, SRC_NPZ, SRC_ST };
/* How an array holds its samples (include/qcal/dataset.h): SPLIT, the model's rank with a
 * dynamic first dimension (dims[0] samples, any part per run); STACK, rank + 1 (dims[0]
 * samples of the model's shape; also when the model's first dimension is dynamic, which is
 * ambiguous: the extra leading axis wins); ONE, the whole array is one sample (the model's
 * rank with a static first dimension, or a model input of unknown rank). */
enum { MODE_SPLIT, MODE_STACK, MODE_ONE };

typedef struct ds_array {
    int src;
    char *path;               /* the file */
    char *key;                /* .npz member / safetensors tensor name; NULL for .npy */
    int64_t index;            /* .npz member index at open */
    int32_t elem_type, ndim;
    int64_t dims[QCAL_MAX_DIMS];
    uint64_t data_off;        /* .npy: the data's offset in the file */
    int mode;
    int64_t samples;
    uint64_t sample_bytes;    /* bytes of one sample (the whole array for ONE) */
} ds_array;

typedef struct ds_file {
    char *path;
    ds_array **arr;           /* n_inputs; NULL: an optional input the files leave out */
    int64_t samples;
    bool splittable;
    uint64_t sample_bytes;
} ds_file;

typedef struct ds_handle {
    const char *path;         /* borrowed from a ds_array */
    int src;
    int fd;
    qcal_npz *npz;
    qcal_safetensors *st;
} ds_handle;

struct qcal_dataset {
    int64_t n_inputs;
    qcal_dataset_input *inputs;   /* names point into the strings below */
    char **names;
    bool *optional;
    bool *by_entry;               /* given by a NAME=PATH entry */
    ds_array **pool;              /* every array, owned here (batches share broadcast ones) */
    int64_t n_pool, cap_pool;
    ds_file *files;
    int64_t n_files, cap_files;
    int64_t open_file;            /* batch whose files are open in h (-1: none) */
    ds_handle *h;
    int64_t n_h;
};

struct qcal_dataset_batch {
    qcal_engine_value *v;
    int64_t n;
    void **bufs;
    char *names;
};

/* ---- small helpers ---- */

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] == '/';
    char *p = qcal_malloc(a + b + 2);
    if (p)
        snprintf(p, a + b + 2, "%s%s%s", dir, slash ? "" : "/", name);
    return p;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && !strcmp(s + a - b, suffix);
}

static int32_t safetensors_elem(const char *d)
{
    static const struct { const char *name; int32_t t; } map[] = {
        { "F32", 1 }, { "U8", 2 }, { "I8", 3 }, { "I16", 5 }, { "I32", 6 }, { "I64", 7 },
        { "BOOL", 9 }, { "F16", 10 }, { "F64", 11 }, { "BF16", 16 },
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(d, map[i].name))
            return map[i].t;
    return 0;
}

/* "float32 [?, 3, 48, ?]" (dynamic dims as '?'; ndim -1: "float32 of any shape"). */
static void fmt_type(char *buf, size_t cap, int32_t t, int32_t ndim, const int64_t *dims)
{
    size_t n = (size_t)snprintf(buf, cap, "%s ", qcal_engine_elem_name(t));
    if (ndim < 0) {
        snprintf(buf + n, cap - n, "of any shape");
        return;
    }
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int32_t i = 0; i < ndim && n < cap; i++) {
        if (dims[i] < 0)
            n += (size_t)snprintf(buf + n, cap - n, i ? ", ?" : "?");
        else
            n += (size_t)snprintf(buf + n, cap - n, i ? ", %" PRId64 : "%" PRId64, dims[i]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* "a, b, c" of names into buf (truncated with "..."). */
static void fmt_names(char *buf, size_t cap, const char *const *names, int64_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int64_t i = 0; i < n && at + 8 < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= cap - at) {
            snprintf(buf + (cap > 4 ? cap - 4 : 0), cap > 4 ? 4 : cap, "...");
            return;
        }
        at += (size_t)w;
    }
    if (n == 0)
        snprintf(buf, cap, "none");
}

static int64_t input_index(const qcal_dataset *ds, const char *name)
{
    for (int64_t i = 0; i < ds->n_inputs; i++)
        if (!strcmp(ds->names[i], name))
            return i;
    return -1;
}

static void array_free(ds_array *a)
{
    if (!a)
        return;
    free(a->path);
    free(a->key);
    free(a);
}

/* Adds a to the pool (which owns it from then on, even on failure). */
static qcal_status pool_add(qcal_dataset *ds, ds_array *a)
{
    if (ds->n_pool == ds->cap_pool) {
        int64_t cap = ds->cap_pool ? ds->cap_pool * 2 : 16;
        ds_array **p = realloc(ds->pool, (size_t)cap * sizeof *p);
        if (!p) {
            array_free(a);
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the dataset's array list");
        }
        ds->pool = p;
        ds->cap_pool = cap;
    }
    ds->pool[ds->n_pool++] = a;
    return QCAL_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_list(char **v, int64_t n)
{
    for (int64_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

/* A sorted (strcmp) list of the names in dir, hidden entries left out. */
static qcal_status list_dir(const char *dir, char ***out, int64_t *n_out)
{
    DIR *d = opendir(dir);
    if (!d)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot open the directory '%s': %s", dir, strerror(errno));
    char **v = NULL;
    int64_t n = 0, cap = 0;
    struct dirent *e;
    qcal_status st = QCAL_OK;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **p = realloc(v, (size_t)cap * sizeof *p);
            if (!p) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot list '%s'", dir);
                break;
            }
            v = p;
        }
        if (!(v[n] = qcal_strdup(e->d_name))) {
            st = QCAL_ERR_NO_MEMORY;
            break;
        }
        n++;
    }
    closedir(d);
    if (st != QCAL_OK) {
        free_list(v, n);
        return st;
    }
    if (n > 1)
        qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    *n_out = n;
    return QCAL_OK;
}

/* ---- header checks ---- */

/* Checks array a (from the file `where`) against model input j and sets its mode, samples
 * and sample_bytes. */
static qcal_status check_array(const qcal_dataset *ds, const char *where, int64_t j, ds_array *a)
{
    const qcal_dataset_input *in = &ds->inputs[j];
    bool ok = a->elem_type == in->elem_type && qcal_engine_elem_size(a->elem_type) > 0;
    int mode = MODE_ONE;
    if (ok && in->ndim >= 0) {
        int32_t r = in->ndim, lead = 0;
        if (a->ndim == r + 1) {
            mode = MODE_STACK;
            lead = 1;
        } else if (a->ndim == r) {
            mode = r > 0 && in->dims[0] < 0 ? MODE_SPLIT : MODE_ONE;
        } else {
            ok = false;
        }
        for (int32_t d = 0; ok && d < r; d++)
            if (in->dims[d] >= 0 && a->dims[d + lead] != in->dims[d])
                ok = false;
    }
    if (!ok) {
        char want[400], have[400];
        fmt_type(want, sizeof want, in->elem_type, in->ndim, in->dims);
        fmt_type(have, sizeof have, a->elem_type, a->ndim, a->dims);
        return qcal_error(QCAL_ERR_MISMATCH, "%s: input '%s': the model takes %s, the file has %s",
                          where, in->name, want, have);
    }
    int64_t numel = 1, bytes;
    for (int32_t d = 0; d < a->ndim; d++)
        if (!qcal_mul_i64(numel, a->dims[d], &numel))
            return qcal_error(QCAL_ERR_OVERFLOW, "%s: input '%s': the shape's product overflows",
                              where, in->name);
    if (numel == 0) {
        char have[400];
        fmt_type(have, sizeof have, a->elem_type, a->ndim, a->dims);
        return qcal_error(QCAL_ERR_EMPTY, "%s: input '%s': the array is empty (%s): no sample to "
                          "calibrate with", where, in->name, have);
    }
    if (!qcal_mul_i64(numel, (int64_t)qcal_engine_elem_size(a->elem_type), &bytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "%s: input '%s': the array's size overflows", where,
                          in->name);
    a->mode = mode;
    a->samples = mode == MODE_ONE ? 1 : a->dims[0];
    a->sample_bytes = (uint64_t)bytes / (uint64_t)a->samples;
    return QCAL_OK;
}

static ds_array *array_new(qcal_dataset *ds, int src, const char *path, const char *key)
{
    ds_array *a = qcal_calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->src = src;
    a->path = qcal_strdup(path);
    a->key = key ? qcal_strdup(key) : NULL;
    if (!a->path || (key && !a->key)) {
        array_free(a);
        return NULL;
    }
    if (pool_add(ds, a) != QCAL_OK)
        return NULL;
    return a;
}

static void set_shape(ds_array *a, int32_t ndim, const int64_t *dims)
{
    a->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++)
        a->dims[d] = dims[d];
}

/* A .npy file's array (header only). */
static qcal_status npy_array(qcal_dataset *ds, const char *path, ds_array **out)
{
    qcal_npy_array info;
    uint64_t off = 0;
    qcal_status st = qcal_npy_file_header(path, &info, &off);
    if (st != QCAL_OK)
        return st;
    ds_array *a = array_new(ds, SRC_NPY, path, NULL);
    if (!a)
        return QCAL_ERR_NO_MEMORY;
    a->elem_type = qcal_npy_dtype_onnx(info.dtype);
    set_shape(a, info.ndim, info.shape);
    a->data_off = off;
    *out = a;
    return QCAL_OK;
}

/* Stem of a path's last component without its extension ("d/x.npy" -> "x"), in buf. */
static void stem(const char *path, char *buf, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(buf, cap, "%s", b);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf)
        *dot = '\0';
}

typedef struct found_list {
    ds_array **a;
    char **names;
    int64_t n, cap;
} found_list;

static qcal_status found_add(found_list *f, ds_array *a, const char *name)
{
    if (f->n == f->cap) {
        int64_t cap = f->cap ? f->cap * 2 : 8;
        ds_array **pa = realloc(f->a, (size_t)cap * sizeof *pa);
        if (pa)
            f->a = pa;
        char **pn = realloc(f->names, (size_t)cap * sizeof *pn);
        if (pn)
            f->names = pn;
        if (!pa || !pn)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow an array list");
        f->cap = cap;
    }
    if (!(f->names[f->n] = qcal_strdup(name)))
        return QCAL_ERR_NO_MEMORY;
    f->a[f->n++] = a;
    return QCAL_OK;
}

static void found_free(found_list *f)
{
    free_list(f->names, f->n);
    free(f->a);
}

/* The arrays of one batch container: a .npy, .npz or .safetensors file, or (src 0) a
 * directory of NAME.npy files. */
static qcal_status gather(qcal_dataset *ds, const char *path, int src, found_list *f)
{
    qcal_status st = QCAL_OK;
    char nm[4096];
    if (src == SRC_NPY) {
        ds_array *a = NULL;
        if ((st = npy_array(ds, path, &a)) != QCAL_OK)
            return st;
        stem(path, nm, sizeof nm);
        return found_add(f, a, nm);
    }
    if (src == SRC_NPZ) {
        qcal_npz *z = NULL;
        if ((st = qcal_npz_open_internal(path, &z)) != QCAL_OK)
            return st;
        int64_t n = 0;
        const qcal_npz_member *m = qcal_npz_members(z, &n);
        for (int64_t i = 0; i < n && st == QCAL_OK; i++) {
            ds_array *a = array_new(ds, SRC_NPZ, path, m[i].name);
            if (!a) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            a->index = i;
            a->elem_type = qcal_npy_dtype_onnx(m[i].info.dtype);
            set_shape(a, m[i].info.ndim, m[i].info.shape);
            st = found_add(f, a, m[i].name);
        }
        qcal_npz_close_internal(&z);
        return st;
    }
    if (src == SRC_ST) {
        qcal_safetensors *sf = NULL;
        if ((st = qcal_safetensors_open(path, &sf)) != QCAL_OK)
            return st;
        int64_t n = 0;
        qcal_safetensors_count(sf, &n);
        for (int64_t i = 0; i < n && st == QCAL_OK; i++) {
            qcal_safetensors_tensor_info ti;
            if ((st = qcal_safetensors_info(sf, i, &ti)) != QCAL_OK)
                break;
            int32_t t = safetensors_elem(ti.dtype_name);
            if (!t) {
                st = qcal_error(QCAL_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which qcal "
                                "does not read as model input", path, ti.name, ti.dtype_name);
                break;
            }
            ds_array *a = array_new(ds, SRC_ST, path, ti.name);
            if (!a) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            a->elem_type = t;
            set_shape(a, ti.ndim, ti.shape);
            st = found_add(f, a, ti.name);
        }
        qcal_safetensors_close(&sf);
        return st;
    }
    /* A directory of NAME.npy files. */
    char **names = NULL;
    int64_t n = 0;
    if ((st = list_dir(path, &names, &n)) != QCAL_OK)
        return st;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++) {
        if (!ends_with(names[i], ".npy"))
            continue;
        char *p = join_path(path, names[i]);
        struct stat sb;
        ds_array *a = NULL;
        if (!p)
            st = QCAL_ERR_NO_MEMORY;
        else if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode) &&
                 (st = npy_array(ds, p, &a)) == QCAL_OK) {
            stem(p, nm, sizeof nm);
            st = found_add(f, a, nm);
        }
        free(p);
    }
    free_list(names, n);
    return st;
}

/* Builds batch f (arrays for the inputs not given by entries) from a container. */
static qcal_status load_batch(qcal_dataset *ds, const char *path, int src, ds_file *f)
{
    found_list fl = { 0 };
    qcal_status st = gather(ds, path, src, &fl);
    int64_t n_spec = 0, only = -1;
    for (int64_t j = 0; j < ds->n_inputs; j++)
        if (!ds->by_entry[j]) {
            n_spec++;
            only = j;
        }
    char inputs[1024], arrays[1024];
    fmt_names(inputs, sizeof inputs, (const char *const *)ds->names, ds->n_inputs);
    fmt_names(arrays, sizeof arrays, (const char *const *)fl.names, fl.n);
    for (int64_t k = 0; k < fl.n && st == QCAL_OK; k++) {
        int64_t j = input_index(ds, fl.names[k]);
        /* One input left for the spec and one array: its key does not matter. */
        if (j < 0 && n_spec == 1 && fl.n == 1)
            j = only;
        const char *where = src == SRC_NPY || src == 0 ? fl.a[k]->path : path;
        if (j < 0)
            st = qcal_error(QCAL_ERR_MISMATCH, "%s: array '%s' is not an input of the model "
                            "(inputs: %s)", where, fl.names[k], inputs);
        else if (ds->by_entry[j])
            st = qcal_error(QCAL_ERR_MISMATCH, "%s: array '%s' is also given by an entry %s=PATH",
                            where, fl.names[k], ds->names[j]);
        else if (f->arr[j])
            st = qcal_error(QCAL_ERR_MISMATCH, "%s: two arrays for input '%s'", where,
                            ds->names[j]);
        else if ((st = check_array(ds, where, j, fl.a[k])) == QCAL_OK)
            f->arr[j] = fl.a[k];
    }
    for (int64_t j = 0; j < ds->n_inputs && st == QCAL_OK; j++)
        if (!ds->by_entry[j] && !ds->optional[j] && !f->arr[j])
            st = qcal_error(QCAL_ERR_MISMATCH, "%s: no array for input '%s' (arrays: %s)", path,
                            ds->names[j], arrays);
    found_free(&fl);
    return st;
}

static qcal_status file_add(qcal_dataset *ds, const char *path, ds_file **out)
{
    if (ds->n_files == ds->cap_files) {
        int64_t cap = ds->cap_files ? ds->cap_files * 2 : 8;
        ds_file *p = realloc(ds->files, (size_t)cap * sizeof *p);
        if (!p)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the dataset's batch list");
        ds->files = p;
        ds->cap_files = cap;
    }
    ds_file *f = &ds->files[ds->n_files];
    memset(f, 0, sizeof *f);
    f->path = qcal_strdup(path);
    f->arr = qcal_calloc((size_t)ds->n_inputs, sizeof *f->arr);
    if (!f->path || !f->arr) {
        free(f->path);
        free(f->arr);
        return QCAL_ERR_NO_MEMORY;
    }
    ds->n_files++;
    *out = f;
    return QCAL_OK;
}

static int src_of(const char *name)
{
    return ends_with(name, ".npz") ? SRC_NPZ : ends_with(name, ".safetensors") ? SRC_ST
         : ends_with(name, ".npy") ? SRC_NPY : -1;
}

static qcal_status stat_path(const char *path, struct stat *sb)
{
    if (stat(path, sb) != 0)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "data '%s': %s", path, strerror(errno));
    return QCAL_OK;
}

/* True when dir holds at least one regular NAME.npy file (*all: one for every required
 * input the spec must give). */
static qcal_status dir_npys(const qcal_dataset *ds, const char *dir, bool *any, bool *all)
{
    char **names = NULL;
    int64_t n = 0;
    qcal_status st = list_dir(dir, &names, &n);
    if (st != QCAL_OK)
        return st;
    *any = false;
    int64_t need = 0, have = 0;
    for (int64_t j = 0; j < ds->n_inputs; j++)
        need += !ds->by_entry[j] && !ds->optional[j];
    for (int64_t i = 0; i < n; i++) {
        if (!ends_with(names[i], ".npy"))
            continue;
        char *p = join_path(dir, names[i]);
        struct stat sb;
        if (p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
            *any = true;
            char nm[4096];
            stem(names[i], nm, sizeof nm);
            int64_t j = input_index(ds, nm);
            if (j >= 0 && !ds->by_entry[j] && !ds->optional[j])
                have++;
        }
        free(p);
    }
    free_list(names, n);
    *all = need > 0 && have == need;
    return QCAL_OK;
}

/* The spec's batches, appended to ds->files. */
static qcal_status load_spec(qcal_dataset *ds, const char *spec)
{
    struct stat sb;
    qcal_status st = stat_path(spec, &sb);
    ds_file *f = NULL;
    if (st != QCAL_OK)
        return st;
    if (!S_ISDIR(sb.st_mode)) {
        int src = src_of(spec);
        if (src < 0)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "data '%s': not a .npz, .safetensors or .npy "
                              "file, nor a directory", spec);
        if ((st = file_add(ds, spec, &f)) != QCAL_OK)
            return st;
        return load_batch(ds, spec, src, f);
    }
    bool any = false, all = false;
    if ((st = dir_npys(ds, spec, &any, &all)) != QCAL_OK)
        return st;
    if (all) {
        if ((st = file_add(ds, spec, &f)) != QCAL_OK)
            return st;
        return load_batch(ds, spec, 0, f);
    }
    char **names = NULL;
    int64_t n = 0;
    if ((st = list_dir(spec, &names, &n)) != QCAL_OK)
        return st;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++) {
        char *p = join_path(spec, names[i]);
        if (!p) {
            st = QCAL_ERR_NO_MEMORY;
            break;
        }
        int src = -1;
        if (stat(p, &sb) == 0) {
            if (S_ISREG(sb.st_mode))
                src = src_of(names[i]);
            else if (S_ISDIR(sb.st_mode) && (st = dir_npys(ds, p, &any, &all)) == QCAL_OK && any)
                src = 0;
        }
        if (st == QCAL_OK && src >= 0 && (st = file_add(ds, p, &f)) == QCAL_OK)
            st = load_batch(ds, p, src, f);
        free(p);
    }
    free_list(names, n);
    if (st == QCAL_OK && ds->n_files == 0)
        st = qcal_error(QCAL_ERR_EMPTY, "data '%s': no batch in the directory (expected .npz, "
                        ".safetensors or .npy files, or directories of NAME.npy files)", spec);
    return st;
}

/* The files of an entry NAME=PATH (a .npy file, or a directory of them in name order). */
static qcal_status load_entry(qcal_dataset *ds, int64_t j, const char *entry, const char *path,
                              ds_array ***out, int64_t *n_out)
{
    struct stat sb;
    qcal_status st = stat_path(path, &sb);
    if (st != QCAL_OK)
        return st;
    char **names = NULL;
    int64_t n = 0;
    if (S_ISDIR(sb.st_mode)) {
        char **all = NULL;
        int64_t n_all = 0;
        if ((st = list_dir(path, &all, &n_all)) != QCAL_OK)
            return st;
        names = qcal_calloc((size_t)(n_all ? n_all : 1), sizeof *names);
        for (int64_t i = 0; names && i < n_all; i++) {
            if (!ends_with(all[i], ".npy"))
                continue;
            char *p = join_path(path, all[i]);
            if (p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
                names[n++] = p;
            else
                free(p);
        }
        free_list(all, n_all);
        if (!names)
            return QCAL_ERR_NO_MEMORY;
        if (n == 0) {
            free(names);
            return qcal_error(QCAL_ERR_EMPTY, "%s: no .npy file in the directory '%s'", entry,
                              path);
        }
    } else {
        if (!(names = qcal_malloc(sizeof *names)) || !(names[0] = qcal_strdup(path))) {
            free(names);
            return QCAL_ERR_NO_MEMORY;
        }
        n = 1;
    }
    ds_array **arr = qcal_calloc((size_t)n, sizeof *arr);
    if (!arr)
        st = QCAL_ERR_NO_MEMORY;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++)
        if ((st = npy_array(ds, names[i], &arr[i])) == QCAL_OK)
            st = check_array(ds, names[i], j, arr[i]);
    free_list(names, n);
    if (st != QCAL_OK) {
        free(arr);
        return st;
    }
    *out = arr;
    *n_out = n;
    return QCAL_OK;
}

/* Samples, splittability and bytes per sample of batch f. */
static qcal_status finish_batch(const qcal_dataset *ds, ds_file *f)
{
    int64_t s = 1, big = -1;
    for (int64_t j = 0; j < ds->n_inputs; j++)
        if (f->arr[j] && f->arr[j]->samples > s) {
            s = f->arr[j]->samples;
            big = j;
        }
    bool split = true;
    uint64_t bytes = 0;
    for (int64_t j = 0; j < ds->n_inputs; j++) {
        const ds_array *a = f->arr[j];
        if (!a)
            continue;
        if (a->samples != 1 && a->samples != s)
            return qcal_error(QCAL_ERR_MISMATCH, "%s: input '%s' has %" PRId64 " samples, input "
                              "'%s' has %" PRId64 " (every input holds as many, or one)", f->path,
                              ds->names[big], s, ds->names[j], a->samples);
        if ((s == 1 || a->samples == s) && a->mode != MODE_SPLIT)
            split = false;
        if (__builtin_add_overflow(bytes, a->sample_bytes, &bytes))
            return qcal_error(QCAL_ERR_OVERFLOW, "%s: bytes per sample overflow", f->path);
    }
    f->samples = s;
    f->splittable = split;
    f->sample_bytes = bytes;
    return QCAL_OK;
}

/* ---- open / close ---- */

void qcal_dataset_options_default(qcal_dataset_options *opt)
{
    if (!opt)
        return;
    opt->optional = NULL;
    opt->n_optional = 0;
}

static void handles_close(qcal_dataset *ds)
{
    for (int64_t k = 0; k < ds->n_h; k++) {
        if (ds->h[k].fd >= 0)
            close(ds->h[k].fd);
        qcal_npz_close_internal(&ds->h[k].npz);
        qcal_safetensors_close(&ds->h[k].st);
    }
    ds->n_h = 0;
    ds->open_file = -1;
}

void qcal_dataset_close(qcal_dataset **pds)
{
    if (!pds || !*pds)
        return;
    qcal_dataset *ds = *pds;
    if (ds->h)
        handles_close(ds);
    free(ds->h);
    for (int64_t i = 0; i < ds->n_files; i++) {
        free(ds->files[i].path);
        free(ds->files[i].arr);
    }
    free(ds->files);
    for (int64_t i = 0; i < ds->n_pool; i++)
        array_free(ds->pool[i]);
    free(ds->pool);
    for (int64_t j = 0; ds->names && j < ds->n_inputs; j++)
        free(ds->names[j]);
    free(ds->names);
    free(ds->inputs);
    free(ds->optional);
    free(ds->by_entry);
    free(ds);
    *pds = NULL;
}

qcal_status qcal_dataset_open(const char *spec, const char *const *entries, int64_t n_entries,
                              const qcal_dataset_input *inputs, int64_t n_inputs,
                              const qcal_dataset_options *opt, qcal_dataset **out)
{
    if (!out || !inputs || n_inputs < 1 || n_entries < 0 || (n_entries > 0 && !entries))
        return qcal_error(QCAL_ERR_INVALID_ARG, "dataset: output, inputs or entries invalid");
    if (!spec && n_entries == 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dataset: no data (neither a spec nor entries)");
    qcal_dataset_options dflt;
    qcal_dataset_options_default(&dflt);
    if (!opt)
        opt = &dflt;
    if (opt->n_optional < 0 || (opt->n_optional > 0 && !opt->optional))
        return qcal_error(QCAL_ERR_INVALID_ARG, "dataset: invalid optional input list");
    for (int64_t j = 0; j < n_inputs; j++) {
        if (!inputs[j].name)
            return qcal_error(QCAL_ERR_INVALID_ARG, "dataset: input %" PRId64 " has no name", j);
        if (inputs[j].ndim < -1 || inputs[j].ndim > QCAL_MAX_DIMS)
            return qcal_error(QCAL_ERR_INVALID_ARG, "dataset: input '%s' has rank %d",
                              inputs[j].name, (int)inputs[j].ndim);
    }
    qcal_dataset *ds = qcal_calloc(1, sizeof *ds);
    if (!ds)
        return QCAL_ERR_NO_MEMORY;
    ds->open_file = -1;
    ds->n_inputs = n_inputs;
    ds->inputs = qcal_calloc((size_t)n_inputs, sizeof *ds->inputs);
    ds->names = qcal_calloc((size_t)n_inputs, sizeof *ds->names);
    ds->optional = qcal_calloc((size_t)n_inputs, sizeof *ds->optional);
    ds->by_entry = qcal_calloc((size_t)n_inputs, sizeof *ds->by_entry);
    ds->h = qcal_calloc((size_t)n_inputs, sizeof *ds->h);
    qcal_status st = QCAL_OK;
    ds_array ***ent = qcal_calloc((size_t)n_inputs, sizeof *ent);
    int64_t *n_ent = qcal_calloc((size_t)n_inputs, sizeof *n_ent);
    const char **ent_text = qcal_calloc((size_t)n_inputs, sizeof *ent_text);
    if (!ds->inputs || !ds->names || !ds->optional || !ds->by_entry || !ds->h || !ent || !n_ent ||
        !ent_text) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    for (int64_t j = 0; j < n_inputs; j++) {
        ds->inputs[j] = inputs[j];
        if (!(ds->names[j] = qcal_strdup(inputs[j].name))) {
            st = QCAL_ERR_NO_MEMORY;
            goto done;
        }
        ds->inputs[j].name = ds->names[j];
        for (int64_t k = 0; k < opt->n_optional; k++)
            if (opt->optional[k] && !strcmp(opt->optional[k], inputs[j].name))
                ds->optional[j] = true;
    }
    char inputs_list[1024];
    fmt_names(inputs_list, sizeof inputs_list, (const char *const *)ds->names, n_inputs);
    /* Entries NAME=PATH. */
    for (int64_t e = 0; e < n_entries; e++) {
        const char *text = entries[e], *eq = text ? strchr(text, '=') : NULL;
        if (!eq || eq == text || !eq[1]) {
            st = qcal_error(QCAL_ERR_INVALID_ARG, "data entry '%s' is not NAME=PATH",
                            text ? text : "(null)");
            goto done;
        }
        char name[1024];
        snprintf(name, sizeof name, "%.*s", (int)(eq - text), text);
        int64_t j = input_index(ds, name);
        if (j < 0) {
            st = qcal_error(QCAL_ERR_MISMATCH, "data entry '%s': '%s' is not an input of the "
                            "model (inputs: %s)", text, name, inputs_list);
            goto done;
        }
        if (ds->by_entry[j]) {
            st = qcal_error(QCAL_ERR_INVALID_ARG, "data entries '%s' and '%s' both give input "
                            "'%s'", ent_text[j], text, name);
            goto done;
        }
        ds->by_entry[j] = true;
        ent_text[j] = text;
        if ((st = load_entry(ds, j, text, eq + 1, &ent[j], &n_ent[j])) != QCAL_OK)
            goto done;
    }
    /* The spec's batches. */
    int64_t n_spec = 0;
    if (spec) {
        if ((st = load_spec(ds, spec)) != QCAL_OK)
            goto done;
        n_spec = ds->n_files;
    } else {
        for (int64_t j = 0; j < n_inputs; j++)
            if (!ds->by_entry[j] && !ds->optional[j]) {
                st = qcal_error(QCAL_ERR_MISMATCH, "no data for input '%s': give a data spec or "
                                "an entry %s=PATH", ds->names[j], ds->names[j]);
                goto done;
            }
    }
    /* Batch count: every count that is not 1 must agree. */
    int64_t count = 1;
    const char *count_from = NULL;
    if (spec && n_spec != 1) {
        count = n_spec;
        count_from = spec;
    }
    for (int64_t j = 0; j < n_inputs; j++) {
        if (!ds->by_entry[j] || n_ent[j] == 1)
            continue;
        if (count_from && count != n_ent[j]) {
            st = qcal_error(QCAL_ERR_MISMATCH, "batch counts differ: '%s' gives %" PRId64
                            " batches, '%s' gives %" PRId64, count_from, count, ent_text[j],
                            n_ent[j]);
            goto done;
        }
        count = n_ent[j];
        count_from = ent_text[j];
    }
    /* Batches: the spec's (the only one repeated when it has one), then the entries' arrays. */
    if (spec && n_spec == 1 && count > 1) {
        for (int64_t b = 1; b < count; b++) {
            ds_file *f = NULL;
            if ((st = file_add(ds, ds->files[0].path, &f)) != QCAL_OK)
                goto done;
            memcpy(f->arr, ds->files[0].arr, (size_t)n_inputs * sizeof *f->arr);
        }
    } else if (!spec) {
        for (int64_t b = 0; b < count; b++) {
            ds_file *f = NULL;
            const char *path = NULL;
            for (int64_t j = 0; j < n_inputs && !path; j++)
                if (ds->by_entry[j] && (n_ent[j] > 1 || count == 1))
                    path = ent[j][n_ent[j] > 1 ? b : 0]->path;
            if ((st = file_add(ds, path ? path : "", &f)) != QCAL_OK)
                goto done;
        }
    }
    for (int64_t b = 0; b < ds->n_files; b++) {
        for (int64_t j = 0; j < n_inputs; j++)
            if (ds->by_entry[j])
                ds->files[b].arr[j] = ent[j][n_ent[j] > 1 ? b : 0];
        if ((st = finish_batch(ds, &ds->files[b])) != QCAL_OK)
            goto done;
    }
done:
    if (ent)
        for (int64_t j = 0; j < n_inputs; j++)
            free(ent[j]);
    free(ent);
    free(n_ent);
    free(ent_text);
    if (st != QCAL_OK) {
        qcal_dataset_close(&ds);
        return st;
    }
    *out = ds;
    return QCAL_OK;
}

int64_t qcal_dataset_file_count(const qcal_dataset *ds)
{
    return ds ? ds->n_files : 0;
}

qcal_status qcal_dataset_file_get(const qcal_dataset *ds, int64_t i, qcal_dataset_file_info *out)
{
    if (!ds || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dataset or output is NULL");
    if (i < 0 || i >= ds->n_files)
        return qcal_error(QCAL_ERR_INVALID_ARG, "batch file %" PRId64 " is outside [0, %" PRId64
                          ")", i, ds->n_files);
    const ds_file *f = &ds->files[i];
    out->path = f->path;
    out->samples = f->samples;
    out->splittable = f->splittable;
    out->sample_bytes = f->sample_bytes;
    return QCAL_OK;
}

/* ---- reads ---- */

static qcal_status changed(const char *path, const char *what)
{
    return qcal_error(QCAL_ERR_IO, "'%s' changed since the dataset was opened (%s)", path, what);
}

static bool same_shape(const ds_array *a, int32_t elem, int32_t ndim, const int64_t *dims)
{
    if (a->elem_type != elem || a->ndim != ndim)
        return false;
    for (int32_t d = 0; d < ndim; d++)
        if (a->dims[d] != dims[d])
            return false;
    return true;
}

/* The open handle of a's file (opened on the batch's first read, headers checked again). */
static qcal_status handle_for(qcal_dataset *ds, int64_t file, const ds_array *a, ds_handle **out)
{
    if (ds->open_file != file) {
        handles_close(ds);
        ds->open_file = file;
    }
    for (int64_t k = 0; k < ds->n_h; k++)
        if (!strcmp(ds->h[k].path, a->path)) {
            *out = &ds->h[k];
            return QCAL_OK;
        }
    if (ds->n_h >= ds->n_inputs)   /* cannot happen: one file per input at most */
        return qcal_error(QCAL_ERR_STATE, "dataset: too many open files for one batch");
    ds_handle h = { a->path, a->src, -1, NULL, NULL };
    qcal_status st = QCAL_OK;
    if (a->src == SRC_NPY) {
        qcal_npy_array info;
        uint64_t off = 0;
        if ((st = qcal_npy_file_header(a->path, &info, &off)) != QCAL_OK)
            return st;
        if (!same_shape(a, qcal_npy_dtype_onnx(info.dtype), info.ndim, info.shape) ||
            off != a->data_off)
            return changed(a->path, "its header differs");
        h.fd = open(a->path, O_RDONLY | O_CLOEXEC);
        if (h.fd < 0)
            return qcal_error(QCAL_ERR_IO, "cannot open '%s': %s", a->path, strerror(errno));
    } else if (a->src == SRC_NPZ) {
        if ((st = qcal_npz_open_internal(a->path, &h.npz)) != QCAL_OK)
            return st;
    } else {
        if ((st = qcal_safetensors_open(a->path, &h.st)) != QCAL_OK)
            return st;
    }
    ds->h[ds->n_h] = h;
    *out = &ds->h[ds->n_h++];
    return QCAL_OK;
}

/* Bytes [off, off + n) of array a's data into dst. */
static qcal_status array_read(qcal_dataset *ds, int64_t file, const ds_array *a, uint64_t off,
                              size_t n, void *dst)
{
    ds_handle *h = NULL;
    qcal_status st = handle_for(ds, file, a, &h);
    if (st != QCAL_OK)
        return st;
    if (a->src == SRC_NPY) {
        uint8_t *p = dst;
        uint64_t at = a->data_off + off;
        while (n > 0) {
            ssize_t r = pread(h->fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)at);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return qcal_error(QCAL_ERR_IO, "cannot read the data of '%s'%s%s", a->path,
                                  r == 0 ? " (file shrank while reading)" : ": ",
                                  r == 0 ? "" : strerror(errno));
            p += r;
            n -= (size_t)r;
            at += (uint64_t)r;
        }
        return QCAL_OK;
    }
    if (a->src == SRC_NPZ) {
        int64_t nm = 0;
        const qcal_npz_member *m = qcal_npz_members(h->npz, &nm);
        if (a->index >= nm || strcmp(m[a->index].name, a->key) != 0 ||
            !same_shape(a, qcal_npy_dtype_onnx(m[a->index].info.dtype), m[a->index].info.ndim,
                        m[a->index].info.shape))
            return changed(a->path, "its members differ");
        return qcal_npz_member_read(h->npz, a->index, off, n, dst);
    }
    int64_t idx = 0;
    qcal_safetensors_tensor_info ti;
    const void *bytes = NULL;
    if (qcal_safetensors_find(h->st, a->key, &idx) != QCAL_OK ||
        qcal_safetensors_info(h->st, idx, &ti) != QCAL_OK ||
        !same_shape(a, safetensors_elem(ti.dtype_name), ti.ndim, ti.shape))
        return changed(a->path, "its tensors differ");
    if ((st = qcal_safetensors_bytes(h->st, idx, &bytes)) != QCAL_OK)
        return st;
    memcpy(dst, (const uint8_t *)bytes + off, n);
    return QCAL_OK;
}

void qcal_dataset_batch_free(qcal_dataset_batch **b)
{
    if (!b || !*b)
        return;
    for (int64_t j = 0; (*b)->bufs && j < (*b)->n; j++)
        free((*b)->bufs[j]);
    free((*b)->bufs);
    free((*b)->v);
    free((*b)->names);
    free(*b);
    *b = NULL;
}

const qcal_engine_value *qcal_dataset_batch_values(const qcal_dataset_batch *b)
{
    return b ? b->v : NULL;
}

qcal_status qcal_dataset_read(qcal_dataset *ds, int64_t i, int64_t first, int64_t n,
                              qcal_dataset_batch **out)
{
    if (!ds || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dataset or output is NULL");
    if (i < 0 || i >= ds->n_files)
        return qcal_error(QCAL_ERR_INVALID_ARG, "batch file %" PRId64 " is outside [0, %" PRId64
                          ")", i, ds->n_files);
    const ds_file *f = &ds->files[i];
    if (n < 1 || first < 0 || first > f->samples || n > f->samples - first)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: samples [%" PRId64 ", %" PRId64 " + %" PRId64
                          ") are outside the file's %" PRId64, f->path, first, first, n,
                          f->samples);
    if (n > 1 && !f->splittable)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %" PRId64 " samples in one run, but the "
                          "file's samples go one per run", f->path, n);
    size_t names_len = 0;
    for (int64_t j = 0; j < ds->n_inputs; j++)
        names_len += strlen(ds->names[j]) + 1;
    qcal_dataset_batch *b = qcal_calloc(1, sizeof *b);
    if (!b)
        return QCAL_ERR_NO_MEMORY;
    b->n = ds->n_inputs;
    b->v = qcal_calloc((size_t)ds->n_inputs, sizeof *b->v);
    b->bufs = qcal_calloc((size_t)ds->n_inputs, sizeof *b->bufs);
    b->names = qcal_malloc(names_len);
    qcal_status st = QCAL_OK;
    if (!b->v || !b->bufs || !b->names)
        st = QCAL_ERR_NO_MEMORY;
    char *np = b->names;
    for (int64_t j = 0; j < ds->n_inputs && st == QCAL_OK; j++) {
        qcal_engine_value *v = &b->v[j];
        const qcal_dataset_input *in = &ds->inputs[j];
        size_t len = strlen(ds->names[j]) + 1;
        memcpy(np, ds->names[j], len);
        v->name = np;
        np += len;
        v->elem_type = in->elem_type;
        const ds_array *a = f->arr[j];
        if (!a) {   /* optional, left out: the model's declaration, no data */
            v->ndim = in->ndim < 0 ? 0 : in->ndim;
            for (int32_t d = 0; d < v->ndim; d++)
                v->dims[d] = in->dims[d];
            continue;
        }
        int64_t s0 = a->samples == 1 ? 0 : first, cnt = a->samples == 1 ? 1 : n;
        uint64_t off = (uint64_t)s0 * a->sample_bytes, bytes = (uint64_t)cnt * a->sample_bytes;
        if (a->mode == MODE_STACK) {
            v->ndim = a->ndim - 1;
            for (int32_t d = 1; d < a->ndim; d++)
                v->dims[d - 1] = a->dims[d];
        } else {
            v->ndim = a->ndim;
            for (int32_t d = 0; d < a->ndim; d++)
                v->dims[d] = a->dims[d];
            if (a->mode == MODE_SPLIT)
                v->dims[0] = cnt;
        }
        if (bytes > SIZE_MAX) {
            st = qcal_error(QCAL_ERR_OVERFLOW, "%s: input '%s': %" PRIu64 " bytes do not fit in "
                            "memory", f->path, in->name, bytes);
            break;
        }
        size_t rounded = ((size_t)bytes + 63) / 64 * 64;
        if (rounded < bytes || !(b->bufs[j] = aligned_alloc(64, rounded))) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %" PRIu64 " bytes for input '%s'",
                            bytes, in->name);
            break;
        }
        if ((st = array_read(ds, i, a, off, (size_t)bytes, b->bufs[j])) != QCAL_OK)
            break;
        v->data = b->bufs[j];
        v->nbytes = (size_t)bytes;
    }
    if (st != QCAL_OK) {
        qcal_dataset_batch_free(&b);
        return st;
    }
    *out = b;
    return QCAL_OK;
}
