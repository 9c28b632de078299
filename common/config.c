/*
 * kcache configuration: the table of every KCACHE_* variable, and the
 * settings read from the environment once. See config.h.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

/* Settings first (kind 0, KC_VAR_SETTING), in the order `kcache config`
 * prints them. */
const struct kc_config_var kc_config_vars[] = {
    [KC_VAR_DIR] = {"KCACHE_DIR", "cache directory (made 0700; refused if others can write it)",
                    .dflt = "$XDG_CACHE_HOME/kcache, else ~/.cache/kcache", .flag = "--dir DIR"},
    [KC_VAR_DISABLE] = {"KCACHE_DISABLE", "turn every part of kcache off", .dflt = "0",
                        .flag = "--disable"},
    [KC_VAR_READONLY] = {"KCACHE_READONLY", "serve hits, store nothing", .dflt = "0",
                         .flag = "--readonly"},
    [KC_VAR_RECACHE] = {"KCACHE_RECACHE", "compile and overwrite, never serve", .dflt = "0",
                        .flag = "--recache"},
    [KC_VAR_MAXSIZE] = {"KCACHE_MAXSIZE", "size limit of the store", .dflt = "5G"},
    [KC_VAR_LOG] = {"KCACHE_LOG", "log level: error|warn|info|debug", .dflt = "warn",
                    .flag = "--log LEVEL"},
    [KC_VAR_STATS] = {"KCACHE_STATS", "print a summary line at exit", .dflt = "0",
                      .flag = "--stats"},
    [KC_VAR_NVRTC] = {"KCACHE_NVRTC", "cache NVRTC compiles", .dflt = "1", .flag = "--no-nvrtc"},
    [KC_VAR_NVRTC_DEFER] = {"KCACHE_NVRTC_DEFER",
                            "NVRTC creates a program only when a call needs it (never on a hit)",
                            .dflt = "1"},
    [KC_VAR_JIT] = {"KCACHE_JIT", "cache driver JIT of PTX and fatbinaries", .dflt = "1",
                    .flag = "--no-jit"},
    [KC_VAR_MEMO] = {"KCACHE_MEMO", "memoize function lookups per context", .dflt = "1",
                     .flag = "--no-memo"},
    [KC_VAR_ALLOC] = {"KCACHE_ALLOC", "pool freed device blocks per context", .dflt = "1",
                      .flag = "--no-alloc"},
    [KC_VAR_ALLOC_POOL] = {"KCACHE_ALLOC_POOL", "pool bound per context", .dflt = "256M"},
    [KC_VAR_ALLOC_FALLBACK] = {"KCACHE_ALLOC_FALLBACK", "none|managed after a failed allocation",
                               .dflt = "none"},
    [KC_VAR_LOCK_TIMEOUT] = {"KCACHE_LOCK_TIMEOUT", "single-flight wait bound, ms",
                             .dflt = "30000"},
    [KC_VAR_SINGLE_FLIGHT] = {"KCACHE_SINGLE_FLIGHT",
                              "one process compiles a missed key, the rest wait", .dflt = "1"},
    [KC_VAR_REMOTE] = {"KCACHE_REMOTE", "Redis URL(s) of the remote tier, shared by machines",
                       .dflt = "(none)"},
    [KC_VAR_REMOTE_TTL] = {"KCACHE_REMOTE_TTL", "seconds a remote entry lives (EX); 0: no expiry",
                           .dflt = "0"},
    [KC_VAR_REMOTE_MAX_ENTRY] = {"KCACHE_REMOTE_MAX_ENTRY", "larger entries are not uploaded",
                                 .dflt = "64M"},
    [KC_VAR_REMOTE_SIGNING_KEY] = {"KCACHE_REMOTE_SIGNING_KEY",
                                   "secret key file (0600) uploads are signed with",
                                   .dflt = "(none)"},
    [KC_VAR_REMOTE_TRUSTED_KEYS] = {"KCACHE_REMOTE_TRUSTED_KEYS",
                                    "file of public keys remote entries must be signed by",
                                    .dflt = "(none)"},
    [KC_VAR_REMOTE_TRUST] = {"KCACHE_REMOTE_TRUST",
                             "signed|any: whether unsigned remote entries are read",
                             .dflt = "signed"},
    [KC_VAR_LINK] = {"KCACHE_LINK", "cache links (nvJitLink, the driver's cuLink*)", .dflt = "1",
                     .flag = "--no-link"},
    [KC_VAR_REMOTE_PASSWORD_FILE] = {"KCACHE_REMOTE_PASSWORD_FILE",
                                     "file (0600) holding the Redis password of KCACHE_REMOTE",
                                     .dflt = "(none)"},
    [KC_VAR_NVVM] = {"KCACHE_NVVM", "cache libNVVM compiles (numba-cuda, cuda.core)", .dflt = "1",
                     .flag = "--no-nvvm"},
    [KC_VAR_TOOLS] =
        {"KCACHE_TOOLS",
         "cache compiler tools run as processes (ptxas, cicc, fatbinary, nvlink, nvcc)",
         .dflt = "1", .flag = "--no-tools"},
    [KC_VAR_REMOTE_CA_FILE] = {"KCACHE_REMOTE_CA_FILE",
                               "CA certificates (PEM) rediss:// servers are verified with",
                               .dflt = "(system)"},
    [KC_VAR_REMOTE_CERT_FILE] = {"KCACHE_REMOTE_CERT_FILE",
                                 "client certificate (PEM) for mutual TLS", .dflt = "(none)"},
    [KC_VAR_REMOTE_KEY_FILE] = {"KCACHE_REMOTE_KEY_FILE", "its private key file (PEM, 0600)",
                                .dflt = "(none)"},
    [KC_VAR_REMOTE_TLS_VERIFY] = {"KCACHE_REMOTE_TLS_VERIFY",
                                  "0: rediss:// servers' certificates are not verified (warns)",
                                  .dflt = "1"},
    [KC_VAR_NVCC] = {"KCACHE_NVCC",
                     "serve nvcc runs whole (0: only its cicc, ptxas, fatbinary, nvlink runs)",
                     .dflt = "1", .flag = "--no-nvcc"},

    /* Internal: read where needed, through kc_config_get. */
    [KC_VAR_TOOL] = {"KCACHE_TOOL", "the kcache tool that runs the store's owner", KC_VAR_INTERNAL},
    [KC_VAR_STORE_LIB] = {"KCACHE_STORE_LIB", "the store library the shim loads", KC_VAR_INTERNAL},
    [KC_VAR_OWNER_DETACH] = {"KCACHE_OWNER_DETACH",
                             "1: an owner a store started (it leaves its starter's process tree)",
                             KC_VAR_INTERNAL},
    [KC_VAR_OWNER_IDLE_MS] = {"KCACHE_OWNER_IDLE_MS",
                              "how long an owner waits idle before it exits, ms", KC_VAR_INTERNAL},

    /* The harness's: scripts/ and tests/ read them, kcache never does. */
    {"KCACHE_TEST_", "test programs and stand-ins", KC_VAR_HARNESS},
    {"KCACHE_SHIM", "the shim the tests preload", KC_VAR_HARNESS},
    {"KCACHE_SRC", "the source tree, for tests", KC_VAR_HARNESS},
    {"KCACHE_BUILD", "the build tree, for tests", KC_VAR_HARNESS},
    {"KCACHE_VENV", "the Python environment (scripts/setup-venv)", KC_VAR_HARNESS},
    {"KCACHE_VENV_PYTHON", "its interpreter, for the client tests", KC_VAR_HARNESS},
    {"KCACHE_DEMO_", "scripts/demo", KC_VAR_HARNESS},
    {"KCACHE_BENCH_", "scripts/bench", KC_VAR_HARNESS},
    {"KCACHE_GPU_BUILD", "scripts/gpu-check's build directory", KC_VAR_HARNESS},
    {"KCACHE_FUZZ_FIXTURES", "the driver fuzz target's fixtures", KC_VAR_HARNESS},
};
const int kc_config_n_vars = sizeof kc_config_vars / sizeof *kc_config_vars;

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

