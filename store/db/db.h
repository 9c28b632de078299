/*
 * db.h: the database's handles (db.c): RocksDB options, opening as the
 * primary or a secondary, gets, the errors RocksDB reports as errnos, and
 * a reader's lookup of one entry. Above meta.h and body.h; below
 * everything that reads or writes the database.
 */
#ifndef KCACHE_STORE_DB_H
#define KCACHE_STORE_DB_H

#include "body.h"
#include "meta.h"

#include <limits.h>
#include <pthread.h>
#include <rocksdb/c.h>

/* ---- RocksDB handles (db.c) --------------------------------------------- */

enum { KC__CF_DEFAULT, KC__CF_KERNELS, KC__CF_BODIES, KC__CF_SOURCES, KC__CF_META, KC__N_CF };

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

/* kc__db_get of the bodies family, then kc__body_decode with d's
 * dictionaries. */
int kc__body_get(struct kc__db *d, const unsigned char digest[16], char **body, size_t *n);

/* Reads the generation: 0 with *gen set, -EBADMSG when the value is not 8
 * bytes, or kc__db_get's error (-ENOENT: none yet); *gen is set only on 0. */
int kc__db_gen_get(struct kc__db *d, uint64_t *gen);

#endif
