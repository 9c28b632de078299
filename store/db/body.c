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
#include "body.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zdict.h>
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

/* Where a stored value's zstd frame starts (after the dictionary's id for
 * KC__BODY_ZSTD_DICT). */
static size_t frame_at(int codec)
{
    return KC__BODY_HDR + (codec == KC__BODY_ZSTD_DICT ? 8 : 0);
}

int kc__body_info(const void *v, size_t vl, uint64_t *raw_len, int *codec, uint64_t *dict)
{
    const unsigned char *p = v;
    if (dict != NULL)
        *dict = 0;
    if (vl < KC__BODY_HDR || kc_le_get_u32(p) != KC__BODY_MAGIC) {
        /* A body an earlier version stored as it is. Its header's size
         * and checksum decide whether it is the body asked for. */
        *raw_len = vl;
        *codec = KC__BODY_LEGACY;
        return 0;
    }
    unsigned c = p[4];
    uint64_t n = kc_le_get_u64(p + 8);
    if (p[5] != 0 || kc_le_get_u16(p + 6) != 0 ||
        (c != KC__BODY_RAW && c != KC__BODY_ZSTD && c != KC__BODY_ZSTD_DICT) ||
        (c == KC__BODY_RAW && n != vl - KC__BODY_HDR) || n > KC__BODY_MAX || vl < frame_at((int)c))
        return -EBADMSG;
    size_t at = frame_at((int)c);
    uint64_t id = c == KC__BODY_ZSTD_DICT ? kc_le_get_u64(p + KC__BODY_HDR) : 0;
    if (c == KC__BODY_ZSTD_DICT && id == 0)
        return -EBADMSG;
    /* A frame states the size it inflates to (kc__body_encode's do): the
     * header's, checked without inflating it. */
    if (c != KC__BODY_RAW && ZSTD_getFrameContentSize(p + at, vl - at) != (unsigned long long)n)
        return -EBADMSG;
    *raw_len = n;
    *codec = (int)c;
    if (dict != NULL)
        *dict = id;
    return 0;
}

uint64_t kc__dict_id(const void *p, size_t n)
{
    uint64_t id = XXH3_64bits(p, n);
    return id != 0 ? id : 1;
}

int kc__cdict_make(struct kc__cdict *c, const void *p, size_t n)
{
    c->cd = ZSTD_createCDict(p, n, KC__BODY_LEVEL);
    c->id = c->cd != NULL ? kc__dict_id(p, n) : 0;
    return c->cd != NULL ? 0 : -ENOMEM;
}

void kc__cdict_free(struct kc__cdict *c)
{
    ZSTD_freeCDict(c->cd);
    c->cd = NULL;
    c->id = 0;
}

int kc__dict_train(const void *samples, const size_t *sizes, unsigned n, struct kc_buf *out)
{
    if (kc_buf_reserve(out, KC__DICT_BYTES) != 0)
        return -ENOMEM;
    size_t z = ZDICT_trainFromBuffer(out->p + out->len, KC__DICT_BYTES, samples, sizes, n);
    if (ZDICT_isError(z))
        return -EINVAL;
    out->len += z;
    return 0;
}

void kc__dicts_init(struct kc__dicts *d, int (*load)(void *arg, uint64_t id, char **p, size_t *n),
                    void *arg)
{
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    d->load = load;
    d->arg = arg;
    d->live = true;
}

void kc__dicts_free(struct kc__dicts *d)
{
    if (!d->live)
        return;
    for (size_t i = 0; i < d->n; i++)
        ZSTD_freeDDict(d->v[i].dd);
    free(d->v);
    pthread_mutex_destroy(&d->mu);
    memset(d, 0, sizeof *d);
}

/* The decoding dictionary of id, loaded once: NULL with *rc -EBADMSG when
 * there is none such (the body cannot be read: a bad entry), or another
 * errno when it could not be loaded now (a miss, not a bad entry). */
