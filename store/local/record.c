/*
 * record.c: the byte layouts of records, keys and spool files, and their
 * parsers. Every parser here takes any bytes (they are fuzzed) and answers
 * -EBADMSG rather than reading past what it was given.
 */
#include "local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void kc__put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

void kc__put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

void kc__put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint16_t kc__get_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

uint32_t kc__get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t kc__get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void kc__key_encode(const kc_key *k, unsigned char out[KC__KEY_LEN])
{
    kc__put_u64(out, k->id.lo);
    kc__put_u64(out + 8, k->id.hi);
    kc__put_u64(out + 16, k->build);
}

void kc__key_decode(const unsigned char in[KC__KEY_LEN], kc_key *k)
{
    k->id.lo = kc__get_u64(in);
    k->id.hi = kc__get_u64(in + 8);
    k->build = kc__get_u64(in + 16);
}

void kc__digest_encode(const kc_digest *d, unsigned char out[16])
{
    kc__put_u64(out, d->lo);
    kc__put_u64(out + 8, d->hi);
}

void kc__digest_decode(const unsigned char in[16], kc_digest *d)
{
    d->lo = kc__get_u64(in);
    d->hi = kc__get_u64(in + 8);
}

uint64_t kc__body_xxh(const void *body, size_t len)
{
    return XXH3_64bits(body, len);
}

bool kc__ns_ok(const char *ns)
{
    if (ns == NULL)
        return false;
    size_t n = strnlen(ns, KC__NS_MAX + 1);
    return n >= 1 && n <= KC__NS_MAX;
}

size_t kc__kkey(const char *ns, const kc_key *key, unsigned char *buf)
{
    size_t n = strlen(ns);
    memcpy(buf, ns, n);
    buf[n] = 0;
    kc__key_encode(key, buf + n + 1);
    return n + 1 + KC__KEY_LEN;
}

size_t kc__skey(const char *ns, const kc_digest *src, unsigned char *buf)
{
    size_t n = strlen(ns);
    memcpy(buf, ns, n);
    buf[n] = 0;
    kc__digest_encode(src, buf + n + 1);
    return n + 1 + 16;
}

int kc__kkey_split(const unsigned char *k, size_t len, char ns[KC__NS_MAX + 1], kc_key *key)
{
    if (len < KC__KEY_LEN + 2 || len > KC__KEY_LEN + 1 + KC__NS_MAX)
        return -EBADMSG;
    size_t n = len - KC__KEY_LEN - 1;
    if (k[n] != 0 || memchr(k, 0, n) != NULL)
        return -EBADMSG;
    memcpy(ns, k, n);
    ns[n] = 0;
    kc__key_decode(k + n + 1, key);
    return 0;
}

/* ---- record header ----------------------------------------------------- */

void kc__hdr_encode(const struct kc__hdr *h, unsigned char out[KC__HDR_LEN])
{
    kc__put_u32(out, KC__RECORD_MAGIC);
    kc__put_u16(out + 4, (uint16_t)h->format);
    kc__put_u16(out + 6, KC__HDR_LEN);
    kc__put_u32(out + 8, h->kind);
    kc__put_u32(out + 12, 0);
    kc__put_u64(out + 16, h->body_size);
    kc__put_u64(out + 24, h->created_ns);
    kc__put_u64(out + 32, h->last_hit_ns);
    kc__put_u64(out + 40, h->hits);
    kc__put_u64(out + 48, h->saved_ns);
    kc__put_u64(out + 56, h->body_xxh);
    kc__put_u64(out + 64, XXH3_64bits(out, 64));
}

