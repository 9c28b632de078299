/*
 * bundle.c: the tool's bundle commands (kcache export, kcache import,
 * kcache bundle show) over the store's bundle operations (store.h), with
 * the signatures' cryptography from store/remote (Ed25519 keys, libsodium
 * by dlopen) and this machine's namespaces from usable.c.
 */
#include "bundle.h"
#include "cli.h"
#include "help.h"
#include "progress.h"

#include "../common/clock.h"
#include "../common/config.h"
#include "../common/log.h"
#include "../store/remote/remote_internal.h"
#include "../store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_WAIT_MS 15000
/* How long import and bundle show wait for a FIFO's writer. */
#define FIFO_WAIT_MS 5000
#define MAX_GLOBS 64

static const char *utc(uint64_t ns, char *buf, size_t len)
{
    time_t t = (time_t)(ns / 1000000000u);
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "%" PRIu64, ns);
    return buf;
}

/* Parses a duration: a number with an optional s, m, h, d or w suffix
 * (seconds when none). 0 with *ns, or -1. */
static int parse_duration(const char *s, uint64_t *ns)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno != 0 || s[0] == '-')
        return -1;
    uint64_t mul = 1;
    if (*end != '\0') {
        switch (*end) {
        case 's':
            mul = 1;
            break;
        case 'm':
            mul = 60;
            break;
        case 'h':
            mul = 3600;
            break;
        case 'd':
            mul = 86400;
            break;
        case 'w':
            mul = 7 * 86400;
            break;
        default:
            return -1;
        }
        if (end[1] != '\0')
            return -1;
    }
    if (v > UINT64_MAX / mul / 1000000000u)
        return -1;
    *ns = (uint64_t)v * mul * 1000000000u;
    return 0;
}

/* ---- signatures: store/remote's keys and libsodium ---------------------- */

struct crypto {
    struct kc_bundle_crypto c;
    const struct kc__sodium *na;
    struct kc__keys keys;
    void *state; /* BLAKE2b, 64-byte aligned */
};

static void c_begin(void *ctx)
{
    struct crypto *k = ctx;
    k->na->generichash_init(k->state, NULL, 0, 32);
}

static void c_add(void *ctx, const void *p, size_t n)
{
    struct crypto *k = ctx;
    k->na->generichash_update(k->state, p, n);
}

static void c_end(void *ctx, unsigned char out[32])
{
    struct crypto *k = ctx;
    k->na->generichash_final(k->state, out, 32);
}

static int c_sign(void *ctx, const void *msg, size_t n, unsigned char sig[64])
{
    struct crypto *k = ctx;
    unsigned long long sl = 0;
    if (!k->keys.have_secret || k->na->sign_detached(sig, &sl, msg, n, k->keys.sk) != 0 || sl != 64)
        return -EIO;
    return 0;
}

static int c_trusted(void *ctx, uint64_t id)
{
    struct crypto *k = ctx;
    return kc__keys_find(&k->keys, id) != NULL;
}

static int c_verify(void *ctx, uint64_t id, const void *msg, size_t n, const unsigned char sig[64])
{
    struct crypto *k = ctx;
    const struct kc__pubkey *pk = kc__keys_find(&k->keys, id);
    if (pk == NULL)
        return -ENOKEY;
    return k->na->verify_detached(sig, msg, n, pk->pk) == 0 ? 0 : -EKEYREJECTED;
}

/* Loads libsodium and the keys: the secret key `sign` (export; NULL: none)
 * and the trusted keys file (import). 0; 1 when libsodium is missing (no
 * crypto: bundles are unsigned, signatures cannot be checked); or -1
 * after an error line. */
