/*
 * link_client: links with nvJitLink (or the driver's cuLink*) and prints
 * everything the host can observe, so runs with and without kcache can be
 * compared byte for byte (tests/link/test_link.py).
 *
 *   link_client gen DIR                   NVRTC inputs into DIR (a, b, u, m as
 *                                         LTO-IR and PTX)
 *   link_client run DIR [THREADS] [SCEN]  the nvJitLink scenarios (all, or one)
 *   link_client culink DIR [SCEN]         the cuLink* scenarios (the stand-in
 *                                         driver first on LD_LIBRARY_PATH)
 *   link_client seq DIR LABEL OPTS STEP...  one nvJitLink link of the steps
 *   link_client cuseq DIR LABEL STEP...     one cuLink* link (the stand-in)
 *                                         STEPs: file:TYPE:NAME, data:TYPE:NAME
 *                                         (add DIR/NAME), put:SRC:DST (DIR/SRC's
 *                                         bytes written over DIR/DST in place),
 *                                         rm:NAME; TYPE ptx, ltoir, lib, any;
 *                                         OPTS comma-separated; the cubin goes
 *                                         to DIR/out-LABEL
 *   link_client bench ARCH ITERS FILE...  links FILEs (.ltoir and .ptx added
 *                                         as data, .a by file) for ARCH ITERS
 *                                         times in this process and prints one
 *                                         JSON line: the first link's ms, p50
 *                                         of the rest in us, the cubin's size
 *                                         and digest (scripts/bench, section 9)
 *
 * Built twice: linked against libnvJitLink (the header's inline functions
 * call the versioned exports) and with -DKC_CLIENT_DLOPEN, which dlopen()s
 * libnvJitLink.so.13 and resolves the unversioned names with dlsym, as
 * cuda.bindings does. Each linked cubin is also written to DIR/out-<scen>
 * (thread 0), for an exact comparison. With THREADS > 1 every thread runs
 * the scenarios at once and each compares its output with thread 0's.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <nvJitLink.h>
#include <nvrtc.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- nvJitLink, linked or dlopen'd ------------------------------------------ */

