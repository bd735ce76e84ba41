/* Tensor data: element sizes and counts, a tensor's bytes and its float32 values, and views
 * of raw_data that lies in a model's file mappings (onnx_internal.h). */
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "io/half_dsp.h"
#include "onnx/onnx_internal.h"

size_t onnx_elem_size(int32_t type)
{
    switch (type) {
    case 1: case 6: case 12: return 4;          /* float, int32, uint32 */
    case 2: case 3: case 9: return 1;           /* uint8, int8, bool */
    case 4: case 5: case 10: case 16: return 2; /* uint16, int16, float16, bfloat16 */
    case 7: case 11: case 13: case 14: return 8;/* int64, double, uint64, complex64 */
    case 15: return 16;                         /* complex128 */
    case 17: case 18: case 19: case 20: return 1; /* float8 variants (later ONNX) */
    default: return 0;
    }
}

bool onnx_tensor_numel(const Onnx__TensorProto *t, int64_t *numel)
{
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++)
        if (t->dims[i] < 0 || !qcal_mul_i64(n, t->dims[i], &n))
            return false;
    *numel = n;
    return true;
}


/* ---- tensor data ---- */

/* Expected byte size of the tensor's data for its element type, or 0 with *known false. */
bool onnx_tensor_expected_bytes(const Onnx__TensorProto *t, int64_t numel, uint64_t *bytes)
{
    int32_t type = t->data_type;
    size_t es = onnx_elem_size(type);
    if (es) {
        *bytes = (uint64_t)numel * es;   /* numel * 16 cannot overflow after the check below */
        return numel <= INT64_MAX / 16;
    }
    if (type >= 21 && type <= 23) {     /* 4-bit types: two per byte */
        *bytes = ((uint64_t)numel + 1) / 2;
        return true;
    }
    return false;
}

qcal_status onnx_tensor_bytes(const Onnx__TensorProto *t, const uint8_t **data, size_t *len,
                              void **owned)
{
    *owned = NULL;
    int64_t numel;
    if (!onnx_tensor_numel(t, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "tensor '%s' has an invalid shape", onnx_str_or_empty(t->name));
    if (t->has_raw_data || t->raw_data.len) {
        *data = t->raw_data.data;
        *len = t->raw_data.len;
        return QCAL_OK;
    }
    size_t es = onnx_elem_size(t->data_type);
    if (!es)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d is not supported",
                          onnx_str_or_empty(t->name), (int)t->data_type);
    size_t n = (size_t)numel;
    size_t nbytes = n * es;
    uint8_t *buf = malloc(nbytes ? nbytes : 1);
    if (!buf)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for tensor '%s'", onnx_str_or_empty(t->name));
    /* An empty repeated field is a NULL pointer: memcpy(dst, NULL, 0) is undefined, so copy
       only when there is something. */
    switch (t->data_type) {
    case 1:
        if (t->n_float_data != n) goto bad;
        if (n) memcpy(buf, t->float_data, n * 4);
        break;
    case 11:
        if (t->n_double_data != n) goto bad;
        if (n) memcpy(buf, t->double_data, n * 8);
        break;
    case 7:
        if (t->n_int64_data != n) goto bad;
        if (n) memcpy(buf, t->int64_data, n * 8);
        break;
    case 12: case 13:
        if (t->n_uint64_data != n) goto bad;
        for (size_t i = 0; i < n; i++) {
            if (es == 4) { uint32_t v = (uint32_t)t->uint64_data[i]; memcpy(buf + 4 * i, &v, 4); }
            else memcpy(buf + 8 * i, &t->uint64_data[i], 8);
        }
        break;
    case 2: case 3: case 4: case 5: case 6: case 9: case 10: case 16:
    case 17: case 18: case 19: case 20:
        if (t->n_int32_data != n) goto bad;
        for (size_t i = 0; i < n; i++) {
            int32_t v = t->int32_data[i];
            if (es == 1) buf[i] = (uint8_t)v;
            else if (es == 2) { uint16_t u = (uint16_t)v; memcpy(buf + 2 * i, &u, 2); }
            else memcpy(buf + 4 * i, &v, 4);
        }
        break;
    default:
        free(buf);
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d is not supported",
                          onnx_str_or_empty(t->name), (int)t->data_type);
    }
    *data = buf;
    *len = n * es;
    *owned = buf;
    return QCAL_OK;
bad:
    free(buf);
    return qcal_error(QCAL_ERR_FORMAT, "tensor '%s': data does not match its shape",
                      onnx_str_or_empty(t->name));
}

