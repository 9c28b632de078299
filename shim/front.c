/*
 * front.c: the store as the shim sees it, without RocksDB on the paths that
 * matter (front.h). libc and libdl only: the store's libc-only parts
 * (store/base.h: record and spool layouts, files, filter) are compiled in.
 *
 *   get    spool p-<h>, d-<h>, then DIR/hot/<h> (every one a checksummed
 *          put file for exactly this key), then DIR/filter: "absent" is a
 *          miss; "maybe" loads the store and forwards.
 *   put, purge, count, flush
 *          spool files, as the store writes them; the owner is started
 *          when nobody holds its lock.
 *   take_by_source
 *          this process's own puts, else forwarded when the filter says a
 *          source may be in the database.
 * Hits served here are noted and written as one hit log at flush, so the
 * owner keeps recency (and refreshes or creates the hot files).
 */
#include "front.h"

#include "shim.h"
#include "../store/base.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HITS_FLUSH_AT 65536

struct hit {
    uint32_t used; /* 0 empty, 1 used */
    uint32_t ns;
    kc_key key;
    uint64_t n, last_ns;
};

/* A key purged or moved by this process (kind 'K'), or a source moved
 * ('S'): not served again until this process puts it again. */
struct tomb {
    char kind;
    uint32_t ns;
    kc_key key;
    kc_digest src;
};

/* source -> key of this process's own puts. */
struct srcent {
    uint32_t ns;
    kc_digest src;
    kc_key key;
};

struct counter {
    char name[32];
    struct kc_counters c;
};

struct front {
    struct kc__paths p;
    bool readonly;
    uint64_t max_size;
    void *(*load)(void);

    /* Guards everything below but the real store. */
    pthread_mutex_t mu;
    struct kc__filter_ro filter;
    struct kc__kicker kick;
    struct hit *hits;
    size_t hcap, nh;
    char **nss;
    size_t n_nss;
    struct counter *ctr;
    size_t n_ctr;
    struct tomb *tombs;
    size_t n_tombs;
    struct srcent *srcs;
    size_t n_srcs;
    uint64_t last_created;

    /* The real store, loaded on demand (guarded by real_mu). */
    pthread_mutex_t real_mu;
    int real_state; /* 0 untried, 1 open, -1 unusable */
    const struct kc_store_api *rapi;
    struct kc_store *rst;
};

#define F(st) ((struct front *)(st))

static uint64_t wall_ns(void)
{
    return kc__wall_ns();
}

static uint32_t ns_index(struct front *f, const char *ns)
{
    for (size_t i = 0; i < f->n_nss; i++)
        if (strcmp(f->nss[i], ns) == 0)
            return (uint32_t)i;
    char *d = strdup(ns);
    char **v = d ? realloc(f->nss, (f->n_nss + 1) * sizeof *v) : NULL;
    if (v == NULL) {
        free(d);
        return UINT32_MAX;
    }
    f->nss = v;
    v[f->n_nss] = d;
    return (uint32_t)f->n_nss++;
}

/* ---- the real store ----------------------------------------------------- */