static int crypto_open(struct crypto *k, const char *sign, const char *trusted)
{
    memset(k, 0, sizeof *k);
    if (kc__sodium_load(&k->na) != 0)
        return 1;
    if (k->na->generichash_statebytes == NULL || k->na->generichash_init == NULL ||
        k->na->generichash_update == NULL || k->na->generichash_final == NULL)
        return 1;
    size_t sb = (k->na->generichash_statebytes() + 63) & ~(size_t)63;
    k->state = aligned_alloc(64, sb);
    if (k->state == NULL) {
        kc_tool_err("out of memory");
        return -1;
    }
    if (sign != NULL && sign[0] != '\0') {
        int rc = kc__keys_load_secret(k->na, sign, &k->keys);
        if (rc != 0) {
            kc_tool_err("signing key %s: %s", sign,
                        rc == -EPERM     ? "must be a regular file of this user, mode 0600"
                        : rc == -EBADMSG ? "not a kcache secret key (kcache keygen makes one)"
                                         : strerror(-rc));
            return -1;
        }
    }
    if (trusted != NULL && trusted[0] != '\0') {
        int rc = kc__keys_load_trusted(k->na, trusted, &k->keys);
        if (rc != 0) {
            kc_tool_err("trusted keys %s: %s", trusted,
                        rc == -EPERM
                            ? "must not be writable by others, and be this user's or root's"
                            : strerror(-rc));
            return -1;
        }
    }
    k->c.ctx = k;
    k->c.key_id = k->keys.have_secret ? k->keys.self.id : 0;
    k->c.digest_begin = c_begin;
    k->c.digest_add = c_add;
    k->c.digest_end = c_end;
    k->c.sign = c_sign;
    k->c.trusted = c_trusted;
    k->c.verify = c_verify;
    return 0;
}

static void crypto_close(struct crypto *k)
{
    if (k->na != NULL)
        kc__keys_free(k->na, &k->keys);
    free(k->state);
    memset(k, 0, sizeof *k);
}

/* ---- the store ------------------------------------------------------------ */

static int open_store(const struct kc_store_api *api, const char *dir, uint64_t max_size,
                      bool readonly, struct kc_store **st)
{
    struct kc_store_options o = {.dir = dir, .readonly = readonly, .max_size = max_size};
    int rc = api->open(&o, st);
    if (rc < 0 || *st == NULL) {
        kc_tool_err("cannot use cache directory %s: %s", dir,
                    rc == -EPERM
                        ? "it, or a directory or link on the way to it, is owned by another "
                          "user or writable by others (make it yours, mode 0700, or use --dir)"
                        : strerror(rc < 0 ? -rc : EIO));
        *st = NULL;
        return -1;
    }
    return 0;
}

static bool api_ok(const struct kc_store_api *api)
{
    const struct kc_store_admin *adm = kc_store_admin();
    if (api == NULL || api->abi != KC_STORE_ABI || adm == NULL || adm->abi != KC_STORE_ABI ||
        adm->bundle_export == NULL || adm->bundle_import == NULL) {
        kc_tool_err("the store library does not provide bundles: the tool and "
                    "libkcache-store.so are from different builds; reinstall kcache");
        return false;
    }
    return true;
}

/* ---- kcache export ------------------------------------------------------------ */

/* Where a bundle goes. A regular file (or a new one) is replaced whole: the
 * bundle is written to a temp file beside it and renamed over it once
 * complete. Anything else a path may name is not replaced: a FIFO or a
 * character device (another program's pipe, /dev/null, a tape) is written
 * in place, and a directory, a socket or a block device is refused. A
 * symbolic link is followed: what it names gets these rules, and the link
 * stays. */
struct out_file {
    int fd;
    const char *path;        /* as given */
    char dst[PATH_MAX];      /* the file replaced (empty: written in place) */
    char tmp[PATH_MAX + 32]; /* its temp file */
};

