/* The HTML calibration report of an observer evaluation: one self-contained file (inline
 * SVG and CSS, a few lines of JavaScript to sort the summary table, nothing fetched).
 *
 *   - summary: tensors x observers, SQNR and clipped fraction, the recommendation;
 *   - per tensor: the data's histogram on a log count scale with every observer's clipping
 *     range drawn over it and the mass each one clips; the objective curve of each
 *     searching observer (L2 for histogram, KL for entropy, MSE for mse) against the
 *     threshold with the chosen point; per-channel ranges for weights; the numeric suite's
 *     per-layer SQNR when one was attached.
 * Every name is HTML-escaped. Drawings are downsampled (report_bins histogram bins, at most
 * CURVE_POINTS curve points and RANGE_BARS channel bars), so 500 tensors stay a few MB. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "numeric/evaluate_impl.h"
#include "qcal/observer.h"
#include "qcal/observers/histogram.h"
#include "qcal_config.h"

#define CURVE_POINTS 80
#define RANGE_BARS 128

/* Okabe-Ito colours (distinguishable with common colour-vision deficiencies), by kind. */
static const char *kind_colour(qcal_observer_kind k)
{
    switch (k) {
    case QCAL_OBSERVER_MINMAX: return "#000000";
    case QCAL_OBSERVER_MOVING_AVERAGE_MINMAX: return "#999999";
    case QCAL_OBSERVER_PER_CHANNEL_MINMAX: return "#56B4E9";
    case QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX: return "#0072B2";
    case QCAL_OBSERVER_HISTOGRAM: return "#E69F00";
    case QCAL_OBSERVER_PERCENTILE: return "#009E73";
    case QCAL_OBSERVER_ENTROPY: return "#D55E00";
    case QCAL_OBSERVER_MSE: return "#CC79A7";
    default: return "#444444";
    }
}

/* The r-th kind in the order of simplicity. */
static qcal_observer_kind simplicity_kind(int r)
{
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
        if (qcal_numeric_eval_simplicity((qcal_observer_kind)k) == r)
            return (qcal_observer_kind)k;
    return QCAL_OBSERVER_MINMAX;
}

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

/* printf into b for the report's formats: %s, %d, %x, %lld, %llu, %% and float
 * conversions (%.Nf, %.Ng). "%.1f" (every SVG coordinate) is written compact: rounded to
 * one decimal without a trailing ".0" ("206" for 206.0, "-0" as "0"), which keeps 500
 * tensors' drawings a few MB. */
static void putf(qcal_buf *b, const char *fmt, ...) QCAL_PRINTF(2, 3);
static void putf(qcal_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *p = fmt;
    while (*p) {
        const char *q = strchr(p, '%');
        if (!q) {
            put(b, p);
            break;
        }
        qcal_buf_append(b, p, (size_t)(q - p));
        char spec[16], tmp[512];
        size_t k = 0;
        spec[k++] = *q++;
        while (*q && !strchr("fgsdxu%", *q) && k < sizeof spec - 2)
            spec[k++] = *q++;
        char conv = *q ? *q++ : '%';
        spec[k++] = conv;
        spec[k] = 0;
        p = q;
        if (conv == '%') {
            put(b, "%");
        } else if (conv == 's') {
            put(b, va_arg(ap, const char *));
        } else if (conv == 'f' || conv == 'g') {
            double v = va_arg(ap, double);
            if (!strcmp(spec, "%.1f")) {
                double r = round(v * 10.0) / 10.0;
                snprintf(tmp, sizeof tmp, "%.1f", r == 0 ? 0.0 : r);
                size_t l = strlen(tmp);
                if (l > 2 && !strcmp(tmp + l - 2, ".0"))
                    tmp[l - 2] = 0;
            } else {
                snprintf(tmp, sizeof tmp, spec, v);
            }
            put(b, tmp);
        } else if (!strcmp(spec, "%lld")) {
            snprintf(tmp, sizeof tmp, "%lld", va_arg(ap, long long));
            put(b, tmp);
        } else if (!strcmp(spec, "%llu")) {
            snprintf(tmp, sizeof tmp, "%llu", va_arg(ap, unsigned long long));
            put(b, tmp);
        } else {   /* %d, %x, %u with int-sized arguments */
            snprintf(tmp, sizeof tmp, spec, va_arg(ap, int));
            put(b, tmp);
        }
    }
    va_end(ap);
}

