/*
 * store.c: the store as each process sees it (store.h's function table).
 *
 * Reads go through a RocksDB secondary instance opened lazily on the first
 * get, then the spool, then (only when the owner has committed something
 * since this process last looked) a catch-up with the primary and a second
 * look. Writes are spool files; the owner is started when nobody holds its
 * lock. Hits, counters, purges and recently put sources are kept in memory
 * and written as spool logs on flush/close (pending.c, which the shim's
 * front shares).
 */
#include "bundle.h"
#include "internal.h"
#include "meta.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SPOOL_READ_MAX (1ull << 32)
#define OPEN_RETRY_NS 50000000ull
#define OP_WAIT_MS 15000

/* ---- the handle -------------------------------------------------------- */

struct kc_store {
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
    struct reopen *ro_done; /* finished, not yet installed */
    pthread_cond_t ro_cv;   /* signalled when ro_done is set */
    pthread_t ro_thr;
    bool ro_live;           /* ro_thr started and not joined */
    bool ro_finished;       /* ro_thr returned from opening (guarded by mu) */
    bool exiting;           /* the process exits: RocksDB is not used again */
    struct kc_store *next;  /* every open store (all_mu) */
    uint64_t ro_seq;        /* bumped to disown an in-flight reopen */
    uint64_t caught_gen;
    uint64_t rd_epoch;
    uint64_t next_open_ns;
    volatile uint64_t *gen;

    /* Hits, counters, tombstones, own puts' sources; spool writes; starting
     * the owner (pending.c). */
    struct kc__pending pd;
};

/* ---- exit and fork ------------------------------------------------------
 *
 * At exit(), RocksDB's static objects are destroyed (C++ static
 * destructors, run by exit in the reverse order of their registration)
 * while other threads may still be inside RocksDB: the helper opening a
 * replacement reader (reopen_main), or a host thread in a lookup. Either
 * then touches destroyed objects (SIGSEGV seen in the host's exit). So the
 * store registers its own exit handler after RocksDB's statics it uses
 * exist (after each secondary open and before each helper starts: exit
 * runs later registrations first); it stops RocksDB use in every open
 * store and waits, bounded, for the helper and for lookups in flight.
 *
 * Before fork(), a helper still opening a reader is waited for (bounded)
 * and RocksDB's threads must be gone (db.c keeps none while no primary is
 * open): a child inherits no threads, and its exit() would join them. */

#define EXIT_WAIT_MS 5000
#define FORK_WAIT_MS 2000

static void reopen_join(struct kc_store *st);
static void sec_remove(char secpath[PATH_MAX], int *secfd);

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kc_store *all_stores;

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void store_exit(void)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc_store *st = all_stores; st != NULL; st = st->next) {
        struct timespec dl;
        deadline_in(&dl, EXIT_WAIT_MS);
        if (pthread_mutex_timedlock(&st->mu, &dl) != 0)
            continue;
        st->exiting = true;
        bool live = st->ro_live;
        pthread_t thr = st->ro_thr;
        pthread_mutex_unlock(&st->mu);
        if (live && pthread_timedjoin_np(thr, NULL, &dl) == 0) {
            pthread_mutex_lock(&st->mu);
            if (st->ro_live && pthread_equal(st->ro_thr, thr))
                st->ro_live = false;
            pthread_mutex_unlock(&st->mu);
        }
        /* Lookups in flight hold rdlk shared; later ones find no reader.
         * The reader is not closed (RocksDB's statics are going), but its
         * directory is removed: only its info log is there. */
        if (pthread_rwlock_timedwrlock(&st->rdlk, &dl) == 0) {
            __atomic_store_n(&st->rd_ready, 0, __ATOMIC_RELEASE);
            sec_remove(st->secpath, &st->secfd);
            pthread_rwlock_unlock(&st->rdlk);
        }
    }
    pthread_mutex_unlock(&all_mu);
}

/* Registers store_exit again (see above); cheap, and done once per reader
 * opened, so a handful of times per process. */
static void exit_hook_arm(void)
{
    atexit(store_exit);
}

static void store_prefork(void)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc_store *st = all_stores; st != NULL; st = st->next) {
        struct timespec dl;
        deadline_in(&dl, FORK_WAIT_MS);
        if (pthread_mutex_timedlock(&st->mu, &dl) != 0)
            continue;
        while (st->ro_live && !st->ro_finished)
            if (pthread_cond_timedwait(&st->ro_cv, &st->mu, &dl) != 0)
                break;
        if (st->ro_live && st->ro_finished)
            reopen_join(st);
        pthread_mutex_unlock(&st->mu);
    }
    pthread_mutex_unlock(&all_mu);
    kc__db_env_quiesce(FORK_WAIT_MS);
}

static void store_postfork_child(void)
{
    pthread_mutex_init(&all_mu, NULL);
    kc__db_after_fork_child();
}

static void store_postfork_parent(void)
{
}

static void hooks_once(void)
{
    pthread_atfork(store_prefork, store_postfork_parent, store_postfork_child);
}

static void store_register(struct kc_store *st)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hooks_once);
    pthread_mutex_lock(&all_mu);
    st->next = all_stores;
    all_stores = st;
    pthread_mutex_unlock(&all_mu);
}

