/* unit.hostile_inputs: hostile input for every public reader and every CLI subcommand.
 *
 * Each case states the documented outcome (a status, or a policy such as "skipped and
 * counted") and the test checks it, plus the contracts that hold for every failure: a
 * negative status with a message, outputs untouched, no crash (ASan/UBSan build in .ci/run),
 * no hang (CLI runs are killed after 60 s). CLI cases also check exactly one stderr line
 * "qcal: ...", the documented exit code, no partial or temporary file left behind, and an
 * existing output file surviving a failed run byte for byte.
 * Every case is printed as a row "| area | case | expected | outcome |"; setting
 * QCAL_HOSTILE_TABLE=FILE also writes the rows there (docs/reliability.md holds a copy).
 * Inputs found by fuzzing (tests/regressions/<target>/) are replayed through their reader. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "qcal/calib.h"
#include "qcal/npy.h"
#include "qcal/qcal.h"
#include "qcal/safetensors.h"

#include "idx.h"   /* the examples' IDX reader (examples/cnn) */
#include "testutil.h"

/* ---- the outcome table ---- */

static FILE *table_out;
static int case_failures;

static void row(const char *area, const char *name, const char *expected, const char *outcome,
                bool ok)
{
    char line[2048];
    snprintf(line, sizeof line, "| %.64s | %.200s | %.64s | %.1000s%s |\n", area, name, expected, outcome,
             ok ? "" : " **MISMATCH**");
    for (char *c = line; *c; c++)   /* keep the table valid UTF-8: bytes >= 0x80 from inputs */
        if ((unsigned char)*c >= 0x80)
            *c = '?';
    print_message("%s", line);
    if (table_out)
        fputs(line, table_out);
    if (!ok)
        case_failures++;
}

static void end_of_group(void)
{
    int f = case_failures;
    case_failures = 0;
    if (f) {
        print_error("%d hostile-input case(s) did not give the documented outcome\n", f);
        fail();
    }
}

/* Library case: status got vs expected; a failure must carry a message. */
static void lib_case(const char *area, const char *name, qcal_status got, qcal_status want)
{
    char outcome[512];
    const char *msg = qcal_last_error();
    bool ok = got == want;
    if (got < 0 && (!msg || !*msg))
        ok = false;
    if (got < 0)
        snprintf(outcome, sizeof outcome, "%s: %.160s", qcal_status_str(got), msg ? msg : "");
    else
        snprintf(outcome, sizeof outcome, "%s", qcal_status_str(got));
    for (char *c = outcome; *c; c++)
        if (*c == '|' || *c == '\n')
            *c = ' ';
    row(area, name, qcal_status_str(want), outcome, ok);
    qcal_clear_error();
}

/* ---- byte builders ---- */

typedef struct bytes {
    uint8_t *p;
    size_t n;
} bytes;

