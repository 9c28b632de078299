/*
 * hot.c: the owner's hot files.
 *
 * DIR/hot/<hash> holds a drained put file (or one written from the
 * database for an entry that is hit), so a hit needs no RocksDB; the
 * filter (filter_sync.c) lets a miss skip it too. Only the owner writes
 * either. A hot file is removed whenever its entry leaves the database or
 * changes. Past the bound, the least recently hit plain files are packed
 * (the put with its body as one LZ4 block, which the shim decodes with
 * libc alone; mode 0400 tells them apart without reading them) and the
 * least recently hit packed ones removed: the newest stay plain, the
 * fastest to serve. Sizes count the blocks files take.
 */
#include "parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Bytes a file of len bytes takes on disk, when it has not been stat()ed:
 * whole 4 KiB blocks. */
static uint64_t hot_blocks(uint64_t len)
{
    return (len + 4095) & ~4095ull;
}

void kc__hot_path(struct kc__owner *o, const char *ns, const kc_key *key, char *out, size_t n)
{
    char name[40];
    kc__spool_name(ns, key, 0, name);
    snprintf(out, n, "%s/%s", o->p.hot, name);
}

void kc__hot_remove(struct kc__owner *o, const char *ns, const kc_key *key)
{
    char path[PATH_MAX];
    kc__hot_path(o, ns, key, path, sizeof path);
    struct stat sb;
    if (lstat(path, &sb) == 0 && unlink(path) == 0 && S_ISREG(sb.st_mode)) {
        uint64_t n = (uint64_t)sb.st_blocks * 512;
        o->hot_bytes = o->hot_bytes > n ? o->hot_bytes - n : 0;
    }
}

/* Removes the hot file of a kernels key (ns \0 key). */
void kc__hot_remove_kk(struct kc__owner *o, const unsigned char *kk, size_t kl)
{
    char ns[KC__NS_MAX + 1];
    kc_key key;
    if (kc__kkey_split(kk, kl, ns, &key) == 0)
        kc__hot_remove(o, ns, &key);
}

static bool hot_name(const char *n)
{
    if (strlen(n) != 32)
        return false;
    for (int i = 0; i < 32; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
            return false;
    return true;
}

static int cmp_hotf(const void *a, const void *b)
{
    const struct kc__hotf *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

/* Lists DIR/hot (removing stray temp files of dead writers is
 * owner.c clean_stale's job); returns the byte total. */
uint64_t kc__hot_list(struct kc__owner *o, struct kc__hotf **out, size_t *nout)
{
    uint64_t total = 0;
    struct kc__hotf *v = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(o->p.hot);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            struct stat sb;
            if (!hot_name(e->d_name) || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
                continue;
            total += (uint64_t)sb.st_blocks * 512;
            if (out == NULL)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                struct kc__hotf *nv = realloc(v, cap * sizeof *v);
                if (nv == NULL)
                    break;
                v = nv;
            }
            memcpy(v[n].name, e->d_name, 33);
            v[n].size = (uint64_t)sb.st_blocks * 512;
            v[n].packed = (sb.st_mode & 0200) == 0;
            v[n].mtime = sb.st_mtim;
            n++;
        }
        closedir(d);
    }
    if (out != NULL) {
        *out = v;
        *nout = n;
    }
    return total;
}

/* DIR/hot's bound: min(max_size / 4, KC__HOT_MAX) and, so the store stays
 * compact on disk (hot files are copies), at most a quarter of the
 * database's tables' size (at least KC__HOT_MIN). */
uint64_t kc__hot_limit(struct kc__owner *o)
{
    uint64_t lim = o->max_size / 4 < KC__HOT_MAX ? o->max_size / 4 : KC__HOT_MAX;
    /* The tables only: a live session's preallocated WAL and MANIFEST
     * would count many megabytes that go away when it ends. */
    uint64_t db = 0;
    DIR *d = opendir(o->p.db);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t n = strlen(e->d_name);
            struct stat sb;
            if (n > 4 && strcmp(e->d_name + n - 4, ".sst") == 0 &&
                fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
                db += (uint64_t)sb.st_size;
        }
        closedir(d);
    }
    db /= 4;
    if (db < KC__HOT_MIN)
        db = KC__HOT_MIN;
    return db < lim ? db : lim;
}

/* Whether the file system has room to spare for hot files: they are an
 * optimisation and must never take the last free space from the spool
 * and the database (at least 64 MiB and 5% free). */
static bool hot_room(struct kc__owner *o)
{
    /* Asked at most every 100 ms: a pass writing thousands of hot files
     * (an import) does not statvfs before each. */
    uint64_t now = kc_mono_ns();
    if (o->hot_room_at != 0 && now - o->hot_room_at < 100000000u)
        return o->hot_room_ok;
    struct statvfs v;
    bool ok = false;
    if (statvfs(o->p.hot, &v) == 0) {
        uint64_t free_b = (uint64_t)v.f_bavail * v.f_frsize;
        uint64_t total = (uint64_t)v.f_blocks * v.f_frsize;
        ok = free_b >= (64ull << 20) && free_b >= total / 20;
    }
    o->hot_room_at = now;
    o->hot_room_ok = ok;
    return ok;
}

