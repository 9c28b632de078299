/*
 * filter.c: DIR/filter, a blocked Bloom filter of every key in the
 * database, so a process can tell a miss without loading RocksDB.
 *
 * Layout: a 64-byte header, then nblocks blocks of 512 bits (one cache
 * line each: a query touches one line of one page).
 *   0 u32 magic "KCF1"   4 u32 version   8 u64 nblocks   16 u32 k
 *   20 u32 0             24 u64 cap (items it was sized for)
 *   32 u64 count (items added)   40 u64 deleted (items removed since built)
 *   48 u64 stamp (database generation it matches; ~0 while an owner runs)
 *   56 u64 XXH3-64 of bytes 0..31
 * Only the owner writes it: bits are only ever set, in place (MAP_SHARED,
 * atomic OR), so readers never see a key vanish; a rebuild writes a new
 * file and renames it over, and readers notice by inode. A missing or
 * unusable filter answers "maybe" (the caller falls back to RocksDB),
 * never "absent".
 */
#include "local.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define F_MAGIC 0x3146434bu /* "KCF1" */
#define F_VERSION 1u
#define F_HDR 64u
#define F_BLOCK 64u
#define F_K 8u
#define F_BITS_PER_ITEM 16u
#define F_MIN_CAP (1u << 12) /* 8 KiB of bits; grown by rebuilds */
#define F_STAMP_LIVE KC__FILTER_LIVE

struct kc__fhash kc__fhash_kernel(const char *ns, const kc_key *key)
{
    unsigned char b[1 + KC__NS_MAX + 1 + KC__KEY_LEN];
    b[0] = KC__FK_KERNEL;
    size_t n = 1 + kc__kkey(ns, key, b + 1);
    kc_digest d = kc_digest_of(b, n);
    return (struct kc__fhash){d.lo, d.hi};
}

struct kc__fhash kc__fhash_source(const char *ns, const kc_digest *src)
{
    unsigned char b[1 + KC__NS_MAX + 1 + 16];
    b[0] = KC__FK_SOURCE;
    size_t n = 1 + kc__skey(ns, src, b + 1);
    kc_digest d = kc_digest_of(b, n);
    return (struct kc__fhash){d.lo, d.hi};
}

/* Checks a header against the file length; nblocks or 0. */
static uint64_t hdr_ok(const unsigned char *m, size_t len)
{
    if (len < F_HDR || kc_le_get_u32(m) != F_MAGIC || kc_le_get_u32(m + 4) != F_VERSION ||
        kc_le_get_u32(m + 16) != F_K || kc_le_get_u32(m + 20) != 0 ||
        kc_le_get_u64(m + 56) != XXH3_64bits(m, 32))
        return 0;
    uint64_t nb = kc_le_get_u64(m + 8);
    if (nb == 0 || nb > (len - F_HDR) / F_BLOCK || F_HDR + nb * F_BLOCK != len)
        return 0;
    return nb;
}

/* The block and the word/bit masks of h. */
static uint64_t block_of(struct kc__fhash h, uint64_t nb)
{
    return (uint64_t)(((unsigned __int128)h.a * nb) >> 64);
}

static void bits_of(struct kc__fhash h, uint64_t w[8])
{
    memset(w, 0, 8 * sizeof w[0]);
    uint64_t s = h.b;
    for (unsigned i = 0; i < F_K; i++) {
        unsigned pos = i < 7 ? (unsigned)(s >> (9 * i)) & 511u : (unsigned)h.a & 511u;
        w[pos >> 6] |= 1ull << (pos & 63);
    }
}

static bool query(const unsigned char *m, uint64_t nb, struct kc__fhash h)
{
    const uint64_t *blk = (const uint64_t *)(m + F_HDR + block_of(h, nb) * F_BLOCK);
    uint64_t w[8];
    bits_of(h, w);
    for (int i = 0; i < 8; i++)
        if ((__atomic_load_n(&blk[i], __ATOMIC_ACQUIRE) & w[i]) != w[i])
            return false;
    return true;
}

/* Opens and checks the file: regular, ours, not writable by others. */
static int open_checked(const char *path, int flags, struct stat *sb)
{
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* Fully allocated, too (see kc__filter_create): never map a hole. */
    if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode) || sb->st_uid != geteuid() ||
        (sb->st_mode & 022) != 0 || (uint64_t)sb->st_blocks * 512u < (uint64_t)sb->st_size) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

void kc__filter_ro_drop(struct kc__filter_ro *f)
{
    if (f->map != NULL)
        munmap((void *)f->map, f->len);
    memset(f, 0, sizeof *f);
}

/* Maps DIR/filter (open_checked with `flags`, shared, `prot`) when its
 * header is ours: 0, the open's error, or -EBADMSG. */
static int map_checked(const char *path, int flags, int prot, unsigned char **map, size_t *len,
                       struct stat *sb)
{
    int fd = open_checked(path, flags, sb);
    if (fd < 0)
        return fd;
    size_t n = (size_t)sb->st_size;
    void *m = n >= F_HDR ? mmap(NULL, n, prot, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED)
        return -EBADMSG;
    if (hdr_ok(m, n) == 0) {
        munmap(m, n);
        return -EBADMSG;
    }
    *map = m;
    *len = n;
    return 0;
}

