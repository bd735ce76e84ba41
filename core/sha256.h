/* SHA-256 (FIPS 180-4), used for the digests of observer and session states
 * (qcal_observer_digest, qcal_calib_session_digest). Not installed. */
#ifndef QCAL_CORE_SHA256_H
#define QCAL_CORE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct qcal_sha256 {
    uint32_t h[8];
    uint64_t bytes;        /* message length so far */
    uint8_t block[64];     /* partial block */
    size_t fill;           /* bytes in block */
} qcal_sha256;

/* Starts a new message. */
void qcal_sha256_init(qcal_sha256 *s);

/* Appends n bytes (data may be NULL when n is 0). */
void qcal_sha256_update(qcal_sha256 *s, const void *data, size_t n);

/* Pads, writes the 32-byte digest to out and leaves s unusable until the next init. */
void qcal_sha256_final(qcal_sha256 *s, uint8_t out[32]);

/* One-shot digest of n bytes as 64 lower-case hex digits and a NUL (hex holds 65 bytes). */
void qcal_sha256_hex(const void *data, size_t n, char hex[65]);

/* Formats a 32-byte digest as 64 lower-case hex digits and a NUL. */
void qcal_sha256_to_hex(const uint8_t digest[32], char hex[65]);

#endif
