/*
 * Trust for the remote tier: Ed25519 through libsodium (dlopen()ed), the
 * key files, and the remote value layout (remote_internal.h), which binds
 * an entry to its namespace and key and is checksummed and signed.
 */
#include "remote_internal.h"

#include "../../common/clock.h"
#include "../../common/config.h"
#include "../../common/digest.h"
#include "../../common/log.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- libsodium ---------------------------------------------------------- */

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static struct kc__sodium sodium;
static int sodium_rc = -ENOSYS;

static void sodium_load_once(void)
{
    void *h = kc__remote_dlopen(KC__SODIUM_SONAME);
    if (h == NULL) {
        kc_log(KC_LOG_WARN,
               "remote: %s not found (%s); remote entries cannot be signed or "
               "verified",
               KC__SODIUM_SONAME, dlerror());
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "sodium_init");
    sodium.seed_keypair = (__typeof__(sodium.seed_keypair))dlsym(h, "crypto_sign_seed_keypair");
    sodium.sign_detached = (__typeof__(sodium.sign_detached))dlsym(h, "crypto_sign_detached");
    sodium.verify_detached =
        (__typeof__(sodium.verify_detached))dlsym(h, "crypto_sign_verify_detached");
    sodium.generichash = (__typeof__(sodium.generichash))dlsym(h, "crypto_generichash");
    sodium.randombytes_buf = (__typeof__(sodium.randombytes_buf))dlsym(h, "randombytes_buf");
    sodium.memzero = (__typeof__(sodium.memzero))dlsym(h, "sodium_memzero");
    sodium.generichash_statebytes =
        (__typeof__(sodium.generichash_statebytes))dlsym(h, "crypto_generichash_statebytes");
    sodium.generichash_init =
        (__typeof__(sodium.generichash_init))dlsym(h, "crypto_generichash_init");
    sodium.generichash_update =
        (__typeof__(sodium.generichash_update))dlsym(h, "crypto_generichash_update");
    sodium.generichash_final =
        (__typeof__(sodium.generichash_final))dlsym(h, "crypto_generichash_final");
    if (init == NULL || sodium.seed_keypair == NULL || sodium.sign_detached == NULL ||
        sodium.verify_detached == NULL || sodium.generichash == NULL ||
        sodium.randombytes_buf == NULL || sodium.memzero == NULL || init() < 0) {
        kc_log(KC_LOG_WARN, "remote: %s lacks the functions kcache needs", KC__SODIUM_SONAME);
        return; /* unusable: sodium_rc stays -ENOSYS */
    }
    sodium_rc = 0;
}

int kc__sodium_load(const struct kc__sodium **out)
{
    pthread_once(&sodium_once, sodium_load_once);
    if (sodium_rc == 0)
        *out = &sodium;
    return sodium_rc;
}

/* ---- base64 ------------------------------------------------------------- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void kc__b64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = b64[(v >> 18) & 63];
        out[o++] = b64[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64[v & 63] : '=';
    }
    out[o] = '\0';
}

static int b64_val(int c)
{
    const char *p = c != '\0' ? strchr(b64, c) : NULL;
    return p != NULL ? (int)(p - b64) : -1;
}

int kc__b64_decode(const char *in, size_t n, unsigned char *out, size_t cap)
{
    if (n % 4 != 0)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int pad = 0;
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            int c = (unsigned char)in[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                pad++;
                v <<= 6;
                continue;
            }
            int x = b64_val(c);
            if (x < 0 || pad > 0)
                return -1;
            v = v << 6 | (uint32_t)x;
        }
        unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        for (int k = 0; k < 3 - pad; k++) {
            if (o >= cap)
                return -1;
            out[o++] = b[k];
        }
    }
    return (int)o;
}

/* ---- keys --------------------------------------------------------------- */

static const char pub_tag[] = "kcache-ed25519";
static const char sec_tag[] = "kcache-ed25519-secret";

