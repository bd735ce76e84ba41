/* Evaluation states ("QCEV", docs/state.md): save and load a scored observer evaluation
 * (include/qcal/numeric_eval.h) with every candidate's observer state ("QCOB") and the exact
 * figures of pass 2, so that its results and report can be produced again without the data. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/blob_file.h"
#include "core/internal.h"
#include "numeric/evaluate_impl.h"
#include "observers/observer_state.h"

#define EVAL_MAGIC 0x56454351u /* "QCEV" little-endian */
#define EVAL_VERSION 1u
#define MAX_NAME_BYTES 4096u
/* Smallest tensor record: name length, 1 name byte, role, counts, range, layer SQNR, the
 * candidate count and one candidate (kind, SQNR, clipped, state length, state header). */
#define MIN_TENSOR_BYTES (4u + 1u + 4u + 16u + 8u + 12u + 4u + (4u + 8u + 8u + 8u + 108u))

static void put_qconfig(qcal_buf *b, const qcal_qconfig *q)
{
    qcal_buf_u32(b, (uint32_t)q->dtype);
    qcal_buf_u32(b, (uint32_t)q->qscheme);
    qcal_buf_u32(b, q->reduce_range);
    qcal_buf_u32(b, q->custom_range);
    qcal_buf_u64(b, (uint64_t)q->quant_min);
    qcal_buf_u64(b, (uint64_t)q->quant_max);
    qcal_buf_f32(b, q->eps);
}

static bool get_qconfig(qcal_cursor *c, qcal_qconfig *q)
{
    uint32_t dt, qs, rr, cr;
    uint64_t lo, hi;
    if (!qcal_cur_u32(c, &dt) || !qcal_cur_u32(c, &qs) || !qcal_cur_u32(c, &rr) ||
        !qcal_cur_u32(c, &cr) || !qcal_cur_u64(c, &lo) || !qcal_cur_u64(c, &hi) ||
        !qcal_cur_f32(c, &q->eps))
        return false;
    q->dtype = (qcal_dtype)dt;
    q->qscheme = (qcal_qscheme)qs;
    q->reduce_range = rr != 0;
    q->custom_range = cr != 0;
    q->quant_min = (int64_t)lo;
    q->quant_max = (int64_t)hi;
    return rr <= 1 && cr <= 1;
}

