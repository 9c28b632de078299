/*
 * test_remote_robust.c: the remote tier against hostile and failing
 * servers (suite remote): replies that would cost memory before they are
 * refused, redirections to ever-new addresses, failures that repeat on
 * every lookup, a server restarted under a host, locks held by writers
 * this node does not trust, read-only nodes in single flight, and the
 * counters that say why. The hostile servers are scripted fakes on
 * loopback (a thread here, answering parsed commands); the rest are real
 * redis-servers (harness.h). Bounds are asserted on work done (timeouts,
 * errors, connections counted); the few wall-clock checks are far from
 * what the bounded code takes and far below what the unbounded one did.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <sys/resource.h>

static struct rserver srv;
static char wkey[300], okey[300], trusted[300];
static struct kc_remote *opened[16];
static int n_opened;

/* ---- a scripted fake server on a loopback port --------------------------- */

/* What Redis 7 answers a write from a script when it is full. */
#define OOM_LONG                                                                                   \
    "OOM command not allowed when used memory > 'maxmemory'. script: "                             \
    "3f2a9c1e0b7d4e5f6a7b8c9d0e1f2a3b4c5d6e7f, on @user_script:1."

enum sfake_mode {
    SF_HUGE_ARRAY, /* every command: "*2147483647\r\n:1\r\n" */
    SF_NESTED,     /* every command: seven nested arrays of 2^31 - 1 */
    SF_ERROR,      /* every command: "-ERR no\r\n" */
    SF_BIG_VALUE,  /* GET: a 8 MB bulk string */
    SF_ASK_LOOP,   /* cluster: GET answered ASK to itself */
    SF_MOVED_NEW,  /* cluster: GET answered MOVED to a new silent port */
    SF_SLOTS_40,   /* cluster: 16,384 ranges over 40 silent ports */
    SF_OOM_LONG,   /* every command: a full server's OOM error, as a script gets it */
};

#define N_HOLES 48

struct sfake {
    int mode;
    int lfd, port;
    int stop[2];
    pthread_t th;
    int holes[N_HOLES]; /* listening, never accepting: silent servers */
    int hole_port[N_HOLES];
    int next_hole;
    int commands; /* commands answered */
};

static struct sfake sf;

static int listen_loopback(int *port, int backlog)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(fd, backlog), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    *port = ntohs(a.sin_port);
    return fd;
}

