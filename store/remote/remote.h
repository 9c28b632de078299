/*
 * The remote tier: entries shared by many machines through Redis (one
 * server, client-side shards over several, or a Redis Cluster), each entry
 * signed by a trusted writer. See ARCHITECTURE.md, "Beyond one machine".
 *
 * libc only at link time: libhiredis (0.14) and libsodium are dlopen()ed on
 * the first operation that needs them, so the preloaded shim can link this
 * module and a process that never reaches the remote never maps either.
 *
 * Conventions: functions return 0 or a negative errno; -ENOENT is a miss.
 * Every operation is bounded by the configured timeouts: one operation,
 * every redirection, slot map read and connect included, takes at most
 * one connect plus one operation timeout. Every reply is bounded in size,
 * elements and nesting before it is allocated. The remote is a circuit
 * breaker: a failure of a server (down, refusing, hung, slow, garbage) is
 * counted, logs one warning (the first), and turns that server off for a
 * backoff; in a cluster, a node that never answered (the servers name the
 * nodes: redirections and slot maps can name endless new addresses) turns
 * the whole remote off, unless it refused (that cost nothing: a soft
 * failure); three soft failures in a row (error replies, oversized values,
 * refused values of 1 MiB or more, redirection loops, refusals of nodes
 * never reached) turn the whole remote off. The backoff is `retry_ms` (1 s by default), doubling at
 * each failure in a row up to a minute; then one operation probes it, and one that works closes it.
 * So a process's remote time is bounded whatever the servers do, and a job that lives for hours
 * comes back to sharing within seconds of its Redis. In a Redis Cluster, the
 * entries and locks of a slot whose node is off (a primary that died, its
 * replica not yet promoted) live under fallback names on the live primaries
 * meanwhile (tier.c), so the nodes keep sharing them. Thread-safe: one mutex per remote serialises
 * its operations (one connection per server per process, kept).
 *
 * The operations mirror store/tier.h's (get, put, purge, after_fork,
 * close); the wiring binds them into a `struct kc_tier_ops`.
 */
#ifndef KCACHE_STORE_REMOTE_H
#define KCACHE_STORE_REMOTE_H

#include "../store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration (url.c) --------------------------------------------- */

#define KC_REMOTE_MAX_ENDPOINTS 64
#define KC_REMOTE_DEFAULT_CONNECT_MS 100
#define KC_REMOTE_DEFAULT_OPERATION_MS 1000
#define KC_REMOTE_DEFAULT_MAX_ENTRY (64ull << 20)
/* Redis' proto-max-bulk-len default: no server takes a larger value. */
#define KC_REMOTE_MAX_MAX_ENTRY (512ull << 20)

enum kc_remote_mode {
    KC_REMOTE_NONE = 0,    /* KCACHE_REMOTE unset or empty: no remote */
    KC_REMOTE_SERVERS = 1, /* one server, or several spread by rendezvous hashing */
    KC_REMOTE_CLUSTER = 2, /* a Redis Cluster reached through its seed nodes */
};

enum kc_remote_transport {
    KC_REMOTE_TCP = 1,
    KC_REMOTE_UNIX = 2,
};

/* One server (a shard, or a cluster seed). */
struct kc_remote_endpoint {
    int transport;            /* enum kc_remote_transport */
    bool tls;                 /* rediss://: TCP over TLS */
    char host[256];           /* TCP: name or address (no brackets) */
    int port;                 /* TCP: 1..65535 */
    char path[108];           /* unix: the socket's absolute path */
    int db;                   /* SELECT'ed after connecting (0: none) */
    char user[128];           /* AUTH user (Redis 6 ACL), may be empty */
    char password[256];       /* AUTH password, may be empty */
    int connect_timeout_ms;   /* |connect-timeout=MS */
    int operation_timeout_ms; /* |operation-timeout=MS */
    bool read_only;           /* |read-only: never written */
    double weight;            /* shard weight (shards=NAME(W)), 1 by default */
    char name[320];           /* what rendezvous hashing hashes: the URL,
                               * password left out */
};

