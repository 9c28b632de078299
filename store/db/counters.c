/*
 * counters.c: the statistics' counters in the meta family ("b/<backend>",
 * meta.h), added to in the write batch: a spool's counter logs (drain.c)
 * and the owner's own counts of its uploads (upload.c).
 */
#include "parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Adds the counters of `n` items to the database's, with `mark` (the
 * applied key of their log, or NULL), in one write: a log is in the
 * counters exactly when its mark is. Items of one backend are summed
 * first (each backend's key is read once). */
int kc__counts_add(struct kc__owner *o, const struct kc__sp_item *items, size_t n,
                   const unsigned char *mark, size_t markl)
{
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(items[j].ns, items[i].ns) == 0;
        if (seen)
            continue;
        unsigned char k[KC__META_NAME_KEY_MAX];
        size_t kl = kc__meta_counters_key(items[i].ns, k);
        uint64_t v[KC_N_COUNTERS] = {0};
        char *old = NULL;
        size_t ol = 0;
        if (kc__db_get(&o->d, KC__CF_META, k, kl, &old, &ol) == 0) {
            kc__meta_counters_parse(old, ol, v); /* another length: from zero */
            free(old);
        }
        for (size_t j = i; j < n; j++) {
            if (strcmp(items[j].ns, items[i].ns) != 0)
                continue;
            uint64_t add[KC_N_COUNTERS];
            kc_counters_to_array(&items[j].c, add);
            for (int f = 0; f < KC_N_COUNTERS; f++)
                v[f] += add[f];
        }
        unsigned char out[KC__META_COUNTERS_VAL_LEN];
        kc__meta_counters_value(v, out);
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (char *)k, kl, (char *)out, sizeof out);
    }
    if (rc == 0 && mark != NULL) {
        unsigned char t[8];
        kc__put_u64(t, kc_wall_ns());
        rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], (const char *)mark, markl, (char *)t,
                                  sizeof t);
    }
    if (rc == 0)
        rc = kc__owner_write(o, wb, false);
    rocksdb_writebatch_destroy(wb);
    return rc;
}

static int apply_count(struct kc__owner *o, const struct kc__sp_item *it)
{
    return kc__counts_add(o, it, 1, NULL, 0);
}

int kc__owner_add_count(struct kc__owner *o, const char *backend, const struct kc_counters *c)
{
    struct kc__sp_item it;
    memset(&it, 0, sizeof it);
    snprintf(it.ns, sizeof it.ns, "%s", backend);
    it.c = *c;
    return apply_count(o, &it);
}
