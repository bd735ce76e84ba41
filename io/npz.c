/* .npz reader (numpy.savez / savez_compressed): a ZIP archive whose members are .npy files.
 * See include/qcal/dataset.h.
 *
 * The archive is read through its central directory (so data descriptors, bit 3 of the
 * flags, need no special case: sizes and CRCs come from the directory): the end-of-central-
 * directory record (0x06054b50) at the end, its ZIP64 locator (0x07064b50) and record
 * (0x06064b50) when present, ZIP64 extra fields (0x0001) on entries, then each member's
 * local header (0x04034b50) for the offset of its bytes. Members are stored (method 0) or
 * deflated (method 8, raw deflate through zlib when qcal was built with it). Every length
 * and offset is checked against the archive's size before it is used; a member's .npy
 * header is parsed by io/npy.c (qcal_npy_header_parse), and its data size must match the
 * member's size. Multi-disk and encrypted archives and other methods are refused. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qcal_config.h"
#include "core/internal.h"
#include "io/npy_internal.h"
#include "io/npz_internal.h"
#include "qcal/npz.h"

#if QCAL_HAVE_ZLIB
#include <zlib.h>
#endif

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_Z64_LOCATOR 0x07064b50u
#define SIG_Z64_EOCD 0x06064b50u
#define EOCD_LEN 22
#define CENTRAL_LEN 46
#define LOCAL_LEN 30
#define CHUNK ((size_t)64 << 10)
/* Deflate cannot expand more than 1032:1; a member claiming more is corrupt (and bounds
 * what a hostile archive can make us allocate). */
#define DEFLATE_MAX_RATIO 1032u

struct qcal_npz {
    int fd;                 /* -1 for a buffer */
    const uint8_t *buf;     /* the buffer (qcal_npz_parse) */
    uint64_t size;
    char *name;             /* path, or "<memory>" */
    qcal_npz_member *m;
    int64_t n;
};

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

int32_t qcal_npy_dtype_onnx(qcal_npy_dtype dtype)
{
    switch (dtype) {
    case QCAL_NPY_F32: return 1;
    case QCAL_NPY_U8: return 2;
    case QCAL_NPY_I8: return 3;
    case QCAL_NPY_I32: return 6;
    case QCAL_NPY_I64: return 7;
    case QCAL_NPY_BOOL: return 9;
    case QCAL_NPY_F16: return 10;
    case QCAL_NPY_F64: return 11;
    default: return 0;
    }
}

/* Bytes [off, off + n) of the archive; past its end: QCAL_ERR_FORMAT naming `what`. */
static qcal_status src_read(const qcal_npz *z, uint64_t off, void *dst, size_t n, const char *what)
{
    if (off > z->size || n > z->size - off)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated archive: %s lies past its end (%"
                          PRIu64 " bytes)", z->name, what, z->size);
    if (n == 0)
        return QCAL_OK;
    if (z->buf) {
        memcpy(dst, z->buf + off, n);
        return QCAL_OK;
    }
    uint8_t *p = dst;
    while (n > 0) {
        ssize_t r = pread(z->fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return qcal_error(QCAL_ERR_IO, "cannot read '%s'%s%s", z->name,
                              r == 0 ? " (file shrank while reading)" : ": ",
                              r == 0 ? "" : strerror(errno));
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return QCAL_OK;
}

/* ---- CRC-32 (ZIP's polynomial) ---- */

#if QCAL_HAVE_ZLIB
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n > 0) {
        uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return crc;
}
#else
static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    static int ready;   /* benign race: every thread writes the same values */
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}
#endif

/* ---- member bytes ---- */

#if QCAL_HAVE_ZLIB
/* Inflates member m: drops the first `skip` bytes it produces, writes the next n to dst.
 * When skip + n is the whole member, the stream must end there and the CRC must match. */
