/*
 * What a plain connection (redis.c, over hiredis 0.14) and a TLS one
 * (tls.c, over hiredis 1.2 in libkcache-remote-tls.so) do alike: wait for
 * a descriptor against a deadline of CLOCK_MONOTONIC, and say a failed
 * hiredis connect as a negative errno. Header-only: the TLS object links
 * nothing of the module's. Include it after a hiredis header (either
 * version: the REDIS_ERR_* codes are the same).
 */
#ifndef KCACHE_STORE_REMOTE_CONN_WAIT_H
#define KCACHE_STORE_REMOTE_CONN_WAIT_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static inline uint64_t kc__conn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Waits until fd is ready for `ev` or the deadline (CLOCK_MONOTONIC ns):
 * 0 (ready, or an error the next call will see), -ETIMEDOUT, -EIO. */
static inline int kc__conn_wait(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        uint64_t now = kc__conn_now_ns();
        if (now >= deadline)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = ev};
        uint64_t ms = (deadline - now + 999999) / 1000000;
        int r = poll(&p, 1, ms > 60000 ? 60000 : (int)ms);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -EIO;
    }
}

/* A hiredis context's error (err, errstr; saved_errno the errno right
 * after the call) as a negative errno: -ETIMEDOUT, -ECONNREFUSED,
 * -ECONNRESET, -EPROTO, -ENOMEM, another errno of the socket, or
 * -EHOSTUNREACH (REDIS_ERR_OTHER: the name did not resolve). */
static inline int kc__conn_error(int err, const char *errstr, int saved_errno)
{
    if (err == REDIS_ERR_EOF)
        return -ECONNRESET;
    if (err == REDIS_ERR_PROTOCOL)
        return -EPROTO;
    if (err == REDIS_ERR_OOM)
        return -ENOMEM;
    if (err == REDIS_ERR_IO) {
        if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT ||
            saved_errno == EINPROGRESS)
            return -ETIMEDOUT;
        if (saved_errno == ENOENT || saved_errno == ECONNREFUSED)
            return -ECONNREFUSED;
        if (saved_errno == EPIPE || saved_errno == ECONNRESET)
            return -ECONNRESET;
        if (strstr(errstr, "timed out") != NULL)
            return -ETIMEDOUT;
        return saved_errno > 0 ? -saved_errno : -EIO;
    }
    if (strstr(errstr, "timed out") != NULL)
        return -ETIMEDOUT;
    return -EHOSTUNREACH;
}

#endif
