/*
 * upload.c: the owner's uploads to the remote tier (KCACHE_REMOTE).
 *
 * Host processes never write to the remote: what they compile goes to the
 * spool, and the owner uploads each put once the batch holding it is
 * synced (drain.c calls kc__upload_round between the commit and the put
 * files' retirement), so no host waits on the network to store. Entries
 * a host was served by the remote (put files marked KC__PUT_FROM_REMOTE)
 * are not uploaded back. Within a round, manifests go last: a node that
 * finds a manifest then finds what it names. Once a manifest (or a JIT
 * entry) is up, the cluster-wide lock guarding it is deleted.
 *
 * The remote is opened once per process (an owner runs several sessions)
 * with retry_ms: a server that failed is tried again after a second,
 * doubling up to a minute. Puts that failed because the remote could not
 * be reached are remembered (bounded) and tried again from the database
 * once it can be; the rest (too large, read-only node, a full server) stay
 * local. The remote's counters are added to the store's statistics
 * (kc_remote_counters_pack) at the end of each round.
 */
#include "owner.h"
#include "../remote/remote.h"
#include "../../common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RETRY_MAX 4096
#define UPLOAD_FILE_MAX (1ull << 32)

struct retry {
    char ns[KC__NS_MAX + 1];
    kc_key key;
};

static pthread_mutex_t up_mu = PTHREAD_MUTEX_INITIALIZER;
static bool up_tried;
static struct kc_remote *up;
static struct kc_remote_counters up_reported; /* already in the statistics */
static struct retry *retries;
static size_t n_retries;

/* The process's remote, opened on first need; NULL without one. */
static struct kc_remote *remote_get(void)
{
    pthread_mutex_lock(&up_mu);
    if (!up_tried) {
        up_tried = true;
        struct kc_config *cfg = calloc(1, sizeof *cfg);
        if (cfg != NULL) {
            kc_config_load(cfg);
            struct kc_remote_settings s;
            kc_remote_settings_from_config(cfg, &s);
            struct kc_remote_config rc;
            char why[256];
            if (s.remote != NULL && s.remote[0] != '\0') {
                if (kc_remote_config_parse(&s, &rc, why, sizeof why) != 0)
                    kc_log(KC_LOG_WARN, "KCACHE_REMOTE: %s; nothing is uploaded", why);
                else if (rc.mode != KC_REMOTE_NONE &&
                         kc_remote_open(&rc, &(struct kc_remote_options){.retry_ms = 1000}, &up) !=
                             0)
                    up = NULL;
                kc_remote_config_free(&rc);
            }
            free(cfg);
        }
    }
    struct kc_remote *r = up;
    pthread_mutex_unlock(&up_mu);
    return r;
}

/* Whether a put's failure means the remote could not be reached now (try
 * again later) rather than that it will not take the entry. */
static bool transient(int rc)
{
    return rc == -ENETDOWN || rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EIO ||
           rc == -EPROTO || rc == -EAGAIN || rc == -ECONNRESET || rc == -EPIPE;
}

static void remember(const char *ns, const kc_key *key)
{
    pthread_mutex_lock(&up_mu);
    if (n_retries == 0 && retries == NULL)
        retries = malloc(RETRY_MAX * sizeof *retries);
    if (retries != NULL && n_retries < RETRY_MAX) {
        snprintf(retries[n_retries].ns, sizeof retries[n_retries].ns, "%s", ns);
        retries[n_retries].key = *key;
        n_retries++;
    }
    pthread_mutex_unlock(&up_mu);
}

/* Adds the counters since the last report to the statistics (not
 * committed: the next commit makes them durable). */
static void report(struct kc__owner *o, struct kc_remote *r)
{
    struct kc_remote_counters now = {0}, delta;
    kc_remote_counters(r, &now);
    delta = now;
    kc_remote_counters_sub(&delta, &up_reported);
    struct kc_counters packed[KC_REMOTE_STAT_BACKENDS];
    kc_remote_counters_pack(&delta, packed);
    static const struct kc_counters zero;
    bool ok = true;
    for (int i = 0; i < KC_REMOTE_STAT_BACKENDS; i++)
        if (memcmp(&packed[i], &zero, sizeof zero) != 0 &&
            kc__owner_add_count(o, kc_remote_stat_backend(i), &packed[i]) != 0)
            ok = false;
    if (ok)
        up_reported = now;
}

/* An entry the cluster-wide single flight's waiters poll for (an NVRTC
 * manifest, whose key names the lock, or a JIT entry) was uploaded, or
 * could not be (a full server): its lock goes, so they are served it now,
 * or compile it themselves at once, and later misses do not wait on it. */
static void published(struct kc_remote *r, const char *ns, const kc_key *key, uint32_t kind)
{
    if (kind == KC_KIND_MANIFEST || kind == KC_KIND_JIT)
        kc_remote_lock_clear(r, ns, key);
}

/* Uploads one put file of the spool; -ENOENT when there is nothing to
 * upload (gone, damaged, or it came from the remote). */
static int upload_file(struct kc_remote *r, int dfd, const char *name, int pass)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    if (kc__read_file(dfd, name, UPLOAD_FILE_MAX, &buf, &len) != 0)
        return -ENOENT;
    struct kc__sp_put sp;
    int rc = -ENOENT;
    if (kc__spool_put_decode(buf, len, &sp) == 0 && !sp.from_remote &&
        (sp.hdr.kind == KC_KIND_MANIFEST) == (pass == 1)) {
        rc = kc_remote_put(r, sp.ns, &sp.key, NULL, sp.hdr.kind, sp.body, sp.body_len,
                           sp.hdr.saved_ns);
        /* Up or not (a full server, the remote down), its waiters go now:
         * they compile themselves rather than wait out the lock. */
        published(r, sp.ns, &sp.key, sp.hdr.kind);
        if (rc != 0 && transient(rc))
            remember(sp.ns, &sp.key);
    }
    free(buf);
    return rc;
}

void kc__upload_round(struct kc__owner *o, char **names, const bool *keep, size_t n)
{
    struct kc_remote *r = remote_get();
    if (r == NULL || n == 0)
        return;
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    /* Entries first, then the manifests that name them. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (keep[i])
                upload_file(r, dfd, names[i], pass);
    close(dfd);
    report(o, r);
}

void kc__upload_retry(struct kc__owner *o)
{
    struct kc_remote *r = remote_get();
    if (r == NULL)
        return;
    pthread_mutex_lock(&up_mu);
    size_t n = n_retries;
    struct retry *v = retries;
    pthread_mutex_unlock(&up_mu);
    if (n == 0 || !kc_remote_usable(r))
        return;
    /* Taken whole: what fails again is remembered again. */
    pthread_mutex_lock(&up_mu);
    retries = NULL;
    n_retries = 0;
    pthread_mutex_unlock(&up_mu);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            void *body = NULL;
            size_t len = 0;
            struct kc__hdr h;
            if (kc__lookup(&o->d, v[i].ns, &v[i].key, &body, &len, &h) != 0)
                continue; /* gone meanwhile: nothing to upload */
            if ((h.kind == KC_KIND_MANIFEST) == (pass == 1)) {
                int rc = kc_remote_put(r, v[i].ns, &v[i].key, NULL, h.kind, body, len, h.saved_ns);
                if (rc == 0)
                    published(r, v[i].ns, &v[i].key, h.kind);
                else if (transient(rc))
                    remember(v[i].ns, &v[i].key);
            }
            free(body);
        }
    }
    free(v);
    report(o, r);
}
