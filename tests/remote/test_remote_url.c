/*
 * test_remote_url.c: the remote tier's pure parts (suites unit, remote):
 * KCACHE_REMOTE's grammar and the variables beside it, password
 * redaction, cluster slots, rendezvous hashing, base64, and the value
 * layout's encoder and decoder (libsodium for the signed cases). No server.
 */
#include "remote_internal.h"

#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct kc_remote_config cfg;
static char err[300];

static void fini(void)
{
    kc_remote_config_free(&cfg);
}

TestSuite(url, .fini = fini, .timeout = 30);

static int parse(const char *remote)
{
    struct kc_remote_settings s = {.remote = remote};
    kc_remote_config_free(&cfg);
    return kc_remote_config_parse(&s, &cfg, err, sizeof err);
}

Test(url, unset_and_blank_are_off)
{
    cr_assert_eq(parse(NULL), 0);
    cr_assert_eq(cfg.mode, KC_REMOTE_NONE);
    cr_assert_eq(parse("  \t "), 0);
    cr_assert_eq(cfg.mode, KC_REMOTE_NONE);
    cr_assert_eq(cfg.max_entry, KC_REMOTE_DEFAULT_MAX_ENTRY);
    cr_assert_eq(cfg.ttl_s, 0);
    cr_assert(!cfg.trust_any);
}

Test(url, tcp_defaults)
{
    cr_assert_eq(parse("redis://cache.example.com"), 0, "%s", err);
    cr_assert_eq(cfg.mode, KC_REMOTE_SERVERS);
    cr_assert_eq(cfg.n, 1);
    struct kc_remote_endpoint *e = &cfg.ep[0];
    cr_assert_eq(e->transport, KC_REMOTE_TCP);
    cr_assert_str_eq(e->host, "cache.example.com");
    cr_assert_eq(e->port, 6379);
    cr_assert_eq(e->db, 0);
    cr_assert_str_empty(e->user);
    cr_assert_str_empty(e->password);
    cr_assert_eq(e->connect_timeout_ms, 100);
    cr_assert_eq(e->operation_timeout_ms, 1000);
    cr_assert(!e->read_only);
    cr_assert_float_eq(e->weight, 1.0, 1e-12);
}

Test(url, tcp_full)
{
    cr_assert_eq(parse("redis://alice:s%40cr%3At@10.0.0.7:6380/3|read-only|connect-timeout=250|"
                       "operation-timeout=4000"),
                 0, "%s", err);
    struct kc_remote_endpoint *e = &cfg.ep[0];
    cr_assert_str_eq(e->host, "10.0.0.7");
    cr_assert_eq(e->port, 6380);
    cr_assert_eq(e->db, 3);
    cr_assert_str_eq(e->user, "alice");
    cr_assert_str_eq(e->password, "s@cr:t");
    cr_assert(e->read_only);
    cr_assert_eq(e->connect_timeout_ms, 250);
    cr_assert_eq(e->operation_timeout_ms, 4000);
}

Test(url, password_only_and_ipv6)
{
    cr_assert_eq(parse("redis://hunter2@[::1]:7000"), 0, "%s", err);
    cr_assert_str_empty(cfg.ep[0].user);
    cr_assert_str_eq(cfg.ep[0].password, "hunter2");
    cr_assert_str_eq(cfg.ep[0].host, "::1");
    cr_assert_eq(cfg.ep[0].port, 7000);
    /* A password holding '@' and '/' unescaped: the last '@' ends it. */
    cr_assert_eq(parse("redis://:a/b@c@host"), 0, "%s", err);
    cr_assert_str_eq(cfg.ep[0].password, "a/b@c");
    cr_assert_str_eq(cfg.ep[0].host, "host");
}

