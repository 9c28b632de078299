/*
 * filter_sync.c: DIR/filter kept in step with the database by the owner
 * (the filter itself is store/local/filter.c): created empty before a new
 * database, checked at session start, rebuilt from every kernels and
 * sources key when an earlier session did not close it or deletes made it
 * stale.
 */
#include "parts.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Rebuilds DIR/filter from the database: every kernels and sources key. */
int kc__owner_filter_rebuild(struct kc__owner *o)
{
    uint64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        int cf = pass ? KC__CF_SOURCES : KC__CF_KERNELS;
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it))
            n++;
        rocksdb_iter_destroy(it);
    }
    kc__filter_close(&o->f);
    struct kc__filter_rw f;
    int rc = kc__filter_create(&f, o->p.filter, 4 * n);
    if (rc < 0) {
        unlink(o->p.filter); /* a stale filter could say "absent" */
        return rc;
    }
    for (int pass = 0; pass < 2; pass++) {
        int cf = pass ? KC__CF_SOURCES : KC__CF_KERNELS;
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl;
            const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
            char ns[KC__NS_MAX + 1];
            kc_key key;
            kc_digest src;
            if (cf == KC__CF_KERNELS) {
                if (kc__kkey_split(k, kl, ns, &key) == 0)
                    kc__filter_add(&f, kc__fhash_kernel(ns, &key));
            } else if (kc__skey_split(k, kl, ns, &src) == 0) {
                kc__filter_add(&f, kc__fhash_source(ns, &src));
            }
        }
        rocksdb_iter_destroy(it);
    }
    rc = kc__filter_publish(&f, o->p.filter);
    if (rc < 0) {
        kc__filter_close(&f);
        unlink(o->p.filter);
        return rc;
    }
    o->f = f;
    return 0;
}

/* At the start of a session: the filter must hold every key of the
 * database; one an earlier session did not close cleanly (its stamp is
 * not the database's generation) is rebuilt. While this session runs the
 * stamp says so. */
void kc__owner_filter_begin(struct kc__owner *o)
{
    uint64_t stamp = 0;
    if (kc__filter_open_rw(&o->f, o->p.filter, &stamp) != 0 || stamp != o->gen_seq ||
        kc__filter_stale(&o->f)) {
        if (kc__owner_filter_rebuild(o) < 0)
            return;
    }
    kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
}

/* Before the database is created: it will hold nothing, so an empty filter
 * is right for it. Published first, a reader never finds db/CURRENT
 * without a filter in a new store (that answers "maybe", and the reader
 * would load RocksDB to learn of a miss); kc__owner_filter_begin then takes over. */
void kc__owner_filter_before_create(struct kc__owner *o)
{
    char cur[4300];
    snprintf(cur, sizeof cur, "%s/CURRENT", o->p.db);
    if (access(cur, F_OK) == 0 || errno != ENOENT)
        return;
    struct kc__filter_rw f;
    if (kc__filter_create(&f, o->p.filter, 0) == 0) {
        kc__filter_publish(&f, o->p.filter);
        kc__filter_close(&f);
    }
}

void kc__owner_filter_maybe_rebuild(struct kc__owner *o)
{
    if (o->f.map != NULL && kc__filter_stale(&o->f) && kc__owner_filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
}
