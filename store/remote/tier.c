/*
 * The remote tier: get, put, purge, the cluster-wide lock, and the tool's
 * ping, over the servers and connections of redis.c and the signed values
 * of sign.c. See remote.h.
 */
#include "remote_internal.h"

#include "../../common/clock.h"
#include "../../common/config.h"
#include "../../common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

struct kc_remote {
    pthread_mutex_t mu; /* guards everything below */
    struct kc_remote_config cfg;
    int retry_ms;
    bool transient;   /* options.transient: no connection outlives an operation */
    char node[96];    /* options.node, or empty */
    char token[160];  /* this process's lock value: node:pid:random */
    uint64_t mark_ns; /* when this process last set its writer mark (kc_remote_lock) */
    void (*warn)(const char *msg, void *arg); /* options.warn, or NULL */
    void *warn_arg;
    bool activated;
    int act_rc;       /* 0, or -ENETDOWN: the remote is unusable */
    bool warned;      /* the one failure warning was logged */
    bool bad_warned;  /* the one refused-entry warning was logged */
    bool full_warned; /* the one server-full warning was logged */
    const struct kc__hiredis *hi;
    const struct kc__sodium *na; /* NULL until needed */
    struct kc__keys keys;
    struct kc__rctx rctx;
    struct kc__node **nodes; /* servers mode: one per endpoint */
    int n_nodes;
    struct kc__cluster cl; /* cluster mode */
    struct kc_remote_counters ctr;
};

/* Compare-and-delete on the holder's token (the value's first word). */
static const char unlock_script[] =
    "local v=redis.call('get',KEYS[1]) "
    "if v and string.sub(v,1,#ARGV[1])==ARGV[1] then return redis.call('del',KEYS[1]) end "
    "return 0";

/* SET NX PX, or the holder's value when taken (nil: it went meanwhile). */
static const char lock_script[] =
    "if redis.call('set',KEYS[1],ARGV[1],'NX','PX',ARGV[2]) then return 1 end "
    "return redis.call('get',KEYS[1])";

/* A refused value at least this large is a soft failure (see get). */
#define KC__BAD_SOFT_BYTES (1u << 20)

/* Lookups made while waiting on another node's lock count as polls. */
static __thread bool polling;

/* ---- names -------------------------------------------------------------- */

static bool ns_nameable(const char *ns)
{
    size_t n = ns != NULL ? strlen(ns) : 0;
    if (n == 0 || n > 127)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)ns[i];
        if (c < '!' || c > '~' || c == '{' || c == '}')
            return false;
    }
    return true;
}

