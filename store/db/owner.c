/*
 * owner.c: the one process that holds the primary.
 *
 * It takes DIR/owner.lock with flock() (the kernel frees it if the owner
 * dies), drains the spool in rounds (each spool file one write batch, then a
 * synced write, then the generation bump readers watch, then the unlinks),
 * folds hit logs into recency, evicts least-recently-hit entries past the
 * size limit and exits when idle. The tool operations that must write
 * (verify with repair, gc, clear) become the owner for their duration.
 *
 * Every step is idempotent, so an owner killed at any point leaves work the
 * next one redoes: a put file is renamed p- -> d- before it is applied and
 * unlinked only after the synced write, and the next owner applies d- files
 * first.
 */
#include "internal.h"
#include "../../common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lz4.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define SPOOL_FILE_MAX (1ull << 32)
#define ROUND_FILES 256

struct kc__owner {
    struct kc__paths p;
    int lockfd;
    struct kc__db d;
    uint64_t max_size;
    uint64_t unique; /* deduplicated body bytes */
    uint64_t gen_seq;
    volatile uint64_t *gen;
    int spool_bad;
    bool stop;
    struct kc__filter_rw f; /* DIR/filter; unmapped: none (readers fall back) */
    uint64_t hot_bytes;     /* bytes in DIR/hot, as the owner counted them */
    uint64_t hot_max;       /* 0: no hot files */
    bool recovering;        /* inside owner_recover */
};

static int owner_recover(struct kc__owner *o, const char *why);

struct kc__db *kc__owner_db(struct kc__owner *o)
{
    return &o->d;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- spool listing ----------------------------------------------------- */

struct names {
    char **v;
    size_t n, cap;
};

static void names_add(struct names *s, const char *name)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            return;
        s->v = v;
        s->cap = cap;
    }
    char *d = strdup(name);
    if (d != NULL)
        s->v[s->n++] = d;
}

static void names_free(struct names *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct listing {
    struct names put, drain, purge, hits, count, stop, temp;
};

static void listing_free(struct listing *l)
{
    names_free(&l->put);
    names_free(&l->drain);
    names_free(&l->purge);
    names_free(&l->hits);
    names_free(&l->count);
    names_free(&l->stop);
    names_free(&l->temp);
}

static int list_spool(const char *spool, struct listing *l)
{
    memset(l, 0, sizeof *l);
    DIR *d = opendir(spool);
    if (d == NULL)
        return errno == ENOENT ? 0 : -errno;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (n[0] == 0 || n[1] != '-')
            continue;
        switch (n[0]) {
        case 'p': names_add(&l->put, n); break;
        case 'd': names_add(&l->drain, n); break;
        case 'x': names_add(&l->purge, n); break;
        case 'h': names_add(&l->hits, n); break;
        case 'c': names_add(&l->count, n); break;
        case 's': names_add(&l->stop, n); break;
        case 't': names_add(&l->temp, n); break;
        default: break;
        }
    }
    closedir(d);
    qsort(l->purge.v, l->purge.n, sizeof(char *), cmp_str);
    return 0;
}

/* ---- refcounted bodies ------------------------------------------------- */

static size_t rkey(const unsigned char digest[16], unsigned char out[18])
{
    out[0] = 'r';
    out[1] = '/';
    memcpy(out + 2, digest, 16);
    return 18;
}

static int get_ref(struct kc__owner *o, const unsigned char digest[16], uint64_t *cnt,
                   uint64_t *size)
{
    unsigned char rk[18];
    char *v;
    size_t vl;
    int rc = kc__db_get(&o->d, KC__CF_META, rk, rkey(digest, rk), &v, &vl);
    if (rc < 0)
        return rc;
    if (vl != 16) {
        free(v);
        *cnt = 0;
        *size = 0;
        return 0;
    }
    *cnt = kc__get_u64((unsigned char *)v);
    *size = kc__get_u64((unsigned char *)v + 8);
    free(v);
    return 0;
}

static void put_ref(struct kc__owner *o, rocksdb_writebatch_t *wb,
                    const unsigned char digest[16], uint64_t cnt, uint64_t size)
{
    unsigned char rk[18], v[16];
    rkey(digest, rk);
    if (cnt == 0) {
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk);
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], (const char *)digest, 16);
        return;
    }
    kc__put_u64(v, cnt);
    kc__put_u64(v + 8, size);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)rk, sizeof rk, (char *)v,
                              sizeof v);
}

/* Drops one reference to a body (in the batch). */
static void deref(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char digest[16])
{
    uint64_t cnt = 0, size = 0;
    if (get_ref(o, digest, &cnt, &size) != 0 || cnt == 0) {
        /* No refcount: the body is an orphan; drop it. */
        rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], (const char *)digest, 16);
        return;
    }
    if (cnt == 1 && o->unique >= size)
        o->unique -= size;
    put_ref(o, wb, digest, cnt - 1, size);
}

static int write_batch(struct kc__owner *o, rocksdb_writebatch_t *wb, bool sync)
{
    char *err = NULL;
    rocksdb_write(o->d.db, sync ? o->d.wo_sync : o->d.wo, wb, &err);
    int rc = kc__db_err(err, "write");
    if (rc == -EBADMSG) /* a background error: a compaction read a bad block */
        o->d.corrupt = true;
    return rc;
}

/* Makes everything written so far durable and tells readers to catch up. */
static int commit(struct kc__owner *o)
{
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    unsigned char v[8];
    kc__put_u64(v, ++o->gen_seq);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], "g", 1, (char *)v, 8);
    int rc = write_batch(o, wb, true);
    rocksdb_writebatch_destroy(wb);
    if (rc == 0 && o->gen != NULL)
        __atomic_add_fetch(o->gen, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* Deletes one kernel entry (in the batch) and drops its body reference. */
static void delete_kernel(struct kc__owner *o, rocksdb_writebatch_t *wb, const unsigned char *kk,
                          size_t kl, const char *kv, size_t kvl)
{
    rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_KERNELS], (const char *)kk, kl);
    if (kvl == KC__KVAL_LEN)
        deref(o, wb, (const unsigned char *)kv + KC__HDR_LEN);
}

/* ---- hot files and the filter -------------------------------------------
 *
 * DIR/hot/<hash> holds a drained put file (or one written from the
 * database for an entry that is hit), so a hit needs no RocksDB; the
 * filter lets a miss skip it too. Only the owner writes either. A hot
 * file is removed whenever its entry leaves the database or changes.
 * Past the bound, the least recently hit plain files are packed (the put
 * with its body as one LZ4 block, which the shim decodes with libc alone;
 * mode 0400 tells them apart without reading them) and the least recently
 * hit packed ones removed: the newest stay plain, the fastest to serve.
 * Sizes count the blocks files take. */

/* Bytes a file of len bytes takes on disk, when it has not been stat()ed:
 * whole 4 KiB blocks. */
static uint64_t hot_blocks(uint64_t len)
{
    return (len + 4095) & ~4095ull;
}

static void hot_path(struct kc__owner *o, const char *ns, const kc_key *key, char *out,
                     size_t n)
{
    char name[40];
    kc__spool_name(ns, key, 0, name);
    snprintf(out, n, "%s/%s", o->p.hot, name);
}

