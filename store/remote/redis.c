/*
 * Servers and connections of the remote tier: libhiredis 0.14 (dlopen()ed),
 * its sync API driven against a deadline, Redis Cluster routing (CRC16
 * slots, MOVED and ASK) and rendezvous hashing over shards.
 *
 * Bounds: connecting waits at most the connect timeout (hiredis'
 * non-blocking connect and poll; a host name's resolution is the resolver's
 * and not bounded: use addresses or /etc/hosts names). A command, its
 * AUTH/SELECT included on a fresh connection, is written and answered
 * within the operation timeout: every write and read is preceded by a
 * poll() on the remaining time and the socket's timeouts are set to it, so
 * a server that trickles bytes is cut off at the deadline, not per read.
 * Writes never raise SIGPIPE in the host (blocked around the write, a
 * pending one consumed).
 */
#include "remote_internal.h"

#include "conn_wait.h"

#include "../../common/clock.h"
#include "../../common/digest.h"
#include "../../common/log.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- libhiredis --------------------------------------------------------- */

static pthread_once_t hi_once = PTHREAD_ONCE_INIT;
static struct kc__hiredis hi;
static int hi_rc = -ENOSYS;

static void hi_load_once(void)
{
    void *h = kc__remote_dlopen(KC__HIREDIS_SONAME);
    if (h == NULL) {
        kc_log(KC_LOG_WARN, "remote: %s not found (%s); the remote is off", KC__HIREDIS_SONAME,
               dlerror());
        return;
    }
#define RESOLVE(field, sym) hi.field = (__typeof__(hi.field))dlsym(h, sym)
    RESOLVE(connect_tcp, "redisConnectWithTimeout");
    RESOLVE(connect_unix, "redisConnectUnixWithTimeout");
    RESOLVE(set_timeout, "redisSetTimeout");
    RESOLVE(free_ctx, "redisFree");
    RESOLVE(append_argv, "redisAppendCommandArgv");
    RESOLVE(buffer_write, "redisBufferWrite");
    RESOLVE(buffer_read, "redisBufferRead");
    RESOLVE(get_reply, "redisGetReplyFromReader");
#undef RESOLVE
    if (hi.connect_tcp == NULL || hi.connect_unix == NULL || hi.set_timeout == NULL ||
        hi.free_ctx == NULL || hi.append_argv == NULL || hi.buffer_write == NULL ||
        hi.buffer_read == NULL || hi.get_reply == NULL) {
        kc_log(KC_LOG_WARN, "remote: %s lacks the functions kcache needs; the remote is off",
               KC__HIREDIS_SONAME);
        return;
    }
    hi_rc = 0;
}

int kc__hiredis_load(const struct kc__hiredis **out)
{
    pthread_once(&hi_once, hi_load_once);
    if (hi_rc == 0)
        *out = &hi;
    return hi_rc;
}

/* ---- replies, bounded --------------------------------------------------- */

/*
 * The reader's reply objects are made here, not by hiredis: each is
 * counted against its reply's bounds (KC__REPLY_MAX_ELEMENTS objects,
 * rc->reply_cap bytes of strings, KC__REPLY_MAX_DEPTH levels) before
 * anything is allocated, so a header announcing 2^31 elements is refused
 * at its 17th byte (hiredis 0.14's own functions calloc()ed them and
 * walked them to free). The objects are struct redisReply as the headers
 * define it, freed by kc__reply_free only. Refusing is returning NULL:
 * the reader fails the connection ("out of memory"), and the budget says
 * it was a bound.
 */
static void *reply_object(struct kc__reply_budget *b, int depth, int type, size_t cost)
{
    if (b != NULL) {
        if (depth > KC__REPLY_MAX_DEPTH || b->objects >= KC__REPLY_MAX_ELEMENTS ||
            cost > b->bytes_left) {
            b->refused = true;
            return NULL;
        }
        b->objects++;
        b->bytes_left -= cost;
    }
    redisReply *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->type = type;
    return r;
}

static void reply_link(void *parent_obj, int idx, redisReply *r)
{
    redisReply *parent = parent_obj;
    if (parent != NULL && parent->type == REDIS_REPLY_ARRAY && idx >= 0 &&
        (size_t)idx < parent->elements)
        parent->element[idx] = r;
}

/* The builders every connection's reader calls (plain: through the
 * hiredis 0.14 functions below; TLS: through the TLS object's). */
static void *build_string(void *priv, void *parent, int idx, int depth, int type, const char *str,
                          size_t len)
{
    redisReply *r = reply_object(priv, depth, type, len + 1);
    if (r == NULL)
        return NULL;
    r->str = malloc(len + 1);
    if (r->str == NULL) {
        free(r);
        return NULL;
    }
    memcpy(r->str, str, len);
    r->str[len] = '\0';
    r->len = len;
    reply_link(parent, idx, r);
    return r;
}

