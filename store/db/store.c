/*
 * store.c: libkcache-store.so's two tables (store.h). The data path is the
 * chain (store/local/chain.c) of the local tier and the database tier
 * (db_tier.c); the administration (the tool's: foreach, stats, verify,
 * gc, clear, drain, the owner) reads the database through that tier's
 * reader and works on the spool and the hot files.
 */
#include "db_tier.h"
#include "jobs.h"
#include "owner.h"

#include "../../common/log.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SPOOL_READ_MAX (1ull << 32)
#define OP_WAIT_MS 15000

/* ---- opening ------------------------------------------------------------- */

/* This library's absolute path, beside which the kcache tool is looked
 * for; empty: unknown. */
static char lib_path[PATH_MAX];

static void lib_locate(void)
{
    if (kc__object_path((const void *)kc_store_api, lib_path, sizeof lib_path) != 0)
        lib_path[0] = 0;
}

/* The chain (store/local/chain.h, which checks the directory) with the
 * database tier behind the local one. */
static int st_open(const struct kc_store_options *opts, struct kc_store **out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, lib_locate);
    struct kc_store *st;
    int rc = kc__chain_open(opts, lib_path[0] != 0 ? lib_path : NULL, 0, &st);
    if (rc < 0)
        return rc;
    struct kc_tier *db;
    rc = kc__dbt_open(opts, &db);
    if (rc == 0)
        rc = kc__chain_add(st, db, 0);
    if (rc < 0) {
        kc__chain_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* ---- administration (the tool's) ------------------------------------------
 *
 * Each operation takes a store from st_open and works on its database tier
 * (`st` below: the reader, the directory's paths and limits); what spans
 * tiers (this handle's logs, starting the owner) is the chain's (`store`). */

struct pending {
    struct kc_entry *e;
    char (*ns)[KC__NS_MAX + 1];
    size_t n, cap;
};

static void pending_load(struct kc__dbt *st, const char *only_ns, struct pending *pd, uint64_t *bad)
{
    memset(pd, 0, sizeof *pd);
    DIR *d = opendir(st->p.spool);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if ((de->d_name[0] != 'p' && de->d_name[0] != 'd') || de->d_name[1] != '-')
            continue;
        unsigned char *buf;
        size_t n;
        if (kc__read_file(dirfd(d), de->d_name, SPOOL_READ_MAX, &buf, &n) != 0)
            continue;
        struct kc__sp_put sp;
        if (kc__spool_put_decode(buf, n, &sp) != 0) {
            if (bad)
                (*bad)++;
            free(buf);
            continue;
        }
        free(buf);
        if (only_ns != NULL && strcmp(only_ns, sp.ns) != 0)
            continue;
        if (pd->n == pd->cap) {
            size_t cap = pd->cap ? 2 * pd->cap : 16;
            struct kc_entry *ne = realloc(pd->e, cap * sizeof *ne);
            if (ne == NULL)
                break;
            pd->e = ne;
            char(*nn)[KC__NS_MAX + 1] = realloc(pd->ns, cap * sizeof *nn);
            if (nn == NULL)
                break;
            pd->ns = nn;
            pd->cap = cap;
        }
        struct kc_entry *e = &pd->e[pd->n];
        memset(e, 0, sizeof *e);
        snprintf(pd->ns[pd->n], sizeof pd->ns[0], "%s", sp.ns);
        e->key = sp.key;
        kc__hdr_to_info(&sp.hdr, &e->info);
        e->stored_bytes = n;
        e->pending = 1;
        pd->n++;
    }
    closedir(d);
    for (size_t i = 0; i < pd->n; i++)
        pd->e[i].ns = pd->ns[i];
}

static void pending_free(struct pending *pd)
{
    free(pd->e);
    free(pd->ns);
}

static bool pending_has(const struct pending *pd, const char *ns, const kc_key *k)
{
    for (size_t i = 0; i < pd->n; i++)
        if (memcmp(&pd->e[i].key, k, sizeof *k) == 0 && strcmp(pd->ns[i], ns) == 0)
            return true;
    return false;
}

/* Whether the directory holds a database (its CURRENT file). */
static bool db_exists(struct kc__dbt *st)
{
    char cur[PATH_MAX];
    snprintf(cur, sizeof cur, "%s/CURRENT", st->p.db);
    return access(cur, F_OK) == 0;
}

/* A fresh view for a tool operation: the reader caught up, if there is a
 * database at all, and held (rdlk shared; the caller unlocks it). A reader
 * opened now is caught up once more: the owner may have flushed (a new
 * table in its MANIFEST, the log it replaces deleted) between the
 * secondary's reading of the two. retry: open a new reader first (after a
 * walk that failed). 1 held; 0 there is no database; -EIO there is one
 * and no reader could be opened. */
static int no_reader(struct kc__dbt *st)
{
    if (!db_exists(st))
        return 0;
    pthread_mutex_lock(&st->mu);
    int e = st->open_rc;
    pthread_mutex_unlock(&st->mu);
    /* No place for a reader's files (a read-only store's go to $TMPDIR),
     * which another try will not change: said, and nothing is shown. */
    if (e == -EACCES || e == -EPERM || e == -EROFS || e == -ENOSPC || e == -EDQUOT) {
        kc_log(KC_LOG_WARN, "cannot open a reader of %s (%s); its entries are not shown", st->p.db,
               strerror(-e));
        return 0;
    }
    return -EIO;
}

static int fresh_reader(struct kc__dbt *st, bool retry)
{
    bool ok = retry ? kc__dbt_reopen(st) : kc__dbt_refresh(st, kc__dbt_gen(st), true);
    if (ok)
        ok = kc__dbt_refresh(st, kc__dbt_gen(st), true);
    if (!ok)
        return no_reader(st);
    pthread_rwlock_rdlock(&st->rdlk);
    if (!st->rd_ready) {
        pthread_rwlock_unlock(&st->rdlk);
        return no_reader(st);
    }
    return 1;
}

/* Whether the held reader sees every table in DIR/db. A secondary leaves
 * out, silently, a table its MANIFEST names that is not there when it
 * looks (one a compaction or a flush of the owner removed meanwhile), and
 * then shows less than the store holds (an owner at work: "0 or 8 of 12
 * entries"). A table there that the reader lacks says its view is not
 * the owner's: it is opened again (a table being written that its
 * MANIFEST does not name yet says the same, harmlessly). */
static bool reader_whole(struct kc__dbt *st)
{
    const rocksdb_livefiles_t *lf = rocksdb_livefiles(st->rd.db);
    if (lf == NULL)
        return true;
    int n = rocksdb_livefiles_count(lf);
    bool whole = true;
    DIR *d = opendir(st->p.db);
    struct dirent *de;
    while (whole && d != NULL && (de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".sst") != 0 ||
            strspn(de->d_name, "0123456789") != len - 4)
            continue; /* not a table of the database (bulk.c's are named apart) */
        bool found = false;
        for (int i = 0; !found && i < n; i++) {
            const char *name = rocksdb_livefiles_name(lf, i);
            if (name != NULL && name[0] == '/')
                name++;
            found = name != NULL && strcmp(name, de->d_name) == 0;
        }
        whole = found;
    }
    if (d != NULL)
        closedir(d);
    rocksdb_livefiles_destroy(lf);
    return whole;
}

/* fresh_reader for a walk of the whole store: a reader that does not see
 * every table (reader_whole) is opened again, a few times. */
static int whole_reader(struct kc__dbt *st, bool retry)
{
    int have = fresh_reader(st, retry);
    for (int i = 0; have > 0 && i < 8 && !reader_whole(st); i++) {
        pthread_rwlock_unlock(&st->rdlk);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        have = fresh_reader(st, true);
    }
    return have;
}

/* Attempts at a tool's walk of the database: a reader that cannot be
 * opened or read while an owner changes the files under it (a table a
 * compaction removed, a log a flush removed) is opened again, a few times,
 * WALK_WAIT_MS apart; then the error is the operation's (never a partial
 * walk reported as the store's contents). */
#define WALK_TRIES 4
#define WALK_WAIT_MS 50

static void walk_pause(void)
{
    struct timespec ts = {0, WALK_WAIT_MS * 1000000L};
    nanosleep(&ts, NULL);
}

static int st_foreach(struct kc_store *store, const char *ns,
                      int (*cb)(const struct kc_entry *e, void *arg), void *arg)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL || cb == NULL || (ns != NULL && !kc__ns_ok(ns)))
        return -EINVAL;
    struct pending pd;
    pending_load(st, ns, &pd, NULL);
    int rc = 0;
    /* Retried while nothing was handed to cb yet (the reader could not be
     * opened or failed at once); an error after that is the walk's. */
    size_t given = 0;
    for (int attempt = 0; attempt < WALK_TRIES; attempt++) {
        if (attempt > 0)
            walk_pause();
        int have = whole_reader(st, attempt > 0);
        rc = have < 0 ? have : 0;
        if (have == 0)
            break; /* no database */
        if (have < 0)
            continue;
        rocksdb_iterator_t *it =
            rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
        size_t nsl = ns ? strlen(ns) : 0;
        if (ns)
            rocksdb_iter_seek(it, ns, nsl + 1);
        else
            rocksdb_iter_seek_to_first(it);
        for (; rc == 0 && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
            size_t kl, vl;
            const char *k = rocksdb_iter_key(it, &kl);
            const char *v = rocksdb_iter_value(it, &vl);
            if (ns && (kl < nsl + 1 || memcmp(k, ns, nsl) != 0 || k[nsl] != 0))
                break;
            struct kc_entry e;
            memset(&e, 0, sizeof e);
            char ens[KC__NS_MAX + 1];
            struct kc__hdr h;
            if (kc__kkey_split((const unsigned char *)k, kl, ens, &e.key) != 0)
                continue;
            if (pending_has(&pd, ens, &e.key))
                continue;
            e.ns = ens;
            if (vl == KC__KVAL_LEN && kc__hdr_decode(v, vl, &h) == 0) {
                kc__hdr_to_info(&h, &e.info);
                unsigned char rk[KC__META_REF_KEY_LEN];
                kc__meta_ref_key(kc__kval_digest(v, vl), rk);
                char *rv;
                size_t rvl;
                e.stored_bytes = h.body_size;
                if (kc__db_get(&st->rd, KC__CF_META, rk, sizeof rk, &rv, &rvl) == 0) {
                    uint64_t cnt = 0;
                    kc__meta_ref_parse(rv, rvl, &cnt, NULL);
                    if (cnt > 1)
                        e.stored_bytes = h.body_size / cnt;
                    free(rv);
                }
            }
            rc = cb(&e, arg);
            given++;
        }
        int ie = kc__db_iter_err(&st->rd, it);
        rocksdb_iter_destroy(it);
        pthread_rwlock_unlock(&st->rdlk);
        if (rc == 0 && ie != 0)
            rc = ie;
        if (rc == 0 || given > 0 || ie == 0)
            break;
    }
    for (size_t i = 0; rc == 0 && i < pd.n; i++)
        rc = cb(&pd.e[i], arg);
    pending_free(&pd);
    return rc;
}