struct kc_remote_config {
    int mode;                      /* enum kc_remote_mode */
    int n;                         /* endpoints (shards or seeds) */
    struct kc_remote_endpoint *ep; /* malloc'd array of n */
    uint64_t ttl_s;                /* KCACHE_REMOTE_TTL, 0: none */
    uint64_t max_entry;            /* KCACHE_REMOTE_MAX_ENTRY, bytes */
    char signing_key[4096];        /* KCACHE_REMOTE_SIGNING_KEY, may be empty */
    char trusted_keys[4096];       /* KCACHE_REMOTE_TRUSTED_KEYS, may be empty */
    bool trust_any;                /* KCACHE_REMOTE_TRUST=any */
    char password_file[4096];      /* KCACHE_REMOTE_PASSWORD_FILE, may be empty */
    char ca_file[4096];            /* KCACHE_REMOTE_CA_FILE, may be empty: the system's */
    char cert_file[4096];          /* KCACHE_REMOTE_CERT_FILE, may be empty */
    char key_file[4096];           /* KCACHE_REMOTE_KEY_FILE, may be empty */
    bool tls_verify;               /* KCACHE_REMOTE_TLS_VERIFY (true unless 0) */
    int n_warnings;                /* non-fatal: a value kept its default */
    char warnings[4][200];
};

/* The raw values, as the environment holds them (NULL: unset). */
struct kc_remote_settings {
    const char *remote;        /* KCACHE_REMOTE */
    const char *ttl;           /* KCACHE_REMOTE_TTL */
    const char *max_entry;     /* KCACHE_REMOTE_MAX_ENTRY */
    const char *signing_key;   /* KCACHE_REMOTE_SIGNING_KEY */
    const char *trusted_keys;  /* KCACHE_REMOTE_TRUSTED_KEYS */
    const char *trust;         /* KCACHE_REMOTE_TRUST: signed|any */
    const char *password_file; /* KCACHE_REMOTE_PASSWORD_FILE */
    const char *ca_file;       /* KCACHE_REMOTE_CA_FILE */
    const char *cert_file;     /* KCACHE_REMOTE_CERT_FILE */
    const char *key_file;      /* KCACHE_REMOTE_KEY_FILE */
    const char *tls_verify;    /* KCACHE_REMOTE_TLS_VERIFY */
};

/* Fills *s from the configuration kc_config_load() read (empty strings
 * for unset variables; nothing at all in a secure-execution process). The
 * pointers are cfg's. */
struct kc_config;
void kc_remote_settings_from_config(const struct kc_config *cfg, struct kc_remote_settings *s);

/* Parses the settings into *out (which the caller releases with
 * kc_remote_config_free, also after a failure). KCACHE_REMOTE's grammar is
 * ccache's:
 *   redis://[[USER:]PASSWORD@]HOST[:PORT][/DB]
 *   rediss://...                             (the same, over TLS)
 *   redis+unix:SOCKET[?db=N]                 (SOCKET absolute; also redis+unix:///SOCKET)
 *   redis-cluster://[[USER:]PASSWORD@]HOST[:PORT][,HOST[:PORT]...]
 *   rediss-cluster://...                     (the same, every node over TLS)
 * each optionally followed by |ATTR attributes: read-only,
 * connect-timeout=MS, operation-timeout=MS, shards=NAME[(WEIGHT)],... (the
 * URL's one '*' replaced by each NAME); several URLs separated by white
 * space are shards too. USER and PASSWORD may be %-encoded. With
 * KCACHE_REMOTE_PASSWORD_FILE set, a user info without ':' (USER@HOST)
 * names the user (AUTH USER PASSWORD, the password the file's); without,
 * it is the password, as ccache reads it.
 * 0: parsed (mode KC_REMOTE_NONE when KCACHE_REMOTE is unset or blank);
 * warnings for the other variables, each keeping its default, are in
 * out->warnings. -EINVAL: KCACHE_REMOTE is malformed; `err` (may be NULL)
 * says why, passwords left out, and the remote must stay off. -ENOMEM. */
