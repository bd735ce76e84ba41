/* The HTML page of a model comparison (qcal/accuracy.h: `qcal report COMPARE.json`): one
 * self-contained file in the calibration report's style (numeric/html.h), holding
 *
 *   - a header: the two models, the engine, the samples, the SQNR over every output;
 *   - the per-output table: SQNR, cosine, top-1 and exact agreement, accuracies;
 *   - the per-op sensitivity as horizontal bars, one row per op in the report's order (most
 *     sensitive first): the SQNR at the outputs with the op alone quantized and with every
 *     other op quantized, on one dB axis, with the all-quantized SQNR as a dashed line;
 *   - the op table, sortable.
 * Bars start at the axis's left end (x0 <= 0 dB), so a bar's width is (dB - x0) in the
 * axis's units: +inf fills the plot, NaN draws none. Every name is HTML-escaped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blob_file.h"
#include "core/internal.h"
#include "numeric/html.h"
#include "qcal/accuracy.h"

/* Okabe-Ito vermillion and blue: told apart with common colour-vision deficiencies. */
#define COLOUR_ALONE "#D55E00"
#define COLOUR_ALL_BUT "#0072B2"

/* Chart geometry (px): label column, plot, value column; two bars per row. */
#define CHART_W 960.0
#define LABEL_W 330.0
#define VALUE_W 64.0
#define ROW_H 22.0
#define BAR_H 8.0
#define TOP 34.0
#define BOTTOM 36.0
#define NAME_MAX 60   /* bytes of an op's name shown in the chart (the tail; full in a tooltip) */

static const char *page_css =
    "svg.bars rect.alone{fill:" COLOUR_ALONE "}svg.bars rect.allbut{fill:" COLOUR_ALL_BUT "}"
    "svg.bars text.v{font-size:10px;fill:#555}svg.bars text.t{fill:#888}"
    "svg.bars line.ref{stroke:#333;stroke-dasharray:5 3;stroke-width:1.2}"
    "svg.bars line.grid{stroke:#e2e2e2}";

/* A figure for a table: "-" when it does not apply (NaN), the sort key in data-v. */
static void cell(qcal_buf *b, double v, double scale, const char *fmt, const char *unit)
{
    if (isnan(v)) {
        qcal_html_put(b, "<td data-v=\"-1e300\" class=\"na\">&#8211;</td>");
        return;
    }
    if (isinf(v)) {   /* sorts past every figure */
        qcal_html_put(b, v > 0 ? "<td data-v=\"1e300\">&#8734;" : "<td data-v=\"-1e300\">-&#8734;");
    } else {
        qcal_html_putf(b, "<td data-v=\"%.17g\">", v * scale);
        qcal_html_putf(b, fmt, v * scale);
    }
    qcal_html_put(b, unit);
    qcal_html_put(b, "</td>");
}

static void num_text(qcal_buf *b, double v)
{
    if (isnan(v))
        qcal_html_put(b, "n/a");
    else if (isinf(v))
        qcal_html_put(b, v > 0 ? "&#8734;" : "-&#8734;");
    else
        qcal_html_putf(b, "%.2f", v);
}

/* A figure as an attribute a script or test reads back: every digit, "inf", "-inf". */
static void db_attr(qcal_buf *b, double v)
{
    if (isinf(v))
        qcal_html_put(b, v > 0 ? "inf" : "-inf");
    else
        qcal_html_putf(b, "%.17g", v);
}

/* The axis: [x0, x1] in whole steps of 1, 2, 5, 10, ... dB, at most 8 of them, x0 <= 0,
 * covering every finite figure drawn. */
static void axis(const qcal_accuracy_report *r, double *x0, double *x1, double *step)
{
    double lo = 0, hi = -INFINITY;
    for (int64_t i = 0; i <= r->n_ops; i++) {
        double v[2] = { r->gated_sqnr_db, NAN };
        if (i < r->n_ops)
            v[0] = r->ops[i].sqnr_only_db, v[1] = r->ops[i].sqnr_others_db;
        for (int k = 0; k < 2; k++)
            if (isfinite(v[k])) {
                lo = fmin(lo, v[k]);
                hi = fmax(hi, v[k]);
            }
    }
    if (!(hi > lo))
        hi = lo + 10;
    static const double mant[3] = { 1, 2, 5 };
    double s = 1;
    for (int e = 0; e < 8; e++)
        for (int m = 0; m < 3; m++) {
            s = mant[m] * pow(10.0, e);
            if ((ceil(hi / s) - floor(lo / s)) <= 8)
                goto found;
        }
found:
    *step = s;
    *x0 = floor(lo / s) * s;
    *x1 = ceil(hi / s) * s;
}

