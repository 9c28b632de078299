/*
 * compose-host: a host program that loads a library the way Python loads an
 * extension module (dlopen RTLD_NOW | RTLD_LOCAL) and runs one of its
 * functions. It links neither libcuda nor NVRTC nor nvJitLink itself.
 *
 *   compose-host LIBRARY FUNCTION [ARGS...]
 *
 * KCACHE_TEST_COMPOSE_GLOBAL=1 loads it RTLD_GLOBAL instead.
 * FUNCTION is `int FUNCTION(int argc, char **argv)`, given ARGS; its return
 * value is the exit status.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* KCACHE_TEST_COMPOSE_SECOND=PATH: afterwards, a second copy of libcuda.so.1
 * (another file) dlopen'ed RTLD_LOCAL and used through dlsym, loading the
 * first argument (PTX) and KCACHE_TEST_COMPOSE_SECOND_FATBIN. Its state is its own: the shim must
 * never hand it the first copy's handles or functions, nor the first copy this one's. */
static int second_copy(const char *path, const char *ptx_path)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "compose-host: %s\n", dlerror());
        return 1;
    }
    FILE *f = fopen(ptx_path, "rb");
    static char ptx[1 << 20];
    size_t n = f != NULL ? fread(ptx, 1, sizeof ptx - 1, f) : 0;
    if (f != NULL)
        fclose(f);
    ptx[n] = '\0';
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
    int (*retain)(void **, int) = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
    int (*set)(void *) = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
    int (*load)(void **, const void *) =
        (int (*)(void **, const void *))dlsym(lib, "cuModuleLoadData");
    int (*getfn)(void **, void *, const char *) =
        (int (*)(void **, void *, const char *))dlsym(lib, "cuModuleGetFunction");
    int (*unload)(void *) = (int (*)(void *))dlsym(lib, "cuModuleUnload");
    /* A hooked entry point the first copy's user never called. */
    int (*load_fat)(void **, const void *) =
        (int (*)(void **, const void *))dlsym(lib, "cuModuleLoadFatBinary");
    int (*release)(int) = (int (*)(int))dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    if (!init || !get || !retain || !set || !load || !getfn || !unload || !release || !load_fat) {
        fprintf(stderr, "compose-host: the second copy lacks an entry point\n");
        return 1;
    }
    Dl_info a, b;
    void *first = dlsym(RTLD_DEFAULT, "cuInit");
    printf("second copy distinct: %s\n",
           dladdr((void *)init, &b) != 0 &&
                   (first == NULL || (dladdr(first, &a) != 0 && a.dli_fbase != b.dli_fbase))
               ? "yes"
               : "no");
    int dev = -1, bad = 0, rc;
    void *ctx = NULL, *mod = NULL, *fun = NULL;
#define SECOND(what, call)                                                                         \
    rc = (call);                                                                                   \
    printf("second %s: %d\n", what, rc);                                                           \
    bad += rc != 0
    SECOND("cuInit", init(0));
    SECOND("cuDeviceGet", get(&dev, 0));
    SECOND("cuDevicePrimaryCtxRetain", retain(&ctx, dev));
    SECOND("cuCtxSetCurrent", set(ctx));
    SECOND("cuModuleLoadData", load(&mod, ptx));
    SECOND("cuModuleGetFunction", getfn(&fun, mod, "add1"));
    SECOND("cuModuleUnload", unload(mod));
    /* The same PTX as a fatbinary (KCACHE_TEST_COMPOSE_SECOND_FATBIN). */
    const char *fat_path = getenv("KCACHE_TEST_COMPOSE_SECOND_FATBIN");
    if (fat_path != NULL) {
        FILE *ff = fopen(fat_path, "rb");
        static char fat[1 << 20];
        size_t fn = ff != NULL ? fread(fat, 1, sizeof fat, ff) : 0;
        if (ff != NULL)
            fclose(ff);
        printf("second fatbinary: %zu bytes\n", fn);
        SECOND("cuModuleLoadFatBinary", load_fat(&mod, fat));
        SECOND("cuModuleGetFunction fatbinary", getfn(&fun, mod, "add1"));
        SECOND("cuModuleUnload fatbinary", unload(mod));
    }
    SECOND("cuDevicePrimaryCtxRelease", release(dev));
    return bad != 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: compose-host LIBRARY FUNCTION [ARGS...]\n");
        return 2;
    }
    /* KCACHE_TEST_COMPOSE_GLOBAL=1: RTLD_GLOBAL instead (the library and
     * what it links then join the global scope). */
    const char *global = getenv("KCACHE_TEST_COMPOSE_GLOBAL");
    int mode = global != NULL && global[0] == '1' ? RTLD_GLOBAL : RTLD_LOCAL;
    void *lib = dlopen(argv[1], RTLD_NOW | mode);
    if (lib == NULL) {
        fprintf(stderr, "compose-host: %s\n", dlerror());
        return 2;
    }
    int (*fn)(int, char **) = (int (*)(int, char **))dlsym(lib, argv[2]);
    if (fn == NULL) {
        fprintf(stderr, "compose-host: %s\n", dlerror());
        return 2;
    }
    int rc = fn(argc - 3, argv + 3);
    const char *second = getenv("KCACHE_TEST_COMPOSE_SECOND");
    if (second != NULL && argc > 3)
        rc |= second_copy(second, argv[3]);
    return rc;
}
