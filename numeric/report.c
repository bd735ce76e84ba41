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
#include "io/text.h"
#include "numeric/evaluate_impl.h"
#include "numeric/html.h"
#include "qcal/observer.h"
#include "qcal/observers/histogram.h"
#include "qcal_config.h"

#define CURVE_POINTS 80
#define RANGE_BARS 128

/* Short names for numeric/html.h's builders: the drawing code below calls them often. */
#define put qcal_html_put
#define putf qcal_html_putf
#define put_html qcal_html_text
#define put_num qcal_html_num
#define css qcal_html_css
#define script qcal_html_sort_script

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

void qcal_numeric_report_percent(char *buf, size_t cap, double frac)
{
    double p = 100.0 * frac;
    if (!(p > 0.0)) {
        snprintf(buf, cap, "0%%");
        return;
    }
    if (p < 5e-7) {
        snprintf(buf, cap, "<0.000001%%");
        return;
    }
    char tmp[48];
    int dec = p >= 9.95 ? 0 : 1 - (int)floor(log10(p));   /* two significant digits */
    if (dec > 6)
        dec = 6;
    snprintf(tmp, sizeof tmp, "%.*f", dec, p);
    while (frac < 1.0 && dec < 6 && atof(tmp) >= 100.0)   /* 99.96% is not "100%" */
        snprintf(tmp, sizeof tmp, "%.*f", ++dec, p);
    if (strchr(tmp, '.')) {   /* "0.0100" -> "0.01" */
        size_t l = strlen(tmp);
        while (tmp[l - 1] == '0')
            tmp[--l] = '\0';
        if (tmp[l - 1] == '.')
            tmp[--l] = '\0';
    }
    snprintf(buf, cap, "%s%%", tmp);
}

static void put_percent(qcal_buf *b, double frac)
{
    char tmp[48];
    qcal_numeric_report_percent(tmp, sizeof tmp, frac);
    put(b, tmp);
}

/* Geometry of a chart: plot area inside margins. */
typedef struct chart {
    double w, h, l, r, t, btm;        /* size and margins */
    double x0, x1, y0, y1;            /* data ranges mapped to the plot area */
    bool logy;
    int xprec;                        /* significant digits of x tick labels (0: 4) */
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
        if (c->xprec > 5 && i % 2)   /* long labels: ends and middle only */
            continue;
        double v = c->x0 + (c->x1 - c->x0) * i / 4.0;
        double x = cx(c, v);
        if (fabs(v) < 1e-4 * fabs(c->x1 - c->x0))
            v = 0;   /* the middle of a symmetric axis: "0", not rounding noise */
        putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, yb + 16,
             i == 0 ? "start" : i == 4 ? "end" : "middle");
        if (c->xprec > 4 && isfinite(v)) {
            char s[40];
            snprintf(s, sizeof s, "%.*g", c->xprec, v);
            put(b, s);
        } else {
            put_num(b, v);
        }
        put(b, "</text>");
    }
    putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
         (c->l + c->w - c->r) / 2, c->h - 4, xtitle);
    if (*ylo)
        putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", c->l - 4, yb, ylo);
    if (*yhi)
        putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", c->l - 4, c->t + 9,
             yhi);
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

/* One searching candidate's objective: every candidate range its search evaluated
 * (qcal_observer_histogram_search_curve), sorted by the range's width (max - min; ties in visit
 * order). The width is what the candidates of every search have in common (the L2 search
 * shrinks either end, entropy and mse grow a threshold), and the L2 path becomes a curve
 * over it. v is +inf or NaN where the objective is undefined (KL of a threshold that
 * empties a quantized bin): drawn as a gap. */
typedef struct curve {
    int j;                       /* candidate index */
    int64_t n, defined, chosen;  /* chosen: index after sorting, -1 if none */
    float *lo, *hi;              /* n candidate ranges */
    double *v;                   /* n objective values */
} curve;

static void curve_free(curve *c)
{
    free(c->lo);
    free(c->hi);
    free(c->v);
    c->lo = c->hi = NULL;
    c->v = NULL;
}

typedef struct width_key {
    double w;
    int64_t i;
} width_key;

