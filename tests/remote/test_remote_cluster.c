/*
 * test_remote_cluster.c: the remote tier against a Redis Cluster (suite
 * remote). Each test builds its own cluster: three `redis-server
 * --cluster-enabled yes` primaries on free loopback ports (127.0.0.1 only)
 * in a private directory, joined with `redis-cli --cluster create
 * --cluster-yes`, and tears it down at the end (harness.h). It checks the
 * client's slots against the server's, round trips through the cluster,
 * MOVED and ASK during a slot migration driven by hand (CLUSTER SETSLOT
 * IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE), locks in their entry's slot,
 * and a primary killed.
 */
#include "harness.h"

#include <inttypes.h>

static struct rserver node[3];
static char node_id[3][64];
static char wkey[300], trusted[300];
static struct kc_remote *opened[8];
static int n_opened;

static const char NS[] = "nvrtc:13.0-test-f1";

static struct kc_remote_endpoint ep_of(int i)
{
    struct kc_remote_endpoint e = {.transport = KC_REMOTE_TCP, .port = node[i].port};
    snprintf(e.host, sizeof e.host, "127.0.0.1");
    return e;
}

/* One command on node i (strings). */
static redisReply *raw(int i, int argc, const char **argv)
{
    struct kc_remote_endpoint e = ep_of(i);
    return h_raw(&e, argc, argv, NULL);
}

static long long raw_int(int i, int argc, const char **argv)
{
    redisReply *rep = raw(i, argc, argv);
    cr_assert_eq(rep->type, REDIS_REPLY_INTEGER, "%s on node %d: %s", argv[0], i,
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "not an integer");
    long long v = rep->integer;
    h_free(rep);
    return v;
}

static void raw_ok(int i, int argc, const char **argv)
{
    redisReply *rep = raw(i, argc, argv);
    cr_assert_eq(rep->type, REDIS_REPLY_STATUS, "%s %s on node %d: %s", argv[0],
                 argc > 1 ? argv[1] : "", i, rep->type == REDIS_REPLY_ERROR ? rep->str : "?");
    h_free(rep);
}

static bool cluster_ok(int i)
{
    char out[4096];
    if (h_cli(&node[i], out, sizeof out, "CLUSTER", "INFO", NULL) != 0)
        return false;
    return strstr(out, "cluster_state:ok") != NULL &&
           strstr(out, "cluster_slots_assigned:16384") != NULL &&
           strstr(out, "cluster_known_nodes:3") != NULL;
}

static void cluster_up(void)
{
    h_mktmp("cluster");
    snprintf(wkey, sizeof wkey, "%s/writer", h_tmp);
    snprintf(trusted, sizeof trusted, "%s/trusted", h_tmp);
    n_opened = 0;
    memset(node, 0, sizeof node);
    int ports[6];
    for (int i = 0; i < 6; i++) {
        bool dup;
        do {
            ports[i] = h_free_port();
            dup = false;
            for (int j = 0; j < i; j++)
                dup = dup || ports[j] == ports[i];
        } while (dup);
    }
    char addr[3][32];
    for (int i = 0; i < 3; i++) {
        node[i].port = ports[i];
        node[i].cport = ports[3 + i];
        node[i].cluster = true;
        char name[16];
        snprintf(name, sizeof name, "node%d", i);
        h_start(&node[i], name);
        snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", ports[i]);
    }
    char out[8192];
    char *argv[] = {"redis-cli", "--cluster", "create",        addr[0],
                    addr[1],     addr[2],     "--cluster-yes", NULL};
    int rc = h_run(out, sizeof out, argv);
    cr_assert_eq(rc, 0, "redis-cli --cluster create: %s", out);
    for (int i = 0; i < 3; i++) {
        int tries = 0;
        while (!cluster_ok(i)) {
            cr_assert(++tries < 1200, "node %d never reported the cluster ok", i);
            h_sleep_ms(25);
        }
        cr_assert_eq(h_cli(&node[i], node_id[i], sizeof node_id[i], "CLUSTER", "MYID", NULL), 0);
        node_id[i][strcspn(node_id[i], "\r\n")] = '\0';
    }

    /* The writer's keys. */
    char id[17];
    cr_assert_eq(kc_remote_keygen(wkey, "writer@test", id), 0);
    char pub[320], line[256];
    snprintf(pub, sizeof pub, "%s.pub", wkey);
    FILE *in = fopen(pub, "r");
    cr_assert_not_null(fgets(line, sizeof line, in));
    fclose(in);
    FILE *f = fopen(trusted, "w");
    fputs(line, f);
    fclose(f);
}

