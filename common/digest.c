/*
 * digest.c: XXH3-128 of bytes (digest.h). xxHash is compiled in
 * (XXH_INLINE_ALL), so whoever links common/ needs no libxxhash.
 */
#include "digest.h"

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

kc_digest kc_digest_of(const void *p, size_t len)
{
    XXH128_hash_t h = XXH3_128bits(p, len);
    return (kc_digest){.lo = h.low64, .hi = h.high64};
}