static void store_unregister(struct kc_store *st)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc_store **pp = &all_stores; *pp != NULL; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&all_mu);
}

/* ---- the reader -------------------------------------------------------- */

static uint64_t gen_read(struct kc_store *st)
{
    if (st->gen == NULL) {
        int fd = open(st->p.gen, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return 0;
        struct stat sb;
        void *m = MAP_FAILED;
        if (fstat(fd, &sb) == 0 && sb.st_size >= 4096)
            m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return 0;
        void *expected = NULL;
        if (!__atomic_compare_exchange_n(&st->gen, &expected, m, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            munmap(m, 4096);
    }
    return __atomic_load_n(st->gen, __ATOMIC_ACQUIRE);
}

/* The owner session counter, bumped each time a process opens the primary.
 * A secondary that saw one session's WAL is reopened rather than caught up
 * across sessions: RocksDB 7.8's catch-up can keep a memtable replayed from
 * the old WAL whose entries the new session deleted and compacted away. */
static uint64_t epoch_read(struct kc_store *st)
{
    if (st->gen == NULL)
        gen_read(st);
    return st->gen ? __atomic_load_n(st->gen + 1, __ATOMIC_ACQUIRE) : 0;
}

/* Removes a reader's directory and lets go of it; and $TMPDIR/kcache-<uid>
 * when it held the last one there (sec_dir). */
static void sec_remove(char secpath[PATH_MAX], int *secfd)
{
    if (secpath[0] != 0) {
        kc__rm_rf(secpath);
        char *slash = strrchr(secpath, '/'), mine[32];
        snprintf(mine, sizeof mine, "/kcache-%u", (unsigned)geteuid());
        size_t ml = strlen(mine);
        if (slash != NULL && (size_t)(slash - secpath) >= ml &&
            memcmp(slash - ml, mine, ml) == 0) {
            *slash = 0;
            rmdir(secpath); /* fails while other readers' are there */
        }
        secpath[0] = 0;
    }
    if (*secfd >= 0) {
        close(*secfd);
        *secfd = -1;
    }
}

/* Closes the reader; mu held. Waits for lookups in progress. */
static void reader_drop(struct kc_store *st)
{
    pthread_rwlock_wrlock(&st->rdlk);
    __atomic_store_n(&st->rd_ready, 0, __ATOMIC_RELEASE);
    kc__db_close(&st->rd);
    sec_remove(st->secpath, &st->secfd);
    pthread_rwlock_unlock(&st->rdlk);
}

/* Whether the file system holding path has room for a secondary's files
 * (unknown: yes, and the mkdir decides). */
static bool sec_room(const char *path)
{
    struct statvfs vf;
    return statvfs(path, &vf) != 0 || (uint64_t)vf.f_bavail * vf.f_frsize >= (4ull << 20);
}

/* Makes the directory of a new secondary: DIR/sec/<pid>-<random>, or, when
 * the store is read-only or DIR/sec cannot take it (a read-only or full
 * file system, no permission), a private one under $TMPDIR: the database
 * itself may still be readable, and its entries hits. The directory is
 * held (*secfd) while the reader lives; those of readers whose process
 * is gone (it exited without closing, or was killed) are swept first. */
static int sec_dir(struct kc_store *st, char secpath[PATH_MAX], int *secfd)
{
    *secfd = -1;
    if (!st->readonly && sec_room(st->p.sec)) {
        kc__dir_sweep(st->p.sec, "");
        snprintf(secpath, PATH_MAX, "%s/%d-%016llx", st->p.sec, (int)getpid(),
                 (unsigned long long)kc__rand64());
        if (mkdir(secpath, 0700) == 0) {
            *secfd = kc__dir_hold(secpath);
            return 0;
        }
        int e = errno;
        secpath[0] = 0;
        if (e != EROFS && e != ENOSPC && e != EDQUOT && e != EACCES && e != EPERM)
            return -e;
    }
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == 0)
        tmp = "/tmp";
    if (!sec_room(tmp))
        return -ENOSPC;
    /* In a directory of this user's own, $TMPDIR/kcache-<uid> (0700, ours,
     * checked with lstat), swept like DIR/sec: what other users put in a
     * shared $TMPDIR is never looked at, however many entries and whatever
     * their names. Another reader's close may remove it (when empty) under
     * us: made again. */
    char parent[PATH_MAX];
    snprintf(parent, PATH_MAX, "%s/kcache-%u", tmp, (unsigned)geteuid());
    for (int i = 0; i < 4 && kc__private_subdir(parent, true) == 0; i++) {
        kc__dir_sweep(parent, "");
        snprintf(secpath, PATH_MAX, "%s/%d-%016llx", parent, (int)getpid(),
                 (unsigned long long)kc__rand64());
        if (mkdir(secpath, 0700) == 0) {
            *secfd = kc__dir_hold(secpath);
            return 0;
        }
        if (errno != ENOENT)
            break;
    }
    /* Taken by another user (or unusable): a directory of its own beside
     * it, which nothing sweeps (a reader removes its own at close and at
     * exit). */
    snprintf(secpath, PATH_MAX, "%s/kcache-sec-%u-%d-XXXXXX", tmp, (unsigned)geteuid(),
             (int)getpid());
    if (mkdtemp(secpath) == NULL) {
        secpath[0] = 0;
        return -errno;
    }
    *secfd = kc__dir_hold(secpath);
    return 0;
}

/* Opens a secondary into d, in a new directory (secpath). Touches no
 * state of st but constants and the gen mapping, so it may run on any
 * thread. */
static int secondary_open(struct kc_store *st, struct kc__db *d, char secpath[PATH_MAX],
                          int *secfd, uint64_t *epoch)
{
    *secfd = -1;
    char cur[PATH_MAX];
    snprintf(cur, PATH_MAX, "%s/CURRENT", st->p.db);
    if (access(cur, F_OK) != 0)
        return -ENOENT;
    /* A secondary writes its own files (its info log); on a full file
     * system RocksDB 7.8's writer trips an assertion and aborts the host
     * (Debian builds keep assertions). No room: every get is a miss until
     * there is. */
    int rc = sec_dir(st, secpath, secfd);
    if (rc < 0)
        return rc;
    *epoch = epoch_read(st);
    rc = kc__db_open(d, st->p.db, secpath, NULL);
    if (rc < 0) {
        sec_remove(secpath, secfd);
        return rc;
    }
    return 0;
}

/* Opens the secondary; mu held, no reader open. */
static int reader_open(struct kc_store *st)
{
    int rc = secondary_open(st, &st->rd, st->secpath, &st->secfd, &st->rd_epoch);
    if (rc == 0) {
        exit_hook_arm();
        __atomic_store_n(&st->rd_ready, 1, __ATOMIC_RELEASE);
    }
    return rc;
}

/* ---- replacing the reader off the caller's path -------------------------
 *
 * When a new owner session begins, the secondary is replaced rather than
 * caught up (see epoch_read). Opening one costs milliseconds, tens of them
 * on a loaded machine with a live WAL to replay, so the replacement is
 * opened on a helper thread as soon as a lookup notices the new session,
 * while hits keep coming from the old reader (not caught up: what it holds
 * is checksummed and was correct for its key). A miss cannot trust the old
 * reader, since the spool file it would have found may have been drained:
 * it waits for the helper and installs the replacement. */

struct reopen {
    struct kc_store *st;
    uint64_t seq;
    int rc;
    uint64_t epoch;
    struct kc__db d;
    char secpath[PATH_MAX];
    int secfd;
};

static void reopen_discard(struct reopen *r)
{
    if (r == NULL)
        return;
    if (r->rc == 0) {
        kc__db_close(&r->d);
        sec_remove(r->secpath, &r->secfd);
    }
    free(r);
}

static void *reopen_main(void *arg)
{
    struct reopen *r = arg;
    struct kc_store *st = r->st;
    r->rc = secondary_open(st, &r->d, r->secpath, &r->secfd, &r->epoch);
    pthread_mutex_lock(&st->mu);
    st->ro_finished = true;
    if (r->seq == st->ro_seq && st->ro_done == NULL) {
        st->ro_done = r;
        r = NULL;
    }
    pthread_cond_broadcast(&st->ro_cv);
    pthread_mutex_unlock(&st->mu);
    reopen_discard(r); /* disowned meanwhile */
    return NULL;
}

/* Joins a finished helper; mu held. */
static void reopen_join(struct kc_store *st)
{
    if (st->ro_live) {
        pthread_join(st->ro_thr, NULL);
        st->ro_live = false;
    }
}

/* Starts the helper unless one runs; mu held. false: it could not start. */
static bool reopen_start(struct kc_store *st)
{
    if (st->ro_live)
        return true;
    if (st->exiting)
        return false;
    exit_hook_arm();
    struct reopen *r = calloc(1, sizeof *r);
    if (r == NULL)
        return false;
    r->st = st;
    r->seq = st->ro_seq;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the host's signals stay on its threads */
    int rc = pthread_create(&st->ro_thr, NULL, reopen_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        free(r);
        return false;
    }
    st->ro_live = true;
    st->ro_finished = false;
    return true;
}

/* Installs a finished replacement; mu held. Returns whether it did. */
static bool reopen_install(struct kc_store *st)
{
    struct reopen *r = st->ro_done;
    if (r == NULL)
        return false;
    st->ro_done = NULL;
    reopen_join(st);
    if (r->rc != 0) {
        free(r);
        return false;
    }
    reader_drop(st);
    pthread_rwlock_wrlock(&st->rdlk);
    st->rd = r->d;
    memcpy(st->secpath, r->secpath, sizeof st->secpath);
    st->secfd = r->secfd;
    st->rd_epoch = r->epoch;
    __atomic_store_n(&st->rd_ready, 1, __ATOMIC_RELEASE);
    pthread_rwlock_unlock(&st->rdlk);
    free(r);
    return true;
}

/* Waits for the helper in flight, if any, and installs what it opened;
 * mu held. */
static void reopen_wait(struct kc_store *st)
{
    uint64_t seq = st->ro_seq;
    while (st->ro_live && st->ro_done == NULL && st->ro_seq == seq)
        pthread_cond_wait(&st->ro_cv, &st->mu);
    if (st->ro_done == NULL)
        reopen_join(st); /* it failed to hand over (disowned): reap it */
    reopen_install(st);
}

/* Called before a lookup: when a new owner session began, starts opening
 * the replacement reader, or installs it once open. Never waits. */
static void reader_prefetch(struct kc_store *st)
{
    if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE) || st->gen == NULL ||
        __atomic_load_n(st->gen + 1, __ATOMIC_ACQUIRE) == st->rd_epoch)
        return;
    if (pthread_mutex_trylock(&st->mu) != 0)
        return;
    if (st->rd_ready && epoch_read(st) != st->rd_epoch) {
        reopen_install(st);
        /* Without a thread, the next miss replaces the reader inline. */
        if (epoch_read(st) != st->rd_epoch)
            reopen_start(st);
    }
    pthread_mutex_unlock(&st->mu);
}

