/*
 * libfsfault.so: a test-only LD_PRELOAD fault injector for the file system
 * calls a process makes under one directory (the cache directory). It is a
 * test double for a read-only mount, a full disk, a failing disk and a
 * process killed at an exact point, for machines where the tests cannot
 * mount anything (a container without CAP_SYS_ADMIN; chmod does not stop
 * root).
 *
 * Environment:
 *   FSFAULT_DIR      the directory; calls on paths under it (or on file
 *                    descriptors opened under it) are the ones affected
 *   FSFAULT_MODE     erofs   every call that would modify something fails
 *                            with EROFS (mkdir of an existing directory:
 *                            EEXIST, as the kernel answers)
 *                    enospc  files and directories can be opened, renamed and
 *                            removed, but every write, extension, fallocate
 *                            and mkdir fails with ENOSPC (a full disk)
 *                    eio     reads of files under it fail with EIO
 *                    kill    the process SIGKILLs itself at the
 *                            FSFAULT_KILL_AT'th (1-based) modifying call,
 *                            before it, or after it with FSFAULT_KILL_AFTER=1
 *                    count   nothing fails; only FSFAULT_LOG is written
 *   FSFAULT_LOG      a file each counted call is appended to (pid, number,
 *                    call, path or fd), so a test can size FSFAULT_KILL_AT
 *
 * "Modifying calls": open with O_CREAT, O_TRUNC or write access; write,
 * pwrite, writev, pwritev, fsync, fdatasync, ftruncate, fallocate, rename,
 * renameat, renameat2, link, linkat, symlink, unlink, unlinkat, mkdir,
 * mkdirat, rmdir; fopen for writing. Memory-mapped writes cannot be seen.
 */
/* The plain and the 64-bit names are separate symbols: define each. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_FD 65536

enum { M_NONE, M_EROFS, M_ENOSPC, M_EIO, M_KILL, M_COUNT };

static int mode = -1;
static char dir[4096];
static size_t dir_len;
static long kill_at;
static int kill_after;
static long n_ops;
static int log_fd = -1;
static unsigned char under_fd[MAX_FD];

#define REAL(name) static __typeof__(&name) real_##name
#define LOAD(name)                                                                                 \
    do {                                                                                           \
        if (real_##name == NULL)                                                                   \
            real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name);                              \
    } while (0)

REAL(open);
REAL(open64);
REAL(openat);
REAL(openat64);
REAL(close);
REAL(write);
REAL(pwrite);
REAL(pwrite64);
REAL(writev);
REAL(pwritev);
REAL(read);
REAL(pread);
REAL(pread64);
REAL(fsync);
REAL(fdatasync);
REAL(ftruncate);
REAL(ftruncate64);
REAL(fallocate);
REAL(fallocate64);
REAL(rename);
REAL(renameat);
REAL(renameat2);
REAL(link);
REAL(linkat);
REAL(symlink);
REAL(unlink);
REAL(unlinkat);
REAL(mkdir);
REAL(mkdirat);
REAL(rmdir);
REAL(fopen);
REAL(fopen64);

static void init(void)
{
    if (__atomic_load_n(&mode, __ATOMIC_ACQUIRE) >= 0)
        return;
    int m = M_NONE;
    const char *d = getenv("FSFAULT_DIR");
    const char *s = getenv("FSFAULT_MODE");
    if (d != NULL && d[0] == '/' && s != NULL) {
        snprintf(dir, sizeof dir, "%s", d);
        dir_len = strlen(dir);
        while (dir_len > 1 && dir[dir_len - 1] == '/')
            dir[--dir_len] = 0;
        if (!strcmp(s, "erofs"))
            m = M_EROFS;
        else if (!strcmp(s, "enospc"))
            m = M_ENOSPC;
        else if (!strcmp(s, "eio"))
            m = M_EIO;
        else if (!strcmp(s, "kill"))
            m = M_KILL;
        else if (!strcmp(s, "count"))
            m = M_COUNT;
        const char *k = getenv("FSFAULT_KILL_AT");
        kill_at = k ? atol(k) : 0;
        const char *a = getenv("FSFAULT_KILL_AFTER");
        kill_after = a && !strcmp(a, "1");
        const char *lg = getenv("FSFAULT_LOG");
        if (lg != NULL && lg[0]) {
            LOAD(open);
            log_fd = real_open(lg, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        }
    }
    __atomic_store_n(&mode, m, __ATOMIC_RELEASE);
}

static bool path_under(int dirfd, const char *path)
{
    init();
    if (mode == M_NONE || path == NULL)
        return false;
    if (path[0] != '/') {
        if (dirfd != AT_FDCWD)
            return dirfd >= 0 && dirfd < MAX_FD && under_fd[dirfd];
        char cwd[4096];
        if (getcwd(cwd, sizeof cwd) == NULL)
            return false;
        size_t n = strlen(cwd);
        return strncmp(cwd, dir, dir_len) == 0 && (n == dir_len || cwd[dir_len] == '/');
    }
    return strncmp(path, dir, dir_len) == 0 && (path[dir_len] == 0 || path[dir_len] == '/');
}

static bool fd_under(int fd)
{
    init();
    return mode != M_NONE && fd >= 0 && fd < MAX_FD && under_fd[fd];
}

static void note_fd(int fd, bool under)
{
    if (fd >= 0 && fd < MAX_FD)
        under_fd[fd] = under;
}

/* A modifying call under the directory: logs and counts it; in kill mode,
 * dies before it when its number comes. Returns the errno to fail it with,
 * or 0 to perform it. `mkdir_path` is set for mkdir calls (EEXIST rule). */