static void hot_remove(struct kc__owner *o, const char *ns, const kc_key *key)
{
    char path[PATH_MAX];
    hot_path(o, ns, key, path, sizeof path);
    struct stat sb;
    if (lstat(path, &sb) == 0 && unlink(path) == 0 && S_ISREG(sb.st_mode)) {
        uint64_t n = (uint64_t)sb.st_blocks * 512;
        o->hot_bytes = o->hot_bytes > n ? o->hot_bytes - n : 0;
    }
}

/* Removes the hot file of a kernels key (ns \0 key). */
static void hot_remove_kk(struct kc__owner *o, const unsigned char *kk, size_t kl)
{
    char ns[KC__NS_MAX + 1];
    kc_key key;
    if (kc__kkey_split(kk, kl, ns, &key) == 0)
        hot_remove(o, ns, &key);
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

struct hotf {
    char name[33];
    bool packed; /* mode 0400 */
    uint64_t size;
    struct timespec mtime;
};

static int cmp_hotf(const void *a, const void *b)
{
    const struct hotf *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

/* Lists DIR/hot (removing stray temp files of dead writers is
 * clean_stale's job); returns the byte total. */
static uint64_t hot_list(struct kc__owner *o, struct hotf **out, size_t *nout)
{
    uint64_t total = 0;
    struct hotf *v = NULL;
    size_t n = 0, cap = 0;
    DIR *d = opendir(o->p.hot);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            struct stat sb;
            if (!hot_name(e->d_name) ||
                fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
                continue;
            total += (uint64_t)sb.st_blocks * 512;
            if (out == NULL)
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                struct hotf *nv = realloc(v, cap * sizeof *v);
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
static uint64_t hot_limit(struct kc__owner *o)
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
    struct statvfs v;
    if (statvfs(o->p.hot, &v) != 0)
        return false;
    uint64_t free_b = (uint64_t)v.f_bavail * v.f_frsize;
    uint64_t total = (uint64_t)v.f_blocks * v.f_frsize;
    return free_b >= (64ull << 20) && free_b >= total / 20;
}

/* Packs the plain hot file f: 0 with f->size its new size; nonzero when
 * it cannot be read or packing would not save a block (evict it). The
 * packed file replaces the plain one by rename, then gets its mtime back
 * and mode 0400: one that an owner killed in between left 0600 is
 * recognised by its bytes at the next pass. */
static int hot_pack(struct kc__owner *o, struct hotf *f)
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
        int zn = z != NULL ? LZ4_compress_default((const char *)sp.body, z, (int)sp.body_len,
                                                  bound)
                           : 0;
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
static void hot_enforce(struct kc__owner *o)
{
    o->hot_max = hot_limit(o); /* the database grows and shrinks */
    if (o->hot_bytes <= o->hot_max)
        return;
    struct hotf *v;
    size_t n;
    o->hot_bytes = hot_list(o, &v, &n);
    if (v == NULL)
        return;
    qsort(v, n, sizeof *v, cmp_hotf);
    int dfd = open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uint64_t target = o->hot_max / 10 * 9, kept = 0;
    bool full = false;
    for (size_t j = n; dfd >= 0 && j-- > 0;) {
        struct hotf *f = &v[j];
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
        o->hot_bytes = kept;
    }
    free(v);
}

static void hot_clear(struct kc__owner *o)
{
    struct hotf *v;
    size_t n;
    hot_list(o, &v, &n);
    int dfd = open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (size_t i = 0; dfd >= 0 && i < n; i++)
        unlinkat(dfd, v[i].name, 0);
    if (dfd >= 0)
        close(dfd);
    free(v);
    o->hot_bytes = 0;
}

/* Writes the hot file of an entry from the database (a hit on an entry
 * that has none), or refreshes its mtime (recency for hot_enforce). */
static void hot_touch(struct kc__owner *o, const char *ns, const kc_key *key)
{
    if (o->hot_max == 0)
        return;
    char path[PATH_MAX];
    hot_path(o, ns, key, path, sizeof path);
    if (utimensat(AT_FDCWD, path, NULL, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT ||
        !hot_room(o))
        return;
    void *body = NULL;
    size_t len = 0;
    struct kc__hdr h;
    if (kc__lookup(&o->d, ns, key, &body, &len, &h) != 0)
        return;
    struct kc__buf b = {0};
    if (kc__spool_put_encode(&b, ns, key, NULL, &h, body, len) == 0) {
        char name[40];
        kc__spool_name(ns, key, 0, name);
        if (kc__spool_write(o->p.hot, name, b.p, b.len, false) == 0)
            o->hot_bytes += hot_blocks(b.len);
    }
    kc__buf_free(&b);
    free(body);
}

/* Rebuilds DIR/filter from the database: every kernels and sources key. */
static int filter_rebuild(struct kc__owner *o)
{
    uint64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        int cf = pass ? KC__CF_SOURCES : KC__CF_KERNELS;
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it))
            n++;
        rocksdb_iter_destroy(it);
    }
    kc__filter_close(&o->f);
    struct kc__filter_rw f;
    int rc = kc__filter_create(&f, o->p.filter, 4 * n);
    if (rc < 0) {
        unlink(o->p.filter); /* a stale filter could say "absent" */
        return rc;
    }
    for (int pass = 0; pass < 2; pass++) {
        int cf = pass ? KC__CF_SOURCES : KC__CF_KERNELS;
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl;
            const unsigned char *k = (const unsigned char *)rocksdb_iter_key(it, &kl);
            char ns[KC__NS_MAX + 1];
            kc_key key;
            if (cf == KC__CF_KERNELS) {
                if (kc__kkey_split(k, kl, ns, &key) == 0)
                    kc__filter_add(&f, kc__fhash_kernel(ns, &key));
            } else {
                const unsigned char *z = memchr(k, 0, kl);
                if (z != NULL && z != k && (size_t)(z - k) <= KC__NS_MAX &&
                    kl == (size_t)(z - k) + 1 + 16) {
                    kc_digest src;
                    memcpy(ns, k, (size_t)(z - k));
                    ns[z - k] = 0;
                    kc__digest_decode(z + 1, &src);
                    kc__filter_add(&f, kc__fhash_source(ns, &src));
                }
            }
        }
        rocksdb_iter_destroy(it);
    }
    rc = kc__filter_publish(&f, o->p.filter);
    if (rc < 0) {
        kc__filter_close(&f);
        unlink(o->p.filter);
        return rc;
    }
    o->f = f;
    return 0;
}

/* At the start of a session: the filter must hold every key of the
 * database; one an earlier session did not close cleanly (its stamp is
 * not the database's generation) is rebuilt. While this session runs the
 * stamp says so. */
static void filter_begin(struct kc__owner *o)
{
    uint64_t stamp = 0;
    if (kc__filter_open_rw(&o->f, o->p.filter, &stamp) != 0 || stamp != o->gen_seq ||
        kc__filter_stale(&o->f)) {
        if (filter_rebuild(o) < 0)
            return;
    }
    kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
}

/* Before the database is created: it will hold nothing, so an empty filter
 * is right for it. Published first, a reader never finds db/CURRENT
 * without a filter in a new store (that answers "maybe", and the reader
 * would load RocksDB to learn of a miss); filter_begin then takes over. */