int kc_remote_key_name(const char *ns, const kc_key *key, char *buf, size_t len)
{
    if (!ns_nameable(ns))
        return -EINVAL;
    int n = snprintf(buf, len, "kcache:%s:%016" PRIx64 "%016" PRIx64 "%016" PRIx64, ns, key->id.hi,
                     key->id.lo, key->build);
    return n > 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

int kc_remote_lock_name(const char *ns, const kc_key *key, char *buf, size_t len)
{
    char k[KC_REMOTE_KEY_MAX];
    int rc = kc_remote_key_name(ns, key, k, sizeof k);
    if (rc != 0)
        return rc;
    /* The hash tag is the entry's whole key: the same cluster slot. */
    int n = snprintf(buf, len, "kcache:lock:{%s}", k);
    return n > 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

/* The writer mark of a namespace: kcache:writer:{<ns>}, set by a trusted
 * writer when it takes a lock (see kc_remote_writer_active). */
static int mark_name(const char *ns, char *buf, size_t len)
{
    if (!ns_nameable(ns))
        return -EINVAL;
    int n = snprintf(buf, len, "kcache:writer:{%s}", ns);
    return n > 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

/* ---- open, activate, close ---------------------------------------------- */

static void make_token(struct kc_remote *r)
{
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = kc_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)r;
    char host[64] = "";
    if (r->node[0] == '\0') {
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
    }
    snprintf(r->token, sizeof r->token, "%s:%d:%016" PRIx64, r->node[0] ? r->node : host,
             (int)getpid(), rnd);
}

int kc_remote_open(const struct kc_remote_config *cfg, const struct kc_remote_options *opt,
                   struct kc_remote **out)
{
    if (cfg == NULL || cfg->mode == KC_REMOTE_NONE || cfg->n <= 0 || cfg->ep == NULL)
        return -EINVAL;
    struct kc_remote *r = calloc(1, sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    if (kc_remote_config_copy(&r->cfg, cfg) != 0) {
        free(r);
        return -ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    if (opt != NULL) {
        r->retry_ms = opt->retry_ms > 0 ? opt->retry_ms : 0;
        r->transient = opt->transient;
        if (opt->node != NULL)
            snprintf(r->node, sizeof r->node, "%s", opt->node);
        r->warn = opt->warn;
        r->warn_arg = opt->warn_arg;
    }
    if (r->retry_ms == 0)
        r->retry_ms = 1000; /* a circuit breaker for hosts too */
    make_token(r);
    *out = r;
    return 0;
}

/* A warning of loading the remote: to options.warn when the opener gave
 * one (`kcache config` prints it with its own), else logged. */
__attribute__((format(printf, 2, 3))) static void load_warn(const struct kc_remote *r,
                                                            const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->warn != NULL)
        r->warn(msg, r->warn_arg);
    else
        kc_log(KC_LOG_WARN, "%s", msg);
}

/* Reads a configured TLS file by the one reader of configured files
 * (kc_config_read_file) under `rule`: 0 with *buf (malloc'd) and *len. */
static int tls_file(const char *name, const char *path, enum kc_file_rule rule, char **buf,
                    size_t *len)
{
    int rc = kc_config_read_file(AT_FDCWD, path, rule, 1 << 20, buf, len);
    if (rc != 0)
        kc_log(KC_LOG_WARN, "remote: %s %s refused (%s%s); the remote is off", name, path,
               strerror(-rc),
               rc != -EPERM              ? ""
               : rule == KC_FILE_PRIVATE ? ": it must be a regular file of yours, mode 0600"
                                         : ": a regular file of yours or root's that others "
                                           "cannot write");
    return rc;
}

/* Verification turned off: said once per process. */
static bool tls_unverified_warned;

/* rediss:// servers: loads the TLS object and makes the client context
 * from KCACHE_REMOTE_CA_FILE, _CERT_FILE, _KEY_FILE (each read by the one
 * reader of configured files: the key only when private) and _TLS_VERIFY.
 * Under mu, at activation. 0 (also without a rediss:// server), or
 * -ENETDOWN: the remote stays off (one warning said why). */
static int tls_activate(struct kc_remote *r)
{
    bool any = false;
    for (int i = 0; i < r->cfg.n; i++)
        any = any || r->cfg.ep[i].tls;
    if (!any)
        return 0;
    char why[240] = "";
    if (kc__tls_load(&r->rctx.tls, why, sizeof why) != 0) {
        kc_log(KC_LOG_WARN, "remote: rediss:// needs %s; the remote is off", why);
        return -ENETDOWN;
    }
    struct kc_tls_settings ts = {.verify = r->cfg.tls_verify};
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = 0;
    if (r->cfg.ca_file[0] != '\0')
        rc = tls_file("KCACHE_REMOTE_CA_FILE", r->cfg.ca_file, KC_FILE_TRUSTED, &ca, &ts.ca_len);
    if (rc == 0 && r->cfg.cert_file[0] != '\0')
        rc = tls_file("KCACHE_REMOTE_CERT_FILE", r->cfg.cert_file, KC_FILE_TRUSTED, &cert,
                      &ts.cert_len);
    if (rc == 0 && r->cfg.key_file[0] != '\0')
        rc =
            tls_file("KCACHE_REMOTE_KEY_FILE", r->cfg.key_file, KC_FILE_PRIVATE, &key, &ts.key_len);
    if (rc == 0 && (cert == NULL) != (key == NULL)) {
        kc_log(KC_LOG_WARN, "remote: KCACHE_REMOTE_CERT_FILE and KCACHE_REMOTE_KEY_FILE go "
                            "together; the remote is off");
        rc = -EINVAL;
    }
    if (rc == 0) {
        ts.ca_pem = ca;
        ts.cert_pem = cert;
        ts.key_pem = key;
        rc = r->rctx.tls->ctx_new(&ts, &r->rctx.tls_ctx, why, sizeof why);
        if (rc != 0)
            kc_log(KC_LOG_WARN, "remote: TLS settings refused (%s); the remote is off",
                   why[0] ? why : strerror(-rc));
    }
    if (key != NULL)
        memset(key, 0, ts.key_len);
    free(ca);
    free(cert);
    free(key);
    if (rc != 0)
        return -ENETDOWN;
    if (!r->cfg.tls_verify && !__atomic_exchange_n(&tls_unverified_warned, true, __ATOMIC_RELAXED))
        kc_log(KC_LOG_WARN, "remote: KCACHE_REMOTE_TLS_VERIFY=0: rediss:// servers' certificates "
                            "are not verified (anyone on the path can pose as the server)");
    return 0;
}

/* Loads what the remote needs, once: libhiredis, and libsodium with the
 * keys unless every entry is trusted and nothing is signed. Under mu.
 * 0, or -ENETDOWN: the remote stays off (one warning said why). */
static int activate(struct kc_remote *r)
{
    if (r->activated)
        return r->act_rc;
    r->activated = true;
    r->act_rc = -ENETDOWN;
    /* libhiredis 0.14 carries the plain connections only: a process whose
     * servers are all rediss:// never maps it (the TLS object has its own). */
    bool plain = false;
    for (int i = 0; i < r->cfg.n; i++)
        plain = plain || !r->cfg.ep[i].tls;
    if (plain && kc__hiredis_load(&r->hi) != 0)
        return r->act_rc;
    r->rctx = (struct kc__rctx){.hi = r->hi,
                                .ctr = &r->ctr,
                                .retry_ms = r->retry_ms,
                                /* The largest entry, or a cluster's
                                 * slot map (small entries may be
                                 * configured). */
                                .reply_cap = r->cfg.max_entry + KC__RV_OVERHEAD + (4u << 20),
                                .warned = &r->warned,
                                .cluster = r->cfg.mode == KC_REMOTE_CLUSTER};
    /* KCACHE_REMOTE_PASSWORD_FILE: the password of every server whose URL
     * names none, kept out of the environment. */
    if (r->cfg.password_file[0] != '\0') {
        char pw[sizeof r->cfg.ep[0].password];
        int prc = kc__read_password_file(r->cfg.password_file, pw, sizeof pw);
        if (prc != 0) {
            load_warn(r,
                      "remote: KCACHE_REMOTE_PASSWORD_FILE %s refused (%s%s); the "
                      "remote is off",
                      r->cfg.password_file, prc == -EBADMSG ? "empty or too long" : strerror(-prc),
                      prc == -EPERM ? ": it must be a regular file of yours, mode 0600" : "");
            return r->act_rc;
        }
        for (int i = 0; i < r->cfg.n; i++)
            if (r->cfg.ep[i].password[0] == '\0')
                memcpy(r->cfg.ep[i].password, pw, sizeof pw);
        memset(pw, 0, sizeof pw);
    }
    if (tls_activate(r) != 0)
        return r->act_rc;
    if (r->cfg.mode == KC_REMOTE_CLUSTER) {
        for (int i = 0; i < r->cfg.n; i++)
            if (kc__cluster_node(&r->cl, r->cfg.ep[i].host, r->cfg.ep[i].port, &r->cfg.ep[i]) ==
                NULL)
                return r->act_rc;
        r->cl.n_seeds = r->cl.n_nodes;
    } else {
        r->nodes = calloc(r->cfg.n > 0 ? (size_t)r->cfg.n : 1, sizeof *r->nodes);
        if (r->nodes == NULL)
            return r->act_rc;
        for (int i = 0; i < r->cfg.n; i++) {
            struct kc__node *nd = calloc(1, sizeof *nd);
            if (nd == NULL)
                return r->act_rc;
            nd->ep = r->cfg.ep[i];
            if (nd->ep.transport == KC_REMOTE_UNIX)
                snprintf(nd->addr, sizeof nd->addr, "%s", nd->ep.path);
            else
                snprintf(nd->addr, sizeof nd->addr, "%s:%d", nd->ep.host, nd->ep.port);
            r->nodes[r->n_nodes++] = nd;
        }
    }

    r->keys.trust_any = r->cfg.trust_any;
    bool need_sodium = r->cfg.signing_key[0] != '\0' || !r->cfg.trust_any;
    if (need_sodium && kc__sodium_load(&r->na) != 0) {
        r->na = NULL;
        if (!r->cfg.trust_any)
            return r->act_rc; /* nothing could be verified */
    }
    if (r->na != NULL && r->cfg.signing_key[0] != '\0') {
        int rc = kc__keys_load_secret(r->na, r->cfg.signing_key, &r->keys);
        if (rc != 0)
            load_warn(r,
                      "remote: KCACHE_REMOTE_SIGNING_KEY %s refused (%s%s); this node uploads "
                      "nothing",
                      r->cfg.signing_key, strerror(-rc),
                      rc == -EPERM ? ": it must be a regular file of yours, mode 0600" : "");
    }
    if (r->na != NULL && r->cfg.trusted_keys[0] != '\0') {
        int rc = kc__keys_load_trusted(r->na, r->cfg.trusted_keys, &r->keys);
        if (rc != 0)
            load_warn(r,
                      "remote: KCACHE_REMOTE_TRUSTED_KEYS %s unusable (%s%s); no key of it is "
                      "trusted",
                      r->cfg.trusted_keys, strerror(-rc),
                      rc == -EPERM ? ": others may not write it" : "");
    }
    if (!r->cfg.trust_any && !r->keys.have_secret && r->keys.n_trusted == 0) {
        load_warn(r, "remote: no trusted key (KCACHE_REMOTE_TRUSTED_KEYS) and no "
                     "signing key: every entry would be refused; the remote is off");
        return r->act_rc;
    }
    r->act_rc = 0;
    return 0;
}

int kc_remote_load(struct kc_remote *r)
{
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void drop_all(struct kc_remote *r)
{
    for (int i = 0; i < r->n_nodes; i++)
        kc__node_drop(&r->rctx, r->nodes[i]);
    for (int i = 0; i < r->cl.n_nodes; i++)
        kc__node_drop(&r->rctx, r->cl.nodes[i]);
}

/* Ends an operation: r->mu is released, and a transient remote's
 * connections are closed first (a fresh one authenticates in the same
 * round trip as its first command, so reconnecting costs one connect). */
static void op_unlock(struct kc_remote *r)
{
    if (r->transient)
        drop_all(r);
    pthread_mutex_unlock(&r->mu);
}

void kc_remote_after_fork(struct kc_remote *r)
{
    if (r == NULL)
        return;
    /* The parent's lock state means nothing here: start afresh. */
    pthread_mutex_init(&r->mu, NULL);
    drop_all(r);
    make_token(r);
}

void kc_remote_close(struct kc_remote *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    drop_all(r);
    for (int i = 0; i < r->n_nodes; i++) {
        memset(r->nodes[i]->ep.password, 0, sizeof r->nodes[i]->ep.password);
        free(r->nodes[i]);
    }
    free(r->nodes);
    kc__cluster_free(&r->rctx, &r->cl);
    if (r->rctx.tls != NULL && r->rctx.tls_ctx != NULL)
        r->rctx.tls->ctx_free(r->rctx.tls_ctx);
    kc__keys_free(r->na, &r->keys);
    kc_remote_config_free(&r->cfg);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ---- one command -------------------------------------------------------- */

/* The node `route` (an entry's key) maps to now, when known. */
static struct kc__node *target_node(struct kc_remote *r, const char *route)
{
    if (r->cfg.mode == KC_REMOTE_CLUSTER) {
        if (!r->cl.loaded)
            return NULL;
        unsigned s = kc__cluster_slot(route, strlen(route));
        return r->cl.slot[s] == KC__SLOT_NONE ? NULL : r->cl.nodes[r->cl.slot[s]];
    }
    int i = r->n_nodes == 1 ? 0 : kc__rendezvous(r->cfg.ep, r->cfg.n, route, strlen(route));
    return r->nodes[i];
}

/* ---- a cluster's fallback names ---------------------------------------- */

/*
 * While the node serving an entry's slot is off (a primary that died, its
 * replica not promoted yet: seconds, during which its keys can be neither
 * read, written nor locked), the entry and its lock live under a fallback
 * name, "<name>~1" (~2, ~3 when that slot's node is off too), in a slot a
 * live primary serves. Every node sees the same map and the same dead
 * node, so they pick the same name and keep sharing those kernels; the
 * slot map is read again every KC__STALE_RETRY_MS meanwhile, and once it
 * names a live owner the entry's own name is used again (what went up
 * under the fallback name stays there, expiring after a day at most, and
 * a read that misses under the own name reads it there: get_fallbacks). A
 * value is verified as under its own name (it names its namespace and key,
 * and a lock value is signed for the lock's own name), so the fallback
 * trusts nothing more.
 */
#define KC__FALLBACKS 3
#define KC__FALLBACK_TTL "86400"

static bool node_down(const struct kc__node *nd)
{
    return nd->off && (nd->retry_at_ns == 0 || kc_mono_ns() < nd->retry_at_ns);
}

/* The fallback name of `k` into out, when its slot's node is off (the
 * map read again first, every KC__STALE_RETRY_MS at most): true. Under
 * mu, within an operation's deadline. */
static bool fallback_name(struct kc_remote *r, const char *k, char *out, size_t cap)
{
    if (r->cfg.mode != KC_REMOTE_CLUSTER || !r->cl.loaded)
        return false;
    struct kc__node *nd = target_node(r, k);
    if (nd == NULL || !node_down(nd))
        return false;
    if (kc_mono_ns() >= r->cl.stale_retry_ns) {
        r->cl.stale_retry_ns = kc_mono_ns() + KC__STALE_RETRY_MS * 1000000ull;
        kc__cluster_refresh(&r->rctx, &r->cl, NULL);
        nd = target_node(r, k);
        if (nd == NULL || !node_down(nd))
            return false;
    }
    for (int i = 1; i <= KC__FALLBACKS; i++) {
        if ((size_t)snprintf(out, cap, "%s~%d", k, i) >= cap)
            return false;
        struct kc__node *f = target_node(r, out);
        if (f != NULL && !node_down(f))
            return true;
    }
    return false;
}

/* cmd with the names of `k` (the entry's, and its lock's) replaced by
 * those of kf; a SET gets an expiry when it has none. 0, or -ENAMETOOLONG. */
static int cmd_renamed(const struct kc__cmd *cmd, const char *k, const char *kf,
                       struct kc__cmd *out, char *lk, char *lkf, size_t cap)
{
    if ((size_t)snprintf(lk, cap, "kcache:lock:{%s}", k) >= cap ||
        (size_t)snprintf(lkf, cap, "kcache:lock:{%s}", kf) >= cap)
        return -ENAMETOOLONG;
    *out = *cmd;
    bool set = cmd->argc > 0 && cmd->len[0] == 3 && memcmp(cmd->argv[0], "SET", 3) == 0;
    bool ex = false;
    for (int i = 1; i < cmd->argc; i++) {
        if (cmd->len[i] == strlen(k) && memcmp(cmd->argv[i], k, cmd->len[i]) == 0) {
            out->argv[i] = kf;
            out->len[i] = strlen(kf);
        } else if (cmd->len[i] == strlen(lk) && memcmp(cmd->argv[i], lk, cmd->len[i]) == 0) {
            out->argv[i] = lkf;
            out->len[i] = strlen(lkf);
        } else if (set && i >= 3 && cmd->len[i] == 2 && memcmp(cmd->argv[i], "EX", 2) == 0) {
            ex = true;
        }
    }
    if (set && !ex && out->argc + 2 <= 8) {
        out->argv[out->argc] = "EX";
        out->len[out->argc++] = 2;
        out->argv[out->argc] = KC__FALLBACK_TTL;
        out->len[out->argc++] = strlen(KC__FALLBACK_TTL);
    }
    return 0;
}

/* Runs one command on the server of `route` (an entry's key: its lock
 * lives beside it), under the fallback names while the node of its slot
 * is off (tried once more so when it failed, cheaply, on the entry's own
 * slot). `past_breaker`: tried even while the whole remote is off, on a
 * node that is not off itself (a lock's release: the node holding it may
 * be well while another made this process turn the remote off; each node
 * that fails is off after one timeout, so this costs that once). Under
 * mu. */
static int run_op(struct kc_remote *r, const char *route, const struct kc__cmd *cmd,
                  redisReply **rep, struct kc__node **from, bool past_breaker)
{
    /* The breaker first: open, nothing is tried. */
    if (!past_breaker && !kc__breaker_closed(&r->rctx))
        return -ENETDOWN;
    /* One operation, every hop included, within one connect and one
     * operation timeout. */
    const struct kc_remote_endpoint *e = &r->cfg.ep[0];
    r->rctx.deadline_ns =
        kc_mono_ns() + (uint64_t)(e->connect_timeout_ms + e->operation_timeout_ms) * 1000000;
    int rc;
    if (r->cfg.mode == KC_REMOTE_CLUSTER) {
        char kf[KC_REMOTE_KEY_MAX + 8], lk[KC_REMOTE_KEY_MAX + 24], lkf[KC_REMOTE_KEY_MAX + 32];
        struct kc__cmd alt;
        bool fb = fallback_name(r, route, kf, sizeof kf) &&
                  cmd_renamed(cmd, route, kf, &alt, lk, lkf, sizeof lkf) == 0;
        rc = fb ? kc__cluster_exec(&r->rctx, &r->cl, kf, strlen(kf), &alt, rep, from)
                : kc__cluster_exec(&r->rctx, &r->cl, route, strlen(route), cmd, rep, from);
        if (!fb && (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -EPIPE || rc == -ENETDOWN) &&
            (past_breaker || kc__breaker_closed(&r->rctx)) &&
            fallback_name(r, route, kf, sizeof kf) &&
            cmd_renamed(cmd, route, kf, &alt, lk, lkf, sizeof lkf) == 0)
            rc = kc__cluster_exec(&r->rctx, &r->cl, kf, strlen(kf), &alt, rep, from);
    } else {
        struct kc__node *nd = target_node(r, route);
        *from = nd;
        rc = kc__node_exec(&r->rctx, nd, 1, cmd, rep);
    }
    r->rctx.deadline_ns = 0;
    return rc;
}

static int run(struct kc_remote *r, const char *route, const struct kc__cmd *cmd, redisReply **rep,
               struct kc__node **from)
{
    return run_op(r, route, cmd, rep, from, false);
}

/* An error reply to a read or a lock: a transient server state is a miss,
 * refused credentials turn the server off. Under mu; frees rep. */
static int error_reply(struct kc_remote *r, struct kc__node *nd, redisReply *rep)
{
    const char *s = rep->str != NULL ? rep->str : "";
    int rc = -EIO;
    const char *auth = kc__auth_why(s);
    if (auth != NULL) {
        kc__node_fail(&r->rctx, nd, -EACCES, auth);
        kc__reply_free(rep);
        return -EACCES;
    }
    if (strncmp(s, "LOADING", 7) == 0 || strncmp(s, "CLUSTERDOWN", 11) == 0 ||
        strncmp(s, "TRYAGAIN", 8) == 0 || strncmp(s, "MASTERDOWN", 10) == 0 ||
        strncmp(s, "BUSY", 4) == 0)
        rc = -EAGAIN;
    /* The cluster says it is down (a primary failed, its replica not yet
     * promoted): the map changes when it is up again; read it then. */
    if (r->cfg.mode == KC_REMOTE_CLUSTER &&
        (strncmp(s, "CLUSTERDOWN", 11) == 0 || strncmp(s, "MASTERDOWN", 10) == 0))
        r->cl.refresh = true;
    r->ctr.errors++;
    r->ctr.error_replies++;
    kc__breaker_soft(&r->rctx);
    kc__reply_free(rep);
    return rc;
}

/* A reply of a type the command never gets: the server is not one to
 * trust. Under mu; frees rep. */
static int garbage(struct kc_remote *r, struct kc__node *nd, redisReply *rep)
{
    kc__reply_free(rep);
    kc__node_fail(&r->rctx, nd, -EPROTO, "answered garbage");
    return -EPROTO;
}

/* ---- the tier's operations ---------------------------------------------- */

/* What a verified value's provenance is: signed by the key whose
 * signature verified, or, under KCACHE_REMOTE_TRUST=any, unverified. */
static uint32_t provenance(const struct kc_remote *r, const struct kc__rv *rv)
{
    const struct kc__pubkey *pk =
        !r->keys.trust_any && rv->signed_ ? kc__keys_find(&r->keys, rv->key_id) : NULL;
    return pk != NULL ? KC_PROV(KC_PROV_SIGNED, kc_remote_signer_tag(pk->pk))
                      : KC_PROV(KC_PROV_UNSIGNED, 0);
}

/* After a miss under the entry's own name `k` in a cluster (*rep a nil
 * reply): the entry may have gone up under a fallback name while the node
 * of its slot was off, and stays there for a day after that node is back
 * (restarted empty) or its replica is promoted without it. Its fallback
 * names whose nodes are not off are read in order; the first that holds a
 * value replaces *rep (and *nd). A waiter's polls read them too: a
 * holder whose slot's node failed while it compiled uploads under a
 * fallback name, and its lock (replicated before) may live on after the
 * promotion where the waiters poll. Under mu. */
static void get_fallbacks(struct kc_remote *r, const char *k, redisReply **rep,
                          struct kc__node **nd)
{
    if (r->cfg.mode != KC_REMOTE_CLUSTER || !r->cl.loaded)
        return;
    for (int i = 1; i <= KC__FALLBACKS; i++) {
        char kf[KC_REMOTE_KEY_MAX + 8];
        if ((size_t)snprintf(kf, sizeof kf, "%s~%d", k, i) >= sizeof kf)
            return;
        struct kc__node *f = target_node(r, kf);
        if (f == NULL || node_down(f))
            continue;
        struct kc__cmd cmd;
        kc__cmd_set(&cmd, 2, "GET", kf);
        redisReply *fr = NULL;
        struct kc__node *fn = NULL;
        if (run(r, kf, &cmd, &fr, &fn) != 0)
            return;
        if (fr->type == REDIS_REPLY_STRING) {
            kc__reply_free(*rep);
            *rep = fr;
            *nd = fn;
            return;
        }
        bool nil = fr->type == REDIS_REPLY_NIL;
        kc__reply_free(fr);
        if (!nil)
            return;
    }
}

int kc_remote_get(struct kc_remote *r, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info)
{
    char k[KC_REMOTE_KEY_MAX];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc != 0) {
        op_unlock(r);
        return rc;
    }
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 2, "GET", k);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    rc = run(r, k, &cmd, &rep, &nd);
    if (rc == 0 && rep->type == REDIS_REPLY_NIL)
        get_fallbacks(r, k, &rep, &nd);
    if (rc == 0) {
        if (rep->type == REDIS_REPLY_NIL) {
            if (polling)
                r->ctr.polls++;
            else
                r->ctr.misses++;
            kc__breaker_ok(&r->rctx);
            kc__reply_free(rep);
            rc = -ENOENT;
        } else if (rep->type == REDIS_REPLY_ERROR) {
            rc = error_reply(r, nd, rep);
        } else if (rep->type != REDIS_REPLY_STRING) {
            rc = garbage(r, nd, rep);
        }
    }
    op_unlock(r);
    if (rc != 0)
        return rc;

    /* Verified outside the lock: hashing a large body takes a while. */
    struct kc__rv rv;
    int drc = kc__rv_decode(r->na, &r->keys, rep->str, rep->len, ns, key, &rv);
    void *copy = NULL;
    if (drc == 0 && rv.format == KC_FORMAT_VERSION) {
        copy = malloc(rv.body_len > 0 ? rv.body_len : 1);
        if (copy == NULL)
            drc = -ENOMEM;
        else if (rv.body_len > 0)
            memcpy(copy, rv.body, rv.body_len);
    }
    pthread_mutex_lock(&r->mu);
    if (drc == -EBADMSG || drc == -EKEYREJECTED) {
        r->ctr.bad++;
        if (drc == -EKEYREJECTED)
            r->ctr.bad_signatures++;
        /* A small refused value cost what a miss costs; a large one cost
         * its transfer, again at every lookup: a soft failure. */
        if (rep->len >= KC__BAD_SOFT_BYTES)
            kc__breaker_soft(&r->rctx);
        if (!r->bad_warned) {
            r->bad_warned = true;
            kc_log(KC_LOG_WARN,
                   "remote: an entry of %s %s; not served (further ones are counted only)", ns,
                   drc == -EKEYREJECTED ? "is not signed by a trusted key"
                                        : "is damaged or belongs to another key");
        }
        rc = -EBADMSG;
    } else if (drc != 0) {
        rc = drc;
    } else if (rv.format != KC_FORMAT_VERSION) {
        if (polling)
            r->ctr.polls++;
        else
            r->ctr.misses++;
        rc = -ENOENT;
    } else {
        kc__breaker_ok(&r->rctx);
        r->ctr.hits++;
        r->ctr.download_bytes += rv.body_len;
        r->ctr.saved_ns += rv.saved_ns;
        *body = copy;
        *len = rv.body_len;
        if (info != NULL)
            *info = (struct kc_record_info){.kind = rv.kind,
                                            .format = rv.format,
                                            .body_size = rv.body_len,
                                            .created = rv.created_ns / 1000000000,
                                            .saved_ns = rv.saved_ns,
                                            .prov = provenance(r, &rv)};
        copy = NULL;
    }
    op_unlock(r);
    free(copy);
    kc__reply_free(rep);
    return rc;
}

/* A full server's writes (OOM) are tried again after this, doubling with
 * each refusal in a row up to KC__FULL_MAX_MS: a server is full for a
 * while (keys expire or are evicted, an operator raises maxmemory or
 * prunes), not for good. A refused write costs one round trip. */
#define KC__FULL_FIRST_MS 100
#define KC__FULL_MAX_MS 30000

/* Whether this node may write to the server `route` maps to. Under mu. */
static int may_write(struct kc_remote *r, const char *route)
{
    if (!r->keys.have_secret)
        return -EROFS;
    struct kc__node *nd = target_node(r, route);
    if (nd != NULL && nd->writes_off && nd->writes_retry_ns != 0 &&
        kc_mono_ns() >= nd->writes_retry_ns)
        nd->writes_off = false; /* full a while ago: tried again */
    if (nd != NULL && (nd->ep.read_only || nd->writes_off))
        return nd->writes_off && !nd->ep.read_only ? -ENOSPC : -EROFS;
    if (r->cfg.mode == KC_REMOTE_CLUSTER && r->cfg.ep[0].read_only)
        return -EROFS;
    return 0;
}

/* A server's words for a warning: its first line, bytes outside printable
 * ASCII as '?', cut at a word's end (with "...") past max bytes. */
static const char *reply_excerpt(const char *s, char *out, size_t len, size_t max)
{
    size_t n = 0, cut = 0;
    if (max + 4 > len)
        max = len - 4;
    for (; s[n] != '\0' && s[n] != '\r' && s[n] != '\n' && n < max; n++) {
        out[n] = s[n] >= 0x20 && s[n] < 0x7f ? s[n] : '?';
        if (s[n] == ' ')
            cut = n;
    }
    if (s[n] != '\0' && s[n] != '\r' && s[n] != '\n') {
        if (s[n] != ' ' && cut > 0)
            n = cut;
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return out;
}

/* An error reply to a write. Under mu; frees rep. */
static int write_error(struct kc_remote *r, struct kc__node *nd, redisReply *rep)
{
    const char *s = rep->str != NULL ? rep->str : "";
    bool oom = strncmp(s, "OOM", 3) == 0;
    bool ro = strncmp(s, "READONLY", 8) == 0;
    /* An ACL user refused writes (-@write): the node reads only. */
    bool noperm = strncmp(s, "NOPERM", 6) == 0 ||
                  strstr(s, "can't run this command") != NULL; /* from a script (the lock) */
    if (!oom && !ro && !noperm)
        return error_reply(r, nd, rep);
    r->ctr.errors++;
    if (oom)
        r->ctr.oom++;
    if (noperm)
        r->ctr.write_refusals++;
    nd->writes_off = true;
    nd->writes_retry_ns = 0;
    if (oom) {
        unsigned shift = nd->full_refusals < 16 ? nd->full_refusals : 16;
        uint64_t ms = (uint64_t)KC__FULL_FIRST_MS << shift;
        if (ms > KC__FULL_MAX_MS)
            ms = KC__FULL_MAX_MS;
        nd->full_refusals++;
        nd->writes_retry_ns = kc_mono_ns() + ms * 1000000ull;
    }
    if (!r->full_warned) {
        r->full_warned = true;
        char shown[340], said[208];
        kc_remote_endpoint_display(&nd->ep, shown, sizeof shown);
        kc_log(KC_LOG_WARN, "remote: %s refuses writes (%s); %s", shown,
               reply_excerpt(s, said, sizeof said, 200),
               oom ? "uploads and locks are tried again after a backoff, compiles not shared "
                     "meanwhile"
                   : "nothing more is uploaded to it");
    }
    kc__reply_free(rep);
    return oom ? -ENOSPC : -EROFS;
}

/* SET of an encoded value (NX: only when absent: -EEXIST when there). */
static int set_value(struct kc_remote *r, const char *k, const unsigned char *v, size_t vlen,
                     bool nx)
{
    char ttl[24];
    struct kc__cmd cmd;
    if (r->cfg.ttl_s > 0) {
        snprintf(ttl, sizeof ttl, "%" PRIu64, r->cfg.ttl_s);
        kc__cmd_set(&cmd, nx ? 6 : 5, "SET", k, "", "EX", ttl, "NX");
    } else {
        kc__cmd_set(&cmd, nx ? 4 : 3, "SET", k, "", "NX");
    }
    cmd.argv[2] = (const char *)v;
    cmd.len[2] = vlen;

    pthread_mutex_lock(&r->mu);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    int rc = run(r, k, &cmd, &rep, &nd);
    if (rc == 0) {
        if (rep->type == REDIS_REPLY_STATUS) {
            kc__breaker_ok(&r->rctx);
            if (nd != NULL)
                nd->full_refusals = 0;
            r->ctr.uploads++;
            r->ctr.upload_bytes += vlen;
            kc__reply_free(rep);
        } else if (nx && rep->type == REDIS_REPLY_NIL) {
            kc__reply_free(rep);
            rc = -EEXIST;
        } else if (rep->type == REDIS_REPLY_ERROR) {
            rc = write_error(r, nd, rep);
        } else {
            rc = garbage(r, nd, rep);
        }
    }
    op_unlock(r);
    return rc;
}

int kc_remote_put(struct kc_remote *r, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    return kc_remote_put_flags(r, ns, key, source, kind, body, len, saved_ns, 0);
}

int kc_remote_put_flags(struct kc_remote *r, const char *ns, const kc_key *key,
                        const kc_digest *source, uint32_t kind, const void *body, size_t len,
                        uint64_t saved_ns, unsigned flags)
{
    (void)source; /* no source map remotely */
    char k[KC_REMOTE_KEY_MAX];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    if (len > r->cfg.max_entry) {
        r->ctr.skipped++;
        op_unlock(r);
        return -EFBIG;
    }
    int rc = activate(r);
    if (rc == 0)
        rc = may_write(r, k);
    op_unlock(r);
    if (rc != 0)
        return rc;

    /* Signed outside the lock (the keys do not change once loaded). */
    unsigned char *v = NULL;
    size_t vlen = 0;
    rc = kc__rv_encode(r->na, &r->keys, ns, key, kind, KC_FORMAT_VERSION, kc_wall_ns(), saved_ns,
                       body, len, &v, &vlen);
    if (rc != 0)
        return rc;
    /* An entry's key names its inputs: a valid value the remote holds for
     * it is never replaced (SET NX; one that does not verify is). A
     * manifest is the one kind that grows (its dependency sets): this
     * node's own, which kept the sets it was served, replaces one whose
     * sets differ. */
    rc = set_value(r, k, v, vlen, true);
    if (rc == -EEXIST) {
        void *got = NULL;
        size_t glen = 0;
        int g = kc_remote_get(r, ns, key, &got, &glen, NULL);
        bool same = g == 0 && glen == len && (len == 0 || memcmp(got, body, len) == 0);
        free(got);
        bool grow = kind == KC_KIND_MANIFEST && !(flags & KC_REMOTE_PUT_KEEP);
        if (g == -EBADMSG || (g == 0 && grow && !same))
            rc = set_value(r, k, v, vlen, false);
        else if (g == -ENOENT)
            rc = set_value(r, k, v, vlen, true); /* gone meanwhile */
        else if (g != 0)
            rc = g;
    }
    free(v);
    return rc;
}

/* DEL of `del`, routed by `k` (the entry's name: a lock shares its slot):
 * 0 (deleted or not there), or the failure. A full server still deletes.
 * `past_breaker`: see run_op (a lock's release). */
static int del_key(struct kc_remote *r, const char *k, const char *del, bool past_breaker)
{
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc == 0)
        rc = may_write(r, k);
    if (rc == -ENOSPC)
        rc = 0; /* a full server still deletes */
    else if (rc != 0)
        goto out;
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 2, "DEL", del);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    rc = run_op(r, k, &cmd, &rep, &nd, past_breaker);
    if (rc == 0) {
        if (rep->type == REDIS_REPLY_INTEGER)
            kc__reply_free(rep);
        else if (rep->type == REDIS_REPLY_ERROR)
            rc = write_error(r, nd, rep);
        else
            rc = garbage(r, nd, rep);
    }
out:
    op_unlock(r);
    return rc;
}

int kc_remote_purge(struct kc_remote *r, const char *ns, const kc_key *key)
{
    char k[KC_REMOTE_KEY_MAX];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0)
        return -EINVAL;
    return del_key(r, k, k, false);
}

/* What a lock's holder value means to this node: -EBUSY when a trusted
 * writer took it (wait for its result), -EKEYREJECTED when not (counted:
 * do not wait). Under mu. */
static int lock_holder(struct kc_remote *r, const char *lk, const redisReply *v)
{
    uint64_t now_ms = kc_wall_ns() / 1000000;
    if (v->type == REDIS_REPLY_STRING &&
        kc__lock_value_check(r->na, &r->keys, lk, v->str, v->len, now_ms, 86400000) == 0) {
        r->ctr.lock_busy++;
        return -EBUSY;
    }
    r->ctr.lock_untrusted++;
    return -EKEYREJECTED;
}

/* A node that may not write takes no lock, but waits on one a trusted
 * writer holds: -EBUSY then, `why` otherwise. Under mu. */
static int lock_peek(struct kc_remote *r, const char *k, const char *lk, int why)
{
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 2, "GET", lk);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    int rc = run(r, k, &cmd, &rep, &nd);
    if (rc != 0)
        return why;
    if (rep->type == REDIS_REPLY_NIL) {
        kc__reply_free(rep);
        return why;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        error_reply(r, nd, rep);
        return why;
    }
    rc = lock_holder(r, lk, rep);
    kc__reply_free(rep);
    return rc == -EBUSY ? rc : why;
}