static int width_cmp(const void *a, const void *b)
{
    const width_key *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* The name of a kind's objective, "" for kinds without a search. */
static const char *objective_name(qcal_observer_kind k)
{
    switch (k) {
    case QCAL_OBSERVER_HISTOGRAM: return "L2";
    case QCAL_OBSERVER_ENTROPY: return "KL";
    case QCAL_OBSERVER_MSE: return "MSE";
    default: return "";
    }
}

/* Fills out (every evaluated candidate, sorted by width). QCAL_ERR_UNSUPPORTED for kinds
 * without a search or a search that evaluated nothing. */
static qcal_status objective_curve(qcal_observer *obs, curve *out)
{
    if (!*objective_name(qcal_observer_get_config(obs)->kind))
        return QCAL_ERR_UNSUPPORTED;
    int64_t full = (int64_t)qcal_observer_get_config(obs)->bins + 1, m = 0, ch = -1;
    float *lo = qcal_malloc((size_t)full * sizeof(float));
    float *hi = qcal_malloc((size_t)full * sizeof(float));
    double *e = qcal_malloc((size_t)full * sizeof(double));
    width_key *key = qcal_malloc((size_t)full * sizeof *key);
    qcal_status st = lo && hi && e && key
                         ? qcal_observer_histogram_search_curve(obs, full, lo, hi, e, &m, &ch)
                         : QCAL_ERR_NO_MEMORY;
    if (st == QCAL_OK && m > full)   /* never: bins + 1 holds every search's candidates */
        m = full;
    if (st == QCAL_OK && m >= 1) {
        for (int64_t i = 0; i < m; i++)
            key[i] = (width_key){ (double)hi[i] - (double)lo[i], i };
        qsort(key, (size_t)m, sizeof *key, width_cmp);
        out->lo = qcal_malloc((size_t)m * sizeof(float));
        out->hi = qcal_malloc((size_t)m * sizeof(float));
        out->v = qcal_malloc((size_t)m * sizeof(double));
        if (!out->lo || !out->hi || !out->v) {
            curve_free(out);
            st = QCAL_ERR_NO_MEMORY;
        } else {
            out->n = m;
            out->defined = 0;
            out->chosen = -1;
            for (int64_t k = 0; k < m; k++) {
                int64_t i = key[k].i;
                out->lo[k] = lo[i];
                out->hi[k] = hi[i];
                out->v[k] = e[i];
                out->defined += isfinite(e[i]) != 0;
                if (i == ch)
                    out->chosen = k;
            }
        }
    } else if (st >= 0) {
        st = QCAL_ERR_UNSUPPORTED;
    }
    free(lo);
    free(hi);
    free(e);
    free(key);
    return st;
}

/* A path coordinate as an integer (in PATH_UNITS per pixel), a separator before it unless
 * it starts with '-' or sep is false. Curves hold thousands of points: no printf here. */
#define PATH_UNITS 4
static void put_coord(qcal_buf *b, long long t, bool sep)
{
    char s[24], *p = s + sizeof s;
    unsigned long long u = t < 0 ? 0ull - (unsigned long long)t : (unsigned long long)t;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (t < 0)
        *--p = '-';
    else if (sep)
        *--p = ' ';
    qcal_buf_append(b, p, (size_t)(s + sizeof s - p));
}

/* Marker of the chosen candidate: one shape per kind (circle, square, diamond), hollow,
 * so markers that fall on the same point stay visible. */
static void put_marker(qcal_buf *b, qcal_observer_kind k, double x, double y, const char *col,
                       const char *attrs)
{
    if (k == QCAL_OBSERVER_ENTROPY)
        putf(b, "<rect %s x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"#fff\" "
                "fill-opacity=\"0.6\" stroke=\"%s\" stroke-width=\"2\">", attrs, x - 4.5,
             y - 4.5, col);
    else if (k == QCAL_OBSERVER_MSE)
        putf(b, "<path %s d=\"M%.1f %.1fl6 6-6 6-6-6z\" fill=\"#fff\" fill-opacity=\"0.6\" "
                "stroke=\"%s\" stroke-width=\"2\">", attrs, x, y - 6, col);
    else
        putf(b, "<circle %s cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#fff\" fill-opacity=\"0.6\" "
                "stroke=\"%s\" stroke-width=\"2\">", attrs, x, y, col);
}

static const char *marker_end(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_ENTROPY ? "</rect>" : k == QCAL_OBSERVER_MSE ? "</path>"
                                                                            : "</circle>";
}

/* One panel per searching candidate (small multiples: the objectives have different units
 * and the searches evaluate different ranges): x = the width of each evaluated clipping
 * range (max - min), y = the objective (log scale when it spans more than a factor 20).
 * Every evaluated candidate is a point of the path (data-candidates counts them,
 * data-defined those with a value: the browser test checks the path against both);
 * undefined values leave gaps; a lone defined point is a dot; curves of few points show
 * each point; the chosen range is marked. */
static void curve_panel(qcal_buf *b, const eval_entry *e, const curve *cu)
{
    qcal_observer_kind kd = e->c[cu->j].kind;
    const char *col = kind_colour(kd), *obj = objective_name(kd);
    double x0 = INFINITY, x1 = -INFINITY, lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < cu->n; i++) {
        double w = (double)cu->hi[i] - (double)cu->lo[i];
        x0 = fmin(x0, w);
        x1 = fmax(x1, w);
        if (isfinite(cu->v[i])) {
            lo = fmin(lo, cu->v[i]);
            hi = fmax(hi, cu->v[i]);
        }
    }
    if (!(x1 > x0)) {   /* one width: centre it */
        double d = x0 != 0 ? fabs(x0) * 0.05 : 1;
        x0 -= d;
        x1 += d;
    }
    bool logy = lo > 0 && hi > 20 * lo;
    double ylo = logy ? log10(lo) : lo, yhi = logy ? log10(hi) : hi;
    if (!(yhi > ylo)) {   /* flat or no defined value */
        double d = isfinite(ylo) && ylo != 0 ? fabs(ylo) * 0.05 : 1;
        if (!isfinite(ylo))
            ylo = yhi = 0;
        ylo -= d;
        yhi += d;
    }
    double xpad = 0.03 * (x1 - x0), ypad = 0.07 * (yhi - ylo);
    /* Enough digits that the x ticks differ (the L2 path may span a few bins only). */
    int xprec = 4;
    double mag = fmax(fabs(x0), fabs(x1)), span = x1 - x0;
    if (span > 0 && mag > 0)
        xprec = (int)fmin(9, fmax(4, ceil(log10(mag / span)) + 3));
    chart c = { .w = 372, .h = 250, .l = 62, .r = 14, .t = 10, .btm = 34, .x0 = x0 - xpad,
                .x1 = x1 + xpad, .y0 = ylo - ypad, .y1 = yhi + ypad, .logy = false,
                .xprec = xprec };
#define PANEL_Y(v) cy(&c, logy ? log10(v) : (v))
    put(b, "<figure class=\"objective\">");
    char label[96];
    snprintf(label, sizeof label, "%s objective (%s) against clipping range width",
             qcal_observer_kind_name(kd), obj);
    chart_open(b, &c, label);
    if (logy)   /* decade lines, labelled left of the axis clear of the min and max labels */
        for (double d = pow(10, ceil(ylo)); log10(d) <= yhi; d *= 10) {
            double y = PANEL_Y(d);
            putf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>",
                 c.l, y, c.w - c.r, y);
            if (fabs(y - PANEL_Y(lo)) > 16 && fabs(y - PANEL_Y(hi)) > 16)
                putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill-opacity=\"0.6\">"
                        "%g</text>", c.l - 4, y + 4, d);
        }
    int64_t ch = cu->chosen;
    if (ch >= 0) {   /* the chosen width, dashed, under the curve */
        double x = cx(&c, (double)cu->hi[ch] - (double)cu->lo[ch]);
        putf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-dasharray=\"3 3\" stroke-opacity=\"0.7\"/>", x, c.t, x, c.h - c.btm,
             col);
    }
    putf(b, "<path class=\"obj\" data-kind=\"%s\" data-objective=\"%s\" "
            "data-candidates=\"%lld\" data-defined=\"%lld\" data-chosen=\"%lld\" "
            "transform=\"scale(%g)\" stroke=\"%s\" d=\"", qcal_observer_kind_name(kd), obj,
         (long long)cu->n, (long long)cu->defined, (long long)ch, 1.0 / PATH_UNITS, col);
    /* Integer coordinates in 1/PATH_UNITS px (scaled back by the transform): the absolute
     * first point of each run, then relative steps between the rounded absolute positions
     * (no drift). */
    long long px = 0, py = 0;
    bool pen = false;
    char cmd = 0;   /* the command the next numbers continue: 'l', 'h' or 'v' */
    for (int64_t i = 0; i < cu->n; i++) {
        if (!isfinite(cu->v[i])) {
            pen = false;
            continue;
        }
        long long X = llround(cx(&c, (double)cu->hi[i] - (double)cu->lo[i]) * PATH_UNITS);
        long long Y = llround(PANEL_Y(cu->v[i]) * PATH_UNITS);
        if (!pen) {
            put(b, "M");
            put_coord(b, X, false);
            put_coord(b, Y, true);
            cmd = 0;
            if (i + 1 >= cu->n || !isfinite(cu->v[i + 1]))
                put(b, "z");   /* a lone point: a dot (round cap of an empty subpath) */
        } else {
            /* one command per point: h for a horizontal step, v for a vertical one, l
             * otherwise; the letter only when it changes */
            long long dx = X - px, dy = Y - py;
            char want = dy == 0 && cmd != 'v' ? 'h' : dx == 0 && cmd != 'h' ? 'v' : 'l';
            if (dy == 0 && dx == 0 && cmd)
                want = cmd;
            if (want != cmd)
                qcal_buf_append(b, &want, 1);
            if (want == 'h')
                put_coord(b, dx, want == cmd);
            else if (want == 'v')
                put_coord(b, dy, want == cmd);
            else {
                put_coord(b, dx, want == cmd);
                put_coord(b, dy, true);
            }
            cmd = want;
        }
        px = X;
        py = Y;
        pen = true;
    }
    putf(b, "\"><title>%s (%s): %lld candidates evaluated, %lld with a value</title></path>",
         qcal_observer_kind_name(kd), obj, (long long)cu->n, (long long)cu->defined);
    if (cu->n <= 64) {   /* few candidates (the L2 path): show each one */
        putf(b, "<path class=\"pts\" stroke=\"%s\" stroke-width=\"5\" stroke-linecap=\"round\" "
                "d=\"", col);
        for (int64_t i = 0; i < cu->n; i++)
            if (isfinite(cu->v[i]))
                putf(b, "M%.1f %.1fh0", cx(&c, (double)cu->hi[i] - (double)cu->lo[i]),
                     PANEL_Y(cu->v[i]));
        put(b, "\"/>");
    }
    if (ch >= 0) {   /* an undefined chosen value (no defined threshold) sits on the top */
        double x = cx(&c, (double)cu->hi[ch] - (double)cu->lo[ch]);
        double y = isfinite(cu->v[ch]) ? PANEL_Y(cu->v[ch]) : c.t;
        char attrs[96];
        snprintf(attrs, sizeof attrs, "class=\"chosen\" data-kind=\"%s\"",
                 qcal_observer_kind_name(kd));
        put_marker(b, kd, x, y, col, attrs);
        putf(b, "<title>%s chosen: [%.6g, %.6g], width %.6g, %s %.6g</title>",
             qcal_observer_kind_name(kd), (double)cu->lo[ch], (double)cu->hi[ch],
             (double)cu->hi[ch] - (double)cu->lo[ch], obj, cu->v[ch]);
        put(b, marker_end(kd));
    }
