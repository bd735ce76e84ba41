/* A small, strict JSON parser into a DOM (RFC 8259). Internal to libqcal: used by the
 * safetensors header reader and the calibration-table readers. Not installed.
 *
 *   qcal_json *doc = NULL;
 *   if (qcal_json_parse(text, len, NULL, &doc) != QCAL_OK) ... qcal_last_error() ...
 *   const qcal_json *v = qcal_json_get(doc, "dtype");
 *   if (v && v->type == QCAL_JSON_STRING) ... v->str ...
 *   qcal_json_free(&doc);
 *
 * Strict means: exactly one value with only whitespace around it; no comments, trailing
 * commas, single quotes, NaN/Infinity, leading zeros, or raw control characters in strings;
 * input must be valid UTF-8 (overlong forms and surrogates rejected); \u escapes are
 * decoded to UTF-8 (paired surrogates combined, lone surrogates and \u0000 rejected so that
 * every string is a proper C string); duplicate object keys are an error. Nesting depth and
 * input size are bounded (qcal_json_limits). Errors are QCAL_ERR_FORMAT (or
 * QCAL_ERR_NO_MEMORY) with the byte offset, line and column in the message. */
#ifndef QCAL_IO_JSON_H
#define QCAL_IO_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "qcal/common.h"

typedef enum qcal_json_type {
    QCAL_JSON_NULL = 0,
    QCAL_JSON_FALSE = 1,
    QCAL_JSON_TRUE = 2,
    QCAL_JSON_NUMBER = 3,
    QCAL_JSON_STRING = 4,
    QCAL_JSON_ARRAY = 5,
    QCAL_JSON_OBJECT = 6,
} qcal_json_type;

typedef struct qcal_json qcal_json;

/* One DOM node. Everything it points to is owned by the document (freed by qcal_json_free
 * on the root). Object members keep their order in the text. */
struct qcal_json {
    qcal_json_type type;
    /* NUMBER: value as a double (strtod, round to nearest). is_int: the literal had no
     * fraction/exponent and fits int64, then i64 holds it exactly (use it for sizes and
     * offsets, which may exceed 2^53). */
    double number;
    bool is_int;
    int64_t i64;
    /* STRING: decoded UTF-8, NUL-terminated, no embedded NUL; len excludes the NUL. */
    char *str;
    size_t len;
    /* ARRAY / OBJECT: n elements in items[]; OBJECT: keys[i] names items[i]
     * (decoded, NUL-terminated). */
    size_t n;
    qcal_json *items;
    char **keys;
};

typedef struct qcal_json_limits {
    int max_depth;          /* default 64: arrays/objects nested deeper are an error */
    size_t max_bytes;       /* default 100 MiB: longer input is an error */
} qcal_json_limits;

/* Fills *lim with the defaults documented above. */
void qcal_json_limits_default(qcal_json_limits *lim);

/* Parses text[0..len) (need not be NUL-terminated) into a new document *out (free with
 * qcal_json_free). lim NULL = defaults. On failure *out is untouched. */
qcal_status qcal_json_parse(const char *text, size_t len, const qcal_json_limits *lim,
                            qcal_json **out);

/* Frees a document (NULL or *doc NULL is fine) and sets *doc to NULL. */
void qcal_json_free(qcal_json **doc);

/* Object member named key (first match; keys are unique after a successful parse), or
 * NULL if obj is not an object or has no such member. */
const qcal_json *qcal_json_get(const qcal_json *obj, const char *key);

/* Short name of a type ("null", "false", "true", "number", "string", "array", "object"). */
const char *qcal_json_type_name(qcal_json_type type);

struct qcal_buf;

/* Appends s as a JSON string literal to b: quotes, \" and \\ escaped, control characters
 * as \u00XX, every other byte as is (s is UTF-8). */
void qcal_json_write_str(struct qcal_buf *b, const char *s);

/* The same as Python's json.dumps(s) (ensure_ascii=True) writes it: \n \r \t \b \f, every
 * other character outside printable ASCII as \uXXXX (a surrogate pair past U+FFFF); s is
 * valid UTF-8 (an invalid byte is written as \ufffd). */
void qcal_json_write_str_ascii(struct qcal_buf *b, const char *s);

#endif
