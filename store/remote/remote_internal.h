/*
 * Internals of the remote tier (store/remote/), shared by its files and its
 * white-box tests (tests/remote/).
 */
#ifndef KCACHE_STORE_REMOTE_INTERNAL_H
#define KCACHE_STORE_REMOTE_INTERNAL_H

#include "remote.h"
#include "tls_api.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Opens one of the remote's libraries: the packaged tree's
 * libkcache-remote-deps.so beside this object when there is one, else
 * the system's soname (load.c). RTLD_NOW | RTLD_LOCAL; NULL as dlopen. */
void *kc__remote_dlopen(const char *soname);

/* ---- libhiredis, dlopen()ed (redis.c) ----------------------------------- */

#define KC__HIREDIS_SONAME "libhiredis.so.0.14"

/* The sync API of hiredis 0.14 this module calls, resolved from the
 * library at first use. Types are the headers' own. */
struct kc__hiredis {
    __typeof__(&redisConnectWithTimeout) connect_tcp;
    __typeof__(&redisConnectUnixWithTimeout) connect_unix;
    __typeof__(&redisSetTimeout) set_timeout;
    __typeof__(&redisFree) free_ctx;
    __typeof__(&redisAppendCommandArgv) append_argv;
    __typeof__(&redisBufferWrite) buffer_write;
    __typeof__(&redisBufferRead) buffer_read;
    __typeof__(&redisGetReplyFromReader) get_reply;
};

/* Loads libhiredis once per process. 0 with *out, or -ENOSYS when the
 * library or one of its functions is missing (logged once). */
int kc__hiredis_load(const struct kc__hiredis **out);

/* ---- the TLS object, dlopen()ed (load.c) -------------------------------- */

/* Loads libkcache-remote-tls.so once per process (tls_api.h): beside this
 * object, in ../lib/ (the tool), or where a build tree keeps it, each only
 * where no other user can replace it (kc_trusted_path). 0 with *out;
 * -ENOSYS when there is none or it is of another ABI: why says which
 * (for the one warning). */
int kc__tls_load(const struct kc_tls_api **out, char *why, size_t whylen);

/* ---- libsodium, dlopen()ed (sign.c) ------------------------------------- */

#define KC__SODIUM_SONAME "libsodium.so.23"

struct kc__sodium {
    int (*seed_keypair)(unsigned char *pk, unsigned char *sk, const unsigned char *seed);
    int (*sign_detached)(unsigned char *sig, unsigned long long *siglen, const unsigned char *m,
                         unsigned long long mlen, const unsigned char *sk);
    int (*verify_detached)(const unsigned char *sig, const unsigned char *m,
                           unsigned long long mlen, const unsigned char *pk);
    int (*generichash)(unsigned char *out, size_t outlen, const unsigned char *in,
                       unsigned long long inlen, const unsigned char *key, size_t keylen);
    void (*randombytes_buf)(void *buf, size_t size);
    void (*memzero)(void *p, size_t n);
    /* BLAKE2b over a stream (bundles' digest); NULL when missing. The
     * state is generichash_statebytes() bytes, 64-byte aligned. */
    size_t (*generichash_statebytes)(void);
    int (*generichash_init)(void *state, const unsigned char *key, size_t keylen, size_t outlen);
    int (*generichash_update)(void *state, const unsigned char *in, unsigned long long inlen);
    int (*generichash_final)(void *state, unsigned char *out, size_t outlen);
};

/* Loads libsodium once per process and runs sodium_init. 0 with *out, or
 * -ENOSYS (logged once). */
int kc__sodium_load(const struct kc__sodium **out);

/* ---- keys (sign.c) ------------------------------------------------------ */

#define KC__PK_LEN 32
#define KC__SK_LEN 64
#define KC__SIG_LEN 64
#define KC__SEED_LEN 32
#define KC__MAX_TRUSTED 1024

struct kc__pubkey {
    unsigned char pk[KC__PK_LEN];
    uint64_t id;
};

/* What a node signs with and verifies against. */
struct kc__keys {
    bool have_secret;
    unsigned char sk[KC__SK_LEN];
    struct kc__pubkey self;     /* the signing key's public half */
    struct kc__pubkey *trusted; /* malloc'd */
    size_t n_trusted;
    bool trust_any;
};