static void b_put(bytes *b, const void *src, size_t n)
{
    b->p = realloc(b->p, b->n + n + 1);
    assert_non_null(b->p);
    if (n)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void b_str(bytes *b, const char *s)
{
    b_put(b, s, strlen(s));
}

/* A .npy file: version 1.0 header dict padded with spaces + '\n' to a multiple of 64. */
static bytes npy(const char *dict, const void *payload, size_t plen)
{
    bytes b = { 0 };
    size_t dl = strlen(dict);
    size_t total = 10 + dl + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hl = dl + pad + 1;
    b_put(&b, "\x93NUMPY\x01\x00", 8);
    uint8_t h[2] = { (uint8_t)(hl & 0xff), (uint8_t)(hl >> 8) };
    b_put(&b, h, 2);
    b_str(&b, dict);
    for (size_t i = 0; i < pad; i++)
        b_put(&b, " ", 1);
    b_put(&b, "\n", 1);
    b_put(&b, payload, plen);
    return b;
}

/* A safetensors file: 8-byte little-endian header length, header, data. */
static bytes st(const char *header, const void *payload, size_t plen)
{
    bytes b = { 0 };
    uint64_t n = strlen(header);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    b_put(&b, len, 8);
    b_str(&b, header);
    b_put(&b, payload, plen);
    return b;
}

static void be32(bytes *b, uint32_t v)
{
    uint8_t x[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };
    b_put(b, x, 4);
}

static bytes gz(const bytes *src)
{
    bytes out = { 0 };
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&z, (uLong)src->n) + 64;
    out.p = malloc(cap);
    assert_non_null(out.p);
    z.next_in = src->p;
    z.avail_in = (uInt)src->n;
    z.next_out = out.p;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

static char tmp_dir[256];

static const char *tmp_path(const char *name)
{
    return tu_path(tmp_dir, name);
}

/* ---- readers through memory, with the untouched-output check ---- */

static qcal_status npy_mem(const bytes *b)
{
    qcal_npy_array a;
    memset(&a, 0x5A, sizeof a);
    qcal_npy_array before;
    memcpy(&before, &a, sizeof a);
    qcal_status s = qcal_npy_parse(b->p ? b->p : (const uint8_t *)"", b->n, &a);
    if (s < 0)
        assert_memory_equal(&a, &before, sizeof a);
    else
        qcal_npy_array_free(&a);
    return s;
}

static qcal_status st_file(const bytes *b)
{
    const char *path = tmp_path("case.safetensors");
    tu_write_bytes(path, b->p, b->n);
    qcal_safetensors *h = (qcal_safetensors *)(uintptr_t)0x1;
    qcal_status s = qcal_safetensors_open(path, &h);
    if (s < 0) {
        assert_true(h == (qcal_safetensors *)(uintptr_t)0x1);
    } else {
        /* Opened: reading every tensor must also be safe (UNSUPPORTED for other dtypes). */
        int64_t n = 0;
        assert_int_equal(qcal_safetensors_count(h, &n), QCAL_OK);
        for (int64_t i = 0; i < n; i++) {
            qcal_safetensors_tensor_info info;
            assert_int_equal(qcal_safetensors_info(h, i, &info), QCAL_OK);
            if (info.numel > 0 && info.numel < (1 << 20)) {
                float *dst = malloc((size_t)info.numel * sizeof(float));
                assert_non_null(dst);
                qcal_status r = qcal_safetensors_read_f32(h, i, 0, info.numel, dst);
                if (r != QCAL_OK)
                    s = r;
                free(dst);
            }
        }
        qcal_safetensors_close(&h);
    }
    unlink(path);
    return s;
}

static qcal_status idx_mem(const bytes *b)
{
    idx_file *h = (idx_file *)(uintptr_t)0x1;
    qcal_status s = idx_read_memory(b->p ? b->p : (const uint8_t *)"", b->n, &h);
    if (s < 0)
        assert_true(h == (idx_file *)(uintptr_t)0x1);
    else
        idx_destroy(&h);
    return s;
}

static qcal_status table_mem(const char *text, size_t n)
{
    qcal_calib_table *t = (qcal_calib_table *)(uintptr_t)0x1;
    qcal_status s = qcal_calib_table_parse_json(text, n, &t);
    if (s < 0)
        assert_true(t == (qcal_calib_table *)(uintptr_t)0x1);
    else
        qcal_calib_table_destroy(&t);
    return s;
}

static qcal_status rules_mem(const char *text, size_t n)
{
    qcal_calib_rules *r = (qcal_calib_rules *)(uintptr_t)0x1;
    qcal_status s = qcal_calib_rules_parse(text, n, &r);
    if (s < 0)
        assert_true(r == (qcal_calib_rules *)(uintptr_t)0x1);
    else
        qcal_calib_rules_destroy(&r);
    return s;
}

/* Every strict prefix of a valid input must be rejected with the given status. */
typedef qcal_status (*bytes_reader)(const bytes *b);
static void every_prefix(const char *area, const char *name, bytes_reader rd, const bytes *valid,
                         qcal_status want)
{
    size_t bad = 0, first_bad = 0;
    qcal_status first_got = QCAL_OK;
    for (size_t n = 0; n < valid->n; n++) {
        bytes pre = { valid->p, n };
        qcal_status s = rd(&pre);
        if (s != want || !*qcal_last_error()) {
            if (!bad) {
                first_bad = n;
                first_got = s;
            }
            bad++;
        }
        qcal_clear_error();
    }
    char outcome[256];
    if (bad)
        snprintf(outcome, sizeof outcome, "%zu of %zu prefixes wrong, first at %zu bytes: %s",
                 bad, valid->n, first_bad, qcal_status_str(first_got));
    else
        snprintf(outcome, sizeof outcome, "all %zu prefixes: %s", valid->n, qcal_status_str(want));
    row(area, name, qcal_status_str(want), outcome, bad == 0);
}

static const float f12[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };

/* ---- .npy ---- */

static void test_npy_reader(void **state)
{
    (void)state;
    const char *A = "npy";
    bytes ok = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", f12, 48);
    lib_case(A, "valid float32 (3, 4)", npy_mem(&ok), QCAL_OK);
    every_prefix(A, "truncated at every byte (header and data)", npy_mem, &ok, QCAL_ERR_FORMAT);
    bytes empty = { 0 };
    lib_case(A, "empty buffer", npy_mem(&empty), QCAL_ERR_FORMAT);

    /* lying header-length field: longer than the file, shorter than the dict */
    bytes lie = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", f12, 48);
    lie.p[8] = 0xff;
    lie.p[9] = 0x7f;
    lib_case(A, "header length field 32767 (past end of file)", npy_mem(&lie), QCAL_ERR_FORMAT);
    lie.p[8] = 20;
    lie.p[9] = 0;
    lib_case(A, "header length field 20 (cuts the dict)", npy_mem(&lie), QCAL_ERR_FORMAT);
    free(lie.p);

    /* lying shape: more or fewer elements than the data */
    bytes more = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", f12, 48);
    lib_case(A, "shape says 16 elements, data has 12", npy_mem(&more), QCAL_ERR_FORMAT);
    bytes fewer = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", f12, 48);
    lib_case(A, "shape says 8 elements, data has 12 (trailing bytes)", npy_mem(&fewer),
             QCAL_ERR_FORMAT);
    bytes neg = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 4), }", f12, 48);
    lib_case(A, "negative dimension", npy_mem(&neg), QCAL_ERR_FORMAT);
    bytes ovf = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                    f12, 48);
    lib_case(A, "shape product 2^64 (beyond 2^63)", npy_mem(&ovf), QCAL_ERR_OVERFLOW);
    bytes ovf2 = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2305843009213693952, ), }",
                     f12, 48);
    lib_case(A, "2^61 elements: bytes overflow 2^63", npy_mem(&ovf2), QCAL_ERR_OVERFLOW);
    bytes huge_dim = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, ), }",
                         f12, 48);
    lib_case(A, "dimension beyond int64", npy_mem(&huge_dim), QCAL_ERR_OVERFLOW);
    bytes ninedim = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }",
                        f12, 4);
    lib_case(A, "9 dimensions", npy_mem(&ninedim), QCAL_ERR_UNSUPPORTED);

    /* dtype problems */
    bytes be = npy("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", f12, 48);
    lib_case(A, "big-endian '>f4'", npy_mem(&be), QCAL_ERR_UNSUPPORTED);
    bytes cplx = npy("{'descr': '<c8', 'fortran_order': False, 'shape': (6,), }", f12, 48);
    lib_case(A, "complex64", npy_mem(&cplx), QCAL_ERR_UNSUPPORTED);
    bytes fort = npy("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", f12, 48);
    lib_case(A, "Fortran order (3, 4)", npy_mem(&fort), QCAL_ERR_UNSUPPORTED);
    bytes nodescr = npy("{'fortran_order': False, 'shape': (3, 4), }", f12, 48);
    lib_case(A, "missing 'descr' key", npy_mem(&nodescr), QCAL_ERR_FORMAT);
    bytes nonutf = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), '\xff\xfe': 1}",
                       f12, 48);
    lib_case(A, "non-UTF-8 bytes in the header", npy_mem(&nonutf), QCAL_ERR_FORMAT);

    /* a float reader given integers: the dtype-mismatch error */
    const uint8_t u8[6] = { 1, 2, 3, 4, 5, 6 };
    bytes ints = npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", u8, 6);
    tu_write_bytes(tmp_path("u8.npy"), ints.p, ints.n);
    qcal_npy_array arr;
    memset(&arr, 0, sizeof arr);
    lib_case(A, "uint8 file read as float32", qcal_npy_read_f32(tmp_path("u8.npy"), &arr),
             QCAL_ERR_MISMATCH);
    lib_case(A, "path that does not exist", qcal_npy_read(tmp_path("missing.npy"), &arr),
             QCAL_ERR_NOT_FOUND);
    lib_case(A, "a directory as path", qcal_npy_read(tmp_dir, &arr), QCAL_ERR_IO);

    /* 0- and 1-element arrays are valid */
    bytes zero = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }", NULL, 0);
    lib_case(A, "0-element (0, 4)", npy_mem(&zero), QCAL_OK);
    bytes one = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f12, 4);
    lib_case(A, "0-d array (1 element)", npy_mem(&one), QCAL_OK);

    /* writer: an existing file survives a failed write; unwritable places fail cleanly */
    const int64_t shape[2] = { 3, 4 };
    tu_write_bytes(tmp_path("keep.npy"), "precious", 8);
    const int64_t badshape[2] = { -1, 4 };
    lib_case(A, "write with a negative shape over an existing file",
             qcal_npy_write(tmp_path("keep.npy"), QCAL_NPY_F32, 2, badshape, f12),
             QCAL_ERR_INVALID_ARG);
    char kept[16] = { 0 };
    FILE *f = fopen(tmp_path("keep.npy"), "rb");
    assert_non_null(f);
    assert_int_equal(fread(kept, 1, sizeof kept, f), 8);
    fclose(f);
    assert_memory_equal(kept, "precious", 8);
    lib_case(A, "write into a directory that does not exist",
             qcal_npy_write(tmp_path("no/such/dir/x.npy"), QCAL_NPY_F32, 2, shape, f12), QCAL_ERR_IO);
    lib_case(A, "write into /proc (unwritable even for root)",
             qcal_npy_write("/proc/qcal_hostile.npy", QCAL_NPY_F32, 2, shape, f12), QCAL_ERR_IO);

    bytes *all[] = { &ok, &more, &fewer, &neg, &ovf, &ovf2, &huge_dim, &ninedim, &be, &cplx,
                     &fort, &nodescr, &nonutf, &ints, &zero, &one };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->p);
    end_of_group();
}

