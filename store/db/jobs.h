/*
 * jobs.h: the owner's jobs, each one file over the steps (steps.h), the
 * parts (parts.h) and the write batch (batch.h), none calling another:
 * draining the spool (drain.c), eviction (evict.c), recovery
 * (recover.c), a bundle's export (export.c) and its two writers (import.c,
 * bulk.c), ready copies of NVRTC's bundled headers (ready.c). Where one job needs another (an
 * import, eviction), the top (owner.c, admin.c, bundle.c) runs both in order.
 */
#ifndef KCACHE_STORE_JOBS_H
#define KCACHE_STORE_JOBS_H

#include "steps.h"

#include <sys/stat.h>
#include <unistd.h>

/* ---- drain (drain.c) ------------------------------------------------------- */

/* One drain of the spool: put files in rounds (each committed, uploaded,
 * then retired into hot files), then purge, hit and counter logs (one
 * commit); *count (if not NULL) the files done. 0 or a negative errno; a
 * corruption leaves o->d.corrupt set (kc__owner_drain recovers). */
int kc__drain_once(struct kc__owner *o, uint64_t *count);

/* ---- recency and eviction (evict.c) ---------------------------------------- */

/* Evicts the least recently hit entries until o->unique <= target, then
 * commits; *evicted (if not NULL) counts them. */
int kc__evict(struct kc__owner *o, uint64_t target, uint64_t *evicted, kc_progress_fn progress,
              void *arg);
/* Drops sources entries whose kernel is gone. */
void kc__prune_sources(struct kc__owner *o);
/* Past the size limit, evicts down to 90% of it. */
int kc__enforce_limit(struct kc__owner *o);

/* ---- recovery (recover.c) ----------------------------------------------------- */

/* Recovers a database RocksDB reported corrupt (why: during what, for the
 * log): repaired, or replaced by a new one; hot files put back; verified
 * with repair; the filter rebuilt. 0 or a negative errno. */
int kc__owner_recover(struct kc__owner *o, const char *why);

/* ---- ready copies of NVRTC's bundled headers (ready.c) ---------------------- */

/* Makes the ready copies DIR/bundled's wants ask for (*made counts them)
 * and removes the ones no want or store copy is left for. */
int kc__ready_job(struct kc__owner *o, uint32_t *made);

/* ---- bundles (export.c, import.c, bulk.c) ---------------------------------- */

struct kc_store;
/* What a bundle operation needs of the store it runs on, given by the top
 * (store.c): its reader caught up and held (0 with *d, release it;
 * -ENOENT: no database yet; -EIO: no reader could be opened), and the
 * owner for a tool operation (-EROFS on a read-only store), ended
 * (starting the background owner again if writers left work). */
struct kc__store_access {
    struct kc_store *st;
    int (*reader_hold)(struct kc_store *st, struct kc__db **d);
    void (*reader_release)(struct kc_store *st);
    int (*as_owner)(struct kc_store *st, struct kc__owner **o);
    void (*end_owner)(struct kc_store *st, struct kc__owner *o);
};

/* Writes a bundle of the store's entries that opts selects to opts->fd
 * (kc_store_admin's bundle_export); a NULL store is -EINVAL. */
int kc__bundle_export(const struct kc__store_access *a, const struct kc_bundle_export_opts *opts,
                      struct kc_bundle_info *info);

/* An import's progress (opts->progress, when set): done of total bytes of
 * the bundle read (total 0: unknown, a pipe's). */
static inline void kc__import_progress(const struct kc_bundle_import_opts *o, uint64_t done,
                                       uint64_t total)
{
    if (o->progress != NULL)
        o->progress(done, total, o->progress_arg);
}

/* An import's reading of fd, for kc__bundle_reader_begin_read: its bytes
 * read of total (the file's size; 0 for a pipe), short of the total until
 * the reading's end reports it (kc__import_read_end). */
struct kc__import_read {
    const struct kc_bundle_import_opts *o;
    uint64_t total;
};
static inline void kc__import_read_begin(struct kc__import_read *ir,
                                         const struct kc_bundle_import_opts *o, int fd)
{
    struct stat sb;
    ir->o = o;
    ir->total = 0;
    off_t at = lseek(fd, 0, SEEK_CUR);
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && at >= 0 && sb.st_size > at)
        ir->total = (uint64_t)(sb.st_size - at);
}

static inline void kc__import_on_read(uint64_t bytes, void *arg)
{
    struct kc__import_read *ir = arg;
    if (ir->o->progress == NULL)
        return;
    if (ir->total > 0 && bytes >= ir->total)
        bytes = ir->total - 1;
    kc__import_progress(ir->o, bytes, ir->total);
}

static inline void kc__import_read_end(struct kc__import_read *ir, uint64_t bytes)
{
    kc__import_progress(ir->o, bytes, bytes);
}

/* Pass 1 of an import: reads and checks all of the bundle on fd (copying
 * what it reads to copy_fd, when not -1); a dry run with a store counts
 * what is present already. 0 or a negative errno with info->why. */
int kc__import_check(const struct kc__store_access *a, const struct kc_bundle_import_opts *o,
                     int fd, int copy_fd, struct kc_bundle_info *info);
/* The bundle's dictionaries into the store, synced before any body naming
 * one is written (fd read from 0, and left at 0). */
int kc__import_dicts(struct kc__owner *ow, int fd, const struct kc_bundle_import_opts *o,
                     struct kc_bundle_info *info);
/* Pass 2: applies every record the store lacks, as drained puts are, in
 * rounds of synced commits (fd at 0). */
int kc__import_entries(struct kc__owner *ow, const struct kc_bundle_import_opts *o, int fd,
                       struct kc_bundle_info *info);
/* After an import: hot files for the most recently used entries, as many
 * as DIR/hot's bound holds. */
void kc__import_hot(struct kc__owner *ow);

/* Imports a verified bundle (fd: a private regular file, read from 0) into
 * the owner's database when that holds no entry, as sorted tables
 * ingested whole: 1 when done (info's per-namespace counts set; *hot_done
 * when it wrote the hot files of the newest entries too), 0 when
 * the bundle or the store does not qualify (nothing written: import as
 * drained puts), or a negative errno with info->why. */
int kc__bulk_import(struct kc__owner *ow, int fd, const struct kc_bundle_import_opts *o,
                    struct kc_bundle_info *info, bool *hot_done);
/* Removes bulk.c's tables a killed import left in DIR/db. */
void kc__bulk_sweep(struct kc__owner *ow);

#endif
