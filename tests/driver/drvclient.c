/*
 * drvclient: a driver-API program for the driver-path tests.
 *
 * Runs one scenario and prints what it observed, one fact per line, so a
 * test can run it with and without the shim and compare the outputs. Built
 * twice: drvclient-linked (linked against libcuda.so.1, calls by name) and
 * drvclient (dlopen()s libcuda.so.1 and finds every entry point with dlsym,
 * or with cuGetProcAddress when --route=proc:VERSION:FLAGS is given).
 *
 *   drvclient [--route=dlsym|proc:V:F] SCENARIO [ARGS...]
 *
 * Scenarios: load, memo, alloc, oom, fallback, hostile, procaddr, pool,
 * libnoctx, loadmany (see each function). Nothing printed may depend on
 * addresses or timing.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Every entry point the scenarios use, by base name and the versioned
 * symbol the header maps it to. */
/* One entry a line (clang-format would run them together). */
// clang-format off
#define DRV_FUNCS(X)                                                                               \
    X(cuInit, cuInit) X(cuDeviceGet, cuDeviceGet) X(cuCtxCreate, cuCtxCreate_v4)                   \
    X(cuCtxDestroy, cuCtxDestroy_v2) X(cuCtxGetCurrent, cuCtxGetCurrent)                           \
    X(cuCtxSetCurrent, cuCtxSetCurrent) X(cuCtxGetId, cuCtxGetId)                                  \
    X(cuCtxPushCurrent, cuCtxPushCurrent_v2) X(cuCtxPopCurrent, cuCtxPopCurrent_v2)                \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                                          \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)                                     \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2) X(cuModuleLoadData, cuModuleLoadData)   \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx) X(cuModuleLoadFatBinary, cuModuleLoadFatBinary)      \
    X(cuModuleUnload, cuModuleUnload) X(cuModuleGetFunction, cuModuleGetFunction)                  \
    X(cuLibraryLoadData, cuLibraryLoadData) X(cuLibraryUnload, cuLibraryUnload)                    \
    X(cuLibraryGetKernel, cuLibraryGetKernel) X(cuKernelGetFunction, cuKernelGetFunction)          \
    X(cuFuncGetName, cuFuncGetName) X(cuLaunchKernel, cuLaunchKernel)                              \
    X(cuMemAlloc, cuMemAlloc_v2) X(cuMemFree, cuMemFree_v2) X(cuMemGetInfo, cuMemGetInfo_v2)       \
    X(cuMemAllocManaged, cuMemAllocManaged) X(cuPointerGetAttribute, cuPointerGetAttribute)        \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2) X(cuMemcpyDtoH, cuMemcpyDtoH_v2)                              \
    X(cuLinkCreate, cuLinkCreate_v2) X(cuLinkAddData, cuLinkAddData_v2)                            \
    X(cuLinkComplete, cuLinkComplete) X(cuLinkDestroy, cuLinkDestroy)                              \
    X(cuGetErrorName, cuGetErrorName) X(cuGetProcAddress, cuGetProcAddress_v2)                     \
    X(cuMemGetAddressRange, cuMemGetAddressRange_v2) X(cuPointerGetAttributes, cuPointerGetAttributes) \
    X(cuPointerSetAttribute, cuPointerSetAttribute)                                                \
    X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState)                                      \
    X(cuModuleLoad, cuModuleLoad) X(cuLibraryLoadFromFile, cuLibraryLoadFromFile)
// clang-format on

static struct {
#define DRV_FIELD(base, sym) __typeof__(&sym) base;
    DRV_FUNCS(DRV_FIELD)
#undef DRV_FIELD
    int (*image)(const void *h, const void **cubin, size_t *len);
} D;

static void *lib;

static const char *ename(CUresult rc)
{
    const char *s = NULL;
    if (D.cuGetErrorName(rc, &s) != CUDA_SUCCESS || !s)
        return "UNKNOWN";
    return s;
}

#define SAY(...) (printf(__VA_ARGS__), putchar('\n'), fflush(stdout))
#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            printf("FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #call, ename(rc_));                \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int resolve(const char *route)
{
#ifdef DRV_LINKED
    if (!strcmp(route, "link")) {
#define DRV_LINK(base, sym) D.base = &sym;
        DRV_FUNCS(DRV_LINK)
#undef DRV_LINK
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        D.image = lib ? (int (*)(const void *, const void **, size_t *))dlsym(
                            lib, "kcacheTestStandinImage")
                      : NULL;
        return 0;
    }
#endif
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    D.image = (int (*)(const void *, const void **, size_t *))dlsym(lib, "kcacheTestStandinImage");
    D.cuGetErrorName = (__typeof__(D.cuGetErrorName))dlsym(lib, "cuGetErrorName");
    if (!strcmp(route, "dlsym")) {
#define DRV_DLSYM(base, sym) D.base = (__typeof__(D.base))dlsym(lib, #sym);
        DRV_FUNCS(DRV_DLSYM)
#undef DRV_DLSYM
        return 0;
    }
    int version = 0;
    unsigned long long flags = 0;
    if (sscanf(route, "proc:%d:%llu", &version, &flags) != 2) {
        fprintf(stderr, "bad route %s\n", route);
        return -1;
    }
    __typeof__(&cuGetProcAddress_v2) gpa = (__typeof__(gpa))dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa)
        return -1;
        /* cuGetProcAddress hands out the newest variant for `version`; the
         * scenarios need the current ABI, so they ask with at least 12050. */
#define DRV_PROC(base, sym)                                                                        \
    do {                                                                                           \
        void *p = NULL;                                                                            \
        CUdriverProcAddressQueryResult st;                                                         \
        if (gpa(#base, &p, version, flags, &st) != CUDA_SUCCESS || !p) {                           \
            fprintf(stderr, "cuGetProcAddress(%s, %d) failed\n", #base, version);                  \
            return -1;                                                                             \
        }                                                                                          \
        D.base = (__typeof__(D.base))p;                                                            \
    } while (0);
    DRV_FUNCS(DRV_PROC)
#undef DRV_PROC
    return 0;
}

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = calloc(1, (size_t)n + 1); /* NUL-terminated, for PTX */
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n)
        exit(2);
    fclose(f);
    if (len)
        *len = (size_t)n;
    return b;
}

