/*
 * owner.h: what the owner's files share. The owner's interface to the rest
 * of the store is internal.h (kc__owner_begin, _drain, _end, ...); this
 * header is for the files of the owner itself, one a job:
 *   owner.c        the session: lock, begin and end, stop requests, write
 *                  batches and the durable commit, the run loop
 *   drain.c        the spool drained into the primary in write batches
 *   evict.c        hit logs folded into recency; eviction past the limit
 *   hot.c          hot files: written, packed and removed past their bound
 *   filter_sync.c  DIR/filter kept in step with the database
 *   refcount.c     refcounted bodies, and deleting a kernels entry
 *   recover.c      a corrupt database repaired, or replaced and salvaged
 *   settle.c       compactions, and settling them when a session ends
 *   admin.c        the tool's writing operations: gc, verify, clear
 *   upload.c       drained puts uploaded to the remote (KCACHE_REMOTE)
 * Byte layouts of what they write to the database are meta.h's.
 */
#ifndef KCACHE_STORE_OWNER_H
#define KCACHE_STORE_OWNER_H

#include "internal.h"
#include "meta.h"

#include <time.h>

/* One owner session (kc__owner_begin .. kc__owner_end). */
struct kc__owner {
    struct kc__paths p;
    int lockfd;
    struct kc__db d;
    uint64_t max_size;
    uint64_t unique; /* deduplicated body bytes */
    uint64_t gen_seq;
    volatile uint64_t *gen;
    int spool_bad;
    bool stop;
    struct kc__filter_rw f; /* DIR/filter; unmapped: none (readers fall back) */
    uint64_t hot_bytes;     /* bytes in DIR/hot, as the owner counted them */
    uint64_t hot_max;       /* 0: no hot files */
    uint64_t hot_room_at;   /* when hot_room last asked the file system (mono ns) */
    bool hot_room_ok;       /* what it said */
    bool recovering;        /* inside kc__owner_recover */
    /* The dictionary new bodies are compressed with, and the samples the
     * next is trained on (dict.c). */
    struct kc__cdict cdict;
    struct kc_buf dict_samples;
    size_t *dict_sizes;
    size_t dict_n, dict_cap;
    uint64_t dict_since; /* body bytes drained since the last training */
};

/* ---- dictionaries (dict.c) ------------------------------------------------ */

/* Loads the current dictionary ("zc") to compress new bodies with: 0, or a
 * read error (none is used then). */
int kc__dict_load(struct kc__owner *o);
/* Forgets the dictionary and the samples (clear; session end). */
void kc__dict_reset(struct kc__owner *o);
/* Notes a drained body (n bytes) as a sample for the next dictionary. */
void kc__dict_sample(struct kc__owner *o, const void *body, size_t n);
/* Trains and writes (synced) a new dictionary when there are samples
 * enough: 0 (trained or not), or a write error. */
int kc__dict_maybe_train(struct kc__owner *o);

/* ---- the session (owner.c) ---------------------------------------------- */

/* Writes the batch (synced or not): 0 or a negative errno; -EBADMSG (a
 * background corruption) also sets o->d.corrupt. The caller keeps wb. */
int kc__owner_write(struct kc__owner *o, rocksdb_writebatch_t *wb, bool sync);
/* Makes everything written so far durable (a synced write of the next
 * generation) and tells readers to catch up. 0 or a negative errno. */
int kc__owner_commit(struct kc__owner *o);
/* Whether a tool operation asked this owner to stop (an s- file). */
bool kc__stop_asked(struct kc__owner *o);

/* ---- refcounted bodies (refcount.c) -------------------------------------- */

/* A body's refcount and size: 0 (both 0 when the value is malformed),
 * -ENOENT when it has none, or another negative errno. */
int kc__ref_get(struct kc__owner *o, const unsigned char digest[16], uint64_t *cnt, uint64_t *size);
/* Sets a body's refcount (in the batch); 0 deletes the refcount and the body. */
void kc__ref_put(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16],
                 uint64_t cnt, uint64_t size);
/* Drops one reference to a body (in the batch); an orphan body is dropped. */
void kc__ref_drop(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16]);
/* Deletes the kernels entry kk, whose value is kv (in the batch), and drops
 * its body reference. */
void kc__kernel_delete(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char *kk,
                       size_t kl, const char *kv, size_t kvl);
/* The deduplicated body bytes, summed over the refcounts. */
uint64_t kc__count_unique(struct kc__owner *o);

/* ---- hot files (hot.c) ----------------------------------------------------- */

/* A file of DIR/hot, as kc__hot_list found it. */
struct kc__hotf {
    char name[33];
    bool packed; /* mode 0400 */
    uint64_t size;
    struct timespec mtime;
};

/* DIR/hot/<hash> of (ns, key) into out (n bytes). */
void kc__hot_path(struct kc__owner *o, const char *ns, const kc_key *key, char *out, size_t n);
/* Removes the hot file of (ns, key), if any, and counts it off. */
void kc__hot_remove(struct kc__owner *o, const char *ns, const kc_key *key);
/* The same for a kernels key (ns \0 key). */
void kc__hot_remove_kk(struct kc__owner *o, const unsigned char *kk, size_t kl);
/* The bytes DIR/hot's files take; with out, the files too (*out malloc'd,
 * NULL when there are none or memory ran out). */