const char *kc_config_get(enum kc_var var)
{
    if ((int)var < 0 || var >= KC_VAR_FIRST_HARNESS || getauxval(AT_SECURE) != 0)
        return NULL;
    return getenv(kc_config_vars[var].name);
}

static const char *env(struct kc_config *cfg, int var)
{
    const char *v = kc_config_get(var);
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

/* A string kept as given; one too long for field is dropped with a
 * warning (never shown: it may hold a password). */
static void load_text(struct kc_config *cfg, int var, char *field, size_t len)
{
    const char *v = env(cfg, var);
    if (v == NULL)
        return;
    if (v[0] == '\0' || strlen(v) >= len) {
        if (v[0] != '\0')
            warn(cfg, "%s is longer than %zu bytes; ignored (shorten it)", kc_config_vars[var].name,
                 len - 1);
        cfg->origin[var] = KC_FROM_DEFAULT;
        return;
    }
    memcpy(field, v, strlen(v) + 1);
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
    warn(cfg,
         "no cache directory: HOME is %s and user %u has no home in the passwd database; "
         "caching is off (set KCACHE_DIR)",
         home == NULL      ? "unset"
         : home[0] == '\0' ? "empty"
                           : "not absolute",
         (unsigned)getuid());
}

/* The working directory when the process started (kc_config_pin_cwd), for a
 * relative KCACHE_DIR; empty when not pinned. */
static char start_cwd[PATH_MAX];

void kc_config_pin_cwd(void)
{
    const char *v = kc_config_get(KC_VAR_DIR);
    if (v == NULL || v[0] == '\0' || v[0] == '/')
        return;
    if (getcwd(start_cwd, sizeof start_cwd) == NULL)
        start_cwd[0] = '\0';
}

void kc_config_load(struct kc_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    kc_config_load_zeroed(cfg);
}

void kc_config_load_zeroed(struct kc_config *cfg)
{
    cfg->max_size = 5ull << 30;
    cfg->log_level = KC_LOG_WARN;
    cfg->nvrtc = cfg->jit = cfg->memo = cfg->alloc = true;
    cfg->nvrtc_defer = true;
    cfg->alloc_pool = 256ull << 20;
    cfg->alloc_fallback = KC_ALLOC_FALLBACK_NONE;
    cfg->lock_timeout_ms = 30000;
    cfg->single_flight = true;
    cfg->link = true;
    cfg->nvvm = true;
    cfg->tools = true;
    cfg->nvcc = true;

    /* A secure-execution process (set-user-ID or set-group-ID, file
     * capabilities) must not obey its caller's environment, which could
     * name the program kcache starts, the store it loads or the directory
     * it writes: kcache is off there and reads no variable at all. */
    if (getauxval(AT_SECURE) != 0) {
        cfg->disable = true;
        return;
    }

    const char *v = env(cfg, KC_VAR_DIR);
    if (v != NULL && v[0] != '\0') {
        if (strlen(v) >= sizeof cfg->dir - 64) {
            warn(cfg, "KCACHE_DIR is too long; using the default (give a shorter path)");
            cfg->origin[KC_VAR_DIR] = KC_FROM_DEFAULT;
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
                strlen(cwd) + strlen(v) + 2 < sizeof cfg->dir - 64) {
                size_t a = strlen(cwd), b = strlen(v);
                memcpy(cfg->dir, cwd, a);
                cfg->dir[a] = '/';
                memcpy(cfg->dir + a + 1, v, b + 1);
            } else
                snprintf(cfg->dir, sizeof cfg->dir, "%s", v);
        } else {
            snprintf(cfg->dir, sizeof cfg->dir, "%s", v);
        }
    } else {
        cfg->origin[KC_VAR_DIR] = KC_FROM_DEFAULT;
        default_dir(cfg);
    }

    load_bool(cfg, KC_VAR_DISABLE, &cfg->disable);
    load_bool(cfg, KC_VAR_READONLY, &cfg->readonly);
    load_bool(cfg, KC_VAR_RECACHE, &cfg->recache);
    load_size(cfg, KC_VAR_MAXSIZE, &cfg->max_size);
    if (cfg->max_size == 0) {
        /* No limit is not a store: 0 means the default, with a warning. */
        warn(cfg, "KCACHE_MAXSIZE=%s is a limit of 0 bytes; using the default (5G)",
             kc_config_get(KC_VAR_MAXSIZE));
        cfg->max_size = 5ull << 30;
        cfg->origin[KC_VAR_MAXSIZE] = KC_FROM_DEFAULT;
    }
    load_bool(cfg, KC_VAR_STATS, &cfg->stats);
    load_bool(cfg, KC_VAR_NVRTC, &cfg->nvrtc);
    load_bool(cfg, KC_VAR_NVRTC_DEFER, &cfg->nvrtc_defer);
    load_bool(cfg, KC_VAR_JIT, &cfg->jit);
    load_bool(cfg, KC_VAR_MEMO, &cfg->memo);
    load_bool(cfg, KC_VAR_ALLOC, &cfg->alloc);
    load_size(cfg, KC_VAR_ALLOC_POOL, &cfg->alloc_pool);
    load_bool(cfg, KC_VAR_SINGLE_FLIGHT, &cfg->single_flight);
    load_bool(cfg, KC_VAR_LINK, &cfg->link);
    load_bool(cfg, KC_VAR_NVVM, &cfg->nvvm);
    load_bool(cfg, KC_VAR_TOOLS, &cfg->tools);
    load_bool(cfg, KC_VAR_NVCC, &cfg->nvcc);

    v = env(cfg, KC_VAR_LOG);
    if (v != NULL) {
        int found = -1;
        for (int i = 0; i <= KC_LOG_DEBUG; i++)
            if (strcasecmp(v, kc_log_level_name(i)) == 0)
                found = i;
        if (strcasecmp(v, "warning") == 0)
            found = KC_LOG_WARN;
        if (found < 0) {
            warn(cfg, "KCACHE_LOG=%s is not one of error|warn|info|debug; using warn", v);
            cfg->origin[KC_VAR_LOG] = KC_FROM_DEFAULT;
        } else {
            cfg->log_level = found;
        }
    }

    v = env(cfg, KC_VAR_ALLOC_FALLBACK);
    if (v != NULL) {
        if (strcasecmp(v, "managed") == 0)
            cfg->alloc_fallback = KC_ALLOC_FALLBACK_MANAGED;
        else if (strcasecmp(v, "none") == 0 || v[0] == '\0')
            cfg->alloc_fallback = KC_ALLOC_FALLBACK_NONE;
        else {
            warn(cfg, "KCACHE_ALLOC_FALLBACK=%s is not one of none|managed; using none", v);
            cfg->origin[KC_VAR_ALLOC_FALLBACK] = KC_FROM_DEFAULT;
        }
    }

    v = env(cfg, KC_VAR_LOCK_TIMEOUT);
    if (v != NULL) {
        char *end;
        long ms = strtol(v, &end, 10);
        if (end == v || *end != '\0' || ms < 0 || ms > 3600000) {
            warn(cfg, "KCACHE_LOCK_TIMEOUT=%s is not a number of milliseconds; using %d", v,
                 cfg->lock_timeout_ms);
            cfg->origin[KC_VAR_LOCK_TIMEOUT] = KC_FROM_DEFAULT;
        } else {
            cfg->lock_timeout_ms = (int)ms;
        }
    }

    /* The remote tier's settings, kept as given: store/remote parses them
     * (a malformed one is its warning, and the remote stays off). */
    load_text(cfg, KC_VAR_REMOTE, cfg->remote, sizeof cfg->remote);
    load_text(cfg, KC_VAR_REMOTE_TTL, cfg->remote_ttl, sizeof cfg->remote_ttl);
    load_text(cfg, KC_VAR_REMOTE_MAX_ENTRY, cfg->remote_max_entry, sizeof cfg->remote_max_entry);
    load_text(cfg, KC_VAR_REMOTE_SIGNING_KEY, cfg->remote_signing_key,
              sizeof cfg->remote_signing_key);
    load_text(cfg, KC_VAR_REMOTE_TRUSTED_KEYS, cfg->remote_trusted_keys,
              sizeof cfg->remote_trusted_keys);
    load_text(cfg, KC_VAR_REMOTE_TRUST, cfg->remote_trust, sizeof cfg->remote_trust);
    load_text(cfg, KC_VAR_REMOTE_PASSWORD_FILE, cfg->remote_password_file,
              sizeof cfg->remote_password_file);
    load_text(cfg, KC_VAR_REMOTE_CA_FILE, cfg->remote_ca_file, sizeof cfg->remote_ca_file);
    load_text(cfg, KC_VAR_REMOTE_CERT_FILE, cfg->remote_cert_file, sizeof cfg->remote_cert_file);
    load_text(cfg, KC_VAR_REMOTE_KEY_FILE, cfg->remote_key_file, sizeof cfg->remote_key_file);
    load_text(cfg, KC_VAR_REMOTE_TLS_VERIFY, cfg->remote_tls_verify, sizeof cfg->remote_tls_verify);

    /* A misspelt switch must not be silently ignored. */
    extern char **environ;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (strncmp(*e, "KCACHE_", 7) != 0)
            continue;
        size_t n = strcspn(*e, "=");
        bool known = false;
        for (int i = 0; i < kc_config_n_vars && !known; i++) {
            const char *name = kc_config_vars[i].name;
            size_t len = strlen(name);
            if (name[len - 1] == '_') /* a prefix */
                known = n >= len && strncmp(name, *e, len) == 0;
            else
                known = len == n && strncmp(name, *e, n) == 0;
        }
        if (!known)
            warn(cfg, "unknown variable %.*s ignored (see `kcache config`)", (int)n, *e);
    }

    if (cfg->readonly && cfg->recache)
        warn(cfg, "KCACHE_READONLY and KCACHE_RECACHE are both set; READONLY wins: "
                  "nothing is stored (unset one of them)");
}