static int modifying(const char *call, int dirfd, const char *path, int fd, int enospc)
{
    long n = __atomic_add_fetch(&n_ops, 1, __ATOMIC_SEQ_CST);
    if (log_fd >= 0) {
        char line[4400];
        int len =
            path ? snprintf(line, sizeof line, "%d %ld %s %s\n", (int)getpid(), n, call, path)
                 : snprintf(line, sizeof line, "%d %ld %s fd=%d\n", (int)getpid(), n, call, fd);
        LOAD(write);
        if (len > 0)
            real_write(log_fd, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
    }
    switch (mode) {
    case M_EROFS:
        return EROFS;
    case M_ENOSPC:
        return enospc ? ENOSPC : 0;
    case M_KILL:
        if (n == kill_at && !kill_after)
            raise(SIGKILL);
        return 0;
    default:
        return 0;
    }
}

/* After a performed call: kill mode's "after" point. */
static void performed(void)
{
    if (mode == M_KILL && kill_after && __atomic_load_n(&n_ops, __ATOMIC_SEQ_CST) == kill_at)
        raise(SIGKILL);
}

static bool open_modifies(int flags)
{
    return (flags & (O_CREAT | O_TRUNC)) || (flags & O_ACCMODE) != O_RDONLY;
}

static int do_open(const char *call, int dirfd, const char *path, int flags, mode_t m,
                   int (*fn_path)(const char *, int, ...),
                   int (*fn_at)(int, const char *, int, ...))
{
    bool under = path_under(dirfd, path);
    if (under && open_modifies(flags)) {
        int e = modifying(call, dirfd, path, -1, 0);
        if (e == EROFS) {
            /* An existing file opened read-only with O_CREAT is fine on a
             * read-only mount; anything else fails. */
            struct stat sb;
            bool exists = fstatat(dirfd, path, &sb, 0) == 0;
            if (!(exists && (flags & O_ACCMODE) == O_RDONLY && !(flags & O_TRUNC)) ||
                (exists && (flags & O_EXCL))) {
                errno = exists && (flags & O_EXCL) && (flags & O_CREAT) ? EEXIST : EROFS;
                return -1;
            }
        } else if (e != 0) {
            errno = e;
            return -1;
        }
    }
    int fd = fn_at ? fn_at(dirfd, path, flags, m) : fn_path(path, flags, m);
    if (fd >= 0) {
        note_fd(fd, under);
        if (under && open_modifies(flags))
            performed();
    }
    return fd;
}

EXPORT int open(const char *path, int flags, ...)
{
    mode_t m = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        m = va_arg(ap, mode_t);
        va_end(ap);
    }
    LOAD(open);
    return do_open("open", AT_FDCWD, path, flags, m, real_open, NULL);
}

