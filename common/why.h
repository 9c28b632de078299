/*
 * why.h: a miss's record, for `kcache why`. At a miss the shim writes what
 * went into the request's key, input by input (the library, the source,
 * each option, each header it read or probed, the working directory when
 * it is keyed), one small text file in KCACHE_DIR/why/ (the last
 * KC_WHY_KEEP misses). The tool compares a miss with the nearest earlier
 * one and names what differs.
 *
 * A record, one field per line (names and shown values escaped: \\ \t \n
 * \xHH):
 *   kcache-why 1
 *   backend nvrtc | link | nvvm
 *   name NAME            the program's name, or the link's first input
 *   time NS  pid N  base HEX  key HEX-BUILD  stored 1 | why not
 *   compile_ms MS  remote_refused N
 *   c KIND<TAB>NAME<TAB>DIGEST<TAB>SHOWN     one per input
 * KINDs: library, kcache, source, program, header (in memory), option,
 * expression, file (a header on disk: DIGEST, "absent", "directory" or
 * "exists"), cwd, input (a link's or libNVVM's input).
 */
#ifndef KCACHE_COMMON_WHY_H
#define KCACHE_COMMON_WHY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "digest.h"

#define KC_WHY_DIR "why"
#define KC_WHY_KEEP 1000

struct kc_why {
    struct kc_buf b;
};

/* Starts a record (w zeroed first). */
void kc_why_begin(struct kc_why *w, const char *backend, const char *name, const kc_digest *base);

/* Adds an input: its digest (NULL: the digest of `shown`) and what a person
 * is shown of it (truncated). */
void kc_why_add(struct kc_why *w, const char *kind, const char *name, const kc_digest *d,
                const char *shown);

/* Adds an input given by its bytes (digested; shown as their size). */
void kc_why_data(struct kc_why *w, const char *kind, const char *name, const void *p, size_t n);

/* Adds a file dependency whose state is a word ("absent", "directory",
 * "exists"): digest and shown alike. */
void kc_why_state(struct kc_why *w, const char *kind, const char *name, const char *state);

/* Ends the record and writes it into DIR/why/ (created private; nothing
 * written when DIR or why/ is not this user's own, private directory),
 * pruning the oldest past KC_WHY_KEEP now and then. `stored` is "1" or why
 * the result was not stored. 0 or a negative errno; w is released either
 * way. */
int kc_why_write(struct kc_why *w, const char *dir, const kc_digest *key, uint64_t build,
                 const char *stored, uint64_t compile_ns, uint64_t remote_refused);

void kc_why_free(struct kc_why *w);

/* ---- reading (the tool) ------------------------------------------------- */

struct kc_why_input {
    char *kind, *name, *digest, *shown;
};

struct kc_why_rec {
    char *file; /* its name in why/ */
    char *backend, *name, *base, *key, *stored;
    uint64_t time;
    long pid;
    double compile_ms;
    uint64_t remote_refused;
    size_t n;
    struct kc_why_input *in;
};

/* Parses one record: 0, or -EBADMSG (r released). */
int kc_why_parse(const char *text, size_t len, struct kc_why_rec *r);

/* Reads every record in DIR/why/, oldest first: 0 with *out (*n records;
 * release with kc_why_recs_free), -ENOENT when there is none, or a
 * negative errno. */
int kc_why_read_all(const char *dir, struct kc_why_rec **out, size_t *n);

void kc_why_rec_free(struct kc_why_rec *r);
void kc_why_recs_free(struct kc_why_rec *v, size_t n);

#endif
