/*
 * The context memo's wrappers and real pointers (shim/memo.c), which the
 * hook table in shim/driver.c names; never called by the driver fuzz target.
 * Defined without cuda.h on purpose: only their addresses are taken.
 */
#include <stdlib.h>

#define KC_FUZZ_MEMO(name)                                                                         \
    void *kc__real_##name;                                                                         \
    void kc__w_##name(void);                                                                       \
    void kc__w_##name(void)                                                                        \
    {                                                                                              \
        abort();                                                                                   \
    }
KC_FUZZ_MEMO(cuModuleGetFunction)
KC_FUZZ_MEMO(cuLibraryGetKernel)
KC_FUZZ_MEMO(cuKernelGetFunction)
KC_FUZZ_MEMO(cuModuleUnload)
KC_FUZZ_MEMO(cuLibraryUnload)
KC_FUZZ_MEMO(cuCtxDestroy)
KC_FUZZ_MEMO(cuCtxDestroy_v2)
KC_FUZZ_MEMO(cuDevicePrimaryCtxRetain)
KC_FUZZ_MEMO(cuDevicePrimaryCtxRelease)
KC_FUZZ_MEMO(cuDevicePrimaryCtxRelease_v2)
KC_FUZZ_MEMO(cuDevicePrimaryCtxReset)
KC_FUZZ_MEMO(cuDevicePrimaryCtxReset_v2)
KC_FUZZ_MEMO(cuMemAlloc_v2)
KC_FUZZ_MEMO(cuMemFree_v2)
KC_FUZZ_MEMO(cuMemGetInfo_v2)
KC_FUZZ_MEMO(cuMemGetInfo)
KC_FUZZ_MEMO(cuMemGetAddressRange_v2)
KC_FUZZ_MEMO(cuPointerGetAttribute)
KC_FUZZ_MEMO(cuPointerGetAttributes)
KC_FUZZ_MEMO(cuPointerSetAttribute)
