/*
 * Header tracking through libc interposition. See deps.h.
 *
 * Every wrapper here is on the path of every open() in every process that
 * preloads the shim, so the first thing each does is one thread-local load;
 * with no compile being tracked on the thread it goes straight to libc.
 */
/* The wrappers must define open and open64 separately. */
#undef _FILE_OFFSET_BITS
#include "deps.h"
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

static __thread struct kc__deps *tracking __attribute__((tls_model("initial-exec")));

/* A compiler tool's run (tool.c): every thread's calls are recorded, into
 * one set under a lock, through `tracking` while a call is recorded;
 * process_busy keeps the recording's own calls out. */
KC__HOT static struct kc__deps *process_deps;
/* A second set that sees every call too: a tool's run inside an nvcc tree
 * (tool.c's watched child records its run, tree.c the tree's report). */
KC__HOT static struct kc__deps *process_also;
KC__HOT static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int process_busy __attribute__((tls_model("initial-exec")));

static void process_enter(void)
{
    pthread_mutex_lock(&process_lock);
    process_busy = 1;
    tracking = process_deps;
}

static void process_leave(void)
{
    tracking = NULL;
    process_busy = 0;
    pthread_mutex_unlock(&process_lock);
}

/* Records with `call` when this thread tracks a compile, or a tool's run
 * is recorded: one thread-local load on the path of every call otherwise. */
#define WATCH(call)                                                                                \
    do {                                                                                           \
        if (__builtin_expect(tracking != NULL, 0)) {                                               \
            call;                                                                                  \
        } else if (__builtin_expect(process_deps != NULL, 0) && !process_busy) {                   \
            process_enter();                                                                       \
            call;                                                                                  \
            if (process_also != NULL) {                                                            \
                tracking = process_also;                                                           \
                call;                                                                              \
            }                                                                                      \
            process_leave();                                                                       \
        }                                                                                          \
    } while (0)

void kc__deps_begin_process(struct kc__deps *d)
{
    d->process = true;
    pthread_mutex_lock(&process_lock);
    /* A set already recording keeps recording beside the new one. */
    if (process_deps != NULL && process_deps != d)
        process_also = process_deps;
    __atomic_store_n(&process_deps, d, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&process_lock);
}

void kc__deps_end_process(void)
{
    pthread_mutex_lock(&process_lock);
    __atomic_store_n(&process_deps, NULL, __ATOMIC_RELEASE);
    process_also = NULL;
    pthread_mutex_unlock(&process_lock);
}

/* Something was opened for writing: a side effect; a tool's run names it
 * (its output, or not). */
static void wrote(struct kc__deps *d, const char *path, int flags)
{
    d->writes = true;
    /* O_CREAT|O_EXCL that succeeded: a file the run made, none there
     * before (a scratch file when it is gone at the run's end). */
    int kind = (flags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL) ? KC_DEP_CREATED : KC_DEP_WRITTEN;
    if (d->process && kc__deps_push(d, path, kind) == NULL)
        d->failed = true;
}

void kc__deps_begin(struct kc__deps *d)
{
    tracking = d;
}

void kc__deps_end(void)
{
    tracking = NULL;
}

void kc__deps_free(struct kc__deps *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->v[i].path);
    free(d->v);
    memset(d, 0, sizeof *d);
}

/* The part of `path` below the bundled headers directory `dir` (slashes
 * after it skipped; "" for the directory itself), or NULL when it is not
 * below it. */
static const char *below_bundled(const char *dir, const char *path)
{
    size_t n = dir != NULL ? strlen(dir) : 0;
    if (n == 0 || strncmp(path, dir, n) != 0 ||
        (path[n] != '/' && path[n] != '\0' && dir[n - 1] != '/'))
        return NULL;
    path += n;
    while (*path == '/')
        path++;
    return path;
}

/* The path a dependency names now: itself, or for a KC_DEP_BUNDLED one its
 * file below `bundled` (in buf); NULL when there is no such directory. */
static const char *dep_path(const char *path, const char *bundled, char *buf, size_t cap)
{
    if (path[0] != KC_DEP_BUNDLED)
        return path;
    if (bundled == NULL || (size_t)snprintf(buf, cap, "%s/%s", bundled, path + 1) >= cap)
        return NULL;
    return buf;
}

/* The CUDA driver's compute cache ($CUDA_CACHE_PATH, else
 * ~/.nv/ComputeCache), which NVRTC 12.9+ reads and writes through the
 * driver during a compile (its own cache, on unless --no-cache or
 * CUDA_CACHE_DISABLE=1): what it holds changes no output, so its files are
 * neither dependencies nor side effects. "" when there is none. */