/* The writer mark lives this long after the lock that set it (a compile's
 * time between two locks, on a loaded machine too); a process sets it
 * again at most every quarter of it. */
#define KC__MARK_S 5

/* Sets this process's writer mark of ns (a lock was just taken), unless
 * it did so lately; what the server answers changes nothing. Under mu. */
static void set_mark(struct kc_remote *r, const char *ns)
{
    uint64_t now = kc_mono_ns();
    if (r->mark_ns != 0 && now - r->mark_ns < KC__MARK_S * 250000000ull)
        return;
    char mk[KC_REMOTE_KEY_MAX], value[KC__LOCK_VALUE_MAX], ex[8];
    if (mark_name(ns, mk, sizeof mk) != 0 ||
        kc__lock_value(r->na, &r->keys, mk, r->token, kc_wall_ns() / 1000000 + KC__MARK_S * 1000ull,
                       value, sizeof value) != 0)
        return;
    r->mark_ns = now;
    snprintf(ex, sizeof ex, "%d", KC__MARK_S);
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 5, "SET", mk, value, "EX", ex);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    if (run(r, mk, &cmd, &rep, &nd) == 0)
        kc__reply_free(rep);
}

int kc_remote_writer_active(struct kc_remote *r, const char *ns)
{
    char mk[KC_REMOTE_KEY_MAX];
    if (mark_name(ns, mk, sizeof mk) != 0)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc != 0)
        goto out;
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 2, "GET", mk);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    rc = run(r, mk, &cmd, &rep, &nd);
    if (rc != 0)
        goto out;
    rc = rep->type == REDIS_REPLY_STRING &&
         kc__lock_value_check(r->na, &r->keys, mk, rep->str, rep->len, kc_wall_ns() / 1000000,
                              60000) == 0; /* clocks' skew */
    kc__reply_free(rep);