/* Text as HTML (element content and quoted attribute values). Bytes that are not valid
 * UTF-8 are shown as U+FFFD so the file stays valid UTF-8. */
static void put_html(qcal_buf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        if (c == '<') { put(b, "&lt;"); p++; continue; }
        if (c == '>') { put(b, "&gt;"); p++; continue; }
        if (c == '&') { put(b, "&amp;"); p++; continue; }
        if (c == '"') { put(b, "&quot;"); p++; continue; }
        if (c == '\'') { put(b, "&#39;"); p++; continue; }
        if (c < 0x20 || c == 0x7f) { putf(b, "&#x%x;", c == 0 ? 0xfffd : (c == '\t' ? c : 0xfffd)); p++; continue; }
        if (c < 0x80) { qcal_buf_append(b, p, 1); p++; continue; }
        int len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
        bool ok = len > 0;
        for (int i = 1; ok && i < len; i++)
            ok = (p[i] & 0xc0) == 0x80;
        if (ok) {
            qcal_buf_append(b, p, (size_t)len);
            p += len;
        } else {
            put(b, "&#xfffd;");
            p++;
        }
    }
}

/* A value for axis labels and tables: 4 significant digits. */
static void put_num(qcal_buf *b, double v)
{
    if (isnan(v))
        put(b, "n/a");
    else if (isinf(v))
        put(b, v > 0 ? "&#8734;" : "-&#8734;");
    else
        putf(b, "%.4g", v);
}

static const char *css =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;"
    "margin:24px auto;max-width:1200px;padding:0 16px;color:#1a1a1a;background:#fff}"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd}"
    "h3{font-size:16px;margin:0 0 4px;word-break:break-all}.sub{color:#555;margin:0 0 12px}"
    "table{border-collapse:collapse;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #e4e4e4;"
    "text-align:right;white-space:nowrap}th{background:#f4f4f4;cursor:pointer;position:sticky;top:0}"
    "th.l,td.l{text-align:left}td.l{max-width:360px;overflow:hidden;text-overflow:ellipsis}"
    "td.best{font-weight:700;background:#fff3d6}td.rec{background:#fff3d6;font-weight:600}.wrap{overflow-x:auto}"
    "td small{display:block;color:#666;font-size:11px}td.na{color:#aaa}"
    ".chip{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}"
    ".legend span{margin-right:14px;white-space:nowrap}"
    "article{border:1px solid #ddd;border-radius:6px;padding:12px 14px;margin:14px 0}"
    ".charts{display:flex;flex-wrap:wrap;gap:14px}figure{margin:0}figcaption{font-size:12px;color:#444}"
    "svg text{font:11px system-ui,'DejaVu Sans',sans-serif;fill:#333}.tag{font-size:12px;"
    "color:#fff;background:#666;border-radius:3px;padding:1px 6px;margin-left:6px;vertical-align:2px}"
    ".clip{font-size:12px;margin:4px 0 0;padding:0;list-style:none}.clip li{display:inline-block;margin-right:12px}"
    "path.c{stroke-width:1.6}";

static const char *script =
    "document.querySelectorAll('table.sortable th').forEach(function(th,i){"
    "th.addEventListener('click',function(){var t=th.closest('table'),b=t.tBodies[0],"
    "r=Array.from(b.rows),d=th.dataset.dir==='a'?-1:1;th.dataset.dir=d>0?'a':'d';"
    "r.sort(function(x,y){var u=x.cells[i].dataset.v,v=y.cells[i].dataset.v;"
    "if(u!==undefined&&v!==undefined)return d*(parseFloat(u)-parseFloat(v));"
    "return d*x.cells[i].textContent.localeCompare(y.cells[i].textContent)});"
    "r.forEach(function(x){b.appendChild(x)})})});";