int kc_remote_config_parse(const struct kc_remote_settings *s, struct kc_remote_config *out,
                           char *err, size_t errlen);

/* Releases what kc_remote_config_parse allocated (NULL-safe). */
void kc_remote_config_free(struct kc_remote_config *c);

/* Copies `src` into `dst` (deep); 0 or -ENOMEM. */
int kc_remote_config_copy(struct kc_remote_config *dst, const struct kc_remote_config *src);

/* Writes KCACHE_REMOTE's value with every password replaced by "********",
 * for display; works on malformed values too. Returns the length it wanted
 * (as snprintf). The one implementation is common/config.c's
 * kc_config_redact_url (kcache config shows the value through it). */
int kc_remote_redact(const char *remote, char *out, size_t len);

/* The display form of one endpoint (password redacted). */
void kc_remote_endpoint_display(const struct kc_remote_endpoint *e, char *out, size_t len);

/* ---- counters ---------------------------------------------------------- */

#define KC_REMOTE_COUNTERS(X)                                                                      \
    X(hits, "entries served from the remote")                                                      \
    X(misses, "lookups the remote did not have")                                                   \
    X(uploads, "entries written to the remote")                                                    \
    X(upload_bytes, "bytes written to the remote")                                                 \
    X(download_bytes, "bytes of entries served from the remote")                                   \
    X(skipped, "entries past KCACHE_REMOTE_MAX_ENTRY, kept local")                                 \
    X(errors, "failures: refused, reset, error replies, garbage")                                  \
    X(timeouts, "connect or operation timeouts")                                                   \
    X(bad, "entries refused: signature, key id, namespace, key or checksum")                       \
    X(moved, "MOVED redirections followed")                                                        \
    X(asks, "ASK redirections followed")                                                           \
    X(connects, "connections made")                                                                \
    X(locks, "cluster-wide locks taken")                                                           \
    X(lock_busy, "cluster-wide locks another node held")                                           \
    X(saved_ns, "compile time remote hits saved")                                                  \
    X(refusals, "connections refused or reset")                                                    \
    X(oom, "writes a full server refused (OOM, maxmemory)")                                        \
    X(auth_failures, "credentials refused (NOAUTH, WRONGPASS, NOPERM)")                            \
    X(protocol_errors, "replies that broke the protocol or a bound (size, nesting)")               \
    X(error_replies, "other error replies")                                                        \
    X(bad_signatures, "entries refused: unsigned, unknown key id or signature")                    \
    X(lock_untrusted, "locks not waited on: not taken by a trusted writer")                        \
    X(breaker_opens, "times the remote or a server was turned off")                                \
    X(polls, "lookups of an entry another node was compiling")                                     \
    X(tls_failures, "TLS sessions refused: certificate, no TLS, client certificate wanted")        \
    X(write_refusals, "writes the server refused this user (NOPERM): the node reads only")         \
    X(tls_sessions_made, "TLS sessions made with a full handshake (certificate verified)")         \
    X(tls_sessions_resumed, "TLS sessions resumed (an abbreviated handshake, no certificate)")     \
    X(flight_freed, "compiles after a wait whose lock went without a result (holder gave up)")     \
    X(flight_deadline, "compiles after a wait that ran out of KCACHE_LOCK_TIMEOUT")                \
    X(flight_off, "compiles with the remote off here: no cluster single flight")                   \
    X(flight_unusable, "compiles after a wait: the holder's result is not usable here")            \
    X(flight_no_writer, "compiles of a read-only node with no trusted writer at work")             \
    X(flight_no_lock, "compiles with no lock to wait on: refused (full), untrusted, or failed")

struct kc_remote_counters {
#define KC__REMOTE_FIELD(name, what) uint64_t name;
    KC_REMOTE_COUNTERS(KC__REMOTE_FIELD)
#undef KC__REMOTE_FIELD
};

/* ---- the tier (tier.c) ------------------------------------------------- */

struct kc_remote;

