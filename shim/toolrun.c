/*
 * What a compiler run as a process needs of the mechanism, shared by the
 * families that serve such runs (tool.c: ptxas, cicc, fatbinary, nvlink;
 * nvcc.c: nvcc whole): its outputs written whole, its streams pumped and
 * kept, and the executable's identity, memoized in DIR/tools/.
 */
#include "toolrun.h"
#include "../common/buf.h"
#include "../common/clock.h"
#include "../common/identity.h"
#include "../store/local/local.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

/* Whether fds a and b are one open file description (`2>&1`). */
bool kc__tool_same_stream(int a, int b)
{
    struct stat sa, sb;
    if (fstat(a, &sa) != 0 || fstat(b, &sb) != 0)
        return false;
    int fa = fcntl(a, F_GETFL), fb = fcntl(b, F_GETFL);
    if (sa.st_dev != sb.st_dev || sa.st_ino != sb.st_ino || fa != fb)
        return false;
    /* Same file: one description moves one offset. */
    off_t oa = lseek(a, 0, SEEK_CUR), ob = lseek(b, 0, SEEK_CUR);
    return oa == ob;
}

/* This process's umask, read without changing it (/proc), else by umask(2)
 * (no other thread runs before main). */
mode_t kc__tool_umask(void)
{
    mode_t m = umask(022);
    umask(m);
    return m;
}

/* The directory `path` would be created in, into dir[PATH_MAX], and its
 * stat. */
static bool out_dir(const char *path, char *dir, struct stat *st)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, PATH_MAX, ".");
    else if (slash == path)
        snprintf(dir, PATH_MAX, "/");
    else if ((size_t)(slash - path) < PATH_MAX)
        snprintf(dir, PATH_MAX, "%.*s", (int)(slash - path), path);
    else
        return false;
    return stat(dir, st) == 0 && S_ISDIR(st->st_mode);
}

/* Whether path carries an extended attribute a file made anew would not
 * (an ACL, user or trusted attributes; security labels are the
 * directory's policy either way). Unreadable: yes. */
static bool own_attributes(const char *path)
{
    char names[4096];
    ssize_t n = llistxattr(path, names, sizeof names);
    if (n < 0)
        return errno != ENOTSUP && errno != ENOSYS;
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1)
        if (strncmp(names + i, "security.", 9) != 0)
            return true;
    return false;
}

int kc__tool_output_how(const char *path, bool in_place, struct kc__out_how *how)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT)
            return -errno;
        how->kind = KC__OUT_CREATE;
        how->mode = 0666 & ~kc__tool_umask();
        return 0;
    }
    /* A file made there gets the directory's group where it is
     * set-group-ID, else this process's effective group. */
    char dir[PATH_MAX];
    struct stat ds;
    if (S_ISREG(st.st_mode) && (st.st_mode & 07000) == 0 && st.st_nlink == 1 &&
        st.st_uid == geteuid() && out_dir(path, dir, &ds) &&
        st.st_gid == ((ds.st_mode & S_ISGID) ? ds.st_gid : getegid()) &&
        access(dir, W_OK | X_OK) == 0 && faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0 &&
        !own_attributes(path) && (in_place || (st.st_mode & 07777) == (0666 & ~kc__tool_umask()))) {
        /* A file of this process's own, writable, that a new one would
         * equal (a tool that replaces its output leaves its mode too; no
         * set-ID bit, which a write in place clears). */
        how->kind = KC__OUT_RENAME;
        how->mode = st.st_mode & 07777;
        return 0;
    }
    if (!in_place)
        return -ENOTSUP; /* replaced or written through: the record cannot tell */
    struct stat to;
    if (stat(path, &to) == 0 ? !S_ISREG(to.st_mode) : errno != ENOENT)
        return -EINVAL; /* /dev/stdout, a FIFO, a loop: the tool's own writes */
    how->kind = KC__OUT_THROUGH;
    how->mode = 0;
    return 0;
}

int kc__tool_output_put(const char *path, const struct kc_buf *bytes, const struct kc__out_how *how)
{
    int rc;
    if (how->kind == KC__OUT_THROUGH) {
        /* As the tool's own open(O_WRONLY|O_CREAT|O_TRUNC, 0666): through
         * a symbolic link, into a file with other links, owners, modes or
         * attributes, which stay as they are. */
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
        if (fd < 0)
            return -errno;
        struct stat st;
        rc = fstat(fd, &st) != 0    ? -errno
             : !S_ISREG(st.st_mode) ? -EINVAL
                                    : kc__write_full(fd, bytes->p, bytes->len);
        if (close(fd) != 0 && rc == 0)
            rc = -errno;
        return rc;
    }
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.kcache-%ld-%llx", path, (long)getpid(),
                         (unsigned long long)kc_mono_ns()) >= sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    rc = kc__write_full(fd, bytes->p, bytes->len);
    if (rc == 0 && fchmod(fd, how->mode) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
    return rc;
}

int kc__tool_output_write(const char *path, const struct kc_buf *bytes, bool in_place)
{
    struct kc__out_how how;
    int rc = kc__tool_output_how(path, in_place, &how);
    return rc != 0 ? rc : kc__tool_output_put(path, bytes, &how);
}

/* Whether the directory `path` would be created in exists and this
 * process may create files there. */