/* Disowns any replacement in flight or finished; mu held. */
static void reopen_cancel(struct kc_store *st)
{
    st->ro_seq++;
    reopen_discard(st->ro_done);
    st->ro_done = NULL;
}

/* Brings the reader up to what the owner has committed as of generation g
 * (read by the caller after it looked in the spool). force: even if the
 * generation did not move. Returns whether the reader is usable. */
static bool reader_refresh(struct kc_store *st, uint64_t g, bool force)
{
    pthread_mutex_lock(&st->mu);
    bool ok = false;
    if (st->exiting) {
        /* RocksDB's statics are being destroyed: no reader any more. */
    } else if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE)) {
        uint64_t now = kc_mono_ns();
        /* A failed open is retried when the owner committed something
         * since, or after a while. */
        if (force || g != st->caught_gen || now >= st->next_open_ns) {
            if (reader_open(st) != 0)
                st->next_open_ns = now + OPEN_RETRY_NS;
            st->caught_gen = g;
        }
    } else if (force || g != st->caught_gen) {
        char *err = NULL;
        uint64_t epoch = epoch_read(st);
        if (epoch != st->rd_epoch)
            reopen_wait(st); /* a replacement being opened: take it, catch it up */
        if (epoch != st->rd_epoch) {
            err = strdup("a new owner session");
        } else {
            pthread_rwlock_rdlock(&st->rdlk);
            rocksdb_try_catch_up_with_primary(st->rd.db, &err);
            pthread_rwlock_unlock(&st->rdlk);
        }
        if (err != NULL) {
            free(err);
            /* A secondary that cannot follow is replaced, now. */
            reopen_cancel(st);
            reader_drop(st);
            if (reader_open(st) != 0)
                st->next_open_ns = kc_mono_ns() + OPEN_RETRY_NS;
        }
        st->caught_gen = g;
    }
    ok = __atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&st->mu);
    return ok;
}