qcal_status qcal_numeric_eval_save(const qcal_numeric_eval *ev, void **buf, size_t *len)
{
    if (!ev || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or outputs are NULL");
    int64_t n = 0;
    qcal_numeric_eval_tensor t;
    qcal_status st = qcal_numeric_eval_count(ev, &n);
    if (st >= 0 && n > 0)
        st = qcal_numeric_eval_result(ev, 0, &t);   /* scored, sorted, SQNR computed */
    else if (st >= 0 && !ev->finished)
        st = qcal_error(QCAL_ERR_STATE, "save before qcal_numeric_eval_finish");
    if (st < 0)
        return st;
    qcal_buf b = { 0 };
    qcal_buf_u32(&b, EVAL_MAGIC);
    qcal_buf_u32(&b, EVAL_VERSION);
    qcal_buf_u32(&b, ev->opt.kinds);
    qcal_buf_f64(&b, ev->opt.min_sqnr_db);
    put_qconfig(&b, &ev->opt.activation_q);
    put_qconfig(&b, &ev->opt.weight_q);
    qcal_buf_u32(&b, (uint32_t)ev->opt.bins);
    qcal_buf_u32(&b, (uint32_t)ev->opt.report_bins);
    size_t sl = ev->source ? strlen(ev->source) : 0;
    qcal_buf_u32(&b, (uint32_t)sl);
    qcal_buf_append(&b, ev->source, sl);
    qcal_buf_u64(&b, (uint64_t)ev->n);
    for (int64_t i = 0; i < ev->n && st >= 0; i++) {
        const eval_entry *e = &ev->e[i];
        size_t nl = strlen(e->name);
        if (nl == 0 || nl > MAX_NAME_BYTES) {
            st = qcal_error(QCAL_ERR_UNSUPPORTED, "tensor name of %zu bytes cannot be saved "
                            "(1..%u)", nl, MAX_NAME_BYTES);
            break;
        }
        qcal_buf_u32(&b, (uint32_t)nl);
        qcal_buf_append(&b, e->name, nl);
        qcal_buf_u32(&b, (uint32_t)e->role);
        qcal_buf_u64(&b, e->count);
        qcal_buf_u64(&b, e->nonfinite);
        qcal_buf_f32(&b, e->dmin);
        qcal_buf_f32(&b, e->dmax);
        qcal_buf_u32(&b, e->has_layer_sqnr);
        qcal_buf_f64(&b, e->has_layer_sqnr ? e->layer_sqnr : 0.0);
        for (int64_t k = 0; k < ev->opt.report_bins; k++)
            qcal_buf_u64(&b, e->hist[k]);
        qcal_buf_u32(&b, (uint32_t)e->nc);
        for (int j = 0; j < e->nc && st >= 0; j++) {
            const eval_cand *c = &e->c[j];
            qcal_buf_u32(&b, (uint32_t)c->kind);
            qcal_buf_f64(&b, c->sqnr);
            qcal_buf_u64(&b, c->clipped);
            size_t len_at = b.len;
            qcal_buf_u64(&b, 0);
            size_t start = b.len;
            st = qcal_observer_state_append(c->obs, &b, false);
            if (st >= 0 && !b.failed) {
                uint64_t sl64 = (uint64_t)(b.len - start);
                memcpy(b.data + len_at, &sl64, 8);
            }
        }
    }
    if (st >= 0 && b.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the evaluation state buffer");
    if (st < 0) {
        qcal_buf_free(&b);
        return st;
    }
    *buf = b.data;
    *len = b.len;
    return QCAL_OK;
}

/* Reads one tensor record into ev->e[ev->n] (counted in ev->n on success). */
static qcal_status read_tensor(qcal_numeric_eval *ev, qcal_cursor *cur, uint64_t index)
{
    unsigned long long ix = (unsigned long long)index;
    eval_entry *e = &ev->e[ev->n];
    memset(e, 0, sizeof *e);
    uint32_t nl, role, has_layer, nc;
    qcal_status st = QCAL_OK;
    if (!qcal_cur_u32(cur, &nl))
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated at tensor %llu", ix);
    if (nl == 0 || nl > MAX_NAME_BYTES || nl > cur->left || memchr(cur->p, '\0', nl))
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor %llu: bad name (length %u, "
                          "1..%u, no NUL byte)", ix, (unsigned)nl, MAX_NAME_BYTES);
    if (!(e->name = qcal_malloc((size_t)nl + 1)))
        return QCAL_ERR_NO_MEMORY;
    qcal_cur_read(cur, e->name, nl);
    e->name[nl] = '\0';
    e->dmin = INFINITY;
    e->dmax = -INFINITY;
    if (!qcal_cur_u32(cur, &role) || !qcal_cur_u64(cur, &e->count) ||
        !qcal_cur_u64(cur, &e->nonfinite) || !qcal_cur_f32(cur, &e->dmin) ||
        !qcal_cur_f32(cur, &e->dmax) || !qcal_cur_u32(cur, &has_layer) ||
        !qcal_cur_f64(cur, &e->layer_sqnr)) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated at tensor '%s'", e->name);
        goto fail;
    }
    if (role >= QCAL_CALIB_ROLE_COUNT || has_layer > 1) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': role %u or layer flag %u "
                        "is not valid", e->name, (unsigned)role, (unsigned)has_layer);
        goto fail;
    }
    e->role = (qcal_calib_role)role;
    e->has_layer_sqnr = has_layer;
    if (ev->n > 0) {
        const eval_entry *p = &ev->e[ev->n - 1];
        int c = strcmp(p->name, e->name);
        if (c > 0 || (c == 0 && p->role >= e->role)) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensors are not in (name, role) "
                            "order or repeat: '%s' after '%s'", e->name, p->name);
            goto fail;
        }
    }
    if (e->count > 0 ? !(e->dmin <= e->dmax && isfinite(e->dmin) && isfinite(e->dmax))
                     : !(e->dmin == INFINITY && e->dmax == -INFINITY)) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': data range [%g, %g] does "
                        "not fit %llu values", e->name, (double)e->dmin, (double)e->dmax,
                        (unsigned long long)e->count);
        goto fail;
    }
    size_t nb = (size_t)ev->opt.report_bins;
    if (cur->left / 8 < nb) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated in the histogram of '%s'",
                        e->name);
        goto fail;
    }
    if (!(e->hist = qcal_calloc(nb, sizeof(uint64_t)))) {
        st = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    uint64_t sum = 0;
    bool over = false;
    for (size_t k = 0; k < nb; k++) {
        qcal_cur_u64(cur, &e->hist[k]);
        over |= e->hist[k] > UINT64_MAX - sum;
        sum += e->hist[k];
    }
    if (over || sum != e->count) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': histogram counts do not "
                        "add up to its %llu values", e->name, (unsigned long long)e->count);
        goto fail;
    }
    if (!qcal_cur_u32(cur, &nc) || nc == 0 || nc > QCAL_OBSERVER_KIND_COUNT) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': candidate count is "
                        "missing or not in 1..%d", e->name, QCAL_OBSERVER_KIND_COUNT);
        goto fail;
    }
    for (uint32_t j = 0; j < nc; j++) {
        eval_cand *c = &e->c[j];
        uint32_t kind;
        uint64_t slen;
        if (!qcal_cur_u32(cur, &kind) || !qcal_cur_f64(cur, &c->sqnr) ||
            !qcal_cur_u64(cur, &c->clipped) || !qcal_cur_u64(cur, &slen)) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated in '%s'", e->name);
            goto fail;
        }
        /* Candidates in the order of simplicity, each with its documented config. */
        qcal_observer_config want;
        if (kind >= QCAL_OBSERVER_KIND_COUNT ||
            (j > 0 && qcal_numeric_eval_simplicity((qcal_observer_kind)kind) <=
                      qcal_numeric_eval_simplicity(e->c[j - 1].kind)) ||
            !qcal_numeric_eval_cand_config(ev, e->role, (qcal_observer_kind)kind, &want)) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': candidate %u (kind %u) "
                            "is unknown, out of order or not a candidate of the options",
                            e->name, (unsigned)j, (unsigned)kind);
            goto fail;
        }
        c->kind = (qcal_observer_kind)kind;
        if (isinf(c->sqnr) && c->sqnr < 0) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': %s SQNR is -inf",
                            e->name, qcal_observer_kind_name(c->kind));
            goto fail;
        }
        if (c->clipped > e->count) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': %s clipped %llu of "
                            "%llu values", e->name, qcal_observer_kind_name(c->kind),
                            (unsigned long long)c->clipped, (unsigned long long)e->count);
            goto fail;
        }
        if (slen > cur->left) {
            st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s': observer state of "
                            "%llu bytes, only %zu left", e->name, (unsigned long long)slen,
                            cur->left);
            goto fail;
        }
        qcal_cursor oc = { .p = cur->p, .left = (size_t)slen };
        st = qcal_observer_state_parse(&oc, &c->obs);
        if (st >= 0 && oc.left)
            st = qcal_error(QCAL_ERR_FORMAT, "%zu trailing bytes after the observer state", oc.left);
        char diff[256];
        if (st >= 0 && qcal_observer_config_compare(qcal_observer_get_config(c->obs), &want, diff,
                                                    sizeof diff) != QCAL_OK)
            st = qcal_error(QCAL_ERR_FORMAT, "the observer's config is not the candidate's (%s)",
                            diff);
        e->nc = (int)j + (c->obs != NULL);
        if (st < 0) {
            if (st != QCAL_ERR_NO_MEMORY) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", qcal_last_error());
                st = qcal_error(QCAL_ERR_FORMAT, "evaluation state tensor '%s', %s: %s", e->name,
                                qcal_observer_kind_name(c->kind), msg);
            }
            goto fail;
        }
        cur->p += slen;
        cur->left -= (size_t)slen;
        if ((st = qcal_numeric_eval_cand_prepare(ev, c)) < 0)
            goto fail;
        c->sqnr_done = true;
    }
    e->scored = true;
    ev->n++;
    return QCAL_OK;
