/*
 * The remote tier's configuration: KCACHE_REMOTE (ccache's URL syntax) and
 * the KCACHE_REMOTE_TTL, _MAX_ENTRY, _SIGNING_KEY, _TRUSTED_KEYS and _TRUST variables. libc only.
 * See remote.h.
 */
#include "remote.h"

#include "../../common/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void kc_remote_settings_from_config(const struct kc_config *cfg, struct kc_remote_settings *s)
{
    s->remote = cfg->remote;
    s->ttl = cfg->remote_ttl;
    s->max_entry = cfg->remote_max_entry;
    s->signing_key = cfg->remote_signing_key;
    s->trusted_keys = cfg->remote_trusted_keys;
    s->trust = cfg->remote_trust;
    s->password_file = cfg->remote_password_file;
    s->ca_file = cfg->remote_ca_file;
    s->cert_file = cfg->remote_cert_file;
    s->key_file = cfg->remote_key_file;
    s->tls_verify = cfg->remote_tls_verify;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static void warn(struct kc_remote_config *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void warn(struct kc_remote_config *c, const char *fmt, ...)
{
    if (c->n_warnings >= (int)(sizeof c->warnings / sizeof c->warnings[0]))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->warnings[c->n_warnings++], sizeof c->warnings[0], fmt, ap);
    va_end(ap);
}

/* Parses decimal digits [s, s + n) into *out, at most max. 0 or -1. */
static int parse_uint(const char *s, size_t n, long max, long *out)
{
    if (n == 0 || n > 10)
        return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Copies [s, s + n) into out (cap bytes) decoding %XX. 0, or -1 on a bad
 * escape, a %00, or no room. */
static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0))
                return -1;
            c = h * 16 + l;
            i += 2;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* The user info before the last '@' of an authority: [[USER:]PASSWORD];
 * with a password file (user_only), a bare name is the USER. */
static int parse_userinfo(const char *s, size_t n, struct kc_remote_endpoint *e, bool user_only)
{
    const char *colon = memchr(s, ':', n);
    if (colon != NULL) {
        if (pct_decode(s, (size_t)(colon - s), e->user, sizeof e->user) != 0)
            return -1;
        return pct_decode(colon + 1, n - (size_t)(colon - s) - 1, e->password, sizeof e->password);
    }
    if (user_only) {
        e->password[0] = '\0';
        return pct_decode(s, n, e->user, sizeof e->user);
    }
    e->user[0] = '\0';
    return pct_decode(s, n, e->password, sizeof e->password);
}

static bool host_char_ok(int c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_';
}

/* HOST[:PORT] in [s, s + n): a name, an IPv4 address or [IPv6]. */
static int parse_hostport(const char *s, size_t n, char *host, size_t hostcap, int *port)
{
    size_t i = 0, hlen;
    const char *h;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (close == NULL)
            return -1;
        h = s + 1;
        hlen = (size_t)(close - s) - 1;
        for (size_t k = 0; k < hlen; k++)
            if (!isxdigit((unsigned char)h[k]) && h[k] != ':' && h[k] != '.')
                return -1;
        i = (size_t)(close - s) + 1;
    } else {
        while (i < n && s[i] != ':')
            i++;
        h = s;
        hlen = i;
        for (size_t k = 0; k < hlen; k++)
            if (!host_char_ok((unsigned char)h[k]))
                return -1;
    }
    if (hlen == 0 || hlen + 1 > hostcap)
        return -1;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = 6379;
    if (i < n) {
        if (s[i] != ':')
            return -1;
        long p;
        if (parse_uint(s + i + 1, n - i - 1, 65535, &p) != 0 || p == 0)
            return -1;
        *port = (int)p;
    }
    return 0;
}

static void endpoint_defaults(struct kc_remote_endpoint *e)
{
    memset(e, 0, sizeof *e);
    e->connect_timeout_ms = KC_REMOTE_DEFAULT_CONNECT_MS;
    e->operation_timeout_ms = KC_REMOTE_DEFAULT_OPERATION_MS;
    e->weight = 1.0;
}

