/*
 * trust.c: kc_trusted_path (trust.h). A library preloaded into every
 * program of a user finds its tool and libraries beside itself; a tree
 * unpacked under a directory another user can write (/tmp, a shared
 * scratch directory) must not let that user put a file where the lookup
 * goes. libc only.
 */
#include "trust.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void set_bad(char *bad, size_t len, const char *what)
{
    if (bad != NULL && len > 0) {
        size_t n = strlen(what);
        if (n >= len)
            n = len - 1;
        memcpy(bad, what, n);
        bad[n] = '\0';
    }
}

int kc_trusted_path(const char *path, char *real, size_t len, char *bad)
{
    char cur[PATH_MAX];
    if (path == NULL || realpath(path, cur) == NULL)
        return path == NULL ? -EINVAL : -errno;
    size_t n = strlen(cur);
    if (n >= len)
        return -ENAMETOOLONG;
    memcpy(real, cur, n + 1); /* checked below, then used as it is */
    uid_t me = geteuid();
    /* The file first, then each directory up to "/"; realpath left no
     * symbolic link on the way, so lstat sees what the path names. */
    for (bool file = true;; file = false) {
        struct stat st;
        if (lstat(cur, &st) != 0) {
            int e = -errno;
            real[0] = '\0';
            return e;
        }
        bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
        bool sticky_dir = !file && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) != 0;
        if ((st.st_uid != me && st.st_uid != 0) || (others_write && !sticky_dir)) {
            set_bad(bad, len, cur);
            real[0] = '\0';
            return -EPERM;
        }
        char *slash = strrchr(cur, '/');
        if (slash == NULL || (slash == cur && cur[1] == '\0'))
            break;
        slash[slash == cur ? 1 : 0] = '\0';
    }
    return 0;
}
