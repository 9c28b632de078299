/*
 * The libNVVM cache: one more table of the hook mechanism (kc__nvvm_hooks,
 * KC_LIB_NVVM), with the NVRTC path's replay record (codec.h), single
 * flight (flight.h) and store (the chain).
 *
 * numba-cuda and cuda.core reach libNVVM through cuda.bindings.nvvm
 * (dlopen + dlsym, as NVRTC); a host may link it too. Every program the
 * host creates gets a shadow: the digest of its history so far, each
 * module in order (content, name, size, added lazily or not) and each
 * verify and compile (options in order, result). nvvmVerifyProgram and
 * nvvmCompileProgram are the two events a record answers: the key is
 * libNVVM's identity, the history and the event's options; the record is
 * kc__replay with OUT_PTX holding nvvmGetCompiledResult[Size] and OUT_LOG
 * nvvmGetProgramLog[Size], as the library answered right after the event
 * (return codes, sizes, bytes), and the event's own code. On a hit the
 * real program is left as it is and the getters answer from the record
 * until the next verify or compile. The served event (its kind and
 * options) is kept as the real program's lag, and any later call that
 * reaches the real program (an add, a verify or compile that misses or
 * passes through) first replays the lag on it (catch_up): the library
 * never runs on a program in another state than the host's, and nothing
 * captured from one is stored. Adds always reach the real library
 * (they only copy the module: 0.05 ms for 16 KB, 1.4 ms for libdevice),
 * so bad arguments get libNVVM's own answer. A getter given NULL, and
 * every handle the shim does not know, go to the real library as well.
 *
 * Keys carry KEY_REVISION: entries of a kcache that captured a verify run
 * on a program whose served compile it had not replayed (an empty result)
 * have other keys, and are never served.
 *
 * Codes cached: success and the deterministic answers about the input
 * (invalid IR or option, IR version mismatch, no module, compilation
 * error, each with its log); out of memory, a cancelled compile and bad
 * arguments are never cached.
 *
 * Namespace: nvvm:<major>.<minor>-<identity>-f<format>, identity a digest
 * of nvvmVersion, nvvmIRVersion and libnvvm's build-id
 * (kc__nvvm_namespace).
 */
#include "codec.h"
#include "flight.h"
#include "shim.h"
#include "why.h"
#include "../store/local/chain.h"

#include <dlfcn.h>
#include <errno.h>
#include <nvvm.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BACKEND "nvvm"
/* Changed when entries of an earlier kcache must never be served (see the
 * header comment). */
#define KEY_REVISION "kcache-nvvm/2"

/* ---- real functions ------------------------------------------------------ */

typedef nvvmResult (*size_fn)(nvvmProgram, size_t *);
typedef nvvmResult (*get_fn)(nvvmProgram, char *);
typedef nvvmResult (*add_fn)(nvvmProgram, const char *, size_t, const char *);
typedef nvvmResult (*event_fn)(nvvmProgram, int, const char **);

static nvvmResult (*real_create)(nvvmProgram *);
static nvvmResult (*real_destroy)(nvvmProgram *);
static add_fn real_add, real_lazy_add;
static event_fn real_verify, real_compile;
static size_fn real_result_size, real_log_size;
static get_fn real_result, real_log;
static nvvmResult (*real_version)(int *, int *);
static nvvmResult (*real_ir_version)(int *, int *, int *, int *);

/* Resolves a real function; a wrapper only the dynamic linker or our dlsym
 * handed out always finds it. */
#define REAL_OR_FAIL(var, name)                                                                    \
    do {                                                                                           \
        if (var == NULL) {                                                                         \
            const struct kc__hook *h_ = kc__hook_find(name, KC_LIB_NVVM);                          \
            var = (__typeof__(var))(h_ ? kc__hook_real(h_) : NULL);                                \
            if (var == NULL)                                                                       \
                return NVVM_ERROR_INVALID_PROGRAM;                                                 \
        }                                                                                          \
    } while (0)