/* The name rendezvous hashing hashes: where the server is, no secrets. */
static void endpoint_name(struct kc_remote_endpoint *e)
{
    if (e->transport == KC_REMOTE_UNIX)
        snprintf(e->name, sizeof e->name, "unix:%s/%d", e->path, e->db);
    else
        snprintf(e->name, sizeof e->name, "%s:%d/%d", e->host, e->port, e->db);
}

struct attrs {
    bool read_only;
    int connect_ms, operation_ms;
    const char *shards; /* into the spec, shards_len bytes */
    size_t shards_len;
};

/* The attributes after the URL: |ATTR|ATTR... in [s, s + n). */
static int parse_attrs(const char *s, size_t n, struct attrs *a, char *err, size_t errlen)
{
    a->read_only = false;
    a->connect_ms = KC_REMOTE_DEFAULT_CONNECT_MS;
    a->operation_ms = KC_REMOTE_DEFAULT_OPERATION_MS;
    a->shards = NULL;
    a->shards_len = 0;
    size_t i = 0;
    while (i < n) {
        /* s[i] is '|' */
        size_t j = i + 1;
        while (j < n && s[j] != '|')
            j++;
        const char *at = s + i + 1;
        size_t alen = j - i - 1;
        const char *eq = memchr(at, '=', alen);
        size_t klen = eq != NULL ? (size_t)(eq - at) : alen;
        const char *v = eq != NULL ? eq + 1 : NULL;
        size_t vlen = eq != NULL ? alen - klen - 1 : 0;
        long ms;
        if (klen == 9 && strncmp(at, "read-only", 9) == 0 && v == NULL) {
            a->read_only = true;
        } else if (klen == 15 && strncmp(at, "connect-timeout", 15) == 0 && v != NULL) {
            if (parse_uint(v, vlen, 60000, &ms) != 0 || ms == 0) {
                set_err(err, errlen, "connect-timeout=%.*s is not 1..60000 ms", (int)vlen, v);
                return -1;
            }
            a->connect_ms = (int)ms;
        } else if (klen == 17 && strncmp(at, "operation-timeout", 17) == 0 && v != NULL) {
            if (parse_uint(v, vlen, 60000, &ms) != 0 || ms == 0) {
                set_err(err, errlen, "operation-timeout=%.*s is not 1..60000 ms", (int)vlen, v);
                return -1;
            }
            a->operation_ms = (int)ms;
        } else if (klen == 6 && strncmp(at, "shards", 6) == 0 && v != NULL && vlen > 0) {
            a->shards = v;
            a->shards_len = vlen;
        } else {
            set_err(err, errlen, "unknown attribute '|%.*s'", (int)(alen > 40 ? 40 : alen), at);
            return -1;
        }
        i = j;
    }
    return 0;
}

/* One URL (shard names already substituted) in [s, s + n) into e; for a
 * cluster, every seed is appended to cfg instead. */
