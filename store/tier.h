/*
 * tier.h: one place entries are kept, as the store's chain sees it.
 *
 * The store is a chain of tiers (store/local/chain.h): the local files
 * (spool and hot files, store/local/), then the RocksDB database
 * (store/db/), then, later, a remote server. Each implements the
 * operations below; the chain runs them in order and keeps everything
 * that spans tiers (tombstones, noted hits, counters, moves). A tier that
 * does not take part in an operation leaves it NULL.
 */
#ifndef KCACHE_STORE_TIER_H
#define KCACHE_STORE_TIER_H

#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A tier: one place entries are kept (the local files, the RocksDB
 * database, a remote server). Every op returns 0 or a negative errno;
 * -ENOENT is a miss. No op blocks for long: remote tiers bound every call
 * by their timeouts. A tier embeds `struct kc_tier` first. */
struct kc_tier;
struct kc_tier_ops {
    const char *name; /* "local", "db", "remote" */
    /* 0: hit, *body malloc'd (caller frees) with *len bytes, *info (may be
     * NULL) the record's header. -ENOENT: miss. A record that fails its
     * checks is a miss: -EBADMSG, on which the chain also asks the owner to
     * remove it where it is still bad. Any other negative errno: the tier
     * could not be read, a miss as well. */
    int (*get)(struct kc_tier *t, const char *ns, const kc_key *key, void **body, size_t *len,
               struct kc_record_info *info);
    /* Stores an entry (source may be NULL). NULL for a tier another path fills
     * (the database: the owner drains the spool into it). */
    int (*put)(struct kc_tier *t, const char *ns, const kc_key *key, const kc_digest *source,
               uint32_t kind, const void *body, size_t len, uint64_t saved_ns);
    /* Removes key (a bad or stale entry). 0 or -ENOENT. May be NULL. */
    int (*purge)(struct kc_tier *t, const char *ns, const kc_key *key);
    /* The key this tier records for `source` (the seed's sources map):
     * 0 with *found, -ENOENT. The chain does the move (purge of an earlier
     * build's key). May be NULL. */
    int (*take_by_source)(struct kc_tier *t, const char *ns, const kc_digest *source,
                          kc_key *found);
    /* Writes what the tier holds in memory (logs). May be NULL. */
    int (*flush)(struct kc_tier *t);
    /* In a forked child: drop handles the child must not use. May be NULL. */
    void (*after_fork)(struct kc_tier *t);
    /* Releases the tier (NULL-safe). */
    void (*close)(struct kc_tier *t);
};
struct kc_tier {
    const struct kc_tier_ops *ops;
};

#ifdef __cplusplus
}
#endif

#endif