bool kc__tool_output_dir_writable(const char *path)
{
    char dir[PATH_MAX];
    struct stat st;
    return out_dir(path, dir, &st) && access(dir, W_OK | X_OK) == 0;
}

/* Whether the paths name one file as the tool would open them (the same
 * string, or the same inode). */
bool kc__tool_same_path(const char *a, const char *b)
{
    if (strcmp(a, b) == 0)
        return true;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* Copies the watched child's pipes through (cap[i].to, -1: kept only)
 * and keeps their bytes, until every pipe is closed. */
void kc__tool_pump(pid_t pid, struct kc__capture *cap, int n, bool *out_broken, bool *err_broken)
{
    char buf[65536];
    for (;;) {
        struct pollfd pf[KC__PUMP_MAX];
        int map[KC__PUMP_MAX], np = 0;
        for (int i = 0; i < n; i++)
            if (cap[i].fd >= 0) {
                pf[np] = (struct pollfd){.fd = cap[i].fd, .events = POLLIN};
                map[np++] = i;
            }
        if (np == 0)
            break;
        if (poll(pf, (nfds_t)np, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int k = 0; k < np; k++) {
            if (pf[k].revents == 0)
                continue;
            struct kc__capture *cp = &cap[map[k]];
            ssize_t got = read(cp->fd, buf, sizeof buf);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                close(cp->fd);
                cp->fd = -1;
                continue;
            }
            if (cp->to >= 0) {
                bool *broken = cp->to == STDOUT_FILENO ? out_broken : err_broken;
                int wrc = *broken ? 0 : kc__write_full(cp->to, buf, (size_t)got);
                if (wrc != 0)
                    *broken = true;
                /* The reader went away: the tool itself would have died
                 * of SIGPIPE writing there, so it does (and so do we). */
                if (wrc == -EPIPE)
                    kill(pid, SIGPIPE);
            }
            if (cp->b->len + (size_t)got > KC__STREAM_MAX)
                cp->over = true;
            else
                kc_buf_add(cp->b, buf, (size_t)got);
        }
    }
}

/* ---- the executable's identity --------------------------------------------------------- */

/* A memo of executables' identities in DIR/tools/ (private): ptxas has no
 * build-id, and digesting its 35-50 MB costs more than the rest of a hit.
 * A memo file is named by the executable's device, inode, size, mtime and
 * ctime (ns) and holds them with the identity: any change to the file
 * changes its ctime, which no user can set back. A file changed within
 * the last 2 s is not memoized (a second write could share the ctime). */
struct id_memo {
    uint64_t magic;
    uint64_t fp[5];
    kc_digest id;
};
#define ID_MEMO_MAGIC 0x314449544b43ull /* "KCTID1" */

int kc__tool_identity(const struct kc_config *cfg, kc_digest *out)
{
    struct stat st;
    if (stat("/proc/self/exe", &st) != 0)
        return -errno;
    uint64_t fp[5] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size,
                      (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                      (uint64_t)st.st_ctim.tv_sec * 1000000000ull + (uint64_t)st.st_ctim.tv_nsec};
    kc_digest name = kc_digest_of(fp, sizeof fp);
    char hex[33], dir[PATH_MAX], path[PATH_MAX];
    kc__digest_hex(&name, hex);
    bool named = cfg->dir[0] == '/' &&
                 (size_t)snprintf(dir, sizeof dir, "%s/tools", cfg->dir) < sizeof dir &&
                 (size_t)snprintf(path, sizeof path, "%s/%s", dir, hex) < sizeof path;
    struct stat ds;
    bool private_dir = named && lstat(dir, &ds) == 0 && S_ISDIR(ds.st_mode) &&
                       ds.st_uid == geteuid() && (ds.st_mode & 077) == 0;
    if (private_dir) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct id_memo m;
        bool ok = fd >= 0 && read(fd, &m, sizeof m) == (ssize_t)sizeof m &&
                  m.magic == ID_MEMO_MAGIC && memcmp(m.fp, fp, sizeof fp) == 0;
        if (fd >= 0)
            close(fd);
        if (ok) {
            *out = m.id;
            return 0;
        }
    }
    int rc = kc__file_identity("/proc/self/exe", out);
    struct stat after;
    if (rc != 0 || stat("/proc/self/exe", &after) != 0 ||
        after.st_ctim.tv_sec != st.st_ctim.tv_sec || after.st_ctim.tv_nsec != st.st_ctim.tv_nsec ||
        !named || cfg->readonly)
        return rc;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (now.tv_sec - st.st_ctim.tv_sec < 2)
        return 0;
    if (!private_dir && (mkdir(dir, 0700) != 0 || lstat(dir, &ds) != 0 || !S_ISDIR(ds.st_mode) ||
                         ds.st_uid != geteuid() || (ds.st_mode & 077) != 0))
        return 0;
    struct id_memo m = {ID_MEMO_MAGIC, {0}, *out};
    memcpy(m.fp, fp, sizeof fp);
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid()) >= sizeof tmp)
        return 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return 0;
    bool ok = write(fd, &m, sizeof m) == (ssize_t)sizeof m;
    if (close(fd) != 0 || !ok || rename(tmp, path) != 0)
        unlink(tmp);
    return 0;
}
