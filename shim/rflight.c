/*
 * Single flight across the machines that share a remote (KCACHE_REMOTE):
 * the remote's lock, polled with a backoff. See flight.h. Apart from
 * flight.c so that the local part builds without the remote tier.
 */
#include "flight.h"
#include "shim.h"
#include "../store/remote/remote.h"

#include <errno.h>
#include <stdio.h>
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

/* How a wait on another node's lock ended, for the log. */
enum wait_end {
    W_SERVED,   /* a poll served the request */
    W_REFUSED,  /* the holder's result is there, but not for this node */
    W_OFF,      /* this process turned the remote off */
    W_FREED,    /* the lock went without a result: taken here, or gone */
    W_DEADLINE, /* KCACHE_LOCK_TIMEOUT (or what is left of it) ran out */
    W_NOWRITER, /* a read-only node: no lock, and no trusted writer at work */
};

static const char *const wait_why[] = {
    [W_SERVED] = "served",
    [W_REFUSED] = "its result is there but not usable here",
    [W_OFF] = "the remote went off here",
    [W_FREED] = "the lock went without a result (its holder gave up, died or was failed over)",
    [W_DEADLINE] = "the wait's bound ran out",
    [W_NOWRITER] = "no trusted writer took its lock, and none is at work now",
};

/* Logs the end of a wait: at debug always; a wait that was not served
 * and cost something a host notices (100 ms or more) is the one warning
 * of the process, then info: the host paid for a compile it did not
 * get. A result that does not fit this node (its headers differ) is no
 * fault: debug. */
static void wait_logged(const char *ns, const kc_key *key, enum wait_end end, uint64_t ns_waited)
{
    int ms = (int)(ns_waited / 1000000);
    char name[KC_REMOTE_KEY_MAX];
    if (kc_remote_key_name(ns, key, name, sizeof name) != 0)
        snprintf(name, sizeof name, "%s", ns);
    if (end == W_SERVED) {
        kc_log(KC_LOG_DEBUG, "remote: %s: served after waiting %d ms for another node's compile",
               name, ms);
        return;
    }
    static int warned;
    int level = KC_LOG_DEBUG;
    if (ms >= 100 && end != W_REFUSED)
        level = __atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED) ? KC_LOG_INFO : KC_LOG_WARN;
    kc_log(level,
           "remote: %s: waited %d ms for another node's compile and was not served (%s); "
           "compiling here",
           name, ms, wait_why[end]);
}

/* A read-only node (the lock's answer -EROFS: no lock, none to take)
 * with a trusted writer at work in ns. */
static bool writer_at_work(struct kc_remote *r, const char *ns, int lock_rc)
{
    return lock_rc == -EROFS && kc_remote_writer_active(r, ns) == 1;
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
     * failed): compile; but a read-only node waits while a trusted writer
     * is at work in this namespace (it took a lock lately): a writer going
     * through the same programs in another order takes this one's lock
     * soon, and read-only nodes that compiled before it did made every
     * node compile every program on a loaded machine (issue 47). */
    if (rc != -EBUSY && !writer_at_work(r, ns, rc))
        return 0;
    uint64_t budget = (uint64_t)cfg->lock_timeout_ms * 1000000ull;
    uint64_t spent = __atomic_load_n(&wasted_ns, __ATOMIC_RELAXED);
    if (spent >= budget) {
        kc_log(KC_LOG_DEBUG,
               "remote: another node holds the lock of a compile; not waited on (this process "
               "waited %d ms unserved already)",
               (int)(spent / 1000000));
        return 0;
    }
    /* A trusted writer compiles it: its owner uploads the result after its
     * synced batch, then deletes the lock. Poll with a backoff until the
     * result is there, the lock is free again (published, or the holder
     * died or gave up), or the bound. */
    uint64_t start = kc_mono_ns();
    uint64_t wait = budget - spent;
    uint64_t deadline = start + wait;
    kc_log(KC_LOG_DEBUG, "remote: %s; waiting up to %d ms",
           rc == -EBUSY ? "another node holds the lock of a compile"
                        : "no lock, but a trusted writer is at work",
           (int)(wait / 1000000));
    enum wait_end end = W_DEADLINE;
    long sleep_us = 2000;
    while (kc_mono_ns() < deadline) {
        struct timespec ts = {sleep_us / 1000000, (sleep_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        if (sleep_us < 100000)
            sleep_us += sleep_us / 2;
        struct kc_remote_counters before = {0}, after = {0};
        kc_remote_counters(r, &before);
        int p = poll_once(r, poll, arg);
        if (p > 0) {
            wait_logged(ns, key, W_SERVED, kc_mono_ns() - start);
            return 1;
        }
        kc_remote_counters(r, &after);
        /* The holder's result is there but refused here (damaged, or not
         * signed by a key this node trusts): nothing to wait for. */
        if (p < 0 || after.bad != before.bad) {
            end = W_REFUSED;
            goto wasted;
        }
        if (!kc_remote_usable(r)) {
            end = W_OFF;
            goto wasted;
        }
        rc = kc_remote_lock(r, ns, key, ttl);
        if (rc == 0) {
            /* Free again: the holder died or gave up, or its result went
             * up just after the poll (its owner deletes the lock then).
             * One more look before compiling. */
            if (poll_once(r, poll, arg) > 0) {
                kc_remote_unlock(r, ns, key);
                wait_logged(ns, key, W_SERVED, kc_mono_ns() - start);
                return 1;
            }
            *held = true;
            end = W_FREED;
            goto wasted;
        }
        if (rc != -EBUSY && !writer_at_work(r, ns, rc)) {
            /* Gone, and this node takes none (read-only): one more look. */
            if (poll_once(r, poll, arg) > 0) {
                wait_logged(ns, key, W_SERVED, kc_mono_ns() - start);
                return 1;
            }
            end = rc == -EROFS ? W_NOWRITER : W_FREED;
            goto wasted;
        }
    }
wasted:
    wait_logged(ns, key, end, kc_mono_ns() - start);
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
