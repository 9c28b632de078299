/*
 * The libc-only internals of the store: record and spool file layouts
 * (record.c), the LZ4 block decoder (lz4.c), the file helpers (fs.c), the
 * directory layout, spool and hot file reads (spool.c), starting the owner
 * (owner_start.c), the key filter (filter.c), a process's pending state
 * (pending.c), the local tier (local_tier.c) and the chain of tiers
 * (chain.h).
 * Compiled into libkcache-store.so and into the preloaded shim (its front
 * is the chain), which must not link RocksDB; so nothing here may need
 * RocksDB or anything above common/.
 *
 * On-disk layout of a cache directory DIR:
 *   DIR/db/          the RocksDB database; only the owner opens it read-write
 *   DIR/spool/       pending writes: p-<hash> puts, d-<hash> puts being
 *                    drained, x-* purge requests, h-* hit logs, c-* counter
 *                    logs (which may carry hits too: KC__SPI_HIT), s-* stop
 *                    requests, t-* temp files being written
 *   DIR/hot/<hash>   drained puts kept as files (the same put file format),
 *                    so a hit needs no RocksDB; written only by the owner,
 *                    bounded (hot_limit), oldest mtime evicted first
 *   DIR/filter       a blocked Bloom filter of every key in the database
 *                    (kernels and sources), written only by the owner, bits
 *                    only ever set in place; replaced (rename) on rebuild
 *   DIR/sec/         one RocksDB secondary directory per reading process
 *   DIR/locks/       single-flight lock files of the shim (shim/flight.c);
 *                    those nobody holds go at the end of each owner session
 *   DIR/owner.lock   flock()ed by the owner for as long as it runs
 *   DIR/gen          mmap()ed counters: u64 generation, bumped by the owner
 *                    after each durable drain, so readers know when to catch
 *                    up; u64 epoch, bumped when an owner session opens the
 *                    primary, so readers reopen their secondary
 *   DIR/why/         the shim's miss records, for `kcache why` (common/why.h)
 *   DIR/libraries    the libraries the shim last served, for `kcache config`
 *                    (common/served.h)
 * <hash> is kc__spool_name's: hex of XXH3-128(ns \0 key).
 */
#ifndef KCACHE_STORE_LOCAL_H
#define KCACHE_STORE_LOCAL_H

#include "../store.h"
#include "../../common/buf.h"
#include "../../common/clock.h"
#include "../../common/config.h"
#include "../../common/digest.h"

#include <dirent.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define KC_API __attribute__((visibility("default")))

/* ---- record format (record.c) ----------------------------------------- */

#define KC__RECORD_MAGIC 0x3152434bu /* "KCR1" */
#define KC__HDR_LEN 72
#define KC__KVAL_LEN (KC__HDR_LEN + 16) /* kernels value: header + body digest */
#define KC__NS_MAX 127
#define KC__KEY_LEN 24 /* id.lo, id.hi, build; little endian */

/* A record header, decoded. Times in nanoseconds since the epoch. */
struct kc__hdr {
    uint32_t kind;
    uint32_t format;
    uint64_t body_size;
    uint64_t created_ns;
    uint64_t last_hit_ns;
    uint64_t hits;
    uint64_t saved_ns;
    uint64_t body_xxh;
    uint32_t prov; /* KC_PROV(code, signer tag): store.h's enum kc_provenance */
};

void kc__hdr_encode(const struct kc__hdr *h, unsigned char out[KC__HDR_LEN]);
/* 0, or -EBADMSG when magic, version, length or the header checksum fail. */
int kc__hdr_decode(const void *buf, size_t len, struct kc__hdr *h);
void kc__hdr_to_info(const struct kc__hdr *h, struct kc_record_info *info);
uint64_t kc__body_xxh(const void *body, size_t len);
int kc__parse_record(const void *rec, size_t len, struct kc_record_info *info, const void **body,
                     size_t *body_len);

/* Every integer of these layouts is little-endian (common/buf.h). */
void kc__key_encode(const kc_key *k, unsigned char out[KC__KEY_LEN]);
void kc__key_decode(const unsigned char in[KC__KEY_LEN], kc_key *k);
void kc__digest_encode(const kc_digest *d, unsigned char out[16]);
void kc__digest_decode(const unsigned char in[16], kc_digest *d);
kc_digest kc_digest_of(const void *p, size_t len);