static int reader_lookup(struct kc_store *st, const char *ns, const kc_key *key, void **body,
                         size_t *len, struct kc__hdr *h)
{
    if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
        return -ENOENT;
    pthread_rwlock_rdlock(&st->rdlk);
    int rc = st->rd_ready ? kc__lookup(&st->rd, ns, key, body, len, h) : -ENOENT;
    pthread_rwlock_unlock(&st->rdlk);
    return rc;
}

/* The lookup behind get, take_by_source and purge. */
static int lookup(struct kc_store *st, const char *ns, const kc_key *key, void **body,
                  size_t *len, struct kc__hdr *h)
{
    if (kc__pending_dead(&st->pd, ns, key))
        return -ENOENT;
    if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
        reader_refresh(st, gen_read(st), false);
    else
        reader_prefetch(st);
    int rc = reader_lookup(st, ns, key, body, len, h);
    if (rc == 0)
        return 0;
    if (rc == -EBADMSG && !st->readonly)
        kc__pending_purge_request(&st->pd, ns, key, NULL, KC__PF_KEY | KC__PF_IFBAD);
    /* Pending puts, then the hot files the owner keeps of drained ones. */
    if (kc__files_lookup(&st->p, ns, key, body, len, h) == 0)
        return 0;
    uint64_t g = gen_read(st);
    if (reader_refresh(st, g, rc == -EIO)) {
        rc = reader_lookup(st, ns, key, body, len, h);
        if (rc == 0)
            return 0;
    }
    return -ENOENT;
}

/* ---- the API ----------------------------------------------------------- */

