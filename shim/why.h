/*
 * why.h: the shim's side of `kcache why` (common/why.h): at a miss, a
 * backend adds what went into its key and hands the record to the store's
 * directory.
 */
#ifndef KCACHE_SHIM_WHY_H
#define KCACHE_SHIM_WHY_H

#include <stdint.h>

#include "deps.h"
#include "../common/why.h"

/* Entries the remote has refused this process so far (unsigned, or signed
 * by a key KCACHE_REMOTE_TRUST does not trust): taken before a lookup and
 * handed to kc__why_finish, which records how many the lookup refused. */
uint64_t kc__why_refused(void);

/* Adds the library `fn` lies in (its path, `version` shown) under the
 * digest `id` kcache keys it by, and kcache's own build. */
void kc__why_library(struct kc_why *w, const char *label, const void *fn, const kc_digest *id,
                     const char *version);

/* Adds the files a compile read or probed (and its working directory). */
void kc__why_deps(struct kc_why *w, const struct kc__deps *d);

/* Writes the record (not for a read-only store, nor with the store off):
 * `stored` is NULL when the result was stored, else why not. */
void kc__why_finish(struct kc_why *w, const kc_digest *key, uint64_t build, const char *stored,
                    uint64_t compile_ns, uint64_t refused_before);

#endif