struct kc_remote_options {
    /* This node's name in lock values (NULL: host name and pid). */
    const char *node;
    /* After a failure, the remote is tried again after retry_ms (0: 1 s),
     * doubling at each failure in a row up to a minute. */
    int retry_ms;
    /* No connection outlives an operation: each is closed before the
     * call returns, so a host holding this remote (the shim) never finds
     * a descriptor of kcache's between its calls, and none it closed or
     * reused is ever written to. */
    bool transient;
    /* Where the warnings of loading the remote (kc_remote_load: the
     * password file, the keys) go; NULL: logged (kc_log). */
    void (*warn)(const char *msg, void *arg);
    void *warn_arg;
};

/* Opens the remote described by cfg (copied; mode must not be
 * KC_REMOTE_NONE). Cheap: nothing is loaded, read or connected until the
 * first operation. 0 with *out (close it with kc_remote_close), -EINVAL,
 * -ENOMEM. */
int kc_remote_open(const struct kc_remote_config *cfg, const struct kc_remote_options *opt,
                   struct kc_remote **out);

/* Loads what the remote needs, as its first operation would: libhiredis,
 * libsodium, the password file and the keys; connects to nothing. Each
 * file refused or unusable is one warning (options.warn, else logged), as
 * the first operation of a host or the owner gives. 0, or -ENETDOWN: the
 * remote is off (a warning said why). */
int kc_remote_load(struct kc_remote *r);

/* tier.h's get: 0 with *body (malloc'd, caller frees), *len and *info (may
 * be NULL; hits and last_hit are 0) for an entry that verified: its
 * checksum, namespace and key, and its signature by a trusted key (unless
 * KCACHE_REMOTE_TRUST=any). -ENOENT: not there. -EBADMSG: there but
 * refused (counted as bad, one warning per process; never purged: another
 * node may trust what this one does not). -ENETDOWN: the remote is off
 * (failed earlier, or unusable), -ETIMEDOUT, -ECONNREFUSED, -EIO, -EPROTO:
 * it failed now. -EINVAL: a namespace the remote cannot name (empty, over
 * 127 bytes, a byte outside '!'..'~', or '{', '}'). Every negative value
 * is a miss for the caller. */
int kc_remote_get(struct kc_remote *r, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info);

/* tier.h's put: signs and SETs the entry (EX KCACHE_REMOTE_TTL when set).
 * The caller uploads only what this node compiled (KC_PROV_LOCAL): the
 * key signs it. A valid value the remote holds (one this node verifies)
 * is never replaced: SET NX, then -EEXIST when what is there verifies
 * (a manifest, the one kind that grows, is replaced when its dependency
 * sets differ); one that does not verify is overwritten. `source` is not
 * kept remotely (no source map: take_by_source stays local). 0 once the
 * server acknowledged it. -EFBIG: larger than
 * KCACHE_REMOTE_MAX_ENTRY (counted as skipped; keep it local). -EROFS: this
 * node does not write (no usable signing key, read-only attribute, or a
 * server refused writes). -ENOSPC: the server is full (maxmemory); no
 * further puts this process. Other negatives as get. */
int kc_remote_put(struct kc_remote *r, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns);

/* kc_remote_put with flags: KC_REMOTE_PUT_KEEP keeps a valid manifest the
 * remote holds too (a backfill: `kcache push`, whose manifests may lack
 * sets other nodes added). */
#define KC_REMOTE_PUT_KEEP 1u
int kc_remote_put_flags(struct kc_remote *r, const char *ns, const kc_key *key,
                        const kc_digest *source, uint32_t kind, const void *body, size_t len,
                        uint64_t saved_ns, unsigned flags);

/* tier.h's purge: DEL of the entry. 0 (also when it was not there: -ENOENT
 * is not distinguished), -EROFS, other negatives as get. */
int kc_remote_purge(struct kc_remote *r, const char *ns, const kc_key *key);

/* tier.h's after_fork: in a forked child, drops every connection without
 * a word to the server (the parent keeps using them) and resets the lock.
 * The child reconnects on its next operation. */
void kc_remote_after_fork(struct kc_remote *r);

/* tier.h's close: closes connections, wipes the secret key. NULL-safe. */
void kc_remote_close(struct kc_remote *r);

