/*
 * The shim's core: configuration and store on first use, counters and the
 * KCACHE_STATS line, the re-entry guard, fork handling, and the dlsym
 * interposer that swaps our wrappers into dlopen'd NVRTC and libcuda.
 */
#include "shim.h"
#include "tree.h"
#include "front.h"
#include "flight.h"
#include "../store/local/chain.h"
#include "../store/remote/remote.h"
#include "../common/served.h"
#include "../common/trust.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- configuration ---------------------------------------------------- */

static struct kc_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static bool config_loaded; /* config_init ran (shim_fini reads it) */

static void config_init(void)
{
    kc_config_load_zeroed(&config); /* static, loaded once: all zero */
    __atomic_store_n(&config_loaded, true, __ATOMIC_RELEASE);
    kc__log_set_level(config.log_level);
    for (int i = 0; i < config.n_warnings; i++)
        kc_log(KC_LOG_WARN, "%s", config.warnings[i]);
}

const struct kc_config *kc__config(void)
{
    pthread_once(&config_once, config_init);
    return &config;
}

uint64_t kc__self_build(void)
{
    static uint64_t build;
    uint64_t b = __atomic_load_n(&build, __ATOMIC_RELAXED);
    if (b != 0)
        return b;
    kc_digest d = {0, 1};
    kc__loaded_identity((const void *)kc__self_build, &d);
    b = d.lo ? d.lo : 1;
    __atomic_store_n(&build, b, __ATOMIC_RELAXED);
    return b;
}

/* ---- re-entry guard --------------------------------------------------- */

static __thread int guard_depth __attribute__((tls_model("initial-exec")));

bool kc__guard_enter(void)
{
    if (guard_depth > 0)
        return false;
    guard_depth++;
    return true;
}

void kc__guard_exit(void)
{
    guard_depth--;
}

bool kc__guard_held(void)
{
    return guard_depth > 0;
}

/* ---- the store, loaded on first use ----------------------------------- */

static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
static int store_state; /* 0 untried, 1 open, -1 unusable */
static struct kc_store *store;

/* libkcache.so's absolute path, found before main (self_locate): the kcache
 * tool and the store library are looked for beside it, never relative to
 * the working directory, which the host may change to one another user
 * controls. Empty: unknown. */
static char self_path[PATH_MAX];

__attribute__((constructor)) static void self_locate(void)
{
    kc_config_pin_cwd();
    if (kc__object_path((const void *)self_locate, self_path, sizeof self_path) == 0)
        return;
    self_path[0] = '\0';
    /* No /proc: a relative name is resolved now, against the working
     * directory the loader used, before main can change it. */
    Dl_info info;
    char real[PATH_MAX];
    if (dladdr((void *)self_locate, &info) != 0 && info.dli_fname != NULL &&
        info.dli_fname[0] != '\0' && realpath(info.dli_fname, real) != NULL)
        memcpy(self_path, real, strlen(real) + 1);
}

const char *kc__self_path(void)
{
    return self_path[0] == '/' ? self_path : NULL;
}

static void *load_store_lib(void)
{
    const char *env = kc_config_get(KC_VAR_STORE_LIB);
    if (env != NULL && env[0] != '\0')
        return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    const char *self = kc__self_path();
    /* Installed side by side, or the build tree's store/ beside shim/, by
     * its real path where nobody but this user and root can replace it
     * (kc_trusted_path: a tree unpacked under a directory another user can
     * write); a bare name only when our own location is unknown or has
     * neither (the loader's search: no working directory unless
     * LD_LIBRARY_PATH names it). */
    if (self != NULL) {
        static const char *rel[] = {"libkcache-store.so", "../store/db/libkcache-store.so"};
        size_t n = (size_t)(strrchr(self, '/') - self) + 1;
        char path[PATH_MAX + 32], real[PATH_MAX];
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            snprintf(path, sizeof path, "%.*s%s", (int)n, self, rel[i]);
            if (access(path, R_OK) == 0 && kc_trusted_path(path, real, sizeof real, NULL) == 0)
                return dlopen(real, RTLD_NOW | RTLD_LOCAL);
        }
    }
    return dlopen("libkcache-store.so", RTLD_NOW | RTLD_LOCAL);
}

/* The remote tier (KCACHE_REMOTE): read by the chain after the local
 * tiers, its hits kept locally (fill-back); its counters at fork. */
static struct kc_remote *remote;
static struct kc_remote_counters remote_base; /* a forked child's start */

struct kc_remote *kc__remote(void)
{
    return __atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 1 ? remote : NULL;
}

/* Revocation: an entry the remote served is served from the store only
 * while its signer is trusted (kc_remote_signers_serve). The signers are
 * read at the first hit that needs them (libc only: a hit maps nothing). */
static pthread_once_t signers_once = PTHREAD_ONCE_INIT;
static struct kc_remote_signers *signers;

static void signers_load(void)
{
    struct kc_remote_settings s;
    kc_remote_settings_from_config(kc__config(), &s);
    if (kc_remote_signers_load(&s, &signers) != 0)
        signers = NULL;
}

static bool signer_served(uint32_t prov)
{
    if (KC_PROV_CODE(prov) != KC_PROV_SIGNED)
        return true;
    pthread_once(&signers_once, signers_load);
    return kc_remote_signers_serve(signers, prov);
}

/* Chains the remote behind the local tiers when KCACHE_REMOTE names one:
 * reads only (the owner uploads what this process stores, with the upload
 * configuration its puts carry). Nothing is
 * loaded or connected until a lookup misses locally. A malformed value is
 * one warning, and no remote. */
