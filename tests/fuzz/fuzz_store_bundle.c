/*
 * Fuzz target: the bundle reader (store/db/bundle_io.c), which `kcache
 * import` and `kcache bundle show` run over files from other machines:
 * header, blocks (raw, zstd, LZ4), records (put files), trailer. It must
 * take any bytes, answer with a reason, never read past its input, never
 * allocate what a bundle merely declares, and hand out only records that
 * are whole and consistent.
 *
 * First input byte: bit 0 set makes the target write every checksum and
 * digest of the input right (header, blocks, and in raw blocks each
 * record's put file, name and body digest; the trailer's counts, digest
 * and signature) so the checks behind them are reached; bit 1 gives the
 * reader a stand-in signer (a keyed XXH3 in place of BLAKE2b and Ed25519)
 * that trusts every key, so signed bundles are verified.
 */
#include "fuzz.h"

#include "bundle.h"
#include "meta.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- the stand-in signer ---------------------------------------------------- */

static XXH3_state_t *digest_state;

static void st_begin(void *ctx)
{
    if (digest_state == NULL)
        digest_state = XXH3_createState();
    XXH3_128bits_reset(digest_state);
}

static void st_add(void *ctx, const void *p, size_t n)
{
    XXH3_128bits_update(digest_state, p, n);
}

static void st_end(void *ctx, unsigned char out[32])
{
    XXH128_hash_t h = XXH3_128bits_digest(digest_state);
    kc__put_u64(out, h.low64);
    kc__put_u64(out + 8, h.high64);
    kc__put_u64(out + 16, ~h.low64);
    kc__put_u64(out + 24, ~h.high64);
}

static void fake_sig(const void *msg, size_t n, unsigned char sig[64])
{
    for (int i = 0; i < 4; i++) {
        XXH128_hash_t h = XXH3_128bits_withSeed(msg, n, (uint64_t)i);
        kc__put_u64(sig + 16 * i, h.low64);
        kc__put_u64(sig + 16 * i + 8, h.high64);
    }
}

static int st_sign(void *ctx, const void *msg, size_t n, unsigned char sig[64])
{
    fake_sig(msg, n, sig);
    return 0;
}

static int st_trusted(void *ctx, uint64_t id)
{
    return 1;
}

static int st_verify(void *ctx, uint64_t id, const void *msg, size_t n, const unsigned char sig[64])
{
    unsigned char want[64];
    fake_sig(msg, n, want);
    return memcmp(want, sig, 64) == 0 ? 0 : -EKEYREJECTED;
}

static const struct kc_bundle_crypto stand_in = {
    .key_id = 0x1234,
    .digest_begin = st_begin,
    .digest_add = st_add,
    .digest_end = st_end,
    .sign = st_sign,
    .trusted = st_trusted,
    .verify = st_verify,
};

/* ---- fixing checksums ---------------------------------------------------------- */

static void fix_put(unsigned char *p, size_t n)
{
    if (n < KC__SPOOL_HDR + 48)
        return;
    unsigned char *pl = p + KC__SPOOL_HDR;
    size_t plen = n - KC__SPOOL_HDR, nslen = kc__get_u16(pl);
    if (nslen <= plen - 48 && plen - 48 - nslen >= KC__HDR_LEN) {
        unsigned char *rec = pl + 48 + nslen;
        size_t rlen = plen - 48 - nslen;
        kc__put_u64(rec + 16, rlen - KC__HDR_LEN);
        kc__put_u64(rec + 56, XXH3_64bits(rec + KC__HDR_LEN, rlen - KC__HDR_LEN));
        kc__put_u64(rec + 64, XXH3_64bits(rec, 64));
    }
    kc__put_u64(p + 8, plen);
    kc__put_u64(p + 16, XXH3_64bits(pl, plen));
}

static void fix_records(unsigned char *b, size_t n)
{
    size_t o = 0;
    while (n - o >= KC__BUNDLE_REC_HDR) {
        uint64_t len = kc__get_u64(b + o);
        if (len > n - o - KC__BUNDLE_REC_HDR)
            return;
        unsigned char *f = b + o + KC__BUNDLE_REC_HDR;
        fix_put(f, (size_t)len);
        struct kc__sp_put sp;
        if (kc__spool_put_decode(f, (size_t)len, &sp) == 0) {
            unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
            kc_digest name = kc_digest_of(kk, kc__kkey(sp.ns, &sp.key, kk));
            kc_digest bd = kc_digest_of(sp.body, sp.body_len);
            kc__digest_encode(&name, b + o + 8);
            kc__digest_encode(&bd, b + o + 24);
        }
        o += KC__BUNDLE_REC_HDR + (size_t)len;
    }
}

