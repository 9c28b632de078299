/*
 * Record formats of the shim, every integer little-endian. See codec.h.
 */
#include "codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the replay record ----------------------------------------------------- */

void kc__replay_drop_outputs(struct kc__replay *r)
{
    for (int i = 0; i < N_OUT; i++) {
        if (r->backing == NULL)
            free(r->out[i].bytes);
        r->out[i].bytes = NULL;
        r->out[i].nbytes = 0;
    }
    free(r->backing);
    r->backing = NULL;
}

void kc__replay_free(struct kc__replay *r)
{
    if (r == NULL)
        return;
    kc__replay_drop_outputs(r);
    for (uint32_t i = 0; i < r->n_names; i++) {
        free(r->names[i].expr);
        free(r->names[i].name);
    }
    free(r->names);
    free(r);
}

/* The codec's fields on common/buf.h: an int as a little-endian i32, a blob
 * as its u64 length then its bytes, a digest as lo then hi. */

static void put_i32(struct kc_buf *b, int v)
{
    kc_buf_put_u32(b, (uint32_t)(int32_t)v);
}

static void put_blob(struct kc_buf *b, const void *p, uint64_t n)
{
    kc_buf_put_u64(b, n);
    kc_buf_add(b, p, n);
}

static void put_digest(struct kc_buf *b, const kc_digest *d)
{
    kc_buf_put_u64(b, d->lo);
    kc_buf_put_u64(b, d->hi);
}

static int get_i32(struct kc_rd *r)
{
    return (int32_t)kc_rd_get_u32(r);
}

static void get_digest(struct kc_rd *r, kc_digest *d)
{
    d->lo = kc_rd_get_u64(r);
    d->hi = kc_rd_get_u64(r);
}

/* A blob, in place: a pointer into the reader's bytes (NULL, and the
 * reader bad, when it does not fit). */
static char *take_blob(struct kc_rd *r, uint64_t *len)
{
    uint64_t n = kc_rd_get_u64(r);
    if (n > kc_rd_left(r)) {
        r->bad = 1;
        return NULL;
    }
    const unsigned char *q = kc_rd_take(r, (size_t)n);
    *len = q != NULL ? n : 0;
    return (char *)q;
}

/* A malloc'd copy of a blob, NUL-terminated (for strings); NULL (and the
 * reader bad) when it does not fit. */
static char *get_blob(struct kc_rd *r, uint64_t *len)
{
    uint64_t n = 0;
    const char *q = take_blob(r, &n);
    char *s = q != NULL ? malloc(n + 1) : NULL;
    if (s == NULL) {
        r->bad = 1;
        return NULL;
    }
    memcpy(s, q, n);
    s[n] = '\0';
    if (len != NULL)
        *len = n;
    return s;
}

/* A replay record: u64 magic, i32 compile_rc, per output (PTX, CUBIN,
 * LTO-IR, OptiX-IR, log): i32 size_rc, i32 size_set, u64 size, i32 get_rc,
 * i32 size_null_rc, i32 get_null_rc, blob bytes; u64 n_names, per name:
 * blob expr, i32 rc, i32 is_null, blob name; then i32 lowered_unknown_rc,
 * lowered_null_name_rc, lowered_null_out_rc, add_after_rc, pch_status_rc,
 * pch_required_rc, pch_required_set, pch_required_null_rc, u64
 * pch_required. The magic's last byte counts layouts: 2 was written in the
 * host's byte order (format 1), 3 is little-endian with five outputs, 4
 * adds NVVM and Tile IR (N_OUT). Layout 3 is still read: its record says
 * which outputs it lacks (missing), and a hook serves it only where the
 * loaded NVRTC has none of those getters. */
#define REPLAY_MAGIC 0x344b434e56ull    /* "KCNV" 4 */
#define REPLAY_MAGIC_V3 0x334b434e56ull /* "KCNV" 3 */

int kc__replay_encode(const struct kc__replay *r, struct kc_buf *b)
{
    kc_buf_put_u64(b, REPLAY_MAGIC);
    put_i32(b, r->compile_rc);
    for (int i = 0; i < N_OUT; i++) {
        const struct kc__output *o = &r->out[i];
        put_i32(b, o->size_rc);
        put_i32(b, o->size_set);
        kc_buf_put_u64(b, o->size);
        put_i32(b, o->get_rc);
        put_i32(b, o->size_null_rc);
        put_i32(b, o->get_null_rc);
        put_blob(b, o->bytes, o->nbytes);
    }
    kc_buf_put_u64(b, r->n_names);
    for (uint32_t i = 0; i < r->n_names; i++) {
        const struct kc__lowered *l = &r->names[i];
        put_blob(b, l->expr, strlen(l->expr));
        put_i32(b, l->rc);
        put_i32(b, l->is_null);
        put_blob(b, l->name, l->name ? strlen(l->name) : 0);
    }
    put_i32(b, r->lowered_unknown_rc);
    put_i32(b, r->lowered_null_name_rc);
    put_i32(b, r->lowered_null_out_rc);
    put_i32(b, r->add_after_rc);
    put_i32(b, r->pch_status_rc);
    put_i32(b, r->pch_required_rc);
    put_i32(b, r->pch_required_set);
    put_i32(b, r->pch_required_null_rc);
    kc_buf_put_u64(b, r->pch_required);
    return b->err ? -ENOMEM : 0;
}

