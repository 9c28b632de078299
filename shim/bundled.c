/*
 * NVRTC's bundled headers as its install writes them (NVRTC 13.3+). See
 * deps.h (kc__pristine_*) and docs/internals.md, "NVRTC's bundled headers".
 *
 * A DIR that was an empty private directory of ours before the shim's own
 * nvrtcInstallBundledHeaders in this call holds exactly what that install
 * writes: NVRTC's bytes, the same for every install of one NVRTC identity.
 * Their digests are kept once per identity (the map, DIR/bundled/<id> in the
 * store: made from the first such DIR, every file read), so a hit's check of
 * the headers read below such a DIR compares digests without reading one.
 */
#include "deps.h"
#include "shim.h"
#include "../store/local/local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The map file: magic, the NVRTC identity, the number of files, each
 * file's path length (u16), path and digest, then XXH3-128 of all before. */
static const char MAGIC[8] = {'K', 'C', 'B', 'H', 'M', 'A', 'P', '1'};
#define HEAD (sizeof MAGIC + 16 + 8)
#define MAX_FILES (1u << 20)
#define MAX_BYTES (64u << 20)

struct slot {
    uint64_t h;
    const char *path; /* NULL: empty */
    kc_digest d;
};

struct kc__pristine {
    kc_digest id;
    uint32_t n;
    size_t mask;
    struct slot *slot;
    char *paths; /* the slots' paths */
    struct kc__pristine *next;
};

static bool digest_eq(const kc_digest *a, const kc_digest *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

bool kc__pristine_find(const struct kc__pristine *m, const char *rel, kc_digest *out)
{
    uint64_t h = XXH3_64bits(rel, strlen(rel));
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct slot *s = &m->slot[i];
        if (s->path == NULL)
            return false;
        if (s->h == h && strcmp(s->path, rel) == 0) {
            *out = s->d;
            return true;
        }
    }
}

static void pristine_free(struct kc__pristine *m)
{
    if (m == NULL)
        return;
    free(m->slot);
    free(m->paths);
    free(m);
}

/* The map of bytes[0, len) for identity id, every check passed, or NULL. */
static struct kc__pristine *decode(const unsigned char *b, size_t len, const kc_digest *id)
{
    if (len < HEAD + 16 || memcmp(b, MAGIC, sizeof MAGIC) != 0)
        return NULL;
    XXH128_hash_t sum = XXH3_128bits(b, len - 16);
    uint64_t want[2], got[2] = {sum.low64, sum.high64};
    memcpy(want, b + len - 16, 16);
    kc_digest fid;
    uint64_t n;
    memcpy(&fid.lo, b + sizeof MAGIC, 8);
    memcpy(&fid.hi, b + sizeof MAGIC + 8, 8);
    memcpy(&n, b + sizeof MAGIC + 16, 8);
    if (memcmp(want, got, 16) != 0 || !digest_eq(&fid, id) || n == 0 || n > MAX_FILES)
        return NULL;
    struct kc__pristine *m = calloc(1, sizeof *m);
    size_t cap = 1;
    while (cap < 2 * n)
        cap <<= 1;
    if (m == NULL || (m->slot = calloc(cap, sizeof *m->slot)) == NULL ||
        (m->paths = malloc(len)) == NULL) {
        pristine_free(m);
        return NULL;
    }
    m->id = *id;
    m->mask = cap - 1;
    size_t off = HEAD, w = 0, end = len - 16;
    for (uint64_t k = 0; k < n; k++) {
        uint16_t pl;
        if (end - off < 2)
            goto bad;
        memcpy(&pl, b + off, 2);
        off += 2;
        if (pl == 0 || end - off < (size_t)pl + 16)
            goto bad;
        const char *p = (const char *)b + off;
        if (memchr(p, 0, pl) != NULL || p[0] == '/')
            goto bad;
        char *path = m->paths + w;
        memcpy(path, p, pl);
        path[pl] = 0;
        w += (size_t)pl + 1;
        off += pl;
        kc_digest d;
        memcpy(&d.lo, b + off, 8);
        memcpy(&d.hi, b + off + 8, 8);
        off += 16;
        uint64_t h = XXH3_64bits(path, pl);
        size_t i = h & m->mask;
        while (m->slot[i].path != NULL) {
            if (m->slot[i].h == h && strcmp(m->slot[i].path, path) == 0)
                goto bad; /* twice */
            i = (i + 1) & m->mask;
        }
        m->slot[i] = (struct slot){.h = h, .path = path, .d = d};
    }
    if (off != end)
        goto bad;
    m->n = (uint32_t)n;
    return m;
bad:
    pristine_free(m);
    return NULL;
}

