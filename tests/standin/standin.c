/*
 * The stand-in driver: a test double for libcuda.so.1.
 *
 * There is no GPU and no real driver on the machines that build and test
 * kcache, so the driver-path tests run against this library instead. It is
 * built as build/tests/standin/libcuda.so.1 (SONAME libcuda.so.1) and put
 * first on LD_LIBRARY_PATH. It models, strictly and with the real CUDA 13
 * error codes, what the shim relies on: devices, contexts (created and
 * primary, with per-thread current-context stacks), modules and the library
 * API, the JIT linker, device memory with a configurable limit, and
 * cuGetProcAddress with versioned and per-thread-stream variants, and the
 * pointer queries (every cuPointerGetAttribute attribute, cuPointerGetAttributes,
 * cuPointerSetAttribute, cuMemGetAddressRange) as the driver documents them.
 *
 * PTX is really compiled, with nvJitLink, for the device's architecture, so
 * a cold load costs what a JIT costs. Cubin images are checked (ELF, EM_CUDA,
 * architecture) and their kernel entries read from the symbol table.
 *
 * It is a test double, not a driver: nothing runs on a device. Environment
 * (every name starts with KCACHE_TEST_ so kcache's config ignores it):
 *   KCACHE_TEST_STANDIN_CC       compute capability, "9.0" by default
 *   KCACHE_TEST_STANDIN_DEVICES  number of devices, 1 by default
 *   KCACHE_TEST_STANDIN_MEM      device memory per device (K/M/G suffix), 80G
 *   KCACHE_TEST_STANDIN_VERSION  cuDriverGetVersion, 13000 by default
 *   KCACHE_TEST_STANDIN_COUNTS   file to which one line of call counters is
 *                                appended at exit ("standin pid=N jit=J ...")
 *   KCACHE_TEST_STANDIN_TRACE    print each call to stderr
 *   KCACHE_TEST_STANDIN_REUSE    1: reuse module and library handles after
 *                                unload (off: use after unload is reported)
 *
 * Handles are tagged integers into per-type tables, never dereferenced
 * pointers, so a garbage or stale handle is detected instead of crashing.
 * Context slots are reused after destroy (as the real driver reuses
 * addresses), each creation getting a fresh cuCtxGetId; module, library and
 * function handles are never reused, so use after unload is reported.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
/* nvJitLink is this driver's private JIT, as the real driver's linker is
 * its own: its functions are reached through pointers found with dlvsym
 * (never interposed), so a preloaded shim's nvJitLink hooks never see the
 * stand-in's JIT, as they never see the real driver's. */
#define __nvJitLinkCreate_13_0 (*si_jl_create)
#define __nvJitLinkDestroy_13_0 (*si_jl_destroy)
#define __nvJitLinkAddData_13_0 (*si_jl_add_data)
#define __nvJitLinkComplete_13_0 (*si_jl_complete)
#define __nvJitLinkGetLinkedCubinSize_13_0 (*si_jl_cubin_size)
#define __nvJitLinkGetLinkedCubin_13_0 (*si_jl_cubin)
#define __nvJitLinkGetErrorLogSize_13_0 (*si_jl_error_size)
#define __nvJitLinkGetErrorLog_13_0 (*si_jl_error)
#define __nvJitLinkGetInfoLogSize_13_0 (*si_jl_info_size)
#define __nvJitLinkGetInfoLog_13_0 (*si_jl_info)
#include <nvJitLink.h>
#include <dlfcn.h>

#include <ctype.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"

#define SI_EXPORT __attribute__((visibility("default")))

/* ---- call counters ------------------------------------------------- */

/* Every exported entry point, for the counters and for cuGetProcAddress. */
/* One entry a line (clang-format would run them together). */
// clang-format off
#define SI_FUNCS(X)                                                                              \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)          \
    X(cuDeviceGetAttribute) X(cuDeviceComputeCapability) X(cuDeviceTotalMem)                       \
    X(cuDeviceTotalMem_v2) X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)    \
    X(cuCtxDestroy) X(cuCtxDestroy_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetId)         \
    X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuCtxPushCurrent) X(cuCtxPushCurrent_v2)               \
    X(cuCtxPopCurrent) X(cuCtxPopCurrent_v2) X(cuDevicePrimaryCtxRetain)                           \
    X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset)        \
    X(cuDevicePrimaryCtxReset_v2) X(cuDevicePrimaryCtxGetState) X(cuModuleLoadData)                \
    X(cuModuleLoadDataEx) X(cuModuleLoadFatBinary) X(cuModuleUnload) X(cuModuleGetFunction)        \
    X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel) X(cuKernelGetFunction)           \
    X(cuKernelGetName) X(cuKernelGetLibrary) X(cuFuncGetName) X(cuFuncGetModule)                   \
    X(cuLinkCreate) X(cuLinkCreate_v2) X(cuLinkAddData) X(cuLinkAddData_v2) X(cuLinkComplete)      \
    X(cuLinkAddFile) X(cuLinkAddFile_v2) X(cuLinkDestroy) X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemFree) X(cuMemFree_v2) X(cuMemGetInfo)   \
    X(cuMemGetInfo_v2) X(cuMemAllocManaged) X(cuMemGetAddressRange_v2) X(cuPointerGetAttribute)    \
    X(cuPointerGetAttributes) X(cuPointerSetAttribute)                                             \
    X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds)          \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuGetProcAddress) X(cuGetProcAddress_v2)            \
    X(cuGetErrorString) X(cuGetErrorName)                                                          \
    X(cuModuleLoad) X(cuLibraryLoadFromFile)
// clang-format on

enum {
#define SI_ENUM(n) SI_F_##n,
    SI_FUNCS(SI_ENUM)
#undef SI_ENUM
        SI_F_COUNT
};

static const char *const si_fnames[] = {
#define SI_NAME(n) #n,
    SI_FUNCS(SI_NAME)
#undef SI_NAME
};

static _Atomic uint64_t si_calls[SI_F_COUNT];
static _Atomic uint64_t si_jit;             /* PTX compilations */
static _Atomic uint64_t si_jit_ns;          /* time spent in them */
static _Atomic uint64_t si_live_at_destroy; /* allocations a context destroy freed */
static int si_trace;
static int si_reuse;

