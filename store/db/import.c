/*
 * import.c: a bundle written into the store as drained puts are, the
 * first of the stream's two writers (bulk.c, the other, writes a store
 * with no entry as tables). The whole bundle is read and checked first
 * (kc__import_check), its dictionaries written (kc__import_dicts), then,
 * as the owner, every record the store lacks applied (kc__import_entries)
 * and the newest entries given hot files (kc__import_hot). bundle.c runs
 * them in order.
 */
#include "jobs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Import commits every ROUND_ENTRIES records or ROUND_BYTES bytes. */
#define ROUND_ENTRIES 4096
#define ROUND_BYTES (64u << 20)

/* Pass 1: reads and checks all of it (copying what it reads to copy_fd,
 * when not -1); counts what is present already. */
int kc__import_check(const struct kc__store_access *a, const struct kc_bundle_import_opts *o,
                     int fd, int copy_fd, struct kc_bundle_info *info)
{
    struct kc__bundle_reader r;
    struct kc__import_read ir;
    kc__import_read_begin(&ir, o, fd);
    int rc = kc__bundle_reader_begin_read(&r, fd, copy_fd, kc__import_on_read, &ir, info, o->crypto,
                                          o->trust_unsigned != 0);
    if (rc < 0 && r.s.copy_err != 0)
        rc = kc__bundle_why(info, r.s.copy_err, "cannot copy the bundle to a private file: %s",
                            strerror(-r.s.copy_err));
    /* A dry run (the command that checks a bundle) inflates every body; an
     * import checks each against its digest and its frame's stated size,
     * and every get inflates and checks a body before it is served. */
    r.check_bodies = o->dry_run != 0;
    struct kc__db *d = NULL;
    bool have = rc == 0 && a != NULL && o->dry_run && a->reader_hold(a->st, &d) == 0;
    for (size_t i = 0; rc == 0 && i < info->n_ns; i++)
        info->ns[i].usable = o->usable != NULL ? o->usable(info->ns[i].ns, o->usable_arg) : -1;
    while (rc == 0) {
        struct kc__sp_put sp;
        size_t idx;
        int n = kc__bundle_reader_next(&r, &sp, NULL, NULL, &idx);
        if (n <= 0) {
            rc = n;
            if (rc < 0 && r.s.copy_err != 0)
                rc = kc__bundle_why(info, r.s.copy_err,
                                    "cannot copy the bundle to a private file: %s",
                                    strerror(-r.s.copy_err));
            if (rc == 0)
                kc__import_read_end(&ir, r.s.fd_bytes);
            break;
        }
        struct kc_bundle_ns *e = &info->ns[idx];
        if (o->only_usable && e->usable == 0) {
            e->skipped++;
            continue;
        }
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(sp.ns, &sp.key, kk);
        char *v = NULL;
        size_t vl = 0;
        if (have && kc__db_get(d, KC__CF_KERNELS, kk, kl, &v, &vl) == 0) {
            free(v);
            e->present++;
        } else {
            e->imported++;
        }
    }
    if (have)
        a->reader_release(a->st);
    kc__bundle_reader_free(&r);
    return rc;
}

static int touch_cand(struct kc__sel *s, const struct kc__cand *c, void *arg)
{
    if (kc__sel_selected(s, c))
        kc__hot_touch(arg, c->ns, &c->key);
    return 0;
}

/* After an import: hot files (a host's hits without RocksDB) for the most
 * recently used entries, as many as DIR/hot's bound now holds (it follows
 * the tables' size), as if they had just been drained. A store warmed from
 * a bundle then serves its first hits as one warmed by compiling does. */
void kc__import_hot(struct kc__owner *ow)
{
    if (kc__db_flush_all(&ow->d) != 0)
        return;
    ow->hot_max = kc__hot_limit(ow);
    uint64_t target = ow->hot_max / 10 * 9;
    if (ow->hot_max == 0 || ow->hot_bytes >= target)
        return;
    struct kc_bundle_export_opts all = {.fd = -1};
    struct kc__sel s = {.o = &all, .d = &ow->d, .blocks = true};
    struct kc__sel_total t = {0};
    if (kc__sel_each(&s, kc__sel_add_total, &t) != 0)
        return;
    if (t.bytes > target - ow->hot_bytes && kc__sel_cut(&s, target - ow->hot_bytes) != 0)
        return;
    kc__sel_each(&s, touch_cand, ow);
    kc__hot_enforce(ow);
}

/* The bundle's dictionaries into the store, synced before any body naming
 * one is written; the store's own current one stays (or, when it has none,
 * the bundle's last becomes it). */