/* A namespace is 1..127 bytes with no NUL. */
bool kc__ns_ok(const char *ns);
/* kernels key: ns \0 key (24). Returns its length; buf holds 128+24. */
size_t kc__kkey(const char *ns, const kc_key *key, unsigned char *buf);
/* sources key: ns \0 digest (16). */
size_t kc__skey(const char *ns, const kc_digest *src, unsigned char *buf);
/* Splits a kernels key; 0 or -EBADMSG. */
int kc__kkey_split(const unsigned char *k, size_t len, char ns[KC__NS_MAX + 1], kc_key *key);

/* ---- spool files (record.c) -------------------------------------------- */

#define KC__SPOOL_MAGIC 0x3153434bu /* "KCS1" */
#define KC__SPOOL_HDR 24

enum {
    KC__SP_PUT = 'P',
    KC__SP_PACKED = 'Z',
    /* A bundle's entry (store/db/bundle.h): a put whose body is as the
     * database stores it (store/db/body.c). Never in the spool. */
    KC__SP_STORED = 'S',
    /* A bundle's entry whose body is a body record of the bundle (store/db/
     * bundle.h, layout 3): the put without its body. Never in the spool. */
    KC__SP_ENTRY = 'E',
    KC__SP_PURGE = 'X',
    KC__SP_HITS = 'H',
    KC__SP_COUNT = 'C'
};
enum { KC__PF_SOURCE = 1, KC__PF_KEY = 2, KC__PF_IFBAD = 4 };
/* A put file's flag (beside KC__PF_SOURCE): the entry came from the remote
 * tier (a fill-back), so the owner does not upload it again. */
enum { KC__PUT_FROM_REMOTE = 8 };
/* A put file's flag: the put carries its upload configuration, a
 * descriptor (store/remote: kc_remote_upload_descriptor) of the remote
 * settings of the process whose compile it is, secrets by reference (key
 * and password files by path) save a password written inline in
 * KCACHE_REMOTE. The owner uploads a put only with its descriptor, and a
 * put without one (a process without a remote) never. Only in the spool:
 * hot files, the database and bundles do not keep it. */
enum { KC__PUT_UPLOAD = 16 };
#define KC__UPLOAD_MAX 16384

/* Former names of common/buf.h's buffer and little-endian helpers, kept
 * only while pending.c, store/db/ and the store's tests move to the new
 * ones (other work in flight edits them); new code uses buf.h's names. */
#define kc__buf kc_buf
#define kc__buf_add kc_buf_add
#define kc__buf_free kc_buf_free
#define kc__put_u16 kc_le_put_u16
#define kc__put_u32 kc_le_put_u32
#define kc__put_u64 kc_le_put_u64
#define kc__get_u16 kc_le_get_u16
#define kc__get_u32 kc_le_get_u32
#define kc__get_u64 kc_le_get_u64

/* Starts a spool file of `type` at the end of b (header placeholder);
 * returns where it starts. */
size_t kc__spool_begin(struct kc_buf *b, int type);
/* Fills in length and checksum of the spool file starting at b's start
 * (kc__spool_end) or at `start`, running to b's end. The put encoders
 * below append a whole put file to b this way. */
void kc__spool_end(struct kc_buf *b);
void kc__spool_end_at(struct kc_buf *b, size_t start);
/* Checks a whole spool file; 0 with *type and the payload, or -EBADMSG. */
int kc__spool_check(const void *file, size_t len, int *type, const unsigned char **payload,
                    size_t *plen);

/* A decoded put. Pointers point into the file. */
struct kc__sp_put {
    char ns[KC__NS_MAX + 1];
    kc_key key;
    int has_source;
    int from_remote;    /* KC__PUT_FROM_REMOTE */
    const char *upload; /* KC__PUT_UPLOAD's descriptor (not NUL-terminated), or NULL */
    size_t upload_len;
    kc_digest source;
    struct kc__hdr hdr;
    const unsigned char *record; /* header + body */
    size_t record_len;
    const unsigned char *body;
    size_t body_len;
};
/* The put encoders append the put file to b. */
int kc__spool_put_encode(struct kc_buf *b, const char *ns, const kc_key *key,
                         const kc_digest *source, const struct kc__hdr *h, const void *body,
                         size_t len);
