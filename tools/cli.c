/*
 * cli.c: how the tool speaks (cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void err_v(const char *fmt, va_list ap, const char *suffix)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    /* One line, whatever the message held. */
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fflush(stdout);
    fprintf(stderr, "kcache: error: %s%s\n", line, suffix);
}

void kc_tool_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_v(fmt, ap, "");
    va_end(ap);
}

int kc_tool_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_v(fmt, ap, " (see kcache --help)");
    va_end(ap);
    return KC_EXIT_USAGE;
}

const char *kc_tool_human_size(uint64_t n, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, len, "%" PRIu64 " B", n);
        return buf;
    }
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

int kc_tool_flush(FILE *f)
{
    errno = 0;
    if (fflush(f) == 0 && !ferror(f))
        return 0;
    int e = errno != 0 ? errno : EIO;
    fprintf(stderr, "kcache: error: cannot write %s: %s\n",
            f == stdout ? "standard output" : "standard error", strerror(e));
    return KC_EXIT_RUNTIME;
}
