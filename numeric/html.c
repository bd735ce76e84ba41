/* HTML building blocks shared by the two pages numeric/ draws (report.c: an observer
 * evaluation; accuracy_report.c: a model comparison): text into a growing buffer, escaping,
 * the style sheet and the table-sorting script. Internal to numeric/. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "io/text.h"
#include "numeric/html.h"

void qcal_html_put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

/* printf into b for the report's formats: %s, %d, %x, %lld, %llu, %% and float
 * conversions (%.Nf, %.Ng). "%.1f" (every SVG coordinate) is written compact: rounded to
 * one decimal without a trailing ".0" ("206" for 206.0, "-0" as "0"), which keeps 500
 * tensors' drawings a few MB. */
void qcal_html_putf(qcal_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const char *p = fmt;
    while (*p) {
        const char *q = strchr(p, '%');
        if (!q) {
            qcal_html_put(b, p);
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
            qcal_html_put(b, "%");
        } else if (conv == 's') {
            qcal_html_put(b, va_arg(ap, const char *));
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
            qcal_html_put(b, tmp);
        } else if (!strcmp(spec, "%lld")) {
            snprintf(tmp, sizeof tmp, "%lld", va_arg(ap, long long));
            qcal_html_put(b, tmp);
        } else if (!strcmp(spec, "%llu")) {
            snprintf(tmp, sizeof tmp, "%llu", va_arg(ap, unsigned long long));
            qcal_html_put(b, tmp);
        } else {   /* %d, %x, %u with int-sized arguments */
            snprintf(tmp, sizeof tmp, spec, va_arg(ap, int));
            qcal_html_put(b, tmp);
        }
    }
    va_end(ap);
}


/* Text as HTML (element content and quoted attribute values). Bytes that are not valid
 * UTF-8 are shown as U+FFFD so the file stays valid UTF-8. */
void qcal_html_text(qcal_buf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        if (c == '<') { qcal_html_put(b, "&lt;"); p++; continue; }
        if (c == '>') { qcal_html_put(b, "&gt;"); p++; continue; }
        if (c == '&') { qcal_html_put(b, "&amp;"); p++; continue; }
        if (c == '"') { qcal_html_put(b, "&quot;"); p++; continue; }
        if (c == '\'') { qcal_html_put(b, "&#39;"); p++; continue; }
        if (c < 0x20 || c == 0x7f) { qcal_html_putf(b, "&#x%x;", c == 0 ? 0xfffd : (c == '\t' ? c : 0xfffd)); p++; continue; }
        if (c < 0x80) { qcal_buf_append(b, p, 1); p++; continue; }
        size_t len = qcal_utf8_decode(p, SIZE_MAX, NULL);
        if (len) {
            qcal_buf_append(b, p, len);
            p += len;
        } else {
            qcal_html_put(b, "&#xfffd;");
            p++;
        }
    }
}

/* A value for axis labels and tables: 4 significant digits. */
void qcal_html_num(qcal_buf *b, double v)
{
    if (isnan(v))
        qcal_html_put(b, "n/a");
    else if (isinf(v))
        qcal_html_put(b, v > 0 ? "&#8734;" : "-&#8734;");
    else
        qcal_html_putf(b, "%.4g", v);
}

const char *const qcal_html_css =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;"
    "margin:24px auto;max-width:1360px;padding:0 16px;color:#1a1a1a;background:#fff}"
    "h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd}"
    "h3{font-size:16px;margin:0 0 4px;word-break:break-all}.sub{color:#555;margin:0 0 12px}"
    "table{border-collapse:collapse;font-size:13px}th,td{padding:4px 6px;border-bottom:1px solid #e4e4e4;"
    "text-align:right;white-space:nowrap}th{background:#f4f4f4;cursor:pointer;position:sticky;top:0}"
    "th.l,td.l{text-align:left}td.l{max-width:360px;overflow:hidden;text-overflow:ellipsis}"
    /* the tensor column stays in view when the table scrolls sideways; names wrap */
    "th:first-child,td:first-child{position:sticky;left:0;z-index:1;background:#fff}"
    "th:first-child{z-index:2;background:#f4f4f4}td.l:first-child{white-space:normal;"
    "overflow-wrap:anywhere;min-width:110px;max-width:200px}"
    "td.rec{white-space:normal;min-width:130px;max-width:190px}"
    "td.best{font-weight:700;background:#fff3d6}td.rec{background:#fff3d6;font-weight:600}"
    ".wrap{overflow-x:auto;max-width:100%}td.rec small{font-weight:400}"
    "td small{display:block;color:#666;font-size:11px}td.na{color:#aaa}"
    ".chip{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}"
    ".legend span{margin-right:14px;white-space:nowrap}"
    "article{border:1px solid #ddd;border-radius:6px;padding:12px 14px;margin:14px 0}"
    ".charts{display:flex;flex-wrap:wrap;gap:14px}figure{margin:0}figcaption{font-size:12px;color:#444}"
    "svg text{font:11px system-ui,'DejaVu Sans',sans-serif;fill:#333}.tag{font-size:12px;"
    "color:#fff;background:#666;border-radius:3px;padding:1px 6px;margin-left:6px;vertical-align:2px}"
    ".clip{font-size:12px;margin:4px 0 0;padding:0;list-style:none}.clip li{display:inline-block;margin-right:12px}"
    "path.c{stroke-width:1.6}figure.objective{width:372px}"
    "path.obj{fill:none;stroke-width:1.6;stroke-linecap:round;stroke-linejoin:round;"
    "vector-effect:non-scaling-stroke}";

const char *const qcal_html_sort_script =
    "document.querySelectorAll('table.sortable th').forEach(function(th){"
    "th.addEventListener('click',function(){var i=th.cellIndex,t=th.closest('table'),b=t.tBodies[0],"
    "r=Array.from(b.rows),d=th.dataset.dir==='a'?-1:1;th.dataset.dir=d>0?'a':'d';"
    "r.sort(function(x,y){var u=x.cells[i].dataset.v,v=y.cells[i].dataset.v;"
    "if(u!==undefined&&v!==undefined)return d*(parseFloat(u)-parseFloat(v));"
    "return d*x.cells[i].textContent.localeCompare(y.cells[i].textContent)});"
    "r.forEach(function(x){b.appendChild(x)})})});";
