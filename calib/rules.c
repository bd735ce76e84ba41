/* Calibration rules: an ordered list of (glob on fqn, role, observer config), first match
 * wins, plus the per-role defaults; and the strict text format of a rules file. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"
#include "core/blob_file.h"

typedef struct rule {
    char *glob;
    bool any_role;
    qcal_calib_role role;
    qcal_observer_config cfg;
} rule;

struct qcal_calib_rules {
    rule *r;
    int64_t n, cap;
};

const char *qcal_calib_role_name(qcal_calib_role role)
{
    switch (role) {
    case QCAL_CALIB_ROLE_ACTIVATION: return "activation";
    case QCAL_CALIB_ROLE_WEIGHT: return "weight";
    case QCAL_CALIB_ROLE_COUNT: break;
    }
    return "unknown";
}

qcal_status qcal_calib_role_parse(const char *name, qcal_calib_role *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "role name or output is NULL");
    if (!strcmp(name, "activation") || !strcmp(name, "act")) {
        *out = QCAL_CALIB_ROLE_ACTIVATION;
        return QCAL_OK;
    }
    if (!strcmp(name, "weight") || !strcmp(name, "w")) {
        *out = QCAL_CALIB_ROLE_WEIGHT;
        return QCAL_OK;
    }
    return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role '%s' (expected activation or weight)",
                      name);
}

qcal_status qcal_calib_role_default_config(qcal_calib_role role, qcal_observer_config *out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "config output is NULL");
    switch (role) {
    case QCAL_CALIB_ROLE_ACTIVATION:
        /* PyTorch's default activation observer for static quantization (HistogramObserver,
         * quint8, per_tensor_affine). */
        qcal_observer_config_default(out, QCAL_OBSERVER_HISTOGRAM);
        return QCAL_OK;
    case QCAL_CALIB_ROLE_WEIGHT:
        /* PyTorch's default per-channel weight observer (fbgemm/x86 qconfig):
         * PerChannelMinMaxObserver(dtype=qint8, qscheme=per_channel_symmetric, ch_axis=0). */
        qcal_observer_config_default(out, QCAL_OBSERVER_PER_CHANNEL_MINMAX);
        out->q.dtype = QCAL_QINT8;
        out->q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
        out->axis = 0;
        return QCAL_OK;
    case QCAL_CALIB_ROLE_COUNT: break;
    }
    return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
}

qcal_status qcal_calib_rules_create(qcal_calib_rules **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules output is NULL");
    qcal_calib_rules *r = qcal_calloc(1, sizeof *r);
    if (!r)
        return QCAL_ERR_NO_MEMORY;
    *out = r;
    return QCAL_OK;
}

void qcal_calib_rules_destroy(qcal_calib_rules **rules)
{
    if (!rules || !*rules)
        return;
    for (int64_t i = 0; i < (*rules)->n; i++)
        free((*rules)->r[i].glob);
    free((*rules)->r);
    free(*rules);
    *rules = NULL;
}

