/* Calibration session: one observer per (fqn, role), found through a hash map, fed by any
 * number of threads in a deterministic per-entry step order (contract in qcal/calib.h).
 *
 * Locking: a reader/writer lock guards the map (lookups share it, inserting a new entry
 * takes it exclusively); each entry has its own mutex guarding its observer, its step
 * bookkeeping and its pending queue. A thread never holds two entry mutexes, and takes an
 * entry mutex only while holding the map lock shared (or not at all), so there is no lock
 * order to violate. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "qcal/qparams.h"
#include "qcal/threads.h"
#include "qcal_config.h"

#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

/* A batch that arrived before its turn (data == NULL: an order-free observer already
 * applied it; the record only keeps the step bookkeeping). */
typedef struct pending {
    int64_t step;
    qcal_tensor t;     /* view of data */
    float *data;       /* owned copy, NULL for a record */
    uint64_t bytes;
} pending;

typedef struct entry {
    char *fqn;
    qcal_calib_role role;
    uint64_t hash;
    pthread_mutex_t mu;
    bool mu_ready;
    qcal_observer *obs;
    bool order_free;     /* qcal_observer_config_commutes: updates commute exactly */
    int64_t next_step;   /* every step below it was applied (or skipped by a flush) */
    int64_t auto_step;   /* next QCAL_STEP_AUTO number */
    pending *pend;       /* sorted by step, all > next_step */
    size_t npend, cappend;
    uint64_t elements;   /* elements of the applied batches */
} entry;

struct qcal_calib_session {
    qcal_calib_rules *rules;    /* private copy (NULL: defaults only) */
    uint64_t max_pending_bytes;
    uint64_t pending_bytes;     /* atomic */
    uint64_t max_memory;        /* 0: no limit */
    uint64_t state_bytes;       /* sum of the entries' estimated state (map lock held) */
    uint64_t extra_bytes;       /* the largest estimated peak above its entry's state */
    qcal_progress_fn progress;
    void *progress_user;
    pthread_rwlock_t lock;
    bool lock_ready;
    entry **slots;              /* open addressing, power-of-two capacity */
    size_t nslots;
    entry **list;               /* insertion order */
    size_t n, caplist;
};

void qcal_calib_session_options_default(qcal_calib_session_options *opt)
{
    if (!opt)
        return;
    opt->rules = NULL;
    opt->max_pending_bytes = (uint64_t)1 << 30;
    opt->max_memory = QCAL_CALIB_MAX_MEMORY_DEFAULT;
    opt->progress = NULL;
    opt->progress_user = NULL;
}

static uint64_t hash_name(const char *s, qcal_calib_role role)
{
    /* FNV-1a over the bytes, then the role; a final mix spreads the low bits. */
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    h = (h ^ (uint64_t)(role + 1)) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static void entry_drop_pending(qcal_calib_session *s, entry *e)
{
    for (size_t i = 0; i < e->npend; i++) {
        free(e->pend[i].data);
        __atomic_fetch_sub(&s->pending_bytes, e->pend[i].bytes, __ATOMIC_RELAXED);
    }
    e->npend = 0;
}

static void entry_free(qcal_calib_session *s, entry *e)
{
    if (!e)
        return;
    entry_drop_pending(s, e);
    free(e->pend);
    qcal_observer_destroy(&e->obs);
    if (e->mu_ready)
        pthread_mutex_destroy(&e->mu);
    free(e->fqn);
    free(e);
}

qcal_status qcal_calib_session_create(const qcal_calib_session_options *opt, qcal_calib_session **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session output is NULL");
    qcal_calib_session_options o;
    qcal_calib_session_options_default(&o);
    if (opt)
        o = *opt;
    qcal_status st;
    qcal_calib_session *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    s->max_pending_bytes = o.max_pending_bytes;
    s->max_memory = o.max_memory;
    s->progress = o.progress;
    s->progress_user = o.progress_user;
    if (pthread_rwlock_init(&s->lock, NULL) != 0) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot create the session lock");
        goto fail;
    }
    s->lock_ready = true;
    st = o.rules ? qcal_calib_rules_clone(o.rules, &s->rules) : QCAL_OK;
    if (st != QCAL_OK)
        goto fail;
    s->nslots = 64;
    s->slots = qcal_calloc(s->nslots, sizeof *s->slots);
    if (!s->slots) {
        st = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    *out = s;
    return QCAL_OK;
fail:
    qcal_calib_session_destroy(&s);
    return st;
}

void qcal_calib_session_destroy(qcal_calib_session **sp)
{
    if (!sp || !*sp)
        return;
    qcal_calib_session *s = *sp;
    for (size_t i = 0; i < s->n; i++)
        entry_free(s, s->list[i]);
    free(s->list);
    free(s->slots);
    qcal_calib_rules_destroy(&s->rules);
    if (s->lock_ready)
        pthread_rwlock_destroy(&s->lock);
    free(s);
    *sp = NULL;
}

/* Caller holds the map lock (shared or exclusive). */
static entry *find_locked(const qcal_calib_session *s, const char *fqn, qcal_calib_role role, uint64_t h)
{
    size_t mask = s->nslots - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        entry *e = s->slots[i];
        if (!e)
            return NULL;
        if (e->hash == h && e->role == role && !strcmp(e->fqn, fqn))
            return e;
    }
}

