/*
 * ready.c: ready copies of NVRTC's bundled headers (local.h, "NVRTC's
 * bundled headers as trees of files"). For each <id>.want.<umask> in
 * DIR/bundled whose store copy <id>.tree is there, the owner keeps
 * KC__READY_POOL copies of it with that umask's modes, made under a
 * .prep. name and renamed to .ready. whole, so a host never claims a part
 * of one. Wants whose map and store copy are gone are removed, copies
 * whose want is, and .prep./.claim. directories left by a process that
 * died there.
 */
#include "jobs.h"
#include "../../common/clock.h"
#include "../../common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STALE_S 600

struct entry {
    char hex[33];
    char kind[8]; /* want ready prep claim */
    mode_t mask;
    char name[128];
};

/* "<32 hex>.<kind>.<3 octal>[.<tag>]" into e; false for other names. */
static bool parse(const char *name, struct entry *e)
{
    size_t n = strlen(name);
    if (n < 32 + 1 + 4 + 4 || n >= sizeof e->name || name[32] != '.')
        return false;
    for (int i = 0; i < 32; i++)
        if (strchr("0123456789abcdef", name[i]) == NULL || name[i] == 0)
            return false;
    const char *k = name + 33, *dot = strchr(k, '.');
    if (dot == NULL || (size_t)(dot - k) >= sizeof e->kind)
        return false;
    memcpy(e->kind, k, (size_t)(dot - k));
    e->kind[dot - k] = 0;
    const char *m = dot + 1;
    for (int i = 0; i < 3; i++)
        if (m[i] < '0' || m[i] > '7')
            return false;
    if (m[3] != 0 && m[3] != '.')
        return false;
    memcpy(e->hex, name, 32);
    e->hex[32] = 0;
    e->mask = (mode_t)(((m[0] - '0') << 6) | ((m[1] - '0') << 3) | (m[2] - '0'));
    snprintf(e->name, sizeof e->name, "%s", name);
    return strcmp(e->kind, "want") == 0 ? m[3] == 0 : m[3] == '.';
}

