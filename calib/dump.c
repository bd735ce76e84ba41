/* Calibration dumps: (tensor name, role, .npy files) from a dump directory, through
 * DIR/manifest.json or the directory layout with percent-decoded names
 * (include/qcal/calib_dump.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "calib/calib_internal.h"
#include "core/blob_file.h"
#include "io/json.h"
#include "qcal/calib_dump.h"

typedef struct dump_entry {
    char *name;
    qcal_calib_role role;
    char **files;
    int64_t nfiles;
} dump_entry;

struct qcal_calib_dump {
    dump_entry *t;
    int64_t n, cap;
    int64_t total_files;
};

/* Manifests are small; anything past this is refused rather than read into memory. */
#define MAX_MANIFEST (64u << 20)

static void entry_free(dump_entry *e)
{
    for (int64_t j = 0; j < e->nfiles; j++)
        free(e->files[j]);
    free(e->files);
    free(e->name);
}

void qcal_calib_dump_destroy(qcal_calib_dump **d)
{
    if (!d || !*d)
        return;
    for (int64_t i = 0; i < (*d)->n; i++)
        entry_free(&(*d)->t[i]);
    free((*d)->t);
    free(*d);
    *d = NULL;
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), n = la + lb + 2;
    if (n < la)
        return NULL;
    char *s = qcal_malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, b);
    return s;
}

/* Moves *e into d (on failure *e is freed). */
static qcal_status push(qcal_calib_dump *d, dump_entry *e)
{
    if (d->n == d->cap) {
        int64_t cap = d->cap ? d->cap * 2 : 32;
        size_t bytes;
        dump_entry *t = NULL;
        if (qcal_mul_size((size_t)cap, sizeof *t, &bytes))
            t = realloc(d->t, bytes);
        if (!t) {
            entry_free(e);
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the dump list to %lld tensors",
                              (long long)cap);
        }
        d->t = t;
        d->cap = cap;
    }
    d->t[d->n++] = *e;
    d->total_files += e->nfiles;
    memset(e, 0, sizeof *e);
    return QCAL_OK;
}

static int cmp_entry(const void *a, const void *b)
{
    const dump_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (int)x->role - (int)y->role;
}

/* Sorts by (name bytes, role); a pair given twice is an error naming where. */
static qcal_status sort_check(qcal_calib_dump *d, const char *where)
{
    if (d->n > 1)
        qsort(d->t, (size_t)d->n, sizeof *d->t, cmp_entry);
    for (int64_t i = 1; i < d->n; i++)
        if (!cmp_entry(&d->t[i - 1], &d->t[i]))
            return qcal_error(QCAL_ERR_FORMAT, "%s: %s '%s' is listed twice", where,
                              qcal_calib_role_name(d->t[i].role), d->t[i].name);
    return QCAL_OK;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

qcal_status qcal_calib_dump_name_decode(const char *src, char *dst, size_t cap)
{
    if (!src || !dst || cap == 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "name, output or capacity is NULL/0");
    size_t o = 0;
    for (size_t i = 0; src[i]; i++) {
        char c = src[i];
        if (c == '%') {
            int hi = hex_val(src[i + 1]), lo = hi < 0 ? -1 : hex_val(src[i + 2]);
            if (hi < 0 || lo < 0)
                return qcal_error(QCAL_ERR_FORMAT, "'%s': '%%' at byte %zu is not followed by "
                                  "two hex digits (write '%%' as %%25)", src, i);
            c = (char)(hi * 16 + lo);
            if (c == '\0')
                return qcal_error(QCAL_ERR_FORMAT, "'%s': %%00 (a NUL byte) at byte %zu", src,
                                  i);
            i += 2;
        }
        if (o + 1 >= cap)
            return qcal_error(QCAL_ERR_INVALID_ARG, "'%s' does not fit in %zu bytes", src, cap);
        dst[o++] = c;
    }
    dst[o] = '\0';
    return QCAL_OK;
}

static qcal_calib_role role_of_name(const char *name)
{
    size_t n = strlen(name);
    return n >= 7 && !strcmp(name + n - 7, ".weight") ? QCAL_CALIB_ROLE_WEIGHT
                                                      : QCAL_CALIB_ROLE_ACTIVATION;
}

static bool ends_with_npy(const char *s)
{
    size_t n = strlen(s);
    return n > 4 && !strcmp(s + n - 4, ".npy");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names in dir without '.' entries (*names malloc'ed, each name too). */
static qcal_status list_dir(const char *dir, char ***names, int64_t *n)
{
    DIR *dh = opendir(dir);
    if (!dh)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot read directory '%s': %s", dir, strerror(errno));
    char **v = NULL;
    int64_t cnt = 0, cap = 0;
    qcal_status st = QCAL_OK;
    struct dirent *de;
    while ((de = readdir(dh))) {
        if (de->d_name[0] == '.')
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            char **nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot list '%s'", dir);
                break;
            }
            v = nv;
        }
        if (!(v[cnt] = qcal_strdup(de->d_name))) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot list '%s'", dir);
            break;
        }
        cnt++;
    }
    closedir(dh);
    if (st != QCAL_OK) {
        for (int64_t i = 0; i < cnt; i++)
            free(v[i]);
        free(v);
        return st;
    }
    if (cnt > 1)
        qsort(v, (size_t)cnt, sizeof *v, cmp_str);
    *names = v;
    *n = cnt;
    return QCAL_OK;
}

