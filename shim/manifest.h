/*
 * Manifests: a request's key without the files it read ("base") names a
 * manifest listing, for each set of files seen, the files' digests and the
 * absent paths probed (deps.h); the result's key is the base plus the set
 * that still holds (ccache's direct mode). NVRTC's headers (nvrtc.c) and an
 * nvcc tree's reads (nvcc.c) are both checked this way.
 */
#ifndef KCACHE_MANIFEST_H
#define KCACHE_MANIFEST_H

#include "codec.h"
#include "deps.h"

#include "../store/store.h"

/* How a manifest's sets are checked: NVRTC's bundled headers directory of
 * the request (NULL: none) and what answers for it (deps.h's kc__dirs),
 * and the counts of its checks, which grow. */
struct kc__mcheck {
    const char *bundled;
    const struct kc__pristine *pristine;
    const struct kc__pristine_proof *proof;
    uint64_t checked, mapped, read;
};

/* The result id of a base with a dependency set. */
kc_digest kc__manifest_result_id(const kc_digest *base, const struct kc__dep *deps, uint64_t n);

/* The key of the manifest of `base`. */
kc_key kc__manifest_key(const kc_digest *base);

/* Finds the result id of the first dependency set of `m` that still holds
 * (c: how, may be NULL). 0, or -ENOENT. */
int kc__manifest_match(const struct kc__manifest *m, struct kc__mcheck *c, kc_digest *result);

/* Looks the base up: the process's memo first, then the store (and the
 * remote's manifest when the one found here has no set that holds). 0
 * with *result set; -ESTALE when the store has a manifest but none of its
 * dependency sets holds here; else the store's miss or error. */
int kc__manifest_lookup(struct kc_store *st, const struct kc_store_ops *api, const char *ns,
                        const kc_digest *base, struct kc__mcheck *c, kc_digest *result);

/* Adds a dependency set to the manifest of `base` (newest first, bounded)
 * and stores it. A race with another writer loses one set: a recompile. */
int kc__manifest_add(struct kc_store *st, const struct kc_store_ops *api, const char *ns,
                     const kc_digest *base, const kc_digest *result, const struct kc__deps *d);

#endif
