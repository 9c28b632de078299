/*
 * meta.h: the byte layout of the database (DIR/db), in one place. Every
 * number is little-endian; a u64 is 8 bytes. Only the owner writes the
 * database; readers (store.c, db.c's kc__lookup) only read it.
 *
 * Column families (enum in db.h):
 *
 *   kernels   key    ns \0 key: the namespace (1..127 bytes, no NUL), a
 *                    NUL, the key (24: id.lo, id.hi, build; u64 each).
 *                    kc__kkey and kc__kkey_split (store/local/record.c:
 *                    the spool and the filter hash the same bytes).
 *             value  the record header (KC__HDR_LEN = 72, kc__hdr_encode)
 *                    then the body's digest (16, kc__digest_encode of
 *                    kc_digest_of of the body as stored, below; for a
 *                    body an earlier version stored, of the body itself):
 *                    KC__KVAL_LEN bytes. kc__kval_*.
 *             Written by put.c (a put: the whole value; a hit: the
 *             header's hits and last hit); deleted by refcount.c's
 *             kc__kernel_delete (purges, eviction) and by verify.c
 *             (repair) and admin.c (clear). Read by db.c's kc__lookup
 *             (every get, readers' and the owner's), put.c, drain.c,
 *             evict.c, verify.c, filter_sync.c (keys) and store.c (ls,
 *             stats, verify).
 *
 *   bodies    key    the digest of the value (16): the same body stored
 *                    the same way is stored once. A bundle's entry is
 *                    checked against it without inflating its body.
 *             value  the body as stored (body.c, KC__BODY_*): u32 magic
 *                    KC__BODY_MAGIC (bytes ff 'K' 'B' '1'), u8 codec
 *                    (KC__BODY_RAW, KC__BODY_ZSTD, KC__BODY_ZSTD_DICT),
 *                    u8 0, u16 0, u64 the body's size, [with a dictionary:
 *                    u64 its id ("z/" below)], then the body: as it is, or
 *                    one zstd frame (level KC__BODY_LEVEL) stating that
 *                    size. A
 *                    value without the magic is a body an earlier version
 *                    stored as it is (RocksDB compressed those): read as
 *                    such, and checked against its header as every body.
 *                    RocksDB does not compress this family (db.c), so a
 *                    bundle carries these bytes as they are.
 *             Written by put.c (when missing or failing its checksum);
 *             deleted by refcount.c with its last reference, by
 *             verify.c (repair: bodies nothing names) and admin.c
 *             (clear). Read by db.c's kc__lookup, put.c and verify.c.
 *
 *   sources   key    ns \0 source digest: the namespace, a NUL, the
 *                    digest of the source the kernel was compiled from
 *                    (16). kc__skey (record.c), kc__skey_split (here).
 *             value  the kernel's key (24, kc__key_encode).
 *             Written by put.c (a put with a source); deleted by
 *             drain.c (a purge), evict.c (kc__prune_sources: no kernel
 *             left) and admin.c (clear). Read by store.c (take_by_source),
 *             drain.c, evict.c and filter_sync.c (keys).
 *
 *   meta      four kinds of keys, told apart by their first bytes:
 *
 *     "g"             (1 byte)  value: u64, the generation: the sequence
 *                     number of the owner's last commit (8 bytes).
 *                     Written by batch.c's kc__owner_commit with every
 *                     commit; read by owner.c when a session begins and by
 *                     recover.c after a repair, to continue the sequence
 *                     (kc__db_gen_get); DIR/filter's stamp is compared
 *                     with it (filter_sync.c).
 *     "r/" digest     (2 + 16)  value: u64 refcount (how many kernels
 *                     entries name the body), u64 body size (16 bytes).
 *                     Written by refcount.c (kc__ref_put: put.c's puts,
 *                     kc__ref_drop, verify.c's repair), deleted
 *                     with the body when the count reaches 0. Read by
 *                     refcount.c (kc__ref_get; kc__count_unique sums the
 *                     sizes: the bytes the size limit counts) and store.c
 *                     (stats: unique bytes; ls: an entry's share of its
 *                     body).
 *     "b/" backend    (2 + 1..127) value: KC_N_COUNTERS u64, in
 *                     KC_COUNTERS order (store.h; 8 * KC_N_COUNTERS bytes).
 *                     A backend's counters ("nvrtc", "jit"), as counter
 *                     logs added them up. Written by counters.c (read, added
 *                     to, written back); read by store.c (stats: backends
 *                     named in under 32 bytes); clear keeps them.
 *     "c/" name       (2 + 1..255) value: u64, the wall time (ns) it was
 *                     written. The counter log `name` of the spool is in
 *                     the "b/" counters: written by counters.c in the batch
 *                     that adds the log up, before the log is unlinked, and
 *                     deleted a minute later (drain.c), so that a reader
 *                     (store.c's stats: the spool's logs listed first, then
 *                     the database) and an owner that takes over from a
 *                     killed one count each log once.
 *     "n/" ns         (2 + 1..127) value: empty. The namespace has had an
 *                     entry. Written by put.c with every put; nothing
 *                     reads it yet; clear removes it.
 *     "z/" id         (2 + 8) value: a zstd dictionary (at most
 *                     KC__DICT_BYTES), id its kc__dict_id (XXH3-64 of
 *                     its bytes). Trained by the owner (dict.c) on the
 *                     bodies it drains; bodies compressed with it name it
 *                     (KC__BODY_ZSTD_DICT). Never deleted but by clear (a
 *                     few per GiB of bodies). Read by every reader that
 *                     inflates such a body (db.c), exported in a bundle's
 *                     header and imported from it.
 *     "zc"            (2) value: u64, the id of the dictionary the owner
 *                     compresses new bodies with.
 *
 *   default   unused (RocksDB requires it).
 *
 * A key or value of another length is not one of these: readers skip it
 * (or, in the kernels family, count it bad).
 */