static void fix_checksums(unsigned char *p, size_t n, bool sign)
{
    if (n < KC__BUNDLE_HDR_FIXED || memcmp(p, KC__BUNDLE_MAGIC, 8) != 0)
        return;
    size_t hlen = kc__get_u32(p + 60);
    if (hlen < KC__BUNDLE_HDR_FIXED + 8 || hlen > n)
        return;
    kc__put_u64(p + hlen - 8, XXH3_64bits(p, hlen - 8));
    size_t o = hlen;
    uint64_t blocks = 0;
    while (n - o >= KC__BUNDLE_BLOCK_HDR && memcmp(p + o, KC__BUNDLE_BLOCK_MAGIC, 8) == 0) {
        uint64_t stored = kc__get_u64(p + o + 24);
        if (stored > n - o - KC__BUNDLE_BLOCK_HDR) {
            stored = n - o - KC__BUNDLE_BLOCK_HDR;
            kc__put_u64(p + o + 24, stored);
        }
        if (kc__get_u32(p + o + 8) == KC_BUNDLE_RAW) {
            kc__put_u64(p + o + 16, stored);
            fix_records(p + o + KC__BUNDLE_BLOCK_HDR, (size_t)stored);
        }
        kc__put_u64(p + o + 32, XXH3_64bits(p + o + KC__BUNDLE_BLOCK_HDR, (size_t)stored));
        kc__put_u64(p + o + 40, XXH3_64bits(p + o, 40));
        o += KC__BUNDLE_BLOCK_HDR + (size_t)stored;
        blocks++;
    }
    if (n - o < KC__BUNDLE_TRAILER || memcmp(p + o, KC__BUNDLE_TRAILER_MAGIC, 8) != 0)
        return;
    unsigned char *t = p + o;
    kc__put_u64(t + 16, blocks);
    kc__put_u64(t + 24, o);
    kc_digest d = kc_digest_of(p, o);
    kc__digest_encode(&d, t + 32);
    if (sign && (kc__get_u32(t + 48) & KC__BUNDLE_SIGNED)) {
        st_begin(NULL);
        st_add(NULL, p, o);
        st_end(NULL, t + 64);
        unsigned char msg[16 + 96];
        memcpy(msg, KC__BUNDLE_SIG_CONTEXT, 16);
        memcpy(msg + 16, t, 96);
        fake_sig(msg, sizeof msg, t + 96);
    }
    kc__put_u64(t + 160, XXH3_64bits(t, 160));
    memcpy(t + 168, KC__BUNDLE_END_MAGIC, 8);
}

/* ---- the target ------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned mode = data[0];
    size_t n = size - 1;
    unsigned char *p = kc_fuzz_dup(data + 1, n);
    if (mode & 1)
        fix_checksums(p, n, (mode & 2) != 0);
    const struct kc_bundle_crypto *crypto = mode & 2 ? &stand_in : NULL;
    struct kc__bundle_reader r;
    struct kc_bundle_info info;
    int rc = kc__bundle_reader_begin(&r, -1, p, n, &info, crypto, true);
    r.check_bodies = true;
    uint64_t records = 0;
    while (rc == 0) {
        struct kc__sp_put sp;
        const unsigned char *put;
        size_t len, idx;
        int k = kc__bundle_reader_next(&r, &sp, &put, &len, &idx);
        if (k <= 0) {
            rc = k;
            break;
        }
        records++;
        /* A record handed out is whole: inside the input's inflated block,
         * its put file decodes, in a namespace of the header. */
        KC_FUZZ_ASSERT(len >= KC__SPOOL_HDR && idx < info.n_ns);
        KC_FUZZ_ASSERT(strcmp(info.ns[idx].ns, sp.ns) == 0);
        KC_FUZZ_ASSERT(sp.body_len == sp.hdr.body_size && sp.hdr.format == KC_FORMAT_VERSION);
        KC_FUZZ_ASSERT(records <= info.entries);
    }
    KC_FUZZ_ASSERT(rc == 0 || info.why[0] != '\0');
    KC_FUZZ_ASSERT(memchr(info.why, '\n', sizeof info.why) == NULL);
    /* Read to the end: every record, the whole input; verified unless it
     * is signed and there is no signer to check it with. */
    if (rc == 0)
        KC_FUZZ_ASSERT(records == info.entries && info.file_bytes == n &&
                       info.verified == (!info.is_signed || crypto != NULL));
    kc__bundle_reader_free(&r);
    free(info.ns);
    /* The trailer peek (bundle show) on the last bytes. */
    if (n >= KC__BUNDLE_TRAILER) {
        struct kc_bundle_info ti = {0};
        kc__bundle_trailer_peek(p + n - KC__BUNDLE_TRAILER, &ti);
    }
    free(p);
    return 0;
}

