/*
 * pending.c: what one process keeps of its own store use until it writes
 * it to the spool (local.h, "this process's pending state"): noted hits,
 * counters, tombstones of what it purged or moved, the sources of its own
 * puts. The chain's state (chain.c), in the shim and in the store alike, so
 * libc only; its logs are written through the local tier.
 */
#include "chain.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HITS_FLUSH_AT 65536

/* ---- a small open-addressing map -------------------------------------- */

enum { M_HIT = 1, M_TOMB_KEY = 2, M_TOMB_SRC = 3, M_SRC = 4 };

struct kc__pment {
    uint8_t used; /* 0 empty, 1 used, 2 deleted */
    uint8_t type;
    uint32_t ns;
    unsigned char k[KC__KEY_LEN];
    uint64_t a, b;
    kc_key val;
};

static uint64_t ment_hash(int type, uint32_t ns, const unsigned char *k)
{
    uint64_t h = 1469598103934665603ull ^ ((uint64_t)type << 32) ^ ns;
    for (int i = 0; i < KC__KEY_LEN; i++)
        h = (h ^ k[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static struct kc__pment *map_find(struct kc__pmap *m, int type, uint32_t ns, const unsigned char *k)
{
    if (m->n == 0)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = ment_hash(type, ns, k) & mask;; i = (i + 1) & mask) {
        struct kc__pment *e = &m->e[i];
        if (e->used == 0)
            return NULL;
        if (e->used == 1 && e->type == type && e->ns == ns && !memcmp(e->k, k, KC__KEY_LEN))
            return e;
    }
}

static struct kc__pment *map_add(struct kc__pmap *m, int type, uint32_t ns, const unsigned char *k)
{
    struct kc__pment *f = map_find(m, type, ns, k);
    if (f != NULL)
        return f;
    if ((m->n + m->dead + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while ((m->n + 1) * 2 > cap / 2 * 1)
            cap *= 2;
        if (cap < 64)
            cap = 64;
        struct kc__pment *ne = calloc(cap, sizeof *ne);
        if (ne == NULL)
            return NULL;
        for (size_t i = 0; i < m->cap; i++) {
            struct kc__pment *e = &m->e[i];
            if (e->used != 1)
                continue;
            size_t j = ment_hash(e->type, e->ns, e->k) & (cap - 1);
            while (ne[j].used)
                j = (j + 1) & (cap - 1);
            ne[j] = *e;
        }
        free(m->e);
        m->e = ne;
        m->cap = cap;
        m->dead = 0;
    }
    size_t mask = m->cap - 1;
    size_t i = ment_hash(type, ns, k) & mask;
    while (m->e[i].used == 1)
        i = (i + 1) & mask;
    struct kc__pment *e = &m->e[i];
    if (e->used == 2)
        m->dead--;
    memset(e, 0, sizeof *e);
    e->used = 1;
    e->type = (uint8_t)type;
    e->ns = ns;
    memcpy(e->k, k, KC__KEY_LEN);
    m->n++;
    return e;
}

static void map_del(struct kc__pmap *m, struct kc__pment *e)
{
    if (e == NULL)
        return;
    e->used = 2;
    m->n--;
    m->dead++;
}

/* Deletes every entry of `type`. */
static void map_del_type(struct kc__pmap *m, int type)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].used == 1 && m->e[i].type == type)
            map_del(m, &m->e[i]);
}

/* ---- keys --------------------------------------------------------------- */

/* The index of a namespace (added when new); UINT32_MAX when out of
 * memory. mu held. */
static uint32_t ns_index(struct kc__pending *pd, const char *ns)
{
    for (size_t i = 0; i < pd->n_nss; i++)
        if (strcmp(pd->nss[i], ns) == 0)
            return (uint32_t)i;
    char *d = strdup(ns);
    char **v = d ? realloc(pd->nss, (pd->n_nss + 1) * sizeof *v) : NULL;
    if (v == NULL) {
        free(d);
        return UINT32_MAX;
    }
    pd->nss = v;
    v[pd->n_nss] = d;
    return (uint32_t)pd->n_nss++;
}

static void key_k(const kc_key *key, unsigned char k[KC__KEY_LEN])
{
    kc__key_encode(key, k);
}

static void src_k(const kc_digest *src, unsigned char k[KC__KEY_LEN])
{
    memset(k, 0, KC__KEY_LEN);
    kc__digest_encode(src, k);
}

/* ---- the state ---------------------------------------------------------- */

void kc__pending_init(struct kc__pending *pd, struct kc__local *log, bool readonly)
{
    memset(pd, 0, sizeof *pd);
    pthread_mutex_init(&pd->mu, NULL);
    pd->log = log;
    pd->readonly = readonly;
}

