/*
 * compose-host: a host program that loads a library the way Python loads an
 * extension module (dlopen RTLD_NOW | RTLD_LOCAL) and runs one of its
 * functions. It links neither libcuda nor NVRTC nor nvJitLink itself.
 *
 *   compose-host LIBRARY FUNCTION [ARGS...]
 *
 * FUNCTION is `int FUNCTION(int argc, char **argv)`, given ARGS; its return
 * value is the exit status.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: compose-host LIBRARY FUNCTION [ARGS...]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
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
