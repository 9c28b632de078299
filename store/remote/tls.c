/*
 * libkcache-remote-tls.so: the remote's connections over TLS (tls_api.h).
 * hiredis 1.2 and hiredis_ssl, linked in statically, over the system's
 * OpenSSL. The TCP connect is hiredis' (bounded by the timeout); the
 * handshake is driven here, non-blocking, against the same deadline, so a
 * server that never answers it costs at most the connect timeout and a
 * refusal says why (a certificate that does not verify, no TLS at all);
 * the established session is then handed to hiredis_ssl
 * (redisInitiateSSL), whose reads and writes the module drives as it
 * drives a plain connection's.
 */
#include "tls_api.h"

#include <hiredis/hiredis.h>
#include <hiredis/hiredis_ssl.h>

#include "conn_wait.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KC__STR_(x) #x
#define KC__STR(x) KC__STR_(x)

struct tls_conn {
    redisContext *c;
    const struct kc_tls_reply_fns *fns;
    void *priv;
    bool resumed;
    bool failed;           /* an I/O failure: its session is not kept */
    SSL *ssl;              /* hiredis_ssl's */
    struct tls_peer *peer; /* the session callback's, until closed */
};

/*
 * A client context, and the last session of each server it reached: a
 * connection is made per operation (the shim keeps none between a host's
 * calls), so the next one to that server resumes the session (TLS 1.3
 * PSK, or a 1.2 ticket) instead of a full handshake: no certificate sent,
 * verified or signed for. A session is kept only from a handshake that
 * verified under this context's settings, for the host name (and port)
 * it was verified for. The caller serializes a context's use (the
 * remote's one lock), so the sessions need none of their own.
 */
#define KC__TLS_SESSIONS 16
struct tls_ctx {
    SSL_CTX *ssl;
    struct {
        char host[256];
        int port;
        SSL_SESSION *sess;
    } kept[KC__TLS_SESSIONS];
    unsigned next; /* the slot a new server takes, round robin */
};

/* What the new-session callback needs of the connection being made. */
struct tls_peer {
    struct tls_ctx *ctx;
    char host[256];
    int port;
};

static int session_slot(struct tls_ctx *x, const char *host, int port)
{
    for (int i = 0; i < KC__TLS_SESSIONS; i++)
        if (x->kept[i].sess != NULL && x->kept[i].port == port &&
            strcmp(x->kept[i].host, host) == 0)
            return i;
    return -1;
}

/* OpenSSL's new-session callback: keeps the session (1: the reference is
 * ours), replacing the server's previous one. */
