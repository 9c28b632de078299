/*
 * The driver path's internals shared by driver.c (interception, JIT cache)
 * and memo.c (the context memo: function handles and the allocation pool).
 * Not installed, not exported.
 *
 * Both files define __CUDA_API_VERSION_INTERNAL before including cuda.h so
 * that the unversioned legacy names (cuCtxDestroy, cuDevicePrimaryCtxReset,
 * ...) are declared with their own signatures and can be wrapped too.
 */
#ifndef KCACHE_SHIM_DRIVER_H
#define KCACHE_SHIM_DRIVER_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "shim.h"

/* A real driver function that is not hooked (cuCtxGetCurrent, cuLinkCreate_v2,
 * ...): found in the libcuda the host uses, which is the library any hooked
 * real pointer lies in, else the next one in the global scope. NULL when no
 * libcuda is loaded. Never goes through our dlsym. */
void *kc__cu_real(const char *name);

/* One real driver function to resolve: its name, and the function pointer
 * that receives it. */
struct kc__cu_need {
    const char *name;
    void *slot;
};
/* Resolves every one with kc__cu_real (each slot set, NULL when missing);
 * whether all were found. */
int kc__cu_real_all(const struct kc__cu_need *need, size_t n);

/* The real pointer behind one of our driver hooks, by its exported name;
 * NULL when no real libcuda is loaded. */
void *kc__cu_hooked_real(const char *name);

/* Wrappers defined in memo.c, under hidden aliases so that the hook table in
 * driver.c points at our own code whatever the symbol lookup order (the
 * address is the exported function's, so dladdr names it correctly). */
/* One entry a line (clang-format would run them together). */
// clang-format off
#define KC_MEMO_WRAPPERS(X)                                                                        \
    X(cuModuleGetFunction)                                                                         \
    X(cuLibraryGetKernel)                                                                          \
    X(cuKernelGetFunction)                                                                         \
    X(cuModuleUnload)                                                                              \
    X(cuLibraryUnload)                                                                             \
    X(cuCtxDestroy)                                                                                \
    X(cuCtxDestroy_v2)                                                                             \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuDevicePrimaryCtxRelease_v2)                                                                \
    X(cuDevicePrimaryCtxReset)                                                                     \
    X(cuDevicePrimaryCtxReset_v2)                                                                  \
    X(cuMemAlloc_v2)                                                                               \
    X(cuMemFree_v2)                                                                                \
    X(cuMemGetInfo_v2)                                                                             \
    X(cuMemGetInfo)                                                                                \
    X(cuMemGetAddressRange_v2)                                                                     \
    X(cuPointerGetAttribute)                                                                       \
    X(cuPointerGetAttributes)                                                                      \
    X(cuPointerSetAttribute)
// clang-format on

#define KC_MEMO_ALIAS_DECL(name)                                                                   \
    extern __typeof__(name) kc__w_##name __attribute__((visibility("hidden")));
KC_MEMO_WRAPPERS(KC_MEMO_ALIAS_DECL)
#undef KC_MEMO_ALIAS_DECL

/* Where memo.c keeps the real pointers (filled by the hook machinery). */
#define KC_MEMO_REAL_DECL(name) extern void *kc__real_##name __attribute__((visibility("hidden")));
KC_MEMO_WRAPPERS(KC_MEMO_REAL_DECL)
#undef KC_MEMO_REAL_DECL

/* The host's log options in a JIT option array: its buffers, their sizes
 * and where the driver writes back (indices; -1: not given). */
struct kc__jit_logs {
    char *info_buf, *error_buf;
    size_t info_size, error_size;
    int info_idx, error_idx, wall_idx;
};
void kc__jit_logs_init(struct kc__jit_logs *l);

/* Takes option o (value v, at index i) into *l when it is a log option
 * (log buffers, their sizes, wall time): true; false for any other. */
bool kc__jit_log_option(struct kc__jit_logs *l, CUjit_option o, void *v, unsigned i);

/* Whether option o changes the code and is an integer a key can hold (the
 * driver reads these values as 32-bit). The rest (in/out, pointers,
 * symbols, LTO) cannot be replayed from the cache. */
bool kc__jit_code_option(CUjit_option o);

/* The driver JIT's hook table (NULL-name terminated), registered with
 * KC__FAMILY. */
extern const struct kc__hook kc__driver_hooks[];

#endif