uint64_t kc__key_id(const struct kc__sodium *na, const unsigned char pk[KC__PK_LEN])
{
    unsigned char h[32];
    na->generichash(h, sizeof h, pk, KC__PK_LEN, NULL, 0);
    uint64_t id = 0;
    for (int i = 7; i >= 0; i--)
        id = id << 8 | h[i];
    return id;
}

/* "<tag> <base64 of n bytes>[ comment]": 0 with out, or -EBADMSG. */
static int parse_tagged(const char *line, const char *tag, unsigned char *out, size_t n)
{
    size_t tl = strlen(tag);
    if (strncmp(line, tag, tl) != 0 || (line[tl] != ' ' && line[tl] != '\t'))
        return -EBADMSG;
    const char *p = line + tl;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t len = strcspn(p, " \t\r\n");
    unsigned char buf[64];
    if (kc__b64_decode(p, len, buf, sizeof buf) != (int)n)
        return -EBADMSG;
    memcpy(out, buf, n);
    memset(buf, 0, sizeof buf);
    const char *rest = p + len;
    if (*rest != '\0' && *rest != ' ' && *rest != '\t' && *rest != '\r' && *rest != '\n')
        return -EBADMSG;
    return 0;
}

int kc__pubkey_parse(const char *line, unsigned char pk[KC__PK_LEN])
{
    return parse_tagged(line, pub_tag, pk, KC__PK_LEN);
}

/* Reads a key or password file (at most 1 MiB) by the one reader of
 * configured files (common/config.h): never blocks on a FIFO, refuses
 * what `rule` does not allow. *buf malloc'd, NUL-terminated. */
static int read_small(const char *path, enum kc_file_rule rule, char **buf)
{
    return kc_config_read_file(AT_FDCWD, path, rule, 1 << 20, buf, NULL);
}

int kc__keys_load_secret(const struct kc__sodium *na, const char *path, struct kc__keys *k)
{
    char *b = NULL;
    int rc = read_small(path, KC_FILE_PRIVATE, &b);
    if (rc != 0)
        return rc;
    unsigned char seed[KC__SEED_LEN];
    rc = parse_tagged(b, sec_tag, seed, sizeof seed);
    na->memzero(b, strlen(b));
    free(b);
    if (rc != 0)
        return rc;
    na->seed_keypair(k->self.pk, k->sk, seed);
    na->memzero(seed, sizeof seed);
    k->self.id = kc__key_id(na, k->self.pk);
    k->have_secret = true;
    return 0;
}

int kc__keys_load_trusted(const struct kc__sodium *na, const char *path, struct kc__keys *k)
{
    char *b = NULL;
    int rc = read_small(path, KC_FILE_TRUSTED, &b);
    if (rc != 0)
        return rc;
    int lineno = 0;
    for (char *line = b; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p != '\0' && *p != '#' && *p != '\r') {
            unsigned char pk[KC__PK_LEN];
            if (kc__pubkey_parse(p, pk) != 0) {
                kc_log(KC_LOG_WARN, "remote: %s line %d is not a kcache public key; skipped", path,
                       lineno);
            } else if (k->n_trusted < KC__MAX_TRUSTED) {
                struct kc__pubkey *t = realloc(k->trusted, (k->n_trusted + 1) * sizeof *k->trusted);
                if (t == NULL) {
                    rc = -ENOMEM;
                    break;
                }
                k->trusted = t;
                memcpy(t[k->n_trusted].pk, pk, KC__PK_LEN);
                t[k->n_trusted].id = kc__key_id(na, pk);
                k->n_trusted++;
            }
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(b);
    return rc;
}

const struct kc__pubkey *kc__keys_find(const struct kc__keys *k, uint64_t id)
{
    if (k->have_secret && k->self.id == id)
        return &k->self;
    for (size_t i = 0; i < k->n_trusted; i++)
        if (k->trusted[i].id == id)
            return &k->trusted[i];
    return NULL;
}

void kc__keys_free(const struct kc__sodium *na, struct kc__keys *k)
{
    if (na != NULL)
        na->memzero(k->sk, sizeof k->sk);
    else
        memset(k->sk, 0, sizeof k->sk);
    free(k->trusted);
    k->trusted = NULL;
    k->n_trusted = 0;
    k->have_secret = false;
}

static int write_new(const char *path, mode_t mode, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    size_t n = strlen(text), done = 0;
    int rc = 0;
    while (done < n) {
        ssize_t w = write(fd, text + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            break;
        }
        done += (size_t)w;
    }
    if (rc == 0 && fchmod(fd, mode) != 0)
        rc = -errno;
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc != 0)
        unlink(path);
    return rc;
}