/* The same with put flags (KC__PUT_FROM_REMOTE; KC__PF_SOURCE follows
 * `source`). */
int kc__spool_put_encode_flags(struct kc_buf *b, const char *ns, const kc_key *key,
                               const kc_digest *source, const struct kc__hdr *h, const void *body,
                               size_t len, unsigned flags);
/* The same with the upload descriptor (KC__PUT_UPLOAD; none when NULL). */
int kc__spool_put_encode_upload(struct kc_buf *b, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h, const void *body,
                                size_t len, unsigned flags, const char *upload, size_t ulen);
/* Decodes and fully checks a put file (record checksums included). */
int kc__spool_put_decode(const void *file, size_t len, struct kc__sp_put *out);
/* A stored put ('S'): sp's put with `stored`, its body as the database
 * stores it (store/db/body.c), in place of the body; h is the plain
 * body's header (body_size, body_xxh). */
int kc__spool_put_encode_stored(struct kc_buf *b, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h,
                                const void *stored, size_t len);
/* An entry put ('E'): sp's put without a body; h is its body's header. */
int kc__spool_put_encode_entry(struct kc_buf *b, const char *ns, const kc_key *key,
                               const kc_digest *source, const struct kc__hdr *h);
/* Decodes an entry put: checksum, fixed part and header checked; no body
 * (out->body NULL, body_len 0). 0 or -EBADMSG. */
int kc__spool_put_decode_entry(const void *file, size_t len, struct kc__sp_put *out);
/* Decodes a stored put: the file's checksum, its fixed part and header are
 * checked; out->body and body_len are the stored bytes, which this layer
 * does not read (the caller inflates and checks them). 0 or -EBADMSG. */
int kc__spool_put_decode_stored(const void *file, size_t len, struct kc__sp_put *out);
/* A packed put ('Z', the owner's hot files): sp's put with `packed`, its
 * body as one LZ4 block, in place of the body (sp->hdr is the plain
 * body's: body_size, body_xxh). */
int kc__spool_put_pack(struct kc_buf *b, const struct kc__sp_put *sp, const void *packed,
                       size_t plen);
/* Decodes and fully checks a put file, plain or packed: a packed one in
 * *file (malloc'd) is replaced by the plain put it stands for (*file and
 * *len change; its spool checksum is not recomputed: keep it in memory)
 * and out points into that. 0, -EBADMSG (not a put, damaged, or not
 * unpacking to its header's body size and checksum) or -ENOMEM. */
int kc__put_decode_any(unsigned char **file, size_t *len, struct kc__sp_put *out);

/* A counter log's item that is a hit, not a backend's counters: ns is the
 * namespace, key the key, a the hits and b the last one's wall time, as a
 * hit log's item (a process's exit writes one log, its counters and hits
 * together). An owner older than this flag adds such an item as a
 * backend of zero counts. */
enum { KC__SPI_HIT = 1 };

/* One purge, hit or counter item, as iterated over a spool file's payload. */
struct kc__sp_item {
    char ns[KC__NS_MAX + 1]; /* namespace, or backend name for counters */
    uint32_t flags;
    kc_key key;
    kc_digest source;
    uint64_t a, b; /* purge: before_ns; hits: count, last_ns */
    struct kc_counters c;
};
void kc__spool_item_add(struct kc_buf *b, int type, const struct kc__sp_item *it);
/* Iterates items: 1 with *it filled, 0 at the end, -EBADMSG on bad bytes. */
int kc__spool_item_next(int type, const unsigned char **p, const unsigned char *end,
                        struct kc__sp_item *it);

/* ---- the LZ4 block decoder (lz4.c) ------------------------------------ */

/* Decodes one LZ4 block (lz4_Block_format.md) of n bytes at src into
 * exactly cap bytes at dst: 0, or -EBADMSG for any block that would read
 * or write out of bounds or decode to another size. libc only (the shim
 * serves packed hot files through it); the owner packs with liblz4. */
