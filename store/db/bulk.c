/*
 * bulk.c: importing a bundle into a database that holds no entry (a new
 * node, a container's first start) as tables rather than as puts. The
 * entries are written, sorted, with RocksDB's SstFileWriter into four
 * tables (bodies, their refcounts, sources, kernels) beside DIR/db, which
 * RocksDB then takes whole (IngestExternalFile, moving the files in): no
 * write-ahead log, no memtable, no compaction, and the bodies go from the
 * bundle to their table as the bytes they are (a bundle's 'S' entries are
 * the store's own stored bodies).
 *
 * The bundle was read and checked whole before (import.c's kc__import_check);
 * this pass reads it again (a private file: the same bytes), checking
 * every digest again, and collects each entry and where its stored body
 * lies in the file, which it maps. Ingested in that order: bodies,
 * refcounts, sources, kernels, so that a crash between two leaves bodies
 * nothing names (gc and verify remove them), never an entry without its
 * body. What does not qualify is left to the put path, before anything is
 * written: a store with entries, a bundle with plain bodies ('P' puts: an
 * earlier version's), compressed blocks, or entries out of kernels order.
 */
#include "jobs.h"

#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TMP_PREFIX "kcache-import-"

struct ent { /* one entry, in bundle order (= kernels key order) */
    uint32_t kk_off;
    uint16_t kk_len;
    unsigned char kval[KC__KVAL_LEN];
    uint64_t at, len; /* its stored body in the bundle */
    uint64_t used;    /* last used (ns) */
};

struct body { /* one entry's body, sorted by digest later */
    unsigned char digest[16];
    uint64_t at, len, raw;
};

struct src { /* a source mapping */
    uint32_t sk_off;
    uint16_t sk_len;
    uint32_t idx; /* entry order: the last one of a source wins */
    unsigned char key[KC__KEY_LEN];
};

struct bulk {
    struct ent *e;
    size_t ne, ce;
    struct body *b;
    size_t nb, cb;
    struct src *s;
    size_t ns, cs;
    struct kc_buf arena;  /* kernels and sources keys */
    struct kc__fhash *fh; /* filter hashes */
    size_t nfh, cfh;
};

static int why(struct kc_bundle_info *info, int rc, const char *what)
{
    snprintf(info->why, sizeof info->why, "cannot write to the store: %s: %s", what, strerror(-rc));
    return rc;
}

static bool grow(void **v, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? 2 * *cap : 1024;
    void *p = realloc(*v, c * size);
    if (p == NULL)
        return false;
    *v = p;
    *cap = c;
    return true;
}

static int cmp_body(const void *a, const void *b)
{
    return memcmp(((const struct body *)a)->digest, ((const struct body *)b)->digest, 16);
}

static const unsigned char *arena_at(const struct bulk *k, uint32_t off)
{
    return k->arena.p + off;
}