static int ro_map(struct kc__filter_ro *f, const char *path)
{
    struct stat sb;
    unsigned char *m;
    int rc = map_checked(path, O_RDONLY, PROT_READ, &m, &f->len, &sb);
    if (rc < 0)
        return rc;
    f->map = m;
    f->dev = sb.st_dev;
    f->ino = sb.st_ino;
    return 0;
}

int kc__filter_maybe(struct kc__filter_ro *f, const char *path, struct kc__fhash h)
{
    for (int pass = 0; pass < 2; pass++) {
        if (f->map == NULL && ro_map(f, path) != 0)
            return 1;
        if (query(f->map, hdr_ok(f->map, f->len), h))
            return 1;
        /* Absent here: is this still DIR/filter, or was it rebuilt? */
        struct stat sb;
        if (lstat(path, &sb) == 0 && sb.st_dev == f->dev && sb.st_ino == f->ino)
            return 0;
        kc__filter_ro_drop(f);
    }
    return 1;
}

/* ---- the owner's side --------------------------------------------------- */

void kc__filter_close(struct kc__filter_rw *f)
{
    if (f->map != NULL)
        munmap(f->map, f->len);
    memset(f, 0, sizeof *f);
}

int kc__filter_open_rw(struct kc__filter_rw *f, const char *path, uint64_t *stamp)
{
    memset(f, 0, sizeof *f);
    struct stat sb;
    int rc = map_checked(path, O_RDWR, PROT_READ | PROT_WRITE, &f->map, &f->len, &sb);
    if (rc < 0) {
        memset(f, 0, sizeof *f);
        return rc == -ENOENT ? -ENOENT : -EBADMSG;
    }
    f->cap = kc_le_get_u64(f->map + 24);
    *stamp = __atomic_load_n((uint64_t *)(f->map + 48), __ATOMIC_ACQUIRE);
    return 0;
}

int kc__filter_create(struct kc__filter_rw *f, const char *path, uint64_t cap)
{
    memset(f, 0, sizeof *f);
    if (cap < F_MIN_CAP)
        cap = F_MIN_CAP;
    uint64_t nb = (cap * F_BITS_PER_ITEM + 511) / 512;
    size_t len = F_HDR + nb * F_BLOCK;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.t-%d", path, (int)getpid());
    unlink(tmp);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    /* Every block allocated now: a page of a sparse file that the disk
     * (tmpfs) cannot supply later faults with SIGBUS in whoever maps it. */
    int arc = posix_fallocate(fd, 0, (off_t)len);
    if (arc != 0) {
        int rc = -arc;
        close(fd);
        unlink(tmp);
        return rc;
    }
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(tmp);
        return -ENOMEM;
    }
    unsigned char *h = m;
    kc_le_put_u32(h, F_MAGIC);
    kc_le_put_u32(h + 4, F_VERSION);
    kc_le_put_u64(h + 8, nb);
    kc_le_put_u32(h + 16, F_K);
    kc_le_put_u32(h + 20, 0);
    kc_le_put_u64(h + 24, cap);
    kc_le_put_u64(h + 48, F_STAMP_LIVE);
    kc_le_put_u64(h + 56, XXH3_64bits(h, 32));
    f->map = m;
    f->len = len;
    f->cap = cap;
    return 0;
}

int kc__filter_publish(struct kc__filter_rw *f, const char *path)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.t-%d", path, (int)getpid());
    if (msync(f->map, f->len, MS_SYNC) != 0 || rename(tmp, path) != 0) {
        int rc = -errno;
        unlink(tmp);
        return rc;
    }
    return 0;
}

void kc__filter_add(struct kc__filter_rw *f, struct kc__fhash h)
{
    if (f->map == NULL)
        return;
    uint64_t nb = (f->len - F_HDR) / F_BLOCK;
    uint64_t *blk = (uint64_t *)(f->map + F_HDR + block_of(h, nb) * F_BLOCK);
    uint64_t w[8];
    bits_of(h, w);
    for (int i = 0; i < 8; i++)
        if (w[i] != 0)
            __atomic_fetch_or(&blk[i], w[i], __ATOMIC_RELEASE);
    __atomic_fetch_add((uint64_t *)(f->map + 32), 1, __ATOMIC_RELAXED);
}

void kc__filter_note_delete(struct kc__filter_rw *f)
{
    if (f->map != NULL)
        __atomic_fetch_add((uint64_t *)(f->map + 40), 1, __ATOMIC_RELAXED);
}

void kc__filter_set_stamp(struct kc__filter_rw *f, uint64_t stamp)
{
    if (f->map == NULL)
        return;
    if (stamp != F_STAMP_LIVE)
        msync(f->map, f->len, MS_SYNC); /* the bits first, then the stamp */
    __atomic_store_n((uint64_t *)(f->map + 48), stamp, __ATOMIC_RELEASE);
    msync(f->map, 4096 < f->len ? 4096 : f->len, MS_SYNC);
}

uint64_t kc__filter_count(const struct kc__filter_rw *f)
{
    return f->map ? __atomic_load_n((uint64_t *)(f->map + 32), __ATOMIC_RELAXED) : 0;
}

bool kc__filter_stale(const struct kc__filter_rw *f)
{
    if (f->map == NULL)
        return true;
    uint64_t n = kc__filter_count(f);
    uint64_t del = __atomic_load_n((uint64_t *)(f->map + 40), __ATOMIC_RELAXED);
    return n > f->cap || (del > F_MIN_CAP / 2 && del > n / 2);
}