/* ---- making the map from a DIR ----------------------------------------- */

struct buf {
    unsigned char *p;
    size_t len, cap;
    bool failed;
};

static void put(struct buf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *q = cap <= MAX_BYTES ? realloc(b->p, cap) : NULL;
        if (q == NULL) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

struct file {
    char *path;
    kc_digest d;
};

struct files {
    struct file *v;
    size_t n, cap;
};

static int add(struct files *f, const char *path, const kc_digest *d)
{
    if (f->n == MAX_FILES)
        return -EFBIG;
    if (kc_grow(&f->v, &f->cap, f->n, sizeof *f->v, 4096) != 0)
        return -ENOMEM;
    if ((f->v[f->n].path = strdup(path)) == NULL)
        return -ENOMEM;
    f->v[f->n++].d = *d;
    return 0;
}

/* Appends "/name" (or "name" at the top) to rel, which holds rl bytes: the
 * new length, or 0 when it would not fit (PATH_MAX, or a u16 length). */
static size_t rel_join(char *rel, size_t rl, const char *name)
{
    size_t nl = strlen(name), pl = rl + (rl ? 1 : 0) + nl;
    if (pl >= PATH_MAX || pl > UINT16_MAX)
        return 0;
    if (rl)
        rel[rl] = '/';
    memcpy(rel + pl - nl, name, nl + 1);
    return pl;
}

/* Adds every file below the directory dfd (taken: closed here) to f, named
 * rel/... (rel holds rl bytes). 0, or -errno; -EINVAL when something there
 * is neither a directory nor a regular file (no install makes one). */
static int walk(int dfd, char *rel, size_t rl, int depth, struct files *f)
{
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return -errno;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        /* The install's version marker (its time) and lock: no dependency
         * names them (deps.c). */
        if (depth == 0 && (strcmp(name, ".nvrtc_headers_version") == 0 ||
                           strcmp(name, ".nvrtc_install.lock") == 0))
            continue;
        size_t pl = rel_join(rel, rl, name);
        if (pl == 0) {
            rc = -ENAMETOOLONG;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -errno;
        } else if (S_ISDIR(st.st_mode)) {
            int fd = depth < 64
                         ? openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                         : (errno = ELOOP, -1);
            rc = fd < 0 ? -errno : walk(fd, rel, pl, depth + 1, f);
        } else if (S_ISREG(st.st_mode)) {
            int fd = openat(dirfd(d), name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            kc_digest dg;
            if (fd < 0)
                rc = -errno;
            else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
                rc = -EINVAL;
            else
                rc = kc__digest_fd(fd, &st, &dg);
            if (fd >= 0)
                close(fd);
            if (rc == 0)
                rc = add(f, rel, &dg);
        } else {
            rc = -EINVAL;
        }
        rel[rl] = 0;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(d);
    return rc;
}

static int by_path(const void *a, const void *b)
{
    return strcmp(((const struct file *)a)->path, ((const struct file *)b)->path);
}

/* The map file's bytes for what dir holds (malloc'd; the files in path
 * order, so every install of one NVRTC gives the same bytes), or NULL. */
static unsigned char *make(const char *dir, const kc_digest *id, size_t *len)
{
    struct files f = {0};
    char rel[PATH_MAX];
    rel[0] = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc = fd < 0 ? -errno : walk(fd, rel, 0, 0, &f);
    struct buf b = {0};
    if (rc == 0 && f.n == 0)
        rc = -ENOENT;
    if (rc == 0) {
        qsort(f.v, f.n, sizeof *f.v, by_path);
        uint64_t n = f.n;
        put(&b, MAGIC, sizeof MAGIC);
        put(&b, &id->lo, 8);
        put(&b, &id->hi, 8);
        put(&b, &n, 8);
        for (size_t i = 0; i < f.n; i++) {
            uint16_t l = (uint16_t)strlen(f.v[i].path);
            put(&b, &l, 2);
            put(&b, f.v[i].path, l);
            put(&b, &f.v[i].d.lo, 8);
            put(&b, &f.v[i].d.hi, 8);
        }
        if (!b.failed) {
            XXH128_hash_t sum = XXH3_128bits(b.p, b.len);
            put(&b, &sum.low64, 8);
            put(&b, &sum.high64, 8);
        }
        if (b.failed)
            rc = -ENOMEM;
    }
    for (size_t i = 0; i < f.n; i++)
        free(f.v[i].path);
    free(f.v);
    if (rc != 0) {
        kc_log(KC_LOG_DEBUG, "nvrtc: no map of the bundled headers in %s (%s)", dir, strerror(-rc));
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

/* ---- the store's copy ---------------------------------------------------- */

/* DIR/bundled of the store and the map's name in it. */
static int map_path(const char *store, const kc_digest *id, char *dir, size_t dl, char name[33])
{
    if ((size_t)snprintf(dir, dl, "%s/bundled", store) >= dl)
        return -ENAMETOOLONG;
    kc__digest_hex(id, name);
    return 0;
}

/* The store's map of id: 0 with *m; -ENOENT when there is none; -EBADMSG
 * when there is one that fails a check (not ours, readable or writable by
 * others, not a regular file, corrupt, another identity's). */
static int load(const char *store, const kc_digest *id, struct kc__pristine **m)
{
    char dir[PATH_MAX], name[33], path[PATH_MAX + 40];
    if (map_path(store, id, dir, sizeof dir, name) != 0)
        return -ENOENT;
    int rc = kc__private_subdir(dir, false);
    if (rc == -ENOENT)
        return -ENOENT;
    if (rc != 0)
        return -EBADMSG;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ENOENT : -EBADMSG;
    struct stat st;
    unsigned char *b = NULL;
    rc = -EBADMSG;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
        (st.st_mode & 077) == 0 && st.st_size > 0 && (uint64_t)st.st_size <= MAX_BYTES &&
        (b = malloc((size_t)st.st_size)) != NULL) {
        size_t off = 0, want = (size_t)st.st_size;
        while (off < want) {
            ssize_t r = read(fd, b + off, want - off);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            off += (size_t)r;
        }
        char extra;
        if (off == want && read(fd, &extra, 1) == 0 && (*m = decode(b, want, id)) != NULL)
            rc = 0;
    }
    free(b);
    close(fd);
    return rc;
}

static void save(const char *store, const kc_digest *id, const unsigned char *b, size_t len)
{
    char dir[PATH_MAX], name[33];
    if (map_path(store, id, dir, sizeof dir, name) != 0 || kc__private_subdir(dir, true) != 0)
        return;
    int rc = kc__spool_write(dir, name, b, len, false);
    if (rc != 0)
        kc_log(KC_LOG_DEBUG, "nvrtc: cannot write the bundled headers' map in %s (%s)", dir,
               strerror(-rc));
}

/* ---- the process's maps -------------------------------------------------- */

static struct kc__pristine *maps; /* never freed: lookups may hold one */
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

const struct kc__pristine *kc__pristine_get(const char *store, const kc_digest *id, const char *dir,
                                            bool readonly)
{
    pthread_mutex_lock(&maps_lock);
    struct kc__pristine *m = maps;
    while (m != NULL && !digest_eq(&m->id, id))
        m = m->next;
    if (m != NULL) {
        pthread_mutex_unlock(&maps_lock);
        return m;
    }
    int rc = load(store, id, &m);
    if (rc == -EBADMSG)
        kc_log(KC_LOG_WARN,
               "the map of NVRTC's bundled headers in %s/bundled fails its checks; "
               "ignored, made again",
               store);
    if (rc != 0 && !readonly) {
        /* Made from this DIR: what it holds is the install's. (Not for a
         * read-only store: each process would read every file.) */
        size_t len = 0;
        uint64_t t0 = kc_mono_ns();
        unsigned char *b = make(dir, id, &len);
        m = b != NULL ? decode(b, len, id) : NULL;
        if (m != NULL)
            save(store, id, b, len);
        if (m != NULL)
            kc_log(KC_LOG_DEBUG, "nvrtc: map of the bundled headers made: %u files, %.1f ms", m->n,
                   (kc_mono_ns() - t0) / 1e6);
        free(b);
    }
    if (m != NULL) {
        m->next = maps;
        maps = m;
    }
    pthread_mutex_unlock(&maps_lock);
    /* A bad map is not used in the call that found it: its check reads. */
    return rc == -EBADMSG ? NULL : m;
}

/* ---- the directory before and after the install --------------------------- */

/* Only "." and "..": nothing anyone put there. */
static bool empty_dir(int fd)
{
    int d2 = dup(fd);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (d == NULL) {
        if (d2 >= 0)
            close(d2);
        return false;
    }
    bool empty = true;
    struct dirent *e;
    errno = 0;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    if (errno != 0)
        empty = false;
    closedir(d);
    return empty;
}

static bool private_dir(const struct stat *st)
{
    return S_ISDIR(st->st_mode) && st->st_uid == geteuid() && (st->st_mode & 077) == 0;
}

bool kc__bundled_empty(const char *dir, struct stat *st)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = fstat(fd, st) == 0 && private_dir(st) && empty_dir(fd);
    close(fd);
    return ok;
}

bool kc__bundled_same(const char *dir, const struct stat *before)
{
    struct stat st;
    return lstat(dir, &st) == 0 && private_dir(&st) && st.st_dev == before->st_dev &&
           st.st_ino == before->st_ino;
}

/* ---- DIRs filled earlier in the process ------------------------------------ */

/* A later compile with a DIR this process took from empty to NVRTC's bytes
 * finds it not empty: whether its files are still those bytes is proved
 * from their stat. A write, truncate, rename, link or unlink of a file
 * sets its ctime from the coarse realtime clock (or later, with multigrain
 * timestamps), and one in a directory sets the directory's: anything done
 * after `since` leaves a ctime at or after it. A ctime before it, with
 * sub-microsecond digits (a filesystem that truncates times to seconds
 * could date a later write earlier), is a file untouched since the fill.
 * Only local filesystems whose times come from this machine's clock. */

struct pdir {
    char path[PATH_MAX];
    ino_t ino;
    struct kc__pristine_proof proof;
    const struct kc__pristine *map;
};

#define MAX_DIRS 16
static struct pdir pdirs[MAX_DIRS];
static unsigned n_pdirs;
static pthread_mutex_t pdirs_lock = PTHREAD_MUTEX_INITIALIZER;

void kc__pristine_clock(struct timespec *ts)
{
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME_COARSE, ts) != 0)
        ts->tv_sec = ts->tv_nsec = 0; /* nothing is older: the map is not used */
}