out:
    op_unlock(r);
    return rc;
}

int kc_remote_lock(struct kc_remote *r, const char *ns, const kc_key *key, int ttl_ms)
{
    char k[KC_REMOTE_KEY_MAX], lk[KC_REMOTE_KEY_MAX + 16];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0 ||
        kc_remote_lock_name(ns, key, lk, sizeof lk) != 0)
        return -EINVAL;
    if (ttl_ms < 1)
        ttl_ms = 1;
    if (ttl_ms > 86400000)
        ttl_ms = 86400000;
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc == 0)
        rc = may_write(r, k);
    /* A full server is asked again whatever its backoff: a refused lock
     * costs one round trip (its value is small), and a lock taken the
     * moment there is room keeps the machines agreeing. */
    if (rc == -ENOSPC)
        rc = 0;
    if (rc == -EROFS) {
        rc = lock_peek(r, k, lk, rc);
        goto out;
    }
    if (rc != 0)
        goto out;
    char px[16], value[KC__LOCK_VALUE_MAX];
    snprintf(px, sizeof px, "%d", ttl_ms);
    rc = kc__lock_value(r->na, &r->keys, lk, r->token, kc_wall_ns() / 1000000 + (uint64_t)ttl_ms,
                        value, sizeof value);
    if (rc != 0)
        goto out;
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 6, "EVAL", lock_script, "1", lk, value, px);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    rc = run(r, k, &cmd, &rep, &nd);
    if (rc == 0) {
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1) {
            kc__breaker_ok(&r->rctx);
            if (nd != NULL)
                nd->full_refusals = 0;
            r->ctr.locks++;
            kc__reply_free(rep);
            set_mark(r, ns);
        } else if (rep->type == REDIS_REPLY_STRING) {
            kc__breaker_ok(&r->rctx);
            rc = lock_holder(r, lk, rep);
            kc__reply_free(rep);
        } else if (rep->type == REDIS_REPLY_NIL) {
            /* Released between the two steps: taken by nobody now. */
            r->ctr.lock_busy++;
            kc__reply_free(rep);
            rc = -EBUSY;
        } else if (rep->type == REDIS_REPLY_ERROR) {
            rc = write_error(r, nd, rep);
            /* Refused (full, or writes not allowed here): no lock of its
             * own, but one a trusted writer took before is waited on. */
            if (rc == -ENOSPC || rc == -EROFS)
                rc = lock_peek(r, k, lk, rc);
        } else {
            rc = garbage(r, nd, rep);
        }
    }
