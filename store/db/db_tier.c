/*
 * db_tier.c: the database tier (tier.h): the RocksDB database as one
 * process reads it, through a secondary instance opened on the first get
 * that reaches it.
 *
 *   get    the reader; on a miss, when the owner has committed something
 *          since this reader last looked (DIR/gen), a catch-up with the
 *          primary and a second look. The chain looked in the spool before
 *          (the local tier), so a put drained meanwhile is in what the
 *          catch-up sees: the owner bumps the generation before a drained
 *          file leaves the spool.
 *   take_by_source
 *          the namespace's sources map, the same way.
 * It writes nothing (the owner fills the database from the spool), so put
 * and purge are NULL: a purge request the local tier writes reaches the
 * database through the owner. The administration (store.c) reads through
 * the same reader.
 */
#include "db_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define OPEN_RETRY_NS 50000000ull

/* ---- exit and fork ------------------------------------------------------
 *
 * At exit(), RocksDB's static objects are destroyed (C++ static
 * destructors, run by exit in the reverse order of their registration)
 * while other threads may still be inside RocksDB: the helper opening a
 * replacement reader (reopen_main), or a host thread in a lookup. Either
 * then touches destroyed objects (SIGSEGV seen in the host's exit). So the
 * tier registers its own exit handler after RocksDB's statics it uses
 * exist (after each secondary open and before each helper starts: exit
 * runs later registrations first); it stops RocksDB use in every open
 * database tier and waits, bounded, for the helper and for lookups in
 * flight.
 *
 * Before fork(), a helper still opening a reader is waited for (bounded)
 * and RocksDB's threads must be gone (db.c keeps none while no primary is
 * open): a child inherits no threads, and its exit() would join them. */

#define EXIT_WAIT_MS 5000
#define FORK_WAIT_MS 2000

static void reopen_join(struct kc__dbt *st);
static void sec_remove(char secpath[PATH_MAX], int *secfd);

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kc__dbt *all_tiers;

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

static void dbt_exit(void)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc__dbt *st = all_tiers; st != NULL; st = st->next) {
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

/* Registers dbt_exit again (see above); cheap, and done once per reader
 * opened, so a handful of times per process. */
static void exit_hook_arm(void)
{
    atexit(dbt_exit);
}

static void dbt_prefork(void)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc__dbt *st = all_tiers; st != NULL; st = st->next) {
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

static void dbt_postfork_child(void)
{
    pthread_mutex_init(&all_mu, NULL);
    kc__db_after_fork_child();
}

static void dbt_postfork_parent(void) {}

static void hooks_once(void)
{
    pthread_atfork(dbt_prefork, dbt_postfork_parent, dbt_postfork_child);
}

static void dbt_register(struct kc__dbt *st)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, hooks_once);
    pthread_mutex_lock(&all_mu);
    st->next = all_tiers;
    all_tiers = st;
    pthread_mutex_unlock(&all_mu);
}

