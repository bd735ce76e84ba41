/* HTML building blocks of numeric/'s two pages (report.c, accuracy_report.c): text into a
 * qcal_buf, escaping, the shared style sheet and the script that sorts a table.sortable by
 * the clicked column (cells' data-v as numbers when both have one, else their text).
 * Internal to numeric/. */
#ifndef QCAL_NUMERIC_HTML_H
#define QCAL_NUMERIC_HTML_H

#include "core/internal.h"

/* Appends s as is. */
void qcal_html_put(qcal_buf *b, const char *s);

/* printf into b: %s, %d, %x, %lld, %llu, %% and float conversions (%.Nf, %.Ng); "%.1f"
 * (SVG coordinates) compact: one decimal without a trailing ".0", "-0" as "0". */
void qcal_html_putf(qcal_buf *b, const char *fmt, ...) QCAL_PRINTF(2, 3);

/* s as HTML text or a quoted attribute value; invalid UTF-8 as U+FFFD. */
void qcal_html_text(qcal_buf *b, const char *s);

/* A value with 4 significant digits, "&#8734;" for infinity, "n/a" for NaN. */
void qcal_html_num(qcal_buf *b, double v);

extern const char *const qcal_html_css;
extern const char *const qcal_html_sort_script;

#endif