static void free_names(char **v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* One entry of the directory layout: DIR/<enc>/ (batches) or DIR/<enc>.npy. */
static qcal_status scan_entry(qcal_calib_dump *d, const char *dir, const char *ent)
{
    char *path = join(dir, ent);
    if (!path)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    struct stat sb;
    qcal_status st = QCAL_OK;
    dump_entry e = { 0 };
    char **files = NULL;
    int64_t m = 0;
    if (stat(path, &sb) != 0) {
        st = qcal_error(QCAL_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
        goto done;
    }
    size_t len = strlen(ent);
    if (S_ISDIR(sb.st_mode)) {
        if ((st = list_dir(path, &files, &m)) != QCAL_OK)
            goto done;
        int64_t k = 0;
        for (int64_t j = 0; j < m; j++) {
            char *f = files[j];
            files[j] = NULL;
            if (ends_with_npy(f)) {
                files[k] = join(path, f);
                if (!files[k++]) {
                    free(f);
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    m = k;
                    goto done;
                }
            }
            free(f);
        }
        m = k;
        if (k == 0) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s' holds no .npy file (a name holding '/' is "
                            "spelled %%2F in one directory name, or listed in manifest.json)",
                            path);
            goto done;
        }
    } else if (S_ISREG(sb.st_mode) && ends_with_npy(ent)) {
        len -= 4;
        files = qcal_malloc(sizeof *files);
        if (!files) {
            st = QCAL_ERR_NO_MEMORY;
            goto done;
        }
        files[0] = path;
        path = NULL;
        m = 1;
    } else {
        goto done;   /* not a dump: ignored */
    }
    char *enc = qcal_malloc(len + 1);
    e.name = qcal_malloc(len + 1);
    if (!enc || !e.name) {
        free(enc);
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    memcpy(enc, ent, len);
    enc[len] = '\0';
    st = qcal_calib_dump_name_decode(enc, e.name, len + 1);
    free(enc);
    if (st != QCAL_OK) {
        st = qcal_error_wrap(st, "dump '%s'", dir);
        goto done;
    }
    e.role = role_of_name(e.name);
    e.files = files;
    e.nfiles = m;
    files = NULL;
    m = 0;
    st = push(d, &e);
done:
    entry_free(&e);
    free_names(files, m);
    free(path);
    return st;
}

static qcal_status scan_layout(const char *dir, qcal_calib_dump *d)
{
    char **names = NULL;
    int64_t n = 0;
    qcal_status st = list_dir(dir, &names, &n);
    if (st != QCAL_OK)
        return st;
    for (int64_t i = 0; i < n && st == QCAL_OK; i++)
        st = scan_entry(d, dir, names[i]);
    free_names(names, n);
    if (st == QCAL_OK && d->n == 0)
        st = qcal_error(QCAL_ERR_FORMAT, "'%s' holds no dump (expected manifest.json, "
                        "<name>/*.npy or <name>.npy)", dir);
    if (st == QCAL_OK) {
        char where[600];
        snprintf(where, sizeof where, "dump '%s'", dir);
        st = sort_check(d, where);
    }
    return st;
}

/* A manifest path: relative, no empty, "." or ".." component. */
static bool path_ok(const char *p, const char **why)
{
    if (!*p) {
        *why = "is empty";
        return false;
    }
    if (p[0] == '/') {
        *why = "is absolute (paths are relative to the dump directory)";
        return false;
    }
    for (const char *c = p; *c;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0) {
            *why = "has an empty component ('//' or a trailing '/')";
            return false;
        }
        if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) {
            *why = "has a '.' or '..' component (paths stay inside the dump directory)";
            return false;
        }
        c += n + (e != NULL);
        if (e && !*c) {
            *why = "has an empty component ('//' or a trailing '/')";
            return false;
        }
    }
    return true;
}