/* Cluster-wide single flight. Takes the lock guarding (ns, key):
 * SET kcache:lock:{kcache:<ns>:<key hex>} <node token> NX PX ttl_ms, a key in
 * the same cluster slot (and shard) as the entry it guards. 0: taken; this
 * process holds it until kc_remote_unlock or ttl_ms (so a holder that dies
 * lets it expire). -EBUSY: another holder has it (poll the entry with
 * kc_remote_get; also when this node's lock was refused, full or not
 * allowed, while a trusted writer holds it). -EROFS: this node does not
 * write, so it must not make others wait for it; -ENOSPC: the server is
 * full (asked whatever the write backoff: a lock is small); compile
 * without the lock, either way. Other negatives: the
 * remote failed (as get); proceed without the lock. */
int kc_remote_lock(struct kc_remote *r, const char *ns, const kc_key *key, int ttl_ms);

/* Whether a trusted writer took a lock in namespace ns lately (within a
 * few seconds): a writer sets a signed mark, kcache:writer:{<ns>}, when it
 * takes a lock. A read-only node that finds neither the entry nor a lock
 * waits while it is there: a writer working through the same programs
 * will take that lock soon. 1, 0 (none, expired, or not a trusted
 * writer's), or a negative errno (as get). */
int kc_remote_writer_active(struct kc_remote *r, const char *ns);

/* Why a node compiles a request although the cluster's single flight is
 * on (KCACHE_REMOTE set): each counted as its flight_* counter. */
enum kc_remote_flight {
    KC_REMOTE_FLIGHT_FREED,     /* waited; the lock went without a result */
    KC_REMOTE_FLIGHT_DEADLINE,  /* waited out KCACHE_LOCK_TIMEOUT (or what was left) */
    KC_REMOTE_FLIGHT_OFF,       /* the remote off here (before or during a wait) */
    KC_REMOTE_FLIGHT_UNUSABLE,  /* the holder's result is there, not usable here */
    KC_REMOTE_FLIGHT_NO_WRITER, /* a read-only node, no trusted writer at work */
    KC_REMOTE_FLIGHT_NO_LOCK,   /* no lock to wait on: refused, untrusted, failed */
};

/* Counts one compile the cluster's single flight did not spare, by why. */
void kc_remote_flight_unspared(struct kc_remote *r, enum kc_remote_flight why);

/* Single flight's polls: while on (this thread), a lookup that misses
 * counts as a poll, not a miss; kc_remote_poll_served says the lookup
 * that waited was served after all (its first miss becomes no miss), so
 * the remote's hit rate counts each lookup once. */
void kc_remote_polling(bool on);
void kc_remote_poll_served(struct kc_remote *r);

/* Releases a lock this process holds (a compare-and-delete: another
 * holder's lock, taken after ours expired, is left alone). 0 when it was
 * ours and is gone, -ENOENT when it was not ours (expired), other
 * negatives as get. */
int kc_remote_unlock(struct kc_remote *r, const char *ns, const kc_key *key);

/* KCACHE_REMOTE_MAX_ENTRY: larger entries are never uploaded. */
uint64_t kc_remote_max_entry(struct kc_remote *r);

/* Deletes the lock guarding (ns, key), whoever holds it: the owner calls
 * it once it has uploaded the entry the lock's waiters poll for (an NVRTC
 * manifest, a JIT entry), so they are served it now and later misses of
 * the key do not wait for a lock whose compile is published. A holder of
 * a newer compile that loses its lock so costs a duplicate compile at
 * worst. 0 (also when there was none), -EROFS (this node does not write),
 * other negatives as get. */
int kc_remote_lock_clear(struct kc_remote *r, const char *ns, const kc_key *key);

/* Adds this remote's counters into *out. */
void kc_remote_counters(struct kc_remote *r, struct kc_remote_counters *out);

/* Whether the remote can serve a get now (false: off after a failure, or
 * unusable: no library, no trusted key). Never blocks; does not connect. */
bool kc_remote_usable(struct kc_remote *r);

