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

/* A server that answered this process and then refused (a restart, most
 * often: a connection is made per operation) is asked again after a short
 * backoff (KC__REFUSED_FIRST_MS, doubling). Each node compiling alone
 * inside it made a restart at the first lock cost 9 compiles for 4 kernels
 * on 4 nodes (issue 47): a request waits for that retry when it is due
 * within BACK_WAIT_MAX_MS, these waits bounded by BACK_WAIT_TOTAL_MS over
 * the process, so a server that stays down costs that once. A server that
 * never answered, or one off for a long backoff, is not waited for. */
#define BACK_WAIT_MAX_MS 250
#define BACK_WAIT_TOTAL_MS 1000
static uint64_t back_waited_ns;

/* The remote is off here: waits for its retry when that is soon (above)
 * and before deadline (0: none). True: usable again. */
static bool back_soon(struct kc_remote *r, uint64_t deadline)
{
    for (int i = 0; i < 4; i++) {
        if (kc_remote_usable(r))
            return true;
        int ms = kc_remote_back_in_ms(r);
        uint64_t ns = (uint64_t)(ms > 0 ? ms : 1) * 1000000ull;
        uint64_t now = kc_mono_ns();
        if (ms < 0 || ms > BACK_WAIT_MAX_MS ||
            __atomic_load_n(&back_waited_ns, __ATOMIC_RELAXED) + ns >
                (uint64_t)BACK_WAIT_TOTAL_MS * 1000000ull ||
            (deadline != 0 && now + ns > deadline))
            return false;
        struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
        nanosleep(&ts, NULL);
        __atomic_add_fetch(&back_waited_ns, kc_mono_ns() - now, __ATOMIC_RELAXED);
    }
    return kc_remote_usable(r);
}

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

/* Why this node compiles a request (or does not) while a remote is
 * configured: every compile the cluster's single flight could have spared
 * says which it was, once, naming the key (see flight_logged). */
enum flight_why {
    W_SERVED,   /* a poll served the request: no compile */
    W_TAKEN,    /* this node took the lock: the cluster's compile of it */
    W_REFUSED,  /* waited: the holder's result is there, but not for this node */
    W_OFF,      /* waited: this process turned the remote off */
    W_FREED,    /* waited: the lock went without a result (taken here, or gone) */
    W_DEADLINE, /* waited: KCACHE_LOCK_TIMEOUT (or what is left of it) ran out */
    W_NOWRITER, /* waited: a read-only node, no lock, no trusted writer at work now */
    /* Not waited on: */
    N_OFF,       /* the remote is off here (a failure's backoff, unusable) */
    N_FULL,      /* the lock refused: the server is full */
    N_UNTRUSTED, /* the lock held, but not by a trusted writer */
    N_FAILED,    /* the remote failed taking the lock */
    N_READONLY,  /* a read-only node: no lock, no trusted writer at work */
    N_BUDGET,    /* this process's unserved waits used its KCACHE_LOCK_TIMEOUT */
    N_HEADERS,   /* the remote's manifest lists only other headers (nvrtc.c) */
    N_CONFIG,    /* KCACHE_SINGLE_FLIGHT=0, KCACHE_READONLY or KCACHE_RECACHE */
};

/* Each reason's word in the log (`compiling here [WORD]`: what a script
 * or an operator greps for), what it means, and its counter (-1: none). */
