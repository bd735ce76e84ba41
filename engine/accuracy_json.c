/* The JSON of `qcal compare --format json` read back into a qcal_accuracy_report
 * (qcal/accuracy.h, docs/accuracy.md "JSON"), for `qcal report COMPARE.json`.
 *
 * JSON has no infinity or NaN: the writer puts "inf" / "-inf" for an infinite figure (an
 * output equal to float: SQNR +inf) and null for one that does not apply (NaN), and this
 * reader maps them back, so a report survives the trip through the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blob_file.h"
#include "core/internal.h"
#include "io/json.h"
#include "qcal/accuracy.h"

/* What a message names: "outputs[2].cosine", "sqnr_db". */
typedef struct where {
    const char *array;   /* NULL at the top level */
    size_t index;
} where;

static qcal_status bad(const where *w, const char *key, const char *what)
{
    if (w->array)
        return qcal_error(QCAL_ERR_FORMAT, "compare report: %s[%zu].%s %s", w->array, w->index,
                          key, what);
    return qcal_error(QCAL_ERR_FORMAT, "compare report: \"%s\" %s", key, what);
}

/* A figure: a number, "inf" / "-inf", or null (NaN); a missing one is NaN too. */
static qcal_status get_num(const where *w, const qcal_json *o, const char *key, double *out)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v || v->type == QCAL_JSON_NULL)
        *out = NAN;
    else if (v->type == QCAL_JSON_NUMBER)
        *out = v->number;
    else if (v->type == QCAL_JSON_STRING && (!strcmp(v->str, "inf") || !strcmp(v->str, "-inf")))
        *out = v->str[0] == '-' ? -INFINITY : INFINITY;
    else
        return bad(w, key, "is not a number, \"inf\", \"-inf\" or null");
    return QCAL_OK;
}

/* A count: a non-negative integer; missing is 0. */
static qcal_status get_count(const where *w, const qcal_json *o, const char *key, int64_t *out)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (!v) {
        *out = 0;
        return QCAL_OK;
    }
    if (v->type != QCAL_JSON_NUMBER || !v->is_int || v->i64 < 0)
        return bad(w, key, "is not a non-negative integer");
    *out = v->i64;
    return QCAL_OK;
}

/* A string (a new copy in *out); missing is "" unless required. */
static qcal_status get_str(const where *w, const qcal_json *o, const char *key, bool required,
                           char **out)
{
    const qcal_json *v = qcal_json_get(o, key);
    if (v && v->type != QCAL_JSON_STRING)
        return bad(w, key, "is not a string");
    if (!v && required)
        return bad(w, key, "is missing");
    *out = strdup(v ? v->str : "");
    return *out ? QCAL_OK : qcal_error(QCAL_ERR_NO_MEMORY, "compare report: out of memory");
}

static qcal_status read_output(const where *w, const qcal_json *o, qcal_accuracy_output *out)
{
    if (o->type != QCAL_JSON_OBJECT)
        return qcal_error(QCAL_ERR_FORMAT, "compare report: %s[%zu] is not an object", w->array,
                          w->index);
    qcal_status st;
    if ((st = get_str(w, o, "name", true, &out->name)) != QCAL_OK ||
        (st = get_count(w, o, "samples", &out->samples)) != QCAL_OK ||
        (st = get_count(w, o, "positions", &out->positions)) != QCAL_OK ||
        (st = get_count(w, o, "nonfinite", &out->nonfinite)) != QCAL_OK ||
        (st = get_num(w, o, "sqnr_db", &out->sqnr_db)) != QCAL_OK ||
        (st = get_num(w, o, "cosine", &out->cosine)) != QCAL_OK ||
        (st = get_num(w, o, "top1_agreement", &out->agree)) != QCAL_OK ||
        (st = get_num(w, o, "exact_agreement", &out->exact_agree)) != QCAL_OK ||
        (st = get_num(w, o, "accuracy_float", &out->acc_float)) != QCAL_OK ||
        (st = get_num(w, o, "accuracy_quantized", &out->acc_quant)) != QCAL_OK)
        return st;
    return QCAL_OK;
}

static qcal_status read_op(const where *w, const qcal_json *o, qcal_accuracy_op *out)
{
    if (o->type != QCAL_JSON_OBJECT)
        return qcal_error(QCAL_ERR_FORMAT, "compare report: %s[%zu] is not an object", w->array,
                          w->index);
    qcal_status st;
    if ((st = get_str(w, o, "name", true, &out->name)) != QCAL_OK ||
        (st = get_str(w, o, "op_type", false, &out->op_type)) != QCAL_OK ||
        (st = get_num(w, o, "sqnr_alone_db", &out->sqnr_only_db)) != QCAL_OK ||
        (st = get_num(w, o, "sqnr_all_but_db", &out->sqnr_others_db)) != QCAL_OK)
        return st;
    return QCAL_OK;
}

