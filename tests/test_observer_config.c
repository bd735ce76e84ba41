/* The observer-config key table (qcal_observer_config_set/_apply) and its three front ends:
 * for every key of the table, a bad value gives the same message and exit code in
 * `qcal observe`, `qcal calibrate`, a rules file (and `qcal compare-weights` for the three
 * keys it takes); both spellings of a word ('-' or '_')
 * are accepted everywhere; --strict on NaN exits 1 in observe and calibrate; the help text
 * of both subcommands and docs/cli.md list every key and every word. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "qcal/qcal.h"

#include "testutil.h"

static char tmpdir[64];
static char out[1 << 16], err[1 << 12];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_obscfg_XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmpdir);
    return 0;
}

static int run(const char *first, ...)
{
    const char *bin = getenv("QCAL_BIN");
    assert_non_null(bin);
    va_list ap;
    va_start(ap, first);
    int rc = tu_run_va(bin, first, ap, tmpdir, out, sizeof out, err, sizeof err);
    va_end(ap);
    return rc;
}

static void cli_name(const qcal_observer_key *k, char *dst, size_t cap)
{
    size_t i = 0;
    for (; k->name[i] && i + 1 < cap; i++)
        dst[i] = k->name[i] == '_' ? '-' : k->name[i];
    dst[i] = '\0';
}

/* The message after "qcal: SUB: " (and after "PATH: line 1: " for rules files), without
 * the newline. */
static void message_of(const char *e, const char *prefix, char *dst, size_t cap)
{
    const char *p = strstr(e, prefix);
    if (!p)
        fail_msg("'%s' not in stderr: %s", prefix, e);
    p += strlen(prefix);
    size_t n = strcspn(p, "\n");
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, p, n);
    dst[n] = '\0';
}

/* A value the key refuses. */
static const char *bad_value(const qcal_observer_key *k)
{
    if (k->choices)
        return "bogus-word";
    return "12abc";
}

static void write_npy(const char *path, const float *v, int64_t n)
{
    int64_t shape[1] = { n };
    assert_int_equal(qcal_npy_write(path, QCAL_NPY_F32, 1, shape, v), QCAL_OK);
}

