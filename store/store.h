/*
 * kcache artifact store: the one public header of libkcache-store.so.
 *
 * The store keeps compiled artifacts for many processes at once. It is a
 * chain of tiers (tier.h): the local files first (the spool, where every
 * write goes, and the hot files the owner keeps of drained entries), then
 * the RocksDB database, read through a secondary instance. One owner
 * process, started on demand, drains the spool into the database. See
 * ARCHITECTURE.md.
 *
 * Conventions: functions return 0 or a negative errno. Nothing here blocks
 * the caller for long: lock waits are bounded. Memory returned through a
 * `void **` is malloc'd (release it with free(), or the table's free).
 *
 * Two function tables: kc_store_api(), the data path (open, then get, put,
 * ... through its ops; and the database tier alone, which the preloaded
 * shim's front adds to its own chain), and kc_store_admin(),
 * administration (statistics, listing, verify, gc, clear, the owner),
 * which only the tool uses. The shim never
 * links this library; it dlopen()s it when its key filter cannot rule the
 * database out and reaches it through kc_store_api(), so the tables are the
 * ABI. Bump KC_STORE_ABI when they change.
 */
#ifndef KCACHE_STORE_H
#define KCACHE_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KC_STORE_ABI 3 /* 3: the bundle options' progress callbacks */

/* Version of the record layout. Part of every record header and of every
 * namespace fingerprint the shim builds, so a new layout never reads an old
 * one: an entry of another version is a miss. 2: every integer of every
 * layout little-endian, the NVRTC replay record, manifests and JIT records
 * included (1 wrote those three in the host's byte order). */
#define KC_FORMAT_VERSION 2

/* Default size limit, bytes (KCACHE_MAXSIZE). */
#define KC_DEFAULT_MAX_SIZE (5ull << 30)

/* kc_digest, an XXH3-128 digest. */
#include "../common/digest.h"

/* A kernel key, as the seed's KernelCacheKey: what the request is (`id`,
 * a digest of everything that decides the output) and which build of kcache
 * derived it (`build`). */
typedef struct kc_key {
    kc_digest id;
    uint64_t build;
} kc_key;

/* What a record holds. */
enum kc_kind {
    KC_KIND_NVRTC = 1,    /* a replayable NVRTC compile result */
    KC_KIND_JIT = 2,      /* a cubin produced by the driver's JIT */
    KC_KIND_MANIFEST = 3, /* the header files a compile read */
    KC_KIND_BLOB = 4,     /* anything else (tests) */
};

struct kc_store_options {
    const char *dir;   /* cache directory; created 0700 when missing */
    int readonly;      /* never write, never start the owner */
    uint64_t max_size; /* bytes; 0 means KC_DEFAULT_MAX_SIZE */
    const char *tool;  /* the kcache tool that runs the owner; NULL: locate it
                        * ($KCACHE_TOOL, beside this library, then $PATH) */
};

/* The header fields of one record, as the tool shows them. */
struct kc_record_info {
    uint32_t kind;      /* enum kc_kind */
    uint32_t format;    /* KC_FORMAT_VERSION it was written with */
    uint64_t body_size; /* uncompressed body bytes */
    uint64_t created;   /* unix time, seconds */
    uint64_t last_hit;  /* unix time, seconds; 0 = never hit */
    uint64_t hits;      /* hits folded in by the owner so far */
    uint64_t saved_ns;  /* compile time one hit saves */
    uint32_t prov;      /* where it came from: KC_PROV(enum kc_provenance, signer tag) */
};

/* An entry's provenance, recorded in its record header (the 32 bits a
 * record of an earlier kcache holds as 0: KC_PROV_UNKNOWN). The low 4
 * bits are the code; for KC_PROV_SIGNED the other 28 are the signer's
 * tag (store/remote: the low 28 bits of XXH3-128 of its public key), so a
 * key removed from the trusted file stops what it signed being served. */