#define COUNT(n)                                                                                   \
    do {                                                                                           \
        atomic_fetch_add_explicit(&si_calls[SI_F_##n], 1, memory_order_relaxed);                   \
        if (si_trace)                                                                              \
            fprintf(stderr, "standin: %s\n", #n);                                                  \
    } while (0)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- configuration --------------------------------------------------- */

static int cfg_major = 9, cfg_minor = 0, cfg_ndev = 1, cfg_version = 13000;
static uint64_t cfg_mem = 80ull << 30;

static uint64_t parse_size(const char *s, uint64_t dflt)
{
    char *end;
    if (!s || !*s)
        return dflt;
    unsigned long long v = strtoull(s, &end, 10);
    switch (toupper((unsigned char)*end)) {
    case 'K':
        v <<= 10;
        break;
    case 'M':
        v <<= 20;
        break;
    case 'G':
        v <<= 30;
        break;
    case 'T':
        v <<= 40;
        break;
    default:
        break;
    }
    return v;
}

static void counts_write(void)
{
    const char *path = getenv("KCACHE_TEST_STANDIN_COUNTS");
    if (!path || !*path)
        return;
    size_t cap = 8192, len = 0;
    char *line = malloc(cap);
    if (!line)
        return;
    len += (size_t)snprintf(line + len, cap - len,
                            "standin pid=%d jit=%llu jit_ns=%llu live_at_destroy=%llu",
                            (int)getpid(), (unsigned long long)atomic_load(&si_jit),
                            (unsigned long long)atomic_load(&si_jit_ns),
                            (unsigned long long)atomic_load(&si_live_at_destroy));
    for (int i = 0; i < SI_F_COUNT && len < cap - 64; i++) {
        uint64_t c = atomic_load(&si_calls[i]);
        if (c)
            len += (size_t)snprintf(line + len, cap - len, " %s=%llu", si_fnames[i],
                                    (unsigned long long)c);
    }
    line[len++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w =
            write(fd, line, len); /* one write: lines of concurrent processes never interleave */
        (void)w;
        close(fd);
    }
    free(line);
}

__typeof__(si_jl_create) si_jl_create;
__typeof__(si_jl_destroy) si_jl_destroy;
__typeof__(si_jl_add_data) si_jl_add_data;
__typeof__(si_jl_complete) si_jl_complete;
__typeof__(si_jl_cubin_size) si_jl_cubin_size;
__typeof__(si_jl_cubin) si_jl_cubin;
__typeof__(si_jl_error_size) si_jl_error_size;
__typeof__(si_jl_error) si_jl_error;
__typeof__(si_jl_info_size) si_jl_info_size;
__typeof__(si_jl_info) si_jl_info;

static void *jl_sym(void *lib, const char *name)
{
    void *p = lib ? dlvsym(lib, name, "libnvJitLink.so.13") : NULL;
    if (!p) {
        fprintf(stderr, "standin: %s not found in libnvJitLink.so.13\n", name);
        abort();
    }
    return p;
}

static void jl_resolve(void)
{
    void *lib = dlopen("libnvJitLink.so.13", RTLD_NOW | RTLD_LOCAL);
    si_jl_create = jl_sym(lib, "__nvJitLinkCreate_13_0");
    si_jl_destroy = jl_sym(lib, "__nvJitLinkDestroy_13_0");
    si_jl_add_data = jl_sym(lib, "__nvJitLinkAddData_13_0");
    si_jl_complete = jl_sym(lib, "__nvJitLinkComplete_13_0");
    si_jl_cubin_size = jl_sym(lib, "__nvJitLinkGetLinkedCubinSize_13_0");
    si_jl_cubin = jl_sym(lib, "__nvJitLinkGetLinkedCubin_13_0");
    si_jl_error_size = jl_sym(lib, "__nvJitLinkGetErrorLogSize_13_0");
    si_jl_error = jl_sym(lib, "__nvJitLinkGetErrorLog_13_0");
    si_jl_info_size = jl_sym(lib, "__nvJitLinkGetInfoLogSize_13_0");
    si_jl_info = jl_sym(lib, "__nvJitLinkGetInfoLog_13_0");
}

__attribute__((constructor)) static void si_load(void)
{
    jl_resolve();
    const char *cc = getenv("KCACHE_TEST_STANDIN_CC");
    if (cc && *cc) {
        int a = 0, b = 0;
        if (sscanf(cc, "%d.%d", &a, &b) >= 1 && a > 0) {
            cfg_major = a;
            cfg_minor = b;
        }
    }
    const char *nd = getenv("KCACHE_TEST_STANDIN_DEVICES");
    if (nd && *nd)
        cfg_ndev = atoi(nd);
    if (cfg_ndev < 0 || cfg_ndev > 8)
        cfg_ndev = 1;
    cfg_mem = parse_size(getenv("KCACHE_TEST_STANDIN_MEM"), cfg_mem);
    const char *v = getenv("KCACHE_TEST_STANDIN_VERSION");
    if (v && *v)
        cfg_version = atoi(v);
    si_trace = getenv("KCACHE_TEST_STANDIN_TRACE") != NULL;
    const char *reuse = getenv("KCACHE_TEST_STANDIN_REUSE");
    si_reuse = reuse && *reuse == '1';
    atexit(counts_write);
}

/* ---- objects and handles --------------------------------------------- */

enum { T_CTX = 1, T_MOD, T_FUNC, T_LIB, T_KERN, T_LINK, T_NTYPES };

#define HANDLE_BASE 0x5d0000000000ull

struct image {            /* a loaded cubin */
    unsigned char *cubin; /* owned copy */
    size_t len;
    char **entries; /* kernel entry names */
    int n_entries;
};

struct ctx {
    bool alive;
    bool primary;
    int dev;
    int retain; /* primary only */
    unsigned flags;
    uint64_t id;
};

struct mod {
    bool alive;
    int ctx; /* slot */
    uint64_t ctx_id;
    struct image img;
    int lib; /* owning library slot, or 0 */
};

struct func {
    bool alive;
    int mod;  /* slot, or 0 */
    int kern; /* slot, or 0 */
    int ctx;
    uint64_t ctx_id;
    char *name;
};

struct lib {
    bool alive;
    struct image img;
};

struct kern {
    bool alive;
    int lib;
    char *name;
};

struct link {
    bool alive;
    nvJitLinkHandle h;
    unsigned n_opts;
    CUjit_option *opts;
    void **vals;
    int jits; /* PTX inputs added */
    char *info, *error;
    void *cubin;
    size_t cubin_len;
    uint64_t started;
};

struct table {
    void **v; /* index 0 unused: slot numbers start at 1 */
    int n, cap;
};

static pthread_mutex_t si_lock = PTHREAD_MUTEX_INITIALIZER;
static struct table si_tab[T_NTYPES];
static bool si_inited;
static uint64_t si_next_ctx_id = 1;

static void *handle_of(int type, int slot)
{
    return (void *)(uintptr_t)(HANDLE_BASE | ((uint64_t)type << 36) | ((uint64_t)slot << 4));
}

/* The slot a handle of `type` names, or 0 when it names none. */
static int slot_of(int type, const void *h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if ((v & ~((1ull << 40) - 1)) != HANDLE_BASE || ((v >> 36) & 0xf) != (uint64_t)type ||
        (v & 0xf))
        return 0;
    uint64_t slot = (v & ((1ull << 36) - 1)) >> 4;
    if (slot == 0 || slot >= (uint64_t)si_tab[type].n)
        return 0;
    return (int)slot;
}

static int tab_add(int type, void *obj)
{
    struct table *t = &si_tab[type];
    if (t->n == 0)
        t->n = 1;
    if (t->n >= t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        void **v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v)
            return 0;
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n] = obj;
    return t->n++;
}

#define OBJ(type, T, slot) ((struct T *)si_tab[type].v[slot])

/* With KCACHE_TEST_STANDIN_REUSE=1, module and library handles are reused
 * after unload (the first free slot), as the real driver reuses addresses.
 * The first field of every object is its `alive` flag. */
static int tab_add_reusing(int type, void *obj)
{
    if (si_reuse) {
        for (int s = 1; s < si_tab[type].n; s++) {
            if (!*(bool *)si_tab[type].v[s]) {
                free(si_tab[type].v[s]);
                si_tab[type].v[s] = obj;
                return s;
            }
        }
    }
    return tab_add(type, obj);
}

static struct ctx *ctx_get(CUcontext h, int *slot)
{
    int s = slot_of(T_CTX, h);
    if (!s || !OBJ(T_CTX, ctx, s)->alive)
        return NULL;
    if (slot)
        *slot = s;
    return OBJ(T_CTX, ctx, s);
}

/* Per-thread stack of current contexts (handles, checked on use). */
#define CTX_STACK_MAX 64
static __thread CUcontext tls_stack[CTX_STACK_MAX];
static __thread int tls_depth;

static CUcontext tls_top(void)
{
    return tls_depth ? tls_stack[tls_depth - 1] : NULL;
}

/* The current context, under si_lock. CUDA_ERROR_INVALID_CONTEXT if none. */
static CUresult cur_ctx(int *slot, struct ctx **out)
{
    struct ctx *c = ctx_get(tls_top(), slot);
    if (out)
        *out = NULL; /* callers read it even on failure */
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (out)
        *out = c;
    return CUDA_SUCCESS;
}

/* ---- device memory ----------------------------------------------------- */

struct alloc {
    uint64_t ptr;
    size_t size;
    int ctx;
    uint64_t ctx_id;
    bool alive;
    bool managed;
    bool sync_memops;       /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, off when allocated */
    uint64_t buffer_id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused in the process */
    unsigned char *backing; /* calloc'd on first copy */
};

static struct alloc **si_allocs; /* open addressing by ptr */
static size_t si_alloc_cap, si_alloc_n;
static uint64_t si_next_addr = 0x7f2000000000ull, si_next_addr32 = 0x10000000ull;
static uint64_t si_used[8];
static uint64_t si_next_buffer_id = 1;

static size_t hash_ptr(uint64_t p, size_t cap)
{
    return (size_t)((p * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
}

static struct alloc *alloc_find(uint64_t ptr)
{
    if (!si_alloc_cap)
        return NULL;
    for (size_t i = hash_ptr(ptr, si_alloc_cap);; i = (i + 1) & (si_alloc_cap - 1)) {
        if (!si_allocs[i])
            return NULL;
        if (si_allocs[i]->ptr == ptr)
            return si_allocs[i];
    }
}

/* The allocation containing [ptr, ptr+len), alive, or NULL. Linear, for the
 * rare copy and attribute calls. */
static struct alloc *alloc_containing(uint64_t ptr, size_t len)
{
    for (size_t i = 0; i < si_alloc_cap; i++) {
        struct alloc *a = si_allocs[i];
        if (a && a->alive && ptr >= a->ptr && ptr - a->ptr <= a->size &&
            len <= a->size - (ptr - a->ptr))
            return a;
    }
    return NULL;
}

static int alloc_insert(struct alloc *a)
{
    if ((si_alloc_n + 1) * 2 > si_alloc_cap) {
        size_t cap = si_alloc_cap ? si_alloc_cap * 2 : 1024;
        struct alloc **n = calloc(cap, sizeof *n);
        if (!n)
            return -1;
        for (size_t i = 0; i < si_alloc_cap; i++) {
            if (!si_allocs[i])
                continue;
            size_t j = hash_ptr(si_allocs[i]->ptr, cap);
            while (n[j])
                j = (j + 1) & (cap - 1);
            n[j] = si_allocs[i];
        }
        free(si_allocs);
        si_allocs = n;
        si_alloc_cap = cap;
    }
    size_t j = hash_ptr(a->ptr, si_alloc_cap);
    while (si_allocs[j])
        j = (j + 1) & (si_alloc_cap - 1);
    si_allocs[j] = a;
    si_alloc_n++;
    return 0;
}

static void alloc_release(struct alloc *a)
{
    a->alive = false;
    if (!a->managed)
        si_used[OBJ(T_CTX, ctx, a->ctx)->dev] -= a->size;
    free(a->backing);
    a->backing = NULL;
}

/* ---- images: cubin, fatbinary, PTX -------------------------------------- */

static void image_free(struct image *im)
{
    for (int i = 0; i < im->n_entries; i++)
        free(im->entries[i]);
    free(im->entries);
    free(im->cubin);
    memset(im, 0, sizeof *im);
}

#define MAX_IMAGE (1ull << 30)

/* The size of the ELF image at p (from its section table), 0 if malformed. */
static size_t elf_size(const unsigned char *p)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64)
        return 0;
    if (eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shnum == 0 || eh->e_shoff > MAX_IMAGE)
        return 0;
    size_t end = eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type == SHT_NOBITS)
            continue;
        if (sh[i].sh_offset > MAX_IMAGE || sh[i].sh_size > MAX_IMAGE)
            return 0;
        if (sh[i].sh_offset + sh[i].sh_size > end)
            end = sh[i].sh_offset + sh[i].sh_size;
    }
    if (eh->e_phoff && eh->e_phnum) {
        if (eh->e_phoff > MAX_IMAGE)
            return 0;
        size_t pend = eh->e_phoff + (size_t)eh->e_phnum * eh->e_phentsize;
        if (pend > end)
            end = pend;
    }
    return end;
}

/* The SM a cubin was built for (90 for sm_90), from e_flags. */
static int elf_arch(const unsigned char *p)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
    if (eh->e_ident[EI_ABIVERSION] >= 8)
        return (int)((eh->e_flags >> 8) & 0xff);
    return (int)(eh->e_flags & 0xff);
}

/* Copies a cubin and reads its kernel entries. */
static CUresult image_from_cubin(const void *p, size_t len, struct image *out)
{
    const unsigned char *b = p;
    const Elf64_Ehdr *eh = p;
    if (len < sizeof *eh || elf_size(b) == 0 || elf_size(b) > len || eh->e_machine != EM_CUDA)
        return CUDA_ERROR_INVALID_IMAGE;
    memset(out, 0, sizeof *out);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(b + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB)
            continue;
        if (sh[i].sh_link >= eh->e_shnum || sh[i].sh_entsize != sizeof(Elf64_Sym))
            return CUDA_ERROR_INVALID_IMAGE;
        const Elf64_Shdr *str = &sh[sh[i].sh_link];
        const Elf64_Sym *sym = (const Elf64_Sym *)(b + sh[i].sh_offset);
        size_t n = sh[i].sh_size / sizeof *sym;
        for (size_t k = 0; k < n; k++) {
            /* Kernel entries: global functions flagged STO_CUDA_ENTRY (0x10). */
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || !(sym[k].st_other & 0x10))
                continue;
            if (sym[k].st_name >= str->sh_size)
                return CUDA_ERROR_INVALID_IMAGE;
            const char *nm = (const char *)b + str->sh_offset + sym[k].st_name;
            size_t maxn = str->sh_size - sym[k].st_name;
            char **e = realloc(out->entries, (size_t)(out->n_entries + 1) * sizeof *e);
            if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
            out->entries = e;
            out->entries[out->n_entries++] = strndup(nm, maxn);
        }
    }
    size_t sz = elf_size(b);
    out->cubin = malloc(sz);
    if (!out->cubin) {
        image_free(out);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(out->cubin, b, sz);
    out->len = sz;
    return CUDA_SUCCESS;
}