static int cmp_bytes(const unsigned char *a, size_t al, const unsigned char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

static const struct bulk *sort_ctx; /* qsort has no argument */

static int cmp_src(const void *a, const void *b)
{
    const struct src *x = a, *y = b;
    int c = cmp_bytes(arena_at(sort_ctx, x->sk_off), x->sk_len, arena_at(sort_ctx, y->sk_off),
                      y->sk_len);
    return c != 0 ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

static void tmp_path(struct kc__owner *ow, int cf, char *out, size_t n)
{
    snprintf(out, n, "%s/" TMP_PREFIX "%d.sst", ow->p.db, cf);
}

void kc__bulk_sweep(struct kc__owner *ow)
{
    DIR *d = opendir(ow->p.db);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, TMP_PREFIX, sizeof TMP_PREFIX - 1) == 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
}

/* A sorted table of one column family, written by put() calls. */
struct table {
    rocksdb_envoptions_t *eo;
    rocksdb_sstfilewriter_t *w;
    char path[4400];
    uint64_t n;
    int cf;
};

static int table_open(struct kc__owner *ow, int cf, struct table *t)
{
    memset(t, 0, sizeof *t);
    t->cf = cf;
    tmp_path(ow, cf, t->path, sizeof t->path);
    unlink(t->path);
    t->eo = rocksdb_envoptions_create();
    t->w = rocksdb_sstfilewriter_create(t->eo, ow->d.opts[cf]);
    char *err = NULL;
    rocksdb_sstfilewriter_open(t->w, t->path, &err);
    return kc__db_err(err, "open a table");
}

static int table_put(struct table *t, const void *k, size_t kl, const void *v, size_t vl)
{
    char *err = NULL;
    rocksdb_sstfilewriter_put(t->w, k, kl, v, vl, &err);
    t->n++;
    return kc__db_err(err, "write a table");
}

static int table_finish(struct table *t)
{
    if (t->n == 0)
        return 0;
    char *err = NULL;
    rocksdb_sstfilewriter_finish(t->w, &err);
    return kc__db_err(err, "finish a table");
}

static void table_close(struct table *t)
{
    if (t->w != NULL)
        rocksdb_sstfilewriter_destroy(t->w);
    if (t->eo != NULL)
        rocksdb_envoptions_destroy(t->eo);
    unlink(t->path); /* moved in when ingested; else not wanted */
    t->w = NULL;
    t->eo = NULL;
}

static int table_ingest(struct kc__owner *ow, struct table *t)
{
    if (t->n == 0)
        return 0;
    rocksdb_ingestexternalfileoptions_t *io = rocksdb_ingestexternalfileoptions_create();
    rocksdb_ingestexternalfileoptions_set_move_files(io, 1);
    const char *files[1] = {t->path};
    char *err = NULL;
    rocksdb_ingest_external_file_cf(ow->d.db, ow->d.cf[t->cf], files, 1, io, &err);
    rocksdb_ingestexternalfileoptions_destroy(io);
    return kc__db_err(err, "ingest a table");
}

/* Whether the database holds no entry. */
static bool db_empty(struct kc__owner *ow)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(ow->d.db, ow->d.ro, ow->d.cf[KC__CF_KERNELS]);
    rocksdb_iter_seek_to_first(it);
    bool empty = !rocksdb_iter_valid(it) && kc__db_iter_err(&ow->d, it) == 0;
    rocksdb_iter_destroy(it);
    return empty;
}

/* Reads the bundle again, collecting its entries: 1 with k filled, 0 when
 * it does not qualify, or a negative errno. */