/* Geometry of a chart: plot area inside margins. */
typedef struct chart {
    double w, h, l, r, t, btm;        /* size and margins */
    double x0, x1, y0, y1;            /* data ranges mapped to the plot area */
    bool logy;
} chart;

static double cx(const chart *c, double x)
{
    double span = c->x1 - c->x0;
    return c->l + (span > 0 ? (x - c->x0) / span : 0.5) * (c->w - c->l - c->r);
}

static double cy(const chart *c, double y)
{
    double a = c->logy ? log10(y + 1.0) : y, lo = c->logy ? log10(c->y0 + 1.0) : c->y0;
    double hi = c->logy ? log10(c->y1 + 1.0) : c->y1;
    double f = hi > lo ? (a - lo) / (hi - lo) : 0;
    return c->h - c->btm - f * (c->h - c->t - c->btm);
}

static void chart_open(qcal_buf *b, const chart *c, const char *label)
{
    putf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"", c->w, c->h, c->w, c->h);
    put_html(b, label);
    put(b, "\">");
    putf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fafafa\" "
            "stroke=\"#bbb\"/>", c->l, c->t, c->w - c->l - c->r, c->h - c->t - c->btm);
}

/* X axis ticks at the ends and the middle, and axis titles. */
static void chart_axes(qcal_buf *b, const chart *c, const char *xtitle, const char *ytitle,
                       const char *ylo, const char *yhi)
{
    double yb = c->h - c->btm;
    put(b, "<path stroke=\"#888\" d=\"");
    for (int i = 0; i <= 4; i++)
        putf(b, "M%.1f %.1fv4", cx(c, c->x0 + (c->x1 - c->x0) * i / 4.0), yb);
    put(b, "\"/>");
    for (int i = 0; i <= 4; i++) {
        double v = c->x0 + (c->x1 - c->x0) * i / 4.0;
        double x = cx(c, v);
        if (fabs(v) < 1e-4 * fabs(c->x1 - c->x0))
            v = 0;   /* the middle of a symmetric axis: "0", not rounding noise */
        putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, yb + 16,
             i == 0 ? "start" : i == 4 ? "end" : "middle");
        put_num(b, v);
        put(b, "</text>");
    }
    putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
         (c->l + c->w - c->r) / 2, c->h - 4, xtitle);
    putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", c->l - 4, yb, ylo);
    putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", c->l - 4, c->t + 9, yhi);
    putf(b, "<text transform=\"translate(12 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>",
         (c->t + c->h - c->btm) / 2, ytitle);
}

