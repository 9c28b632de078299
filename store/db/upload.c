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
 * What is uploaded, where and under which key is decided by the process
 * whose compile it was: each put file carries its upload descriptor
 * (KC__PUT_UPLOAD, kc_remote_upload_descriptor), and the owner uploads a
 * put only with it, never with the configuration it was started with: a
 * put of a process without a remote is never uploaded, and a remote job's
 * compiles are (their cluster locks cleared) whatever job started the
 * owner. Only what a process of this store compiled (KC_PROV_LOCAL) is
 * uploaded. A remote is opened per distinct descriptor (a few), once per
 * owner process (which runs several sessions), with retry_ms: a server
 * that failed is tried again after a second, doubling up to a minute.
 * Puts that failed because the remote could not be reached are remembered
 * (bounded, with their remote) and tried again from the database once it
 * can be, and so are those a full server refused (it is tried again after
 * a backoff: keys expire or are evicted); the rest (too large, a read-only
 * node) stay local.
 * A value the remote already holds that verifies is kept (-EEXIST): the
 * entry is up, and its lock is cleared as after an upload. The remote's
 * counters are added to the store's statistics (kc_remote_counters_pack)
 * at the end of each round.
 */
#include "steps.h"
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
    int remote; /* index into ups */
};

/* The remotes this owner uploads to: one per upload descriptor its puts
 * carried (each process's own configuration), opened on first need and
 * kept for the owner's life; a few at most. */
#define UPS_MAX 8
struct up {
    char *desc; /* the descriptor, NUL-terminated */
    size_t len;
    struct kc_remote *r;                /* NULL: unusable (malformed, or failed to open) */
    struct kc_remote_counters reported; /* already in the statistics */
};

static pthread_mutex_t up_mu = PTHREAD_MUTEX_INITIALIZER;
static struct up ups[UPS_MAX];
static int n_ups;
static bool ups_full_warned;
static struct retry *retries;
static size_t n_retries;

/* The remote of an upload descriptor, opened on first need: its index in
 * ups, or -1 (none: the put is not uploaded). */
static int remote_for(const char *desc, size_t len)
{
    if (desc == NULL || len == 0)
        return -1;
    pthread_mutex_lock(&up_mu);
    int i = 0;
    while (i < n_ups && !(ups[i].len == len && memcmp(ups[i].desc, desc, len) == 0))
        i++;
    if (i == n_ups) {
        if (n_ups == UPS_MAX) {
            bool warn = !ups_full_warned;
            ups_full_warned = true;
            pthread_mutex_unlock(&up_mu);
            if (warn)
                kc_log(KC_LOG_WARN,
                       "remote: puts of more than %d remote configurations; the "
                       "others are not uploaded by this owner",
                       UPS_MAX);
            return -1;
        }
        struct up *u = &ups[n_ups];
        memset(u, 0, sizeof *u);
        u->desc = malloc(len + 1);
        char *storage = malloc(len + 8);
        struct kc_remote_settings st;
        if (u->desc == NULL || storage == NULL ||
            kc_remote_descriptor_settings(desc, len, &st, storage, len + 8) != 0) {
            free(u->desc);
            free(storage);
            pthread_mutex_unlock(&up_mu);
            return -1;
        }
        memcpy(u->desc, desc, len);
        u->desc[len] = '\0';
        u->len = len;
        struct kc_remote_config rc;
        char why[256];
        if (kc_remote_config_parse(&st, &rc, why, sizeof why) != 0)
            kc_log(KC_LOG_WARN, "%s; nothing is uploaded", why);
        else if (rc.mode != KC_REMOTE_NONE &&
                 kc_remote_open(&rc, &(struct kc_remote_options){.retry_ms = 1000}, &u->r) != 0)
            u->r = NULL;
        kc_remote_config_free(&rc);
        memset(storage, 0, len + 8); /* it may hold a password */
        free(storage);
        n_ups++;
    }
    int got = ups[i].r != NULL ? i : -1;
    pthread_mutex_unlock(&up_mu);
    return got;
}

/* Whether a put's failure means the remote could not be reached now (try
 * again later) rather than that it will not take the entry. */
static bool transient(int rc)
{
    return rc == -ENETDOWN || rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EIO ||
           rc == -EPROTO || rc == -EAGAIN || rc == -ECONNRESET || rc == -EPIPE;
}

static void remember(const char *ns, const kc_key *key, int remote)
{
    pthread_mutex_lock(&up_mu);
    if (n_retries == 0 && retries == NULL)
        retries = malloc(RETRY_MAX * sizeof *retries);
    if (retries != NULL && n_retries < RETRY_MAX) {
        snprintf(retries[n_retries].ns, sizeof retries[n_retries].ns, "%s", ns);
        retries[n_retries].key = *key;
        retries[n_retries].remote = remote;
        n_retries++;
    }
    pthread_mutex_unlock(&up_mu);
}

/* Adds the counters since the last report to the statistics (not
 * committed: the next commit makes them durable). */
