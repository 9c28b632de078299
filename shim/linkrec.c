/*
 * The link replay record. See linkrec.h.
 *
 * Layout, every integer little-endian: u32 magic "KCLK", u32 version, u32
 * api, i32 complete_rc, then N_LOUT outputs: i32 size_rc, i32 size_set, u64
 * size, i32 get_rc, i32 size_null_rc, i32 get_null_rc, u64 nbytes, bytes.
 */
#include "linkrec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LREC_MAGIC 0x4b4c434bu /* "KCLK" */
#define LREC_VERSION 1u

void kc__lrec_free(struct kc__lrec *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < N_LOUT; i++)
        free(r->out[i].bytes);
    free(r);
}

/* ---- writing ------------------------------------------------------------- */

struct w {
    unsigned char *p;
    size_t n, cap;
    int failed;
};

static void w_bytes(struct w *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->failed = 1;
                return;
            }
            cap *= 2;
        }
        unsigned char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void w_u32(struct w *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    w_bytes(b, x, sizeof x);
}

static void w_u64(struct w *b, uint64_t v)
{
    w_u32(b, (uint32_t)v);
    w_u32(b, (uint32_t)(v >> 32));
}

int kc__lrec_encode(const struct kc__lrec *r, void **out, size_t *len)
{
    struct w b = {0};
    w_u32(&b, LREC_MAGIC);
    w_u32(&b, LREC_VERSION);
    w_u32(&b, r->api);
    w_u32(&b, (uint32_t)r->complete_rc);
    for (int i = 0; i < N_LOUT; i++) {
        const struct kc__lout *o = &r->out[i];
        w_u32(&b, (uint32_t)o->size_rc);
        w_u32(&b, (uint32_t)o->size_set);
        w_u64(&b, o->size);
        w_u32(&b, (uint32_t)o->get_rc);
        w_u32(&b, (uint32_t)o->size_null_rc);
        w_u32(&b, (uint32_t)o->get_null_rc);
        w_u64(&b, o->nbytes);
        w_bytes(&b, o->bytes, o->nbytes);
    }
    if (b.failed) {
        free(b.p);
        return -ENOMEM;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

/* ---- reading ------------------------------------------------------------- */

struct rd {
    const unsigned char *p;
    size_t n, off;
    int bad;
};

static uint32_t r_u32(struct rd *r)
{
    if (r->bad || r->n - r->off < 4) {
        r->bad = 1;
        return 0;
    }
    const unsigned char *x = r->p + r->off;
    r->off += 4;
    return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}

static uint64_t r_u64(struct rd *r)
{
    uint64_t lo = r_u32(r);
    return lo | (uint64_t)r_u32(r) << 32;
}

struct kc__lrec *kc__lrec_decode(const void *p, size_t n)
{
    struct rd r = {.p = p, .n = n};
    if (p == NULL || r_u32(&r) != LREC_MAGIC || r_u32(&r) != LREC_VERSION)
        return NULL;
    struct kc__lrec *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->api = r_u32(&r);
    x->complete_rc = (int32_t)r_u32(&r);
    if (x->api != KC_LREC_NVJITLINK && x->api != KC_LREC_CULINK)
        r.bad = 1;
    for (int i = 0; i < N_LOUT && !r.bad; i++) {
        struct kc__lout *o = &x->out[i];
        o->size_rc = (int32_t)r_u32(&r);
        o->size_set = (int32_t)r_u32(&r);
        o->size = r_u64(&r);
        o->get_rc = (int32_t)r_u32(&r);
        o->size_null_rc = (int32_t)r_u32(&r);
        o->get_null_rc = (int32_t)r_u32(&r);
        uint64_t nb = r_u64(&r);
        if (r.bad || nb > r.n - r.off || (o->size_set != 0 && o->size_set != 1)) {
            r.bad = 1;
            break;
        }
        o->bytes = malloc(nb + 1);
        if (o->bytes == NULL) {
            r.bad = 1;
            break;
        }
        memcpy(o->bytes, r.p + r.off, nb);
        o->bytes[nb] = 0;
        o->nbytes = nb;
        r.off += nb;
        if (x->api == KC_LREC_NVJITLINK) {
            /* What capture can have written: a buffer of the announced size,
             * or (no usable size) at most 64 bytes. */
            if (nb > 0 && o->size_rc == 0 && o->size_set && o->size > 0 && nb > o->size)
                r.bad = 1;
            if (nb > 64 && !(o->size_rc == 0 && o->size_set && nb == o->size))
                r.bad = 1;
        } else if (i == LOUT_CUBIN) {
            /* The cubin handed out must be exactly *sizeOut bytes. */
            if (o->size_set && nb != o->size)
                r.bad = 1;
        } else if (i == LOUT_PTX || i == LOUT_LTOIR) {
            if (nb != 0)
                r.bad = 1;
        }
    }
    if (r.bad || r.off != r.n) {
        kc__lrec_free(x);
        return NULL;
    }
    return x;
}
