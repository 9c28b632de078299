/*
 * bundle.c: the store's side of bundles (bundle.h). Export reads the
 * database through the store's reader (a RocksDB secondary, held for the
 * whole export, so every pass sees the same entries) in a few passes over
 * the kernels family, which holds headers only: select, cut to the size
 * asked for (the most recently used entries first), count, then write each
 * entry's put record with its body as stored and its source mapping. Import
 * verifies the whole bundle first, then, as the owner, writes it into a
 * store with no entry as tables (bulk.c), or applies its records as it
 * applies drained puts (kc__apply_put_stored), in rounds of synced commits.
 */
#include "bundle.h"
#include "owner.h"

#include "../../common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Import commits every ROUND_ENTRIES records or ROUND_BYTES bytes. */
#define ROUND_ENTRIES 4096
#define ROUND_BYTES (64u << 20)
/* Buckets of one pass narrowing the cut's time. */
#define CUT_BUCKETS 4096

static int why(struct kc_bundle_info *info, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int why(struct kc_bundle_info *info, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->why, sizeof info->why, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- export: selection ---------------------------------------------------- */

struct cand {
    char ns[KC__NS_MAX + 1];
    kc_key key;
    const unsigned char *kk; /* kernels key */
    size_t kl;
    struct kc__hdr h;
    const unsigned char *digest;
    uint64_t used; /* last used (ns) */
    uint64_t size; /* what it takes: bytes in the bundle (blocks: on disk) */
    uint64_t raw;  /* its record with its body inflated (the header's count) */
};

struct sel {
    const struct kc_bundle_export_opts *o;
    struct kc__db *d;
    bool blocks; /* sizes in 4 KiB blocks (hot files), not bundle bytes */
    bool exact;  /* sizes as the bodies are stored (a read of each body) */
    /* The reads' options (NULL: d's). An export's skip RocksDB's block
     * checksums: each body is checked against its digest instead (a
     * check from the key to the bytes, the one import makes). */
    rocksdb_readoptions_t *ro;
    /* The cut: entries used after t, and at t those up to kkey k. */
    bool cut;
    uint64_t t;
    unsigned char k[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl; /* 0: none at t */
    uint64_t too_big;
};

static rocksdb_readoptions_t *sel_ro(const struct sel *s)
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

static int kcmp(const unsigned char *a, size_t al, const unsigned char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

/* Calls fn for every candidate (matching namespace, used since, decodable,
 * not too big) in kernels key order. A non-zero return stops the walk. */
static int each_cand(struct sel *s, int (*fn)(struct sel *s, const struct cand *c, void *arg),
                     void *arg)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(s->d->db, sel_ro(s), s->d->cf[KC__CF_KERNELS]);
    int rc = 0;
    s->too_big = 0;
    for (rocksdb_iter_seek_to_first(it); rc == 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        struct cand c;
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
                s->d->db, sel_ro(s), s->d->cf[KC__CF_BODIES], (const char *)c.digest, 16, &err);
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

static bool selected(const struct sel *s, const struct cand *c)
{
    if (!s->cut || c->used > s->t)
        return true;
    return c->used == s->t && s->kl > 0 && kcmp(c->kk, c->kl, s->k, s->kl) <= 0;
}

struct total {
    uint64_t bytes, entries;
};

static int add_total(struct sel *s, const struct cand *c, void *arg)
{
    struct total *t = arg;
    if (selected(s, c)) {
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

static int add_bucket(struct sel *s, const struct cand *c, void *arg)
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

static int add_tie(struct sel *s, const struct cand *c, void *arg)
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
static int find_cut(struct sel *s, uint64_t budget)
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
        if ((rc = each_cand(s, add_bucket, &n)) != 0)
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
    return each_cand(s, add_tie, &t);
}

/* ---- export: namespaces, dictionaries and writing ---------------------------- */

/* The store's dictionaries ("z/"), for the bundle's header: all of them
 * (a few per GiB of bodies; which ones the selected entries name would
 * take a read of every body before the header). */
struct dictlist {
    struct kc__bundle_dict *v;
    size_t n;
    char **bytes;
};

static void dicts_free(struct dictlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->bytes[i]);
    free(l->bytes);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int dicts_collect(struct kc__db *d, struct dictlist *l)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_META]);
    int rc = 0;
    size_t cap = 0;
    for (rocksdb_iter_seek(it, KC__META_DICT_PREFIX, 2); rc == 0 && rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (!kc__meta_is(k, kl, KC__META_DICT_PREFIX))
            break;
        const char *v = rocksdb_iter_value(it, &vl);
        uint64_t id = kl == KC__META_DICT_KEY_LEN ? kc_le_get_u64((const unsigned char *)k + 2) : 0;
        if (id == 0 || vl == 0 || vl > KC__BUNDLE_MAX_DICT || kc__dict_id(v, vl) != id)
            continue; /* not one (a body naming it is a miss, and refused by import) */
        if (l->n == cap) {
            cap = cap ? 2 * cap : 8;
            void *nv = realloc(l->v, cap * sizeof *l->v),
                 *nb = realloc(l->bytes, cap * sizeof *l->bytes);
            if (nv != NULL)
                l->v = nv;
            if (nb != NULL)
                l->bytes = nb;
            if (nv == NULL || nb == NULL) {
                rc = -ENOMEM;
                break;
            }
        }
        l->bytes[l->n] = malloc(vl);
        if (l->bytes[l->n] == NULL) {
            rc = -ENOMEM;
            break;
        }
        memcpy(l->bytes[l->n], v, vl);
        l->v[l->n] = (struct kc__bundle_dict){.id = id, .p = l->bytes[l->n], .len = vl};
        l->n++;
    }
    int ie = kc__db_iter_err(d, it);
    rocksdb_iter_destroy(it);
    return rc != 0 ? rc : ie;
}

struct nslist {
    struct kc_bundle_info *info;
    size_t cap;
    int err;
    struct kc__nsindex index;
};

static struct kc_bundle_ns *ns_get(struct nslist *l, const char *ns)
{
    struct kc_bundle_info *info = l->info;
    if (info->n_ns > 0 && strcmp(info->ns[info->n_ns - 1].ns, ns) == 0)
        return &info->ns[info->n_ns - 1];
    size_t i = kc__nsindex_find(&l->index, info->ns, ns);
    if (i != SIZE_MAX)
        return &info->ns[i];
    if (info->n_ns == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        struct kc_bundle_ns *v = realloc(info->ns, cap * sizeof *v);
        if (v == NULL) {
            l->err = -ENOMEM;
            return NULL;
        }
        info->ns = v;
        l->cap = cap;
    }
    struct kc_bundle_ns *e = &info->ns[info->n_ns];
    memset(e, 0, sizeof *e);
    snprintf(e->ns, sizeof e->ns, "%s", ns);
    e->usable = -1;
    if (kc__nsindex_add(&l->index, info->ns, info->n_ns) != 0) {
        l->err = -ENOMEM;
        return NULL;
    }
    info->n_ns++;
    return e;
}

static int add_ns(struct sel *s, const struct cand *c, void *arg)
{
    struct nslist *l = arg;
    if (!selected(s, c))
        return 0;
    struct kc_bundle_ns *e = ns_get(l, c->ns);
    if (e == NULL)
        return l->err;
    e->entries++;
    e->raw_bytes += c->raw;
    l->info->entries++;
    l->info->raw_bytes += c->raw;
    return 0;
}

struct emit {
    struct kc__bundle_writer w;
    struct kc_bundle_info *info;
    uint64_t done;
    rocksdb_iterator_t *sources; /* own_source's walk */
    bool sources_started;
};

/* The source mapping to carry with an entry: the one the store has under
 * the entry's own id (an NVRTC result is recorded as its source), when it
 * names this entry. Entries come in kernels key order (ns \0 id.lo id.hi
 * build, little-endian) and their source keys (ns \0 id.lo id.hi) sort the
 * same way, so one iterator over the sources family walks forward beside
 * them (a merge join: no lookup per entry). */
static bool own_source(struct emit *e, const struct cand *c, kc_digest *src)
{
    unsigned char sk[KC__NS_MAX + 1 + 16];
    size_t sl = kc__skey(c->ns, &c->key.id, sk);
    rocksdb_iterator_t *it = e->sources;
    if (!e->sources_started) {
        rocksdb_iter_seek(it, (const char *)sk, sl);
        e->sources_started = true;
    }
    int cmp = 1;
    while (rocksdb_iter_valid(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        cmp = kcmp((const unsigned char *)k, kl, sk, sl);
        if (cmp >= 0)
            break;
        rocksdb_iter_next(it);
    }
    bool mine = false;
    if (cmp == 0 && rocksdb_iter_valid(it)) {
        size_t vl;
        const char *v = rocksdb_iter_value(it, &vl);
        if (vl == KC__KEY_LEN) {
            kc_key k;
            kc__key_decode((const unsigned char *)v, &k);
            mine = k.id.lo == c->key.id.lo && k.id.hi == c->key.id.hi && k.build == c->key.build;
        }
    }
    *src = c->key.id;
    return mine;
}

/* Writes one entry: its body as the store keeps it (an 'S' put, the bytes
 * on disk: nothing is inflated or compressed again; the importer inflates
 * and checks every one), or plain (a 'P' put) for a body an earlier
 * version stored as it is. */
static int emit_one(struct sel *s, const struct cand *c, struct emit *e, const kc_digest *src)
{
    const char *v = NULL;
    size_t vl = 0;
    uint64_t raw = 0;
    int codec = 0;
    /* Pinned: the value as RocksDB holds it (with mmap reads, the mapped
     * table itself), copied once, into the put. */
    char *err = NULL;
    rocksdb_pinnableslice_t *pv =
        c->digest != NULL ? rocksdb_get_pinned_cf(s->d->db, sel_ro(s), s->d->cf[KC__CF_BODIES],
                                                  (const char *)c->digest, 16, &err)
                          : NULL;
    int rc = c->digest == NULL ? -EBADMSG
             : err != NULL     ? kc__db_err(err, "get")
             : pv == NULL      ? -ENOENT
                               : 0;
    if (rc == 0)
        v = rocksdb_pinnableslice_value(pv, &vl);
    kc_digest bd = {0};
    if (c->digest != NULL)
        kc__digest_decode(c->digest, &bd);
    if (rc == 0) {
        kc_digest got = kc_digest_of(v, vl);
        if (got.lo != bd.lo || got.hi != bd.hi)
            rc = -EBADMSG; /* not the bytes its key names */
    }
    if (rc == 0 && (kc__body_info(v, vl, &raw, &codec, NULL) != 0 || raw != c->h.body_size ||
                    (codec == KC__BODY_LEGACY && kc__body_xxh(v, vl) != c->h.body_xxh)))
        rc = -EBADMSG;
    if (rc < 0) {
        rocksdb_pinnableslice_destroy(pv);
        return why(
            e->info, rc == -ENOENT ? -EBADMSG : rc,
            "an entry of %s is damaged in the store (%s); run kcache verify and export again",
            c->ns, strerror(rc == -ENOENT ? EBADMSG : -rc));
    }
    rc = kc__bundle_writer_add_entry(&e->w, c->ns, &c->key, src, &c->h, &bd, v, vl,
                                     codec != KC__BODY_LEGACY ? KC__SP_STORED : KC__SP_PUT);
    rocksdb_pinnableslice_destroy(pv);
    if (rc < 0)
        return why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    e->done++;
    return 0;
}

static int emit_cand(struct sel *s, const struct cand *c, void *arg)
{
    if (!selected(s, c))
        return 0;
    kc_digest src;
    bool has = own_source(arg, c, &src);
    return emit_one(s, c, arg, has ? &src : NULL);
}

/* A whole store's export (layout 3): every body once, in the bodies
 * family's order (one sequential read of its tables, no lookup per body),
 * each checked against its digest, then the entries naming them ('E'
 * puts). Bodies nothing names go too (the importer writes none of them). */
static int emit_bodies(struct sel *s, struct emit *e)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(s->d->db, sel_ro(s), s->d->cf[KC__CF_BODIES]);
    int rc = 0;
    for (rocksdb_iter_seek_to_first(it); rc == 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        kc_digest want, got = kc_digest_of(v, vl);
        uint64_t raw;
        int codec;
        if (kl != 16)
            continue;
        kc__digest_decode((const unsigned char *)k, &want);
        if (got.lo != want.lo || got.hi != want.hi ||
            kc__body_info(v, vl, &raw, &codec, NULL) != 0) {
            rc = why(e->info, -EBADMSG,
                     "a body is damaged in the store; run kcache verify and export again");
            break;
        }
        rc = kc__bundle_writer_add_body(&e->w, &want, v, vl);
        if (rc < 0)
            why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    }
    int ie = kc__db_iter_err(s->d, it);
    rocksdb_iter_destroy(it);
    return rc != 0 ? rc : ie;
}

static int emit_entry_cand(struct sel *s, const struct cand *c, void *arg)
{
    struct emit *e = arg;
    if (!selected(s, c))
        return 0;
    if (c->digest == NULL)
        return why(e->info, -EBADMSG,
                   "an entry of %s is damaged in the store; run kcache verify and export again",
                   c->ns);
    kc_digest src, bd;
    bool has = own_source(e, c, &src);
    kc__digest_decode(c->digest, &bd);
    int rc = kc__bundle_writer_add_entry(&e->w, c->ns, &c->key, has ? &src : NULL, &c->h, &bd, NULL,
                                         0, KC__SP_ENTRY);
    if (rc < 0)
        return why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    e->done++;
    return 0;
}

int kc__bundle_export(struct kc_store *st, const struct kc_bundle_export_opts *o,
                      struct kc_bundle_info *info)
{
    memset(info, 0, sizeof *info);
    if (st == NULL || o == NULL || o->fd < 0)
        return why(info, -EINVAL, "invalid arguments");
    info->version = KC__BUNDLE_VERSION;
    info->format = KC_FORMAT_VERSION;
    info->created_ns = kc_wall_ns();
    const struct kc_bundle_crypto *crypto =
        o->crypto != NULL && o->crypto->key_id != 0 ? o->crypto : NULL;
    info->key_id = crypto != NULL ? crypto->key_id : 0;
    info->is_signed = crypto != NULL;
    if (crypto != NULL && (crypto->digest_begin == NULL || crypto->digest_add == NULL ||
                           crypto->digest_end == NULL || crypto->sign == NULL))
        return why(info, -EINVAL, "invalid arguments (signing hooks)");

    struct kc__db *d = NULL;
    int hold = kc__store_reader_hold(st, &d);
    if (hold < 0 && hold != -ENOENT)
        return why(info, hold, "cannot read the store: %s", strerror(-hold));
    bool have = hold == 0;
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(ro, 0);
    struct sel s = {.o = o, .d = d, .exact = o->max_size > 0, .ro = ro};
    struct nslist l = {.info = info};
    struct dictlist dl = {0};
    int rc = have ? dicts_collect(d, &dl) : 0;
    if (have && rc == 0) {
        if (o->max_size > 0) {
            struct total all = {0};
            rc = each_cand(&s, add_total, &all);
            /* Everything a bundle of these entries holds but its records:
             * the header (its namespaces counted before the cut: an upper
             * bound, the text's numbers only shrink), the trailer and one
             * block header per KC__BUNDLE_BLOCK_TARGET bytes and one more. */
            if (rc == 0)
                rc = each_cand(&s, add_ns, &l);
            uint64_t fixed = kc__bundle_header_size(info, o->codec, dl.v, dl.n) +
                             KC__BUNDLE_TRAILER + KC__BUNDLE_BLOCK_HDR;
            free(info->ns);
            info->ns = NULL;
            info->n_ns = 0;
            l.cap = 0;
            kc__nsindex_free(&l.index);
            info->entries = info->raw_bytes = 0;
            if (rc == 0 && o->max_size < fixed + KC__BUNDLE_BLOCK_HDR) {
                rc = why(info, -ENOSPC, "--max-size %" PRIu64 " is smaller than an empty bundle",
                         o->max_size);
            } else if (rc == 0) {
                uint64_t avail = o->max_size - fixed;
                uint64_t budget = (uint64_t)((double)avail * KC__BUNDLE_BLOCK_TARGET /
                                             (KC__BUNDLE_BLOCK_TARGET + KC__BUNDLE_BLOCK_HDR));
                while (budget > 0 &&
                       budget + KC__BUNDLE_BLOCK_HDR * (budget / KC__BUNDLE_BLOCK_TARGET) > avail)
                    budget--;
                if (all.bytes > budget)
                    rc = find_cut(&s, budget);
            }
        }
        s.exact = false; /* the cut is made: what follows needs no stored size */
        if (rc == 0)
            rc = each_cand(&s, add_ns, &l);
    }
    kc__nsindex_free(&l.index);
    if (rc != 0) {
        if (have)
            kc__store_reader_release(st);
        dicts_free(&dl);
        rocksdb_readoptions_destroy(ro);
        return info->why[0] ? rc : why(info, rc, "cannot read the store: %s", strerror(-rc));
    }
    if (s.too_big > 0)
        kc_log(KC_LOG_WARN, "export: %" PRIu64 " entries over %llu bytes are left out", s.too_big,
               (unsigned long long)KC__BUNDLE_MAX_RECORD);

    struct emit e = {.info = info};
    rc = kc__bundle_writer_begin(&e.w, o->fd, info, o->codec, o->level, crypto, dl.v, dl.n);
    if (rc < 0)
        why(info, rc, "cannot write the bundle: %s", strerror(-rc));
    if (rc == 0 && have) {
        e.sources = rocksdb_create_iterator_cf(d->db, sel_ro(&s), d->cf[KC__CF_SOURCES]);
        /* The whole store: bodies in table order, then the entries. */
        bool whole = o->n_globs == 0 && o->since_ns == 0 && o->max_size == 0;
        if (whole)
            rc = emit_bodies(&s, &e);
        if (rc == 0)
            rc = each_cand(&s, whole ? emit_entry_cand : emit_cand, &e);
        int ie = kc__db_iter_err(d, e.sources);
        rocksdb_iter_destroy(e.sources);
        if (rc == 0 && ie != 0)
            rc = why(info, ie, "cannot read the store: %s", strerror(-ie));
    }
    if (have)
        kc__store_reader_release(st);
    if (rc == 0 && e.done != info->entries)
        rc = why(info, -EIO, "the store changed during the export");
    if (rc == 0) {
        rc = kc__bundle_writer_finish(&e.w, &info->file_bytes);
        if (rc < 0)
            why(info, rc, "cannot write the bundle: %s", strerror(-rc));
    }
    info->blocks = e.w.blocks;
    kc__bundle_writer_free(&e.w);
    dicts_free(&dl);
    rocksdb_readoptions_destroy(ro);
    if (rc < 0 && info->why[0] == '\0')
        why(info, rc, "cannot read the store: %s", strerror(-rc));
    info->verified = rc == 0;
    return rc;
}

/* ---- import ------------------------------------------------------------------ */

/* An empty private file for a copy of the bundle (a pipe, or a file others
 * may change between the passes): unlinked, in $TMPDIR (or /tmp), 0600.
 * The first pass writes into it what it reads (kc__bstream's copy_fd), so
 * nothing is copied past the first byte that fails a check: /dev/zero or an
 * endless pipe stops at the header. */
static int private_copy(struct kc_bundle_info *info, int *out)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/')
        tmp = "/tmp";
    int c = open(tmp, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (c < 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/kcache-bundle-XXXXXX", tmp);
        c = mkostemp(path, O_CLOEXEC);
        if (c < 0)
            return why(info, -errno, "cannot make a private copy of the bundle in %s: %s", tmp,
                       strerror(errno));
        unlink(path);
    }
    *out = c;
    return 0;
}

/* `bundle show`: the header, and the trailer when fd can be seeked. */
static int show(const struct kc_bundle_import_opts *o, struct kc_bundle_info *info)
{
    struct kc__bundle_reader r;
    int rc = kc__bundle_reader_begin(&r, o->fd, NULL, 0, info, o->crypto, true);
    kc__bundle_reader_free(&r);
    if (rc < 0)
        return rc;
    struct stat sb;
    if (fstat(o->fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= KC__BUNDLE_TRAILER) {
        unsigned char t[KC__BUNDLE_TRAILER];
        struct kc_bundle_info ti = {0};
        if (pread(o->fd, t, sizeof t, sb.st_size - KC__BUNDLE_TRAILER) == (ssize_t)sizeof t &&
            kc__bundle_trailer_peek(t, &ti) == 0 && ti.key_id == info->key_id) {
            info->trailer_seen = 1;
            info->blocks = ti.blocks;
        }
        info->file_bytes = (uint64_t)sb.st_size;
    }
    return 0;
}

/* Pass 1: reads and checks all of it (copying what it reads to copy_fd,
 * when not -1); counts what is present already. */
static int verify_pass(struct kc_store *st, const struct kc_bundle_import_opts *o, int fd,
                       int copy_fd, struct kc_bundle_info *info)
{
    struct kc__bundle_reader r;
    int rc = kc__bundle_reader_begin_copy(&r, fd, copy_fd, info, o->crypto, o->trust_unsigned != 0);
    if (rc < 0 && r.s.copy_err != 0)
        rc = why(info, r.s.copy_err, "cannot copy the bundle to a private file: %s",
                 strerror(-r.s.copy_err));
    /* A dry run (the command that checks a bundle) inflates every body; an
     * import checks each against its digest and its frame's stated size,
     * and every get inflates and checks a body before it is served. */
    r.check_bodies = o->dry_run != 0;
    struct kc__db *d = NULL;
    bool have = rc == 0 && st != NULL && o->dry_run && kc__store_reader_hold(st, &d) == 0;
    for (size_t i = 0; rc == 0 && i < info->n_ns; i++)
        info->ns[i].usable = o->usable != NULL ? o->usable(info->ns[i].ns, o->usable_arg) : -1;
    while (rc == 0) {
        struct kc__sp_put sp;
        size_t idx;
        int n = kc__bundle_reader_next(&r, &sp, NULL, NULL, &idx);
        if (n <= 0) {
            rc = n;
            if (rc < 0 && r.s.copy_err != 0)
                rc = why(info, r.s.copy_err, "cannot copy the bundle to a private file: %s",
                         strerror(-r.s.copy_err));
            break;
        }
        struct kc_bundle_ns *e = &info->ns[idx];
        if (o->only_usable && e->usable == 0) {
            e->skipped++;
            continue;
        }
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(sp.ns, &sp.key, kk);
        char *v = NULL;
        size_t vl = 0;
        if (have && kc__db_get(d, KC__CF_KERNELS, kk, kl, &v, &vl) == 0) {
            free(v);
            e->present++;
        } else {
            e->imported++;
        }
    }
    if (have)
        kc__store_reader_release(st);
    kc__bundle_reader_free(&r);
    return rc;
}

static int touch_cand(struct sel *s, const struct cand *c, void *arg)
{
    if (selected(s, c))
        kc__hot_touch(arg, c->ns, &c->key);
    return 0;
}

/* After an import: hot files (a host's hits without RocksDB) for the most
 * recently used entries, as many as DIR/hot's bound now holds (it follows
 * the tables' size), as if they had just been drained. A store warmed from
 * a bundle then serves its first hits as one warmed by compiling does. */
static void import_hot(struct kc__owner *ow)
{
    if (kc__db_flush_all(&ow->d) != 0)
        return;
    ow->hot_max = kc__hot_limit(ow);
    uint64_t target = ow->hot_max / 10 * 9;
    if (ow->hot_max == 0 || ow->hot_bytes >= target)
        return;
    struct kc_bundle_export_opts all = {.fd = -1};
    struct sel s = {.o = &all, .d = &ow->d, .blocks = true};
    struct total t = {0};
    if (each_cand(&s, add_total, &t) != 0)
        return;
    if (t.bytes > target - ow->hot_bytes && find_cut(&s, target - ow->hot_bytes) != 0)
        return;
    each_cand(&s, touch_cand, ow);
    kc__hot_enforce(ow);
}

/* The bundle's dictionaries into the store, synced before any body naming
 * one is written; the store's own current one stays (or, when it has none,
 * the bundle's last becomes it). */
static int import_dicts(struct kc__owner *ow, int fd, const struct kc_bundle_import_opts *o,
                        struct kc_bundle_info *info)
{
    if (lseek(fd, 0, SEEK_SET) != 0)
        return why(info, -errno, "cannot read the bundle again: %s", strerror(errno));
    struct kc_bundle_info hi;
    struct kc__bundle_reader r;
    int rc = kc__bundle_reader_begin(&r, fd, NULL, 0, &hi, o->crypto, o->trust_unsigned != 0);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    size_t added = 0;
    for (size_t i = 0; rc == 0 && i < r.n_dicts; i++) {
        unsigned char k[KC__META_DICT_KEY_LEN];
        size_t kl = kc__meta_dict_key(r.dict[i].id, k);
        char *v = NULL;
        size_t vl = 0;
        int g = kc__db_get(&ow->d, KC__CF_META, k, kl, &v, &vl);
        free(v);
        if (g == -ENOENT) {
            rocksdb_writebatch_put_cf(wb, ow->d.cf[KC__CF_META], (char *)k, kl,
                                      (char *)r.dict_data + r.dict[i].off, r.dict[i].len);
            added++;
        } else if (g < 0) {
            rc = g;
        }
    }
    char *cur = NULL;
    size_t cl = 0;
    if (rc == 0 && r.n_dicts > 0 &&
        kc__db_get(&ow->d, KC__CF_META, KC__META_DICT_CURRENT, 2, &cur, &cl) == -ENOENT) {
        unsigned char id[8];
        kc_le_put_u64(id, r.dict[r.n_dicts - 1].id);
        rocksdb_writebatch_put_cf(wb, ow->d.cf[KC__CF_META], KC__META_DICT_CURRENT, 2, (char *)id,
                                  sizeof id);
        added++;
    }
    free(cur);
    if (rc == 0 && added > 0 && (rc = kc__owner_write(ow, wb, true)) == 0)
        kc__dict_load(ow);
    rocksdb_writebatch_destroy(wb);
    free(hi.ns);
    kc__bundle_reader_free(&r);
    if (rc < 0 && info->why[0] == '\0')
        why(info, rc, "cannot write to the store: %s", strerror(-rc));
    if (rc == 0 && lseek(fd, 0, SEEK_SET) != 0)
        rc = why(info, -errno, "cannot read the bundle again: %s", strerror(errno));
    return rc;
}

/* Pass 2: applies every record the store lacks, as the owner. */
static int import_pass(struct kc_store *st, const struct kc_bundle_import_opts *o, int fd,
                       struct kc_bundle_info *info)
{
    struct kc__owner *ow;
    int rc = kc__store_as_owner(st, &ow);
    if (rc < 0)
        return why(info, rc, "cannot become the store's owner: %s",
                   rc == -EBUSY ? "another kcache operation holds it" : strerror(-rc));
    /* Its dictionaries first; into a store with no entry, the entries as
     * tables, ingested whole (bulk.c). */
    bool hot_done = false;
    int bulk = 0;
    rc = import_dicts(ow, fd, o, info);
    if (rc == 0)
        bulk = kc__bulk_import(ow, fd, o, info, &hot_done);
    if (rc < 0) {
        kc__store_end_owner(st, ow);
        return rc;
    }
    if (bulk != 0 || lseek(fd, 0, SEEK_SET) != 0) {
        rc = bulk < 0 ? bulk : bulk > 0 ? 0 : why(info, -errno, "cannot read the bundle again");
        goto done;
    }
    struct kc_bundle_info again;
    struct kc__bundle_reader r;
    rc = kc__bundle_reader_begin(&r, fd, NULL, 0, &again, o->crypto, o->trust_unsigned != 0);
    /* The first reading checked every body; the bytes are the same (a
     * private file), and their digests are checked again. */
    struct kc__buf body = {0};
    uint64_t round_n = 0, round_bytes = 0;
    while (rc == 0) {
        struct kc__sp_put sp;
        size_t idx, len;
        const unsigned char *put;
        int n = kc__bundle_reader_next(&r, &sp, &put, &len, &idx);
        if (n <= 0) {
            rc = n;
            break;
        }
        if (idx >= info->n_ns || strcmp(info->ns[idx].ns, sp.ns) != 0) {
            rc = why(info, -EIO, "the bundle changed between its two readings");
            break;
        }
        struct kc_bundle_ns *e = &info->ns[idx];
        if (o->only_usable && e->usable == 0) {
            e->skipped++;
            continue;
        }
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(sp.ns, &sp.key, kk);
        char *v = NULL;
        size_t vl = 0;
        int g = kc__db_get(&ow->d, KC__CF_KERNELS, kk, kl, &v, &vl);
        free(v);
        if (g == 0) {
            e->present++;
            continue;
        }
        bool applied = false;
        if (r.entry_detached) {
            /* Its body is a body record read before: from the file (the
             * same private bytes, checked then). */
            rc = kc_buf_reserve(&body, r.entry_stored_len);
            if (rc == 0 && pread(fd, body.p, r.entry_stored_len, (off_t)r.entry_stored_at) !=
                               (ssize_t)r.entry_stored_len)
                rc = -EIO;
            if (rc == 0 &&
                kc_digest_of(body.p, r.entry_stored_len).lo != kc__get_u64(r.entry_digest))
                rc = -EIO;
            if (rc < 0) {
                why(info, rc, "the bundle changed between its readings");
                break;
            }
            rc =
                kc__apply_put_stored(ow, &sp, r.entry_digest, body.p, r.entry_stored_len, &applied);
        } else {
            rc = r.entry_stored != NULL
                     ? kc__apply_put_stored(ow, &sp, r.entry_digest, r.entry_stored,
                                            r.entry_stored_len, &applied)
                     : kc__apply_put(ow, &sp, &applied);
        }
        if (rc < 0) {
            why(info, rc, "cannot write to the store: %s", strerror(-rc));
            break;
        }
        e->imported += applied;
        round_bytes += len;
        if (++round_n >= ROUND_ENTRIES || round_bytes >= ROUND_BYTES) {
            if ((rc = kc__owner_commit(ow)) < 0) {
                why(info, rc, "cannot write to the store: %s", strerror(-rc));
                break;
            }
            round_n = round_bytes = 0;
        }
    }
    if (rc < 0 && info->why[0] == '\0')
        snprintf(info->why, sizeof info->why, "%s", again.why);
    kc__buf_free(&body);
    free(again.ns);
    kc__bundle_reader_free(&r);
done:;
    int crc = kc__owner_commit(ow);
    if (rc == 0 && crc < 0)
        rc = why(info, crc, "cannot write to the store: %s", strerror(-crc));
    if (rc == 0) {
        kc__enforce_limit(ow);
        if (ow->f.map != NULL && kc__filter_stale(&ow->f) && kc__owner_filter_rebuild(ow) == 0)
            kc__filter_set_stamp(&ow->f, KC__FILTER_LIVE);
        if (!hot_done)
            import_hot(ow);
    }
    kc__store_end_owner(st, ow);
    return rc;
}

int kc__bundle_import(struct kc_store *st, const struct kc_bundle_import_opts *o,
                      struct kc_bundle_info *info)
{
    memset(info, 0, sizeof *info);
    if (o == NULL || o->fd < 0)
        return why(info, -EINVAL, "invalid arguments");
    if (o->header_only)
        return show(o, info);
    /* Two readings of the same bytes: the file's, when it is a regular file
     * only this user (or root) can change; else a private copy's, made by
     * the first reading (a dry run reads once and copies nothing). */
    struct stat sb;
    int fd = o->fd, copy = -1;
    if (fstat(fd, &sb) != 0)
        return why(info, -errno, "cannot read the bundle: %s", strerror(errno));
    bool private = S_ISREG(sb.st_mode) && (sb.st_uid == geteuid() || sb.st_uid == 0) &&
                   (sb.st_mode & 022) == 0 && lseek(fd, 0, SEEK_CUR) == 0;
    bool second = st != NULL && !o->dry_run;
    int rc = 0;
    if (private && lseek(fd, 0, SEEK_SET) != 0)
        rc = why(info, -errno, "cannot read the bundle: %s", strerror(errno));
    if (rc == 0 && !private && second)
        rc = private_copy(info, &copy);
    if (rc == 0)
        rc = verify_pass(st, o, fd, copy, info);
    if (copy >= 0)
        fd = copy;
    if (rc == 0 && second) {
        for (size_t i = 0; i < info->n_ns; i++)
            info->ns[i].imported = info->ns[i].present = info->ns[i].skipped = 0;
        rc = lseek(fd, 0, SEEK_SET) == 0 ? 0 : -errno;
        if (rc < 0)
            why(info, rc, "cannot read the bundle: %s", strerror(-rc));
        else
            rc = import_pass(st, o, fd, info);
    }
    if (copy >= 0)
        close(copy);
    return rc;
}
