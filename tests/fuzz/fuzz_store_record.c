/*
 * Fuzz target: the store's record parser (kc_store_admin()->parse_record is
 * kc__parse_record), the record header decoder and the kernels-key splitter
 * (store/local/record.c). Every value read back from RocksDB goes through these.
 *
 * The first input byte picks a mode. Even: the rest is parsed as is. Odd:
 * the target first writes the right header checksum and body digest into
 * the copy (the checksums guard everything else, so a fuzzer that cannot
 * forge them never reaches the size and kind checks behind them).
 */
#include "fuzz.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void check_record(const unsigned char *p, size_t n)
{
    struct kc_record_info info;
    const void *body = NULL;
    size_t blen = 0;
    if (kc__parse_record(p, n, &info, &body, &blen) == 0) {
        KC_FUZZ_ASSERT(n >= KC__HDR_LEN && blen == n - KC__HDR_LEN);
        KC_FUZZ_ASSERT((const unsigned char *)body == p + KC__HDR_LEN);
        KC_FUZZ_ASSERT(info.body_size == blen);
        KC_FUZZ_ASSERT(info.kind >= KC_KIND_NVRTC && info.kind <= KC_KIND_BLOB);
        /* Touch every body byte: a body pointer past the input is caught. */
        volatile unsigned char sum = 0;
        for (size_t i = 0; i < blen; i++)
            sum ^= ((const unsigned char *)body)[i];
        (void)sum;
    }
    struct kc__hdr h;
    if (kc__hdr_decode(p, n, &h) == 0) {
        unsigned char again[KC__HDR_LEN];
        kc__hdr_encode(&h, again);
        KC_FUZZ_ASSERT(memcmp(again, p, KC__HDR_LEN) == 0); /* the header round-trips */
    }
    char ns[KC__NS_MAX + 1];
    kc_key key;
    if (kc__kkey_split(p, n, ns, &key) == 0) {
        KC_FUZZ_ASSERT(kc__ns_ok(ns));
        unsigned char buf[KC__NS_MAX + 1 + KC__KEY_LEN];
        KC_FUZZ_ASSERT(kc__kkey(ns, &key, buf) == n && memcmp(buf, p, n) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int fix = data[0] & 1;
    size_t n = size - 1;
    unsigned char *p = kc_fuzz_dup(data + 1, n);
    if (fix && n >= KC__HDR_LEN) {
        kc_le_put_u64(p + 56, XXH3_64bits(p + KC__HDR_LEN, n - KC__HDR_LEN));
        kc_le_put_u64(p + 64, XXH3_64bits(p, 64));
    }
    check_record(p, n);
    free(p);
    return 0;
}

int kc_fuzz_seeds(const char *dir)
{
    int count = 0;
    static const char *bodies[] = {"", "x", ".version 8.0\n.target sm_90\n", "\177ELF\2\1\1"};
    for (unsigned i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        size_t blen = strlen(bodies[i]);
        struct kc__hdr h = {.kind = 1 + i % 4,
                            .format = KC_FORMAT_VERSION,
                            .body_size = blen,
                            .created_ns = 1700000000000000000ull,
                            .last_hit_ns = 0,
                            .hits = i,
                            .saved_ns = 123456789,
                            .body_xxh = kc__body_xxh(bodies[i], blen)};
        unsigned char *rec = malloc(1 + KC__HDR_LEN + blen);
        rec[0] = (unsigned char)(i & 1); /* raw and checksum-fixing modes */
        kc__hdr_encode(&h, rec + 1);
        memcpy(rec + 1 + KC__HDR_LEN, bodies[i], blen);
        char name[32];
        snprintf(name, sizeof name, "record-%u", i);
        int rc = kc_fuzz_write_seed(dir, name, rec, 1 + KC__HDR_LEN + blen);
        free(rec);
        if (rc < 0)
            return rc;
        count++;
    }
    /* A kernels key. */
    kc_key key = {{0x1122334455667788ull, 0x99aabbccddeeff00ull}, 42};
    unsigned char kk[1 + KC__NS_MAX + 1 + KC__KEY_LEN];
    kk[0] = 0;
    size_t kn = kc__kkey("nvrtc:13.0-0123456789abcdef-f1", &key, kk + 1);
    if (kc_fuzz_write_seed(dir, "kkey", kk, kn + 1) == 0)
        count++;
    return count;
}