int kc__lz4_unpack(const void *src, size_t n, void *dst, size_t cap);

/* ---- files (fs.c) ------------------------------------------------------ */

/* Creates (0700) or checks a private directory: owned by us, not writable by
 * group or others. -EPERM, -ENOTDIR or another negative errno. The cache
 * directory itself may be reached through a symlink (kc__private_dir);
 * its subdirectories may not (kc__private_subdir: lstat, a symlink is
 * -ENOTDIR). */
int kc__private_dir(const char *path, bool create);
int kc__private_subdir(const char *path, bool create);
/* Writes all n bytes at p to fd, retrying on EINTR and short writes. 0 or
 * -errno (-EIO when write returns 0). */
int kc__write_full(int fd, const void *p, size_t n);
/* Writes `b` atomically as dir/name: temp file (O_EXCL|O_NOFOLLOW), optional
 * fsync, rename, optional directory fsync. */
int kc__spool_write(const char *dir, const char *name, const void *p, size_t len, bool durable);
/* Reads a regular file without following a symlink; *out malloc'd. -ENOENT
 * when it is not there. */
int kc__read_file(int dirfd, const char *path, size_t max, unsigned char **out, size_t *len);
int kc__rm_rf(const char *path);
/* Calls fn(path/<name>, arg) for every entry of the directory path but
 * . and .. (names too long for PATH_MAX are passed over). */
void kc__each_child(const char *path, void (*fn)(const char *sub, void *arg), void *arg);
/* Bytes allocated under path; *reserved: how many of them files reserved
 * beyond their data (fallocate with KEEP_SIZE). */
uint64_t kc__du(const char *path, uint64_t *reserved);
/* Reader directories (a RocksDB secondary's, named <prefix><pid>-...): a
 * reader holds its directory with kc__dir_hold (a shared flock on an fd it
 * keeps, -errno on failure) until it removes it; kc__dir_sweep removes
 * every directory under parent named <prefix><pid>-... whose process is
 * gone (no such pid here) and that nobody holds, so a process that exits
 * without closing its reader (or is killed) leaves nothing behind for
 * long, and a live reader in another pid namespace keeps its own. */
int kc__dir_hold(const char *path);
void kc__dir_sweep(const char *parent, const char *prefix);
/* Removes the single-flight lock files in dir/locks (shim/flight.c) that
 * nobody holds: each is removed while holding its flock (LOCK_EX|LOCK_NB),
 * and a locker checks after locking that the name still is its file (a
 * removed one is retried), so no lock is ever taken on a file nobody else
 * can find. Nothing when dir/locks is not a private directory of ours. */
void kc__locks_prune(const char *dir);
/* What a look at the spool found: the bytes of its regular files
 * (counted until past the `stop` given), how many of them are work the
 * owner is started for at once (puts, puts being drained, purge requests,
 * stop requests) and how many are logs (hits, counters). */
struct kc__spool_seen {
    uint64_t bytes, work, logs;
};
/* Looks at the spool (getdents into a buffer on the stack: no allocation,
 * and an fstatat per file). Nothing found when it cannot be read. */
void kc__spool_scan(const char *spool, uint64_t stop, struct kc__spool_seen *out);
/* Whether no process with the pid at the start of name runs (ESRCH). */
bool kc__pid_gone(const char *name);
void kc__hex(const void *p, size_t n, char *out);
uint64_t kc__rand64(void);
int kc__mkdir_p(const char *path, mode_t mode);

/* ---- NVRTC's bundled headers as trees of files (tree.c) --------------- */

/* DIR/bundled holds, for the NVRTC of identity <id> (32 hex digits), the
 * shim's map of what its install writes (<id>, shim/bundled.c), the store's
 * copy of an install (<id>.tree, private modes), and for each umask a host
 * filled a fresh DIR with, <id>.want.<umask> (empty) and up to
 * KC__READY_POOL ready copies the owner makes from the store's copy with
 * that host's modes (<id>.ready.<umask>.<tag>; <id>.prep.<umask>.<tag>
 * while made; NVRTC's modes: files 0666, directories 0755, less the umask).
 * A host claims one by renaming it to <id>.claim.<umask>.<tag>, checks
 * every file against the map (by its ctime where the tag carries the
 * owner's proof, kc__ready_tag), moves its entries into its DIR (never
 * over one there) and removes what is left. */