int kc__hdr_decode(const void *buf, size_t len, struct kc__hdr *h)
{
    const unsigned char *p = buf;
    if (buf == NULL || len < KC__HDR_LEN)
        return -EBADMSG;
    if (kc__get_u32(p) != KC__RECORD_MAGIC || kc__get_u16(p + 4) != KC_FORMAT_VERSION ||
        kc__get_u16(p + 6) != KC__HDR_LEN || kc__get_u32(p + 12) != 0)
        return -EBADMSG;
    if (kc__get_u64(p + 64) != XXH3_64bits(p, 64))
        return -EBADMSG;
    h->format = kc__get_u16(p + 4);
    h->kind = kc__get_u32(p + 8);
    h->body_size = kc__get_u64(p + 16);
    h->created_ns = kc__get_u64(p + 24);
    h->last_hit_ns = kc__get_u64(p + 32);
    h->hits = kc__get_u64(p + 40);
    h->saved_ns = kc__get_u64(p + 48);
    h->body_xxh = kc__get_u64(p + 56);
    if (h->kind < KC_KIND_NVRTC || h->kind > KC_KIND_BLOB)
        return -EBADMSG;
    return 0;
}

void kc__hdr_to_info(const struct kc__hdr *h, struct kc_record_info *info)
{
    if (info == NULL)
        return;
    info->kind = h->kind;
    info->format = h->format;
    info->body_size = h->body_size;
    info->created = h->created_ns / 1000000000u;
    info->last_hit = h->last_hit_ns / 1000000000u;
    info->hits = h->hits;
    info->saved_ns = h->saved_ns;
}

int kc__parse_record(const void *rec, size_t len, struct kc_record_info *info, const void **body,
                     size_t *body_len)
{
    struct kc__hdr h;
    if (kc__hdr_decode(rec, len, &h) != 0)
        return -EBADMSG;
    if (h.body_size != len - KC__HDR_LEN)
        return -EBADMSG;
    const unsigned char *b = (const unsigned char *)rec + KC__HDR_LEN;
    if (kc__body_xxh(b, len - KC__HDR_LEN) != h.body_xxh)
        return -EBADMSG;
    kc__hdr_to_info(&h, info);
    if (body != NULL)
        *body = b;
    if (body_len != NULL)
        *body_len = len - KC__HDR_LEN;
    return 0;
}

/* ---- buffers ----------------------------------------------------------- */

