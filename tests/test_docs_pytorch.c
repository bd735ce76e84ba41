/* Every number the docs attribute to PyTorch is PyTorch's: tests/data/docs/pytorch_numbers.txt
 * (written by tests/ref/gen_doc_numbers.py with torch 1.13; python.torch_histogram checks it
 * against the live torch) lists `FILE<TAB>TEXT` claims, and each FILE under the source root
 * must contain TEXT (runs of white space, line breaks included, compare as one space). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"

/* s with every run of white space made one space, in place. */
static void squeeze(char *s)
{
    char *o = s;
    int sp = 0;
    for (char *p = s; *p; p++) {
        if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
            sp = 1;
            continue;
        }
        if (sp && o != s)
            *o++ = ' ';
        sp = 0;
        *o++ = *p;
    }
    *o = '\0';
}

static void test_doc_numbers(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    const char *data = getenv("QCAL_TEST_DATA");
    assert_non_null(root);
    char *list = tu_read_file(tu_path(data ? data : "tests/data", "docs/pytorch_numbers.txt"),
                              NULL);
    int claims = 0, bad = 0;
    for (char *line = list, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = '\0';
        char *doc = tu_read_file(tu_path(root, line), NULL);
        squeeze(doc);
        char *text = tab + 1;
        squeeze(text);
        if (!strstr(doc, text)) {
            print_error("%s lacks PyTorch's numbers: \"%s\" (tests/ref/gen_doc_numbers.py)\n",
                        line, text);
            bad++;
        }
        claims++;
        free(doc);
    }
    free(list);
    assert_true(claims >= 6);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
