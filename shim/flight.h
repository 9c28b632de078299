/*
 * Single flight across processes: when several processes (or threads) miss
 * on the same request at once (an NVRTC compile or a driver JIT load), one
 * compiles and the others wait for its result, bounded by
 * KCACHE_LOCK_TIMEOUT. The lock is an flock() on a file
 * in DIR/locks, so it dies with its holder.
 */
#ifndef KCACHE_FLIGHT_H
#define KCACHE_FLIGHT_H

#include <stdbool.h>

#include "../store/store.h"

#include <stddef.h>

/* Creates DIR/locks (0700) or checks it: a directory of this user that
 * nobody else can write. 0, or a negative errno when it is not (the caller
 * then turns the cache off: another user could stall or steer compiles). */
int kc__flight_prepare(void);

/* Takes the lock of `id` (the digest that names the request: NVRTC's base
 * key, the driver JIT's key), waiting at most the configured bound while
 * another holder compiles. Returns a descriptor >= 0 when held (release it
 * with kc__flight_release), or -1 when single flight is off, unusable, or
 * the wait timed out (the caller compiles anyway). *waited says whether
 * another holder was seen: the caller then looks the store up again. */
int kc__flight_acquire(const kc_digest *id, bool *waited);

void kc__flight_release(int fd);

/* ---- cluster-wide (rflight.c) ---------------------------------------------
 *
 * Cluster-wide single flight (KCACHE_REMOTE set), after the local lock
 * and a miss: one node compiles a request, the others are served its
 * result through the remote. Takes the remote lock of (ns, key) (the
 * manifest's key for NVRTC, the JIT key for the driver; it expires after
 * KCACHE_LOCK_TIMEOUT, so a holder that dies frees it). When another node
 * holds it, polls with a backoff, bounded by KCACHE_LOCK_TIMEOUT: `poll`
 * looks the request up again (the chain, so the remote too) and returns 1
 * when it served it, 0 to keep waiting, -1 to stop (the remote holds
 * another node's result that does not fit this one: its headers differ);
 * between polls the lock is asked for again, so a lock that expired is
 * taken; a lock taken is followed by one more poll (the entry may have
 * gone up since the caller's look). Returns 1: served by a poll. 0:
 * compile; *held says whether this process holds the lock (release it
 * with kc__flight_remote_release). Never fails otherwise: no remote, a
 * read-only node (it must not make others wait for it), or a remote that
 * fails: compile. With a remote configured, every 0 logs one line at
 * debug (`remote: key <16 hex>: ... compiling here [<reason>]`; a costly
 * unserved wait warns once, then info) and a compile the cluster did not
 * spare is counted under its reason (the remote's flight_* counters). */
int kc__flight_remote(const char *ns, const kc_key *key, int (*poll)(void *arg), void *arg,
                      bool *held);

/* The caller compiles `key` without the cluster's single flight: the
 * remote's manifest for it lists only other headers than this node's
 * (nothing to wait for). Logged and counted as kc__flight_remote's
 * reasons are (when a remote is configured). */
void kc__flight_remote_skipped(const kc_key *key);

/* After the compile: a lock this process holds is released only when the
 * result will not reach the remote (not `stored`, or its largest entry,
 * `len` bytes, is past KCACHE_REMOTE_MAX_ENTRY): else the owner uploads it
 * after its synced batch, waiters are served that, and the lock expires by
 * itself. */
void kc__flight_remote_release(const char *ns, const kc_key *key, bool held, bool stored,
                               size_t len);

#endif
