/*
 * A process tree recorded (tree.c): the watched child of a served nvcc
 * (nvcc.c) and every descendant that loads the shim write one report each
 * into a private directory named by _KCACHE_TREE: the files read (with
 * their stat), the paths probed and not found, the files written, and the
 * programs executed. An exec is announced before it happens (a claim the
 * program's own report must answer), so a descendant without the shim (a
 * statically linked program, one run with the preload removed) is seen by
 * the report that is missing.
 */
#ifndef KCACHE_TREE_H
#define KCACHE_TREE_H

#include "deps.h"

#include <stdbool.h>
#include <stddef.h>

#define KC_TREE_ENV "_KCACHE_TREE" /* internal: no KCACHE_ variable of the configuration */

/* Called first by the constructor: with _KCACHE_TREE set to a private
 * directory of ours, this process records into it until it exits or
 * replaces its image. True when it does (nothing else of kcache then
 * runs in the process: its runs are the tree's). One getenv in every
 * other process. */
bool kc__ptree_start(void);

/* In nvcc's watched child: records into `dir` as the tree's first report. */
void kc__ptree_child(const char *dir);

/* A private report directory under the store's DIR, in `dir` (PATH_MAX).
 * 0 or -errno. */
int kc__ptree_open(const char *store_dir, char *dir, size_t n);

/* Removes the report directory and its files. */
void kc__ptree_remove(const char *dir);

/* What the tree did, merged from its reports. */
struct kc__ptree {
    struct kc__deps reads; /* files read, probed, stat'ed (absolute paths) */
    char **written;        /* files opened for writing (absolute paths) */
    size_t n_written, cap_written;
    const char *why; /* why it cannot be stored, or NULL */
};

/* Reads and merges the reports of `dir`, the tree's paths made absolute
 * against each report's working directory. Sets t->why when a report is
 * missing (an announced program reported nothing), one could not be
 * followed, or one is unreadable. 0, or -errno. */
int kc__ptree_collect(const char *dir, struct kc__ptree *t);

void kc__ptree_free(struct kc__ptree *t);

/* Called before main (by the entry, shim.c): when this process is nvcc, a
 * hit replays its whole run and exits, a miss runs it in a watched child
 * whose tree reports (nvcc.c, tree.h) and exits; returns in every other
 * case (and in that child). */
void kc__nvcc_start(int argc, char **argv);

#endif