#define KC__BH_MARKER ".nvrtc_headers_version"
#define KC__BH_LOCK ".nvrtc_install.lock"
#define KC__READY_POOL 2
/* A stream of the directory fd's entries from its first (fd itself stays
 * open: the stream reads a duplicate); NULL with errno. */
DIR *kc__dir_read(int fd);
/* Whether name, at depth below the top of an install, is the version
 * marker or the install's lock (its own, not one of the headers). */
bool kc__bh_extra(int depth, const char *name);
/* Appends "/name" (or "name" at the top) to rel, which holds rl bytes: the
 * new length, or 0 when it would not fit (PATH_MAX, or a u16 length). */
size_t kc__rel_join(char *rel, size_t rl, const char *name);
/* Removes the directory parent/name with all below it (a directory of the
 * store's: a fill never removes anything from a host's DIR). */
void kc__tree_remove(int parent, const char *name);
/* Calls each(arg, dirfd, name, rel, pl, depth) for every entry of the
 * directory stream d but . and .., rel holding the entry's path below the
 * top (pl bytes; rl again after the call), until one returns non-zero;
 * closes d. 0, that return, -ENAMETOOLONG, or readdir's -errno. */
typedef int (*kc__tree_entry_fn)(void *arg, int dirfd, const char *name, char *rel, size_t pl,
                                 int depth);
int kc__tree_each(DIR *d, char *rel, size_t rl, int depth, kc__tree_entry_fn each, void *arg);
/* How a tree is copied (kc__tree_copy): files made mode fm, directories dm
 * (less the umask, or exactly), each file a reflink while `clone` (cleared
 * once the filesystem refuses one), else its bytes. The top's install lock
 * is never copied. */
struct kc__tree_copy {
    mode_t fm, dm;
    bool exact; /* fm and dm as they are (fchmod), not less the umask */
    bool fill;  /* into a host's DIR: the top's version marker is not copied
                   either (the fill writes it last, kc__bh_marker_put) */
    bool clone;
    /* For each file but the top's marker and lock, its path below the top
     * and its digest, before the file is made: false fails the copy
     * (-EBADMSG) and the file is not made; NULL: none. n counts the files
     * it passed. */
    bool (*check)(void *arg, const char *rel, const kc_digest *d);
    void *arg;
    uint32_t n;
};
/* Copies the tree below sdir into ddir (both taken: closed here), making
 * every file and directory (O_EXCL, mkdirat: nothing in ddir is replaced;
 * one there already fails the copy, -EEXIST). 0 or a negative errno
 * (-EINVAL: something neither a file nor a directory). */
int kc__tree_copy(int sdir, int ddir, struct kc__tree_copy *c);
/* Writes the version marker of sdir into ddir as NVRTC's install makes it
 * (0666 less the umask), its install time now; never over one there
 * (-EEXIST). 0 or a negative errno (-ENOENT: sdir has none). */
int kc__bh_marker_put(int sdir, int ddir);
/* DIR/bundled, checked private (made when `create`): an fd, or -errno. */
int kc__bundled_dir(const char *store, bool create);
/* "<hex>.<kind>.<umask>[.<tag>]" (tag NULL: none; "" ends in the dot). */
void kc__ready_name(char *out, size_t n, const char *hex, const char *kind, mode_t mask,
                    const char *tag);
/* Asks the owner for ready copies of <hex>'s install for umask `mask`. */
void kc__ready_want(int bdir, const char *hex, mode_t mask);
/* Claims a ready copy for mask: the claimed directory's fd, its name in
 * claim; -ENOENT when there is none. *since: the proof its name carries
 * (kc__ready_tag), {0, 0} when it has none. */
int kc__ready_claim(int bdir, const char *hex, mode_t mask, char *claim, size_t cn,
                    struct timespec *since);