static void *build_array(void *priv, void *parent, int idx, int depth, size_t n)
{
    struct kc__reply_budget *b = priv;
    if (b != NULL && n > KC__REPLY_MAX_ELEMENTS - b->objects) {
        b->refused = true;
        return NULL;
    }
    redisReply *r = reply_object(b, depth, REDIS_REPLY_ARRAY, n * sizeof(redisReply *));
    if (r == NULL)
        return NULL;
    if (n > 0) {
        r->element = calloc(n, sizeof *r->element);
        if (r->element == NULL) {
            free(r);
            return NULL;
        }
    }
    r->elements = n;
    reply_link(parent, idx, r);
    return r;
}

static void *build_integer(void *priv, void *parent, int idx, int depth, long long v)
{
    redisReply *r = reply_object(priv, depth, REDIS_REPLY_INTEGER, 0);
    if (r == NULL)
        return NULL;
    r->integer = v;
    reply_link(parent, idx, r);
    return r;
}

static void *build_nil(void *priv, void *parent, int idx, int depth)
{
    redisReply *r = reply_object(priv, depth, REDIS_REPLY_NIL, 0);
    if (r != NULL)
        reply_link(parent, idx, r);
    return r;
}

static int task_depth(const redisReadTask *task)
{
    int depth = 0;
    for (const redisReadTask *t = task->parent; t != NULL; t = t->parent)
        depth++;
    return depth;
}

static void *task_parent(const redisReadTask *task)
{
    return task->parent != NULL ? task->parent->obj : NULL;
}

static void *reply_string(const redisReadTask *task, char *str, size_t len)
{
    return build_string(task->privdata, task_parent(task), task->idx, task_depth(task), task->type,
                        str, len);
}

static void *reply_array(const redisReadTask *task, int elements)
{
    return build_array(task->privdata, task_parent(task), task->idx, task_depth(task),
                       elements > 0 ? (size_t)elements : 0);
}

static void *reply_integer(const redisReadTask *task, long long v)
{
    return build_integer(task->privdata, task_parent(task), task->idx, task_depth(task), v);
}

static void *reply_nil(const redisReadTask *task)
{
    return build_nil(task->privdata, task_parent(task), task->idx, task_depth(task));
}

void kc__reply_free(void *p)
{
    redisReply *r = p;
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_ARRAY && r->element != NULL)
        for (size_t i = 0; i < r->elements; i++)
            kc__reply_free(r->element[i]);
    free(r->element);
    free(r->str);
    free(r);
}

static redisReplyObjectFunctions reply_fns = {
    .createString = reply_string,
    .createArray = reply_array,
    .createInteger = reply_integer,
    .createNil = reply_nil,
    .freeObject = kc__reply_free,
};

static const struct kc_tls_reply_fns tls_reply_fns = {
    .string = build_string,
    .array = build_array,
    .integer = build_integer,
    .nil = build_nil,
    .free = kc__reply_free,
};

/* ---- the breaker -------------------------------------------------------- */

bool kc__breaker_closed(const struct kc__rctx *rc)
{
    return rc->open_until_ns == 0 || kc_mono_ns() >= rc->open_until_ns;
}

void kc__breaker_open(struct kc__rctx *rc)
{
    uint64_t ms = rc->retry_ms > 0 ? (uint64_t)rc->retry_ms : 1000;
    for (unsigned i = 0; i < rc->opens && ms < KC__BREAKER_MAX_MS; i++)
        ms *= 2;
    if (ms > KC__BREAKER_MAX_MS)
        ms = KC__BREAKER_MAX_MS;
    rc->open_until_ns = kc_mono_ns() + ms * 1000000;
    rc->opens++;
    rc->soft = 0;
    rc->strangers = 0;
    rc->ctr->breaker_opens++;
}

void kc__breaker_soft(struct kc__rctx *rc)
{
    if (++rc->soft >= KC__SOFT_FAILURES)
        kc__breaker_open(rc);
}

void kc__breaker_ok(struct kc__rctx *rc)
{
    rc->open_until_ns = 0;
    rc->opens = 0;
    rc->soft = 0;
}

/* ---- commands ----------------------------------------------------------- */

void kc__cmd_set(struct kc__cmd *c, int argc, ...)
{
    va_list ap;
    va_start(ap, argc);
    c->argc = argc;
    for (int i = 0; i < argc && i < 8; i++) {
        c->argv[i] = va_arg(ap, const char *);
        c->len[i] = strlen(c->argv[i]);
    }
    va_end(ap);
}

/* ---- one server --------------------------------------------------------- */

static struct timeval tv_of_ns(int64_t ns)
{
    if (ns < 1000)
        ns = 1000;
    return (struct timeval){.tv_sec = ns / 1000000000, .tv_usec = (ns % 1000000000) / 1000};
}

/* Waits until fd is ready for `ev` or the deadline: 0, -ETIMEDOUT, -EIO
 * (conn_wait.h, as the TLS object waits). */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
    return kc__conn_wait(fd, ev, deadline);
}

/* A transport failure of hiredis as a negative errno. */
static int classify(const redisContext *c, int saved_errno)
{
    return kc__conn_error(c->err, c->errstr, saved_errno);
}

/* ---- a connection: plain (hiredis 0.14) or TLS (the TLS object) ------- */

