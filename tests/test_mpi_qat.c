/* mpi.qat: the QAT example trained data-parallel (mpirun -np 2 qat_fmnist) against one
 * process, on a short schedule (40 QAT steps of batch 128, full-range activations so the
 * model converts to an int8 oneDNN net): every rank ends with the same model and qparams,
 * and the converted int8 accuracy is within 0.1 points of the one-process run's (also the
 * fake-quant accuracy). The full-length comparison is in docs/distributed.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "testutil.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/qcal_mpi_qat_XXXXXX");
    return mkdtemp(tmpdir) && getenv("QCAL_QAT_BIN") && getenv("QCAL_MPIRUN") ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rm_tree(tmpdir);
    return 0;
}

/* Runs the example (np 0: alone), returns its stdout (malloc'ed). */
static char *run(int np)
{
    char cmd[2048], pre[512] = "";
    if (np > 0)
        snprintf(pre, sizeof pre, "'%s' -np %d --oversubscribe ", getenv("QCAL_MPIRUN"), np);
    snprintf(cmd, sizeof cmd, "timeout 900 %s'%s' --qat-steps 40 --calib-batches 4 --act-range full "
             ">'%s/out' 2>'%s/err'", pre, getenv("QCAL_QAT_BIN"), tmpdir, tmpdir);
    int rc = system(cmd);
    char *out = tu_read_file(tu_path(tmpdir, "out"), NULL);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        char *err = tu_read_file(tu_path(tmpdir, "err"), NULL);
        fail_msg("np %d: exit %d\n%s\n%s", np, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out, err);
    }
    return out;
}

static double number_after(const char *text, const char *label)
{
    const char *p = strstr(text, label);
    if (!p)
        fail_msg("no '%s' in:\n%s", label, text);
    return strtod(p + strlen(label), NULL);
}

static void test_data_parallel(void **state)
{
    (void)state;
    char *one = run(0), *two = run(2);
    double i1 = number_after(one, "QAT int8 accuracy:"), i2 = number_after(two, "QAT int8 accuracy:");
    double q1 = number_after(one, "QAT accuracy:"), q2 = number_after(two, "QAT accuracy:");
    printf("QAT fake-quant %.2f%% / %.2f%%, int8 %.2f%% / %.2f%% (one process / 2 ranks)\n", q1, q2, i1,
           i2);
    assert_true(i1 > 85.0 && i1 <= 100.0);
    assert_true(i2 - i1 <= 0.1 + 1e-9 && i1 - i2 <= 0.1 + 1e-9);
    assert_true(q2 - q1 <= 0.1 + 1e-9 && q1 - q2 <= 0.1 + 1e-9);
    assert_non_null(strstr(two, "data-parallel QAT: 2 ranks, model and qparams identical on every rank"));
    free(one);
    free(two);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_parallel),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
