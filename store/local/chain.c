/*
 * chain.c: the store as a chain of tiers (chain.h). The one implementation
 * of the data path: the preloaded shim's front and libkcache-store.so both
 * are this chain, with different tiers behind the local one.
 */
#include "chain.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static bool key_ok(const char *ns, const kc_key *key)
{
    return kc__ns_ok(ns) && key != NULL;
}

/* ---- opening ---------------------------------------------------------------- */

/* The cache directory's checks (chain.h, kc__chain_open). */
static int dir_check(const struct kc__paths *p, bool readonly)
{
    int rc = kc__private_dir(p->dir, !readonly);
    if (rc == -ENOENT && readonly)
        rc = 0; /* nothing to read yet: every get misses */
    if (rc == 0 && !readonly) {
        rc = kc__private_subdir(p->spool, true);
        if (rc == 0)
            rc = kc__private_subdir(p->sec, true);
    } else if (rc == 0) {
        int r = kc__private_subdir(p->spool, false);
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    if (rc == 0) {
        int r = kc__private_subdir(p->hot, false); /* the owner creates it */
        if (r == -EPERM || r == -ENOTDIR)
            rc = r;
    }
    return rc;
}

/* Where the extra bytes start: after the chain, aligned for any type. */
#define EXTRA_AT ((sizeof(struct kc_store) + 63) & ~(size_t)63)

int kc__chain_open(const struct kc_store_options *opts, const char *lib, size_t extra,
                   struct kc_store **out)
{
    if (opts == NULL || opts->dir == NULL || opts->dir[0] == 0 || out == NULL)
        return -EINVAL;
    *out = NULL;
    if (strlen(opts->dir) >= 4000)
        return -ENAMETOOLONG;
    /* Zeroed but for the paths' buffer, which kc__paths_init fills as far
     * as it needs: the rest of it is never touched (no page faults). */
    struct kc_store *st = malloc(EXTRA_AT + extra);
    if (st == NULL)
        return -ENOMEM;
    size_t buf_at = offsetof(struct kc_store, p.buf), buf_end = buf_at + sizeof st->p.buf;
    memset(st, 0, buf_at);
    memset((char *)st + buf_end, 0, EXTRA_AT + extra - buf_end);
    st->extra = extra ? (char *)st + EXTRA_AT : NULL;
    kc__paths_init(&st->p, opts->dir);
    st->readonly = opts->readonly != 0;
    st->max_size = opts->max_size;
    int rc = dir_check(&st->p, st->readonly);
    if (rc < 0) {
        free(st);
        return rc;
    }
    kc__local_init(&st->local, &st->p, st->readonly, st->max_size, opts->tool, lib);
    kc__pending_init(&st->pd, &st->local, st->readonly);
    st->tier[0] = &st->local.base;
    st->n = 1;
    *out = st;
    return 0;
}

void *kc__chain_extra(struct kc_store *st)
{
    return st->extra;
}

int kc__chain_add(struct kc_store *st, struct kc_tier *t, unsigned flags)
{
    if (st->n == KC__CHAIN_MAX) {
        t->ops->close(t);
        return -ENOSPC;
    }
    st->tier[st->n] = t;
    st->flags[st->n] = flags;
    st->n++;
    return 0;
}

int kc__chain_set_upload(struct kc_store *st, const char *desc, size_t n)
{
    free(st->local.upload);
    st->local.upload = NULL;
    st->local.upload_len = 0;
    if (desc == NULL || n == 0 || n > KC__UPLOAD_MAX)
        return 0;
    if ((st->local.upload = malloc(n)) == NULL)
        return -ENOMEM;
    memcpy(st->local.upload, desc, n);
    st->local.upload_len = n;
    return 0;
}

void kc__chain_set_served(struct kc_store *st, bool (*served)(uint32_t prov))
{
    st->served = served;
}

struct kc_tier *kc__chain_find(struct kc_store *st, const struct kc_tier_ops *ops)
{
    for (size_t i = 0; st != NULL && i < st->n; i++)
        if (st->tier[i]->ops == ops)
            return st->tier[i];
    return NULL;
}

void kc__chain_close(struct kc_store *st)
{
    if (st == NULL)
        return;
    kc__chain_flush(st);
    for (size_t i = st->n; i-- > 0;)
        st->tier[i]->ops->close(st->tier[i]);
    kc__pending_free(&st->pd);
    free(st->local.upload);
    free(st);
}

/* ---- lookups ------------------------------------------------------------------ */

/* A hit in a tier added with KC__CHAIN_FILL_BACK is kept locally too, so
 * the next process finds it without that tier; marked as coming from the
 * remote, so the owner does not upload it back. */
void kc__chain_fill_back(struct kc_store *st, const char *ns, const kc_key *key,
                         const struct kc_record_info *info, const void *body, size_t len)
{
    if (st->readonly || info->kind < KC_KIND_NVRTC || info->kind > KC_KIND_BLOB)
        return;
    /* Its provenance as the remote tier said (the signer whose signature
     * verified); a tier that says nothing: unverified. */
    uint32_t prov =
        KC_PROV_CODE(info->prov) == KC_PROV_SIGNED ? info->prov : KC_PROV(KC_PROV_UNSIGNED, 0);
    kc__local_put(&st->local, ns, key, NULL, info->kind, body, len, info->saved_ns,
                  KC__PUT_FROM_REMOTE, prov);
}

/* The lookup behind get, take_by_source and purge: a tombstoned key is a
 * miss; else each tier in order. 0 with *body, *len (and *info); -ENOENT.
 * A tier's record that fails its checks is a miss there and a purge
 * request: the owner removes it where it is still bad (and the entry only
 * if it is bad in the database too). */
static int lookup(struct kc_store *st, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info)
{
    if (kc__pending_dead(&st->pd, ns, key))
        return -ENOENT;
    for (size_t i = 0; i < st->n; i++) {
        struct kc_tier *t = st->tier[i];
        if (t->ops->get == NULL)
            continue;
        bool fill = (st->flags[i] & KC__CHAIN_FILL_BACK) != 0;
        bool judge = !fill && st->served != NULL;
        struct kc_record_info got;
        int rc = t->ops->get(t, ns, key, body, len, fill || judge ? &got : info);
        if (rc == 0 && judge) {
            if (!st->served(got.prov)) {
                /* Signed by a key no longer trusted: a miss here, and a
                 * compile replaces it. */
                free(*body);
                *body = NULL;
                continue;
            }
            if (info != NULL)
                *info = got;
        }
        if (rc == 0) {
            if (fill) {
                if (info != NULL)
                    *info = got;
                kc__chain_fill_back(st, ns, key, &got, *body, *len);
            }
            return 0;
        }
        /* A tier added with KC__CHAIN_FILL_BACK is another machine's:
         * what fails its checks there is not this owner's to remove. */
        if (rc == -EBADMSG && !fill)
            kc__local_request(&st->local, ns, key, NULL, KC__PF_KEY | KC__PF_IFBAD);
    }
    return -ENOENT;
}

int kc__chain_get(struct kc_store *st, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info)
{
    if (st == NULL || !key_ok(ns, key) || body == NULL || len == NULL)
        return -EINVAL;
    int rc = lookup(st, ns, key, body, len, info);
    if (rc == 0)
        kc__pending_hit(&st->pd, ns, key);
    return rc;
}

/* ---- writes -------------------------------------------------------------------- */

int kc__chain_put(struct kc_store *st, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    if (st == NULL || !key_ok(ns, key) || (body == NULL && len > 0) || kind < KC_KIND_NVRTC ||
        kind > KC_KIND_BLOB)
        return -EINVAL;
    if (st->readonly)
        return -EROFS;
    /* The local tier's result is the put's: once its spool file is in
     * place, the owner carries the entry on. Other tiers that take puts
     * get it too, best effort. */
    int rc = -EROFS;
    for (size_t i = 0; i < st->n; i++) {
        struct kc_tier *t = st->tier[i];
        if (t->ops->put == NULL || (i > 0 && rc != 0))
            continue;
        int r = t->ops->put(t, ns, key, source, kind, body, len, saved_ns);
        if (i == 0)
            rc = r;
    }
    if (rc == 0)
        kc__pending_note_put(&st->pd, ns, key, source);
    return rc;
}

int kc__chain_take_by_source(struct kc_store *st, const char *ns, const kc_digest *source,
                             uint64_t build, void **body, size_t *len, kc_key *found,
                             struct kc_record_info *info)
{
    if (st == NULL || !kc__ns_ok(ns) || source == NULL || body == NULL || len == NULL)
        return -EINVAL;
    /* This process's own puts first, then each tier's sources map. */
    kc_key k;
    int rc = kc__pending_source(&st->pd, ns, source, &k);
    if (rc == -ESRCH)
        return -ENOENT;
    for (size_t i = 0; rc != 0 && i < st->n; i++) {
        struct kc_tier *t = st->tier[i];
        if (t->ops->take_by_source != NULL)
            rc = t->ops->take_by_source(t, ns, source, &k);
    }
    if (rc != 0)
        return -ENOENT;
    struct kc_record_info got;
    memset(&got, 0, sizeof got);
    if (lookup(st, ns, &k, body, len, &got) != 0)
        return -ENOENT;
    if (found != NULL)
        *found = k;
    if (info != NULL)
        *info = got;
    if (k.build == build) {
        kc__pending_hit(&st->pd, ns, &k);
        return 0;
    }
    /* An earlier build's entry is moved: nothing asks for its key again.
     * One purge request of key and source reaches the hot files and the
     * database (the owner applies it); tiers past those purge the key. */
    if (!st->readonly) {
        kc__pending_forget_source(&st->pd, ns, source);
        kc__pending_tombstone(&st->pd, ns, &k, source);
        kc__local_request(&st->local, ns, &k, source, KC__PF_KEY | KC__PF_SOURCE);
        for (size_t i = 1; i < st->n; i++)
            if (st->tier[i]->ops->purge != NULL)
                st->tier[i]->ops->purge(st->tier[i], ns, &k);
    }
    return 0;
}

int kc__chain_purge(struct kc_store *st, const char *ns, const kc_key *key)
{
    if (st == NULL || !key_ok(ns, key))
        return -EINVAL;
    if (st->readonly)
        return -EROFS;
    void *b = NULL;
    size_t n;
    int rc = lookup(st, ns, key, &b, &n, NULL);
    free(b);
    kc__pending_tombstone(&st->pd, ns, key, NULL);
    for (size_t i = 0; i < st->n; i++)
        if (st->tier[i]->ops->purge != NULL)
            st->tier[i]->ops->purge(st->tier[i], ns, key);
    return rc == 0 ? 0 : -ENOENT;
}

/* ---- logs and fork --------------------------------------------------------------- */

void kc__chain_count(struct kc_store *st, const char *backend, const struct kc_counters *c)
{
    if (st != NULL)
        kc__pending_count(&st->pd, backend, c);
}

int kc__chain_flush(struct kc_store *st)
{
    if (st == NULL)
        return -EINVAL;
    int rc = kc__pending_flush(&st->pd);
    for (size_t i = 0; i < st->n; i++) {
        struct kc_tier *t = st->tier[i];
        int r = t->ops->flush != NULL ? t->ops->flush(t) : 0;
        if (r < 0 && rc == 0)
            rc = r;
    }
    return rc;
}

void kc__chain_after_fork_child(struct kc_store *st)
{
    if (st == NULL)
        return;
    kc__pending_after_fork_child(&st->pd);
    for (size_t i = 0; i < st->n; i++)
        if (st->tier[i]->ops->after_fork != NULL)
            st->tier[i]->ops->after_fork(st->tier[i]);
}

static void chain_free(void *p)
{
    free(p);
}

const struct kc_store_ops kc__chain_ops = {
    .close = kc__chain_close,
    .get = kc__chain_get,
    .put = kc__chain_put,
    .take_by_source = kc__chain_take_by_source,
    .purge = kc__chain_purge,
    .count = kc__chain_count,
    .flush = kc__chain_flush,
    .after_fork_child = kc__chain_after_fork_child,
    .free = chain_free,
};
