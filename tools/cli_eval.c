/* Options, input and state of an observer evaluation (qcal evaluate, qcal report). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_eval.h"

/* The options of evaluate and report that are more than a stored string (cli_handler). */
static int eval_opt(void *args, const char *cmd, int id, const char *val)
{
    cli_eval_args *a = args;
    int rc;
    switch (id) {
    case CLI_EVAL_DTYPE:
        if (qcal_dtype_parse(val, &a->dtype) != QCAL_OK || !qcal_dtype_is_float8(a->dtype))
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype: '%s' is not float8_e4m3fn or "
                            "float8_e5m2 (the integer candidates are the default)", val);
        a->dtype_set = true;
        return 0;
    case CLI_EVAL_OBSERVERS:
        return cli_eval_parse_kinds(cmd, val, &a->kinds);
    case CLI_EVAL_MIN_SQNR:
        if ((rc = cli_parse_f64(cmd, "--min-sqnr", val, &a->min_sqnr_db)))
            return rc;
        a->min_sqnr_set = true;
        return 0;
    case CLI_EVAL_FORMAT:
        if (!strcmp(val, "table"))
            a->format = QCAL_NUMERIC_EVAL_TABLE;
        else if (!strcmp(val, "csv"))
            a->format = QCAL_NUMERIC_EVAL_CSV;
        else if (!strcmp(val, "json"))
            a->format = QCAL_NUMERIC_EVAL_JSON;
        else
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--format: unknown format '%s' (expected "
                            "table, csv or json)", val);
        return 0;
    default:   /* CLI_POSITIONAL */
        if (a->input)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "one dump directory or evaluation state "
                            "expected, got '%s' and '%s'", a->input, val);
        a->input = val;
        return 0;
    }
}

int cli_eval_parse(const char *cmd, int argc, char **argv, const cli_spec *spec, cli_eval_args *a)
{
    memset(a, 0, sizeof *a);
    cli_progress_init(&a->progress, cmd, false, false);
    a->format = QCAL_NUMERIC_EVAL_TABLE;
    a->min_sqnr_db = NAN;
    int rc = cli_parse(spec, argc, argv, a, eval_opt);
    if (rc)
        return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
    if (!a->input)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no dump directory or evaluation state (see 'qcal "
                        "%s --help')", cmd);
    return -1;
}

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
                    int pass, cli_progress *prog)
{
    int64_t n = 0, total = 0, done = 0;
    qcal_calib_dump_count(dump, &n);
    qcal_calib_dump_file_count(dump, &total);
    cli_progress_phase(prog, pass ? "scoring" : "reading", "files", total);
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        for (int64_t j = 0; j < t.nfiles && !rc; j++) {
            cli_progress_set(prog, done++, t.name);
            qcal_npy_array a;
            qcal_status st = qcal_npy_read_f32(t.files[j], &a);
            if (st != QCAL_OK) {
                rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
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
                rc = cli_fail(cmd, cli_exit_code(st, CLI_AT_OBSERVE), "'%s': %s", t.files[j],
                              *msg ? msg : qcal_status_str(st));
            }
            qcal_npy_array_free(&a);
        }
    }
    if (!rc)
        cli_progress_set(prog, done, NULL);
    return rc;
}

