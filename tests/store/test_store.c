/*
 * test_store.c: the store's behaviour in one process (suite `store`).
 *
 * Each test has its own cache directory. The store is opened with a tool
 * that does nothing (/bin/true), so no background owner runs; tests drain
 * the spool explicitly with adm->drain(), which makes every step
 * deterministic. The multi-process behaviour is in test_multiproc.c.
 */
#include "internal.h"
#include "meta.h"
#include "ptxgen.h"
#include "store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <lz4hc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Opening, the data path on an open store, and the administration. */
static const struct kc_store_api *S;
static const struct kc_store_ops *api;
static const struct kc_store_admin *adm;
static char dir[256];

static void setup(void)
{
    S = kc_store_api();
    api = S->ops;
    adm = kc_store_admin();
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kc-store-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0700);
}

static void teardown(void)
{
    kc__rm_rf(dir);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 60);

static struct kc_store *open_at(const char *d, int readonly, uint64_t max)
{
    struct kc_store_options o = {
        .dir = d, .readonly = readonly, .max_size = max, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    int rc = S->open(&o, &st);
    cr_assert_eq(rc, 0, "open %s: %s", d, strerror(-rc));
    return st;
}

static kc_key key(uint64_t id, uint64_t build)
{
    return (kc_key){.id = {.lo = id, .hi = ~id}, .build = build};
}

static kc_digest digest(const char *s)
{
    return kc_digest_of(s, strlen(s));
}

static const char *NS = "nvrtc/sm_90/test";

static void put_str(struct kc_store *st, const kc_key *k, const char *src, const char *body)
{
    kc_digest d = src ? digest(src) : (kc_digest){0};
    int rc = api->put(st, NS, k, src ? &d : NULL, KC_KIND_BLOB, body, strlen(body), 42);
    cr_assert_eq(rc, 0, "put: %s", strerror(-rc));
}

/* The body under k as a string, or NULL on a miss. */
static char *get_str(struct kc_store *st, const kc_key *k)
{
    void *b = NULL;
    size_t n = 0;
    int rc = api->get(st, NS, k, &b, &n, NULL);
    if (rc == -ENOENT)
        return NULL;
    cr_assert_eq(rc, 0, "get: %s", strerror(-rc));
    char *s = malloc(n + 1);
    memcpy(s, b, n);
    s[n] = 0;
    api->free(b);
    return s;
}

static void drain(struct kc_store *st)
{
    int rc = adm->drain(st, 5000);
    cr_assert_eq(rc, 0, "drain: %s", strerror(-rc));
}

static void expect_body(struct kc_store *st, const kc_key *k, const char *want)
{
    char *got = get_str(st, k);
    cr_assert_not_null(got, "miss, expected \"%s\"", want);
    cr_assert_str_eq(got, want);
    free(got);
}

static void expect_miss(struct kc_store *st, const kc_key *k, const char *why)
{
    char *got = get_str(st, k);
    cr_assert_null(got, "%s: got \"%s\"", why, got ? got : "");
}

static void unlink_one(const char *path, void *arg)
{
    unlink(path);
}

/* Removes the hot files a drain made, so the next get of a drained entry
 * reads the database (the local tier, hot files included, comes first). */
static void drop_hot(void)
{
    char p[300];
    snprintf(p, sizeof p, "%s/hot", dir);
    kc__each_child(p, unlink_one, NULL);
}

Test(store, put_then_get_pending_drained_and_fresh)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1);
    put_str(st, &k, NULL, "artifact one");
    expect_body(st, &k, "artifact one"); /* from the spool */
    drain(st);
    drop_hot();
    expect_body(st, &k, "artifact one"); /* from the database */
    api->close(st);
    st = open_at(dir, 0, 0);
    struct kc_record_info info;
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, NS, &k, &b, &n, &info), 0);
    api->free(b);
    cr_assert_eq(info.kind, KC_KIND_BLOB);
    cr_assert_eq(info.format, KC_FORMAT_VERSION);
    cr_assert_eq(info.body_size, strlen("artifact one"));
    cr_assert_eq(info.saved_ns, 42);
    cr_assert(info.created > 1600000000);
    kc_key other = key(2, 1);
    expect_miss(st, &other, "never written");
    api->close(st);
}

/* The seed's kernels_sharing_a_source_each_keep_it, with the sources map
 * read from the spool (no drain) and from the database (drained). */
Test(store, kernels_sharing_a_source_each_keep_it)
{
    for (int drained = 0; drained < 2; drained++) {
        struct kc_store *st = open_at(dir, 0, 0);
        const uint64_t build = 77;
        kc_key kernels[3] = {key(100 + 10 * drained, build), key(101 + 10 * drained, build),
                             key(102 + 10 * drained, build)};
        const char *src = drained ? "shared-2" : "shared";
        put_str(st, &kernels[0], src, "7");
        if (drained) {
            drain(st);
            api->close(st);
            st = open_at(dir, 0, 0); /* nothing in memory from the put */
        }
        for (int i = 1; i < 3; i++) {
            kc_digest d = digest(src);
            void *b = NULL;
            size_t n = 0;
            kc_key found;
            int rc = api->take_by_source(st, NS, &d, build, &b, &n, &found, NULL);
            cr_assert_eq(rc, 0, "kept by source: %s", strerror(-rc));
            cr_assert_eq(n, 1);
            cr_assert_eq(((char *)b)[0], '7');
            cr_assert_eq(api->put(st, NS, &kernels[i], &d, KC_KIND_BLOB, b, n, 0), 0);
            api->free(b);
            if (drained)
                drain(st);
        }
        for (int i = 0; i < 3; i++)
            expect_body(st, &kernels[i], "7");
        drain(st);
        api->close(st);
        st = open_at(dir, 0, 0);
        for (int i = 0; i < 3; i++)
            expect_body(st, &kernels[i], "7");
        api->close(st);
    }
}