static int st_open(const struct kc_store_options *opts, struct kc_store **out)
{
    if (opts == NULL || opts->dir == NULL || opts->dir[0] == 0 || out == NULL)
        return -EINVAL;
    *out = NULL;
    if (strlen(opts->dir) >= 4000)
        return -ENAMETOOLONG;
    struct kc_store *st = calloc(1, sizeof *st);
    if (st == NULL)
        return -ENOMEM;
    kc__paths_init(&st->p, opts->dir);
    st->secfd = -1;
    st->readonly = opts->readonly != 0;
    st->max_size = opts->max_size;
    pthread_mutex_init(&st->mu, NULL);
    pthread_rwlock_init(&st->rdlk, NULL);
    pthread_cond_init(&st->ro_cv, NULL);
    int rc = kc__private_dir(st->p.dir, !st->readonly);
    if (rc == -ENOENT && st->readonly)
        rc = 0; /* nothing to read yet: every get misses */
    if (rc == 0 && !st->readonly) {
        rc = kc__private_subdir(st->p.spool, true);
        if (rc == 0)
            rc = kc__private_subdir(st->p.sec, true);
    } else if (rc == 0) {
        int r = kc__private_subdir(st->p.spool, false);
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    if (rc == 0) {
        int r = kc__private_subdir(st->p.hot, false); /* the owner creates it */
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    if (rc < 0) {
        pthread_mutex_destroy(&st->mu);
        pthread_rwlock_destroy(&st->rdlk);
        pthread_cond_destroy(&st->ro_cv);
        free(st);
        return rc;
    }
    char lib[PATH_MAX];
    if (kc__object_path((const void *)kc_store_api, lib, sizeof lib) != 0)
        lib[0] = 0;
    kc__pending_init(&st->pd, &st->p, st->readonly, st->max_size,
                     kc__find_tool(opts->tool, lib[0] != 0 ? lib : NULL));
    store_register(st);
    *out = st;
    return 0;
}

static int st_flush(struct kc_store *st);

static void st_close(struct kc_store *st)
{
    if (st == NULL)
        return;
    store_unregister(st);
    st_flush(st);
    pthread_mutex_lock(&st->mu);
    reopen_cancel(st);
    bool live = st->ro_live;
    pthread_t thr = st->ro_thr;
    st->ro_live = false;
    pthread_mutex_unlock(&st->mu);
    if (live)
        pthread_join(thr, NULL); /* it discards what it opened */
    pthread_mutex_lock(&st->mu);
    reader_drop(st);
    pthread_mutex_unlock(&st->mu);
    if (st->gen != NULL)
        munmap((void *)st->gen, 4096);
    kc__pending_free(&st->pd);
    pthread_mutex_destroy(&st->mu);
    pthread_rwlock_destroy(&st->rdlk);
    pthread_cond_destroy(&st->ro_cv);
    free(st);
}

static bool key_ok(const char *ns, const kc_key *key)
{
    return kc__ns_ok(ns) && key != NULL;
}

static int st_get(struct kc_store *st, const char *ns, const kc_key *key, void **body,
                  size_t *len, struct kc_record_info *info)
{
    if (st == NULL || !key_ok(ns, key) || body == NULL || len == NULL)
        return -EINVAL;
    struct kc__hdr h;
    int rc = lookup(st, ns, key, body, len, &h);
    if (rc < 0)
        return rc;
    kc__hdr_to_info(&h, info);
    kc__pending_hit(&st->pd, ns, key);
    return 0;
}

static int st_put(struct kc_store *st, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    if (st == NULL)
        return -EINVAL;
    return kc__pending_put(&st->pd, ns, key, source, kind, body, len, saved_ns);
}

static int source_lookup(struct kc_store *st, const char *ns, const kc_digest *source,
                         kc_key *found)
{
    int rc = kc__pending_source(&st->pd, ns, source, found);
    if (rc != -ENOENT)
        return rc == -ESRCH ? -ENOENT : rc;
    unsigned char kk[KC__NS_MAX + 1 + 16];
    size_t kl = kc__skey(ns, source, kk);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !reader_refresh(st, gen_read(st), false))
            break;
        if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
            reader_refresh(st, gen_read(st), false);
        if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
            continue;
        char *v;
        size_t vl;
        pthread_rwlock_rdlock(&st->rdlk);
        int got = st->rd_ready ? kc__db_get(&st->rd, KC__CF_SOURCES, kk, kl, &v, &vl) : -ENOENT;
        pthread_rwlock_unlock(&st->rdlk);
        if (got == 0) {
            bool ok = vl == KC__KEY_LEN;
            if (ok)
                kc__key_decode((unsigned char *)v, found);
            free(v);
            if (ok)
                return 0;
        }
    }
    return -ENOENT;
}

static int st_take_by_source(struct kc_store *st, const char *ns, const kc_digest *source,
                             uint64_t build, void **body, size_t *len, kc_key *found)
{
    if (st == NULL || !kc__ns_ok(ns) || source == NULL || body == NULL || len == NULL)
        return -EINVAL;
    kc_key k;
    int rc = source_lookup(st, ns, source, &k);
    if (rc < 0)
        return rc;
    struct kc__hdr h;
    rc = lookup(st, ns, &k, body, len, &h);
    if (rc < 0)
        return -ENOENT;
    if (found != NULL)
        *found = k;
    if (k.build == build) {
        kc__pending_hit(&st->pd, ns, &k);
        return 0;
    }
    /* An earlier build's entry is moved: nothing asks for its key again. */
    if (!st->readonly) {
        kc__pending_forget_source(&st->pd, ns, source);
        kc__pending_tombstone(&st->pd, ns, &k, source);
        kc__pending_purge_request(&st->pd, ns, &k, source, KC__PF_KEY | KC__PF_SOURCE);
    }
    return 0;
}

static int st_purge(struct kc_store *st, const char *ns, const kc_key *key)
{
    if (st == NULL || !key_ok(ns, key))
        return -EINVAL;
    if (st->readonly)
        return -EROFS;
    void *body = NULL;
    size_t len;
    struct kc__hdr h;
    int rc = lookup(st, ns, key, &body, &len, &h);
    free(body);
    kc__pending_tombstone(&st->pd, ns, key, NULL);
    kc__pending_purge_request(&st->pd, ns, key, NULL, KC__PF_KEY);
    return rc == 0 ? 0 : -ENOENT;
}

