/*
 * The shim's entry: its constructors (where libkcache.so lies, the fork
 * handlers, a compiler tool's or nvcc's run decided before main), its
 * destructor (the counters and the KCACHE_STATS line), and the dlsym
 * interposer that swaps our wrappers into dlopen'd NVRTC and libcuda. The
 * families register their hook tables with the mechanism (hook.h); this
 * file names none of them.
 */
#include "shim.h"
#include "tree.h"
#include "tool.h"

#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* libkcache.so's absolute path, before main can change the working
 * directory (core.c). The first constructor of the library. */
__attribute__((constructor)) static void self_locate(void)
{
    kc__self_locate();
}

__attribute__((destructor)) static void shim_fini(void)
{
    kc__state_fini();
}

/* glibc hands a constructor the program's arguments: a compiler tool's run
 * is decided here, before its main (tool.c). */
__attribute__((constructor)) static void shim_init(int argc, char **argv, char **envp)
{
    (void)envp;
    kc__state_atfork();
    /* A descendant of a served nvcc records for it and is served nothing
     * itself (tree.c); nvcc itself is served whole (nvcc.c). */
    if (kc__ptree_start())
        return;
    kc__nvcc_start(argc, argv);
    kc__tool_start(argc, argv);
}

/* ---- the dlsym interposer ------------------------------------------------ */

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
    bool own = kc__self_range_has(r);
    if (!own && !kc__lib_range_find(r, &info) && dladdr(r, &info) == 0)
        return r;
    if (own || info.dli_fbase == kc__self_base()) {
        /* RTLD_DEFAULT found our own export. It exists for the host only if
         * the real library is loaded too. */
        const struct kc__hook *h = kc__hook_find(name, 0);
        if (h == NULL)
            return r;
        return kc__real_dlsym(RTLD_NEXT, name) != NULL ? r : NULL;
    }
    return kc__swap_info(name, r, &info);
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
        if (r != NULL && found != NULL && found != caller &&
            (void *)found->l_addr != kc__self_base())
            return kc__guard_held() ? r : kc__swap(name, r);
    }
    /* The caller comes after the definition found (an interposer of the
     * same name loaded after us): search only the objects after it. With
     * no definition in the global scope at all there is none after it
     * either (a library some other object loaded RTLD_LOCAL is in no scope
     * of the caller's). */
    for (struct link_map *l = global ? caller->l_next : NULL; l != NULL; l = l->l_next) {
        if ((void *)l->l_addr == kc__self_base() || l->l_name == NULL || l->l_name[0] == '\0')
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
        kc__real_dlsym_resolve();
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
    kc__real_dlsym_resolve();
}