/* ---- safetensors ---- */

static void test_safetensors_reader(void **state)
{
    (void)state;
    const char *A = "safetensors";
    bytes ok = st("{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", f12, 48);
    lib_case(A, "valid F32 (3, 4)", st_file(&ok), QCAL_OK);
    every_prefix(A, "truncated at every byte", st_file, &ok, QCAL_ERR_FORMAT);
    bytes empty = { 0 };
    lib_case(A, "empty file", st_file(&empty), QCAL_ERR_FORMAT);

    bytes lie = st("{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", f12, 48);
    lie.p[5] = 0x01;   /* header length 2^40 + ... */
    lib_case(A, "header length field 2^40 (past end, beyond 100 MiB)", st_file(&lie),
             QCAL_ERR_FORMAT);
    lie.p[5] = 0;
    lie.p[0] = 0xff;   /* 255: longer than the header, inside the file? no: past the end */
    lib_case(A, "header length field 255 (past end of file)", st_file(&lie), QCAL_ERR_FORMAT);
    lie.p[0] = 10;
    lib_case(A, "header length field 10 (cuts the JSON)", st_file(&lie), QCAL_ERR_FORMAT);
    free(lie.p);

    struct { const char *name, *header; size_t plen; qcal_status want; } cases[] = {
        { "offsets lie: end past the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,96]}}", 48, QCAL_ERR_FORMAT },
        { "offsets lie: size disagrees with shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,3],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_FORMAT },
        { "offsets reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[48,0]}}", 48, QCAL_ERR_FORMAT },
        { "negative dimension", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-3,4],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_FORMAT },
        { "shape product 2^96 (beyond 2^63)", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_OVERFLOW },
        { "2^62 F32 elements: bytes overflow 2^63", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_OVERFLOW },
        { "dimension beyond int64", "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_FORMAT },
        { "unknown dtype 'Q7' (fails open)", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[12],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_UNSUPPORTED },
        { "dtype I32 (known, not convertible): read", "{\"a\":{\"dtype\":\"I32\",\"shape\":[12],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_UNSUPPORTED },
        { "extra member in an entry", "{\"a\":{\"dtype\":\"F32\",\"shape\":[12],\"data_offsets\":[0,48],\"x\":1}}", 48, QCAL_ERR_FORMAT },
        { "duplicate tensor name", "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]},\"a\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[24,48]}}", 48, QCAL_ERR_FORMAT },
        { "empty tensor name", "{\"\":{\"dtype\":\"F32\",\"shape\":[12],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_FORMAT },
        { "non-UTF-8 tensor name", "{\"\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[12],\"data_offsets\":[0,48]}}", 48, QCAL_ERR_FORMAT },
        { "header is an array", "[1,2,3]", 0, QCAL_ERR_FORMAT },
        { "0-element tensor", "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[0,0]}}", 0, QCAL_OK },
        { "1-element scalar", "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, QCAL_OK },
        { "NaN/Inf/denormal F32 data (read as is)", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12, QCAL_OK },
    };
    const float special[3] = { NAN, -INFINITY, 1e-45f };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const void *payload = strstr(cases[i].name, "NaN") ? (const void *)special : (const void *)f12;
        bytes b = st(cases[i].header, payload, cases[i].plen);
        lib_case(A, cases[i].name, st_file(&b), cases[i].want);
        free(b.p);
    }
    /* a 64 KiB tensor name is accepted and found again */
    size_t L = 65536;
    char *name = malloc(L + 1);
    assert_non_null(name);
    memset(name, 'n', L);
    name[L] = '\0';
    char *hdr = malloc(L + 128);
    assert_non_null(hdr);
    snprintf(hdr, L + 128, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[12],\"data_offsets\":[0,48]}}", name);
    bytes lb = st(hdr, f12, 48);
    tu_write_bytes(tmp_path("long.safetensors"), lb.p, lb.n);
    qcal_safetensors *h = NULL;
    qcal_status s = qcal_safetensors_open(tmp_path("long.safetensors"), &h);
    int64_t idx = -1;
    if (s == QCAL_OK)
        s = qcal_safetensors_find(h, name, &idx);
    lib_case(A, "64 KiB tensor name (open + find)", s, QCAL_OK);
    qcal_safetensors_close(&h);
    free(lb.p);
    free(hdr);
    free(name);
    lib_case(A, "path that does not exist",
             qcal_safetensors_open(tmp_path("missing.safetensors"), &h), QCAL_ERR_NOT_FOUND);
    lib_case(A, "a directory as path", qcal_safetensors_open(tmp_dir, &h), QCAL_ERR_IO);
    qcal_tensor t;
    const int64_t shape[1] = { 12 };
    assert_int_equal(qcal_tensor_init(&t, f12, 1, shape), QCAL_OK);
    const char *names[2] = { "x", "x" };
    qcal_tensor tt[2] = { t, t };
    tu_write_bytes(tmp_path("keep.safetensors"), "precious", 8);
    lib_case(A, "write duplicate names over an existing file",
             qcal_safetensors_write_f32(tmp_path("keep.safetensors"), 2, names, tt, 0, NULL),
             QCAL_ERR_INVALID_ARG);
    struct stat sb;
    assert_int_equal(stat(tmp_path("keep.safetensors"), &sb), 0);
    assert_int_equal(sb.st_size, 8);
    lib_case(A, "write into /proc", qcal_safetensors_write_f32("/proc/qcal.safetensors", 1, names,
                                                                tt, 0, NULL), QCAL_ERR_IO);
    free(ok.p);
    end_of_group();
}

/* ---- IDX ---- */

static void test_idx_reader(void **state)
{
    (void)state;
    const char *A = "idx";
    bytes ok = { 0 };
    be32(&ok, 0x00000803);
    be32(&ok, 2);
    be32(&ok, 2);
    be32(&ok, 3);
    uint8_t pix[12];
    for (int i = 0; i < 12; i++)
        pix[i] = (uint8_t)(i * 20);
    b_put(&ok, pix, 12);
    lib_case(A, "valid raw images [2, 2, 3]", idx_mem(&ok), QCAL_OK);
    every_prefix(A, "raw, truncated at every byte", idx_mem, &ok, QCAL_ERR_FORMAT);
    bytes z = gz(&ok);
    lib_case(A, "valid gzip", idx_mem(&z), QCAL_OK);
    every_prefix(A, "gzip, truncated at every byte", idx_mem, &z, QCAL_ERR_FORMAT);
    bytes corrupt = { 0 };
    b_put(&corrupt, z.p, z.n);
    corrupt.p[z.n / 2] ^= 0x55;
    corrupt.p[z.n / 2 + 1] ^= 0xAA;
    lib_case(A, "gzip with corrupted deflate data / CRC", idx_mem(&corrupt), QCAL_ERR_FORMAT);
    bytes empty = { 0 };
    lib_case(A, "empty buffer", idx_mem(&empty), QCAL_ERR_FORMAT);

    bytes extra = { 0 };
    b_put(&extra, ok.p, ok.n);
    b_put(&extra, "xyz", 3);
    lib_case(A, "dimensions say 12 bytes, 15 present", idx_mem(&extra), QCAL_ERR_FORMAT);
    struct { const char *name; uint32_t magic; int nd; uint32_t dims[4]; qcal_status want; } c[] = {
        { "bad magic 0x12345678", 0x12345678, 1, { 1 }, QCAL_ERR_FORMAT },
        { "0 dimensions", 0x00000800, 0, { 0 }, QCAL_ERR_FORMAT },
        { "5 dimensions", 0x00000805, 4, { 1, 1, 1, 1 }, QCAL_ERR_FORMAT },
        { "float32 elements (type 0x0D)", 0x00000D01, 1, { 1 }, QCAL_ERR_UNSUPPORTED },
        { "dims product 2^128 (4 x 0xFFFFFFFF)", 0x00000804, 4,
          { 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu }, QCAL_ERR_FORMAT },
        { "dims lie: 2^32-1 bytes claimed", 0x00000801, 1, { 0xFFFFFFFFu }, QCAL_ERR_FORMAT },
        { "0-element labels [0]", 0x00000801, 1, { 0 }, QCAL_OK },
        { "1-element labels [1]", 0x00000801, 1, { 1 }, QCAL_OK },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        bytes b = { 0 };
        be32(&b, c[i].magic);
        for (int d = 0; d < c[i].nd; d++)
            be32(&b, c[i].dims[d]);
        if (c[i].want == QCAL_OK && c[i].dims[0] == 1)
            b_put(&b, "\x07", 1);
        else if (c[i].magic == 0x00000D01)
            b_put(&b, "\x3f\x80\x00\x00", 4);
        lib_case(A, c[i].name, idx_mem(&b), c[i].want);
        free(b.p);
    }
    idx_file *h = NULL;
    qcal_status s = idx_read_file(tmp_path("missing-ubyte.gz"), &h);
    lib_case(A, "path that does not exist", s, QCAL_ERR_NOT_FOUND);
    free(ok.p);
    free(z.p);
    free(corrupt.p);
    free(extra.p);
    end_of_group();
}

/* ---- calibration-table JSON and rules ---- */

static const char *table_entry_fmt =
    "{\"format\": \"qcal-calibration-table\", \"version\": 1, \"entries\": [\n"
    "{\"fqn\": %s, \"role\": \"activation\", \"observer\": %s, \"dtype\": \"quint8\", "
    "\"qscheme\": \"per_tensor_affine\", \"axis\": 0, \"quant_min\": %s, \"quant_max\": %s, "
    "\"channels\": 1, \"batches\": 1, \"elements\": 4, \"nonfinite\": 0, \"no_data\": false, "
    "\"min\": [%s], \"max\": [1.0], \"scale\": [%s], \"zero_point\": [127], \"zero_point_float\": [0]}]}\n";

static qcal_status table_case(const char *fqn, const char *obs, const char *qmin, const char *qmax,
                              const char *minv, const char *scale)
{
    size_t cap = strlen(fqn) + 4096;
    char *buf = malloc(cap);
    assert_non_null(buf);
    snprintf(buf, cap, table_entry_fmt, fqn, obs, qmin, qmax, minv, scale);
    qcal_status s = table_mem(buf, strlen(buf));
    free(buf);
    return s;
}

static void test_table_and_rules_readers(void **state)
{
    (void)state;
    const char *A = "calib table";
    /* Valid reference entry: [-1, 1] on quint8 -> scale 2/255, zero-point 127 (the reader
     * recomputes qparams from the range and rejects a table that disagrees). Its validity is itself asserted, so the variants below test one field each. */
    lib_case(A, "valid entry", table_case("\"conv1\"", "\"minmax\"", "0", "255", "-1.0", "0.00784313772"), QCAL_OK);
    {
        char buf[4096];
        snprintf(buf, sizeof buf, table_entry_fmt, "\"conv1\"", "\"minmax\"", "0", "255", "-1.0",
                 "0.00784313772");
        bytes v = { (uint8_t *)buf, strlen(buf) };
        size_t bad = 0;
        for (size_t n = 0; n < v.n; n++) {
            /* Prefixes: only those that end inside the JSON value must fail (a prefix that
             * drops just the trailing newline is still the whole document). */
            qcal_status s = table_mem(buf, n);
            bool whole = n == v.n - 1;
            if (whole ? s != QCAL_OK : s != QCAL_ERR_FORMAT)
                bad++;
            qcal_clear_error();
        }
        char outcome[128];
        snprintf(outcome, sizeof outcome, "%zu prefixes, %zu wrong", v.n, bad);
        row(A, "truncated at every byte", "format error", outcome, bad == 0);
    }
    lib_case(A, "empty text", table_mem("", 0), QCAL_ERR_FORMAT);
    lib_case(A, "scale 0", table_case("\"a\"", "\"minmax\"", "0", "255", "-1.0", "0"), QCAL_ERR_FORMAT);
    lib_case(A, "scale -1", table_case("\"a\"", "\"minmax\"", "0", "255", "-1.0", "-1"), QCAL_ERR_FORMAT);
    lib_case(A, "scale 1e39 (inf as float32)", table_case("\"a\"", "\"minmax\"", "0", "255", "-1.0", "1e39"), QCAL_ERR_FORMAT);
    lib_case(A, "scale NaN (not JSON)", table_case("\"a\"", "\"minmax\"", "0", "255", "-1.0", "NaN"), QCAL_ERR_FORMAT);
    lib_case(A, "min 1e39 (beyond float32)", table_case("\"a\"", "\"minmax\"", "0", "255", "1e39", "0.00784313772"), QCAL_ERR_FORMAT);
    lib_case(A, "quant range of width 0 (0..0)", table_case("\"a\"", "\"minmax\"", "0", "0", "-1.0", "0.00784313772"), QCAL_ERR_FORMAT);
    lib_case(A, "quant_min > quant_max", table_case("\"a\"", "\"minmax\"", "200", "100", "-1.0", "0.00784313772"), QCAL_ERR_FORMAT);
    lib_case(A, "quant range beyond quint8", table_case("\"a\"", "\"minmax\"", "0", "1000", "-1.0", "0.00784313772"), QCAL_ERR_FORMAT);
    lib_case(A, "unknown observer name", table_case("\"a\"", "\"kmeans\"", "0", "255", "-1.0", "0.00784313772"), QCAL_ERR_FORMAT);
    lib_case(A, "non-UTF-8 fqn", table_case("\"\xc3\x28\"", "\"minmax\"", "0", "255", "-1.0", "0.00784313772"), QCAL_ERR_FORMAT);
    {
        size_t L = 100000;
        char *fqn = malloc(L + 3);
        assert_non_null(fqn);
        fqn[0] = '"';
        memset(fqn + 1, 'f', L);
        fqn[L + 1] = '"';
        fqn[L + 2] = '\0';
        lib_case(A, "100 000-byte fqn", table_case(fqn, "\"minmax\"", "0", "255", "-1.0", "0.00784313772"), QCAL_OK);
        free(fqn);
    }
    {
        /* 100 000 nested arrays: the parser's depth limit, not the stack, stops it. */
        size_t L = 100000;
        char *deep = malloc(L);
        assert_non_null(deep);
        memset(deep, '[', L);
        lib_case(A, "100 000 nested arrays", table_mem(deep, L), QCAL_ERR_FORMAT);
        free(deep);
    }

    const char *R = "rules";
    const char *okr = "*.weight weight per_channel_minmax dtype=qint8 qscheme=per_channel_symmetric\n";
    lib_case(R, "valid rule", rules_mem(okr, strlen(okr)), QCAL_OK);
    struct { const char *name, *text; qcal_status want; } rc[] = {
        { "empty file (no rules)", "", QCAL_OK },
        { "unknown observer name", "* activation kmeans\n", QCAL_ERR_FORMAT },
        { "unknown role", "* bias minmax\n", QCAL_ERR_FORMAT },
        { "unknown key", "* activation minmax colour=red\n", QCAL_ERR_FORMAT },
        { "quant range of width 0 (0..0)", "* activation minmax quant_min=0 quant_max=0\n", QCAL_ERR_FORMAT },
        { "quant range 5..5 (width 0, excludes 0)", "* activation minmax quant_min=5 quant_max=5\n", QCAL_ERR_FORMAT },
        { "quant_min > quant_max", "* activation minmax quant_min=9 quant_max=5\n", QCAL_ERR_FORMAT },
        { "only quant_min", "* activation minmax quant_min=5\n", QCAL_ERR_FORMAT },
        { "bins=0", "* activation histogram bins=0\n", QCAL_ERR_FORMAT },
        { "bins beyond int32", "* activation histogram bins=99999999999\n", QCAL_ERR_FORMAT },
        { "eps=nan", "* activation minmax eps=nan\n", QCAL_ERR_FORMAT },
        { "averaging_constant=0", "* activation moving_average_minmax averaging_constant=0\n", QCAL_ERR_FORMAT },
        { "percentile=101", "* activation percentile percentile=101\n", QCAL_ERR_FORMAT },
        { "unterminated quoted glob", "\"abc activation minmax\n", QCAL_ERR_FORMAT },
        { "missing observer", "* activation\n", QCAL_ERR_FORMAT },
        { "per-tensor qscheme for a per-channel observer", "* weight per_channel_minmax qscheme=per_tensor_affine\n", QCAL_ERR_FORMAT },
    };
    for (size_t i = 0; i < sizeof rc / sizeof rc[0]; i++)
        lib_case(R, rc[i].name, rules_mem(rc[i].text, strlen(rc[i].text)), rc[i].want);
    const char nonutf[] = "\xff\xfe* activation minmax\n";
    lib_case(R, "non-UTF-8 glob (bytes, matched as bytes)", rules_mem(nonutf, sizeof nonutf - 1), QCAL_OK);
    const char nul[] = "* activation\0 minmax\n";
    lib_case(R, "NUL byte inside a line", rules_mem(nul, sizeof nul - 1), QCAL_ERR_FORMAT);
    {
        size_t L = 1 << 20;
        char *longline = malloc(L + 32);
        assert_non_null(longline);
        memset(longline, 'g', L);
        strcpy(longline + L, " activation minmax\n");
        lib_case(R, "1 MiB line (limit: 4096 bytes a line)", rules_mem(longline, strlen(longline)), QCAL_ERR_FORMAT);
        free(longline);
    }
    qcal_calib_rules *r = NULL;
    lib_case(R, "path that does not exist", qcal_calib_rules_load_file(tmp_path("missing.rules"), &r),
             QCAL_ERR_NOT_FOUND);
    end_of_group();
}

/* ---- observers and qparams: the numerical policies ---- */

static qcal_status observe_one(qcal_observer_kind kind, qcal_nonfinite_policy pol, const float *x,
                               int64_t n, float *scale, int32_t *zp, uint64_t *nonfinite)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);
    cfg.nonfinite = pol;
    qcal_observer *o = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &o), QCAL_OK);
    qcal_tensor t;
    int64_t shape2[2] = { 1, n };
    bool pc = kind == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
              kind == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
    assert_int_equal(qcal_tensor_init(&t, x, pc ? 2 : 1, pc ? shape2 : shape2 + 1), QCAL_OK);
    qcal_status s = qcal_observer_update(o, &t);
    if (s >= 0) {
        float zpf = 0;
        int64_t ch = 0;
        s = tu_observer_qparams(o, 1, scale, zp, &zpf, &ch);
    }
    if (nonfinite)
        assert_int_equal(qcal_observer_nonfinite(o, nonfinite), QCAL_OK);
    qcal_observer_destroy(&o);
    return s;
}