void qcal_accuracy_source_free(qcal_accuracy_source *src)
{
    if (!src)
        return;
    free(src->float_model);
    free(src->quantized_model);
    free(src->engine);
    free(src->metric);
    memset(src, 0, sizeof *src);
}

qcal_status qcal_accuracy_report_parse_json(const char *text, size_t len,
                                            qcal_accuracy_report *rep, qcal_accuracy_source *src)
{
    if ((!text && len) || !rep)
        return qcal_error(QCAL_ERR_INVALID_ARG, "compare report: text or output is NULL");
    qcal_json *doc = NULL;
    qcal_status st = qcal_json_parse(text ? text : "", len, NULL, &doc);
    if (st != QCAL_OK)
        return qcal_error_wrap(st, "compare report");
    qcal_accuracy_report R;
    qcal_accuracy_source S;
    memset(&R, 0, sizeof R);
    memset(&S, 0, sizeof S);
    where top = { NULL, 0 };
    const qcal_json *outs = qcal_json_get(doc, "outputs"), *ops = qcal_json_get(doc, "ops");
    if (doc->type != QCAL_JSON_OBJECT || !outs || !ops || outs->type != QCAL_JSON_ARRAY ||
        ops->type != QCAL_JSON_ARRAY) {
        st = qcal_error(QCAL_ERR_FORMAT, "not a qcal compare report (an object with \"outputs\" "
                        "and \"ops\" arrays, as 'qcal compare --format json' writes)");
        goto done;
    }
    const qcal_json *metric = qcal_json_get(doc, "metric");
    if (metric && metric->type != QCAL_JSON_NULL && metric->type != QCAL_JSON_STRING) {
        st = bad(&top, "metric", "is not a string or null");
        goto done;
    }
    if ((st = get_str(&top, doc, "float", false, &S.float_model)) != QCAL_OK ||
        (st = get_str(&top, doc, "quantized", false, &S.quantized_model)) != QCAL_OK ||
        (st = get_str(&top, doc, "engine", false, &S.engine)) != QCAL_OK ||
        (metric && metric->type == QCAL_JSON_STRING &&
         (st = get_str(&top, doc, "metric", false, &S.metric)) != QCAL_OK) ||
        (st = get_count(&top, doc, "samples", &R.samples)) != QCAL_OK ||
        (st = get_count(&top, doc, "sensitivity_samples", &R.sensitivity_samples)) != QCAL_OK ||
        (st = get_count(&top, doc, "runs", &R.runs)) != QCAL_OK ||
        (st = get_num(&top, doc, "sqnr_db", &R.sqnr_db)) != QCAL_OK ||
        (st = get_num(&top, doc, "gated_sqnr_db", &R.gated_sqnr_db)) != QCAL_OK ||
        (st = get_num(&top, doc, "seconds", &R.seconds)) != QCAL_OK)
        goto done;
    R.outputs = calloc(outs->n ? outs->n : 1, sizeof *R.outputs);
    R.ops = calloc(ops->n ? ops->n : 1, sizeof *R.ops);
    if (!R.outputs || !R.ops) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "compare report: out of memory");
        goto done;
    }
    /* Counted as they are read, so the free on failure sees only filled entries' names. */
    for (size_t i = 0; i < outs->n; i++) {
        where w = { "outputs", i };
        R.n_outputs++;
        if ((st = read_output(&w, &outs->items[i], &R.outputs[i])) != QCAL_OK)
            goto done;
    }
    for (size_t i = 0; i < ops->n; i++) {
        where w = { "ops", i };
        R.n_ops++;
        if ((st = read_op(&w, &ops->items[i], &R.ops[i])) != QCAL_OK)
            goto done;
    }
done:
    qcal_json_free(&doc);
    if (st != QCAL_OK) {
        qcal_accuracy_report_free(&R);
        qcal_accuracy_source_free(&S);
        return st;
    }
    *rep = R;
    if (src)
        *src = S;
    else
        qcal_accuracy_source_free(&S);
    return QCAL_OK;
}

/* A compare report is a few hundred KB even for thousands of ops; the JSON parser's bound. */
#define MAX_REPORT_FILE ((size_t)100 << 20)

qcal_status qcal_accuracy_report_read_json(const char *path, qcal_accuracy_report *rep,
                                           qcal_accuracy_source *src)
{
    if (!path || !rep)
        return qcal_error(QCAL_ERR_INVALID_ARG, "compare report: path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "compare report", MAX_REPORT_FILE, &buf, &len);
    if (st == QCAL_OK) {
        st = qcal_accuracy_report_parse_json(buf, len, rep, src);
        if (st < 0)
            st = qcal_error_wrap(st, "%s", path);
    }
    free(buf);
    return st;
}