out:
    op_unlock(r);
    return rc;
}

int kc_remote_unlock(struct kc_remote *r, const char *ns, const kc_key *key)
{
    char k[KC_REMOTE_KEY_MAX], lk[KC_REMOTE_KEY_MAX + 16];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0 ||
        kc_remote_lock_name(ns, key, lk, sizeof lk) != 0)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc == 0 && !r->keys.have_secret)
        rc = -EROFS;
    if (rc != 0)
        goto out;
    char prefix[sizeof r->token + 1];
    snprintf(prefix, sizeof prefix, "%s ", r->token);
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 5, "EVAL", unlock_script, "1", lk, prefix);
    redisReply *rep = NULL;
    struct kc__node *nd = NULL;
    rc = run_op(r, k, &cmd, &rep, &nd, true);
    if (rc == 0) {
        if (rep->type == REDIS_REPLY_INTEGER) {
            rc = rep->integer == 1 ? 0 : -ENOENT;
            kc__reply_free(rep);
        } else if (rep->type == REDIS_REPLY_ERROR) {
            rc = error_reply(r, nd, rep);
        } else {
            rc = garbage(r, nd, rep);
        }
    }
out:
    op_unlock(r);
    return rc;
}

int kc_remote_lock_clear(struct kc_remote *r, const char *ns, const kc_key *key)
{
    char k[KC_REMOTE_KEY_MAX], lk[KC_REMOTE_KEY_MAX + 16];
    if (kc_remote_key_name(ns, key, k, sizeof k) != 0 ||
        kc_remote_lock_name(ns, key, lk, sizeof lk) != 0)
        return -EINVAL;
    return del_key(r, k, lk, true);
}