void kc__buf_add(struct kc__buf *b, const void *p, size_t n)
{
    if (b->err)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->err = -ENOMEM;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

void kc__buf_free(struct kc__buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- spool files ------------------------------------------------------- */

/* Spool file: magic u32, type u8, version u8, pad u16, payload length u64,
 * XXH3-64 of the payload u64, then the payload. */
void kc__spool_begin(struct kc__buf *b, int type)
{
    unsigned char h[KC__SPOOL_HDR] = {0};
    kc__put_u32(h, KC__SPOOL_MAGIC);
    h[4] = (unsigned char)type;
    h[5] = 1;
    kc__buf_add(b, h, sizeof h);
}

void kc__spool_end(struct kc__buf *b)
{
    if (b->err || b->len < KC__SPOOL_HDR)
        return;
    size_t plen = b->len - KC__SPOOL_HDR;
    kc__put_u64(b->p + 8, plen);
    kc__put_u64(b->p + 16, XXH3_64bits(b->p + KC__SPOOL_HDR, plen));
}

int kc__spool_check(const void *file, size_t len, int *type, const unsigned char **payload,
                    size_t *plen)
{
    const unsigned char *p = file;
    if (p == NULL || len < KC__SPOOL_HDR)
        return -EBADMSG;
    if (kc__get_u32(p) != KC__SPOOL_MAGIC || p[5] != 1 || p[6] != 0 || p[7] != 0)
        return -EBADMSG;
    uint64_t n = kc__get_u64(p + 8);
    if (n != len - KC__SPOOL_HDR)
        return -EBADMSG;
    if (kc__get_u64(p + 16) != XXH3_64bits(p + KC__SPOOL_HDR, n))
        return -EBADMSG;
    int t = p[4];
    if (t != KC__SP_PUT && t != KC__SP_PACKED && t != KC__SP_PURGE && t != KC__SP_HITS &&
        t != KC__SP_COUNT)
        return -EBADMSG;
    *type = t;
    *payload = p + KC__SPOOL_HDR;
    *plen = n;
    return 0;
}

/* Put payload: ns_len u16, flags u16, pad u32, key 24, source 16, ns, record. */
#define PUT_FIXED (8 + KC__KEY_LEN + 16)

static int put_encode(struct kc__buf *b, int type, const char *ns, const kc_key *key,
                      const kc_digest *source, const struct kc__hdr *h, const void *bytes,
                      size_t len)
{
    unsigned char f[PUT_FIXED] = {0};
    size_t n = strlen(ns);
    kc__put_u16(f, (uint16_t)n);
    kc__put_u16(f + 2, source ? KC__PF_SOURCE : 0);
    kc__key_encode(key, f + 8);
    if (source)
        kc__digest_encode(source, f + 8 + KC__KEY_LEN);
    unsigned char hb[KC__HDR_LEN];
    kc__hdr_encode(h, hb);
    kc__spool_begin(b, type);
    kc__buf_add(b, f, sizeof f);
    kc__buf_add(b, ns, n);
    kc__buf_add(b, hb, sizeof hb);
    kc__buf_add(b, bytes, len);
    kc__spool_end(b);
    return b->err;
}

int kc__spool_put_encode(struct kc__buf *b, const char *ns, const kc_key *key,
                         const kc_digest *source, const struct kc__hdr *h, const void *body,
                         size_t len)
{
    return put_encode(b, KC__SP_PUT, ns, key, source, h, body, len);
}

int kc__spool_put_pack(struct kc__buf *b, const struct kc__sp_put *sp, const void *packed,
                       size_t plen)
{
    return put_encode(b, KC__SP_PACKED, sp->ns, &sp->key, sp->has_source ? &sp->source : NULL,
                      &sp->hdr, packed, plen);
}

/* The put payload's fixed part, namespace and record header; out->record
 * and record_len: everything after the namespace. */
static int put_head(const unsigned char *p, size_t n, struct kc__sp_put *out)
{
    if (n < PUT_FIXED)
        return -EBADMSG;
    size_t nslen = kc__get_u16(p);
    uint16_t flags = kc__get_u16(p + 2);
    if (nslen < 1 || nslen > KC__NS_MAX || (flags & ~KC__PF_SOURCE) != 0 ||
        kc__get_u32(p + 4) != 0)
        return -EBADMSG;
    if (n - PUT_FIXED < nslen)
        return -EBADMSG;
    const unsigned char *nsp = p + PUT_FIXED;
    if (memchr(nsp, 0, nslen) != NULL)
        return -EBADMSG;
    memcpy(out->ns, nsp, nslen);
    out->ns[nslen] = 0;
    kc__key_decode(p + 8, &out->key);
    out->has_source = (flags & KC__PF_SOURCE) != 0;
    kc__digest_decode(p + 8 + KC__KEY_LEN, &out->source);
    out->record = nsp + nslen;
    out->record_len = n - PUT_FIXED - nslen;
    return kc__hdr_decode(out->record, out->record_len, &out->hdr) != 0 ? -EBADMSG : 0;
}

int kc__spool_put_decode(const void *file, size_t len, struct kc__sp_put *out)
{
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(file, len, &type, &p, &n) != 0 || type != KC__SP_PUT)
        return -EBADMSG;
    if (put_head(p, n, out) != 0)
        return -EBADMSG;
    const void *body;
    size_t blen;
    if (kc__parse_record(out->record, out->record_len, NULL, &body, &blen) != 0)
        return -EBADMSG;
    out->body = body;
    out->body_len = blen;
    return 0;
}

/* ---- packed puts ----------------------------------------------------------
 * A packed put ('Z') is a put whose body is one LZ4 block
 * (lz4_Block_format.md) of hdr.body_size bytes; the owner writes its hot
 * files so. Unpacking rebuilds the plain put, which is then decoded and
 * checked (body checksum included) as any other. */

/* An LZ4 length continuation: bytes added while they are 255. */
static int lz4_more(const unsigned char **ip, const unsigned char *end, size_t *len)
{
    unsigned b;
    do {
        if (*ip >= end || *len > SIZE_MAX - 255)
            return -EBADMSG;
        b = *(*ip)++;
        *len += b;
    } while (b == 255);
    return 0;
}

int kc__lz4_unpack(const void *src, size_t n, void *dst, size_t cap)
{
    const unsigned char *ip = src, *const iend = ip + n;
    unsigned char *op = dst, *const o0 = dst, *const oend = op + cap;
    for (;;) {
        if (ip >= iend)
            return -EBADMSG;
        unsigned tok = *ip++;
        size_t lit = tok >> 4;
        if (lit < 15 && (size_t)(iend - ip) >= 16 + 2 && (size_t)(oend - op) >= 16) {
            /* Short literals with room on both sides: 16 bytes copied at
             * once (what lies past them is written over later). */
            memcpy(op, ip, 16);
            op += lit;
            ip += lit;
        } else {
            if (lit == 15 && lz4_more(&ip, iend, &lit) != 0)
                return -EBADMSG;
            if (lit > (size_t)(iend - ip) || lit > (size_t)(oend - op))
                return -EBADMSG;
            if (lit > 0)
                memcpy(op, ip, lit);
            op += lit;
            ip += lit;
            if (ip == iend) /* the last sequence has literals only */
                break;
        }
        if (iend - ip < 2)
            return -EBADMSG;
        size_t off = (size_t)ip[0] | (size_t)ip[1] << 8;
        ip += 2;
        if (off == 0 || off > (size_t)(op - o0))
            return -EBADMSG;
        size_t m = tok & 15;
        if (m == 15 && lz4_more(&ip, iend, &m) != 0)
            return -EBADMSG;
        if ((size_t)(oend - op) < 4 || m > (size_t)(oend - op) - 4)
            return -EBADMSG;
        m += 4;
        const unsigned char *from = op - off;
        unsigned char *end = op + m;
        if ((size_t)(oend - op) >= m + 8) {
            /* 8 bytes at a time, reading only bytes already final: from
             * `step` back, the least multiple of off that is >= 8 (the
             * match repeats with period off), once the first step - off
             * bytes are copied one by one. The last chunk may run up to 7
             * bytes past the match. */
            size_t step = off >= 8 ? off : off * ((8 + off - 1) / off);
            size_t k = step - off < m ? step - off : m;
            for (size_t i = 0; i < k; i++)
                op[i] = from[i];
            op += k;
            if (op < end) {
                from = op - step;
                do {
                    memcpy(op, from, 8);
                    op += 8;
                    from += 8;
                } while (op < end);
            }
        } else if (off >= m) {
            memcpy(op, from, m);
        } else { /* overlapping: a repeat of the last off bytes */
            for (size_t i = 0; i < m; i++)
                op[i] = from[i];
        }
        op = end;
    }
    return op == oend ? 0 : -EBADMSG;
}

/* An LZ4 block grows at most 255:1 (a match length byte of 255 stands
 * for 255 bytes); a header claiming more is not ours. */
#define LZ4_MAX_RATIO 255

/* A packed put file unpacked: *out (malloc'd) holds the plain put file it
 * stands for, and sp points into it, all checked as kc__spool_put_decode
 * checks a plain one (the body checksum after unpacking). Its spool header
 * says 'P' and its length, but its checksum is not recomputed: the packed
 * file's was checked, and the body's is. */
static int put_unpack(const void *file, size_t len, unsigned char **out, size_t *outlen,
                      struct kc__sp_put *sp)
{
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(file, len, &type, &p, &n) != 0 || type != KC__SP_PACKED ||
        put_head(p, n, sp) != 0)
        return -EBADMSG;
    const unsigned char *packed = sp->record + KC__HDR_LEN;
    size_t plen = sp->record_len - KC__HDR_LEN;
    if (sp->hdr.body_size > (uint64_t)plen * LZ4_MAX_RATIO + 16)
        return -EBADMSG;
    size_t head = (size_t)(packed - (const unsigned char *)file), body = (size_t)sp->hdr.body_size;
    unsigned char *b = malloc(head + body + 1);
    if (b == NULL)
        return -ENOMEM;
    memcpy(b, file, head);
    if (kc__lz4_unpack(packed, plen, b + head, body) != 0) {
        free(b);
        return -EBADMSG;
    }
    b[4] = KC__SP_PUT;
    kc__put_u64(b + 8, head + body - KC__SPOOL_HDR);
    const void *bp;
    if (put_head(b + KC__SPOOL_HDR, head + body - KC__SPOOL_HDR, sp) != 0 ||
        kc__parse_record(sp->record, sp->record_len, NULL, &bp, &sp->body_len) != 0) {
        free(b);
        return -EBADMSG;
    }
    sp->body = bp;
    *out = b;
    *outlen = head + body;
    return 0;
}

