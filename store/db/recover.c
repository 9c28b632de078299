/*
 * recover.c: recovering a corrupt database.
 *
 * RocksDB reported a corruption (a table's block checksum, a truncated
 * table, CURRENT or MANIFEST unreadable) at open, in a read or a write.
 * Records carry their own checksums, so nothing wrong was ever served; but
 * a database that fails every drain wedges the spool. Recovery: RocksDB's
 * repair (tables that fail their checks set aside, the MANIFEST rebuilt
 * from the rest), then a full read of every column family; if either
 * fails, the database is moved aside and a fresh one started. Then the
 * hot files (checksummed copies of drained entries) are put back into
 * the database, refcounts are rebuilt and bad entries purged (verify with
 * repair), and the filter is rebuilt. Entries lost are misses, compiled
 * again. Readers are told to reopen (a new epoch).
 */
#include "jobs.h"
#include "../../common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Reads every key and value of every column family: 0, or the error the
 * read stopped on. */
static int db_scan(struct kc__owner *o)
{
    for (int cf = 0; cf < KC__N_CF; cf++) {
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t l;
            rocksdb_iter_value(it, &l);
        }
        int rc = kc__db_iter_err(&o->d, it);
        rocksdb_iter_destroy(it);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Puts each hot file whose entry the database lacks back into it; removes
 * hot files that fail their checks. Returns how many it put back. */
static uint64_t hot_salvage(struct kc__owner *o)
{
    struct kc__hotf *v;
    size_t n;
    uint64_t put = 0;
    kc__hot_list(o, &v, &n);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o->p.hot, v[i].name);
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        if (kc__hot_file_read(o->p.hot, v[i].name, &buf, &sp) != 0) {
            unlink(path);
            continue;
        }
        void *body = NULL;
        size_t blen;
        struct kc__hdr h;
        bool applied = false;
        if (kc__lookup(&o->d, sp.ns, &sp.key, &body, &blen, &h) != 0 &&
            kc__apply_put(o, &sp, &applied) == 0 && applied)
            put++;
        free(body);
        free(buf);
    }
    free(v);
    return put;
}

int kc__owner_recover(struct kc__owner *o, const char *why)
{
    o->recovering = true;
    kc__db_close(&o->d);
    kc__filter_close(&o->f);
    const char *how = "repaired";
    char *err = NULL;
    int rc = kc__db_repair(o->p.db, &err);
    char lost[PATH_MAX];
    snprintf(lost, sizeof lost, "%s/lost", o->p.db);
    kc__rm_rf(lost); /* the tables repair set aside */
    if (rc == 0)
        rc = kc__db_open(&o->d, o->p.db, NULL, NULL);
    if (rc == 0 && (rc = db_scan(o)) < 0)
        kc__db_close(&o->d);
    if (rc < 0) {
        /* Beyond repair: set it aside and start afresh. */
        how = "replaced by a new one";
        char aside[PATH_MAX];
        snprintf(aside, sizeof aside, "%s.bad-%d-%016llx", o->p.db, (int)getpid(),
                 (unsigned long long)kc__rand64());
        if (rename(o->p.db, aside) == 0)
            kc__rm_rf(aside);
        else
            kc__rm_rf(o->p.db);
        rc = kc__db_open(&o->d, o->p.db, NULL, NULL);
    }
    if (rc < 0) {
        kc_log(KC_LOG_WARN, "the database in %s is corrupt and could not be rebuilt (%s)", o->p.dir,
               strerror(-rc));
        free(err);
        o->recovering = false;
        return rc;
    }
    if (o->gen != NULL)
        __atomic_add_fetch(o->gen + 1, 1, __ATOMIC_SEQ_CST); /* readers reopen */
    o->gen_seq = 0;
    kc__db_gen_get(&o->d, &o->gen_seq);
    kc__dict_load(o); /* the one the database still has, or none */
    o->unique = kc__count_unique(o);
    /* The filter must cover what hot_salvage puts back before it is
     * rebuilt from the database (verify below). */
    if (kc__owner_filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    uint64_t salvaged = hot_salvage(o);
    if (salvaged > 0)
        kc__owner_commit(o);
    struct kc_verify_report r = {0};
    rc = kc__verify_once(o, 1, &r, NULL, NULL);
    o->hot_max = kc__hot_limit(o);
    o->hot_bytes = kc__hot_list(o, NULL, NULL);
    kc_log(KC_LOG_WARN,
           "the database in %s failed its checks during %s (%s); %s: %llu entries kept "
           "(%llu put back from hot files, %llu bad purged); entries lost are compiled again",
           o->p.dir, why, err ? err : "corruption", how, (unsigned long long)(r.checked - r.purged),
           (unsigned long long)salvaged, (unsigned long long)r.purged);
    free(err);
    o->recovering = false;
    return rc;
}
