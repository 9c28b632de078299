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
    return fn(argc - 3, argv + 3);
}
