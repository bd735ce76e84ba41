/* ONNX models written: protobuf-c packs into a sink that streams to an atomic file, copies
 * the initializers that lie in a file mapping file to file, fills lazy initializers when it
 * reaches them (onnx/save.h), moves large initializers to external data past 2 GiB, and hands
 * the written bytes to the kernel's writeback from a thread of its own. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx/save.h"
#include "qcal/atomic_file.h"

/* ---- save ---- */

/* Starts the writeback of a file's written bytes from a thread of its own, so that the
 * kernel's work of submitting them (ext4_writepages: 12% of `qdq --profile tensorrt`'s CPU
 * when called inline) runs beside the writing instead of between its writes. */
typedef struct writeback {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    uint64_t target;     /* bytes written and flushed so far (guarded by mu) */
    bool stop;           /* guarded by mu */
    bool running;
} writeback;

static void *writeback_main(void *arg)
{
    writeback *w = arg;
    uint64_t done = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->target == done && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->target == done)
            break;   /* stopped, nothing left */
        uint64_t to = w->target;
        pthread_mutex_unlock(&w->mu);
        (void)sync_file_range(w->fd, (off64_t)done, (off64_t)(to - done), SYNC_FILE_RANGE_WRITE);
        done = to;
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Starts the thread for a regular file (else, or when a thread cannot be made, the sink
 * starts the writeback itself). All signals are blocked in the thread. */
static void writeback_start(writeback *w, int fd)
{
    memset(w, 0, sizeof *w);
    w->fd = fd;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        return;
    if (pthread_cond_init(&w->cv, NULL) != 0) {
        pthread_mutex_destroy(&w->mu);
        return;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    w->running = pthread_create(&w->th, NULL, writeback_main, w) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!w->running) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
    }
}

static void writeback_post(writeback *w, uint64_t written)
{
    pthread_mutex_lock(&w->mu);
    w->target = written;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Lets the thread start what was posted last, then joins it. */
static void writeback_stop(writeback *w)
{
    if (!w->running)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->running = false;
}

typedef struct file_sink {
    ProtobufCBuffer base;
    FILE *fp;
    bool failed;
    uint64_t written;
    uint64_t kicked;     /* bytes handed to the kernel's writeback so far */
    const qcal_onnx_model *m;
    bool no_copy_range;  /* copy_file_range refused once: write everything */
    uint8_t *bounce;     /* SINK_BOUNCE + 8 KiB, or NULL (blobs then go through stdio) */
    writeback *wb;       /* the writeback thread, or NULL */
    struct lazy_set *lz; /* the save's lazy initializers */
} file_sink;

/* The lazy initializers of a save, found by the address of their bytes: protobuf-c appends a
 * bytes field's data as it lies, so the append that starts with raw_data.data is the
 * writer reaching that tensor. */
typedef struct lazy_slot {
    const uint8_t *data;       /* the tensor's raw_data when the save started */
    size_t i;                  /* its onnx_lazy */
} lazy_slot;

typedef struct lazy_set {
    const onnx_lazy *lazy;
    lazy_slot *slot;           /* n, sorted by data */
    bool *filled;              /* n, by onnx_lazy */
    size_t n, n_filled;
    qcal_status st;            /* the first failed fill (QCAL_OK: none) */
    char msg[1024];            /* its message */
} lazy_set;

static int cmp_slot(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const lazy_slot *)a)->data, y = (uintptr_t)((const lazy_slot *)b)->data;
    return x < y ? -1 : x > y;
}

static qcal_status lazy_set_init(lazy_set *z, const onnx_lazy *lazy, size_t n)
{
    memset(z, 0, sizeof *z);
    z->lazy = lazy;
    z->n = n;
    if (!n)
        return QCAL_OK;
    z->slot = malloc(n * sizeof *z->slot);
    z->filled = calloc(n, sizeof *z->filled);
    if (!z->slot || !z->filled)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const Onnx__TensorProto *t = lazy[i].t;
        if (!t || !lazy[i].fill || !t->raw_data.data || !t->raw_data.len)
            return qcal_error(QCAL_ERR_INVALID_ARG, "lazy initializer %zu has no bytes to fill", i);
        z->slot[i] = (lazy_slot){ t->raw_data.data, i };
    }
    qsort(z->slot, n, sizeof *z->slot, cmp_slot);
    for (size_t i = 1; i < n; i++)
        if (z->slot[i].data == z->slot[i - 1].data)
            return qcal_error(QCAL_ERR_INVALID_ARG, "two lazy initializers share their bytes");
    return QCAL_OK;
}

