/*
 * Unit tests of the configuration every part shares (common/config.c).
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

static void clean_env(void)
{
    extern char **environ;
    /* Drop every KCACHE_* variable the runner may have set. */
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "KCACHE_", 7) == 0) {
                char name[128];
                size_t n = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)n, *e);
                unsetenv(name);
                again = 1;
                break;
            }
        }
    }
}

TestSuite(config, .init = clean_env);

Test(config, defaults)
{
    setenv("HOME", "/home/someone", 1);
    unsetenv("XDG_CACHE_HOME");
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_str_eq(c.dir, "/home/someone/.cache/kcache");
    cr_assert_eq(c.max_size, 5ull << 30);
    cr_assert(c.nvrtc && c.jit && c.memo && c.alloc);
    cr_assert(!c.disable && !c.readonly && !c.recache && !c.stats);
    cr_assert_eq(c.log_level, KC_LOG_WARN);
    cr_assert_eq(c.n_warnings, 0);
}

Test(config, xdg_cache_home)
{
    setenv("XDG_CACHE_HOME", "/var/xdg", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_str_eq(c.dir, "/var/xdg/kcache");
}

/* HOME unset, empty or relative: the passwd entry's home, never a path
 * read from a buffer out of scope (the tests run as a user with one). */
Test(config, home_unset_empty_or_relative_uses_passwd_home)
{
    unsetenv("XDG_CACHE_HOME");
    struct passwd *pw = getpwuid(getuid());
    cr_assert(pw != NULL && pw->pw_dir[0] == '/', "the test user has a passwd home");
    char want[PATH_MAX];
    snprintf(want, sizeof want, "%s/.cache/kcache", pw->pw_dir);
    const char *homes[] = {NULL, "", "relative", "./x"};
    for (size_t i = 0; i < sizeof homes / sizeof *homes; i++) {
        if (homes[i] == NULL)
            unsetenv("HOME");
        else
            setenv("HOME", homes[i], 1);
        struct kc_config c;
        memset(&c, 0xa5, sizeof c);
        kc_config_load(&c);
        cr_assert_str_eq(c.dir, want, "HOME %s", homes[i] ? homes[i] : "unset");
        cr_assert_eq(c.n_warnings, 0);
    }
}

Test(config, sizes)
{
    uint64_t v;
    cr_assert_eq(kc_parse_size("512", &v), 0);
    cr_assert_eq(v, 512);
    cr_assert_eq(kc_parse_size("5G", &v), 0);
    cr_assert_eq(v, 5ull << 30);
    cr_assert_eq(kc_parse_size("64MiB", &v), 0);
    cr_assert_eq(v, 64ull << 20);
    cr_assert_eq(kc_parse_size("10kb", &v), 0);
    cr_assert_eq(v, 10ull << 10);
    cr_assert_neq(kc_parse_size("banana", &v), 0);
    cr_assert_neq(kc_parse_size("5X", &v), 0);
    cr_assert_neq(kc_parse_size("", &v), 0);
    cr_assert_neq(kc_parse_size("-1", &v), 0);
    cr_assert_neq(kc_parse_size("99999999999999999999T", &v), 0);
}

Test(config, malformed_values_warn_and_keep_defaults)
{
    setenv("KCACHE_MAXSIZE", "banana", 1);
    setenv("KCACHE_NVRTC", "maybe", 1);
    setenv("KCACHE_LOG", "loud", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_eq(c.max_size, 5ull << 30);
    cr_assert(c.nvrtc);
    cr_assert_eq(c.log_level, KC_LOG_WARN);
    cr_assert_eq(c.n_warnings, 3);
    cr_assert(strstr(c.warnings[0], "KCACHE_MAXSIZE=banana") != NULL);
}

Test(config, unknown_variable_warns)
{
    setenv("KCACHE_DISABEL", "1", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert(!c.disable);
    cr_assert_eq(c.n_warnings, 1);
    cr_assert(strstr(c.warnings[0], "KCACHE_DISABEL") != NULL);
}

Test(config, switches_and_provenance)
{
    setenv("KCACHE_DISABLE", "yes", 1);
    setenv("KCACHE_JIT", "off", 1);
    setenv("KCACHE_MAXSIZE", "1G", 1);
    setenv("KCACHE_ALLOC_FALLBACK", "managed", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert(c.disable);
    cr_assert(!c.jit);
    cr_assert_eq(c.max_size, 1ull << 30);
    cr_assert_eq(c.alloc_fallback, KC_ALLOC_FALLBACK_MANAGED);
    char buf[64];
    for (int i = 0; i < kc_config_n_vars; i++) {
        if (strcmp(kc_config_vars[i].name, "KCACHE_MAXSIZE") == 0) {
            cr_assert_eq(c.origin[i], KC_FROM_ENV);
            kc_config_value(&c, i, buf, sizeof buf);
            cr_assert_str_eq(buf, "1073741824");
        }
        if (strcmp(kc_config_vars[i].name, "KCACHE_RECACHE") == 0)
            cr_assert_eq(c.origin[i], KC_FROM_DEFAULT);
    }
}

Test(config, relative_dir_is_made_absolute)
{
    setenv("KCACHE_DIR", "rel/cache", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_eq(c.dir[0], '/');
    cr_assert(strstr(c.dir, "/rel/cache") != NULL);
}

Test(config, readonly_and_recache_conflict_warns)
{
    setenv("KCACHE_READONLY", "1", 1);
    setenv("KCACHE_RECACHE", "1", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert(c.readonly && c.recache);
    cr_assert_eq(c.n_warnings, 1);
}

Test(config, sizes_past_64_bits_are_refused)
{
    uint64_t v = 7;
    cr_assert_neq(kc_parse_size("99999999999999999999999", &v), 0);
    cr_assert_neq(kc_parse_size("18446744073709551616", &v), 0);
    cr_assert_neq(kc_parse_size("18446744073709551616K", &v), 0);
    cr_assert_eq(v, 7, "a refused size leaves the output alone");
    cr_assert_eq(kc_parse_size("18446744073709551615", &v), 0);
    cr_assert_eq(v, UINT64_MAX);
    cr_assert_eq(kc_parse_size("16777215T", &v), 0);
    cr_assert_eq(v, 16777215ull << 40);
}

Test(config, maxsize_overflow_warns_and_keeps_the_default)
{
    setenv("KCACHE_MAXSIZE", "99999999999999999999999", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_eq(c.max_size, 5ull << 30);
    cr_assert_eq(c.n_warnings, 1);
    cr_assert(strstr(c.warnings[0], "KCACHE_MAXSIZE=99999999999999999999999") != NULL);
}

Test(config, maxsize_zero_warns_and_keeps_the_default)
{
    const char *zeros[] = {"0", "0G", " 0 "};
    for (size_t i = 0; i < sizeof zeros / sizeof *zeros; i++) {
        setenv("KCACHE_MAXSIZE", zeros[i], 1);
        struct kc_config c;
        kc_config_load(&c);
        cr_assert_eq(c.max_size, 5ull << 30, "KCACHE_MAXSIZE='%s'", zeros[i]);
        cr_assert_eq(c.n_warnings, 1, "KCACHE_MAXSIZE='%s'", zeros[i]);
        cr_assert(strstr(c.warnings[0], "KCACHE_MAXSIZE") != NULL);
        for (int v = 0; v < kc_config_n_vars; v++)
            if (strcmp(kc_config_vars[v].name, "KCACHE_MAXSIZE") == 0)
                cr_assert_eq(c.origin[v], KC_FROM_DEFAULT);
    }
    /* Elsewhere a zero size stays a size: no pool is kept. */
    unsetenv("KCACHE_MAXSIZE");
    setenv("KCACHE_ALLOC_POOL", "0", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_eq(c.alloc_pool, 0);
    cr_assert_eq(c.n_warnings, 0);
}

/* The remote tier's variables (issue 15) are known, kept as given for the
 * remote module to parse, and KCACHE_REMOTE is shown without its
 * passwords. */
Test(config, remote_variables)
{
    setenv("KCACHE_REMOTE", "redis://alice:hunter2@10.0.0.1:6380/1|read-only redis://:pw@b", 1);
    setenv("KCACHE_REMOTE_TTL", "3600", 1);
    setenv("KCACHE_REMOTE_MAX_ENTRY", "16M", 1);
    setenv("KCACHE_REMOTE_SIGNING_KEY", "/etc/kcache/key", 1);
    setenv("KCACHE_REMOTE_TRUSTED_KEYS", "/etc/kcache/trusted", 1);
    setenv("KCACHE_REMOTE_TRUST", "signed", 1);
    struct kc_config c;
    kc_config_load(&c);
    cr_assert_eq(c.n_warnings, 0, "%s", c.warnings[0]);
    cr_assert_str_eq(c.remote, "redis://alice:hunter2@10.0.0.1:6380/1|read-only redis://:pw@b");
    cr_assert_str_eq(c.remote_ttl, "3600");
    cr_assert_str_eq(c.remote_max_entry, "16M");
    cr_assert_str_eq(c.remote_signing_key, "/etc/kcache/key");
    cr_assert_str_eq(c.remote_trusted_keys, "/etc/kcache/trusted");
    cr_assert_str_eq(c.remote_trust, "signed");
    bool shown = false;
    for (int i = 0; i < kc_config_n_vars; i++) {
        char buf[8192];
        kc_config_value(&c, i, buf, sizeof buf);
        cr_assert_null(strstr(buf, "hunter2"), "%s shows the password", kc_config_vars[i].name);
        cr_assert(strstr(buf, ":pw@") == NULL, "%s shows the password", kc_config_vars[i].name);
        if (strcmp(kc_config_vars[i].name, "KCACHE_REMOTE") == 0) {
            cr_assert_str_eq(buf, "redis://alice:********@10.0.0.1:6380/1|read-only "
                                  "redis://:********@b");
            cr_assert_eq(c.origin[i], KC_FROM_ENV);
            shown = true;
        }
    }
    cr_assert(shown);
    /* Unset: empty, no remote. */
    clean_env();
    kc_config_load(&c);
    cr_assert_str_empty(c.remote);
}
