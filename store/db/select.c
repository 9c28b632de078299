/*
 * select.c: what a bundle export selects (select.h's struct kc__sel): the
 * entries of the kernels family that match the options (namespaces, used
 * since, not too big), in kernels key order, and the cut to a size (the
 * most recently used entries first). Export (export.c) selects what it
 * writes; an import (import.c) the entries it writes hot files for.
 */
#include "parts.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

/* Buckets of one pass narrowing the cut's time. */
#define CUT_BUCKETS 4096

rocksdb_readoptions_t *kc__sel_ro(const struct kc__sel *s)
{
    return s->ro != NULL ? s->ro : s->d->ro;
}

static bool ns_wanted(const struct kc_bundle_export_opts *o, const char *ns)
{
    if (o->n_globs == 0)
        return true;
    for (size_t i = 0; i < o->n_globs; i++)
        if (fnmatch(o->globs[i], ns, 0) == 0)
            return true;
    return false;
}

int kc__sel_kcmp(const unsigned char *a, size_t al, const unsigned char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

/* Calls fn for every candidate (matching namespace, used since, decodable,
 * not too big) in kernels key order. A non-zero return stops the walk. */
int kc__sel_each(struct kc__sel *s,
                 int (*fn)(struct kc__sel *s, const struct kc__cand *c, void *arg), void *arg)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(s->d->db, kc__sel_ro(s), s->d->cf[KC__CF_KERNELS]);
    int rc = 0;
    s->too_big = 0;
    for (rocksdb_iter_seek_to_first(it); rc == 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        struct kc__cand c;
        if (kc__kkey_split((const unsigned char *)k, kl, c.ns, &c.key) != 0 ||
            kc__kval_decode(v, vl, &c.h) != 0 || !ns_wanted(s->o, c.ns))
            continue;
        c.used = c.h.last_hit_ns > c.h.created_ns ? c.h.last_hit_ns : c.h.created_ns;
        if (c.used < s->o->since_ns)
            continue;
        uint64_t ps = kc__put_file_size(strlen(c.ns), c.h.body_size);
        if (ps > KC__BUNDLE_MAX_RECORD) {
            s->too_big++;
            continue;
        }
        c.kk = (const unsigned char *)k;
        c.kl = kl;
        c.digest = kc__kval_digest(v, vl);
        c.raw = KC__BUNDLE_REC_SIZE(ps);
        c.size = s->blocks ? (ps + 4095) / 4096 * 4096 : c.raw;
        if (s->exact && c.digest != NULL) {
            /* The record carries the body as stored: its size is the
             * stored value's (an entry whose body is missing counts as
             * plain; the export then stops at it). */
            char *err = NULL;
            rocksdb_pinnableslice_t *ps_v = rocksdb_get_pinned_cf(
                s->d->db, kc__sel_ro(s), s->d->cf[KC__CF_BODIES], (const char *)c.digest, 16, &err);
            if (err != NULL) {
                rc = kc__db_err(err, "get");
            } else if (ps_v != NULL) {
                size_t sl = 0;
                rocksdb_pinnableslice_value(ps_v, &sl);
                c.size = KC__BUNDLE_REC_SIZE(kc__put_file_size(strlen(c.ns), sl));
            }
            rocksdb_pinnableslice_destroy(ps_v);
            if (rc != 0)
                break;
        }
        rc = fn(s, &c, arg);
    }
    int ie = kc__db_iter_err(s->d, it);
    rocksdb_iter_destroy(it);
    return rc != 0 ? rc : ie;
}

bool kc__sel_selected(const struct kc__sel *s, const struct kc__cand *c)
{
    if (!s->cut || c->used > s->t)
        return true;
    return c->used == s->t && s->kl > 0 && kc__sel_kcmp(c->kk, c->kl, s->k, s->kl) <= 0;
}

int kc__sel_add_total(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    struct kc__sel_total *t = arg;
    if (kc__sel_selected(s, c)) {
        t->bytes += c->size;
        t->entries++;
    }
    return 0;
}

struct narrow {
    uint64_t lo, width;
    uint64_t hi;
    uint64_t *sums;
};

static int add_bucket(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    struct narrow *n = arg;
    if (c->used >= n->lo && c->used <= n->hi)
        n->sums[(c->used - n->lo) / n->width] += c->size;
    return 0;
}

struct tie {
    uint64_t acc, budget;
    bool full;
};

static int add_tie(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    struct tie *t = arg;
    if (c->used != s->t || t->full)
        return 0;
    if (t->acc + c->size > t->budget) {
        t->full = true;
        return 0;
    }
    t->acc += c->size;
    memcpy(s->k, c->kk, c->kl);
    s->kl = c->kl;
    return 0;
}

/* Sets the cut so that the selected records take at most budget bytes:
 * the longest prefix of the entries ordered by last use (newest first),
 * then kernels key. A few passes, each narrowing the time of the first
 * entry that does not fit to one bucket of CUT_BUCKETS. */
int kc__sel_cut(struct kc__sel *s, uint64_t budget)
{
    uint64_t *sums = malloc(CUT_BUCKETS * sizeof *sums);
    if (sums == NULL)
        return -ENOMEM;
    uint64_t lo = 0, hi = UINT64_MAX, above = 0;
    int rc = 0;
    while (lo < hi) {
        struct narrow n = {.lo = lo, .hi = hi, .width = (hi - lo) / CUT_BUCKETS + 1, .sums = sums};
        memset(sums, 0, CUT_BUCKETS * sizeof *sums);
        s->cut = false;
        if ((rc = kc__sel_each(s, add_bucket, &n)) != 0)
            break;
        int b = CUT_BUCKETS - 1;
        uint64_t acc = above;
        for (; b >= 0; b--) {
            if (acc + sums[b] > budget)
                break;
            acc += sums[b];
        }
        if (b < 0) { /* cannot happen: the range holds the first entry that does not fit */
            rc = -EIO;
            break;
        }
        above = acc;
        uint64_t nlo = lo + (uint64_t)b * n.width;
        uint64_t nhi = n.width - 1 > hi - nlo ? hi : nlo + n.width - 1;
        lo = nlo;
        hi = nhi;
    }
    free(sums);
    if (rc != 0)
        return rc;
    s->cut = true;
    s->t = lo;
    s->kl = 0;
    struct tie t = {.acc = above, .budget = budget};
    return kc__sel_each(s, add_tie, &t);
}