/*
 * One connection's operations, whichever library carries it. A plain
 * connection is blocking, each call bounded by the socket timeouts set to
 * the time left; a TLS connection is non-blocking (every wait is exec_raw's
 * poll). Each returns 0 or a negative errno, the connection unusable after
 * one.
 */
struct kc__conn_ops {
    int (*fd)(void *conn);
    int (*append)(void *conn, int argc, const char **argv, const size_t *len);
    int (*write)(void *conn, uint64_t deadline, int *done);
    int (*read)(void *conn, uint64_t deadline, size_t *got);
    int (*get_reply)(void *conn, void **reply);
    size_t (*buffered)(void *conn);
    void (*close)(void *conn);
};

static int plain_fd(void *conn)
{
    return ((redisContext *)conn)->fd;
}

static int plain_append(void *conn, int argc, const char **argv, const size_t *len)
{
    return hi.append_argv(conn, argc, argv, len) == REDIS_OK ? 0 : -ENOMEM;
}

static int plain_write(void *conn, uint64_t deadline, int *done)
{
    redisContext *c = conn;
    hi.set_timeout(c, tv_of_ns((int64_t)(deadline - kc_mono_ns())));
    errno = 0;
    if (hi.buffer_write(c, done) != REDIS_OK)
        return classify(c, errno);
    return 0;
}

static int plain_read(void *conn, uint64_t deadline, size_t *got)
{
    redisContext *c = conn;
    hi.set_timeout(c, tv_of_ns((int64_t)(deadline - kc_mono_ns())));
    errno = 0;
    if (hi.buffer_read(c) != REDIS_OK)
        return classify(c, errno);
    *got = 1; /* blocking: it read, or failed */
    return 0;
}

static int plain_get_reply(void *conn, void **reply)
{
    return hi.get_reply(conn, reply) == REDIS_OK ? 0 : -EPROTO;
}

static size_t plain_buffered(void *conn)
{
    redisContext *c = conn;
    return c->reader != NULL ? c->reader->len - c->reader->pos : 0;
}

static void plain_close(void *conn)
{
    hi.free_ctx(conn);
}

static const struct kc__conn_ops plain_ops = {
    .fd = plain_fd,
    .append = plain_append,
    .write = plain_write,
    .read = plain_read,
    .get_reply = plain_get_reply,
    .buffered = plain_buffered,
    .close = plain_close,
};

/* The TLS object's table (rc->tls), the rctx the connection belongs to
 * kept nowhere: one TLS object per process. */
static const struct kc_tls_api *tls_api;

static int tls_fd(void *conn)
{
    return tls_api->fd(conn);
}

static int tls_append(void *conn, int argc, const char **argv, const size_t *len)
{
    return tls_api->append(conn, argc, argv, len);
}

static int tls_write(void *conn, uint64_t deadline, int *done)
{
    (void)deadline;
    return tls_api->write(conn, done);
}

static int tls_read(void *conn, uint64_t deadline, size_t *got)
{
    (void)deadline;
    return tls_api->read(conn, got);
}

static int tls_get_reply(void *conn, void **reply)
{
    return tls_api->get_reply(conn, reply);
}

static size_t tls_buffered(void *conn)
{
    return tls_api->buffered(conn);
}

static void tls_close(void *conn)
{
    tls_api->close(conn);
}

static const struct kc__conn_ops tls_ops = {
    .fd = tls_fd,
    .append = tls_append,
    .write = tls_write,
    .read = tls_read,
    .get_reply = tls_get_reply,
    .buffered = tls_buffered,
    .close = tls_close,
};

/* A write with SIGPIPE kept from the host: blocked in this thread around
 * the write; one the write raised is consumed. */