static void test_numeric_policies(void **state)
{
    (void)state;
    const char *A = "observer";
    char outcome[256];
    for (int kind = 0; kind < QCAL_OBSERVER_KIND_COUNT; kind++) {
        const char *kn = qcal_observer_kind_name((qcal_observer_kind)kind);
        char name[128];
        float scale = 0;
        int32_t zp = -1;
        uint64_t nf = 0;

        /* NaN/Inf: skipped and counted by default; an error under the strict policy. */
        const float mixed[6] = { 1.0f, NAN, -2.0f, INFINITY, -INFINITY, 0.5f };
        qcal_status s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, mixed, 6, &scale, &zp, &nf);
        bool ok = s == QCAL_OK && nf == 3 && isfinite(scale) && scale > 0;
        snprintf(outcome, sizeof outcome, "%s, %llu skipped, scale %.9g", qcal_status_str(s),
                 (unsigned long long)nf, scale);
        snprintf(name, sizeof name, "%s: NaN, +Inf, -Inf among 6 values", kn);
        row(A, name, "ok, 3 skipped and counted", outcome, ok);
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_ERROR, mixed, 6, &scale, &zp, NULL);
        snprintf(name, sizeof name, "%s: same, nonfinite=error", kn);
        lib_case(A, name, s, QCAL_ERR_NONFINITE);

        /* Only NaN: no data -> scale 1, zero-point 0 and QCAL_NO_DATA. */
        const float nans[3] = { NAN, NAN, NAN };
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, nans, 3, &scale, &zp, &nf);
        ok = s == QCAL_NO_DATA && scale == 1.0f && zp == 0;
        snprintf(outcome, sizeof outcome, "%s, scale %g, zero-point %d", qcal_status_str(s), scale, zp);
        snprintf(name, sizeof name, "%s: all NaN", kn);
        row(A, name, "no data: scale 1, zero-point 0", outcome, ok);

        /* Near FLT_MAX: the range width overflows float; the scale must stay finite. */
        const float big[4] = { -FLT_MAX, FLT_MAX, -FLT_MAX * 0.5f, FLT_MAX * 0.75f };
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, big, 4, &scale, &zp, &nf);
        ok = s == QCAL_OK && isfinite(scale) && scale > 0;
        snprintf(outcome, sizeof outcome, "%s, scale %.9g, zero-point %d", qcal_status_str(s), scale, zp);
        snprintf(name, sizeof name, "%s: values +-FLT_MAX", kn);
        row(A, name, "finite scale > 0", outcome, ok);

        /* All equal (zero range) and denormals: eps keeps the scale positive and finite. */
        const float same[5] = { 3.0f, 3.0f, 3.0f, 3.0f, 3.0f };
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, same, 5, &scale, &zp, &nf);
        ok = s == QCAL_OK && isfinite(scale) && scale > 0;
        snprintf(outcome, sizeof outcome, "%s, scale %.9g, zero-point %d", qcal_status_str(s), scale, zp);
        snprintf(name, sizeof name, "%s: all values equal (3.0)", kn);
        row(A, name, "finite scale > 0", outcome, ok);
        const float den[4] = { 1e-45f, -1e-45f, 1e-40f, 0.0f };
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, den, 4, &scale, &zp, &nf);
        ok = s == QCAL_OK && isfinite(scale) && scale > 0;
        snprintf(outcome, sizeof outcome, "%s, scale %.9g, zero-point %d", qcal_status_str(s), scale, zp);
        snprintf(name, sizeof name, "%s: denormals only", kn);
        row(A, name, "finite scale > 0", outcome, ok);

        /* 1 element is data; 0 elements is QCAL_ERR_EMPTY. */
        const float one[1] = { -0.75f };
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, one, 1, &scale, &zp, &nf);
        ok = s == QCAL_OK && isfinite(scale) && scale > 0;
        snprintf(outcome, sizeof outcome, "%s, scale %.9g", qcal_status_str(s), scale);
        snprintf(name, sizeof name, "%s: 1 element", kn);
        row(A, name, "ok", outcome, ok);
        s = observe_one((qcal_observer_kind)kind, QCAL_NONFINITE_SKIP, one, 0, &scale, &zp, &nf);
        snprintf(name, sizeof name, "%s: 0 elements", kn);
        lib_case(A, name, s, QCAL_ERR_EMPTY);
    }
    qcal_observer_kind k;
    lib_case(A, "unknown observer name 'kmeans'", qcal_observer_kind_parse("kmeans", &k),
             QCAL_ERR_INVALID_ARG);
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_MINMAX);
    cfg.q.custom_range = true;
    cfg.q.quant_min = 0;
    cfg.q.quant_max = 0;
    lib_case(A, "quant range of width 0 (0..0)", qcal_observer_config_validate(&cfg),
             QCAL_ERR_INVALID_ARG);
    const char *T = "tensor";
    qcal_tensor t;
    float v = 0;
    const int64_t neg[2] = { 3, -1 }, ovf[3] = { INT64_C(1) << 32, INT64_C(1) << 32, 1 },
                  ovf2[2] = { INT64_MAX, 2 };
    lib_case(T, "negative dimension", qcal_tensor_init(&t, &v, 2, neg), QCAL_ERR_INVALID_ARG);
    lib_case(T, "shape product 2^64", qcal_tensor_init(&t, &v, 3, ovf), QCAL_ERR_OVERFLOW);
    lib_case(T, "shape product (2^63 - 1) x 2", qcal_tensor_init(&t, &v, 2, ovf2), QCAL_ERR_OVERFLOW);
    end_of_group();
}