/* The seed's an_earlier_build_is_moved. */
Test(store, an_earlier_build_is_moved)
{
    struct kc_store *st = open_at(dir, 0, 0);
    const uint64_t current = 2, earlier = 1;
    kc_key kernel_then = key(5, earlier);
    put_str(st, &kernel_then, "shared", "7");

    kc_digest d = digest("shared");
    void *b = NULL;
    size_t n = 0;
    kc_key found;
    cr_assert_eq(api->take_by_source(st, NS, &d, current, &b, &n, &found, NULL), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(((char *)b)[0], '7');
    cr_assert_eq(found.build, earlier);
    api->free(b);
    expect_miss(st, &kernel_then, "moved out");
    cr_assert_eq(api->take_by_source(st, NS, &d, current, &b, &n, &found, NULL), -ENOENT,
                 "the sources entry moved too");

    /* And for everyone else, once the owner has applied it. */
    drain(st);
    api->close(st);
    st = open_at(dir, 0, 0);
    expect_miss(st, &kernel_then, "moved out, seen by a fresh process");
    cr_assert_eq(api->take_by_source(st, NS, &d, current, &b, &n, &found, NULL), -ENOENT);
    api->close(st);
}

Test(store, identical_bodies_are_stored_once)
{
    struct kc_store *st = open_at(dir, 0, 0);
    char *big = ptxgen(1, 20000), *other = ptxgen(2, 10000);
    for (uint64_t i = 0; i < 3; i++) {
        kc_key k = key(i, 1);
        cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_BLOB, big, 20000, 0), 0);
    }
    kc_key k3 = key(3, 1);
    cr_assert_eq(api->put(st, "jit/sm_90", &k3, NULL, KC_KIND_JIT, other, 10000, 0), 0);
    drain(st);
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 4);
    cr_assert_eq(s->raw_bytes, 70000);
    cr_assert_eq(s->unique_bytes, 30000, "unique %llu", (unsigned long long)s->unique_bytes);
    cr_assert_eq(s->n_ns, 2);
    cr_assert_eq(s->spool_entries, 0);
    adm->stats_free(s);
    /* Dropping two of the three keeps the body for the third. */
    for (uint64_t i = 0; i < 2; i++) {
        kc_key k = key(i, 1);
        cr_assert_eq(api->purge(st, NS, &k), 0);
    }
    drain(st);
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 2);
    cr_assert_eq(s->unique_bytes, 30000);
    adm->stats_free(s);
    kc_key k2 = key(2, 1);
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, NS, &k2, &b, &n, NULL), 0);
    cr_assert_eq(n, 20000);
    cr_assert(memcmp(b, big, n) == 0);
    api->free(b);
    api->close(st);
    free(big);
    free(other);
}

/* An owner session on the store, and the kernels key and value of `k`
 * (kv malloc'd). */
struct owned {
    struct kc__owner *o;
    struct kc__db *d;
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl;
    char *kv;
    size_t kvl;
};

static void own_entry(const kc_key *k, struct owned *w)
{
    cr_assert_eq(kc__owner_begin(dir, 0, 5000, &w->o), 0);
    w->d = kc__owner_db(w->o);
    w->kl = kc__kkey(NS, k, w->kk);
    cr_assert_eq(kc__db_get(w->d, KC__CF_KERNELS, w->kk, w->kl, &w->kv, &w->kvl), 0);
}

/* Replaces the body stored for `k` with same-length bytes that fail the
 * record's checksum, straight in the primary. */
static void corrupt_body(const kc_key *k)
{
    struct owned w;
    own_entry(k, &w);
    struct kc__owner *o = w.o;
    struct kc__db *d = w.d;
    char *kv = w.kv;
    char *bv;
    size_t bvl;
    cr_assert_eq(kc__db_get(d, KC__CF_BODIES, kv + KC__HDR_LEN, 16, &bv, &bvl), 0);
    bv[bvl / 2] ^= 0x20;
    char *err = NULL;
    rocksdb_put_cf(d->db, d->wo_sync, d->cf[KC__CF_BODIES], kv + KC__HDR_LEN, 16, bv, bvl, &err);
    cr_assert_null(err);
    free(kv);
    free(bv);
    kc__owner_end(o);
    /* And no good copy left beside it: the hot file the drain made. */
    char name[40], path[4300];
    kc__spool_name(NS, k, 0, name);
    snprintf(path, sizeof path, "%s/hot/%s", dir, name);
    unlink(path);
}

/* Rewrites the entry of `k` as a store of an earlier version kept it: its
 * body as it is (no body.c header; RocksDB compressed those tables) under
 * the digest of the plain body, which its kernels value names. */
static void store_as_earlier_version(const kc_key *k)
{
    struct owned w;
    own_entry(k, &w);
    struct kc__owner *o = w.o;
    struct kc__db *d = w.d;
    char *kv = w.kv;
    size_t kvl = w.kvl;
    char *body;
    size_t bl;
    cr_assert_eq(kc__body_get(d, (unsigned char *)kv + KC__HDR_LEN, &body, &bl), 0);
    kc_digest pd = kc_digest_of(body, bl);
    unsigned char dg[16];
    kc__digest_encode(&pd, dg);
    memcpy(kv + KC__HDR_LEN, dg, 16);
    unsigned char rk[KC__META_REF_KEY_LEN], rv[KC__META_REF_VAL_LEN];
    kc__meta_ref_key(dg, rk);
    kc__meta_ref_value(1, bl, rv);
    char *err = NULL;
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_BODIES], (char *)dg, 16, body, bl);
    rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_META], (char *)rk, sizeof rk, (char *)rv, sizeof rv);
    rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_KERNELS], (char *)w.kk, w.kl, kv, kvl);
    rocksdb_write(d->db, d->wo_sync, wb, &err);
    cr_assert_null(err);
    rocksdb_writebatch_destroy(wb);
    free(kv);
    free(body);
    kc__owner_end(o);
    char name[40], path[4300];
    kc__spool_name(NS, k, 0, name);
    snprintf(path, sizeof path, "%s/hot/%s", dir, name);
    unlink(path);
}

Test(store, a_body_an_earlier_version_stored_as_it_is_is_served_exported_and_imported)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(11, 1);
    char *body = ptxgen(11, 9000);
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, body, 9000, 0), 0);
    drain(st);
    api->close(st);
    store_as_earlier_version(&k);

    st = open_at(dir, 0, 0);
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, NS, &k, &b, &n, NULL), 0, "an earlier version's body");
    cr_assert(n == 9000 && memcmp(b, body, n) == 0);
    api->free(b);
    struct kc_verify_report r;
    cr_assert_eq(adm->verify(st, 0, &r, NULL, NULL), 0);
    cr_assert_eq(r.bad, 0);

    /* Exported as a plain entry, imported elsewhere, served there. */
    char bundle[4300], other[4300];
    snprintf(bundle, sizeof bundle, "%s/b.kcb", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    int fd = open(bundle, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    struct kc_bundle_export_opts eo = {.fd = fd, .codec = KC_BUNDLE_ZSTD};
    struct kc_bundle_info info;
    cr_assert_eq(adm->bundle_export(st, &eo, &info), 0, "%s", info.why);
    free(info.ns);
    api->close(st);
    cr_assert_eq(mkdir(other, 0700), 0);
    struct kc_store *st2 = open_at(other, 0, 0);
    lseek(fd, 0, SEEK_SET);
    struct kc_bundle_import_opts io = {.fd = fd, .trust_unsigned = 1};
    cr_assert_eq(adm->bundle_import(st2, &io, &info), 0, "%s", info.why);
    free(info.ns);
    close(fd);
    cr_assert_eq(api->get(st2, NS, &k, &b, &n, NULL), 0, "imported");
    cr_assert(n == 9000 && memcmp(b, body, n) == 0);
    api->free(b);
    api->close(st2);
    free(body);
}

Test(store, a_record_failing_its_checksum_is_a_miss_and_purged)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(9, 1), good = key(10, 1);
    char *body = ptxgen(9, 12000);
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, body, 12000, 0), 0);
    put_str(st, &good, NULL, "fine");
    drain(st);
    api->close(st);

    corrupt_body(&k);
    st = open_at(dir, 0, 0);
    expect_miss(st, &k, "bad checksum");
    expect_body(st, &good, "fine");
    drain(st); /* applies the purge the miss requested */

    struct kc_verify_report r;
    cr_assert_eq(adm->verify(st, 0, &r, NULL, NULL), 0);
    cr_assert_eq(r.bad, 0, "purged: nothing bad left");
    cr_assert_eq(r.checked, 1);
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 1);
    cr_assert_eq(s->unique_bytes, 4, "the bad body went with its only entry");
    adm->stats_free(s);

    /* Compiled again, it is stored whole again. */
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, body, 12000, 0), 0);
    drain(st);
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, NS, &k, &b, &n, NULL), 0);
    cr_assert(n == 12000 && memcmp(b, body, n) == 0);
    api->free(b);
    api->close(st);
    free(body);
}

