/*
 * settle.c: compactions. At the end of a session the owner lets RocksDB
 * finish the compactions it scheduled and merges small families into one
 * sorted run; gc, clear and eviction compact every family.
 */
#include "parts.h"

#include <stdlib.h>
#include <time.h>

/* At the end of a session: a get probes every L0 table and every level of
 * the kernels and bodies families (a table lookup and a filter each, about
 * 0.5 us here), and RocksDB compacts in the background only while the
 * owner lives. A session that ended with its compactions pending left
 * them for the next one: after a fill of a million entries, 11 L0 tables
 * and an oversized L1, and a get took 33 us instead of 27 us in one run.
 * So the session first lets RocksDB finish what it has scheduled (at most
 * KC__SETTLE_MS; the work is what the next session would do anyway), and
 * a family still in more than one sorted run while under 32 MiB (the usual
 * store: a second at most) is compacted into one. An owner asked to stop
 * by a tool operation skips all this (the tool's own session settles).
 * Never in a host process: only the owner, the tool and
 * kc_store_admin()->drain end sessions. */
#define KC__SETTLE_MS 120000

void kc__compact(struct kc__owner *o)
{
    for (int cf = KC__CF_KERNELS; cf < KC__N_CF; cf++)
        rocksdb_compact_range_cf(o->d.db, o->d.cf[cf], NULL, 0, NULL, 0);
}

/* kc__db_cf_runs, and the family's tables' bytes. */
static bool cf_runs(struct kc__owner *o, int cf, uint64_t *runs, uint64_t *l0, uint64_t *bytes)
{
    return kc__db_cf_runs(o->d.db, o->d.cf[cf], runs, l0) &&
           rocksdb_property_int_cf(o->d.db, o->d.cf[cf], "rocksdb.total-sst-files-size", bytes) ==
               0;
}

void kc__settle_levels(struct kc__owner *o)
{
    static const int cfs[] = {KC__CF_KERNELS, KC__CF_BODIES};
    /* RocksDB merges L0 into L1 only from 4 tables on: each session's
     * flush adds one, and up to 3 stayed for every get to probe. From 2,
     * this session asks for the merge (it rewrites L1, at most 256 MB). */
    for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
        uint64_t runs = 0, l0 = 0, bytes = 0;
        if (!o->stop && cf_runs(o, cfs[i], &runs, &l0, &bytes) && l0 >= 2) {
            const char *k[] = {"level0_file_num_compaction_trigger"}, *v[] = {"1"};
            char *err = NULL;
            rocksdb_set_options_cf(o->d.db, o->d.cf[cfs[i]], 1, k, v, &err);
            free(err);
        }
    }
    uint64_t t0 = kc_mono_ns();
    for (int round = 0;; round++) {
        /* A tool waiting for the lock (15 s) goes first. */
        if (o->stop || (round % 5 == 4 && kc__stop_asked(o)))
            return;
        uint64_t pending = 0, running = 0;
        if (rocksdb_property_int(o->d.db, "rocksdb.compaction-pending", &pending) != 0 ||
            rocksdb_property_int(o->d.db, "rocksdb.num-running-compactions", &running) != 0)
            break;
        if (pending == 0 && running == 0)
            break;
        if (kc_mono_ns() - t0 > (uint64_t)KC__SETTLE_MS * 1000000u)
            return;
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
        uint64_t runs = 0, l0 = 0, bytes = 0;
        if (cf_runs(o, cfs[i], &runs, &l0, &bytes) && runs > 1 && bytes < (32ull << 20))
            rocksdb_compact_range_cf(o->d.db, o->d.cf[cfs[i]], NULL, 0, NULL, 0);
    }
}
