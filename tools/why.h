/*
 * why.h: `kcache why` (why.c).
 */
#ifndef KCACHE_TOOLS_WHY_H
#define KCACHE_TOOLS_WHY_H

#include <stdint.h>

/* Whether the store holds the entry of key `key` (as a miss record writes
 * it: 32 hex digits, '-', the build's 16), created well before unix
 * second `before` (a second's margin): 1 it does, 0 it does not, -1 unknown (the store could not be
 * read). */
typedef int (*kc_tool_in_store_fn)(const char *key, uint64_t before, void *arg);

/* Runs `kcache why` over the miss records of cache directory `dir`;
 * argv[0] is "why". `in_store` (NULL: never asked) says whether an earlier
 * compile's entry is still in the store, before a report says it left.
 * The exit status. */
int kc_tool_why(const char *dir, int argc, char **argv, kc_tool_in_store_fn in_store, void *arg);

#endif