static void remote_attach(struct kc_store *st, const struct kc_config *cfg)
{
    struct kc_remote_settings s;
    kc_remote_settings_from_config(cfg, &s);
    kc__chain_set_served(st, signer_served);
    if (s.remote == NULL || s.remote[0] == '\0')
        return;
    /* This process's compiles are uploaded with its own configuration. */
    static char desc[KC__UPLOAD_MAX];
    size_t dn = kc_remote_upload_descriptor(&s, desc, sizeof desc);
    kc__chain_set_upload(st, dn > 0 ? desc : NULL, dn);
    memset(desc, 0, sizeof desc);
    struct kc_remote_config rc;
    char why[256];
    if (kc_remote_config_parse(&s, &rc, why, sizeof why) != 0) {
        kc_log(KC_LOG_WARN, "%s; the remote is off", why); /* why names KCACHE_REMOTE */
        kc_remote_config_free(&rc);
        return;
    }
    for (int i = 0; i < rc.n_warnings; i++)
        kc_log(KC_LOG_WARN, "%s", rc.warnings[i]);
    struct kc_remote *r = NULL;
    struct kc_tier *t = NULL;
    if (rc.mode != KC_REMOTE_NONE &&
        kc_remote_open(&rc, &(struct kc_remote_options){.transient = true}, &r) == 0) {
        if (kc_remote_tier(r, false, &t) != 0) {
            kc_remote_close(r);
            r = NULL;
        } else if (kc__chain_add(st, t, KC__CHAIN_FILL_BACK) != 0) {
            r = NULL; /* closed by the chain */
        }
    }
    kc_remote_config_free(&rc);
    remote = r;
}

/* The store as hooks see it is the front (front.c), the chain of tiers:
 * hits from the spool and DIR/hot, misses told by DIR/filter and writes to
 * the spool, all without RocksDB; it loads libkcache-store.so
 * (load_store_lib) only for a lookup the filter cannot answer. */
struct kc_store *kc__store(const struct kc_store_ops **api)
{
    int state = __atomic_load_n(&store_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        const struct kc_config *cfg = kc__config();
        pthread_mutex_lock(&store_lock);
        if (store_state == 0) {
            struct kc_store_options opts = {
                .dir = cfg->dir,
                .readonly = cfg->readonly,
                .max_size = cfg->max_size,
            };
            /* No directory (no home): the configuration warned already. */
            int rc = cfg->dir[0] == 0 ? -ENOENT : kc__front_open(&opts, load_store_lib, &store);
            if (rc == 0 && !cfg->readonly && kc__flight_prepare() != 0) {
                kc__chain_close(store);
                store = NULL;
                rc = -EPERM;
            }
            if (rc == 0)
                remote_attach(store, cfg);
            if (rc != 0 && cfg->dir[0] != 0)
                kc_log(KC_LOG_WARN,
                       "cannot use the cache directory %s (%s); caching is off (set KCACHE_DIR "
                       "to a directory of your own, mode 0700)",
                       cfg->dir,
                       rc == -EPERM ? "it, a directory or link on the way to it, or one in it, is "
                                      "owned by another user or writable by others"
                       : rc == -ENOTEMPTY ? "not empty and not a kcache store"
                                          : strerror(-rc));
            __atomic_store_n(&store_state, rc == 0 ? 1 : -1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&store_lock);
        state = __atomic_load_n(&store_state, __ATOMIC_ACQUIRE);
    }
    if (state != 1)
        return NULL;
    if (api != NULL)
        *api = &kc__chain_ops;
    return store;
}

/* ---- counters --------------------------------------------------------- */

#define N_BACKENDS 6
static const char *backend_names[N_BACKENDS] = {"nvrtc", "jit", "memo", "link", "nvvm", "tool"};
#define BACKEND_MEMO 2
#define BACKEND_TOOL 5 /* on the stats line only when it counted something */
static struct kc_counters counters[N_BACKENDS];
static uint64_t pass_reasons[N_BACKENDS][KC_N_PASS_REASONS];
_Static_assert(sizeof(struct kc_counters) % sizeof(uint64_t) == 0, "counters are u64 fields");

void kc__pass_reason(const char *backend, enum kc_pass_reason r)
{
    for (int i = 0; i < N_BACKENDS; i++)
        if (strcmp(backend, backend_names[i]) == 0 && r >= 0 && r < KC_N_PASS_REASONS)
            __atomic_fetch_add(&pass_reasons[i][r], 1, __ATOMIC_RELAXED);
}

/* What this process has handed to the store so far (counters_flush). */
static struct kc_counters flushed[N_BACKENDS];
static uint64_t pass_flushed[N_BACKENDS][KC_N_PASS_REASONS];
static pthread_mutex_t flush_lock = PTHREAD_MUTEX_INITIALIZER;

static void snapshot(struct kc_counters snap[N_BACKENDS],
                     uint64_t psnap[N_BACKENDS][KC_N_PASS_REASONS])
{
    for (int i = 0; i < N_BACKENDS; i++) {
        const uint64_t *src = (const uint64_t *)&counters[i];
        uint64_t *dst = (uint64_t *)&snap[i];
        for (size_t k = 0; k < sizeof snap[i] / sizeof(uint64_t); k++)
            dst[k] = __atomic_load_n(&src[k], __ATOMIC_RELAXED);
        for (int r = 0; r < KC_N_PASS_REASONS; r++)
            psnap[i][r] = __atomic_load_n(&pass_reasons[i][r], __ATOMIC_RELAXED);
    }
}

/* Hands the store what was counted since the last call, and flushes it
 * (a spool log of its own): called after every miss or store, and at
 * exit, so a process leaving by _exit, a signal's default action or
 * SIGKILL still has every compile it stored counted; only the hits and
 * pass-throughs since its last miss are lost then. Each log holds the
 * difference from the last, so the logs of a process add up to its
 * totals, reasons and pass-throughs alike (a hook counts its reason
 * before its pass-through, and the counters are read first: a log may
 * hold a reason whose pass-through is in the next, never the reverse). */
static void counters_flush(struct kc_store *st, const struct kc_store_ops *api,
                           struct kc_counters snap[N_BACKENDS],
                           uint64_t psnap[N_BACKENDS][KC_N_PASS_REASONS])
{
    pthread_mutex_lock(&flush_lock);
    snapshot(snap, psnap);
    for (int i = 0; i < N_BACKENDS; i++) {
        struct kc_counters d = snap[i];
        const uint64_t *f = (const uint64_t *)&flushed[i];
        uint64_t *dd = (uint64_t *)&d;
        for (size_t k = 0; k < sizeof d / sizeof(uint64_t); k++)
            dd[k] -= f[k];
        if (memcmp(&d, &(struct kc_counters){0}, sizeof d) != 0)
            api->count(st, backend_names[i], &d);
        flushed[i] = snap[i];
        for (int r = 0; r < KC_N_PASS_REASONS; r++)
            if (psnap[i][r] != pass_flushed[i][r]) {
                char name[64];
                snprintf(name, sizeof name, KC_PASS_PREFIX "%s:%s", backend_names[i],
                         kc_pass_reason_name(r));
                api->count(st, name,
                           &(struct kc_counters){.passthrough = psnap[i][r] - pass_flushed[i][r]});
                pass_flushed[i][r] = psnap[i][r];
            }
    }
    api->flush(st);
    pthread_mutex_unlock(&flush_lock);
}

void kc__count(const char *backend, const struct kc_counters *c)
{
    bool compiles = false; /* a backend whose misses are compiles (not the memo's lookups) */
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(backend, backend_names[i]) != 0)
            continue;
        compiles = i != BACKEND_MEMO;
        /* Lock-free: the memo counts from its hot path. */
        struct kc_counters *t = &counters[i];
        const uint64_t *src = (const uint64_t *)c;
        uint64_t *dst = (uint64_t *)t;
        for (size_t k = 0; k < sizeof *c / sizeof(uint64_t); k++)
            if (src[k] != 0)
                __atomic_fetch_add(&dst[k], src[k], __ATOMIC_RELAXED);
        break;
    }
    /* A compile's miss or a store is counted at once (it cost a compile;
     * one more spool log is nothing beside it). A function lookup the memo
     * missed cost the driver a lookup, less than that log: counted with
     * the next compile's, or at exit. */
    if ((c->stores != 0 || (c->misses != 0 && compiles)) &&
        __atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 1 && !kc__config()->readonly) {
        const struct kc_store_ops *api;
        struct kc_store *st = kc__store(&api);
        struct kc_counters snap[N_BACKENDS];
        uint64_t psnap[N_BACKENDS][KC_N_PASS_REASONS];
        if (st != NULL)
            counters_flush(st, api, snap, psnap);
    }
}