/* Makes the directories leading to path that do not exist (0700: a
 * secret key goes there). 0 or the first mkdir's negative errno. */
static int make_parents(const char *path)
{
    char d[4200];
    if (snprintf(d, sizeof d, "%s", path) >= (int)sizeof d)
        return -ENAMETOOLONG;
    char *slash = strrchr(d, '/');
    if (slash == NULL || slash == d)
        return 0;
    *slash = '\0';
    for (char *p = d + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(d, 0700) != 0 && errno != EEXIST)
            return -errno;
        *p = c;
        if (c == '\0')
            return 0;
    }
}

int kc_remote_keygen(const char *path, const char *comment, char *key_id)
{
    const struct kc__sodium *na;
    int rc = kc__sodium_load(&na);
    if (rc != 0)
        return rc;
    char pubpath[4200];
    if (snprintf(pubpath, sizeof pubpath, "%s.pub", path) >= (int)sizeof pubpath)
        return -ENAMETOOLONG;
    if (access(pubpath, F_OK) == 0 || errno != ENOENT)
        return -EEXIST;
    if ((rc = make_parents(path)) != 0)
        return rc;
    unsigned char seed[KC__SEED_LEN], pk[KC__PK_LEN], sk[KC__SK_LEN];
    na->randombytes_buf(seed, sizeof seed);
    na->seed_keypair(pk, sk, seed);
    char sline[128], b[64];
    kc__b64_encode(seed, sizeof seed, b);
    snprintf(sline, sizeof sline, "%s %s\n", sec_tag, b);
    na->memzero(seed, sizeof seed);
    na->memzero(sk, sizeof sk);
    na->memzero(b, sizeof b);
    rc = write_new(path, 0600, sline);
    na->memzero(sline, sizeof sline);
    if (rc != 0)
        return rc;
    char who[300];
    if (comment == NULL) {
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        struct passwd pw, *res = NULL;
        char pbuf[4096];
        const char *user = getpwuid_r(geteuid(), &pw, pbuf, sizeof pbuf, &res) == 0 &&
                                   res != NULL && res->pw_name != NULL
                               ? res->pw_name
                               : "unknown";
        snprintf(who, sizeof who, "%s@%s", user, host);
        comment = who;
    }
    char pline[512];
    kc__b64_encode(pk, sizeof pk, b);
    snprintf(pline, sizeof pline, "%s %s %s\n", pub_tag, b, comment);
    rc = write_new(pubpath, 0644, pline);
    if (rc != 0) {
        unlink(path);
        return rc;
    }
    if (key_id != NULL)
        snprintf(key_id, 17, "%016llx", (unsigned long long)kc__key_id(na, pk));
    return 0;
}

/* ---- the value layout --------------------------------------------------- */

static void put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static const char sig_context[16] = {'k', 'c', 'a', 'c', 'h', 'e', '-', 'r',
                                     'e', 'm', 'o', 't', 'e', '-', 'v', '1'};

/* The message a signature covers (see remote_internal.h): *msg malloc'd
 * is not needed: it is small, built in buf (room for 16 + 16 + 127 + 57 +
 * 32 bytes). Returns its length. */
