/* unit.core: status names and last-error messages, tensor numel/axis/overflow checks,
 * atomic output files and CPU dispatch / thread-count rules. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "qcal/atomic_file.h"
#include "core/cpu.h"
#include "core/internal.h"
#include "core/sha256.h"
#include "qcal/qcal.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static void test_status(void **state)
{
    (void)state;
    const qcal_status all[] = {
        QCAL_OK, QCAL_NO_DATA, QCAL_ERR_INVALID_ARG, QCAL_ERR_NO_MEMORY, QCAL_ERR_IO,
        QCAL_ERR_FORMAT, QCAL_ERR_UNSUPPORTED, QCAL_ERR_NONFINITE, QCAL_ERR_MISMATCH,
        QCAL_ERR_OVERFLOW, QCAL_ERR_BACKEND, QCAL_ERR_STATE, QCAL_ERR_NOT_FOUND, QCAL_ERR_EMPTY,
    };
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        const char *s = qcal_status_str(all[i]);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown status");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(s, qcal_status_str(all[j]));
    }
    assert_string_equal(qcal_status_str(QCAL_OK), "ok");
    assert_string_equal(qcal_status_str((qcal_status)-99), "unknown status");
    assert_int_equal(qcal_error(QCAL_ERR_IO, "cannot open '%s': %d", "x.bin", 42), QCAL_ERR_IO);
    assert_string_equal(qcal_last_error(), "cannot open 'x.bin': 42");
    /* The public qcal_set_error, with the previous message as an argument: the cause is
     * kept (formatted before it is stored, not overwritten while being read). */
    assert_int_equal(qcal_set_error(QCAL_ERR_FORMAT, "outer: %s", qcal_last_error()), QCAL_ERR_FORMAT);
    assert_string_equal(qcal_last_error(), "outer: cannot open 'x.bin': 42");
    assert_int_equal(qcal_error(QCAL_ERR_FORMAT, "again: %s", qcal_last_error()), QCAL_ERR_FORMAT);
    assert_string_equal(qcal_last_error(), "again: outer: cannot open 'x.bin': 42");
    qcal_clear_error();
    assert_string_equal(qcal_last_error(), "");
    assert_string_equal(qcal_version(), QCAL_VERSION);
    qcal_free(NULL);
}

static void test_tensor(void **state)
{
    (void)state;
    float d[6] = { 0 };
    qcal_tensor t;
    const int64_t s23[2] = { 2, 3 };
    assert_int_equal(qcal_tensor_init(&t, d, 2, s23), QCAL_OK);
    int64_t n = 0;
    assert_int_equal(qcal_tensor_numel(&t, &n), QCAL_OK);
    assert_int_equal(n, 6);
    assert_int_equal(qcal_tensor_init(&t, d, 0, NULL), QCAL_OK);    /* scalar */
    assert_int_equal(qcal_tensor_numel(&t, &n), QCAL_OK);
    assert_int_equal(n, 1);
    const int64_t neg[2] = { 2, -1 };
    assert_int_equal(qcal_tensor_init(&t, d, 2, neg), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_tensor_init(&t, d, 9, s23), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_tensor_init(&t, NULL, 2, s23), QCAL_ERR_INVALID_ARG);
    const int64_t zero[2] = { 0, 5 };
    assert_int_equal(qcal_tensor_init(&t, NULL, 2, zero), QCAL_OK);  /* empty: NULL is fine */
    assert_int_equal(qcal_tensor_numel(&t, &n), QCAL_OK);
    assert_int_equal(n, 0);
    /* Overflow: 2^32 * 2^32 elements, and counts whose byte size would not fit. */
    const int64_t huge[2] = { INT64_C(1) << 32, INT64_C(1) << 32 };
    assert_int_equal(qcal_tensor_init(&t, d, 2, huge), QCAL_ERR_OVERFLOW);
    assert_non_null(strstr(qcal_last_error(), "overflow"));
    const int64_t big[1] = { INT64_C(1) << 62 };
    assert_int_equal(qcal_tensor_init(&t, d, 1, big), QCAL_ERR_OVERFLOW);
    /* 2^31+ elements are fine (int64 indices everywhere). */
    const int64_t over31[2] = { 3, INT64_C(1) << 30 };
    assert_int_equal(qcal_tensor_init(&t, d, 2, over31), QCAL_OK);
    assert_int_equal(qcal_tensor_numel(&t, &n), QCAL_OK);
    assert_true(n == 3 * (INT64_C(1) << 30));
    int64_t m;
    assert_false(qcal_mul_i64(INT64_MAX / 2 + 1, 2, &m));
    assert_true(qcal_mul_i64(INT64_C(1) << 31, 4, &m) && m == INT64_C(1) << 33);
    assert_false(qcal_add_i64(INT64_MAX, 1, &m));
    size_t sz;
    assert_false(qcal_mul_size(SIZE_MAX, 2, &sz));
    /* Axis resolution. */
    const int64_t s4[4] = { 2, 3, 4, 5 };
    assert_int_equal(qcal_tensor_init(&t, d, 4, s4), QCAL_OK);
    int32_t a = -9;
    assert_int_equal(qcal_tensor_axis(&t, -1, &a), QCAL_OK);
    assert_int_equal(a, 3);
    assert_int_equal(qcal_tensor_axis(&t, -4, &a), QCAL_OK);
    assert_int_equal(a, 0);
    assert_int_equal(qcal_tensor_axis(&t, 1, &a), QCAL_OK);
    assert_int_equal(a, 1);
    a = 77;
    assert_int_equal(qcal_tensor_axis(&t, 4, &a), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_tensor_axis(&t, -5, &a), QCAL_ERR_INVALID_ARG);
    assert_int_equal(a, 77);
    assert_non_null(strstr(qcal_last_error(), "axis -5"));
}