static int collect(const struct kc_bundle_import_opts *o, int fd, struct kc_bundle_info *info,
                   struct bulk *k)
{
    struct kc_bundle_info again;
    struct kc__bundle_reader r;
    struct kc__import_read ir;
    kc__import_read_begin(&ir, o, fd);
    int rc = kc__bundle_reader_begin_read(&r, fd, -1, kc__import_on_read, &ir, &again, o->crypto,
                                          o->trust_unsigned != 0);
    bool have_prev = false;
    uint32_t prev_off = 0;
    size_t prev_len = 0;
    int ok = 1;
    while (rc == 0 && ok) {
        struct kc__sp_put sp;
        size_t idx;
        int n = kc__bundle_reader_next(&r, &sp, NULL, NULL, &idx);
        if (n <= 0) {
            rc = n;
            break;
        }
        if (idx >= info->n_ns || strcmp(info->ns[idx].ns, sp.ns) != 0) {
            rc = -EIO;
            snprintf(info->why, sizeof info->why, "the bundle changed between its readings");
            break;
        }
        if (o->only_usable && info->ns[idx].usable == 0)
            continue;
        if ((r.entry_stored == NULL && !r.entry_detached) || r.entry_stored_at == UINT64_MAX) {
            ok = 0; /* a plain body, or a compressed block */
            break;
        }
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(sp.ns, &sp.key, kk);
        if (!grow((void **)&k->e, &k->ce, k->ne, sizeof *k->e) ||
            !grow((void **)&k->b, &k->cb, k->nb, sizeof *k->b) ||
            !grow((void **)&k->fh, &k->cfh, k->nfh + 1, sizeof *k->fh)) {
            rc = -ENOMEM;
            break;
        }
        uint32_t off = (uint32_t)k->arena.len;
        kc_buf_add(&k->arena, kk, kl);
        if (k->arena.err || k->arena.len > UINT32_MAX) {
            rc = -ENOMEM;
            break;
        }
        if (have_prev && cmp_bytes(k->arena.p + prev_off, prev_len, k->arena.p + off, kl) >= 0) {
            ok = 0; /* not in kernels key order, or a key twice */
            break;
        }
        have_prev = true;
        prev_off = off;
        prev_len = kl;
        struct ent *e = &k->e[k->ne++];
        e->kk_off = off;
        e->kk_len = (uint16_t)kl;
        kc__kval_encode(&sp.hdr, r.entry_digest, e->kval);
        e->at = r.entry_stored_at;
        e->len = r.entry_stored_len;
        e->used = sp.hdr.last_hit_ns > sp.hdr.created_ns ? sp.hdr.last_hit_ns : sp.hdr.created_ns;
        struct body *b = &k->b[k->nb++];
        memcpy(b->digest, r.entry_digest, 16);
        b->at = r.entry_stored_at;
        b->len = r.entry_stored_len;
        b->raw = sp.hdr.body_size;
        k->fh[k->nfh++] = kc__fhash_kernel(sp.ns, &sp.key);
        if (sp.has_source) {
            unsigned char sk[KC__NS_MAX + 1 + 16];
            size_t sl = kc__skey(sp.ns, &sp.source, sk);
            if (!grow((void **)&k->s, &k->cs, k->ns, sizeof *k->s) ||
                !grow((void **)&k->fh, &k->cfh, k->nfh + 1, sizeof *k->fh)) {
                rc = -ENOMEM;
                break;
            }
            struct src *s = &k->s[k->ns++];
            s->sk_off = (uint32_t)k->arena.len;
            s->sk_len = (uint16_t)sl;
            s->idx = (uint32_t)(k->ne - 1);
            kc__key_encode(&sp.key, s->key);
            kc_buf_add(&k->arena, sk, sl);
            if (k->arena.err || k->arena.len > UINT32_MAX) {
                rc = -ENOMEM;
                break;
            }
            k->fh[k->nfh++] = kc__fhash_source(sp.ns, &sp.source);
        }
    }
    if (rc < 0 && info->why[0] == '\0')
        snprintf(info->why, sizeof info->why, "%s",
                 again.why[0] ? again.why : "cannot read the bundle");
    free(again.ns);
    kc__bundle_reader_free(&r);
    return rc < 0 ? rc : ok;
}

