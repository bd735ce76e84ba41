/* Text helpers of the writers and readers: strict UTF-8, and the shortest decimal forms of
 * floats that the tables, reports and ONNX Runtime's files print. Internal to libqcal (io/
 * is the home every module takes them from). Not installed. */
#ifndef QCAL_IO_TEXT_H
#define QCAL_IO_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1 to 4) of the valid UTF-8 sequence at s[0], at most left bytes, or 0 when it is
 * not one (strict: no overlong forms, surrogates or code points past U+10FFFF). *cp gets
 * the code point when cp is not NULL. A NUL-terminated string may pass SIZE_MAX as left:
 * the NUL is not a continuation byte, so the decode stops there. */
size_t qcal_utf8_decode(const unsigned char *s, size_t left, uint32_t *cp);

/* Writes the UTF-8 form of code point cp (at most U+10FFFF, not a surrogate) to d[0..4)
 * and returns its length. */
size_t qcal_utf8_encode(char *d, uint32_t cp);

/* True when the NUL-terminated s is valid UTF-8 (qcal_utf8_decode's rules). */
bool qcal_utf8_valid(const char *s);

/* The shortest "%.*g" of a finite float32 v that reads back as exactly v through strtof and
 * through strtod followed by a float conversion (the tables' and reports' numbers). */
void qcal_fmt_f32(char *dst, size_t cap, float v);

/* Python's repr()/str() of a float (shortest round trip; exponent below 1e-4 and from
 * 1e16 on: "1e-05", "0.0001", "127.0", "1e+16"; "nan", "inf", "-0.0"). */
void qcal_fmt_pyfloat(char *dst, size_t cap, double v);

#endif
