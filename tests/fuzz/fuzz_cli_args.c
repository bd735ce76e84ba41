/* libFuzzer target: the qcal command line. The CLI's sources are compiled into this target
 * with main renamed to qcal_cli_main (tests/fuzz/meson.build), so nothing is spawned.
 *
 * Input: arguments separated by NUL bytes (at most 64). The first byte picks the mode:
 *   even: the option layer alone: cli_next over a table holding every observer option and
 *         a few of the subcommands' own, then cli_observer_config and the strict number
 *         parsers on every value (contracts: one result per argument, no read past argv);
 *   odd:  the whole CLI, qcal_cli_main("qcal", args...), run with a private empty
 *         directory as working directory (the fuzzer's own is restored after each run). Arguments containing '/' are dropped and "-" is replaced, so every file
 *         name is relative to that directory; files a run created there are removed after
 *         it, so runs do not depend on each other. Exit codes must be one of the five
 *         documented ones. */
#include "tests/fuzz/fuzz_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal/npy.h"
#include "qcal/safetensors.h"
#include "tools/cli_common.h"

#include "tests/fuzz/fuzz_cli_main.h"
int LLVMFuzzerInitialize(int *argc, char ***argv);

enum { MAX_ARGS = 64 };
static char workdir[256];
static void make_pristine(void);
static void remove_dirs(void);
static int home_fd = -1;   /* the fuzzer's own working directory (corpus paths are relative) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* tmpfs when there is one: every output qcal writes is fsync'ed. */
    const char *tmp = getenv("TMPDIR");
    struct stat sb;
    if (!tmp || !*tmp)
        tmp = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(workdir, sizeof workdir, "%s/qcal-fuzz-cli-XXXXXX", tmp);
    home_fd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!mkdtemp(workdir) || home_fd < 0) {
        perror("fuzz_cli_args: cannot create a private directory");
        exit(1);
    }
    make_pristine();
    atexit(remove_dirs);
    return 0;
}

/* Removes every entry of directory dir (recursing into subdirectories), not dir itself. */
static void clean_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) {
            clean_dir(path);
            rmdir(path);
        }
    }
    closedir(d);
}

/* Small valid inputs every run starts from, so the fuzzer gets past "file not found":
 *   x.npy  float32 [2, 3] with a NaN       q.npy   uint8 [2, 3]
 *   w.safetensors  {"fc.weight": [2, 3], "b": [3]}
 *   d/     a calibration dump: d/conv1.npy [2, 3], d/fc.weight.npy [2, 3]
 *   r.txt  a rules file.
 * They are written once into a pristine directory (atomic writes fsync, which is slow) and
 * hard-linked into the working directory before each run; qcal replaces outputs by rename,
 * so a run cannot change the pristine copies. */
static char pristine[300];

static void make_pristine(void)
{
    snprintf(pristine, sizeof pristine, "%s.fixtures", workdir);
    FUZZ_CHECK(mkdir(pristine, 0700) == 0);
    char p[400];
    float x[6] = { -1.5f, 0.25f, 3.0f, __builtin_nanf(""), 7.5f, -0.125f };
    uint8_t q[6] = { 0, 1, 128, 255, 7, 9 };
    float w[6] = { 0.5f, -0.25f, 0.125f, 1.0f, -2.0f, 0.0f };
    const int64_t shape[2] = { 2, 3 };
    snprintf(p, sizeof p, "%s/x.npy", pristine);
    FUZZ_CHECK(qcal_npy_write(p, QCAL_NPY_F32, 2, shape, x) == QCAL_OK);
    snprintf(p, sizeof p, "%s/q.npy", pristine);
    FUZZ_CHECK(qcal_npy_write(p, QCAL_NPY_U8, 2, shape, q) == QCAL_OK);
    snprintf(p, sizeof p, "%s/conv1.npy", pristine);
    FUZZ_CHECK(qcal_npy_write(p, QCAL_NPY_F32, 2, shape, x) == QCAL_OK);
    snprintf(p, sizeof p, "%s/fc.weight.npy", pristine);
    FUZZ_CHECK(qcal_npy_write(p, QCAL_NPY_F32, 2, shape, w) == QCAL_OK);
    qcal_tensor t[2];
    FUZZ_CHECK(qcal_tensor_init(&t[0], w, 2, shape) == QCAL_OK);
    FUZZ_CHECK(qcal_tensor_init(&t[1], w, 1, shape + 1) == QCAL_OK);
    const char *names[2] = { "fc.weight", "b" };
    snprintf(p, sizeof p, "%s/w.safetensors", pristine);
    FUZZ_CHECK(qcal_safetensors_write_f32(p, 2, names, t, 0, NULL) == QCAL_OK);
    snprintf(p, sizeof p, "%s/r.txt", pristine);
    FILE *f = fopen(p, "w");
    FUZZ_CHECK(f != NULL);
    fputs("*.weight weight per_channel_minmax dtype=qint8 qscheme=per_channel_symmetric\n"
          "* activation histogram bins=64\n", f);
    fclose(f);
}