static void cluster_down(void)
{
    for (int i = 0; i < n_opened; i++)
        kc_remote_close(opened[i]);
    n_opened = 0;
    for (int i = 0; i < 3; i++)
        h_kill(&node[i]);
    h_rmtmp();
}

TestSuite(cluster, .init = cluster_up, .fini = cluster_down, .timeout = 120);

/* A cluster client seeded with the given nodes (indices). */
static struct kc_remote *open_cluster(int n, const int *seeds)
{
    char url[400] = "redis-cluster://";
    for (int i = 0; i < n; i++) {
        char s[40];
        snprintf(s, sizeof s, "%s127.0.0.1:%d", i ? "," : "", node[seeds[i]].port);
        strcat(url, s);
    }
    strcat(url, "|connect-timeout=500|operation-timeout=2000");
    struct kc_remote_settings st = {.remote = url, .signing_key = wkey, .trusted_keys = trusted};
    struct kc_remote_config cfg;
    char err[300];
    cr_assert_eq(kc_remote_config_parse(&st, &cfg, err, sizeof err), 0, "%s", err);
    struct kc_remote *r = NULL;
    cr_assert_eq(kc_remote_open(&cfg, NULL, &r), 0);
    kc_remote_config_free(&cfg);
    opened[n_opened++] = r;
    return r;
}

static struct kc_remote_counters ctr(struct kc_remote *r)
{
    struct kc_remote_counters c = {0};
    kc_remote_counters(r, &c);
    return c;
}

static kc_key key_n(uint64_t n)
{
    return (kc_key){.id = {.lo = n * 0x9e3779b97f4a7c15ull, .hi = ~n}, .build = 42};
}

static void name_n(uint64_t n, char *k)
{
    kc_key key = key_n(n);
    cr_assert_eq(kc_remote_key_name(NS, &key, k, KC_REMOTE_KEY_MAX), 0);
}

static unsigned slot_n(uint64_t n)
{
    char k[KC_REMOTE_KEY_MAX];
    name_n(n, k);
    return kc__cluster_slot(k, strlen(k));
}

static void put_ok(struct kc_remote *r, uint64_t n)
{
    char body[64];
    int len = snprintf(body, sizeof body, "entry %" PRIu64, n);
    kc_key k = key_n(n);
    int rc = kc_remote_put(r, NS, &k, NULL, KC_KIND_NVRTC, body, (size_t)len, 0);
    cr_assert_eq(rc, 0, "put %" PRIu64 ": %s", n, strerror(-rc));
}

static int get_rc(struct kc_remote *r, uint64_t n)
{
    void *got = NULL;
    size_t len = 0;
    kc_key k = key_n(n);
    int rc = kc_remote_get(r, NS, &k, &got, &len, NULL);
    if (rc == 0) {
        char body[64];
        int bl = snprintf(body, sizeof body, "entry %" PRIu64, n);
        cr_assert(len == (size_t)bl && memcmp(got, body, len) == 0, "entry %" PRIu64 " differs", n);
    }
    free(got);
    return rc;
}

