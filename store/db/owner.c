/*
 * owner.c: the owner's session, the one process that holds the primary.
 *
 * The top of the owner's tree (ARCHITECTURE.md, "store/db/ in layers"): it
 * runs the jobs (jobs.h), which call only what is below them. It takes
 * DIR/owner.lock with flock() (the kernel frees it if the owner dies),
 * opens the primary, drains the spool (drain.c), recovers a corrupt
 * database and drains again (recover.c), evicts past the size limit
 * (evict.c), keeps the hot files (hot.c) and the filter (filter_sync.c),
 * makes the ready copies of NVRTC's bundled headers hosts ask for
 * (ready.c), settles flushes and compactions when the session ends (settle.c) and
 * exits when idle. The tool operations that must write (gc, verify with
 * repair, clear: admin.c) become the owner for their duration. This file:
 * the lock, begin and end, asking another owner to stop, the drain with
 * its recovery, and the run loop of a background owner; the write batch
 * and the durable commit every job ends with are batch.c's.
 *
 * Every step is idempotent, so an owner killed at any point leaves work the
 * next one redoes: a put file is renamed p- -> d- before it is applied and
 * unlinked only after the synced write, and the next owner applies d- files
 * first.
 */
#include "owner.h"
#include "jobs.h"
#include "../../common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A database RocksDB reports as corrupt is recovered (kc__owner_recover) and
 * the drain done again: a bad table must never wedge the spool. */
int kc__owner_drain(struct kc__owner *o, uint64_t *count)
{
    int rc = kc__drain_once(o, count);
    if (o->d.corrupt && !o->recovering) {
        uint64_t more = 0;
        rc = kc__owner_recover(o, "drain");
        if (rc == 0)
            rc = kc__drain_once(o, &more);
        if (count != NULL)
            *count += more;
    }
    return rc;
}

/* ---- lifetime ---------------------------------------------------------- */

/* Removes secondaries and temp files of processes that are gone. */
static void clean_stale(struct kc__owner *o)
{
    kc__dir_sweep(o->p.sec, "");
    kc__bulk_sweep(o); /* tables of a killed import (bulk.c) */
    /* Temp files of dead writers: host processes' in the spool, a killed
     * owner's in the spool and DIR/hot. */
    const char *dirs[] = {o->p.spool, o->p.hot};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        if (d == NULL)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            /* t-: temp files; i-: a killed import's staged hot files. */
            if ((e->d_name[0] == 't' || (i == 1 && e->d_name[0] == 'i')) && e->d_name[1] == '-' &&
                kc__pid_gone(e->d_name + 2))
                unlinkat(dirfd(d), e->d_name, 0);
        }
        closedir(d);
    }
}

static void ask_stop(struct kc__owner *o)
{
    char name[64];
    snprintf(name, sizeof name, "s-%d-%016llx", (int)getpid(), (unsigned long long)kc__rand64());
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_HITS);
    kc__spool_end(&b);
    kc__spool_write(o->p.spool, name, b.p, b.len, false);
    kc__buf_free(&b);
}