Test(url, unix_socket)
{
    cr_assert_eq(parse("redis+unix:/run/redis/redis.sock"), 0, "%s", err);
    cr_assert_eq(cfg.ep[0].transport, KC_REMOTE_UNIX);
    cr_assert_str_eq(cfg.ep[0].path, "/run/redis/redis.sock");
    cr_assert_eq(cfg.ep[0].db, 0);
    cr_assert_eq(parse("redis+unix:///run/r.sock?db=5|operation-timeout=20"), 0, "%s", err);
    cr_assert_str_eq(cfg.ep[0].path, "/run/r.sock");
    cr_assert_eq(cfg.ep[0].db, 5);
    cr_assert_eq(cfg.ep[0].operation_timeout_ms, 20);
}

Test(url, several_urls_are_shards)
{
    cr_assert_eq(parse("redis://a:1 \n redis+unix:/s.sock\tredis://b"), 0, "%s", err);
    cr_assert_eq(cfg.mode, KC_REMOTE_SERVERS);
    cr_assert_eq(cfg.n, 3);
    cr_assert_str_eq(cfg.ep[0].host, "a");
    cr_assert_eq(cfg.ep[0].port, 1);
    cr_assert_str_eq(cfg.ep[1].path, "/s.sock");
    cr_assert_str_eq(cfg.ep[2].host, "b");
}

Test(url, shards_attribute)
{
    cr_assert_eq(parse("redis://:pw@cache-*.example.com:7000/2|shards=a,b(2.5),c|read-only"), 0,
                 "%s", err);
    cr_assert_eq(cfg.n, 3);
    cr_assert_str_eq(cfg.ep[0].host, "cache-a.example.com");
    cr_assert_str_eq(cfg.ep[1].host, "cache-b.example.com");
    cr_assert_str_eq(cfg.ep[2].host, "cache-c.example.com");
    cr_assert_float_eq(cfg.ep[1].weight, 2.5, 1e-12);
    cr_assert_float_eq(cfg.ep[2].weight, 1.0, 1e-12);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(cfg.ep[i].port, 7000);
        cr_assert_eq(cfg.ep[i].db, 2);
        cr_assert_str_eq(cfg.ep[i].password, "pw");
        cr_assert(cfg.ep[i].read_only);
    }
    cr_assert_eq(parse("redis+unix:/tmp/r-*.sock|shards=x,y"), 0, "%s", err);
    cr_assert_str_eq(cfg.ep[1].path, "/tmp/r-y.sock");
}

Test(url, cluster_seeds)
{
    cr_assert_eq(parse("redis-cluster://u:p@10.0.0.1:7000,10.0.0.2,[fe80::1]:7002|"
                       "connect-timeout=50"),
                 0, "%s", err);
    cr_assert_eq(cfg.mode, KC_REMOTE_CLUSTER);
    cr_assert_eq(cfg.n, 3);
    cr_assert_str_eq(cfg.ep[0].host, "10.0.0.1");
    cr_assert_eq(cfg.ep[0].port, 7000);
    cr_assert_eq(cfg.ep[1].port, 6379);
    cr_assert_str_eq(cfg.ep[2].host, "fe80::1");
    for (int i = 0; i < 3; i++) {
        cr_assert_str_eq(cfg.ep[i].user, "u");
        cr_assert_str_eq(cfg.ep[i].password, "p");
        cr_assert_eq(cfg.ep[i].connect_timeout_ms, 50);
        cr_assert(!cfg.ep[i].tls);
    }
    /* rediss-cluster://: every seed (and so every node learned) over TLS. */
    cr_assert_eq(parse("rediss-cluster://kc@a.example:6380,b.example"), 0, "%s", err);
    cr_assert_eq(cfg.mode, KC_REMOTE_CLUSTER);
    cr_assert_eq(cfg.n, 2);
    for (int i = 0; i < 2; i++)
        cr_assert(cfg.ep[i].tls);
    cr_assert_eq(cfg.ep[1].port, 6379);
}