static int session_new(SSL *ssl, SSL_SESSION *sess)
{
    struct tls_peer *p = SSL_get_app_data(ssl);
    if (p == NULL || !SSL_SESSION_is_resumable(sess))
        return 0;
    struct tls_ctx *x = p->ctx;
    int i = session_slot(x, p->host, p->port);
    if (i < 0)
        i = (int)(x->next++ % KC__TLS_SESSIONS);
    if (x->kept[i].sess != NULL)
        SSL_SESSION_free(x->kept[i].sess);
    snprintf(x->kept[i].host, sizeof x->kept[i].host, "%s", p->host);
    x->kept[i].port = p->port;
    x->kept[i].sess = sess;
    return 1;
}

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
    if (why == NULL || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

/* ---- replies: hiredis 1.2's reader, the caller's objects ---------------- */

static int depth_of(const redisReadTask *t)
{
    int d = 0;
    for (const redisReadTask *p = t->parent; p != NULL; p = p->parent)
        d++;
    return d;
}

static void *parent_of(const redisReadTask *t)
{
    return t->parent != NULL ? t->parent->obj : NULL;
}

static void *r_string(const redisReadTask *t, char *s, size_t len)
{
    struct tls_conn *k = t->privdata;
    if (t->type != REDIS_REPLY_STRING && t->type != REDIS_REPLY_STATUS &&
        t->type != REDIS_REPLY_ERROR)
        return NULL; /* RESP3 only: refused */
    return k->fns->string(k->priv, parent_of(t), t->idx, depth_of(t), t->type, s, len);
}

static void *r_array(const redisReadTask *t, size_t n)
{
    struct tls_conn *k = t->privdata;
    if (t->type != REDIS_REPLY_ARRAY)
        return NULL;
    return k->fns->array(k->priv, parent_of(t), t->idx, depth_of(t), n);
}

static void *r_integer(const redisReadTask *t, long long v)
{
    struct tls_conn *k = t->privdata;
    return k->fns->integer(k->priv, parent_of(t), t->idx, depth_of(t), v);
}

static void *r_nil(const redisReadTask *t)
{
    struct tls_conn *k = t->privdata;
    return k->fns->nil(k->priv, parent_of(t), t->idx, depth_of(t));
}

static void *r_double(const redisReadTask *t, double d, char *s, size_t len)
{
    (void)t, (void)d, (void)s, (void)len;
    return NULL;
}

static void *r_bool(const redisReadTask *t, int b)
{
    (void)t, (void)b;
    return NULL;
}

/* The reader frees a partial reply through this: the caller's free. The
 * functions are per connection (the caller's free is not global). */
static __thread const struct kc_tls_reply_fns *freeing;
static void r_free(void *obj)
{
    if (freeing != NULL)
        freeing->free(obj);
}

static redisReplyObjectFunctions reply_fns = {
    .createString = r_string,
    .createArray = r_array,
    .createInteger = r_integer,
    .createDouble = r_double,
    .createNil = r_nil,
    .createBool = r_bool,
    .freeObject = r_free,
};

/* ---- the client context ------------------------------------------------- */

/* The system's trust store, as the distributions lay it out: Debian,
 * Ubuntu and Alpine; RHEL, Rocky, Fedora; SUSE; then OpenSSL's own
 * default (its OPENSSLDIR). SSL_CERT_FILE / SSL_CERT_DIR, when set, come
 * before all of them (OpenSSL's default paths read them). The packaged
 * object's OpenSSL is its own, linked in (KC_TLS_STATIC_OPENSSL): its
 * OPENSSLDIR (/etc/ssl) is not every distribution's, hence the list. */
static const char *const ca_files[] = {
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/var/lib/ca-certificates/ca-bundle.pem",
    "/etc/ssl/cert.pem",
};

/* The same stores as hashed directories (c_rehash, update-ca-certificates,
 * update-ca-trust): Debian, Ubuntu, Alpine; RHEL 9, Fedora; SUSE. */
static const char *const ca_dirs[] = {
    "/etc/ssl/certs",
    "/etc/pki/ca-trust/extracted/pem/directory-hash",
    "/var/lib/ca-certificates/openssl",
};

/* Whether dir holds OpenSSL's hash links (HHHHHHHH.0). */
static bool hashed_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return false;
    bool yes = false;
    struct dirent *e;
    while (!yes && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        size_t i = 0;
        while (i < 8 && ((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
            i++;
        yes = i == 8 && n[8] == '.' && n[9] >= '0' && n[9] <= '9';
    }
    closedir(d);
    return yes;
}

static int load_pem_cas(SSL_CTX *ctx, const char *pem, size_t len)
{
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    if (b == NULL)
        return -ENOMEM;
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    int n = 0;
    X509 *x;
    while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
        if (X509_STORE_add_cert(st, x) == 1)
            n++;
        X509_free(x);
    }
    ERR_clear_error();
    BIO_free(b);
    return n > 0 ? 0 : -EINVAL;
}

static int load_client_cert(SSL_CTX *ctx, const struct kc_tls_settings *s, char *why, size_t wl)
{
    BIO *b = BIO_new_mem_buf(s->cert_pem, (int)s->cert_len);
    if (b == NULL)
        return -ENOMEM;
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    int rc = 0;
    if (x == NULL || SSL_CTX_use_certificate(ctx, x) != 1) {
        say(why, wl, "KCACHE_REMOTE_CERT_FILE holds no usable PEM certificate");
        rc = -EINVAL;
    }
    X509_free(x);
    /* The rest of the file: its chain. */
    while (rc == 0 && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL)
        if (SSL_CTX_add0_chain_cert(ctx, x) != 1)
            X509_free(x);
    BIO_free(b);
    ERR_clear_error();
    if (rc != 0)
        return rc;
    b = BIO_new_mem_buf(s->key_pem, (int)s->key_len);
    if (b == NULL)
        return -ENOMEM;
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    if (k == NULL || SSL_CTX_use_PrivateKey(ctx, k) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
        say(why, wl,
            "KCACHE_REMOTE_KEY_FILE holds no PEM private key (unencrypted) of the "
            "certificate's");
        rc = -EINVAL;
    }
    EVP_PKEY_free(k);
    ERR_clear_error();
    return rc;
}

static int ctx_new(const struct kc_tls_settings *s, void **out, char *why, size_t wl)
{
#ifdef KC_TLS_STATIC_OPENSSL
    /* The OpenSSL linked in reads no configuration: the system's
     * openssl.cnf (and OPENSSL_CONF) is its own OpenSSL's, whose providers
     * and policies this one may not have. And it registers no atexit
     * handler: one that freed OpenSSL's state while the remote's thread
     * still used it would change how the host exits. The first call to
     * initialise decides; hiredis_ssl's later one changes nothing. */
    if (OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG | OPENSSL_INIT_NO_ATEXIT, NULL) != 1) {
        say(why, wl, "OpenSSL failed to initialise");
        return -EIO;
    }
#endif
    struct tls_ctx *x = calloc(1, sizeof *x);
    if (x == NULL)
        return -ENOMEM;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        free(x);
        return -ENOMEM;
    }
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, session_new);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    int rc = 0;
    if (s->verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (s->ca_pem != NULL) {
            rc = load_pem_cas(ctx, s->ca_pem, s->ca_len);
            if (rc != 0)
                say(why, wl, "KCACHE_REMOTE_CA_FILE holds no PEM certificate");
        } else {
            /* A hashed directory first: certificates read as a chain needs
             * them (the bundle parses every CA up front: 0.1 s a process). */
            const char *ef = getenv("SSL_CERT_FILE"), *ed = getenv("SSL_CERT_DIR");
            bool found = ((ef != NULL && *ef != '\0') || (ed != NULL && *ed != '\0')) &&
                         SSL_CTX_set_default_verify_paths(ctx) == 1;
            for (size_t i = 0; i < sizeof ca_dirs / sizeof *ca_dirs && !found; i++)
                if (hashed_dir(ca_dirs[i]) &&
                    SSL_CTX_load_verify_locations(ctx, NULL, ca_dirs[i]) == 1)
                    found = true;
            for (size_t i = 0; i < sizeof ca_files / sizeof *ca_files && !found; i++)
                if (access(ca_files[i], R_OK) == 0 &&
                    SSL_CTX_load_verify_locations(ctx, ca_files[i], NULL) == 1)
                    found = true;
            if (!found)
                SSL_CTX_set_default_verify_paths(ctx);
            ERR_clear_error();
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    if (rc == 0 && s->cert_pem != NULL) {
        if (s->key_pem == NULL) {
            say(why, wl, "KCACHE_REMOTE_CERT_FILE needs KCACHE_REMOTE_KEY_FILE");
            rc = -EINVAL;
        } else {
            rc = load_client_cert(ctx, s, why, wl);
        }
    }
    if (rc != 0) {
        SSL_CTX_free(ctx);
        free(x);
        return rc;
    }
    x->ssl = ctx;
    *out = x;
    return 0;
}

static void ctx_free(void *ctxp)
{
    struct tls_ctx *x = ctxp;
    if (x == NULL)
        return;
    for (int i = 0; i < KC__TLS_SESSIONS; i++)
        if (x->kept[i].sess != NULL)
            SSL_SESSION_free(x->kept[i].sess);
    SSL_CTX_free(x->ssl);
    free(x);
}

/* ---- connecting --------------------------------------------------------- */

/* A handshake's failure as an errno and a sentence. */
static int handshake_error(SSL *ssl, int sslerr, int saved_errno, char *why, size_t wl)
{
    long v = SSL_get_verify_result(ssl);
    unsigned long e = ERR_peek_last_error();
    int reason = ERR_GET_REASON(e);
    if (sslerr == SSL_ERROR_SSL && v != X509_V_OK) {
        say(why, wl, "its TLS certificate did not verify: %s (KCACHE_REMOTE_CA_FILE names the CA)",
            X509_verify_cert_error_string(v));
        return -EKEYREJECTED;
    }
    if (sslerr == SSL_ERROR_SSL &&
        (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
         reason == SSL_R_HTTP_REQUEST || reason == SSL_R_UNEXPECTED_RECORD)) {
        say(why, wl, "answered no TLS (a plain Redis port on a rediss:// URL?)");
        return -EPROTO;
    }
    if (sslerr == SSL_ERROR_SSL) {
        say(why, wl, "refused the TLS handshake (%s)",
            e != 0 ? ERR_reason_error_string(e) : "no reason given");
        return -EPROTO;
    }
    if (sslerr == SSL_ERROR_ZERO_RETURN || (sslerr == SSL_ERROR_SYSCALL && saved_errno == 0)) {
        say(why, wl, "closed the connection during the TLS handshake");
        return -ECONNRESET;
    }
    say(why, wl, "TLS handshake failed (%s)", strerror(saved_errno ? saved_errno : EIO));
    return saved_errno == ECONNRESET || saved_errno == EPIPE ? -ECONNRESET : -EIO;
}

static bool is_ip(const char *host)
{
    unsigned char a[16];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

static int tls_connect(void *ctxp, const char *host, int port, int timeout_ms,
                       const struct kc_tls_reply_fns *fns, void *priv, void **out, char *why,
                       size_t wl)
{
    struct tls_ctx *x = ctxp;
    SSL_CTX *ctx = x->ssl;
    uint64_t deadline = kc__conn_now_ns() + (uint64_t)timeout_ms * 1000000;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    errno = 0;
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    int e = errno;
    if (c == NULL)
        return -ENOMEM;
    if (c->err != 0) {
        int rc = kc__conn_error(c->err, c->errstr, e);
        say(why, wl, "%s", c->errstr);
        redisFree(c);
        return rc;
    }
    /* Non-blocking from now on: every wait is a poll on the deadline. */
    int fl = fcntl(c->fd, F_GETFL);
    fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
    c->flags &= ~REDIS_BLOCK;

    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL) {
        redisFree(c);
        return -ENOMEM;
    }
    struct tls_conn *k = calloc(1, sizeof *k);
    struct tls_peer *peer = calloc(1, sizeof *peer);
    if (k == NULL || peer == NULL) {
        free(k);
        free(peer);
        SSL_free(ssl);
        redisFree(c);
        return -ENOMEM;
    }
    *peer = (struct tls_peer){.ctx = x, .port = port};
    snprintf(peer->host, sizeof peer->host, "%s", host);
    SSL_set_app_data(ssl, peer);
    int slot = session_slot(x, host, port);
    if (slot >= 0)
        SSL_set_session(ssl, x->kept[slot].sess);
    bool ip = is_ip(host);
    if (!ip)
        SSL_set_tlsext_host_name(ssl, host);
    if (SSL_CTX_get_verify_mode(ctx) & SSL_VERIFY_PEER) {
        if (ip)
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
        else
            SSL_set1_host(ssl, host);
    }
    /* hiredis_ssl takes the session now (its first SSL_connect, which a
     * non-blocking context lets return before the handshake is done; it
     * must not be given one already established: it would start it over),
     * and owns ssl from here; the handshake is driven on below. */
    ERR_clear_error();
    if (redisInitiateSSL(c, ssl) != REDIS_OK) {
        int rc = -EIO;
        if (ERR_peek_last_error() != 0 || SSL_get_verify_result(ssl) != X509_V_OK)
            rc = handshake_error(ssl, SSL_ERROR_SSL, errno, why, wl);
        else
            say(why, wl, "TLS session refused (%s)", c->errstr);
        if (c->privctx == NULL)
            SSL_free(ssl);
        redisFree(c);
        free(k);
        free(peer);
        ERR_clear_error();
        return rc;
    }
    int rc = 0;
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(ssl);
        if (r == 1)
            break;
        int se = SSL_get_error(ssl, r), saved = errno;
        if (se == SSL_ERROR_WANT_READ || se == SSL_ERROR_WANT_WRITE) {
            rc = kc__conn_wait(c->fd, se == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
            if (rc == -ETIMEDOUT) {
                say(why, wl,
                    "no TLS handshake within the connect timeout (a plain Redis port on a "
                    "rediss:// URL, or a slow server?)");
                break;
            }
            if (rc != 0)
                break;
            continue;
        }
        rc = handshake_error(ssl, se, saved, why, wl);
        break;
    }
    ERR_clear_error();
    if (rc != 0) {
        /* A session the failed server offered is not kept: nothing was. */
        SSL_set_app_data(ssl, NULL);
        redisFree(c);
        free(k);
        free(peer);
        return rc;
    }
    k->resumed = SSL_session_reused(ssl) == 1;
    k->ssl = ssl;
    k->peer = peer;
    k->c = c;
    k->fns = fns;
    k->priv = priv;
    c->reader->fn = &reply_fns;
    c->reader->privdata = k;
    *out = k;
    return 0;
}

/* ---- the stream --------------------------------------------------------- */

static int tls_fd(void *conn)
{
    return ((struct tls_conn *)conn)->c->fd;
}

static int tls_append(void *conn, int argc, const char **argv, const size_t *len)
{
    struct tls_conn *k = conn;
    return redisAppendCommandArgv(k->c, argc, argv, len) == REDIS_OK ? 0 : -ENOMEM;
}

/* An I/O failure of the session: the peer's alert when it sent one. */
static int io_error(struct tls_conn *k)
{
    k->failed = true;
    unsigned long e = ERR_peek_last_error();
    int reason = ERR_GET_REASON(e);
    ERR_clear_error();
    if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED ||
        reason == SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE ||
        reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE || reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA ||
        reason == SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED ||
        reason == SSL_R_TLSV1_ALERT_ACCESS_DENIED)
        return -EACCES;
    if (k->c->err == REDIS_ERR_EOF)
        return -ECONNRESET;
    if (errno == ECONNRESET || errno == EPIPE)
        return -ECONNRESET;
    return -EIO;
}

