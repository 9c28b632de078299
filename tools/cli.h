/*
 * cli.h: how the tool speaks: one-line errors, usage errors, sizes for
 * people. Shared by kcache.c and bundle.c.
 */
#ifndef KCACHE_TOOLS_CLI_H
#define KCACHE_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KC_EXIT_RUNTIME 1 /* something could not be done: one line on stderr */
#define KC_EXIT_USAGE 2   /* the command line was wrong */

/* Prints "kcache: error: MESSAGE" on stderr as one line (newlines in the
 * message become spaces), after flushing stdout. */
void kc_tool_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The same with " (see kcache help CMD)" appended, CMD the command
 * kc_tool_set_command named (" (see kcache --help)" before one is known);
 * returns KC_EXIT_USAGE. */
int kc_tool_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The command whose usage errors kc_tool_usage_error points to (a string
 * that lives as long as the process; NULL: none). */
void kc_tool_set_command(const char *cmd);

/* n bytes in binary units ("512 B", "1.5 MiB"), into buf; returns buf. */
const char *kc_tool_human_size(uint64_t n, char *buf, size_t len);

/* s with every byte that is not printable ASCII written as \xHH (and a
 * backslash doubled), into buf (len bytes; cut short to fit); returns buf.
 * Names read from a store or a bundle go through it before they are
 * printed: they may hold anything (escape sequences, line breaks). A
 * buffer of KC_TOOL_PRINTABLE_MAX bytes holds any namespace. */
#define KC_TOOL_PRINTABLE_MAX (4 * 128 + 1)
const char *kc_tool_printable(const char *s, char *buf, size_t len);

/* Flushes f (stdout or stderr) and checks its error flag: 0, or after one
 * error line naming the write error, KC_EXIT_RUNTIME. Every command's
 * output ends with it: a full disk or a closed pipe is a failure. */
int kc_tool_flush(FILE *f);

#endif