Test(url, malformed_is_an_error_without_the_password)
{
    const char *bad[] = {
        "http://host",                       /* scheme */
        "redis://",                          /* no host */
        "redis://host:0",                    /* port */
        "redis://host:65536",                /* port */
        "redis://host:12x",                  /* port */
        "redis://host/db",                   /* db */
        "redis://ho st",                     /* two URLs, the second not one */
        "redis://h|connect-timeout=0",       /* timeout */
        "redis://h|operation-timeout=99999", /* timeout */
        "redis://h|operation-timeout=",      /* timeout */
        "redis://h|readonly",                /* unknown attribute */
        "redis://h|shards=a",                /* shards without '*' */
        "redis://h-*",                       /* '*' without shards */
        "redis://*-*|shards=a",              /* two '*' */
        "redis://h-*|shards=a,,b",           /* empty shard */
        "redis://h-*|shards=a(0)",           /* weight */
        "redis://h-*|shards=a(x)",           /* weight */
        "redis+unix:relative.sock",          /* not absolute */
        "redis+unix:/s.sock?dbx=1",          /* query */
        "redis-cluster://",                  /* no seed */
        "redis-cluster://a:1/0",             /* a database */
        "redis-cluster://a redis://b",       /* mixed */
        "redis://a redis-cluster://b",       /* mixed */
        "redis://a redis://a",               /* twice */
        "redis://%zz@h",                     /* escape */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(parse(bad[i]), -EINVAL, "'%s' was accepted", bad[i]);
        cr_assert_eq(cfg.mode, KC_REMOTE_NONE, "'%s'", bad[i]);
        cr_assert_str_not_empty(err, "'%s' gave no reason", bad[i]);
    }
    cr_assert_eq(parse("redis://admin:TopSecret@host:bad"), -EINVAL);
    cr_assert_null(strstr(err, "TopSecret"), "the error shows the password: %s", err);
    cr_assert_not_null(strstr(err, "admin:********@host:bad"), "%s", err);
}

Test(url, other_variables)
{
    struct kc_remote_settings s = {.remote = "redis://h",
                                   .ttl = "3600",
                                   .max_entry = "1M",
                                   .signing_key = "/etc/kcache/key",
                                   .trusted_keys = "/etc/kcache/trusted",
                                   .trust = "ANY"};
    kc_remote_config_free(&cfg);
    cr_assert_eq(kc_remote_config_parse(&s, &cfg, err, sizeof err), 0);
    cr_assert_eq(cfg.ttl_s, 3600);
    cr_assert_eq(cfg.max_entry, 1 << 20);
    cr_assert_str_eq(cfg.signing_key, "/etc/kcache/key");
    cr_assert_str_eq(cfg.trusted_keys, "/etc/kcache/trusted");
    cr_assert(cfg.trust_any);
    cr_assert_eq(cfg.n_warnings, 0);

    /* Malformed ones keep their default, each with a warning. */
    struct kc_remote_settings b = {.remote = "redis://h",
                                   .ttl = "-5",
                                   .max_entry = "0",
                                   .signing_key = "relative/key",
                                   .trust = "maybe"};
    kc_remote_config_free(&cfg);
    cr_assert_eq(kc_remote_config_parse(&b, &cfg, err, sizeof err), 0);
    cr_assert_eq(cfg.ttl_s, 0);
    cr_assert_eq(cfg.max_entry, KC_REMOTE_DEFAULT_MAX_ENTRY);
    cr_assert_str_empty(cfg.signing_key);
    cr_assert(!cfg.trust_any);
    cr_assert_eq(cfg.n_warnings, 4);
    b = (struct kc_remote_settings){.max_entry = "1G"};
    kc_remote_config_free(&cfg);
    cr_assert_eq(kc_remote_config_parse(&b, &cfg, err, sizeof err), 0);
    cr_assert_eq(cfg.max_entry, KC_REMOTE_MAX_MAX_ENTRY);
    cr_assert_eq(cfg.n_warnings, 1);
}

