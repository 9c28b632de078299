/*
 * record.c: the byte layouts of records, keys and spool files, and their
 * parsers. Every integer is little-endian (common/buf.h). Every parser here
 * takes any bytes (they are fuzzed) and answers -EBADMSG rather than
 * reading past what it was given.
 */
#include "local.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void kc__key_encode(const kc_key *k, unsigned char out[KC__KEY_LEN])
{
    kc_le_put_u64(out, k->id.lo);
    kc_le_put_u64(out + 8, k->id.hi);
    kc_le_put_u64(out + 16, k->build);
}

void kc__key_decode(const unsigned char in[KC__KEY_LEN], kc_key *k)
{
    k->id.lo = kc_le_get_u64(in);
    k->id.hi = kc_le_get_u64(in + 8);
    k->build = kc_le_get_u64(in + 16);
}

void kc__digest_encode(const kc_digest *d, unsigned char out[16])
{
    kc_le_put_u64(out, d->lo);
    kc_le_put_u64(out + 8, d->hi);
}

void kc__digest_decode(const unsigned char in[16], kc_digest *d)
{
    d->lo = kc_le_get_u64(in);
    d->hi = kc_le_get_u64(in + 8);
}

/* A key and a digest through the buffer and the reader (the same bytes
 * as kc__key_encode and kc__digest_encode). */
static void put_key(struct kc_buf *b, const kc_key *k)
{
    kc_buf_put_u64(b, k->id.lo);
    kc_buf_put_u64(b, k->id.hi);
    kc_buf_put_u64(b, k->build);
}

static void put_digest(struct kc_buf *b, const kc_digest *d)
{
    kc_buf_put_u64(b, d->lo);
    kc_buf_put_u64(b, d->hi);
}

static void get_key(struct kc_rd *r, kc_key *k)
{
    k->id.lo = kc_rd_get_u64(r);
    k->id.hi = kc_rd_get_u64(r);
    k->build = kc_rd_get_u64(r);
}

static void get_digest(struct kc_rd *r, kc_digest *d)
{
    d->lo = kc_rd_get_u64(r);
    d->hi = kc_rd_get_u64(r);
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
    kc_le_put_u32(out, KC__RECORD_MAGIC);
    kc_le_put_u16(out + 4, (uint16_t)h->format);
    kc_le_put_u16(out + 6, KC__HDR_LEN);
    kc_le_put_u32(out + 8, h->kind);
    kc_le_put_u32(out + 12, h->prov);
    kc_le_put_u64(out + 16, h->body_size);
    kc_le_put_u64(out + 24, h->created_ns);
    kc_le_put_u64(out + 32, h->last_hit_ns);
    kc_le_put_u64(out + 40, h->hits);
    kc_le_put_u64(out + 48, h->saved_ns);
    kc_le_put_u64(out + 56, h->body_xxh);
    kc_le_put_u64(out + 64, XXH3_64bits(out, 64));
}

