/* Calibration rules: an ordered list of (glob on fqn, role, observer config), first match
 * wins, plus the per-role defaults; and the strict text format of a rules file. */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib_internal.h"

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

static bool parse_i64_str(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!*s)
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_f64_str(const char *s, double *out)
{
    if (!*s)
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* Applies key=value to cfg; false with a message in err. qmin/qmax presence tracked. */
static bool apply_key(qcal_observer_config *cfg, const char *key, const char *val,
                      int *have_qrange, char *err, size_t errcap)
{
    int64_t i;
    double d;
    if (!strcmp(key, "dtype")) {
        if (qcal_dtype_parse(val, &cfg->q.dtype) == QCAL_OK)
            return true;
        snprintf(err, errcap, "unknown dtype '%s' (expected quint8, qint8 or qint32)", val);
        return false;
    }
    if (!strcmp(key, "qscheme")) {
        if (qcal_qscheme_parse(val, &cfg->q.qscheme) == QCAL_OK)
            return true;
        snprintf(err, errcap, "unknown qscheme '%s'", val);
        return false;
    }
    if (!strcmp(key, "reduce_range")) {
        if (!strcmp(val, "true") || !strcmp(val, "false")) {
            cfg->q.reduce_range = val[0] == 't';
            return true;
        }
        snprintf(err, errcap, "reduce_range must be true or false, not '%s'", val);
        return false;
    }
    if (!strcmp(key, "quant_min") || !strcmp(key, "quant_max")) {
        if (!parse_i64_str(val, INT32_MIN, INT32_MAX, &i)) {
            snprintf(err, errcap, "%s '%s' is not an integer in [-2^31, 2^31-1]", key, val);
            return false;
        }
        cfg->q.custom_range = true;
        if (!strcmp(key, "quant_min")) {
            cfg->q.quant_min = i;
            *have_qrange |= 1;
        } else {
            cfg->q.quant_max = i;
            *have_qrange |= 2;
        }
        return true;
    }
    if (!strcmp(key, "eps") || !strcmp(key, "averaging_constant") ||
        !strcmp(key, "percentile")) {
        if (!parse_f64_str(val, &d)) {
            snprintf(err, errcap, "%s '%s' is not a finite number", key, val);
            return false;
        }
        if (key[0] == 'e') {
            if (!(d > 0.0) || d > 3.4e38) {
                snprintf(err, errcap, "eps %s must be positive and below 3.4e38", val);
                return false;
            }
            cfg->q.eps = (float)d;
        } else if (key[0] == 'a') {
            cfg->averaging_constant = (float)d;
        } else {
            cfg->percentile = d;
        }
        return true;
    }
    if (!strcmp(key, "axis") || !strcmp(key, "bins") || !strcmp(key, "upsample_rate") ||
        !strcmp(key, "entropy_levels")) {
        if (!parse_i64_str(val, INT32_MIN, INT32_MAX, &i)) {
            snprintf(err, errcap, "%s '%s' is not a 32-bit integer", key, val);
            return false;
        }
        if (key[0] == 'a')
            cfg->axis = (int32_t)i;
        else if (key[0] == 'b')
            cfg->bins = (int32_t)i;
        else if (key[0] == 'u')
            cfg->upsample_rate = (int32_t)i;
        else
            cfg->entropy_levels = (int32_t)i;
        return true;
    }
    if (!strcmp(key, "percentile_mode")) {
        if (!strcmp(val, "abs"))
            cfg->percentile_mode = QCAL_PERCENTILE_ABS;
        else if (!strcmp(val, "two_tails") || !strcmp(val, "two-tails"))
            cfg->percentile_mode = QCAL_PERCENTILE_TWO_TAILS;
        else {
            snprintf(err, errcap, "percentile_mode must be abs or two_tails, not '%s'", val);
            return false;
        }
        return true;
    }
    if (!strcmp(key, "nonfinite")) {
        if (!strcmp(val, "skip"))
            cfg->nonfinite = QCAL_NONFINITE_SKIP;
        else if (!strcmp(val, "error"))
            cfg->nonfinite = QCAL_NONFINITE_ERROR;
        else {
            snprintf(err, errcap, "nonfinite must be skip or error, not '%s'", val);
            return false;
        }
        return true;
    }
    snprintf(err, errcap, "unknown key '%s' (expected dtype, qscheme, reduce_range, quant_min, "
             "quant_max, eps, axis, averaging_constant, bins, upsample_rate, percentile, "
             "percentile_mode, entropy_levels or nonfinite)", key);
    return false;
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
    qcal_observer_kind kind;
    if (qcal_observer_kind_parse(tok[2], &kind) != QCAL_OK) {
        snprintf(err, errcap, "%s", qcal_last_error());
        return false;
    }
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);
    int have_qrange = 0;
    for (int i = 3; i < n; i++) {
        char *eq = strchr(tok[i], '=');
        if (!eq || eq == tok[i]) {
            snprintf(err, errcap, "expected key=value, got '%s'", tok[i]);
            return false;
        }
        *eq = '\0';
        for (int j = 3; j < i; j++) {
            if (!strcmp(tok[j], tok[i])) {
                snprintf(err, errcap, "key '%s' given twice", tok[i]);
                return false;
            }
        }
        if (!apply_key(&cfg, tok[i], eq + 1, &have_qrange, err, errcap))
            return false;
    }
    if (have_qrange == 1 || have_qrange == 2) {
        snprintf(err, errcap, "quant_min and quant_max go together");
        return false;
    }
    if (qcal_observer_config_validate(&cfg) != QCAL_OK) {
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

qcal_status qcal_calib_rules_load(const char *path, qcal_calib_rules **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "rules path or output is NULL");
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_calib_read_file(path, "rules file", MAX_RULES_FILE, 4096, &buf, &len);
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