static void st_count(struct kc_store *st, const char *backend, const struct kc_counters *c)
{
    if (st == NULL)
        return;
    kc__pending_count(&st->pd, backend, c);
}

static int st_flush(struct kc_store *st)
{
    if (st == NULL)
        return -EINVAL;
    return kc__pending_flush(&st->pd);
}

static void st_after_fork_child(struct kc_store *st)
{
    if (st == NULL)
        return;
    pthread_mutex_init(&st->mu, NULL);
    pthread_rwlock_init(&st->rdlk, NULL);
    pthread_cond_init(&st->ro_cv, NULL);
    /* The parent's RocksDB threads do not exist here: forget its handles,
     * and any replacement its helper thread was opening. */
    memset(&st->rd, 0, sizeof st->rd);
    st->ro_done = NULL;
    st->ro_live = false;
    st->ro_seq++;
    st->rd_ready = 0;
    st->secpath[0] = 0; /* the parent's; it removes it */
    if (st->secfd >= 0)
        close(st->secfd);
    st->secfd = -1;
    st->next_open_ns = 0;
    kc__pending_after_fork_child(&st->pd);
}

static void st_free(void *p)
{
    free(p);
}

/* ---- tool operations --------------------------------------------------- */

struct pending {
    struct kc_entry *e;
    char (*ns)[KC__NS_MAX + 1];
    size_t n, cap;
};

static void pending_load(struct kc_store *st, const char *only_ns, struct pending *pd,
                         uint64_t *bad)
{
    memset(pd, 0, sizeof *pd);
    DIR *d = opendir(st->p.spool);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if ((de->d_name[0] != 'p' && de->d_name[0] != 'd') || de->d_name[1] != '-')
            continue;
        unsigned char *buf;
        size_t n;
        if (kc__read_file(dirfd(d), de->d_name, SPOOL_READ_MAX, &buf, &n) != 0)
            continue;
        struct kc__sp_put sp;
        if (kc__spool_put_decode(buf, n, &sp) != 0) {
            if (bad)
                (*bad)++;
            free(buf);
            continue;
        }
        free(buf);
        if (only_ns != NULL && strcmp(only_ns, sp.ns) != 0)
            continue;
        if (pd->n == pd->cap) {
            size_t cap = pd->cap ? 2 * pd->cap : 16;
            struct kc_entry *ne = realloc(pd->e, cap * sizeof *ne);
            if (ne == NULL)
                break;
            pd->e = ne;
            char(*nn)[KC__NS_MAX + 1] = realloc(pd->ns, cap * sizeof *nn);
            if (nn == NULL)
                break;
            pd->ns = nn;
            pd->cap = cap;
        }
        struct kc_entry *e = &pd->e[pd->n];
        memset(e, 0, sizeof *e);
        snprintf(pd->ns[pd->n], sizeof pd->ns[0], "%s", sp.ns);
        e->key = sp.key;
        kc__hdr_to_info(&sp.hdr, &e->info);
        e->stored_bytes = n;
        e->pending = 1;
        pd->n++;
    }
    closedir(d);
    for (size_t i = 0; i < pd->n; i++)
        pd->e[i].ns = pd->ns[i];
}

static void pending_free(struct pending *pd)
{
    free(pd->e);
    free(pd->ns);
}

static bool pending_has(const struct pending *pd, const char *ns, const kc_key *k)
{
    for (size_t i = 0; i < pd->n; i++)
        if (memcmp(&pd->e[i].key, k, sizeof *k) == 0 && strcmp(pd->ns[i], ns) == 0)
            return true;
    return false;
}

/* A fresh view for a tool operation: the reader caught up, if there is a
 * database at all, and held (rdlk shared; the caller unlocks it). false:
 * there is no reader. */
static bool fresh_reader(struct kc_store *st)
{
    if (!reader_refresh(st, gen_read(st), true))
        return false;
    pthread_rwlock_rdlock(&st->rdlk);
    if (!st->rd_ready) {
        pthread_rwlock_unlock(&st->rdlk);
        return false;
    }
    return true;
}

