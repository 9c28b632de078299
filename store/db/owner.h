/*
 * owner.h: the top of the owner, what the store (store.c) calls: the
 * session (owner.c: begin, drain, end, the run loop of a background
 * owner), the tool's writing operations (admin.c: gc, verify, clear) and
 * a bundle's import (bundle.c). These run the jobs (jobs.h) in order; no
 * job calls them, nor another job.
 */
#ifndef KCACHE_STORE_OWNER_H
#define KCACHE_STORE_OWNER_H

#include "../store.h"

#include <stdint.h>

struct kc__owner;
struct kc__store_access;

/* ---- the session (owner.c) ----------------------------------------------- */

/* Becomes the owner of `dir`: takes the lock (asking a running owner to stop
 * and waiting up to wait_ms), opens the primary, drains the spool. */
int kc__owner_begin(const char *dir, uint64_t max_size, int wait_ms, struct kc__owner **out);
void kc__owner_end(struct kc__owner *o);
/* Drains the spool (kc__drain_once); a database RocksDB reports corrupt
 * is recovered (kc__owner_recover) and the drain done again. */
int kc__owner_drain(struct kc__owner *o, uint64_t *n);
/* The background owner: a session, drained again as the spool fills, until
 * idle_ms without work (kc_store_admin's owner_run). */
int kc__owner_run(const struct kc_store_options *opts, int idle_ms);

/* ---- the tool's writing operations (admin.c) ------------------------------ */

int kc__owner_verify(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                     kc_progress_fn progress, void *arg);
int kc__owner_gc(struct kc__owner *o, uint64_t max_size, struct kc_gc_report *rep,
                 kc_progress_fn progress, void *arg);
int kc__owner_clear(struct kc__owner *o);

/* ---- a bundle's import (bundle.c) ----------------------------------------- */

/* Reads and checks the bundle on opts->fd, then (with a store, not a dry
 * run) imports it as the owner (kc_store_admin's bundle_import). */
int kc__bundle_import(const struct kc__store_access *a, const struct kc_bundle_import_opts *opts,
                      struct kc_bundle_info *info);

#endif
