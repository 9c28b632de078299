/*
 * ver_client: the version matrix's client (tests/versions/test_versions.py).
 * Built by the test against one release's own nvrtc.h / nvJitLink.h (from
 * its wheel) with -DKC_REL_MAJOR=M -DKC_REL_MINOR=N, and linked against that
 * release's library, so every call goes through the names that release's
 * header has a program call (nvJitLink: the inline functions' versioned
 * __nvJitLink*_M_N). With -DKC_DLSYM the nvJitLink names are taken with
 * dlsym from the dlopen'd library instead, versioned ones included.
 *
 *   ver_client nvrtc DUMP       the NVRTC cases; every getter the release
 *                               declares, each one it lacks named as skipped
 *   ver_client gen DIR          LTO-IR and PTX inputs (this NVRTC)
 *   ver_client link DIR DUMP    the nvJitLink scenarios (KC_JITLINK builds)
 *
 * The dump holds every return code and a digest of every output byte; the
 * test compares dumps with and without kcache. Outputs of the link
 * scenarios are also written to DIR/out-<scen>.
 */
#include <nvrtc.h>
#ifdef KC_JITLINK
#include <nvJitLink.h>
#endif

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REL_AT_LEAST(M, N) (KC_REL_MAJOR > (M) || (KC_REL_MAJOR == (M) && KC_REL_MINOR >= (N)))

static FILE *dump;

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void skipped(const char *what)
{
    fprintf(dump, "skipped: %s (not in %d.%d)\n", what, KC_REL_MAJOR, KC_REL_MINOR);
    printf("skipped: %s\n", what);
}

/* ---- NVRTC ---------------------------------------------------------------------- */

typedef nvrtcResult (*size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*get_fn)(nvrtcProgram, char *);

static void output(nvrtcProgram p, const char *what, size_fn sz, get_fn g)
{
    size_t n = 777;
    nvrtcResult src = sz(p, &n), nrc = sz(p, NULL);
    size_t cap = src == NVRTC_SUCCESS && n != 777 && n < (1u << 28) ? n : 64;
    unsigned char *buf = malloc(cap + 1);
    memset(buf, 0xa5, cap + 1);
    nvrtcResult grc = g(p, (char *)buf);
    fprintf(dump, "  %s: size rc=%d size=%zu null rc=%d get rc=%d fnv=%016llx canary=%d\n", what,
            src, n, nrc, grc, (unsigned long long)fnv(buf, cap), buf[cap]);
    if (!strcmp(what, "log") && grc == NVRTC_SUCCESS)
        fprintf(dump, "  log text: [%.*s]\n", (int)cap, (char *)buf);
    free(buf);
}

static void outputs(nvrtcProgram p)
{
    output(p, "log", nvrtcGetProgramLogSize, nvrtcGetProgramLog);
    output(p, "ptx", nvrtcGetPTXSize, nvrtcGetPTX);
    output(p, "cubin", nvrtcGetCUBINSize, nvrtcGetCUBIN);
#if KC_REL_MAJOR < 13
    output(p, "nvvm", nvrtcGetNVVMSize, nvrtcGetNVVM);
#else
    skipped("nvrtcGetNVVM");
#endif
#if REL_AT_LEAST(12, 0)
    output(p, "ltoir", nvrtcGetLTOIRSize, nvrtcGetLTOIR);
    output(p, "optixir", nvrtcGetOptiXIRSize, nvrtcGetOptiXIR);
    size_t req = 777;
    nvrtcResult rrc = nvrtcGetPCHHeapSizeRequired(p, &req);
    fprintf(dump, "  pch: status rc=%d required rc=%d size=%zu\n", nvrtcGetPCHCreateStatus(p), rrc,
            req);
#else
    skipped("nvrtcGetLTOIR");
    skipped("nvrtcGetOptiXIR");
    skipped("nvrtcGetPCHCreateStatus");
#endif
#if REL_AT_LEAST(13, 3)
    output(p, "tileir", nvrtcGetTileIRSize, nvrtcGetTileIR);
#else
    skipped("nvrtcGetTileIR");
#endif
}

