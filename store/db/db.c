/*
 * db.c: RocksDB options and handles, shared by readers (secondaries) and
 * the owner (primary).
 *
 * Column families: kernels (ns \0 key -> header + body digest, small, in
 * SST files), bodies (digest -> body as stored by body.c, one body per SST
 * block), sources (ns \0 source digest -> key), meta
 * (b/<backend> counters, n/<ns> namespace names, r/<digest> refcount+size).
 */
#include "db.h"
#include "rocksdb_compat.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <sys/stat.h>
#include <time.h>

static const char *const cf_names[KC__N_CF] = {"default", "kernels", "bodies", "sources", "meta"};

static rocksdb_options_t *make_options(int cf, rocksdb_cache_t *cache, bool secondary)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_block_based_table_options_t *t = rocksdb_block_based_options_create();
    /* A reader in a host process fetches each body about once (a fresh
     * process compiles each kernel once; later compiles of it are served
     * from the shim's own state or DIR/hot), so caching decompressed
     * bodies there only costs the host memory: the OS page cache already
     * keeps the compressed blocks for every process. Without it a body
     * read costs the same in a store of a thousand entries as in one of a
     * million: one pread and one decompression of exactly that body. The
     * kernels column family likewise (each key is looked up about once per
     * process; at a million entries its blocks no longer fit the cache,
     * and every get paid a read, an lz4 decompression and a cache insert).
     * The small ones (sources, meta) keep the cache. */
    if ((cf == KC__CF_BODIES || cf == KC__CF_KERNELS) && secondary)
        rocksdb_block_based_options_set_no_block_cache(t, 1);
    else
        rocksdb_block_based_options_set_block_cache(t, cache);
    rocksdb_block_based_options_set_filter_policy(t, rocksdb_filterpolicy_create_bloom_full(10));
    /* Index and filter blocks are read when a table is opened and kept
     * with the open table, outside the block cache: a point lookup then
     * costs one data block read. */
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(t, 0);
    /* Bodies: one per block (a block is cut once it holds block_size
     * bytes), so a get decompresses only the body it asked for; with
     * 16 KB blocks a median 8 KB body came with its neighbours. */
    /* Kernels: 1 KB blocks, uncompressed (below): a get reads ~6 entries
     * and decompresses nothing. Their keys and values are digests, which
     * lz4 barely shrinks. */
    rocksdb_block_based_options_set_block_size(t, cf == KC__CF_BODIES    ? 1
                                                  : cf == KC__CF_KERNELS ? 1024
                                                                         : 4096);
    rocksdb_options_set_block_based_table_factory(o, t);
    rocksdb_block_based_options_destroy(t);
    rocksdb_options_set_info_log_level(o, 4 /* FATAL */);
    rocksdb_options_set_max_log_file_size(o, 1 << 20);
    rocksdb_options_set_keep_log_file_num(o, 2);
    rocksdb_options_set_stats_dump_period_sec(o, 0);
    rocksdb_options_set_stats_persist_period_sec(o, 0);
    if (secondary) {
        /* A reader opens tables lazily (only those a lookup touches), does
         * not read every table's properties for statistics, and does not
         * stat every file: a fresh process pays for what it reads. */
        rocksdb_options_set_max_open_files(o, KC_ROCKSDB_SECONDARY_MAX_OPEN_FILES);
        /* The default (16) starts 16 threads per column family at open
         * to load table handlers: ~80 short-lived threads per process. */
        rocksdb_options_set_max_file_opening_threads(o, 1);
        rocksdb_options_set_skip_stats_update_on_db_open(o, 1);
        rocksdb_options_set_skip_checking_sst_file_sizes_on_db_open(o, 1);
    } else {
        rocksdb_options_set_max_open_files(o, -1);
    }
    rocksdb_options_set_write_buffer_size(o, cf == KC__CF_BODIES ? (32u << 20) : (8u << 20));
    if (cf == KC__CF_BODIES) {
        /* Bodies in SST blocks, one value per block, each already a zstd
         * frame (body.c): RocksDB does not compress them again, so a
         * flush or a compaction copies them, and a bundle reads them as
         * they lie. Not BlobDB: RocksDB 7.8's secondary instance
         * (ReactiveVersionSet) binds the blob cache key's db_id and
         * db_session_id to temporaries, and a blob read through a
         * secondary then reads freed memory (crashes seen here after the
         * primary compacted). Revisit with RocksDB >= 8. Tables written
         * by an earlier version (zstd blocks with a dictionary per table)
         * are still read; compactions rewrite them uncompressed. */
        rocksdb_options_set_compression(o, 0 /* none */);
    } else if (cf == KC__CF_KERNELS) {
        rocksdb_options_set_compression(o, 0 /* none */);
    } else {
        rocksdb_options_set_compression(o, 4 /* lz4 */);
    }
    if (cf == KC__N_CF) { /* the database-wide options */
        rocksdb_options_set_create_if_missing(o, !secondary);
        rocksdb_options_set_create_missing_column_families(o, !secondary);
        rocksdb_options_set_max_background_jobs(o, 2);
        rocksdb_options_set_max_total_wal_size(o, 64u << 20);
    }
    return o;
}

