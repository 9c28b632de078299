/*
 * verify.c: one verify pass (kc__verify_once): every entry, body,
 * refcount and hot file checked; with repair, what fails is purged and
 * the refcounts rebuilt. The tool's verify (admin.c) runs it and recovers
 * a database it finds corrupt; recovery (recover.c) runs it with repair.
 */
#include "steps.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct refc {
    unsigned char d[16];
    uint64_t n;
};

static int cmp_refc(const void *a, const void *b)
{
    return memcmp(((const struct refc *)a)->d, ((const struct refc *)b)->d, 16);
}

/* Checks every hot file against the database: it must decode, hold the
 * key its name says, and match the entry's body and creation time. Bad
 * ones are counted as bad spool files and, with repair, removed. */
static void hot_verify(struct kc__owner *o, int repair, struct kc_verify_report *r)
{
    struct kc__hotf *v;
    size_t n;
    kc__hot_list(o, &v, &n);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o->p.hot, v[i].name);
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        bool bad = kc__hot_file_read(o->p.hot, v[i].name, &buf, &sp) != 0;
        if (!bad) {
            unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
            size_t kl = kc__kkey(sp.ns, &sp.key, kk);
            char *kv = NULL;
            size_t kvl = 0;
            struct kc__hdr h;
            bad = kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) != 0 ||
                  kc__kval_decode(kv, kvl, &h) != 0 || h.body_xxh != sp.hdr.body_xxh ||
                  h.created_ns != sp.hdr.created_ns;
            free(kv);
        }
        free(buf);
        /* Counted with the spool files (a hot file is a drained one). */
        if (bad) {
            r->spool_bad++;
            if (repair && unlink(path) == 0)
                o->hot_bytes = o->hot_bytes > v[i].size ? o->hot_bytes - v[i].size : 0;
        }
    }
    free(v);
}

/* How many entries the kernels family holds (headers only: no body is
 * read), for verify's progress. */
static uint64_t count_entries(struct kc__owner *o)
{
    uint64_t n = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_KERNELS]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it))
        n++;
    rocksdb_iter_destroy(it);
    return n;
}

int kc__verify_once(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                    kc_progress_fn progress, void *arg)
{
    struct kc_verify_report r = {0};
    r.spool_bad = (uint64_t)o->spool_bad;
    struct refc *refs = NULL;
    size_t nref = 0, cap = 0;
    int rc = 0;
    uint64_t total = progress != NULL ? count_entries(o) : 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_KERNELS]);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_key key;
        struct kc__hdr h;
        bool bad = kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0 ||
                   kc__kval_decode(v, vl, &h) != 0;
        const unsigned char *digest = kc__kval_digest(v, vl);
        if (!bad) {
            char *bv = NULL;
            size_t bvl = 0;
            bad = kc__body_get(&o->d, digest, &bv, &bvl) != 0 || bvl != h.body_size ||
                  kc__body_xxh(bv, bvl) != h.body_xxh;
            free(bv);
        }
        r.checked++;
        if (bad) {
            r.bad++;
            if (repair) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_KERNELS], k, kl);
                r.purged++;
            }
        } else {
            if (nref == cap) {
                cap = cap ? 2 * cap : 1024;
                struct refc *nr = realloc(refs, cap * sizeof *refs);
                if (nr == NULL) {
                    rc = -ENOMEM;
                    break;
                }
                refs = nr;
            }
            memcpy(refs[nref].d, digest, 16);
            refs[nref].n = 1;
            nref++;
        }
        if (progress)
            progress(r.checked, total > r.checked ? total : r.checked, arg);
    }
    if (progress && rc == 0)
        progress(r.checked, r.checked, arg);
    if (kc__db_iter_err(&o->d, it) == -EBADMSG && rc == 0)
        rc = -EBADMSG;
    rocksdb_iter_destroy(it);
    if (rc == 0 && o->d.corrupt)
        rc = -EBADMSG; /* a body read hit a bad block: recover first */
    if (rc == 0 && repair) {
        /* Rebuild the refcounts from the kernels that are good, and drop
         * bodies nothing references. */
        qsort(refs, nref, sizeof *refs, cmp_refc);
        size_t m = 0;
        for (size_t i = 0; i < nref; i++) {
            if (m > 0 && memcmp(refs[m - 1].d, refs[i].d, 16) == 0)
                refs[m - 1].n++;
            else
                refs[m++] = refs[i];
        }
        nref = m;
        rocksdb_iterator_t *bi =
            rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_BODIES]);
        uint64_t unique = 0;
        for (rocksdb_iter_seek_to_first(bi); rocksdb_iter_valid(bi); rocksdb_iter_next(bi)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(bi, &kl);
            rocksdb_iter_value(bi, &vl);
            struct refc want;
            struct refc *f = NULL;
            if (kl == 16) {
                memcpy(want.d, k, 16);
                f = bsearch(&want, refs, nref, sizeof *refs, cmp_refc);
            }
            if (f == NULL) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], k, kl);
                if (kl == 16)
                    kc__ref_put(o, wb, (const unsigned char *)k, 0, 0);
            } else {
                uint64_t cnt = 0, size = 0;
                kc__ref_get(o, f->d, &cnt, &size);
                if (cnt != f->n || size != vl)
                    kc__ref_put(o, wb, f->d, f->n, vl);
                unique += vl;
            }
        }
        kc__db_iter_err(&o->d, bi);
        rocksdb_iter_destroy(bi);
        o->unique = unique;
        rc = kc__owner_write(o, wb, false);
        if (rc == 0)
            rc = kc__owner_commit(o);
    }
    if (rc == 0) {
        hot_verify(o, repair, &r);
        if (repair && kc__owner_filter_rebuild(o) == 0)
            kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    }
    rocksdb_writebatch_destroy(wb);
    free(refs);
    if (rep)
        *rep = r;
    return rc;
}
