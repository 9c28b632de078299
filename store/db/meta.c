/*
 * meta.c: encoding and decoding the database's keys and values, as meta.h
 * lays them out. The owner's files write through these and the readers
 * (store.c, db.c) read through them, so a layout is spelled once.
 */
#include "meta.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool kc__meta_is(const void *k, size_t kl, const char *prefix)
{
    size_t n = strlen(prefix);
    return kl >= n && memcmp(k, prefix, n) == 0;
}

/* prefix then name: the counters and namespace keys. */
static size_t name_key(const char *prefix, const char *name, unsigned char *out)
{
    size_t n = strlen(name);
    memcpy(out, prefix, 2);
    memcpy(out + 2, name, n);
    return 2 + n;
}

size_t kc__meta_ref_key(const unsigned char digest[16], unsigned char out[KC__META_REF_KEY_LEN])
{
    memcpy(out, KC__META_REF_PREFIX, 2);
    memcpy(out + 2, digest, 16);
    return KC__META_REF_KEY_LEN;
}

void kc__meta_ref_value(uint64_t refs, uint64_t size, unsigned char out[KC__META_REF_VAL_LEN])
{
    kc__put_u64(out, refs);
    kc__put_u64(out + 8, size);
}

int kc__meta_ref_parse(const void *v, size_t vl, uint64_t *refs, uint64_t *size)
{
    if (vl != KC__META_REF_VAL_LEN)
        return -EBADMSG;
    if (refs != NULL)
        *refs = kc__get_u64(v);
    if (size != NULL)
        *size = kc__get_u64((const unsigned char *)v + 8);
    return 0;
}

size_t kc__meta_counters_key(const char *backend, unsigned char out[KC__META_NAME_KEY_MAX])
{
    return name_key(KC__META_COUNTERS_PREFIX, backend, out);
}

int kc__meta_counters_name(const void *k, size_t kl, char *name, size_t cap)
{
    if (!kc__meta_is(k, kl, KC__META_COUNTERS_PREFIX) || kl == 2 || kl - 2 >= cap)
        return -EBADMSG;
    memcpy(name, (const char *)k + 2, kl - 2);
    name[kl - 2] = 0;
    return 0;
}

void kc__meta_counters_value(const uint64_t c[KC_N_COUNTERS],
                             unsigned char out[KC__META_COUNTERS_VAL_LEN])
{
    for (int i = 0; i < KC_N_COUNTERS; i++)
        kc__put_u64(out + 8 * i, c[i]);
}

int kc__meta_counters_parse(const void *v, size_t vl, uint64_t c[KC_N_COUNTERS])
{
    if (vl != KC__META_COUNTERS_VAL_LEN)
        return -EBADMSG;
    for (int i = 0; i < KC_N_COUNTERS; i++)
        c[i] = kc__get_u64((const unsigned char *)v + 8 * i);
    return 0;
}

size_t kc__meta_applied_key(const char *name, unsigned char out[KC__META_APPLIED_KEY_MAX])
{
    size_t n = strnlen(name, KC__META_APPLIED_KEY_MAX - 2);
    memcpy(out, KC__META_APPLIED_PREFIX, 2);
    memcpy(out + 2, name, n);
    return 2 + n;
}

size_t kc__meta_ns_key(const char *ns, unsigned char out[KC__META_NAME_KEY_MAX])
{
    return name_key(KC__META_NS_PREFIX, ns, out);
}

void kc__meta_gen_value(uint64_t gen, unsigned char out[KC__META_GEN_VAL_LEN])
{
    kc__put_u64(out, gen);
}

void kc__kval_encode(const struct kc__hdr *h, const unsigned char digest[16],
                     unsigned char out[KC__KVAL_LEN])
{
    kc__hdr_encode(h, out);
    memcpy(out + KC__HDR_LEN, digest, 16);
}

int kc__kval_decode(const void *v, size_t vl, struct kc__hdr *h)
{
    if (vl != KC__KVAL_LEN || kc__hdr_decode(v, vl, h) != 0)
        return -EBADMSG;
    return 0;
}

const unsigned char *kc__kval_digest(const void *v, size_t vl)
{
    return vl == KC__KVAL_LEN ? (const unsigned char *)v + KC__HDR_LEN : NULL;
}

int kc__skey_split(const void *k, size_t kl, char ns[KC__NS_MAX + 1], kc_digest *src)
{
    const unsigned char *p = k;
    const unsigned char *z = memchr(p, 0, kl);
    if (z == NULL || z == p || (size_t)(z - p) > KC__NS_MAX || kl != (size_t)(z - p) + 1 + 16)
        return -EBADMSG;
    memcpy(ns, p, (size_t)(z - p));
    ns[z - p] = 0;
    kc__digest_decode(z + 1, src);
    return 0;
}

size_t kc__meta_dict_key(uint64_t id, unsigned char out[KC__META_DICT_KEY_LEN])
{
    memcpy(out, KC__META_DICT_PREFIX, 2);
    kc_le_put_u64(out + 2, id);
    return KC__META_DICT_KEY_LEN;
}
