/*
 * kcache logging. See log.h.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_level = KC_LOG_WARN;

void kc__log_set_level(int level)
{
    log_level = level;
}

int kc__log_enabled(int level)
{
    return level <= log_level;
}

void kc_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    int saved = errno;
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "kcache: %s: ", level == KC_LOG_WARN ? "warning" : kc_log_level_name(level));
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof line - 1)
        n = sizeof line - 2;
    line[n++] = '\n';
    /* One write(2) so lines of concurrent processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
    errno = saved;
}
