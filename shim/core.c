/*
 * The bottom of the shim, which every other part may use and which uses
 * none: the configuration, read once on first use, kcache's own build,
 * where libkcache.so lies, and the re-entry guard.
 */
#include "core.h"
#include "../store/local/local.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ---------------------------------------------------- */

static struct kc_config config;
KC__HOT static pthread_once_t config_once = PTHREAD_ONCE_INIT;
KC__HOT static bool config_loaded; /* config_init ran (kc__state_fini reads it) */

static void config_init(void)
{
    kc_config_load_zeroed(&config); /* static, loaded once: all zero */
    __atomic_store_n(&config_loaded, true, __ATOMIC_RELEASE);
    kc__log_set_level(config.log_level);
    for (int i = 0; i < config.n_warnings; i++)
        kc_log(KC_LOG_WARN, "%s", config.warnings[i]);
}

const struct kc_config *kc__config(void)
{
    pthread_once(&config_once, config_init);
    return &config;
}

bool kc__config_loaded(void)
{
    return __atomic_load_n(&config_loaded, __ATOMIC_ACQUIRE);
}

uint64_t kc__self_build(void)
{
    static uint64_t build;
    uint64_t b = __atomic_load_n(&build, __ATOMIC_RELAXED);
    if (b != 0)
        return b;
    kc_digest d = {0, 1};
    kc__loaded_identity((const void *)kc__self_build, &d);
    b = d.lo ? d.lo : 1;
    __atomic_store_n(&build, b, __ATOMIC_RELAXED);
    return b;
}

/* ---- re-entry guard --------------------------------------------------- */

static __thread int guard_depth __attribute__((tls_model("initial-exec")));

bool kc__guard_enter(void)
{
    if (guard_depth > 0)
        return false;
    guard_depth++;
    return true;
}

void kc__guard_exit(void)
{
    guard_depth--;
}

bool kc__guard_held(void)
{
    return guard_depth > 0;
}

/* ---- where libkcache.so lies ------------------------------------------- */

/* libkcache.so's absolute path, found before main (kc__self_locate, from
 * the entry's constructor): the kcache
 * tool and the store library are looked for beside it, never relative to
 * the working directory, which the host may change to one another user
 * controls. Empty: unknown. */
static char self_path[PATH_MAX];

void kc__self_locate(void)
{
    kc_config_pin_cwd();
    if (kc__object_path((const void *)kc__self_locate, self_path, sizeof self_path) == 0)
        return;
    self_path[0] = '\0';
    /* No /proc: a relative name is resolved now, against the working
     * directory the loader used, before main can change it. */
    Dl_info info;
    char real[PATH_MAX];
    if (dladdr((void *)kc__self_locate, &info) != 0 && info.dli_fname != NULL &&
        info.dli_fname[0] != '\0' && realpath(info.dli_fname, real) != NULL)
        memcpy(self_path, real, strlen(real) + 1);
}

const char *kc__self_path(void)
{
    return self_path[0] == '/' ? self_path : NULL;
}