/* A cubin for `sm` runs on a device of the same major and an equal or
 * higher minor. */
static bool sass_runs_on(int sm, int major, int minor)
{
    return sm / 10 == major && sm % 10 <= minor;
}

/* Fatbinary layout (as nvcc and fatbinary write it). */
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243b1u
struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t fat_size;
};
struct fatbin_entry {
    uint16_t kind; /* 1 PTX, 2 ELF */
    uint16_t version;
    uint32_t header_size;
    uint64_t padded_size;
    uint32_t compressed_size;
    uint32_t unknown0;
    uint16_t minor, major;
    uint32_t arch;
    uint32_t name_offset, name_len;
    uint64_t flags;
    uint64_t zero;
    uint64_t uncompressed_size;
};
#define FATBIN_FLAG_COMPRESSED_LZ4 0x2000ull
#define FATBIN_FLAG_COMPRESSED_ZSTD 0x8000ull

/* Unwraps a __fatBinC_Wrapper_t. */
static const void *fatbin_unwrap(const void *p)
{
    const uint32_t *w = p;
    if (w[0] == FATBIN_WRAPPER_MAGIC)
        return *(const void *const *)((const char *)p + 8);
    return p;
}

/* Walks a fatbinary: *sass is the entry with SASS for the device (NULL if
 * none, or compressed), *has_sass tells whether any SASS entry fits, *has_ptx
 * whether a PTX entry no newer than the device exists. */
static CUresult fatbin_scan(const void *p, size_t *total, int major, int minor,
                            const struct fatbin_entry **sass, bool *has_sass, bool *has_ptx)
{
    const struct fatbin_header *fh = p;
    if (!fh || fh->magic != FATBIN_MAGIC || fh->header_size < sizeof *fh ||
        fh->fat_size > MAX_IMAGE)
        return CUDA_ERROR_INVALID_IMAGE;
    *total = fh->header_size + fh->fat_size;
    *sass = NULL;
    *has_sass = *has_ptx = false;
    const unsigned char *b = (const unsigned char *)p + fh->header_size;
    const unsigned char *end = b + fh->fat_size;
    int best = -1;
    while (b + sizeof(struct fatbin_entry) <= end) {
        const struct fatbin_entry *e = (const void *)b;
        if (e->header_size < sizeof *e || e->padded_size > fh->fat_size ||
            e->header_size + e->padded_size > (size_t)(end - b))
            return CUDA_ERROR_INVALID_IMAGE;
        int arch = (int)e->arch;
        if (e->kind == 2 && sass_runs_on(arch, major, minor)) {
            *has_sass = true;
            bool compressed = e->flags & (FATBIN_FLAG_COMPRESSED_LZ4 | FATBIN_FLAG_COMPRESSED_ZSTD);
            if (!compressed && arch > best) {
                best = arch;
                *sass = e;
            }
        } else if (e->kind == 1 && arch <= major * 10 + minor) {
            *has_ptx = true;
        } else if (e->kind != 1 && e->kind != 2) {
            return CUDA_ERROR_INVALID_IMAGE;
        }
        b += e->header_size + e->padded_size;
    }
    return CUDA_SUCCESS;
}

/* JIT options as the stand-in understands them. */
struct jit_opts {
    char *info_buf, *error_buf;
    size_t info_size, error_size;
    int info_idx, error_idx, wall_idx; /* indices of the size/wall options, -1 */
    const char *argv[16];
    char argbuf[8][48];
    int argc, nbuf;
    int target; /* sm, 0: the device's */
    bool verbose;
};

static CUresult jit_opts_parse(unsigned n, const CUjit_option *opt, void **val, struct jit_opts *o)
{
    memset(o, 0, sizeof *o);
    o->info_idx = o->error_idx = o->wall_idx = -1;
    if (n && (!opt || !val))
        return CUDA_ERROR_INVALID_VALUE;
    if (n > 64)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        uintptr_t v = (uintptr_t)val[i];
        switch (opt[i]) {
        case CU_JIT_INFO_LOG_BUFFER:
            o->info_buf = val[i];
            break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
            o->info_size = (unsigned)v;
            o->info_idx = (int)i;
            break;
        case CU_JIT_ERROR_LOG_BUFFER:
            o->error_buf = val[i];
            break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
            o->error_size = (unsigned)v;
            o->error_idx = (int)i;
            break;
        case CU_JIT_WALL_TIME:
            o->wall_idx = (int)i;
            break;
        case CU_JIT_LOG_VERBOSE:
            o->verbose = v != 0;
            break;
        case CU_JIT_TARGET:
            if (v < 30 || v > 130)
                return CUDA_ERROR_INVALID_VALUE;
            o->target = (int)v;
            break;
        case CU_JIT_OPTIMIZATION_LEVEL:
            if (v > 4)
                return CUDA_ERROR_INVALID_VALUE;
            if (o->nbuf < 8) {
                snprintf(o->argbuf[o->nbuf], 48, "-Xptxas=-O%u", (unsigned)v);
                o->argv[o->argc++] = o->argbuf[o->nbuf++];
            }
            break;
        case CU_JIT_MAX_REGISTERS:
            if (o->nbuf < 8) {
                snprintf(o->argbuf[o->nbuf], 48, "-maxrregcount=%u", (unsigned)v);
                o->argv[o->argc++] = o->argbuf[o->nbuf++];
            }
            break;
        case CU_JIT_GENERATE_DEBUG_INFO:
            if (v && o->argc < 14)
                o->argv[o->argc++] = "-g";
            break;
        case CU_JIT_GENERATE_LINE_INFO:
            if (v && o->argc < 14)
                o->argv[o->argc++] = "-lineinfo";
            break;
        case CU_JIT_THREADS_PER_BLOCK:
        case CU_JIT_TARGET_FROM_CUCONTEXT:
        case CU_JIT_FALLBACK_STRATEGY:
        case CU_JIT_CACHE_MODE:
        case CU_JIT_FAST_COMPILE:
        case CU_JIT_POSITION_INDEPENDENT_CODE:
        case CU_JIT_MIN_CTA_PER_SM:
        case CU_JIT_MAX_THREADS_PER_BLOCK:
        case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
        case CU_JIT_SPLIT_COMPILE:
        case CU_JIT_FTZ:
        case CU_JIT_PREC_DIV:
        case CU_JIT_PREC_SQRT:
        case CU_JIT_FMA:
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    if (o->verbose)
        o->argv[o->argc++] = "-verbose";
    return CUDA_SUCCESS;
}

/* Fills a log buffer the way the stand-in documents: at most size-1
 * characters and a NUL; the size option is overwritten with the number of
 * characters written (without the NUL). */
static void log_fill(char *buf, size_t size, int idx, void **vals, const char *log)
{
    if (!buf || size == 0)
        return;
    size_t n = log ? strlen(log) : 0;
    if (n > size - 1)
        n = size - 1;
    if (n)
        memcpy(buf, log, n);
    buf[n] = 0;
    if (idx >= 0)
        vals[idx] = (void *)(uintptr_t)n;
}

static void jit_opts_finish(struct jit_opts *o, void **vals, const char *info, const char *error,
                            uint64_t started)
{
    log_fill(o->info_buf, o->info_size, o->info_idx, vals, info);
    log_fill(o->error_buf, o->error_size, o->error_idx, vals, error);
    if (o->wall_idx >= 0) {
        float ms = (float)(now_ns() - started) / 1e6f;
        memcpy(&vals[o->wall_idx], &ms, sizeof ms); /* the driver stores a float in the slot */
    }
}

static char *jitlink_log(nvJitLinkHandle h, bool info)
{
    size_t n = 0;
    if ((info ? nvJitLinkGetInfoLogSize(h, &n) : nvJitLinkGetErrorLogSize(h, &n)) !=
        NVJITLINK_SUCCESS)
        return strdup("");
    char *s = calloc(1, n + 1);
    if (s && n)
        (void)(info ? nvJitLinkGetInfoLog(h, s) : nvJitLinkGetErrorLog(h, s));
    return s;
}

static nvJitLinkResult jitlink_create(nvJitLinkHandle *h, const struct jit_opts *o, int sm)
{
    const char *argv[20];
    char arch[32];
    snprintf(arch, sizeof arch, "-arch=sm_%d", sm);
    int argc = 0;
    argv[argc++] = arch;
    for (int i = 0; i < o->argc; i++)
        argv[argc++] = o->argv[i];
    return nvJitLinkCreate(h, (uint32_t)argc, argv);
}

/* Compiles `data` (PTX, or a fatbinary whose PTX is needed) for `sm` with
 * nvJitLink. Fills logs; the cubin is malloc'd. */
static CUresult jit_compile(const void *data, size_t len, nvJitLinkInputType type, int sm,
                            const struct jit_opts *o, void **cubin, size_t *cubin_len, char **info,
                            char **error)
{
    nvJitLinkHandle h = NULL;
    CUresult rc = CUDA_SUCCESS;
    uint64_t t0 = now_ns();
    *info = *error = NULL;
    if (jitlink_create(&h, o, sm) != NVJITLINK_SUCCESS) {
        *error = strdup("stand-in: nvJitLinkCreate failed");
        return CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
    }
    if (nvJitLinkAddData(h, type, data, len, "image") != NVJITLINK_SUCCESS ||
        nvJitLinkComplete(h) != NVJITLINK_SUCCESS) {
        rc = type == NVJITLINK_INPUT_PTX ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_NO_BINARY_FOR_GPU;
    } else {
        size_t n = 0;
        nvJitLinkGetLinkedCubinSize(h, &n);
        *cubin = malloc(n ? n : 1);
        if (!*cubin || nvJitLinkGetLinkedCubin(h, *cubin) != NVJITLINK_SUCCESS)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        *cubin_len = n;
    }
    *info = jitlink_log(h, true);
    *error = jitlink_log(h, false);
    nvJitLinkDestroy(&h);
    atomic_fetch_add(&si_jit, 1);
    atomic_fetch_add(&si_jit_ns, now_ns() - t0);
    return rc;
}

static bool looks_like_ptx(const char *s)
{
    /* NUL-terminated text with a .version directive near the top. */
    for (size_t i = 0; i < 4096 && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 9 || (c > 13 && c < 32 && c != 27) || c == 127)
            return false;
        if (c == '.' && !strncmp(s + i, ".version", 8))
            return true;
    }
    return false;
}

/* Loads any image (cubin, fatbinary or PTX) for device `dev` into *im,
 * JIT-compiling PTX. Option logs are filled. */
