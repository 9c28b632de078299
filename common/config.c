/*
 * kcache configuration, read from the environment once. See config.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <unistd.h>

enum {
    V_DIR,
    V_DISABLE,
    V_READONLY,
    V_RECACHE,
    V_MAXSIZE,
    V_LOG,
    V_STATS,
    V_NVRTC,
    V_JIT,
    V_MEMO,
    V_ALLOC,
    V_ALLOC_POOL,
    V_ALLOC_FALLBACK,
    V_LOCK_TIMEOUT,
    V_SINGLE_FLIGHT,
    V_LINK,
    V_COUNT
};

const struct kc_config_var kc_config_vars[] = {
    [V_DIR] = {"KCACHE_DIR", "cache directory"},
    [V_DISABLE] = {"KCACHE_DISABLE", "turn every part of kcache off"},
    [V_READONLY] = {"KCACHE_READONLY", "serve hits, store nothing"},
    [V_RECACHE] = {"KCACHE_RECACHE", "compile and overwrite, never serve"},
    [V_MAXSIZE] = {"KCACHE_MAXSIZE", "size limit of the store"},
    [V_LOG] = {"KCACHE_LOG", "log level: error|warn|info|debug"},
    [V_STATS] = {"KCACHE_STATS", "print a summary line at exit"},
    [V_NVRTC] = {"KCACHE_NVRTC", "cache NVRTC compiles"},
    [V_JIT] = {"KCACHE_JIT", "cache driver JIT of PTX and fatbinaries"},
    [V_MEMO] = {"KCACHE_MEMO", "memoize function lookups per context"},
    [V_ALLOC] = {"KCACHE_ALLOC", "pool freed device blocks per context"},
    [V_ALLOC_POOL] = {"KCACHE_ALLOC_POOL", "pool bound per context"},
    [V_ALLOC_FALLBACK] = {"KCACHE_ALLOC_FALLBACK", "none|managed after a failed allocation"},
    [V_LOCK_TIMEOUT] = {"KCACHE_LOCK_TIMEOUT", "single-flight wait bound, ms"},
    [V_SINGLE_FLIGHT] = {"KCACHE_SINGLE_FLIGHT", "one process compiles a missed key, the rest wait"},
    [V_LINK] = {"KCACHE_LINK", "cache links (nvJitLink, the driver's cuLink*)"},
};
const int kc_config_n_vars = V_COUNT;

static void warn(struct kc_config *cfg, const char *fmt, ...)
{
    if (cfg->n_warnings >= KC_CONFIG_MAX_WARNINGS)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->warnings[cfg->n_warnings++], sizeof cfg->warnings[0], fmt, ap);
    va_end(ap);
}

int kc_parse_bool(const char *s, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

int kc_parse_size(const char *s, uint64_t *out)
{
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return -1;
    char *end;
    int saved = errno; /* the host's errno is not ours to change */
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    bool range = errno == ERANGE;
    errno = saved;
    if (range)
        return -1; /* past 2^64: strtoull's ULLONG_MAX is not the value asked for */
    uint64_t mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    case 'T':
        mul = 1ull << 40;
        end++;
        break;
    case 'B':
    case '\0':
        break;
    default:
        return -1;
    }
    if (mul > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return -1;
    if (v > UINT64_MAX / mul)
        return -1;
    *out = (uint64_t)v * mul;
    return 0;
}

const char *kc_log_level_name(int level)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    return level >= 0 && level <= 3 ? names[level] : "?";
}

static const char *env(struct kc_config *cfg, int var)
{
    const char *v = getenv(kc_config_vars[var].name);
    if (v == NULL)
        return NULL;
    cfg->origin[var] = KC_FROM_ENV;
    return v;
}

static void load_bool(struct kc_config *cfg, int var, bool *field)
{
    const char *v = env(cfg, var);
    if (v == NULL)
        return;
    if (*v == '\0') {
        cfg->origin[var] = KC_FROM_DEFAULT;
        return;
    }
    if (kc_parse_bool(v, field) != 0) {
        warn(cfg, "%s=%s is not a boolean (1/0, true/false, yes/no, on/off); using %s",
             kc_config_vars[var].name, v, *field ? "1" : "0");
        cfg->origin[var] = KC_FROM_DEFAULT;
    }
}

static void load_size(struct kc_config *cfg, int var, uint64_t *field)
{
    const char *v = env(cfg, var);
    if (v == NULL)
        return;
    uint64_t n;
    if (kc_parse_size(v, &n) != 0) {
        warn(cfg, "%s=%s is not a size (like 512M or 5G); using the default",
             kc_config_vars[var].name, v);
        cfg->origin[var] = KC_FROM_DEFAULT;
        return;
    }
    *field = n;
}

/* $XDG_CACHE_HOME/kcache, else $HOME/.cache/kcache, each only when
 * absolute; else the passwd entry's home, copied while getpwuid_r's buffer
 * lives. With no absolute home at all, no directory (an empty dir: caching
 * off, with this one warning), never a shared one such as /tmp. */