static struct kc_store *real_store(struct front *f, const struct kc_store_api **api)
{
    int state = __atomic_load_n(&f->real_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        pthread_mutex_lock(&f->real_mu);
        if (f->real_state == 0) {
            int rc = -1;
            /* Loading RocksDB runs its constructors; keep our hooks out. */
            bool entered = kc__guard_enter();
            void *h = f->load ? f->load() : NULL;
            if (h == NULL) {
                kc_log(KC_LOG_WARN, "cannot load the store (%s); the cache serves only what "
                                    "needs no database", dlerror());
            } else {
                const struct kc_store_api *(*get)(void) =
                    (const struct kc_store_api *(*)(void))kc__real_dlsym(h, "kc_store_api");
                const struct kc_store_api *a = get ? get() : NULL;
                if (a == NULL || a->abi != KC_STORE_ABI || a->open == NULL) {
                    kc_log(KC_LOG_WARN, "the store library does not match this shim; the "
                                        "cache serves only what needs no database");
                } else {
                    struct kc_store_options o = {
                        .dir = f->p.dir, .readonly = f->readonly, .max_size = f->max_size};
                    rc = a->open(&o, &f->rst);
                    /* The front checked the directory when it opened; a
                     * directory deleted or replaced by a file since is a
                     * miss here, and the writes that fail say so (one
                     * warning per process). */
                    if (rc != 0)
                        kc_log(rc == -ENOENT || rc == -ENOTDIR ? KC_LOG_DEBUG : KC_LOG_WARN,
                               "cannot use the cache directory %s (%s)", f->p.dir,
                               strerror(-rc));
                    else
                        f->rapi = a;
                }
            }
            if (entered)
                kc__guard_exit();
            if (rc == 0)
                kc_log(KC_LOG_DEBUG, "store loaded: a lookup the filter could not answer");
            __atomic_store_n(&f->real_state, rc == 0 ? 1 : -1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&f->real_mu);
        state = __atomic_load_n(&f->real_state, __ATOMIC_ACQUIRE);
    }
    if (state != 1)
        return NULL;
    *api = f->rapi;
    return f->rst;
}

/* The real store if it is already loaded, else NULL. */
static struct kc_store *real_if_loaded(struct front *f, const struct kc_store_api **api)
{
    if (__atomic_load_n(&f->real_state, __ATOMIC_ACQUIRE) != 1)
        return NULL;
    *api = f->rapi;
    return f->rst;
}

int kc__front_loaded(struct kc_store *st)
{
    return st != NULL && __atomic_load_n(&F(st)->real_state, __ATOMIC_ACQUIRE) == 1;
}

/* ---- in-memory logs ----------------------------------------------------- */

static uint64_t hit_hash(uint32_t ns, const kc_key *k)
{
    uint64_t h = k->id.lo ^ (k->id.hi * 0x9e3779b97f4a7c15ull) ^ (k->build << 7) ^ ns;
    return h ^ (h >> 31);
}

static struct hit *hit_slot(struct front *f, uint32_t ns, const kc_key *k)
{
    if (f->hcap == 0 || (f->nh + 1) * 2 > f->hcap) {
        size_t cap = f->hcap ? 2 * f->hcap : 64;
        struct hit *nv = calloc(cap, sizeof *nv);
        if (nv == NULL)
            return NULL;
        for (size_t i = 0; i < f->hcap; i++) {
            struct hit *e = &f->hits[i];
            if (!e->used)
                continue;
            size_t j = hit_hash(e->ns, &e->key) & (cap - 1);
            while (nv[j].used)
                j = (j + 1) & (cap - 1);
            nv[j] = *e;
        }
        free(f->hits);
        f->hits = nv;
        f->hcap = cap;
    }
    size_t mask = f->hcap - 1;
    for (size_t i = hit_hash(ns, k) & mask;; i = (i + 1) & mask) {
        struct hit *e = &f->hits[i];
        if (!e->used) {
            e->used = 1;
            e->ns = ns;
            e->key = *k;
            f->nh++;
            return e;
        }
        if (e->ns == ns && memcmp(&e->key, k, sizeof *k) == 0)
            return e;
    }
}

static int write_items(struct front *f, int type, struct kc__buf *b, size_t n)
{
    if (n == 0 || f->readonly)
        return 0;
    kc__spool_end(b);
    if (b->err)
        return b->err;
    char name[64];
    snprintf(name, sizeof name, "%c-%d-%016llx", type == KC__SP_PURGE ? 'x'
                                                 : type == KC__SP_HITS ? 'h'
                                                                       : 'c',
             (int)getpid(), (unsigned long long)kc__rand64());
    return kc__spool_write(f->p.spool, name, b->p, b->len, type == KC__SP_PURGE);
}

/* Writes the hit log; mu held. */
static int flush_hits_locked(struct front *f)
{
    if (f->nh == 0)
        return 0;
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_HITS);
    size_t n = 0;
    for (size_t i = 0; i < f->hcap; i++) {
        struct hit *e = &f->hits[i];
        if (!e->used)
            continue;
        struct kc__sp_item it = {0};
        snprintf(it.ns, sizeof it.ns, "%s", f->nss[e->ns]);
        it.key = e->key;
        it.a = e->n;
        it.b = e->last_ns;
        kc__spool_item_add(&b, KC__SP_HITS, &it);
        n++;
    }
    memset(f->hits, 0, f->hcap * sizeof *f->hits);
    f->nh = 0;
    int rc = write_items(f, KC__SP_HITS, &b, n);
    kc__buf_free(&b);
    return rc;
}