enum kc_provenance {
    KC_PROV_UNKNOWN = 0,  /* stored before kcache recorded provenance */
    KC_PROV_LOCAL = 1,    /* compiled by a process of this store */
    KC_PROV_SIGNED = 2,   /* served by the remote, its signature verified */
    KC_PROV_UNSIGNED = 3, /* served by the remote unverified (KCACHE_REMOTE_TRUST=any) */
    KC_PROV_IMPORTED = 4, /* from a bundle (kcache import) */
    KC_PROV_MAX = 4
};
#define KC_PROV_CODE(o) ((uint32_t)(o)&0xfu)
#define KC_PROV_TAG(o) ((uint32_t)(o) >> 4)
#define KC_PROV(code, tag) ((uint32_t)(code) | ((uint32_t)(tag) << 4))

/* Per-backend counters a process adds to the store's statistics, declared
 * once: X(name, what) for each, in the order they are serialized (counter
 * logs in the spool and the metadata family, each a little-endian u64). A
 * new counter is one line here; serialized layouts grow with it, so adding
 * one bumps KC_FORMAT_VERSION. */
#define KC_COUNTERS(X)                                                                             \
    X(hits, "requests served from the cache")                                                      \
    X(misses, "requests compiled and stored")                                                      \
    X(passthrough, "requests that bypassed the cache (PCH, ...)")                                  \
    X(stores, "artifacts written")                                                                 \
    X(errors, "internal failures that fell back")                                                  \
    X(saved_ns, "compile time hits saved")                                                         \
    X(compile_ns, "compile time spent on misses")

/* Why a request passed through, counted apart (the KCACHE_STATS line,
 * `kcache stats`): one list for the shim and the tool. The store keeps each
 * count as the `passthrough` field of a pseudo-backend named
 * "pass:<backend>:<reason>" (KC_PASS_PREFIX). */
#define KC_PASS_REASONS(X)                                                                         \
    X(option, "an option kcache leaves to the library (it writes files, times the compile, PCH, "  \
              "NVRTC's cache trace, a NULL option)")                                               \
    X(input, "an input kcache does not take (an input type or size, a file it cannot read whole, " \
             "a NULL argument)")                                                                   \
    X(order, "a call a stored result cannot answer (a getter before completion, an add, a "        \
             "second completion or compile of one program)")                                       \
    X(writes, "the compile wrote files")                                                           \
    X(unkeyable,                                                                                   \
      "the compile read a file kcache cannot key (a device, a FIFO, a socket, a file of "          \
      "/proc or /sys that is not the CUDA runtime's own)")                                         \
    X(unknown_export, "the library exports an entry point kcache does not know")                   \
    X(refused, "the library refused an input; its answer is not kept")                             \
    X(internal, "kcache could not key or keep it (no memory, an identity it could not read)")

enum kc_pass_reason {
#define KC__PASS_ENUM(name, what) KC_PASS_##name,
    KC_PASS_REASONS(KC__PASS_ENUM)
#undef KC__PASS_ENUM
        KC_N_PASS_REASONS
};

#define KC_PASS_PREFIX "pass:"

/* A reason's name ("option", ...), or NULL past the list. */
static inline const char *kc_pass_reason_name(int r)
{
    static const char *const names[] = {
#define KC__PASS_NAME(name, what) #name,
        KC_PASS_REASONS(KC__PASS_NAME)
#undef KC__PASS_NAME
    };
    return r >= 0 && r < KC_N_PASS_REASONS ? names[r] : NULL;
}

struct kc_counters {
#define KC__COUNTER_FIELD(name, what) uint64_t name;
    KC_COUNTERS(KC__COUNTER_FIELD)
#undef KC__COUNTER_FIELD
};

/* How many counters there are, and their names in order. */
#define KC__COUNTER_ONE(name, what) +1
enum { KC_N_COUNTERS = 0 KC_COUNTERS(KC__COUNTER_ONE) };
#undef KC__COUNTER_ONE

