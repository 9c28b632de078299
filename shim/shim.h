/*
 * Internals shared by the shim's parts (not installed, not exported).
 *
 * libkcache.so is built with -fvisibility=hidden; only the intercepted
 * CUDA/NVRTC/libc names are exported (KC_EXPORT). Internal non-static names
 * carry the kc__ prefix.
 */
#ifndef KCACHE_SHIM_H
#define KCACHE_SHIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/config.h"
#include "../common/log.h"
#include "../common/clock.h"
#include "../common/identity.h"
#include "../store/store.h"

#define KC_EXPORT __attribute__((visibility("default")))

/* ---- state ---------------------------------------------------------- */

/* The configuration, read once on first use (thread-safe). */
const struct kc_config *kc__config(void);

/* The store (the front, front.h), opened on first call. Returns NULL when
 * the cache is off or the store cannot be used (one warning was logged);
 * *api, the operations on it, is set when non-NULL is returned. */
struct kc_store *kc__store(const struct kc_store_ops **api);

/* The remote tier's handle (KCACHE_REMOTE), set up with the store; NULL
 * when none is configured or the store is not open. Hosts only read it
 * (the chain's remote tier) and take its cluster-wide locks (flight.h). */
struct kc_remote;
struct kc_remote *kc__remote(void);

/* Adds to this process's counters of `backend` (printed by KCACHE_STATS and
 * handed to the store at exit). Thread-safe. */
void kc__count(const char *backend, const struct kc_counters *c);

/* Notes why one request of `backend` passed through (its pass-through
 * itself is counted with kc__count). Thread-safe. */
void kc__pass_reason(const char *backend, enum kc_pass_reason r);

/* Forward safety (docs/internals.md): the first export of the library the
 * function `known` lies in that is neither a hook of `lib` nor named in
 * `inert` (NULL-terminated), copied to `unknown` (128 bytes; "" when none,
 * "(its symbol table)" when it cannot be read). Logs one info line naming
 * it, for `what` ("NVRTC 13.0"). `hooked` (may be NULL) is called with
 * `arg` for each export that is one of the hooks, in the same walk of the
 * library's symbol table, up to the first unknown one. */
struct kc__hook;
void kc__unknown_export(const void *known, int lib, const char *const *inert, const char *what,
                        char unknown[128], void (*hooked)(const struct kc__hook *h, void *arg),
                        void *arg);

/* libkcache.so's absolute path, found before main; NULL when unknown. */
const char *kc__self_path(void);

/* Called before main with the program's arguments: when this process is a
 * compiler tool kcache serves (tool.c), a hit replays the run and exits, a
 * miss runs the tool in a watched child and exits with its status; returns
 * in every other case (and in that child). */
void kc__tool_start(int argc, char **argv);

/* Called before main: when this process is nvcc, a hit replays its whole
 * run and exits, a miss runs it in a watched child whose tree reports
 * (nvcc.c, tree.h) and exits; returns in every other case (and in that
 * child). */
void kc__nvcc_start(int argc, char **argv);

/* In a compiler tool's watched child: no counters, no stats line. */
void kc__tool_child(void);

/* Leaves the process with `status` from a constructor, where exit() would
 * run no destructor (the loader registers them after the constructors):
 * the counters are flushed and the stats line printed first. */
__attribute__((noreturn)) void kc__exit(int status);

/* ---- re-entry guard --------------------------------------------------- */

/* NVRTC's compile dlopen()s libcuda and calls cuInit; hooks run inside
 * hooks. A hook that finds the guard held on its thread passes straight
 * through to the real function. enter() returns false when already held. */
bool kc__guard_enter(void);
void kc__guard_exit(void);
bool kc__guard_held(void);

/* ---- interposition ---------------------------------------------------- */

/* One intercepted entry point. `real` is filled the first time the real
 * function is found (dlsym(RTLD_NEXT), a dlsym() the host made, or
 * cuGetProcAddress). */
struct kc__hook {
    const char *name; /* exact exported name, e.g. "cuMemAlloc_v2" */
    void *wrapper;    /* our function */
    void **real;      /* where the real pointer is kept */
    int lib;          /* KC_LIB_* the real one must come from */
};

enum { KC_LIB_NVRTC = 1, KC_LIB_CUDA = 2, KC_LIB_NVJITLINK = 3, KC_LIB_NVVM = 4 };
/* One more than the last kind: the size of an array indexed by kind. */
enum { KC_LIB_KINDS = KC_LIB_NVVM + 1 };

/* Each part registers its table (NULL-name terminated). */
extern const struct kc__hook kc__nvrtc_hooks[];
extern const struct kc__hook kc__driver_hooks[];
extern const struct kc__hook kc__link_hooks[];   /* link.c: nvJitLink */
extern const struct kc__hook kc__culink_hooks[]; /* culink.c: the driver's cuLink* */
extern const struct kc__hook kc__nvvm_hooks[];   /* nvvm.c: libNVVM */

/* The hook of a name no table lists but a family's pattern takes (link.c:
 * __nvJitLink<Fn>_<major>_<minor> of a release later than its table), given
 * one of a few spare slots on first sight; NULL for any other name. */
const struct kc__hook *kc__link_hook_pattern(const char *name);

/* Finds the hook for `name` in library `lib` (0: any), or NULL: the
 * tables first, then the patterns. */
const struct kc__hook *kc__hook_find(const char *name, int lib);

/* Resolves *h->real if still unset: dlsym(RTLD_NEXT, name) when that is in
 * the adopted copy of the library (or another interposer), else
 * kc__lib_real. Returns it; NULL only when the library is not loaded. */
void *kc__hook_real(const struct kc__hook *h);

/* `name` in the loaded library of kind `lib` (KC_LIB_*) the shim forwards
 * to: the copy adopted when the first real function of that kind was
 * found, else the first loaded one that defines it, wherever it is loaded
 * (RTLD_LOCAL included). NULL when none is loaded or it lacks `name`. */
void *kc__lib_real(int lib, const char *name);

/* Whether `name` (asked of a resolver) may come back as one of our hooks:
 * its family (the name without _ptds/_ptsz and _v<N>) has a hook. */
bool kc__may_be_hooked(const char *name);

/* Swaps `fn` (from the real resolver, asked for `asked`) for our wrapper
 * when one matches the symbol actually returned (dladdr's name for it, which
 * may differ from the name asked for: versioned variants); records the real
 * pointer.
 * Returns what the caller should hand the host. */
void *kc__swap(const char *asked, void *fn);

/* The real dlsym (dlvsym GLIBC_2.34, else GLIBC_2.2.5). */
void *kc__real_dlsym(void *handle, const char *name);

/* kcache's own build (the seed's build id): the build-id of libkcache.so. */
uint64_t kc__self_build(void);

#endif
