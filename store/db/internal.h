/*
 * Internals of libkcache-store.so, shared by its source files and by the
 * store's white-box tests. Nothing here is part of the ABI (store.h is).
 * The libc-only part (layouts, files, directory layout, filter, hot files,
 * the chain of tiers) is store/local/, which the preloaded shim compiles
 * too; the database's byte layout is meta.h; what the owner's files share
 * is owner.h.
 */
#ifndef KCACHE_STORE_INTERNAL_H
#define KCACHE_STORE_INTERNAL_H

#include "../local/chain.h"

#include <limits.h>
#include <pthread.h>
#include <rocksdb/c.h>

/* ---- RocksDB handles (db.c) --------------------------------------------- */

enum { KC__CF_DEFAULT, KC__CF_KERNELS, KC__CF_BODIES, KC__CF_SOURCES, KC__CF_META, KC__N_CF };

/* Decoding dictionaries (body.c), loaded once each through load (the
 * database's meta family, or a bundle's header) and kept. Thread-safe. */
struct kc__dicts {
    pthread_mutex_t mu;
    struct {
        uint64_t id;
        void *dd;
    } * v;
    size_t n, cap;
    int (*load)(void *arg, uint64_t id, char **p, size_t *n);
    void *arg;
    bool live;
};

struct kc__db {
    rocksdb_t *db;
    rocksdb_column_family_handle_t *cf[KC__N_CF];
    rocksdb_options_t *opts[KC__N_CF + 1];
    rocksdb_cache_t *cache;
    rocksdb_readoptions_t *ro;
    rocksdb_writeoptions_t *wo;      /* not synced */
    rocksdb_writeoptions_t *wo_sync; /* synced */
    bool secondary;
    bool corrupt; /* RocksDB reported a corruption (get or iterate) */
    bool leak;    /* a secondary whose log has no room reserved: never closed */
    /* The bodies' dictionaries ("z/" in meta), loaded once each. On the
     * heap: a kc__db is copied (a replaced reader) and this stays put. */
    struct kc__dicts *dicts;
};

/* Opens DIR/db as the primary (creating it) or as a secondary in `secpath`. */
int kc__db_open(struct kc__db *d, const char *dbpath, const char *secpath, char **why);
void kc__db_close(struct kc__db *d);
/* RocksDB's repair (rocksdb_repair_db) of DIR/db: rebuilds the MANIFEST from
 * the tables, setting aside those that fail their checks. */
int kc__db_repair(const char *dbpath, char **why);
/* RocksDB threads (rocksdb:*) alive in this process; negative errno. While
 * no primary is open there are none once an open or close returns. */
int kc__db_env_threads(void);
/* In a forked child: the lock ordering thread pools is free again. */
void kc__db_after_fork_child(void);
/* Waits up to wait_ms for no RocksDB thread to be left; whether none is. */
bool kc__db_env_quiesce(int wait_ms);
/* Flushes every column family's memtable to table files (waits). A
 * database closed with data only in its WAL makes every reader replay
 * that WAL when it opens, and keeps the data uncompressed. */
int kc__db_flush_all(struct kc__db *d);
/* A column family's sorted runs (each L0 table one, each deeper level with
 * tables one) and its L0 tables, from rocksdb.levelstats ("Level Files
 * Size(MB)" lines); false when RocksDB does not say. */
bool kc__db_cf_runs(rocksdb_t *db, rocksdb_column_family_handle_t *cf, uint64_t *runs,
                    uint64_t *l0);
/* Maps a RocksDB error string to an errno (and frees it): Corruption
 * -EBADMSG, the LOCK file held -EBUSY, -ENOSPC, -EROFS, -EACCES, -ENOENT,
 * else -EIO. */
int kc__db_err(char *err, const char *what);
/* The error an iterator stopped on (0: none; it reached the end); a
 * corruption sets d->corrupt. */
int kc__db_iter_err(struct kc__db *d, rocksdb_iterator_t *it);
/* Reads a value: 0 with *val malloc'd, -ENOENT, -EBADMSG (RocksDB reports a
 * corruption; sets d->corrupt) or another negative errno. */