uint64_t kc__hot_list(struct kc__owner *o, struct kc__hotf **out, size_t *nout);
/* DIR/hot's bound now (it follows the database's size). */
uint64_t kc__hot_limit(struct kc__owner *o);
/* Writes the hot file of (ns, key) holding body, whose header is h: whether
 * it was written (o->hot_bytes counts it). */
bool kc__hot_write(struct kc__owner *o, const char *ns, const kc_key *key, const struct kc__hdr *h,
                   const void *body, size_t len);
/* The same under a staged name (DIR/hot/i-<pid>-<hash>, which no reader
 * looks for), for entries not committed yet: kc__hot_stage_end publishes
 * them (renamed to their hot names) once they are, or removes them. A
 * killed writer's are swept at the next session (owner.c clean_stale). */
bool kc__hot_write_staged(struct kc__owner *o, const char *ns, const kc_key *key,
                          const struct kc__hdr *h, const void *body, size_t len);
void kc__hot_stage_end(struct kc__owner *o, bool publish);
/* Whether hot files may be written now (a bound, and room on the disk). */
bool kc__hot_can_write(struct kc__owner *o);
/* Past the bound, packs and removes the least recently hit hot files. */
void kc__hot_enforce(struct kc__owner *o);
/* Removes every hot file. */
void kc__hot_clear(struct kc__owner *o);
/* A hit on (ns, key): refreshes its hot file's mtime, or writes the file
 * from the database. */
void kc__hot_touch(struct kc__owner *o, const char *ns, const kc_key *key);
/* After a round's commit: the put files names[0..n) of DIR/spool that
 * keep[i] says are now their entry become its hot file (size[i] bytes);
 * the others are unlinked. Then enforces the bound. */
void kc__hot_retire_puts(struct kc__owner *o, char **names, const bool *keep, const uint64_t *size,
                         size_t n);

/* ---- the filter (filter_sync.c) ------------------------------------------- */

/* Rebuilds DIR/filter from every kernels and sources key: 0, or a negative
 * errno (the filter file is then removed: readers fall back). */
int kc__owner_filter_rebuild(struct kc__owner *o);
/* At session start: opens the filter, rebuilt when it is not this
 * database's; stamped live. */
void kc__owner_filter_begin(struct kc__owner *o);
/* Before a new database is created: an empty filter for it. */
void kc__owner_filter_before_create(struct kc__owner *o);
/* Rebuilds the filter when deletes made it stale. */
void kc__owner_filter_maybe_rebuild(struct kc__owner *o);

/* ---- drain (drain.c) ------------------------------------------------------- */

/* Applies a put (not committed): 0 with *applied whether it is now the
 * entry (false: the database holds a newer one), or a negative errno. */
int kc__apply_put(struct kc__owner *o, const struct kc__sp_put *sp, bool *applied);
/* The same with the body given as stored (body.c; sp->body unused) and
 * digest, kc_digest_of the stored bytes (the bodies family's key), which
 * the caller has checked: a bundle's entry, or kc__apply_put's. */
int kc__apply_put_stored(struct kc__owner *o, const struct kc__sp_put *sp,
                         const unsigned char digest[16], const void *stored, size_t stored_len,
                         bool *applied);

/* Adds c to the statistics' counters of `backend` (not committed). 0 or a
 * negative errno. */
int kc__owner_add_count(struct kc__owner *o, const char *backend, const struct kc_counters *c);

/* ---- uploads to the remote (upload.c) --------------------------------------- */

/* After a round's commit, before its put files are retired: uploads the
 * put files names[0..n) of DIR/spool that keep[i] says are now their entry
 * (not those a host was served by the remote), entries before manifests,
 * when KCACHE_REMOTE is set; puts the remote could not take now are
 * remembered. Never fails: the entries stay local. */
void kc__upload_round(struct kc__owner *o, char **names, const bool *keep, size_t n);
/* Uploads the remembered puts again, from the database, once the remote
 * can be tried again (its backoff). */
void kc__upload_retry(struct kc__owner *o);

/* ---- recency and eviction (evict.c) ---------------------------------------- */

/* Folds one hit log item into its entry (hits, last hit) and its hot file. */
int kc__apply_hit(struct kc__owner *o, const struct kc__sp_item *it);
/* Evicts the least recently hit entries until o->unique <= target, then
 * commits; *evicted (if not NULL) counts them. */
int kc__evict(struct kc__owner *o, uint64_t target, uint64_t *evicted, kc_progress_fn progress,
              void *arg);
/* Drops sources entries whose kernel is gone. */
void kc__prune_sources(struct kc__owner *o);
/* Past the size limit, evicts down to 90% of it. */
int kc__enforce_limit(struct kc__owner *o);

/* ---- compactions (settle.c) ------------------------------------------------ */

/* Compacts every family but the default one (waits). */
void kc__compact(struct kc__owner *o);
/* At the end of a session, after the flush: lets pending compactions
 * finish (bounded) and merges small families into one sorted run. */
void kc__settle_levels(struct kc__owner *o);

/* ---- recovery (recover.c) and verify (admin.c) ----------------------------- */

/* Recovers a database RocksDB reported corrupt (why: during what, for the
 * log): repaired, or replaced by a new one; hot files put back; verified
 * with repair; the filter rebuilt. 0 or a negative errno. */
int kc__owner_recover(struct kc__owner *o, const char *why);
/* One verify pass (kc__owner_verify without the recovery). */
int kc__verify_once(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                    kc_progress_fn progress, void *arg);

#endif