static int out_open(const char *out, struct out_file *of)
{
    memset(of, 0, sizeof *of);
    of->path = out;
    of->fd = -1;
    if (strcmp(out, "-") == 0) {
        of->fd = STDOUT_FILENO;
        return 0;
    }
    const char *target = out;
    struct stat sb;
    bool exists = lstat(out, &sb) == 0;
    if (!exists && errno != ENOENT) {
        kc_tool_err("cannot write %s: %s", out, strerror(errno));
        return -1;
    }
    if (exists && S_ISLNK(sb.st_mode)) {
        /* What it names; a link to nothing is refused (what would be
         * made there is not the user's to guess). */
        if (realpath(out, of->dst) != NULL) {
            target = of->dst;
            exists = lstat(target, &sb) == 0;
        } else {
            kc_tool_err("cannot write %s: a symbolic link to %s", out,
                        errno == ENOENT ? "nothing" : strerror(errno));
            return -1;
        }
    }
    if (exists && (S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode))) {
        of->dst[0] = '\0';
        of->fd = open(target, O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NOFOLLOW);
        struct stat fb;
        if (of->fd >= 0 && (fstat(of->fd, &fb) != 0 || fb.st_dev != sb.st_dev ||
                            fb.st_ino != sb.st_ino || isatty(of->fd))) {
            bool tty = isatty(of->fd);
            close(of->fd);
            of->fd = -1;
            kc_tool_err("cannot write %s: %s", out,
                        tty ? "not writing a bundle to a terminal" : "it changed meanwhile");
            return -1;
        }
        if (of->fd < 0) {
            kc_tool_err("cannot write %s: %s", out, strerror(errno));
            return -1;
        }
        return 0;
    }
    if (exists && !S_ISREG(sb.st_mode)) {
        kc_tool_err("cannot write %s: %s", out,
                    S_ISDIR(sb.st_mode) ? "it is a directory"
                                        : "not a regular file, a FIFO or a character device "
                                          "(not replaced)");
        return -1;
    }
    if (target != of->dst)
        snprintf(of->dst, sizeof of->dst, "%s", out);
    if (snprintf(of->tmp, sizeof of->tmp, "%s.tmp-XXXXXX", of->dst) >= (int)sizeof of->tmp) {
        kc_tool_err("cannot write %s: the path is too long", out);
        return -1;
    }
    /* mkostemp's 0600: a bundle holds the store's entries, as private as
     * the store until its owner shares it. */
    of->fd = mkostemp(of->tmp, O_CLOEXEC);
    if (of->fd < 0) {
        kc_tool_err("cannot write %s: %s", out, strerror(errno));
        return -1;
    }
    return 0;
}

/* Ends the output after an export that returned rc: a replaced file is
 * renamed into place when all went well (not fsynced, as tar and cp do
 * not: the rename shows it whole to every process, and one an OS crash
 * tore is refused whole by import: its trailer), its temp file removed
 * otherwise. Every error closing or renaming is the export's. */
static int out_close(struct out_file *of, int rc, struct kc_bundle_info *info)
{
    if (of->fd == STDOUT_FILENO)
        return rc;
    if (close(of->fd) != 0 && rc == 0) {
        rc = -errno;
        snprintf(info->why, sizeof info->why, "cannot write %s: %s", of->path, strerror(errno));
    }
    if (of->tmp[0] != '\0') {
        if (rc == 0 && rename(of->tmp, of->dst) != 0) {
            rc = -errno;
            snprintf(info->why, sizeof info->why, "cannot write %s: %s", of->path, strerror(errno));
        }
        if (rc < 0)
            unlink(of->tmp);
    }
    return rc;
}

