/*
 * bundle.c: a bundle's import, run in order from the top (bundle.h): the
 * bundle read and checked whole (import.c), then, as the owner, its
 * dictionaries, its entries (as tables into a store with no entry,
 * bulk.c; else as drained puts, import.c), the size limit (evict.c), the
 * filter and the newest entries' hot files. The store (store.c) gives it
 * its reader and its owner (struct kc__store_access). Export is export.c.
 */
#include "owner.h"
#include "jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An empty private file for a copy of the bundle (a pipe, or a file others
 * may change between the passes): unlinked, in $TMPDIR (or /tmp), 0600.
 * The first pass writes into it what it reads (kc__bstream's copy_fd), so
 * nothing is copied past the first byte that fails a check: /dev/zero or an
 * endless pipe stops at the header. */
static int private_copy(struct kc_bundle_info *info, int *out)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/')
        tmp = "/tmp";
    int c = open(tmp, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (c < 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/kcache-bundle-XXXXXX", tmp);
        c = mkostemp(path, O_CLOEXEC);
        if (c < 0)
            return kc__bundle_why(info, -errno,
                                  "cannot make a private copy of the bundle in %s: %s", tmp,
                                  strerror(errno));
        unlink(path);
    }
    *out = c;
    return 0;
}

/* `bundle show`: the header, and the trailer when fd can be seeked. */
static int show(const struct kc_bundle_import_opts *o, struct kc_bundle_info *info)
{
    struct kc__bundle_reader r;
    int rc = kc__bundle_reader_begin(&r, o->fd, NULL, 0, info, o->crypto, true);
    kc__bundle_reader_free(&r);
    if (rc < 0)
        return rc;
    struct stat sb;
    if (fstat(o->fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= KC__BUNDLE_TRAILER) {
        unsigned char t[KC__BUNDLE_TRAILER];
        struct kc_bundle_info ti = {0};
        if (pread(o->fd, t, sizeof t, sb.st_size - KC__BUNDLE_TRAILER) == (ssize_t)sizeof t &&
            kc__bundle_trailer_peek(t, &ti) == 0 && ti.key_id == info->key_id) {
            info->trailer_seen = 1;
            info->blocks = ti.blocks;
        }
        info->file_bytes = (uint64_t)sb.st_size;
    }
    return 0;
}

/* Pass 2: applies every record the store lacks, as the owner. */
static int import_pass(const struct kc__store_access *a, const struct kc_bundle_import_opts *o,
                       int fd, struct kc_bundle_info *info)
{
    struct kc__owner *ow;
    int rc = a->as_owner(a->st, &ow);
    if (rc < 0)
        return kc__bundle_why(info, rc, "cannot become the store's owner: %s",
                              rc == -EBUSY ? "another kcache operation holds it" : strerror(-rc));
    /* Its dictionaries first; into a store with no entry, the entries as
     * tables, ingested whole (bulk.c). */
    bool hot_done = false;
    int bulk = 0;
    rc = kc__import_dicts(ow, fd, o, info);
    if (rc == 0)
        bulk = kc__bulk_import(ow, fd, o, info, &hot_done);
    if (rc < 0) {
        a->end_owner(a->st, ow);
        return rc;
    }
    if (bulk != 0 || lseek(fd, 0, SEEK_SET) != 0)
        rc = bulk < 0   ? bulk
             : bulk > 0 ? 0
                        : kc__bundle_why(info, -errno, "cannot read the bundle again");
    else
        rc = kc__import_entries(ow, o, fd, info);
    int crc = kc__owner_commit(ow);
    if (rc == 0 && crc < 0)
        rc = kc__bundle_why(info, crc, "cannot write to the store: %s", strerror(-crc));
    if (rc == 0) {
        kc__enforce_limit(ow);
        if (ow->f.map != NULL && kc__filter_stale(&ow->f) && kc__owner_filter_rebuild(ow) == 0)
            kc__filter_set_stamp(&ow->f, KC__FILTER_LIVE);
        if (!hot_done)
            kc__import_hot(ow);
    }
    a->end_owner(a->st, ow);
    return rc;
}

int kc__bundle_import(const struct kc__store_access *a, const struct kc_bundle_import_opts *o,
                      struct kc_bundle_info *info)
{
    memset(info, 0, sizeof *info);
    if (o == NULL || o->fd < 0)
        return kc__bundle_why(info, -EINVAL, "invalid arguments");
    if (o->header_only)
        return show(o, info);
    /* Two readings of the same bytes: the file's, when it is a regular file
     * only this user (or root) can change; else a private copy's, made by
     * the first reading (a dry run reads once and copies nothing). */
    struct stat sb;
    int fd = o->fd, copy = -1;
    if (fstat(fd, &sb) != 0)
        return kc__bundle_why(info, -errno, "cannot read the bundle: %s", strerror(errno));
    bool private = S_ISREG(sb.st_mode) && (sb.st_uid == geteuid() || sb.st_uid == 0) &&
                   (sb.st_mode & 022) == 0 && lseek(fd, 0, SEEK_CUR) == 0;
    bool second = a != NULL && !o->dry_run;
    int rc = 0;
    if (private && lseek(fd, 0, SEEK_SET) != 0)
        rc = kc__bundle_why(info, -errno, "cannot read the bundle: %s", strerror(errno));
    if (rc == 0 && !private && second)
        rc = private_copy(info, &copy);
    if (rc == 0) {
        if (o->progress_stage != NULL)
            o->progress_stage("check", o->progress_arg);
        rc = kc__import_check(a, o, fd, copy, info);
    }
    if (copy >= 0)
        fd = copy;
    if (rc == 0 && second) {
        for (size_t i = 0; i < info->n_ns; i++)
            info->ns[i].imported = info->ns[i].present = info->ns[i].skipped = 0;
        rc = lseek(fd, 0, SEEK_SET) == 0 ? 0 : -errno;
        if (rc < 0)
            kc__bundle_why(info, rc, "cannot read the bundle: %s", strerror(-rc));
        else if (o->progress_stage != NULL)
            o->progress_stage("write", o->progress_arg);
        if (rc == 0)
            rc = import_pass(a, o, fd, info);
    }
    if (copy >= 0)
        close(copy);
    return rc;
}
