/* Session state files ("QCSS", docs/state.md): save, load, merge and digest of a whole
 * calibration session. Each entry's observer is stored in the observer state format
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

/* ---- reading ---- */

typedef struct parsed_entry {
    char *fqn;
    qcal_calib_role role;
    uint64_t elements;
    qcal_observer *obs;
} parsed_entry;

typedef struct parsed {
    parsed_entry *e;
    uint64_t n;
} parsed;

static void parsed_free(parsed *p)
{
    for (uint64_t i = 0; i < p->n; i++) {
        free(p->e[i].fqn);
        qcal_observer_destroy(&p->e[i].obs);
    }
    free(p->e);
    p->e = NULL;
    p->n = 0;
}

/* Entry order: fqn bytes (as strcmp), then role. */
static int cmp_key(const parsed_entry *a, const parsed_entry *b)
{
    int c = strcmp(a->fqn, b->fqn);
    if (c)
        return c;
    return (a->role > b->role) - (a->role < b->role);
}

static qcal_status parse_session(const void *buf, size_t len, parsed *out)
{
    memset(out, 0, sizeof *out);
    qcal_cursor cur = { .p = buf, .left = len };
    uint32_t magic, version;
    uint64_t count;
    if (!qcal_cur_u32(&cur, &magic) || magic != SESSION_MAGIC)
        return qcal_error(QCAL_ERR_FORMAT, "not a qcal session state (bad magic)");
    if (!qcal_cur_u32(&cur, &version))
        return qcal_error(QCAL_ERR_FORMAT, "session state is truncated in its header");
    if (version != SESSION_VERSION)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "session state version %u is not supported (this qcal reads "
                          "version %u)", (unsigned)version, SESSION_VERSION);
    if (!qcal_cur_u64(&cur, &count))
        return qcal_error(QCAL_ERR_FORMAT, "session state is truncated in its header");
    if (count > cur.left / MIN_ENTRY_BYTES)
        return qcal_error(QCAL_ERR_FORMAT, "session state claims %llu entries but holds %zu bytes",
                          (unsigned long long)count, cur.left);
    qcal_status st = QCAL_OK;
    if (count) {
        out->e = qcal_calloc((size_t)count, sizeof *out->e);
        if (!out->e)
            return QCAL_ERR_NO_MEMORY;
    }
    for (uint64_t i = 0; i < count; i++) {
        parsed_entry *e = &out->e[i];
        uint32_t n, role;
        uint64_t elements, slen;
        if (!qcal_cur_u32(&cur, &n)) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state is truncated at entry %llu",
                            (unsigned long long)i);
            goto fail;
        }
        if (n == 0 || n > MAX_FQN_BYTES || n > cur.left) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entry %llu: name length %u is "
                            "impossible (1..%u, %zu bytes left)", (unsigned long long)i,
                            (unsigned)n, MAX_FQN_BYTES, cur.left);
            goto fail;
        }
        if (memchr(cur.p, '\0', n)) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entry %llu: name holds a NUL byte",
                            (unsigned long long)i);
            goto fail;
        }
        e->fqn = qcal_malloc((size_t)n + 1);
        if (!e->fqn) {
            st = QCAL_ERR_NO_MEMORY;
            goto fail;
        }
        qcal_cur_read(&cur, e->fqn, n);
        e->fqn[n] = '\0';
        out->n = i + 1;
        if (!qcal_cur_u32(&cur, &role) || !qcal_cur_u64(&cur, &elements) ||
            !qcal_cur_u64(&cur, &slen)) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state is truncated at entry '%s'", e->fqn);
            goto fail;
        }
        if (role >= QCAL_CALIB_ROLE_COUNT) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entry '%s' has an unknown role %u",
                            e->fqn, (unsigned)role);
            goto fail;
        }
        e->role = (qcal_calib_role)role;
        e->elements = elements;
        if (i > 0 && cmp_key(&out->e[i - 1], e) >= 0) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entries are not in (name, role) "
                            "order or repeat: %s '%s' after %s '%s'",
                            qcal_calib_role_name(e->role), e->fqn,
                            qcal_calib_role_name(out->e[i - 1].role), out->e[i - 1].fqn);
            goto fail;
        }
        if (slen > cur.left) {
            st = qcal_error(QCAL_ERR_FORMAT, "session state entry '%s': observer state of %llu "
                            "bytes, only %zu left", e->fqn, (unsigned long long)slen, cur.left);
            goto fail;
        }
        qcal_cursor oc = { .p = cur.p, .left = (size_t)slen };
        st = qcal_observer_state_parse(&oc, &e->obs);
        if (st == QCAL_OK && oc.left != 0)
            st = qcal_error(QCAL_ERR_FORMAT, "%zu trailing bytes after the observer state",
                            oc.left);
        if (st != QCAL_OK) {
            if (st != QCAL_ERR_NO_MEMORY)
                st = qcal_calib_wrap_error(st, "session state %s '%s'",
                                           qcal_calib_role_name(e->role), e->fqn);
            goto fail;
        }
        cur.p += slen;
        cur.left -= (size_t)slen;
    }
    if (cur.left != 0) {
        st = qcal_error(QCAL_ERR_FORMAT, "session state has %zu trailing bytes", cur.left);
        goto fail;
    }
    return QCAL_OK;
