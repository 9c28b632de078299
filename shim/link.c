/*
 * The link cache: the engine (linker.h) and the nvJitLink hooks.
 *
 * nvJitLink is reached by direct linking (the header's inline functions
 * call the versioned exports, __nvJitLinkCreate_13_0 and so on) and by
 * dlopen + dlsym of the unversioned names (cuda.bindings); both sets are
 * hooked, as libnvJitLink.so.13 exports them. A handle's session keys the
 * link (linker.h); on a hit every getter answers from the replay record
 * (linkrec.h), which holds exactly what nvJitLink's getters returned:
 * codes, sizes, bytes, logs. Handles the shim does not know go to the real
 * nvJitLink untouched, so bad input gets nvJitLink's own answer.
 *
 * Namespace: link:<version>-<identity>-<arch>-f<format>, identity a digest
 * of libnvJitLink's GNU build-id (content hash without one) and version,
 * arch the -arch option's value.
 */
#include "linker.h"

#include "codec.h"
#include "flight.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* nvJitLink.h defines the unversioned names as inline functions; this file
 * defines them as exports instead. */
#define nvJitLinkCreate kc__hdr_nvJitLinkCreate
#define nvJitLinkDestroy kc__hdr_nvJitLinkDestroy
#define nvJitLinkAddData kc__hdr_nvJitLinkAddData
#define nvJitLinkAddFile kc__hdr_nvJitLinkAddFile
#define nvJitLinkComplete kc__hdr_nvJitLinkComplete
#define nvJitLinkGetLinkedCubinSize kc__hdr_nvJitLinkGetLinkedCubinSize
#define nvJitLinkGetLinkedCubin kc__hdr_nvJitLinkGetLinkedCubin
#define nvJitLinkGetLinkedPtxSize kc__hdr_nvJitLinkGetLinkedPtxSize
#define nvJitLinkGetLinkedPtx kc__hdr_nvJitLinkGetLinkedPtx
#define nvJitLinkGetErrorLogSize kc__hdr_nvJitLinkGetErrorLogSize
#define nvJitLinkGetErrorLog kc__hdr_nvJitLinkGetErrorLog
#define nvJitLinkGetInfoLogSize kc__hdr_nvJitLinkGetInfoLogSize
#define nvJitLinkGetInfoLog kc__hdr_nvJitLinkGetInfoLog
#include <nvJitLink.h>
#undef nvJitLinkCreate
#undef nvJitLinkDestroy
#undef nvJitLinkAddData
#undef nvJitLinkAddFile
#undef nvJitLinkComplete
#undef nvJitLinkGetLinkedCubinSize
#undef nvJitLinkGetLinkedCubin
#undef nvJitLinkGetLinkedPtxSize
#undef nvJitLinkGetLinkedPtx
#undef nvJitLinkGetErrorLogSize
#undef nvJitLinkGetErrorLog
#undef nvJitLinkGetInfoLogSize
#undef nvJitLinkGetInfoLog

#define BACKEND "link"

/* Inputs larger than this pass through (a copy is kept while deferred). */
#define KC_LINK_MAX_INPUT (1ull << 32)

bool kc__link_enabled(void)
{
    const struct kc_config *cfg = kc__config();
    return !cfg->disable && cfg->link;
}

static void count(struct kc_counters c)
{
    kc__count(BACKEND, &c);
}

/* ---- the store: every access of this file goes through these ------------- */

static const struct kc_store_ops *store(struct kc_store **st)
{
    const struct kc_store_ops *api = NULL;
    *st = kc__store(&api);
    return *st != NULL ? api : NULL;
}

/* A get: 0 with *body (release with st_free), or a negative errno. */
static int st_get(const char *ns, const kc_key *k, void **body, size_t *len,
                  struct kc_record_info *info)
{
    struct kc_store *st;
    const struct kc_store_ops *api = store(&st);
    return api != NULL ? api->get(st, ns, k, body, len, info) : -ENOENT;
}

static int st_put(const char *ns, const kc_key *k, uint32_t kind, const void *body, size_t len,
                  uint64_t saved_ns)
{
    struct kc_store *st;
    const struct kc_store_ops *api = store(&st);
    return api != NULL ? api->put(st, ns, k, NULL, kind, body, len, saved_ns) : -ENOENT;
}

static void st_purge(const char *ns, const kc_key *k)
{
    struct kc_store *st;
    const struct kc_store_ops *api = store(&st);
    if (api != NULL)
        api->purge(st, ns, k);
}

/* Whether the store is usable (single flight only then: DIR/locks was
 * checked when it was opened). */
static bool store_ok(void)
{
    struct kc_store *st;
    return store(&st) != NULL;
}

static void st_free(void *p)
{
    struct kc_store *st;
    const struct kc_store_ops *api = store(&st);
    if (api != NULL)
        api->free(p);
}

/* ---- keys ------------------------------------------------------------------ */

struct kc__hasher *kc__link_hasher(const char *api)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h != NULL) {
        kc__hash_str(h, "kcache-link");
        kc__hash_u64(h, KC_FORMAT_VERSION);
        kc__hash_str(h, api);
    }
    return h;
}

/* A digest derived from d for one use (tag), so the keys of a chain's
 * marker, record and lock never collide. */
static kc_digest derive(const kc_digest *d, const char *tag)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL) {
        kc_digest x = *d;
        x.lo ^= 0x9e3779b97f4a7c15ull * (unsigned char)tag[0];
        return x;
    }
    kc__hash_str(h, tag);
    kc__hash_bytes(h, d, sizeof *d);
    kc_digest x = kc__hash_digest(h);
    kc__hasher_free(h);
    return x;
}

static void hash_opts(struct kc__hasher *h, const struct kc__link_input *in)
{
    kc__hash_u64(h, in->n_opt);
    for (unsigned i = 0; i < in->n_opt; i++) {
        kc__hash_u64(h, (uint64_t)(uint32_t)in->opt[i]);
        kc__hash_u64(h, (uint64_t)(uint32_t)(uintptr_t)in->val[i]);
    }
}

/* The chain after a data input. */
static int data_step(const kc_digest *p, const struct kc__link_input *in, kc_digest *out)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return -ENOMEM;
    kc_digest c = kc_digest_of(in->data, in->size);
    kc__hash_str(h, "data");
    kc__hash_bytes(h, p, sizeof *p);
    kc__hash_u64(h, (uint64_t)in->type);
    kc__hash_str(h, in->name);
    kc__hash_u64(h, in->size);
    kc__hash_bytes(h, &c, sizeof c);
    hash_opts(h, in);
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    return 0;
}

/* The step of a file input without the file's content (the manifest's
 * base), and the chain once its content is known. */
static int file_base(const kc_digest *p, const struct kc__link_input *in, kc_digest *out)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return -ENOMEM;
    kc__hash_str(h, "file");
    kc__hash_bytes(h, p, sizeof *p);
    kc__hash_u64(h, (uint64_t)in->type);
    kc__hash_str(h, in->name);
    hash_opts(h, in);
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    return 0;
}

static kc_digest file_result(const kc_digest *base, const kc_digest *content)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return derive(base, "file-result");
    kc__hash_str(h, "file-result");
    kc__hash_bytes(h, base, sizeof *base);
    kc__hash_bytes(h, content, sizeof *content);
    kc_digest d = kc__hash_digest(h);
    kc__hasher_free(h);
    return d;
}

static kc_key marker_key(const kc_digest *p)
{
    return (kc_key){.id = derive(p, "link-step"), .build = kc__self_build()};
}

static kc_key record_key(const kc_digest *p)
{
    return (kc_key){.id = derive(p, "link-record"), .build = kc__self_build()};
}

static kc_key manifest_key(const kc_digest *base)
{
    return (kc_key){.id = derive(base, "link-manifest"), .build = 0};
}

#define MARKER "KCLSTEP1"

/* ---- file steps: manifests as for headers (codec.h, deps.h) ----------------- */

/* A file input read at the add: its bytes, and their digest once taken. */
struct file_read {
    const char *path;
    const struct stat *st; /* as the bytes were read */
    const void *bytes;
    size_t len;
    uint64_t fp[5]; /* kc__dep_fingerprint of st */
    bool hashed;
    kc_digest content;
};

