/*
 * digest.h: kcache's one content digest, XXH3-128.
 */
#ifndef KCACHE_COMMON_DIGEST_H
#define KCACHE_COMMON_DIGEST_H

#include <stddef.h>
#include <stdint.h>

/* An XXH3-128 digest. */
typedef struct kc_digest {
    uint64_t lo, hi;
} kc_digest;

/* XXH3-128 of `len` bytes at `p` (p may be NULL when len is 0). */
kc_digest kc_digest_of(const void *p, size_t len);

#endif