#ifndef KCACHE_STORE_META_H
#define KCACHE_STORE_META_H

#include "../local/chain.h"

/* ---- the meta family -------------------------------------------------- */

#define KC__META_GEN_KEY "g"
#define KC__META_GEN_VAL_LEN 8
#define KC__META_REF_PREFIX "r/"
#define KC__META_REF_KEY_LEN (2 + 16)
#define KC__META_REF_VAL_LEN 16
#define KC__META_COUNTERS_PREFIX "b/"
#define KC__META_COUNTERS_VAL_LEN (8 * KC_N_COUNTERS)
#define KC__META_NS_PREFIX "n/"
#define KC__META_APPLIED_PREFIX "c/"
#define KC__META_APPLIED_KEY_MAX (2 + 255)
/* How long an applied counter log's mark is kept (ns). */
#define KC__META_APPLIED_KEEP_NS (60ull * 1000000000ull)
/* Room for a counters or namespace key. */
#define KC__META_NAME_KEY_MAX (2 + KC__NS_MAX)

/* Whether the key k (kl bytes) starts with prefix (a KC__META_*_PREFIX). */
bool kc__meta_is(const void *k, size_t kl, const char *prefix);

/* The refcount key of a body digest; returns its length (18). */
size_t kc__meta_ref_key(const unsigned char digest[16], unsigned char out[KC__META_REF_KEY_LEN]);
void kc__meta_ref_value(uint64_t refs, uint64_t size, unsigned char out[KC__META_REF_VAL_LEN]);
/* Decodes a refcount value: 0 with *refs and *size (either may be NULL),
 * or -EBADMSG (not 16 bytes; the outputs are left alone). */
int kc__meta_ref_parse(const void *v, size_t vl, uint64_t *refs, uint64_t *size);

/* The counters key of a backend (1..127 bytes); returns its length. */
size_t kc__meta_counters_key(const char *backend, unsigned char out[KC__META_NAME_KEY_MAX]);
/* The backend named by a counters key, NUL-terminated in name (cap bytes):
 * 0, or -EBADMSG when k is not a counters key, names nothing or does not
 * fit. */
int kc__meta_counters_name(const void *k, size_t kl, char *name, size_t cap);
void kc__meta_counters_value(const uint64_t c[KC_N_COUNTERS],
                             unsigned char out[KC__META_COUNTERS_VAL_LEN]);
/* Decodes a counters value: 0 with c filled, or -EBADMSG (another length;
 * c is left alone). */
int kc__meta_counters_parse(const void *v, size_t vl, uint64_t c[KC_N_COUNTERS]);

/* The mark of spool counter log `name` (1..255 bytes); returns its length. */
size_t kc__meta_applied_key(const char *name, unsigned char out[KC__META_APPLIED_KEY_MAX]);

/* The namespace key of ns (1..127 bytes); returns its length. */
size_t kc__meta_ns_key(const char *ns, unsigned char out[KC__META_NAME_KEY_MAX]);

void kc__meta_gen_value(uint64_t gen, unsigned char out[KC__META_GEN_VAL_LEN]);

/* ---- dictionaries (meta family) ---------------------------------------- */

/* "z/" id: a dictionary's bytes; "zc": the id of the one the owner
 * compresses new bodies with (u64). */
#define KC__META_DICT_PREFIX "z/"
#define KC__META_DICT_KEY_LEN (2 + 8)
#define KC__META_DICT_CURRENT "zc"
size_t kc__meta_dict_key(uint64_t id, unsigned char out[KC__META_DICT_KEY_LEN]);

/* ---- the kernels and sources families ----------------------------------- */

/* A kernels value: the header h, then the body digest. */
void kc__kval_encode(const struct kc__hdr *h, const unsigned char digest[16],
                     unsigned char out[KC__KVAL_LEN]);
/* Decodes a kernels value's header: 0, or -EBADMSG (not KC__KVAL_LEN bytes,
 * or the header fails its checks). */
int kc__kval_decode(const void *v, size_t vl, struct kc__hdr *h);
/* The body digest in a kernels value (pointing into v), or NULL when v is
 * not KC__KVAL_LEN bytes. The header is not checked. */
const unsigned char *kc__kval_digest(const void *v, size_t vl);

/* Splits a sources key: 0 with ns and *src, or -EBADMSG. */
int kc__skey_split(const void *k, size_t kl, char ns[KC__NS_MAX + 1], kc_digest *src);

#endif
