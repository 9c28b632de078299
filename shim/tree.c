/*
 * A process tree recorded: see tree.h.
 *
 * A report (r-<pid>-<nonce>) is written at exit and again before an exec
 * replaces the image (the same name: the later one wins when the exec
 * fails). A claim (x-<pid>-<ns>) is written before every exec, posix_spawn,
 * system and popen of a recording process, naming the program the kernel
 * will run (the interpreter of a script) by device and inode, with the
 * PATH lookup that found it; it is removed again when the call fails. A
 * claim must be answered by the report of an image started by exec whose
 * executable is that file: a program without the shim leaves its claim
 * unanswered. The claim is written with system calls only and no
 * allocation, since it may run in a vfork child.
 */
#include "tree.h"
#include "shim.h"

#include "../common/buf.h"
#include "../common/clock.h"
#include "../common/log.h"
#include "../store/local/local.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define REPORT_MAGIC 0x3152544b43ull /* "KCTR1" */
#define CLAIM_MAGIC 0x3158544b43ull  /* "KCTX1" */

KC__HOT static bool tree_on;
static char tree_dir[PATH_MAX - 128]; /* private_dir bounds it */
KC__HOT static pid_t image_pid, forked_pid;
KC__HOT static uint64_t nonce;
KC__HOT static bool by_exec; /* this image was started by an exec (not nvcc's watched child) */
static struct kc__deps tree_deps;

/* ---- system calls that record nothing ----------------------------------------------- */

static int sys_open(const char *p, int flags, int mode)
{
    return (int)syscall(SYS_openat, AT_FDCWD, p, flags | O_CLOEXEC, mode);
}

static int sys_stat(const char *p, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, p, st, 0);
}

static void sys_write_all(int fd, const void *p, size_t n, bool *ok)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = syscall(SYS_write, fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            *ok = false;
            return;
        }
        c += w;
        n -= (size_t)w;
    }
}

/* ---- reports -------------------------------------------------------------------------- */

static void put_str(struct kc_buf *b, const char *s)
{
    kc_buf_put_u64(b, strlen(s));
    kc_buf_add(b, s, strlen(s));
}

static void put_dep(struct kc_buf *b, int kind, const char *path, const struct stat *st)
{
    kc_buf_put_u8(b, (uint8_t)kind);
    put_str(b, path);
    struct stat z = {0};
    kc_buf_add(b, st != NULL ? st : &z, sizeof z);
}

static int add_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct kc_buf *b = arg;
    const char *self = kc__self_path();
    const char *n = info->dlpi_name;
    struct stat st;
    if (n == NULL || n[0] != '/' || (self != NULL && strcmp(n, self) == 0) || sys_stat(n, &st) != 0)
        return 0;
    put_dep(b, KC_DEP_FILE, n, &st);
    return 0;
}

