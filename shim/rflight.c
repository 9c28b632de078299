/*
 * Single flight across the machines that share a remote (KCACHE_REMOTE):
 * the remote's lock, polled with a backoff. See flight.h. Apart from
 * flight.c so that the local part builds without the remote tier.
 */
#include "flight.h"
#include "shim.h"
#include "../store/remote/remote.h"

#include <errno.h>
#include <time.h>

/* Time this process spent waiting on other nodes' locks without being
 * served (the holder gave up, died, or never was a compile): bounded by
 * one KCACHE_LOCK_TIMEOUT over the process, so no lock, a forged one or a
 * holder that never publishes, costs more than that in all. */
static uint64_t wasted_ns;

/* One poll of the entry, its misses counted as polls. */
static int poll_once(struct kc_remote *r, int (*poll)(void *arg), void *arg)
{
    kc_remote_polling(true);
    int p = poll(arg);
    kc_remote_polling(false);
    if (p > 0)
        kc_remote_poll_served(r);
    return p;
}

int kc__flight_remote(const char *ns, const kc_key *key, int (*poll)(void *arg), void *arg,
                      bool *held)
{
    *held = false;
    const struct kc_config *cfg = kc__config();
    struct kc_remote *r = kc__remote();
    if (r == NULL || !cfg->single_flight || cfg->readonly || cfg->recache || !kc_remote_usable(r))
        return 0;
    int ttl = cfg->lock_timeout_ms > 0 ? cfg->lock_timeout_ms : 1;
    int rc = kc_remote_lock(r, ns, key, ttl);
    if (rc == 0) {
        *held = true;
        return 0;
    }
    /* Not -EBUSY: this node holds no lock and nobody it trusts does (a
     * read-only node, a lock a trusted writer did not take, or the remote
     * failed): compile. */
    if (rc != -EBUSY)
        return 0;
    uint64_t budget = (uint64_t)cfg->lock_timeout_ms * 1000000ull;
    uint64_t spent = __atomic_load_n(&wasted_ns, __ATOMIC_RELAXED);
    if (spent >= budget)
        return 0;
    /* A trusted writer compiles it: its owner uploads the result after its
     * synced batch, then deletes the lock. Poll with a backoff until the
     * result is there, the lock is free again (published, or the holder
     * died or gave up), or the bound. */
    uint64_t start = kc_mono_ns();
    uint64_t wait = budget - spent;
    if (wait > (uint64_t)cfg->lock_timeout_ms * 1000000ull)
        wait = (uint64_t)cfg->lock_timeout_ms * 1000000ull;
    uint64_t deadline = start + wait;
    long sleep_us = 2000;
    while (kc_mono_ns() < deadline) {
        struct timespec ts = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        if (sleep_us < 100000)
            sleep_us += sleep_us / 2;
        struct kc_remote_counters before = {0}, after = {0};
        kc_remote_counters(r, &before);
        int p = poll_once(r, poll, arg);
        if (p > 0)
            return 1;
        kc_remote_counters(r, &after);
        /* The holder's result is there but refused here (damaged, or not
         * signed by a key this node trusts): nothing to wait for. */
        if (p < 0 || after.bad != before.bad || !kc_remote_usable(r))
            goto wasted;
        rc = kc_remote_lock(r, ns, key, ttl);
        if (rc == 0) {
            /* Free again: the holder died or gave up, or its result went
             * up just after the poll (its owner deletes the lock then).
             * One more look before compiling. */
            if (poll_once(r, poll, arg) > 0) {
                kc_remote_unlock(r, ns, key);
                return 1;
            }
            *held = true;
            goto wasted;
        }
        if (rc != -EBUSY) {
            /* Gone, and this node takes none (read-only): one more look. */
            if (poll_once(r, poll, arg) > 0)
                return 1;
            goto wasted;
        }
    }
    kc_log(KC_LOG_INFO, "waited %d ms for another node's compile; compiling here",
           (int)((kc_mono_ns() - start) / 1000000));
wasted:
    __atomic_add_fetch(&wasted_ns, kc_mono_ns() - start, __ATOMIC_RELAXED);
    return 0;
}

void kc__flight_remote_release(const char *ns, const kc_key *key, bool held, bool stored,
                               size_t len)
{
    struct kc_remote *r = kc__remote();
    if (!held || r == NULL || (stored && len <= kc_remote_max_entry(r)))
        return;
    kc_remote_unlock(r, ns, key);
}