static void filter_before_create(struct kc__owner *o)
{
    char cur[4300];
    snprintf(cur, sizeof cur, "%s/CURRENT", o->p.db);
    if (access(cur, F_OK) == 0 || errno != ENOENT)
        return;
    struct kc__filter_rw f;
    if (kc__filter_create(&f, o->p.filter, 0) == 0) {
        kc__filter_publish(&f, o->p.filter);
        kc__filter_close(&f);
    }
}

static void filter_maybe_rebuild(struct kc__owner *o)
{
    if (o->f.map != NULL && kc__filter_stale(&o->f) && filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
}

/* ---- applying spool files ---------------------------------------------- */

/* Applies a put; *applied tells whether it is now the entry (false: the
 * database holds a newer one). */
static int apply_put(struct kc__owner *o, const struct kc__sp_put *sp, bool *applied)
{
    /* The filter first: it must never say "absent" for a key a reader
     * could have stopped finding in the spool. */
    kc__filter_add(&o->f, kc__fhash_kernel(sp->ns, &sp->key));
    if (sp->has_source)
        kc__filter_add(&o->f, kc__fhash_source(sp->ns, &sp->source));
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(sp->ns, &sp->key, kk);
    kc_digest dg = kc_digest_of(sp->body, sp->body_len);
    unsigned char digest[16];
    kc__digest_encode(&dg, digest);
    struct kc__hdr h = sp->hdr;
    bool need_ref = true;

    char *old = NULL;
    size_t oldl = 0;
    int rc = kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &old, &oldl);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (rc == 0) {
        struct kc__hdr oh;
        if (oldl == KC__KVAL_LEN && kc__hdr_decode(old, oldl, &oh) == 0) {
            if (oh.created_ns > h.created_ns) {
                /* A newer version is already in: this one is stale. */
                free(old);
                rocksdb_writebatch_destroy(wb);
                *applied = false;
                return 0;
            }
            h.hits = oh.hits;
            h.last_hit_ns = oh.last_hit_ns;
            if (memcmp(old + KC__HDR_LEN, digest, 16) == 0)
                need_ref = false;
        }
        if (need_ref && oldl == KC__KVAL_LEN)
            deref(o, wb, (unsigned char *)old + KC__HDR_LEN);
        free(old);
    }

    uint64_t cnt = 0, size = 0;
    rc = get_ref(o, digest, &cnt, &size);
    if (rc < 0 && rc != -ENOENT)
        goto out;
    /* The body must be there and whole; rewrite it when it is not. */
    char *bv = NULL;
    size_t bvl = 0;
    bool body_ok = kc__db_get(&o->d, KC__CF_BODIES, digest, 16, &bv, &bvl) == 0 &&
                   bvl == sp->body_len && kc__body_xxh(bv, bvl) == h.body_xxh;
    free(bv);
    if (!body_ok)
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_BODIES], (char *)digest, 16,
                                  (const char *)sp->body, sp->body_len);
    if (need_ref || cnt == 0) {
        if (cnt == 0)
            o->unique += sp->body_len;
        put_ref(o, wb, digest, cnt + 1, sp->body_len);
    }

    unsigned char kv[KC__KVAL_LEN];
    kc__hdr_encode(&h, kv);
    memcpy(kv + KC__HDR_LEN, digest, 16);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_KERNELS], (char *)kk, kl, (char *)kv, sizeof kv);
    unsigned char nk[2 + KC__NS_MAX];
    size_t nsl = strlen(sp->ns);
    nk[0] = 'n';
    nk[1] = '/';
    memcpy(nk + 2, sp->ns, nsl);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)nk, 2 + nsl, "", 0);
    if (sp->has_source) {
        unsigned char sk[KC__NS_MAX + 1 + 16], sv[KC__KEY_LEN];
        size_t sl = kc__skey(sp->ns, &sp->source, sk);
        kc__key_encode(&sp->key, sv);
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_SOURCES], (char *)sk, sl, (char *)sv,
                                  sizeof sv);
    }
    rc = write_batch(o, wb, false);
    *applied = rc == 0;
out:
    rocksdb_writebatch_destroy(wb);
    return rc;
}

/* Reads the spool file `name`: 0 with *buf (malloc'd); 1 when there is
 * nothing to apply (it is gone, or unreadable: counted bad, unlinked with
 * the round); or the error opening DIR/spool. */
static int read_spool(struct kc__owner *o, const char *name, unsigned char **buf, size_t *len)
{
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    int rc = kc__read_file(dfd, name, SPOOL_FILE_MAX, buf, len);
    close(dfd);
    if (rc == -ENOENT)
        return 1;
    if (rc < 0) {
        o->spool_bad++;
        return 1;
    }
    return 0;
}

/* Applies a put file; a bad one is counted and dropped (0). *keep: it is
 * now the entry, and may become its hot file (*size bytes). */
static int apply_put_file(struct kc__owner *o, const char *name, bool *keep, uint64_t *size)
{
    *keep = false;
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = read_spool(o, name, &buf, &len);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    struct kc__sp_put sp;
    if (kc__spool_put_decode(buf, len, &sp) != 0) {
        free(buf);
        o->spool_bad++;
        return 0; /* unlinked with the round */
    }
    *size = len;
    rc = apply_put(o, &sp, keep);
    free(buf);
    return rc;
}

static int apply_purge(struct kc__owner *o, const struct kc__sp_item *it)
{
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    int rc = 0;
    if (it->flags & KC__PF_KEY) {
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(it->ns, &it->key, kk);
        char *kv = NULL;
        size_t kvl = 0;
        if (kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) == 0) {
            struct kc__hdr h;
            bool bad = kvl != KC__KVAL_LEN || kc__hdr_decode(kv, kvl, &h) != 0;
            bool del = bad || h.created_ns <= it->a;
            if (!bad && del && (it->flags & KC__PF_IFBAD)) {
                /* Only a record that is bad here too is purged. */
                void *body;
                size_t blen;
                struct kc__hdr h2;
                int lr = kc__lookup(&o->d, it->ns, &it->key, &body, &blen, &h2);
                if (lr == 0)
                    free(body);
                del = lr == -EBADMSG;
            }
            if (del) {
                delete_kernel(o, wb, kk, kl, kv, kvl);
                kc__filter_note_delete(&o->f);
            }
            free(kv);
        }
        /* The hot file goes with the entry; one that fails its checks goes
         * anyway; one left without an entry goes unless it is newer than
         * the request (a later put, already drained). */
        char path[PATH_MAX];
        hot_path(o, it->ns, &it->key, path, sizeof path);
        unsigned char *hb = NULL;
        struct kc__sp_put hp;
        int hr = kc__put_file_read(path, it->ns, &it->key, &hb, &hp);
        bool drop = hr == -EBADMSG ||
                    (hr == 0 && !(it->flags & KC__PF_IFBAD) && hp.hdr.created_ns <= it->a);
        free(hb);
        if (drop)
            hot_remove(o, it->ns, &it->key);
    }
    if (it->flags & KC__PF_SOURCE) {
        unsigned char sk[KC__NS_MAX + 1 + 16];
        size_t sl = kc__skey(it->ns, &it->source, sk);
        char *sv = NULL;
        size_t svl = 0;
        if (kc__db_get(&o->d, KC__CF_SOURCES, sk, sl, &sv, &svl) == 0) {
            unsigned char want[KC__KEY_LEN];
            kc__key_encode(&it->key, want);
            if (!(it->flags & KC__PF_KEY) || (svl == KC__KEY_LEN && !memcmp(sv, want, svl))) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_SOURCES], (char *)sk, sl);
                kc__filter_note_delete(&o->f);
            }
            free(sv);
        }
    }
    rc = write_batch(o, wb, false);
    rocksdb_writebatch_destroy(wb);
    return rc;
}