static uint64_t fnv(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static CUcontext setup(void)
{
    CUdevice dev;
    CUcontext ctx;
    CHECK(D.cuInit(0));
    CHECK(D.cuDeviceGet(&dev, 0));
    CHECK(D.cuCtxCreate(&ctx, NULL, 0, dev));
    return ctx;
}

/* Prints what a loaded module or library is: its cubin digest. */
static void say_image(const char *what, const void *h)
{
    const void *cubin;
    size_t len;
    if (D.image && D.image(h, &cubin, &len) == 0)
        SAY("%s image: %zu bytes fnv=%016llx", what, len, (unsigned long long)fnv(cubin, len));
}

/* Checks a function: its name and whether it launches in this context. */
static void say_func(const char *what, CUfunction f)
{
    const char *name = NULL;
    CUresult rc = D.cuFuncGetName(&name, f);
    CUresult lr = D.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    SAY("%s: name=%s (%s) launch=%s", what, rc ? "-" : name, ename(rc), ename(lr));
}

/* load FILE API [LOGSIZE] [KERNEL...]: loads an image through API (data,
 * ex, fatbin, library; file and libfile: cuModuleLoad and
 * cuLibraryLoadFromFile of FILE, which may be missing) and looks up
 * kernels. ex, library and libfile pass log buffers of LOGSIZE bytes and
 * print what the driver wrote. */
static int sc_load(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *api = argv[1];
    int from_file = !strcmp(api, "file") || !strcmp(api, "libfile");
    void *img = from_file ? NULL : read_file(argv[0], NULL);
    size_t logsize = argc > 2 ? strtoul(argv[2], NULL, 0) : 4096;
    setup();
    char *info = calloc(1, logsize + 1), *err = calloc(1, logsize + 1);
    memset(info, 'x', logsize);
    memset(err, 'x', logsize);
    CUjit_option opt[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                          CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                          CU_JIT_LOG_VERBOSE,      CU_JIT_OPTIMIZATION_LEVEL};
    void *val[] = {info,     (void *)(uintptr_t)logsize, err, (void *)(uintptr_t)logsize, (void *)1,
                   (void *)3};
    CUmodule mod = NULL;
    CUlibrary libh = NULL;
    CUresult rc;
    int lib_api = !strcmp(api, "library") || !strcmp(api, "libfile");
    if (!strcmp(api, "file"))
        rc = D.cuModuleLoad(&mod, argv[0]);
    else if (!strcmp(api, "libfile"))
        rc = D.cuLibraryLoadFromFile(&libh, argv[0], opt, val, 6, NULL, NULL, 0);
    else if (!strcmp(api, "data"))
        rc = D.cuModuleLoadData(&mod, img);
    else if (!strcmp(api, "ex"))
        rc = D.cuModuleLoadDataEx(&mod, img, 6, opt, val);
    else if (!strcmp(api, "fatbin"))
        rc = D.cuModuleLoadFatBinary(&mod, img);
    else if (lib_api)
        rc = D.cuLibraryLoadData(&libh, img, opt, val, 6, NULL, NULL, 0);
    else
        return 2;
    SAY("load %s: %s", api, ename(rc));
    if (!strcmp(api, "ex") || lib_api) {
        /* Log contents up to the NUL, and the sizes written back. */
        SAY("info log (%zu): [%.*s]", (size_t)(uintptr_t)val[1], (int)logsize, info);
        SAY("error log (%zu): [%.*s]", (size_t)(uintptr_t)val[3], (int)logsize, err);
    }
    if (rc)
        return 0;
    say_image("module", lib_api ? (void *)libh : (void *)mod);
    for (int i = 3; i < argc; i++) {
        CUfunction f = NULL, f2 = NULL;
        if (lib_api) {
            CUkernel k = NULL, k2 = NULL;
            rc = D.cuLibraryGetKernel(&k, libh, argv[i]);
            CUresult rc2 = D.cuLibraryGetKernel(&k2, libh, argv[i]);
            SAY("kernel %s: %s again=%s same=%d", argv[i], ename(rc), ename(rc2), k == k2);
            if (rc)
                continue;
            rc = D.cuKernelGetFunction(&f, k);
            rc2 = D.cuKernelGetFunction(&f2, k);
            SAY("kernel function %s: %s again=%s same=%d", argv[i], ename(rc), ename(rc2), f == f2);
        } else {
            rc = D.cuModuleGetFunction(&f, mod, argv[i]);
            CUresult rc2 = D.cuModuleGetFunction(&f2, mod, argv[i]);
            SAY("function %s: %s again=%s same=%d", argv[i], ename(rc), ename(rc2), f == f2);
        }
        if (!rc)
            say_func(argv[i], f);
    }
    if (lib_api)
        SAY("unload: %s", ename(D.cuLibraryUnload(libh)));
    else
        SAY("unload: %s", ename(D.cuModuleUnload(mod)));
    return 0;
}

/* memo PTX1 PTX2: the context memo's invalidation, observed through the
 * handles a program gets back. Run with KCACHE_TEST_STANDIN_REUSE=1 so the
 * stand-in reuses module and library handles as the real driver reuses
 * addresses: a memo that kept an entry past unload, destroy or reset would
 * hand back a dead function. */
static int sc_memo(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    void *p1 = read_file(argv[0], NULL), *p2 = read_file(argv[1], NULL);
    CUcontext a = setup();
    CUmodule m1, m2;
    CUfunction f;

    /* Unload: the same module handle comes back with other contents. */
    CHECK(D.cuModuleLoadData(&m1, p1));
    CHECK(D.cuModuleGetFunction(&f, m1, "scale"));
    say_func("unload/before", f);
    CHECK(D.cuModuleUnload(m1));
    SAY("unload/after-unload getfunction: %s", ename(D.cuModuleGetFunction(&f, m1, "scale")));
    CHECK(D.cuModuleLoadData(&m2, p2));
    SAY("unload/handle reused: %d", m1 == m2);
    SAY("unload/new module scale: %s", ename(D.cuModuleGetFunction(&f, m2, "scale")));
    CHECK(D.cuModuleGetFunction(&f, m2, "add1"));
    say_func("unload/new add1", f);
    CHECK(D.cuModuleUnload(m2));

    /* Context destroy: a new context in the same slot, a module in the same
     * slot. */
    CHECK(D.cuModuleLoadData(&m1, p1));
    CHECK(D.cuModuleGetFunction(&f, m1, "add1"));
    say_func("destroy/before", f);
    unsigned long long id1, id2;
    CHECK(D.cuCtxGetId(a, &id1));
    CHECK(D.cuCtxDestroy(a));
    CUcontext b;
    CHECK(D.cuCtxCreate(&b, NULL, 0, 0));
    CHECK(D.cuCtxGetId(b, &id2));
    SAY("destroy/context handle reused: %d, new id: %d", a == b, id1 != id2);
    CHECK(D.cuModuleLoadData(&m2, p1));
    SAY("destroy/module handle reused: %d", m1 == m2);
    CHECK(D.cuModuleGetFunction(&f, m2, "add1"));
    say_func("destroy/after", f);
    CHECK(D.cuModuleUnload(m2));
    CHECK(D.cuCtxDestroy(b));

    /* Primary context reset and last release. */
    CUcontext p;
    for (int round = 0; round < 2; round++) {
        const char *how = round ? "release" : "reset";
        CHECK(D.cuDevicePrimaryCtxRetain(&p, 0));
        CHECK(D.cuCtxSetCurrent(p));
        CHECK(D.cuModuleLoadData(&m1, p1));
        CHECK(D.cuModuleGetFunction(&f, m1, "add1"));
        say_func(how, f);
        if (round)
            CHECK(D.cuDevicePrimaryCtxRelease(0));
        else
            CHECK(D.cuDevicePrimaryCtxReset(0));
        CUcontext p2;
        CHECK(D.cuDevicePrimaryCtxRetain(&p2, 0));
        CHECK(D.cuCtxSetCurrent(p2));
        SAY("%s/primary handle same: %d", how, p == p2);
        SAY("%s/old module: %s", how, ename(D.cuModuleGetFunction(&f, m1, "add1")));
        CHECK(D.cuModuleLoadData(&m2, p1));
        CHECK(D.cuModuleGetFunction(&f, m2, "add1"));
        say_func(how, f);
        CHECK(D.cuModuleUnload(m2));
        CHECK(D.cuDevicePrimaryCtxReset(0));
    }

    /* Library API: kernel handles and the per-context functions. */
    CUcontext c1, c2;
    CUlibrary l1, l2;
    CUkernel k;
    CHECK(D.cuCtxCreate(&c1, NULL, 0, 0));
    CHECK(D.cuLibraryLoadData(&l1, p1, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(D.cuLibraryGetKernel(&k, l1, "add1"));
    CUfunction fa, fb;
    CHECK(D.cuKernelGetFunction(&fa, k));
    say_func("library/ctx1", fa);
    CHECK(D.cuCtxCreate(&c2, NULL, 0, 0));
    CHECK(D.cuKernelGetFunction(&fb, k));
    SAY("library/ctx2 function differs: %d", fa != fb);
    say_func("library/ctx2", fb);
    CHECK(D.cuCtxSetCurrent(c1));
    CHECK(D.cuKernelGetFunction(&f, k));
    SAY("library/ctx1 again same: %d", f == fa);
    CHECK(D.cuLibraryUnload(l1));
    SAY("library/after unload: %s", ename(D.cuKernelGetFunction(&f, k)));
    CHECK(D.cuLibraryLoadData(&l2, p2, NULL, NULL, 0, NULL, NULL, 0));
    SAY("library/handle reused: %d", l1 == l2);
    SAY("library/new scale: %s", ename(D.cuLibraryGetKernel(&k, l2, "scale")));
    CHECK(D.cuLibraryGetKernel(&k, l2, "other"));
    CHECK(D.cuKernelGetFunction(&f, k));
    say_func("library/new other", f);
    CHECK(D.cuLibraryUnload(l2));
    CHECK(D.cuCtxDestroy(c2));
    CHECK(D.cuCtxDestroy(c1));
    return 0;
}

static CUcontext owner(CUdeviceptr p)
{
    CUcontext c = NULL;
    CHECK(D.cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p));
    return c;
}

/* alloc: pooled blocks never cross contexts, contents round-trip, sizes
 * fit, and a destroyed context leaves nothing behind. */
static int sc_alloc(int argc, char **argv)
{
    CUcontext a = setup(), b;
    CUdeviceptr p, q, r;
    size_t free0, free1, total;
    CHECK(D.cuMemGetInfo(&free0, &total));
    CHECK(D.cuMemAlloc(&p, 1 << 20));
    CHECK(D.cuMemFree(p));
    CHECK(D.cuMemGetInfo(&free1, &total));
    SAY("free memory back after free: %d", free1 == free0);
    SAY("double free: %s", ename(D.cuMemFree(p)));
    CHECK(D.cuCtxCreate(&b, NULL, 0, 0));
    CHECK(D.cuMemAlloc(&q, 1 << 20));
    SAY("b's block belongs to b: %d", owner(q) == b);
    CHECK(D.cuCtxSetCurrent(a));
    CHECK(D.cuMemAlloc(&r, 1 << 20));
    SAY("a's block belongs to a: %d", owner(r) == a);
    size_t size = 0;
    CHECK(D.cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, r));
    SAY("a's block big enough: %d", size >= (1 << 20));
    char msg[64] = "kcache pool", back[64] = {0};
    CHECK(D.cuMemcpyHtoD(r, msg, sizeof msg));
    CHECK(D.cuMemcpyDtoH(back, r, sizeof back));
    SAY("round trip: %s", back);
    /* Free in a, destroy a with b current: nothing of a's may be left. */
    CHECK(D.cuMemFree(r));
    for (int i = 0; i < 8; i++) {
        CHECK(D.cuMemAlloc(&r, (size_t)(i % 3 + 1) *
                                   4096)); /* sizes repeat: the pool reuses exact sizes */
        CHECK(D.cuMemFree(r));
    }
    CHECK(D.cuCtxSetCurrent(b));
    CHECK(D.cuCtxDestroy(a));
    CHECK(D.cuMemFree(q));
    CHECK(D.cuCtxDestroy(b));
    /* A new context in a's slot starts with nothing. */
    CUcontext c;
    CHECK(D.cuCtxCreate(&c, NULL, 0, 0));
    CHECK(D.cuMemAlloc(&p, 1 << 20));
    SAY("new context's block belongs to it: %d", owner(p) == c);
    CHECK(D.cuMemFree(p));
    CHECK(D.cuCtxDestroy(c));
    return 0;
}

/* oom: run with KCACHE_TEST_STANDIN_MEM=1M. A freed 600 KiB block must not
 * make a 700 KiB allocation fail. */
static int sc_oom(int argc, char **argv)
{
    setup();
    CUdeviceptr p, q;
    CHECK(D.cuMemAlloc(&p, 600 << 10));
    CHECK(D.cuMemFree(p));
    SAY("alloc 700K after free: %s", ename(D.cuMemAlloc(&q, 700 << 10)));
    SAY("alloc 700K more: %s", ename(D.cuMemAlloc(&p, 700 << 10)));
    SAY("free: %s", ename(D.cuMemFree(q)));
    return 0;
}

/* fallback: run with KCACHE_TEST_STANDIN_MEM=1M. Prints what each
 * allocation got; with KCACHE_ALLOC_FALLBACK=managed the second and third
 * are managed, and a new context tries device memory again. */
static int sc_fallback(int argc, char **argv)
{
    setup();
    CUdeviceptr p[4];
    size_t sizes[] = {512 << 10, 2 << 20, 4096, 4096};
    for (int i = 0; i < 4; i++) {
        CUresult rc = D.cuMemAlloc(&p[i], sizes[i]);
        unsigned type = 0;
        if (!rc)
            D.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p[i]);
        SAY("alloc %zu: %s %s", sizes[i], ename(rc),
            rc                              ? "-"
            : type == CU_MEMORYTYPE_UNIFIED ? "managed"
                                            : "device");
    }
    CUcontext c;
    CHECK(D.cuCtxCreate(&c, NULL, 0, 0));
    unsigned type = 0;
    CHECK(D.cuMemAlloc(&p[0], 4096));
    D.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p[0]);
    SAY("new context alloc: %s", type == CU_MEMORYTYPE_UNIFIED ? "managed" : "device");
    return 0;
}