void kc__pending_free(struct kc__pending *pd)
{
    free(pd->m.e);
    for (size_t i = 0; i < pd->n_nss; i++)
        free(pd->nss[i]);
    free(pd->nss);
    free(pd->ctr);
    pthread_mutex_destroy(&pd->mu);
    memset(pd, 0, sizeof *pd);
}

void kc__pending_after_fork_child(struct kc__pending *pd)
{
    pthread_mutex_init(&pd->mu, NULL);
    /* Hits and counters so far are the parent's to report. */
    map_del_type(&pd->m, M_HIT);
    pd->n_hits = 0;
    pd->n_ctr = 0;
}

/* ---- spool files -------------------------------------------------------- */

/* Adds the noted hits to b as items of a log of `type`: a hit log's, or a
 * counter log's marked KC__SPI_HIT. Returns how many; mu held. */
static size_t hits_add_locked(struct kc__pending *pd, struct kc__buf *b, int type)
{
    size_t n = 0;
    for (size_t i = 0; i < pd->m.cap; i++) {
        struct kc__pment *e = &pd->m.e[i];
        if (e->used != 1 || e->type != M_HIT)
            continue;
        struct kc__sp_item it = {0};
        snprintf(it.ns, sizeof it.ns, "%s", pd->nss[e->ns]);
        kc__key_decode(e->k, &it.key);
        it.flags = type == KC__SP_COUNT ? KC__SPI_HIT : 0;
        it.a = e->a;
        it.b = e->b;
        kc__spool_item_add(b, type, &it);
        n++;
    }
    return n;
}

/* After a log holding the noted hits was written (rc): they are dropped,
 * unless the spool had no room, which keeps them for the next flush, up to
 * the bound (then they are dropped: no buffer rebuilt at every hit). mu
 * held. */
static void hits_written_locked(struct kc__pending *pd, int rc, size_t n)
{
    if (rc != -EDQUOT || n >= HITS_FLUSH_AT) {
        map_del_type(&pd->m, M_HIT);
        pd->n_hits = 0;
    }
}

/* Writes the hit log; mu held. */
static int flush_hits_locked(struct kc__pending *pd)
{
    if (pd->n_hits == 0)
        return 0;
    struct kc__buf b = {0};
    kc__spool_begin(&b, KC__SP_HITS);
    size_t n = hits_add_locked(pd, &b, KC__SP_HITS);
    int rc = kc__local_log(pd->log, KC__SP_HITS, &b, n);
    kc__buf_free(&b);
    hits_written_locked(pd, rc, n);
    return rc;
}

void kc__pending_hit(struct kc__pending *pd, const char *ns, const kc_key *key)
{
    if (pd->readonly)
        return;
    unsigned char k[KC__KEY_LEN];
    key_k(key, k);
    pthread_mutex_lock(&pd->mu);
    uint32_t nsi = ns_index(pd, ns);
    if (nsi != UINT32_MAX) {
        struct kc__pment *e = map_find(&pd->m, M_HIT, nsi, k);
        if (e == NULL && (e = map_add(&pd->m, M_HIT, nsi, k)) != NULL)
            pd->n_hits++;
        if (e != NULL) {
            e->a++;
            e->b = kc_wall_ns();
        }
        if (pd->n_hits >= HITS_FLUSH_AT)
            flush_hits_locked(pd);
    }
    pthread_mutex_unlock(&pd->mu);
}

void kc__pending_count(struct kc__pending *pd, const char *backend, const struct kc_counters *c)
{
    if (backend == NULL || c == NULL || strlen(backend) >= sizeof pd->ctr->name)
        return;
    pthread_mutex_lock(&pd->mu);
    struct kc__counter *t = NULL;
    for (size_t i = 0; i < pd->n_ctr; i++)
        if (strcmp(pd->ctr[i].name, backend) == 0)
            t = &pd->ctr[i];
    if (t == NULL) {
        struct kc__counter *v = realloc(pd->ctr, (pd->n_ctr + 1) * sizeof *v);
        if (v != NULL) {
            pd->ctr = v;
            t = &v[pd->n_ctr++];
            memset(t, 0, sizeof *t);
            snprintf(t->name, sizeof t->name, "%s", backend);
        }
    }
    if (t != NULL) {
        kc_counters_add(&t->c, c);
    }
    pthread_mutex_unlock(&pd->mu);
}