static int write_nosigpipe(const struct kc__conn_ops *ops, void *conn, uint64_t deadline, int *done)
{
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    bool was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    int r = ops->write(conn, deadline, done);
    if (!was_pending) {
        sigemptyset(&pending);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            struct timespec zero = {0, 0};
            while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
                ;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return r;
}

static void free_replies(int n, redisReply **r)
{
    for (int i = 0; i < n; i++) {
        if (r[i] != NULL)
            kc__reply_free(r[i]);
        r[i] = NULL;
    }
}

/* Writes n commands and reads n replies on a connected node, all before
 * deadline. 0 or a negative errno (the connection is then unusable). */
static int exec_raw(struct kc__rctx *rc, struct kc__node *nd, int n, const struct kc__cmd *cmds,
                    redisReply **replies, uint64_t deadline)
{
    const struct kc__conn_ops *ops = nd->ops;
    void *c = nd->conn;
    for (int i = 0; i < n; i++)
        replies[i] = NULL;
    for (int i = 0; i < n; i++)
        if (ops->append(c, cmds[i].argc, (const char **)cmds[i].argv, cmds[i].len) != 0)
            return -ENOMEM;
    int done = 0;
    while (!done) {
        int r = wait_fd(ops->fd(c), POLLOUT, deadline);
        if (r != 0)
            return r;
        r = write_nosigpipe(ops, c, deadline, &done);
        if (r != 0)
            return r;
    }
    for (int i = 0; i < n; i++) {
        void *rep = NULL;
        nd->budget = (struct kc__reply_budget){.bytes_left = rc->reply_cap};
        for (;;) {
            if (ops->get_reply(c, &rep) != 0) {
                free_replies(i, replies);
                return -EPROTO;
            }
            if (rep != NULL)
                break;
            if (ops->buffered(c) > rc->reply_cap) {
                free_replies(i, replies);
                return -EMSGSIZE;
            }
            int r = wait_fd(ops->fd(c), POLLIN, deadline);
            size_t got = 0;
            if (r == 0)
                r = ops->read(c, deadline, &got);
            if (r != 0) {
                free_replies(i, replies);
                return r;
            }
        }
        replies[i] = rep;
    }
    return 0;
}

void kc__node_drop(struct kc__rctx *rc, struct kc__node *nd)
{
    (void)rc;
    if (nd->conn != NULL)
        nd->ops->close(nd->conn);
    nd->conn = NULL;
    nd->proven = false;
}

bool kc__node_ready(struct kc__node *nd)
{
    if (!nd->off)
        return true;
    if (nd->retry_at_ns == 0 || kc_mono_ns() < nd->retry_at_ns)
        return false;
    nd->off = false; /* one more try */
    return true;
}

/* A failure that cost next to nothing: the server refused or reset. */
static bool refused(int err)
{
    return err == -ECONNREFUSED || err == -ECONNRESET || err == -EPIPE;
}

static void node_off(struct kc__rctx *rc, struct kc__node *nd, int err, const char *why)
{
    if (err == -ETIMEDOUT) {
        rc->ctr->timeouts++;
    } else {
        rc->ctr->errors++;
        if (refused(err))
            rc->ctr->refusals++;
        else if (err == -EPROTO || err == -ENOMEM)
            rc->ctr->protocol_errors++;
        else if (err == -EACCES)
            rc->ctr->auth_failures++;
    }
    /* Cluster nodes this process never reached turn the whole remote
     * off (the servers name the nodes: endless new addresses): the second
     * that fails hard since the breaker last opened. The first turns off
     * only its own keys: one primary hung among live ones (its replica
     * not yet promoted) costs its timeout once, and the others keep
     * sharing. One that refused costs next to nothing: a soft failure, and
     * one dead primary among live ones (a failover, a seed that is down)
     * turns off only its own keys. A node counts once, when it first
     * fails: the same hung primary failing again once its backoff ends
     * (it is still stopped) is its own keys' business, its backoff
     * doubling; counted again, it turned every waiting process's remote
     * off and made each compile what the others were compiling (issue 47,
     * finding 1: 9 to 15 compiles for 4 kernels on 4 nodes). */
    bool again = nd->failures > 0 && !nd->answered;
    bool whole =
        rc->cluster && !nd->answered && !refused(err) && !again && ++rc->strangers >= KC__STRANGERS;
    if (whole)
        kc__breaker_open(rc);
    else if (rc->cluster && !nd->answered && !again)
        kc__breaker_soft(rc);
    if (!whole)
        rc->ctr->breaker_opens++;
    nd->off = true;
    /* A refusal cost next to nothing (a reset, no timeout) and is most
     * often a restart: the server is asked again soon, so the machines
     * agree through it again within a restart's downtime rather than
     * each compiling alone for a whole second (issue 47: a restart cost
     * 12 compiles for 4 kernels on 4 nodes). */
    uint64_t first = (uint64_t)rc->retry_ms;
    if (refused(err) && first > KC__REFUSED_FIRST_MS)
        first = KC__REFUSED_FIRST_MS;
    unsigned shift = nd->failures < 10 ? nd->failures : 10;
    uint64_t ms = first << shift;
    if (ms > KC__BREAKER_MAX_MS)
        ms = KC__BREAKER_MAX_MS;
    nd->retry_at_ns = rc->retry_ms > 0 ? kc_mono_ns() + ms * 1000000 : 0;
    nd->failures++;
    if (rc->warned != NULL && !*rc->warned) {
        *rc->warned = true;
        char shown[340];
        kc_remote_endpoint_display(&nd->ep, shown, sizeof shown);
        kc_log(KC_LOG_WARN, "remote: %s: %s (%s); %s off for a while, then tried again", shown, why,
               strerror(-err), whole ? "the remote is" : "it is");
    }
}

void kc__node_fail(struct kc__rctx *rc, struct kc__node *nd, int err, const char *why)
{
    kc__node_drop(rc, nd);
    node_off(rc, nd, err, why);
}

/* One connection attempt of nd within ns: 0 with nd->conn and nd->ops, or
 * a negative errno and, when there is more to say than the errno, why. */
static int connect_once(struct kc__rctx *rc, struct kc__node *nd, int64_t ns, char *why, size_t wl)
{
    if (nd->ep.tls) {
        if (rc->tls == NULL || rc->tls_ctx == NULL)
            return -ENOSYS; /* activate refused the remote already */
        tls_api = rc->tls;
        int ms = (int)((ns + 999999) / 1000000);
        void *conn = NULL;
        int r = rc->tls->connect(rc->tls_ctx, nd->ep.host, nd->ep.port, ms > 0 ? ms : 1,
                                 &tls_reply_fns, &nd->budget, &conn, why, wl);
        if (r != 0)
            return r;
        nd->conn = conn;
        nd->ops = &tls_ops;
        bool resumed = rc->tls->resumed(conn);
        if (resumed)
            rc->ctr->tls_sessions_resumed++;
        else
            rc->ctr->tls_sessions_made++;
        kc_log(KC_LOG_DEBUG, "remote: %s: TLS session %s", nd->addr,
               resumed ? "resumed" : "made (full handshake)");
        return 0;
    }
    struct timeval tv = tv_of_ns(ns);
    errno = 0;
    redisContext *c = nd->ep.transport == KC_REMOTE_UNIX
                          ? rc->hi->connect_unix(nd->ep.path, tv)
                          : rc->hi->connect_tcp(nd->ep.host, nd->ep.port, tv);
    int e = errno;
    if (c == NULL)
        return -ENOMEM;
    if (c->err != 0) {
        int r = classify(c, e);
        rc->hi->free_ctx(c);
        return r;
    }
    if (c->reader != NULL) {
        c->reader->fn = &reply_fns;
        c->reader->privdata = &nd->budget;
    }
    nd->conn = c;
    nd->ops = &plain_ops;
    return 0;
}

/* Connects nd; 0 or a negative errno (nothing counted), why as above. */
static int node_connect(struct kc__rctx *rc, struct kc__node *nd, char *why, size_t wl)
{
    int64_t ns = (int64_t)nd->ep.connect_timeout_ms * 1000000;
    if (rc->deadline_ns != 0) {
        uint64_t now = kc_mono_ns();
        if (now >= rc->deadline_ns)
            return -ETIMEDOUT;
        if ((int64_t)(rc->deadline_ns - now) < ns)
            ns = (int64_t)(rc->deadline_ns - now);
    }
    uint64_t until = kc_mono_ns() + (uint64_t)ns;
    for (;;) {
        why[0] = '\0';
        int r = connect_once(rc, nd, ns, why, wl);
        if (r == 0)
            break;
        /* A server that answered this process before and now refuses is
         * most likely restarting (a connection is made per operation in
         * the shim): it is asked again within the connect timeout before
         * it is turned off. One that never answered is off at once. */
        if (r != -ECONNREFUSED || !nd->answered || kc_mono_ns() + 10000000 >= until)
            return r;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
        ns = (int64_t)(until - kc_mono_ns());
    }
    nd->proven = false;
    rc->ctr->connects++;
    return 0;
}

int kc__node_exec(struct kc__rctx *rc, struct kc__node *nd, int n, const struct kc__cmd *cmds,
                  redisReply **replies)
{
    if (!kc__node_ready(nd))
        return -ENETDOWN;
    /* The operation's time is spent (earlier hops): nothing is tried, and
     * the node is not blamed. */
    if (rc->deadline_ns != 0 && kc_mono_ns() >= rc->deadline_ns)
        return -ETIMEDOUT;
    for (int attempt = 0;; attempt++) {
        bool fresh = nd->conn == NULL;
        if (fresh) {
            char why[200];
            int r = node_connect(rc, nd, why, sizeof why);
            if (r < 0) {
                /* A TLS session refused: its certificate, no TLS, a
                 * handshake cut short. */
                if (nd->ep.tls && (r == -EKEYREJECTED || r == -EPROTO || r == -ECONNRESET ||
                                   (r == -ETIMEDOUT && why[0] != '\0')))
                    rc->ctr->tls_failures++;
                node_off(rc, nd, r,
                         why[0] != '\0'    ? why
                         : r == -ETIMEDOUT ? "connection timed out"
                                           : "cannot connect");
                return r;
            }
        }
        /* A fresh connection authenticates and selects its database in
         * the same round trip as the first command. */
        struct kc__cmd all[10];
        redisReply *reps[10];
        int pre = 0;
        char dbs[16];
        if (fresh && nd->ep.password[0] != '\0') {
            if (nd->ep.user[0] != '\0')
                kc__cmd_set(&all[pre++], 3, "AUTH", nd->ep.user, nd->ep.password);
            else
                kc__cmd_set(&all[pre++], 2, "AUTH", nd->ep.password);
        }
        if (fresh && nd->ep.db != 0) {
            snprintf(dbs, sizeof dbs, "%d", nd->ep.db);
            kc__cmd_set(&all[pre++], 2, "SELECT", dbs);
        }
        if (n + pre > 10)
            return -EINVAL;
        for (int i = 0; i < n; i++)
            all[pre + i] = cmds[i];
        bool was_proven = nd->proven;
        uint64_t deadline = kc_mono_ns() + (uint64_t)nd->ep.operation_timeout_ms * 1000000;
        if (rc->deadline_ns != 0 && rc->deadline_ns < deadline)
            deadline = rc->deadline_ns;
        int r = exec_raw(rc, nd, pre + n, all, reps, deadline);
        if (r == 0) {
            for (int i = 0; i < pre; i++) {
                bool ok = reps[i]->type == REDIS_REPLY_STATUS;
                if (!ok) {
                    /* What the server said of the credentials (WRONGPASS). */
                    const char *auth =
                        reps[i]->type == REDIS_REPLY_ERROR ? kc__auth_why(reps[i]->str) : NULL;
                    char why[200];
                    snprintf(why, sizeof why, "%s",
                             i == 0 && nd->ep.password[0] != '\0'
                                 ? (auth != NULL ? auth : "authentication refused")
                                 : "database selection refused");
                    free_replies(pre + n, reps);
                    kc__node_fail(rc, nd, -EACCES, why);
                    return -EACCES;
                }
            }
            free_replies(pre, reps);
            for (int i = 0; i < n; i++)
                replies[i] = reps[pre + i];
            nd->proven = true;
            nd->answered = true;
            nd->failures = 0;
            return 0;
        }
        kc__node_drop(rc, nd);
        if (r == -EMSGSIZE) {
            /* A value larger than any entry: not served, the connection
             * dropped (its stream is mid-reply), the server kept. */
            rc->ctr->errors++;
            rc->ctr->protocol_errors++;
            kc__breaker_soft(rc);
            return r;
        }
        /* A kept connection the server closed meanwhile (restart, idle
         * timeout): one fresh try. */
        if (attempt == 0 && !fresh && was_proven && r == -ECONNRESET)
            continue;
        /* A server that closes a fresh connection unanswered: most often
         * a transport mismatch, said so. */
        bool unanswered = fresh && !nd->answered && (r == -ECONNRESET || r == -EACCES);
        if (unanswered && nd->ep.tls)
            rc->ctr->tls_failures++;
        node_off(rc, nd, r,
                 unanswered && nd->ep.tls
                     ? "closed the TLS session unanswered (does it want a client certificate? "
                       "KCACHE_REMOTE_CERT_FILE, KCACHE_REMOTE_KEY_FILE)"
                 : unanswered && nd->ep.transport == KC_REMOTE_TCP
                     ? "closed the connection unanswered (restarting? a TLS port? use rediss://)"
                 : r == -ETIMEDOUT ? "no answer within the operation timeout"
                 : r == -EPROTO    ? "answered garbage"
                                   : "connection failed");
        return r;
    }
}

/* ---- routing ------------------------------------------------------------ */

unsigned kc__cluster_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open != NULL) {
        size_t off = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - off);
        if (close != NULL && close > open + 1) {
            key = open + 1;
            len = (size_t)(close - open) - 1;
        }
    }
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)key[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc & (KC__SLOTS - 1);
}

