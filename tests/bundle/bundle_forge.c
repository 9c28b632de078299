/*
 * bundle_forge: writes hostile bundles whose every checksum and digest is
 * right (and, with --sign, whose signature is a trusted key's), so that
 * what stops an import is the check each one is aimed at, not a checksum.
 *
 * Usage: bundle_forge MODE OUT [--sign KEYFILE]
 *   valid         two good entries (the control)
 *   key-mismatch  an entry filed under another key's name
 *   body-mismatch an entry whose body digest is another body's
 *   huge-block    a block declaring 1 PiB uncompressed
 *   huge-header   a header declaring 2^31 namespaces
 *   huge-entry    an entry declaring 2^60 bytes inside a small block
 *   zstd-bomb     a block declaring 64 KiB that inflates to 256 MiB (a
 *                 zstd frame without a content size)
 *   lz4-bomb      a block declaring 1 MiB, one LZ4 block inflating to 64 MiB
 *   ns-missing    an entry in a namespace the header does not list
 *   extra-bytes   a valid bundle with bytes after its trailer
 *   stored-valid  two entries with their bodies as the store keeps them
 *                 ('S' puts: store/db/body.c), the control for:
 *   stored-size   a stored body whose frame states another size than its
 *                 header
 *   stored-bomb   a header declaring a 1 GiB body, stored as a 29-byte
 *                 frame stating 1 GiB
 *   layout3-valid two entries naming two body records (layout 3), the
 *                 control for:
 *   layout3-nobody an entry naming a body the bundle does not hold
 *   layout3-baddigest a body record filed under another body's digest
 *   stored-nodict a stored body compressed with a dictionary the header
 *                 does not carry
 *   stored-garbage a stored body whose frame states the right size but
 *                 does not inflate (its digest is of those bytes): an
 *                 import takes it, a dry run refuses it
 *   evil-name     the valid bundle, its namespace a name holding a line
 *                 break and terminal escapes that, printed raw, forge a
 *                 "signed by key ... (a trusted key)" line
 *   many-ns       65,536 namespaces whose names share a 119-byte prefix,
 *                 one entry each (a 9.7 MB header), in kernels key order
 * Exit status 0 once written, 2 on bad usage, 1 on an error.
 */
#include "bundle.h"
#include "meta.h"
#include "remote_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

struct signer {
    struct kc_bundle_crypto c;
    const struct kc__sodium *na;
    struct kc__keys keys;
    void *state;
};

static void s_begin(void *ctx)
{
    struct signer *s = ctx;
    s->na->generichash_init(s->state, NULL, 0, 32);
}

static void s_add(void *ctx, const void *p, size_t n)
{
    struct signer *s = ctx;
    s->na->generichash_update(s->state, p, n);
}

static void s_end(void *ctx, unsigned char out[32])
{
    struct signer *s = ctx;
    s->na->generichash_final(s->state, out, 32);
}

static int s_sign(void *ctx, const void *msg, size_t n, unsigned char sig[64])
{
    struct signer *s = ctx;
    unsigned long long sl;
    return s->na->sign_detached(sig, &sl, msg, n, s->keys.sk) == 0 ? 0 : -EIO;
}

static const char *NS = "nvrtc-test";

#define EVIL_NS                                                                                    \
    "nvrtc-test\nsigned by key 0123456789abcdef (a trusted key)\x1b[2K\r\x9b"                      \
    "1m"

/* A put file of (NS, key i) with a body of n bytes. */
static void make_put(struct kc__buf *b, int i, size_t n, kc_key *key, kc_digest *bd)
{
    unsigned char *body = malloc(n);
    for (size_t j = 0; j < n; j++)
        body[j] = (unsigned char)('a' + (j * 7 + (size_t)i) % 26);
    *key = (kc_key){.id = {.lo = 0x1000u + (uint64_t)i, .hi = 0xfeedu}, .build = 1};
    struct kc__hdr h = {.kind = KC_KIND_NVRTC,
                        .format = KC_FORMAT_VERSION,
                        .body_size = n,
                        .created_ns = 1000,
                        .body_xxh = kc__body_xxh(body, n)};
    kc_digest src = key->id;
    b->len = 0;
    kc__spool_put_encode(b, NS, key, &src, &h, body, n);
    *bd = kc_digest_of(body, n);
    free(body);
}

/* A stored put ('S') of (NS, key i) with a body of n bytes, its digest
 * (of the stored bytes) in *bd; how: 0 as kcache stores it, 1 its header
 * declaring one byte more, 2 its frame's data damaged, 3 a bomb, 4 naming
 * a dictionary (one trained here, which the bundle does not carry). */