/* Caller holds the map lock exclusively; e is not in the map yet. */
static qcal_status insert_locked(qcal_calib_session *s, entry *e)
{
    if (s->n == s->caplist) {
        size_t cap = s->caplist ? s->caplist * 2 : 32;
        entry **l = realloc(s->list, cap * sizeof *l);
        if (!l)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the session to %zu entries", cap);
        s->list = l;
        s->caplist = cap;
    }
    if ((s->n + 1) * 2 > s->nslots) {
        size_t ns = s->nslots * 2;
        entry **slots = qcal_calloc(ns, sizeof *slots);
        if (!slots)
            return QCAL_ERR_NO_MEMORY;
        for (size_t i = 0; i < s->n; i++) {
            size_t j = (size_t)s->list[i]->hash & (ns - 1);
            while (slots[j])
                j = (j + 1) & (ns - 1);
            slots[j] = s->list[i];
        }
        free(s->slots);
        s->slots = slots;
        s->nslots = ns;
    }
    size_t j = (size_t)e->hash & (s->nslots - 1);
    while (s->slots[j])
        j = (j + 1) & (s->nslots - 1);
    s->slots[j] = e;
    s->list[s->n++] = e;
    return QCAL_OK;
}

/* A new entry for (fqn, role) that owns obs (obs is destroyed on failure). */
static qcal_status alloc_entry(const qcal_calib_session *s, const char *fqn, qcal_calib_role role,
                               uint64_t h, qcal_observer *obs, entry **out)
{
    qcal_status st;
    entry *e = qcal_calloc(1, sizeof *e);
    if (!e) {
        qcal_observer_destroy(&obs);
        return QCAL_ERR_NO_MEMORY;
    }
    e->obs = obs;
    e->fqn = qcal_strdup(fqn);
    if (!e->fqn) {
        st = QCAL_ERR_NO_MEMORY;
        goto fail;
    }
    e->role = role;
    e->hash = h;
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot create a lock for '%s'", fqn);
        goto fail;
    }
    e->mu_ready = true;
    e->order_free = qcal_observer_config_commutes(qcal_observer_get_config(obs));
    *out = e;
    return QCAL_OK;
fail:
    entry_free((qcal_calib_session *)s, e);
    return st;
}

/* "1.50 GiB" (binary units, as the CLI's --max-memory reads them). */
static void fmt_bytes(char *dst, size_t cap, uint64_t b)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(dst, cap, "%.2f GiB", (double)b / (double)((uint64_t)1 << 30));
    else
        snprintf(dst, cap, "%.1f MiB", (double)b / (double)((uint64_t)1 << 20));
}

/* Map lock held exclusively. */
static qcal_status new_entry(qcal_calib_session *s, const char *fqn, qcal_calib_role role, uint64_t h,
                             entry **out)
{
    qcal_observer_config cfg;
    qcal_status st = qcal_calib_rules_match(s->rules, fqn, role, &cfg, NULL);
    if (st != QCAL_OK)
        return st;
    uint64_t state = 0, peak = 0;
    if (qcal_observer_config_memory(&cfg, 1, &state, &peak) != QCAL_OK)
        state = peak = 0;   /* an unknown kind: qcal_observer_create says so below */
    uint64_t extra = peak - state > s->extra_bytes ? peak - state : s->extra_bytes;
    if (s->max_memory && s->state_bytes + state + extra > s->max_memory) {
        char need[32], lim[32];
        fmt_bytes(need, sizeof need, s->state_bytes + state + extra);
        fmt_bytes(lim, sizeof lim, s->max_memory);
        return qcal_error(QCAL_ERR_NO_MEMORY, "%s '%s': its %s observer (bins %d) would bring "
                          "the session's estimated memory to %s, over the limit of %s "
                          "(max_memory; qcal: --max-memory); raise the limit or use fewer bins",
                          qcal_calib_role_name(role), fqn, qcal_observer_kind_name(cfg.kind),
                          (int)cfg.bins, need, lim);
    }
    qcal_observer *obs = NULL;
    st = qcal_observer_create(&cfg, &obs);
    if (st != QCAL_OK)
        return qcal_error_wrap(st, "%s '%s'", qcal_calib_role_name(role), fqn);
    st = alloc_entry(s, fqn, role, h, obs, out);
    if (st == QCAL_OK) {
        s->state_bytes += state;
        s->extra_bytes = extra;
    }
    return st;
}

