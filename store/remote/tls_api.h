/*
 * The remote's TLS object, libkcache-remote-tls.so (tls.c): hiredis 1.2
 * with hiredis_ssl, linked in statically, over the system's OpenSSL
 * (libssl.so.3), loaded RTLD_LOCAL by the remote module only when a
 * rediss:// server is first reached. Built -Bsymbolic with a version
 * script exporting one symbol, kc_remote_tls (this table): hiredis' and
 * kcache's names never meet the host's, and OpenSSL's are the system
 * library's, shared with a host that loaded it already.
 *
 * The table speaks kcache's types only (no hiredis or OpenSSL header here):
 * hiredis 1.2's structures differ from 0.14's, which the rest of the module
 * is compiled against. Replies are built by the caller's functions
 * (struct kc_tls_reply_fns), so they are the module's own objects, bounded
 * as the plain connections' are.
 *
 * Every function returns 0 or a negative errno unless it says otherwise;
 * `why` (may be NULL) receives a sentence for a warning on failure.
 */
#ifndef KCACHE_STORE_REMOTE_TLS_API_H
#define KCACHE_STORE_REMOTE_TLS_API_H

#include <stdbool.h>
#include <stddef.h>

#define KC_TLS_ABI 2
#define KC_TLS_SYMBOL "kc_remote_tls"
#define KC_TLS_SONAME "libkcache-remote-tls.so"

/* Reply objects, made by the caller: parent is the array the object goes
 * into (NULL at the top), idx its index there, depth its nesting (0 at the
 * top). NULL refuses it: the reply fails as a protocol error. Only RESP2's
 * types reach them; any other a server sends fails the reply. */
struct kc_tls_reply_fns {
    void *(*string)(void *priv, void *parent, int idx, int depth, int type, const char *s,
                    size_t len);
    void *(*array)(void *priv, void *parent, int idx, int depth, size_t n);
    void *(*integer)(void *priv, void *parent, int idx, int depth, long long v);
    void *(*nil)(void *priv, void *parent, int idx, int depth);
    void (*free)(void *obj);
};

/* What a TLS client context trusts and presents. PEM buffers are the
 * caller's (read by kc_config_read_file under its rules), used only during
 * ctx_new. */
struct kc_tls_settings {
    bool verify;          /* check the server's chain, name and dates */
    const char *ca_pem;   /* trusted CAs (KCACHE_REMOTE_CA_FILE), or NULL: */
    size_t ca_len;        /* the system's trust store */
    const char *cert_pem; /* client certificate chain (mutual TLS), or NULL */
    size_t cert_len;
    const char *key_pem; /* its private key, or NULL */
    size_t key_len;
};

struct kc_tls_api {
    unsigned abi;        /* KC_TLS_ABI */
    const char *version; /* "hiredis 1.2.0, OpenSSL 3.0.x ..." */

    /* A client context: TLS 1.2 or newer, the settings' trust and client
     * certificate; it keeps each server's last session for the next
     * connection to resume. 0 with *ctx; -EINVAL (a PEM that does not parse, a key
     * that does not match the certificate), -ENOMEM. */
    int (*ctx_new)(const struct kc_tls_settings *s, void **ctx, char *why, size_t whylen);
    void (*ctx_free)(void *ctx);

    /* Connects to host:port and completes the TLS handshake, both within
     * timeout_ms: SNI sent for a name, the certificate's name (DNS or IP
     * SAN) checked against host when the context verifies. The connection
     * is non-blocking from then on. 0 with *conn; -ETIMEDOUT,
     * -ECONNREFUSED, -EHOSTUNREACH, -EPROTO (the server speaks no TLS: a
     * plain server?), -EKEYREJECTED (its certificate did not verify),
     * -EACCES (it refused the handshake: a client certificate it wants),
     * -ECONNRESET, -ENOMEM. */
    int (*connect)(void *ctx, const char *host, int port, int timeout_ms,
                   const struct kc_tls_reply_fns *fns, void *priv, void **conn, char *why,
                   size_t whylen);
    int (*fd)(void *conn);
    /* Appends a command to the output buffer. */
    int (*append)(void *conn, int argc, const char **argv, const size_t *len);
    /* Writes what it can of the output buffer without blocking: *done when
     * it is all written. -ECONNRESET, -EIO. */
    int (*write)(void *conn, int *done);
    /* Reads what it can without blocking into the reply reader: *got bytes
     * (0: nothing yet). -ECONNRESET (closed), -EIO. */
    int (*read)(void *conn, size_t *got);
    /* The next whole reply, or NULL in *reply when none yet. -EPROTO. */
    int (*get_reply)(void *conn, void **reply);
    /* Bytes read and not yet consumed by replies. */
    size_t (*buffered)(void *conn);
    void (*close)(void *conn);
    /* Whether the connection resumed a session of the context's (the
     * last one each server gave: an abbreviated handshake, no certificate
     * exchanged) rather than making a new one. */
    bool (*resumed)(void *conn);
};

#endif