/* A function of the libnvvm the host's program came from (`known`, one of
 * its real functions), found even when the host dlopen'd it privately and
 * never asked for this one. */
static void *sibling(const void *known, const char *name)
{
    const struct kc__hook *h = kc__hook_find(name, KC_LIB_NVVM);
    void *p = h ? kc__hook_real(h) : NULL;
    Dl_info info;
    if (p != NULL || known == NULL || dladdr(known, &info) == 0 || info.dli_fname == NULL)
        return p;
    void *lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL)
        return NULL;
    p = kc__real_dlsym(lib, name);
    dlclose(lib);
    if (p != NULL && h != NULL) {
        void *expected = NULL;
        __atomic_compare_exchange_n(h->real, &expected, p, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    return p;
}

/* Every real function a capture and a hit need, from the library of
 * `known`. */
static bool resolve_all(const void *known)
{
#define R(var, name)                                                                               \
    if (var == NULL)                                                                               \
        var = (__typeof__(var))sibling(known, name);
    R(real_compile, "nvvmCompileProgram");
    R(real_verify, "nvvmVerifyProgram");
    R(real_result_size, "nvvmGetCompiledResultSize");
    R(real_result, "nvvmGetCompiledResult");
    R(real_log_size, "nvvmGetProgramLogSize");
    R(real_log, "nvvmGetProgramLog");
    R(real_version, "nvvmVersion");
    R(real_ir_version, "nvvmIRVersion");
#undef R
    return real_compile && real_verify && real_result_size && real_result && real_log_size &&
           real_log && real_version && real_ir_version;
}

static bool nvvm_enabled(void)
{
    const struct kc_config *cfg = kc__config();
    return !cfg->disable && cfg->nvvm;
}

/* ---- libNVVM's identity --------------------------------------------------- */

struct identity {
    int ready;
    kc_digest digest;
    char ns[96];
    char unknown[128]; /* an entry point it exports that kcache does not know, or "" */
};
static struct identity ident;

/* Exports of libNVVM that are not hooks and touch no program's outputs:
 * versions, error strings, a switch of its own locking, and the export
 * tables NVRTC and the driver reach it through. */
static const char *const nvvm_inert[] = {
    "nvvmGetErrorString", "nvvmLLVMVersion",    "nvvmDisableConcurrentAPI",
    "__nvvmHandle",       "__nvvmHandleTarget", NULL,
};

static pthread_mutex_t ident_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct identity *nvvm_identity(void)
{
    if (__atomic_load_n(&ident.ready, __ATOMIC_ACQUIRE))
        return &ident;
    pthread_mutex_lock(&ident_lock);
    if (!ident.ready) {
        int major = 0, minor = 0, ir[4] = {0};
        if (real_version == NULL || real_ir_version == NULL ||
            real_version(&major, &minor) != NVVM_SUCCESS ||
            real_ir_version(&ir[0], &ir[1], &ir[2], &ir[3]) != NVVM_SUCCESS ||
            kc__nvvm_namespace((const void *)real_compile, major, minor, ir, KC_FORMAT_VERSION,
                               ident.ns, sizeof ident.ns, &ident.digest) != 0) {
            pthread_mutex_unlock(&ident_lock);
            return NULL;
        }
        /* Forward safety: an entry point this build does not know may be a
         * getter of an output a record could not answer. */
        char what[32];
        snprintf(what, sizeof what, "libNVVM %d.%d", major, minor);
        kc__unknown_export((const void *)real_compile, KC_LIB_NVVM, nvvm_inert, what, ident.unknown,
                           NULL, NULL);
        __atomic_store_n(&ident.ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ident_lock);
    return &ident;
}

/* ---- shadows of the host's programs ---------------------------------------- */

/* An event served from the store and not yet run on the real program. */
struct lag {
    bool compile;
    int n;
    char **opts;
    struct lag *next;
};

struct prog {
    nvvmProgram h;
    struct lag *lag;           /* served events the real program has not seen, in order */
    bool pass;                 /* cannot be keyed: every call is the library's */
    enum kc_pass_reason why;   /* why, when pass */
    kc_digest history;         /* the modules, verifies and compiles so far */
    struct kc__replay *served; /* the last verify or compile came from the store */
    struct kc_why steps;       /* its history, input by input (`kcache why`) */
    int n_steps;
    struct prog *next;
};

/* Adds a step of p's history to its miss records' inputs. progs_lock held. */
static void why_step(struct prog *p, const char *what, const char *name, const void *data,
                     size_t size)
{
    char nm[4200];
    snprintf(nm, sizeof nm, "%d: %s%s%s", ++p->n_steps, what, name ? " " : "", name ? name : "");
    kc_why_data(&p->steps, "input", nm, data, size);
}

#define PROG_BUCKETS 1024
static struct prog *progs[PROG_BUCKETS];
static pthread_mutex_t progs_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(nvvmProgram h)
{
    return ((uintptr_t)h >> 4) % PROG_BUCKETS;
}

/* The shadow of h, or NULL. Called with progs_lock held. */
static struct prog *find_locked(nvvmProgram h)
{
    struct prog *p = progs[bucket(h)];
    while (p != NULL && p->h != h)
        p = p->next;
    return p;
}

/* Unlinks and returns the shadow of h. Called with progs_lock held. */
static struct prog *unlink_locked(nvvmProgram h)
{
    struct prog **pp = &progs[bucket(h)];
    while (*pp != NULL && (*pp)->h != h)
        pp = &(*pp)->next;
    struct prog *p = *pp;
    if (p != NULL)
        *pp = p->next;
    return p;
}

static void lag_free(struct lag *l)
{
    while (l != NULL) {
        struct lag *next = l->next;
        for (int i = 0; i < l->n; i++)
            free(l->opts[i]);
        free(l->opts);
        free(l);
        l = next;
    }
}

/* A copy of an event's kind and options for the lag, or NULL. */
static struct lag *lag_new(bool compile, int n, const char **opts)
{
    struct lag *l = calloc(1, sizeof *l);
    if (l == NULL)
        return NULL;
    l->compile = compile;
    l->opts = calloc((size_t)(n > 0 ? n : 1), sizeof *l->opts);
    if (l->opts == NULL) {
        free(l);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if ((l->opts[i] = strdup(opts[i])) == NULL) {
            lag_free(l);
            return NULL;
        }
        l->n = i + 1;
    }
    return l;
}

static void prog_free(struct prog *p)
{
    if (p == NULL)
        return;
    lag_free(p->lag);
    kc__replay_free(p->served);
    kc_why_free(&p->steps);
    free(p);
}

/* ---- keys ------------------------------------------------------------------- */

/* The history after adding a module; *ok false when it cannot be hashed. */
static kc_digest add_step(const kc_digest *prev, int lazy, const char *buf, size_t size,
                          const char *name, bool *ok)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL) {
        *ok = false;
        return *prev;
    }
    kc_digest c = kc_digest_of(buf, size);
    kc__hash_str(h, lazy ? "lazy-module" : "module");
    kc__hash_bytes(h, prev, sizeof *prev);
    kc__hash_str(h, name);
    kc__hash_u64(h, size);
    kc__hash_bytes(h, &c, sizeof c);
    kc_digest d = kc__hash_digest(h);
    kc__hasher_free(h);
    return d;
}