int kc__put_decode_any(unsigned char **file, size_t *len, struct kc__sp_put *out)
{
    if (*len > 4 && (*file)[4] == KC__SP_PACKED) {
        unsigned char *b;
        size_t n;
        int rc = put_unpack(*file, *len, &b, &n, out);
        if (rc != 0)
            return rc;
        free(*file);
        *file = b;
        *len = n;
        return 0;
    }
    return kc__spool_put_decode(*file, *len, out) != 0 ? -EBADMSG : 0;
}

/* Items: name_len u16, pad u16, flags u32, key 24, source 16, a u64, b u64,
 * [counters: 7 u64], name. */
#define ITEM_FIXED (8 + KC__KEY_LEN + 16 + 16)
#define ITEM_COUNTERS (KC_N_COUNTERS * 8)

void kc__spool_item_add(struct kc__buf *b, int type, const struct kc__sp_item *it)
{
    unsigned char f[ITEM_FIXED + ITEM_COUNTERS] = {0};
    size_t n = strnlen(it->ns, KC__NS_MAX);
    kc__put_u16(f, (uint16_t)n);
    kc__put_u32(f + 4, it->flags);
    kc__key_encode(&it->key, f + 8);
    kc__digest_encode(&it->source, f + 8 + KC__KEY_LEN);
    kc__put_u64(f + 8 + KC__KEY_LEN + 16, it->a);
    kc__put_u64(f + 8 + KC__KEY_LEN + 24, it->b);
    size_t fl = ITEM_FIXED;
    if (type == KC__SP_COUNT) {
        uint64_t v[KC_N_COUNTERS];
        kc_counters_to_array(&it->c, v);
        for (int i = 0; i < KC_N_COUNTERS; i++)
            kc__put_u64(f + ITEM_FIXED + 8 * i, v[i]);
        fl += ITEM_COUNTERS;
    }
    kc__buf_add(b, f, fl);
    kc__buf_add(b, it->ns, n);
}

