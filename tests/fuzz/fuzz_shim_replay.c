/*
 * Fuzz target: the NVRTC replay record decoder (shim/codec.c,
 * kc__replay_decode). A hit hands the decoded record to the host through
 * NVRTC's getters, so beyond "no crash" a decoded record must never make a
 * getter write more bytes than the size getter announced (the host sizes its
 * buffer with it), and re-encoding it must decode again.
 */
#include "fuzz.h"

#include "codec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *p = kc_fuzz_dup(data, size);
    struct kc__replay *r = kc__replay_decode(p, size);
    if (r != NULL) {
        for (int i = 0; i < N_OUT; i++) {
            const struct kc__output *o = &r->out[i];
            KC_FUZZ_ASSERT(o->nbytes == 0 || o->bytes != NULL);
            /* The bytes the getter writes fit the size it announced (a
             * size of 0 is NVRTC's own business: up to 64 bytes, as
             * captured). */
            if (o->size_rc == 0 && o->size_set && o->size > 0)
                KC_FUZZ_ASSERT(o->nbytes <= o->size);
            KC_FUZZ_ASSERT(o->nbytes <= 64 || o->nbytes == o->size);
            volatile char sum = 0;
            for (uint64_t k = 0; k < o->nbytes; k++)
                sum ^= o->bytes[k];
            (void)sum;
        }
        for (uint32_t i = 0; i < r->n_names; i++)
            KC_FUZZ_ASSERT(r->names[i].expr != NULL);
        struct kc_buf b = {0};
        KC_FUZZ_ASSERT(kc__replay_encode(r, &b) == 0);
        struct kc__replay *again = kc__replay_decode(b.p, b.len);
        KC_FUZZ_ASSERT(again != NULL);
        kc__replay_free(again);
        kc_buf_free(&b);
        kc__replay_free(r);
    }
    free(p);
    return 0;
}

int kc_fuzz_seeds(const char *dir)
{
    static const char ptx[] = "//\n.version 8.8\n.target sm_90\n.address_size 64\n";
    static const char logtext[] = "warning: something\n";
    int count = 0;
    for (int variant = 0; variant < 3; variant++) {
        struct kc__replay r = {0};
        r.compile_rc = variant == 2 ? 6 /* NVRTC_ERROR_COMPILATION */ : 0;
        for (int i = 0; i < N_OUT; i++) {
            struct kc__output *o = &r.out[i];
            o->size_set = 1;
            o->size_null_rc = o->get_null_rc = 1;
            if (i == OUT_PTX && variant != 2) {
                o->size = sizeof ptx;
                o->bytes = (char *)ptx;
                o->nbytes = sizeof ptx;
            } else if (i == OUT_LOG) {
                o->size = sizeof logtext;
                o->bytes = (char *)logtext;
                o->nbytes = sizeof logtext;
            } else {
                o->size_rc = o->get_rc = 1;
                o->size_set = 0;
            }
        }
        struct kc__lowered names[2] = {{(char *)"&f<int>", 0, 0, (char *)"_Z1fIiEvv"},
                                       {(char *)"g", 0, 1, NULL}};
        if (variant == 1) {
            r.n_names = 2;
            r.names = names;
        }
        r.lowered_unknown_rc = 1;
        r.pch_required = 12345;
        struct kc_buf b = {0};
        if (kc__replay_encode(&r, &b) != 0)
            return -ENOMEM;
        char name[32];
        snprintf(name, sizeof name, "replay-%d", variant);
        if (kc_fuzz_write_seed(dir, name, b.p, b.len) == 0)
            count++;
        kc_buf_free(&b);
    }
    return count;
}