double kc__ln(double x)
{
    /* x = m * 2^e, m in [1, 2); ln m = 2 atanh((m - 1) / (m + 1)). */
    if (!(x > 0))
        return -1e300;
    int e = 0;
    while (x < 1.0) {
        x *= 2.0;
        e--;
    }
    while (x >= 2.0) {
        x *= 0.5;
        e++;
    }
    double z = (x - 1.0) / (x + 1.0), z2 = z * z, term = z, sum = 0;
    for (int k = 1; k < 60; k += 2) {
        sum += term / k;
        term *= z2;
    }
    return 2.0 * sum + e * 0.69314718055994530942;
}

int kc__rendezvous(const struct kc_remote_endpoint *ep, int n, const char *key, size_t len)
{
    int best = 0;
    double best_score = -1;
    char buf[sizeof ep->name + KC_REMOTE_KEY_MAX + 1];
    if (len > KC_REMOTE_KEY_MAX)
        len = KC_REMOTE_KEY_MAX;
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(ep[i].name);
        memcpy(buf, ep[i].name, nl);
        buf[nl] = '\0';
        memcpy(buf + nl + 1, key, len);
        uint64_t h = kc_digest_of(buf, nl + 1 + len).lo;
        double u = ((double)(h >> 11) + 0.5) / 9007199254740992.0; /* (0, 1) */
        double score = ep[i].weight / -kc__ln(u);
        if (score > best_score) {
            best_score = score;
            best = i;
        }
    }
    return best;
}

