/* Strict, bounded-depth JSON parser into a DOM (see io/json.h for the contract). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "io/json.h"
#include "io/text.h"

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    int depth, max_depth;
    qcal_status st;   /* first failure; QCAL_OK while parsing goes well */
} parser;

void qcal_json_limits_default(qcal_json_limits *lim)
{
    lim->max_depth = 64;
    lim->max_bytes = (size_t)100 << 20;
}

const char *qcal_json_type_name(qcal_json_type type)
{
    switch (type) {
    case QCAL_JSON_NULL: return "null";
    case QCAL_JSON_FALSE: return "false";
    case QCAL_JSON_TRUE: return "true";
    case QCAL_JSON_NUMBER: return "number";
    case QCAL_JSON_STRING: return "string";
    case QCAL_JSON_ARRAY: return "array";
    case QCAL_JSON_OBJECT: return "object";
    }
    return "unknown";
}

/* Records a format error at the current position (line/column computed on demand). */
static bool fail(parser *p, const char *what)
{
    if (p->st != QCAL_OK)
        return false;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    p->st = qcal_error(QCAL_ERR_FORMAT, "JSON: %s at byte %zu (line %zu, column %zu)", what,
                       p->pos, line, col);
    return false;
}

static bool oom(parser *p, size_t bytes)
{
    if (p->st == QCAL_OK)
        p->st = qcal_error(QCAL_ERR_NO_MEMORY, "JSON: cannot allocate %zu bytes", bytes);
    return false;
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static void node_fini(qcal_json *v)
{
    if (v->type == QCAL_JSON_STRING) {
        free(v->str);
    } else if (v->type == QCAL_JSON_ARRAY || v->type == QCAL_JSON_OBJECT) {
        for (size_t i = 0; i < v->n; i++) {
            node_fini(&v->items[i]);
            if (v->keys)
                free(v->keys[i]);
        }
        free(v->items);
        free(v->keys);
    }
    memset(v, 0, sizeof *v);
}

void qcal_json_free(qcal_json **doc)
{
    if (!doc || !*doc)
        return;
    node_fini(*doc);
    free(*doc);
    *doc = NULL;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool read_hex4(parser *p, uint32_t *out)
{
    if (p->len - p->pos < 4)
        return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0)
            return fail(p, "bad hex digit in \\u escape");
        v = v * 16 + (uint32_t)h;
    }
    p->pos += 4;
    *out = v;
    return true;
}

/* Parses a string at p->pos (which is '"') into a new NUL-terminated buffer. The decoded
 * form is never longer than the source (an escape of k bytes decodes to <= k bytes). */
static bool parse_string(parser *p, char **out, size_t *out_len)
{
    size_t start = ++p->pos;   /* skip the quote */
    size_t end = start;
    /* find the closing quote to size the buffer */
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    if (end >= p->len) {
        p->pos = p->len;
        return fail(p, "unterminated string");
    }
    size_t cap = end - start + 1;
    char *d = malloc(cap);
    if (!d)
        return oom(p, cap);
    size_t k = 0;
    while (p->s[p->pos] != '"') {
        unsigned char c = p->s[p->pos];
        if (c < 0x20) {
            free(d);
            return fail(p, "raw control character in string");
        }
        if (c == '\\') {
            p->pos++;
            unsigned char e = p->s[p->pos++];
            switch (e) {
            case '"': d[k++] = '"'; break;
            case '\\': d[k++] = '\\'; break;
            case '/': d[k++] = '/'; break;
            case 'b': d[k++] = '\b'; break;
            case 'f': d[k++] = '\f'; break;
            case 'n': d[k++] = '\n'; break;
            case 'r': d[k++] = '\r'; break;
            case 't': d[k++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!read_hex4(p, &cp)) {
                    free(d);
                    return false;
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                        free(d);
                        return fail(p, "lone high surrogate in \\u escape");
                    }
                    p->pos += 2;
                    if (!read_hex4(p, &lo)) {
                        free(d);
                        return false;
                    }
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        free(d);
                        return fail(p, "high surrogate not followed by a low surrogate");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    free(d);
                    return fail(p, "lone low surrogate in \\u escape");
                } else if (cp == 0) {
                    free(d);
                    return fail(p, "\\u0000 is not allowed in strings");
                }
                k += qcal_utf8_encode(d + k, cp);
                break;
            }
            default:
                free(d);
                p->pos--;
                return fail(p, "invalid escape in string");
            }
            continue;
        }
        size_t n = qcal_utf8_decode(p->s + p->pos, end - p->pos, NULL);
        if (n == 0) {
            free(d);
            return fail(p, "invalid UTF-8 in string");
        }
        memcpy(d + k, p->s + p->pos, n);
        k += n;
        p->pos += n;
    }
    p->pos++;   /* closing quote */
    d[k] = '\0';
    *out = d;
    *out_len = k;
    return true;
}

