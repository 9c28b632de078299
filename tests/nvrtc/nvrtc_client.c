/*
 * nvrtc_client: a test client that compiles a fixed set of NVRTC programs and
 * records every return code and every output byte into a dump file, so that
 * runs with and without the kcache shim can be compared byte for byte.
 *
 * Built twice: linked against libnvrtc (calls go through the PLT), and with
 * KC_CLIENT_DLOPEN, where libnvrtc.so.13 is dlopen()ed and every entry point
 * is taken with dlsym() -- the route PyTorch, CuPy and cuda-python take.
 *
 * Usage: nvrtc_client --dump FILE [--incdir DIR]... [--trace FILE]
 *                     [--threads N | --rounds N] [--cases a,b,...]
 *                     [--barrier-stdin] [--list]
 *
 * --rounds N runs the set N times in one process; after each round but the
 * last it prints "nvrtc_client: round R done" and waits for a line on stdin.
 * --barrier-stdin waits for EOF on stdin before compiling anything.
 *
 * The dump is a sequence of records "@<label> rc=<int> len=<n>\n<n bytes>\n".
 * Records are written in a fixed order whatever the thread schedule: in the
 * threaded mode each thread fills its own buffers and the dump holds thread
 * 0's records, then thread 1's, and so on, each preceded by "=== thread i";
 * each case's records are preceded by "### case <name>". Only thread 0 runs
 * the automatic-PCH case, whose result depends on what ran before it.
 *
 * stdout gets one summary line: how many compiles were made that the cache
 * should serve (cacheable), that it must not cache (uncached: errors other
 * than NVRTC_ERROR_COMPILATION) and that must pass through (passthrough:
 * requests with side effects on disk). The test script checks the shim's
 * KCACHE_STATS line against these numbers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nvrtc.h>

#ifdef KC_CLIENT_DLOPEN
#include <dlfcn.h>

#define KC_NVRTC_FUNCS(X)                                                                          \
    X(nvrtcGetErrorString)                                                                         \
    X(nvrtcVersion)                                                                                \
    X(nvrtcGetNumSupportedArchs)                                                                   \
    X(nvrtcGetSupportedArchs)                                                                      \
    X(nvrtcCreateProgram)                                                                          \
    X(nvrtcDestroyProgram)                                                                         \
    X(nvrtcCompileProgram)                                                                         \
    X(nvrtcGetPTXSize)                                                                             \
    X(nvrtcGetPTX)                                                                                 \
    X(nvrtcGetCUBINSize)                                                                           \
    X(nvrtcGetCUBIN)                                                                               \
    X(nvrtcGetLTOIRSize)                                                                           \
    X(nvrtcGetLTOIR)                                                                               \
    X(nvrtcGetOptiXIRSize)                                                                         \
    X(nvrtcGetOptiXIR)                                                                             \
    X(nvrtcGetProgramLogSize)                                                                      \
    X(nvrtcGetProgramLog)                                                                          \
    X(nvrtcAddNameExpression)                                                                      \
    X(nvrtcGetLoweredName)                                                                         \
    X(nvrtcGetPCHHeapSize)                                                                         \
    X(nvrtcGetPCHCreateStatus)                                                                     \
    X(nvrtcGetPCHHeapSizeRequired)

#define KC_DECLARE(fn) static __typeof__(&fn) dl_##fn;
KC_NVRTC_FUNCS(KC_DECLARE)
#define N(fn) (dl_##fn)

static void load_nvrtc(void)
{
    void *h = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "nvrtc_client: dlopen: %s\n", dlerror());
        exit(2);
    }
#define KC_LOAD(fn)                                                                                \
    dl_##fn = (__typeof__(&fn))dlsym(h, #fn);                                                      \
    if (!dl_##fn) {                                                                                \
        fprintf(stderr, "nvrtc_client: dlsym %s: %s\n", #fn, dlerror());                           \
        exit(2);                                                                                   \
    }
    KC_NVRTC_FUNCS(KC_LOAD)
}
#else
#define N(fn) fn
static void load_nvrtc(void) {}
#endif

/* A growable byte buffer holding one case's records. */
struct buf {
    char *p;
    size_t len, cap;
};

