/*
 * kc-populate: puts a few records into a cache directory through the store's
 * function table, for the tool tests.
 *
 * Usage: kc-populate DIR N [--drain] [--no-owner] [--first I]
 * Writes N records (numbered from I, default 0) alternating between namespaces "nvrtc-test" and
 * "jit-test" (bodies of 1000 + 37*i bytes; records 0 and 1 share a body, to
 * exercise dedup), adds counters for both backends, flushes and closes. With
 * --drain it then runs the owner once so the records leave the spool; with
 * --no-owner the store is given a tool that does not exist, so no owner
 * starts and the records stay in the spool. Prints
 * each key as `kcache ls` does (32 hex digits), one per line.
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: kc-populate DIR N [--drain]\n");
        return 2;
    }
    const char *dir = argv[1];
    int n = atoi(argv[2]);
    int drain = 0, first = 0;
    const char *tool = NULL;
    for (int a = 3; a < argc; a++) {
        if (strcmp(argv[a], "--drain") == 0)
            drain = 1;
        else if (strcmp(argv[a], "--no-owner") == 0)
            tool = "/nonexistent/kcache";
        else if (strcmp(argv[a], "--first") == 0 && a + 1 < argc)
            first = atoi(argv[++a]);
        else {
            fprintf(stderr, "kc-populate: bad argument %s\n", argv[a]);
            return 2;
        }
    }
    const struct kc_store_api *S = kc_store_api();
    const struct kc_store_ops *api = S->ops;
    const struct kc_store_admin *adm = kc_store_admin();
    if (api == NULL || S->open == NULL || api->put == NULL || api->close == NULL) {
        fprintf(stderr, "kc-populate: the store library is a stub\n");
        return 77;
    }
    struct kc_store_options o = {.dir = dir, .readonly = 0, .max_size = 0, .tool = tool};
    struct kc_store *st = NULL;
    int rc = S->open(&o, &st);
    if (rc < 0) {
        fprintf(stderr, "kc-populate: open %s: %s\n", dir, strerror(-rc));
        return 1;
    }
    for (int i = first; i < first + n; i++) {
        const char *ns = i % 2 ? "jit-test" : "nvrtc-test";
        kc_key key = {
            .id = {.lo = 0x1000 + (uint64_t)i, .hi = 0xfeed0000c0de0000ull + (uint64_t)i * 7919},
            .build = 1};
        size_t len = 1000 + 37 * (size_t)(i < 2 ? 0 : i);
        char *body = malloc(len);
        if (body == NULL)
            return 1;
        for (size_t j = 0; j < len; j++)
            body[j] = (char)('a' + (j * 7 + (i < 2 ? 0 : (size_t)i)) % 26);
        kc_digest src = {.lo = 0xabc0 + (uint64_t)i, .hi = 42};
        rc = api->put(st, ns, &key, &src, i % 2 ? KC_KIND_JIT : KC_KIND_NVRTC, body, len,
                      (uint64_t)(i + 1) * 100000000ull);
        free(body);
        if (rc < 0) {
            fprintf(stderr, "kc-populate: put %d: %s\n", i, strerror(-rc));
            return 1;
        }
        printf("%016" PRIx64 "%016" PRIx64 "\n", key.id.hi, key.id.lo);
    }
    if (api->count != NULL) {
        struct kc_counters nv = {.hits = 3,
                                 .misses = 2,
                                 .passthrough = 1,
                                 .stores = 2,
                                 .errors = 0,
                                 .saved_ns = 1500000000ull,
                                 .compile_ns = 2000000000ull};
        struct kc_counters jit = {.hits = 5,
                                  .misses = 1,
                                  .passthrough = 0,
                                  .stores = 1,
                                  .errors = 1,
                                  .saved_ns = 250000000ull,
                                  .compile_ns = 500000000ull};
        api->count(st, "nvrtc", &nv);
        api->count(st, "jit", &jit);
    }
    if (api->flush != NULL && (rc = api->flush(st)) < 0) {
        fprintf(stderr, "kc-populate: flush: %s\n", strerror(-rc));
        return 1;
    }
    api->close(st);
    if (drain) {
        if (adm->owner_run == NULL)
            return 77;
        rc = adm->owner_run(&o, 0);
        if (rc < 0 && rc != -EBUSY) {
            fprintf(stderr, "kc-populate: owner: %s\n", strerror(-rc));
            return 1;
        }
    }
    return 0;
}