Test(url, settings_from_the_configuration)
{
    setenv("KCACHE_REMOTE", "redis://:pw@h:7", 1);
    setenv("KCACHE_REMOTE_TTL", "9", 1);
    setenv("KCACHE_REMOTE_TRUST", "any", 1);
    static struct kc_config c;
    kc_config_load(&c);
    struct kc_remote_settings s;
    kc_remote_settings_from_config(&c, &s);
    kc_remote_config_free(&cfg);
    cr_assert_eq(kc_remote_config_parse(&s, &cfg, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cfg.ep[0].port, 7);
    cr_assert_str_eq(cfg.ep[0].password, "pw");
    cr_assert_eq(cfg.ttl_s, 9);
    cr_assert(cfg.trust_any);
    cr_assert_eq(cfg.max_entry, KC_REMOTE_DEFAULT_MAX_ENTRY);
    unsetenv("KCACHE_REMOTE");
    unsetenv("KCACHE_REMOTE_TTL");
    unsetenv("KCACHE_REMOTE_TRUST");
}

Test(url, redaction)
{
    char out[512];
    kc_remote_redact("redis://alice:pw@h:1/2|read-only redis://pw2@h2 redis+unix:/s@x.sock "
                     "redis-cluster://:pw3@a:1,b:2|connect-timeout=5",
                     out, sizeof out);
    cr_assert_str_eq(out, "redis://alice:********@h:1/2|read-only redis://:********@h2 "
                          "redis+unix:/s@x.sock redis-cluster://:********@a:1,b:2|"
                          "connect-timeout=5");
    /* Malformed values are redacted too. */
    kc_remote_redact("ftp://u:secret@@@host:notaport", out, sizeof out);
    cr_assert_null(strstr(out, "secret"), "%s", out);
    /* Truncation keeps a terminated string and reports the full length. */
    char small[8];
    int n = kc_remote_redact("redis://u:p@host", small, sizeof small);
    cr_assert_eq(n, (int)strlen("redis://u:********@host"));
    cr_assert_eq(strlen(small), 7);

    cr_assert_eq(parse("redis://bob:pw@[::1]:7/4"), 0, "%s", err);
    kc_remote_endpoint_display(&cfg.ep[0], out, sizeof out);
    cr_assert_str_eq(out, "redis://bob:********@[::1]:7/4");
    cr_assert_eq(parse("redis://pw@h:7"), 0, "%s", err);
    kc_remote_endpoint_display(&cfg.ep[0], out, sizeof out);
    cr_assert_str_eq(out, "redis://:********@h:7");
    cr_assert_eq(parse("redis+unix:/s.sock?db=2"), 0);
    kc_remote_endpoint_display(&cfg.ep[0], out, sizeof out);
    cr_assert_str_eq(out, "redis+unix:/s.sock?db=2");
}

/* A password holding '|', a space or a tab is redacted whole, and
 * refused with the way to write it; no part of it in the message. */
Test(url, passwords_with_separators)
{
    static const char *v[] = {"redis://:zq1|zq2@h:1|read-only", "redis://:zq1 zq2@h:1",
                              "redis://u:zq1\tzq2@h:1 redis://h2:2",
                              "redis-cluster://:zq1|zq2@a:1,b:2"};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char out[512];
        kc_remote_redact(v[i], out, sizeof out);
        cr_assert_null(strstr(out, "zq"), "%s", out);
        cr_assert_eq(parse(v[i]), -EINVAL, "%s", v[i]);
        cr_assert_null(strstr(err, "zq"), "%s", err);
        cr_assert_not_null(strstr(err, "%7C"), "%s", err);
    }
    char out[512];
    kc_remote_redact("redis://u:zq1\tzq2@h:1 redis://h2:2", out, sizeof out);
    cr_assert_str_eq(out, "redis://u:********@h:1 redis://h2:2");
    /* Credentials on a later seed: refused, not the first seed dropped. */
    cr_assert_eq(parse("redis-cluster://:zqa@a:1,:zqa@b:2"), -EINVAL);
    cr_assert_not_null(strstr(err, "before the first seed"), "%s", err);
    cr_assert_null(strstr(err, "zqa"), "%s", err);
}

