/*
 * Replays a saved corpus through one fuzz target without libFuzzer:
 *
 *   fuzz-replay-TARGET DIR_OR_FILE...   feeds every file to the target;
 *                                       exit 0 when all ran, 1 when there
 *                                       was nothing to run
 *   fuzz-replay-TARGET --seeds DIR      writes the target's seed corpus
 *
 * Built with -fsanitize=address,undefined where the compiler has them, so a
 * regression input that once crashed the target fails the test again.
 */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    unsigned char *b = malloc(cap);
    size_t r;
    while (b && (r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap)
            b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (!b)
        abort();
    /* An exact-size copy: reads past the input are caught. */
    unsigned char *exact = kc_fuzz_dup(b, n);
    free(b);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--seeds")) {
        int n = kc_fuzz_seeds(argv[2]);
        if (n < 0) {
            fprintf(stderr, "seeds: %s\n", strerror(-n));
            return 1;
        }
        printf("%d seeds written to %s\n", n, argv[2]);
        return 0;
    }
    long total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i]) == 0)
                total++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d)
            return 1;
        char **names = NULL;
        size_t nn = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            names = realloc(names, (nn + 1) * sizeof *names);
            names[nn++] = strdup(de->d_name);
        }
        closedir(d);
        if (nn)
            qsort(names, nn, sizeof *names, cmp);
        for (size_t k = 0; k < nn; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
            if (replay_file(path) == 0)
                total++;
            free(names[k]);
        }
        free(names);
    }
    printf("replayed %ld inputs\n", total);
    return total > 0 ? 0 : 1;
}