/* Decodes p; the outputs' bytes are copies, or with `body` (p itself,
 * malloc'd) point into it, which the record then owns (on failure too). */
static struct kc__replay *decode(const void *p, size_t n, void *body)
{
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    uint64_t magic = kc_rd_get_u64(&r);
    if (magic != REPLAY_MAGIC && magic != REPLAY_MAGIC_V3) {
        free(body);
        return NULL;
    }
    int n_out = magic == REPLAY_MAGIC ? N_OUT : N_OUT_V3;
    struct kc__replay *x = calloc(1, sizeof *x);
    if (x == NULL) {
        free(body);
        return NULL;
    }
    x->backing = body;
    for (int i = n_out; i < N_OUT; i++)
        x->missing |= 1u << i;
    x->compile_rc = get_i32(&r);
    for (int i = 0; i < n_out; i++) {
        struct kc__output *o = &x->out[i];
        o->size_rc = get_i32(&r);
        o->size_set = get_i32(&r);
        o->size = kc_rd_get_u64(&r);
        o->get_rc = get_i32(&r);
        o->size_null_rc = get_i32(&r);
        o->get_null_rc = get_i32(&r);
        o->bytes = body != NULL ? take_blob(&r, &o->nbytes) : get_blob(&r, &o->nbytes);
        /* What capture() can have written: the getter filled a buffer of
         * the announced size, or (no usable size) up to 64 bytes. A record
         * whose getter would write more than the size getter announced
         * would overrun the host's buffer on a hit: refuse it. */
        if (o->nbytes > 0 && o->size_rc == 0 && o->size_set && o->size > 0 && o->nbytes > o->size)
            r.bad = 1;
        if (o->nbytes > 64 && !(o->size_rc == 0 && o->size_set && o->nbytes == o->size))
            r.bad = 1;
    }
    uint64_t names = kc_rd_get_u64(&r);
    if (!r.bad && names <= kc_rd_left(&r) / 8) {
        x->names = calloc(names ? names : 1, sizeof *x->names);
        if (x->names == NULL)
            r.bad = 1;
        for (uint64_t i = 0; i < names && !r.bad; i++) {
            struct kc__lowered *l = &x->names[i];
            x->n_names++;
            l->expr = get_blob(&r, NULL);
            l->rc = get_i32(&r);
            l->is_null = get_i32(&r);
            l->name = get_blob(&r, NULL);
        }
    } else {
        r.bad = 1;
    }
    x->lowered_unknown_rc = get_i32(&r);
    x->lowered_null_name_rc = get_i32(&r);
    x->lowered_null_out_rc = get_i32(&r);
    x->add_after_rc = get_i32(&r);
    x->pch_status_rc = get_i32(&r);
    x->pch_required_rc = get_i32(&r);
    x->pch_required_set = get_i32(&r);
    x->pch_required_null_rc = get_i32(&r);
    x->pch_required = kc_rd_get_u64(&r);
    if (kc_rd_end(&r) != 0) {
        kc__replay_free(x);
        return NULL;
    }
    return x;
}

struct kc__replay *kc__replay_decode(const void *p, size_t n)
{
    return decode(p, n, NULL);
}

struct kc__replay *kc__replay_decode_body(void *body, size_t n)
{
    return decode(body, n, body);
}

/* ---- manifests ----------------------------------------------------------------------- */

/* A manifest body: u64 magic, u64 n_sets, then per set: the result id
 * (digest: u64 lo, u64 hi), u64 n_deps, per dep: i32 kind, blob path,
 * digest, 5 u64 fingerprint. The magic's last byte counts layouts as the
 * replay record's does. */
#define MANIFEST_MAGIC 0x334b434d46ull /* "KCMF" 3 */
#define MANIFEST_MAX_SETS 16

void kc__manifest_free(struct kc__manifest *m)
{
    if (m == NULL)
        return;
    for (uint64_t i = 0; i < m->n; i++) {
        for (uint64_t j = 0; j < m->sets[i].n; j++)
            free(m->sets[i].deps[j].path);
        free(m->sets[i].deps);
    }
    free(m->sets);
    free(m);
}