/* Applies x to the entry's observer (entry mutex held). */
static qcal_status apply(entry *e, int64_t step, const qcal_tensor *x)
{
    qcal_status st = qcal_observer_update(e->obs, x);
    if (st < 0)
        return qcal_error_wrap(st, "%s '%s' step %lld", qcal_calib_role_name(e->role), e->fqn,
                               (long long)step);
    int64_t n = 0;
    qcal_tensor_numel(x, &n);
    e->elements += (uint64_t)n;
    return QCAL_OK;
}

/* Applies consecutive queued steps starting at next_step (entry mutex held). Returns the
 * first failure; a failing batch is consumed (dropped) like an immediate one. */
static qcal_status drain(qcal_calib_session *s, entry *e)
{
    qcal_status first = QCAL_OK;
    size_t k = 0;
    while (k < e->npend && e->pend[k].step == e->next_step) {
        pending *p = &e->pend[k];
        if (p->data) {
            qcal_status st = apply(e, p->step, &p->t);
            if (st < 0 && first == QCAL_OK)
                first = st;
            free(p->data);
            __atomic_fetch_sub(&s->pending_bytes, p->bytes, __ATOMIC_RELAXED);
        }
        e->next_step++;
        k++;
    }
    if (k) {
        memmove(e->pend, e->pend + k, (e->npend - k) * sizeof *e->pend);
        e->npend -= k;
    }
    return first;
}

/* Index where step goes in the sorted queue; *dup if already there. */
static size_t pend_pos(const entry *e, int64_t step, bool *dup)
{
    size_t lo = 0, hi = e->npend;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->pend[mid].step < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    *dup = lo < e->npend && e->pend[lo].step == step;
    return lo;
}

static qcal_status enqueue(qcal_calib_session *s, entry *e, int64_t step, const qcal_tensor *x,
                           int64_t numel, size_t pos)
{
    if (e->npend == e->cappend) {
        size_t cap = e->cappend ? e->cappend * 2 : 8;
        pending *p = realloc(e->pend, cap * sizeof *p);
        if (!p)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot queue step %lld of '%s'",
                              (long long)step, e->fqn);
        e->pend = p;
        e->cappend = cap;
    }
    pending rec = { .step = step };
    if (!e->order_free) {
        uint64_t bytes = (uint64_t)numel * sizeof(float);
        uint64_t now = __atomic_add_fetch(&s->pending_bytes, bytes, __ATOMIC_RELAXED);
        if (now > s->max_pending_bytes) {
            __atomic_fetch_sub(&s->pending_bytes, bytes, __ATOMIC_RELAXED);
            return qcal_error(QCAL_ERR_NO_MEMORY,
                              "%s '%s' step %lld arrived before step %lld: queueing its %llu "
                              "bytes would exceed max_pending_bytes %llu",
                              qcal_calib_role_name(e->role), e->fqn, (long long)step,
                              (long long)e->next_step, (unsigned long long)bytes,
                              (unsigned long long)s->max_pending_bytes);
        }
        rec.data = malloc((size_t)bytes ? (size_t)bytes : 1);
        if (!rec.data) {
            __atomic_fetch_sub(&s->pending_bytes, bytes, __ATOMIC_RELAXED);
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot copy step %lld of '%s' (%llu bytes)",
                              (long long)step, e->fqn, (unsigned long long)bytes);
        }
        memcpy(rec.data, x->data, (size_t)bytes);
        rec.t = *x;
        rec.t.data = rec.data;
        rec.bytes = bytes;
    }
    memmove(e->pend + pos + 1, e->pend + pos, (e->npend - pos) * sizeof *e->pend);
    e->pend[pos] = rec;
    e->npend++;
    return QCAL_OK;
}

