/*
 * evict.c: eviction. Past the size limit the least recently hit entries
 * (their recency: hit logs folded in by put.c's kc__apply_hit) are
 * evicted, with the sources entries left without a kernel.
 */
#include "jobs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct victim {
    unsigned char *k;
    size_t kl;
    uint64_t recency;
};

static int cmp_victim(const void *a, const void *b)
{
    const struct victim *x = a, *y = b;
    return x->recency < y->recency ? -1 : x->recency > y->recency;
}

/* Evicts least-recently-hit entries until o->unique <= target. The
 * progress counts bytes: freed of the o->unique - target to free. */
int kc__evict(struct kc__owner *o, uint64_t target, uint64_t *evicted, kc_progress_fn progress,
              void *arg)
{
    if (o->unique <= target)
        return 0;
    const uint64_t before = o->unique, want = before - target;
    struct victim *v = NULL;
    size_t n = 0, cap = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_KERNELS]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *val = rocksdb_iter_value(it, &vl);
        struct kc__hdr h;
        uint64_t rec = 0;
        if (kc__kval_decode(val, vl, &h) == 0)
            rec = h.last_hit_ns > h.created_ns ? h.last_hit_ns : h.created_ns;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            struct victim *nv = realloc(v, cap * sizeof *v);
            if (nv == NULL)
                break;
            v = nv;
        }
        v[n].k = malloc(kl);
        if (v[n].k == NULL)
            break;
        memcpy(v[n].k, k, kl);
        v[n].kl = kl;
        v[n].recency = rec;
        n++;
    }
    rocksdb_iter_destroy(it);
    qsort(v, n, sizeof *v, cmp_victim);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0 && o->unique > target; i++) {
        char *kv = NULL;
        size_t kvl = 0;
        if (kc__db_get(&o->d, KC__CF_KERNELS, v[i].k, v[i].kl, &kv, &kvl) != 0)
            continue;
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        kc__kernel_delete(o, wb, v[i].k, v[i].kl, kv, kvl);
        rc = kc__owner_write(o, wb, false);
        rocksdb_writebatch_destroy(wb);
        free(kv);
        kc__hot_remove_kk(o, v[i].k, v[i].kl);
        kc__filter_note_delete(&o->f);
        if (evicted)
            (*evicted)++;
        if (progress) {
            uint64_t freed = before > o->unique ? before - o->unique : 0;
            progress(freed, freed > want ? freed : want, arg);
        }
    }
    if (progress && rc == 0) {
        uint64_t freed = before > o->unique ? before - o->unique : 0;
        progress(freed, freed, arg);
    }
    for (size_t i = 0; i < n; i++)
        free(v[i].k);
    free(v);
    if (rc == 0)
        rc = kc__owner_commit(o);
    return rc;
}

/* Drops sources entries whose kernel is gone. */
void kc__prune_sources(struct kc__owner *o)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_SOURCES]);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_digest src;
        bool drop = kc__skey_split(k, kl, ns, &src) != 0 || vl != KC__KEY_LEN;
        if (!drop) {
            unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
            kc_key key;
            kc__key_decode((const unsigned char *)v, &key);
            char *kv;
            size_t kvl;
            if (kc__db_get(&o->d, KC__CF_KERNELS, kk, kc__kkey(ns, &key, kk), &kv, &kvl) == 0)
                free(kv);
            else
                drop = true;
        }
        if (drop) {
            rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_SOURCES], k, kl);
            kc__filter_note_delete(&o->f);
        }
    }
    rocksdb_iter_destroy(it);
    kc__owner_write(o, wb, false);
    rocksdb_writebatch_destroy(wb);
}

/* Past the limit, evicts down to 90% of it (as ccache does, so the next
 * few puts do not each evict). */
int kc__enforce_limit(struct kc__owner *o)
{
    if (o->unique <= o->max_size)
        return 0;
    int rc = kc__evict(o, o->max_size / 10 * 9, NULL, NULL, NULL);
    if (rc == 0) {
        kc__prune_sources(o);
        kc__compact(o);
        kc__owner_filter_maybe_rebuild(o);
    }
    return rc;
}
