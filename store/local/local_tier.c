/*
 * local_tier.c: the local tier (chain.h): what this machine keeps as files
 * in the cache directory, read and written without RocksDB.
 *
 *   get    DIR/spool/p-<h> (a put not yet drained), d-<h> (one being
 *          drained), then DIR/hot/<h> (a drained put the owner kept); each
 *          a checksummed put file for exactly this key.
 *   put    a spool file (temp file, rename), bounded by the size limit;
 *          then the owner is started if nobody holds its lock.
 *   purge  a purge request in the spool, which the owner applies to the
 *          database and the hot files alike.
 * Also the spool logs the chain writes (hits, counters, purge requests)
 * and starting the owner (the kcache tool, looked for on first need).
 */
#include "chain.h"
#include "../../common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define L(t) ((struct kc__local *)(t))

/* ---- starting the owner --------------------------------------------------- */

/* Starts the owner unless one holds the lock; mu held. The tool is looked
 * for (kc__find_tool: readlink of each part of the path, access) before
 * the first start, not on the way to a first hit. */
static void kick_locked(struct kc__local *l)
{
    if (!l->tool_ready) {
        if (l->kick.tool == NULL)
            l->kick.tool = kc__find_tool(NULL, l->lib);
        l->tool_ready = true;
    }
    kc__kicker_kick(&l->kick, l->p, l->max_size);
}

void kc__local_kick(struct kc__local *l)
{
    pthread_mutex_lock(&l->mu);
    kick_locked(l);
    pthread_mutex_unlock(&l->mu);
}

void kc__local_kick_logs(struct kc__local *l)
{
    pthread_mutex_lock(&l->mu);
    if (l->spool_count_ns == 0 || l->spool_work != 0 || l->spool_logs + 1 >= KC__LOGS_KICK_AT ||
        l->spool_full || l->wrote_work)
        kick_locked(l);
    pthread_mutex_unlock(&l->mu);
}

/* ---- spool logs ------------------------------------------------------------ */

static bool spool_room(struct kc__local *l, size_t n);

int kc__local_log(struct kc__local *l, int type, struct kc__buf *b, size_t n)
{
    if (n == 0 || l->readonly)
        return 0;
    kc__spool_end(b);
    if (b->err)
        return b->err;
    /* Hit and counter logs count against the size limit as puts do (a
     * process writes one after every miss); a purge request does not. */
    if (type != KC__SP_PURGE) {
        pthread_mutex_lock(&l->mu);
        bool room = spool_room(l, b->len);
        pthread_mutex_unlock(&l->mu);
        if (!room)
            return -EDQUOT;
    }
    char name[64];
    snprintf(name, sizeof name, "%c-%d-%016llx",
             type == KC__SP_PURGE  ? 'x'
             : type == KC__SP_HITS ? 'h'
                                   : 'c',
             (int)getpid(), (unsigned long long)kc__rand64());
    return kc__spool_write(l->p->spool, name, b->p, b->len, type == KC__SP_PURGE);
}

void kc__local_request(struct kc__local *l, const char *ns, const kc_key *key, const kc_digest *src,
                       uint32_t flags)
{
    if (l->readonly)
        return;
    struct kc__sp_item it = {0};
    snprintf(it.ns, sizeof it.ns, "%s", ns);
    it.flags = flags;
    if (key != NULL)
        it.key = *key;
    if (src != NULL)
        it.source = *src;
    it.a = kc_wall_ns();
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_PURGE);
    kc__spool_item_add(&b, KC__SP_PURGE, &it);
    kc__local_log(l, KC__SP_PURGE, &b, 1);
    kc__buf_free(&b);
    pthread_mutex_lock(&l->mu);
    l->wrote_work = true;
    kick_locked(l);
    pthread_mutex_unlock(&l->mu);
}

/* ---- get --------------------------------------------------------------------- */