/* A ready copy's tag: "<pid>.<16 hex>", and where since is not NULL, the
 * owner's proof ".t<sec>_<nsec>": every file and directory of the copy was
 * checked against the map before the coarse realtime clock read `since`,
 * on a local filesystem with nanosecond times (kc__local_fs). out holds
 * KC__READY_TAG bytes. */
#define KC__READY_TAG 64
void kc__ready_tag(char *out, const struct timespec *since);
/* The proof at the end of a ready or claim name: false when it has none. */
bool kc__ready_proof(const char *name, struct timespec *since);

/* ---- the map of an install's files (bhmap.c) -------------------------- */

/* DIR/bundled/<id>: the magic, the NVRTC identity, the number of files,
 * each file's path length (u16), path and digest, then XXH3-128 of all
 * before. Made by the shim (shim/bundled.c), read by it and the owner. */
extern const char kc__bh_map_magic[8];
#define KC__BH_MAP_MAX_FILES (1u << 20)
#define KC__BH_MAP_MAX_BYTES (64u << 20)
struct kc__bh_slot {
    uint64_t h;
    const char *path; /* NULL: empty */
    kc_digest d;
};
struct kc__pristine {
    kc_digest id;
    uint32_t n;
    size_t mask;
    struct kc__bh_slot *slot;
    char *paths; /* the slots' paths */
    struct kc__pristine *next;
};
/* Whether the map lists rel, its digest in *out. */
bool kc__pristine_find(const struct kc__pristine *m, const char *rel, kc_digest *out);
/* Whether map m (arg) lists rel with digest d: kc__tree_copy's check. */
bool kc__bh_map_check(void *m, const char *rel, const kc_digest *d);
/* The map of bytes[0, len) for identity id, every check passed, or NULL. */
struct kc__pristine *kc__bh_map_decode(const unsigned char *b, size_t len, const kc_digest *id);
void kc__bh_map_free(struct kc__pristine *m);
/* DIR/bundled of the store and the map's name in it. */
int kc__bh_map_path(const char *store, const kc_digest *id, char *dir, size_t dl, char name[33]);
/* The store's map of id: 0 with *m; -ENOENT when there is none; -EBADMSG
 * when there is one that fails a check (not ours, readable or writable by
 * others, not a regular file, corrupt, another identity's). */
int kc__bh_map_load(const char *store, const kc_digest *id, struct kc__pristine **m);
/* Whether the filesystem of fd is local and keeps nanosecond times from
 * this machine's clock (ext2/3/4, XFS, Btrfs, tmpfs, overlayfs, F2FS). */
bool kc__local_fs(int fd);

/* ---- the directory (spool.c) ------------------------------------------ */

/* The paths of DIR's parts, each NUL-terminated in buf one after the
 * other (DIR cut at 4095 bytes, each other at 4199, as fixed arrays were):
 * a process touches the one page they take, not eight (each a page fault
 * on the first hit of a fresh process). kc__paths_init sets the pointers
 * into the struct's own buf: never copy one. */
struct kc__paths {
    char *dir, *db, *spool, *sec, *lock, *gen, *hot, *filter;
    char buf[4096 + 7 * 4200];
};
void kc__paths_init(struct kc__paths *p, const char *dir);

/* DIR/hot's bound: min(max_size / 4, KC__HOT_MAX, max(the size of the
 * database's tables (.sst) / 4, KC__HOT_MIN)) (store/db/hot.c), counted
 * in blocks on disk: the store stays within ~1.25x its tables' size. Past
 * it the least recently hit hot files are packed (LZ4), then removed
 * (kc__hot_enforce). The floor is room for a small working set: the
 * demo set's records and manifests take 464 KiB plain. */
#define KC__HOT_MAX (1ull << 30)
#define KC__HOT_MIN (512ull << 10)

/* The file name of (ns, key) in the spool: prefix '-' 32 hex digits; with
 * prefix 0, the bare 32 hex digits (its name in DIR/hot). */
void kc__spool_name(const char *ns, const kc_key *key, char prefix, char out[40]);

/* Nonzero when some file other than temp files waits in the spool. */
bool kc__spool_pending(const char *spool);