static const ZSTD_DDict *dicts_get(struct kc__dicts *d, uint64_t id, int *rc)
{
    *rc = -EBADMSG;
    if (d == NULL || !d->live)
        return NULL;
    pthread_mutex_lock(&d->mu);
    const ZSTD_DDict *dd = NULL;
    for (size_t i = 0; i < d->n && dd == NULL; i++)
        if (d->v[i].id == id)
            dd = d->v[i].dd;
    char *p = NULL;
    size_t n = 0;
    /* Loaded under the lock: rare (once per dictionary and process). */
    int lr = dd == NULL && d->load != NULL ? d->load(d->arg, id, &p, &n) : -ENOENT;
    if (dd == NULL && lr != 0 && lr != -ENOENT)
        *rc = lr;
    if (dd == NULL && lr == 0 && kc__dict_id(p, n) == id) {
        ZSTD_DDict *nd = ZSTD_createDDict(p, n);
        if (nd == NULL)
            *rc = -ENOMEM;
        if (nd != NULL && d->n == d->cap) {
            size_t cap = d->cap ? 2 * d->cap : 4;
            void *v = realloc(d->v, cap * sizeof *d->v);
            if (v == NULL) {
                ZSTD_freeDDict(nd);
                nd = NULL;
                *rc = -ENOMEM;
            } else {
                d->v = v;
                d->cap = cap;
            }
        }
        if (nd != NULL) {
            d->v[d->n].id = id;
            d->v[d->n].dd = nd;
            d->n++;
            dd = nd;
        }
    }
    free(p);
    pthread_mutex_unlock(&d->mu);
    return dd;
}

int kc__body_encode(const void *body, size_t n, const struct kc__cdict *cd, struct kc_buf *out)
{
    size_t base = out->len;
    bool dict = cd != NULL && cd->cd != NULL;
    kc_buf_put_u32(out, KC__BODY_MAGIC);
    kc_buf_put_u8(out, KC__BODY_RAW);
    kc_buf_put_u8(out, 0);
    kc_buf_put_u16(out, 0);
    kc_buf_put_u64(out, n);
    if (dict)
        kc_buf_put_u64(out, cd->id);
    if (out->err)
        return out->err;
    size_t bound = ZSTD_compressBound(n);
    /* Below 64 bytes zstd's frame costs more than it saves. */
    if (n >= 64 && kc_buf_reserve(out, bound) == 0) {
        ZSTD_CCtx *c = pool_take(&cpool);
        if (c == NULL)
            c = ZSTD_createCCtx();
        if (c != NULL) {
            size_t z =
                dict ? ZSTD_compress_usingCDict(c, out->p + out->len, bound, body, n,
                                                (const ZSTD_CDict *)cd->cd)
                     : ZSTD_compressCCtx(c, out->p + out->len, bound, body, n, KC__BODY_LEVEL);
            if (!pool_give(&cpool, c))
                ZSTD_freeCCtx(c);
            if (!ZSTD_isError(z) && z < n) {
                out->p[base + 4] = dict ? KC__BODY_ZSTD_DICT : KC__BODY_ZSTD;
                out->len += z;
                return 0;
            }
        }
    }
    out->len = base + KC__BODY_HDR; /* as it is: no dictionary id */
    kc_buf_add(out, body, n);
    return out->err;
}

int kc__body_decode(const void *v, size_t vl, struct kc__dicts *dicts, char **body, size_t *n)
{
    uint64_t raw, id;
    int codec;
    if (kc__body_info(v, vl, &raw, &codec, &id) != 0)
        return -EBADMSG;
    const ZSTD_DDict *dd = NULL;
    int drc = 0;
    if (codec == KC__BODY_ZSTD_DICT && (dd = dicts_get(dicts, id, &drc)) == NULL)
        return drc; /* -EBADMSG: a dictionary the store does not have */
    const unsigned char *p = v;
    size_t at = codec == KC__BODY_LEGACY ? 0 : frame_at(codec);
    const unsigned char *src = p + at;
    size_t sl = vl - at;
    char *out = malloc(raw ? (size_t)raw : 1);
    if (out == NULL)
        return -ENOMEM;
    if (codec == KC__BODY_RAW || codec == KC__BODY_LEGACY) {
        memcpy(out, src, sl);
    } else {
        /* The frame must say the size the header says (a frame of another
         * size, or none, is not ours), and inflate to exactly that. */
        unsigned long long fs = ZSTD_getFrameContentSize(src, sl);
        ZSTD_DCtx *dc = pool_take(&dpool);
        if (dc == NULL)
            dc = ZSTD_createDCtx();
        size_t z = dc == NULL || fs != raw ? (size_t)-1
                   : dd != NULL ? ZSTD_decompress_usingDDict(dc, out, (size_t)raw, src, sl, dd)
                                : ZSTD_decompressDCtx(dc, out, (size_t)raw, src, sl);
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