uint64_t kc_remote_max_entry(struct kc_remote *r)
{
    return r->cfg.max_entry; /* constant once opened */
}

void kc_remote_counters(struct kc_remote *r, struct kc_remote_counters *out)
{
    pthread_mutex_lock(&r->mu);
#define KC__REMOTE_ADD(name, what) out->name += r->ctr.name;
    KC_REMOTE_COUNTERS(KC__REMOTE_ADD)
#undef KC__REMOTE_ADD
    op_unlock(r);
}

void kc_remote_flight_unspared(struct kc_remote *r, enum kc_remote_flight why)
{
    pthread_mutex_lock(&r->mu);
    switch (why) {
    case KC_REMOTE_FLIGHT_FREED:
        r->ctr.flight_freed++;
        break;
    case KC_REMOTE_FLIGHT_DEADLINE:
        r->ctr.flight_deadline++;
        break;
    case KC_REMOTE_FLIGHT_OFF:
        r->ctr.flight_off++;
        break;
    case KC_REMOTE_FLIGHT_UNUSABLE:
        r->ctr.flight_unusable++;
        break;
    case KC_REMOTE_FLIGHT_NO_WRITER:
        r->ctr.flight_no_writer++;
        break;
    case KC_REMOTE_FLIGHT_NO_LOCK:
        r->ctr.flight_no_lock++;
        break;
    }
    pthread_mutex_unlock(&r->mu);
}