static bool parse_number(parser *p, qcal_json *v)
{
    size_t start = p->pos;
    const unsigned char *s = p->s;
    bool is_int = true;
    if (p->pos < p->len && s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len)
        return fail(p, "truncated number");
    if (s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            return fail(p, "leading zero in number");
    } else if (s[p->pos] >= '1' && s[p->pos] <= '9') {
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    } else {
        return fail(p, "invalid number");
    }
    if (p->pos < p->len && s[p->pos] == '.') {
        is_int = false;
        p->pos++;
        if (p->pos >= p->len || s[p->pos] < '0' || s[p->pos] > '9')
            return fail(p, "digit expected after decimal point");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        is_int = false;
        p->pos++;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-'))
            p->pos++;
        if (p->pos >= p->len || s[p->pos] < '0' || s[p->pos] > '9')
            return fail(p, "digit expected in exponent");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    }
    size_t n = p->pos - start;
    char buf[512];
    char *tmp = buf;
    if (n >= sizeof buf) {
        tmp = malloc(n + 1);
        if (!tmp)
            return oom(p, n + 1);
    }
    memcpy(tmp, s + start, n);
    tmp[n] = '\0';
    v->type = QCAL_JSON_NUMBER;
    v->number = strtod(tmp, NULL);   /* overflow gives +-HUGE_VAL; kept as is */
    v->is_int = false;
    if (is_int) {
        errno = 0;
        long long ll = strtoll(tmp, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->i64 = (int64_t)ll;
        }
    }
    if (tmp != buf)
        free(tmp);
    return true;
}

static bool parse_value(parser *p, qcal_json *v);

static bool grow(parser *p, qcal_json *v, size_t *cap, bool with_keys)
{
    if (v->n < *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 4;
    qcal_json *items = realloc(v->items, nc * sizeof *items);
    if (!items)
        return oom(p, nc * sizeof *items);
    v->items = items;
    if (with_keys) {
        char **keys = realloc(v->keys, nc * sizeof *keys);
        if (!keys)
            return oom(p, nc * sizeof *keys);
        v->keys = keys;
    }
    *cap = nc;
    return true;
}

static bool parse_container(parser *p, qcal_json *v, bool object)
{
    if (++p->depth > p->max_depth) {
        char msg[96];
        snprintf(msg, sizeof msg, "nesting deeper than the limit of %d", p->max_depth);
        return fail(p, msg);
    }
    unsigned char close = object ? '}' : ']';
    v->type = object ? QCAL_JSON_OBJECT : QCAL_JSON_ARRAY;
    p->pos++;   /* '[' or '{' */
    size_t cap = 0;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return true;
    }
    for (;;) {
        skip_ws(p);
        if (!grow(p, v, &cap, object))
            return false;
        char *key = NULL;
        if (object) {
            size_t klen;
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, "object key (string) expected");
            size_t kpos = p->pos;
            if (!parse_string(p, &key, &klen))
                return false;
            for (size_t i = 0; i < v->n; i++) {
                if (!strcmp(v->keys[i], key)) {
                    free(key);
                    p->pos = kpos;
                    return fail(p, "duplicate object key");
                }
            }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(key);
                return fail(p, "':' expected after object key");
            }
            p->pos++;
            skip_ws(p);
        }
        qcal_json *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        if (object)
            v->keys[v->n] = key;
        v->n++;   /* counted now so a failure below frees key and the partial item */
        if (!parse_value(p, item))
            return false;
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, object ? "unterminated object" : "unterminated array");
        unsigned char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == close)
                return fail(p, "trailing comma");
            continue;
        }
        if (c == close) {
            p->pos++;
            p->depth--;
            return true;
        }
        return fail(p, object ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static bool match_word(parser *p, const char *w)
{
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0)
        return fail(p, "invalid literal");
    p->pos += n;
    return true;
}