static int lock_owner(struct kc__owner *o, int wait_ms, bool stop_other)
{
    o->lockfd = open(o->p.lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (o->lockfd < 0)
        return -errno;
    uint64_t deadline = kc_mono_ns() + (uint64_t)wait_ms * 1000000u, last_ask = 0;
    for (;;) {
        if (flock(o->lockfd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        uint64_t now = kc_mono_ns();
        if (now >= deadline)
            return -EBUSY;
        if (stop_other && now - last_ask > 500000000u) {
            ask_stop(o);
            last_ask = now;
        }
        sleep_ms(5);
    }
}

static void map_gen(struct kc__owner *o)
{
    int fd = open(o->p.gen, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size < 4096 && ftruncate(fd, 4096) != 0) {
        close(fd);
        return;
    }
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED)
        o->gen = m;
}

/* create: make the cache directory when missing (not for an owner a store
 * started: the directory is gone with its store, and stays gone). */
static int owner_begin(const char *dir, uint64_t max_size, int wait_ms, bool stop_other,
                       bool create, struct kc__owner **out)
{
    struct kc__owner *o = calloc(1, sizeof *o);
    if (o == NULL)
        return -ENOMEM;
    o->lockfd = -1;
    kc__paths_init(&o->p, dir);
    o->max_size = max_size ? max_size : KC_DEFAULT_MAX_SIZE;
    int rc = kc__private_dir(dir, create);
    if (rc == 0)
        rc = kc__private_subdir(o->p.spool, true);
    if (rc == 0)
        rc = kc__private_subdir(o->p.sec, true);
    if (rc == 0)
        rc = kc__private_subdir(o->p.hot, true);
    if (rc == 0)
        rc = lock_owner(o, wait_ms, stop_other);
    bool corrupt = false;
    if (rc == 0) {
        kc__owner_filter_before_create(o);
        char *why = NULL;
        rc = kc__db_open(&o->d, o->p.db, NULL, &why);
        if (rc == -EBADMSG) {
            /* Recovered below, once the session is set up. */
            kc_log(KC_LOG_DEBUG, "opening %s: %s", o->p.db, why ? why : "corrupt");
            corrupt = true;
            rc = 0;
        }
        free(why);
    }
    if (rc < 0) {
        kc__owner_end(o);
        return rc;
    }
    map_gen(o);
    if (corrupt) {
        rc = kc__owner_recover(o, "open");
        if (rc < 0) {
            kc__owner_end(o);
            return rc;
        }
    }
    if (o->gen != NULL)
        __atomic_add_fetch(o->gen + 1, 1, __ATOMIC_SEQ_CST); /* a new session */
    o->unique = kc__count_unique(o);
    kc__db_gen_get(&o->d, &o->gen_seq);
    kc__dict_load(o);
    clean_stale(o);
    kc__owner_filter_begin(o);
    o->hot_max = kc__hot_limit(o);
    o->hot_bytes = kc__hot_list(o, NULL, NULL);
    if (o->d.corrupt && (rc = kc__owner_recover(o, "session start")) < 0) {
        kc__owner_end(o);
        return rc;
    }
    *out = o;
    return 0;
}

int kc__owner_begin(const char *dir, uint64_t max_size, int wait_ms, struct kc__owner **out)
{
    struct kc__owner *o;
    int rc = owner_begin(dir, max_size, wait_ms, true, true, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_drain(o, NULL);
    if (rc == 0)
        rc = kc__enforce_limit(o);
    if (rc < 0) {
        kc__owner_end(o);
        return rc;
    }
    *out = o;
    return 0;
}

void kc__owner_end(struct kc__owner *o)
{
    if (o == NULL)
        return;
    if (o->d.db != NULL) {
        /* Every column family, not only the default one: a session that
         * left its puts in the WAL would make each reader replay it. */
        if (kc__db_flush_all(&o->d) == 0 && !o->d.corrupt)
            kc__settle_levels(o);
        kc__db_close(&o->d);
        kc__dict_reset(o);
        /* The filter holds every key up to this generation. */
        kc__filter_set_stamp(&o->f, o->gen_seq);
        /* The single-flight lock files of compiles that are over. */
        kc__locks_prune(o->p.dir);
    }
    kc__filter_close(&o->f);
    if (o->gen != NULL) {
        __atomic_add_fetch(o->gen, 1, __ATOMIC_SEQ_CST);
        munmap((void *)o->gen, 4096);
    }
    if (o->lockfd >= 0) {
        flock(o->lockfd, LOCK_UN);
        close(o->lockfd);
    }
    free(o);
}

static uint64_t env_max_size(void)
{
    const char *s = kc_config_get(KC_VAR_MAXSIZE);
    uint64_t v = 0;
    if (s != NULL && s[0] != 0 && kc_parse_size(s, &v) == 0)
        return v;
    return 0;
}

int kc__owner_run(const struct kc_store_options *opts, int idle_ms)
{
    if (opts == NULL || opts->dir == NULL)
        return -EINVAL;
    if (opts->readonly)
        return -EROFS;
    const char *det = kc_config_get(KC_VAR_OWNER_DETACH);
    bool spawned = det != NULL && strcmp(det, "1") == 0;
    if (spawned) {
        /* Started by a store: leave its process tree so the host never
         * has a child of ours to reap. */
        unsetenv("KCACHE_OWNER_DETACH");
        pid_t pid = fork();
        if (pid < 0)
            return -errno;
        if (pid > 0)
            _exit(0);
        setsid();
    }
    uint64_t max = opts->max_size ? opts->max_size : env_max_size();
    if (max == 0)
        max = KC_DEFAULT_MAX_SIZE;
    if (idle_ms < 0)
        idle_ms = 0;

    struct kc__owner *o;
    int rc = owner_begin(opts->dir, max, 300, false, !spawned, &o);
    if (rc < 0)
        return rc;
    int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (ino >= 0)
        inotify_add_watch(ino, o->p.spool, IN_MOVED_TO | IN_CLOSE_WRITE);
    uint64_t last_work = kc_mono_ns();
    for (;;) {
        uint64_t n = 0;
        rc = kc__owner_drain(o, &n);
        if (rc < 0)
            break;
        if (n > 0) {
            last_work = kc_mono_ns();
            if ((rc = kc__enforce_limit(o)) < 0)
                break;
        }
        uint32_t ready = 0;
        kc__ready_job(o, &ready);
        if (ready > 0)
            last_work = kc_mono_ns();
        if (o->stop)
            break;
        uint64_t idle = (kc_mono_ns() - last_work) / 1000000u;
        if (idle >= (uint64_t)idle_ms) {
            /* Release, then look again: a writer that saw the lock held
             * just before we let go relies on us to see its file. */
            char dir[4096], spool[4200];
            snprintf(dir, sizeof dir, "%s", o->p.dir);
            snprintf(spool, sizeof spool, "%s", o->p.spool);
            kc__owner_end(o);
            o = NULL;
            if (!kc__spool_pending(spool))
                break;
            if (owner_begin(dir, max, 0, false, !spawned, &o) < 0) {
                o = NULL;
                break;
            }
            last_work = kc_mono_ns();
            continue;
        }
        uint64_t wait = (uint64_t)idle_ms - idle;
        if (wait > 200)
            wait = 200;
        if (ino >= 0) {
            struct pollfd pfd = {.fd = ino, .events = POLLIN};
            if (poll(&pfd, 1, (int)wait) > 0) {
                char buf[4096];
                while (read(ino, buf, sizeof buf) > 0)
                    ;
            }
        } else {
            sleep_ms((int)wait);
        }
    }
    if (ino >= 0)
        close(ino);
    kc__owner_end(o);
    return rc < 0 ? rc : 0;
}
