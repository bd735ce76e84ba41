/* unit.accuracy_report: the JSON of `qcal compare --format json` read back
 * (qcal_accuracy_report_parse_json: "inf" and null round-trip to +inf and NaN, malformed
 * text named) and drawn as HTML (qcal_accuracy_report_write_html: ops in the report's
 * order, bar widths proportional to dB on the chart's axis, balanced markup, names
 * escaped). No ONNX Runtime needed. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/accuracy.h"
#include "qcal/qcal.h"

#include "testutil.h"

/* Three ops, as qcal compare writes them (most sensitive first), an unnamed one whose alone
 * SQNR is +inf and whose all-but SQNR is null; an output equal to float (+inf) without
 * accuracies (null). */
static const char *cmp_json =
    "{\"float\": \"m.onnx\", \"quantized\": \"m.qdq.onnx\", \"engine\": \"1.30.0\", "
    "\"samples\": 16, \"metric\": \"top1\", \"sqnr_db\": 23.5,\n"
    " \"outputs\": [\n"
    "  {\"name\": \"logits\", \"samples\": 16, \"positions\": 16, \"nonfinite\": 0, "
    "\"sqnr_db\": 23.5, \"cosine\": 0.9977, \"top1_agreement\": 0.9375, \"exact_agreement\": "
    "0.9375, \"accuracy_float\": 0.875, \"accuracy_quantized\": 0.8125},\n"
    "  {\"name\": \"aux<&>\", \"samples\": 16, \"positions\": 32, \"nonfinite\": 2, "
    "\"sqnr_db\": \"inf\", \"cosine\": 1, \"top1_agreement\": 1, \"exact_agreement\": 1, "
    "\"accuracy_float\": null, \"accuracy_quantized\": null}],\n"
    " \"sensitivity_samples\": 8, \"gated_sqnr_db\": 22.25,\n"
    " \"ops\": [\n"
    "  {\"name\": \"/blk1/Mul\", \"op_type\": \"Mul\", \"sqnr_alone_db\": 12.5, "
    "\"sqnr_all_but_db\": 35.0},\n"
    "  {\"name\": \"/blk0/conv/Conv\", \"op_type\": \"Conv\", \"sqnr_alone_db\": 30.25, "
    "\"sqnr_all_but_db\": 23.0},\n"
    "  {\"name\": \"\", \"op_type\": \"MatMul\", \"sqnr_alone_db\": \"inf\", "
    "\"sqnr_all_but_db\": null}],\n"
    " \"runs\": 57, \"seconds\": 1.234}\n";

static char tmp_dir[] = "/tmp/qcal_accrep_XXXXXX";

static int setup(void **state)
{
    (void)state;
    return mkdtemp(tmp_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmp_dir);
    return 0;
}

