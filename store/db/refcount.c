/*
 * refcount.c: refcounted bodies. A body is stored once (bodies family, key
 * its digest) however many kernels entries name it; its META refcount
 * (meta.h) says how many do and its size. Dropping the last reference
 * drops the body. o->unique, the deduplicated bytes the size limit counts,
 * follows the refcounts.
 */
#include "owner.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t rkey(const unsigned char digest[16], unsigned char out[18])
{
    out[0] = 'r';
    out[1] = '/';
    memcpy(out + 2, digest, 16);
    return 18;
}

int kc__ref_get(struct kc__owner *o, const unsigned char digest[16], uint64_t *cnt, uint64_t *size)
{
    unsigned char rk[18];
    char *v;
    size_t vl;
    int rc = kc__db_get(&o->d, KC__CF_META, rk, rkey(digest, rk), &v, &vl);
    if (rc < 0)
        return rc;
    if (vl != 16) {
        free(v);
        *cnt = 0;
        *size = 0;
        return 0;
    }
    *cnt = kc__get_u64((unsigned char *)v);
    *size = kc__get_u64((unsigned char *)v + 8);
    free(v);
    return 0;
}

void kc__ref_put(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16],
                 uint64_t cnt, uint64_t size)
{
    unsigned char rk[18], v[16];
    rkey(digest, rk);
    if (cnt == 0) {
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk);
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], (const char *)digest, 16);
        return;
    }
    kc__put_u64(v, cnt);
    kc__put_u64(v + 8, size);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk, (char *)v,
                              sizeof v);
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
    if (kvl == KC__KVAL_LEN)
        kc__ref_drop(o, wb, (const unsigned char *)kv + KC__HDR_LEN);
}

uint64_t kc__count_unique(struct kc__owner *o)
{
    uint64_t total = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_META]);
    for (rocksdb_iter_seek(it, "r/", 2); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (kl < 2 || k[0] != 'r' || k[1] != '/')
            break;
        if (vl == 16)
            total += kc__get_u64((const unsigned char *)v + 8);
    }
    rocksdb_iter_destroy(it);
    return total;
}
