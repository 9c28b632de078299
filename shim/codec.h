/*
 * The shim's two record formats, kept apart from the hooks so they can be
 * fuzzed: the NVRTC replay record (what every getter of a compiled program
 * returned) and the manifest (the header files a request read, per
 * dependency set). Both are written with common/buf.h, so every integer is
 * little-endian whatever the host. Decoders accept any bytes: a record that
 * does not parse is NULL, never a crash.
 */
#ifndef KCACHE_CODEC_H
#define KCACHE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "../common/buf.h"
#include "deps.h"

/* The outputs a record holds, in layout order. Layout 3 held the first
 * five (N_OUT_V3); NVVM (NVRTC 11.x/12.x) and Tile IR (13.3+) came with
 * layout 4. */
enum { OUT_PTX, OUT_CUBIN, OUT_LTOIR, OUT_OPTIX, OUT_LOG, OUT_NVVM, OUT_TILEIR, N_OUT };
enum { N_OUT_V3 = OUT_NVVM };

struct kc__output {
    int size_rc;
    int size_set; /* whether the size getter wrote its argument */
    uint64_t size;
    int get_rc;
    int size_null_rc, get_null_rc; /* the getters given NULL */
    uint64_t nbytes;               /* bytes the getter wrote */
    char *bytes;
};

/* A getter pair as capture sees it: size(ctx, &n) and get(ctx, buf), each
 * answering the library's own code. */
struct kc__pair {
    int (*size)(void *ctx, size_t *n);
    int (*get)(void *ctx, char *buf);
    void *ctx;
};

/* What a size/get pair answers now, into *o (its NULL-argument probes are
 * the caller's: some libraries crash on them): the size and whether the
 * size getter wrote it at all; then the bytes, into a buffer of that size
 * when the size getter answered `ok`, else what the getter writes into a
 * small buffer, tried with two fill patterns. `oom` is the code recorded
 * when there is no memory for the bytes. o->bytes is malloc'ed (the
 * caller frees it with the record). */
void kc__capture_pair(const struct kc__pair *p, int ok, int oom, struct kc__output *o);

struct kc__lowered {
    char *expr;
    int rc;
    int is_null; /* the getter stored NULL (1), the name (0), or left the
                    result as it was (KC_LOWERED_UNTOUCHED) */
    char *name;
};

/* kc__lowered.is_null: NVRTC did not write the result. A reader of an
 * earlier shim takes it for NULL. */
#define KC_LOWERED_UNTOUCHED 2

struct kc__replay {
    int compile_rc;
    struct kc__output out[N_OUT];
    uint32_t n_names;
    struct kc__lowered *names;
    int lowered_unknown_rc, lowered_null_name_rc, lowered_null_out_rc;
    int add_after_rc;
    int pch_status_rc;
    int pch_required_rc, pch_required_set, pch_required_null_rc;
    uint64_t pch_required;
    uint32_t missing; /* outputs (1 << OUT_*) the record does not hold: an
                         earlier layout's; not encoded */
    void *backing;    /* kc__replay_decode_body's body, which the outputs'
                         bytes point into (NULL: each output is malloc'd) */
};

struct kc__dep_set {
    kc_digest result;
    uint64_t n;
    struct kc__dep *deps; /* path, kind, digest and fingerprint only */
};

struct kc__manifest {
    uint64_t n;
    struct kc__dep_set *sets;
};

/* Releases a record; NULL is a no-op. */
void kc__replay_free(struct kc__replay *r);

/* Appends the encoding of r to b. 0 or -ENOMEM. */
int kc__replay_encode(const struct kc__replay *r, struct kc_buf *b);

/* Decodes a record (malloc'd, release with kc__replay_free), or NULL when
 * the bytes are not exactly one well-formed record. */
struct kc__replay *kc__replay_decode(const void *p, size_t n);

/* kc__replay_decode of a malloc'd body, which it takes in every case: the
 * outputs' bytes are not copied but point into it (r->backing), freed by
 * kc__replay_free. A first hit's outputs then touch no fresh heap pages
 * (one page fault each, ~2.5 us in a VM). */
struct kc__replay *kc__replay_decode_body(void *body, size_t n);

/* Frees r's outputs (their bytes become NULL, their sizes 0); the rest of
 * r (the lowered names) stays. */
void kc__replay_drop_outputs(struct kc__replay *r);

void kc__manifest_free(struct kc__manifest *m);

/* Decodes a manifest, or NULL when the bytes are not one. */
struct kc__manifest *kc__manifest_decode(const void *p, size_t n);

/* Encodes a manifest whose newest set is (result, deps), followed by the
 * sets of `old` (may be NULL) with another result, MANIFEST_MAX_SETS in
 * all. Check b->err. */
/* Whether a stored manifest's dependency sets may be kept in a new one
 * this process stores (and its owner uploads, signed by this node): only
 * a manifest compiled here or verified from a trusted signer. One served
 * unverified (KCACHE_REMOTE_TRUST=any), imported, or of unknown provenance
 * would be laundered into this node's signature: the new one starts
 * afresh. */
bool kc__manifest_mergeable(uint32_t prov);
void kc__manifest_encode(struct kc_buf *b, const kc_digest *result, const struct kc__dep *deps,
                         uint64_t n_deps, const struct kc__manifest *old);

#endif
