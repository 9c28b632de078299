/*
 * served.h: the libraries the shim last served, for `kcache config`. At
 * exit, a process whose shim counted anything for a library (NVRTC,
 * nvJitLink, libNVVM, libcuda) writes the path it was served by (the one
 * the stats line names) to KCACHE_DIR/libraries, keeping the lines of the
 * libraries it did not use. The file is rewritten (a temporary file renamed
 * over it) only when a line changes, so a process that uses what the last
 * one used only reads it. Two processes leaving at once with different
 * libraries: the last rename wins (the other's change is made again by the
 * next process that uses it).
 *
 * The file, one line per library served:
 *   nvrtc|link|nvvm|cuda<space>PATH
 */
#ifndef KCACHE_COMMON_SERVED_H
#define KCACHE_COMMON_SERVED_H

#include <limits.h>

#define KC_SERVED_FILE "libraries"

enum { KC_SERVED_NVRTC, KC_SERVED_LINK, KC_SERVED_NVVM, KC_SERVED_CUDA, KC_SERVED_N };

/* "nvrtc", "link", "nvvm", "cuda": the stats line's names. */
extern const char *const kc_served_names[KC_SERVED_N];

/* The paths in DIR/libraries ("" for a library none is recorded for). 0,
 * -ENOENT when there is no such file, or another negative errno (a
 * directory or file that is not this user's own, a file too large). */
int kc_served_read(const char *dir, char path[KC_SERVED_N][PATH_MAX]);

/* Records path[i] for each i whose path is not NULL (absolute, without a
 * newline; others are skipped), keeping the other lines. 0 (also when
 * nothing changed), or a negative errno. DIR must exist and be this
 * user's own and private. */
int kc_served_update(const char *dir, const char *const path[KC_SERVED_N]);

#endif