static void lazy_set_free(lazy_set *z)
{
    free(z->slot);
    free(z->filled);
}

/* Before an append of data: when data starts a lazy initializer not filled yet, its fill;
 * false when that failed (the sink has failed, z->st and z->msg say why). */
static bool lazy_reach(file_sink *s, const uint8_t *data)
{
    lazy_set *z = s->lz;
    size_t lo = 0, hi = z->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)z->slot[mid].data < (uintptr_t)data)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == z->n || z->slot[lo].data != data || z->filled[z->slot[lo].i])
        return true;
    const onnx_lazy *l = &z->lazy[z->slot[lo].i];
    qcal_status st = l->fill(l->ctx, l->t);
    if (st != QCAL_OK) {
        if (z->st == QCAL_OK) {
            z->st = st;
            snprintf(z->msg, sizeof z->msg, "%s", qcal_last_error());
        }
        s->failed = true;
        return false;
    }
    z->filled[z->slot[lo].i] = true;
    z->n_filled++;
    return true;
}

/* Size of the buffer large in-memory blobs are written through (see write_bounced). */
#define SINK_BOUNCE ((size_t)1 << 20)

/* Copies a blob from the source file to the output in the kernel (no pass through this
 * process's memory), at the output's current offset; false when the kernel refuses (a pipe,
 * another file system on old kernels): the caller writes the bytes instead. */
static bool copy_blob(file_sink *s, const uint8_t *data, size_t len)
{
    const onnx_src *src = onnx_src_of(s->m, data);
    if (!src || src->fd < 0)
        return false;
    if (fflush(s->fp) != 0) {
        s->failed = true;
        return true;
    }
    int fd = fileno(s->fp);
    loff_t in = (loff_t)(data - src->map);
    size_t done = 0;
    while (done < len) {
        ssize_t r = copy_file_range(src->fd, &in, fd, NULL, len - done, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            if (done == 0) {
                s->no_copy_range = true;
                return false;
            }
            s->failed = true;   /* part copied, then an error: give up on this output */
            return true;
        }
        done += (size_t)r;
    }
    return true;
}

#define SINK_KICK (UINT64_C(32) << 20)

/* Writes a large blob from this process's memory through the bounce buffer, 1 MiB at a time,
 * each piece placed at the file offset's position in its page: the kernel's copy into the
 * page cache then reads a buffer in cache, page-aligned with its target. On this project's VM
 * (AMD Zen 3), qdq of the 1 GiB bench model (0.25 GiB of int8 weights written) took medians of
 * 0.91-1.31 s of CPU writing straight from the weights' buffers and 0.80-0.88 s through a
 * 1 MiB buffer (three series of 6-12 interleaved runs). */
static void write_bounced(file_sink *s, const uint8_t *data, size_t len)
{
    if (fflush(s->fp) != 0) {
        s->failed = true;
        return;
    }
    int fd = fileno(s->fp);
    uint8_t *page = (uint8_t *)(((uintptr_t)s->bounce + 4095) & ~(uintptr_t)4095);
    size_t done = 0;
    while (done < len) {
        size_t n = len - done < SINK_BOUNCE ? len - done : SINK_BOUNCE;
        uint8_t *b = page + ((s->written + done) & 4095);
        onnx_copy_vec(b, data + done, n);
        size_t put = 0;
        while (put < n) {
            ssize_t r = write(fd, b + put, n - put);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                s->failed = true;
                return;
            }
            put += (size_t)r;
        }
        done += n;
    }
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
    file_sink *s = (file_sink *)b;
    if (s->failed || !len)
        return;
    if (s->lz->n && !lazy_reach(s, data))
        return;
    bool big = len >= ONNX_BLOB_MIN;
    bool in_map = big && !s->no_copy_range && onnx_in_map(s->m, data);
    if (!in_map || !copy_blob(s, data, len)) {
        if (big && s->bounce)
            write_bounced(s, data, len);
        else if (fwrite(data, 1, len, s->fp) != len)
            s->failed = true;
    }
    s->written += len;
    /* Start the writeback of every 32 MiB written (asynchronously), so the final fsync of
     * the atomic commit waits for the tail only, as a copy's background writeback would. */
    if (s->written - s->kicked >= SINK_KICK && fflush(s->fp) == 0) {
        int fd = fileno(s->fp);
        struct stat st;
        if (s->wb && s->wb->running)
            writeback_post(s->wb, s->written);
        else if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
            sync_file_range(fd, (off64_t)s->kicked, (off64_t)(s->written - s->kicked),
                            SYNC_FILE_RANGE_WRITE);
        s->kicked = s->written;
    }
}

