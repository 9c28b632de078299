/*
 * The link replay record: what a completed link returned, so a hit answers
 * exactly as the library did. For nvJitLink, every getter of the linked
 * handle (cubin, PTX, LTO-IR, error and info logs: return codes, sizes,
 * whether a size was written, the bytes); for the driver's cuLinkComplete,
 * its cubin and the log buffers as the driver filled them.
 *
 * Written little-endian field by field, whatever the host's byte order, and
 * kept apart from the hooks so it can be fuzzed: a body that does not parse
 * is NULL, never a crash.
 */
#ifndef KCACHE_LINKREC_H
#define KCACHE_LINKREC_H

#include <stddef.h>
#include <stdint.h>

/* Which API a record answers for. */
enum { KC_LREC_NVJITLINK = 1, KC_LREC_CULINK = 2 };

/* The outputs of a record. For nvJitLink each is one size/get getter pair.
 * For cuLink: LOUT_CUBIN is cuLinkComplete's cubin (size_set: the outputs
 * were written; size: *sizeOut), LOUT_INFO_LOG and LOUT_ERROR_LOG the log
 * buffers (bytes: the text the driver wrote, without its NUL; size_set:
 * the host gave a size option; size: the value the driver left there). */
enum { LOUT_CUBIN, LOUT_PTX, LOUT_LTOIR, LOUT_ERROR_LOG, LOUT_INFO_LOG, N_LOUT };

struct kc__lout {
    int32_t size_rc;
    int32_t size_set; /* whether the size getter wrote its argument */
    uint64_t size;
    int32_t get_rc;
    int32_t size_null_rc; /* the size getter given NULL */
    int32_t get_null_rc;  /* the getter given NULL */
    uint64_t nbytes;      /* bytes the getter wrote */
    char *bytes;          /* malloc'd, nbytes long (NUL-terminated past it) */
};

struct kc__lrec {
    uint32_t api;        /* KC_LREC_* */
    int32_t complete_rc; /* what the completion returned */
    struct kc__lout out[N_LOUT];
};

/* Releases a record; NULL is a no-op. */
void kc__lrec_free(struct kc__lrec *r);

/* Encodes r into a malloc'd buffer (*out, *len; free it). 0 or -ENOMEM. */
int kc__lrec_encode(const struct kc__lrec *r, void **out, size_t *len);

/* Decodes a record (release with kc__lrec_free), or NULL when the bytes are
 * not exactly one well-formed record. A record whose getter would write more
 * than its size getter announced (which would overrun the host's buffer on
 * a hit) is refused. */
struct kc__lrec *kc__lrec_decode(const void *p, size_t n);

#endif