static CUresult image_load(const void *image, int dev_major, int dev_minor, unsigned n,
                           CUjit_option *opt, void **val, struct image *im)
{
    struct jit_opts o;
    uint64_t t0 = now_ns();
    CUresult rc = jit_opts_parse(n, opt, val, &o);
    if (rc)
        return rc;
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    int sm = o.target ? o.target : dev_major * 10 + dev_minor;
    const unsigned char *b = image;
    char *info = NULL, *error = NULL;
    if (!memcmp(b, ELFMAG, SELFMAG)) {
        size_t len = elf_size(b);
        if (!len || ((const Elf64_Ehdr *)b)->e_machine != EM_CUDA)
            rc = CUDA_ERROR_INVALID_IMAGE;
        else if (!sass_runs_on(elf_arch(b), dev_major, dev_minor))
            rc = CUDA_ERROR_NO_BINARY_FOR_GPU;
        else
            rc = image_from_cubin(b, len, im);
    } else if (((const uint32_t *)fatbin_unwrap(b))[0] == FATBIN_MAGIC) {
        const void *fb = fatbin_unwrap(b);
        const struct fatbin_entry *sass;
        bool has_sass, has_ptx;
        size_t total;
        rc = fatbin_scan(fb, &total, dev_major, dev_minor, &sass, &has_sass, &has_ptx);
        if (rc == CUDA_SUCCESS) {
            if (sass) {
                const unsigned char *payload = (const unsigned char *)sass + sass->header_size;
                rc = image_from_cubin(payload, sass->padded_size, im);
            } else if (has_sass || has_ptx) {
                /* Compressed SASS, or PTX to JIT: nvJitLink reads fatbinaries. */
                void *cubin = NULL;
                size_t clen = 0;
                nvJitLinkInputType t = NVJITLINK_INPUT_FATBIN;
                if (has_sass) { /* not a JIT: undo the count jit_compile adds */
                    rc = jit_compile(fb, total, t, sm, &o, &cubin, &clen, &info, &error);
                    atomic_fetch_sub(&si_jit, 1);
                } else {
                    rc = jit_compile(fb, total, t, sm, &o, &cubin, &clen, &info, &error);
                }
                if (rc == CUDA_SUCCESS)
                    rc = image_from_cubin(cubin, clen, im);
                free(cubin);
            } else {
                rc = CUDA_ERROR_NO_BINARY_FOR_GPU;
            }
        }
    } else if (looks_like_ptx(image)) {
        void *cubin = NULL;
        size_t clen = 0;
        rc = jit_compile(image, strlen(image) + 1, NVJITLINK_INPUT_PTX, sm, &o, &cubin, &clen,
                         &info, &error);
        if (rc == CUDA_SUCCESS)
            rc = image_from_cubin(cubin, clen, im);
        free(cubin);
    } else {
        rc = CUDA_ERROR_INVALID_IMAGE;
    }
    jit_opts_finish(&o, val, info, error, t0);
    free(info);
    free(error);
    return rc;
}

/* ---- entry points ---------------------------------------------------- */

#define LOCK() pthread_mutex_lock(&si_lock)
#define UNLOCK() pthread_mutex_unlock(&si_lock)
#define INIT_CHECK()                                                                               \
    do {                                                                                           \
        if (!si_inited)                                                                            \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

static struct ctx *primary_of(int dev)
{
    return OBJ(T_CTX, ctx, dev + 1); /* primary contexts take slots 1..ndev */
}

SI_EXPORT CUresult cuInit(unsigned int flags)
{
    COUNT(cuInit);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    if (!si_inited) {
        for (int d = 0; d < cfg_ndev; d++) {
            struct ctx *c = calloc(1, sizeof *c);
            c->primary = true;
            c->dev = d;
            tab_add(T_CTX, c);
        }
        si_inited = true;
    }
    UNLOCK();
    return cfg_ndev ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

SI_EXPORT CUresult cuDriverGetVersion(int *v)
{
    COUNT(cuDriverGetVersion);
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = cfg_version;
    return CUDA_SUCCESS;
}

/* NVRTC 13 dlopen()s libcuda during a compile, calls cuInit and then looks
 * up cuGetExportTable; without the symbol it crashes. The stand-in has no
 * export tables: it answers as a driver without the requested table does. */
SI_EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    (void)id;
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

SI_EXPORT CUresult cuDeviceGetCount(int *n)
{
    COUNT(cuDeviceGetCount);
    INIT_CHECK();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = cfg_ndev;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    COUNT(cuDeviceGet);
    INIT_CHECK();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= cfg_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

#define DEV_CHECK(dev)                                                                             \
    do {                                                                                           \
        if ((dev) < 0 || (dev) >= cfg_ndev)                                                        \
            return CUDA_ERROR_INVALID_DEVICE;                                                      \
    } while (0)

SI_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    COUNT(cuDeviceGetName);
    INIT_CHECK();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    snprintf(name, (size_t)len, "kcache stand-in device %d (sm_%d%d)", dev, cfg_major, cfg_minor);
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    COUNT(cuDeviceGetAttribute);
    INIT_CHECK();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *pi = cfg_major;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *pi = cfg_minor;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *pi = 132;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *pi = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *pi = 32;
        break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        *pi = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
        *pi = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *pi = dev + 1;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        *pi = 49152;
        break;
    default:
        if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
            return CUDA_ERROR_INVALID_VALUE;
        *pi = 0;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    COUNT(cuDeviceComputeCapability);
    INIT_CHECK();
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    *major = cfg_major;
    *minor = cfg_minor;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    COUNT(cuDeviceTotalMem_v2);
    INIT_CHECK();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    *bytes = cfg_mem;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    COUNT(cuDeviceTotalMem);
    INIT_CHECK();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    *bytes = cfg_mem > UINT32_MAX ? UINT32_MAX : (unsigned)cfg_mem;
    return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------- */

static CUresult ctx_push(CUcontext h)
{
    if (tls_depth == CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = h;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    INIT_CHECK();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    if (flags & ~0x1fu)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    /* Reuse a dead slot, as the real driver reuses addresses. */
    int slot = 0;
    for (int s = cfg_ndev + 1; s < si_tab[T_CTX].n; s++) {
        if (!OBJ(T_CTX, ctx, s)->alive) {
            slot = s;
            break;
        }
    }
    if (!slot) {
        struct ctx *c = calloc(1, sizeof *c);
        slot = c ? tab_add(T_CTX, c) : 0;
        if (!slot) {
            free(c);
            UNLOCK();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct ctx *c = OBJ(T_CTX, ctx, slot);
    memset(c, 0, sizeof *c);
    c->alive = true;
    c->dev = dev;
    c->flags = flags;
    c->id = si_next_ctx_id++;
    *pctx = handle_of(T_CTX, slot);
    UNLOCK();
    return ctx_push(*pctx);
}

SI_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT(cuCtxCreate);
    return ctx_create(pctx, flags, dev);
}

SI_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v2);
    return ctx_create(pctx, flags, dev);
}

SI_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                                  unsigned int flags, CUdevice dev)
{
    COUNT(cuCtxCreate_v3);
    if (n < 0 || (n > 0 && !params))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

SI_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    COUNT(cuCtxCreate_v4);
    if (params && (params->numExecAffinityParams < 0 ||
                   (params->numExecAffinityParams > 0 && !params->execAffinityParams)))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

/* Releases everything a context owns: modules, functions, memory. Under
 * si_lock. */
static void ctx_teardown(int slot)
{
    struct ctx *c = OBJ(T_CTX, ctx, slot);
    for (int s = 1; s < si_tab[T_MOD].n; s++) {
        struct mod *m = OBJ(T_MOD, mod, s);
        if (m->alive && m->ctx == slot && m->ctx_id == c->id) {
            m->alive = false;
            image_free(&m->img);
        }
    }
    for (int s = 1; s < si_tab[T_FUNC].n; s++) {
        struct func *f = OBJ(T_FUNC, func, s);
        if (f->alive && f->ctx == slot && f->ctx_id == c->id)
            f->alive = false;
    }
    for (size_t i = 0; i < si_alloc_cap; i++) {
        struct alloc *a = si_allocs[i];
        if (a && a->alive && a->ctx == slot && a->ctx_id == c->id) {
            alloc_release(a);
            atomic_fetch_add(&si_live_at_destroy, 1);
        }
    }
}

/* Drops `h` from this thread's stack wherever it is. */
static void tls_forget(CUcontext h)
{
    int j = 0;
    for (int i = 0; i < tls_depth; i++)
        if (tls_stack[i] != h)
            tls_stack[j++] = tls_stack[i];
    tls_depth = j;
}

static CUresult ctx_destroy(CUcontext h)
{
    INIT_CHECK();
    LOCK();
    int slot;
    struct ctx *c = ctx_get(h, &slot);
    if (!c || c->primary) {
        UNLOCK();
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    ctx_teardown(slot);
    c->alive = false;
    UNLOCK();
    tls_forget(h);
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    COUNT(cuCtxDestroy);
    return ctx_destroy(ctx);
}

SI_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    COUNT(cuCtxDestroy_v2);
    return ctx_destroy(ctx);
}

SI_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    COUNT(cuCtxGetCurrent);
    INIT_CHECK();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = tls_top();
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    COUNT(cuCtxSetCurrent);
    INIT_CHECK();
    if (ctx) {
        LOCK();
        struct ctx *c = ctx_get(ctx, NULL);
        UNLOCK();
        if (!c)
            return CUDA_ERROR_INVALID_CONTEXT;
        if (tls_depth)
            tls_stack[tls_depth - 1] = ctx;
        else
            return ctx_push(ctx);
    } else if (tls_depth) {
        tls_depth--;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    COUNT(cuCtxGetId);
    INIT_CHECK();
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct ctx *c = ctx_get(ctx ? ctx : tls_top(), NULL);
    if (c)
        *id = c->id;
    UNLOCK();
    return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

SI_EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
    COUNT(cuCtxGetDevice);
    INIT_CHECK();
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct ctx *c;
    CUresult rc = cur_ctx(NULL, &c);
    if (!rc)
        *dev = c->dev;
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuCtxSynchronize(void)
{
    COUNT(cuCtxSynchronize);
    INIT_CHECK();
    LOCK();
    CUresult rc = cur_ctx(NULL, NULL);
    UNLOCK();
    return rc;
}

static CUresult ctx_push_checked(CUcontext ctx)
{
    INIT_CHECK();
    LOCK();
    struct ctx *c = ctx_get(ctx, NULL);
    UNLOCK();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_push(ctx);
}

static CUresult ctx_pop(CUcontext *pctx)
{
    INIT_CHECK();
    if (!tls_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext h = tls_stack[--tls_depth];
    if (pctx)
        *pctx = h;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    COUNT(cuCtxPushCurrent);
    return ctx_push_checked(ctx);
}

SI_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    COUNT(cuCtxPushCurrent_v2);
    return ctx_push_checked(ctx);
}

SI_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    COUNT(cuCtxPopCurrent);
    return ctx_pop(pctx);
}

SI_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    COUNT(cuCtxPopCurrent_v2);
    return ctx_pop(pctx);
}

SI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRetain);
    INIT_CHECK();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    LOCK();
    struct ctx *c = primary_of(dev);
    if (!c->alive) {
        c->alive = true;
        c->id = si_next_ctx_id++; /* every activation is a new context */
    }
    c->retain++;
    *pctx = handle_of(T_CTX, dev + 1);
    UNLOCK();
    return CUDA_SUCCESS;
}