static qcal_status inflate_member(const qcal_npz *z, const qcal_npz_member *m, uint64_t skip,
                                  uint8_t *dst, size_t n)
{
    uint64_t target = skip + n;
    bool full = target == m->usize;
    uint8_t *in = qcal_malloc(CHUNK), *scratch = qcal_malloc(CHUNK);
    z_stream s;
    memset(&s, 0, sizeof s);
    qcal_status st = QCAL_OK;
    if (!in || !scratch) {
        free(in);
        free(scratch);
        return QCAL_ERR_NO_MEMORY;
    }
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) {
        free(in);
        free(scratch);
        return qcal_error(QCAL_ERR_NO_MEMORY, "'%s': cannot initialize zlib", z->name);
    }
    uint64_t in_pos = 0, out_done = 0;
    uint32_t crc = 0;
    for (;;) {
        if (s.avail_in == 0 && in_pos < m->csize) {
            size_t k = m->csize - in_pos < CHUNK ? (size_t)(m->csize - in_pos) : CHUNK;
            if ((st = src_read(z, m->data_off + in_pos, in, k, "a member's data")) != QCAL_OK)
                break;
            s.next_in = in;
            s.avail_in = (uInt)k;
            in_pos += k;
        }
        uint8_t *o;
        size_t olen;
        if (out_done < skip) {
            o = scratch;
            olen = skip - out_done < CHUNK ? (size_t)(skip - out_done) : CHUNK;
        } else if (out_done < target) {
            o = dst + (out_done - skip);
            olen = target - out_done < ((uint64_t)1 << 30) ? (size_t)(target - out_done)
                                                           : (size_t)1 << 30;
        } else if (full) {
            o = scratch;    /* nothing more may come: any byte here is an error */
            olen = 1;
        } else {
            break;
        }
        s.next_out = o;
        s.avail_out = (uInt)olen;
        int zr = inflate(&s, Z_NO_FLUSH);
        size_t got = olen - s.avail_out;
        if (full)
            crc = crc_update(crc, o, got);
        out_done += got;
        if (zr == Z_MEM_ERROR) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "'%s': zlib is out of memory", z->name);
            break;
        }
        if (zr == Z_DATA_ERROR || zr == Z_NEED_DICT || zr == Z_STREAM_ERROR) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': corrupt deflate stream (%s)",
                            z->name, m->name, s.msg ? s.msg : "invalid data");
            break;
        }
        if (out_done > target) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy' inflates to more than its "
                            "%" PRIu64 " bytes", z->name, m->name, m->usize);
            break;
        }
        if (zr == Z_STREAM_END) {
            if (out_done < target)
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': deflate stream ends "
                                "after %" PRIu64 " of %" PRIu64 " bytes", z->name, m->name,
                                out_done, m->usize);
            break;
        }
        if (zr == Z_BUF_ERROR && s.avail_in == 0 && in_pos >= m->csize) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': truncated deflate stream "
                            "(%" PRIu64 " of %" PRIu64 " bytes inflated)", z->name, m->name,
                            out_done, m->usize);
            break;
        }
    }
    inflateEnd(&s);
    free(in);
    free(scratch);
    if (st == QCAL_OK && full && crc != m->crc)
        st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': CRC-32 mismatch (directory "
                        "%08" PRIx32 ", data %08" PRIx32 ")", z->name, m->name, m->crc, crc);
    return st;
}
#endif

#if !QCAL_HAVE_ZLIB
static qcal_status no_zlib(const qcal_npz *z, const qcal_npz_member *m)
{
    return qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': member '%s.npy' is deflated "
                      "(numpy.savez_compressed) and this qcal was built without zlib: rebuild "
                      "with zlib, or save with numpy.savez", z->name, m->name);
}
#endif

/* Bytes [skip, skip + n) of member m's uncompressed bytes into dst (a part of a deflated
 * member inflates from its start). */
static qcal_status member_bytes(const qcal_npz *z, const qcal_npz_member *m, uint64_t skip,
                                void *dst, size_t n)
{
    if (m->method == 0)
        return src_read(z, m->data_off + skip, dst, n, "a member's data");
#if QCAL_HAVE_ZLIB
    return inflate_member(z, m, skip, dst, n);
#else
    (void)skip;
    (void)dst;
    (void)n;
    return no_zlib(z, m);
#endif
}