/* One bar: from the axis's left end to v; its value to the right. */
static void bar(qcal_buf *b, const char *cls, double v, double y, double x0, double x1,
                double pw)
{
    double w = isnan(v) ? 0 : v >= x1 ? pw : v <= x0 ? 0 : (v - x0) / (x1 - x0) * pw;
    if (!isnan(v)) {
        qcal_html_putf(b, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                          "height=\"%.1f\" data-db=\"", cls, LABEL_W, y, w, BAR_H);
        db_attr(b, v);
        qcal_html_put(b, "\"/>");
    }
    qcal_html_putf(b, "<text class=\"v\" x=\"%.1f\" y=\"%.1f\">", LABEL_W + w + 3, y + BAR_H);
    num_text(b, v);
    qcal_html_put(b, "</text>");
}

/* The op's name as the chart shows it: its last NAME_MAX bytes (ops differ at the end of
 * their paths), cut at a character boundary, "..." in front when cut. */
static void short_name(qcal_buf *b, const char *name)
{
    size_t n = strlen(name);
    if (!n) {
        qcal_html_put(b, "(unnamed)");
        return;
    }
    if (n <= NAME_MAX) {
        qcal_html_text(b, name);
        return;
    }
    const char *p = name + n - NAME_MAX;
    while (*p && ((unsigned char)*p & 0xC0) == 0x80)
        p++;
    qcal_html_put(b, "&#8230;");
    qcal_html_text(b, p);
}

static void sensitivity_chart(qcal_buf *b, const qcal_accuracy_report *r)
{
    double x0, x1, step;
    axis(r, &x0, &x1, &step);
    double pw = CHART_W - LABEL_W - VALUE_W, h = TOP + ROW_H * (double)r->n_ops + BOTTOM;
    double yb = h - BOTTOM;
    qcal_html_putf(b, "<svg class=\"bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
                      "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"per-op "
                      "sensitivity\" data-x0=\"%.17g\" data-x1=\"%.17g\" data-left=\"%.0f\" "
                      "data-plot-width=\"%.0f\">", CHART_W, h, CHART_W, h, x0, x1, LABEL_W, pw);
    for (double t = x0; t <= x1 + 0.5 * step; t += step) {
        double x = LABEL_W + (t - x0) / (x1 - x0) * pw;
        qcal_html_putf(b, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>",
                       x, TOP - 4, x, yb, x, yb + 14, fabs(t) < 1e-9 * step ? 0.0 : t);
    }
    qcal_html_putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">SQNR at the model's "
                      "outputs (dB)</text>", LABEL_W + pw / 2, h - 6);
    for (int64_t i = 0; i < r->n_ops; i++) {
        const qcal_accuracy_op *o = &r->ops[i];
        double y = TOP + ROW_H * (double)i;
        qcal_html_putf(b, "<g class=\"op\" data-rank=\"%lld\"><title>", (long long)(i + 1));
        qcal_html_text(b, o->name[0] ? o->name : "(unnamed)");
        qcal_html_put(b, " (");
        qcal_html_text(b, o->op_type);
        qcal_html_put(b, "): alone ");
        num_text(b, o->sqnr_only_db);
        qcal_html_put(b, " dB, all but ");
        num_text(b, o->sqnr_others_db);
        qcal_html_putf(b, " dB</title><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">",
                       LABEL_W - 6, y + BAR_H + 5);
        short_name(b, o->name);
        qcal_html_put(b, " <tspan class=\"t\">");
        qcal_html_text(b, o->op_type);
        qcal_html_put(b, "</tspan></text>");
        bar(b, "alone", o->sqnr_only_db, y + 2, x0, x1, pw);
        bar(b, "allbut", o->sqnr_others_db, y + 2 + BAR_H + 1, x0, x1, pw);
        qcal_html_put(b, "</g>");
    }
    double g = r->gated_sqnr_db;
    if (!isnan(g)) {
        double x = LABEL_W + (g >= x1 ? pw : g <= x0 ? 0 : (g - x0) / (x1 - x0) * pw);
        qcal_html_putf(b, "<line class=\"ref\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                          "data-db=\"", x, TOP - 14, x, yb);
        db_attr(b, g);
        qcal_html_putf(b, "\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">every op "
                          "quantized: ", x, TOP - 18);
        num_text(b, g);
        qcal_html_put(b, " dB</text>");
    }
    qcal_html_put(b, "</svg>");
}