/* When a remote that is off here is asked again, if a server of it
 * answered this process before it failed (a restart refuses for a moment,
 * then serves): milliseconds from now (0: usable now), or -1 (not
 * activated, unusable, the breaker open, or no such server: nothing to
 * wait for). Never blocks; does not connect. */
int kc_remote_back_in_ms(struct kc_remote *r);

/* The server key of an entry: kcache:<ns>:<32 hex digits of key->id (hi,
 * lo)><16 of key->build>. 0, or -EINVAL for a namespace the remote cannot
 * name (see get). buf holds at least KC_REMOTE_KEY_MAX bytes. */
#define KC_REMOTE_KEY_MAX 200
int kc_remote_key_name(const char *ns, const kc_key *key, char *buf, size_t len);
/* The lock key guarding it: kcache:lock:{<the entry's key>}. */
int kc_remote_lock_name(const char *ns, const kc_key *key, char *buf, size_t len);

/* ---- the remote in the store's chain (adapter.c) ------------------------ */

struct kc_tier; /* ../tier.h */

/* The remote as a tier of the store's chain (../tier.h): get, after_fork
 * and close bound to kc_remote_get, kc_remote_after_fork and
 * kc_remote_close; with `writes`, put and purge too (the owner, the tool).
 * Without (hosts), the chain never writes to the remote: what a host
 * compiles goes to its spool, and the owner uploads it. The tier owns r
 * from now on (closed with it). 0 with *out, -EINVAL, -ENOMEM (r is then
 * still the caller's). */
int kc_remote_tier(struct kc_remote *r, bool writes, struct kc_tier **out);

/* The remote of a tier kc_remote_tier made, or NULL for any other tier. */
struct kc_remote *kc_remote_of_tier(struct kc_tier *t);

/* The remote's counters as the store keeps statistics: per backend, a
 * struct kc_counters of KC_N_COUNTERS slots. They are spread, in
 * KC_REMOTE_COUNTERS order, over the pseudo-backends "remote.0"
 * .. "remote.4" (kc_remote_stat_backend), which `kcache stats`
 * shows as its remote section, not as backends. New counters are appended,
 * so statistics written earlier keep their meaning. */
#define KC_REMOTE_STAT_BACKENDS 5
const char *kc_remote_stat_backend(int i);
bool kc_remote_is_stat_backend(const char *name);
void kc_remote_counters_pack(const struct kc_remote_counters *c,
                             struct kc_counters out[KC_REMOTE_STAT_BACKENDS]);
/* Adds backend number `which`'s counters (in) into *out. */
void kc_remote_counters_unpack(const struct kc_counters *in, int which,
                               struct kc_remote_counters *out);
/* a -= b, field by field (never below 0): the counters since a snapshot. */
void kc_remote_counters_sub(struct kc_remote_counters *a, const struct kc_remote_counters *b);

/* ---- provenance and upload configuration (sign.c, url.c) --------------- */

/* The signer tag an entry a key signed records (KC_PROV_TAG): the low 28
 * bits of XXH3-128 of its public key. libc only. */
uint32_t kc_remote_signer_tag(const unsigned char pk[32]);

/* The signers whose entries a process serves from its own store: the keys
 * of KCACHE_REMOTE_TRUSTED_KEYS and this node's own (SIGNING_KEY.pub, when
 * there). NULL *out: no judgment (KCACHE_REMOTE_TRUST=any, or neither key
 * set). Read with libc alone (no libsodium): a local hit maps nothing. An
 * unusable trusted file trusts none of it. 0 or -ENOMEM. */
struct kc_remote_signers;
int kc_remote_signers_load(const struct kc_remote_settings *s, struct kc_remote_signers **out);
/* Whether an entry of provenance `prov` is served: anything but
 * KC_PROV_SIGNED, and KC_PROV_SIGNED when its signer is one of sg's.
 * NULL sg: all. */
bool kc_remote_signers_serve(const struct kc_remote_signers *sg, uint32_t prov);
void kc_remote_signers_free(struct kc_remote_signers *sg);

