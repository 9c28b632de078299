/*
 * steps.h: steps more than one job takes, each one file over the parts
 * (parts.h), none calling another: putting one record and folding one hit
 * (put.c), one verify pass (verify.c), the uploads of a drained round
 * (upload.c). The jobs (jobs.h) stand on them.
 */
#ifndef KCACHE_STORE_STEPS_H
#define KCACHE_STORE_STEPS_H

#include "parts.h"

/* ---- one record (put.c) ---------------------------------------------------- */

/* Applies a put (not committed): 0 with *applied whether it is now the
 * entry (false: the database holds a newer one), or a negative errno. */
int kc__apply_put(struct kc__owner *o, const struct kc__sp_put *sp, bool *applied);
/* The same with the body given as stored (body.c; sp->body unused) and
 * digest, kc_digest_of the stored bytes (the bodies family's key), which
 * the caller has checked: a bundle's entry, or kc__apply_put's. */
int kc__apply_put_stored(struct kc__owner *o, const struct kc__sp_put *sp,
                         const unsigned char digest[16], const void *stored, size_t stored_len,
                         bool *applied);
/* Folds one hit log item into its entry (hits, last hit) and its hot file. */
int kc__apply_hit(struct kc__owner *o, const struct kc__sp_item *it);

/* ---- verify (verify.c) ------------------------------------------------------ */

/* One verify pass (kc__owner_verify, admin.c, without the recovery). */
int kc__verify_once(struct kc__owner *o, int repair, struct kc_verify_report *rep,
                    kc_progress_fn progress, void *arg);

/* ---- uploads to the remote (upload.c) --------------------------------------- */

/* After a round's commit, before its put files are retired: uploads the
 * put files names[0..n) of DIR/spool that keep[i] says are now their entry
 * (not those a host was served by the remote), entries before manifests,
 * when KCACHE_REMOTE is set; puts the remote could not take now are
 * remembered. Never fails: the entries stay local. */
void kc__upload_round(struct kc__owner *o, char **names, const bool *keep, size_t n);
/* Uploads the remembered puts again, from the database, once the remote
 * can be tried again (its backoff). */
void kc__upload_retry(struct kc__owner *o);

#endif
