/*
 * bhmap.c: the map of NVRTC's bundled headers (local.h, "NVRTC's bundled
 * headers as trees of files"): DIR/bundled/<id>, every file of an install
 * of the NVRTC of identity <id> with its digest, made by the shim
 * (shim/bundled.c) and read by the shim and the owner (the owner checks
 * each ready copy it makes against it). libc only.
 */
#include "local.h"
#include "../../common/identity.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <xxhash.h>

/* The map file: magic, the NVRTC identity, the number of files, each
 * file's path length (u16), path and digest, then XXH3-128 of all before. */
const char kc__bh_map_magic[8] = {'K', 'C', 'B', 'H', 'M', 'A', 'P', '1'};
#define MAGIC kc__bh_map_magic
#define HEAD (sizeof MAGIC + 16 + 8)
#define MAX_FILES KC__BH_MAP_MAX_FILES
#define MAX_BYTES KC__BH_MAP_MAX_BYTES

static bool digest_eq(const kc_digest *a, const kc_digest *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

bool kc__pristine_find(const struct kc__pristine *m, const char *rel, kc_digest *out)
{
    uint64_t h = XXH3_64bits(rel, strlen(rel));
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const struct kc__bh_slot *s = &m->slot[i];
        if (s->path == NULL)
            return false;
        if (s->h == h && strcmp(s->path, rel) == 0) {
            *out = s->d;
            return true;
        }
    }
}

bool kc__bh_map_check(void *m, const char *rel, const kc_digest *d)
{
    kc_digest want;
    return kc__pristine_find(m, rel, &want) && digest_eq(&want, d);
}

void kc__bh_map_free(struct kc__pristine *m)
{
    if (m == NULL)
        return;
    free(m->slot);
    free(m->paths);
    free(m);
}

/* The map of bytes[0, len) for identity id, every check passed, or NULL. */
struct kc__pristine *kc__bh_map_decode(const unsigned char *b, size_t len, const kc_digest *id)
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
        kc__bh_map_free(m);
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
        m->slot[i] = (struct kc__bh_slot){.h = h, .path = path, .d = d};
    }
    if (off != end)
        goto bad;
    m->n = (uint32_t)n;
    return m;
bad:
    kc__bh_map_free(m);
    return NULL;
}

/* DIR/bundled of the store and the map's name in it. */
int kc__bh_map_path(const char *store, const kc_digest *id, char *dir, size_t dl, char name[33])
{
    if ((size_t)snprintf(dir, dl, "%s/bundled", store) >= dl)
        return -ENAMETOOLONG;
    kc__digest_hex(id, name);
    return 0;
}

/* The store's map of id: 0 with *m; -ENOENT when there is none; -EBADMSG
 * when there is one that fails a check (not ours, readable or writable by
 * others, not a regular file, corrupt, another identity's). */
int kc__bh_map_load(const char *store, const kc_digest *id, struct kc__pristine **m)
{
    char dir[PATH_MAX], name[33], path[PATH_MAX + 40];
    if (kc__bh_map_path(store, id, dir, sizeof dir, name) != 0)
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
        if (off == want && read(fd, &extra, 1) == 0 &&
            (*m = kc__bh_map_decode(b, want, id)) != NULL)
            rc = 0;
    }
    free(b);
    close(fd);
    return rc;
}

bool kc__local_fs(int fd)
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