#ifdef KC_CLIENT_DLOPEN
static struct {
    nvJitLinkResult (*create)(nvJitLinkHandle *, uint32_t, const char **);
    nvJitLinkResult (*destroy)(nvJitLinkHandle *);
    nvJitLinkResult (*add_data)(nvJitLinkHandle, nvJitLinkInputType, const void *, size_t,
                                const char *);
    nvJitLinkResult (*add_file)(nvJitLinkHandle, nvJitLinkInputType, const char *);
    nvJitLinkResult (*complete)(nvJitLinkHandle);
    nvJitLinkResult (*size[4])(nvJitLinkHandle, size_t *);
    nvJitLinkResult (*get[4])(nvJitLinkHandle, void *);
} J;
static void jl_load(void)
{
    void *h = dlopen("libnvJitLink.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
#define S(f, n)                                                                                    \
    do {                                                                                           \
        if (!(*(void **)&J.f = dlsym(h, n))) {                                                     \
            fprintf(stderr, "dlsym %s\n", n);                                                      \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    S(create, "nvJitLinkCreate");
    S(destroy, "nvJitLinkDestroy");
    S(add_data, "nvJitLinkAddData");
    S(add_file, "nvJitLinkAddFile");
    S(complete, "nvJitLinkComplete");
    S(size[0], "nvJitLinkGetLinkedCubinSize");
    S(get[0], "nvJitLinkGetLinkedCubin");
    S(size[1], "nvJitLinkGetLinkedPtxSize");
    S(get[1], "nvJitLinkGetLinkedPtx");
    S(size[2], "nvJitLinkGetErrorLogSize");
    S(get[2], "nvJitLinkGetErrorLog");
    S(size[3], "nvJitLinkGetInfoLogSize");
    S(get[3], "nvJitLinkGetInfoLog");
#undef S
}
#define JL(f) J.f
#else
static nvJitLinkResult g_cubin(nvJitLinkHandle h, void *p)
{
    return nvJitLinkGetLinkedCubin(h, p);
}
static nvJitLinkResult g_ptx(nvJitLinkHandle h, void *p)
{
    return nvJitLinkGetLinkedPtx(h, p);
}
static nvJitLinkResult g_err(nvJitLinkHandle h, void *p)
{
    return nvJitLinkGetErrorLog(h, p);
}
static nvJitLinkResult g_info(nvJitLinkHandle h, void *p)
{
    return nvJitLinkGetInfoLog(h, p);
}
static struct {
    nvJitLinkResult (*size[4])(nvJitLinkHandle, size_t *);
    nvJitLinkResult (*get[4])(nvJitLinkHandle, void *);
} J = {{nvJitLinkGetLinkedCubinSize, nvJitLinkGetLinkedPtxSize, nvJitLinkGetErrorLogSize,
        nvJitLinkGetInfoLogSize},
       {g_cubin, g_ptx, g_err, g_info}};
static void jl_load(void) {}
#define JL(f) JL_##f
#define JL_create nvJitLinkCreate
#define JL_destroy nvJitLinkDestroy
#define JL_add_data nvJitLinkAddData
#define JL_add_file nvJitLinkAddFile
#define JL_complete nvJitLinkComplete
#endif

/* ---- output ----------------------------------------------------------------------- */

struct out {
    char *p;
    size_t n, cap;
};

static void say(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char line[8192];
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (k < 0)
        return;
    if ((size_t)k >= sizeof line)
        k = sizeof line - 1;
    if (o->n + (size_t)k + 2 > o->cap) {
        o->cap = (o->n + (size_t)k + 2) * 2;
        o->p = realloc(o->p, o->cap);
    }
    memcpy(o->p + o->n, line, (size_t)k);
    o->n += (size_t)k;
    o->p[o->n++] = '\n';
    o->p[o->n] = 0;
}

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static char *slurp(const char *dir, const char *name, size_t *n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (fread(b, 1, (size_t)len, f) != (size_t)len)
        exit(2);
    b[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return b;
}

static void spill(const char *dir, const char *scen, const void *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/out-%s", dir, scen);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(p, 1, n, f);
        fclose(f);
    }
}

/* ---- gen: inputs compiled by NVRTC ------------------------------------------------- */

static const char *srcs[][2] = {
    {"a", "extern __device__ float f(float);\n"
          "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = f(x[threadIdx.x]); }\n"},
    {"b", "__device__ float f(float v) { return v * 2.0f + 1.0f; }\n"},
    {"u", "extern __device__ float nowhere(float);\n"
          "extern \"C\" __global__ void ku(float *x) { x[0] = nowhere(x[1]); }\n"},
    {"m",
     "extern __device__ float g(float);\n"
     "extern \"C\" __global__ void km(float *x) { x[threadIdx.x] = g(x[threadIdx.x]) + 1.0f; }\n"},
    /* Two inputs that link together, but not either twice (kc_x). */
    {"x", "__device__ int kc_y = 1;\n"
          "extern \"C\" __global__ void kx(int *o) { *o = kc_y + 7; }\n"},
    {"y", "__device__ int kc_x = 2;\n"
          "extern \"C\" __global__ void ky(int *o) { *o = kc_x * 3; }\n"},
};

static int gen(const char *dir)
{
    for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++) {
        for (int lto = 0; lto < 2; lto++) {
            nvrtcProgram p;
            nvrtcCreateProgram(&p, srcs[i][1], srcs[i][0], 0, NULL, NULL);
            const char *o[] = {"-arch=compute_80", "-rdc=true", "-dlto"};
            if (nvrtcCompileProgram(p, lto ? 3 : 2, o) != NVRTC_SUCCESS) {
                fprintf(stderr, "nvrtc failed on %s\n", srcs[i][0]);
                return 1;
            }
            size_t n;
            if (lto)
                nvrtcGetLTOIRSize(p, &n);
            else
                nvrtcGetPTXSize(p, &n);
            char *b = malloc(n);
            if (lto)
                nvrtcGetLTOIR(p, b);
            else
                nvrtcGetPTX(p, b);
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.%s", dir, srcs[i][0], lto ? "ltoir" : "ptx");
            FILE *f = fopen(path, "wb");
            fwrite(b, 1, lto ? n : n - 1, f); /* PTX without its NUL */
            fclose(f);
            free(b);
            nvrtcDestroyProgram(&p);
        }
    }
    return 0;
}

/* ---- nvJitLink scenarios ------------------------------------------------------------- */

struct input {
    int file;
    nvJitLinkInputType type;
    const char *what; /* file in DIR, or an absolute path */
    const char *name;
};

struct scen {
    const char *name;
    const char *opts[6];
    struct input in[4];
    int early_getter; /* read the info log before completing */
};

#define LT NVJITLINK_INPUT_LTOIR
#define PT NVJITLINK_INPUT_PTX
#define LB NVJITLINK_INPUT_LIBRARY
static const struct scen scens[] = {
    {"lto2", {"-arch=sm_90", "-lto"}, {{0, LT, "a.ltoir", "a"}, {0, LT, "b.ltoir", "b"}}, 0},
    {"lto2-O0",
     {"-arch=sm_90", "-lto", "-O0"},
     {{0, LT, "a.ltoir", "a"}, {0, LT, "b.ltoir", "b"}},
     0},
    {"lto2-sm80", {"-arch=sm_80", "-lto"}, {{0, LT, "a.ltoir", "a"}, {0, LT, "b.ltoir", "b"}}, 0},
    {"lto2-lineinfo",
     {"-arch=sm_90", "-lto", "-lineinfo"},
     {{0, LT, "a.ltoir", "a"}, {0, LT, "b.ltoir", "b"}},
     0},
    {"lto2-ba", {"-arch=sm_90", "-lto"}, {{0, LT, "b.ltoir", "b"}, {0, LT, "a.ltoir", "a"}}, 0},
    {"lto2-ptx",
     {"-arch=sm_90", "-lto", "-ptx"},
     {{0, LT, "a.ltoir", "a"}, {0, LT, "b.ltoir", "b"}},
     0},
    {"ptx2", {"-arch=sm_90"}, {{0, PT, "a.ptx", "a"}, {0, PT, "b.ptx", "b"}}, 0},
    {"ptx2-early", {"-arch=sm_90"}, {{0, PT, "a.ptx", "a"}, {0, PT, "b.ptx", "b"}}, 1},
    {"ptx2-verbose",
     {"-arch=sm_90", "-verbose"},
     {{0, PT, "a.ptx", "a"}, {0, PT, "b.ptx", "b"}},
     0},
    {"ptx-file", {"-arch=sm_90"}, {{1, PT, "a.ptx", NULL}, {0, PT, "b.ptx", "b"}}, 0},
    {"lib", {"-arch=sm_90", "-lto"}, {{0, LT, "m.ltoir", "m"}, {1, LB, "libg.a", NULL}}, 0},
    {"devrt",
     {"-arch=sm_90", "-lto"},
     {{0, LT, "a.ltoir", "a"},
      {0, LT, "b.ltoir", "b"},
      {1, LB, "/usr/local/cuda/lib64/libcudadevrt.a", NULL}},
     0},
    {"undefined", {"-arch=sm_90", "-lto"}, {{0, LT, "u.ltoir", "u"}}, 0},
};
#define N_SCENS (sizeof scens / sizeof *scens)

static const char *getter_names[4] = {"cubin", "ptx", "error-log", "info-log"};

static void getters(struct out *o, nvJitLinkHandle h, const char *dir, const char *scen,
                    int spill_it)
{
    for (int g = 0; g < 4; g++) {
        size_t n = 777;
        nvJitLinkResult src = J.size[g](h, &n), nrc = J.size[g](h, NULL);
        say(o, "  %s: size rc=%d size=%zu null rc=%d get(NULL) rc=%d", getter_names[g], src, n, nrc,
            J.get[g](h, NULL));
        size_t cap = src == NVJITLINK_SUCCESS && n != 777 && n < (1u << 28) ? n : 64;
        unsigned char *buf = malloc(cap + 1);
        memset(buf, 0x5a, cap + 1);
        nvJitLinkResult grc = J.get[g](h, buf);
        say(o, "  %s: get rc=%d fnv=%016llx guard=%d", getter_names[g], grc,
            (unsigned long long)fnv(buf, cap), buf[cap]);
        if (g >= 2 && grc == NVJITLINK_SUCCESS && cap != 64)
            say(o, "  %s text: [%.*s]", getter_names[g], (int)cap, (char *)buf);
        if (g == 0 && spill_it && grc == NVJITLINK_SUCCESS && cap != 64)
            spill(dir, scen, buf, cap);
        free(buf);
    }
}

static void run_scen(struct out *o, const char *dir, const struct scen *s, int spill_it)
{
    int nopt = 0;
    while (nopt < 6 && s->opts[nopt])
        nopt++;
    nvJitLinkHandle h = NULL;
    say(o, "@%s", s->name);
    nvJitLinkResult rc = JL(create)(&h, (uint32_t)nopt, (const char **)s->opts);
    say(o, "  create rc=%d", rc);
    if (rc != NVJITLINK_SUCCESS)
        return;
    for (int i = 0; i < 4 && s->in[i].what; i++) {
        const struct input *in = &s->in[i];
        char path[4096];
        if (in->what[0] == '/')
            snprintf(path, sizeof path, "%s", in->what);
        else
            snprintf(path, sizeof path, "%s/%s", dir, in->what);
        if (in->file) {
            rc = JL(add_file)(h, in->type, path);
        } else {
            size_t n;
            char *b = slurp(dir, in->what, &n);
            rc = JL(add_data)(h, in->type, b, n, in->name);
            free(b);
        }
        say(o, "  add %s rc=%d", in->what[0] == '/' ? strrchr(in->what, '/') + 1 : in->what, rc);
    }
    if (s->early_getter) {
        size_t n = 777;
        say(o, "  early info-log size rc=%d size=%zu", J.size[3](h, &n), n);
    }
    say(o, "  complete rc=%d", JL(complete)(h));
    getters(o, h, dir, s->name, spill_it);
    say(o, "  destroy rc=%d null=%d", JL(destroy)(&h), h == NULL);
}

struct thr {
    const char *dir;
    const char *only;
    int idx;
    struct out o;
};

static void *thr_run(void *arg)
{
    struct thr *t = arg;
    for (size_t i = 0; i < N_SCENS; i++)
        if (!t->only || !strcmp(t->only, scens[i].name))
            run_scen(&t->o, t->dir, &scens[i], t->idx == 0);
    return NULL;
}

static int run(const char *dir, int threads, const char *only)
{
    jl_load();
    if (threads < 1)
        threads = 1;
    struct thr *t = calloc((size_t)threads, sizeof *t);
    pthread_t *id = calloc((size_t)threads, sizeof *id);
    for (int i = 0; i < threads; i++) {
        t[i].dir = dir;
        t[i].only = only;
        t[i].idx = i;
        pthread_create(&id[i], NULL, thr_run, &t[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(id[i], NULL);
    fwrite(t[0].o.p, 1, t[0].o.n, stdout);
    int bad = 0;
    for (int i = 1; i < threads; i++)
        if (t[i].o.n != t[0].o.n || memcmp(t[i].o.p, t[0].o.p, t[0].o.n))
            bad++;
    printf("threads=%d differing=%d\n", threads, bad);
    /* Each thread's dump to DIR/thread-<i>.out when asked: verbose links'
     * logs hold compile times that differ between threads with or without
     * kcache, so the caller compares them with those masked. */
    const char *keep = getenv("KCACHE_TEST_LINK_THREAD_OUT");
    if (keep != NULL && keep[0] != '\0') {
        for (int i = 0; i < threads; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/thread-%d.out", keep, i);
            FILE *f = fopen(path, "w");
            if (f == NULL)
                return 1;
            fwrite(t[i].o.p, 1, t[i].o.n, f);
            fclose(f);
        }
        return 0;
    }
    return bad != 0;
}

/* ---- cuLink scenarios (the stand-in driver) ----------------------------------------- */

static const char *cu_name(CUresult rc)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "%d", (int)rc);
    return buf;
}

struct cuscen {
    const char *name;
    unsigned opt_level; /* 0: not given */
    int verbose;        /* CU_JIT_LOG_VERBOSE */
    unsigned info_size, error_size;
    struct {
        int file;
        CUjitInputType type;
        const char *what;
        const char *name;
    } in[3];
};

static const struct cuscen cuscens[] = {
    {"cu-ptx2",
     0,
     0,
     4096,
     4096,
     {{0, CU_JIT_INPUT_PTX, "a.ptx", "a"}, {0, CU_JIT_INPUT_PTX, "b.ptx", "b"}}},
    {"cu-ptx2-O1",
     1,
     0,
     4096,
     4096,
     {{0, CU_JIT_INPUT_PTX, "a.ptx", "a"}, {0, CU_JIT_INPUT_PTX, "b.ptx", "b"}}},
    {"cu-smalllog", 0, 0, 8, 8, {{0, CU_JIT_INPUT_PTX, "u.ptx", "u"}}},
    {"cu-file",
     0,
     0,
     4096,
     4096,
     {{1, CU_JIT_INPUT_PTX, "a.ptx", NULL}, {1, CU_JIT_INPUT_LIBRARY, "libb.a", NULL}}},
    {"cu-undefined", 0, 0, 4096, 4096, {{0, CU_JIT_INPUT_PTX, "u.ptx", "u"}}},
    {"cu-nologs",
     0,
     0,
     0,
     0,
     {{0, CU_JIT_INPUT_PTX, "a.ptx", "a"}, {0, CU_JIT_INPUT_PTX, "b.ptx", "b"}}},
    {"cu-verbose",
     0,
     1,
     4096,
     4096,
     {{0, CU_JIT_INPUT_PTX, "a.ptx", "a"}, {0, CU_JIT_INPUT_PTX, "b.ptx", "b"}}},
};

static int culink(const char *dir, const char *only)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda: %s\n", dlerror());
        return 2;
    }
#define CU(n) ((__typeof__(&n))dlsym(lib, #n))
    CUdevice d;
    CUcontext c;
    if (CU(cuInit)(0) || CU(cuDeviceGet)(&d, 0) || CU(cuDevicePrimaryCtxRetain)(&c, d) ||
        CU(cuCtxSetCurrent)(c))
        return 2;
    struct out o = {0};
    for (size_t k = 0; k < sizeof cuscens / sizeof *cuscens; k++) {
        const struct cuscen *s = &cuscens[k];
        if (only && strcmp(only, s->name))
            continue;
        say(&o, "@%s", s->name);
        char *info = malloc(s->info_size + 1), *err = malloc(s->error_size + 1);
        memset(info, 'I', s->info_size + 1);
        memset(err, 'E', s->error_size + 1);
        CUjit_option opt[8];
        void *val[8];
        unsigned n = 0;
        if (s->info_size) {
            opt[n] = CU_JIT_INFO_LOG_BUFFER, val[n++] = info;
            opt[n] = CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, val[n++] = (void *)(uintptr_t)s->info_size;
            opt[n] = CU_JIT_ERROR_LOG_BUFFER, val[n++] = err;
            opt[n] = CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            val[n++] = (void *)(uintptr_t)s->error_size;
        }
        if (s->opt_level)
            opt[n] = CU_JIT_OPTIMIZATION_LEVEL, val[n++] = (void *)(uintptr_t)s->opt_level;
        if (s->verbose)
            opt[n] = CU_JIT_LOG_VERBOSE, val[n++] = (void *)(uintptr_t)1;
        CUlinkState st = NULL;
        CUresult rc = CU(cuLinkCreate_v2)(n, opt, val, &st);
        say(&o, "  create rc=%s", cu_name(rc));
        if (rc)
            continue;
        for (int i = 0; i < 3 && s->in[i].what; i++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, s->in[i].what);
            if (s->in[i].file) {
                rc = CU(cuLinkAddFile_v2)(st, s->in[i].type, path, 0, NULL, NULL);
            } else {
                size_t len;
                char *b = slurp(dir, s->in[i].what, &len);
                rc = CU(cuLinkAddData_v2)(st, s->in[i].type, b, len + 1, s->in[i].name, 0, NULL,
                                          NULL);
                free(b);
            }
            say(&o, "  add %s rc=%s", s->in[i].what, cu_name(rc));
        }
        void *cubin = (void *)(uintptr_t)0x1234;
        size_t size = 777;
        rc = CU(cuLinkComplete)(st, &cubin, &size);
        say(&o, "  complete rc=%s size=%zu cubin=%s fnv=%016llx", cu_name(rc), size,
            cubin == (void *)(uintptr_t)0x1234 ? "unset"
            : cubin                            ? "set"
                                               : "NULL",
            rc == CUDA_SUCCESS ? (unsigned long long)fnv(cubin, size) : 0ull);
        if (rc == CUDA_SUCCESS)
            spill(dir, s->name, cubin, size);
        for (unsigned i = 0; i < n; i++)
            if (opt[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES ||
                opt[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
                say(&o, "  option %d value=%zu", (int)opt[i], (size_t)(uintptr_t)val[i]);
        if (s->info_size) {
            say(&o, "  info fnv=%016llx [%.*s]", (unsigned long long)fnv(info, s->info_size + 1),
                (int)strnlen(info, s->info_size), info);
            say(&o, "  error fnv=%016llx [%.*s]", (unsigned long long)fnv(err, s->error_size + 1),
                (int)strnlen(err, s->error_size), err);
        }
        say(&o, "  destroy rc=%s", cu_name(CU(cuLinkDestroy)(st)));
        free(info);
        free(err);
    }
    fwrite(o.p, 1, o.n, stdout);
    return 0;
}

/* ---- seq: one link of explicit steps (inputs that change under the link) ---------- */

static int put_file(const char *dir, const char *src, const char *dst)
{
    size_t n;
    char *b = slurp(dir, src, &n);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, dst);
    FILE *f = fopen(path, "wb"); /* in place: the same inode, truncated */
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    free(b);
    return 0;
}

/* Runs the put: and rm: steps; 1 when `step` was one. */
static int file_step(const char *dir, const char *step)
{
    char a[256], b[256];
    if (sscanf(step, "put:%255[^:]:%255s", a, b) == 2)
        return put_file(dir, a, b), 1;
    if (sscanf(step, "rm:%255s", a) == 1) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, a);
        unlink(path);
        return 1;
    }
    return 0;
}

