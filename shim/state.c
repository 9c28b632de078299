/*
 * This process's state: the store (the front, front.c) and the remote,
 * opened on first use, the counters and the KCACHE_STATS line, and what a
 * fork resets. The entry (shim.c) calls kc__state_fini at exit and
 * registers the fork handlers; the families count and store.
 */
#include "shim.h"
#include "front.h"
#include "flight.h"
#include "../store/local/chain.h"
#include "../store/remote/remote.h"
#include "../common/served.h"
#include "../common/trust.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the store, loaded on first use ----------------------------------- */

KC__HOT static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
KC__HOT static int store_state; /* 0 untried, 1 open, -1 unusable */
KC__HOT static struct kc_store *store;

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
KC__HOT static struct kc_counters counters[N_BACKENDS];
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
    if (kc__config_loaded())
        return kc__config()->stats;
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

void kc__state_fini(void)
{
    if (tool_child)
        return;
    /* Whether this process reached kcache: a hook ran or the dlsym
     * interposer handed out a wrapper (both read the configuration, which
     * is read on first use), before stats_wanted reads it itself. */
    bool reached = kc__config_loaded();
    bool want_stats = stats_wanted();
    bool passed = false;
    for (int i = 0; i < N_BACKENDS; i++)
        passed |= __atomic_load_n(&counters[i].passthrough, __ATOMIC_RELAXED) != 0;
    if (__atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 0 && !want_stats && !passed)
        return;
    /* A process whose every request passed through (a library kcache does
     * not know, options it leaves to the library) has not opened the
     * store: it does now, so that kcache stats counts those and says why. */
    if (passed && __atomic_load_n(&store_state, __ATOMIC_ACQUIRE) == 0 && kc__config_loaded() &&
        !kc__config()->readonly && !kc__config()->disable)
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
    if (st != NULL && !kc__config()->readonly) {
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
    if (any_served && st != NULL && !kc__config()->readonly) {
        int src = kc_served_update(kc__config()->dir, served);
        if (src != 0)
            kc_log(KC_LOG_DEBUG, "cannot record the libraries served in %s/%s: %s",
                   kc__config()->dir, KC_SERVED_FILE, strerror(-src));
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

void kc__state_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

void kc__exit(int status)
{
    kc__state_fini();
    _exit(status);
}
