/* Session state files ("QCSS", docs/state.md): save, load, merge and digest of a whole
 * calibration session, and the session's table stamped with that digest. Each entry's observer is stored in the observer state format
 * ("QCOB"), entries in (fqn bytes, role) order, so equal sessions give equal bytes. */
#include <stdio.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "core/blob_file.h"
#include "core/sha256.h"
#include "observers/observer_state.h"

#define SESSION_MAGIC 0x53534351u /* "QCSS" little-endian */
#define SESSION_VERSION 1u
#define MAX_FQN_BYTES 4096u
/* Smallest possible entry: fqn length, 1 fqn byte, role, elements, state length, and an
 * observer state header (108 bytes). Bounds the entry count a file can claim. */
#define MIN_ENTRY_BYTES (4u + 1u + 4u + 8u + 8u + 108u)

typedef struct save_ctx {
    qcal_buf *b;
    bool canonical;
    uint64_t count;
} save_ctx;

static qcal_status save_entry(void *ctx, const char *fqn, qcal_calib_role role,
                              const qcal_observer *obs, uint64_t elements, uint64_t queued)
{
    save_ctx *c = ctx;
    if (queued)
        return qcal_error(QCAL_ERR_STATE,
                          "%s '%s' has %llu queued batches (steps waiting for earlier ones): "
                          "call qcal_calib_session_flush before saving",
                          qcal_calib_role_name(role), fqn, (unsigned long long)queued);
    size_t n = strlen(fqn);
    if (n > MAX_FQN_BYTES)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor name '%.40s...' is longer than %u bytes",
                          fqn, MAX_FQN_BYTES);
    qcal_buf_u32(c->b, (uint32_t)n);
    qcal_buf_append(c->b, fqn, n);
    qcal_buf_u32(c->b, (uint32_t)role);
    qcal_buf_u64(c->b, elements);
    size_t len_at = c->b->len;
    qcal_buf_u64(c->b, 0);
    size_t start = c->b->len;
    qcal_status st = qcal_observer_state_append(obs, c->b, c->canonical);
    if (st != QCAL_OK)
        return st;
    uint64_t len = (uint64_t)(c->b->len - start);
    memcpy(c->b->data + len_at, &len, 8);
    c->count++;
    return QCAL_OK;
}

/* Serialises s into b (canonical: every observer's batches written as 0). */
static qcal_status session_append(const qcal_calib_session *s, qcal_buf *b, bool canonical)
{
    qcal_buf_u32(b, SESSION_MAGIC);
    qcal_buf_u32(b, SESSION_VERSION);
    size_t count_at = b->len;
    qcal_buf_u64(b, 0);
    save_ctx c = { .b = b, .canonical = canonical };
    qcal_status st = qcal_calib_session_each(s, save_entry, &c);
    if (st != QCAL_OK)
        return st;
    if (b->failed)
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the session state buffer");
    memcpy(b->data + count_at, &c.count, 8);
    return QCAL_OK;
}