static int apply_hit(struct kc__owner *o, const struct kc__sp_item *it)
{
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(it->ns, &it->key, kk);
    char *kv = NULL;
    size_t kvl = 0;
    if (kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) != 0)
        return 0;
    struct kc__hdr h;
    int rc = 0;
    if (kvl == KC__KVAL_LEN && kc__hdr_decode(kv, kvl, &h) == 0) {
        h.hits += it->a;
        if (it->b > h.last_hit_ns)
            h.last_hit_ns = it->b;
        kc__hdr_encode(&h, (unsigned char *)kv);
        char *err = NULL;
        rocksdb_put_cf(o->d.db, o->d.wo, o->d.cf[KC__CF_KERNELS], (char *)kk, kl, kv, kvl, &err);
        rc = kc__db_err(err, "put");
        if (rc == 0)
            hot_touch(o, it->ns, &it->key);
    }
    free(kv);
    return rc;
}

static int apply_count(struct kc__owner *o, const struct kc__sp_item *it)
{
    unsigned char k[2 + KC__NS_MAX];
    size_t n = strlen(it->ns);
    k[0] = 'b';
    k[1] = '/';
    memcpy(k + 2, it->ns, n);
    uint64_t v[KC_N_COUNTERS] = {0};
    char *old = NULL;
    size_t ol = 0;
    if (kc__db_get(&o->d, KC__CF_META, k, 2 + n, &old, &ol) == 0) {
        if (ol == sizeof v)
            for (int i = 0; i < KC_N_COUNTERS; i++)
                v[i] = kc__get_u64((unsigned char *)old + 8 * i);
        free(old);
    }
    uint64_t add[KC_N_COUNTERS];
    kc_counters_to_array(&it->c, add);
    unsigned char out[8 * KC_N_COUNTERS];
    for (int i = 0; i < KC_N_COUNTERS; i++)
        kc__put_u64(out + 8 * i, v[i] + add[i]);
    char *err = NULL;
    rocksdb_put_cf(o->d.db, o->d.wo, o->d.cf[KC__CF_META], (char *)k, 2 + n, (char *)out,
                   sizeof out, &err);
    return kc__db_err(err, "put");
}

/* Applies a purge, hit or counter file; a bad one is counted and dropped. */
static int apply_items_file(struct kc__owner *o, const char *name, int want)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    int rc = read_spool(o, name, &buf, &len);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(buf, len, &type, &p, &n) != 0 || type != want) {
        free(buf);
        o->spool_bad++;
        return 0;
    }
    const unsigned char *end = p + n;
    struct kc__sp_item it;
    int r;
    rc = 0;
    while (rc == 0 && (r = kc__spool_item_next(type, &p, end, &it)) > 0) {
        if (type == KC__SP_PURGE)
            rc = apply_purge(o, &it);
        else if (type == KC__SP_HITS)
            rc = apply_hit(o, &it);
        else
            rc = apply_count(o, &it);
    }
    free(buf);
    return rc;
}

static void unlink_all(struct kc__owner *o, char **names, size_t n)
{
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    for (size_t i = 0; i < n; i++)
        unlinkat(dfd, names[i], 0);
    close(dfd);
}

/* After the batch holding them is synced: each applied put file becomes
 * its entry's hot file (rename; the filter already has its key), the rest
 * are removed. */