EXPORT int open64(const char *path, int flags, ...)
{
    mode_t m = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        m = va_arg(ap, mode_t);
        va_end(ap);
    }
    LOAD(open64);
    return do_open("open", AT_FDCWD, path, flags, m, real_open64, NULL);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
    mode_t m = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        m = va_arg(ap, mode_t);
        va_end(ap);
    }
    LOAD(openat);
    return do_open("openat", dirfd, path, flags, m, NULL, real_openat);
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
    mode_t m = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        m = va_arg(ap, mode_t);
        va_end(ap);
    }
    LOAD(openat64);
    return do_open("openat", dirfd, path, flags, m, NULL, real_openat64);
}

EXPORT int creat(const char *path, mode_t m)
{
    return open(path, O_CREAT | O_WRONLY | O_TRUNC, m);
}

EXPORT int close(int fd)
{
    LOAD(close);
    if (fd >= 0 && fd < MAX_FD)
        under_fd[fd] = 0;
    return real_close(fd);
}

EXPORT FILE *fopen(const char *path, const char *fm)
{
    LOAD(fopen);
    if (fm != NULL && strpbrk(fm, "wa+") && path_under(AT_FDCWD, path)) {
        int e = modifying("fopen", AT_FDCWD, path, -1, 0);
        if (e != 0) {
            errno = e;
            return NULL;
        }
    }
    return real_fopen(path, fm);
}

EXPORT FILE *fopen64(const char *path, const char *fm)
{
    LOAD(fopen64);
    if (fm != NULL && strpbrk(fm, "wa+") && path_under(AT_FDCWD, path)) {
        int e = modifying("fopen", AT_FDCWD, path, -1, 0);
        if (e != 0) {
            errno = e;
            return NULL;
        }
    }
    return real_fopen64(path, fm);
}