struct kc__manifest *kc__manifest_decode(const void *p, size_t n)
{
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    if (kc_rd_get_u64(&r) != MANIFEST_MAGIC)
        return NULL;
    struct kc__manifest *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    uint64_t sets = kc_rd_get_u64(&r);
    if (r.bad || sets > MANIFEST_MAX_SETS * 4)
        goto bad;
    m->sets = calloc(sets ? sets : 1, sizeof *m->sets);
    if (m->sets == NULL)
        goto bad;
    for (uint64_t i = 0; i < sets; i++) {
        struct kc__dep_set *s = &m->sets[i];
        m->n++;
        get_digest(&r, &s->result);
        uint64_t deps = kc_rd_get_u64(&r);
        if (r.bad || deps > kc_rd_left(&r) / 68)
            goto bad;
        s->deps = calloc(deps ? deps : 1, sizeof *s->deps);
        if (s->deps == NULL)
            goto bad;
        for (uint64_t j = 0; j < deps; j++) {
            struct kc__dep *d = &s->deps[j];
            s->n++;
            d->kind = get_i32(&r);
            d->path = get_blob(&r, NULL);
            get_digest(&r, &d->digest);
            for (int f = 0; f < 5; f++)
                d->fp[f] = kc_rd_get_u64(&r);
            if (r.bad)
                goto bad;
        }
    }
    if (kc_rd_end(&r) != 0)
        goto bad;
    return m;
bad:
    kc__manifest_free(m);
    return NULL;
}

static void encode_set(struct kc_buf *b, const kc_digest *result, const struct kc__dep *deps,
                       uint64_t n)
{
    put_digest(b, result);
    kc_buf_put_u64(b, n);
    for (uint64_t j = 0; j < n; j++) {
        put_i32(b, deps[j].kind);
        put_blob(b, deps[j].path, strlen(deps[j].path));
        put_digest(b, &deps[j].digest);
        for (int f = 0; f < 5; f++)
            kc_buf_put_u64(b, deps[j].fp[f]);
    }
}

void kc__manifest_encode(struct kc_buf *b, const kc_digest *result, const struct kc__dep *deps,
                         uint64_t n_deps, const struct kc__manifest *old)
{
    uint64_t n = 1;
    if (old != NULL)
        for (uint64_t i = 0; i < old->n && n < MANIFEST_MAX_SETS; i++)
            if (!(old->sets[i].result.lo == result->lo && old->sets[i].result.hi == result->hi))
                n++;
    kc_buf_put_u64(b, MANIFEST_MAGIC);
    kc_buf_put_u64(b, n);
    encode_set(b, result, deps, n_deps);
    if (old != NULL)
        for (uint64_t i = 0, k = 1; i < old->n && k < n; i++)
            if (!(old->sets[i].result.lo == result->lo && old->sets[i].result.hi == result->hi)) {
                encode_set(b, &old->sets[i].result, old->sets[i].deps, old->sets[i].n);
                k++;
            }
}

bool kc__manifest_mergeable(uint32_t prov)
{
    return KC_PROV_CODE(prov) == KC_PROV_LOCAL || KC_PROV_CODE(prov) == KC_PROV_SIGNED;
}

void kc__capture_pair(const struct kc__pair *p, int ok, int oom, struct kc__output *o)
{
    const size_t s1 = (size_t)0x5a5a5a5a5a5a5a5aull, s2 = (size_t)0xa5a5a5a5a5a5a5a5ull;
    size_t n = s1;
    o->size_rc = p->size(p->ctx, &n);
    o->size_set = 1;
    if (n == s1) {
        n = s2;
        p->size(p->ctx, &n);
        o->size_set = n != s2;
        if (!o->size_set)
            n = 0;
    }
    o->size = n;
    if (o->size_rc == ok && o->size_set && n > 0 && n < (1ull << 34)) {
        o->bytes = malloc(n);
        if (o->bytes == NULL) {
            o->get_rc = oom;
            return;
        }
        o->get_rc = p->get(p->ctx, o->bytes);
        o->nbytes = n;
        return;
    }
    /* No size: see what the getter does with a small buffer, twice with two
     * fill patterns, and keep the bytes it wrote. */
    char a[64], b[64];
    memset(a, 0x5a, sizeof a);
    memset(b, 0xa5, sizeof b);
    o->get_rc = p->get(p->ctx, a);
    p->get(p->ctx, b);
    size_t w = 0;
    for (size_t i = 0; i < sizeof a; i++)
        if (a[i] != 0x5a || b[i] != (char)0xa5)
            w = i + 1;
    if (w > 0 && (o->bytes = malloc(w)) != NULL) {
        memcpy(o->bytes, a, w);
        o->nbytes = w;
    }
}
