/*
 * bundle.h: the byte layout of a bundle (kcache export / import), its
 * stream reader and writer (bundle_io.c), which the store's side of export
 * (export.c) and import (import.c, bulk.c; run by bundle.c) read and
 * write through. Every number is little-endian; a u64 is 8 bytes.
 *
 * A bundle is a header, blocks, and a trailer, written in one pass (a
 * pipe will do) and read in one pass, every byte through one stream type
 * (struct kc__bstream, as redis' rio) that keeps a running XXH3-128 and,
 * for a signed bundle, a BLAKE2b-256 of everything before the trailer.
 *
 *   header   0  magic "KCBUNDLE"                                  8
 *            8  u16 layout version (KC__BUNDLE_VERSION)
 *           10  u16 record format (KC_FORMAT_VERSION of the records)
 *           12  u32 flags: 1 signed
 *           16  u64 created, ns since the epoch
 *           24  u64 entries (records in the blocks)
 *           32  u64 raw bytes (the records' bytes, uncompressed: a record
 *               with a stored body counted with its body inflated)
 *           40  u64 signer's key id (0: unsigned)
 *           48  u32 namespaces
 *           52  u32 text length
 *           56  u32 codec the writer asked for (informational)
 *           60  u32 header length, all of it
 *           64  the text: what the header says, in ASCII lines, so that
 *               `head -c 2000 FILE` shows it (format, time, signer, each
 *               namespace with its fingerprint described)
 *           ..  per namespace: u16 length, u16 0, u32 0, u64 entries,
 *               u64 raw bytes, the name (1..127 bytes, no NUL)
 *           ..  u32 dictionaries, u32 0; per dictionary: u64 its id
 *               (kc__dict_id of its bytes), u32 length, u32 0, its bytes:
 *               the zstd dictionaries the entries' bodies name (meta.h
 *               "z/"), imported with them
 *           ..  u64 XXH3-64 of the header's bytes before it
 *
 *   block    0  magic "KCBBLOCK"                                  8
 *            8  u32 codec (enum kc_bundle_codec)
 *           12  u32 records in it
 *           16  u64 raw length (the records, uncompressed)
 *           24  u64 stored length (the bytes that follow)
 *           32  u64 XXH3-64 of the stored bytes
 *           40  u64 XXH3-64 of bytes 0..40 of the block header
 *           48  the stored bytes: the records, compressed as one zstd
 *               frame or LZ4 block, or raw when that did not shrink them
 *
 *   record   0  u64 length of the put file (bit 63 set: a body record,
 *               layout 3: the length of the body that follows)
 *            8  16 the entry's name: XXH3-128 of ns \0 key (kc__kkey's
 *               bytes), as its hot file is named
 *           24  16 the body's digest (kc_digest_of of the body as stored: the
 *               bodies family's key, meta.h)
 *           40  the put file: the spool's own checksummed format
 *               (store/local/record.c: namespace, key, source, record
 *               header, body). Since layout 2 the body is as the
 *               database keeps it (an 'S' put: store/db/body.c's 16-byte
 *               header and zstd frame, carried as it lies on disk, no
 *               second compression), or plain (a 'P' put: a body stored
 *               by an earlier version, and every body of layout 1). Since
 *               layout 3 a whole store's export carries each body once, as
 *               a body record (16 zero bytes for a name, its digest, the
 *               value as the bodies family keeps it; only in uncompressed
 *               blocks), read in table order, before the entries, which
 *               are then 'E' puts: the put without its body, naming a body
 *               record by its digest
 *
 *   trailer  0  magic "KCBTRAIL"                                  8
 *            8  u64 entries
 *           16  u64 blocks
 *           24  u64 bytes before the trailer
 *           32  16 XXH3-128 of those bytes
 *           48  u32 flags (as the header's), u32 0
 *           56  u64 signer's key id (as the header's)
 *           64  32 BLAKE2b-256 of the bytes before the trailer (signed)
 *           96  64 Ed25519 signature of "kcache-bundle-v1" followed by
 *               trailer bytes 0..96 (signed; zeros otherwise)
 *          160  u64 XXH3-64 of trailer bytes 0..160
 *          168  magic "KCBUNEND"                                  8
 *
 * A reader checks everything before it writes anything: header, each
 * block's checksums and sizes (an inflated size must be the declared one),
 * each record (its put file's checksums, its name against its key, its
 * digest against its body, its namespace in the header), the counts, the
 * digests and the signature, and nothing after the trailer.
 */