static void retire_puts(struct kc__owner *o, char **names, const bool *keep,
                        const uint64_t *size, size_t n)
{
    int sfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int hfd = o->hot_max > 0 && hot_room(o) ? open(o->p.hot, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                                             : -1;
    for (size_t i = 0; sfd >= 0 && i < n; i++) {
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
    hot_enforce(o);
}

static int drain_once(struct kc__owner *o, uint64_t *count)
{
    struct listing l;
    uint64_t done = 0;
    int rc = list_spool(o->p.spool, &l);
    if (rc < 0)
        return rc;
    if (l.stop.n > 0) {
        o->stop = true;
        unlink_all(o, l.stop.v, l.stop.n);
    }
    /* Puts a killed owner claimed and may not have committed: first. */
    for (size_t i = 0; rc == 0 && i < l.drain.n; i += ROUND_FILES) {
        size_t end = i + ROUND_FILES < l.drain.n ? i + ROUND_FILES : l.drain.n;
        bool keep[ROUND_FILES];
        uint64_t size[ROUND_FILES];
        for (size_t j = i; rc == 0 && j < end; j++)
            rc = apply_put_file(o, l.drain.v[j], &keep[j - i], &size[j - i]);
        if (rc == 0 && (rc = commit(o)) == 0) {
            retire_puts(o, l.drain.v + i, keep, size, end - i);
            done += end - i;
        }
    }
    for (size_t i = 0; rc == 0 && i < l.put.n; i += ROUND_FILES) {
        size_t end = i + ROUND_FILES < l.put.n ? i + ROUND_FILES : l.put.n;
        size_t claimed = 0;
        char *cl[ROUND_FILES];
        bool keep[ROUND_FILES];
        uint64_t size[ROUND_FILES];
        for (size_t j = i; rc == 0 && j < end; j++) {
            char *name = l.put.v[j];
            char from[PATH_MAX], to[PATH_MAX];
            snprintf(from, sizeof from, "%s/%s", o->p.spool, name);
            name[0] = 'd';
            snprintf(to, sizeof to, "%s/%s", o->p.spool, name);
            if (rename(from, to) != 0) {
                name[0] = 'p';
                continue;
            }
            cl[claimed] = name;
            rc = apply_put_file(o, name, &keep[claimed], &size[claimed]);
            claimed++;
        }
        if (rc == 0 && claimed > 0 && (rc = commit(o)) == 0) {
            retire_puts(o, cl, keep, size, claimed);
            done += claimed;
        }
    }
    struct names *rest[3] = {&l.purge, &l.hits, &l.count};
    const int types[3] = {KC__SP_PURGE, KC__SP_HITS, KC__SP_COUNT};
    size_t nrest = 0;
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; rc == 0 && i < rest[t]->n; i++, nrest++)
            rc = apply_items_file(o, rest[t]->v[i], types[t]);
    if (rc == 0 && nrest > 0 && (rc = commit(o)) == 0) {
        for (int t = 0; t < 3; t++)
            unlink_all(o, rest[t]->v, rest[t]->n);
        done += nrest;
    }
    listing_free(&l);
    hot_enforce(o); /* hit logs may have written hot files */
    if (rc == 0)
        filter_maybe_rebuild(o);
    if (count != NULL)
        *count = done;
    return rc;
}

/* A database RocksDB reports as corrupt is recovered (owner_recover) and
 * the drain done again: a bad table must never wedge the spool. */
int kc__owner_drain(struct kc__owner *o, uint64_t *count)
{
    int rc = drain_once(o, count);
    if (o->d.corrupt && !o->recovering) {
        uint64_t more = 0;
        rc = owner_recover(o, "drain");
        if (rc == 0)
            rc = drain_once(o, &more);
        if (count != NULL)
            *count += more;
    }
    return rc;
}

/* ---- eviction ---------------------------------------------------------- */

struct victim {
    unsigned char *k;
    size_t kl;
    uint64_t recency;
};

static int cmp_victim(const void *a, const void *b)
{
    const struct victim *x = a, *y = b;
    return x->recency < y->recency ? -1 : x->recency > y->recency;
}

static void compact(struct kc__owner *o)
{
    for (int cf = KC__CF_KERNELS; cf < KC__N_CF; cf++)
        rocksdb_compact_range_cf(o->d.db, o->d.cf[cf], NULL, 0, NULL, 0);
}

/* kc__db_cf_runs, and the family's tables' bytes. */
static bool cf_runs(struct kc__owner *o, int cf, uint64_t *runs, uint64_t *l0, uint64_t *bytes)
{
    return kc__db_cf_runs(o->d.db, o->d.cf[cf], runs, l0) &&
           rocksdb_property_int_cf(o->d.db, o->d.cf[cf], "rocksdb.total-sst-files-size", bytes) == 0;
}

/* At the end of a session: a get probes every L0 table and every level of
 * the kernels and bodies families (a table lookup and a filter each, about
 * 0.5 us here), and RocksDB compacts in the background only while the
 * owner lives. A session that ended with its compactions pending left
 * them for the next one: after a fill of a million entries, 11 L0 tables
 * and an oversized L1, and a get took 33 us instead of 27 us in one run.
 * So the session first lets RocksDB finish what it has scheduled (at most
 * KC__SETTLE_MS; the work is what the next session would do anyway), and
 * a family still in more than one sorted run while under 32 MiB (the usual
 * store: a second at most) is compacted into one. An owner asked to stop
 * by a tool operation skips all this (the tool's own session settles).
 * Never in a host process: only the owner, the tool and
 * kc_store_api()->drain end sessions. */
#define KC__SETTLE_MS 120000

/* Whether a tool operation asked this owner to stop (an s- file). */
static bool stop_asked(struct kc__owner *o)
{
    DIR *d = opendir(o->p.spool);
    struct dirent *e;
    bool asked = false;
    while (!asked && d != NULL && (e = readdir(d)) != NULL)
        asked = e->d_name[0] == 's' && e->d_name[1] == '-';
    if (d != NULL)
        closedir(d);
    return asked;
}

static void settle_levels(struct kc__owner *o)
{
    static const int cfs[] = {KC__CF_KERNELS, KC__CF_BODIES};
    /* RocksDB merges L0 into L1 only from 4 tables on: each session's
     * flush adds one, and up to 3 stayed for every get to probe. From 2,
     * this session asks for the merge (it rewrites L1, at most 256 MB). */
    for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
        uint64_t runs = 0, l0 = 0, bytes = 0;
        if (!o->stop && cf_runs(o, cfs[i], &runs, &l0, &bytes) && l0 >= 2) {
            const char *k[] = {"level0_file_num_compaction_trigger"}, *v[] = {"1"};
            char *err = NULL;
            rocksdb_set_options_cf(o->d.db, o->d.cf[cfs[i]], 1, k, v, &err);
            free(err);
        }
    }
    uint64_t t0 = kc_mono_ns();
    for (int round = 0;; round++) {
        /* A tool waiting for the lock (15 s) goes first. */
        if (o->stop || (round % 5 == 4 && stop_asked(o)))
            return;
        uint64_t pending = 0, running = 0;
        if (rocksdb_property_int(o->d.db, "rocksdb.compaction-pending", &pending) != 0 ||
            rocksdb_property_int(o->d.db, "rocksdb.num-running-compactions", &running) != 0)
            break;
        if (pending == 0 && running == 0)
            break;
        if (kc_mono_ns() - t0 > (uint64_t)KC__SETTLE_MS * 1000000u)
            return;
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    for (size_t i = 0; i < sizeof cfs / sizeof cfs[0]; i++) {
        uint64_t runs = 0, l0 = 0, bytes = 0;
        if (cf_runs(o, cfs[i], &runs, &l0, &bytes) && runs > 1 && bytes < (32ull << 20))
            rocksdb_compact_range_cf(o->d.db, o->d.cf[cfs[i]], NULL, 0, NULL, 0);
    }
}

static uint64_t count_unique(struct kc__owner *o)
{
    uint64_t total = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_META]);
    for (rocksdb_iter_seek(it, "r/", 2); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        if (kl < 2 || k[0] != 'r' || k[1] != '/')
            break;
        if (vl == 16)
            total += kc__get_u64((const unsigned char *)v + 8);
    }
    rocksdb_iter_destroy(it);
    return total;
}

/* Evicts least-recently-hit entries until o->unique <= target. */
static int evict(struct kc__owner *o, uint64_t target, uint64_t *evicted, kc_progress_fn progress,
                 void *arg)
{
    if (o->unique <= target)
        return 0;
    struct victim *v = NULL;
    size_t n = 0, cap = 0;
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_KERNELS]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *val = rocksdb_iter_value(it, &vl);
        struct kc__hdr h;
        uint64_t rec = 0;
        if (vl == KC__KVAL_LEN && kc__hdr_decode(val, vl, &h) == 0)
            rec = h.last_hit_ns > h.created_ns ? h.last_hit_ns : h.created_ns;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            struct victim *nv = realloc(v, cap * sizeof *v);
            if (nv == NULL)
                break;
            v = nv;
        }
        v[n].k = malloc(kl);
        if (v[n].k == NULL)
            break;
        memcpy(v[n].k, k, kl);
        v[n].kl = kl;
        v[n].recency = rec;
        n++;
    }
    rocksdb_iter_destroy(it);
    qsort(v, n, sizeof *v, cmp_victim);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0 && o->unique > target; i++) {
        char *kv = NULL;
        size_t kvl = 0;
        if (kc__db_get(&o->d, KC__CF_KERNELS, v[i].k, v[i].kl, &kv, &kvl) != 0)
            continue;
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        delete_kernel(o, wb, v[i].k, v[i].kl, kv, kvl);
        rc = write_batch(o, wb, false);
        rocksdb_writebatch_destroy(wb);
        free(kv);
        hot_remove_kk(o, v[i].k, v[i].kl);
        kc__filter_note_delete(&o->f);
        if (evicted)
            (*evicted)++;
        if (progress && (i & 255) == 0)
            progress(i, n, arg);
    }
    for (size_t i = 0; i < n; i++)
        free(v[i].k);
    free(v);
    if (rc == 0)
        rc = commit(o);
    return rc;
}

