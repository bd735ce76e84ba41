/* Helpers shared by the cmocka test executables (linked into every one of them): paths in
 * a directory, whole-file reads and writes, recursive removal of a temporary directory and
 * running a program with its stdout/stderr captured. Failures inside the helpers fail the
 * calling test (cmocka), so include <cmocka.h> before this header. */
#ifndef QCAL_TESTS_TESTUTIL_H
#define QCAL_TESTS_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "qcal/fakequant.h"
#include "qcal/quantize.h"
#include "qcal/observer.h"

/* "dir/name" in one of 8 rotating static buffers of 8192 bytes: up to 8 results stay
 * valid at once (copy one that must outlive more calls). */
char *tu_path(const char *dir, const char *name);

/* The whole file, NUL-terminated, malloc'ed (caller frees); *len (if non-NULL) gets its
 * size. tu_read_file fails the test when the file cannot be read; _or_null returns NULL. */
void *tu_read_file(const char *path, size_t *len);
void *tu_read_file_or_null(const char *path, size_t *len);

/* At most cap - 1 bytes of the file into dst, NUL-terminated; "" when it cannot be opened. */
void tu_slurp(const char *path, char *dst, size_t cap);

/* Creates or truncates path with n bytes of src; fails the test on any error. */
void tu_write_bytes(const char *path, const void *src, size_t n);

/* Entries of dir (not "." or "..") whose name contains needle (NULL: every entry). */
int tu_count_entries(const char *dir, const char *needle);

/* Removes dir and everything below it; quiet about what does not exist. */
void tu_rm_tree(const char *dir);

/* Runs bin with the arguments (argv[0] = bin), stdout and stderr redirected into
 * dir/.stdout and dir/.stderr, then read back into out/err (each truncated to its cap,
 * NUL-terminated). Fails the test unless the program exits normally; returns its exit
 * code. tu_run_va takes the NULL-terminated list of arguments starting at first. */
int tu_run(const char *bin, const char *const *args, const char *dir, char *out,
           size_t out_cap, char *err, size_t err_cap);
int tu_run_va(const char *bin, const char *first, va_list ap, const char *dir, char *out,
              size_t out_cap, char *err, size_t err_cap);

/* Runs `$QCAL_BIN ARGS` through the shell in dir (ARGS formatted from fmt, already quoted),
 * stdout and stderr into dir/.out and dir/.err, read back into out/err. Fails the test unless
 * the shell exits normally; returns its exit code. */
int tu_qcal_shv(const char *dir, char *out, size_t out_cap, char *err, size_t err_cap,
                const char *fmt, va_list ap);

/* Fails the test unless err is exactly one line that starts with prefix and contains
 * needle (NULL: any text), and does not repeat its subcommand ("qcal: CMD: CMD: ..."). */
void tu_expect_one_line(const char *err, const char *prefix, const char *needle);

/* Named-array reference container written by the Python generators (tests/ref/
 * gen_histogram.py): records of u32 name length, name, kind ('f': f32, else 8-byte
 * elements: i64 or f64), u64 count, data. At most 256 arrays with names under 64 bytes. */
typedef struct tu_ref_arr {
    char name[64];
    char kind;
    uint64_t count;
    void *data;
} tu_ref_arr;
typedef struct tu_ref_file {
    tu_ref_arr a[256];
    int n;
} tu_ref_file;

/* Reads $QCAL_TEST_DATA/<area>/<file> (tests/data when unset); fails the test when it
 * cannot be opened or is malformed. tu_ref_free releases it. */
tu_ref_file *tu_ref_load(const char *area, const char *file);
void tu_ref_free(tu_ref_file *r);

/* The array named by the printf-style fmt; fails the test when it is missing. */
const tu_ref_arr *tu_ref_get(const tu_ref_file *r, const char *fmt, ...);

/* qcal_observer_qparams copied into caller arrays (cap entries; zero_point and
 * zero_point_float may be NULL): *n gets the channel count; the status is the observer's.
 * Fails the test if the value does not fit. */
qcal_status tu_observer_qparams(const qcal_observer *obs, int64_t cap, float *scale,
                                int32_t *zero_point, float *zero_point_float, int64_t *n);

/* qcal_fakequant_module_qparams copied into caller arrays (scales, integer zero-points),
 * as tu_observer_qparams. */
qcal_status tu_fakequant_module_qparams(const qcal_fakequant_module *fq, int64_t cap,
                                        float *scale, int32_t *zero_point, int64_t *n);

/* Short-lived values for call sites (each from one of 16 rotating static slots, so up to 16
 * stay valid at once). Not validated: the library call under test validates them.
 * tu_vec: a 1-D view of n floats. tu_qp / tu_qpc: quantize qparams, per-tensor or
 * per-channel view (dtype's full range). tu_fq / tu_fqc: fake-quant qparams with range
 * [qmin, qmax] and the narrowest dtype holding it (tu_fqc takes the channel count from
 * t->shape[axis], 1 if the axis is invalid); tu_lsq / tu_lsqc: the same with float
 * zero-points (learnable). tu_out: a writable 1-D view of n floats (an output). */
qcal_tensor *tu_vec(const float *data, int64_t n);
qcal_tensor_mut *tu_out(float *data, int64_t n);
/* numel of t (fails the test on a bad shape). */
int64_t tu_numel(const qcal_tensor *t);
const qcal_qparams *tu_qp(qcal_dtype dtype, float scale, int32_t zero_point);
const qcal_qparams *tu_qpc(qcal_dtype dtype, int32_t axis, int64_t channels,
                           const float *scales, const int32_t *zero_points);
const qcal_qparams *tu_fq(float scale, int32_t zero_point, int64_t qmin, int64_t qmax);
const qcal_qparams *tu_fqc(const qcal_tensor *t, int32_t axis, const float *scales,
                           const int32_t *zero_points, int64_t qmin, int64_t qmax);
const qcal_qparams *tu_lsq(float scale, float zero_point, int64_t qmin, int64_t qmax);
const qcal_qparams *tu_lsqc(const qcal_tensor *t, int32_t axis, const float *scales,
                            const float *zero_points, int64_t qmin, int64_t qmax);

#endif