static void read_file(const char *path, char *buf, size_t cap)
{
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    size_t n = fread(buf, 1, cap - 1, fp);
    buf[n] = '\0';
    fclose(fp);
}

static int count_entries(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

static void test_atomic_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/qcal_core_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/out.txt", dir);
    qcal_atomic_file f;
    assert_int_equal(qcal_atomic_file_open(&f, path), QCAL_OK);
    fputs("first\n", f.fp);
    assert_int_equal(access(path, F_OK), -1);       /* nothing visible before commit */
    assert_int_equal(qcal_atomic_file_commit(&f), QCAL_OK);
    char buf[64];
    read_file(path, buf, sizeof buf);
    assert_string_equal(buf, "first\n");
    /* An aborted rewrite leaves the old file and no temporary. */
    assert_int_equal(qcal_atomic_file_open(&f, path), QCAL_OK);
    fputs("second\n", f.fp);
    qcal_atomic_file_abort(&f);
    read_file(path, buf, sizeof buf);
    assert_string_equal(buf, "first\n");
    assert_int_equal(count_entries(dir), 1);
    /* A committed rewrite replaces it. */
    assert_int_equal(qcal_atomic_file_open(&f, path), QCAL_OK);
    fputs("third\n", f.fp);
    assert_int_equal(qcal_atomic_file_commit(&f), QCAL_OK);
    read_file(path, buf, sizeof buf);
    assert_string_equal(buf, "third\n");
    assert_int_equal(count_entries(dir), 1);
    /* A missing directory is an I/O error with the path in the message. */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.txt", dir);
    assert_int_equal(qcal_atomic_file_open(&f, bad), QCAL_ERR_IO);
    assert_non_null(strstr(qcal_last_error(), "no/such/dir"));
    qcal_atomic_file_abort(&f);   /* safe on the zeroed struct */
    qcal_atomic_file_abort(NULL);
    assert_int_equal(qcal_atomic_file_open(NULL, path), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_atomic_file_commit(&f), QCAL_ERR_STATE);   /* not open */
    unlink(path);
    rmdir(dir);
}

static void test_cpu(void **state)
{
    (void)state;
    unsetenv("QCAL_ISA");
    qcal_cpu_reset();
    qcal_isa best = qcal_cpu_isa();
    assert_true(best >= QCAL_ISA_C && best <= QCAL_ISA_AVX512);
    setenv("QCAL_ISA", "c", 1);
    qcal_cpu_reset();
    assert_int_equal(qcal_cpu_isa(), QCAL_ISA_C);
    setenv("QCAL_ISA", "avx2", 1);
    qcal_cpu_reset();
    assert_int_equal(qcal_cpu_isa(), best < QCAL_ISA_AVX2 ? best : QCAL_ISA_AVX2);
    setenv("QCAL_ISA", "avx512", 1);   /* a cap never raises above what the CPU has */
    qcal_cpu_reset();
    assert_int_equal(qcal_cpu_isa(), best);
    setenv("QCAL_ISA", "bogus", 1);
    qcal_cpu_reset();
    assert_int_equal(qcal_cpu_isa(), best);
    unsetenv("QCAL_ISA");
    qcal_cpu_reset();
    assert_int_equal(qcal_cpu_isa(), best);
    assert_int_equal(qcal_threads_for(0), 1);
    assert_int_equal(qcal_threads_for(QCAL_OMP_MIN_ELEMENTS - 1), 1);
    assert_true(qcal_threads_for(INT64_C(1) << 30) >= 1);
}