/* ---- the CLI ---- */

static const char *qcal_bin;

typedef struct cli_result {
    int code;        /* exit status, or -1 when killed (crash or hang) */
    int sig;
    char err[8192];
} cli_result;

/* Runs qcal with argv (NULL-terminated, without argv[0]); kills it after 60 s. */
static cli_result run_qcal(const char *const *args)
{
    cli_result r;
    memset(&r, 0, sizeof r);
    const char *errpath = tmp_path("stderr.txt");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int n = open("/dev/null", O_RDWR);
        if (e < 0 || n < 0)
            _exit(126);
        dup2(n, 0);
        dup2(n, 1);
        dup2(e, 2);
        const char *argv[64];
        int argc = 0;
        argv[argc++] = qcal_bin;
        for (int i = 0; args[i] && argc < 63; i++)
            argv[argc++] = args[i];
        argv[argc] = NULL;
        execv(qcal_bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r.code = -1;
            r.sig = -1;   /* hang */
            return r;
        }
        usleep(2000);
    }
    if (WIFEXITED(status)) {
        r.code = WEXITSTATUS(status);
    } else {
        r.code = -1;
        r.sig = WTERMSIG(status);
    }
    FILE *f = fopen(errpath, "rb");
    if (f) {
        size_t n = fread(r.err, 1, sizeof r.err - 1, f);
        r.err[n] = '\0';
        fclose(f);
    }
    unlink(errpath);
    return r;
}