static const struct {
    const char *word, *what;
    int counter;
} whys[] = {
    [W_SERVED] = {"served", "served", -1},
    [W_TAKEN] = {"lock", "took the cluster's lock: no node has it", -1},
    [W_REFUSED] = {"unusable", "its result is there but not usable here",
                   KC_REMOTE_FLIGHT_UNUSABLE},
    [W_OFF] = {"off", "the remote went off here", KC_REMOTE_FLIGHT_OFF},
    [W_FREED] = {"freed",
                 "the lock went without a result (its holder gave up, died or was failed over)",
                 KC_REMOTE_FLIGHT_FREED},
    [W_DEADLINE] = {"deadline", "the wait's bound ran out", KC_REMOTE_FLIGHT_DEADLINE},
    [W_NOWRITER] = {"no-writer", "no trusted writer took its lock, and none is at work now",
                    KC_REMOTE_FLIGHT_NO_WRITER},
    [N_OFF] = {"off", "the remote is off here: no cluster single flight", KC_REMOTE_FLIGHT_OFF},
    [N_FULL] = {"full", "the server refused the lock (full) and no trusted writer holds it",
                KC_REMOTE_FLIGHT_NO_LOCK},
    [N_UNTRUSTED] = {"untrusted", "its lock is held, but not by a trusted writer: not waited on",
                     KC_REMOTE_FLIGHT_NO_LOCK},
    [N_FAILED] = {"failed", "the remote failed taking the lock", KC_REMOTE_FLIGHT_NO_LOCK},
    [N_READONLY] = {"no-writer", "a read-only node: no lock, and no trusted writer at work",
                    KC_REMOTE_FLIGHT_NO_WRITER},
    [N_BUDGET] = {"budget",
                  "another node holds its lock; not waited on: this process's waits used its "
                  "KCACHE_LOCK_TIMEOUT already",
                  KC_REMOTE_FLIGHT_DEADLINE},
    [N_HEADERS] = {"headers", "the remote's manifest lists only other headers than this node's",
                   KC_REMOTE_FLIGHT_UNUSABLE},
    [N_CONFIG] = {"config", "single flight off here (KCACHE_SINGLE_FLIGHT, _READONLY, _RECACHE)",
                  -1},
};

/* Logs why this node compiles (ns, key), or that a wait served it, in one
 * line naming the key by its first 16 hex digits (as `kcache show`
 * takes it), and counts a compile the cluster did not spare. At debug,
 * as the compile's own line; a wait that was not served and cost
 * something a host notices (100 ms or more) is the one warning of the
 * process, then info: the host paid for a compile it did not get. A
 * result that does not fit this node (its headers differ) is no fault:
 * debug. ms < 0: not waited. */
static void flight_logged(struct kc_remote *r, const kc_key *key, enum flight_why why, int ms)
{
    if (r != NULL && whys[why].counter >= 0)
        kc_remote_flight_unspared(r, (enum kc_remote_flight)whys[why].counter);
    int level = KC_LOG_DEBUG;
    if (ms >= 100 && why != W_SERVED && why != W_REFUSED) {
        static int warned;
        level = __atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED) ? KC_LOG_INFO : KC_LOG_WARN;
    }
    if (!kc__log_enabled(level))
        return;
    unsigned long long k = (unsigned long long)key->id.hi;
    if (why == W_SERVED)
        kc_log(level, "remote: key %016llx: served after waiting %d ms for another node's compile",
               k, ms);
    else if (ms >= 0)
        kc_log(level,
               "remote: key %016llx: waited %d ms for another node's compile and was not served "
               "(%s); compiling here [%s]",
               k, ms, whys[why].what, whys[why].word);
    else
        kc_log(level, "remote: key %016llx: compiling here [%s]: %s", k, whys[why].word,
               whys[why].what);
}

void kc__flight_remote_skipped(const kc_key *key)
{
    if (kc__remote() != NULL)
        flight_logged(kc__remote(), key, N_HEADERS, -1);
}

/* A read-only node (the lock's answer -EROFS: no lock, none to take)
 * with a trusted writer at work in ns. */
static bool writer_at_work(struct kc_remote *r, const char *ns, int lock_rc)
{
    return lock_rc == -EROFS && kc_remote_writer_active(r, ns) == 1;
}

/* Why a lock's answer (not 0, not -EBUSY) leaves nothing to wait on. */
static enum flight_why not_waited(int rc)
{
    switch (rc) {
    case -EROFS:
        return N_READONLY;
    case -ENOSPC:
        return N_FULL;
    case -EKEYREJECTED:
        return N_UNTRUSTED;
    default:
        return N_FAILED;
    }
}

