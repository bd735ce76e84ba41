/* Grouped summaries of per-tensor records: default fqn collapsing or user globs, outliers,
 * and the keep-in-float list (rules documented in include/qcal/numeric.h). */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/numeric.h"

typedef struct member {
    char *name;
    qcal_numeric_summary_item it;
} member;

typedef struct group {
    char *pattern;
    int64_t *idx;      /* member indices */
    int64_t n, cap;
} group;

struct qcal_numeric_summary {
    qcal_numeric_summary_options opt;
    char **globs;
    member *m;
    int64_t n, cap;
    group *g;
    int64_t ng, gcap;
};

void qcal_numeric_summary_options_default(qcal_numeric_summary_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->outlier_factor = 4.0;
    opt->min_sqnr = NAN;
}

void qcal_numeric_summary_destroy(qcal_numeric_summary **sp)
{
    if (!sp || !*sp)
        return;
    qcal_numeric_summary *s = *sp;
    for (int32_t i = 0; s->globs && i < s->opt.n_globs; i++)
        free(s->globs[i]);
    free(s->globs);
    for (int64_t i = 0; i < s->n; i++)
        free(s->m[i].name);
    free(s->m);
    for (int64_t i = 0; i < s->ng; i++) {
        free(s->g[i].pattern);
        free(s->g[i].idx);
    }
    free(s->g);
    free(s);
    *sp = NULL;
}