/* 64-byte aligned buffer of n > 0 bytes. */
static void *alloc_aligned(size_t n)
{
    size_t r = (n + 63) / 64 * 64;
    void *p = r >= n ? aligned_alloc(64, r) : NULL;
    if (!p)
        qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate %zu bytes for an array", n);
    return p;
}

/* The array data of member i into a new aligned buffer (*data NULL when empty); the whole
 * member's CRC is checked. */
static qcal_status member_data(const qcal_npz *z, const qcal_npz_member *m, void **data)
{
    size_t nb = m->info.nbytes;
    *data = NULL;
    if (nb == 0)
        return QCAL_OK;
    uint8_t *d = alloc_aligned(nb);
    if (!d)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st;
    if (m->method == 0) {
        /* The header's bytes for the CRC, then the data. */
        uint8_t *h = qcal_malloc((size_t)m->npy_off);
        if (!h) {
            free(d);
            return QCAL_ERR_NO_MEMORY;
        }
        st = member_bytes(z, m, 0, h, (size_t)m->npy_off);
        if (st == QCAL_OK)
            st = member_bytes(z, m, m->npy_off, d, nb);
        if (st == QCAL_OK) {
            uint32_t crc = crc_update(crc_update(0, h, (size_t)m->npy_off), d, nb);
            if (crc != m->crc)
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': CRC-32 mismatch "
                                "(directory %08" PRIx32 ", data %08" PRIx32 ")", z->name,
                                m->name, m->crc, crc);
        }
        free(h);
    } else {
        st = member_bytes(z, m, m->npy_off, d, nb);
    }
    if (st != QCAL_OK) {
        free(d);
        return st;
    }
    *data = d;
    return QCAL_OK;
}

/* ---- directory ---- */

static void members_free(qcal_npz_member *m, int64_t n)
{
    for (int64_t i = 0; m && i < n; i++) {
        free(m[i].name);
        free(m[i].cache);
    }
    free(m);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const qcal_npz_member *const *)a)->name,
                  (*(const qcal_npz_member *const *)b)->name);
}

/* Reads member m's .npy header (its local header located first). */
static qcal_status member_header(const qcal_npz *z, qcal_npz_member *m, uint64_t local_off,
                                 const uint8_t *cname, size_t cname_len)
{
    uint8_t lh[LOCAL_LEN];
    qcal_status st = src_read(z, local_off, lh, LOCAL_LEN, "a local header");
    if (st != QCAL_OK)
        return st;
    if (le32(lh) != SIG_LOCAL)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': bad local header signature",
                          z->name, m->name);
    size_t lnlen = le16(lh + 26), lxlen = le16(lh + 28);
    if (lnlen != cname_len)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': local and central names "
                          "differ", z->name, m->name);
    uint8_t lname[65536];
    if ((st = src_read(z, local_off + LOCAL_LEN, lname, lnlen, "a local header")) != QCAL_OK)
        return st;
    if (memcmp(lname, cname, lnlen) != 0)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': local and central names "
                          "differ", z->name, m->name);
    m->data_off = local_off + LOCAL_LEN + lnlen + lxlen;
    if (m->data_off > z->size || m->csize > z->size - m->data_off)
        return qcal_error(QCAL_ERR_FORMAT, "'%s': truncated archive: member '%s.npy' (%" PRIu64
                          " bytes at offset %" PRIu64 ") lies past its end (%" PRIu64 " bytes)",
                          z->name, m->name, m->csize, m->data_off, z->size);
#if !QCAL_HAVE_ZLIB
    if (m->method == 8)
        return no_zlib(z, m);