static int parse_url(const char *s, size_t n, struct kc_remote_endpoint *e, int *mode,
                     struct kc_remote_config *cfg, const struct attrs *a, char *err, size_t errlen)
{
    static const char tcp[] = "redis://", tls[] = "rediss://",
                      unx[] = "redis+unix:", clu[] = "redis-cluster://",
                      clus[] = "rediss-cluster://";
    bool user_only = cfg->password_file[0] != '\0';
    bool is_tls = n >= sizeof tls - 1 && strncmp(s, tls, sizeof tls - 1) == 0;
    if (is_tls || (n >= sizeof tcp - 1 && strncmp(s, tcp, sizeof tcp - 1) == 0)) {
        *mode = KC_REMOTE_SERVERS;
        e->transport = KC_REMOTE_TCP;
        e->tls = is_tls;
        const char *p = s + (is_tls ? sizeof tls : sizeof tcp) - 1, *end = s + n;
        const char *at = NULL;
        for (const char *q = p; q < end; q++)
            if (*q == '@')
                at = q;
        if (at != NULL) {
            if (parse_userinfo(p, (size_t)(at - p), e, user_only) != 0) {
                set_err(err, errlen, "bad user or password (use %%XX escapes)");
                return -1;
            }
            p = at + 1;
        }
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *hp_end = slash != NULL ? slash : end;
        if (parse_hostport(p, (size_t)(hp_end - p), e->host, sizeof e->host, &e->port) != 0) {
            set_err(err, errlen, "bad host or port");
            return -1;
        }
        if (slash != NULL && slash + 1 < end) {
            long db;
            if (parse_uint(slash + 1, (size_t)(end - slash - 1), 1000000, &db) != 0) {
                set_err(err, errlen, "bad database number '%.*s'", (int)(end - slash - 1),
                        slash + 1);
                return -1;
            }
            e->db = (int)db;
        }
        return 0;
    }
    if (n >= sizeof unx - 1 && strncmp(s, unx, sizeof unx - 1) == 0) {
        *mode = KC_REMOTE_SERVERS;
        e->transport = KC_REMOTE_UNIX;
        const char *p = s + sizeof unx - 1, *end = s + n;
        if (end - p >= 3 && p[0] == '/' && p[1] == '/' && p[2] == '/')
            p += 2; /* redis+unix:///path */
        const char *q = memchr(p, '?', (size_t)(end - p));
        const char *pend = q != NULL ? q : end;
        size_t plen = (size_t)(pend - p);
        if (plen < 2 || p[0] != '/' || plen >= sizeof e->path || memchr(p, '\0', plen)) {
            set_err(err, errlen, "the socket path must be absolute and under %zu bytes",
                    sizeof e->path);
            return -1;
        }
        memcpy(e->path, p, plen);
        e->path[plen] = '\0';
        if (q != NULL) {
            long db;
            if ((size_t)(end - q) < 5 || strncmp(q, "?db=", 4) != 0 ||
                parse_uint(q + 4, (size_t)(end - q - 4), 1000000, &db) != 0) {
                set_err(err, errlen, "bad socket query '%.*s' (only ?db=N)",
                        (int)(end - q > 40 ? 40 : end - q), q);
                return -1;
            }
            e->db = (int)db;
        }
        return 0;
    }
    bool clu_tls = n >= sizeof clus - 1 && strncmp(s, clus, sizeof clus - 1) == 0;
    if (clu_tls || (n >= sizeof clu - 1 && strncmp(s, clu, sizeof clu - 1) == 0)) {
        *mode = KC_REMOTE_CLUSTER;
        const char *p = s + (clu_tls ? sizeof clus : sizeof clu) - 1, *end = s + n;
        const char *at = NULL;
        for (const char *q = p; q < end; q++)
            if (*q == '@')
                at = q;
        struct kc_remote_endpoint proto;
        endpoint_defaults(&proto);
        /* Every node, seeds and those the slot map names, over TLS. */
        proto.tls = clu_tls;
        if (at != NULL && memchr(p, ',', (size_t)(at - p)) != NULL) {
            set_err(err, errlen,
                    "a ',' before the '@': credentials are given once, before the first seed "
                    "(redis-cluster://[[USER:]PASSWORD@]HOST[:PORT],HOST[:PORT]...; a ',' in "
                    "a password is %%2C)");
            return -1;
        }
        if (at != NULL) {
            if (parse_userinfo(p, (size_t)(at - p), &proto, user_only) != 0) {
                set_err(err, errlen, "bad user or password (use %%XX escapes)");
                return -1;
            }
            p = at + 1;
        }
        if (p == end) {
            set_err(err, errlen, "no seed node");
            return -1;
        }
        while (p <= end) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *seg_end = comma != NULL ? comma : end;
            if (cfg->n >= KC_REMOTE_MAX_ENDPOINTS) {
                set_err(err, errlen, "more than %d servers", KC_REMOTE_MAX_ENDPOINTS);
                return -1;
            }
            struct kc_remote_endpoint *x = &cfg->ep[cfg->n];
            *x = proto;
            x->transport = KC_REMOTE_TCP;
            x->read_only = a->read_only;
            x->connect_timeout_ms = a->connect_ms;
            x->operation_timeout_ms = a->operation_ms;
            if (parse_hostport(p, (size_t)(seg_end - p), x->host, sizeof x->host, &x->port) != 0) {
                set_err(err, errlen, "bad seed node '%.*s' (HOST[:PORT], no database)",
                        (int)(seg_end - p > 60 ? 60 : seg_end - p), p);
                return -1;
            }
            endpoint_name(x);
            cfg->n++;
            if (comma == NULL)
                break;
            p = comma + 1;
        }
        return 1; /* appended */
    }
    set_err(err, errlen,
            "unknown scheme (redis://, rediss://, redis+unix:, redis-cluster://, "
            "rediss-cluster://)");
    return -1;
}