int kc__db_err(char *err, const char *what)
{
    if (err == NULL)
        return 0;
    /* RocksDB's status strings start with the code ("Corruption: ",
     * "IO error: ", "NotFound: ", ...); the lock error is an IO error that
     * names the LOCK file ("While lock file: .../LOCK: Resource temporarily
     * unavailable", or "lock hold by current process"). Match the code
     * first: a corruption message may quote anything ("block checksum
     * mismatch" once read as a lock error). */
    int rc = -EIO;
    if (strncmp(err, "Corruption", 10) == 0)
        rc = -EBADMSG;
    else if (strstr(err, "While lock file") || strstr(err, "lock hold by current process"))
        rc = -EBUSY;
    else if (strstr(err, "No space left"))
        rc = -ENOSPC;
    else if (strstr(err, "Read-only file system"))
        rc = -EROFS;
    else if (strstr(err, "Permission denied"))
        rc = -EACCES;
    else if (strncmp(err, "NotFound", 8) == 0 || strstr(err, "No such file"))
        rc = -ENOENT;
    (void)what;
    free(err);
    return rc;
}

int kc__db_iter_err(struct kc__db *d, rocksdb_iterator_t *it)
{
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    int rc = kc__db_err(err, "iterate");
    if (rc == -EBADMSG)
        d->corrupt = true;
    return rc;
}

/* ---- RocksDB's threads --------------------------------------------------
 *
 * Opening any database starts the default Env's thread pools
 * (rocksdb:low, rocksdb:high). A secondary never uses them, and in a host
 * process they are a hazard: a child the host forks inherits the pools'
 * bookkeeping but not the threads, and its exit() runs RocksDB's static
 * destructors, which join threads that do not exist there (the child hangs
 * or aborts). So while no primary is open in the process the pools are
 * shrunk to zero threads; RocksDB lets excess threads exit on their own
 * (detached) and starts them again when a primary opens
 * (IncBackgroundThreadsIfNeeded). env_mu orders this against primaries
 * opening on other threads. */

static int db_open(struct kc__db *d, const char *dbpath, const char *secpath, char **why);

static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;
static int n_primary;

void kc__db_after_fork_child(void)
{
    pthread_mutex_init(&env_mu, NULL);
}

int kc__db_env_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -errno;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[64], comm[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%.20s/comm", e->d_name);
        FILE *f = fopen(path, "re");
        if (f == NULL)
            continue;
        if (fgets(comm, sizeof comm, f) != NULL && strncmp(comm, "rocksdb:", 8) == 0)
            n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

bool kc__db_env_quiesce(int wait_ms)
{
    for (int i = 0;; i++) {
        int n = kc__db_env_threads();
        if (n <= 0)
            return true;
        if (i >= wait_ms * 5)
            return false;
        struct timespec ts = {0, 200000}; /* 0.2 ms */
        nanosleep(&ts, NULL);
    }
}

/* Shrinks the pools to zero threads and waits (bounded) until they are
 * gone; env_mu held, no primary open. */
static void env_threads_stop(void)
{
    rocksdb_env_t *env = rocksdb_create_default_env();
    rocksdb_env_set_bottom_priority_background_threads(env, 0);
    rocksdb_env_set_low_priority_background_threads(env, 0);
    rocksdb_env_set_high_priority_background_threads(env, 0);
    rocksdb_env_destroy(env); /* the default Env itself stays */
    kc__db_env_quiesce(500);
}

/* RocksDB makes the database's directory and files with the mode the
 * process's umask leaves (0755 and 0644 under umask 022), and a host
 * process's umask is not ours to change: the directory is made 0700 first,
 * so no file in it is reachable by others whatever its mode, and one an
 * older kcache left open to others is closed. */
static void db_dir_private(const char *dbpath)
{
    if (mkdir(dbpath, 0700) == 0 || errno != EEXIST)
        return;
    struct stat sb;
    if (lstat(dbpath, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
        (sb.st_mode & 077) != 0)
        chmod(dbpath, sb.st_mode & 0700);
}

int kc__db_open(struct kc__db *d, const char *dbpath, const char *secpath, char **why)
{
    int rc = 0;
    if (secpath == NULL)
        db_dir_private(dbpath);
    if (secpath == NULL) {
        pthread_mutex_lock(&env_mu);
        n_primary++;
        pthread_mutex_unlock(&env_mu);
    }
    rc = db_open(d, dbpath, secpath, why);
    pthread_mutex_lock(&env_mu);
    if (secpath == NULL && rc < 0)
        n_primary--;
    if (n_primary == 0)
        env_threads_stop();
    pthread_mutex_unlock(&env_mu);
    return rc;
}

int kc__db_repair(const char *dbpath, char **why)
{
    rocksdb_cache_t *cache = rocksdb_cache_create_lru(8u << 20);
    rocksdb_options_t *o = make_options(KC__N_CF, cache, false);
    char *err = NULL;
    rocksdb_repair_db(o, dbpath, &err);
    if (err != NULL && why != NULL)
        *why = strdup(err);
    int rc = kc__db_err(err, "repair");
    rocksdb_options_destroy(o);
    rocksdb_cache_destroy(cache);
    pthread_mutex_lock(&env_mu);
    if (n_primary == 0)
        env_threads_stop();
    pthread_mutex_unlock(&env_mu);
    return rc;
}

/* A secondary's info log (secpath/LOG) cannot be turned off in RocksDB 7.8
 * (a logger it cannot create fails the open), and its writer asserts, so
 * aborts the host, on a write after one that failed (ENOSPC on a full
 * disk). At info level FATAL the secondary writes its option header at
 * open, partly buffered, and flushes the rest when it closes (~55 KB).
 * The caller checked for free space before opening; here the space the
 * rest of the log needs is reserved (fallocate, size kept), so closing
 * cannot fail for want of it. Without the reservation the secondary is
 * never closed (its memory is leaked instead). */
static void log_reserve(struct kc__db *d, const char *secpath)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/LOG", secpath);
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        d->leak = errno != ENOENT;
        return;
    }
    d->leak = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 256 << 10) != 0;
    close(fd);
}

