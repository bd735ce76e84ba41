/* quant_logger-style statistics logger: records to a caller FILE*, an atomic CSV file, a
 * directory of .npy dumps and a callback (formats in include/qcal/numeric.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcal/atomic_file.h"
#include "core/internal.h"
#include "qcal/npy.h"
#include "qcal/numeric.h"

struct qcal_numeric_logger {
    qcal_numeric_logger_options opt;
    char *npy_dir;
    bool csv;
    qcal_atomic_file csv_file;
    int64_t c;
    bool finished;
};

void qcal_numeric_logger_options_default(qcal_numeric_logger_options *opt)
{
    memset(opt, 0, sizeof *opt);
}

void qcal_numeric_logger_destroy(qcal_numeric_logger **lgp)
{
    if (!lgp || !*lgp)
        return;
    qcal_numeric_logger *lg = *lgp;
    if (lg->csv)
        qcal_atomic_file_abort(&lg->csv_file);
    free(lg->npy_dir);
    free(lg);
    *lgp = NULL;
}

qcal_status qcal_numeric_logger_create(const qcal_numeric_logger_options *opt, qcal_numeric_logger **out)
{
    if (!opt || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_create: NULL argument");
    qcal_status st = QCAL_OK;
    qcal_numeric_logger *lg = qcal_calloc(1, sizeof *lg);
    if (!lg)
        return QCAL_ERR_NO_MEMORY;
    lg->opt = *opt;
    lg->opt.csv_path = NULL;
    lg->opt.npy_dir = NULL;
    if (opt->npy_dir) {
        lg->npy_dir = strdup(opt->npy_dir);
        if (!lg->npy_dir) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot copy npy_dir");
            goto fail;
        }
    }
    if (opt->csv_path) {
        st = qcal_atomic_file_open(&lg->csv_file, opt->csv_path);
        if (st != QCAL_OK)
            goto fail;
        lg->csv = true;
        fputs("t,c,fqn,op,extra,shape,count,nonfinite,min,max,absmax,mean,std\n", lg->csv_file.fp);
    }
    *out = lg;
    return QCAL_OK;
fail:
    qcal_numeric_logger_destroy(&lg);
    return st;
}

/* CSV field: quoted when it holds a comma, quote or newline (RFC 4180). */
static void csv_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void shape_str(char *buf, size_t cap, int32_t ndim, const int64_t *shape)
{
    if (ndim == 0) {
        snprintf(buf, cap, "scalar");
        return;
    }
    size_t k = 0;
    buf[0] = '\0';
    for (int32_t d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(buf + k, cap - k, d ? "x%lld" : "%lld", (long long)shape[d]);
}

static qcal_status emit(qcal_numeric_logger *lg, qcal_numeric_log_record *rec, const qcal_tensor *x)
{
    FILE *f = lg->opt.stream;
    const qcal_numeric_stats *s = &rec->stats;
    /* Empty-record policy: a record without finite values (empty tensor, or every value
     * NaN/Inf) has no min/max/mean: the line prints "n=0" and the statistic keys with empty
     * values, the CSV leaves those fields empty, so inf/-inf never pass for numbers. */
    if (f) {
        fprintf(f, "t=%s, c=%" PRId64 ", fqn='%s', op='%s', extra='%s', ",
                rec->t == QCAL_NUMERIC_LOG_ACT ? "act" : "param", rec->c, rec->fqn, rec->op, rec->extra);
        if (s->count > 0)
            fprintf(f, "min=%.6g, max=%.6g, absmax=%.6g, avg=%.6g, std=%.6g", (double)s->min,
                    (double)s->max, (double)s->absmax, s->mean, rec->std);
        else
            fputs("n=0, min=, max=, absmax=, avg=, std=", f);
        if (s->nonfinite)
            fprintf(f, ", nonfinite=%" PRIu64, s->nonfinite);
        fputc('\n', f);
    }
    if (lg->csv) {
        FILE *c = lg->csv_file.fp;
        char shp[256];
        shape_str(shp, sizeof shp, rec->ndim, rec->shape);
        fprintf(c, "%s,%" PRId64 ",", rec->t == QCAL_NUMERIC_LOG_ACT ? "act" : "param", rec->c);
        csv_field(c, rec->fqn);
        fputc(',', c);
        csv_field(c, rec->op);
        fputc(',', c);
        csv_field(c, rec->extra);
        fprintf(c, ",%s,%" PRId64 ",%" PRIu64, shp, s->count, s->nonfinite);
        if (s->count > 0)
            fprintf(c, ",%.9g,%.9g,%.9g,%.17g,%.17g\n", (double)s->min, (double)s->max,
                    (double)s->absmax, s->mean, rec->std);
        else
            fputs(",,,,,\n", c);
    }
    if (lg->npy_dir && x) {
        char path[4096];
        int k = snprintf(path, sizeof path, "%s/%06" PRId64 "_", lg->npy_dir, rec->c);
        for (const char *p = rec->fqn; *p && k < (int)sizeof path - 8; p++) {
            char ch = *p;
            bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
            path[k++] = ok ? ch : '_';
        }
        snprintf(path + k, sizeof path - (size_t)k, ".npy");
        qcal_status st = qcal_npy_write(path, QCAL_NPY_F32, x->ndim, x->shape, x->data);
        if (st != QCAL_OK)
            return st;
    }
    if (lg->opt.callback) {
        qcal_status st = lg->opt.callback(rec, x, lg->opt.user);
        if (st != QCAL_OK)
            return st < 0 ? st : QCAL_OK;
    }
    return QCAL_OK;
}

static qcal_status fill(qcal_numeric_logger *lg, qcal_numeric_log_record *rec, qcal_numeric_log_kind t, const char *fqn,
                        const char *op, const char *extra, char *buf, size_t cap, int32_t ndim,
                        const int64_t *shape)
{
    if (!lg)
        return qcal_error(QCAL_ERR_INVALID_ARG, "logger is NULL");
    if (lg->finished)
        return qcal_error(QCAL_ERR_STATE, "logger already finished");
    if (t != QCAL_NUMERIC_LOG_PARAM && t != QCAL_NUMERIC_LOG_ACT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "record kind %d is neither param nor act", (int)t);
    if (ndim < 0 || ndim > QCAL_MAX_DIMS || (ndim > 0 && !shape))
        return qcal_error(QCAL_ERR_INVALID_ARG, "bad shape (ndim %d)", ndim);
    memset(rec, 0, sizeof *rec);
    rec->t = t;
    rec->c = lg->c;
    rec->fqn = fqn ? fqn : "";
    rec->op = op ? op : "";
    rec->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++)
        rec->shape[d] = shape[d];
    if (!extra) {
        shape_str(buf, cap, ndim, shape);
        extra = buf;
    }
    rec->extra = extra;
    return QCAL_OK;
}

