/* qcal onnx-expose and qcal qdq: the ONNX model a user deploys (qcal/onnx.h, docs/onnx.md). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <qcal/atomic_file.h>
#include <qcal/calib.h>
#include <qcal/onnx.h>

#include "cli_common.h"
#include "cli_accuracy.h"
#include "cli_model.h"
#include "cli_output.h"
#include "cli_progress.h"

/* The command lines of onnx-expose and qdq (each table uses a subset). */
typedef struct onnx_args {
    const char *in, *out, *profile, *list, *op_types, *table, *wobs, *wqs, *rules, *table_out;
    const char **exclude;      /* --exclude, argc slots */
    int64_t n_exclude;
    bool strict, float_weights, equalize, quiet, allow_partial, verbose, have_obs;
    cli_observer_args oa;
    cli_model_args ma;
    cli_accuracy_args aa;
} onnx_args;

enum { OPT_EXCLUDE = 1 };

static const cli_opt expose_opts[] = {
    CLI_TEXT(
        "usage: qcal onnx-expose MODEL.onnx -o OUT.onnx [--profile ort|tensorrt|ort,tensorrt]\n"
        "       [--list FILE]\n"
        "       [--exclude PATTERN]... [--op-types LIST] [-q]\n"
        "\n"
        "Makes every tensor the profile will quantize (what 'qcal qdq' looks up in the table) a\n"
        "graph output of OUT.onnx, type and shape kept. Run OUT.onnx in any engine on calibration\n"
        "data and save those outputs as a qcal dump directory (names percent-encoded, or a\n"
        "manifest.json); 'qcal calibrate' then makes a table that matches the model one to one\n"
        "(recipes for ONNX Runtime in docs/onnx.md). A model of opset 9-12 is raised to opset 13\n"
        "first, as 'qcal qdq' does (OUT.onnx is that model; an op qcal cannot adapt is an error).\n"
        "\n"
        "options:\n"),
    CLI_STR("output", 'o', onnx_args, out, "OUT.onnx",
        "the model with the extra outputs (written atomically)"),
    CLI_STR("profile", 0, onnx_args, profile, "P",
        "ort (default: ONNX Runtime) or tensorrt (TensorRT 10), or\n"
        "ort,tensorrt: the tensors of both in one model (--list: the\n"
        "union, ort's first)"),
    CLI_STR("list", 0, onnx_args, list, "FILE", "also write the exposed names, one per line"),
    CLI_STR("op-types", 0, onnx_args, op_types, "LIST",
        "comma list of op types to quantize (default: the profile's);\n"
        "give 'qcal qdq' the same list"),
    CLI_OPT_REPEATED("exclude", 0, OPT_EXCLUDE, "PATTERN",
        "glob on node and tensor names left float, not exposed\n"
        "(repeatable); give 'qcal qdq' the same patterns"),
    CLI_BOOL("quiet", 'q', onnx_args, quiet, "no notes on stderr"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "Exit codes: 2 bad options; 3 a missing, malformed or hostile MODEL, or one qcal cannot\n"
        "raise to opset 13; 4 an output that cannot be written (an existing file is left\n"
        "intact); 1 a name --list cannot hold (a line break) or ONNX support not built.\n"),
    { 0 },
};
const cli_spec cmd_onnx_expose_spec = { expose_opts, 27 };