/* Adds every counter of `b` to `a`. */
static inline void kc_counters_add(struct kc_counters *a, const struct kc_counters *b)
{
#define KC__COUNTER_ADD(name, what) a->name += b->name;
    KC_COUNTERS(KC__COUNTER_ADD)
#undef KC__COUNTER_ADD
}

/* The counters as an array, in KC_COUNTERS order, and back. */
static inline void kc_counters_to_array(const struct kc_counters *c, uint64_t v[KC_N_COUNTERS])
{
    int i = 0;
#define KC__COUNTER_GET(name, what) v[i++] = c->name;
    KC_COUNTERS(KC__COUNTER_GET)
#undef KC__COUNTER_GET
}

static inline void kc_counters_from_array(struct kc_counters *c, const uint64_t v[KC_N_COUNTERS])
{
    int i = 0;
#define KC__COUNTER_SET(name, what) c->name = v[i++];
    KC_COUNTERS(KC__COUNTER_SET)
#undef KC__COUNTER_SET
}

/* One entry as the administration's foreach reports it. Valid during the
 * callback. */
struct kc_entry {
    const char *ns;
    kc_key key;
    struct kc_record_info info;
    uint64_t stored_bytes; /* its share of the body as stored (compressed, deduplicated) */
    int pending;           /* still in the spool, not yet drained */
};

struct kc_ns_stats {
    char ns[128];
    uint64_t entries;
    uint64_t raw_bytes; /* sum of body sizes */
};

struct kc_backend_stats {
    char backend[32];
    struct kc_counters c;
};

struct kc_store_stats {
    size_t n_ns;
    struct kc_ns_stats *ns; /* array of n_ns */
    size_t n_backends;
    struct kc_backend_stats *backends;
    uint64_t entries;
    uint64_t raw_bytes;     /* sum of artifact body sizes */
    uint64_t unique_bytes;  /* body bytes after dedup */
    uint64_t disk_bytes;    /* everything under the cache directory */
    uint64_t spool_entries; /* written, not yet drained */
    uint64_t max_size;
    uint64_t reserved_bytes; /* of disk_bytes, reserved by files beyond their
                              * data: a running owner's write-ahead log,
                              * readers' logs; freed when they exit */
};

struct kc_verify_report {
    uint64_t checked;
    uint64_t bad;       /* records that failed their header or checksum */
    uint64_t purged;    /* of those, removed */
    uint64_t spool_bad; /* spool files that were unreadable, removed */
};

struct kc_gc_report {
    uint64_t evicted;
    uint64_t bytes_before;
    uint64_t bytes_after;
};

/* Progress callback for long operations: done of total (total 0 =
 * unknown). Called as the work goes (often: the caller decides when to
 * show it), and once at the end with the work done, done == total. */
typedef void (*kc_progress_fn)(uint64_t done, uint64_t total, void *arg);

/* A bundle's export or import runs in stages; each begins with a call of
 * this, naming what the stage counts ("bodies", "entries": export; "check",
 * "write": import), then calls kc_progress_fn for that stage alone. */
typedef void (*kc_progress_stage_fn)(const char *stage, void *arg);

/* ---- bundles (kcache export / import; store/db/bundle.c) ----------------
 * A bundle is one file holding entries as the store keeps them (put
 * records: header, body, source mapping), for another machine's store.
 * Layout: store/db/bundle.h. */

/* How a bundle's blocks are compressed (a block that does not shrink is
 * stored raw whatever was asked). */
enum kc_bundle_codec { KC_BUNDLE_RAW = 0, KC_BUNDLE_ZSTD = 1, KC_BUNDLE_LZ4 = 2 };

/* The cryptography of signed bundles, provided by the caller (the tool:
 * store/remote's Ed25519 keys through libsodium), so the store links no
 * crypto library. digest_*: a cryptographic digest (BLAKE2b-256) of a
 * byte stream; digest_begin starts one afresh (one left unfinished needs
 * no end). */