static int cmd_export(const struct kc_tool_ctx *t, const char *out, const char *const *globs,
                      size_t n_globs, uint64_t since, uint64_t max_size, const char *sign,
                      int codec, int level, bool quiet)
{
    const struct kc_store_api *api = kc_store_api();
    if (!api_ok(api))
        return KC_EXIT_RUNTIME;
    bool to_stdout = strcmp(out, "-") == 0;
    /* A reader that goes away is a write error (EPIPE), reported. */
    signal(SIGPIPE, SIG_IGN);
    if (to_stdout && isatty(STDOUT_FILENO)) {
        kc_tool_err("not writing a bundle to a terminal; use -o FILE or a pipe");
        return KC_EXIT_RUNTIME;
    }
    struct crypto k;
    const char *key = sign != NULL ? sign : t->cfg->remote_signing_key;
    int cr = crypto_open(&k, key, NULL);
    if (cr < 0)
        return KC_EXIT_RUNTIME;
    if (cr == 1 && key != NULL && key[0] != '\0') {
        kc_tool_err("cannot sign the bundle with %s: libsodium is not installed (install "
                    "libsodium23, or use the kcache tarball or wheel, which carry it)",
                    key);
        return KC_EXIT_RUNTIME;
    }
    struct stat sb;
    if (stat(t->dir, &sb) != 0) {
        int e = errno; /* before crypto_close, which may change it */
        crypto_close(&k);
        if (e != ENOENT) {
            kc_tool_err("cannot use cache directory %s: %s", t->dir, strerror(e));
            return KC_EXIT_RUNTIME;
        }
        kc_tool_err("no store in %s: nothing to export (run a program under kcache-run first, "
                    "or name another store with --dir)",
                    t->dir);
        return KC_EXIT_RUNTIME;
    }
    struct kc_store *st;
    if (open_store(api, t->dir, t->cfg->max_size, t->cfg->readonly, &st) < 0) {
        crypto_close(&k);
        return KC_EXIT_RUNTIME;
    }
    /* What the spool holds goes in too: drained first. */
    if (!t->cfg->readonly && kc_store_admin()->drain != NULL) {
        int rc = kc_store_admin()->drain(st, DRAIN_WAIT_MS);
        if (rc < 0)
            kc_log(KC_LOG_WARN,
                   "export: the spool was not drained (%s); its newest entries are "
                   "left out",
                   strerror(-rc));
    }
    struct out_file of;
    if (out_open(out, &of) < 0) {
        api->ops->close(st);
        crypto_close(&k);
        return KC_EXIT_RUNTIME;
    }
    int fd = of.fd;
    struct kc_tool_progress pg;
    kc_tool_progress_begin(&pg, "export", false, kc_tool_progress_wanted(quiet));
    struct kc_bundle_export_opts o = {
        .fd = fd,
        .globs = globs,
        .n_globs = n_globs,
        .since_ns = since,
        .max_size = max_size,
        .codec = codec,
        .level = level,
        .crypto = k.c.key_id != 0 ? &k.c : NULL,
        .progress_stage = pg.on ? kc_tool_progress_stage : NULL,
        .progress = pg.on ? kc_tool_progress : NULL,
        .progress_arg = &pg,
    };
    struct kc_bundle_info info;
    int rc = kc_store_admin()->bundle_export(st, &o, &info);
    kc_tool_progress_end(&pg);
    api->ops->close(st);
    crypto_close(&k);
    rc = out_close(&of, rc, &info);
    if (rc < 0) {
        kc_tool_err("export failed: %s", info.why);
        free(info.ns);
        return KC_EXIT_RUNTIME;
    }
    FILE *f = to_stdout ? stderr : stdout;
    char b1[32], b2[32];
    fprintf(f, "exported %" PRIu64 " entries of %zu namespace%s to %s: %s (%s uncompressed), %s\n",
            info.entries, info.n_ns, info.n_ns == 1 ? "" : "s", to_stdout ? "standard output" : out,
            kc_tool_human_size(info.file_bytes, b1, sizeof b1),
            kc_tool_human_size(info.raw_bytes, b2, sizeof b2), info.key_id ? "signed" : "unsigned");
    if (info.key_id)
        fprintf(f, "signed by key %016" PRIx64 "\n", info.key_id);
    for (size_t i = 0; i < info.n_ns; i++) {
        char nm[KC_TOOL_PRINTABLE_MAX];
        fprintf(f, "  %s: %" PRIu64 " entries, %s\n",
                kc_tool_printable(info.ns[i].ns, nm, sizeof nm), info.ns[i].entries,
                kc_tool_human_size(info.ns[i].raw_bytes, b1, sizeof b1));
    }
    free(info.ns);
    return kc_tool_flush(f);
}

