/*
 * clock.h: the two clocks kcache reads, with two names.
 */
#ifndef KCACHE_COMMON_CLOCK_H
#define KCACHE_COMMON_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

/* Nanoseconds of CLOCK_MONOTONIC: for intervals, deadlines and backoff. */
uint64_t kc_mono_ns(void);

/* Nanoseconds of CLOCK_REALTIME (since the epoch): for times that are
 * stored or compared across processes (record creation, last hit). */
uint64_t kc_wall_ns(void);

struct timespec;
/* Waits (0.5 ms at a time, 20 ms at most) until the coarse realtime
 * clock, the one inode times come from, is strictly past the fine one's
 * now, and reads it into *coarse: every ctime given before the call is
 * older than *coarse, every one given after is not. Both read from the
 * kernel (no interposed clock_gettime, such as libfaketime's). False when
 * a clock cannot be read or the coarse one does not get there. */
bool kc_coarse_past_now(struct timespec *coarse);

#endif
