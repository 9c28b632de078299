/*
 * Internals of libkcache-store.so, shared by its source files and by the
 * store's white-box tests. Nothing here is part of the ABI (store.h is).
 *
 * On-disk layout of a cache directory DIR:
 *   DIR/db/          the RocksDB database; only the owner opens it read-write
 *   DIR/spool/       pending writes: p-<hash> puts, d-<hash> puts being
 *                    drained, x-* purge requests, h-* hit logs, c-* counter
 *                    logs, s-* stop requests, t-* temp files being written
 *   DIR/sec/         one RocksDB secondary directory per reading process
 *   DIR/owner.lock   flock()ed by the owner for as long as it runs
 *   DIR/gen          mmap()ed counters: u64 generation, bumped by the owner
 *                    after each durable drain, so readers know when to catch
 *                    up; u64 epoch, bumped when an owner session opens the
 *                    primary, so readers reopen their secondary
 */
#ifndef KCACHE_STORE_INTERNAL_H
#define KCACHE_STORE_INTERNAL_H

#include "store.h"

#include <pthread.h>
#include <rocksdb/c.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

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
};

void kc__hdr_encode(const struct kc__hdr *h, unsigned char out[KC__HDR_LEN]);
/* 0, or -EBADMSG when magic, version, length or the header checksum fail. */
int kc__hdr_decode(const void *buf, size_t len, struct kc__hdr *h);
void kc__hdr_to_info(const struct kc__hdr *h, struct kc_record_info *info);
uint64_t kc__body_xxh(const void *body, size_t len);
int kc__parse_record(const void *rec, size_t len, struct kc_record_info *info, const void **body,
                     size_t *body_len);

void kc__put_u16(unsigned char *p, uint16_t v);
void kc__put_u32(unsigned char *p, uint32_t v);
void kc__put_u64(unsigned char *p, uint64_t v);
uint16_t kc__get_u16(const unsigned char *p);
uint32_t kc__get_u32(const unsigned char *p);
uint64_t kc__get_u64(const unsigned char *p);
void kc__key_encode(const kc_key *k, unsigned char out[KC__KEY_LEN]);
void kc__key_decode(const unsigned char in[KC__KEY_LEN], kc_key *k);
void kc__digest_encode(const kc_digest *d, unsigned char out[16]);
void kc__digest_decode(const unsigned char in[16], kc_digest *d);
kc_digest kc__digest_of(const void *p, size_t len);

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

enum { KC__SP_PUT = 'P', KC__SP_PURGE = 'X', KC__SP_HITS = 'H', KC__SP_COUNT = 'C' };
enum { KC__PF_SOURCE = 1, KC__PF_KEY = 2, KC__PF_IFBAD = 4 };

/* A growable byte buffer. */
struct kc__buf {
    unsigned char *p;
    size_t len, cap;
    int err;
};
void kc__buf_add(struct kc__buf *b, const void *p, size_t n);
void kc__buf_free(struct kc__buf *b);

/* Starts a spool file of `type` in b (header placeholder). */
void kc__spool_begin(struct kc__buf *b, int type);
/* Fills in length and checksum. */
void kc__spool_end(struct kc__buf *b);
/* Checks a whole spool file; 0 with *type and the payload, or -EBADMSG. */
int kc__spool_check(const void *file, size_t len, int *type, const unsigned char **payload,
                    size_t *plen);

/* A decoded put. Pointers point into the file. */
struct kc__sp_put {
    char ns[KC__NS_MAX + 1];
    kc_key key;
    int has_source;
    kc_digest source;
    struct kc__hdr hdr;
    const unsigned char *record; /* header + body */
    size_t record_len;
    const unsigned char *body;
    size_t body_len;
};
int kc__spool_put_encode(struct kc__buf *b, const char *ns, const kc_key *key,
                         const kc_digest *source, const struct kc__hdr *h, const void *body,
                         size_t len);
/* Decodes and fully checks a put file (record checksums included). */
int kc__spool_put_decode(const void *file, size_t len, struct kc__sp_put *out);

