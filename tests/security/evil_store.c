/*
 * evil_store: what a hostile user plants as build/store/db/libkcache-store.so
 * (tests/security/test_exec.py). Its constructor creates the file
 * $KCACHE_TEST_MARKER/store-loaded, so the test sees if any process loaded
 * it; it exports nothing the shim looks for.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void evil_init(void)
{
    const char *dir = getenv("KCACHE_TEST_MARKER");
    char path[4096];
    if (dir == NULL || snprintf(path, sizeof path, "%s/store-loaded", dir) >= (int)sizeof path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd >= 0) {
        ssize_t w = write(fd, "loaded\n", 7);
        (void)w;
        close(fd);
    }
}
