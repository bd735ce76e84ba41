/* Progress reports of long subcommands (tools/cli_progress.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_progress.h"

static cli_progress *active;   /* the report whose bar cli_progress_interrupt erases */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, const char *cmd, bool on, bool tty)
{
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->on = on;
    p->tty = tty;
    p->t0 = p->last_line = now();
    p->interval = 10.0;
    const char *env = getenv("QCAL_PROGRESS_INTERVAL");
    if (env && *env) {
        char *end = NULL;
        double v = strtod(env, &end);
        if (end && !*end && v >= 0.0 && v < 1e9)
            p->interval = v;
    }
    p->phase = "working";
    p->unit = "";
    if (on)
        active = p;
}

static void draw(cli_progress *p, double t)
{
    const int width = 24;
    int fill = p->total > 0 ? (int)(p->done * width / p->total) : 0;
    if (fill > width)
        fill = width;
    long secs = (long)(t - p->t0);
    fprintf(stderr, "\r[%.*s%*s] %s %lld/%lld %s %ld:%02ld %.40s\033[K", fill,
            "########################", width - fill, "", p->phase, (long long)p->done,
            (long long)p->total, p->unit, secs / 60, secs % 60, p->item);
    fflush(stderr);
    p->drawn = true;
    p->last_draw = t;
}

static void line(cli_progress *p, double t, const char *what)
{
    fprintf(stderr, "qcal: %s: progress: %s%s %lld/%lld %s, %.1f s elapsed\n", p->cmd, what,
            p->phase, (long long)p->done, (long long)p->total, p->unit, t - p->t0);
    fflush(stderr);
    p->printed = true;
    p->last_line = t;
    p->line_phase = p->phase;
    p->line_done = p->done;
}

static void update(cli_progress *p, bool force)
{
    if (!p->on)
        return;
    double t = now();
    if (p->tty) {
        if (force || !p->drawn || t - p->last_draw >= 0.1 || p->done == p->total)
            draw(p, t);
    } else if (t - p->last_line >= p->interval &&
               (p->line_phase != p->phase || p->line_done != p->done)) {
        line(p, t, "");
    }
}

void cli_progress_phase(cli_progress *p, const char *phase, const char *unit, int64_t total)
{
    p->phase = phase;
    p->unit = unit;
    p->total = total;
    p->done = 0;
    p->item[0] = '\0';
    update(p, true);
}

void cli_progress_set(cli_progress *p, int64_t done, const char *item)
{
    p->done = done;
    snprintf(p->item, sizeof p->item, "%s", item ? item : "");
    update(p, false);
}

void cli_progress_cb(void *user, int64_t done, int64_t total, const char *item)
{
    cli_progress *p = user;
    p->total = total;
    cli_progress_set(p, done, item);
}

void cli_progress_end(cli_progress *p)
{
    if (active == p)
        active = NULL;
    if (!p->on)
        return;
    if (p->drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->drawn = false;
    } else if (p->printed) {
        line(p, now(), "done: ");
    }
    p->on = false;
}

void cli_progress_interrupt(void)
{
    if (active && active->drawn) {
        fputs("\r\033[K", stderr);
        active->drawn = false;
    }
}
