/* Tests of numeric/summary.c (grouping, outlier rule, keep-float list) and numeric/logger.c
 * (line format, CSV round trip, callback, counter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qcal/numeric.h"

static void add(qcal_summary *s, const char *name, float absmax, double sqnr)
{
    qcal_summary_item it;
    memset(&it, 0, sizeof it);
    it.name = name;
    it.ndim = 2;
    it.shape[0] = 8;
    it.shape[1] = 4;
    it.max = absmax;
    it.absmax = absmax;
    it.std = absmax / 2;
    it.sqnr_db = sqnr;
    assert_int_equal(qcal_summary_add(s, &it), QCAL_OK);
}

static void test_grouping(void **state)
{
    (void)state;
    char buf[64];
    assert_int_equal(qcal_summary_default_pattern("blocks.10.attn.q", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "blocks.*.attn.q");
    assert_int_equal(qcal_summary_default_pattern("fc1.weight", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "fc1.weight");
    assert_int_equal(qcal_summary_default_pattern("0.a1.12", buf, sizeof buf), QCAL_OK);
    assert_string_equal(buf, "*.a1.*");
    assert_int_equal(qcal_summary_default_pattern("blocks.0.attn.q", buf, 5), QCAL_ERR_INVALID_ARG);

    qcal_summary_options o;
    qcal_summary_options_default(&o);
    assert_true(o.outlier_factor == 4.0 && isnan(o.min_sqnr));
    o.min_sqnr = 30;
    qcal_summary *s = NULL;
    assert_int_equal(qcal_summary_create(&o, &s), QCAL_OK);
    add(s, "blocks.0.attn.q", 1.0f, 40);
    add(s, "blocks.1.attn.q", 1.2f, 38);
    add(s, "blocks.2.attn.q", 0.9f, 41);
    add(s, "blocks.3.attn.q", 4.9f, 25);   /* 4.9 > 4 x median(1.05..) -> outlier */
    add(s, "head", 2.0f, NAN);
    int64_t ng;
    assert_int_equal(qcal_summary_group_count(s, &ng), QCAL_OK);
    assert_int_equal(ng, 2);
    qcal_summary_group g;
    assert_int_equal(qcal_summary_get_group(s, 0, &g), QCAL_OK);
    assert_string_equal(g.pattern, "blocks.*.attn.q");
    assert_int_equal(g.count, 4);
    assert_true(g.max_of_max == 4.9f);
    assert_true(fabs(g.mean_of_std - (1.0 + 1.2 + 0.9 + 4.9) / 8) < 1e-6);
    assert_true(g.worst_sqnr_db == 25);
    assert_string_equal(g.worst_member, "blocks.3.attn.q");
    assert_true(fabs(g.median_absmax - 0.5 * (1.0f + 1.2f)) < 1e-6);
    assert_int_equal(g.n_outliers, 1);
    const char *nm;
    assert_int_equal(qcal_summary_outlier(s, 0, 0, &nm), QCAL_OK);
    assert_string_equal(nm, "blocks.3.attn.q");
    assert_int_equal(qcal_summary_outlier(s, 0, 1, &nm), QCAL_ERR_INVALID_ARG);
    assert_int_equal(g.ndim, 2);
    assert_int_equal(g.shape[0], 8);
    assert_int_equal(qcal_summary_get_group(s, 1, &g), QCAL_OK);
    assert_true(isnan(g.worst_sqnr_db));
    assert_int_equal(g.n_outliers, 0);   /* groups under 3 members have no outliers */
    const char *keep[4];
    int64_t nk;
    assert_int_equal(qcal_summary_keep_float(s, 4, keep, &nk), QCAL_OK);
    assert_int_equal(nk, 1);
    assert_string_equal(keep[0], "blocks.3.attn.q");
    qcal_summary_destroy(&s);
    assert_null(s);

    /* user globs win over the default collapse */
    const char *globs[] = {"*.attn.*"};
    qcal_summary_options_default(&o);
    o.globs = globs;
    o.n_globs = 1;
    assert_int_equal(qcal_summary_create(&o, &s), QCAL_OK);
    add(s, "blocks.0.attn.q", 1, NAN);
    add(s, "blocks.0.attn.k", 1, NAN);
    add(s, "blocks.0.mlp", 1, NAN);
    assert_int_equal(qcal_summary_group_count(s, &ng), QCAL_OK);
    assert_int_equal(ng, 2);
    assert_int_equal(qcal_summary_get_group(s, 0, &g), QCAL_OK);
    assert_string_equal(g.pattern, "*.attn.*");
    assert_int_equal(g.count, 2);
    qcal_summary_destroy(&s);
    o.outlier_factor = 0.5;
    assert_int_equal(qcal_summary_create(&o, &s), QCAL_ERR_INVALID_ARG);
}