qcal_status qcal_numeric_summary_create(const qcal_numeric_summary_options *opt, qcal_numeric_summary **out)
{
    if (!opt || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_summary_create: NULL argument");
    if (opt->n_globs < 0 || (opt->n_globs > 0 && !opt->globs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "n_globs %d without globs", opt->n_globs);
    if (!(opt->outlier_factor >= 1.0) || !isfinite(opt->outlier_factor))
        return qcal_error(QCAL_ERR_INVALID_ARG, "outlier_factor %g must be finite and >= 1",
                          opt->outlier_factor);
    qcal_status st = QCAL_OK;
    qcal_numeric_summary *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    s->opt = *opt;
    s->opt.n_globs = 0;
    if (opt->n_globs > 0) {
        s->globs = qcal_calloc((size_t)opt->n_globs, sizeof *s->globs);
        if (!s->globs) {
            st = QCAL_ERR_NO_MEMORY;
            goto fail;
        }
        for (int32_t i = 0; i < opt->n_globs; i++) {
            s->opt.n_globs = i + 1;
            if (!opt->globs[i] || !(s->globs[i] = strdup(opt->globs[i]))) {
                st = qcal_error(opt->globs[i] ? QCAL_ERR_NO_MEMORY : QCAL_ERR_INVALID_ARG,
                                "glob %d is NULL or cannot be copied", i);
                goto fail;
            }
        }
    }
    s->opt.globs = NULL;
    *out = s;
    return QCAL_OK;
fail:
    qcal_numeric_summary_destroy(&s);
    return st;
}

static bool all_digits(const char *b, const char *e)
{
    if (b == e)
        return false;
    for (; b < e; b++)
        if (*b < '0' || *b > '9')
            return false;
    return true;
}

qcal_status qcal_numeric_summary_default_pattern(const char *name, char *buf, size_t cap)
{
    if (!name || !buf || cap == 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_summary_default_pattern: bad arguments");
    size_t k = 0;
    const char *p = name;
    for (;;) {
        const char *e = strchr(p, '.');
        if (!e)
            e = p + strlen(p);
        const char *src = all_digits(p, e) ? "*" : p;
        size_t len = all_digits(p, e) ? 1 : (size_t)(e - p);
        if (k + len + 2 > cap)
            return qcal_error(QCAL_ERR_INVALID_ARG, "pattern of '%s' does not fit %zu bytes", name, cap);
        memcpy(buf + k, src, len);
        k += len;
        if (!*e)
            break;
        buf[k++] = '.';
        p = e + 1;
    }
    buf[k] = '\0';
    return QCAL_OK;
}

qcal_status qcal_numeric_summary_add(qcal_numeric_summary *s, const qcal_numeric_summary_item *item)
{
    if (!s || !item || !item->name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_summary_add: NULL argument");
    if (item->ndim < 0 || item->ndim > QCAL_MAX_DIMS)
        return qcal_error(QCAL_ERR_INVALID_ARG, "member '%s': ndim %d", item->name, item->ndim);
    char pat[1024];
    const char *key = NULL;
    for (int32_t i = 0; i < s->opt.n_globs && !key; i++)
        if (fnmatch(s->globs[i], item->name, 0) == 0)
            key = s->globs[i];
    if (!key) {
        qcal_status st = qcal_numeric_summary_default_pattern(item->name, pat, sizeof pat);
        if (st != QCAL_OK)
            return st;
        key = pat;
    }
    int64_t g = 0;
    while (g < s->ng && strcmp(s->g[g].pattern, key))
        g++;
    if (s->n == s->cap) {
        int64_t nc = s->cap ? s->cap * 2 : 16;
        member *m = realloc(s->m, (size_t)nc * sizeof *m);
        if (!m)
            return qcal_error(QCAL_ERR_NO_MEMORY, "summary: cannot grow to %lld members", (long long)nc);
        s->m = m;
        s->cap = nc;
    }
    if (g == s->ng && s->ng == s->gcap) {
        int64_t nc = s->gcap ? s->gcap * 2 : 8;
        group *gg = realloc(s->g, (size_t)nc * sizeof *gg);
        if (!gg)
            return qcal_error(QCAL_ERR_NO_MEMORY, "summary: cannot grow to %lld groups", (long long)nc);
        s->g = gg;
        s->gcap = nc;
    }
    char *name = strdup(item->name);
    char *gname = g == s->ng ? strdup(key) : NULL;
    if (!name || (g == s->ng && !gname)) {
        free(name);
        free(gname);
        return qcal_error(QCAL_ERR_NO_MEMORY, "summary: cannot copy names");
    }
    group *gr = g == s->ng ? NULL : &s->g[g];
    group fresh = {gname, NULL, 0, 0};
    if (!gr)
        gr = &fresh;
    if (gr->n == gr->cap) {
        int64_t nc = gr->cap ? gr->cap * 2 : 8;
        int64_t *idx = realloc(gr->idx, (size_t)nc * sizeof *idx);
        if (!idx) {
            free(name);
            free(gname);
            return qcal_error(QCAL_ERR_NO_MEMORY, "summary: cannot grow a group");
        }
        gr->idx = idx;
        gr->cap = nc;
    }
    gr->idx[gr->n++] = s->n;
    if (gr == &fresh)
        s->g[s->ng++] = fresh;
    s->m[s->n].name = name;
    s->m[s->n].it = *item;
    s->m[s->n].it.name = name;
    s->n++;
    return QCAL_OK;
}

qcal_status qcal_numeric_summary_group_count(const qcal_numeric_summary *s, int64_t *n)
{
    if (!s || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_summary_group_count: NULL argument");
    *n = s->ng;
    return QCAL_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A member carries statistics unless its max is non-finite (count 0: max = -inf). */
static bool has_stats(const qcal_numeric_summary_item *it)
{
    return isfinite(it->max);
}

/* Median absmax of group g and its outliers' member indices: *outl (the caller frees it;
 * NULL: not wanted), *n_out of them. Nothing is kept in s, so readers never race. */
static qcal_status analyse(const qcal_numeric_summary *s, int64_t g, double *median,
                           int64_t *n_out, int64_t **outl)
{
    const group *gr = &s->g[g];
    double *v = qcal_malloc((size_t)gr->n * sizeof *v);
    int64_t *o = qcal_malloc((size_t)gr->n * sizeof *o);
    if (!v || !o) {
        free(v);
        free(o);
        return QCAL_ERR_NO_MEMORY;
    }
    /* only members with statistics (finite max) take part */
    int64_t nv = 0;
    for (int64_t i = 0; i < gr->n; i++)
        if (has_stats(&s->m[gr->idx[i]].it))
            v[nv++] = s->m[gr->idx[i]].it.absmax;
    qsort(v, (size_t)nv, sizeof *v, cmp_double);
    double med = nv == 0 ? NAN : nv % 2 ? v[nv / 2] : 0.5 * (v[nv / 2 - 1] + v[nv / 2]);
    int64_t k = 0;
    if (nv >= 3) {
        for (int64_t i = 0; i < gr->n; i++) {
            const qcal_numeric_summary_item *it = &s->m[gr->idx[i]].it;
            if (has_stats(it) && it->absmax > s->opt.outlier_factor * med)
                o[k++] = gr->idx[i];
        }
    }
    free(v);
    if (outl)
        *outl = o;
    else
        free(o);
    *median = med;
    *n_out = k;
    return QCAL_OK;
}

/* qcal_numeric_summary_get_group, with the outliers' member indices (*outl, NULL: not
 * wanted) for qcal_numeric_summary_outlier. */
static qcal_status describe(const qcal_numeric_summary *s, int64_t g,
                            qcal_numeric_summary_group *out, int64_t **outl)
{
    if (!s || !out || g < 0 || g >= s->ng)
        return qcal_error(QCAL_ERR_INVALID_ARG, "group %lld out of range [0, %lld)", (long long)g,
                          s ? (long long)s->ng : 0LL);
    const group *gr = &s->g[g];
    qcal_numeric_summary_group r;
    memset(&r, 0, sizeof r);
    r.pattern = gr->pattern;
    r.count = gr->n;
    r.max_of_max = -INFINITY;
    r.worst_sqnr_db = NAN;
    double sum_std = 0;
    int64_t best = -1, best_count = 0;
    for (int64_t i = 0; i < gr->n; i++) {
        const qcal_numeric_summary_item *it = &s->m[gr->idx[i]].it;
        if (has_stats(it)) {
            if (it->max > r.max_of_max)
                r.max_of_max = it->max;
            sum_std += it->std;
        } else {
            r.n_empty++;
        }
        if (!isnan(it->sqnr_db) && (isnan(r.worst_sqnr_db) || it->sqnr_db < r.worst_sqnr_db)) {
            r.worst_sqnr_db = it->sqnr_db;
            r.worst_member = it->name;
        }
        /* typical shape: most frequent, first seen on ties (O(n^2), groups are small) */
        int64_t cnt = 0;
        for (int64_t j = 0; j < gr->n; j++) {
            const qcal_numeric_summary_item *o = &s->m[gr->idx[j]].it;
            cnt += o->ndim == it->ndim &&
                   !memcmp(o->shape, it->shape, (size_t)it->ndim * sizeof it->shape[0]);
        }
        if (cnt > best_count) {
            best_count = cnt;
            best = i;
        }
    }
    int64_t with = gr->n - r.n_empty;
    r.mean_of_std = with ? sum_std / (double)with : NAN;
    if (!with)
        r.max_of_max = NAN;
    if (best >= 0) {
        const qcal_numeric_summary_item *it = &s->m[gr->idx[best]].it;
        r.ndim = it->ndim;
        memcpy(r.shape, it->shape, sizeof r.shape);
    }
    qcal_status st = analyse(s, g, &r.median_absmax, &r.n_outliers, outl);
    if (st != QCAL_OK)
        return st;
    *out = r;
    return QCAL_OK;
}

qcal_status qcal_numeric_summary_get_group(const qcal_numeric_summary *s, int64_t g,
                                           qcal_numeric_summary_group *out)
{
    return describe(s, g, out, NULL);
}

qcal_status qcal_numeric_summary_outlier(const qcal_numeric_summary *s, int64_t g, int64_t k,
                                         const char **name)
{
    qcal_numeric_summary_group r;
    int64_t *outl = NULL;
    qcal_status st = describe(s, g, &r, &outl);
    if (st != QCAL_OK)
        return st;
    if (!name || k < 0 || k >= r.n_outliers) {
        free(outl);
        return qcal_error(QCAL_ERR_INVALID_ARG, "outlier %lld out of range [0, %lld)", (long long)k,
                          (long long)r.n_outliers);
    }
    *name = s->m[outl[k]].name;
    free(outl);
    return QCAL_OK;
}

qcal_status qcal_numeric_summary_keep_float(const qcal_numeric_summary *s, int64_t cap,
                                            const char **names, int64_t *n)
{
    if (!s || !n || cap < 0 || (cap > 0 && !names))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_summary_keep_float: bad arguments");
    int64_t k = 0;
    if (!isnan(s->opt.min_sqnr)) {
        for (int64_t i = 0; i < s->n; i++) {
            double q = s->m[i].it.sqnr_db;
            if (!isnan(q) && q < s->opt.min_sqnr) {
                if (k < cap)
                    names[k] = s->m[i].name;
                k++;
            }
        }
    }
    *n = k;
    return QCAL_OK;
}