static void default_dir(struct kc_config *cfg)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg != NULL && xdg[0] == '/') {
        snprintf(cfg->dir, sizeof cfg->dir, "%s/kcache", xdg);
        return;
    }
    const char *home = getenv("HOME");
    if (home != NULL && home[0] == '/') {
        snprintf(cfg->dir, sizeof cfg->dir, "%s/.cache/kcache", home);
        return;
    }
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(getuid(), &pw, buf, sizeof buf, &res) == 0 && res != NULL &&
        res->pw_dir != NULL && res->pw_dir[0] == '/') {
        snprintf(cfg->dir, sizeof cfg->dir, "%s/.cache/kcache", res->pw_dir);
        return;
    }
    cfg->dir[0] = '\0';
    warn(cfg, "no cache directory: HOME is %s and user %u has no home in the passwd database; "
              "caching is off (set KCACHE_DIR)",
         home == NULL ? "unset" : home[0] == '\0' ? "empty" : "not absolute", (unsigned)getuid());
}

/* The working directory when the process started (kc_config_pin_cwd), for a
 * relative KCACHE_DIR; empty when not pinned. */
static char start_cwd[PATH_MAX];

void kc_config_pin_cwd(void)
{
    const char *v = getenv(kc_config_vars[V_DIR].name);
    if (getauxval(AT_SECURE) != 0 || v == NULL || v[0] == '\0' || v[0] == '/')
        return;
    if (getcwd(start_cwd, sizeof start_cwd) == NULL)
        start_cwd[0] = '\0';
}

void kc_config_load(struct kc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->max_size = 5ull << 30;
    cfg->log_level = KC_LOG_WARN;
    cfg->nvrtc = cfg->jit = cfg->memo = cfg->alloc = true;
    cfg->alloc_pool = 256ull << 20;
    cfg->alloc_fallback = KC_ALLOC_FALLBACK_NONE;
    cfg->lock_timeout_ms = 30000;
    cfg->single_flight = true;
    cfg->link = true;

    /* A secure-execution process (set-user-ID or set-group-ID, file
     * capabilities) must not obey its caller's environment, which could
     * name the program kcache starts, the store it loads or the directory
     * it writes: kcache is off there and reads no variable at all. */
    if (getauxval(AT_SECURE) != 0) {
        cfg->disable = true;
        return;
    }

    const char *v = env(cfg, V_DIR);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof cfg->dir - 64) {
            warn(cfg, "KCACHE_DIR is too long; using the default");
            cfg->origin[V_DIR] = KC_FROM_DEFAULT;
            default_dir(cfg);
        } else if (v[0] != '/') {
            /* A relative directory is resolved against the working directory
             * at start-up (pinned before main by the shim), so a process that
             * chdir()s keeps one store and never writes into the directory
             * it moved to. */
            char cwd[PATH_MAX];
            if (start_cwd[0] == '/')
                memcpy(cwd, start_cwd, strlen(start_cwd) + 1);
            if ((start_cwd[0] == '/' || getcwd(cwd, sizeof cwd) != NULL) &&
                strlen(cwd) + strlen(v) + 2 < sizeof cfg->dir - 64)
            {
                size_t a = strlen(cwd), b = strlen(v);
                memcpy(cfg->dir, cwd, a);
                cfg->dir[a] = '/';
                memcpy(cfg->dir + a + 1, v, b + 1);
            }
            else
                snprintf(cfg->dir, sizeof cfg->dir, "%s", v);
        } else {
            snprintf(cfg->dir, sizeof cfg->dir, "%s", v);
        }
    } else {
        cfg->origin[V_DIR] = KC_FROM_DEFAULT;
        default_dir(cfg);
    }

    load_bool(cfg, V_DISABLE, &cfg->disable);
    load_bool(cfg, V_READONLY, &cfg->readonly);
    load_bool(cfg, V_RECACHE, &cfg->recache);
    load_size(cfg, V_MAXSIZE, &cfg->max_size);
    if (cfg->max_size == 0) {
        /* No limit is not a store: 0 means the default, with a warning. */
        warn(cfg, "KCACHE_MAXSIZE=%s is a limit of 0 bytes; using the default (5G)",
             getenv("KCACHE_MAXSIZE"));
        cfg->max_size = 5ull << 30;
        cfg->origin[V_MAXSIZE] = KC_FROM_DEFAULT;
    }
    load_bool(cfg, V_STATS, &cfg->stats);
    load_bool(cfg, V_NVRTC, &cfg->nvrtc);
    load_bool(cfg, V_JIT, &cfg->jit);
    load_bool(cfg, V_MEMO, &cfg->memo);
    load_bool(cfg, V_ALLOC, &cfg->alloc);
    load_size(cfg, V_ALLOC_POOL, &cfg->alloc_pool);
    load_bool(cfg, V_SINGLE_FLIGHT, &cfg->single_flight);
    load_bool(cfg, V_LINK, &cfg->link);

    v = env(cfg, V_LOG);
    if (v != NULL) {
        int found = -1;
        for (int i = 0; i <= KC_LOG_DEBUG; i++)
            if (strcasecmp(v, kc_log_level_name(i)) == 0)
                found = i;
        if (strcasecmp(v, "warning") == 0)
            found = KC_LOG_WARN;
        if (found < 0) {
            warn(cfg, "KCACHE_LOG=%s is not one of error|warn|info|debug; using warn", v);
            cfg->origin[V_LOG] = KC_FROM_DEFAULT;
        } else {
            cfg->log_level = found;
        }
    }

    v = env(cfg, V_ALLOC_FALLBACK);
    if (v != NULL) {
        if (strcasecmp(v, "managed") == 0)
            cfg->alloc_fallback = KC_ALLOC_FALLBACK_MANAGED;
        else if (strcasecmp(v, "none") == 0 || v[0] == '\0')
            cfg->alloc_fallback = KC_ALLOC_FALLBACK_NONE;
        else {
            warn(cfg, "KCACHE_ALLOC_FALLBACK=%s is not one of none|managed; using none", v);
            cfg->origin[V_ALLOC_FALLBACK] = KC_FROM_DEFAULT;
        }
    }

    v = env(cfg, V_LOCK_TIMEOUT);
    if (v != NULL) {
        char *end;
        long ms = strtol(v, &end, 10);
        if (end == v || *end != '\0' || ms < 0 || ms > 3600000) {
            warn(cfg, "KCACHE_LOCK_TIMEOUT=%s is not a number of milliseconds; using %d", v,
                 cfg->lock_timeout_ms);
            cfg->origin[V_LOCK_TIMEOUT] = KC_FROM_DEFAULT;
        } else {
            cfg->lock_timeout_ms = (int)ms;
        }
    }

    /* A misspelt switch must not be silently ignored. */
    extern char **environ;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "KCACHE_", 7) != 0)
            continue;
        size_t n = strcspn(*e, "=");
        bool known = false;
        for (int i = 0; i < V_COUNT && !known; i++)
            known = strlen(kc_config_vars[i].name) == n &&
                    strncmp(kc_config_vars[i].name, *e, n) == 0;
        /* Internal variables of the store, the launcher, the scripts and
         * the test harness. */
        static const char *internal[] = {
            "KCACHE_TOOL=",  "KCACHE_STORE_LIB=", "KCACHE_OWNER_", "KCACHE_TEST_", "KCACHE_SHIM=",
            "KCACHE_SRC=",   "KCACHE_BUILD=",     "KCACHE_VENV",   "KCACHE_DEMO_", "KCACHE_BENCH_"};
        for (size_t i = 0; i < sizeof internal / sizeof *internal && !known; i++)
            known = strncmp(*e, internal[i], strlen(internal[i])) == 0;
        if (!known)
            warn(cfg, "unknown variable %.*s ignored (see `kcache config`)", (int)n, *e);
    }

    if (cfg->readonly && cfg->recache)
        warn(cfg, "KCACHE_READONLY and KCACHE_RECACHE are both set; READONLY wins: "
                  "nothing is stored");
}