static void compile(const char *label, const char *src, int nh, const char *const *hdr,
                    const char *const *inc, int no, const char *const *opts, int ne,
                    const char *const *exprs)
{
    fprintf(dump, "@%s\n", label);
    nvrtcProgram p = NULL;
    nvrtcResult rc = nvrtcCreateProgram(&p, src, label, nh, hdr, inc);
    fprintf(dump, "  create rc=%d\n", rc);
    if (rc != NVRTC_SUCCESS)
        return;
    for (int i = 0; i < ne; i++)
        fprintf(dump, "  add %s rc=%d\n", exprs[i], nvrtcAddNameExpression(p, exprs[i]));
    fprintf(dump, "  compile rc=%d\n", nvrtcCompileProgram(p, no, opts));
    outputs(p);
    for (int i = 0; i <= ne; i++) {
        const char *e = i < ne ? exprs[i] : "never_added<int>", *out = NULL;
        rc = nvrtcGetLoweredName(p, e, &out);
        fprintf(dump, "  lowered %s rc=%d -> %s\n", e, rc, rc == NVRTC_SUCCESS ? out : "-");
    }
    fprintf(dump, "  destroy rc=%d\n", nvrtcDestroyProgram(&p));
}

static const char saxpy[] = "extern \"C\" __global__ void saxpy(float a, float *x, float *y)\n"
                            "{ int i = threadIdx.x; y[i] = a * x[i] + y[i]; }\n";
static const char tmpl[] = "namespace ops { template <typename T, int N>\n"
                           "__global__ void scale(T *x) { x[threadIdx.x] *= N; } }\n";

static int run_nvrtc(void)
{
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    fprintf(dump, "version %d.%d\n", major, minor);
    const char *ptx[] = {"-arch=compute_80"};
    compile("ptx", saxpy, 0, NULL, NULL, 1, ptx, 0, NULL);
    const char *cubin[] = {"-arch=sm_80", "-lineinfo"};
    compile("cubin", saxpy, 0, NULL, NULL, 2, cubin, 0, NULL);
    const char *dlto[] = {"-arch=sm_80", "-dlto", "-rdc=true"};
    compile("dlto", saxpy, 0, NULL, NULL, 3, dlto, 0, NULL);
    const char *exprs[] = {"ops::scale<float, 4>", "&ops::scale<double, 8>"};
    compile("name_expr", tmpl, 0, NULL, NULL, 1, ptx, 2, exprs);
    const char *hdr[] = {"#define K 17\n"}, *inc[] = {"k.h"};
    compile("headers", "#include \"k.h\"\n__global__ void h(int *p) { *p = K; }\n", 1, hdr, inc, 1,
            ptx, 0, NULL);
    compile("error", "__global__ void e(int *p) { *p = undefined_name; }\n", 0, NULL, NULL, 1, ptx,
            0, NULL);
    const char *warn[] = {"-arch=compute_80", "--display-error-number"};
    compile("warning", "__global__ void w(int *p) { int unused = 3; *p = 1; }\n", 0, NULL, NULL, 2,
            warn, 0, NULL);
    const char *bad[] = {"-arch=sm_80", "--no-such-option-kcache"};
    compile("bad_option", saxpy, 0, NULL, NULL, 2, bad, 0, NULL);
#if REL_AT_LEAST(13, 3)
    const char *tile[] = {"-arch=sm_100", "--enable-tile"};
    compile("tile", "__tile_global__ void t(float *x) { }\n", 0, NULL, NULL, 2, tile, 0, NULL);
#else
    skipped("--enable-tile compiles");
#endif
    return 0;
}

/* ---- nvJitLink ---------------------------------------------------------------------- */

#ifdef KC_JITLINK
static int gen(const char *dir)
{
    static const char *srcs[][2] = {
        {"a", "extern __device__ float f(float);\n"
              "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = f(x[threadIdx.x]); }\n"},
        {"b", "__device__ float f(float v) { return v * 2.0f + 1.0f; }\n"},
        {"u", "extern __device__ float nowhere(float);\n"
              "extern \"C\" __global__ void ku(float *x) { x[0] = nowhere(x[1]); }\n"},
    };
    for (size_t i = 0; i < sizeof srcs / sizeof *srcs; i++)
        for (int lto = 0; lto < 2; lto++) {
            nvrtcProgram p;
            nvrtcCreateProgram(&p, srcs[i][1], srcs[i][0], 0, NULL, NULL);
            const char *o[] = {"-arch=compute_80", "-rdc=true", "-dlto"};
            if (nvrtcCompileProgram(p, lto ? 3 : 2, o) != NVRTC_SUCCESS)
                return 1;
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
            fwrite(b, 1, lto ? n : n - 1, f);
            fclose(f);
            free(b);
            nvrtcDestroyProgram(&p);
        }
    return 0;
}

