/*
 * test_tier.c: the store as a chain of tiers (store/tier.h,
 * store/local/chain.h), suite `store`.
 *
 * The chain is driven with fake tiers behind its local one, so each of its
 * rules is seen on its own: the order of the tiers, the fill back, the
 * tombstones, the report of a bad record, the move of an earlier build's
 * entry, hits noted once, fork and close reaching every tier. Then the
 * store library's own chain: a damaged hot file is reported by the
 * library as by the shim's front (one code path now; the library used to
 * read the database first and never looked at the hot file).
 */
#include "internal.h"
#include "store.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static const char *NS = "nvrtc/sm_90/tier";

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kc-tier-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0700);
}

static void teardown(void)
{
    kc__rm_rf(dir);
}

TestSuite(tier, .init = setup, .fini = teardown, .timeout = 60);

static kc_key key(uint64_t id, uint64_t build)
{
    return (kc_key){.id = {.lo = id, .hi = ~id}, .build = build};
}

/* ---- a fake tier ----------------------------------------------------------- */

struct fake {
    struct kc_tier base;
    /* What it holds: one entry, and one source -> key. */
    int holds;
    kc_key key;
    const char *body;
    int bad; /* its record fails its checks */
    int has_source;
    kc_digest source;
    kc_key source_key;
    /* What was asked of it. */
    int gets, puts, purges, takes, flushes, forks, closes;
};

#define FK(t) ((struct fake *)(t))

static int fake_get(struct kc_tier *t, const char *ns, const kc_key *k, void **body, size_t *len,
                    struct kc_record_info *info)
{
    struct fake *f = FK(t);
    f->gets++;
    if (!f->holds || memcmp(k, &f->key, sizeof *k) != 0)
        return -ENOENT;
    if (f->bad)
        return -EBADMSG;
    *len = strlen(f->body);
    *body = strdup(f->body);
    if (info != NULL)
        *info = (struct kc_record_info){
            .kind = KC_KIND_BLOB, .format = KC_FORMAT_VERSION, .body_size = *len, .saved_ns = 7};
    return 0;
}

static int fake_purge(struct kc_tier *t, const char *ns, const kc_key *k)
{
    FK(t)->purges++;
    return 0;
}

static int fake_take(struct kc_tier *t, const char *ns, const kc_digest *src, kc_key *found)
{
    struct fake *f = FK(t);
    f->takes++;
    if (!f->has_source || memcmp(src, &f->source, sizeof *src) != 0)
        return -ENOENT;
    *found = f->source_key;
    return 0;
}

static int fake_flush(struct kc_tier *t)
{
    FK(t)->flushes++;
    return 0;
}

static void fake_after_fork(struct kc_tier *t)
{
    FK(t)->forks++;
}

static void fake_close(struct kc_tier *t)
{
    FK(t)->closes++;
}

static const struct kc_tier_ops fake_ops = {
    .name = "fake",
    .get = fake_get,
    .purge = fake_purge,
    .take_by_source = fake_take,
    .flush = fake_flush,
    .after_fork = fake_after_fork,
    .close = fake_close,
};

static struct kc_store *chain(void)
{
    struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(kc__chain_open(&o, NULL, 0, &st), 0);
    cr_assert_eq(st->n, 1, "the local tier alone");
    return st;
}

static void add(struct kc_store *st, struct fake *f, unsigned flags)
{
    f->base.ops = &fake_ops;
    cr_assert_eq(kc__chain_add(st, &f->base, flags), 0);
}

/* The body under k as a string, or NULL on a miss. */
static char *get_str(struct kc_store *st, const kc_key *k)
{
    void *b = NULL;
    size_t n = 0;
    int rc = kc__chain_get(st, NS, k, &b, &n, NULL);
    if (rc == -ENOENT)
        return NULL;
    cr_assert_eq(rc, 0, "get: %s", strerror(-rc));
    char *s = strndup(b, n);
    free(b);
    return s;
}

/* ---- the spool ---------------------------------------------------------------- */

/* Every item of the spool logs of `type` (KC__SP_*), in *items (malloc'd);
 * their count. */
static size_t spool_items(int type, struct kc__sp_item **items)
{
    char sp[300];
    snprintf(sp, sizeof sp, "%s/spool", dir);
    DIR *d = opendir(sp);
    cr_assert_not_null(d);
    size_t n = 0;
    *items = NULL;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char c = type == KC__SP_PURGE ? 'x' : type == KC__SP_HITS ? 'h' : 'c';
        if (de->d_name[0] != c || de->d_name[1] != '-')
            continue;
        unsigned char *buf;
        size_t len;
        cr_assert_eq(kc__read_file(dirfd(d), de->d_name, 1 << 20, &buf, &len), 0);
        int t;
        const unsigned char *p;
        size_t pl;
        cr_assert_eq(kc__spool_check(buf, len, &t, &p, &pl), 0);
        cr_assert_eq(t, type);
        const unsigned char *end = p + pl;
        struct kc__sp_item it;
        while (kc__spool_item_next(t, &p, end, &it) > 0) {
            *items = realloc(*items, (n + 1) * sizeof **items);
            (*items)[n++] = it;
        }
        free(buf);
    }
    closedir(d);
    return n;
}