/* A database's dictionaries, and what loading one from it takes. */
struct db_dicts {
    struct kc__dicts dicts; /* first: kc__db's pointer is to it */
    rocksdb_t *db;
    rocksdb_column_family_handle_t *meta;
    rocksdb_readoptions_t *ro;
};

/* Loads dictionary id from the meta family ("z/" id). */
static int dict_load(void *arg, uint64_t id, char **p, size_t *n)
{
    struct db_dicts *x = arg;
    unsigned char k[KC__META_DICT_KEY_LEN];
    size_t kl = kc__meta_dict_key(id, k), vl = 0;
    char *err = NULL;
    char *v = rocksdb_get_cf(x->db, x->ro, x->meta, (const char *)k, kl, &vl, &err);
    if (err != NULL) {
        free(v);
        return kc__db_err(err, "get");
    }
    if (v == NULL)
        return -ENOENT;
    *p = v;
    *n = vl;
    return 0;
}

static void dicts_attach(struct kc__db *d)
{
    struct db_dicts *x = calloc(1, sizeof *x);
    if (x == NULL)
        return; /* bodies naming a dictionary are then misses */
    x->db = d->db;
    x->meta = d->cf[KC__CF_META];
    x->ro = d->ro;
    kc__dicts_init(&x->dicts, dict_load, x);
    d->dicts = &x->dicts;
}

static int db_open(struct kc__db *d, const char *dbpath, const char *secpath, char **why)
{
    memset(d, 0, sizeof *d);
    d->secondary = secpath != NULL;
    d->cache = rocksdb_cache_create_lru(secpath ? (8u << 20) : (32u << 20));
    for (int i = 0; i <= KC__N_CF; i++)
        d->opts[i] = make_options(i, d->cache, d->secondary);
    char *err = NULL;
    const rocksdb_options_t *cfo[KC__N_CF];
    for (int i = 0; i < KC__N_CF; i++)
        cfo[i] = d->opts[i];
    if (secpath)
        d->db = rocksdb_open_as_secondary_column_families(d->opts[KC__N_CF], dbpath, secpath,
                                                          KC__N_CF, cf_names, cfo, d->cf, &err);
    else
        d->db = rocksdb_open_column_families(d->opts[KC__N_CF], dbpath, KC__N_CF, cf_names, cfo,
                                             d->cf, &err);
    if (err != NULL || d->db == NULL) {
        if (why != NULL && err != NULL)
            *why = strdup(err);
        int rc = err ? kc__db_err(err, "open") : -EIO;
        d->db = NULL;
        kc__db_close(d);
        return rc;
    }
    if (secpath != NULL)
        log_reserve(d, secpath);
    d->ro = rocksdb_readoptions_create();
    d->wo = rocksdb_writeoptions_create();
    d->wo_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(d->wo_sync, 1);
    dicts_attach(d);
    return 0;
}

int kc__db_flush_all(struct kc__db *d)
{
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(fo, 1);
    int rc = 0;
    for (int i = 0; i < KC__N_CF && rc == 0; i++) {
        char *err = NULL;
        rocksdb_flush_cf(d->db, fo, d->cf[i], &err);
        rc = kc__db_err(err, "flush");
    }
    rocksdb_flushoptions_destroy(fo);
    return rc;
}