#define STR2(x) #x
#define STR(x) STR2(x)
#define VNAME(fn) "__nvJitLink" #fn "_" STR(KC_REL_MAJOR) "_" STR(KC_REL_MINOR)

typedef nvJitLinkResult (*jsize_fn)(nvJitLinkHandle, size_t *);
typedef nvJitLinkResult (*jget_fn)(nvJitLinkHandle, void *);
static struct {
    nvJitLinkResult (*create)(nvJitLinkHandle *, uint32_t, const char **);
    nvJitLinkResult (*destroy)(nvJitLinkHandle *);
    nvJitLinkResult (*add_data)(nvJitLinkHandle, nvJitLinkInputType, const void *, size_t,
                                const char *);
    nvJitLinkResult (*add_file)(nvJitLinkHandle, nvJitLinkInputType, const char *);
    nvJitLinkResult (*complete)(nvJitLinkHandle);
    jsize_fn size[5];
    jget_fn get[5];
} J;
static const char *gnames[5] = {"cubin", "ptx", "ltoir", "error-log", "info-log"};

#ifdef KC_DLSYM
static void jl_load(void)
{
    void *h = dlopen(KC_JL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
#define S(f, n)                                                                                    \
    do {                                                                                           \
        if (!(*(void **)&J.f = dlsym(h, VNAME(n)))) {                                              \
            fprintf(stderr, "dlsym %s\n", VNAME(n));                                               \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    S(create, Create);
    S(destroy, Destroy);
    S(add_data, AddData);
    S(add_file, AddFile);
    S(complete, Complete);
    S(size[0], GetLinkedCubinSize);
    S(get[0], GetLinkedCubin);
    S(size[1], GetLinkedPtxSize);
    S(get[1], GetLinkedPtx);
#if KC_REL_MAJOR >= 13 && REL_AT_LEAST(13, 1)
    S(size[2], GetLinkedLTOIRSize);
    S(get[2], GetLinkedLTOIR);
#endif
    S(size[3], GetErrorLogSize);
    S(get[3], GetErrorLog);
    S(size[4], GetInfoLogSize);
    S(get[4], GetInfoLog);
#undef S
}
#else
#define W(name, fn, T)                                                                             \
    static nvJitLinkResult name(nvJitLinkHandle h, void *p)                                        \
    {                                                                                              \
        return fn(h, (T)p);                                                                        \
    }
W(g_cubin, nvJitLinkGetLinkedCubin, void *)
W(g_ptx, nvJitLinkGetLinkedPtx, char *)
W(g_err, nvJitLinkGetErrorLog, char *)
W(g_info, nvJitLinkGetInfoLog, char *)
#if REL_AT_LEAST(13, 1)
W(g_ltoir, nvJitLinkGetLinkedLTOIR, void *)
#endif
static nvJitLinkResult create_w(nvJitLinkHandle *h, uint32_t n, const char **o)
{
    return nvJitLinkCreate(h, n, o);
}
static void jl_load(void)
{
    J.create = create_w;
    J.destroy = nvJitLinkDestroy;
    J.add_data = nvJitLinkAddData;
    J.add_file = nvJitLinkAddFile;
    J.complete = nvJitLinkComplete;
    J.size[0] = nvJitLinkGetLinkedCubinSize;
    J.get[0] = g_cubin;
    J.size[1] = nvJitLinkGetLinkedPtxSize;
    J.get[1] = g_ptx;
#if REL_AT_LEAST(13, 1)
    J.size[2] = nvJitLinkGetLinkedLTOIRSize;
    J.get[2] = g_ltoir;
#endif
    J.size[3] = nvJitLinkGetErrorLogSize;
    J.get[3] = g_err;
    J.size[4] = nvJitLinkGetInfoLogSize;
    J.get[4] = g_info;
}
#endif

static void *slurp(const char *dir, const char *f, size_t *n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        perror(path);
        exit(2);
    }
    fseek(fp, 0, SEEK_END);
    *n = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    if (fread(b, 1, *n, fp) != *n)
        exit(2);
    b[*n] = 0;
    fclose(fp);
    return b;
}

struct scen {
    const char *name;
    const char *opts[4];
    struct {
        int file;
        nvJitLinkInputType type;
        const char *what;
    } in[3];
};

static int run_link(const char *dir)
{
    jl_load();
    static const struct scen scens[] = {
        {"lto2",
         {"-arch=sm_80", "-lto"},
         {{0, NVJITLINK_INPUT_LTOIR, "a.ltoir"}, {0, NVJITLINK_INPUT_LTOIR, "b.ltoir"}}},
        {"lto2-ptx",
         {"-arch=sm_80", "-lto", "-ptx"},
         {{0, NVJITLINK_INPUT_LTOIR, "a.ltoir"}, {0, NVJITLINK_INPUT_LTOIR, "b.ltoir"}}},
        {"ptx2",
         {"-arch=sm_80"},
         {{0, NVJITLINK_INPUT_PTX, "a.ptx"}, {0, NVJITLINK_INPUT_PTX, "b.ptx"}}},
        {"ptx-file",
         {"-arch=sm_80"},
         {{1, NVJITLINK_INPUT_PTX, "a.ptx"}, {0, NVJITLINK_INPUT_PTX, "b.ptx"}}},
        {"undefined", {"-arch=sm_80", "-lto"}, {{0, NVJITLINK_INPUT_LTOIR, "u.ltoir"}}},
    };
    for (size_t k = 0; k < sizeof scens / sizeof *scens; k++) {
        const struct scen *s = &scens[k];
        fprintf(dump, "@%s\n", s->name);
        int no = 0;
        while (no < 4 && s->opts[no])
            no++;
        nvJitLinkHandle h = NULL;
        nvJitLinkResult rc = J.create(&h, (uint32_t)no, (const char **)s->opts);
        fprintf(dump, "  create rc=%d\n", rc);
        if (rc != NVJITLINK_SUCCESS)
            continue;
        for (int i = 0; i < 3 && s->in[i].what; i++) {
            char path[4096];
            if (s->in[i].file) {
                snprintf(path, sizeof path, "%s/%s", dir, s->in[i].what);
                rc = J.add_file(h, s->in[i].type, path);
            } else {
                size_t n;
                void *b = slurp(dir, s->in[i].what, &n);
                rc = J.add_data(h, s->in[i].type, b, n, s->in[i].what);
                free(b);
            }
            fprintf(dump, "  add %s rc=%d\n", s->in[i].what, rc);
        }
        fprintf(dump, "  complete rc=%d\n", J.complete(h));
        for (int g = 0; g < 5; g++) {
            if (J.size[g] == NULL) {
                skipped("nvJitLinkGetLinkedLTOIR");
                continue;
            }
            size_t n = 777;
            nvJitLinkResult src = J.size[g](h, &n), nrc = J.size[g](h, NULL);
            size_t cap = src == NVJITLINK_SUCCESS && n != 777 && n < (1u << 28) ? n : 64;
            unsigned char *buf = malloc(cap + 1);
            memset(buf, 0x5a, cap + 1);
            nvJitLinkResult grc = J.get[g](h, buf);
            fprintf(dump, "  %s: size rc=%d size=%zu null rc=%d get rc=%d fnv=%016llx guard=%d\n",
                    gnames[g], src, n, nrc, grc, (unsigned long long)fnv(buf, cap), buf[cap]);
            if (g >= 3 && grc == NVJITLINK_SUCCESS && cap != 64)
                fprintf(dump, "  %s text: [%.*s]\n", gnames[g], (int)cap, (char *)buf);
            if (g == 0 && grc == NVJITLINK_SUCCESS && cap != 64) {
                char path[4096];
                snprintf(path, sizeof path, "%s/out-%s", dir, s->name);
                FILE *f = fopen(path, "wb");
                fwrite(buf, 1, cap, f);
                fclose(f);
            }
            free(buf);
        }
        fprintf(dump, "  destroy rc=%d\n", J.destroy(&h));
    }
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "nvrtc")) {
        dump = fopen(argv[2], "w");
        return dump ? run_nvrtc() : 2;
    }
#ifdef KC_JITLINK
    if (argc >= 3 && !strcmp(argv[1], "gen"))
        return gen(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "link")) {
        dump = fopen(argv[3], "w");
        return dump ? run_link(argv[2]) : 2;
    }
#endif
    fprintf(stderr, "usage: ver_client nvrtc DUMP | gen DIR | link DIR DUMP\n");
    return 2;
}