/* The data histogram with every candidate's clipping range. */
static void histogram_chart(qcal_buf *b, const qcal_numeric_eval *ev, const eval_entry *e)
{
    int64_t nb = ev->opt.report_bins;
    uint64_t peak = 0;
    for (int64_t i = 0; i < nb; i++)
        if (e->hist[i] > peak)
            peak = e->hist[i];
    /* x covers the data and every clipping range (a range may extend past the data). */
    double x0 = e->dmin, x1 = e->dmax;
    for (int j = 0; j < e->nc; j++) {
        const qcal_numeric_eval_candidate *c = &e->pub[j];
        if (c->channels == 1 && isfinite(c->min_val[0]) && isfinite(c->max_val[0])) {
            x0 = fmin(x0, c->min_val[0]);
            x1 = fmax(x1, c->max_val[0]);
        }
    }
    if (!(x1 > x0)) {
        x0 -= 1;
        x1 += 1;
    }
    chart c = { .w = 500, .h = 240, .l = 58, .r = 12, .t = 10, .btm = 34,
                .x0 = x0 - 0.02 * (x1 - x0), .x1 = x1 + 0.02 * (x1 - x0), .y0 = 0,
                .y1 = (double)peak, .logy = true };
    char label[64];
    snprintf(label, sizeof label, "histogram of %llu values", (unsigned long long)e->count);
    chart_open(b, &c, label);
    /* Bars as one path: a step outline filled. */
    double w = ((double)e->dmax - e->dmin) / (double)nb;
    put(b, "<path fill=\"#9ecae1\" stroke=\"#3182bd\" stroke-width=\"0.6\" d=\"");
    putf(b, "M%.1f %.1f", cx(&c, e->dmin), cy(&c, 0));
    for (int64_t i = 0; i < nb; i++) {
        if (i == 0 || e->hist[i] != e->hist[i - 1])
            putf(b, "V%.1f", cy(&c, (double)e->hist[i]));
        putf(b, "H%.1f", cx(&c, e->dmin + w * (double)(i + 1)));
    }
    putf(b, "V%.1fZ\"/>", cy(&c, 0));
    /* Clipping ranges: one dashed colour pair per per-tensor candidate. */
    for (int j = 0; j < e->nc; j++) {
        const qcal_numeric_eval_candidate *k = &e->pub[j];
        if (k->channels != 1 || !isfinite(k->min_val[0]))
            continue;
        const char *col = kind_colour(k->kind);
        double dash = 3 + j;
        /* Both ends as one dashed path (one tooltip). */
        putf(b, "<path class=\"c\" stroke=\"%s\" stroke-dasharray=\"%.0f 2\" "
                "d=\"M%.1f %.1fV%.1fM%.1f %.1fV%.1f\"><title>%s [%.6g, %.6g]</title></path>", col,
             dash, cx(&c, k->min_val[0]), c.t, c.h - c.btm, cx(&c, k->max_val[0]), c.t,
             c.h - c.btm, qcal_observer_kind_name(k->kind), (double)k->min_val[0],
             (double)k->max_val[0]);
    }
    /* Log-scale ticks at 10, 100, ... below the peak. */
    for (double d = 10; d < (double)peak * 0.2; d *= 10) {   /* clear of the peak's label */
        double y = cy(&c, d);
        putf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>", c.l, y,
             c.w - c.r, y, c.l - 4, y + 4, d);
    }
    char yhi[32];
    snprintf(yhi, sizeof yhi, "%llu", (unsigned long long)peak);
    chart_axes(b, &c, "value", "count (log scale)", "0", yhi);
    put(b, "</svg>");
}

/* Per-channel weight ranges of the per_channel_minmax candidate (downsampled to RANGE_BARS
 * groups: each bar spans its group's min to max). */
static void channel_chart(qcal_buf *b, const eval_entry *e)
{
    const qcal_numeric_eval_candidate *k = NULL;
    for (int j = 0; j < e->nc; j++)
        if (e->pub[j].kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX)
            k = &e->pub[j];
    if (!k || k->channels < 2)
        return;
    int64_t ch = k->channels, groups = ch < RANGE_BARS ? ch : RANGE_BARS;
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < ch; i++) {
        if (isfinite(k->min_val[i]))
            lo = fmin(lo, k->min_val[i]);
        if (isfinite(k->max_val[i]))
            hi = fmax(hi, k->max_val[i]);
    }
    if (!(hi >= lo))
        return;
    if (hi == lo) {
        lo -= 1;
        hi += 1;
    }
    chart c = { .w = 380, .h = 240, .l = 58, .r = 12, .t = 10, .btm = 34, .x0 = 0,
                .x1 = (double)ch, .y0 = lo, .y1 = hi, .logy = false };
    put(b, "<figure>");
    chart_open(b, &c, "per-channel ranges");
    double zero = cy(&c, 0);
    if (lo < 0 && hi > 0)
        putf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#aaa\"/>", c.l,
             zero, c.w - c.r, zero);
    put(b, "<path fill=\"#56B4E9\" fill-opacity=\"0.8\" stroke=\"#0072B2\" stroke-width=\"0.5\" d=\"");
    for (int64_t g = 0; g < groups; g++) {
        int64_t a = g * ch / groups, z = (g + 1) * ch / groups;
        double gl = INFINITY, gh = -INFINITY;
        for (int64_t i = a; i < z; i++) {
            if (isfinite(k->min_val[i]))
                gl = fmin(gl, k->min_val[i]);
            if (isfinite(k->max_val[i]))
                gh = fmax(gh, k->max_val[i]);
        }
        if (!(gh >= gl))
            continue;
        double xa = cx(&c, (double)a), xz = cx(&c, (double)z);
        double ya = cy(&c, gh), yz = cy(&c, gl);
        if (yz - ya < 1)
            yz = ya + 1;
        putf(b, "M%.1f %.1fH%.1fV%.1fH%.1fZ", xa, ya, xz - (xz - xa > 2 ? 0.6 : 0), yz, xa);
    }
    put(b, "\"/>");
    char ylo[32], yhi[32];
    snprintf(ylo, sizeof ylo, "%.4g", lo);
    snprintf(yhi, sizeof yhi, "%.4g", hi);
    chart_axes(b, &c, "output channel", "range (min..max)", ylo, yhi);
    put(b, "</svg><figcaption>per-channel min..max (per_channel_minmax)");
    if (groups < ch)
        putf(b, ", %lld channels in %lld bars", (long long)ch, (long long)groups);
    put(b, "</figcaption></figure>");
}