static char compute_cache_dir[PATH_MAX];

static void compute_cache_init(void)
{
    const char *c = getenv("CUDA_CACHE_PATH"), *h = getenv("HOME");
    if (c != NULL && c[0] == '/')
        snprintf(compute_cache_dir, sizeof compute_cache_dir, "%s", c);
    else if (h != NULL && h[0] == '/')
        snprintf(compute_cache_dir, sizeof compute_cache_dir, "%s/.nv/ComputeCache", h);
}

static const char *compute_cache(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, compute_cache_init);
    return compute_cache_dir;
}

/* The compute cache's files: neither dependencies nor side effects. */
static bool in_compute_cache(const char *p)
{
    const char *cc = compute_cache();
    size_t n = strlen(cc);
    return n > 0 && strncmp(p, cc, n) == 0 && (p[n] == '/' || p[n] == '\0');
}

/* ---- what is a file of the key ------------------------------------------ */

static bool one_of(const char *s, const char *const *list)
{
    for (; *list != NULL; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* `s` past "self/", "thread-self/" or "<pid>/", and past "task/<tid>/"
 * after it: a process's or thread's own directory of /proc; NULL when it
 * is none. */
static const char *proc_own(const char *s)
{
    if (starts(s, "self/"))
        s += 5;
    else if (starts(s, "thread-self/"))
        s += 12;
    else {
        const char *q = s;
        while (*q >= '0' && *q <= '9')
            q++;
        if (q == s || *q != '/')
            return NULL;
        s = q + 1;
    }
    if (starts(s, "task/")) {
        const char *q = s + 5;
        while (*q >= '0' && *q <= '9')
            q++;
        if (q == s + 5 || *q != '/')
            return NULL;
        s = q + 1;
    }
    return s;
}

/* Whether the compile's runtime reads `p` for its own purposes: NVRTC and
 * the CUDA driver NVRTC 12.9+ loads during a compile (libcuda: its device
 * nodes, its /proc and /sys files, the process's memory map and limits),
 * the C library and the loader. What such a path holds is no input of the
 * compile's output: whatever is there is neither a dependency nor a side
 * effect. Exact names and a few directories of the kernel's own (no
 * directory a user can put a header in), and the driver's files in
 * /dev/shm by their name:
 *   /dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom, /dev/nvidia*
 *     (nvidiactl, nvidia<N>, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset,
 *     nvidia-caps/...), /dev/shm/cuda.shm.* (the driver's shared memory)
 *   /proc/driver/nvidia/..., /proc/sys/... (the kernel's tunables)
 *   /proc/{cpuinfo,meminfo,stat,devices,modules,version,mounts,filesystems}
 *   /proc/{self,thread-self,<pid>}[/task/<tid>]/{maps,smaps,status,stat,
 *     statm,auxv,cmdline,environ,limits,mountinfo,mounts,cgroup,numa_maps}
 *   /sys/{devices,bus,class,module,kernel}/..., /sys/fs/cgroup/...
 * Any other file of /proc or /sys, device node, FIFO or socket the compile
 * reads is no dependency kcache can key: the compile passes through
 * (kc__deps.unkeyable). strace of NVRTC 13.0, 12.9 and 13.5 here (with the
 * stand-in driver) shows none of these read during a compile; the list is
 * what the real driver reads (no GPU here to check it). */
static bool runtime_own(const char *p)
{
    static const char *const dev[] = {"null", "zero", "full", "random", "urandom", NULL};
    static const char *const proc[] = {"cpuinfo", "meminfo", "stat",        "devices", "modules",
                                       "version", "mounts",  "filesystems", NULL};
    static const char *const own[] = {"maps",   "smaps",   "status",    "stat",   "statm",
                                      "auxv",   "cmdline", "environ",   "limits", "mountinfo",
                                      "mounts", "cgroup",  "numa_maps", NULL};
    static const char *const sys[] = {"devices/", "bus/",       "class/", "module/",
                                      "kernel/",  "fs/cgroup/", NULL};
    if (p[0] != '/')
        return false;
    if (starts(p, "/dev/"))
        return starts(p + 5, "nvidia") || starts(p + 5, "shm/cuda.shm.") || one_of(p + 5, dev);
    if (starts(p, "/proc/")) {
        p += 6;
        if (starts(p, "driver/nvidia/") || starts(p, "sys/") || one_of(p, proc))
            return true;
        const char *q = proc_own(p);
        return q != NULL && one_of(q, own);
    }
    if (starts(p, "/sys/")) {
        for (const char *const *s = sys; *s != NULL; s++)
            if (starts(p + 5, *s))
                return true;
    }
    return false;
}

/* Whether f_type is one of the kernel's pseudo filesystems: what their
 * files hold is made by the kernel when read (proc, sysfs, cgroup, ...). */
static bool pseudo_fs_type(unsigned long t)
{
    switch (t) {
    case 0x9fa0:     /* proc */
    case 0x62656572: /* sysfs */
    case 0x27e0eb:   /* cgroup */
    case 0x63677270: /* cgroup2 */
    case 0x64626720: /* debugfs */
    case 0x74726163: /* tracefs */
    case 0x73636673: /* securityfs */
    case 0xf97cff8c: /* selinuxfs */
    case 0x43415d53: /* smackfs */
    case 0xcafe4a11: /* bpf */
    case 0x6165676c: /* pstore */
    case 0xde5e81e4: /* efivarfs */
    case 0x62656570: /* configfs */
    case 0x1cd1:     /* devpts */
    case 0x65735543: /* fusectl */
    case 0x42494e4d: /* binfmt_misc */
    case 0x6e736673: /* nsfs */
    case 0x50495045: /* pipefs */
    case 0x534f434b: /* sockfs */
    case 0x09041934: /* anon_inodefs */
        return true;
    }
    return false;
}

/* Whether the object `st` describes (open as fd, or else named by path)
 * is one kcache cannot key: a device node, FIFO or socket, or a file or
 * directory of a pseudo filesystem. The filesystem of each device is asked
 * once per compile (d->fs). A filesystem that cannot be asked is taken for
 * a real one: its files are then checked by content like any other. */
static bool kernel_object(struct kc__deps *d, const struct stat *st, int fd, const char *path)
{
    if (!S_ISREG(st->st_mode) && !S_ISDIR(st->st_mode))
        return true;
    for (unsigned i = 0; i < d->fs_n; i++)
        if (d->fs[i].dev == st->st_dev)
            return d->fs[i].pseudo;
    struct statfs sf;
    if ((fd >= 0 ? fstatfs(fd, &sf) : statfs(path, &sf)) != 0)
        return false;
    bool pseudo = pseudo_fs_type((unsigned long)sf.f_type);
    if (d->fs_n < sizeof d->fs / sizeof d->fs[0])
        d->fs[d->fs_n++] = (struct kc__fs){st->st_dev, pseudo};
    return pseudo;
}

/* Neither a dependency nor a side effect, whatever is there. */
static bool skipped(const char *p)
{
    return runtime_own(p) || in_compute_cache(p);
}

/* The compile read `path`, a file kcache cannot key: it passes through. */
static void unkeyable(struct kc__deps *d, const char *path)
{
    if (!d->unkeyable)
        kc_log(KC_LOG_DEBUG, "nvrtc: the compile read %s, which kcache cannot key", path);
    d->unkeyable = true;
}

/* Records `path` (as the compile named it) with what the call found. The
 * strongest observation of a path wins: a file read beats a stat. */
struct kc__dep *kc__deps_push(struct kc__deps *d, const char *path, int kind)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        struct kc__dep *v = realloc(d->v, cap * sizeof *v);
        if (v == NULL)
            return NULL;
        d->v = v;
        d->cap = cap;
    }
    struct kc__dep *e = &d->v[d->n];
    memset(e, 0, sizeof *e);
    if ((e->path = strdup(path)) == NULL)
        return NULL;
    e->kind = kind;
    d->n++;
    return e;
}