static int seq(const char *dir, const char *label, const char *opts, int n, char **steps)
{
    jl_load();
    static const struct {
        const char *name;
        nvJitLinkInputType jl;
        CUjitInputType cu;
    } types[] = {{"ptx", NVJITLINK_INPUT_PTX, CU_JIT_INPUT_PTX},
                 {"ltoir", NVJITLINK_INPUT_LTOIR, CU_JIT_INPUT_PTX},
                 {"lib", NVJITLINK_INPUT_LIBRARY, CU_JIT_INPUT_LIBRARY},
                 {"any", NVJITLINK_INPUT_ANY, CU_JIT_INPUT_PTX}};
    const char *o[8];
    char obuf[512];
    int no = 0;
    snprintf(obuf, sizeof obuf, "%s", opts);
    for (char *t = strtok(obuf, ","); t && no < 8; t = strtok(NULL, ","))
        o[no++] = t;
    struct out out = {0};
    nvJitLinkHandle h = NULL;
    say(&out, "@%s", label);
    say(&out, "  create rc=%d", JL(create)(&h, (uint32_t)no, o));
    for (int i = 0; i < n; i++) {
        if (file_step(dir, steps[i]))
            continue;
        char kind[16], type[16], name[256];
        if (sscanf(steps[i], "%15[^:]:%15[^:]:%255s", kind, type, name) != 3) {
            fprintf(stderr, "bad step %s\n", steps[i]);
            return 2;
        }
        size_t t = 0;
        while (t < sizeof types / sizeof *types && strcmp(types[t].name, type))
            t++;
        if (t == sizeof types / sizeof *types)
            return 2;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        nvJitLinkResult rc;
        if (!strcmp(kind, "file")) {
            rc = JL(add_file)(h, types[t].jl, path);
        } else {
            size_t len;
            char *b = slurp(dir, name, &len);
            rc = JL(add_data)(h, types[t].jl, b, len, name);
            free(b);
        }
        say(&out, "  %s rc=%d", steps[i], rc);
    }
    say(&out, "  complete rc=%d", JL(complete)(h));
    getters(&out, h, dir, label, 1);
    say(&out, "  destroy rc=%d", JL(destroy)(&h));
    fwrite(out.p, 1, out.n, stdout);
    return 0;
}