/* Whether the spool holds the put file of k. */
static bool spool_put(const kc_key *k)
{
    char name[40], path[400];
    kc__spool_name(NS, k, 'p', name);
    snprintf(path, sizeof path, "%s/spool/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* ---- the chain ------------------------------------------------------------------- */

Test(tier, local_first_then_the_next_tier_and_a_fill_back)
{
    struct kc_store *st = chain();
    static struct fake remote;
    memset(&remote, 0, sizeof remote);
    remote.holds = 1;
    remote.key = key(1, 1);
    remote.body = "from the remote";
    add(st, &remote, KC__CHAIN_FILL_BACK);

    kc_key k = key(1, 1);
    struct kc_record_info info;
    void *b;
    size_t n;
    cr_assert_eq(kc__chain_get(st, NS, &k, &b, &n, &info), 0);
    cr_assert(n == 15 && memcmp(b, "from the remote", n) == 0);
    free(b);
    cr_assert_eq(info.saved_ns, 7, "the header of the tier that served it");
    cr_assert_eq(remote.gets, 1);
    cr_assert(spool_put(&k), "a hit from a fill-back tier is put into the local tier");

    /* Now the local tier serves it: the remote is not asked again. */
    char *s = get_str(st, &k);
    cr_assert_str_eq(s, "from the remote");
    free(s);
    cr_assert_eq(remote.gets, 1, "the local tier comes first");

    /* A miss asks every tier, in order. */
    kc_key other = key(2, 1);
    cr_assert_null(get_str(st, &other));
    cr_assert_eq(remote.gets, 2);

    /* Both hits are noted once each, in one hit log at flush. */
    cr_assert_eq(kc__chain_flush(st), 0);
    cr_assert_eq(remote.flushes, 1, "flush reaches every tier");
    struct kc__sp_item *it;
    size_t ni = spool_items(KC__SP_HITS, &it);
    cr_assert_eq(ni, 1);
    cr_assert(memcmp(&it[0].key, &k, sizeof k) == 0);
    cr_assert_eq(it[0].a, 2, "two hits of one key: %llu", (unsigned long long)it[0].a);
    free(it);
    kc__chain_close(st);
    cr_assert_eq(remote.closes, 1, "close reaches every tier");
}

Test(tier, a_tombstoned_key_is_a_miss_in_every_tier_until_put_again)
{
    struct kc_store *st = chain();
    static struct fake db;
    memset(&db, 0, sizeof db);
    db.holds = 1;
    db.key = key(3, 1);
    db.body = "stale";
    add(st, &db, 0);

    kc_key k = key(3, 1);
    cr_assert_eq(kc__chain_purge(st, NS, &k), 0, "found in a tier");
    cr_assert_eq(db.purges, 1, "every tier's purge");
    struct kc__sp_item *it;
    cr_assert_eq(spool_items(KC__SP_PURGE, &it), 1, "and the local tier's purge request");
    cr_assert_eq(it[0].flags, KC__PF_KEY);
    free(it);
    int asked = db.gets;
    cr_assert_null(get_str(st, &k), "tombstoned");
    cr_assert_eq(db.gets, asked, "a tombstone is told before any tier is asked");

    kc_key never = key(4, 1);
    cr_assert_eq(kc__chain_purge(st, NS, &never), -ENOENT);

    /* Put again, it is served again (by the local tier). */
    cr_assert_eq(kc__chain_put(st, NS, &k, NULL, KC_KIND_BLOB, "fresh", 5, 0), 0);
    char *s = get_str(st, &k);
    cr_assert_str_eq(s, "fresh");
    free(s);
    kc__chain_close(st);
}

Test(tier, a_record_failing_its_checks_is_a_miss_there_and_reported)
{
    struct kc_store *st = chain();
    static struct fake bad, good;
    memset(&bad, 0, sizeof bad);
    memset(&good, 0, sizeof good);
    bad.holds = good.holds = 1;
    bad.key = good.key = key(5, 1);
    bad.bad = 1;
    good.body = "good copy";
    add(st, &bad, 0);
    add(st, &good, 0);

    kc_key k = key(5, 1);
    char *s = get_str(st, &k);
    cr_assert_str_eq(s, "good copy", "the next tier serves it");
    free(s);
    struct kc__sp_item *it;
    cr_assert_eq(spool_items(KC__SP_PURGE, &it), 1);
    cr_assert_eq(it[0].flags, KC__PF_KEY | KC__PF_IFBAD,
                 "removed where it is still bad, by the owner");
    cr_assert(memcmp(&it[0].key, &k, sizeof k) == 0);
    free(it);
    kc__chain_close(st);
}

Test(tier, an_earlier_builds_entry_is_moved_once)
{
    struct kc_store *st = chain();
    static struct fake db;
    memset(&db, 0, sizeof db);
    db.holds = 1;
    db.key = key(6, 1); /* build 1 */
    db.body = "compiled by build 1";
    db.has_source = 1;
    db.source = kc_digest_of("src", 3);
    db.source_key = db.key;
    add(st, &db, 0);

    kc_digest src = kc_digest_of("src", 3);
    void *b;
    size_t n;
    kc_key found;
    /* The same build keeps its entry. */
    cr_assert_eq(kc__chain_take_by_source(st, NS, &src, 1, &b, &n, &found, NULL), 0);
    free(b);
    struct kc__sp_item *it;
    cr_assert_eq(spool_items(KC__SP_PURGE, &it), 0, "kept");
    free(it);

    /* Build 2 moves it: one request of key and source, every tier past the
     * local one purges the key, and neither is served again here. */
    cr_assert_eq(kc__chain_take_by_source(st, NS, &src, 2, &b, &n, &found, NULL), 0);
    cr_assert(n == 19 && memcmp(b, "compiled by build 1", n) == 0);
    free(b);
    cr_assert(memcmp(&found, &db.key, sizeof found) == 0);
    cr_assert_eq(spool_items(KC__SP_PURGE, &it), 1);
    cr_assert_eq(it[0].flags, KC__PF_KEY | KC__PF_SOURCE);
    free(it);
    cr_assert_eq(db.purges, 1);
    cr_assert_null(get_str(st, &db.key), "moved out");
    cr_assert_eq(kc__chain_take_by_source(st, NS, &src, 2, &b, &n, &found, NULL), -ENOENT,
                 "the source moved too");

    /* The new build's put of the source is found first, from memory. */
    kc_key mine = key(7, 2);
    cr_assert_eq(kc__chain_put(st, NS, &mine, &src, KC_KIND_BLOB, "build 2", 7, 0), 0);
    int takes = db.takes;
    cr_assert_eq(kc__chain_take_by_source(st, NS, &src, 2, &b, &n, &found, NULL), 0);
    free(b);
    cr_assert(memcmp(&found, &mine, sizeof found) == 0);
    cr_assert_eq(db.takes, takes, "own puts before any tier's sources map");
    kc__chain_close(st);
}

Test(tier, fork_reaches_every_tier_and_bad_arguments_reach_none)
{
    struct kc_store *st = chain();
    static struct fake f;
    memset(&f, 0, sizeof f);
    add(st, &f, 0);
    kc__chain_after_fork_child(st);
    cr_assert_eq(f.forks, 1);
    kc_key k = key(8, 1);
    void *b;
    size_t n;
    cr_assert_eq(kc__chain_get(st, "", &k, &b, &n, NULL), -EINVAL);
    cr_assert_eq(kc__chain_put(st, NS, &k, NULL, 99, "x", 1, 0), -EINVAL);
    cr_assert_eq(f.gets + f.puts, 0);
    cr_assert_eq(kc__chain_find(st, &fake_ops), &f.base);
    kc__chain_close(st);
    cr_assert_eq(f.closes, 1);
}

/* ---- the store library's chain ------------------------------------------------------ */

Test(tier, the_store_reports_a_damaged_hot_file_as_the_shim_does)
{
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
    struct kc_store *st;
    cr_assert_eq(S->open(&o, &st), 0);
    kc_key k = key(9, 1);
    cr_assert_eq(api->put(st, NS, &k, NULL, KC_KIND_BLOB, "kept hot", 8, 0), 0);
    cr_assert_eq(adm->drain(st, 5000), 0);

    /* Damage the hot file the drain made (its database entry is fine). */
    char name[40], hot[300], path[400];
    kc__spool_name(NS, &k, 0, name);
    snprintf(hot, sizeof hot, "%s/hot", dir);
    snprintf(path, sizeof path, "%s/%s", hot, name);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0, "a hot file of the drained put");
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_assert_eq(pwrite(fd, "XX", 2, sb.st_size - 4), 2);
    close(fd);
    unsigned char *buf = NULL;
    struct kc__sp_put sp;
    cr_assert_eq(kc__hot_file_read(hot, name, &buf, &sp), -EBADMSG);
    free(buf);

    /* Still a hit, with the right bytes, from the database. */
    void *b;
    size_t n;
    cr_assert_eq(api->get(st, NS, &k, &b, &n, NULL), 0);
    cr_assert(n == 8 && memcmp(b, "kept hot", 8) == 0);
    api->free(b);
    /* And the owner, told of it, no longer keeps a damaged copy. */
    cr_assert_eq(adm->drain(st, 5000), 0);
    buf = NULL;
    int rc = kc__hot_file_read(hot, name, &buf, &sp);
    free(buf);
    cr_assert(rc == 0 || rc == -ENOENT, "the damaged hot file is still there: %s", strerror(-rc));
    api->close(st);
}