/* Whether DIR/bundled holds <hex><suffix>. */
static bool has(int bdir, const char *hex, const char *suffix)
{
    char name[64];
    struct stat st;
    snprintf(name, sizeof name, "%s%s", hex, suffix);
    return fstatat(bdir, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* The identity whose 32 hex digits are hex (kc__digest_hex's). */
static void hex_digest(const char *hex, kc_digest *d)
{
    char part[17];
    memcpy(part, hex, 16);
    part[16] = 0;
    d->hi = strtoull(part, NULL, 16);
    memcpy(part, hex + 16, 16);
    d->lo = strtoull(part, NULL, 16);
}

/* One ready copy of <hex>.tree for mask: 0 or a negative errno. Every file
 * is checked against the map as it is copied (no map, or one file that
 * differs: no copy); where the filesystem is local with nanosecond times,
 * the name carries the proof (kc__ready_tag) that lets the host's fill
 * take a file whose ctime is older for checked without reading it. */
static int make_one(const char *store, int bdir, const char *hex, mode_t mask)
{
    kc_digest id;
    hex_digest(hex, &id);
    struct kc__pristine *m = NULL;
    int rc = kc__bh_map_load(store, &id, &m);
    if (rc != 0)
        return rc == -ENOENT ? -ENOENT : -EBADMSG;
    char tree[64], tag[KC__READY_TAG], prep[128], ready[128];
    snprintf(tree, sizeof tree, "%s.tree", hex);
    kc__ready_tag(tag, NULL);
    kc__ready_name(prep, sizeof prep, hex, "prep", mask, tag);
    if (mkdirat(bdir, prep, 0700) != 0) {
        rc = -errno;
        kc__bh_map_free(m);
        return rc;
    }
    int sfd = openat(bdir, tree, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int dfd = openat(bdir, prep, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    bool local = dfd >= 0 && kc__local_fs(dfd);
    /* NVRTC's install's modes: files 0666, directories 0755, less the umask. */
    struct kc__tree_copy c = {.fm = 0666 & ~mask,
                              .dm = 0755 & ~mask,
                              .exact = true,
                              .clone = true,
                              .check = kc__bh_map_check,
                              .arg = m};
    rc = sfd < 0 || dfd < 0 ? -EIO : kc__tree_copy(sfd, dfd, &c);
    if (sfd >= 0 && dfd < 0)
        close(sfd);
    if (dfd >= 0 && sfd < 0)
        close(dfd);
    if (rc == 0 && c.n != m->n)
        rc = -EBADMSG;
    struct timespec since;
    if (rc == 0) {
        /* Checked and complete: its name says since when (every ctime
         * the copy got is older than that time). */
        bool proof = local && kc_coarse_past_now(&since);
        kc__ready_tag(tag, proof ? &since : NULL);
        kc__ready_name(ready, sizeof ready, hex, "ready", mask, tag);
        if (renameat(bdir, prep, bdir, ready) != 0)
            rc = -errno;
    }
    if (rc != 0)
        kc__tree_remove(bdir, prep);
    kc__bh_map_free(m);
    return rc;
}

int kc__ready_job(struct kc__owner *o, uint32_t *made)
{
    *made = 0;
    int bdir = kc__bundled_dir(o->p.dir, false);
    if (bdir < 0)
        return 0;
    DIR *d = kc__dir_read(bdir);
    if (d == NULL) {
        close(bdir);
        return -ENOMEM;
    }
    struct entry *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        struct entry en;
        if (!parse(e->d_name, &en))
            continue;
        if (kc_grow(&v, &cap, n, sizeof *v, 16) != 0) {
            rc = -ENOMEM;
            break;
        }
        v[n++] = en;
    }
    closedir(d);
    time_t now = time(NULL);
    /* The wants first: a copy whose want they remove goes with it. */
    for (size_t k = 0; rc == 0 && k < 2 * n; k++) {
        struct entry *w = &v[k % n];
        if ((k < n) != (strcmp(w->kind, "want") == 0))
            continue;
        if (strcmp(w->kind, "want") == 0) {
            /* (A store copy found bad is dropped, then kept again: the
             * want stays while the map does.) */
            bool tree = has(bdir, w->hex, ".tree");
            if (!tree && !has(bdir, w->hex, "")) {
                unlinkat(bdir, w->name, 0);
                continue;
            }
            if (!tree)
                continue;
            int have = 0;
            for (size_t j = 0; j < n; j++)
                have += strcmp(v[j].kind, "ready") == 0 && strcmp(v[j].hex, w->hex) == 0 &&
                        v[j].mask == w->mask;
            for (; have < KC__READY_POOL; have++) {
                int r = make_one(o->p.dir, bdir, w->hex, w->mask);
                if (r != 0) {
                    kc_log(KC_LOG_DEBUG, "owner: no ready copy of the bundled headers %s: %s",
                           w->hex, strerror(-r));
                    break;
                }
                (*made)++;
            }
        } else if (strcmp(w->kind, "ready") == 0) {
            char want[96];
            struct stat st;
            kc__ready_name(want, sizeof want, w->hex, "want", w->mask, NULL);
            if (fstatat(bdir, want, &st, AT_SYMLINK_NOFOLLOW) != 0)
                kc__tree_remove(bdir, w->name);
        } else if (strcmp(w->kind, "prep") == 0 || strcmp(w->kind, "claim") == 0) {
            /* A process that died making or emptying one (a claim's
             * rename sets its ctime): nothing takes ten minutes. */
            struct stat st;
            if (fstatat(bdir, w->name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                now - st.st_ctime > STALE_S)
                kc__tree_remove(bdir, w->name);
        }
    }
    free(v);
    close(bdir);
    return rc;
}