static int count(const char *h, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(h, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void parse(const char *text, qcal_accuracy_report *rep, qcal_accuracy_source *src)
{
    qcal_status st = qcal_accuracy_report_parse_json(text, strlen(text), rep, src);
    if (st != QCAL_OK)
        fail_msg("parse: %s", qcal_last_error());
}

static void test_parse(void **state)
{
    (void)state;
    qcal_accuracy_report r;
    qcal_accuracy_source s;
    parse(cmp_json, &r, &s);
    assert_string_equal(s.float_model, "m.onnx");
    assert_string_equal(s.quantized_model, "m.qdq.onnx");
    assert_string_equal(s.engine, "1.30.0");
    assert_string_equal(s.metric, "top1");
    assert_int_equal(r.samples, 16);
    assert_true(r.sqnr_db == 23.5);
    assert_int_equal(r.sensitivity_samples, 8);
    assert_true(r.gated_sqnr_db == 22.25);
    assert_int_equal(r.runs, 57);
    assert_true(r.seconds == 1.234);
    assert_int_equal(r.n_outputs, 2);
    assert_string_equal(r.outputs[0].name, "logits");
    assert_true(r.outputs[0].cosine == 0.9977 && r.outputs[0].agree == 0.9375);
    assert_true(r.outputs[0].acc_float == 0.875 && r.outputs[0].acc_quant == 0.8125);
    assert_string_equal(r.outputs[1].name, "aux<&>");
    assert_true(isinf(r.outputs[1].sqnr_db) && r.outputs[1].sqnr_db > 0);
    assert_true(isnan(r.outputs[1].acc_float) && isnan(r.outputs[1].acc_quant));
    assert_int_equal(r.outputs[1].positions, 32);
    assert_int_equal(r.outputs[1].nonfinite, 2);
    assert_int_equal(r.n_ops, 3);
    assert_string_equal(r.ops[0].name, "/blk1/Mul");   /* the file's order */
    assert_string_equal(r.ops[1].op_type, "Conv");
    assert_true(r.ops[1].sqnr_only_db == 30.25 && r.ops[1].sqnr_others_db == 23.0);
    assert_string_equal(r.ops[2].name, "");
    assert_true(isinf(r.ops[2].sqnr_only_db) && r.ops[2].sqnr_only_db > 0);
    assert_true(isnan(r.ops[2].sqnr_others_db));
    qcal_accuracy_report_free(&r);
    qcal_accuracy_source_free(&s);
    assert_null(r.outputs);
    assert_null(s.float_model);

    /* The least a report needs: the two arrays. "-inf" reads back; missing figures are NaN,
     * missing counts 0, a null metric no metric; src may be NULL. */
    parse("{\"outputs\": [{\"name\": \"y\", \"sqnr_db\": \"-inf\"}], \"ops\": [], "
          "\"metric\": null}", &r, &s);
    assert_int_equal(r.n_outputs, 1);
    assert_true(isinf(r.outputs[0].sqnr_db) && r.outputs[0].sqnr_db < 0);
    assert_true(isnan(r.outputs[0].cosine) && isnan(r.sqnr_db) && isnan(r.gated_sqnr_db));
    assert_int_equal(r.samples, 0);
    assert_int_equal(r.n_ops, 0);
    assert_null(s.metric);
    assert_string_equal(s.float_model, "");
    qcal_accuracy_report_free(&r);
    qcal_accuracy_source_free(&s);
    parse(cmp_json, &r, NULL);
    assert_int_equal(r.n_ops, 3);
    qcal_accuracy_report_free(&r);
}

/* Malformed text: QCAL_ERR_FORMAT naming the field, the outputs untouched. */
static void test_parse_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } bad[] = {
        { "{\"outputs\": [", "JSON" },
        { "{\"outputs\": []}", "not a qcal compare report" },
        { "[1, 2]", "not a qcal compare report" },
        { "{\"outputs\": {}, \"ops\": []}", "not a qcal compare report" },
        { "{\"outputs\": [], \"ops\": [{\"name\": \"a\"}, {\"name\": \"b\", \"sqnr_alone_db\": "
          "\"big\"}]}", "ops[1].sqnr_alone_db is not a number" },
        { "{\"outputs\": [{\"sqnr_db\": 1}], \"ops\": []}", "outputs[0].name is missing" },
        { "{\"outputs\": [], \"ops\": [3]}", "ops[0] is not an object" },
        { "{\"outputs\": [], \"ops\": [], \"samples\": -1}", "\"samples\" is not a non-negative" },
        { "{\"outputs\": [], \"ops\": [], \"metric\": 1}", "\"metric\" is not a string" },
        { "{\"outputs\": [], \"ops\": [], \"sqnr_db\": NaN}", "JSON" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qcal_accuracy_report r;
        qcal_accuracy_source s;
        memset(&r, 0x5a, sizeof r);
        memset(&s, 0x5a, sizeof s);
        qcal_status st = qcal_accuracy_report_parse_json(bad[i].text, strlen(bad[i].text), &r, &s);
        assert_int_equal(st, QCAL_ERR_FORMAT);
        if (!strstr(qcal_last_error(), bad[i].msg))
            fail_msg("case %zu: '%s' does not say '%s'", i, qcal_last_error(), bad[i].msg);
        assert_int_equal(r.n_ops, 0x5a5a5a5a5a5a5a5a);   /* untouched */
        assert_int_equal((uintptr_t)s.metric, (uintptr_t)0x5a5a5a5a5a5a5a5a);
    }
    /* From a file, the message names it. */
    char *path = tu_path(tmp_dir, "trunc.json");
    tu_write_bytes(path, cmp_json, 200);
    qcal_accuracy_report r;
    assert_int_equal(qcal_accuracy_report_read_json(path, &r, NULL), QCAL_ERR_FORMAT);
    assert_non_null(strstr(qcal_last_error(), path));
    path = tu_path(tmp_dir, "missing.json");
    assert_int_equal(qcal_accuracy_report_read_json(path, &r, NULL), QCAL_ERR_NOT_FOUND);
}

/* Every element closed in order (void elements and "/>" aside; script and style are raw
 * text); no '<' or '>' outside tags. Returns the first problem or NULL. */
static const char *check_balanced(const char *h)
{
    static char why[200];
    char stack[64][16];
    int depth = 0;
    for (const char *p = h; *p;) {
        if (*p == '>')
            return "a '>' outside a tag";
        if (*p != '<') {
            p++;
            continue;
        }
        const char *end = strchr(p, '>');
        if (!end)
            return "a tag without its '>'";
        if (p[1] == '!') {   /* <!DOCTYPE html> */
            p = end + 1;
            continue;
        }
        bool closing = p[1] == '/';
        const char *n = p + 1 + closing;
        size_t len = strspn(n, "abcdefghijklmnopqrstuvwxyz0123456789");
        if (!len || len >= 16)
            return "a tag without a name";
        char name[16];
        memcpy(name, n, len);
        name[len] = 0;
        if (closing) {
            if (!depth || strcmp(stack[depth - 1], name)) {
                snprintf(why, sizeof why, "</%s> closes <%s>", name, depth ? stack[depth - 1] : "");
                return why;
            }
            depth--;
        } else if (!strcmp(name, "script") || !strcmp(name, "style")) {
            char close[24];
            snprintf(close, sizeof close, "</%s>", name);
            const char *c = strstr(end, close);
            if (!c)
                return "an unclosed script or style";
            end = c + strlen(close) - 1;
        } else if (end[-1] != '/' && strcmp(name, "meta") && strcmp(name, "br")) {
            if (depth == 64)
                return "nesting too deep";
            strcpy(stack[depth++], name);
        }
        p = end + 1;
    }
    return depth ? "unclosed elements at the end" : NULL;
}

/* The number after `key="` at or after p. */
static double attr(const char *p, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "%s=\"", key);
    const char *a = strstr(p, k);
    assert_non_null(a);
    return strtod(a + strlen(k), NULL);
}

