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

/* Writes `bytes` to `path` whole or not at all (a temporary file beside
 * it, renamed over it), with the mode the tool's open(O_CREAT|O_TRUNC,
 * 0666) would leave. 0, or negative errno (nothing is left behind). */
int kc__tool_output_write(const char *path, const struct kc_buf *bytes);

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
