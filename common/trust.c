/*
 * trust.c: kc_trusted_path (trust.h). A library preloaded into every
 * program of a user finds its tool and libraries beside itself; a tree
 * unpacked under a directory another user can write (/tmp, a shared
 * scratch directory) must not let that user put a file where the lookup
 * goes. libc only.
 */
#include "trust.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether gid is this user's private group (a user private group, as
 * Debian, Ubuntu and Fedora make for every user: umask 002 leaves their
 * directories group-writable): the user's primary group, named as the
 * user, with no member but the user. Its writers are the user alone. */
static bool private_group(gid_t gid, uid_t me)
{
    if (gid != getegid())
        return false;
    char pbuf[4096], gbuf[16384];
    struct passwd pw, *pwp = NULL;
    struct group gr, *grp = NULL;
    if (getpwuid_r(me, &pw, pbuf, sizeof pbuf, &pwp) != 0 || pwp == NULL ||
        getgrgid_r(gid, &gr, gbuf, sizeof gbuf, &grp) != 0 || grp == NULL ||
        strcmp(grp->gr_name, pwp->pw_name) != 0)
        return false;
    for (char **m = grp->gr_mem; m != NULL && *m != NULL; m++)
        if (strcmp(*m, pwp->pw_name) != 0)
            return false;
    return true;
}

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
        bool others_write = (st.st_mode & S_IWOTH) != 0 ||
                            ((st.st_mode & S_IWGRP) != 0 && !private_group(st.st_gid, me));
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
