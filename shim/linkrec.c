/*
 * The link replay record. See linkrec.h.
 *
 * Layout, every integer little-endian: u32 magic "KCLK", u32 version, u32
 * api, i32 complete_rc, then N_LOUT outputs: i32 size_rc, i32 size_set, u64
 * size, i32 get_rc, i32 size_null_rc, i32 get_null_rc, u64 nbytes, bytes.
 */
#include "linkrec.h"

#include "../common/buf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LREC_MAGIC 0x4b4c434bu /* "KCLK" */
#define LREC_VERSION 1u

void kc__lrec_free(struct kc__lrec *r)
{
    if (r == NULL)
        return;
    for (int i = 0; i < N_LOUT; i++)
        free(r->out[i].bytes);
    free(r);
}

/* ---- writing ------------------------------------------------------------- */

int kc__lrec_encode(const struct kc__lrec *r, void **out, size_t *len)
{
    struct kc_buf b = {0};
    kc_buf_put_u32(&b, LREC_MAGIC);
    kc_buf_put_u32(&b, LREC_VERSION);
    kc_buf_put_u32(&b, r->api);
    kc_buf_put_u32(&b, (uint32_t)r->complete_rc);
    for (int i = 0; i < N_LOUT; i++) {
        const struct kc__lout *o = &r->out[i];
        kc_buf_put_u32(&b, (uint32_t)o->size_rc);
        kc_buf_put_u32(&b, (uint32_t)o->size_set);
        kc_buf_put_u64(&b, o->size);
        kc_buf_put_u32(&b, (uint32_t)o->get_rc);
        kc_buf_put_u32(&b, (uint32_t)o->size_null_rc);
        kc_buf_put_u32(&b, (uint32_t)o->get_null_rc);
        kc_buf_put_u64(&b, o->nbytes);
        kc_buf_add(&b, o->bytes, o->nbytes);
    }
    if (b.err) {
        int rc = b.err;
        kc_buf_free(&b);
        return rc;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

/* ---- reading ------------------------------------------------------------- */

struct kc__lrec *kc__lrec_decode(const void *p, size_t n)
{
    struct kc_rd r;
    kc_rd_init(&r, p, n);
    if (p == NULL || kc_rd_get_u32(&r) != LREC_MAGIC || kc_rd_get_u32(&r) != LREC_VERSION)
        return NULL;
    struct kc__lrec *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->api = kc_rd_get_u32(&r);
    x->complete_rc = (int32_t)kc_rd_get_u32(&r);
    if (x->api != KC_LREC_NVJITLINK && x->api != KC_LREC_CULINK)
        r.bad = 1;
    for (int i = 0; i < N_LOUT && !r.bad; i++) {
        struct kc__lout *o = &x->out[i];
        o->size_rc = (int32_t)kc_rd_get_u32(&r);
        o->size_set = (int32_t)kc_rd_get_u32(&r);
        o->size = kc_rd_get_u64(&r);
        o->get_rc = (int32_t)kc_rd_get_u32(&r);
        o->size_null_rc = (int32_t)kc_rd_get_u32(&r);
        o->get_null_rc = (int32_t)kc_rd_get_u32(&r);
        uint64_t nb = kc_rd_get_u64(&r);
        if (r.bad || nb > kc_rd_left(&r) || (o->size_set != 0 && o->size_set != 1)) {
            r.bad = 1;
            break;
        }
        o->bytes = malloc(nb + 1);
        if (o->bytes == NULL) {
            r.bad = 1;
            break;
        }
        kc_rd_get_bytes(&r, o->bytes, nb);
        o->bytes[nb] = 0;
        o->nbytes = nb;
        if (x->api == KC_LREC_NVJITLINK) {
            /* What capture can have written: a buffer of the announced size,
             * or (no usable size) at most 64 bytes. */
            if (nb > 0 && o->size_rc == 0 && o->size_set && o->size > 0 && nb > o->size)
                r.bad = 1;
            if (nb > 64 && !(o->size_rc == 0 && o->size_set && nb == o->size))
                r.bad = 1;
        } else if (i == LOUT_CUBIN) {
            /* The cubin handed out must be exactly *sizeOut bytes. */
            if (o->size_set && nb != o->size)
                r.bad = 1;
        } else if (i == LOUT_PTX || i == LOUT_LTOIR) {
            if (nb != 0)
                r.bad = 1;
        }
    }
    if (r.bad || kc_rd_end(&r) != 0) {
        kc__lrec_free(x);
        return NULL;
    }
    return x;
}
