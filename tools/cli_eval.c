/* The two passes of an observer evaluation over a dump directory (qcal evaluate, qcal
 * report). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_eval.h"

int cli_eval_parse_kinds(const char *cmd, const char *list, uint32_t *mask)
{
    *mask = 0;
    char *copy = strdup(list);
    if (!copy)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        qcal_observer_kind k;
        if (qcal_observer_kind_parse(tok, &k) != QCAL_OK)
            rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--observers: %s", qcal_last_error());
        else
            *mask |= 1u << k;
    }
    free(copy);
    if (!rc && !*mask)
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--observers: empty list");
    return rc;
}

/* One pass: every file of the dump read once and handed to observe or score. */
static int run_pass(const char *cmd, qcal_numeric_eval *ev, const qcal_calib_dump *dump,
                    int pass)
{
    int64_t n = 0, total = 0, done = 0;
    qcal_calib_dump_count(dump, &n);
    qcal_calib_dump_file_count(dump, &total);
    bool bar = isatty(2);
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        for (int64_t j = 0; j < t.nfiles && !rc; j++) {
            if (bar)
                fprintf(stderr, "\r%s %lld/%lld files (pass %d of 2)\033[K",
                        pass ? "scoring" : "observing", (long long)++done, (long long)total,
                        pass + 1);
            qcal_npy_array a;
            qcal_status st = qcal_npy_read_f32(t.files[j], &a);
            if (st != QCAL_OK) {
                rc = cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE
                                                                   : QCAL_EXIT_INPUT, st);
                break;
            }
            qcal_tensor x;
            if (a.numel == 0) {
                rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': empty array (0 elements), nothing "
                              "to observe", t.files[j]);
            } else if ((st = qcal_npy_as_tensor(&a, &x)) == QCAL_OK) {
                st = pass ? qcal_numeric_eval_score(ev, t.name, t.role, &x)
                          : qcal_numeric_eval_observe(ev, t.name, t.role, &x);
            }
            if (!rc && st < 0) {
                char msg[1200];
                snprintf(msg, sizeof msg, "%s", qcal_last_error());
                rc = cli_fail(cmd, cli_observe_exit_code(st), "'%s': %s", t.files[j],
                              *msg ? msg : qcal_status_str(st));
            }
            qcal_npy_array_free(&a);
        }
    }
    if (bar)
        fputs("\r\033[K", stderr);
    return rc;
}

int cli_eval_dump(const char *cmd, const char *dir, const qcal_numeric_eval_options *opt,
                  qcal_numeric_eval **out)
{
    qcal_calib_dump *dump = NULL;
    qcal_numeric_eval *ev = NULL;
    qcal_status st = qcal_calib_dump_scan(dir, &dump);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, st == QCAL_ERR_NO_MEMORY ? QCAL_EXIT_FAILURE
                                                             : QCAL_EXIT_INPUT, st);
    int rc = 0;
    if ((st = qcal_numeric_eval_create(opt, &ev)) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
    if (!rc)
        rc = run_pass(cmd, ev, dump, 0);
    if (!rc && (st = qcal_numeric_eval_finish(ev)) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (!rc)
        rc = run_pass(cmd, ev, dump, 1);
    qcal_calib_dump_destroy(&dump);
    if (rc) {
        qcal_numeric_eval_destroy(&ev);
        return rc;
    }
    *out = ev;
    return 0;
}