static void record(const char *path, int kind, const struct stat *st)
{
    struct kc__deps *d = tracking;
    if (d == NULL || path == NULL || path[0] == '\0')
        return;
    tracking = NULL; /* our own calls below are not the compile's */
    /* Kept as the compile named it: a relative path is checked against the
     * working directory of each later lookup, which is what NVRTC would
     * read there. */
    if (skipped(path))
        goto out;
    char rel[PATH_MAX];
    const char *below = below_bundled(d->bundled, path);
    if (below != NULL) {
        /* NVRTC's own headers: named by their place in the directory. The
         * directory itself, its version marker (with the time of the
         * install) and its lock are what installing it made, the same on a
         * hit. */
        if (below[0] == '\0' || strcmp(below, ".nvrtc_headers_version") == 0 ||
            strcmp(below, ".nvrtc_install.lock") == 0)
            goto out;
        if ((size_t)snprintf(rel, sizeof rel, "%c%s", KC_DEP_BUNDLED, below) >= sizeof rel) {
            d->failed = true;
            goto out;
        }
        path = rel;
    } else if (path[0] == KC_DEP_BUNDLED) {
        d->failed = true; /* would read as one of them */
        goto out;
    }
    for (size_t i = 0; i < d->n; i++) {
        if (strcmp(d->v[i].path, path) != 0)
            continue;
        if (kind == KC_DEP_FILE && d->v[i].kind != KC_DEP_FILE) {
            d->v[i].kind = kind;
            d->v[i].st = *st;
        }
        goto out;
    }
    struct kc__dep *e = kc__deps_push(d, path, kind);
    if (e == NULL) {
        d->failed = true;
        goto out;
    }
    if (st != NULL)
        e->st = *st;
out:
    tracking = d;
}