void kc_remote_polling(bool on)
{
    polling = on;
}

void kc_remote_poll_served(struct kc_remote *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->ctr.misses > 0)
        r->ctr.misses--; /* the lookup that waited is a hit, not a miss too */
    op_unlock(r);
}

static bool node_up(const struct kc__node *nd)
{
    return !nd->off || (nd->retry_at_ns != 0 && kc_mono_ns() >= nd->retry_at_ns);
}

bool kc_remote_usable(struct kc_remote *r)
{
    pthread_mutex_lock(&r->mu);
    bool ok = !r->activated || r->act_rc == 0;
    if (ok && r->activated && !kc__breaker_closed(&r->rctx))
        ok = false;
    if (ok && r->activated) {
        ok = false;
        for (int i = 0; i < r->n_nodes && !ok; i++)
            ok = node_up(r->nodes[i]);
        for (int i = 0; i < r->cl.n_nodes && !ok; i++)
            ok = node_up(r->cl.nodes[i]);
    }
    op_unlock(r);
    return ok;
}

/* When nd can be asked again (mono ns): now when it is up, its retry time
 * when it is off but answered this process before, else UINT64_MAX. */
static uint64_t node_back_at(const struct kc__node *nd, uint64_t now)
{
    if (node_up(nd))
        return now;
    if (!nd->answered || nd->retry_at_ns == 0)
        return UINT64_MAX;
    return nd->retry_at_ns;
}

int kc_remote_back_in_ms(struct kc_remote *r)
{
    pthread_mutex_lock(&r->mu);
    int ms = -1;
    if (r->activated && r->act_rc == 0 && kc__breaker_closed(&r->rctx)) {
        uint64_t now = kc_mono_ns(), at = UINT64_MAX;
        for (int i = 0; i < r->n_nodes; i++) {
            uint64_t t = node_back_at(r->nodes[i], now);
            at = t < at ? t : at;
        }
        for (int i = 0; i < r->cl.n_nodes; i++) {
            uint64_t t = node_back_at(r->cl.nodes[i], now);
            at = t < at ? t : at;
        }
        if (at != UINT64_MAX) {
            uint64_t left = at > now ? (at - now + 999999) / 1000000 : 0;
            ms = left > INT32_MAX ? INT32_MAX : (int)left;
        }
    }
    op_unlock(r);
    return ms;
}

/* ---- ping --------------------------------------------------------------- */

/* "field:value\r\n" of an INFO reply into out. */
static void info_field(const redisReply *rep, const char *field, char *out, size_t len)
{
    out[0] = '\0';
    if (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_STATUS)
        return;
    size_t fl = strlen(field);
    for (const char *p = rep->str; p != NULL && *p != '\0';) {
        if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
            size_t n = strcspn(p + fl + 1, "\r\n");
            snprintf(out, len, "%.*s", (int)n, p + fl + 1);
            return;
        }
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
}

static void ping_node(struct kc_remote *r, struct kc__node *nd, struct kc_remote_ping_server *s)
{
    kc_remote_endpoint_display(&nd->ep, s->name, sizeof s->name);
    struct kc__cmd cmd;
    redisReply *rep = NULL;
    kc__cmd_set(&cmd, 1, "PING");
    /* Connected first, so the latency is one round trip. */
    s->rc = kc__node_exec(&r->rctx, nd, 1, &cmd, &rep);
    if (s->rc != 0)
        return;
    kc__reply_free(rep);
    uint64_t t0 = kc_mono_ns();
    s->rc = kc__node_exec(&r->rctx, nd, 1, &cmd, &rep);
    if (s->rc != 0)
        return;
    s->latency_ms = (double)(kc_mono_ns() - t0) / 1e6;
    bool pong = rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0;
    const char *auth = rep->type == REDIS_REPLY_ERROR ? kc__auth_why(rep->str) : NULL;
    if (auth != NULL) {
        snprintf(s->why, sizeof s->why, "%s", auth);
        kc__node_fail(&r->rctx, nd, -EACCES, auth);
        kc__reply_free(rep);
        s->rc = -EACCES;
        return;
    }
    if (!pong && rep->type == REDIS_REPLY_ERROR)
        snprintf(s->why, sizeof s->why, "answered PING with an error: %.80s", rep->str);
    else if (!pong)
        snprintf(s->why, sizeof s->why, "answered PING with something else than PONG");
    kc__reply_free(rep);
    if (!pong) {
        kc__node_fail(&r->rctx, nd, -EPROTO, s->why);
        s->rc = -EPROTO;
        return;
    }
    kc__cmd_set(&cmd, 2, "INFO", "server");
    if (kc__node_exec(&r->rctx, nd, 1, &cmd, &rep) == 0) {
        info_field(rep, "redis_version", s->version, sizeof s->version);
        kc__reply_free(rep);
    }
    kc__cmd_set(&cmd, 2, "INFO", "replication");
    if (kc__node_exec(&r->rctx, nd, 1, &cmd, &rep) == 0) {
        info_field(rep, "role", s->role, sizeof s->role);
        kc__reply_free(rep);
    }
}

int kc_remote_ping(struct kc_remote *r, struct kc_remote_ping *rep)
{
    memset(rep, 0, sizeof *rep);
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc == 0) {
        if (r->keys.have_secret)
            snprintf(rep->key_id, sizeof rep->key_id, "%016" PRIx64, r->keys.self.id);
        /* Its own key counts once, listed in the trusted file or not. */
        rep->n_trusted = (int)r->keys.n_trusted;
        bool listed = false;
        for (size_t i = 0; i < r->keys.n_trusted && !listed; i++)
            listed = r->keys.trusted[i].id == r->keys.self.id;
        if (r->keys.have_secret && !listed)
            rep->n_trusted++;
        if (r->cfg.mode == KC_REMOTE_CLUSTER) {
            rc = kc__cluster_refresh(&r->rctx, &r->cl, NULL);
            /* Every node that serves a slot (the primaries). */
            for (int i = 0; rc == 0 && i < r->cl.n_nodes; i++) {
                bool serves = false;
                for (int s = 0; s < KC__SLOTS && !serves; s++)
                    serves = r->cl.slot[s] == i;
                if (serves && rep->n < KC_REMOTE_MAX_ENDPOINTS)
                    ping_node(r, r->cl.nodes[i], &rep->server[rep->n++]);
            }
        } else {
            for (int i = 0; i < r->n_nodes; i++)
                ping_node(r, r->nodes[i], &rep->server[rep->n++]);
        }
        for (int i = 0; rc == 0 && i < rep->n; i++)
            if (rep->server[i].rc != 0)
                rc = rep->server[i].rc;
    }
    bool can_sign = r->keys.have_secret;
    op_unlock(r);
    if (rc != 0) {
        rep->roundtrip_rc = rc;
        return rc;
    }

    /* The signed round trip, through the tier's own paths. */
    kc_key probe = {.build = 0};
    if (getrandom(&probe.id, sizeof probe.id, GRND_NONBLOCK) != (ssize_t)sizeof probe.id)
        probe.id = (kc_digest){.lo = kc_mono_ns(), .hi = (uint64_t)getpid()};
    static const char ns[] = "kcache-ping";
    char body[64];
    int blen = snprintf(body, sizeof body, "kcache remote ping %016" PRIx64, probe.id.lo);
    void *got = NULL;
    size_t glen = 0;
    if (!can_sign) {
        int g = kc_remote_get(r, ns, &probe, &got, &glen, NULL);
        free(got);
        rep->roundtrip_rc = g == -ENOENT ? -EROFS : g;
        return g == -ENOENT ? 0 : g;
    }
    rc = kc_remote_put(r, ns, &probe, NULL, KC_KIND_BLOB, body, (size_t)blen, 0);
    if (rc == 0) {
        rc = kc_remote_get(r, ns, &probe, &got, &glen, NULL);
        if (rc == 0 && (glen != (size_t)blen || memcmp(got, body, glen) != 0))
            rc = -EBADMSG;
        free(got);
        int p = kc_remote_purge(r, ns, &probe);
        if (rc == 0)
            rc = p;
    }
    rep->roundtrip_rc = rc;
    return rc;
}

