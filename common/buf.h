/*
 * buf.h: kcache's one byte buffer and its reader. Every integer they write
 * or read is little-endian, whatever the host's byte order, so every byte
 * layout kcache persists or shares (records, spool files, replay records,
 * manifests) reads the same on every machine.
 */
#ifndef KCACHE_COMMON_BUF_H
#define KCACHE_COMMON_BUF_H

#include <stddef.h>
#include <stdint.h>

/* ---- fixed offsets ---------------------------------------------------- */

/* Little-endian stores and loads at p, for layouts written in place (a
 * header whose checksum covers the bytes before it). p needs no alignment. */
static inline void kc_le_put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void kc_le_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void kc_le_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t kc_le_get_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t kc_le_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t kc_le_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- the buffer ------------------------------------------------------- */

/* A growable byte buffer. Start it zeroed ({0}); p holds len bytes (malloc'd,
 * NULL while empty) and belongs to the buffer until kc_buf_free. err is 0,
 * or -ENOMEM once an allocation failed: every later write is then ignored,
 * so a writer checks err once at the end. */
struct kc_buf {
    unsigned char *p;
    size_t len, cap;
    int err;
};

/* Makes room for n more bytes (p + len .. p + len + n writable, len
 * unchanged): 0, or -ENOMEM (and err set). */
int kc_buf_reserve(struct kc_buf *b, size_t n);
/* Appends n bytes from p (p may be NULL when n is 0). */
void kc_buf_add(struct kc_buf *b, const void *p, size_t n);
/* Appends an integer, little-endian. */
void kc_buf_put_u8(struct kc_buf *b, uint8_t v);
void kc_buf_put_u16(struct kc_buf *b, uint16_t v);
void kc_buf_put_u32(struct kc_buf *b, uint32_t v);
void kc_buf_put_u64(struct kc_buf *b, uint64_t v);
/* Appends n, then the n bytes at p (kc_rd_get_blob reads it back). */
void kc_buf_put_blob(struct kc_buf *b, const void *p, size_t n);
/* Releases the bytes and zeroes the buffer (ready for reuse). */
void kc_buf_free(struct kc_buf *b);

/* Room for one more element in the array *v of *cap elements of `size`
 * bytes holding n: doubles it (from `first`) when full. 0, or -ENOMEM
 * with *v and *cap unchanged. */
int kc_grow(void *v, size_t *cap, size_t n, size_t size, size_t first);

/* ---- the reader ------------------------------------------------------- */

/* A bounds-checked reader over len bytes at p, which it never reads past.
 * A read that would go past the end reads nothing, answers 0 (or NULL) and
 * marks the reader bad; every later read fails the same way, so a parser
 * checks once, at the end (kc_rd_end). */
struct kc_rd {
    const unsigned char *p;
    size_t len, off;
    int bad;
};

/* A reader over len bytes at p (p may be NULL when len is 0). */
void kc_rd_init(struct kc_rd *r, const void *p, size_t len);
/* The next integer, little-endian; 0 past the end. */
uint8_t kc_rd_get_u8(struct kc_rd *r);
uint16_t kc_rd_get_u16(struct kc_rd *r);
uint32_t kc_rd_get_u32(struct kc_rd *r);
uint64_t kc_rd_get_u64(struct kc_rd *r);
/* Copies the next n bytes to out: 0, or -EBADMSG past the end (out is then
 * zeroed). */
int kc_rd_get_bytes(struct kc_rd *r, void *out, size_t n);
/* The next n bytes in place (a pointer into the input, valid as long as
 * it), or NULL past the end. */
const unsigned char *kc_rd_take(struct kc_rd *r, size_t n);
/* A length, then as many bytes, appended to v (kc_buf_put_blob's): 0, or
 * -EINVAL past the end, or -ENOMEM. */
int kc_rd_get_blob(struct kc_rd *r, struct kc_buf *v);
/* How many bytes are left (0 once bad). */
size_t kc_rd_left(const struct kc_rd *r);
/* 0 when every read succeeded and every byte was read; else -EBADMSG. */
int kc_rd_end(const struct kc_rd *r);

#endif
