/*
 * kcache configuration: every KCACHE_* variable the project reads, in one
 * table (kc_config_vars), read through one function (kc_config_get).
 *
 * Compiled into the shim (libc only), the store and the kcache tool, so the
 * three agree on every default. Unknown or malformed values produce one
 * warning each, kept in the struct for the caller to print.
 */
#ifndef KCACHE_CONFIG_H
#define KCACHE_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
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

/* The index of each setting and internal variable in kc_config_vars. */
enum kc_var {
    KC_VAR_DIR,
    KC_VAR_DISABLE,
    KC_VAR_READONLY,
    KC_VAR_RECACHE,
    KC_VAR_MAXSIZE,
    KC_VAR_LOG,
    KC_VAR_STATS,
    KC_VAR_NVRTC,
    KC_VAR_NVRTC_DEFER,
    KC_VAR_JIT,
    KC_VAR_MEMO,
    KC_VAR_ALLOC,
    KC_VAR_ALLOC_POOL,
    KC_VAR_ALLOC_FALLBACK,
    KC_VAR_LOCK_TIMEOUT,
    KC_VAR_SINGLE_FLIGHT,
    KC_VAR_REMOTE,
    KC_VAR_REMOTE_TTL,
    KC_VAR_REMOTE_MAX_ENTRY,
    KC_VAR_REMOTE_SIGNING_KEY,
    KC_VAR_REMOTE_TRUSTED_KEYS,
    KC_VAR_REMOTE_TRUST,
    KC_VAR_LINK,
    KC_VAR_REMOTE_PASSWORD_FILE,
    KC_VAR_NVVM,
    KC_VAR_TOOLS,
    KC_VAR_REMOTE_CA_FILE,
    KC_VAR_REMOTE_CERT_FILE,
    KC_VAR_REMOTE_KEY_FILE,
    KC_VAR_REMOTE_TLS_VERIFY,
    KC_VAR_NVCC,
    KC_N_SETTINGS, /* the settings come first; internal variables follow */
    KC_VAR_TOOL = KC_N_SETTINGS,
    KC_VAR_STORE_LIB,
    KC_VAR_OWNER_DETACH,
    KC_VAR_OWNER_IDLE_MS,
    KC_VAR_FIRST_HARNESS /* harness entries follow, without names here */
};

#define KC_CONFIG_MAX_WARNINGS 16

struct kc_config {
    char dir[PATH_MAX];  /* cache directory */
    bool disable;        /* KCACHE_DISABLE: everything off */
    bool readonly;       /* KCACHE_READONLY: serve hits, store nothing */
    bool recache;        /* KCACHE_RECACHE: compile and overwrite */
    bool stats;          /* KCACHE_STATS: one summary line at exit */
    uint64_t max_size;   /* KCACHE_MAXSIZE, bytes */
    int log_level;       /* KCACHE_LOG */
    bool nvrtc;          /* KCACHE_NVRTC */
    bool nvrtc_defer;    /* KCACHE_NVRTC_DEFER: NVRTC creates a program only when needed */
    bool jit;            /* KCACHE_JIT */
    bool memo;           /* KCACHE_MEMO */
    bool alloc;          /* KCACHE_ALLOC */
    uint64_t alloc_pool; /* KCACHE_ALLOC_POOL, bytes per context */
    int alloc_fallback;  /* KCACHE_ALLOC_FALLBACK: enum kc_alloc_fallback */
    int lock_timeout_ms; /* KCACHE_LOCK_TIMEOUT: single-flight wait bound */
    bool single_flight;  /* KCACHE_SINGLE_FLIGHT */
    /* The remote tier's settings as given (empty: unset), parsed by
     * store/remote (kc_remote_settings_from_config). */
    char remote[4096];                   /* KCACHE_REMOTE (may hold passwords) */
    char remote_ttl[32];                 /* KCACHE_REMOTE_TTL */
    char remote_max_entry[32];           /* KCACHE_REMOTE_MAX_ENTRY */
    char remote_signing_key[PATH_MAX];   /* KCACHE_REMOTE_SIGNING_KEY */
    char remote_trusted_keys[PATH_MAX];  /* KCACHE_REMOTE_TRUSTED_KEYS */
    char remote_trust[16];               /* KCACHE_REMOTE_TRUST */
    char remote_password_file[PATH_MAX]; /* KCACHE_REMOTE_PASSWORD_FILE */
    char remote_ca_file[PATH_MAX];       /* KCACHE_REMOTE_CA_FILE */
    char remote_cert_file[PATH_MAX];     /* KCACHE_REMOTE_CERT_FILE */
    char remote_key_file[PATH_MAX];      /* KCACHE_REMOTE_KEY_FILE */
    char remote_tls_verify[16];          /* KCACHE_REMOTE_TLS_VERIFY */
    bool link;                           /* KCACHE_LINK: nvJitLink and cuLink* links */
    bool nvvm;                           /* KCACHE_NVVM: libNVVM compiles */
    bool tools;                          /* KCACHE_TOOLS: compiler tools run as processes */
    bool nvcc;                           /* KCACHE_NVCC: nvcc served whole (else its tools) */

