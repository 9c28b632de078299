/*
 * export.c: a bundle written from the store (bundle.h). It reads the
 * database through the store's reader (a RocksDB secondary, held for the
 * whole export, so every pass sees the same entries) in a few passes over
 * the kernels family, which holds headers only: select, cut to the size
 * asked for (the most recently used entries first; select.c), count, then
 * write each entry's put record with its body as stored and its source
 * mapping (the stream: bundle_io.c).
 */
#include "jobs.h"

#include "../../common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int add_ns(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    struct nslist *l = arg;
    if (!kc__sel_selected(s, c))
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
    const struct kc_bundle_export_opts *o;
    uint64_t done;
    uint64_t bodies, bodies_total; /* a whole store's: added, and to write */
    uint64_t stage_first;          /* the writer's records before the stage */
    uint64_t stage_total;          /* the stage's count to reach */
    rocksdb_iterator_t *sources;   /* own_source's walk */
    bool sources_started;
};

static void progress(const struct emit *e, uint64_t done, uint64_t total)
{
    if (e->o->progress != NULL)
        e->o->progress(done, total, e->o->progress_arg);
}

static void stage(struct emit *e, const char *name, uint64_t total)
{
    e->stage_first = kc__bundle_writer_written(&e->w);
    e->stage_total = total;
    if (e->o->progress_stage != NULL)
        e->o->progress_stage(name, e->o->progress_arg);
}

/* The stage's progress: its records whose bytes were written (to a slow
 * reader, what it was given), short of its total until the stage's last
 * byte is written (its end reports the total). */
static void written(void *arg)
{
    struct emit *e = arg;
    if (e->o->progress == NULL)
        return;
    uint64_t w = kc__bundle_writer_written(&e->w) - e->stage_first;
    if (w >= e->stage_total)
        w = e->stage_total > 0 ? e->stage_total - 1 : 0;
    progress(e, w, e->stage_total);
}

/* How many bodies the store holds: its refcounts (one per body), for a
 * whole store's progress (a body nothing names, which goes too, is one
 * more; the stage's last call says what was written). */
static uint64_t count_bodies(struct kc__sel *s)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(s->d->db, kc__sel_ro(s), s->d->cf[KC__CF_META]);
    uint64_t n = 0;
    for (rocksdb_iter_seek(it, KC__META_REF_PREFIX, 2); rocksdb_iter_valid(it);
         rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (!kc__meta_is(k, kl, KC__META_REF_PREFIX))
            break;
        n++;
    }
    rocksdb_iter_destroy(it);
    return n;
}

/* The source mapping to carry with an entry: the one the store has under
 * the entry's own id (an NVRTC result is recorded as its source), when it
 * names this entry. Entries come in kernels key order (ns \0 id.lo id.hi
 * build, little-endian) and their source keys (ns \0 id.lo id.hi) sort the
 * same way, so one iterator over the sources family walks forward beside
 * them (a merge join: no lookup per entry). */
static bool own_source(struct emit *e, const struct kc__cand *c, kc_digest *src)
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
        cmp = kc__sel_kcmp((const unsigned char *)k, kl, sk, sl);
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
static int emit_one(struct kc__sel *s, const struct kc__cand *c, struct emit *e,
                    const kc_digest *src)
{
    const char *v = NULL;
    size_t vl = 0;
    uint64_t raw = 0;
    int codec = 0;
    /* Pinned: the value as RocksDB holds it (with mmap reads, the mapped
     * table itself), copied once, into the put. */
    char *err = NULL;
    rocksdb_pinnableslice_t *pv =
        c->digest != NULL ? rocksdb_get_pinned_cf(s->d->db, kc__sel_ro(s), s->d->cf[KC__CF_BODIES],
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
        return kc__bundle_why(
            e->info, rc == -ENOENT ? -EBADMSG : rc,
            "an entry of %s is damaged in the store (%s); run kcache verify and export again",
            c->ns, strerror(rc == -ENOENT ? EBADMSG : -rc));
    }
    rc = kc__bundle_writer_add_entry(&e->w, c->ns, &c->key, src, &c->h, &bd, v, vl,
                                     codec != KC__BODY_LEGACY ? KC__SP_STORED : KC__SP_PUT);
    rocksdb_pinnableslice_destroy(pv);
    if (rc < 0)
        return kc__bundle_why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    e->done++;
    written(e);
    return 0;
}