static size_t sig_message(const struct kc__sodium *na, const unsigned char *v, size_t meta_end,
                          const unsigned char *body, size_t body_len, unsigned char *buf)
{
    size_t o = 0;
    memcpy(buf + o, sig_context, sizeof sig_context);
    o += sizeof sig_context;
    memcpy(buf + o, v, 16);
    o += 16;
    memcpy(buf + o, v + 80, meta_end - 80);
    o += meta_end - 80;
    na->generichash(buf + o, 32, body, body_len, NULL, 0);
    return o + 32;
}

#define SIG_MSG_MAX (16 + 16 + 1 + 127 + KC__RV_META + 32)

int kc__rv_encode(const struct kc__sodium *na, const struct kc__keys *keys, const char *ns,
                  const kc_key *key, uint32_t kind, uint32_t format, uint64_t created_ns,
                  uint64_t saved_ns, const void *body, size_t len, unsigned char **out,
                  size_t *outlen)
{
    size_t nl = ns != NULL ? strlen(ns) : 0;
    if (nl == 0 || nl > 127)
        return -EINVAL;
    size_t meta_end = KC__RV_FIXED + nl + KC__RV_META;
    size_t total = meta_end + len + KC__RV_SUM;
    unsigned char *v = malloc(total);
    if (v == NULL)
        return -ENOMEM;
    bool sign = keys != NULL && keys->have_secret;
    put_u32(v, KC__RV_MAGIC);
    put_u16(v + 4, KC__RV_VERSION);
    put_u16(v + 6, sign ? KC__RV_SIGNED : 0);
    put_u64(v + 8, sign ? keys->self.id : 0);
    memset(v + 16, 0, KC__SIG_LEN);
    v[80] = (unsigned char)nl;
    memcpy(v + KC__RV_FIXED, ns, nl);
    unsigned char *m = v + KC__RV_FIXED + nl;
    put_u64(m, key->id.lo);
    put_u64(m + 8, key->id.hi);
    put_u64(m + 16, key->build);
    put_u32(m + 24, kind);
    put_u32(m + 28, format);
    put_u64(m + 32, created_ns);
    put_u64(m + 40, saved_ns);
    put_u64(m + 48, len);
    if (len > 0)
        memcpy(v + meta_end, body, len);
    if (sign) {
        unsigned char msg[SIG_MSG_MAX];
        size_t ml = sig_message(na, v, meta_end, v + meta_end, len, msg);
        unsigned long long sl = 0;
        if (na->sign_detached(v + 16, &sl, msg, ml, keys->sk) != 0 || sl != KC__SIG_LEN) {
            free(v);
            return -EIO;
        }
    }
    kc_digest d = kc_digest_of(v, total - KC__RV_SUM);
    put_u64(v + total - 16, d.lo);
    put_u64(v + total - 8, d.hi);
    *out = v;
    *outlen = total;
    return 0;
}