/* The upload descriptor: the settings as lines, read back the same. */
Test(url, upload_descriptor)
{
    struct kc_remote_settings s = {.remote = "redis://:pw@h:1",
                                   .ttl = "60",
                                   .signing_key = "/k/writer.key",
                                   .trusted_keys = "/k/trusted",
                                   .password_file = "/k/pw"};
    char d[1024];
    size_t n = kc_remote_upload_descriptor(&s, d, sizeof d);
    cr_assert_gt(n, 0);
    char storage[1100];
    struct kc_remote_settings back;
    cr_assert_eq(kc_remote_descriptor_settings(d, n, &back, storage, sizeof storage), 0);
    cr_assert_str_eq(back.remote, s.remote);
    cr_assert_str_eq(back.ttl, "60");
    cr_assert_str_eq(back.signing_key, s.signing_key);
    cr_assert_str_eq(back.trusted_keys, s.trusted_keys);
    cr_assert_str_eq(back.password_file, s.password_file);
    cr_assert_null(back.max_entry);
    /* No signing key, or no remote: nothing is uploaded, no descriptor. */
    s.signing_key = "";
    cr_assert_eq(kc_remote_upload_descriptor(&s, d, sizeof d), 0);
    s.signing_key = "/k/writer.key";
    s.remote = "";
    cr_assert_eq(kc_remote_upload_descriptor(&s, d, sizeof d), 0);
    /* Damaged descriptors are refused. */
    cr_assert_eq(kc_remote_descriptor_settings("KCACHE_X=1\n", 11, &back, storage, 100), -EBADMSG);
    cr_assert_eq(kc_remote_descriptor_settings("KCACHE_REMOTE=r", 15, &back, storage, 100),
                 -EBADMSG);
}

Test(url, key_names)
{
    kc_key k = {.id = {.lo = 0x1122334455667788ull, .hi = 0x99aabbccddeeff00ull}, .build = 7};
    char buf[KC_REMOTE_KEY_MAX], lk[KC_REMOTE_KEY_MAX + 16];
    cr_assert_eq(kc_remote_key_name("nvrtc:13.0-abc-f1", &k, buf, sizeof buf), 0);
    cr_assert_str_eq(buf,
                     "kcache:nvrtc:13.0-abc-f1:99aabbccddeeff0011223344556677880000000000000007");
    cr_assert_eq(kc_remote_lock_name("nvrtc:13.0-abc-f1", &k, lk, sizeof lk), 0);
    cr_assert_str_eq(lk, "kcache:lock:{kcache:nvrtc:13.0-abc-f1:"
                         "99aabbccddeeff0011223344556677880000000000000007}");
    /* The lock lives in the entry's cluster slot. */
    cr_assert_eq(kc__cluster_slot(lk, strlen(lk)), kc__cluster_slot(buf, strlen(buf)));
    const char *bad[] = {"", "a b", "a{b", "a}b", "tab\t", "\x7f"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(kc_remote_key_name(bad[i], &k, buf, sizeof buf), -EINVAL, "'%s'", bad[i]);
    char longns[200];
    memset(longns, 'n', 128);
    longns[128] = '\0';
    cr_assert_eq(kc_remote_key_name(longns, &k, buf, sizeof buf), -EINVAL);
}

Test(url, cluster_slots)
{
    /* Redis Cluster specification's test vector and hash tag rules. */
    cr_assert_eq(kc__cluster_slot("123456789", 9), 0x31c3 & 16383);
    cr_assert_eq(kc__cluster_slot("{user1000}.following", 20), kc__cluster_slot("user1000", 8));
    cr_assert_eq(kc__cluster_slot("foo{}{bar}", 10), kc__cluster_slot("foo{}{bar}", 10));
    cr_assert_neq(kc__cluster_slot("foo{}{bar}", 10), kc__cluster_slot("bar", 3));
    cr_assert_eq(kc__cluster_slot("foo{{bar}}zap", 13), kc__cluster_slot("{bar", 4));
    cr_assert_eq(kc__cluster_slot("foo{bar}{zap}", 13), kc__cluster_slot("bar", 3));
    cr_assert_eq(kc__cluster_slot("{a", 2), kc__cluster_slot("{a", 2));
}

Test(url, natural_log)
{
    double xs[] = {1.0, 0.5, 0.1, 1e-3, 1e-9, 1e-16, 0.999999, 0.3333, 2.220446e-16};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++)
        cr_assert_float_eq(kc__ln(xs[i]), log(xs[i]), 1e-12 * (1 + fabs(log(xs[i]))), "ln(%g)",
                           xs[i]);
}