/* One white-space separated URL with its attributes, in [s, s + n). */
static int parse_spec(const char *s, size_t n, struct kc_remote_config *cfg, char *err,
                      size_t errlen)
{
    const char *bar = memchr(s, '|', n);
    size_t ulen = bar != NULL ? (size_t)(bar - s) : n;
    struct attrs a;
    if (parse_attrs(s + ulen, n - ulen, &a, err, errlen) != 0)
        return -1;
    const char *star = memchr(s, '*', ulen);
    if (star != NULL && memchr(star + 1, '*', ulen - (size_t)(star - s) - 1) != NULL) {
        set_err(err, errlen, "more than one '*' in a URL");
        return -1;
    }
    if ((star != NULL) != (a.shards != NULL)) {
        set_err(err, errlen,
                a.shards != NULL ? "shards= needs a '*' in the URL"
                                 : "a '*' in the URL needs shards=");
        return -1;
    }
    /* The shards: NAME[(WEIGHT)] separated by commas; no shards: one. */
    const char *sp = a.shards, *send = a.shards + a.shards_len;
    for (;;) {
        char url[1024];
        double weight = 1.0;
        if (a.shards != NULL) {
            const char *comma = memchr(sp, ',', (size_t)(send - sp));
            const char *item_end = comma != NULL ? comma : send;
            const char *paren = memchr(sp, '(', (size_t)(item_end - sp));
            const char *name_end = paren != NULL ? paren : item_end;
            if (name_end == sp) {
                set_err(err, errlen, "an empty shard name");
                return -1;
            }
            for (const char *q = sp; q < name_end; q++)
                if (!host_char_ok((unsigned char)*q)) {
                    set_err(err, errlen, "bad shard name '%.*s'", (int)(name_end - sp), sp);
                    return -1;
                }
            if (paren != NULL) {
                char wbuf[32];
                size_t wlen = (size_t)(item_end - paren);
                if (wlen < 3 || wlen >= sizeof wbuf || item_end[-1] != ')') {
                    set_err(err, errlen, "bad shard weight '%.*s'", (int)(item_end - sp), sp);
                    return -1;
                }
                memcpy(wbuf, paren + 1, wlen - 2);
                wbuf[wlen - 2] = '\0';
                char *wend;
                errno = 0;
                weight = strtod(wbuf, &wend);
                if (*wend != '\0' || errno != 0 || !(weight > 0) || weight > 1e6) {
                    set_err(err, errlen, "bad shard weight '%s'", wbuf);
                    return -1;
                }
            }
            int len =
                snprintf(url, sizeof url, "%.*s%.*s%.*s", (int)(star - s), s, (int)(name_end - sp),
                         sp, (int)(ulen - (size_t)(star - s) - 1), star + 1);
            if (len < 0 || (size_t)len >= sizeof url) {
                set_err(err, errlen, "a URL over %zu bytes", sizeof url - 1);
                return -1;
            }
            sp = comma != NULL ? comma + 1 : send;
        } else {
            if (ulen >= sizeof url) {
                set_err(err, errlen, "a URL over %zu bytes", sizeof url - 1);
                return -1;
            }
            memcpy(url, s, ulen);
            url[ulen] = '\0';
        }

        int mode = 0;
        if (cfg->n >= KC_REMOTE_MAX_ENDPOINTS) {
            set_err(err, errlen, "more than %d servers", KC_REMOTE_MAX_ENDPOINTS);
            return -1;
        }
        struct kc_remote_endpoint *e = &cfg->ep[cfg->n];
        endpoint_defaults(e);
        int before = cfg->n;
        int rc = parse_url(url, strlen(url), e, &mode, cfg, &a, err, errlen);
        if (rc < 0)
            return -1;
        if (cfg->mode != KC_REMOTE_NONE && (cfg->mode != mode || mode == KC_REMOTE_CLUSTER)) {
            set_err(err, errlen, "redis-cluster:// (rediss-cluster://) must be the only URL");
            return -1;
        }
        if (mode == KC_REMOTE_CLUSTER && a.shards != NULL) {
            set_err(err, errlen, "redis-cluster:// (rediss-cluster://) takes no shards");
            return -1;
        }
        cfg->mode = mode;
        if (rc == 0) {
            e->read_only = a.read_only;
            e->connect_timeout_ms = a.connect_ms;
            e->operation_timeout_ms = a.operation_ms;
            e->weight = weight;
            endpoint_name(e);
            cfg->n++;
        }
        for (int i = before; i < cfg->n; i++)
            for (int j = 0; j < i; j++)
                if (strcmp(cfg->ep[i].name, cfg->ep[j].name) == 0) {
                    set_err(err, errlen, "server %s is named twice", cfg->ep[i].name);
                    return -1;
                }
        if (a.shards == NULL || sp >= send)
            break;
    }
    return 0;
}