/* One initializer moved to external data during a save, restored afterwards. */
typedef struct moved {
    Onnx__TensorProto *t;
    ProtobufCBinaryData raw;
    protobuf_c_boolean has_raw;
} moved;

static void restore_moved(moved *mv, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        Onnx__TensorProto *t = mv[i].t;
        for (size_t k = 0; k < t->n_external_data; k++)
            protobuf_c_message_free_unpacked(&t->external_data[k]->base, NULL);
        free(t->external_data);
        t->external_data = NULL;
        t->n_external_data = 0;
        t->has_data_location = 0;
        t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
        t->raw_data = mv[i].raw;
        t->has_raw_data = mv[i].has_raw;
    }
}

qcal_status qcal_onnx_model_save_file(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path)
{
    return onnx_model_save_lazy(m, opt, path, NULL, 0);
}

qcal_status onnx_model_save_lazy(qcal_onnx_model *m, const qcal_onnx_save_options *opt, const char *path,
                                 const onnx_lazy *lazy, size_t n_lazy)
{
    if (!m || !path || (n_lazy && !lazy))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_save_file: NULL argument");
    qcal_onnx_save_options o;
    qcal_onnx_save_options_default(&o);
    if (opt)
        o = *opt;
    Onnx__GraphProto *g = m->proto->graph;
    size_t size = protobuf_c_message_get_packed_size(&m->proto->base);
    moved *mv = NULL;
    size_t nmv = 0;
    qcal_status st = QCAL_OK;
    qcal_atomic_file data_file = { 0 };
    char *data_path = NULL;
    file_sink dsink;
    uint8_t *bounce = malloc(SINK_BOUNCE + 8192);   /* NULL: blobs go through stdio */
    lazy_set lz;
    if ((st = lazy_set_init(&lz, lazy, n_lazy)) != QCAL_OK)
        goto out;
    if (size > o.external_threshold) {
        /* External data: large raw initializers go to PATH.data (offsets 64-byte aligned). */
        size_t pl = strlen(path);
        data_path = malloc(pl + 6);
        mv = calloc(g->n_initializer ? g->n_initializer : 1, sizeof *mv);
        if (!data_path || !mv) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        snprintf(data_path, pl + 6, "%s.data", path);
        const char *base = strrchr(data_path, '/');
        base = base ? base + 1 : data_path;
        if ((st = qcal_atomic_file_open(&data_file, data_path)) != QCAL_OK)
            goto out;
        uint64_t total = 0;   /* what the loop below writes */
        for (size_t i = 0; i < g->n_initializer; i++) {
            const Onnx__TensorProto *t = g->initializer[i];
            if (t->raw_data.len && t->raw_data.len >= o.external_min_bytes)
                total += (64 - total % 64) % 64 + t->raw_data.len;
        }
        if ((st = qcal_atomic_file_reserve(&data_file, total)) != QCAL_OK)
            goto out;
        uint64_t off = 0;
        static const uint8_t zeros[64];
        dsink = (file_sink){ { sink_append }, data_file.fp, false, 0, 0, m, false, bounce, NULL, &lz };
        for (size_t i = 0; i < g->n_initializer; i++) {
            Onnx__TensorProto *t = g->initializer[i];
            if (!t->raw_data.len || t->raw_data.len < o.external_min_bytes)
                continue;
            size_t pad = (size_t)((64 - off % 64) % 64);
            sink_append(&dsink.base, pad, zeros);
            off += pad;
            sink_append(&dsink.base, t->raw_data.len, t->raw_data.data);
            if (dsink.failed)
                break;
            char ob[32], lb[32];
            snprintf(ob, sizeof ob, "%llu", (unsigned long long)off);
            snprintf(lb, sizeof lb, "%zu", t->raw_data.len);
            mv[nmv].t = t;
            mv[nmv].raw = t->raw_data;
            mv[nmv].has_raw = t->has_raw_data;
            nmv++;
            off += t->raw_data.len;
            t->raw_data.data = NULL;
            t->raw_data.len = 0;
            t->has_raw_data = 0;
            t->has_data_location = 1;
            t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
            if (!onnx_tensor_add_entry(t, "location", base) || !onnx_tensor_add_entry(t, "offset", ob) ||
                !onnx_tensor_add_entry(t, "length", lb)) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto out;
            }
        }
        if (lz.st != QCAL_OK) {
            st = qcal_error(lz.st, "%s", lz.msg);
            goto out;
        }
        if (dsink.failed || ferror(data_file.fp)) {
            st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", data_path, strerror(errno));
            goto out;
        }
        size = protobuf_c_message_get_packed_size(&m->proto->base);
        if (size > (UINT64_C(1) << 31) - 1) {
            st = qcal_error(QCAL_ERR_OVERFLOW,
                            "'%s': the model is %zu bytes even with its large initializers external (protobuf's limit is 2 GiB)",
                            path, size);
            goto out;
        }
    }
    qcal_atomic_file f;
    if ((st = qcal_atomic_file_open(&f, path)) != QCAL_OK)
        goto out;
    if ((st = qcal_atomic_file_reserve(&f, size)) != QCAL_OK) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    setvbuf(f.fp, NULL, _IOFBF, 1 << 20);
    writeback wb;
    writeback_start(&wb, fileno(f.fp));
    file_sink sink = { { sink_append }, f.fp, false, 0, 0, m, false, bounce, &wb, &lz };
    protobuf_c_message_pack_to_buffer(&m->proto->base, &sink.base);
    writeback_stop(&wb);
    /* Each lazy initializer must have reached a sink as itself (filled there): bytes copied
     * elsewhere first would have been written before they were final. */
    if (lz.st != QCAL_OK || (!sink.failed && lz.n_filled != lz.n)) {
        qcal_atomic_file_abort(&f);
        st = lz.st != QCAL_OK ? qcal_error(lz.st, "%s", lz.msg)
                              : qcal_error(QCAL_ERR_STATE, "'%s': %zu of %zu lazy initializers were written unfilled",
                                           path, lz.n - lz.n_filled, lz.n);
        goto out;
    }
    if (sink.failed || sink.written != size) {
        int e = errno;
        qcal_atomic_file_abort(&f);
        st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e));
        goto out;
    }
    /* Both files written and synced before either is renamed into place. */
    if ((st = qcal_atomic_file_flush(&f)) != QCAL_OK ||
        (data_path && (st = qcal_atomic_file_flush(&data_file)) != QCAL_OK)) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    if (data_path && (st = qcal_atomic_file_commit(&data_file)) != QCAL_OK) {
        qcal_atomic_file_abort(&f);
        goto out;
    }
    st = qcal_atomic_file_commit(&f);
out:
    qcal_atomic_file_abort(&data_file);
    restore_moved(mv, nmv);
    free(mv);
    free(data_path);
    free(bounce);
    lazy_set_free(&lz);
    return st;
}

qcal_status qcal_onnx_model_serialize(const qcal_onnx_model *m, void **buf, size_t *len)
{
    if (!m || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_model_serialize: NULL argument");
    size_t size = protobuf_c_message_get_packed_size(&m->proto->base);
    if (size > (UINT64_C(1) << 31) - 1)
        return qcal_error(QCAL_ERR_OVERFLOW, "the model is %zu bytes, over protobuf's 2 GiB", size);
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for %zu bytes", size);
    protobuf_c_message_pack(&m->proto->base, b);
    *buf = b;
    *len = size;
    return QCAL_OK;
}