#define TRY(label, call) SAY("%s: %s", label, ename(call))

/* hostile PTX BADPTX CUBIN: bad input to every hooked entry point. */
static int sc_hostile(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    void *ptx = read_file(argv[0], NULL), *bad = read_file(argv[1], NULL);
    size_t cubin_len;
    unsigned char *cubin = read_file(argv[2], &cubin_len);
    CUmodule m = NULL;
    CUfunction f = NULL;
    CUlibrary l = NULL;
    CUkernel k = NULL;
    CUdeviceptr dp = 0;
    CUcontext ctx = NULL;
    void *garbage_handle = (void *)(uintptr_t)0x1234560;

    /* Before cuInit, and with no context. */
    TRY("load before init", D.cuModuleLoadData(&m, ptx));
    TRY("alloc before init", D.cuMemAlloc(&dp, 16));
    CHECK(D.cuInit(0));
    TRY("load without context", D.cuModuleLoadData(&m, ptx));
    TRY("alloc without context", D.cuMemAlloc(&dp, 16));
    TRY("getfunction without context", D.cuModuleGetFunction(&f, garbage_handle, "add1"));
    ctx = setup();

    /* Module loads. */
    TRY("load NULL out", D.cuModuleLoadData(NULL, ptx));
    TRY("load NULL image", D.cuModuleLoadData(&m, NULL));
    static const char junk[] = "\x01\x02garbage\xff\xfe not an image";
    TRY("load garbage", D.cuModuleLoadData(&m, junk));
    TRY("load text without .version", D.cuModuleLoadData(&m, "hello, world"));
    TRY("load bad ptx", D.cuModuleLoadData(&m, bad));
    char elog[512] = "untouched";
    CUjit_option eo[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *ev[] = {elog, (void *)(uintptr_t)sizeof elog};
    TRY("loadex bad ptx", D.cuModuleLoadDataEx(&m, bad, 2, eo, ev));
    SAY("loadex bad ptx error log nonempty: %d written=%zu",
        elog[0] != 0 && strcmp(elog, "untouched"), (size_t)(uintptr_t)ev[1]);
    TRY("loadex options NULL", D.cuModuleLoadDataEx(&m, ptx, 2, NULL, NULL));
    CUjit_option wrong[] = {(CUjit_option)999};
    void *wv[] = {0};
    TRY("loadex unknown option", D.cuModuleLoadDataEx(&m, ptx, 1, wrong, wv));
    CUjit_option tgt[] = {CU_JIT_TARGET};
    void *tv[] = {(void *)(uintptr_t)7};
    TRY("loadex bad target", D.cuModuleLoadDataEx(&m, ptx, 1, tgt, tv));
    unsigned char *trunc = malloc(cubin_len);
    memcpy(trunc, cubin, cubin_len);
    memset(trunc + 0x28, 0xff, 8); /* e_shoff far away */
    TRY("load truncated cubin", D.cuModuleLoadData(&m, trunc));
    memcpy(trunc, cubin, cubin_len);
    trunc[18] = 62; /* e_machine: x86-64 */
    TRY("load x86 elf", D.cuModuleLoadData(&m, trunc));
    static const uint32_t fat[] = {0xBA55ED50u, 0x00100001u, 0xffffffffu, 0x7fffffffu};
    TRY("load absurd fatbin", D.cuModuleLoadData(&m, fat));
    TRY("loadfatbin garbage", D.cuModuleLoadFatBinary(&m, junk));
    TRY("loadfatbin NULL", D.cuModuleLoadFatBinary(&m, NULL));
    TRY("library garbage", D.cuLibraryLoadData(&l, junk, NULL, NULL, 0, NULL, NULL, 0));
    TRY("library NULL out", D.cuLibraryLoadData(NULL, ptx, NULL, NULL, 0, NULL, NULL, 0));
    TRY("library bad ptx", D.cuLibraryLoadData(&l, bad, NULL, NULL, 0, NULL, NULL, 0));
    TRY("library options NULL", D.cuLibraryLoadData(&l, ptx, NULL, NULL, 3, NULL, NULL, 0));

    /* Lookups. */
    CHECK(D.cuModuleLoadData(&m, ptx));
    TRY("getfunction NULL out", D.cuModuleGetFunction(NULL, m, "add1"));
    TRY("getfunction NULL name", D.cuModuleGetFunction(&f, m, NULL));
    TRY("getfunction unknown name", D.cuModuleGetFunction(&f, m, "nope"));
    TRY("getfunction unknown name again", D.cuModuleGetFunction(&f, m, "nope"));
    TRY("getfunction garbage module", D.cuModuleGetFunction(&f, garbage_handle, "add1"));
    TRY("getfunction NULL module", D.cuModuleGetFunction(&f, NULL, "add1"));
    CHECK(D.cuModuleGetFunction(&f, m, "add1"));
    CHECK(D.cuModuleUnload(m));
    TRY("getfunction after unload", D.cuModuleGetFunction(&f, m, "add1"));
    TRY("unload twice", D.cuModuleUnload(m));
    TRY("unload garbage", D.cuModuleUnload(garbage_handle));
    TRY("unload NULL", D.cuModuleUnload(NULL));
    TRY("launch after unload", D.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));

    CHECK(D.cuLibraryLoadData(&l, ptx, NULL, NULL, 0, NULL, NULL, 0));
    TRY("getkernel NULL out", D.cuLibraryGetKernel(NULL, l, "add1"));
    TRY("getkernel NULL name", D.cuLibraryGetKernel(&k, l, NULL));
    TRY("getkernel unknown", D.cuLibraryGetKernel(&k, l, "nope"));
    TRY("getkernel garbage library", D.cuLibraryGetKernel(&k, garbage_handle, "add1"));
    TRY("kernelfunction garbage", D.cuKernelGetFunction(&f, garbage_handle));
    TRY("kernelfunction NULL out", D.cuKernelGetFunction(NULL, garbage_handle));
    CHECK(D.cuLibraryGetKernel(&k, l, "add1"));
    CHECK(D.cuCtxPopCurrent(&ctx));
    TRY("kernelfunction without context", D.cuKernelGetFunction(&f, k));
    CHECK(D.cuCtxPushCurrent(ctx));
    CHECK(D.cuLibraryUnload(l));
    TRY("getkernel after unload", D.cuLibraryGetKernel(&k, l, "add1"));
    TRY("kernelfunction after unload", D.cuKernelGetFunction(&f, k));
    TRY("library unload twice", D.cuLibraryUnload(l));
    TRY("library unload garbage", D.cuLibraryUnload(garbage_handle));

    /* Memory. */
    TRY("alloc 0", D.cuMemAlloc(&dp, 0));
    TRY("alloc NULL out", D.cuMemAlloc(NULL, 16));
    TRY("alloc huge", D.cuMemAlloc(&dp, (size_t)1 << 62));
    TRY("free 0", D.cuMemFree(0));
    TRY("free garbage", D.cuMemFree((CUdeviceptr)0xdeadbeef000ull));
    CHECK(D.cuMemAlloc(&dp, 4096));
    TRY("free interior", D.cuMemFree(dp + 16));
    CHECK(D.cuMemFree(dp));
    TRY("free twice", D.cuMemFree(dp));
    TRY("meminfo NULL", D.cuMemGetInfo(NULL, NULL));
    TRY("managed bad flags", D.cuMemAllocManaged(&dp, 16, 77));

    /* Contexts. */
    TRY("destroy garbage", D.cuCtxDestroy(garbage_handle));
    TRY("destroy NULL", D.cuCtxDestroy(NULL));
    CUcontext c2;
    CHECK(D.cuCtxCreate(&c2, NULL, 0, 0));
    CHECK(D.cuCtxDestroy(c2));
    TRY("destroy twice", D.cuCtxDestroy(c2));
    TRY("getid destroyed", D.cuCtxGetId(c2, &(unsigned long long){0}));
    TRY("primary release unretained", D.cuDevicePrimaryCtxRelease(0));
    TRY("primary release bad device", D.cuDevicePrimaryCtxRelease(42));
    TRY("primary reset bad device", D.cuDevicePrimaryCtxReset(-1));
    TRY("primary retain NULL", D.cuDevicePrimaryCtxRetain(NULL, 0));
    TRY("primary reset idle", D.cuDevicePrimaryCtxReset(0));

    /* The resolver. */
    void *pfn = (void *)1;
    CUdriverProcAddressQueryResult st = 77;
    TRY("proc NULL symbol", D.cuGetProcAddress(NULL, &pfn, 12000, 0, &st));
    TRY("proc NULL pfn", D.cuGetProcAddress("cuInit", NULL, 12000, 0, &st));
    TRY("proc version too new", D.cuGetProcAddress("cuInit", &pfn, 99000, 0, &st));
    TRY("proc bad flags", D.cuGetProcAddress("cuInit", &pfn, 12000, 1u << 7, &st));
    CUresult rc = D.cuGetProcAddress("cuNoSuchThing", &pfn, 12000, 0, &st);
    SAY("proc unknown: %s pfn=%p status=%d", ename(rc), pfn, (int)st);
    rc = D.cuGetProcAddress("cuLibraryLoadData", &pfn, 11000, 0, &st);
    SAY("proc too old: %s pfn=%p status=%d", ename(rc), pfn, (int)st);

    /* The linker. */
    CUlinkState ls;
    TRY("link create NULL out", D.cuLinkCreate(0, NULL, NULL, NULL));
    TRY("link add garbage state", D.cuLinkAddData(garbage_handle, CU_JIT_INPUT_PTX, ptx,
                                                  strlen(ptx) + 1, "x", 0, NULL, NULL));
    CHECK(D.cuLinkCreate(0, NULL, NULL, &ls));
    TRY("link add bad ptx",
        D.cuLinkAddData(ls, CU_JIT_INPUT_PTX, bad, strlen(bad) + 1, "x", 0, NULL, NULL));
    CHECK(D.cuLinkDestroy(ls));
    TRY("link destroy twice", D.cuLinkDestroy(ls));
    return 0;
}