bool kc__db_cf_runs(rocksdb_t *db, rocksdb_column_family_handle_t *cf, uint64_t *runs, uint64_t *l0)
{
    char *ls = rocksdb_property_value_cf(db, cf, "rocksdb.levelstats");
    if (ls == NULL)
        return false;
    *runs = *l0 = 0;
    for (char *line = strchr(ls, '\n'); line != NULL; line = strchr(line + 1, '\n')) {
        int l;
        unsigned long long n;
        if (sscanf(line + 1, "%d %llu", &l, &n) == 2 && l >= 0) {
            *runs += l == 0 ? n : n > 0;
            if (l == 0)
                *l0 = n;
        }
    }
    free(ls);
    return true;
}

void kc__db_close(struct kc__db *d)
{
    if (d->dicts != NULL) {
        kc__dicts_free(d->dicts);
        free(d->dicts); /* the db_dicts it is the first member of */
        d->dicts = NULL;
    }
    if (d->db != NULL && d->leak) {
        /* Closing would flush its log onto a full disk (log_reserve). */
        memset(d, 0, sizeof *d);
        return;
    }
    if (d->db != NULL) {
        for (int i = 0; i < KC__N_CF; i++)
            if (d->cf[i] != NULL)
                rocksdb_column_family_handle_destroy(d->cf[i]);
        rocksdb_close(d->db);
        if (!d->secondary) {
            pthread_mutex_lock(&env_mu);
            if (--n_primary == 0)
                env_threads_stop();
            pthread_mutex_unlock(&env_mu);
        }
    }
    for (int i = 0; i <= KC__N_CF; i++)
        if (d->opts[i] != NULL)
            rocksdb_options_destroy(d->opts[i]);
    if (d->cache)
        rocksdb_cache_destroy(d->cache);
    if (d->ro)
        rocksdb_readoptions_destroy(d->ro);
    if (d->wo)
        rocksdb_writeoptions_destroy(d->wo);
    if (d->wo_sync)
        rocksdb_writeoptions_destroy(d->wo_sync);
    memset(d, 0, sizeof *d);
}

int kc__db_get(struct kc__db *d, int cf, const void *k, size_t klen, char **val, size_t *vlen)
{
    char *err = NULL;
    size_t n = 0;
    char *v = rocksdb_get_cf(d->db, d->ro, d->cf[cf], k, klen, &n, &err);
    if (err != NULL) {
        free(v);
        int rc = kc__db_err(err, "get");
        if (rc == -EBADMSG)
            d->corrupt = true;
        return rc == -ENOENT ? -EIO : rc;
    }
    if (v == NULL)
        return -ENOENT;
    *val = v;
    *vlen = n;
    return 0;
}

int kc__body_get(struct kc__db *d, const unsigned char digest[16], char **body, size_t *n)
{
    char *v = NULL;
    size_t vl = 0;
    int rc = kc__db_get(d, KC__CF_BODIES, digest, 16, &v, &vl);
    if (rc < 0)
        return rc;
    rc = kc__body_decode(v, vl, d->dicts, body, n);
    free(v);
    return rc;
}

int kc__db_catch_up(struct kc__db *d)
{
    char *err = NULL;
    rocksdb_try_catch_up_with_primary(d->db, &err);
    return kc__db_err(err, "catch up");
}

int kc__lookup(struct kc__db *d, const char *ns, const kc_key *key, void **body, size_t *len,
               struct kc__hdr *h)
{
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(ns, key, kk);
    char *kv = NULL, *bv = NULL;
    size_t kvl = 0, bvl = 0;
    int rc = kc__db_get(d, KC__CF_KERNELS, kk, kl, &kv, &kvl);
    if (rc < 0)
        return rc;
    if (kc__kval_decode(kv, kvl, h) != 0) {
        free(kv);
        return -EBADMSG;
    }
    rc = kc__body_get(d, kc__kval_digest(kv, kvl), &bv, &bvl);
    free(kv);
    if (rc < 0)
        return rc;
    if (bvl != h->body_size || kc__body_xxh(bv, bvl) != h->body_xxh) {
        free(bv);
        return -EBADMSG;
    }
    *body = bv;
    *len = bvl;
    return 0;
}

int kc__db_gen_get(struct kc__db *d, uint64_t *gen)
{
    char *v = NULL;
    size_t vl = 0;
    int rc = kc__db_get(d, KC__CF_META, KC__META_GEN_KEY, 1, &v, &vl);
    if (rc < 0)
        return rc;
    if (vl == KC__META_GEN_VAL_LEN)
        *gen = kc__get_u64((unsigned char *)v);
    else
        rc = -EBADMSG;
    free(v);
    return rc;
}