static void primary_deactivate(int dev)
{
    struct ctx *c = primary_of(dev);
    if (c->alive)
        ctx_teardown(dev + 1);
    c->alive = false;
    c->retain = 0;
}

static CUresult primary_release(CUdevice dev)
{
    INIT_CHECK();
    DEV_CHECK(dev);
    LOCK();
    struct ctx *c = primary_of(dev);
    if (c->retain <= 0) {
        UNLOCK();
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (--c->retain == 0)
        primary_deactivate(dev);
    UNLOCK();
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease);
    return primary_release(dev);
}

SI_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxRelease_v2);
    return primary_release(dev);
}

static CUresult primary_reset(CUdevice dev)
{
    INIT_CHECK();
    DEV_CHECK(dev);
    LOCK();
    primary_deactivate(dev);
    UNLOCK();
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxReset);
    return primary_reset(dev);
}

SI_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    COUNT(cuDevicePrimaryCtxReset_v2);
    return primary_reset(dev);
}

SI_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    COUNT(cuDevicePrimaryCtxGetState);
    INIT_CHECK();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    LOCK();
    *flags = primary_of(dev)->flags;
    *active = primary_of(dev)->alive;
    UNLOCK();
    return CUDA_SUCCESS;
}

/* ---- modules ------------------------------------------------------------- */

static CUresult module_load(CUmodule *out, const void *image, unsigned n, CUjit_option *opt,
                            void **val)
{
    INIT_CHECK();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    int cslot;
    struct ctx *c;
    LOCK();
    CUresult rc = cur_ctx(&cslot, &c);
    uint64_t cid = c ? c->id : 0;
    UNLOCK();
    if (rc)
        return rc;
    struct image im = {0};
    rc = image_load(image, cfg_major, cfg_minor, n, opt, val, &im);
    if (rc)
        return rc;
    struct mod *m = calloc(1, sizeof *m);
    LOCK();
    int slot = m ? tab_add_reusing(T_MOD, m) : 0;
    if (slot) {
        m->alive = true;
        m->ctx = cslot;
        m->ctx_id = cid;
        m->img = im;
        *out = handle_of(T_MOD, slot);
    }
    UNLOCK();
    if (!slot) {
        free(m);
        image_free(&im);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    COUNT(cuModuleLoadData);
    return module_load(module, image, 0, NULL, NULL);
}

SI_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                      CUjit_option *options, void **values)
{
    COUNT(cuModuleLoadDataEx);
    return module_load(module, image, n, options, values);
}

SI_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    COUNT(cuModuleLoadFatBinary);
    if (fatCubin && ((const uint32_t *)fatbin_unwrap(fatCubin))[0] != FATBIN_MAGIC &&
        memcmp(fatCubin, ELFMAG, SELFMAG) && !looks_like_ptx(fatCubin))
        return CUDA_ERROR_INVALID_IMAGE;
    return module_load(module, fatCubin, 0, NULL, NULL);
}

static struct mod *mod_get(CUmodule h, int *slot)
{
    int s = slot_of(T_MOD, h);
    if (!s || !OBJ(T_MOD, mod, s)->alive || OBJ(T_MOD, mod, s)->lib)
        return NULL;
    if (slot)
        *slot = s;
    return OBJ(T_MOD, mod, s);
}

SI_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    COUNT(cuModuleUnload);
    INIT_CHECK();
    LOCK();
    int slot;
    struct mod *m = mod_get(hmod, &slot);
    if (m) {
        m->alive = false;
        image_free(&m->img);
        for (int s = 1; s < si_tab[T_FUNC].n; s++)
            if (OBJ(T_FUNC, func, s)->mod == slot)
                OBJ(T_FUNC, func, s)->alive = false;
    }
    UNLOCK();
    return m ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static bool image_has(const struct image *im, const char *name)
{
    for (int i = 0; i < im->n_entries; i++)
        if (!strcmp(im->entries[i], name))
            return true;
    return false;
}

SI_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    COUNT(cuModuleGetFunction);
    INIT_CHECK();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult rc = cur_ctx(NULL, NULL);
    int mslot = 0;
    struct mod *m = rc ? NULL : mod_get(hmod, &mslot);
    if (!rc && !m)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (!rc && !image_has(&m->img, name))
        rc = CUDA_ERROR_NOT_FOUND;
    if (!rc) {
        /* One function object per (module, name), as the driver. */
        int fs = 0;
        for (int s = 1; s < si_tab[T_FUNC].n && !fs; s++) {
            struct func *f = OBJ(T_FUNC, func, s);
            if (f->alive && f->mod == mslot && !strcmp(f->name, name))
                fs = s;
        }
        if (!fs) {
            struct func *f = calloc(1, sizeof *f);
            fs = f ? tab_add(T_FUNC, f) : 0;
            if (fs) {
                f->alive = true;
                f->mod = mslot;
                f->ctx = m->ctx;
                f->ctx_id = m->ctx_id;
                f->name = strdup(name);
            } else {
                free(f);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (fs)
            *hfunc = handle_of(T_FUNC, fs);
    }
    UNLOCK();
    return rc;
}

static struct func *func_get(CUfunction h)
{
    int s = slot_of(T_FUNC, h);
    if (!s || !OBJ(T_FUNC, func, s)->alive)
        return NULL;
    return OBJ(T_FUNC, func, s);
}

SI_EXPORT CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    COUNT(cuFuncGetName);
    INIT_CHECK();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct func *f = func_get(hfunc);
    if (f)
        *name = f->name;
    UNLOCK();
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SI_EXPORT CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    COUNT(cuFuncGetModule);
    INIT_CHECK();
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct func *f = func_get(hfunc);
    if (f)
        *hmod = f->mod ? handle_of(T_MOD, f->mod) : NULL;
    UNLOCK();
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz)
{
    INIT_CHECK();
    LOCK();
    struct ctx *c;
    int cslot;
    CUresult rc = cur_ctx(&cslot, &c);
    struct func *fn = rc ? NULL : func_get(f);
    if (!rc && !fn)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (!rc && (fn->ctx != cslot || fn->ctx_id != c->id))
        rc = CUDA_ERROR_INVALID_HANDLE; /* a function of another context */
    if (!rc && (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024))
        rc = CUDA_ERROR_INVALID_VALUE;
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shmem, CUstream s, void **params, void **extra)
{
    COUNT(cuLaunchKernel);
    return launch(f, gx, gy, gz, bx, by, bz);
}

SI_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                       unsigned int gz, unsigned int bx, unsigned int by,
                                       unsigned int bz, unsigned int shmem, CUstream s,
                                       void **params, void **extra)
{
    COUNT(cuLaunchKernel_ptsz);
    return launch(f, gx, gy, gz, bx, by, bz);
}

/* ---- libraries ------------------------------------------------------------ */

