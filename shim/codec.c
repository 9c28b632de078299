/*
 * Record formats of the shim. See codec.h.
 */
#include "codec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the replay record ----------------------------------------------------- */





void kc__replay_free(struct kc__replay *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < N_OUT; i++)
        free(r->out[i].bytes);
    for (uint32_t i = 0; i < r->n_names; i++) {
        free(r->names[i].expr);
        free(r->names[i].name);
    }
    free(r->names);
    free(r);
}

/* A growable byte buffer for serializing. */

static void put(struct kc__wbuf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n > 0) /* p may be NULL for an empty blob: memcpy(dst, NULL, 0) is undefined */
        memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void put_u64(struct kc__wbuf *b, uint64_t v)
{
    put(b, &v, sizeof v);
}

static void put_i32(struct kc__wbuf *b, int v)
{
    int32_t x = v;
    put(b, &x, sizeof x);
}

static void put_blob(struct kc__wbuf *b, const void *p, uint64_t n)
{
    put_u64(b, n);
    put(b, p, n);
}

/* A bounds-checked reader. */
struct rd {
    const char *p;
    size_t n, off;
    int bad;
};

static int get(struct rd *r, void *out, size_t n)
{
    if (r->bad || r->n - r->off < n) {
        r->bad = 1;
        memset(out, 0, n);
        return -1;
    }
    memcpy(out, r->p + r->off, n);
    r->off += n;
    return 0;
}

static uint64_t get_u64(struct rd *r)
{
    uint64_t v;
    get(r, &v, sizeof v);
    return v;
}

static int get_i32(struct rd *r)
{
    int32_t v;
    get(r, &v, sizeof v);
    return v;
}

/* A malloc'd copy of a blob, NUL-terminated (for strings). */
static char *get_blob(struct rd *r, uint64_t *len)
{
    uint64_t n = get_u64(r);
    if (r->bad || n > r->n - r->off) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc(n + 1);
    if (s == NULL) {
        r->bad = 1;
        return NULL;
    }
    memcpy(s, r->p + r->off, n);
    s[n] = '\0';
    r->off += n;
    if (len != NULL)
        *len = n;
    return s;
}

#define REPLAY_MAGIC 0x324b434e56ull /* "KCNV" 2 */

int kc__replay_encode(const struct kc__replay *r, struct kc__wbuf *b)
{
    put_u64(b, REPLAY_MAGIC);
    put_i32(b, r->compile_rc);
    for (int i = 0; i < N_OUT; i++) {
        const struct kc__output *o = &r->out[i];
        put_i32(b, o->size_rc);
        put_i32(b, o->size_set);
        put_u64(b, o->size);
        put_i32(b, o->get_rc);
        put_i32(b, o->size_null_rc);
        put_i32(b, o->get_null_rc);
        put_blob(b, o->bytes, o->nbytes);
    }
    put_u64(b, r->n_names);
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
    put_u64(b, r->pch_required);
    return b->failed ? -ENOMEM : 0;
}