/* Whether the KCACHE_STATS line is wanted at exit. A process that never
 * reached a hook has not read its configuration (it is read on first use):
 * then KCACHE_STATS alone is looked at (one getenv; nothing in a
 * secure-execution process, where kc_config_get reads no variable), and
 * only when it is set is the rest read, for the line. */
static bool stats_wanted(void)
{
    if (__atomic_load_n(&config_loaded, __ATOMIC_ACQUIRE))
        return config.stats;
    const char *v = kc_config_get(KC_VAR_STATS);
    bool on = false;
    if (v == NULL || v[0] == '\0' || kc_parse_bool(v, &on) != 0 || !on)
        return false;
    return kc__config()->stats;
}

/* A compiler tool's watched child (tool.c): its parent counts the run and
 * prints the stats line; the child's streams are the tool's alone. */
static bool tool_child;

void kc__tool_child(void)
{
    tool_child = true;
}

__attribute__((destructor)) static void shim_fini(void)
{
    if (tool_child)
        return;
    /* Whether this process reached kcache: a hook ran or the dlsym
     * interposer handed out a wrapper (both read the configuration, which
     * is read on first use), before stats_wanted reads it itself. */
    bool reached = __atomic_load_n(&config_loaded, __ATOMIC_ACQUIRE);
    bool want_stats = stats_wanted();
    bool passed = false;
    for (int i = 0; i < N_BACKENDS; i++)
        passed |= __atomic_load_n(&counters[i].passthrough, __ATOMIC_RELAXED) != 0;
    if (__atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 0 && !want_stats && !passed)
        return;
    /* A process whose every request passed through (a library kcache does
     * not know, options it leaves to the library) has not opened the
     * store: it does now, so that kcache stats counts those and says why. */
    if (passed && __atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 0 &&
        __atomic_load_n(&config_loaded, __ATOMIC_ACQUIRE) && !config.readonly && !config.disable)
        kc__store(NULL);
    struct kc_counters snap[N_BACKENDS];
    uint64_t psnap[N_BACKENDS][KC_N_PASS_REASONS];
    const struct kc_store_ops *api;
    struct kc_store *st =
        __atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 1 ? kc__store(&api) : NULL;
    struct kc_remote *rem = st != NULL ? remote : NULL;
    struct kc_remote_counters rsnap = {0};
    if (rem != NULL) {
        kc_remote_counters(rem, &rsnap);
        kc_remote_counters_sub(&rsnap, &remote_base);
    }
    if (st != NULL && !config.readonly) {
        struct kc_counters packed[KC_REMOTE_STAT_BACKENDS];
        kc_remote_counters_pack(&rsnap, packed);
        for (int i = 0; rem != NULL && i < KC_REMOTE_STAT_BACKENDS; i++)
            if (memcmp(&packed[i], &(struct kc_counters){0}, sizeof packed[i]) != 0)
                api->count(st, kc_remote_stat_backend(i), &packed[i]);
        /* Flush, not close: other threads may still be inside a hook while
         * the process exits, and the kernel releases everything anyway. */
        counters_flush(st, api, snap, psnap);
    } else {
        snapshot(snap, psnap);
        if (st != NULL)
            api->flush(st);
    }
    bool any_pass = false;
    for (int i = 0; i < N_BACKENDS; i++)
        for (int r = 0; r < KC_N_PASS_REASONS; r++)
            any_pass |= psnap[i][r] != 0;

    /* Which library each backend that counted anything was served by
     * (the user's LD_LIBRARY_PATH or CUDA_HOME decides it): on the stats
     * line, and recorded in the store for `kcache config`. */
    static const struct {
        int lib;
        const char *fn;
        int served;
    } used[N_BACKENDS] = {{KC_LIB_NVRTC, "nvrtcCompileProgram", KC_SERVED_NVRTC},
                          {KC_LIB_CUDA, "cuInit", KC_SERVED_CUDA},
                          {KC_LIB_CUDA, "cuInit", KC_SERVED_CUDA},
                          {KC_LIB_NVJITLINK, "nvJitLinkCreate", KC_SERVED_LINK},
                          {KC_LIB_NVVM, "nvvmCompileProgram", KC_SERVED_NVVM},
                          {0, NULL, 0}};
    const char *lib_path[N_BACKENDS] = {NULL};
    const char *served[KC_SERVED_N] = {NULL};
    bool any_served = false;
    for (int i = 0; i < N_BACKENDS; i++) {
        if (used[i].fn == NULL || memcmp(&snap[i], &(struct kc_counters){0}, sizeof snap[i]) == 0)
            continue;
        /* The hook's real function when it has one (no lookup at exit). */
        const struct kc__hook *h = kc__hook_find(used[i].fn, used[i].lib);
        void *fn = h != NULL ? __atomic_load_n(h->real, __ATOMIC_ACQUIRE) : NULL;
        if (fn == NULL)
            fn = kc__lib_real(used[i].lib, used[i].fn);
        Dl_info di;
        if (fn == NULL || dladdr(fn, &di) == 0 || di.dli_fname == NULL)
            continue;
        lib_path[i] = di.dli_fname;
        if (served[used[i].served] == NULL)
            served[used[i].served] = di.dli_fname;
        any_served = true;
    }
    if (any_served && st != NULL && !config.readonly) {
        int src = kc_served_update(config.dir, served);
        if (src != 0)
            kc_log(KC_LOG_DEBUG, "cannot record the libraries served in %s/%s: %s", config.dir,
                   KC_SERVED_FILE, strerror(-src));
    }

    /* One line per process that reached kcache (a hook, a wrapper handed
     * out, a counter): a job's shells, launchers and shims, which load
     * kcache and never reach it, print none. */
    bool counted = any_pass || rem != NULL;
    for (int i = 0; i < N_BACKENDS; i++)
        counted |= memcmp(&snap[i], &(struct kc_counters){0}, sizeof snap[i]) != 0;
    if (want_stats && (reached || counted)) {
        char line[2048];
        int n = snprintf(line, sizeof line, "kcache: stats:");
        for (int i = 0; i < N_BACKENDS && n > 0 && (size_t)n < sizeof line; i++) {
            const struct kc_counters *c = &snap[i];
            if (i == BACKEND_TOOL && memcmp(c, &(struct kc_counters){0}, sizeof *c) == 0)
                continue;
            n += snprintf(line + n, sizeof line - n,
                          "%s %s hits=%llu misses=%llu passthrough=%llu stores=%llu errors=%llu "
                          "saved=%.3fs",
                          i ? ";" : "", backend_names[i], (unsigned long long)c->hits,
                          (unsigned long long)c->misses, (unsigned long long)c->passthrough,
                          (unsigned long long)c->stores, (unsigned long long)c->errors,
                          c->saved_ns / 1e9);
        }
        /* The remote's part only when one is configured: the line is
         * otherwise exactly what it always was. */
        if (rem != NULL && n > 0 && (size_t)n < sizeof line)
            n += snprintf(
                line + n, sizeof line - n,
                "; remote hits=%llu misses=%llu errors=%llu timeouts=%llu bad=%llu "
                "saved=%.3fs refusals=%llu auth=%llu protocol=%llu error_replies=%llu "
                "oom=%llu bad_signatures=%llu lock_untrusted=%llu off=%llu polls=%llu tls=%llu "
                "write_refusals=%llu",
                (unsigned long long)rsnap.hits, (unsigned long long)rsnap.misses,
                (unsigned long long)rsnap.errors, (unsigned long long)rsnap.timeouts,
                (unsigned long long)rsnap.bad, rsnap.saved_ns / 1e9,
                (unsigned long long)rsnap.refusals, (unsigned long long)rsnap.auth_failures,
                (unsigned long long)rsnap.protocol_errors, (unsigned long long)rsnap.error_replies,
                (unsigned long long)rsnap.oom, (unsigned long long)rsnap.bad_signatures,
                (unsigned long long)rsnap.lock_untrusted, (unsigned long long)rsnap.breaker_opens,
                (unsigned long long)rsnap.polls, (unsigned long long)rsnap.tls_failures,
                (unsigned long long)rsnap.write_refusals);
        /* Why requests passed through, only when some did: the line is
         * otherwise what it always was. */
        /* "; passthrough nvrtc option=1 writes=2, link input=1" */
        bool opened = false;
        for (int i = 0; any_pass && i < N_BACKENDS; i++) {
            bool named = false;
            for (int r = 0; r < KC_N_PASS_REASONS && n > 0 && (size_t)n < sizeof line; r++) {
                if (psnap[i][r] == 0)
                    continue;
                if (!named)
                    n += snprintf(line + n, sizeof line - n, "%s%s",
                                  opened ? ", " : "; passthrough ", backend_names[i]);
                if (n > 0 && (size_t)n < sizeof line)
                    n += snprintf(line + n, sizeof line - n, " %s=%llu", kc_pass_reason_name(r),
                                  (unsigned long long)psnap[i][r]);
                named = opened = true;
            }
        }
        /* The libraries served (the memo is the driver's: "jit" names it). */
        bool listed = false;
        for (int i = 0; i < N_BACKENDS && n > 0 && (size_t)n < sizeof line; i++) {
            if (i == 2 || lib_path[i] == NULL)
                continue;
            n += snprintf(line + n, sizeof line - n, "%s %s=%s", listed ? "" : "; libraries",
                          i == 1 ? "cuda" : backend_names[i], lib_path[i]);
            listed = true;
        }
        if (n > 0 && (size_t)n < sizeof line - 1) {
            line[n++] = '\n';
            ssize_t w = write(STDERR_FILENO, line, (size_t)n);
            (void)w;
        }
    }
}

