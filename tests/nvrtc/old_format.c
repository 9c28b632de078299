/*
 * kc-old-format: rewrites every entry of a cache directory into the layout
 * the previous record format (KC_FORMAT_VERSION 1) wrote, in place, under
 * the keys the current build looks up; for test_old_format.py.
 *
 * Usage: kc-old-format DIR le|be [--only-nvrtc]
 *
 * The previous build wrote record headers of format 1 and encoded the NVRTC
 * replay record and manifests in the host's byte order ("KCNV" 2 and
 * "KCMF" 2 magics, each u64): `le` writes those bodies as a little-endian
 * host wrote them, `be` as a big-endian host did (the case the explicit
 * little-endian layout exists for). Other kinds keep their bodies; every
 * header says format 1. Entries are rewritten in the database (kernels and
 * bodies, with the body references), in DIR/hot and in the spool; with
 * --only-nvrtc only the NVRTC replay records are (manifests stay current,
 * so a lookup reaches the old records). The owner lock is held throughout
 * (a running owner is asked to stop). Prints "converted N entries (nvrtc
 * A, manifest B, other C), H hot files", counting the database's entries.
 */
#include "buf.h"
#include "codec.h"
#include "internal.h"
#include "meta.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OLD_FORMAT 1
#define OLD_REPLAY_MAGIC 0x324b434e56ull   /* "KCNV" 2 */
#define OLD_MANIFEST_MAGIC 0x324b434d46ull /* "KCMF" 2 */

static int big;        /* the host order written: 1 big-endian, 0 little-endian */
static int only_nvrtc; /* rewrite NVRTC replay records only */

static void put(struct kc_buf *b, const void *p, size_t n)
{
    kc_buf_add(b, p, n);
}

static void put_u64(struct kc_buf *b, uint64_t v)
{
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[big ? 7 - i : i] = (unsigned char)(v >> (8 * i));
    put(b, x, 8);
}

static void put_i32(struct kc_buf *b, int v)
{
    uint32_t u = (uint32_t)(int32_t)v;
    unsigned char x[4];
    for (int i = 0; i < 4; i++)
        x[big ? 3 - i : i] = (unsigned char)(u >> (8 * i));
    put(b, x, 4);
}

static void put_blob(struct kc_buf *b, const void *p, uint64_t n)
{
    put_u64(b, n);
    put(b, p, n);
}

/* A kc_digest as the previous build stored it: the struct's bytes. */
static void put_digest(struct kc_buf *b, const kc_digest *d)
{
    put_u64(b, d->lo);
    put_u64(b, d->hi);
}

/* The previous build's kc__replay_encode, in the chosen host order. */
static void old_replay(const struct kc__replay *r, struct kc_buf *b)
{
    put_u64(b, OLD_REPLAY_MAGIC);
    put_i32(b, r->compile_rc);
    for (int i = 0; i < N_OUT; i++) {
        const struct kc__output *o = &r->out[i];
        put_i32(b, o->size_rc);
        put_i32(b, o->size_set);
        put_u64(b, o->size);
        put_i32(b, o->get_rc);
        put_i32(b, o->size_null_rc);
        put_i32(b, o->get_null_rc);
        put_blob(b, o->bytes, o->nbytes);
    }
    put_u64(b, r->n_names);
    for (uint32_t i = 0; i < r->n_names; i++) {
        const struct kc__lowered *l = &r->names[i];
        put_blob(b, l->expr, strlen(l->expr));
        put_i32(b, l->rc);
        put_i32(b, l->is_null);
        put_blob(b, l->name, l->name ? strlen(l->name) : 0);
    }
    put_i32(b, r->lowered_unknown_rc);
    put_i32(b, r->lowered_null_name_rc);
    put_i32(b, r->lowered_null_out_rc);
    put_i32(b, r->add_after_rc);
    put_i32(b, r->pch_status_rc);
    put_i32(b, r->pch_required_rc);
    put_i32(b, r->pch_required_set);
    put_i32(b, r->pch_required_null_rc);
    put_u64(b, r->pch_required);
}