static struct kc_backend_stats *stats_backend(struct kc_store_stats *s, const char *name)
{
    for (size_t i = 0; i < s->n_backends; i++)
        if (strcmp(s->backends[i].backend, name) == 0)
            return &s->backends[i];
    struct kc_backend_stats *v = realloc(s->backends, (s->n_backends + 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    s->backends = v;
    struct kc_backend_stats *b = &v[s->n_backends++];
    memset(b, 0, sizeof *b);
    snprintf(b->backend, sizeof b->backend, "%s", name);
    return b;
}

/* A new namespace's tally: the kernels family is walked in key order
 * (ns \0 key), so each namespace's entries come together, once; the array
 * grows by doubling (a store may hold tens of thousands). */
static struct kc_ns_stats *stats_ns(struct kc_store_stats *s, const char *name, size_t *cap)
{
    if (s->n_ns == *cap) {
        size_t c = *cap ? 2 * *cap : 16;
        struct kc_ns_stats *v = realloc(s->ns, c * sizeof *v);
        if (v == NULL)
            return NULL;
        s->ns = v;
        *cap = c;
    }
    struct kc_ns_stats *v = s->ns;
    struct kc_ns_stats *n = &v[s->n_ns++];
    memset(n, 0, sizeof *n);
    snprintf(n->ns, sizeof n->ns, "%s", name);
    return n;
}

/* The spool's counter logs, read before the database: a log an owner adds
 * up meanwhile is either still here and not marked in the database the
 * walk then reads (counted from here), or marked (counted there), never
 * both (meta.h's "c/"). */
struct spool_log {
    char name[256];
    struct kc__sp_item *items;
    size_t n;
};
struct spool_logs {
    struct spool_log *v;
    size_t n;
    uint64_t puts; /* put files seen (s->spool_entries) */
};

static void spool_logs_free(struct spool_logs *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].items);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void spool_logs_read(struct kc__dbt *st, struct spool_logs *l)
{
    memset(l, 0, sizeof *l);
    DIR *d = opendir(st->p.spool);
    if (d == NULL)
        return;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if ((n[0] == 'p' || n[0] == 'd') && n[1] == '-')
            l->puts++;
        if (n[0] != 'c' || n[1] != '-' || strlen(n) >= sizeof l->v[0].name)
            continue;
        unsigned char *buf;
        size_t len;
        if (kc__read_file(dirfd(d), n, SPOOL_READ_MAX, &buf, &len) != 0)
            continue;
        int type;
        const unsigned char *p;
        size_t pl;
        if (kc__spool_check(buf, len, &type, &p, &pl) == 0 && type == KC__SP_COUNT) {
            if (kc_grow(&l->v, &cap, l->n, sizeof *l->v, 16) != 0) {
                free(buf);
                break;
            }
            struct spool_log *lg = &l->v[l->n++];
            memset(lg, 0, sizeof *lg);
            snprintf(lg->name, sizeof lg->name, "%s", n);
            struct kc__sp_item it;
            const unsigned char *end = p + pl;
            size_t icap = 0;
            while (kc__spool_item_next(type, &p, end, &it) > 0)
                if ((it.flags & KC__SPI_HIT) == 0 &&
                    kc_grow(&lg->items, &icap, lg->n, sizeof *lg->items, 8) == 0)
                    lg->items[lg->n++] = it; /* (hits it carries are not counters) */
        }
        free(buf);
    }
    closedir(d);
}

