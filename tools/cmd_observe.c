/* qcal observe: feeds .npy files (one batch each, in order) to an observer and prints its
 * range and qparams as one JSON object. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_common.h"
#include "cli_progress.h"
#include "cli_state.h"

typedef struct observe_args {
    const char **files;    /* the FILE.npy arguments, argc slots */
    int nfiles;
    const char *load, *save;
    bool quiet, have_obs_opts;
    cli_observer_args oa;
} observe_args;

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal observe [--observer KIND] [OBSERVER OPTIONS] [--load-state FILE]\n"
        "                    [--save-state FILE] [FILE.npy ...]\n"
        "\n"
        "Feeds each file (float32, float64 or float16 .npy) to one observer as one batch, in\n"
        "the order given, and prints one JSON object on stdout:\n"
        "  observer, dtype, qscheme, quant_min, quant_max, axis (per-channel kinds only),\n"
        "  min, max      the range the qparams come from (clipped range for histogram kinds),\n"
        "  scale         float32 printed with %.9g (round-trips exactly),\n"
        "  zero_point    integers (floats for per_channel_affine_float_qparams),\n"
        "  nonfinite     NaN/Inf values skipped, batches: files observed,\n"
        "  digest        SHA-256 of the canonical observer state (docs/state.md): equal for\n"
        "                runs that saw the same values, however batched, split or merged.\n"
        "min, max, scale and zero_point are arrays: one element per channel, one per tensor.\n"
        "\n"
        "state files (docs/state.md):\n"),
    CLI_STR("load-state", 0, observe_args, load, "FILE",
        "start from a saved observer state (its observer and options;\n"
        "observer options given too must agree with it); FILE.npy\n"
        "arguments are then optional"),
    CLI_STR("save-state", 0, observe_args, save, "FILE",
        "after the batches, save the observer state to FILE\n"
        "(atomically); 'qcal merge' combines such states"),
    CLI_TEXT(
        "\n"
        "options:\n"),
    CLI_BOOL("quiet", 'q', observe_args, quiet,
        "no progress report on stderr (a bar on a terminal, else a\n"
        "line at most every 10 s: reading, searching; docs/cli.md)"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "observer options (the keys of rules files; docs/cli.md):\n"),
    CLI_OBSERVER_GROUP(QCAL_OBSERVER_MINMAX),
    CLI_TEXT(
        "\n"
        "If no file held a finite value, the JSON is still printed (min and max null, scale 1,\n"
        "zero_point 0, as PyTorch's default qparams) and qcal exits with 1 and one line on\n"
        "stderr, so scripts cannot mistake default qparams for calibrated ones.\n"
        "An empty array (0 elements) is an input error (exit 3). A per-channel axis outside\n"
        "the file's dimensions is a usage error (exit 2). With --strict a NaN/Inf value fails\n"
        "the run with exit 1, as in 'qcal calibrate'.\n"),
    { 0 },
};
const cli_spec cmd_observe_spec = { opts, 27 };

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
        rc = cli_fail(cmd, cli_exit_code(st, CLI_AT_OBSERVE),
                      "'%s': %s", path, *msg ? msg : qcal_status_str(st));
    }
done:
    qcal_npy_array_free(&a);
    return rc;
}

/* The observer: from --load-state (checked against any observer options given) or new
 * from the options. Returns 0 or an exit code (reported). */
static int make_observer(const char *cmd, const cli_observer_args *oa, bool have_obs_opts,
                         const char *load, qcal_observer **obs)
{
    if (load) {
        int rc = cli_observer_state_load(cmd, load, obs);
        if (rc || !have_obs_opts)
            return rc;
        const qcal_observer_config *have = qcal_observer_get_config(*obs);
        qcal_observer_config want;
        if ((rc = cli_observer_config(cmd, oa, have->kind, &want)))
            return rc;
        char diff[160];
        if (qcal_observer_config_compare(&want, have, diff, sizeof diff) != QCAL_OK)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "the observer options differ from state '%s' "
                            "(%s: options vs state)", load, diff);
        return 0;
    }
    qcal_observer_config cfg;
    int rc = cli_observer_config(cmd, oa, QCAL_OBSERVER_MINMAX, &cfg);
    if (rc)
        return rc;
    qcal_status st = qcal_observer_create(&cfg, obs);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_PARAMS), st);
    return 0;
}