int kc__pending_flush(struct kc__pending *pd)
{
    pthread_mutex_lock(&pd->mu);
    bool wrote = pd->n_hits > 0 || pd->n_ctr > 0;
    int rc = 0;
    if (pd->n_ctr > 0) {
        /* One log: the counters and the hits noted since the last one (a
         * process that only hit writes this one file at exit). */
        struct kc__buf b = {0};
        kc__spool_begin(&b, KC__SP_COUNT);
        size_t n = 0;
        for (size_t i = 0; i < pd->n_ctr; i++) {
            struct kc__sp_item it = {0};
            snprintf(it.ns, sizeof it.ns, "%s", pd->ctr[i].name);
            it.c = pd->ctr[i].c;
            if (it.ns[0] != 0) {
                kc__spool_item_add(&b, KC__SP_COUNT, &it);
                n++;
            }
        }
        size_t nh = hits_add_locked(pd, &b, KC__SP_COUNT);
        rc = kc__local_log(pd->log, KC__SP_COUNT, &b, n + nh);
        kc__buf_free(&b);
        if (rc != -EDQUOT)
            pd->n_ctr = 0; /* (a full spool: they add up to the next) */
        hits_written_locked(pd, rc, nh);
    } else {
        rc = flush_hits_locked(pd);
    }
    pthread_mutex_unlock(&pd->mu);
    if (wrote && !pd->readonly)
        kc__local_kick_logs(pd->log);
    return rc;
}

void kc__pending_note_put(struct kc__pending *pd, const char *ns, const kc_key *key,
                          const kc_digest *source)
{
    unsigned char k[KC__KEY_LEN];
    key_k(key, k);
    pthread_mutex_lock(&pd->mu);
    uint32_t nsi = ns_index(pd, ns);
    if (nsi != UINT32_MAX) {
        struct kc__pment *e = map_find(&pd->m, M_TOMB_KEY, nsi, k);
        if (e != NULL) {
            map_del(&pd->m, e);
            pd->n_tombs--;
        }
        if (source != NULL) {
            unsigned char sk[KC__KEY_LEN];
            src_k(source, sk);
            e = map_find(&pd->m, M_TOMB_SRC, nsi, sk);
            if (e != NULL) {
                map_del(&pd->m, e);
                pd->n_tombs--;
            }
            e = map_add(&pd->m, M_SRC, nsi, sk);
            if (e != NULL)
                e->val = *key;
        }
    }
    pthread_mutex_unlock(&pd->mu);
}

/* ---- tombstones and sources ---------------------------------------------- */

/* mu held. */
static void tomb_locked(struct kc__pending *pd, int type, uint32_t nsi, const unsigned char *k)
{
    if (map_find(&pd->m, type, nsi, k) == NULL && map_add(&pd->m, type, nsi, k) != NULL)
        pd->n_tombs++;
}

void kc__pending_tombstone(struct kc__pending *pd, const char *ns, const kc_key *key,
                           const kc_digest *src)
{
    unsigned char kb[KC__KEY_LEN], sb[KC__KEY_LEN];
    if (key != NULL)
        key_k(key, kb);
    if (src != NULL)
        src_k(src, sb);
    pthread_mutex_lock(&pd->mu);
    uint32_t nsi = ns_index(pd, ns);
    if (nsi != UINT32_MAX && key != NULL)
        tomb_locked(pd, M_TOMB_KEY, nsi, kb);
    if (nsi != UINT32_MAX && src != NULL)
        tomb_locked(pd, M_TOMB_SRC, nsi, sb);
    pthread_mutex_unlock(&pd->mu);
}

bool kc__pending_dead(struct kc__pending *pd, const char *ns, const kc_key *key)
{
    if (__atomic_load_n(&pd->n_tombs, __ATOMIC_RELAXED) == 0)
        return false;
    unsigned char k[KC__KEY_LEN];
    key_k(key, k);
    pthread_mutex_lock(&pd->mu);
    uint32_t nsi = ns_index(pd, ns);
    bool dead = nsi != UINT32_MAX && map_find(&pd->m, M_TOMB_KEY, nsi, k) != NULL;
    pthread_mutex_unlock(&pd->mu);
    return dead;
}

int kc__pending_source(struct kc__pending *pd, const char *ns, const kc_digest *src, kc_key *found)
{
    unsigned char sk[KC__KEY_LEN];
    src_k(src, sk);
    pthread_mutex_lock(&pd->mu);
    uint32_t nsi = ns_index(pd, ns);
    int rc = -ENOENT;
    if (nsi != UINT32_MAX) {
        if (map_find(&pd->m, M_TOMB_SRC, nsi, sk) != NULL) {
            rc = -ESRCH;
        } else {
            struct kc__pment *e = map_find(&pd->m, M_SRC, nsi, sk);
            if (e != NULL) {
                *found = e->val;
                rc = 0;
            }
        }
    }
    pthread_mutex_unlock(&pd->mu);
    return rc;
}

void kc__pending_forget_source(struct kc__pending *pd, const char *ns, const kc_digest *src)
{
    pthread_mutex_lock(&pd->mu);
    if (ns == NULL) {
        map_del_type(&pd->m, M_SRC);
    } else {
        unsigned char sk[KC__KEY_LEN];
        src_k(src, sk);
        uint32_t nsi = ns_index(pd, ns);
        if (nsi != UINT32_MAX)
            map_del(&pd->m, map_find(&pd->m, M_SRC, nsi, sk));
    }
    pthread_mutex_unlock(&pd->mu);
}