/* ---- Redis Cluster ------------------------------------------------------ */

static int cluster_index(struct kc__cluster *cl, const struct kc__node *nd)
{
    for (int i = 0; i < cl->n_nodes; i++)
        if (cl->nodes[i] == nd)
            return i;
    return -1;
}

struct kc__node *kc__cluster_node(struct kc__cluster *cl, const char *host, int port,
                                  const struct kc_remote_endpoint *like)
{
    if (host == NULL || host[0] == '\0' || strlen(host) >= sizeof like->host || port <= 0 ||
        port > 65535)
        return NULL;
    for (int i = 0; i < cl->n_nodes; i++) {
        struct kc__node *x = cl->nodes[i];
        if (x->ep.transport == KC_REMOTE_TCP && x->ep.port == port && strcmp(x->ep.host, host) == 0)
            return x;
    }
    if (cl->n_nodes >= 4096)
        return NULL;
    if (cl->n_nodes == cl->cap) {
        int cap = cl->cap ? cl->cap * 2 : 8;
        struct kc__node **t = realloc(cl->nodes, (size_t)cap * sizeof *t);
        if (t == NULL)
            return NULL;
        cl->nodes = t;
        cl->cap = cap;
    }
    struct kc__node *x = calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->ep = *like;
    x->ep.transport = KC_REMOTE_TCP;
    snprintf(x->ep.host, sizeof x->ep.host, "%s", host);
    x->ep.port = port;
    x->ep.db = 0;
    snprintf(x->ep.name, sizeof x->ep.name, "%s:%d/0", host, port);
    snprintf(x->addr, sizeof x->addr, "%s:%d", host, port);
    cl->nodes[cl->n_nodes++] = x;
    return x;
}