/* ---- fork --------------------------------------------------------------- */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&store_lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&store_lock);
}

static void atfork_child(void)
{
    pthread_mutex_init(&store_lock, NULL);
    /* The child reports only what it does itself. */
    memset(counters, 0, sizeof counters);
    memset(pass_reasons, 0, sizeof pass_reasons);
    memset(flushed, 0, sizeof flushed);
    memset(pass_flushed, 0, sizeof pass_flushed);
    pthread_mutex_init(&flush_lock, NULL);
    if (store_state == 1)
        kc__chain_after_fork_child(store);
    /* The remote's counters so far are the parent's to report. */
    if (store_state == 1 && remote != NULL) {
        memset(&remote_base, 0, sizeof remote_base);
        kc_remote_counters(remote, &remote_base);
    }
}

void kc__exit(int status)
{
    shim_fini();
    _exit(status);
}

/* glibc hands a constructor the program's arguments: a compiler tool's run
 * is decided here, before its main (tool.c). */
__attribute__((constructor)) static void shim_init(int argc, char **argv, char **envp)
{
    (void)envp;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    /* A descendant of a served nvcc records for it and is served nothing
     * itself (tree.c); nvcc itself is served whole (nvcc.c). */
    if (kc__ptree_start())
        return;
    kc__nvcc_start(argc, argv);
    kc__tool_start(argc, argv);
}

/* ---- interposition ------------------------------------------------------ */

/* The real dlsym. Hidden, read by the dlsym trampoline below. */
__attribute__((visibility("hidden"))) void *(*kc__dlsym_real)(void *, const char *);

