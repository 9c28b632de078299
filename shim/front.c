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
 * owner keeps recency (and refreshes or creates the hot files). Hits,
 * counters, tombstones and the spool writes are the store's own code
 * (store/pending.c).
 */
#include "front.h"

#include "shim.h"
#include "../store/local/local.h"

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

struct front {
    struct kc__paths p;
    bool readonly;
    uint64_t max_size;
    void *(*load)(void);

    /* Guards the filter's mapping. */
    pthread_mutex_t mu;
    struct kc__filter_ro filter;
    /* Hits, counters, tombstones, own puts' sources; spool writes; starting
     * the owner: the store's (store/pending.c). */
    struct kc__pending pd;

    /* The kcache tool that starts the owner, looked for (kc__find_tool:
     * readlink of each part of the path, access) only before the first
     * call that may start it, not on the way to a first hit. */
    pthread_mutex_t tool_mu;
    int tool_ready;

    /* The real store, loaded on demand (guarded by real_mu). */
    pthread_mutex_t real_mu;
    int real_state; /* 0 untried, 1 open, -1 unusable */
    const struct kc_store_api *rapi;
    struct kc_store *rst;
};

#define F(st) ((struct front *)(st))

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

/* ---- the tool ----------------------------------------------------------- */

/* Sets the owner's tool in the pending state if still unset. Called before
 * every pending call that may start the owner (put, purge request, flush),
 * so each such call sees it. */
static void need_tool(struct front *f)
{
    if (__atomic_load_n(&f->tool_ready, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&f->tool_mu);
    if (!f->tool_ready) {
        if (f->pd.kick.tool == NULL)
            f->pd.kick.tool = kc__find_tool(NULL, kc__self_path());
        __atomic_store_n(&f->tool_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&f->tool_mu);
}

/* ---- lookups ------------------------------------------------------------ */

/* The spool and hot files: 0 with the body copied out, else nonzero. */
static int file_lookup(struct front *f, const char *ns, const kc_key *key, void **body,
                       size_t *len, struct kc__hdr *h)
{
    int rc = kc__files_lookup(&f->p, ns, key, body, len, h);
    if (rc == -EBADMSG) {
        /* A hot file that fails its checks: a miss here; the owner
         * removes it (and the entry, only if it is bad there too). */
        char hex[40];
        kc__spool_name(ns, key, 0, hex);
        kc_log(KC_LOG_DEBUG, "hot file %s fails its checks", hex);
        need_tool(f);
        kc__pending_purge_request(&f->pd, ns, key, NULL, KC__PF_KEY | KC__PF_IFBAD);
    }
    return rc;
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
    pthread_mutex_init(&f->tool_mu, NULL);
    /* The tool is looked for now when it is named, else on first need
     * (need_tool): beside this library's absolute path, found before main,
     * so the working directory of that moment does not matter. */
    bool now = opts->tool != NULL && opts->tool[0] != 0;
    kc__pending_init(&f->pd, &f->p, f->readonly, f->max_size,
                     now ? kc__find_tool(opts->tool, kc__self_path()) : NULL);
    f->tool_ready = now;
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
    kc__pending_free(&f->pd);
    kc__filter_ro_drop(&f->filter);
    pthread_mutex_destroy(&f->mu);
    pthread_mutex_destroy(&f->real_mu);
    pthread_mutex_destroy(&f->tool_mu);
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
    if (kc__pending_dead(&f->pd, ns, key))
        return -ENOENT;
    struct kc__hdr h;
    if (file_lookup(f, ns, key, body, len, &h) == 0) {
        kc__hdr_to_info(&h, info);
        kc__pending_hit(&f->pd, ns, key);
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
    if (st == NULL)
        return -EINVAL;
    need_tool(F(st));
    return kc__pending_put(&F(st)->pd, ns, key, source, kind, body, len, saved_ns);
}

static int fr_take_by_source(struct kc_store *st, const char *ns, const kc_digest *source,
                             uint64_t build, void **body, size_t *len, kc_key *found)
{
    struct front *f = F(st);
    if (st == NULL || !kc__ns_ok(ns) || source == NULL || body == NULL || len == NULL)
        return -EINVAL;
    /* This process's own puts first, as the store does. */
    kc_key k;
    int own = kc__pending_source(&f->pd, ns, source, &k);
    if (own == -ESRCH)
        return -ENOENT;
    if (own == 0 && k.build != build)
        kc__pending_forget_source(&f->pd, ns, source);
    if (own != 0) {
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
            kc__pending_tombstone(&f->pd, ns, &got, source);
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
        kc__pending_tombstone(&f->pd, ns, &k, source);
        need_tool(f);
        kc__pending_purge_request(&f->pd, ns, &k, source, KC__PF_KEY | KC__PF_SOURCE);
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
    if (!kc__pending_dead(&f->pd, ns, key)) {
        void *b = NULL;
        size_t n;
        struct kc__hdr h;
        if (file_lookup(f, ns, key, &b, &n, &h) == 0 || db_maybe(f, kc__fhash_kernel(ns, key)))
            rc = 0;
        free(b);
    }
    kc__pending_tombstone(&f->pd, ns, key, NULL);
    need_tool(f);
    kc__pending_purge_request(&f->pd, ns, key, NULL, KC__PF_KEY);
    return rc;
}

static void fr_count(struct kc_store *st, const char *backend, const struct kc_counters *c)
{
    if (st == NULL)
        return;
    kc__pending_count(&F(st)->pd, backend, c);
}

static int fr_flush(struct kc_store *st)
{
    struct front *f = F(st);
    if (st == NULL)
        return -EINVAL;
    need_tool(f);
    int rc = kc__pending_flush(&f->pd);
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
    pthread_mutex_init(&f->tool_mu, NULL);
    kc__pending_after_fork_child(&f->pd);
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