static void test_library_set_apply(void **state)
{
    (void)state;
    qcal_observer_config a, b;
    qcal_observer_config_default(&a, QCAL_OBSERVER_PERCENTILE);
    qcal_observer_config_default(&b, QCAL_OBSERVER_PERCENTILE);
    /* Both spellings of the key and the word. */
    assert_int_equal(qcal_observer_config_set(&a, "percentile_mode", "two_tails"), QCAL_OK);
    assert_int_equal(qcal_observer_config_set(&b, "percentile-mode", "two-tails"), QCAL_OK);
    assert_int_equal(a.percentile_mode, QCAL_PERCENTILE_TWO_TAILS);
    assert_memory_equal(&a, &b, sizeof a);
    /* Bad values leave the config unchanged and name the key. */
    qcal_observer_config c = a;
    assert_int_equal(qcal_observer_config_set(&c, "bins", "-"), QCAL_ERR_INVALID_ARG);
    assert_memory_equal(&a, &c, sizeof a);
    assert_string_equal(qcal_last_error(), "bins: '-' is not an integer");
    assert_int_equal(qcal_observer_config_set(&c, "percentile_mode", "both"),
                     QCAL_ERR_INVALID_ARG);
    assert_string_equal(qcal_last_error(),
                        "unknown percentile_mode 'both' (expected abs, two_tails or auto)");
    assert_int_equal(qcal_observer_config_set(&c, "colour", "red"), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "unknown key 'colour'"));
    assert_int_equal(qcal_observer_config_set(&c, "eps", "nan"), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_observer_config_set(&c, "eps", "0"), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_observer_config_set(&c, "axis", "8"), QCAL_ERR_INVALID_ARG);
    assert_memory_equal(&a, &c, sizeof a);

    /* apply: the observer first whatever its position, then the others in order. */
    const char *k1[] = { "bins", "observer", "nonfinite" };
    const char *v1[] = { "64", "histogram", "error" };
    qcal_observer_config d;
    qcal_observer_config_default(&d, QCAL_OBSERVER_MINMAX);
    assert_int_equal(qcal_observer_config_apply(&d, 3, k1, v1), QCAL_OK);
    assert_int_equal(d.kind, QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(d.bins, 64);
    assert_int_equal(d.nonfinite, QCAL_NONFINITE_ERROR);
    /* twice, a lone quant_min, an invalid whole: errors, *cfg untouched. */
    qcal_observer_config e = d;
    const char *k2[] = { "bins", "bins" };
    const char *v2[] = { "64", "32" };
    assert_int_equal(qcal_observer_config_apply(&e, 2, k2, v2), QCAL_ERR_INVALID_ARG);
    assert_string_equal(qcal_last_error(), "bins given twice");
    const char *k3[] = { "quant_min", "dtype" };
    const char *v3[] = { "0", "qint8" };
    assert_int_equal(qcal_observer_config_apply(&e, 2, k3, v3), QCAL_ERR_INVALID_ARG);
    assert_string_equal(qcal_last_error(), "quant_min and quant_max go together");
    const char *k4[] = { "bins", "observer" };
    const char *v4[] = { "0", "histogram" };
    assert_int_equal(qcal_observer_config_apply(&e, 2, k4, v4), QCAL_ERR_INVALID_ARG);
    assert_memory_equal(&d, &e, sizeof d);
    /* custom range */
    const char *k5[] = { "quant_max", "quant_min", "dtype" };
    const char *v5[] = { "7", "-8", "qint8" };
    assert_int_equal(qcal_observer_config_apply(&e, 3, k5, v5), QCAL_OK);
    int64_t lo, hi;
    assert_int_equal(qcal_qconfig_range(&e.q, &lo, &hi), QCAL_OK);
    assert_int_equal(lo, -8);
    assert_int_equal(hi, 7);

    /* Every word of every choice key is accepted with '_' and with '-', and sets the
     * documented enum value (word i = value i). */
    for (int64_t i = 0; i < qcal_observer_config_key_count(); i++) {
        const qcal_observer_key *k = qcal_observer_config_key(i);
        assert_non_null(k->name);
        assert_non_null(k->help);
        assert_non_null(k->metavar);
        if (!k->choices)
            continue;
        const char *w = k->choices;
        while (*w) {
            char word[128], dashed[128];
            size_t len = strcspn(w, "|");
            assert_true(len < sizeof word);
            memcpy(word, w, len);
            word[len] = '\0';
            for (size_t j = 0; j <= len; j++)
                dashed[j] = word[j] == '_' ? '-' : word[j];
            qcal_observer_config x, y;
            qcal_observer_config_default(&x, QCAL_OBSERVER_MINMAX);
            qcal_observer_config_default(&y, QCAL_OBSERVER_MINMAX);
            assert_int_equal(qcal_observer_config_set(&x, k->name, word), QCAL_OK);
            assert_int_equal(qcal_observer_config_set(&y, k->name, dashed), QCAL_OK);
            assert_memory_equal(&x, &y, sizeof x);
            w += len + (w[len] == '|');
        }
    }
    assert_null(qcal_observer_config_key(-1));
    assert_null(qcal_observer_config_key(qcal_observer_config_key_count()));
}

/* For every key: observe, calibrate and a rules file refuse a bad value with exit 2 and
 * the library's message. */
