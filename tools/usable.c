/*
 * usable.c: which namespaces this machine's shim would use, so that
 * `kcache import` can say which entries of a bundle are of use here. The
 * namespaces are computed as the shim computes them (shim/nvrtc.c's
 * nvrtc_identity, shim/driver.c's jit namespace), with the shim's own
 * identity functions (shim/hash.c, compiled in); tests/bundle checks that
 * the two agree on a store the shim filled.
 */
#include "bundle.h"

#include "../common/config.h"
#include "../common/identity.h"
#include "../store/store.h"

#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOCAL 64

/* The namespaces found here so far, per kind (lazily). */
static char nvrtc_ns[MAX_LOCAL][64];
static int n_nvrtc;
static int nvrtc_tried[MAX_LOCAL][2]; /* versions looked for: major, minor+1 */
static int n_nvrtc_tried;
static char nvvm_ns[MAX_LOCAL][64];
static int n_nvvm = -1; /* -1: not looked */
static char jit_ns[MAX_LOCAL][32];
static int n_jit = -1; /* -1: not looked; -2: no driver here */

void kc_tool_ns_describe(const char *ns, char *out, size_t n)
{
    int major, minor, fmt, len = 0;
    char id[17];
    if (sscanf(ns, "nvrtc:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
        ns[len] == '\0')
        snprintf(out, n, "NVRTC %d.%d, libnvrtc identity %s, record format %d", major, minor, id,
                 fmt);
    else if (sscanf(ns, "jit:%16[0-9a-f]%n", id, &len) == 1 && ns[len] == '\0')
        snprintf(out, n, "CUDA driver JIT, device and driver fingerprint %s", id);
    else if (sscanf(ns, "nvvm:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
             ns[len] == '\0')
        snprintf(out, n, "libNVVM %d.%d, libnvvm identity %s, record format %d", major, minor, id,
                 fmt);
    else
        snprintf(out, n, "not a namespace kcache's shim uses");
}

/* libnvrtc of this major version, as the loader finds it, else under the
 * toolkit ($CUDA_HOME, /usr/local/cuda). */
static void *open_nvrtc(int major)
{
    char name[64], path[4200];
    snprintf(name, sizeof name, "libnvrtc.so.%d", major);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; h == NULL && i < sizeof roots / sizeof *roots; i++) {
        if (roots[i] == NULL || roots[i][0] != '/')
            continue;
        snprintf(path, sizeof path, "%s/lib64/%s", roots[i], name);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    return h;
}

/* The namespace the shim gives NVRTC major.minor here (kc__nvrtc_namespace, as
 * shim/nvrtc.c), added to nvrtc_ns; nothing when there is none. */
static void local_nvrtc(int want_major, int want_minor)
{
    for (int i = 0; i < n_nvrtc_tried; i++)
        if (nvrtc_tried[i][0] == want_major && nvrtc_tried[i][1] == want_minor + 1)
            return;
    /* Past MAX_LOCAL versions looked for (a bundle may name thousands),
     * no more libraries are loaded: those are not found here. */
    if (n_nvrtc_tried >= MAX_LOCAL)
        return;
    nvrtc_tried[n_nvrtc_tried][0] = want_major;
    nvrtc_tried[n_nvrtc_tried++][1] = want_minor + 1;
    void *h = open_nvrtc(want_major);
    if (h == NULL)
        return;
    int (*version)(int *, int *) = (int (*)(int *, int *))dlsym(h, "nvrtcVersion");
    void *compile = dlsym(h, "nvrtcCompileProgram");
    int major = 0, minor = 0;
    Dl_info info;
    kc_digest d;
    if (version == NULL || compile == NULL || version(&major, &minor) != 0 || major != want_major ||
        minor != want_minor || dladdr(compile, &info) == 0 || info.dli_fname == NULL ||
        kc__loaded_identity(compile, &d) != 0)
        return; /* kept loaded: the namespace was not made here */
    if (n_nvrtc < MAX_LOCAL &&
        kc__nvrtc_namespace(compile, major, minor, KC_FORMAT_VERSION, nvrtc_ns[n_nvrtc],
                            sizeof nvrtc_ns[0], NULL) == 0)
        n_nvrtc++;
}

/* The namespace the shim gives the libnvvm the loader finds here, else the
 * toolkit's ($CUDA_HOME, /usr/local/cuda: lib64/ or nvvm/lib64/), as
 * shim/nvvm.c's nvvm_identity computes it. */
static void local_nvvm(void)
{
    n_nvvm = 0;
    void *h = dlopen("libnvvm.so.4", RTLD_NOW | RTLD_LOCAL);
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    const char *subs[] = {"lib64", "nvvm/lib64"};
    char path[4200];
    for (size_t i = 0; h == NULL && i < sizeof roots / sizeof *roots; i++)
        for (size_t j = 0; h == NULL && j < 2 && roots[i] != NULL && roots[i][0] == '/'; j++) {
            snprintf(path, sizeof path, "%s/%s/libnvvm.so.4", roots[i], subs[j]);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    if (h == NULL)
        return;
    int (*version)(int *, int *) = (int (*)(int *, int *))dlsym(h, "nvvmVersion");
    int (*ir_version)(int *, int *, int *, int *) =
        (int (*)(int *, int *, int *, int *))dlsym(h, "nvvmIRVersion");
    void *compile = dlsym(h, "nvvmCompileProgram");
    int major = 0, minor = 0, ir[4] = {0};
    if (version == NULL || ir_version == NULL || compile == NULL || version(&major, &minor) != 0 ||
        ir_version(&ir[0], &ir[1], &ir[2], &ir[3]) != 0)
        return;
    if (kc__nvvm_namespace(compile, major, minor, ir, KC_FORMAT_VERSION, nvvm_ns[0],
                           sizeof nvvm_ns[0], NULL) == 0)
        n_nvvm = 1;
}

/* The JIT namespaces of this machine's devices (shim/driver.c): compute
 * capability, driver version and the driver library's identity. */
static void local_jit(void)
{
    n_jit = -2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*attr)(int *, int, int) = (int (*)(int *, int, int))dlsym(h, "cuDeviceGetAttribute");
    int (*version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    void *any = dlsym(h, "cuLinkCreate_v2");
    if (any == NULL)
        any = dlsym(h, "cuLinkCreate");
    kc_digest lib;
    int n = 0, v = 0;
    if (init == NULL || count == NULL || get == NULL || attr == NULL || version == NULL ||
        any == NULL || kc__loaded_identity(any, &lib) != 0 || init(0) != 0 || count(&n) != 0 ||
        version(&v) != 0)
        return;
    n_jit = 0;
    for (int i = 0; i < n && n_jit < MAX_LOCAL; i++) {
        int dev = 0, major = 0, minor = 0;
        /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR */
        if (get(&dev, i) != 0 || attr(&major, 75, dev) != 0 || attr(&minor, 76, dev) != 0)
            continue;
        if (kc__jit_namespace(major, minor, v, &lib, jit_ns[n_jit], sizeof jit_ns[0], NULL) == 0)
            n_jit++;
    }
}

int kc_tool_ns_usable(const char *ns)
{
    int major, minor, fmt, len = 0;
    char id[17];
    if (sscanf(ns, "nvrtc:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
        ns[len] == '\0') {
        if (fmt != KC_FORMAT_VERSION)
            return 0;
        local_nvrtc(major, minor);
        for (int i = 0; i < n_nvrtc; i++)
            if (strcmp(nvrtc_ns[i], ns) == 0)
                return 1;
        return 0;
    }
    if (sscanf(ns, "nvvm:%d.%d-%16[0-9a-f]-f%d%n", &major, &minor, id, &fmt, &len) == 4 &&
        ns[len] == '\0') {
        if (fmt != KC_FORMAT_VERSION)
            return 0;
        if (n_nvvm == -1)
            local_nvvm();
        for (int i = 0; i < n_nvvm; i++)
            if (strcmp(nvvm_ns[i], ns) == 0)
                return 1;
        return 0;
    }
    if (sscanf(ns, "jit:%16[0-9a-f]%n", id, &len) == 1 && ns[len] == '\0') {
        if (n_jit == -1)
            local_jit();
        for (int i = 0; i < n_jit; i++)
            if (strcmp(jit_ns[i], ns) == 0)
                return 1;
        return 0;
    }
    return -1;
}