/* Names in tmp_dir, to find leftovers (temporary or partial files) after a failed run. */
static int dir_entries(const char *dir, char names[][128], int cap)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < cap) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(names[n++], 128, "%.127s", e->d_name);
    }
    closedir(d);
    return n;
}

static bool in_list(char names[][128], int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s))
            return true;
    return false;
}

/* One CLI case. args use "@X" for tmp_path("X"). out_name: the output file under tmp_dir
 * (or NULL); when it exists before the run and the run must fail, it must survive intact. */
static void cli_case(const char *name, int want_code, const char *out_name, const char *const *args)
{
    const char *argv[64];
    char buf[64][512];
    int n = 0;
    for (; args[n] && n < 63; n++) {
        if (args[n][0] == '@') {
            snprintf(buf[n], sizeof buf[n], "%s", tmp_path(args[n] + 1));
            argv[n] = buf[n];
        } else {
            argv[n] = args[n];
        }
    }
    argv[n] = NULL;
    char before[256][128], after[256][128];
    int nb = dir_entries(tmp_dir, before, 256);
    char *out_before = NULL;
    long out_len = -1;
    if (out_name) {
        FILE *f = fopen(tmp_path(out_name), "rb");
        if (f) {
            out_before = calloc(1, 1 << 16);
            assert_non_null(out_before);
            out_len = (long)fread(out_before, 1, 1 << 16, f);
            fclose(f);
        }
    }
    cli_result r = run_qcal(argv);
    int na = dir_entries(tmp_dir, after, 256);
    char outcome[1024];
    bool ok = r.code == want_code;
    const char *problem = "";
    static char leftover[256];
    if (r.code == -1) {
        problem = r.sig == -1 ? " (hang: killed after 60 s)" : " (killed by a signal)";
        ok = false;
    }
    size_t len = strlen(r.err);
    if (want_code != 0) {
        /* exactly one line "qcal: ...\n" */
        char *nl = strchr(r.err, '\n');
        if (strncmp(r.err, "qcal: ", 6) != 0 || !nl || nl[1] != '\0') {
            ok = false;
            problem = " (stderr is not one 'qcal: ' line)";
        }
        /* no new file, no temporary left over */
        for (int i = 0; i < na; i++) {
            if (!in_list(before, nb, after[i])) {
                ok = false;
                snprintf(leftover, sizeof leftover, " (left a file behind: %.127s)", after[i]);
                problem = leftover;
                unlink(tmp_path(after[i]));
            }
        }
        if (out_before) {
            char now[1 << 16];
            FILE *f = fopen(tmp_path(out_name), "rb");
            long nl2 = f ? (long)fread(now, 1, sizeof now, f) : -1;
            if (f)
                fclose(f);
            if (nl2 != out_len || memcmp(now, out_before, (size_t)out_len) != 0) {
                ok = false;
                problem = " (existing output changed)";
            }
        }
    }
    free(out_before);
    if (len && r.err[len - 1] == '\n')
        r.err[len - 1] = '\0';
    for (char *c = r.err; *c; c++)
        if (*c == '|' || *c == '\n')
            *c = ' ';
    snprintf(outcome, sizeof outcome, "exit %d%s: %.200s", r.code, problem, r.err);
    char expected[32];
    snprintf(expected, sizeof expected, "exit %d", want_code);
    row("cli", name, expected, outcome, ok);
}

