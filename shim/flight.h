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

#endif
