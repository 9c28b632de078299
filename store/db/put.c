/*
 * put.c: one record put into the primary, in the write batch, not
 * committed: a drained put file's (drain.c), a bundle's (import.c), a hot
 * file salvaged by recovery (recover.c); and one hit folded into its
 * entry's recency (hits, last hit) and its hot file.
 */
#include "steps.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kc__apply_put(struct kc__owner *o, const struct kc__sp_put *sp, bool *applied)
{
    struct kc_buf stored = {0};
    int rc = kc__body_encode(sp->body, sp->body_len, &o->cdict, &stored);
    kc__dict_sample(o, sp->body, sp->body_len);
    if (rc == 0) {
        kc_digest dg = kc_digest_of(stored.p, stored.len);
        unsigned char digest[16];
        kc__digest_encode(&dg, digest);
        rc = kc__apply_put_stored(o, sp, digest, stored.p, stored.len, applied);
    }
    kc_buf_free(&stored);
    return rc;
}

int kc__apply_put_stored(struct kc__owner *o, const struct kc__sp_put *sp,
                         const unsigned char digest[16], const void *stored, size_t stored_len,
                         bool *applied)
{
    /* The filter first: it must never say "absent" for a key a reader
     * could have stopped finding in the spool. */
    kc__filter_add(&o->f, kc__fhash_kernel(sp->ns, &sp->key));
    if (sp->has_source)
        kc__filter_add(&o->f, kc__fhash_source(sp->ns, &sp->source));
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(sp->ns, &sp->key, kk);
    struct kc__hdr h = sp->hdr;
    bool need_ref = true;

    char *old = NULL;
    size_t oldl = 0;
    int rc = kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &old, &oldl);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (rc == 0) {
        struct kc__hdr oh;
        const unsigned char *od = kc__kval_digest(old, oldl);
        if (kc__kval_decode(old, oldl, &oh) == 0) {
            if (oh.created_ns > h.created_ns) {
                /* A newer version is already in: this one is stale. */
                free(old);
                rocksdb_writebatch_destroy(wb);
                *applied = false;
                return 0;
            }
            h.hits = oh.hits;
            h.last_hit_ns = oh.last_hit_ns;
            if (memcmp(od, digest, 16) == 0)
                need_ref = false;
        }
        if (need_ref && od != NULL)
            kc__ref_drop(o, wb, od);
        free(old);
    }

    uint64_t cnt = 0, size = 0;
    rc = kc__ref_get(o, digest, &cnt, &size);
    if (rc < 0 && rc != -ENOENT)
        goto out;
    /* The body must be there and whole: the bytes its digest names (the
     * digest is of the stored bytes); rewrite it when it is not. */
    char *bv = NULL;
    size_t bvl = 0;
    bool body_ok = kc__db_get(&o->d, KC__CF_BODIES, digest, 16, &bv, &bvl) == 0 &&
                   bvl == stored_len && memcmp(bv, stored, bvl) == 0;
    free(bv);
    rc = 0;
    if (!body_ok)
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_BODIES], (char *)digest, 16,
                                  (const char *)stored, stored_len);
    if (need_ref || cnt == 0) {
        if (cnt == 0)
            o->unique += h.body_size;
        kc__ref_put(o, wb, digest, cnt + 1, h.body_size);
    }

    unsigned char kv[KC__KVAL_LEN];
    kc__kval_encode(&h, digest, kv);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_KERNELS], (char *)kk, kl, (char *)kv, sizeof kv);
    unsigned char nk[KC__META_NAME_KEY_MAX];
    size_t nkl = kc__meta_ns_key(sp->ns, nk);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)nk, nkl, "", 0);
    if (sp->has_source) {
        unsigned char sk[KC__NS_MAX + 1 + 16], sv[KC__KEY_LEN];
        size_t sl = kc__skey(sp->ns, &sp->source, sk);
        kc__key_encode(&sp->key, sv);
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_SOURCES], (char *)sk, sl, (char *)sv,
                                  sizeof sv);
    }
    rc = kc__owner_write(o, wb, false);
    *applied = rc == 0;
out:
    rocksdb_writebatch_destroy(wb);
    return rc;
}

int kc__apply_hit(struct kc__owner *o, const struct kc__sp_item *it)
{
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(it->ns, &it->key, kk);
    char *kv = NULL;
    size_t kvl = 0;
    if (kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) != 0)
        return 0;
    struct kc__hdr h;
    int rc = 0;
    if (kc__kval_decode(kv, kvl, &h) == 0) {
        h.hits += it->a;
        if (it->b > h.last_hit_ns)
            h.last_hit_ns = it->b;
        kc__hdr_encode(&h, (unsigned char *)kv); /* the header leads the value */
        char *err = NULL;
        rocksdb_put_cf(o->d.db, o->d.wo, o->d.cf[KC__CF_KERNELS], (char *)kk, kl, kv, kvl, &err);
        rc = kc__db_err(err, "put");
        if (rc == 0)
            kc__hot_touch(o, it->ns, &it->key);
    }
    free(kv);
    return rc;
}
