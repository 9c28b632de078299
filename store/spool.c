/*
 * spool.c: the directory layout, spool and hot file names and reads, and
 * starting the owner. libc only: compiled into the store and into the
 * shim's front (see base.h).
 */
#include "base.h"

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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define PUT_FILE_MAX (1ull << 32)
#define KICK_INTERVAL_NS 200000000ull

void kc__paths_init(struct kc__paths *p, const char *dir)
{
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    snprintf(p->db, sizeof p->db, "%s/db", dir);
    snprintf(p->spool, sizeof p->spool, "%s/spool", dir);
    snprintf(p->sec, sizeof p->sec, "%s/sec", dir);
    snprintf(p->lock, sizeof p->lock, "%s/owner.lock", dir);
    snprintf(p->gen, sizeof p->gen, "%s/gen", dir);
    snprintf(p->hot, sizeof p->hot, "%s/hot", dir);
    snprintf(p->filter, sizeof p->filter, "%s/filter", dir);
}

void kc__spool_name(const char *ns, const kc_key *key, char prefix, char out[40])
{
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(ns, key, kk);
    kc_digest d = kc__digest_of(kk, kl);
    unsigned char b[16];
    kc__digest_encode(&d, b);
    if (prefix == 0) {
        kc__hex(b, 16, out);
        return;
    }
    out[0] = prefix;
    out[1] = '-';
    kc__hex(b, 16, out + 2);
}

bool kc__spool_pending(const char *spool)
{
    DIR *d = opendir(spool);
    if (d == NULL)
        return false;
    bool any = false;
    struct dirent *e;
    while (!any && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (n[0] != 0 && n[1] == '-' && strchr("pdxhc", n[0]) != NULL)
            any = true;
    }
    closedir(d);
    return any;
}

/* Reads and decodes a put file, plain or packed. */
static int put_file_load(const char *path, unsigned char **buf, struct kc__sp_put *sp)
{
    unsigned char *b;
    size_t n;
    int rc = kc__read_file(AT_FDCWD, path, PUT_FILE_MAX, &b, &n);
    if (rc < 0)
        return rc == -ENOENT ? -ENOENT : -EBADMSG;
    if (kc__put_decode_any(&b, &n, sp) != 0) {
        free(b);
        return -EBADMSG;
    }
    *buf = b;
    return 0;
}

/* put_file_load's answer, refused (-EBADMSG) when the file does not hold
 * the key asked for. */
static int put_file_kept(int rc, bool holds, unsigned char **buf)
{
    if (rc == 0 && !holds) {
        free(*buf);
        *buf = NULL;
        return -EBADMSG;
    }
    return rc;
}

int kc__put_file_read(const char *path, const char *ns, const kc_key *key, unsigned char **buf,
                      struct kc__sp_put *sp)
{
    int rc = put_file_load(path, buf, sp);
    return put_file_kept(rc, rc == 0 && strcmp(sp->ns, ns) == 0 &&
                                 memcmp(&sp->key, key, sizeof *key) == 0, buf);
}

int kc__hot_file_read(const char *hot, const char *name, unsigned char **buf,
                      struct kc__sp_put *sp)
{
    char path[4400], want[40] = "";
    snprintf(path, sizeof path, "%s/%s", hot, name);
    int rc = put_file_load(path, buf, sp);
    if (rc == 0)
        kc__spool_name(sp->ns, &sp->key, 0, want);
    return put_file_kept(rc, strcmp(want, name) == 0, buf);
}

/* ---- starting the owner ------------------------------------------------ */