int kc__files_lookup(const struct kc__paths *p, const char *ns, const kc_key *key, void **body,
                     size_t *len, struct kc__hdr *h)
{
    char hex[40];
    kc__spool_name(ns, key, 0, hex);
    int bad = -ENOENT;
    for (int i = 0; i < 3; i++) {
        char path[4400];
        if (i < 2)
            snprintf(path, sizeof path, "%s/%c-%s", p->spool, i == 0 ? 'p' : 'd', hex);
        else
            snprintf(path, sizeof path, "%s/%s", p->hot, hex);
        unsigned char *buf;
        struct kc__sp_put sp;
        int rc = kc__put_file_read(path, ns, key, &buf, &sp);
        if (rc == -EBADMSG && i == 2)
            bad = -EBADMSG;
        if (rc != 0)
            continue;
        /* The body moves to the front of the buffer it was read into:
         * no second allocation (a 164 KB record's fresh pages faulted in
         * again) and no second copy. */
        memmove(buf, sp.body, sp.body_len);
        *body = buf;
        *len = sp.body_len;
        *h = sp.hdr;
        return 0;
    }
    return bad;
}

static int local_get(struct kc_tier *t, const char *ns, const kc_key *key, void **body, size_t *len,
                     struct kc_record_info *info)
{
    struct kc__hdr h;
    int rc = kc__files_lookup(L(t)->p, ns, key, body, len, &h);
    if (rc == 0) {
        kc__hdr_to_info(&h, info);
    } else if (rc == -EBADMSG && kc__log_enabled(KC_LOG_DEBUG)) {
        char hex[40];
        kc__spool_name(ns, key, 0, hex);
        kc_log(KC_LOG_DEBUG, "hot file %s fails its checks", hex);
    }
    return rc;
}

/* ---- put --------------------------------------------------------------------- */

/* Whether the spool has room for a put file of n bytes: it may not hold
 * more than the size limit, or an owner that cannot start (or drain) would
 * let it grow without bound. The spool is counted (a readdir, stopping past
 * the limit) at this process's first put, when its own puts since the last
 * count would take it past the limit, and while it is full at most once a
 * second; a spool an owner drains stays small, and so does the count.
 * mu held. */
static bool spool_room(struct kc__local *l, size_t n)
{
    uint64_t limit = l->max_size ? l->max_size : KC_DEFAULT_MAX_SIZE;
    uint64_t now = kc_mono_ns() | 1;
    if (l->spool_count_ns == 0 || (l->spool_seen + l->spool_added + n > limit &&
                                   (!l->spool_full || now - l->spool_count_ns >= 1000000000ull))) {
        struct kc__spool_seen seen;
        kc__spool_scan(l->p->spool, limit, &seen);
        l->spool_seen = seen.bytes;
        l->spool_work = seen.work;
        l->spool_logs = seen.logs;
        l->spool_added = 0;
        l->spool_count_ns = now;
    }
    l->spool_full = l->spool_seen + l->spool_added + n > limit;
    if (l->spool_full)
        return false;
    l->spool_added += n;
    return true;
}

/* A spool put file (renamed into place, not fsynced: the owner syncs it
 * into the database), then the owner is started. -EROFS, -EDQUOT when the
 * spool would hold more than the size limit (an owner that does not drain
 * it: nothing written, one warning per process), or the write's error. The
 * chain checked the arguments. */
static int local_put(struct kc_tier *t, const char *ns, const kc_key *key, const kc_digest *source,
                     uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    return kc__local_put(L(t), ns, key, source, kind, body, len, saved_ns, 0,
                         KC_PROV(KC_PROV_LOCAL, 0));
}