/* The key of a verify or compile with these options after `history`. */
static int event_key(const struct identity *id, const kc_digest *history, const char *what, int n,
                     const char **opts, kc_digest *out)
{
    struct kc__hasher *h = kc__hasher_new();
    if (h == NULL)
        return -ENOMEM;
    kc__hash_str(h, KEY_REVISION);
    kc__hash_u64(h, KC_FORMAT_VERSION);
    kc__hash_bytes(h, &id->digest, sizeof id->digest);
    kc__hash_bytes(h, history, sizeof *history);
    kc__hash_str(h, what);
    kc__hash_u64(h, (uint64_t)n);
    for (int i = 0; i < n; i++)
        kc__hash_str(h, opts[i]);
    *out = kc__hash_digest(h);
    kc__hasher_free(h);
    return 0;
}

/* The history once an event with key `key` answered `rc`. */
static kc_digest event_step(const kc_digest *key, int rc)
{
    struct kc__hasher *h = kc__hasher_new();
    kc_digest d = *key;
    if (h == NULL) {
        d.lo ^= (uint64_t)(uint32_t)rc * 0x9e3779b97f4a7c15ull;
        return d;
    }
    kc__hash_str(h, "event-done");
    kc__hash_bytes(h, key, sizeof *key);
    kc__hash_u64(h, (uint64_t)(uint32_t)rc);
    d = kc__hash_digest(h);
    kc__hasher_free(h);
    return d;
}

