/*
 * The hook mechanism (hook.c): the families' hook tables, the real
 * libraries a hook forwards to, and what the dlsym interposer (shim.c) and
 * cuGetProcAddress (driver.c) swap. Not installed, not exported.
 */
#ifndef KCACHE_SHIM_HOOK_H
#define KCACHE_SHIM_HOOK_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>

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

/* One family's hooks: the table of one library's intercepted names (NULL-name
 * terminated), all of library `lib`, and optionally the names a pattern
 * takes that no table lists (link.c: __nvJitLink<Fn>_<major>_<minor> of a
 * release later than its table): `pattern` gives such a name, which starts
 * with `prefix`, one of a few spare slots on first sight; NULL for any
 * other name. */
struct kc__family {
    int lib;
    const struct kc__hook *hooks;
    const char *prefix;
    const struct kc__hook *(*pattern)(const char *name);
};

/* Registers a family with the mechanism: a pointer to its descriptor in the
 * section kc_families, which hook.c walks (in link order), so nothing below
 * a family names its table. One per table, at file scope. */
#define KC__FAMILY(id, ...)                                                                        \
    static const struct kc__family kc__family_##id = {__VA_ARGS__};                                \
    __attribute__((                                                                                \
        used, section("kc_families"))) static const struct kc__family *const kc__family_at_##id =  \
        &kc__family_##id

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

/* For the dlsym interposer (shim.c). */

/* The real dlsym once resolved (hidden; the trampoline's route reads it). */
extern __attribute__((visibility("hidden"))) void *(*kc__dlsym_real)(void *, const char *);

/* Resolves it. */
void kc__real_dlsym_resolve(void);

/* Whether fn lies in this shim. */
bool kc__self_range_has(const void *fn);

/* dladdr's answer, less the symbol, for fn in an adopted library's range;
 * false when fn lies in none (then dladdr decides). */
bool kc__lib_range_find(const void *fn, Dl_info *info);

/* libkcache.so's load base. */
void *kc__self_base(void);

/* kc__swap with dladdr's answer for fn already in hand. */
void *kc__swap_info(const char *asked, void *fn, const Dl_info *info);

#endif