static void resolve_real_dlsym(void)
{
    void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == NULL)
        p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&kc__dlsym_real, (void *(*)(void *, const char *))p, __ATOMIC_RELEASE);
}

void *kc__real_dlsym(void *handle, const char *name)
{
    void *(*real)(void *, const char *) = __atomic_load_n(&kc__dlsym_real, __ATOMIC_ACQUIRE);
    if (real == NULL) {
        resolve_real_dlsym();
        real = kc__dlsym_real;
    }
    return real ? real(handle, name) : NULL;
}

static bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* ---- which names may resolve to a hooked function --------------------- */

/* A name's family: the name without a trailing _ptds or _ptsz, then without
 * a trailing _v<digits>. cuMemcpyHtoD_v2_ptds and cuMemcpyHtoD are one
 * family. The real resolvers hand out a variant of the family asked for
 * (cuGetProcAddress("cuMemAlloc") is cuMemAlloc_v2), so only a name whose
 * family has a hook can come back as a hooked function. */
static size_t family_len(const char *s)
{
    size_t n = strlen(s);
    if (n > 5 && (strcmp(s + n - 5, "_ptds") == 0 || strcmp(s + n - 5, "_ptsz") == 0))
        n -= 5;
    size_t d = n;
    while (d > 0 && s[d - 1] >= '0' && s[d - 1] <= '9')
        d--;
    if (d < n && d >= 2 && s[d - 1] == 'v' && s[d - 2] == '_')
        n = d - 2;
    return n;
}

struct family {
    const char *name;
    size_t len;
};
enum { MAX_FAMILIES = 1024 }; /* hooks, before duplicates are dropped */
static struct family families[MAX_FAMILIES];
static int n_families = -1; /* -1: the table overflowed, every name may be ours */
static pthread_once_t families_once = PTHREAD_ONCE_INIT;

static int family_cmp(const char *a, size_t alen, const struct family *b)
{
    int c = memcmp(a, b->name, alen < b->len ? alen : b->len);
    return c != 0 ? c : (alen > b->len) - (alen < b->len);
}

static int family_sort_cmp(const void *a, const void *b)
{
    const struct family *x = a;
    return family_cmp(x->name, x->len, b);
}

/* Every hook table's families, sorted and without duplicates: one qsort
 * (an insertion per name cost ~1M instructions, in every process that
 * calls dlsym once). */
static void families_init(void)
{
    const struct kc__hook *tables[] = {kc__nvrtc_hooks, kc__driver_hooks, kc__link_hooks,
                                       kc__culink_hooks, kc__nvvm_hooks};
    int n = 0;
    for (int t = 0; t < 5; t++)
        for (const struct kc__hook *h = tables[t]; h->name != NULL; h++) {
            if (n == MAX_FAMILIES)
                return; /* n_families stays -1 */
            families[n++] = (struct family){h->name, family_len(h->name)};
        }
    qsort(families, (size_t)n, sizeof *families, family_sort_cmp);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (u == 0 || family_cmp(families[i].name, families[i].len, &families[u - 1]) != 0)
            families[u++] = families[i];
    n_families = u;
}

/* Hooks by pattern, for names no table lists ({library, prefix, finder}):
 * versioned names of releases later than a table. */
static const struct {
    int lib;
    const char *prefix;
    const struct kc__hook *(*find)(const char *name);
} pattern_hooks[] = {
    {KC_LIB_NVJITLINK, "__nvJitLink", kc__link_hook_pattern},
};

static bool has_pattern_hook(const char *name)
{
    for (size_t i = 0; i < sizeof pattern_hooks / sizeof *pattern_hooks; i++)
        if (strncmp(name, pattern_hooks[i].prefix, strlen(pattern_hooks[i].prefix)) == 0)
            return true;
    return false;
}

/* Whether `name` (asked of dlsym or cuGetProcAddress) can resolve to one of
 * our hooks or exports; if not, the real answer is the host's as it is,
 * with no dladdr (~2 us on libcuda or cuBLAS, whose hundreds of entry
 * points a client may resolve one by one). */
bool kc__may_be_hooked(const char *name)
{
    if (name == NULL)
        return true;
    pthread_once(&families_once, families_init);
    if (n_families < 0 || has_pattern_hook(name))
        return true;
    size_t len = family_len(name);
    int lo = 0, hi = n_families;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        int c = family_cmp(name, len, &families[mid]);
        if (c == 0)
            return true;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return false;
}

/* Which library (KC_LIB_* or 0) dladdr's answer for a function lies in. */
static int classify_info(const Dl_info *info)
{
    if (info->dli_fname == NULL)
        return 0;
    const char *base = strrchr(info->dli_fname, '/');
    base = base ? base + 1 : info->dli_fname;
    /* libnvrtc.so.13, libnvrtc.alt.so.13, a wheel's copy by absolute path;
     * never libnvrtc-builtins. */
    if (has_prefix(base, "libnvrtc.") || has_prefix(base, "libnvrtc_"))
        return KC_LIB_NVRTC;
    if (has_prefix(base, "libcuda.so"))
        return KC_LIB_CUDA;
    if (has_prefix(base, "libnvJitLink.") || has_prefix(base, "libnvJitLink_"))
        return KC_LIB_NVJITLINK;
    /* libnvvm.so.4, a wheel's libnvvm.so.N */
    if (has_prefix(base, "libnvvm."))
        return KC_LIB_NVVM;
    return 0;
}

struct export_check {
    int lib;
    const char *const *inert;
    char *unknown;
    void (*hooked)(const struct kc__hook *h, void *arg);
    void *arg;
};

/* kc__loaded_exports' callback: stops at the first export that is neither
 * hooked nor inert, copying it. */
static int export_known(const char *name, void *arg)
{
    const struct export_check *x = arg;
    const struct kc__hook *h = kc__hook_find(name, x->lib);
    if (h != NULL) {
        if (x->hooked != NULL)
            x->hooked(h, x->arg);
        return 0;
    }
    for (const char *const *i = x->inert; *i != NULL; i++)
        if (strcmp(*i, name) == 0)
            return 0;
    snprintf(x->unknown, 128, "%s", name);
    return 1;
}