int kc__local_put(struct kc__local *l, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns, unsigned flags,
                  uint32_t prov)
{
    if (l->readonly)
        return -EROFS;
    struct kc__hdr h = {0};
    h.kind = kind;
    h.format = KC_FORMAT_VERSION;
    h.body_size = len;
    h.saved_ns = saved_ns;
    h.body_xxh = kc__body_xxh(body, len);
    h.prov = prov;
    uint64_t now = kc_wall_ns();
    pthread_mutex_lock(&l->mu);
    if (now <= l->last_created)
        now = l->last_created + 1;
    l->last_created = now;
    pthread_mutex_unlock(&l->mu);
    h.created_ns = now;
    struct kc__buf b = {0};
    /* Only this process's own compiles carry its upload configuration. */
    bool up = (flags & KC__PUT_FROM_REMOTE) == 0 && KC_PROV_CODE(prov) == KC_PROV_LOCAL;
    int rc = kc__spool_put_encode_upload(&b, ns, key, source, &h, body, len, flags,
                                         up ? l->upload : NULL, up ? l->upload_len : 0);
    if (rc == 0) {
        pthread_mutex_lock(&l->mu);
        bool room = spool_room(l, b.len), warn = !room && !l->spool_warned;
        if (warn)
            l->spool_warned = true;
        pthread_mutex_unlock(&l->mu);
        if (warn)
            kc_log(KC_LOG_WARN,
                   "the spool of %s holds more than KCACHE_MAXSIZE "
                   "(%llu bytes) waiting for the owner; results are not "
                   "stored until it drains",
                   l->p->dir,
                   (unsigned long long)(l->max_size ? l->max_size : KC_DEFAULT_MAX_SIZE));
        if (!room) {
            kc__buf_free(&b);
            kc__local_kick(l); /* an owner that can start drains it */
            return -EDQUOT;
        }
    }
    char name[40];
    kc__spool_name(ns, key, 'p', name);
    /* Not fsynced here: the rename makes the file whole or absent for
     * every process, whichever dies when, and the owner's synced write
     * batch makes it durable before the file leaves the spool. Only an OS
     * crash in between can lose it (or leave it torn: a checksum miss),
     * and then the kernel is compiled again. An fsync here put the disk's
     * journal commit, 2 to 12 ms, on every miss of the host program. */
    if (rc == 0)
        rc = kc__spool_write(l->p->spool, name, b.p, b.len, false);
    kc__buf_free(&b);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&l->mu);
    l->wrote_work = true;
    kick_locked(l);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

/* ---- purge, fork, close ---------------------------------------------------------- */

/* A purge request for key: the owner removes it from the database and the
 * hot files, and no process serves it from the spool once its put file is
 * gone. */
static int local_purge(struct kc_tier *t, const char *ns, const kc_key *key)
{
    if (L(t)->readonly)
        return -EROFS;
    kc__local_request(L(t), ns, key, NULL, KC__PF_KEY);
    return 0;
}

static void local_after_fork(struct kc_tier *t)
{
    struct kc__local *l = L(t);
    pthread_mutex_init(&l->mu, NULL);
    kc__kicker_after_fork(&l->kick);
}

/* Reaps the last owner spawned (200 ms at most) and lets go of the lock
 * file and the tool; l itself is the chain's. */
static void local_close(struct kc_tier *t)
{
    if (t == NULL)
        return;
    struct kc__local *l = L(t);
    kc__kicker_reap(&l->kick, 200);
    kc__kicker_free(&l->kick);
    pthread_mutex_destroy(&l->mu);
}

static const struct kc_tier_ops local_ops = {
    .name = "local",
    .get = local_get,
    .put = local_put,
    .purge = local_purge,
    .after_fork = local_after_fork,
    .close = local_close,
};

void kc__local_init(struct kc__local *l, const struct kc__paths *p, bool readonly,
                    uint64_t max_size, const char *tool, const char *lib)
{
    memset(l, 0, sizeof *l);
    l->base.ops = &local_ops;
    l->p = p;
    l->readonly = readonly;
    l->max_size = max_size;
    l->lib = lib;
    pthread_mutex_init(&l->mu, NULL);
    /* A tool named by the caller is looked for now; else on first need,
     * beside the library's absolute path, found before main, so the
     * working directory of that moment does not matter. */
    bool now = tool != NULL && tool[0] != 0;
    kc__kicker_init(&l->kick, now ? kc__find_tool(tool, lib) : NULL);
    l->tool_ready = now;
}