/* A key's id: the first 8 bytes of BLAKE2b-256(pk), little-endian. */
uint64_t kc__key_id(const struct kc__sodium *na, const unsigned char pk[KC__PK_LEN]);

/* Reads the signing key file: a regular file (not a symlink) owned by
 * this user with no group or other permission bits. 0 with k->sk and
 * k->self; -EPERM (mode or owner), -EBADMSG (not a key line), or the
 * open/read error. */
int kc__keys_load_secret(const struct kc__sodium *na, const char *path, struct kc__keys *k);

/* Reads a trusted-keys file: lines "kcache-ed25519 <base64> [comment]";
 * blank lines and '#' comments skipped; a malformed line is skipped with a
 * warning. The file must not be writable by group or others, and be owned
 * by this user or root (-EPERM otherwise). Appends to k->trusted. */
int kc__keys_load_trusted(const struct kc__sodium *na, const char *path, struct kc__keys *k);

/* Reads KCACHE_REMOTE_PASSWORD_FILE: a regular file of this user's with
 * no group or other permission bits (as the signing key), its first line
 * the password. 0 with out, -EPERM, -EBADMSG (empty, or longer than cap),
 * or the open/read error. */
int kc__read_password_file(const char *path, char *out, size_t cap);

/* What an error reply about credentials means, for a warning ("asks for
 * a password (NOAUTH): ..."), or NULL for any other reply (url.c). */
const char *kc__auth_why(const char *reply);

/* Parses one public key line; 0 with pk, or -EBADMSG. */
int kc__pubkey_parse(const char *line, unsigned char pk[KC__PK_LEN]);

/* Whether a trusted key has this id; its key when so. */
const struct kc__pubkey *kc__keys_find(const struct kc__keys *k, uint64_t id);

/* Wipes the secret and frees the trusted list. */
void kc__keys_free(const struct kc__sodium *na, struct kc__keys *k);

/* Base64 (RFC 4648, padded). encode writes a NUL-terminated string into
 * out (4 * ceil(n / 3) + 1 bytes). decode: the number of bytes written
 * into out (at most cap), or -1 on a malformed string or one decoding to
 * more than cap bytes. */
void kc__b64_encode(const unsigned char *in, size_t n, char *out);
int kc__b64_decode(const char *in, size_t n, unsigned char *out, size_t cap);

/* ---- small signed values (sign.c) -------------------------------------- */

/* Signs a small value (a lock value, ...) with this node's key: the
 * signature covers "kcache-blob-v1", `context` (1..63 bytes naming what it
 * is, as "kcache-lock-v1": a signature made for one use never verifies for
 * another) and BLAKE2b-256 of msg. 0 with sig; -EROFS without a secret
 * key; -EINVAL (context); -EIO. The signer's id to send beside it is
 * keys->self.id. */
int kc__blob_sign(const struct kc__sodium *na, const struct kc__keys *keys, const char *context,
                  const void *msg, size_t n, unsigned char sig[KC__SIG_LEN]);
/* Verifies it: 0 when key_id is a trusted key (or this node's own) and the
 * signature is its; -EKEYREJECTED otherwise (na may be NULL: rejected). */
int kc__blob_verify(const struct kc__sodium *na, const struct kc__keys *keys, const char *context,
                    uint64_t key_id, const void *msg, size_t n,
                    const unsigned char sig[KC__SIG_LEN]);

/* ---- the value layout (sign.c) ------------------------------------------ */

/*
 * A remote value, version 1, little-endian:
 *   0   4  magic "KCRV"
 *   4   2  layout version (1)
 *   6   2  flags: bit 0 signed
 *   8   8  key id of the signer (0 when unsigned)
 *   16  64 Ed25519 signature (zeros when unsigned)
 *   80  1  namespace length n (1..127)
 *   81  n  namespace
 *   ..  24 key: id.lo, id.hi, build (u64 each)
 *   ..  4  kind
 *   ..  4  record format (KC_FORMAT_VERSION)
 *   ..  8  created, ns since the epoch
 *   ..  8  saved_ns
 *   ..  8  body length L
 *   ..  L  body
 *   ..  16 checksum: XXH3-128 (lo, hi) of every byte before it
 * The signature covers "kcache-remote-v1" (16 bytes), bytes 0..16 (magic,
 * version, flags, key id), bytes 80 up to the body (namespace, key, kind,
 * format, times, length) and BLAKE2b-256 of the body.
 */
