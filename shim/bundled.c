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
#include "../common/clock.h"
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
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static bool digest_eq(const kc_digest *a, const kc_digest *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

#ifndef STATX_MNT_ID
#define STATX_MNT_ID 0x00001000U
#endif

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
        unsigned char *q = cap <= KC__BH_MAP_MAX_BYTES ? realloc(b->p, cap) : NULL;
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
    if (f->n == KC__BH_MAP_MAX_FILES)
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
static int walk(int dfd, char *rel, size_t rl, int depth, struct files *f);

static int walk_entry(void *arg, int dir, const char *name, char *rel, size_t pl, int depth)
{
    struct files *f = arg;
    /* The install's version marker (its time) and lock: no dependency
     * names them (deps.c). */
    if (kc__bh_extra(depth, name))
        return 0;
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    if (S_ISDIR(st.st_mode)) {
        int fd = depth < 64 ? openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                            : (errno = ELOOP, -1);
        return fd < 0 ? -errno : walk(fd, rel, pl, depth + 1, f);
    }
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc;
    kc_digest dg;
    if (fd < 0)
        rc = -errno;
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = -EINVAL;
    else
        rc = kc__digest_fd(fd, &st, &dg);
    if (fd >= 0)
        close(fd);
    return rc == 0 ? add(f, rel, &dg) : rc;
}

static int walk(int dfd, char *rel, size_t rl, int depth, struct files *f)
{
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return -errno;
    }
    return kc__tree_each(d, rel, rl, depth, walk_entry, f);
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
        put(&b, kc__bh_map_magic, sizeof kc__bh_map_magic);
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

static void save(const char *store, const kc_digest *id, const unsigned char *b, size_t len)
{
    char dir[PATH_MAX], name[33];
    if (kc__bh_map_path(store, id, dir, sizeof dir, name) != 0 ||
        kc__private_subdir(dir, true) != 0)
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
    int rc = kc__bh_map_load(store, id, &m);
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
        m = b != NULL ? kc__bh_map_decode(b, len, id) : NULL;
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
    DIR *d = kc__dir_read(fd);
    if (d == NULL) {
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

void kc__pristine_remember(const char *dir, const struct stat *st, const struct kc__pristine *m,
                           const struct timespec *since)
{
    if (m == NULL || strlen(dir) >= PATH_MAX || since->tv_sec == 0)
        return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    bool local = kc__local_fs(fd);
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
 * store's copies of what NVRTC's install wrote (store/local/tree.c): a
 * ready copy the owner made with this host's modes, moved in with one
 * rename per top-level entry, where DIR is on the store's filesystem and
 * takes its modes from the umask alone (no default ACL); else the store's
 * copy (DIR/bundled/<id>.tree, kept once per identity from a DIR NVRTC's
 * install filled), each file a reflink (FICLONE) where the filesystem has
 * them, else a copy, with NVRTC's modes (files 0666, directories 0755,
 * less the umask). Either way every file is checked against the map
 * before it is added (a ready copy where it lies: read, ours, with those
 * modes, dated now), and the version marker is written last, dated now.
 *
 * DIR may be shared: other processes, kcache's or NVRTC's alone, may
 * install into it at the same moment. NVRTC's install takes
 * DIR/.nvrtc_install.lock (flock), installs unless the marker is there,
 * writes the marker last and unlocks; its compile reads DIR only after
 * that. A fill takes the same lock (never waiting: when another holds
 * it, NVRTC's install waits as it would without kcache), fills only a DIR
 * that holds nothing but the lock, and only adds: a directory or file is
 * made (mkdirat, O_EXCL) or moved in (RENAME_NOREPLACE), never over one
 * there, and nothing in DIR is ever removed. A fill that fails leaves what
 * it added, every file checked and no marker: NVRTC's install, which
 * rewrites every file it finds without its marker, completes it into
 * exactly its own. The host gets files of its own it may change or
 * remove; the store's stay as they are. Hard links are not used: the host
 * could write the store's copy through them. */

/* <hex>.tree: the store's copy's name in DIR/bundled. */
static void tree_name(const char *hex, char *out, size_t n)
{
    snprintf(out, n, "%s.tree", hex);
}

/* The map of id, from the process's maps or the store's file, never made. */
static const struct kc__pristine *map_lookup(const char *store, const kc_digest *id)
{
    pthread_mutex_lock(&maps_lock);
    struct kc__pristine *m = maps;
    while (m != NULL && !digest_eq(&m->id, id))
        m = m->next;
    if (m == NULL && kc__bh_map_load(store, id, &m) == 0) {
        m->next = maps;
        maps = m;
    }
    pthread_mutex_unlock(&maps_lock);
    return m;
}

static int open_tree(int bdir, const char *hex)
{
    char name[48];
    tree_name(hex, name, sizeof name);
    int fd = openat(bdir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !private_dir(&st))) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Drops a store copy that failed its check: the next install keeps another. */
static void tree_drop(int bdir, const char *hex)
{
    char name[48], bad[96];
    tree_name(hex, name, sizeof name);
    snprintf(bad, sizeof bad, "%s.bad.%ld", name, (long)getpid());
    if (renameat(bdir, name, bdir, bad) == 0)
        kc__tree_remove(bdir, bad);
}

/* The process's umask, read from /proc/self/status (umask() would change
 * it for the other threads for a moment): false when it cannot be. */
static bool host_umask(mode_t *mask)
{
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    char b[4096];
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0)
        return false;
    b[n] = 0;
    const char *u = strstr(b, "\nUmask:");
    char *end;
    unsigned long v = u != NULL ? strtoul(u + 7, &end, 8) : 0;
    if (u == NULL || end == u + 7 || v > 0777)
        return false;
    *mask = (mode_t)v;
    return true;
}

/* Whether files made in the directory fd take their modes from the umask
 * alone (it has no default ACL). */
static bool umask_alone(int fd)
{
    return fgetxattr(fd, "system.posix_acl_default", NULL, 0) < 0 &&
           (errno == ENODATA || errno == ENOTSUP || errno == EOPNOTSUPP);
}

struct ready_check {
    const struct kc__pristine *m;
    mode_t fm, dm;
    uint32_t n;
    /* The owner's proof (the copy's name): with `proof`, a file whose
     * ctime, and that of every directory between the top and it (`chain`),
     * is older than it is the bytes the owner checked. `proved` counts
     * those. */
    bool proof, chain;
    struct kc__pristine_proof pf;
    uint32_t proved;
};

static int ready_check(int dfd, char *rel, size_t rl, int depth, struct ready_check *rc);

/* Whether the file `name` of dir (rel below the top) is one the owner
 * checked and nothing changed since (older(): a write, truncate, rename
 * or link after the proof's time sets a later ctime): ours, with the
 * umask's mode, one link, a path the map lists; dated now as the read
 * check dates it. 0 when it is; 1 when it must be read; an error. */
static int ready_proved(struct ready_check *ck, int dir, const char *name, const char *rel)
{
    struct stat st;
    kc_digest want;
    if (!ck->proof || !ck->chain || fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != ck->fm ||
        st.st_nlink != 1 || !older(&st, &ck->pf))
        return 1;
    if (!kc__pristine_find(ck->m, rel, &want))
        return -EBADMSG;
    if (utimensat(dir, name, NULL, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    ck->n++;
    ck->proved++;
    return 0;
}

static int ready_entry(void *arg, int dir, const char *name, char *rel, size_t pl, int depth)
{
    struct ready_check *ck = arg;
    /* The install's lock and marker are not moved: the fill made the lock
     * and writes the marker last. */
    if (kc__bh_extra(depth, name))
        return 0;
    int rc = ready_proved(ck, dir, name, rel);
    if (rc <= 0)
        return rc;
    rc = 0;
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = fd < 0 && errno == ELOOP ? -EINVAL : -errno;
    } else if (st.st_uid != geteuid() ||
               (st.st_mode & 07777) != (S_ISDIR(st.st_mode) ? ck->dm : ck->fm)) {
        rc = -EINVAL;
    } else if (S_ISDIR(st.st_mode)) {
        bool chain = ck->chain;
        ck->chain = chain && older(&st, &ck->pf);
        rc = depth < 64 ? ready_check(fd, rel, pl, depth + 1, ck) : -ELOOP;
        ck->chain = chain;
    } else if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
    } else {
        kc_digest got;
        rc = kc__digest_fd(fd, &st, &got);
        if (rc == 0 && !kc__bh_map_check((void *)ck->m, rel, &got))
            rc = -EBADMSG;
        if (rc == 0)
            ck->n++;
    }
    if (rc == 0 && futimens(fd, NULL) != 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    return rc;
}

/* Checks the tree below dfd (not closed here) as a claimed ready copy:
 * every file and directory ours with modes fm and dm, every file the
 * map's (n counts them), each dated now as a file made now would be. */
static int ready_check(int dfd, char *rel, size_t rl, int depth, struct ready_check *ck)
{
    DIR *d = kc__dir_read(dfd);
    return d == NULL ? -ENOMEM : kc__tree_each(d, rel, rl, depth, ready_entry, ck);
}

/* Moves the entry `name` of sdir into ddir under the same name, never over
 * one there (-EEXIST). 0 or a negative errno. */
static int move_in(int sdir, int ddir, const char *name)
{
    if (renameat2(sdir, name, ddir, name, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS)
        return -errno;
    /* A filesystem without RENAME_NOREPLACE: DIR's install lock is held
     * and every installer takes it, so nothing appears between the two. */
    struct stat st;
    if (fstatat(ddir, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
        return -EEXIST;
    return renameat(sdir, name, ddir, name) == 0 ? 0 : -errno;
}

/* A ctime the fill gave (a rename, times set after a stat: multigrain
 * timestamps take the fine clock) can be finer than the coarse clock the
 * fill's time is read from: the fill ends once that clock is past the
 * fine clock's now, so its files are older than the fill
 * (kc__pristine_unchanged). A tick at most. */
static void after_fill(void)
{
    struct timespec t;
    (void)kc_coarse_past_now(&t);
}

/* Fills DIR (dfd: holding only the install's lock, which this process
 * holds) from a ready copy for umask mask: claimed, checked where it lies
 * (every file the map's, ours, with the umask's modes, dated now), its
 * top-level entries moved in (never over one there), the version marker
 * written last. -ENOENT when there is none; -EXDEV when no rename reaches
 * DIR (the copy goes back); another error with *moved false: the copy
 * failed its check (removed), DIR as it was; with *moved true: DIR holds
 * some of the copy's entries, every file checked, and no marker. */
static int ready_fill(int bdir, const char *hex, int dfd, const struct kc__pristine *m, mode_t mask,
                      uint32_t *n, uint32_t *proved, bool *moved)
{
    char claim[128];
    struct timespec since;
    int rfd = kc__ready_claim(bdir, hex, mask, claim, sizeof claim, &since);
    if (rfd < 0)
        return rfd;
    char rel[PATH_MAX];
    rel[0] = 0;
    struct ready_check ck = {.m = m, .fm = 0666 & ~mask, .dm = 0755 & ~mask, .chain = true};
    /* The owner's proof, where the copy lies on a local filesystem with
     * nanosecond times (the claim's rename dated the top directory only). */
    struct stat top;
    if (since.tv_sec != 0 && fstat(rfd, &top) == 0 && kc__local_fs(rfd)) {
        ck.proof = true;
        ck.pf = (struct kc__pristine_proof){.dev = top.st_dev, .since = since};
    }
    int rc = ready_check(rfd, rel, 0, 0, &ck);
    *n = ck.n;
    *proved = ck.proved;
    if (rc == 0 && ck.n != m->n)
        rc = -EBADMSG;
    DIR *d = NULL;
    if (rc == 0 && (d = kc__dir_read(rfd)) == NULL)
        rc = -ENOMEM;
    struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
        const char *name = e->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || kc__bh_extra(0, name))
            continue;
        if ((rc = move_in(rfd, dfd, name)) == 0)
            *moved = true;
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    if (d != NULL)
        closedir(d);
    if (rc == 0)
        rc = kc__bh_marker_put(rfd, dfd);
    close(rfd);
    /* Two mounts of one filesystem (a bind mount: the same device) that
     * ready_usable could not tell apart: no rename crosses them. The copy
     * goes back for a host that can use it. */
    char back[128];
    kc__ready_name(back, sizeof back, hex, "ready", mask,
                   claim + strlen(hex) + sizeof ".claim.000." - 1);
    if (rc == -EXDEV && !*moved && renameat(bdir, claim, bdir, back) == 0)
        return -EXDEV;
    kc__tree_remove(bdir, claim);
    if (rc == 0)
        after_fill();
    return rc;
}

/* Whether a ready copy could fill the directory dfd: on the store's
 * filesystem and mount (a rename reaches it), modes from the umask alone;
 * *mask the umask. */
static bool ready_usable(int bdir, int dfd, mode_t *mask)
{
    struct stat b, d;
    if (fstat(bdir, &b) != 0 || fstat(dfd, &d) != 0 || b.st_dev != d.st_dev)
        return false;
    struct statx bx, dx;
    if (statx(bdir, "", AT_EMPTY_PATH, STATX_MNT_ID, &bx) == 0 &&
        statx(dfd, "", AT_EMPTY_PATH, STATX_MNT_ID, &dx) == 0 &&
        (bx.stx_mask & dx.stx_mask & STATX_MNT_ID) && bx.stx_mnt_id != dx.stx_mnt_id)
        return false;
    return host_umask(mask) && umask_alone(dfd);
}

/* Takes NVRTC's install lock of DIR (dfd) as its install does: the file
 * DIR/.nvrtc_install.lock made as it makes it (0644 less the umask) and
 * flock'd exclusive, without waiting. NVRTC's install and every fill take
 * it, and read DIR only once they hold it and find the version marker,
 * which a fill writes last: no process reads what a fill is adding. The
 * lock's fd; -EBUSY when another process holds it or DIR holds anything
 * but the lock (another process installed, or fills, it). */
static int install_lock(int dfd)
{
    int lk = openat(dfd, KC__BH_LOCK, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (lk < 0)
        return -EBUSY;
    struct stat st;
    bool ok = flock(lk, LOCK_EX | LOCK_NB) == 0 && fstat(lk, &st) == 0 && S_ISREG(st.st_mode) &&
              st.st_uid == geteuid();
    DIR *d = ok ? kc__dir_read(dfd) : NULL;
    ok = ok && d != NULL;
    struct dirent *e;
    while (ok && (errno = 0, e = readdir(d)) != NULL)
        ok = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
             strcmp(e->d_name, KC__BH_LOCK) == 0;
    if (ok && errno != 0)
        ok = false;
    if (d != NULL)
        closedir(d);
    if (!ok) {
        close(lk);
        return -EBUSY;
    }
    return lk;
}

int kc__pristine_fill(const char *store, const kc_digest *id, const char *dir, bool readonly,
                      const struct kc__pristine **map)
{
    const struct kc__pristine *m = map_lookup(store, id);
    int bdir = m != NULL ? kc__bundled_dir(store, false) : -1;
    if (bdir < 0)
        return -ENOENT;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int lk = dfd < 0 ? -EBUSY : install_lock(dfd);
    if (lk < 0) {
        if (dfd >= 0)
            close(dfd);
        close(bdir);
        return lk;
    }
    char hex[33];
    kc__digest_hex(id, hex);
    uint64_t t0 = kc_mono_ns();
    uint32_t n = 0, proved = 0;
    mode_t mask = 0;
    /* (A claim writes the store: not a read-only one.) */
    bool usable = !readonly && ready_usable(bdir, dfd, &mask), moved = false;
    int rc = usable ? ready_fill(bdir, hex, dfd, m, mask, &n, &proved, &moved) : -ENOENT;
    const char *how = "a ready copy";
    if (rc == -EXDEV)
        usable = false;
    if (rc != 0 && !moved) {
        if (rc != -ENOENT && rc != -EXDEV)
            kc_log(KC_LOG_DEBUG, "nvrtc: a ready copy of the bundled headers in %s/bundled: %s",
                   store, strerror(-rc));
        how = "the store's copy";
        proved = 0;
        int sfd = open_tree(bdir, hex);
        /* The tree's copy takes sfd and d2; mk is the marker's source. */
        int mk = sfd >= 0 ? dup(sfd) : -1, d2 = mk >= 0 ? dup(dfd) : -1;
        struct kc__tree_copy c = {.fm = 0666,
                                  .dm = 0755,
                                  .fill = true,
                                  .clone = true,
                                  .check = kc__bh_map_check,
                                  .arg = (void *)m};
        if (sfd < 0)
            rc = -ENOENT;
        else if (d2 < 0)
            rc = -EMFILE, close(sfd);
        else
            rc = kc__tree_copy(sfd, d2, &c);
        n = c.n;
        if (rc == 0 && n != m->n)
            rc = -EBADMSG;
        if (rc == 0)
            rc = kc__bh_marker_put(mk, dfd);
        if (mk >= 0)
            close(mk);
        if (sfd >= 0 && (rc == -EBADMSG || rc == -EINVAL)) {
            /* Nothing that failed was made in DIR: NVRTC's install completes it. */
            kc_log(KC_LOG_WARN,
                   "the store's copy of NVRTC's bundled headers (%s/bundled) differs from its "
                   "map; dropped, NVRTC installs them",
                   store);
            tree_drop(bdir, hex);
        }
    }
    /* Unlocked once the marker is there: an install waiting for it finds
     * DIR installed. */
    close(lk);
    if (rc == 0) {
        *map = m;
        char by[48] = "";
        if (proved > 0)
            snprintf(by, sizeof by, " (%u by their ctime)", proved);
        kc_log(KC_LOG_DEBUG, "nvrtc: bundled headers in %s from %s: %u files%s, %.1f ms", dir, how,
               n, by, (kc_mono_ns() - t0) / 1e6);
        /* The owner makes the next one. */
        if (usable)
            kc__ready_want(bdir, hex, mask);
    }
    close(dfd);
    close(bdir);
    /* Something in DIR the fill did not put there: another process's. */
    return rc == -EEXIST ? -EBUSY : rc;
}

void kc__pristine_keep(const char *store, const kc_digest *id, const char *dir,
                       const struct kc__pristine *m)
{
    int bdir = kc__bundled_dir(store, false);
    if (bdir < 0)
        return;
    char hex[33], name[48], tmp[128];
    kc__digest_hex(id, hex);
    tree_name(hex, name, sizeof name);
    snprintf(tmp, sizeof tmp, "%s.new.%ld.%llx", name, (long)getpid(),
             (unsigned long long)kc_mono_ns());
    int fd = open_tree(bdir, hex);
    if (fd >= 0 || mkdirat(bdir, tmp, 0700) != 0) {
        if (fd >= 0)
            close(fd);
        close(bdir);
        return;
    }
    int sfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int dfd = openat(bdir, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    /* A reflink too: the host's later writes to DIR copy on write. */
    struct kc__tree_copy c = {
        .fm = 0600, .dm = 0700, .clone = true, .check = kc__bh_map_check, .arg = (void *)m};
    int rc = sfd < 0 || dfd < 0 ? -EIO : kc__tree_copy(sfd, dfd, &c);
    if (sfd >= 0 && dfd < 0)
        close(sfd);
    if (dfd >= 0 && sfd < 0)
        close(dfd);
    if (rc == 0 && c.n == m->n && renameat(bdir, tmp, bdir, name) == 0) {
        kc_log(KC_LOG_DEBUG, "nvrtc: the store keeps a copy of NVRTC's bundled headers (%u files)",
               c.n);
        /* Ready copies for this host's next processes, made by the owner
         * this miss starts. */
        int d = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        mode_t mask;
        if (d >= 0 && ready_usable(bdir, d, &mask))
            kc__ready_want(bdir, hex, mask);
        if (d >= 0)
            close(d);
    } else {
        kc__tree_remove(bdir, tmp);
    }
    close(bdir);
}