/* Writes this image's report. Recording stops meanwhile. */
static void report_write(void)
{
    kc__deps_end_process();
    struct kc_buf b = {0};
    pid_t me = getpid();
    /* 1: an exec'd image, answering a claim; 2: nvcc's watched child, the
     * tree's root, whose report must be there too; 0: a forked child. */
    int claimed = me != image_pid ? 0 : by_exec ? 1 : 2;
    struct stat exe = {0};
    char exe_path[PATH_MAX], cwd[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
    exe_path[n > 0 ? n : 0] = '\0';
    bool ok = n > 0 && sys_stat("/proc/self/exe", &exe) == 0 && getcwd(cwd, sizeof cwd) != NULL;
    kc_buf_put_u64(&b, REPORT_MAGIC);
    kc_buf_put_u8(&b, (uint8_t)(!ok || tree_deps.failed || tree_deps.unkeyable));
    kc_buf_put_u8(&b, (uint8_t)claimed);
    kc_buf_put_u64(&b, (uint64_t)exe.st_dev);
    kc_buf_put_u64(&b, (uint64_t)exe.st_ino);
    put_str(&b, ok ? cwd : "/");
    /* The executable and every object loaded, then what the image did. */
    size_t at = b.len;
    kc_buf_put_u64(&b, 0);
    uint64_t count = 0;
    if (ok) {
        put_dep(&b, KC_DEP_FILE, exe_path, &exe);
        count++;
    }
    size_t before = b.len;
    dl_iterate_phdr(add_object, &b);
    /* add_object's entries: count them by walking what it added. */
    for (size_t p = before; p < b.len && !b.err;) {
        uint64_t len;
        memcpy(&len, b.p + p + 1, 8);
        p += 1 + 8 + (size_t)len + sizeof(struct stat);
        count++;
    }
    for (size_t i = 0; i < tree_deps.n; i++) {
        const struct kc__dep *d = &tree_deps.v[i];
        put_dep(&b, d->kind, d->path, &d->st);
        count++;
    }
    if (!b.err)
        memcpy(b.p + at, &count, 8); /* little-endian, as kc_buf writes */
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/r-%ld-%llx", tree_dir, (long)me, (unsigned long long)nonce);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = b.err ? -1 : sys_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
    bool wrote = fd >= 0;
    if (fd >= 0) {
        sys_write_all(fd, b.p, b.len, &wrote);
        close(fd);
    }
    if (!wrote || rename(tmp, path) != 0)
        unlink(tmp); /* the tree's claim on this image stays unanswered */
    kc_buf_free(&b);
}

static void report_atexit(void)
{
    if (tree_on)
        report_write();
}

static void after_fork(void)
{
    forked_pid = getpid();
}

static void begin(const char *dir, bool exec_started)
{
    snprintf(tree_dir, sizeof tree_dir, "%s", dir);
    image_pid = getpid();
    nonce = kc_mono_ns();
    by_exec = exec_started;
    tree_on = true;
    kc__deps_begin_process(&tree_deps);
    atexit(report_atexit);
    pthread_atfork(NULL, NULL, after_fork);
}

/* Whether `dir` is a directory of ours no other user can enter. */
static bool private_dir(const char *dir)
{
    struct stat st;
    return dir[0] == '/' && strlen(dir) < PATH_MAX - 128 && lstat(dir, &st) == 0 &&
           S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 077) == 0;
}

bool kc__ptree_start(void)
{
    const char *d = secure_getenv(KC_TREE_ENV);
    if (__builtin_expect(d == NULL, 1))
        return false;
    if (!private_dir(d))
        return false; /* unanswered: the tree is not stored */
    /* No counters, no stats line: what this process prints is the tree's
     * output, stored and replayed. */
    kc__tool_child();
    begin(d, true);
    return true;
}

void kc__ptree_child(const char *dir)
{
    setenv(KC_TREE_ENV, dir, 1);
    begin(dir, false);
}

/* ---- claims: written before an exec ---------------------------------------------------- */

struct claim {
    char buf[16384];
    size_t len;
    bool over;
};

static void claim_add(struct claim *c, const void *p, size_t n)
{
    if (c->len + n > sizeof c->buf) {
        c->over = true;
        return;
    }
    memcpy(c->buf + c->len, p, n);
    c->len += n;
}

static void claim_dep(struct claim *c, int kind, const char *path, const struct stat *st)
{
    uint8_t k = (uint8_t)kind;
    uint64_t n = strlen(path);
    struct stat z;
    memset(&z, 0, sizeof z);
    claim_add(c, &k, 1);
    claim_add(c, &n, 8);
    claim_add(c, path, (size_t)n);
    claim_add(c, st != NULL ? st : &z, sizeof z);
}

/* Whether `p` is a regular file this process may execute. */
static bool executable(const char *p, struct stat *st)
{
    return sys_stat(p, st) == 0 && S_ISREG(st->st_mode) &&
           syscall(SYS_faccessat, AT_FDCWD, p, X_OK) == 0;
}