static const cli_opt qdq_opts[] = {
    CLI_TEXT(
        "usage: qcal qdq MODEL.onnx --table TABLE.json -o OUT.onnx [--profile ort|tensorrt]\n"
        "       [--weight-observer KIND] [--weight-qscheme Q | --float-weights]\n"
        "       [--exclude PATTERN]... [--op-types LIST] [--strict | --allow-partial]\n"
        "       qcal qdq MODEL.onnx --data SPEC -o OUT.onnx [--observer K | --rules F]\n"
        "       [--table-out T] [--equalize] [same options as above, data options below]\n"
        "       [--min-output-sqnr DB | --max-drop POINTS --labels L.npy [--metric M]]\n"
        "       [--eval-data SPEC] [--sensitivity-samples N]\n"
        "\n"
        "Writes MODEL with QuantizeLinear/DequantizeLinear nodes: activations from the table\n"
        "(matched by tensor name), weights per-channel symmetric qint8 computed from the model's\n"
        "own initializers. A model of default-domain opset 9-12 is raised to 13 first (the ops\n"
        "whose meaning changed adapted, one note each; docs/onnx.md \"Older opsets\"). With\n"
        "--data instead of --table\n"
        "the table is made first by running MODEL in ONNX Runtime on the data ('qcal calibrate\n"
        "MODEL.onnx --data', the same table) and the model written from it, in one command.\n"
        "  profile ort: ONNX Runtime node units (DQ -> op -> Q), activations as calibrated\n"
        "  (quint8 asymmetric), int8 weights + DequantizeLinear, int32 biases, a Relu after a\n"
        "  quantized op folded into its output Q.\n"
        "  profile tensorrt: TensorRT 10 explicit quantization, Q/DQ on op inputs only,\n"
        "  activations symmetric int8 (scale = amax / 127), float weights + Q + DQ, float biases.\n"
        "\n"
        "options:\n"),
    CLI_STR("table", 0, onnx_args, table, "TABLE.json",
        "native qcal table ('qcal calibrate --format json')"),
    CLI_STR("output", 'o', onnx_args, out, "OUT.onnx", "the quantized model (written atomically)"),
    CLI_STR("profile", 0, onnx_args, profile, "P", "ort (default) or tensorrt"),
    CLI_STR("weight-observer", 0, onnx_args, wobs, "KIND",
        "per_channel_minmax (default) or moving_average_per_channel_minmax"),
    CLI_STR("weight-qscheme", 0, onnx_args, wqs, "Q",
        "per_channel_symmetric (default), per_channel_affine,\n"
        "per_tensor_affine or per_tensor_symmetric (qint8; per-tensor:\n"
        "minmax over the whole weight; tensorrt: symmetric only)"),
    CLI_BOOL("float-weights", 0, onnx_args, float_weights,
        "weights and biases stay float, no Q/DQ (activations only)"),
    CLI_OPT_REPEATED("exclude", 0, OPT_EXCLUDE, "PATTERN",
        "glob on node and tensor names left float (repeatable)"),
    CLI_STR("op-types", 0, onnx_args, op_types, "LIST",
        "comma list of op types to quantize (default: the profile's)"),
    CLI_BOOL("strict", 0, onnx_args, strict,
        "tensors missing from the table are an error (default: they\n"
        "stay float, counted in one warning)"),
    CLI_BOOL("allow-partial", 0, onnx_args, allow_partial,
        "accept a table that holds fewer than half of the tensors the\n"
        "model needs, or was calibrated for the other profile (default:\n"
        "exit 3, the table of another model?); the rest stay float"),
    CLI_BOOL("verbose", 0, onnx_args, verbose, "list the tensors missing from the table, one per line"),
    CLI_BOOL("quiet", 'q', onnx_args, quiet, "no progress report or notes on stderr"),
    CLI_HELP_OPT,
    CLI_TEXT(
        "\n"
        "calibrating from data (instead of --table):\n"),
    CLI_MODEL_OPTS,
    CLI_STR("rules", 0, onnx_args, rules, "RULES",
        "rules file for the activations' observers (docs/calibration.md)"),
    CLI_STR("table-out", 0, onnx_args, table_out, "T",
        "also write the table made from the data (native JSON)"),
    CLI_BOOL("equalize", 0, onnx_args, equalize,
        "cross-layer equalization first ('qcal equalize' defaults)"),
    CLI_TEXT(
        CLI_MODEL_AUTO_HELP
        "                           (the default without --rules or observer options; weights\n"
        "                           keep --weight-observer)\n"
        "  observer options         below, as 'qcal calibrate' (--observer histogram: the\n"
        "                           default before auto)\n"
        "\n"
        "Exit codes: 2 bad options; 3 a missing or malformed MODEL, TABLE or data, a table that\n"
        "matches fewer than half of the model's tensors or was calibrated for the other profile\n"
        "(without --allow-partial), data that does not match the model, a model opset below 9 or an op qcal cannot raise to opset 13; 4 an output that cannot be written (an\n"
        "existing file is left intact); 1 missing tensors under --strict, a failure during a\n"
        "run, or ONNX support not built; 5 ONNX Runtime could not be loaded (--data).\n"
        "\n"
        "observer options (with --data; the keys of rules files, docs/cli.md):\n"),
    CLI_OBSERVER_GROUP(QCAL_OBSERVER_KIND_COUNT),   /* "default auto" */
    CLI_TEXT(
        "\n"
        "keeping the most sensitive ops float until an accuracy target holds (docs/accuracy.md;\n"
        "with --data or --eval-data; the QDQ model with the k most sensitive ops float measured\n"
        "in ONNX Runtime against the float model, k = 0 first, the ops ranked one at a time on a\n"
        "gated model only when it fails, then a binary search on k):\n"),
    CLI_KEEP_FLOAT_OPTS,
    CLI_ACCURACY_OPTS,
    { 0 },
};
const cli_spec cmd_qdq_spec = { qdq_opts, 27 };

/* The model, --exclude and the shared groups of both commands (cli_handler). */
static int take_opt(void *args, const char *cmd, int id, const char *val)
{
    onnx_args *a = args;
    int rc;
    if (id == CLI_POSITIONAL) {
        if (a->in)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "one model expected, got '%s' and '%s'", a->in, val);
        a->in = val;
        return 0;
    }
    if (id == OPT_EXCLUDE) {
        a->exclude[a->n_exclude++] = val;
        return 0;
    }
    if ((rc = cli_model_opt(cmd, &a->ma, id, val)) >= 0 || (rc = cli_accuracy_opt(cmd, &a->aa, id, val)) >= 0)
        return rc;
    a->have_obs |= cli_observer_opt(&a->oa, id, val);
    return 0;
}