static int kind_of(const struct stat *st)
{
    if (S_ISREG(st->st_mode))
        return KC_DEP_OTHER;
    if (S_ISDIR(st->st_mode))
        return KC_DEP_DIR;
    return KC_DEP_OTHER;
}

/* A stat (or access) of `path` that found st, or failed with err. A probe
 * of one of the kernel's objects is no input (the driver's device nodes,
 * /proc/self): not recorded. */
static void record_stat(const char *path, int rc, int err, const struct stat *st)
{
    struct kc__deps *d = tracking;
    if (rc == 0) {
        if (path == NULL || skipped(path))
            return;
        tracking = NULL;
        bool kernel = kernel_object(d, st, -1, path);
        tracking = d;
        if (!kernel)
            record(path, kind_of(st), st);
    } else if (err == ENOENT || err == ENOTDIR)
        record(path, KC_DEP_ABSENT, NULL);
}

static bool writing(int flags)
{
    return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC));
}

/* An open of `path` with flags that gave fd, or failed with err. What it
 * opened decides (kernel_object): a regular file or directory on a real
 * filesystem is a dependency by the path the compile named, wherever it
 * lives (/dev/shm, /proc/self/cwd/...), and opened for writing a side
 * effect; one of the kernel's objects read (not the runtime's own) makes
 * the compile unkeyable, written only (O_WRONLY) it changes no file. */
static void record_open(const char *path, int fd, int flags, int err)
{
    struct kc__deps *d = tracking;
    if (fd < 0) {
        if (err == ENOENT || err == ENOTDIR)
            record(path, KC_DEP_ABSENT, NULL);
        return;
    }
    if (path == NULL || skipped(path))
        return;
    tracking = NULL; /* our own calls below are not the compile's */
    struct stat st;
    bool stated = fstat(fd, &st) == 0;
    bool kernel = !stated || kernel_object(d, &st, fd, path);
    if (writing(flags)) {
        /* NVRTC installing its bundled headers (or locking them) is what
         * the hit does too (nvrtc.c): no side effect of the compile's own. */
        if (below_bundled(d->bundled, path) != NULL)
            goto out;
        if (!kernel || !stated) {
            wrote(d, path, flags);
            goto out;
        }
        if ((flags & O_ACCMODE) == O_WRONLY)
            goto out;
    }
    if (kernel) {
        /* A directory's entries and an O_PATH handle are not read as
         * content (nor are a real directory's). */
        if (!stated || (!S_ISDIR(st.st_mode) && !(flags & O_PATH)))
            unkeyable(d, path);
        goto out;
    }
    tracking = d;
    record(path, S_ISREG(st.st_mode) ? KC_DEP_FILE : kind_of(&st), &st);
    return;
out:
    tracking = d;
}

/* An open of `path` relative to the directory handle dirfd (not the
 * working directory's): NVRTC makes none (strace of 13.0, 12.9 and 13.5),
 * and a later lookup has no such handle to check a path against. The
 * runtime's own files and the kernel's objects are what they are (named
 * by the handle's path, /proc/self/fd/<dirfd>, joined with `path`); any
 * other file, found or probed, makes the compile unkeyable, or written, a
 * side effect. */
static void record_openat(int dirfd, const char *path, int fd, int flags, int err)
{
    struct kc__deps *d = tracking;
    tracking = NULL;
    char full[PATH_MAX], link[32];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = readlink(link, full, sizeof full);
    bool named =
        n > 0 && n < (ssize_t)sizeof full && full[0] == '/' &&
        (size_t)snprintf(full + n, sizeof full - (size_t)n, "/%s", path) < sizeof full - (size_t)n;
    struct stat st;
    struct statfs sf;
    bool kernel = named && runtime_own(full);
    if (!kernel && fd >= 0)
        kernel = fstat(fd, &st) == 0 && kernel_object(d, &st, fd, NULL);
    else if (!kernel)
        kernel = fstatfs(dirfd, &sf) == 0 && pseudo_fs_type((unsigned long)sf.f_type);
    tracking = d;
    if (kernel) {
        if (fd >= 0)
            record_open(named ? full : path, fd, flags, err);
        return;
    }
    if (fd >= 0 && writing(flags)) {
        if (!named || below_bundled(d->bundled, full) == NULL)
            wrote(d, named ? full : path, flags);
    } else if (fd >= 0 || err == ENOENT || err == ENOTDIR)
        unkeyable(d, path);
}