#define KC__RV_MAGIC 0x5652434bu /* "KCRV" */
#define KC__RV_VERSION 1
#define KC__RV_SIGNED 1u
#define KC__RV_FIXED 81 /* up to the namespace */
#define KC__RV_META 56  /* key, kind, format, created, saved, length */
#define KC__RV_SUM 16
#define KC__RV_OVERHEAD (KC__RV_FIXED + 127 + KC__RV_META + KC__RV_SUM)

struct kc__rv {
    char ns[128];
    kc_key key;
    uint32_t kind, format;
    uint64_t created_ns, saved_ns;
    const unsigned char *body; /* points into the value */
    size_t body_len;
    bool signed_;
    uint64_t key_id;
};

/* Encodes an entry into *out (malloc'd, *outlen bytes), signed with
 * keys->sk when keys has a secret (na needed then), unsigned otherwise.
 * 0, -EINVAL (namespace), -ENOMEM. */
int kc__rv_encode(const struct kc__sodium *na, const struct kc__keys *keys, const char *ns,
                  const kc_key *key, uint32_t kind, uint32_t format, uint64_t created_ns,
                  uint64_t saved_ns, const void *body, size_t len, unsigned char **out,
                  size_t *outlen);

/* Decodes and checks a value fetched for (ns, key): layout, checksum,
 * that it names (ns, key), and, unless keys->trust_any, that a trusted key
 * signed it. 0 with *rv pointing into v; -EBADMSG (damaged, another key's
 * entry, unknown layout version); -EKEYREJECTED (unsigned, unknown key id,
 * or a signature that does not verify). na may be NULL when
 * keys->trust_any. */
int kc__rv_decode(const struct kc__sodium *na, const struct kc__keys *keys, const void *v, size_t n,
                  const char *ns, const kc_key *key, struct kc__rv *rv);

/* ---- lock values (sign.c) ----------------------------------------------- */

/*
 * A cluster-wide lock's value: "<token> kcl1 <signer id, 16 hex digits>
 * <expiry, ms since the epoch> <Ed25519 signature, base64>", the signature
 * a blob's (kc__blob_sign) in context "kcache-lock-v1" over the lock key's
 * name, NUL, and the value up to the space before it. Bound to its key and to its expiry, a value
 * cannot be replayed under another lock nor after it expired; a waiter
 * waits only on a lock a trusted writer took.
 */
#define KC__LOCK_VALUE_MAX 400

/* Writes the value of lock `lock` held by `token` until expires_ms into
 * out (cap >= KC__LOCK_VALUE_MAX). 0, -EROFS (no secret key), -EINVAL
 * (too long), -EIO (signing failed). */
int kc__lock_value(const struct kc__sodium *na, const struct kc__keys *keys, const char *lock,
                   const char *token, uint64_t expires_ms, char *out, size_t cap);

/* Whether v (len bytes) is a value of lock `lock` a trusted key (this
 * node's included) signed and that has not expired at now_ms, nor expires
 * more than max_ms later: 0, or -EKEYREJECTED. With keys->trust_any the
 * signature is not checked (the layout and expiry are). */
int kc__lock_value_check(const struct kc__sodium *na, const struct kc__keys *keys, const char *lock,
                         const char *v, size_t len, uint64_t now_ms, uint64_t max_ms);

/* ---- routing (redis.c) -------------------------------------------------- */

/* The Redis Cluster slot of a key: CRC16-XMODEM of the key, or of its hash
 * tag (the bytes between the first '{' and the next '}', when not empty),
 * modulo 16384. */
unsigned kc__cluster_slot(const char *key, size_t len);

/* Weighted rendezvous hashing (highest random weight): the endpoint index
 * whose score weight / -ln(u) is highest, u a uniform (0,1) hash of the
 * endpoint's name and the key. */
int kc__rendezvous(const struct kc_remote_endpoint *ep, int n, const char *key, size_t len);

/* Natural logarithm of x in (0, 1] without libm. */
double kc__ln(double x);