#define CLI(name, code, out, ...)                               \
    do {                                                        \
        const char *a_[] = { __VA_ARGS__, NULL };               \
        cli_case(name, code, out, a_);                          \
    } while (0)

static void write_npy_f32(const char *name, int32_t ndim, const int64_t *shape, const float *x)
{
    assert_int_equal(qcal_npy_write(tmp_path(name), QCAL_NPY_F32, ndim, shape, x), QCAL_OK);
}

static void test_cli(void **state)
{
    (void)state;
    if (!qcal_bin) {
        print_message("QCAL_BIN not set (tools disabled): CLI cases skipped\n");
        skip();
    }
    /* fixtures */
    const int64_t s34[2] = { 3, 4 }, s0[1] = { 0 }, s1[1] = { 1 }, s4[1] = { 4 };
    write_npy_f32("good.npy", 2, s34, f12);
    write_npy_f32("zero.npy", 1, s0, NULL);
    const float one = 0.5f;
    write_npy_f32("one.npy", 1, s1, &one);
    const float nanx[4] = { NAN, 1.0f, INFINITY, -2.0f }, alln[4] = { NAN, NAN, NAN, NAN };
    write_npy_f32("nan.npy", 1, s4, nanx);
    write_npy_f32("allnan.npy", 1, s4, alln);
    const float big[4] = { -FLT_MAX, FLT_MAX, 0.0f, 1.0f };
    write_npy_f32("fltmax.npy", 1, s4, big);
    const uint8_t u8[4] = { 0, 1, 2, 255 };
    assert_int_equal(qcal_npy_write(tmp_path("u8.npy"), QCAL_NPY_U8, 1, s4, u8), QCAL_OK);
    tu_write_bytes(tmp_path("empty.npy"), "", 0);
    {
        bytes g = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", f12, 48);
        tu_write_bytes(tmp_path("trunc_header.npy"), g.p, 30);
        tu_write_bytes(tmp_path("trunc_data.npy"), g.p, g.n - 5);
        free(g.p);
        bytes o = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
                      f12, 48);
        tu_write_bytes(tmp_path("overflow.npy"), o.p, o.n);
        free(o.p);
        bytes st1 = st("{\"w\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}}", f12, 48);
        tu_write_bytes(tmp_path("w.safetensors"), st1.p, st1.n);
        tu_write_bytes(tmp_path("trunc.safetensors"), st1.p, st1.n - 7);
        free(st1.p);
    }
    tu_write_bytes(tmp_path("existing.out"), "precious output", 15);
    tu_write_bytes(tmp_path("notadir"), "x", 1);
    assert_int_equal(mkdir(tmp_path("dump"), 0700), 0);
    write_npy_f32("dump/conv1.npy", 2, s34, f12);
    assert_int_equal(mkdir(tmp_path("emptydump"), 0700), 0);
    assert_int_equal(mkdir(tmp_path("baddump"), 0700), 0);
    write_npy_f32("baddump/conv1.npy", 2, s34, f12);
    tu_write_bytes(tmp_path("baddump/conv2.npy"), "\x93NUMPY\x01\x00\xff", 9);
    tu_write_bytes(tmp_path("bad.rules"), "* activation kmeans\n", 20);
    tu_write_bytes(tmp_path("bad.json"), "{\"format\": \"qcal-calibration-table\"", 35);
    static char longname[100000];   /* below Linux's 128 KiB limit on one argument */
    memset(longname, 'a', sizeof longname - 1);

    /* general */
    CLI("no subcommand", 2, NULL, "--bogus-only");
    CLI("unknown subcommand", 2, NULL, "frobnicate");
    CLI("unknown option", 2, NULL, "observe", "--frob", "@good.npy");
    CLI("100 000-byte file name", 3, NULL, "observe", longname);
    /* observe */
    CLI("observe: path that does not exist", 3, NULL, "observe", "@missing.npy");
    CLI("observe: a directory as input", 3, NULL, "observe", "@dump");
    CLI("observe: empty file", 3, NULL, "observe", "@empty.npy");
    CLI("observe: truncated header", 3, NULL, "observe", "@trunc_header.npy");
    CLI("observe: truncated data", 3, NULL, "observe", "@trunc_data.npy");
    CLI("observe: shape product 2^64", 3, NULL, "observe", "@overflow.npy");
    CLI("observe: uint8 data (dtype mismatch)", 3, NULL, "observe", "@u8.npy");
    CLI("observe: 0-element tensor", 3, NULL, "observe", "@zero.npy");
    CLI("observe: 1-element tensor", 0, NULL, "observe", "@one.npy");
    CLI("observe: NaN/Inf skipped and counted", 0, NULL, "observe", "@nan.npy");
    CLI("observe: NaN/Inf with --strict", 1, NULL, "observe", "--strict", "@nan.npy");
    CLI("observe: all NaN (no data)", 1, NULL, "observe", "@allnan.npy");
    CLI("observe: values +-FLT_MAX", 0, NULL, "observe", "--observer", "histogram", "@fltmax.npy");
    CLI("observe: unknown observer name", 2, NULL, "observe", "--observer", "kmeans", "@good.npy");
    CLI("observe: quant range of width 0", 2, NULL, "observe", "--quant-min", "0", "--quant-max",
        "0", "@good.npy");
    CLI("observe: --bins 0", 2, NULL, "observe", "--observer", "histogram", "--bins", "0", "@good.npy");
    CLI("observe: --eps nan", 2, NULL, "observe", "--eps", "nan", "@good.npy");
    CLI("observe: axis outside the tensor", 2, NULL, "observe", "--observer", "per_channel_minmax",
        "--axis", "5", "@good.npy");
    /* quantize / dequantize */
    CLI("quantize: bad input, existing output kept", 3, "existing.out", "quantize", "--scale", "0.1",
        "--zero-point", "0", "@trunc_data.npy", "-o", "@existing.out");
    CLI("quantize: scale 0, existing output kept", 2, "existing.out", "quantize", "--scale", "0",
        "--zero-point", "0", "@good.npy", "-o", "@existing.out");
    CLI("quantize: scale 1e39 (inf as float32)", 2, NULL, "quantize", "--scale", "1e39",
        "--zero-point", "0", "@good.npy", "-o", "@q.npy");
    CLI("quantize: zero-point outside quint8", 2, NULL, "quantize", "--scale", "0.1", "--zero-point",
        "300", "@good.npy", "-o", "@q.npy");
    CLI("quantize: output in a directory that does not exist", 4, NULL, "quantize", "--scale", "0.1",
        "--zero-point", "0", "@good.npy", "-o", "@nodir/q.npy");
    CLI("quantize: output under a regular file", 4, NULL, "quantize", "--scale", "0.1",
        "--zero-point", "0", "@good.npy", "-o", "@notadir/q.npy");
    CLI("quantize: output in /proc (unwritable)", 4, NULL, "quantize", "--scale", "0.1",
        "--zero-point", "0", "@good.npy", "-o", "/proc/qcal_q.npy");
    CLI("quantize: 0-element tensor", 0, NULL, "quantize", "--scale", "0.1", "--zero-point", "0",
        "@zero.npy", "-o", "@q0.npy");
    CLI("dequantize: float input (dtype mismatch)", 3, "existing.out", "dequantize", "--scale", "0.1",
        "--zero-point", "0", "@good.npy", "-o", "@existing.out");
    /* fakequant */
    CLI("fakequant: bad input, existing output kept", 3, "existing.out", "fakequant", "--scale",
        "0.1", "--zero-point", "0", "@empty.npy", "-o", "@existing.out");
    CLI("fakequant: negative scale", 2, "existing.out", "fakequant", "--scale", "-0.1",
        "--zero-point", "0", "@good.npy", "-o", "@existing.out");
    CLI("fakequant: output in /proc", 4, NULL, "fakequant", "--scale", "0.1", "--zero-point", "0",
        "@good.npy", "-o", "/proc/qcal_fq.npy");
    /* calibrate */
    CLI("calibrate: directory that does not exist", 3, NULL, "calibrate", "@nodump", "-o", "@t.json");
    CLI("calibrate: empty directory", 3, NULL, "calibrate", "@emptydump", "-o", "@t.json");
    CLI("calibrate: truncated .npy, existing table kept", 3, "existing.out", "calibrate", "@baddump",
        "-o", "@existing.out");
    CLI("calibrate: rules with an unknown observer (usage, docs/calibration.md)", 2, "existing.out", "calibrate", "@dump",
        "--rules", "@bad.rules", "-o", "@existing.out");
    CLI("calibrate: rules file that does not exist", 3, NULL, "calibrate", "@dump", "--rules",
        "@missing.rules", "-o", "@t.json");
    CLI("calibrate: unknown format", 2, NULL, "calibrate", "@dump", "--format", "xml", "-o", "@t.json");
    CLI("calibrate: output in /proc", 4, NULL, "calibrate", "@dump", "-o", "/proc/qcal_t.json");
    /* stats / compare-weights */
    CLI("stats: path that does not exist", 3, NULL, "stats", "@missing.safetensors");
    CLI("stats: truncated safetensors", 3, NULL, "stats", "@trunc.safetensors");
    CLI("stats: empty .npy file", 3, NULL, "stats", "@empty.npy");
    CLI("stats: NaN/Inf counted", 0, NULL, "stats", "@nan.npy");
    CLI("stats: CSV output in /proc", 4, NULL, "stats", "@w.safetensors", "--csv", "/proc/qcal.csv");
    CLI("compare-weights: truncated safetensors", 3, NULL, "compare-weights", "@trunc.safetensors");
    CLI("compare-weights: --min-sqnr inf", 2, NULL, "compare-weights", "--min-sqnr", "inf",
        "@w.safetensors");
    end_of_group();
}

