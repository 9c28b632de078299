/*
 * libcompose-rtc.so: a library linked against libnvrtc.so.13 and
 * libnvJitLink.so.13 that a host dlopen()s RTLD_LOCAL (as Python loads an
 * extension module). It compiles a kernel with NVRTC to LTO-IR and to a
 * cubin, links the LTO-IR with nvJitLink, and prints every result code, the
 * sizes and a digest of each output, so a run under the shim must print
 * exactly what a run without it prints.
 *
 *   compose_rtc(ARCH)        e.g. sm_90
 */
#include <nvJitLink.h>
#include <nvrtc.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static const char *src = "extern \"C\" __global__ void kc_compose(float *x, float a)\n"
                         "{ x[threadIdx.x] = x[threadIdx.x] * a + 1.0f; }\n";

static uint64_t fnv(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

#define SHOW(what, call)                                                                           \
    do {                                                                                           \
        int rc_ = (int)(call);                                                                     \
        printf("%s: %d\n", what, rc_);                                                             \
        bad += rc_ != 0;                                                                           \
    } while (0)

static int compile(const char *arch_opt, int lto, char **out, size_t *n)
{
    int bad = 0;
    nvrtcProgram prog;
    SHOW("nvrtcCreateProgram", nvrtcCreateProgram(&prog, src, "compose.cu", 0, NULL, NULL));
    const char *opts[] = {arch_opt, "-dlto"};
    SHOW("nvrtcCompileProgram", nvrtcCompileProgram(prog, lto ? 2 : 1, opts));
    size_t log_n = 0;
    SHOW("nvrtcGetProgramLogSize", nvrtcGetProgramLogSize(prog, &log_n));
    *n = 0;
    SHOW(lto ? "nvrtcGetLTOIRSize" : "nvrtcGetCUBINSize",
         lto ? nvrtcGetLTOIRSize(prog, n) : nvrtcGetCUBINSize(prog, n));
    *out = malloc(*n ? *n : 1);
    SHOW(lto ? "nvrtcGetLTOIR" : "nvrtcGetCUBIN",
         lto ? nvrtcGetLTOIR(prog, *out) : nvrtcGetCUBIN(prog, *out));
    printf("%s: %zu bytes, digest %016llx\n", lto ? "ltoir" : "cubin", *n,
           (unsigned long long)fnv(*out, *n));
    SHOW("nvrtcDestroyProgram", nvrtcDestroyProgram(&prog));
    return bad;
}

__attribute__((visibility("default"))) int compose_rtc(int argc, char **argv)
{
    if (argc != 1) {
        fprintf(stderr, "compose_rtc ARCH\n");
        return 2;
    }
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "-arch=%s", argv[0]);
    int bad = 0;
    char *cubin, *ltoir;
    size_t cubin_n, ltoir_n;
    bad += compile(arch_opt, 0, &cubin, &cubin_n);
    bad += compile(arch_opt, 1, &ltoir, &ltoir_n);

    nvJitLinkHandle h;
    const char *lopts[] = {arch_opt, "-lto"};
    SHOW("nvJitLinkCreate", nvJitLinkCreate(&h, 2, lopts));
    SHOW("nvJitLinkAddData", nvJitLinkAddData(h, NVJITLINK_INPUT_LTOIR, ltoir, ltoir_n, "lto"));
    SHOW("nvJitLinkComplete", nvJitLinkComplete(h));
    size_t n = 0;
    SHOW("nvJitLinkGetLinkedCubinSize", nvJitLinkGetLinkedCubinSize(h, &n));
    char *linked = malloc(n ? n : 1);
    SHOW("nvJitLinkGetLinkedCubin", nvJitLinkGetLinkedCubin(h, linked));
    printf("linked: %zu bytes, digest %016llx\n", n, (unsigned long long)fnv(linked, n));
    SHOW("nvJitLinkDestroy", nvJitLinkDestroy(&h));
    free(cubin);
    free(ltoir);
    free(linked);
    printf("errors: %d\n", bad);
    return bad != 0;
}