qcal_status qcal_calib_session_save(const qcal_calib_session *s, void **buf, size_t *len)
{
    if (!s || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or outputs are NULL");
    qcal_buf b = { 0 };
    qcal_status st = session_append(s, &b, false);
    if (st != QCAL_OK) {
        qcal_buf_free(&b);
        return st;
    }
    *buf = b.data;
    *len = b.len;
    return QCAL_OK;
}

qcal_status qcal_calib_session_digest(const qcal_calib_session *s, char hex[65])
{
    if (!s || !hex)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or output is NULL");
    qcal_buf b = { 0 };
    qcal_status st = session_append(s, &b, true);
    if (st == QCAL_OK)
        qcal_sha256_hex(b.data, b.len, hex);
    qcal_buf_free(&b);
    return st;
}

/* The table carries the digest of the state it was taken from, so it is made here, on the
 * session's snapshot (calib/session.c): session_state.c -> session.c, never back. */
qcal_status qcal_calib_session_table(qcal_calib_session *s, qcal_calib_table **out)
{
    if (!s || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or table output is NULL");
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_session_snapshot(s, &t);
    if (st != QCAL_OK)
        return st;
    /* The digest; left out ("") if another thread queued a batch meanwhile. */
    if (qcal_calib_session_digest(s, t->digest) != QCAL_OK)
        t->digest[0] = '\0';
    *out = t;
    return QCAL_OK;
}

/* ---- reading ----
 * One entry at a time: at most one entry's observer exists while reading, whatever the
 * entry count a file claims (a hostile file cannot make the reader hold them all). */

typedef struct reader {
    qcal_cursor cur;
    uint64_t count, index;
    char *prev_fqn;            /* previous entry's name, for the order check */
    qcal_calib_role prev_role;
} reader;

typedef struct entry_rec {
    char *fqn;
    qcal_calib_role role;
    uint64_t elements;
    qcal_observer *obs;
} entry_rec;

static void rec_free(entry_rec *e)
{
    free(e->fqn);
    e->fqn = NULL;
    qcal_observer_destroy(&e->obs);
}

static void reader_free(reader *r)
{
    free(r->prev_fqn);
    r->prev_fqn = NULL;
}

static qcal_status reader_open(reader *r, const void *buf, size_t len)
{
    memset(r, 0, sizeof *r);
    r->cur = (qcal_cursor){ .p = buf, .left = len };
    uint32_t magic, version;
    if (!qcal_cur_u32(&r->cur, &magic) || magic != SESSION_MAGIC)
        return qcal_error(QCAL_ERR_FORMAT, "not a qcal session state (bad magic)");
    if (!qcal_cur_u32(&r->cur, &version))
        return qcal_error(QCAL_ERR_FORMAT, "session state is truncated in its header");
    if (version != SESSION_VERSION)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "session state version %u is not supported (this qcal reads "
                          "version %u)", (unsigned)version, SESSION_VERSION);
    if (!qcal_cur_u64(&r->cur, &r->count))
        return qcal_error(QCAL_ERR_FORMAT, "session state is truncated in its header");
    if (r->count > r->cur.left / MIN_ENTRY_BYTES)
        return qcal_error(QCAL_ERR_FORMAT, "session state claims %llu entries but holds %zu bytes",
                          (unsigned long long)r->count, r->cur.left);
    return QCAL_OK;
}

/* Reads the next entry into *e (owned by the caller on success); *done when all were read
 * (then checks that nothing follows). */
static qcal_status reader_next(reader *r, entry_rec *e, bool *done)
{
    memset(e, 0, sizeof *e);
    if (r->index == r->count) {
        *done = true;
        if (r->cur.left != 0)
            return qcal_error(QCAL_ERR_FORMAT, "session state has %zu trailing bytes",
                              r->cur.left);
        return QCAL_OK;
    }
    *done = false;
    unsigned long long i = (unsigned long long)r->index;
    qcal_cursor *cur = &r->cur;
    uint32_t n, role;
    uint64_t slen;
    qcal_status st;
    if (!qcal_cur_u32(cur, &n))
        return qcal_error(QCAL_ERR_FORMAT, "session state is truncated at entry %llu", i);
    if (n == 0 || n > MAX_FQN_BYTES || n > cur->left)
        return qcal_error(QCAL_ERR_FORMAT, "session state entry %llu: name length %u is "
                          "impossible (1..%u, %zu bytes left)", i, (unsigned)n, MAX_FQN_BYTES,
                          cur->left);
    if (memchr(cur->p, '\0', n))
        return qcal_error(QCAL_ERR_FORMAT, "session state entry %llu: name holds a NUL byte", i);
    e->fqn = qcal_malloc((size_t)n + 1);
    if (!e->fqn)
        return QCAL_ERR_NO_MEMORY;
    qcal_cur_read(cur, e->fqn, n);
    e->fqn[n] = '\0';
    if (!qcal_cur_u32(cur, &role) || !qcal_cur_u64(cur, &e->elements) ||
        !qcal_cur_u64(cur, &slen)) {
        st = qcal_error(QCAL_ERR_FORMAT, "session state is truncated at entry '%s'", e->fqn);
        goto fail;
    }
    if (role >= QCAL_CALIB_ROLE_COUNT) {
        st = qcal_error(QCAL_ERR_FORMAT, "session state entry '%s' has an unknown role %u",
                        e->fqn, (unsigned)role);
        goto fail;
    }
    e->role = (qcal_calib_role)role;
    if (r->prev_fqn) {
        int c = strcmp(r->prev_fqn, e->fqn);
        if (c > 0 || (c == 0 && r->prev_role >= e->role)) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entries are not in (name, role) "
                            "order or repeat: %s '%s' after %s '%s'",
                            qcal_calib_role_name(e->role), e->fqn,
                            qcal_calib_role_name(r->prev_role), r->prev_fqn);
            goto fail;
        }
    }
    if (slen > cur->left) {
        st = qcal_error(QCAL_ERR_FORMAT, "session state entry '%s': observer state of %llu "
                        "bytes, only %zu left", e->fqn, (unsigned long long)slen, cur->left);
        goto fail;
    }
    qcal_cursor oc = { .p = cur->p, .left = (size_t)slen };
    st = qcal_observer_state_parse(&oc, &e->obs);
    if (st == QCAL_OK && oc.left != 0)
        st = qcal_error(QCAL_ERR_FORMAT, "%zu trailing bytes after the observer state", oc.left);
    if (st != QCAL_OK) {
        if (st != QCAL_ERR_NO_MEMORY)
            st = qcal_error_wrap(st, "session state %s '%s'",
                                 qcal_calib_role_name(e->role), e->fqn);
        goto fail;
    }
    cur->p += slen;
    cur->left -= (size_t)slen;
    char *keep = qcal_strndup(e->fqn, n);
    if (!keep) {
        st = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    free(r->prev_fqn);
    r->prev_fqn = keep;
    r->prev_role = e->role;
    r->index++;
    return QCAL_OK;
fail:
    rec_free(e);
    return st;
}

