/*
 * body.h: a body as the bodies family keeps it (body.c; the family's
 * layout is meta.h's): the codec, the compression dictionaries and the
 * decoding ones. The bottom of store/db/ with meta.h: it calls nothing of
 * the database.
 */
#ifndef KCACHE_STORE_BODY_H
#define KCACHE_STORE_BODY_H

#include "../local/chain.h"

#include <pthread.h>

/* ---- the bodies family (body.c) ----------------------------------------- */

#define KC__BODY_MAGIC 0x31424bffu
#define KC__BODY_HDR 16
#define KC__BODY_LEVEL 3
/* A body at most 1 GiB (a stored value claiming more is not ours). */
#define KC__BODY_MAX (1ull << 30)
enum { KC__BODY_RAW = 0, KC__BODY_ZSTD = 1, KC__BODY_ZSTD_DICT = 2, KC__BODY_LEGACY = 255 };
/* A store's compression dictionary: at most this big. */
#define KC__DICT_BYTES (16u << 10)

/* An encoding dictionary (ZSTD_CDict) and its id. */
struct kc__cdict {
    uint64_t id;
    void *cd;
};
int kc__cdict_make(struct kc__cdict *c, const void *p, size_t n);
void kc__cdict_free(struct kc__cdict *c);
/* A dictionary's id: XXH3-64 of its bytes, never 0. */
uint64_t kc__dict_id(const void *p, size_t n);
/* Trains a dictionary (at most KC__DICT_BYTES) on n samples laid end to
 * end, appended to out: 0, or -EINVAL (too few or too alike) or -ENOMEM. */
int kc__dict_train(const void *samples, const size_t *sizes, unsigned n, struct kc_buf *out);

struct kc__dicts;

/* Appends body (n bytes) as stored to out: zstd (with cd's dictionary, when
 * given) when that shrinks it, as it is otherwise. 0 or -ENOMEM. */
int kc__body_encode(const void *body, size_t n, const struct kc__cdict *cd, struct kc_buf *out);
/* A stored value's body size, codec (KC__BODY_LEGACY: a value without the
 * magic, the body itself) and dictionary (*dict, 0: none; may be NULL),
 * without inflating it: 0 or -EBADMSG. */
int kc__body_info(const void *v, size_t vl, uint64_t *raw_len, int *codec, uint64_t *dict);
/* Inflates a stored value (its dictionary from dicts): 0 with *body
 * (malloc'd, *n bytes: the size the value states), -EBADMSG (not a stored
 * body, its dictionary unknown, or not inflating to exactly its stated
 * size) or -ENOMEM. The caller checks it against its header. */
int kc__body_decode(const void *v, size_t vl, struct kc__dicts *dicts, char **body, size_t *n);

/* Decoding dictionaries (body.c), loaded once each through load (the
 * database's meta family, or a bundle's header) and kept. Thread-safe. */
struct kc__dicts {
    pthread_mutex_t mu;
    struct {
        uint64_t id;
        void *dd;
    } * v;
    size_t n, cap;
    int (*load)(void *arg, uint64_t id, char **p, size_t *n);
    void *arg;
    bool live;
};
void kc__dicts_init(struct kc__dicts *d, int (*load)(void *arg, uint64_t id, char **p, size_t *n),
                    void *arg);
void kc__dicts_free(struct kc__dicts *d);

#endif