static void buf_put(struct buf *b, const void *data, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) {
            perror("realloc");
            exit(2);
        }
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void buf_printf(struct buf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* One record: label, return code, and the bytes (len may be 0). */
static void rec(struct buf *b, const char *label, int rc, const void *data, size_t len)
{
    buf_printf(b, "@%s rc=%d len=%zu\n", label, rc, len);
    if (len)
        buf_put(b, data, len);
    buf_put(b, "\n", 1);
}

static void rec_str(struct buf *b, const char *label, int rc, const char *s)
{
    rec(b, label, rc, s, s ? strlen(s) : 0);
}

struct counts {
    int cacheable;   /* compiles the cache serves (including replayed errors) */
    int uncached;    /* compiles whose error must never be cached */
    int passthrough; /* compiles with side effects on disk */
};

#define MAX_INCDIRS 4

struct ctx {
    int n_incdirs;
    const char *incdirs[MAX_INCDIRS]; /* -I directories, in order */
    const char *trace;                /* time-trace output file */
    struct counts counts;
};

typedef nvrtcResult (*size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*get_fn)(nvrtcProgram, char *);

/* Asks for one output: its size, then its bytes into a buffer of that size
 * (plus a canary byte that must stay untouched). */
static void rec_output(struct buf *b, nvrtcProgram prog, const char *what, size_fn size_call,
                       get_fn get_call)
{
    char label[64];
    size_t size = (size_t)-1;
    nvrtcResult rc = size_call(prog, &size);
    snprintf(label, sizeof label, "%s.size", what);
    buf_printf(b, "@%s rc=%d value=%zd\n", label, (int)rc,
               rc == NVRTC_SUCCESS ? (ssize_t)size : (ssize_t)-1);
    size_t n = rc == NVRTC_SUCCESS ? size : 0;
    char *out = malloc(n + 1);
    if (!out)
        exit(2);
    memset(out, 0xA5, n + 1);
    rc = get_call(prog, out);
    snprintf(label, sizeof label, "%s.bytes", what);
    rec(b, label, rc, out, rc == NVRTC_SUCCESS ? n : 0);
    snprintf(label, sizeof label, "%s.canary", what);
    buf_printf(b, "@%s %s\n", label, (unsigned char)out[n] == 0xA5 ? "intact" : "overwritten");
    free(out);
}

/* Records every output a program can give. */
static void rec_all_outputs(struct buf *b, nvrtcProgram prog)
{
    rec_output(b, prog, "log", N(nvrtcGetProgramLogSize), N(nvrtcGetProgramLog));
    rec_output(b, prog, "ptx", N(nvrtcGetPTXSize), N(nvrtcGetPTX));
    rec_output(b, prog, "cubin", N(nvrtcGetCUBINSize), N(nvrtcGetCUBIN));
    rec_output(b, prog, "ltoir", N(nvrtcGetLTOIRSize), N(nvrtcGetLTOIR));
    rec_output(b, prog, "optixir", N(nvrtcGetOptiXIRSize), N(nvrtcGetOptiXIR));
}

static void rec_lowered(struct buf *b, nvrtcProgram prog, const char *expr)
{
    const char *lowered = NULL;
    char label[160];
    nvrtcResult rc = N(nvrtcGetLoweredName)(prog, expr, &lowered);
    snprintf(label, sizeof label, "lowered[%s]", expr);
    rec_str(b, label, rc, rc == NVRTC_SUCCESS ? lowered : NULL);
}

/*
 * One whole program: create, add name expressions, compile, record all
 * outputs and lowered names, destroy. kind says how the compile is counted.
 */
enum kind { CACHEABLE, UNCACHED, PASSTHROUGH };

struct prog_spec {
    const char *src;
    const char *name;
    int n_headers;
    const char *const *headers;
    const char *const *include_names;
    int n_opts;
    const char *const *opts;
    int n_exprs;
    const char *const *exprs;
};

static void compile_case(struct buf *b, struct ctx *c, const struct prog_spec *s, enum kind kind)
{
    nvrtcProgram prog = NULL;
    nvrtcResult rc =
        N(nvrtcCreateProgram)(&prog, s->src, s->name, s->n_headers, s->headers, s->include_names);
    rec(b, "create", rc, NULL, 0);
    if (rc != NVRTC_SUCCESS)
        return;
    for (int i = 0; i < s->n_exprs; i++) {
        rc = N(nvrtcAddNameExpression)(prog, s->exprs[i]);
        rec_str(b, "add_name_expression", rc, s->exprs[i]);
    }
    /* Lowered names before compiling are an error NVRTC reports itself. */
    if (s->n_exprs)
        rec_lowered(b, prog, s->exprs[0]);
    rc = N(nvrtcCompileProgram)(prog, s->n_opts, s->opts);
    rec(b, "compile", rc, NULL, 0);
    switch (kind) {
    case CACHEABLE:
        c->counts.cacheable++;
        break;
    case UNCACHED:
        c->counts.uncached++;
        break;
    case PASSTHROUGH:
        c->counts.passthrough++;
        break;
    }
    rec_all_outputs(b, prog);
    for (int i = 0; i < s->n_exprs; i++)
        rec_lowered(b, prog, s->exprs[i]);
    /* Lowered names stay valid until the program is destroyed: read them all
     * again after the other calls and check they did not move or change. */
    for (int i = 0; i < s->n_exprs; i++) {
        const char *a = NULL, *z = NULL;
        N(nvrtcGetLoweredName)(prog, s->exprs[i], &a);
        struct buf scratch = {0};
        rec_all_outputs(&scratch, prog); /* interleave other calls */
        free(scratch.p);
        N(nvrtcGetLoweredName)(prog, s->exprs[i], &z);
        buf_printf(b, "@lowered_stable[%s] %s\n", s->exprs[i],
                   (a == z || (a && z && !strcmp(a, z))) ? "yes" : "no");
    }
    if (s->n_exprs) {
        rc = N(nvrtcAddNameExpression)(prog, "late_expression");
        rec(b, "add_name_expression_after_compile", rc, NULL, 0);
        rec_lowered(b, prog, "never_added<int>");
    }
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "destroy", rc, NULL, 0);
    buf_printf(b, "@destroy.handle_nulled %s\n", prog == NULL ? "yes" : "no");
}