static void parse_others(const struct kc_remote_settings *s, struct kc_remote_config *c)
{
    c->ttl_s = 0;
    if (s->ttl != NULL && s->ttl[0] != '\0') {
        long v;
        if (parse_uint(s->ttl, strlen(s->ttl), 0x7fffffff, &v) != 0)
            warn(c, "KCACHE_REMOTE_TTL=%.60s is not a number of seconds; entries do not expire",
                 s->ttl);
        else
            c->ttl_s = (uint64_t)v;
    }
    c->max_entry = KC_REMOTE_DEFAULT_MAX_ENTRY;
    if (s->max_entry != NULL && s->max_entry[0] != '\0') {
        uint64_t v;
        if (kc_parse_size(s->max_entry, &v) != 0 || v == 0) {
            warn(c, "KCACHE_REMOTE_MAX_ENTRY=%.60s is not a size (like 64M); using 64M",
                 s->max_entry);
        } else if (v > KC_REMOTE_MAX_MAX_ENTRY) {
            warn(c, "KCACHE_REMOTE_MAX_ENTRY=%.60s is past Redis' 512M limit; using 512M",
                 s->max_entry);
            c->max_entry = KC_REMOTE_MAX_MAX_ENTRY;
        } else {
            c->max_entry = v;
        }
    }
    const struct {
        const char *name, *v;
        char *dst;
    } paths[] = {
        {"KCACHE_REMOTE_SIGNING_KEY", s->signing_key, c->signing_key},
        {"KCACHE_REMOTE_TRUSTED_KEYS", s->trusted_keys, c->trusted_keys},
        {"KCACHE_REMOTE_PASSWORD_FILE", s->password_file, c->password_file},
        {"KCACHE_REMOTE_CA_FILE", s->ca_file, c->ca_file},
        {"KCACHE_REMOTE_CERT_FILE", s->cert_file, c->cert_file},
        {"KCACHE_REMOTE_KEY_FILE", s->key_file, c->key_file},
    };
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        paths[i].dst[0] = '\0';
        const char *v = paths[i].v;
        if (v == NULL || v[0] == '\0')
            continue;
        if (v[0] != '/' || strlen(v) >= sizeof c->signing_key)
            warn(c, "%s=%.60s is not an absolute path; ignored", paths[i].name, v);
        else
            snprintf(paths[i].dst, sizeof c->signing_key, "%s", v);
    }
    c->tls_verify = true;
    if (s->tls_verify != NULL && s->tls_verify[0] != '\0' &&
        kc_parse_bool(s->tls_verify, &c->tls_verify) != 0) {
        warn(c, "KCACHE_REMOTE_TLS_VERIFY=%.60s is not a boolean; certificates are verified",
             s->tls_verify);
        c->tls_verify = true;
    }
    c->trust_any = false;
    if (s->trust != NULL && s->trust[0] != '\0') {
        if (strcasecmp(s->trust, "any") == 0)
            c->trust_any = true;
        else if (strcasecmp(s->trust, "signed") != 0)
            warn(c, "KCACHE_REMOTE_TRUST=%.60s is not 'signed' or 'any'; using signed", s->trust);
    }
}