static bool parse_value(parser *p, qcal_json *v)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, "value expected, found end of input");
    unsigned char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, v, true);
    case '[': return parse_container(p, v, false);
    case '"':
        v->type = QCAL_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = QCAL_JSON_TRUE;
        return match_word(p, "true");
    case 'f':
        v->type = QCAL_JSON_FALSE;
        return match_word(p, "false");
    case 'n':
        v->type = QCAL_JSON_NULL;
        return match_word(p, "null");
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, v);
        return fail(p, "unexpected character");
    }
}

qcal_status qcal_json_parse(const char *text, size_t len, const qcal_json_limits *lim,
                            qcal_json **out)
{
    qcal_json_limits dl;
    if (!lim) {
        qcal_json_limits_default(&dl);
        lim = &dl;
    }
    if (!text || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_json_parse: NULL argument");
    if (lim->max_depth < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "JSON: max_depth %d must be >= 1",
                          lim->max_depth);
    if (len > lim->max_bytes)
        return qcal_error(QCAL_ERR_FORMAT, "JSON: input of %zu bytes exceeds the limit of %zu",
                          len, lim->max_bytes);
    parser p = {(const unsigned char *)text, len, 0, 0, lim->max_depth, QCAL_OK};
    qcal_json *root = calloc(1, sizeof *root);
    if (!root)
        return qcal_error(QCAL_ERR_NO_MEMORY, "JSON: cannot allocate the document");
    if (parse_value(&p, root)) {
        skip_ws(&p);
        if (p.pos != p.len)
            fail(&p, "trailing characters after the JSON value");
    }
    if (p.st != QCAL_OK) {
        node_fini(root);
        free(root);
        return p.st;
    }
    *out = root;
    return QCAL_OK;
}

const qcal_json *qcal_json_get(const qcal_json *obj, const char *key)
{
    if (!obj || obj->type != QCAL_JSON_OBJECT || !key)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key))
            return &obj->items[i];
    return NULL;
}

/* The one JSON string writer, in two dialects. qcal's (tables, reports, checkpoints):
 * only '"', '\\' and control characters escaped, every other byte as is. Python's
 * json.dumps with ensure_ascii (ONNX Runtime's calibration.json): code points decoded,
 * the short escapes \n \r \t \b \f, printable ASCII as is, everything else \uXXXX
 * (a surrogate pair past U+FFFF). */
static void write_str(qcal_buf *b, const char *s, bool ascii)
{
    qcal_buf_append(b, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        uint32_t cp = *p;
        size_t n = 1;
        if (ascii && cp >= 0x80 && !(n = qcal_utf8_decode(p, SIZE_MAX, &cp))) {
            n = 1;
            cp = 0xFFFD;   /* json.dumps of a decode error; the callers check names first */
        }
        const char *e = NULL;
        if (cp == '"')
            e = "\\\"";
        else if (cp == '\\')
            e = "\\\\";
        else if (ascii && cp < 0x20)
            e = cp == '\n' ? "\\n" : cp == '\r' ? "\\r" : cp == '\t' ? "\\t"
              : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : NULL;
        char esc[16];
        if (e) {
            qcal_buf_append(b, e, 2);
        } else if (cp >= 0x20 && (cp < 0x7F || !ascii)) {
            qcal_buf_append(b, p, n);
        } else if (cp < 0x10000) {
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            qcal_buf_append(b, esc, 6);
        } else {
            uint32_t v = cp - 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xD800 + (v >> 10)),
                     (unsigned)(0xDC00 + (v & 0x3FF)));
            qcal_buf_append(b, esc, 12);
        }
        p += n;
    }
    qcal_buf_append(b, "\"", 1);
}

void qcal_json_write_str(qcal_buf *b, const char *s)
{
    write_str(b, s, false);
}

void qcal_json_write_str_ascii(qcal_buf *b, const char *s)
{
    write_str(b, s, true);
}