static bool local_fs(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return false;
    switch ((unsigned long)sf.f_type) {
    case 0xEF53:     /* ext2, ext3, ext4 */
    case 0x58465342: /* XFS */
    case 0x9123683E: /* Btrfs */
    case 0x01021994: /* tmpfs */
    case 0x794C7630: /* overlayfs */
    case 0xF2F52010: /* F2FS */
        return true;
    }
    return false;
}

void kc__pristine_remember(const char *dir, const struct stat *st, const struct kc__pristine *m,
                           const struct timespec *since)
{
    if (m == NULL || strlen(dir) >= PATH_MAX || since->tv_sec == 0)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    bool local = local_fs(fd);
    close(fd);
    if (!local)
        return;
    pthread_mutex_lock(&pdirs_lock);
    struct pdir *pd = NULL;
    for (unsigned i = 0; i < n_pdirs && i < MAX_DIRS; i++)
        if (strcmp(pdirs[i].path, dir) == 0)
            pd = &pdirs[i];
    if (pd == NULL)
        pd = &pdirs[n_pdirs++ % MAX_DIRS];
    snprintf(pd->path, sizeof pd->path, "%s", dir);
    pd->ino = st->st_ino;
    pd->proof = (struct kc__pristine_proof){.dev = st->st_dev, .since = *since};
    pd->map = m;
    pthread_mutex_unlock(&pdirs_lock);
}