/* SHA-256 against the FIPS 180-4 / NIST example vectors, one-shot and fed in pieces of
 * every size (exercises the partial-block paths and the 55/56/64-byte padding edges). */
static void test_sha256(void **state)
{
    (void)state;
    static const struct { const char *msg; const char *hex; } v[] = {
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
        { "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmn"
          "opqrlmnopqrsmnopqrstnopqrstu",
          "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1" },
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        size_t n = strlen(v[i].msg);
        qcal_sha256_hex(v[i].msg, n, hex);
        assert_string_equal(hex, v[i].hex);
        for (size_t piece = 1; piece <= n; piece++) {
            qcal_sha256 s;
            uint8_t d[32];
            qcal_sha256_init(&s);
            for (size_t off = 0; off < n; off += piece)
                qcal_sha256_update(&s, v[i].msg + off, n - off < piece ? n - off : piece);
            qcal_sha256_final(&s, d);
            qcal_sha256_to_hex(d, hex);
            assert_string_equal(hex, v[i].hex);
        }
    }
    /* One million 'a' (FIPS 180-2 appendix B.3), in 1000 updates of 1000 bytes. */
    char a[1000];
    memset(a, 'a', sizeof a);
    qcal_sha256 s;
    uint8_t d[32];
    qcal_sha256_init(&s);
    for (int i = 0; i < 1000; i++)
        qcal_sha256_update(&s, a, sizeof a);
    qcal_sha256_final(&s, d);
    qcal_sha256_to_hex(d, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Lengths 55, 56, 63, 64 and 65 (padding into one or two blocks), checked against
     * Python's hashlib.sha256(b'x' * n). */
    static const struct { size_t n; const char *hex; } e[] = {
        { 55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072" },
        { 56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e" },
        { 63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2" },
        { 64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c" },
        { 65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9" },
    };
    char x[65];
    memset(x, 'x', sizeof x);
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        qcal_sha256_hex(x, e[i].n, hex);
        assert_string_equal(hex, e[i].hex);
    }
}

/* The library's thread count (qcal/threads.h): default OpenMP's, set/get, and the cap every
 * kernel's region takes through qcal_threads_for. */
static void test_threads(void **state)
{
    (void)state;
    const int64_t big = INT64_C(1) << 30;
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(3);
    assert_int_equal(qcal_threads_count(), 3);           /* default: OpenMP's */
    assert_int_equal(qcal_threads_for(big), 3);
    assert_int_equal(qcal_threads_set_count(5), QCAL_OK);
    assert_int_equal(qcal_threads_count(), 5);
    assert_int_equal(qcal_threads_for(big), 5);
    assert_int_equal(qcal_threads_for(QCAL_OMP_MIN_ELEMENTS), 2);   /* capped by the size */
    assert_int_equal(qcal_threads_set_count(1), QCAL_OK);
    assert_int_equal(qcal_threads_for(big), 1);
    assert_int_equal(qcal_threads_set_count(0), QCAL_OK);    /* back to OpenMP's */
    assert_int_equal(qcal_threads_count(), 3);
    assert_int_equal(qcal_threads_for(big), 3);
    omp_set_num_threads(2);
    assert_int_equal(qcal_threads_for(big), 2);
#else
    assert_int_equal(qcal_threads_set_count(4), QCAL_OK);
    assert_int_equal(qcal_threads_count(), 1);
    assert_int_equal(qcal_threads_for(big), 1);
    assert_int_equal(qcal_threads_set_count(0), QCAL_OK);
#endif
    int before = qcal_threads_count();
    assert_int_equal(qcal_threads_set_count(-1), QCAL_ERR_INVALID_ARG);
    assert_non_null(strstr(qcal_last_error(), "thread count -1"));
    assert_int_equal(qcal_threads_set_count(QCAL_MAX_THREADS + 1), QCAL_ERR_INVALID_ARG);
    assert_int_equal(qcal_threads_count(), before);      /* unchanged */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status),
        cmocka_unit_test(test_sha256),
        cmocka_unit_test(test_tensor),
        cmocka_unit_test(test_atomic_file),
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