/* procaddr: which variant cuGetProcAddress hands out for several versions
 * and flags, by the symbol name at the address (dladdr). With --show-lib,
 * also which library it lies in (for the shim's wrapping test). */
static int sc_procaddr(int argc, char **argv)
{
    int show_lib = argc > 0 && !strcmp(argv[0], "--show-lib");
    CUresult (*v1)(const char *, void **, int, cuuint64_t) =
        (CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(lib, "cuGetProcAddress");
    static const struct {
        const char *sym;
        int version;
        unsigned long long flags;
    } q[] = {
        {"cuMemAlloc", 2000, 0},
        {"cuMemAlloc", 3020, 0},
        {"cuMemAlloc", 12000, 1},
        {"cuMemFree", 3020, 0},
        {"cuMemGetInfo", 13000, 0},
        {"cuCtxDestroy", 3000, 0},
        {"cuCtxDestroy", 4000, 0},
        {"cuCtxCreate", 11040, 0},
        {"cuCtxCreate", 12050, 0},
        {"cuDevicePrimaryCtxRelease", 10000, 0},
        {"cuDevicePrimaryCtxRelease", 11000, 0},
        {"cuDevicePrimaryCtxReset", 11000, 0},
        {"cuModuleLoadData", 2000, 0},
        {"cuModuleLoadDataEx", 12000, 2},
        {"cuModuleLoadFatBinary", 12000, 0},
        {"cuModuleGetFunction", 12000, 0},
        {"cuModuleUnload", 12000, 0},
        {"cuLibraryLoadData", 12000, 0},
        {"cuLibraryGetKernel", 12000, 2},
        {"cuLibraryUnload", 12000, 0},
        {"cuKernelGetFunction", 12000, 0},
        {"cuMemcpyHtoD", 12000, 1},
        {"cuMemcpyHtoD", 12000, 2},
        {"cuMemcpyHtoD", 6000, 2},
        {"cuLaunchKernel", 12000, 0},
        {"cuLaunchKernel", 12000, 2},
        {"cuGetProcAddress", 11030, 0},
        {"cuGetProcAddress", 12000, 0},
        {"cuLinkCreate", 12000, 0},
        {"cuLinkAddData", 6000, 0},
    };
    CHECK(D.cuInit(0));
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        for (int api = 0; api < 2; api++) {
            void *p = NULL;
            CUdriverProcAddressQueryResult st = 9;
            CUresult rc =
                api ? (v1 ? v1(q[i].sym, &p, q[i].version, q[i].flags) : CUDA_ERROR_NOT_FOUND)
                    : D.cuGetProcAddress(q[i].sym, &p, q[i].version, q[i].flags, &st);
            Dl_info di;
            const char *name = "-", *where = "-";
            if (p && dladdr(p, &di)) {
                name = di.dli_sname ? di.dli_sname : "?";
                where = di.dli_fname && strstr(di.dli_fname, "libkcache") ? "kcache" : "driver";
            }
            if (show_lib)
                SAY("%s %s@%d/%llu: %s -> %s in %s", api ? "v1" : "v2", q[i].sym, q[i].version,
                    q[i].flags, ename(rc), name, where);
            else
                SAY("%s %s@%d/%llu: %s -> %s status=%d", api ? "v1" : "v2", q[i].sym, q[i].version,
                    q[i].flags, ename(rc), name, api ? -1 : (int)st);
        }
    }
    return 0;
}