/* Allocates a's lists for argc arguments and parses argv by spec: 0, an exit code
 * (reported) or CLI_HELP_SHOWN. */
static int parse_onnx_args(const cli_spec *spec, int argc, char **argv, onnx_args *a)
{
    memset(a, 0, sizeof *a);
    cli_accuracy_args_init(&a->aa);
    int rc = cli_model_args_init(argv[0], &a->ma, argc);
    if (rc)
        return rc;
    if (!(a->exclude = calloc((size_t)argc + 1, sizeof *a->exclude)))
        return cli_fail(argv[0], QCAL_EXIT_FAILURE, "out of memory");
    return cli_parse(spec, argc, argv, a, take_opt);
}

static void onnx_args_free(onnx_args *a)
{
    free(a->exclude);
    cli_model_args_free(&a->ma);
    cli_accuracy_args_free(&a->aa);
}

static int check_available(const char *cmd)
{
    if (qcal_onnx_available())
        return 0;
    return cli_fail(cmd, QCAL_EXIT_FAILURE,
                    "unavailable: this qcal was built without ONNX support (protobuf-c; meson -Donnx=enabled)");
}

/* "'a', 'b', 'c'" of n names into a new string (NULL: out of memory). */
static char *join_names(char **names, int64_t n, const char *sep, bool quote)
{
    size_t len = 1;
    for (int64_t i = 0; i < n; i++)
        len += strlen(names[i]) + strlen(sep) + 2;
    char *s = malloc(len), *w = s;
    if (!s)
        return NULL;
    *w = '\0';
    for (int64_t i = 0; i < n; i++)
        w += sprintf(w, "%s%s%s%s", i ? sep : "", quote ? "'" : "", names[i], quote ? "'" : "");
    return s;
}

/* Appends the names of add[0..nadd) not yet in *names (n of them): the union of two
 * profiles' lists, first-seen order. */
static qcal_status names_union(char ***names, int64_t *n, char **add, int64_t nadd)
{
    char **grown = realloc(*names, (size_t)(*n + nadd + 1) * sizeof *grown);
    if (!grown)
        return qcal_set_error(QCAL_ERR_NO_MEMORY, "out of memory");
    *names = grown;
    for (int64_t i = 0; i < nadd; i++) {
        bool seen = false;
        for (int64_t j = 0; j < *n && !seen; j++)
            seen = !strcmp(grown[j], add[i]);
        if (seen)
            continue;
        size_t len = strlen(add[i]) + 1;
        if (!(grown[*n] = malloc(len)))
            return qcal_set_error(QCAL_ERR_NO_MEMORY, "out of memory");
        memcpy(grown[(*n)++], add[i], len);
    }
    return QCAL_OK;
}

