/*
 * spool.c: the directory layout, spool and hot file names and reads. libc
 * only: compiled into the store and into the shim's front (see local.h).
 */
#include "local.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUT_FILE_MAX (1ull << 32)

void kc__paths_init(struct kc__paths *p, const char *dir)
{
    char **field[] = {&p->dir, &p->db, &p->spool, &p->sec, &p->lock, &p->gen, &p->hot, &p->filter};
    static const char *const part[] = {"",     "/db",  "/spool", "/sec", "/owner.lock",
                                       "/gen", "/hot", "/filter"};
    size_t off = 0;
    for (size_t i = 0; i < sizeof field / sizeof *field; i++) {
        size_t cap = i == 0 ? 4096 : 4200;
        int n = snprintf(p->buf + off, cap, "%s%s", dir, part[i]);
        *field[i] = p->buf + off;
        off += n < 0 ? 1 : (size_t)n < cap ? (size_t)n + 1 : cap;
    }
}

void kc__spool_name(const char *ns, const kc_key *key, char prefix, char out[40])
{
    unsigned char kk[KC__NS_MAX + 1 + KC__KEY_LEN];
    size_t kl = kc__kkey(ns, key, kk);
    kc_digest d = kc_digest_of(kk, kl);
    unsigned char b[16];
    kc__digest_encode(&d, b);
    if (prefix == 0) {
        kc__hex(b, 16, out);
        return;
    }
    out[0] = prefix;
    out[1] = '-';
    kc__hex(b, 16, out + 2);
}

bool kc__spool_pending(const char *spool)
{
    DIR *d = opendir(spool);
    if (d == NULL)
        return false;
    bool any = false;
    struct dirent *e;
    while (!any && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (n[0] != 0 && n[1] == '-' && strchr("pdxhc", n[0]) != NULL)
            any = true;
    }
    closedir(d);
    return any;
}

/* Reads and decodes a put file, plain or packed. */
static int put_file_load(const char *path, unsigned char **buf, struct kc__sp_put *sp)
{
    unsigned char *b;
    size_t n;
    int rc = kc__read_file(AT_FDCWD, path, PUT_FILE_MAX, &b, &n);
    if (rc < 0)
        return rc == -ENOENT ? -ENOENT : -EBADMSG;
    if (kc__put_decode_any(&b, &n, sp) != 0) {
        free(b);
        return -EBADMSG;
    }
    *buf = b;
    return 0;
}

/* put_file_load's answer, refused (-EBADMSG) when the file does not hold
 * the key asked for. */
static int put_file_kept(int rc, bool holds, unsigned char **buf)
{
    if (rc == 0 && !holds) {
        free(*buf);
        *buf = NULL;
        return -EBADMSG;
    }
    return rc;
}

int kc__put_file_read(const char *path, const char *ns, const kc_key *key, unsigned char **buf,
                      struct kc__sp_put *sp)
{
    int rc = put_file_load(path, buf, sp);
    return put_file_kept(
        rc, rc == 0 && strcmp(sp->ns, ns) == 0 && memcmp(&sp->key, key, sizeof *key) == 0, buf);
}

int kc__hot_file_read(const char *hot, const char *name, unsigned char **buf, struct kc__sp_put *sp)
{
    char path[4400], want[40] = "";
    snprintf(path, sizeof path, "%s/%s", hot, name);
    int rc = put_file_load(path, buf, sp);
    if (rc == 0)
        kc__spool_name(sp->ns, &sp->key, 0, want);
    return put_file_kept(rc, strcmp(want, name) == 0, buf);
}
