/*
 * test_meta.c: the database's byte layout (store/db/meta.h), in one
 * process (suite `store`).
 *
 * The helpers must write the bytes meta.h documents, and every key an
 * owner session writes must be of a kind meta.h documents, with the value
 * that kind has: a key the owner starts writing without meta.h saying so
 * fails here, and so does a reader (stats) that counts other than the
 * owner wrote.
 */
#include "internal.h"
#include "store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp[256];

static void make_dir(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/kc-meta-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(tmp));
    chmod(tmp, 0700);
}

static void remove_dir(void)
{
    kc__rm_rf(tmp);
}

TestSuite(meta, .init = make_dir, .fini = remove_dir, .timeout = 60);

/* 16 bytes 0x10, 0x11, ... */
static void sample_digest(unsigned char d[16])
{
    for (int i = 0; i < 16; i++)
        d[i] = (unsigned char)(0x10 + i);
}

static const unsigned char U64_0102[8] = {8, 7, 6, 5, 4, 3, 2, 1}; /* 0x0102030405060708 */

Test(meta, refcount_keys_and_values_are_the_documented_bytes)
{
    unsigned char d[16], k[KC__META_REF_KEY_LEN], v[KC__META_REF_VAL_LEN];
    sample_digest(d);
    cr_assert_eq(kc__meta_ref_key(d, k), 18);
    cr_assert_eq(memcmp(k, "r/", 2), 0);
    cr_assert_eq(memcmp(k + 2, d, 16), 0);
    cr_assert(kc__meta_is(k, sizeof k, KC__META_REF_PREFIX));
    cr_assert(!kc__meta_is(k, sizeof k, KC__META_COUNTERS_PREFIX));
    cr_assert(!kc__meta_is(k, 1, KC__META_REF_PREFIX), "a key shorter than the prefix");

    kc__meta_ref_value(3, 0x0102030405060708ull, v);
    static const unsigned char three[8] = {3};
    cr_assert_eq(memcmp(v, three, 8), 0, "refcount first, little-endian");
    cr_assert_eq(memcmp(v + 8, U64_0102, 8), 0, "then the body size, little-endian");
    uint64_t n = 0, size = 0;
    cr_assert_eq(kc__meta_ref_parse(v, sizeof v, &n, &size), 0);
    cr_assert_eq(n, 3);
    cr_assert_eq(size, 0x0102030405060708ull);
    n = size = 77;
    cr_assert_eq(kc__meta_ref_parse(v, sizeof v - 1, &n, &size), -EBADMSG);
    cr_assert_eq(kc__meta_ref_parse(v, sizeof v + 1, &n, &size), -EBADMSG);
    cr_assert(n == 77 && size == 77, "a refused value leaves the outputs alone");
}

Test(meta, counters_namespace_and_generation_are_the_documented_bytes)
{
    unsigned char k[KC__META_NAME_KEY_MAX];
    size_t kl = kc__meta_counters_key("nvrtc", k);
    cr_assert_eq(kl, 7);
    cr_assert_eq(memcmp(k, "b/nvrtc", 7), 0);
    char name[32];
    cr_assert_eq(kc__meta_counters_name(k, kl, name, sizeof name), 0);
    cr_assert_str_eq(name, "nvrtc");
    cr_assert_eq(kc__meta_counters_name(k, 2, name, sizeof name), -EBADMSG, "no name");
    cr_assert_eq(kc__meta_counters_name(k, kl, name, 5), -EBADMSG, "a name too long for cap");
    cr_assert_eq(kc__meta_counters_name("r/nvrtc", 7, name, sizeof name), -EBADMSG);

    uint64_t c[KC_N_COUNTERS], back[KC_N_COUNTERS];
    unsigned char v[KC__META_COUNTERS_VAL_LEN];
    cr_assert_eq(sizeof v, 8 * KC_N_COUNTERS);
    for (int i = 0; i < KC_N_COUNTERS; i++)
        c[i] = 0x0102030405060708ull + (uint64_t)i * 0x100;
    kc__meta_counters_value(c, v);
    for (int i = 0; i < KC_N_COUNTERS; i++) {
        cr_assert_eq(v[8 * i], 8, "counter %d starts with its low byte", i);
        cr_assert_eq(v[8 * i + 1], 7 + i, "counter %d, second byte", i);
        cr_assert_eq(memcmp(v + 8 * i + 2, U64_0102 + 2, 6), 0, "counter %d", i);
    }
    cr_assert_eq(kc__meta_counters_parse(v, sizeof v, back), 0);
    cr_assert_eq(memcmp(back, c, sizeof c), 0);
    cr_assert_eq(kc__meta_counters_parse(v, sizeof v - 8, back), -EBADMSG);

    kl = kc__meta_ns_key("nvrtc/sm_90", k);
    cr_assert_eq(kl, 13);
    cr_assert_eq(memcmp(k, "n/nvrtc/sm_90", 13), 0);
    cr_assert(kc__meta_is(k, kl, KC__META_NS_PREFIX));

    unsigned char g[KC__META_GEN_VAL_LEN];
    kc__meta_gen_value(0x0102030405060708ull, g);
    cr_assert_eq(memcmp(g, U64_0102, 8), 0);
    cr_assert_eq(strlen(KC__META_GEN_KEY), 1);
}