/* cmd_onnx_expose on its parsed command line. */
static int expose_main(const char *cmd, const onnx_args *a)
{
    const char *in = a->in, *out = a->out, *profile = a->profile, *list = a->list;
    bool quiet = a->quiet;
    int rc;
    if ((rc = cli_check_in_out(cmd, in, out)))
        return rc;
    /* Every output checked before the work (docs/cli.md "Outputs"). */
    if ((rc = cli_model_output_check(cmd, out)) || (rc = cli_output_check(cmd, list)))
        return rc;
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.op_types = a->op_types;
    opt.exclude = a->exclude;
    opt.n_exclude = a->n_exclude;
    /* --profile P, or a comma list of both: the tensors of each, in one model. */
    qcal_onnx_profile profiles[2] = { QCAL_ONNX_PROFILE_ORT, QCAL_ONNX_PROFILE_ORT };
    int nprof = 1;
    if (profile) {
        char buf[64];
        const char *comma = strchr(profile, ',');
        bool ok = strlen(profile) < sizeof buf && (!comma || !strchr(comma + 1, ','));
        if (ok) {
            snprintf(buf, sizeof buf, "%s", profile);
            if (comma)
                buf[comma - profile] = '\0';
            ok = qcal_onnx_profile_parse(buf, &profiles[0]) == QCAL_OK &&
                 (!comma || qcal_onnx_profile_parse(comma + 1, &profiles[1]) == QCAL_OK);
            nprof = comma ? 2 : 1;
            ok = ok && (nprof == 1 || profiles[0] != profiles[1]);
        }
        if (!ok)
            return cli_fail(cmd, QCAL_EXIT_USAGE, "--profile: '%s' is not ort, tensorrt or "
                            "ort,tensorrt", profile);
    }
    opt.profile = profiles[0];
    if ((rc = check_available(cmd)))
        return rc;
    qcal_onnx_model *m = NULL;
    qcal_status st;
    if ((rc = cli_model_load(cmd, in, quiet, &m)))
        return rc;
    char **names = NULL, **untyped = NULL;
    int64_t n = 0, added = 0, n_untyped = 0;
    qcal_atomic_file lf = { 0 };
    /* Every profile's list on the model as loaded; the union, in profile then graph order. */
    for (int k = 0; k < nprof; k++) {
        qcal_onnx_qdq_options po = opt;
        po.profile = profiles[k];
        char **more = NULL, **umore = NULL;
        int64_t nm = 0, num = 0;
        st = qcal_onnx_list(m, &po, &more, &nm);
        if (st == QCAL_OK)
            st = qcal_onnx_list_untyped(m, &po, &umore, &num);
        if (st == QCAL_OK && (st = names_union(&names, &n, more, nm)) == QCAL_OK)
            st = names_union(&untyped, &n_untyped, umore, num);
        qcal_onnx_names_free(&more, nm);
        qcal_onnx_names_free(&umore, num);
        if (st != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
            goto out;
        }
    }
    if (n_untyped && !quiet) {
        char *u = join_names(untyped, n_untyped, ", ", true);
        fprintf(stderr, "qcal: %s: note: %lld tensor%s of unknown element type (neither declared nor inferred) "
                "not exposed: %s\n", cmd, (long long)n_untyped, n_untyped == 1 ? "" : "s", u ? u : "(out of memory)");
        free(u);
    }
    if (list) {
        for (int64_t i = 0; i < n; i++)
            if (strchr(names[i], '\n') || strchr(names[i], '\r')) {
                rc = cli_fail(cmd, QCAL_EXIT_FAILURE,
                              "--list: tensor name '%s' holds a line break; a line-per-name list cannot hold it",
                              names[i]);
                goto out;
            }
        if ((st = qcal_atomic_file_open(&lf, cli_output_path(list))) != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
            goto out;
        }
        for (int64_t i = 0; i < n; i++)
            fprintf(lf.fp, "%s\n", names[i]);
    }
    for (int k = 0; k < nprof; k++) {
        qcal_onnx_qdq_options po = opt;
        po.profile = profiles[k];
        int64_t more = 0;
        if ((st = qcal_onnx_expose(m, &po, &more)) != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
            goto out;
        }
        added += more;
    }
    if (list && (st = qcal_atomic_file_flush(&lf)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        goto out;
    }
    if ((st = qcal_onnx_model_save_file(m, NULL, out)) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_WRITE), st);
        goto out;
    }
    if (list && (st = qcal_atomic_file_commit(&lf)) != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_OUTPUT, st);
        goto out;
    }
    FILE *say = cli_output_is_stdout(list) ? stderr : stdout;   /* --list -: the names alone there */
    fprintf(say, "qcal: onnx-expose: wrote %s (profile %s%s%s): %lld %s exposed, %lld new %s%s%s\n", out,
            qcal_onnx_profile_name(profiles[0]), nprof > 1 ? "," : "",
            nprof > 1 ? qcal_onnx_profile_name(profiles[1]) : "", (long long)n, CLI_PLURAL(n, "tensor", "tensors"),
            (long long)added, CLI_PLURAL(added, "output", "outputs"), list ? "; names in " : "",
            list ? list : "");
    rc = cli_flush(cmd, say);
out:
    qcal_atomic_file_abort(&lf);
    qcal_onnx_names_free(&untyped, n_untyped);
    qcal_onnx_names_free(&names, n);
    qcal_onnx_model_destroy(&m);
    return rc;
}

int cmd_onnx_expose(int argc, char **argv)
{
    onnx_args a;
    int rc = parse_onnx_args(&cmd_onnx_expose_spec, argc, argv, &a);
    if (!rc)
        rc = expose_main(argv[0], &a);
    onnx_args_free(&a);
    return rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
}

/* The ops left float, one note per (op type, reason) with its count and a first node: the
 * report's "NODE (OP): reason" lines with the tensor names in the reason ('...') elided. */
static void note_skipped(const char *cmd, const qcal_onnx_qdq_report *rep)
{
    int64_t n = rep->n_skipped;
    char **key = calloc((size_t)n + 1, sizeof *key);
    int64_t *count = calloc((size_t)n + 1, sizeof *count), *first = calloc((size_t)n + 1, sizeof *first);
    int64_t nk = 0;
    for (int64_t i = 0; key && count && first && i < n; i++) {
        const char *line = rep->skipped[i], *op = strstr(line, " (");
        const char *why = op ? strstr(op, "): ") : NULL;
        size_t cap = strlen(line) + 1;
        char *k = malloc(cap), *w = k;
        if (!k)
            break;
        if (!why) {
            snprintf(k, cap, "%s", line);
        } else {
            /* "OP): reason" with every quoted name replaced by '...' */
            w += snprintf(w, cap, "%.*s", (int)(why - op - 2), op + 2);
            *w++ = '\t';
            for (const char *r = why + 3; *r;) {
                if (*r == '\'') {
                    const char *e = strchr(r + 1, '\'');
                    if (e) {
                        memcpy(w, "'...'", 5);
                        w += 5;
                        r = e + 1;
                        continue;
                    }
                }
                *w++ = *r++;
            }
            *w = '\0';
        }
        int64_t j = 0;
        while (j < nk && strcmp(key[j], k))
            j++;
        if (j == nk) {
            key[nk] = k;
            first[nk++] = i;
        } else {
            free(k);
        }
        count[j]++;
    }
    for (int64_t j = 0; j < nk; j++) {
        const char *tab = strchr(key[j], '\t'), *line = rep->skipped[first[j]];
        const char *op = strstr(line, " (");
        if (tab)
            cli_note(cmd, "%lld %.*s op%s left float: %s (first: %.*s)", (long long)count[j],
                     (int)(tab - key[j]), key[j], count[j] == 1 ? "" : "s", tab + 1,
                     (int)(op ? op - line : (ptrdiff_t)strlen(line)), line);
        else
            cli_note(cmd, "op left float: %s", key[j]);
    }
    for (int64_t j = 0; j < nk; j++)
        free(key[j]);
    free(key);
    free(count);
    free(first);
}

