/*
 * fs.c: the few file-system operations the store trusts: private
 * directories, atomic spool writes that never follow a planted symlink,
 * bounded reads.
 */
#include "local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t kc__rand64(void)
{
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != sizeof v)
        v = kc_mono_ns() ^ ((uint64_t)getpid() << 32);
    return v;
}

void kc__hex(const void *p, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

int kc__mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp)
        return -ENAMETOOLONG;
    memcpy(tmp, path, n + 1);
    for (char *s = tmp + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(tmp, mode) != 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* Whether only we or root can change what the directory holds: owned by
 * one of them, and writable by no one else unless sticky (as /tmp: others
 * may add names there, never rename or remove ours). */
static bool trusted_dir(const struct stat *sb)
{
    if (sb->st_uid != 0 && sb->st_uid != geteuid())
        return false;
    return (sb->st_mode & 022) == 0 || (sb->st_mode & S_ISVTX) != 0;
}

/* Resolves `path` a name at a time, as the kernel would, and checks every
 * step: each directory passed through is trusted_dir, each symlink followed
 * is owned by us or root. So no other user can redirect the path, now or
 * later (only we and root can change any step). With `create`, missing
 * directories are made 0700, each inside a trusted directory. The final
 * directory is left in real[]; *made says whether it was made here. 0,
 * -EPERM (a step another user controls), -ENOENT (missing, !create),
 * -ENOTDIR, -ELOOP, -ENAMETOOLONG or another negative errno. */
static int walk_path(const char *path, bool create, char real[PATH_MAX], bool *made)
{
    char rest[PATH_MAX], tmp[PATH_MAX];
    size_t rl = 0; /* real[0, rl): the resolved prefix, "" for "/" */
    int links = 0;
    *made = false;
    if (path[0] == '/') {
        if (snprintf(rest, sizeof rest, "%s", path) >= (int)sizeof rest)
            return -ENAMETOOLONG;
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            return -errno;
        if (snprintf(rest, sizeof rest, "%s/%s", cwd, path) >= (int)sizeof rest)
            return -ENAMETOOLONG;
    }
    struct stat sb;
    if (lstat("/", &sb) != 0)
        return -errno;
    if (!trusted_dir(&sb))
        return -EPERM;
    real[0] = 0;
    const char *r = rest;
    for (;;) {
        while (*r == '/')
            r++;
        if (*r == 0)
            break;
        size_t n = strcspn(r, "/");
        const char *comp = r;
        r += n;
        if (n == 1 && comp[0] == '.')
            continue;
        if (n == 2 && comp[0] == '.' && comp[1] == '.') {
            while (rl > 0 && real[rl - 1] != '/')
                rl--;
            if (rl > 0)
                rl--;
            real[rl] = 0;
            continue;
        }
        if (rl + 1 + n >= PATH_MAX)
            return -ENAMETOOLONG;
        real[rl] = '/';
        memcpy(real + rl + 1, comp, n);
        real[rl + 1 + n] = 0;
        bool fresh = false;
        if (lstat(real, &sb) != 0) {
            if (errno != ENOENT || !create)
                return -errno;
            /* The parent, real[0, rl), was checked: trusted. */
            if (mkdir(real, 0700) != 0 && errno != EEXIST)
                return -errno;
            if (lstat(real, &sb) != 0)
                return -errno;
            fresh = true;
        }
        if (S_ISLNK(sb.st_mode)) {
            if (++links > 40)
                return -ELOOP;
            if (sb.st_uid != 0 && sb.st_uid != geteuid())
                return -EPERM;
            ssize_t tl = readlink(real, tmp, sizeof tmp - 1);
            if (tl < 0)
                return -errno;
            tmp[tl] = 0;
            /* The rest of the path now starts with the link's target. */
            char joined[PATH_MAX];
            if (snprintf(joined, sizeof joined, "%s/%s", tmp, r) >= (int)sizeof joined)
                return -ENAMETOOLONG;
            memcpy(rest, joined, strlen(joined) + 1);
            r = rest;
            if (tmp[0] == '/')
                rl = 0;
            real[rl] = 0;
            continue;
        }
        if (!S_ISDIR(sb.st_mode))
            return -ENOTDIR;
        if (!trusted_dir(&sb))
            return -EPERM;
        rl += 1 + n;
        *made = fresh;
    }
    if (rl == 0)
        snprintf(real, PATH_MAX, "/");
    return 0;
}

/* Whether a name in the cache directory is one kcache makes there (see
 * base.h's layout, and bundled/, the shim's maps of NVRTC's bundled headers;
 * tools/, its memo of compiler tools' identities; why/, its miss records;
 * filter.t-<pid> and db.bad-<...> are a rebuild's and a recovery's temporary
 * names, .libraries.t-<...> the shim's for libraries). */
static bool store_name(const char *n)
{
    static const char *const names[] = {"db",      "spool",     "sec",        "hot",
                                        "locks",   "filter",    "owner.lock", "gen",
                                        "bundled", "libraries", "tools",      "why"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(n, names[i]) == 0)
            return true;
    return strncmp(n, "filter.t-", 9) == 0 || strncmp(n, "db.bad-", 7) == 0 ||
           strncmp(n, ".libraries.t-", 13) == 0;
}

/* Whether the existing directory real may be used as a store: it holds one
 * (spool/, which every writer makes first, or a database), or nothing but
 * names kcache makes (none, for a directory just made by the user). So
 * kcache never writes its files into a directory of other things. 0,
 * -ENOTEMPTY or the error of reading it. */
static int looks_like_store(const char *real)
{
    char p[PATH_MAX];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/spool", real) < (int)sizeof p && lstat(p, &sb) == 0)
        return 0;
    if (snprintf(p, sizeof p, "%s/db/CURRENT", real) < (int)sizeof p && lstat(p, &sb) == 0)
        return 0;
    DIR *d = opendir(real);
    if (d == NULL)
        return -errno;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && !store_name(e->d_name))
            rc = -ENOTEMPTY;
    closedir(d);
    return rc;
}