int kc_remote_config_parse(const struct kc_remote_settings *s, struct kc_remote_config *out,
                           char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    parse_others(s, out);
    const char *r = s->remote;
    if (r == NULL)
        return 0;
    const char *p = r;
    while (*p != '\0' && isspace((unsigned char)*p))
        p++;
    if (*p == '\0')
        return 0;
    /* A '|', space or tab in credentials would cut the URL there (and
     * show the rest as an attribute or another URL): refused, saying how
     * to write them, the value shown with its passwords redacted. */
    for (const char *v = p;;) {
        const char *u, *sep, *at, *end;
        if (kc_config_url_creds(v, &u, &sep, &at, &end) == 0)
            break;
        for (const char *q = sep; at != NULL && q < at; q++)
            if (*q == '|' || isspace((unsigned char)*q)) {
                char shown[300];
                kc_remote_redact(r, shown, sizeof shown);
                set_err(err, errlen,
                        "KCACHE_REMOTE: '%s': a '|', space or tab in a user or password: write "
                        "them %%7C, %%20, %%09 (or keep the password in "
                        "KCACHE_REMOTE_PASSWORD_FILE)",
                        shown);
                return -EINVAL;
            }
        v = end;
    }
    out->ep = calloc(KC_REMOTE_MAX_ENDPOINTS, sizeof *out->ep);
    if (out->ep == NULL)
        return -ENOMEM;
    while (*p != '\0') {
        const char *q = p;
        while (*q != '\0' && !isspace((unsigned char)*q))
            q++;
        char why[200] = "";
        if (parse_spec(p, (size_t)(q - p), out, why, sizeof why) != 0) {
            /* Name the URL without its password. */
            char shown[300], tok[1024];
            snprintf(tok, sizeof tok, "%.*s", (int)(q - p), p);
            kc_remote_redact(tok, shown, sizeof shown);
            set_err(err, errlen, "KCACHE_REMOTE: '%s': %s", shown, why);
            out->mode = KC_REMOTE_NONE;
            out->n = 0;
            return -EINVAL;
        }
        p = q;
        while (*p != '\0' && isspace((unsigned char)*p))
            p++;
    }
    return 0;
}

void kc_remote_config_free(struct kc_remote_config *c)
{
    if (c == NULL)
        return;
    if (c->ep != NULL) {
        /* Passwords do not outlive the configuration. */
        memset(c->ep, 0, sizeof *c->ep * KC_REMOTE_MAX_ENDPOINTS);
        free(c->ep);
    }
    c->ep = NULL;
    c->n = 0;
    c->mode = KC_REMOTE_NONE;
}

int kc_remote_config_copy(struct kc_remote_config *dst, const struct kc_remote_config *src)
{
    *dst = *src;
    dst->ep = NULL;
    if (src->ep == NULL)
        return 0;
    dst->ep = calloc(KC_REMOTE_MAX_ENDPOINTS, sizeof *dst->ep);
    if (dst->ep == NULL)
        return -ENOMEM;
    memcpy(dst->ep, src->ep, sizeof *src->ep * (size_t)src->n);
    return 0;
}

int kc_remote_redact(const char *remote, char *out, size_t len)
{
    return kc_config_redact_url(remote, out, len);
}

void kc_remote_endpoint_display(const struct kc_remote_endpoint *e, char *out, size_t len)
{
    if (e->transport == KC_REMOTE_UNIX) {
        if (e->db != 0)
            snprintf(out, len, "redis+unix:%s?db=%d", e->path, e->db);
        else
            snprintf(out, len, "redis+unix:%s", e->path);
        return;
    }
    char auth[300] = "";
    if (e->password[0] != '\0')
        snprintf(auth, sizeof auth, "%s:********@", e->user);
    bool v6 = strchr(e->host, ':') != NULL;
    char db[16] = "";
    if (e->db != 0)
        snprintf(db, sizeof db, "/%d", e->db);
    if (e->password[0] == '\0' && e->user[0] != '\0')
        snprintf(auth, sizeof auth, "%s@", e->user);
    snprintf(out, len, "%s://%s%s%s%s:%d%s", e->tls ? "rediss" : "redis", auth, v6 ? "[" : "",
             e->host, v6 ? "]" : "", e->port, db);
}

