/*
 * drain.c: draining the spool into the primary, in rounds of up to
 * ROUND_FILES put files: each file one write batch, then one synced write
 * and the generation bump readers watch (kc__owner_commit), then the puts
 * are uploaded to the remote when one is configured (upload.c), then the
 * put files become hot files or are unlinked. Purge requests, hit logs (put.c folds them into
 * recency) and counter logs (counters.c) follow, one commit for all of them. A database that
 * reports a corruption is recovered and the drain done again by the session (owner.c).
 */
#include "jobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPOOL_FILE_MAX (1ull << 32)
#define ROUND_FILES 256

/* ---- spool listing ----------------------------------------------------- */

struct names {
    char **v;
    size_t n, cap;
};

static void names_add(struct names *s, const char *name)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            return;
        s->v = v;
        s->cap = cap;
    }
    char *d = strdup(name);
    if (d != NULL)
        s->v[s->n++] = d;
}

static void names_free(struct names *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct listing {
    struct names put, drain, purge, hits, count, stop, temp;
};

static void listing_free(struct listing *l)
{
    names_free(&l->put);
    names_free(&l->drain);
    names_free(&l->purge);
    names_free(&l->hits);
    names_free(&l->count);
    names_free(&l->stop);
    names_free(&l->temp);
}

static int list_spool(const char *spool, struct listing *l)
{
    memset(l, 0, sizeof *l);
    DIR *d = opendir(spool);
    if (d == NULL)
        return errno == ENOENT ? 0 : -errno;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (n[0] == 0 || n[1] != '-')
            continue;
        switch (n[0]) {
        case 'p':
            names_add(&l->put, n);
            break;
        case 'd':
            names_add(&l->drain, n);
            break;
        case 'x':
            names_add(&l->purge, n);
            break;
        case 'h':
            names_add(&l->hits, n);
            break;
        case 'c':
            names_add(&l->count, n);
            break;
        case 's':
            names_add(&l->stop, n);
            break;
        case 't':
            names_add(&l->temp, n);
            break;
        default:
            break;
        }
    }
    closedir(d);
    qsort(l->purge.v, l->purge.n, sizeof(char *), cmp_str);
    return 0;
}

/* ---- applying spool files ---------------------------------------------- */

/* Reads the spool file `name`: 0 with *buf (malloc'd); 1 when there is
 * nothing to apply (it is gone, or unreadable: counted bad, unlinked with
 * the round); or the error opening DIR/spool. */
static int read_spool(struct kc__owner *o, const char *name, unsigned char **buf, size_t *len)
{
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    int rc = kc__read_file(dfd, name, SPOOL_FILE_MAX, buf, len);
    close(dfd);
    if (rc == -ENOENT)
        return 1;
    if (rc < 0) {
        o->spool_bad++;
        return 1;
    }
    return 0;
}

/* Applies a put file; a bad one is counted and dropped (0). *keep: it is
 * now the entry, and may become its hot file (*size bytes). */
static int apply_put_file(struct kc__owner *o, const char *name, bool *keep, uint64_t *size)
{
    *keep = false;
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = read_spool(o, name, &buf, &len);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    struct kc__sp_put sp;
    if (kc__spool_put_decode(buf, len, &sp) != 0) {
        free(buf);
        o->spool_bad++;
        return 0; /* unlinked with the round */
    }
    *size = len;
    rc = kc__apply_put(o, &sp, keep);
    free(buf);
    return rc;
}