bool kc__pristine_recall(const char *dir, const struct kc__pristine **map,
                         struct kc__pristine_proof *proof)
{
    struct stat st;
    if (lstat(dir, &st) != 0 || !private_dir(&st))
        return false;
    bool found = false;
    pthread_mutex_lock(&pdirs_lock);
    for (unsigned i = 0; i < n_pdirs && i < MAX_DIRS && !found; i++) {
        const struct pdir *pd = &pdirs[i];
        if (pd->proof.dev == st.st_dev && pd->ino == st.st_ino && strcmp(pd->path, dir) == 0) {
            *map = pd->map;
            *proof = pd->proof;
            found = true;
        }
    }
    pthread_mutex_unlock(&pdirs_lock);
    return found;
}

static bool older(const struct stat *st, const struct kc__pristine_proof *pd)
{
    if (st->st_dev != pd->dev || st->st_ctim.tv_nsec % 1000 == 0)
        return false;
    return st->st_ctim.tv_sec < pd->since.tv_sec ||
           (st->st_ctim.tv_sec == pd->since.tv_sec && st->st_ctim.tv_nsec < pd->since.tv_nsec);
}

bool kc__pristine_unchanged(const struct kc__pristine_proof *pd, const char *rel, const char *path,
                            char *parent_ok)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || !older(&st, pd))
        return false;
    const char *slash = strrchr(rel, '/');
    if (slash == NULL)
        return true; /* directly in DIR: DIR itself is recall's */
    size_t plen = (size_t)(slash - rel);
    if (plen < 256 && strncmp(parent_ok, rel, plen) == 0 && parent_ok[plen] == '\0')
        return true;
    /* Each directory between DIR and the file: DIR/a, DIR/a/b, ... */
    size_t base = strlen(path) - strlen(rel);
    char buf[PATH_MAX];
    if (strlen(path) >= sizeof buf)
        return false;
    memcpy(buf, path, base);
    for (const char *p = rel; (p = strchr(p, '/')) != NULL && p <= slash; p++) {
        size_t n = base + (size_t)(p - rel);
        memcpy(buf + base, rel, (size_t)(p - rel));
        buf[n] = '\0';
        if (lstat(buf, &st) != 0 || !S_ISDIR(st.st_mode) || !older(&st, pd))
            return false;
    }
    if (plen < 256) {
        memcpy(parent_ok, rel, plen);
        parent_ok[plen] = '\0';
    }
    return true;
}