qcal_status qcal_numeric_logger_log_stats(qcal_numeric_logger *lg, qcal_numeric_log_kind t, const char *fqn,
                                  const char *op, const char *extra, int32_t ndim,
                                  const int64_t *shape, const qcal_numeric_stats *stats)
{
    qcal_numeric_log_record rec;
    char buf[256];
    qcal_status st = fill(lg, &rec, t, fqn, op, extra, buf, sizeof buf, ndim, shape);
    if (st != QCAL_OK)
        return st;
    if (!stats)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_log_stats: stats is NULL");
    rec.stats = *stats;
    qcal_numeric_stats_std(stats, &rec.std);
    /* c advances even if a sink fails part-way: the record may already be in another
     * sink, and a c value is never reused */
    st = emit(lg, &rec, NULL);
    lg->c++;
    return st;
}

qcal_status qcal_numeric_logger_log(qcal_numeric_logger *lg, qcal_numeric_log_kind t, const char *fqn, const char *op,
                            const char *extra, const qcal_tensor *x)
{
    if (!x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_log: tensor is NULL");
    int64_t numel;
    qcal_status st = qcal_tensor_numel(x, &numel);
    if (st != QCAL_OK)
        return st;
    if (numel > 0 && !x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_log: tensor '%s' has no data",
                          fqn ? fqn : "");
    qcal_numeric_log_record rec;
    char buf[256];
    st = fill(lg, &rec, t, fqn, op, extra, buf, sizeof buf, x->ndim, x->shape);
    if (st != QCAL_OK)
        return st;
    qcal_numeric_stats_init(&rec.stats);
    st = qcal_numeric_stats_update(&rec.stats, x->data, numel);
    if (st != QCAL_OK)
        return st;
    qcal_numeric_stats_std(&rec.stats, &rec.std);
    st = emit(lg, &rec, x);
    lg->c++;
    return st;
}

qcal_status qcal_numeric_logger_log_linear(qcal_numeric_logger *lg, const char *fqn, const char *op, int64_t m,
                                   int64_t k, int64_t n, const qcal_tensor *x)
{
    if (m < 0 || k < 0 || n < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "MKN %lld|%lld|%lld has a negative size",
                          (long long)m, (long long)k, (long long)n);
    char extra[96];
    snprintf(extra, sizeof extra, "MKN=%lld|%lld|%lld", (long long)m, (long long)k, (long long)n);
    return qcal_numeric_logger_log(lg, QCAL_NUMERIC_LOG_ACT, fqn, op ? op : "linear", extra, x);
}

qcal_status qcal_numeric_logger_count(const qcal_numeric_logger *lg, int64_t *n)
{
    if (!lg || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_count: NULL argument");
    *n = lg->c;
    return QCAL_OK;
}

qcal_status qcal_numeric_logger_finish(qcal_numeric_logger *lg)
{
    if (!lg)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_logger_finish: NULL");
    if (lg->finished)
        return qcal_error(QCAL_ERR_STATE, "logger already finished");
    lg->finished = true;
    if (lg->opt.stream && fflush(lg->opt.stream) != 0)
        return qcal_error(QCAL_ERR_IO, "cannot flush the log stream: %s", strerror(errno));
    if (lg->csv) {
        lg->csv = false;
        return qcal_atomic_file_commit(&lg->csv_file);
    }
    return QCAL_OK;
}