/* Drops sources entries whose kernel is gone. */
static void prune_sources(struct kc__owner *o)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_SOURCES]);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        const char *z = memchr(k, 0, kl);
        bool drop = z == NULL || vl != KC__KEY_LEN || (size_t)(z - k) > KC__NS_MAX;
        if (!drop) {
            unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
            size_t nsl = (size_t)(z - k);
            memcpy(kk, k, nsl + 1);
            memcpy(kk + nsl + 1, v, KC__KEY_LEN);
            char *kv;
            size_t kvl;
            if (kc__db_get(&o->d, KC__CF_KERNELS, kk, nsl + 1 + KC__KEY_LEN, &kv, &kvl) == 0)
                free(kv);
            else
                drop = true;
        }
        if (drop) {
            rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_SOURCES], k, kl);
            kc__filter_note_delete(&o->f);
        }
    }
    rocksdb_iter_destroy(it);
    write_batch(o, wb, false);
    rocksdb_writebatch_destroy(wb);
}

int kc__owner_gc(struct kc__owner *o, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg)
{
    struct kc_gc_report r = {0};
    if (max_size == 0)
        max_size = o->max_size;
    r.bytes_before = o->unique;
    int rc = evict(o, max_size, &r.evicted, progress, arg);
    if (rc == 0) {
        prune_sources(o);
        rc = commit(o);
        compact(o);
        if (rc == 0 && o->f.map != NULL && filter_rebuild(o) == 0)
            kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    }
    if (o->d.corrupt && !o->recovering) {
        int rr = owner_recover(o, "gc");
        if (rc == 0 || rc == -EBADMSG)
            rc = rr;
    }
    r.bytes_after = o->unique;
    if (rep)
        *rep = r;
    return rc;
}

/* ---- verify and clear -------------------------------------------------- */

struct refc {
    unsigned char d[16];
    uint64_t n;
};

static int cmp_refc(const void *a, const void *b)
{
    return memcmp(((const struct refc *)a)->d, ((const struct refc *)b)->d, 16);
}

/* Checks every hot file against the database: it must decode, hold the
 * key its name says, and match the entry's body and creation time. Bad
 * ones are counted as bad spool files and, with repair, removed. */
static void hot_verify(struct kc__owner *o, int repair, struct kc_verify_report *r)
{
    struct hotf *v;
    size_t n;
    hot_list(o, &v, &n);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o->p.hot, v[i].name);
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        bool bad = kc__hot_file_read(o->p.hot, v[i].name, &buf, &sp) != 0;
        if (!bad) {
            unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
            size_t kl = kc__kkey(sp.ns, &sp.key, kk);
            char *kv = NULL;
            size_t kvl = 0;
            struct kc__hdr h;
            bad = kc__db_get(&o->d, KC__CF_KERNELS, kk, kl, &kv, &kvl) != 0 ||
                  kvl != KC__KVAL_LEN || kc__hdr_decode(kv, kvl, &h) != 0 ||
                  h.body_xxh != sp.hdr.body_xxh || h.created_ns != sp.hdr.created_ns;
            free(kv);
        }
        free(buf);
        /* Counted with the spool files (a hot file is a drained one). */
        if (bad) {
            r->spool_bad++;
            if (repair && unlink(path) == 0)
                o->hot_bytes = o->hot_bytes > v[i].size ? o->hot_bytes - v[i].size : 0;
        }
    }
    free(v);
}

static int verify_once(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                       kc_progress_fn progress, void *arg)
{
    struct kc_verify_report r = {0};
    r.spool_bad = (uint64_t)o->spool_bad;
    struct refc *refs = NULL;
    size_t nref = 0, cap = 0;
    int rc = 0;
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_KERNELS]);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_key key;
        struct kc__hdr h;
        bool bad = kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0 ||
                   vl != KC__KVAL_LEN || kc__hdr_decode(v, vl, &h) != 0;
        if (!bad) {
            char *bv = NULL;
            size_t bvl = 0;
            bad = kc__db_get(&o->d, KC__CF_BODIES, v + KC__HDR_LEN, 16, &bv, &bvl) != 0 ||
                  bvl != h.body_size || kc__body_xxh(bv, bvl) != h.body_xxh;
            free(bv);
        }
        r.checked++;
        if (bad) {
            r.bad++;
            if (repair) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_KERNELS], k, kl);
                r.purged++;
            }
        } else {
            if (nref == cap) {
                cap = cap ? 2 * cap : 1024;
                struct refc *nr = realloc(refs, cap * sizeof *refs);
                if (nr == NULL) {
                    rc = -ENOMEM;
                    break;
                }
                refs = nr;
            }
            memcpy(refs[nref].d, v + KC__HDR_LEN, 16);
            refs[nref].n = 1;
            nref++;
        }
        if (progress && (r.checked & 1023) == 0)
            progress(r.checked, 0, arg);
    }
    if (kc__db_iter_err(&o->d, it) == -EBADMSG && rc == 0)
        rc = -EBADMSG;
    rocksdb_iter_destroy(it);
    if (rc == 0 && o->d.corrupt)
        rc = -EBADMSG; /* a body read hit a bad block: recover first */
    if (rc == 0 && repair) {
        /* Rebuild the refcounts from the kernels that are good, and drop
         * bodies nothing references. */
        qsort(refs, nref, sizeof *refs, cmp_refc);
        size_t m = 0;
        for (size_t i = 0; i < nref; i++) {
            if (m > 0 && memcmp(refs[m - 1].d, refs[i].d, 16) == 0)
                refs[m - 1].n++;
            else
                refs[m++] = refs[i];
        }
        nref = m;
        rocksdb_iterator_t *bi =
            rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[KC__CF_BODIES]);
        uint64_t unique = 0;
        for (rocksdb_iter_seek_to_first(bi); rocksdb_iter_valid(bi); rocksdb_iter_next(bi)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(bi, &kl);
            rocksdb_iter_value(bi, &vl);
            struct refc want;
            struct refc *f = NULL;
            if (kl == 16) {
                memcpy(want.d, k, 16);
                f = bsearch(&want, refs, nref, sizeof *refs, cmp_refc);
            }
            if (f == NULL) {
                rocksdb_writebatch_delete_cf(wb, o->d.cf[KC__CF_BODIES], k, kl);
                if (kl == 16)
                    put_ref(o, wb, (const unsigned char *)k, 0, 0);
            } else {
                uint64_t cnt = 0, size = 0;
                get_ref(o, f->d, &cnt, &size);
                if (cnt != f->n || size != vl)
                    put_ref(o, wb, f->d, f->n, vl);
                unique += vl;
            }
        }
        kc__db_iter_err(&o->d, bi);
        rocksdb_iter_destroy(bi);
        o->unique = unique;
        rc = write_batch(o, wb, false);
        if (rc == 0)
            rc = commit(o);
    }
    if (rc == 0) {
        hot_verify(o, repair, &r);
        if (repair && filter_rebuild(o) == 0)
            kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    }
    rocksdb_writebatch_destroy(wb);
    free(refs);
    if (rep)
        *rep = r;
    return rc;
}

int kc__owner_verify(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg)
{
    int rc = verify_once(o, repair, rep, progress, arg);
    if (repair && o->d.corrupt && !o->recovering) {
        rc = owner_recover(o, "verify");
        if (rc == 0)
            rc = verify_once(o, repair, rep, progress, arg);
    }
    return rc;
}