/* ---- pool: every pointer query answers as without the allocation pool ---- */

/* Buffer ids seen so far, with the allocation (a serial number) each came
 * from: the driver documents them as never reused within a process. */
static struct {
    unsigned long long id;
    int serial;
} ids[256];
static int n_ids;

static const char *id_check(int serial, unsigned long long id)
{
    for (int i = 0; i < n_ids; i++)
        if (ids[i].id == id)
            return ids[i].serial == serial ? "same" : "REUSED";
    if (n_ids < 256)
        ids[n_ids++] = (__typeof__(ids[0])){id, serial};
    return "new";
}

/* What one attribute value is, without addresses: a context or address is
 * printed as what it equals, a buffer id as new or seen. */
static void say_attr(const char *what, int serial, CUpointer_attribute a, CUresult rc,
                     const void *buf, CUdeviceptr ptr, CUdeviceptr base, CUcontext ctx)
{
    char v[96] = "-";
    unsigned long long u;
    memcpy(&u, buf, sizeof u);
    unsigned lo;
    memcpy(&lo, buf, sizeof lo);
    if (rc == CUDA_SUCCESS) {
        switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            snprintf(v, sizeof v, "%s", u == 0 ? "NULL" : u == (uintptr_t)ctx ? "ctx" : "other");
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
            snprintf(v, sizeof v, "%s",
                     u == 0      ? "NULL"
                     : u == ptr  ? "ptr"
                     : u == base ? "base"
                                 : "other");
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            snprintf(v, sizeof v, "%s", u ? id_check(serial, u) : "0");
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
            snprintf(v, sizeof v, "%s", u ? "nonzero" : "0");
            break;
        case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
            snprintf(v, sizeof v, "tokens");
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
            snprintf(v, sizeof v, "%llu", u);
            break;
        default:
            snprintf(v, sizeof v, "%u", lo);
            break;
        }
    }
    SAY("%s attr %d: %s %s", what, (int)a, ename(rc), v);
}

