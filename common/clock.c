/*
 * clock.c: monotonic and wall-clock time (clock.h).
 */
#include "clock.h"

#include <time.h>

static uint64_t read_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kc_mono_ns(void)
{
    return read_ns(CLOCK_MONOTONIC);
}

uint64_t kc_wall_ns(void)
{
    return read_ns(CLOCK_REALTIME);
}
