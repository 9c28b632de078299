/*
 * Whether a file kcache looks up by itself (the kcache tool it starts as
 * the owner, the store library and the remote's libraries it loads) lies
 * where nobody but this user and root can change what its path names.
 */
#ifndef KCACHE_TRUST_H
#define KCACHE_TRUST_H

#include <stddef.h>

/* Resolves `path` (realpath) into `real` (`len` bytes) and checks the file
 * and every directory above it, as ssh's StrictModes does: each is owned
 * by root or the effective user and is writable by neither group nor
 * others (group-writable is fine where the group is the user's private
 * group: the primary group, named as the user, no other member, as umask
 * 002 leaves a user's files), except a directory above the file with the
 * sticky bit (as /tmp:
 * another user can add names there, not rename or remove ours). 0: trusted,
 * `real` is the path to use (never `path` again: what it names could
 * change); -EPERM: another user could replace it, `bad` (`len` bytes,
 * may be NULL) names the first part that lets them; another negative
 * errno: it cannot be resolved (-ENOENT: there is none). */
int kc_trusted_path(const char *path, char *real, size_t len, char *bad);

#endif
