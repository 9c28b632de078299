/*
 * help.h: the kcache tool's help text, one table of commands (help.c).
 */
#ifndef KCACHE_TOOLS_HELP_H
#define KCACHE_TOOLS_HELP_H

#include <stdio.h>

/* `kcache --help`: every command, one line each. */
void kc_tool_help_all(FILE *f);

/* `kcache help TOPIC` and `kcache TOPIC --help` (TOPIC a command; NULL:
 * kc_tool_help_all). Returns 0, or -1 for an unknown topic. */
int kc_tool_help(FILE *f, const char *topic);

/* The topics, comma-separated, for an error message. */
const char *kc_tool_help_topics(void);

#endif
