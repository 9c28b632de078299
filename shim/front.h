/*
 * The store's front in the preloaded shim: the store API (store.h's table)
 * served without loading RocksDB where it can be.
 *
 * A hit is read from the spool (p-, d- files) or from DIR/hot, the files
 * the owner keeps of drained entries; a miss is told by DIR/filter, the
 * owner's Bloom filter of every key in the database. Only when the filter
 * says "maybe" is libkcache-store.so (RocksDB, libstdc++) loaded and the
 * request forwarded. Writes (put, purge, hit and counter logs) are spool
 * files the front writes itself. See ARCHITECTURE.md, "The store".
 */
#ifndef KCACHE_SHIM_FRONT_H
#define KCACHE_SHIM_FRONT_H

#include "../store/store.h"

/* Opens the front on opts->dir (copied) with the same checks as the store's
 * open (private directory, spool, hot). `load` dlopen()s the store library
 * when a request needs it (NULL on failure). 0 or negative errno. */
int kc__front_open(const struct kc_store_options *opts, void *(*load)(void),
                   struct kc_store **out);

/* The front's function table; its handles come from kc__front_open. */
const struct kc_store_api *kc__front_api(void);

#endif