int kc__db_get(struct kc__db *d, int cf, const void *k, size_t klen, char **val, size_t *vlen);
/* Catches a secondary up with what the primary has committed: 0, or a
 * negative errno when it cannot follow (replace it). */
int kc__db_catch_up(struct kc__db *d);

/* Looks up an entry in a db: 0 with body (malloc'd), -ENOENT, -EBADMSG
 * (present but fails its checks), -EIO. */
int kc__lookup(struct kc__db *d, const char *ns, const kc_key *key, void **body, size_t *len,
               struct kc__hdr *h);

/* ---- the database tier (db_tier.c) ---------------------------------------- */

/* The database as one process reads it (tier.h; db_tier.c's comment). */
struct kc__reopen;
struct kc__dbt {
    struct kc_tier base;
    struct kc__paths p;
    bool readonly;
    uint64_t max_size;

    /* The reader. mu serialises opening, catching up and replacing it;
     * rdlk is held shared by every use of rd and exclusively to replace
     * it; rd_ready is published with release. */
    pthread_mutex_t mu;
    pthread_rwlock_t rdlk;
    struct kc__db rd;
    int rd_ready;
    char secpath[PATH_MAX];
    int secfd; /* holds secpath (kc__dir_hold), -1 without one */
    /* A replacement reader being opened in the background after a new
     * owner session began (guarded by mu). */
    struct kc__reopen *ro_done; /* finished, not yet installed */
    pthread_cond_t ro_cv;       /* signalled when ro_done is set */
    pthread_t ro_thr;
    bool ro_live;         /* ro_thr started and not joined */
    bool ro_finished;     /* ro_thr returned from opening (guarded by mu) */
    bool exiting;         /* the process exits: RocksDB is not used again */
    struct kc__dbt *next; /* every open database tier (all_mu) */
    uint64_t ro_seq;      /* bumped to disown an in-flight reopen */
    uint64_t caught_gen;
    uint64_t rd_epoch;
    uint64_t next_open_ns;
    int open_rc; /* the last reader_open's result (mu) */
    volatile uint64_t *gen;
};

/* Opens the database tier on opts->dir (store.h, db_tier_open): no RocksDB
 * instance until a get needs one. 0 with *out, -EINVAL or -ENOMEM. */
int kc__dbt_open(const struct kc_store_options *opts, struct kc_tier **out);
/* The database tier of a store this library opened, or NULL. */
struct kc__dbt *kc__dbt_of(struct kc_store *st);
/* The owner's generation (DIR/gen): read after looking in the spool. */
uint64_t kc__dbt_gen(struct kc__dbt *st);
/* Brings the reader up to what the owner has committed as of generation g
 * (force: even if it did not move), opening it if need be. Whether the
 * reader is usable; use it holding rdlk shared, while rd_ready. */
bool kc__dbt_refresh(struct kc__dbt *st, uint64_t g, bool force);
/* Closes the reader and opens a new one now (a tool's retry after a walk
 * that failed). Returns whether the reader is usable. */
bool kc__dbt_reopen(struct kc__dbt *st);

/* ---- the owner (owner.c; its jobs in the files owner.h lists) ---------- */

struct kc__owner;

/* Becomes the owner of `dir`: takes the lock (asking a running owner to stop
 * and waiting up to wait_ms), opens the primary, drains the spool. */
int kc__owner_begin(const char *dir, uint64_t max_size, int wait_ms, struct kc__owner **out);
void kc__owner_end(struct kc__owner *o);
int kc__owner_drain(struct kc__owner *o, uint64_t *n);
int kc__owner_verify(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg);
int kc__owner_gc(struct kc__owner *o, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg);
int kc__owner_clear(struct kc__owner *o);
int kc__owner_run(const struct kc_store_options *opts, int idle_ms);
/* The owner's primary, for white-box tests. */
struct kc__db *kc__owner_db(struct kc__owner *o);

#endif
