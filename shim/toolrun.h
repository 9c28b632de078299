/*
 * The parts of a compiler's run as a process (toolrun.c) that the tool
 * family (tool.c) and nvcc's served tree (nvcc.c) share: writing an output
 * atomically, the standard streams, a watched child's pipes, the
 * executable's identity.
 */
#ifndef KCACHE_TOOLRUN_H
#define KCACHE_TOOLRUN_H

#include "../common/buf.h"
#include "../common/config.h"
#include "../store/store.h"

#include <stdbool.h>
#include <sys/types.h>

/* This process's umask, read without changing it for longer than a call. */
mode_t kc__tool_umask(void);

/* How an output is written to be what the tool would leave there. A tool
 * opens its output O_WRONLY|O_CREAT|O_TRUNC (ptxas, cicc, fatbinary,
 * nvlink: in place), or unlinks it first and creates it anew (GNU as,
 * which writes nvcc -c's object). */
struct kc__out_how {
    enum {
        KC__OUT_CREATE,  /* nothing there: a temporary renamed to it, mode */
        KC__OUT_RENAME,  /* a plain file of ours: the same, its mode kept */
        KC__OUT_THROUGH, /* written in place, as the tool would (in_place) */
    } kind;
    mode_t mode;
};

/* How `path` is written for a tool that writes its output in place
 * (in_place), or for one that may replace it: then only where both would
 * leave the same (nothing there, or a file of this process's own with one
 * link and the mode a new one gets), else -ENOTSUP. -EINVAL where it is
 * no regular file's (/dev/stdout, a FIFO: the tool's own writes). */
int kc__tool_output_how(const char *path, bool in_place, struct kc__out_how *how);

/* Writes `bytes` to `path` as `how` says: whole or not at all (a
 * temporary file beside it, renamed over it, how->mode), or in place. 0,
 * or negative errno (no temporary left). */
int kc__tool_output_put(const char *path, const struct kc_buf *bytes,
                        const struct kc__out_how *how);

/* Writes `bytes` to `path` as kc__tool_output_how says: whole or not at
 * all (a temporary file beside it, renamed over it) where nothing or a
 * plain file of ours is there; else in place, as the tool's own
 * open(O_WRONLY|O_CREAT|O_TRUNC, 0666) would (through a symbolic link,
 * keeping links, owner, mode). 0, or negative errno (no temporary left). */
int kc__tool_output_write(const char *path, const struct kc_buf *bytes, bool in_place);

/* Whether the directory `path` would be created in exists and this
 * process may create files there. */
bool kc__tool_output_dir_writable(const char *path);

/* Whether fds a and b are one open file description (`2>&1`). */
bool kc__tool_same_stream(int a, int b);

/* Whether the paths name one file (the same string, or the same inode). */
bool kc__tool_same_path(const char *a, const char *b);

/* This executable's identity: its build-id, else its contents, memoized
 * in DIR/tools/ by device, inode, size, mtime and ctime. 0 or -errno. */
int kc__tool_identity(const struct kc_config *cfg, kc_digest *out);

/* One pipe of a watched child: its read end (-1 once closed), where its
 * bytes go on (-1: kept only), what is kept, whether it was too large. */
struct kc__capture {
    int fd;
    int to;
    struct kc_buf *b;
    bool over;
};
#define KC__PUMP_MAX 4

/* The most of a stream a run keeps (more: it is not stored). */
#define KC__STREAM_MAX (64u << 20)

/* Copies the pipes through and keeps their bytes until every one is
 * closed (n at most KC__PUMP_MAX). A reader that went away on standard
 * output or error sets *out_broken or *err_broken; on EPIPE the child is
 * sent SIGPIPE, as its own write would have. */
void kc__tool_pump(pid_t pid, struct kc__capture *cap, int n, bool *out_broken, bool *err_broken);

#endif