static int private_dir(const char *path, bool create, bool nofollow)
{
    struct stat sb;
    if (!nofollow) {
        char real[PATH_MAX];
        bool made;
        int rc = walk_path(path, create, real, &made);
        if (rc < 0)
            return rc;
        if (stat(real, &sb) != 0)
            return -errno;
        if (sb.st_uid != geteuid() || (sb.st_mode & 022) != 0)
            return -EPERM;
        return made ? 0 : looks_like_store(real);
    }
    if (lstat(path, &sb) != 0) {
        if (errno != ENOENT || !create)
            return -errno;
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return -errno;
        if (lstat(path, &sb) != 0)
            return -errno;
    }
    if (!S_ISDIR(sb.st_mode))
        return -ENOTDIR;
    if (sb.st_uid != geteuid() || (sb.st_mode & 022) != 0)
        return -EPERM;
    return 0;
}

int kc__private_dir(const char *path, bool create)
{
    return private_dir(path, create, false);
}

int kc__private_subdir(const char *path, bool create)
{
    return private_dir(path, create, true);
}

/* Writes (wr) or reads n bytes at b, retrying on EINTR; a read stops early
 * at end of file. 0 with *done (if not NULL) the bytes moved, or -errno. */
static int io_full(int fd, unsigned char *b, size_t n, bool wr, size_t *done)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = wr ? write(fd, b + off, n - off) : read(fd, b + off, n - off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0 && !wr)
            break;
        off += (size_t)r;
    }
    if (done != NULL)
        *done = off;
    return 0;
}

int kc__write_full(int fd, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int kc__spool_write(const char *dir, const char *name, const void *p, size_t len, bool durable)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    static unsigned seq;
    int rc = 0;
    snprintf(tmp, sizeof tmp, "%s/t-%d-%u-%016llx", dir, (int)getpid(),
             __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED), (unsigned long long)kc__rand64());
    if (snprintf(dst, sizeof dst, "%s/%s", dir, name) >= (int)sizeof dst)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    rc = io_full(fd, (void *)p, len, true, NULL);
    if (rc < 0)
        goto fail;
    if (durable && fsync(fd) != 0) {
        rc = -errno;
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = -errno;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, dst) != 0) {
        rc = -errno;
        goto fail;
    }
    if (durable) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return rc;
}

int kc__read_file(int dirfd, const char *path, size_t max, unsigned char **out, size_t *len)
{
    int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ELOOP ? -EPERM : -errno;
    struct stat sb;
    int rc = 0;
    unsigned char *buf = NULL;
    if (fstat(fd, &sb) != 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_uid != geteuid()) {
        rc = -EPERM;
        goto out;
    }
    if ((uint64_t)sb.st_size > max) {
        rc = -EFBIG;
        goto out;
    }
    size_t n = (size_t)sb.st_size;
    buf = malloc(n ? n : 1);
    if (buf == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    size_t off = 0;
    rc = io_full(fd, buf, n, false, &off);
    if (rc < 0)
        goto out;
    *out = buf;
    *len = off;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return rc;
}

void kc__each_child(const char *path, void (*fn)(const char *sub, void *arg), void *arg)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) < (int)sizeof sub)
            fn(sub, arg);
    }
    closedir(d);
}