static void send_all(int c, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void send_str(int c, const char *s)
{
    send_all(c, s, strlen(s));
}

/* Answers one command (argv[0] upper-cased by the client already). */
static void sf_answer(struct sfake *f, int c, int argc, char **argv)
{
    f->commands++;
    char buf[512];
    bool cluster_slots = argc >= 2 && strcasecmp(argv[0], "CLUSTER") == 0;
    bool get = argc >= 2 && strcasecmp(argv[0], "GET") == 0;
    switch (f->mode) {
    case SF_HUGE_ARRAY:
        send_str(c, "*2147483647\r\n:1\r\n");
        return;
    case SF_NESTED:
        for (int i = 0; i < 7; i++)
            send_str(c, "*2147483647\r\n");
        send_str(c, ":1\r\n");
        return;
    case SF_ERROR:
        send_str(c, "-ERR no\r\n");
        return;
    case SF_OOM_LONG:
        send_str(c, "-" OOM_LONG "\r\n");
        return;
    case SF_BIG_VALUE:
        if (get) {
            size_t n = 8u << 20;
            char *v = malloc(n);
            memset(v, 'v', n);
            send_str(c, "$8388608\r\n");
            send_all(c, v, n);
            send_str(c, "\r\n");
            free(v);
        } else {
            send_str(c, "+OK\r\n");
        }
        return;
    default:
        break;
    }
    if (strcasecmp(argv[0], "ASKING") == 0) {
        send_str(c, "+OK\r\n");
        return;
    }
    if (cluster_slots && f->mode == SF_SLOTS_40) {
        /* 16,384 ranges of one slot each, over 40 silent ports. */
        size_t cap = 16384 * 80 + 64, n = 0;
        char *out = malloc(cap);
        n += (size_t)snprintf(out + n, cap - n, "*16384\r\n");
        for (int s = 0; s < 16384; s++)
            n += (size_t)snprintf(out + n, cap - n,
                                  "*3\r\n:%d\r\n:%d\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", s, s,
                                  f->hole_port[s % 40]);
        send_all(c, out, n);
        free(out);
        return;
    }
    if (cluster_slots) {
        snprintf(buf, sizeof buf, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                 f->port);
        send_str(c, buf);
        return;
    }
    if (get) {
        unsigned slot = kc__cluster_slot(argv[1], strlen(argv[1]));
        if (f->mode == SF_ASK_LOOP) {
            snprintf(buf, sizeof buf, "-ASK %u 127.0.0.1:%d\r\n", slot, f->port);
        } else {
            int h = f->next_hole++ % N_HOLES;
            snprintf(buf, sizeof buf, "-MOVED %u 127.0.0.1:%d\r\n", slot, f->hole_port[h]);
        }
        send_str(c, buf);
        return;
    }
    send_str(c, "+OK\r\n");
}

/* Parses complete RESP commands at the start of buf; returns the bytes
 * used (0: incomplete). */
static size_t sf_parse(struct sfake *f, int c, char *buf, size_t len)
{
    size_t used = 0;
    for (;;) {
        char *p = buf + used, *end = buf + len;
        if (p >= end || *p != '*')
            return used;
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            return used;
        int argc = atoi(p + 1);
        p = nl + 1;
        char *argv[16];
        int n = 0;
        for (; n < argc; n++) {
            nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
            if (nl == NULL || *p != '$')
                return used;
            long l = atol(p + 1);
            p = nl + 1;
            if (end - p < l + 2)
                return used;
            if (n < 16) {
                argv[n] = p;
                p[l] = '\0'; /* over the \r */
            }
            p += l + 2;
        }
        sf_answer(f, c, argc < 16 ? argc : 16, argv);
        used = (size_t)(p - buf);
    }
}

static void *sf_main(void *arg)
{
    struct sfake *f = arg;
    int conns[16];
    char *bufs[16];
    size_t lens[16];
    int nc = 0;
    const size_t cap = 1 << 20;
    for (;;) {
        struct pollfd p[18];
        p[0] = (struct pollfd){.fd = f->stop[0], .events = POLLIN};
        p[1] = (struct pollfd){.fd = f->lfd, .events = POLLIN};
        for (int i = 0; i < nc; i++)
            p[2 + i] = (struct pollfd){.fd = conns[i], .events = POLLIN};
        if (poll(p, (nfds_t)(2 + nc), -1) < 0)
            continue;
        if (p[0].revents & POLLIN)
            break;
        if ((p[1].revents & POLLIN) && nc < 16) {
            int c = accept(f->lfd, NULL, NULL);
            if (c >= 0) {
                conns[nc] = c;
                bufs[nc] = malloc(cap);
                lens[nc++] = 0;
            }
        }
        for (int i = 0; i < nc; i++) {
            if (!(p[2 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = read(conns[i], bufs[i] + lens[i], cap - lens[i]);
            if (r <= 0) {
                close(conns[i]);
                free(bufs[i]);
                conns[i] = conns[nc - 1];
                bufs[i] = bufs[nc - 1];
                lens[i] = lens[nc - 1];
                p[2 + i] = p[2 + nc - 1];
                nc--;
                i--;
                continue;
            }
            lens[i] += (size_t)r;
            size_t used = sf_parse(f, conns[i], bufs[i], lens[i]);
            memmove(bufs[i], bufs[i] + used, lens[i] - used);
            lens[i] -= used;
        }
    }
    for (int i = 0; i < nc; i++) {
        close(conns[i]);
        free(bufs[i]);
    }
    return NULL;
}

static void sf_start(struct sfake *f, int mode)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->lfd = listen_loopback(&f->port, 16);
    for (int i = 0; i < N_HOLES; i++)
        f->holes[i] = listen_loopback(&f->hole_port[i], 64);
    cr_assert_eq(pipe(f->stop), 0);
    cr_assert_eq(pthread_create(&f->th, NULL, sf_main, f), 0);
}

static void sf_stop(struct sfake *f)
{
    if (f->lfd <= 0)
        return;
    if (write(f->stop[1], "x", 1) == 1)
        pthread_join(f->th, NULL);
    close(f->lfd);
    for (int i = 0; i < N_HOLES; i++)
        close(f->holes[i]);
    close(f->stop[0]);
    close(f->stop[1]);
    f->lfd = 0;
}

/* ---- setup, keys, opening ------------------------------------------------ */

static void setup(void)
{
    h_mktmp("robust");
    snprintf(wkey, sizeof wkey, "%s/writer", h_tmp);
    snprintf(okey, sizeof okey, "%s/other", h_tmp);
    snprintf(trusted, sizeof trusted, "%s/trusted", h_tmp);
    memset(&srv, 0, sizeof srv);
    memset(&sf, 0, sizeof sf);
    n_opened = 0;
}

static void teardown(void)
{
    for (int i = 0; i < n_opened; i++)
        kc_remote_close(opened[i]);
    n_opened = 0;
    sf_stop(&sf);
    h_kill(&srv);
    h_rmtmp();
}

TestSuite(robust, .init = setup, .fini = teardown, .timeout = 120);

/* The writer's key pair (trusted), and another key pair (not trusted). */
static void make_keys(void)
{
    cr_assert_eq(kc_remote_keygen(wkey, "writer@test", NULL), 0);
    cr_assert_eq(kc_remote_keygen(okey, "other@test", NULL), 0);
    char pub[320], line[256];
    snprintf(pub, sizeof pub, "%s.pub", wkey);
    FILE *in = fopen(pub, "r");
    cr_assert_not_null(in);
    cr_assert_not_null(fgets(line, sizeof line, in));
    fclose(in);
    FILE *out = fopen(trusted, "w");
    fprintf(out, "%s", line);
    fclose(out);
    chmod(trusted, 0644);
}

static struct kc_remote *open_url(const char *url, const char *signing, int retry_ms,
                                  const char *max_entry, const char *node)
{
    struct kc_remote_settings s = {
        .remote = url, .signing_key = signing, .trusted_keys = trusted, .max_entry = max_entry};
    struct kc_remote_config cfg;
    char err[300];
    int rc = kc_remote_config_parse(&s, &cfg, err, sizeof err);
    cr_assert_eq(rc, 0, "parse: %s", err);
    struct kc_remote_options opt = {.retry_ms = retry_ms, .node = node};
    struct kc_remote *r = NULL;
    rc = kc_remote_open(&cfg, &opt, &r);
    kc_remote_config_free(&cfg);
    cr_assert_eq(rc, 0);
    opened[n_opened++] = r;
    return r;
}

static struct kc_remote *open_fake(const char *scheme, const char *extra)
{
    char url[300];
    snprintf(url, sizeof url, "%s://127.0.0.1:%d|operation-timeout=300|connect-timeout=300%s",
             scheme, sf.port, extra);
    return open_url(url, wkey, 0, "64K", NULL);
}

/* A node on the test's redis-server (unix socket). */
static struct kc_remote *open_srv(const char *signing, int retry_ms, const char *node)
{
    char url[400];
    snprintf(url, sizeof url, "redis+unix:%s|operation-timeout=500|connect-timeout=500", srv.sock);
    return open_url(url, signing, retry_ms, NULL, node);
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

static const char NS[] = "nvrtc:13.0-test-f1";

static int get_rc(struct kc_remote *r, uint64_t n)
{
    void *got = NULL;
    size_t glen = 0;
    kc_key k = key_n(n);
    int rc = kc_remote_get(r, NS, &k, &got, &glen, NULL);
    free(got);
    return rc;
}

static int put_rc(struct kc_remote *r, uint64_t n)
{
    char body[64];
    int len = snprintf(body, sizeof body, "entry %" PRIu64, n);
    kc_key k = key_n(n);
    return kc_remote_put(r, NS, &k, NULL, KC_KIND_NVRTC, body, (size_t)len, 1000);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- 5: every reply bounded before it costs memory ----------------------- */

Test(robust, huge_array_header_costs_nothing)
{
    make_keys();
    sf_start(&sf, SF_HUGE_ARRAY);
    struct kc_remote *r = open_fake("redis", "");
    double t0 = now_s();
    int rc = get_rc(r, 1);
    double took = now_s() - t0;
    cr_assert_neq(rc, 0);
    cr_assert_eq(ctr(r).protocol_errors, 1, "protocol errors %" PRIu64, ctr(r).protocol_errors);
    /* Unbounded, hiredis 0.14 reserved and walked 2^31 slots (8.7 s). */
    cr_assert(took < 2.0, "a 17-byte reply took %.1f s", took);
}

Test(robust, nested_huge_arrays_cost_nothing)
{
    make_keys();
    sf_start(&sf, SF_NESTED);
    struct kc_remote *r = open_fake("redis", "");
    double t0 = now_s();
    cr_assert_neq(get_rc(r, 1), 0);
    double took = now_s() - t0;
    cr_assert(took < 2.0, "a 95-byte reply took %.1f s", took);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cr_assert(ru.ru_maxrss < (1L << 20), "peak RSS %ld KiB", ru.ru_maxrss);
}

/* ---- 6: redirections do not multiply the delay ---------------------------- */

/* Silent nodes the servers name cost KC__STRANGERS timeouts at most (the
 * first turns off only its keys, as one hung primary of a cluster does;
 * the second the whole remote), however many there are. */
Test(robust, moved_to_ever_new_silent_ports_costs_bounded_timeouts)
{
    make_keys();
    sf_start(&sf, SF_MOVED_NEW);
    struct kc_remote *r = open_fake("redis-cluster", "");
    for (int i = 0; i < 7; i++)
        cr_assert_neq(get_rc(r, (uint64_t)i), 0);
    struct kc_remote_counters c = ctr(r);
    cr_assert(c.timeouts <= KC__STRANGERS, "7 lookups paid %" PRIu64 " timeouts", c.timeouts);
}

Test(robust, slot_map_over_40_silent_ports_costs_bounded_timeouts)
{
    make_keys();
    sf_start(&sf, SF_SLOTS_40);
    struct kc_remote *r = open_fake("redis-cluster", "");
    for (int i = 0; i < 40; i++)
        cr_assert_neq(get_rc(r, (uint64_t)i), 0);
    struct kc_remote_counters c = ctr(r);
    cr_assert(c.timeouts <= KC__STRANGERS, "40 lookups paid %" PRIu64 " timeouts", c.timeouts);
}

/* ---- 7: failures that repeat turn the remote off for a while ------------- */

static void repeated_failure(int mode, const char *scheme)
{
    make_keys();
    sf_start(&sf, mode);
    struct kc_remote *r = open_fake(scheme, "");
    for (int i = 0; i < 7; i++)
        cr_assert_neq(get_rc(r, (uint64_t)i), 0);
    struct kc_remote_counters c = ctr(r);
    cr_assert(c.errors <= 3, "7 lookups paid %" PRIu64 " errors (%d commands answered)", c.errors,
              sf.commands);
    cr_assert(!kc_remote_usable(r), "still tried after %" PRIu64 " errors", c.errors);
}

Test(robust, oversized_values_turn_the_remote_off)
{
    repeated_failure(SF_BIG_VALUE, "redis");
}

Test(robust, error_replies_turn_the_remote_off)
{
    repeated_failure(SF_ERROR, "redis");
}

/* A server that refuses writes is named with its words whole, or cut at a
 * word's end: never mid-word (issue 47, finding 9). */
Test(robust, refused_writes_warning_keeps_the_servers_words)
{
    make_keys();
    sf_start(&sf, SF_OOM_LONG);
    struct kc_remote *r = open_fake("redis", "");
    char path[] = "/tmp/kc-robust-err.XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    kc_key k = key_n(1);
    int rc = kc_remote_put(r, NS, &k, NULL, KC_KIND_NVRTC, "body", 4, 0);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[2048] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    cr_assert_lt(rc, 0);
    cr_assert(strstr(buf, "refuses writes (" OOM_LONG ")") != NULL,
              "the warning cuts the server's words: %s", buf);
}

Test(robust, ask_ping_pong_turns_the_remote_off)
{
    repeated_failure(SF_ASK_LOOP, "redis-cluster");
}

Test(robust, bad_signatures_turn_the_remote_off)
{
    make_keys();
    h_start(&srv, "r");
    /* Large entries signed by a key the reader does not trust: each
     * lookup would pay their transfer again. */
    struct kc_remote *other = open_srv(okey, 0, "other");
    size_t len = 2u << 20;
    char *body = calloc(1, len);
    for (int i = 0; i < 7; i++) {
        kc_key k = key_n((uint64_t)i);
        cr_assert_eq(kc_remote_put(other, NS, &k, NULL, KC_KIND_NVRTC, body, len, 0), 0);
    }
    free(body);
    struct kc_remote *r = open_srv(wkey, 0, "reader");
    for (int i = 0; i < 7; i++)
        cr_assert_neq(get_rc(r, (uint64_t)i), 0);
    struct kc_remote_counters c = ctr(r);
    cr_assert(c.bad <= 3, "7 lookups fetched %" PRIu64 " refused entries", c.bad);
    cr_assert(c.bad_signatures >= 1);
}

/* ---- 9: a circuit breaker, not a fuse -------------------------------------- */

Test(robust, host_comes_back_after_a_restart)
{
    make_keys();
    h_start(&srv, "r");
    /* retry_ms 0: what a host opens with. */
    struct kc_remote *w = open_srv(wkey, 0, "w");
    cr_assert_eq(put_rc(w, 1), 0);
    cr_assert_eq(get_rc(w, 1), 0);
    h_kill(&srv);
    cr_assert_neq(get_rc(w, 1), 0);
    cr_assert_eq(get_rc(w, 1), -ENETDOWN, "the breaker is open");
    h_start(&srv, "r");
    struct kc_remote *fresh = open_srv(wkey, 0, "fresh");
    cr_assert_eq(put_rc(fresh, 1), 0);
    /* Within seconds of Redis, the host shares again. */
    double t0 = now_s();
    int rc;
    while ((rc = get_rc(w, 1)) != 0 && now_s() - t0 < 5)
        h_sleep_ms(20);
    cr_assert_eq(rc, 0, "after %.1f s: %s", now_s() - t0, strerror(-rc));
    cr_assert(kc_remote_usable(w));
}

/* ---- 4: locks a trusted writer did not take are not waited on -------------- */

Test(robust, lock_held_by_an_untrusted_writer_is_not_waited_on)
{
    make_keys();
    h_start(&srv, "r");
    struct kc_remote *a = open_srv(wkey, 0, "node-a");
    kc_key k = key_n(7);
    char lk[KC_REMOTE_KEY_MAX + 16], out[64];
    kc_remote_lock_name(NS, &k, lk, sizeof lk);
    /* Anyone with write access: a value of its choosing, no expiry. */
    cr_assert_eq(h_cli(&srv, out, sizeof out, "SET", lk, "node-x:1:0123456789abcdef", NULL), 0);
    int rc = kc_remote_lock(a, NS, &k, 60000);
    cr_assert_neq(rc, -EBUSY, "a forged lock is waited on");
    cr_assert_eq(ctr(a).lock_untrusted, 1);
    /* A trusted writer's lock is: */
    kc_key k2 = key_n(8);
    struct kc_remote *b = open_srv(wkey, 0, "node-b");
    cr_assert_eq(kc_remote_lock(b, NS, &k2, 60000), 0);
    cr_assert_eq(kc_remote_lock(a, NS, &k2, 60000), -EBUSY);
    /* ... but not its value copied under another key (a replay). */
    char lk2[KC_REMOTE_KEY_MAX + 16], val[512];
    kc_remote_lock_name(NS, &k2, lk2, sizeof lk2);
    cr_assert_eq(h_cli(&srv, val, sizeof val, "GET", lk2, NULL), 0);
    kc_key k3 = key_n(9);
    char lk3[KC_REMOTE_KEY_MAX + 16];
    kc_remote_lock_name(NS, &k3, lk3, sizeof lk3);
    cr_assert_eq(h_cli(&srv, out, sizeof out, "SET", lk3, val, NULL), 0);
    cr_assert_neq(kc_remote_lock(a, NS, &k3, 60000), -EBUSY, "a replayed lock is waited on");
}

Test(robust, expired_lock_value_replayed_is_not_waited_on)
{
    make_keys();
    h_start(&srv, "r");
    struct kc_remote *a = open_srv(wkey, 0, "node-a");
    struct kc_remote *b = open_srv(wkey, 0, "node-b");
    kc_key k = key_n(7);
    char lk[KC_REMOTE_KEY_MAX + 16], val[512], out[64];
    kc_remote_lock_name(NS, &k, lk, sizeof lk);
    cr_assert_eq(kc_remote_lock(b, NS, &k, 300), 0);
    cr_assert_eq(h_cli(&srv, val, sizeof val, "GET", lk, NULL), 0);
    h_sleep_ms(600);
    /* Written again without an expiry once b's lock is gone. */
    cr_assert_eq(h_cli(&srv, out, sizeof out, "SET", lk, val, NULL), 0);
    cr_assert_neq(kc_remote_lock(a, NS, &k, 60000), -EBUSY);
}

/* ---- 11: read-only nodes take part in single flight ------------------------ */

Test(robust, keyless_node_waits_for_a_writer_compiling)
{
    make_keys();
    h_start(&srv, "r");
    struct kc_remote *w = open_srv(wkey, 0, "writer");
    struct kc_remote *ro = open_srv(NULL, 0, "reader");
    kc_key k = key_n(7);
    /* Nothing held: compile without a lock. */
    cr_assert_eq(kc_remote_lock(ro, NS, &k, 60000), -EROFS);
    cr_assert_eq(kc_remote_lock(w, NS, &k, 60000), 0);
    /* A writer compiles it: wait (poll the entry). */
    cr_assert_eq(kc_remote_lock(ro, NS, &k, 60000), -EBUSY);
    cr_assert_eq(kc_remote_unlock(w, NS, &k), 0);
    cr_assert_eq(kc_remote_lock(ro, NS, &k, 60000), -EROFS);
}

/* ---- 13: counters that say why -------------------------------------------- */

Test(robust, counters_say_why)
{
    make_keys();
    h_start(&srv, "r");
    struct kc_remote *w = open_srv(wkey, 0, "w");
    cr_assert_eq(put_rc(w, 1), 0);
    h_kill(&srv);
    cr_assert_neq(get_rc(open_srv(wkey, 0, "x"), 1), 0);
    cr_assert_eq(ctr(opened[n_opened - 1]).refusals, 1);

    sf_start(&sf, SF_HUGE_ARRAY);
    struct kc_remote *p = open_fake("redis", "");
    cr_assert_neq(get_rc(p, 1), 0);
    cr_assert_eq(ctr(p).protocol_errors, 1);

    snprintf(srv.maxmem, sizeof srv.maxmem, "1mb");
    h_start(&srv, "r");
    struct kc_remote *full = open_srv(wkey, 0, "full");
    int rc = 0;
    for (int i = 0; i < 64 && rc == 0; i++) {
        size_t len = 128 << 10;
        char *b = calloc(1, len);
        kc_key k = key_n((uint64_t)i);
        rc = kc_remote_put(full, NS, &k, NULL, KC_KIND_NVRTC, b, len, 0);
        free(b);
    }
    cr_assert_eq(rc, -ENOSPC);
    cr_assert_eq(ctr(full).oom, 1);
}

/* The hit rate counts a lookup once: polls while waiting on another
 * node's lock are polls, and a lookup served after waiting is one hit. */
Test(robust, a_waited_lookup_counts_once)
{
    make_keys();
    h_start(&srv, "r");
    struct kc_remote *w = open_srv(wkey, 0, "writer");
    struct kc_remote *r = open_srv(wkey, 0, "waiter");
    cr_assert_eq(get_rc(r, 1), -ENOENT); /* the lookup: a miss */
    kc_remote_polling(true);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(get_rc(r, 1), -ENOENT); /* polls */
    cr_assert_eq(put_rc(w, 1), 0);
    cr_assert_eq(get_rc(r, 1), 0); /* served */
    kc_remote_polling(false);
    kc_remote_poll_served(r);
    struct kc_remote_counters c = ctr(r);
    cr_assert_eq(c.hits, 1);
    cr_assert_eq(c.misses, 0, "misses %" PRIu64, c.misses);
    cr_assert_eq(c.polls, 5);
}