/* Every bar of class cls: its width is (dB - x0) / (x1 - x0) of the plot (the whole plot
 * for +inf); returns how many there are. */
static int check_bars(const char *h, const char *cls, const double *want_db, int n_want)
{
    const char *svg = strstr(h, "<svg class=\"bars\"");
    assert_non_null(svg);
    double x0 = attr(svg, "data-x0"), x1 = attr(svg, "data-x1");
    double left = attr(svg, "data-left"), pw = attr(svg, "data-plot-width");
    char tag[64];
    snprintf(tag, sizeof tag, "<rect class=\"%s\"", cls);
    int n = 0;
    for (const char *p = strstr(svg, tag); p; p = strstr(p + 1, tag), n++) {
        const char *d = strstr(p, "data-db=\"") + 9;
        double db = !strncmp(d, "inf\"", 4) ? INFINITY : strtod(d, NULL);
        assert_true(n < n_want);
        assert_true(db == want_db[n] || (isinf(db) && isinf(want_db[n])));
        double w = attr(p, "width"), want = isinf(db) ? pw : (db - x0) / (x1 - x0) * pw;
        if (fabs(w - want) > 0.051)
            fail_msg("%s bar %d (%g dB): width %g, expected %g on [%g, %g] over %g px", cls, n,
                     db, w, want, x0, x1, pw);
        assert_true(attr(p, "x") == left);
    }
    return n;
}

static char *write_html(const qcal_accuracy_report *r, const qcal_accuracy_html_options *o)
{
    char *path = tu_path(tmp_dir, "r.html");
    qcal_status st = qcal_accuracy_report_write_html(r, o, path);
    if (st != QCAL_OK)
        fail_msg("write_html: %s", qcal_last_error());
    size_t len = 0;
    char *h = tu_read_file(path, &len);
    assert_int_equal(strlen(h), len);
    return h;
}

