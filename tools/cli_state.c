/* State files and the observer report shared by observe, calibrate and merge. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli_common.h"
#include "cli_state.h"

int cli_state_read(const char *cmd, const char *path, void **buf, size_t *len,
                   cli_state_kind *kind)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "cannot open state '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    unsigned char *b = malloc(cap);
    int rc = 0;
    if (!b)
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory reading '%s'", path);
    while (!rc) {
        if (n == cap) {
            unsigned char *nb = cap < ((size_t)1 << 40) ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory reading '%s'", path);
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = cli_fail(cmd, QCAL_EXIT_INPUT, "cannot read state '%s'", path);
            break;
        }
    }
    fclose(f);
    if (!rc && n >= 4 && !memcmp(b, "QCOB", 4))
        *kind = CLI_STATE_OBSERVER;
    else if (!rc && n >= 4 && !memcmp(b, "QCSS", 4))
        *kind = CLI_STATE_SESSION;
    else if (!rc)
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s' is not a qcal state file (no QCOB or QCSS "
                      "magic; docs/state.md)", path);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = n;
    return 0;
}

int cli_observer_state_load(const char *cmd, const char *path, qcal_observer **out)
{
    qcal_status st = qcal_observer_load_file(path, out);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ),
                               st);
    return 0;
}

int cli_observer_state_stage(const char *cmd, const qcal_observer *obs, const char *path,
                             cli_staged *st)
{
    void *buf = NULL;
    size_t len = 0;
    if (qcal_observer_save(obs, &buf, &len) != QCAL_OK) {
        cli_stage_abort(st);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "cannot save state '%s': %s", path,
                        qcal_last_error());
    }
    int rc = cli_stage(cmd, st, path, buf, len);
    qcal_free(buf);
    return rc;
}

int cli_session_state_stage(const char *cmd, const qcal_calib_session *s, const char *path,
                            cli_staged *st)
{
    void *buf = NULL;
    size_t len = 0;
    if (qcal_calib_session_save(s, &buf, &len) != QCAL_OK) {
        cli_stage_abort(st);
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "cannot save state '%s': %s", path,
                        qcal_last_error());
    }
    int rc = cli_stage(cmd, st, path, buf, len);
    qcal_free(buf);
    return rc;
}

static bool per_channel_kind(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

int cli_observer_report(const char *cmd, qcal_observer *obs, FILE *f, bool *no_data)
{
    const qcal_observer_config *cfg = qcal_observer_get_config(obs);
    int rc = 0;
    int64_t ch = 1, n = 0;
    float *mn = NULL, *mx = NULL;
    qcal_qparams qp = {0};
    qcal_status st;
    char digest[65];
    if ((st = qcal_observer_channels(obs, &ch)) != QCAL_OK ||
        (st = qcal_observer_digest(obs, digest)) != QCAL_OK)
        return cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
    if (ch < 1)
        ch = 1;
    mn = malloc((size_t)ch * sizeof *mn);
    mx = malloc((size_t)ch * sizeof *mx);
    if (!mn || !mx) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory for %lld channels", (long long)ch);
        goto out;
    }
    qcal_status rst = qcal_observer_qrange(obs, ch, mn, mx, &n);
    if (rst < 0) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, rst);
        goto out;
    }
    bool float_zp = cfg->q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    qcal_status qst = qcal_observer_qparams(obs, &qp);
    if (qst < 0) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, qst);
        goto out;
    }
    if (rst == QCAL_NO_DATA || n < 1)
        n = 1; /* no data: one (+inf, -inf) pair, printed as null */
    int64_t qmin = 0, qmax = 0;
    qcal_qconfig_range(&cfg->q, &qmin, &qmax);
    uint64_t nonfinite = 0, batches = 0;
    qcal_observer_nonfinite(obs, &nonfinite);
    qcal_observer_batches(obs, &batches);

    fputs("{\"observer\": ", f);
    cli_json_str(f, qcal_observer_kind_name(cfg->kind));
    fputs(", \"dtype\": ", f);
    cli_json_str(f, qcal_dtype_name(cfg->q.dtype));
    fputs(", \"qscheme\": ", f);
    /* the qparams' qscheme: an FP8 dtype makes every scheme symmetric (docs/fp8.md) */
    cli_json_str(f, qcal_qscheme_name(qcal_dtype_is_float8(cfg->q.dtype) ? qp.qscheme
                                                                           : cfg->q.qscheme));
    fprintf(f, ", \"quant_min\": %lld, \"quant_max\": %lld", (long long)qmin, (long long)qmax);
    if (per_channel_kind(cfg->kind))
        fprintf(f, ", \"axis\": %d", (int)cfg->axis);
    fputs(", \"min\": ", f);
    cli_json_f32_array(f, mn, n);
    fputs(", \"max\": ", f);
    cli_json_f32_array(f, mx, n);
    fputs(", \"scale\": ", f);
    cli_json_f32_array(f, qp.scales ? qp.scales : &qp.scale, qp.channels);
    fputs(", \"zero_point\": ", f);
    if (float_zp)
        cli_json_f32_array(f, qp.zero_points_float, qp.channels);
    else
        cli_json_i32_array(f, qp.zero_points ? qp.zero_points : &qp.zero_point, qp.channels);
    fprintf(f, ", \"nonfinite\": %llu, \"batches\": %llu, \"digest\": \"%s\"}\n",
            (unsigned long long)nonfinite, (unsigned long long)batches, digest);
    if ((rc = cli_flush(cmd, f)))
        goto out;
    *no_data = qst == QCAL_NO_DATA;
out:
    free(mn);
    free(mx);
    qcal_qparams_free(&qp);
    return rc;
}