/* The node (index) that owns a slot, from node 0's CLUSTER SLOTS. */
static int owner(unsigned slot)
{
    const char *argv[] = {"CLUSTER", "SLOTS"};
    redisReply *rep = raw(0, 2, argv);
    cr_assert_eq(rep->type, REDIS_REPLY_ARRAY);
    int port = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        redisReply *e = rep->element[i];
        if ((unsigned)e->element[0]->integer <= slot && slot <= (unsigned)e->element[1]->integer)
            port = (int)e->element[2]->element[1]->integer;
    }
    h_free(rep);
    for (int i = 0; i < 3; i++)
        if (node[i].port == port)
            return i;
    cr_assert_fail("slot %u has no owner", slot);
    return -1;
}

/* The node holding entry n (EXISTS on each). */
static int holder(uint64_t n)
{
    char k[KC_REMOTE_KEY_MAX];
    name_n(n, k);
    int found = -1;
    for (int i = 0; i < 3; i++) {
        if (node[i].pid <= 0)
            continue;
        char out[64];
        /* READONLY-free EXISTS: a node answers for its own keys, MOVED
         * (not an integer) for others'. */
        h_cli(&node[i], out, sizeof out, "EXISTS", k, NULL);
        if (strncmp(out, "1", 1) == 0) {
            cr_assert_eq(found, -1, "entry %" PRIu64 " on two nodes", n);
            found = i;
        }
    }
    return found;
}

Test(cluster, slots_match_the_server)
{
    for (uint64_t n = 0; n < 300; n++) {
        char k[KC_REMOTE_KEY_MAX], lk[KC_REMOTE_KEY_MAX + 16];
        name_n(n, k);
        const char *argv[] = {"CLUSTER", "KEYSLOT", k};
        cr_assert_eq(raw_int(0, 3, argv), (long long)kc__cluster_slot(k, strlen(k)), "%s", k);
        kc_key key = key_n(n);
        kc_remote_lock_name(NS, &key, lk, sizeof lk);
        const char *largv[] = {"CLUSTER", "KEYSLOT", lk};
        cr_assert_eq(raw_int(0, 3, largv), (long long)kc__cluster_slot(k, strlen(k)),
                     "the lock %s is not in its entry's slot", lk);
    }
    const char *odd[] = {"",
                         "{",
                         "}",
                         "{}",
                         "{}x",
                         "x{}",
                         "{a}",
                         "a{b}c{d}",
                         "{{a}}",
                         "a{",
                         "a}b{c",
                         "{user1000}.following",
                         "\xff\xfe{\x01}"};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        const char *argv[] = {"CLUSTER", "KEYSLOT", odd[i]};
        cr_assert_eq(raw_int(0, 3, argv), (long long)kc__cluster_slot(odd[i], strlen(odd[i])),
                     "'%s'", odd[i]);
    }
}

Test(cluster, round_trips_through_one_seed)
{
    int seed = 0;
    struct kc_remote *r = open_cluster(1, &seed);
    for (uint64_t n = 0; n < 200; n++)
        put_ok(r, n);
    for (uint64_t n = 0; n < 200; n++)
        cr_assert_eq(get_rc(r, n), 0, "entry %" PRIu64, n);
    long long total = 0;
    for (int i = 0; i < 3; i++) {
        const char *argv[] = {"DBSIZE"};
        long long c = raw_int(i, 1, argv);
        cr_assert(c > 30, "node %d holds %lld of 200", i, c);
        total += c;
    }
    cr_assert_eq(total, 200);
    /* Every entry on its slot's owner, reached without a redirection: the
     * client routes by the map it read. */
    for (uint64_t n = 0; n < 200; n += 7)
        cr_assert_eq(holder(n), owner(slot_n(n)));
    struct kc_remote_counters c = ctr(r);
    cr_assert_eq(c.moved + c.asks, 0);
    cr_assert_eq(c.errors + c.timeouts + c.bad, 0);
    cr_assert_eq(c.connects, 3, "one connection per node");

    /* Locks live beside their entries and hold across clients. */
    struct kc_remote *other = open_cluster(1, &seed);
    for (uint64_t n = 0; n < 30; n++) {
        kc_key k = key_n(n);
        cr_assert_eq(kc_remote_lock(r, NS, &k, 60000), 0);
        cr_assert_eq(kc_remote_lock(other, NS, &k, 60000), -EBUSY);
        char lk[KC_REMOTE_KEY_MAX + 16], out[64];
        kc_remote_lock_name(NS, &k, lk, sizeof lk);
        h_cli(&node[owner(slot_n(n))], out, sizeof out, "EXISTS", lk, NULL);
        cr_assert_eq(atoi(out), 1, "lock %" PRIu64 " not on its entry's node", n);
        cr_assert_eq(kc_remote_unlock(r, NS, &k), 0);
    }
    cr_assert_eq(ctr(r).moved + ctr(other).moved, 0);
}

