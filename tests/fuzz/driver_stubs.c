/*
 * What shim/driver.c needs from the rest of the shim, stubbed for the
 * driver fuzz target: no store, no real driver, caching off.
 */
#include "shim.h"

#include <stdlib.h>

const struct kc_config *kc__config(void)
{
    static struct kc_config cfg;
    cfg.disable = 1;
    return &cfg;
}

struct kc_store *kc__store(const struct kc_store_ops **api)
{
    *api = NULL;
    return NULL;
}

void kc__count(const char *backend, const struct kc_counters *c) {}
void kc__pass_reason(const char *backend, enum kc_pass_reason r) {}
uint64_t kc__self_build(void)
{
    return 1;
}
bool kc__guard_enter(void)
{
    return false;
}
void kc__guard_exit(void) {}
bool kc__guard_held(void)
{
    return false;
}
const struct kc__hook *kc__hook_find(const char *name, int lib)
{
    return NULL;
}
void *kc__hook_real(const struct kc__hook *h)
{
    return NULL;
}
void *kc__swap(const char *asked, void *fn)
{
    return fn;
}
void *kc__real_dlsym(void *handle, const char *name)
{
    return NULL;
}
void *kc__lib_real(int lib, const char *name)
{
    return NULL;
}
void kc_log(int level, const char *fmt, ...) {}
int kc__flight_acquire(const kc_digest *id, bool *waited)
{
    *waited = false;
    return -1;
}
void kc__flight_release(int fd) {}
int kc__flight_remote(const char *ns, const kc_key *key, int (*poll)(void *arg), void *arg,
                      bool *held)
{
    *held = false;
    return 0;
}
void kc__flight_remote_release(const char *ns, const kc_key *key, bool held, bool stored,
                               size_t len)
{
}