static int emit_cand(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    if (!kc__sel_selected(s, c))
        return 0;
    kc_digest src;
    bool has = own_source(arg, c, &src);
    return emit_one(s, c, arg, has ? &src : NULL);
}

/* A whole store's export (layout 3): every body once, in the bodies
 * family's order (one sequential read of its tables, no lookup per body),
 * each checked against its digest, then the entries naming them ('E'
 * puts). Bodies nothing names go too (the importer writes none of them). */
static int emit_bodies(struct kc__sel *s, struct emit *e)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(s->d->db, kc__sel_ro(s), s->d->cf[KC__CF_BODIES]);
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
            rc = kc__bundle_why(
                e->info, -EBADMSG,
                "a body is damaged in the store; run kcache verify and export again");
            break;
        }
        rc = kc__bundle_writer_add_body(&e->w, &want, v, vl);
        if (rc < 0)
            kc__bundle_why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
        else if (++e->bodies <= e->bodies_total)
            written(e);
    }
    /* The stage ends once its bytes are all written. */
    if (rc == 0 && (rc = kc__bundle_writer_sync(&e->w)) < 0)
        kc__bundle_why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    if (rc == 0)
        progress(e, e->bodies, e->bodies);
    int ie = kc__db_iter_err(s->d, it);
    rocksdb_iter_destroy(it);
    return rc != 0 ? rc : ie;
}

static int emit_entry_cand(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    struct emit *e = arg;
    if (!kc__sel_selected(s, c))
        return 0;
    if (c->digest == NULL)
        return kc__bundle_why(
            e->info, -EBADMSG,
            "an entry of %s is damaged in the store; run kcache verify and export again", c->ns);
    kc_digest src, bd;
    bool has = own_source(e, c, &src);
    kc__digest_decode(c->digest, &bd);
    int rc = kc__bundle_writer_add_entry(&e->w, c->ns, &c->key, has ? &src : NULL, &c->h, &bd, NULL,
                                         0, KC__SP_ENTRY);
    if (rc < 0)
        return kc__bundle_why(e->info, rc, "cannot write the bundle: %s", strerror(-rc));
    e->done++;
    written(e);
    return 0;
}

int kc__bundle_export(const struct kc__store_access *a, const struct kc_bundle_export_opts *o,
                      struct kc_bundle_info *info)
{
    memset(info, 0, sizeof *info);
    if (a == NULL || o == NULL || o->fd < 0)
        return kc__bundle_why(info, -EINVAL, "invalid arguments");
    info->version = KC__BUNDLE_VERSION;
    info->format = KC_FORMAT_VERSION;
    info->created_ns = kc_wall_ns();
    const struct kc_bundle_crypto *crypto =
        o->crypto != NULL && o->crypto->key_id != 0 ? o->crypto : NULL;
    info->key_id = crypto != NULL ? crypto->key_id : 0;
    info->is_signed = crypto != NULL;
    if (crypto != NULL && (crypto->digest_begin == NULL || crypto->digest_add == NULL ||
                           crypto->digest_end == NULL || crypto->sign == NULL))
        return kc__bundle_why(info, -EINVAL, "invalid arguments (signing hooks)");

