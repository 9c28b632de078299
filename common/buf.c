/*
 * buf.c: the little-endian byte buffer and its reader. See buf.h.
 */
#include "buf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kc_grow(void *v, size_t *cap, size_t n, size_t size, size_t first)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap : first;
    while (c <= n && c <= SIZE_MAX / 2 / size)
        c *= 2;
    if (c <= n)
        return -ENOMEM;
    void *q = realloc(*(void **)v, c * size);
    if (q == NULL)
        return -ENOMEM;
    *(void **)v = q;
    *cap = c;
    return 0;
}

int kc_buf_reserve(struct kc_buf *b, size_t n)
{
    if (b->err)
        return b->err;
    if (n > SIZE_MAX - b->len) {
        b->err = -ENOMEM;
        return b->err;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n && cap <= SIZE_MAX / 2)
            cap *= 2;
        if (cap < b->len + n)
            cap = b->len + n;
        unsigned char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->err = -ENOMEM;
            return b->err;
        }
        b->p = q;
        b->cap = cap;
    }
    return 0;
}

void kc_buf_add(struct kc_buf *b, const void *p, size_t n)
{
    if (kc_buf_reserve(b, n) != 0)
        return;
    if (n > 0) /* p may be NULL for nothing: memcpy(dst, NULL, 0) is undefined */
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

void kc_buf_put_u8(struct kc_buf *b, uint8_t v)
{
    kc_buf_add(b, &v, 1);
}

void kc_buf_put_u16(struct kc_buf *b, uint16_t v)
{
    unsigned char x[2];
    kc_le_put_u16(x, v);
    kc_buf_add(b, x, sizeof x);
}

void kc_buf_put_u32(struct kc_buf *b, uint32_t v)
{
    unsigned char x[4];
    kc_le_put_u32(x, v);
    kc_buf_add(b, x, sizeof x);
}

void kc_buf_put_u64(struct kc_buf *b, uint64_t v)
{
    unsigned char x[8];
    kc_le_put_u64(x, v);
    kc_buf_add(b, x, sizeof x);
}

void kc_buf_free(struct kc_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void kc_rd_init(struct kc_rd *r, const void *p, size_t len)
{
    r->p = p;
    r->len = p != NULL ? len : 0;
    r->off = 0;
    r->bad = p == NULL && len != 0;
}

const unsigned char *kc_rd_take(struct kc_rd *r, size_t n)
{
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return NULL;
    }
    const unsigned char *q = r->p + r->off;
    r->off += n;
    return q;
}

uint8_t kc_rd_get_u8(struct kc_rd *r)
{
    const unsigned char *q = kc_rd_take(r, 1);
    return q != NULL ? q[0] : 0;
}

uint16_t kc_rd_get_u16(struct kc_rd *r)
{
    const unsigned char *q = kc_rd_take(r, 2);
    return q != NULL ? kc_le_get_u16(q) : 0;
}

uint32_t kc_rd_get_u32(struct kc_rd *r)
{
    const unsigned char *q = kc_rd_take(r, 4);
    return q != NULL ? kc_le_get_u32(q) : 0;
}

uint64_t kc_rd_get_u64(struct kc_rd *r)
{
    const unsigned char *q = kc_rd_take(r, 8);
    return q != NULL ? kc_le_get_u64(q) : 0;
}

int kc_rd_get_bytes(struct kc_rd *r, void *out, size_t n)
{
    const unsigned char *q = kc_rd_take(r, n);
    if (q == NULL) {
        if (n > 0)
            memset(out, 0, n);
        return -EBADMSG;
    }
    if (n > 0)
        memcpy(out, q, n);
    return 0;
}

size_t kc_rd_left(const struct kc_rd *r)
{
    return r->bad ? 0 : r->len - r->off;
}

int kc_rd_end(const struct kc_rd *r)
{
    return !r->bad && r->off == r->len ? 0 : -EBADMSG;
}

void kc_buf_put_blob(struct kc_buf *b, const void *p, size_t n)
{
    kc_buf_put_u64(b, n);
    kc_buf_add(b, p, n);
}

int kc_rd_get_blob(struct kc_rd *r, struct kc_buf *v)
{
    uint64_t n = kc_rd_get_u64(r);
    if (n > kc_rd_left(r))
        return -EINVAL;
    const unsigned char *p = kc_rd_take(r, (size_t)n);
    if (p == NULL && n > 0)
        return -EINVAL;
    kc_buf_add(v, p, (size_t)n);
    return v->err ? -ENOMEM : 0;
}