/* The files and the observer options (cli_handler). */
static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    observe_args *a = args;
    (void)cmd;
    if (id == CLI_POSITIONAL)
        a->files[a->nfiles++] = val;
    else
        a->have_obs_opts |= cli_observer_opt(&a->oa, id, val);
    return 0;
}

int cmd_observe(int argc, char **argv)
{
    const char *cmd = argv[0];
    observe_args a = { .files = calloc((size_t)argc + 1, sizeof *a.files) };
    const char **files = a.files;
    if (!files)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    cli_observer_args *oa = &a.oa;
    qcal_observer *obs = NULL;
    cli_staged staged = { 0 };
    cli_progress prog;
    cli_progress_init(&prog, cmd, false, false);
    int rc = cli_parse(&cmd_observe_spec, argc, argv, &a, take_opt);
    if (rc) {
        rc = rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
        goto out;
    }
    const char *load = a.load, *save = a.save;
    int nfiles = a.nfiles;
    if (nfiles == 0 && !load) {
        /* Options are still checked first, as before. */
        qcal_observer_config cfg;
        if ((rc = cli_observer_config(cmd, oa, QCAL_OBSERVER_MINMAX, &cfg)))
            goto out;
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no input file (see 'qcal observe --help')");
        goto out;
    }
    if ((rc = cli_output_check(cmd, save)))   /* before the work */
        goto out;
    if ((rc = make_observer(cmd, oa, a.have_obs_opts, load, &obs)))
        goto out;
    cli_progress_init(&prog, cmd, !a.quiet, isatty(2));
    cli_progress_phase(&prog, "reading", "files", nfiles);
    for (int i = 0; i < nfiles; i++) {
        cli_progress_set(&prog, i, files[i]);
        if ((rc = feed(cmd, obs, files[i])))
            goto out;
    }
    cli_progress_set(&prog, nfiles, NULL);
    /* The state staged, the report printed, then the state renamed; a failure (no finite
     * value included) leaves no state. With --save-state - the report goes to stderr. */
    if (save && (rc = cli_observer_state_stage(cmd, obs, save, &staged)))
        goto out;
    /* The report computes the qparams (the range search of the histogram kinds). */
    cli_progress_phase(&prog, "searching", "observers", 1);
    char *json = NULL;
    size_t json_len = 0;
    FILE *mem = open_memstream(&json, &json_len);
    bool no_data = false;
    rc = mem ? cli_observer_report(cmd, obs, mem, &no_data)
             : cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    if (mem)
        fclose(mem);
    cli_progress_set(&prog, 1, NULL);
    cli_progress_end(&prog);   /* the report follows */
    FILE *say = cli_output_is_stdout(save) ? stderr : stdout;
    if (!rc && (fwrite(json, 1, json_len, say) != json_len || fflush(say) != 0))
        rc = cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write the report: %s", strerror(errno));
    free(json);
    if (rc)
        goto out;
    if (no_data) {
        uint64_t nonfinite = 0;
        qcal_observer_nonfinite(obs, &nonfinite);
        rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "no finite value in %d file(s)%s (%llu non-finite "
                      "skipped): printed the default qparams scale 1, zero_point 0%s", nfiles,
                      load ? " and the loaded state" : "", (unsigned long long)nonfinite,
                      save ? "; no state saved" : "");
        goto out;
    }
    rc = cli_stage_commit(cmd, &staged);
out:
    cli_stage_abort(&staged);
    cli_progress_end(&prog);
    qcal_observer_destroy(&obs);
    free(files);
    return rc;
}