/* An entry number whose slot satisfies pred, from `from` on. */
static uint64_t find_entry(uint64_t from, int want_owner, long want_slot, long not_slot)
{
    for (uint64_t n = from; n < from + 10000000; n++) {
        unsigned s = slot_n(n);
        if (want_slot >= 0 && s != (unsigned)want_slot)
            continue;
        if (not_slot >= 0 && s == (unsigned)not_slot)
            continue;
        if (want_owner >= 0 && owner(s) != want_owner)
            continue;
        return n;
    }
    cr_assert_fail("no such entry");
    return 0;
}

static void setslot(int i, unsigned slot, const char *how, const char *id)
{
    char s[16];
    snprintf(s, sizeof s, "%u", slot);
    const char *argv[] = {"CLUSTER", "SETSLOT", s, how, id};
    raw_ok(i, 5, argv);
}

/* Entry n's slot half-migrated from node `from` to node `to` (importing,
 * migrating), and the entry moved there: the slot is still `from`'s. */
static void migrate_key(int from, int to, uint64_t n)
{
    setslot(to, slot_n(n), "IMPORTING", node_id[from]);
    setslot(from, slot_n(n), "MIGRATING", node_id[to]);
    char k[KC_REMOTE_KEY_MAX], port[16];
    name_n(n, k);
    snprintf(port, sizeof port, "%d", node[to].port);
    const char *argv[] = {"MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS", k};
    raw_ok(from, 8, argv);
}

Test(cluster, slot_migrated_during_the_run)
{
    int seed = 0;
    struct kc_remote *r = open_cluster(1, &seed);
    const int A = 0, B = 1;
    /* k1 and k3 share slot s (owned by A); k4 is in another slot s2 of A. */
    uint64_t k1 = find_entry(0, A, -1, -1);
    unsigned s = slot_n(k1);
    uint64_t k3 = find_entry(k1 + 1, -1, s, -1);
    uint64_t k4 = find_entry(k1 + 1, A, -1, s);
    unsigned s2 = slot_n(k4);
    put_ok(r, k1);
    put_ok(r, k4);
    cr_assert_eq(holder(k1), A);
    cr_assert_eq(get_rc(r, k1), 0);

    /* Slot s half-migrated: k1 moved to B, the slot still A's. */
    migrate_key(A, B, k1);
    cr_assert_eq(holder(k1), -1, "visible only through ASKING while migrating");
    cr_assert_eq(get_rc(r, k1), 0, "ASK not followed");
    cr_assert_eq(ctr(r).asks, 1);
    /* A new key of the migrating slot goes to the importing node. */
    put_ok(r, k3);
    cr_assert_eq(ctr(r).asks, 2);
    cr_assert_eq(get_rc(r, k3), 0);
    cr_assert_eq(ctr(r).moved, 0);

    /* Slot s2 migrated whole meanwhile. */
    migrate_key(A, B, k4);
    for (int i = 0; i < 3; i++)
        setslot(i == 0 ? B : i == 1 ? A : 2, s2, "NODE", node_id[B]);
    /* Slot s finished: B owns it. */
    for (int i = 0; i < 3; i++)
        setslot(i == 0 ? B : i == 1 ? A : 2, s, "NODE", node_id[B]);
    cr_assert_eq(holder(k1), B);
    cr_assert_eq(holder(k3), B);
    cr_assert_eq(holder(k4), B);

    /* The client's map still says A: one MOVED, then the map is read again,
     * so s2 is found at B without another redirection. */
    cr_assert_eq(get_rc(r, k1), 0, "MOVED not followed");
    cr_assert_eq(ctr(r).moved, 1);
    cr_assert_eq(get_rc(r, k4), 0);
    cr_assert_eq(get_rc(r, k3), 0);
    cr_assert_eq(ctr(r).moved, 1, "the map was not refreshed after MOVED");
    /* Writes follow too. */
    uint64_t k5 = find_entry(k4 + 1, -1, s2, -1);
    put_ok(r, k5);
    cr_assert_eq(holder(k5), B);
    struct kc_remote_counters c = ctr(r);
    cr_assert_eq(c.errors + c.timeouts + c.bad, 0);
    /* A fresh client reads the new map at once. */
    struct kc_remote *fresh = open_cluster(1, &seed);
    cr_assert_eq(get_rc(fresh, k1), 0);
    cr_assert_eq(ctr(fresh).moved + ctr(fresh).asks, 0);
}