/* Records a candidate that is not the program: absent, or not executable. */
static void not_it(struct claim *c, const char *p)
{
    struct stat other;
    if (sys_stat(p, &other) == 0)
        claim_dep(c, KC_DEP_OTHER, p, &other);
    else
        claim_dep(c, KC_DEP_ABSENT, p, NULL);
}

/* Finds `file` as execvp does (on PATH unless it names a slash), recording
 * the candidates that were not it. */
static bool resolve(const char *file, bool search, struct claim *c, char *out, struct stat *st)
{
    if (!search || strchr(file, '/') != NULL) {
        snprintf(out, PATH_MAX, "%s", file);
        if (executable(out, st))
            return true;
        not_it(c, out);
        return false;
    }
    const char *path = getenv("PATH");
    if (path == NULL)
        path = "/bin:/usr/bin";
    for (const char *p = path;;) {
        const char *e = strchr(p, ':');
        size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        int w = n == 0 ? snprintf(out, PATH_MAX, "%s", file)
                       : snprintf(out, PATH_MAX, "%.*s/%s", (int)n, p, file);
        if (w > 0 && w < PATH_MAX) {
            if (executable(out, st))
                return true;
            not_it(c, out);
        }
        if (e == NULL)
            return false;
        p = e + 1;
    }
}

/* Announces the program `file` is about to run (search: found on PATH):
 * a claim named `name` (PATH_MAX). True when it names a program (removed
 * again if the call fails); false when there is none (the candidates
 * probed are recorded: a program that appears there later is a miss), or
 * the claim could not be written (the tree is then not stored). */
static bool claim(const char *file, bool search, char *name)
{
    if (file == NULL)
        return false;
    struct claim c;
    c.len = 0;
    c.over = false;
    uint64_t magic = CLAIM_MAGIC;
    claim_add(&c, &magic, 8);
    size_t at = c.len;
    uint64_t dev = 0, ino = 0;
    claim_add(&c, &dev, 8);
    claim_add(&c, &ino, 8);
    char path[PATH_MAX];
    struct stat st;
    bool found = resolve(file, search, &c, path, &st);
    struct stat run = st;
    if (found)
        claim_dep(&c, KC_DEP_FILE, path, &st);
    /* A script: the kernel runs its interpreter. */
    int fd = sys_open(path, O_RDONLY | O_NONBLOCK, 0);
    char head[256];
    ssize_t n = found && fd >= 0 ? syscall(SYS_read, fd, head, sizeof head - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n > 2 && head[0] == '#' && head[1] == '!') {
        head[n] = '\0';
        char *s = head + 2;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t l = strcspn(s, " \t\n");
        s[l] = '\0';
        if (sys_stat(s, &run) != 0)
            found = false;
        claim_dep(&c, KC_DEP_FILE, s, &run);
    }
    /* No program: a record of the probes only (device and inode 0). */
    dev = found ? (uint64_t)run.st_dev : 0;
    ino = found ? (uint64_t)run.st_ino : 0;
    memcpy(c.buf + at, &dev, 8);
    memcpy(c.buf + at + 8, &ino, 8);
    static unsigned long seq; /* a vfork child shares it: unique with the pid */
    snprintf(name, PATH_MAX, "%s/x-%ld-%lx-%llx", tree_dir, (long)syscall(SYS_getpid),
             __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED), (unsigned long long)kc_mono_ns());
    bool ok = !c.over;
    fd = ok ? sys_open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600) : -1;
    if (fd < 0)
        ok = false;
    else {
        sys_write_all(fd, c.buf, c.len, &ok);
        close(fd);
    }
    if (!ok) {
        if (fd >= 0)
            syscall(SYS_unlinkat, AT_FDCWD, name, 0);
        tree_deps.failed = true; /* a single store: safe in a vfork child */
        return false;
    }
    return found;
}

static void unclaim(const char *name)
{
    int e = errno;
    syscall(SYS_unlinkat, AT_FDCWD, name, 0);
    errno = e;
}