/* ---- kcache import / bundle show --------------------------------------------- */

static int usable_cb(const char *ns, void *arg)
{
    return kc_tool_ns_usable(ns);
}

static const char *usable_words(int u)
{
    return u == 1 ? "usable here" : u == 0 ? "not usable here" : "usability unknown";
}

/* Waits, at most FIFO_WAIT_MS, for the FIFO fd (opened O_NONBLOCK) to have
 * a writer: 0 once it has one (its bytes are not consumed: tee(2) peeks),
 * -1 when none came. A FIFO that cannot be peeked at is taken as it is. */
static int fifo_wait_writer(int fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
        return 0;
    int rc = -1;
    for (int waited = 0; waited <= FIFO_WAIT_MS; waited += 20) {
        ssize_t n = tee(fd, p[1], 1, SPLICE_F_NONBLOCK);
        if (n > 0 || (n < 0 && errno == EAGAIN) || (n < 0 && errno != EINTR)) {
            rc = 0; /* bytes, a writer yet to write, or no peeking */
            break;
        }
        /* 0: no writer (or one that wrote nothing and left) */
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    close(p[0]);
    close(p[1]);
    return rc;
}

static int open_bundle(const char *path, int *fd)
{
    if (strcmp(path, "-") == 0) {
        *fd = STDIN_FILENO;
        return 0;
    }
    /* Not blocking in open: a FIFO with no writer would hold it forever. */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (*fd < 0) {
        kc_tool_err("cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    if (fstat(*fd, &sb) == 0 && S_ISFIFO(sb.st_mode) && fifo_wait_writer(*fd) != 0) {
        kc_tool_err("cannot read %s: a FIFO nothing writes to (waited %d s)", path,
                    FIFO_WAIT_MS / 1000);
        close(*fd);
        return -1;
    }
    int fl = fcntl(*fd, F_GETFL);
    if (fl != -1)
        fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK);
    if (S_ISDIR(sb.st_mode)) {
        kc_tool_err("cannot read %s: %s", path, strerror(EISDIR));
        close(*fd);
        return -1;
    }
    return 0;
}

static void print_namespaces(const struct kc_bundle_info *info, bool counts)
{
    for (size_t i = 0; i < info->n_ns; i++) {
        const struct kc_bundle_ns *e = &info->ns[i];
        char d[200], b[32], nm[KC_TOOL_PRINTABLE_MAX];
        kc_tool_ns_describe(e->ns, d, sizeof d);
        printf("  %s\n    %s; %s\n    %" PRIu64 " entries, %s",
               kc_tool_printable(e->ns, nm, sizeof nm), d, usable_words(e->usable), e->entries,
               kc_tool_human_size(e->raw_bytes, b, sizeof b));
        if (counts)
            printf(": %" PRIu64 " imported, %" PRIu64 " already present, %" PRIu64 " skipped",
                   e->imported, e->present, e->skipped);
        printf("\n");
    }
}

static int cmd_import(const struct kc_tool_ctx *t, const char *path, bool trust_unsigned,
                      bool dry_run, bool only_usable, bool quiet)
{
    const struct kc_store_api *api = kc_store_api();
    if (!api_ok(api))
        return KC_EXIT_RUNTIME;
    if (t->cfg->readonly && !dry_run) {
        kc_tool_err("KCACHE_READONLY is set: nothing can be imported (unset it to import)");
        return KC_EXIT_RUNTIME;
    }
    struct crypto k;
    int cr = crypto_open(&k, t->cfg->remote_signing_key, t->cfg->remote_trusted_keys);
    if (cr < 0)
        return KC_EXIT_RUNTIME;
    int fd;
    if (open_bundle(path, &fd) < 0) {
        crypto_close(&k);
        return KC_EXIT_RUNTIME;
    }
    struct kc_store *st = NULL;
    struct stat sb;
    bool have_dir = stat(t->dir, &sb) == 0;
    if ((!dry_run || have_dir) && open_store(api, t->dir, t->cfg->max_size, dry_run, &st) < 0) {
        if (fd != STDIN_FILENO)
            close(fd);
        crypto_close(&k);
        return KC_EXIT_RUNTIME;
    }
    struct kc_tool_progress pg;
    /* In bytes of the bundle read: its bodies come first, and a pipe's
     * bytes arrive as they come (a count of entries stood still until the
     * bodies were all read). */
    kc_tool_progress_begin(&pg, "import", true, kc_tool_progress_wanted(quiet));
    struct kc_bundle_import_opts o = {
        .fd = fd,
        .trust_unsigned = trust_unsigned,
        .dry_run = dry_run,
        .only_usable = only_usable,
        .crypto = cr == 0 ? &k.c : NULL,
        .usable = usable_cb,
        .progress_stage = pg.on ? kc_tool_progress_stage : NULL,
        .progress = pg.on ? kc_tool_progress : NULL,
        .progress_arg = &pg,
    };
    struct kc_bundle_info info;
    int rc = kc_store_admin()->bundle_import(st, &o, &info);
    kc_tool_progress_end(&pg);
    if (st != NULL)
        api->ops->close(st);
    crypto_close(&k);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        kc_tool_err("import of %s refused: %s%s", path, info.why,
                    rc == -EKEYREJECTED && cr == 1 ? " (libsodium is not installed: no signature "
                                                     "can be verified)"
                                                   : "");
        free(info.ns);
        return KC_EXIT_RUNTIME;
    }
    uint64_t imported = 0, present = 0, skipped = 0;
    for (size_t i = 0; i < info.n_ns; i++) {
        imported += info.ns[i].imported;
        present += info.ns[i].present;
        skipped += info.ns[i].skipped;
    }
    char when[40];
    printf("%s %" PRIu64 " of %" PRIu64 " entries from %s into %s (%s, created %s)%s\n",
           dry_run ? "would import" : "imported", imported, info.entries, path, t->dir,
           !info.is_signed ? "unsigned"
           : info.verified ? "signature verified"
                           : "signature not verified",
           utc(info.created_ns, when, sizeof when), dry_run ? "; nothing written" : "");
    if (info.is_signed)
        printf("signed by key %016" PRIx64 "%s\n", info.key_id,
               info.verified ? ", a trusted key" : ", not verified (--trust-unsigned)");
    printf("%" PRIu64 " already present, %" PRIu64 " skipped as not usable here\n", present,
           skipped);
    print_namespaces(&info, true);
    free(info.ns);
    return kc_tool_flush(stdout);
}