/* Whether a verify's or compile's code is a deterministic answer about the
 * input, and so may be replayed. */
static bool cacheable_rc(nvvmResult rc)
{
    switch (rc) {
    case NVVM_SUCCESS:
    case NVVM_ERROR_IR_VERSION_MISMATCH:
    case NVVM_ERROR_INVALID_IR:
    case NVVM_ERROR_INVALID_OPTION:
    case NVVM_ERROR_NO_MODULE_IN_PROGRAM:
    case NVVM_ERROR_COMPILATION:
        return true;
    default:
        return false;
    }
}

/* ---- capture and lookup -------------------------------------------------------- */

struct vm_pair {
    nvvmProgram h;
    size_fn sz;
    get_fn g;
};

static int vm_size(void *ctx, size_t *n)
{
    const struct vm_pair *p = ctx;
    return p->sz(p->h, n);
}

static int vm_get(void *ctx, char *buf)
{
    const struct vm_pair *p = ctx;
    return p->g(p->h, buf);
}

/* What a size/get pair answers now (never given NULL: libNVVM crashes on
 * some of those, and a hit hands NULL to the real library anyway). */
static void capture_output(nvvmProgram h, size_fn sz, get_fn g, struct kc__output *o)
{
    struct vm_pair vp = {h, sz, g};
    kc__capture_pair(&(struct kc__pair){vm_size, vm_get, &vp}, NVVM_SUCCESS,
                     NVVM_ERROR_OUT_OF_MEMORY, o);
}

static struct kc__replay *capture(nvvmProgram h, nvvmResult rc)
{
    struct kc__replay *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->compile_rc = rc;
    capture_output(h, real_result_size, real_result, &r->out[OUT_PTX]);
    capture_output(h, real_log_size, real_log, &r->out[OUT_LOG]);
    return r;
}

/* The record of `key`, or NULL (a record that does not parse is purged). */
static struct kc__replay *lookup(struct kc_store *st, const struct kc_store_ops *api,
                                 const char *ns, const kc_key *key, struct kc_counters *c)
{
    void *body = NULL;
    size_t len = 0;
    struct kc_record_info info = {0};
    if (api->get(st, ns, key, &body, &len, &info) != 0)
        return NULL;
    struct kc__replay *r = kc__replay_decode(body, len);
    api->free(body);
    if (r == NULL) {
        kc_log(KC_LOG_WARN, "a cached libNVVM result could not be read; compiling");
        api->purge(st, ns, key);
        c->errors++;
        return NULL;
    }
    c->saved_ns = info.saved_ns;
    return r;
}

/* Marks the program served by r (taken) after the event `key` (its kind
 * and options in `l`, taken too); false when the program was destroyed
 * meanwhile, or the event could not be kept for a later catch_up (both
 * are freed). */
static bool serve(nvvmProgram prog, struct kc__replay *r, const kc_digest *key, struct lag *l,
                  nvvmResult *rc)
{
    pthread_mutex_lock(&progs_lock);
    struct prog *p = l != NULL ? find_locked(prog) : NULL;
    if (p != NULL) {
        struct lag **tail = &p->lag;
        while (*tail != NULL)
            tail = &(*tail)->next;
        *tail = l;
        l = NULL;
        *rc = (nvvmResult)r->compile_rc;
        p->history = event_step(key, r->compile_rc);
        why_step(p, r->compile_rc == 0 ? "served" : "served, failed", NULL, key, sizeof *key);
        kc__replay_free(p->served);
        p->served = r;
        r = NULL;
    }
    pthread_mutex_unlock(&progs_lock);
    kc__replay_free(r);
    lag_free(l);
    return p != NULL;
}