Test(cluster, primary_killed)
{
    int seed = 0;
    struct kc_remote *r = open_cluster(1, &seed);
    int on[200];
    for (uint64_t n = 0; n < 200; n++)
        put_ok(r, n);
    for (uint64_t n = 0; n < 200; n++) {
        on[n] = holder(n);
        cr_assert_eq(get_rc(r, n), 0);
    }
    const int C = 2;
    h_kill(&node[C]);
    int missed = 0, hit = 0, lost = 0;
    for (uint64_t n = 0; n < 200; n++) {
        int rc = get_rc(r, n);
        if (on[n] == C) {
            cr_assert_neq(rc, 0, "entry %" PRIu64 " of the dead node served", n);
            lost++;
            missed += rc != 0;
        } else {
            cr_assert_eq(rc, 0, "entry %" PRIu64 " on a live node: %s", n, strerror(-rc));
            hit++;
        }
    }
    cr_assert(lost > 0 && hit > 0);
    struct kc_remote_counters c = ctr(r);
    /* The dead node cost one failure; its other keys failed fast. */
    cr_assert_eq(c.errors + c.timeouts, 1, "errors %" PRIu64 " timeouts %" PRIu64, c.errors,
                 c.timeouts);
    /* Writes to live nodes go on. */
    uint64_t alive = find_entry(1000, 0, -1, -1);
    put_ok(r, alive);
    cr_assert_eq(get_rc(r, alive), 0);
    /* A client whose first seed is the dead node finds the cluster through
     * the next seed. */
    int seeds[] = {C, 1};
    struct kc_remote *late = open_cluster(2, seeds);
    cr_assert_eq(get_rc(late, alive), 0);
    cr_assert_eq(ctr(late).errors, 1);
}

/* A host that never reached the primary that died (its first keys lived
 * elsewhere), as most ranks of a failover: the dead node refuses, which
 * costs nothing, so only its own keys fail; the live primaries' keys are
 * still read, written and locked, within the same few operations. */