/* Adds the logs the database `db` (NULL: none yet) has not added up. */
static void spool_logs_add(const struct spool_logs *l, struct kc__db *db, struct kc_store_stats *s)
{
    for (size_t i = 0; i < l->n; i++) {
        if (db != NULL) {
            unsigned char mk[KC__META_APPLIED_KEY_MAX];
            size_t ml = kc__meta_applied_key(l->v[i].name, mk);
            char *v = NULL;
            size_t vl = 0;
            if (kc__db_get(db, KC__CF_META, mk, ml, &v, &vl) == 0) {
                free(v);
                continue;
            }
        }
        for (size_t k = 0; k < l->v[i].n; k++) {
            struct kc_backend_stats *b = stats_backend(s, l->v[i].items[k].ns);
            if (b != NULL)
                kc_counters_add(&b->c, &l->v[i].items[k].c);
        }
    }
}

static void st_stats_free(struct kc_store_stats *s)
{
    if (s == NULL)
        return;
    free(s->ns);
    free(s->backends);
    free(s);
}

/* The put files waiting in the spool (p- and d- names). */
static uint64_t spool_puts(struct kc__dbt *st)
{
    DIR *d = opendir(st->p.spool);
    uint64_t n = 0;
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL)
        n += (de->d_name[0] == 'p' || de->d_name[0] == 'd') && de->d_name[1] == '-';
    if (d != NULL)
        closedir(d);
    return n;
}

