/*
 * Fuzz target: the store's spool-file decoders (store/local/record.c):
 * kc__spool_check, kc__spool_put_decode and kc__spool_item_next for purge,
 * hit and counter files. The owner reads every file another process left in
 * DIR/spool through these, so they must take any bytes.
 *
 * First input byte: bit 0 set makes the target write the right payload
 * length and checksum into the spool header (and, for a put, the inner
 * record's checksums) so the decoders behind the checksums are reached;
 * bits 1-2 pick the item type tried on the raw payload.
 */
#include "fuzz.h"

#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define PUT_FIXED (8 + KC__KEY_LEN + 16)

static void fix_checksums(unsigned char *p, size_t n)
{
    if (n < KC__SPOOL_HDR)
        return;
    size_t plen = n - KC__SPOOL_HDR;
    unsigned char *pl = p + KC__SPOOL_HDR;
    if (p[4] == KC__SP_PUT && plen >= PUT_FIXED) {
        size_t nslen = kc_le_get_u16(pl);
        if (nslen <= plen - PUT_FIXED && plen - PUT_FIXED - nslen >= KC__HDR_LEN) {
            unsigned char *rec = pl + PUT_FIXED + nslen;
            size_t rlen = plen - PUT_FIXED - nslen;
            kc_le_put_u64(rec + 56, XXH3_64bits(rec + KC__HDR_LEN, rlen - KC__HDR_LEN));
            kc_le_put_u64(rec + 64, XXH3_64bits(rec, 64));
        }
    }
    kc_le_put_u64(p + 8, plen);
    kc_le_put_u64(p + 16, XXH3_64bits(pl, plen));
}

static void walk_items(int type, const unsigned char *p, const unsigned char *end)
{
    struct kc__sp_item it;
    int rc, guard = 0;
    while ((rc = kc__spool_item_next(type, &p, end, &it)) == 1) {
        KC_FUZZ_ASSERT(p <= end);
        KC_FUZZ_ASSERT(kc__ns_ok(it.ns));
        KC_FUZZ_ASSERT(++guard <= 1 << 20); /* progress: every item consumes bytes */
    }
    KC_FUZZ_ASSERT(rc == 0 || rc == -EBADMSG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    unsigned mode = data[0];
    size_t n = size - 1;
    unsigned char *p = kc_fuzz_dup(data + 1, n);
    if (mode & 1)
        fix_checksums(p, n);

    int type;
    const unsigned char *payload;
    size_t plen;
    if (kc__spool_check(p, n, &type, &payload, &plen) == 0) {
        KC_FUZZ_ASSERT(payload == p + KC__SPOOL_HDR && plen == n - KC__SPOOL_HDR);
        if (type != KC__SP_PUT)
            walk_items(type, payload, payload + plen);
    }
    struct kc__sp_put put;
    if (kc__spool_put_decode(p, n, &put) == 0) {
        KC_FUZZ_ASSERT(put.record >= p && put.record + put.record_len == p + n);
        KC_FUZZ_ASSERT(put.body == put.record + KC__HDR_LEN &&
                       put.body_len == put.record_len - KC__HDR_LEN);
        KC_FUZZ_ASSERT(put.hdr.body_size == put.body_len && kc__ns_ok(put.ns));
        /* Re-encoding what was decoded (its flags too) gives the same
         * file (the source bytes of a put without one are not canonical:
         * skip those). */
        struct kc_buf b = {0};
        if (!put.has_source && (put.source.lo || put.source.hi))
            goto items;
        kc__spool_put_encode_upload(
            &b, put.ns, &put.key, put.has_source ? &put.source : NULL, &put.hdr, put.body,
            put.body_len, put.from_remote ? KC__PUT_FROM_REMOTE : 0, put.upload, put.upload_len);
        KC_FUZZ_ASSERT(b.err == 0 && b.len == n && memcmp(b.p, p, n) == 0);
        kc_buf_free(&b);
    }
items:;
    /* The item decoders on the raw bytes too (the owner calls them only
     * after kc__spool_check, but they bound themselves). */
    static const int types[] = {KC__SP_PURGE, KC__SP_HITS, KC__SP_COUNT, KC__SP_PUT};
    walk_items(types[(mode >> 1) & 3], p, p + n);
    free(p);
    return 0;
}

static int seed(const char *dir, const char *name, unsigned mode, struct kc_buf *b)
{
    unsigned char *f = malloc(b->len + 1);
    f[0] = (unsigned char)mode;
    memcpy(f + 1, b->p, b->len);
    int rc = kc_fuzz_write_seed(dir, name, f, b->len + 1);
    free(f);
    kc_buf_free(b);
    return rc;
}

int kc_fuzz_seeds(const char *dir)
{
    int count = 0;
    kc_key key = {{0x0123456789abcdefull, 0xfedcba9876543210ull}, 7};
    kc_digest src = {0x1111, 0x2222};
    static const char body[] = "//\n.version 8.8\n.target sm_90\n.address_size 64\n";
    struct kc__hdr h = {.kind = KC_KIND_NVRTC,
                        .format = KC_FORMAT_VERSION,
                        .body_size = sizeof body - 1,
                        .created_ns = 1700000000000000000ull,
                        .saved_ns = 5000000,
                        .body_xxh = kc__body_xxh(body, sizeof body - 1)};
    struct kc_buf b = {0};
    kc__spool_put_encode(&b, "nvrtc:13.0-abcdef0123456789-f1", &key, &src, &h, body,
                         sizeof body - 1);
    if (seed(dir, "put-source", 0, &b) == 0)
        count++;
    kc__spool_put_encode(&b, "jit:0123456789abcdef", &key, NULL, &h, body, sizeof body - 1);
    if (seed(dir, "put", 1, &b) == 0)
        count++;
    static const int types[] = {KC__SP_PURGE, KC__SP_HITS, KC__SP_COUNT};
    static const char *names[] = {"purge", "hits", "counters"};
    for (int t = 0; t < 3; t++) {
        kc__spool_begin(&b, types[t]);
        for (int i = 0; i < 3; i++) {
            struct kc__sp_item it = {
                .flags = (uint32_t)(t == 0 ? KC__PF_KEY | (i == 2 ? KC__PF_IFBAD : 0) : 0),
                .key = key,
                .source = src,
                .a = 1000u + (unsigned)i,
                .b = 2000};
            snprintf(it.ns, sizeof it.ns, t == 2 ? (i ? "jit" : "nvrtc") : "nvrtc:ns-%d", i);
            it.c.hits = 3;
            it.c.misses = 1;
            it.c.saved_ns = 99;
            kc__spool_item_add(&b, types[t], &it);
        }
        kc__spool_end(&b);
        if (seed(dir, names[t], (unsigned)(t << 1), &b) == 0)
            count++;
    }
    return count;
}
