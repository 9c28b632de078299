/*
 * tls_bench: what the remote's TLS costs, through kcache's own TLS object
 * (libkcache-remote-tls.so, store/remote/tls_api.h), for scripts/bench
 * section 7f. One process measures, in order:
 *
 *   load_ms         dlopen of the object (and of libssl/libcrypto) and its
 *                   table, as the remote's first rediss:// use does
 *   ctx_ms          the client context, as the remote makes it once per
 *                   process: KCACHE_REMOTE_CA_FILE's PEM when CA is given
 *                   ("-": the system's trust store); the first one also
 *                   initializes OpenSSL
 *   ctx_again_ms    a second context in the same process (OpenSSL
 *                   initialized: the context's own cost)
 *   full_ms         a connection with a full handshake (median of N, each
 *                   on a new context: no session to resume)
 *   resumed_ms      a connection resuming the context's session (median of N)
 *   plain_connect_ms  a plain TCP connection to PLAIN_PORT (median of N)
 *   tls_get_us, plain_get_us  one GET KEY on an established connection,
 *                   TLS and plain alternated in rounds (median of N rounds
 *                   of R gets each, per get); the plain connection speaks
 *                   RESP over the socket as the TLS one does through the
 *                   object, both reading the whole reply
 *
 * Usage: tls_bench OBJECT CA|- HOST TLS_PORT PLAIN_PORT KEY N (TLS_PORT 0: the
 * load and the context alone)
 * Prints one JSON object on stdout; exit 1 with a line on stderr when a
 * step fails. Nothing here asserts on a timing.
 */
#include "../../store/remote/tls_api.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, const char *why)
{
    fprintf(stderr, "tls_bench: %s: %s\n", what, why);
    exit(1);
}

/* Replies: no objects kept (a non-NULL token for each part). */
static char token;
static void *r_string(void *p, void *parent, int idx, int depth, int type, const char *s,
                      size_t len)
{
    (void)p, (void)parent, (void)idx, (void)depth, (void)type, (void)s, (void)len;
    return &token;
}
static void *r_array(void *p, void *parent, int idx, int depth, size_t n)
{
    (void)p, (void)parent, (void)idx, (void)depth, (void)n;
    return &token;
}
static void *r_integer(void *p, void *parent, int idx, int depth, long long v)
{
    (void)p, (void)parent, (void)idx, (void)depth, (void)v;
    return &token;
}
static void *r_nil(void *p, void *parent, int idx, int depth)
{
    (void)p, (void)parent, (void)idx, (void)depth;
    return &token;
}
static void r_free(void *obj)
{
    (void)obj;
}
static const struct kc_tls_reply_fns fns = {r_string, r_array, r_integer, r_nil, r_free};

static const struct kc_tls_api *api;

static void *tls_open(void *ctx, const char *host, int port)
{
    void *conn = NULL;
    char why[240] = "";
    int rc = api->connect(ctx, host, port, 5000, &fns, NULL, &conn, why, sizeof why);
    if (rc != 0)
        die("connect", why[0] ? why : strerror(-rc));
    return conn;
}

static void *ctx_make(const char *pem, size_t len)
{
    struct kc_tls_settings s = {.verify = true, .ca_pem = pem, .ca_len = len};
    void *ctx = NULL;
    char why[240] = "";
    int rc = api->ctx_new(&s, &ctx, why, sizeof why);
    if (rc != 0)
        die("ctx_new", why[0] ? why : strerror(-rc));
    return ctx;
}

/* One GET through the object: written, then read until its reply. */
static size_t tls_get(void *conn, const char *key)
{
    const char *argv[2] = {"GET", key};
    size_t len[2] = {3, strlen(key)};
    if (api->append(conn, 2, argv, len) != 0)
        die("append", "failed");
    int done = 0;
    while (!done) {
        if (api->write(conn, &done) != 0)
            die("write", "failed");
        if (!done) {
            struct pollfd p = {api->fd(conn), POLLOUT, 0};
            poll(&p, 1, 5000);
        }
    }
    size_t total = 0;
    for (;;) {
        void *reply = NULL;
        if (api->get_reply(conn, &reply) != 0)
            die("reply", "protocol error");
        if (reply != NULL)
            return total;
        size_t got = 0;
        if (api->read(conn, &got) != 0)
            die("read", "failed");
        total += got;
        if (got == 0) {
            struct pollfd p = {api->fd(conn), POLLIN, 0};
            poll(&p, 1, 5000);
        }
    }
}

