/*
 * chain.h: the store as a chain of tiers (../tier.h), and its first tier,
 * the local one. libc only: compiled into the preloaded shim, whose front
 * is this chain with a lazy proxy of the database tier behind the local
 * one (shim/front.c), and into libkcache-store.so, whose store is this
 * chain with the database tier itself (store/db/).
 *
 *   get    tombstoned: a miss. Else each tier in order (local first); the
 *          first hit is noted for recency and, when it came from a tier
 *          added with KC__CHAIN_FILL_BACK, also put into the local tier. A
 *          record that fails its checks (-EBADMSG) is a miss there and, in
 *          a tier of this machine, a purge request (KC__PF_IFBAD): the
 *          owner removes it where it is still bad.
 *   put    every tier that takes puts: the local one writes a spool file
 *          (the owner drains it into the database); this process's
 *          tombstones of key and source are lifted and source -> key noted.
 *   take_by_source
 *          this process's own puts, else each tier's sources map; then the
 *          key is looked up as get does. An earlier build's entry is moved:
 *          its source is forgotten, key and source tombstoned, and one
 *          purge request (key and source) written.
 *   purge  looked up as get does (0 when found), tombstoned, and every
 *          tier's purge called (the local tier writes the purge request
 *          the owner applies to the database and the hot files).
 * The chain owns the per-process state that spans tiers (pending.c:
 * tombstones, noted hits, counters, the sources of its own puts). Every
 * function is thread-safe once the chain is built (kc__chain_add before
 * the handle is shared).
 */
#ifndef KCACHE_STORE_CHAIN_H
#define KCACHE_STORE_CHAIN_H

#include "../tier.h"
#include "local.h"

/* ---- the local tier (local_tier.c) -------------------------------------
 *
 * The spool and the hot files: get reads DIR/spool/p-<h>, d-<h>, then
 * DIR/hot/<h> (each a checksummed put file holding exactly the key asked
 * for); put writes a spool file (bounded by the size limit); purge writes a
 * purge request. It also writes the chain's hit and counter logs, and
 * starts the owner (the kcache tool, found on the first need) when nobody
 * holds its lock. */
struct kc__local {
    struct kc_tier base;
    const struct kc__paths *p;
    bool readonly;
    uint64_t max_size;
    const char *lib;    /* the calling library's absolute path, or NULL */
    pthread_mutex_t mu; /* guards everything below */
    bool tool_ready;
    struct kc__kicker kick;
    /* The spool's bound (local_tier.c spool_room): its bytes when last
     * counted, this process's puts since, when; whether it was full. */
    uint64_t spool_seen, spool_added, spool_count_ns;
    bool spool_full, spool_warned;
    /* What the last count found besides bytes, and whether this process
     * wrote a put or purge request since (kc__local_kick_logs). */
    uint64_t spool_work, spool_logs;
    bool wrote_work;
    uint64_t last_created; /* creation times are unique in the process */
    /* The upload descriptor this process's own puts carry (KC__PUT_UPLOAD):
     * kc__chain_set_upload's; NULL: they are never uploaded. */
    char *upload;
    size_t upload_len;
};
/* Sets up l on p (which must outlive it). `tool`: the kcache tool to start
 * the owner with, looked for now (kc__find_tool); NULL: looked for before
 * the first start, beside `lib` (kept: it must outlive l) among others. */
void kc__local_init(struct kc__local *l, const struct kc__paths *p, bool readonly,
                    uint64_t max_size, const char *tool, const char *lib);
/* Writes a purge request (KC__PF_* flags; key or src may be NULL) and
 * starts the owner. Nothing when read-only. */
void kc__local_request(struct kc__local *l, const char *ns, const kc_key *key, const kc_digest *src,
                       uint32_t flags);
/* Writes a spool log of `type` (KC__SP_HITS, KC__SP_COUNT, KC__SP_PURGE)
 * holding the n items of b (begun with kc__spool_begin). None, or
 * read-only: nothing. 0 or negative errno. */
int kc__local_log(struct kc__local *l, int type, struct kc__buf *b, size_t n);
/* Starts the owner unless one holds its lock. Never waits for it. */
void kc__local_kick(struct kc__local *l);
/* After a log only (hits, counters): kc__local_kick when the spool, as this
 * process last counted it, holds work for the owner (a put, a purge) or
 * KC__LOGS_KICK_AT logs or more, when it was full, or when this process
 * wrote work itself since; else nothing. A
 * process that only hit neither takes the owner's lock nor starts it: its
 * log waits for the next owner (`kcache stats` counts it meanwhile). */
void kc__local_kick_logs(struct kc__local *l);
#define KC__LOGS_KICK_AT 64
/* The local tier's put (a spool put file, then the owner is started) with
 * put flags: KC__PUT_FROM_REMOTE marks an entry the remote tier served, so
 * the owner does not upload it again. 0, -EROFS, -EDQUOT (the spool is
 * full) or the write's negative errno. */