Test(store, verify_repairs_what_it_finds)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(11, 1);
    char *body = ptxgen(11, 9000);
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, body, 9000, 0), 0);
    drain(st);
    api->close(st);
    corrupt_body(&k);
    /* A spool file with flipped bytes, as a full disk might leave one. */
    char path[512];
    snprintf(path, sizeof path, "%s/spool/p-00000000000000000000000000000000", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "KCS1garbage", 11), 11);
    close(fd);

    st = open_at(dir, 0, 0);
    struct kc_verify_report r;
    cr_assert_eq(adm->verify(st, 0, &r, NULL, NULL), 0);
    cr_assert_eq(r.checked, 1);
    cr_assert_eq(r.bad, 1);
    cr_assert_eq(r.spool_bad, 1);
    cr_assert_eq(adm->verify(st, 1, &r, NULL, NULL), 0);
    cr_assert_eq(r.bad, 1);
    cr_assert_eq(r.purged, 1);
    cr_assert_eq(r.spool_bad, 1);
    cr_assert_eq(adm->verify(st, 1, &r, NULL, NULL), 0);
    cr_assert_eq(r.bad + r.spool_bad, 0, "all repaired");
    cr_assert_eq(r.checked, 0);
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->unique_bytes, 0);
    adm->stats_free(s);
    api->close(st);
    free(body);
}

static size_t count_files(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
            n += count_files(sub);
    }
    closedir(d);
    return n;
}

Test(store, readonly_reads_and_writes_nothing)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1), p = key(2, 1);
    put_str(st, &k, NULL, "drained");
    drain(st);
    put_str(st, &p, NULL, "pending");
    api->close(st);

    size_t before = count_files(dir);
    st = open_at(dir, 1, 0);
    expect_body(st, &k, "drained");
    expect_body(st, &p, "pending");
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_BLOB, "x", 1, 0), -EROFS);
    kc_key miss = key(3, 1);
    expect_miss(st, &miss, "never written");
    struct kc_counters c = {.hits = 1};
    api->count(st, "nvrtc", &c);
    cr_assert_eq(api->flush(st), 0);
    cr_assert_eq(adm->gc(st, 0, NULL, NULL, NULL), -EROFS);
    api->close(st);
    cr_assert_eq(count_files(dir), before, "a read-only store wrote into the cache directory");

    /* A missing directory stays missing. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/not/there", dir);
    st = open_at(missing, 1, 0);
    expect_miss(st, &k, "empty");
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 0);
    adm->stats_free(s);
    api->close(st);
    struct stat sb;
    cr_assert_neq(stat(missing, &sb), 0);
}

struct find {
    kc_key key;
    struct kc_record_info info;
    int found;
};

static int find_cb(const struct kc_entry *e, void *arg)
{
    struct find *f = arg;
    if (strcmp(e->ns, NS) == 0 && memcmp(&e->key, &f->key, sizeof f->key) == 0) {
        f->info = e->info;
        f->found++;
    }
    return 0;
}

/* The header of k's record as the store lists it. */
static void entry_info(struct kc_store *st, const kc_key *k, struct kc_record_info *info)
{
    struct find f = {.key = *k};
    cr_assert_eq(adm->foreach (st, NS, find_cb, &f), 0);
    cr_assert_eq(f.found, 1, "listed once");
    *info = f.info;
}

Test(store, eviction_removes_the_least_recently_hit)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key a = key(1, 1), b = key(2, 1), c = key(3, 1);
    char *ba = ptxgen(1, 10000), *bb = ptxgen(2, 10000), *bc = ptxgen(3, 10000);
    cr_assert_eq(api->put(st, NS, &a, NULL, KC_KIND_BLOB, ba, 10000, 0), 0);
    cr_assert_eq(api->put(st, NS, &b, NULL, KC_KIND_BLOB, bb, 10000, 0), 0);
    cr_assert_eq(api->put(st, NS, &c, NULL, KC_KIND_BLOB, bc, 10000, 0), 0);
    drain(st);
    /* a is the oldest, but a hit makes it the most recent. */
    void *p;
    size_t n;
    cr_assert_eq(api->get(st, NS, &a, &p, &n, NULL), 0);
    api->free(p);
    drain(st); /* flushes the hit log and folds it in */
    struct kc_gc_report r;
    cr_assert_eq(adm->gc(st, 25000, &r, NULL, NULL), 0);
    cr_assert_eq(r.evicted, 1);
    cr_assert_eq(r.bytes_before, 30000);
    cr_assert_eq(r.bytes_after, 20000);
    api->close(st);
    st = open_at(dir, 0, 0);
    cr_assert_eq(api->get(st, NS, &a, &p, &n, NULL), 0, "hit, so kept");
    api->free(p);
    cr_assert_eq(api->get(st, NS, &b, &p, &n, NULL), -ENOENT, "least recently hit");
    cr_assert_eq(api->get(st, NS, &c, &p, &n, NULL), 0);
    api->free(p);
    /* The hit is in the entry's record (the database's: a hot file keeps
     * the header it was written with). */
    struct kc_record_info info;
    entry_info(st, &a, &info);
    cr_assert_eq(info.hits, 1);
    cr_assert(info.last_hit >= info.created);
    api->close(st);

    /* The owner enforces the limit by itself after a drain. */
    st = open_at(dir, 0, 15000);
    drain(st);
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert(s->unique_bytes <= 15000, "unique %llu", (unsigned long long)s->unique_bytes);
    adm->stats_free(s);
    api->close(st);
    free(ba);
    free(bb);
    free(bc);
}