/* Every query of one pointer: each attribute alone, the documented set at
 * once, and the address range. P2P tokens are asked for only of a freed
 * pointer: the query sets SYNC_MEMOPS on a live block, which then (rightly)
 * is not pooled; the end of sc_pool checks that. */
static void say_pointer(const char *what, int serial, CUdeviceptr ptr, CUdeviceptr base,
                        CUcontext ctx)
{
    int freed = !strncmp(what, "freed", 5) || !strncmp(what, "inside freed", 12);
    for (int a = 0; a <= 22; a++) {
        if (a == CU_POINTER_ATTRIBUTE_P2P_TOKENS && !freed)
            continue;
        unsigned char buf[64];
        memset(buf, 0, sizeof buf);
        CUresult rc = D.cuPointerGetAttribute(buf, (CUpointer_attribute)a, ptr);
        say_attr(what, serial, (CUpointer_attribute)a, rc, buf, ptr, base, ctx);
    }
    static const CUpointer_attribute multi[] = {CU_POINTER_ATTRIBUTE_CONTEXT,
                                                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                                CU_POINTER_ATTRIBUTE_HOST_POINTER,
                                                CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                                                CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                                CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                                CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                                CU_POINTER_ATTRIBUTE_MAPPED,
                                                CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                                CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                                CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
                                                CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE};
    enum { N = sizeof multi / sizeof multi[0] };
    unsigned char bufs[N][64];
    void *data[N];
    memset(bufs, 0xab, sizeof bufs);
    for (int i = 0; i < N; i++)
        data[i] = bufs[i];
    CUresult rc = D.cuPointerGetAttributes(N, (CUpointer_attribute *)multi, data, ptr);
    SAY("%s attributes: %s", what, ename(rc));
    char name[64];
    snprintf(name, sizeof name, "%s multi", what);
    for (int i = 0; rc == CUDA_SUCCESS && i < N; i++)
        say_attr(name, serial, multi[i], CUDA_SUCCESS, bufs[i], ptr, base, ctx);
    CUdeviceptr b = 0;
    size_t sz = 0;
    rc = D.cuMemGetAddressRange(&b, &sz, ptr);
    SAY("%s range: %s base=%s size=%zu", what, ename(rc),
        b == 0      ? "0"
        : b == base ? "base"
                    : "other",
        sz);
    rc = D.cuMemGetAddressRange(NULL, &sz, ptr);
    SAY("%s range size only: %s", what, ename(rc));
}