/* ---- replay of fuzzing crashes (tests/regressions/<target>/) ---- */

static void test_fuzz_regressions(void **state)
{
    (void)state;
    const char *root = getenv("QCAL_SOURCE_ROOT");
    if (!root) {
        print_message("QCAL_SOURCE_ROOT not set: regressions not replayed\n");
        skip();
    }
    static const char *const targets[] = { "fuzz_npy", "fuzz_safetensors", "fuzz_calib_table",
                                           "fuzz_idx", "fuzz_rules" };
    int replayed = 0;
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/tests/regressions/%s", root, targets[t]);
        DIR *d = opendir(dir);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || strstr(e->d_name, ".md"))
                continue;
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "rb");
            assert_non_null(f);
            bytes b = { 0 };
            char chunk[4096];
            size_t n;
            while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
                b_put(&b, chunk, n);
            fclose(f);
            if (!b.p)
                b_put(&b, "", 0);
            /* The contract: a documented status (here: any), no crash, untouched outputs. */
            if (t == 0)
                (void)npy_mem(&b);
            else if (t == 1)
                (void)st_file(&b);
            else if (t == 2)
                (void)table_mem((const char *)b.p, b.n);
            else if (t == 3)
                (void)idx_mem(&b);
            else
                (void)rules_mem((const char *)b.p, b.n);
            qcal_clear_error();
            free(b.p);
            replayed++;
        }
        closedir(d);
    }
    print_message("replayed %d fuzzing regression input(s)\n", replayed);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/qcal-hostile-XXXXXX");
    if (!mkdtemp(tmp_dir))
        return -1;
    qcal_bin = getenv("QCAL_BIN");
    if (qcal_bin && !*qcal_bin)
        qcal_bin = NULL;
    const char *tp = getenv("QCAL_HOSTILE_TABLE");
    if (tp && *tp) {
        table_out = fopen(tp, "w");
        if (table_out)
            fputs("| area | case | expected | outcome |\n|---|---|---|---|\n", table_out);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (table_out)
        fclose(table_out);
    tu_rm_tree(tmp_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_reader),
        cmocka_unit_test(test_safetensors_reader),
        cmocka_unit_test(test_idx_reader),
        cmocka_unit_test(test_table_and_rules_readers),
        cmocka_unit_test(test_numeric_policies),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_fuzz_regressions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