/* Before an exec replaces this image (not a vfork child's: it shares the
 * parent's memory, and its parent reports): its report. */
static bool flush_before_exec(void)
{
    pid_t me = (pid_t)syscall(SYS_getpid);
    if (me != image_pid && me != forked_pid)
        return false;
    report_write();
    return true;
}

static void after_failed_exec(bool flushed)
{
    if (flushed)
        kc__deps_begin_process(&tree_deps);
}

#define REAL_FN(var, name)                                                                         \
    do {                                                                                           \
        if (var == NULL)                                                                           \
            var = (__typeof__(var))kc__real_dlsym(RTLD_NEXT, name);                                \
    } while (0)

/* The exec family: the claim, the report, the call. */
#define EXEC_BODY(var, name, file, search, call)                                                   \
    REAL_FN(var, name);                                                                            \
    if (__builtin_expect(!tree_on, 1))                                                             \
        return call;                                                                               \
    char cname[PATH_MAX];                                                                          \
    bool claimed = claim(file, search, cname);                                                     \
    bool flushed = flush_before_exec();                                                            \
    int rc = call;                                                                                 \
    if (claimed)                                                                                   \
        unclaim(cname);                                                                            \
    int e = errno;                                                                                 \
    after_failed_exec(flushed);                                                                    \
    errno = e;                                                                                     \
    return rc

/* execve and execv as glibc has them: the system call (no lookup of the
 * real function: a vfork child calls them). */
static int sys_execve(const char *path, char *const argv[], char *const envp[])
{
    return (int)syscall(SYS_execve, path, argv, envp);
}

static int (*real_execvp)(const char *, char *const[]);
static int (*real_execvpe)(const char *, char *const[], char *const[]);

static int (*real_execve)(const char *, char *const[], char *const[]) = sys_execve;

KC_EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
    EXEC_BODY(real_execve, "execve", path, false, sys_execve(path, argv, envp));
}

KC_EXPORT int execv(const char *path, char *const argv[])
{
    EXEC_BODY(real_execve, "execve", path, false, sys_execve(path, argv, environ));
}

KC_EXPORT int execvp(const char *file, char *const argv[])
{
    EXEC_BODY(real_execvp, "execvp", file, true, real_execvp(file, argv));
}

KC_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
    EXEC_BODY(real_execvpe, "execvpe", file, true, real_execvpe(file, argv, envp));
}

static int (*real_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                         const posix_spawnattr_t *, char *const[], char *const[]);
static int (*real_spawnp)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                          const posix_spawnattr_t *, char *const[], char *const[]);

/* posix_spawn: the child is another image; this one goes on. */
#define SPAWN_BODY(var, name, file, search, call)                                                  \
    REAL_FN(var, name);                                                                            \
    if (__builtin_expect(!tree_on, 1))                                                             \
        return call;                                                                               \
    char cname[PATH_MAX];                                                                          \
    bool claimed = claim(file, search, cname);                                                     \
    int rc = call;                                                                                 \
    if (claimed && rc != 0)                                                                        \
        unclaim(cname);                                                                            \
    return rc

KC_EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    SPAWN_BODY(real_spawn, "posix_spawn", path, false, real_spawn(pid, path, fa, attr, argv, envp));
}

KC_EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    SPAWN_BODY(real_spawnp, "posix_spawnp", file, true,
               real_spawnp(pid, file, fa, attr, argv, envp));
}

/* A process that leaves by _exit (dash does) runs no atexit handler. */
static void report_before_exit(void)
{
    pid_t me = (pid_t)syscall(SYS_getpid);
    if (me == image_pid || me == forked_pid) {
        report_write();
        tree_on = false; /* nothing after: the atexit handler has no more to say */
    }
}

/* As glibc's _exit: exit_group, no lookup (a vfork child calls it). */
static void __attribute__((noreturn)) sys_exit(int status)
{
    for (;;)
        syscall(SYS_exit_group, status);
}