SI_EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                     void **jitOptionsValues, unsigned int numJitOptions,
                                     CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                     unsigned int numLibraryOptions)
{
    COUNT(cuLibraryLoadData);
    INIT_CHECK();
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions && (!libraryOptions || !libraryOptionValues))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numLibraryOptions; i++)
        if (libraryOptions[i] >= CU_LIBRARY_NUM_OPTIONS)
            return CUDA_ERROR_INVALID_VALUE;
    struct image im = {0};
    CUresult rc =
        image_load(code, cfg_major, cfg_minor, numJitOptions, jitOptions, jitOptionsValues, &im);
    if (rc)
        return rc;
    struct lib *l = calloc(1, sizeof *l);
    LOCK();
    int slot = l ? tab_add_reusing(T_LIB, l) : 0;
    if (slot) {
        l->alive = true;
        l->img = im;
        *library = handle_of(T_LIB, slot);
    }
    UNLOCK();
    if (!slot) {
        free(l);
        image_free(&im);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static struct lib *lib_get(CUlibrary h, int *slot)
{
    int s = slot_of(T_LIB, h);
    if (!s || !OBJ(T_LIB, lib, s)->alive)
        return NULL;
    if (slot)
        *slot = s;
    return OBJ(T_LIB, lib, s);
}

static struct kern *kern_get(CUkernel h, int *slot)
{
    int s = slot_of(T_KERN, h);
    if (!s || !OBJ(T_KERN, kern, s)->alive)
        return NULL;
    if (slot)
        *slot = s;
    return OBJ(T_KERN, kern, s);
}

SI_EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    COUNT(cuLibraryUnload);
    INIT_CHECK();
    LOCK();
    int slot;
    struct lib *l = lib_get(library, &slot);
    if (l) {
        l->alive = false;
        image_free(&l->img);
        for (int s = 1; s < si_tab[T_KERN].n; s++) {
            struct kern *k = OBJ(T_KERN, kern, s);
            if (k->lib != slot)
                continue;
            k->alive = false;
            for (int t = 1; t < si_tab[T_FUNC].n; t++)
                if (OBJ(T_FUNC, func, t)->kern == s)
                    OBJ(T_FUNC, func, t)->alive = false;
        }
    }
    UNLOCK();
    return l ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SI_EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    COUNT(cuLibraryGetKernel);
    INIT_CHECK();
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    int lslot;
    struct lib *l = lib_get(library, &lslot);
    CUresult rc = l ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (!rc && !image_has(&l->img, name))
        rc = CUDA_ERROR_NOT_FOUND;
    if (!rc) {
        int ks = 0;
        for (int s = 1; s < si_tab[T_KERN].n && !ks; s++) {
            struct kern *k = OBJ(T_KERN, kern, s);
            if (k->alive && k->lib == lslot && !strcmp(k->name, name))
                ks = s;
        }
        if (!ks) {
            struct kern *k = calloc(1, sizeof *k);
            ks = k ? tab_add(T_KERN, k) : 0;
            if (ks) {
                k->alive = true;
                k->lib = lslot;
                k->name = strdup(name);
            } else {
                free(k);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (ks)
            *pKernel = handle_of(T_KERN, ks);
    }
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    COUNT(cuKernelGetFunction);
    INIT_CHECK();
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    int cslot, kslot;
    struct ctx *c;
    CUresult rc = cur_ctx(&cslot, &c);
    struct kern *k = rc ? NULL : kern_get(kernel, &kslot);
    if (!rc && !k)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (!rc) {
        int fs = 0;
        for (int s = 1; s < si_tab[T_FUNC].n && !fs; s++) {
            struct func *f = OBJ(T_FUNC, func, s);
            if (f->alive && f->kern == kslot && f->ctx == cslot && f->ctx_id == c->id)
                fs = s;
        }
        if (!fs) { /* loaded into this context on first use */
            struct func *f = calloc(1, sizeof *f);
            fs = f ? tab_add(T_FUNC, f) : 0;
            if (fs) {
                f->alive = true;
                f->kern = kslot;
                f->ctx = cslot;
                f->ctx_id = c->id;
                f->name = strdup(k->name);
            } else {
                free(f);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        if (fs)
            *pFunc = handle_of(T_FUNC, fs);
    }
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    COUNT(cuKernelGetName);
    INIT_CHECK();
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct kern *k = kern_get(hfunc, NULL);
    if (k)
        *name = k->name;
    UNLOCK();
    return k ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SI_EXPORT CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    COUNT(cuKernelGetLibrary);
    INIT_CHECK();
    if (!pLib)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct kern *k = kern_get(kernel, NULL);
    if (k)
        *pLib = handle_of(T_LIB, k->lib);
    UNLOCK();
    return k ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Test hook (not a CUDA name): the cubin behind a module or library, so
 * tests can compare what was loaded with and without the shim. */
SI_EXPORT int kcacheTestStandinImage(const void *handle, const void **cubin, size_t *len)
{
    int rc = -1;
    LOCK();
    int s;
    if ((s = slot_of(T_MOD, handle)) && OBJ(T_MOD, mod, s)->alive) {
        *cubin = OBJ(T_MOD, mod, s)->img.cubin;
        *len = OBJ(T_MOD, mod, s)->img.len;
        rc = 0;
    } else if ((s = slot_of(T_LIB, handle)) && OBJ(T_LIB, lib, s)->alive) {
        *cubin = OBJ(T_LIB, lib, s)->img.cubin;
        *len = OBJ(T_LIB, lib, s)->img.len;
        rc = 0;
    }
    UNLOCK();
    return rc;
}

/* ---- the linker -------------------------------------------------------------- */

static struct link *link_get(CUlinkState h)
{
    int s = slot_of(T_LINK, h);
    if (!s || !OBJ(T_LINK, link, s)->alive)
        return NULL;
    return OBJ(T_LINK, link, s);
}

static CUresult link_create(unsigned n, CUjit_option *opt, void **val, CUlinkState *out)
{
    INIT_CHECK();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    struct jit_opts o;
    CUresult rc = jit_opts_parse(n, opt, val, &o);
    if (rc)
        return rc;
    LOCK();
    struct ctx *c;
    rc = cur_ctx(NULL, &c);
    UNLOCK();
    if (rc)
        return rc;
    struct link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->started = now_ns();
    if (jitlink_create(&l->h, &o, o.target ? o.target : cfg_major * 10 + cfg_minor) !=
        NVJITLINK_SUCCESS) {
        free(l);
        return CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
    }
    /* The option arrays stay the caller's until cuLinkDestroy, as documented:
     * logs are written back at cuLinkComplete. */
    l->n_opts = n;
    l->opts = opt;
    l->vals = val;
    l->alive = true;
    LOCK();
    int slot = tab_add(T_LINK, l);
    UNLOCK();
    if (!slot) {
        nvJitLinkDestroy(&l->h);
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = handle_of(T_LINK, slot);
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuLinkCreate(unsigned int n, CUjit_option *options, void **values,
                                CUlinkState *out)
{
    COUNT(cuLinkCreate);
    return link_create(n, options, values, out);
}

SI_EXPORT CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *options, void **values,
                                   CUlinkState *out)
{
    COUNT(cuLinkCreate_v2);
    return link_create(n, options, values, out);
}

static void link_logs(struct link *l)
{
    struct jit_opts o;
    free(l->info);
    free(l->error);
    l->info = jitlink_log(l->h, true);
    l->error = jitlink_log(l->h, false);
    if (jit_opts_parse(l->n_opts, l->opts, l->vals, &o) == CUDA_SUCCESS)
        jit_opts_finish(&o, l->vals, l->info, l->error, l->started);
}

static CUresult link_add(CUlinkState state, CUjitInputType type, void *data, size_t size,
                         const char *name, unsigned n, CUjit_option *opt, void **val)
{
    INIT_CHECK();
    LOCK();
    struct link *l = link_get(state);
    UNLOCK();
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || !size)
        return CUDA_ERROR_INVALID_VALUE;
    struct jit_opts o;
    CUresult rc = jit_opts_parse(n, opt, val, &o);
    if (rc)
        return rc;
    nvJitLinkInputType t;
    int before = l->jits;
    switch (type) {
    case CU_JIT_INPUT_CUBIN:
        if (size < sizeof(Elf64_Ehdr) || memcmp(data, ELFMAG, SELFMAG))
            return CUDA_ERROR_INVALID_IMAGE;
        t = NVJITLINK_INPUT_CUBIN;
        break;
    case CU_JIT_INPUT_PTX:
        if (!looks_like_ptx(data))
            return CUDA_ERROR_INVALID_PTX;
        t = NVJITLINK_INPUT_PTX;
        l->jits++;
        break;
    case CU_JIT_INPUT_FATBINARY: {
        const struct fatbin_entry *sass;
        bool has_sass, has_ptx;
        size_t total;
        if (size < sizeof(struct fatbin_header) ||
            fatbin_scan(data, &total, cfg_major, cfg_minor, &sass, &has_sass, &has_ptx) ||
            total > size)
            return CUDA_ERROR_INVALID_IMAGE;
        if (!has_sass && !has_ptx)
            return CUDA_ERROR_NO_BINARY_FOR_GPU;
        if (!has_sass)
            l->jits++;
        t = NVJITLINK_INPUT_FATBIN;
        break;
    }
    case CU_JIT_INPUT_OBJECT:
        t = NVJITLINK_INPUT_OBJECT;
        break;
    case CU_JIT_INPUT_LIBRARY:
        t = NVJITLINK_INPUT_LIBRARY;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* An unnamed input is named in logs as the loader names an image: the
     * loader's JIT is this linker with no input name. */
    if (nvJitLinkAddData(l->h, t, data, size, name ? name : "image") != NVJITLINK_SUCCESS) {
        /* nvJitLink compiled the PTX here and it failed: that was the JIT
         * attempt (the real driver, too, compiles PTX in cuLinkAddData). */
        if (l->jits > before) {
            l->jits = before;
            atomic_fetch_add(&si_jit, 1);
        }
        link_logs(l);
        return type == CU_JIT_INPUT_PTX ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_INVALID_IMAGE;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                 const char *name, unsigned int n, CUjit_option *options,
                                 void **values)
{
    COUNT(cuLinkAddData);
    return link_add(state, type, data, size, name, n, options, values);
}

SI_EXPORT CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                    const char *name, unsigned int n, CUjit_option *options,
                                    void **values)
{
    COUNT(cuLinkAddData_v2);
    return link_add(state, type, data, size, name, n, options, values);
}

/* cuLinkAddFile: the file's bytes added as cuLinkAddData adds them, named
 * by the path (the real driver reads the file the same way). */
static CUresult link_add_file(CUlinkState state, CUjitInputType type, const char *path, unsigned n,
                              CUjit_option *opt, void **val)
{
    INIT_CHECK();
    LOCK();
    struct link *l = link_get(state);
    UNLOCK();
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!path)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            close(fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            free(buf);
            close(fd);
            return CUDA_ERROR_FILE_NOT_FOUND;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    close(fd);
    buf[len] = 0; /* PTX read from a file is text: NUL-terminated */
    CUresult rc =
        link_add(state, type, buf, type == CU_JIT_INPUT_PTX ? len + 1 : len, path, n, opt, val);
    free(buf);
    return rc;
}

SI_EXPORT CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path,
                                 unsigned int n, CUjit_option *options, void **values)
{
    COUNT(cuLinkAddFile);
    return link_add_file(state, type, path, n, options, values);
}

SI_EXPORT CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path,
                                    unsigned int n, CUjit_option *options, void **values)
{
    COUNT(cuLinkAddFile_v2);
    return link_add_file(state, type, path, n, options, values);
}

SI_EXPORT CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    COUNT(cuLinkComplete);
    INIT_CHECK();
    if (!cubinOut || !sizeOut)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct link *l = link_get(state);
    UNLOCK();
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (l->cubin) {
        *cubinOut = l->cubin;
        *sizeOut = l->cubin_len;
        return CUDA_SUCCESS;
    }
    uint64_t t0 = now_ns();
    nvJitLinkResult r = nvJitLinkComplete(l->h);
    if (l->jits) {
        atomic_fetch_add(&si_jit, (uint64_t)l->jits);
        atomic_fetch_add(&si_jit_ns, now_ns() - t0);
    }
    CUresult rc = CUDA_SUCCESS;
    if (r != NVJITLINK_SUCCESS) {
        rc = l->jits ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_INVALID_IMAGE;
    } else {
        size_t n = 0;
        nvJitLinkGetLinkedCubinSize(l->h, &n);
        l->cubin = malloc(n ? n : 1);
        if (!l->cubin || nvJitLinkGetLinkedCubin(l->h, l->cubin) != NVJITLINK_SUCCESS) {
            free(l->cubin);
            l->cubin = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            l->cubin_len = n;
            *cubinOut = l->cubin;
            *sizeOut = n;
        }
    }
    link_logs(l);
    return rc;
}

SI_EXPORT CUresult cuLinkDestroy(CUlinkState state)
{
    COUNT(cuLinkDestroy);
    INIT_CHECK();
    LOCK();
    struct link *l = link_get(state);
    if (l) {
        l->alive = false;
        nvJitLinkDestroy(&l->h);
        free(l->cubin);
        free(l->info);
        free(l->error);
        l->cubin = NULL;
        l->info = l->error = NULL;
    }
    UNLOCK();
    return l ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- memory ------------------------------------------------------------------ */

static CUresult mem_alloc(uint64_t *dptr, size_t size, bool managed, bool low)
{
    INIT_CHECK();
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    int cslot;
    struct ctx *c;
    CUresult rc = cur_ctx(&cslot, &c);
    if (rc) {
        UNLOCK();
        return rc;
    }
    size_t rounded = (size + 511) & ~(size_t)511;
    if (!managed && (rounded < size || si_used[c->dev] + size > cfg_mem)) {
        UNLOCK();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = calloc(1, sizeof *a);
    uint64_t *next = low ? &si_next_addr32 : &si_next_addr;
    if (!a || (low && *next + rounded > UINT32_MAX)) {
        free(a);
        UNLOCK();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ptr = *next;
    *next += rounded + 512; /* addresses are never reused: a double free is seen */
    a->size = size;
    a->ctx = cslot;
    a->ctx_id = c->id;
    a->alive = true;
    a->managed = managed;
    a->buffer_id = si_next_buffer_id++;
    if (alloc_insert(a)) {
        free(a);
        UNLOCK();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!managed)
        si_used[c->dev] += size;
    *dptr = a->ptr;
    UNLOCK();
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    COUNT(cuMemAlloc_v2);
    uint64_t p = 0;
    CUresult rc = mem_alloc(dptr ? &p : NULL, bytesize, false, false);
    if (!rc)
        *dptr = p;
    return rc;
}

SI_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    COUNT(cuMemAlloc);
    uint64_t p = 0;
    CUresult rc = mem_alloc(dptr ? &p : NULL, bytesize, false, true);
    if (!rc)
        *dptr = (CUdeviceptr_v1)p;
    return rc;
}

SI_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    COUNT(cuMemAllocManaged);
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = 0;
    CUresult rc = mem_alloc(dptr ? &p : NULL, bytesize, true, false);
    if (!rc)
        *dptr = p;
    return rc;
}

static CUresult mem_free(uint64_t ptr)
{
    INIT_CHECK();
    LOCK();
    struct alloc *a = alloc_find(ptr);
    CUresult rc = CUDA_SUCCESS;
    if (!a || !a->alive)
        rc = CUDA_ERROR_INVALID_VALUE; /* unknown, interior, or freed already */
    else
        alloc_release(a);
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    COUNT(cuMemFree_v2);
    return mem_free(dptr);
}

SI_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    COUNT(cuMemFree);
    return mem_free(dptr);
}

static CUresult mem_info(size_t *free_b, size_t *total)
{
    INIT_CHECK();
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct ctx *c;
    CUresult rc = cur_ctx(NULL, &c);
    if (!rc) {
        *total = cfg_mem;
        *free_b = cfg_mem - si_used[c->dev];
    }
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total)
{
    COUNT(cuMemGetInfo_v2);
    return mem_info(free_b, total);
}

SI_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total)
{
    COUNT(cuMemGetInfo);
    size_t f, t;
    if (!free_b || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = mem_info(&f, &t);
    if (!rc) {
        *free_b = f > UINT32_MAX ? UINT32_MAX : (unsigned)f;
        *total = t > UINT32_MAX ? UINT32_MAX : (unsigned)t;
    }
    return rc;
}

/* The live allocation holding ptr (its first byte up to its last), or NULL. */
static struct alloc *alloc_at(uint64_t ptr)
{
    struct alloc *a = alloc_find(ptr);
    if (a && a->alive)
        return a;
    for (size_t i = 0; i < si_alloc_cap; i++) {
        a = si_allocs[i];
        if (a && a->alive && ptr >= a->ptr && ptr - a->ptr < a->size)
            return a;
    }
    return NULL;
}

SI_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    COUNT(cuMemGetAddressRange_v2);
    INIT_CHECK();
    LOCK();
    struct alloc *a = alloc_at(dptr);
    if (a) {
        if (base)
            *base = a->ptr;
        if (size)
            *size = a->size; /* the size asked for, as cuMemAlloc documents it */
    }
    UNLOCK();
    return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* Pointer attributes, as cuPointerGetAttribute documents them, for memory
 * from cuMemAlloc (device) and cuMemAllocManaged (managed). Booleans are
 * written as int; the stand-in's choices where the documentation names no
 * value: no allowed handle types, read-write access, no memory pool, a
 * mapping rounded to 512 bytes and a memory block id per allocation. */
static size_t attr_size(CUpointer_attribute attr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return sizeof(unsigned);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        return sizeof(unsigned);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return sizeof(CUmemoryPool);
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        return sizeof(int);
    default:
        return 0;
    }
}

/* One attribute of ptr inside allocation a, under si_lock. */
static CUresult attr_get(struct alloc *a, uint64_t ptr, CUpointer_attribute attr, void *data)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = handle_of(T_CTX, a->ctx);
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = a->managed ? CU_MEMORYTYPE_UNIFIED : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        if (cur_ctx(NULL, NULL))
            return CUDA_ERROR_INVALID_CONTEXT;
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!a->managed)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        if (a->managed)
            return CUDA_ERROR_INVALID_VALUE;
        ((CUDA_POINTER_ATTRIBUTE_P2P_TOKENS *)data)->p2pToken = a->buffer_id;
        ((CUDA_POINTER_ATTRIBUTE_P2P_TOKENS *)data)->vaSpaceToken = 1;
        a->sync_memops = true; /* documented side effect */
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(int *)data = a->sync_memops;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = a->buffer_id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = a->managed;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = OBJ(T_CTX, ctx, a->ctx)->dev;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = !a->managed;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = a->ptr;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a->size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(int *)data = !a->managed;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        if (cur_ctx(NULL, NULL))
            return CUDA_ERROR_INVALID_CONTEXT;
        *(unsigned *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = (a->size + 511) & ~(size_t)511;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = a->ptr;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = a->buffer_id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        *(int *)data = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    COUNT(cuPointerGetAttribute);
    INIT_CHECK();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct alloc *a = alloc_at(ptr);
    CUresult rc = a ? attr_get(a, ptr, attribute, data) : CUDA_ERROR_INVALID_VALUE;
    UNLOCK();
    return rc;
}

/* The attributes cuPointerGetAttributes documents. */
static bool attr_multi(CUpointer_attribute attr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        return true;
    default:
        return false;
    }
}