#ifndef KCACHE_STORE_BUNDLE_H
#define KCACHE_STORE_BUNDLE_H

#include "../local/local.h"
#include "body.h"
#include "meta.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define KC__BUNDLE_VERSION 3
/* The oldest layout a reader takes (1: every body plain). */
#define KC__BUNDLE_VERSION_MIN 1
/* A stored body inflates at most this many times its stored size. */
#define KC__BUNDLE_MAX_RATIO 4096u
#define KC__BUNDLE_MAGIC "KCBUNDLE"
#define KC__BUNDLE_BLOCK_MAGIC "KCBBLOCK"
#define KC__BUNDLE_TRAILER_MAGIC "KCBTRAIL"
#define KC__BUNDLE_END_MAGIC "KCBUNEND"
#define KC__BUNDLE_HDR_FIXED 64
#define KC__BUNDLE_NS_FIXED 24
#define KC__BUNDLE_BLOCK_HDR 48
#define KC__BUNDLE_DICT_FIXED 16
#define KC__BUNDLE_MAX_DICTS 4096u
#define KC__BUNDLE_MAX_DICT (1u << 20)
#define KC__BUNDLE_REC_HDR 40
#define KC__BUNDLE_REC_BODY (1ull << 63)
#define KC__BUNDLE_TRAILER 176
#define KC__BUNDLE_SIGNED 1u
#define KC__BUNDLE_SIG_CONTEXT "kcache-bundle-v1"

/* Limits a reader holds a bundle to (a hostile one declares anything). */
#define KC__BUNDLE_MAX_NS 65536u
#define KC__BUNDLE_MAX_TEXT (1u << 20)
#define KC__BUNDLE_MAX_HDR (16u << 20)
/* A record (a put file) at most 1 GiB: larger entries are not exported. */
#define KC__BUNDLE_MAX_RECORD (1ull << 30)
/* A writer closes a block once it holds this much: blocks hold at most
 * this plus one record. */
#define KC__BUNDLE_BLOCK_TARGET (4u << 20)
#define KC__BUNDLE_MAX_BLOCK (KC__BUNDLE_MAX_RECORD + KC__BUNDLE_BLOCK_TARGET + KC__BUNDLE_REC_HDR)

/* ---- the stream (bundle_io.c) ------------------------------------------- */

struct kc__bstream {
    int fd;                   /* -1: reading from mem */
    const unsigned char *mem; /* reading from memory (the fuzzer) */
    size_t mem_len;
    unsigned char *buf; /* fd: the I/O buffer */
    size_t cap, len, pos;
    uint64_t off;                          /* bytes consumed (read) or produced (written) */
    void *xxh;                             /* XXH3_state_t: running XXH3-128 */
    const struct kc_bundle_crypto *crypto; /* digest_add when hashing */
    bool hashing;
    bool eof;
    /* Reading: every byte read from fd is also written to copy_fd (-1:
     * none), so that a stream is copied only as far as it is read and
     * checked. copy_err: the first error writing it (the read then fails
     * with it). */
    int copy_fd;
    int copy_err;
    /* Reading from fd: called after each read(2) with the bytes read from
     * fd so far (the reader's progress: a bundle's bodies come before its
     * entries, so a count of entries says nothing while they arrive). */
    void (*on_read)(uint64_t bytes, void *arg);
    void *on_read_arg;
    uint64_t fd_bytes;
};