static void file_hash(struct file_read *fr)
{
    if (!fr->hashed) {
        fr->content = kc_digest_of(fr->bytes, fr->len);
        fr->hashed = true;
    }
}

/* Whether the store knows a file step: the base's manifest lists the chain
 * of the content read (*p is set to it). 0 or -ENOENT. The content is
 * matched, not the file: the bytes given to the library are those read,
 * whatever the file holds by then. A set whose file had this file's
 * fingerprint when it was read names its content without hashing the
 * bytes again (nothing can have written them since: see deps.h). */
static int file_known(const char *ns, const kc_digest *base, struct file_read *fr, kc_digest *p)
{
    kc_key mk = manifest_key(base);
    void *body = NULL;
    size_t len = 0;
    int rc = st_get(ns, &mk, &body, &len, NULL);
    if (rc != 0)
        return rc;
    struct kc__manifest *m = kc__manifest_decode(body, len);
    st_free(body);
    if (m == NULL) {
        st_purge(ns, &mk);
        return -ENOENT;
    }
    rc = -ENOENT;
    bool fp_set = false;
    for (int k = 0; k < 5; k++)
        fp_set |= fr->fp[k] != 0;
    for (uint64_t i = 0; i < m->n && rc != 0 && fp_set && !fr->hashed; i++) {
        const struct kc__dep_set *set = &m->sets[i];
        if (set->n != 1 || memcmp(set->deps[0].fp, fr->fp, sizeof fr->fp) != 0 ||
            strcmp(set->deps[0].path, fr->path) != 0)
            continue;
        kc_digest r = file_result(base, &set->deps[0].digest);
        if (r.lo == set->result.lo && r.hi == set->result.hi) {
            fr->content = set->deps[0].digest;
            fr->hashed = true;
            *p = r;
            rc = 0;
        }
    }
    if (rc != 0) {
        file_hash(fr);
        kc_digest want = file_result(base, &fr->content);
        for (uint64_t i = 0; i < m->n && rc != 0; i++)
            if (m->sets[i].result.lo == want.lo && m->sets[i].result.hi == want.hi)
                rc = 0;
        *p = want;
    }
    kc__manifest_free(m);
    return rc;
}

/* Adds (result, dep) to the manifest of base, newest first. */
static int file_manifest_add(const char *ns, const kc_digest *base, const kc_digest *result,
                             const struct kc__dep *dep)
{
    kc_key mk = manifest_key(base);
    void *body = NULL;
    size_t len = 0;
    struct kc__manifest *old = NULL;
    struct kc_record_info info = {0};
    if (st_get(ns, &mk, &body, &len, &info) == 0) {
        old = kc__manifest_mergeable(info.prov) ? kc__manifest_decode(body, len) : NULL;
        st_free(body);
    }
    struct kc_buf b = {0};
    kc__manifest_encode(&b, result, dep, 1, old);
    kc__manifest_free(old);
    int rc = b.err ? b.err : st_put(ns, &mk, KC_KIND_MANIFEST, b.p, b.len, 0);
    kc_buf_free(&b);
    return rc;
}

/* ---- sessions ------------------------------------------------------------------ */

#define SESS_BUCKETS 256
static struct kc__link_sess *sessions[SESS_BUCKETS];
static pthread_mutex_t sess_lock = PTHREAD_MUTEX_INITIALIZER;

/* Step locks held by this process: while any is, no lock is waited for. */
static int held_steps;

static size_t bucket(const void *h)
{
    return ((uintptr_t)h >> 4) % SESS_BUCKETS;
}

static void input_free(struct kc__link_input *in)
{
    free(in->name);
    free((void *)in->data);
    free(in->opt);
    free(in->val);
    memset(in, 0, sizeof *in);
}

static void release_locks(struct kc__link_sess *s)
{
    if (s->lock_fd >= 0) {
        kc__flight_release(s->lock_fd);
        s->lock_fd = -1;
        __atomic_fetch_sub(&held_steps, 1, __ATOMIC_ACQ_REL);
    }
    kc__flight_release(s->final_fd);
    s->final_fd = -1;
}

