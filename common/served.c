/*
 * served.c: the libraries the shim last served (served.h).
 */
#include "served.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buf.h"
#include "clock.h"
#include "config.h"

const char *const kc_served_names[KC_SERVED_N] = {"nvrtc", "link", "nvvm", "cuda"};

/* The file is a few lines; one larger is not ours. */
#define SERVED_MAX (KC_SERVED_N * (PATH_MAX + 8))

/* DIR, this user's own and private: a directory descriptor, or a negative
 * errno. */
static int served_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

static bool path_ok(const char *p)
{
    return p != NULL && p[0] == '/' && strlen(p) < PATH_MAX && strchr(p, '\n') == NULL;
}

static int read_at(int dfd, char path[KC_SERVED_N][PATH_MAX])
{
    for (int i = 0; i < KC_SERVED_N; i++)
        path[i][0] = '\0';
    char *buf;
    int rc = kc_config_read_file(dfd, KC_SERVED_FILE, KC_FILE_MINE, SERVED_MAX, &buf, NULL);
    if (rc != 0)
        return rc == -EFBIG ? -EPERM : rc;
    for (char *line = buf, *next; line != NULL && *line != '\0'; line = next) {
        char *nl = strchr(line, '\n');
        next = nl != NULL ? nl + 1 : NULL;
        if (nl != NULL)
            *nl = '\0';
        char *sp = strchr(line, ' ');
        if (sp == NULL)
            continue;
        *sp = '\0';
        for (int i = 0; i < KC_SERVED_N; i++)
            if (strcmp(line, kc_served_names[i]) == 0 && path_ok(sp + 1))
                snprintf(path[i], PATH_MAX, "%s", sp + 1);
    }
    free(buf);
    return 0;
}

int kc_served_read(const char *dir, char path[KC_SERVED_N][PATH_MAX])
{
    for (int i = 0; i < KC_SERVED_N; i++)
        path[i][0] = '\0';
    int dfd = served_dir(dir);
    if (dfd < 0)
        return dfd;
    int rc = read_at(dfd, path);
    close(dfd);
    return rc;
}

/* Whether the file's text `buf` already records every path[i] given (the
 * last line of each name is exactly it, as read_at would take it): the
 * usual exit, decided without read_at's 16 KB of paths (a malloc that size
 * is where a Python process's heap consolidates: ~580k instructions). */
static bool records_all(const char *buf, const char *const path[KC_SERVED_N])
{
    const char *last[KC_SERVED_N] = {NULL};
    size_t last_len[KC_SERVED_N] = {0};
    for (const char *line = buf; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        size_t n = nl != NULL ? (size_t)(nl - line) : strlen(line);
        for (int i = 0; i < KC_SERVED_N; i++) {
            size_t k = strlen(kc_served_names[i]);
            if (n > k && strncmp(line, kc_served_names[i], k) == 0 && line[k] == ' ') {
                last[i] = line + k + 1;
                last_len[i] = n - k - 1;
            }
        }
        line += nl != NULL ? n + 1 : n;
    }
    for (int i = 0; i < KC_SERVED_N; i++)
        if (path_ok(path[i]) && (last[i] == NULL || last_len[i] != strlen(path[i]) ||
                                 memcmp(last[i], path[i], last_len[i]) != 0))
            return false;
    return true;
}

int kc_served_update(const char *dir, const char *const path[KC_SERVED_N])
{
    int saved_errno = errno;
    int dfd = served_dir(dir);
    if (dfd < 0)
        return dfd;
    char *cur = NULL;
    if (kc_config_read_file(dfd, KC_SERVED_FILE, KC_FILE_MINE, SERVED_MAX, &cur, NULL) == 0 &&
        records_all(cur, path)) {
        free(cur);
        close(dfd);
        errno = saved_errno;
        return 0;
    }
    free(cur);
    char(*have)[PATH_MAX] = malloc(KC_SERVED_N * sizeof *have);
    int rc = have != NULL ? read_at(dfd, have) : -ENOMEM;
    if (rc != 0 && rc != -ENOENT) {
        free(have);
        close(dfd);
        errno = saved_errno;
        return rc;
    }
    bool changed = false;
    for (int i = 0; i < KC_SERVED_N; i++)
        if (path_ok(path[i]) && strcmp(have[i], path[i]) != 0) {
            snprintf(have[i], PATH_MAX, "%s", path[i]);
            changed = true;
        }
    rc = 0;
    if (changed) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, ".%s.t-%ld-%08x", KC_SERVED_FILE, (long)getpid(),
                 (unsigned)kc_mono_ns());
        int f = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (f < 0)
            rc = -errno;
        struct kc_buf b = {0};
        for (int i = 0; i < KC_SERVED_N; i++)
            if (have[i][0] != '\0') {
                kc_buf_add(&b, kc_served_names[i], strlen(kc_served_names[i]));
                kc_buf_add(&b, " ", 1);
                kc_buf_add(&b, have[i], strlen(have[i]));
                kc_buf_add(&b, "\n", 1);
            }
        if (rc == 0 && b.err != 0)
            rc = b.err;
        for (size_t off = 0; rc == 0 && off < b.len;) {
            ssize_t k = write(f, b.p + off, b.len - off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                rc = k < 0 ? -errno : -EIO;
            else
                off += (size_t)k;
        }
        kc_buf_free(&b);
        if (f >= 0 && close(f) != 0 && rc == 0)
            rc = -errno;
        if (rc == 0 && renameat(dfd, tmp, dfd, KC_SERVED_FILE) != 0)
            rc = -errno;
        if (rc != 0 && f >= 0)
            unlinkat(dfd, tmp, 0);
    }
    free(have);
    close(dfd);
    errno = saved_errno;
    return rc;
}