/* Writes and ingests the tables. */
static int write_tables(struct kc__owner *ow, struct bulk *k, const unsigned char *map,
                        uint64_t map_len, struct kc_bundle_info *info)
{
    struct table t[4] = {0};
    const int cfs[4] = {KC__CF_BODIES, KC__CF_META, KC__CF_SOURCES, KC__CF_KERNELS};
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = table_open(ow, cfs[i], &t[i]);
    if (rc < 0) {
        why(info, rc, "a table beside the database");
        goto out;
    }

    /* Bodies and their refcounts, by digest: one of each per digest. */
    qsort(k->b, k->nb, sizeof *k->b, cmp_body);
    uint64_t unique = 0;
    for (size_t i = 0; i < k->nb && rc == 0;) {
        size_t j = i + 1;
        while (j < k->nb && memcmp(k->b[j].digest, k->b[i].digest, 16) == 0)
            j++;
        const struct body *b = &k->b[i];
        if (b->at > map_len || b->len > map_len - b->at) {
            rc = -EIO;
            break;
        }
        rc = table_put(&t[0], b->digest, 16, map + b->at, (size_t)b->len);
        unsigned char rk[KC__META_REF_KEY_LEN], rv[KC__META_REF_VAL_LEN];
        size_t rkl = kc__meta_ref_key(b->digest, rk);
        kc__meta_ref_value(j - i, b->raw, rv);
        if (rc == 0)
            rc = table_put(&t[1], rk, rkl, rv, sizeof rv);
        unique += b->raw;
        i = j;
    }
    /* Sources, by key; of one source the last entry's. */
    sort_ctx = k;
    qsort(k->s, k->ns, sizeof *k->s, cmp_src);
    for (size_t i = 0; i < k->ns && rc == 0; i++) {
        const struct src *s = &k->s[i];
        if (i + 1 < k->ns && s->sk_len == k->s[i + 1].sk_len &&
            memcmp(arena_at(k, s->sk_off), arena_at(k, k->s[i + 1].sk_off), s->sk_len) == 0)
            continue;
        rc = table_put(&t[2], arena_at(k, s->sk_off), s->sk_len, s->key, sizeof s->key);
    }
    for (size_t i = 0; i < k->ne && rc == 0; i++)
        rc = table_put(&t[3], arena_at(k, k->e[i].kk_off), k->e[i].kk_len, k->e[i].kval,
                       KC__KVAL_LEN);
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = table_finish(&t[i]);
    if (rc < 0) {
        why(info, rc, "a table beside the database");
        goto out;
    }
    /* The filter first: it never says "absent" of a key a reader finds. */
    for (size_t i = 0; i < k->nfh; i++)
        kc__filter_add(&ow->f, k->fh[i]);
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = table_ingest(ow, &t[i]);
    if (rc < 0) {
        why(info, rc, "ingesting the tables");
        goto out;
    }
    ow->unique += unique;
out:
    for (int i = 0; i < 4; i++)
        table_close(&t[i]);
    return rc;
}

static int cmp_used(const void *a, const void *b)
{
    const struct ent *const *x = a, *const *y = b;
    if ((*x)->used != (*y)->used)
        return (*x)->used > (*y)->used ? -1 : 1;
    return (*x < *y) ? -1 : (*x > *y); /* then kernels key order */
}

/* Hot files for the most recently used entries, as many as DIR/hot's
 * bound holds (as import.c's kc__import_hot chooses them from the database),
 * written from the bundle's bodies while the tables are written and
 * ingested (no lookup, no pass over the tables), under staged names that
 * become theirs once the tables are in (kc__hot_stage_end). The bound follows the
 * tables' size, which is not known yet: it is taken from the bodies'
 * stored bytes, which the tables hold and more (kc__hot_enforce brings DIR/hot
 * to the real bound afterwards). */
struct hotjob {
    struct kc__owner *ow;
    const struct bulk *k;
    const unsigned char *map;
    uint64_t map_len, tables;
    pthread_t th;
    bool started;
};

static void *bulk_hot(void *arg)
{
    struct hotjob *j = arg;
    struct kc__owner *ow = j->ow;
    const struct bulk *k = j->k;
    uint64_t lim = ow->max_size / 4 < KC__HOT_MAX ? ow->max_size / 4 : KC__HOT_MAX;
    uint64_t est = j->tables / 4 < KC__HOT_MIN ? KC__HOT_MIN : j->tables / 4;
    ow->hot_max = est < lim ? est : lim;
    uint64_t target = ow->hot_max / 10 * 9;
    if (!kc__hot_can_write(ow) || ow->hot_bytes >= target || k->ne == 0)
        return NULL;
    const struct ent **v = malloc(k->ne * sizeof *v);
    if (v == NULL)
        return NULL;
    for (size_t i = 0; i < k->ne; i++)
        v[i] = &k->e[i];
    qsort(v, k->ne, sizeof *v, cmp_used);
    uint64_t budget = target - ow->hot_bytes, acc = 0;
    for (size_t i = 0; i < k->ne; i++) {
        const struct ent *e = v[i];
        char ns[KC__NS_MAX + 1];
        kc_key key;
        struct kc__hdr h;
        if (kc__kkey_split(arena_at(k, e->kk_off), e->kk_len, ns, &key) != 0 ||
            kc__kval_decode(e->kval, KC__KVAL_LEN, &h) != 0)
            continue;
        uint64_t blocks = (kc__put_file_size(strlen(ns), h.body_size) + 4095) / 4096 * 4096;
        if (acc + blocks > budget)
            break;
        acc += blocks;
        char *body = NULL;
        size_t bl = 0;
        if (e->at <= j->map_len && e->len <= j->map_len - e->at &&
            kc__body_decode(j->map + e->at, (size_t)e->len, j->ow->d.dicts, &body, &bl) == 0 &&
            bl == h.body_size && kc__body_xxh(body, bl) == h.body_xxh)
            kc__hot_write_staged(ow, ns, &key, &h, body, bl);
        free(body);
        if (!kc__hot_can_write(ow))
            break;
    }
    free(v);
    return NULL;
}

