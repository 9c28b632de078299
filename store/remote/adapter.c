/*
 * adapter.c: the remote as a tier of the store's chain (store/tier.h), and
 * its counters as the store's statistics keep them. See remote.h.
 */
#include "remote.h"
#include "../tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct rtier {
    struct kc_tier base;
    struct kc_remote *r;
};

#define R(t) (((struct rtier *)(t))->r)

static int rt_get(struct kc_tier *t, const char *ns, const kc_key *key, void **body, size_t *len,
                  struct kc_record_info *info)
{
    return kc_remote_get(R(t), ns, key, body, len, info);
}

static int rt_put(struct kc_tier *t, const char *ns, const kc_key *key, const kc_digest *source,
                  uint32_t kind, const void *body, size_t len, uint64_t saved_ns)
{
    return kc_remote_put(R(t), ns, key, source, kind, body, len, saved_ns);
}

static int rt_purge(struct kc_tier *t, const char *ns, const kc_key *key)
{
    return kc_remote_purge(R(t), ns, key);
}

static void rt_after_fork(struct kc_tier *t)
{
    kc_remote_after_fork(R(t));
}

static void rt_close(struct kc_tier *t)
{
    if (t == NULL)
        return;
    kc_remote_close(R(t));
    free(t);
}

/* Hosts: reads only (the owner uploads what they compile). */
static const struct kc_tier_ops reader_ops = {
    .name = "remote",
    .get = rt_get,
    .after_fork = rt_after_fork,
    .close = rt_close,
};

static const struct kc_tier_ops writer_ops = {
    .name = "remote",
    .get = rt_get,
    .put = rt_put,
    .purge = rt_purge,
    .after_fork = rt_after_fork,
    .close = rt_close,
};

int kc_remote_tier(struct kc_remote *r, bool writes, struct kc_tier **out)
{
    if (r == NULL || out == NULL)
        return -EINVAL;
    struct rtier *t = calloc(1, sizeof *t);
    if (t == NULL)
        return -ENOMEM;
    t->base.ops = writes ? &writer_ops : &reader_ops;
    t->r = r;
    *out = &t->base;
    return 0;
}

struct kc_remote *kc_remote_of_tier(struct kc_tier *t)
{
    if (t == NULL || (t->ops != &reader_ops && t->ops != &writer_ops))
        return NULL;
    return R(t);
}

/* ---- counters as statistics --------------------------------------------- */

#define N_REMOTE (sizeof(struct kc_remote_counters) / sizeof(uint64_t))
_Static_assert(sizeof(struct kc_remote_counters) % sizeof(uint64_t) == 0, "u64 fields");
_Static_assert(N_REMOTE <= (size_t)KC_REMOTE_STAT_BACKENDS * KC_N_COUNTERS,
               "the remote's counters fit their backends");

static const char *const stat_names[KC_REMOTE_STAT_BACKENDS] = {"remote.0", "remote.1", "remote.2",
                                                                "remote.3", "remote.4"};

const char *kc_remote_stat_backend(int i)
{
    return i >= 0 && i < KC_REMOTE_STAT_BACKENDS ? stat_names[i] : NULL;
}

bool kc_remote_is_stat_backend(const char *name)
{
    return name != NULL && strncmp(name, "remote.", 7) == 0;
}

void kc_remote_counters_pack(const struct kc_remote_counters *c,
                             struct kc_counters out[KC_REMOTE_STAT_BACKENDS])
{
    const uint64_t *src = (const uint64_t *)c;
    uint64_t v[KC_REMOTE_STAT_BACKENDS][KC_N_COUNTERS];
    memset(v, 0, sizeof v);
    for (size_t i = 0; i < N_REMOTE; i++)
        v[i / KC_N_COUNTERS][i % KC_N_COUNTERS] = src[i];
    for (int b = 0; b < KC_REMOTE_STAT_BACKENDS; b++)
        kc_counters_from_array(&out[b], v[b]);
}

void kc_remote_counters_unpack(const struct kc_counters *in, int which,
                               struct kc_remote_counters *out)
{
    if (which < 0 || which >= KC_REMOTE_STAT_BACKENDS || in == NULL)
        return;
    uint64_t v[KC_N_COUNTERS];
    kc_counters_to_array(in, v);
    uint64_t *dst = (uint64_t *)out;
    for (int k = 0; k < KC_N_COUNTERS; k++) {
        size_t i = (size_t)which * KC_N_COUNTERS + (size_t)k;
        if (i < N_REMOTE)
            dst[i] += v[k];
    }
}

void kc_remote_counters_sub(struct kc_remote_counters *a, const struct kc_remote_counters *b)
{
    uint64_t *x = (uint64_t *)a;
    const uint64_t *y = (const uint64_t *)b;
    for (size_t i = 0; i < N_REMOTE; i++)
        x[i] = x[i] >= y[i] ? x[i] - y[i] : 0;
}
