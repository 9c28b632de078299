/*
 * test_tier_remote.c: what the remote tier's wiring added to the local
 * tier and the chain (suite store): the put file's "from the remote" flag
 * (KC__PUT_FROM_REMOTE: the owner does not upload such an entry again),
 * put files written before it still read, the chain's fill-back writes
 * it, and a record another machine's tier refuses is not this owner's to
 * purge.
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

static char dir[256];
static const char *NS = "nvrtc:13.0-tier-remote-f2";

static void setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kc-tier-remote-XXXXXX", t && t[0] ? t : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0700);
}

static void teardown(void)
{
    kc__rm_rf(dir);
}

TestSuite(tier_remote, .init = setup, .fini = teardown, .timeout = 60);

static kc_key key(uint64_t id)
{
    return (kc_key){.id = {.lo = id, .hi = ~id}, .build = 3};
}

static struct kc__hdr hdr_of(const void *body, size_t len)
{
    struct kc__hdr h = {0};
    h.kind = KC_KIND_BLOB;
    h.format = KC_FORMAT_VERSION;
    h.body_size = len;
    h.created_ns = 1000;
    h.body_xxh = kc__body_xxh(body, len);
    return h;
}

/* ---- the put file's flag -------------------------------------------------- */

Test(tier_remote, put_files_carry_the_from_remote_flag_and_old_ones_still_read)
{
    static const char body[] = "a body of some bytes";
    kc_key k = key(1);
    kc_digest src = kc_digest_of("src", 3);
    struct kc__hdr h = hdr_of(body, sizeof body - 1);

    /* What the encoder always wrote (no flag, or the source's) is what it
     * writes with no extra flag: files written before the flag read the
     * same. */
    struct kc_buf old = {0}, now = {0};
    cr_assert_eq(kc__spool_put_encode(&old, NS, &k, &src, &h, body, sizeof body - 1), 0);
    cr_assert_eq(kc__spool_put_encode_flags(&now, NS, &k, &src, &h, body, sizeof body - 1, 0), 0);
    cr_assert(old.len == now.len && memcmp(old.p, now.p, old.len) == 0);
    struct kc__sp_put sp;
    cr_assert_eq(kc__spool_put_decode(old.p, old.len, &sp), 0);
    cr_assert(sp.has_source && !sp.from_remote);

    /* Marked. */
    struct kc_buf fr = {0};
    cr_assert_eq(kc__spool_put_encode_flags(&fr, NS, &k, NULL, &h, body, sizeof body - 1,
                                            KC__PUT_FROM_REMOTE),
                 0);
    cr_assert_eq(kc__spool_put_decode(fr.p, fr.len, &sp), 0);
    cr_assert(sp.from_remote && !sp.has_source);
    cr_assert(sp.body_len == sizeof body - 1 && memcmp(sp.body, body, sp.body_len) == 0);

    /* A flag bit nobody defined is not ours: refused. */
    struct kc_buf odd = {0};
    kc_buf_add(&odd, fr.p, fr.len);
    kc_le_put_u16(odd.p + KC__SPOOL_HDR + 2, 0x40);
    kc__spool_end(&odd);
    cr_assert_eq(kc__spool_put_decode(odd.p, odd.len, &sp), -EBADMSG);

    kc_buf_free(&old);
    kc_buf_free(&now);
    kc_buf_free(&fr);
    kc_buf_free(&odd);
}

Test(tier_remote, packed_put_files_keep_the_flag)
{
    static const char body[] = "short body";
    size_t n = sizeof body - 1;
    kc_key k = key(2);
    struct kc__hdr h = hdr_of(body, n);
    struct kc_buf fr = {0};
    cr_assert_eq(kc__spool_put_encode_flags(&fr, NS, &k, NULL, &h, body, n, KC__PUT_FROM_REMOTE),
                 0);
    struct kc__sp_put sp;
    cr_assert_eq(kc__spool_put_decode(fr.p, fr.len, &sp), 0);
    /* One LZ4 sequence of literals only: the token's high nibble is their
     * count (under 15), then the bytes. */
    unsigned char lz[32];
    lz[0] = (unsigned char)(n << 4);
    memcpy(lz + 1, body, n);
    struct kc_buf pk = {0};
    cr_assert_eq(kc__spool_put_pack(&pk, &sp, lz, n + 1), 0);
    unsigned char *file = malloc(pk.len);
    memcpy(file, pk.p, pk.len);
    size_t len = pk.len;
    struct kc__sp_put up;
    cr_assert_eq(kc__put_decode_any(&file, &len, &up), 0);
    cr_assert(up.from_remote, "a packed hot file of a remote entry stays marked");
    cr_assert(up.body_len == n && memcmp(up.body, body, n) == 0);
    free(file);
    kc_buf_free(&fr);
    kc_buf_free(&pk);
}

/* ---- the chain ---------------------------------------------------------------- */

