/* ONNX Runtime through Node for the examples (see ort_node.h). */
#define _POSIX_C_SOURCE 200809L
#include "ort_node.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cnn.h"

/* The runner script: its source path when built by meson, else relative to the source root. */
#ifndef QCAL_ORT_RUNNER
#define QCAL_ORT_RUNNER "tests/ort/ort_run.cjs"
#endif

static void npm_dir(char *buf, size_t cap)
{
    const char *d = getenv("QCAL_NPM_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (d && *d)
        snprintf(buf, cap, "%s", d);
    else if (xdg && *xdg)
        snprintf(buf, cap, "%s/qcal/npm", xdg);
    else
        snprintf(buf, cap, "%s/.cache/qcal/npm", home && *home ? home : "/root");
}

/* Whether an executable `name` is on PATH. */
static bool on_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[4096], full[4200];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s", (int)n, path);
        snprintf(full, sizeof full, "%s/%s", n ? dir : ".", name);
        if (access(full, X_OK) == 0)
            return true;
        path += n + (path[n] == ':');
    }
    return false;
}

bool ort_node_available(char *why, size_t cap, char *version, size_t vcap)
{
    char dir[4096], pkg[4200];
    npm_dir(dir, sizeof dir);
    snprintf(pkg, sizeof pkg, "%s/node_modules/onnxruntime-node/package.json", dir);
    if (!on_path("node")) {
        snprintf(why, cap, "node not found (apt-get install nodejs npm; ./run.sh demo installs them)");
        return false;
    }
    FILE *f = fopen(pkg, "r");
    if (!f) {
        snprintf(why, cap, "onnxruntime-node not installed in %s (./run.sh demo installs it from npm)", dir);
        return false;
    }
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *v = strstr(text, "\"version\"");
    snprintf(version, vcap, "?");
    if (v && (v = strchr(v + 9, '"')) != NULL)
        snprintf(version, vcap, "%.*s", (int)strcspn(v + 1, "\""), v + 1);
    if (access(QCAL_ORT_RUNNER, R_OK) != 0) {
        snprintf(why, cap, "the runner %s is not there (run from the source tree)", QCAL_ORT_RUNNER);
        return false;
    }
    return true;
}

qcal_status ort_node_run(const char *model, const char *x_npy, const char *out_npy, const char *log_path,
                         int threads, double *secs)
{
    char nthreads[32];
    snprintf(nthreads, sizeof nthreads, "%d", threads > 0 ? threads : 1);
    const char *argv[] = {"node", QCAL_ORT_RUNNER, model, x_npy, "--out", out_npy, "--threads", nthreads,
                          "--precision", "high", NULL};
    double t0 = cnn_now();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execvp("node", (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return qcal_set_error(QCAL_ERR_IO, "cannot run node");
    *secs = cnn_now() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return qcal_set_error(QCAL_ERR_IO, "ONNX Runtime (node %s) failed with status %d: see %s", QCAL_ORT_RUNNER,
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1, log_path);
    return QCAL_OK;
}
