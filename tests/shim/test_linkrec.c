/*
 * shim/linkrec.c: the link replay record decodes exactly what was encoded,
 * little-endian whatever the host, and refuses anything else.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "linkrec.h"

static struct kc__lrec *sample(void)
{
    struct kc__lrec *r = calloc(1, sizeof *r);
    r->api = KC_LREC_NVJITLINK;
    r->complete_rc = 4;
    r->out[LOUT_CUBIN] = (struct kc__lout){.size_rc = 0,
                                           .size_set = 1,
                                           .size = 5,
                                           .get_rc = 0,
                                           .size_null_rc = 10,
                                           .get_null_rc = 10,
                                           .nbytes = 5};
    r->out[LOUT_CUBIN].bytes = strdup("\177ELFx");
    r->out[LOUT_ERROR_LOG] = (struct kc__lout){.size_set = 1, .size = 0, .nbytes = 1};
    r->out[LOUT_ERROR_LOG].bytes = calloc(1, 2);
    r->out[LOUT_PTX] = (struct kc__lout){.size_rc = 3, .get_rc = 3};
    return r;
}

Test(linkrec, roundtrip)
{
    struct kc__lrec *r = sample();
    void *b;
    size_t n;
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    struct kc__lrec *d = kc__lrec_decode(b, n);
    cr_assert_not_null(d);
    cr_assert_eq(d->complete_rc, 4);
    cr_assert_eq(d->out[LOUT_CUBIN].nbytes, 5);
    cr_assert_eq(memcmp(d->out[LOUT_CUBIN].bytes, "\177ELFx", 5), 0);
    cr_assert_eq(d->out[LOUT_CUBIN].size_null_rc, 10);
    cr_assert_eq(d->out[LOUT_PTX].size_rc, 3);
    cr_assert_eq(d->out[LOUT_ERROR_LOG].nbytes, 1);
    /* Little-endian on the wire: "KCLK", version 1, api 1, rc 4. */
    static const unsigned char head[] = {'K', 'C', 'L', 'K', 1, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0};
    cr_assert_eq(memcmp(b, head, sizeof head), 0);
    kc__lrec_free(d);
    free(b);
    kc__lrec_free(r);
}

Test(linkrec, refuses_damage)
{
    struct kc__lrec *r = sample();
    void *b;
    size_t n;
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    /* Every truncation, and one byte too many. */
    for (size_t k = 0; k < n; k++)
        cr_assert_null(kc__lrec_decode(b, k), "a record cut at %zu decoded", k);
    unsigned char *more = malloc(n + 1);
    memcpy(more, b, n);
    more[n] = 0;
    cr_assert_null(kc__lrec_decode(more, n + 1));
    /* A getter that would write more than its size getter announced. */
    r->out[LOUT_CUBIN].size = 4;
    free(b);
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    cr_assert_null(kc__lrec_decode(b, n));
    /* An unknown API. */
    r->out[LOUT_CUBIN].size = 5;
    r->api = 9;
    free(b);
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    cr_assert_null(kc__lrec_decode(b, n));
    cr_assert_null(kc__lrec_decode(NULL, 0));
    free(more);
    free(b);
    kc__lrec_free(r);
}

Test(linkrec, culink_cubin_matches_its_size)
{
    struct kc__lrec *r = sample();
    r->api = KC_LREC_CULINK;
    r->out[LOUT_PTX] = (struct kc__lout){0};
    void *b;
    size_t n;
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    struct kc__lrec *d = kc__lrec_decode(b, n);
    cr_assert_not_null(d);
    kc__lrec_free(d);
    free(b);
    /* cuLinkComplete hands out exactly *sizeOut bytes. */
    r->out[LOUT_CUBIN].size = 6;
    cr_assert_eq(kc__lrec_encode(r, &b, &n), 0);
    cr_assert_null(kc__lrec_decode(b, n));
    free(b);
    kc__lrec_free(r);
}