Test(store, a_directory_others_can_write_is_refused)
{
    struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    chmod(dir, 0777);
    cr_assert_eq(S->open(&o, &st), -EPERM);
    chmod(dir, 0770);
    cr_assert_eq(S->open(&o, &st), -EPERM);
    o.readonly = 1;
    cr_assert_eq(S->open(&o, &st), -EPERM, "read-only too: it would read planted kernels");
    o.readonly = 0;
    chmod(dir, 0700);
    cr_assert_eq(S->open(&o, &st), 0);
    api->close(st);
    /* A spool others can write is refused too. */
    char spool[300];
    snprintf(spool, sizeof spool, "%s/spool", dir);
    chmod(spool, 0733);
    cr_assert_eq(S->open(&o, &st), -EPERM);
    chmod(spool, 0700);
    /* A file where the directory should be. */
    char file[300];
    snprintf(file, sizeof file, "%s/file", dir);
    close(open(file, O_CREAT | O_WRONLY, 0600));
    o.dir = file;
    cr_assert_eq(S->open(&o, &st), -ENOTDIR);
    if (geteuid() == 0) {
        char theirs[300];
        snprintf(theirs, sizeof theirs, "%s/theirs", dir);
        cr_assert_eq(mkdir(theirs, 0700), 0);
        cr_assert_eq(chown(theirs, 65534, 65534), 0);
        o.dir = theirs;
        cr_assert_eq(S->open(&o, &st), -EPERM, "owned by another user");
    }
    /* A new directory is created private. */
    char fresh[300];
    snprintf(fresh, sizeof fresh, "%s/a/b", dir);
    o.dir = fresh;
    cr_assert_eq(S->open(&o, &st), 0);
    api->close(st);
    struct stat sb;
    cr_assert_eq(stat(fresh, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0700);
}

Test(store, a_planted_symlink_is_never_followed)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1);
    char victim[300], link[600], name[40];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    int fd = open(victim, O_CREAT | O_WRONLY, 0600);
    cr_assert_eq(write(fd, "precious", 8), 8);
    close(fd);
    /* The spool name of k, as the store derives it. */
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(NS, &k, kk);
    kc_digest d = kc_digest_of(kk, kl);
    unsigned char b[16];
    kc__digest_encode(&d, b);
    name[0] = 'p';
    name[1] = '-';
    kc__hex(b, 16, name + 2);
    snprintf(link, sizeof link, "%s/spool/%s", dir, name);
    cr_assert_eq(symlink(victim, link), 0);
    expect_miss(st, &k, "a symlink is not a spool file");
    put_str(st, &k, NULL, "mine");
    char buf[16] = {0};
    fd = open(victim, O_RDONLY);
    cr_assert_eq(read(fd, buf, sizeof buf), 8);
    close(fd);
    cr_assert_str_eq(buf, "precious");
    expect_body(st, &k, "mine");
    api->close(st);
}

static int count_cb(const struct kc_entry *e, void *arg)
{
    (void)e;
    (*(int *)arg)++;
    return 0;
}

Test(store, tool_operations_work_on_an_empty_or_missing_directory)
{
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    for (int i = 0; i < 2; i++) {
        struct kc_store *st = open_at(i == 0 ? dir : missing, 0, 0);
        struct kc_store_stats *s;
        cr_assert_eq(adm->stats(st, &s), 0);
        cr_assert_eq(s->entries + s->raw_bytes + s->unique_bytes + s->spool_entries, 0);
        cr_assert_eq(s->max_size, KC_DEFAULT_MAX_SIZE);
        adm->stats_free(s);
        int n = 0;
        cr_assert_eq(adm->foreach (st, NULL, count_cb, &n), 0);
        cr_assert_eq(n, 0);
        struct kc_verify_report r;
        cr_assert_eq(adm->verify(st, 1, &r, NULL, NULL), 0);
        cr_assert_eq(r.checked, 0);
        struct kc_gc_report g;
        cr_assert_eq(adm->gc(st, 0, &g, NULL, NULL), 0);
        cr_assert_eq(g.evicted, 0);
        cr_assert_eq(adm->clear(st), 0);
        api->close(st);
    }
}

Test(store, foreach_stats_and_clear)
{
    struct kc_store *st = open_at(dir, 0, 0);
    for (uint64_t i = 0; i < 5; i++) {
        kc_key k = key(i, 1);
        put_str(st, &k, NULL, i % 2 ? "odd" : "even");
    }
    drain(st);
    kc_key pend = key(99, 1);
    put_str(st, &pend, NULL, "pending");
    struct kc_counters c = {.hits = 3, .misses = 2, .stores = 1, .saved_ns = 5};
    api->count(st, "nvrtc", &c);
    api->count(st, "nvrtc", &c);
    api->count(st, "jit", &c);
    cr_assert_eq(api->flush(st), 0);
    int n = 0;
    cr_assert_eq(adm->foreach (st, NS, count_cb, &n), 0);
    cr_assert_eq(n, 6);
    n = 0;
    cr_assert_eq(adm->foreach (st, "other", count_cb, &n), 0);
    cr_assert_eq(n, 0);
    struct kc_store_stats *s;
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 5);
    cr_assert_eq(s->spool_entries, 1);
    cr_assert_eq(s->unique_bytes, 7);
    int seen = 0;
    for (size_t i = 0; i < s->n_backends; i++)
        if (strcmp(s->backends[i].backend, "nvrtc") == 0) {
            cr_assert_eq(s->backends[i].c.hits, 6);
            cr_assert_eq(s->backends[i].c.misses, 4);
            seen = 1;
        }
    cr_assert(seen, "counters not reported before the drain");
    adm->stats_free(s);
    drain(st);
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries, 6);
    for (size_t i = 0; i < s->n_backends; i++)
        if (strcmp(s->backends[i].backend, "jit") == 0)
            cr_assert_eq(s->backends[i].c.hits, 3);
    adm->stats_free(s);
    cr_assert_eq(adm->clear(st), 0);
    cr_assert_eq(adm->stats(st, &s), 0);
    cr_assert_eq(s->entries + s->unique_bytes, 0);
    adm->stats_free(s);
    kc_key k0 = key(0, 1);
    expect_miss(st, &k0, "cleared");
    api->close(st);
}

Test(store, a_forked_child_reopens_its_own_handles)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1), k2 = key(2, 1);
    put_str(st, &k, NULL, "before fork");
    drain(st);
    drop_hot();
    expect_body(st, &k, "before fork"); /* the parent's secondary is open */
    pid_t pid = fork();
    if (pid == 0) {
        api->after_fork_child(st);
        void *b;
        size_t n;
        int ok = api->get(st, NS, &k, &b, &n, NULL) == 0 && n == 11;
        kc_key ck = key(2, 1);
        ok = ok && api->put(st, NS, &ck, NULL, KC_KIND_BLOB, "child", 5, 0) == 0;
        api->close(st);
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    expect_body(st, &k2, "child");
    expect_body(st, &k, "before fork");
    api->close(st);
}

/* Entries of DIR/sec: one directory per open reader. */
static int sec_entries(void)
{
    char p[300];
    snprintf(p, sizeof p, "%s/sec", dir);
    DIR *d = opendir(p);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A child that opens the store, reads k through a reader, and leaves by
 * _exit (as if killed: nothing runs), by exit, or after closing. */
static void reader_child(const kc_key *k, int how)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
        struct kc_store *st = NULL;
        void *b = NULL;
        size_t n = 0;
        int ok = S->open(&o, &st) == 0 && api->get(st, NS, k, &b, &n, NULL) == 0;
        if (how == 2)
            api->close(st);
        if (how == 1)
            exit(ok ? 0 : 1);
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

Test(store, reader_directories_of_gone_processes_are_swept)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1);
    put_str(st, &k, NULL, "swept");
    drain(st);
    api->close(st);
    drop_hot(); /* each child reads k through a reader */
    cr_assert_eq(sec_entries(), 0);
    reader_child(&k, 0); /* killed: its directory stays */
    cr_assert_eq(sec_entries(), 1);
    reader_child(&k, 0); /* sweeps the first, leaves its own */
    cr_assert_eq(sec_entries(), 1);
    reader_child(&k, 2); /* sweeps that, removes its own on close */
    cr_assert_eq(sec_entries(), 0);
    reader_child(&k, 1); /* exit() removes its own too */
    cr_assert_eq(sec_entries(), 0);

    /* A directory whose pid is gone but that someone holds (a reader in
     * another pid namespace) is kept; once let go, it is swept. */
    pid_t gone = fork();
    if (gone == 0)
        _exit(0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    char held[400];
    snprintf(held, sizeof held, "%s/sec/%d-held", dir, (int)gone);
    cr_assert_eq(mkdir(held, 0700), 0);
    int fd = kc__dir_hold(held);
    cr_assert_geq(fd, 0);
    reader_child(&k, 0);
    cr_assert_eq(sec_entries(), 2, "the held directory and the killed child's");
    close(fd);
    reader_child(&k, 2);
    cr_assert_eq(sec_entries(), 0);
}

