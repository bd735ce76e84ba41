/* qcal calibrate: calibrates every tensor of a dump directory (and the weights of
 * safetensors files) through a calibration session and writes the table in one or more
 * formats. Steps, one function each: options -> rules -> dump scan (qcal_calib_dump_scan:
 * a list of (name, role, files)) -> feeding -> table -> output (tools/cli_table_out.c). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <qcal/calib.h>
#include <qcal/calib_dump.h>
#include <qcal/fp8_checkpoint.h>
#include <qcal/onnx.h>

#include "cli_common.h"
#include "cli_dist.h"
#include "cli_model.h"
#include "cli_output.h"
#include "cli_progress.h"
#include "cli_state.h"
#include "cli_table_out.h"

typedef struct calib_args {
    const char *dir;
    const char *rules_path;
    const char *save_state;    /* --save-state FILE, or NULL */
    const char **weights;      /* --weights files, in order */
    int nweights;
    cli_observer_args oa;
    bool have_obs_opts;
    bool allow_empty;          /* --allow-empty */
    bool quiet;                /* -q, --quiet */
    uint64_t max_memory;       /* --max-memory, 0: no limit */
    cli_table_out out;
    bool ckpt;                 /* --format compressed-tensors | modelopt */
    qcal_fp8_checkpoint_options co;
    const char *weight_scale, *fused, *model_config;
    cli_model_args ma;         /* MODEL.onnx: --data, --input, --batch, --carry, --ort-lib */
    bool model;                /* the positional argument is a model file */
    const char *profile, *op_types;
    const char **exclude;
    int nexclude;
} calib_args;

enum { OPT_WEIGHTS = 1, OPT_MAX_MEMORY, OPT_EXCLUDE };

