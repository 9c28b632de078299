/*
 * bundle.h: the tool's bundle commands (bundle.c) and this machine's
 * namespaces (usable.c), for kcache.c.
 */
#ifndef KCACHE_TOOLS_BUNDLE_H
#define KCACHE_TOOLS_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>

struct kc_config;

/* What kcache.c resolved before handing over a command. */
struct kc_tool_ctx {
    const char *dir; /* the cache directory, absolute */
    const struct kc_config *cfg;
};

/* Whether cmd is one of the bundle commands (export, import, bundle). */
bool kc_tool_bundle_command(const char *cmd);

/* Runs `kcache export|import|bundle ...`: argv[0] is the command, the rest
 * its arguments (--dir DIR is accepted among them). Returns the exit
 * status: 0, 1 (runtime error: one line on stderr) or 2 (usage). */
int kc_tool_bundle(const struct kc_tool_ctx *t, int argc, char **argv);

/* Whether this machine's shim would use namespace ns: 1 when it would (the
 * NVRTC libnvrtc here, or a CUDA device and driver here, give the same
 * namespace), 0 when it would not, -1 when that cannot be told. The first
 * call for each kind looks at libnvrtc or the driver (dlopen). */
int kc_tool_ns_usable(const char *ns);

/* The namespace's fingerprint in words, into out (n bytes). */
void kc_tool_ns_describe(const char *ns, char *out, size_t n);

#endif