static int eval_dump(const char *cmd, const char *dir, const qcal_numeric_eval_options *opt,
                     qcal_numeric_eval **out, cli_progress *prog)
{
    qcal_calib_dump *dump = NULL;
    qcal_numeric_eval *ev = NULL;
    qcal_status st = qcal_calib_dump_scan(dir, &dump);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    int rc = 0;
    if ((st = qcal_numeric_eval_create(opt, &ev)) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
    if (!rc)
        rc = run_pass(cmd, ev, dump, 0, prog);
    if (!rc) {
        int64_t nt = 0;
        qcal_numeric_eval_count(ev, &nt);
        cli_progress_phase(prog, "searching", "tensors", nt);
    }
    if (!rc && (st = qcal_numeric_eval_finish(ev)) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (!rc)
        rc = run_pass(cmd, ev, dump, 1, prog);
    if (!rc && (st = qcal_numeric_eval_set_source(ev, dir)) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    qcal_calib_dump_destroy(&dump);
    if (rc) {
        qcal_numeric_eval_destroy(&ev);
        return rc;
    }
    *out = ev;
    return 0;
}

/* An evaluation state file: the kind comes from the magic. */
static int eval_state(const char *cmd, const cli_eval_args *a, qcal_numeric_eval **out)
{
    const char *path = a->input;
    FILE *f = fopen(path, "rb");
    if (!f)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "cannot open '%s': %s", path, strerror(errno));
    char magic[4] = { 0 };
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && (!memcmp(magic, "QCSS", 4) || !memcmp(magic, "QCOB", 4)))
        return cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is a %s state: it holds calibrated observers, "
                        "not the data that SQNR and clipping are measured on; evaluate the dump "
                        "with 'qcal evaluate DIR --save-state STATE' and use that state",
                        path, magic[2] == 'S' ? "session" : "observer");
    if (got != 4 || memcmp(magic, "QCEV", 4))
        return cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is neither a dump directory nor an evaluation "
                        "state (no QCEV magic; docs/state.md)", path);
    qcal_numeric_eval *ev = NULL;
    qcal_status st = qcal_numeric_eval_load_file(path, &ev);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ),
                               st);
    if (a->dtype_set) {
        qcal_numeric_eval_destroy(&ev);
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--dtype applies to a dump directory; the "
                        "evaluation state '%s' keeps the dtype it was evaluated with", path);
    }
    if (a->kinds && (st = qcal_numeric_eval_restrict(ev, a->kinds)) != QCAL_OK) {
        qcal_numeric_eval_destroy(&ev);
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--observers: %s", qcal_last_error());
    }
    if (a->min_sqnr_set && (st = qcal_numeric_eval_set_min_sqnr(ev, a->min_sqnr_db)) != QCAL_OK) {
        qcal_numeric_eval_destroy(&ev);
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--min-sqnr: %s", qcal_last_error());
    }
    *out = ev;
    return 0;
}

int cli_eval_load(const char *cmd, cli_eval_args *a, qcal_numeric_eval **out)
{
    struct stat sb;
    qcal_numeric_eval *ev = NULL;
    int rc;
    cli_progress_init(&a->progress, cmd, !a->quiet, isatty(2));
    if (stat(a->input, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        qcal_numeric_eval_options opt;
        qcal_numeric_eval_options_default(&opt);
        opt.kinds = a->kinds;
        opt.min_sqnr_db = a->min_sqnr_db;
        if (a->dtype_set) {   /* FP8: every candidate scored with FP8 fake-quant */
            opt.activation_q.dtype = a->dtype;
            opt.weight_q.dtype = a->dtype;
        }
        opt.progress = cli_progress_cb;
        opt.progress_user = &a->progress;
        rc = eval_dump(cmd, a->input, &opt, &ev, &a->progress);
    } else {
        rc = eval_state(cmd, a, &ev);
    }
    if (rc) {
        cli_progress_end(&a->progress);
        return rc;
    }
    *out = ev;
    return 0;
}

int cli_eval_check_outputs(const char *cmd, const cli_eval_args *a)
{
    const char *outs[3] = { a->out, a->rules_out, a->save_state };
    int dashes = 0, rc;
    for (int i = 0; i < 3; i++) {
        dashes += cli_output_is_stdout(outs[i]);
        if ((rc = cli_output_check(cmd, outs[i])))
            return rc;
    }
    if (dashes > 1)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "only one output can be '-' (standard output)");
    if (dashes && !a->out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "the results go to standard output unless -o "
                        "OUT is given: with '%s -', give -o OUT too",
                        cli_output_is_stdout(a->rules_out) ? "--rules-out" : "--save-state");
    return 0;
}

int cli_eval_stage_state(const char *cmd, const cli_eval_args *a, const qcal_numeric_eval *ev,
                         cli_staged *s)
{
    if (!a->save_state)
        return 0;
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_numeric_eval_save(ev, &buf, &len);
    if (st != QCAL_OK) {
        cli_stage_abort(s);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "cannot save state '%s': %s", a->save_state,
                        qcal_last_error());
    }
    int rc = cli_stage(cmd, s, a->save_state, buf, len);
    qcal_free(buf);
    return rc;
}
