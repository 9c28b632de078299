/*
 * clock.c: monotonic and wall-clock time (clock.h).
 */
#include "clock.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

bool kc_coarse_past_now(struct timespec *coarse)
{
    struct timespec fine;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &fine) != 0)
        return false;
    for (int i = 0; i < 40; i++) {
        if (syscall(SYS_clock_gettime, CLOCK_REALTIME_COARSE, coarse) != 0)
            return false;
        if (coarse->tv_sec > fine.tv_sec ||
            (coarse->tv_sec == fine.tv_sec && coarse->tv_nsec > fine.tv_nsec))
            return true;
        nanosleep(&(struct timespec){0, 500000}, NULL);
    }
    return false;
}