struct fake {
    struct kc_tier base;
    kc_key key;
    int bad;
};

static int fake_get(struct kc_tier *t, const char *ns, const kc_key *k, void **body, size_t *len,
                    struct kc_record_info *info)
{
    struct fake *f = (struct fake *)t;
    if (memcmp(k, &f->key, sizeof *k) != 0)
        return -ENOENT;
    if (f->bad)
        return -EBADMSG;
    *body = strdup("served by the remote");
    *len = strlen(*body);
    if (info != NULL)
        *info = (struct kc_record_info){
            .kind = KC_KIND_NVRTC, .format = KC_FORMAT_VERSION, .body_size = *len, .saved_ns = 9};
    return 0;
}

static void fake_close(struct kc_tier *t)
{
    (void)t;
}

static const struct kc_tier_ops fake_ops = {.name = "remote", .get = fake_get, .close = fake_close};

static struct kc_store *chain_with(struct fake *f, unsigned flags)
{
    struct kc_store_options o = {.dir = dir, .tool = "/bin/true"};
    struct kc_store *st = NULL;
    cr_assert_eq(kc__chain_open(&o, NULL, 0, &st), 0);
    f->base.ops = &fake_ops;
    cr_assert_eq(kc__chain_add(st, &f->base, flags), 0);
    return st;
}

/* The put file the local tier holds for k: 0 with *sp (into *buf). */
static int local_put_file(const kc_key *k, unsigned char **buf, struct kc__sp_put *sp)
{
    char name[40], path[400];
    kc__spool_name(NS, k, 'p', name);
    snprintf(path, sizeof path, "%s/spool/%s", dir, name);
    return kc__put_file_read(path, NS, k, buf, sp);
}

static size_t purge_requests(void)
{
    char sp[300];
    snprintf(sp, sizeof sp, "%s/spool", dir);
    DIR *d = opendir(sp);
    cr_assert_not_null(d);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] == 'x' && de->d_name[1] == '-';
    closedir(d);
    return n;
}

Test(tier_remote, a_fill_back_is_marked_from_the_remote_and_a_put_is_not)
{
    static struct fake remote;
    memset(&remote, 0, sizeof remote);
    remote.key = key(3);
    struct kc_store *st = chain_with(&remote, KC__CHAIN_FILL_BACK);
    kc_key k = key(3);
    void *b;
    size_t n;
    cr_assert_eq(kc__chain_get(st, NS, &k, &b, &n, NULL), 0);
    free(b);
    unsigned char *buf = NULL;
    struct kc__sp_put sp;
    cr_assert_eq(local_put_file(&k, &buf, &sp), 0, "kept locally");
    cr_assert(sp.from_remote, "marked: the owner does not upload it back");
    cr_assert_eq(sp.hdr.kind, KC_KIND_NVRTC);
    cr_assert_eq(sp.hdr.saved_ns, 9);
    free(buf);

    kc_key mine = key(4);
    cr_assert_eq(kc__chain_put(st, NS, &mine, NULL, KC_KIND_BLOB, "compiled here", 13, 0), 0);
    cr_assert_eq(local_put_file(&mine, &buf, &sp), 0);
    cr_assert(!sp.from_remote, "what this machine compiled is uploaded");
    free(buf);

    /* kc__chain_fill_back, as the shim uses it for a manifest it asked the
     * remote for directly. */
    kc_key m = key(5);
    struct kc_record_info info = {.kind = KC_KIND_MANIFEST, .saved_ns = 0};
    kc__chain_fill_back(st, NS, &m, &info, "manifest", 8);
    cr_assert_eq(local_put_file(&m, &buf, &sp), 0);
    cr_assert(sp.from_remote && sp.hdr.kind == KC_KIND_MANIFEST);
    free(buf);
    kc__chain_close(st);
}

Test(tier_remote, a_bad_record_of_a_fill_back_tier_is_no_local_purge)
{
    static struct fake remote, db;
    memset(&remote, 0, sizeof remote);
    remote.key = key(6);
    remote.bad = 1;
    struct kc_store *st = chain_with(&remote, KC__CHAIN_FILL_BACK);
    kc_key k = key(6);
    void *b;
    size_t n;
    cr_assert_eq(kc__chain_get(st, NS, &k, &b, &n, NULL), -ENOENT);
    cr_assert_eq(purge_requests(), 0, "another machine's bad entry: nothing for this owner");
    kc__chain_close(st);

    /* A tier of this machine still reports one. */
    kc__rm_rf(dir);
    mkdir(dir, 0700);
    memset(&db, 0, sizeof db);
    db.key = key(6);
    db.bad = 1;
    st = chain_with(&db, 0);
    cr_assert_eq(kc__chain_get(st, NS, &k, &b, &n, NULL), -ENOENT);
    cr_assert_eq(purge_requests(), 1, "a local tier's bad record is a purge request");
    kc__chain_close(st);
}
