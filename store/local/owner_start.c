/*
 * owner_start.c: starting the owner. Where the calling library is
 * (kc__object_path; the shim also finds the store library with it), where
 * the kcache tool is (given, $KCACHE_TOOL, beside that library, $PATH),
 * spawning `kcache owner` detached when nobody holds DIR/owner.lock, and
 * the kicker that does so at most every 200 ms. libc only: compiled into
 * the store and into the shim's front (see local.h).
 */
#include "local.h"
#include "../../common/identity.h"
#include "../../common/trust.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define KICK_INTERVAL_NS 200000000ull

/* The path of the file mapped at address a, from /proc/self/maps. */
static int mapped_path(uintptr_t a, char *buf, size_t len)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t cap = 64 << 10, n = 0;
    char *text = malloc(cap);
    int rc = text != NULL ? 0 : -ENOMEM;
    while (rc == 0) {
        if (n + 1 == cap) {
            char *t = cap < (16u << 20) ? realloc(text, cap * 2) : NULL;
            if (t == NULL) {
                rc = -ENOMEM;
                break;
            }
            text = t;
            cap *= 2;
        }
        ssize_t r = read(fd, text + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = -errno;
        else if (r == 0)
            break;
        else
            n += (size_t)r;
    }
    close(fd);
    if (rc != 0) {
        free(text);
        return rc;
    }
    text[n] = 0;
    rc = -ENOENT;
    for (char *line = text; *line != 0;) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = 0;
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
            /* "lo-hi perms offset dev inode   /path"; a file deleted or
             * replaced since it was mapped is no guide to its neighbours. */
            static const char deleted[] = " (deleted)";
            const char *path = strchr(line, '/');
            size_t pn = path != NULL ? strlen(path) : 0, dn = sizeof deleted - 1;
            if (pn == 0 || (pn > dn && strcmp(path + pn - dn, deleted) == 0))
                rc = -ENOENT;
            else if (pn >= len)
                rc = -ENAMETOOLONG;
            else {
                memcpy(buf, path, pn + 1);
                rc = 0;
            }
            break;
        }
        if (nl == NULL)
            break;
        line = nl + 1;
    }
    free(text);
    return rc;
}

int kc__object_path(const void *addr, char *buf, size_t len)
{
    const char *name = kc__loaded_name(addr);
    if (name == NULL || name[0] == 0)
        return -ENOENT;
    if (name[0] != '/') {
        /* Loaded by a relative name, which the loader resolved against the
         * working directory of that moment; the host may have changed it
         * since. The kernel's view of the mapping is absolute. */
        return mapped_path((uintptr_t)addr, buf, len);
    }
    size_t n = strlen(name);
    if (n >= len)
        return -ENAMETOOLONG;
    memcpy(buf, name, n + 1);
    return 0;
}

/* An executable regular file at path. */
static bool executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* The first tool passed over because another user could replace it, and
 * the part of its path they can write: named by the kicker's warning when
 * no tool is found at all. Set once (kc__find_tool runs under the local
 * tier's lock). */
static char refused_tool[PATH_MAX], refused_part[PATH_MAX];

/* A tool kcache found by itself (beside its library, on $PATH), as the
 * path to start: an executable that nobody but this user and root can
 * replace (kc_trusted_path; a tree unpacked under /tmp must not run
 * another user's /tmp/tools/kcache). One that another user could replace
 * is passed over, silently while another candidate is found. */
static char *trusted_tool(const char *cand)
{
    if (!executable_file(cand))
        return NULL;
    char real[PATH_MAX], bad[PATH_MAX];
    int rc = kc_trusted_path(cand, real, sizeof real, bad);
    if (rc == -EPERM && refused_tool[0] == '\0') {
        snprintf(refused_tool, sizeof refused_tool, "%s", cand);
        snprintf(refused_part, sizeof refused_part, "%s", bad);
    }
    return rc == 0 ? strdup(real) : NULL;
}

/* `name` (no '/') on the absolute entries of $PATH, the first one nobody
 * else can replace (trusted_tool); an empty, "." or other relative entry
 * names the working directory, which the host may have changed to one
 * another user controls, and is skipped. */
static char *search_path(const char *name)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p != 0;) {
        size_t n = strcspn(p, ":");
        if (n > 0 && p[0] == '/' && n < PATH_MAX) {
            char cand[PATH_MAX + 64];
            snprintf(cand, sizeof cand, "%.*s/%s", (int)n, p, name);
            char *t = trusted_tool(cand);
            if (t != NULL)
                return t;
        }
        p += n;
        if (*p == ':')
            p++;
    }
    return NULL;
}