Test(meta, kernels_values_and_sources_keys_decode_only_their_layout)
{
    struct kc__hdr h = {.kind = KC_KIND_BLOB,
                        .format = KC_FORMAT_VERSION,
                        .body_size = 5,
                        .created_ns = 11,
                        .last_hit_ns = 12,
                        .hits = 13,
                        .saved_ns = 14,
                        .body_xxh = kc__body_xxh("hello", 5)};
    unsigned char d[16], v[KC__KVAL_LEN + 1];
    sample_digest(d);
    kc__kval_encode(&h, d, v);
    cr_assert_eq(memcmp(v + KC__HDR_LEN, d, 16), 0, "the body digest follows the header");
    struct kc__hdr got;
    cr_assert_eq(kc__kval_decode(v, KC__KVAL_LEN, &got), 0);
    cr_assert(got.created_ns == 11 && got.hits == 13 && got.body_xxh == h.body_xxh);
    cr_assert_eq(kc__kval_digest(v, KC__KVAL_LEN), v + KC__HDR_LEN);
    cr_assert_eq(kc__kval_decode(v, KC__KVAL_LEN + 1, &got), -EBADMSG);
    cr_assert_eq(kc__kval_decode(v, KC__KVAL_LEN - 1, &got), -EBADMSG);
    cr_assert_null(kc__kval_digest(v, KC__KVAL_LEN - 1));
    v[20] ^= 1; /* the header's checksum fails */
    cr_assert_eq(kc__kval_decode(v, KC__KVAL_LEN, &got), -EBADMSG);

    kc_digest src = kc_digest_of("source", 6), sgot;
    unsigned char sk[KC__NS_MAX + 1 + 16 + 1];
    size_t sl = kc__skey("nvrtc/sm_90", &src, sk);
    char ns[KC__NS_MAX + 1];
    cr_assert_eq(kc__skey_split(sk, sl, ns, &sgot), 0);
    cr_assert_str_eq(ns, "nvrtc/sm_90");
    cr_assert_eq(memcmp(&sgot, &src, sizeof src), 0);
    cr_assert_eq(kc__skey_split(sk, sl - 1, ns, &sgot), -EBADMSG, "a short digest");
    sk[sl] = 0;
    cr_assert_eq(kc__skey_split(sk, sl + 1, ns, &sgot), -EBADMSG, "a long digest");
    cr_assert_eq(kc__skey_split(sk + 11, sl - 11, ns, &sgot), -EBADMSG, "an empty namespace");
    unsigned char long_ns[KC__NS_MAX + 2 + 16];
    memset(long_ns, 'a', sizeof long_ns);
    long_ns[KC__NS_MAX + 1] = 0;
    cr_assert_eq(kc__skey_split(long_ns, sizeof long_ns, ns, &sgot), -EBADMSG, "128 bytes");
}