#undef PANEL_Y
    char ytitle[64], ya[32], yb[32];
    snprintf(ytitle, sizeof ytitle, "%s%s", obj, logy ? " (log scale)" : "");
    if (isfinite(lo)) {
        snprintf(ya, sizeof ya, "%.4g", lo);
        snprintf(yb, sizeof yb, "%.4g", hi);
    } else {
        snprintf(ya, sizeof ya, "n/a");
        snprintf(yb, sizeof yb, "n/a");
    }
    /* the curve's min and max labelled where they are drawn (inside the padding) */
    putf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>"
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", c.l - 4,
         cy(&c, c.y0 + ypad) + 4, ya, c.l - 4, cy(&c, c.y1 - ypad) + 4, yb);
    chart_axes(b, &c, "clipping range width (max &#8722; min)", ytitle, "", "");
    putf(b, "</svg><figcaption><span class=\"chip\" style=\"background:%s\"></span><b>%s "
            "(%s)</b>: %lld %s", col, qcal_observer_kind_name(kd), obj, (long long)cu->n,
         kd == QCAL_OBSERVER_HISTOGRAM ? "ranges on the greedy search's path (it stops at the "
                                         "first rise)" : "thresholds");
    if (cu->defined < cu->n)
        putf(b, ", %lld undefined (gaps)", (long long)(cu->n - cu->defined));
    if (ch >= 0) {
        put(b, "; chosen (marked) [");
        put_num(b, cu->lo[ch]);
        put(b, ", ");
        put_num(b, cu->hi[ch]);
        putf(b, "], %s ", obj);
        put_num(b, cu->v[ch]);
    }
    put(b, "</figcaption></figure>");
}

