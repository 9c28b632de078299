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
#include <errno.h>
#include <pthread.h>
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

/* ---- the TLS object ------------------------------------------------------ */

static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static const struct kc_tls_api *tls_api_loaded;
static char tls_why[200] = "not found";

static void tls_load_once(void)
{
    /* Installed beside this object (lib/), or above the tool's bin/; in a
     * build tree, store/remote/ seen from shim/, tools/, store/db/ and
     * tests/remote/. */
    static const char *const rel[] = {
        "/" KC_TLS_SONAME,
        "/../lib/" KC_TLS_SONAME,
        "/../store/remote/" KC_TLS_SONAME,
        "/../remote/" KC_TLS_SONAME,
        "/../../store/remote/" KC_TLS_SONAME,
    };
    char self[PATH_MAX];
    Dl_info info;
    if (dladdr((void *)kc__tls_load, &info) == 0 || info.dli_fname == NULL ||
        info.dli_fname[0] != '/' || realpath(info.dli_fname, self) == NULL) {
        if (realpath("/proc/self/exe", self) == NULL)
            self[0] = '\0';
    }
    void *h = NULL;
    char *slash = strrchr(self, '/');
    if (self[0] == '/' && slash != NULL) {
        *slash = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof *rel && h == NULL; i++) {
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s%s", self, rel[i]);
            char real[PATH_MAX];
            if (access(path, R_OK) == 0 && kc_trusted_path(path, real, sizeof real, NULL) == 0)
                h = dlopen(real, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (h == NULL)
        h = dlopen(KC_TLS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *e = dlerror();
        snprintf(tls_why, sizeof tls_why, "%s not found (%s): kcache was built without TLS",
                 KC_TLS_SONAME, e != NULL ? e : "no such file");
        return;
    }
    const struct kc_tls_api *api = dlsym(h, KC_TLS_SYMBOL);
    if (api == NULL || api->abi != KC_TLS_ABI) {
        snprintf(tls_why, sizeof tls_why, "%s is of another kcache build", KC_TLS_SONAME);
        return;
    }
    tls_api_loaded = api;
}

int kc__tls_load(const struct kc_tls_api **out, char *why, size_t whylen)
{
    pthread_once(&tls_once, tls_load_once);
    if (tls_api_loaded == NULL) {
        if (why != NULL && whylen > 0)
            snprintf(why, whylen, "%s", tls_why);
        return -ENOSYS;
    }
    *out = tls_api_loaded;
    return 0;
}