Test(store, disk_bytes_tell_reserved_space_apart)
{
    char p[300];
    snprintf(p, sizeof p, "%s/f", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "0123456789", 10), 10);
    uint64_t r = 1;
    uint64_t plain = kc__du(dir, &r);
    cr_assert_eq(r, 0, "nothing reserved yet: %llu", (unsigned long long)r);
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) != 0) {
        close(fd);
        cr_skip_test("fallocate: %s", strerror(errno));
    }
    uint64_t now = kc__du(dir, &r);
    close(fd);
    cr_assert_geq(now, plain + (1 << 20) - 8192);
    cr_assert_geq(r, (1 << 20) - 4096, "reserved %llu", (unsigned long long)r);
    cr_assert_leq(r, now);
}

Test(store, parse_record_takes_any_bytes)
{
    unsigned char rec[KC__HDR_LEN + 100];
    struct kc__hdr h = {.kind = KC_KIND_NVRTC, .format = KC_FORMAT_VERSION, .body_size = 100};
    memset(rec + KC__HDR_LEN, 'x', 100);
    h.body_xxh = kc__body_xxh(rec + KC__HDR_LEN, 100);
    kc__hdr_encode(&h, rec);
    struct kc_record_info info;
    const void *body;
    size_t blen;
    cr_assert_eq(adm->parse_record(rec, sizeof rec, &info, &body, &blen), 0);
    cr_assert_eq(blen, 100);
    cr_assert_eq(body, rec + KC__HDR_LEN);
    for (size_t i = 0; i < sizeof rec; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            rec[i] ^= (unsigned char)(1 << bit);
            cr_assert_eq(adm->parse_record(rec, sizeof rec, &info, &body, &blen), -EBADMSG,
                         "flipped byte %zu accepted", i);
            rec[i] ^= (unsigned char)(1 << bit);
        }
    }
    for (size_t n = 0; n < sizeof rec; n++)
        cr_assert_eq(adm->parse_record(rec, n, &info, &body, &blen), -EBADMSG);
    cr_assert_eq(adm->parse_record(NULL, 0, &info, &body, &blen), -EBADMSG);
    uint64_t s = 1;
    unsigned char junk[512];
    for (int t = 0; t < 2000; t++) {
        size_t n = ptxgen_next(&s) % sizeof junk;
        for (size_t i = 0; i < n; i++)
            junk[i] = (unsigned char)ptxgen_next(&s);
        cr_assert_eq(adm->parse_record(junk, n, &info, &body, &blen), -EBADMSG);
    }
}

Test(store, bad_arguments_are_refused)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(1, 1);
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, "", &k, &b, &n, NULL), -EINVAL);
    cr_assert_eq(api->get(st, NULL, &k, &b, &n, NULL), -EINVAL);
    char longns[200];
    memset(longns, 'a', sizeof longns - 1);
    longns[sizeof longns - 1] = 0;
    cr_assert_eq(api->put(st, longns, &k, NULL, KC_KIND_BLOB, "x", 1, 0), -EINVAL);
    cr_assert_eq(api->put(st, NS, &k, NULL, 99, "x", 1, 0), -EINVAL);
    cr_assert_eq(api->purge(st, NS, &k), -ENOENT);
    api->close(NULL);
    api->close(st);
}

/* ---- DIR/filter ---------------------------------------------------------- */

Test(store, the_filter_never_says_absent_for_a_key_it_holds)
{
    char path[400];
    snprintf(path, sizeof path, "%s/filter", dir);
    struct kc__filter_ro ro = {0};
    kc_key k = key(1, 1);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &k)), 1, "no filter: maybe");

    struct kc__filter_rw f;
    cr_assert_eq(kc__filter_create(&f, path, 1000), 0);
    for (uint64_t i = 0; i < 5000; i++) {
        kc_key ki = key(i, 7);
        kc__filter_add(&f, kc__fhash_kernel(NS, &ki));
    }
    cr_assert_eq(kc__filter_publish(&f, path), 0);
    for (uint64_t i = 0; i < 5000; i++) {
        kc_key ki = key(i, 7);
        cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &ki)), 1);
    }
    unsigned fp = 0;
    for (uint64_t i = 0; i < 20000; i++) {
        kc_key ki = key(i, 8); /* another build: other keys */
        fp += (unsigned)kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &ki));
    }
    cr_assert_lt(fp, 400, "false positives: %u of 20000", fp);
    kc_digest s = digest("a source");
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_source(NS, &s)), 0);

    /* Bits set in place reach a reader that mapped the file before. */
    kc_key late = key(99999, 1);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &late)), 0);
    kc__filter_add(&f, kc__fhash_kernel(NS, &late));
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &late)), 1);
    kc__filter_close(&f);

    /* A rebuilt filter (new file renamed over) is noticed on an absent
     * answer. */
    cr_assert_eq(kc__filter_create(&f, path, 10), 0);
    kc__filter_add(&f, kc__fhash_source(NS, &s));
    cr_assert_eq(kc__filter_publish(&f, path), 0);
    kc__filter_close(&f);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_source(NS, &s)), 1, "remapped");

    /* Unusable files are "maybe", never "absent". */
    kc__filter_ro_drop(&ro);
    chmod(path, 0620);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &late)), 1, "group-writable");
    chmod(path, 0600);
    truncate(path, 100);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &late)), 1, "truncated");
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, 64 + 64 * 256), 0); /* sparse */
    close(fd);
    cr_assert_eq(kc__filter_maybe(&ro, path, kc__fhash_kernel(NS, &late)), 1, "sparse");
    kc__filter_ro_drop(&ro);
}

