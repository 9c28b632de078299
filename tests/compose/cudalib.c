/*
 * libcompose-cuda.so: a library linked against libcuda.so.1 (the stand-in)
 * that a host dlopen()s RTLD_LOCAL, as Python loads PyCUDA's _driver.so or
 * Triton's cuda_utils.so. It calls every kind of hooked entry point by name
 * (memo, JIT loads, cuGetProcAddress, cuLink*) and prints each result, so a
 * run under the shim must print exactly what a run without it prints.
 *
 *   compose_driver(PTX, PTX2)
 */
#include <cuda.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf != NULL && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (buf != NULL)
        buf[len] = '\0';
    fclose(f);
    *n = (size_t)len;
    return buf;
}

#define SHOW(what, call)                                                                           \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        printf("%s: %d\n", what, (int)rc_);                                                        \
        bad += rc_ != CUDA_SUCCESS;                                                                \
    } while (0)

__attribute__((visibility("default"))) int compose_driver(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "compose_driver PTX PTX2\n");
        return 2;
    }
    size_t n1, n2;
    char *ptx = slurp(argv[0], &n1), *ptx2 = slurp(argv[1], &n2);
    if (ptx == NULL || ptx2 == NULL) {
        perror("compose_driver");
        return 2;
    }
    int bad = 0;
    CUdevice dev;
    CUcontext ctx;
    CUmodule m, m2;
    CUfunction f;
    CUdeviceptr p;
    CUlibrary lib;
    CUkernel k;
    SHOW("cuInit", cuInit(0));
    SHOW("cuDeviceGet", cuDeviceGet(&dev, 0));
    SHOW("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev));
    SHOW("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
    SHOW("cuModuleLoadData", cuModuleLoadData(&m, ptx));
    SHOW("cuModuleGetFunction", cuModuleGetFunction(&f, m, "add1"));
    SHOW("cuModuleGetFunction again", cuModuleGetFunction(&f, m, "scale"));
    SHOW("cuMemAlloc", cuMemAlloc(&p, 4096));
    SHOW("cuMemFree", cuMemFree(p));
    size_t free_b = 0, total_b = 0;
    SHOW("cuMemGetInfo", cuMemGetInfo(&free_b, &total_b));
    /* The pointer cuGetProcAddress hands out is called as the host would. */
    void *fn = NULL;
    CUdriverProcAddressQueryResult q;
    SHOW("cuGetProcAddress", cuGetProcAddress("cuModuleLoadDataEx", &fn, 12000, 0, &q));
    if (fn != NULL)
        SHOW("cuModuleLoadDataEx via cuGetProcAddress",
             ((CUresult(*)(CUmodule *, const void *, unsigned, CUjit_option *, void **))fn)(
                 &m2, ptx2, 0, NULL, NULL));
    else
        printf("cuGetProcAddress gave no pointer\n"), bad++;
    SHOW("cuModuleGetFunction other", cuModuleGetFunction(&f, m2, "other"));
    SHOW("cuLibraryLoadData", cuLibraryLoadData(&lib, ptx2, NULL, NULL, 0, NULL, NULL, 0));
    SHOW("cuLibraryGetKernel", cuLibraryGetKernel(&k, lib, "add1"));
    CUlinkState ls;
    void *cubin = NULL;
    size_t cubin_n = 0;
    SHOW("cuLinkCreate", cuLinkCreate(0, NULL, NULL, &ls));
    SHOW("cuLinkAddData", cuLinkAddData(ls, CU_JIT_INPUT_PTX, ptx, n1 + 1, "k.ptx", 0, NULL, NULL));
    SHOW("cuLinkComplete", cuLinkComplete(ls, &cubin, &cubin_n));
    printf("linked cubin: %s\n", cubin != NULL && cubin_n > 0 ? "yes" : "no");
    SHOW("cuLinkDestroy", cuLinkDestroy(ls));
    SHOW("cuLibraryUnload", cuLibraryUnload(lib));
    SHOW("cuModuleUnload", cuModuleUnload(m));
    SHOW("cuModuleUnload 2", cuModuleUnload(m2));
    SHOW("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease(dev));
    free(ptx);
    free(ptx2);
    printf("errors: %d\n", bad);
    return bad != 0;
}
