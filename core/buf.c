/* Growable byte buffer and bounds-checked cursor for the little-endian serialisers. */
#include <string.h>

#include "core/internal.h"

void qcal_buf_append(qcal_buf *b, const void *src, size_t n)
{
    if (b->failed || n == 0) /* n == 0: src may be NULL (an empty buffer's data) */
        return;
    if (n > SIZE_MAX - b->len) {
        b->failed = true;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->failed = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
}

/* The host is little-endian (x86-64); the blobs are defined little-endian. */
void qcal_buf_u32(qcal_buf *b, uint32_t v) { qcal_buf_append(b, &v, 4); }
void qcal_buf_u64(qcal_buf *b, uint64_t v) { qcal_buf_append(b, &v, 8); }
void qcal_buf_f32(qcal_buf *b, float v) { qcal_buf_append(b, &v, 4); }
void qcal_buf_f64(qcal_buf *b, double v) { qcal_buf_append(b, &v, 8); }

void qcal_buf_free(qcal_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

bool qcal_cur_read(qcal_cursor *c, void *dst, size_t n)
{
    if (c->left < n)
        return false;
    memcpy(dst, c->p, n);
    c->p += n;
    c->left -= n;
    return true;
}

bool qcal_cur_u32(qcal_cursor *c, uint32_t *v) { return qcal_cur_read(c, v, 4); }
bool qcal_cur_u64(qcal_cursor *c, uint64_t *v) { return qcal_cur_read(c, v, 8); }
bool qcal_cur_f32(qcal_cursor *c, float *v) { return qcal_cur_read(c, v, 4); }
bool qcal_cur_f64(qcal_cursor *c, double *v) { return qcal_cur_read(c, v, 8); }