void kc_config_value(const struct kc_config *cfg, int i, char *buf, int len)
{
    switch (i) {
    case KC_VAR_DIR:
        snprintf(buf, len, "%s", cfg->dir[0] ? cfg->dir : "(none)");
        break;
    case KC_VAR_DISABLE:
        snprintf(buf, len, "%d", cfg->disable);
        break;
    case KC_VAR_READONLY:
        snprintf(buf, len, "%d", cfg->readonly);
        break;
    case KC_VAR_RECACHE:
        snprintf(buf, len, "%d", cfg->recache);
        break;
    case KC_VAR_MAXSIZE:
        snprintf(buf, len, "%llu", (unsigned long long)cfg->max_size);
        break;
    case KC_VAR_LOG:
        snprintf(buf, len, "%s", kc_log_level_name(cfg->log_level));
        break;
    case KC_VAR_STATS:
        snprintf(buf, len, "%d", cfg->stats);
        break;
    case KC_VAR_NVRTC:
        snprintf(buf, len, "%d", cfg->nvrtc);
        break;
    case KC_VAR_NVRTC_DEFER:
        snprintf(buf, len, "%d", cfg->nvrtc_defer);
        break;
    case KC_VAR_JIT:
        snprintf(buf, len, "%d", cfg->jit);
        break;
    case KC_VAR_MEMO:
        snprintf(buf, len, "%d", cfg->memo);
        break;
    case KC_VAR_ALLOC:
        snprintf(buf, len, "%d", cfg->alloc);
        break;
    case KC_VAR_ALLOC_POOL:
        snprintf(buf, len, "%llu", (unsigned long long)cfg->alloc_pool);
        break;
    case KC_VAR_ALLOC_FALLBACK:
        snprintf(buf, len, "%s",
                 cfg->alloc_fallback == KC_ALLOC_FALLBACK_MANAGED ? "managed" : "none");
        break;
    case KC_VAR_LOCK_TIMEOUT:
        snprintf(buf, len, "%d", cfg->lock_timeout_ms);
        break;
    case KC_VAR_SINGLE_FLIGHT:
        snprintf(buf, len, "%d", cfg->single_flight);
        break;
    case KC_VAR_REMOTE:
        if (cfg->remote[0] == '\0')
            snprintf(buf, len, "(none)");
        else
            kc_config_redact_url(cfg->remote, buf, len > 0 ? (size_t)len : 0);
        break;
    case KC_VAR_REMOTE_TTL:
        snprintf(buf, len, "%s", cfg->remote_ttl[0] ? cfg->remote_ttl : "0");
        break;
    case KC_VAR_REMOTE_MAX_ENTRY: {
        /* In bytes, as every size here; a value the remote module will
         * refuse (it warns) is shown as given. */
        uint64_t v = 64ull << 20;
        if (cfg->remote_max_entry[0] != '\0' && kc_parse_size(cfg->remote_max_entry, &v) != 0)
            snprintf(buf, len, "%s", cfg->remote_max_entry);
        else
            snprintf(buf, len, "%llu", (unsigned long long)v);
        break;
    }
    case KC_VAR_REMOTE_SIGNING_KEY:
        snprintf(buf, len, "%s", cfg->remote_signing_key[0] ? cfg->remote_signing_key : "(none)");
        break;
    case KC_VAR_REMOTE_TRUSTED_KEYS:
        snprintf(buf, len, "%s", cfg->remote_trusted_keys[0] ? cfg->remote_trusted_keys : "(none)");
        break;
    case KC_VAR_REMOTE_TRUST:
        snprintf(buf, len, "%s", cfg->remote_trust[0] ? cfg->remote_trust : "signed");
        break;
    case KC_VAR_LINK:
        snprintf(buf, len, "%d", cfg->link);
        break;
    case KC_VAR_REMOTE_PASSWORD_FILE:
        snprintf(buf, len, "%s",
                 cfg->remote_password_file[0] ? cfg->remote_password_file : "(none)");
        break;
    case KC_VAR_NVVM:
        snprintf(buf, len, "%d", cfg->nvvm);
        break;
    case KC_VAR_TOOLS:
        snprintf(buf, len, "%d", cfg->tools);
        break;
    case KC_VAR_NVCC:
        snprintf(buf, len, "%d", cfg->nvcc);
        break;
    case KC_VAR_REMOTE_CA_FILE:
        snprintf(buf, len, "%s", cfg->remote_ca_file[0] ? cfg->remote_ca_file : "(system)");
        break;
    case KC_VAR_REMOTE_CERT_FILE:
        snprintf(buf, len, "%s", cfg->remote_cert_file[0] ? cfg->remote_cert_file : "(none)");
        break;
    case KC_VAR_REMOTE_KEY_FILE:
        snprintf(buf, len, "%s", cfg->remote_key_file[0] ? cfg->remote_key_file : "(none)");
        break;
    case KC_VAR_REMOTE_TLS_VERIFY: {
        bool on = true;
        if (cfg->remote_tls_verify[0] != '\0' && kc_parse_bool(cfg->remote_tls_verify, &on) != 0)
            on = true;
        snprintf(buf, len, "%s", on ? "1" : "0 (certificates NOT verified)");
        break;
    }
    default:
        snprintf(buf, len, "?");
    }
}

