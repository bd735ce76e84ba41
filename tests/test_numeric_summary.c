/* unit.numeric_summary: numeric/summary.c (grouping, outlier rule, members without finite
 * values, keep-float list). The logger's tests are in test_numeric_logger.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qcal/numeric.h"

static void add(qcal_numeric_summary *s, const char *name, float absmax, double sqnr)
{
    qcal_numeric_summary_item it;
    memset(&it, 0, sizeof it);
    it.name = name;
    it.ndim = 2;
    it.shape[0] = 8;
    it.shape[1] = 4;
    it.max = absmax;
    it.absmax = absmax;
    it.std = absmax / 2;
    it.sqnr_db = sqnr;
    assert_int_equal(qcal_numeric_summary_add(s, &it), QCAL_OK);
}

static void test_grouping(void **state)
{
    (void)state;
    char buf[64];
    assert_int_equal(qcal_numeric_summary_default_pattern("blocks.10.attn.q", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "blocks.*.attn.q");
    assert_int_equal(qcal_numeric_summary_default_pattern("fc1.weight", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "fc1.weight");
    assert_int_equal(qcal_numeric_summary_default_pattern("0.a1.12", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "*.a1.*");
    assert_int_equal(qcal_numeric_summary_default_pattern("blocks.0.attn.q", buf, 5), QCAL_ERR_INVALID_ARG);

    qcal_numeric_summary_options o;
    qcal_numeric_summary_options_default(&o);
    assert_true(o.outlier_factor == 4.0 && isnan(o.min_sqnr));
    o.min_sqnr = 30;
    qcal_numeric_summary *s = NULL;
    assert_int_equal(qcal_numeric_summary_create(&o, &s), QCAL_OK);
    add(s, "blocks.0.attn.q", 1.0f, 40);
    add(s, "blocks.1.attn.q", 1.2f, 38);
    add(s, "blocks.2.attn.q", 0.9f, 41);
    add(s, "blocks.3.attn.q", 4.9f, 25);   /* 4.9 > 4 x median(1.05..) -> outlier */
    add(s, "head", 2.0f, NAN);
    int64_t ng;
    assert_int_equal(qcal_numeric_summary_group_count(s, &ng), QCAL_OK);
    assert_int_equal(ng, 2);
    qcal_numeric_summary_group g;
    assert_int_equal(qcal_numeric_summary_get_group(s, 0, &g), QCAL_OK);
    assert_string_equal(g.pattern, "blocks.*.attn.q");
    assert_int_equal(g.count, 4);
    assert_true(g.max_of_max == 4.9f);
    assert_true(fabs(g.mean_of_std - (1.0 + 1.2 + 0.9 + 4.9) / 8) < 1e-6);
    assert_true(g.worst_sqnr_db == 25);
    assert_string_equal(g.worst_member, "blocks.3.attn.q");
    assert_true(fabs(g.median_absmax - 0.5 * (1.0f + 1.2f)) < 1e-6);
    assert_int_equal(g.n_outliers, 1);
    const char *nm;
    assert_int_equal(qcal_numeric_summary_outlier(s, 0, 0, &nm), QCAL_OK);
    assert_string_equal(nm, "blocks.3.attn.q");
    assert_int_equal(qcal_numeric_summary_outlier(s, 0, 1, &nm), QCAL_ERR_INVALID_ARG);
    assert_int_equal(g.ndim, 2);
    assert_int_equal(g.shape[0], 8);
    assert_int_equal(qcal_numeric_summary_get_group(s, 1, &g), QCAL_OK);
    assert_true(isnan(g.worst_sqnr_db));
    assert_int_equal(g.n_outliers, 0);   /* groups under 3 members have no outliers */
    const char *keep[4];
    int64_t nk;
    assert_int_equal(qcal_numeric_summary_keep_float(s, 4, keep, &nk), QCAL_OK);
    assert_int_equal(nk, 1);
    assert_string_equal(keep[0], "blocks.3.attn.q");
    qcal_numeric_summary_destroy(&s);
    assert_null(s);

    /* user globs win over the default collapse */
    const char *globs[] = {"*.attn.*"};
    qcal_numeric_summary_options_default(&o);
    o.globs = globs;
    o.n_globs = 1;
    assert_int_equal(qcal_numeric_summary_create(&o, &s), QCAL_OK);
    add(s, "blocks.0.attn.q", 1, NAN);
    add(s, "blocks.0.attn.k", 1, NAN);
    add(s, "blocks.0.mlp", 1, NAN);
    assert_int_equal(qcal_numeric_summary_group_count(s, &ng), QCAL_OK);
    assert_int_equal(ng, 2);
    assert_int_equal(qcal_numeric_summary_get_group(s, 0, &g), QCAL_OK);
    assert_string_equal(g.pattern, "*.attn.*");
    assert_int_equal(g.count, 2);
    qcal_numeric_summary_destroy(&s);
    o.outlier_factor = 0.5;
    assert_int_equal(qcal_numeric_summary_create(&o, &s), QCAL_ERR_INVALID_ARG);
}

/* Members without finite values (max = -inf, as qcal_numeric_stats with count 0) are counted in
 * n_empty but left out of max_of_max, mean_of_std, the median and the outliers. */
static void test_empty_members(void **state)
{
    (void)state;
    qcal_numeric_summary_options o;
    qcal_numeric_summary_options_default(&o);
    qcal_numeric_summary *s = NULL;
    assert_int_equal(qcal_numeric_summary_create(&o, &s), QCAL_OK);
    qcal_numeric_stats empty;
    qcal_numeric_stats_init(&empty);
    qcal_numeric_summary_item it;
    memset(&it, 0, sizeof it);
    it.name = "layers.0.w";
    it.ndim = 1;
    it.shape[0] = 0;
    it.max = empty.max;
    it.absmax = empty.absmax;
    it.std = 0;
    it.sqnr_db = NAN;
    assert_int_equal(qcal_numeric_summary_add(s, &it), QCAL_OK);
    qcal_numeric_summary_group g;
    assert_int_equal(qcal_numeric_summary_get_group(s, 0, &g), QCAL_OK);
    assert_int_equal(g.count, 1);
    assert_int_equal(g.n_empty, 1);
    assert_true(isnan(g.max_of_max) && isnan(g.mean_of_std) && isnan(g.median_absmax));
    assert_int_equal(g.n_outliers, 0);
    /* three members with statistics and one without: median over the three (1, 2, 9):
     * 2, outlier 9 > 4 x 2; the empty member's std 0 does not pull mean_of_std down */
    add(s, "layers.1.w", 1.0f, 40);
    add(s, "layers.2.w", 2.0f, 40);
    add(s, "layers.3.w", 9.0f, 40);
    assert_int_equal(qcal_numeric_summary_get_group(s, 0, &g), QCAL_OK);
    assert_int_equal(g.count, 4);
    assert_int_equal(g.n_empty, 1);
    assert_true(g.max_of_max == 9.0f);
    assert_true(g.median_absmax == 2.0);
    assert_true(fabs(g.mean_of_std - (0.5 + 1.0 + 4.5) / 3) < 1e-12);
    assert_int_equal(g.n_outliers, 1);
    const char *nm;
    assert_int_equal(qcal_numeric_summary_outlier(s, 0, 0, &nm), QCAL_OK);
    assert_string_equal(nm, "layers.3.w");
    /* typical shape: (8, 4) appears 3 times, (0) once */
    assert_int_equal(g.ndim, 2);
    qcal_numeric_summary_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grouping),
        cmocka_unit_test(test_empty_members),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