Test(url, rendezvous)
{
    cr_assert_eq(parse("redis://a redis://b redis://c redis://d"), 0);
    int count[4] = {0}, where[4000];
    for (int i = 0; i < 4000; i++) {
        char key[64];
        int n = snprintf(key, sizeof key, "kcache:ns:%08x", i * 2654435761u);
        where[i] = kc__rendezvous(cfg.ep, 4, key, (size_t)n);
        count[where[i]]++;
    }
    for (int s = 0; s < 4; s++)
        cr_assert(count[s] > 800 && count[s] < 1200, "shard %d got %d of 4000", s, count[s]);
    /* Removing a shard moves only its own keys. */
    struct kc_remote_endpoint three[3] = {cfg.ep[0], cfg.ep[1], cfg.ep[3]};
    int map[4] = {0, 1, -1, 2};
    for (int i = 0; i < 4000; i++) {
        char key[64];
        int n = snprintf(key, sizeof key, "kcache:ns:%08x", i * 2654435761u);
        int w = kc__rendezvous(three, 3, key, (size_t)n);
        if (where[i] != 2)
            cr_assert_eq(w, map[where[i]], "key %d moved from shard %d", i, where[i]);
    }
    /* Weights: a shard of weight 3 gets about three times the keys. */
    cr_assert_eq(parse("redis://x-*|shards=a(3),b"), 0, "%s", err);
    int wa = 0;
    for (int i = 0; i < 4000; i++) {
        char key[64];
        int n = snprintf(key, sizeof key, "k%d", i);
        wa += kc__rendezvous(cfg.ep, 2, key, (size_t)n) == 0;
    }
    cr_assert(wa > 2800 && wa < 3200, "weight 3 of 4 got %d of 4000", wa);
}

