/*
 * dlsym_bench: how long a process takes to resolve a library's entry points
 * one by one with dlsym, as generated bindings do at start-up (cuda.bindings,
 * nvmath-python). scripts/bench runs it with and without the shim preloaded.
 *
 *   dlsym_bench LIBRARY NAMES_FILE
 *
 * NAMES_FILE holds one symbol name per line. Prints one JSON line: the
 * number of names, how many resolved, and the microseconds the whole pass
 * took (the first pass of a fresh process: the one every process pays).
 * Exits 1 if the library cannot be loaded or no name resolves.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: dlsym_bench LIBRARY NAMES_FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "r");
    if (f == NULL) {
        perror(argv[2]);
        return 2;
    }
    size_t n = 0, cap = 0;
    char **names = NULL, line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            char **grown = realloc(names, cap * sizeof *names);
            if (grown == NULL)
                return 2;
            names = grown;
        }
        if ((names[n++] = strdup(line)) == NULL)
            return 2;
    }
    fclose(f);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlsym_bench: %s\n", dlerror());
        return 1;
    }
    size_t found = 0;
    double t0 = now_us();
    for (size_t i = 0; i < n; i++)
        found += dlsym(lib, names[i]) != NULL;
    double us = now_us() - t0;
    printf("{\"names\": %zu, \"resolved\": %zu, \"us\": %.2f}\n", n, found, us);
    return found > 0 ? 0 : 1;
}