#endif
    /* Prefix (12 bytes at most) to learn the header's length, then the header. */
    char mname[4200];
    snprintf(mname, sizeof mname, "%s: member %s.npy", z->name, m->name);
    uint8_t pre[12];
    size_t plen = m->usize < sizeof pre ? (size_t)m->usize : sizeof pre;
    if ((st = member_bytes(z, m, 0, pre, plen)) != QCAL_OK)
        return st;
    size_t need = 0;
    if ((st = qcal_npy_header_size(pre, plen, mname, &need)) != QCAL_OK)
        return st;
    size_t hlen = need < m->usize ? need : (size_t)m->usize;
    uint8_t *h = qcal_malloc(hlen ? hlen : 1);
    if (!h)
        return QCAL_ERR_NO_MEMORY;
    if ((st = member_bytes(z, m, 0, h, hlen)) == QCAL_OK)
        st = qcal_npy_header_parse(h, hlen, m->usize, mname, &m->info, &m->npy_off);
    free(h);
    return st;
}

/* Reads the central directory and every member's header into z->m, z->n. */
static qcal_status read_directory(qcal_npz *z)
{
    if (z->size < EOCD_LEN)
        return qcal_error(QCAL_ERR_FORMAT, "'%s' is not a .npz (zip) archive: %s", z->name,
                          z->size == 0 ? "it is empty" : "too short for its end record");
    size_t tail_len = z->size < EOCD_LEN + 65535 ? (size_t)z->size : EOCD_LEN + 65535;
    uint64_t tail_off = z->size - tail_len;
    uint8_t *tail = qcal_malloc(tail_len), *cd = NULL;
    qcal_npz_member *m = NULL;
    qcal_npz_member **sorted = NULL;
    int64_t n = 0;
    uint64_t n_total = 0;
    if (!tail)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st = src_read(z, tail_off, tail, tail_len, "the end record");
    if (st != QCAL_OK)
        goto done;
    size_t pos = tail_len - EOCD_LEN + 1;
    bool found = false;
    while (pos-- > 0) {
        if (le32(tail + pos) == SIG_EOCD && pos + EOCD_LEN + le16(tail + pos + 20) <= tail_len) {
            found = true;
            break;
        }
    }
    if (!found) {
        st = qcal_error(QCAL_ERR_FORMAT, "'%s' is not a .npz (zip) archive, or is truncated: "
                        "no end-of-central-directory record", z->name);
        goto done;
    }
    const uint8_t *e = tail + pos;
    uint64_t eocd_off = tail_off + pos;
    uint32_t disk = le16(e + 4), cd_disk = le16(e + 6);
    uint64_t n_disk = le16(e + 8);
    n_total = le16(e + 10);
    uint64_t cd_size = le32(e + 12), cd_off = le32(e + 16);
    uint64_t cd_limit = eocd_off;   /* the directory ends before the end record(s) */
    if (eocd_off >= 20) {
        uint8_t loc[20];
        if ((st = src_read(z, eocd_off - 20, loc, 20, "the ZIP64 locator")) != QCAL_OK)
            goto done;
        if (le32(loc) == SIG_Z64_LOCATOR) {
            uint64_t z64_off = le64(loc + 8);
            uint8_t r[56];
            if (le32(loc + 4) != 0 || le32(loc + 16) > 1) {
                st = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': multi-disk archives are not "
                                "supported", z->name);
                goto done;
            }
            if (z64_off > eocd_off - 20 || eocd_off - 20 - z64_off < 56) {
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': ZIP64 end record offset %" PRIu64
                                " is out of range", z->name, z64_off);
                goto done;
            }
            if ((st = src_read(z, z64_off, r, 56, "the ZIP64 end record")) != QCAL_OK)
                goto done;
            if (le32(r) != SIG_Z64_EOCD) {
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': bad ZIP64 end record signature", z->name);
                goto done;
            }
            disk = le32(r + 16);
            cd_disk = le32(r + 20);
            n_disk = le64(r + 24);
            n_total = le64(r + 32);
            cd_size = le64(r + 40);
            cd_off = le64(r + 48);
            cd_limit = z64_off;
        }
    }
    if (cd_limit == eocd_off && (n_total == 0xFFFF || cd_size == 0xFFFFFFFFu ||
                                 cd_off == 0xFFFFFFFFu)) {
        st = qcal_error(QCAL_ERR_FORMAT, "'%s': ZIP64 archive without its ZIP64 end record",
                        z->name);
        goto done;
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n_total) {
        st = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': multi-disk archives are not supported",
                        z->name);
        goto done;
    }
    if (cd_off > cd_limit || cd_size != cd_limit - cd_off) {
        st = qcal_error(QCAL_ERR_FORMAT, "'%s': the central directory (%" PRIu64 " bytes at "
                        "offset %" PRIu64 ") does not end at the end record (offset %" PRIu64
                        ")", z->name, cd_size, cd_off, cd_limit);
        goto done;
    }
    if (n_total > cd_size / CENTRAL_LEN) {
        st = qcal_error(QCAL_ERR_FORMAT, "'%s': %" PRIu64 " members cannot fit in a central "
                        "directory of %" PRIu64 " bytes", z->name, n_total, cd_size);
        goto done;
    }
    cd = qcal_malloc(cd_size ? (size_t)cd_size : 1);
    m = qcal_calloc(n_total ? (size_t)n_total : 1, sizeof *m);
    if (!cd || !m) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    if ((st = src_read(z, cd_off, cd, (size_t)cd_size, "the central directory")) != QCAL_OK)
        goto done;
    size_t at = 0;
    for (; n < (int64_t)n_total; n++) {
        qcal_npz_member *mm = &m[n];
        const uint8_t *c = cd + at;
        if (cd_size - at < CENTRAL_LEN || le32(c) != SIG_CENTRAL) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': central directory entry %" PRId64 " is "
                            "truncated or has a bad signature", z->name, n);
            goto done;
        }
        uint16_t flags = le16(c + 8);
        mm->method = le16(c + 10);
        mm->crc = le32(c + 16);
        mm->csize = le32(c + 20);
        mm->usize = le32(c + 24);
        size_t nlen = le16(c + 28), xlen = le16(c + 30), clen = le16(c + 32);
        uint32_t disk_start = le16(c + 34);
        uint64_t local_off = le32(c + 42);
        if (cd_size - at - CENTRAL_LEN < nlen + xlen + clen) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': central directory entry %" PRId64 " is "
                            "truncated", z->name, n);
            goto done;
        }
        const uint8_t *name = c + CENTRAL_LEN, *x = name + nlen;
        if (memchr(name, '\0', nlen)) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member %" PRId64 " has a NUL byte in its "
                            "name", z->name, n);
            goto done;
        }
        if (!(mm->name = qcal_strndup((const char *)name, nlen))) {
            st = QCAL_ERR_NO_MEMORY;
            goto done;
        }
        /* ZIP64 extra field: the saturated 32-bit fields, in this order. */
        for (size_t k = 0; k + 4 <= xlen;) {
            uint16_t id = le16(x + k), sz = le16(x + k + 2);
            if (xlen - k - 4 < sz) {
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s': truncated extra field",
                                z->name, mm->name);
                goto done;
            }
            if (id == 0x0001) {
                const uint8_t *f = x + k + 4;
                size_t left = sz;
                uint64_t *fields[3] = { &mm->usize, &mm->csize, &local_off };
                for (int q = 0; q < 3; q++) {
                    if (*fields[q] != 0xFFFFFFFFu)
                        continue;
                    if (left < 8) {
                        st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s': truncated ZIP64 "
                                        "extra field", z->name, mm->name);
                        goto done;
                    }
                    *fields[q] = le64(f);
                    f += 8;
                    left -= 8;
                }
                if (disk_start == 0xFFFF && left >= 4)
                    disk_start = le32(f);
            }
            k += 4 + (size_t)sz;
        }
        at += CENTRAL_LEN + nlen + xlen + clen;
        if (disk_start != 0) {
            st = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': multi-disk archives are not supported",
                            z->name);
            goto done;
        }
        if (flags & 1) {
            st = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': member '%s' is encrypted", z->name,
                            mm->name);
            goto done;
        }
        if (mm->method != 0 && mm->method != 8) {
            st = qcal_error(QCAL_ERR_UNSUPPORTED, "'%s': member '%s' uses compression method %u "
                            "(only stored and deflated members are supported)", z->name,
                            mm->name, (unsigned)mm->method);
            goto done;
        }
        if (nlen <= 4 || strcmp(mm->name + nlen - 4, ".npy") != 0) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s' is not a .npy file (numpy.savez "
                            "writes NAME.npy members)", z->name, mm->name);
            goto done;
        }
        mm->name[nlen - 4] = '\0';
        if (mm->method == 0 && mm->csize != mm->usize) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': stored member '%s.npy' has different sizes "
                            "(%" PRIu64 " and %" PRIu64 ")", z->name, mm->name, mm->csize,
                            mm->usize);
            goto done;
        }
        if (mm->method == 8 && mm->usize / DEFLATE_MAX_RATIO > mm->csize + 1) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': deflated member '%s.npy' claims %" PRIu64
                            " bytes from %" PRIu64 ", more than deflate can produce", z->name,
                            mm->name, mm->usize, mm->csize);
            goto done;
        }
        if (local_off >= cd_off) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy': local header offset %" PRIu64
                            " is out of range", z->name, mm->name, local_off);
            goto done;
        }
        if ((st = member_header(z, mm, local_off, name, nlen)) != QCAL_OK)
            goto done;
        if (mm->data_off + mm->csize > cd_off) {
            st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy' overlaps the central "
                            "directory", z->name, mm->name);
            goto done;
        }
    }
    if (at != cd_size) {
        st = qcal_error(QCAL_ERR_FORMAT, "'%s': %zu bytes of the central directory follow its "
                        "%" PRId64 " entries", z->name, (size_t)(cd_size - at), n);
        goto done;
    }
    if (n > 1) {
        if (!(sorted = qcal_malloc((size_t)n * sizeof *sorted))) {
            st = QCAL_ERR_NO_MEMORY;
            goto done;
        }
        for (int64_t i = 0; i < n; i++)
            sorted[i] = &m[i];
        qsort(sorted, (size_t)n, sizeof *sorted, cmp_name);
        for (int64_t i = 1; i < n; i++)
            if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
                st = qcal_error(QCAL_ERR_FORMAT, "'%s': member '%s.npy' appears twice", z->name,
                                sorted[i]->name);
                goto done;
            }
    }
