/*
 * why.h: `kcache why` (why.c).
 */
#ifndef KCACHE_TOOLS_WHY_H
#define KCACHE_TOOLS_WHY_H

/* Runs `kcache why` over the miss records of cache directory `dir`;
 * argv[0] is "why". The exit status. */
int kc_tool_why(const char *dir, int argc, char **argv);

#endif