/* ---- KCACHE_REMOTE for display ---------------------------------------- */

/* Appends [s, s + n) to out at *o (snprintf semantics: *o counts all). */
static void redact_put(char *out, size_t len, size_t *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, (*o)++)
        if (*o + 1 < len)
            out[*o] = s[i];
}

/* Whether a URL starts at p (the value's start, or after white space):
 * "scheme://" or "redis+unix:". A fragment of a password written with a
 * space in it does not look like one. */
static bool url_starts(const char *p)
{
    if (strncasecmp(p, "redis+unix:", 11) == 0)
        return true;
    if (!isalpha((unsigned char)*p))
        return false;
    const char *q = p + 1;
    while (isalnum((unsigned char)*q) || *q == '+' || *q == '.' || *q == '-')
        q++;
    return q[0] == ':' && q[1] == '/' && q[2] == '/';
}

/* The next URL start after p (or the end). */
static const char *url_next(const char *p)
{
    for (const char *q = p; *q != '\0'; q++)
        if (isspace((unsigned char)*q) && !isspace((unsigned char)q[1]) && q[1] != '\0' &&
            url_starts(q + 1))
            return q + 1;
    return p + strlen(p);
}

int kc_config_url_creds(const char *remote, const char **start, const char **sep, const char **at,
                        const char **end)
{
    const char *p = remote;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '\0')
        return 0;
    const char *e = url_next(p);
    *start = p;
    *end = e;
    *sep = NULL;
    *at = NULL;
    if (strncasecmp(p, "redis+unix:", 11) != 0) {
        const char *s = strstr(p, "://");
        if (s != NULL && s < e) {
            *sep = s + 3;
            /* The credentials run to the last '@' before the next URL,
             * across any '|', space or tab a password may hold. */
            for (const char *q = *sep; q < e; q++)
                if (*q == '@')
                    *at = q;
        }
    }
    return 1;
}