/* A process's upload configuration as its puts carry it (store/local's
 * KC__PUT_UPLOAD): its remote settings as text, one "NAME=VALUE" line
 * each, paths made absolute. Secrets by reference: the signing key and the
 * password file by path (the owner reads them, checked as here); only a
 * password written inline in KCACHE_REMOTE is in it (the put file is 0600
 * in a private directory, and goes once drained). Returns its length, or
 * 0 when the process does not upload (no remote, no signing key, or
 * malformed): its puts carry none and are never uploaded. */
size_t kc_remote_upload_descriptor(const struct kc_remote_settings *s, char *out, size_t len);
/* Reads a descriptor back into *s, whose strings point into `storage`
 * (cap bytes, at least n + 8). 0, or -EBADMSG. */
int kc_remote_descriptor_settings(const char *d, size_t n, struct kc_remote_settings *s,
                                  char *storage, size_t cap);

/* ---- the tool (tier.c, sign.c) ------------------------------------------ */

struct kc_remote_ping_server {
    char name[340];    /* display form */
    int rc;            /* 0, or why it failed */
    double latency_ms; /* PING round trip, connection made beforehand */
    char version[32];  /* redis_version from INFO server */
    char role[16];     /* "master" / "slave" */
    char why[160];     /* what the server answered, when rc says too little */
};

struct kc_remote_ping {
    int n; /* servers reached for */
    struct kc_remote_ping_server server[KC_REMOTE_MAX_ENDPOINTS];
    int roundtrip_rc; /* signed entry written, read and verified, deleted:
                       * 0; -EROFS when this node does not write (then a
                       * read of a missing probe only); other negatives */
    char key_id[17];  /* this node's signing key id (hex), empty if none */
    int n_trusted;    /* keys it verifies with */
};

/* `kcache remote ping`: reaches every server (shard; every primary of a
 * cluster), measures a PING, reads the server version, then writes a
 * signed probe entry, reads it back through the verifying path and
 * deletes it. Counters are not reset. 0 when every step worked; else the
 * first error (details in *rep). */
int kc_remote_ping(struct kc_remote *r, struct kc_remote_ping *rep);

/* `kcache remote stats` / `remote prune`: calls cb(ns, key, bytes, arg)
 * for every entry on every server (each shard; each primary of a
 * cluster), SCAN MATCH kcache:* and STRLEN, locks and foreign keys left
 * out. The remote's mutex is held: cb must not call into r (collect, then
 * purge). A non-zero cb return stops the walk and is returned. 0, or the
 * first failure (as get).
 *
 * Every server's scan is bounded: its SCAN calls and the keys they name
 * by what its DBSIZE allows (absolute bounds when it does not say), a
 * cursor that does not move ends it, and the whole walk ends within
 * fifteen minutes. A scan cut short by a bound is not a failure: it is
 * counted in rep->cut (its first reason in rep->why) and the walk goes on
 * to the next server. rep may be NULL. */
struct kc_remote_scan_report {
    uint64_t keys_seen; /* keys the servers' SCAN replies named */
    int cut;            /* servers whose scan was cut short */
    char why[400];      /* the first: "<server>: <which bound>" */
};
typedef int (*kc_remote_scan_cb)(const char *ns, const kc_key *key, uint64_t bytes, void *arg);
int kc_remote_scan(struct kc_remote *r, kc_remote_scan_cb cb, void *arg,
                   struct kc_remote_scan_report *rep);

/* `kcache keygen PATH`: a new Ed25519 key pair. The directories leading to
 * PATH that do not exist are made (0700). Writes the secret key to
 * PATH (created 0600, never overwriting: -EEXIST) as one line
 * "kcache-ed25519-secret <base64 seed>", and the public key to PATH.pub
 * (0644) as one line "kcache-ed25519 <base64 key> <comment>", the line a
 * trusted-keys file holds (as ssh-keygen's .pub). `comment` NULL: user@host.
 * *key_id (17 bytes, may be NULL): its id in hex. 0, -EEXIST, -ENOSYS (no
 * libsodium), or another negative errno. */
int kc_remote_keygen(const char *path, const char *comment, char *key_id);

#ifdef __cplusplus
}
#endif

#endif
