/*
 * why.c: miss records (why.h): written by the shim at a miss, read by
 * `kcache why`.
 */
#include "why.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "identity.h"

#define SHOWN_MAX 240
#define RECORD_MAX (8u << 20) /* a record read back is at most this */

static void add_str(struct kc_buf *b, const char *s)
{
    kc_buf_add(b, s, strlen(s));
}

/* Appends s escaped (at most max bytes of it, "..." when cut). */
static void add_esc(struct kc_buf *b, const char *s, size_t max)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++, n++) {
        if (n == max) {
            add_str(b, "...");
            return;
        }
        char e[5];
        if (*p == '\\')
            add_str(b, "\\\\");
        else if (*p == '\t')
            add_str(b, "\\t");
        else if (*p == '\n')
            add_str(b, "\\n");
        else if (*p < 0x20 || *p == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", *p);
            add_str(b, e);
        } else
            kc_buf_add(b, p, 1);
    }
}

static void field(struct kc_buf *b, const char *name, const char *value)
{
    add_str(b, name);
    add_str(b, " ");
    add_esc(b, value, SHOWN_MAX);
    add_str(b, "\n");
}

void kc_why_begin(struct kc_why *w, const char *backend, const char *name, const kc_digest *base)
{
    char hex[33];
    add_str(&w->b, "kcache-why 1\n");
    field(&w->b, "backend", backend);
    field(&w->b, "name", name ? name : "");
    kc__digest_hex(base, hex);
    field(&w->b, "base", hex);
}

void kc_why_add(struct kc_why *w, const char *kind, const char *name, const kc_digest *d,
                const char *shown)
{
    char hex[33];
    kc_digest own = kc_digest_of(shown ? shown : "", shown ? strlen(shown) : 0);
    kc__digest_hex(d ? d : &own, hex);
    add_str(&w->b, "c ");
    add_esc(&w->b, kind, 64);
    add_str(&w->b, "\t");
    add_esc(&w->b, name ? name : "", 4096);
    add_str(&w->b, "\t");
    add_str(&w->b, hex);
    add_str(&w->b, "\t");
    add_esc(&w->b, shown ? shown : "", SHOWN_MAX);
    add_str(&w->b, "\n");
}

void kc_why_data(struct kc_why *w, const char *kind, const char *name, const void *p, size_t n)
{
    kc_digest d = kc_digest_of(p, n);
    char shown[32];
    snprintf(shown, sizeof shown, "%zu bytes", n);
    kc_why_add(w, kind, name, &d, shown);
}

void kc_why_state(struct kc_why *w, const char *kind, const char *name, const char *state)
{
    kc_why_add(w, kind, name, NULL, state);
}

void kc_why_free(struct kc_why *w)
{
    kc_buf_free(&w->b);
}

/* DIR/why/, this user's own and private, created when absent: a
 * directory descriptor, or a negative errno. */
static int why_dir(const char *dir, bool create)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    if (create && mkdirat(dfd, KC_WHY_DIR, 0700) != 0 && errno != EEXIST) {
        int e = -errno;
        close(dfd);
        return e;
    }
    int fd = openat(dfd, KC_WHY_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = fd < 0 ? -errno : 0;
    close(dfd);
    if (fd < 0)
        return e;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The records' names (not the temporary files), sorted: oldest first. */
static char **list(int fd, size_t *n)
{
    *n = 0;
    int d2 = dup(fd);
    DIR *d = d2 >= 0 ? fdopendir(d2) : NULL;
    if (d == NULL) {
        if (d2 >= 0)
            close(d2);
        return NULL;
    }
    rewinddir(d);
    char **v = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (kc_grow(&v, &cap, *n + 1, sizeof *v, 64) != 0)
            break;
        if ((v[*n] = strdup(e->d_name)) == NULL)
            break;
        (*n)++;
    }
    closedir(d);
    if (v != NULL)
        qsort(v, *n, sizeof *v, cmp_names);
    return v;
}