static void sess_free(struct kc__link_sess *s)
{
    if (s == NULL)
        return;
    release_locks(s);
    for (size_t i = 0; i < s->n_def; i++)
        input_free(&s->def[i]);
    free(s->def);
    free(s->steps);
    kc_why_free(&s->wrec);
    kc__deps_free(&s->files);
    kc__lrec_free(s->served);
    free(s->priv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int kc__link_new(void *h, const struct kc__link_ops *ops, const char *ns, const kc_digest *p0,
                 bool cacheable, enum kc_pass_reason why, void *priv)
{
    struct kc__link_sess *s = calloc(1, sizeof *s);
    if (s == NULL) {
        free(priv);
        kc_log_once(KC_LOG_WARN, "out of memory; links pass through uncached");
        return -ENOMEM;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->h = h;
    s->ops = ops;
    s->lock_fd = s->final_fd = -1;
    snprintf(s->ns, sizeof s->ns, "%s", ns);
    s->prefix = *p0;
    s->priv = priv;
    /* KCACHE_RECACHE: never served, so nothing is deferred. */
    s->state = !cacheable ? KC_LINK_PASS : kc__config()->recache ? KC_LINK_LIVE : KC_LINK_DEFER;
    s->why = why;
    pthread_mutex_lock(&sess_lock);
    struct kc__link_sess **pp = &sessions[bucket(h)], *stale = NULL;
    while (*pp != NULL && (*pp)->h != h)
        pp = &(*pp)->next;
    if (*pp != NULL) {
        /* A handle the library reused after a destroy we did not see. */
        stale = *pp;
        *pp = stale->next;
        stale->gone = true;
        stale->refs++;
    }
    s->next = sessions[bucket(h)];
    sessions[bucket(h)] = s;
    pthread_mutex_unlock(&sess_lock);
    if (stale != NULL) {
        pthread_mutex_lock(&stale->mu);
        kc__link_put(stale);
    }
    return 0;
}

struct kc__link_sess *kc__link_get(void *h, const struct kc__link_ops *ops)
{
    if (h == NULL)
        return NULL;
    pthread_mutex_lock(&sess_lock);
    struct kc__link_sess *s = sessions[bucket(h)];
    while (s != NULL && !(s->h == h && s->ops == ops))
        s = s->next;
    if (s != NULL)
        s->refs++;
    pthread_mutex_unlock(&sess_lock);
    if (s != NULL)
        pthread_mutex_lock(&s->mu);
    return s;
}

void kc__link_put(struct kc__link_sess *s)
{
    if (s == NULL)
        return;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&sess_lock);
    bool last = --s->refs == 0 && s->gone;
    pthread_mutex_unlock(&sess_lock);
    if (last)
        sess_free(s);
}

struct kc__link_sess *kc__link_take(void *h, const struct kc__link_ops *ops)
{
    if (h == NULL)
        return NULL;
    pthread_mutex_lock(&sess_lock);
    struct kc__link_sess **pp = &sessions[bucket(h)];
    while (*pp != NULL && !((*pp)->h == h && (*pp)->ops == ops))
        pp = &(*pp)->next;
    struct kc__link_sess *s = *pp;
    if (s != NULL) {
        *pp = s->next;
        s->gone = true;
        s->refs++;
    }
    pthread_mutex_unlock(&sess_lock);
    if (s != NULL)
        pthread_mutex_lock(&s->mu);
    return s;
}

void kc__link_restore(struct kc__link_sess *s)
{
    pthread_mutex_lock(&sess_lock);
    struct kc__link_sess *cur = sessions[bucket(s->h)];
    while (cur != NULL && cur->h != s->h)
        cur = cur->next;
    if (cur == NULL) {
        s->gone = false;
        s->next = sessions[bucket(s->h)];
        sessions[bucket(s->h)] = s;
    }
    pthread_mutex_unlock(&sess_lock);
    kc__link_put(s);
}

/* ---- steps ------------------------------------------------------------------------ */

static int push_step(struct kc__link_sess *s, const struct kc__link_step *st)
{
    if (s->n_steps == s->cap_steps) {
        size_t cap = s->cap_steps ? s->cap_steps * 2 : 8;
        struct kc__link_step *v = realloc(s->steps, cap * sizeof *v);
        if (v == NULL)
            return -ENOMEM;
        s->steps = v;
        s->cap_steps = cap;
    }
    s->steps[s->n_steps++] = *st;
    return 0;
}

/* Records a file input in s->files: its path, its stat and fingerprint
 * when it was read and the digest of the bytes read (fr hashed); its index
 * in *idx. */
static int push_file(struct kc__link_sess *s, const struct file_read *fr, size_t *idx)
{
    struct kc__dep *e = kc__deps_push(&s->files, fr->path, KC_DEP_FILE);
    if (e == NULL)
        return -ENOMEM;
    e->st = *fr->st;
    e->digest = fr->content;
    memcpy(e->fp, fr->fp, sizeof e->fp);
    *idx = s->files.n - 1;
    return 0;
}

/* The bytes of the file a host adds, read when it adds it (nvJitLink and
 * the driver read it then): 0 with *out (malloc'd, a NUL after the bytes),
 * *len and the file's stat. Anything but a regular file of 1 byte to
 * KC_LINK_MAX_INPUT that reads whole and unchanged is a negative errno:
 * the library is given the path and answers (missing, unreadable, a FIFO,
 * a directory, empty). Opened non-blocking, so a FIFO put in its place
 * cannot hang the host. */
static int read_input_file(const char *path, void **out, size_t *len, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return -errno;
    int rc = 0;
    unsigned char *buf = NULL;
    if (fstat(fd, st) != 0) {
        rc = -errno;
        goto done;
    }
    if (!S_ISREG(st->st_mode) || st->st_size <= 0 || (uint64_t)st->st_size > KC_LINK_MAX_INPUT) {
        rc = -EINVAL;
        goto done;
    }
    size_t n = (size_t)st->st_size, got = 0;
    if ((buf = malloc(n + 1)) == NULL) {
        rc = -ENOMEM;
        goto done;
    }
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -ESTALE;
            goto done;
        }
        got += (size_t)r;
    }
    /* Whole and unchanged: nothing past the end, the same size and times. */
    unsigned char extra;
    struct stat after;
    if (pread(fd, &extra, 1, (off_t)n) != 0 || fstat(fd, &after) != 0 ||
        after.st_size != st->st_size || after.st_mtim.tv_sec != st->st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != st->st_mtim.tv_nsec ||
        after.st_ctim.tv_sec != st->st_ctim.tv_sec ||
        after.st_ctim.tv_nsec != st->st_ctim.tv_nsec) {
        rc = -ESTALE;
        goto done;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    buf = NULL;
done:
    free(buf);
    close(fd);
    return rc;
}

/* Keeps a copy of the input for the real handle. A file's bytes (read at
 * the add, in->data) are taken over: freed with the session, or now when
 * the call fails. */
static int defer(struct kc__link_sess *s, const struct kc__link_input *in)
{
    if (s->n_def == s->cap_def) {
        size_t cap = s->cap_def ? s->cap_def * 2 : 8;
        struct kc__link_input *v = realloc(s->def, cap * sizeof *v);
        if (v == NULL) {
            if (in->by_file)
                free((void *)in->data);
            return -ENOMEM;
        }
        s->def = v;
        s->cap_def = cap;
    }
    struct kc__link_input c = *in;
    c.name = NULL;
    c.data = NULL;
    c.opt = NULL;
    c.val = NULL;
    int failed = 0;
    if (in->name != NULL && (c.name = strdup(in->name)) == NULL)
        failed = 1;
    if (in->by_file) {
        c.data = in->data;
    } else {
        /* A NUL after the bytes: nvJitLink reads PTX given without one as a
         * string, up to the first NUL (in the host's buffer, one past its
         * end, which a host that passes PTX so has made a NUL). */
        char *d = malloc(in->size + 1);
        if (d != NULL) {
            memcpy(d, in->data, in->size);
            d[in->size] = 0;
        } else {
            failed = 1;
        }
        c.data = d;
    }
    if (in->n_opt > 0) {
        c.opt = malloc(in->n_opt * sizeof *c.opt);
        c.val = malloc(in->n_opt * sizeof *c.val);
        if (c.opt != NULL && c.val != NULL) {
            memcpy(c.opt, in->opt, in->n_opt * sizeof *c.opt);
            memcpy(c.val, in->val, in->n_opt * sizeof *c.val);
        } else {
            failed = 1;
        }
    }
    if (failed) {
        input_free(&c);
        return -ENOMEM;
    }
    s->def[s->n_def++] = c;
    return 0;
}

/* Whether the step whose marker (data) or manifest (file) the store holds
 * is known: the chain after it is *p (for a file, set from fr, the bytes
 * read, which are hashed on the way if no fingerprint names them). Takes
 * the step's lock when it is not (waiting for a holder, then looking
 * again). */
static bool step_known(struct kc__link_sess *s, bool by_file, const kc_digest *base, kc_digest *p,
                       struct file_read *fr)
{
    const struct kc_config *cfg = kc__config();
    if (cfg->recache)
        return false;
    for (int attempt = 0; attempt < 2; attempt++) {
        bool known = false;
        if (by_file) {
            known = file_known(s->ns, base, fr, p) == 0;
        } else {
            kc_key k = marker_key(p);
            void *body = NULL;
            size_t len = 0;
            if (st_get(s->ns, &k, &body, &len, NULL) == 0) {
                known = len == strlen(MARKER) && memcmp(body, MARKER, len) == 0;
                st_free(body);
                if (!known)
                    st_purge(s->ns, &k);
            }
        }
        if (known) {
            /* Served by the holder we waited for: its lock is not needed. */
            if (attempt > 0)
                release_locks(s);
            return true;
        }
        if (attempt > 0 || s->lock_fd >= 0 || __atomic_load_n(&held_steps, __ATOMIC_ACQUIRE) > 0 ||
            !store_ok())
            return false;
        bool waited = false;
        kc_digest id = derive(by_file ? base : p, "link-lock");
        int fd = kc__flight_acquire(&id, &waited);
        if (fd >= 0) {
            s->lock_fd = fd;
            __atomic_fetch_add(&held_steps, 1, __ATOMIC_ACQ_REL);
        }
        if (!waited)
            return false;
    }
    return false;
}

/* Gives the deferred inputs to the real handle, in order. */
static void give_deferred(struct kc__link_sess *s)
{
    if (s->def_given)
        return;
    s->def_given = true;
    uint64_t t0 = kc_mono_ns();
    for (size_t i = 0; i < s->n_def; i++) {
        int rc = s->ops->add(s, &s->def[i]);
        if (rc != s->ops->success && s->state != KC_LINK_PASS) {
            /* The library refuses now what it took when the step was
             * stored (a file changed meanwhile, no memory): the host had
             * its success; from here on the library answers. */
            kc_log(KC_LOG_INFO,
                   "%s: a deferred input was refused on replay (%d); "
                   "the link passes through",
                   s->ops->what, rc);
            s->why = KC_PASS_refused;
            s->state = KC_LINK_PASS;
        }
    }
    s->work_ns += kc_mono_ns() - t0;
}

void kc__link_materialize(struct kc__link_sess *s, bool for_good)
{
    if (s->state == KC_LINK_SERVED) {
        void *saved = s->ops->quiet_begin != NULL ? s->ops->quiet_begin(s) : NULL;
        give_deferred(s);
        s->ops->complete_quietly(s);
        if (s->ops->quiet_end != NULL)
            s->ops->quiet_end(s, saved);
        s->why = KC_PASS_order;
        s->state = KC_LINK_PASS;
        return;
    }
    if (s->state == KC_LINK_DEFER) {
        give_deferred(s);
        if (s->state == KC_LINK_DEFER)
            s->state = KC_LINK_LIVE;
    }
    if (for_good && s->state == KC_LINK_LIVE)
        s->state = KC_LINK_PASS;
    if (s->state == KC_LINK_PASS)
        release_locks(s);
}

void kc__link_pass(struct kc__link_sess *s, enum kc_pass_reason why)
{
    if (s->state != KC_LINK_PASS)
        s->why = why;
    kc__link_materialize(s, true);
}

int kc__link_add(struct kc__link_sess *s, const struct kc__link_input *in, bool usual)
{
    if (s->state == KC_LINK_SERVED)
        kc__link_pass(s, KC_PASS_order);
    else if (!usual || in->size > KC_LINK_MAX_INPUT)
        kc__link_pass(s, KC_PASS_input);
    if (s->state == KC_LINK_PASS)
        return s->ops->add(s, in);

    struct kc__link_step step = {.by_file = in->by_file};
    /* A file is read now, as the library would read it: the step is keyed
     * by those bytes and the real handle is given them (named by the path,
     * which nvJitLink and the driver treat as they treat the file), so a
     * file that changes or goes after the add changes nothing. */
    struct kc__link_input f = *in;
    struct stat fst;
    struct file_read fr = {.path = in->name, .st = &fst};
    if (in->by_file) {
        void *bytes = NULL;
        size_t len = 0;
        if (file_base(&s->prefix, in, &step.base) != 0 ||
            read_input_file(in->name, &bytes, &len, &fst) != 0) {
            /* Not a file we can read whole: the library answers. */
            kc__link_pass(s, KC_PASS_input);
            return s->ops->add(s, in);
        }
        f.data = fr.bytes = bytes;
        f.size = fr.len = len;
        kc__dep_fingerprint(&fst, fr.fp);
    } else if (data_step(&s->prefix, in, &step.p) != 0) {
        kc__link_pass(s, KC_PASS_internal);
        return s->ops->add(s, in);
    }

    if (s->wrec.b.len != 0) { /* input N: NAME, by its bytes */
        char nm[4200];
        snprintf(nm, sizeof nm, "%zu: %s", s->n_steps + 1, in->name ? in->name : "(unnamed)");
        kc_why_data(&s->wrec, "input", nm, f.data, f.size);
    }
    int rc;
    if (s->state == KC_LINK_DEFER) {
        if (step_known(s, in->by_file, &step.base, &step.p, &fr)) {
            step.known = 1;
            step.content = fr.content;
            if (in->by_file && push_file(s, &fr, &step.dep) != 0)
                goto pass;
            if (push_step(s, &step) != 0)
                goto pass;
            int drc = defer(s, &f); /* takes f.data */
            f.data = in->data;
            if (drc != 0) {
                s->n_steps--;
                goto pass;
            }
            s->prefix = step.p;
            return s->ops->success;
        }
        kc__link_materialize(s, false);
        if (s->state == KC_LINK_PASS)
            goto pass;
    }

    /* LIVE: the library adds, and the chain follows. */
    if (in->by_file) {
        file_hash(&fr);
        step.content = fr.content;
        step.p = file_result(&step.base, &step.content);
    }
    uint64_t t0 = kc_mono_ns();
    rc = s->ops->add(s, &f);
    s->work_ns += kc_mono_ns() - t0;
    if (f.data != in->data)
        free((void *)f.data);
    if (rc != s->ops->success) {
        /* A failed add is not cached: the link passes through. */
        s->why = KC_PASS_refused;
        s->state = KC_LINK_PASS;
        release_locks(s);
        return rc;
    }
    if ((in->by_file && push_file(s, &fr, &step.dep) != 0) || push_step(s, &step) != 0) {
        s->why = KC_PASS_internal;
        s->state = KC_LINK_PASS;
        release_locks(s);
        return rc;
    }
    s->prefix = step.p;
    return rc;
pass:
    /* The library answers from here on, and for this add as the host made
     * it. */
    if (f.data != in->data)
        free((void *)f.data);
    kc__link_pass(s, KC_PASS_internal);
    return s->ops->add(s, in);
}

/* ---- completion ------------------------------------------------------------------- */

static struct kc__lrec *lookup_record(struct kc__link_sess *s, uint64_t *saved_ns)
{
    kc_key k = record_key(&s->prefix);
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    if (st_get(s->ns, &k, &body, &len, &info) != 0)
        return NULL;
    struct kc__lrec *r = kc__lrec_decode(body, len);
    st_free(body);
    if (r == NULL || (r->api != KC_LREC_NVJITLINK && r->api != KC_LREC_CULINK)) {
        kc_log(KC_LOG_WARN, "a cached %s result could not be read; linking", s->ops->what);
        st_purge(s->ns, &k);
        kc__lrec_free(r);
        count((struct kc_counters){.errors = 1});
        return NULL;
    }
    *saved_ns = info.saved_ns;
    return r;
}

bool kc__link_complete_begin(struct kc__link_sess *s, uint64_t t_enter)
{
    (void)t_enter;
    if (s->state == KC_LINK_SERVED) {
        /* Completed again: the library's own answer for a second call. */
        kc__link_pass(s, KC_PASS_order);
        return false;
    }
    if (s->state == KC_LINK_PASS)
        return false;
    const struct kc_config *cfg = kc__config();
    uint64_t saved = 0;
    struct kc__lrec *r = NULL;
    if (!cfg->recache) {
        r = lookup_record(s, &saved);
        if (r == NULL && s->lock_fd < 0 && __atomic_load_n(&held_steps, __ATOMIC_ACQUIRE) == 0 &&
            store_ok()) {
            bool waited = false;
            kc_digest id = derive(&s->prefix, "link-final-lock");
            s->final_fd = kc__flight_acquire(&id, &waited);
            if (s->final_fd >= 0 || waited)
                r = lookup_record(s, &saved);
        }
    }
    if (r != NULL) {
        kc__lrec_free(s->served);
        s->served = r;
        s->state = KC_LINK_SERVED;
        release_locks(s);
        count((struct kc_counters){.hits = 1, .saved_ns = saved});
        return true;
    }
    kc__link_materialize(s, false);
    return false;
}

static int store_all(struct kc__link_sess *s, const struct kc__lrec *rec, uint64_t work_ns)
{
    void *body = NULL;
    size_t len = 0;
    if (kc__lrec_encode(rec, &body, &len) != 0)
        return -ENOMEM;
    /* The record first: a process that sees the steps finds it. */
    kc_key k = record_key(&s->prefix);
    int rc = st_put(s->ns, &k, KC_KIND_JIT, body, len, work_ns);
    free(body);
    for (size_t i = 0; i < s->n_steps && rc == 0; i++) {
        const struct kc__link_step *st = &s->steps[i];
        if (st->by_file) {
            /* Known ones too: the file's fingerprint is refreshed. */
            rc = file_manifest_add(s->ns, &st->base, &st->p, &s->files.v[st->dep]);
        } else if (!st->known) {
            kc_key mk = marker_key(&st->p);
            rc = st_put(s->ns, &mk, KC_KIND_BLOB, MARKER, strlen(MARKER), 0);
        }
    }
    return rc;
}

void kc__link_complete_end(struct kc__link_sess *s, int rc, struct kc__lrec *rec, bool cacheable,
                           uint64_t took_ns)
{
    if (s->state != KC_LINK_LIVE) {
        count((struct kc_counters){.passthrough = 1});
        kc__pass_reason(BACKEND, s->why);
        kc__lrec_free(rec);
        release_locks(s);
        return;
    }
    const struct kc_config *cfg = kc__config();
    struct kc_counters c = {.misses = 1, .compile_ns = s->work_ns + took_ns};
    struct kc_store *st;
    if (cacheable && !cfg->readonly && store(&st) != NULL) {
        if (rec == NULL) {
            c.errors = 1;
            kc_log_once(KC_LOG_WARN, "cannot capture a %s result; continuing uncached",
                        s->ops->what);
        } else {
            int prc = store_all(s, rec, s->work_ns + took_ns);
            if (prc == 0) {
                c.stores = 1;
            } else {
                c.errors = 1;
                if (prc != -EDQUOT)
                    kc_log_once(KC_LOG_WARN, "cannot store a %s result (%s); continuing uncached",
                                s->ops->what, strerror(-prc));
            }
        }
    }
    (void)rc;
    if (s->wrec.b.len != 0 && store(&st) != NULL) {
        kc_key k = record_key(&s->prefix);
        kc__why_finish(&s->wrec, &k.id, k.build,
                       !cacheable      ? "the link was not cacheable"
                       : c.stores      ? NULL
                       : cfg->readonly ? "the store is read-only"
                                       : "the store refused it",
                       c.compile_ns, s->why_refused);
        s->wrec = (struct kc_why){0};
    }
    kc__lrec_free(rec);
    count(c);
    /* After the puts: waiters find them. The session stays LIVE for the
     * library's answers; nothing more is stored for it. */
    release_locks(s);
    s->state = KC_LINK_PASS;
}

/* ---- nvJitLink: the real functions ---------------------------------------------------- */

/* Every function of nvJitLink the shim knows: X(enum, name after "nvJitLink").
 * F_VERSION has no versioned names. */
#define JL_FUNCS(X, a)                                                                             \
    X(F_CREATE, Create, a)                                                                         \
    X(F_DESTROY, Destroy, a)                                                                       \
    X(F_ADD_DATA, AddData, a)                                                                      \
    X(F_ADD_FILE, AddFile, a)                                                                      \
    X(F_COMPLETE, Complete, a)                                                                     \
    X(F_CUBIN_SIZE, GetLinkedCubinSize, a)                                                         \
    X(F_CUBIN, GetLinkedCubin, a)                                                                  \
    X(F_PTX_SIZE, GetLinkedPtxSize, a)                                                             \
    X(F_PTX, GetLinkedPtx, a)                                                                      \
    X(F_LTOIR_SIZE, GetLinkedLTOIRSize, a)                                                         \
    X(F_LTOIR, GetLinkedLTOIR, a)                                                                  \
    X(F_ERR_SIZE, GetErrorLogSize, a)                                                              \
    X(F_ERR, GetErrorLog, a)                                                                       \
    X(F_INFO_SIZE, GetInfoLogSize, a)                                                              \
    X(F_INFO, GetInfoLog, a)

enum jl_fn {
#define JL_ENUM(e, n, a) e,
    JL_FUNCS(JL_ENUM, 0)
#undef JL_ENUM
        F_VERSION,
    N_F
};

/* The releases whose nvJitLink.h has its inline functions call versioned
 * names, __nvJitLink<Fn>_<major>_<minor>: a library exports those of every
 * release of its major up to its own (12.9: _12_0 ... _12_9; 13.5: _13_0
 * ... _13_5). A new release is one more entry here; one this build does
 * not list is taken by pattern into a spare slot (jl_pattern_hook). The
 * versioned names of one release differ from the unversioned ones only in
 * the release whose enums the caller was built with, so a name's release
 * is part of a link's key and the record is captured through its getters.
 * X(release, arg). */
#define JL_RELEASES(X, a)                                                                          \
    X(12_0, a)                                                                                     \
    X(12_1, a)                                                                                     \
    X(12_2, a)                                                                                     \
    X(12_3, a)                                                                                     \
    X(12_4, a)                                                                                     \
    X(12_5, a)                                                                                     \
    X(12_6, a)                                                                                     \
    X(12_7, a)                                                                                     \
    X(12_8, a)                                                                                     \
    X(12_9, a)                                                                                     \
    X(13_0, a)                                                                                     \
    X(13_1, a)                                                                                     \
    X(13_2, a)                                                                                     \
    X(13_3, a)                                                                                     \
    X(13_4, a)                                                                                     \
    X(13_5, a)
/* Spare slots for releases later than the table: the first N_SLOT of them a
 * process meets get one each; names of any further one are not hooked. */
#define JL_SLOTS(X, a) X(0, a) X(1, a) X(2, a) X(3, a)

/* Name variants: 0 the unversioned name, then each release, then the slots. */
enum {
    JL_V_NONE = 0,
#define JL_REL_ENUM(r, a) JL_V_##r,
    JL_RELEASES(JL_REL_ENUM, 0)
#undef JL_REL_ENUM
        JL_V_SLOT0,
    N_SLOT = 4, /* JL_SLOTS' length */
    N_V = JL_V_SLOT0 + N_SLOT
};

/* [function][name variant]. */
static void *jl_real[N_F][N_V];

#define JL_VNAME(r, fn) "__nvJitLink" #fn "_" #r,
#define JL_NAMES(e, fn, a) [e] = {"nvJitLink" #fn, JL_RELEASES(JL_VNAME, fn)},
static const char *const jl_names[N_F][JL_V_SLOT0] = {
    JL_FUNCS(JL_NAMES, 0)[F_VERSION] = {"nvJitLinkVersion"},
};
#undef JL_NAMES
#undef JL_VNAME

/* A slot's release ("13_6") once taken, and its names and hooks. */
static char jl_slot_rel[N_SLOT][16];
static char jl_slot_names[N_SLOT][N_F][64];
static struct kc__hook jl_slot_hooks[N_SLOT][N_F];
static int jl_slots_used;
static pthread_mutex_t jl_slot_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *jl_name(enum jl_fn f, int v)
{
    if (v < JL_V_SLOT0)
        return jl_names[f][v];
    int k = v - JL_V_SLOT0;
    return k < __atomic_load_n(&jl_slots_used, __ATOMIC_ACQUIRE) && f != F_VERSION
               ? jl_slot_names[k][f]
               : NULL;
}

typedef nvJitLinkResult (*create_fn)(nvJitLinkHandle *, uint32_t, const char *const *);
typedef nvJitLinkResult (*destroy_fn)(nvJitLinkHandle *);
typedef nvJitLinkResult (*add_data_fn)(nvJitLinkHandle, nvJitLinkInputType, const void *, size_t,
                                       const char *);
typedef nvJitLinkResult (*add_file_fn)(nvJitLinkHandle, nvJitLinkInputType, const char *);
typedef nvJitLinkResult (*complete_fn)(nvJitLinkHandle);
typedef nvJitLinkResult (*size_fn)(nvJitLinkHandle, size_t *);
typedef nvJitLinkResult (*get_fn)(nvJitLinkHandle, void *);
typedef nvJitLinkResult (*version_fn)(unsigned *, unsigned *);

/* The real function `f` under name variant v: found when the host got our
 * wrapper through dlsym, else the next definition after us, else in the
 * nvJitLink some other real function came from (a host that dlopen'd it
 * privately and never asked for this name). NULL: that library has no such
 * name. */
static void *jl_fn_get(enum jl_fn f, int v)
{
    void *p = __atomic_load_n(&jl_real[f][v], __ATOMIC_ACQUIRE);
    const char *name = jl_name(f, v);
    if (p != NULL || name == NULL)
        return p;
    const struct kc__hook *h = kc__hook_find(name, KC_LIB_NVJITLINK);
    if (h != NULL && (p = kc__hook_real(h)) != NULL)
        return p;
    void *known = NULL;
    for (int g = 0; g < N_F && known == NULL; g++)
        for (int w = 0; w < N_V && known == NULL; w++)
            known = __atomic_load_n(&jl_real[g][w], __ATOMIC_ACQUIRE);
    Dl_info info;
    if (known == NULL || dladdr(known, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL)
        return NULL;
    p = kc__real_dlsym(lib, name);
    dlclose(lib);
    if (p != NULL) {
        void *expected = NULL;
        __atomic_compare_exchange_n(&jl_real[f][v], &expected, p, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    return p;
}

/* Function f of the nvJitLink the host uses, by its unversioned name. */
static void *jl_any(enum jl_fn f)
{
    return jl_fn_get(f, JL_V_NONE);
}

/* Function f under the name variant v a session was created with (the
 * release of the header its host was built with), else unversioned. */
static void *jl_for(enum jl_fn f, int v)
{
    void *p = v != JL_V_NONE ? jl_fn_get(f, v) : NULL;
    return p != NULL ? p : jl_any(f);
}

/* Splits "__nvJitLink<Fn>_<major>_<minor>" into its function and release
 * ("13_6"). Returns false for any other name. */
static bool jl_parse_versioned(const char *name, enum jl_fn *f, char rel[16])
{
    static const char pfx[] = "__nvJitLink";
    if (strncmp(name, pfx, sizeof pfx - 1) != 0)
        return false;
    const char *fn = name + sizeof pfx - 1;
    for (int g = 0; g < F_VERSION; g++) {
        const char *base = jl_names[g][0] + strlen("nvJitLink");
        size_t n = strlen(base);
        if (strncmp(fn, base, n) != 0 || fn[n] != '_')
            continue;
        const char *r = fn + n + 1, *q = r;
        int parts = 0;
        while (*q != '\0') {
            if (*q < '0' || *q > '9')
                break;
            while (*q >= '0' && *q <= '9')
                q++;
            parts++;
            if (*q == '_' && parts == 1)
                q++;
        }
        if (*q != '\0' || parts != 2 || q - r >= 16)
            continue;
        *f = (enum jl_fn)g;
        memcpy(rel, r, (size_t)(q - r) + 1);
        return true;
    }
    return false;
}

/* ---- nvJitLink: identity, options --------------------------------------------------- */

struct jl_identity {
    int state; /* 0 unknown, 1 known, -1 failed */
    kc_digest digest;
    char tag[64];      /* "<major>.<minor>-<16 hex>" */
    char unknown[128]; /* an entry point it exports that kcache does not know, or "" */
};

/* kc__loaded_exports' callback: stops at the first name that is neither a
 * function of jl_names (either name, or a versioned one of any release)
 * nor __nvJitLinkAPI, copying it to arg. */
static int jl_export_known(const char *name, void *arg)
{
    for (int f = 0; f < N_F; f++)
        if (strcmp(jl_names[f][0], name) == 0)
            return 0;
    enum jl_fn f;
    char rel[16];
    if (strcmp(name, "__nvJitLinkAPI") == 0 || jl_parse_versioned(name, &f, rel))
        return 0;
    snprintf(arg, 128, "%s", name);
    return 1;
}
static struct jl_identity jl_ident;
static pthread_mutex_t jl_ident_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct jl_identity *jl_identity(void *real_create)
{
    if (__atomic_load_n(&jl_ident.state, __ATOMIC_ACQUIRE) != 0)
        return jl_ident.state > 0 ? &jl_ident : NULL;
    pthread_mutex_lock(&jl_ident_lock);
    if (jl_ident.state == 0) {
        unsigned major = 0, minor = 0;
        version_fn ver = (version_fn)jl_any(F_VERSION);
        if (ver != NULL)
            ver(&major, &minor);
        kc_digest lib;
        struct kc__hasher *h = kc__hasher_new();
        int state = -1;
        if (h != NULL && kc__loaded_identity(real_create, &lib) == 0) {
            kc__hash_str(h, "nvjitlink-identity");
            kc__hash_u64(h, (uint64_t)major << 32 | minor);
            kc__hash_bytes(h, &lib, sizeof lib);
            jl_ident.digest = kc__hash_digest(h);
            snprintf(jl_ident.tag, sizeof jl_ident.tag, "%u.%u-%016llx", major, minor,
                     (unsigned long long)jl_ident.digest.lo);
            state = 1;
            /* Forward safety: an entry point this build does not know may
             * be a getter a record could not answer. */
            if (kc__loaded_exports(real_create, jl_export_known, jl_ident.unknown) < 0)
                snprintf(jl_ident.unknown, sizeof jl_ident.unknown, "(its symbol table)");
            if (jl_ident.unknown[0] != '\0')
                kc_log(KC_LOG_INFO,
                       "nvJitLink %u.%u exports %s, which this kcache does not know; "
                       "its links pass through uncached",
                       major, minor, jl_ident.unknown);
        } else {
            kc_log(KC_LOG_WARN, "cannot identify the nvJitLink library; its links are not cached");
        }
        kc__hasher_free(h);
        __atomic_store_n(&jl_ident.state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&jl_ident_lock);
    return jl_ident.state > 0 ? &jl_ident : NULL;
}

/* Options whose effect is not only the output: -time puts timings in the
 * info log. Such links pass through. */
static bool jl_side_effect(const char *o)
{
    return strcmp(o, "-time") == 0 || strcmp(o, "--time") == 0;
}

/* The -arch value (the last one), as a namespace-safe tag. */
static void jl_arch(uint32_t n, const char *const *opts, char *out, size_t len)
{
    snprintf(out, len, "noarch");
    for (uint32_t i = 0; i < n; i++) {
        const char *o = opts[i];
        const char *v = NULL;
        if (strncmp(o, "-arch=", 6) == 0)
            v = o + 6;
        else if (strncmp(o, "--arch=", 7) == 0)
            v = o + 7;
        if (v == NULL)
            continue;
        size_t k = 0;
        for (; v[k] != 0 && k + 1 < len && k < 24; k++) {
            char c = v[k];
            out[k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
                         ? c
                         : '_';
        }
        out[k] = 0;
    }
}

/* ---- nvJitLink: the engine's operations --------------------------------------------- */

/* The name variant a session's handle was created through (its priv). */
static int jl_sess_v(const struct kc__link_sess *s)
{
    return s->priv != NULL ? *(const int *)s->priv : JL_V_NONE;
}

static int jl_add(struct kc__link_sess *s, const struct kc__link_input *in)
{
    if (in->by_file && in->data != NULL) {
        /* A file's bytes as read at the add, under its path: nvJitLink
         * reads a file and adds its bytes so named (the same link, logs and
         * codes for every input type, measured: docs/internals.md), of
         * the release the host's handle was made through. */
        add_data_fn f = (add_data_fn)jl_for(F_ADD_DATA, jl_sess_v(s));
        return f ? f(s->h, in->type, in->data, in->size, in->name) : NVJITLINK_ERROR_INTERNAL;
    }
    if (in->by_file) {
        add_file_fn f =
            in->real ? (add_file_fn)in->real : (add_file_fn)jl_for(F_ADD_FILE, jl_sess_v(s));
        return f ? f(s->h, in->type, in->name) : NVJITLINK_ERROR_INTERNAL;
    }
    add_data_fn f =
        in->real ? (add_data_fn)in->real : (add_data_fn)jl_for(F_ADD_DATA, jl_sess_v(s));
    return f ? f(s->h, in->type, in->data, in->size, in->name) : NVJITLINK_ERROR_INTERNAL;
}

static void jl_complete_quietly(struct kc__link_sess *s)
{
    complete_fn f = (complete_fn)jl_for(F_COMPLETE, jl_sess_v(s));
    if (f != NULL)
        f(s->h);
}

static const struct kc__link_ops jl_ops = {
    .what = "nvJitLink",
    .success = NVJITLINK_SUCCESS,
    .add = jl_add,
    .complete_quietly = jl_complete_quietly,
};

/* Codes worth replaying: success and the link's own verdicts on its
 * inputs; never an internal error, a thread-pool failure or memory. */
static bool jl_cacheable(int rc)
{
    switch (rc) {
    case NVJITLINK_SUCCESS:
    case NVJITLINK_ERROR_INVALID_INPUT:
    case NVJITLINK_ERROR_PTX_COMPILE:
    case NVJITLINK_ERROR_NVVM_COMPILE:
    case NVJITLINK_ERROR_UNRECOGNIZED_INPUT:
    case NVJITLINK_ERROR_FINALIZE:
    case NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS:
    case NVJITLINK_ERROR_INCORRECT_INPUT_TYPE:
    case NVJITLINK_ERROR_ARCH_MISMATCH:
    case NVJITLINK_ERROR_OUTDATED_LIBRARY:
    case NVJITLINK_ERROR_MISSING_FATBIN:
    case NVJITLINK_ERROR_UNRECOGNIZED_ARCH:
    case NVJITLINK_ERROR_UNSUPPORTED_ARCH:
    case NVJITLINK_ERROR_LTO_NOT_ENABLED:
        return true;
    default:
        return false;
    }
}

/* What one getter pair returns on the completed handle: with NULL, the
 * size (and whether it was written), the bytes. */
static int capture_output(nvJitLinkHandle h, size_fn sz, get_fn g, struct kc__lout *o)
{
    if (sz == NULL || g == NULL) {
        /* Not in this nvJitLink: a host cannot call it either. */
        o->size_rc = o->get_rc = o->size_null_rc = o->get_null_rc = NVJITLINK_ERROR_INTERNAL;
        return 0;
    }
    const size_t s1 = (size_t)0x5a5a5a5a5a5a5a5aull, s2 = (size_t)0xa5a5a5a5a5a5a5a5ull;
    o->size_null_rc = sz(h, NULL);
    o->get_null_rc = g(h, NULL);
    size_t n = s1;
    o->size_rc = sz(h, &n);
    o->size_set = 1;
    if (n == s1) {
        n = s2;
        sz(h, &n);
        o->size_set = n != s2;
        if (!o->size_set)
            n = 0;
    }
    o->size = n;
    if (o->size_rc == NVJITLINK_SUCCESS && o->size_set && n > 0 && n < (1ull << 34)) {
        o->bytes = malloc(n + 1);
        if (o->bytes == NULL)
            return -ENOMEM;
        o->get_rc = g(h, o->bytes);
        o->nbytes = n;
        return 0;
    }
    /* No usable size: what the getter writes into a small buffer, found
     * with two fill patterns. */
    unsigned char a[64], b[64];
    memset(a, 0x5a, sizeof a);
    memset(b, 0xa5, sizeof b);
    o->get_rc = g(h, a);
    g(h, b);
    size_t w = 0;
    for (size_t i = 0; i < sizeof a; i++)
        if (a[i] != 0x5a || b[i] != 0xa5)
            w = i + 1;
    if (w > 0) {
        if ((o->bytes = malloc(w + 1)) == NULL)
            return -ENOMEM;
        memcpy(o->bytes, a, w);
        o->nbytes = w;
    }
    return 0;
}

static struct kc__lrec *jl_capture(nvJitLinkHandle h, int rc, int v)
{
    struct kc__lrec *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->api = KC_LREC_NVJITLINK;
    r->complete_rc = rc;
    static const enum jl_fn pairs[N_LOUT][2] = {
        [LOUT_CUBIN] = {F_CUBIN_SIZE, F_CUBIN},  [LOUT_PTX] = {F_PTX_SIZE, F_PTX},
        [LOUT_LTOIR] = {F_LTOIR_SIZE, F_LTOIR},  [LOUT_ERROR_LOG] = {F_ERR_SIZE, F_ERR},
        [LOUT_INFO_LOG] = {F_INFO_SIZE, F_INFO},
    };
    for (int i = 0; i < N_LOUT; i++) {
        if (capture_output(h, (size_fn)jl_for(pairs[i][0], v), (get_fn)jl_for(pairs[i][1], v),
                           &r->out[i]) != 0) {
            kc__lrec_free(r);
            return NULL;
        }
    }
    /* The record must decode: it is checked as it will be on a hit. */
    void *body = NULL;
    size_t len = 0;
    struct kc__lrec *back = NULL;
    if (kc__lrec_encode(r, &body, &len) == 0)
        back = kc__lrec_decode(body, len);
    free(body);
    if (back == NULL) {
        kc__lrec_free(r);
        return NULL;
    }
    kc__lrec_free(back);
    return r;
}

/* ---- nvJitLink: the hooks ------------------------------------------------------------ */

static nvJitLinkResult do_create(int v, nvJitLinkHandle *handle, uint32_t n,
                                 const char *const *opts)
{
    create_fn real = (create_fn)jl_fn_get(F_CREATE, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    if (kc__guard_held() || !kc__link_enabled())
        return real(handle, n, opts);
    kc__guard_enter();
    nvJitLinkResult rc = real(handle, n, opts);
    if (rc != NVJITLINK_SUCCESS || handle == NULL || *handle == NULL)
        goto out;
    const struct jl_identity *id = jl_identity((void *)real);
    if (id == NULL)
        goto out;
    bool cacheable = (n == 0 || opts != NULL) && id->unknown[0] == '\0';
    enum kc_pass_reason why = id->unknown[0] != '\0' ? KC_PASS_unknown_export : KC_PASS_input;
    for (uint32_t i = 0; cacheable && i < n; i++)
        if (opts[i] == NULL || jl_side_effect(opts[i]))
            cacheable = false, why = opts[i] == NULL ? KC_PASS_input : KC_PASS_option;
    struct kc__hasher *h = kc__link_hasher("nvJitLink");
    if (h == NULL)
        goto out;
    kc__hash_bytes(h, &id->digest, sizeof id->digest);
    /* The release whose names the host calls (none: unversioned). */
    kc__hash_str(h, v == JL_V_NONE ? NULL : jl_name(F_CREATE, v));
    kc__hash_u64(h, n);
    for (uint32_t i = 0; cacheable && i < n; i++)
        kc__hash_str(h, opts[i]);
    kc_digest p0 = kc__hash_digest(h);
    kc__hasher_free(h);
    char arch[32], ns[128];
    jl_arch(cacheable ? n : 0, opts, arch, sizeof arch);
    snprintf(ns, sizeof ns, "link:%.63s-%.31s-f%d", id->tag, arch, KC_FORMAT_VERSION);
    int *sv = malloc(sizeof *sv);
    if (sv != NULL) {
        *sv = v;
        kc__link_new(*handle, &jl_ops, ns, &p0, cacheable, why, sv);
        struct kc__link_sess *s = cacheable ? kc__link_get(*handle, &jl_ops) : NULL;
        if (s != NULL) { /* the start of its miss record */
            char ver[96];
            snprintf(ver, sizeof ver, "nvJitLink %.64s", id->tag);
            kc_why_begin(&s->wrec, "link", "(nvJitLink)", &p0);
            kc__why_library(&s->wrec, "nvJitLink", (const void *)real, &id->digest, ver);
            for (uint32_t i = 0; i < n; i++)
                kc_why_add(&s->wrec, "option", "", NULL, opts[i]);
            s->why_refused = kc__why_refused();
            kc__link_put(s);
        }
    }
out:
    kc__guard_exit();
    return rc;
}

static nvJitLinkResult do_destroy(int v, nvJitLinkHandle *handle)
{
    destroy_fn real = (destroy_fn)jl_fn_get(F_DESTROY, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    if (kc__guard_held())
        return real(handle);
    struct kc__link_sess *s = handle != NULL ? kc__link_take(*handle, &jl_ops) : NULL;
    kc__guard_enter();
    nvJitLinkResult rc = real(handle);
    kc__guard_exit();
    if (s != NULL) {
        if (rc != NVJITLINK_SUCCESS)
            kc__link_restore(s);
        else
            kc__link_put(s);
    }
    return rc;
}

static bool jl_type_usual(int t)
{
    return t >= NVJITLINK_INPUT_CUBIN && t <= NVJITLINK_INPUT_INDEX;
}

static nvJitLinkResult do_add(int v, nvJitLinkHandle handle, nvJitLinkInputType type,
                              const void *data, size_t size, const char *name)
{
    add_data_fn real = (add_data_fn)jl_fn_get(F_ADD_DATA, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(handle, &jl_ops);
    if (s == NULL)
        return real(handle, type, data, size, name);
    kc__guard_enter();
    struct kc__link_input in = {
        .type = type, .name = (char *)name, .data = data, .size = size, .real = (void *)real};
    nvJitLinkResult rc = kc__link_add(s, &in, data != NULL && size > 0 && jl_type_usual(type));
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

static nvJitLinkResult do_complete(int v, nvJitLinkHandle handle)
{
    complete_fn real = (complete_fn)jl_fn_get(F_COMPLETE, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(handle, &jl_ops);
    if (s == NULL)
        return real(handle);
    kc__guard_enter();
    uint64_t t0 = kc_mono_ns();
    nvJitLinkResult rc;
    if (kc__link_complete_begin(s, t0)) {
        rc = s->served->complete_rc;
    } else {
        bool live = s->state == KC_LINK_LIVE;
        uint64_t c0 = kc_mono_ns();
        rc = real(handle);
        uint64_t took = kc_mono_ns() - c0;
        bool cacheable = live && jl_cacheable(rc);
        struct kc__lrec *rec = cacheable ? jl_capture(handle, rc, v) : NULL;
        kc__link_complete_end(s, rc, rec, cacheable, took);
    }
    if (kc__log_enabled(KC_LOG_DEBUG))
        kc_log(KC_LOG_DEBUG, "nvJitLink complete: %.3f ms in the hook (%s)",
               (kc_mono_ns() - t0) / 1e6, s->state == KC_LINK_SERVED ? "hit" : "linked");
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

static nvJitLinkResult serve_size(int f, int v, int which, nvJitLinkHandle handle, size_t *ret)
{
    size_fn real = (size_fn)jl_fn_get(f, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(handle, &jl_ops);
    if (s == NULL)
        return real(handle, ret);
    nvJitLinkResult rc;
    if (s->state == KC_LINK_SERVED) {
        const struct kc__lout *o = &s->served->out[which];
        rc = ret == NULL ? o->size_null_rc : o->size_rc;
        if (ret != NULL && o->size_set)
            *ret = o->size;
    } else {
        kc__guard_enter();
        if (s->state == KC_LINK_DEFER && s->n_def > 0)
            kc__link_materialize(s, false);
        rc = real(handle, ret);
        kc__guard_exit();
    }
    kc__link_put(s);
    return rc;
}

static nvJitLinkResult serve_get(int f, int v, int which, nvJitLinkHandle handle, void *dst)
{
    get_fn real = (get_fn)jl_fn_get(f, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(handle, &jl_ops);
    if (s == NULL)
        return real(handle, dst);
    nvJitLinkResult rc;
    if (s->state == KC_LINK_SERVED) {
        const struct kc__lout *o = &s->served->out[which];
        if (dst == NULL) {
            rc = o->get_null_rc;
        } else {
            if (o->nbytes > 0)
                memcpy(dst, o->bytes, o->nbytes);
            rc = o->get_rc;
        }
    } else {
        kc__guard_enter();
        if (s->state == KC_LINK_DEFER && s->n_def > 0)
            kc__link_materialize(s, false);
        rc = real(handle, dst);
        kc__guard_exit();
    }
    kc__link_put(s);
    return rc;
}

/* AddFile is spelled out: a NULL path must reach the real AddFile. */
static nvJitLinkResult do_add_file(int v, nvJitLinkHandle handle, nvJitLinkInputType type,
                                   const char *path)
{
    add_file_fn real = (add_file_fn)jl_fn_get(F_ADD_FILE, v);
    if (real == NULL)
        return NVJITLINK_ERROR_INTERNAL;
    struct kc__link_sess *s = kc__guard_held() ? NULL : kc__link_get(handle, &jl_ops);
    if (s == NULL)
        return real(handle, type, path);
    kc__guard_enter();
    struct kc__link_input in = {
        .by_file = 1, .type = type, .name = (char *)path, .real = (void *)real};
    nvJitLinkResult rc = kc__link_add(s, &in, path != NULL && path[0] != 0 && jl_type_usual(type));
    kc__guard_exit();
    kc__link_put(s);
    return rc;
}

/* Every name of every function: the unversioned one, which cuda.bindings
 * resolves with dlsym, and each release's versioned one, which that
 * release's nvJitLink.h inline functions call; a program built against any
 * of them binds to ours. JL_WRAPPERS(qualifier, name macro, its argument,
 * variant) defines one set. */
#define JL_GETTERS(Q, N, r, v, G, T, fg, which)                                                    \
    Q nvJitLinkResult N(G##Size, r)(nvJitLinkHandle handle, size_t * size)                         \
    {                                                                                              \
        return serve_size(fg##_SIZE, v, which, handle, size);                                      \
    }                                                                                              \
    Q nvJitLinkResult N(G, r)(nvJitLinkHandle handle, T out)                                       \
    {                                                                                              \
        return serve_get(fg, v, which, handle, out);                                               \
    }
#define JL_WRAPPERS(Q, N, r, v)                                                                    \
    Q nvJitLinkResult N(Create, r)(nvJitLinkHandle * handle, uint32_t numOptions,                  \
                                   const char *const *options)                                     \
    {                                                                                              \
        return do_create(v, handle, numOptions, options);                                          \
    }                                                                                              \
    Q nvJitLinkResult N(Destroy, r)(nvJitLinkHandle * handle)                                      \
    {                                                                                              \
        return do_destroy(v, handle);                                                              \
    }                                                                                              \
    Q nvJitLinkResult N(AddData, r)(nvJitLinkHandle handle, nvJitLinkInputType inputType,          \
                                    const void *data, size_t size, const char *name)               \
    {                                                                                              \
        return do_add(v, handle, inputType, data, size, name);                                     \
    }                                                                                              \
    Q nvJitLinkResult N(AddFile, r)(nvJitLinkHandle handle, nvJitLinkInputType inputType,          \
                                    const char *fileName)                                          \
    {                                                                                              \
        return do_add_file(v, handle, inputType, fileName);                                        \
    }                                                                                              \
    Q nvJitLinkResult N(Complete, r)(nvJitLinkHandle handle)                                       \
    {                                                                                              \
        return do_complete(v, handle);                                                             \
    }                                                                                              \
    JL_GETTERS(Q, N, r, v, GetLinkedCubin, void *, F_CUBIN, LOUT_CUBIN)                            \
    JL_GETTERS(Q, N, r, v, GetLinkedPtx, char *, F_PTX, LOUT_PTX)                                  \
    JL_GETTERS(Q, N, r, v, GetLinkedLTOIR, void *, F_LTOIR, LOUT_LTOIR)                            \
    JL_GETTERS(Q, N, r, v, GetErrorLog, char *, F_ERR, LOUT_ERROR_LOG)                             \
    JL_GETTERS(Q, N, r, v, GetInfoLog, char *, F_INFO, LOUT_INFO_LOG)

#define JL_PLAIN_NAME(fn, r) nvJitLink##fn
#define JL_REL_NAME(fn, r) __nvJitLink##fn##_##r
#define JL_SLOT_NAME(fn, k) jl_slot_##fn##_##k
#define JL_REL_WRAPPERS(r, a) JL_WRAPPERS(KC_EXPORT, JL_REL_NAME, r, JL_V_##r)
#define JL_SLOT_WRAPPERS(k, a) JL_WRAPPERS(static, JL_SLOT_NAME, k, JL_V_SLOT0 + k)
JL_WRAPPERS(KC_EXPORT, JL_PLAIN_NAME, -, JL_V_NONE)
JL_RELEASES(JL_REL_WRAPPERS, 0)
JL_SLOTS(JL_SLOT_WRAPPERS, 0)

/* The slots' wrappers, [slot][function]. */
#define JL_SLOT_FN(e, fn, k) [e] = (void *)JL_SLOT_NAME(fn, k),
#define JL_SLOT_ROW(k, a) [k] = {JL_FUNCS(JL_SLOT_FN, k)},
static void *const jl_slot_fns[N_SLOT][N_F] = {JL_SLOTS(JL_SLOT_ROW, 0)};

const struct kc__hook *kc__link_hook_pattern(const char *name)
{
    enum jl_fn f;
    char rel[16];
    if (name == NULL || !jl_parse_versioned(name, &f, rel))
        return NULL;
    pthread_mutex_lock(&jl_slot_lock);
    int k = 0;
    while (k < jl_slots_used && strcmp(jl_slot_rel[k], rel) != 0)
        k++;
    if (k == jl_slots_used && k < N_SLOT) {
        /* A release this build does not list: its names take slot k. */
        snprintf(jl_slot_rel[k], sizeof jl_slot_rel[k], "%s", rel);
        for (int g = 0; g < F_VERSION; g++) {
            snprintf(jl_slot_names[k][g], sizeof jl_slot_names[k][g], "__%s_%s", jl_names[g][0],
                     rel);
            jl_slot_hooks[k][g] = (struct kc__hook){jl_slot_names[k][g], jl_slot_fns[k][g],
                                                    &jl_real[g][JL_V_SLOT0 + k], KC_LIB_NVJITLINK};
        }
        __atomic_store_n(&jl_slots_used, k + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&jl_slot_lock);
    if (k == N_SLOT) {
        kc_log_once(KC_LOG_INFO,
                    "nvJitLink: more than %d releases later than this kcache's table; the "
                    "names of %s pass through uncached",
                    N_SLOT, rel);
        return NULL;
    }
    return &jl_slot_hooks[k][f];
}

#define JL_PLAIN_HOOK(e, fn, a)                                                                    \
    {"nvJitLink" #fn, (void *)nvJitLink##fn, &jl_real[e][0], KC_LIB_NVJITLINK},
#define JL_REL_HOOK(e, fn, r)                                                                      \
    {"__nvJitLink" #fn "_" #r, (void *)JL_REL_NAME(fn, r), &jl_real[e][JL_V_##r], KC_LIB_NVJITLINK},
#define JL_REL_HOOKS(r, a) JL_FUNCS(JL_REL_HOOK, r)
const struct kc__hook kc__link_hooks[] = {
    JL_FUNCS(JL_PLAIN_HOOK, 0) JL_RELEASES(JL_REL_HOOKS, 0){
        "nvJitLinkVersion", NULL, &jl_real[F_VERSION][0], KC_LIB_NVJITLINK},
    {NULL, NULL, NULL, 0},
};

/* The family of nvJitLink, and its versioned names by pattern (hook.h). */
KC__FAMILY(link, KC_LIB_NVJITLINK, kc__link_hooks, "__nvJitLink", kc__link_hook_pattern);