void kc_config_value(const struct kc_config *cfg, int i, char *buf, int len)
{
    switch (i) {
    case V_DIR:
        snprintf(buf, len, "%s", cfg->dir[0] ? cfg->dir : "(none)");
        break;
    case V_DISABLE:
        snprintf(buf, len, "%d", cfg->disable);
        break;
    case V_READONLY:
        snprintf(buf, len, "%d", cfg->readonly);
        break;
    case V_RECACHE:
        snprintf(buf, len, "%d", cfg->recache);
        break;
    case V_MAXSIZE:
        snprintf(buf, len, "%llu", (unsigned long long)cfg->max_size);
        break;
    case V_LOG:
        snprintf(buf, len, "%s", kc_log_level_name(cfg->log_level));
        break;
    case V_STATS:
        snprintf(buf, len, "%d", cfg->stats);
        break;
    case V_NVRTC:
        snprintf(buf, len, "%d", cfg->nvrtc);
        break;
    case V_JIT:
        snprintf(buf, len, "%d", cfg->jit);
        break;
    case V_MEMO:
        snprintf(buf, len, "%d", cfg->memo);
        break;
    case V_ALLOC:
        snprintf(buf, len, "%d", cfg->alloc);
        break;
    case V_ALLOC_POOL:
        snprintf(buf, len, "%llu", (unsigned long long)cfg->alloc_pool);
        break;
    case V_ALLOC_FALLBACK:
        snprintf(buf, len, "%s",
                 cfg->alloc_fallback == KC_ALLOC_FALLBACK_MANAGED ? "managed" : "none");
        break;
    case V_LOCK_TIMEOUT:
        snprintf(buf, len, "%d", cfg->lock_timeout_ms);
        break;
    case V_SINGLE_FLIGHT:
        snprintf(buf, len, "%d", cfg->single_flight);
        break;
    case V_LINK:
        snprintf(buf, len, "%d", cfg->link);
        break;
    default:
        snprintf(buf, len, "?");
    }
}