/* A tool named by the caller or KCACHE_TOOL: an absolute path as it is, a
 * bare name on $PATH's absolute entries, a relative path never (it would
 * mean a different program after every chdir). */
static char *named_tool(const char *name)
{
    if (name[0] == '/')
        return strdup(name);
    if (strchr(name, '/') == NULL)
        return search_path(name);
    return NULL;
}

char *kc__find_tool(const char *given, const char *lib)
{
    /* A secure-execution process (set-user-ID, capabilities) starts
     * nothing its caller's environment could name. */
    if (getauxval(AT_SECURE) != 0)
        return NULL;
    if (given != NULL && given[0] != 0)
        return named_tool(given);
    const char *env = kc_config_get(KC_VAR_TOOL);
    if (env != NULL && env[0] != 0)
        return named_tool(env);
    char real[PATH_MAX];
    if (lib != NULL && lib[0] == '/' && realpath(lib, real) != NULL) {
        char *slash = strrchr(real, '/');
        *slash = 0;
        static const char *const rel[] = {"/../tools/kcache", "/../../tools/kcache",
                                          "/../bin/kcache", "/../../bin/kcache"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char cand[PATH_MAX + 32];
            snprintf(cand, sizeof cand, "%s%s", real, rel[i]);
            char *t = trusted_tool(cand);
            if (t != NULL)
                return t;
        }
    }
    return search_path("kcache");
}

/* Starts `tool owner --dir DIR` detached. tool is an absolute path (from
 * kc__find_tool); a relative dir is made absolute against the working
 * directory now, as the caller's own accesses see it. */
/* Closes the child's descriptors from `from` up: glibc 2.34's
 * posix_spawn_file_actions_addclosefrom_np where this glibc has it (found
 * at run time, so a shim built against glibc 2.31 asks nothing newer);
 * without it the owner closes what it inherited itself (kcache owner's
 * owner_detach). */
static void add_closefrom(posix_spawn_file_actions_t *fa, int from)
{
    int (*addclosefrom)(posix_spawn_file_actions_t *, int) =
        (int (*)(posix_spawn_file_actions_t *, int))dlvsym(
            RTLD_DEFAULT, "posix_spawn_file_actions_addclosefrom_np", "GLIBC_2.34");
    if (addclosefrom != NULL)
        addclosefrom(fa, from);
}

/* Runs posix_spawn from an intermediate process the host cannot see: a
 * clone with no exit signal (no SIGCHLD reaches the host, whatever its
 * disposition, and waitpid(-1) without __WCLONE/__WALL never returns it),
 * which spawns the owner and leaves at once; the owner is its child, so
 * it is reparented to init (or the host's subreaper), never the host's.
 * The clone runs no fork handlers (neither ours nor the host's) and calls
 * only posix_spawn and _exit. *pid is the intermediate, reaped by
 * kc__kicker_reap with __WCLONE. Where clone is refused (a seccomp
 * profile), the owner is spawned directly, as before. Returns posix_spawn's
 * error number, or 0.
 *
 * One host does see the owner: a host that is PID 1 of its namespace or a
 * child subreaper (PR_SET_CHILD_SUBREAPER) adopts it when the intermediate
 * leaves, because it asked the kernel for every orphan below it, and any
 * process kcache starts is below it. No way of starting a process avoids
 * that short of keeping an intermediate alive for the owner's life (a
 * copy of the host pinning its memory), so kcache does not try: such a
 * host reaps what it adopts by contract (tini, dumb-init, systemd, a
 * supervisor); a program run as PID 1 that reaps nothing should run under
 * an init (`docker run --init`). docs/internals.md says so too. */
