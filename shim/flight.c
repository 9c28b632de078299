/*
 * Single flight across processes. See flight.h.
 */
#include "flight.h"
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* DIR/locks, created 0700 and checked once: ours, a directory, private. */
static int locks_dir(char *out, size_t len)
{
    KC__HOT static int state; /* 0 untried, 1 usable, -1 not */
    const struct kc_config *cfg = kc__config();
    if ((size_t)snprintf(out, len, "%s/locks", cfg->dir) >= len)
        return -ENAMETOOLONG;
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s != 0)
        return s > 0 ? 0 : -EPERM;
    /* Made only when absent (one system call less on every start). */
    struct stat st;
    int have = lstat(out, &st) == 0;
    if (!have && errno == ENOENT) {
        if (mkdir(out, 0700) != 0 && errno != EEXIST) {
            int e = errno;
            __atomic_store_n(&state, -1, __ATOMIC_RELEASE);
            return -e;
        }
        have = lstat(out, &st) == 0;
    }
    int ok = have && S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 022) == 0;
    __atomic_store_n(&state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok ? 0 : -EPERM;
}

int kc__flight_prepare(void)
{
    char dir[4200];
    return locks_dir(dir, sizeof dir);
}

/* Whether path still names the file fd is open on. A lock file nobody holds
 * may be removed (the owner prunes DIR/locks while holding each file's
 * lock): a lock then taken on the removed file would exclude nobody. */
static bool still_named(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

int kc__flight_acquire(const kc_digest *id, bool *waited)
{
    *waited = false;
    const struct kc_config *cfg = kc__config();
    if (!cfg->single_flight || cfg->readonly || cfg->recache)
        return -1;
    char dir[4200], path[4300], hex[33];
    if (locks_dir(dir, sizeof dir) != 0)
        return -1;
    kc__digest_hex(id, hex);
    snprintf(path, sizeof path, "%s/%s", dir, hex);
    uint64_t deadline = 0;
    int tries = 0;
again:;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        goto locked;
    if (errno != EWOULDBLOCK) {
        close(fd);
        return -1;
    }
    /* Someone is compiling this request: wait for it, polling with a
     * backoff, until it finishes (or dies: the kernel drops its lock). */
    *waited = true;
    if (deadline == 0)
        deadline = kc_mono_ns() + (uint64_t)cfg->lock_timeout_ms * 1000000ull;
    long sleep_us = 1000;
    while (kc_mono_ns() < deadline) {
        struct timespec ts = {0, sleep_us * 1000};
        nanosleep(&ts, NULL);
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            goto locked;
        if (sleep_us < 20000)
            sleep_us += sleep_us / 2;
    }
    kc_log(KC_LOG_INFO, "waited %d ms for another process's compile; compiling here",
           cfg->lock_timeout_ms);
    close(fd);
    return -1;
locked:
    if (still_named(fd, path))
        return fd;
    close(fd); /* pruned meanwhile: take the file that is there now */
    if (++tries < 8)
        goto again;
    return -1;
}

void kc__flight_release(int fd)
{
    if (fd >= 0)
        close(fd); /* drops the flock */
}