/* ---- the store's copy of the install, to fill a DIR with ------------------------------------ */

/* A hit (or a miss) whose DIR is empty and private fills it from the
 * store's copy of what NVRTC's install wrote (DIR/bundled/<id>.tree, kept
 * once per identity from a DIR NVRTC's install filled): each file a
 * reflink (FICLONE) where the filesystem has them, else a copy, with
 * NVRTC's modes (0666 and 0777 less the umask) and its version marker
 * dated now, every file checked against the map as it is made. The host
 * gets files of its own it may change or remove; the store's stay as
 * they are. Hard links are not used: the host could write the store's
 * copy through them. */

#define MARKER ".nvrtc_headers_version"
#define INSTALL_LOCK ".nvrtc_install.lock"
#define MAX_FILE (64u << 20)

static int tree_path(const char *store, const kc_digest *id, char *out, size_t n)
{
    char name[33];
    kc__digest_hex(id, name);
    return (size_t)snprintf(out, n, "%s/bundled/%s.tree", store, name) >= n ? -ENAMETOOLONG : 0;
}

/* Removes everything below the directory dfd (not closed here). */
static void tree_clear(int dfd, int depth)
{
    int d2 = dup(dfd);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (d == NULL) {
        if (d2 >= 0)
            close(d2);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 || errno != EISDIR)
            continue;
        int fd = depth < 64
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

/* Copies the file `name` of sdir into ddir (made there, mode fm less the
 * umask): a reflink when `clone` and the filesystem has them, else its
 * bytes; *d the copy's digest. restamp: the version marker. */
static int file_copy(int sdir, int ddir, const char *name, mode_t fm, bool *clone, bool restamp,
                     kc_digest *d)
{
    int in = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0)
        return -errno;
    struct stat st;
    int rc = 0, out = -1;
    char *buf = NULL;
    if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE) {
        rc = -EINVAL;
        goto done;
    }
    out = openat(ddir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, fm);
    if (out < 0) {
        rc = -errno;
        goto done;
    }
    if (*clone && !restamp && st.st_size > 0) {
        if (ioctl(out, FICLONE, in) == 0) {
            rc = kc__digest_fd(out, &st, d);
            goto done;
        }
        *clone = false; /* not on this filesystem (or across two): copies from now on */
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = malloc(n ? n : 1);
    if (buf == NULL) {
        rc = -ENOMEM;
        goto done;
    }
    while (got < n) {
        ssize_t r = read(in, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -ESTALE;
            goto done;
        }
        got += (size_t)r;
    }
    if (restamp) {
        char *o = malloc(n + 256);
        if (o == NULL) {
            rc = -ENOMEM;
            goto done;
        }
        n = marker_restamp(buf, n, o, n + 256);
        free(buf);
        buf = o;
    }
    *d = kc_digest_of(buf, n);
    rc = write_all(out, buf, n);
done:
    free(buf);
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = -errno;
    close(in);
    return rc;
}