static qcal_status manifest_tensor(qcal_calib_dump *d, const qcal_json *t, size_t i)
{
    if (t->type != QCAL_JSON_OBJECT)
        return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu] is a JSON %s, not an object", i,
                          qcal_json_type_name(t->type));
    for (size_t k = 0; k < t->n; k++)
        if (strcmp(t->keys[k], "name") && strcmp(t->keys[k], "role") &&
            strcmp(t->keys[k], "files"))
            return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu] has unknown member '%s' "
                              "(expected name, role, files)", i, t->keys[k]);
    const qcal_json *name = qcal_json_get(t, "name"), *role = qcal_json_get(t, "role");
    const qcal_json *files = qcal_json_get(t, "files");
    if (!name || name->type != QCAL_JSON_STRING || name->len == 0)
        return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu].name must be a non-empty string", i);
    dump_entry e = { 0 };
    e.role = role_of_name(name->str);
    if (role) {
        if (role->type != QCAL_JSON_STRING || (strcmp(role->str, "activation") &&
                                               strcmp(role->str, "weight")))
            return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu].role must be \"activation\" or "
                              "\"weight\"", i);
        e.role = role->str[0] == 'w' ? QCAL_CALIB_ROLE_WEIGHT : QCAL_CALIB_ROLE_ACTIVATION;
    }
    if (!files || files->type != QCAL_JSON_ARRAY || files->n == 0)
        return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu].files must be a non-empty array of "
                          "paths", i);
    for (size_t j = 0; j < files->n; j++) {
        const char *why = "";
        if (files->items[j].type != QCAL_JSON_STRING)
            return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu].files[%zu] is a JSON %s, not a "
                              "string", i, j, qcal_json_type_name(files->items[j].type));
        if (!path_ok(files->items[j].str, &why))
            return qcal_error(QCAL_ERR_FORMAT, "tensors[%zu].files[%zu] '%s' %s", i, j,
                              files->items[j].str, why);
    }
    e.name = qcal_strdup(name->str);
    e.files = qcal_calloc(files->n, sizeof *e.files);
    if (!e.name || !e.files) {
        entry_free(&e);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (size_t j = 0; j < files->n; j++) {
        if (!(e.files[j] = qcal_strdup(files->items[j].str))) {
            e.nfiles = (int64_t)j;
            entry_free(&e);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
    }
    e.nfiles = (int64_t)files->n;
    return push(d, &e);
}

qcal_status qcal_calib_dump_parse(const char *text, size_t len, qcal_calib_dump **out)
{
    if ((!text && len) || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "manifest text or output is NULL");
    qcal_json *doc = NULL;
    qcal_status st = qcal_json_parse(text ? text : "", len, NULL, &doc);
    if (st != QCAL_OK)
        return st;
    qcal_calib_dump *d = qcal_calloc(1, sizeof *d);
    if (!d) {
        qcal_json_free(&doc);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    const qcal_json *tensors = qcal_json_get(doc, "tensors");
    if (doc->type != QCAL_JSON_OBJECT) {
        st = qcal_error(QCAL_ERR_FORMAT, "the manifest is a JSON %s, not an object",
                        qcal_json_type_name(doc->type));
        goto done;
    }
    for (size_t k = 0; k < doc->n; k++) {
        if (strcmp(doc->keys[k], "tensors")) {
            st = qcal_error(QCAL_ERR_FORMAT, "unknown member '%s' (expected tensors)",
                            doc->keys[k]);
            goto done;
        }
    }
    if (!tensors || tensors->type != QCAL_JSON_ARRAY || tensors->n == 0) {
        st = qcal_error(QCAL_ERR_FORMAT, "\"tensors\" must be a non-empty array");
        goto done;
    }
    for (size_t i = 0; i < tensors->n && st == QCAL_OK; i++)
        st = manifest_tensor(d, &tensors->items[i], i);
    if (st == QCAL_OK)
        st = sort_check(d, "manifest");
done:
    qcal_json_free(&doc);
    if (st != QCAL_OK) {
        qcal_calib_dump_destroy(&d);
        return st;
    }
    *out = d;
    return QCAL_OK;
}

/* Turns the relative paths of d into DIR/path, checking that each names a regular file
 * whose real path lies inside DIR's. */
static qcal_status resolve(qcal_calib_dump *d, const char *dir, const char *mpath)
{
    char *root = realpath(dir, NULL);
    if (!root)
        return qcal_error(QCAL_ERR_IO, "cannot resolve '%s': %s", dir, strerror(errno));
    size_t rl = strlen(root);
    qcal_status st = QCAL_OK;
    for (int64_t i = 0; i < d->n && st == QCAL_OK; i++) {
        dump_entry *e = &d->t[i];
        for (int64_t j = 0; j < e->nfiles && st == QCAL_OK; j++) {
            char *full = join(dir, e->files[j]);
            if (!full) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                break;
            }
            char *real = realpath(full, NULL);
            struct stat sb;
            if (!real) {
                st = qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                                "%s: tensor '%s': cannot open '%s': %s", mpath, e->name, full,
                                strerror(errno));
            } else if (!(strlen(real) > rl + 1 && !strncmp(real, root, rl) &&
                         (rl == 1 || real[rl] == '/'))) {
                st = qcal_error(QCAL_ERR_FORMAT, "%s: tensor '%s': '%s' leads outside the "
                                "dump directory", mpath, e->name, e->files[j]);
            } else if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
                st = qcal_error(QCAL_ERR_FORMAT, "%s: tensor '%s': '%s' is not a regular "
                                "file", mpath, e->name, full);
            }
            free(real);
            if (st == QCAL_OK) {
                free(e->files[j]);
                e->files[j] = full;
            } else {
                free(full);
            }
        }
    }
    free(root);
    return st;
}

