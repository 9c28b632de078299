/*
 * The mechanism the families share, as one header every family includes:
 * the bottom (core.h), the hooks (hook.h), and this process's store,
 * remote, counters and exit (state.c). Not installed, not exported.
 */
#ifndef KCACHE_SHIM_H
#define KCACHE_SHIM_H

#include "core.h"
#include "hook.h"

/* ---- state ---------------------------------------------------------- */

/* The store (the front, front.h), opened on first call. Returns NULL when
 * the cache is off or the store cannot be used (one warning was logged);
 * *api, the operations on it, is set when non-NULL is returned. */
struct kc_store *kc__store(const struct kc_store_ops **api);

/* The remote tier's handle (KCACHE_REMOTE), set up with the store; NULL
 * when none is configured or the store is not open. Hosts only read it
 * (the chain's remote tier) and take its cluster-wide locks (flight.h). */
struct kc_remote;
struct kc_remote *kc__remote(void);

/* Adds to this process's counters of `backend` (printed by KCACHE_STATS and
 * handed to the store at exit). Thread-safe. */
void kc__count(const char *backend, const struct kc_counters *c);

/* Notes why one request of `backend` passed through (its pass-through
 * itself is counted with kc__count). Thread-safe. */
void kc__pass_reason(const char *backend, enum kc_pass_reason r);

/* In a compiler tool's watched child: no counters, no stats line. */
void kc__tool_child(void);

/* Leaves the process with `status` from a constructor, where exit() would
 * run no destructor (the loader registers them after the constructors):
 * the counters are flushed and the stats line printed first. */
__attribute__((noreturn)) void kc__exit(int status);

/* The counters flushed and the KCACHE_STATS line printed: what the
 * destructor (shim.c) and kc__exit do. */
void kc__state_fini(void);

/* Registers the fork handlers (store lock, a child's own counters): the
 * entry's constructor (shim.c). */
void kc__state_atfork(void);

#endif