fail:
    parsed_free(out);
    return st;
}

qcal_status qcal_calib_session_load(const void *buf, size_t len,
                                    const qcal_calib_session_options *opt,
                                    qcal_calib_session **out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "buffer or output is NULL");
    parsed p;
    qcal_status st = parse_session(buf, len, &p);
    if (st != QCAL_OK)
        return st;
    qcal_calib_session *s = NULL;
    st = qcal_calib_session_create(opt, &s);
    for (uint64_t i = 0; i < p.n && st == QCAL_OK; i++) {
        st = qcal_calib_session_adopt(s, p.e[i].fqn, p.e[i].role, p.e[i].obs, p.e[i].elements);
        p.e[i].obs = NULL;   /* owned by the session now (or destroyed on failure) */
    }
    parsed_free(&p);
    if (st != QCAL_OK) {
        qcal_calib_session_destroy(&s);
        return st;
    }
    *out = s;
    return QCAL_OK;
}

/* Merges parsed entries into dst: every entry is checked first, so a refused merge
 * (configs, moving averages, channel counts) changes nothing. */
static qcal_status merge_parsed(qcal_calib_session *dst, parsed *p)
{
    qcal_status st;
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < p->n; i++) {
            st = qcal_calib_session_merge_entry(dst, p->e[i].fqn, p->e[i].role, p->e[i].obs,
                                                p->e[i].elements, pass == 0);
            if (st != QCAL_OK)
                return st == QCAL_ERR_NO_MEMORY
                           ? st
                           : qcal_calib_wrap_error(st, "%s '%s'",
                                                   qcal_calib_role_name(p->e[i].role),
                                                   p->e[i].fqn);
        }
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
    parsed p;
    st = parse_session(buf, len, &p);
    qcal_free(buf);
    if (st != QCAL_OK)
        return st;
    st = merge_parsed(dst, &p);
    parsed_free(&p);
    return st;
}

qcal_status qcal_calib_session_merge_state(qcal_calib_session *dst, const void *buf, size_t len)
{
    if (!dst || !buf)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or buffer is NULL");
    qcal_status st = qcal_calib_session_flush(dst);
    if (st != QCAL_OK)
        return st;
    parsed p;
    if ((st = parse_session(buf, len, &p)) != QCAL_OK)
        return st;
    st = merge_parsed(dst, &p);
    parsed_free(&p);
    return st;
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
    qcal_status st = qcal_blob_read_file(path, "session state", &buf, &len);
    if (st != QCAL_OK)
        return st;
    st = qcal_calib_session_load(buf, len, opt, out);
    free(buf);
    if (st < 0 && st != QCAL_ERR_NO_MEMORY)
        st = qcal_calib_wrap_error(st, "'%s'", path);
    return st;
}