done:
    free(sorted);
    free(tail);
    free(cd);
    if (st != QCAL_OK) {
        members_free(m, (int64_t)n_total);   /* calloc'd: unused entries are NULL */
        return st;
    }
    z->m = m;
    z->n = n;
    return QCAL_OK;
}

/* ---- handles ---- */

static void npz_free(qcal_npz *z)
{
    if (!z)
        return;
    if (z->fd >= 0)
        close(z->fd);
    members_free(z->m, z->n);
    free(z->name);
    free(z);
}

static qcal_status npz_new(const char *name, qcal_npz **out)
{
    qcal_npz *z = qcal_calloc(1, sizeof *z);
    if (!z)
        return QCAL_ERR_NO_MEMORY;
    z->fd = -1;
    if (!(z->name = qcal_strdup(name))) {
        free(z);
        return QCAL_ERR_NO_MEMORY;
    }
    *out = z;
    return QCAL_OK;
}

qcal_status qcal_npz_open_internal(const char *path, qcal_npz **out)
{
    qcal_npz *z = NULL;
    qcal_status st = npz_new(path, &z);
    if (st != QCAL_OK)
        return st;
    z->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (z->fd < 0) {
        st = qcal_error(errno == ENOENT ? QCAL_ERR_NOT_FOUND : QCAL_ERR_IO,
                        "cannot open '%s': %s", path, strerror(errno));
        npz_free(z);
        return st;
    }
    struct stat sb;
    if (fstat(z->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        npz_free(z);
        return qcal_error(QCAL_ERR_IO, "'%s' is not a regular file", path);
    }
    z->size = (uint64_t)sb.st_size;
    if ((st = read_directory(z)) != QCAL_OK) {
        npz_free(z);
        return st;
    }
    *out = z;
    return QCAL_OK;
}

const qcal_npz_member *qcal_npz_members(const qcal_npz *z, int64_t *n)
{
    *n = z->n;
    return z->m;
}

qcal_status qcal_npz_member_read(qcal_npz *z, int64_t i, uint64_t off, size_t n, void *dst)
{
    if (!z || i < 0 || i >= z->n || (n > 0 && !dst))
        return qcal_error(QCAL_ERR_INVALID_ARG, "npz member read: invalid arguments");
    qcal_npz_member *m = &z->m[i];
    if (off > m->info.nbytes || n > m->info.nbytes - off)
        return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': bytes [%" PRIu64 ", +%zu) are outside "
                          "member '%s.npy' (%zu bytes)", z->name, off, n, m->name, m->info.nbytes);
    if (n == 0)
        return QCAL_OK;
    if (m->method == 0)
        return src_read(z, m->data_off + m->npy_off + off, dst, n, "a member's data");
    if (!m->cache) {
        qcal_status st = member_data(z, m, &m->cache);
        if (st != QCAL_OK)
            return st;
    }
    memcpy(dst, (const uint8_t *)m->cache + off, n);
    return QCAL_OK;
}