/* Finds or creates the entry; returns with the map lock held shared. */
static qcal_status lookup(qcal_calib_session *s, const char *fqn, qcal_calib_role role, entry **out)
{
    uint64_t h = hash_name(fqn, role);
    pthread_rwlock_rdlock(&s->lock);
    entry *e = find_locked(s, fqn, role, h);
    if (e) {
        *out = e;
        return QCAL_OK;
    }
    pthread_rwlock_unlock(&s->lock);
    pthread_rwlock_wrlock(&s->lock);
    qcal_status st = QCAL_OK;
    e = find_locked(s, fqn, role, h);
    if (!e) {
        st = new_entry(s, fqn, role, h, &e);
        if (st == QCAL_OK) {
            st = insert_locked(s, e);
            if (st != QCAL_OK)
                entry_free(s, e);
        }
    }
    pthread_rwlock_unlock(&s->lock);
    if (st != QCAL_OK)
        return st;
    /* Entries are never removed, so e stays valid; take the lock shared for the caller. */
    pthread_rwlock_rdlock(&s->lock);
    *out = e;
    return QCAL_OK;
}

qcal_status qcal_calib_session_observe(qcal_calib_session *s, const char *fqn, qcal_calib_role role,
                                 int64_t step, const qcal_tensor *x)
{
    if (!s || !fqn || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session, fqn or tensor is NULL");
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d for '%s'", (int)role, fqn);
    if (!*fqn)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor name is empty");
    if (step < 0 && step != QCAL_STEP_AUTO)
        return qcal_error(QCAL_ERR_INVALID_ARG, "step %lld of '%s' is negative",
                          (long long)step, fqn);
    int64_t numel;
    qcal_status st = qcal_tensor_numel(x, &numel);
    if (st != QCAL_OK)
        return st;
    if (numel == 0)
        return qcal_error(QCAL_ERR_EMPTY, "%s '%s': cannot observe an empty tensor",
                          qcal_calib_role_name(role), fqn);
    if (!x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s '%s': tensor data is NULL",
                          qcal_calib_role_name(role), fqn);
    entry *e;
    st = lookup(s, fqn, role, &e);
    if (st != QCAL_OK)
        return st;
    pthread_mutex_lock(&e->mu);
    if (step == QCAL_STEP_AUTO) {
        step = e->auto_step > e->next_step ? e->auto_step : e->next_step;
        if (e->npend && e->pend[e->npend - 1].step >= step)
            step = e->pend[e->npend - 1].step + 1;
    }
    bool dup = false;
    size_t pos = pend_pos(e, step, &dup);
    bool rejected = step < e->next_step || dup;
    if (rejected) {
        st = qcal_error(QCAL_ERR_INVALID_ARG,
                        "%s '%s': step %lld was already observed (steps are per tensor and "
                        "each may be fed once; the next expected is %lld)",
                        qcal_calib_role_name(role), fqn, (long long)step, (long long)e->next_step);
    } else if (step == e->next_step) {
        st = apply(e, step, x);
        e->next_step++;
        qcal_status st2 = drain(s, e);
        if (st == QCAL_OK)
            st = st2;
    } else if (e->order_free) {
        st = apply(e, step, x);
        qcal_status st2 = enqueue(s, e, step, x, numel, pos);
        if (st == QCAL_OK)
            st = st2;
    } else {
        st = enqueue(s, e, step, x, numel, pos);
    }
    if (!rejected && step >= e->auto_step)
        e->auto_step = step + 1;
    pthread_mutex_unlock(&e->mu);
    pthread_rwlock_unlock(&s->lock);
    return st;
}

qcal_status qcal_calib_session_observe_part(qcal_calib_session *s, const char *fqn,
                                            qcal_calib_role role, int64_t step,
                                            const qcal_tensor *x, bool last)
{
    if (!s || !fqn || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session, fqn or tensor is NULL");
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d for '%s'", (int)role, fqn);
    if (!*fqn)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor name is empty");
    if (step < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "step %lld of '%s': parts of a batch need an "
                          "explicit step (>= 0)", (long long)step, fqn);
    int64_t numel;
    qcal_status st = qcal_tensor_numel(x, &numel);
    if (st != QCAL_OK)
        return st;
    if (numel == 0)
        return qcal_error(QCAL_ERR_EMPTY, "%s '%s': cannot observe an empty tensor",
                          qcal_calib_role_name(role), fqn);
    if (!x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s '%s': tensor data is NULL",
                          qcal_calib_role_name(role), fqn);
    entry *e;
    st = lookup(s, fqn, role, &e);
    if (st != QCAL_OK)
        return st;
    pthread_mutex_lock(&e->mu);
    bool dup = false;
    size_t pos = pend_pos(e, step, &dup);
    if (!qcal_observer_config_splits(qcal_observer_get_config(e->obs))) {
        st = qcal_error(QCAL_ERR_UNSUPPORTED, "%s '%s': its %s observer takes whole batches "
                        "only (qcal_observer_config_splits)", qcal_calib_role_name(role), fqn,
                        qcal_observer_kind_name(qcal_observer_get_config(e->obs)->kind));
    } else if (step < e->next_step || dup) {
        st = qcal_error(QCAL_ERR_INVALID_ARG,
                        "%s '%s': step %lld was already observed (steps are per tensor and "
                        "each may be fed once; the next expected is %lld)",
                        qcal_calib_role_name(role), fqn, (long long)step,
                        (long long)e->next_step);
    } else {
        /* The observer commutes (it splits), so a part is applied at once whatever its
         * step; the step's bookkeeping happens with its last part, as for a whole batch. */
        st = qcal_observer_update_part(e->obs, x, last);
        if (st < 0) {
            st = qcal_error_wrap(st, "%s '%s' step %lld", qcal_calib_role_name(e->role),
                                 e->fqn, (long long)step);
        } else {
            e->elements += (uint64_t)numel;
            qcal_status st2 = QCAL_OK;
            if (last && step == e->next_step) {
                e->next_step++;
                st2 = drain(s, e);
            } else if (last) {
                st2 = enqueue(s, e, step, x, numel, pos);
            }
            if (st == QCAL_OK)
                st = st2;
            if (last && step >= e->auto_step)
                e->auto_step = step + 1;
        }
    }
    pthread_mutex_unlock(&e->mu);
    pthread_rwlock_unlock(&s->lock);
    return st;
}

/* Applies everything queued in step order (entry mutex held). */
static qcal_status flush_entry(qcal_calib_session *s, entry *e)
{
    qcal_status first = QCAL_OK;
    while (e->npend) {
        e->next_step = e->pend[0].step;
        qcal_status st = drain(s, e);
        if (st < 0 && first == QCAL_OK)
            first = st;
    }
    return first;
}

qcal_status qcal_calib_session_flush(qcal_calib_session *s)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session is NULL");
    qcal_status first = QCAL_OK;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n; i++) {
        entry *e = s->list[i];
        pthread_mutex_lock(&e->mu);
        qcal_status st = flush_entry(s, e);
        pthread_mutex_unlock(&e->mu);
        if (st < 0 && first == QCAL_OK)
            first = st;
    }
    pthread_rwlock_unlock(&s->lock);
    return first;
}