static void names_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Removes the oldest records past KC_WHY_KEEP (down to 3/4 of it). */
static void prune(int fd)
{
    size_t n;
    char **v = list(fd, &n);
    if (n > KC_WHY_KEEP)
        for (size_t i = 0; i < n - KC_WHY_KEEP * 3 / 4; i++)
            unlinkat(fd, v[i], 0);
    names_free(v, n);
}

int kc_why_write(struct kc_why *w, const char *dir, const kc_digest *key, uint64_t build,
                 const char *stored, uint64_t compile_ns, uint64_t remote_refused)
{
    static unsigned writes;
    int saved_errno = errno;
    char line[128], hex[33];
    uint64_t now = kc_wall_ns();
    snprintf(line, sizeof line, "%" PRIu64, now);
    field(&w->b, "time", line);
    snprintf(line, sizeof line, "%ld", (long)getpid());
    field(&w->b, "pid", line);
    kc__digest_hex(key, hex);
    snprintf(line, sizeof line, "%s-%016" PRIx64, hex, build);
    field(&w->b, "key", line);
    field(&w->b, "stored", stored ? stored : "1");
    snprintf(line, sizeof line, "%.3f", compile_ns / 1e6);
    field(&w->b, "compile_ms", line);
    snprintf(line, sizeof line, "%" PRIu64, remote_refused);
    field(&w->b, "remote_refused", line);
    int rc = w->b.err;
    int fd = rc == 0 && dir != NULL ? why_dir(dir, true) : -EINVAL;
    if (rc == 0 && fd < 0)
        rc = fd;
    if (rc == 0) {
        char name[64], tmp[80];
        snprintf(name, sizeof name, "%016" PRIx64 "-%ld-%08x", now, (long)getpid(),
                 (unsigned)(kc_mono_ns() ^ (uintptr_t)w));
        snprintf(tmp, sizeof tmp, ".t-%s", name);
        int f = openat(fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (f < 0)
            rc = -errno;
        size_t off = 0;
        while (rc == 0 && off < w->b.len) {
            ssize_t k = write(f, w->b.p + off, w->b.len - off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                rc = k < 0 ? -errno : -EIO;
            else
                off += (size_t)k;
        }
        if (f >= 0 && close(f) != 0 && rc == 0)
            rc = -errno;
        if (rc == 0 && renameat(fd, tmp, fd, name) != 0)
            rc = -errno;
        if (rc != 0 && f >= 0)
            unlinkat(fd, tmp, 0);
        if (rc == 0 && __atomic_fetch_add(&writes, 1, __ATOMIC_RELAXED) % 32 == 0)
            prune(fd);
    }
    if (fd >= 0)
        close(fd);
    kc_why_free(w);
    errno = saved_errno;
    return rc;
}

/* ---- reading ---------------------------------------------------------------- */

/* Unescapes s[0..n) into a new string. */
static char *unesc(const char *s, size_t n)
{
    char *out = malloc(n + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            *o++ = s[i];
            continue;
        }
        char c = s[++i];
        if (c == 't')
            *o++ = '\t';
        else if (c == 'n')
            *o++ = '\n';
        else if (c == 'x' && i + 2 < n) {
            char h[3] = {s[i + 1], s[i + 2], 0};
            *o++ = (char)strtol(h, NULL, 16);
            i += 2;
        } else
            *o++ = c;
    }
    *o = 0;
    return out;
}

void kc_why_rec_free(struct kc_why_rec *r)
{
    free(r->file);
    free(r->backend);
    free(r->name);
    free(r->base);
    free(r->key);
    free(r->stored);
    for (size_t i = 0; i < r->n; i++) {
        free(r->in[i].kind);
        free(r->in[i].name);
        free(r->in[i].digest);
        free(r->in[i].shown);
    }
    free(r->in);
    memset(r, 0, sizeof *r);
}

void kc_why_recs_free(struct kc_why_rec *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kc_why_rec_free(&v[i]);
    free(v);
}

int kc_why_parse(const char *text, size_t len, struct kc_why_rec *r)
{
    memset(r, 0, sizeof *r);
    size_t cap = 0;
    bool magic = false, bad = false;
    const char *p = text, *end = text + len;
    while (p < end && !bad) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break; /* a record always ends with a newline */
        const char *sp = memchr(p, ' ', (size_t)(nl - p));
        if (sp == NULL) {
            bad = true;
            break;
        }
        size_t kl = (size_t)(sp - p);
        const char *v = sp + 1;
        size_t vl = (size_t)(nl - v);
        char **dst = NULL;
        if (kl == 10 && memcmp(p, "kcache-why", 10) == 0)
            magic = vl == 1 && *v == '1';
        else if (!magic)
            bad = true;
        else if (kl == 1 && *p == 'c') {
            const char *t1 = memchr(v, '\t', vl);
            const char *t2 = t1 ? memchr(t1 + 1, '\t', (size_t)(nl - t1 - 1)) : NULL;
            const char *t3 = t2 ? memchr(t2 + 1, '\t', (size_t)(nl - t2 - 1)) : NULL;
            if (t3 == NULL || kc_grow(&r->in, &cap, r->n + 1, sizeof *r->in, 16) != 0) {
                bad = true;
                break;
            }
            struct kc_why_input *in = &r->in[r->n++];
            in->kind = unesc(v, (size_t)(t1 - v));
            in->name = unesc(t1 + 1, (size_t)(t2 - t1 - 1));
            in->digest = unesc(t2 + 1, (size_t)(t3 - t2 - 1));
            in->shown = unesc(t3 + 1, (size_t)(nl - t3 - 1));
            bad = !in->kind || !in->name || !in->digest || !in->shown;
        } else {
            char *val = unesc(v, vl);
            if (val == NULL) {
                bad = true;
                break;
            }
#define IS(s) (kl == sizeof s - 1 && memcmp(p, s, kl) == 0)
            if (IS("backend"))
                dst = &r->backend;
            else if (IS("name"))
                dst = &r->name;
            else if (IS("base"))
                dst = &r->base;
            else if (IS("key"))
                dst = &r->key;
            else if (IS("stored"))
                dst = &r->stored;
            else if (IS("time"))
                r->time = strtoull(val, NULL, 10);
            else if (IS("pid"))
                r->pid = strtol(val, NULL, 10);
            else if (IS("compile_ms"))
                r->compile_ms = strtod(val, NULL);
            else if (IS("remote_refused"))
                r->remote_refused = strtoull(val, NULL, 10);
#undef IS
            if (dst != NULL && *dst == NULL)
                *dst = val;
            else
                free(val); /* (a field it does not know: a later kcache's) */
        }
        p = nl + 1;
    }
    if (bad || !magic || r->backend == NULL || r->key == NULL || r->time == 0) {
        kc_why_rec_free(r);
        return -EBADMSG;
    }
    if (r->name == NULL)
        r->name = strdup("");
    if (r->base == NULL)
        r->base = strdup("");
    if (r->stored == NULL)
        r->stored = strdup("1");
    if (r->name == NULL || r->base == NULL || r->stored == NULL) {
        kc_why_rec_free(r);
        return -ENOMEM;
    }
    return 0;
}

static int read_one(int fd, const char *name, char **text, size_t *len)
{
    int rc = kc_config_read_file(fd, name, KC_FILE_ANY, RECORD_MAX, text, len);
    return rc == -EPERM || rc == -EFBIG ? -EBADMSG : rc;
}

int kc_why_read_all(const char *dir, struct kc_why_rec **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    int fd = why_dir(dir, false);
    if (fd < 0)
        return fd;
    size_t n;
    char **names = list(fd, &n);
    struct kc_why_rec *v = n ? calloc(n, sizeof *v) : NULL;
    size_t got = 0;
    for (size_t i = 0; v != NULL && i < n; i++) {
        char *text = NULL;
        size_t len = 0;
        if (read_one(fd, names[i], &text, &len) != 0)
            continue;
        if (kc_why_parse(text, len, &v[got]) == 0 && (v[got].file = strdup(names[i])) != NULL)
            got++;
        free(text);
    }
    close(fd);
    names_free(names, n);
    if (got == 0) {
        free(v);
        return -ENOENT;
    }
    *out = v;
    *n_out = got;
    return 0;
}