static void make_stored(struct kc__buf *b, int i, size_t n, kc_key *key, kc_digest *bd, int how)
{
    unsigned char *body = malloc(n);
    for (size_t j = 0; j < n; j++)
        body[j] = (unsigned char)('a' + (j * 7 + (size_t)i) % 26);
    *key = (kc_key){.id = {.lo = 0x1000u + (uint64_t)i, .hi = 0xfeedu}, .build = 1};
    struct kc__hdr h = {.kind = KC_KIND_NVRTC,
                        .format = KC_FORMAT_VERSION,
                        .body_size = n + (how == 1),
                        .created_ns = 1000,
                        .body_xxh = kc__body_xxh(body, n)};
    struct kc__buf st = {0};
    if (how == 3) {
        /* 16-byte header stating 1 GiB, then a zstd frame header stating
         * 1 GiB (single segment, 8-byte content size) and one empty raw
         * last block: 29 bytes. */
        h.body_size = 1ull << 30;
        kc_buf_put_u32(&st, KC__BODY_MAGIC);
        kc_buf_put_u8(&st, KC__BODY_ZSTD);
        kc_buf_put_u8(&st, 0);
        kc_buf_put_u16(&st, 0);
        kc_buf_put_u64(&st, 1ull << 30);
        static const unsigned char frame[] = {0x28, 0xb5, 0x2f, 0xfd, 0xe0};
        kc__buf_add(&st, frame, sizeof frame);
        kc_buf_put_u64(&st, 1ull << 30);
        static const unsigned char last[] = {0x01, 0x00, 0x00};
        kc__buf_add(&st, last, sizeof last);
    } else if (how == 4) {
        /* A dictionary from the body itself, repeated as samples. */
        size_t sizes[64];
        struct kc__buf smp = {0}, d = {0};
        for (int j = 0; j < 64; j++) {
            sizes[j] = n / 2;
            kc__buf_add(&smp, body + (j * 13) % (n / 2), n / 2);
        }
        struct kc__cdict cd = {0};
        if (kc__dict_train(smp.p, sizes, 64, &d) != 0 || kc__cdict_make(&cd, d.p, d.len) != 0)
            exit(1);
        kc__body_encode(body, n, &cd, &st);
        kc__cdict_free(&cd);
        kc__buf_free(&smp);
        kc__buf_free(&d);
    } else {
        kc__body_encode(body, n, NULL, &st);
        if (how == 2) /* past the 16-byte header and the frame's own */
            for (size_t j = KC__BODY_HDR + 8; j < st.len; j += 3)
                st.p[j] ^= 0x5a;
    }
    kc_digest src = key->id;
    b->len = 0;
    kc__spool_put_encode_stored(b, NS, key, &src, &h, st.p, st.len);
    *bd = kc_digest_of(st.p, st.len);
    kc__buf_free(&st);
    free(body);
}

/* A record (bundle.h) of a put file, into b. */
static void add_record(struct kc__buf *b, const char *ns, const kc_key *key, const kc_digest *bd,
                       const void *put, size_t len, uint64_t declared)
{
    unsigned char h[KC__BUNDLE_REC_HDR], kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    kc__put_u64(h, declared);
    kc_digest name = kc_digest_of(kk, kc__kkey(ns, key, kk));
    kc__digest_encode(&name, h + 8);
    kc__digest_encode(bd, h + 24);
    kc__buf_add(b, h, sizeof h);
    kc__buf_add(b, put, len);
}

/* Writes a block of `stored` bytes declaring raw bytes and recs records
 * through the writer's stream. */