/* Reads and checks DIR/hot/<hash> (or a spool put file), plain or packed,
 * for (ns, key): 0 with *buf (malloc'd: the file, or the plain form of a
 * packed one) and *sp pointing into it; -ENOENT when absent; -EBADMSG when
 * it exists but fails its checks or holds another key. */
int kc__put_file_read(const char *path, const char *ns, const kc_key *key, unsigned char **buf,
                      struct kc__sp_put *sp);
/* The same for the hot file `name` in directory `hot`, whatever its key:
 * -EBADMSG also when it holds a key its name is not the hash of. */
int kc__hot_file_read(const char *hot, const char *name, unsigned char **buf,
                      struct kc__sp_put *sp);

/* ---- starting the owner (owner_start.c) ------------------------------- */

/* The absolute path of the loaded object (shared library) holding addr:
 * the loader's name for it when absolute, else the kernel's view of the
 * mapping (/proc/self/maps), never resolved against the working directory.
 * 0, or -ENOENT (unknown, or the file was deleted since), -ENAMETOOLONG, or
 * the error reading /proc. */
int kc__object_path(const void *addr, char *buf, size_t len);

/* Starting the owner: the kcache tool, spawned detached (with fds 0-2 on
 * /dev/null, no other fd, in /) when nobody holds DIR/owner.lock; never
 * waited for. */
struct kc__kicker {
    pid_t spawned;
    uint64_t last_kick_ns;
    bool warned;
    char *tool;
};
/* The kcache tool's absolute path (malloc'd), or NULL when none is found
 * safely: `given`, else $KCACHE_TOOL (each an absolute path, or a bare name
 * looked up on $PATH's absolute entries; a relative path is refused), else
 * beside `lib` (the absolute path of the calling library, or NULL: in
 * ../tools, ../bin, ../../bin of its real directory), else "kcache" on
 * $PATH's absolute entries. Never the working directory, and NULL in a
 * secure-execution process. */
char *kc__find_tool(const char *given, const char *lib);
void kc__kicker_init(struct kc__kicker *k, char *tool);
/* Starts the owner unless one holds the lock (at most every 200 ms). The
 * caller serialises calls. */
void kc__kicker_kick(struct kc__kicker *k, const struct kc__paths *p, uint64_t max_size);
/* Reaps the short-lived process the last spawn started, waiting at most
 * wait_ms. */
void kc__kicker_reap(struct kc__kicker *k, int wait_ms);
/* In a forked child: forget the parent's lock fd and child. */
void kc__kicker_after_fork(struct kc__kicker *k);
void kc__kicker_free(struct kc__kicker *k);

/* ---- this process's pending state (pending.c) ------------------------- */

/* What a process using the store (the chain, chain.h) keeps in memory until
 * it writes it to the spool: hits it served, counters, tombstones of keys
 * and sources it purged or moved (not served again until it puts them
 * again), and the source -> key of its own puts. Its hit and counter logs
 * are written through the local tier (chain.h). Every function is
 * thread-safe (mu). */
struct kc__local;
struct kc__pment;
struct kc__pmap {
    struct kc__pment *e;
    size_t cap, n, dead;
};
struct kc__counter {
    char name[32];
    struct kc_counters c;
};
struct kc__pending {
    pthread_mutex_t mu; /* guards everything below but the constants */
    struct kc__local *log;
    bool readonly;
    struct kc__pmap m; /* hits, tombstones, sources */
    size_t n_hits, n_tombs;
    char **nss;
    size_t n_nss;
    struct kc__counter *ctr;
    size_t n_ctr;
};
/* `log` (which must outlive pd) writes the hit and counter logs. */
void kc__pending_init(struct kc__pending *pd, struct kc__local *log, bool readonly);
/* Frees it; writes nothing: flush first. */
void kc__pending_free(struct kc__pending *pd);
/* In a forked child: hits and counters so far are the parent's to report. */
void kc__pending_after_fork_child(struct kc__pending *pd);
/* Notes a hit served (nothing when read-only); written at flush, or when
 * many are noted. */