    struct kc__db *d = NULL;
    int hold = a->reader_hold(a->st, &d);
    if (hold < 0 && hold != -ENOENT)
        return kc__bundle_why(info, hold, "cannot read the store: %s", strerror(-hold));
    bool have = hold == 0;
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(ro, 0);
    struct kc__sel s = {.o = o, .d = d, .exact = o->max_size > 0, .ro = ro};
    struct nslist l = {.info = info};
    struct dictlist dl = {0};
    int rc = have ? dicts_collect(d, &dl) : 0;
    if (have && rc == 0) {
        if (o->max_size > 0) {
            struct kc__sel_total all = {0};
            rc = kc__sel_each(&s, kc__sel_add_total, &all);
            /* Everything a bundle of these entries holds but its records:
             * the header (its namespaces counted before the cut: an upper
             * bound, the text's numbers only shrink), the trailer and one
             * block header per KC__BUNDLE_BLOCK_TARGET bytes and one more. */
            if (rc == 0)
                rc = kc__sel_each(&s, add_ns, &l);
            uint64_t fixed = kc__bundle_header_size(info, o->codec, dl.v, dl.n) +
                             KC__BUNDLE_TRAILER + KC__BUNDLE_BLOCK_HDR;
            free(info->ns);
            info->ns = NULL;
            info->n_ns = 0;
            l.cap = 0;
            kc__nsindex_free(&l.index);
            info->entries = info->raw_bytes = 0;
            if (rc == 0 && o->max_size < fixed + KC__BUNDLE_BLOCK_HDR) {
                rc = kc__bundle_why(info, -ENOSPC,
                                    "--max-size %" PRIu64 " is smaller than an empty bundle",
                                    o->max_size);
            } else if (rc == 0) {
                uint64_t avail = o->max_size - fixed;
                uint64_t budget = (uint64_t)((double)avail * KC__BUNDLE_BLOCK_TARGET /
                                             (KC__BUNDLE_BLOCK_TARGET + KC__BUNDLE_BLOCK_HDR));
                while (budget > 0 &&
                       budget + KC__BUNDLE_BLOCK_HDR * (budget / KC__BUNDLE_BLOCK_TARGET) > avail)
                    budget--;
                if (all.bytes > budget)
                    rc = kc__sel_cut(&s, budget);
            }
        }
        s.exact = false; /* the cut is made: what follows needs no stored size */
        if (rc == 0)
            rc = kc__sel_each(&s, add_ns, &l);
    }
    kc__nsindex_free(&l.index);
    if (rc != 0) {
        if (have)
            a->reader_release(a->st);
        dicts_free(&dl);
        rocksdb_readoptions_destroy(ro);
        return info->why[0] ? rc
                            : kc__bundle_why(info, rc, "cannot read the store: %s", strerror(-rc));
    }
    if (s.too_big > 0)
        kc_log(KC_LOG_WARN, "export: %" PRIu64 " entries over %llu bytes are left out", s.too_big,
               (unsigned long long)KC__BUNDLE_MAX_RECORD);

    struct emit e = {.info = info, .o = o};
    rc = kc__bundle_writer_begin(&e.w, o->fd, info, o->codec, o->level, crypto, dl.v, dl.n);
    if (rc < 0)
        kc__bundle_why(info, rc, "cannot write the bundle: %s", strerror(-rc));
    e.w.tick = o->progress != NULL ? written : NULL;
    e.w.tick_arg = &e;
    if (rc == 0 && have) {
        e.sources = rocksdb_create_iterator_cf(d->db, kc__sel_ro(&s), d->cf[KC__CF_SOURCES]);
        /* The whole store: bodies in table order, then the entries. */
        bool whole = o->n_globs == 0 && o->since_ns == 0 && o->max_size == 0;
        if (whole) {
            e.bodies_total = o->progress != NULL ? count_bodies(&s) : 0;
            stage(&e, "bodies", e.bodies_total);
            rc = emit_bodies(&s, &e);
        }
        if (rc == 0) {
            stage(&e, "entries", info->entries);
            rc = kc__sel_each(&s, whole ? emit_entry_cand : emit_cand, &e);
        }
        int ie = kc__db_iter_err(d, e.sources);
        rocksdb_iter_destroy(e.sources);
        if (rc == 0 && ie != 0)
            rc = kc__bundle_why(info, ie, "cannot read the store: %s", strerror(-ie));
    }
    if (have)
        a->reader_release(a->st);
    if (rc == 0 && e.done != info->entries)
        rc = kc__bundle_why(info, -EIO, "the store changed during the export");
    if (rc == 0) {
        rc = kc__bundle_writer_finish(&e.w, &info->file_bytes);
        if (rc < 0)
            kc__bundle_why(info, rc, "cannot write the bundle: %s", strerror(-rc));
    }
    /* The last count once the last byte (the trailer's) is written. */
    if (rc == 0 && have)
        progress(&e, e.done, e.done);
    info->blocks = e.w.blocks;
    kc__bundle_writer_free(&e.w);
    dicts_free(&dl);
    rocksdb_readoptions_destroy(ro);
    if (rc < 0 && info->why[0] == '\0')
        kc__bundle_why(info, rc, "cannot read the store: %s", strerror(-rc));
    info->verified = rc == 0;
    return rc;
}