/* ---- the upload descriptor ------------------------------------------------ */

/* Its lines, in this order; a value holds no newline. */
static const char *const desc_names[] = {
    "KCACHE_REMOTE",
    "KCACHE_REMOTE_TTL",
    "KCACHE_REMOTE_MAX_ENTRY",
    "KCACHE_REMOTE_SIGNING_KEY",
    "KCACHE_REMOTE_TRUSTED_KEYS",
    "KCACHE_REMOTE_TRUST",
    "KCACHE_REMOTE_PASSWORD_FILE",
    "KCACHE_REMOTE_CA_FILE",
    "KCACHE_REMOTE_CERT_FILE",
    "KCACHE_REMOTE_KEY_FILE",
    "KCACHE_REMOTE_TLS_VERIFY",
};
#define DESC_N (sizeof desc_names / sizeof *desc_names)

static const char **desc_field(struct kc_remote_settings *s, size_t i)
{
    const char **f[DESC_N] = {&s->remote,       &s->ttl,      &s->max_entry,     &s->signing_key,
                              &s->trusted_keys, &s->trust,    &s->password_file, &s->ca_file,
                              &s->cert_file,    &s->key_file, &s->tls_verify};
    return f[i];
}

size_t kc_remote_upload_descriptor(const struct kc_remote_settings *s, char *out, size_t len)
{
    struct kc_remote_config c;
    int rc = kc_remote_config_parse(s, &c, NULL, 0);
    bool uploads = rc == 0 && c.mode != KC_REMOTE_NONE && c.signing_key[0] != '\0';
    kc_remote_config_free(&c);
    if (!uploads)
        return 0;
    struct kc_remote_settings v = *s;
    size_t o = 0;
    for (size_t i = 0; i < DESC_N; i++) {
        const char *val = *desc_field(&v, i);
        if (val == NULL || val[0] == '\0')
            continue;
        if (strchr(val, '\n') != NULL)
            return 0;
        int n = snprintf(out + o, o < len ? len - o : 0, "%s=%s\n", desc_names[i], val);
        if (n < 0 || o + (size_t)n >= len)
            return 0;
        o += (size_t)n;
    }
    return o;
}

int kc_remote_descriptor_settings(const char *d, size_t n, struct kc_remote_settings *s,
                                  char *storage, size_t cap)
{
    memset(s, 0, sizeof *s);
    if (n + 1 > cap || memchr(d, '\0', n) != NULL)
        return -EBADMSG;
    memcpy(storage, d, n);
    storage[n] = '\0';
    for (char *line = storage; *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl == NULL)
            return -EBADMSG;
        *nl = '\0';
        char *eq = strchr(line, '=');
        if (eq == NULL)
            return -EBADMSG;
        *eq = '\0';
        size_t i = 0;
        while (i < DESC_N && strcmp(line, desc_names[i]) != 0)
            i++;
        if (i == DESC_N)
            return -EBADMSG;
        *desc_field(s, i) = eq + 1;
        line = nl + 1;
    }
    return s->remote != NULL ? 0 : -EBADMSG;
}

/* ---- messages ---------------------------------------------------------------- */

const char *kc__auth_why(const char *reply)
{
    if (reply == NULL)
        return NULL;
    if (strncmp(reply, "NOAUTH", 6) == 0)
        return "asks for a password (NOAUTH): give it in the URL ([[USER:]PASSWORD@]) or in "
               "KCACHE_REMOTE_PASSWORD_FILE";
    if (strncmp(reply, "WRONGPASS", 9) == 0 || strncmp(reply, "ERR invalid password", 20) == 0 ||
        strncmp(reply, "ERR invalid username-password", 29) == 0)
        return "refused the user or password (WRONGPASS)";
    if (strncmp(reply, "NOPERM", 6) == 0)
        return "refused this user the command (NOPERM: see its ACL)";
    return NULL;
}