KC_EXPORT void _exit(int status)
{
    if (__builtin_expect(tree_on, 0))
        report_before_exit();
    sys_exit(status);
}

KC_EXPORT void _Exit(int status)
{
    if (__builtin_expect(tree_on, 0))
        report_before_exit();
    sys_exit(status);
}

static int (*real_system)(const char *);
static FILE *(*real_popen)(const char *, const char *);

/* system and popen run /bin/sh. */
KC_EXPORT int system(const char *cmd)
{
    REAL_FN(real_system, "system");
    if (__builtin_expect(!tree_on, 1) || cmd == NULL)
        return real_system(cmd);
    char cname[PATH_MAX];
    bool claimed = claim("/bin/sh", false, cname);
    int rc = real_system(cmd);
    if (claimed && rc == -1)
        unclaim(cname);
    return rc;
}

KC_EXPORT FILE *popen(const char *cmd, const char *mode)
{
    REAL_FN(real_popen, "popen");
    if (__builtin_expect(!tree_on, 1))
        return real_popen(cmd, mode);
    char cname[PATH_MAX];
    bool claimed = claim("/bin/sh", false, cname);
    FILE *f = real_popen(cmd, mode);
    if (claimed && f == NULL)
        unclaim(cname);
    return f;
}

/* ---- the root: the reports merged ---------------------------------------------------- */

/* Report directories of trees whose nvcc was killed (SIGKILL runs no
 * cleanup) are removed by a later miss once a day old. */
static void remove_stale(const char *store_dir)
{
    DIR *d = opendir(store_dir);
    if (d == NULL)
        return;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        char p[PATH_MAX];
        if (strncmp(e->d_name, "tree.", 5) != 0 ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
            st.st_uid != geteuid() || now.tv_sec - st.st_mtim.tv_sec < 86400 ||
            (size_t)snprintf(p, sizeof p, "%s/%s", store_dir, e->d_name) >= sizeof p)
            continue;
        kc__ptree_remove(p);
    }
    closedir(d);
}

int kc__ptree_open(const char *store_dir, char *dir, size_t n)
{
    if (store_dir == NULL || store_dir[0] != '/' || strlen(store_dir) > PATH_MAX - 200 ||
        (size_t)snprintf(dir, n, "%s/tree.XXXXXX", store_dir) >= n)
        return -ENAMETOOLONG;
    remove_stale(store_dir);
    return mkdtemp(dir) != NULL ? 0 : -errno;
}

void kc__ptree_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.')
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

void kc__ptree_free(struct kc__ptree *t)
{
    kc__deps_free(&t->reads);
    for (size_t i = 0; i < t->n_written; i++)
        free(t->written[i]);
    free(t->written);
    memset(t, 0, sizeof *t);
}

/* A path made absolute against `cwd`. */
static char *absolute(const char *cwd, const char *p, size_t n)
{
    char *s;
    if (n > 0 && p[0] == '/') {
        s = malloc(n + 1);
        if (s != NULL) {
            memcpy(s, p, n);
            s[n] = '\0';
        }
    } else if (asprintf(&s, "%s/%.*s", strcmp(cwd, "/") == 0 ? "" : cwd, (int)n, p) < 0) {
        s = NULL;
    }
    return s;
}

struct claimed {
    uint64_t dev, ino;
    bool answered;
    char prog[128]; /* for the log */
};

static int read_file(int dfd, const char *name, struct kc_buf *b)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        kc_buf_add(b, buf, (size_t)n);
    }
    close(fd);
    return b->err ? -ENOMEM : 0;
}

static bool written_has(const struct kc__ptree *t, const char *p)
{
    for (size_t i = 0; i < t->n_written; i++)
        if (strcmp(t->written[i], p) == 0)
            return true;
    return false;
}