static void outputs_table(qcal_buf *b, const qcal_accuracy_report *r, bool acc)
{
    qcal_html_put(b, "<div class=\"wrap\"><table class=\"sortable\"><thead><tr>"
                     "<th class=\"l\">output</th><th>SQNR</th><th>cosine</th>"
                     "<th title=\"positions whose argmax over the last axis agrees\">top-1 "
                     "agreement</th><th title=\"samples all of whose positions agree\">exact "
                     "agreement</th>");
    if (acc)
        qcal_html_put(b, "<th>float accuracy</th><th>quantized accuracy</th><th>drop</th>");
    qcal_html_put(b, "<th>samples</th><th>positions</th><th>non-finite</th></tr></thead><tbody>");
    for (int64_t i = 0; i < r->n_outputs; i++) {
        const qcal_accuracy_output *o = &r->outputs[i];
        qcal_html_put(b, "<tr><td class=\"l\">");
        qcal_html_text(b, o->name);
        qcal_html_put(b, "</td>");
        cell(b, o->sqnr_db, 1, "%.2f", " dB");
        cell(b, o->cosine, 1, "%.6f", "");
        cell(b, o->agree, 100, "%.2f", "%");
        cell(b, o->exact_agree, 100, "%.2f", "%");
        if (acc) {
            cell(b, o->acc_float, 100, "%.2f", "%");
            cell(b, o->acc_quant, 100, "%.2f", "%");
            cell(b, o->acc_float - o->acc_quant, 100, "%.2f", " pt");
        }
        qcal_html_putf(b, "<td data-v=\"%lld\">%lld</td><td data-v=\"%lld\">%lld</td>"
                          "<td data-v=\"%lld\">%lld</td></tr>",
                       (long long)o->samples, (long long)o->samples, (long long)o->positions,
                       (long long)o->positions, (long long)o->nonfinite, (long long)o->nonfinite);
    }
    qcal_html_put(b, "</tbody></table></div>");
}

static void ops_table(qcal_buf *b, const qcal_accuracy_report *r)
{
    qcal_html_put(b, "<div class=\"wrap\"><table class=\"sortable\" id=\"ops\"><thead><tr>"
                     "<th>rank</th><th class=\"l\">op</th><th class=\"l\">type</th>"
                     "<th title=\"only this op quantized\">alone</th>"
                     "<th title=\"every op but this one quantized\">all but</th></tr></thead><tbody>");
    for (int64_t i = 0; i < r->n_ops; i++) {
        const qcal_accuracy_op *o = &r->ops[i];
        qcal_html_putf(b, "<tr><td data-v=\"%lld\">%lld</td><td class=\"l\">", (long long)(i + 1),
                       (long long)(i + 1));
        qcal_html_text(b, o->name[0] ? o->name : "(unnamed)");
        qcal_html_put(b, "</td><td class=\"l\">");
        qcal_html_text(b, o->op_type);
        qcal_html_put(b, "</td>");
        cell(b, o->sqnr_only_db, 1, "%.2f", " dB");
        cell(b, o->sqnr_others_db, 1, "%.2f", " dB");
        qcal_html_put(b, "</tr>");
    }
    qcal_html_put(b, "</tbody></table></div>");
}

void qcal_accuracy_html_options_default(qcal_accuracy_html_options *opt)
{
    if (!opt)
        return;
    opt->title = "qcal accuracy report";
    opt->source = NULL;
}