/* Starts a stream over fd (reading or writing) or, with fd -1, over the
 * n bytes at mem (reading). 0 or -ENOMEM. */
int kc__bs_init(struct kc__bstream *s, int fd, const void *mem, size_t n);
void kc__bs_free(struct kc__bstream *s);
/* Reads exactly n bytes into p, through the digests. 0; -ENODATA when the
 * stream ends first; or the read error. */
int kc__bs_read(struct kc__bstream *s, void *p, size_t n);
/* The next n (<= 64) bytes without consuming them: 0 with *p, -ENODATA,
 * or the read error. */
int kc__bs_peek(struct kc__bstream *s, size_t n, const unsigned char **p);
/* Whether the stream has ended (nothing more to read; reads ahead). */
bool kc__bs_at_end(struct kc__bstream *s);
/* Writes n bytes through the digests (buffered). 0 or the write error. */
int kc__bs_write(struct kc__bstream *s, const void *p, size_t n);
/* Writes out the buffer. 0 or the write error. */
int kc__bs_flush(struct kc__bstream *s);
/* The running XXH3-128 of everything read or written so far. */
kc_digest kc__bs_digest(struct kc__bstream *s);

/* ---- the writer (bundle_io.c) ------------------------------------------- */

/* A dictionary for the header. */
struct kc__bundle_dict {
    uint64_t id;
    const void *p;
    size_t len;
};

struct kc__bundle_writer {
    struct kc__bstream s;
    const struct kc_bundle_crypto *crypto; /* signs when key_id != 0 */
    int codec, level;
    struct kc__buf raw; /* the block being filled */
    unsigned char *out; /* compressed block */
    size_t out_cap;
    uint32_t block_records;
    uint64_t block_plain; /* bytes of the block's plain puts (compressed) */
    uint64_t entries, blocks, raw_bytes;
    void *zcctx; /* ZSTD_CCtx */
    /* The output thread (out_main): compresses and writes the block in
     * spare while the next is filled. */
    struct kc__buf spare;
    uint32_t spare_records;
    uint64_t spare_plain;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool th_started, pending, stop;
    int th_rc; /* its first error */
    /* What reached fd: records (entries and body records, in the order
     * added) whose bytes were written, a block's counted in proportion to
     * its bytes written as they go (kc__bundle_writer_written). */
    uint64_t added;                  /* records added */
    uint64_t raw_first, spare_first; /* the first record of each block */
    _Atomic uint64_t written;
    /* Called on the adding thread, about every 100 ms, while it waits for
     * the output thread (a slow reader): its progress can be drawn then. */
    void (*tick)(void *arg);
    void *tick_arg;
};

/* Writes the header (info: created_ns, entries, raw_bytes, key_id,
 * namespaces with their counts) and starts the blocks. 0 or a negative
 * errno. */
int kc__bundle_writer_begin(struct kc__bundle_writer *w, int fd, const struct kc_bundle_info *info,
                            int codec, int level, const struct kc_bundle_crypto *crypto,
                            const struct kc__bundle_dict *dicts, size_t n_dicts);
/* Adds one record: the put file (len bytes) of (ns, key) whose body
 * digest is body_digest. 0 or a negative errno. */
int kc__bundle_writer_add(struct kc__bundle_writer *w, const char *ns, const kc_key *key,
                          const kc_digest *body_digest, const void *put, size_t len);
/* Adds one entry, its put file built in place in the block: (ns, key) with
 * header h and its body as stored (stored: an 'S' put) or plain (a 'P'
 * put), whose digest is body_digest. 0 or a negative errno. */
int kc__bundle_writer_add_entry(struct kc__bundle_writer *w, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h,
                                const kc_digest *body_digest, const void *body, size_t len,
                                int type);