qcal_status onnx_tensor_to_float(const Onnx__TensorProto *t, float **out, int64_t *numel)
{
    const uint8_t *p;
    size_t len;
    void *owned;
    qcal_status st = onnx_tensor_bytes(t, &p, &len, &owned);
    if (st != QCAL_OK)
        return st;
    int64_t n = 0;
    onnx_tensor_numel(t, &n);
    size_t es = onnx_elem_size(t->data_type);
    if (!es || len != (size_t)n * es) {
        free(owned);
        return qcal_error(QCAL_ERR_FORMAT, "tensor '%s': %zu bytes of data for %lld elements",
                          onnx_str_or_empty(t->name), len, (long long)n);
    }
    float *f = malloc((size_t)n * sizeof *f + 1);
    if (!f) {
        free(owned);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory for tensor '%s'", onnx_str_or_empty(t->name));
    }
    int64_t todo = n;
    if (t->data_type == 1) {   /* float32: one copy */
        if (n) memcpy(f, p, (size_t)n * 4);
        todo = 0;
    } else if (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
               t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) {
        /* io's half kernels (exact; a NaN keeps its payload and comes out quiet) */
        const qcal_half_dsp *k = qcal_half_dsp_get();
        (t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ? k->f16_to_f32
                                                                  : k->bf16_to_f32)(p, (size_t)n, f);
        todo = 0;
    }
    for (int64_t i = 0; i < todo; i++) {
        const uint8_t *q = p + (size_t)i * es;
        switch (t->data_type) {
        case 1: memcpy(&f[i], q, 4); break;
        case 11: { double d; memcpy(&d, q, 8); f[i] = (float)d; break; }
        case 2: case 9: f[i] = (float)q[0]; break;
        case 3: f[i] = (float)(int8_t)q[0]; break;
        case 4: { uint16_t v; memcpy(&v, q, 2); f[i] = (float)v; break; }
        case 5: { int16_t v; memcpy(&v, q, 2); f[i] = (float)v; break; }
        case 6: { int32_t v; memcpy(&v, q, 4); f[i] = (float)v; break; }
        case 12: { uint32_t v; memcpy(&v, q, 4); f[i] = (float)v; break; }
        case 7: { int64_t v; memcpy(&v, q, 8); f[i] = (float)v; break; }
        case 13: { uint64_t v; memcpy(&v, q, 8); f[i] = (float)v; break; }
        default:
            free(f);
            free(owned);
            return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': element type %d cannot be read as float",
                              onnx_str_or_empty(t->name), (int)t->data_type);
        }
    }
    free(owned);
    *out = f;
    *numel = n;
    return QCAL_OK;
}

/* Copies n bytes with 16-byte vector moves (a loop glibc's memcpy cannot turn into `rep
 * movsb`). Measured on this project's AMD Zen 3 VM, 2 GiB from a file mapping misaligned by 1
 * byte: 0.96-1.19 s of CPU with memcpy into a buffer 15 bytes ahead of the source in its
 * page, 0.27-0.31 s with this loop into a buffer placed as onnx_raw_view places it (which
 * of the two differences matters was not separated). */
void onnx_copy_vec(uint8_t *restrict dst, const uint8_t *restrict src, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_storeu_si128((__m128i *)(dst + i), a);
        _mm_storeu_si128((__m128i *)(dst + i + 16), b);
        _mm_storeu_si128((__m128i *)(dst + i + 32), c);
        _mm_storeu_si128((__m128i *)(dst + i + 48), d);
    }
#endif
    if (n > i)
        memcpy(dst + i, src + i, n - i);
}

qcal_status onnx_raw_view(const Onnx__TensorProto *t, size_t off, size_t len, uint8_t *scratch,
                          const float **view)
{
    if (off > t->raw_data.len || len > t->raw_data.len - off)
        return qcal_error(QCAL_ERR_INVALID_ARG, "bytes [%zu, +%zu) of a %zu-byte tensor", off, len,
                          t->raw_data.len);
    const uint8_t *src = t->raw_data.data + off;
    if ((uintptr_t)src % sizeof(float) == 0) {
        /* In place. Reading a mapped file's pages where they are cost a quarter of the CPU
         * time of pread()ing them into a buffer (2 GiB read: 0.22 s against 0.33-1.3 s). */
        *view = (const float *)(const void *)src;
        return QCAL_OK;
    }
    /* The copy starts 512-575 bytes below the source's offset in its 4 KiB page: a load never
     * meets an earlier store with the same low 12 address bits (4 KiB aliasing stalls the
     * load), and the copy is 64-byte aligned. */
    uintptr_t page = ((uintptr_t)scratch + 4095) & ~(uintptr_t)4095;
    uint8_t *dst = (uint8_t *)(page + ((((uintptr_t)src & 4095) - 512) & 4095 & ~(uintptr_t)63));
    onnx_copy_vec(dst, src, len);
    *view = (const float *)(const void *)dst;
    return QCAL_OK;
}

void onnx_raw_drop(const qcal_onnx_model *m, const Onnx__TensorProto *t)
{
    if (!t->raw_data.len || !onnx_in_map(m, t->raw_data.data))
        return;
    uintptr_t lo = ((uintptr_t)t->raw_data.data + 4095) & ~(uintptr_t)4095;
    uintptr_t hi = ((uintptr_t)t->raw_data.data + t->raw_data.len) & ~(uintptr_t)4095;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);   /* read-only private mapping */
}

const onnx_src *onnx_src_of(const qcal_onnx_model *m, const void *ptr)
{
    for (size_t i = 0; m && ptr && i < m->n_src; i++)
        if ((const uint8_t *)ptr >= m->src[i].map && (const uint8_t *)ptr < m->src[i].map + m->src[i].len)
            return &m->src[i];
    return NULL;
}

bool onnx_in_map(const qcal_onnx_model *m, const void *ptr)
{
    return onnx_src_of(m, ptr) != NULL;
}

void onnx_tensor_release(const qcal_onnx_model *m, Onnx__TensorProto *t)
{
    if (t && onnx_in_map(m, t->raw_data.data)) {
        t->raw_data.data = NULL;
        t->raw_data.len = 0;
        t->has_raw_data = 0;
    }
}
