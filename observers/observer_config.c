/* The observer-config keys: one table that the CLI options (--key VALUE), the rules files
 * (key=value) and the Python bindings (keyword arguments) all parse through, so the three
 * accept the same spellings and report the same messages.
 *
 * Adding a key: one row in `keys` below (name, value placeholder, accepted words, help line,
 * optional CLI flag) and its setter. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/observer.h"

/* '-' and '_' are the same character in key names and word values; words compare exactly
 * otherwise (reduce_range's true/false ignore case so that Python's str(True) works). */
static bool same_char(char a, char b)
{
    if (a == '-')
        a = '_';
    if (b == '-')
        b = '_';
    return a == b;
}

static bool word_eq_n(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++)
        if (!same_char(a[i], b[i]))
            return false;
    return i == blen && a[i] == '\0';
}

/* Index of value among the '|'-separated words of choices, or -1. */
static int choice_index(const char *choices, const char *value)
{
    int idx = 0;
    const char *w = choices;
    for (;;) {
        const char *bar = strchr(w, '|');
        size_t len = bar ? (size_t)(bar - w) : strlen(w);
        if (word_eq_n(value, w, len))
            return idx;
        if (!bar)
            return -1;
        w = bar + 1;
        idx++;
    }
}

/* "a, b or c" from "a|b|c". */
static void choices_text(const char *choices, char *out, size_t cap)
{
    size_t o = 0;
    int nwords = 1;
    for (const char *c = choices; *c; c++)
        nwords += *c == '|';
    int w = 0;
    for (const char *c = choices; *c && o + 5 < cap; c++) {
        if (*c == '|') {
            w++;
            const char *sep = w == nwords - 1 ? " or " : ", ";
            size_t sl = strlen(sep);
            if (o + sl + 1 >= cap)
                break;
            memcpy(out + o, sep, sl);
            o += sl;
        } else {
            out[o++] = *c;
        }
    }
    out[o] = '\0';
}

static qcal_status parse_int(const char *key, const char *s, int64_t lo, int64_t hi,
                             int64_t *out)
{
    if (!*s || isspace((unsigned char)*s))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: '%s' is not an integer", key, s);
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || end == s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: '%s' is not an integer", key, s);
    if (errno == ERANGE || v < lo || v > hi)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is outside [%lld, %lld]", key, s,
                          (long long)lo, (long long)hi);
    *out = v;
    return QCAL_OK;
}

static qcal_status parse_num(const char *key, const char *s, double *out)
{
    if (!*s || isspace((unsigned char)*s))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: '%s' is not a number", key, s);
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: '%s' is not a number", key, s);
    /* strtod accepts "nan"/"inf" and overflows to HUGE_VAL with ERANGE; underflow (tiny
     * values, also ERANGE) is accepted as the nearest double. */
    if (!isfinite(v) || (errno == ERANGE && fabs(v) > 1.0))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: '%s' is not a finite number", key, s);
    *out = v;
    return QCAL_OK;
}

static qcal_status parse_f32(const char *key, const char *s, float *out)
{
    double d = 0.0;
    qcal_status st = parse_num(key, s, &d);
    if (st != QCAL_OK)
        return st;
    if (!isfinite((float)d))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is outside the float32 range", key, s);
    *out = (float)d;
    return QCAL_OK;
}

static qcal_status parse_i32(const char *key, const char *s, int32_t *out)
{
    int64_t v = 0;
    qcal_status st = parse_int(key, s, INT32_MIN, INT32_MAX, &v);
    if (st == QCAL_OK)
        *out = (int32_t)v;
    return st;
}

/* ---- Setters: word keys get the index of the word in the row's choices, number keys the
 * text. Each leaves *cfg unchanged on failure. ---- */

typedef qcal_status (*set_fn)(qcal_observer_config *cfg, const char *key, int choice,
                              const char *value);

static qcal_status set_observer(qcal_observer_config *cfg, const char *key, int choice,
                                const char *value)
{
    (void)key, (void)value;
    qcal_observer_config_default(cfg, (qcal_observer_kind)choice);
    return QCAL_OK;
}

static qcal_status set_dtype(qcal_observer_config *cfg, const char *key, int choice,
                             const char *value)
{
    (void)key, (void)value;
    cfg->q.dtype = (qcal_dtype)choice;
    return QCAL_OK;
}

static qcal_status set_qscheme(qcal_observer_config *cfg, const char *key, int choice,
                               const char *value)
{
    (void)key, (void)value;
    cfg->q.qscheme = (qcal_qscheme)choice;
    return QCAL_OK;
}

static qcal_status set_axis(qcal_observer_config *cfg, const char *key, int choice,
                            const char *value)
{
    (void)choice;
    int64_t v = 0;
    qcal_status st = parse_int(key, value, -QCAL_MAX_DIMS, QCAL_MAX_DIMS - 1, &v);
    if (st == QCAL_OK)
        cfg->axis = (int32_t)v;
    return st;
}