static void test_same_message_everywhere(void **state)
{
    (void)state;
    const float v[] = { -1.0f, 0.5f, 2.0f };
    char *f = strdup(tu_path(tmpdir, "x.npy"));
    char *dump = strdup(tu_path(tmpdir, "dump"));
    char *rules = strdup(tu_path(tmpdir, "r.rules"));
    char *table = strdup(tu_path(tmpdir, "t.json"));
    mkdir(dump, 0755);
    write_npy(tu_path(dump, "act.npy"), v, 3);
    write_npy(f, v, 3);
    for (int64_t i = 0; i < qcal_observer_config_key_count(); i++) {
        const qcal_observer_key *k = qcal_observer_config_key(i);
        const char *bad = bad_value(k);
        qcal_observer_config c;
        qcal_observer_config_default(&c, QCAL_OBSERVER_MINMAX);
        assert_int_equal(qcal_observer_config_set(&c, k->name, bad), QCAL_ERR_INVALID_ARG);
        char want[1024], got[1024], opt[128], name[64];
        snprintf(want, sizeof want, "%s", qcal_last_error());
        cli_name(k, name, sizeof name);
        if (!k->flag_only) {
            snprintf(opt, sizeof opt, "--%s", name);
            assert_int_equal(run("observe", opt, bad, f, NULL), 2);
            message_of(err, "qcal: observe: ", got, sizeof got);
            assert_string_equal(got, want);
            assert_int_equal(run("calibrate", dump, "-o", table, opt, bad, NULL), 2);
            message_of(err, "qcal: calibrate: ", got, sizeof got);
            assert_string_equal(got, want);
            /* compare-weights takes three of the keys, through the same table */
            if (!strcmp(k->name, "observer") || !strcmp(k->name, "dtype") ||
                !strcmp(k->name, "qscheme")) {
                assert_int_equal(run("compare-weights", opt, bad, f, NULL), 2);
                message_of(err, "qcal: compare-weights: ", got, sizeof got);
                assert_string_equal(got, want);
            }
        }
        char line[256];
        if (!strcmp(k->name, "observer"))
            snprintf(line, sizeof line, "* any %s\n", bad);
        else
            snprintf(line, sizeof line, "* any minmax %s=%s\n", k->name, bad);
        tu_write_bytes(rules, line, strlen(line));
        assert_int_equal(run("calibrate", dump, "-o", table, "--rules", rules, NULL), 2);
        char prefix[512];
        snprintf(prefix, sizeof prefix, "%s: line 1: ", rules);
        message_of(err, prefix, got, sizeof got);
        assert_string_equal(got, want);
        assert_int_equal(access(table, F_OK), -1);
    }
    /* Both spellings, CLI and rules: the same table. */
    char *t1 = strdup(tu_path(tmpdir, "t1.json")), *t2 = strdup(tu_path(tmpdir, "t2.json"));
    assert_int_equal(run("calibrate", dump, "-o", t1, "--observer", "percentile",
                         "--percentile-mode", "two-tails", "--percentile", "90", NULL), 0);
    const char *r2 = "* activation percentile percentile_mode=two_tails percentile=90\n";
    tu_write_bytes(rules, r2, strlen(r2));
    assert_int_equal(run("calibrate", dump, "-o", t2, "--rules", rules, NULL), 0);
    size_t n1, n2;
    char *b1 = tu_read_file(t1, &n1), *b2 = tu_read_file(t2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    /* and differs from abs mode, so the setting took effect */
    assert_int_equal(run("calibrate", dump, "-o", t2, "--observer", "percentile",
                         "--percentile_mode", "abs", "--percentile", "90", NULL), 0);
    free(b2);
    b2 = tu_read_file(t2, &n2);
    assert_true(n1 != n2 || memcmp(b1, b2, n1) != 0);
    free(b1);
    free(b2);
    free(t1);
    free(t2);
    free(f);
    free(dump);
    free(rules);
    free(table);
}

/* --strict (nonfinite=error) on NaN: exit 1 in both subcommands and with a rules file. */
static void test_strict_exit_code(void **state)
{
    (void)state;
    const float v[] = { -1.0f, 0.0f / 0.0f, 2.0f };
    char *f = strdup(tu_path(tmpdir, "nan.npy"));
    char *dump = strdup(tu_path(tmpdir, "nandump"));
    char *rules = strdup(tu_path(tmpdir, "strict.rules"));
    char *table = strdup(tu_path(tmpdir, "nan.json"));
    mkdir(dump, 0755);
    write_npy(tu_path(dump, "act.npy"), v, 3);
    write_npy(f, v, 3);
    assert_int_equal(run("observe", "--strict", f, NULL), 1);
    tu_expect_one_line(err, "qcal: observe: ", "non-finite");
    assert_int_equal(run("observe", "--nonfinite", "error", f, NULL), 1);
    assert_int_equal(run("calibrate", dump, "-o", table, "--strict", NULL), 1);
    tu_expect_one_line(err, "qcal: calibrate: ", "non-finite");
    const char *r = "* any minmax nonfinite=error\n";
    tu_write_bytes(rules, r, strlen(r));
    assert_int_equal(run("calibrate", dump, "-o", table, "--rules", rules, NULL), 1);
    assert_int_equal(access(table, F_OK), -1);
    /* default: skipped and counted */
    assert_int_equal(run("observe", f, NULL), 0);
    assert_non_null(strstr(out, "\"nonfinite\": 1"));
    free(f);
    free(dump);
    free(rules);
    free(table);
}

/* The help of observe and calibrate and docs/cli.md list every key (CLI spelling), its
 * flag, and every word; rules keys appear in docs/cli.md with '_'. Calibrate's help names
 * histogram as its default observer, observe's minmax. */
static void test_help_and_docs_list_every_key(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    assert_non_null(root);
    char *doc = tu_read_file(tu_path(root, "docs/cli.md"), NULL);
    const char *subs[] = { "observe", "calibrate" };
    for (int s = 0; s < 2; s++) {
        assert_int_equal(run(subs[s], "--help", NULL), 0);
        assert_non_null(strstr(out, s == 0 ? "observer kind (default minmax)"
                                           : "observer kind (default histogram)"));
        for (int64_t i = 0; i < qcal_observer_config_key_count(); i++) {
            const qcal_observer_key *k = qcal_observer_config_key(i);
            char name[64], opt[160];
            cli_name(k, name, sizeof name);
            if (!k->flag_only) {
                snprintf(opt, sizeof opt, "--%s %s", name, k->metavar);
                if (!strstr(out, opt))
                    fail_msg("'qcal %s --help' lacks '%s'", subs[s], opt);
                if (s == 0 && !strstr(doc, opt))
                    fail_msg("docs/cli.md lacks '%s'", opt);
            }
            if (k->cli_flag) {
                snprintf(opt, sizeof opt, "--%s", k->cli_flag);
                if (!strstr(out, opt) || (s == 0 && !strstr(doc, opt)))
                    fail_msg("help or docs/cli.md lacks '%s'", opt);
            }
            snprintf(opt, sizeof opt, "`%s`", k->name);
            if (s == 0 && strcmp(k->name, "observer") && !strstr(doc, opt))
                fail_msg("docs/cli.md lacks rules key %s", opt);
            for (const char *w = k->choices; w && *w;) {
                size_t len = strcspn(w, "|");
                char word[128];
                snprintf(word, sizeof word, "%.*s", (int)len, w);
                if (!k->flag_only && !strstr(out, word))
                    fail_msg("'qcal %s --help' lacks %s word '%s'", subs[s], k->name, word);
                snprintf(opt, sizeof opt, "`%s`", word);
                if (s == 0 && !strstr(doc, opt))
                    fail_msg("docs/cli.md lacks %s word %s", k->name, opt);
                w += len + (w[len] == '|');
            }
        }
    }
    free(doc);
}

/* The flat keys of rules files, the CLI and Python against the nested struct: every key of
 * the table lands in the field observer.h's mapping (next to qcal_observer_config) names,
 * and changes nothing else (quant_min/quant_max also set q.custom_range); the README's
 * four-call example names qcal_observer_config_set. */
typedef struct field_ref {
    const char *name;
    size_t off, size;
} field_ref;

#define FIELD(f) { #f, offsetof(qcal_observer_config, f), sizeof(((qcal_observer_config *)0)->f) }

static const field_ref fields[] = {
    FIELD(kind), FIELD(q.dtype), FIELD(q.qscheme), FIELD(q.reduce_range), FIELD(q.custom_range),
    FIELD(q.quant_min), FIELD(q.quant_max), FIELD(q.eps), FIELD(axis), FIELD(averaging_constant),
    FIELD(bins), FIELD(grid), FIELD(percentile), FIELD(percentile_mode), FIELD(entropy_levels),
    FIELD(nonfinite),
};

static void test_flat_keys_map_to_documented_fields(void **state)
{
    (void)state;
    static const struct {
        const char *key, *value, *field, *also;
    } want[] = {
        { "observer", "mse", "kind", NULL },
        { "dtype", "qint8", "q.dtype", NULL },
        { "qscheme", "per_tensor_symmetric", "q.qscheme", NULL },
        { "reduce_range", "true", "q.reduce_range", NULL },
        { "quant_min", "-8", "q.quant_min", "q.custom_range" },
        { "quant_max", "15", "q.quant_max", "q.custom_range" },
        { "eps", "0.5", "q.eps", NULL },
        { "axis", "1", "axis", NULL },
        { "averaging_constant", "0.5", "averaging_constant", NULL },
        { "bins", "1024", "bins", NULL },
        { "grid", "first_batch", "grid", NULL },
        { "percentile", "99.9", "percentile", NULL },
        { "percentile_mode", "two_tails", "percentile_mode", NULL },
        { "entropy_levels", "64", "entropy_levels", NULL },
        { "nonfinite", "error", "nonfinite", NULL },
    };
    const size_t nwant = sizeof want / sizeof want[0];
    const char *root = getenv("QCAL_SOURCE_ROOT");
    assert_non_null(root);
    char *hdr = tu_read_file(tu_path(root, "include/qcal/observer.h"), NULL);
    char *readme = tu_read_file(tu_path(root, "README.md"), NULL);
    assert_int_equal(qcal_observer_config_key_count(), (int64_t)nwant);
    qcal_observer_config base;
    memset(&base, 0, sizeof base);
    qcal_observer_config_default(&base, QCAL_OBSERVER_HISTOGRAM);
    for (int64_t i = 0; i < qcal_observer_config_key_count(); i++) {
        const char *key = qcal_observer_config_key(i)->name;
        size_t w = 0;
        while (w < nwant && strcmp(want[w].key, key))
            w++;
        if (w == nwant)
            fail_msg("key '%s' has no expected field in this test", key);
        /* The header's line: " *   KEY<spaces>-> FIELD" */
        char pat[128];
        snprintf(pat, sizeof pat, " *   %s ", key);
        const char *line = strstr(hdr, pat);
        if (!line)
            fail_msg("observer.h does not map key '%s'", key);
        const char *arrow = strstr(line, "-> ");
        const char *eol = strchr(line, '\n');
        if (!arrow || (eol && arrow > eol) ||
            strncmp(arrow + 3, want[w].field, strlen(want[w].field)))
            fail_msg("observer.h maps '%s' elsewhere than %s", key, want[w].field);
        qcal_observer_config c = base;
        assert_int_equal(qcal_observer_config_set(&c, key, want[w].value), QCAL_OK);
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
            bool changed = memcmp((const char *)&c + fields[f].off,
                                  (const char *)&base + fields[f].off, fields[f].size) != 0;
            bool expected = !strcmp(fields[f].name, want[w].field) ||
                            (want[w].also && !strcmp(fields[f].name, want[w].also));
            if (!strcmp(key, "observer") && !expected)
                continue;   /* resets the others to the new kind's defaults */
            if (changed != expected)
                fail_msg("%s=%s %s %s", key, want[w].value,
                         changed ? "changed" : "did not change", fields[f].name);
        }
    }
    const char *ex = strstr(readme, "## The library in four calls");
    assert_non_null(ex);
    const char *end = strstr(ex, "```\n\n");
    const char *set = strstr(ex, "qcal_observer_config_set(");
    assert_true(set && end && set < end);
    free(hdr);
    free(readme);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_set_apply),
        cmocka_unit_test(test_same_message_everywhere),
        cmocka_unit_test(test_strict_exit_code),
        cmocka_unit_test(test_help_and_docs_list_every_key),
        cmocka_unit_test(test_flat_keys_map_to_documented_fields),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
