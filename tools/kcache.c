/*
 * kcache: the command-line tool over the artifact store (store/store.h).
 *
 * It inspects and maintains a cache directory (stats, ls, show, verify, gc,
 * clear), prints the effective configuration (config) and runs the owner
 * process the store starts on demand (owner). Every command works on an empty
 * or missing cache directory; a missing one is never created except by the
 * owner. Errors are one line on stderr, "kcache: error: ...", with exit
 * status 2 for usage errors and 1 for runtime errors.
 */
#include "../common/config.h"
#include "../common/identity.h"
#include "../common/served.h"
#include "../common/log.h"
#include "../store/remote/remote.h"
#include "../store/store.h"
#include "bundle.h"
#include "cli.h"
#include "help.h"
#include "progress.h"
#include "why.h"

#include <dirent.h>
#include <dlfcn.h>
#include <libgen.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_close_range
#define SYS_close_range 436 /* Linux 5.9; glibc < 2.34 does not name it */
#endif

#ifndef KC_VERSION
#define KC_VERSION "unknown"
#endif

/* Everything one invocation needs. */
struct ctx {
    const char *prog_cmd; /* the subcommand */
    char dir[PATH_MAX];   /* effective cache directory */
    bool dir_from_cli;
    struct kc_config cfg;
    const struct kc_store_api *api;   /* the data path: open, close */
    const struct kc_store_admin *adm; /* everything else */
    bool quiet;                       /* --quiet: no progress bar */
};

/* What an entry is, for people: its record's kind, named by the library
 * that made it where two libraries share a layout (libNVVM's results are
 * NVRTC replay records, nvJitLink's and cuLink's links are cubins). */
static const char *kind_name(uint32_t kind, const char *ns)
{
    switch (kind) {
    case KC_KIND_NVRTC:
        return strncmp(ns, "nvvm:", 5) == 0 ? "nvvm" : "nvrtc";
    case KC_KIND_JIT:
        return strncmp(ns, "link:", 5) == 0 ? "link" : "jit";
    case KC_KIND_MANIFEST:
        return "manifest";
    case KC_KIND_BLOB:
        return "blob";
    default:
        return "unknown";
    }
}

/* Formats a byte count for people: "512 B", "1.5 KiB", "3.2 GiB". */

static const char *format_time(uint64_t t, char *buf, size_t len)
{
    if (t == 0) {
        snprintf(buf, len, "-");
        return buf;
    }
    time_t tt = (time_t)t;
    struct tm tm;
    if (localtime_r(&tt, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(buf, len, "%" PRIu64, t);
    return buf;
}

static void key_hex(const kc_key *k, char out[33])
{
    snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, k->id.hi, k->id.lo);
}

/* ---- store access ------------------------------------------------------ */

/* Checks that the store library provides `fn`. */
static bool need(struct ctx *c, const void *fn, const char *name)
{
    if (c->api != NULL && fn != NULL)
        return true;
    kc_tool_err("the store library does not provide %s (store ABI %d): the tool and "
                "libkcache-store.so are from different builds; reinstall kcache",
                name, c->api != NULL ? c->api->abi : -1);
    return false;
}

static void fill_options(struct ctx *c, struct kc_store_options *o, bool readonly)
{
    memset(o, 0, sizeof *o);
    o->dir = c->dir;
    o->readonly = readonly;
    o->max_size = c->cfg.max_size;
    o->tool = NULL;
}

static const char *open_error(int rc)
{
    switch (rc) {
    case -EPERM:
        return "it, or a directory or link on the way to it, is owned by another user or "
               "writable by others (make it yours, mode 0700, or use --dir)";
    case -ENOTEMPTY:
        return "not empty and not a kcache store (give kcache a directory of its own: --dir or "
               "KCACHE_DIR)";
    default:
        return strerror(-rc);
    }
}

/*
 * Looks at the cache directory without creating it. Returns 1 when it exists,
 * 0 when it is missing (the caller reports an empty store), or -1 after
 * printing an error (not a directory, unreadable path, a path to it another
 * user controls).
 */
static int probe_dir(struct ctx *c)
{
    struct stat sb;
    if (stat(c->dir, &sb) != 0) {
        if (errno == ENOENT) {
            /* Missing: an empty store, if the path to it is one we may use
             * (a read-only open checks it and creates nothing). */
            struct kc_store_options o;
            struct kc_store *st = NULL;
            fill_options(c, &o, true);
            int rc = need(c, (const void *)c->api->open, "open") ? c->api->open(&o, &st) : -ENOSYS;
            if (rc < 0 || st == NULL) {
                kc_tool_err("cannot use cache directory %s: %s", c->dir,
                            open_error(rc < 0 ? rc : -EIO));
                return -1;
            }
            c->api->ops->close(st);
            return 0;
        }
        kc_tool_err("cannot use cache directory %s: %s", c->dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        kc_tool_err("cannot use cache directory %s: %s", c->dir, strerror(ENOTDIR));
        return -1;
    }
    return 1;
}

/*
 * Opens the store for a command. Returns 1 with *st set, 0 when the directory
 * is missing (*st NULL: report an empty store), or -1 after an error line.
 */
static int open_store(struct ctx *c, bool readonly, struct kc_store **st)
{
    *st = NULL;
    int p = probe_dir(c);
    if (p <= 0)
        return p;
    if (!need(c, (const void *)c->api->open, "open") ||
        !need(c, (const void *)c->api->ops->close, "close"))
        return -1;
    struct kc_store_options o;
    fill_options(c, &o, readonly);
    int rc = c->api->open(&o, st);
    if (rc < 0 || *st == NULL) {
        kc_tool_err("cannot use cache directory %s: %s", c->dir, open_error(rc < 0 ? rc : -EIO));
        *st = NULL;
        return -1;
    }
    return 1;
}

/* ---- why's look into the store ----------------------------------------- */

/* The store's keys, as miss records name them (32 hex digits, '-', the
 * build's 16), with when each was created, read once, sorted, for
 * `kcache why`. */
struct why_key {
    char key[50];
    uint64_t created; /* unix seconds */
};

struct why_store {
    struct ctx *c;
    int state; /* 0 unread, 1 read, -1 unreadable */
    struct why_key *keys;
    size_t n, cap;
};

static int why_key_cb(const struct kc_entry *e, void *arg)
{
    struct why_store *w = arg;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        struct why_key *k = realloc(w->keys, cap * sizeof *k);
        if (k == NULL)
            return -ENOMEM;
        w->keys = k;
        w->cap = cap;
    }
    char hex[33];
    key_hex(&e->key, hex);
    struct why_key *k = &w->keys[w->n++];
    snprintf(k->key, sizeof k->key, "%s-%016" PRIx64, hex, e->key.build);
    k->created = e->info.created;
    return 0;
}

static int why_key_cmp(const void *a, const void *b)
{
    return strcmp(((const struct why_key *)a)->key, ((const struct why_key *)b)->key);
}

/* kc_tool_in_store_fn: reads the store's keys on first use. */
static int why_in_store(const char *key, uint64_t before, void *arg)
{
    struct why_store *w = arg;
    if (w->state == 0) {
        w->state = -1;
        struct ctx *c = w->c;
        c->api = kc_store_api();
        c->adm = kc_store_admin();
        struct kc_store *st = NULL;
        if (c->api != NULL && c->api->abi == KC_STORE_ABI && c->adm != NULL &&
            c->adm->abi == KC_STORE_ABI && c->adm->foreach != NULL &&
            open_store(c, true, &st) == 1) {
            if (c->adm->foreach (st, NULL, why_key_cb, w) == 0) {
                qsort(w->keys, w->n, sizeof *w->keys, why_key_cmp);
                w->state = 1;
            }
            c->api->ops->close(st);
        }
    }
    if (w->state < 0)
        return -1;
    struct why_key probe;
    snprintf(probe.key, sizeof probe.key, "%s", key);
    const struct why_key *k = bsearch(&probe, w->keys, w->n, sizeof *w->keys, why_key_cmp);
    /* (a second's margin: the miss's own put, made just before its record
     * was written, may fall in the second before the record's) */
    return k != NULL && k->created + 1 < before;
}

/* ---- stats ------------------------------------------------------------- */

static const struct kc_backend_stats *find_backend(const struct kc_store_stats *s, const char *name)
{
    for (size_t i = 0; s != NULL && i < s->n_backends; i++)
        if (strcmp(s->backends[i].backend, name) == 0)
            return &s->backends[i];
    return NULL;
}

/* The backends to print: nvrtc and jit always, then any others the store
 * reports. Returns the count; names point into `s` or static strings. */
static size_t backend_list(const struct kc_store_stats *s, const char **names, size_t max)
{
    size_t n = 0;
    names[n++] = "nvrtc";
    names[n++] = "jit";
    for (size_t i = 0; s != NULL && i < s->n_backends && n < max; i++) {
        const char *b = s->backends[i].backend;
        if (strcmp(b, "nvrtc") != 0 && strcmp(b, "jit") != 0 && !kc_remote_is_stat_backend(b) &&
            strncmp(b, KC_PASS_PREFIX, strlen(KC_PASS_PREFIX)) != 0)
            names[n++] = b;
    }
    return n;
}

/* How many of `backend`'s pass-throughs had reason r (the pseudo-backend
 * "pass:<backend>:<reason>" the shim counts them in). */
static uint64_t pass_count(const struct kc_store_stats *s, const char *backend, int r)
{
    char name[96];
    snprintf(name, sizeof name, KC_PASS_PREFIX "%s:%s", backend, kc_pass_reason_name(r));
    const struct kc_backend_stats *b = find_backend(s, name);
    return b != NULL ? b->c.passthrough : 0;
}

/* The remote section of `kcache stats`: what this node's processes (hosts,
 * owner, push) counted. */
static void print_remote(const struct kc_remote_counters *r)
{
    char b1[32], b2[32];
    uint64_t lookups = r->hits + r->misses;
    printf("Remote:\n");
    printf("  hits %" PRIu64 " (%s)  misses %" PRIu64, r->hits,
           kc_tool_human_size(r->download_bytes, b1, sizeof b1), r->misses);
    if (lookups > 0)
        printf("  hit rate %.1f%%", 100.0 * (double)r->hits / (double)lookups);
    printf("  saved %.3fs\n", r->saved_ns / 1e9);
    printf("  uploads %" PRIu64 " (%s)  kept local (past KCACHE_REMOTE_MAX_ENTRY) %" PRIu64 "\n",
           r->uploads, kc_tool_human_size(r->upload_bytes, b2, sizeof b2), r->skipped);
    printf("  errors %" PRIu64 " (refused %" PRIu64 "  authentication %" PRIu64
           "  protocol %" PRIu64 "  error replies %" PRIu64 "  full %" PRIu64 ")  timeouts %" PRIu64
           "\n",
           r->errors, r->refusals, r->auth_failures, r->protocol_errors, r->error_replies, r->oom,
           r->timeouts);
    if (r->tls_failures > 0 || r->write_refusals > 0 || r->tls_sessions_made > 0 ||
        r->tls_sessions_resumed > 0)
        printf("  TLS sessions made %" PRIu64 "  resumed %" PRIu64 "  refused %" PRIu64
               "  writes refused this user (NOPERM) %" PRIu64 "\n",
               r->tls_sessions_made, r->tls_sessions_resumed, r->tls_failures, r->write_refusals);
    printf("  refused entries %" PRIu64 " (bad signatures %" PRIu64
           ", damaged or misplaced %" PRIu64 ")  turned off %" PRIu64 " times\n",
           r->bad, r->bad_signatures, r->bad >= r->bad_signatures ? r->bad - r->bad_signatures : 0,
           r->breaker_opens);
    printf("  locks %" PRIu64 " taken, %" PRIu64 " held by another node  connections %" PRIu64
           "  MOVED %" PRIu64 "  ASK %" PRIu64 "\n",
           r->locks, r->lock_busy, r->connects, r->moved, r->asks);
    printf("  locks not waited on (not a trusted writer's) %" PRIu64
           "  polls while waiting %" PRIu64 "\n",
           r->lock_untrusted, r->polls);
    /* Compiles the cluster's single flight did not spare, by reason (the
     * debug log names each one's key). */
    uint64_t unspared = r->flight_freed + r->flight_deadline + r->flight_off + r->flight_unusable +
                        r->flight_no_writer + r->flight_no_lock;
    if (unspared > 0)
        printf("  compiles not spared %" PRIu64 " (lock went %" PRIu64 "  wait ran out %" PRIu64
               "  remote off %" PRIu64 "  result unusable here %" PRIu64 "  no writer %" PRIu64
               "  no lock %" PRIu64 ")\n",
               unspared, r->flight_freed, r->flight_deadline, r->flight_off, r->flight_unusable,
               r->flight_no_writer, r->flight_no_lock);
}

/* `kcache stats --openmetrics`: the same numbers in the text format a node
 * exporter's textfile collector and Prometheus read (and OpenMetrics' `#
 * EOF` at the end): gauges for the store, counters per backend and for the
 * remote. Every family has its HELP and TYPE, named as its samples are
 * (a counter's name ends in _total), in base units: a time counted in
 * nanoseconds (a field ending in _ns) is written in seconds. */
static bool stats_openmetrics;

static void om_label(const char *v)
{
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"')
            printf("\\%c", *v);
        else if (*v == '\n')
            printf("\\n");
        else
            putchar(*v);
    }
}