/* Applies a CLUSTER SLOTS reply got from `from`. 0 or -EPROTO. */
static int apply_slots(struct kc__cluster *cl, const redisReply *rep, struct kc__node *from)
{
    if (rep->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    uint16_t *map = malloc(KC__SLOTS * sizeof *map);
    if (map == NULL)
        return -ENOMEM;
    for (int i = 0; i < KC__SLOTS; i++)
        map[i] = KC__SLOT_NONE;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->elements < 2)
            goto bad;
        long long lo = e->element[0]->integer, hi_ = e->element[1]->integer;
        const redisReply *m = e->element[2];
        if (lo < 0 || hi_ >= KC__SLOTS || lo > hi_ || m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER)
            goto bad;
        char host[256];
        /* An empty or unknown ("?") address: the node that answered. */
        if (m->element[0]->len == 0 || strcmp(m->element[0]->str, "?") == 0)
            snprintf(host, sizeof host, "%s", from->ep.host);
        else if (m->element[0]->len < sizeof host)
            snprintf(host, sizeof host, "%s", m->element[0]->str);
        else
            goto bad;
        struct kc__node *nd = kc__cluster_node(cl, host, (int)m->element[1]->integer, &from->ep);
        int idx = nd != NULL ? cluster_index(cl, nd) : -1;
        if (idx < 0)
            goto bad;
        for (long long s = lo; s <= hi_; s++)
            map[s] = (uint16_t)idx;
    }
    memcpy(cl->slot, map, KC__SLOTS * sizeof *map);
    free(map);
    cl->loaded = true;
    cl->refresh = false;
    return 0;
bad:
    free(map);
    return -EPROTO;
}

int kc__cluster_refresh(struct kc__rctx *rc, struct kc__cluster *cl, struct kc__node *hint)
{
    if (cl->slot == NULL) {
        cl->slot = malloc(KC__SLOTS * sizeof *cl->slot);
        if (cl->slot == NULL)
            return -ENOMEM;
        for (int i = 0; i < KC__SLOTS; i++)
            cl->slot[i] = KC__SLOT_NONE;
    }
    int last = -ENETDOWN;
    struct kc__cmd cmd;
    kc__cmd_set(&cmd, 2, "CLUSTER", "SLOTS");
    for (int i = -1; i < cl->n_nodes; i++) {
        struct kc__node *nd = i < 0 ? hint : cl->nodes[i];
        if (nd == NULL || (i >= 0 && nd == hint) || !kc__node_ready(nd))
            continue;
        redisReply *rep = NULL;
        int r = kc__node_exec(rc, nd, 1, &cmd, &rep);
        if (r != 0) {
            last = r;
            continue;
        }
        /* Credentials refused: said so, not "garbage". */
        const char *auth = rep->type == REDIS_REPLY_ERROR ? kc__auth_why(rep->str) : NULL;
        r = auth != NULL ? -EACCES : apply_slots(cl, rep, nd);
        if (auth != NULL)
            kc__node_fail(rc, nd, r, auth);
        kc__reply_free(rep);
        if (r == 0)
            return 0;
        if (auth == NULL)
            kc__node_fail(rc, nd, r, "answered CLUSTER SLOTS with something else than a slot map");
        last = r;
    }
    return last;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": 1 with slot, host and port, 0
 * when the error is neither, -EPROTO when it is malformed. */
static int parse_redirect(const redisReply *rep, bool *ask, unsigned *slot, char *host,
                          size_t hostcap, int *port)
{
    const char *s = rep->str;
    if (rep->len > 6 && strncmp(s, "MOVED ", 6) == 0) {
        *ask = false;
        s += 6;
    } else if (rep->len > 4 && strncmp(s, "ASK ", 4) == 0) {
        *ask = true;
        s += 4;
    } else {
        return 0;
    }
    char *end;
    unsigned long sl = strtoul(s, &end, 10);
    if (end == s || *end != ' ' || sl >= KC__SLOTS)
        return -EPROTO;
    s = end + 1;
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= hostcap)
        return -EPROTO;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end != '\0' || p <= 0 || p > 65535)
        return -EPROTO;
    *slot = (unsigned)sl;
    *port = (int)p;
    return 1;
}

