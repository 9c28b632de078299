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
    /* One line of printable text, whatever the message held (a namespace
     * from a bundle may hold escape sequences): line breaks become spaces,
     * other control bytes '?'. */
    for (char *p = line; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '\n' || c == '\r')
            *p = ' ';
        else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0))
            *p = '?';
    }
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

/* The command being parsed, for the pointer to its help. */
static const char *current_command;

void kc_tool_set_command(const char *cmd)
{
    current_command = cmd;
}

int kc_tool_usage_error(const char *fmt, ...)
{
    char suffix[96];
    if (current_command != NULL && strlen(current_command) < 32)
        snprintf(suffix, sizeof suffix, " (see kcache help %s)", current_command);
    else
        snprintf(suffix, sizeof suffix, " (see kcache --help)");
    va_list ap;
    va_start(ap, fmt);
    err_v(fmt, ap, suffix);
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

const char *kc_tool_printable(const char *s, char *buf, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (len == 0)
        return buf;
    for (const unsigned char *p = (const unsigned char *)s; *p != 0; p++) {
        char e[5];
        size_t n = 0;
        if (*p == '\\') {
            e[n++] = '\\';
            e[n++] = '\\';
        } else if (*p >= 0x20 && *p < 0x7f) {
            e[n++] = (char)*p;
        } else {
            e[n++] = '\\';
            e[n++] = 'x';
            e[n++] = hex[*p >> 4];
            e[n++] = hex[*p & 15];
        }
        if (o + n >= len)
            break;
        memcpy(buf + o, e, n);
        o += n;
    }
    buf[o] = 0;
    return buf;
}