Test(url, base64)
{
    char out[64];
    unsigned char back[64];
    const char *v[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *e[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        kc__b64_encode((const unsigned char *)v[i], strlen(v[i]), out);
        cr_assert_str_eq(out, e[i]);
        cr_assert_eq(kc__b64_decode(e[i], strlen(e[i]), back, sizeof back), (int)strlen(v[i]));
        cr_assert(memcmp(back, v[i], strlen(v[i])) == 0);
    }
    cr_assert_eq(kc__b64_decode("Zm9", 3, back, sizeof back), -1);
    cr_assert_eq(kc__b64_decode("Z=9v", 4, back, sizeof back), -1);
    cr_assert_eq(kc__b64_decode("Zm9v", 4, back, 2), -1);
    cr_assert_eq(kc__b64_decode("Zm*v", 4, back, sizeof back), -1);
}

/* ---- the value layout ---------------------------------------------------- */

static const struct kc__sodium *na;
static struct kc__keys signer, reader;

static void keys_init(void)
{
    cr_assert_eq(kc__sodium_load(&na), 0);
    unsigned char seed[32];
    memset(seed, 7, sizeof seed);
    memset(&signer, 0, sizeof signer);
    na->seed_keypair(signer.self.pk, signer.sk, seed);
    signer.self.id = kc__key_id(na, signer.self.pk);
    signer.have_secret = true;
    memset(&reader, 0, sizeof reader);
    reader.trusted = malloc(sizeof *reader.trusted);
    reader.trusted[0] = signer.self;
    reader.n_trusted = 1;
}

static void keys_fini(void)
{
    kc__keys_free(na, &signer);
    kc__keys_free(na, &reader);
}

TestSuite(value, .init = keys_init, .fini = keys_fini, .timeout = 60);

static const kc_key K = {.id = {.lo = 1, .hi = 2}, .build = 3};

Test(value, round_trip_and_layout)
{
    unsigned char *v;
    size_t n;
    const char body[] = "the body";
    cr_assert_eq(kc__rv_encode(na, &signer, "ns", &K, KC_KIND_NVRTC, KC_FORMAT_VERSION, 11, 22,
                               body, 8, &v, &n),
                 0);
    cr_assert_eq(n, 81 + 2 + 56 + 8 + 16);
    cr_assert(memcmp(v, "KCRV", 4) == 0);
    cr_assert_eq(v[4], 1);
    cr_assert_eq(v[6], 1); /* signed */
    cr_assert_eq(v[80], 2);
    cr_assert(memcmp(v + 81, "ns", 2) == 0);
    struct kc__rv rv;
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "ns", &K, &rv), 0);
    cr_assert_eq(rv.kind, KC_KIND_NVRTC);
    cr_assert_eq(rv.format, KC_FORMAT_VERSION);
    cr_assert_eq(rv.created_ns, 11);
    cr_assert_eq(rv.saved_ns, 22);
    cr_assert_eq(rv.body_len, 8);
    cr_assert(memcmp(rv.body, body, 8) == 0);
    cr_assert_eq(rv.key_id, signer.self.id);
    /* Every single-bit change anywhere is refused. */
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++) {
            v[i] ^= (unsigned char)(1 << b);
            cr_assert_neq(kc__rv_decode(na, &reader, v, n, "ns", &K, &rv), 0, "byte %zu bit %d", i,
                          b);
            v[i] ^= (unsigned char)(1 << b);
        }
    /* Every truncation and an extension are refused. */
    for (size_t l = 0; l < n; l++)
        cr_assert_neq(kc__rv_decode(na, &reader, v, l, "ns", &K, &rv), 0, "length %zu", l);
    unsigned char *longer = malloc(n + 1);
    memcpy(longer, v, n);
    longer[n] = 0;
    cr_assert_neq(kc__rv_decode(na, &reader, longer, n + 1, "ns", &K, &rv), 0);
    free(longer);
    /* Asked for under another namespace or key: refused. */
    kc_key other = K;
    other.build = 4;
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "ns", &other, &rv), -EBADMSG);
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "nt", &K, &rv), -EBADMSG);
    free(v);
}

/* Small signed values (lock values): only the signer's, for one use. */
Test(value, blobs)
{
    unsigned char sig[KC__SIG_LEN];
    cr_assert_eq(kc__blob_sign(na, &signer, "kcache-lock-v1", "tok", 3, sig), 0);
    cr_assert_eq(kc__blob_verify(na, &reader, "kcache-lock-v1", signer.self.id, "tok", 3, sig), 0);
    cr_assert_eq(kc__blob_verify(na, &reader, "kcache-other-v1", signer.self.id, "tok", 3, sig),
                 -EKEYREJECTED);
    cr_assert_eq(kc__blob_verify(na, &reader, "kcache-lock-v1", signer.self.id, "tol", 3, sig),
                 -EKEYREJECTED);
    cr_assert_eq(kc__blob_verify(na, &reader, "kcache-lock-v1", 12345, "tok", 3, sig),
                 -EKEYREJECTED);
    cr_assert_eq(kc__blob_sign(na, &reader, "kcache-lock-v1", "tok", 3, sig), -EROFS);
}

/* A lock value is a blob in context "kcache-lock-v1" over its lock's name,
 * a NUL and the value before the signature: one signing mechanism for
 * small values. Bound to the lock's name and expiry, it verifies for
 * nothing else. */
