/*
 * internal.h: every internal header of libkcache-store.so, for the store's
 * white-box tests. No file of store/db/ includes it: each includes the
 * header of the layer it stands on (ARCHITECTURE.md, "store/db/ in
 * layers"). Nothing here is part of the ABI (store.h is). The libc-only
 * part (layouts, files, directory layout, filter, hot files, the chain of
 * tiers) is store/local/, which the preloaded shim compiles too.
 */
#ifndef KCACHE_STORE_INTERNAL_H
#define KCACHE_STORE_INTERNAL_H

#include "db_tier.h"
#include "jobs.h"
#include "owner.h"

#endif