Test(cluster, dead_primary_it_never_reached_turns_off_only_its_keys)
{
    const int C = 2;
    uint64_t a = find_entry(0, 0, -1, -1), b = find_entry(a + 1, 1, -1, -1);
    uint64_t c = find_entry(0, C, -1, -1), l = find_entry(b + 1, 0, -1, -1);
    int seed = 0;
    struct kc_remote *w = open_cluster(1, &seed);
    put_ok(w, a);
    put_ok(w, b);
    /* The host: its first operation reads the map (through node 0). */
    struct kc_remote *r = open_cluster(1, &seed);
    cr_assert_eq(get_rc(r, a), 0);
    h_kill(&node[C]);
    cr_assert_neq(get_rc(r, c), 0, "an entry of the dead node");
    cr_assert_eq(get_rc(r, b), 0, "a live primary's entry after the dead one refused");
    cr_assert_eq(get_rc(r, a), 0);
    kc_key lk = key_n(l);
    cr_assert_eq(kc_remote_lock(r, NS, &lk, 60000), 0, "a live primary's lock");
    cr_assert_eq(kc_remote_unlock(r, NS, &lk), 0);
    cr_assert(kc_remote_usable(r));
    struct kc_remote_counters k = ctr(r);
    cr_assert_eq(k.refusals, 1, "refusals %" PRIu64, k.refusals);
    cr_assert_eq(k.timeouts, 0);
}

/* A hung primary (SIGSTOPped) that this host never reached times out
 * again once its backoff ends: it is one node, counted once, so it turns
 * off only its own keys, never the whole remote (counted as a second
 * unreached node, it turned every waiting host's remote off: issue 47,
 * finding 1's duplicate compiles). */
Test(cluster, hung_primary_failing_again_turns_off_only_its_keys)
{
    const int C = 2;
    uint64_t a = find_entry(0, 0, -1, -1), c = find_entry(0, C, -1, -1);
    int seed = 0;
    struct kc_remote *w = open_cluster(1, &seed);
    put_ok(w, a);
    struct kc_remote *r = open_cluster(1, &seed);
    cr_assert_eq(get_rc(r, a), 0);
    kill(node[C].pid, SIGSTOP);
    cr_assert_neq(get_rc(r, c), 0, "an entry of the hung node");
    h_sleep_ms(1200); /* past its first backoff (1 s) */
    cr_assert_neq(get_rc(r, c), 0, "the hung node, tried again");
    struct kc_remote_counters k = ctr(r);
    kill(node[C].pid, SIGCONT);
    cr_assert_eq(k.timeouts, 2, "timeouts %" PRIu64, k.timeouts);
    cr_assert(kc_remote_usable(r), "the whole remote turned off by one hung node");
    cr_assert_eq(get_rc(r, a), 0, "a live primary's entry");
}

/* While a dead primary's replica is not promoted yet, its keys live under
 * fallback names on the live primaries: the nodes still share them (an
 * entry put by one is served to another, a lock taken by one is seen by
 * another), each node's first operation on them included. */
Test(cluster, dead_primary_keys_shared_through_live_primaries)
{
    const int C = 2;
    uint64_t c = find_entry(0, C, -1, -1), c2 = find_entry(c + 1, C, -1, -1);
    int seed = 0;
    struct kc_remote *w = open_cluster(1, &seed);
    struct kc_remote *r = open_cluster(1, &seed);
    struct kc_remote *x = open_cluster(1, &seed);
    cr_assert_eq(get_rc(r, find_entry(0, 0, -1, -1)), -ENOENT);
    h_kill(&node[C]);
    put_ok(w, c);
    cr_assert_eq(holder(c), -1, "under its own name: the dead node's");
    cr_assert_eq(get_rc(r, c), 0, "an entry of the dead node's slots put meanwhile");
    kc_key k2 = key_n(c2);
    cr_assert_eq(kc_remote_lock(w, NS, &k2, 60000), 0);
    cr_assert_eq(kc_remote_lock(x, NS, &k2, 60000), -EBUSY, "the holder's lock, seen");
    cr_assert_eq(kc_remote_unlock(w, NS, &k2), 0);
    cr_assert_eq(kc_remote_lock(x, NS, &k2, 60000), 0);
    cr_assert_eq(ctr(r).timeouts + ctr(w).timeouts + ctr(x).timeouts, 0);
}

