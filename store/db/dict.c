/*
 * dict.c: the store's compression dictionaries (meta.h: "z/" and "zc").
 * Bodies are compressed one by one (body.c), and alone a few KB of PTX or
 * cubin shares nothing with its neighbours; with a dictionary trained on
 * the store's own bodies they share their PTX preambles, ELF layout and
 * common sequences (as RocksDB's per-table dictionaries did when it
 * compressed the bodies itself). The owner samples the bodies it drains
 * (up to KC__DICT_BYTES of each, SAMPLE_MAX in all, as RocksDB's
 * zstd_max_train_bytes), trains one once it has enough, writes it (synced)
 * before any body uses it, and trains a new one after every RETRAIN_BYTES
 * drained; old ones stay for the bodies that name them.
 */
#include "parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLE_MAX (100u * KC__DICT_BYTES)
#define TRAIN_MIN_N 64
#define TRAIN_MIN_BYTES (256u << 10)
#define RETRAIN_BYTES (256ull << 20)

static void samples_drop(struct kc__owner *o)
{
    kc_buf_free(&o->dict_samples);
    free(o->dict_sizes);
    o->dict_sizes = NULL;
    o->dict_n = o->dict_cap = 0;
}

void kc__dict_reset(struct kc__owner *o)
{
    kc__cdict_free(&o->cdict);
    samples_drop(o);
    o->dict_since = 0;
}

int kc__dict_load(struct kc__owner *o)
{
    kc__dict_reset(o);
    char *v = NULL, *dv = NULL;
    size_t vl = 0, dl = 0;
    int rc = kc__db_get(&o->d, KC__CF_META, KC__META_DICT_CURRENT, 2, &v, &vl);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    uint64_t id = vl == 8 ? kc_le_get_u64((unsigned char *)v) : 0;
    free(v);
    unsigned char k[KC__META_DICT_KEY_LEN];
    size_t kl = kc__meta_dict_key(id, k);
    /* One that is missing or not its id's is not used: new bodies go
     * without a dictionary until the next is trained. */
    if (id == 0 || kc__db_get(&o->d, KC__CF_META, k, kl, &dv, &dl) != 0)
        return 0;
    if (kc__dict_id(dv, dl) == id)
        kc__cdict_make(&o->cdict, dv, dl);
    free(dv);
    return 0;
}

void kc__dict_sample(struct kc__owner *o, const void *body, size_t n)
{
    o->dict_since += n;
    if ((o->cdict.cd != NULL && o->dict_since < RETRAIN_BYTES) || n < 64 ||
        o->dict_samples.len >= SAMPLE_MAX)
        return;
    size_t take = n < KC__DICT_BYTES ? n : KC__DICT_BYTES;
    if (take > SAMPLE_MAX - o->dict_samples.len)
        return;
    if (o->dict_n == o->dict_cap) {
        size_t cap = o->dict_cap ? 2 * o->dict_cap : 128;
        size_t *v = realloc(o->dict_sizes, cap * sizeof *v);
        if (v == NULL)
            return;
        o->dict_sizes = v;
        o->dict_cap = cap;
    }
    kc_buf_add(&o->dict_samples, body, take);
    if (o->dict_samples.err) {
        samples_drop(o);
        return;
    }
    o->dict_sizes[o->dict_n++] = take;
}

int kc__dict_maybe_train(struct kc__owner *o)
{
    if (o->dict_n < TRAIN_MIN_N || o->dict_samples.len < TRAIN_MIN_BYTES)
        return 0;
    struct kc_buf d = {0};
    int rc = kc__dict_train(o->dict_samples.p, o->dict_sizes, (unsigned)o->dict_n, &d);
    /* Sampled again from scratch either way: a set that trains nothing
     * (too alike, too few) is not tried again at every round. */
    samples_drop(o);
    o->dict_since = 0;
    struct kc__cdict c = {0};
    if (rc == 0)
        rc = kc__cdict_make(&c, d.p, d.len);
    if (rc == 0) {
        unsigned char k[KC__META_DICT_KEY_LEN], cur[8];
        size_t kl = kc__meta_dict_key(c.id, k);
        kc_le_put_u64(cur, c.id);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)k, kl, (char *)d.p, d.len);
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], KC__META_DICT_CURRENT, 2, (char *)cur,
                                  sizeof cur);
        /* Durable before a body names it. */
        rc = kc__owner_write(o, wb, true);
        rocksdb_writebatch_destroy(wb);
    }
    if (rc == 0) {
        kc__cdict_free(&o->cdict);
        o->cdict = c;
    } else {
        kc__cdict_free(&c);
    }
    kc_buf_free(&d);
    return rc == -EINVAL ? 0 : rc;
}