int kc_config_redact_url(const char *remote, char *out, size_t len)
{
    static const char stars[] = "********";
    size_t o = 0;
    const char *p = remote != NULL ? remote : "";
    while (*p != '\0') {
        const char *u, *sep, *at, *end;
        if (kc_config_url_creds(p, &u, &sep, &at, &end) == 0) {
            redact_put(out, len, &o, p, strlen(p));
            break;
        }
        redact_put(out, len, &o, p, (size_t)(u - p));
        if (at == NULL) {
            redact_put(out, len, &o, u, (size_t)(end - u));
        } else {
            redact_put(out, len, &o, u, (size_t)(sep - u));
            /* USER: stays (the first ':' ends it); a password alone shows
             * as ":********" either way it was written. */
            const char *colon = memchr(sep, ':', (size_t)(at - sep));
            if (colon != NULL)
                redact_put(out, len, &o, sep, (size_t)(colon - sep));
            redact_put(out, len, &o, ":", 1);
            redact_put(out, len, &o, stars, sizeof stars - 1);
            redact_put(out, len, &o, at, (size_t)(end - at));
        }
        p = end;
    }
    if (len > 0)
        out[o < len ? o : len - 1] = '\0';
    return (int)o;
}

/* ---- files named by configuration ----------------------------------------- */