Test(store, drained_puts_become_hot_files_and_leave_with_their_entry)
{
    struct kc_store *st = open_at(dir, 0, 0);
    kc_key k = key(21, 1), gone = key(22, 1);
    put_str(st, &k, NULL, "kept");
    put_str(st, &gone, NULL, "purged");
    drain(st);
    char name[40], hk[600], hg[600];
    kc__spool_name(NS, &k, 0, name);
    snprintf(hk, sizeof hk, "%s/hot/%s", dir, name);
    kc__spool_name(NS, &gone, 0, name);
    snprintf(hg, sizeof hg, "%s/hot/%s", dir, name);
    cr_assert_eq(access(hk, F_OK), 0, "hot file of a drained put");
    cr_assert_eq(access(hg, F_OK), 0);
    cr_assert_eq(api->purge(st, NS, &gone), 0);
    drain(st);
    cr_assert_neq(access(hg, F_OK), 0, "a purge removes the hot file");
    expect_miss(st, &gone, "purged");
    /* The filter knows the key, and a hot file that fails its checks is
     * a miss there and removed by the owner. */
    char fpath[400];
    snprintf(fpath, sizeof fpath, "%s/filter", dir);
    struct kc__filter_ro ro = {0};
    cr_assert_eq(kc__filter_maybe(&ro, fpath, kc__fhash_kernel(NS, &k)), 1);
    kc__filter_ro_drop(&ro);
    cr_assert_eq(adm->clear(st), 0);
    cr_assert_neq(access(hk, F_OK), 0, "clear removes hot files");
    cr_assert_eq(kc__filter_maybe(&ro, fpath, kc__fhash_kernel(NS, &k)), 0, "filter rebuilt");
    kc__filter_ro_drop(&ro);
    api->close(st);
}

/* ---- packed hot files ----------------------------------------------------- */

/* Test inputs: PTX-like text, random bytes, runs (matches overlapping their
 * own output at offsets 1 and 3), and a mix. */
static unsigned char *lz4_input(int kind, size_t n, uint64_t seed)
{
    unsigned char *p = malloc(n + 1);
    if (kind == 0) { /* ptxgen writes a whole header: ask for enough */
        char *t = ptxgen(seed, n < 4096 ? 4096 : n);
        memcpy(p, t, n);
        free(t);
        return p;
    }
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        switch (kind) {
        case 1:
            p[i] = (unsigned char)s;
            break;
        case 2:
            p[i] = 'a';
            break;
        case 3:
            p[i] = "xyz"[i % 3];
            break;
        default:
            p[i] = (i / 97) % 2 ? (unsigned char)s : (unsigned char)('A' + i % 7);
            break;
        }
    }
    return p;
}