/* Brings the real program to the state the host's calls left it in: runs
 * the events served from the store on it, in order (their outputs are the
 * records'). Called before any call that reaches the real program. */
static void catch_up(nvvmProgram prog)
{
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    struct lag *l = p != NULL ? p->lag : NULL;
    if (p != NULL)
        p->lag = NULL;
    pthread_mutex_unlock(&progs_lock);
    for (struct lag *e = l; e != NULL; e = e->next) {
        event_fn real = e->compile ? real_compile : real_verify;
        if (real != NULL)
            (void)real(prog, e->n, (const char **)e->opts);
    }
    lag_free(l);
}

/* The arguments of a lookup, for the cluster-wide wait's polls. */
struct poll_arg {
    nvvmProgram prog;
    struct kc_store *st;
    const struct kc_store_ops *api;
    const char *ns;
    const kc_key *key;
    bool compile;
    int n;
    const char **opts;
    nvvmResult *rc;
    struct kc_counters *c;
};

static int serve_poll(void *arg)
{
    struct poll_arg *a = arg;
    struct kc__replay *r = lookup(a->st, a->api, a->ns, a->key, a->c);
    return r != NULL && serve(a->prog, r, &a->key->id, lag_new(a->compile, a->n, a->opts), a->rc)
               ? 1
               : 0;
}

/* ---- the hooks ---------------------------------------------------------------- */

KC_EXPORT nvvmResult nvvmCreateProgram(nvvmProgram *prog)
{
    REAL_OR_FAIL(real_create, "nvvmCreateProgram");
    nvvmResult rc = real_create(prog);
    if (rc != NVVM_SUCCESS || prog == NULL || *prog == NULL || kc__guard_held() || !nvvm_enabled())
        return rc;
    struct prog *p = calloc(1, sizeof *p);
    if (p == NULL) {
        kc_log_once(KC_LOG_WARN, "out of memory; libNVVM programs pass through uncached");
        return rc;
    }
    p->h = *prog;
    pthread_mutex_lock(&progs_lock);
    /* A handle libNVVM reused after a destroy we did not see. */
    struct prog *stale = unlink_locked(p->h);
    p->next = progs[bucket(p->h)];
    progs[bucket(p->h)] = p;
    pthread_mutex_unlock(&progs_lock);
    prog_free(stale);
    return rc;
}

KC_EXPORT nvvmResult nvvmDestroyProgram(nvvmProgram *prog)
{
    REAL_OR_FAIL(real_destroy, "nvvmDestroyProgram");
    struct prog *p = NULL;
    if (prog != NULL && *prog != NULL) {
        pthread_mutex_lock(&progs_lock);
        p = unlink_locked(*prog);
        pthread_mutex_unlock(&progs_lock);
    }
    nvvmResult rc = real_destroy(prog);
    if (rc != NVVM_SUCCESS && p != NULL) {
        pthread_mutex_lock(&progs_lock);
        p->next = progs[bucket(p->h)];
        progs[bucket(p->h)] = p;
        pthread_mutex_unlock(&progs_lock);
        return rc;
    }
    prog_free(p);
    return rc;
}