fail:
    qcal_numeric_eval_entry_free(e);
    return st;
}

qcal_status qcal_numeric_eval_load(const void *buf, size_t len, qcal_numeric_eval **out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "buffer or output is NULL");
    qcal_cursor cur = { .p = buf, .left = len };
    uint32_t magic, version, kinds, bins, rbins, sl;
    double min_sqnr;
    qcal_numeric_eval_options o;
    qcal_numeric_eval_options_default(&o);
    if (!qcal_cur_u32(&cur, &magic) || magic != EVAL_MAGIC)
        return qcal_error(QCAL_ERR_FORMAT, "not a qcal evaluation state (bad magic)");
    if (!qcal_cur_u32(&cur, &version))
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated in its header");
    if (version != EVAL_VERSION)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "evaluation state version %u is not supported "
                          "(this qcal reads version %u)", (unsigned)version, EVAL_VERSION);
    if (!qcal_cur_u32(&cur, &kinds) || !qcal_cur_f64(&cur, &min_sqnr) ||
        !get_qconfig(&cur, &o.activation_q) || !get_qconfig(&cur, &o.weight_q) ||
        !qcal_cur_u32(&cur, &bins) || !qcal_cur_u32(&cur, &rbins) || !qcal_cur_u32(&cur, &sl))
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated or malformed in its "
                          "options");
    o.kinds = kinds;
    o.min_sqnr_db = min_sqnr;
    o.bins = (int32_t)bins;
    o.report_bins = (int32_t)rbins;
    if (bins > INT32_MAX || rbins > INT32_MAX)
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state options: bins %u / report bins %u",
                          (unsigned)bins, (unsigned)rbins);
    qcal_numeric_eval *ev = NULL;
    qcal_status st = qcal_numeric_eval_create(&o, &ev);
    if (st < 0) {
        if (st == QCAL_ERR_NO_MEMORY)
            return st;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        return qcal_error(QCAL_ERR_FORMAT, "evaluation state options: %s", msg);
    }
    ev->finished = true;
    if (sl > QCAL_NUMERIC_EVAL_SOURCE_MAX || sl > cur.left || memchr(cur.p, '\0', sl)) {
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state: bad source label (%u bytes)", (unsigned)sl);
    } else if (sl) {
        if ((ev->source = qcal_malloc((size_t)sl + 1)) != NULL) {
            qcal_cur_read(&cur, ev->source, sl);
            ev->source[sl] = '\0';
        } else {
            st = QCAL_ERR_NO_MEMORY;
        }
    }
    uint64_t n = 0;
    if (st >= 0 && !qcal_cur_u64(&cur, &n))
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state is truncated in its header");
    if (st >= 0 && n > cur.left / (MIN_TENSOR_BYTES + 8u * (uint64_t)rbins))
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state claims %llu tensors but holds %zu bytes",
                        (unsigned long long)n, cur.left);
    if (st >= 0 && n > 0) {
        ev->e = qcal_calloc((size_t)n, sizeof *ev->e);
        ev->cap = (int64_t)n;
        if (!ev->e)
            st = QCAL_ERR_NO_MEMORY;
    }
    for (uint64_t i = 0; i < n && st >= 0; i++)
        st = read_tensor(ev, &cur, i);
    if (st >= 0 && cur.left)
        st = qcal_error(QCAL_ERR_FORMAT, "evaluation state has %zu trailing bytes", cur.left);
    if (st < 0) {
        qcal_numeric_eval_destroy(&ev);
        return st;
    }
    ev->loaded = true;
    *out = ev;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_save_file(const qcal_numeric_eval *ev, const char *path)
{
    if (!path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_numeric_eval_save(ev, &buf, &len);
    if (st >= 0)
        st = qcal_blob_write_file(path, buf, len);
    qcal_free(buf);
    return st;
}

qcal_status qcal_numeric_eval_load_file(const char *path, qcal_numeric_eval **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "evaluation state", SIZE_MAX, &buf, &len);
    if (st < 0)
        return st;
    st = qcal_numeric_eval_load(buf, len, out);
    free(buf);
    if (st < 0 && st != QCAL_ERR_NO_MEMORY) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", qcal_last_error());
        st = qcal_error(st, "'%s': %s", path, msg);
    }
    return st;
}
