/*
 * front.c: the store as the shim's hooks see it (front.h). It is the chain
 * of tiers (store/local/chain.h), libc only: the local tier serves hits
 * from the spool and the hot files, writes go to the spool; behind it, a
 * lazy proxy of the database tier.
 *
 * The proxy answers from DIR/filter, the owner's Bloom filter of every key
 * and source in the database: "definitely absent" is a miss, so a process
 * that only hits, or only misses, never loads RocksDB. Only "maybe" loads
 * libkcache-store.so and forwards to its database tier
 * (kc_store_api()->db_tier_open).
 */
#include "front.h"

#include "shim.h"
#include "../store/local/chain.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct proxy {
    struct kc_tier base;
    const struct kc__paths *p; /* the chain's */
    bool readonly;
    uint64_t max_size;
    void *(*load)(void);

    /* Guards the filter's mapping. */
    pthread_mutex_t mu;
    struct kc__filter_ro filter;

    /* The database tier, loaded on demand (guarded by real_mu). */
    pthread_mutex_t real_mu;
    int real_state; /* 0 untried, 1 open, -1 unusable */
    struct kc_tier *real;
};

#define P(t) ((struct proxy *)(t))

/* The database tier, loading the store library on first need; NULL when it
 * cannot be used (one warning). */
static struct kc_tier *real(struct proxy *px)
{
    int state = __atomic_load_n(&px->real_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        pthread_mutex_lock(&px->real_mu);
        if (px->real_state == 0) {
            int rc = -1;
            /* Loading RocksDB runs its constructors; keep our hooks out. */
            bool entered = kc__guard_enter();
            void *h = px->load ? px->load() : NULL;
            if (h == NULL) {
                kc_log(KC_LOG_WARN,
                       "cannot load the store (%s); the cache serves only what "
                       "needs no database (install kcache whole: lib/libkcache-store.so "
                       "beside the shim)",
                       dlerror());
            } else {
                const struct kc_store_api *(*get)(void) =
                    (const struct kc_store_api *(*)(void))kc__real_dlsym(h, "kc_store_api");
                const struct kc_store_api *a = get ? get() : NULL;
                if (a == NULL || a->abi != KC_STORE_ABI || a->db_tier_open == NULL) {
                    kc_log(KC_LOG_WARN, "the store library does not match this shim; the "
                                        "cache serves only what needs no database (the two "
                                        "are from different builds: reinstall kcache)");
                } else {
                    struct kc_store_options o = {
                        .dir = px->p->dir, .readonly = px->readonly, .max_size = px->max_size};
                    rc = a->db_tier_open(&o, &px->real);
                    if (rc != 0)
                        kc_log(KC_LOG_WARN, "cannot read the database of %s (%s)", px->p->dir,
                               strerror(-rc));
                }
            }
            if (entered)
                kc__guard_exit();
            if (rc == 0)
                kc_log(KC_LOG_DEBUG, "store loaded: a lookup the filter could not answer");
            __atomic_store_n(&px->real_state, rc == 0 ? 1 : -1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&px->real_mu);
        state = __atomic_load_n(&px->real_state, __ATOMIC_ACQUIRE);
    }
    return state == 1 ? px->real : NULL;
}

/* The database tier if it is already loaded, else NULL. */
static struct kc_tier *real_if_loaded(struct proxy *px)
{
    return __atomic_load_n(&px->real_state, __ATOMIC_ACQUIRE) == 1 ? px->real : NULL;
}

/* Whether the database may hold the item: the filter, else whether there is
 * a database at all. */
static bool db_maybe(struct proxy *px, struct kc__fhash h)
{
    pthread_mutex_lock(&px->mu);
    int m = kc__filter_maybe(&px->filter, px->p->filter, h);
    bool mapped = px->filter.map != NULL;
    pthread_mutex_unlock(&px->mu);
    if (m == 0)
        return false;
    if (!mapped) {
        /* No filter: nothing was ever drained if there is no database
         * (the chain looked for a drained put's file before this). */
        char cur[4400];
        snprintf(cur, sizeof cur, "%s/CURRENT", px->p->db);
        if (access(cur, F_OK) != 0 && errno == ENOENT)
            return false;
    }
    return true;
}

/* ---- the proxy's tier operations ---------------------------------------- */

static int px_get(struct kc_tier *t, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info)
{
    if (!db_maybe(P(t), kc__fhash_kernel(ns, key)))
        return -ENOENT;
    struct kc_tier *r = real(P(t));
    return r != NULL ? r->ops->get(r, ns, key, body, len, info) : -ENOENT;
}

static int px_take_by_source(struct kc_tier *t, const char *ns, const kc_digest *source,
                             kc_key *found)
{
    if (!db_maybe(P(t), kc__fhash_source(ns, source)))
        return -ENOENT;
    struct kc_tier *r = real(P(t));
    return r != NULL && r->ops->take_by_source != NULL
               ? r->ops->take_by_source(r, ns, source, found)
               : -ENOENT;
}

static int px_flush(struct kc_tier *t)
{
    struct kc_tier *r = real_if_loaded(P(t));
    return r != NULL && r->ops->flush != NULL ? r->ops->flush(r) : 0;
}

static void px_after_fork(struct kc_tier *t)
{
    struct proxy *px = P(t);
    pthread_mutex_init(&px->mu, NULL);
    pthread_mutex_init(&px->real_mu, NULL);
    struct kc_tier *r = real_if_loaded(px);
    if (r != NULL && r->ops->after_fork != NULL)
        r->ops->after_fork(r);
}

static void px_close(struct kc_tier *t)
{
    if (t == NULL)
        return;
    struct proxy *px = P(t);
    struct kc_tier *r = real_if_loaded(px);
    if (r != NULL)
        r->ops->close(r);
    kc__filter_ro_drop(&px->filter);
    pthread_mutex_destroy(&px->mu);
    pthread_mutex_destroy(&px->real_mu);
    /* px is the chain's (kc__chain_extra): freed with it. */
}

static const struct kc_tier_ops proxy_ops = {
    .name = "db",
    .get = px_get,
    .take_by_source = px_take_by_source,
    .flush = px_flush,
    .after_fork = px_after_fork,
    .close = px_close,
};

/* ---- opening ------------------------------------------------------------ */

int kc__front_open(const struct kc_store_options *opts, void *(*load)(void), struct kc_store **out)
{
    /* The proxy lives in the chain's allocation: one malloc for both. */
    struct kc_store *st;
    int rc = kc__chain_open(opts, kc__self_path(), sizeof(struct proxy), &st);
    if (rc < 0)
        return rc;
    struct proxy *px = kc__chain_extra(st);
    px->base.ops = &proxy_ops;
    px->p = &st->p;
    px->readonly = st->readonly;
    px->max_size = st->max_size;
    px->load = load;
    pthread_mutex_init(&px->mu, NULL);
    pthread_mutex_init(&px->real_mu, NULL);
    rc = kc__chain_add(st, &px->base, 0);
    if (rc < 0) {
        kc__chain_close(st);
        return rc;
    }
    *out = st;
    return 0;
}