/* At exit: the private and the pristine directories go away. */
static void remove_dirs(void)
{
    clean_dir(workdir);
    rmdir(workdir);
    clean_dir(pristine);
    rmdir(pristine);
}

static void make_fixtures(void)
{
    static const char *const files[][2] = {
        { "x.npy", "x.npy" }, { "q.npy", "q.npy" }, { "w.safetensors", "w.safetensors" },
        { "r.txt", "r.txt" }, { "conv1.npy", "d/conv1.npy" }, { "fc.weight.npy", "d/fc.weight.npy" } };
    FUZZ_CHECK(mkdir("d", 0700) == 0);
    char src[400];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/%s", pristine, files[i][0]);
        FUZZ_CHECK(link(src, files[i][1]) == 0);
    }
}

static void run_option_layer(int argc, char **argv)
{
    enum { OPT_HELP = 1, OPT_OUT, OPT_FORMAT, OPT_SCALE, OPT_ZP, OPT_FLAG };
    static const cli_opt opts[] = {
        CLI_FLAG("help", 'h', OPT_HELP, NULL), CLI_OPT("output", 'o', OPT_OUT, NULL, NULL),
        CLI_OPT("format", 'f', OPT_FORMAT, NULL, NULL), CLI_OPT("scale", 0, OPT_SCALE, NULL, NULL),
        CLI_OPT("zero-point", 0, OPT_ZP, NULL, NULL), CLI_FLAG("flag", 'x', OPT_FLAG, NULL),
        CLI_OBSERVER_OPTS, { 0 } };
    cli_parser p;
    cli_parser_init(&p, argc, argv);
    cli_observer_args obs;
    memset(&obs, 0, sizeof obs);
    const char *val;
    int id, results = 0;
    bool failed = false;
    while ((id = cli_next(&p, opts, &val)) != CLI_END) {
        FUZZ_CHECK(++results <= argc);   /* each call consumes at least one argument */
        FUZZ_CHECK(p.i <= argc);
        if (id == CLI_ERROR) {
            failed = true;
            break;
        }
        FUZZ_CHECK(id == CLI_POSITIONAL || id > 0);
        if (id == CLI_POSITIONAL || id == OPT_FLAG || id == OPT_HELP)
            continue;
        FUZZ_CHECK(val != NULL);
        if (cli_observer_opt(&obs, id, val))
            continue;
        int64_t i64 = 0;
        double f64 = 0.0;
        float f32 = 0.0f;
        if (id == OPT_ZP && cli_parse_i64(p.cmd, "--zero-point", val, -1000, 1000, &i64) == 0)
            FUZZ_CHECK(i64 >= -1000 && i64 <= 1000);
        if (id == OPT_SCALE && cli_parse_f32(p.cmd, "--scale", val, &f32) == 0)
            FUZZ_CHECK(f32 == f32 && f32 - f32 == 0.0f);   /* finite */
        if (id == OPT_FORMAT && cli_parse_f64(p.cmd, "--format", val, &f64) == 0)
            FUZZ_CHECK(f64 - f64 == 0.0);
    }
    if (!failed) {
        qcal_observer_config cfg;
        if (cli_observer_config(p.cmd, &obs, QCAL_OBSERVER_MINMAX, &cfg) == 0) {
            qcal_observer *o = NULL;
            FUZZ_CHECK(qcal_observer_create(&cfg, &o) == QCAL_OK);   /* validated config */
            qcal_observer_destroy(&o);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    bool whole_cli = data[0] & 1;
    /* Copy into one NUL-terminated block and split it on NUL. */
    char *block = malloc(size + 1);
    if (!block)
        return 0;
    memcpy(block, data + 1, size - 1);
    block[size - 1] = '\0';
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = whole_cli ? "qcal" : "fuzzcmd";
    char *s = block, *end = block + (size - 1);
    while (s < end && argc < MAX_ARGS + 1) {
        size_t n = strlen(s);
        if (whole_cli && strchr(s, '/')) {
            /* dropped: would reach outside the private directory */
        } else if (whole_cli && !strcmp(s, "-")) {
            argv[argc++] = "stdin-is-not-read";
        } else {
            argv[argc++] = s;
        }
        s += n + 1;
    }
    argv[argc] = NULL;
    if (whole_cli) {
        FUZZ_CHECK(chdir(workdir) == 0);
        make_fixtures();
        int rc = qcal_cli_main(argc, argv);
        FUZZ_CHECK(rc >= QCAL_EXIT_OK && rc <= QCAL_EXIT_OUTPUT);
        fflush(stdout);
        clean_dir(".");
        FUZZ_CHECK(fchdir(home_fd) == 0);
    } else {
        run_option_layer(argc, argv);
    }
    free(block);
    return 0;
}