static int st_foreach(struct kc_store *st, const char *ns,
                      int (*cb)(const struct kc_entry *e, void *arg), void *arg)
{
    if (st == NULL || cb == NULL || (ns != NULL && !kc__ns_ok(ns)))
        return -EINVAL;
    struct pending pd;
    pending_load(st, ns, &pd, NULL);
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    bool have = false;
    pthread_mutex_unlock(&st->mu);
    have = fresh_reader(st);
    if (have) {
        rocksdb_iterator_t *it =
            rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
        size_t nsl = ns ? strlen(ns) : 0;
        if (ns)
            rocksdb_iter_seek(it, ns, nsl + 1);
        else
            rocksdb_iter_seek_to_first(it);
        for (; rc == 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(it, &kl);
            const char *v = rocksdb_iter_value(it, &vl);
            if (ns && (kl < nsl + 1 || memcmp(k, ns, nsl) != 0 || k[nsl] != 0))
                break;
            struct kc_entry e;
            memset(&e, 0, sizeof e);
            char ens[KC__NS_MAX + 1];
            struct kc__hdr h;
            if (kc__kkey_split((const unsigned char *)k, kl, ens, &e.key) != 0)
                continue;
            if (pending_has(&pd, ens, &e.key))
                continue;
            e.ns = ens;
            if (vl == KC__KVAL_LEN && kc__hdr_decode(v, vl, &h) == 0) {
                kc__hdr_to_info(&h, &e.info);
                unsigned char rk[KC__META_REF_KEY_LEN];
                kc__meta_ref_key(kc__kval_digest(v, vl), rk);
                char *rv;
                size_t rvl;
                e.stored_bytes = h.body_size;
                if (kc__db_get(&st->rd, KC__CF_META, rk, sizeof rk, &rv, &rvl) == 0) {
                    uint64_t cnt = 0;
                    kc__meta_ref_parse(rv, rvl, &cnt, NULL);
                    if (cnt > 1)
                        e.stored_bytes = h.body_size / cnt;
                    free(rv);
                }
            }
            rc = cb(&e, arg);
        }
        rocksdb_iter_destroy(it);
        pthread_rwlock_unlock(&st->rdlk);
    }
    for (size_t i = 0; rc == 0 && i < pd.n; i++)
        rc = cb(&pd.e[i], arg);
    pending_free(&pd);
    return rc;
}

static struct kc_backend_stats *stats_backend(struct kc_store_stats *s, const char *name)
{
    for (size_t i = 0; i < s->n_backends; i++)
        if (strcmp(s->backends[i].backend, name) == 0)
            return &s->backends[i];
    struct kc_backend_stats *v = realloc(s->backends, (s->n_backends + 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    s->backends = v;
    struct kc_backend_stats *b = &v[s->n_backends++];
    memset(b, 0, sizeof *b);
    snprintf(b->backend, sizeof b->backend, "%s", name);
    return b;
}

static struct kc_ns_stats *stats_ns(struct kc_store_stats *s, const char *name)
{
    for (size_t i = 0; i < s->n_ns; i++)
        if (strcmp(s->ns[i].ns, name) == 0)
            return &s->ns[i];
    struct kc_ns_stats *v = realloc(s->ns, (s->n_ns + 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    s->ns = v;
    struct kc_ns_stats *n = &v[s->n_ns++];
    memset(n, 0, sizeof *n);
    snprintf(n->ns, sizeof n->ns, "%s", name);
    return n;
}

static void stats_spool_counters(struct kc_store *st, struct kc_store_stats *s)
{
    DIR *d = opendir(st->p.spool);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if ((n[0] == 'p' || n[0] == 'd') && n[1] == '-')
            s->spool_entries++;
        if (n[0] != 'c' || n[1] != '-')
            continue;
        unsigned char *buf;
        size_t len;
        if (kc__read_file(dirfd(d), n, SPOOL_READ_MAX, &buf, &len) != 0)
            continue;
        int type;
        const unsigned char *p;
        size_t pl;
        if (kc__spool_check(buf, len, &type, &p, &pl) == 0 && type == KC__SP_COUNT) {
            struct kc__sp_item it;
            const unsigned char *end = p + pl;
            while (kc__spool_item_next(type, &p, end, &it) > 0) {
                struct kc_backend_stats *b = stats_backend(s, it.ns);
                if (b != NULL)
                    kc_counters_add(&b->c, &it.c);
            }
        }
        free(buf);
    }
    closedir(d);
}

static void st_stats_free(struct kc_store_stats *s)
{
    if (s == NULL)
        return;
    free(s->ns);
    free(s->backends);
    free(s);
}

static int st_stats(struct kc_store *st, struct kc_store_stats **out)
{
    if (st == NULL || out == NULL)
        return -EINVAL;
    struct kc_store_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->max_size = st->max_size ? st->max_size : KC_DEFAULT_MAX_SIZE;
    bool have = fresh_reader(st);
    if (have) {
        rocksdb_iterator_t *it =
            rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
        struct kc_ns_stats *cur = NULL;
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(it, &kl);
            const char *v = rocksdb_iter_value(it, &vl);
            char ns[KC__NS_MAX + 1];
            kc_key key;
            struct kc__hdr h;
            if (kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0)
                continue;
            uint64_t raw = 0;
            if (vl == KC__KVAL_LEN && kc__hdr_decode(v, vl, &h) == 0)
                raw = h.body_size;
            if (cur == NULL || strcmp(cur->ns, ns) != 0)
                cur = stats_ns(s, ns);
            if (cur != NULL) {
                cur->entries++;
                cur->raw_bytes += raw;
            }
            s->entries++;
            s->raw_bytes += raw;
        }
        rocksdb_iter_destroy(it);
        it = rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_META]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(it, &kl);
            const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
            uint64_t size, a[KC_N_COUNTERS];
            char name[sizeof s->backends[0].backend]; /* longer names are not reported */
            if (kl == KC__META_REF_KEY_LEN && kc__meta_is(k, kl, KC__META_REF_PREFIX) &&
                kc__meta_ref_parse(v, vl, NULL, &size) == 0) {
                s->unique_bytes += size;
            } else if (kc__meta_counters_name(k, kl, name, sizeof name) == 0 &&
                       kc__meta_counters_parse(v, vl, a) == 0) {
                struct kc_backend_stats *b = stats_backend(s, name);
                if (b != NULL) {
                    struct kc_counters c;
                    kc_counters_from_array(&c, a);
                    kc_counters_add(&b->c, &c);
                }
            }
        }
        rocksdb_iter_destroy(it);
        pthread_rwlock_unlock(&st->rdlk);
    }
    stats_spool_counters(st, s);
    s->disk_bytes = kc__du(st->p.dir, &s->reserved_bytes);
    *out = s;
    return 0;
}

