/*
 * clock.h: the two clocks kcache reads, with two names.
 */
#ifndef KCACHE_COMMON_CLOCK_H
#define KCACHE_COMMON_CLOCK_H

#include <stdint.h>

/* Nanoseconds of CLOCK_MONOTONIC: for intervals, deadlines and backoff. */
uint64_t kc_mono_ns(void);

/* Nanoseconds of CLOCK_REALTIME (since the epoch): for times that are
 * stored or compared across processes (record creation, last hit). */
uint64_t kc_wall_ns(void);

#endif