static const cli_opt opts[] = {
    CLI_TEXT(
        "usage: qcal calibrate DIR -o OUT [--format F[,F...]] [--rules RULES]\n"
        "       qcal calibrate MODEL.onnx --data SPEC -o OUT [--profile ort|tensorrt]\n"
        "                      [--input NAME=PATH]... [--batch N] [--carry OUT=IN]...\n"
        "                      [--op-types LIST] [--exclude PATTERN]... [--ort-lib PATH]\n"
        "                      [--weights MODEL.safetensors ...] [--save-state FILE]\n"
        "                      [OBSERVER OPTIONS]\n"
        "       qcal calibrate DIR --weights MODEL.safetensors --dtype float8_e4m3fn -o OUTDIR\n"
        "                      --format compressed-tensors|modelopt [--weight-scale tensor|channel]\n"
        "                      [--fused-input-scale own|max] [--model-config config.json]\n"
        "\n"
        "Calibrates every tensor dumped under DIR and writes a calibration table to OUT.\n"
        "DIR/manifest.json, if present, lists the tensors: {\"tensors\": [{\"name\": N, \"role\":\n"
        "\"activation\"|\"weight\", \"files\": [\"rel/path.npy\", ...]}]} (files fed in the listed\n"
        "order, paths relative to DIR and inside it). Otherwise DIR holds, for each tensor, a\n"
        "directory DIR/<name>/ of .npy files (one batch each, fed in byte order of their names)\n"
        "or a single file DIR/<name>.npy; names are percent-decoded (%2F is '/', %3A is ':',\n"
        "%25 is '%'), so '%2Flayer1%2Fconv%2FConv_output_0' is '/layer1/conv/Conv_output_0'.\n"
        "Tensors are visited in byte order of their names, so the result never depends on the\n"
        "file system. Without a manifest, names ending in '.weight' are weights (default\n"
        "observer: per_channel_minmax, qint8 per_channel_symmetric, axis 0) and every other\n"
        "name is an activation (default observer: histogram, quint8 per_tensor_affine).\n"
        "\n"
        "With MODEL.onnx and --data, qcal runs the model in ONNX Runtime (loaded at run time,\n"
        "docs/engine.md) on the data and streams every tensor that 'qcal onnx-expose' would\n"
        "expose for the profile into its observer, as each run returns (at most two runs'\n"
        "tensors in memory): the table the dump route gives for the same runs, byte for byte.\n"
        "Entries starting with '.' and files not ending in .npy are ignored (a .safetensors\n"
        "file in DIR gets a note: pass it with --weights). Rules globs match the decoded names.\n"
        "\n"
        "options:\n"),
    CLI_TABLE_OUT_OPTS,
    CLI_STR("rules", 0, calib_args, rules_path, "RULES",
        "rules file: 'GLOB ROLE OBSERVER [key=value ...]' per line,\n"
        "first match wins (docs/calibration.md)"),
    CLI_OPT_REPEATED("weights", 0, OPT_WEIGHTS, "FILE",
        "(repeatable) observe every weight tensor of a .safetensors\n"
        "file with the weight rules (default per output channel,\n"
        "axis 0); tensors with fewer than 2 dimensions (biases,\n"
        "norms) are skipped and counted, non-float dtypes noted"),
    CLI_OPT("max-memory", 0, OPT_MAX_MEMORY, "SIZE",
        "refuse (exit 2, before any work) observers whose estimated\n"
        "memory exceeds SIZE (bytes, or with K, M, G, T: binary\n"
        "units; default 2G; 0: no limit); docs/observers.md, Memory"),
    CLI_BOOL("quiet", 'q', calib_args, quiet, "no progress report on stderr"),
    CLI_TEXT(
        "  --format compressed-tensors | modelopt\n"
        "                           an FP8 serving checkpoint in the directory OUTDIR instead of a\n"
        "                           table (docs/fp8.md): each --weights file with every linear\n"
        "                           whose input DIR holds as '<module>.input' in float8_e4m3fn,\n"
        "                           <module>.weight_scale and <module>.input_scale (float32), KV\n"
        "                           scales <attn>.k_scale/v_scale from '<attn>.k_proj.output' and\n"
        "                           '<attn>.v_proj.output', other tensors copied; config.json\n"
        "                           (compressed-tensors) or hf_quant_config.json (modelopt). All\n"
        "                           files are written or none\n"),
    CLI_STR("weight-scale", 0, calib_args, weight_scale, "S",
        "checkpoints: tensor (default; one weight_scale per weight) or\n"
        "channel (shape (out, 1), from the per-channel weight observer;\n"
        "compressed-tensors only)"),
    CLI_STR("fused-input-scale", 0, calib_args, fused, "F",
        "checkpoints: own (default; q/k/v_proj and gate/up_proj keep\n"
        "their own input_scale, vLLM loads their max) or max (each\n"
        "gets the max of its group)"),
    CLI_STR("model-config", 0, calib_args, model_config, "FILE",
        "checkpoints: the model's config.json that compressed-tensors\n"
        "extends with quantization_config (modelopt copies it)\n"
        "(default: config.json beside the first --weights file, if any)"),
    CLI_STR("save-state", 0, calib_args, save_state, "FILE",
        "also save the calibration session (docs/state.md), atomically;\n"
        "'qcal merge' combines sessions calibrated on parts of a dump\n"
        "into the table of the whole dump"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "model options (MODEL.onnx):\n"),
    CLI_MODEL_OPTS,
    CLI_STR("profile", 0, calib_args, profile, "P",
        "ort (default) or tensorrt: the tensors that profile quantizes;\n"
        "recorded in the JSON table (with DIR too: the profile the\n"
        "dump was exposed for), checked by 'qcal qdq'"),
    CLI_STR("op-types", 0, calib_args, op_types, "LIST",
        "comma list of op types to quantize (default: the profile's)"),
    CLI_OPT_REPEATED("exclude", 0, OPT_EXCLUDE, "PATTERN",
        "(repeatable) glob on node and tensor names not calibrated"),
    CLI_TEXT(
        CLI_MODEL_AUTO_HELP
        "                           (default with a model: --observer histogram, as with DIR;\n"
        "                           'qcal qdq --data' defaults to auto)\n"),
    CLI_TEXT(
        "\n"
        "observer options (given: they replace the activation default, after any --rules; the\n"
        "keys of rules files, docs/cli.md):\n"),
    CLI_OBSERVER_GROUP(QCAL_OBSERVER_HISTOGRAM),
    CLI_TEXT(
        "\n"
        "Progress goes to stderr (not with --quiet): a bar on a terminal, through the phases\n"
        "reading (files), searching (each tensor's qparams) and writing; otherwise one line\n"
        "'qcal: calibrate: progress: PHASE DONE/TOTAL UNIT, S s elapsed' at most every 10 s and\n"
        "one closing line if any was printed (running (samples) for a model). On success one summary line goes to stdout. Errors are one line on stderr: a missing or empty DIR, a bad\n"
        "manifest or name escape or a malformed .npy (named) exit 3, an unwritable OUT exits 4\n"
        "(before any work is done); NaN/Inf under --strict exits 1, as in 'qcal observe'; a\n"
        "name a format cannot hold exits 1 listing every such name (or is left out with a\n"
        "warning under --skip-unrepresentable); a tensor that saw no finite value (every value\n"
        "NaN/Inf) exits 1 naming every such tensor, before any output is written, unless\n"
        "--allow-empty. With a model: data that does not match its inputs (named, with what the\n"
        "model takes and what the file has), a malformed data file or a model ONNX Runtime\n"
        "refuses exit 3; a failure during a run exits 1; no ONNX Runtime found exits 5.\n"
        "\n"
        "Under mpirun (mpirun -np N qcal calibrate DIR -o OUT ...) the ranks share the dump's\n"
        "files (order-independent observers by file; moving averages and first-batch histograms\n"
        "by whole tensor; --weights on rank 0), their sessions are merged in rank order and rank\n"
        "0 writes OUT (and --save-state): the same bytes as one process, with one summary line\n"
        "and one progress bar (rank 0's files, when mpirun's output is a terminal). A failure on\n"
        "any rank ends every rank with its exit code and one line naming the rank and the file\n"
        "(docs/distributed.md). As root, Open MPI needs mpirun --allow-run-as-root (or\n"
        "OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); more ranks than cores\n"
        "need --oversubscribe.\n"),
    /* described in the closing text */
    CLI_BOOL("allow-empty", 0, calib_args, allow_empty, NULL),
    { 0 },
};
const cli_spec cmd_calibrate_spec = { opts, 27 };

/* --format compressed-tensors / modelopt (alone): an FP8 checkpoint instead of a table.
 * Returns 1 when val is one of them (a->ckpt set), 0 for table formats, or an exit code
 * (reported, negated) when they are mixed. */
static int ckpt_format(const char *cmd, calib_args *a, const char *val)
{
    qcal_fp8_checkpoint_format f;
    bool any = strstr(val, "compressed-tensors") || strstr(val, "modelopt");
    if (!any)
        return 0;
    if (qcal_fp8_checkpoint_format_parse(val, &f) != QCAL_OK)
        return -cli_fail(cmd, QCAL_EXIT_USAGE, "--format %s: the checkpoint formats "
                         "(compressed-tensors, modelopt) are written alone", val);
    qcal_clear_error();
    a->ckpt = true;
    a->co.format = f;
    return 1;
}