/* Packs the plain hot file f: 0 with f->size its new size; nonzero when
 * it cannot be read or packing would not save a block (evict it). The
 * packed file replaces the plain one by rename, then gets its mtime back
 * and mode 0400: one that an owner killed in between left 0600 is
 * recognised by its bytes at the next pass. */
static int hot_pack(struct kc__owner *o, struct kc__hotf *f)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", o->p.hot, f->name);
    unsigned char *buf = NULL;
    size_t len = 0;
    struct kc__sp_put sp;
    if (kc__read_file(AT_FDCWD, path, 1ull << 32, &buf, &len) != 0)
        return -1;
    int rc = -1;
    if (len > 4 && buf[4] == KC__SP_PACKED) { /* packed by a killed owner */
        rc = chmod(path, 0400);
    } else if (kc__spool_put_decode(buf, len, &sp) == 0 && sp.body_len >= 64 &&
               sp.body_len <= LZ4_MAX_INPUT_SIZE) {
        int bound = LZ4_compressBound((int)sp.body_len);
        char *z = malloc((size_t)bound);
        int zn =
            z != NULL ? LZ4_compress_default((const char *)sp.body, z, (int)sp.body_len, bound) : 0;
        struct kc__buf b = {0};
        if (zn > 0 && (size_t)zn + 4096 <= sp.body_len &&
            kc__spool_put_pack(&b, &sp, z, (size_t)zn) == 0 &&
            kc__spool_write(o->p.hot, f->name, b.p, b.len, false) == 0) {
            /* Its recency stays its own: the mtime it had. */
            struct timespec ts[2] = {f->mtime, f->mtime};
            utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW);
            chmod(path, 0400);
            len = b.len;
            rc = 0;
        }
        kc__buf_free(&b);
        free(z);
    }
    free(buf);
    if (rc == 0) {
        f->size = hot_blocks(len);
        f->packed = true;
    }
    return rc;
}

/* Past its bound, brings DIR/hot down to 90% of it by recency (mtime: put
 * time, refreshed by folded hits). Newest first: files are kept as they
 * are up to half of that, plain ones past it are packed (one that does not
 * pack is removed), and once it is reached the rest are removed. So the
 * most recently hit stay plain, the fastest to serve, and the next are
 * packed rather than sent back to RocksDB. */
/* The most recently hit files stay plain whatever the bound, this many
 * of them up to this many bytes together: a process's working set of a
 * few big programs (one of libmathdx's LTO-IR records is 2 MiB, four
 * times the floor of a small store's bound: it was read through RocksDB
 * in every fresh process, 16-25 ms of an nvmath FFT hit, issue 50). */
#define HOT_NEWEST_N 4
#define HOT_NEWEST_BYTES (8ull << 20)

void kc__hot_enforce(struct kc__owner *o)
{
    o->hot_max = kc__hot_limit(o); /* the database grows and shrinks */
    if (o->hot_bytes <= o->hot_max + o->hot_newest)
        return;
    struct kc__hotf *v;
    size_t n;
    o->hot_bytes = kc__hot_list(o, &v, &n);
    if (v == NULL)
        return;
    qsort(v, n, sizeof *v, cmp_hotf);
    int dfd = open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uint64_t target = o->hot_max / 10 * 9, kept = 0, newest = 0;
    bool full = false;
    for (size_t j = n; dfd >= 0 && j-- > 0;) {
        struct kc__hotf *f = &v[j];
        /* The newest few, kept as they are, counted apart. */
        if (n - j <= HOT_NEWEST_N && newest + f->size <= HOT_NEWEST_BYTES &&
            kept + f->size > target / 2) {
            newest += f->size;
            continue;
        }
        bool keep = !full && (kept + f->size <= target / 2 || f->packed || hot_pack(o, f) == 0);
        if (keep && kept + f->size > target)
            keep = false, full = true;
        if (keep)
            kept += f->size;
        else
            unlinkat(dfd, f->name, 0);
    }
    if (dfd >= 0) {
        close(dfd);
        o->hot_bytes = kept + newest;
        o->hot_newest = newest;
    }
    free(v);
}

void kc__hot_clear(struct kc__owner *o)
{
    struct kc__hotf *v;
    size_t n;
    kc__hot_list(o, &v, &n);
    int dfd = open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (size_t i = 0; dfd >= 0 && i < n; i++)
        unlinkat(dfd, v[i].name, 0);
    if (dfd >= 0)
        close(dfd);
    free(v);
    o->hot_bytes = 0;
    o->hot_newest = 0;
}

/* Writes the hot file of an entry from the database (a hit on an entry
 * that has none), or refreshes its mtime (recency for kc__hot_enforce). */
void kc__hot_touch(struct kc__owner *o, const char *ns, const kc_key *key)
{
    if (o->hot_max == 0)
        return;
    char path[PATH_MAX];
    kc__hot_path(o, ns, key, path, sizeof path);
    if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT ||
        !hot_room(o))
        return;
    void *body = NULL;
    size_t len = 0;
    struct kc__hdr h;
    if (kc__lookup(&o->d, ns, key, &body, &len, &h) != 0)
        return;
    kc__hot_write(o, ns, key, &h, body, len);
    free(body);
}