    /* Provenance, for `kcache config`: KC_FROM_* per setting, indexed as
     * kc_config_vars[] (enum kc_var). */
    unsigned char origin[KC_N_SETTINGS];

    int n_warnings;
    char warnings[KC_CONFIG_MAX_WARNINGS][160];
};

/* What a variable is for, which says where `kcache config` shows it. */
enum kc_var_kind {
    /* A user's setting, loaded into struct kc_config: listed by `kcache
     * config` with its value and where it came from. */
    KC_VAR_SETTING = 0,
    /* Set by kcache for its own processes (the owner it starts) or by tests
     * and packagers to point kcache at a program or library: read where it
     * is needed (kc_config_get), listed apart by `kcache config` when set. */
    KC_VAR_INTERNAL = 1,
    /* Read only by the project's scripts and tests, never by kcache; a name
     * ending in '_' stands for every name it begins. Known, so never warned
     * about as unknown; not listed. */
    KC_VAR_HARNESS = 2,
};

/* Every KCACHE_* variable the project reads: settings (in the order `kcache
 * config` prints them), then internal variables, then the harness's. */
struct kc_config_var {
    const char *name;
    const char *help;
    int kind;         /* enum kc_var_kind */
    const char *dflt; /* settings: the default, as documentation shows it */
    const char *flag; /* settings: the kcache-run flag that sets it, or NULL */
};
extern const struct kc_config_var kc_config_vars[];
extern const int kc_config_n_vars;

/* The value of a setting or internal variable in the environment, or NULL
 * when it is unset; always NULL in a secure-execution process (AT_SECURE:
 * set-user-ID, set-group-ID, file capabilities), whose caller's environment
 * kcache never obeys. The one way kcache reads a KCACHE_* variable. The
 * string is the environment's: valid until the variable is changed. */
const char *kc_config_get(enum kc_var var);

/* Fills *cfg from the environment (getenv) and the defaults. Never fails:
 * a malformed value keeps the default and adds a warning. In a
 * secure-execution process (AT_SECURE) no variable is read and `disable`
 * is set. */
void kc_config_load(struct kc_config *cfg);
/* kc_config_load for a cfg whose bytes are all zero (static storage never
 * loaded): it is not cleared first, so the pages of its large fields
 * nobody sets are never touched (~6 page faults in the shim's first
 * hook). */
void kc_config_load_zeroed(struct kc_config *cfg);

/* Records the working directory now when KCACHE_DIR is relative, so that a
 * later kc_config_load() resolves it against the directory the process
 * started in, not one it changed to. The shim calls it before main. */
void kc_config_pin_cwd(void);

/* Formats setting i's effective value into buf (i < KC_N_SETTINGS). */
void kc_config_value(const struct kc_config *cfg, int i, char *buf, int len);

/* Parses a size: digits with an optional K/M/G/T suffix (powers of 1024,
 * "KiB"/"KB" forms accepted). 0 on success, -1 on malformed input or a
 * value past 2^64 - 1. */
int kc_parse_size(const char *s, uint64_t *out);

/* Who may own and write a file kcache reads by a configured path. */
enum kc_file_rule {
    KC_FILE_ANY,     /* a regular file, whoever's */
    KC_FILE_MINE,    /* this user's, not writable by group or others */
    KC_FILE_PRIVATE, /* this user's, mode 0600 or less (secrets) */
    KC_FILE_TRUSTED, /* this user's or root's, not writable by group or others */
};

/* The one way kcache reads a file named by configuration (a key, the
 * trusted keys, a password, a record under KCACHE_DIR): opened
 * non-blocking (a FIFO or a device with no writer never holds the caller,
 * not even in open), without following a last symlink, O_NOCTTY, then
 * fstat'ed and refused unless it is a regular file that `rule` allows and
 * of at most `max` bytes; only then read. `path` is relative to `dirfd`
 * (AT_FDCWD: the working directory). On 0, *buf is malloc'd (release with
 * free; a secret's caller clears it first), NUL-terminated, *len bytes
 * (len may be NULL). Otherwise a negative errno and *buf NULL: -EPERM
 * for a symlink, a file of another type or one `rule` refuses, -EFBIG
 * past max, else open's or read's. errno is kept. */
int kc_config_read_file(int dirfd, const char *path, enum kc_file_rule rule, size_t max, char **buf,
                        size_t *len);

/* Parses a boolean: 1/0, true/false, yes/no, on/off (any case). 0 or -1. */
int kc_parse_bool(const char *s, bool *out);

const char *kc_log_level_name(int level);

/* Writes KCACHE_REMOTE's value (URLs separated by white space, malformed
 * or not) with every password replaced by "********": in scheme://AUTH...
 * the user info before the last '@' ahead of the next URL (a password
 * holding '|', a space or a tab included) becomes "USER:********" (or
 * ":********"). Returns the length it wanted (as snprintf); out always
 * terminated when len > 0. */
int kc_config_redact_url(const char *remote, char *out, size_t len);
/* The first URL of `remote` as redaction sees it: [*start, *end) (white
 * space after it included), *sep after its "://" and *at its credentials'
 * '@' (NULL: none). 1, or 0 when there is none. */
int kc_config_url_creds(const char *remote, const char **start, const char **sep, const char **at,
                        const char **end);

#endif