/* Becomes the owner for a tool operation; afterwards starts the background
 * owner again if writers left work while we held the lock. */
static int as_owner(struct kc_store *st, struct kc__owner **o)
{
    if (st->readonly)
        return -EROFS;
    return kc__owner_begin(st->p.dir, st->max_size, OP_WAIT_MS, o);
}

static void end_owner(struct kc_store *st, struct kc__owner *o)
{
    kc__owner_end(o);
    if (kc__spool_pending(st->p.spool))
        kc__pending_kick(&st->pd);
}

/* Counts hot files that fail their checks or sit under another key's
 * name (the owner's verify also compares them with the database). */
static void hot_check(struct kc_store *st, uint64_t *bad)
{
    DIR *d = opendir(st->p.hot);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strlen(de->d_name) != 32 || strspn(de->d_name, "0123456789abcdef") != 32)
            continue;
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        int rc = kc__hot_file_read(st->p.hot, de->d_name, &buf, &sp);
        if (rc != 0 && rc != -ENOENT) /* -ENOENT: the owner evicted it meanwhile */
            (*bad)++;
        free(buf);
    }
    closedir(d);
}

static int st_verify(struct kc_store *st, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg)
{
    if (st == NULL)
        return -EINVAL;
    struct kc_verify_report r = {0};
    if (st->readonly || !repair) {
        /* Read-only check through the reader. */
        struct pending pd;
        pending_load(st, NULL, &pd, &r.spool_bad);
        pending_free(&pd);
        hot_check(st, &r.spool_bad);
        bool have = fresh_reader(st);
        if (have) {
            rocksdb_iterator_t *it =
                rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
            for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it);
                 rocksdb_iter_next(it)) {
                size_t kl;
                const char *k = rocksdb_iter_key(it, &kl);
                char ns[KC__NS_MAX + 1];
                kc_key key;
                void *body = NULL;
                size_t len;
                struct kc__hdr h;
                r.checked++;
                if (kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0 ||
                    kc__lookup(&st->rd, ns, &key, &body, &len, &h) != 0)
                    r.bad++;
                free(body);
                if (progress && (r.checked & 1023) == 0)
                    progress(r.checked, 0, arg);
            }
            rocksdb_iter_destroy(it);
            pthread_rwlock_unlock(&st->rdlk);
        }
        if (rep)
            *rep = r;
        return 0;
    }
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_verify(o, repair, &r, progress, arg);
    end_owner(st, o);
    if (rep)
        *rep = r;
    return rc;
}

static int st_gc(struct kc_store *st, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg)
{
    if (st == NULL)
        return -EINVAL;
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_gc(o, max_size, rep, progress, arg);
    end_owner(st, o);
    return rc;
}

static int st_clear(struct kc_store *st)
{
    if (st == NULL)
        return -EINVAL;
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_clear(o);
    end_owner(st, o);
    kc__pending_forget_source(&st->pd, NULL, NULL);
    return rc;
}

static int st_drain(struct kc_store *st, int timeout_ms)
{
    if (st == NULL)
        return -EINVAL;
    if (st->readonly)
        return -EROFS;
    st_flush(st);
    struct kc__owner *o;
    int rc = kc__owner_begin(st->p.dir, st->max_size, timeout_ms < 0 ? 0 : timeout_ms, &o);
    if (rc < 0)
        return rc;
    end_owner(st, o);
    return 0;
}

/* For bundle.c (bundle.h). */
int kc__store_reader_hold(struct kc_store *st, struct kc__db **d)
{
    if (!fresh_reader(st))
        return -ENOENT;
    *d = &st->rd;
    return 0;
}

void kc__store_reader_release(struct kc_store *st)
{
    pthread_rwlock_unlock(&st->rdlk);
}

int kc__store_as_owner(struct kc_store *st, struct kc__owner **o)
{
    return as_owner(st, o);
}

void kc__store_end_owner(struct kc_store *st, struct kc__owner *o)
{
    end_owner(st, o);
}

static const struct kc_store_api api = {
    .abi = KC_STORE_ABI,
    .open = st_open,
    .close = st_close,
    .get = st_get,
    .put = st_put,
    .take_by_source = st_take_by_source,
    .purge = st_purge,
    .count = st_count,
    .flush = st_flush,
    .after_fork_child = st_after_fork_child,
    .free = st_free,
    .foreach = st_foreach,
    .stats = st_stats,
    .stats_free = st_stats_free,
    .verify = st_verify,
    .gc = st_gc,
    .clear = st_clear,
    .owner_run = kc__owner_run,
    .parse_record = kc__parse_record,
    .drain = st_drain,
    .bundle_export = kc__bundle_export,
    .bundle_import = kc__bundle_import,
};

KC_API const struct kc_store_api *kc_store_api(void)
{
    return &api;
}