static void rm_child(const char *sub, void *arg)
{
    kc__rm_rf(sub);
}

static void du_child(const char *sub, void *arg)
{
    uint64_t *t = arg, r = 0;
    t[0] += kc__du(sub, &r);
    t[1] += r;
}

int kc__rm_rf(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(sb.st_mode))
        return unlink(path) == 0 ? 0 : -errno;
    kc__each_child(path, rm_child, NULL);
    return rmdir(path) == 0 ? 0 : -errno;
}

uint64_t kc__du(const char *path, uint64_t *reserved)
{
    struct stat sb;
    *reserved = 0;
    if (lstat(path, &sb) != 0)
        return 0;
    uint64_t alloc = (uint64_t)sb.st_blocks * 512u;
    if (S_ISREG(sb.st_mode)) {
        /* Blocks past the data (rounded up to a page) were reserved with
         * fallocate(KEEP_SIZE): a live WAL, a reader's log. */
        uint64_t used = ((uint64_t)sb.st_size + 4095u) & ~(uint64_t)4095u;
        *reserved = alloc > used ? alloc - used : 0;
        return alloc;
    }
    if (!S_ISDIR(sb.st_mode))
        return 0;
    uint64_t t[2] = {alloc, 0};
    kc__each_child(path, du_child, t);
    *reserved = t[1];
    return t[0];
}

bool kc__pid_gone(const char *name)
{
    char *end;
    long pid = strtol(name, &end, 10);
    if (end == name || pid <= 0 || *end != '-')
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int kc__dir_hold(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

void kc__dir_sweep(const char *parent, const char *prefix)
{
    DIR *d = opendir(parent);
    if (d == NULL)
        return;
    size_t pl = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, pl) != 0 || !kc__pid_gone(e->d_name + pl))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        /* Only our own (under a shared $TMPDIR another user could have made
         * it, and fill it to steer the removal); held: a live reader (in
         * another pid namespace, or a pid reused). */
        struct stat sb;
        if (fstat(fd, &sb) == 0 && sb.st_uid == geteuid() && (sb.st_mode & 077) == 0 &&
            flock(fd, LOCK_EX | LOCK_NB) == 0) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", parent, e->d_name) < (int)sizeof path)
                kc__rm_rf(path);
        }
        close(fd);
    }
    closedir(d);
}

void kc__locks_prune(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/locks", dir) >= (int)sizeof path)
        return;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return;
    /* Only a directory that is ours and private, as the shim requires
     * (shim/flight.c): what anyone else could have put there is not ours to
     * remove. */
    struct stat ds;
    DIR *d = NULL;
    if (fstat(dfd, &ds) != 0 || ds.st_uid != geteuid() || (ds.st_mode & 022) != 0 ||
        (d = fdopendir(dfd)) == NULL) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        /* Removed while we hold its lock, and only if the name is still
         * that file: a process that opened it meanwhile finds, once it
         * holds the lock, that the name is gone, and takes a new file. */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && S_ISREG(a.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
            fstatat(dfd, e->d_name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            unlinkat(dfd, e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

void kc__spool_scan(const char *spool, uint64_t stop, struct kc__spool_seen *out)
{
    memset(out, 0, sizeof *out);
    int dfd = open(spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    /* 8-byte aligned, as struct dirent64 is. */
    uint64_t buf[1024];
    for (;;) {
        ssize_t n = getdents64(dfd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (ssize_t off = 0; off < n && out->bytes <= stop;) {
            const struct dirent64 *e = (const struct dirent64 *)((const char *)buf + off);
            off += e->d_reclen;
            const char *name = e->d_name;
            struct stat sb;
            if (name[0] == '.' || fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(sb.st_mode))
                continue;
            out->bytes += (uint64_t)sb.st_size;
            if (name[1] == '-' && strchr("pdxs", name[0]) != NULL)
                out->work++;
            else if (name[1] == '-' && (name[0] == 'h' || name[0] == 'c'))
                out->logs++;
        }
        if (out->bytes > stop)
            break;
    }
    close(dfd);
}
