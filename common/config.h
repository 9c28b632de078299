/*
 * kcache configuration: every KCACHE_* variable, read once.
 *
 * Compiled into the shim (libc only), the store and the kcache tool, so the
 * three agree on every default. Unknown or malformed values produce one
 * warning each, kept in the struct for the caller to print.
 */
#ifndef KCACHE_CONFIG_H
#define KCACHE_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

enum kc_log_level {
    KC_LOG_ERROR = 0,
    KC_LOG_WARN = 1,
    KC_LOG_INFO = 2,
    KC_LOG_DEBUG = 3,
};

/* Where a setting's value came from. */
enum kc_origin {
    KC_FROM_DEFAULT = 0,
    KC_FROM_ENV = 1,
};

enum kc_alloc_fallback {
    KC_ALLOC_FALLBACK_NONE = 0,
    KC_ALLOC_FALLBACK_MANAGED = 1,
};

#define KC_CONFIG_MAX_WARNINGS 16

struct kc_config {
    char dir[PATH_MAX];      /* cache directory */
    bool disable;            /* KCACHE_DISABLE: everything off */
    bool readonly;           /* KCACHE_READONLY: serve hits, store nothing */
    bool recache;            /* KCACHE_RECACHE: compile and overwrite */
    bool stats;              /* KCACHE_STATS: one summary line at exit */
    uint64_t max_size;       /* KCACHE_MAXSIZE, bytes */
    int log_level;           /* KCACHE_LOG */
    bool nvrtc;              /* KCACHE_NVRTC */
    bool jit;                /* KCACHE_JIT */
    bool memo;               /* KCACHE_MEMO */
    bool alloc;              /* KCACHE_ALLOC */
    uint64_t alloc_pool;     /* KCACHE_ALLOC_POOL, bytes per context */
    int alloc_fallback;      /* KCACHE_ALLOC_FALLBACK: enum kc_alloc_fallback */
    int lock_timeout_ms;     /* KCACHE_LOCK_TIMEOUT: single-flight wait bound */
    bool single_flight;      /* KCACHE_SINGLE_FLIGHT */
    bool link;               /* KCACHE_LINK: nvJitLink and cuLink* links */

    /* Provenance, for `kcache config`: KC_FROM_* per variable, indexed as
     * kc_config_vars[]. */
    unsigned char origin[24];

    int n_warnings;
    char warnings[KC_CONFIG_MAX_WARNINGS][160];
};

/* One entry per variable, in the order `kcache config` prints them. */
struct kc_config_var {
    const char *name;
    const char *help;
};
extern const struct kc_config_var kc_config_vars[];
extern const int kc_config_n_vars;

/* Fills *cfg from the environment (getenv) and the defaults. Never fails:
 * a malformed value keeps the default and adds a warning. In a
 * secure-execution process (AT_SECURE) no variable is read and `disable`
 * is set. */
void kc_config_load(struct kc_config *cfg);

/* Records the working directory now when KCACHE_DIR is relative, so that a
 * later kc_config_load() resolves it against the directory the process
 * started in, not one it changed to. The shim calls it before main. */
void kc_config_pin_cwd(void);

/* Formats variable i's effective value into buf. */
void kc_config_value(const struct kc_config *cfg, int i, char *buf, int len);

/* Parses a size: digits with an optional K/M/G/T suffix (powers of 1024,
 * "KiB"/"KB" forms accepted). 0 on success, -1 on malformed input or a
 * value past 2^64 - 1. */
int kc_parse_size(const char *s, uint64_t *out);

/* Parses a boolean: 1/0, true/false, yes/no, on/off (any case). 0 or -1. */
int kc_parse_bool(const char *s, bool *out);

const char *kc_log_level_name(int level);

#endif