Test(store, lz4_blocks_unpack_as_liblz4_packed_them)
{
    static const size_t sizes[] = {0, 1, 5, 12, 13, 100, 4096, 65543, 300000};
    int cases = 0;
    for (int kind = 0; kind < 5; kind++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int hc = 0; hc < 2; hc++) {
                size_t n = sizes[si];
                unsigned char *src = lz4_input(kind, n, 1000 + si);
                int bound = LZ4_compressBound((int)n);
                char *z = malloc((size_t)bound);
                int zn = hc ? LZ4_compress_HC((const char *)src, z, (int)n, bound, 12)
                            : LZ4_compress_default((const char *)src, z, (int)n, bound);
                cr_assert_gt(zn, 0);
                unsigned char *out = malloc(n + 2);
                cr_assert_eq(kc__lz4_unpack(z, (size_t)zn, out, n), 0, "kind %d size %zu hc %d",
                             kind, n, hc);
                cr_assert_eq(memcmp(out, src, n), 0, "kind %d size %zu hc %d", kind, n, hc);
                /* Any other size is refused, and so is every strict prefix. */
                cr_assert_eq(kc__lz4_unpack(z, (size_t)zn, out, n + 1), -EBADMSG);
                if (n > 0)
                    cr_assert_eq(kc__lz4_unpack(z, (size_t)zn, out, n - 1), -EBADMSG);
                size_t step = zn > 2000 ? (size_t)zn / 500 : 1;
                for (size_t cut = 0; cut < (size_t)zn; cut += step)
                    cr_assert_eq(kc__lz4_unpack(z, cut, out, n), -EBADMSG, "prefix %zu", cut);
                /* Flipped bytes: refused or some output, never out of bounds
                 * (the fuzz target checks the bounds under ASan). */
                uint64_t r = 77 + n;
                for (int f = 0; f < 200 && zn > 0; f++) {
                    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                    size_t at = (size_t)(r % (uint64_t)zn);
                    unsigned char was = (unsigned char)z[at];
                    z[at] = (char)(was ^ (1u << (r >> 40) % 8));
                    int rc = kc__lz4_unpack(z, (size_t)zn, out, n);
                    cr_assert(rc == 0 || rc == -EBADMSG);
                    z[at] = (char)was;
                }
                free(out);
                free(z);
                free(src);
                cases++;
            }
    cr_assert_eq(cases, 90);
    /* Blocks no encoder writes. */
    unsigned char o[64];
    static const struct {
        const char *b;
        size_t n, cap;
    } bad[] = {
        {"\x10"
         "a\x00\x00\x00",
         5, 5}, /* offset 0 */
        {"\x10"
         "a\x02\x00\x00",
         5, 5}, /* offset past the output */
        {"\x10"
         "a\x01\x00",
         4, 5}, /* no last (literals only) sequence */
        {"\x1f"
         "a\x01\x00\xff\xff",
         6, 64},             /* match length continued past the end */
        {"\xf0\xff", 2, 64}, /* literal length continued past the end */
        {"\x10"
         "a\x01",
         3, 5}, /* offset cut short */
        {"\x10"
         "a\x01\x00\x00",
         5, 4},     /* match past cap */
        {"", 0, 0}, /* no token at all */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(kc__lz4_unpack(bad[i].b, bad[i].n, o, bad[i].cap), -EBADMSG, "case %zu", i);
    /* And what they look like when right: literal "a", then 4 more. */
    cr_assert_eq(kc__lz4_unpack("\x10"
                                "a\x01\x00\x00",
                                5, o, 5),
                 0);
    cr_assert_eq(memcmp(o, "aaaaa", 5), 0);
}

/* The packed put file of a plain put with body `b` (n bytes). */
static struct kc__buf packed_put(const kc_key *k, const unsigned char *b, size_t n)
{
    struct kc__sp_put sp = {.key = *k, .body = b, .body_len = n};
    snprintf(sp.ns, sizeof sp.ns, "%s", NS);
    sp.hdr = (struct kc__hdr){.kind = KC_KIND_NVRTC,
                              .format = KC_FORMAT_VERSION,
                              .body_size = n,
                              .created_ns = 1700000000000000000ull,
                              .body_xxh = kc__body_xxh(b, n)};
    char *z = malloc((size_t)LZ4_compressBound((int)n));
    int zn = LZ4_compress_default((const char *)b, z, (int)n, LZ4_compressBound((int)n));
    struct kc__buf out = {0};
    cr_assert_eq(kc__spool_put_pack(&out, &sp, z, (size_t)zn), 0);
    free(z);
    return out;
}

Test(store, packed_puts_unpack_to_the_plain_put_and_refuse_any_damage)
{
    kc_key k = key(31, 1);
    size_t n = 20000;
    unsigned char *body = lz4_input(0, n, 5);
    struct kc__buf f = packed_put(&k, body, n);
    cr_assert_lt(f.len, n / 2, "PTX packs to under half (%zu of %zu)", f.len, n);

    unsigned char *file = malloc(f.len);
    memcpy(file, f.p, f.len);
    size_t len = f.len;
    struct kc__sp_put sp;
    cr_assert_eq(kc__put_decode_any(&file, &len, &sp), 0);
    cr_assert_eq(sp.body_len, n);
    cr_assert_eq(memcmp(sp.body, body, n), 0);
    cr_assert_str_eq(sp.ns, NS);
    cr_assert_eq(memcmp(&sp.key, &k, sizeof k), 0);
    free(file);
    /* A packed file is not a put the owner drains from the spool. */
    cr_assert_eq(kc__spool_put_decode(f.p, f.len, &sp), -EBADMSG);

    /* Any flipped bit: the file checksum. */
    for (size_t at = 0; at < f.len; at += 37) {
        file = malloc(f.len);
        memcpy(file, f.p, f.len);
        file[at] ^= 0x10;
        len = f.len;
        cr_assert_eq(kc__put_decode_any(&file, &len, &sp), -EBADMSG, "byte %zu", at);
        free(file);
    }
    /* Damage behind a good file checksum: the packed bytes (the body
     * checksum, or the size), the body size, the body checksum. */
    size_t hdr_at = KC__SPOOL_HDR + 8 + KC__KEY_LEN + 16 + strlen(NS);
    for (int how = 0; how < 4; how++) {
        struct kc__buf g = {0};
        kc__buf_add(&g, f.p, f.len);
        if (how == 0)
            g.p[g.len - 40] ^= 0x01; /* packed bytes */
        if (how == 3)
            g.p[g.len - 1] = (unsigned char)(g.p[g.len - 1] + 1); /* last literal */
        if (how == 1 || how == 2) { /* body size: one more, or past LZ4's 255:1 */
            struct kc__hdr h;
            cr_assert_eq(kc__hdr_decode(f.p + hdr_at, KC__HDR_LEN, &h), 0);
            h.body_size = how == 1 ? n + 1 : (uint64_t)(g.len - hdr_at) * 300;
            kc__hdr_encode(&h, g.p + hdr_at);
        }
        kc__spool_end(&g); /* the file checksum made right again */
        len = g.len;
        file = g.p;
        cr_assert_eq(kc__put_decode_any(&file, &len, &sp), -EBADMSG, "damage %d", how);
        free(file);
    }
    kc__buf_free(&f);
    free(body);
}

/* The hot file of k: its bytes (malloc'd) and mode, or NULL. */
static unsigned char *hot_file(const kc_key *k, size_t *len, mode_t *mode)
{
    char name[40], path[600];
    kc__spool_name(NS, k, 0, name);
    snprintf(path, sizeof path, "%s/hot/%s", dir, name);
    struct stat sb;
    unsigned char *f = NULL;
    if (lstat(path, &sb) != 0 || kc__read_file(AT_FDCWD, path, 1 << 24, &f, len) != 0)
        return NULL;
    *mode = sb.st_mode & 0777;
    return f;
}

Test(store, past_their_bound_the_oldest_hot_files_are_packed_then_removed)
{
    /* Tables far under 2 MiB: DIR/hot is bounded by KC__HOT_MIN. Puts of
     * ~20 KB of PTX-like text, drained in small batches, oldest first. */
    struct kc_store *st = open_at(dir, 0, 0);
    enum { N = 120 };
    size_t n = 20000;
    unsigned char *bodies[N];
    for (int i = 0; i < N; i++) {
        kc_key k = key(1000 + (uint64_t)i, 1);
        bodies[i] = lz4_input(0, n, 100 + (uint64_t)i);
        cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, bodies[i], n, 1), 0);
        if (i % 10 == 9)
            drain(st);
    }
    struct kc__paths p;
    kc__paths_init(&p, dir);
    uint64_t reserved;
    uint64_t hot = kc__du(p.hot, &reserved);
    cr_assert_leq(hot, KC__HOT_MIN + 64 * 1024, "DIR/hot within its bound: %llu",
                  (unsigned long long)hot);
    int plain = 0, packed = 0, gone = 0, last_state = 0, order_ok = 1, batch_min = 2, batch_max = 0;
    for (int i = 0; i < N; i++) {
        kc_key k = key(1000 + (uint64_t)i, 1);
        size_t len;
        mode_t mode;
        unsigned char *f = hot_file(&k, &len, &mode);
        /* Oldest first: removed, then packed, then plain; never back. The
         * puts of one drain may share an mtime (the clock's tick): order
         * is checked between drains. */
        int state = f == NULL ? 0 : f[4] == KC__SP_PACKED ? 1 : 2;
        if (i % 10 == 0)
            batch_min = 2, batch_max = 0;
        batch_min = state < batch_min ? state : batch_min;
        batch_max = state > batch_max ? state : batch_max;
        if (i % 10 == 9) {
            order_ok &= batch_min >= last_state;
            last_state = batch_max;
        }
        if (f == NULL) {
            gone++;
            continue;
        }
        if (state == 1) {
            packed++;
            cr_assert(mode == 0400 && len < n / 2, "packed: mode %o, %zu bytes", mode, len);
        } else {
            plain++;
            cr_assert(mode == 0600 && len > n, "plain: mode %o", mode);
        }
        free(f);
        void *body;
        size_t blen;
        struct kc__hdr h;
        cr_assert_eq(kc__files_lookup(&p, NS, &k, &body, &blen, &h), 0, "entry %d", i);
        cr_assert(blen == n && memcmp(body, bodies[i], n) == 0, "entry %d reads back", i);
        free(body);
    }
    printf("hot after %d puts: %d gone, %d packed, %d plain, %llu bytes\n", N, gone, packed, plain,
           (unsigned long long)hot);
    cr_assert(order_ok, "recency order kept: %d gone, %d packed, %d plain", gone, packed, plain);
    cr_assert(gone > 0 && packed > 0 && plain > 0, "%d gone, %d packed, %d plain", gone, packed,
              plain);
    /* Everything is still a hit, hot or not. */
    for (int i = 0; i < N; i += 7) {
        kc_key k = key(1000 + (uint64_t)i, 1);
        void *b;
        size_t bl;
        cr_assert_eq(api->get(st, NS, &k, &b, &bl, NULL), 0);
        cr_assert(bl == n && memcmp(b, bodies[i], n) == 0);
        api->free(b);
    }
    /* A killed owner's temp file in DIR/hot goes at the next session. */
    char stray[4300];
    snprintf(stray, sizeof stray, "%s/t-999999999-1-0123456789abcdef", p.hot);
    int fd = open(stray, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert(fd >= 0);
    close(fd);
    kc_key k = key(5000, 1);
    put_str(st, &k, NULL, "again");
    drain(st);
    cr_assert_neq(access(stray, F_OK), 0, "stray temp file removed");
    api->close(st);
    for (int i = 0; i < N; i++)
        free(bodies[i]);
}