int kc__cluster_exec(struct kc__rctx *rc, struct kc__cluster *cl, const char *key, size_t keylen,
                     const struct kc__cmd *cmd, redisReply **reply, struct kc__node **from)
{
    if (!cl->loaded || cl->refresh) {
        int r = kc__cluster_refresh(rc, cl, NULL);
        if (r != 0 && !cl->loaded)
            return r;
    }
    unsigned slot = kc__cluster_slot(key, keylen);
    if (cl->slot[slot] == KC__SLOT_NONE) {
        rc->ctr->errors++;
        return -ENETDOWN; /* no node serves the slot */
    }
    struct kc__node *nd = cl->nodes[cl->slot[slot]];
    struct kc__node *moved_from = NULL; /* the node that last sent MOVED */
    bool asking = false;
    for (int hop = 0; hop <= KC__MAX_REDIRECTS; hop++) {
        struct kc__cmd cmds[2];
        int n = 0;
        if (asking)
            kc__cmd_set(&cmds[n++], 1, "ASKING");
        cmds[n++] = *cmd;
        redisReply *reps[2] = {NULL, NULL};
        int r = kc__node_exec(rc, nd, n, cmds, reps);
        if (r != 0) {
            /* A failover gives the slots of a primary that died to its
             * replica. When the owner refused (a dead process: that cost
             * nothing) or is off (failed earlier), the map is read again
             * now, from another node, and the command sent to the owner
             * it names, if another: the promoted replica is followed
             * within the operation, without a timeout paid. The map of a
             * slot whose owner is off is read at most every
             * KC__STALE_RETRY_MS; after a timeout, at the next operation
             * (this one's time is spent). The failed node is off, so its
             * keys fail fast meanwhile. */
            bool cheap = r == -ECONNREFUSED || r == -ECONNRESET || r == -EPIPE;
            if (r == -ENETDOWN) {
                if (kc_mono_ns() < cl->stale_retry_ns)
                    return r;
                cl->stale_retry_ns = kc_mono_ns() + KC__STALE_RETRY_MS * 1000000ull;
                cheap = true;
            }
            /* Only the owner the map named is followed so (not a node a
             * redirection named), and not once the breaker opened. */
            if (!cheap || hop > 0 || !kc__breaker_closed(rc)) {
                cl->refresh = true;
                return r;
            }
            if (kc__cluster_refresh(rc, cl, NULL) != 0) {
                cl->refresh = true;
                return r;
            }
            struct kc__node *to =
                cl->slot[slot] != KC__SLOT_NONE ? cl->nodes[cl->slot[slot]] : NULL;
            if (to == NULL || to == nd || !kc__node_ready(to))
                return r;
            asking = false;
            nd = to;
            continue;
        }
        if (asking)
            kc__reply_free(reps[0]);
        redisReply *rep = reps[n - 1];
        if (rep->type == REDIS_REPLY_ERROR) {
            bool ask = false;
            unsigned s = 0;
            char host[256];
            int port = 0;
            int pr = parse_redirect(rep, &ask, &s, host, sizeof host, &port);
            if (pr != 0) {
                kc__reply_free(rep);
                if (host[0] == '\0' && pr > 0)
                    snprintf(host, sizeof host, "%s", nd->ep.host);
                struct kc__node *to = pr > 0 ? kc__cluster_node(cl, host, port, &nd->ep) : NULL;
                if (to == NULL) {
                    kc__node_fail(rc, nd, -EPROTO, "sent a malformed redirection");
                    return -EPROTO;
                }
                if (ask) {
                    rc->ctr->asks++;
                    asking = true;
                } else {
                    rc->ctr->moved++;
                    asking = false;
                    /* MOVED back to the node that just sent us here: two
                     * nodes each name the other, as between the SETSLOT
                     * NODE commands of a migration done source first.
                     * Wait for it to end (1, 2, 4, ... ms; 31 in all). */
                    if (to == moved_from) {
                        struct timespec ts = {0, (1L << (hop - 1)) * 1000000L};
                        nanosleep(&ts, NULL);
                    }
                    moved_from = nd;
                    /* The map changed: read it again (from the new owner),
                     * and trust the redirection for this slot meanwhile. */
                    kc__cluster_refresh(rc, cl, to);
                    cl->slot[s] = (uint16_t)cluster_index(cl, to);
                }
                nd = to;
                continue;
            }
        }
        *reply = rep;
        if (from != NULL)
            *from = nd;
        return 0;
    }
    rc->ctr->errors++;
    kc__breaker_soft(rc);
    return -ELOOP;
}

void kc__cluster_free(struct kc__rctx *rc, struct kc__cluster *cl)
{
    for (int i = 0; i < cl->n_nodes; i++) {
        kc__node_drop(rc, cl->nodes[i]);
        memset(cl->nodes[i]->ep.password, 0, sizeof cl->nodes[i]->ep.password);
        free(cl->nodes[i]);
    }
    free(cl->nodes);
    free(cl->slot);
    memset(cl, 0, sizeof *cl);
}
