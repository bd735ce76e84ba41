/* Helpers shared by the test executables; see testutil.h. */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

char *tu_path(const char *dir, const char *name)
{
    static char bufs[8][8192];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
    return b;
}

void *tu_read_file_or_null(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0)
        buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        if (len)
            *len = (size_t)n;
    }
    return buf;
}

void *tu_read_file(const char *path, size_t *len)
{
    void *buf = tu_read_file_or_null(path, len);
    if (!buf)
        fail_msg("cannot read %s", path);
    return buf;
}

void tu_slurp(const char *path, char *dst, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(dst, 1, cap - 1, f) : 0;
    dst[n] = '\0';
    if (f)
        fclose(f);
}

void tu_write_bytes(const char *path, const void *src, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        fail_msg("cannot create %s", path);
    if (n)
        assert_int_equal(fwrite(src, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

int tu_count_entries(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!needle || strstr(e->d_name, needle))
            n++;
    }
    closedir(d);
    return n;
}

void tu_rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[8192];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%.4000s/%.255s", dir, e->d_name);
        if (unlink(p) != 0)
            tu_rm_tree(p);
    }
    closedir(d);
    rmdir(dir);
}

int tu_run(const char *bin, const char *const *args, const char *dir, char *out,
           size_t out_cap, char *err, size_t err_cap)
{
    const char *argv[64];
    int argc = 0;
    argv[argc++] = bin;
    for (int i = 0; args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    char out_path[8192], err_path[8192];
    snprintf(out_path, sizeof out_path, "%s/.stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/.stderr", dir);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0)
            _exit(127);
        dup2(o, 1);
        dup2(e, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    tu_slurp(out_path, out, out_cap);
    tu_slurp(err_path, err, err_cap);
    return WEXITSTATUS(status);
}

int tu_run_va(const char *bin, const char *first, va_list ap, const char *dir, char *out,
              size_t out_cap, char *err, size_t err_cap)
{
    const char *args[64];
    int n = 0;
    for (const char *a = first; a && n < 62; a = va_arg(ap, const char *))
        args[n++] = a;
    args[n] = NULL;
    return tu_run(bin, args, dir, out, out_cap, err, err_cap);
}

void tu_expect_one_line(const char *err, const char *prefix, const char *needle)
{
    size_t n = strlen(err);
    const char *nl = strchr(err, '\n');
    if (n == 0 || !nl || nl != err + n - 1 || strncmp(err, prefix, strlen(prefix)) != 0)
        fail_msg("stderr is not exactly one '%s' line: [%s]", prefix, err);
    if (needle && !strstr(err, needle))
        fail_msg("stderr [%s] lacks '%s'", err, needle);
    /* one prefix: "qcal: CMD: CMD: ..." or "qcal: CMD: CMD WORD: ..." never (docs/cli.md) */
    if (!strncmp(err, "qcal: ", 6)) {
        const char *cmd = err + 6;
        size_t len = strcspn(cmd, ": \n");
        if (cmd[len] == ':' && cmd[len + 1] == ' ' && !strncmp(cmd + len + 2, cmd, len) &&
            (cmd[2 * len + 2] == ':' || cmd[2 * len + 2] == ' '))
            fail_msg("doubled prefix: [%s]", err);
    }
}

tu_ref_file *tu_ref_load(const char *area, const char *file)
{
    const char *dir = getenv("QCAL_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", dir ? dir : "tests/data", area, file);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    tu_ref_file *r = calloc(1, sizeof *r);
    uint32_t len;
    while (fread(&len, 4, 1, f) == 1) {
        assert_true(r->n < 256 && len < 64);
        tu_ref_arr *a = &r->a[r->n++];
        assert_int_equal(fread(a->name, 1, len, f), len);
        a->name[len] = 0;
        assert_int_equal(fread(&a->kind, 1, 1, f), 1);
        assert_int_equal(fread(&a->count, 8, 1, f), 1);
        size_t es = a->kind == 'f' ? 4 : 8;
        a->data = malloc(a->count * es + 1);
        assert_int_equal(fread(a->data, es, a->count, f), a->count);
    }
    fclose(f);
    return r;
}

void tu_ref_free(tu_ref_file *r)
{
    for (int i = 0; i < r->n; i++)
        free(r->a[i].data);
    free(r);
}

const tu_ref_arr *tu_ref_get(const tu_ref_file *r, const char *fmt, ...)
{
    char name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->a[i].name, name))
            return &r->a[i];
    fail_msg("reference array %s missing", name);
    return NULL;
}

qcal_status tu_observer_qparams(const qcal_observer *obs, int64_t cap, float *scale,
                                int32_t *zero_point, float *zero_point_float, int64_t *n)
{
    qcal_qparams qp = {0};
    qcal_status st = qcal_observer_qparams(obs, &qp);
    if (st < 0)
        return st;
    if (qp.channels > cap)
        fail_msg("observer gave %lld channels, capacity %lld", (long long)qp.channels,
                 (long long)cap);
    for (int64_t c = 0; c < qp.channels; c++) {
        scale[c] = qcal_qparams_scale_at(&qp, c);
        if (zero_point)
            zero_point[c] = qcal_qparams_zero_point_at(&qp, c);
        if (zero_point_float)
            zero_point_float[c] = qcal_qparams_zero_point_float_at(&qp, c);
    }
    *n = qp.channels;
    qcal_qparams_free(&qp);
    return st;
}

