/*
 * batch.c: the bottom of the owner (batch.h): the session's state, the
 * write batch every job writes through (kc__owner_write) and the durable
 * commit each ends with (kc__owner_commit: a synced write of the next
 * generation, which readers watch), and stop requests. It calls only the
 * database (db.h).
 */
#include "batch.h"

#include <dirent.h>
#include <errno.h>

struct kc__db *kc__owner_db(struct kc__owner *o)
{
    return &o->d;
}

int kc__owner_write(struct kc__owner *o, rocksdb_writebatch_t *wb, bool sync)
{
    char *err = NULL;
    rocksdb_write(o->d.db, sync ? o->d.wo_sync : o->d.wo, wb, &err);
    int rc = kc__db_err(err, "write");
    if (rc == -EBADMSG) /* a background error: a compaction read a bad block */
        o->d.corrupt = true;
    return rc;
}

/* Makes everything written so far durable and tells readers to catch up. */
int kc__owner_commit(struct kc__owner *o)
{
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    unsigned char v[KC__META_GEN_VAL_LEN];
    kc__meta_gen_value(++o->gen_seq, v);
    rocksdb_writebatch_put_cf(wb, o->d.cf[KC__CF_META], KC__META_GEN_KEY, 1, (char *)v, sizeof v);
    int rc = kc__owner_write(o, wb, true);
    rocksdb_writebatch_destroy(wb);
    if (rc == 0 && o->gen != NULL)
        __atomic_add_fetch(o->gen, 1, __ATOMIC_SEQ_CST);
    return rc;
}

/* Whether a tool operation asked this owner to stop (an s- file). */
bool kc__stop_asked(struct kc__owner *o)
{
    DIR *d = opendir(o->p.spool);
    struct dirent *e;
    bool asked = false;
    while (!asked && d != NULL && (e = readdir(d)) != NULL)
        asked = e->d_name[0] == 's' && e->d_name[1] == '-';
    if (d != NULL)
        closedir(d);
    return asked;
}
