/* Outputs: "-", checks before the work, staged writes (tools/cli_output.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli_common.h"
#include "cli_output.h"

bool cli_output_is_stdout(const char *path)
{
    static const char *const names[] = { "-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1" };
    for (size_t i = 0; path && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(path, names[i]))
            return true;
    return false;
}

const char *cli_output_path(const char *path)
{
    return cli_output_is_stdout(path) ? "/dev/stdout" : path;
}

int cli_output_check(const char *cmd, const char *path)
{
    if (!path)
        return 0;
    if (cli_output_is_stdout(path))
        fflush(stdout);
    qcal_status st = qcal_atomic_file_check(cli_output_path(path));
    return st == QCAL_OK ? 0 : cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
}

int cli_model_output_check(const char *cmd, const char *path)
{
    if (cli_output_is_stdout(path))
        return cli_fail(cmd, QCAL_EXIT_USAGE,
                        "-o %s: a model is written to a file, not to standard output (give a path)", path);
    return cli_output_check(cmd, path);
}

int cli_stage(const char *cmd, cli_staged *s, const char *path, const void *buf, size_t len)
{
    if (s->n == CLI_STAGED_MAX) {
        cli_stage_abort(s);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "too many outputs");
    }
    if (cli_output_is_stdout(path))
        fflush(stdout);
    qcal_atomic_file *f = &s->f[s->n];
    qcal_status st = qcal_atomic_file_open(f, cli_output_path(path));
    if (st == QCAL_OK) {
        s->n++;
        if (len && fwrite(buf, 1, len, f->fp) != len) {
            int rc = cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write '%s': %s", path,
                              strerror(errno));
            cli_stage_abort(s);
            return rc;
        }
        st = qcal_atomic_file_flush(f);
    }
    if (st != QCAL_OK) {
        int rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        cli_stage_abort(s);
        return rc;
    }
    return 0;
}

int cli_stage_commit(const char *cmd, cli_staged *s)
{
    int rc = 0;
    for (int i = 0; i < s->n; i++) {
        qcal_status st = qcal_atomic_file_commit(&s->f[i]);
        if (st != QCAL_OK && !rc)
            rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
    }
    s->n = 0;
    return rc;
}

void cli_stage_abort(cli_staged *s)
{
    for (int i = 0; i < s->n; i++)
        qcal_atomic_file_abort(&s->f[i]);
    s->n = 0;
}