int kc__import_dicts(struct kc__owner *ow, int fd, const struct kc_bundle_import_opts *o,
                     struct kc_bundle_info *info)
{
    if (lseek(fd, 0, SEEK_SET) != 0)
        return kc__bundle_why(info, -errno, "cannot read the bundle again: %s", strerror(errno));
    struct kc_bundle_info hi;
    struct kc__bundle_reader r;
    int rc = kc__bundle_reader_begin(&r, fd, NULL, 0, &hi, o->crypto, o->trust_unsigned != 0);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    size_t added = 0;
    for (size_t i = 0; rc == 0 && i < r.n_dicts; i++) {
        unsigned char k[KC__META_DICT_KEY_LEN];
        size_t kl = kc__meta_dict_key(r.dict[i].id, k);
        char *v = NULL;
        size_t vl = 0;
        int g = kc__db_get(&ow->d, KC__CF_META, k, kl, &v, &vl);
        free(v);
        if (g == -ENOENT) {
            rocksdb_writebatch_put_cf(wb, ow->d.cf[KC__CF_META], (char *)k, kl,
                                      (char *)r.dict_data + r.dict[i].off, r.dict[i].len);
            added++;
        } else if (g < 0) {
            rc = g;
        }
    }
    char *cur = NULL;
    size_t cl = 0;
    if (rc == 0 && r.n_dicts > 0 &&
        kc__db_get(&ow->d, KC__CF_META, KC__META_DICT_CURRENT, 2, &cur, &cl) == -ENOENT) {
        unsigned char id[8];
        kc_le_put_u64(id, r.dict[r.n_dicts - 1].id);
        rocksdb_writebatch_put_cf(wb, ow->d.cf[KC__CF_META], KC__META_DICT_CURRENT, 2, (char *)id,
                                  sizeof id);
        added++;
    }
    free(cur);
    if (rc == 0 && added > 0 && (rc = kc__owner_write(ow, wb, true)) == 0)
        kc__dict_load(ow);
    rocksdb_writebatch_destroy(wb);
    free(hi.ns);
    kc__bundle_reader_free(&r);
    if (rc < 0 && info->why[0] == '\0')
        kc__bundle_why(info, rc, "cannot write to the store: %s", strerror(-rc));
    if (rc == 0 && lseek(fd, 0, SEEK_SET) != 0)
        rc = kc__bundle_why(info, -errno, "cannot read the bundle again: %s", strerror(errno));
    return rc;
}

/* Pass 2 as drained puts: every record the store lacks applied
 * (kc__apply_put_stored), in rounds of synced commits. */
int kc__import_entries(struct kc__owner *ow, const struct kc_bundle_import_opts *o, int fd,
                       struct kc_bundle_info *info)
{
    struct kc_bundle_info again;
    struct kc__bundle_reader r;
    struct kc__import_read ir;
    kc__import_read_begin(&ir, o, fd);
    int rc = kc__bundle_reader_begin_read(&r, fd, -1, kc__import_on_read, &ir, &again, o->crypto,
                                          o->trust_unsigned != 0);
    /* The first reading checked every body; the bytes are the same (a
     * private file), and their digests are checked again. */
    struct kc__buf body = {0};
    uint64_t round_n = 0, round_bytes = 0;
    while (rc == 0) {
        struct kc__sp_put sp;
        size_t idx, len;
        const unsigned char *put;
        int n = kc__bundle_reader_next(&r, &sp, &put, &len, &idx);
        if (n <= 0) {
            rc = n;
            if (rc == 0)
                kc__import_read_end(&ir, r.s.fd_bytes);
            break;
        }
        if (idx >= info->n_ns || strcmp(info->ns[idx].ns, sp.ns) != 0) {
            rc = kc__bundle_why(info, -EIO, "the bundle changed between its two readings");
            break;
        }
        struct kc_bundle_ns *e = &info->ns[idx];
        if (o->only_usable && e->usable == 0) {
            e->skipped++;
            continue;
        }
        unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
        size_t kl = kc__kkey(sp.ns, &sp.key, kk);
        char *v = NULL;
        size_t vl = 0;
        int g = kc__db_get(&ow->d, KC__CF_KERNELS, kk, kl, &v, &vl);
        free(v);
        if (g == 0) {
            e->present++;
            continue;
        }
        bool applied = false;
        if (r.entry_detached) {
            /* Its body is a body record read before: from the file (the
             * same private bytes, checked then). */
            rc = kc_buf_reserve(&body, r.entry_stored_len);
            if (rc == 0 && pread(fd, body.p, r.entry_stored_len, (off_t)r.entry_stored_at) !=
                               (ssize_t)r.entry_stored_len)
                rc = -EIO;
            if (rc == 0 &&
                kc_digest_of(body.p, r.entry_stored_len).lo != kc__get_u64(r.entry_digest))
                rc = -EIO;
            if (rc < 0) {
                kc__bundle_why(info, rc, "the bundle changed between its readings");
                break;
            }
            rc =
                kc__apply_put_stored(ow, &sp, r.entry_digest, body.p, r.entry_stored_len, &applied);
        } else {
            rc = r.entry_stored != NULL
                     ? kc__apply_put_stored(ow, &sp, r.entry_digest, r.entry_stored,
                                            r.entry_stored_len, &applied)
                     : kc__apply_put(ow, &sp, &applied);
        }
        if (rc < 0) {
            kc__bundle_why(info, rc, "cannot write to the store: %s", strerror(-rc));
            break;
        }
        e->imported += applied;
        round_bytes += len;
        if (++round_n >= ROUND_ENTRIES || round_bytes >= ROUND_BYTES) {
            if ((rc = kc__owner_commit(ow)) < 0) {
                kc__bundle_why(info, rc, "cannot write to the store: %s", strerror(-rc));
                break;
            }
            round_n = round_bytes = 0;
        }
    }
    if (rc < 0 && info->why[0] == '\0')
        snprintf(info->why, sizeof info->why, "%s", again.why);
    kc__buf_free(&body);
    free(again.ns);
    kc__bundle_reader_free(&r);
    return rc;
}