/* The memory the driver reports free, and through cuMemGetInfo's first
 * (32-bit) variant where the library has it; run with
 * KCACHE_TEST_STANDIN_MEM=1G so both can tell. */
static size_t say_free(const char *what)
{
    size_t f = 0, t = 0;
    CUresult rc = D.cuMemGetInfo(&f, &t);
    CUresult (*v1)(unsigned *, unsigned *) =
        lib ? (CUresult(*)(unsigned *, unsigned *))dlsym(lib, "cuMemGetInfo") : NULL;
    unsigned f1 = 0, t1 = 0;
    CUresult rc1 = v1 ? v1(&f1, &t1) : CUDA_ERROR_NOT_FOUND;
    SAY("%s: meminfo %s free=%zu total=%zu v1 %s free=%u", what, ename(rc), f, t, ename(rc1), f1);
    return f;
}

/* pool: the pool must be invisible. Each allocation is queried with every
 * pointer attribute, cuPointerGetAttributes and cuMemGetAddressRange, at
 * its base and inside it, live and after it is freed; sizes that a pooled
 * block could serve come back; SYNC_MEMOPS set on a freed block, or P2P
 * tokens taken from it, do not follow it; memory the host freed is free. */
static int sc_pool(int argc, char **argv)
{
    CUcontext ctx = setup();
    int serial = 0;
    char what[64];
    size_t f0 = say_free("start");
    CUdeviceptr p, q;
    CHECK(D.cuMemAlloc(&p, 2 << 20));
    CHECK(D.cuMemFree(p));
    SAY("free memory back after a free: %d", say_free("after free") == f0);
    static const size_t sizes[][2] = {
        {4 << 20, 7 << 19}, /* 4 MiB freed, then 3.5 MiB */
        {1 << 20, 1 << 20}, /* the same size again */
        {65536, 60000},
        {5000, 4097},
    };
    /* A freed pointer is asked about only before the next allocation: the
     * driver may hand the same address out again. */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t a = sizes[i][0], b = sizes[i][1];
        CUdeviceptr r;
        CHECK(D.cuMemAlloc(&p, a));
        int sp = ++serial;
        snprintf(what, sizeof what, "alloc %zu", a);
        say_pointer(what, sp, p, p, ctx);
        CHECK(D.cuMemFree(p));
        CHECK(D.cuMemAlloc(&q, b));
        int sq = ++serial;
        snprintf(what, sizeof what, "alloc %zu after %zu", b, a);
        say_pointer(what, sq, q, q, ctx);
        snprintf(what, sizeof what, "inside %zu", b);
        say_pointer(what, sq, q + b / 2, q, ctx);
        snprintf(what, sizeof what, "past %zu", b);
        say_pointer(what, sq, q + b, q, ctx);
        CHECK(D.cuMemFree(q));
        snprintf(what, sizeof what, "inside freed %zu", b);
        say_pointer(what, sq, q + b / 2, q, ctx);
        snprintf(what, sizeof what, "freed %zu", b);
        say_pointer(what, sq, q, q, ctx);
        SAY("set sync_memops freed: %s",
            ename(D.cuPointerSetAttribute(&(unsigned){1}, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q)));
        CHECK(D.cuMemAlloc(&r, a));
        snprintf(what, sizeof what, "alloc %zu again", a);
        say_pointer(what, ++serial, r, r, ctx);
        CHECK(D.cuMemFree(r));
    }
    SAY("all freed, free memory as at start: %d", say_free("end") == f0);

    /* Setting an attribute of a freed pointer fails. */
    CHECK(D.cuMemAlloc(&p, 1 << 20));
    CHECK(D.cuMemFree(p));
    SAY("set sync_memops of a freed block: %s",
        ename(D.cuPointerSetAttribute(&(unsigned){1}, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)));

    /* SYNC_MEMOPS is off in a new allocation, whatever the freed one had. */
    for (int how = 0; how < 2; how++) {
        CHECK(D.cuMemAlloc(&p, 1 << 20));
        if (how) {
            CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tok;
            SAY("p2p tokens: %s",
                ename(D.cuPointerGetAttribute(&tok, CU_POINTER_ATTRIBUTE_P2P_TOKENS, p)));
        } else {
            unsigned one = 1;
            SAY("set sync_memops: %s",
                ename(D.cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)));
        }
        int sync = -1;
        CHECK(D.cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
        SAY("sync_memops set: %d", sync);
        CHECK(D.cuMemFree(p));
        CHECK(D.cuMemAlloc(&q, 1 << 20));
        sync = -1;
        CHECK(D.cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q));
        SAY("new allocation's sync_memops: %d", sync);
        unsigned long long id = 0;
        CHECK(D.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
        SAY("new allocation's buffer id: %s", id_check(++serial, id));
        CHECK(D.cuMemFree(q));
    }

    /* An allocation that needs the pooled bytes gets them (1 GiB device). */
    size_t big = 600u << 20, bigger = 700u << 20;
    CHECK(D.cuMemAlloc(&p, big));
    CHECK(D.cuMemFree(p));
    CUresult rc = D.cuMemAlloc(&q, bigger);
    SAY("alloc 700M after freeing 600M: %s", ename(rc));
    if (rc == CUDA_SUCCESS)
        CHECK(D.cuMemFree(q));
    say_free("end");
    return 0;
}

