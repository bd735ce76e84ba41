/* The CLI's documentation against its option tables: `qcal --list-options` (generated from
 * every subcommand's table and the observer key table) must be matched by each subcommand's
 * --help, its section of docs/cli.md, the generated man page and bash completion (which are
 * also the files meson builds and installs), and the completion must work in bash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

static char tmpdir[64];
static char out[1 << 18], err[1 << 12];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_clidocs_XXXXXX");
    if (!mkdtemp(tmpdir) || !getenv("QCAL_BIN") || !getenv("QCAL_SOURCE_ROOT"))
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
    va_list ap;
    va_start(ap, first);
    int rc = tu_run_va(getenv("QCAL_BIN"), first, ap, tmpdir, out, sizeof out, err,
                       sizeof err);
    va_end(ap);
    return rc;
}

/* The part of doc from the "## " heading mentioning `qcal SUB` to the next "## ". */
static char *doc_section(const char *doc, const char *sub)
{
    char needle[96];
    snprintf(needle, sizeof needle, "`qcal %s`", sub);
    for (const char *p = doc; (p = strstr(p, "\n## ")); p++) {
        const char *eol = strchr(p + 1, '\n');
        if (!eol)
            break;
        const char *h = strstr(p, needle);
        if (h && h < eol) {
            const char *end = strstr(eol, "\n## ");
            size_t n = end ? (size_t)(end - p) : strlen(p);
            char *s = malloc(n + 1);
            memcpy(s, p, n);
            s[n] = '\0';
            return s;
        }
    }
    return NULL;
}

static char *dup_out(void)
{
    return strdup(out);
}

static void test_options_documented_everywhere(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    char *doc = tu_read_file(tu_path(root, "docs/cli.md"), NULL);
    char *obs_doc = strstr(doc, "### Observer options");
    assert_non_null(obs_doc);
    assert_int_equal(run("--man", NULL), 0);
    char *man = dup_out();
    assert_int_equal(run("--bash-completion", NULL), 0);
    char *comp = dup_out();
    assert_int_equal(run("--help", NULL), 0);
    char *top = dup_out();
    assert_int_equal(run("--list-options", NULL), 0);
    char *list = dup_out();
    char cur[64] = "", *help = NULL, *section = NULL, *comp_case = NULL;
    int checked = 0, subs = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        char sub[64], opt[96];
        assert_int_equal(sscanf(line, "%63s %95s", sub, opt), 2);
        bool observer_key = strstr(line, "(observer key ") != NULL;
        if (strcmp(sub, cur)) {
            snprintf(cur, sizeof cur, "%s", sub);
            subs++;
            free(help);
            free(section);
            free(comp_case);
            int rc = run(sub, "--help", NULL);
            assert_int_equal(rc, 0);
            help = dup_out();
            section = doc_section(doc, sub);
            if (!section)
                fail_msg("docs/cli.md has no section for `qcal %s`", sub);
            char head[80];
            snprintf(head, sizeof head, "\n  %s ", sub);
            if (!strstr(top, head))
                fail_msg("'qcal --help' does not list %s", sub);
            snprintf(head, sizeof head, ".SH \"QCAL %s\"", sub);
            if (!strstr(man, head))
                fail_msg("the man page has no section for %s", sub);
            snprintf(head, sizeof head, "\n    %s)\n", sub);
            const char *c = strstr(comp, head);
            if (!c)
                fail_msg("the completion has no case for %s", sub);
            const char *e = strstr(c + 1, "\n        ;;");
            comp_case = strndup(c, e ? (size_t)(e - c) : strlen(c));
        }
        char spaced[128], roff[192];
        snprintf(spaced, sizeof spaced, "%s ", opt);
        if (!strstr(help, opt))
            fail_msg("'qcal %s --help' does not mention %s", sub, opt);
        if (!strstr(observer_key ? obs_doc : section, opt))
            fail_msg("docs/cli.md (%s) does not mention %s", observer_key ? "observer options"
                                                                           : sub, opt);
        /* the man page escapes '-' as "\-" */
        size_t o = 0;
        for (const char *p = opt; *p && o + 3 < sizeof roff; p++) {
            if (*p == '-')
                roff[o++] = '\\';
            roff[o++] = *p;
        }
        roff[o] = '\0';
        if (!strstr(man, roff))
            fail_msg("the man page does not mention %s (%s)", opt, sub);
        snprintf(spaced, sizeof spaced, " %s", opt);
        if (!strstr(comp_case, spaced))
            fail_msg("the completion of %s does not offer %s", sub, opt);
        checked++;
    }
    assert_true(subs >= 8);
    assert_true(checked > 80);
    free(help);
    free(section);
    free(comp_case);
    free(list);
    free(top);
    free(man);
    free(comp);
    free(doc);
}

/* The man page and completion meson builds (and installs) are the generated ones. */
static void test_built_and_installed(void **state)
{
    (void)state;
    const char *build = getenv("QCAL_BUILD_ROOT");
    assert_non_null(build);
    assert_int_equal(run("--man", NULL), 0);
    size_t n;
    char *f = tu_read_file(tu_path(build, "tools/qcal.1"), &n);
    assert_int_equal(n, strlen(out));
    assert_memory_equal(f, out, n);
    free(f);
    assert_int_equal(run("--bash-completion", NULL), 0);
    f = tu_read_file(tu_path(build, "tools/completion/qcal"), &n);
    assert_int_equal(n, strlen(out));
    assert_memory_equal(f, out, n);
    free(f);
    char *inst = tu_read_file(tu_path(build, "meson-info/intro-installed.json"), NULL);
    assert_non_null(strstr(inst, "/man1/qcal.1\""));
    assert_non_null(strstr(inst, "/bash-completion/completions/qcal\""));
    free(inst);
}

/* The completion in bash: subcommands, options, words, nothing for numbers. */
static void test_completion_in_bash(void **state)
{
    (void)state;
    assert_int_equal(run("--bash-completion", NULL), 0);
    char *script = strdup(tu_path(tmpdir, "qcal.bash"));
    tu_write_bytes(script, out, strlen(out));
    char *driver = strdup(tu_path(tmpdir, "drive.sh"));
    const char *d =
        "source \"$1\"\n"
        "comp() { COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _qcal;"
        " echo \"[${COMPREPLY[*]}]\"; }\n"
        "comp qcal con\n"
        "comp qcal calibrate --form\n"
        "comp qcal calibrate --format ''\n"
        "comp qcal observe --percentile-mode ''\n"
        "comp qcal observe --observer per_\n"
        "comp qcal observe --bins ''\n"
        "comp qcal convert --skip\n"
        "comp qcal help fake\n";
    tu_write_bytes(driver, d, strlen(d));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "bash -n '%s' && bash '%s' '%s' >'%s/.c' 2>&1", script, driver,
             script, tmpdir);
    int rc = system(cmd);
    char got[4096];
    tu_slurp(tu_path(tmpdir, ".c"), got, sizeof got);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("bash failed: %s", got);
    assert_string_equal(got, "[convert]\n"
                             "[--format]\n"
                             "[json tensorrt onnxruntime ncnn]\n"
                             "[abs two_tails auto]\n"
                             "[per_channel_minmax]\n"
                             "[]\n"
                             "[--skip-unrepresentable]\n"
                             "[fakequant]\n");
    free(script);
    free(driver);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_documented_everywhere),
        cmocka_unit_test(test_built_and_installed),
        cmocka_unit_test(test_completion_in_bash),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
