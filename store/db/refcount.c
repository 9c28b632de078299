/*
 * refcount.c: refcounted bodies. A body is stored once (bodies family, key
 * its digest) however many kernels entries name it; its META refcount
 * (meta.h) says how many do and its size. Dropping the last reference
 * drops the body. o->unique, the deduplicated bytes the size limit counts,
 * follows the refcounts.
 */
#include "parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kc__ref_get(struct kc__owner *o, const unsigned char digest[16], uint64_t *cnt, uint64_t *size)
{
    unsigned char rk[KC__META_REF_KEY_LEN];
    char *v = NULL;
    size_t vl = 0;
    int rc = kc__db_get(&o->d, KC__CF_META, rk, kc__meta_ref_key(digest, rk), &v, &vl);
    if (rc < 0)
        return rc;
    if (kc__meta_ref_parse(v, vl, cnt, size) != 0) {
        *cnt = 0;
        *size = 0;
    }
    free(v);
    return 0;
}

void kc__ref_put(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16],
                 uint64_t cnt, uint64_t size)
{
    unsigned char rk[KC__META_REF_KEY_LEN], v[KC__META_REF_VAL_LEN];
    kc__meta_ref_key(digest, rk);
    if (cnt == 0) {
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk);
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], (const char *)digest, 16);
        return;
    }
    kc__meta_ref_value(cnt, size, v);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk, (char *)v, sizeof v);
}

/* Drops one reference to a body (in the batch). */
void kc__ref_drop(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16])
{
    uint64_t cnt = 0, size = 0;
    if (kc__ref_get(o, digest, &cnt, &size) != 0 || cnt == 0) {
        /* No refcount: the body is an orphan; drop it. */
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], (const char *)digest, 16);
        return;
    }
    if (cnt == 1 && o->unique >= size)
        o->unique -= size;
    kc__ref_put(o, wb, digest, cnt - 1, size);
}

/* Deletes one kernel entry (in the batch) and drops its body reference. */
void kc__kernel_delete(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char *kk,
                       size_t kl, const char *kv, size_t kvl)
{
    rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_KERNELS], (const char *)kk, kl);
    const unsigned char *digest = kc__kval_digest(kv, kvl);
    if (digest != NULL)
        kc__ref_drop(o, wb, digest);
}

uint64_t kc__count_unique(struct kc__owner *o)
{
    uint64_t total = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_META]);
    for (rocksdb_iter_seek(it, KC__META_REF_PREFIX, 2); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        uint64_t size;
        if (!kc__meta_is(k, kl, KC__META_REF_PREFIX))
            break;
        if (kc__meta_ref_parse(v, vl, NULL, &size) == 0)
            total += size;
    }
    rocksdb_iter_destroy(it);
    return total;
}
