/*
 * Manifests, shared by NVRTC (nvrtc.c) and nvcc (nvcc.c): see manifest.h.
 */
#include "manifest.h"
#include "shim.h"
#include "../store/local/chain.h"
#include "../store/remote/remote.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The result id of a base with a dependency set. */
kc_digest kc__manifest_result_id(const kc_digest *base, const struct kc__dep *deps, uint64_t n)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return *base;
    kc__hash_bytes(h, base, sizeof *base);
    kc__hash_u64(h, n);
    for (uint64_t i = 0; i < n; i++) {
        kc__hash_u64(h, (uint64_t)deps[i].kind);
        kc__hash_str(h, deps[i].path);
        kc__hash_bytes(h, &deps[i].digest, sizeof deps[i].digest);
    }
    kc_digest d = kc__hash_digest(h);
    kc__hasher_free(h);
    return d;
}

kc_key kc__manifest_key(const kc_digest *base)
{
    kc_digest d = *base;
    d.lo ^= 0x6d616e6966657374ull; /* "manifest" */
    d.hi = d.hi * 0x9e3779b97f4a7c15ull + 1;
    return (kc_key){.id = d, .build = 0};
}

/* In-process memo of manifests: base -> decoded manifest. */
struct mmemo {
    kc_digest base;
    struct kc__manifest *m;
    struct mmemo *next;
};
#define MMEMO_BUCKETS 1024
static struct mmemo *mmemo[MMEMO_BUCKETS];
KC__HOT static pthread_mutex_t mmemo_lock = PTHREAD_MUTEX_INITIALIZER;

/* Finds the result id of the first dependency set of `m` that still holds
 * (b: how, or NULL; its counts grow). */
int kc__manifest_match(const struct kc__manifest *m, struct kc__mcheck *b, kc_digest *result)
{
    struct kc__dirs dirs = {0};
    dirs.bundled = b != NULL ? b->bundled : NULL;
    dirs.pristine = b != NULL ? b->pristine : NULL;
    dirs.proof = b != NULL ? b->proof : NULL;
    int rc = -ENOENT;
    for (uint64_t i = 0; i < m->n && rc != 0; i++) {
        const struct kc__dep_set *s = &m->sets[i];
        uint64_t j = 0;
        while (j < s->n && kc__dep_holds(&s->deps[j], &dirs))
            j++;
        if (j == s->n) {
            *result = s->result;
            rc = 0;
        }
    }
    if (b != NULL) {
        b->checked += dirs.bundled_checked;
        b->mapped += dirs.bundled_mapped;
        b->read += dirs.bundled_read;
    }
    kc__dirs_close(&dirs);
    return rc;
}

/* The remote's manifest of mk (KCACHE_REMOTE), when the one found here
 * lists no set that holds: another node may have compiled these headers
 * since. Returns it decoded when one of its sets holds (*result set), and
 * keeps it locally in place of the stale one, marked as the remote's; else
 * NULL. */
static struct kc__manifest *remote_manifest(struct kc_store *st, const char *ns, const kc_key *mk,
                                            struct kc__mcheck *bundled, kc_digest *result)
{
    struct kc_remote *r = kc__remote();
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info;
    if (r == NULL || kc_remote_get(r, ns, mk, &body, &len, &info) != 0)
        return NULL;
    struct kc__manifest *m = kc__manifest_decode(body, len);
    if (m != NULL && kc__manifest_match(m, bundled, result) == 0) {
        kc__chain_fill_back(st, ns, mk, &info, body, len);
    } else {
        kc__manifest_free(m);
        m = NULL;
    }
    free(body);
    return m;
}

/* Looks the base up: memo first, then the store. 0 with *result set;
 * -ESTALE when the store has a manifest but none of its dependency sets
 * holds here (these headers differ from every compile it lists); else the
 * store's miss or error. */
int kc__manifest_lookup(struct kc_store *st, const struct kc_store_ops *api, const char *ns,
                        const kc_digest *base, struct kc__mcheck *bundled, kc_digest *result)
{
    size_t b = (base->lo ^ base->hi) % MMEMO_BUCKETS;
    pthread_mutex_lock(&mmemo_lock);
    kc__touch_for_write(&mmemo[b]); /* a miss here writes it below */
    for (struct mmemo *e = mmemo[b]; e != NULL; e = e->next) {
        if (e->base.lo == base->lo && e->base.hi == base->hi) {
            int rc = kc__manifest_match(e->m, bundled, result);
            pthread_mutex_unlock(&mmemo_lock);
            if (rc == 0)
                return 0;
            goto from_store;
        }
    }
    pthread_mutex_unlock(&mmemo_lock);
from_store:;
    kc_key mk = kc__manifest_key(base);
    void *body = NULL;
    size_t len = 0;
    int rc = api->get(st, ns, &mk, &body, &len, NULL);
    if (rc != 0)
        return rc;
    struct kc__manifest *m = kc__manifest_decode(body, len);
    api->free(body);
    if (m == NULL) {
        api->purge(st, ns, &mk);
        return -ENOENT;
    }
    rc = kc__manifest_match(m, bundled, result) == 0 ? 0 : -ESTALE;
    if (rc == -ESTALE) {
        struct kc__manifest *rm = remote_manifest(st, ns, &mk, bundled, result);
        if (rm != NULL) {
            kc__manifest_free(m);
            m = rm;
            rc = 0;
        }
    }
    pthread_mutex_lock(&mmemo_lock);
    struct mmemo *e = mmemo[b];
    while (e != NULL && !(e->base.lo == base->lo && e->base.hi == base->hi))
        e = e->next;
    if (e == NULL && (e = calloc(1, sizeof *e)) != NULL) {
        e->base = *base;
        e->next = mmemo[b];
        mmemo[b] = e;
    }
    if (e != NULL) {
        kc__manifest_free(e->m);
        e->m = m;
        m = NULL;
    }
    pthread_mutex_unlock(&mmemo_lock);
    kc__manifest_free(m);
    return rc;
}

/* Adds a dependency set to the manifest of `base` (newest first, bounded)
 * and stores it. A race with another writer loses one set: a recompile. */
int kc__manifest_add(struct kc_store *st, const struct kc_store_ops *api, const char *ns,
                     const kc_digest *base, const kc_digest *result, const struct kc__deps *d)
{
    kc_key mk = kc__manifest_key(base);
    void *body = NULL;
    size_t len = 0;
    struct kc__manifest *old = NULL;
    struct kc_record_info info = {0};
    if (api->get(st, ns, &mk, &body, &len, &info) == 0) {
        old = kc__manifest_mergeable(info.prov) ? kc__manifest_decode(body, len) : NULL;
        api->free(body);
    }
    struct kc_buf b = {0};
    kc__manifest_encode(&b, result, d->v, d->n, old);
    kc__manifest_free(old);
    int rc = b.err ? b.err : api->put(st, ns, &mk, NULL, KC_KIND_MANIFEST, b.p, b.len, 0);
    kc_buf_free(&b);
    return rc;
}
