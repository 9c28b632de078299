/*
 * batch.h: the bottom of the owner, which every job of store/db/ stands on:
 * one session's state (struct kc__owner), its write batch and its durable
 * commit (batch.c). Above the database (db.h); it calls nothing above.
 */
#ifndef KCACHE_STORE_BATCH_H
#define KCACHE_STORE_BATCH_H

#include "db.h"

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
    uint64_t hot_newest;    /* of hot_bytes, the newest files kept past hot_max */
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

/* ---- writes (batch.c) ------------------------------------------------------ */

/* Writes the batch (synced or not): 0 or a negative errno; -EBADMSG (a
 * background corruption) also sets o->d.corrupt. The caller keeps wb. */
int kc__owner_write(struct kc__owner *o, rocksdb_writebatch_t *wb, bool sync);
/* Makes everything written so far durable (a synced write of the next
 * generation) and tells readers to catch up. 0 or a negative errno. */
int kc__owner_commit(struct kc__owner *o);
/* Whether a tool operation asked this owner to stop (an s- file). */
bool kc__stop_asked(struct kc__owner *o);
/* The owner's primary (also for white-box tests). */
struct kc__db *kc__owner_db(struct kc__owner *o);

#endif