/* fd calls that write. */
#define FD_WRITE(call, rtype, decl, args, enospc)                                                  \
    EXPORT rtype call decl                                                                         \
    {                                                                                              \
        LOAD(call);                                                                                \
        if (fd_under(fd)) {                                                                        \
            int e = modifying(#call, AT_FDCWD, NULL, fd, enospc);                                  \
            if (e != 0) {                                                                          \
                errno = e;                                                                         \
                return -1;                                                                         \
            }                                                                                      \
            rtype r = real_##call args;                                                            \
            performed();                                                                           \
            return r;                                                                              \
        }                                                                                          \
        return real_##call args;                                                                   \
    }

FD_WRITE(write, ssize_t, (int fd, const void *b, size_t n), (fd, b, n), n > 0)
FD_WRITE(pwrite, ssize_t, (int fd, const void *b, size_t n, off_t o), (fd, b, n, o), n > 0)
FD_WRITE(pwrite64, ssize_t, (int fd, const void *b, size_t n, off64_t o), (fd, b, n, o), n > 0)
FD_WRITE(writev, ssize_t, (int fd, const struct iovec *v, int c), (fd, v, c), c > 0)
FD_WRITE(pwritev, ssize_t, (int fd, const struct iovec *v, int c, off_t o), (fd, v, c, o), c > 0)
FD_WRITE(fsync, int, (int fd), (fd), 0)
FD_WRITE(fdatasync, int, (int fd), (fd), 0)
FD_WRITE(ftruncate, int, (int fd, off_t l), (fd, l), l > 0)
FD_WRITE(ftruncate64, int, (int fd, off64_t l), (fd, l), l > 0)
FD_WRITE(fallocate, int, (int fd, int m, off_t o, off_t l), (fd, m, o, l), 1)
FD_WRITE(fallocate64, int, (int fd, int m, off64_t o, off64_t l), (fd, m, o, l), 1)

/* fd calls that read: fail with EIO in eio mode. */
#define FD_READ(call, decl, args)                                                                  \
    EXPORT ssize_t call decl                                                                       \
    {                                                                                              \
        LOAD(call);                                                                                \
        if (mode == M_EIO && fd_under(fd)) {                                                       \
            errno = EIO;                                                                           \
            return -1;                                                                             \
        }                                                                                          \
        return real_##call args;                                                                   \
    }

FD_READ(read, (int fd, void *b, size_t n), (fd, b, n))
FD_READ(pread, (int fd, void *b, size_t n, off_t o), (fd, b, n, o))
FD_READ(pread64, (int fd, void *b, size_t n, off64_t o), (fd, b, n, o))

/* Path calls. */
#define PATH_CALL(call, decl, args, d1, p1, d2, p2, enospc)                                        \
    EXPORT int call decl                                                                           \
    {                                                                                              \
        LOAD(call);                                                                                \
        if (path_under(d1, p1) || path_under(d2, p2)) {                                            \
            int e = modifying(#call, d1, path_under(d1, p1) ? p1 : p2, -1, enospc);                \
            if (e != 0) {                                                                          \
                errno = e;                                                                         \
                return -1;                                                                         \
            }                                                                                      \
            int r = real_##call args;                                                              \
            performed();                                                                           \
            return r;                                                                              \
        }                                                                                          \
        return real_##call args;                                                                   \
    }

PATH_CALL(rename, (const char *a, const char *b), (a, b), AT_FDCWD, a, AT_FDCWD, b, 0)
PATH_CALL(renameat, (int da, const char *a, int db, const char *b), (da, a, db, b), da, a, db, b, 0)
PATH_CALL(renameat2, (int da, const char *a, int db, const char *b, unsigned f), (da, a, db, b, f),
          da, a, db, b, 0)
PATH_CALL(link, (const char *a, const char *b), (a, b), AT_FDCWD, a, AT_FDCWD, b, 1)
PATH_CALL(linkat, (int da, const char *a, int db, const char *b, int f), (da, a, db, b, f), da, a,
          db, b, 1)
PATH_CALL(symlink, (const char *a, const char *b), (a, b), AT_FDCWD, b, AT_FDCWD, b, 1)
PATH_CALL(unlink, (const char *a), (a), AT_FDCWD, a, AT_FDCWD, a, 0)
PATH_CALL(unlinkat, (int d, const char *a, int f), (d, a, f), d, a, d, a, 0)
PATH_CALL(rmdir, (const char *a), (a), AT_FDCWD, a, AT_FDCWD, a, 0)

static int mkdir_common(const char *call, int d, const char *p, mode_t m)
{
    if (path_under(d, p)) {
        int e = modifying(call, d, p, -1, 1);
        if (e != 0) {
            struct stat sb;
            errno = fstatat(d, p, &sb, AT_SYMLINK_NOFOLLOW) == 0 ? EEXIST : e;
            return -1;
        }
        int r = d == AT_FDCWD ? real_mkdir(p, m) : real_mkdirat(d, p, m);
        performed();
        return r;
    }
    return d == AT_FDCWD ? real_mkdir(p, m) : real_mkdirat(d, p, m);
}

EXPORT int mkdir(const char *p, mode_t m)
{
    LOAD(mkdir);
    LOAD(mkdirat);
    return mkdir_common("mkdir", AT_FDCWD, p, m);
}

EXPORT int mkdirat(int d, const char *p, mode_t m)
{
    LOAD(mkdir);
    LOAD(mkdirat);
    return mkdir_common("mkdirat", d, p, m);
}