/* The plain side as the remote's plain connections are made: libhiredis
 * 0.14 (by dlopen, as the remote loads it), its reader, its 16 KiB reads. */
static struct {
    void *(*connect)(const char *ip, int port);
    void *(*command)(void *c, const char *fmt, ...);
    void (*free_reply)(void *reply);
    void (*free_ctx)(void *c);
} hi;

static void hiredis_load(void)
{
    void *h = dlopen("libhiredis.so.0.14", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        die("dlopen libhiredis.so.0.14", dlerror());
    *(void **)&hi.connect = dlsym(h, "redisConnect");
    *(void **)&hi.command = dlsym(h, "redisCommand");
    *(void **)&hi.free_reply = dlsym(h, "freeReplyObject");
    *(void **)&hi.free_ctx = dlsym(h, "redisFree");
    if (!hi.connect || !hi.command || !hi.free_reply || !hi.free_ctx)
        die("libhiredis.so.0.14", "a function is missing");
}

/* A GET through hiredis 0.14: the reply's length (a bulk string). */
static size_t hiredis_get(void *c, const char *key)
{
    /* redisReply 0.14: int type; long long integer; size_t len; char *str; */
    struct reply {
        int type;
        long long integer;
        size_t len;
        char *str;
    } *r = hi.command(c, "GET %s", key);
    if (r == NULL)
        die("hiredis GET", "failed");
    size_t n = r->len;
    hi.free_reply(r);
    return n;
}

static int tcp_open(const char *host, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("plain connect", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* One GET over a plain socket: the command written, the bulk reply read
 * whole ($LEN\r\n, LEN bytes, \r\n). */
static size_t plain_get(int fd, const char *key, char *buf, size_t cap)
{
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
    if (write(fd, cmd, (size_t)n) != n)
        die("plain write", strerror(errno));
    size_t have = 0, want = 0;
    for (;;) {
        ssize_t r = read(fd, buf + have, cap - have);
        if (r <= 0)
            die("plain read", r < 0 ? strerror(errno) : "closed");
        have += (size_t)r;
        if (want == 0) {
            char *crlf = memchr(buf, '\n', have);
            if (crlf == NULL)
                continue;
            long v = buf[0] == '$' ? atol(buf + 1) : 0;
            want = (size_t)(crlf + 1 - buf) + (v > 0 ? (size_t)v + 2 : 0);
            if (want > cap)
                die("plain read", "reply too large");
        }
        if (have >= want)
            return have;
    }
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: tls_bench OBJECT CA|- HOST TLS_PORT PLAIN_PORT KEY N\n");
        return 2;
    }
    const char *obj = argv[1], *ca = argv[2], *host = argv[3], *key = argv[6];
    int tport = atoi(argv[4]), pport = atoi(argv[5]), n = atoi(argv[7]);
    if (n < 1)
        n = 1;
    char *pem = NULL;
    size_t pem_len = 0;
    if (strcmp(ca, "-") != 0) {
        FILE *f = fopen(ca, "rb");
        if (f == NULL)
            die(ca, strerror(errno));
        pem = malloc(1 << 20);
        pem_len = fread(pem, 1, (1 << 20) - 1, f);
        fclose(f);
    }

    double t0 = now_ms();
    void *h = dlopen(obj, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        die("dlopen", dlerror());
    api = dlsym(h, KC_TLS_SYMBOL);
    if (api == NULL || api->abi != KC_TLS_ABI)
        die("dlsym", "not this build's TLS object");
    double load_ms = now_ms() - t0;

    t0 = now_ms();
    void *ctx = ctx_make(pem, pem_len);
    double ctx_ms = now_ms() - t0;
    t0 = now_ms();
    void *ctx2 = ctx_make(pem, pem_len);
    double ctx_again_ms = now_ms() - t0;
    api->ctx_free(ctx2);
    if (tport == 0) { /* the load and the context alone */
        printf("{\"load_ms\": %.3f, \"ctx_ms\": %.3f, \"ctx_again_ms\": %.3f, \"version\": "
               "\"%s\"}\n",
               load_ms, ctx_ms, ctx_again_ms, api->version);
        api->ctx_free(ctx);
        free(pem);
        return 0;
    }

    double *full = calloc((size_t)n, sizeof(double)), *res = calloc((size_t)n, sizeof(double));
    double *plain = calloc((size_t)n, sizeof(double));
    double *tg = calloc((size_t)n, sizeof(double)), *pg = calloc((size_t)n, sizeof(double));
    /* The first connection of ctx: a full handshake, its session kept
     * (a TLS 1.3 server sends its tickets after the handshake: a reply
     * read takes them, as the remote's first command does). */
    t0 = now_ms();
    void *first = tls_open(ctx, host, tport);
    double first_ms = now_ms() - t0;
    tls_get(first, key);
    api->close(first);
    for (int i = 0; i < n; i++) {
        void *fresh = ctx_make(pem, pem_len);
        t0 = now_ms();
        void *c = tls_open(fresh, host, tport);
        full[i] = now_ms() - t0;
        if (api->resumed(c))
            die("full handshake", "resumed a session");
        api->close(c);
        api->ctx_free(fresh);
        t0 = now_ms();
        c = tls_open(ctx, host, tport);
        res[i] = now_ms() - t0;
        if (!api->resumed(c))
            die("resumed handshake", "made a new session");
        tls_get(c, key);
        api->close(c);
        t0 = now_ms();
        close(tcp_open(host, pport));
        plain[i] = now_ms() - t0;
    }

    /* GETs on established connections, alternated in rounds. */
    void *tc = tls_open(ctx, host, tport);
    int pfd = tcp_open(host, pport);
    size_t cap = 64u << 20;
    char *buf = malloc(cap);
    size_t tbytes = tls_get(tc, key), pbytes = plain_get(pfd, key, buf, cap);
    hiredis_load();
    void *hc = hi.connect(host, pport);
    if (hc == NULL || *(int *)hc != 0)
        die("hiredis connect", "failed");
    size_t hbytes = hiredis_get(hc, key);
    const int R = 20;
    double *hg = calloc((size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) {
        for (int k3 = 0; k3 < 3; k3++) {
            int side = (k3 + i) % 3; /* the order rotates round to round */
            t0 = now_ms();
            for (int k = 0; k < R; k++) {
                if (side == 0)
                    tls_get(tc, key);
                else if (side == 1)
                    hiredis_get(hc, key);
                else
                    plain_get(pfd, key, buf, cap);
            }
            (side == 0 ? tg : side == 1 ? hg : pg)[i] = (now_ms() - t0) * 1e3 / R;
        }
    }
    hi.free_ctx(hc);
    api->close(tc);
    close(pfd);
    api->ctx_free(ctx);
    printf("{\"load_ms\": %.3f, \"ctx_ms\": %.3f, \"ctx_again_ms\": %.3f, \"first_connect_ms\": "
           "%.3f, \"full_ms\": %.3f, \"resumed_ms\": %.3f, \"plain_connect_ms\": %.3f, "
           "\"tls_get_us\": %.2f, \"plain_get_us\": %.2f, \"raw_get_us\": %.2f, "
           "\"tls_reply_bytes\": %zu, \"plain_reply_bytes\": %zu, \"value_bytes\": %zu, "
           "\"version\": \"%s\"}\n",
           load_ms, ctx_ms, ctx_again_ms, first_ms, median(full, n), median(res, n),
           median(plain, n), median(tg, n), median(hg, n), median(pg, n), tbytes, pbytes, hbytes,
           api->version);
    free(hg);
    free(full);
    free(res);
    free(plain);
    free(tg);
    free(pg);
    free(buf);
    free(pem);
    return 0;
}
