/*
 * tree.c: copies of NVRTC's bundled headers as trees of files (local.h,
 * "bundled headers"): the store's copy of an install (DIR/bundled/<id>.tree,
 * kept and read by the shim), and the ready copies the owner makes from it
 * (DIR/bundled/<id>.ready.<umask>.<tag>: the host's modes, so a hit that
 * fills a fresh DIR on the same filesystem moves one in with a rename per
 * top-level entry instead of creating every file). libc only: compiled
 * into the store and into the shim's front.
 */
#include "local.h"
#include "../../common/identity.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#define MAX_FILE (64u << 20)
#define MAX_DEPTH 64

size_t kc__rel_join(char *rel, size_t rl, const char *name)
{
    size_t nl = strlen(name), pl = rl + (rl ? 1 : 0) + nl;
    if (pl >= PATH_MAX || pl > UINT16_MAX)
        return 0;
    if (rl)
        rel[rl] = '/';
    memcpy(rel + pl - nl, name, nl + 1);
    return pl;
}

DIR *kc__dir_read(int fd)
{
    int d2 = dup(fd);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (d == NULL && d2 >= 0)
        close(d2);
    /* The duplicate shares fd's offset: a walk of fd before ends there. */
    if (d != NULL)
        rewinddir(d);
    return d;
}

bool kc__bh_extra(int depth, const char *name)
{
    return depth == 0 && (strcmp(name, KC__BH_MARKER) == 0 || strcmp(name, KC__BH_LOCK) == 0);
}

/* Removes everything below the directory dfd (not closed here). */
static void tree_clear(int dfd, int depth)
{
    DIR *d = kc__dir_read(dfd);
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 || errno != EISDIR)
            continue;
        int fd = depth < MAX_DEPTH
                     ? openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                     : -1;
        if (fd >= 0) {
            tree_clear(fd, depth + 1);
            close(fd);
        }
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

void kc__tree_remove(int parent, const char *name)
{
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        tree_clear(fd, 0);
        close(fd);
    }
    unlinkat(parent, name, AT_REMOVEDIR);
}

/* The version marker's bytes with its install time made now (the lines
 * "timestamp=" and "timestamp_human=" of 13.x's format; other lines, and
 * a marker without them, as they are). */
static size_t marker_restamp(const char *in, size_t n, char *out, size_t cap)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(in + i, '\n', n - i);
        size_t l = nl ? (size_t)(nl - (in + i)) + 1 : n - i;
        char line[96];
        int w = -1;
        if (l >= 10 && strncmp(in + i, "timestamp=", 10) == 0)
            w = snprintf(line, sizeof line, "timestamp=%lld\n", (long long)now);
        else if (l >= 16 && strncmp(in + i, "timestamp_human=", 16) == 0)
            w = (int)strftime(line, sizeof line, "timestamp_human=%Y-%m-%d %H:%M:%S UTC\n", &tm);
        if (w > 0 && nl != NULL && o + (size_t)w <= cap) {
            memcpy(out + o, line, (size_t)w);
            o += (size_t)w;
        } else if (o + l <= cap) {
            memcpy(out + o, in + i, l);
            o += l;
        }
        i += l;
    }
    return o;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The bytes of the regular file in (st: its fstat), at most MAX_FILE, in
 * *out (malloc'd). 0 or a negative errno. */
static int read_whole(int in, const struct stat *st, char **out)
{
    size_t n = (size_t)st->st_size, got = 0;
    char *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return -ENOMEM;
    while (got < n) {
        ssize_t r = read(in, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(buf);
            return r < 0 ? -errno : -ESTALE;
        }
        got += (size_t)r;
    }
    *out = buf;
    return 0;
}

/* Copies the file `name` of sdir (rel: its path below the top) into ddir as
 * kc__tree_copy does. The copy's bytes are checked (c->check) before the
 * file is made: a file that fails is never made (-EBADMSG). */
static int file_copy(int sdir, int ddir, const char *name, const char *rel, bool extra,
                     struct kc__tree_copy *c)
{
    int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -errno;
    struct stat st;
    int rc = 0, out = -1;
    char *buf = NULL;
    bool check = c->check != NULL && !extra, clone = false;
    kc_digest d;
    if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE) {
        rc = -EINVAL;
        goto done;
    }
    clone = c->clone && st.st_size > 0;
    /* The bytes first: a reflink's are the source's (read with pread, the
     * offset stays at 0), a copy's those read. */
    if (clone)
        rc = check ? kc__digest_fd(in, &st, &d) : 0;
    else if ((rc = read_whole(in, &st, &buf)) == 0 && check)
        d = kc_digest_of(buf, (size_t)st.st_size);
    if (rc == 0 && check && !c->check(c->arg, rel, &d))
        rc = -EBADMSG;
    if (rc != 0)
        goto done;
    out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, c->fm);
    if (out < 0) {
        rc = -errno;
        goto done;
    }
    if (c->exact && fchmod(out, c->fm) != 0) {
        rc = -errno;
        goto done;
    }
    if (clone) {
        if (ioctl(out, FICLONE, in) == 0)
            goto cloned;
        c->clone = false; /* not on this filesystem (or across two): copies from now on */
        if ((rc = read_whole(in, &st, &buf)) != 0)
            goto done;
    }
    rc = write_all(out, buf, (size_t)st.st_size);
