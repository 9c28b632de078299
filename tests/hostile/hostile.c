/*
 * hostile: a table of hostile calls to every function the shim intercepts,
 * each run in its own child process, printing the return code and the
 * out-parameters. tests/hostile/test_hostile.py runs the table without the
 * shim and with it (cold and warm store) and requires identical dumps.
 *
 *   hostile [--list] [--crashers] [--only HOOK] [--label LABEL] [--no-fork] PTX_FILE
 *
 * --list prints "hook label [crash: reason]" for every case. A case marked
 * with a crash reason crashes the real library (or the stand-in driver) by
 * itself; it is not run unless --crashers is given, and then only to check
 * that the reason still holds (the test runs those without the shim).
 *
 * NVRTC comes from libnvrtc.so.13 (or the library KC_HOSTILE_NVRTC names: the
 * getters of other releases), nvJitLink from libnvJitLink.so.13 (both
 * names of each function: the unversioned one and the one nvJitLink.h's
 * inline functions call) and the driver from libcuda.so.1 (the stand-in,
 * first on LD_LIBRARY_PATH), all dlopen()ed with every entry
 * point found by dlsym, as PyTorch and CuPy do, so the shim's dlsym hands
 * out its wrappers. Nothing printed depends on addresses or timing.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <nvJitLink.h>
#include <nvrtc.h>
#include <nvvm.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void *nv, *cu, *jl;
static const char *ptx_path;
static char *ptx; /* the PTX file's text, NUL-terminated */
static size_t ptx_len;

#define SAY(...) (printf(__VA_ARGS__), putchar('\n'), fflush(stdout))

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        SAY("missing symbol %s", name);
        _exit(3);
    }
    return p;
}
#define NV(name) ((__typeof__(&name))sym(nv, #name))
#define CU(name) ((__typeof__(&name))sym(cu, #name))

/* A handle value that never was one. */
#define GARBAGE ((void *)(uintptr_t)0x1234560)
#define SENTINEL ((void *)(uintptr_t)0x5a5a5a5a5a5aull)

static const char *hstate(const void *h)
{
    return h == NULL ? "NULL" : h == SENTINEL ? "unchanged" : "set";
}

/* ---- bytes at the edge of the address space: a page followed by a
 * PROT_NONE page, so reading one byte past an image faults. ---- */
static void *edge(const void *bytes, size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t span = ((n + (size_t)pg - 1) / (size_t)pg + 1) * (size_t)pg;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        _exit(4);
    mprotect(m + span - (size_t)pg, (size_t)pg, PROT_NONE);
    char *p = m + span - (size_t)pg - n;
    memcpy(p, bytes, n);
    return p;
}

/* ---- NVRTC ---------------------------------------------------------------------------- */

static const char *src = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n"
                         "template <typename T> __global__ void t(T *x) { x[0] = T(1); }\n";

static nvrtcProgram compiled(nvrtcResult *crc)
{
    nvrtcProgram p = NULL;
    if (NV(nvrtcCreateProgram)(&p, src, "hostile.cu", 0, NULL, NULL) != NVRTC_SUCCESS)
        _exit(5);
    NV(nvrtcAddNameExpression)(p, "t<int>");
    static const char *opts[] = {"-arch=compute_90", "-default-device"};
    *crc = NV(nvrtcCompileProgram)(p, 2, opts);
    return p;
}

static nvrtcProgram created(void)
{
    nvrtcProgram p = NULL;
    if (NV(nvrtcCreateProgram)(&p, src, "hostile.cu", 0, NULL, NULL) != NVRTC_SUCCESS)
        _exit(5);
    return p;
}

static nvrtcProgram failed_compile(void)
{
    nvrtcProgram p = NULL;
    if (NV(nvrtcCreateProgram)(&p, "__global__ void k() { undeclared(); }", "bad.cu", 0, NULL,
                               NULL))
        _exit(5);
    static const char *opts[] = {"-arch=compute_90"};
    SAY("  compile(bad) rc=%d", NV(nvrtcCompileProgram)(p, 1, opts));
    return p;
}

typedef nvrtcResult (*size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*get_fn)(nvrtcProgram, char *);

/* One getter pair on a program: NULL out, the size, the bytes' digest. */
static void getter(nvrtcProgram p, const char *sname, const char *gname, int which)
{
    size_fn sz = (size_fn)sym(nv, sname);
    get_fn g = (get_fn)sym(nv, gname);
    if (which == 0) {
        SAY("  %s(NULL) rc=%d", sname, sz(p, NULL));
        return;
    }
    if (which == 1) {
        SAY("  %s(prog, NULL) rc=%d", gname, g(p, NULL));
        return;
    }
    size_t n = 777;
    nvrtcResult rc = sz(p, &n);
    SAY("  %s rc=%d size=%zu", sname, rc, n);
    /* A buffer of exactly the announced size at the edge: the getter must
     * not write past it. */
    size_t cap = rc == NVRTC_SUCCESS && n < (1u << 26) ? n : 0;
    long pg = sysconf(_SC_PAGESIZE);
    size_t pages = cap ? (cap + (size_t)pg - 1) / (size_t)pg : 1;
    size_t span = (pages + 1) * (size_t)pg;
    char *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(m + span - (size_t)pg, (size_t)pg, PROT_NONE);
    memset(m, 0x5a, span - (size_t)pg);
    /* No usable size: a 4 KiB buffer, and what the getter wrote into it. */
    char *buf = cap ? m + span - (size_t)pg - cap : m;
    size_t seen = cap ? cap : 64;
    rc = g(p, buf);
    unsigned long h = 5381;
    for (size_t i = 0; i < seen; i++)
        h = h * 33 + (unsigned char)buf[i];
    SAY("  %s rc=%d bytes-hash=%lu first=%d", gname, rc, h, buf[0]);
}

/* One entry a line (clang-format would run them together). */
// clang-format off
#define GETTERS(X)                                                                                 \
    X(nvrtcGetPTXSize, nvrtcGetPTX)                                                                \
    X(nvrtcGetCUBINSize, nvrtcGetCUBIN)                                                            \
    X(nvrtcGetLTOIRSize, nvrtcGetLTOIR)                                                            \
    X(nvrtcGetOptiXIRSize, nvrtcGetOptiXIR)                                                        \
    X(nvrtcGetProgramLogSize, nvrtcGetProgramLog)
// clang-format on

/* ---- the driver ----------------------------------------------------------------------- */

static CUcontext ctx_setup(void)
{
    CUdevice d;
    CUcontext c = NULL;
    if (CU(cuInit)(0) || CU(cuDeviceGet)(&d, 0) || CU(cuDevicePrimaryCtxRetain)(&c, d) ||
        CU(cuCtxSetCurrent)(c))
        _exit(6);
    return c;
}

static CUmodule ptx_module(void)
{
    CUmodule m = NULL;
    if (CU(cuModuleLoadData)(&m, ptx) != CUDA_SUCCESS)
        _exit(7);
    return m;
}

/* ---- the cases -------------------------------------------------------------------------- */

struct hcase {
    const char *hook; /* the intercepted function it calls */
    const char *label;
    void (*run)(void);
    const char *crash; /* why it is not run: it crashes the real library */
};

#define CASE(hook, label) static void hook##__##label(void)

/* nvrtcCreateProgram */
CASE(nvrtcCreateProgram, null_prog)
{
    SAY("rc=%d", NV(nvrtcCreateProgram)(NULL, src, "x.cu", 0, NULL, NULL));
}
CASE(nvrtcCreateProgram, null_src)
{
    nvrtcProgram p = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcCreateProgram)(&p, NULL, "x.cu", 0, NULL, NULL), hstate(p));
}
CASE(nvrtcCreateProgram, null_name)
{
    nvrtcProgram p = SENTINEL;
    nvrtcResult rc = NV(nvrtcCreateProgram)(&p, src, NULL, 0, NULL, NULL);
    SAY("rc=%d out=%s", rc, hstate(p));
    if (rc == NVRTC_SUCCESS) {
        static const char *o[] = {"-arch=compute_90"};
        SAY("compile rc=%d", NV(nvrtcCompileProgram)(p, 1, o));
        getter(p, "nvrtcGetPTXSize", "nvrtcGetPTX", 2);
    }
}
CASE(nvrtcCreateProgram, negative_headers)
{
    nvrtcProgram p = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcCreateProgram)(&p, src, "x.cu", INT_MIN, NULL, NULL), hstate(p));
}
CASE(nvrtcCreateProgram, huge_headers_null_arrays)
{
    nvrtcProgram p = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcCreateProgram)(&p, src, "x.cu", INT_MAX, NULL, NULL), hstate(p));
}
CASE(nvrtcCreateProgram, header_null_entries)
{
    const char *hs[] = {NULL}, *ns[] = {NULL};
    nvrtcProgram p = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcCreateProgram)(&p, src, "x.cu", 1, hs, ns), hstate(p));
}
CASE(nvrtcCreateProgram, header_null_name)
{
    const char *hs[] = {"#define X 1\n"}, *ns[] = {NULL};
    nvrtcProgram p = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcCreateProgram)(&p, src, "x.cu", 1, hs, ns), hstate(p));
}
/* nvrtcDestroyProgram */
CASE(nvrtcDestroyProgram, null)
{
    SAY("rc=%d", NV(nvrtcDestroyProgram)(NULL));
}
CASE(nvrtcDestroyProgram, null_handle)
{
    nvrtcProgram p = NULL;
    SAY("rc=%d", NV(nvrtcDestroyProgram)(&p));
}
CASE(nvrtcDestroyProgram, twice)
{
    nvrtcProgram p = created(), q = p;
    SAY("rc=%d after=%s", NV(nvrtcDestroyProgram)(&p), hstate(p));
    (void)q;
    SAY("rc=%d", NV(nvrtcDestroyProgram)(&p));
}
CASE(nvrtcDestroyProgram, garbage)
{
    nvrtcProgram p = GARBAGE;
    SAY("rc=%d", NV(nvrtcDestroyProgram)(&p));
}
/* nvrtcCompileProgram */
CASE(nvrtcCompileProgram, null_prog)
{
    SAY("rc=%d", NV(nvrtcCompileProgram)(NULL, 0, NULL));
}
CASE(nvrtcCompileProgram, huge_options_null_array)
{
    nvrtcProgram p = created();
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, INT_MAX, NULL));
}
CASE(nvrtcCompileProgram, negative_options)
{
    nvrtcProgram p = created();
    static const char *o[] = {"-arch=compute_90"};
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, -1, o));
}
CASE(nvrtcCompileProgram, null_option_entry)
{
    nvrtcProgram p = created();
    const char *o[] = {"-arch=compute_90", NULL};
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, 2, o));
}
CASE(nvrtcCompileProgram, bad_option)
{
    nvrtcProgram p = created();
    static const char *o[] = {"--no-such-option"};
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, 1, o));
    getter(p, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", 2);
}
CASE(nvrtcCompileProgram, oversized_option)
{
    nvrtcProgram p = created();
    size_t n = 1u << 20;
    char *big = malloc(n + 1);
    memcpy(big, "-D", 2);
    memset(big + 2, 'A', n - 2);
    big[n] = 0;
    const char *o[] = {"-arch=compute_90", big};
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, 2, o));
    getter(p, "nvrtcGetPTXSize", "nvrtcGetPTX", 2);
}
CASE(nvrtcCompileProgram, twice)
{
    nvrtcResult rc;
    nvrtcProgram p = compiled(&rc);
    static const char *o[] = {"-arch=compute_90"};
    SAY("first rc=%d again rc=%d", rc, NV(nvrtcCompileProgram)(p, 1, o));
    getter(p, "nvrtcGetPTXSize", "nvrtcGetPTX", 2);
}
CASE(nvrtcCompileProgram, destroyed)
{
    nvrtcProgram p = created(), q = p;
    NV(nvrtcDestroyProgram)(&q);
    SAY("rc=%d", NV(nvrtcCompileProgram)(p, 0, NULL));
}
/* nvrtcAddNameExpression */
CASE(nvrtcAddNameExpression, null_prog)
{
    SAY("rc=%d", NV(nvrtcAddNameExpression)(NULL, "t<int>"));
}
CASE(nvrtcAddNameExpression, null_expr)
{
    SAY("rc=%d", NV(nvrtcAddNameExpression)(created(), NULL));
}
CASE(nvrtcAddNameExpression, after_compile)
{
    nvrtcResult rc;
    nvrtcProgram p = compiled(&rc);
    SAY("rc=%d", NV(nvrtcAddNameExpression)(p, "t<float>"));
}
CASE(nvrtcAddNameExpression, empty_and_bad)
{
    nvrtcProgram p = created();
    SAY("empty rc=%d", NV(nvrtcAddNameExpression)(p, ""));
    SAY("bad rc=%d", NV(nvrtcAddNameExpression)(p, "&&&not c++"));
    static const char *o[] = {"-arch=compute_90"};
    SAY("compile rc=%d", NV(nvrtcCompileProgram)(p, 1, o));
    getter(p, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", 2);
}
/* nvrtcGetLoweredName */
CASE(nvrtcGetLoweredName, null_prog)
{
    const char *s = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcGetLoweredName)(NULL, "t<int>", &s), hstate(s));
}
CASE(nvrtcGetLoweredName, before_compile)
{
    const char *s = SENTINEL;
    nvrtcProgram p = created();
    NV(nvrtcAddNameExpression)(p, "t<int>");
    SAY("rc=%d out=%s", NV(nvrtcGetLoweredName)(p, "t<int>", &s), hstate(s));
}
CASE(nvrtcGetLoweredName, after_compile)
{
    nvrtcResult rc;
    nvrtcProgram p = compiled(&rc);
    const char *s = SENTINEL;
    SAY("known rc=%d name=%s", NV(nvrtcGetLoweredName)(p, "t<int>", &s),
        s == SENTINEL ? "unchanged"
        : s           ? s
                      : "NULL");
    s = SENTINEL;
    SAY("unknown rc=%d out=%s", NV(nvrtcGetLoweredName)(p, "t<double>", &s), hstate(s));
    SAY("null expr rc=%d", NV(nvrtcGetLoweredName)(p, NULL, &s));
    SAY("null out rc=%d", NV(nvrtcGetLoweredName)(p, "t<int>", NULL));
}
CASE(nvrtcGetLoweredName, failed_compile)
{
    nvrtcProgram p = failed_compile();
    const char *s = SENTINEL;
    SAY("rc=%d out=%s", NV(nvrtcGetLoweredName)(p, "k", &s), hstate(s));
}
/* The ten getters: NULL program, NULL out, before compile, after a failed
 * compile, after a good one. */