/* ---- what a session writes ------------------------------------------------ */

static const char *NS_A = "nvrtc/sm_90/a", *NS_B = "jit/sm_90/b";

static kc_key mkkey(uint64_t id)
{
    return (kc_key){.id = {.lo = id, .hi = id * 3}, .build = 7};
}

static int put(struct kc_store *st, const char *ns, uint64_t id, const char *src, const char *body)
{
    kc_key k = mkkey(id);
    kc_digest s = kc_digest_of(src, strlen(src));
    return kc_store_api()->ops->put(st, ns, &k, &s, KC_KIND_BLOB, body, strlen(body), 1);
}

struct seen {
    uint64_t gen, refs_shared, refs_other, unique, n_ref, n_ns, n_counters, nvrtc_hits;
    int ns_a, ns_b;
    int n_applied;
};

static kc_digest stored_digest(const char *body)
{
    struct kc_buf b = {0};
    cr_assert_eq(kc__body_encode(body, strlen(body), NULL, &b), 0);
    kc_digest d = kc_digest_of(b.p, b.len);
    kc_buf_free(&b);
    return d;
}

static void check_meta_entry(const unsigned char *k, size_t kl, const unsigned char *v, size_t vl,
                             struct seen *s)
{
    /* A body's key is the digest of the body as stored (meta.h). */
    kc_digest ds = stored_digest("shared"), dother = stored_digest("other");
    unsigned char shared[16], other[16];
    kc__digest_encode(&ds, shared);
    kc__digest_encode(&dother, other);
    char name[KC__NS_MAX + 1];
    uint64_t n, size, c[KC_N_COUNTERS];
    if (kl == 1 && memcmp(k, KC__META_GEN_KEY, 1) == 0) {
        cr_assert_eq(vl, KC__META_GEN_VAL_LEN);
        s->gen = kc__get_u64(v);
    } else if (kc__meta_is(k, kl, KC__META_REF_PREFIX)) {
        cr_assert_eq(kl, KC__META_REF_KEY_LEN);
        cr_assert_eq(kc__meta_ref_parse(v, vl, &n, &size), 0, "refcount value of %zu bytes", vl);
        s->n_ref++;
        s->unique += size;
        if (memcmp(k + 2, shared, 16) == 0) {
            s->refs_shared = n;
            cr_assert_eq(size, 6);
        }
        if (memcmp(k + 2, other, 16) == 0) {
            s->refs_other = n;
            cr_assert_eq(size, 5);
        }
    } else if (kc__meta_is(k, kl, KC__META_COUNTERS_PREFIX)) {
        cr_assert_eq(kc__meta_counters_name(k, kl, name, sizeof name), 0);
        cr_assert_eq(kc__meta_counters_parse(v, vl, c), 0, "counters value of %zu bytes", vl);
        struct kc_counters cc;
        kc_counters_from_array(&cc, c);
        s->n_counters++;
        if (strcmp(name, "nvrtc") == 0)
            s->nvrtc_hits = cc.hits;
    } else if (kc__meta_is(k, kl, KC__META_DICT_PREFIX)) {
        cr_assert_eq(kl, KC__META_DICT_KEY_LEN);
        cr_assert(vl > 0 && vl <= KC__DICT_BYTES);
        cr_assert_eq(kc__dict_id(v, vl), kc__get_u64(k + 2), "a dictionary under another id");
    } else if (kl == 2 && memcmp(k, KC__META_DICT_CURRENT, 2) == 0) {
        cr_assert_eq(vl, 8);
    } else if (kc__meta_is(k, kl, KC__META_APPLIED_PREFIX)) {
        /* A counter log added up: its name, the time it was. */
        cr_assert(kl > 4 && kl <= KC__META_APPLIED_KEY_MAX && k[2] == 'c' && k[3] == '-');
        cr_assert_eq(vl, 8);
        cr_assert(kc__get_u64(v) > 0 && kc__get_u64(v) <= kc_wall_ns());
        s->n_applied++;
    } else if (kc__meta_is(k, kl, KC__META_NS_PREFIX)) {
        cr_assert_eq(vl, 0);
        cr_assert(kl > 2 && kl - 2 <= KC__NS_MAX);
        memcpy(name, k + 2, kl - 2);
        name[kl - 2] = 0;
        s->n_ns++;
        s->ns_a |= strcmp(name, NS_A) == 0;
        s->ns_b |= strcmp(name, NS_B) == 0;
    } else {
        cr_assert_fail("a META key meta.h does not document: \"%.*s\" (%zu bytes)", (int)kl, k, kl);
    }
}