/* ---- libnoctx: cuLibraryLoadData with no current context ----------------- */

static void say_ctx_state(const char *when)
{
    CUcontext cur = (CUcontext)1;
    CUresult rc = D.cuCtxGetCurrent(&cur);
    for (int dev = 0; dev < 2; dev++) {
        unsigned flags = 99;
        int active = -1;
        CUresult rs = D.cuDevicePrimaryCtxGetState(dev, &flags, &active);
        SAY("%s: current %s %s, primary %d %s flags=%u active=%d", when, ename(rc),
            cur ? "set" : "none", dev, ename(rs), flags, active);
    }
}

/* libnoctx PTX [primary|primary1]: loads PTX through the library API with
 * no context current (with "primary": device 0's primary context retained
 * but not current; "primary1": device 1's), and shows the context state
 * before and after: the library
 * API needs no context, and a load must not leave one behind, nor change
 * the primary's. Then uses the library in a context. */
static int sc_libnoctx(int argc, char **argv)
{
    if (argc < 1)
        return 2;
    void *img = read_file(argv[0], NULL);
    CHECK(D.cuInit(0));
    CUcontext prim = NULL;
    int prim_dev = argc > 1 && !strcmp(argv[1], "primary1") ? 1 : 0;
    if (argc > 1 && !strncmp(argv[1], "primary", 7))
        CHECK(D.cuDevicePrimaryCtxRetain(&prim, prim_dev));
    say_ctx_state("before");
    char info[4096], err[4096];
    memset(info, 'x', sizeof info);
    memset(err, 'x', sizeof err);
    /* The options sc_load passes: one cache entry serves both. */
    CUjit_option opt[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                          CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                          CU_JIT_LOG_VERBOSE,      CU_JIT_OPTIMIZATION_LEVEL};
    void *val[] = {info,      (void *)(uintptr_t)sizeof info,
                   err,       (void *)(uintptr_t)sizeof err,
                   (void *)1, (void *)3};
    CUlibrary l = NULL;
    CUresult rc = D.cuLibraryLoadData(&l, img, opt, val, 6, NULL, NULL, 0);
    SAY("library load: %s", ename(rc));
    SAY("info log (%zu): [%.*s]", (size_t)(uintptr_t)val[1], (int)sizeof info, info);
    SAY("error log (%zu): [%.*s]", (size_t)(uintptr_t)val[3], (int)sizeof err, err);
    say_ctx_state("after");
    if (rc)
        return 0;
    say_image("library", l);
    CUkernel k;
    SAY("kernel add1 without context: %s", ename(D.cuLibraryGetKernel(&k, l, "add1")));
    CUcontext c = setup();
    CUfunction f;
    CHECK(D.cuKernelGetFunction(&f, k));
    say_func("add1 in a context", f);
    CHECK(D.cuLibraryUnload(l));
    CHECK(D.cuCtxDestroy(c));
    if (prim)
        CHECK(D.cuDevicePrimaryCtxRelease(prim_dev));
    say_ctx_state("end");
    return 0;
}

/* ---- loadmany: several images in one process, for concurrent runs --------- */

/* loadmany API FILE...: loads each image (data or library) and prints its
 * digest. With KCACHE_TEST_GO=PATH, first writes PATH.<pid> and waits for
 * PATH to appear, so that concurrent processes start their loads
 * together. */
static int sc_loadmany(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int lib_api = !strcmp(argv[0], "library");
    setup();
    const char *go = getenv("KCACHE_TEST_GO");
    if (go && *go) {
        char ready[4096];
        snprintf(ready, sizeof ready, "%s.%d", go, (int)getpid());
        FILE *f = fopen(ready, "w");
        if (f)
            fclose(f);
        for (int i = 0; i < 60000; i++) {
            FILE *g = fopen(go, "r");
            if (g) {
                fclose(g);
                break;
            }
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 1; i < argc; i++) {
        void *img = read_file(argv[i], NULL);
        CUmodule m = NULL;
        CUlibrary l = NULL;
        CUresult rc = lib_api ? D.cuLibraryLoadData(&l, img, NULL, NULL, 0, NULL, NULL, 0)
                              : D.cuModuleLoadData(&m, img);
        SAY("load %d: %s", i, ename(rc));
        if (rc == CUDA_SUCCESS) {
            say_image("image", lib_api ? (void *)l : (void *)m);
            if (lib_api)
                CHECK(D.cuLibraryUnload(l));
            else
                CHECK(D.cuModuleUnload(m));
        }
        free(img);
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *route =
#ifdef DRV_LINKED
        "link";
#else
        "dlsym";
#endif
    int i = 1;
    if (i < argc && !strncmp(argv[i], "--route=", 8))
        route = argv[i++] + 8;
    if (i >= argc) {
        fprintf(stderr, "usage: %s [--route=R] SCENARIO ARGS...\n", argv[0]);
        return 2;
    }
    if (resolve(route))
        return 2;
    const char *sc = argv[i++];
    int n = argc - i;
    char **a = argv + i;
    if (!strcmp(sc, "load"))
        return sc_load(n, a);
    if (!strcmp(sc, "memo"))
        return sc_memo(n, a);
    if (!strcmp(sc, "alloc"))
        return sc_alloc(n, a);
    if (!strcmp(sc, "oom"))
        return sc_oom(n, a);
    if (!strcmp(sc, "fallback"))
        return sc_fallback(n, a);
    if (!strcmp(sc, "hostile"))
        return sc_hostile(n, a);
    if (!strcmp(sc, "procaddr"))
        return sc_procaddr(n, a);
    if (!strcmp(sc, "pool"))
        return sc_pool(n, a);
    if (!strcmp(sc, "libnoctx"))
        return sc_libnoctx(n, a);
    if (!strcmp(sc, "loadmany"))
        return sc_loadmany(n, a);
    fprintf(stderr, "unknown scenario %s\n", sc);
    return 2;
}