/* An openat's path (dirfd, path) that gave fd, errno kept. */
static void track_openat(int dirfd, const char *path, int fd, int flags)
{
    int e = errno;
    /* (EFAULT: no path to look at.) */
    if (dirfd == AT_FDCWD || (fd < 0 && e == EFAULT) || path[0] == '/')
        record_open(path, fd, flags, e);
    else
        record_openat(dirfd, path, fd, flags, e);
    errno = e;
}

/* ---- the real libc functions ------------------------------------------ */

static void *real(const char *name, const char *version)
{
    void *p = version ? dlvsym(RTLD_NEXT, name, version) : NULL;
    return p ? p : kc__real_dlsym(RTLD_NEXT, name);
}

#define REAL(var, name, version)                                                                   \
    do {                                                                                           \
        if (var == NULL)                                                                           \
            var = (__typeof__(var))real(name, version);                                            \
    } while (0)

KC__HOT static int (*real_open)(const char *, int, ...);
KC__HOT static int (*real_open64)(const char *, int, ...);
KC__HOT static int (*real_openat)(int, const char *, int, ...);
KC__HOT static int (*real_openat64)(int, const char *, int, ...);
KC__HOT static FILE *(*real_fopen)(const char *, const char *);
KC__HOT static FILE *(*real_fopen64)(const char *, const char *);
KC__HOT static int (*real_xstat)(int, const char *, struct stat *);
KC__HOT static int (*real_xstat64)(int, const char *, struct stat64 *);
KC__HOT static int (*real_stat)(const char *, struct stat *);
KC__HOT static int (*real_access)(const char *, int);

/* stat() as libc has it. glibc < 2.33 exports no stat (its callers reach
 * __xstat through an inline wrapper): there, the same call through
 * __xstat, version 1 (_STAT_VER on x86_64). */
static int libc_stat(const char *path, struct stat *st)
{
    REAL(real_stat, "stat", NULL);
    if (real_stat != NULL)
        return real_stat(path, st);
    REAL(real_xstat, "__xstat", "GLIBC_2.2.5");
    return real_xstat(1, path, st);
}

static int mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

KC_EXPORT int open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = mode_arg(flags, ap);
    va_end(ap);
    REAL(real_open, "open", NULL);
    int fd = real_open(path, flags, mode);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        WATCH(record_open(path, fd, flags, e));
        errno = e;
    }
    return fd;
}

KC_EXPORT int open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = mode_arg(flags, ap);
    va_end(ap);
    REAL(real_open64, "open64", NULL);
    int fd = real_open64(path, flags, mode);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        WATCH(record_open(path, fd, flags, e));
        errno = e;
    }
    return fd;
}

KC_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = mode_arg(flags, ap);
    va_end(ap);
    REAL(real_openat, "openat", NULL);
    int fd = real_openat(dirfd, path, flags, mode);
    WATCH(track_openat(dirfd, path, fd, flags));
    return fd;
}

/* (What a program built with 64-bit file offsets calls for openat.) */
KC_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = mode_arg(flags, ap);
    va_end(ap);
    REAL(real_openat64, "openat64", NULL);
    int fd = real_openat64(dirfd, path, flags, mode);
    WATCH(track_openat(dirfd, path, fd, flags));
    return fd;
}

static int fopen_flags(const char *mode)
{
    if (mode == NULL)
        return O_RDONLY;
    if (mode[0] == 'r' && strchr(mode, '+') == NULL)
        return O_RDONLY;
    return O_RDWR | O_CREAT;
}

static FILE *track_fopen(FILE *f, const char *path, const char *mode)
{
    int e = errno;
    record_open(path, f ? fileno(f) : -1, fopen_flags(mode), e);
    errno = e;
    return f;
}

KC_EXPORT FILE *fopen(const char *path, const char *mode)
{
    REAL(real_fopen, "fopen", NULL);
    FILE *f = real_fopen(path, mode);
    WATCH(track_fopen(f, path, mode));
    return f;
}

KC_EXPORT FILE *fopen64(const char *path, const char *mode)
{
    REAL(real_fopen64, "fopen64", NULL);
    FILE *f = real_fopen64(path, mode);
    WATCH(track_fopen(f, path, mode));
    return f;
}