/* The previous build's manifest encoding, in the chosen host order. */
static void old_manifest(const struct kc__manifest *m, struct kc_buf *b)
{
    put_u64(b, OLD_MANIFEST_MAGIC);
    put_u64(b, m->n);
    for (uint64_t i = 0; i < m->n; i++) {
        const struct kc__dep_set *s = &m->sets[i];
        put_digest(b, &s->result);
        put_u64(b, s->n);
        for (uint64_t j = 0; j < s->n; j++) {
            const struct kc__dep *d = &s->deps[j];
            put_i32(b, d->kind);
            put_blob(b, d->path, strlen(d->path));
            put_digest(b, &d->digest);
            for (int f = 0; f < 5; f++)
                put_u64(b, d->fp[f]);
        }
    }
}

static int n_nvrtc, n_manifest, n_other, n_hot;

/* Whether an entry of `kind` is rewritten. */
static int wanted(uint32_t kind)
{
    return !only_nvrtc || kind == KC_KIND_NVRTC;
}

/* The previous build's body for a current one of `kind`, in *out; counted
 * when `count`. */
static int old_body(uint32_t kind, const void *body, size_t len, struct kc_buf *out, int count)
{
    if (kind == KC_KIND_NVRTC) {
        struct kc__replay *r = kc__replay_decode(body, len);
        if (r == NULL)
            return -EBADMSG;
        old_replay(r, out);
        kc__replay_free(r);
        n_nvrtc += count;
    } else if (kind == KC_KIND_MANIFEST) {
        struct kc__manifest *m = kc__manifest_decode(body, len);
        if (m == NULL)
            return -EBADMSG;
        old_manifest(m, out);
        kc__manifest_free(m);
        n_manifest += count;
    } else {
        kc_buf_add(out, body, len);
        n_other += count;
    }
    return out->err;
}

static void old_header(struct kc__hdr *h, const struct kc_buf *body)
{
    h->format = OLD_FORMAT;
    h->body_size = body->len;
    h->body_xxh = kc__body_xxh(body->p, body->len);
}

/* ---- the database ------------------------------------------------------ */

static void die(const char *what, int rc)
{
    fprintf(stderr, "kc-old-format: %s: %s\n", what, strerror(-rc));
    exit(1);
}

static void ref_add(struct kc__db *d, rocksdb_writebatch_t *wb, const unsigned char dg[16],
                    int64_t by, uint64_t size)
{
    unsigned char rk[18] = {'r', '/'}, v[16];
    memcpy(rk + 2, dg, 16);
    char *old = NULL;
    size_t ol = 0;
    uint64_t cnt = 0;
    if (kc__db_get(d, KC__CF_META, rk, sizeof rk, &old, &ol) == 0 && ol == 16) {
        cnt = kc_le_get_u64((unsigned char *)old);
        size = kc_le_get_u64((unsigned char *)old + 8);
    }
    free(old);
    cnt = (uint64_t)((int64_t)cnt + by);
    if ((int64_t)cnt <= 0) {
        rocksdb_writebatch_delete_cf(wb, d->cf[KC__CF_META], (char *)rk, sizeof rk);
        rocksdb_writebatch_delete_cf(wb, d->cf[KC__CF_BODIES], (const char *)dg, 16);
        return;
    }
    kc_le_put_u64(v, cnt);
    kc_le_put_u64(v + 8, size);
    rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_META], (char *)rk, sizeof rk, (char *)v, 16);
}