static int tls_write(void *conn, int *done)
{
    struct tls_conn *k = conn;
    ERR_clear_error();
    if (redisBufferWrite(k->c, done) != REDIS_OK)
        return io_error(k);
    return 0;
}

static int tls_read(void *conn, size_t *got)
{
    struct tls_conn *k = conn;
    size_t before = k->c->reader->len;
    ERR_clear_error();
    if (redisBufferRead(k->c) != REDIS_OK)
        return io_error(k);
    *got = k->c->reader->len - before;
    return 0;
}

static int tls_get_reply(void *conn, void **reply)
{
    struct tls_conn *k = conn;
    *reply = NULL;
    freeing = k->fns;
    int r = redisGetReplyFromReader(k->c, reply);
    freeing = NULL;
    return r == REDIS_OK ? 0 : -EPROTO;
}

static size_t tls_buffered(void *conn)
{
    struct tls_conn *k = conn;
    return k->c->reader != NULL ? k->c->reader->len - k->c->reader->pos : 0;
}

static bool tls_resumed(void *conn)
{
    return ((struct tls_conn *)conn)->resumed;
}

static void tls_close(void *conn)
{
    struct tls_conn *k = conn;
    if (k == NULL)
        return;
    /* Closed between operations, the session sound: said so to OpenSSL
     * (no close_notify is sent, nothing is written), which otherwise
     * takes a session freed unshut for a bad one and makes it
     * unresumable, the kept one with it. */
    if (!k->failed && k->ssl != NULL)
        SSL_set_shutdown(k->ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    /* A partial reply the reader holds is the caller's object. */
    freeing = k->fns;
    redisFree(k->c);
    freeing = NULL;
    free(k->peer);
    free(k);
}

__attribute__((visibility("default"))) const struct kc_tls_api kc_remote_tls = {
    .abi = KC_TLS_ABI,
    .version = "hiredis " KC__STR(HIREDIS_MAJOR) "." KC__STR(HIREDIS_MINOR) "." KC__STR(
        HIREDIS_PATCH) ", " OPENSSL_VERSION_TEXT,
    .ctx_new = ctx_new,
    .ctx_free = ctx_free,
    .connect = tls_connect,
    .fd = tls_fd,
    .append = tls_append,
    .write = tls_write,
    .read = tls_read,
    .get_reply = tls_get_reply,
    .buffered = tls_buffered,
    .close = tls_close,
    .resumed = tls_resumed,
};