/* Computes and draws a tensor's objective chart into b (the searches dominate the
 * report's time; tensors are independent, so write_report runs this over them in
 * parallel and appends the buffers in order). */
static void compute_curves(const eval_entry *e, qcal_buf *b)
{
    curve cur[3];
    int nc = 0;
    for (int j = 0; j < e->nc && nc < 3; j++) {
        memset(&cur[nc], 0, sizeof cur[nc]);
        if (objective_curve(e->c[j].obs, &cur[nc]) < 0) {
            qcal_clear_error();
            continue;
        }
        cur[nc++].j = j;
    }
    for (int k = 0; k < nc; k++)
        curve_panel(b, e, &cur[k]);
    for (int k = 0; k < nc; k++)
        curve_free(&cur[k]);
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

/* What decided a tensor's recommendation, for the reader: the runner-up and the SQNR
 * margin, and the decimals that show the two apart (48.0997 against 48.0986 dB, where 0.1
 * dB hides why one won). Without a threshold the runner-up is the best SQNR among the other
 * candidates (the simpler on a tie); with min_sqnr_db reached, the best of the simpler
 * candidates, which missed it. */
typedef struct decision {
    int other;          /* runner-up candidate index, or -1 */
    double margin;      /* SQNR of the recommendation minus the runner-up's, dB */
    int decimals;       /* SQNR decimals of this tensor's cells (2..9) */
    bool threshold;     /* min_sqnr_db decided: the simplest candidate that reached it */
} decision;

static decision decide(const qcal_numeric_eval *ev, const eval_entry *e)
{
    decision d = { .other = -1, .margin = NAN, .decimals = 2, .threshold = false };
    int rec = e->recommended;
    double rs = e->c[rec].sqnr, thr = ev->opt.min_sqnr_db;
    d.threshold = !isnan(thr) && rs >= thr;
    for (int j = 0; j < e->nc; j++) {
        double s = e->c[j].sqnr;
        if (j == rec || isnan(s) || (d.threshold && j > rec))
            continue;
        if (d.other < 0 || s > e->c[d.other].sqnr)
            d.other = j;
    }
    if (d.other >= 0 && !isnan(rs)) {
        double os = e->c[d.other].sqnr;
        d.margin = isinf(rs) && isinf(os) && (rs > 0) == (os > 0) ? 0 : rs - os;
        if (isfinite(rs) && isfinite(os) && rs != os)
            for (; d.decimals < 9; d.decimals++) {
                char a[64], z[64];
                snprintf(a, sizeof a, "%.*f", d.decimals, rs);
                snprintf(z, sizeof z, "%.*f", d.decimals, os);
                if (strcmp(a, z))
                    break;
            }
    }
    return d;
}

/* An SQNR with the tensor's decimals ("48.0997"), "&#8734;" for an exact quantization. */
static void put_sqnr(qcal_buf *b, double v, int decimals)
{
    if (!isfinite(v)) {
        put_num(b, v);
        return;
    }
    char s[64];
    snprintf(s, sizeof s, "%.*f", decimals, v);
    put(b, s);
}

/* The decision in words: "+0.0011 dB over minmax", "tie with minmax: the simpler", ... */
static void put_decision(qcal_buf *b, const qcal_numeric_eval *ev, const eval_entry *e,
                         const decision *d, bool brief)
{
    if (d->other < 0) {   /* alone, or the simplest and it reaches the threshold */
        if (d->threshold)
            putf(b, "the simplest; reaches %.6g dB", ev->opt.min_sqnr_db);
        return;
    }
    if (!isnan(ev->opt.min_sqnr_db) && !d->threshold)
        putf(b, "none reaches %.6g dB: ", ev->opt.min_sqnr_db);
    const char *on = brief ? short_name(e->c[d->other].kind)
                           : qcal_observer_kind_name(e->c[d->other].kind);
    char s[64];
    if (d->threshold) {
        putf(b, "simplest reaching %.6g dB; %s ", ev->opt.min_sqnr_db, on);
        put_sqnr(b, e->c[d->other].sqnr, d->decimals);
        put(b, " dB below it");
    } else if (d->margin == 0) {
        putf(b, "tie with %s: the simpler wins", on);
    } else if (isinf(d->margin)) {
        putf(b, "exact (no error) against %s", on);
    } else {
        double m = fabs(d->margin);
        if (m >= 0.1)
            snprintf(s, sizeof s, "%.2f", m);
        else
            snprintf(s, sizeof s, "%.2g", m);
        putf(b, "%s%s dB %s %s", d->margin > 0 ? "+" : "&#8722;", s,
             d->margin > 0 ? "over" : "under", on);
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
        decision d = decide(ev, e);
        putf(b, "<tr><td class=\"l\"><a href=\"#t%lld\">", (long long)i);
        put_html(b, e->name);
        putf(b, "</a></td><td class=\"l\">%s</td><td class=\"l rec\">%s",
             qcal_calib_role_name(e->role), qcal_observer_kind_name(e->c[e->recommended].kind));
        if (d.other >= 0) {
            putf(b, "<small class=\"margin\" data-margin=\"%.17g\" data-other=\"%s\">",
                 d.margin, qcal_observer_kind_name(e->c[d.other].kind));
            put_decision(b, ev, e, &d, true);
            put(b, "</small>");
        } else if (d.threshold) {
            put(b, "<small class=\"margin\">");
            put_decision(b, ev, e, &d, true);
            put(b, "</small>");
        }
        put(b, "</td>");
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
            putf(b, "<td data-v=\"%.17g\" data-kind=\"%s\"%s>", v, qcal_observer_kind_name(k),
                 j == e->recommended ? " class=\"best\"" : "");
            put_sqnr(b, c->sqnr_db, d.decimals);
            put(b, " dB<small>");
            put_percent(b, c->clipped);
            put(b, " clipped");
            put(b, "</small></td>");
        }
        put(b, "</tr>");
    }
    put(b, "</tbody></table></div>");
}