struct kc_bundle_crypto {
    void *ctx;
    uint64_t key_id; /* export: the signing key's id; 0: unsigned */
    void (*digest_begin)(void *ctx);
    void (*digest_add)(void *ctx, const void *p, size_t n);
    void (*digest_end)(void *ctx, unsigned char out[32]);
    /* Export: 0 with sig, or a negative errno. */
    int (*sign)(void *ctx, const void *msg, size_t n, unsigned char sig[64]);
    /* Import: whether key_id is a trusted key (1) or not (0). */
    int (*trusted)(void *ctx, uint64_t key_id);
    /* Import: 0 when sig is key_id's signature of msg; -EKEYREJECTED when it
     * is not; -ENOKEY when key_id is not trusted. */
    int (*verify)(void *ctx, uint64_t key_id, const void *msg, size_t n,
                  const unsigned char sig[64]);
};

struct kc_bundle_export_opts {
    int fd;                                /* written in order (a pipe will do) */
    const char *const *globs;              /* fnmatch(3) patterns namespaces must match */
    size_t n_globs;                        /* 0: every namespace */
    uint64_t since_ns;                     /* entries last used (hit, else created) at or
                                            * after this time (ns since the epoch); 0: all */
    uint64_t max_size;                     /* the bundle is at most this many bytes: the
                                            * most recently used entries that fit; 0: no cap */
    int codec;                             /* enum kc_bundle_codec */
    int level;                             /* the codec's level; 0: its default */
    const struct kc_bundle_crypto *crypto; /* NULL, or key_id 0: unsigned */
    /* Progress (NULL: none), with progress_arg: stage "bodies" (a whole
     * store's export: its bodies, first), then "entries" (of the
     * selected); a record counts once its bytes were written to fd (a
     * block's in proportion as they go), a stage's total once its last
     * byte was. */
    kc_progress_stage_fn progress_stage;
    kc_progress_fn progress;
    void *progress_arg;
};

struct kc_bundle_import_opts {
    int fd;                                /* the bundle; read twice when seekable and
                                            * private, else copied to a private file */
    int trust_unsigned;                    /* accept a bundle no trusted key signed */
    int dry_run;                           /* verify and count; write nothing */
    int header_only;                       /* header, and the trailer when seekable
                                            * (`kcache bundle show`); nothing verified */
    int only_usable;                       /* skip namespaces usable() says are not */
    const struct kc_bundle_crypto *crypto; /* NULL: no signature can verify */
    /* Whether this machine can use namespace ns: 1, 0, or -1 (unknown).
     * NULL: unknown for all. */
    int (*usable)(const char *ns, void *arg);
    void *usable_arg;
    /* Progress (NULL: none), with progress_arg, in bytes of the bundle
     * read (of its size; 0, unknown, for a pipe): stage "check" (read and
     * checked), then, unless a dry run, "write" (read again and applied). */
    kc_progress_stage_fn progress_stage;
    kc_progress_fn progress;
    void *progress_arg;
};

/* One namespace of a bundle. */
struct kc_bundle_ns {
    char ns[128];
    uint64_t entries, raw_bytes; /* in the bundle */
    uint64_t imported;           /* import: written to the store */
    uint64_t present;            /* import: already in the store, skipped */
    uint64_t skipped;            /* import: not usable here, skipped */
    int usable;                  /* usable()'s answer */
};

/* What a bundle holds, and what an export or import did. */
struct kc_bundle_info {
    uint32_t version; /* bundle layout */
    uint32_t format;  /* KC_FORMAT_VERSION of its records */
    uint64_t created_ns;
    uint64_t entries, raw_bytes; /* records, and their bytes uncompressed */
    uint64_t file_bytes;         /* the bundle's size */
    uint64_t blocks;
    uint64_t key_id; /* the signer's key id; 0: unsigned */
    int is_signed;
    int verified;     /* every check passed; signed: by a trusted key */
    int trailer_seen; /* header_only: the trailer was read */
    size_t n_ns;
    struct kc_bundle_ns *ns; /* malloc'd; release with free() */
    char why[320];           /* on failure: one line saying why */
};