/* ---- replies (redis.c) -------------------------------------------------- */

/* Bounds of one reply, checked by the reader's object functions before
 * anything is allocated: objects (elements of every array, nested ones
 * included), nesting, and bytes of strings (kc__rctx.reply_cap). */
#define KC__REPLY_MAX_ELEMENTS (1u << 20)
#define KC__REPLY_MAX_DEPTH 5

struct kc__reply_budget {
    size_t objects;
    size_t bytes_left;
    bool refused; /* a bound was hit: the reply failed because of it */
};

/* Frees a reply the module's connections returned (NULL-safe). Replies
 * are made by redis.c's reader functions, never by libhiredis': free them
 * with this, not freeReplyObject. */
void kc__reply_free(void *reply);

/* ---- servers and connections (redis.c) ---------------------------------- */

struct kc__node {
    struct kc_remote_endpoint ep;
    char addr[300];                 /* "host:port" or the socket path: its identity */
    void *conn;                     /* NULL: not connected */
    const struct kc__conn_ops *ops; /* its operations: plain or TLS (redis.c) */
    bool proven;                    /* the connection answered once: a later EOF is a
                                     * stale connection (server restarted, idle
                                     * timeout), retried once */
    bool off;                       /* failed: skipped until retry_at_ns */
    uint64_t retry_at_ns;           /* 0 with off: for the process */
    unsigned failures;
    bool writes_off;                /* refused writes (full, read-only replica) */
    uint64_t writes_retry_ns;       /* full (OOM): writes tried again from then (0: read-only
                                     * replica or user, off for the process) */
    unsigned full_refusals;         /* OOM replies in a row: the backoff's doubling */
    bool answered;                  /* it answered once in this process */
    struct kc__reply_budget budget; /* of the reply being read */
};

/* State shared by a remote's connections. */
struct kc__conn_ops;

struct kc__rctx {
    const struct kc__hiredis *hi;
    /* rediss:// servers: the TLS object and its client context, made at
     * activation (tier.c); NULL without a rediss:// server. */
    const struct kc_tls_api *tls;
    void *tls_ctx;
    struct kc_remote_counters *ctr;
    int retry_ms;     /* a failed node's and the breaker's first backoff
                       * (0: a node stays off; the breaker then uses 1 s) */
    size_t reply_cap; /* a reply larger than this drops the connection */
    bool *warned;     /* one failure warning per remote */
    /* The circuit breaker of the whole remote (every server). A hard
     * failure (down, refused, timed out, garbage) turns that server off
     * for its own backoff (its keys fail fast); in a cluster, whose nodes
     * the servers name (slot maps, redirections: endless new addresses),
     * the failure of a second node that never answered opens the breaker too (the first turns
     * off only its keys: one primary hung or dead in a failover, while the others serve), unless
     * it refused the connection (a soft failure: one dead primary turns off only its keys).
     * KC__SOFT_FAILURES
     * soft failures in a row (error replies, oversized values, large refused values, redirection
     * loops, such refusals) open it in both modes. Open, every operation fails fast (-ENETDOWN)
     * until open_until_ns, then one is let through (the probe). Each opening in a row doubles the
     * backoff, from retry_ms up to KC__BREAKER_MAX_MS; an operation that works closes it. */
    bool cluster; /* hard failures open the breaker */
    uint64_t open_until_ns;
    unsigned opens; /* in a row, since the last operation that worked */
    unsigned soft;  /* soft failures in a row */
    /* Nodes that never answered and failed hard since the breaker last
     * opened: the KC__STRANGERS-th opens it. */
    unsigned strangers;
    /* The current operation's deadline, over every hop (redirections,
     * slot map reads, connects): 0 for none. Bounds one operation to its
     * endpoint's connect plus operation timeout, whatever it is sent to. */
    uint64_t deadline_ns;
};

#define KC__SOFT_FAILURES 3
#define KC__STRANGERS 2
#define KC__BREAKER_MAX_MS 60000
/* A server that refused (reset, refused: a restart, most often) is asked
 * again after this, doubling with each refusal in a row. */
#define KC__REFUSED_FIRST_MS 50

/* Whether the breaker lets an operation through now. */
bool kc__breaker_closed(const struct kc__rctx *rc);