void kc__unknown_export(const void *known, int lib, const char *const *inert, const char *what,
                        char unknown[128], void (*hooked)(const struct kc__hook *h, void *arg),
                        void *arg)
{
    struct export_check x = {lib, inert, unknown, hooked, arg};
    unknown[0] = '\0';
    if (kc__loaded_exports(known, export_known, &x) < 0)
        snprintf(unknown, 128, "(its symbol table)");
    if (unknown[0] != '\0')
        kc_log(KC_LOG_INFO,
               "%s exports %s, which this kcache does not know; its programs pass through "
               "uncached",
               what, unknown);
}

const struct kc__hook *kc__hook_find(const char *name, int lib)
{
    if (name == NULL)
        return NULL;
    const struct kc__hook *tables[] = {kc__nvrtc_hooks, kc__driver_hooks, kc__link_hooks,
                                       kc__culink_hooks, kc__nvvm_hooks};
    int libs[] = {KC_LIB_NVRTC, KC_LIB_CUDA, KC_LIB_NVJITLINK, KC_LIB_CUDA, KC_LIB_NVVM};
    for (int t = 0; t < 5; t++) {
        if (lib != 0 && lib != libs[t])
            continue;
        for (const struct kc__hook *h = tables[t]; h->name != NULL; h++)
            if (strcmp(h->name, name) == 0)
                return h;
    }
    for (size_t i = 0; i < sizeof pattern_hooks / sizeof *pattern_hooks; i++)
        if ((lib == 0 || lib == pattern_hooks[i].lib) &&
            strncmp(name, pattern_hooks[i].prefix, strlen(pattern_hooks[i].prefix)) == 0)
            return pattern_hooks[i].find(name);
    return NULL;
}

/* ---- the real libraries ------------------------------------------------ */

/* Per library kind (KC_LIB_*): the loaded object the real functions come
 * from once one is known (its load base, and one of its functions to find
 * it again), and a handle on it. Every real pointer of one kind comes from
 * this one object, so two copies of a library (a wheel's and the
 * toolkit's) never mix their state: a second copy's functions are handed
 * to the host untouched. */
static void *lib_base[KC_LIB_KINDS], *lib_any[KC_LIB_KINDS], *lib_handle[KC_LIB_KINDS];

static bool lib_kind_ok(int lib)
{
    return lib > 0 && lib < KC_LIB_KINDS;
}

/* Takes the object `info` describes as kind `lib`'s, if none is yet.
 * Whether it is (now) the one. */
static bool lib_adopt(int lib, const Dl_info *info, void *fn)
{
    if (!lib_kind_ok(lib) || info->dli_fbase == NULL)
        return true;
    void *expected = NULL;
    if (__atomic_compare_exchange_n(&lib_base[lib], &expected, info->dli_fbase, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&lib_any[lib], fn, __ATOMIC_RELEASE);
        return true;
    }
    return expected == info->dli_fbase;
}

/* A handle on kind `lib`'s object, once adopted (kept open: the real
 * pointers we hold must stay valid). */
static void *lib_open(int lib)
{
    void *h = __atomic_load_n(&lib_handle[lib], __ATOMIC_ACQUIRE);
    if (h != NULL)
        return h;
    void *any = __atomic_load_n(&lib_any[lib], __ATOMIC_ACQUIRE);
    Dl_info info;
    if (any == NULL || dladdr(any, &info) == 0 || info.dli_fname == NULL)
        return NULL;
    h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (h == NULL)
        return NULL;
    void *expected = NULL;
    if (!__atomic_compare_exchange_n(&lib_handle[lib], &expected, h, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        dlclose(h); /* another thread's handle on the same object */
    return __atomic_load_n(&lib_handle[lib], __ATOMIC_ACQUIRE);
}

static int classify_info(const Dl_info *info);
static void *self_base(void);

/* Per library kind, once its object is adopted and pinned (lib_open): the
 * object's address range and what dladdr says of it. A function the host
 * asks dlsym for that lies in that range is the library's without a
 * dladdr, which walks the object's symbol table (~10k instructions on
 * libnvrtc; cuda.bindings resolves its 22 hooked names inside the first
 * compile of a process). The handle keeps the range the object's. */
struct lib_range {
    uintptr_t lo, hi;
    Dl_info info; /* dli_fname, dli_fbase; no symbol */
};
static struct lib_range lib_ranges[KC_LIB_KINDS];
static int lib_range_state[KC_LIB_KINDS]; /* 0 not set up, 1 set, -1 none */
static pthread_mutex_t lib_range_lock = PTHREAD_MUTEX_INITIALIZER;

struct range_scan {
    uintptr_t addr, lo, hi;
};

/* dl_iterate_phdr callback: the span of the PT_LOAD segments of the
 * object holding r->addr. */
static int range_one(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct range_scan *r = arg;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
        mine |= r->addr >= a && r->addr < b;
    }
    if (!mine)
        return 0;
    r->lo = lo;
    r->hi = hi;
    return 1;
}

static void *lib_open(int lib);

/* Sets up kind lib's range (lib_range_lock held). */
static void lib_range_setup(int lib)
{
    void *any = __atomic_load_n(&lib_any[lib], __ATOMIC_ACQUIRE);
    struct range_scan r = {.addr = (uintptr_t)any};
    struct lib_range *lr = &lib_ranges[lib];
    int state = -1;
    if (any != NULL && lib_open(lib) != NULL && dladdr(any, &lr->info) != 0 &&
        lr->info.dli_fname != NULL && lr->info.dli_fbase == lib_base[lib] &&
        dl_iterate_phdr(range_one, &r) == 1) {
        lr->lo = r.lo;
        lr->hi = r.hi;
        lr->info.dli_sname = NULL;
        lr->info.dli_saddr = NULL;
        state = 1;
    }
    __atomic_store_n(&lib_range_state[lib], state, __ATOMIC_RELEASE);
}

/* This shim's own range: a host resolving a hooked name with RTLD_DEFAULT
 * or a handle whose scope holds the preload finds our export first. */
static struct range_scan self_range;
static pthread_once_t self_range_once = PTHREAD_ONCE_INIT;

static void self_range_init(void)
{
    struct range_scan r = {.addr = (uintptr_t)self_range_init};
    if (dl_iterate_phdr(range_one, &r) == 1)
        self_range = r;
}

static bool self_range_has(const void *fn)
{
    pthread_once(&self_range_once, self_range_init);
    return (uintptr_t)fn >= self_range.lo && (uintptr_t)fn < self_range.hi;
}

/* dladdr's answer, less the symbol, for fn in an adopted library's range;
 * false when fn lies in none (then dladdr decides). */
static bool lib_range_find(const void *fn, Dl_info *info)
{
    for (int lib = 1; lib < KC_LIB_KINDS; lib++) {
        int state = __atomic_load_n(&lib_range_state[lib], __ATOMIC_ACQUIRE);
        if (state == 0 && __atomic_load_n(&lib_base[lib], __ATOMIC_ACQUIRE) != NULL) {
            pthread_mutex_lock(&lib_range_lock);
            if (lib_range_state[lib] == 0)
                lib_range_setup(lib);
            pthread_mutex_unlock(&lib_range_lock);
            state = __atomic_load_n(&lib_range_state[lib], __ATOMIC_ACQUIRE);
        }
        const struct lib_range *lr = &lib_ranges[lib];
        if (state == 1 && (uintptr_t)fn >= lr->lo && (uintptr_t)fn < lr->hi) {
            *info = lr->info;
            return true;
        }
    }
    return false;
}

/* Loaded objects of one kind, by path, in load order (dl_iterate_phdr
 * holds the loader's list lock; nothing is opened inside it). */
enum { SCAN_MAX = 4 };
struct scan {
    int lib, n;
    char path[SCAN_MAX][PATH_MAX];
};

static int scan_one(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct scan *sc = arg;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0' ||
        (void *)info->dlpi_addr == self_base())
        return 0;
    Dl_info d = {.dli_fname = info->dlpi_name};
    size_t len = strlen(info->dlpi_name);
    if (classify_info(&d) != sc->lib || len >= PATH_MAX)
        return 0;
    memcpy(sc->path[sc->n], info->dlpi_name, len + 1);
    return ++sc->n == SCAN_MAX;
}