static qcal_status set_reduce_range(qcal_observer_config *cfg, const char *key, int choice,
                                    const char *value)
{
    (void)key, (void)value;
    cfg->q.reduce_range = choice == 1;   /* false|true */
    return QCAL_OK;
}

/* A custom range starts from the effective default range, so setting one end keeps the
 * other (qcal_observer_config_apply still asks for both). */
static qcal_status set_quant_bound(qcal_observer_config *cfg, const char *key, int choice,
                                   const char *value)
{
    (void)choice;
    int64_t v = 0;
    qcal_status st = parse_int(key, value, INT32_MIN, INT32_MAX, &v);
    if (st != QCAL_OK)
        return st;
    if (!cfg->q.custom_range) {
        int64_t lo = 0, hi = 255;
        qcal_qconfig plain = cfg->q;
        if (qcal_qconfig_range(&plain, &lo, &hi) != QCAL_OK) {
            lo = 0;
            hi = 255;
        }
        cfg->q.quant_min = lo;
        cfg->q.quant_max = hi;
        cfg->q.custom_range = true;
    }
    if (!strcmp(key, "quant_min"))
        cfg->q.quant_min = v;
    else
        cfg->q.quant_max = v;
    return QCAL_OK;
}

static qcal_status set_eps(qcal_observer_config *cfg, const char *key, int choice,
                           const char *value)
{
    (void)choice;
    float v = 0.0f;
    qcal_status st = parse_f32(key, value, &v);
    if (st != QCAL_OK)
        return st;
    if (!(v > 0.0f))
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s must be positive", key, value);
    cfg->q.eps = v;
    return QCAL_OK;
}

static qcal_status set_averaging_constant(qcal_observer_config *cfg, const char *key,
                                          int choice, const char *value)
{
    (void)choice;
    return parse_f32(key, value, &cfg->averaging_constant);
}

static qcal_status set_bins(qcal_observer_config *cfg, const char *key, int choice,
                            const char *value)
{
    (void)choice;
    return parse_i32(key, value, &cfg->bins);
}

static qcal_status set_grid(qcal_observer_config *cfg, const char *key, int choice,
                            const char *value)
{
    (void)key, (void)value;
    cfg->grid = (qcal_observer_grid)choice;   /* lattice|first_batch|torch */
    return QCAL_OK;
}

static qcal_status set_percentile(qcal_observer_config *cfg, const char *key, int choice,
                                  const char *value)
{
    (void)choice;
    return parse_num(key, value, &cfg->percentile);
}

static qcal_status set_percentile_mode(qcal_observer_config *cfg, const char *key, int choice,
                                       const char *value)
{
    (void)key, (void)value;
    cfg->percentile_mode = (qcal_percentile_mode)choice;
    return QCAL_OK;
}

static qcal_status set_entropy_levels(qcal_observer_config *cfg, const char *key, int choice,
                                      const char *value)
{
    (void)choice;
    return parse_i32(key, value, &cfg->entropy_levels);
}

static qcal_status set_nonfinite(qcal_observer_config *cfg, const char *key, int choice,
                                 const char *value)
{
    (void)key, (void)value;
    cfg->nonfinite = (qcal_nonfinite_policy)choice;
    return QCAL_OK;
}

typedef struct key_row {
    qcal_observer_key k;
    set_fn set;
} key_row;

/* The words of a choice key are in the order of the enum they set (word i sets value i). */
static const key_row keys[] = {
    { { "observer", "KIND",
        "minmax|moving_average_minmax|per_channel_minmax|moving_average_per_channel_minmax|"
        "histogram|percentile|entropy|mse",
        "observer kind; resets every other key to the kind's defaults, so it comes first",
        NULL, NULL, false }, set_observer },
    { { "dtype", "D", "quint8|qint8|qint32|float8_e4m3fn|float8_e5m2",
        "quantized dtype (default quint8)", NULL, NULL, false }, set_dtype },
    { { "qscheme", "S",
        "per_tensor_affine|per_tensor_symmetric|per_channel_affine|per_channel_symmetric|"
        "per_channel_affine_float_qparams",
        "quantization scheme (default per_tensor_affine; per-channel kinds: "
        "per_channel_affine)", NULL, NULL, false }, set_qscheme },
    { { "axis", "N", NULL,
        "channel axis of the per-channel kinds (default 0; negative counts from the end)",
        NULL, NULL, false }, set_axis },
    { { "reduce_range", "B", "false|true",
        "halve the quantized range as PyTorch's reduce_range (default false)",
        "reduce-range", "true", true }, set_reduce_range },
    { { "quant_min", "A", NULL,
        "custom quantized range: lower end (give quant_max too; must include 0)",
        NULL, NULL, false }, set_quant_bound },
    { { "quant_max", "B", NULL,
        "custom quantized range: upper end (give quant_min too)",
        NULL, NULL, false }, set_quant_bound },
    { { "eps", "E", NULL, "smallest scale (default FLT_EPSILON; positive float32)",
        NULL, NULL, false }, set_eps },
    { { "averaging_constant", "C", NULL,
        "moving-average kinds: weight of each new batch, in (0, 1] (default 0.01)",
        NULL, NULL, false }, set_averaging_constant },
    { { "bins", "N", NULL, "histogram kinds: bin count, in [1, 16777216] (default 2048)",
        NULL, NULL, false }, set_bins },
    { { "grid", "G", "lattice|first_batch|torch",
        "histogram kinds: lattice (default; answer depends only on the data, exact merges), "
        "first_batch (bins over the first batch's range, grown by doubling) or torch "
        "(histogram only: PyTorch 1.13's HistogramObserver bit for bit, order-dependent)",
        NULL, NULL, false }, set_grid },
    { { "percentile", "P", NULL, "percentile kind: in (0, 100] (default 99.99)",
        NULL, NULL, false }, set_percentile },
    { { "percentile_mode", "M", "abs|two_tails|auto",
        "percentile kind: clip |x| symmetrically (abs) or each tail (two_tails); auto "
        "(default): two_tails for an affine integer target, abs for a symmetric one",
        NULL, NULL, false }, set_percentile_mode },
    { { "entropy_levels", "N", NULL,
        "entropy kind: quantized levels of the KL search, in [2, bins) (default 128)",
        NULL, NULL, false }, set_entropy_levels },
    { { "nonfinite", "P", "skip|error",
        "NaN/Inf in the data: skipped and counted (skip, default) or an error (error)",
        "strict", "error", false }, set_nonfinite },
};