void kc__pending_hit(struct kc__pending *pd, const char *ns, const kc_key *key);
/* Adds to a backend's counters (names of 32 bytes or more are dropped). */
void kc__pending_count(struct kc__pending *pd, const char *backend, const struct kc_counters *c);
/* Writes the counters and the noted hits as one counter log (hits alone:
 * a hit log; read-only: drops them), then kc__local_kick_logs. 0 or
 * negative errno. */
int kc__pending_flush(struct kc__pending *pd);
/* After a put of key (and source, may be NULL): what this process just
 * wrote wins over what it purged before (their tombstones are lifted), and
 * source -> key is noted. */
void kc__pending_note_put(struct kc__pending *pd, const char *ns, const kc_key *key,
                          const kc_digest *source);
/* Tombstones key and/or src (either may be NULL). */
void kc__pending_tombstone(struct kc__pending *pd, const char *ns, const kc_key *key,
                           const kc_digest *src);
/* Whether key is tombstoned. */
bool kc__pending_dead(struct kc__pending *pd, const char *ns, const kc_key *key);
/* This process's own put of src: 0 with *found, -ESRCH when src is
 * tombstoned, -ENOENT when unknown here. */
int kc__pending_source(struct kc__pending *pd, const char *ns, const kc_digest *src, kc_key *found);
/* Forgets the put of src noted here; ns NULL: every one. */
void kc__pending_forget_source(struct kc__pending *pd, const char *ns, const kc_digest *src);
/* Looks (ns, key) up in the spool (p-, d- put files) and DIR/hot: 0 with the
 * body (malloc'd) and header; -ENOENT; -EBADMSG when only a hot file that
 * fails its checks was found; -ENOMEM. The local tier's get (local_tier.c). */
int kc__files_lookup(const struct kc__paths *p, const char *ns, const kc_key *key, void **body,
                     size_t *len, struct kc__hdr *h);

/* ---- the key filter (filter.c) ----------------------------------------- */

enum { KC__FK_KERNEL = 'K', KC__FK_SOURCE = 'S' };
/* The stamp of a filter an owner is updating (any other value: the
 * database generation it was last synced with). */
#define KC__FILTER_LIVE (~0ull)

/* Hash of one filter item: a kernel (ns, key) or a source (ns, digest). */
struct kc__fhash {
    uint64_t a, b;
};
struct kc__fhash kc__fhash_kernel(const char *ns, const kc_key *key);
struct kc__fhash kc__fhash_source(const char *ns, const kc_digest *src);

/* A read-only mapping of DIR/filter. */
struct kc__filter_ro {
    const unsigned char *map;
    size_t len;
    dev_t dev;
    ino_t ino;
};
/* 1: maybe present (also when there is no usable filter); 0: definitely
 * absent. Maps the file on first use; on an "absent" answer checks that
 * the mapped file is still DIR/filter and remaps and asks again if not.
 * The caller serialises calls on one mapping. */
int kc__filter_maybe(struct kc__filter_ro *f, const char *path, struct kc__fhash h);
void kc__filter_ro_drop(struct kc__filter_ro *f);

/* The owner's writable filter. */
struct kc__filter_rw {
    unsigned char *map;
    size_t len;
    uint64_t cap; /* items it was sized for */
};
/* Opens DIR/filter read-write; 0, or -ENOENT/-EBADMSG when it is missing
 * or unusable (rebuild it). *stamp: the database generation it matches. */
int kc__filter_open_rw(struct kc__filter_rw *f, const char *path, uint64_t *stamp);
/* Creates a new empty filter for `cap` items at path.tmp; publish it with
 * kc__filter_publish once filled. */
int kc__filter_create(struct kc__filter_rw *f, const char *path, uint64_t cap);
int kc__filter_publish(struct kc__filter_rw *f, const char *path);
void kc__filter_add(struct kc__filter_rw *f, struct kc__fhash h);
void kc__filter_note_delete(struct kc__filter_rw *f);
void kc__filter_set_stamp(struct kc__filter_rw *f, uint64_t stamp);
/* Whether it should be rebuilt: fuller than its capacity, or too many
 * deletions since it was built. */
bool kc__filter_stale(const struct kc__filter_rw *f);
uint64_t kc__filter_count(const struct kc__filter_rw *f);
void kc__filter_close(struct kc__filter_rw *f);

#endif
