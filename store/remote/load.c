/*
 * Where the remote's libraries come from. A packaged tree (scripts/package,
 * the wheel) ships libkcache-remote-deps.so -- hiredis 0.14 and libsodium
 * linked in statically, glibc its only need -- in lib/, beside the shim and
 * libkcache-store.so and one level above the tool's bin/. Found beside the
 * object holding this code it is loaded by that absolute path; otherwise
 * the system's library by its soname, as a build against the system's
 * packages has always done. Never a path relative to the working
 * directory: the object's own name must be absolute; and never one that
 * another user could replace (kc_trusted_path: a tree unpacked under a
 * directory they can write).
 */
#include "remote_internal.h"
#include "../../common/trust.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KC__REMOTE_DEPS "libkcache-remote-deps.so"

void *kc__remote_dlopen(const char *soname)
{
    /* The object's real path (a symlinked tool finds its own tree); the
     * main program (the tool) as the kernel names it. */
    char self[PATH_MAX];
    Dl_info info;
    if (dladdr((void *)kc__remote_dlopen, &info) == 0 || info.dli_fname == NULL ||
        info.dli_fname[0] != '/' || realpath(info.dli_fname, self) == NULL) {
        if (realpath("/proc/self/exe", self) == NULL)
            self[0] = '\0';
    }
    char *slash = strrchr(self, '/');
    if (self[0] == '/' && slash != NULL) {
        static const char *const rel[] = {"/" KC__REMOTE_DEPS, "/../lib/" KC__REMOTE_DEPS};
        *slash = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s%s", self, rel[i]);
            char real[PATH_MAX];
            if (access(path, R_OK) == 0 && kc_trusted_path(path, real, sizeof real, NULL) == 0)
                return dlopen(real, RTLD_NOW | RTLD_LOCAL);
        }
    }
    return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}