qcal_status qcal_numeric_eval_write_report(const qcal_numeric_eval *ev,
                                           const qcal_numeric_eval_report_options *opt,
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
    qcal_numeric_eval_report_options o;
    qcal_numeric_eval_report_options_default(&o);
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
    qcal_buf *curves = qcal_calloc(ev->n ? (size_t)ev->n : 1, sizeof *curves);
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
            "clipped = fraction of values outside the observer's representable range; ");
    if (isnan(ev->opt.min_sqnr_db))
        put(&b, "recommended = highest SQNR, ties to the simpler observer (bold)");
    else
        putf(&b, "recommended = the simplest observer reaching %.6g dB, the highest SQNR "
                 "where none does (bold)", ev->opt.min_sqnr_db);
    put(&b, ", with what decided it below; SQNRs carry the digits that tell the "
            "recommendation from the runner-up. Click a column to sort.</p>");
    summary_table(&b, ev, used, any_layer);
    put(&b, "<h2>Tensors</h2>");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        decision d = decide(ev, e);
        putf(&b, "<article id=\"t%lld\"><h3>", (long long)i);
        put_html(&b, e->name);
        putf(&b, "<span class=\"tag\">%s</span></h3><p class=\"sub\">recommended <b>%s</b> (",
             qcal_calib_role_name(e->role), qcal_observer_kind_name(e->c[e->recommended].kind));
        put_sqnr(&b, e->c[e->recommended].sqnr, d.decimals);
        put(&b, " dB");
        if (d.other >= 0 || d.threshold) {
            put(&b, ", ");
            put_decision(&b, ev, e, &d, false);
            if (!d.threshold && d.margin != 0 && !isinf(d.margin)) {
                put(&b, " at ");
                put_sqnr(&b, e->c[d.other].sqnr, d.decimals);
                put(&b, " dB");
            }
        }
        putf(&b, ") &#183; %llu values in [", (unsigned long long)e->count);
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
            put_percent(&b, c->clipped);
            put(&b, " clipped, ");
            put_sqnr(&b, c->sqnr_db, d.decimals);
            put(&b, " dB</li>");
        }
        put(&b, "</ul></figure>");
        qcal_buf_append(&b, curves[i].data, curves[i].len);
        b.failed |= curves[i].failed;
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
    for (int64_t i = 0; i < ev->n; i++)
        qcal_buf_free(&curves[i]);
    free(curves);
    return st;
}