#define GETTER_CASES(S, G)                                                                         \
    CASE(S, null_prog)                                                                             \
    {                                                                                              \
        size_t n = 777;                                                                            \
        SAY("rc=%d size=%zu", NV(S)(NULL, &n), n);                                                 \
    }                                                                                              \
    CASE(S, states)                                                                                \
    {                                                                                              \
        nvrtcProgram p = created();                                                                \
        SAY("before compile:");                                                                    \
        getter(p, #S, #G, 0);                                                                      \
        getter(p, #S, #G, 2);                                                                      \
        p = failed_compile();                                                                      \
        getter(p, #S, #G, 0);                                                                      \
        getter(p, #S, #G, 2);                                                                      \
        nvrtcResult rc;                                                                            \
        p = compiled(&rc);                                                                         \
        SAY("compiled rc=%d", rc);                                                                 \
        getter(p, #S, #G, 0);                                                                      \
        getter(p, #S, #G, 2);                                                                      \
    }                                                                                              \
    CASE(G, null_prog)                                                                             \
    {                                                                                              \
        SAY("rc=%d", NV(G)(NULL, (char[8]){0}));                                                   \
    }                                                                                              \
    CASE(G, null_out)                                                                              \
    {                                                                                              \
        nvrtcResult rc;                                                                            \
        nvrtcProgram p = compiled(&rc);                                                            \
        getter(p, #S, #G, 1);                                                                      \
        p = failed_compile();                                                                      \
        getter(p, #S, #G, 1);                                                                      \
    }
GETTERS(GETTER_CASES)
/* Getters only some releases have: NVRTC 12.x's nvrtcGetNVVM[Size] (a -dlto
 * compile's output under its old name) and 13.3+'s nvrtcGetTileIR[Size].
 * Absent from the library in hand (the toolkit's 13.0), dlsym must find
 * nothing, through the shim too; present (KC_HOSTILE_NVRTC names a 12.x or
 * 13.5 library), the pair's every state, as for the other getters, on a
 * program compiled with and without the option that makes the output. */
static nvrtcProgram compiled_with(const char *arch, const char *opt, const char *code)
{
    nvrtcProgram p = NULL;
    if (NV(nvrtcCreateProgram)(&p, code, "hostile.cu", 0, NULL, NULL) != NVRTC_SUCCESS)
        _exit(5);
    const char *opts[] = {arch, opt};
    SAY("  compile(%s %s) rc=%d", arch, opt ? opt : "-",
        NV(nvrtcCompileProgram)(p, opt ? 2 : 1, opts));
    return p;
}

static void release_getter(const char *sname, const char *gname, const char *arch, const char *opt,
                           const char *code)
{
    void *s = dlsym(nv, sname), *g = dlsym(nv, gname);
    if (s == NULL || g == NULL) {
        SAY("dlsym: %s %s", s ? "found" : "NULL", g ? "found" : "NULL");
        SAY("RTLD_DEFAULT: %s %s", dlsym(RTLD_DEFAULT, sname) ? "found" : "NULL",
            dlsym(RTLD_DEFAULT, gname) ? "found" : "NULL");
        return;
    }
    SAY("  %s(NULL prog) rc=%d", sname, ((size_fn)s)(NULL, &(size_t){0}));
    SAY("  %s(NULL prog) rc=%d", gname, ((get_fn)g)(NULL, (char[8]){0}));
    nvrtcProgram p = created();
    getter(p, sname, gname, 0);
    getter(p, sname, gname, 2);
    p = compiled_with(arch, NULL, code);
    getter(p, sname, gname, 2);
    p = compiled_with(arch, opt, code);
    getter(p, sname, gname, 0);
    getter(p, sname, gname, 1);
    getter(p, sname, gname, 2);
    p = failed_compile();
    getter(p, sname, gname, 2);
}
static const char *tile_src = "__tile_global__ void t(float *x) { }\n";
CASE(nvrtcGetNVVMSize, release)
{
    release_getter("nvrtcGetNVVMSize", "nvrtcGetNVVM", "-arch=compute_80", "-dlto", src);
}
CASE(nvrtcGetNVVM, release)
{
    release_getter("nvrtcGetNVVMSize", "nvrtcGetNVVM", "-arch=sm_80", "-dlto", src);
}
CASE(nvrtcGetTileIRSize, release)
{
    release_getter("nvrtcGetTileIRSize", "nvrtcGetTileIR", "-arch=sm_100", "--enable-tile",
                   tile_src);
}
CASE(nvrtcGetTileIR, release)
{
    release_getter("nvrtcGetTileIRSize", "nvrtcGetTileIR", "-arch=sm_100", "--enable-tile", src);
}
/* PCH and the flow callback. */
CASE(nvrtcGetPCHCreateStatus, null_prog)
{
    SAY("rc=%d", NV(nvrtcGetPCHCreateStatus)(NULL));
}
CASE(nvrtcGetPCHCreateStatus, states)
{
    SAY("created rc=%d", NV(nvrtcGetPCHCreateStatus)(created()));
    nvrtcResult rc;
    SAY("compiled rc=%d", NV(nvrtcGetPCHCreateStatus)(compiled(&rc)));
}
CASE(nvrtcGetPCHHeapSizeRequired, null_prog)
{
    size_t n = 777;
    SAY("rc=%d size=%zu", NV(nvrtcGetPCHHeapSizeRequired)(NULL, &n), n);
}
CASE(nvrtcGetPCHHeapSizeRequired, states)
{
    size_t n = 777;
    nvrtcProgram p = created();
    SAY("created rc=%d size=%zu", NV(nvrtcGetPCHHeapSizeRequired)(p, &n), n);
    SAY("null out rc=%d", NV(nvrtcGetPCHHeapSizeRequired)(p, NULL));
    nvrtcResult rc;
    p = compiled(&rc);
    n = 777;
    SAY("compiled rc=%d size=%zu", NV(nvrtcGetPCHHeapSizeRequired)(p, &n), n);
    SAY("compiled null out rc=%d", NV(nvrtcGetPCHHeapSizeRequired)(p, NULL));
}
static int flow_cb(void *payload, void *param)
{
    return 0;
}
CASE(nvrtcSetFlowCallback, null_prog)
{
    SAY("rc=%d", NV(nvrtcSetFlowCallback)(NULL, flow_cb, NULL));
}
CASE(nvrtcSetFlowCallback, null_callback)
{
    nvrtcProgram p = created();
    SAY("rc=%d", NV(nvrtcSetFlowCallback)(p, NULL, NULL));
    static const char *o[] = {"-arch=compute_90"};
    SAY("compile rc=%d", NV(nvrtcCompileProgram)(p, 1, o));
    getter(p, "nvrtcGetPTXSize", "nvrtcGetPTX", 2);
}
CASE(nvrtcVersion, null_args)
{
    int a = -7, b = -7;
    SAY("both NULL rc=%d", NV(nvrtcVersion)(NULL, NULL));
    SAY("minor NULL rc=%d major=%d", NV(nvrtcVersion)(&a, NULL), a);
    SAY("ok rc=%d", NV(nvrtcVersion)(&a, &b));
}

/* ---- driver: module loads ---- */
static const uint32_t fat_huge[] = {0xBA55ED50u, 0x00100001u, 0x3fffffffu, 0x00000000u};

static void load4(const char *what, const void *img)
{
    CUmodule m = SENTINEL;
    CUlibrary l = SENTINEL;
    SAY("%s: data rc=%d out=%s", what, CU(cuModuleLoadData)(&m, img), hstate(m));
    m = SENTINEL;
    SAY("%s: dataex rc=%d out=%s", what, CU(cuModuleLoadDataEx)(&m, img, 0, NULL, NULL), hstate(m));
    m = SENTINEL;
    SAY("%s: fatbinary rc=%d out=%s", what, CU(cuModuleLoadFatBinary)(&m, img), hstate(m));
    SAY("%s: library rc=%d out=%s", what,
        CU(cuLibraryLoadData)(&l, img, NULL, NULL, 0, NULL, NULL, 0), hstate(l));
}

CASE(cuModuleLoadData, images)
{
    ctx_setup();
    /* PTX whose NUL is the last mapped byte. */
    load4("ptx ending at a page edge", edge(ptx, ptx_len + 1));
    /* Text without ".version", NUL at the edge. */
    load4("text at a page edge", edge("hello", 6));
    /* A short ELF magic, nothing after it but its NUL. */
    load4("elf magic only", edge("\177ELF", 5));
    /* PTX at an odd address. */
    char *odd = malloc(ptx_len + 2);
    memcpy(odd + 1, ptx, ptx_len + 1);
    load4("ptx at an odd address", odd + 1);
    /* A fatbinary header alone, fat_size 0, at the edge. */
    static const uint32_t fat0[] = {0xBA55ED50u, 0x00100001u, 0, 0};
    load4("empty fatbinary at a page edge", edge(fat0, sizeof fat0));
    /* A fatbinary header with a header_size below its own size. */
    static const uint32_t fatsmall[] = {0xBA55ED50u, 0x00040001u, 16, 0};
    load4("fatbinary header_size 4", fatsmall);
}
CASE(cuModuleLoadData, unterminated_ptx)
{
    ctx_setup();
    load4("ptx without NUL at a page edge", edge(ptx, ptx_len));
}
CASE(cuModuleLoadData, fatbin_claiming_huge_size)
{
    ctx_setup();
    load4("fatbinary claiming 1 GiB at a page edge", edge(fat_huge, sizeof fat_huge));
}
CASE(cuModuleLoadData, fatbin_wrapper_null_data)
{
    ctx_setup();
    static const uint64_t wrapper[] = {0x00000001466243b1ull, 0, 0};
    load4("fatbinary wrapper with NULL data", wrapper);
}
CASE(cuModuleLoadData, no_context)
{
    CU(cuInit)(0);
    load4("ptx without a context", ptx);
    load4("null image without a context", NULL);
}
CASE(cuModuleLoadData, null_out)
{
    ctx_setup();
    SAY("rc=%d", CU(cuModuleLoadData)(NULL, ptx));
}
CASE(cuModuleLoadDataEx, options)
{
    ctx_setup();
    CUmodule m = SENTINEL;
    SAY("huge count, NULL arrays rc=%d out=%s",
        CU(cuModuleLoadDataEx)(&m, ptx, UINT_MAX, NULL, NULL), hstate(m));
    CUjit_option o[65];
    void *v[65];
    for (int i = 0; i < 65; i++) {
        o[i] = CU_JIT_OPTIMIZATION_LEVEL;
        v[i] = (void *)(uintptr_t)3;
    }
    m = SENTINEL;
    SAY("65 options rc=%d out=%s", CU(cuModuleLoadDataEx)(&m, ptx, 65, o, v), hstate(m));
    m = SENTINEL;
    SAY("values NULL rc=%d out=%s", CU(cuModuleLoadDataEx)(&m, ptx, 1, o, NULL), hstate(m));
    /* Log buffers: NULL with a size, a size with no buffer, huge size. */
    CUjit_option lo[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
    void *lv[] = {NULL, (void *)(uintptr_t)4096};
    m = SENTINEL;
    SAY("NULL info buffer rc=%d out=%s written=%zu", CU(cuModuleLoadDataEx)(&m, ptx, 2, lo, lv),
        hstate(m), (size_t)(uintptr_t)lv[1]);
    char small[4] = "abc";
    void *lv2[] = {small, (void *)(uintptr_t)0};
    m = SENTINEL;
    SAY("zero-size info buffer rc=%d out=%s buf=%s written=%zu",
        CU(cuModuleLoadDataEx)(&m, ptx, 2, lo, lv2), hstate(m), small, (size_t)(uintptr_t)lv2[1]);
    char *eb = edge("", 1);
    void *lv3[] = {eb, (void *)(uintptr_t)1};
    m = SENTINEL;
    SAY("one-byte info buffer at a page edge rc=%d out=%s buf0=%d written=%zu",
        CU(cuModuleLoadDataEx)(&m, ptx, 2, lo, lv3), hstate(m), eb[0], (size_t)(uintptr_t)lv3[1]);
    CUjit_option neg[] = {(CUjit_option)-1};
    void *nv_[] = {NULL};
    m = SENTINEL;
    SAY("negative option rc=%d out=%s", CU(cuModuleLoadDataEx)(&m, ptx, 1, neg, nv_), hstate(m));
}
CASE(cuModuleLoadFatBinary, ptx_and_null)
{
    ctx_setup();
    CUmodule m = SENTINEL;
    SAY("ptx rc=%d out=%s", CU(cuModuleLoadFatBinary)(&m, ptx), hstate(m));
    SAY("null out rc=%d", CU(cuModuleLoadFatBinary)(NULL, ptx));
}
CASE(cuLibraryLoadData, options)
{
    ctx_setup();
    CUlibrary l = SENTINEL;
    SAY("huge jit count, NULL arrays rc=%d out=%s",
        CU(cuLibraryLoadData)(&l, ptx, NULL, NULL, UINT_MAX, NULL, NULL, 0), hstate(l));
    l = SENTINEL;
    SAY("huge library count, NULL arrays rc=%d out=%s",
        CU(cuLibraryLoadData)(&l, ptx, NULL, NULL, 0, NULL, NULL, UINT_MAX), hstate(l));
    CUlibraryOption lo[] = {(CUlibraryOption)12345};
    void *lv[] = {NULL};
    l = SENTINEL;
    SAY("unknown library option rc=%d out=%s",
        CU(cuLibraryLoadData)(&l, ptx, NULL, NULL, 0, lo, lv, 1), hstate(l));
    l = SENTINEL;
    SAY("null image rc=%d out=%s", CU(cuLibraryLoadData)(&l, NULL, NULL, NULL, 0, NULL, NULL, 0),
        hstate(l));
}
/* File loads: each hostile path as the driver answers it (missing, a
 * directory, empty, not an image, the PTX itself, NULL), with NULL
 * out-parameters and no context current. */
static const char *const file_labels[] = {"missing", "directory", "empty",
                                          "garbage", "the PTX",   "NULL path"};

static void file_paths(char paths[][64])
{
    const char *t = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(paths[2], 64, "%s/kc-hostile-empty-%d", t, (int)getpid());
    snprintf(paths[3], 64, "%s/kc-hostile-garbage-%d", t, (int)getpid());
    int fd = open(paths[2], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0)
        close(fd);
    fd = open(paths[3], O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
        static const char junk[] = "\x7f"
                                   "ELF this is no image at all\n";
        ssize_t w = write(fd, junk, sizeof junk - 1);
        (void)w;
        close(fd);
    }
}

static const char *file_path(int i, char paths[][64])
{
    static const char *const fixed[] = {"/nonexistent/kc-hostile.ptx", "/"};
    return i < 2 ? fixed[i] : i < 4 ? paths[i] : i == 4 ? ptx_path : NULL;
}

CASE(cuModuleLoad, hostile)
{
    char paths[4][64];
    file_paths(paths);
    CUmodule m = SENTINEL;
    CUresult rc0 = CU(cuModuleLoad)(&m, ptx_path);
    SAY("no context rc=%d out=%s", rc0, hstate(m));
    ctx_setup();
    for (int i = 0; i < 6; i++) {
        m = SENTINEL;
        CUresult rc = CU(cuModuleLoad)(&m, file_path(i, paths));
        SAY("%s rc=%d out=%s", file_labels[i], rc, hstate(m));
    }
    SAY("NULL out rc=%d", CU(cuModuleLoad)(NULL, ptx_path));
    unlink(paths[2]);
    unlink(paths[3]);
}
CASE(cuLibraryLoadFromFile, hostile)
{
    char paths[4][64];
    file_paths(paths);
    CUlibrary l = SENTINEL;
    CUresult rc = CU(cuLibraryLoadFromFile)(&l, ptx_path, NULL, NULL, 0, NULL, NULL, 0);
    SAY("no context rc=%d out=%s", rc, hstate(l));
    ctx_setup();
    for (int i = 0; i < 6; i++) {
        l = SENTINEL;
        rc = CU(cuLibraryLoadFromFile)(&l, file_path(i, paths), NULL, NULL, 0, NULL, NULL, 0);
        SAY("%s rc=%d out=%s", file_labels[i], rc, hstate(l));
    }
    l = SENTINEL;
    rc = CU(cuLibraryLoadFromFile)(&l, ptx_path, NULL, NULL, UINT_MAX, NULL, NULL, 0);
    SAY("huge jit count, NULL arrays rc=%d out=%s", rc, hstate(l));
    CUlibraryOption lo[] = {(CUlibraryOption)12345};
    void *lv[] = {NULL};
    l = SENTINEL;
    rc = CU(cuLibraryLoadFromFile)(&l, ptx_path, NULL, NULL, 0, lo, lv, 1);
    SAY("unknown library option rc=%d out=%s", rc, hstate(l));
    SAY("NULL out rc=%d", CU(cuLibraryLoadFromFile)(NULL, ptx_path, NULL, NULL, 0, NULL, NULL, 0));
    unlink(paths[2]);
    unlink(paths[3]);
}
/* ---- driver: resolvers ---- */
static void gpa_cases(int v2)
{
    void *p = SENTINEL;
    CUdriverProcAddressQueryResult q = (CUdriverProcAddressQueryResult)77;
#define GPA(sym_, pfn, ver, fl)                                                                    \
    (v2 ? CU(cuGetProcAddress_v2)(sym_, pfn, ver, fl, &q)                                          \
        : CU(cuGetProcAddress)(sym_, pfn, ver, fl))
    SAY("NULL symbol rc=%d out=%s", GPA(NULL, &p, 12000, 0), hstate(p));
    SAY("NULL pfn rc=%d", GPA("cuModuleLoadData", NULL, 12000, 0));
    p = SENTINEL;
    SAY("unknown rc=%d out=%s q=%d", GPA("cuNoSuchThing", &p, 12000, 0), hstate(p),
        v2 ? (int)q : -1);
    p = SENTINEL;
    SAY("negative version rc=%d out=%s", GPA("cuModuleLoadData", &p, -1, 0), hstate(p));
    p = SENTINEL;
    SAY("huge flags rc=%d out=%s", GPA("cuModuleLoadData", &p, 12000, ~0ull), hstate(p));
    p = SENTINEL;
    SAY("empty name rc=%d out=%s", GPA("", &p, 12000, 0), hstate(p));
    char longname[8192];
    memset(longname, 'c', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    p = SENTINEL;
    SAY("8 KiB name rc=%d out=%s", GPA(longname, &p, 12000, 0), hstate(p));
    if (v2) {
        p = SENTINEL;
        SAY("NULL status rc=%d out=%s",
            CU(cuGetProcAddress_v2)("cuModuleLoadData", &p, 12000, 0, NULL), hstate(p));
    }
#undef GPA
}
CASE(cuGetProcAddress, hostile)
{
    CU(cuInit)(0);
    gpa_cases(0);
}
CASE(cuGetProcAddress_v2, hostile)
{
    CU(cuInit)(0);
    gpa_cases(1);
}
CASE(cuGetProcAddress_v2, before_init)
{
    gpa_cases(1);
}
/* ---- driver: the context memo's hooks ---- */
CASE(cuModuleGetFunction, hostile)
{
    ctx_setup();
    CUmodule m = ptx_module();
    CUfunction f = SENTINEL;
    SAY("empty name rc=%d out=%s", CU(cuModuleGetFunction)(&f, m, ""), hstate(f));
    char longname[70000];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    f = SENTINEL;
    SAY("64 KiB name rc=%d out=%s", CU(cuModuleGetFunction)(&f, m, longname), hstate(f));
    f = SENTINEL;
    SAY("name at a page edge rc=%d out=%s", CU(cuModuleGetFunction)(&f, m, edge("add1", 5)),
        hstate(f));
    CU(cuCtxSetCurrent)(NULL);
    f = SENTINEL;
    SAY("no current context rc=%d out=%s", CU(cuModuleGetFunction)(&f, m, "add1"), hstate(f));
}
CASE(cuLibraryGetKernel, hostile)
{
    ctx_setup();
    CUlibrary l = NULL;
    CU(cuLibraryLoadData)(&l, ptx, NULL, NULL, 0, NULL, NULL, 0);
    CUkernel k = SENTINEL;
    SAY("empty name rc=%d out=%s", CU(cuLibraryGetKernel)(&k, l, ""), hstate(k));
    k = SENTINEL;
    SAY("NULL library rc=%d out=%s", CU(cuLibraryGetKernel)(&k, NULL, "add1"), hstate(k));
}
CASE(cuKernelGetFunction, hostile)
{
    ctx_setup();
    CUfunction f = SENTINEL;
    SAY("NULL kernel rc=%d out=%s", CU(cuKernelGetFunction)(&f, NULL), hstate(f));
}
CASE(cuModuleUnload, before_init)
{
    SAY("rc=%d", CU(cuModuleUnload)(GARBAGE));
}
CASE(cuModuleUnload, other_context)
{
    CUcontext c = ctx_setup();
    CUmodule m = ptx_module();
    CUcontext c2 = NULL;
    CUdevice d;
    CU(cuDeviceGet)(&d, 0);
    CU(cuCtxCreate_v4)(&c2, NULL, 0, d);
    SAY("unload from another context rc=%d", CU(cuModuleUnload)(m));
    CU(cuCtxSetCurrent)(c);
    CUfunction f = SENTINEL;
    SAY("lookup after rc=%d out=%s", CU(cuModuleGetFunction)(&f, m, "add1"), hstate(f));
}
CASE(cuLibraryUnload, null)
{
    ctx_setup();
    SAY("rc=%d", CU(cuLibraryUnload)(NULL));
}
static void destroy_cases(const char *name)
{
    CUresult (*destroy)(CUcontext) = (CUresult(*)(CUcontext))sym(cu, name);
    SAY("before init rc=%d", destroy(GARBAGE));
    CUcontext c = ctx_setup();
    SAY("primary context rc=%d", destroy(c));
    SAY("NULL rc=%d", destroy(NULL));
}
CASE(cuCtxDestroy, hostile)
{
    destroy_cases("cuCtxDestroy");
}
CASE(cuCtxDestroy_v2, hostile)
{
    destroy_cases("cuCtxDestroy_v2");
}
static void primary_cases(const char *retain_or_release_or_reset)
{
    if (!strcmp(retain_or_release_or_reset, "retain")) {
        CUresult (*r)(CUcontext *, CUdevice) =
            (CUresult(*)(CUcontext *, CUdevice))sym(cu, "cuDevicePrimaryCtxRetain");
        CUcontext c = SENTINEL;
        SAY("before init rc=%d out=%s", r(&c, 0), hstate(c));
        CU(cuInit)(0);
        c = SENTINEL;
        SAY("device -1 rc=%d out=%s", r(&c, -1), hstate(c));
        c = SENTINEL;
        SAY("device INT_MAX rc=%d out=%s", r(&c, INT_MAX), hstate(c));
        return;
    }
    CUresult (*f)(CUdevice) = (CUresult(*)(CUdevice))sym(cu, retain_or_release_or_reset);
    SAY("before init rc=%d", f(0));
    CU(cuInit)(0);
    SAY("device -1 rc=%d", f(-1));
    SAY("device INT_MIN rc=%d", f(INT_MIN));
    SAY("unretained rc=%d", f(0));
    ctx_setup();
    SAY("retained rc=%d", f(0));
    SAY("again rc=%d", f(0));
}
CASE(cuDevicePrimaryCtxRetain, hostile)
{
    primary_cases("retain");
}
CASE(cuDevicePrimaryCtxRelease, hostile)
{
    primary_cases("cuDevicePrimaryCtxRelease");
}
CASE(cuDevicePrimaryCtxRelease_v2, hostile)
{
    primary_cases("cuDevicePrimaryCtxRelease_v2");
}
CASE(cuDevicePrimaryCtxReset, hostile)
{
    primary_cases("cuDevicePrimaryCtxReset");
}
CASE(cuDevicePrimaryCtxReset_v2, hostile)
{
    primary_cases("cuDevicePrimaryCtxReset_v2");
}
CASE(cuMemAlloc_v2, hostile)
{
    CUdeviceptr p = 0x5a5a;
    SAY("before init rc=%d", CU(cuMemAlloc_v2)(&p, 16));
    ctx_setup();
    p = 0x5a5a;
    SAY("SIZE_MAX rc=%d changed=%d", CU(cuMemAlloc_v2)(&p, SIZE_MAX), p != 0x5a5a);
    p = 0x5a5a;
    SAY("SIZE_MAX-4095 rc=%d changed=%d", CU(cuMemAlloc_v2)(&p, SIZE_MAX - 4095), p != 0x5a5a);
    /* Freed blocks go to the pool: a NULL out or a zero size must still be
     * refused exactly as the driver refuses them. */
    CU(cuMemAlloc_v2)(&p, 4096);
    CU(cuMemFree_v2)(p);
    SAY("NULL out with a pooled block rc=%d", CU(cuMemAlloc_v2)(NULL, 4096));
    p = 0x5a5a;
    SAY("zero with a pooled block rc=%d changed=%d", CU(cuMemAlloc_v2)(&p, 0), p != 0x5a5a);
}
CASE(cuMemFree_v2, hostile)
{
    SAY("before init rc=%d", CU(cuMemFree_v2)(0x1000));
    ctx_setup();
    CUdeviceptr p = 0;
    CU(cuMemAlloc_v2)(&p, 4096);
    SAY("free rc=%d", CU(cuMemFree_v2)(p));
    /* A double free whose block sits in the pool. */
    SAY("free twice rc=%d", CU(cuMemFree_v2)(p));
    SAY("free interior of a freed block rc=%d", CU(cuMemFree_v2)(p + 8));
    SAY("free ~0 rc=%d", CU(cuMemFree_v2)(~(CUdeviceptr)0));
    CU(cuCtxSetCurrent)(NULL);
    SAY("free without a context rc=%d", CU(cuMemFree_v2)(p));
}
CASE(cuMemGetInfo_v2, hostile)
{
    size_t a = 7, b = 7;
    SAY("before init rc=%d", CU(cuMemGetInfo_v2)(&a, &b));
    ctx_setup();
    SAY("free NULL rc=%d", CU(cuMemGetInfo_v2)(NULL, &b));
    SAY("total NULL rc=%d", CU(cuMemGetInfo_v2)(&a, NULL));
    CU(cuCtxSetCurrent)(NULL);
    SAY("no context rc=%d", CU(cuMemGetInfo_v2)(&a, &b));
}
/* The pointer queries: a freed block may sit in the pool, and must answer
 * as freed. */
static CUdeviceptr freed_block(void)
{
    CUdeviceptr p = 0;
    if (CU(cuMemAlloc_v2)(&p, 8192) || CU(cuMemFree_v2)(p))
        _exit(8);
    return p;
}
CASE(cuMemGetInfo, hostile)
{
    unsigned a = 7, b = 7;
    SAY("before init rc=%d", CU(cuMemGetInfo)(&a, &b));
    ctx_setup();
    SAY("free NULL rc=%d", CU(cuMemGetInfo)(NULL, &b));
    SAY("total NULL rc=%d", CU(cuMemGetInfo)(&a, NULL));
    freed_block();
    SAY("with a freed block rc=%d", CU(cuMemGetInfo)(&a, &b));
    CU(cuCtxSetCurrent)(NULL);
    SAY("no context rc=%d", CU(cuMemGetInfo)(&a, &b));
}
CASE(cuMemGetAddressRange_v2, hostile)
{
    CUdeviceptr base = 7;
    size_t size = 7;
    SAY("before init rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, 0x1000));
    ctx_setup();
    SAY("0 rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, 0));
    SAY("~0 rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, ~(CUdeviceptr)0));
    CUdeviceptr p = freed_block();
    SAY("freed block rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, p));
    p = freed_block();
    SAY("inside a freed block rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, p + 100));
    p = freed_block();
    SAY("freed block, no outputs rc=%d", CU(cuMemGetAddressRange_v2)(NULL, NULL, p));
    CU(cuMemAlloc_v2)(&p, 8192);
    SAY("no outputs rc=%d", CU(cuMemGetAddressRange_v2)(NULL, NULL, p));
    SAY("past the end rc=%d", CU(cuMemGetAddressRange_v2)(&base, &size, p + 8192));
    CU(cuCtxSetCurrent)(NULL);
    size = 7;
    CUresult rc = CU(cuMemGetAddressRange_v2)(&base, &size, p);
    SAY("no context rc=%d size=%zu", rc, size);
}
CASE(cuPointerGetAttribute, hostile)
{
    unsigned long long v[4] = {0};
    SAY("before init rc=%d", CU(cuPointerGetAttribute)(v, CU_POINTER_ATTRIBUTE_CONTEXT, 0x1000));
    ctx_setup();
    CUdeviceptr p = freed_block();
    SAY("NULL data, freed block rc=%d",
        CU(cuPointerGetAttribute)(NULL, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
    for (int a = -1; a <= 23; a++) {
        p = freed_block();
        memset(v, 0, sizeof v);
        CUresult rc = CU(cuPointerGetAttribute)(v, (CUpointer_attribute)a, p + 16);
        SAY("attribute %d inside a freed block rc=%d", a, rc);
    }
    SAY("0 rc=%d", CU(cuPointerGetAttribute)(v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0));
    SAY("host memory rc=%d",
        CU(cuPointerGetAttribute)(v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)v));
    CU(cuMemAlloc_v2)(&p, 8192);
    SAY("attribute 999 rc=%d", CU(cuPointerGetAttribute)(v, (CUpointer_attribute)999, p));
    CU(cuCtxSetCurrent)(NULL);
    SAY("device pointer, no context rc=%d",
        CU(cuPointerGetAttribute)(v, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p));
}
CASE(cuPointerGetAttributes, hostile)
{
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                CU_POINTER_ATTRIBUTE_CONTEXT};
    unsigned long long v[3] = {7, 7, 7};
    void *d[] = {&v[0], &v[1], &v[2]};
    SAY("before init rc=%d", CU(cuPointerGetAttributes)(3, at, d, 0x1000));
    ctx_setup();
    CUdeviceptr p = freed_block();
    CUresult rc = CU(cuPointerGetAttributes)(3, at, d, p);
    SAY("freed block rc=%d values=%llu,%llu,%llu", rc, v[0], v[1], v[2]);
    p = freed_block();
    SAY("n=0 rc=%d", CU(cuPointerGetAttributes)(0, at, d, p));
    SAY("NULL arrays rc=%d", CU(cuPointerGetAttributes)(UINT_MAX, NULL, NULL, p));
    void *dn[] = {&v[0], NULL, &v[2]};
    SAY("NULL entry rc=%d", CU(cuPointerGetAttributes)(3, at, dn, p));
    CUpointer_attribute bad[] = {CU_POINTER_ATTRIBUTE_P2P_TOKENS};
    SAY("P2P tokens rc=%d", CU(cuPointerGetAttributes)(1, bad, d, p));
    SAY("garbage rc=%d", CU(cuPointerGetAttributes)(3, at, d, 0xdeadbeef000ull));
}
CASE(cuPointerSetAttribute, hostile)
{
    unsigned one = 1;
    SAY("before init rc=%d",
        CU(cuPointerSetAttribute)(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, 0x1000));
    ctx_setup();
    CUdeviceptr p = freed_block();
    SAY("freed block rc=%d", CU(cuPointerSetAttribute)(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
    p = freed_block();
    SAY("NULL value, freed block rc=%d",
        CU(cuPointerSetAttribute)(NULL, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
    SAY("other attribute rc=%d", CU(cuPointerSetAttribute)(&one, CU_POINTER_ATTRIBUTE_CONTEXT, p));
    CU(cuMemAlloc_v2)(&p, 8192);
    SAY("live block rc=%d", CU(cuPointerSetAttribute)(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
    CU(cuMemFree_v2)(p);
    int sync = 7;
    SAY("after free rc=%d", CU(cuPointerGetAttribute)(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
}

/* ---- nvJitLink: every function under both its names (v 0: unversioned, as
 * cuda.bindings resolves it; v 1: the versioned export the header calls) ---- */
static const char *jl_names[][2] = {
    {"nvJitLinkCreate", "__nvJitLinkCreate_13_0"},
    {"nvJitLinkDestroy", "__nvJitLinkDestroy_13_0"},
    {"nvJitLinkAddData", "__nvJitLinkAddData_13_0"},
    {"nvJitLinkAddFile", "__nvJitLinkAddFile_13_0"},
    {"nvJitLinkComplete", "__nvJitLinkComplete_13_0"},
    {"nvJitLinkGetLinkedCubinSize", "__nvJitLinkGetLinkedCubinSize_13_0"},
    {"nvJitLinkGetLinkedCubin", "__nvJitLinkGetLinkedCubin_13_0"},
    {"nvJitLinkGetLinkedPtxSize", "__nvJitLinkGetLinkedPtxSize_13_0"},
    {"nvJitLinkGetLinkedPtx", "__nvJitLinkGetLinkedPtx_13_0"},
    {"nvJitLinkGetErrorLogSize", "__nvJitLinkGetErrorLogSize_13_0"},
    {"nvJitLinkGetErrorLog", "__nvJitLinkGetErrorLog_13_0"},
    {"nvJitLinkGetInfoLogSize", "__nvJitLinkGetInfoLogSize_13_0"},
    {"nvJitLinkGetInfoLog", "__nvJitLinkGetInfoLog_13_0"},
};
enum {
    J_CREATE,
    J_DESTROY,
    J_ADD_DATA,
    J_ADD_FILE,
    J_COMPLETE,
    J_CUBIN_SIZE,
    J_CUBIN,
    J_PTX_SIZE,
    J_PTX,
    J_ERR_SIZE,
    J_ERR,
    J_INFO_SIZE,
    J_INFO
};
static int jv; /* the name variant the running case uses */
typedef nvJitLinkResult (*jl_create_t)(nvJitLinkHandle *, uint32_t, const char **);
typedef nvJitLinkResult (*jl_destroy_t)(nvJitLinkHandle *);
typedef nvJitLinkResult (*jl_add_t)(nvJitLinkHandle, nvJitLinkInputType, const void *, size_t,
                                    const char *);
typedef nvJitLinkResult (*jl_file_t)(nvJitLinkHandle, nvJitLinkInputType, const char *);
typedef nvJitLinkResult (*jl_complete_t)(nvJitLinkHandle);
typedef nvJitLinkResult (*jl_size_t)(nvJitLinkHandle, size_t *);
typedef nvJitLinkResult (*jl_get_t)(nvJitLinkHandle, void *);
#define JF(t, f) ((t)sym(jl, jl_names[f][jv]))

/* PTX whose link fails: it calls a function nobody defines. */
static char *undefined_ptx(void)
{
    static const char *s = "extern __device__ float nowhere(float);\n"
                           "extern \"C\" __global__ void ku(float *x) { x[0] = nowhere(x[1]); }\n";
    nvrtcProgram p = NULL;
    static const char *o[] = {"-arch=compute_90", "-rdc=true"};
    size_t n = 0;
    if (NV(nvrtcCreateProgram)(&p, s, "u.cu", 0, NULL, NULL) || NV(nvrtcCompileProgram)(p, 2, o) ||
        NV(nvrtcGetPTXSize)(p, &n))
        _exit(5);
    char *b = malloc(n);
    NV(nvrtcGetPTX)(p, b);
    return b;
}

static nvJitLinkHandle jl_created(void)
{
    nvJitLinkHandle h = NULL;
    const char *o[] = {"-arch=sm_90"};
    if (JF(jl_create_t, J_CREATE)(&h, 1, o) != NVJITLINK_SUCCESS)
        _exit(8);
    return h;
}

/* A handle linked from the PTX file (good) or the undefined call (bad). */
static nvJitLinkHandle jl_linked(int bad)
{
    nvJitLinkHandle h = jl_created();
    const char *p = bad ? undefined_ptx() : ptx;
    SAY("  add rc=%d", JF(jl_add_t, J_ADD_DATA)(h, NVJITLINK_INPUT_PTX, p, strlen(p) + 1, "p"));
    SAY("  complete rc=%d", JF(jl_complete_t, J_COMPLETE)(h));
    return h;
}

static void jl_getters(nvJitLinkHandle h, const char *what)
{
    for (int g = J_CUBIN_SIZE; g <= J_INFO_SIZE; g += 2) {
        size_t n = 777;
        nvJitLinkResult rc = JF(jl_size_t, g)(h, &n);
        SAY("  %s %s rc=%d size=%zu null rc=%d", what, jl_names[g][0], rc, n,
            JF(jl_size_t, g)(h, NULL));
        size_t cap = rc == NVJITLINK_SUCCESS && n != 777 && n < (1u << 26) ? n : 64;
        char *buf = edge((char[1]){0}, 1);
        if (cap > 1) {
            buf = malloc(cap);
            memset(buf, 0x5a, cap);
        }
        rc = JF(jl_get_t, g + 1)(h, buf);
        unsigned long sum = 5381;
        for (size_t i = 0; i < cap; i++)
            sum = sum * 33 + (unsigned char)buf[i];
        SAY("  %s %s rc=%d hash=%lu null rc=%d", what, jl_names[g + 1][0], rc, sum,
            JF(jl_get_t, g + 1)(h, NULL));
    }
}

#define JL_BOTH(fn, label, ...)                                                                    \
    static void fn##_##label##_impl(void) __VA_ARGS__ static void fn##__##label(void)              \
    {                                                                                              \
        jv = 0;                                                                                    \
        fn##_##label##_impl();                                                                     \
    }                                                                                              \
    static void __##fn##_13_0__##label(void)                                                       \
    {                                                                                              \
        jv = 1;                                                                                    \
        fn##_##label##_impl();                                                                     \
    }

JL_BOTH(nvJitLinkCreate, hostile, {
    nvJitLinkHandle h = SENTINEL;
    const char *o[] = {"-arch=sm_90"}, *bad[] = {"--no-such-option"},
               *nul[] = {"-arch=sm_90", NULL};
    jl_create_t c = JF(jl_create_t, J_CREATE);
    SAY("NULL handle rc=%d", c(NULL, 1, o));
    SAY("no options rc=%d out=%s", c(&h, 0, NULL), hstate(h));
    h = SENTINEL;
    SAY("count, NULL array rc=%d out=%s", c(&h, 2, NULL), hstate(h));
    h = SENTINEL;
    SAY("bad option rc=%d out=%s", c(&h, 1, bad), hstate(h));
    (void)nul;
    h = SENTINEL;
    const char *timed[] = {"-arch=sm_90", "-time"};
    SAY("-time rc=%d out=%s", c(&h, 2, timed), hstate(h));
})
CASE(nvJitLinkCreate, null_option_entry)
{
    nvJitLinkHandle h = SENTINEL;
    const char *o[] = {"-arch=sm_90", NULL};
    jv = 0;
    SAY("rc=%d out=%s", JF(jl_create_t, J_CREATE)(&h, 2, o), hstate(h));
}
JL_BOTH(nvJitLinkDestroy, hostile, {
    jl_destroy_t d = JF(jl_destroy_t, J_DESTROY);
    SAY("NULL rc=%d", d(NULL));
    nvJitLinkHandle h = NULL;
    SAY("NULL handle rc=%d", d(&h));
    h = jl_created();
    SAY("created rc=%d after=%s", d(&h), hstate(h));
    SAY("again rc=%d", d(&h));
    h = jl_linked(0);
    SAY("linked rc=%d after=%s", d(&h), hstate(h));
})
JL_BOTH(nvJitLinkAddData, hostile, {
    jl_add_t a = JF(jl_add_t, J_ADD_DATA);
    SAY("NULL handle rc=%d", a(NULL, NVJITLINK_INPUT_PTX, ptx, ptx_len + 1, "p"));
    nvJitLinkHandle h = jl_created();
    SAY("NULL data rc=%d", a(h, NVJITLINK_INPUT_LTOIR, NULL, 10, "p"));
    SAY("size 0 rc=%d", a(h, NVJITLINK_INPUT_PTX, ptx, 0, "p"));
    SAY("bad type rc=%d", a(h, (nvJitLinkInputType)99, ptx, ptx_len + 1, "p"));
    SAY("type NONE rc=%d", a(h, NVJITLINK_INPUT_NONE, ptx, ptx_len + 1, "p"));
    SAY("garbage LTO-IR rc=%d", a(h, NVJITLINK_INPUT_LTOIR, "garbage", 8, "g"));
    SAY("NULL name rc=%d", a(h, NVJITLINK_INPUT_PTX, ptx, ptx_len + 1, NULL));
    SAY("complete rc=%d", JF(jl_complete_t, J_COMPLETE)(h));
    jl_getters(h, "after bad adds");
    h = jl_linked(0);
    SAY("after complete rc=%d", a(h, NVJITLINK_INPUT_PTX, ptx, ptx_len + 1, "again"));
    SAY("complete again rc=%d", JF(jl_complete_t, J_COMPLETE)(h));
    jl_getters(h, "after an add past completion");
})
JL_BOTH(nvJitLinkAddFile, hostile, {
    jl_file_t f = JF(jl_file_t, J_ADD_FILE);
    SAY("NULL handle rc=%d", f(NULL, NVJITLINK_INPUT_PTX, ptx_path));
    nvJitLinkHandle h = jl_created();
    SAY("NULL path rc=%d", f(h, NVJITLINK_INPUT_PTX, NULL));
    SAY("empty path rc=%d", f(h, NVJITLINK_INPUT_PTX, ""));
    SAY("missing rc=%d", f(h, NVJITLINK_INPUT_PTX, "/nonexistent/k.ptx"));
    SAY("directory rc=%d", f(h, NVJITLINK_INPUT_PTX, "/"));
    SAY("bad type rc=%d", f(h, (nvJitLinkInputType)99, ptx_path));
    SAY("ok rc=%d", f(h, NVJITLINK_INPUT_PTX, ptx_path));
    SAY("ANY rc=%d", f(h, NVJITLINK_INPUT_ANY, ptx_path));
    SAY("complete rc=%d", JF(jl_complete_t, J_COMPLETE)(h));
    jl_getters(h, "after file adds");
    h = jl_created();
    SAY("alone rc=%d", f(h, NVJITLINK_INPUT_PTX, ptx_path));
    SAY("complete rc=%d", JF(jl_complete_t, J_COMPLETE)(h));
    jl_getters(h, "file only");
})
JL_BOTH(nvJitLinkComplete, hostile, {
    jl_complete_t c = JF(jl_complete_t, J_COMPLETE);
    SAY("NULL handle rc=%d", c(NULL));
    nvJitLinkHandle h = jl_created();
    SAY("no inputs rc=%d", c(h));
    SAY("again rc=%d", c(h));
    jl_getters(h, "no inputs");
    h = jl_linked(1);
    jl_getters(h, "undefined symbol");
    SAY("again rc=%d", c(h));
    SAY("add after failure rc=%d",
        JF(jl_add_t, J_ADD_DATA)(h, NVJITLINK_INPUT_PTX, ptx, ptx_len + 1, "p"));
    SAY("again rc=%d", c(h));
    jl_getters(h, "completed three times");
})
#define JL_GETTER_CASES(S, G)                                                                      \
    JL_BOTH(S, hostile, {                                                                          \
        size_t n = 777;                                                                            \
        SAY("NULL handle rc=%d size=%zu",                                                          \
            ((jl_size_t)sym(jl, jv ? "__" #S "_13_0" : #S))(NULL, &n), n);                         \
        nvJitLinkHandle h = jl_created();                                                          \
        jl_getters(h, "created");                                                                  \
        h = jl_linked(0);                                                                          \
        jl_getters(h, "linked");                                                                   \
    })                                                                                             \
    JL_BOTH(G, hostile, {                                                                          \
        SAY("NULL handle rc=%d",                                                                   \
            ((jl_get_t)sym(jl, jv ? "__" #G "_13_0" : #G))(NULL, (char[8]){0}));                   \
        nvJitLinkHandle h = jl_linked(0);                                                          \
        SAY("NULL out rc=%d", ((jl_get_t)sym(jl, jv ? "__" #G "_13_0" : #G))(h, NULL));            \
        h = jl_linked(1);                                                                          \
        SAY("failed, NULL out rc=%d", ((jl_get_t)sym(jl, jv ? "__" #G "_13_0" : #G))(h, NULL));    \
    })
#define JL_GETTERS(X)                                                                              \
    X(nvJitLinkGetLinkedCubinSize, nvJitLinkGetLinkedCubin)                                        \
    X(nvJitLinkGetLinkedPtxSize, nvJitLinkGetLinkedPtx)                                            \
    X(nvJitLinkGetErrorLogSize, nvJitLinkGetErrorLog)                                              \
    X(nvJitLinkGetInfoLogSize, nvJitLinkGetInfoLog)
JL_GETTERS(JL_GETTER_CASES)
/* Newer nvJitLink's getters, hooked for a served handle's sake: absent
 * from this library, so dlsym must find nothing. */
CASE(nvJitLinkGetLinkedLTOIRSize, absent)
{
    SAY("dlsym: %s", dlsym(jl, "nvJitLinkGetLinkedLTOIRSize") ? "found" : "NULL");
    SAY("RTLD_DEFAULT: %s", dlsym(RTLD_DEFAULT, "nvJitLinkGetLinkedLTOIRSize") ? "found" : "NULL");
}
CASE(nvJitLinkGetLinkedLTOIR, absent)
{
    SAY("dlsym: %s", dlsym(jl, "nvJitLinkGetLinkedLTOIR") ? "found" : "NULL");
}
CASE(nvJitLinkVersion, null_args)
{
    unsigned a = 7, b = 7;
    nvJitLinkResult (*v)(unsigned *, unsigned *) =
        (nvJitLinkResult(*)(unsigned *, unsigned *))sym(jl, "nvJitLinkVersion");
    SAY("ok rc=%d", v(&a, &b));
}

/* ---- the driver's linker (the stand-in) ---- */
static CUlinkState cu_link_created(char *info, char *err)
{
    CUjit_option o[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                        CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    static void *v[4];
    v[0] = info, v[1] = (void *)(uintptr_t)256, v[2] = err, v[3] = (void *)(uintptr_t)256;
    CUlinkState s = NULL;
    if (CU(cuLinkCreate_v2)(info ? 4 : 0, o, v, &s) != CUDA_SUCCESS)
        _exit(9);
    return s;
}

static void cu_complete(CUlinkState s, const char *what, const char *info, const char *err)
{
    void *c = SENTINEL;
    size_t n = 777;
    CUresult rc = CU(cuLinkComplete)(s, &c, &n);
    SAY("  %s complete rc=%d out=%s size=%zu", what, rc, hstate(c), n);
    if (info)
        SAY("  info [%s] error [%s]", info, err);
}

static void culink_create_cases(CUresult (*create)(unsigned, CUjit_option *, void **,
                                                   CUlinkState *))
{
    CUlinkState s = SENTINEL;
    SAY("before init rc=%d out=%s", create(0, NULL, NULL, &s), hstate(s));
    CU(cuInit)(0);
    s = SENTINEL;
    SAY("no context rc=%d out=%s", create(0, NULL, NULL, &s), hstate(s));
    ctx_setup();
    SAY("NULL out rc=%d", create(0, NULL, NULL, NULL));
    s = SENTINEL;
    SAY("count, NULL arrays rc=%d out=%s", create(3, NULL, NULL, &s), hstate(s));
    CUjit_option bad[] = {(CUjit_option)9999};
    void *bv[] = {NULL};
    s = SENTINEL;
    SAY("unknown option rc=%d out=%s", create(1, bad, bv, &s), hstate(s));
    CUjit_option ol[] = {CU_JIT_OPTIMIZATION_LEVEL};
    void *olv[] = {(void *)(uintptr_t)99};
    s = SENTINEL;
    SAY("optimization level 99 rc=%d out=%s", create(1, ol, olv, &s), hstate(s));
    CUjit_option lo[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
    void *lv[] = {NULL, (void *)(uintptr_t)4096};
    s = SENTINEL;
    CUresult rc = create(2, lo, lv, &s);
    SAY("NULL log buffer with a size rc=%d out=%s", rc, hstate(s));
    if (rc == CUDA_SUCCESS) {
        SAY("  add rc=%d",
            CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
        cu_complete(s, "NULL log buffer", NULL, NULL);
        SAY("  written=%zu", (size_t)(uintptr_t)lv[1]);
    }
    char *one = edge("", 1);
    void *lv1[] = {one, (void *)(uintptr_t)1};
    s = SENTINEL;
    rc = create(2, lo, lv1, &s);
    SAY("one-byte log at a page edge rc=%d", rc);
    if (rc == CUDA_SUCCESS) {
        SAY("  add rc=%d",
            CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
        cu_complete(s, "one-byte log", NULL, NULL);
        SAY("  buf0=%d written=%zu", one[0], (size_t)(uintptr_t)lv1[1]);
    }
}
CASE(cuLinkCreate, hostile)
{
    culink_create_cases(CU(cuLinkCreate));
}
CASE(cuLinkCreate_v2, hostile)
{
    culink_create_cases(CU(cuLinkCreate_v2));
}

static void culink_add_cases(CUresult (*add)(CUlinkState, CUjitInputType, void *, size_t,
                                             const char *, unsigned, CUjit_option *, void **))
{
    SAY("before init rc=%d", add(GARBAGE, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    ctx_setup();
    SAY("NULL state rc=%d", add(NULL, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    SAY("garbage state rc=%d",
        add(GARBAGE, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    char info[256] = "", err[256] = "";
    CUlinkState s = cu_link_created(info, err);
    SAY("NULL data rc=%d", add(s, CU_JIT_INPUT_PTX, NULL, 10, "p", 0, NULL, NULL));
    SAY("size 0 rc=%d", add(s, CU_JIT_INPUT_PTX, ptx, 0, "p", 0, NULL, NULL));
    SAY("bad type rc=%d", add(s, (CUjitInputType)99, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    SAY("not PTX rc=%d", add(s, CU_JIT_INPUT_PTX, "hello", 6, "p", 0, NULL, NULL));
    SAY("  info [%s] error [%s]", info, err);
    SAY("options, NULL arrays rc=%d",
        add(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 2, NULL, NULL));
    CUjit_option bad[] = {(CUjit_option)9999};
    void *bv[] = {NULL};
    SAY("unknown option rc=%d", add(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 1, bad, bv));
    SAY("NULL name rc=%d", add(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, NULL, 0, NULL, NULL));
    cu_complete(s, "after bad adds", info, err);
    SAY("after complete rc=%d", add(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p2", 0, NULL, NULL));
    cu_complete(s, "again", info, err);
    SAY("destroy rc=%d", CU(cuLinkDestroy)(s));
    SAY("destroyed state rc=%d", add(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
}
CASE(cuLinkAddData, hostile)
{
    culink_add_cases(CU(cuLinkAddData));
}
CASE(cuLinkAddData_v2, hostile)
{
    culink_add_cases(CU(cuLinkAddData_v2));
}

static void culink_file_cases(CUresult (*add)(CUlinkState, CUjitInputType, const char *, unsigned,
                                              CUjit_option *, void **))
{
    SAY("before init rc=%d", add(GARBAGE, CU_JIT_INPUT_PTX, ptx_path, 0, NULL, NULL));
    ctx_setup();
    SAY("garbage state rc=%d", add(GARBAGE, CU_JIT_INPUT_PTX, ptx_path, 0, NULL, NULL));
    char info[256] = "", err[256] = "";
    CUlinkState s = cu_link_created(info, err);
    SAY("NULL path rc=%d", add(s, CU_JIT_INPUT_PTX, NULL, 0, NULL, NULL));
    SAY("empty path rc=%d", add(s, CU_JIT_INPUT_PTX, "", 0, NULL, NULL));
    SAY("missing rc=%d", add(s, CU_JIT_INPUT_PTX, "/nonexistent/k.ptx", 0, NULL, NULL));
    SAY("bad type rc=%d", add(s, (CUjitInputType)99, ptx_path, 0, NULL, NULL));
    SAY("ok rc=%d", add(s, CU_JIT_INPUT_PTX, ptx_path, 0, NULL, NULL));
    cu_complete(s, "file", info, err);
    SAY("destroy rc=%d", CU(cuLinkDestroy)(s));
    s = cu_link_created(info, err);
    SAY("alone rc=%d", add(s, CU_JIT_INPUT_PTX, ptx_path, 0, NULL, NULL));
    cu_complete(s, "file alone", info, err);
}
CASE(cuLinkAddFile, hostile)
{
    culink_file_cases(CU(cuLinkAddFile));
}
CASE(cuLinkAddFile_v2, hostile)
{
    culink_file_cases(CU(cuLinkAddFile_v2));
}

CASE(cuLinkComplete, hostile)
{
    void *c = SENTINEL;
    size_t n = 777;
    SAY("before init rc=%d", CU(cuLinkComplete)(GARBAGE, &c, &n));
    ctx_setup();
    SAY("NULL state rc=%d", CU(cuLinkComplete)(NULL, &c, &n));
    char info[256] = "", err[256] = "";
    CUlinkState s = cu_link_created(info, err);
    SAY("NULL outs rc=%d", CU(cuLinkComplete)(s, NULL, NULL));
    cu_complete(s, "no inputs", info, err);
    s = cu_link_created(info, err);
    SAY("add rc=%d",
        CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    SAY("NULL size out rc=%d", CU(cuLinkComplete)(s, &c, NULL));
    cu_complete(s, "after a NULL out", info, err);
    s = cu_link_created(info, err);
    SAY("add rc=%d",
        CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    cu_complete(s, "linked", info, err);
    cu_complete(s, "twice", info, err);
    s = cu_link_created(info, err);
    char *u = undefined_ptx();
    SAY("add undefined rc=%d",
        CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, u, strlen(u) + 1, "u", 0, NULL, NULL));
    cu_complete(s, "undefined", info, err);
    cu_complete(s, "undefined twice", info, err);
    SAY("destroy rc=%d", CU(cuLinkDestroy)(s));
}
CASE(cuLinkDestroy, hostile)
{
    SAY("before init rc=%d", CU(cuLinkDestroy)(GARBAGE));
    ctx_setup();
    SAY("NULL rc=%d", CU(cuLinkDestroy)(NULL));
    SAY("garbage rc=%d", CU(cuLinkDestroy)(GARBAGE));
    CUlinkState s = cu_link_created(NULL, NULL);
    SAY("created rc=%d", CU(cuLinkDestroy)(s));
    SAY("twice rc=%d", CU(cuLinkDestroy)(s));
    s = cu_link_created(NULL, NULL);
    SAY("add rc=%d",
        CU(cuLinkAddData_v2)(s, CU_JIT_INPUT_PTX, ptx, ptx_len + 1, "p", 0, NULL, NULL));
    cu_complete(s, "linked", NULL, NULL);
    SAY("linked rc=%d", CU(cuLinkDestroy)(s));
    SAY("complete after destroy rc=%d", CU(cuLinkComplete)(s, &(void *){0}, &(size_t){0}));
}

/* ---- libc: the header-tracking wrappers (shim/deps.c) and dlsym ---- */
static char longpath[PATH_MAX * 2];
static const char *lp(void)
{
    memset(longpath, 'x', sizeof longpath - 1);
    longpath[0] = '/';
    return longpath;
}
#define ERR(rc) (rc), ((rc) < 0 ? errno : 0)
CASE(open, hostile)
{
    errno = 0;
    SAY("NULL rc=%d errno=%d", ERR(open(NULL, O_RDONLY)));
    SAY("empty rc=%d errno=%d", ERR(open("", O_RDONLY)));
    SAY("long rc=%d errno=%d", ERR(open(lp(), O_RDONLY)));
    SAY("bad flags rc=%d errno=%d", ERR(open("/nonexistent/x", -1)));
    SAY("dir for writing rc=%d errno=%d", ERR(open("/", O_WRONLY)));
}
CASE(open64, hostile)
{
    int (*o64)(const char *, int, ...) = dlsym(RTLD_DEFAULT, "open64");
    SAY("NULL rc=%d errno=%d", ERR(o64(NULL, O_RDONLY)));
    SAY("long rc=%d errno=%d", ERR(o64(lp(), O_RDONLY)));
}
CASE(openat, hostile)
{
    SAY("bad dirfd rc=%d errno=%d", ERR(openat(-5, "x", O_RDONLY)));
    SAY("NULL path rc=%d errno=%d", ERR(openat(AT_FDCWD, NULL, O_RDONLY)));
    SAY("file as dirfd rc=%d errno=%d", ERR(openat(0, "x", O_RDONLY)));
    SAY("long rc=%d errno=%d", ERR(openat(AT_FDCWD, lp(), O_RDONLY)));
}
CASE(openat64, hostile)
{
    int (*o64)(int, const char *, int, ...) = dlsym(RTLD_DEFAULT, "openat64");
    SAY("bad dirfd rc=%d errno=%d", ERR(o64(-5, "x", O_RDONLY)));
    SAY("NULL path rc=%d errno=%d", ERR(o64(AT_FDCWD, NULL, O_RDONLY)));
    SAY("file as dirfd rc=%d errno=%d", ERR(o64(0, "x", O_RDONLY)));
    SAY("long rc=%d errno=%d", ERR(o64(AT_FDCWD, lp(), O_RDONLY)));
}
static void fopen_cases(FILE *(*fo)(const char *, const char *))
{
    FILE *f;
    errno = 0;
    f = fo("/nonexistent/x", "r");
    SAY("absent %s errno=%d", f ? "FILE" : "NULL", f ? 0 : errno);
    f = fo(ptx_path, "z");
    SAY("bad mode %s errno=%d", f ? "FILE" : "NULL", f ? 0 : errno);
    f = fo(lp(), "r");
    SAY("long %s errno=%d", f ? "FILE" : "NULL", f ? 0 : errno);
    f = fo("", "r");
    SAY("empty %s errno=%d", f ? "FILE" : "NULL", f ? 0 : errno);
}
CASE(fopen, hostile)
{
    fopen_cases(fopen);
}
CASE(fopen, null_path)
{
    FILE *f = fopen(NULL, "r");
    SAY("%s errno=%d", f ? "FILE" : "NULL", f ? 0 : errno);
}
CASE(fopen, null_mode)
{
    FILE *f = fopen(ptx_path, NULL);
    SAY("%s", f ? "FILE" : "NULL");
}
CASE(fopen64, hostile)
{
    fopen_cases((FILE * (*)(const char *, const char *)) dlsym(RTLD_DEFAULT, "fopen64"));
}
static void xstat_cases(const char *name)
{
    int (*xs)(int, const char *, struct stat *) = dlvsym(RTLD_DEFAULT, name, "GLIBC_2.2.5");
    if (!xs) {
        SAY("%s not found", name);
        return;
    }
    struct stat st;
    SAY("bad version rc=%d errno=%d", ERR(xs(99, ptx_path, &st)));
    SAY("NULL path rc=%d errno=%d", ERR(xs(1, NULL, &st)));
    SAY("absent rc=%d errno=%d", ERR(xs(1, "/nonexistent/x", &st)));
    SAY("long rc=%d errno=%d", ERR(xs(1, lp(), &st)));
}
CASE(__xstat, hostile)
{
    xstat_cases("__xstat");
}
CASE(__xstat64, hostile)
{
    xstat_cases("__xstat64");
}
CASE(stat, hostile)
{
    struct stat st;
    SAY("NULL path rc=%d errno=%d", ERR(stat(NULL, &st)));
    SAY("NULL buf rc=%d errno=%d", ERR(stat(ptx_path, NULL)));
    SAY("empty rc=%d errno=%d", ERR(stat("", &st)));
    SAY("long rc=%d errno=%d", ERR(stat(lp(), &st)));
}
CASE(access, hostile)
{
    SAY("NULL rc=%d errno=%d", ERR(access(NULL, R_OK)));
    SAY("bad mode rc=%d errno=%d", ERR(access(ptx_path, 0x77)));
    SAY("long rc=%d errno=%d", ERR(access(lp(), F_OK)));
}
/* The exec family, posix_spawn, system, popen, _exit (shim/tree.c): outside
 * an nvcc tree the shim only passes them on. Each run in a child. */
static void exec_child(int (*fn)(void))
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn();
        printf("returned rc=%d errno=%d\n", rc, errno);
        fflush(stdout);
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    SAY("child status %d", ws);
}
static char *const no_argv[] = {"x", NULL};
static char *const no_env[] = {NULL};
static int x_execve_null(void)
{
    return execve(NULL, no_argv, no_env);
}
static int x_execve_missing(void)
{
    return execve("/nonexistent/x", no_argv, no_env);
}
static int x_execve_dir(void)
{
    return execve("/", no_argv, no_env);
}
static int x_execv_long(void)
{
    return execv(lp(), no_argv);
}
static int x_execvp_missing(void)
{
    return execvp("kcache-no-such-program", no_argv);
}
static int x_execvp_empty(void)
{
    return execvp("", no_argv);
}
static int x_execvpe_missing(void)
{
    return execvpe("kcache-no-such-program", no_argv, no_env);
}
static int x_exit(void)
{
    _exit(7);
}
static int x_Exit(void)
{
    _Exit(9);
}
CASE(execve, hostile)
{
    exec_child(x_execve_null);
    exec_child(x_execve_missing);
    exec_child(x_execve_dir);
}
CASE(execv, hostile)
{
    exec_child(x_execv_long);
}
CASE(execvp, hostile)
{
    exec_child(x_execvp_missing);
    exec_child(x_execvp_empty);
}
CASE(execvpe, hostile)
{
    exec_child(x_execvpe_missing);
}
CASE(_exit, hostile)
{
    exec_child(x_exit);
}
CASE(_Exit, hostile)
{
    exec_child(x_Exit);
}
CASE(posix_spawn, hostile)
{
    pid_t pid = 0;
    SAY("missing rc=%d", posix_spawn(&pid, "/nonexistent/x", NULL, NULL, no_argv, no_env));
    SAY("dir rc=%d", posix_spawn(&pid, "/", NULL, NULL, no_argv, no_env));
}
CASE(posix_spawnp, hostile)
{
    pid_t pid = 0;
    SAY("missing rc=%d", posix_spawnp(&pid, "kcache-no-such-program", NULL, NULL, no_argv, no_env));
    SAY("long rc=%d", posix_spawnp(&pid, lp(), NULL, NULL, no_argv, no_env));
}
CASE(system, hostile)
{
    SAY("NULL rc=%d", system(NULL) != 0);
    fflush(stdout);
    SAY("exit 3 rc=%d", system("exit 3"));
}
CASE(popen, hostile)
{
    errno = 0;
    FILE *f = popen("true", "x");
    SAY("bad mode %s errno=%d", f == NULL ? "NULL" : "a stream", errno);
    if (f != NULL)
        pclose(f);
    f = popen("exit 4", "r");
    SAY("exit 4 status=%d", f != NULL ? pclose(f) : -1);
}
#define TREE_CASES                                                                                 \
    C(execve, hostile, NULL)                                                                       \
    C(execv, hostile, NULL)                                                                        \
    C(execvp, hostile, NULL)                                                                       \
    C(execvpe, hostile, NULL)                                                                      \
    C(_exit, hostile, NULL)                                                                        \
    C(_Exit, hostile, NULL)                                                                        \
    C(posix_spawn, hostile, NULL)                                                                  \
    C(posix_spawnp, hostile, NULL)                                                                 \
    C(system, hostile, NULL)                                                                       \
    C(popen, hostile, NULL)
CASE(dlsym, hostile)
{
    dlerror();
    void *p = dlsym(nv, "nvrtcNoSuchFunction");
    const char *e = dlerror();
    SAY("unknown in libnvrtc: %s error=%d", p ? "found" : "NULL", e != NULL);
    p = dlsym(RTLD_DEFAULT, "cuModuleLoadData");
    SAY("RTLD_DEFAULT cuModuleLoadData (libcuda RTLD_LOCAL): %s", p ? "found" : "NULL");
    p = dlsym(cu, "");
    SAY("empty name: %s", p ? "found" : "NULL");
}
/* The program neither links nor has loaded NVRTC into the global scope. */
CASE(dlsym, rtld_next)
{
    SAY("RTLD_NEXT nvrtcCompileProgram: %s",
        dlsym(RTLD_NEXT, "nvrtcCompileProgram") ? "found" : "NULL");
    SAY("RTLD_NEXT cuModuleLoadData: %s", dlsym(RTLD_NEXT, "cuModuleLoadData") ? "found" : "NULL");
    SAY("RTLD_DEFAULT nvrtcCompileProgram: %s",
        dlsym(RTLD_DEFAULT, "nvrtcCompileProgram") ? "found" : "NULL");
}
CASE(dlsym, null_name)
{
    SAY("%s", dlsym(nv, NULL) ? "found" : "NULL");
}
CASE(dlsym, garbage_handle)
{
    SAY("%s", dlsym(GARBAGE, "nvrtcVersion") ? "found" : "NULL");
}

/* ---- libNVVM (libnvvm.so.4, dlopen'ed like cuda.bindings.nvvm) ---------- */

static void *vm;
#define VM(name) ((__typeof__(&name))sym(vm, #name))

static const char vm_ir[] =
    "target triple = \"nvptx64-nvidia-cuda\"\n"
    "target datalayout = \"e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-"
    "i128:128:128-f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64\"\n"
    "define void @k(float* %p) {\n"
    "entry:\n"
    "  %v = load float, float* %p\n"
    "  %m = fmul float %v, 3.0\n"
    "  store float %m, float* %p\n"
    "  ret void\n"
    "}\n"
    "!nvvm.annotations = !{!0}\n"
    "!0 = !{void (float*)* @k, !\"kernel\", i32 1}\n"
    "!nvvmir.version = !{!1}\n"
    "!1 = !{i32 2, i32 0, i32 3, i32 2}\n";
static const char *vm_opts[] = {"-arch=compute_90"};

/* A program holding vm_ir (or `ir`), optionally verified and compiled. */
static nvvmProgram vm_prog(const char *ir, int verify, int compile)
{
    nvvmProgram p = NULL;
    if (VM(nvvmCreateProgram)(&p) != NVVM_SUCCESS)
        _exit(5);
    if (ir != NULL)
        SAY("add rc=%d", VM(nvvmAddModuleToProgram)(p, ir, strlen(ir), "k.ll"));
    if (verify)
        SAY("verify rc=%d", VM(nvvmVerifyProgram)(p, 1, vm_opts));
    if (compile)
        SAY("compile rc=%d", VM(nvvmCompileProgram)(p, 1, vm_opts));
    return p;
}

/* Every getter of p, with real buffers. */
static void vm_getters(nvvmProgram p, const char *what)
{
    size_t n = 7777;
    nvvmResult rc = VM(nvvmGetCompiledResultSize)(p, &n);
    SAY("%s: result size rc=%d n=%zu", what, rc, n);
    char *b = calloc(1, n < (1 << 20) ? n + 16 : 16);
    memset(b, 0x5a, n < (1 << 20) ? n + 16 : 16);
    rc = VM(nvvmGetCompiledResult)(p, b);
    SAY("%s: result rc=%d first=%.40s", what, rc, b);
    free(b);
    n = 7777;
    rc = VM(nvvmGetProgramLogSize)(p, &n);
    SAY("%s: log size rc=%d n=%zu", what, rc, n);
    b = calloc(1, n < (1 << 20) ? n + 16 : 16);
    rc = VM(nvvmGetProgramLog)(p, b);
    SAY("%s: log rc=%d log=%s", what, rc, b);
    free(b);
}

CASE(nvvmCreateProgram, null_prog)
{
    SAY("rc=%d", VM(nvvmCreateProgram)(NULL));
}

CASE(nvvmDestroyProgram, hostile)
{
    nvvmProgram p = NULL;
    SAY("null rc=%d", VM(nvvmDestroyProgram)(NULL));
    SAY("null handle rc=%d", VM(nvvmDestroyProgram)(&p));
    p = vm_prog(vm_ir, 1, 1);
    SAY("rc=%d %s", VM(nvvmDestroyProgram)(&p), p == NULL ? "NULL" : "set");
    SAY("twice rc=%d", VM(nvvmDestroyProgram)(&p));
}

static void vm_add_cases(nvvmResult (*add)(nvvmProgram, const char *, size_t, const char *))
{
    SAY("null prog rc=%d", add(NULL, vm_ir, strlen(vm_ir), "k"));
    nvvmProgram p = vm_prog(NULL, 0, 0);
    SAY("null buffer rc=%d", add(p, NULL, 10, "k"));
    SAY("size 0 rc=%d", add(p, vm_ir, 0, "k"));
    SAY("null name rc=%d", add(p, vm_ir, strlen(vm_ir), NULL));
    SAY("compile rc=%d", VM(nvvmCompileProgram)(p, 1, vm_opts));
    vm_getters(p, "size 0 and null name");
    VM(nvvmDestroyProgram)(&p);
    p = vm_prog(vm_ir, 1, 1);
    SAY("after compile rc=%d", add(p, vm_ir, strlen(vm_ir), "again"));
    vm_getters(p, "added after compile");
    SAY("compile again rc=%d", VM(nvvmCompileProgram)(p, 1, vm_opts));
    vm_getters(p, "compiled again");
    VM(nvvmDestroyProgram)(&p);
}

CASE(nvvmAddModuleToProgram, hostile)
{
    vm_add_cases(VM(nvvmAddModuleToProgram));
}

CASE(nvvmLazyAddModuleToProgram, hostile)
{
    vm_add_cases(VM(nvvmLazyAddModuleToProgram));
}

static void vm_event_cases(nvvmResult (*ev)(nvvmProgram, int, const char **), const char *name)
{
    const char *bad[] = {"-no-such-option"}, *nul[] = {"-arch=compute_90", NULL};
    SAY("%s null prog rc=%d", name, ev(NULL, 1, vm_opts));
    nvvmProgram p = vm_prog(NULL, 0, 0);
    SAY("%s empty rc=%d", name, ev(p, 0, NULL));
    vm_getters(p, "empty");
    VM(nvvmDestroyProgram)(&p);
    const char *cases[] = {"negative", "null array", "null entry", "bad option",
                           "garbage",  "twice",      "verified"};
    for (int i = 0; i < 7; i++) {
        p = vm_prog(i == 4 ? "this is not NVVM IR" : vm_ir, i == 6, 0);
        nvvmResult rc = i == 0   ? ev(p, -1, vm_opts)
                        : i == 1 ? ev(p, 2, NULL)
                        : i == 2 ? ev(p, 2, nul)
                        : i == 3 ? ev(p, 1, bad)
                                 : ev(p, 1, vm_opts);
        SAY("%s %s rc=%d", name, cases[i], rc);
        if (i == 5)
            SAY("%s %s again rc=%d", name, cases[i], ev(p, 1, vm_opts));
        vm_getters(p, cases[i]);
        VM(nvvmDestroyProgram)(&p);
    }
}

CASE(nvvmVerifyProgram, hostile)
{
    vm_event_cases(VM(nvvmVerifyProgram), "verify");
    nvvmProgram p = vm_prog(vm_ir, 0, 1);
    SAY("verify after compile rc=%d", VM(nvvmVerifyProgram)(p, 1, vm_opts));
    vm_getters(p, "verify after compile");
    VM(nvvmDestroyProgram)(&p);
}

CASE(nvvmCompileProgram, hostile)
{
    vm_event_cases(VM(nvvmCompileProgram), "compile");
}

CASE(nvvmCompileProgram, destroyed)
{
    nvvmProgram p = vm_prog(vm_ir, 1, 1), q = p;
    VM(nvvmDestroyProgram)(&p);
    SAY("rc=%d", VM(nvvmCompileProgram)(q, 1, vm_opts));
}

CASE(nvvmGetCompiledResultSize, hostile)
{
    size_t n = 7;
    SAY("null prog rc=%d n=%zu", VM(nvvmGetCompiledResultSize)(NULL, &n), n);
    for (int state = 0; state < 3; state++) {
        nvvmProgram p = state == 0   ? vm_prog(vm_ir, 0, 0)
                        : state == 1 ? vm_prog(vm_ir, 1, 1)
                                     : vm_prog("garbage", 1, 1);
        SAY("state %d: null size rc=%d", state, VM(nvvmGetCompiledResultSize)(p, NULL));
        vm_getters(p, "states");
        VM(nvvmDestroyProgram)(&p);
    }
}

CASE(nvvmGetCompiledResult, hostile)
{
    char b[8] = "xxxxxxx";
    SAY("null prog rc=%d %s", VM(nvvmGetCompiledResult)(NULL, b), b);
}

CASE(nvvmGetCompiledResult, null_buffer)
{
    nvvmProgram p = vm_prog(vm_ir, 1, 1);
    SAY("rc=%d", VM(nvvmGetCompiledResult)(p, NULL));
}

CASE(nvvmGetProgramLogSize, hostile)
{
    size_t n = 7;
    SAY("null prog rc=%d n=%zu", VM(nvvmGetProgramLogSize)(NULL, &n), n);
}

CASE(nvvmGetProgramLogSize, null_size)
{
    nvvmProgram p = vm_prog(vm_ir, 1, 1);
    SAY("rc=%d", VM(nvvmGetProgramLogSize)(p, NULL));
}

CASE(nvvmGetProgramLog, hostile)
{
    char b[8] = "xxxxxxx";
    SAY("null prog rc=%d %s", VM(nvvmGetProgramLog)(NULL, b), b);
}

CASE(nvvmGetProgramLog, null_buffer)
{
    nvvmProgram p = vm_prog("garbage", 1, 1);
    SAY("rc=%d", VM(nvvmGetProgramLog)(p, NULL));
}

CASE(nvvmVersion, null_args)
{
    int a = 7, b = 7;
    nvvmResult rc = VM(nvvmVersion)(&a, &b);
    SAY("rc=%d %d.%d", rc, a, b);
    SAY("null rc=%d", VM(nvvmVersion)(NULL, NULL));
}

CASE(nvvmIRVersion, null_args)
{
    int a = 7, b = 7, c = 7, d = 7;
    nvvmResult rc = VM(nvvmIRVersion)(&a, &b, &c, &d);
    SAY("rc=%d %d.%d %d.%d", rc, a, b, c, d);
    SAY("null rc=%d", VM(nvvmIRVersion)(NULL, NULL, NULL, NULL));
}

// clang-format off
#define NVVM_CASES                                                                                 \
    C(nvvmCreateProgram, null_prog, NULL)                                                          \
    C(nvvmDestroyProgram, hostile, NULL)                                                           \
    C(nvvmAddModuleToProgram, hostile, NULL)                                                       \
    C(nvvmLazyAddModuleToProgram, hostile, NULL)                                                   \
    C(nvvmVerifyProgram, hostile, NULL)                                                            \
    C(nvvmCompileProgram, hostile, NULL)                                                           \
    C(nvvmCompileProgram, destroyed, "libNVVM uses a destroyed program handle (use after free)")   \
    C(nvvmGetCompiledResultSize, hostile, NULL)                                                    \
    C(nvvmGetCompiledResult, hostile, NULL)                                                        \
    C(nvvmGetCompiledResult, null_buffer, "libNVVM writes through a NULL result buffer")           \
    C(nvvmGetProgramLogSize, hostile, NULL)                                                        \
    C(nvvmGetProgramLogSize, null_size, "libNVVM writes through a NULL size pointer")              \
    C(nvvmGetProgramLog, hostile, NULL)                                                            \
    C(nvvmGetProgramLog, null_buffer, "libNVVM writes through a NULL log buffer")                  \
    C(nvvmVersion, null_args, NULL)                                                                \
    C(nvvmIRVersion, null_args, NULL)
// clang-format on

#define C(hook, label, crash) {#hook, #label, hook##__##label, crash},
#define GETTER_ENTRIES(S, G)                                                                       \
    C(S, null_prog, NULL) C(S, states, NULL) C(G, null_prog, NULL) C(G, null_out, NULL)
static const struct hcase cases[] = {
    C(nvrtcCreateProgram, null_prog, NULL) C(nvrtcCreateProgram, null_src, NULL) C(
        nvrtcCreateProgram, null_name, NULL) C(nvrtcCreateProgram, negative_headers,
                                               NULL) C(nvrtcCreateProgram, huge_headers_null_arrays,
                                                       NULL) C(nvrtcCreateProgram,
                                                               header_null_entries, NULL)
        C(nvrtcCreateProgram, header_null_name, NULL) C(nvrtcDestroyProgram, null, NULL) C(
            nvrtcDestroyProgram, null_handle, NULL) C(nvrtcDestroyProgram, twice, NULL)
            C(nvrtcDestroyProgram, garbage, "NVRTC dereferences a non-NULL garbage program handle")
                C(nvrtcCompileProgram,
                  null_prog, NULL) C(nvrtcCompileProgram, huge_options_null_array,
                                     NULL) C(nvrtcCompileProgram, negative_options,
                                             NULL) C(nvrtcCompileProgram, null_option_entry, NULL)
                    C(nvrtcCompileProgram, bad_option, NULL) C(
                        nvrtcCompileProgram, oversized_option,
                        NULL) C(nvrtcCompileProgram, twice, NULL)
                        C(nvrtcCompileProgram, destroyed,
                          "NVRTC uses a destroyed program handle (use after free)")
                            C(nvrtcAddNameExpression, null_prog, NULL) C(
                                nvrtcAddNameExpression,
                                null_expr, NULL) C(nvrtcAddNameExpression, after_compile, NULL)
                                C(nvrtcAddNameExpression, empty_and_bad,
                                  NULL) C(nvrtcGetLoweredName, null_prog, NULL)
                                    C(nvrtcGetLoweredName, before_compile,
                                      NULL) C(nvrtcGetLoweredName, after_compile, NULL)
                                        C(nvrtcGetLoweredName, failed_compile, NULL) GETTERS(
                                            GETTER_ENTRIES) C(nvrtcGetNVVMSize, release, NULL)
                                            C(nvrtcGetNVVM, release, NULL) C(nvrtcGetTileIRSize,
                                                                             release, NULL)
                                                C(nvrtcGetTileIR, release,
                                                  NULL) C(nvrtcGetPCHCreateStatus, null_prog, NULL)
                                                    C(nvrtcGetPCHCreateStatus, states, NULL) C(
                                                        nvrtcGetPCHHeapSizeRequired, null_prog,
                                                        NULL) C(nvrtcGetPCHHeapSizeRequired, states,
                                                                NULL) C(nvrtcSetFlowCallback,
                                                                        null_prog, NULL)
                                                        C(nvrtcSetFlowCallback,
                                                          null_callback, NULL) C(nvrtcVersion, null_args, NULL) C(cuModuleLoadData, images, NULL) C(cuModuleLoadData, unterminated_ptx, "the driver reads a PTX image up to its NUL: one that has none runs off the mapping") C(cuModuleLoadData, fatbin_claiming_huge_size, "the driver walks the fatbinary as far as its header claims, past the mapping") C(cuModuleLoadData,
                                                                                                                                                                                                                                                                                                                                                                                                               fatbin_wrapper_null_data,
                                                                                                                                                                                                                                                                                                                                                                                                               "the driver follows the wrapper's data pointer (NULL)") C(cuModuleLoadData,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                         no_context, NULL) C(cuModuleLoadData,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                             null_out,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                             NULL) C(cuModuleLoadDataEx, options, NULL) C(cuModuleLoadFatBinary,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                          ptx_and_null,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                          NULL) C(cuModuleLoad, hostile, NULL) C(cuLibraryLoadFromFile,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 hostile,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 NULL) C(cuLibraryLoadData,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                         options,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                         NULL) C(cuGetProcAddress,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                 hostile, NULL) C(cuGetProcAddress_v2, hostile, NULL) C(cuGetProcAddress_v2,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                        before_init, NULL) C(cuModuleGetFunction, hostile, NULL) C(cuLibraryGetKernel, hostile, NULL) C(cuKernelGetFunction, hostile, NULL) C(cuModuleUnload, before_init, NULL) C(cuModuleUnload,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                   other_context, NULL) C(cuLibraryUnload,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                          null, NULL) C(cuCtxDestroy, hostile, NULL) C(cuCtxDestroy_v2,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                       hostile, NULL) C(cuDevicePrimaryCtxRetain, hostile, NULL) C(cuDevicePrimaryCtxRelease, hostile, NULL) C(cuDevicePrimaryCtxRelease_v2, hostile, NULL) C(cuDevicePrimaryCtxReset,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                              hostile, NULL) C(cuDevicePrimaryCtxReset_v2, hostile, NULL) C(cuMemAlloc_v2, hostile, NULL) C(cuMemFree_v2, hostile, NULL) C(cuMemGetInfo_v2, hostile, NULL) C(cuMemGetInfo,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                             hostile,
                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                                             NULL)
                                                            C(cuMemGetAddressRange_v2, hostile, NULL) C(cuPointerGetAttribute, hostile, NULL) C(
                                                                cuPointerGetAttributes,
                                                                hostile,
                                                                NULL) C(cuPointerSetAttribute, hostile, NULL)
#define JL_ENTRY(fn) C(fn, hostile, NULL) C(__##fn##_13_0, hostile, NULL)
                                                                JL_ENTRY(nvJitLinkCreate) C(
                                                                    nvJitLinkCreate,
                                                                    null_option_entry,
                                                                    "nvJitLink dereferences a NULL "
                                                                    "option") JL_ENTRY(nvJitLinkDestroy) JL_ENTRY(nvJitLinkAddData) JL_ENTRY(nvJitLinkAddFile) JL_ENTRY(nvJitLinkComplete)
#define JL_GETTER_ENTRIES(S, G) JL_ENTRY(S) JL_ENTRY(G)
                                                                    JL_GETTERS(JL_GETTER_ENTRIES) C(nvJitLinkGetLinkedLTOIRSize, absent, NULL) C(
                                                                        nvJitLinkGetLinkedLTOIR,
                                                                        absent,
                                                                        NULL) C(nvJitLinkVersion, null_args, NULL)
                                                                        C(cuLinkCreate, hostile, NULL) C(
                                                                            cuLinkCreate_v2,
                                                                            hostile,
                                                                            NULL) C(cuLinkAddData, hostile, NULL)
                                                                            C(cuLinkAddData_v2, hostile, NULL) C(
                                                                                cuLinkAddFile,
                                                                                hostile,
                                                                                NULL) C(cuLinkAddFile_v2, hostile, NULL)
                                                                                C(cuLinkComplete, hostile, NULL) C(
                                                                                    cuLinkDestroy,
                                                                                    hostile,
                                                                                    NULL) C(open, hostile, NULL)
                                                                                    C(open64, hostile, NULL) C(openat, hostile, NULL) C(
                                                                                        openat64,
                                                                                        hostile,
                                                                                        NULL) C(fopen, hostile, NULL)
                                                                                        C(fopen, null_path, NULL) C(
                                                                                            fopen,
                                                                                            null_mode,
                                                                                            "gl"
                                                                                            "ib"
                                                                                            "c'"
                                                                                            "s "
                                                                                            "fo"
                                                                                            "pe"
                                                                                            "n "
                                                                                            "de"
                                                                                            "re"
                                                                                            "fe"
                                                                                            "re"
                                                                                            "nc"
                                                                                            "es"
                                                                                            " a"
                                                                                            " N"
                                                                                            "UL"
                                                                                            "L "
                                                                                            "mo"
                                                                                            "d"
                                                                                            "e") C(fopen64,
                                                                                                   hostile,
                                                                                                   NULL) C(__xstat,
                                                                                                           hostile, NULL)
                                                                                            C(__xstat64,
                                                                                              hostile,
                                                                                              NULL) C(stat, hostile, NULL)
                                                                                                C(access,
                                                                                                  hostile,
                                                                                                  NULL) C(dlsym, hostile, NULL)
                                                                                                    C(dlsym,
                                                                                                      rtld_next,
                                                                                                      NULL)
                                                                                                        C(dlsym,
                                                                                                          null_name,
                                                                                                          "glibc's dlsym dereferences a NULL name")
                                                                                                            C(dlsym,
                                                                                                              garbage_handle,
                                                                                                              "glibc's dlsym dereferences a garbage handle")
                                                                                                                NVVM_CASES
                                                                                                                    TREE_CASES};
#define N_CASES (sizeof cases / sizeof cases[0])

static int nofork;

static int run_case(const struct hcase *c)
{
    printf("### %s %s\n", c->hook, c->label);
    fflush(stdout);
    if (nofork) {
        c->run();
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        alarm(120);
        c->run();
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    if (WIFSIGNALED(st))
        SAY("CRASH signal %d", WTERMSIG(st));
    else if (WEXITSTATUS(st) != 0)
        SAY("EXIT %d", WEXITSTATUS(st));
    return 0;
}

int main(int argc, char **argv)
{
    int list = 0, crashers = 0;
    const char *only = NULL, *only_label = NULL;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--list"))
            list = 1;
        else if (!strcmp(argv[i], "--crashers"))
            crashers = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--label") && i + 1 < argc)
            only_label = argv[++i];
        else if (!strcmp(argv[i], "--no-fork")) /* one case, in this process (debugging) */
            nofork = 1;
    }
    if (list) {
        for (size_t k = 0; k < N_CASES; k++)
            printf("%s %s%s%s\n", cases[k].hook, cases[k].label, cases[k].crash ? " crash: " : "",
                   cases[k].crash ? cases[k].crash : "");
        return 0;
    }
    if (i >= argc) {
        fprintf(stderr, "usage: hostile [--list] [--crashers] [--only HOOK] [--label LABEL] "
                        "[--no-fork] PTX_FILE\n");
        return 2;
    }
    ptx_path = argv[i];
    FILE *f = fopen(ptx_path, "rb");
    if (!f)
        return 2;
    ptx = calloc(1, 1 << 20);
    ptx_len = fread(ptx, 1, (1 << 20) - 1, f);
    fclose(f);
    /* Another NVRTC release for the cases of the getters it alone has. */
    const char *nvrtc = getenv("KC_HOSTILE_NVRTC");
    nv =
        dlopen(nvrtc != NULL && nvrtc[0] != '\0' ? nvrtc : "libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    jl = dlopen("libnvJitLink.so.13", RTLD_NOW | RTLD_LOCAL);
    vm = dlopen("libnvvm.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!nv || !cu || !jl || !vm) {
        fprintf(stderr, "hostile: dlopen: %s\n", dlerror());
        return 2;
    }
    for (size_t k = 0; k < N_CASES; k++) {
        if ((cases[k].crash != NULL) != crashers)
            continue;
        if (only && strcmp(only, cases[k].hook))
            continue;
        if (only_label && strcmp(only_label, cases[k].label))
            continue;
        if (run_case(&cases[k]) != 0)
            return 2;
    }
    return 0;
}