static int cmd_show(const struct kc_tool_ctx *t, const char *path)
{
    const struct kc_store_api *api = kc_store_api();
    if (!api_ok(api))
        return KC_EXIT_RUNTIME;
    struct crypto k;
    int cr = crypto_open(&k, t->cfg->remote_signing_key, t->cfg->remote_trusted_keys);
    if (cr < 0)
        return KC_EXIT_RUNTIME;
    int fd;
    if (open_bundle(path, &fd) < 0) {
        crypto_close(&k);
        return KC_EXIT_RUNTIME;
    }
    struct kc_bundle_import_opts o = {
        .fd = fd,
        .header_only = 1,
        .crypto = cr == 0 ? &k.c : NULL,
    };
    struct kc_bundle_info info;
    int rc = kc_store_admin()->bundle_import(NULL, &o, &info);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        crypto_close(&k);
        kc_tool_err("%s: %s", path, info.why);
        free(info.ns);
        return KC_EXIT_RUNTIME;
    }
    for (size_t i = 0; i < info.n_ns; i++)
        info.ns[i].usable = kc_tool_ns_usable(info.ns[i].ns);
    char when[40], b1[32], b2[32];
    printf("bundle %s: layout %u, record format %u, created %s\n", path, info.version, info.format,
           utc(info.created_ns, when, sizeof when));
    printf("%" PRIu64 " entries, %s uncompressed", info.entries,
           kc_tool_human_size(info.raw_bytes, b1, sizeof b1));
    if (info.file_bytes > 0)
        printf(", %s on disk", kc_tool_human_size(info.file_bytes, b2, sizeof b2));
    if (info.trailer_seen)
        printf(", %" PRIu64 " blocks", info.blocks);
    printf("\n");
    if (info.is_signed)
        printf("signed by key %016" PRIx64 " (%s)\n", info.key_id,
               cr == 0 && c_trusted(&k, info.key_id) ? "a trusted key" : "not a trusted key here");
    else
        printf("unsigned (import needs --trust-unsigned)\n");
    if (!info.trailer_seen)
        printf("trailer: %s\n", info.file_bytes > 0 ? "missing or damaged (truncated?)"
                                                    : "not read (not a regular file)");
    printf("not verified: kcache import --dry-run checks every byte\n");
    print_namespaces(&info, false);
    crypto_close(&k);
    free(info.ns);
    return kc_tool_flush(stdout);
}