/* An add: always the library's; the shadow's history follows. */
static nvvmResult add_module(nvvmProgram prog, const char *buf, size_t size, const char *name,
                             int lazy, add_fn real)
{
    if (prog != NULL && !kc__guard_held())
        catch_up(prog);
    nvvmResult rc = real(prog, buf, size, name);
    if (kc__guard_held() || prog == NULL)
        return rc;
    /* Size 0 is accepted; what libNVVM then reads is its own business:
     * such a program is not keyed. */
    bool keyable = rc == NVVM_SUCCESS && buf != NULL && size > 0;
    kc_digest d = {0};
    bool ok = true;
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    kc_digest prev = p != NULL ? p->history : d;
    bool pass = p == NULL || p->pass;
    pthread_mutex_unlock(&progs_lock);
    if (pass)
        return rc;
    if (keyable)
        d = add_step(&prev, lazy, buf, size, name, &ok);
    pthread_mutex_lock(&progs_lock);
    p = find_locked(prog);
    if (p != NULL && rc != NVVM_SUCCESS) {
        /* Refused: the program is as it was. */
    } else if (p != NULL &&
               (!keyable || !ok || p->history.lo != prev.lo || p->history.hi != prev.hi)) {
        p->pass = true; /* a race on one program, or not keyable */
        p->why = !keyable ? KC_PASS_input : KC_PASS_internal;
    } else if (p != NULL) {
        p->history = d;
        why_step(p, lazy ? "lazy module" : "module", name, buf, size);
    }
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

KC_EXPORT nvvmResult nvvmAddModuleToProgram(nvvmProgram prog, const char *buffer, size_t size,
                                            const char *name)
{
    REAL_OR_FAIL(real_add, "nvvmAddModuleToProgram");
    return add_module(prog, buffer, size, name, 0, real_add);
}

KC_EXPORT nvvmResult nvvmLazyAddModuleToProgram(nvvmProgram prog, const char *buffer, size_t size,
                                                const char *name)
{
    REAL_OR_FAIL(real_lazy_add, "nvvmLazyAddModuleToProgram");
    return add_module(prog, buffer, size, name, 1, real_lazy_add);
}

/* A verify or a compile: keyed, served or run and stored. */
static nvvmResult event(nvvmProgram prog, int n, const char **opts, bool compile, event_fn real)
{
    if (!kc__guard_enter())
        return real(prog, n, opts);
    uint64_t t_enter = kc_mono_ns();
    const char *what = compile ? "compile" : "verify";
    const struct kc_config *cfg = kc__config();
    struct kc_counters c = {0};
    nvvmResult rc;

    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    bool known = p != NULL;
    bool cacheable = p != NULL && !p->pass && n >= 0 && (n == 0 || opts != NULL);
    for (int i = 0; cacheable && i < n; i++)
        cacheable = opts[i] != NULL;
    /* Why it passes through, when it does (the stats line's reasons). */
    enum kc_pass_reason why = p != NULL && p->pass ? p->why : KC_PASS_input;
    kc_digest history = p != NULL ? p->history : (kc_digest){0};
    pthread_mutex_unlock(&progs_lock);

    if (!known || !nvvm_enabled()) {
        rc = real(prog, n, opts);
        kc__guard_exit();
        return rc;
    }
    const struct identity *id = NULL;
    kc_digest kd;
    if (cacheable)
        why = KC_PASS_internal;
    if (cacheable && resolve_all((const void *)real) && (id = nvvm_identity()) != NULL &&
        id->unknown[0] != '\0')
        why = KC_PASS_unknown_export;
    if (!cacheable || !resolve_all((const void *)real) || (id = nvvm_identity()) == NULL ||
        id->unknown[0] != '\0' || event_key(id, &history, what, n, opts, &kd) != 0) {
        kc__pass_reason(BACKEND, why);
        pthread_mutex_lock(&progs_lock);
        if ((p = find_locked(prog)) != NULL) {
            p->pass = true;
            p->why = why;
            kc__replay_free(p->served);
            p->served = NULL;
        }
        pthread_mutex_unlock(&progs_lock);
        c.passthrough = 1;
        catch_up(prog);
        rc = real(prog, n, opts);
        goto out;
    }

    const struct kc_store_ops *api = NULL;
    struct kc_store *st = kc__store(&api);
    const char *ns = id->ns;
    kc_key key = {.id = kd, .build = kc__self_build()};
    struct kc__replay *r = NULL;
    if (st != NULL && !cfg->recache && (r = lookup(st, api, ns, &key, &c)) != NULL &&
        serve(prog, r, &kd, lag_new(compile, n, opts), &rc)) {
        c.hits = 1;
        goto out;
    }

    /* Single flight, in this machine and then the cluster. */
    int flight = -1;
    bool rheld = false;
    if (st != NULL) {
        bool waited = false;
        flight = kc__flight_acquire(&kd, &waited);
        if ((flight >= 0 || waited) && !cfg->recache &&
            (r = lookup(st, api, ns, &key, &c)) != NULL &&
            serve(prog, r, &kd, lag_new(compile, n, opts), &rc)) {
            kc__flight_release(flight);
            c.hits = 1;
            goto out;
        }
        struct poll_arg pa = {prog, st, api, ns, &key, compile, n, opts, &rc, &c};
        if (!cfg->recache && kc__flight_remote(ns, &key, serve_poll, &pa, &rheld) == 1) {
            kc__flight_release(flight);
            c.hits = 1;
            goto out;
        }
    }

    /* Miss: the library's own, then captured and stored. */
    pthread_mutex_lock(&progs_lock);
    if ((p = find_locked(prog)) != NULL) {
        kc__replay_free(p->served);
        p->served = NULL;
    }
    pthread_mutex_unlock(&progs_lock);
    catch_up(prog);
    uint64_t t0 = kc_mono_ns();
    rc = real(prog, n, opts);
    uint64_t took = kc_mono_ns() - t0;
    c.misses = 1;
    c.compile_ns = took;
    bool stored = false;
    size_t stored_len = 0;
    if (cacheable_rc(rc) && st != NULL && !cfg->readonly) {
        struct kc__replay *cap = capture(prog, rc);
        struct kc_buf b = {0};
        if (cap != NULL && kc__replay_encode(cap, &b) == 0) {
            int prc = api->put(st, ns, &key, NULL, KC_KIND_NVRTC, b.p, b.len, took);
            if (prc == 0) {
                c.stores = 1;
                stored = true;
                stored_len = b.len;
            } else {
                c.errors = 1;
                if (prc != -EDQUOT)
                    kc_log_once(KC_LOG_WARN,
                                "cannot store a libNVVM result (%s); continuing uncached",
                                strerror(-prc));
            }
        } else {
            c.errors = 1;
            kc_log_once(KC_LOG_WARN, "cannot capture a libNVVM result; continuing uncached");
        }
        kc_buf_free(&b);
        kc__replay_free(cap);
    }
    pthread_mutex_lock(&progs_lock);
    if ((p = find_locked(prog)) != NULL) {
        if (st != NULL && !cfg->readonly) { /* the miss's record */
            struct kc_why w = {0};
            int major = 0, minor = 0;
            real_version(&major, &minor);
            char ver[48];
            snprintf(ver, sizeof ver, "libNVVM %d.%d", major, minor);
            kc_why_begin(&w, BACKEND, what, &kd);
            kc__why_library(&w, BACKEND, (const void *)real, &id->digest, ver);
            kc_buf_add(&w.b, p->steps.b.p, p->steps.b.len);
            for (int i = 0; i < n; i++)
                kc_why_add(&w, "option", "", NULL, opts[i]);
            kc__why_finish(&w, &key.id, key.build, stored ? NULL : "not stored", took, 0);
        }
        p->history = event_step(&kd, rc);
        why_step(p, what, NULL, &kd, sizeof kd);
    }
    pthread_mutex_unlock(&progs_lock);
    kc__flight_remote_release(ns, &key, rheld, stored, stored_len);
    kc__flight_release(flight);
out:
    kc__count(BACKEND, &c);
    if (kc__log_enabled(KC_LOG_DEBUG))
        kc_log(KC_LOG_DEBUG, "nvvm %s %s: %.3f ms in the hook, %.3f ms of it compiling", what,
               c.hits     ? "hit"
               : c.misses ? "miss"
                          : "pass-through",
               (kc_mono_ns() - t_enter) / 1e6, c.compile_ns / 1e6);
    kc__guard_exit();
    return rc;
}

KC_EXPORT nvvmResult nvvmVerifyProgram(nvvmProgram prog, int numOptions, const char **options)
{
    REAL_OR_FAIL(real_verify, "nvvmVerifyProgram");
    return event(prog, numOptions, options, false, real_verify);
}

KC_EXPORT nvvmResult nvvmCompileProgram(nvvmProgram prog, int numOptions, const char **options)
{
    REAL_OR_FAIL(real_compile, "nvvmCompileProgram");
    return event(prog, numOptions, options, true, real_compile);
}

/* ---- getters: a served program answers from its record ------------------------ */

static nvvmResult serve_size(nvvmProgram prog, size_t *ret, int which, size_fn real)
{
    if (ret == NULL)
        return real(prog, ret);
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        return real(prog, ret);
    }
    const struct kc__output *o = &p->served->out[which];
    nvvmResult rc = (nvvmResult)o->size_rc;
    if (o->size_set)
        *ret = o->size;
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

static nvvmResult serve_get(nvvmProgram prog, char *dst, int which, get_fn real)
{
    if (dst == NULL)
        return real(prog, dst);
    pthread_mutex_lock(&progs_lock);
    struct prog *p = find_locked(prog);
    if (p == NULL || p->served == NULL) {
        pthread_mutex_unlock(&progs_lock);
        return real(prog, dst);
    }
    const struct kc__output *o = &p->served->out[which];
    if (o->nbytes > 0)
        memcpy(dst, o->bytes, o->nbytes);
    nvvmResult rc = (nvvmResult)o->get_rc;
    pthread_mutex_unlock(&progs_lock);
    return rc;
}

KC_EXPORT nvvmResult nvvmGetCompiledResultSize(nvvmProgram prog, size_t *bufferSizeRet)
{
    REAL_OR_FAIL(real_result_size, "nvvmGetCompiledResultSize");
    return serve_size(prog, bufferSizeRet, OUT_PTX, real_result_size);
}

KC_EXPORT nvvmResult nvvmGetCompiledResult(nvvmProgram prog, char *buffer)
{
    REAL_OR_FAIL(real_result, "nvvmGetCompiledResult");
    return serve_get(prog, buffer, OUT_PTX, real_result);
}

KC_EXPORT nvvmResult nvvmGetProgramLogSize(nvvmProgram prog, size_t *bufferSizeRet)
{
    REAL_OR_FAIL(real_log_size, "nvvmGetProgramLogSize");
    return serve_size(prog, bufferSizeRet, OUT_LOG, real_log_size);
}

KC_EXPORT nvvmResult nvvmGetProgramLog(nvvmProgram prog, char *buffer)
{
    REAL_OR_FAIL(real_log, "nvvmGetProgramLog");
    return serve_get(prog, buffer, OUT_LOG, real_log);
}

#define HOOK(name, var)                                                                            \
    {                                                                                              \
#name, (void *)name, (void **)&var, KC_LIB_NVVM                                            \
    }
const struct kc__hook kc__nvvm_hooks[] = {
    HOOK(nvvmCreateProgram, real_create),
    HOOK(nvvmDestroyProgram, real_destroy),
    HOOK(nvvmAddModuleToProgram, real_add),
    HOOK(nvvmLazyAddModuleToProgram, real_lazy_add),
    HOOK(nvvmVerifyProgram, real_verify),
    HOOK(nvvmCompileProgram, real_compile),
    HOOK(nvvmGetCompiledResultSize, real_result_size),
    HOOK(nvvmGetCompiledResult, real_result),
    HOOK(nvvmGetProgramLogSize, real_log_size),
    HOOK(nvvmGetProgramLog, real_log),
    /* Passed through: read for the identity. */
    {"nvvmVersion", NULL, (void **)&real_version, KC_LIB_NVVM},
    {"nvvmIRVersion", NULL, (void **)&real_ir_version, KC_LIB_NVVM},
    {NULL, NULL, NULL, 0},
};

/* The family of libNVVM (hook.h). */
KC__FAMILY(nvvm, KC_LIB_NVVM, kc__nvvm_hooks, NULL, NULL);