int kc__rv_decode(const struct kc__sodium *na, const struct kc__keys *keys, const void *value,
                  size_t n, const char *ns, const kc_key *key, struct kc__rv *rv)
{
    const unsigned char *v = value;
    if (n < KC__RV_FIXED + 1 + KC__RV_META + KC__RV_SUM)
        return -EBADMSG;
    if (get_u32(v) != KC__RV_MAGIC || get_u16(v + 4) != KC__RV_VERSION)
        return -EBADMSG;
    uint16_t flags = get_u16(v + 6);
    size_t nl = v[80];
    if ((flags & ~KC__RV_SIGNED) != 0 || nl == 0 || nl > 127)
        return -EBADMSG;
    size_t meta_end = KC__RV_FIXED + nl + KC__RV_META;
    if (n < meta_end + KC__RV_SUM)
        return -EBADMSG;
    const unsigned char *m = v + KC__RV_FIXED + nl;
    uint64_t blen = get_u64(m + 48);
    if (blen != n - meta_end - KC__RV_SUM)
        return -EBADMSG;
    kc_digest d = kc_digest_of(v, n - KC__RV_SUM);
    if (get_u64(v + n - 16) != d.lo || get_u64(v + n - 8) != d.hi)
        return -EBADMSG;
    /* Another key's entry (swapped, or planted) is refused even when it is
     * signed: the signature covers the namespace and the key. */
    size_t want_nl = strlen(ns);
    kc_key k = {.id = {.lo = get_u64(m), .hi = get_u64(m + 8)}, .build = get_u64(m + 16)};
    if (want_nl != nl || memcmp(v + KC__RV_FIXED, ns, nl) != 0 || k.id.lo != key->id.lo ||
        k.id.hi != key->id.hi || k.build != key->build)
        return -EBADMSG;
    rv->signed_ = (flags & KC__RV_SIGNED) != 0;
    rv->key_id = get_u64(v + 8);
    if (!keys->trust_any) {
        if (!rv->signed_ || na == NULL)
            return -EKEYREJECTED;
        const struct kc__pubkey *pk = kc__keys_find(keys, rv->key_id);
        if (pk == NULL)
            return -EKEYREJECTED;
        unsigned char msg[SIG_MSG_MAX];
        size_t ml = sig_message(na, v, meta_end, v + meta_end, (size_t)blen, msg);
        if (na->verify_detached(v + 16, msg, ml, pk->pk) != 0)
            return -EKEYREJECTED;
    }
    memcpy(rv->ns, ns, nl);
    rv->ns[nl] = '\0';
    rv->key = k;
    rv->kind = get_u32(m + 24);
    rv->format = get_u32(m + 28);
    rv->created_ns = get_u64(m + 32);
    rv->saved_ns = get_u64(m + 40);
    rv->body = v + meta_end;
    rv->body_len = (size_t)blen;
    return 0;
}

/* ---- provenance: the signers a local store serves ------------------------ */

uint32_t kc_remote_signer_tag(const unsigned char pk[KC__PK_LEN])
{
    return (uint32_t)(kc_digest_of(pk, KC__PK_LEN).lo & 0x0fffffffu);
}

struct kc_remote_signers {
    size_t n;
    uint32_t tag[];
};