static int written_add(struct kc__ptree *t, char *p)
{
    if (written_has(t, p)) {
        free(p);
        return 0;
    }
    if (t->n_written == t->cap_written) {
        size_t cap = t->cap_written ? t->cap_written * 2 : 16;
        char **v = realloc(t->written, cap * sizeof *v);
        if (v == NULL) {
            free(p);
            return -ENOMEM;
        }
        t->written = v;
        t->cap_written = cap;
    }
    t->written[t->n_written++] = p;
    return 0;
}

/* Reads `n` dependencies from r into the tree (paths against cwd). */
static int read_deps(struct kc_rd *r, uint64_t n, const char *cwd, struct kc__ptree *t,
                     struct kc__deps *all)
{
    for (uint64_t i = 0; i < n; i++) {
        int kind = kc_rd_get_u8(r);
        uint64_t len = kc_rd_get_u64(r);
        if (len > kc_rd_left(r) || len >= PATH_MAX)
            return -EINVAL;
        const char *p = (const char *)kc_rd_take(r, (size_t)len);
        const unsigned char *sp = kc_rd_take(r, sizeof(struct stat));
        if ((p == NULL && len > 0) || sp == NULL)
            return -EINVAL;
        char *abs = absolute(cwd, p, (size_t)len);
        if (abs == NULL)
            return -ENOMEM;
        if (kind == KC_DEP_WRITTEN || kind == KC_DEP_CREATED) {
            if (written_add(t, abs) != 0)
                return -ENOMEM;
            continue;
        }
        if (kind != KC_DEP_FILE && kind != KC_DEP_ABSENT && kind != KC_DEP_DIR &&
            kind != KC_DEP_OTHER) {
            free(abs);
            return -EINVAL;
        }
        struct kc__dep *e = kc__deps_push(all, abs, kind);
        free(abs);
        if (e == NULL)
            return -ENOMEM;
        memcpy(&e->st, sp, sizeof e->st);
    }
    return 0;
}

static int by_path(const void *a, const void *b)
{
    const struct kc__dep *x = a, *y = b;
    int c = strcmp(x->path, y->path);
    /* The strongest observation first: a file read, a directory, a stat,
     * an absence. */
    static const int rank[] = {
        [KC_DEP_FILE] = 0, [KC_DEP_DIR] = 1, [KC_DEP_OTHER] = 2, [KC_DEP_ABSENT] = 3};
    return c != 0 ? c : rank[x->kind] - rank[y->kind];
}