/* Opens the breaker for the next backoff (counted in breaker_opens). */
void kc__breaker_open(struct kc__rctx *rc);

/* A soft failure: the breaker opens at the KC__SOFT_FAILURES-th in a row. */
void kc__breaker_soft(struct kc__rctx *rc);

/* An operation worked: the breaker's backoff and soft count start over. */
void kc__breaker_ok(struct kc__rctx *rc);

/* A command: argc arguments. */
struct kc__cmd {
    int argc;
    const char *argv[8];
    size_t len[8];
};

/* Runs `n` commands pipelined on node `nd`, connecting first when needed
 * (connect timeout), all within its operation timeout. 0 with replies[i]
 * (free each with kc__reply_free; error replies are replies); on failure a
 * negative errno (-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EPROTO, -EIO,
 * -EMSGSIZE, -ENETDOWN when the node is off) and no replies. A failure
 * drops the connection, counts an error or a timeout and turns the node
 * off (not for -EMSGSIZE); a stale kept connection is retried once. */
int kc__node_exec(struct kc__rctx *rc, struct kc__node *nd, int n, const struct kc__cmd *cmds,
                  redisReply **replies);

/* Turns a node off after a failure it answered (a garbage reply, refused
 * authentication): counted as an error, one warning. */
void kc__node_fail(struct kc__rctx *rc, struct kc__node *nd, int err, const char *why);

/* Whether the node may be tried now (not off, or its retry time passed). */
bool kc__node_ready(struct kc__node *nd);

/* Closes its connection (after_fork: without a word; close: the same). */
void kc__node_drop(struct kc__rctx *rc, struct kc__node *nd);

/* Fills a command from NUL-terminated strings (argc <= 8). */
void kc__cmd_set(struct kc__cmd *c, int argc, ...);

/* ---- Redis Cluster (redis.c) -------------------------------------------- */

#define KC__SLOTS 16384
#define KC__SLOT_NONE 0xffff
#define KC__MAX_REDIRECTS 5
/* A slot whose owner is off: its map is read again at most this often (a
 * failover's promoted replica is found within it). */
#define KC__STALE_RETRY_MS 200

struct kc__cluster {
    struct kc__node **nodes; /* each malloc'd (stable): seeds first, then
                              * nodes the cluster named */
    int n_nodes, cap;
    int n_seeds;
    uint16_t *slot;          /* KC__SLOTS entries: index into nodes */
    bool loaded;             /* a CLUSTER SLOTS answer was applied */
    bool refresh;            /* the map changed under us: read it again */
    uint64_t stale_retry_ns; /* a slot's owner is off: the map is read
                              * again, every KC__STALE_RETRY_MS at most */
};

/* Reads CLUSTER SLOTS from the first node that answers (the hint first,
 * when not NULL) and replaces the map. 0, or the last failure. */
int kc__cluster_refresh(struct kc__rctx *rc, struct kc__cluster *cl, struct kc__node *hint);

/* Runs one single-key command (argv[1] the key, or the key given apart for
 * EVAL) on the key's slot owner, following MOVED (map updated and read
 * again) and ASK (ASKING first), at most KC__MAX_REDIRECTS times (a
 * MOVED back to the node that sent the last one waits a little first). As
 * kc__node_exec for one command; *from: the node that answered. A node
 * that fails is off and its keys fail fast (-ENETDOWN) until the map
 * names another owner. When it refused, or is off (every
 * KC__STALE_RETRY_MS at most), the map is read again at once from another
 * node and the command sent to the owner it names now (a failover's
 * promoted replica; only for the owner the map named, before any
 * redirection); after other failures, at the next operation. */
int kc__cluster_exec(struct kc__rctx *rc, struct kc__cluster *cl, const char *key, size_t keylen,
                     const struct kc__cmd *cmd, redisReply **reply, struct kc__node **from);

/* The node for "host:port", added when unknown; NULL on a bad address or
 * no memory. `like` gives the credentials and timeouts. */
struct kc__node *kc__cluster_node(struct kc__cluster *cl, const char *host, int port,
                                  const struct kc_remote_endpoint *like);

void kc__cluster_free(struct kc__rctx *rc, struct kc__cluster *cl);

#endif