static void report(struct kc__owner *o, int u)
{
    struct kc_remote_counters now = {0}, delta;
    kc_remote_counters(ups[u].r, &now);
    delta = now;
    kc_remote_counters_sub(&delta, &ups[u].reported);
    struct kc_counters packed[KC_REMOTE_STAT_BACKENDS];
    kc_remote_counters_pack(&delta, packed);
    static const struct kc_counters zero;
    bool ok = true;
    for (int i = 0; i < KC_REMOTE_STAT_BACKENDS; i++)
        if (memcmp(&packed[i], &zero, sizeof zero) != 0 &&
            kc__owner_add_count(o, kc_remote_stat_backend(i), &packed[i]) != 0)
            ok = false;
    if (ok)
        ups[u].reported = now;
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

/* Whether a put or a stored entry is this owner's to upload: what a
 * process of this store compiled (KC_PROV_LOCAL). What the remote served
 * (signed by another, or trusted unsigned), a bundle brought, or what was
 * stored before provenance was recorded is never signed with a key of
 * this node's. */
static bool own_compile(uint32_t prov)
{
    return KC_PROV_CODE(prov) == KC_PROV_LOCAL;
}

/* Uploads one put file of the spool with the configuration it carries;
 * -ENOENT when there is nothing to upload (gone, damaged, from the remote,
 * not compiled here, or a process without a remote's). *used: the index
 * of the remote it went to, for the round's report. */
static int upload_file(int dfd, const char *name, int pass, bool *used)
{
    unsigned char *buf = NULL;
    size_t len = 0;
    if (kc__read_file(dfd, name, UPLOAD_FILE_MAX, &buf, &len) != 0)
        return -ENOENT;
    struct kc__sp_put sp;
    int rc = -ENOENT;
    if (kc__spool_put_decode(buf, len, &sp) == 0 && !sp.from_remote && own_compile(sp.hdr.prov) &&
        (sp.hdr.kind == KC_KIND_MANIFEST) == (pass == 1)) {
        int u = remote_for(sp.upload, sp.upload_len);
        if (u >= 0) {
            struct kc_remote *r = ups[u].r;
            used[u] = true;
            rc = kc_remote_put(r, sp.ns, &sp.key, NULL, sp.hdr.kind, sp.body, sp.body_len,
                               sp.hdr.saved_ns);
            /* Up or not (a full server, the remote down), its waiters go
             * now: they compile themselves rather than wait out the lock. */
            published(r, sp.ns, &sp.key, sp.hdr.kind);
            if (rc != 0 && rc != -EEXIST && (transient(rc) || rc == -ENOSPC))
                remember(sp.ns, &sp.key, u);
        }
    }
    free(buf);
    return rc;
}

void kc__upload_round(struct kc__owner *o, char **names, const bool *keep, size_t n)
{
    if (n == 0)
        return;
    int dfd = open(o->p.spool, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    bool used[UPS_MAX] = {false};
    /* Entries first, then the manifests that name them. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (keep[i])
                upload_file(dfd, names[i], pass, used);
    close(dfd);
    for (int u = 0; u < UPS_MAX; u++)
        if (used[u])
            report(o, u);
}

void kc__upload_retry(struct kc__owner *o)
{
    pthread_mutex_lock(&up_mu);
    size_t n = n_retries;
    struct retry *v = retries;
    if (n == 0) {
        pthread_mutex_unlock(&up_mu);
        return;
    }
    /* Taken whole: what fails again is remembered again. */
    retries = NULL;
    n_retries = 0;
    pthread_mutex_unlock(&up_mu);
    bool used[UPS_MAX] = {false}, full[UPS_MAX] = {false};
    bool *kept = calloc(n, sizeof *kept); /* tried or remembered again this round */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            struct kc_remote *r = ups[v[i].remote].r;
            /* Down, or full this round: kept for a later one, unread. */
            if (!kc_remote_usable(r) || full[v[i].remote]) {
                if (kept == NULL ? pass == 0 : !kept[i])
                    remember(v[i].ns, &v[i].key, v[i].remote);
                if (kept != NULL)
                    kept[i] = true;
                continue;
            }
            void *body = NULL;
            size_t len = 0;
            struct kc__hdr h;
            if (kc__lookup(&o->d, v[i].ns, &v[i].key, &body, &len, &h) != 0)
                continue; /* gone meanwhile: nothing to upload */
            if ((h.kind == KC_KIND_MANIFEST) == (pass == 1) && own_compile(h.prov)) {
                used[v[i].remote] = true;
                int rc = kc_remote_put(r, v[i].ns, &v[i].key, NULL, h.kind, body, len, h.saved_ns);
                if (rc == 0 || rc == -EEXIST)
                    published(r, v[i].ns, &v[i].key, h.kind);
                else if (transient(rc) || rc == -ENOSPC)
                    remember(v[i].ns, &v[i].key, v[i].remote);
                if (rc == -ENOSPC)
                    full[v[i].remote] = true;
                if (kept != NULL)
                    kept[i] = true; /* tried: done with, or remembered */
            }
            free(body);
        }
    }
    free(kept);
    free(v);
    for (int u = 0; u < UPS_MAX; u++)
        if (used[u])
            report(o, u);
}