/* A failover, by hand: node C dies and node 0 takes its slots (the
 * promoted replica's part). The first operation on one of them after the
 * takeover reads the map again (from another node: C is off) and goes to
 * the new owner, within that operation: no wait for a later one, and no
 * timeout paid. */
Test(cluster, failover_followed_within_the_operation)
{
    const int C = 2;
    int seed = 0;
    struct kc_remote *r = open_cluster(1, &seed);
    uint64_t a = find_entry(0, 0, -1, -1), c = find_entry(0, C, -1, -1);
    uint64_t c2 = find_entry(c + 1, C, -1, -1);
    put_ok(r, a);
    put_ok(r, c);
    /* C's slot ranges, from node 0's map. */
    long lo[64], hi[64];
    int nr = 0;
    const char *sargv[] = {"CLUSTER", "SLOTS"};
    redisReply *rep = raw(0, 2, sargv);
    for (size_t i = 0; i < rep->elements && nr < 64; i++) {
        redisReply *e = rep->element[i];
        if (e->element[2]->element[1]->integer == node[C].port) {
            lo[nr] = (long)e->element[0]->integer;
            hi[nr++] = (long)e->element[1]->integer;
        }
    }
    h_free(rep);
    cr_assert(nr > 0);
    h_kill(&node[C]);
    cr_assert_neq(get_rc(r, c), 0, "the dead node's entry");
    cr_assert_eq(get_rc(r, a), 0);
    /* Node 0 takes C's slots, with the greatest epoch (as a promoted
     * replica does). */
    const char *bargv[] = {"CLUSTER", "BUMPEPOCH"};
    h_free(raw(0, 2, bargv));
    for (int i = 0; i < nr; i++) {
        char l[16], h[16];
        snprintf(l, sizeof l, "%ld", lo[i]);
        snprintf(h, sizeof h, "%ld", hi[i]);
        const char *dargv[] = {"CLUSTER", "DELSLOTSRANGE", l, h};
        raw_ok(0, 4, dargv);
        const char *aargv[] = {"CLUSTER", "ADDSLOTSRANGE", l, h};
        raw_ok(0, 4, aargv);
    }
    cr_assert_eq(owner(slot_n(c2)), 0);
    /* The next operation on C's former slots goes to node 0. */
    put_ok(r, c2);
    cr_assert_eq(get_rc(r, c2), 0);
    cr_assert_eq(ctr(r).timeouts, 0);
}

/* A slot migration finished source first: the source already names the
 * importing node, which (still importing) names the source back. The
 * client follows the MOVEDs a bounded number of times, waiting 1, 2, 4 ...
 * ms between them (31 ms in all) for the migration to end, then gives up:
 * a miss, counted as an error; once both nodes agree, the entry is served. */
Test(cluster, two_nodes_naming_each_other)
{
    int seed = 0;
    struct kc_remote *r = open_cluster(1, &seed);
    const int A = 0, B = 1;
    uint64_t k = find_entry(0, A, -1, -1);
    unsigned s = slot_n(k);
    put_ok(r, k);
    cr_assert_eq(get_rc(r, k), 0);
    migrate_key(A, B, k);
    setslot(A, s, "NODE", node_id[B]);
    struct kc_remote_counters before = ctr(r);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_neq(get_rc(r, k), 0, "served through a redirection loop");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    struct kc_remote_counters c = ctr(r);
    cr_assert_eq(c.moved - before.moved, KC__MAX_REDIRECTS + 1);
    cr_assert_eq(c.errors - before.errors, 1);
    cr_assert(ms >= 30.0, "gave up after %.1f ms: no wait between the redirections", ms);
    /* The migration ends: both (and the third node) name B. */
    setslot(B, s, "NODE", node_id[B]);
    setslot(2, s, "NODE", node_id[B]);
    cr_assert_eq(get_rc(r, k), 0);
    cr_assert_eq(holder(k), B);
}