Test(meta, every_key_a_session_writes_has_its_documented_layout)
{
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    struct kc_store_options opts = {.dir = tmp, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(S->open(&opts, &st), 0);
    cr_assert_eq(put(st, NS_A, 1, "s1", "shared"), 0);
    cr_assert_eq(put(st, NS_A, 2, "s2", "shared"), 0); /* the same body: stored once */
    cr_assert_eq(put(st, NS_B, 3, "s3", "other"), 0);
    cr_assert_eq(adm->drain(st, 5000), 0);
    kc_key k1 = mkkey(1);
    for (int i = 0; i < 2; i++) {
        void *b = NULL;
        size_t n;
        cr_assert_eq(api->get(st, NS_A, &k1, &b, &n, NULL), 0);
        api->free(b);
    }
    struct kc_counters c = {.hits = 2, .misses = 1};
    api->count(st, "nvrtc", &c);
    api->count(st, "jit", &c);
    cr_assert_eq(api->flush(st), 0);
    cr_assert_eq(adm->drain(st, 5000), 0);
    struct kc_store_stats *stats = NULL;
    cr_assert_eq(adm->stats(st, &stats), 0);
    uint64_t stats_unique = stats->unique_bytes, stats_nvrtc_hits = 0;
    for (size_t i = 0; i < stats->n_backends; i++)
        if (strcmp(stats->backends[i].backend, "nvrtc") == 0)
            stats_nvrtc_hits = stats->backends[i].c.hits;
    adm->stats_free(stats);
    api->close(st);

    struct kc__owner *o = NULL;
    cr_assert_eq(kc__owner_begin(tmp, 0, 5000, &o), 0);
    struct kc__db *d = kc__owner_db(o);
    struct seen s = {0};
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_META]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
        check_meta_entry(k, kl, v, vl, &s);
    }
    rocksdb_iter_destroy(it);
    uint64_t gen = 0;
    cr_assert_eq(kc__db_gen_get(d, &gen), 0);
    cr_assert(s.gen > 0 && gen == s.gen, "generation %llu, read back %llu",
              (unsigned long long)s.gen, (unsigned long long)gen);
    cr_assert_eq(s.n_ref, 2);
    cr_assert_eq(s.refs_shared, 2, "two kernels name the shared body");
    cr_assert_eq(s.refs_other, 1);
    cr_assert_eq(s.unique, 11);
    cr_assert_eq(stats_unique, s.unique, "stats read the refcounts the owner wrote");
    cr_assert_eq(s.n_counters, 2);
    cr_assert_eq(s.nvrtc_hits, 2);
    cr_assert_eq(stats_nvrtc_hits, s.nvrtc_hits, "stats read the counters the owner wrote");
    cr_assert(s.n_applied >= 1, "the counter logs added up are marked");
    cr_assert(s.n_ns == 2 && s.ns_a && s.ns_b, "one namespace key each");

    /* kernels: ns \0 key -> header + body digest, the digest refcounted. */
    int kernels = 0;
    it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_KERNELS]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_key key;
        struct kc__hdr h;
        cr_assert_eq(kc__kkey_split(k, kl, ns, &key), 0);
        cr_assert_eq(kc__kval_decode(v, vl, &h), 0);
        unsigned char rk[KC__META_REF_KEY_LEN];
        char *rv;
        size_t rvl;
        cr_assert_eq(
            kc__db_get(d, KC__CF_META, rk, kc__meta_ref_key(kc__kval_digest(v, vl), rk), &rv, &rvl),
            0, "a kernel's body has a refcount");
        free(rv);
        if (key.id.lo == 1)
            cr_assert_eq(h.hits, 2, "hit logs folded into the entry");
        kernels++;
    }
    rocksdb_iter_destroy(it);
    cr_assert_eq(kernels, 3);

    /* sources: ns \0 source digest -> the kernel's key. */
    int sources = 0;
    it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_SOURCES]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
        const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_digest src;
        kc_key key;
        cr_assert_eq(kc__skey_split(k, kl, ns, &src), 0);
        cr_assert_eq(vl, KC__KEY_LEN);
        kc__key_decode(v, &key);
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        char *kv;
        size_t kvl;
        cr_assert_eq(kc__db_get(d, KC__CF_KERNELS, kk, kc__kkey(ns, &key, kk), &kv, &kvl), 0);
        free(kv);
        sources++;
    }
    rocksdb_iter_destroy(it);
    cr_assert_eq(sources, 3);

    /* bodies: digest -> bytes. */
    int bodies = 0;
    it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_BODIES]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        rocksdb_iter_key(it, &kl);
        cr_assert_eq(kl, 16);
        bodies++;
    }
    rocksdb_iter_destroy(it);
    cr_assert_eq(bodies, 2);
    kc__owner_end(o);
}