static void note_hit(struct front *f, const char *ns, const kc_key *key)
{
    if (f->readonly)
        return;
    pthread_mutex_lock(&f->mu);
    uint32_t nsi = ns_index(f, ns);
    struct hit *e = nsi != UINT32_MAX ? hit_slot(f, nsi, key) : NULL;
    if (e != NULL) {
        e->n++;
        e->last_ns = wall_ns();
    }
    if (f->nh >= HITS_FLUSH_AT)
        flush_hits_locked(f);
    pthread_mutex_unlock(&f->mu);
}

/* mu held. */
static struct tomb *tomb_find(struct front *f, char kind, uint32_t ns, const kc_key *key,
                              const kc_digest *src)
{
    for (size_t i = 0; i < f->n_tombs; i++) {
        struct tomb *t = &f->tombs[i];
        if (t->kind == kind && t->ns == ns &&
            (kind == 'K' ? memcmp(&t->key, key, sizeof *key) == 0
                         : memcmp(&t->src, src, sizeof *src) == 0))
            return t;
    }
    return NULL;
}

static void tomb_add(struct front *f, char kind, const char *ns, const kc_key *key,
                     const kc_digest *src)
{
    pthread_mutex_lock(&f->mu);
    uint32_t nsi = ns_index(f, ns);
    if (nsi != UINT32_MAX && tomb_find(f, kind, nsi, key, src) == NULL) {
        struct tomb *v = realloc(f->tombs, (f->n_tombs + 1) * sizeof *v);
        if (v != NULL) {
            f->tombs = v;
            struct tomb *t = &v[f->n_tombs++];
            memset(t, 0, sizeof *t);
            t->kind = kind;
            t->ns = nsi;
            if (key)
                t->key = *key;
            if (src)
                t->src = *src;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

static bool tombstoned(struct front *f, const char *ns, const kc_key *key)
{
    if (__atomic_load_n(&f->n_tombs, __ATOMIC_RELAXED) == 0)
        return false;
    pthread_mutex_lock(&f->mu);
    uint32_t nsi = ns_index(f, ns);
    bool dead = nsi != UINT32_MAX && tomb_find(f, 'K', nsi, key, NULL) != NULL;
    pthread_mutex_unlock(&f->mu);
    return dead;
}

static void kick(struct front *f)
{
    pthread_mutex_lock(&f->mu);
    kc__kicker_kick(&f->kick, &f->p, f->max_size);
    pthread_mutex_unlock(&f->mu);
}

static void request_purge(struct front *f, const char *ns, const kc_key *key,
                          const kc_digest *src, uint32_t flags)
{
    if (f->readonly)
        return;
    struct kc__sp_item it = {0};
    snprintf(it.ns, sizeof it.ns, "%s", ns);
    it.flags = flags;
    if (key != NULL)
        it.key = *key;
    if (src != NULL)
        it.source = *src;
    it.a = wall_ns();
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_PURGE);
    kc__spool_item_add(&b, KC__SP_PURGE, &it);
    write_items(f, KC__SP_PURGE, &b, 1);
    kc__buf_free(&b);
    kick(f);
}

/* ---- lookups ------------------------------------------------------------ */

/* The spool and hot files: 0 with the body copied out, -ENOENT. */
static int file_lookup(struct front *f, const char *ns, const kc_key *key, void **body,
                       size_t *len, struct kc__hdr *h)
{
    char hex[40];
    kc__spool_name(ns, key, 0, hex);
    for (int i = 0; i < 3; i++) {
        char path[4400];
        if (i < 2)
            snprintf(path, sizeof path, "%s/%c-%s", f->p.spool, i == 0 ? 'p' : 'd', hex);
        else
            snprintf(path, sizeof path, "%s/%s", f->p.hot, hex);
        unsigned char *buf;
        struct kc__sp_put sp;
        int rc = kc__put_file_read(path, ns, key, &buf, &sp);
        if (rc == -EBADMSG && i == 2) {
            /* A hot file that fails its checks: a miss here; the owner
             * removes it (and the entry, only if it is bad there too). */
            kc_log(KC_LOG_DEBUG, "hot file %s fails its checks", hex);
            request_purge(f, ns, key, NULL, KC__PF_KEY | KC__PF_IFBAD);
        }
        if (rc != 0)
            continue;
        void *b = malloc(sp.body_len ? sp.body_len : 1);
        if (b == NULL) {
            free(buf);
            return -ENOMEM;
        }
        memcpy(b, sp.body, sp.body_len);
        *body = b;
        *len = sp.body_len;
        *h = sp.hdr;
        free(buf);
        return 0;
    }
    return -ENOENT;
}

/* Whether the database may hold the item: the filter, else whether there is
 * a database at all. */
static bool db_maybe(struct front *f, struct kc__fhash h)
{
    pthread_mutex_lock(&f->mu);
    int m = kc__filter_maybe(&f->filter, f->p.filter, h);
    bool mapped = f->filter.map != NULL;
    pthread_mutex_unlock(&f->mu);
    if (m == 0)
        return false;
    if (!mapped) {
        /* No filter: nothing was ever drained if there is no database
         * (a drained put's file was looked for above, before this). */
        char cur[4400];
        snprintf(cur, sizeof cur, "%s/CURRENT", f->p.db);
        if (access(cur, F_OK) != 0 && errno == ENOENT)
            return false;
    }
    return true;
}

/* ---- the API ------------------------------------------------------------ */

int kc__front_open(const struct kc_store_options *opts, void *(*load)(void),
                   struct kc_store **out)
{
    if (opts == NULL || opts->dir == NULL || opts->dir[0] == 0 || out == NULL)
        return -EINVAL;
    *out = NULL;
    if (strlen(opts->dir) >= 4000)
        return -ENAMETOOLONG;
    struct front *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -ENOMEM;
    kc__paths_init(&f->p, opts->dir);
    f->readonly = opts->readonly != 0;
    f->max_size = opts->max_size;
    f->load = load;
    /* The store's own checks (store.c st_open), plus DIR/hot. */
    int rc = kc__private_dir(f->p.dir, !f->readonly);
    if (rc == -ENOENT && f->readonly)
        rc = 0;
    if (rc == 0 && !f->readonly) {
        rc = kc__private_subdir(f->p.spool, true);
        if (rc == 0)
            rc = kc__private_subdir(f->p.sec, true);
    } else if (rc == 0) {
        int r = kc__private_subdir(f->p.spool, false);
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    if (rc == 0) {
        int r = kc__private_subdir(f->p.hot, false);
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    if (rc < 0) {
        free(f);
        return rc;
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_init(&f->real_mu, NULL);
    kc__kicker_init(&f->kick, kc__find_tool(opts->tool, (const void *)kc__front_open));
    *out = (struct kc_store *)f;
    return 0;
}

static int fr_open(const struct kc_store_options *opts, struct kc_store **out)
{
    return kc__front_open(opts, NULL, out);
}

static int fr_flush(struct kc_store *st);

static void fr_close(struct kc_store *st)
{
    if (st == NULL)
        return;
    struct front *f = F(st);
    fr_flush(st);
    const struct kc_store_api *a;
    struct kc_store *r = real_if_loaded(f, &a);
    if (r != NULL)
        a->close(r);
    kc__kicker_reap(&f->kick, 200);
    kc__kicker_free(&f->kick);
    kc__filter_ro_drop(&f->filter);
    for (size_t i = 0; i < f->n_nss; i++)
        free(f->nss[i]);
    free(f->nss);
    free(f->hits);
    free(f->ctr);
    free(f->tombs);
    free(f->srcs);
    pthread_mutex_destroy(&f->mu);
    pthread_mutex_destroy(&f->real_mu);
    free(f);
}

static bool key_ok(const char *ns, const kc_key *key)
{
    return kc__ns_ok(ns) && key != NULL;
}

static int fr_get(struct kc_store *st, const char *ns, const kc_key *key, void **body,
                  size_t *len, struct kc_record_info *info)
{
    struct front *f = F(st);
    if (st == NULL || !key_ok(ns, key) || body == NULL || len == NULL)
        return -EINVAL;
    if (tombstoned(f, ns, key))
        return -ENOENT;
    struct kc__hdr h;
    if (file_lookup(f, ns, key, body, len, &h) == 0) {
        kc__hdr_to_info(&h, info);
        note_hit(f, ns, key);
        return 0;
    }
    if (!db_maybe(f, kc__fhash_kernel(ns, key)))
        return -ENOENT;
    const struct kc_store_api *a;
    struct kc_store *r = real_store(f, &a);
    if (r == NULL)
        return -ENOENT;
    return a->get(r, ns, key, body, len, info);
}

static int fr_put(struct kc_store *st, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    struct front *f = F(st);
    if (st == NULL || !key_ok(ns, key) || (body == NULL && len > 0) || kind < KC_KIND_NVRTC ||
        kind > KC_KIND_BLOB)
        return -EINVAL;
    if (f->readonly)
        return -EROFS;
    struct kc__hdr h = {0};
    h.kind = kind;
    h.format = KC_FORMAT_VERSION;
    h.body_size = len;
    h.saved_ns = saved_ns;
    h.body_xxh = kc__body_xxh(body, len);
    uint64_t now = wall_ns();
    pthread_mutex_lock(&f->mu);
    if (now <= f->last_created)
        now = f->last_created + 1;
    f->last_created = now;
    pthread_mutex_unlock(&f->mu);
    h.created_ns = now;
    struct kc__buf b = {0};
    int rc = kc__spool_put_encode(&b, ns, key, source, &h, body, len);
    char name[40];
    kc__spool_name(ns, key, 'p', name);
    if (rc == 0)
        rc = kc__spool_write(f->p.spool, name, b.p, b.len, true);
    kc__buf_free(&b);
    if (rc < 0)
        return rc;
    /* What this process just wrote wins over what it purged before. */
    pthread_mutex_lock(&f->mu);
    uint32_t nsi = ns_index(f, ns);
    if (nsi != UINT32_MAX) {
        struct tomb *t = tomb_find(f, 'K', nsi, key, NULL);
        if (t != NULL)
            *t = f->tombs[--f->n_tombs];
        if (source != NULL) {
            t = tomb_find(f, 'S', nsi, NULL, source);
            if (t != NULL)
                *t = f->tombs[--f->n_tombs];
            struct srcent *e = NULL;
            for (size_t i = 0; i < f->n_srcs; i++)
                if (f->srcs[i].ns == nsi && !memcmp(&f->srcs[i].src, source, sizeof *source))
                    e = &f->srcs[i];
            if (e == NULL) {
                struct srcent *v = realloc(f->srcs, (f->n_srcs + 1) * sizeof *v);
                if (v != NULL) {
                    f->srcs = v;
                    e = &v[f->n_srcs++];
                    e->ns = nsi;
                    e->src = *source;
                }
            }
            if (e != NULL)
                e->key = *key;
        }
    }
    pthread_mutex_unlock(&f->mu);
    kick(f);
    return 0;
}

static int fr_take_by_source(struct kc_store *st, const char *ns, const kc_digest *source,
                             uint64_t build, void **body, size_t *len, kc_key *found)
{
    struct front *f = F(st);
    if (st == NULL || !kc__ns_ok(ns) || source == NULL || body == NULL || len == NULL)
        return -EINVAL;
    /* This process's own puts first, as the store does. */
    kc_key k;
    bool own = false, dead = false;
    pthread_mutex_lock(&f->mu);
    uint32_t nsi = ns_index(f, ns);
    if (nsi != UINT32_MAX) {
        dead = tomb_find(f, 'S', nsi, NULL, source) != NULL;
        for (size_t i = 0; !dead && i < f->n_srcs; i++)
            if (f->srcs[i].ns == nsi && !memcmp(&f->srcs[i].src, source, sizeof *source)) {
                k = f->srcs[i].key;
                own = true;
                if (k.build != build)
                    f->srcs[i] = f->srcs[--f->n_srcs];
                break;
            }
    }
    pthread_mutex_unlock(&f->mu);
    if (dead)
        return -ENOENT;
    if (!own) {
        if (!db_maybe(f, kc__fhash_source(ns, source)))
            return -ENOENT;
        const struct kc_store_api *a;
        struct kc_store *r = real_store(f, &a);
        if (r == NULL)
            return -ENOENT;
        kc_key got;
        int rc = a->take_by_source(r, ns, source, build, body, len, &got);
        if (rc == 0 && got.build != build) {
            /* Moved: the store asked for the purge; stop serving it here. */
            tomb_add(f, 'K', ns, &got, NULL);
            tomb_add(f, 'S', ns, NULL, source);
        }
        if (rc == 0 && found != NULL)
            *found = got;
        return rc;
    }
    struct kc_record_info info;
    int rc = fr_get(st, ns, &k, body, len, &info);
    if (rc < 0)
        return -ENOENT;
    if (found != NULL)
        *found = k;
    if (k.build != build && !f->readonly) {
        /* An earlier build's entry is moved: nothing asks for its key
         * again. */
        tomb_add(f, 'K', ns, &k, NULL);
        tomb_add(f, 'S', ns, NULL, source);
        request_purge(f, ns, &k, source, KC__PF_KEY | KC__PF_SOURCE);
    }
    return 0;
}

static int fr_purge(struct kc_store *st, const char *ns, const kc_key *key)
{
    struct front *f = F(st);
    if (st == NULL || !key_ok(ns, key))
        return -EINVAL;
    if (f->readonly)
        return -EROFS;
    int rc = -ENOENT;
    if (!tombstoned(f, ns, key)) {
        void *b = NULL;
        size_t n;
        struct kc__hdr h;
        if (file_lookup(f, ns, key, &b, &n, &h) == 0 || db_maybe(f, kc__fhash_kernel(ns, key)))
            rc = 0;
        free(b);
    }
    tomb_add(f, 'K', ns, key, NULL);
    request_purge(f, ns, key, NULL, KC__PF_KEY);
    return rc;
}

static void fr_count(struct kc_store *st, const char *backend, const struct kc_counters *c)
{
    struct front *f = F(st);
    if (st == NULL || backend == NULL || c == NULL || strlen(backend) >= 32)
        return;
    pthread_mutex_lock(&f->mu);
    struct counter *t = NULL;
    for (size_t i = 0; i < f->n_ctr; i++)
        if (strcmp(f->ctr[i].name, backend) == 0)
            t = &f->ctr[i];
    if (t == NULL) {
        struct counter *v = realloc(f->ctr, (f->n_ctr + 1) * sizeof *v);
        if (v != NULL) {
            f->ctr = v;
            t = &v[f->n_ctr++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", backend);
        }
    }
    if (t != NULL) {
        t->c.hits += c->hits;
        t->c.misses += c->misses;
        t->c.passthrough += c->passthrough;
        t->c.stores += c->stores;
        t->c.errors += c->errors;
        t->c.saved_ns += c->saved_ns;
        t->c.compile_ns += c->compile_ns;
    }
    pthread_mutex_unlock(&f->mu);
}

static int fr_flush(struct kc_store *st)
{
    struct front *f = F(st);
    if (st == NULL)
        return -EINVAL;
    pthread_mutex_lock(&f->mu);
    bool wrote = f->nh > 0;
    int rc = flush_hits_locked(f);
    if (f->n_ctr > 0) {
        struct kc__buf b = {0};
        kc__spool_begin(&b, KC__SP_COUNT);
        size_t n = 0;
        for (size_t i = 0; i < f->n_ctr; i++) {
            struct kc__sp_item it = {0};
            snprintf(it.ns, sizeof it.ns, "%s", f->ctr[i].name);
            it.c = f->ctr[i].c;
            if (it.ns[0] != 0) {
                kc__spool_item_add(&b, KC__SP_COUNT, &it);
                n++;
            }
        }
        int r = write_items(f, KC__SP_COUNT, &b, n);
        kc__buf_free(&b);
        if (r < 0 && rc == 0)
            rc = r;
        f->n_ctr = 0;
        wrote = true;
    }
    pthread_mutex_unlock(&f->mu);
    if (wrote && !f->readonly)
        kick(f);
    const struct kc_store_api *a;
    struct kc_store *r = real_if_loaded(f, &a);
    if (r != NULL) {
        int r2 = a->flush(r);
        if (r2 < 0 && rc == 0)
            rc = r2;
    }
    return rc;
}

static void fr_after_fork_child(struct kc_store *st)
{
    struct front *f = F(st);
    if (st == NULL)
        return;
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_init(&f->real_mu, NULL);
    /* Hits and counters so far are the parent's to report. */
    if (f->hits != NULL)
        memset(f->hits, 0, f->hcap * sizeof *f->hits);
    f->nh = 0;
    f->n_ctr = 0;
    kc__kicker_after_fork(&f->kick);
    const struct kc_store_api *a;
    struct kc_store *r = real_if_loaded(f, &a);
    if (r != NULL && a->after_fork_child != NULL)
        a->after_fork_child(r);
}

static void fr_free(void *p)
{
    free(p);
}

/* ---- tool operations: the real store's ----------------------------------- */

#define REAL_OR(f, fail)                                                                    \
    const struct kc_store_api *a;                                                           \
    struct kc_store *r = (f) ? real_store((f), &a) : NULL;                                  \
    if (r == NULL)                                                                          \
        return fail;

static int fr_foreach(struct kc_store *st, const char *ns,
                      int (*cb)(const struct kc_entry *e, void *arg), void *arg)
{
    REAL_OR(F(st), -ENOSYS);
    return a->foreach(r, ns, cb, arg);
}

static int fr_stats(struct kc_store *st, struct kc_store_stats **out)
{
    REAL_OR(F(st), -ENOSYS);
    return a->stats(r, out);
}

static void fr_stats_free(struct kc_store_stats *s)
{
    if (s == NULL)
        return;
    free(s->ns);
    free(s->backends);
    free(s);
}

static int fr_verify(struct kc_store *st, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg)
{
    REAL_OR(F(st), -ENOSYS);
    return a->verify(r, repair, rep, progress, arg);
}

static int fr_gc(struct kc_store *st, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg)
{
    REAL_OR(F(st), -ENOSYS);
    return a->gc(r, max_size, rep, progress, arg);
}

static int fr_clear(struct kc_store *st)
{
    REAL_OR(F(st), -ENOSYS);
    return a->clear(r);
}

static int fr_drain(struct kc_store *st, int timeout_ms)
{
    if (st == NULL)
        return -EINVAL;
    fr_flush(st);
    REAL_OR(F(st), -ENOSYS);
    return a->drain(r, timeout_ms);
}

static int fr_owner_run(const struct kc_store_options *opts, int idle_ms)
{
    return -ENOSYS;
}

static int fr_parse_record(const void *rec, size_t len, struct kc_record_info *info,
                           const void **body, size_t *body_len)
{
    return kc__parse_record(rec, len, info, body, body_len);
}

static const struct kc_store_api front_api = {
    .abi = KC_STORE_ABI,
    .open = fr_open,
    .close = fr_close,
    .get = fr_get,
    .put = fr_put,
    .take_by_source = fr_take_by_source,
    .purge = fr_purge,
    .count = fr_count,
    .flush = fr_flush,
    .after_fork_child = fr_after_fork_child,
    .free = fr_free,
    .foreach = fr_foreach,
    .stats = fr_stats,
    .stats_free = fr_stats_free,
    .verify = fr_verify,
    .gc = fr_gc,
    .clear = fr_clear,
    .owner_run = fr_owner_run,
    .parse_record = fr_parse_record,
    .drain = fr_drain,
};

const struct kc_store_api *kc__front_api(void)
{
    return &front_api;
}