/* Checks the checkpoint options before the work. */
static int ckpt_check(const char *cmd, calib_args *a)
{
    for (int i = 0; i < a->oa.n; i++)
        if (!strcmp(a->oa.key[i], "dtype") && strcmp(a->oa.value[i], "float8_e4m3fn"))
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--format %s: the checkpoint's weights are "
                            "float8_e4m3fn (got --dtype %s)",
                            qcal_fp8_checkpoint_format_name(a->co.format), a->oa.value[i]);
    if (a->weight_scale && strcmp(a->weight_scale, "tensor") && strcmp(a->weight_scale, "channel"))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-scale %s: expected tensor or channel",
                        a->weight_scale);
    if (a->fused && strcmp(a->fused, "own") && strcmp(a->fused, "max"))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--fused-input-scale %s: expected own or max",
                        a->fused);
    a->co.weight_per_channel = a->weight_scale && !strcmp(a->weight_scale, "channel");
    if (a->co.weight_per_channel && a->co.format == QCAL_FP8_CHECKPOINT_MODELOPT)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-scale channel: modelopt checkpoints "
                        "(quant_algo FP8) hold one weight scale per tensor; use --format "
                        "compressed-tensors for per-channel weight scales");
    a->co.fused_input_scale_max = a->fused && !strcmp(a->fused, "max");
    if (!a->out.out)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no output directory (-o OUTDIR)");
    if (cli_output_is_stdout(a->out.out))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--format %s writes a directory, not standard "
                        "output", qcal_fp8_checkpoint_format_name(a->co.format));
    if (a->nweights == 0)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--format %s needs the model: --weights "
                        "MODEL.safetensors", qcal_fp8_checkpoint_format_name(a->co.format));
    if (!a->dir)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--format %s needs the dump of the linears' "
                        "inputs (DIR)", qcal_fp8_checkpoint_format_name(a->co.format));
    if (a->out.nformats)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "the checkpoint formats (compressed-tensors, "
                        "modelopt) are written alone");
    if (a->model_config && access(a->model_config, R_OK) != 0)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "cannot read '%s': %s", a->model_config,
                        strerror(errno));
    struct stat sb;
    if (stat(a->out.out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return cli_fail(cmd, QCAL_EXIT_OUTPUT, "cannot write '%s': not a directory "
                        "(checkpoints are written into a directory)", a->out.out);
    return 0;
}

/* The model's config.json: --model-config, else config.json beside the first --weights. */
static const char *model_config(const calib_args *a, char *buf, size_t cap)
{
    if (a->model_config)
        return a->model_config;
    const char *w = a->weights[0], *slash = strrchr(w, '/');
    int n = slash ? snprintf(buf, cap, "%.*s/config.json", (int)(slash - w), w)
                  : snprintf(buf, cap, "config.json");
    return n > 0 && (size_t)n < cap && access(buf, R_OK) == 0 ? buf : NULL;
}

/* Writes the FP8 checkpoint; returns 0 or an exit code (reported). */
static int write_checkpoint(const char *cmd, calib_args *a, const qcal_calib_table *table,
                            qcal_fp8_checkpoint_summary *sum)
{
    char cfg[4096];
    a->co.config_json = model_config(a, cfg, sizeof cfg);
    qcal_status st = qcal_fp8_checkpoint_write(a->out.out, a->nweights, a->weights, table,
                                               &a->co, sum);
    if (st == QCAL_OK)
        return 0;
    return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_CHECKPOINT), st);
}

/* The dump or model, the lists, and the shared groups (cli_handler). */
static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    calib_args *a = args;
    int rc;
    switch (id) {
    case OPT_WEIGHTS: a->weights[a->nweights++] = val; return 0;
    case OPT_EXCLUDE: a->exclude[a->nexclude++] = val; return 0;
    case OPT_MAX_MEMORY: return cli_parse_size(cmd, "--max-memory", val, &a->max_memory);
    case CLI_POSITIONAL:
        if (a->dir)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "one dump directory expected, got '%s' "
                            "and '%s'", a->dir, val);
        a->dir = val;
        return 0;
    }
    if ((rc = cli_model_opt(cmd, &a->ma, id, val)) >= 0)
        return rc;
    if (id == CLI_OUT_FORMAT && (rc = ckpt_format(cmd, a, val)) != 0)
        return rc < 0 ? -rc : 0;
    if ((rc = cli_table_out_opt(cmd, &a->out, id, val)) >= 0)
        return rc;
    a->have_obs_opts |= cli_observer_opt(&a->oa, id, val);
    return 0;
}

/* Parses the command line; returns 0, an exit code (reported), or -1 after --help (printed
 * by the writer only). */
static int parse_args(int argc, char **argv, calib_args *a, bool writer)
{
    const char *cmd = argv[0];
    int rc = cli_parse_to(&cmd_calibrate_spec, argc, argv, a, take_opt, writer ? stdout : NULL);
    if (rc)
        return rc;
    if (!a->dir && a->nweights == 0)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "no dump directory (see 'qcal calibrate --help')");
    /* A model file (not a directory) is run on --data; a dump directory takes neither. */
    struct stat sb;
    a->model = a->dir && stat(a->dir, &sb) == 0 && !S_ISDIR(sb.st_mode);
    if (a->model && !cli_model_args_given(&a->ma))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "'%s' is a file: a model needs --data SPEC (or "
                        "--input NAME=PATH); a dump is a directory", a->dir);
    if (!a->model && (cli_model_args_given(&a->ma) || a->ma.ncarry || a->ma.batch ||
                      a->op_types || a->nexclude))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--data, --input, --batch, --carry, "
                        "--op-types and --exclude go with a model file (MODEL.onnx), not with "
                        "dump directory '%s'", a->dir ? a->dir : "");
    bool was_auto = false;
    for (int i = 0; i < a->oa.n; i++)
        was_auto |= !strcmp(a->oa.key[i], "observer") && !strcmp(a->oa.value[i], "auto");
    if (was_auto && !a->model)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--observer auto runs a model (MODEL.onnx "
                        "--data); for a dump: 'qcal evaluate DIR --rules-out R', then --rules R");
    if (a->model && (rc = cli_model_observer_auto(cmd, &a->ma, &a->oa, &a->have_obs_opts,
                                                  a->rules_path, false)))
        return rc;
    qcal_onnx_profile prof;
    if (a->profile && qcal_onnx_profile_parse(a->profile, &prof) != QCAL_OK)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--profile: '%s' is not ort or tensorrt",
                        a->profile);
    if (a->profile && a->ckpt)
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--profile is recorded in a table; the "
                        "checkpoint formats (compressed-tensors, modelopt) hold none");
    if (a->model && (a->nweights || a->ckpt))
        return cli_fail(cmd, QCAL_EXIT_USAGE, "--weights and checkpoint formats go with a dump "
                        "directory: a model's weights are its own");
    a->out.not_writer = !writer;   /* OUT may exist only where the writer runs */
    if (a->ckpt) {
        if ((rc = ckpt_check(cmd, a)))
            return rc;
        if (a->save_state && cli_output_is_stdout(a->save_state))
            return 0;
        return writer ? cli_output_check(cmd, a->save_state) : 0;
    }
    rc = cli_table_out_check(cmd, &a->out);
    if (!rc && cli_output_is_stdout(a->out.out) && cli_output_is_stdout(a->save_state))
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "only one output can be '-' (standard output)");
    if (!rc && writer)
        rc = cli_output_check(cmd, a->save_state);
    return rc;
}