/* A body of a few KB that looks like PTX, different for every i. */
static char *ptx_like(int i, size_t *n)
{
    struct kc_buf b = {0};
    char line[160];
    int l = snprintf(line, sizeof line, "//\n// kernel %d\n.version 8.8\n.target sm_90\n", i);
    kc_buf_add(&b, line, (size_t)l);
    for (int j = 0; j < 40 + i % 30; j++) {
        l = snprintf(line, sizeof line,
                     "\tld.global.f32 %%f%d, [%%rd%d+%d];\n\tfma.rn.f32 %%f%d, %%f%d, "
                     "%%f%d, 0f3F800000;\n",
                     j, (i * 7 + j) % 13, 4 * j, j + 1, j, (j * i) % 17);
        kc_buf_add(&b, line, (size_t)l);
    }
    kc_buf_add(&b, "\tret;\n}\n", 8);
    *n = b.len;
    return (char *)b.p;
}

Test(meta, a_dictionary_is_trained_named_by_later_bodies_and_cleared)
{
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    struct kc_store_options opts = {.dir = tmp, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(S->open(&opts, &st), 0);
    /* Two rounds: enough samples to train on, then bodies that use it. */
    for (int round = 0; round < 2; round++) {
        for (int i = round * 150; i < (round + 1) * 150; i++) {
            size_t n;
            char *body = ptx_like(i, &n);
            kc_key k = mkkey(1000 + (uint64_t)i);
            cr_assert_eq(api->put(st, NS_A, &k, NULL, KC_KIND_BLOB, body, n, 1), 0);
            free(body);
        }
        cr_assert_eq(adm->drain(st, 5000), 0);
    }
    api->close(st);

    struct kc__owner *o;
    cr_assert_eq(kc__owner_begin(tmp, 0, 5000, &o), 0);
    struct kc__db *d = kc__owner_db(o);
    char *v = NULL;
    size_t vl = 0;
    cr_assert_eq(kc__db_get(d, KC__CF_META, KC__META_DICT_CURRENT, 2, &v, &vl), 0,
                 "no dictionary after 300 bodies");
    cr_assert_eq(vl, 8);
    uint64_t id = kc__get_u64((unsigned char *)v);
    free(v);
    unsigned char dk[KC__META_DICT_KEY_LEN];
    cr_assert_eq(kc__db_get(d, KC__CF_META, dk, kc__meta_dict_key(id, dk), &v, &vl), 0);
    cr_assert_eq(kc__dict_id(v, vl), id);
    free(v);
    int named = 0, plain = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_BODIES]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t bl;
        const char *b = rocksdb_iter_value(it, &bl);
        uint64_t raw, dict;
        int codec;
        cr_assert_eq(kc__body_info(b, bl, &raw, &codec, &dict), 0);
        named += codec == KC__BODY_ZSTD_DICT && dict == id;
        plain += codec == KC__BODY_ZSTD;
    }
    rocksdb_iter_destroy(it);
    cr_assert(named >= 150 && plain > 0, "%d bodies name the dictionary, %d none", named, plain);
    kc__owner_end(o);

    /* A new process's reader loads it and serves every body as put. */
    cr_assert_eq(S->open(&opts, &st), 0);
    for (int i = 0; i < 300; i++) {
        size_t n;
        char *body = ptx_like(i, &n);
        kc_key k = mkkey(1000 + (uint64_t)i);
        void *got = NULL;
        size_t gn = 0;
        cr_assert_eq(api->get(st, NS_A, &k, &got, &gn, NULL), 0, "entry %d", i);
        cr_assert(gn == n && memcmp(got, body, n) == 0, "entry %d: other bytes", i);
        api->free(got);
        free(body);
    }
    /* Clear takes the dictionaries with the entries. */
    cr_assert_eq(adm->clear(st), 0);
    api->close(st);
    cr_assert_eq(kc__owner_begin(tmp, 0, 5000, &o), 0);
    d = kc__owner_db(o);
    cr_assert_eq(kc__db_get(d, KC__CF_META, KC__META_DICT_CURRENT, 2, &v, &vl), -ENOENT);
    cr_assert_eq(kc__db_get(d, KC__CF_META, dk, sizeof dk, &v, &vl), -ENOENT);
    kc__owner_end(o);
}