static int spawn_unseen(pid_t *pid, const char *tool, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const env[])
{
    long c = syscall(SYS_clone, 0L /* flags, exit signal 0 */, NULL, NULL, NULL, NULL);
    if (c == 0) {
        pid_t owner;
        _exit(posix_spawn(&owner, tool, fa, at, argv, env) & 0xff);
    }
    if (c < 0)
        return posix_spawn(pid, tool, fa, at, argv, env);
    *pid = (pid_t)c;
    int st = 0;
    /* posix_spawn returns once the owner has exec'd: milliseconds; bounded
     * all the same (kc__kicker_reap picks a late one up). */
    for (int i = 0; i < 400; i++) {
        pid_t r = waitpid(*pid, &st, WNOHANG | __WCLONE);
        if (r == *pid) {
            *pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : ECHILD;
        }
        if (r < 0 && errno != EINTR) {
            *pid = 0;
            return 0;
        }
        struct timespec ts = {0, 250000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int spawn_owner(const char *tool, const char *dir, uint64_t max_size, pid_t *pid)
{
    char absdir[PATH_MAX];
    if (dir[0] != '/') {
        if (realpath(dir, absdir) == NULL)
            return -errno;
        dir = absdir;
    }
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
    posix_spawnattr_setflags(&at,
                             POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    /* The owner outlives the host: it gets none of the host's files (a
     * pipe it held would keep the host's reader waiting for its idle exit)
     * and does not pin the host's working directory. */
    for (int fd = 0; fd < 3; fd++)
        posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
    add_closefrom(&fa, 3);
    posix_spawn_file_actions_addchdir_np(&fa, "/");
    int rc = spawn_unseen(pid, tool, &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    return -rc;
}

void kc__kicker_init(struct kc__kicker *k, char *tool)
{
    memset(k, 0, sizeof *k);
    k->tool = tool;
}

void kc__kicker_reap(struct kc__kicker *k, int wait_ms)
{
    if (k->spawned <= 0)
        return;
    for (int i = 0;; i++) {
        pid_t r = waitpid(k->spawned, NULL, WNOHANG | __WALL);
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
    uint64_t now = kc_mono_ns();
    /* Is an owner running? Its lock says. The descriptor lives only for
     * this test: the host never finds one of kcache's between its calls
     * (nor could it close or reuse it under the kicker). */
    int fd = open(p->lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    bool running = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd); /* releases the lock, if it was taken */
    if (running)
        return;
    if (k->last_kick_ns != 0 && now - k->last_kick_ns <= KICK_INTERVAL_NS)
        return;
    k->last_kick_ns = now;
    if (k->tool == NULL || k->tool[0] != '/') {
        if (!k->warned && refused_tool[0] != '\0') {
            k->warned = true;
            fprintf(stderr,
                    "kcache: warning: cannot start the store owner: %s is passed over (another "
                    "user can change %s) and no other kcache tool was found (KCACHE_TOOL names "
                    "one); writes stay in the spool\n",
                    refused_tool, refused_part);
        } else if (!k->warned) {
            k->warned = true;
            fprintf(stderr, "kcache: warning: cannot start the store owner: no kcache tool "
                            "beside the library or on an absolute $PATH entry (KCACHE_TOOL: an "
                            "absolute path or a bare name); writes stay in the spool\n");
        }
        return;
    }
    pid_t pid = 0;
    int rc = spawn_owner(k->tool, p->dir, max_size, &pid);
    if (rc == 0)
        k->spawned = pid;
    else if (!k->warned) {
        k->warned = true;
        fprintf(stderr, "kcache: warning: cannot start the store owner %s: %s\n", k->tool,
                strerror(-rc));
    }
}

void kc__kicker_after_fork(struct kc__kicker *k)
{
    k->spawned = 0;
    k->last_kick_ns = 0;
}

void kc__kicker_free(struct kc__kicker *k)
{
    free(k->tool);
    k->tool = NULL;
}