qcal_status qcal_calib_session_load(const void *buf, size_t len,
                                    const qcal_calib_session_options *opt,
                                    qcal_calib_session **out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "buffer or output is NULL");
    reader r;
    qcal_status st = reader_open(&r, buf, len);
    if (st != QCAL_OK)
        return st;
    qcal_calib_session *s = NULL;
    st = qcal_calib_session_create(opt, &s);
    bool done = false;
    while (st == QCAL_OK && !done) {
        entry_rec e;
        st = reader_next(&r, &e, &done);
        if (st == QCAL_OK && !done) {
            st = qcal_calib_session_adopt(s, e.fqn, e.role, e.obs, e.elements);
            e.obs = NULL;   /* owned by the session now (or destroyed on failure) */
            rec_free(&e);
        }
    }
    reader_free(&r);
    if (st != QCAL_OK) {
        qcal_calib_session_destroy(&s);
        return st;
    }
    *out = s;
    return QCAL_OK;
}

/* Merges a session state buffer into dst in two passes over it: the first reads and checks
 * every entry against dst (format, configs, moving averages, channel counts) and changes
 * nothing, the second merges. A refused merge leaves dst as it was. */
static qcal_status merge_buffer(qcal_calib_session *dst, const void *buf, size_t len)
{
    for (int pass = 0; pass < 2; pass++) {
        reader r;
        qcal_status st = reader_open(&r, buf, len);
        bool done = false;
        while (st == QCAL_OK && !done) {
            entry_rec e;
            st = reader_next(&r, &e, &done);
            if (st != QCAL_OK || done)
                break;
            st = qcal_calib_session_merge_entry(dst, e.fqn, e.role, e.obs, e.elements,
                                                pass == 0);
            if (st != QCAL_OK && st != QCAL_ERR_NO_MEMORY)
                st = qcal_error_wrap(st, "%s '%s'", qcal_calib_role_name(e.role), e.fqn);
            rec_free(&e);
        }
        reader_free(&r);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

qcal_status qcal_calib_session_merge(qcal_calib_session *dst, const qcal_calib_session *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session is NULL");
    if (dst == src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "cannot merge a session into itself");
    qcal_status st = qcal_calib_session_flush(dst);
    if (st != QCAL_OK)
        return st;
    void *buf = NULL;
    size_t len = 0;
    if ((st = qcal_calib_session_save(src, &buf, &len)) != QCAL_OK)
        return st;
    st = merge_buffer(dst, buf, len);
    qcal_free(buf);
    return st;
}

qcal_status qcal_calib_session_merge_state(qcal_calib_session *dst, const void *buf, size_t len)
{
    if (!dst || !buf)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or buffer is NULL");
    qcal_status st = qcal_calib_session_flush(dst);
    if (st != QCAL_OK)
        return st;
    return merge_buffer(dst, buf, len);
}

qcal_status qcal_calib_session_save_file(const qcal_calib_session *s, const char *path)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_calib_session_save(s, &buf, &len);
    if (st != QCAL_OK)
        return st;
    st = qcal_blob_write_file(path, buf, len);
    qcal_free(buf);
    return st;
}

qcal_status qcal_calib_session_load_file(const char *path, const qcal_calib_session_options *opt,
                                         qcal_calib_session **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "session state", SIZE_MAX, &buf, &len);
    if (st != QCAL_OK)
        return st;
    st = qcal_calib_session_load(buf, len, opt, out);
    free(buf);
    if (st < 0 && st != QCAL_ERR_NO_MEMORY)
        st = qcal_error_wrap(st, "'%s'", path);
    return st;
}