/* `name` in the first loaded object of kind `lib` that defines it, in
 * load order: libraries loaded RTLD_LOCAL (an extension module's libcuda,
 * a wheel's NVRTC) are in no scope we can search by name. */
static void *lib_scan(int lib, const char *name)
{
    struct scan sc = {.lib = lib};
    dl_iterate_phdr(scan_one, &sc);
    for (int i = 0; i < sc.n; i++) {
        void *h = dlopen(sc.path[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        void *p = kc__real_dlsym(h, name);
        dlclose(h);
        Dl_info info;
        /* Its own definition, not one of its dependencies'. */
        if (p != NULL && dladdr(p, &info) != 0 && info.dli_fname != NULL &&
            strcmp(info.dli_fname, sc.path[i]) == 0)
            return p;
    }
    return NULL;
}

void *kc__lib_real(int lib, const char *name)
{
    if (!lib_kind_ok(lib) || name == NULL)
        return NULL;
    if (__atomic_load_n(&lib_base[lib], __ATOMIC_ACQUIRE) == NULL) {
        void *p = lib_scan(lib, name);
        Dl_info info;
        if (p == NULL || dladdr(p, &info) == 0)
            return NULL;
        if (lib_adopt(lib, &info, p))
            return p;
    }
    void *h = lib_open(lib);
    return h != NULL ? kc__real_dlsym(h, name) : NULL;
}

void *kc__hook_real(const struct kc__hook *h)
{
    void *p = __atomic_load_n(h->real, __ATOMIC_ACQUIRE);
    if (p != NULL)
        return p;
    /* Linked directly and loaded globally: the real library (or another
     * interposer, which then calls it) follows us in the global scope. A
     * copy of the library other than the one adopted is not used. */
    p = kc__real_dlsym(RTLD_NEXT, h->name);
    Dl_info info;
    if (p != NULL && dladdr(p, &info) != 0 && classify_info(&info) == h->lib &&
        !lib_adopt(h->lib, &info, p))
        p = NULL;
    /* A library loaded RTLD_LOCAL (Python's extension modules, ctypes)
     * that links the real one binds to our export: the real one is then in
     * no global scope, but loaded. */
    if (p == NULL)
        p = kc__lib_real(h->lib, h->name);
    if (p != NULL) {
        void *expected = NULL;
        __atomic_compare_exchange_n(h->real, &expected, p, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
        p = __atomic_load_n(h->real, __ATOMIC_ACQUIRE);
    }
    return p;
}

static void *self_base(void)
{
    static void *base;
    if (base == NULL) {
        Dl_info info;
        if (dladdr((void *)self_base, &info) != 0)
            base = info.dli_fbase;
    }
    return base;
}

/* kc__swap with dladdr's answer for fn already in hand. */
static void *swap_info(const char *asked, void *fn, const Dl_info *info)
{
    const char *sym = info->dli_sname;
    int lib = classify_info(info);
    if (lib == 0)
        return fn;
    /* The symbol the library actually returned decides the wrapper, so a
     * request for "cuMemAlloc" answered with cuMemAlloc_v2 gets ours for
     * cuMemAlloc_v2. Without a symbol name, fall back to the asked one. */
    const struct kc__hook *h = kc__hook_find(sym != NULL ? sym : asked, lib);
    if (h == NULL)
        return fn;
    const struct kc_config *cfg = kc__config();
    if (cfg->disable)
        return fn;
    /* The copy in the global scope, if there is one, is the one callers
     * linked against the library reach through our exports: it is adopted
     * first, and a private copy the host dlsym'd is then a second one. */
    if (__atomic_load_n(&lib_base[lib], __ATOMIC_ACQUIRE) == NULL) {
        void *g = kc__real_dlsym(RTLD_NEXT, sym != NULL ? sym : asked);
        Dl_info gi;
        if (g != NULL && g != fn && dladdr(g, &gi) != 0 && classify_info(&gi) == lib)
            lib_adopt(lib, &gi, g);
    }
    /* A second copy of the library: our wrappers forward to the adopted
     * one, so hand this one out untouched (never mix two copies' state). */
    if (!lib_adopt(lib, info, fn))
        return fn;
    void *expected = NULL;
    __atomic_compare_exchange_n(h->real, &expected, fn, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (expected != NULL && expected != fn) {
        /* A second copy of the library: our wrapper forwards to the first
         * one found, so hand this one out untouched. */
        return fn;
    }
    return h->wrapper != NULL ? h->wrapper : fn;
}

void *kc__swap(const char *asked, void *fn)
{
    Dl_info info;
    if (fn == NULL || !kc__may_be_hooked(asked) || dladdr(fn, &info) == 0)
        return fn;
    return swap_info(asked, fn, &info);
}

/* dlsym(handle, name) for every handle but RTLD_NEXT (the trampoline
 * forwards that one to the real dlsym with the caller's return address
 * intact, since RTLD_NEXT is relative to the caller). */
__attribute__((visibility("hidden"))) void *kc__dlsym_impl(void *handle, const char *name)
{
    void *r = kc__real_dlsym(handle, name);
    if (r == NULL || name == NULL || kc__guard_held())
        return r;
    if (!kc__may_be_hooked(name))
        return r;
    /* One dladdr serves both questions: whose export this is, and which;
     * none for a function of a library already adopted (the name asked is
     * the symbol dlsym found). */
    Dl_info info;
    bool own = self_range_has(r);
    if (!own && !lib_range_find(r, &info) && dladdr(r, &info) == 0)
        return r;
    if (own || info.dli_fbase == self_base()) {
        /* RTLD_DEFAULT found our own export. It exists for the host only if
         * the real library is loaded too. */
        const struct kc__hook *h = kc__hook_find(name, 0);
        if (h == NULL)
            return r;
        return kc__real_dlsym(RTLD_NEXT, name) != NULL ? r : NULL;
    }
    return swap_info(name, r, &info);
}

/* Whether `name` is one of our hooks: dlsym(RTLD_NEXT, name) then needs
 * the slow path below, since the real answer may be our own export. */
__attribute__((visibility("hidden"))) int kc__dlsym_hooked(const char *name)
{
    return name != NULL && kc__hook_find(name, 0) != NULL;
}

/* Position of object `l` in the link-map list, or -1. */
static int map_index(const struct link_map *l)
{
    int i = 0;
    struct link_map *m = NULL;
    Dl_info info;
    if (dladdr1((void *)map_index, &info, (void **)&m, RTLD_DL_LINKMAP) == 0 || m == NULL)
        return -1;
    while (m->l_prev != NULL)
        m = m->l_prev;
    for (; m != NULL; m = m->l_next, i++)
        if (m == l)
            return i;
    return -1;
}

static struct link_map *map_of(const void *addr)
{
    Dl_info info;
    struct link_map *l = NULL;
    if (addr == NULL || dladdr1(addr, &info, (void **)&l, RTLD_DL_LINKMAP) == 0)
        return NULL;
    return l;
}

/* dlsym(RTLD_NEXT, name) for a hooked name. RTLD_NEXT is relative to the
 * caller, and the trampoline jumped here, so our return address is the
 * host's. The answer is the first definition in the global scope after the
 * caller, as without the shim (never our own export); a hooked function
 * found in the real library is swapped for our wrapper. */
__attribute__((visibility("hidden"), noinline)) void *kc__dlsym_next(void *handle, const char *name)
{
    struct link_map *caller = map_of(__builtin_return_address(0));
    if (caller == NULL)
        return NULL;
    /* The global scope after this shim, which is preloaded right after the
     * executable: exactly the answer for a caller before us. */
    void *r = kc__real_dlsym(RTLD_NEXT, name);
    struct link_map *found = map_of(r);
    bool global = r != NULL && found != NULL;
    if (global) {
        int ci = map_index(caller), fi = map_index(found);
        if (ci >= 0 && fi > ci)
            return kc__guard_held() ? r : kc__swap(name, r);
    }
    /* A caller loaded RTLD_LOCAL searches its own dependencies (a libcuda
     * no global scope holds). */
    if (caller->l_name != NULL && caller->l_name[0] != '\0') {
        void *h = dlopen(caller->l_name, RTLD_LAZY | RTLD_NOLOAD);
        r = h != NULL ? kc__real_dlsym(h, name) : NULL;
        if (h != NULL)
            dlclose(h);
        found = map_of(r);
        if (r != NULL && found != NULL && found != caller && (void *)found->l_addr != self_base())
            return kc__guard_held() ? r : kc__swap(name, r);
    }
    /* The caller comes after the definition found (an interposer of the
     * same name loaded after us): search only the objects after it. With
     * no definition in the global scope at all there is none after it
     * either (a library some other object loaded RTLD_LOCAL is in no scope
     * of the caller's). */
    for (struct link_map *l = global ? caller->l_next : NULL; l != NULL; l = l->l_next) {
        if ((void *)l->l_addr == self_base() || l->l_name == NULL || l->l_name[0] == '\0')
            continue;
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (h == NULL)
            continue;
        r = kc__real_dlsym(h, name);
        dlclose(h);
        if (r != NULL && map_of(r) == l)
            return kc__guard_held() ? r : kc__swap(name, r);
    }
    return NULL;
}

/* Where the dlsym trampoline goes for (handle, name). The real dlsym is
 * resolved here when still unknown: a preloaded library's constructor may
 * call dlsym(RTLD_NEXT, ...) before ours runs (libfaketime, libeatmydata
 * after us in LD_PRELOAD), and must get exactly the real answer for its
 * own place, never one computed from ours. */
__attribute__((visibility("hidden"))) void *kc__dlsym_route(void *handle, const char *name)
{
    void *real = (void *)__atomic_load_n(&kc__dlsym_real, __ATOMIC_ACQUIRE);
    if (real == NULL) {
        resolve_real_dlsym();
        real = (void *)__atomic_load_n(&kc__dlsym_real, __ATOMIC_ACQUIRE);
    }
    if (handle != RTLD_NEXT)
        return (void *)kc__dlsym_impl;
    /* For a hooked name the real answer could be our own export. */
    if (kc__dlsym_hooked(name))
        return (void *)kc__dlsym_next;
    return real != NULL ? real : (void *)kc__dlsym_impl;
}

#if defined(__x86_64__)
/* dlsym itself. RTLD_NEXT ((void *)-1) is relative to the caller, so it
 * must reach the real dlsym (or kc__dlsym_next) with the host's return
 * address intact: a jump, not a call. kc__dlsym_route says where (the
 * stack is 16-byte aligned at its call: entry's 8 plus 24). */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"
        "    call kc__dlsym_route\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "    jmp *%rax\n"
        ".size dlsym, .-dlsym\n");
#else
KC_EXPORT void *dlsym(void *handle, const char *name)
{
    return kc__dlsym_impl(handle, name);
}
#endif

__attribute__((constructor(101))) static void dlsym_init(void)
{
    resolve_real_dlsym();
}