int kc__flight_remote(const char *ns, const kc_key *key, int (*poll)(void *arg), void *arg,
                      bool *held)
{
    *held = false;
    const struct kc_config *cfg = kc__config();
    struct kc_remote *r = kc__remote();
    if (r == NULL)
        return 0;
    if (!cfg->single_flight || cfg->readonly || cfg->recache) {
        flight_logged(NULL, key, N_CONFIG, -1);
        return 0;
    }
    if (!back_soon(r, 0)) {
        flight_logged(r, key, N_OFF, -1);
        return 0;
    }
    int ttl = cfg->lock_timeout_ms > 0 ? cfg->lock_timeout_ms : 1;
    int rc = kc_remote_lock(r, ns, key, ttl);
    /* The lock failed and turned the remote off (refused: a restart):
     * asked once more when its retry is soon. */
    if (rc != 0 && rc != -EBUSY && !kc_remote_usable(r) && back_soon(r, 0))
        rc = kc_remote_lock(r, ns, key, ttl);
    if (rc == 0) {
        /* Taken. The entry may have gone up since this node's last look
         * (the holder's owner uploads, then deletes the lock, between
         * that look and this lock): one more look, else this node
         * compiles what another published a moment ago. */
        if (poll_once(r, poll, arg) > 0) {
            kc_remote_unlock(r, ns, key);
            kc_log(KC_LOG_DEBUG,
                   "remote: key %016llx: served: published just before this node took its lock",
                   (unsigned long long)key->id.hi);
            return 1;
        }
        *held = true;
        flight_logged(r, key, W_TAKEN, -1);
        return 0;
    }
    /* Not -EBUSY: this node holds no lock and nobody it trusts does (a
     * read-only node, a lock a trusted writer did not take, or the remote
     * failed): compile; but a read-only node waits while a trusted writer
     * is at work in this namespace (it took a lock lately): a writer going
     * through the same programs in another order takes this one's lock
     * soon, and read-only nodes that compiled before it did made every
     * node compile every program on a loaded machine (issue 47). */
    if (rc != -EBUSY && !writer_at_work(r, ns, rc)) {
        flight_logged(r, key, kc_remote_usable(r) ? not_waited(rc) : N_OFF, -1);
        return 0;
    }
    uint64_t budget = (uint64_t)cfg->lock_timeout_ms * 1000000ull;
    uint64_t spent = __atomic_load_n(&wasted_ns, __ATOMIC_RELAXED);
    if (spent >= budget) {
        flight_logged(r, key, N_BUDGET, -1);
        return 0;
    }
    /* A trusted writer compiles it: its owner uploads the result after its
     * synced batch, then deletes the lock. Poll with a backoff until the
     * result is there, the lock is free again (published, or the holder
     * died or gave up), or the bound. */
    uint64_t start = kc_mono_ns();
    uint64_t wait = budget - spent;
    uint64_t deadline = start + wait;
    kc_log(KC_LOG_DEBUG, "remote: key %016llx: %s; waiting up to %d ms",
           (unsigned long long)key->id.hi,
           rc == -EBUSY ? "another node holds the lock of a compile"
                        : "no lock, but a trusted writer is at work",
           (int)(wait / 1000000));
    enum flight_why end = W_DEADLINE;
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
            flight_logged(r, key, W_SERVED, (int)((kc_mono_ns() - start) / 1000000));
            return 1;
        }
        kc_remote_counters(r, &after);
        /* The holder's result is there but refused here (damaged, or not
         * signed by a key this node trusts): nothing to wait for. */
        if (p < 0 || after.bad != before.bad) {
            end = W_REFUSED;
            goto wasted;
        }
        if (!back_soon(r, deadline)) {
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
                flight_logged(r, key, W_SERVED, (int)((kc_mono_ns() - start) / 1000000));
                return 1;
            }
            *held = true;
            end = W_FREED;
            goto wasted;
        }
        if (rc != -EBUSY && !writer_at_work(r, ns, rc)) {
            /* Gone, and this node takes none (read-only): one more look. */
            if (poll_once(r, poll, arg) > 0) {
                flight_logged(r, key, W_SERVED, (int)((kc_mono_ns() - start) / 1000000));
                return 1;
            }
            end = rc == -EROFS ? W_NOWRITER : W_FREED;
            goto wasted;
        }
    }
wasted:
    flight_logged(r, key, end, (int)((kc_mono_ns() - start) / 1000000));
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