/* The objective curve of a candidate's clipping search (qcal_observer_search_curve),
 * downsampled to at most cap points (every k-th candidate plus the chosen one): x = the
 * upper end of each candidate range. QCAL_ERR_UNSUPPORTED for kinds without a search. */
static qcal_status objective_curve(qcal_observer *obs, int64_t cap, float *th, double *err,
                                   int64_t *n, int64_t *chosen)
{
    qcal_observer_kind k = qcal_observer_get_config(obs)->kind;
    if (k != QCAL_OBSERVER_HISTOGRAM && k != QCAL_OBSERVER_ENTROPY && k != QCAL_OBSERVER_MSE)
        return QCAL_ERR_UNSUPPORTED;
    int64_t full = (int64_t)qcal_observer_get_config(obs)->bins + 1, m = 0, ch = -1;
    float *lo = qcal_malloc((size_t)full * sizeof(float));
    float *hi = qcal_malloc((size_t)full * sizeof(float));
    double *e = qcal_malloc((size_t)full * sizeof(double));
    qcal_status st = lo && hi && e ? qcal_observer_search_curve(obs, full, lo, hi, e, &m, &ch)
                                   : QCAL_ERR_NO_MEMORY;
    if (st == QCAL_OK && m > full)
        m = full;
    if (st == QCAL_OK && m >= 2) {
        int64_t step = (m + cap - 2) / (cap - 1), out = 0;
        *chosen = -1;
        for (int64_t i = 0; i < m && out < cap; i++) {
            bool keep = i % step == 0 || i == ch || i == m - 1;
            if (!keep)
                continue;
            if (i == ch)
                *chosen = out;
            th[out] = hi[i];
            err[out] = e[i];
            out++;
        }
        /* Draw in threshold order (the L2 search visits candidates from both tails). */
        for (int64_t i = 1; i < out; i++)
            for (int64_t j = i; j > 0 && th[j - 1] > th[j]; j--) {
                float t = th[j]; th[j] = th[j - 1]; th[j - 1] = t;
                double v = err[j]; err[j] = err[j - 1]; err[j - 1] = v;
                if (*chosen == j) *chosen = j - 1; else if (*chosen == j - 1) *chosen = j;
            }
        *n = out;
    } else if (st >= 0) {
        st = QCAL_ERR_UNSUPPORTED;
    }
    free(lo);
    free(hi);
    free(e);
    return st;
}

/* The objective curves of one tensor's searching candidates (at most 3). */
typedef struct curve {
    int j;                       /* candidate index */
    int64_t n, chosen;
    float t[CURVE_POINTS];       /* thresholds */
    double v[CURVE_POINTS];      /* objective */
} curve;

typedef struct curve_set {
    int nc;
    curve cur[3];
} curve_set;

/* Computes a tensor's curves (the searches dominate the report's time; tensors are
 * independent, so write_report runs this over them in parallel). */
static void compute_curves(const eval_entry *e, curve_set *cs)
{
    cs->nc = 0;
    for (int j = 0; j < e->nc && cs->nc < 3; j++) {
        int64_t n = 0, chosen = -1;
        if (objective_curve(e->c[j].obs, CURVE_POINTS, cs->cur[cs->nc].t, cs->cur[cs->nc].v, &n,
                            &chosen) < 0 || n < 2) {
            qcal_clear_error();
            continue;
        }
        cs->cur[cs->nc].j = j;
        cs->cur[cs->nc].n = n;
        cs->cur[cs->nc].chosen = chosen;
        cs->nc++;
    }
}