/* A table read from a file (--table) must be the model's: fewer than half of the tensors
 * the profile quantizes found in it, or a table recorded for the other profile, is an input
 * error (exit 3, before anything is written) unless allow_partial (a warning then). */
/* True when an entry of t has an FP8 dtype (its Q/DQ needs opset 19). */
static bool table_has_fp8(const qcal_calib_table *t)
{
    int64_t n = 0;
    if (qcal_calib_table_count(t, &n) != QCAL_OK)
        return false;
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        if (qcal_calib_table_entry(t, i, &e) == QCAL_OK && qcal_dtype_is_float8(e->qparams.dtype))
            return true;
    }
    return false;
}

static int check_table_fits(const char *cmd, const qcal_onnx_model *m, const qcal_calib_table *t,
                            const char *table_path, const qcal_onnx_qdq_options *opt,
                            bool allow_partial)
{
    const char *want = qcal_onnx_profile_name(opt->profile), *has = qcal_calib_table_profile(t);
    if (has && strcmp(has, want)) {
        if (!allow_partial)
            return cli_fail(cmd, QCAL_EXIT_INPUT, "table '%s' was calibrated for profile %s, not "
                            "%s: give --profile %s, or calibrate for %s (--allow-partial: use "
                            "it anyway)", table_path, has, want, has, want);
        cli_warn(cmd, "table '%s' was calibrated for profile %s, not %s", table_path, has, want);
    }
    char **names = NULL;
    int64_t n = 0, k = 0;
    qcal_status st = qcal_onnx_list(m, opt, &names, &n);
    if (st != QCAL_OK) {
        qcal_clear_error();
        return 0;   /* the rewrite reports what is wrong with the options or the model */
    }
    for (int64_t i = 0; i < n; i++) {
        const qcal_calib_entry *e;
        k += qcal_calib_table_find(t, names[i], QCAL_CALIB_ROLE_ACTIVATION, &e) == QCAL_OK;
    }
    qcal_onnx_names_free(&names, n);
    qcal_clear_error();
    if (n > 0 && 2 * k < n && !allow_partial)
        return cli_fail(cmd, QCAL_EXIT_INPUT, "matched %lld of %lld %s the model needs; is "
                        "this the table of another model? ('%s'; --allow-partial: quantize the "
                        "%lld matched)", (long long)k, (long long)n, CLI_PLURAL(n, "tensor", "tensors"),
                        table_path, (long long)k);
    return 0;
}

/* Calibrates m from the data (--data): the rules, a session, ONNX Runtime, the runs; *t
 * gets the table. 0 or an exit code (reported). */
static int qdq_calibrate(const char *cmd, qcal_onnx_model *m, const cli_model_args *ma,
                         const qcal_onnx_qdq_options *opt, const char *rules_path,
                         const cli_observer_args *oa, bool have_obs, bool quiet,
                         qcal_calib_table **t, qcal_model_calib_report *mrep, char *version,
                         size_t vcap)
{
    qcal_calib_rules *rules = NULL;
    qcal_calib_session *session = NULL;
    qcal_engine *engine = NULL;
    cli_progress prog;
    cli_progress_init(&prog, cmd, false, false);
    int rc = cli_make_rules(cmd, rules_path, oa, have_obs, &rules);
    if (rc)
        goto out;
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    qcal_status st = qcal_calib_session_create(&so, &session);
    if (st != QCAL_OK) {
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
        goto out;
    }
    if ((rc = cli_engine_open(cmd, ma->ort_lib, &engine)))
        goto out;
    snprintf(version, vcap, "%s", qcal_engine_version(engine));
    cli_progress_init(&prog, cmd, !quiet, isatty(2));
    if ((rc = cli_model_calibrate(cmd, engine, m, ma, opt, session, 0, 1, &prog, mrep)))
        goto out;
    cli_progress_end(&prog);
    if ((st = qcal_calib_session_table(session, t)) != QCAL_OK ||
        (st = qcal_calib_table_set_profile(*t, qcal_onnx_profile_name(opt->profile))) != QCAL_OK)
        rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
out:
    cli_progress_end(&prog);
    qcal_engine_close(&engine);
    qcal_calib_session_destroy(&session);
    qcal_calib_rules_destroy(&rules);
    return rc;
}

