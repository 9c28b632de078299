/*
 * body.c: a body as the bodies family keeps it (meta.h): compressed by
 * kcache, one zstd frame per body, so that what leaves the store (a
 * bundle) and what enters it (a drained put, an imported bundle) moves as
 * the bytes on disk, with no second compression and no decompression on
 * the way. RocksDB stores these values as they are (db.c: no compression
 * for the family).
 *
 * Contexts: zstd's are ~100 KB (decompression) and ~1 MB (compression at
 * level 3); a get in a host thread borrows one from a small pool rather
 * than keep one per thread (a thread that exits would leak it).
 */
#include "internal.h"
#include "meta.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#define POOL_MAX 4

struct pool {
    pthread_mutex_t mu;
    void *free[POOL_MAX];
    int n;
};

static struct pool cpool = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};
static struct pool dpool = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

static void *pool_take(struct pool *p)
{
    void *c = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->n > 0)
        c = p->free[--p->n];
    pthread_mutex_unlock(&p->mu);
    return c;
}

/* Gives c back; false when the pool is full (the caller frees it). */
static bool pool_give(struct pool *p, void *c)
{
    bool kept = false;
    pthread_mutex_lock(&p->mu);
    if (p->n < POOL_MAX) {
        p->free[p->n++] = c;
        kept = true;
    }
    pthread_mutex_unlock(&p->mu);
    return kept;
}

int kc__body_info(const void *v, size_t vl, uint64_t *raw_len, int *codec)
{
    const unsigned char *p = v;
    if (vl < KC__BODY_HDR || kc_le_get_u32(p) != KC__BODY_MAGIC) {
        /* A body an earlier version stored as it is. Its header's size
         * and checksum decide whether it is the body asked for. */
        *raw_len = vl;
        *codec = KC__BODY_LEGACY;
        return 0;
    }
    unsigned c = p[4];
    uint64_t n = kc_le_get_u64(p + 8);
    if (p[5] != 0 || kc_le_get_u16(p + 6) != 0 || (c != KC__BODY_RAW && c != KC__BODY_ZSTD) ||
        (c == KC__BODY_RAW && n != vl - KC__BODY_HDR) || n > KC__BODY_MAX)
        return -EBADMSG;
    /* A frame states the size it inflates to (kc__body_encode's do): the
     * header's, checked without inflating it. */
    if (c == KC__BODY_ZSTD &&
        ZSTD_getFrameContentSize(p + KC__BODY_HDR, vl - KC__BODY_HDR) != (unsigned long long)n)
        return -EBADMSG;
    *raw_len = n;
    *codec = (int)c;
    return 0;
}

int kc__body_encode(const void *body, size_t n, struct kc_buf *out)
{
    size_t base = out->len;
    kc_buf_put_u32(out, KC__BODY_MAGIC);
    kc_buf_put_u8(out, KC__BODY_RAW);
    kc_buf_put_u8(out, 0);
    kc_buf_put_u16(out, 0);
    kc_buf_put_u64(out, n);
    if (out->err)
        return out->err;
    size_t bound = ZSTD_compressBound(n);
    /* Below 64 bytes zstd's frame costs more than it saves. */
    if (n >= 64 && kc_buf_reserve(out, bound) == 0) {
        ZSTD_CCtx *c = pool_take(&cpool);
        if (c == NULL)
            c = ZSTD_createCCtx();
        if (c != NULL) {
            size_t z = ZSTD_compressCCtx(c, out->p + out->len, bound, body, n, KC__BODY_LEVEL);
            if (!pool_give(&cpool, c))
                ZSTD_freeCCtx(c);
            if (!ZSTD_isError(z) && z < n) {
                out->p[base + 4] = KC__BODY_ZSTD;
                out->len += z;
                return 0;
            }
        }
    }
    kc_buf_add(out, body, n);
    return out->err;
}

int kc__body_decode(const void *v, size_t vl, char **body, size_t *n)
{
    uint64_t raw;
    int codec;
    if (kc__body_info(v, vl, &raw, &codec) != 0)
        return -EBADMSG;
    const unsigned char *p = v;
    const unsigned char *src = codec == KC__BODY_LEGACY ? p : p + KC__BODY_HDR;
    size_t sl = codec == KC__BODY_LEGACY ? vl : vl - KC__BODY_HDR;
    char *out = malloc(raw ? (size_t)raw : 1);
    if (out == NULL)
        return -ENOMEM;
    if (codec != KC__BODY_ZSTD) {
        memcpy(out, src, sl);
    } else {
        /* The frame must say the size the header says (a frame of another
         * size, or none, is not ours), and inflate to exactly that. */
        unsigned long long fs = ZSTD_getFrameContentSize(src, sl);
        ZSTD_DCtx *dc = pool_take(&dpool);
        if (dc == NULL)
            dc = ZSTD_createDCtx();
        size_t z = dc != NULL && fs == raw ? ZSTD_decompressDCtx(dc, out, (size_t)raw, src, sl)
                                           : (size_t)-1;
        if (dc != NULL && !pool_give(&dpool, dc))
            ZSTD_freeDCtx(dc);
        if (dc == NULL) {
            free(out);
            return -ENOMEM;
        }
        if (ZSTD_isError(z) || z != raw) {
            free(out);
            return -EBADMSG;
        }
    }
    *body = out;
    *n = (size_t)raw;
    return 0;
}