cloned:
    /* A reflink, or a copy read again, after the digest: the source must
     * not have changed in between (the bytes made are then the ones
     * checked; a ready copy's owner proof vouches for them). */
    if (rc == 0 && check && clone) {
        struct stat now;
        if (fstat(in, &now) != 0 || !kc__same_file_state(&st, &now))
            rc = -ESTALE;
    }
done:
    free(buf);
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = -errno;
    close(in);
    if (rc == 0 && check)
        c->n++;
    return rc;
}

int kc__bh_marker_put(int sdir, int ddir)
{
    int in = openat(sdir, KC__BH_MARKER, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -errno;
    struct stat st;
    char *buf = NULL, *o = NULL;
    int rc = fstat(in, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 65536
                 ? -EINVAL
                 : read_whole(in, &st, &buf);
    close(in);
    size_t n = rc == 0 ? (size_t)st.st_size : 0;
    if (rc == 0 && (o = malloc(n + 256)) == NULL)
        rc = -ENOMEM;
    if (rc == 0) {
        n = marker_restamp(buf, n, o, n + 256);
        /* As NVRTC's install makes it (0666 less the umask), never over one. */
        int out =
            openat(ddir, KC__BH_MARKER, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        rc = out < 0 ? -errno : write_all(out, o, n);
        if (out >= 0 && close(out) != 0 && rc == 0)
            rc = -errno;
    }
    free(buf);
    free(o);
    return rc;
}

int kc__tree_each(DIR *d, char *rel, size_t rl, int depth, kc__tree_entry_fn each, void *arg)
{
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        size_t pl = kc__rel_join(rel, rl, name);
        if (pl == 0) {
            rc = -ENAMETOOLONG;
            break;
        }
        rc = each(arg, dirfd(d), name, rel, pl, depth);
        rel[rl] = 0;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(d);
    return rc;
}

struct copy_at {
    struct kc__tree_copy *c;
    int ddir;
};

static int copy_below(int sdir, int ddir, char *rel, size_t rl, int depth, struct kc__tree_copy *c);

static int copy_entry(void *arg, int sdir, const char *name, char *rel, size_t pl, int depth)
{
    struct copy_at *a = arg;
    struct kc__tree_copy *c = a->c;
    bool extra = kc__bh_extra(depth, name);
    /* The install's lock is no part of a copy; a fill writes the marker
     * itself, last. */
    if (extra && (c->fill || strcmp(name, KC__BH_LOCK) == 0))
        return 0;
    struct stat st;
    if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
        int s2 = openat(sdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int d2 = s2 < 0 ? -1
                 : mkdirat(a->ddir, name, c->dm) != 0
                     ? -1
                     : openat(a->ddir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d2 >= 0 && c->exact && fchmod(d2, c->dm) != 0) {
            close(d2);
            d2 = -1;
        }
        if (s2 < 0 || d2 < 0) {
            int rc = -errno;
            if (s2 >= 0)
                close(s2);
            return rc;
        }
        return copy_below(s2, d2, rel, pl, depth + 1, c);
    }
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    return file_copy(sdir, a->ddir, name, rel, extra, c);
}

static int copy_below(int sdir, int ddir, char *rel, size_t rl, int depth, struct kc__tree_copy *c)
{
    DIR *d = fdopendir(sdir);
    if (d == NULL) {
        close(sdir);
        close(ddir);
        return -errno;
    }
    struct copy_at a = {c, ddir};
    int rc = kc__tree_each(d, rel, rl, depth, copy_entry, &a);
    close(ddir);
    return rc;
}

int kc__tree_copy(int sdir, int ddir, struct kc__tree_copy *c)
{
    char rel[PATH_MAX];
    rel[0] = 0;
    return copy_below(sdir, ddir, rel, 0, 0, c);
}

/* ---- ready trees ------------------------------------------------------------ */

int kc__bundled_dir(const char *store, bool create)
{
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s/bundled", store) >= sizeof dir)
        return -ENAMETOOLONG;
    int rc = kc__private_subdir(dir, create);
    if (rc != 0)
        return rc;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

void kc__ready_name(char *out, size_t n, const char *hex, const char *kind, mode_t mask,
                    const char *tag)
{
    snprintf(out, n, "%s.%s.%03o%s%s", hex, kind, (unsigned)(mask & 0777), tag ? "." : "",
             tag ? tag : "");
}

void kc__ready_want(int bdir, const char *hex, mode_t mask)
{
    char name[96];
    kc__ready_name(name, sizeof name, hex, "want", mask, NULL);
    struct stat st;
    if (fstatat(bdir, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        return;
    int fd = openat(bdir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
}

void kc__ready_tag(char *out, const struct timespec *since)
{
    int n = snprintf(out, KC__READY_TAG, "%ld.%016llx", (long)getpid(),
                     (unsigned long long)kc__rand64());
    if (since != NULL && n > 0 && n < KC__READY_TAG)
        snprintf(out + n, KC__READY_TAG - (size_t)n, ".t%lld_%09ld", (long long)since->tv_sec,
                 (long)since->tv_nsec);
}

bool kc__ready_proof(const char *name, struct timespec *since)
{
    const char *t = strrchr(name, '.');
    if (t == NULL || t[1] != 't' || t[2] < '0' || t[2] > '9')
        return false;
    char *end;
    errno = 0;
    long long sec = strtoll(t + 2, &end, 10);
    if (errno != 0 || *end != '_' || sec <= 0 || end[1] < '0' || end[1] > '9')
        return false;
    const char *ns = end + 1;
    long nsec = strtol(ns, &end, 10);
    if (errno != 0 || *end != 0 || end - ns != 9 || nsec < 0 || nsec >= 1000000000L)
        return false;
    since->tv_sec = (time_t)sec;
    since->tv_nsec = nsec;
    return true;
}

int kc__ready_claim(int bdir, const char *hex, mode_t mask, char *claim, size_t cn,
                    struct timespec *since)
{
    char prefix[96];
    kc__ready_name(prefix, sizeof prefix, hex, "ready", mask, "");
    size_t pl = strlen(prefix);
    DIR *d = kc__dir_read(bdir);
    if (d == NULL) {
        return -ENOENT;
    }
    int fd = -ENOENT;
    struct dirent *e;
    while (fd < 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, pl) != 0)
            continue;
        /* The rename is the claim: of processes racing for one tree, one
         * wins it and the others find it gone. The claim keeps the
         * owner's proof (a copy put back keeps it: the check dated every
         * file after it, so the next claim reads them). */
        char tag[KC__READY_TAG];
        struct timespec t = {0, 0};
        bool proof = kc__ready_proof(e->d_name, &t);
        kc__ready_tag(tag, proof ? &t : NULL);
        kc__ready_name(claim, cn, hex, "claim", mask, tag);
        if (renameat(bdir, e->d_name, bdir, claim) != 0)
            continue;
        fd = openat(bdir, claim, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077))) {
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            kc__tree_remove(bdir, claim);
            fd = -ENOENT;
        } else {
            *since = t;
        }
    }
    closedir(d);
    return fd;
}
