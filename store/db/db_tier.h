/*
 * db_tier.h: the database tier a host reads through (db_tier.c): tier.h's
 * interface over a secondary instance of DIR/db, opened lazily and caught
 * up with the owner's generation. Above db.h; store.c uses it.
 */
#ifndef KCACHE_STORE_DB_TIER_H
#define KCACHE_STORE_DB_TIER_H

#include "db.h"

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

#endif
