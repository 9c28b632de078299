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

/* The length of the UTF-8 sequence at p that a terminal shows as one
 * printable character (shortest form, a scalar value, not a C1 control,
 * a line or paragraph separator or a bidirectional control), or 0. */
static size_t printable_utf8(const unsigned char *p)
{
    uint32_t cp;
    size_t n;
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        cp = p[0] & 0x1fu, n = 2;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        cp = p[0] & 0x0fu, n = 3;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        cp = p[0] & 0x07u, n = 4;
    else
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) /* (a NUL ends the string here too) */
            return 0;
        cp = cp << 6 | (p[i] & 0x3fu);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0; /* overlong, past Unicode, a surrogate */
    if (cp < 0xa0 || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) ||
        (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200e || cp == 0x200f || cp == 0x061c)
        return 0; /* C1, separators, bidirectional controls */
    return n;
}

/* The escaped form of the character at *pp into e (room for 16 bytes):
 * its length; *pp moves past what it took. */
static size_t escape_next(const unsigned char **pp, char e[16])
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = *pp;
    size_t n = 0, u;
    if (*p == '\\') {
        e[n++] = '\\';
        e[n++] = '\\';
        *pp = p + 1;
    } else if (*p >= 0x20 && *p < 0x7f) {
        e[n++] = (char)*p;
        *pp = p + 1;
    } else if ((u = printable_utf8(p)) > 0) {
        memcpy(e, p, u);
        n = u;
        *pp = p + u;
    } else {
        e[n++] = '\\';
        e[n++] = 'x';
        e[n++] = hex[*p >> 4];
        e[n++] = hex[*p & 15];
        *pp = p + 1;
    }
    return n;
}

const char *kc_tool_printable(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return buf;
    for (const unsigned char *p = (const unsigned char *)(s != NULL ? s : ""); *p != 0;) {
        char e[16];
        size_t n = escape_next(&p, e);
        if (o + n >= len)
            break;
        memcpy(buf + o, e, n);
        o += n;
    }
    buf[o] = 0;
    return buf;
}

void kc_tool_put_printable(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)(s != NULL ? s : ""); *p != 0;) {
        char e[16];
        fwrite(e, 1, escape_next(&p, e), f);
    }
}

void kc_tool_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s != NULL ? s : ""); *p != 0; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}