qcal_status tu_fakequant_module_qparams(const qcal_fakequant_module *fq, int64_t cap,
                                        float *scale, int32_t *zero_point, int64_t *n)
{
    qcal_qparams qp = {0};
    qcal_status st = qcal_fakequant_module_qparams(fq, &qp);
    if (st < 0)
        return st;
    if (qp.channels > cap)
        fail_msg("fake-quantize gave %lld channels, capacity %lld", (long long)qp.channels,
                 (long long)cap);
    for (int64_t c = 0; c < qp.channels; c++) {
        scale[c] = qcal_qparams_scale_at(&qp, c);
        zero_point[c] = qcal_qparams_zero_point_at(&qp, c);
    }
    *n = qp.channels;
    qcal_qparams_free(&qp);
    return st;
}

#define TU_SLOTS 16
static qcal_qparams *tu_qslot(void)
{
    static qcal_qparams slots[TU_SLOTS];
    static int next;
    qcal_qparams *q = &slots[next];
    next = (next + 1) % TU_SLOTS;
    memset(q, 0, sizeof *q);
    return q;
}

qcal_tensor *tu_vec(const float *data, int64_t n)
{
    static qcal_tensor slots[TU_SLOTS];
    static int next;
    qcal_tensor *t = &slots[next];
    next = (next + 1) % TU_SLOTS;
    memset(t, 0, sizeof *t);
    t->data = data;
    t->ndim = 1;
    t->shape[0] = n;
    return t;
}

qcal_tensor_mut *tu_out(float *data, int64_t n)
{
    static qcal_tensor_mut slots[TU_SLOTS];
    static int next;
    qcal_tensor_mut *t = &slots[next];
    next = (next + 1) % TU_SLOTS;
    memset(t, 0, sizeof *t);
    t->data = data;
    t->ndim = 1;
    t->shape[0] = n;
    return t;
}

const qcal_qparams *tu_qp(qcal_dtype dtype, float scale, int32_t zero_point)
{
    qcal_qparams *q = tu_qslot();
    q->dtype = dtype;
    qcal_dtype_range(dtype, &q->quant_min, &q->quant_max);
    q->qscheme = QCAL_PER_TENSOR_AFFINE;
    q->channels = 1;
    q->scale = scale;
    q->zero_point = zero_point;
    q->zero_point_float = (float)zero_point;
    return q;
}

const qcal_qparams *tu_qpc(qcal_dtype dtype, int32_t axis, int64_t channels,
                           const float *scales, const int32_t *zero_points)
{
    qcal_qparams *q = tu_qslot();
    q->dtype = dtype;
    qcal_dtype_range(dtype, &q->quant_min, &q->quant_max);
    q->qscheme = QCAL_PER_CHANNEL_AFFINE;
    q->axis = axis;
    q->channels = channels;
    q->scales = scales;
    q->zero_points = zero_points;
    return q;
}

static qcal_dtype tu_narrowest(int64_t qmin, int64_t qmax)
{
    return qmin >= 0 && qmax <= 255 ? QCAL_QUINT8
           : qmin >= -128 && qmax <= 127 ? QCAL_QINT8 : QCAL_QINT32;
}

const qcal_qparams *tu_fq(float scale, int32_t zero_point, int64_t qmin, int64_t qmax)
{
    qcal_qparams *q = tu_qslot();
    q->dtype = tu_narrowest(qmin, qmax);
    q->quant_min = qmin;
    q->quant_max = qmax;
    q->qscheme = QCAL_PER_TENSOR_AFFINE;
    q->channels = 1;
    q->scale = scale;
    q->zero_point = zero_point;
    q->zero_point_float = (float)zero_point;
    return q;
}

static int64_t tu_channels(const qcal_tensor *t, int32_t axis)
{
    int32_t a;
    if (!t || qcal_tensor_axis(t, axis, &a) != QCAL_OK)
        return 1;
    return t->shape[a];
}

const qcal_qparams *tu_fqc(const qcal_tensor *t, int32_t axis, const float *scales,
                           const int32_t *zero_points, int64_t qmin, int64_t qmax)
{
    qcal_qparams *q = tu_qslot();
    q->dtype = tu_narrowest(qmin, qmax);
    q->quant_min = qmin;
    q->quant_max = qmax;
    q->qscheme = QCAL_PER_CHANNEL_AFFINE;
    q->axis = axis;
    q->channels = tu_channels(t, axis);
    q->scales = scales;
    q->zero_points = zero_points;
    return q;
}

const qcal_qparams *tu_lsq(float scale, float zero_point, int64_t qmin, int64_t qmax)
{
    qcal_qparams *q = (qcal_qparams *)tu_fq(scale, 0, qmin, qmax);
    q->zero_point_float = zero_point;
    return q;
}

const qcal_qparams *tu_lsqc(const qcal_tensor *t, int32_t axis, const float *scales,
                            const float *zero_points, int64_t qmin, int64_t qmax)
{
    qcal_qparams *q = (qcal_qparams *)tu_fqc(t, axis, scales, NULL, qmin, qmax);
    q->zero_points_float = zero_points;
    return q;
}

int64_t tu_numel(const qcal_tensor *t)
{
    int64_t n = 0;
    if (qcal_tensor_numel(t, &n) != QCAL_OK)
        fail_msg("bad tensor shape: %s", qcal_last_error());
    return n;
}

int tu_qcal_shv(const char *dir, char *out, size_t out_cap, char *err, size_t err_cap,
                const char *fmt, va_list ap)
{
    char args[8192], cmd[12288], path[4096];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >'%s/.out' 2>'%s/.err'", dir,
             getenv("QCAL_BIN"), args, dir, dir);
    int rc = system(cmd);
    assert_true(WIFEXITED(rc));
    snprintf(path, sizeof path, "%s/.out", dir);
    tu_slurp(path, out, out_cap);
    snprintf(path, sizeof path, "%s/.err", dir);
    tu_slurp(path, err, err_cap);
    return WEXITSTATUS(rc);
}