Test(value, lock_values_are_blobs)
{
    char v[KC__LOCK_VALUE_MAX];
    const char *lock = "kcache:lock:{ns:abc}";
    uint64_t now = 1700000000000ull;
    cr_assert_eq(kc__lock_value(na, &signer, lock, "host:1:2", now + 5000, v, sizeof v), 0);
    size_t n = strlen(v);
    cr_assert_eq(kc__lock_value_check(na, &reader, lock, v, n, now, 86400000), 0);
    cr_assert_eq(kc__lock_value_check(na, &reader, "kcache:lock:{ns:abd}", v, n, now, 86400000),
                 -EKEYREJECTED);
    cr_assert_eq(kc__lock_value_check(na, &reader, lock, v, n, now + 5000, 86400000), -EKEYREJECTED,
                 "an expired value replayed");
    const char *sp = strrchr(v, ' ');
    unsigned char sig[KC__SIG_LEN + 2];
    cr_assert_eq(kc__b64_decode(sp + 1, strlen(sp + 1), sig, sizeof sig), KC__SIG_LEN);
    char msg[KC__LOCK_VALUE_MAX + 64];
    size_t ll = strlen(lock), sl = (size_t)(sp - v);
    memcpy(msg, lock, ll + 1);
    memcpy(msg + ll + 1, v, sl);
    cr_assert_eq(
        kc__blob_verify(na, &reader, "kcache-lock-v1", signer.self.id, msg, ll + 1 + sl, sig), 0);
    cr_assert_eq(
        kc__blob_verify(na, &reader, "kcache-blob-v1", signer.self.id, msg, ll + 1 + sl, sig),
        -EKEYREJECTED);
    /* The expiry is signed: changed, the value no longer verifies. */
    char w[KC__LOCK_VALUE_MAX];
    memcpy(w, v, n + 1);
    char *e = w + sl - 1;
    *e = *e == '9' ? '8' : (char)(*e + 1);
    cr_assert_eq(kc__lock_value_check(na, &reader, lock, w, n, now, 86400000), -EKEYREJECTED);
    cr_assert_eq(kc__lock_value(na, &reader, lock, "host:1:2", now + 5000, v, sizeof v), -EROFS);
}

/* Signer tags: what a local store records for the key that signed. */
Test(value, signer_tags)
{
    uint32_t t = kc_remote_signer_tag(signer.self.pk);
    cr_assert_leq(t, 0x0fffffffu);
    cr_assert(kc_remote_signers_serve(NULL, KC_PROV(KC_PROV_SIGNED, t)));
    cr_assert(kc_remote_signers_serve(NULL, KC_PROV(KC_PROV_LOCAL, 0)));
}

Test(value, signature_is_what_is_trusted)
{
    unsigned char *v;
    size_t n;
    /* Unsigned: refused unless every entry is trusted. */
    cr_assert_eq(kc__rv_encode(NULL, NULL, "ns", &K, 1, 1, 0, 0, "x", 1, &v, &n), 0);
    struct kc__rv rv;
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "ns", &K, &rv), -EKEYREJECTED);
    struct kc__keys any = {.trust_any = true};
    cr_assert_eq(kc__rv_decode(NULL, &any, v, n, "ns", &K, &rv), 0);
    free(v);

    /* Signed by a key nobody trusts, and by it under a trusted key's id. */
    struct kc__keys mallory = {0};
    unsigned char seed[32];
    memset(seed, 9, sizeof seed);
    na->seed_keypair(mallory.self.pk, mallory.sk, seed);
    mallory.self.id = kc__key_id(na, mallory.self.pk);
    mallory.have_secret = true;
    cr_assert_eq(kc__rv_encode(na, &mallory, "ns", &K, 1, 1, 0, 0, "x", 1, &v, &n), 0);
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "ns", &K, &rv), -EKEYREJECTED);
    free(v);
    mallory.self.id = signer.self.id;
    cr_assert_eq(kc__rv_encode(na, &mallory, "ns", &K, 1, 1, 0, 0, "x", 1, &v, &n), 0);
    cr_assert_eq(kc__rv_decode(na, &reader, v, n, "ns", &K, &rv), -EKEYREJECTED);
    free(v);
    kc__keys_free(na, &mallory);
}