qcal_status qcal_calib_rules_add(qcal_calib_rules *rules, const char *glob, bool any_role,
                                 qcal_calib_role role, const qcal_observer_config *cfg)
{
    if (!rules || !glob || !cfg)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules, glob or config is NULL");
    if (!any_role && (unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
    qcal_status st = qcal_observer_config_validate(cfg);
    if (st != QCAL_OK)
        return st;
    if (rules->n == rules->cap) {
        int64_t cap = rules->cap ? rules->cap * 2 : 8;
        size_t bytes;
        if (!qcal_mul_size((size_t)cap, sizeof(rule), &bytes))
            return qcal_error(QCAL_ERR_OVERFLOW, "too many rules");
        rule *r = realloc(rules->r, bytes);
        if (!r)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the rule list to %lld rules",
                              (long long)cap);
        rules->r = r;
        rules->cap = cap;
    }
    size_t len = strlen(glob);
    char *g = qcal_malloc(len + 1);
    if (!g)
        return QCAL_ERR_NO_MEMORY;
    memcpy(g, glob, len + 1);
    rules->r[rules->n++] = (rule){ .glob = g, .any_role = any_role, .role = role, .cfg = *cfg };
    return QCAL_OK;
}

qcal_status qcal_calib_rules_count(const qcal_calib_rules *rules, int64_t *n)
{
    if (!rules || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules or output is NULL");
    *n = rules->n;
    return QCAL_OK;
}

qcal_status qcal_calib_rules_match(const qcal_calib_rules *rules, const char *fqn,
                                   qcal_calib_role role, qcal_observer_config *cfg,
                                   int64_t *rule_index)
{
    if (!fqn || !cfg)
        return qcal_error(QCAL_ERR_INVALID_ARG, "fqn or config output is NULL");
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
    if (rules) {
        for (int64_t i = 0; i < rules->n; i++) {
            const rule *r = &rules->r[i];
            if (!r->any_role && r->role != role)
                continue;
            if (fnmatch(r->glob, fqn, 0) == 0) {
                *cfg = r->cfg;
                if (rule_index)
                    *rule_index = i;
                return QCAL_OK;
            }
        }
    }
    qcal_status st = qcal_calib_role_default_config(role, cfg);
    if (st == QCAL_OK && rule_index)
        *rule_index = -1;
    return st;
}

/* ---- Text format ---- */

#define MAX_TOKENS 64
#define MAX_LINE 4096

/* Splits line (modified in place) into tokens; '#' outside quotes ends the line; a token
 * may be double-quoted (no escapes inside). Returns the count or -1 (message in err). */
static int tokenize(char *line, char **tok, char *err, size_t errcap)
{
    int n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (!*p || *p == '#')
            return n;
        if (n == MAX_TOKENS) {
            snprintf(err, errcap, "more than %d fields", MAX_TOKENS);
            return -1;
        }
        if (*p == '"') {
            char *end = strchr(p + 1, '"');
            if (!end) {
                snprintf(err, errcap, "unterminated quoted glob");
                return -1;
            }
            *end = '\0';
            tok[n++] = p + 1;
            p = end + 1;
            if (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '#') {
                snprintf(err, errcap, "unexpected '%c' after a quoted glob", *p);
                return -1;
            }
            continue;
        }
        tok[n++] = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\r' && *p != '#')
            p++;
        if (*p == '#') {
            *p = '\0';
            return n;
        }
        if (*p)
            *p++ = '\0';
    }
}

/* Parses one tokenized rule into rules; false with a message in err. */
static bool parse_rule(qcal_calib_rules *rules, char **tok, int n, char *err, size_t errcap)
{
    if (n < 3) {
        snprintf(err, errcap, "expected GLOB ROLE OBSERVER [key=value ...], got %d field%s", n,
                 n == 1 ? "" : "s");
        return false;
    }
    if (!tok[0][0]) {
        snprintf(err, errcap, "empty glob");
        return false;
    }
    bool any = false;
    qcal_calib_role role = QCAL_CALIB_ROLE_ACTIVATION;
    if (!strcmp(tok[1], "any") || !strcmp(tok[1], "*"))
        any = true;
    else if (qcal_calib_role_parse(tok[1], &role) != QCAL_OK) {
        snprintf(err, errcap, "unknown role '%s' (expected activation, weight or any)", tok[1]);
        return false;
    }
    /* The observer field and the key=value fields go through the observer-config key
     * table (qcal_observer_config_apply), as the CLI's observer options do. */
    const char *key[MAX_TOKENS], *val[MAX_TOKENS];
    key[0] = "observer";
    val[0] = tok[2];
    for (int i = 3; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (!eq || eq == tok[i]) {
            snprintf(err, errcap, "expected key=value, got '%s'", tok[i]);
            return false;
        }
        *eq = '\0';
        if (!strcmp(tok[i], "observer")) {
            snprintf(err, errcap, "the observer is the third field, not a key");
            return false;
        }
        key[i - 2] = tok[i];
        val[i - 2] = eq + 1;
    }
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    if (qcal_observer_config_apply(&cfg, n - 2, key, val) != QCAL_OK) {
        snprintf(err, errcap, "%s", qcal_last_error());
        return false;
    }
    if (qcal_calib_rules_add(rules, tok[0], any, role, &cfg) != QCAL_OK) {
        snprintf(err, errcap, "%s", qcal_last_error());
        return false;
    }
    return true;
}

static qcal_status parse_named(const char *name, const char *text, size_t len,
                               qcal_calib_rules **out)
{
    if (!text && len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules text is NULL");
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules output is NULL");
    qcal_calib_rules *rules = NULL;
    qcal_status st = qcal_calib_rules_create(&rules);
    if (st != QCAL_OK)
        return st;
    char line[MAX_LINE + 1];
    char err[512];
    char *tok[MAX_TOKENS];
    size_t pos = 0;
    long lineno = 0;
    while (pos < len) {
        lineno++;
        const char *start = text + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl ? 1 : 0);
        if (n > MAX_LINE) {
            st = qcal_error(QCAL_ERR_FORMAT, "%s: line %ld: longer than %d bytes", name,
                            lineno, MAX_LINE);
            goto fail;
        }
        if (memchr(start, '\0', n)) {
            st = qcal_error(QCAL_ERR_FORMAT, "%s: line %ld: contains a NUL byte", name, lineno);
            goto fail;
        }
        memcpy(line, start, n);
        line[n] = '\0';
        int nt = tokenize(line, tok, err, sizeof err);
        if (nt < 0 || (nt > 0 && !parse_rule(rules, tok, nt, err, sizeof err))) {
            st = qcal_error(QCAL_ERR_FORMAT, "%s: line %ld: %s", name, lineno, err);
            goto fail;
        }
    }
    *out = rules;
    return QCAL_OK;
fail:
    qcal_calib_rules_destroy(&rules);
    return st;
}

qcal_status qcal_calib_rules_parse(const char *text, size_t len, qcal_calib_rules **out)
{
    return parse_named("rules", text, len, out);
}

/* Rules files are small; anything past this is refused rather than read into memory. */
#define MAX_RULES_FILE (16u << 20)

qcal_status qcal_calib_rules_load_file(const char *path, qcal_calib_rules **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules path or output is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_blob_read_file(path, "rules file", MAX_RULES_FILE, &buf, &len);
    if (st == QCAL_OK)
        st = parse_named(path, buf, len, out);
    free(buf);
    return st;
}

qcal_status qcal_calib_rules_clone(const qcal_calib_rules *src, qcal_calib_rules **dst)
{
    if (!src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules or output is NULL");
    qcal_calib_rules *r = NULL;
    qcal_status st = qcal_calib_rules_create(&r);
    for (int64_t i = 0; st == QCAL_OK && i < src->n; i++)
        st = qcal_calib_rules_add(r, src->r[i].glob, src->r[i].any_role, src->r[i].role,
                                  &src->r[i].cfg);
    if (st != QCAL_OK) {
        qcal_calib_rules_destroy(&r);
        return st;
    }
    *dst = r;
    return QCAL_OK;
}