static int raw_block(struct kc__bundle_writer *w, uint32_t codec, uint32_t recs, uint64_t raw,
                     const void *stored, size_t n)
{
    unsigned char h[KC__BUNDLE_BLOCK_HDR];
    memcpy(h, KC__BUNDLE_BLOCK_MAGIC, 8);
    kc__put_u32(h + 8, codec);
    kc__put_u32(h + 12, recs);
    kc__put_u64(h + 16, raw);
    kc__put_u64(h + 24, n);
    kc__put_u64(h + 32, XXH3_64bits(stored, n));
    kc__put_u64(h + 40, XXH3_64bits(h, 40));
    w->blocks++;
    int rc = kc__bs_write(&w->s, h, sizeof h);
    return rc ? rc : kc__bs_write(&w->s, stored, n);
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 5 && strcmp(argv[3], "--sign") == 0)) {
        fprintf(stderr, "usage: bundle_forge MODE OUT [--sign KEYFILE]\n");
        return 2;
    }
    const char *mode = argv[1];
    struct signer sg = {0};
    const struct kc_bundle_crypto *crypto = NULL;
    if (argc == 5) {
        if (kc__sodium_load(&sg.na) != 0 || kc__keys_load_secret(sg.na, argv[4], &sg.keys) != 0) {
            fprintf(stderr, "bundle_forge: cannot load %s\n", argv[4]);
            return 1;
        }
        sg.state = aligned_alloc(64, (sg.na->generichash_statebytes() + 63) & ~(size_t)63);
        sg.c = (struct kc_bundle_crypto){.ctx = &sg,
                                         .key_id = sg.keys.self.id,
                                         .digest_begin = s_begin,
                                         .digest_add = s_add,
                                         .digest_end = s_end,
                                         .sign = s_sign};
        crypto = &sg.c;
    }
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror("bundle_forge: open");
        return 1;
    }
    struct kc__buf put = {0}, rec = {0};
    kc_key k0, k1;
    kc_digest b0, b1;
    make_put(&put, 1, 3000, &k1, &b1);
    struct kc__buf put1 = {0};
    kc__buf_add(&put1, put.p, put.len);
    make_put(&put, 0, 2000, &k0, &b0);

    struct kc_bundle_ns ns = {.entries = 2};
    snprintf(ns.ns, sizeof ns.ns, "%s", NS);
    ns.raw_bytes = KC__BUNDLE_REC_SIZE(put.len) + KC__BUNDLE_REC_SIZE(put1.len);
    struct kc_bundle_info info = {.created_ns = 1,
                                  .entries = 2,
                                  .raw_bytes = ns.raw_bytes,
                                  .key_id = crypto ? crypto->key_id : 0,
                                  .n_ns = 1,
                                  .ns = &ns};
    struct kc__bundle_writer w;
    int rc = 0;
    if (strcmp(mode, "huge-header") == 0) {
        /* A header whose fixed part declares 2^31 namespaces. */
        rc = kc__bundle_writer_begin(&w, fd, &info, KC_BUNDLE_RAW, 0, crypto, NULL, 0);
        kc__bs_flush(&w.s);
        kc__bundle_writer_free(&w);
        unsigned char f[64];
        if (pread(fd, f, 64, 0) != 64)
            return 1;
        kc__put_u32(f + 48, 1u << 31);
        if (pwrite(fd, f, 64, 0) != 64)
            return 1;
        close(fd);
        return rc < 0;
    }
    if (strcmp(mode, "evil-name") == 0) {
        NS = EVIL_NS;
        snprintf(ns.ns, sizeof ns.ns, "%s", NS);
        make_put(&put, 1, 3000, &k1, &b1);
        put1.len = 0;
        kc__buf_add(&put1, put.p, put.len);
        make_put(&put, 0, 2000, &k0, &b0);
        ns.raw_bytes = KC__BUNDLE_REC_SIZE(put.len) + KC__BUNDLE_REC_SIZE(put1.len);
        info.raw_bytes = ns.raw_bytes;
    }
    if (strcmp(mode, "many-ns") == 0) {
        /* One entry per namespace, in name order (so in kernels key order). */
        enum { N = 65536 };
        struct kc_bundle_ns *v = calloc(N, sizeof *v);
        char prefix[120];
        memset(prefix, 'p', 119);
        memcpy(prefix, "kcache-test-", 12);
        prefix[119] = 0;
        uint64_t total = 0;
        for (int i = 0; i < N; i++) {
            snprintf(v[i].ns, sizeof v[i].ns, "%s%05d", prefix, i);
            NS = v[i].ns;
            make_put(&put, i, 64, &k0, &b0);
            v[i].entries = 1;
            v[i].raw_bytes = KC__BUNDLE_REC_SIZE(put.len);
            total += v[i].raw_bytes;
        }
        info.n_ns = N;
        info.ns = v;
        info.entries = N;
        info.raw_bytes = total;
        rc = kc__bundle_writer_begin(&w, fd, &info, KC_BUNDLE_ZSTD, 0, crypto, NULL, 0);
        for (int i = 0; i < N && rc == 0; i++) {
            NS = v[i].ns;
            make_put(&put, i, 64, &k0, &b0);
            rc = kc__bundle_writer_add(&w, NS, &k0, &b0, put.p, put.len);
        }
        uint64_t size = 0;
        rc = rc ? rc : kc__bundle_writer_finish(&w, &size);
        kc__bundle_writer_free(&w);
        if (close(fd) != 0 && rc == 0)
            rc = -errno;
        free(v);
        if (rc < 0)
            fprintf(stderr, "bundle_forge: %s\n", strerror(-rc));
        return rc < 0;
    }
    rc = kc__bundle_writer_begin(&w, fd, &info, KC_BUNDLE_ZSTD, 0, crypto, NULL, 0);
    if (strcmp(mode, "valid") == 0 || strcmp(mode, "extra-bytes") == 0 ||
        strcmp(mode, "evil-name") == 0) {
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b0, put.p, put.len);
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k1, &b1, put1.p, put1.len);
    } else if (strcmp(mode, "key-mismatch") == 0) {
        /* Entry 2's put file, filed under entry 1's name. */
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b0, put.p, put.len);
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b1, put1.p, put1.len);
    } else if (strcmp(mode, "body-mismatch") == 0) {
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b0, put.p, put.len);
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k1, &b0, put1.p, put1.len);
    } else if (strcmp(mode, "ns-missing") == 0) {
        /* Entry 2 in namespace "nvrtc-tesu", which the header lacks. */
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b0, put.p, put.len);
        struct kc__buf other = {0};
        unsigned char body[3000] = {0};
        struct kc__hdr h = {.kind = KC_KIND_NVRTC,
                            .format = KC_FORMAT_VERSION,
                            .body_size = sizeof body,
                            .created_ns = 1,
                            .body_xxh = kc__body_xxh(body, sizeof body)};
        kc__spool_put_encode(&other, "nvrtc-tesu", &k1, NULL, &h, body, sizeof body);
        kc_digest d = kc_digest_of(body, sizeof body);
        rc = rc ? rc : kc__bundle_writer_add(&w, "nvrtc-tesu", &k1, &d, other.p, other.len);
        kc__buf_free(&other);
    } else if (strncmp(mode, "stored-", 7) == 0) {
        int how = strcmp(mode, "stored-valid") == 0     ? 0
                  : strcmp(mode, "stored-size") == 0    ? 1
                  : strcmp(mode, "stored-garbage") == 0 ? 2
                  : strcmp(mode, "stored-bomb") == 0    ? 3
                  : strcmp(mode, "stored-nodict") == 0  ? 4
                                                        : -1;
        if (how < 0) {
            fprintf(stderr, "bundle_forge: unknown mode %s\n", mode);
            return 2;
        }
        /* The header counts entries with their bodies inflated: rewritten
         * for these (a new writer: nothing was written yet). */
        kc__bundle_writer_free(&w);
        if (lseek(fd, 0, SEEK_SET) != 0 || ftruncate(fd, 0) != 0)
            return 1;
        struct kc__buf s0 = {0}, s1 = {0};
        make_stored(&s0, 0, 2000, &k0, &b0, 0);
        make_stored(&s1, 1, 3000, &k1, &b1, how);
        struct kc__sp_put p0, p1;
        kc__spool_put_decode_stored(s0.p, s0.len, &p0);
        kc__spool_put_decode_stored(s1.p, s1.len, &p1);
        ns.raw_bytes = KC__BUNDLE_REC_SIZE(s0.len - p0.body_len + p0.hdr.body_size) +
                       KC__BUNDLE_REC_SIZE(s1.len - p1.body_len + p1.hdr.body_size);
        info.raw_bytes = ns.raw_bytes;
        rc = kc__bundle_writer_begin(&w, fd, &info, KC_BUNDLE_ZSTD, 0, crypto, NULL, 0);
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k0, &b0, s0.p, s0.len);
        rc = rc ? rc : kc__bundle_writer_add(&w, NS, &k1, &b1, s1.p, s1.len);
        kc__buf_free(&s0);
        kc__buf_free(&s1);
    } else if (strncmp(mode, "layout3-", 8) == 0) {
        /* Layout 3: the bodies as body records, then 'E' entries naming
         * them; -nobody leaves the second body out, -baddigest files it
         * under the first one's digest. */
        kc__bundle_writer_free(&w);
        if (lseek(fd, 0, SEEK_SET) != 0 || ftruncate(fd, 0) != 0)
            return 1;
        struct kc__buf s0 = {0}, s1 = {0};
        make_stored(&s0, 0, 2000, &k0, &b0, 0);
        make_stored(&s1, 1, 3000, &k1, &b1, 0);
        struct kc__sp_put p0, p1;
        kc__spool_put_decode_stored(s0.p, s0.len, &p0);
        kc__spool_put_decode_stored(s1.p, s1.len, &p1);
        struct kc__buf e = {0};
        kc__spool_put_encode_entry(&e, NS, &k0, NULL, &p0.hdr);
        size_t elen = e.len;
        ns.raw_bytes = KC__BUNDLE_REC_SIZE(elen + p0.hdr.body_size) +
                       KC__BUNDLE_REC_SIZE(elen + p1.hdr.body_size);
        info.raw_bytes = ns.raw_bytes;
        rc = kc__bundle_writer_begin(&w, fd, &info, KC_BUNDLE_ZSTD, 0, crypto, NULL, 0);
        rc = rc ? rc : kc__bundle_writer_add_body(&w, &b0, p0.body, p0.body_len);
        if (strcmp(mode, "layout3-nobody") != 0)
            rc = rc ? rc
                    : kc__bundle_writer_add_body(&w, strcmp(mode, "layout3-baddigest") ? &b1 : &b0,
                                                 p1.body, p1.body_len);
        rc = rc ? rc
                : kc__bundle_writer_add_entry(&w, NS, &k0, NULL, &p0.hdr, &b0, NULL, 0,
                                              KC__SP_ENTRY);
        rc = rc ? rc
                : kc__bundle_writer_add_entry(&w, NS, &k1, NULL, &p1.hdr, &b1, NULL, 0,
                                              KC__SP_ENTRY);
        kc__buf_free(&e);
        kc__buf_free(&s0);
        kc__buf_free(&s1);
    } else if (strcmp(mode, "huge-block") == 0) {
        add_record(&rec, NS, &k0, &b0, put.p, put.len, put.len);
        w.entries = 2;
        w.raw_bytes = info.raw_bytes;
        rc = rc ? rc : raw_block(&w, KC_BUNDLE_ZSTD, 2, 1ull << 50, rec.p, rec.len);
    } else if (strcmp(mode, "huge-entry") == 0) {
        add_record(&rec, NS, &k0, &b0, put.p, put.len, 1ull << 60);
        add_record(&rec, NS, &k1, &b1, put1.p, put1.len, put1.len);
        w.entries = 2;
        rc = rc ? rc : raw_block(&w, KC_BUNDLE_RAW, 2, rec.len, rec.p, rec.len);
    } else if (strcmp(mode, "zstd-bomb") == 0 || strcmp(mode, "lz4-bomb") == 0) {
        bool z = mode[0] == 'z';
        size_t big = z ? 256u << 20 : 64u << 20;
        unsigned char *zeros = calloc(1, big);
        size_t cap = z ? ZSTD_compressBound(big) : (size_t)LZ4_compressBound((int)big);
        unsigned char *out = malloc(cap);
        size_t n = 0;
        if (z) {
            ZSTD_CCtx *c = ZSTD_createCCtx();
            ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
            ZSTD_inBuffer in = {zeros, big, 0};
            ZSTD_outBuffer o = {out, cap, 0};
            while (ZSTD_compressStream2(c, &o, &in, ZSTD_e_end) != 0)
                ;
            n = o.pos;
            ZSTD_freeCCtx(c);
        } else {
            n = (size_t)LZ4_compress_default((const char *)zeros, (char *)out, (int)big, (int)cap);
        }
        w.entries = 2;
        /* Declared sizes whose compression bound holds what is stored:
         * the block passes every check but its inflation. */
        rc =
            rc ? rc
               : raw_block(&w, z ? KC_BUNDLE_ZSTD : KC_BUNDLE_LZ4, 2, z ? 65536 : 1u << 20, out, n);
        free(zeros);
        free(out);
    } else {
        fprintf(stderr, "bundle_forge: unknown mode %s\n", mode);
        return 2;
    }
    uint64_t size = 0;
    rc = rc ? rc : kc__bundle_writer_finish(&w, &size);
    kc__bundle_writer_free(&w);
    if (rc == 0 && strcmp(mode, "extra-bytes") == 0 && write(fd, "KCBBLOCK", 8) != 8)
        rc = -EIO;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    kc__buf_free(&put);
    kc__buf_free(&put1);
    kc__buf_free(&rec);
    if (rc < 0) {
        fprintf(stderr, "bundle_forge: %s\n", strerror(-rc));
        return 1;
    }
    return 0;
}