qcal_status qcal_calib_session_count(const qcal_calib_session *cs, int64_t *n)
{
    if (!cs || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or output is NULL");
    /* The lock is bookkeeping, not data: taking it on a const session is how readers
     * serialise with writers (as qcal_calib_session_each). */
    qcal_calib_session *s = (qcal_calib_session *)cs;
    pthread_rwlock_rdlock(&s->lock);
    *n = (int64_t)s->n;
    pthread_rwlock_unlock(&s->lock);
    return QCAL_OK;
}

qcal_status qcal_calib_session_stats(const qcal_calib_session *cs, const char *fqn,
                                     qcal_calib_role role, uint64_t *batches,
                                     uint64_t *elements, uint64_t *nonfinite,
                                     uint64_t *pending_out)
{
    if (!cs || !fqn)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session or fqn is NULL");
    /* Locks taken on a const session, as qcal_calib_session_count. */
    qcal_calib_session *s = (qcal_calib_session *)cs;
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
    pthread_rwlock_rdlock(&s->lock);
    entry *e = find_locked(s, fqn, role, hash_name(fqn, role));
    if (!e) {
        pthread_rwlock_unlock(&s->lock);
        return qcal_error(QCAL_ERR_NOT_FOUND, "no %s named '%s' in the session",
                          qcal_calib_role_name(role), fqn);
    }
    pthread_mutex_lock(&e->mu);
    uint64_t b = 0, nf = 0, np = 0;
    qcal_observer_batches(e->obs, &b);
    qcal_observer_nonfinite(e->obs, &nf);
    for (size_t i = 0; i < e->npend; i++)
        np += e->pend[i].data != NULL;
    if (batches)
        *batches = b;
    if (elements)
        *elements = e->elements;
    if (nonfinite)
        *nonfinite = nf;
    if (pending_out)
        *pending_out = np;
    pthread_mutex_unlock(&e->mu);
    pthread_rwlock_unlock(&s->lock);
    return QCAL_OK;
}

/* Snapshot of one entry into a table entry (entry mutex held). */
static qcal_status snapshot(entry *e, qcal_calib_entry *out)
{
    const qcal_observer_config *cfg = qcal_observer_get_config(e->obs);
    int64_t ch = 0;
    qcal_status st = qcal_observer_channels(e->obs, &ch);
    if (st != QCAL_OK)
        return st;
    if (ch < 1)
        ch = 1;
    memset(out, 0, sizeof *out);
    float *mn = qcal_malloc((size_t)ch * 2 * sizeof *mn);
    if (!mn)
        return QCAL_ERR_NO_MEMORY;
    float *mx = mn + ch;
    int64_t got = 0;
    st = qcal_observer_qrange(e->obs, ch, mn, mx, &got);
    bool no_data = st == QCAL_NO_DATA;
    if (no_data) {
        got = 1;
        mn[0] = INFINITY;
        mx[0] = -INFINITY;
        st = QCAL_OK;
    }
    if (st == QCAL_OK)
        st = qcal_calib_entry_alloc(out, e->fqn, got);
    if (st != QCAL_OK) {
        free(mn);
        return qcal_error_wrap(st, "%s '%s'", qcal_calib_role_name(e->role), e->fqn);
    }
    qcal_calib_entry_arrays a;
    qcal_calib_entry_arrays_get(out, &a);
    memcpy(a.min_val, mn, (size_t)got * sizeof *mn);
    memcpy(a.max_val, mx, (size_t)got * sizeof *mx);
    free(mn);
    if (no_data) {
        out->no_data = true;
        a.scale[0] = 1.0f;
        a.zero_point[0] = 0;
        a.zero_point_float[0] = 0.0f;
    } else {
        /* Channel by channel (the formula is element-wise), so that a channel that saw no
         * finite value gets scale 1, zero-point 0 as an empty observer does, instead of
         * failing the whole table. */
        bool any = false;
        for (int64_t c = 0; c < got && st >= 0; c++) {
            st = qcal_qparams_compute_arrays(&cfg->q, 1, a.min_val + c, a.max_val + c,
                                             a.scale + c, a.zero_point + c,
                                             a.zero_point_float + c);
            any |= st == QCAL_OK;
        }
        if (st >= 0) {
            out->no_data = !any;
            st = QCAL_OK;
        }
    }
    if (st != QCAL_OK) {
        st = qcal_error_wrap(st, "%s '%s'", qcal_calib_role_name(e->role), e->fqn);
        qcal_calib_entry_free(out);
        return st;
    }
    out->role = e->role;
    out->observer = cfg->kind;
    out->qparams.dtype = cfg->q.dtype;
    out->qparams.qscheme = cfg->q.qscheme;
    if (qcal_dtype_is_float8(cfg->q.dtype))   /* FP8 is symmetric (docs/fp8.md) */
        out->qparams.qscheme = qcal_qscheme_is_per_channel(cfg->q.qscheme)
                                   ? QCAL_PER_CHANNEL_SYMMETRIC
                                   : QCAL_PER_TENSOR_SYMMETRIC;
    out->qparams.axis = qcal_qscheme_is_per_channel(cfg->q.qscheme) ? cfg->axis : 0;
    int64_t qmin = 0, qmax = 0;
    qcal_qconfig_range(&cfg->q, &qmin, &qmax);
    out->qparams.quant_min = qmin;
    out->qparams.quant_max = qmax;
    qcal_calib_entry_finish(out);
    qcal_observer_batches(e->obs, &out->batches);
    qcal_observer_nonfinite(e->obs, &out->nonfinite);
    out->elements = e->elements;
    return QCAL_OK;
}

/* Whether an entry's qparams come from a search over its histogram (milliseconds for 2048
 * bins), not from its min and max. */
static bool searches(const entry *e)
{
    qcal_observer_kind k = qcal_observer_get_config(e->obs)->kind;
    return k == QCAL_OBSERVER_HISTOGRAM || k == QCAL_OBSERVER_ENTROPY || k == QCAL_OBSERVER_MSE;
}

qcal_status qcal_calib_session_snapshot(qcal_calib_session *s, qcal_calib_table **out)
{
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_table_new(&t);
    if (st != QCAL_OK)
        return st;
    pthread_rwlock_rdlock(&s->lock);
    size_t n = s->n, nsearch = 0;
    for (size_t i = 0; i < n && st == QCAL_OK; i++) {
        entry *e = s->list[i];
        pthread_mutex_lock(&e->mu);
        st = flush_entry(s, e);
        nsearch += searches(e);
        pthread_mutex_unlock(&e->mu);
    }
    /* The entries' qparams, independent of each other: on several threads when two or more
     * come from a search (a model's calibration ends with one per tensor: 28 ms of a 0.34 s
     * MobileNet run on one thread). Each entry's numbers do not depend on the thread that
     * computes it; the table is filled in entry order, the first failure in that order
     * reported, with its message, on the calling thread. */
    qcal_calib_entry *ce = st == QCAL_OK && n ? qcal_calloc(n, sizeof *ce) : NULL;
    if (st == QCAL_OK && n && !ce)
        st = QCAL_ERR_NO_MEMORY;
    size_t fail_at = n, done = 0, reported = 0;
    qcal_status fail_st = QCAL_OK;
    char fail_msg[1024] = "";
    int threads = 1;
#if QCAL_HAVE_OPENMP
    if (nsearch >= 2 && !omp_in_parallel()) {
        threads = qcal_threads_count();
        if ((size_t)threads > nsearch)
            threads = (int)nsearch;
    }
#endif
    if (st == QCAL_OK) {
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
#endif
        for (size_t i = 0; i < n; i++) {
            entry *e = s->list[i];
            pthread_mutex_lock(&e->mu);
            qcal_status r = snapshot(e, &ce[i]);
            pthread_mutex_unlock(&e->mu);
            if (r != QCAL_OK) {
#if QCAL_HAVE_OPENMP
#pragma omp critical(qcal_session_snapshot)
#endif
                if (i < fail_at) {
#if QCAL_HAVE_OPENMP
#pragma omp atomic write
#endif
                    fail_at = i;
                    fail_st = r;
                    snprintf(fail_msg, sizeof fail_msg, "%s", qcal_last_error());
                }
            }
            size_t d;
#if QCAL_HAVE_OPENMP
#pragma omp atomic capture
#endif
            d = ++done;
            /* Progress from the calling thread only (a callback need not be thread-safe). */
            bool caller = true;
#if QCAL_HAVE_OPENMP
            caller = omp_get_thread_num() == 0;
#endif
            size_t failed;
#if QCAL_HAVE_OPENMP
#pragma omp atomic read
#endif
            failed = fail_at;
            /* Every count once, in order (what others finished meanwhile, then this). */
            for (; caller && s->progress && failed == n && reported < d; reported++)
                s->progress(s->progress_user, (int64_t)reported + 1, (int64_t)n, e->fqn);
        }
    }
    for (size_t i = 0; ce && i < n; i++) {
        if (st == QCAL_OK && i < fail_at)
            st = qcal_calib_table_push(t, &ce[i]);   /* takes the entry's arrays */
        else
            qcal_calib_entry_free(&ce[i]);
    }
    if (st == QCAL_OK && fail_at < n)
        st = *fail_msg ? qcal_error(fail_st, "%s", fail_msg) : fail_st;
    for (; st == QCAL_OK && s->progress && reported < n; reported++)
        s->progress(s->progress_user, (int64_t)reported + 1, (int64_t)n, s->list[n - 1]->fqn);
    free(ce);
    pthread_rwlock_unlock(&s->lock);
    if (st == QCAL_OK)
        st = qcal_calib_table_sort(t);
    if (st != QCAL_OK) {
        qcal_calib_table_destroy(&t);
        return st;
    }
    *out = t;
    return QCAL_OK;
}

/* ---- Internal access for the state code (calib/session_state.c) ---------------------- */

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    int c = strcmp(x->fqn, y->fqn);
    if (c)
        return c;
    return (x->role > y->role) - (x->role < y->role);
}