int kc__spool_item_next(int type, const unsigned char **pp, const unsigned char *end,
                        struct kc__sp_item *it)
{
    const unsigned char *p = *pp;
    if (p == end)
        return 0;
    size_t fl = ITEM_FIXED + (type == KC__SP_COUNT ? ITEM_COUNTERS : 0);
    if ((size_t)(end - p) < fl)
        return -EBADMSG;
    size_t n = kc__get_u16(p);
    if (n < 1 || n > KC__NS_MAX || kc__get_u16(p + 2) != 0 || (size_t)(end - p) - fl < n)
        return -EBADMSG;
    memset(it, 0, sizeof *it);
    if (memchr(p + fl, 0, n) != NULL)
        return -EBADMSG;
    memcpy(it->ns, p + fl, n);
    it->ns[n] = 0;
    it->flags = kc__get_u32(p + 4);
    kc__key_decode(p + 8, &it->key);
    kc__digest_decode(p + 8 + KC__KEY_LEN, &it->source);
    it->a = kc__get_u64(p + 8 + KC__KEY_LEN + 16);
    it->b = kc__get_u64(p + 8 + KC__KEY_LEN + 24);
    if (type == KC__SP_COUNT) {
        uint64_t v[KC_N_COUNTERS];
        for (int i = 0; i < KC_N_COUNTERS; i++)
            v[i] = kc__get_u64(p + ITEM_FIXED + 8 * i);
        kc_counters_from_array(&it->c, v);
    }
    *pp = p + fl + n;
    return 1;
}
