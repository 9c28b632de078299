/*
 * store_worker: the processes the multi-process store tests start.
 *
 *   store_worker owner --dir D [--idle-ms N]     the owner, as `kcache owner`
 *   store_worker work --dir D --id I --n N        put N own + shared entries,
 *                                                 read them and others'
 *   store_worker check --dir D --ids K --n N      every entry of `work` reads back
 *   store_worker killput --dir D --log F --seed S put until killed; after each
 *                                                 acknowledged put, log its seed
 *   store_worker checklog --dir D --log F...      every logged put reads back
 *
 * Entries are PTX-like text derived from a seed (ptxgen.h), so a checker
 * regenerates the exact bytes. `work` prints "max_get_us=G max_put_us=P".
 * Exit status 0 when everything held, 1 otherwise (with a line on stderr).
 */
#include "ptxgen.h"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Opening, the data path on an open store, and the administration. */
static const struct kc_store_api *S;
static const struct kc_store_ops *api;
static const struct kc_store_admin *adm;
static const char *NS = "test/multiproc";

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t mix(uint64_t a, uint64_t b)
{
    uint64_t s = a * 0x9e3779b97f4a7c15ull ^ b;
    return ptxgen_next(&s);
}

static kc_key key_of(uint64_t seed)
{
    kc_key k = {.id = {.lo = seed, .hi = mix(seed, 7)}, .build = 1};
    return k;
}

static size_t size_of(uint64_t seed)
{
    uint64_t s = seed;
    return ptxgen_size(&s) / 2 + 512; /* keep the tests quick */
}

static const char *arg(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 2; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return def;
}

static int open_store(const char *dir, struct kc_store **st)
{
    struct kc_store_options o = {.dir = dir, .tool = getenv("STORE_WORKER_TOOL")};
    int rc = S->open(&o, st);
    if (rc < 0)
        fprintf(stderr, "store_worker: open %s: %s\n", dir, strerror(-rc));
    return rc;
}

/* 0 when `seed`'s entry reads back byte-identical. */
static int check_one(struct kc_store *st, uint64_t seed, uint64_t *us)
{
    kc_key k = key_of(seed);
    void *body = NULL;
    size_t len = 0;
    uint64_t t0 = mono_us();
    int rc = api->get(st, NS, &k, &body, &len, NULL);
    uint64_t dt = mono_us() - t0;
    if (us != NULL && dt > *us)
        *us = dt;
    if (rc < 0) {
        fprintf(stderr, "store_worker: get %016" PRIx64 ": %s\n", seed, strerror(-rc));
        return 1;
    }
    size_t want = size_of(seed);
    char *exp = ptxgen(seed, want);
    int bad = len != want || memcmp(exp, body, len) != 0;
    if (bad)
        fprintf(stderr, "store_worker: %016" PRIx64 " reads back wrong (%zu vs %zu bytes)\n", seed,
                len, want);
    free(exp);
    api->free(body);
    return bad;
}

static int put_one(struct kc_store *st, uint64_t seed, uint64_t *us)
{
    kc_key k = key_of(seed);
    size_t len = size_of(seed);
    char *body = ptxgen(seed, len);
    uint64_t t0 = mono_us();
    int rc = api->put(st, NS, &k, NULL, KC_KIND_BLOB, body, len, 1000);
    uint64_t dt = mono_us() - t0;
    if (us != NULL && dt > *us)
        *us = dt;
    free(body);
    if (rc < 0)
        fprintf(stderr, "store_worker: put %016" PRIx64 ": %s\n", seed, strerror(-rc));
    return rc;
}

