/*
 * admin.c: the tool's operations that write, each run as the owner, at
 * the top of the owner's tree (they run jobs in order): gc (eviction down
 * to a size, evict.c), verify (verify.c's pass: every entry, body,
 * refcount and hot file checked, with repair what fails purged and the
 * refcounts rebuilt; a database found corrupt recovered, recover.c, and
 * verified again) and clear (every entry; counters stay).
 */
#include "owner.h"
#include "jobs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kc__owner_gc(struct kc__owner *o, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg)
{
    struct kc_gc_report r = {0};
    if (max_size == 0)
        max_size = o->max_size;
    r.bytes_before = o->unique;
    int rc = kc__evict(o, max_size, &r.evicted, progress, arg);
    if (rc == 0) {
        kc__prune_sources(o);
        rc = kc__owner_commit(o);
        kc__compact(o);
        if (rc == 0 && o->f.map != NULL && kc__owner_filter_rebuild(o) == 0)
            kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    }
    if (o->d.corrupt && !o->recovering) {
        int rr = kc__owner_recover(o, "gc");
        if (rc == 0 || rc == -EBADMSG)
            rc = rr;
    }
    r.bytes_after = o->unique;
    if (rep)
        *rep = r;
    return rc;
}

int kc__owner_verify(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg)
{
    int rc = kc__verify_once(o, repair, rep, progress, arg);
    if (repair && o->d.corrupt && !o->recovering) {
        rc = kc__owner_recover(o, "verify");
        if (rc == 0)
            rc = kc__verify_once(o, repair, rep, progress, arg);
    }
    return rc;
}

int kc__owner_clear(struct kc__owner *o)
{
    int rc = 0;
    for (int cf = KC__CF_KERNELS; cf < KC__N_CF && rc == 0; cf++) {
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl;
            const char *k = rocksdb_iter_key(it, &kl);
            /* Counters are statistics, not entries: they stay, and so do
             * the marks of the counter logs they hold. */
            if (cf == KC__CF_META && (kc__meta_is(k, kl, KC__META_COUNTERS_PREFIX) ||
                                      kc__meta_is(k, kl, KC__META_APPLIED_PREFIX)))
                continue;
            rocksdb_writebatch_delete_cf(wb, o->d.cf[cf], k, kl);
        }
        rocksdb_iter_destroy(it);
        rc = kc__owner_write(o, wb, false);
        rocksdb_writebatch_destroy(wb);
    }
    o->unique = 0;
    kc__dict_reset(o); /* its dictionaries went with the rest */
    kc__hot_clear(o);
    if (rc == 0)
        rc = kc__owner_commit(o);
    kc__compact(o);
    if (rc == 0 && kc__owner_filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    return rc;
}
