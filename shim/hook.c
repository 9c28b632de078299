/*
 * The hook mechanism every family shares: the real dlsym, the families'
 * hook tables (each registered with KC__FAMILY, hook.h), which names may
 * resolve to a hook, the real libraries a hook forwards to (one adopted
 * copy of each), and the swap of a real function for its wrapper that
 * the dlsym interposer (shim.c) and cuGetProcAddress (driver.c) make.
 */
#include "hook.h"
#include "core.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The families' descriptors, in link order (shim/meson.build): the linker
 * gathers every KC__FAMILY of the library into one section and names its
 * ends; a build with no family has none. */
extern const struct kc__family *const __start_kc_families[]
    __attribute__((weak, visibility("hidden")));
extern const struct kc__family *const __stop_kc_families[]
    __attribute__((weak, visibility("hidden")));
#define KC__FAMILIES_BEGIN __start_kc_families
#define KC__FAMILIES_END __stop_kc_families

/* ---- interposition ------------------------------------------------------ */

/* The real dlsym. Hidden, read by the dlsym interposer (shim.c). */
KC__HOT __attribute__((visibility("hidden"))) void *(*kc__dlsym_real)(void *, const char *);

void kc__real_dlsym_resolve(void)
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
        kc__real_dlsym_resolve();
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
KC__HOT static pthread_once_t families_once = PTHREAD_ONCE_INIT;

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
    int n = 0;
    for (const struct kc__family *const *f = KC__FAMILIES_BEGIN; f < KC__FAMILIES_END; f++)
        for (const struct kc__hook *h = (*f)->hooks; h->name != NULL; h++) {
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

static bool has_pattern_hook(const char *name)
{
    for (const struct kc__family *const *f = KC__FAMILIES_BEGIN; f < KC__FAMILIES_END; f++)
        if ((*f)->prefix != NULL && strncmp(name, (*f)->prefix, strlen((*f)->prefix)) == 0)
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
    for (const struct kc__family *const *f = KC__FAMILIES_BEGIN; f < KC__FAMILIES_END; f++) {
        if (lib != 0 && lib != (*f)->lib)
            continue;
        for (const struct kc__hook *h = (*f)->hooks; h->name != NULL; h++)
            if (strcmp(h->name, name) == 0)
                return h;
    }
    for (const struct kc__family *const *f = KC__FAMILIES_BEGIN; f < KC__FAMILIES_END; f++)
        if ((*f)->prefix != NULL && (lib == 0 || lib == (*f)->lib) &&
            strncmp(name, (*f)->prefix, strlen((*f)->prefix)) == 0)
            return (*f)->pattern(name);
    return NULL;
}

/* ---- the real libraries ------------------------------------------------ */

/* Per library kind (KC_LIB_*): the loaded object the real functions come
 * from once one is known (its load base, and one of its functions to find
 * it again), and a handle on it. Every real pointer of one kind comes from
 * this one object, so two copies of a library (a wheel's and the
 * toolkit's) never mix their state: a second copy's functions are handed
 * to the host untouched. */
KC__HOT static void *lib_base[KC_LIB_KINDS], *lib_any[KC_LIB_KINDS], *lib_handle[KC_LIB_KINDS];

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
KC__HOT static struct lib_range lib_ranges[KC_LIB_KINDS];
KC__HOT static int lib_range_state[KC_LIB_KINDS]; /* 0 not set up, 1 set, -1 none */
KC__HOT static pthread_mutex_t lib_range_lock = PTHREAD_MUTEX_INITIALIZER;

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
KC__HOT static struct range_scan self_range;
KC__HOT static pthread_once_t self_range_once = PTHREAD_ONCE_INIT;

static void self_range_init(void)
{
    struct range_scan r = {.addr = (uintptr_t)self_range_init};
    if (dl_iterate_phdr(range_one, &r) == 1)
        self_range = r;
}

bool kc__self_range_has(const void *fn)
{
    pthread_once(&self_range_once, self_range_init);
    return (uintptr_t)fn >= self_range.lo && (uintptr_t)fn < self_range.hi;
}

/* dladdr's answer, less the symbol, for fn in an adopted library's range;
 * false when fn lies in none (then dladdr decides). */
bool kc__lib_range_find(const void *fn, Dl_info *info)
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
        (void *)info->dlpi_addr == kc__self_base())
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

void *kc__self_base(void)
{
    KC__HOT static void *base;
    if (base == NULL) {
        Dl_info info;
        if (dladdr((void *)kc__self_base, &info) != 0)
            base = info.dli_fbase;
    }
    return base;
}

/* kc__swap with dladdr's answer for fn already in hand. */
void *kc__swap_info(const char *asked, void *fn, const Dl_info *info)
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
    return kc__swap_info(asked, fn, &info);
}