/* nvrtc's hits as `kcache stats` reads them. */
static uint64_t stats_hits(struct kc_store *st)
{
    const struct kc_store_admin *adm = kc_store_admin();
    struct kc_store_stats *stats = NULL;
    cr_assert_eq(adm->stats(st, &stats), 0);
    uint64_t h = 0;
    for (size_t i = 0; i < stats->n_backends; i++)
        if (strcmp(stats->backends[i].backend, "nvrtc") == 0)
            h = stats->backends[i].c.hits;
    adm->stats_free(stats);
    return h;
}

/* A counter log the owner has added up but not yet unlinked (the moment
 * between its commit and its unlink, or an owner killed there) is counted
 * once: by a reader, and by the owner that drains the spool next. */
Test(meta, a_counter_log_is_counted_once_between_its_commit_and_its_unlink)
{
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    struct kc_store_options opts = {.dir = tmp, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(S->open(&opts, &st), 0);
    cr_assert_eq(put(st, NS_A, 1, "s1", "shared"), 0);
    cr_assert_eq(adm->drain(st, 5000), 0);
    api->count(st, "nvrtc", &(struct kc_counters){.hits = 3});
    cr_assert_eq(api->flush(st), 0);

    /* The log, kept aside, then put back after the drain unlinked it. */
    char spool[512], saved[512], logname[256] = "";
    snprintf(spool, sizeof spool, "%s/spool", tmp);
    DIR *d = opendir(spool);
    cr_assert(d != NULL);
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] == 'c' && de->d_name[1] == '-')
            snprintf(logname, sizeof logname, "%s", de->d_name);
    closedir(d);
    cr_assert(logname[0] != '\0', "the count was logged to the spool");
    char from[800], cmd[2000];
    snprintf(from, sizeof from, "%s/%s", spool, logname);
    snprintf(saved, sizeof saved, "%s/saved-log", tmp);
    snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", from, saved);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(stats_hits(st), 3, "the log alone, before any drain");
    cr_assert_eq(adm->drain(st, 5000), 0);
    cr_assert_eq(stats_hits(st), 3, "the database alone, after the drain");
    cr_assert_eq(access(from, F_OK), -1, "the drain unlinked the log");

    snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", saved, from);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(stats_hits(st), 3, "a log in the database and still in the spool: counted once");
    cr_assert_eq(adm->drain(st, 5000), 0);
    cr_assert_eq(access(from, F_OK), -1, "the next drain unlinked it");
    cr_assert_eq(stats_hits(st), 3, "an owner draining it again adds it up once");
    api->close(st);
}