/* Adds a body record (layout 3): value (len bytes, as the bodies family
 * keeps it) under digest. Entries naming it follow as KC__SP_ENTRY puts. */
int kc__bundle_writer_add_body(struct kc__bundle_writer *w, const kc_digest *digest,
                               const void *value, size_t len);
/* Records (entries and body records) whose bytes were written to fd so
 * far, counting the block being written in proportion to its bytes
 * written; kc__bundle_writer_sync, then, counts every record added. */
uint64_t kc__bundle_writer_written(struct kc__bundle_writer *w);
/* Closes the block being filled and waits until every record added is
 * written to fd (w->tick called while it waits). 0 or a negative errno. */
int kc__bundle_writer_sync(struct kc__bundle_writer *w);
/* Closes the last block, writes the trailer (signed when crypto has a
 * key) and flushes. *file_bytes: the bundle's size. 0 or a negative errno. */
int kc__bundle_writer_finish(struct kc__bundle_writer *w, uint64_t *file_bytes);
void kc__bundle_writer_free(struct kc__bundle_writer *w);
/* The header's size for info (the writer's, exactly). */
size_t kc__bundle_header_size(const struct kc_bundle_info *info, int codec,
                              const struct kc__bundle_dict *dicts, size_t n_dicts);
/* The size of the put file of an entry of namespace length nl and body
 * size bs (store/local/record.c's layout: spool header, fixed part, ns,
 * record header, body). */
static inline uint64_t kc__put_file_size(size_t nl, uint64_t bs)
{
    return KC__SPOOL_HDR + 8 + KC__KEY_LEN + 16 + nl + KC__HDR_LEN + bs;
}
/* The bytes a record of a put file of len bytes takes in a block. */
#define KC__BUNDLE_REC_SIZE(len) ((uint64_t)KC__BUNDLE_REC_HDR + (len))

/* ---- a namespace table's index (bundle_io.c) ----------------------------- */

/* Names of an array of struct kc_bundle_ns, hashed: finding one costs the
 * same for 1 or 65,536 namespaces (a bundle header holds up to
 * KC__BUNDLE_MAX_NS). It keeps indices, so the array may move. */
struct kc__nsindex {
    uint32_t *slot; /* index + 1; 0: empty */
    size_t cap, n;
};
/* The index in v of name, or SIZE_MAX. */
size_t kc__nsindex_find(const struct kc__nsindex *x, const struct kc_bundle_ns *v,
                        const char *name);
/* Indexes v[i], whose name is not indexed yet. 0 or -ENOMEM. */
int kc__nsindex_add(struct kc__nsindex *x, const struct kc_bundle_ns *v, size_t i);
void kc__nsindex_free(struct kc__nsindex *x);

/* ---- the reader (bundle_io.c) ------------------------------------------- */

/* A body record as the reader found it. */
struct kc__bodyref {
    unsigned char digest[16];
    uint64_t raw, at, xxh; /* xxh: of the inflated body (check_bodies) */
    uint64_t len;
    bool used;
};