static int cmd_work(const char *dir, int id, int n, int ids)
{
    struct kc_store *st;
    if (open_store(dir, &st) < 0)
        return 1;
    uint64_t max_get = 0, max_put = 0;
    int fail = 0;
    for (int j = 0; j < n; j++) {
        if (put_one(st, mix((uint64_t)id + 1, (uint64_t)j), &max_put) < 0)
            fail = 1;
        /* A few keys every worker writes, with the same bytes. */
        if (j % 8 == 0 && put_one(st, mix(1000, (uint64_t)j), &max_put) < 0)
            fail = 1;
        fail |= check_one(st, mix((uint64_t)id + 1, (uint64_t)j), &max_get);
        /* Others' entries: a miss is fine (not written yet), a wrong byte
         * is not. */
        int other = (id + 1 + j) % ids;
        kc_key k = key_of(mix((uint64_t)other + 1, (uint64_t)j / 2));
        void *body = NULL;
        size_t len;
        uint64_t t0 = mono_us();
        int rc = api->get(st, NS, &k, &body, &len, NULL);
        uint64_t dt = mono_us() - t0;
        if (dt > max_get)
            max_get = dt;
        if (rc == 0) {
            uint64_t seed = mix((uint64_t)other + 1, (uint64_t)j / 2);
            char *exp = ptxgen(seed, size_of(seed));
            if (len != size_of(seed) || memcmp(exp, body, len) != 0) {
                fprintf(stderr, "store_worker: another worker's entry reads back wrong\n");
                fail = 1;
            }
            free(exp);
            api->free(body);
        }
    }
    for (int j = 0; j < n; j++)
        fail |= check_one(st, mix((uint64_t)id + 1, (uint64_t)j), &max_get);
    api->close(st);
    printf("max_get_us=%" PRIu64 " max_put_us=%" PRIu64 "\n", max_get, max_put);
    return fail;
}

static int cmd_check(const char *dir, int ids, int n)
{
    struct kc_store *st;
    if (open_store(dir, &st) < 0)
        return 1;
    int fail = 0;
    for (int i = 0; i < ids; i++)
        for (int j = 0; j < n; j++)
            fail |= check_one(st, mix((uint64_t)i + 1, (uint64_t)j), NULL);
    for (int j = 0; j < n; j += 8)
        fail |= check_one(st, mix(1000, (uint64_t)j), NULL);
    api->close(st);
    return fail;
}

static int cmd_killput(const char *dir, const char *log, uint64_t seed)
{
    struct kc_store *st;
    if (open_store(dir, &st) < 0)
        return 1;
    FILE *f = fopen(log, "a");
    if (f == NULL)
        return 1;
    setvbuf(f, NULL, _IONBF, 0);
    for (uint64_t j = 0;; j++) {
        uint64_t s = mix(seed, j);
        if (put_one(st, s, NULL) == 0)
            fprintf(f, "%016" PRIx64 "\n", s);
        /* Reads too, so a reader can be killed mid-get. */
        if (j % 3 == 0)
            check_one(st, s, NULL);
    }
}

static int cmd_checklog(const char *dir, int argc, char **argv)
{
    struct kc_store *st;
    if (open_store(dir, &st) < 0)
        return 1;
    int fail = 0;
    uint64_t n = 0;
    for (int i = 2; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--log") != 0)
            continue;
        FILE *f = fopen(argv[i + 1], "r");
        if (f == NULL)
            continue;
        char line[64];
        while (fgets(line, sizeof line, f) != NULL) {
            if (strlen(line) != 17)
                continue; /* a line cut by the kill: not acknowledged to us */
            uint64_t s = strtoull(line, NULL, 16);
            fail |= check_one(st, s, NULL);
            n++;
        }
        fclose(f);
    }
    api->close(st);
    printf("checked=%" PRIu64 "\n", n);
    return fail;
}

int main(int argc, char **argv)
{
    S = kc_store_api();
    api = S->ops;
    adm = kc_store_admin();
    if (argc < 2)
        return 2;
    const char *cmd = argv[1];
    const char *dir = arg(argc, argv, "--dir", NULL);
    if (dir == NULL)
        return 2;
    if (strcmp(cmd, "owner") == 0) {
        struct kc_store_options o = {.dir = dir};
        int rc = adm->owner_run(&o, atoi(arg(argc, argv, "--idle-ms", "1000")));
        return rc < 0 && rc != -EBUSY ? 1 : 0;
    }
    if (strcmp(cmd, "work") == 0)
        return cmd_work(dir, atoi(arg(argc, argv, "--id", "0")), atoi(arg(argc, argv, "--n", "20")),
                        atoi(arg(argc, argv, "--ids", "8")));
    if (strcmp(cmd, "check") == 0)
        return cmd_check(dir, atoi(arg(argc, argv, "--ids", "8")),
                         atoi(arg(argc, argv, "--n", "20")));
    if (strcmp(cmd, "killput") == 0)
        return cmd_killput(dir, arg(argc, argv, "--log", "/dev/null"),
                           strtoull(arg(argc, argv, "--seed", "1"), NULL, 0));
    if (strcmp(cmd, "checklog") == 0)
        return cmd_checklog(dir, argc, argv);
    return 2;
}