int kc__ptree_collect(const char *dir, struct kc__ptree *t)
{
    memset(t, 0, sizeof *t);
    DIR *d = opendir(dir);
    if (d == NULL)
        return -errno;
    struct claimed *cl = NULL;
    size_t n_cl = 0, cap_cl = 0;
    struct {
        uint64_t dev, ino;
    } *rep = NULL;
    size_t n_rep = 0, cap_rep = 0;
    struct kc__deps all = {0};
    bool root_seen = false;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        bool is_claim = e->d_name[0] == 'x' && e->d_name[1] == '-';
        bool is_report = e->d_name[0] == 'r' && e->d_name[1] == '-';
        if (!is_claim && !is_report)
            continue;
        if (is_report && strstr(e->d_name, ".tmp") != NULL) {
            t->why = "a program's report was left unfinished";
            continue;
        }
        struct kc_buf b = {0};
        rc = read_file(dirfd(d), e->d_name, &b);
        struct kc_rd r;
        kc_rd_init(&r, b.p, b.len);
        if (rc == 0 && is_claim) {
            if (kc_rd_get_u64(&r) != CLAIM_MAGIC)
                rc = -EINVAL;
            uint64_t dev = kc_rd_get_u64(&r), ino = kc_rd_get_u64(&r);
            if (rc == 0 && n_cl == cap_cl) {
                cap_cl = cap_cl ? cap_cl * 2 : 16;
                struct claimed *v = realloc(cl, cap_cl * sizeof *v);
                rc = v != NULL ? 0 : -ENOMEM;
                if (v != NULL)
                    cl = v;
            }
            if (rc == 0)
                cl[n_cl++] = (struct claimed){dev, ino, dev == 0 && ino == 0, ""};
            /* The lookup's candidates and the program: counted until the
             * stream ends. */
            while (rc == 0 && kc_rd_left(&r) > 0) {
                rc = read_deps(&r, 1, "/", t, &all);
                if (rc == 0 && all.v[all.n - 1].kind == KC_DEP_FILE)
                    snprintf(cl[n_cl - 1].prog, sizeof cl[n_cl - 1].prog, "%s",
                             all.v[all.n - 1].path);
            }
        } else if (rc == 0) {
            if (kc_rd_get_u64(&r) != REPORT_MAGIC)
                rc = -EINVAL;
            int bad = kc_rd_get_u8(&r);
            int claimed = kc_rd_get_u8(&r);
            uint64_t dev = kc_rd_get_u64(&r), ino = kc_rd_get_u64(&r);
            uint64_t len = kc_rd_get_u64(&r);
            char cwd[PATH_MAX];
            const void *cp = len < sizeof cwd && len <= kc_rd_left(&r) ? kc_rd_take(&r, len) : NULL;
            if (cp == NULL)
                rc = -EINVAL;
            else {
                memcpy(cwd, cp, (size_t)len);
                cwd[len] = '\0';
            }
            if (rc == 0 && bad)
                t->why = "a program of the tree could not be followed (it read a file kcache "
                         "cannot key, or ran out of memory)";
            if (rc == 0 && claimed == 2)
                root_seen = true;
            if (rc == 0 && claimed == 1) {
                if (n_rep == cap_rep) {
                    cap_rep = cap_rep ? cap_rep * 2 : 16;
                    void *v = realloc(rep, cap_rep * sizeof *rep);
                    rc = v != NULL ? 0 : -ENOMEM;
                    if (v != NULL)
                        rep = v;
                }
                if (rc == 0) {
                    rep[n_rep].dev = dev;
                    rep[n_rep++].ino = ino;
                }
            }
            uint64_t n = kc_rd_get_u64(&r);
            if (rc == 0)
                rc = read_deps(&r, n, cwd, t, &all);
            if (rc == 0 && kc_rd_end(&r) != 0)
                rc = -EINVAL;
        }
        kc_buf_free(&b);
    }
    closedir(d);
    /* Every claim answered by one report of an image of that program. */
    for (size_t i = 0; rc == 0 && i < n_cl; i++) {
        for (size_t j = 0; j < n_rep && !cl[i].answered; j++)
            if (rep[j].dev == cl[i].dev && rep[j].ino == cl[i].ino) {
                cl[i].answered = true;
                rep[j].dev = rep[j].ino = (uint64_t)-1;
            }
        if (!cl[i].answered)
            kc_log(KC_LOG_DEBUG, "nvcc: %s reported nothing", cl[i].prog);
        if (!cl[i].answered && t->why == NULL)
            t->why = "a program it ran reported nothing (statically linked, or run without the "
                     "preload)";
    }
    if (rc == 0 && !root_seen && t->why == NULL)
        t->why = "nvcc's own report is missing";
    free(cl);
    free(rep);
    /* One entry per path, the strongest; none the tree wrote itself, none
     * of the report directory. */
    if (rc == 0 && all.n > 0)
        qsort(all.v, all.n, sizeof *all.v, by_path);
    size_t dl = strlen(dir);
    for (size_t i = 0; rc == 0 && i < all.n; i++) {
        const struct kc__dep *x = &all.v[i];
        if (i > 0 && strcmp(x->path, all.v[i - 1].path) == 0)
            continue;
        if (written_has(t, x->path) || (strncmp(x->path, dir, dl) == 0 && x->path[dl] == '/'))
            continue;
        struct kc__dep *y = kc__deps_push(&t->reads, x->path, x->kind);
        if (y == NULL)
            rc = -ENOMEM;
        else
            y->st = x->st;
    }
    kc__deps_free(&all);
    return rc;
}