static int cuseq(const char *dir, const char *label, int n, char **steps)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 2;
    CUdevice d;
    CUcontext c;
    if (CU(cuInit)(0) || CU(cuDeviceGet)(&d, 0) || CU(cuDevicePrimaryCtxRetain)(&c, d) ||
        CU(cuCtxSetCurrent)(c))
        return 2;
    struct out o = {0};
    say(&o, "@%s", label);
    char info[4096], err[4096];
    memset(info, 'I', sizeof info);
    memset(err, 'E', sizeof err);
    CUjit_option opt[4] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *val[4] = {info, (void *)(uintptr_t)sizeof info, err, (void *)(uintptr_t)sizeof err};
    CUlinkState st = NULL;
    CUresult rc = CU(cuLinkCreate_v2)(4, opt, val, &st);
    say(&o, "  create rc=%s", cu_name(rc));
    if (rc)
        return 1;
    for (int i = 0; i < n; i++) {
        if (file_step(dir, steps[i]))
            continue;
        char kind[16], type[16], name[256];
        if (sscanf(steps[i], "%15[^:]:%15[^:]:%255s", kind, type, name) != 3)
            return 2;
        CUjitInputType t = !strcmp(type, "lib") ? CU_JIT_INPUT_LIBRARY : CU_JIT_INPUT_PTX;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!strcmp(kind, "file")) {
            rc = CU(cuLinkAddFile_v2)(st, t, path, 0, NULL, NULL);
        } else {
            size_t len;
            char *b = slurp(dir, name, &len);
            rc = CU(cuLinkAddData_v2)(st, t, b, len + 1, name, 0, NULL, NULL);
            free(b);
        }
        say(&o, "  %s rc=%s", steps[i], cu_name(rc));
    }
    void *cubin = NULL;
    size_t size = 0;
    rc = CU(cuLinkComplete)(st, &cubin, &size);
    say(&o, "  complete rc=%s size=%zu fnv=%016llx", cu_name(rc), size,
        rc == CUDA_SUCCESS ? (unsigned long long)fnv(cubin, size) : 0ull);
    if (rc == CUDA_SUCCESS)
        spill(dir, label, cubin, size);
    say(&o, "  info [%.*s]", (int)strnlen(info, sizeof info), info);
    say(&o, "  error [%.*s]", (int)strnlen(err, sizeof err), err);
    say(&o, "  destroy rc=%s", cu_name(CU(cuLinkDestroy)(st)));
    fwrite(o.p, 1, o.n, stdout);
    return 0;
}
#undef CU