/* A family's sample name: "kcache_" prefix, the field (its "_ns" unit
 * written "_seconds"), and "_total" for a counter. */
static const char *om_name(const char *prefix, const char *field, bool counter, char *buf,
                           size_t len)
{
    size_t fl = strlen(field);
    bool ns = fl > 3 && strcmp(field + fl - 3, "_ns") == 0;
    snprintf(buf, len, "kcache_%s%.*s%s%s", prefix, (int)(ns ? fl - 3 : fl), field,
             ns ? "_seconds" : "", counter ? "_total" : "");
    return buf;
}

/* The family's HELP and TYPE lines; the help is a static text (no
 * backslash or newline to escape). */
static void om_family(const char *name, const char *type, const char *help)
{
    printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample's start: `name{dir="DIR"`; the caller adds labels and ends
 * it with om_value. */
static void om_sample(const struct ctx *c, const char *name)
{
    printf("%s{dir=\"", name);
    om_label(c->dir);
    putchar('"');
}

/* A sample's end: `} VALUE`, a field ending in _ns in seconds. */
static void om_value(const char *field, uint64_t v)
{
    size_t fl = strlen(field);
    if (fl > 3 && strcmp(field + fl - 3, "_ns") == 0)
        printf("} %.9f\n", (double)v / 1e9);
    else
        printf("} %" PRIu64 "\n", v);
}

static void print_openmetrics(const struct ctx *c, const struct kc_store_stats *v,
                              const struct kc_store_stats *s, const char *const *names, size_t nb,
                              uint64_t max_size, const struct kc_remote_counters *rc,
                              bool show_remote)
{
    const struct {
        const char *field, *help;
        uint64_t value;
    } gauges[] = {
        {"entries", "records in the store: artifacts and manifests (kcache ls counts both)",
         v->entries},
        {"disk_bytes", "bytes the store takes on disk", v->disk_bytes},
        {"raw_bytes", "artifact bytes before dedup", v->raw_bytes},
        {"unique_bytes", "artifact bytes after dedup", v->unique_bytes},
        {"max_bytes", "the store's size limit", max_size},
    };
    char nm[128];
    for (size_t g = 0; g < sizeof gauges / sizeof *gauges; g++) {
        om_name("", gauges[g].field, false, nm, sizeof nm);
        om_family(nm, "gauge", gauges[g].help);
        om_sample(c, nm);
        om_value(gauges[g].field, gauges[g].value);
    }
#define KC__OM_BACKEND(field, what)                                                                \
    om_name("", #field, true, nm, sizeof nm);                                                      \
    om_family(nm, "counter", what);                                                                \
    for (size_t i = 0; i < nb; i++) {                                                              \
        const struct kc_backend_stats *b = find_backend(s, names[i]);                              \
        om_sample(c, nm);                                                                          \
        printf(",backend=\"");                                                                     \
        om_label(names[i]);                                                                        \
        putchar('"');                                                                              \
        om_value(#field, b != NULL ? b->c.field : 0);                                              \
    }
    KC_COUNTERS(KC__OM_BACKEND)
#undef KC__OM_BACKEND
    om_family("kcache_passthrough_reason_total", "counter",
              "requests that bypassed the cache, by why");
    for (size_t i = 0; i < nb; i++)
        for (int r = 0; r < KC_N_PASS_REASONS; r++) {
            om_sample(c, "kcache_passthrough_reason_total");
            printf(",backend=\"");
            om_label(names[i]);
            printf("\",reason=\"%s\"", kc_pass_reason_name(r));
            om_value("", pass_count(s, names[i], r));
        }
    if (show_remote) {
#define KC__OM_REMOTE(field, what)                                                                 \
    om_name("remote_", #field, true, nm, sizeof nm);                                               \
    om_family(nm, "counter", what);                                                                \
    om_sample(c, nm);                                                                              \
    om_value(#field, rc->field);
        KC_REMOTE_COUNTERS(KC__OM_REMOTE)
#undef KC__OM_REMOTE
    }
    printf("# EOF\n");
}

static int cmd_stats(struct ctx *c, bool json)
{
    struct kc_store *st = NULL;
    int o = open_store(c, true, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    struct kc_store_stats *s = NULL;
    struct kc_store_stats empty;
    memset(&empty, 0, sizeof empty);
    empty.max_size = c->cfg.max_size;
    if (st != NULL) {
        if (!need(c, (const void *)c->adm->stats, "stats") ||
            !need(c, (const void *)c->adm->stats_free, "stats_free")) {
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
        int rc = c->adm->stats(st, &s);
        if (rc < 0 || s == NULL) {
            kc_tool_err("cannot read statistics of %s: %s", c->dir, strerror(rc < 0 ? -rc : EIO));
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
    }
    const struct kc_store_stats *v = s != NULL ? s : &empty;
    uint64_t max_size = v->max_size != 0 ? v->max_size : c->cfg.max_size;

    const char *names[64];
    size_t nb = backend_list(s, names, 64);
    uint64_t saved_ns = 0;
    struct kc_remote_counters rc;
    memset(&rc, 0, sizeof rc);
    for (size_t i = 0; s != NULL && i < s->n_backends; i++) {
        /* The remote's counters are kept as pseudo-backends (remote.h);
         * its time saved is in the NVRTC and JIT hits already. */
        for (int k = 0; k < KC_REMOTE_STAT_BACKENDS; k++)
            if (strcmp(s->backends[i].backend, kc_remote_stat_backend(k)) == 0)
                kc_remote_counters_unpack(&s->backends[i].c, k, &rc);
        if (!kc_remote_is_stat_backend(s->backends[i].backend) &&
            strncmp(s->backends[i].backend, KC_PASS_PREFIX, strlen(KC_PASS_PREFIX)) != 0)
            saved_ns += s->backends[i].c.saved_ns;
    }
    bool show_remote =
        c->cfg.remote[0] != '\0' || memcmp(&rc, &(struct kc_remote_counters){0}, sizeof rc) != 0;

    if (stats_openmetrics) {
        print_openmetrics(c, v, s, names, nb, max_size, &rc, show_remote);
    } else if (json) {
        printf("{\"dir\": ");
        kc_tool_json_str(stdout, c->dir);
        printf(", \"exists\": %s", o == 1 ? "true" : "false");
        printf(", \"entries\": %" PRIu64 ", \"spool_entries\": %" PRIu64, v->entries,
               v->spool_entries);
        printf(", \"raw_bytes\": %" PRIu64 ", \"unique_bytes\": %" PRIu64
               ", \"disk_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64
               ", \"max_size\": %" PRIu64,
               v->raw_bytes, v->unique_bytes, v->disk_bytes, v->reserved_bytes, max_size);
        printf(", \"saved_seconds\": %.3f", saved_ns / 1e9);
        printf(", \"namespaces\": [");
        for (size_t i = 0; i < v->n_ns; i++) {
            printf("%s{\"name\": ", i ? ", " : "");
            kc_tool_json_str(stdout, v->ns[i].ns);
            printf(", \"entries\": %" PRIu64 ", \"raw_bytes\": %" PRIu64 "}", v->ns[i].entries,
                   v->ns[i].raw_bytes);
        }
        printf("], \"backends\": [");
        for (size_t i = 0; i < nb; i++) {
            const struct kc_backend_stats *b = find_backend(s, names[i]);
            struct kc_counters z;
            memset(&z, 0, sizeof z);
            const struct kc_counters *k = b != NULL ? &b->c : &z;
            printf("%s{\"name\": ", i ? ", " : "");
            kc_tool_json_str(stdout, names[i]);
            printf(", \"hits\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"passthrough\": %" PRIu64
                   ", \"stores\": %" PRIu64 ", \"errors\": %" PRIu64
                   ", \"saved_seconds\": %.3f, \"compile_seconds\": %.3f",
                   k->hits, k->misses, k->passthrough, k->stores, k->errors, k->saved_ns / 1e9,
                   k->compile_ns / 1e9);
            printf(", \"passthrough_reasons\": {");
            for (int r = 0, first = 1; r < KC_N_PASS_REASONS; r++) {
                uint64_t n = pass_count(s, names[i], r);
                if (n == 0)
                    continue;
                printf("%s\"%s\": %" PRIu64, first ? "" : ", ", kc_pass_reason_name(r), n);
                first = 0;
            }
            printf("}}");
        }
        printf("], \"remote\": {\"configured\": %s", c->cfg.remote[0] != '\0' ? "true" : "false");
#define KC__JSON_REMOTE(name, what) printf(", \"" #name "\": %" PRIu64, rc.name);
        KC_REMOTE_COUNTERS(KC__JSON_REMOTE)
#undef KC__JSON_REMOTE
        printf("}}\n");
    } else {
        char b1[32], b2[32], b3[32], b4[32];
        printf("Cache directory:      %s%s\n", c->dir, o == 1 ? "" : " (does not exist yet)");
        printf("Entries:              %" PRIu64, v->entries);
        /* A compile that read header files keeps two: say so, or 6 kernels
         * read as 12. */
        if (v->entries > 0)
            printf(" (artifacts and manifests: `kcache ls` shows each one's kind)");
        if (v->spool_entries)
            printf(" (%" PRIu64 " pending in the spool)", v->spool_entries);
        printf("\n");
        printf("Size on disk:         %s of %s limit",
               kc_tool_human_size(v->disk_bytes, b1, sizeof b1),
               kc_tool_human_size(max_size, b2, sizeof b2));
        /* A running owner preallocates its write-ahead log (tens of MiB):
         * say so, or a small store looks large right after a run. */
        if (v->reserved_bytes >= (1u << 20) && v->reserved_bytes * 10 >= v->disk_bytes)
            printf(" (%s of it reserved by running kcache processes, freed when they exit)",
                   kc_tool_human_size(v->reserved_bytes, b3, sizeof b3));
        printf("\n");
        printf("Artifact bytes:       %s raw, %s unique after dedup\n",
               kc_tool_human_size(v->raw_bytes, b3, sizeof b3),
               kc_tool_human_size(v->unique_bytes, b4, sizeof b4));
        printf("Compile time saved:   %.3f s\n", saved_ns / 1e9);
        if (v->n_ns > 0) {
            printf("Namespaces:\n");
            for (size_t i = 0; i < v->n_ns; i++) {
                char nm[KC_TOOL_PRINTABLE_MAX];
                printf("  %-40s %8" PRIu64 " entries  %s\n",
                       kc_tool_printable(v->ns[i].ns, nm, sizeof nm), v->ns[i].entries,
                       kc_tool_human_size(v->ns[i].raw_bytes, b1, sizeof b1));
            }
        }
        printf("Backends:\n");
        for (size_t i = 0; i < nb; i++) {
            const struct kc_backend_stats *b = find_backend(s, names[i]);
            struct kc_counters z;
            memset(&z, 0, sizeof z);
            const struct kc_counters *k = b != NULL ? &b->c : &z;
            uint64_t lookups = k->hits + k->misses;
            char nm[KC_TOOL_PRINTABLE_MAX];
            /* Why they passed through: "passthrough 3 (option 2, input 1)". */
            char why[256] = "";
            for (int r = 0, w = 0; r < KC_N_PASS_REASONS && w >= 0 && (size_t)w < sizeof why; r++) {
                uint64_t n = pass_count(s, names[i], r);
                if (n != 0)
                    w += snprintf(why + w, sizeof why - w, "%s%s %" PRIu64, w ? ", " : " (",
                                  kc_pass_reason_name(r), n);
            }
            printf("  %-6s hits %" PRIu64 "  misses %" PRIu64 "  passthrough %" PRIu64 "%s%s"
                   "  stores %" PRIu64 "  errors %" PRIu64,
                   kc_tool_printable(names[i], nm, sizeof nm), k->hits, k->misses, k->passthrough,
                   why, why[0] != '\0' ? ")" : "", k->stores, k->errors);
            if (lookups > 0)
                printf("  hit rate %.1f%%", 100.0 * (double)k->hits / (double)lookups);
            printf("  saved %.3fs  compiled %.3fs\n", k->saved_ns / 1e9, k->compile_ns / 1e9);
        }
        if (show_remote)
            print_remote(&rc);
    }
    if (s != NULL)
        c->adm->stats_free(s);
    if (st != NULL)
        c->api->ops->close(st);
    return kc_tool_flush(stdout);
}

/* ---- ls / show --------------------------------------------------------- */

static int ls_cb(const struct kc_entry *e, void *arg)
{
    (void)arg;
    char hex[33], t[40], nm[KC_TOOL_PRINTABLE_MAX];
    key_hex(&e->key, hex);
    printf("%s %s %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %s%s\n", hex,
           kc_tool_printable(e->ns, nm, sizeof nm), kind_name(e->info.kind, e->ns),
           e->info.body_size, e->stored_bytes, e->info.hits,
           format_time(e->info.last_hit, t, sizeof t), e->pending ? " pending" : "");
    return 0;
}

static int walk_error(struct ctx *c, int rc)
{
    kc_tool_err("cannot read the entries of %s: %s", c->dir, strerror(rc < 0 ? -rc : EIO));
    return KC_EXIT_RUNTIME;
}

static int cmd_ls(struct ctx *c, const char *ns)
{
    struct kc_store *st = NULL;
    int o = open_store(c, true, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    if (st == NULL)
        return 0;
    if (!need(c, (const void *)c->adm->foreach, "foreach")) {
        c->api->ops->close(st);
        return KC_EXIT_RUNTIME;
    }
    int rc = c->adm->foreach (st, ns, ls_cb, NULL);
    c->api->ops->close(st);
    if (rc != 0)
        return walk_error(c, rc);
    return kc_tool_flush(stdout);
}

struct show_match {
    kc_key key;
    char ns[128];
    struct kc_record_info info;
    uint64_t stored_bytes;
    int pending;
};

struct show_state {
    const char *prefix; /* lower-case hex */
    size_t n, cap;
    struct show_match *m;
    bool oom;
};

static int show_cb(const struct kc_entry *e, void *arg)
{
    struct show_state *s = arg;
    char hex[33];
    key_hex(&e->key, hex);
    if (strncmp(hex, s->prefix, strlen(s->prefix)) != 0)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        struct show_match *m = realloc(s->m, cap * sizeof *m);
        if (m == NULL) {
            s->oom = true;
            return -ENOMEM;
        }
        s->m = m;
        s->cap = cap;
    }
    struct show_match *m = &s->m[s->n++];
    m->key = e->key;
    snprintf(m->ns, sizeof m->ns, "%s", e->ns);
    m->info = e->info;
    m->stored_bytes = e->stored_bytes;
    m->pending = e->pending;
    return 0;
}

static int cmd_show(struct ctx *c, const char *key)
{
    char prefix[33];
    size_t n = strlen(key);
    if (n < 4 || n > 32)
        return kc_tool_usage_error("KEY must be 4 to 32 hex digits, got '%s'", key);
    for (size_t i = 0; i < n; i++) {
        char ch = key[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F')))
            return kc_tool_usage_error("KEY must be hex digits, got '%s'", key);
        prefix[i] = (char)(ch >= 'A' && ch <= 'F' ? ch - 'A' + 'a' : ch);
    }
    prefix[n] = '\0';

    struct kc_store *st = NULL;
    int o = open_store(c, true, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    struct show_state s = {.prefix = prefix};
    if (st != NULL) {
        if (!need(c, (const void *)c->adm->foreach, "foreach")) {
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
        int rc = c->adm->foreach (st, NULL, show_cb, &s);
        c->api->ops->close(st);
        if (rc != 0) {
            free(s.m);
            return walk_error(c, rc);
        }
    }
    if (s.n == 0) {
        kc_tool_err("no entry with key %s in %s (kcache ls lists the keys)", prefix, c->dir);
        return KC_EXIT_RUNTIME;
    }
    for (size_t i = 1; i < s.n; i++) {
        if (s.m[i].key.id.lo != s.m[0].key.id.lo || s.m[i].key.id.hi != s.m[0].key.id.hi) {
            kc_tool_err("key prefix %s is ambiguous: it matches more than one key; give more "
                        "digits",
                        prefix);
            free(s.m);
            return KC_EXIT_RUNTIME;
        }
    }
    for (size_t i = 0; i < s.n; i++) {
        const struct show_match *m = &s.m[i];
        char hex[33], t1[40], t2[40], b1[32], b2[32];
        key_hex(&m->key, hex);
        if (i > 0)
            printf("\n");
        printf("Key:          %s\n", hex);
        printf("Build:        %016" PRIx64 "\n", m->key.build);
        char nm[KC_TOOL_PRINTABLE_MAX];
        printf("Namespace:    %s\n", kc_tool_printable(m->ns, nm, sizeof nm));
        printf("Kind:         %s\n", kind_name(m->info.kind, m->ns));
        printf("Format:       %" PRIu32 "\n", m->info.format);
        printf("Size:         %" PRIu64 " bytes (%s)\n", m->info.body_size,
               kc_tool_human_size(m->info.body_size, b1, sizeof b1));
        printf("Stored:       %" PRIu64 " bytes (%s)\n", m->stored_bytes,
               kc_tool_human_size(m->stored_bytes, b2, sizeof b2));
        printf("Created:      %s\n", format_time(m->info.created, t1, sizeof t1));
        printf("Last hit:     %s\n", format_time(m->info.last_hit, t2, sizeof t2));
        printf("Hits:         %" PRIu64 "\n", m->info.hits);
        printf("Saves:        %.3f s per hit\n", m->info.saved_ns / 1e9);
        printf("State:        %s\n", m->pending ? "pending (in the spool)" : "stored");
    }
    free(s.m);
    return kc_tool_flush(stdout);
}

/* ---- verify / gc / clear ---------------------------------------------- */

static int cmd_verify(struct ctx *c)
{
    struct kc_store *st = NULL;
    int o = open_store(c, false, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    struct kc_verify_report r;
    memset(&r, 0, sizeof r);
    if (st != NULL) {
        if (!need(c, (const void *)c->adm->verify, "verify")) {
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
        struct kc_tool_progress p;
        kc_tool_progress_begin(&p, "verify", false, kc_tool_progress_wanted(c->quiet));
        int rc = c->adm->verify(st, 1, &r, p.on ? kc_tool_progress : NULL, &p);
        kc_tool_progress_end(&p);
        c->api->ops->close(st);
        if (rc < 0) {
            kc_tool_err("verify of %s failed: %s", c->dir, strerror(-rc));
            return KC_EXIT_RUNTIME;
        }
    }
    printf("checked %" PRIu64 " records: %" PRIu64 " bad, %" PRIu64 " purged, %" PRIu64
           " bad spool files removed\n",
           r.checked, r.bad, r.purged, r.spool_bad);
    return kc_tool_flush(stdout);
}

static int cmd_gc(struct ctx *c, uint64_t max_size)
{
    struct kc_store *st = NULL;
    int o = open_store(c, false, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    struct kc_gc_report r;
    memset(&r, 0, sizeof r);
    if (st != NULL) {
        if (!need(c, (const void *)c->adm->gc, "gc")) {
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
        /* Counted in bytes: what eviction frees of what it must. */
        struct kc_tool_progress p;
        kc_tool_progress_begin(&p, "gc", true, kc_tool_progress_wanted(c->quiet));
        int rc = c->adm->gc(st, max_size, &r, p.on ? kc_tool_progress : NULL, &p);
        kc_tool_progress_end(&p);
        c->api->ops->close(st);
        if (rc < 0) {
            kc_tool_err("gc of %s failed: %s", c->dir, strerror(-rc));
            return KC_EXIT_RUNTIME;
        }
    }
    char b1[32], b2[32], b3[32];
    printf("evicted %" PRIu64 " entries: %s -> %s (limit %s)\n", r.evicted,
           kc_tool_human_size(r.bytes_before, b1, sizeof b1),
           kc_tool_human_size(r.bytes_after, b2, sizeof b2),
           kc_tool_human_size(max_size ? max_size : c->cfg.max_size, b3, sizeof b3));
    return kc_tool_flush(stdout);
}

static int cmd_clear(struct ctx *c)
{
    struct kc_store *st = NULL;
    int o = open_store(c, false, &st);
    if (o < 0)
        return KC_EXIT_RUNTIME;
    if (st != NULL) {
        if (!need(c, (const void *)c->adm->clear, "clear")) {
            c->api->ops->close(st);
            return KC_EXIT_RUNTIME;
        }
        int rc = c->adm->clear(st);
        c->api->ops->close(st);
        if (rc < 0) {
            kc_tool_err("clear of %s failed: %s", c->dir, strerror(-rc));
            return KC_EXIT_RUNTIME;
        }
    }
    printf("cleared %s\n", c->dir);
    return kc_tool_flush(stdout);
}

/* ---- config / owner ---------------------------------------------------- */

/* Prints s for a Markdown table cell: '|' escaped. */
static void md_cell(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            putchar('\\');
        putchar(*s);
    }
}

/* The configuration table as Markdown, from kc_config_vars alone (never the
 * environment): README.md's table between its markers (scripts/update-readme
 * writes it, tests/docs checks it). */
static int cmd_config_markdown(void)
{
    printf("| variable | `kcache-run` flag | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < KC_N_SETTINGS; i++) {
        const struct kc_config_var *v = &kc_config_vars[i];
        printf("| `%s` | ", v->name);
        if (v->flag != NULL)
            printf("`%s`", v->flag);
        printf(" | `");
        md_cell(v->dflt != NULL ? v->dflt : "");
        printf("` | ");
        md_cell(v->help);
        printf(" |\n");
    }
    printf("\nSet by kcache for its own processes, or by tests and packagers (not settings; "
           "`kcache config` lists those set):");
    for (int i = KC_N_SETTINGS; i < KC_VAR_FIRST_HARNESS; i++)
        printf("%s `%s` (%s)", i == KC_N_SETTINGS ? "" : ",", kc_config_vars[i].name,
               kc_config_vars[i].help);
    printf(".\n\nRead only by kcache's own scripts and tests, never by kcache:");
    for (int i = KC_VAR_FIRST_HARNESS; i < kc_config_n_vars; i++) {
        const char *n = kc_config_vars[i].name;
        printf("%s `%s%s`", i == KC_VAR_FIRST_HARNESS ? "" : ",", n,
               n[strlen(n) - 1] == '_' ? "*" : "");
    }
    printf(".\n");
    return kc_tool_flush(stdout);
}

/*
 * This kcache's build id: the one every key its shim derives carries (the
 * shim's kc__self_build: the low half of libkcache.so's identity), and
 * what `kcache remote stats` and `remote prune --build` name. Read from
 * the libkcache.so installed with this tool: beside the store library it
 * runs with (an installed tree, the wheel), else the build tree's
 * ../shim/ of this program. Returns the id, with the file in path; 0 when
 * no such file is found or readable (path empty).
 */
static uint64_t tool_self_build(char *path, size_t len)
{
    char dirs[2][PATH_MAX] = {"", ""};
    Dl_info di;
    if (dladdr((const void *)kc_store_api, &di) != 0 && di.dli_fname != NULL &&
        realpath(di.dli_fname, dirs[0]) != NULL)
        dirname(dirs[0]);
    else
        dirs[0][0] = '\0';
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        snprintf(dirs[1], sizeof dirs[1], "%s/../shim", dirname(exe));
    }
    for (int i = 0; i < 2; i++) {
        if (dirs[i][0] == '\0')
            continue;
        if ((size_t)snprintf(path, len, "%s/libkcache.so", dirs[i]) >= len)
            continue;
        kc_digest d;
        if (access(path, R_OK) == 0 && kc__file_identity(path, &d) == 0)
            return d.lo != 0 ? d.lo : 1;
    }
    path[0] = '\0';
    return 0;
}

/* `kcache config`'s line naming this build. */
static void config_build(void)
{
    char path[2 * PATH_MAX + 32];
    uint64_t b = tool_self_build(path, sizeof path);
    if (b != 0) {
        printf("kcache build: %016" PRIx64 " (", b);
        kc_tool_put_printable(stdout, path);
        printf("; `kcache remote stats` names entries by it)\n");
    } else {
        printf("kcache build: unknown (no libkcache.so beside this tool)\n");
    }
}

/* kc_remote_options.warn of `kcache config`: a warning line of its own. */
static void config_remote_warn(const char *msg, void *arg)
{
    (void)arg;
    printf("warning: %s\n", msg);
}

/* The libraries the shim last served with this store (common/served.h:
 * each process that used one records it at exit), and whether each is
 * still there. */
static void config_libraries(const struct ctx *c)
{
    static const char *const label[KC_SERVED_N] = {"NVRTC", "nvJitLink", "libNVVM", "libcuda"};
    char(*path)[PATH_MAX] = c->dir[0] != '\0' ? malloc(KC_SERVED_N * sizeof *path) : NULL;
    if (path == NULL)
        return;
    int rc = kc_served_read(c->dir, path);
    if (rc != 0 && rc != -ENOENT) {
        printf("libraries the shim last served: unknown (%s/%s: %s)\n", c->dir, KC_SERVED_FILE,
               strerror(-rc));
    } else {
        printf("libraries the shim last served (%s/%s):\n", c->dir, KC_SERVED_FILE);
        for (int i = 0; i < KC_SERVED_N; i++) {
            if (path[i][0] == '\0')
                printf("  %-10s none recorded\n", label[i]);
            else {
                /* (read from the store's directory: printed escaped) */
                printf("  %-10s ", label[i]);
                kc_tool_put_printable(stdout, path[i]);
                printf("%s\n", access(path[i], F_OK) == 0 ? "" : " (no longer there)");
            }
        }
    }
    free(path);
}

static int cmd_config(struct ctx *c, bool markdown)
{
    if (markdown)
        return cmd_config_markdown();
    /* The first column as wide as the longest name it may show, so every
     * value lines up (KCACHE_REMOTE_PASSWORD_FILE is 27 characters). */
    int w = (int)strlen("VARIABLE");
    for (int i = 0; i < KC_VAR_FIRST_HARNESS; i++)
        if ((int)strlen(kc_config_vars[i].name) > w)
            w = (int)strlen(kc_config_vars[i].name);
    printf("%-*s %-12s %s\n", w, "VARIABLE", "FROM", "VALUE");
    for (int i = 0; i < KC_N_SETTINGS; i++) {
        char val[PATH_MAX + 32];
        const char *from;
        bool is_dir = i == KC_VAR_DIR;
        if (is_dir && c->dir_from_cli) {
            snprintf(val, sizeof val, "%s", c->dir);
            from = "command-line";
        } else {
            kc_config_value(&c->cfg, i, val, (int)sizeof val);
            from = c->cfg.origin[i] == KC_FROM_ENV ? "environment" : "default";
        }
        /* A value the environment set but that was rejected: say so. */
        const char *raw = kc_config_get(i);
        if (!(is_dir && c->dir_from_cli) && c->cfg.origin[i] != KC_FROM_ENV && raw != NULL &&
            raw[0] != '\0')
            printf("%-*s %-12s %s (environment value '%s' ignored)\n", w, kc_config_vars[i].name,
                   from, val, raw);
        else
            printf("%-*s %-12s %s\n", w, kc_config_vars[i].name, from, val);
    }
    /* Internal variables: not settings, but they change what kcache runs
     * or loads, so those set are shown, apart. */
    bool heading = false;
    for (int i = KC_N_SETTINGS; i < KC_VAR_FIRST_HARNESS; i++) {
        const char *raw = kc_config_get(i);
        if (raw == NULL)
            continue;
        if (!heading)
            printf("internal (set for kcache's own processes, tests and packaging):\n");
        heading = true;
        printf("%-*s %-12s %s\n", w, kc_config_vars[i].name, "environment", raw);
    }
    config_build();
    config_libraries(c);
    for (int i = 0; i < c->cfg.n_warnings; i++)
        printf("warning: %s\n", c->cfg.warnings[i]);
    /* The remote's settings are parsed by its module. */
    struct kc_remote_settings rs;
    struct kc_remote_config rc;
    char why[400];
    kc_remote_settings_from_config(&c->cfg, &rs);
    if (kc_remote_config_parse(&rs, &rc, why, sizeof why) != 0) {
        printf("warning: %s; the remote is off\n", why);
    } else {
        for (int i = 0; i < rc.n_warnings; i++)
            printf("warning: %s\n", rc.warnings[i]);
        /* The files it names (password, keys) read as a host's first
         * remote operation reads them, each refused one warned about as
         * there; nothing is connected to. */
        struct kc_remote *r = NULL;
        if (rc.mode != KC_REMOTE_NONE &&
            kc_remote_open(&rc, &(struct kc_remote_options){.warn = config_remote_warn}, &r) == 0) {
            kc_remote_load(r);
            kc_remote_close(r);
        }
    }
    kc_remote_config_free(&rc);
    return kc_tool_flush(stdout);
}

/* ---- keygen / remote ping ---------------------------------------------- */

static int cmd_keygen(const char *path)
{
    char id[17];
    int rc = kc_remote_keygen(path, NULL, id);
    if (rc == -EEXIST) {
        kc_tool_err("%s or %s.pub exists; not overwritten (choose another PATH, or remove both "
                    "first)",
                    path, path);
        return KC_EXIT_RUNTIME;
    }
    if (rc != 0) {
        kc_tool_err("keygen %s: %s", path,
                    rc == -ENOSYS ? "libsodium is not installed (install libsodium23, or use the "
                                    "kcache tarball or wheel, which carry it)"
                                  : strerror(-rc));
        return KC_EXIT_RUNTIME;
    }
    printf("secret key: %s (keep it private: KCACHE_REMOTE_SIGNING_KEY of the writers)\n"
           "public key: %s.pub (a line for every node's KCACHE_REMOTE_TRUSTED_KEYS file)\n"
           "key id %s\n",
           path, path, id);
    return kc_tool_flush(stdout);
}

static struct kc_remote *tool_remote(struct ctx *c);

static int cmd_remote_ping(struct ctx *c)
{
    struct kc_remote *r = tool_remote(c);
    if (r == NULL)
        return KC_EXIT_RUNTIME;
    static struct kc_remote_ping p;
    int rc = kc_remote_ping(r, &p);
    for (int i = 0; i < p.n; i++) {
        const struct kc_remote_ping_server *s = &p.server[i];
        /* The version, role and errors are the server's words. */
        char v[KC_TOOL_PRINTABLE_MAX], ro[KC_TOOL_PRINTABLE_MAX], w[4 * 256 + 1];
        if (s->rc == 0)
            printf("%s: %.2f ms, redis %s, %s\n", s->name, s->latency_ms,
                   s->version[0] ? kc_tool_printable(s->version, v, sizeof v) : "?",
                   s->role[0] ? kc_tool_printable(s->role, ro, sizeof ro) : "?");
        else
            printf("%s: %s\n", s->name,
                   s->why[0]                ? kc_tool_printable(s->why, w, sizeof w)
                   : s->rc == -ECONNREFUSED ? "cannot connect"
                                            : strerror(-s->rc));
    }
    bool server_failed = false;
    for (int i = 0; i < p.n; i++)
        server_failed = server_failed || p.server[i].rc != 0;
    if (rc == 0 && p.roundtrip_rc == 0)
        printf("signed entry: written, read back and verified, deleted (key id %s, %d trusted "
               "key%s)\n",
               p.key_id, p.n_trusted, p.n_trusted == 1 ? "" : "s");
    else if (rc == 0 && p.roundtrip_rc == -EROFS)
        printf("signed entry: not written (no signing key: this node is read-only); a read "
               "worked (%d trusted key%s)\n",
               p.n_trusted, p.n_trusted == 1 ? "" : "s");
    else if (server_failed)
        printf("signed entry: not tried (a server failed, above)\n");
    else if (p.roundtrip_rc == -ENETDOWN)
        printf("signed entry: not tried (the remote is off: see the warning above)\n");
    else
        printf("signed entry: %s\n", strerror(-p.roundtrip_rc));
    kc_remote_close(r);
    if (kc_tool_flush(stdout) != 0)
        return KC_EXIT_RUNTIME;
    return rc == 0 ? 0 : KC_EXIT_RUNTIME;
}

/* ---- remote stats, remote prune ------------------------------------------ */

struct rstat_row {
    char ns[128];
    uint64_t build;
    uint64_t entries, bytes;
};

struct rstat_acc {
    struct rstat_row *v;
    size_t n, cap;
    /* v's rows by (namespace, build): an open-addressed table of row
     * numbers + 1 (0: free), at most half full, so a key is tallied in
     * constant time however many namespaces a writer made */
    size_t *slot, n_slot;
    /* prune: what matches is collected */
    const char *ns;
    bool by_build;
    uint64_t build;
    struct push_item_min {
        char ns[128];
        kc_key key;
        uint64_t bytes;
    } * drop;
    size_t n_drop, cap_drop;
    uint64_t scanned;
    struct kc_tool_progress progress;
};

/* FNV-1a of the namespace, mixed with the build. */
static size_t rstat_hash(const char *ns, uint64_t build)
{
    uint64_t h = 0xcbf29ce484222325ull ^ build;
    for (const unsigned char *p = (const unsigned char *)ns; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return (size_t)(h ^ h >> 29);
}

/* Doubles the table (or makes it): 0, or -ENOMEM. */
static int rstat_grow(struct rstat_acc *a)
{
    size_t n = a->n_slot ? 2 * a->n_slot : 256;
    size_t *slot = calloc(n, sizeof *slot);
    if (slot == NULL)
        return -ENOMEM;
    for (size_t r = 0; r < a->n; r++) {
        size_t i = rstat_hash(a->v[r].ns, a->v[r].build) & (n - 1);
        while (slot[i] != 0)
            i = (i + 1) & (n - 1);
        slot[i] = r + 1;
    }
    free(a->slot);
    a->slot = slot;
    a->n_slot = n;
    return 0;
}

static int rstat_cb(const char *ns, const kc_key *key, uint64_t bytes, void *arg)
{
    struct rstat_acc *a = arg;
    if (2 * (a->n + 1) > a->n_slot && rstat_grow(a) != 0)
        return -ENOMEM;
    size_t i = rstat_hash(ns, key->build) & (a->n_slot - 1);
    for (; a->slot[i] != 0; i = (i + 1) & (a->n_slot - 1)) {
        struct rstat_row *row = &a->v[a->slot[i] - 1];
        if (row->build == key->build && strcmp(row->ns, ns) == 0) {
            row->entries++;
            row->bytes += bytes;
            return 0;
        }
    }
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        struct rstat_row *v = realloc(a->v, cap * sizeof *v);
        if (v == NULL)
            return -ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    struct rstat_row *row = &a->v[a->n++];
    snprintf(row->ns, sizeof row->ns, "%s", ns);
    row->build = key->build;
    row->entries = 1;
    row->bytes = bytes;
    a->slot[i] = a->n;
    return 0;
}

static int rstat_cmp(const void *x, const void *y)
{
    const struct rstat_row *a = x, *b = y;
    int c = strcmp(a->ns, b->ns);
    return c != 0 ? c : a->build < b->build ? -1 : a->build > b->build;
}

/* `kcache remote stats`: entries and bytes per namespace and kcache build
 * (the key's build field) on every server. */
static int cmd_remote_stats(struct ctx *c, bool json)
{
    struct kc_remote *r = tool_remote(c);
    if (r == NULL)
        return KC_EXIT_RUNTIME;
    struct rstat_acc a = {0};
    struct kc_remote_scan_report sr;
    int rc = kc_remote_scan(r, rstat_cb, &a, &sr);
    kc_remote_close(r);
    free(a.slot);
    if (rc != 0) {
        kc_tool_err("remote stats: %s", strerror(-rc));
        free(a.v);
        return KC_EXIT_RUNTIME;
    }
    qsort(a.v, a.n, sizeof *a.v, rstat_cmp);
    uint64_t entries = 0, bytes = 0;
    for (size_t i = 0; i < a.n; i++) {
        entries += a.v[i].entries;
        bytes += a.v[i].bytes;
    }
    char b1[32], self_path[2 * PATH_MAX + 32];
    /* Build 0 is no build: the manifests (shared by every build) are
     * kept under it. This tool's own build is marked. */
    uint64_t self = tool_self_build(self_path, sizeof self_path);
    if (json) {
        printf("{\"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"complete\": %s, ", entries,
               bytes, sr.cut ? "false" : "true");
        if (self != 0)
            printf("\"this_build\": \"%016" PRIx64 "\", ", self);
        printf("\"namespaces\": [");
        for (size_t i = 0; i < a.n; i++) {
            printf("%s{\"name\": ", i ? ", " : "");
            kc_tool_json_str(stdout, a.v[i].ns);
            printf(", \"build\": \"%016" PRIx64 "\", \"manifests\": %s, \"entries\": %" PRIu64
                   ", \"bytes\": %" PRIu64 "}",
                   a.v[i].build, a.v[i].build == 0 ? "true" : "false", a.v[i].entries,
                   a.v[i].bytes);
        }
        printf("]}\n");
    } else {
        printf("Remote entries:       %" PRIu64 " (%s)\n", entries,
               kc_tool_human_size(bytes, b1, sizeof b1));
        if (self != 0)
            printf("This kcache's build:  %016" PRIx64 "\n", self);
        if (a.n > 0)
            printf("  %-40s %-16s %8s  %s\n", "NAMESPACE", "BUILD", "ENTRIES", "BYTES");
        for (size_t i = 0; i < a.n; i++) {
            char nm[KC_TOOL_PRINTABLE_MAX], bd[20];
            if (a.v[i].build == 0)
                snprintf(bd, sizeof bd, "manifests");
            else
                snprintf(bd, sizeof bd, "%016" PRIx64, a.v[i].build);
            printf("  %-40s %-16s %8" PRIu64 "  %s%s\n",
                   kc_tool_printable(a.v[i].ns, nm, sizeof nm), bd, a.v[i].entries,
                   kc_tool_human_size(a.v[i].bytes, b1, sizeof b1),
                   a.v[i].build == 0      ? "  (every build's: headers read, not artifacts)"
                   : a.v[i].build == self ? "  (this build)"
                                          : "");
        }
    }
    free(a.v);
    if (sr.cut) {
        /* What was counted is printed; the status says it is partial. */
        char w[sizeof sr.why * 4 + 1];
        kc_tool_err("remote stats: the scan of %d server%s was cut short (%s): the counts are "
                    "partial",
                    sr.cut, sr.cut == 1 ? "" : "s", kc_tool_printable(sr.why, w, sizeof w));
        return KC_EXIT_RUNTIME;
    }
    return kc_tool_flush(stdout) == 0 ? 0 : KC_EXIT_RUNTIME;
}

static int prune_cb(const char *ns, const kc_key *key, uint64_t bytes, void *arg)
{
    struct rstat_acc *a = arg;
    kc_tool_progress(++a->scanned, 0, &a->progress);
    if (a->by_build ? key->build != a->build : strcmp(ns, a->ns) != 0)
        return 0;
    if (a->n_drop == a->cap_drop) {
        size_t cap = a->cap_drop ? 2 * a->cap_drop : 256;
        struct push_item_min *v = realloc(a->drop, cap * sizeof *v);
        if (v == NULL)
            return -ENOMEM;
        a->drop = v;
        a->cap_drop = cap;
    }
    struct push_item_min *d = &a->drop[a->n_drop++];
    snprintf(d->ns, sizeof d->ns, "%s", ns);
    d->key = *key;
    d->bytes = bytes;
    return 0;
}

/* `kcache remote prune --build ID | --namespace NS`: deletes the remote's
 * entries of one kcache build (after an upgrade) or one namespace. Needs a
 * node that writes (a signing key). */
static int cmd_remote_prune(struct ctx *c, const char *ns, const char *build_s, bool manifests)
{
    if ((ns != NULL) + (build_s != NULL) + manifests != 1)
        return kc_tool_usage_error(
            "remote prune needs --build ID, --namespace NS or --manifests (one)");
    struct rstat_acc a = {.ns = ns, .by_build = ns == NULL};
    if (build_s != NULL) {
        char *end;
        errno = 0;
        a.build = strtoull(build_s, &end, 16);
        if (errno != 0 || *end != '\0' || end == build_s || strlen(build_s) > 16)
            return kc_tool_usage_error("--build needs a build id: up to 16 hex digits, as "
                                       "`kcache remote stats` prints it");
        /* Build 0 holds every build's manifests: removing them makes every
         * node compile every kernel again. Only when asked for by name. */
        if (a.build == 0)
            return kc_tool_usage_error(
                "build 0000000000000000 is no build: the remote keeps every build's manifests "
                "under it, and without them every node compiles each kernel again; to remove "
                "them anyway, use --manifests");
    }
    struct kc_remote *r = tool_remote(c);
    if (r == NULL)
        return KC_EXIT_RUNTIME;
    /* Two stages: the scan (its total unknown: every key is read), then
     * the deletes, of what it found. */
    kc_tool_progress_begin(&a.progress, "remote prune", false, kc_tool_progress_wanted(c->quiet));
    kc_tool_progress_stage("scan", &a.progress);
    struct kc_remote_scan_report sr;
    int rc = kc_remote_scan(r, prune_cb, &a, &sr);
    if (rc == 0 && a.scanned > 0)
        kc_tool_progress(a.scanned, a.scanned, &a.progress);
    kc_tool_progress_stage("delete", &a.progress);
    uint64_t dropped = 0, bytes = 0;
    for (size_t i = 0; rc == 0 && i < a.n_drop; i++) {
        rc = kc_remote_purge(r, a.drop[i].ns, &a.drop[i].key);
        if (rc == 0) {
            dropped++;
            bytes += a.drop[i].bytes;
        }
        kc_tool_progress(i + 1, a.n_drop, &a.progress);
    }
    kc_tool_progress_end(&a.progress);
    kc_remote_close(r);
    free(a.drop);
    char b1[32];
    printf("pruned %" PRIu64 " entries (%s)\n", dropped, kc_tool_human_size(bytes, b1, sizeof b1));
    if (rc != 0) {
        kc_tool_err("remote prune: %s%s", strerror(-rc),
                    rc == -EROFS ? " (pruning needs a node that writes: "
                                   "KCACHE_REMOTE_SIGNING_KEY, not read-only)"
                                 : "");
        return KC_EXIT_RUNTIME;
    }
    if (sr.cut) {
        char w[sizeof sr.why * 4 + 1];
        kc_tool_err("remote prune: the scan of %d server%s was cut short (%s): entries it did "
                    "not reach are left",
                    sr.cut, sr.cut == 1 ? "" : "s", kc_tool_printable(sr.why, w, sizeof w));
        return KC_EXIT_RUNTIME;
    }
    return kc_tool_flush(stdout) == 0 ? 0 : KC_EXIT_RUNTIME;
}

/* ---- push -------------------------------------------------------------- */

struct push_item {
    char ns[128];
    kc_key key;
    uint32_t kind;
};

struct push_list {
    struct push_item *v;
    size_t n, cap;
};

static int push_cb(const struct kc_entry *e, void *arg)
{
    struct push_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        struct push_item *v = realloc(l->v, cap * sizeof *v);
        if (v == NULL)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    struct push_item *it = &l->v[l->n++];
    snprintf(it->ns, sizeof it->ns, "%s", e->ns);
    it->key = e->key;
    it->kind = e->info.kind;
    return 0;
}

/* Opens the remote of KCACHE_REMOTE for the tool; NULL after an error
 * line. */
static struct kc_remote *tool_remote(struct ctx *c)
{
    struct kc_remote_settings rs;
    struct kc_remote_config cfg;
    char why[400];
    kc_remote_settings_from_config(&c->cfg, &rs);
    int rc = kc_remote_config_parse(&rs, &cfg, why, sizeof why);
    for (int i = 0; i < cfg.n_warnings; i++)
        kc_log(KC_LOG_WARN, "%s", cfg.warnings[i]);
    if (rc != 0 || cfg.mode == KC_REMOTE_NONE) {
        kc_tool_err("%s", rc != 0 ? why
                                  : "KCACHE_REMOTE is not set (set it to the Redis URL, like "
                                    "redis://HOST:6379)");
        kc_remote_config_free(&cfg);
        return NULL;
    }
    struct kc_remote *r = NULL;
    rc = kc_remote_open(&cfg, NULL, &r);
    kc_remote_config_free(&cfg);
    if (rc != 0)
        kc_tool_err("remote: %s", strerror(-rc));
    return rc == 0 ? r : NULL;
}

/* `kcache push`: uploads this store's entries (of one namespace, or all)
 * to the remote, entries before manifests: the backfill of what was
 * compiled before the remote was configured, or while it was down. Only
 * what this node compiled (KC_PROV_LOCAL) is uploaded, signed with its
 * key; a valid value the remote holds is never replaced (kc_remote_put). */
static int cmd_push(struct ctx *c, const char *ns)
{
    struct kc_remote *r = tool_remote(c);
    if (r == NULL)
        return KC_EXIT_RUNTIME;
    struct kc_store *st = NULL;
    int o = open_store(c, true, &st);
    if (o < 0 || (st != NULL && !need(c, (const void *)c->adm->foreach, "foreach"))) {
        if (st != NULL)
            c->api->ops->close(st);
        kc_remote_close(r);
        return KC_EXIT_RUNTIME;
    }
    struct push_list l = {0};
    int rc = st != NULL ? c->adm->foreach (st, ns, push_cb, &l) : 0;
    if (rc != 0) {
        c->api->ops->close(st);
        kc_remote_close(r);
        free(l.v);
        return walk_error(c, rc);
    }
    uint64_t pushed = 0, bytes = 0, large = 0, failed = 0, gone = 0, present = 0;
    uint64_t not_ours[KC_PROV_MAX + 1] = {0};
    int stop = 0;
    /* Every entry counts once, whatever became of it. */
    struct kc_tool_progress pg;
    kc_tool_progress_begin(&pg, "push", false, kc_tool_progress_wanted(c->quiet));
    uint64_t done = 0;
    for (int pass = 0; pass < 2 && stop == 0; pass++) {
        for (size_t i = 0; i < l.n && stop == 0; i++) {
            if ((l.v[i].kind == KC_KIND_MANIFEST) != (pass == 1))
                continue;
            kc_tool_progress(++done, l.n, &pg);
            void *body = NULL;
            size_t len = 0;
            struct kc_record_info info;
            if (c->api->ops->get(st, l.v[i].ns, &l.v[i].key, &body, &len, &info) != 0) {
                gone++; /* evicted or purged meanwhile */
                continue;
            }
            /* This node signs only what it compiled: what the remote
             * served, a bundle brought, or what was stored before kcache
             * recorded provenance is not uploaded under its key. */
            if (KC_PROV_CODE(info.prov) != KC_PROV_LOCAL) {
                not_ours[KC_PROV_CODE(info.prov) <= KC_PROV_MAX ? KC_PROV_CODE(info.prov) : 0]++;
                free(body);
                continue;
            }
            int p = kc_remote_put_flags(r, l.v[i].ns, &l.v[i].key, NULL, info.kind, body, len,
                                        info.saved_ns, KC_REMOTE_PUT_KEEP);
            free(body);
            if (p == 0) {
                pushed++;
                bytes += len;
            } else if (p == -EEXIST) {
                present++;
            } else if (p == -EFBIG) {
                large++;
            } else if (p == -EROFS || p == -ENOSPC || !kc_remote_usable(r)) {
                stop = p;
            } else {
                failed++;
            }
        }
    }
    kc_tool_progress_end(&pg);
    c->api->ops->close(st);
    free(l.v);
    /* The uploads count in this store's statistics, as the owner's do. */
    struct kc_remote_counters ctr = {0};
    kc_remote_counters(r, &ctr);
    kc_remote_close(r);
    struct kc_counters packed[KC_REMOTE_STAT_BACKENDS];
    kc_remote_counters_pack(&ctr, packed);
    if (open_store(c, false, &st) > 0 && st != NULL) {
        for (int i = 0; i < KC_REMOTE_STAT_BACKENDS; i++)
            if (memcmp(&packed[i], &(struct kc_counters){0}, sizeof packed[i]) != 0)
                c->api->ops->count(st, kc_remote_stat_backend(i), &packed[i]);
        c->api->ops->close(st);
    }
    char b[32];
    printf("pushed %" PRIu64 " entries (%s)", pushed, kc_tool_human_size(bytes, b, sizeof b));
    if (present > 0)
        printf("; %" PRIu64 " already there (valid values are never replaced)", present);
    if (large > 0)
        printf("; %" PRIu64 " kept local (larger than KCACHE_REMOTE_MAX_ENTRY)", large);
    if (not_ours[KC_PROV_SIGNED] + not_ours[KC_PROV_UNSIGNED] > 0)
        printf("; %" PRIu64 " not compiled here (served by the remote)",
               not_ours[KC_PROV_SIGNED] + not_ours[KC_PROV_UNSIGNED]);
    if (not_ours[KC_PROV_IMPORTED] > 0)
        printf("; %" PRIu64 " not compiled here (imported)", not_ours[KC_PROV_IMPORTED]);
    if (not_ours[KC_PROV_UNKNOWN] > 0)
        printf("; %" PRIu64 " of unknown provenance (stored before kcache recorded it)",
               not_ours[KC_PROV_UNKNOWN]);
    if (gone > 0)
        printf("; %" PRIu64 " gone meanwhile", gone);
    if (failed > 0)
        printf("; %" PRIu64 " failed", failed);
    printf("\n");
    if (stop != 0) {
        kc_tool_err("push stopped: %s",
                    stop == -EROFS    ? "this node does not write to the remote (no usable "
                                        "KCACHE_REMOTE_SIGNING_KEY, or read-only)"
                    : stop == -ENOSPC ? "the remote is full (maxmemory)"
                                      : "the remote failed; see the warning above");
        return KC_EXIT_RUNTIME;
    }
    if (kc_tool_flush(stdout) != 0)
        return KC_EXIT_RUNTIME;
    return failed == 0 ? 0 : KC_EXIT_RUNTIME;
}

/* The owner outlives whoever started it: it keeps none of the starter's
 * files but 0-2 (an inherited pipe would keep the starter's reader waiting
 * for the owner's idle exit) and leaves its working directory for /; the
 * cache directory is absolute by then (set_dir, kc_config_load), unless
 * getcwd failed, and then the working directory is kept. */
static void owner_detach(struct ctx *c)
{
    /* close_range through syscall(): glibc < 2.34 has no wrapper. */
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0) {
        long max = sysconf(_SC_OPEN_MAX);
        for (long fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
            close((int)fd);
    }
    if (c->dir[0] == '/' && chdir("/") != 0)
        kc_log(KC_LOG_DEBUG, "owner: chdir(\"/\"): %s", strerror(errno));
}

static int cmd_owner(struct ctx *c, int idle_ms)
{
    owner_detach(c);
    if (!need(c, (const void *)c->adm->owner_run, "owner_run"))
        return KC_EXIT_RUNTIME;
    struct kc_store_options o;
    fill_options(c, &o, false);
    int rc = c->adm->owner_run(&o, idle_ms);
    if (rc == -EBUSY) {
        kc_log(KC_LOG_INFO, "another owner holds %s; nothing to do", c->dir);
        return 0;
    }
    if (rc < 0) {
        kc_tool_err("owner of %s failed: %s", c->dir, open_error(rc));
        return KC_EXIT_RUNTIME;
    }
    return 0;
}

/* ---- arguments --------------------------------------------------------- */

/* Makes `d` absolute (against the working directory) into c->dir. */
static int set_dir(struct ctx *c, const char *d)
{
    if (d[0] == '\0')
        return kc_tool_usage_error("--dir needs a non-empty directory");
    if (d[0] == '/') {
        if (strlen(d) >= sizeof c->dir - 64)
            return kc_tool_usage_error("--dir is too long");
        snprintf(c->dir, sizeof c->dir, "%s", d);
        return 0;
    }
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == NULL) {
        kc_tool_err("cannot resolve %s: %s", d, strerror(errno));
        return KC_EXIT_RUNTIME;
    }
    if (strlen(cwd) + strlen(d) + 2 >= sizeof c->dir - 64)
        return kc_tool_usage_error("--dir is too long");
    size_t a = strlen(cwd), b = strlen(d);
    memcpy(c->dir, cwd, a);
    c->dir[a] = '/';
    memcpy(c->dir + a + 1, d, b + 1);
    return 0;
}

/* Matches "--name VALUE" and "--name=VALUE"; advances *i past VALUE. */
static int opt_value(int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *val = argv[++*i];
    return 1;
}

static const char *const commands[] = {"stats",  "ls",    "show", "verify", "gc",     "clear",
                                       "config", "owner", "help", "keygen", "remote", "push"};

/* The command named in argv, for a --help before it is parsed. */
static const char *command_in(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dir") == 0) {
            i++;
            continue;
        }
        if (argv[i][0] != '-')
            return argv[i];
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static struct ctx c;
    /* Everything the tool makes (the owner's database files above all,
     * which RocksDB creates with the umask's mode) is private: 0600/0700. */
    umask(077);
    kc_config_load(&c.cfg);
    kc__log_set_level(c.cfg.log_level);
    snprintf(c.dir, sizeof c.dir, "%s", c.cfg.dir);

    const char *cmd = NULL;
    const char *pos[4] = {NULL};
    int npos = 0;
    bool json = false, markdown = false, manifests = false;
    const char *ns = NULL, *max_size_s = NULL, *idle_s = NULL, *build_s = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        int r;
        if ((r = opt_value(argc, argv, &i, "--dir", &val)) != 0) {
            if (r < 0)
                return kc_tool_usage_error("--dir needs a directory");
            int rc = set_dir(&c, val);
            if (rc != 0)
                return rc;
            c.dir_from_cli = true;
            continue;
        }
        if (cmd == NULL && kc_tool_bundle_command(a)) {
            kc_tool_set_command(a);
            struct kc_tool_ctx t = {.dir = c.dir, .cfg = &c.cfg};
            kc__log_set_level(c.cfg.log_level);
            for (int w = 0; w < c.cfg.n_warnings; w++)
                kc_log(KC_LOG_WARN, "%s", c.cfg.warnings[w]);
            return kc_tool_bundle(&t, argc - i, argv + i);
        }
        if (cmd == NULL && strcmp(a, "why") == 0) {
            for (int w = 0; w < c.cfg.n_warnings; w++)
                kc_log(KC_LOG_WARN, "%s", c.cfg.warnings[w]);
            struct why_store ws = {.c = &c};
            int wrc = kc_tool_why(c.dir, argc - i, argv + i, why_in_store, &ws);
            free(ws.keys);
            return wrc;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            /* `kcache CMD --help`: that command's; else the overview. */
            const char *topic = cmd != NULL ? cmd : command_in(argc, argv);
            if (topic == NULL || kc_tool_help(stdout, topic) != 0)
                kc_tool_help_all(stdout);
            return kc_tool_flush(stdout) != 0 ? KC_EXIT_RUNTIME : 0;
        }
        if ((strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) && cmd == NULL) {
            char path[2 * PATH_MAX + 32];
            uint64_t b = tool_self_build(path, sizeof path);
            printf("kcache %s (store ABI %d, record format %d, build ", KC_VERSION, KC_STORE_ABI,
                   KC_FORMAT_VERSION);
            printf(b != 0 ? "%016" PRIx64 ")\n" : "unknown)\n", b);
            return 0;
        }
        if (cmd != NULL && (strcmp(cmd, "stats") == 0 || strcmp(cmd, "remote") == 0) &&
            strcmp(a, "--json") == 0) {
            json = true;
            continue;
        }
        if (cmd != NULL &&
            (strcmp(cmd, "verify") == 0 || strcmp(cmd, "gc") == 0 || strcmp(cmd, "push") == 0 ||
             strcmp(cmd, "remote") == 0) &&
            strcmp(a, "--quiet") == 0) {
            c.quiet = true;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "config") == 0 && strcmp(a, "--markdown") == 0) {
            markdown = true;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "stats") == 0 && strcmp(a, "--openmetrics") == 0) {
            stats_openmetrics = true;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "remote") == 0 && strcmp(a, "--manifests") == 0) {
            manifests = true;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "remote") == 0 &&
            (r = opt_value(argc, argv, &i, "--build", &val)) != 0) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("--build needs a build id");
            build_s = val;
            continue;
        }
        if (cmd != NULL &&
            (strcmp(cmd, "ls") == 0 || strcmp(cmd, "push") == 0 || strcmp(cmd, "remote") == 0) &&
            (r = opt_value(argc, argv, &i, "--namespace", &val)) != 0) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("--namespace needs a namespace");
            ns = val;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "gc") == 0 &&
            (r = opt_value(argc, argv, &i, "--max-size", &val)) != 0) {
            if (r < 0)
                return kc_tool_usage_error("--max-size needs a size");
            max_size_s = val;
            continue;
        }
        if (cmd != NULL && strcmp(cmd, "owner") == 0 &&
            (r = opt_value(argc, argv, &i, "--idle-ms", &val)) != 0) {
            if (r < 0)
                return kc_tool_usage_error("--idle-ms needs a number of milliseconds");
            idle_s = val;
            continue;
        }
        if (a[0] == '-' && a[1] != '\0') {
            if (cmd == NULL)
                return kc_tool_usage_error("unknown option '%s'", a);
            return kc_tool_usage_error("unknown option '%s' for '%s'", a, cmd);
        }
        if (cmd == NULL) {
            bool known = false;
            for (size_t k = 0; k < sizeof commands / sizeof *commands; k++)
                known = known || strcmp(a, commands[k]) == 0;
            if (!known)
                return kc_tool_usage_error("unknown command '%s'", a);
            cmd = a;
            kc_tool_set_command(cmd);
            continue;
        }
        if (npos >= 1 || (strcmp(cmd, "show") != 0 && strcmp(cmd, "keygen") != 0 &&
                          strcmp(cmd, "remote") != 0 && strcmp(cmd, "help") != 0))
            return kc_tool_usage_error("unexpected argument '%s' for '%s'", a, cmd);
        pos[npos++] = a;
    }

    if (cmd == NULL)
        return kc_tool_usage_error("no command given");
    c.prog_cmd = cmd;
    if (strcmp(cmd, "help") == 0) {
        if (kc_tool_help(stdout, pos[0]) != 0) {
            kc_tool_set_command(NULL);
            return kc_tool_usage_error("no help on '%s': the topics are %s", pos[0],
                                       kc_tool_help_topics());
        }
        return kc_tool_flush(stdout) != 0 ? KC_EXIT_RUNTIME : 0;
    }

    /* The tool's own configuration warnings; `config` prints them itself. */
    if (strcmp(cmd, "config") != 0 && strcmp(cmd, "owner") != 0)
        for (int i = 0; i < c.cfg.n_warnings; i++)
            kc_log(KC_LOG_WARN, "%s", c.cfg.warnings[i]);

    if (strcmp(cmd, "config") == 0)
        return cmd_config(&c, markdown);
    if (strcmp(cmd, "keygen") == 0) {
        if (npos != 1)
            return kc_tool_usage_error("keygen needs a PATH");
        return cmd_keygen(pos[0]);
    }
    if (strcmp(cmd, "remote") == 0) {
        if (npos == 1 && strcmp(pos[0], "ping") == 0)
            return cmd_remote_ping(&c);
        if (npos == 1 && strcmp(pos[0], "stats") == 0)
            return cmd_remote_stats(&c, json);
        if (npos == 1 && strcmp(pos[0], "prune") == 0)
            return cmd_remote_prune(&c, ns, build_s, manifests);
        return kc_tool_usage_error("remote needs a subcommand: ping, stats or prune");
    }
    if (c.dir[0] == '\0') {
        kc_tool_err("no cache directory (no home directory); set KCACHE_DIR or use --dir");
        return KC_EXIT_RUNTIME;
    }

    c.api = kc_store_api();
    c.adm = kc_store_admin();
    if (c.api == NULL || c.api->abi != KC_STORE_ABI || c.api->ops == NULL || c.adm == NULL ||
        c.adm->abi != KC_STORE_ABI) {
        kc_tool_err("the store library has ABI %d, this tool needs %d: they are from different "
                    "builds; reinstall kcache",
                    c.api != NULL ? c.api->abi : -1, KC_STORE_ABI);
        return KC_EXIT_RUNTIME;
    }

    if (strcmp(cmd, "stats") == 0)
        return cmd_stats(&c, json);
    if (strcmp(cmd, "push") == 0)
        return cmd_push(&c, ns);
    if (strcmp(cmd, "ls") == 0)
        return cmd_ls(&c, ns);
    if (strcmp(cmd, "show") == 0) {
        if (npos != 1)
            return kc_tool_usage_error("show needs a KEY");
        return cmd_show(&c, pos[0]);
    }
    if (strcmp(cmd, "verify") == 0)
        return cmd_verify(&c);
    if (strcmp(cmd, "gc") == 0) {
        uint64_t max_size = 0;
        if (max_size_s != NULL && kc_parse_size(max_size_s, &max_size) != 0)
            return kc_tool_usage_error("--max-size: '%s' is not a size (like 512M or 5G)",
                                       max_size_s);
        return cmd_gc(&c, max_size);
    }
    if (strcmp(cmd, "clear") == 0)
        return cmd_clear(&c);
    if (strcmp(cmd, "owner") == 0) {
        long idle_ms = 5000;
        const char *env_idle = kc_config_get(KC_VAR_OWNER_IDLE_MS);
        if (idle_s == NULL && env_idle != NULL && env_idle[0] != '\0')
            idle_s = env_idle;
        if (idle_s != NULL) {
            char *end;
            errno = 0;
            idle_ms = strtol(idle_s, &end, 10);
            if (end == idle_s || *end != '\0' || errno != 0 || idle_ms < 0 || idle_ms > 86400000)
                return kc_tool_usage_error("--idle-ms: '%s' is not a number of milliseconds",
                                           idle_s);
        }
        return cmd_owner(&c, (int)idle_ms);
    }
    return kc_tool_usage_error("unknown command '%s'", cmd);
}
