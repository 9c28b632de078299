/*
 * store-first: the cost of a fresh process's first hit through RocksDB, as
 * the shim pays it when its key filter says "maybe": dlopen() the store
 * library, open its database tier, get one key.
 *
 *   store-first LIB DIR NS ID_LO ID_HI BUILD
 *
 * Prints `first dlopen_us=.. open_us=.. get_us=.. total_us=.. rc=..` and
 * exits 0 on a hit. store-bench runs it (it is not a test).
 */
#include "store.h"
#include "tier.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: store-first LIB DIR NS ID_LO ID_HI BUILD\n");
        return 2;
    }
    uint64_t t0 = now_ns();
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "store-first: %s\n", dlerror());
        return 1;
    }
    const struct kc_store_api *(*fn)(void) =
        (const struct kc_store_api *(*)(void))dlsym(h, "kc_store_api");
    if (fn == NULL)
        return 1;
    const struct kc_store_api *api = fn();
    uint64_t t1 = now_ns();
    struct kc_store_options o = {.dir = argv[2], .tool = "/bin/true"};
    struct kc_tier *db;
    if (api->db_tier_open(&o, &db) < 0)
        return 1;
    uint64_t t2 = now_ns();
    kc_key k = {.id = {.lo = strtoull(argv[4], NULL, 0), .hi = strtoull(argv[5], NULL, 0)},
                .build = strtoull(argv[6], NULL, 0)};
    void *b = NULL;
    size_t n = 0;
    int rc = db->ops->get(db, argv[3], &k, &b, &n, NULL);
    uint64_t t3 = now_ns();
    free(b);
    printf("first dlopen_us=%.1f open_us=%.1f get_us=%.1f total_us=%.1f rc=%d\n", (t1 - t0) / 1e3,
           (t2 - t1) / 1e3, (t3 - t2) / 1e3, (t3 - t0) / 1e3, rc);
    /* Exit without closing, as a short-lived process does. */
    fflush(stdout);
    _exit(rc == 0 ? 0 : 1);
}