KC_EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
    REAL(real_xstat, "__xstat", "GLIBC_2.2.5");
    int rc = real_xstat(ver, path, st);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        WATCH(record_stat(path, rc, e, st));
        errno = e;
    }
    return rc;
}

/* struct stat64 as glibc < 2.33 declares it (the same layout on x86_64). */
KC_EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
    REAL(real_xstat64, "__xstat64", "GLIBC_2.2.5");
    int rc = real_xstat64(ver, path, st);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        WATCH(record_stat(path, rc, e, (struct stat *)st));
        errno = e;
    }
    return rc;
}

KC_EXPORT int stat(const char *path, struct stat *st)
{
    int rc = libc_stat(path, st);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        WATCH(record_stat(path, rc, e, st));
        errno = e;
    }
    return rc;
}

KC_EXPORT int access(const char *path, int mode)
{
    REAL(real_access, "access", NULL);
    int rc = real_access(path, mode);
    if (__builtin_expect(tracking != NULL || process_deps != NULL, 0)) {
        int e = errno;
        struct stat st;
        if (rc == 0 && libc_stat(path, &st) == 0)
            WATCH(record_stat(path, 0, 0, &st));
        else if (rc != 0)
            WATCH(record_stat(path, rc, e, NULL));
        errno = e;
    }
    return rc;
}

/* ---- content digests through a memo -------------------------------------- */

struct memo_entry {
    char *path;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
    kc_digest digest;
    struct memo_entry *next;
};

#define MEMO_BUCKETS 4096
static struct memo_entry *memo[MEMO_BUCKETS];
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;

static bool same_stat(const struct memo_entry *m, const struct stat *st)
{
    return m->dev == st->st_dev && m->ino == st->st_ino && m->size == st->st_size &&
           m->mtime.tv_sec == st->st_mtim.tv_sec && m->mtime.tv_nsec == st->st_mtim.tv_nsec &&
           m->ctime.tv_sec == st->st_ctim.tv_sec && m->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

/* The digest of the file at `path`, which must still be the one `want`
 * describes (device, inode, size, mtime and ctime) when it is opened and
 * after it is read: a file replaced or rewritten in between is -ESTALE, so
 * no digest is ever given (or memoized) for a stat it does not belong to. */
static int hash_file(const char *path, const struct stat *want, kc_digest *out)
{
    REAL(real_open, "open", NULL);
    int fd = real_open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        goto done;
    }
    if (want != NULL &&
        (st.st_ino != want->st_ino || st.st_dev != want->st_dev || st.st_size != want->st_size ||
         st.st_mtim.tv_sec != want->st_mtim.tv_sec || st.st_mtim.tv_nsec != want->st_mtim.tv_nsec ||
         st.st_ctim.tv_sec != want->st_ctim.tv_sec ||
         st.st_ctim.tv_nsec != want->st_ctim.tv_nsec)) {
        rc = -ESTALE;
        goto done;
    }
    rc = kc__digest_fd(fd, &st, out);
done:
    close(fd);
    return rc;
}

int kc__file_digest(const char *path, const struct stat *st, kc_digest *out)
{
    uint64_t h = XXH3_64bits(path, strlen(path)) % MEMO_BUCKETS;
    pthread_mutex_lock(&memo_lock);
    struct memo_entry *m = memo[h];
    while (m != NULL && strcmp(m->path, path) != 0)
        m = m->next;
    if (m != NULL && same_stat(m, st)) {
        *out = m->digest;
        pthread_mutex_unlock(&memo_lock);
        return 0;
    }
    pthread_mutex_unlock(&memo_lock);

    kc_digest d;
    int rc = hash_file(path, st, &d);
    if (rc != 0)
        return rc;
    /* A file modified within the clock's granularity of being hashed could
     * change again without changing its times; do not memoize it. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    bool settled = now.tv_sec > st->st_mtim.tv_sec + 1 && now.tv_sec > st->st_ctim.tv_sec + 1;

    pthread_mutex_lock(&memo_lock);
    m = memo[h];
    while (m != NULL && strcmp(m->path, path) != 0)
        m = m->next;
    if (m == NULL && settled) {
        m = calloc(1, sizeof *m);
        if (m != NULL && (m->path = strdup(path)) != NULL) {
            m->next = memo[h];
            memo[h] = m;
        } else {
            free(m);
            m = NULL;
        }
    }
    if (m != NULL) {
        if (settled) {
            m->dev = st->st_dev;
            m->ino = st->st_ino;
            m->size = st->st_size;
            m->mtime = st->st_mtim;
            m->ctime = st->st_ctim;
        } else {
            m->size = -1; /* never matches */
        }
        m->digest = d;
    }
    pthread_mutex_unlock(&memo_lock);
    *out = d;
    return 0;
}