static void dbt_unregister(struct kc__dbt *st)
{
    pthread_mutex_lock(&all_mu);
    for (struct kc__dbt **pp = &all_tiers; *pp != NULL; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    pthread_mutex_unlock(&all_mu);
}

/* ---- the reader -------------------------------------------------------- */

uint64_t kc__dbt_gen(struct kc__dbt *st)
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
static uint64_t epoch_read(struct kc__dbt *st)
{
    if (st->gen == NULL)
        kc__dbt_gen(st);
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
        if (slash != NULL && (size_t)(slash - secpath) >= ml && memcmp(slash - ml, mine, ml) == 0) {
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
static void reader_drop(struct kc__dbt *st)
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
static int sec_dir(struct kc__dbt *st, char secpath[PATH_MAX], int *secfd)
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
static int secondary_open(struct kc__dbt *st, struct kc__db *d, char secpath[PATH_MAX], int *secfd,
                          uint64_t *epoch)
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
static int reader_open(struct kc__dbt *st)
{
    int rc = secondary_open(st, &st->rd, st->secpath, &st->secfd, &st->rd_epoch);
    if (rc == 0) {
        exit_hook_arm();
        __atomic_store_n(&st->rd_ready, 1, __ATOMIC_RELEASE);
    }
    st->open_rc = rc;
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

struct kc__reopen {
    struct kc__dbt *st;
    uint64_t seq;
    int rc;
    uint64_t epoch;
    struct kc__db d;
    char secpath[PATH_MAX];
    int secfd;
};

static void reopen_discard(struct kc__reopen *r)
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
    struct kc__reopen *r = arg;
    struct kc__dbt *st = r->st;
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
static void reopen_join(struct kc__dbt *st)
{
    if (st->ro_live) {
        pthread_join(st->ro_thr, NULL);
        st->ro_live = false;
    }
}

/* Starts the helper unless one runs; mu held. false: it could not start. */
static bool reopen_start(struct kc__dbt *st)
{
    if (st->ro_live)
        return true;
    if (st->exiting)
        return false;
    exit_hook_arm();
    struct kc__reopen *r = calloc(1, sizeof *r);
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
static bool reopen_install(struct kc__dbt *st)
{
    struct kc__reopen *r = st->ro_done;
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
static void reopen_wait(struct kc__dbt *st)
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
static void reader_prefetch(struct kc__dbt *st)
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
static void reopen_cancel(struct kc__dbt *st)
{
    st->ro_seq++;
    reopen_discard(st->ro_done);
    st->ro_done = NULL;
}

/* Brings the reader up to what the owner has committed as of generation g
 * (read by the caller after it looked in the spool). force: even if the
 * generation did not move. Returns whether the reader is usable. */
bool kc__dbt_refresh(struct kc__dbt *st, uint64_t g, bool force)
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
        uint64_t epoch = epoch_read(st);
        if (epoch != st->rd_epoch)
            reopen_wait(st); /* a replacement being opened: take it, catch it up */
        int rc = -ESTALE;    /* still a reader of an earlier owner session */
        if (epoch == st->rd_epoch) {
            pthread_rwlock_rdlock(&st->rdlk);
            rc = kc__db_catch_up(&st->rd);
            pthread_rwlock_unlock(&st->rdlk);
        }
        if (rc != 0) {
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

bool kc__dbt_reopen(struct kc__dbt *st)
{
    pthread_mutex_lock(&st->mu);
    bool ok = false;
    if (!st->exiting) {
        reopen_cancel(st);
        reader_drop(st);
        if (reader_open(st) != 0)
            st->next_open_ns = kc_mono_ns() + OPEN_RETRY_NS;
        ok = __atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE);
    }
    pthread_mutex_unlock(&st->mu);
    return ok;
}

static int reader_lookup(struct kc__dbt *st, const char *ns, const kc_key *key, void **body,
                         size_t *len, struct kc__hdr *h)
{
    if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
        return -ENOENT;
    pthread_rwlock_rdlock(&st->rdlk);
    int rc = st->rd_ready ? kc__lookup(&st->rd, ns, key, body, len, h) : -ENOENT;
    pthread_rwlock_unlock(&st->rdlk);
    return rc;
}

/* ---- the tier ------------------------------------------------------------ */

#define T(t) ((struct kc__dbt *)(t))

static int dbt_get(struct kc_tier *t, const char *ns, const kc_key *key, void **body, size_t *len,
                   struct kc_record_info *info)
{
    struct kc__dbt *st = T(t);
    struct kc__hdr h;
    if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
        kc__dbt_refresh(st, kc__dbt_gen(st), false);
    else
        reader_prefetch(st);
    int rc = reader_lookup(st, ns, key, body, len, &h);
    if (rc != 0) {
        /* Read the generation only now, after the chain looked in the
         * spool: what was drained since is in what the catch-up sees. */
        bool bad = rc == -EBADMSG;
        if (!kc__dbt_refresh(st, kc__dbt_gen(st), rc == -EIO))
            return bad ? -EBADMSG : -ENOENT;
        rc = reader_lookup(st, ns, key, body, len, &h);
        if (rc != 0)
            return bad || rc == -EBADMSG ? -EBADMSG : -ENOENT;
    }
    kc__hdr_to_info(&h, info);
    return 0;
}

static int dbt_take_by_source(struct kc_tier *t, const char *ns, const kc_digest *source,
                              kc_key *found)
{
    struct kc__dbt *st = T(t);
    unsigned char kk[KC__NS_MAX + 1 + 16];
    size_t kl = kc__skey(ns, source, kk);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && !kc__dbt_refresh(st, kc__dbt_gen(st), false))
            break;
        if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
            kc__dbt_refresh(st, kc__dbt_gen(st), false);
        if (!__atomic_load_n(&st->rd_ready, __ATOMIC_ACQUIRE))
            continue;
        char *v = NULL;
        size_t vl = 0;
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

static void dbt_after_fork(struct kc_tier *t)
{
    struct kc__dbt *st = T(t);
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
}

static void dbt_close(struct kc_tier *t)
{
    if (t == NULL)
        return;
    struct kc__dbt *st = T(t);
    dbt_unregister(st);
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
    pthread_mutex_destroy(&st->mu);
    pthread_rwlock_destroy(&st->rdlk);
    pthread_cond_destroy(&st->ro_cv);
    free(st);
}

static const struct kc_tier_ops dbt_ops = {
    .name = "db",
    .get = dbt_get,
    .take_by_source = dbt_take_by_source,
    .after_fork = dbt_after_fork,
    .close = dbt_close,
};

int kc__dbt_open(const struct kc_store_options *opts, struct kc_tier **out)
{
    if (opts == NULL || opts->dir == NULL || opts->dir[0] == 0 || out == NULL ||
        strlen(opts->dir) >= 4000)
        return -EINVAL;
    *out = NULL;
    struct kc__dbt *st = calloc(1, sizeof *st);
    if (st == NULL)
        return -ENOMEM;
    st->base.ops = &dbt_ops;
    kc__paths_init(&st->p, opts->dir);
    st->secfd = -1;
    st->readonly = opts->readonly != 0;
    st->max_size = opts->max_size;
    pthread_mutex_init(&st->mu, NULL);
    pthread_rwlock_init(&st->rdlk, NULL);
    pthread_cond_init(&st->ro_cv, NULL);
    dbt_register(st);
    *out = &st->base;
    return 0;
}

struct kc__dbt *kc__dbt_of(struct kc_store *st)
{
    return (struct kc__dbt *)kc__chain_find(st, &dbt_ops);
}