/* The rules of the run: the rules file, then the observer options as a catch-all rule for
 * activations. */
static int make_rules(const char *cmd, const calib_args *a, qcal_calib_rules **rules)
{
    return cli_make_rules(cmd, a->rules_path, &a->oa, a->have_obs_opts, rules);
}

/* Observer options given with a rules file that matches every activation of the dump first
 * (first match wins) change nothing: one note says so. */
static void note_unused_observer_opts(const char *cmd, const calib_args *a,
                                      const qcal_calib_rules *rules, const qcal_calib_dump *dump)
{
    int64_t nrules = 0, n = 0, nact = 0;
    if (!a->have_obs_opts || !a->rules_path || !dump ||
        qcal_calib_rules_count(rules, &nrules) != QCAL_OK ||
        qcal_calib_dump_count(dump, &n) != QCAL_OK)
        return;
    for (int64_t i = 0; i < n; i++) {
        qcal_calib_dump_tensor t;
        qcal_observer_config cfg;
        int64_t rule = -1;
        if (qcal_calib_dump_tensor_at(dump, i, &t) != QCAL_OK ||
            t.role != QCAL_CALIB_ROLE_ACTIVATION)
            continue;
        nact++;
        if (qcal_calib_rules_match(rules, t.name, t.role, &cfg, &rule) != QCAL_OK ||
            rule == nrules - 1)
            return;   /* the observer options' catch-all rule (the last) is used */
    }
    if (nact)
        cli_note(cmd, "the observer options change nothing: a rule of '%s' matches %s %lld "
                 "%s first (first match wins)", a->rules_path, nact == 1 ? "the" : "each of the",
                 (long long)nact, CLI_PLURAL(nact, "activation", "activations"));
}

/* A .safetensors file inside the dump is not a dump: say so unless --weights reads it. */
static void note_safetensors(const char *cmd, const calib_args *a)
{
    DIR *d = opendir(a->dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (de->d_name[0] == '.' || n < 12 || strcmp(de->d_name + n - 12, ".safetensors"))
            continue;
        bool given = false;
        for (int i = 0; i < a->nweights && !given; i++) {
            const char *base = strrchr(a->weights[i], '/');
            given = !strcmp(base ? base + 1 : a->weights[i], de->d_name);
        }
        if (!given)
            cli_note(cmd, "'%s/%s' is not read as a dump; pass --weights %s/%s to calibrate "
                     "its weights", a->dir, de->d_name, a->dir, de->d_name);
    }
    closedir(d);
}

/* The dump as a list of (name, role, files). */
static int scan_dump(const char *cmd, const char *dir, qcal_calib_dump **dump)
{
    qcal_status st = qcal_calib_dump_scan(dir, dump);
    if (st != QCAL_OK)
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
    return 0;
}

/* "1.50 GiB" for messages. */
static void fmt_bytes(char *dst, size_t cap, uint64_t b)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(dst, cap, "%.2f GiB", (double)b / (double)((uint64_t)1 << 30));
    else
        snprintf(dst, cap, "%.1f MiB", (double)b / (double)((uint64_t)1 << 20));
}

/* The observers' estimated memory for the whole dump (qcal_observer_config_memory: every
 * tensor's state, held to the end, plus the largest peak on top of one), against
 * --max-memory: over it, one usage error naming the largest observer. Before any work. */
static int check_memory(const char *cmd, const calib_args *a, const qcal_calib_dump *dump,
                        const qcal_calib_rules *rules)
{
    int64_t n = 0;
    qcal_calib_dump_count(dump, &n);
    uint64_t state = 0, extra = 0, worst = 0;
    qcal_observer_config wcfg;
    const char *wname = NULL;
    for (int64_t i = 0; i < n; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        qcal_observer_config cfg;
        uint64_t st_b = 0, pk_b = 0;
        if (qcal_calib_rules_match(rules, t.name, t.role, &cfg, NULL) != QCAL_OK ||
            qcal_observer_config_memory(&cfg, 1, &st_b, &pk_b) != QCAL_OK)
            continue;   /* the session reports a bad config by name */
        state += st_b;
        if (pk_b - st_b > extra)
            extra = pk_b - st_b;
        if (pk_b > worst) {
            worst = pk_b;
            wcfg = cfg;
            wname = t.name;
        }
    }
    if (!a->max_memory || state + extra <= a->max_memory || !wname)
        return 0;
    char need[32], lim[32], one[32];
    fmt_bytes(need, sizeof need, state + extra);
    fmt_bytes(lim, sizeof lim, a->max_memory);
    fmt_bytes(one, sizeof one, worst);
    return cli_fail(cmd, QCAL_EXIT_USAGE, "the observers of %lld %s need about %s, over "
                    "--max-memory %s (the largest: '%s', %s with bins %d, %s at its search; "
                    "docs/observers.md, Memory); raise --max-memory or use fewer bins",
                    (long long)n, CLI_PLURAL(n, "tensor", "tensors"), need, lim, wname, qcal_observer_kind_name(wcfg.kind),
                    (int)wcfg.bins, one);
}