static bool hot_write(struct kc__owner *o, const char *ns, const kc_key *key,
                      const struct kc__hdr *h, const void *body, size_t len, bool staged)
{
    struct kc__buf b = {0};
    bool ok = false;
    if (kc__spool_put_encode(&b, ns, key, NULL, h, body, len) == 0) {
        char hash[40], name[64];
        kc__spool_name(ns, key, 0, hash);
        if (staged)
            snprintf(name, sizeof name, "i-%d-%s", (int)getpid(), hash);
        else
            snprintf(name, sizeof name, "%s", hash);
        if (kc__spool_write(o->p.hot, name, b.p, b.len, false) == 0) {
            o->hot_bytes += hot_blocks(b.len);
            ok = true;
        }
    }
    kc__buf_free(&b);
    return ok;
}

bool kc__hot_write(struct kc__owner *o, const char *ns, const kc_key *key, const struct kc__hdr *h,
                   const void *body, size_t len)
{
    return hot_write(o, ns, key, h, body, len, false);
}

bool kc__hot_write_staged(struct kc__owner *o, const char *ns, const kc_key *key,
                          const struct kc__hdr *h, const void *body, size_t len)
{
    return hot_write(o, ns, key, h, body, len, true);
}

void kc__hot_stage_end(struct kc__owner *o, bool publish)
{
    char prefix[32];
    int pl = snprintf(prefix, sizeof prefix, "i-%d-", (int)getpid());
    DIR *d = opendir(o->p.hot);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)pl) != 0)
            continue;
        if (!publish || !hot_name(e->d_name + pl) ||
            renameat(dirfd(d), e->d_name, dirfd(d), e->d_name + pl) != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    if (!publish)
        o->hot_bytes = kc__hot_list(o, NULL, NULL);
}

bool kc__hot_can_write(struct kc__owner *o)
{
    return o->hot_max > 0 && hot_room(o);
}

/* Whether put file `name` of the spool carries an upload descriptor
 * (KC__PUT_UPLOAD: its flags, after the spool header and the namespace
 * length). */
static bool carries_upload(int sfd, const char *name)
{
    int fd = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    unsigned char h[KC__SPOOL_HDR + 4];
    bool up = pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h && h[4] == KC__SP_PUT &&
              (kc__get_u16(h + KC__SPOOL_HDR + 2) & KC__PUT_UPLOAD) != 0;
    close(fd);
    return up;
}

/* A put file carrying an upload descriptor becomes a hot file without it
 * (the descriptor may hold a password written inline in KCACHE_REMOTE,
 * which must not outlive the spool): rewritten, then its spool file goes.
 * 0 with *size, or -1 (the caller removes it). */
static int hot_without_upload(struct kc__owner *o, int sfd, const char *name, uint64_t *size)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    struct kc__sp_put sp;
    int rc = -1;
    if (kc__read_file(sfd, name, 1ull << 32, &buf, &len) == 0 &&
        kc__spool_put_decode(buf, len, &sp) == 0) {
        struct kc__buf b = {0};
        if (kc__spool_put_encode_flags(&b, sp.ns, &sp.key, sp.has_source ? &sp.source : NULL,
                                       &sp.hdr, sp.body, sp.body_len,
                                       sp.from_remote ? KC__PUT_FROM_REMOTE : 0) == 0 &&
            kc__spool_write(o->p.hot, name + 2, b.p, b.len, false) == 0) {
            *size = b.len;
            rc = 0;
        }
        kc__buf_free(&b);
    }
    if (buf != NULL)
        memset(buf, 0, len);
    free(buf);
    unlinkat(sfd, name, 0);
    return rc;
}

/* After the batch holding them is synced: each applied put file becomes
 * its entry's hot file (rename; the filter already has its key; one that
 * carries an upload descriptor is rewritten without it), the rest are
 * removed. */
void kc__hot_retire_puts(struct kc__owner *o, char **names, const bool *keep, const uint64_t *size,
                         size_t n)
{
    int sfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int hfd =
        o->hot_max > 0 && hot_room(o) ? open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    for (size_t i = 0; sfd >= 0 && i < n; i++) {
        if (keep[i] && hfd >= 0 && hot_name(names[i] + 2) && carries_upload(sfd, names[i])) {
            uint64_t sz;
            if (hot_without_upload(o, sfd, names[i], &sz) == 0)
                o->hot_bytes += hot_blocks(sz);
            continue;
        }
        if (keep[i] && hfd >= 0 && hot_name(names[i] + 2) &&
            renameat(sfd, names[i], hfd, names[i] + 2) == 0) {
            o->hot_bytes += hot_blocks(size[i]);
            continue;
        }
        unlinkat(sfd, names[i], 0);
    }
    if (hfd >= 0)
        close(hfd);
    if (sfd >= 0)
        close(sfd);
    kc__hot_enforce(o);
}