/* ---- the remote as a whole: scan (remote stats, prune) ------------------ */

/* "kcache:<ns>:<48 hex digits>" into ns and key: 0, or -EINVAL for a key
 * of another shape (locks, foreign keys). */
static int parse_entry_name(const char *k, size_t len, char *ns, size_t nscap, kc_key *key)
{
    if (len < 7 + 2 + 48 || memcmp(k, "kcache:", 7) != 0 || k[len - 49] != ':')
        return -EINVAL;
    size_t nl = len - 49 - 7;
    if (nl == 0 || nl >= nscap || memchr(k + 7, '{', nl) != NULL)
        return -EINVAL;
    uint64_t v[3] = {0, 0, 0};
    for (int i = 0; i < 48; i++) {
        char c = k[len - 48 + i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -EINVAL;
        v[i / 16] = v[i / 16] << 4 | (uint64_t)d;
    }
    memcpy(ns, k + 7, nl);
    ns[nl] = '\0';
    *key = (kc_key){.id = {.hi = v[0], .lo = v[1]}, .build = v[2]};
    return 0;
}

/* The bounds of one server's scan. A Redis SCAN with COUNT 1000 visits
 * at least about a thousand buckets a call, its table at most about twice
 * its keys, and names each key about once: a server's DBSIZE bounds the
 * calls and the keys a whole scan takes, with room for keys added while
 * it runs. A server that does not say (or says too much) gets the
 * absolute bounds; every scan also ends within KC__SCAN_MAX_MS. */
#define KC__SCAN_MAX_ROUNDS (1u << 20)
#define KC__SCAN_MAX_KEYS (1ull << 30)
#define KC__SCAN_MAX_MS (15u * 60 * 1000)

/* The server's DBSIZE, or -1 when it does not answer one. */
static int64_t node_dbsize(struct kc_remote *r, struct kc__node *nd)
{
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 1, "DBSIZE");
    redisReply *rep = NULL;
    if (kc__node_exec(&r->rctx, nd, 1, &cmd, &rep) != 0)
        return -1;
    int64_t n = rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0 ? rep->integer : -1;
    kc__reply_free(rep);
    return n;
}

/* A scan cut short: the first reason kept in rep. */
static void scan_cut(struct kc_remote_scan_report *rep, const struct kc__node *nd, const char *why)
{
    if (rep->cut++ == 0)
        snprintf(rep->why, sizeof rep->why, "%s: %s", nd->addr, why);
}

/* SCANs one server's entry keys, their sizes by STRLEN (pipelined), within
 * the bounds above (by `deadline`, kc_mono_ns). */
static int scan_node(struct kc_remote *r, struct kc__node *nd, kc_remote_scan_cb cb, void *arg,
                     uint64_t deadline, struct kc_remote_scan_report *srep)
{
    int64_t dbsize = node_dbsize(r, nd);
    uint64_t max_rounds = KC__SCAN_MAX_ROUNDS, max_keys = KC__SCAN_MAX_KEYS;
    if (dbsize >= 0 && (uint64_t)dbsize < KC__SCAN_MAX_KEYS / 8) {
        max_rounds = 1024 + (uint64_t)dbsize / 64;
        max_keys = 65536 + 4 * (uint64_t)dbsize;
        if (max_rounds > KC__SCAN_MAX_ROUNDS)
            max_rounds = KC__SCAN_MAX_ROUNDS;
    }
    uint64_t rounds = 0, keys_seen = 0;
    char cursor[32] = "0";
    do {
        if (++rounds > max_rounds) {
            scan_cut(srep, nd, "more SCAN calls than its size allows");
            return 0;
        }
        if (kc_mono_ns() > deadline) {
            scan_cut(srep, nd, "the scan's time ran out");
            return 0;
        }
        struct kc__cmd cmd;
        kc__cmd_set(&cmd, 6, "SCAN", cursor, "MATCH", "kcache:*", "COUNT", "1000");
        redisReply *rep = NULL;
        int rc = kc__node_exec(&r->rctx, nd, 1, &cmd, &rep);
        if (rc != 0)
            return rc;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY || rep->element[0]->len >= sizeof cursor) {
            return garbage(r, nd, rep);
        }
        bool stuck = strcmp(cursor, "0") != 0 && strcmp(cursor, rep->element[0]->str) == 0;
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        const redisReply *keys = rep->element[1];
        keys_seen += keys->elements;
        srep->keys_seen += keys->elements;
        for (size_t i = 0; i < keys->elements && rc == 0;) {
            struct kc__cmd sl[8];
            char nss[8][128];
            kc_key ks[8];
            int n = 0;
            for (; i < keys->elements && n < 8; i++) {
                const redisReply *e = keys->element[i];
                if (e->type != REDIS_REPLY_STRING ||
                    parse_entry_name(e->str, e->len, nss[n], sizeof nss[n], &ks[n]) != 0)
                    continue;
                kc__cmd_set(&sl[n], 2, "STRLEN", e->str);
                n++;
            }
            if (n == 0)
                continue;
            redisReply *lens[8];
            rc = kc__node_exec(&r->rctx, nd, n, sl, lens);
            if (rc != 0)
                break; /* no replies */
            for (int j = 0; j < n; j++) {
                uint64_t bytes = lens[j]->type == REDIS_REPLY_INTEGER && lens[j]->integer > 0
                                     ? (uint64_t)lens[j]->integer
                                     : 0;
                if (rc == 0 && bytes > 0)
                    rc = cb(nss[j], &ks[j], bytes, arg);
                kc__reply_free(lens[j]);
            }
        }
        kc__reply_free(rep);
        if (rc != 0)
            return rc;
        if (stuck && strcmp(cursor, "0") != 0) {
            scan_cut(srep, nd, "its SCAN cursor does not move");
            return 0;
        }
        if (keys_seen > max_keys && strcmp(cursor, "0") != 0) {
            scan_cut(srep, nd, "more keys than its size allows");
            return 0;
        }
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

int kc_remote_scan(struct kc_remote *r, kc_remote_scan_cb cb, void *arg,
                   struct kc_remote_scan_report *rep)
{
    struct kc_remote_scan_report own;
    if (rep == NULL)
        rep = &own;
    memset(rep, 0, sizeof *rep);
    uint64_t deadline = kc_mono_ns() + KC__SCAN_MAX_MS * 1000000ull;
    pthread_mutex_lock(&r->mu);
    int rc = activate(r);
    if (rc == 0 && r->cfg.mode == KC_REMOTE_CLUSTER) {
        rc = kc__cluster_refresh(&r->rctx, &r->cl, NULL);
        /* Every node that serves a slot (the primaries), once. */
        for (int i = 0; rc == 0 && i < r->cl.n_nodes; i++) {
            bool serves = false;
            for (int s = 0; s < KC__SLOTS && !serves; s++)
                serves = r->cl.slot[s] == i;
            if (serves)
                rc = scan_node(r, r->cl.nodes[i], cb, arg, deadline, rep);
        }
    } else {
        for (int i = 0; rc == 0 && i < r->n_nodes; i++)
            rc = scan_node(r, r->nodes[i], cb, arg, deadline, rep);
    }
    op_unlock(r);
    return rc;
}