/* The keep-float search on m (qcal_accuracy_keep_float): 0 or an exit code (reported); the
 * target not holding even with every op float is exit 1 (nothing written). */
static int qdq_keep_float(const char *cmd, const qcal_onnx_model *m, const qcal_calib_table *t,
                          const qcal_onnx_qdq_options *opt, const cli_model_args *ma, cli_accuracy_args *aa,
                          bool quiet, qcal_accuracy_keep_float_result *kf)
{
    qcal_accuracy_options ao;
    int rc = cli_accuracy_options(cmd, aa, ma->batch, &ao);
    if (rc)
        return rc;
    qcal_engine *engine = NULL;
    if ((rc = cli_engine_open(cmd, ma->ort_lib, &engine)))
        return rc;
    cli_progress prog;
    cli_progress_init(&prog, cmd, !quiet, isatty(2));
    cli_progress_phase(&prog, "searching", "runs", 0);
    ao.progress = cli_progress_cb;
    ao.progress_user = &prog;
    qcal_accuracy_keep_float_target tg = {aa->min_sqnr, aa->max_drop};
    const char *data = aa->eval_data ? aa->eval_data : ma->data;
    const char *const *entries = aa->eval_data ? NULL : ma->inputs;
    int64_t n_entries = aa->eval_data ? 0 : ma->ninputs;
    qcal_status st = qcal_accuracy_keep_float(engine, m, t, opt, data, entries, n_entries, &ao, &tg, kf);
    cli_progress_end(&prog);
    qcal_engine_close(&engine);
    if (st != QCAL_OK) {
        return cli_fail_status(cmd, cli_exit_code(st, CLI_AT_JUDGE), st);
    }
    if (!kf->met)
        return cli_fail(cmd, QCAL_EXIT_FAILURE,
                        "the target does not hold even with every op float (output SQNR %.2f dB): nothing written",
                        kf->sqnr_db);
    return 0;
}

static void print_keep_float(const qcal_accuracy_keep_float_result *kf, const cli_accuracy_args *aa)
{
    printf("qcal: qdq: kept %lld of %lld %s float", (long long)kf->n_float, (long long)kf->n_ops,
           CLI_PLURAL(kf->n_ops, "op", "ops"));
    for (int64_t i = 0; i < kf->n_float; i++)
        printf("%s%s", i ? ", " : " (most sensitive first): ", kf->float_ops[i]);
    printf("; output SQNR %.2f dB", kf->sqnr_db);
    if (!isnan(aa->min_sqnr))
        printf(" (target %.2f)", aa->min_sqnr);
    if (!isnan(kf->acc_float))
        printf("; %s float %.2f%%, quantized %.2f%%, drop %.2f points", aa->metric ? aa->metric : "top1",
               100.0 * kf->acc_float, 100.0 * kf->acc_quant, 100.0 * (kf->acc_float - kf->acc_quant));
    if (!isnan(aa->max_drop))
        printf(" (target %.2f)", aa->max_drop);
    printf("; %lld %s, %lld %s, %.1f s\n", (long long)kf->runs, CLI_PLURAL(kf->runs, "run", "runs"),
           (long long)kf->checks, CLI_PLURAL(kf->checks, "model checked", "models checked"), kf->seconds);
}