/* Adds the tags of the public key lines of `text` to *sg (grown). */
static int signers_add(struct kc_remote_signers **sg, char *text)
{
    for (char *line = text; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        char *p = line;
        while (*p == ' ' || *p == '\t')
            p++;
        unsigned char pk[KC__PK_LEN];
        if (*p != '\0' && *p != '#' && kc__pubkey_parse(p, pk) == 0 && (*sg)->n < KC__MAX_TRUSTED) {
            struct kc_remote_signers *g =
                realloc(*sg, sizeof **sg + ((*sg)->n + 1) * sizeof(uint32_t));
            if (g == NULL)
                return -ENOMEM;
            g->tag[g->n++] = kc_remote_signer_tag(pk);
            *sg = g;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    return 0;
}

int kc_remote_signers_load(const struct kc_remote_settings *s, struct kc_remote_signers **out)
{
    *out = NULL;
    bool any = s->trust != NULL && strcasecmp(s->trust, "any") == 0;
    bool have_trusted = s->trusted_keys != NULL && s->trusted_keys[0] == '/';
    bool have_own = s->signing_key != NULL && s->signing_key[0] == '/';
    if (any || (!have_trusted && !have_own))
        return 0;
    struct kc_remote_signers *sg = calloc(1, sizeof *sg);
    if (sg == NULL)
        return -ENOMEM;
    int rc = 0;
    char *b = NULL;
    if (have_trusted && read_small(s->trusted_keys, KC_FILE_TRUSTED, &b) == 0) {
        rc = signers_add(&sg, b);
        free(b);
        b = NULL;
    }
    /* This node's own key: the public half beside the secret one (the
     * secret is not read here: deriving the public key needs libsodium). */
    char pub[4200];
    if (rc == 0 && have_own &&
        snprintf(pub, sizeof pub, "%s.pub", s->signing_key) < (int)sizeof pub &&
        read_small(pub, KC_FILE_MINE, &b) == 0) {
        rc = signers_add(&sg, b);
        free(b);
    }
    if (rc != 0) {
        free(sg);
        return rc;
    }
    *out = sg;
    return 0;
}

bool kc_remote_signers_serve(const struct kc_remote_signers *sg, uint32_t prov)
{
    if (sg == NULL || KC_PROV_CODE(prov) != KC_PROV_SIGNED)
        return true;
    for (size_t i = 0; i < sg->n; i++)
        if (sg->tag[i] == KC_PROV_TAG(prov))
            return true;
    return false;
}

void kc_remote_signers_free(struct kc_remote_signers *sg)
{
    free(sg);
}

/* ---- the password file ----------------------------------------------------- */

int kc__read_password_file(const char *path, char *out, size_t cap)
{
    char *b = NULL;
    int rc = read_small(path, KC_FILE_PRIVATE, &b);
    if (rc != 0)
        return rc;
    size_t n = strcspn(b, "\r\n");
    if (n == 0 || n >= cap) {
        rc = -EBADMSG;
    } else {
        memcpy(out, b, n);
        out[n] = '\0';
    }
    memset(b, 0, strlen(b));
    free(b);
    return rc;
}

/* ---- signing small values (lock values) ----------------------------------- */

/* "kcache-blob-v1" \0 context \0 BLAKE2b-256(msg): what a blob signature
 * covers, in buf (room for 16 + 64 + 32). Returns its length, or 0 for a
 * context that is empty or too long. */
static size_t blob_message(const struct kc__sodium *na, const char *context, const void *msg,
                           size_t n, unsigned char *buf)
{
    static const char tag[] = "kcache-blob-v1";
    size_t cl = context != NULL ? strlen(context) : 0;
    if (cl == 0 || cl > 63)
        return 0;
    size_t o = 0;
    memcpy(buf, tag, sizeof tag);
    o += sizeof tag;
    memcpy(buf + o, context, cl + 1);
    o += cl + 1;
    na->generichash(buf + o, 32, msg, n, NULL, 0);
    return o + 32;
}

int kc__blob_sign(const struct kc__sodium *na, const struct kc__keys *keys, const char *context,
                  const void *msg, size_t n, unsigned char sig[KC__SIG_LEN])
{
    if (na == NULL || keys == NULL || !keys->have_secret)
        return -EROFS;
    unsigned char m[16 + 64 + 32];
    size_t ml = blob_message(na, context, msg, n, m);
    unsigned long long sl = 0;
    if (ml == 0)
        return -EINVAL;
    return na->sign_detached(sig, &sl, m, ml, keys->sk) == 0 && sl == KC__SIG_LEN ? 0 : -EIO;
}

int kc__blob_verify(const struct kc__sodium *na, const struct kc__keys *keys, const char *context,
                    uint64_t key_id, const void *msg, size_t n,
                    const unsigned char sig[KC__SIG_LEN])
{
    if (na == NULL || keys == NULL)
        return -EKEYREJECTED;
    const struct kc__pubkey *pk = kc__keys_find(keys, key_id);
    unsigned char m[16 + 64 + 32];
    size_t ml = blob_message(na, context, msg, n, m);
    if (pk == NULL || ml == 0 || na->verify_detached(sig, m, ml, pk->pk) != 0)
        return -EKEYREJECTED;
    return 0;
}

/* ---- lock values -------------------------------------------------------- */

/* A lock value is a blob in this context; what it signs is the lock's
 * name, a NUL, and the value up to the space before the signature, so a
 * value is bound to its lock and to the expiry written in it. */
static const char lock_context[] = "kcache-lock-v1";

/* That message, in buf (cap bytes): its length, or 0 when it does not
 * fit. */
static size_t lock_message(const char *lock, const char *signed_part, size_t n, char *buf,
                           size_t cap)
{
    size_t ll = strlen(lock);
    if (ll + 1 + n > cap)
        return 0;
    memcpy(buf, lock, ll + 1);
    memcpy(buf + ll + 1, signed_part, n);
    return ll + 1 + n;
}

int kc__lock_value(const struct kc__sodium *na, const struct kc__keys *keys, const char *lock,
                   const char *token, uint64_t expires_ms, char *out, size_t cap)
{
    if (na == NULL || keys == NULL || !keys->have_secret)
        return -EROFS;
    int n = snprintf(out, cap, "%s kcl1 %016" PRIx64 " %" PRIu64, token, keys->self.id, expires_ms);
    if (n <= 0 || (size_t)n + 2 + 4 * ((KC__SIG_LEN + 2) / 3) > cap)
        return -EINVAL;
    char msg[1024];
    size_t ml = lock_message(lock, out, (size_t)n, msg, sizeof msg);
    unsigned char sig[KC__SIG_LEN];
    if (ml == 0)
        return -EINVAL;
    int rc = kc__blob_sign(na, keys, lock_context, msg, ml, sig);
    if (rc != 0)
        return rc;
    out[n] = ' ';
    kc__b64_encode(sig, sizeof sig, out + n + 1);
    return 0;
}

int kc__lock_value_check(const struct kc__sodium *na, const struct kc__keys *keys, const char *lock,
                         const char *v, size_t len, uint64_t now_ms, uint64_t max_ms)
{
    char buf[KC__LOCK_VALUE_MAX];
    if (len == 0 || len >= sizeof buf || memchr(v, '\0', len) != NULL)
        return -EKEYREJECTED;
    memcpy(buf, v, len);
    buf[len] = '\0';
    /* From the end: signature, expiry, signer id, "kcl1"; the token
     * before them. */
    char *sp = strrchr(buf, ' ');
    if (sp == NULL)
        return -EKEYREJECTED;
    size_t signed_len = (size_t)(sp - buf);
    const char *sig64 = sp + 1;
    *sp = '\0';
    char *e = strrchr(buf, ' ');
    if (e == NULL)
        return -EKEYREJECTED;
    *e = '\0';
    char *id = strrchr(buf, ' ');
    if (id == NULL)
        return -EKEYREJECTED;
    *id = '\0';
    char *tag = strrchr(buf, ' ');
    if (tag == NULL || strcmp(tag + 1, "kcl1") != 0 || tag == buf)
        return -EKEYREJECTED;
    char *end;
    errno = 0;
    unsigned long long exp = strtoull(e + 1, &end, 10);
    if (errno != 0 || *end != '\0' || end == e + 1)
        return -EKEYREJECTED;
    unsigned long long kid = strtoull(id + 1, &end, 16);
    if (*end != '\0' || end - (id + 1) != 16)
        return -EKEYREJECTED;
    if (exp <= now_ms || exp - now_ms > max_ms)
        return -EKEYREJECTED;
    if (keys->trust_any)
        return 0;
    unsigned char sig[KC__SIG_LEN + 2];
    if (kc__b64_decode(sig64, strlen(sig64), sig, sizeof sig) != KC__SIG_LEN)
        return -EKEYREJECTED;
    /* The signed part as it was: restore the spaces cut above. */
    *tag = ' ';
    *id = ' ';
    *e = ' ';
    char msg[1024];
    size_t ml = lock_message(lock, buf, signed_len, msg, sizeof msg);
    if (ml == 0)
        return -EKEYREJECTED;
    return kc__blob_verify(na, keys, lock_context, (uint64_t)kid, msg, ml, sig);
}