/* ---- arguments ---------------------------------------------------------------- */

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

bool kc_tool_bundle_command(const char *cmd)
{
    return strcmp(cmd, "export") == 0 || strcmp(cmd, "import") == 0 || strcmp(cmd, "bundle") == 0;
}

int kc_tool_bundle(const struct kc_tool_ctx *t0, int argc, char **argv)
{
    struct kc_tool_ctx t = *t0;
    char dir[PATH_MAX];
    const char *cmd = argv[0];
    const char *out = NULL, *sign = NULL, *pos[2] = {NULL, NULL};
    const char *globs[MAX_GLOBS];
    size_t n_globs = 0;
    int npos = 0, codec = KC_BUNDLE_ZSTD, level = 0;
    uint64_t since = 0, max_size = 0;
    bool trust_unsigned = false, dry_run = false, only_usable = false, quiet = false;
    bool is_export = strcmp(cmd, "export") == 0, is_import = strcmp(cmd, "import") == 0;
    bool options = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        int r;
        if (options && strcmp(a, "--") == 0) {
            options = false; /* what follows is FILE, whatever it looks like */
            continue;
        }
        if (!options) {
            if (npos >= 2)
                return kc_tool_usage_error("unexpected argument '%s' for '%s'", a, cmd);
            pos[npos++] = a;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            kc_tool_help(stdout, cmd);
            return kc_tool_flush(stdout) != 0 ? KC_EXIT_RUNTIME : 0;
        }
        if ((r = opt_value(argc, argv, &i, "--dir", &val)) != 0) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("--dir needs a directory");
            if (val[0] == '/') {
                snprintf(dir, sizeof dir, "%s", val);
            } else {
                char cwd[PATH_MAX];
                if (getcwd(cwd, sizeof cwd) == NULL ||
                    snprintf(dir, sizeof dir, "%s/%s", cwd, val) >= (int)sizeof dir)
                    return kc_tool_usage_error("--dir: cannot resolve '%s'", val);
            }
            t.dir = dir;
            continue;
        }
        if (is_export && ((r = opt_value(argc, argv, &i, "-o", &val)) != 0 ||
                          (r = opt_value(argc, argv, &i, "--output", &val)) != 0)) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("-o needs a file (or - for standard output)");
            out = val;
            continue;
        }
        if (is_export && (r = opt_value(argc, argv, &i, "--namespace", &val)) != 0) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("--namespace needs a pattern");
            if (n_globs == MAX_GLOBS)
                return kc_tool_usage_error("at most %d --namespace patterns", MAX_GLOBS);
            globs[n_globs++] = val;
            continue;
        }
        if (is_export && (r = opt_value(argc, argv, &i, "--hit-since", &val)) != 0) {
            uint64_t d;
            if (r < 0 || parse_duration(val, &d) != 0)
                return kc_tool_usage_error("--hit-since needs a duration (like 90m, 12h or 7d)");
            uint64_t now = kc_wall_ns(); /* entries carry nanoseconds: a whole second would admit up
                                            to 1 s more */
            since = d < now ? now - d : 1;
            continue;
        }
        if (is_export && (r = opt_value(argc, argv, &i, "--max-size", &val)) != 0) {
            if (r < 0 || kc_parse_size(val, &max_size) != 0 || max_size == 0)
                return kc_tool_usage_error("--max-size needs a size (like 512M or 5G)");
            continue;
        }
        if (is_export && (r = opt_value(argc, argv, &i, "--sign", &val)) != 0) {
            if (r < 0 || val[0] == '\0')
                return kc_tool_usage_error("--sign needs a secret key file (kcache keygen)");
            sign = val;
            continue;
        }
        if (is_export && (r = opt_value(argc, argv, &i, "--compress", &val)) != 0) {
            if (r < 0)
                return kc_tool_usage_error("--compress needs zstd, lz4 or none");
            if (strncmp(val, "zstd", 4) == 0 && (val[4] == '\0' || val[4] == ':')) {
                codec = KC_BUNDLE_ZSTD;
                level = val[4] == ':' ? atoi(val + 5) : 0;
                if (val[4] == ':' && (level < 1 || level > 19))
                    return kc_tool_usage_error("--compress zstd:LEVEL: LEVEL is 1 to 19");
            } else if (strcmp(val, "lz4") == 0) {
                codec = KC_BUNDLE_LZ4;
            } else if (strcmp(val, "none") == 0) {
                codec = KC_BUNDLE_RAW;
            } else {
                return kc_tool_usage_error("--compress needs zstd, zstd:LEVEL, lz4 or none");
            }
            continue;
        }
        if ((is_export || is_import) && strcmp(a, "--quiet") == 0) {
            quiet = true;
            continue;
        }
        if (is_import && strcmp(a, "--trust-unsigned") == 0) {
            trust_unsigned = true;
            continue;
        }
        if (is_import && strcmp(a, "--dry-run") == 0) {
            dry_run = true;
            continue;
        }
        if (is_import && strcmp(a, "--only-usable") == 0) {
            only_usable = true;
            continue;
        }
        if (a[0] == '-' && a[1] != '\0')
            return kc_tool_usage_error("unknown option '%s' for '%s'", a, cmd);
        if (npos >= 2)
            return kc_tool_usage_error("unexpected argument '%s' for '%s'", a, cmd);
        pos[npos++] = a;
    }
    if (t.dir == NULL || t.dir[0] == '\0') {
        kc_tool_err("no cache directory (no home directory); set KCACHE_DIR or use --dir");
        return KC_EXIT_RUNTIME;
    }
    if (is_export) {
        if (npos != 0)
            return kc_tool_usage_error("unexpected argument '%s' for 'export'", pos[0]);
        if (out == NULL)
            return kc_tool_usage_error("export needs -o FILE (or -o - for standard output)");
        return cmd_export(&t, out, globs, n_globs, since, max_size, sign, codec, level, quiet);
    }
    if (is_import) {
        if (npos != 1)
            return kc_tool_usage_error("import needs a FILE");
        return cmd_import(&t, pos[0], trust_unsigned, dry_run, only_usable, quiet);
    }
    if (npos != 2 || strcmp(pos[0], "show") != 0)
        return kc_tool_usage_error("bundle needs a subcommand: show FILE");
    return cmd_show(&t, pos[1]);
}
