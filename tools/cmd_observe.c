/* qcal observe: feeds .npy files (one batch each, in order) to an observer and prints its
 * range and qparams as one JSON object. */
#include <stdlib.h>
#include <string.h>

#include "tools/cli_common.h"

static const char help[] =
    "usage: qcal observe [--observer KIND] [OBSERVER OPTIONS] FILE.npy [FILE.npy ...]\n"
    "\n"
    "Feeds each file (float32, float64 or float16 .npy) to one observer as one batch, in\n"
    "the order given, and prints one JSON object on stdout:\n"
    "  observer, dtype, qscheme, quant_min, quant_max, axis (per-channel kinds only),\n"
    "  min, max      the range the qparams come from (clipped range for histogram kinds),\n"
    "  scale         float32 printed with %.9g (round-trips exactly),\n"
    "  zero_point    integers (floats for per_channel_affine_float_qparams),\n"
    "  nonfinite     NaN/Inf values skipped, batches: files observed.\n"
    "min, max, scale and zero_point are arrays: one element per channel, one per tensor.\n"
    "\n"
    "observer options:\n"
    CLI_OBSERVER_HELP
    "  -h, --help               this help\n"
    "\n"
    "If no file held a finite value, the JSON is still printed (min and max null, scale 1,\n"
    "zero_point 0, as PyTorch's default qparams) and qcal exits with 1 and one line on\n"
    "stderr, so scripts cannot mistake default qparams for calibrated ones.\n"
    "An empty array (0 elements) is an input error (exit 3). A per-channel axis outside\n"
    "the file's dimensions is a usage error (exit 2).\n";

enum { OPT_HELP = 1 };

static const cli_opt opts[] = {
    { "help", 'h', false, OPT_HELP },
    CLI_OBSERVER_OPTS,
    { 0 },
};

static bool per_channel_kind(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

/* Feeds one file; returns 0 or an exit code (already reported). */
static int feed(const char *cmd, qcal_observer *obs, const char *path)
{
    qcal_npy_array a;
    int rc = cli_read_f32(cmd, path, &a);
    if (rc)
        return rc;
    const qcal_observer_config *cfg = qcal_observer_get_config(obs);
    if (a.numel == 0) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': empty array (0 elements), nothing to observe",
                      path);
        goto done;
    }
    if (per_channel_kind(cfg->kind) &&
        (cfg->axis >= a.ndim || cfg->axis < -a.ndim)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--axis %d is out of range for '%s' with %d "
                      "dimensions", (int)cfg->axis, path, (int)a.ndim);
        goto done;
    }
    qcal_tensor t;
    qcal_status st = qcal_npy_as_tensor(&a, &t);
    if (st == QCAL_OK)
        st = qcal_observer_update(obs, &t);
    if (st < 0) {
        const char *msg = qcal_last_error();
        rc = cli_fail(cmd, st == QCAL_ERR_MISMATCH || st == QCAL_ERR_INVALID_ARG
                               ? QCAL_EXIT_INPUT : QCAL_EXIT_FAILURE,
                      "'%s': %s", path, *msg ? msg : qcal_status_str(st));
    }
done:
    qcal_npy_array_free(&a);
    return rc;
}