int kc__hdr_decode(const void *buf, size_t len, struct kc__hdr *h)
{
    const unsigned char *p = buf;
    if (buf == NULL || len < KC__HDR_LEN)
        return -EBADMSG;
    if (kc_le_get_u32(p) != KC__RECORD_MAGIC || kc_le_get_u16(p + 4) != KC_FORMAT_VERSION ||
        kc_le_get_u16(p + 6) != KC__HDR_LEN || KC_PROV_CODE(kc_le_get_u32(p + 12)) > KC_PROV_MAX)
        return -EBADMSG;
    if (kc_le_get_u64(p + 64) != XXH3_64bits(p, 64))
        return -EBADMSG;
    h->format = kc_le_get_u16(p + 4);
    h->kind = kc_le_get_u32(p + 8);
    h->body_size = kc_le_get_u64(p + 16);
    h->created_ns = kc_le_get_u64(p + 24);
    h->last_hit_ns = kc_le_get_u64(p + 32);
    h->hits = kc_le_get_u64(p + 40);
    h->saved_ns = kc_le_get_u64(p + 48);
    h->body_xxh = kc_le_get_u64(p + 56);
    h->prov = kc_le_get_u32(p + 12);
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
    info->prov = h->prov;
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

/* ---- spool files ------------------------------------------------------- */

/* Spool file: magic u32, type u8, version u8 (1), pad u16, payload length
 * u64, XXH3-64 of the payload u64, then the payload. */
size_t kc__spool_begin(struct kc_buf *b, int type)
{
    size_t start = b->len;
    kc_buf_put_u32(b, KC__SPOOL_MAGIC);
    kc_buf_put_u8(b, (uint8_t)type);
    kc_buf_put_u8(b, 1);
    kc_buf_put_u16(b, 0);
    kc_buf_put_u64(b, 0); /* payload length and checksum: kc__spool_end */
    kc_buf_put_u64(b, 0);
    return start;
}

void kc__spool_end_at(struct kc_buf *b, size_t start)
{
    if (b->err || b->len < start + KC__SPOOL_HDR)
        return;
    unsigned char *f = b->p + start;
    size_t plen = b->len - start - KC__SPOOL_HDR;
    kc_le_put_u64(f + 8, plen);
    kc_le_put_u64(f + 16, XXH3_64bits(f + KC__SPOOL_HDR, plen));
}

void kc__spool_end(struct kc_buf *b)
{
    kc__spool_end_at(b, 0);
}

int kc__spool_check(const void *file, size_t len, int *type, const unsigned char **payload,
                    size_t *plen)
{
    struct kc_rd r;
    kc_rd_init(&r, file, len);
    uint32_t magic = kc_rd_get_u32(&r);
    int t = kc_rd_get_u8(&r);
    uint8_t version = kc_rd_get_u8(&r);
    uint16_t pad = kc_rd_get_u16(&r);
    uint64_t n = kc_rd_get_u64(&r);
    uint64_t sum = kc_rd_get_u64(&r);
    if (r.bad || magic != KC__SPOOL_MAGIC || version != 1 || pad != 0 || n != kc_rd_left(&r))
        return -EBADMSG;
    const unsigned char *p = kc_rd_take(&r, (size_t)n);
    if (sum != XXH3_64bits(p, n))
        return -EBADMSG;
    if (t != KC__SP_PUT && t != KC__SP_PACKED && t != KC__SP_STORED && t != KC__SP_ENTRY &&
        t != KC__SP_PURGE && t != KC__SP_HITS && t != KC__SP_COUNT)
        return -EBADMSG;
    *type = t;
    *payload = p;
    *plen = n;
    return 0;
}

/* Put payload: ns_len u16, flags u16, pad u32, key 24, source 16 (zero
 * without KC__PF_SOURCE), ns, [upload], record. Flags: KC__PF_SOURCE,
 * KC__PUT_FROM_REMOTE for an entry served by the remote tier (the owner does
 * not upload it again), KC__PUT_UPLOAD when the put carries its upload
 * configuration (u16 length, then the descriptor's bytes: see local.h); a
 * put file without them reads as before. */
static int put_encode(struct kc_buf *b, int type, const char *ns, const kc_key *key,
                      const kc_digest *source, const struct kc__hdr *h, const void *bytes,
                      size_t len, unsigned extra, const char *upload, size_t ulen)
{
    static const kc_digest none;
    size_t n = strlen(ns);
    if (upload == NULL || ulen == 0 || ulen > KC__UPLOAD_MAX)
        ulen = 0;
    unsigned flags = (source ? KC__PF_SOURCE : 0) | (extra & KC__PUT_FROM_REMOTE) |
                     (ulen > 0 ? KC__PUT_UPLOAD : 0);
    unsigned char hb[KC__HDR_LEN];
    kc__hdr_encode(h, hb);
    size_t start = kc__spool_begin(b, type);
    kc_buf_put_u16(b, (uint16_t)n);
    kc_buf_put_u16(b, (uint16_t)flags);
    kc_buf_put_u32(b, 0);
    put_key(b, key);
    put_digest(b, source ? source : &none);
    kc_buf_add(b, ns, n);
    if (ulen > 0) {
        kc_buf_put_u16(b, (uint16_t)ulen);
        kc_buf_add(b, upload, ulen);
    }
    kc_buf_add(b, hb, sizeof hb);
    kc_buf_add(b, bytes, len);
    kc__spool_end_at(b, start);
    return b->err;
}

int kc__spool_put_encode(struct kc_buf *b, const char *ns, const kc_key *key,
                         const kc_digest *source, const struct kc__hdr *h, const void *body,
                         size_t len)
{
    return put_encode(b, KC__SP_PUT, ns, key, source, h, body, len, 0, NULL, 0);
}

int kc__spool_put_encode_flags(struct kc_buf *b, const char *ns, const kc_key *key,
                               const kc_digest *source, const struct kc__hdr *h, const void *body,
                               size_t len, unsigned flags)
{
    return put_encode(b, KC__SP_PUT, ns, key, source, h, body, len, flags, NULL, 0);
}

int kc__spool_put_encode_upload(struct kc_buf *b, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h, const void *body,
                                size_t len, unsigned flags, const char *upload, size_t ulen)
{
    return put_encode(b, KC__SP_PUT, ns, key, source, h, body, len, flags, upload, ulen);
}

int kc__spool_put_pack(struct kc_buf *b, const struct kc__sp_put *sp, const void *packed,
                       size_t plen)
{
    return put_encode(b, KC__SP_PACKED, sp->ns, &sp->key, sp->has_source ? &sp->source : NULL,
                      &sp->hdr, packed, plen, sp->from_remote ? KC__PUT_FROM_REMOTE : 0, NULL, 0);
}

int kc__spool_put_encode_stored(struct kc_buf *b, const char *ns, const kc_key *key,
                                const kc_digest *source, const struct kc__hdr *h,
                                const void *stored, size_t len)
{
    return put_encode(b, KC__SP_STORED, ns, key, source, h, stored, len, 0, NULL, 0);
}

/* The put payload's fixed part, namespace and record header; out->record
 * and record_len: everything after the namespace. */
static int put_head(const unsigned char *p, size_t n, struct kc__sp_put *out)
{
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    size_t nslen = kc_rd_get_u16(&r);
    uint16_t flags = kc_rd_get_u16(&r);
    uint32_t pad = kc_rd_get_u32(&r);
    get_key(&r, &out->key);
    get_digest(&r, &out->source);
    if (r.bad || nslen < 1 || nslen > KC__NS_MAX ||
        (flags & ~(KC__PF_SOURCE | KC__PUT_FROM_REMOTE | KC__PUT_UPLOAD)) != 0 || pad != 0)
        return -EBADMSG;
    const unsigned char *nsp = kc_rd_take(&r, nslen);
    if (nsp == NULL || memchr(nsp, 0, nslen) != NULL)
        return -EBADMSG;
    memcpy(out->ns, nsp, nslen);
    out->ns[nslen] = 0;
    out->upload = NULL;
    out->upload_len = 0;
    if (flags & KC__PUT_UPLOAD) {
        size_t ul = kc_rd_get_u16(&r);
        const unsigned char *up = r.bad ? NULL : kc_rd_take(&r, ul);
        if (up == NULL || ul == 0 || ul > KC__UPLOAD_MAX || memchr(up, 0, ul) != NULL)
            return -EBADMSG;
        out->upload = (const char *)up;
        out->upload_len = ul;
    }
    out->has_source = (flags & KC__PF_SOURCE) != 0;
    out->from_remote = (flags & KC__PUT_FROM_REMOTE) != 0;
    out->record_len = kc_rd_left(&r);
    out->record = kc_rd_take(&r, out->record_len);
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

int kc__spool_put_encode_entry(struct kc_buf *b, const char *ns, const kc_key *key,
                               const kc_digest *source, const struct kc__hdr *h)
{
    return put_encode(b, KC__SP_ENTRY, ns, key, source, h, NULL, 0, 0, NULL, 0);
}

int kc__spool_put_decode_entry(const void *file, size_t len, struct kc__sp_put *out)
{
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(file, len, &type, &p, &n) != 0 || type != KC__SP_ENTRY ||
        put_head(p, n, out) != 0 || out->record_len != KC__HDR_LEN)
        return -EBADMSG;
    out->body = NULL;
    out->body_len = 0;
    return 0;
}

int kc__spool_put_decode_stored(const void *file, size_t len, struct kc__sp_put *out)
{
    int type;
    const unsigned char *p;
    size_t n;
    if (kc__spool_check(file, len, &type, &p, &n) != 0 || type != KC__SP_STORED ||
        put_head(p, n, out) != 0 || out->record_len < KC__HDR_LEN)
        return -EBADMSG;
    out->body = out->record + KC__HDR_LEN;
    out->body_len = out->record_len - KC__HDR_LEN;
    return 0;
}

/* ---- packed puts ----------------------------------------------------------
 * A packed put ('Z') is a put whose body is one LZ4 block
 * (lz4_Block_format.md) of hdr.body_size bytes; the owner writes its hot
 * files so. Unpacking rebuilds the plain put, which is then decoded and
 * checked (body checksum included) as any other. */

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
    kc_le_put_u64(b + 8, head + body - KC__SPOOL_HDR);
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
 * [counters: KC_N_COUNTERS u64], name. */

void kc__spool_item_add(struct kc_buf *b, int type, const struct kc__sp_item *it)
{
    size_t n = strnlen(it->ns, KC__NS_MAX);
    kc_buf_put_u16(b, (uint16_t)n);
    kc_buf_put_u16(b, 0);
    kc_buf_put_u32(b, it->flags);
    put_key(b, &it->key);
    put_digest(b, &it->source);
    kc_buf_put_u64(b, it->a);
    kc_buf_put_u64(b, it->b);
    if (type == KC__SP_COUNT) {
        uint64_t v[KC_N_COUNTERS];
        kc_counters_to_array(&it->c, v);
        for (int i = 0; i < KC_N_COUNTERS; i++)
            kc_buf_put_u64(b, v[i]);
    }
    kc_buf_add(b, it->ns, n);
}

int kc__spool_item_next(int type, const unsigned char **pp, const unsigned char *end,
                        struct kc__sp_item *it)
{
    const unsigned char *p = *pp;
    if (p == end)
        return 0;
    struct kc_rd r;
    kc_rd_init(&r, p, (size_t)(end - p));
    memset(it, 0, sizeof *it);
    size_t n = kc_rd_get_u16(&r);
    uint16_t pad = kc_rd_get_u16(&r);
    it->flags = kc_rd_get_u32(&r);
    get_key(&r, &it->key);
    get_digest(&r, &it->source);
    it->a = kc_rd_get_u64(&r);
    it->b = kc_rd_get_u64(&r);
    if (type == KC__SP_COUNT) {
        uint64_t v[KC_N_COUNTERS];
        for (int i = 0; i < KC_N_COUNTERS; i++)
            v[i] = kc_rd_get_u64(&r);
        kc_counters_from_array(&it->c, v);
    }
    if (r.bad || n < 1 || n > KC__NS_MAX || pad != 0)
        return -EBADMSG;
    const unsigned char *nsp = kc_rd_take(&r, n);
    if (nsp == NULL || memchr(nsp, 0, n) != NULL)
        return -EBADMSG;
    memcpy(it->ns, nsp, n);
    it->ns[n] = 0;
    *pp = p + r.off;
    return 1;
}