static bool file_rule_ok(const struct stat *st, enum kc_file_rule rule)
{
    switch (rule) {
    case KC_FILE_ANY:
        return true;
    case KC_FILE_MINE:
        return st->st_uid == geteuid() && (st->st_mode & 022) == 0;
    case KC_FILE_PRIVATE:
        return st->st_uid == geteuid() && (st->st_mode & 077) == 0;
    case KC_FILE_TRUSTED:
        return (st->st_uid == geteuid() || st->st_uid == 0) && (st->st_mode & 022) == 0;
    }
    return false;
}

int kc_config_read_file(int dirfd, const char *path, enum kc_file_rule rule, size_t max, char **buf,
                        size_t *len)
{
    int saved = errno;
    *buf = NULL;
    if (len != NULL)
        *len = 0;
    int fd = openat(dirfd, path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno == ELOOP ? -EPERM : -errno;
        errno = saved;
        return e;
    }
    struct stat st;
    int rc = 0;
    char *b = NULL;
    if (fstat(fd, &st) != 0)
        rc = -errno;
    else if (!S_ISREG(st.st_mode) || !file_rule_ok(&st, rule))
        rc = -EPERM;
    else if ((uint64_t)st.st_size > max)
        rc = -EFBIG;
    else if ((b = malloc((size_t)st.st_size + 1)) == NULL)
        rc = -ENOMEM;
    size_t got = 0;
    /* (O_NONBLOCK changes nothing for a regular file's reads) */
    while (rc == 0 && got < (size_t)st.st_size) {
        ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = -errno;
        if (r <= 0)
            break; /* (shorter than it was: what is there) */
        got += (size_t)r;
    }
    close(fd);
    if (rc != 0) {
        free(b);
        errno = saved;
        return rc;
    }
    b[got] = '\0';
    *buf = b;
    if (len != NULL)
        *len = got;
    errno = saved;
    return 0;
}