/* One purge, hit or counter item, as iterated over a spool file's payload. */
struct kc__sp_item {
    char ns[KC__NS_MAX + 1]; /* namespace, or backend name for counters */
    uint32_t flags;
    kc_key key;
    kc_digest source;
    uint64_t a, b; /* purge: before_ns; hits: count, last_ns */
    struct kc_counters c;
};
void kc__spool_item_add(struct kc__buf *b, int type, const struct kc__sp_item *it);
/* Iterates items: 1 with *it filled, 0 at the end, -EBADMSG on bad bytes. */
int kc__spool_item_next(int type, const unsigned char **p, const unsigned char *end,
                        struct kc__sp_item *it);

/* ---- files (fs.c) ------------------------------------------------------ */

uint64_t kc__now_ns(void);
uint64_t kc__mono_ns(void);
/* Creates (0700) or checks a private directory: owned by us, not writable by
 * group or others. -EPERM, -ENOTDIR or another negative errno. */
int kc__private_dir(const char *path, bool create);
/* Writes `b` atomically as dir/name: temp file (O_EXCL|O_NOFOLLOW), optional
 * fsync, rename, optional directory fsync. */
int kc__spool_write(const char *dir, const char *name, const void *p, size_t len, bool durable);
/* Reads a regular file without following a symlink; *out malloc'd. -ENOENT
 * when it is not there. */
int kc__read_file(int dirfd, const char *path, size_t max, unsigned char **out, size_t *len);
int kc__rm_rf(const char *path);
uint64_t kc__du(const char *path);
void kc__hex(const void *p, size_t n, char *out);
uint64_t kc__rand64(void);
int kc__mkdir_p(const char *path, mode_t mode);

/* ---- RocksDB handles (db.c) --------------------------------------------- */

enum { KC__CF_DEFAULT, KC__CF_KERNELS, KC__CF_BODIES, KC__CF_SOURCES, KC__CF_META, KC__N_CF };

struct kc__db {
    rocksdb_t *db;
    rocksdb_column_family_handle_t *cf[KC__N_CF];
    rocksdb_options_t *opts[KC__N_CF + 1];
    rocksdb_cache_t *cache;
    rocksdb_readoptions_t *ro;
    rocksdb_writeoptions_t *wo;      /* not synced */
    rocksdb_writeoptions_t *wo_sync; /* synced */
    bool secondary;
};

/* Opens DIR/db as the primary (creating it) or as a secondary in `secpath`. */
int kc__db_open(struct kc__db *d, const char *dbpath, const char *secpath, char **why);
void kc__db_close(struct kc__db *d);
/* Flushes every column family's memtable to table files (waits). A
 * database closed with data only in its WAL makes every reader replay
 * that WAL when it opens, and keeps the data uncompressed. */
int kc__db_flush_all(struct kc__db *d);
/* Maps a RocksDB error string to an errno (and frees it). */
int kc__db_err(char *err, const char *what);
/* Reads a value: 0 with *val malloc'd, -ENOENT, or -EIO. */
int kc__db_get(struct kc__db *d, int cf, const void *k, size_t klen, char **val, size_t *vlen);

/* Looks up an entry in a db: 0 with body (malloc'd), -ENOENT, -EBADMSG
 * (present but fails its checks), -EIO. */
int kc__lookup(struct kc__db *d, const char *ns, const kc_key *key, void **body, size_t *len,
               struct kc__hdr *h);

/* ---- the owner (owner.c) ----------------------------------------------- */

struct kc__owner;
struct kc__paths {
    char dir[4096], db[4200], spool[4200], sec[4200], lock[4200], gen[4200];
};
void kc__paths_init(struct kc__paths *p, const char *dir);

/* Becomes the owner of `dir`: takes the lock (asking a running owner to stop
 * and waiting up to wait_ms), opens the primary, drains the spool. */
int kc__owner_begin(const char *dir, uint64_t max_size, int wait_ms, struct kc__owner **out);
void kc__owner_end(struct kc__owner *o);
int kc__owner_drain(struct kc__owner *o, uint64_t *n);
int kc__owner_verify(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg);
int kc__owner_gc(struct kc__owner *o, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg);
int kc__owner_clear(struct kc__owner *o);
int kc__owner_run(const struct kc_store_options *opts, int idle_ms);
/* The owner's primary, for white-box tests. */
struct kc__db *kc__owner_db(struct kc__owner *o);

/* Nonzero when some file other than temp files waits in the spool. */
bool kc__spool_pending(const char *spool);
/* Probes the owner lock; starts the owner when it is free (store.c). */
void kc__kick_owner(const char *dir, const char *tool, uint64_t max_size);

#endif