int cmd_observe(int argc, char **argv)
{
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    const char *cmd = p.cmd;
    cli_observer_args oa = { 0 };
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    if (!files)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    int nfiles = 0, rc = 0, id;
    const char *val;
    qcal_observer *obs = NULL;
    float *mn = NULL, *mx = NULL, *scale = NULL, *zpf = NULL;
    int32_t *zp = NULL;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        if (id == CLI_ERROR) {
            rc = QCAL_EXIT_USAGE;
            goto out;
        }
        if (id == OPT_HELP) {
            fputs(help, stdout);
            goto out;
        }
        if (id == CLI_POSITIONAL)
            files[nfiles++] = val;
        else
            cli_observer_opt(&oa, id, val);
    }
    qcal_observer_config cfg;
    if ((rc = cli_observer_config(cmd, &oa, QCAL_OBSERVER_MINMAX, &cfg)))
        goto out;
    if (nfiles == 0) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no input file (see 'qcal observe --help')");
        goto out;
    }
    qcal_status st = qcal_observer_create(&cfg, &obs);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, st == QCAL_ERR_INVALID_ARG ? QCAL_EXIT_USAGE
                                                             : QCAL_EXIT_FAILURE, st);
        goto out;
    }
    for (int i = 0; i < nfiles; i++)
        if ((rc = feed(cmd, obs, files[i])))
            goto out;

    int64_t ch = 1, n = 0, nq = 0;
    if ((st = qcal_observer_channels(obs, &ch)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto out;
    }
    if (ch < 1)
        ch = 1;
    mn = malloc((size_t)ch * sizeof *mn);
    mx = malloc((size_t)ch * sizeof *mx);
    scale = malloc((size_t)ch * sizeof *scale);
    zpf = malloc((size_t)ch * sizeof *zpf);
    zp = malloc((size_t)ch * sizeof *zp);
    if (!mn || !mx || !scale || !zpf || !zp) {
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory for %lld channels", (long long)ch);
        goto out;
    }
    qcal_status rst = qcal_observer_qrange(obs, ch, mn, mx, &n);
    if (rst < 0) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, rst);
        goto out;
    }
    bool float_zp = cfg.q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    qcal_status qst = qcal_observer_qparams(obs, ch, scale, float_zp ? NULL : zp,
                                            float_zp ? zpf : NULL, &nq);
    if (qst < 0) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, qst);
        goto out;
    }
    if (rst == QCAL_NO_DATA || n < 1)
        n = 1; /* no data: one (+inf, -inf) pair, printed as null */
    int64_t qmin = 0, qmax = 0;
    qcal_qconfig_range(&cfg.q, &qmin, &qmax);
    uint64_t nonfinite = 0, batches = 0;
    qcal_observer_nonfinite(obs, &nonfinite);
    qcal_observer_batches(obs, &batches);

    FILE *f = stdout;
    fputs("{\"observer\": ", f);
    cli_json_str(f, qcal_observer_kind_name(cfg.kind));
    fputs(", \"dtype\": ", f);
    cli_json_str(f, qcal_dtype_name(cfg.q.dtype));
    fputs(", \"qscheme\": ", f);
    cli_json_str(f, qcal_qscheme_name(cfg.q.qscheme));
    fprintf(f, ", \"quant_min\": %lld, \"quant_max\": %lld", (long long)qmin, (long long)qmax);
    if (per_channel_kind(cfg.kind))
        fprintf(f, ", \"axis\": %d", (int)cfg.axis);
    fputs(", \"min\": ", f);
    cli_json_f32_array(f, mn, n);
    fputs(", \"max\": ", f);
    cli_json_f32_array(f, mx, n);
    fputs(", \"scale\": ", f);
    cli_json_f32_array(f, scale, nq);
    fputs(", \"zero_point\": ", f);
    if (float_zp)
        cli_json_f32_array(f, zpf, nq);
    else
        cli_json_i32_array(f, zp, nq);
    fprintf(f, ", \"nonfinite\": %llu, \"batches\": %llu}\n", (unsigned long long)nonfinite,
            (unsigned long long)batches);
    if (fflush(f) != 0 || ferror(f)) {
        rc = cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write to stdout");
        goto out;
    }
    if (qst == QCAL_NO_DATA)
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "no finite value in %d file(s) (%llu non-finite "
                      "skipped): printed the default qparams scale 1, zero_point 0", nfiles,
                      (unsigned long long)nonfinite);
out:
    free(mn);
    free(mx);
    free(scale);
    free(zpf);
    free(zp);
    qcal_observer_destroy(&obs);
    free(files);
    return rc;
}