static int convert_db(struct kc__db *d)
{
    int n = 0;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(d->db, d->ro, d->cf[KC__CF_KERNELS]);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *v = rocksdb_iter_value(it, &vl);
        struct kc__hdr h;
        if (vl != KC__KVAL_LEN || kc__hdr_decode(v, vl, &h) != 0 || !wanted(h.kind))
            continue;
        unsigned char odg[16];
        memcpy(odg, v + KC__HDR_LEN, 16);
        char *body = NULL;
        size_t bl = 0;
        /* Inflated (body.c): the previous layout kept bodies as they are. */
        int rc = kc__body_get(d, odg, &body, &bl);
        if (rc < 0)
            die("body", rc);
        struct kc_buf nb = {0};
        if ((rc = old_body(h.kind, body, bl, &nb, 1)) < 0)
            die("decoding a current body", rc);
        free(body);
        old_header(&h, &nb);
        kc_digest nd = kc_digest_of(nb.p, nb.len);
        unsigned char kv[KC__KVAL_LEN];
        kc__hdr_encode(&h, kv);
        kc__digest_encode(&nd, kv + KC__HDR_LEN);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        ref_add(d, wb, odg, -1, 0);
        rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_BODIES], (char *)kv + KC__HDR_LEN, 16,
                                  (char *)nb.p, nb.len);
        ref_add(d, wb, kv + KC__HDR_LEN, 1, nb.len);
        rocksdb_writebatch_put_cf(wb, d->cf[KC__CF_KERNELS], k, kl, (char *)kv, sizeof kv);
        char *err = NULL;
        rocksdb_write(d->db, d->wo_sync, wb, &err);
        rocksdb_writebatch_destroy(wb);
        if (err != NULL) {
            fprintf(stderr, "kc-old-format: write: %s\n", err);
            exit(1);
        }
        kc_buf_free(&nb);
        n++;
    }
    rocksdb_iter_destroy(it);
    return n;
}

/* ---- put files (DIR/hot, DIR/spool) ------------------------------------ */

static void convert_put_file(const char *dir, const char *name)
{
    unsigned char *buf = NULL;
    struct kc__sp_put sp;
    if (kc__hot_file_read(dir, name, &buf, &sp) != 0) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        size_t n;
        if (kc__read_file(AT_FDCWD, path, 1ull << 32, &buf, &n) != 0 ||
            kc__put_decode_any(&buf, &n, &sp) != 0) {
            free(buf);
            return;
        }
    }
    if (!wanted(sp.hdr.kind)) {
        free(buf);
        return;
    }
    struct kc_buf nb = {0}, file = {0};
    int rc = old_body(sp.hdr.kind, sp.body, sp.body_len, &nb, 0);
    if (rc < 0)
        die("decoding a current put file", rc);
    struct kc__hdr h = sp.hdr;
    old_header(&h, &nb);
    rc = kc__spool_put_encode(&file, sp.ns, &sp.key, sp.has_source ? &sp.source : NULL, &h, nb.p,
                              nb.len);
    if (rc == 0)
        rc = kc__spool_write(dir, name, file.p, file.len, true);
    if (rc < 0)
        die("writing a put file", rc);
    kc_buf_free(&nb);
    kc_buf_free(&file);
    free(buf);
    n_hot++;
}

static void convert_dir(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            convert_put_file(dir, e->d_name);
    closedir(d);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4 || (strcmp(argv[2], "le") != 0 && strcmp(argv[2], "be") != 0) ||
        (argc == 4 && strcmp(argv[3], "--only-nvrtc") != 0)) {
        fprintf(stderr, "usage: kc-old-format DIR le|be [--only-nvrtc]\n");
        return 2;
    }
    only_nvrtc = argc == 4;
    big = strcmp(argv[2], "be") == 0;
    const char *dir = argv[1];
    struct kc__owner *o;
    int rc = kc__owner_begin(dir, 0, 10000, &o);
    if (rc < 0)
        die("becoming the owner", rc);
    int n = convert_db(kc__owner_db(o));
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/hot", dir);
    convert_dir(sub, "");
    snprintf(sub, sizeof sub, "%s/spool", dir);
    convert_dir(sub, "p-");
    kc__owner_end(o);
    printf("converted %d entries (nvrtc %d, manifest %d, other %d), %d hot files\n", n, n_nvrtc,
           n_manifest, n_other, n_hot);
    return 0;
}