/* The message and exit code of a failed observe call on path. */
static int observe_failed(const char *cmd, const char *path, qcal_status st)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s", qcal_last_error());
    return cli_fail(cmd, cli_exit_code(st, CLI_AT_OBSERVE), "'%s': %s", path,
                    *msg ? msg : qcal_status_str(st));
}

static int read_failed(const char *cmd, qcal_status st)
{
    return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ),
                           st);
}

/* Feeds batch `step` of (name, role) from one .npy file, read whole. */
static int feed_file(const char *cmd, qcal_calib_session *s, const char *name,
                     qcal_calib_role role, int64_t step, const char *path)
{
    qcal_npy_array a;
    qcal_status st = qcal_npy_read_f32(path, &a);
    if (st != QCAL_OK)
        return read_failed(cmd, st);
    int rc = 0;
    if (a.numel == 0) {
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': empty array (0 elements), nothing to "
                      "observe", path);
    } else {
        qcal_tensor x;
        st = qcal_npy_as_tensor(&a, &x);
        if (st == QCAL_OK)
            st = qcal_calib_session_observe(s, name, role, step, &x);
        if (st < 0)
            rc = observe_failed(cmd, path, st);
    }
    qcal_npy_array_free(&a);
    return rc;
}

/* Streamed batches go through a buffer of this many floats (1 MiB), reused from file to
 * file: the file's bytes are observed while they are still in the core's L2 cache, and peak
 * memory does not grow with the file size (docs/performance.md, "Reading the dump"). */
#define STREAM_FLOATS ((int64_t)1 << 18)

/* As feed_file for an observer whose batches split (qcal_observer_config_splits): the file
 * is read and observed in parts of up to STREAM_FLOATS values (the same result, bit for
 * bit). Same messages and exit codes as feed_file. */
static int stream_file(const char *cmd, qcal_calib_session *s, const char *name,
                       qcal_calib_role role, int64_t step, const char *path, float *buf)
{
    qcal_npy_reader *r = NULL;
    qcal_status st = qcal_npy_reader_open(path, &r);
    if (st != QCAL_OK)
        return read_failed(cmd, st);
    qcal_npy_array info;
    qcal_npy_reader_info(r, &info);
    int64_t n = 0, done = 0;
    int rc = 0;
    /* The first read also refuses integer files (before an empty one is reported). */
    st = qcal_npy_reader_read_f32(r, buf, STREAM_FLOATS, &n);
    if (st == QCAL_OK && info.numel == 0)
        rc = cli_fail(cmd, QCAL_EXIT_INPUT, "'%s': empty array (0 elements), nothing to "
                      "observe", path);
    while (st == QCAL_OK && !rc && n > 0) {
        done += n;
        qcal_tensor x;
        st = qcal_tensor_init(&x, buf, 1, &n);
        if (st == QCAL_OK)
            st = qcal_calib_session_observe_part(s, name, role, step, &x, done == info.numel);
        if (st < 0) {
            rc = observe_failed(cmd, path, st);
            break;
        }
        if (done < info.numel)
            st = qcal_npy_reader_read_f32(r, buf, STREAM_FLOATS, &n);
        else
            n = 0;
    }
    if (st < 0 && !rc)
        rc = read_failed(cmd, st);
    qcal_npy_reader_close(&r);
    return rc;
}

/* Whether a tensor's batch files may go to different ranks: its observer's updates commute
 * and its merges are exact (qcal_observer_config_commutes: every kind but the moving
 * averages, the histogram family on the lattice grid); otherwise the tensor goes whole to
 * one rank, which feeds its files in order. */
static bool split_by_file(const qcal_observer_config *cfg)
{
    return qcal_observer_config_commutes(cfg);
}

/* Distributed runs: the rank that feeds each file, owner[k] for the k-th file of the dump
 * in order. Work units are single files of tensors whose observer commutes and whole
 * tensors otherwise (a moving average depends on the batch order), weighted by their bytes
 * and balanced by cli_dist_assign. *mine gets this rank's file count. Returns 0 or an exit
 * code (reported). */
static int assign(const char *cmd, const cli_dist *d, const qcal_calib_dump *dump,
                  const qcal_calib_rules *rules, int **owner_out, long *mine)
{
    int64_t n = 0, total = 0, nunits = 0;
    qcal_calib_dump_count(dump, &n);
    qcal_calib_dump_file_count(dump, &total);
    bool *split = calloc((size_t)n + 1, sizeof *split);
    uint64_t *w = calloc((size_t)total + 1, sizeof *w);
    int *unit_owner = calloc((size_t)total + 1, sizeof *unit_owner);
    int *owner = calloc((size_t)total + 1, sizeof *owner);
    int rc = split && w && unit_owner && owner ? 0
                                               : cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
    for (int64_t i = 0, u = 0; !rc && i < n; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        qcal_observer_config cfg;
        qcal_status st = qcal_calib_rules_match(rules, t.name, t.role, &cfg, NULL);
        if (st != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_USAGE, st);
            break;
        }
        split[i] = split_by_file(&cfg);
        for (int64_t j = 0; j < t.nfiles; j++) {
            struct stat sb;
            w[u] += stat(t.files[j], &sb) == 0 ? (uint64_t)sb.st_size : 0;
            if (split[i] || j == t.nfiles - 1)
                u++;
        }
        nunits = u;
    }
    if (!rc)
        cli_dist_assign(d, w, nunits, unit_owner);
    *mine = 0;
    for (int64_t i = 0, u = 0, k = 0; !rc && i < n; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        for (int64_t j = 0; j < t.nfiles; j++, k++) {
            owner[k] = unit_owner[u];
            *mine += owner[k] == d->rank;
            if (split[i] || j == t.nfiles - 1)
                u++;
        }
    }
    free(split);
    free(w);
    free(unit_owner);
    if (rc) {
        free(owner);
        return rc;
    }
    *owner_out = owner;
    return 0;
}