struct kc__replay *kc__replay_decode(const void *p, size_t n)
{
    struct rd r = {.p = p, .n = n};
    if (get_u64(&r) != REPLAY_MAGIC)
        return NULL;
    struct kc__replay *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->compile_rc = get_i32(&r);
    for (int i = 0; i < N_OUT; i++) {
        struct kc__output *o = &x->out[i];
        o->size_rc = get_i32(&r);
        o->size_set = get_i32(&r);
        o->size = get_u64(&r);
        o->get_rc = get_i32(&r);
        o->size_null_rc = get_i32(&r);
        o->get_null_rc = get_i32(&r);
        o->bytes = get_blob(&r, &o->nbytes);
        /* What capture() can have written: the getter filled a buffer of
         * the announced size, or (no usable size) up to 64 bytes. A record
         * whose getter would write more than the size getter announced
         * would overrun the host's buffer on a hit: refuse it. */
        if (o->nbytes > 0 && o->size_rc == 0 && o->size_set && o->size > 0 && o->nbytes > o->size)
            r.bad = 1;
        if (o->nbytes > 64 && !(o->size_rc == 0 && o->size_set && o->nbytes == o->size))
            r.bad = 1;
    }
    uint64_t names = get_u64(&r);
    if (!r.bad && names <= (r.n - r.off) / 8) {
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
    x->pch_required = get_u64(&r);
    if (r.bad || r.off != r.n) {
        kc__replay_free(x);
        return NULL;
    }
    return x;
}

/* ---- manifests ----------------------------------------------------------------------- */

/* A manifest body: u64 magic, u64 n_sets, then per set: the result id
 * (16 bytes), u64 n_deps, per dep: i32 kind, blob path, 16 bytes digest. */
#define MANIFEST_MAGIC 0x324b434d46ull /* "KCMF" 2 */
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
    struct rd r = {.p = p, .n = n};
    if (get_u64(&r) != MANIFEST_MAGIC)
        return NULL;
    struct kc__manifest *m = calloc(1, sizeof *m);
    if (m == NULL)
        return NULL;
    uint64_t sets = get_u64(&r);
    if (r.bad || sets > MANIFEST_MAX_SETS * 4)
        goto bad;
    m->sets = calloc(sets ? sets : 1, sizeof *m->sets);
    if (m->sets == NULL)
        goto bad;
    for (uint64_t i = 0; i < sets; i++) {
        struct kc__dep_set *s = &m->sets[i];
        m->n++;
        get(&r, &s->result, sizeof s->result);
        uint64_t deps = get_u64(&r);
        if (r.bad || deps > (r.n - r.off) / 68)
            goto bad;
        s->deps = calloc(deps ? deps : 1, sizeof *s->deps);
        if (s->deps == NULL)
            goto bad;
        for (uint64_t j = 0; j < deps; j++) {
            struct kc__dep *d = &s->deps[j];
            s->n++;
            d->kind = get_i32(&r);
            d->path = get_blob(&r, NULL);
            get(&r, &d->digest, sizeof d->digest);
            for (int f = 0; f < 5; f++)
                d->fp[f] = get_u64(&r);
            if (r.bad)
                goto bad;
        }
    }
    if (r.off != r.n)
        goto bad;
    return m;
bad:
    kc__manifest_free(m);
    return NULL;
}

static void encode_set(struct kc__wbuf *b, const kc_digest *result, const struct kc__dep *deps,
                       uint64_t n)
{
    put(b, result, sizeof *result);
    put_u64(b, n);
    for (uint64_t j = 0; j < n; j++) {
        put_i32(b, deps[j].kind);
        put_blob(b, deps[j].path, strlen(deps[j].path));
        put(b, &deps[j].digest, sizeof deps[j].digest);
        for (int f = 0; f < 5; f++)
            put_u64(b, deps[j].fp[f]);
    }
}

void kc__manifest_encode(struct kc__wbuf *b, const kc_digest *result, const struct kc__dep *deps,
                         uint64_t n_deps, const struct kc__manifest *old)
{
    uint64_t n = 1;
    if (old != NULL)
        for (uint64_t i = 0; i < old->n && n < MANIFEST_MAX_SETS; i++)
            if (!(old->sets[i].result.lo == result->lo && old->sets[i].result.hi == result->hi))
                n++;
    put_u64(b, MANIFEST_MAGIC);
    put_u64(b, n);
    encode_set(b, result, deps, n_deps);
    if (old != NULL)
        for (uint64_t i = 0, k = 1; i < old->n && k < n; i++)
            if (!(old->sets[i].result.lo == result->lo && old->sets[i].result.hi == result->hi)) {
                encode_set(b, &old->sets[i].result, old->sets[i].deps, old->sets[i].n);
                k++;
            }
}