char *kc__find_tool(const char *given, const void *anchor)
{
    if (given != NULL && given[0] != 0)
        return strdup(given);
    const char *env = getenv("KCACHE_TOOL");
    if (env != NULL && env[0] != 0)
        return strdup(env);
    Dl_info di;
    if (anchor != NULL && dladdr(anchor, &di) != 0 && di.dli_fname != NULL) {
        char lib[PATH_MAX];
        if (realpath(di.dli_fname, lib) != NULL) {
            char *slash = strrchr(lib, '/');
            if (slash != NULL) {
                *slash = 0;
                static const char *const rel[] = {"/../tools/kcache", "/../bin/kcache",
                                                  "/../../bin/kcache"};
                for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
                    char cand[PATH_MAX + 32];
                    snprintf(cand, sizeof cand, "%s%s", lib, rel[i]);
                    if (access(cand, X_OK) == 0)
                        return strdup(cand);
                }
            }
        }
    }
    return strdup("kcache");
}

static int spawn_owner(const char *tool, const char *dir, uint64_t max_size, pid_t *pid)
{
    size_t n = 0;
    while (environ != NULL && environ[n] != NULL)
        n++;
    char **env = calloc(n + 3, sizeof *env);
    if (env == NULL)
        return -ENOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        if (strncmp(e, "KCACHE_OWNER_DETACH=", 20) == 0)
            continue;
        if (max_size != 0 && strncmp(e, "KCACHE_MAXSIZE=", 15) == 0)
            continue;
        /* The owner needs no interposer. */
        if (strncmp(e, "LD_PRELOAD=", 11) == 0 && strstr(e, "libkcache") != NULL)
            continue;
        env[m++] = (char *)e;
    }
    char detach[] = "KCACHE_OWNER_DETACH=1";
    char maxs[64];
    env[m++] = detach;
    if (max_size != 0) {
        snprintf(maxs, sizeof maxs, "KCACHE_MAXSIZE=%llu", (unsigned long long)max_size);
        env[m++] = maxs;
    }
    env[m] = NULL;
    char *argv[] = {(char *)tool, "owner", "--dir", (char *)dir, NULL};
    posix_spawnattr_t at;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_init(&fa);
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGHUP);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    for (int fd = 0; fd < 3; fd++)
        posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
    int rc = strchr(tool, '/') != NULL ? posix_spawn(pid, tool, &fa, &at, argv, env)
                                       : posix_spawnp(pid, tool, &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    return -rc;
}

void kc__kicker_init(struct kc__kicker *k, char *tool)
{
    memset(k, 0, sizeof *k);
    k->lockfd = -1;
    k->tool = tool;
}

void kc__kicker_reap(struct kc__kicker *k, int wait_ms)
{
    if (k->spawned <= 0)
        return;
    for (int i = 0;; i++) {
        pid_t r = waitpid(k->spawned, NULL, WNOHANG);
        if (r == k->spawned || (r < 0 && errno != EINTR)) {
            k->spawned = 0;
            return;
        }
        if (i * 5 >= wait_ms)
            return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

void kc__kicker_kick(struct kc__kicker *k, const struct kc__paths *p, uint64_t max_size)
{
    kc__kicker_reap(k, 0);
    uint64_t now = kc__mono_ns();
    if (k->lockfd < 0)
        k->lockfd = open(p->lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (k->lockfd < 0 || flock(k->lockfd, LOCK_EX | LOCK_NB) != 0)
        return;
    flock(k->lockfd, LOCK_UN);
    if (k->last_kick_ns != 0 && now - k->last_kick_ns <= KICK_INTERVAL_NS)
        return;
    k->last_kick_ns = now;
    pid_t pid;
    int rc = spawn_owner(k->tool ? k->tool : "kcache", p->dir, max_size, &pid);
    if (rc == 0)
        k->spawned = pid;
    else if (!k->warned) {
        k->warned = true;
        fprintf(stderr, "kcache: warning: cannot start the store owner %s: %s\n",
                k->tool ? k->tool : "kcache", strerror(-rc));
    }
}

void kc__kicker_after_fork(struct kc__kicker *k)
{
    if (k->lockfd >= 0)
        close(k->lockfd);
    k->lockfd = -1;
    k->spawned = 0;
    k->last_kick_ns = 0;
}

void kc__kicker_free(struct kc__kicker *k)
{
    if (k->lockfd >= 0)
        close(k->lockfd);
    k->lockfd = -1;
    free(k->tool);
    k->tool = NULL;
}