static void test_html(void **state)
{
    (void)state;
    qcal_accuracy_report r;
    qcal_accuracy_source s;
    parse(cmp_json, &r, &s);
    qcal_accuracy_html_options o;
    qcal_accuracy_html_options_default(&o);
    o.title = "<cmp> & co";
    o.source = &s;
    char *h = write_html(&r, &o);
    const char *why = check_balanced(h);
    if (why)
        fail_msg("HTML: %s", why);
    assert_non_null(strstr(h, "<title>&lt;cmp&gt; &amp; co</title>"));
    assert_non_null(strstr(h, "float <b>m.onnx</b>"));
    assert_non_null(strstr(h, "quantized <b>m.qdq.onnx</b>"));
    assert_non_null(strstr(h, "ONNX Runtime 1.30.0"));
    assert_non_null(strstr(h, "16 samples &#183; SQNR over every float output <b>23.50 dB</b>"));
    assert_non_null(strstr(h, "aux&lt;&amp;&gt;"));
    assert_null(strstr(h, "aux<"));
    /* the outputs' table: accuracies and their drop in points, "-" for null */
    assert_non_null(strstr(h, "<td data-v=\"87.5\">87.50%</td><td data-v=\"81.25\">81.25%</td>"
                              "<td data-v=\"6.25\">6.25 pt</td>"));
    assert_non_null(strstr(h, "<td data-v=\"1e300\">&#8734; dB</td>"));
    assert_int_equal(count(h, "<td data-v=\"-1e300\" class=\"na\">"), 3 + 1);
    /* ops in the report's order, in the chart and in the table */
    const char *m = strstr(h, "<g class=\"op\" data-rank=\"1\"><title>/blk1/Mul (Mul)");
    const char *c = strstr(h, "<g class=\"op\" data-rank=\"2\"><title>/blk0/conv/Conv (Conv)");
    const char *u = strstr(h, "<g class=\"op\" data-rank=\"3\"><title>(unnamed) (MatMul)");
    assert_true(m && c && u && m < c && c < u);
    m = strstr(h, "<td class=\"l\">/blk1/Mul</td>");
    c = strstr(h, "<td class=\"l\">/blk0/conv/Conv</td>");
    assert_true(m && c && m < c);
    /* axis [0, 35] dB in steps of 5; bars proportional; the NaN bar not drawn */
    const char *svg = strstr(h, "<svg class=\"bars\"");
    assert_true(attr(svg, "data-x0") == 0 && attr(svg, "data-x1") == 35);
    static const double alone[] = { 12.5, 30.25, INFINITY }, all_but[] = { 35.0, 23.0 };
    assert_int_equal(check_bars(h, "alone", alone, 3), 3);
    assert_int_equal(check_bars(h, "allbut", all_but, 2), 2);
    const char *ref = strstr(h, "<line class=\"ref\"");
    assert_non_null(ref);
    assert_true(attr(ref, "data-db") == 22.25);
    double want_x = attr(svg, "data-left") + 22.25 / 35 * attr(svg, "data-plot-width");
    assert_true(fabs(attr(ref, "x1") - want_x) <= 0.051);
    assert_non_null(strstr(h, "every op quantized: 22.25 dB"));
    free(h);

    /* Negative SQNRs: the axis starts below 0 (whole steps of 2 dB from -4 to 12) and the bars
     * still start at its left end; no source, no accuracy columns. */
    r.ops[0].sqnr_only_db = -3.5;
    r.ops[1].sqnr_only_db = 12.0;
    r.ops[2].sqnr_only_db = 0.5;
    r.ops[0].sqnr_others_db = r.ops[1].sqnr_others_db = NAN;
    r.gated_sqnr_db = -1.0;
    for (int64_t i = 0; i < r.n_outputs; i++)
        r.outputs[i].acc_float = r.outputs[i].acc_quant = NAN;
    h = write_html(&r, NULL);
    assert_null(check_balanced(h));
    svg = strstr(h, "<svg class=\"bars\"");
    assert_true(attr(svg, "data-x0") == -4 && attr(svg, "data-x1") == 12);
    static const double neg[] = { -3.5, 12.0, 0.5 };
    assert_int_equal(check_bars(h, "alone", neg, 3), 3);
    assert_int_equal(check_bars(h, "allbut", NULL, 0), 0);
    assert_null(strstr(h, "float accuracy"));
    assert_null(strstr(h, "m.onnx"));
    assert_non_null(strstr(h, "<title>qcal accuracy report</title>"));
    free(h);

    /* No ops: no chart, no op table. */
    r.n_ops = 0;
    h = write_html(&r, NULL);
    assert_null(check_balanced(h));
    assert_null(strstr(h, "<svg"));
    assert_null(strstr(h, "id=\"ops\""));
    free(h);
    r.n_ops = 3;
    qcal_accuracy_report_free(&r);
    qcal_accuracy_source_free(&s);

    /* An unwritable path: QCAL_ERR_IO naming it. */
    memset(&r, 0, sizeof r);
    char *bad = tu_path(tmp_dir, "nodir/r.html");
    assert_int_equal(qcal_accuracy_report_write_html(&r, NULL, bad), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "nodir"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_html),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