/* A bundle of three entries in two namespaces, written with codec and
 * signer, as a seed (mode byte first). */
static int seed(const char *dir, const char *name, unsigned mode, int codec,
                const struct kc_bundle_crypto *crypto)
{
    int fd = memfd_create("seed", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    static const char *nss[2] = {"nvrtc:13.0-abcdef0123456789-f1", "jit:0123456789abcdef"};
    struct kc__buf puts[3] = {{0}};
    kc_key keys[3];
    kc_digest bds[3];
    struct kc_bundle_ns ns[2] = {{.usable = -1}, {.usable = -1}};
    struct kc_bundle_info info = {.created_ns = 1700000000000000000ull,
                                  .n_ns = 2,
                                  .ns = ns,
                                  .key_id = crypto ? crypto->key_id : 0};
    for (int i = 0; i < 3; i++) {
        char body[200];
        int bl = snprintf(body, sizeof body, "//\n.version 8.8\n.target sm_90\n// kernel %d\n%s", i,
                          i == 2 ? ".entry k() { ret; }\n.entry k() { ret; }\n" : "");
        keys[i] = (kc_key){.id = {.lo = 0x1000u + (uint64_t)i, .hi = 0xfeed}, .build = 7};
        struct kc__hdr h = {.kind = i == 1 ? KC_KIND_JIT : KC_KIND_NVRTC,
                            .format = KC_FORMAT_VERSION,
                            .body_size = (uint64_t)bl,
                            .created_ns = 1700000000000000000ull + (uint64_t)i,
                            .body_xxh = kc__body_xxh(body, (size_t)bl)};
        int which = i == 1;
        if (i == 2) {
            /* As the store keeps it (an 'S' put, layout 2): one zstd frame. */
            struct kc_buf st = {0};
            kc__body_encode(body, (size_t)bl, NULL, &st);
            kc__spool_put_encode_stored(&puts[i], nss[which], &keys[i], &keys[i].id, &h, st.p,
                                        st.len);
            bds[i] = kc_digest_of(st.p, st.len);
            ns[which].raw_bytes += KC__BUNDLE_REC_SIZE(puts[i].len - st.len + (uint64_t)bl);
            info.raw_bytes += KC__BUNDLE_REC_SIZE(puts[i].len - st.len + (uint64_t)bl);
            kc_buf_free(&st);
            snprintf(ns[which].ns, sizeof ns[which].ns, "%s", nss[which]);
            ns[which].entries++;
            info.entries++;
            continue;
        }
        kc__spool_put_encode(&puts[i], nss[which], &keys[i], which ? NULL : &keys[i].id, &h, body,
                             (size_t)bl);
        bds[i] = kc_digest_of(body, (size_t)bl);
        snprintf(ns[which].ns, sizeof ns[which].ns, "%s", nss[which]);
        ns[which].entries++;
        ns[which].raw_bytes += KC__BUNDLE_REC_SIZE(puts[i].len);
        info.entries++;
        info.raw_bytes += KC__BUNDLE_REC_SIZE(puts[i].len);
    }
    struct kc__bundle_writer w;
    int rc = kc__bundle_writer_begin(&w, fd, &info, codec, 0, crypto, NULL, 0);
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = kc__bundle_writer_add(&w, nss[i == 1], &keys[i], &bds[i], puts[i].p, puts[i].len);
    uint64_t size = 0;
    if (rc == 0)
        rc = kc__bundle_writer_finish(&w, &size);
    kc__bundle_writer_free(&w);
    for (int i = 0; i < 3; i++)
        kc__buf_free(&puts[i]);
    unsigned char *b = malloc(size + 1);
    if (rc == 0 && (b == NULL || pread(fd, b + 1, size, 0) != (ssize_t)size))
        rc = -EIO;
    close(fd);
    if (rc == 0) {
        b[0] = (unsigned char)mode;
        rc = kc_fuzz_write_seed(dir, name, b, size + 1);
    }
    free(b);
    return rc;
}

int kc_fuzz_seeds(const char *dir)
{
    int count = 0;
    count += seed(dir, "raw", 1, KC_BUNDLE_RAW, NULL) == 0;
    count += seed(dir, "zstd", 0, KC_BUNDLE_ZSTD, NULL) == 0;
    count += seed(dir, "lz4", 0, KC_BUNDLE_LZ4, NULL) == 0;
    count += seed(dir, "raw-signed", 3, KC_BUNDLE_RAW, &stand_in) == 0;
    count += seed(dir, "zstd-signed", 3, KC_BUNDLE_ZSTD, &stand_in) == 0;
    return count;
}