qcal_status qcal_calib_session_each(const qcal_calib_session *cs, qcal_calib_entry_fn fn,
                                    void *ctx)
{
    /* The locks are the session's internal bookkeeping: taking them on a const session is
     * how every reader (stats, table) serialises with writers. */
    qcal_calib_session *s = (qcal_calib_session *)cs;
    pthread_rwlock_rdlock(&s->lock);
    entry **order = s->n ? qcal_malloc(s->n * sizeof *order) : NULL;
    if (s->n && !order) {
        pthread_rwlock_unlock(&s->lock);
        return QCAL_ERR_NO_MEMORY;
    }
    if (s->n) {
        memcpy(order, s->list, s->n * sizeof *order);
        qsort(order, s->n, sizeof *order, cmp_entry);
    }
    qcal_status st = QCAL_OK;
    for (size_t i = 0; i < s->n && st == QCAL_OK; i++) {
        entry *e = order[i];
        pthread_mutex_lock(&e->mu);
        uint64_t queued = 0;
        for (size_t k = 0; k < e->npend; k++)
            queued += e->pend[k].data != NULL;
        st = fn(ctx, e->fqn, e->role, e->obs, e->elements, queued);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_rwlock_unlock(&s->lock);
    free(order);
    return st;
}

qcal_status qcal_calib_session_adopt(qcal_calib_session *s, const char *fqn, qcal_calib_role role,
                                     qcal_observer *obs, uint64_t elements)
{
    uint64_t h = hash_name(fqn, role);
    pthread_rwlock_wrlock(&s->lock);
    qcal_status st;
    entry *e = find_locked(s, fqn, role, h);
    if (e) {
        qcal_observer_destroy(&obs);
        st = qcal_error(QCAL_ERR_INVALID_ARG, "the session already has %s '%s'",
                        qcal_calib_role_name(role), fqn);
    } else if ((st = alloc_entry(s, fqn, role, h, obs, &e)) == QCAL_OK) {
        e->elements = elements;
        st = insert_locked(s, e);
        if (st != QCAL_OK) {
            entry_free(s, e);
        } else {
            /* Counted toward max_memory (never refused: the data is already held). */
            uint64_t state = 0, peak = 0;
            if (qcal_observer_config_memory(qcal_observer_get_config(e->obs), 1, &state,
                                            &peak) == QCAL_OK) {
                s->state_bytes += state;
                if (peak - state > s->extra_bytes)
                    s->extra_bytes = peak - state;
            }
        }
    }
    pthread_rwlock_unlock(&s->lock);
    return st;
}

qcal_status qcal_calib_session_merge_entry(qcal_calib_session *s, const char *fqn,
                                           qcal_calib_role role, const qcal_observer *src,
                                           uint64_t elements, bool dry_run)
{
    uint64_t h = hash_name(fqn, role);
    for (;;) {
        pthread_rwlock_rdlock(&s->lock);
        entry *e = find_locked(s, fqn, role, h);
        qcal_status st = QCAL_OK;
        if (e) {
            pthread_mutex_lock(&e->mu);
            st = dry_run ? qcal_observer_merge_check(e->obs, src)
                         : qcal_observer_merge(e->obs, src);
            if (st == QCAL_OK && !dry_run)
                e->elements += elements;
            pthread_mutex_unlock(&e->mu);
        }
        pthread_rwlock_unlock(&s->lock);
        if (e || dry_run)
            return st;
        /* Not in the session: a copy of src becomes the entry (src stays the caller's). */
        void *buf = NULL;
        size_t len = 0;
        qcal_observer *copy = NULL;
        st = qcal_observer_save(src, &buf, &len);
        if (st == QCAL_OK)
            st = qcal_observer_load(buf, len, &copy);
        qcal_free(buf);
        if (st != QCAL_OK)
            return st;
        st = qcal_calib_session_adopt(s, fqn, role, copy, elements);
        if (st == QCAL_ERR_INVALID_ARG) {
            /* Another thread created the entry meanwhile (copy destroyed): merge into it. */
            pthread_rwlock_rdlock(&s->lock);
            bool raced = find_locked(s, fqn, role, h) != NULL;
            pthread_rwlock_unlock(&s->lock);
            if (raced)
                continue;
        }
        return st;
    }
}

qcal_status qcal_calib_session_merge_observer(qcal_calib_session *s, const char *fqn,
                                              qcal_calib_role role, const qcal_observer *obs,
                                              uint64_t elements)
{
    if (!s || !fqn || !obs)
        return qcal_error(QCAL_ERR_INVALID_ARG, "session, fqn or observer is NULL");
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
    qcal_status st = qcal_calib_session_merge_entry(s, fqn, role, obs, elements, false);
    return st < 0 ? qcal_error_wrap(st, "%s '%s'", qcal_calib_role_name(role), fqn) : st;
}
