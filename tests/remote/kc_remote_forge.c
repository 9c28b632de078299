/*
 * kc-remote-forge: what an attacker with write access to the Redis server
 * but no trusted signing key can write: a well-formed remote value (the
 * remote tier's own layout, store/remote/sign.c) for a real entry's key,
 * holding any body, signed with the attacker's own key or not at all.
 * test_remote_e2e.py SETs what it writes and checks that no node serves
 * it.
 *
 *   kc-remote-forge OUT NS KEYHEX KIND BODYFILE [SECRETKEY]
 *
 * KEYHEX: the 48 hex digits of the server key's end (id.hi, id.lo, build).
 * SECRETKEY: a `kcache keygen` secret key (0600); without it the value is
 * unsigned. Exit status 0, or 1 with a message.
 *
 *   kc-remote-forge --lock OUT LOCKNAME TTL_MS SECRETKEY
 *
 * writes the value a holder of SECRETKEY puts in lock LOCKNAME for TTL_MS
 * from now (a trusted writer's lock, when the key is trusted).
 */
#include "remote_internal.h"

#include "../../common/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "kc-remote-forge: %s: %s\n", what, strerror(rc < 0 ? -rc : rc));
    return 1;
}

static int slurp(const char *path, unsigned char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -errno;
    size_t cap = 1 << 16, n = 0, r;
    unsigned char *b = malloc(cap);
    while (b != NULL && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            unsigned char *nb = realloc(b, cap *= 2);
            if (nb == NULL)
                free(b);
            b = nb;
        }
    }
    fclose(f);
    if (b == NULL)
        return -ENOMEM;
    *out = b;
    *len = n;
    return 0;
}

static int lock_main(char **argv)
{
    const struct kc__sodium *na = NULL;
    static struct kc__keys keys;
    int rc;
    if ((rc = kc__sodium_load(&na)) != 0)
        return fail("libsodium", rc);
    if ((rc = kc__keys_load_secret(na, argv[5], &keys)) != 0)
        return fail(argv[5], rc);
    char v[KC__LOCK_VALUE_MAX];
    uint64_t exp = kc_wall_ns() / 1000000 + strtoull(argv[4], NULL, 10);
    if ((rc = kc__lock_value(na, &keys, argv[3], "deadnode:1:0", exp, v, sizeof v)) != 0)
        return fail("lock value", rc);
    FILE *f = fopen(argv[2], "wb");
    if (f == NULL || fwrite(v, 1, strlen(v), f) != strlen(v) || fclose(f) != 0)
        return fail(argv[2], errno);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--lock") == 0)
        return lock_main(argv);
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: kc-remote-forge OUT NS KEYHEX KIND BODYFILE [SECRETKEY]\n");
        return 2;
    }
    const char *hex = argv[3];
    kc_key key;
    if (strlen(hex) != 48 || sscanf(hex, "%16" SCNx64 "%16" SCNx64 "%16" SCNx64, &key.id.hi,
                                    &key.id.lo, &key.build) != 3)
        return fail("KEYHEX", EINVAL);
    uint32_t kind = (uint32_t)strtoul(argv[4], NULL, 10);
    unsigned char *body = NULL;
    size_t len = 0;
    int rc = slurp(argv[5], &body, &len);
    if (rc != 0)
        return fail(argv[5], rc);
    const struct kc__sodium *na = NULL;
    static struct kc__keys keys;
    if (argc == 7) {
        if ((rc = kc__sodium_load(&na)) != 0)
            return fail("libsodium", rc);
        if ((rc = kc__keys_load_secret(na, argv[6], &keys)) != 0)
            return fail(argv[6], rc);
    }
    unsigned char *v = NULL;
    size_t vlen = 0;
    rc = kc__rv_encode(na, argc == 7 ? &keys : NULL, argv[2], &key, kind, KC_FORMAT_VERSION,
                       kc_wall_ns(), 1000000, body, len, &v, &vlen);
    if (rc != 0)
        return fail("encode", rc);
    FILE *f = fopen(argv[1], "wb");
    if (f == NULL || fwrite(v, 1, vlen, f) != vlen || fclose(f) != 0)
        return fail(argv[1], errno);
    free(v);
    free(body);
    return 0;
}