#define NKEYS ((int64_t)(sizeof keys / sizeof keys[0]))

int64_t qcal_observer_config_key_count(void)
{
    return NKEYS;
}

const qcal_observer_key *qcal_observer_config_key(int64_t i)
{
    return i >= 0 && i < NKEYS ? &keys[i].k : NULL;
}

static const key_row *find_key(const char *key)
{
    for (int64_t i = 0; i < NKEYS; i++)
        if (word_eq_n(key, keys[i].k.name, strlen(keys[i].k.name)))
            return &keys[i];
    return NULL;
}

static qcal_status unknown_key(const char *key)
{
    char list[1024];
    size_t o = 0;
    for (int64_t i = 0; i < NKEYS && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s",
                              i == 0 ? "" : i == NKEYS - 1 ? " or " : ", ", keys[i].k.name);
    return qcal_error(QCAL_ERR_INVALID_ARG, "unknown key '%s' (expected %s)", key, list);
}

qcal_status qcal_observer_config_set(qcal_observer_config *cfg, const char *key,
                                     const char *value)
{
    if (!cfg || !key || !value)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer config, key or value is NULL");
    const key_row *r = find_key(key);
    if (!r)
        return unknown_key(key);
    int choice = -1;
    if (r->k.choices) {
        choice = choice_index(r->k.choices, value);
        if (choice < 0) {
            char words[512];
            choices_text(r->k.choices, words, sizeof words);
            return qcal_error(QCAL_ERR_INVALID_ARG, "unknown %s '%s' (expected %s)", r->k.name,
                              value, words);
        }
    }
    qcal_observer_config c = *cfg;
    qcal_status st = r->set(&c, r->k.name, choice, value);
    if (st == QCAL_OK)
        *cfg = c;
    return st;
}

qcal_status qcal_observer_config_apply(qcal_observer_config *cfg, int64_t n,
                                       const char *const *key, const char *const *value)
{
    if (!cfg || n < 0 || (n > 0 && (!key || !value)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer config, keys or values are NULL");
    const key_row *obs_row = &keys[0];
    qcal_observer_config c = *cfg;
    qcal_status st;
    int have_range = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!key[i] || !value[i])
            return qcal_error(QCAL_ERR_INVALID_ARG, "key or value %lld is NULL", (long long)i);
        const key_row *r = find_key(key[i]);
        if (!r)
            return unknown_key(key[i]);
        for (int64_t j = 0; j < i; j++)
            if (find_key(key[j]) == r)
                return qcal_error(QCAL_ERR_INVALID_ARG, "%s given twice", r->k.name);
        if (r->set == set_quant_bound)
            have_range |= strcmp(r->k.name, "quant_min") ? 2 : 1;
        /* The kind resets every key, so it is applied before the others. */
        if (r == obs_row && (st = qcal_observer_config_set(&c, key[i], value[i])) != QCAL_OK)
            return st;
    }
    for (int64_t i = 0; i < n; i++)
        if (find_key(key[i]) != obs_row &&
            (st = qcal_observer_config_set(&c, key[i], value[i])) != QCAL_OK)
            return st;
    if (have_range == 1 || have_range == 2)
        return qcal_error(QCAL_ERR_INVALID_ARG, "quant_min and quant_max go together");
    if (have_range && c.q.quant_min > c.q.quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG, "quant_min %lld is greater than quant_max %lld",
                          (long long)c.q.quant_min, (long long)c.q.quant_max);
    if ((st = qcal_observer_config_validate(&c)) != QCAL_OK)
        return st;
    *cfg = c;
    return QCAL_OK;
}