/* As documented: no error for a pointer the driver does not know, every
 * attribute then gets its zero ("NULL") value; an attribute with no value
 * for a known pointer (the host address of device memory) gets it too. */
SI_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
                                          void **data, CUdeviceptr ptr)
{
    COUNT(cuPointerGetAttributes);
    INIT_CHECK();
    if (n == 0 || !attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!attr_multi(attributes[i]) || !data[i])
            return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct alloc *a = alloc_at(ptr);
    for (unsigned i = 0; i < n; i++)
        if (!a || attr_get(a, ptr, attributes[i], data[i]) != CUDA_SUCCESS)
            memset(data[i], 0, attr_size(attributes[i]));
    UNLOCK();
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    COUNT(cuPointerSetAttribute);
    INIT_CHECK();
    if (!value || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct alloc *a = alloc_at(ptr);
    if (a)
        a->sync_memops = *(const unsigned *)value != 0;
    UNLOCK();
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult memcpy_hd(uint64_t dev, void *host, size_t n, bool to_dev)
{
    INIT_CHECK();
    if (!host && n)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    CUresult rc = cur_ctx(NULL, NULL);
    struct alloc *a = rc ? NULL : alloc_containing(dev, n);
    if (!rc && !a)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (!rc && !a->backing && !(a->backing = calloc(1, a->size)))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!rc && n) {
        unsigned char *d = a->backing + (dev - a->ptr);
        if (to_dev)
            memcpy(d, host, n);
        else
            memcpy(host, d, n);
    }
    UNLOCK();
    return rc;
}

SI_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    COUNT(cuMemcpyHtoD_v2);
    return memcpy_hd(dst, (void *)src, n, true);
}

SI_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    COUNT(cuMemcpyHtoD_v2_ptds);
    return memcpy_hd(dst, (void *)src, n, true);
}

SI_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    COUNT(cuMemcpyDtoH_v2);
    return memcpy_hd(src, dst, n, false);
}

SI_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    COUNT(cuMemcpyDtoH_v2_ptds);
    return memcpy_hd(src, dst, n, false);
}

/* ---- errors ---------------------------------------------------------------------- */