/* Copies the tree below sdir into ddir (both taken: closed here): files
 * mode fm, directories dm (less the umask). With m, every file but the
 * marker and the install's lock must be m's, with m's digest, and all of
 * m's files there (*n counts them). host: the copy is the host's DIR
 * (the marker dated now). *clone: reflinks still tried. */
static int tree_copy(int sdir, int ddir, char *rel, size_t rl, int depth,
                     const struct kc__pristine *m, mode_t fm, mode_t dm, bool host, bool *clone,
                     uint32_t *n)
{
    DIR *d = fdopendir(sdir);
    if (d == NULL) {
        close(sdir);
        close(ddir);
        return -errno;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        size_t pl = rel_join(rel, rl, name);
        if (pl == 0) {
            rc = -ENAMETOOLONG;
            break;
        }
        bool extra = depth == 0 && (strcmp(name, MARKER) == 0 || strcmp(name, INSTALL_LOCK) == 0);
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -errno;
        } else if (S_ISDIR(st.st_mode) && depth < 64) {
            int s2 = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int d2 = s2 < 0 ? -1
                     : mkdirat(ddir, name, dm) != 0
                         ? -1
                         : openat(ddir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (s2 < 0 || d2 < 0) {
                rc = -errno;
                if (s2 >= 0)
                    close(s2);
            } else {
                rc = tree_copy(s2, d2, rel, pl, depth + 1, m, fm, dm, host, clone, n);
            }
        } else if (S_ISREG(st.st_mode)) {
            kc_digest got, want;
            rc = file_copy(dirfd(d), ddir, name, fm, clone,
                           host && extra && strcmp(name, MARKER) == 0, &got);
            if (rc == 0 && m != NULL && !extra) {
                if (!kc__pristine_find(m, rel, &want) || !digest_eq(&got, &want))
                    rc = -EBADMSG;
                else
                    (*n)++;
            }
        } else {
            rc = -EINVAL;
        }
        rel[rl] = 0;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(d);
    close(ddir);
    return rc;
}

/* The map of id, from the process's maps or the store's file, never made. */
static const struct kc__pristine *map_lookup(const char *store, const kc_digest *id)
{
    pthread_mutex_lock(&maps_lock);
    struct kc__pristine *m = maps;
    while (m != NULL && !digest_eq(&m->id, id))
        m = m->next;
    if (m == NULL && load(store, id, &m) == 0) {
        m->next = maps;
        maps = m;
    }
    pthread_mutex_unlock(&maps_lock);
    return m;
}

static int open_tree(const char *store, const kc_digest *id)
{
    char dir[PATH_MAX], path[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/bundled", store) >= (int)sizeof dir ||
        kc__private_subdir(dir, false) != 0 || tree_path(store, id, path, sizeof path) != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !private_dir(&st))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Drops a store copy that failed its check: the next install keeps another. */
static void tree_drop(const char *store, const kc_digest *id)
{
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    if (tree_path(store, id, path, sizeof path) != 0)
        return;
    snprintf(tmp, sizeof tmp, "%s.bad.%ld", path, (long)getpid());
    if (rename(path, tmp) != 0)
        return;
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        tree_clear(fd, 0);
        close(fd);
    }
    rmdir(tmp);
}

int kc__pristine_fill(const char *store, const kc_digest *id, const char *dir,
                      const struct kc__pristine **map)
{
    const struct kc__pristine *m = map_lookup(store, id);
    int sfd = m != NULL ? open_tree(store, id) : -1;
    if (sfd < 0)
        return -ENOENT;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int keep = dfd >= 0 ? dup(dfd) : -1;
    if (keep < 0) {
        close(sfd);
        if (dfd >= 0)
            close(dfd);
        return -errno;
    }
    char rel[PATH_MAX];
    rel[0] = 0;
    uint32_t n = 0;
    uint64_t t0 = kc_mono_ns();
    bool clone = true;
    int rc = tree_copy(sfd, dfd, rel, 0, 0, m, 0666, 0777, true, &clone, &n);
    if (rc == 0 && n != m->n)
        rc = -EBADMSG;
    if (rc != 0) {
        /* DIR was empty: it is again, and NVRTC's install fills it. */
        tree_clear(keep, 0);
        if (rc == -EBADMSG || rc == -EINVAL) {
            kc_log(KC_LOG_WARN,
                   "the store's copy of NVRTC's bundled headers (%s/bundled) differs from its "
                   "map; dropped, NVRTC installs them",
                   store);
            tree_drop(store, id);
        }
    } else {
        *map = m;
        kc_log(KC_LOG_DEBUG,
               "nvrtc: bundled headers in %s from the store's copy: %u files, %.1f ms", dir, n,
               (kc_mono_ns() - t0) / 1e6);
    }
    close(keep);
    return rc;
}

void kc__pristine_keep(const char *store, const kc_digest *id, const char *dir,
                       const struct kc__pristine *m)
{
    char path[PATH_MAX], tmp[PATH_MAX + 48];
    int fd = open_tree(store, id);
    if (fd >= 0) {
        close(fd);
        return;
    }
    if (tree_path(store, id, path, sizeof path) != 0)
        return;
    snprintf(tmp, sizeof tmp, "%s.new.%ld.%llx", path, (long)getpid(),
             (unsigned long long)kc_mono_ns());
    if (mkdir(tmp, 0700) != 0)
        return;
    int sfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    char rel[PATH_MAX];
    rel[0] = 0;
    uint32_t n = 0;
    bool clone = true; /* a reflink too: the host's later writes to DIR copy on write */
    int rc = sfd < 0 || dfd < 0 ? -EIO
                                : tree_copy(sfd, dfd, rel, 0, 0, m, 0600, 0700, false, &clone, &n);
    if (sfd >= 0 && dfd < 0)
        close(sfd);
    if (dfd >= 0 && sfd < 0)
        close(dfd);
    if (rc == 0 && n == m->n && rename(tmp, path) == 0) {
        kc_log(KC_LOG_DEBUG, "nvrtc: the store keeps a copy of NVRTC's bundled headers (%u files)",
               n);
        return;
    }
    int t = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (t >= 0) {
        tree_clear(t, 0);
        close(t);
    }
    rmdir(tmp);
}