/* The database's part of the statistics, through the held reader: entries
 * and bytes per namespace, unique bytes, counters. 0 or the walk's error. */
static int stats_db(struct kc__dbt *st, struct kc_store_stats *s)
{
    rocksdb_iterator_t *it =
        rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
    struct kc_ns_stats *cur = NULL;
    size_t ns_cap = 0;
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        char ns[KC__NS_MAX + 1];
        kc_key key;
        struct kc__hdr h;
        if (kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0)
            continue;
        uint64_t raw = 0;
        if (vl == KC__KVAL_LEN && kc__hdr_decode(v, vl, &h) == 0)
            raw = h.body_size;
        if (cur == NULL || strcmp(cur->ns, ns) != 0)
            cur = stats_ns(s, ns, &ns_cap);
        if (cur != NULL) {
            cur->entries++;
            cur->raw_bytes += raw;
        }
        s->entries++;
        s->raw_bytes += raw;
    }
    int rc = kc__db_iter_err(&st->rd, it);
    rocksdb_iter_destroy(it);
    if (rc != 0)
        return rc;
    it = rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_META]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const unsigned char *v = (const unsigned char *)rocksdb_iter_value(it, &vl);
        uint64_t size, a[KC_N_COUNTERS];
        char name[sizeof s->backends[0].backend]; /* longer names are not reported */
        if (kl == KC__META_REF_KEY_LEN && kc__meta_is(k, kl, KC__META_REF_PREFIX) &&
            kc__meta_ref_parse(v, vl, NULL, &size) == 0) {
            s->unique_bytes += size;
        } else if (kc__meta_counters_name(k, kl, name, sizeof name) == 0 &&
                   kc__meta_counters_parse(v, vl, a) == 0) {
            struct kc_backend_stats *b = stats_backend(s, name);
            if (b != NULL) {
                struct kc_counters c;
                kc_counters_from_array(&c, a);
                kc_counters_add(&b->c, &c);
            }
        }
    }
    rc = kc__db_iter_err(&st->rd, it);
    rocksdb_iter_destroy(it);
    return rc;
}