struct kc_store;
struct kc_tier; /* tier.h */

/* The data path on an open store: the chain of tiers (local first, then
 * the database). One table, the same code in this library and in the
 * preloaded shim, whose front is such a chain. */
struct kc_store_ops {
    /* Flushes pending hit and counter logs (see flush) and releases
     * everything. NULL is a no-op. */
    void (*close)(struct kc_store *st);

    /* Looks up `key` in namespace `ns`. 0: hit, *body (malloc'd, caller
     * frees) and *len hold the body, *info (may be NULL) the header, and the
     * hit is noted for recency (no write per hit). -ENOENT: miss; a record
     * that fails its checksum is a miss and is purged. Other negative
     * values: the store could not be read (treat as a miss). */
    int (*get)(struct kc_store *st, const char *ns, const kc_key *key, void **body, size_t *len,
               struct kc_record_info *info);

    /* Stores `body` under `key` in `ns` and, when `source` is not NULL,
     * records `source` -> key in the namespace's sources map. `saved_ns` is
     * the compile time a hit will save. Returns 0 once the record is in the
     * spool, whole (renamed into place: no crash of any process loses or
     * tears it); the owner's synced batch makes it durable against an OS
     * crash when it drains it. -EROFS on a read-only store; other negative
     * errno on failure (the caller only loses the caching). */
    int (*put)(struct kc_store *st, const char *ns, const kc_key *key, const kc_digest *source,
               uint32_t kind, const void *body, size_t len, uint64_t saved_ns);

    /* The seed's take_by_source: the artifact another kernel finalized from
     * `source`. If that kernel's build is `build` it keeps its entry (a copy
     * is returned); if it is of an earlier build, the entry is moved: the
     * sources map and the old key are purged. 0 with *body, *len, *found
     * and (when not NULL) *info filled: the entry's header, whose saved_ns
     * the moved entry keeps; -ENOENT when none. */
    int (*take_by_source)(struct kc_store *st, const char *ns, const kc_digest *source,
                          uint64_t build, void **body, size_t *len, kc_key *found,
                          struct kc_record_info *info);

    /* Removes `key` from `ns` (a bad or stale entry). 0 or -ENOENT. */
    int (*purge)(struct kc_store *st, const char *ns, const kc_key *key);

    /* Adds `c` to the counters of `backend` ("nvrtc", "jit", ...). Kept in
     * memory; written by flush() and close(). */
    void (*count)(struct kc_store *st, const char *backend, const struct kc_counters *c);

    /* Writes the noted hits and counters to the spool. 0 or negative errno. */
    int (*flush)(struct kc_store *st);

    /* Releases handles a forked child must not use (RocksDB is not fork
     * safe). Called in the child; the store reopens lazily. */
    void (*after_fork_child)(struct kc_store *st);

    void (*free)(void *p);
};

/* The data path's entry points. */
struct kc_store_api {
    int abi; /* KC_STORE_ABI */

    /* Opens the store in opts->dir (copied): checks the directory (private,
     * ours; created 0700 unless read-only, with its spool) and chains the
     * local tier and the database tier. Reading is lazy: no RocksDB instance
     * is opened until a get needs the database. Fails with -ENOTDIR,
     * -EACCES, -EPERM (directory owned by someone else or writable by
     * group/others). On success *out is owned by the caller; use it through
     * ops, and release it with ops->close. */
    int (*open)(const struct kc_store_options *opts, struct kc_store **out);

    /* The operations on an open store. */
    const struct kc_store_ops *ops;

    /* Opens the database tier alone (tier.h: get, take_by_source) on
     * opts->dir, for a chain built elsewhere: the shim's front chains it
     * behind its own local tier. Checks nothing of the directory (the
     * chain's open did) and opens no RocksDB instance until a get needs
     * one. 0 with *out, released with (*out)->ops->close; or -ENOMEM. */
    int (*db_tier_open)(const struct kc_store_options *opts, struct kc_tier **out);
};