#define ARRAY_N(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- The cases ---------------------------------------------------------- */

static const char saxpy_src[] =
    "extern \"C\" __global__ void saxpy(float a, const float *x, float *y,\n"
    "                                   int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

/* A plain PTX target: a virtual architecture only. */
static void case_ptx(struct buf *b, struct ctx *c)
{
    static const char *opts[] = {"--gpu-architecture=compute_90", "-default-device"};
    struct prog_spec s = {
        .src = saxpy_src, .name = "saxpy.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* A real architecture: PTX and CUBIN. */
static void case_cubin(struct buf *b, struct ctx *c)
{
    static const char *opts[] = {"-arch=sm_90", "--use_fast_math", "-lineinfo"};
    struct prog_spec s = {
        .src = saxpy_src, .name = "saxpy_sm90.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* No options at all (NULL option array), no name. */
static void case_noopts(struct buf *b, struct ctx *c)
{
    struct prog_spec s = {.src = saxpy_src, .name = NULL};
    compile_case(b, c, &s, CACHEABLE);
}

/* cuda::std headers: NVRTC reads some 300 headers from disk for this one. */
static void case_std_complex(struct buf *b, struct ctx *c)
{
    static const char src[] = "#include <cuda/std/complex>\n"
                              "#include <cuda/std/type_traits>\n"
                              "using cplx = cuda::std::complex<float>;\n"
                              "extern \"C\" __global__ void butterfly(cplx *data, cplx w, int n)\n"
                              "{\n"
                              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                              "    if (i >= n / 2) return;\n"
                              "    cplx a = data[i], t = w * data[i + n / 2];\n"
                              "    data[i] = a + t;\n"
                              "    data[i + n / 2] = cuda::std::exp(a - t);\n"
                              "}\n";
    static const char *opts[] = {"-arch=sm_90", "-std=c++17", "-I/usr/local/cuda/include/cccl",
                                 "-I/usr/local/cuda/include"};
    struct prog_spec s = {
        .src = src, .name = "butterfly.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* Templates with name expressions. */
static void case_name_expr(struct buf *b, struct ctx *c)
{
    static const char src[] = "namespace ops {\n"
                              "template <typename T, int N>\n"
                              "__global__ void scale(T *x, T s)\n"
                              "{\n"
                              "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                              "#pragma unroll\n"
                              "    for (int k = 0; k < N; k++) x[i * N + k] *= s;\n"
                              "}\n"
                              "template <typename T> __device__ T bias;\n"
                              "template __device__ float bias<float>;\n"
                              "}\n";
    static const char *opts[] = {"-arch=compute_90", "-std=c++17"};
    static const char *exprs[] = {"ops::scale<float, 4>", "&ops::scale<double, 8>",
                                  "ops::scale<int,2>", "&ops::bias<float>"};
    struct prog_spec s = {.src = src,
                          .name = "scale.cu",
                          .n_opts = ARRAY_N(opts),
                          .opts = opts,
                          .n_exprs = ARRAY_N(exprs),
                          .exprs = exprs};
    compile_case(b, c, &s, CACHEABLE);
}

/* A header found through the -I directories the test script created (the
 * first may lack it: NVRTC then probes it and goes on to the next). */
static void case_incdir(struct buf *b, struct ctx *c)
{
    static const char src[] = "#include \"kc_test_header.h\"\n"
                              "extern \"C\" __global__ void fill(unsigned *out)\n"
                              "{\n"
                              "    out[threadIdx.x] = KC_TEST_VALUE + threadIdx.x;\n"
                              "}\n";
    char inc[MAX_INCDIRS][4096];
    const char *opts[1 + MAX_INCDIRS] = {"-arch=compute_90"};
    if (!c->n_incdirs) {
        rec(b, "incdir.skipped", 0, NULL, 0);
        return;
    }
    for (int i = 0; i < c->n_incdirs; i++) {
        snprintf(inc[i], sizeof inc[i], "-I%s", c->incdirs[i]);
        opts[1 + i] = inc[i];
    }
    struct prog_spec s = {.src = src, .name = "fill.cu", .n_opts = 1 + c->n_incdirs, .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* In-memory headers, one with a directory in its include name. */
static void case_mem_headers(struct buf *b, struct ctx *c)
{
    static const char src[] = "#include \"mem_a.h\"\n"
                              "#include <sub/mem_b.h>\n"
                              "extern \"C\" __global__ void k(int *o) { o[0] = MEM_A * MEM_B; }\n";
    static const char *headers[] = {"#define MEM_A 17\n", "#pragma once\n#define MEM_B 23\n"};
    static const char *names[] = {"mem_a.h", "sub/mem_b.h"};
    static const char *opts[] = {"-arch=sm_90"};
    struct prog_spec s = {.src = src,
                          .name = "mem.cu",
                          .n_headers = 2,
                          .headers = headers,
                          .include_names = names,
                          .n_opts = ARRAY_N(opts),
                          .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* A compile error: NVRTC_ERROR_COMPILATION and its log, replayed exactly. */
static void case_compile_error(struct buf *b, struct ctx *c)
{
    static const char src[] = "extern \"C\" __global__ void broken(int *o)\n"
                              "{\n"
                              "    o[0] = undeclared_thing + 1;\n"
                              "    int unused_variable;\n"
                              "}\n";
    static const char *opts[] = {"-arch=sm_90"};
    struct prog_spec s = {.src = src, .name = "broken.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* A warning but no error: the log of a successful compile. */
static void case_warning(struct buf *b, struct ctx *c)
{
    static const char src[] = "extern \"C\" __global__ void warns(int *o)\n"
                              "{\n"
                              "    int unused_variable;\n"
                              "    o[0] = 1;\n"
                              "}\n";
    static const char *opts[] = {"-arch=compute_90", "--display-error-number"};
    struct prog_spec s = {.src = src, .name = "warns.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* -dlto: LTO IR only; PTX and CUBIN requests get NVRTC's own answer. */
static void case_dlto(struct buf *b, struct ctx *c)
{
    static const char *opts[] = {"-arch=sm_90", "-dlto", "-rdc=true"};
    struct prog_spec s = {
        .src = saxpy_src, .name = "saxpy_lto.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, CACHEABLE);
}

/* An invalid option: an error that must never be cached. */
static void case_bad_option(struct buf *b, struct ctx *c)
{
    static const char *opts[] = {"-arch=sm_90", "--no-such-option-kcache"};
    struct prog_spec s = {
        .src = saxpy_src, .name = "saxpy_bad.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, UNCACHED);
}

/* A time trace: a side effect on disk, so it passes through. The trace file
 * must be written on every run, hit or not. */
static void case_time_trace(struct buf *b, struct ctx *c)
{
    char opt[4096];
    if (!c->trace) {
        rec(b, "trace.skipped", 0, NULL, 0);
        return;
    }
    char written[4200];
    snprintf(written, sizeof written, "%s.json", c->trace);
    unlink(c->trace);
    unlink(written);
    snprintf(opt, sizeof opt, "--fdevice-time-trace=%s", c->trace);
    const char *opts[] = {"-arch=compute_90", opt};
    struct prog_spec s = {
        .src = saxpy_src, .name = "saxpy_trace.cu", .n_opts = ARRAY_N(opts), .opts = opts};
    compile_case(b, c, &s, PASSTHROUGH);
    struct stat st;
    /* NVRTC 13 appends ".json" to the name it is given. */
    bool ok =
        (stat(c->trace, &st) == 0 && st.st_size > 0) || (stat(written, &st) == 0 && st.st_size > 0);
    buf_printf(b, "@trace.written %s\n", ok ? "yes" : "no");
}

/* Calls on an invalid and on a destroyed handle. */
static void case_bad_handle(struct buf *b, struct ctx *c)
{
    nvrtcProgram prog = NULL;
    nvrtcResult rc;
    size_t size = 12345;
    const char *lowered = (const char *)1;
    char out[16];

    /* NULL handle. */
    rc = N(nvrtcCompileProgram)(NULL, 0, NULL);
    rec(b, "null_handle.compile", rc, NULL, 0);
    rc = N(nvrtcGetPTXSize)(NULL, &size);
    rec(b, "null_handle.ptx_size", rc, NULL, 0);
    rc = N(nvrtcGetPTX)(NULL, out);
    rec(b, "null_handle.ptx", rc, NULL, 0);
    rc = N(nvrtcGetCUBINSize)(NULL, &size);
    rec(b, "null_handle.cubin_size", rc, NULL, 0);
    rc = N(nvrtcGetLTOIRSize)(NULL, &size);
    rec(b, "null_handle.ltoir_size", rc, NULL, 0);
    rc = N(nvrtcGetOptiXIRSize)(NULL, &size);
    rec(b, "null_handle.optixir_size", rc, NULL, 0);
    rc = N(nvrtcGetProgramLogSize)(NULL, &size);
    rec(b, "null_handle.log_size", rc, NULL, 0);
    rc = N(nvrtcGetProgramLog)(NULL, out);
    rec(b, "null_handle.log", rc, NULL, 0);
    rc = N(nvrtcAddNameExpression)(NULL, "f");
    rec(b, "null_handle.add_name", rc, NULL, 0);
    rc = N(nvrtcGetLoweredName)(NULL, "f", &lowered);
    rec(b, "null_handle.lowered", rc, NULL, 0);
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "null_handle.destroy", rc, NULL, 0);
    rc = N(nvrtcDestroyProgram)(NULL);
    rec(b, "null_pointer.destroy", rc, NULL, 0);

    /* A destroyed handle: nvrtcDestroyProgram sets it to NULL, and every
     * later call on it gets NVRTC's error. (A copy of the old pointer is
     * not checked by NVRTC itself -- using it corrupts the heap -- so the
     * test does not do that.) */
    rc = N(nvrtcCreateProgram)(&prog, saxpy_src, "destroyed.cu", 0, NULL, NULL);
    rec(b, "destroyed.create", rc, NULL, 0);
    if (rc != NVRTC_SUCCESS)
        return;
    static const char *opts[] = {"-arch=compute_90"};
    rc = N(nvrtcCompileProgram)(prog, 1, opts);
    rec(b, "destroyed.compile_before_destroy", rc, NULL, 0);
    c->counts.cacheable++;
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "destroyed.destroy", rc, NULL, 0);
    buf_printf(b, "@destroyed.handle_nulled %s\n", prog == NULL ? "yes" : "no");
    if (prog != NULL)
        return;
    rc = N(nvrtcGetPTXSize)(prog, &size);
    rec(b, "destroyed.ptx_size", rc, NULL, 0);
    rc = N(nvrtcGetProgramLogSize)(prog, &size);
    rec(b, "destroyed.log_size", rc, NULL, 0);
    rc = N(nvrtcGetLoweredName)(prog, "saxpy", &lowered);
    rec(b, "destroyed.lowered", rc, NULL, 0);
    rc = N(nvrtcCompileProgram)(prog, 1, opts);
    rec(b, "destroyed.compile", rc, NULL, 0);
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "destroyed.destroy_again", rc, NULL, 0);
}

/* NULL arguments everywhere NVRTC checks for them. */
static void case_null_args(struct buf *b, struct ctx *c)
{
    nvrtcProgram prog = NULL;
    nvrtcResult rc;
    const char *lowered = NULL;

    rc = N(nvrtcCreateProgram)(NULL, saxpy_src, "x.cu", 0, NULL, NULL);
    rec(b, "create.null_prog", rc, NULL, 0);
    rc = N(nvrtcCreateProgram)(&prog, NULL, "x.cu", 0, NULL, NULL);
    rec(b, "create.null_src", rc, NULL, 0);
    rc = N(nvrtcCreateProgram)(&prog, saxpy_src, "x.cu", -1, NULL, NULL);
    rec(b, "create.negative_headers", rc, NULL, 0);
    rc = N(nvrtcCreateProgram)(&prog, saxpy_src, "x.cu", 1, NULL, NULL);
    rec(b, "create.null_headers", rc, NULL, 0);
    if (prog && rc == NVRTC_SUCCESS)
        N(nvrtcDestroyProgram)(&prog);
    prog = NULL;

    rc = N(nvrtcCreateProgram)(&prog, saxpy_src, "nullargs.cu", 0, NULL, NULL);
    rec(b, "create", rc, NULL, 0);
    if (rc != NVRTC_SUCCESS)
        return;
    rc = N(nvrtcAddNameExpression)(prog, NULL);
    rec(b, "add_name.null", rc, NULL, 0);
    rc = N(nvrtcGetPTXSize)(prog, NULL);
    rec(b, "ptx_size.before_compile.null", rc, NULL, 0);
    size_t size = 777;
    rc = N(nvrtcGetPTXSize)(prog, &size);
    buf_printf(b, "@ptx_size.before_compile rc=%d value=%zd\n", (int)rc,
               rc == NVRTC_SUCCESS ? (ssize_t)size : (ssize_t)-1);
    rc = N(nvrtcGetProgramLogSize)(prog, &size);
    buf_printf(b, "@log_size.before_compile rc=%d value=%zd\n", (int)rc,
               rc == NVRTC_SUCCESS ? (ssize_t)size : (ssize_t)-1);
    /* A shim that hashes the options must not read a NULL array. */
    rc = N(nvrtcCompileProgram)(prog, 1, NULL);
    rec(b, "compile.null_options", rc, NULL, 0);
    c->counts.uncached++;
    rc = N(nvrtcCompileProgram)(prog, -3, NULL);
    rec(b, "compile.negative_options", rc, NULL, 0);
    c->counts.uncached++;
    static const char *opts[] = {"-arch=compute_90", "-DNULLARGS=1"};
    rc = N(nvrtcCompileProgram)(prog, 2, opts);
    rec(b, "compile", rc, NULL, 0);
    c->counts.cacheable++;
    rc = N(nvrtcGetPTXSize)(prog, NULL);
    rec(b, "ptx_size.null", rc, NULL, 0);
    rc = N(nvrtcGetPTX)(prog, NULL);
    rec(b, "ptx.null", rc, NULL, 0);
    rc = N(nvrtcGetCUBINSize)(prog, NULL);
    rec(b, "cubin_size.null", rc, NULL, 0);
    rc = N(nvrtcGetCUBIN)(prog, NULL);
    rec(b, "cubin.null", rc, NULL, 0);
    rc = N(nvrtcGetLTOIRSize)(prog, NULL);
    rec(b, "ltoir_size.null", rc, NULL, 0);
    rc = N(nvrtcGetLTOIR)(prog, NULL);
    rec(b, "ltoir.null", rc, NULL, 0);
    rc = N(nvrtcGetOptiXIRSize)(prog, NULL);
    rec(b, "optixir_size.null", rc, NULL, 0);
    rc = N(nvrtcGetOptiXIR)(prog, NULL);
    rec(b, "optixir.null", rc, NULL, 0);
    rc = N(nvrtcGetProgramLogSize)(prog, NULL);
    rec(b, "log_size.null", rc, NULL, 0);
    rc = N(nvrtcGetProgramLog)(prog, NULL);
    rec(b, "log.null", rc, NULL, 0);
    rc = N(nvrtcGetLoweredName)(prog, NULL, &lowered);
    rec(b, "lowered.null_expr", rc, NULL, 0);
    rc = N(nvrtcGetLoweredName)(prog, "saxpy", NULL);
    rec(b, "lowered.null_out", rc, NULL, 0);
    rec_all_outputs(b, prog);
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "destroy", rc, NULL, 0);
}

/* Library-level calls: version, architectures, PCH heap, error strings. */
static void case_info(struct buf *b, struct ctx *c)
{
    int major = -1, minor = -1, n = -1;
    nvrtcResult rc = N(nvrtcVersion)(&major, &minor);
    buf_printf(b, "@version rc=%d %d.%d\n", (int)rc, major, minor);
    rc = N(nvrtcGetNumSupportedArchs)(&n);
    buf_printf(b, "@num_archs rc=%d %d\n", (int)rc, n);
    if (rc == NVRTC_SUCCESS && n > 0 && n < 1000) {
        int archs[1000];
        rc = N(nvrtcGetSupportedArchs)(archs);
        buf_printf(b, "@archs rc=%d", (int)rc);
        for (int i = 0; i < n; i++)
            buf_printf(b, " %d", archs[i]);
        buf_printf(b, "\n");
    }
    size_t heap = 0;
    rc = N(nvrtcGetPCHHeapSize)(&heap);
    buf_printf(b, "@pch_heap_size rc=%d %zu\n", (int)rc, heap);
    for (int i = 0; i <= 18; i++) {
        char label[32];
        snprintf(label, sizeof label, "error_string[%d]", i);
        rec_str(b, label, 0, N(nvrtcGetErrorString)((nvrtcResult)i));
    }
}

/* Automatic PCH: passes through; its status calls answer as NVRTC's own. */
static void case_pch(struct buf *b, struct ctx *c)
{
    static const char src[] = "#include <cuda/std/type_traits>\n"
                              "extern \"C\" __global__ void pch_k(int *o)\n"
                              "{ o[0] = cuda::std::is_same<int, int>::value; }\n";
    static const char *opts[] = {"-arch=compute_90", "-pch", "-I/usr/local/cuda/include/cccl",
                                 "-I/usr/local/cuda/include"};
    nvrtcProgram prog = NULL;
    nvrtcResult rc = N(nvrtcCreateProgram)(&prog, src, "pch.cu", 0, NULL, NULL);
    rec(b, "create", rc, NULL, 0);
    if (rc != NVRTC_SUCCESS)
        return;
    rc = N(nvrtcCompileProgram)(prog, ARRAY_N(opts), opts);
    rec(b, "compile", rc, NULL, 0);
    c->counts.passthrough++;
    rc = N(nvrtcGetPCHCreateStatus)(prog);
    rec(b, "pch_create_status", rc, NULL, 0);
    size_t req = 0;
    rc = N(nvrtcGetPCHHeapSizeRequired)(prog, &req);
    buf_printf(b, "@pch_heap_required rc=%d nonzero=%d\n", (int)rc, req != 0);
    rec_output(b, prog, "ptx", N(nvrtcGetPTXSize), N(nvrtcGetPTX));
    rc = N(nvrtcDestroyProgram)(&prog);
    rec(b, "destroy", rc, NULL, 0);
}

struct test_case {
    const char *name;
    void (*run)(struct buf *, struct ctx *);
};

static const struct test_case cases[] = {
    {"info", case_info},
    {"ptx", case_ptx},
    {"cubin", case_cubin},
    {"noopts", case_noopts},
    {"std_complex", case_std_complex},
    {"name_expr", case_name_expr},
    {"incdir", case_incdir},
    {"mem_headers", case_mem_headers},
    {"compile_error", case_compile_error},
    {"warning", case_warning},
    {"dlto", case_dlto},
    {"bad_option", case_bad_option},
    {"time_trace", case_time_trace},
    {"pch", case_pch},
    {"bad_handle", case_bad_handle},
    {"null_args", case_null_args},
};
#define N_CASES ARRAY_N(cases)

struct worker {
    pthread_t tid;
    int index;
    int start; /* first case this thread runs; it wraps around */
    const bool *selected;
    struct ctx ctx;
    struct buf out[N_CASES];
    bool ran[N_CASES];
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int k = 0; k < N_CASES; k++) {
        int i = (w->start + k) % N_CASES;
        /* Automatic PCH is process-wide state (the first compile creates
         * it, later ones use it), so only thread 0 runs that case. */
        if (w->selected[i] && !(w->index > 0 && cases[i].run == case_pch)) {
            w->ran[i] = true;
            cases[i].run(&w->out[i], &w->ctx);
        }
    }
    return NULL;
}

/* Writes a worker's records in case order and resets its buffers. */
static void write_worker(FILE *f, struct worker *w)
{
    for (int k = 0; k < N_CASES; k++) {
        if (!w->ran[k])
            continue;
        fprintf(f, "### case %s\n", cases[k].name);
        fwrite(w->out[k].p ? w->out[k].p : "", 1, w->out[k].len, f);
        free(w->out[k].p);
        w->out[k] = (struct buf){0};
        w->ran[k] = false;
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: nvrtc_client --dump FILE [--incdir DIR]... "
                    "[--trace FILE] [--threads N | --rounds N] [--cases a,b] "
                    "[--barrier-stdin] [--list]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *dump = NULL, *trace = NULL, *only = NULL;
    const char *incdirs[MAX_INCDIRS];
    int n_incdirs = 0, threads = 0, rounds = 1;
    bool barrier = false;
    bool selected[N_CASES];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--list")) {
            for (int k = 0; k < N_CASES; k++)
                printf("%s\n", cases[k].name);
            return 0;
        } else if (!strcmp(a, "--barrier-stdin")) {
            barrier = true;
        } else if (i + 1 < argc && !strcmp(a, "--dump")) {
            dump = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--incdir") && n_incdirs < MAX_INCDIRS) {
            incdirs[n_incdirs++] = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--rounds")) {
            rounds = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(a, "--trace")) {
            trace = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--threads")) {
            threads = atoi(argv[++i]);
        } else if (i + 1 < argc && !strcmp(a, "--cases")) {
            only = argv[++i];
        } else {
            usage();
        }
    }
    if (!dump || threads < 0 || threads > 64 || rounds < 1 || (rounds > 1 && threads))
        usage();
    for (int k = 0; k < N_CASES; k++) {
        if (!only) {
            selected[k] = true;
            continue;
        }
        size_t len = strlen(cases[k].name);
        const char *p = only;
        selected[k] = false;
        while (*p) {
            const char *e = strchr(p, ',');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n == len && !strncmp(p, cases[k].name, n))
                selected[k] = true;
            p += n + (e ? 1 : 0);
        }
    }

    load_nvrtc();

    if (barrier) {
        /* Wait until the test script closes our stdin: all processes then
         * start compiling at the same moment. */
        char ch;
        while (read(0, &ch, 1) > 0) {
        }
    }

    int nw = threads ? threads : 1;
    struct worker *w = calloc((size_t)nw, sizeof *w);
    if (!w)
        return 2;
    for (int t = 0; t < nw; t++) {
        w[t].index = t;
        /* Even threads run the cases in order, odd threads from the middle:
         * pairs compile identical programs at the same time, and different
         * programs run alongside. */
        w[t].start = (t % 2) ? N_CASES / 2 + t / 2 : 0;
        w[t].selected = selected;
        w[t].ctx.n_incdirs = n_incdirs;
        memcpy(w[t].ctx.incdirs, incdirs, sizeof incdirs);
        /* The time trace file is per thread, so that threads do not race. */
        if (trace && threads) {
            char *p = malloc(strlen(trace) + 16);
            if (!p)
                return 2;
            sprintf(p, "%s.t%d", trace, t);
            w[t].ctx.trace = p;
        } else {
            w[t].ctx.trace = trace;
        }
    }
    if (threads) {
        for (int t = 0; t < nw; t++) {
            int e = pthread_create(&w[t].tid, NULL, worker_main, &w[t]);
            if (e) {
                fprintf(stderr, "pthread_create: %s\n", strerror(e));
                return 2;
            }
        }
        for (int t = 0; t < nw; t++)
            pthread_join(w[t].tid, NULL);
    }

    FILE *f = fopen(dump, "wb");
    if (!f) {
        perror(dump);
        return 2;
    }
    if (threads) {
        for (int t = 0; t < nw; t++) {
            fprintf(f, "=== thread %d\n", t);
            write_worker(f, &w[t]);
        }
    } else {
        /* Single-threaded, possibly several rounds in one process: the
         * script edits files between rounds (a long-lived process must
         * notice a changed header too). */
        for (int r = 0; r < rounds; r++) {
            worker_main(&w[0]);
            if (rounds > 1)
                fprintf(f, "=== round %d\n", r);
            write_worker(f, &w[0]);
            if (r + 1 < rounds) {
                char line[64];
                printf("nvrtc_client: round %d done\n", r);
                fflush(stdout);
                if (!fgets(line, sizeof line, stdin)) {
                    fprintf(stderr, "nvrtc_client: stdin closed\n");
                    return 2;
                }
            }
        }
    }
    struct counts total = {0};
    for (int t = 0; t < nw; t++) {
        total.cacheable += w[t].ctx.counts.cacheable;
        total.uncached += w[t].ctx.counts.uncached;
        total.passthrough += w[t].ctx.counts.passthrough;
    }
    if (fclose(f) != 0) {
        perror(dump);
        return 2;
    }
    printf("nvrtc_client: threads=%d cacheable=%d uncached=%d passthrough=%d\n", nw,
           total.cacheable, total.uncached, total.passthrough);
    free(w);
    return 0;
}
