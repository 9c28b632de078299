/*
 * parts.h: the owner's shared parts, each one file over the write batch
 * (batch.h) and the database, none calling another: dictionaries
 * (dict.c), refcounted bodies (refcount.c), hot files (hot.c), the key
 * filter (filter_sync.c), the statistics' counters (counters.c),
 * compactions (settle.c) and what an export selects (select.c). The steps
 * (steps.h) and the jobs (jobs.h) stand on them.
 */
#ifndef KCACHE_STORE_PARTS_H
#define KCACHE_STORE_PARTS_H

#include "batch.h"
#include "bundle.h"

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

/* ---- counters (counters.c) ------------------------------------------------ */

/* Adds the counters of `n` items to the database's, with `mark` (the
 * applied key of their log, or NULL), in one write: a log is in the
 * counters exactly when its mark is. Items of one backend are summed
 * first (each backend's key is read once). */
int kc__counts_add(struct kc__owner *o, const struct kc__sp_item *items, size_t n,
                   const unsigned char *mark, size_t markl);
/* Adds c to the statistics' counters of `backend` (not committed). 0 or a
 * negative errno. */
int kc__owner_add_count(struct kc__owner *o, const char *backend, const struct kc_counters *c);

/* ---- compactions (settle.c) ------------------------------------------------ */

/* Compacts every family but the default one (waits). */
void kc__compact(struct kc__owner *o);
/* At the end of a session, after the flush: lets pending compactions
 * finish (bounded) and merges small families into one sorted run. */
void kc__settle_levels(struct kc__owner *o);

/* ---- what an export selects (select.c) ------------------------------------ */

/* An entry of the kernels family, as a selection walks it. */
struct kc__cand {
    char ns[KC__NS_MAX + 1];
    kc_key key;
    const unsigned char *kk; /* kernels key */
    size_t kl;
    struct kc__hdr h;
    const unsigned char *digest;
    uint64_t used; /* last used (ns) */
    uint64_t size; /* what it takes: bytes in the bundle (blocks: on disk) */
    uint64_t raw;  /* its record with its body inflated (the header's count) */
};

/* A selection: the options, the database, and the cut once made. */
struct kc__sel {
    const struct kc_bundle_export_opts *o;
    struct kc__db *d;
    bool blocks; /* sizes in 4 KiB blocks (hot files), not bundle bytes */
    bool exact;  /* sizes as the bodies are stored (a read of each body) */
    /* The reads' options (NULL: d's). An export's skip RocksDB's block
     * checksums: each body is checked against its digest instead (a
     * check from the key to the bytes, the one import makes). */
    rocksdb_readoptions_t *ro;
    /* The cut: entries used after t, and at t those up to kkey k. */
    bool cut;
    uint64_t t;
    unsigned char k[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl; /* 0: none at t */
    uint64_t too_big;
};

/* What the selected entries take (kc__sel_add_total sums it). */
struct kc__sel_total {
    uint64_t bytes, entries;
};

/* The reads' options: s->ro, else the database's. */
rocksdb_readoptions_t *kc__sel_ro(const struct kc__sel *s);
/* Calls fn for every candidate (matching namespace, used since, decodable,
 * not too big) in kernels key order. A non-zero return stops the walk. */
int kc__sel_each(struct kc__sel *s,
                 int (*fn)(struct kc__sel *s, const struct kc__cand *c, void *arg), void *arg);
/* Compares two keys as RocksDB's default comparator does (bytes, then
 * length): <0, 0, >0. */
int kc__sel_kcmp(const unsigned char *a, size_t al, const unsigned char *b, size_t bl);
/* Whether c is inside the cut (every candidate before a cut is made). */
bool kc__sel_selected(const struct kc__sel *s, const struct kc__cand *c);
/* kc__sel_each's fn summing the selected into arg (struct kc__sel_total). */
int kc__sel_add_total(struct kc__sel *s, const struct kc__cand *c, void *arg);
/* Sets the cut so that the selected records take at most budget bytes:
 * the newest first, then kernels key order. 0 or a negative errno. */
int kc__sel_cut(struct kc__sel *s, uint64_t budget);

#endif