int kc__local_put(struct kc__local *l, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns, unsigned flags,
                  uint32_t prov);

/* ---- the chain (chain.c) ------------------------------------------------ */

enum { KC__CHAIN_MAX = 4 };
/* kc__chain_add flag: a hit in this tier is also put into the local one,
 * marked as coming from that tier (KC__PUT_FROM_REMOTE), so the owner does
 * not upload it again. */
#define KC__CHAIN_FILL_BACK 1u

struct kc_store {
    struct kc__paths p; /* the cache directory's layout */
    bool readonly;
    uint64_t max_size;      /* bytes; 0: KC_DEFAULT_MAX_SIZE */
    struct kc__local local; /* tier[0] */
    struct kc__pending pd;  /* tombstones, hits, counters, own puts' sources */
    void *extra;            /* kc__chain_extra */
    /* Whether an entry of a local tier with this provenance may be served
     * (kc__chain_set_served; NULL: all): a signer no longer trusted. */
    bool (*served)(uint32_t prov);
    size_t n; /* tiers, in the order get tries them */
    struct kc_tier *tier[KC__CHAIN_MAX];
    unsigned flags[KC__CHAIN_MAX];
};

/* Opens a chain on opts->dir (copied) holding the local tier alone. The
 * one place the cache directory is checked: a private directory of ours
 * (created 0700 with spool/ and sec/ unless read-only; missing and
 * read-only: every get misses), spool/ and hot/ private directories when
 * present, no symlink. `lib`: the calling library's absolute path (kept;
 * NULL: unknown), beside which the kcache tool is looked for. `extra`:
 * bytes the caller wants in the chain's own allocation (zeroed, aligned;
 * kc__chain_extra), for a tier of its own: the shim's front costs one
 * allocation. 0 with *out (close it with kc__chain_close); -EINVAL,
 * -ENAMETOOLONG, -ENOMEM, -EPERM (another user's or writable by others),
 * -ENOTDIR, -ENOTEMPTY (not a store) or another negative errno. */
int kc__chain_open(const struct kc_store_options *opts, const char *lib, size_t extra,
                   struct kc_store **out);
/* The `extra` bytes of kc__chain_open, freed with the chain (a tier kept
 * there must not free itself at close). */
void *kc__chain_extra(struct kc_store *st);
/* Appends tier t (owned by the chain from now on: closed with it) with
 * KC__CHAIN_* flags. Before the chain is shared. 0, or -ENOSPC when full
 * (t is closed). */
int kc__chain_add(struct kc_store *st, struct kc_tier *t, unsigned flags);
/* This process's puts carry `desc` (n bytes, copied), its remote's upload
 * configuration, so the owner uploads them with it; NULL: the process has
 * no remote (or does not write to it), and its puts are never uploaded.
 * Before the chain is shared. 0 or -ENOMEM. */
int kc__chain_set_upload(struct kc_store *st, const char *desc, size_t n);
/* Entries of the local tiers whose provenance `served` refuses are misses
 * (a signer removed from the trusted keys). Before the chain is shared. */
void kc__chain_set_served(struct kc_store *st, bool (*served)(uint32_t prov));
/* The chain's tier whose ops are `ops`, or NULL. */
struct kc_tier *kc__chain_find(struct kc_store *st, const struct kc_tier_ops *ops);

/* store.h's data path (struct kc_store_ops, with its contracts): the
 * table, and its functions one by one. */
extern const struct kc_store_ops kc__chain_ops;
void kc__chain_close(struct kc_store *st);
int kc__chain_get(struct kc_store *st, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info);
int kc__chain_put(struct kc_store *st, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns);
int kc__chain_take_by_source(struct kc_store *st, const char *ns, const kc_digest *source,
                             uint64_t build, void **body, size_t *len, kc_key *found,
                             struct kc_record_info *info);
int kc__chain_purge(struct kc_store *st, const char *ns, const kc_key *key);
void kc__chain_count(struct kc_store *st, const char *backend, const struct kc_counters *c);
/* Keeps locally an entry a tier behind the local one served (the chain
 * does so itself for a tier added with KC__CHAIN_FILL_BACK; a caller that
 * asked such a tier directly does it with this): a spool put marked
 * KC__PUT_FROM_REMOTE. Nothing on a read-only chain. */
void kc__chain_fill_back(struct kc_store *st, const char *ns, const kc_key *key,
                         const struct kc_record_info *info, const void *body, size_t len);
/* Writes the noted hits and counters, then flushes every tier. */
int kc__chain_flush(struct kc_store *st);
void kc__chain_after_fork_child(struct kc_store *st);

#endif