int kc__owner_clear(struct kc__owner *o)
{
    int rc = 0;
    for (int cf = KC__CF_KERNELS; cf < KC__N_CF && rc == 0; cf++) {
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl;
            const char *k = rocksdb_iter_key(it, &kl);
            /* Counters are statistics, not entries: they stay. */
            if (cf == KC__CF_META && kl >= 2 && k[0] == 'b' && k[1] == '/')
                continue;
            rocksdb_writebatch_delete_cf(wb, o->d.cf[cf], k, kl);
        }
        rocksdb_iter_destroy(it);
        rc = write_batch(o, wb, false);
        rocksdb_writebatch_destroy(wb);
    }
    o->unique = 0;
    hot_clear(o);
    if (rc == 0)
        rc = commit(o);
    compact(o);
    if (rc == 0 && filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    return rc;
}

/* ---- recovering a corrupt database --------------------------------------
 *
 * RocksDB reported a corruption (a table's block checksum, a truncated
 * table, CURRENT or MANIFEST unreadable) at open, in a read or a write.
 * Records carry their own checksums, so nothing wrong was ever served; but
 * a database that fails every drain wedges the spool. Recovery: RocksDB's
 * repair (tables that fail their checks set aside, the MANIFEST rebuilt
 * from the rest), then a full read of every column family; if either
 * fails, the database is moved aside and a fresh one started. Then the
 * hot files (checksummed copies of drained entries) are put back into
 * the database, refcounts are rebuilt and bad entries purged (verify with
 * repair), and the filter is rebuilt. Entries lost are misses, compiled
 * again. Readers are told to reopen (a new epoch). */

/* Reads every key and value of every column family: 0, or the error the
 * read stopped on. */
static int db_scan(struct kc__owner *o)
{
    for (int cf = 0; cf < KC__N_CF; cf++) {
        rocksdb_iterator_t *it = rocksdb_create_iterator_cf(o->d.db, o->d.ro, o->d.cf[cf]);
        for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t l;
            rocksdb_iter_value(it, &l);
        }
        int rc = kc__db_iter_err(&o->d, it);
        rocksdb_iter_destroy(it);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Puts each hot file whose entry the database lacks back into it; removes
 * hot files that fail their checks. Returns how many it put back. */
static uint64_t hot_salvage(struct kc__owner *o)
{
    struct hotf *v;
    size_t n;
    uint64_t put = 0;
    hot_list(o, &v, &n);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o->p.hot, v[i].name);
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        if (kc__hot_file_read(o->p.hot, v[i].name, &buf, &sp) != 0) {
            unlink(path);
            continue;
        }
        void *body = NULL;
        size_t blen;
        struct kc__hdr h;
        bool applied = false;
        if (kc__lookup(&o->d, sp.ns, &sp.key, &body, &blen, &h) != 0 &&
            apply_put(o, &sp, &applied) == 0 && applied)
            put++;
        free(body);
        free(buf);
    }
    free(v);
    return put;
}

static int owner_recover(struct kc__owner *o, const char *why)
{
    o->recovering = true;
    kc__db_close(&o->d);
    kc__filter_close(&o->f);
    const char *how = "repaired";
    char *err = NULL;
    int rc = kc__db_repair(o->p.db, &err);
    char lost[PATH_MAX];
    snprintf(lost, sizeof lost, "%s/lost", o->p.db);
    kc__rm_rf(lost); /* the tables repair set aside */
    if (rc == 0)
        rc = kc__db_open(&o->d, o->p.db, NULL, NULL);
    if (rc == 0 && (rc = db_scan(o)) < 0)
        kc__db_close(&o->d);
    if (rc < 0) {
        /* Beyond repair: set it aside and start afresh. */
        how = "replaced by a new one";
        char aside[PATH_MAX];
        snprintf(aside, sizeof aside, "%s.bad-%d-%016llx", o->p.db, (int)getpid(),
                 (unsigned long long)kc__rand64());
        if (rename(o->p.db, aside) == 0)
            kc__rm_rf(aside);
        else
            kc__rm_rf(o->p.db);
        rc = kc__db_open(&o->d, o->p.db, NULL, NULL);
    }
    if (rc < 0) {
        kc_log(KC_LOG_WARN, "the database in %s is corrupt and could not be rebuilt (%s)",
               o->p.dir, strerror(-rc));
        free(err);
        o->recovering = false;
        return rc;
    }
    if (o->gen != NULL)
        __atomic_add_fetch(o->gen + 1, 1, __ATOMIC_SEQ_CST); /* readers reopen */
    o->gen_seq = 0;
    char *g;
    size_t gl;
    if (kc__db_get(&o->d, KC__CF_META, "g", 1, &g, &gl) == 0) {
        if (gl == 8)
            o->gen_seq = kc__get_u64((unsigned char *)g);
        free(g);
    }
    o->unique = count_unique(o);
    /* The filter must cover what hot_salvage puts back before it is
     * rebuilt from the database (verify below). */
    if (filter_rebuild(o) == 0)
        kc__filter_set_stamp(&o->f, KC__FILTER_LIVE);
    uint64_t salvaged = hot_salvage(o);
    if (salvaged > 0)
        commit(o);
    struct kc_verify_report r = {0};
    rc = verify_once(o, 1, &r, NULL, NULL);
    o->hot_max = hot_limit(o);
    o->hot_bytes = hot_list(o, NULL, NULL);
    kc_log(KC_LOG_WARN,
           "the database in %s failed its checks during %s (%s); %s: %llu entries kept "
           "(%llu put back from hot files, %llu bad purged); entries lost are compiled again",
           o->p.dir, why, err ? err : "corruption", how,
           (unsigned long long)(r.checked - r.purged), (unsigned long long)salvaged,
           (unsigned long long)r.purged);
    free(err);
    o->recovering = false;
    return rc;
}

/* ---- lifetime ---------------------------------------------------------- */

/* Removes secondaries and temp files of processes that are gone. */
static void clean_stale(struct kc__owner *o)
{
    kc__dir_sweep(o->p.sec, "");
    /* Temp files of dead writers: host processes' in the spool, a killed
     * owner's in the spool and DIR/hot. */
    const char *dirs[] = {o->p.spool, o->p.hot};
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        if (d == NULL)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == 't' && e->d_name[1] == '-' && kc__pid_gone(e->d_name + 2))
                unlinkat(dirfd(d), e->d_name, 0);
        }
        closedir(d);
    }
}

static void ask_stop(struct kc__owner *o)
{
    char name[64];
    snprintf(name, sizeof name, "s-%d-%016llx", (int)getpid(), (unsigned long long)kc__rand64());
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_HITS);
    kc__spool_end(&b);
    kc__spool_write(o->p.spool, name, b.p, b.len, false);
    kc__buf_free(&b);
}