int cmd_qdq(int argc, char **argv)
{
    const char *cmd = argv[0];
    onnx_args a;
    qcal_accuracy_keep_float_result kf;
    memset(&kf, 0, sizeof kf);
    char **kf_ex = NULL;
    int rc = parse_onnx_args(&cmd_qdq_spec, argc, argv, &a);
    if (rc) {
        rc = rc == CLI_HELP_SHOWN ? QCAL_EXIT_OK : rc;
        goto done;
    }
    const char *in = a.in, *out = a.out, *profile = a.profile, *table_path = a.table,
               *wobs = a.wobs, *op_types = a.op_types, *wqs = a.wqs, *rules_path = a.rules,
               *table_out = a.table_out;
    bool strict = a.strict, float_weights = a.float_weights, equalize = a.equalize,
         quiet = a.quiet, allow_partial = a.allow_partial, verbose = a.verbose;
    if ((rc = cli_check_in_out(cmd, in, out)) || (rc = cli_model_output_check(cmd, out)))
        goto done;
    bool from_data = cli_model_args_given(&a.ma);
    if (!table_path && !from_data) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "no --table or --data given (see 'qcal qdq --help')");
        goto done;
    }
    if (table_path && from_data) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--table and --data exclude each other: the table "
                      "comes from a file or from running the model on data");
        goto done;
    }
    if (!from_data && (rules_path || table_out || equalize || a.have_obs || a.ma.ncarry ||
                       (!cli_keep_float_given(&a.aa) && (a.ma.batch || a.ma.ort_lib)))) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--rules, --table-out, --equalize, --batch, --carry, "
                      "--ort-lib and observer options go with --data");
        goto done;
    }
    bool keep_float = cli_keep_float_given(&a.aa);
    if (!keep_float && (a.aa.labels || a.aa.metric || a.aa.eval_data || a.aa.sensitivity_samples >= 0)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--labels, --metric, --eval-data and --sensitivity-samples go with "
                      "--min-output-sqnr or --max-drop");
        goto done;
    }
    if (keep_float && !from_data && !a.aa.eval_data) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--min-output-sqnr and --max-drop judge the model on data: "
                      "give --data or --eval-data");
        goto done;
    }
    if (keep_float && a.ma.ncarry) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--carry does not go with --min-output-sqnr / --max-drop "
                      "(their runs stand alone)");
        goto done;
    }
    if (from_data && (rc = cli_model_observer_auto(cmd, &a.ma, &a.oa, &a.have_obs, rules_path, true)))
        goto done;
    if (strict && allow_partial) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--strict and --allow-partial exclude each other");
        goto done;
    }
    if (from_data && allow_partial) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--allow-partial goes with --table: a table made "
                      "from --data is the model's own");
        goto done;
    }
    if (table_out && (rc = cli_output_check(cmd, table_out)))
        goto done;
    qcal_onnx_qdq_options opt;
    qcal_onnx_qdq_options_default(&opt);
    opt.exclude = a.exclude;
    opt.n_exclude = a.n_exclude;
    opt.op_types = op_types;
    opt.strict = strict;
    if (profile && qcal_onnx_profile_parse(profile, &opt.profile) != QCAL_OK) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--profile: '%s' is not ort or tensorrt", profile);
        goto done;
    }
    if (wobs) {
        if (qcal_observer_kind_parse(wobs, &opt.weight_observer) != QCAL_OK ||
            (opt.weight_observer != QCAL_OBSERVER_PER_CHANNEL_MINMAX &&
             opt.weight_observer != QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX)) {
            rc = cli_fail(cmd, QCAL_EXIT_USAGE,
                          "--weight-observer: '%s' is not a per-channel observer (per_channel_minmax, moving_average_per_channel_minmax)",
                          wobs);
            goto done;
        }
    }
    if (wqs && (qcal_qscheme_parse(wqs, &opt.weight_qscheme) != QCAL_OK ||
                opt.weight_qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE,
                      "--weight-qscheme: '%s' is not per_channel_symmetric, per_channel_affine, per_tensor_affine or per_tensor_symmetric",
                      wqs);
        goto done;
    }
    if (wqs && float_weights) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-qscheme and --float-weights exclude each other");
        goto done;
    }
    if (opt.profile == QCAL_ONNX_PROFILE_TENSORRT &&
        (opt.weight_qscheme == QCAL_PER_TENSOR_AFFINE || opt.weight_qscheme == QCAL_PER_CHANNEL_AFFINE)) {
        rc = cli_fail(cmd, QCAL_EXIT_USAGE, "--weight-qscheme %s: profile tensorrt takes symmetric weights only", wqs);
        goto done;
    }
    opt.float_weights = float_weights;
    if ((rc = check_available(cmd)))
        goto done;
    qcal_calib_table *t = NULL;
    qcal_onnx_model *m = NULL;
    qcal_onnx_qdq_report rep = { 0 };
    qcal_model_calib_report mrep;
    memset(&mrep, 0, sizeof mrep);
    char version[64] = "";
    char *tbuf = NULL;
    size_t tlen = 0;
    cli_staged staged = { 0 };
    qcal_status st;
    if (!from_data && (st = qcal_calib_table_read_json(table_path, &t)) != QCAL_OK) {
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_READ), st);
        goto done;
    }
    if ((rc = cli_model_load(cmd, in, quiet, &m)))
        goto free;
    if (equalize) {
        qcal_onnx_equalize_options eo;
        qcal_onnx_equalize_options_default(&eo);
        qcal_onnx_equalize_report er = { 0 };
        if ((st = qcal_onnx_equalize(m, &eo, &er)) != QCAL_OK) {
            rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
            goto free;
        }
        if (!quiet)
            cli_note(cmd, "equalized %lld layer pair%s in %lld sweep%s (%lld chain%s left alone)",
                     (long long)er.n_pairs, er.n_pairs == 1 ? "" : "s", (long long)er.sweeps,
                     er.sweeps == 1 ? "" : "s", (long long)er.n_refused,
                     er.n_refused == 1 ? "" : "s");
        qcal_onnx_equalize_report_free(&er);
    }
    double t0 = cli_now();
    if (from_data) {
        if ((rc = qdq_calibrate(cmd, m, &a.ma, &opt, rules_path, &a.oa, a.have_obs, quiet, &t, &mrep,
                                version, sizeof version)))
            goto free;
        if (table_out) {
            if ((st = qcal_calib_table_format(t, QCAL_CALIB_FORMAT_JSON, NULL, &tbuf, &tlen)) != QCAL_OK) {
                rc = cli_fail_status(cmd, QCAL_EXIT_FAILURE, st);
                goto free;
            }
            if ((rc = cli_stage(cmd, &staged, table_out, tbuf, tlen)))
                goto free;
        }
    }
    if (!from_data && (rc = check_table_fits(cmd, m, t, table_path, &opt, allow_partial)))
        goto free;
    /* FP8 Q/DQ needs opset 19 (QuantizeLinear/DequantizeLinear-19): raised here, after every
     * check of the command line and the table and before qcal_onnx_qdq_save_file, whose contract
     * is that its checks run before the model changes (it refuses FP8 below 19). The model
     * is this process's copy: a later failure writes nothing. */
    if (table_has_fp8(t) && (rc = cli_model_raise(cmd, m, 19, quiet)))
        goto free;
    if (keep_float && (rc = qdq_keep_float(cmd, m, t, &opt, &a.ma, &a.aa, quiet, &kf)))
        goto free;
    if (kf.n_float) {
        /* the search's ops join the exclusions (escaped: each matches its node only) */
        const char **ex = realloc(a.exclude, (size_t)(a.n_exclude + kf.n_float + 1) * sizeof *ex);
        kf_ex = calloc((size_t)kf.n_float, sizeof *kf_ex);
        if (ex)
            a.exclude = ex;
        for (int64_t i = 0; ex && kf_ex && i < kf.n_float; i++)
            if ((kf_ex[i] = qcal_accuracy_keep_float_exclude(kf.float_ops[i])))
                a.exclude[a.n_exclude++] = kf_ex[i];
        if (!ex || !kf_ex || a.n_exclude != opt.n_exclude + kf.n_float) {
            rc = cli_fail(cmd, QCAL_EXIT_FAILURE, "out of memory");
            goto free;
        }
        opt.exclude = a.exclude;
        opt.n_exclude = a.n_exclude;
    }
    st = qcal_onnx_qdq_save_file(m, t, &opt, NULL, out, &rep);
    if (st != QCAL_OK) {   /* I/O and overflow are the output's (qcal/onnx.h) */
        rc = cli_fail_status(cmd, cli_exit_code(st, CLI_AT_QDQ), st);
        goto free;
    }
    if ((rc = cli_stage_commit(cmd, &staged)))
        goto free;
    cli_warn_clamped_scales(cmd, t);
    if (rep.n_missing) {
        /* A count (the whole list ran to kilobytes on real models); --verbose: the names. */
        cli_warn(cmd, "%lld %s missing from the table %s float%s", (long long)rep.n_missing,
                 CLI_PLURAL(rep.n_missing, "tensor", "tensors"),
                 CLI_PLURAL(rep.n_missing, "stays", "stay"),
                 verbose ? "" : " (--verbose lists them)");
        for (int64_t i = 0; verbose && i < rep.n_missing; i++)
            cli_note(cmd, "missing from the table: '%s'", rep.missing[i]);
    }
    if (rep.n_skipped && !quiet)
        note_skipped(cmd, &rep);
    printf("qcal: qdq: wrote %s (profile %s): %lld %s quantized, %lld %s, %lld %s, %lld int32 %s",
           out, qcal_onnx_profile_name(opt.profile), (long long)rep.ops, CLI_PLURAL(rep.ops, "op", "ops"),
           (long long)rep.tensors, CLI_PLURAL(rep.tensors, "activation", "activations"),
           (long long)rep.weights, CLI_PLURAL(rep.weights, "weight", "weights"),
           (long long)rep.biases, CLI_PLURAL(rep.biases, "bias", "biases"));
    if (from_data)
        printf("; calibrated in ONNX Runtime %s on %lld %s (%lld %s), %.1f s",
               version, (long long)mrep.samples, CLI_PLURAL(mrep.samples, "sample", "samples"),
               (long long)mrep.runs, CLI_PLURAL(mrep.runs, "run", "runs"), cli_now() - t0);
    if (from_data && a.ma.observer_auto) {
        char chosen[256];
        cli_model_chosen(&mrep, chosen, sizeof chosen);
        printf("; observer auto (the model run twice): %s", chosen);
    }
    printf("\n");
    if (from_data && a.ma.observer_auto)
        cli_model_auto_line(cmd, &mrep, stdout);
    if (keep_float)
        print_keep_float(&kf, &a.aa);
    rc = cli_flush(cmd, stdout);
free:
    for (int64_t i = 0; kf_ex && i < kf.n_float; i++)
        qcal_free(kf_ex[i]);
    free(kf_ex);
    qcal_accuracy_keep_float_result_free(&kf);
    cli_stage_abort(&staged);
    qcal_free(tbuf);
    qcal_onnx_qdq_report_free(&rep);
    qcal_onnx_model_destroy(&m);
    qcal_calib_table_destroy(&t);
done:
    onnx_args_free(&a);
    return rc;
}
