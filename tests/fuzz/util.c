/* Helpers shared by every fuzz target (fuzz.h). */
#include "fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *kc_fuzz_dup(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (!q)
        abort();
    if (n)
        memcpy(q, p, n);
    return q;
}

int kc_fuzz_write_seed(const char *dir, const char *name, const void *p, size_t n)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/seed-%s", dir, name) >= (int)sizeof path)
        return -ENAMETOOLONG;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        b += w;
        n -= (size_t)w;
    }
    return close(fd) == 0 ? 0 : -errno;
}

void kc_fuzz_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: property failed: %s\n", file, line, what);
    abort();
}