static int cb_calls;
static qcal_status cb(const qcal_log_record *rec, const qcal_tensor *x, void *user)
{
    (void)user;
    assert_non_null(x);
    assert_int_equal(rec->c, cb_calls);
    cb_calls++;
    return QCAL_OK;
}

static void test_logger(void **state)
{
    (void)state;
    char csv[] = "/tmp/qcal_test_log_XXXXXX";
    int fd = mkstemp(csv);
    assert_true(fd >= 0);
    close(fd);
    char *line = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&line, &len);
    qcal_logger_options o;
    qcal_logger_options_default(&o);
    o.stream = mem;
    o.csv_path = csv;
    o.callback = cb;
    qcal_logger *lg = NULL;
    assert_int_equal(qcal_logger_create(&o, &lg), QCAL_OK);
    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t sh[2] = {2, 3};
    qcal_tensor t;
    qcal_tensor_init(&t, a, 2, sh);
    assert_int_equal(qcal_logger_log(lg, QCAL_LOG_PARAM, "fc1.weight", NULL, NULL, &t), QCAL_OK);
    assert_int_equal(qcal_logger_log_linear(lg, "fc1", NULL, 2, 3, 128, &t), QCAL_OK);
    float b[2] = {NAN, 1.5f};
    int64_t sb = 2;
    qcal_tensor_init(&t, b, 1, &sb);
    assert_int_equal(qcal_logger_log(lg, QCAL_LOG_ACT, "a,\"b\"", "relu", NULL, &t), QCAL_OK);
    int64_t c;
    qcal_logger_count(lg, &c);
    assert_int_equal(c, 3);
    assert_int_equal(cb_calls, 3);
    assert_int_equal(qcal_logger_finish(lg), QCAL_OK);
    assert_int_equal(qcal_logger_log(lg, QCAL_LOG_ACT, "x", NULL, NULL, &t), QCAL_ERR_STATE);
    qcal_logger_destroy(&lg);
    fclose(mem);
    const char *want =
        "t=param, c=0, fqn='fc1.weight', op='', extra='2x3', min=1, max=6, absmax=6, avg=3.5, std=1.87083\n"
        "t=act, c=1, fqn='fc1', op='linear', extra='MKN=2|3|128', min=1, max=6, absmax=6, avg=3.5, std=1.87083\n"
        "t=act, c=2, fqn='a,\"b\"', op='relu', extra='2', min=1.5, max=1.5, absmax=1.5, avg=1.5, std=0, nonfinite=1\n";
    if (strcmp(line, want)) {
        print_error("logger output:\n%s\nwant:\n%s\n", line, want);
        fail();
    }
    free(line);
    /* CSV round trip */
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char row[1024];
    assert_non_null(fgets(row, sizeof row, f));
    assert_string_equal(row, "t,c,fqn,op,extra,shape,count,nonfinite,min,max,absmax,mean,std\n");
    assert_non_null(fgets(row, sizeof row, f));
    char t0[16], fqn[64], shape[32];
    long long cc, cnt;
    unsigned long long nf;
    float mn, mx, am;
    double mean, sd;
    assert_int_equal(sscanf(row, "%15[^,],%lld,%63[^,],,2x3,%31[^,],%lld,%llu,%g,%g,%g,%lf,%lf", t0, &cc,
                            fqn, shape, &cnt, &nf, &mn, &mx, &am, &mean, &sd), 11);
    assert_string_equal(t0, "param");
    assert_string_equal(fqn, "fc1.weight");
    assert_int_equal(cnt, 6);
    assert_true(mn == 1 && mx == 6 && am == 6 && mean == 3.5);
    assert_true(sd == sqrt(17.5 / 5));
    assert_non_null(fgets(row, sizeof row, f));
    assert_non_null(strstr(row, "MKN=2|3|128"));
    assert_non_null(fgets(row, sizeof row, f));
    assert_non_null(strstr(row, "act,2,\"a,\"\"b\"\"\",relu,2,2,1,1,1.5,1.5,1.5,1.5,0"));
    fclose(f);
    unlink(csv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grouping),
        cmocka_unit_test(test_logger),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