int kc__bulk_import(struct kc__owner *ow, int fd, const struct kc_bundle_import_opts *o,
                    struct kc_bundle_info *info, bool *hot_done)
{
    *hot_done = false;
    if (!db_empty(ow))
        return 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0 ||
        lseek(fd, 0, SEEK_SET) != 0)
        return 0;
    kc__bulk_sweep(ow);
    struct bulk k = {0};
    int rc = collect(o, fd, info, &k);
    void *map = MAP_FAILED;
    if (rc == 1) {
        map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED)
            rc = 0;
    }
    /* Hot files beside the tables (past the size limit the import's caller
     * evicts first, and then chooses them from what is left). */
    struct hotjob hj = {.ow = ow, .k = &k, .map = map, .map_len = (uint64_t)sb.st_size};
    if (rc == 1) {
        uint64_t raw = 0;
        for (size_t i = 0; i < k.nb; i++) {
            hj.tables += k.b[i].len;
            raw += k.b[i].raw;
        }
        if (ow->unique + raw <= ow->max_size)
            hj.started = pthread_create(&hj.th, NULL, bulk_hot, &hj) == 0;
    }
    if (rc == 1) {
        rc = write_tables(ow, &k, map, (uint64_t)sb.st_size, info);
        if (rc == 0) {
            /* The namespaces, and the counts the summary prints. */
            rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
            for (size_t i = 0; i < info->n_ns; i++) {
                struct kc_bundle_ns *e = &info->ns[i];
                if (o->only_usable && e->usable == 0) {
                    e->skipped = e->entries;
                    continue;
                }
                e->imported = e->entries;
                unsigned char nk[KC__META_NAME_KEY_MAX];
                size_t nkl = kc__meta_ns_key(e->ns, nk);
                rocksdb_writebatch_put_cf(wb, ow->d.cf[KC__CF_META], (char *)nk, nkl, "", 0);
            }
            rc = kc__owner_write(ow, wb, false);
            rocksdb_writebatch_destroy(wb);
            if (rc < 0)
                why(info, rc, "the namespaces");
        }
        if (rc == 0)
            rc = kc__owner_commit(ow);
        rc = rc == 0 ? 1 : rc;
        if (rc == 1) /* all of it read (the reader checks the count) and written */
            kc__import_progress(o, (uint64_t)sb.st_size, (uint64_t)sb.st_size);
    }
    if (hj.started) {
        pthread_join(hj.th, NULL);
        /* Written under staged names: served only once their entries are
         * committed (a kill before leaves none a reader finds). */
        bool publish = rc == 1 && ow->unique <= ow->max_size;
        kc__hot_stage_end(ow, publish);
        if (publish) {
            kc__hot_enforce(ow);
            *hot_done = true;
        } else {
            kc__hot_clear(ow); /* the database has none of their entries */
        }
    }
    if (map != MAP_FAILED)
        munmap(map, (size_t)sb.st_size);
    free(k.e);
    free(k.b);
    free(k.s);
    free(k.fh);
    kc_buf_free(&k.arena);
    return rc;
}