SI_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    COUNT(cuGetErrorString);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof standin_errors / sizeof standin_errors[0]; i++) {
        if (standin_errors[i].code == (int)error) {
            *pStr = standin_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

SI_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    COUNT(cuGetErrorName);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof standin_errors / sizeof standin_errors[0]; i++) {
        if (standin_errors[i].code == (int)error) {
            *pStr = standin_errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress ---------------------------------------------------------------- */

/* base name, symbol, the CUDA version that introduced this variant, and
 * whether it is the per-thread-default-stream variant. For one base, rows go
 * from the oldest variant to the newest. */
struct proc {
    const char *base;
    const char *sym;
    int version;
    bool ptds;
    void *fn;
};

#define PROC(base, sym, ver)                                                                       \
    {                                                                                              \
#base, #sym, ver, false, (void *)sym                                                       \
    }
#define PROC_PT(base, sym, ver)                                                                    \
    {                                                                                              \
#base, #sym, ver, true, (void *)sym                                                        \
    }

static const struct proc si_procs[] = {
    PROC(cuInit, cuInit, 2000),
    PROC(cuDriverGetVersion, cuDriverGetVersion, 2020),
    PROC(cuDeviceGet, cuDeviceGet, 2000),
    PROC(cuDeviceGetCount, cuDeviceGetCount, 2000),
    PROC(cuDeviceGetName, cuDeviceGetName, 2000),
    PROC(cuDeviceGetAttribute, cuDeviceGetAttribute, 2000),
    PROC(cuDeviceComputeCapability, cuDeviceComputeCapability, 2000),
    PROC(cuDeviceTotalMem, cuDeviceTotalMem, 2000),
    PROC(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020),
    PROC(cuCtxCreate, cuCtxCreate, 2000),
    PROC(cuCtxCreate, cuCtxCreate_v2, 3020),
    PROC(cuCtxCreate, cuCtxCreate_v3, 11040),
    PROC(cuCtxCreate, cuCtxCreate_v4, 12050),
    PROC(cuCtxDestroy, cuCtxDestroy, 2000),
    PROC(cuCtxDestroy, cuCtxDestroy_v2, 4000),
    PROC(cuCtxGetCurrent, cuCtxGetCurrent, 4000),
    PROC(cuCtxSetCurrent, cuCtxSetCurrent, 4000),
    PROC(cuCtxGetId, cuCtxGetId, 12000),
    PROC(cuCtxGetDevice, cuCtxGetDevice, 2000),
    PROC(cuCtxSynchronize, cuCtxSynchronize, 2000),
    PROC(cuCtxPushCurrent, cuCtxPushCurrent, 2000),
    PROC(cuCtxPushCurrent, cuCtxPushCurrent_v2, 4000),
    PROC(cuCtxPopCurrent, cuCtxPopCurrent, 2000),
    PROC(cuCtxPopCurrent, cuCtxPopCurrent_v2, 4000),
    PROC(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000),
    PROC(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000),
    PROC(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000),
    PROC(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000),
    PROC(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 11000),
    PROC(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState, 7000),
    PROC(cuModuleLoadData, cuModuleLoadData, 2000),
    PROC(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010),
    PROC(cuModuleLoadFatBinary, cuModuleLoadFatBinary, 2000),
    PROC(cuModuleUnload, cuModuleUnload, 2000),
    PROC(cuModuleGetFunction, cuModuleGetFunction, 2000),
    PROC(cuLibraryLoadData, cuLibraryLoadData, 12000),
    PROC(cuLibraryUnload, cuLibraryUnload, 12000),
    PROC(cuLibraryGetKernel, cuLibraryGetKernel, 12000),
    PROC(cuKernelGetFunction, cuKernelGetFunction, 12000),
    PROC(cuKernelGetName, cuKernelGetName, 12030),
    PROC(cuKernelGetLibrary, cuKernelGetLibrary, 12050),
    PROC(cuFuncGetName, cuFuncGetName, 12030),
    PROC(cuFuncGetModule, cuFuncGetModule, 11000),
    PROC(cuLinkCreate, cuLinkCreate, 5050),
    PROC(cuLinkCreate, cuLinkCreate_v2, 6050),
    PROC(cuLinkAddData, cuLinkAddData, 5050),
    PROC(cuLinkAddData, cuLinkAddData_v2, 6050),
    PROC(cuLinkAddFile, cuLinkAddFile, 5050),
    PROC(cuLinkAddFile, cuLinkAddFile_v2, 6050),
    PROC(cuLinkComplete, cuLinkComplete, 5050),
    PROC(cuLinkDestroy, cuLinkDestroy, 5050),
    PROC(cuMemAlloc, cuMemAlloc, 2000),
    PROC(cuMemAlloc, cuMemAlloc_v2, 3020),
    PROC(cuMemFree, cuMemFree, 2000),
    PROC(cuMemFree, cuMemFree_v2, 3020),
    PROC(cuMemGetInfo, cuMemGetInfo, 2000),
    PROC(cuMemGetInfo, cuMemGetInfo_v2, 3020),
    PROC(cuMemAllocManaged, cuMemAllocManaged, 6000),
    PROC(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020),
    PROC(cuPointerGetAttribute, cuPointerGetAttribute, 4000),
    PROC(cuPointerSetAttribute, cuPointerSetAttribute, 6000),
    PROC(cuPointerGetAttributes, cuPointerGetAttributes, 7000),
    PROC(cuMemcpyHtoD, cuMemcpyHtoD_v2, 3020),
    PROC_PT(cuMemcpyHtoD, cuMemcpyHtoD_v2_ptds, 7000),
    PROC(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020),
    PROC_PT(cuMemcpyDtoH, cuMemcpyDtoH_v2_ptds, 7000),
    PROC(cuLaunchKernel, cuLaunchKernel, 4000),
    PROC_PT(cuLaunchKernel, cuLaunchKernel_ptsz, 7000),
    PROC(cuGetProcAddress, cuGetProcAddress, 11030),
    PROC(cuGetProcAddress, cuGetProcAddress_v2, 12000),
    PROC(cuGetErrorString, cuGetErrorString, 6000),
    PROC(cuGetErrorName, cuGetErrorName, 6000),
    PROC(cuModuleLoad, cuModuleLoad, 2000),
    PROC(cuLibraryLoadFromFile, cuLibraryLoadFromFile, 12000),
};

/* Entry points added for real clients (the block at the end of this file). */
static const struct proc *si_client_procs(size_t *n);

static CUresult proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (version > cfg_version)
        return CUDA_ERROR_INVALID_VALUE;
    bool ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *best = NULL;
    bool found = false;
    size_t n_more = 0, n_base = sizeof si_procs / sizeof si_procs[0];
    const struct proc *more = si_client_procs(&n_more);
    for (size_t i = 0; i < n_base + n_more; i++) {
        const struct proc *p = i < n_base ? &si_procs[i] : &more[i - n_base];
        if (strcmp(p->base, symbol))
            continue;
        found = true;
        if (p->version > version || (p->ptds && !ptds))
            continue;
        /* Newest variant the version allows; a per-thread one wins when asked. */
        if (!best || p->ptds || (!best->ptds && p->version >= best->version))
            best = p;
    }
    *pfn = best ? best->fn : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                       : (found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus)
{
    COUNT(cuGetProcAddress_v2);
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

SI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    COUNT(cuGetProcAddress);
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

/* ---- what PyCUDA and Triton's launcher call to load (issue 21) -------- */

/* CUDA_ERROR_NOT_INITIALIZED before cuInit, CUDA_ERROR_INVALID_HANDLE for
 * a function that is not (or no longer) loaded. */
static CUresult func_live(CUfunction hfunc)
{
    INIT_CHECK();
    LOCK();
    struct func *f = func_get(hfunc);
    UNLOCK();
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Function attributes: a test double's fixed answers (no register
 * allocation happens here), with the driver's checks. Settable ones are
 * accepted and not modelled further: nothing runs. */
SI_EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    if (si_inited && (!pi || (int)attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = func_live(hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *pi = 1024;
        break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
        *pi = 16;
        break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *pi = cfg_major * 10 + cfg_minor;
        break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        *pi = 49152;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        *pi = -1;
        break;
    default:
        *pi = 0;
    }
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    CUresult rc = func_live(hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        return value < 0 || value > 232448 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        return value < -1 || value > 100 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SI_EXPORT CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    CUresult rc = func_live(hfunc);
    if (rc != CUDA_SUCCESS)
        return rc;
    return (int)config < 0 || config > CU_FUNC_CACHE_PREFER_EQUAL ? CUDA_ERROR_INVALID_VALUE
                                                                  : CUDA_SUCCESS;
}

/* The deprecated cuCtxDetach: the usage count of a context from
 * cuCtxCreate is 1 here (cuCtxAttach is not modelled), so it destroys it;
 * PyCUDA's Context.detach calls it. */
SI_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    return ctx_destroy(ctx);
}

/* ---- entry points real clients ask for (numba-cuda, cuda-cccl) -------------------------
 *
 * numba-cuda's @cuda.jit and cuda-cccl's algorithms initialise through
 * cuda.core and cuda.bindings, which resolve the driver through
 * cuGetProcAddress: the table below lists what they ask for, the functions
 * above (cuFuncGetAttribute, ...) and in unsupported.c (cuLaunchKernelEx,
 * cuMemsetD8Async: nothing executes) included. Queries answer as the
 * documented API does for the stand-in's device.
 */

SI_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    INIT_CHECK();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    memset(uuid, 0, sizeof *uuid);
    memcpy(uuid->bytes, "kcache-standin", 14);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

/* A kernel's attributes in a device's context: those of its function
 * (cuFuncGetAttribute's fixed answers), once the kernel handle checks. */
SI_EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel,
                                        CUdevice dev)
{
    INIT_CHECK();
    if (pi == NULL || (int)attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    DEV_CHECK(dev);
    int slot;
    LOCK();
    struct kern *k = kern_get(kernel, &slot);
    UNLOCK();
    if (k == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *pi = 1024;
        break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
        *pi = 16;
        break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *pi = cfg_major * 10 + cfg_minor;
        break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        *pi = 49152;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        *pi = -1;
        break;
    default:
        *pi = 0;
    }
    return CUDA_SUCCESS;
}

/* Occupancy as the device's limits give it (2048 threads, 32 blocks per
 * multiprocessor); the kernel's registers and shared memory are not read. */
SI_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                               int blockSize,
                                                               size_t dynamicSMemSize)
{
    INIT_CHECK();
    if (numBlocks == NULL || blockSize <= 0 || blockSize > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    LOCK();
    struct func *f = func_get(func);
    UNLOCK();
    if (f == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    int n = 2048 / blockSize;
    *numBlocks = dynamicSMemSize > 227 * 1024 ? 0 : n > 32 ? 32 : n;
    return CUDA_SUCCESS;
}

/* A device-side copy: nothing executes on the stand-in. */
SI_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    INIT_CHECK();
    return CUDA_ERROR_NOT_SUPPORTED;
}

static const struct proc si_client_table[] = {
    PROC(cuDeviceGetUuid, cuDeviceGetUuid, 9020),
    PROC(cuDeviceGetUuid, cuDeviceGetUuid_v2, 11040),
    PROC(cuFuncGetAttribute, cuFuncGetAttribute, 2020),
    PROC(cuFuncSetAttribute, cuFuncSetAttribute, 9000),
    PROC(cuKernelGetAttribute, cuKernelGetAttribute, 12000),
    PROC(cuOccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor,
         6050),
    PROC(cuLaunchKernelEx, cuLaunchKernelEx, 11060),
    PROC(cuMemcpyAsync, cuMemcpyAsync, 4000),
    PROC(cuMemsetD8Async, cuMemsetD8Async, 3020),
};

static const struct proc *si_client_procs(size_t *n)
{
    *n = sizeof si_client_table / sizeof si_client_table[0];
    return si_client_table;
}

/* ---- loads from a file (issue 23) ------------------------------------------------- */

/* cuModuleLoad and cuLibraryLoadFromFile: the file read whole, then loaded
 * as its data would be. A file that cannot be opened or read (missing, a
 * directory, no permission) is CUDA_ERROR_FILE_NOT_FOUND, as the driver
 * answers; a NULL name CUDA_ERROR_INVALID_VALUE. */
extern __typeof__(cuLibraryLoadData) si_library_load_data
    __attribute__((alias("cuLibraryLoadData"), visibility("hidden")));

static CUresult si_file_read(const char *path, char **out)
{
    if (path == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rbe");
    if (f == NULL)
        return CUDA_ERROR_FILE_NOT_FOUND;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            char *b = realloc(buf, cap = cap ? cap * 2 : 65536);
            if (b == NULL) {
                free(buf);
                fclose(f);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            buf = b;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    buf[len] = '\0';
    *out = buf;
    return CUDA_SUCCESS;
}

SI_EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    COUNT(cuModuleLoad);
    INIT_CHECK();
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    char *image = NULL;
    CUresult rc = si_file_read(fname, &image);
    if (rc)
        return rc;
    rc = module_load(module, image, 0, NULL, NULL);
    free(image);
    return rc;
}

SI_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                         CUjit_option *jitOptions, void **jitOptionsValues,
                                         unsigned int numJitOptions,
                                         CUlibraryOption *libraryOptions,
                                         void **libraryOptionValues, unsigned int numLibraryOptions)
{
    COUNT(cuLibraryLoadFromFile);
    INIT_CHECK();
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; libraryOptions && i < numLibraryOptions; i++)
        if (libraryOptions[i] == CU_LIBRARY_BINARY_IS_PRESERVED)
            return CUDA_ERROR_INVALID_VALUE;
    char *image = NULL;
    CUresult rc = si_file_read(fileName, &image);
    if (rc)
        return rc;
    rc = si_library_load_data(library, image, jitOptions, jitOptionsValues, numJitOptions,
                              libraryOptions, libraryOptionValues, numLibraryOptions);
    free(image);
    return rc;
}