static int st_stats(struct kc_store *store, struct kc_store_stats **out)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL || out == NULL)
        return -EINVAL;
    struct kc_store_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->max_size = st->max_size ? st->max_size : KC_DEFAULT_MAX_SIZE;
    /* The database and the spool as of one moment: a walk during which
     * puts left the spool (drained by a running owner) is done again, as
     * is one whose reader failed (WALK_TRIES). */
    int rc = 0;
    for (int attempt = 0; attempt < WALK_TRIES; attempt++) {
        if (attempt > 0)
            walk_pause();
        free(s->ns);
        free(s->backends);
        uint64_t max = s->max_size;
        memset(s, 0, sizeof *s);
        s->max_size = max;
        struct spool_logs logs;
        spool_logs_read(st, &logs);
        uint64_t before = logs.puts;
        int have = whole_reader(st, attempt > 0 && rc != 0);
        rc = have < 0 ? have : 0;
        if (have > 0) {
            rc = stats_db(st, s);
            if (rc == 0)
                spool_logs_add(&logs, &st->rd, s);
            pthread_rwlock_unlock(&st->rdlk);
        } else if (rc == 0) {
            spool_logs_add(&logs, NULL, s);
        }
        spool_logs_free(&logs);
        s->spool_entries = 0;
        if (rc == 0 && spool_puts(st) == before)
            break;
    }
    if (rc != 0) {
        st_stats_free(s);
        return rc;
    }
    s->spool_entries = spool_puts(st);
    s->disk_bytes = kc__du(st->p.dir, &s->reserved_bytes);
    *out = s;
    return 0;
}

/* Becomes the owner for a tool operation; afterwards starts the background
 * owner again if writers left work while we held the lock. */
static int as_owner(struct kc__dbt *st, struct kc__owner **o)
{
    if (st->readonly)
        return -EROFS;
    return kc__owner_begin(st->p.dir, st->max_size, OP_WAIT_MS, o);
}

static void end_owner(struct kc_store *store, struct kc__owner *o)
{
    kc__owner_end(o);
    if (kc__spool_pending(store->p.spool))
        kc__local_kick(&store->local);
}

/* Counts hot files that fail their checks or sit under another key's
 * name (the owner's verify also compares them with the database). */
static void hot_check(struct kc__dbt *st, uint64_t *bad)
{
    DIR *d = opendir(st->p.hot);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strlen(de->d_name) != 32 || strspn(de->d_name, "0123456789abcdef") != 32)
            continue;
        unsigned char *buf = NULL;
        struct kc__sp_put sp;
        int rc = kc__hot_file_read(st->p.hot, de->d_name, &buf, &sp);
        if (rc != 0 && rc != -ENOENT) /* -ENOENT: the owner evicted it meanwhile */
            (*bad)++;
        free(buf);
    }
    closedir(d);
}

static int st_verify(struct kc_store *store, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL)
        return -EINVAL;
    struct kc_verify_report r = {0};
    if (st->readonly || !repair) {
        /* Read-only check through the reader. */
        struct pending pd;
        pending_load(st, NULL, &pd, &r.spool_bad);
        pending_free(&pd);
        hot_check(st, &r.spool_bad);
        bool have = fresh_reader(st, false) > 0;
        if (have) {
            rocksdb_iterator_t *it =
                rocksdb_create_iterator_cf(st->rd.db, st->rd.ro, st->rd.cf[KC__CF_KERNELS]);
            uint64_t total = 0;
            /* The entries first (headers only), for the progress's total. */
            if (progress)
                for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it))
                    total++;
            for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
                size_t kl;
                const char *k = rocksdb_iter_key(it, &kl);
                char ns[KC__NS_MAX + 1];
                kc_key key;
                void *body = NULL;
                size_t len;
                struct kc__hdr h;
                r.checked++;
                if (kc__kkey_split((const unsigned char *)k, kl, ns, &key) != 0 ||
                    kc__lookup(&st->rd, ns, &key, &body, &len, &h) != 0)
                    r.bad++;
                free(body);
                if (progress)
                    progress(r.checked, total > r.checked ? total : r.checked, arg);
            }
            if (progress)
                progress(r.checked, r.checked, arg);
            rocksdb_iter_destroy(it);
            pthread_rwlock_unlock(&st->rdlk);
        }
        if (rep)
            *rep = r;
        return 0;
    }
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_verify(o, repair, &r, progress, arg);
    end_owner(store, o);
    if (rep)
        *rep = r;
    return rc;
}