void qcal_npz_close_internal(qcal_npz **z)
{
    if (!z)
        return;
    npz_free(*z);
    *z = NULL;
}

/* ---- public ---- */

static qcal_status to_entries(const qcal_npz *z, bool with_data, qcal_npz_entry **entries,
                              int64_t *n)
{
    qcal_npz_entry *e = NULL;
    if (z->n > 0 && !(e = qcal_calloc((size_t)z->n, sizeof *e)))
        return QCAL_ERR_NO_MEMORY;
    for (int64_t i = 0; i < z->n; i++) {
        const qcal_npz_member *m = &z->m[i];
        qcal_status st = QCAL_OK;
        if (!(e[i].name = qcal_strdup(m->name)))
            st = QCAL_ERR_NO_MEMORY;
        else if (with_data)
            st = member_data(z, m, &e[i].data);
        if (st != QCAL_OK) {
            qcal_npz_free(&e, i + 1);
            return st;
        }
        e[i].elem_type = qcal_npy_dtype_onnx(m->info.dtype);
        e[i].ndim = m->info.ndim;
        for (int32_t d = 0; d < m->info.ndim; d++)
            e[i].dims[d] = m->info.shape[d];
        e[i].nbytes = with_data ? m->info.nbytes : 0;
    }
    *entries = e;
    *n = z->n;
    return QCAL_OK;
}