qcal_status qcal_accuracy_report_write_html(const qcal_accuracy_report *rep,
                                            const qcal_accuracy_html_options *opt,
                                            const char *path)
{
    if (!rep || !path || (rep->n_outputs && !rep->outputs) || (rep->n_ops && !rep->ops))
        return qcal_error(QCAL_ERR_INVALID_ARG, "accuracy report or path is NULL");
    qcal_accuracy_html_options o;
    qcal_accuracy_html_options_default(&o);
    if (opt) {
        if (opt->title)
            o.title = opt->title;
        o.source = opt->source;
    }
    const qcal_accuracy_source *src = o.source;
    bool acc = src && src->metric;
    for (int64_t i = 0; i < rep->n_outputs; i++)
        acc |= !isnan(rep->outputs[i].acc_float) || !isnan(rep->outputs[i].acc_quant);
    qcal_buf b = { 0 };
    qcal_html_put(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
                      "<title>");
    qcal_html_text(&b, o.title);
    qcal_html_put(&b, "</title><style>");
    qcal_html_put(&b, qcal_html_css);
    qcal_html_put(&b, page_css);
    qcal_html_put(&b, "</style></head><body><header><h1>");
    qcal_html_text(&b, o.title);
    qcal_html_put(&b, "</h1><p class=\"sub\">");
    if (src && src->float_model && src->float_model[0]) {
        qcal_html_put(&b, "float <b>");
        qcal_html_text(&b, src->float_model);
        qcal_html_put(&b, "</b> &#183; ");
    }
    if (src && src->quantized_model && src->quantized_model[0]) {
        qcal_html_put(&b, "quantized <b>");
        qcal_html_text(&b, src->quantized_model);
        qcal_html_put(&b, "</b> &#183; ");
    }
    if (src && src->engine && src->engine[0]) {
        qcal_html_put(&b, "ONNX Runtime ");
        qcal_html_text(&b, src->engine);
        qcal_html_put(&b, " &#183; ");
    }
    qcal_html_putf(&b, "%lld samples &#183; SQNR over every float output <b>",
                   (long long)rep->samples);
    num_text(&b, rep->sqnr_db);
    qcal_html_putf(&b, " dB</b> &#183; qcal %s</p></header>", qcal_version());
    qcal_html_put(&b, "<h2>Outputs</h2><p class=\"sub\">The quantized model against the float "
                      "one on the same data: SQNR = 10&#183;log10(&#931;f&#178; / &#931;(f "
                      "&#8722; q)&#178;) over an output's finite values; agreement of the "
                      "argmax over the last axis per position (top-1) and per whole sample "
                      "(exact)");
    if (acc) {
        qcal_html_put(&b, "; accuracy against the labels");
        if (src && src->metric) {
            qcal_html_put(&b, " (");
            qcal_html_text(&b, src->metric);
            qcal_html_put(&b, ")");
        }
    }
    qcal_html_put(&b, ".</p>");
    outputs_table(&b, rep, acc);
    qcal_html_putf(&b, "<h2>Per-op sensitivity</h2><p class=\"sub\">%lld quantized ops on %lld "
                       "samples (one gated model: float kernels, Q/DQ simulated), most sensitive "
                       "first. <span class=\"chip\" style=\"background:" COLOUR_ALONE "\"></span>"
                       "alone: the SQNR at the outputs with only this op quantized (low: the op "
                       "hurts); <span class=\"chip\" style=\"background:" COLOUR_ALL_BUT "\">"
                       "</span>all but: every other op quantized (high: keeping this op in float "
                       "helps); dashed: every op quantized (",
                   (long long)rep->n_ops, (long long)rep->sensitivity_samples);
    num_text(&b, rep->gated_sqnr_db);
    qcal_html_put(&b, " dB).</p>");
    if (rep->n_ops) {
        qcal_html_put(&b, "<figure>");
        sensitivity_chart(&b, rep);
        qcal_html_put(&b, "</figure>");
        ops_table(&b, rep);
    }
    qcal_html_put(&b, "<script>");
    qcal_html_put(&b, qcal_html_sort_script);
    qcal_html_put(&b, "</script></body></html>\n");
    qcal_status st;
    if (b.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot build the accuracy report");
    else
        st = qcal_blob_write_file(path, b.data, b.len);
    qcal_buf_free(&b);
    return st;
}
