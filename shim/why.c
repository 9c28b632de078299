/*
 * why.c: miss records written by the hooks (why.h).
 */
#include "why.h"

#include "shim.h"
#include "../store/remote/remote.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

uint64_t kc__why_refused(void)
{
    struct kc_remote *r = kc__remote();
    struct kc_remote_counters c = {0};
    if (r != NULL)
        kc_remote_counters(r, &c);
    return c.bad_signatures;
}

void kc__why_library(struct kc_why *w, const char *label, const void *fn, const kc_digest *id,
                     const char *version)
{
    Dl_info di;
    char shown[4200];
    snprintf(shown, sizeof shown, "%s (%s)",
             fn != NULL && dladdr(fn, &di) != 0 && di.dli_fname ? di.dli_fname : "?",
             version ? version : "");
    kc_why_add(w, "library", label, id, shown);
    uint64_t b = kc__self_build();
    kc_digest bd = kc_digest_of(&b, sizeof b);
    snprintf(shown, sizeof shown, "build %016" PRIx64, b);
    kc_why_add(w, "kcache", "", &bd, shown);
}

void kc__why_deps(struct kc_why *w, const struct kc__deps *d)
{
    for (size_t i = 0; i < d->n; i++) {
        const struct kc__dep *e = &d->v[i];
        char path[4200];
        /* (a file below the bundled headers directory, whichever it is) */
        snprintf(path, sizeof path, "%s%s",
                 e->path[0] == KC_DEP_BUNDLED ? "(bundled headers)/" : "",
                 e->path + (e->path[0] == KC_DEP_BUNDLED));
        switch (e->kind) {
        case KC_DEP_FILE: {
            char shown[32];
            snprintf(shown, sizeof shown, "%lld bytes", (long long)e->st.st_size);
            kc_why_add(w, "file", path, &e->digest, shown);
            break;
        }
        case KC_DEP_ABSENT:
            kc_why_state(w, "file", path, "absent");
            break;
        case KC_DEP_DIR:
            kc_why_state(w, "file", path, "directory");
            break;
        case KC_DEP_CWD:
            kc_why_add(w, "cwd", "relative paths", NULL, e->path);
            break;
        default:
            kc_why_state(w, "file", path, "exists");
        }
    }
}

void kc__why_finish(struct kc_why *w, const kc_digest *key, uint64_t build, const char *stored,
                    uint64_t compile_ns, uint64_t refused_before)
{
    const struct kc_config *cfg = kc__config();
    if (cfg->readonly || cfg->dir[0] == 0) {
        kc_why_free(w);
        return;
    }
    uint64_t refused = kc__why_refused() - refused_before;
    int rc = kc_why_write(w, cfg->dir, key, build, stored ? stored : "1", compile_ns, refused);
    if (rc != 0)
        kc_log(KC_LOG_DEBUG, "cannot write a miss record in %s/%s: %s", cfg->dir, KC_WHY_DIR,
               strerror(-rc));
}