struct kc__bundle_reader {
    struct kc__bstream s;
    struct kc_bundle_info *info; /* the header, as declared */
    const struct kc_bundle_crypto *crypto;
    bool trust_unsigned;
    unsigned char *stored, *raw; /* the current block */
    size_t stored_cap, raw_cap, raw_len, raw_pos;
    uint32_t block_left; /* records of the current block not read */
    uint64_t block_no, record_no;
    uint64_t seen_raw;
    uint64_t *ns_entries, *ns_bytes; /* tallies per namespace of info->ns */
    struct kc__nsindex ns_index;     /* info->ns by name */
    void *zdctx;                     /* ZSTD_DCtx */
    bool done;
    /* Set by the caller: inflate every stored body and check it against
     * its header (sp->body then points to it); otherwise a stored entry's
     * sp->body is NULL, and its stored bytes are checked against its
     * digest and its frame's stated size only (every get inflates and
     * checks a body against its header before serving it). */
    bool check_bodies;
    /* The entry kc__bundle_reader_next returned: its body as stored (an
     * 'S' put: NULL for a plain one), its inflated body when it was
     * inflated (sp->body points there), and its body digest (16 bytes). */
    const unsigned char *entry_stored;
    size_t entry_stored_len;
    uint64_t entry_stored_at; /* its offset in the stream (UINT64_MAX: in a
                               * compressed block) */
    uint64_t block_at;        /* the current block's records' offset */
    char *plain;
    const unsigned char *entry_digest;
    /* An 'E' entry's body lies in a body record read before (its bytes at
     * entry_stored_at, entry_stored_len; entry_stored NULL). */
    bool entry_detached;
    /* The body records read so far, by digest (layout 3). */
    struct kc__bodyref *bodies;
    size_t n_bodies, cap_bodies;
    /* The header's dictionaries: ids, where their bytes lie in dict_data,
     * and loaded for inflating (check_bodies). */
    struct {
        uint64_t id;
        size_t off, len;
    } * dict;
    size_t n_dicts;
    unsigned char *dict_data;
    struct kc__dicts dicts;
};

/* Starts reading a bundle from fd (or the n bytes at mem when fd is -1)
 * and reads its header into *info (info->ns malloc'd; the caller frees
 * it). The signature policy is applied here: an unsigned bundle, or one
 * signed by a key crypto does not trust, is refused (-EKEYREJECTED)
 * unless trust_unsigned. 0, or a negative errno with info->why. */
int kc__bundle_reader_begin(struct kc__bundle_reader *r, int fd, const void *mem, size_t n,
                            struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                            bool trust_unsigned);
/* The same over fd, writing every byte it reads from fd to copy_fd (-1:
 * none) as it goes, for as long as the reader is used (a stream copied
 * only as far as it checks out). */
int kc__bundle_reader_begin_copy(struct kc__bundle_reader *r, int fd, int copy_fd,
                                 struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                                 bool trust_unsigned);
/* kc__bundle_reader_begin_copy with on_read(bytes read from fd so far,
 * arg) called after each read of fd, the header's included (NULL: none). */
int kc__bundle_reader_begin_read(struct kc__bundle_reader *r, int fd, int copy_fd,
                                 void (*on_read)(uint64_t bytes, void *arg), void *arg,
                                 struct kc_bundle_info *info, const struct kc_bundle_crypto *crypto,
                                 bool trust_unsigned);
/* The next record: 1 with *sp decoded and checked (pointing into the
 * reader's block, valid until the next call) and *put, *len its put file;
 * 0 after the trailer, once every count, digest and the signature check
 * out (info->verified set) and nothing follows it; or a negative errno
 * with info->why. *ns_index: the record's namespace in info->ns. */
int kc__bundle_reader_next(struct kc__bundle_reader *r, struct kc__sp_put *sp,
                           const unsigned char **put, size_t *len, size_t *ns_index);
void kc__bundle_reader_free(struct kc__bundle_reader *r);
/* Whether the header carries dictionary id. */
bool kc__bundle_reader_has_dict(const struct kc__bundle_reader *r, uint64_t id);
/* Parses a trailer (KC__BUNDLE_TRAILER bytes) into info's entries, blocks,
 * key_id, is_signed: 0 or -EBADMSG. For `bundle show`; checks only its
 * magics and its own checksum. */
int kc__bundle_trailer_peek(const unsigned char *t, struct kc_bundle_info *info);

/* A namespace's fingerprint in words ("NVRTC 13.0, libnvrtc identity
 * 0123456789abcdef, record format 1"), into out (n bytes). */
void kc__bundle_ns_describe(const char *ns, char *out, size_t n);

/* Writes the reason an operation failed into info->why (printf's format):
 * returns rc. */
int kc__bundle_why(struct kc_bundle_info *info, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