/* ---- bench: one link, timed (scripts/bench) ------------------------------------------ */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Links files[0..n) for `arch` (create to destroy, the cubin read back):
 * returns the microseconds it took, or a negative number on any failure
 * (the error log on stderr). Sets *size and *digest from the cubin. */
static double bench_link(const char *arch, int n, char **files, size_t *size, uint64_t *digest)
{
    char archopt[64];
    snprintf(archopt, sizeof archopt, "-arch=%s", arch);
    const char *opts[2] = {archopt, "-lto"};
    int lto = 0;
    for (int i = 0; i < n; i++)
        lto |= strstr(files[i], ".ltoir") != NULL;
    double t0 = now_us();
    nvJitLinkHandle h = NULL;
    if (JL(create)(&h, lto ? 2 : 1, opts) != NVJITLINK_SUCCESS)
        return -1;
    nvJitLinkResult rc = NVJITLINK_SUCCESS;
    for (int i = 0; i < n && rc == NVJITLINK_SUCCESS; i++) {
        size_t len = strlen(files[i]);
        if (len > 2 && !strcmp(files[i] + len - 2, ".a")) {
            rc = JL(add_file)(h, NVJITLINK_INPUT_LIBRARY, files[i]);
        } else {
            const char *slash = strrchr(files[i], '/');
            char dir[4096];
            snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - files[i]) : 1,
                     slash ? files[i] : ".");
            size_t bytes;
            char *b = slurp(dir, slash ? slash + 1 : files[i], &bytes);
            rc = JL(add_data)(
                h, strstr(files[i], ".ltoir") ? NVJITLINK_INPUT_LTOIR : NVJITLINK_INPUT_PTX, b,
                bytes, slash ? slash + 1 : files[i]);
            free(b);
        }
    }
    if (rc == NVJITLINK_SUCCESS)
        rc = JL(complete)(h);
    unsigned char *cubin = NULL;
    if (rc == NVJITLINK_SUCCESS)
        rc = J.size[0](h, size);
    if (rc == NVJITLINK_SUCCESS && (cubin = malloc(*size ? *size : 1)) != NULL)
        rc = J.get[0](h, cubin);
    if (rc != NVJITLINK_SUCCESS) {
        size_t ln = 0;
        if (J.size[2](h, &ln) == NVJITLINK_SUCCESS && ln > 0) {
            char *log = malloc(ln);
            if (log && J.get[2](h, log) == NVJITLINK_SUCCESS)
                fprintf(stderr, "%s\n", log);
            free(log);
        }
        fprintf(stderr, "link_client: link failed: %d\n", rc);
    }
    JL(destroy)(&h);
    double t = now_us() - t0;
    if (cubin != NULL && rc == NVJITLINK_SUCCESS)
        *digest = fnv(cubin, *size);
    free(cubin);
    return rc == NVJITLINK_SUCCESS && cubin != NULL ? t : -1;
}