/* Objective curves of the searching candidates, each normalised to its own [min, max]. */
static void curve_chart(qcal_buf *b, const eval_entry *e, const curve_set *cs)
{
    const int nc = cs->nc;
    const curve *cur = cs->cur;
    double x0 = INFINITY, x1 = -INFINITY;
    for (int k = 0; k < nc; k++)
        for (int64_t i = 0; i < cur[k].n; i++) {
            x0 = fmin(x0, cur[k].t[i]);
            x1 = fmax(x1, cur[k].t[i]);
        }
    if (!nc)
        return;
    chart c = { .w = 380, .h = 240, .l = 58, .r = 12, .t = 10, .btm = 34, .x0 = x0, .x1 = x1,
                .y0 = 0, .y1 = 1, .logy = false };
    put(b, "<figure>");
    chart_open(b, &c, "objective against threshold");
    for (int k = 0; k < nc; k++) {
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t i = 0; i < cur[k].n; i++)
            if (isfinite(cur[k].v[i])) {
                lo = fmin(lo, cur[k].v[i]);
                hi = fmax(hi, cur[k].v[i]);
            }
        if (!(hi >= lo))
            continue;
        const char *col = kind_colour(e->c[cur[k].j].kind);
        putf(b, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" d=\"", col);
        bool pen = false;
        for (int64_t i = 0; i < cur[k].n; i++) {
            if (!isfinite(cur[k].v[i])) {
                pen = false;
                continue;
            }
            double f = hi > lo ? (cur[k].v[i] - lo) / (hi - lo) : 0;
            putf(b, "%s%.1f %.1f", pen ? "L" : "M", cx(&c, cur[k].t[i]), cy(&c, f));
            pen = true;
        }
        put(b, "\"/>");
        int64_t ch = cur[k].chosen;
        if (ch >= 0 && ch < cur[k].n && isfinite(cur[k].v[ch])) {
            double f = hi > lo ? (cur[k].v[ch] - lo) / (hi - lo) : 0;
            putf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\" stroke=\"#fff\" "
                    "stroke-width=\"1.5\"><title>%s chosen threshold %.6g</title></circle>",
                 cx(&c, cur[k].t[ch]), cy(&c, f), col,
                 qcal_observer_kind_name(e->c[cur[k].j].kind), (double)cur[k].t[ch]);
        }
    }
    chart_axes(b, &c, "threshold", "error (normalised)", "min", "max");
    put(b, "</svg><figcaption>");
    for (int k = 0; k < nc; k++) {
        qcal_observer_kind kd = e->c[cur[k].j].kind;
        putf(b, "<span class=\"chip\" style=\"background:%s\"></span>%s %s &nbsp; ",
             kind_colour(kd), qcal_observer_kind_name(kd),
             kd == QCAL_OBSERVER_ENTROPY ? "(KL)" : kd == QCAL_OBSERVER_MSE ? "(MSE)"
             : kd == QCAL_OBSERVER_HISTOGRAM ? "(L2)" : "");
    }
    put(b, "&#9679; chosen</figcaption></figure>");
}

static const char *short_name(qcal_observer_kind k)
{
    switch (k) {
    case QCAL_OBSERVER_MINMAX: return "minmax";
    case QCAL_OBSERVER_MOVING_AVERAGE_MINMAX: return "MA minmax";
    case QCAL_OBSERVER_PER_CHANNEL_MINMAX: return "per-ch minmax";
    case QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX: return "MA per-ch";
    case QCAL_OBSERVER_HISTOGRAM: return "histogram";
    case QCAL_OBSERVER_PERCENTILE: return "percentile";
    case QCAL_OBSERVER_ENTROPY: return "entropy";
    case QCAL_OBSERVER_MSE: return "mse";
    default: return "?";
    }
}

/* Tensors x observers: each cell holds the SQNR (sort key) and, below it, the clipped
 * fraction. */