static int st_gc(struct kc_store *store, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL)
        return -EINVAL;
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_gc(o, max_size, rep, progress, arg);
    end_owner(store, o);
    return rc;
}

static int st_clear(struct kc_store *store)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL)
        return -EINVAL;
    struct kc__owner *o;
    int rc = as_owner(st, &o);
    if (rc < 0)
        return rc;
    rc = kc__owner_clear(o);
    end_owner(store, o);
    kc__pending_forget_source(&store->pd, NULL, NULL);
    return rc;
}

static int st_drain(struct kc_store *store, int timeout_ms)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL)
        return -EINVAL;
    if (st->readonly)
        return -EROFS;
    kc__chain_flush(store);
    /* Nothing in the spool (puts, purges, hit logs, counters): nothing to
     * drain, and no owner session to open and settle. */
    if (!kc__spool_pending(st->p.spool))
        return 0;
    struct kc__owner *o;
    int rc = kc__owner_begin(st->p.dir, st->max_size, timeout_ms < 0 ? 0 : timeout_ms, &o);
    if (rc < 0)
        return rc;
    end_owner(store, o);
    return 0;
}

/* For the bundle operations (struct kc__store_access): the database
 * tier's reader, caught up and held, and the owner, as the other tool
 * operations take them. */
static int reader_hold(struct kc_store *store, struct kc__db **d)
{
    struct kc__dbt *st = kc__dbt_of(store);
    if (st == NULL)
        return -ENOENT;
    for (int attempt = 0; attempt < WALK_TRIES; attempt++) {
        if (attempt > 0)
            walk_pause();
        int have = whole_reader(st, attempt > 0);
        if (have == 0)
            return -ENOENT;
        if (have > 0) {
            *d = &st->rd;
            return 0;
        }
    }
    return -EIO;
}

static void reader_release(struct kc_store *store)
{
    pthread_rwlock_unlock(&kc__dbt_of(store)->rdlk);
}

static int store_as_owner(struct kc_store *store, struct kc__owner **o)
{
    struct kc__dbt *st = kc__dbt_of(store);
    return st != NULL ? as_owner(st, o) : -EINVAL;
}

static int st_bundle_export(struct kc_store *store, const struct kc_bundle_export_opts *o,
                            struct kc_bundle_info *info)
{
    struct kc__store_access a = {store, reader_hold, reader_release, store_as_owner, end_owner};
    return kc__bundle_export(store != NULL ? &a : NULL, o, info);
}

static int st_bundle_import(struct kc_store *store, const struct kc_bundle_import_opts *o,
                            struct kc_bundle_info *info)
{
    struct kc__store_access a = {store, reader_hold, reader_release, store_as_owner, end_owner};
    return kc__bundle_import(store != NULL ? &a : NULL, o, info);
}

/* ---- the tables ------------------------------------------------------------ */

static const struct kc_store_api api = {
    .abi = KC_STORE_ABI,
    .open = st_open,
    .ops = &kc__chain_ops,
    .db_tier_open = kc__dbt_open,
};

KC_API const struct kc_store_api *kc_store_api(void)
{
    return &api;
}

static const struct kc_store_admin admin = {
    .abi = KC_STORE_ABI,
    .foreach = st_foreach,
    .stats = st_stats,
    .stats_free = st_stats_free,
    .verify = st_verify,
    .gc = st_gc,
    .clear = st_clear,
    .drain = st_drain,
    .owner_run = kc__owner_run,
    .parse_record = kc__parse_record,
    .bundle_export = st_bundle_export,
    .bundle_import = st_bundle_import,
};

KC_API const struct kc_store_admin *kc_store_admin(void)
{
    return &admin;
}