Test(store, the_newest_big_hot_file_stays_past_a_small_stores_bound)
{
    /* A small store (its bound the floor, KC__HOT_MIN) whose newest entry
     * is one of libmathdx's 2 MiB LTO-IR records: that one stays plain in
     * DIR/hot, so a fresh process reads it without RocksDB (issue 50); the
     * older small ones are bounded as before. */
    struct kc_store *st = open_at(dir, 0, 0);
    enum { N = 60 };
    size_t n = 20000, big = 2u << 20;
    for (int i = 0; i < N; i++) {
        kc_key k = key(2000 + (uint64_t)i, 1);
        unsigned char *b = lz4_input(0, n, 300 + (uint64_t)i);
        cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_NVRTC, b, n, 1), 0);
        free(b);
        if (i % 10 == 9)
            drain(st);
    }
    kc_key kb = key(3000, 1);
    unsigned char *bb = lz4_input(0, big, 77);
    cr_assert_eq(api->put(st, NS, &kb, NULL, KC_KIND_NVRTC, bb, big, 1), 0);
    drain(st);
    struct kc__paths p;
    kc__paths_init(&p, dir);
    for (int round = 0; round < 2; round++) {
        size_t len;
        mode_t mode;
        unsigned char *f = hot_file(&kb, &len, &mode);
        cr_assert_not_null(f, "round %d: the newest entry (2 MiB) is not hot", round);
        cr_assert(mode == 0600 && len > big, "round %d: not plain: mode %o, %zu bytes", round, mode,
                  len);
        free(f);
        uint64_t reserved;
        uint64_t hot = kc__du(p.hot, &reserved);
        cr_assert_leq(hot, KC__HOT_MIN + big + 128 * 1024, "round %d: DIR/hot %llu bytes", round,
                      (unsigned long long)hot);
        /* A later drain keeps it. */
        kc_key k = key(4000 + (uint64_t)round, 1);
        put_str(st, &k, NULL, "later");
        drain(st);
    }
    void *b;
    size_t bl;
    cr_assert_eq(api->get(st, NS, &kb, &b, &bl, NULL), 0);
    cr_assert(bl == big && memcmp(b, bb, big) == 0);
    api->free(b);
    api->close(st);
    free(bb);
}

Test(store, a_symlinked_subdirectory_is_refused)
{
    char hot[400], other[400];
    snprintf(hot, sizeof hot, "%s/hot", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    cr_assert_eq(mkdir(other, 0700), 0);
    cr_assert_eq(symlink(other, hot), 0);
    /* A store (spool/ made first, as every writer does): a directory of
     * other things is refused before its subdirectories are looked at. */
    char spool[400];
    snprintf(spool, sizeof spool, "%s/spool", dir);
    cr_assert_eq(mkdir(spool, 0700), 0);
    struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(S->open(&o, &st), -ENOTDIR);
    cr_assert_eq(kc__private_subdir(hot, true), -ENOTDIR);
    cr_assert_eq(kc__private_dir(hot, true), 0, "the cache directory itself may be a link");
}

/* Sorted runs of a column family (each L0 table one, each deeper level with
 * tables one), read from the database as it is on disk. */
static int cf_runs_on_disk(const char *d, const char *cf)
{
    char path[300];
    snprintf(path, sizeof path, "%s/db", d);
    const char *names[KC__N_CF] = {"default", "kernels", "bodies", "sources", "meta"};
    rocksdb_options_t *o = rocksdb_options_create();
    const rocksdb_options_t *co[KC__N_CF];
    rocksdb_column_family_handle_t *h[KC__N_CF];
    for (int i = 0; i < KC__N_CF; i++)
        co[i] = o;
    char *err = NULL;
    rocksdb_t *db =
        rocksdb_open_for_read_only_column_families(o, path, KC__N_CF, names, co, h, 0, &err);
    cr_assert_null(err, "open %s: %s", path, err);
    int runs = -1;
    for (int i = 0; i < KC__N_CF; i++) {
        uint64_t r, l0;
        if (strcmp(names[i], cf) == 0) {
            cr_assert(kc__db_cf_runs(db, h[i], &r, &l0));
            runs = (int)r;
        }
        rocksdb_column_family_handle_destroy(h[i]);
    }
    rocksdb_close(db);
    rocksdb_options_destroy(o);
    return runs;
}

Test(store, a_session_leaves_a_small_store_in_one_run)
{
    /* Three sessions, each flushing its own L0 table (under RocksDB's
     * trigger of four, so nothing compacts them on its own): a get would
     * probe all three. Each session ends by settling them into one. */
    struct kc_store *st = open_at(dir, 0, 0);
    char body[64];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 20; i++) {
            kc_key k = key(100 * round + i, 1);
            snprintf(body, sizeof body, "body %d of round %d", i, round);
            put_str(st, &k, NULL, body);
        }
        drain(st);
        cr_assert_eq(cf_runs_on_disk(dir, "bodies"), 1, "bodies after session %d", round);
        cr_assert_eq(cf_runs_on_disk(dir, "kernels"), 1, "kernels after session %d", round);
    }
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 20; i++) {
            kc_key k = key(100 * round + i, 1);
            snprintf(body, sizeof body, "body %d of round %d", i, round);
            expect_body(st, &k, body);
        }
    }
    api->close(st);
}

/* Bytes of the put files in DIR/spool. */
static uint64_t spool_put_bytes(void)
{
    char sp[400];
    snprintf(sp, sizeof sp, "%s/spool", dir);
    DIR *d = opendir(sp);
    cr_assert_not_null(d);
    uint64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat sb;
        if (strncmp(e->d_name, "p-", 2) == 0 && fstatat(dirfd(d), e->d_name, &sb, 0) == 0)
            n += (uint64_t)sb.st_size;
    }
    closedir(d);
    return n;
}

Test(store, without_an_owner_the_spool_stays_within_the_size_limit)
{
    /* The tool (/bin/true) starts no owner: nothing drains the spool. */
    const uint64_t limit = 16 << 10;
    struct kc_store *st = open_at(dir, 0, limit);
    char body[1000];
    memset(body, 'x', sizeof body);
    int stored = 0, skipped = 0;
    for (int i = 0; i < 64; i++) {
        kc_key k = key(100 + i, 1);
        body[0] = (char)i;
        int rc = api->put(st, NS, &k, NULL, KC_KIND_BLOB, body, sizeof body, 0);
        if (rc == 0)
            stored++;
        else
            skipped++;
        cr_assert(rc == 0 || rc == -EDQUOT, "put %d: %s", i, strerror(-rc));
    }
    cr_assert_gt(stored, 8);
    cr_assert_gt(skipped, 0);
    cr_assert_leq(spool_put_bytes(), limit, "spool %llu bytes",
                  (unsigned long long)spool_put_bytes());
    /* Another handle (another process) finds it full at its first put. */
    struct kc_store *st2 = open_at(dir, 0, limit);
    kc_key k = key(999, 1);
    cr_assert_eq(api->put(st2, NS, &k, NULL, KC_KIND_BLOB, body, sizeof body, 0), -EDQUOT);
    api->close(st2);
    /* Drained, the spool takes puts again, and what was stored reads back. */
    drain(st);
    cr_assert_eq(spool_put_bytes(), 0);
    st2 = open_at(dir, 0, limit);
    cr_assert_eq(api->put(st2, NS, &k, NULL, KC_KIND_BLOB, body, sizeof body, 0), 0);
    kc_key first = key(100, 1);
    void *p;
    size_t n;
    cr_assert_eq(api->get(st2, NS, &first, &p, &n, NULL), 0);
    api->free(p);
    api->close(st2);
    api->close(st);
}