static void summary_table(qcal_buf *b, const qcal_numeric_eval *ev, const bool *used,
                          bool any_layer)
{
    put(b, "<div class=\"wrap\"><table class=\"sortable\"><thead><tr><th class=\"l\">tensor</th>"
           "<th class=\"l\">role</th><th class=\"l\">recommended</th>");
    if (any_layer)   /* next to the recommendation, visible without scrolling */
        put(b, "<th title=\"numeric suite: per-layer SQNR of the int8 model\">int8 layer</th>");
    for (int r = 0; r < QCAL_OBSERVER_KIND_COUNT; r++) {
        qcal_observer_kind k = simplicity_kind(r);
        if (used[k])
            putf(b, "<th title=\"%s: SQNR in dB (clipped fraction below)\"><span class=\"chip\" "
                    "style=\"background:%s\"></span>%s</th>", qcal_observer_kind_name(k),
                 kind_colour(k), short_name(k));
    }
    put(b, "</tr></thead><tbody>");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        putf(b, "<tr><td class=\"l\"><a href=\"#t%lld\">", (long long)i);
        put_html(b, e->name);
        putf(b, "</a></td><td class=\"l\">%s</td><td class=\"l rec\">%s</td>",
             qcal_calib_role_name(e->role), qcal_observer_kind_name(e->c[e->recommended].kind));
        if (any_layer) {
            if (e->has_layer_sqnr) {
                putf(b, "<td data-v=\"%.6g\">", isfinite(e->layer_sqnr) ? e->layer_sqnr : 1e300);
                put_num(b, e->layer_sqnr);
                put(b, " dB</td>");
            } else {
                put(b, "<td data-v=\"-1e300\" class=\"na\">&#8211;</td>");
            }
        }
        for (int r = 0; r < QCAL_OBSERVER_KIND_COUNT; r++) {
            qcal_observer_kind k = simplicity_kind(r);
            if (!used[k])
                continue;
            int j;
            for (j = 0; j < e->nc && e->c[j].kind != k; j++)
                ;
            if (j == e->nc) {
                put(b, "<td data-v=\"-1e300\" class=\"na\">&#8211;</td>");
                continue;
            }
            const qcal_numeric_eval_candidate *c = &e->pub[j];
            double v = isfinite(c->sqnr_db) ? c->sqnr_db : (c->sqnr_db > 0 ? 1e300 : -1e300);
            putf(b, "<td data-v=\"%.6g\"%s>", v, j == e->recommended ? " class=\"best\"" : "");
            put_num(b, c->sqnr_db);
            put(b, " dB<small>");
            if (c->clipped == 0)
                put(b, "0 clipped");
            else
                putf(b, "%.2g%% clipped", 100.0 * c->clipped);
            put(b, "</small></td>");
        }
        put(b, "</tr>");
    }
    put(b, "</tbody></table></div>");
}