static void fingerprint(const struct stat *st, uint64_t fp[5])
{
    fp[0] = (uint64_t)st->st_dev;
    fp[1] = (uint64_t)st->st_ino;
    fp[2] = (uint64_t)st->st_size;
    fp[3] = (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec;
    fp[4] = (uint64_t)st->st_ctim.tv_sec * 1000000000ull + (uint64_t)st->st_ctim.tv_nsec;
}

void kc__dep_fingerprint(const struct stat *st, uint64_t fp[5])
{
    struct timespec clock;
    clock_gettime(CLOCK_REALTIME, &clock);
    if (clock.tv_sec > st->st_ctim.tv_sec + 1 && clock.tv_sec > st->st_mtim.tv_sec + 1)
        fingerprint(st, fp);
    else
        memset(fp, 0, 5 * sizeof *fp);
}

int kc__cwd(char *buf, size_t len)
{
    const char *pwd = getenv("PWD");
    struct stat a, b;
    if (pwd != NULL && pwd[0] == '/' && strlen(pwd) < len && libc_stat(pwd, &a) == 0 &&
        libc_stat(".", &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
        memcpy(buf, pwd, strlen(pwd) + 1);
        return 0;
    }
    return getcwd(buf, len) != NULL ? 0 : -errno;
}

int kc__deps_note_cwd(struct kc__deps *d, bool ambiguous)
{
    char cwd[PATH_MAX];
    if (kc__cwd(cwd, sizeof cwd) != 0)
        return 0; /* no directory to name: paths under it cannot be told */
    size_t n = strlen(cwd), under = 0;
    for (size_t i = 0; i < d->n; i++) {
        char *p = d->v[i].path;
        /* Strictly under it: the directory itself is stat'ed by every
         * compile (LLVM checks that $PWD names "."). */
        size_t skip = n == 1 ? 1 : n + 1;
        if (d->v[i].kind == KC_DEP_CWD || strncmp(p, cwd, n) != 0 || (n > 1 && p[n] != '/') ||
            p[skip] == 0)
            continue;
        under++;
        if (!ambiguous)
            memmove(p, p + skip, strlen(p + skip) + 1);
    }
    if (under == 0 || !ambiguous)
        return 0;
    if (kc__deps_push(d, cwd, KC_DEP_CWD) == NULL)
        return -ENOMEM;
    return 0;
}

int kc__deps_finish(struct kc__deps *d)
{
    if (d->failed)
        return -ENOMEM;
    for (size_t i = 0; i < d->n; i++) {
        struct kc__dep *e = &d->v[i];
        if (e->kind != KC_DEP_FILE)
            continue;
        char buf[PATH_MAX];
        const char *path = dep_path(e->path, d->bundled, buf, sizeof buf);
        struct stat now;
        if (path == NULL || libc_stat(path, &now) != 0)
            return -ESTALE;
        /* The file must be the one the compile read. */
        if (now.st_ino != e->st.st_ino || now.st_dev != e->st.st_dev ||
            now.st_size != e->st.st_size || now.st_mtim.tv_sec != e->st.st_mtim.tv_sec ||
            now.st_mtim.tv_nsec != e->st.st_mtim.tv_nsec)
            return -ESTALE;
        int rc = kc__file_digest(path, &now, &e->digest);
        if (rc != 0)
            return rc;
        kc__dep_fingerprint(&now, e->fp);
    }
    return 0;
}

/* ---- checking dependencies ---------------------------------------------- */

void kc__dirs_close(struct kc__dirs *ds)
{
    for (size_t i = 0; i < KC__DIRS_SLOTS; i++)
        if (ds->slot[i].len != 0 && ds->slot[i].fd >= 0)
            close(ds->slot[i].fd);
    memset(ds, 0, sizeof *ds);
}

/* A slot's fd before its directory is opened: it was asked for once. */
#define DIR_SEEN (INT_MIN + 1)

/* The handle of the directory `path[0, len)`: an fd, -ENOENT or -ENOTDIR
 * when the directory is not there (every name in it is then absent, as
 * stat would say), or INT_MIN when it is not kept (full, out of fds, or
 * asked for the first time: a directory one name is checked in costs an
 * open, a getrlimit and a close more than the stat it would save, as the
 * working directory and the probes of a header-free kernel's manifest
 * are). */
static int dir_handle(struct kc__dirs *ds, const char *path, size_t len)
{
    uint64_t h = XXH3_64bits(path, len);
    size_t i = h % KC__DIRS_SLOTS;
    for (size_t probe = 0; probe < KC__DIRS_SLOTS; probe++, i = (i + 1) % KC__DIRS_SLOTS) {
        struct kc__dir_slot *e = &ds->slot[i];
        bool match = e->len == len && e->hash == h && memcmp(e->dir, path, len) == 0;
        if (match && e->fd != DIR_SEEN)
            return e->fd;
        if (e->len != 0 && !match)
            continue;
        if (!match) {
            e->dir = path;
            e->len = len;
            e->hash = h;
            e->fd = DIR_SEEN;
            return INT_MIN;
        }
        if (ds->open >= KC__DIRS_OPEN || len >= PATH_MAX)
            return INT_MIN;
        char dir[PATH_MAX];
        memcpy(dir, path, len);
        dir[len] = 0;
        REAL(real_open, "open", NULL);
        int fd = real_open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 && errno != ENOENT && errno != ENOTDIR)
            return INT_MIN; /* EMFILE, EACCES, ...: stat the full path */
        if (fd >= 0) {
            /* Never hold fds a host thread near its limit may need. */
            if (ds->fd_limit == 0) {
                struct rlimit rl;
                ds->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < INT_MAX
                                   ? (int)rl.rlim_cur
                                   : INT_MAX;
            }
            if (fd >= ds->fd_limit - 4 * KC__DIRS_OPEN) {
                close(fd);
                ds->open = KC__DIRS_OPEN;
                return INT_MIN;
            }
            ds->open++;
        }
        e->dir = path;
        e->len = len;
        e->hash = h;
        e->fd = fd >= 0 ? fd : -errno;
        return e->fd;
    }
    return INT_MIN;
}

/* stat(path), through the handle of its directory when one is kept:
 * fstatat walks one name where stat walks them all (633 CUB headers in 54
 * directories: ~40% less time here). Same answer, errno included: a
 * missing or non-directory parent fails the open as it fails the walk. */
static int dep_stat(struct kc__dirs *ds, const char *path, struct stat *st)
{
    const char *slash = ds != NULL ? strrchr(path, '/') : NULL;
    if (slash != NULL && slash != path && slash[1] != 0) {
        int fd = dir_handle(ds, path, (size_t)(slash - path));
        if (fd >= 0)
            return fstatat(fd, slash + 1, st, 0);
        if (fd != INT_MIN) {
            errno = -fd;
            return -1;
        }
    }
    return libc_stat(path, st);
}

bool kc__dep_holds(const struct kc__dep *dep, struct kc__dirs *dirs)
{
    char buf[PATH_MAX];
    const char *path = dep_path(dep->path, dirs != NULL ? dirs->bundled : NULL, buf, sizeof buf);
    if (path == NULL)
        return false;
    if (path != dep->path && dep->kind == KC_DEP_FILE) {
        dirs->bundled_checked++;
        /* Below a DIR the shim's own install filled from empty: NVRTC's
         * bytes, whose digests the map holds. */
        kc_digest d;
        if (dirs->pristine != NULL && kc__pristine_find(dirs->pristine, dep->path + 1, &d) &&
            (dirs->proof == NULL ||
             kc__pristine_unchanged(dirs->proof, dep->path + 1, path, dirs->parent_ok))) {
            dirs->bundled_mapped++;
            return d.lo == dep->digest.lo && d.hi == dep->digest.hi;
        }
    }
    struct stat st;
    /* A resolved path is not kept by the directory handles (they point
     * into the manifest's paths). */
    if (dep_stat(path == dep->path ? dirs : NULL, path, &st) != 0)
        return dep->kind == KC_DEP_ABSENT && (errno == ENOENT || errno == ENOTDIR);
    switch (dep->kind) {
    case KC_DEP_ABSENT:
        return false;
    case KC_DEP_DIR:
        return S_ISDIR(st.st_mode);
    case KC_DEP_OTHER:
        return !S_ISDIR(st.st_mode);
    case KC_DEP_CWD: {
        char cwd[PATH_MAX];
        return kc__cwd(cwd, sizeof cwd) == 0 && strcmp(cwd, dep->path) == 0;
    }
    case KC_DEP_FILE: {
        if (!S_ISREG(st.st_mode))
            return false;
        uint64_t fp[5];
        fingerprint(&st, fp);
        if (dep->fp[4] != 0 && memcmp(fp, dep->fp, sizeof fp) == 0)
            return true;
        if (path != dep->path)
            dirs->bundled_read++;
        kc_digest d;
        return kc__file_digest(path, &st, &d) == 0 && d.lo == dep->digest.lo &&
               d.hi == dep->digest.hi;
    }
    }
    return false;
}
