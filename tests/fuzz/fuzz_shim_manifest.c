/*
 * Fuzz target: the manifest decoder (shim/codec.c, kc__manifest_decode),
 * and the encoder fed what it decoded (a lookup merges the stored manifest
 * into the new one): no crash, no leak, and the merge decodes again.
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
    struct kc__manifest *m = kc__manifest_decode(p, size);
    if (m != NULL) {
        for (uint64_t i = 0; i < m->n; i++)
            for (uint64_t j = 0; j < m->sets[i].n; j++)
                KC_FUZZ_ASSERT(m->sets[i].deps[j].path != NULL);
        kc_digest result = {1, 2};
        struct kc__dep dep = {.path = (char *)"/usr/include/x.h", .kind = KC_DEP_FILE};
        struct kc_buf b = {0};
        kc__manifest_encode(&b, &result, &dep, 1, m);
        KC_FUZZ_ASSERT(!b.err);
        struct kc__manifest *again = kc__manifest_decode(b.p, b.len);
        KC_FUZZ_ASSERT(again != NULL && again->n >= 1 && again->n <= 16);
        kc__manifest_free(again);
        kc_buf_free(&b);
        kc__manifest_free(m);
    }
    free(p);
    return 0;
}

int kc_fuzz_seeds(const char *dir)
{
    struct kc__dep deps[3] = {
        {.path = (char *)"/usr/local/cuda/include/cuda_fp16.h",
         .kind = KC_DEP_FILE,
         .digest = {7, 8}},
        {.path = (char *)"inc/absent.h", .kind = KC_DEP_ABSENT},
        {.path = (char *)"/usr/local/cuda/include", .kind = KC_DEP_DIR},
    };
    kc_digest r1 = {11, 12}, r2 = {21, 22};
    struct kc_buf b = {0};
    kc__manifest_encode(&b, &r1, deps, 3, NULL);
    if (b.err)
        return -ENOMEM;
    int count = 0;
    if (kc_fuzz_write_seed(dir, "manifest-1", b.p, b.len) == 0)
        count++;
    struct kc__manifest *old = kc__manifest_decode(b.p, b.len);
    struct kc_buf b2 = {0};
    kc__manifest_encode(&b2, &r2, deps + 1, 2, old);
    kc__manifest_free(old);
    if (!b2.err && kc_fuzz_write_seed(dir, "manifest-2", b2.p, b2.len) == 0)
        count++;
    kc_buf_free(&b);
    kc_buf_free(&b2);
    return count;
}