static int apply_purge(struct kc__owner *o, const struct kc__sp_item *it)
{
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    int rc = 0;
    if (it->flags & KC__PF_KEY) {
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(it->ns, &it->key, kk);
        char *kv = NULL;
        size_t kvl = 0;
        if (kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) == 0) {
            struct kc__hdr h;
            bool bad = kc__kval_decode(kv, kvl, &h) != 0;
            bool del = bad || h.created_ns <= it->a;
            if (!bad && del && (it->flags & KC__PF_IFBAD)) {
                /* Only a record that is bad here too is purged. */
                void *body;
                size_t blen;
                struct kc__hdr h2;
                int lr = kc__lookup(&o->d, it->ns, &it->key, &body, &blen, &h2);
                if (lr == 0)
                    free(body);
                del = lr == -EBADMSG;
            }
            if (del) {
                kc__kernel_delete(o, wb, kk, kl, kv, kvl);
                kc__filter_note_delete(&o->f);
            }
            free(kv);
        }
        /* The hot file goes with the entry; one that fails its checks goes
         * anyway; one left without an entry goes unless it is newer than
         * the request (a later put, already drained). */
        char path[PATH_MAX];
        kc__hot_path(o, it->ns, &it->key, path, sizeof path);
        unsigned char *hb = NULL;
        struct kc__sp_put hp;
        int hr = kc__put_file_read(path, it->ns, &it->key, &hb, &hp);
        bool drop = hr == -EBADMSG ||
                    (hr == 0 && !(it->flags & KC__PF_IFBAD) && hp.hdr.created_ns <= it->a);
        free(hb);
        if (drop)
            kc__hot_remove(o, it->ns, &it->key);
    }
    if (it->flags & KC__PF_SOURCE) {
        unsigned char sk[KC__NS_MAX + 1 + 16];
        size_t sl = kc__skey(it->ns, &it->source, sk);
        char *sv = NULL;
        size_t svl = 0;
        if (kc__db_get(&o->d, KC__CF_SOURCES, sk, sl, &sv, &svl) == 0) {
            unsigned char want[KC__KEY_LEN];
            kc__key_encode(&it->key, want);
            if (!(it->flags & KC__PF_KEY) || (svl == KC__KEY_LEN && !memcmp(sv, want, svl))) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_SOURCES], (char *)sk, sl);
                kc__filter_note_delete(&o->f);
            }
            free(sv);
        }
    }
    rc = kc__owner_write(o, wb, false);
    rocksdb_writebatch_destroy(wb);
    return rc;
}

/* Deletes the marks of counter logs applied over KC__META_APPLIED_KEEP_NS
 * ago: no reader still holds a listing of the spool from before they were
 * unlinked. */
static int prune_applied(struct kc__owner *o)
{
    uint64_t now = kc_wall_ns();
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_META]);
    size_t n = 0;
    for (rocksdb_iter_seek(it, KC__META_APPLIED_PREFIX, 2); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (!kc__meta_is(k, kl, KC__META_APPLIED_PREFIX))
            break;
        const char *v = rocksdb_iter_value(it, &vl);
        if (vl != 8 || kc__get_u64((const unsigned char *)v) + KC__META_APPLIED_KEEP_NS <= now ||
            kc__get_u64((const unsigned char *)v) > now + KC__META_APPLIED_KEEP_NS) {
            rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_META], k, kl);
            n++;
        }
    }
    rocksdb_iter_destroy(it);
    int rc = n > 0 ? kc__owner_write(o, wb, false) : 0;
    rocksdb_writebatch_destroy(wb);
    return rc;
}

/* Applies a purge, hit or counter file; a bad one is counted and dropped. */
static int apply_items_file(struct kc__owner *o, const char *name, int want)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = read_spool(o, name, &buf, &len);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(buf, len, &type, &p, &n) != 0 || type != want) {
        free(buf);
        o->spool_bad++;
        return 0;
    }
    const unsigned char *end = p + n;
    struct kc__sp_item it;
    int r;
    rc = 0;
    if (type == KC__SP_COUNT) {
        /* Once: a log whose mark is in the database was added up by an
         * owner killed before it unlinked the log. */
        unsigned char mk[KC__META_APPLIED_KEY_MAX];
        size_t ml = kc__meta_applied_key(name, mk);
        char *v = NULL;
        size_t vl = 0;
        if (kc__db_get(&o->d, KC__CF_META, mk, ml, &v, &vl) == 0) {
            free(v);
            free(buf);
            return 0;
        }
        struct kc__sp_item *items = NULL;
        size_t ni = 0, cap = 0;
        while ((r = kc__spool_item_next(type, &p, end, &it)) > 0) {
            /* A hit the log carries beside the counters (KC__SPI_HIT). */
            if (it.flags & KC__SPI_HIT) {
                if ((rc = kc__apply_hit(o, &it)) != 0)
                    break;
                continue;
            }
            if ((rc = kc_grow(&items, &cap, ni, sizeof *items, 8)) != 0)
                break;
            items[ni++] = it;
        }
        if (rc == 0)
            rc = kc__counts_add(o, items, ni, mk, ml);
        free(items);
        free(buf);
        return rc;
    }
    while (rc == 0 && (r = kc__spool_item_next(type, &p, end, &it)) > 0) {
        if (type == KC__SP_PURGE)
            rc = apply_purge(o, &it);
        else if (type == KC__SP_HITS)
            rc = kc__apply_hit(o, &it);
    }
    free(buf);
    return rc;
}