qcal_status qcal_calib_dump_scan(const char *dir, qcal_calib_dump **out)
{
    if (!dir || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dump directory or output is NULL");
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                          "cannot open dump directory '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return qcal_error(QCAL_ERR_IO, "'%s' is not a directory", dir);
    char *mpath = join(dir, "manifest.json");
    if (!mpath)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    qcal_calib_dump *d = NULL;
    qcal_status st;
    if (stat(mpath, &sb) == 0) {
        void *buf = NULL;
        size_t len = 0;
        st = qcal_blob_read_file(mpath, "manifest", MAX_MANIFEST, &buf, &len);
        if (st == QCAL_OK) {
            st = qcal_calib_dump_parse(buf, len, &d);
            if (st < 0)
                st = qcal_error_wrap(st, "%s", mpath);
        }
        free(buf);
        if (st == QCAL_OK)
            st = resolve(d, dir, mpath);
    } else {
        d = qcal_calloc(1, sizeof *d);
        st = d ? scan_layout(dir, d) : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    free(mpath);
    if (st != QCAL_OK) {
        qcal_calib_dump_destroy(&d);
        return st;
    }
    *out = d;
    return QCAL_OK;
}

qcal_status qcal_calib_dump_count(const qcal_calib_dump *d, int64_t *n)
{
    if (!d || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dump or output is NULL");
    *n = d->n;
    return QCAL_OK;
}

qcal_status qcal_calib_dump_file_count(const qcal_calib_dump *d, int64_t *n)
{
    if (!d || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dump or output is NULL");
    *n = d->total_files;
    return QCAL_OK;
}

qcal_status qcal_calib_dump_tensor_at(const qcal_calib_dump *d, int64_t i,
                                      qcal_calib_dump_tensor *out)
{
    if (!d || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dump or output is NULL");
    if (i < 0 || i >= d->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor %lld is outside [0, %lld)",
                          (long long)i, (long long)d->n);
    const dump_entry *e = &d->t[i];
    out->name = e->name;
    out->role = e->role;
    out->nfiles = e->nfiles;
    out->files = (const char *const *)e->files;
    return QCAL_OK;
}