/* Feeds every file of the dump in order (owner non-NULL: only this rank's files, each
 * tensor's numbered 0, 1, ... in file order); *files counts them. On a failure the other
 * ranks are told (cli_dist_notify); when another rank failed, feeding stops early. */
static int feed_dump(const char *cmd, cli_dist *dist, qcal_calib_session *s,
                     const qcal_calib_rules *rules, const qcal_calib_dump *dump,
                     const int *owner, long mine, long *files, cli_progress *prog)
{
    int64_t n = 0;
    qcal_calib_dump_count(dump, &n);
    cli_progress_phase(prog, "reading", "files", mine);
    int rc = 0;
    float *buf = NULL;   /* the streaming buffer, allocated on first use */
    for (int64_t i = 0, k = 0; i < n && !rc; i++) {
        qcal_calib_dump_tensor t;
        qcal_calib_dump_tensor_at(dump, i, &t);
        /* Batches of observers that split are streamed (the session's rules, as the
         * session itself applies them). */
        qcal_observer_config cfg;
        bool stream = qcal_calib_rules_match(rules, t.name, t.role, &cfg, NULL) == QCAL_OK &&
                      qcal_observer_config_splits(&cfg);
        if (stream && !buf && !(buf = aligned_alloc(64, STREAM_FLOATS * sizeof *buf))) {
            rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
            break;
        }
        int64_t step = 0;
        for (int64_t j = 0; j < t.nfiles && !rc; j++, k++) {
            if (owner && owner[k] != dist->rank)
                continue;
            if (cli_dist_peer_failed(dist))
                goto out;
            cli_progress_set(prog, *files, t.name);
            rc = stream ? stream_file(cmd, s, t.name, t.role, step++, t.files[j], buf)
                        : feed_file(cmd, s, t.name, t.role, step++, t.files[j]);
            if (!rc)
                ++*files;
        }
    }
out:
    free(buf);
    if (!rc)
        cli_progress_set(prog, *files, NULL);
    if (rc)
        cli_dist_notify(dist);   /* the other ranks stop at their next file */
    return rc;
}

typedef struct weights_ctx {
    const char *cmd;
    const char *path;
    qcal_calib_session *s;
    long observed, skipped_1d;
} weights_ctx;

/* One safetensors tensor: observed as a weight (batch 0) when it has 2+ dimensions. */
static int feed_weight(void *ctx, qcal_safetensors *st, int64_t i,
                       const qcal_safetensors_tensor_info *info)
{
    weights_ctx *w = ctx;
    if (info->ndim < 2) {
        w->skipped_1d++;
        return 0;
    }
    if (info->numel == 0)
        return cli_fail(w->cmd, QCAL_EXIT_INPUT, "'%s': tensor '%s' is empty (0 elements), "
                        "nothing to observe", w->path, info->name);
    size_t bytes;
    float *buf = NULL;
    if ((uint64_t)info->numel <= SIZE_MAX / sizeof(float)) {
        bytes = (size_t)info->numel * sizeof(float);
        buf = malloc(bytes);
    }
    if (!buf)
        return cli_fail(w->cmd, QCAL_EXIT_FAILURE, "'%s': out of memory for tensor '%s'",
                        w->path, info->name);
    qcal_status s = qcal_safetensors_read_f32(st, i, 0, info->numel, buf);
    int rc = 0;
    if (s != QCAL_OK) {
        rc = cli_fail_status(w->cmd, QCAL_EXIT_INPUT, s);
    } else {
        qcal_tensor x;
        s = qcal_tensor_init(&x, buf, info->ndim, info->shape);
        if (s == QCAL_OK)
            s = qcal_calib_session_observe(w->s, info->name, QCAL_CALIB_ROLE_WEIGHT, 0, &x);
        if (s < 0) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%s", qcal_last_error());
            rc = cli_fail(w->cmd, cli_exit_code(s, CLI_AT_OBSERVE), "'%s': weight '%s': %s", w->path,
                          info->name, *msg ? msg : qcal_status_str(s));
        } else {
            w->observed++;
        }
    }
    qcal_safetensors_release(st, i);
    free(buf);
    return rc;
}

/* Tensors that saw no finite value: without --allow-empty one error naming every one
 * (exit 1, nothing written); with it one warning line each. Returns 0 or an exit code. */
static int check_no_data(const char *cmd, const qcal_calib_table *t, bool allow_empty)
{
    int64_t n = 0, bad = 0;
    qcal_calib_table_count(t, &n);
    size_t cap = 1, len = 0;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        qcal_calib_table_entry(t, i, &e);
        if (!e->no_data)
            continue;
        bad++;
        cap += strlen(e->fqn) + 16;
        if (allow_empty)
            cli_warn(cmd, "%s '%s' saw no finite value (%llu NaN/Inf skipped): written with "
                     "no_data: true, scale 1, zero-point 0 (left out of tensorrt, onnxruntime "
                     "and ncnn files)", qcal_calib_role_name(e->role), e->fqn,
                     (unsigned long long)e->nonfinite);
    }
    if (!bad || allow_empty)
        return 0;
    char *list = malloc(cap);
    if (!list)
        return cli_fail(cmd, QCAL_EXIT_FAILURE, "%lld %s no finite value (out of "
                        "memory listing them)", (long long)bad, CLI_PLURAL(bad, "tensor saw", "tensors saw"));
    list[0] = '\0';
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        qcal_calib_table_entry(t, i, &e);
        if (e->no_data)
            len += (size_t)snprintf(list + len, cap - len, "%s'%s'", len ? ", " : "", e->fqn);
    }
    int rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "%lld tensor%s saw no finite value (every value "
                      "NaN/Inf), nothing to calibrate: %s; nothing written (--allow-empty "
                      "writes them marked no_data)", (long long)bad, bad == 1 ? "" : "s", list);
    free(list);
    return rc;
}