/* Administration: only the tool (and tests) use it. Operations may wait,
 * bounded, for the owner lock. Each takes a store from kc_store_api()'s
 * open. */
struct kc_store_admin {
    int abi; /* KC_STORE_ABI */

    /* Calls cb for every entry (drained and pending) of `ns`, or of all
     * namespaces when ns is NULL. A non-zero return from cb stops the walk
     * and is returned. cb must not call this store's functions (the walk
     * holds the reader). */
    int (*foreach)(struct kc_store *st, const char *ns,
                   int (*cb)(const struct kc_entry *e, void *arg), void *arg);

    /* Statistics. *out is allocated; release with stats_free(). */
    int (*stats)(struct kc_store *st, struct kc_store_stats **out);
    void (*stats_free)(struct kc_store_stats *s);

    /* Re-checks every record; with `repair`, purges the bad ones. */
    int (*verify)(struct kc_store *st, int repair, struct kc_verify_report *rep,
                  kc_progress_fn progress, void *arg);

    /* Evicts least-recently-hit entries until the store is at most
     * `max_size` bytes (0: the configured limit) and compacts. */
    int (*gc)(struct kc_store *st, uint64_t max_size, struct kc_gc_report *rep,
              kc_progress_fn progress, void *arg);

    /* Removes every entry. */
    int (*clear)(struct kc_store *st);

    /* Flushes this handle's logs, then becomes the owner long enough to
     * drain everything in the spool into the database: afterwards every put
     * acknowledged before the call is in the database and visible to a
     * fresh reader. Asks a running owner to exit and waits for its lock at
     * most `timeout_ms`. 0; -EBUSY when the lock stayed held; -EROFS on a
     * read-only store; other negative errno. For tests and `kcache`. */
    int (*drain)(struct kc_store *st, int timeout_ms);

    /* Runs the owner: holds the primary, drains the spool, folds hit logs,
     * evicts past the size limit, compacts; returns after `idle_ms` without
     * work, or -EBUSY at once if another owner holds the lock. */
    int (*owner_run)(const struct kc_store_options *opts, int idle_ms);

    /* Parses a record (header + body) as stored; 0 with *info filled and
     * *body pointing inside `rec`, or -EBADMSG. Exposed for the fuzzers. */
    int (*parse_record)(const void *rec, size_t len, struct kc_record_info *info, const void **body,
                        size_t *body_len);

    /* --- bundles --- */

    /* Writes a bundle of the selected entries of the database to opts->fd
     * (drain first to include the spool): header, blocks, trailer, in
     * constant memory (one block, and the largest entry). 0 with *info
     * filled (info->ns malloc'd, also on failure; free it); a negative
     * errno with info->why saying why. */
    int (*bundle_export)(struct kc_store *st, const struct kc_bundle_export_opts *opts,
                         struct kc_bundle_info *info);

    /* Reads a bundle: header, every block and record, the trailer (digest,
     * signature); nothing is written unless all of it verifies. Then,
     * unless opts->dry_run or st is NULL, imports every entry the store
     * lacks as the owner (write batches, as a drained put). 0 with *info;
     * a negative errno with info->why, one line: -EBADMSG (damaged,
     * truncated, not a bundle, an entry that does not match itself),
     * -EPROTO (a layout or record format this build does not read),
     * -EKEYREJECTED (unsigned, untrusted key, bad signature), -EFBIG (a
     * declared size past the limits), or the I/O or store error. */
    int (*bundle_import)(struct kc_store *st, const struct kc_bundle_import_opts *opts,
                         struct kc_bundle_info *info);
};

/* The data path's table. The shim finds this one symbol with dlsym(). */
const struct kc_store_api *kc_store_api(void);

/* The administration's table. */
const struct kc_store_admin *kc_store_admin(void);

#ifdef __cplusplus
}
#endif

#endif