static int bench(const char *arch, int iters, int n, char **files)
{
    jl_load();
    if (iters < 1)
        iters = 1;
    double *t = calloc((size_t)iters, sizeof *t);
    size_t size = 0;
    uint64_t digest = 0, first = 0;
    for (int i = 0; i < iters; i++) {
        if ((t[i] = bench_link(arch, n, files, &size, &digest)) < 0)
            return 1;
        if (i == 0)
            first = digest;
        else if (digest != first) {
            fprintf(stderr, "link_client: link %d differs from the first\n", i);
            return 1;
        }
    }
    double p50 = 0;
    if (iters > 1) {
        qsort(t + 1, (size_t)iters - 1, sizeof *t, cmp_d);
        p50 = t[1 + (iters - 1) / 2];
    }
    printf("{\"first_ms\": %.3f, \"p50_us\": %.2f, \"iters\": %d, \"cubin_bytes\": %zu, "
           "\"fnv\": \"%016llx\"}\n",
           t[0] / 1e3, p50, iters, size, (unsigned long long)first);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "gen"))
        return gen(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "run"))
        return run(argv[2], argc > 3 ? atoi(argv[3]) : 1, argc > 4 ? argv[4] : NULL);
    if (argc >= 3 && !strcmp(argv[1], "culink"))
        return culink(argv[2], argc > 3 ? argv[3] : NULL);
    if (argc >= 5 && !strcmp(argv[1], "seq"))
        return seq(argv[2], argv[3], argv[4], argc - 5, argv + 5);
    if (argc >= 4 && !strcmp(argv[1], "cuseq"))
        return cuseq(argv[2], argv[3], argc - 4, argv + 4);
    if (argc >= 5 && !strcmp(argv[1], "bench"))
        return bench(argv[2], atoi(argv[3]), argc - 4, argv + 4);
    fprintf(stderr, "usage: link_client gen|run|culink DIR ... | bench ARCH ITERS FILE...\n");
    return 2;
}
