/*
 * The compiler-tool family (tool.c) as the entry (shim.c) sees it.
 */
#ifndef KCACHE_SHIM_TOOL_H
#define KCACHE_SHIM_TOOL_H

/* Called before main with the program's arguments (by the entry, shim.c):
 * when this process is a compiler tool kcache serves (tool.c), a hit
 * replays the run and exits, a miss runs the tool in a watched child and
 * exits with its status; returns in every other case (and in that child). */
void kc__tool_start(int argc, char **argv);

#endif
