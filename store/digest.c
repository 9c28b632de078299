/*
 * digest.c: the store's own definitions of two helpers the preloaded shim
 * defines itself (so base.h's files, compiled into both, use neither's
 * private meaning): XXH3-128 of bytes, and the wall clock.
 */
#include "internal.h"

#include <xxhash.h>

kc_digest kc__digest_of(const void *p, size_t len)
{
    XXH128_hash_t h = XXH3_128bits(p, len);
    return (kc_digest){.lo = h.low64, .hi = h.high64};
}

uint64_t kc__now_ns(void)
{
    return kc__wall_ns();
}