qcal_status qcal_npz_read(const char *path, bool with_data, qcal_npz_entry **entries, int64_t *n)
{
    if (!path || !entries || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npz path or output is NULL");
    qcal_npz *z = NULL;
    qcal_status st = qcal_npz_open_internal(path, &z);
    if (st != QCAL_OK)
        return st;
    st = to_entries(z, with_data, entries, n);
    npz_free(z);
    return st;
}

qcal_status qcal_npz_parse(const void *buf, size_t len, bool with_data, qcal_npz_entry **entries,
                           int64_t *n)
{
    if ((!buf && len > 0) || !entries || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "npz buffer or output is NULL");
    qcal_npz *z = NULL;
    qcal_status st = npz_new("<memory>", &z);
    if (st != QCAL_OK)
        return st;
    z->buf = buf;
    z->size = len;
    if ((st = read_directory(z)) == QCAL_OK)
        st = to_entries(z, with_data, entries, n);
    npz_free(z);
    return st;
}

void qcal_npz_free(qcal_npz_entry **entries, int64_t n)
{
    if (!entries || !*entries)
        return;
    for (int64_t i = 0; i < n; i++) {
        free((*entries)[i].name);
        free((*entries)[i].data);
    }
    free(*entries);
    *entries = NULL;
}
