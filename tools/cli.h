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

/* The one escaping of every text the tool prints from a store, a miss
 * record, a bundle or the remote (names, namespaces, keys, values, a
 * server's words), which may hold anything a writer chose: escape
 * sequences, line breaks that forge lines. Printable ASCII and valid
 * UTF-8 characters a terminal shows as such are kept; a backslash is
 * doubled; every other byte (C0 and C1 controls, DEL, invalid or overlong
 * UTF-8, line separators and bidirectional controls) is written as \xHH,
 * so the text is unambiguous and holds nothing a terminal acts on. Into
 * buf (len bytes; cut short at a character to fit); returns buf. A
 * buffer of KC_TOOL_PRINTABLE_MAX bytes holds any namespace. NULL is "". */
#define KC_TOOL_PRINTABLE_MAX (4 * 128 + 1)
const char *kc_tool_printable(const char *s, char *buf, size_t len);

/* The same escaping written to f, whole (no length bound). */
void kc_tool_put_printable(FILE *f, const char *s);

/* s as a JSON string, quotes included, on f: ASCII only (a byte past it,
 * which a store's name may hold whether or not it is UTF-8, as \u00XX, so
 * the document is always valid and shows no control byte). NULL is "". */
void kc_tool_json_str(FILE *f, const char *s);

/* Flushes f (stdout or stderr) and checks its error flag: 0, or after one
 * error line naming the write error, KC_EXIT_RUNTIME. Every command's
 * output ends with it: a full disk or a closed pipe is a failure. */
int kc_tool_flush(FILE *f);

#endif