static int calibrate(int argc, char **argv, cli_dist *dist);

int cmd_calibrate(int argc, char **argv)
{
    const char *cmd = argc > 0 ? argv[0] : "calibrate";
    cli_dist dist;
    int rc = cli_dist_begin(&dist, cmd);
    if (rc)
        return rc;
    /* The command proper; every rank of a distributed run reaches each cli_dist_agree. */
    rc = calibrate(argc, argv, &dist);
    cli_dist_end(&dist);
    return rc;
}

static int calibrate(int argc, char **argv, cli_dist *dist)
{
    const char *cmd = argc > 0 ? argv[0] : "calibrate";
    bool writer = cli_dist_writer(dist);
    int *owner = NULL;
    long mine = 0;
    calib_args a;
    memset(&a, 0, sizeof a);
    cli_table_out_init(&a.out);
    qcal_fp8_checkpoint_options_default(&a.co);
    a.weights = calloc((size_t)argc + 1, sizeof *a.weights);
    a.exclude = calloc((size_t)argc + 1, sizeof *a.exclude);
    if (!a.weights || !a.exclude || cli_model_args_init(cmd, &a.ma, argc)) {
        free(a.weights);   /* the other ranks are waiting in the first agreement */
        free(a.exclude);
        return cli_dist_agree(dist, cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory"));
    }
    qcal_onnx_model *model = NULL;
    qcal_engine *engine = NULL;
    qcal_model_calib_report mrep;
    memset(&mrep, 0, sizeof mrep);
    qcal_onnx_qdq_options sel;
    qcal_onnx_qdq_options_default(&sel);
    qcal_calib_rules *rules = NULL;
    qcal_calib_dump *dump = NULL;
    qcal_calib_session *session = NULL;
    qcal_calib_table *table = NULL;
    qcal_status st;
    long files = 0, weights = 0, skipped_1d = 0;
    a.max_memory = QCAL_CALIB_MAX_MEMORY_DEFAULT;
    cli_progress prog;
    cli_progress_init(&prog, cmd, false, false);
    int rc = parse_args(argc, argv, &a, writer);
    if (rc) {
        rc = rc < 0 ? 0 : rc;
        goto done;
    }
    if ((rc = make_rules(cmd, &a, &rules)))
        goto done;
    if (a.profile)
        qcal_onnx_profile_parse(a.profile, &sel.profile);   /* checked by parse_args */
    if (a.model && a.ma.observer_auto && dist->size > 1) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--observer auto runs in one process (its "
                      "evaluation is not merged across ranks): run it without mpirun");
        goto done;
    }
    if (a.model) {
        sel.op_types = a.op_types;
        sel.exclude = a.exclude;
        sel.n_exclude = a.nexclude;
        if ((rc = cli_model_load(cmd, a.dir, a.quiet, &model)) ||
            (rc = cli_engine_open(cmd, a.ma.ort_lib, &engine)))
            goto done;
    }
    if (a.dir && !a.model && (rc = scan_dump(cmd, a.dir, &dump)))
        goto done;
    if (dump && (rc = check_memory(cmd, &a, dump, rules)))
        goto done;
    if (a.dir && writer) {
        note_safetensors(cmd, &a);
        note_unused_observer_opts(cmd, &a, rules, dump);
    }
    cli_progress_init(&prog, cmd, writer && !a.quiet, cli_dist_terminal(dist));
    if (dump) {
        int64_t total = 0;
        qcal_calib_dump_file_count(dump, &total);
        mine = (long)total;
        if (dist->size > 1 && (rc = assign(cmd, dist, dump, rules, &owner, &mine)))
            goto done;
    }

    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    so.max_memory = a.max_memory;
    so.progress = cli_progress_cb;
    so.progress_user = &prog;
    if ((st = qcal_calib_session_create(&so, &session)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    /* Distributed runs agree here that every rank has its plan. */
    if ((rc = cli_dist_agree(dist, rc)))
        goto done_agreed;
    if (dump && (rc = feed_dump(cmd, dist, session, rules, dump, owner, mine, &files,
                                   &prog)))
        goto fed;
    if (model && (rc = cli_model_calibrate(cmd, engine, model, &a.ma, &sel, session, dist->rank,
                                           dist->size, &prog, &mrep)))
        cli_dist_notify(dist);
    /* --weights: the writer reads them all. */
    for (int i = 0; i < a.nweights && writer; i++) {
        weights_ctx w = { cmd, a.weights[i], session, 0, 0 };
        if ((rc = cli_safetensors_each(cmd, a.weights[i], feed_weight, &w)))
            goto fed;
        weights += w.observed;
        skipped_1d += w.skipped_1d;
    }
fed:
    /* Every rank's feeding outcome, then the sessions merged onto the writer. */
    if ((rc = cli_dist_agree(dist, rc)))
        goto done_agreed;
    if ((rc = cli_dist_reduce_session(dist, session)))
        goto done_agreed;
    if (!writer)
        goto done;
    if (dump) {
        int64_t total = 0;
        qcal_calib_dump_file_count(dump, &total);
        files = (long)total;   /* the whole dump's, whichever rank fed them */
    }
    int64_t nentries = 0;
    qcal_calib_session_count(session, &nentries);
    cli_progress_phase(&prog, "searching", "tensors", nentries);
    if ((st = qcal_calib_session_table(session, &table)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    if ((rc = check_no_data(cmd, table, a.allow_empty)))
        goto done;
    /* The profile the table is for: a model's (default ort), or --profile of a dump. */
    if ((model || a.profile) &&
        (st = qcal_calib_table_set_profile(table, qcal_onnx_profile_name(sel.profile))) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto done;
    }
    a.out.no_data_warned = true;
    /* The state staged, the table written, then the state renamed: all or none. */
    cli_staged staged = { 0 };
    cli_progress_phase(&prog, "writing", "outputs", 1);
    if (a.save_state && (rc = cli_session_state_stage(cmd, session, a.save_state, &staged)))
        goto done;
    qcal_fp8_checkpoint_summary csum;
    if ((rc = a.ckpt ? write_checkpoint(cmd, &a, table, &csum)
                     : cli_table_out_write(cmd, &a.out, table))) {
        cli_stage_abort(&staged);
        goto done;
    }
    if ((rc = cli_stage_commit(cmd, &staged)))
        goto done;
    cli_progress_set(&prog, 1, a.out.out);
    cli_progress_end(&prog);   /* before the summary line */
    cli_warn_clamped_scales(cmd, table);
    int64_t n = 0, nw = 0;
    uint64_t nonfinite = 0;
    qcal_calib_table_count(table, &n);
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        qcal_calib_table_entry(table, i, &e);
        nw += e->role == QCAL_CALIB_ROLE_WEIGHT;
        nonfinite += e->nonfinite;
    }
    char fmts[128];
    cli_table_out_formats(&a.out, fmts, sizeof fmts);
    if (a.ckpt)
        snprintf(fmts, sizeof fmts, "%s", qcal_fp8_checkpoint_format_name(a.co.format));
    /* With an output on stdout (-o -, --save-state -) the summary goes to stderr. */
    FILE *say = cli_output_is_stdout(a.out.out) || cli_output_is_stdout(a.save_state) ? stderr
                                                                                      : stdout;
    if (model && dist->size > 1 && n > 0) {
        /* Every rank's runs: each observed tensor got one batch per run. */
        const qcal_calib_entry *e0;
        qcal_calib_table_entry(table, 0, &e0);
        mrep.runs = (int64_t)e0->batches;
    }
    if (model)
        fprintf(say, "qcal: calibrate: wrote %s (%s): %lld %s from %s run in ONNX "
                "Runtime %s on %lld %s (%lld %s, %lld %s)", a.out.out, fmts,
                (long long)(n - nw), CLI_PLURAL(n - nw, "activation", "activations"), a.dir,
                qcal_engine_version(engine), (long long)mrep.samples,
                CLI_PLURAL(mrep.samples, "sample", "samples"), (long long)mrep.runs,
                CLI_PLURAL(mrep.runs, "run", "runs"), (long long)mrep.files,
                CLI_PLURAL(mrep.files, "file", "files"));
    else
        fprintf(say, "qcal: calibrate: wrote %s (%s): %lld %s, %lld %s from %ld %s",
                a.out.out, fmts, (long long)(n - nw), CLI_PLURAL(n - nw, "activation", "activations"),
                (long long)nw, CLI_PLURAL(nw, "weight", "weights"), files,
                CLI_PLURAL(files, "file", "files"));
    if (model && a.ma.observer_auto) {
        char chosen[256];
        cli_model_chosen(&mrep, chosen, sizeof chosen);
        fprintf(say, "; observer auto (the model run twice): %s", chosen);
    }
    if (a.nweights)
        fprintf(say, " and %ld safetensors %s (%ld %s under 2 dimensions skipped)",
                weights, CLI_PLURAL(weights, "weight", "weights"), skipped_1d,
                CLI_PLURAL(skipped_1d, "tensor", "tensors"));
    fprintf(say, "; %llu non-finite %s skipped\n", (unsigned long long)nonfinite,
            CLI_PLURAL(nonfinite, "value", "values"));
    if (model && a.ma.observer_auto)
        cli_model_auto_line(cmd, &mrep, say);
    if (a.ckpt) {
        fprintf(say, "qcal: calibrate: checkpoint: %lld %s in float8_e4m3fn, %lld "
                "attention %s with KV-cache scales, %lld %s copied, %lld %s "
                "left in their dtype, %lld %s\n", (long long)csum.quantized,
                CLI_PLURAL(csum.quantized, "linear", "linears"), (long long)csum.kv_scales,
                CLI_PLURAL(csum.kv_scales, "module", "modules"), (long long)csum.copied,
                CLI_PLURAL(csum.copied, "tensor", "tensors"), (long long)csum.ignored,
                CLI_PLURAL(csum.ignored, "linear", "linears"), (long long)csum.files,
                CLI_PLURAL(csum.files, "file", "files"));
        if (csum.unmatched_inputs)
            cli_warn(cmd, "%lld '<module>.input' %s no 2-D '<module>.weight' in "
                     "the model files: no scale written for %s",
                     (long long)csum.unmatched_inputs,
                     CLI_PLURAL(csum.unmatched_inputs, "activation has", "activations have"),
                     CLI_PLURAL(csum.unmatched_inputs, "it", "them"));
    }
    rc = cli_flush(cmd, say);
done:
    /* The last agreement: every rank ends with the same code (the writer's outcome, or the
     * first failure of a rank that stopped before the agreements above). */
    rc = cli_dist_agree(dist, rc);
done_agreed:
    cli_progress_end(&prog);
    free(owner);
    qcal_calib_table_destroy(&table);
    qcal_calib_session_destroy(&session);
    qcal_calib_dump_destroy(&dump);
    qcal_calib_rules_destroy(&rules);
    qcal_onnx_model_destroy(&model);
    qcal_engine_close(&engine);
    cli_model_args_free(&a.ma);
    free(a.exclude);
    free(a.weights);
    return rc;
}