static int lock_owner(struct kc__owner *o, int wait_ms, bool stop_other)
{
    o->lockfd = open(o->p.lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (o->lockfd < 0)
        return -errno;
    uint64_t deadline = kc_mono_ns() + (uint64_t)wait_ms * 1000000u, last_ask = 0;
    for (;;) {
        if (flock(o->lockfd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        uint64_t now = kc_mono_ns();
        if (now >= deadline)
            return -EBUSY;
        if (stop_other && now - last_ask > 500000000u) {
            ask_stop(o);
            last_ask = now;
        }
        sleep_ms(5);
    }
}

static void map_gen(struct kc__owner *o)
{
    int fd = open(o->p.gen, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    struct stat sb;
    if (fstat(fd, &sb) == 0 && sb.st_size < 4096 && ftruncate(fd, 4096) != 0) {
        close(fd);
        return;
    }
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED)
        o->gen = m;
}

/* create: make the cache directory when missing (not for an owner a store
 * started: the directory is gone with its store, and stays gone). */
static int owner_begin(const char *dir, uint64_t max_size, int wait_ms, bool stop_other,
                       bool create, struct kc__owner **out)
{
    struct kc__owner *o = calloc(1, sizeof *o);
    if (o == NULL)
        return -ENOMEM;
    o->lockfd = -1;
    kc__paths_init(&o->p, dir);
    o->max_size = max_size ? max_size : KC_DEFAULT_MAX_SIZE;
    int rc = kc__private_dir(dir, create);
    if (rc == 0)
        rc = kc__private_subdir(o->p.spool, true);
    if (rc == 0)
        rc = kc__private_subdir(o->p.sec, true);
    if (rc == 0)
        rc = kc__private_subdir(o->p.hot, true);
    if (rc == 0)
        rc = lock_owner(o, wait_ms, stop_other);
    bool corrupt = false;
    if (rc == 0) {
        filter_before_create(o);
        char *why = NULL;
        rc = kc__db_open(&o->d, o->p.db, NULL, &why);
        if (rc == -EBADMSG) {
            /* Recovered below, once the session is set up. */
            kc_log(KC_LOG_DEBUG, "opening %s: %s", o->p.db, why ? why : "corrupt");
            corrupt = true;
            rc = 0;
        }
        free(why);
    }
    if (rc < 0) {
        kc__owner_end(o);
        return rc;
    }
    map_gen(o);
    if (corrupt) {
        rc = owner_recover(o, "open");
        if (rc < 0) {
            kc__owner_end(o);
            return rc;
        }
    }
    if (o->gen != NULL)
        __atomic_add_fetch(o->gen + 1, 1, __ATOMIC_SEQ_CST); /* a new session */
    o->unique = count_unique(o);
    char *v;
    size_t vl;
    if (kc__db_get(&o->d, KC__CF_META, "g", 1, &v, &vl) == 0) {
        if (vl == 8)
            o->gen_seq = kc__get_u64((unsigned char *)v);
        free(v);
    }
    clean_stale(o);
    filter_begin(o);
    o->hot_max = hot_limit(o);
    o->hot_bytes = hot_list(o, NULL, NULL);
    if (o->d.corrupt && (rc = owner_recover(o, "session start")) < 0) {
        kc__owner_end(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* Past the limit, evicts down to 90% of it (as ccache does, so the next
 * few puts do not each evict). */
static int enforce_limit(struct kc__owner *o)
{
    if (o->unique <= o->max_size)
        return 0;
    int rc = evict(o, o->max_size / 10 * 9, NULL, NULL, NULL);
    if (rc == 0) {
        prune_sources(o);
        compact(o);
        filter_maybe_rebuild(o);
    }
    return rc;
}

int kc__owner_begin(const char *dir, uint64_t max_size, int wait_ms, struct kc__owner **out)
{
    struct kc__owner *o;
    int rc = owner_begin(dir, max_size, wait_ms, true, true, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_drain(o, NULL);
    if (rc == 0)
        rc = enforce_limit(o);
    if (rc < 0) {
        kc__owner_end(o);
        return rc;
    }
    *out = o;
    return 0;
}

void kc__owner_end(struct kc__owner *o)
{
    if (o == NULL)
        return;
    if (o->d.db != NULL) {
        /* Every column family, not only the default one: a session that
         * left its puts in the WAL would make each reader replay it. */
        if (kc__db_flush_all(&o->d) == 0 && !o->d.corrupt)
            settle_levels(o);
        kc__db_close(&o->d);
        /* The filter holds every key up to this generation. */
        kc__filter_set_stamp(&o->f, o->gen_seq);
        /* The single-flight lock files of compiles that are over. */
        kc__locks_prune(o->p.dir);
    }
    kc__filter_close(&o->f);
    if (o->gen != NULL) {
        __atomic_add_fetch(o->gen, 1, __ATOMIC_SEQ_CST);
        munmap((void *)o->gen, 4096);
    }
    if (o->lockfd >= 0) {
        flock(o->lockfd, LOCK_UN);
        close(o->lockfd);
    }
    free(o);
}

static uint64_t env_max_size(void)
{
    const char *s = kc_config_get(KC_VAR_MAXSIZE);
    uint64_t v = 0;
    if (s != NULL && s[0] != 0 && kc_parse_size(s, &v) == 0)
        return v;
    return 0;
}

int kc__owner_run(const struct kc_store_options *opts, int idle_ms)
{
    if (opts == NULL || opts->dir == NULL)
        return -EINVAL;
    if (opts->readonly)
        return -EROFS;
    const char *det = kc_config_get(KC_VAR_OWNER_DETACH);
    bool spawned = det != NULL && strcmp(det, "1") == 0;
    if (spawned) {
        /* Started by a store: leave its process tree so the host never
         * has a child of ours to reap. */
        unsetenv("KCACHE_OWNER_DETACH");
        pid_t pid = fork();
        if (pid < 0)
            return -errno;
        if (pid > 0)
            _exit(0);
        setsid();
    }
    uint64_t max = opts->max_size ? opts->max_size : env_max_size();
    if (max == 0)
        max = KC_DEFAULT_MAX_SIZE;
    if (idle_ms < 0)
        idle_ms = 0;

    struct kc__owner *o;
    int rc = owner_begin(opts->dir, max, 300, false, !spawned, &o);
    if (rc < 0)
        return rc;
    int ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (ino >= 0)
        inotify_add_watch(ino, o->p.spool, IN_MOVED_TO | IN_CLOSE_WRITE);
    uint64_t last_work = kc_mono_ns();
    for (;;) {
        uint64_t n = 0;
        rc = kc__owner_drain(o, &n);
        if (rc < 0)
            break;
        if (n > 0) {
            last_work = kc_mono_ns();
            if ((rc = enforce_limit(o)) < 0)
                break;
        }
        if (o->stop)
            break;
        uint64_t idle = (kc_mono_ns() - last_work) / 1000000u;
        if (idle >= (uint64_t)idle_ms) {
            /* Release, then look again: a writer that saw the lock held
             * just before we let go relies on us to see its file. */
            char dir[4096], spool[4200];
            snprintf(dir, sizeof dir, "%s", o->p.dir);
            snprintf(spool, sizeof spool, "%s", o->p.spool);
            kc__owner_end(o);
            o = NULL;
            if (!kc__spool_pending(spool))
                break;
            if (owner_begin(dir, max, 0, false, !spawned, &o) < 0) {
                o = NULL;
                break;
            }
            last_work = kc_mono_ns();
            continue;
        }
        uint64_t wait = (uint64_t)idle_ms - idle;
        if (wait > 200)
            wait = 200;
        if (ino >= 0) {
            struct pollfd pfd = {.fd = ino, .events = POLLIN};
            if (poll(&pfd, 1, (int)wait) > 0) {
                char buf[4096];
                while (read(ino, buf, sizeof buf) > 0)
                    ;
            }
        } else {
            sleep_ms((int)wait);
        }
    }
    if (ino >= 0)
        close(ino);
    kc__owner_end(o);
    return rc < 0 ? rc : 0;
}
