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
#include <sys/stat.h>
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
        size_t nl = strlen(name), pl = rl + (rl ? 1 : 0) + nl;
        if (pl >= PATH_MAX || pl > UINT16_MAX) {
            rc = -ENAMETOOLONG;
            break;
        }
        if (rl)
            rel[rl] = '/';
        memcpy(rel + pl - nl, name, nl + 1);
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