qcal_status qcal_numeric_eval_write_report(const qcal_numeric_eval *ev,
                                           const qcal_numeric_report_options *opt,
                                           const char *path)
{
    if (!ev || !path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or path is NULL");
    int64_t n;
    qcal_status st = qcal_numeric_eval_count(ev, &n);
    if (st >= 0 && n > 0) {
        qcal_numeric_eval_tensor t;
        st = qcal_numeric_eval_result(ev, 0, &t);   /* sorts and recommends */
    }
    if (st < 0)
        return st;
    qcal_numeric_report_options o;
    qcal_numeric_report_options_default(&o);
    if (opt) {
        if (opt->title)
            o.title = opt->title;
        o.source = opt->source;
    }
    if (!o.source)
        o.source = ev->source;
    bool used[QCAL_OBSERVER_KIND_COUNT] = { false }, any_layer = false;
    for (int64_t i = 0; i < ev->n; i++) {
        for (int j = 0; j < ev->e[i].nc; j++)
            used[ev->e[i].c[j].kind] = true;
        any_layer |= ev->e[i].has_layer_sqnr;
    }
    curve_set *curves = qcal_calloc(ev->n ? (size_t)ev->n : 1, sizeof *curves);
    if (!curves)
        return QCAL_ERR_NO_MEMORY;
    {
        const int64_t nt = ev->n;
        const eval_entry *es = ev->e;
#if QCAL_HAVE_OPENMP
        int threads = qcal_threads_for(nt * (int64_t)QCAL_OMP_MIN_ELEMENTS);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
#endif
        for (int64_t i = 0; i < nt; i++)
            compute_curves(&es[i], &curves[i]);
    }
    qcal_buf b = { 0 };
    put(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>");
    put_html(&b, o.title);
    put(&b, "</title><style>");
    put(&b, css);
    put(&b, "</style></head><body><header><h1>");
    put_html(&b, o.title);
    put(&b, "</h1><p class=\"sub\">");
    if (o.source) {
        put_html(&b, o.source);
        put(&b, " &#183; ");
    }
    putf(&b, "%lld tensors &#183; qcal %s</p></header>", (long long)ev->n, qcal_version());
    put(&b, "<h2>Summary</h2><p class=\"legend\">");
    for (int r = 0; r < QCAL_OBSERVER_KIND_COUNT; r++) {
        qcal_observer_kind k = simplicity_kind(r);
        if (used[k])
            putf(&b, "<span><span class=\"chip\" style=\"background:%s\"></span>%s</span>",
                 kind_colour(k), qcal_observer_kind_name(k));
    }
    put(&b, "</p><p class=\"sub\">SQNR = 20&#183;log10(&#8214;x&#8214; / &#8214;x &#8722; "
            "fakequant(x)&#8214;) over all of a tensor's values with each observer's qparams; "
            "clipped = fraction of values outside the observer's representable range; "
            "recommended = highest SQNR, ties to the simpler observer (bold). "
            "Click a column to sort.</p>");
    summary_table(&b, ev, used, any_layer);
    put(&b, "<h2>Tensors</h2>");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        putf(&b, "<article id=\"t%lld\"><h3>", (long long)i);
        put_html(&b, e->name);
        putf(&b, "<span class=\"tag\">%s</span></h3><p class=\"sub\">recommended <b>%s</b> &#183; "
                 "%llu values in [", qcal_calib_role_name(e->role),
             qcal_observer_kind_name(e->c[e->recommended].kind), (unsigned long long)e->count);
        put_num(&b, e->dmin);
        put(&b, ", ");
        put_num(&b, e->dmax);
        put(&b, "]");
        if (e->nonfinite)
            putf(&b, " &#183; %llu NaN/Inf skipped", (unsigned long long)e->nonfinite);
        if (e->has_layer_sqnr) {
            put(&b, " &#183; int8 layer SQNR ");
            put_num(&b, e->layer_sqnr);
            put(&b, " dB");
        }
        put(&b, "</p><div class=\"charts\"><figure>");
        histogram_chart(&b, ev, e);
        put(&b, "<figcaption>data histogram (log counts) with each observer's clipping range "
                "(dashed); clipped mass:</figcaption><ul class=\"clip\">");
        for (int j = 0; j < e->nc; j++) {
            const qcal_numeric_eval_candidate *c = &e->pub[j];
            putf(&b, "<li><span class=\"chip\" style=\"background:%s\"></span>%s ",
                 kind_colour(c->kind), qcal_observer_kind_name(c->kind));
            if (c->channels == 1) {
                put(&b, "[");
                put_num(&b, c->min_val[0]);
                put(&b, ", ");
                put_num(&b, c->max_val[0]);
                put(&b, "] ");
            } else {
                putf(&b, "(%lld channels) ", (long long)c->channels);
            }
            putf(&b, "%.3g%% clipped, ", 100.0 * c->clipped);
            put_num(&b, c->sqnr_db);
            put(&b, " dB</li>");
        }
        put(&b, "</ul></figure>");
        curve_chart(&b, e, &curves[i]);
        if (e->role == QCAL_CALIB_ROLE_WEIGHT)
            channel_chart(&b, e);
        put(&b, "</div></article>");
    }
    put(&b, "<script>");
    put(&b, script);
    put(&b, "</script></body></html>\n");
    if (b.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot build the report");
    else
        st = qcal_numeric_eval_write_file(path, b.data, b.len);
    qcal_buf_free(&b);
    free(curves);
    return st;
}
