/*
 * The store's front in the preloaded shim: the chain of tiers
 * (store/local/chain.h) the hooks use through kc__chain_ops, served
 * without loading RocksDB where it can be.
 *
 * A hit is read by the local tier from the spool (p-, d- files) or from
 * DIR/hot, the files the owner keeps of drained entries; a miss is told by
 * DIR/filter, the owner's Bloom filter of every key in the database, in a
 * proxy of the database tier. Only when the filter says "maybe" is
 * libkcache-store.so (RocksDB, libstdc++) loaded and the request forwarded
 * to its database tier. Writes (put, purge, hit and counter logs) are
 * spool files the local tier writes. See ARCHITECTURE.md, "The store".
 */
#ifndef KCACHE_SHIM_FRONT_H
#define KCACHE_SHIM_FRONT_H

#include "../store/store.h"

/* Opens the front on opts->dir (copied): the chain's open (which checks the
 * directory) with the database tier's proxy behind the local tier. `load`
 * dlopen()s the store library when a request needs it (NULL on failure).
 * 0 with *out (use it through kc__chain_ops), or negative errno. */
int kc__front_open(const struct kc_store_options *opts, void *(*load)(void), struct kc_store **out);

#endif