static void unlink_all(struct kc__owner *o, char **names, size_t n)
{
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    for (size_t i = 0; i < n; i++)
        unlinkat(dfd, names[i], 0);
    close(dfd);
}

int kc__drain_once(struct kc__owner *o, uint64_t *count)
{
    struct listing l;
    uint64_t done = 0;
    int rc = list_spool(o->p.spool, &l);
    if (rc < 0)
        return rc;
    if (l.stop.n > 0) {
        o->stop = true;
        unlink_all(o, l.stop.v, l.stop.n);
    }
    /* Puts a killed owner claimed and may not have committed: first. */
    for (size_t i = 0; rc == 0 && i < l.drain.n; i += ROUND_FILES) {
        size_t end = i + ROUND_FILES < l.drain.n ? i + ROUND_FILES : l.drain.n;
        bool keep[ROUND_FILES];
        uint64_t size[ROUND_FILES];
        for (size_t j = i; rc == 0 && j < end; j++)
            rc = apply_put_file(o, l.drain.v[j], &keep[j - i], &size[j - i]);
        if (rc == 0 && (rc = kc__owner_commit(o)) == 0) {
            kc__upload_round(o, l.drain.v + i, keep, end - i);
            kc__hot_retire_puts(o, l.drain.v + i, keep, size, end - i);
            done += end - i;
            rc = kc__dict_maybe_train(o);
        }
    }
    for (size_t i = 0; rc == 0 && i < l.put.n; i += ROUND_FILES) {
        size_t end = i + ROUND_FILES < l.put.n ? i + ROUND_FILES : l.put.n;
        size_t claimed = 0;
        char *cl[ROUND_FILES];
        bool keep[ROUND_FILES];
        uint64_t size[ROUND_FILES];
        for (size_t j = i; rc == 0 && j < end; j++) {
            char *name = l.put.v[j];
            char from[PATH_MAX], to[PATH_MAX];
            snprintf(from, sizeof from, "%s/%s", o->p.spool, name);
            name[0] = 'd';
            snprintf(to, sizeof to, "%s/%s", o->p.spool, name);
            if (rename(from, to) != 0) {
                name[0] = 'p';
                continue;
            }
            cl[claimed] = name;
            rc = apply_put_file(o, name, &keep[claimed], &size[claimed]);
            claimed++;
        }
        if (rc == 0 && claimed > 0 && (rc = kc__owner_commit(o)) == 0) {
            kc__upload_round(o, cl, keep, claimed);
            kc__hot_retire_puts(o, cl, keep, size, claimed);
            done += claimed;
            rc = kc__dict_maybe_train(o);
        }
    }
    struct names *rest[3] = {&l.purge, &l.hits, &l.count};
    const int types[3] = {KC__SP_PURGE, KC__SP_HITS, KC__SP_COUNT};
    size_t nrest = 0;
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; rc == 0 && i < rest[t]->n; i++, nrest++)
            rc = apply_items_file(o, rest[t]->v[i], types[t]);
    if (rc == 0 && nrest > 0 && (rc = kc__owner_commit(o)) == 0) {
        for (int t = 0; t < 3; t++)
            unlink_all(o, rest[t]->v, rest[t]->n);
        done += nrest;
    }
    if (rc == 0)
        rc = prune_applied(o);
    listing_free(&l);
    if (rc == 0)
        kc__upload_retry(o); /* puts the remote could not take earlier */
    kc__hot_enforce(o);      /* hit logs may have written hot files */
    if (rc == 0)
        kc__owner_filter_maybe_rebuild(o);
    if (count != NULL)
        *count = done;
    return rc;
}
