/* libFuzzer target: the safetensors reader. qcal_safetensors_open takes a path (it maps the
 * file), so each input is written to an anonymous memory file (memfd_create) and opened
 * through /proc/self/fd/N; no disk is touched. Everything the reader accepts is then listed,
 * looked up by name and converted to float32 chunk by chunk. */
#include "tests/fuzz/fuzz_common.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qcal/safetensors.h"

static bool write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz_safetensors", 0);
    if (fd < 0)
        return 0;
    if (!write_all(fd, data, size)) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);

    qcal_safetensors *st = (qcal_safetensors *)(uintptr_t)0x1;   /* sentinel */
    qcal_clear_error();
    qcal_status s = qcal_safetensors_open(path, &st);
    if (s != QCAL_OK) {
        fuzz_check_failure(s);
        FUZZ_CHECK(st == (qcal_safetensors *)(uintptr_t)0x1);
        close(fd);
        return 0;
    }
    int64_t n = -1;
    FUZZ_CHECK(qcal_safetensors_count(st, &n) == QCAL_OK && n >= 0);
    enum { CHUNK = 4096 };
    static float buf[CHUNK];
    int64_t total_bytes = 0;
    for (int64_t i = 0; i < n; i++) {
        qcal_safetensors_tensor_info info;
        FUZZ_CHECK(qcal_safetensors_info(st, i, &info) == QCAL_OK);
        FUZZ_CHECK(info.ndim >= 0 && info.ndim <= QCAL_MAX_DIMS);
        FUZZ_CHECK(info.nbytes >= 0 && info.offset >= 8);
        FUZZ_CHECK(info.offset + info.nbytes <= (int64_t)size);
        total_bytes += info.nbytes;
        int64_t j = -1;
        FUZZ_CHECK(qcal_safetensors_find(st, info.name, &j) == QCAL_OK && j == i);
        /* Convert in chunks; a hostile file cannot make this read more than it holds. */
        for (int64_t start = 0; start < info.numel; start += CHUNK) {
            int64_t cnt = info.numel - start < CHUNK ? info.numel - start : CHUNK;
            qcal_status r = qcal_safetensors_read_f32(st, i, start, cnt, buf);
            if (r != QCAL_OK) {
                fuzz_check_failure(r);
                FUZZ_CHECK(info.dtype == QCAL_SAFETENSORS_OTHER);
                break;
            }
        }
        const void *raw = NULL;
        if (qcal_safetensors_raw(st, i, &raw) == QCAL_OK)
            fuzz_touch(raw, (size_t)info.nbytes);
        FUZZ_CHECK(qcal_safetensors_release(st, i) == QCAL_OK);
    }
    FUZZ_CHECK(total_bytes <= (int64_t)size);
    /* Out-of-range requests must fail cleanly. */
    qcal_safetensors_tensor_info info;
    FUZZ_CHECK(qcal_safetensors_info(st, n, &info) < 0);
    FUZZ_CHECK(qcal_safetensors_read_f32(st, -1, 0, 1, buf) < 0);
    if (n > 0) {
        FUZZ_CHECK(qcal_safetensors_read_f32(st, 0, INT64_MAX, 1, buf) < 0);
        FUZZ_CHECK(qcal_safetensors_read_f32(st, 0, 0, INT64_MAX, buf) < 0);
    }
    const char *v = NULL;
    (void)qcal_safetensors_metadata(st, "format", &v);
    if (v)
        fuzz_touch(v, strlen(v));
    qcal_safetensors_close(&st);
    FUZZ_CHECK(st == NULL);
    close(fd);
    return 0;
}
